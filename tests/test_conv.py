"""conv2d and conv2d_backward against the float64 reference (tests/reference.py),
on both kernel versions, plus accumulate semantics, workspaces and bad input."""
import os
import subprocess
import sys

import numpy as np
import pytest

import minidl
from minidl import _C, ops

from conftest import SIMD_LEVELS
from helpers import assert_close, f32
import reference as ref

# (n, c_in, h, w, c_out, kh, kw, stride, padding)
CASES = [
    (2, 3, 9, 8, 5, 3, 2, (2, 1), 1),         # the C API test's shape
    (1, 1, 1, 1, 1, 1, 1, 1, 0),              # everything 1
    (2, 5, 7, 7, 13, 1, 1, 1, 0),             # 1x1, stride 1, no padding: no im2col
    (2, 5, 1, 1, 3, 1, 1, 1, 0),              # 1x1 spatial, 1x1 kernel
    (33, 24, 2, 2, 40, 1, 1, 1, 0),           # 1x1 kernel, few pixels: images in groups
    (9, 16, 1, 3, 8, 1, 1, 1, 0),             # ... 11 images a group: one, short
    (1, 6, 1, 1, 9, 3, 3, 1, 1),              # 1x1 spatial, padding only around it
    (1, 13, 6, 5, 3, 1, 1, 2, 0),             # 1x1 kernel with stride 2
    (1, 13, 6, 5, 3, 1, 1, 1, 1),             # 1x1 kernel with padding
    (3, 3, 11, 13, 8, 3, 3, 1, 1),
    (2, 4, 10, 9, 7, 5, 5, 2, 2),
    (1, 2, 15, 12, 3, 7, 7, 3, 3),
    (2, 3, 8, 8, 5, 7, 7, 1, 0),
    (1, 3, 9, 17, 4, 1, 5, (1, 3), (0, 2)),   # rectangular kernels, (h, w) pairs
    (2, 1, 13, 7, 2, 4, 2, (3, 2), (1, 0)),
    (1, 4, 6, 9, 3, 2, 3, (2, 3), (2, 1)),
    (3, 7, 8, 6, 11, 3, 1, (1, 2), (1, 0)),
    (1, 8, 5, 5, 16, 3, 3, 2, 3),             # padding larger than half the kernel
    (1, 2, 3, 3, 1, 5, 5, 1, 1),              # kernel as large as the padded input
    (2, 17, 12, 12, 9, 3, 3, 1, 1),
    (1, 3, 5, 40, 2, 3, 3, 3, 0),             # stride leaves input columns unused
    (1, 3, 6, 45, 4, 3, 3, (1, 2), (1, 1)),   # wide rows: vector loops and their tails
    (1, 2, 4, 37, 3, 5, 5, 1, 3),
    (1, 2, 3, 20, 2, 1, 19, 1, (0, 9)),       # padding wider than a vector
    (3, 8, 5, 6, 4, 2, 3, 1, (1, 2)),         # dx as the forward of dy: rectangular kernel
    (2, 9, 6, 7, 5, 3, 3, 1, (3, 0)),         # stride 1 but padding > kernel - 1: chunked dx
    (2, 5, 8, 16, 7, 3, 3, 1, 1),             # dw as dot products: 7 channels, 45 rows
    (1, 3, 5, 8, 6, 3, 5, 1, (1, 2)),         # rows 8 wide, rectangular kernel
    (2, 9, 8, 8, 5, 3, 3, 1, 1),              # 8-wide rows read in place in pairs (y and dx)
    (1, 4, 6, 8, 3, 5, 5, 1, 2),
    (2, 3, 5, 24, 9, 3, 3, 1, 1),             # dw dot products: rows of 16 + 8, 9 channels
    (2, 2, 6, 24, 9, 2, 1, 1, 0),             # the same with K = 4 rows (3 + 1)
    # strided rows read in place from the image's phase planes
    (2, 5, 16, 16, 6, 3, 3, 2, 1),            # 8 wide, in pairs
    (2, 6, 32, 31, 5, 1, 1, 2, 0),            # 1x1: one plane of the four
    (1, 3, 10, 46, 4, 2, 2, 3, 1),            # stride larger than the kernel
    (1, 4, 9, 18, 3, 3, 3, (2, 1), 0),        # strides (2, 1): two planes
    (1, 3, 7, 45, 4, 3, 3, 2, 2),             # rows split 16 columns at a time: a tail of 13
    (2, 2, 6, 19, 3, 3, 3, 2, 0),             # no padding: even columns to plane 0, odd to 1
    (1, 3, 6, 33, 4, 3, 3, 2, 0),             # odd width, no padding, 16 outputs a row
    (1, 2, 7, 31, 3, 5, 5, 2, 2),             # odd width, padding 2: a zero before each plane
    (1, 3, 5, 64, 4, 3, 3, 2, 1),             # plane rows of 33: 32 pixels and a zero
    # strided dx by phases (data_phases_of): one GEMM per phase of the input pixels
    (2, 16, 32, 32, 32, 3, 3, 2, 1),          # resnet20's layer2.0.conv1: phases 16 wide
    (2, 16, 32, 32, 32, 1, 1, 2, 0),          # its downsample: three phases without taps
    (2, 32, 16, 16, 24, 3, 3, 2, 1),          # phases 8 wide, in pairs
    (1, 8, 33, 32, 4, 3, 3, 2, 1),            # odd height: phases of 16 and 17 rows
    (1, 8, 12, 32, 6, 5, 5, 2, 2),            # 5x5: 3 and 2 taps per dimension
    (1, 9, 6, 48, 5, 3, 3, 3, 0),             # stride 3
    (1, 8, 10, 16, 7, 3, 3, (2, 1), 1),       # strides (2, 1): two phases
    (2, 8, 16, 32, 4, 2, 2, 2, 0),            # kernel as the stride: one tap per phase
    (2, 8, 15, 16, 5, 3, 3, 2, 1),            # 8 wide but 7 rows: the chunked path
    # images inside every output's window, fewer pixels than taps, from 16 images: one
    # SGEMM with dense weights
    (16, 6, 2, 2, 7, 3, 3, 1, 1),             # VGG's last layers' 2x2
    (17, 5, 1, 1, 4, 3, 3, 1, 1),             # 1x1 images: the centre tap only
    (16, 3, 2, 3, 5, 3, 5, 1, (1, 2)),        # 2x3 under 3x5
    (16, 2, 3, 3, 3, 5, 5, 1, 2),             # 3x3 under 5x5
    (16, 4, 2, 2, 5, 3, 3, 2, 1),             # stride 2: one output
    (16, 2, 4, 4, 3, 5, 5, 1, 2),             # 4x4 under 5x5: not inside every window
    # small images on the im2col path go in groups side by side (im2col_group)
    (5, 24, 2, 2, 20, 3, 3, 1, 1),            # 2x2, as VGG's last layers: 8 to a group
    (9, 16, 4, 4, 8, 3, 3, 1, 1),             # 4x4: 2 to a group, one left over
    # small images, stride 1, from 16 images (AVX-512): 16 images at a time with the batch
    # innermost, output pixels in classes by the taps inside the image (batched_path)
    (16, 17, 4, 4, 19, 3, 3, 1, 1),           # 4x4 under 3x3: corners, edges, middle
    (18, 13, 5, 7, 23, 3, 3, 1, 1),           # a second unit of 2 images
    (16, 11, 6, 5, 9, 5, 5, 1, 2),            # 5x5: five classes of rows, four of columns
    (16, 9, 4, 6, 18, 3, 5, 1, (0, 2)),       # no padding in one direction
    (16, 24, 7, 7, 25, 2, 2, 1, 1),           # even kernel: 8x8 outputs
    (16, 48, 2, 8, 12, 4, 1, 1, (1, 0)),      # kernel rows that no output holds inside
]
BIG = [
    (1, 16, 20, 20, 32, 3, 3, 1, 1),
    (4, 3, 32, 32, 8, 3, 3, 2, 1),
    (2, 24, 16, 16, 24, 1, 1, 1, 0),
    (11, 32, 16, 16, 32, 5, 5, 1, 2),         # the fast path's chunks: 9 images, then 2
    (7, 32, 2, 2, 24, 3, 3, 1, 1),            # 2x2 images in groups, split over threads
    (5, 16, 32, 32, 32, 3, 3, 2, 1),          # strided dx by phases, split over threads
    (2, 48, 32, 32, 13, 3, 3, 1, 1),          # rows in place: K in two blocks, 8 + 5 channels
    (32, 16, 2, 2, 24, 3, 3, 1, 1),           # dense weights, the SGEMMs threaded
    (11, 256, 4, 4, 128, 3, 3, 1, 1),         # a large dw: groups of 8 images for its products
    (33, 36, 4, 4, 44, 3, 3, 1, 1),           # batched: three units over the threads
    (17, 8180, 4, 4, 12, 3, 3, 1, 1),         # dw by taps in two chunks of images
    (2, 13, 20, 20, 40, 7, 7, 1, 3),          # dx: 7x7 kernels flipped as packed, across K blocks
]


def ids(case):
    n, ci, h, w, co, kh, kw, s, p = case
    return f"n{n}c{ci}x{h}x{w}-o{co}k{kh}x{kw}-s{s}p{p}".replace(" ", "")


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


def make(rng, case):
    n, ci, h, w, co, kh, kw, stride, padding = case
    x = f32(rng, n, ci, h, w)
    wt = f32(rng, co, ci, kh, kw)
    b = f32(rng, co)
    return x, wt, b, dict(stride=stride, padding=padding)


def ref_kw(kw):
    return dict(stride=pair(kw["stride"]), padding=pair(kw["padding"]))


def c_shape(case):
    n, ci, h, w, co, kh, kw, s, p = case
    return (n, ci, h, w, co, kh, kw) + pair(s) + pair(p)


def check_all(rng, case, bias):
    x, wt, b, kw = make(rng, case)
    b = b if bias else None
    y = ops.conv2d(x, wt, b, **kw)
    assert_close(y, ref.conv2d(x, wt, b, **ref_kw(kw)), "conv", "y")
    dy = f32(rng, *y.shape)
    dx, dw, db = ops.conv2d_backward(x, wt, dy, **kw)
    rdx, rdw, rdb = ref.conv2d_backward(x, wt, dy, **ref_kw(kw))
    assert_close(dx, rdx, "conv", "dx")
    assert_close(dw, rdw, "conv", "dw")
    assert_close(db, rdb, "conv", "db")


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv(simd, rng, case, bias):
    check_all(rng, case, bias)


@pytest.mark.parametrize("case", BIG, ids=ids)
def test_conv_threads(simd, threads, rng, case):
    check_all(rng, case, True)


def on_threads(*counts):
    """Yields each thread count in turn, set with no minimum of work for a second thread;
    then the count before."""
    before = minidl.get_num_threads()
    try:
        for nt in counts:
            minidl.set_num_threads(nt)
            _C.set_min_parallel_work(0)
            yield nt
    finally:
        minidl.set_num_threads(before)
        _C.set_min_parallel_work(65536)


@pytest.mark.parametrize("case", [(1, 24, 4, 4, 64, 3, 3, 1, 1), (2, 16, 7, 5, 100, 3, 3, 1, 1),
                                  (1, 96, 4, 4, 64, 3, 3, 1, 1), (1, 64, 3, 3, 60, 1, 1, 1, 0),
                                  (1, 64, 8, 8, 48, 3, 3, 1, 1), (1, 20, 16, 16, 64, 3, 3, 1, 1)],
                         ids=ids)
def test_fewer_images_than_threads_share_rows(simd, rng, case):
    """An image's output rows split among the threads (fewer images than threads, on
    the GEMM's path; the data gradient's likewise): every value as on one thread, the
    epilogue, the channel sums, the input map, the pooling and adding to dx included."""
    x, wt, b, kw = make(rng, case)
    dy = f32(rng, *ops.conv2d(x, wt, **kw).shape)
    scale, shift, base = f32(rng, x.shape[1]), f32(rng, x.shape[1]), f32(rng, *x.shape)
    results = [(ops.conv2d(x, wt, b, relu=True, **kw),
                *ops.conv2d_fused(x, wt, b, x_scale=scale, x_shift=shift, x_relu=True, relu=True,
                                  stats=True, **kw),
                ops.conv2d_pooled(x, wt, b, relu=True, kernel_size=2, ceil_mode=True, **kw),
                ops.conv2d_backward(x, wt, dy, **kw)[0],
                ops.conv2d_backward(x, wt, dy, add_dx_to=base.copy(), **kw)[0])
               for _ in on_threads(1, 2, 3)]
    y = ref.conv2d(x.astype(np.float64), wt.astype(np.float64), b, **ref_kw(kw))
    assert_close(results[0][0], np.maximum(y, 0), "conv", "y")
    assert_close(results[0][5], ref.conv2d_backward(x, wt, dy, **ref_kw(kw))[0], "conv", "dx")
    for other in results[1:]:
        for a, c in zip(results[0], other):
            np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("case", [(1, 24, 4, 4, 64, 3, 3, 1, 1), (5, 24, 7, 5, 20, 3, 3, 1, 1),
                                  (1, 20, 8, 8, 30, 3, 3, 1, 1), (4, 20, 8, 8, 30, 3, 3, 1, 1),
                                  (1, 150, 4, 4, 60, 1, 1, 1, 0), (1, 150, 2, 2, 60, 1, 1, 1, 0),
                                  (8, 16, 8, 16, 12, 5, 5, 2, 2)],
                         ids=ids)
def test_few_images_share_dw_columns(simd, rng, case):
    """The weight gradient of up to 4 images a thread: dw's columns split among the
    threads, written in place (overwritten, or added to), every value as on one thread;
    the GEMM's paths (grouped, per image, rows of 8 under 256 pixels, 1x1 in place and
    grouped), the dot products' (from 256 pixels), with and without the input map."""
    x, wt, _, kw = make(rng, case)
    shape = c_shape(case)
    ho, wo = _C.conv2d_output_size(shape)
    dy = f32(rng, case[0], case[4], ho, wo)
    maps = [(None, None, False), (f32(rng, case[1]), f32(rng, case[1]), True)]
    dw0 = f32(rng, *wt.shape)
    results = []
    for _ in on_threads(1, 2, 3):
        for m in maps:
            for accumulate in (False, True):
                dw = dw0.copy() if accumulate else np.full_like(wt, np.nan)
                _C.conv2d_backward_weights_fused(shape, x.ravel(), *m, dy.ravel(), dw.ravel(),
                                                 accumulate)
                results.append(dw)
    _, rdw, _ = ref.conv2d_backward(x, wt, dy, **ref_kw(kw))
    assert_close(results[0], rdw, "conv", "dw")
    assert_close(results[1], dw0 + rdw, "conv", "dw")
    for i in range(4, len(results)):
        np.testing.assert_array_equal(results[i], results[i % 4])


# 3x3 and 5x5, stride 1: Winograd where it applies (padding < r): F(2x2, r x r) with tiles
# in AVX2 vectors, and F(4x4, 3x3) / F(4x4, 5x5) with channels in AVX-512 vectors (c_in
# and c_out multiples of 16) or in AVX2 vectors (multiples of 8: at the AVX2 level, and at
# the AVX-512 level for the weight gradient and from 16 input channels or 256 channel
# pairs); odd and even output sizes, tile rows and columns that do not fill a vector, few
# channels
WINOGRAD = [
    (2, 16, 32, 32, 16, 3, 3, 1, 1),          # resnet20's first stage
    (3, 32, 16, 16, 32, 3, 3, 1, 1),          # its second: two images per F(4x4) call
    (5, 64, 8, 8, 64, 3, 3, 1, 1),            # its third: 4 tiles per image, images grouped
    (5, 64, 6, 6, 128, 3, 3, 1, 1),           # dw in the gradient's larger chunks
    (2, 128, 8, 8, 256, 3, 3, 1, 1),          # forward and dx summed in registers (by SGEMMs
    (2, 256, 8, 8, 256, 3, 3, 1, 1),          # on Intel's with AVX-512), 8 wide, to 256 x 256
    (3, 192, 6, 5, 192, 3, 3, 1, 1),          # beyond: the sums by SGEMMs, every direction
    (2, 192, 4, 4, 192, 3, 3, 1, 1),          # the same at 4x4: an image's rows to a store
    (2, 192, 5, 7, 176, 5, 5, 1, 2),          # the same, F(4x4, 5x5)
    (2, 16, 7, 37, 48, 3, 3, 1, 2),           # F(4x4): partial tiles, padding 2, row tails
    (2, 16, 4, 4, 32, 3, 3, 1, 1),            # 4 rows per transposition (2 with 8 lanes)
    (1, 16, 9, 2, 16, 3, 3, 1, (2, 1)),       # 8 rows per transposition and a last one alone
    (2, 8, 7, 4, 16, 3, 3, 1, (0, 2)),        # 8 lanes: 2 rows per transposition, one alone
    (1, 16, 2, 2, 32, 3, 3, 1, 1),            # F(4x4): one partial tile
    (2, 8, 7, 9, 24, 3, 3, 1, 1),             # 8 channels to an AVX2 vector (winograd8_avx2.c)
    (2, 24, 6, 5, 8, 5, 5, 1, 2),             # the same, F(4x4, 5x5)
    (2, 8, 9, 10, 32, 5, 5, 1, 2),            # 8 -> 32: AVX2 vectors at every level
    (2, 32, 5, 5, 16, 3, 3, 1, (0, 1)),       # F(4x4): no padding in one direction
    (3, 5, 7, 9, 6, 3, 3, 1, 1),              # odd output: partial tiles
    (2, 17, 8, 8, 19, 3, 3, 1, 0),            # no padding
    (1, 4, 5, 21, 3, 3, 3, 1, 2),             # padding 2, 11 tile columns
    (2, 3, 3, 3, 2, 3, 3, 1, (0, 2)),         # one tile row
    (1, 9, 40, 6, 33, 3, 3, 1, (2, 1)),
    (1, 2, 1, 1, 3, 3, 3, 1, 1),              # a single pixel
    (2, 32, 16, 16, 32, 5, 5, 1, 2),          # F(4x4, 5x5): cifar10_quick's conv2
    (3, 32, 8, 8, 64, 5, 5, 1, 2),            # its conv3: images grouped
    (2, 16, 7, 9, 48, 5, 5, 1, (4, 1)),       # F(4x4, 5x5) by AVX-512: partial tiles
    (2, 7, 9, 11, 5, 5, 5, 1, (4, 1)),        # odd outputs, padding up to 4
    (1, 3, 5, 6, 2, 5, 5, 1, 0),              # no padding: one output row, a partial tile
]


@pytest.fixture(params=["gemm", "winograd"])
def conv_algo(request):
    minidl.set_conv_algo(request.param)
    yield request.param
    minidl.set_conv_algo("auto")


@pytest.mark.parametrize("case", WINOGRAD, ids=ids)
def test_conv_algorithms(simd, threads, conv_algo, rng, case):
    """Forward, dx (the forward of dy) and dw with each algorithm forced, against
    float64 NumPy; and the epilogue through Winograd's output transform."""
    check_all(rng, case, True)
    x, wt, b, kw = make(rng, case)
    shape = c_shape(case)
    ho, wo = _C.conv2d_output_size(shape)
    want = np.maximum(ref.conv2d(x, wt, b, **ref_kw(kw)), 0)
    y = np.empty((x.shape[0], wt.shape[0], ho, wo), np.float32)
    s, q = np.empty(wt.shape[0]), np.empty(wt.shape[0])
    _C.conv2d_forward_ex(shape, x.ravel(), wt.ravel(), b, True, s, q, y.ravel())
    assert_close(y, want, "conv")
    scale = np.sqrt(want[:, 0].size) * max(np.abs(want).max(), 1e-3)
    assert np.allclose(s, want.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6 * scale)
    assert np.allclose(q, (want ** 2).sum(axis=(0, 2, 3)), rtol=1e-5,
                       atol=1e-6 * scale * np.abs(want).max())


# shapes whose channel sums each path takes: in the GEMM's tiles (column matrix, 1x1),
# after the tiles (read in place, grouped images), in Winograd's output transforms
STATS_CASES = [(4, 8, 9, 7, 16, 3, 3, 1, 1), (2, 8, 16, 16, 16, 3, 3, 1, 1),
               (8, 8, 4, 4, 16, 3, 3, 1, 1), (2, 16, 12, 12, 32, 1, 1, 1, 0),
               (2, 64, 16, 16, 64, 3, 3, 1, 1), (3, 32, 16, 16, 32, 5, 5, 1, 2)]


@pytest.mark.parametrize("case", STATS_CASES, ids=ids)
def test_channel_sums_far_from_zero(simd, threads, conv_algo, rng, case):
    """The fused statistics of outputs whose mean is hundreds of times their spread:
    the variance from the sums as from the float64 outputs (float sums lost up to a
    fifth of it at 1000 times)."""
    x, wt, _, kw = make(rng, case)
    wt *= 0.1
    b = np.full(wt.shape[0], 1000.0, np.float32)
    y, s, q = ops.conv2d_fused(x, wt, b, stats=True, **kw)
    yd = y.astype(np.float64)
    count = yd.size // wt.shape[0]
    var = yd.var(axis=(0, 2, 3))
    assert np.all(yd.mean(axis=(0, 2, 3)) > 300 * np.sqrt(var))
    np.testing.assert_allclose(s / count, yd.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(q / count - (s / count) ** 2, var, rtol=1e-6)


def test_conv_algo_setting():
    assert minidl.get_conv_algo() == "auto"
    with pytest.raises(ValueError, match="conv algorithm must be one of"):
        minidl.set_conv_algo("fft")
    with pytest.raises(ValueError, match="winograd sums mode must be one of"):
        _C.set_winograd_sums("fft")


@pytest.fixture(params=["registers", "sgemm"])
def winograd_sums(request):
    minidl.set_conv_algo("winograd")
    _C.set_winograd_sums(request.param)
    yield request.param
    _C.set_winograd_sums("auto")
    minidl.set_conv_algo("auto")


@pytest.mark.parametrize("case", [
    (2, 64, 8, 8, 64, 3, 3, 1, 1),            # below every CPU's limit
    (2, 128, 6, 7, 256, 3, 3, 1, 1),          # above the Xeons' limit, partial tiles
    (2, 32, 5, 7, 48, 5, 5, 1, 2),            # F(4x4, 5x5)
    (2, 24, 6, 6, 40, 3, 3, 1, 1),            # channels in AVX2 vectors (multiples of 8)
], ids=ids)
def test_winograd_sums_either_way(simd, threads, winograd_sums, rng, case):
    """The channel Winograd with its sums forced into registers and to SGEMMs in every
    direction (by default the shape and the CPU choose: set_winograd_sums), against
    float64 NumPy."""
    check_all(rng, case, True)


def test_reference_gradients_by_finite_differences(rng):
    """The oracle's backward is the gradient of its forward (float64, central differences)."""
    x = rng.standard_normal((2, 3, 6, 5))
    w = rng.standard_normal((4, 3, 3, 2))
    b = rng.standard_normal(4)
    kw = dict(stride=(2, 1), padding=(1, 2))
    dy = rng.standard_normal(ref.conv2d(x, w, b, **kw).shape)
    dx, dw, db = ref.conv2d_backward(x, w, dy, **kw)
    eps = 1e-6

    def loss(x, w, b):
        return float(np.sum(ref.conv2d(x, w, b, **kw) * dy))

    for arr, grad in ((x, dx), (w, dw), (b, db)):
        for idx in list(np.ndindex(arr.shape))[:: max(1, arr.size // 15)]:
            saved = arr[idx]
            arr[idx] = saved + eps
            up = loss(x, w, b)
            arr[idx] = saved - eps
            down = loss(x, w, b)
            arr[idx] = saved
            assert abs((up - down) / (2 * eps) - grad[idx]) < 1e-6 * max(1.0, abs(grad[idx]))


def test_adjoint_identity(simd, rng):
    """<conv(x, w), dy> == <x, dx> == <w, dw> for minidl's own results."""
    x, wt, _, kw = make(rng, (2, 5, 11, 10, 6, 3, 4, (2, 1), (1, 2)))
    y = ops.conv2d(x, wt, **kw)
    dy = f32(rng, *y.shape)
    dx, dw, _ = ops.conv2d_backward(x, wt, dy, **kw)
    v = np.vdot(y.astype(np.float64), dy)
    np.testing.assert_allclose(np.vdot(x.astype(np.float64), dx), v, rtol=1e-4)
    np.testing.assert_allclose(np.vdot(wt.astype(np.float64), dw), v, rtol=1e-4)


def test_simd_paths_agree(rng):
    x, wt, b, kw = make(rng, (2, 6, 9, 9, 7, 3, 3, 1, 1))
    outs = []
    for level in ["scalar", minidl.cpu_simd()]:
        minidl.set_simd(level)
        outs.append(ops.conv2d(x, wt, b, **kw))
    minidl.set_simd(minidl.cpu_simd())
    assert_close(outs[1], outs[0].astype(np.float64), "conv")


def test_input_conversion(rng):
    """float64 and non-contiguous inputs are converted to C-contiguous float32."""
    x, wt, b, kw = make(rng, (2, 3, 7, 6, 4, 3, 3, 1, 1))
    want = ops.conv2d(x, wt, b, **kw)
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    assert not xt.flags.c_contiguous
    np.testing.assert_array_equal(ops.conv2d(xt, wt.astype(np.float64), b, **kw), want)


def test_backward_without_input_gradient(rng):
    """need_dx=False (a first layer) skips dx and leaves dw and db as they were."""
    x, wt, _, kw = make(rng, (3, 4, 9, 9, 5, 3, 3, 2, 1))
    dy = f32(rng, *ops.conv2d(x, wt, **kw).shape)
    dx, dw, db = ops.conv2d_backward(x, wt, dy, need_dx=False, **kw)
    _, rdw, rdb = ops.conv2d_backward(x, wt, dy, **kw)
    assert dx is None
    np.testing.assert_array_equal(dw, rdw)
    np.testing.assert_array_equal(db, rdb)


def test_empty_batch(rng):
    x = np.zeros((0, 3, 5, 5), np.float32)
    wt = f32(rng, 4, 3, 3, 3)
    assert ops.conv2d(x, wt, padding=1).shape == (0, 4, 5, 5)
    dx, dw, db = ops.conv2d_backward(x, wt, np.zeros((0, 4, 5, 5), np.float32), padding=1)
    assert dx.shape == x.shape and not dw.any() and not db.any()


@pytest.mark.parametrize("case", [(1, 3, 8, 8, 4, 3, 3, 2, 1), (16, 17, 4, 4, 19, 3, 3, 1, 1)],
                         ids=ids)
def test_nan_flows_to_the_output(simd, rng, case):
    x, wt, b, kw = make(rng, case)
    x[0, 1, 3, 3] = np.nan
    y = ops.conv2d(x, wt, b, **kw)
    want = ref.conv2d(x, wt, b, **ref_kw(kw))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    assert np.isnan(y).any() and not np.isnan(y).all()
    dx, dw, db = ops.conv2d_backward(x, wt, np.ones_like(y), **kw)
    assert np.isnan(dw).any() and not np.isnan(dx).any() and not np.isnan(db).any()


@pytest.mark.parametrize("case", [
    (5, 8, 4, 4, 12, 3, 3, 1, 1),             # images in groups
    (2, 5, 7, 7, 13, 1, 1, 1, 0),             # pointwise
    (2, 16, 8, 8, 16, 3, 3, 1, 1),            # image read in place; channels in vectors
    (2, 24, 8, 8, 8, 3, 3, 1, 1),             # 8 channels to a vector
    (2, 5, 9, 9, 7, 3, 3, 1, 1),              # F(2x2) tiles (AVX2 level, forced)
    (16, 8, 2, 2, 6, 3, 3, 1, 1),             # dense weights
    (2, 3, 9, 8, 5, 3, 2, 2, 1),              # strided
], ids=ids)
def test_nan_passes_the_relu_epilogue(simd, conv_algo, rng, case):
    """The ReLU in a convolution's epilogue keeps NaN, as ops.relu does, on every path
    (the SIMD ones made it 0 until 2026-12-07, the scalar and dense ones did not)."""
    x, wt, b, kw = make(rng, case)
    x[0, 1 % x.shape[1], 1, 1] = np.nan
    y = ops.conv2d(x, wt, b, relu=True, **kw)
    np.testing.assert_array_equal(y, ops.relu(ops.conv2d(x, wt, b, **kw)))
    assert np.isnan(y).any()


def test_nan_flows_to_the_output_dense(simd, rng):
    """2x2 images under 3x3 with padding 1 (one SGEMM with dense weights): every output
    of an image reads every input, so one NaN input makes that image's outputs NaN and
    no other image's."""
    x, wt, b, kw = make(rng, (16, 3, 2, 2, 4, 3, 3, 1, 1))
    x[5, 1, 0, 1] = np.nan
    y = ops.conv2d(x, wt, b, **kw)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref.conv2d(x, wt, b, **ref_kw(kw))))
    assert np.isnan(y[5]).all() and not np.isnan(np.delete(y, 5, 0)).any()
    dx, dw, db = ops.conv2d_backward(x, wt, np.ones_like(y), **kw)
    assert np.isnan(dw).any() and not np.isnan(dx).any() and not np.isnan(db).any()


# ---- the C binding: accumulate, overwrite, workspace ---------------------------------

ACC_CASES = [(4, 8, 3, 3, 5, 3, 3, 1, 1),  # dx (the forward of dy) of 3x3 images in groups
             (3, 3, 7, 6, 5, 3, 3, 1, 1), (2, 4, 5, 5, 3, 1, 1, 1, 0), (2, 2, 9, 8, 3, 2, 3, 2, 0),
             # Winograd by default (winograd_avx512.c, winograd8_avx2.c), its dw included
             (2, 16, 6, 7, 32, 3, 3, 1, 1), (3, 16, 6, 6, 16, 5, 5, 1, 2),
             (2, 24, 6, 7, 8, 3, 3, 1, 1),
             # strided dx by phases, added in their interleaving
             (2, 16, 32, 32, 24, 3, 3, 2, 1), (2, 16, 32, 31, 8, 1, 1, 2, 0),
             (2, 8, 16, 16, 8, 3, 3, 2, 1),
             # dense weights (2x2 images, 16 of them)
             (16, 6, 2, 2, 7, 3, 3, 1, 1),
             # batched: dx through the unit's spread, dw by taps
             (17, 17, 4, 4, 19, 3, 3, 1, 1)]


@pytest.mark.parametrize("case", ACC_CASES, ids=ids)
def test_accumulate_and_overwrite(simd, rng, case):
    x, wt, _, kw = make(rng, case)
    shape = c_shape(case)
    ho, wo = _C.conv2d_output_size(shape)
    dy = f32(rng, case[0], case[4], ho, wo)
    rdx, rdw, rdb = ref.conv2d_backward(x, wt, dy, **ref_kw(kw))
    # accumulate=False and dx overwrite: old contents (NaN) are never read
    dw = np.full_like(wt, np.nan)
    db = np.full(case[4], np.nan, np.float32)
    dx = np.full_like(x, np.nan)
    _C.conv2d_backward_weights(shape, x.ravel(), dy.ravel(), dw.ravel(), False)
    _C.conv2d_backward_bias(shape, dy.ravel(), db, False)
    _C.conv2d_backward_data(shape, dy.ravel(), wt.ravel(), dx.ravel())
    assert_close(dw, rdw, "conv", "dw =")
    assert_close(db, rdb, "conv", "db =")
    assert_close(dx, rdx, "conv", "dx =")
    # accumulate=True adds to what is there
    dw0, db0 = f32(rng, *wt.shape), f32(rng, case[4])
    dw, db = dw0.copy(), db0.copy()
    _C.conv2d_backward_weights(shape, x.ravel(), dy.ravel(), dw.ravel(), True)
    _C.conv2d_backward_bias(shape, dy.ravel(), db, True)
    assert_close(dw, rdw + dw0, "conv", "dw +=")
    assert_close(db, rdb + db0, "conv", "db +=")
    dx0 = f32(rng, *x.shape)
    dx = dx0.copy()
    _C.conv2d_backward_data_fused(shape, dy.ravel(), wt.ravel(), dx.ravel(), True)
    assert_close(dx, rdx + dx0, "conv", "dx +=")


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4], CASES[9], CASES[-2], BIG[0], BIG[3],
                                  (32, 16, 2, 2, 24, 3, 3, 1, 1)], ids=ids)
def test_forward_epilogue(simd, threads, rng, case):
    """conv2d_forward_ex: bias and ReLU applied and the channel sums of the final y
    taken in the GEMM's epilogue, against float64 NumPy."""
    x, wt, b, kw = make(rng, case)
    shape = c_shape(case)
    ho, wo = _C.conv2d_output_size(shape)
    want = np.maximum(ref.conv2d(x.astype(np.float64), wt.astype(np.float64), b, **ref_kw(kw)), 0)
    y = np.full((x.shape[0], wt.shape[0], ho, wo), np.nan, np.float32)
    s, q = np.full(wt.shape[0], np.nan), np.full(wt.shape[0], np.nan)
    _C.conv2d_forward_ex(shape, x.ravel(), wt.ravel(), b, True, s, q, y.ravel())
    assert_close(y, want, "conv")
    m = want.shape[0] * ho * wo
    scale = np.sqrt(m) * np.abs(want).max()  # error bound of float32 sums of m values
    assert np.allclose(s, want.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6 * scale)
    assert np.allclose(q, (want ** 2).sum(axis=(0, 2, 3)), rtol=1e-5,
                       atol=1e-6 * scale * np.abs(want).max())
    # one of the sums, no ReLU, no bias: y is the plain convolution
    y2 = np.empty_like(y)
    _C.conv2d_forward_ex(shape, x.ravel(), wt.ravel(), None, False, None, q, y2.ravel())
    plain = ref.conv2d(x.astype(np.float64), wt.astype(np.float64), None, **ref_kw(kw))
    assert_close(y2, plain, "conv")
    assert np.allclose(q, (plain ** 2).sum(axis=(0, 2, 3)), rtol=1e-5,
                       atol=1e-6 * np.sqrt(m) * np.abs(plain).max() ** 2)


def test_ops_conv2d_relu_is_the_epilogue(simd, rng):
    """ops.conv2d(relu=True) is max(conv2d, 0) exactly: the same products, ReLU in the store."""
    x, wt, b, kw = make(rng, BIG[0])
    np.testing.assert_array_equal(ops.conv2d(x, wt, b, relu=True, **kw),
                                  np.maximum(ops.conv2d(x, wt, b, **kw), 0))


# (conv case, pool, kernel, stride, padding, ceil_mode, relu, pool_relu)
POOLED = [
    ((3, 3, 32, 32, 32, 5, 5, 1, 2), "max", 3, 2, 0, True, False, True),   # cifar10_quick conv1
    ((2, 32, 16, 16, 32, 5, 5, 1, 2), "avg", 3, 2, 0, True, True, False),  # conv2: Winograd
    ((5, 32, 8, 8, 64, 5, 5, 1, 2), "avg", 3, 2, 0, True, True, False),    # conv3: images grouped
    ((2, 16, 12, 12, 16, 3, 3, 1, 1), "max", 2, 2, 0, False, True, False),  # VGG-like, F(4x4)
    (CASES[0], "max", (2, 3), (1, 2), (1, 1), True, True, True),          # im2col, odd sizes
    (CASES[2], "avg", 2, 1, 1, False, False, True),                        # pointwise
    ((2, 5, 16, 16, 6, 3, 3, 2, 1), "max", 3, 1, 1, False, False, False),  # strided, in place
    ((5, 8, 4, 4, 12, 3, 3, 1, 1), "max", 2, 2, 0, False, True, True),     # images in groups
    ((16, 8, 2, 2, 6, 3, 3, 1, 1), "max", 2, 2, 0, False, True, False),    # VGG's last: dense
    ((17, 20, 4, 4, 18, 3, 3, 1, 1), "max", 2, 2, 0, False, True, False),  # batched, 2 units
]


def pooled_id(case):
    conv, pool, k, s, p, ceil, relu, prelu = case
    return f"{ids(conv)}-{pool}{k}s{s}p{p}{'c' if ceil else ''}{'-r' if relu else ''}" \
           f"{'-pr' if prelu else ''}".replace(" ", "")


@pytest.mark.parametrize("case", POOLED, ids=pooled_id)
def test_conv2d_pooled(simd, threads, rng, case):
    """conv2d_pooled gives exactly conv2d, then the pooling, then ReLU (the same
    kernels, the output pooled from the cache), and that within the conv tolerance of
    float64 NumPy."""
    conv, pool, k, s, p, ceil, relu, prelu = case
    x, wt, b, kw = make(rng, conv)
    pkw = dict(stride=s, padding=p, ceil_mode=ceil)
    y = ops.conv2d_pooled(x, wt, b, **kw, relu=relu, pool=pool, kernel_size=k, pool_stride=s,
                          pool_padding=p, ceil_mode=ceil, pool_relu=prelu)
    steps = ops.conv2d(x, wt, b, **kw, relu=relu)
    steps = (ops.max_pool2d if pool == "max" else ops.avg_pool2d)(steps, k, **pkw)
    if prelu:
        steps = ops.relu(steps)
    np.testing.assert_array_equal(y, steps)
    want = ref.conv2d(x.astype(np.float64), wt.astype(np.float64), b, **ref_kw(kw))
    want = np.maximum(want, 0) if relu else want
    want = (ref.max_pool2d if pool == "max" else ref.avg_pool2d)(want, pair(k), pair(s),
                                                                 pair(p), ceil)
    assert_close(y, np.maximum(want, 0) if prelu else want, "conv")


@pytest.mark.parametrize("case", [
    ((3, 128, 7, 9, 256, 3, 3, 1, 1), "max", 2, 2, 0, True, True, False),   # partial tiles
    ((2, 32, 6, 7, 48, 5, 5, 1, 2), "avg", 3, 2, 1, False, False, True),    # F(4x4, 5x5)
    ((3, 24, 8, 8, 40, 3, 3, 1, 1), "max", 3, 1, 1, False, True, True),     # AVX2 vectors
], ids=pooled_id)
def test_conv2d_pooled_winograd_sums(simd, threads, winograd_sums, rng, case):
    """The pooled forward with the Winograd sums in registers and by SGEMMs (each image
    pooled from the thread's buffer): exactly conv2d, then the pooling, then ReLU, also
    in a workspace of exactly the size the C core reports."""
    conv, pool, k, s, p, ceil, relu, prelu = case
    x, wt, b, kw = make(rng, conv)
    y = ops.conv2d_pooled(x, wt, b, **kw, relu=relu, pool=pool, kernel_size=k, pool_stride=s,
                          pool_padding=p, ceil_mode=ceil, pool_relu=prelu)
    conv_out = ops.conv2d(x, wt, b, **kw, relu=relu)
    steps = (ops.max_pool2d if pool == "max" else ops.avg_pool2d)(
        conv_out, k, stride=s, padding=p, ceil_mode=ceil)
    np.testing.assert_array_equal(y, ops.relu(steps) if prelu else steps)
    shape = c_shape(conv)
    pool_shape = conv_out.shape + (k, k, s, s, p, p, ceil)
    ws = np.empty(_C.conv2d_pooled_workspace_size(shape, pool_shape) // 4, np.float32)
    out = np.empty(y.size, np.float32)
    _C.conv2d_forward_pooled(shape, x.ravel(), wt.ravel(), b, relu, pool_shape, pool == "avg",
                             prelu, out, ws)
    np.testing.assert_array_equal(out.reshape(y.shape), y)


def test_conv2d_pooled_bad_input(rng):
    x, wt, b, kw = make(rng, CASES[0])
    with pytest.raises(ValueError, match="pool must be 'max' or 'avg'"):
        ops.conv2d_pooled(x, wt, b, pool="min", kernel_size=2)
    with pytest.raises(ValueError, match="padding must be at most half"):
        ops.conv2d_pooled(x, wt, b, kernel_size=2, pool_padding=2)
    with pytest.raises(ValueError, match="x must be 4-D"):
        ops.conv2d_pooled(x[0], wt, b, kernel_size=2)
    assert ops.conv2d_pooled(x[:0], wt, b, **kw, kernel_size=2).shape == (0, 5, 2, 4)
    # the C core: the pooling's input must be the convolution's output
    shape = c_shape(CASES[0])
    ho, wo = _C.conv2d_output_size(shape)
    y = np.empty(2 * 5 * ho * wo, np.float32)
    for pool in [(2, 5, ho + 1, wo, 2, 2, 2, 2, 0, 0, 0), (2, 4, ho, wo, 2, 2, 2, 2, 0, 0, 0)]:
        with pytest.raises(ValueError, match="must be the convolution's output"):
            _C.conv2d_forward_pooled(shape, x.ravel(), wt.ravel(), b, False, pool, False, False, y)
        assert _C.conv2d_pooled_workspace_size(shape, pool) == 0
    pool = (2, 5, ho, wo, 2, 2, 2, 2, 0, 0, 0)
    assert _C.conv2d_pooled_workspace_size(shape, pool) > _C.conv2d_workspace_size(shape)
    before = minidl.get_num_threads()
    minidl.set_num_threads(1)
    try:
        small = np.empty(_C.conv2d_pooled_workspace_size(shape, pool) // 4 - 1, np.float32)
        with pytest.raises(ValueError, match="workspace has .* bytes, needs"):
            _C.conv2d_forward_pooled(shape, x.ravel(), wt.ravel(), b, False, pool, False, False,
                                     y, small)
    finally:
        minidl.set_num_threads(before)


# Both gradients in one call (conv2d_backward, which ops.conv2d_backward takes): where
# the data gradient and the weight gradient both take the channel Winograd, one pass
# over dy for both (16 and 8 channels to a vector, 3x3 and 5x5, padding 0 to kernel - 1);
# the last two cases take the two calls (dy's blocks outside the data gradient's padded
# input; 3 channels).  The values are the two calls', bit for bit.
BOTH_CASES = [(4, 16, 8, 8, 16, 3, 3, 1, 1), (3, 32, 9, 9, 48, 5, 5, 1, 2),
              (5, 16, 7, 7, 32, 3, 3, 1, 0), (2, 24, 10, 10, 8, 3, 3, 1, 2),
              (3, 8, 12, 12, 16, 5, 5, 1, 1), (2, 16, 12, 12, 16, 3, 3, 1, 2),
              (2, 3, 8, 8, 5, 3, 3, 1, 1)]


@pytest.mark.parametrize("case", BOTH_CASES, ids=ids)
def test_both_gradients_in_one_call(simd, threads, rng, case):
    x, wt, _, kw = make(rng, case)
    shape = c_shape(case)
    ho, wo = _C.conv2d_output_size(shape)
    dy = f32(rng, case[0], case[4], ho, wo)
    maps = [(None, None, False), (f32(rng, case[1]), f32(rng, case[1]), True)]
    for accumulate in (False, True):
        for m in maps:
            dx0, dw0 = f32(rng, *x.shape), f32(rng, *wt.shape)
            dx, dw, dx2, dw2 = dx0.copy(), dw0.copy(), dx0.copy(), dw0.copy()
            _C.conv2d_backward_data_fused(shape, dy.ravel(), wt.ravel(), dx.ravel(), accumulate)
            _C.conv2d_backward_weights_fused(shape, x.ravel(), *m, dy.ravel(), dw.ravel(),
                                             accumulate)
            _C.conv2d_backward(shape, x.ravel(), *m, dy.ravel(), wt.ravel(), dx2.ravel(),
                               accumulate, dw2.ravel(), accumulate)
            np.testing.assert_array_equal(dx2, dx)
            np.testing.assert_array_equal(dw2, dw)
    _, rdw, _ = ref.conv2d_backward(x, wt, dy, **ref_kw(kw))
    dw = np.full_like(wt, np.nan)  # no dx: the weight gradient alone, dw overwritten
    _C.conv2d_backward(shape, x.ravel(), *maps[0], dy.ravel(), wt.ravel(), None, False,
                       dw.ravel(), False)
    assert_close(dw, rdw, "conv", "dw")


def test_workspace(simd, rng):
    case = (2, 3, 9, 8, 5, 3, 3, 1, 1)
    x, wt, b, kw = make(rng, case)
    shape = c_shape(case)
    need = _C.conv2d_workspace_size(shape)
    assert need >= 3 * 9 * 9 * 8 * 4  # at least the column matrix of one image
    ho, wo = _C.conv2d_output_size(shape)
    y = np.empty((2, 5, ho, wo), np.float32)
    dx, dw = np.empty_like(x), np.empty_like(wt)
    ws = np.empty(-(-need // 4), np.float32)
    _C.conv2d_forward(shape, x.ravel(), wt.ravel(), b, y.ravel(), ws)
    assert_close(y, ref.conv2d(x, wt, b, **ref_kw(kw)), "conv")
    # the size depends on the thread count; below the one-thread size is an error
    before = minidl.get_num_threads()
    minidl.set_num_threads(1)
    one = _C.conv2d_workspace_size(shape)
    minidl.set_num_threads(before)
    assert one <= need
    small = np.empty(one // 4 - 1, np.float32)
    calls = [
        lambda: _C.conv2d_forward(shape, x.ravel(), wt.ravel(), b, y.ravel(), small),
        lambda: _C.conv2d_backward_data(shape, y.ravel(), wt.ravel(), dx.ravel(), small),
        lambda: _C.conv2d_backward_weights(shape, x.ravel(), y.ravel(), dw.ravel(), False, small),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="workspace has .* bytes, needs"):
            call()


_KEPT_WORKSPACE = """
import resource, numpy as np, minidl
from minidl import _C
shape = (32, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1)  # a 74 MB workspace: glibc maps it afresh
x, y = np.ones(32 * 512 * 16, np.float32), np.empty(32 * 512 * 16, np.float32)
w = np.ones(512 * 512 * 9, np.float32)
def faults(calls):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        _C.conv2d_forward(shape, x, w, None, y)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
faults(1)
again = faults(3)
minidl.set_keep_workspace(False)
after = faults(2) / 2
minidl.set_keep_workspace(True)
faults(1)
print(_C.conv2d_workspace_size(shape), again, after, faults(3))
"""


def test_workspace_kept_between_calls():
    """Calls without a workspace reuse the one the library kept from the call before:
    no page of it is mapped again; with set_keep_workspace(False) each call maps
    thousands.  In a fresh process: the executor's malloc settings
    (minidl.runtime.keep_freed_memory) would hide the difference."""
    env = dict(os.environ, MINIDL_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", _KEPT_WORKSPACE], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    size, again, freed, kept_again = (float(v) for v in out)
    assert size > 40 << 20
    assert again < 100 and kept_again < 100, f"{again}, {kept_again} page faults in 3 calls"
    assert freed > 1000, f"{freed} page faults a call without the kept workspace"


def test_workspace_weights_by_taps(rng):
    """The weight gradient by taps (4x4 outputs) in chunks of images whose last, shorter
    chunk needs the larger SGEMM workspace: the reported size holds it."""
    case = (4323, 20, 4, 4, 16, 3, 3, 1, 1)  # chunks of 3640 and 683 images
    x, _, _, _ = make(rng, case)
    dy = f32(rng, 4323, 16, 4, 4)
    shape = c_shape(case)
    ws = np.empty(-(-_C.conv2d_workspace_size(shape) // 4), np.float32)
    dw, want = np.empty((16, 20, 3, 3), np.float32), np.empty((16, 20, 3, 3), np.float32)
    _C.conv2d_backward_weights(shape, x.ravel(), dy.ravel(), dw.ravel(), False, ws)
    _C.conv2d_backward_weights(shape, x.ravel(), dy.ravel(), want.ravel(), False)
    np.testing.assert_array_equal(dw, want)
    assert_close(dw, ref.conv2d_backward(x, np.zeros((16, 20, 3, 3), np.float32), dy,
                                         stride=(1, 1), padding=(1, 1))[1], "conv")


@pytest.fixture(scope="module", params=[(3, 128, 56, 56, 144), (3, 136, 12, 12, 128)],
                ids=["16-lanes", "8-lanes"])
def sums_case(request):
    """A weight gradient by Winograd with dU summed by SGEMMs (c_in c_out above 128 x 128):
    V and dM of 196 tiles per image, in chunks of 2 images and a last one of 1; and 136
    input channels, a multiple of 8 but not of 16 (AVX2 vectors at every level)."""
    rng = np.random.default_rng(7)
    n, c_in, h, w, c_out = request.param
    case = (n, c_in, h, w, c_out, 3, 3, 1, 1)
    x, _, _, _ = make(rng, case)
    dy = f32(rng, n, c_out, h, w)
    zero = np.zeros((c_out, c_in, 3, 3), np.float32)
    return case, x, dy, ref.conv2d_backward(x, zero, dy, stride=(1, 1), padding=(1, 1))[1]


@pytest.mark.parametrize("level", [lv for lv in SIMD_LEVELS if lv != "scalar"])
def test_weights_winograd_sums(level, threads, sums_case):
    """Added to dw, with the reported workspace and with one thread's (the calls then
    take fewer threads); the SIMD levels that have this path."""
    case, x, dy, want = sums_case
    shape = c_shape(case)
    start = f32(np.random.default_rng(1), *want.shape)
    full = -(-_C.conv2d_workspace_size(shape) // 4)
    minidl.set_num_threads(1)
    one = -(-_C.conv2d_workspace_size(shape) // 4)
    minidl.set_num_threads(threads)
    minidl.set_simd(level)
    try:
        for floats in (full, one):
            dw = start.copy()
            _C.conv2d_backward_weights(shape, x.ravel(), dy.ravel(), dw.ravel(), True,
                                       np.empty(floats, np.float32))
            assert_close(dw, want + start, "conv")
    finally:
        minidl.set_simd(minidl.cpu_simd())


# ---- bad input ---------------------------------------------------------------------

def _bad_shape(**change):
    s = dict(n=1, c_in=2, h=5, w=5, c_out=3, kh=3, kw=3, stride_h=1, stride_w=1, pad_h=0, pad_w=0)
    s.update(change)
    return tuple(s.values())


@pytest.mark.parametrize("change, match", [
    (dict(n=0), "n must be in \\[1,.*got 0"),
    (dict(c_in=-1), "c_in must be in \\[1,.*got -1"),
    (dict(h=0), "h must be in \\[1,.*got 0"),
    (dict(w=0), "w must be in \\[1,.*got 0"),
    (dict(c_out=0), "c_out must be in \\[1,.*got 0"),
    (dict(kh=0), "kh must be in"),
    (dict(kw=0), "kw must be in"),
    (dict(stride_h=0), "stride_h must be in \\[1,.*got 0"),
    (dict(stride_w=-2), "stride_w must be in \\[1,.*got -2"),
    (dict(pad_h=-1), "pad_h must be in \\[0,.*got -1"),
    (dict(pad_w=-1), "pad_w must be in \\[0,.*got -1"),
    (dict(kh=6), "kernel size can't be greater than actual input size"),
    (dict(kw=8, pad_w=1), "kernel size can't be greater than actual input size.*\\(5, 7\\)"),
    (dict(h=2**40), "h must be in"),
    (dict(n=2**30, c_in=2**30, h=2**10), "too large"),
])
def test_c_shape_errors(change, match):
    shape = _bad_shape(**change)
    with pytest.raises(ValueError, match=match):
        _C.conv2d_output_size(shape)
    assert _C.conv2d_workspace_size(shape) == 0
    one = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match=match):
        _C.conv2d_backward_bias(shape, one, one)


def test_c_null_pointers():
    shape = _bad_shape()
    buf = np.zeros(200, np.float32)
    with pytest.raises(ValueError, match="x must not be NULL"):
        _C.conv2d_forward(shape, None, buf, None, buf)
    with pytest.raises(ValueError, match="dx must not be NULL"):
        _C.conv2d_backward_data(shape, buf, buf, None)
    with pytest.raises(ValueError, match="dw must not be NULL"):
        _C.conv2d_backward_weights(shape, buf, buf, None)
    with pytest.raises(ValueError, match="db must not be NULL"):
        _C.conv2d_backward_bias(shape, buf, None)


X = np.zeros((2, 3, 8, 8), np.float32)
W = np.zeros((4, 3, 3, 3), np.float32)
DY = np.zeros((2, 4, 6, 6), np.float32)

FORWARD_ERRORS = [
    (dict(x=X.astype(np.int32)), TypeError, "x must be a float32 array, got dtype int32"),
    (dict(x=[[1.0]]), TypeError, "x must be a numpy.ndarray"),
    (dict(w=W.astype(np.int64)), TypeError, "w must be a float32 array"),
    (dict(x=X[0]), ValueError, "x must be 4-D \\(N, C_in, H, W\\), got shape \\(3, 8, 8\\)"),
    (dict(w=W[0]), ValueError, "w must be 4-D"),
    (dict(w=np.zeros((4, 2, 3, 3), np.float32)), ValueError, "w must have C_in = 3"),
    (dict(b=np.zeros(5, np.float32)), ValueError,
     "b must have shape \\(C_out,\\) = \\(4,\\), got \\(5,\\)"),
    (dict(b=np.zeros((4, 1), np.float32)), ValueError, "b must be 1-D"),
    (dict(b=np.zeros(4, np.int32)), TypeError, "b must be a float32 array"),
    (dict(stride=0), ValueError, "stride must be >= 1, got 0"),
    (dict(stride=(1, 0)), ValueError, "stride must be >= 1, got 0"),
    (dict(stride=(1, 2, 3)), ValueError, "stride must be an int or an \\(h, w\\) pair"),
    (dict(stride=1.5), TypeError, "stride must be an int"),
    (dict(padding=-1), ValueError, "padding must be >= 0, got -1"),
    (dict(padding=(0, -2)), ValueError, "padding must be >= 0, got -2"),
    (dict(w=np.zeros((4, 3, 9, 3), np.float32)), ValueError,
     "output too small.*\\(9, 3\\).*\\(8, 8\\)"),
    (dict(w=np.zeros((4, 3, 3, 11), np.float32), padding=1), ValueError,
     "output too small.*\\(10, 10\\)"),
    (dict(x=np.zeros((2, 0, 8, 8), np.float32), w=np.zeros((4, 0, 3, 3), np.float32)),
     ValueError, "C_in, H and W >= 1"),
    (dict(w=np.zeros((0, 3, 3, 3), np.float32)), ValueError, "C_out, kh and kw >= 1"),
]


@pytest.mark.parametrize("change, exc, match", FORWARD_ERRORS)
def test_conv2d_bad_input(change, exc, match):
    args = dict(x=X, w=W, b=None, stride=1, padding=0)
    args.update(change)
    with pytest.raises(exc, match=match):
        ops.conv2d(args.pop("x"), args.pop("w"), args.pop("b"), **args)


@pytest.mark.parametrize("change, exc, match", [c for c in FORWARD_ERRORS if "b" not in c[0]] + [
    (dict(dy=DY.astype(np.int32)), TypeError, "dy must be a float32 array"),
    (dict(dy=DY[0]), ValueError, "dy must be 4-D"),
    (dict(dy=np.zeros((2, 4, 7, 6), np.float32)), ValueError,
     "dy must have the output shape \\(N, C_out, H_out, W_out\\) = \\(2, 4, 6, 6\\), "
     "got \\(2, 4, 7, 6\\)"),
    (dict(dy=np.zeros((2, 5, 6, 6), np.float32)), ValueError, "dy must have the output shape"),
    (dict(padding=1), ValueError, "dy must have the output shape .* \\(2, 4, 8, 8\\)"),
])
def test_conv2d_backward_bad_input(change, exc, match):
    args = dict(x=X, w=W, dy=DY, stride=1, padding=0)
    args.update(change)
    with pytest.raises(exc, match=match):
        ops.conv2d_backward(args.pop("x"), args.pop("w"), args.pop("dy"), **args)
