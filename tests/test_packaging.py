"""The package tells C tools how to link its core, like numpy.get_include()."""
import os
import shutil
import subprocess
import sys

import pytest

import minidl
from helpers import null_pointer_statuses

HERE = os.path.dirname(os.path.abspath(__file__))


def test_paths_exist():
    assert os.path.isfile(os.path.join(minidl.get_include(), "minidl.h"))
    assert os.path.isfile(os.path.join(minidl.get_library_dir(), "libminidl.so"))
    assert os.path.isfile(os.path.join(minidl.get_library_dir(), "libminidl.a"))


def test_cli_flags():
    out = subprocess.run([sys.executable, "-m", "minidl", "--cflags", "--libs"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert f"-I{minidl.get_include()}" in out
    assert f"-L{minidl.get_library_dir()}" in out and "-lminidl" in out
    assert subprocess.run([sys.executable, "-m", "minidl"], capture_output=True).returncode == 2


@pytest.mark.external
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_c_program_links_package_copy(tmp_path):
    """The C API test, built with `python -m minidl --cflags --libs`, passes."""
    flags = subprocess.run([sys.executable, "-m", "minidl", "--cflags", "--libs"],
                           capture_output=True, text=True, check=True).stdout.split()
    exe = tmp_path / "test_capi"
    subprocess.run(["cc", "-std=c11", os.path.join(HERE, "c", "test_capi.c"), "-o", str(exe),
                    *flags, "-lm"], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_c_api_null_pointers_are_errors_not_crashes():
    """Every mdl_status function of the header, called through ctypes with valid
    arguments and then with each pointer NULL in turn: MDL_OK, or MDL_ERR_ARG for a
    pointer that may not be NULL (tests/c/null_pointers.py); never a crash or a hang
    (under `make sanitize`, nor an AddressSanitizer report: exit code 99)."""
    results = null_pointer_statuses("minidl.h", "libminidl.so")
    assert len(results) > 40 and "mdl_conv2d_backward" in results
    for function, r in results.items():
        assert r["valid"] == 0, (function, r)
        for arg, status in r["null"].items():
            assert status in (0, 1), (function, arg, status)  # MDL_OK, MDL_ERR_ARG
    # the shapes, inputs and outputs may not be NULL; workspaces and the bias may
    assert results["mdl_conv2d_forward"]["null"] == {"s": 1, "x": 1, "w": 1, "bias": 0,
                                                     "y": 1, "workspace": 0}


def test_version_and_threads():
    assert minidl.__version__ == "0.1.0"
    before = minidl.get_num_threads()
    minidl.set_num_threads(3)
    assert minidl.get_num_threads() == 3
    minidl.set_num_threads(0)
    assert minidl.get_num_threads() == before
    for n in (-2, 4097, 100000):  # 100000 crashed OpenMP's runtime in the next region
        with pytest.raises(ValueError, match=r"n must be in \[0, 4096\], got %d" % n):
            minidl.set_num_threads(n)
    assert minidl.get_num_threads() == before
    with pytest.raises(ValueError, match="work must be >= 0"):
        minidl._C.set_min_parallel_work(-1)
    with pytest.raises(ValueError, match="simd level"):
        minidl.set_simd("avx9")


@pytest.mark.parametrize("env, expect", [
    ({"MINIDL_NUM_THREADS": "3"}, "3 "),
    ({"MINIDL_SIMD": "scalar"}, " scalar"),
    ({"MINIDL_SIMD": "avx2"}, " scalar" if minidl.cpu_simd() == "scalar" else " avx2"),
    ({"MINIDL_SIMD": "avx512"}, " " + minidl.cpu_simd()),
])
def test_environment_variables(env, expect):
    """MINIDL_NUM_THREADS sets the default thread count, MINIDL_SIMD the kernels (never
    above what the CPU has)."""
    code = "import minidl; print(minidl.get_num_threads(), minidl.get_simd())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}, cwd=os.path.dirname(HERE)).stdout
    assert expect in out, out


def test_environment_values_the_core_ignores_are_warned_about():
    env = {"MINIDL_SIMD": "AVX2", "MINIDL_CONV": "fft", "MINIDL_NUM_THREADS": "0"}
    code = "import minidl; print(minidl.get_num_threads() > 0, minidl.get_conv_algo())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, **env}, cwd=os.path.dirname(HERE))
    assert r.stdout.split() == ["True", "auto"]
    for line in ("MINIDL_SIMD='AVX2' is ignored (expected scalar | avx2 | avx512)",
                 "MINIDL_CONV='fft' is ignored (expected auto | gemm | winograd)",
                 "MINIDL_NUM_THREADS='0' is ignored (expected an integer in [1, 4096])"):
        assert line in r.stderr, r.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_makefile_and_setup_compile_alike():
    """setup.py and the Makefile compile the C core and the CUDA kernels into the same
    objects (build/obj/, build/cuda/), so both must pass the compilers the same flags."""
    import ast
    root = os.path.dirname(HERE)
    assigns = {node.targets[0].id: node.value for node in ast.parse(
        open(os.path.join(root, "setup.py")).read()).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}

    def value(node):  # a list literal, a name of one, or a sum of those
        if isinstance(node, ast.BinOp):
            return value(node.left) + value(node.right)
        return value(assigns[node.id]) if isinstance(node, ast.Name) else ast.literal_eval(node)

    pairs = {"C_FLAGS": "CFLAGS_COMMON", "OPT": "OPT", "AVX2_FLAGS": "AVX2_FLAGS",
             "AVX512_FLAGS": "AVX512_FLAGS", "SAN_FLAGS": "SAN_FLAGS", "NVCC_FLAGS": "NVCCFLAGS"}
    rule = "flags: ; " + " && ".join(f"echo '$({var})'" for var in pairs.values())
    out = subprocess.run(["make", "-s", "-C", root, "--eval", rule, "flags"], capture_output=True,
                         text=True, check=True, env=dict(os.environ, MAKELEVEL="1")).stdout
    for (ours, theirs), line in zip(pairs.items(), out.splitlines(), strict=True):
        assert line.split() == value(assigns[ours]), (ours, theirs)
