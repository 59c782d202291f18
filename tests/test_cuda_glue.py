"""The cuda device's call adapter, without a GPU: arguments given in the CPU
binding's order reach the CUDA binding's parameters (addresses, workspace sizes,
element counts, a loss written to device memory), and the kernels' host-checkable
arithmetic."""
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from minidl.device import DeviceArray
from minidl.device.cuda import CudaDevice


class _Mem:
    def __init__(self, ptr):
        self.ptr = ptr


def _device():
    dev = object.__new__(CudaDevice)  # no GPU: only what _launch touches
    dev.name, dev.launches = "cuda:0", 0
    dev.current = types.SimpleNamespace(handle=77)
    dev.empty = lambda shape: DeviceArray(dev, _Mem(9000), tuple(shape), np.float32)
    dev.to_host = lambda a: np.array([2.5], np.float32)
    return dev


def _array(dev, ptr, shape):
    return DeviceArray(dev, _Mem(ptr), shape, np.float32)


def test_relu_gets_addresses_and_the_element_count():
    dev, seen = _device(), {}

    def relu_forward(x, y, count, stream=0):
        seen.update(x=x, y=y, count=count, stream=stream)
    dev._launch("relu_forward", relu_forward, (_array(dev, 100, (2, 3)), _array(dev, 200, (2, 3))))
    assert seen == {"x": 100, "y": 200, "count": 6, "stream": 77} and dev.launches == 1


def test_a_workspace_passes_its_size_and_none_is_null():
    dev, seen = _device(), {}

    def conv2d_forward(shape, x, w, bias, y, ws=0, ws_bytes=0, stream=0):
        seen.update(bias=bias, ws=ws, ws_bytes=ws_bytes)
    a = _array(dev, 8, (4,))
    dev._launch("conv2d_forward", conv2d_forward,
                ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), a, a, None, a, _array(dev, 64, (10,))))
    assert seen == {"bias": 0, "ws": 64, "ws_bytes": 40}


def test_the_loss_comes_back_as_a_float():
    dev, seen = _device(), {}

    def softmax_cross_entropy(n, classes, logits, labels, dlogits, loss, stream=0):
        seen.update(loss=loss)
    a = _array(dev, 8, (2, 3))
    loss = dev._launch("softmax_cross_entropy", softmax_cross_entropy, (2, 3, a, a, a))
    assert loss == 2.5 and seen == {"loss": 9000}


def test_a_fused_conv_passes_its_input_map_and_none_is_null():
    dev, seen = _device(), {}

    def conv2d_forward_fused(shape, x, in_scale, in_shift, in_relu, w, bias, relu, channel_sum,
                             channel_sumsq, y, ws=0, ws_bytes=0, stream=0):
        seen.update(in_scale=in_scale, in_shift=in_shift, in_relu=in_relu, bias=bias, relu=relu,
                    channel_sum=channel_sum, channel_sumsq=channel_sumsq, ws=ws, ws_bytes=ws_bytes)
    a = _array(dev, 8, (4,))
    dev._launch("conv2d_forward_fused", conv2d_forward_fused,
                ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), a, _array(dev, 16, (1,)),
                 _array(dev, 24, (1,)), True, a, None, False, None, _array(dev, 32, (1,)), a))
    assert seen == {"in_scale": 16, "in_shift": 24, "in_relu": True, "bias": 0, "relu": False,
                    "channel_sum": 0, "channel_sumsq": 32, "ws": 0, "ws_bytes": 0}


def test_backward_data_fused_passes_accumulate_and_its_workspace():
    dev, seen = _device(), {}

    def conv2d_backward_data_fused(shape, dy, w, dx, accumulate, ws=0, ws_bytes=0, stream=0):
        seen.update(dy=dy, w=w, dx=dx, accumulate=accumulate, ws=ws, ws_bytes=ws_bytes,
                    stream=stream)
    dev._launch("conv2d_backward_data_fused", conv2d_backward_data_fused,
                ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), _array(dev, 8, (4,)), _array(dev, 16, (1,)),
                 _array(dev, 24, (4,)), True, _array(dev, 64, (10,))))
    assert seen == {"dy": 8, "w": 16, "dx": 24, "accumulate": True, "ws": 64, "ws_bytes": 40,
                    "stream": 77}
    dev._launch("conv2d_backward_data_fused", conv2d_backward_data_fused,
                ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), _array(dev, 8, (4,)), _array(dev, 16, (1,)),
                 _array(dev, 24, (4,)), False, None))
    assert seen["accumulate"] is False and seen["ws"] == 0 and seen["ws_bytes"] == 0


def test_a_fused_max_pool_passes_its_input_map_and_none_is_null():
    dev, seen = _device(), {}

    def max_pool2d_backward_fused(shape, x, in_scale, in_shift, in_relu, dy, dx, stream=0):
        seen.update(x=x, in_scale=in_scale, in_shift=in_shift, in_relu=in_relu, dy=dy, dx=dx,
                    stream=stream)
    dev._launch("max_pool2d_backward_fused", max_pool2d_backward_fused,
                ((1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), _array(dev, 8, (16,)), None, None, True,
                 _array(dev, 16, (4,)), _array(dev, 24, (16,))))
    assert seen == {"x": 8, "in_scale": 0, "in_shift": 0, "in_relu": True, "dy": 16, "dx": 24,
                    "stream": 77}


def test_batch_norm_stats_keeps_its_count():
    """count is one of _C's parameters here, not an element count to fill in."""
    dev, seen = _device(), {}

    def batch_norm_stats(c, count, channel_sum, channel_sumsq, gamma, beta, eps, momentum,
                         running_mean, running_var, save_mean, save_invstd, scale, shift,
                         stream=0):
        seen.update(c=c, count=count, running_mean=running_mean)
    a = _array(dev, 8, (4,))
    dev._launch("batch_norm_stats", batch_norm_stats,
                (4, 50, a, a, a, a, 1e-5, 0.1, None, None, a, a, a, a))
    assert seen == {"c": 4, "count": 50, "running_mean": 0}


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_gathers_division_by_multiply_and_shift_is_exact(tmp_path):
    """src_cuda/fastdiv.cuh (the convolutions' index arithmetic) against `/`, on the host."""
    here = Path(__file__).parent
    exe = tmp_path / "test_fastdiv"
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-o", str(exe),
                    str(here / "c" / "test_fastdiv.cpp")], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert " 0 wrong" in r.stdout
