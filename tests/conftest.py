import os
import zlib

import numpy as np
import pytest

import minidl

# `make sanitize` runs this suite against a separate AddressSanitizer build; make
# sure that build, not the in-place one, is what got imported.
_expect = os.environ.get("MINIDL_EXPECT_PATH")
if _expect and not os.path.abspath(minidl.__file__).startswith(_expect):
    raise RuntimeError(f"expected minidl from {_expect}, imported {minidl.__file__}")

# every level this CPU has, lowest first: scalar, avx2, avx512
_ALL_LEVELS = ["scalar", "avx2", "avx512"]
SIMD_LEVELS = _ALL_LEVELS[:_ALL_LEVELS.index(minidl.cpu_simd()) + 1]


@pytest.fixture(params=SIMD_LEVELS)
def simd(request):
    """Run the test once per kernel version (scalar reference, AVX2, AVX-512)."""
    minidl.set_simd(request.param)
    yield request.param
    minidl.set_simd(minidl.cpu_simd())


@pytest.fixture(params=[1, 2])
def threads(request):
    """Run the test with 1 and with 2 threads; with 2, every parallel region is
    split, however small, so the threaded partitions are exercised."""
    before = minidl.get_num_threads()
    minidl.set_num_threads(request.param)
    minidl._C.set_min_parallel_work(0 if request.param > 1 else 65536)
    yield request.param
    minidl.set_num_threads(before)
    minidl._C.set_min_parallel_work(65536)


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id (crc32: stable across runs, unlike
    hash()), so every test sees the same data every time."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
