"""minidl._cuda against minidl._C, on any machine (no GPU needed): the same
kernel functions with the same parameters, and bad arguments raising the same
exceptions with the same messages (the checks run on the host, before anything
touches a device).  Skipped where the package was built without nvcc."""
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import null_pointer_statuses
from minidl import _C

cuda = pytest.importorskip("minidl._cuda", reason="minidl was built without nvcc")

# _C's knobs for the CPU (threads, SIMD, version, scratch memory): no CUDA twin.
CPU_ONLY = {"version", "set_num_threads", "get_num_threads", "set_min_parallel_work",
            "set_sgemm_b", "set_winograd_sums", "cpu_simd", "set_simd", "get_simd", "set_conv_algo",
            "get_conv_algo", "set_keep_workspace", "get_keep_workspace"}
# Size helpers run on the host: exactly _C's parameters, no stream.
HOST_ONLY = {"sgemm_workspace_size", "conv2d_output_size", "conv2d_workspace_size",
             "conv2d_pooled_workspace_size", "pool2d_output_size", "linear_workspace_size"}
# What a device address cannot tell, appended after _C's parameters (before stream).
APPENDED = {
    "relu_forward": ["count"], "relu_backward": ["count"], "add": ["count"],
    "dropout_forward": ["count"], "dropout_backward": ["count"],
    "sgd_step": ["count"], "adam_step": ["count"],
    "softmax_cross_entropy": ["loss"],
}


def kernel_names():
    return sorted(name for name, f in vars(_C).items()
                  if callable(f) and not isinstance(f, type) and not name.startswith("_")
                  and name not in CPU_ONLY)


def params(f):
    return list(inspect.signature(f).parameters.values())


def test_every_kernel_has_a_twin_with_the_same_parameters():
    names = kernel_names()
    assert len(names) >= 30, names
    for name in names:
        assert hasattr(cuda, name), f"minidl._cuda has no {name}"
        want = []
        for p in params(getattr(_C, name)):
            want.append(p.name)
            if p.name == "ws":
                want.append("ws_bytes")
        want += APPENDED.get(name, [])
        if name not in HOST_ONLY:
            want.append("stream")
        got = [p.name for p in params(getattr(cuda, name))]
        assert got == want, f"{name}: _cuda{tuple(got)} but _C{tuple(want)}"


def test_defaults_match():
    """A parameter with a default in _C has one in _cuda (None -> 0 for buffers)."""
    for name in kernel_names():
        got = {p.name: p.default for p in params(getattr(cuda, name))}
        for p in params(getattr(_C, name)):
            if p.default is not inspect.Parameter.empty:
                want = 0 if p.default is None else p.default
                assert got[p.name] == want, f"{name}({p.name}=...): {got[p.name]!r} != {want!r}"
        if name not in HOST_ONLY:
            assert got["stream"] == 0


def test_import_minidl_never_imports_cuda():
    code = ("import sys, minidl, minidl.ops, minidl.nn, minidl.runtime\n"
            "bad = [m for m in ('minidl._cuda', 'pycuda') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_device_count():
    n = cuda.device_count()
    assert isinstance(n, int) and n >= 0


# ---- bad arguments: _C and _cuda raise the same exception with the same message ---------

f32 = np.zeros(64, np.float32)
f64 = np.zeros(64, np.float64)
u8 = np.zeros(64, np.uint8)
labels = np.zeros(4, np.int64)
ADDR = 4096  # a fake device address: each call below fails its checks before using it

BAD = [  # (name, _C's arguments, _cuda's arguments)
    ("sgemm", (False, False, 4, 4, 4, 1.0, f32, 3, f32, 4, 0.0, f32, 4),
     (False, False, 4, 4, 4, 1.0, ADDR, 3, ADDR, 4, 0.0, ADDR, 4)),
    ("conv2d_output_size", ((1, 1, 2, 2, 1, 5, 5, 1, 1, 0, 0),),
     ((1, 1, 2, 2, 1, 5, 5, 1, 1, 0, 0),)),
    ("conv2d_forward", ((1, 1, 2, 2, 0, 1, 1, 1, 1, 0, 0), f32, f32, None, f32),
     ((1, 1, 2, 2, 0, 1, 1, 1, 1, 0, 0), ADDR, ADDR, 0, ADDR)),
    ("pool2d_output_size", ((1, 1, 4, 4, 2, 2, 1, 1, 2, 0, 0),),
     ((1, 1, 4, 4, 2, 2, 1, 1, 2, 0, 0),)),
    ("max_pool2d_forward", ((1, 1, 2, 2, 3, 3, 3, 3, 0, 0, 0), f32, f32),
     ((1, 1, 2, 2, 3, 3, 3, 3, 0, 0, 0), ADDR, ADDR)),
    ("global_avg_pool2d_forward", (1, 0, 2, 2, f32, f32), (1, 0, 2, 2, ADDR, ADDR)),
    ("dropout_forward", (1.0, 0, f32, f32), (1.0, 0, ADDR, ADDR, 64)),
    ("batch_norm_forward_train",
     (1, 4, 1, f32, f32, f32, 1e-5, 0.1, None, None, f32, f32, f32),
     (1, 4, 1, ADDR, ADDR, ADDR, 1e-5, 0.1, 0, 0, ADDR, ADDR, ADDR)),
    ("batch_norm_forward_infer", (2, 4, 1, f32, f32, f32, f32, f32, -1.0, f32),
     (2, 4, 1, ADDR, ADDR, ADDR, ADDR, ADDR, -1.0, ADDR)),
    ("linear_forward", (-1, 2, 3, f32, f32, None, f32), (-1, 2, 3, ADDR, ADDR, 0, ADDR)),
    ("softmax_cross_entropy", (0, 10, f32, labels, f32), (0, 10, ADDR, ADDR, ADDR, ADDR)),
    ("sgd_step", (f32, f32, None, 0.1, 0.9, 0.1, 0.0, True, False),
     (ADDR, ADDR, 0, 0.1, 0.9, 0.1, 0.0, True, False, 64)),
    ("adam_step", (f32, f32, f32, f32, 0, 1e-3, 0.9, 0.999, 1e-8, 0.0, False),
     (ADDR, ADDR, ADDR, ADDR, 0, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, 64)),
    ("conv2d_forward_fused",  # a map with a scale and no shift
     ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), f32, f32, None, True, f32, None, False, None, None, f32),
     ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), ADDR, ADDR, 0, True, ADDR, 0, False, 0, 0, ADDR)),
    ("conv2d_backward_data_fused",  # dx NULL
     ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), f32, f32, None, True),
     ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), ADDR, ADDR, 0, True)),
    ("conv2d_backward_weights_fused",
     ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), f32, None, f32, True, f32, f32, False),
     ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), ADDR, 0, ADDR, True, ADDR, ADDR, False)),
    ("conv2d_forward_pooled",  # the pooling's input is not the convolution's output
     ((1, 1, 4, 4, 1, 1, 1, 1, 1, 0, 0), f32, f32, None, False, (1, 1, 3, 4, 2, 2, 2, 2, 0, 0, 0),
      False, False, f32),
     ((1, 1, 4, 4, 1, 1, 1, 1, 1, 0, 0), ADDR, ADDR, 0, False, (1, 1, 3, 4, 2, 2, 2, 2, 0, 0, 0),
      False, False, ADDR)),
    ("max_pool2d_forward_fused",  # a map with a scale and no shift
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), f32, f32, None, True, f32),
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), ADDR, ADDR, 0, True, ADDR)),
    ("max_pool2d_backward_fused",  # a ReLU alone, and an output too small
     ((1, 1, 2, 2, 3, 3, 3, 3, 0, 0, 0), f32, None, None, True, f32, f32),
     ((1, 1, 2, 2, 3, 3, 3, 3, 0, 0, 0), ADDR, 0, 0, True, ADDR, ADDR)),
    ("max_pool2d_forward_argmax",  # a 17 x 17 window: 289 taps do not fit a byte
     ((1, 1, 17, 17, 17, 17, 1, 1, 0, 0, 0), f32, None, None, False, f32, u8),
     ((1, 1, 17, 17, 17, 17, 1, 1, 0, 0, 0), ADDR, 0, 0, False, ADDR, ADDR)),
    ("max_pool2d_forward_argmax",  # a ReLU after a 16 x 16 window: no tap left for NO_TAP
     ((1, 1, 16, 16, 16, 16, 1, 1, 0, 0, 0), f32, None, None, False, f32, u8, True),
     ((1, 1, 16, 16, 16, 16, 1, 1, 0, 0, 0), ADDR, 0, 0, False, ADDR, ADDR, True)),
    ("max_pool2d_forward_argmax",  # tap NULL
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), f32, None, None, True, f32, None),
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), ADDR, 0, 0, True, ADDR, 0)),
    ("max_pool2d_forward_argmax",  # a map with a scale and no shift
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), f32, f32, None, False, f32, u8),
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), ADDR, ADDR, 0, False, ADDR, ADDR)),
    ("max_pool2d_backward_argmax",  # a 17 x 17 window
     ((1, 1, 17, 17, 17, 17, 1, 1, 0, 0, 0), u8, f32, f32),
     ((1, 1, 17, 17, 17, 17, 1, 1, 0, 0, 0), ADDR, ADDR, ADDR)),
    ("max_pool2d_backward_argmax",  # tap NULL
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), None, f32, f32),
     ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), 0, ADDR, ADDR)),
    ("max_pool2d_backward_argmax",  # an output too small
     ((1, 1, 2, 2, 3, 3, 3, 3, 0, 0, 0), u8, f32, f32),
     ((1, 1, 2, 2, 3, 3, 3, 3, 0, 0, 0), ADDR, ADDR, ADDR)),
    ("affine_add", (1, 0, 3, f32, None, None, False, None, None, None, False, False, f32),
     (1, 0, 3, ADDR, 0, 0, False, 0, 0, 0, False, False, ADDR)),
    ("batch_norm_stats", (4, 1, f64, f64, f32, f32, 1e-5, 0.1, None, None, f32, f32, f32, f32),
     (4, 1, ADDR, ADDR, ADDR, ADDR, 1e-5, 0.1, 0, 0, ADDR, ADDR, ADDR, ADDR)),
    ("batch_norm_relu_backward", (2, 3, 4, f32, f32, f32, f32, f32, None, f32, f32, f32, f32),
     (2, 3, 4, ADDR, ADDR, ADDR, ADDR, ADDR, 0, ADDR, ADDR, ADDR, ADDR)),
    ("batch_norm_add_relu_backward",  # a map with a scale and no shift
     (2, 3, 4, f32, f32, f32, None, True, f32, f32, f32, f32, f32, f32, f32, f32),
     (2, 3, 4, ADDR, ADDR, ADDR, 0, True, ADDR, ADDR, ADDR, ADDR, ADDR, ADDR, ADDR, ADDR)),
]


@pytest.mark.parametrize("name, c_args, cuda_args", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_raise_like_C(name, c_args, cuda_args):
    with pytest.raises(Exception) as c_err:
        getattr(_C, name)(*c_args)
    with pytest.raises(Exception) as cuda_err:
        getattr(cuda, name)(*cuda_args)
    assert type(cuda_err.value) is type(c_err.value)
    assert str(cuda_err.value).replace("mdl_cuda_", "mdl_") == str(c_err.value)


def test_workspace_too_small():
    shape = (256, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1)  # a long n*h*w: split-K needs a workspace
    need = cuda.conv2d_workspace_size(shape)
    assert need > 0
    with pytest.raises(ValueError, match=f"workspace has {need - 1} bytes, needs {need}"):
        cuda.conv2d_backward_weights(shape, ADDR, ADDR, ADDR, False, ADDR, need - 1)
    with pytest.raises(ValueError, match=f"workspace has {need - 1} bytes, needs {need}"):
        cuda.conv2d_backward_data_fused(shape, ADDR, ADDR, ADDR, True, ADDR, need - 1)


def test_too_large_for_the_gpu_kernels_is_minidl_error():
    with pytest.raises(_C.MinidlError, match="unsupported: mdl_cuda_sgemm: m, n and k must be below"):
        cuda.sgemm(False, False, 1 << 30, 1, 1, 1.0, ADDR, 1, ADDR, 1, 0.0, ADDR, 1)


def test_output_sizes_match_C():
    for shape in [(2, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1), (1, 1, 9, 9, 1, 3, 2, 2, 3, 0, 1)]:
        assert cuda.conv2d_output_size(shape) == _C.conv2d_output_size(shape)
    for shape in [(1, 1, 5, 5, 3, 3, 2, 2, 0, 0, 1), (1, 1, 7, 6, 3, 2, 2, 1, 1, 1, 0)]:
        assert cuda.pool2d_output_size(shape) == _C.pool2d_output_size(shape)


# ---- the C API: NULL pointers -----------------------------------------------------------

def test_c_api_null_pointers_are_rejected_as_on_the_cpu():
    """Every mdl_status function of minidl_cuda.h through ctypes with each pointer NULL in
    turn: MDL_ERR_ARG for exactly the pointers that its twin in minidl.h rejects, before
    anything reaches a device; a call that passes its checks reaches the device with the
    script's host buffers: MDL_ERR_DEVICE without a GPU (MDL_OK or MDL_ERR_DEVICE with
    one); never a crash or a hang."""
    ok, arg, workspace, device = 0, 1, 2, 5  # mdl_status
    # the one pointer the CPU takes NULL for and the GPU may not (minidl_cuda.h: the
    # pooled forward's workspace holds the convolution's output and must be given)
    given = {("mdl_cuda_conv2d_forward_pooled", "workspace"): workspace}
    reached = (device,) if cuda.device_count() == 0 else (ok, device)
    gpu, cpu = (null_pointer_statuses("minidl_cuda.h", "libminidl_cuda.so"),
                null_pointer_statuses("minidl.h", "libminidl.so"))
    assert len(gpu) > 40 and gpu["mdl_cuda_device_count"] == {"valid": ok, "null": {"n": arg}}
    for function, r in gpu.items():
        twin = cpu.get(function.replace("mdl_cuda_", "mdl_"))
        if twin is None:  # device_count and synchronize
            continue
        assert set(r["null"]) == set(twin["null"]), function
        for name, status in r["null"].items():
            want = ((given[function, name],) if (function, name) in given
                    else (arg,) if twin["null"][name] == arg else reached)
            assert status in want, (function, name, status)
        assert r["valid"] in ((ok,) if "output_size" in function else reached), (function, r)
