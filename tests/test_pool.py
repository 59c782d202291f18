"""Pooling: max, average (count_include_pad=True) and global average, forward and
backward, against the float64 references in reference.py."""
import numpy as np
import pytest

import minidl
from minidl import _C, ops

from conftest import SIMD_LEVELS
from helpers import assert_close, f32
import reference as ref

# (n, c, h, w, kernel, stride, padding, ceil_mode); kernel/stride/padding as (h, w)
CASES = [
    (1, 1, 1, 1, (1, 1), (1, 1), (0, 0), False),     # 1x1 spatial
    (1, 3, 1, 1, (1, 1), (2, 2), (0, 0), True),
    (2, 3, 8, 8, (2, 2), (2, 2), (0, 0), False),     # the common 2x2/2
    (1, 3, 6, 37, (2, 2), (2, 2), (0, 0), True),     # 2x2/2 wide enough for the vector interior
    (1, 5, 9, 9, (2, 2), (2, 2), (0, 0), True),      # ceil mode adds a row and a column
    (2, 3, 9, 21, (3, 3), (1, 1), (1, 1), False),    # stride 1 with padding
    (2, 3, 11, 37, (3, 3), (2, 2), (1, 1), True),    # ResNet stem-like, ceil
    (1, 2, 10, 40, (3, 3), (3, 3), (1, 1), True),    # stride 3 (gather path); ceil adds one
    (1, 2, 5, 5, (3, 3), (3, 3), (1, 1), True),      # ceil's extra window starts in padding: dropped
    (1, 2, 8, 28, (2, 2), (3, 3), (1, 1), True),     # stride > kernel, dropped window
    (3, 7, 13, 29, (5, 5), (2, 2), (2, 2), True),    # kernel 5, ceil window past H + p
    (1, 9, 15, 40, (7, 7), (1, 1), (3, 3), False),   # kernel 7
    (2, 4, 14, 50, (7, 7), (3, 3), (3, 3), True),
    (1, 3, 7, 33, (2, 3), (1, 2), (1, 1), False),    # rectangular everything
    (2, 2, 12, 45, (3, 5), (2, 3), (0, 2), True),
    (1, 10, 6, 19, (1, 4), (1, 1), (0, 2), False),
    (2, 3, 17, 26, (4, 2), (3, 2), (2, 1), True),
    (1, 1, 3, 64, (3, 1), (1, 1), (1, 0), False),
    (1, 2, 3, 1100, (3, 3), (2, 2), (1, 1), True),   # wider than one column chunk
    (1, 1, 2, 1500, (3, 3), (3, 3), (0, 1), True),   # likewise, stride 3
    (1, 2, 2, 100, (1, 65), (1, 3), (0, 32), False),  # very wide window
    (1, 2, 6, 40, (3, 9), (2, 2), (1, 4), True),      # 9 columns: border masks per tap
    (1, 2, 4, 4, (4, 4), (1, 1), (2, 2), True),      # pad = kernel / 2
    (1, 2, 2, 2, (3, 3), (3, 3), (0, 0), True),      # ceil mode: kernel larger than the input
    (2, 3, 16, 16, (3, 3), (2, 2), (0, 0), True),    # cifar10_quick: interior under 8 columns
    (2, 3, 8, 8, (3, 3), (2, 2), (0, 0), True),
    (1, 1, 3, 2100, (3, 3), (1, 1), (1, 1), False),  # rows too wide for the row buffer
    (1, 1, 3, 2100, (3, 3), (2, 2), (1, 1), True),
    # the average pool's backward for planes up to 16 columns: two vectors, the second
    # partial; three windows over an element
    (2, 3, 12, 13, (3, 3), (1, 1), (1, 1), False),
    # 3x3 / 2 without padding, the backward from the taps by rows: floor mode leaves the
    # last row and column out; 19 even columns (three groups of 8, the last stored masked)
    (1, 3, 16, 16, (3, 3), (2, 2), (0, 0), False),
    (2, 2, 9, 37, (3, 3), (2, 2), (0, 0), True),
    # windows that tile whole rows: planes stacked, 256 of 4x4 to a kernel call, the last
    # stack shorter; a dropped column; a partial column window with padding in w only
    (3, 200, 4, 4, (2, 2), (2, 2), (0, 0), False),
    (3, 200, 4, 5, (2, 2), (2, 2), (0, 0), False),
    (2, 100, 6, 7, (3, 2), (3, 2), (0, 1), True),
    # 2x2 / 2 windows tiling rows of 1 or 2 outputs: 8 outputs per vector, a scalar tail
    (1, 11, 2, 2, (2, 2), (2, 2), (0, 0), False),
    (1, 13, 4, 4, (2, 2), (2, 2), (0, 0), True),
    # rows of a multiple of 8 outputs: 8 outputs of a row to a vector (VGG's pools)
    (2, 3, 6, 32, (2, 2), (2, 2), (0, 0), False),
]


def _case_id(case):
    n, c, h, w, k, s, p, ceil = case
    return f"{n}x{c}x{h}x{w}-k{k[0]}{k[1]}-s{s[0]}{s[1]}-p{p[0]}{p[1]}-{'ceil' if ceil else 'floor'}"


def _distinct(rng, *shape):
    """float32 data without ties: distinct multiples of 1/4 (exact in float32)."""
    size = int(np.prod(shape))
    return ((rng.permutation(size) - size // 2) * 0.25).astype(np.float32).reshape(shape)


def _small_ints(rng, *shape):
    """Integer-valued gradients: sums of a few are exact in float32."""
    return rng.integers(-8, 9, shape).astype(np.float32)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


# ---- output size -----------------------------------------------------------------

# (size, kernel, stride, padding, ceil_mode) -> PyTorch's output size
TORCH_SIZES = [
    ((112, 3, 2, 0, False), 55),
    ((112, 3, 2, 0, True), 56),    # GoogLeNet's stem pooling
    ((112, 3, 2, 1, True), 57),
    ((5, 2, 2, 0, False), 2),
    ((5, 2, 2, 0, True), 3),       # ceil adds a partial window
    ((5, 3, 3, 1, False), 2),
    ((5, 3, 3, 1, True), 2),       # the extra window would start in the right padding
    ((4, 2, 3, 1, True), 2),       # likewise
    ((6, 3, 2, 1, True), 4),
    ((7, 3, 2, 0, True), 3),       # exact fit: ceil changes nothing
    ((2, 3, 3, 0, True), 1),       # ceil mode accepts a kernel larger than the input
    ((1, 1, 1, 0, False), 1),
]


@pytest.mark.parametrize("args,want", TORCH_SIZES)
def test_output_size_matches_pytorch(args, want):
    size, k, s, p, ceil = args
    assert ref.pool_output_size(size, k, s, p, ceil) == want
    assert _C.pool2d_output_size((1, 1, size, 3, k, 1, s, 1, p, 0, int(ceil))) == (want, 3)
    assert _C.pool2d_output_size((1, 1, 3, size, 1, k, 1, s, 0, p, int(ceil))) == (3, want)
    x = np.zeros((1, 1, size, size), np.float32)
    assert ops.max_pool2d(x, k, stride=s, padding=p, ceil_mode=ceil).shape == (1, 1, want, want)
    assert ops.avg_pool2d(x, k, stride=s, padding=p, ceil_mode=ceil).shape == (1, 1, want, want)


def test_output_size_agrees_with_reference_everywhere():
    for size in range(1, 12):
        for k in range(1, 7):
            for s in range(1, 5):
                for p in range(k // 2 + 1):
                    for ceil in (0, 1):
                        want = ref.pool_output_size(size, k, s, p, ceil)
                        shape = (1, 1, size, size, k, k, s, s, p, p, ceil)
                        if want >= 1:
                            assert _C.pool2d_output_size(shape) == (want, want), shape
                        else:
                            with pytest.raises(ValueError, match="output too small"):
                                _C.pool2d_output_size(shape)


@pytest.mark.parametrize("shape,match", [
    ((0, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0), "n must be in"),
    ((1, 0, 4, 4, 2, 2, 2, 2, 0, 0, 0), "c must be in"),
    ((1, 1, 0, 4, 2, 2, 2, 2, 0, 0, 0), "h must be in"),
    ((1, 1, 4, -1, 2, 2, 2, 2, 0, 0, 0), "w must be in"),
    ((1, 1, 4, 4, 0, 2, 2, 2, 0, 0, 0), "kh must be in"),
    ((1, 1, 4, 4, 2, 0, 2, 2, 0, 0, 0), "kw must be in"),
    ((1, 1, 4, 4, 2, 2, 0, 2, 0, 0, 0), "stride_h must be in"),
    ((1, 1, 4, 4, 2, 2, 2, -3, 0, 0, 0), "stride_w must be in"),
    ((1, 1, 4, 4, 2, 2, 2, 2, 2, 0, 0), r"pad_h must be in \[0, kh / 2\] = \[0, 1\].*got 2"),
    ((1, 1, 4, 4, 3, 3, 2, 2, 0, -1, 0), "pad_w must be in"),
    ((1, 1, 2, 4, 3, 2, 1, 2, 0, 0, 0), "output too small: h_out"),
    ((1, 1, 4, 2, 2, 5, 1, 1, 0, 0, 0), "output too small: w_out"),
])
def test_c_core_checks_shape(shape, match):
    with pytest.raises(ValueError, match=match):
        _C.pool2d_output_size(shape)
    x = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match=match):
        _C.max_pool2d_forward(shape, x, x.copy())
    with pytest.raises(ValueError, match=match):
        _C.avg_pool2d_backward(shape, x, x.copy())


def test_c_core_checks_pointers():
    shape = (1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0)
    x = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="must not be NULL"):
        _C.max_pool2d_forward(shape, None, x)
    with pytest.raises(ValueError, match="must not be NULL"):
        _C.max_pool2d_backward(shape, x, x, None)
    with pytest.raises(ValueError, match="must not be NULL"):
        _C.global_avg_pool2d_forward(1, 1, 4, 4, x, None)
    with pytest.raises(ValueError, match="h must be >= 1"):
        _C.global_avg_pool2d_backward(1, 1, 0, 4, x, x)


# ---- max pooling ------------------------------------------------------------------


def _kw(case):
    n, c, h, w, k, s, p, ceil = case
    return dict(stride=s, padding=p, ceil_mode=ceil)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_max_pool(simd, rng, case):
    n, c, h, w, k, s, p, ceil = case
    x = _distinct(rng, n, c, h, w)
    y = ops.max_pool2d(x, k, **_kw(case))
    np.testing.assert_array_equal(y, ref.max_pool2d(x, k, s, p, ceil))
    dy = _small_ints(rng, *y.shape)
    dx = ops.max_pool2d_backward(x, dy, k, **_kw(case))
    np.testing.assert_array_equal(dx, ref.max_pool2d_backward(x, dy, k, s, p, ceil))


@pytest.mark.parametrize("case", [CASES[5], CASES[11]], ids=_case_id)
def test_max_pool_threads(simd, threads, rng, case):
    n, c, h, w, k, s, p, ceil = case
    x = _distinct(rng, 8, 12, h, w)
    y = ops.max_pool2d(x, k, **_kw(case))
    np.testing.assert_array_equal(y, ref.max_pool2d(x, k, s, p, ceil))
    dy = _small_ints(rng, *y.shape)
    np.testing.assert_array_equal(ops.max_pool2d_backward(x, dy, k, **_kw(case)),
                                  ref.max_pool2d_backward(x, dy, k, s, p, ceil))
    _check_taps(x, dy, case)


def _check_taps(x, dy, case):
    """max_pool2d_argmax's maxima and taps, and the backward from the taps, against the
    reference, exactly."""
    n, c, h, w, k, s, p, ceil = case
    y, tap = ops.max_pool2d_argmax(x, k, **_kw(case))
    assert tap.dtype == np.uint8 and tap.shape == y.shape
    np.testing.assert_array_equal(y, ref.max_pool2d(x, k, s, p, ceil))
    np.testing.assert_array_equal(tap, ref.max_pool2d_taps(x, k, s, p, ceil))
    np.testing.assert_array_equal(ops.max_pool2d_backward_argmax(tap, dy, x.shape, k, **_kw(case)),
                                  ref.max_pool2d_backward(x, dy, k, s, p, ceil))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_max_pool_taps(simd, rng, case):
    n, c, h, w, k, s, p, ceil = case
    x = _distinct(rng, n, c, h, w)
    _check_taps(x, _small_ints(rng, *ops.max_pool2d(x, k, **_kw(case)).shape), case)


@pytest.mark.parametrize("case", [CASES[6], CASES[-5], CASES[-1]], ids=_case_id)
def test_max_pool_taps_through_a_map(simd, rng, case):
    """With a map (BatchNorm's scale and shift, then ReLU) the maxima and taps of the
    mapped input, and its gradient, as the recomputing fused kernels give them (planes
    stacked: each read through its own channel's map)."""
    n, c, h, w, k, s, p, ceil = case
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    m = dict(x_scale=rng.standard_normal(c).astype(np.float32),
             x_shift=rng.standard_normal(c).astype(np.float32), x_relu=True)
    y, tap = ops.max_pool2d_argmax(x, k, **_kw(case), **m)
    a = np.maximum(x * m["x_scale"][:, None, None].astype(np.float64) +
                   m["x_shift"][:, None, None], 0)
    np.testing.assert_allclose(y, ref.max_pool2d(a, k, s, p, ceil), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y, ops.max_pool2d(x, k, **_kw(case), **m))
    dy = _small_ints(rng, *y.shape)
    np.testing.assert_array_equal(ops.max_pool2d_backward_argmax(tap, dy, x.shape, k, **_kw(case)),
                                  ops.max_pool2d_backward(x, dy, k, **_kw(case), **m))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_max_pool_taps_with_relu(simd, rng, case):
    """relu=True: the values of relu(max_pool2d(x)) and the taps of max_pool2d_argmax
    except NO_TAP where the output is not above 0 (0, -0, NaN); the backward from those
    taps is max_pool2d_backward of relu_backward's dy, bit for bit (a window of
    negatives, of zeros and one with a NaN included)."""
    n, c, h, w, k, s, p, ceil = case
    x = _distinct(rng, n, c, h, w)
    x -= np.float32(np.quantile(x, 0.8))  # many windows' maxima below 0
    x[:, 0] = -np.abs(x[:, 0])            # every window of channel 0 at or below 0
    x.reshape(-1)[::7] = np.float32(-0.0)
    if x.size > 4:
        x.reshape(-1)[3] = np.nan
    y, tap = ops.max_pool2d_argmax(x, k, **_kw(case), relu=True)
    pooled, want_tap = ops.max_pool2d_argmax(x, k, **_kw(case))
    np.testing.assert_array_equal(y, ops.relu(pooled))
    np.testing.assert_array_equal(tap, np.where(y > 0, want_tap, ops.NO_TAP))
    assert (tap[:, 0] == ops.NO_TAP).all()
    dy = _small_ints(rng, *y.shape)
    np.testing.assert_array_equal(
        ops.max_pool2d_backward_argmax(tap, dy, x.shape, k, **_kw(case)),
        ops.max_pool2d_backward(x, ops.relu_backward(y, dy), k, **_kw(case)))


def test_max_pool_taps_with_relu_through_a_map(simd, rng):
    """A map and a ReLU after the pool: relu(max_pool2d of the mapped input)."""
    case = CASES[6]
    n, c, h, w, k, s, p, ceil = case
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    m = dict(x_scale=rng.standard_normal(c).astype(np.float32),
             x_shift=rng.standard_normal(c).astype(np.float32) - 1, x_relu=False)
    y, tap = ops.max_pool2d_argmax(x, k, **_kw(case), **m, relu=True)
    np.testing.assert_array_equal(y, ops.relu(ops.max_pool2d(x, k, **_kw(case), **m)))
    assert (tap == ops.NO_TAP).any() and (tap != ops.NO_TAP).any()
    dy = _small_ints(rng, *y.shape)
    np.testing.assert_array_equal(
        ops.max_pool2d_backward_argmax(tap, dy, x.shape, k, **_kw(case)),
        ops.max_pool2d_backward(x, ops.relu_backward(y, dy), k, **_kw(case), **m))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_avg_pool_backward_with_relu(simd, rng, case):
    """relu=True: relu_backward(x, avg_pool2d_backward(...)) in one pass, bit for bit, with
    x the ReLU's output (zeros, -0 and a NaN among its values)."""
    n, c, h, w, k, s, p, ceil = case
    x = np.maximum(rng.standard_normal((n, c, h, w)).astype(np.float32), 0)
    x.reshape(-1)[::5] = np.float32(-0.0)
    x.reshape(-1)[-1] = np.nan
    dy = rng.standard_normal(ops.avg_pool2d(x, k, **_kw(case)).shape).astype(np.float32)
    dx = ops.avg_pool2d_backward(x, dy, k, **_kw(case), relu=True)
    np.testing.assert_array_equal(
        dx, ops.relu_backward(x, ops.avg_pool2d_backward(x.shape, dy, k, **_kw(case))))
    with pytest.raises(TypeError, match="needs x itself"):
        ops.avg_pool2d_backward(x.shape, dy, k, **_kw(case), relu=True)


def test_max_pool_taps_bad_input(rng):
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float32)
    with pytest.raises(ValueError, match="more than 256 taps"):
        ops.max_pool2d_argmax(np.zeros((1, 1, 20, 20), np.float32), 17, stride=1)
    with pytest.raises(ValueError, match="more than 255 taps"):  # all 256 taps are positions
        ops.max_pool2d_argmax(np.zeros((1, 1, 20, 20), np.float32), 16, stride=1, relu=True)
    with pytest.raises(ValueError, match="leaves no tap free"):
        _C.max_pool2d_forward_argmax((1, 1, 16, 16, 16, 16, 1, 1, 0, 0, 0),
                                     np.zeros(256, np.float32), None, None, False,
                                     np.zeros(1, np.float32), np.zeros(1, np.uint8), True)
    # a window of 256 elements has no NO_TAP: 255 is its last position
    x16 = np.arange(256, dtype=np.float32).reshape(1, 1, 16, 16)
    y, tap = ops.max_pool2d_argmax(x16, 16)
    assert tap[0, 0, 0, 0] == 255
    np.testing.assert_array_equal(ops.max_pool2d_backward_argmax(tap, np.ones_like(y), x16.shape,
                                                                 16),
                                  ops.max_pool2d_backward(x16, np.ones_like(y), 16))
    y, tap = ops.max_pool2d_argmax(x, 3, stride=2)
    dy = np.ones_like(y)
    with pytest.raises(ValueError, match="tap must be uint8 of shape"):
        ops.max_pool2d_backward_argmax(tap.astype(np.int32), dy, x.shape, 3, stride=2)
    with pytest.raises(ValueError, match="tap must be uint8 of shape"):
        ops.max_pool2d_backward_argmax(tap[:, :1], dy, x.shape, 3, stride=2)
    with pytest.raises(ValueError, match="dy must have the output shape"):
        ops.max_pool2d_backward_argmax(tap, dy[:, :1], x.shape, 3, stride=2)
    bad = tap.copy()
    bad[0, 1, 2, 3] = 9  # past a 3x3 window
    with pytest.raises(ValueError, match="outside its window"):
        ops.max_pool2d_backward_argmax(bad, dy, x.shape, 3, stride=2)
    # inside the window but past the input: ceil mode's last window (3x3 / 2 rows, by rows)
    y, tap = ops.max_pool2d_argmax(x[:, :, :8, :8], 3, stride=2, ceil_mode=True)
    for at, t in (((0, 1, 3, 3), 2), ((0, 1, 3, 0), 6)):  # past the last column, the last row
        bad = tap.copy()
        bad[at] = t
        with pytest.raises(ValueError, match="outside its window"):
            ops.max_pool2d_backward_argmax(bad, np.ones_like(y), (1, 2, 8, 8), 3, stride=2,
                                           ceil_mode=True)
    # inside the window but in its padding: tap 0 of the first window with padding 1
    y, tap = ops.max_pool2d_argmax(x, 3, stride=2, padding=1)
    tap[0, 0, 0, 0] = 0
    with pytest.raises(ValueError, match="outside its window"):
        ops.max_pool2d_backward_argmax(tap, np.ones_like(y), x.shape, 3, stride=2, padding=1)
    shape = (1, 1, 20, 20, 17, 17, 1, 1, 0, 0, 0)
    big = np.zeros(400, np.float32)
    with pytest.raises(ValueError, match="does not fit a byte"):
        _C.max_pool2d_forward_argmax(shape, big, None, None, False, big[:16],
                                     np.zeros(16, np.uint8))
    with pytest.raises(ValueError, match="does not fit a byte"):
        _C.max_pool2d_backward_argmax(shape, np.zeros(16, np.uint8), big[:16], big)
    shape = (1, 2, 9, 9, 3, 3, 2, 2, 0, 0, 0)
    with pytest.raises(ValueError, match="tap must not be NULL"):
        _C.max_pool2d_forward_argmax(shape, x.reshape(-1), None, None, False,
                                     y.reshape(-1), None)
    with pytest.raises(ValueError, match="must not be NULL"):
        _C.max_pool2d_backward_argmax(shape, None, dy.reshape(-1), x.reshape(-1))


def test_max_pool_ties_first_wins(simd):
    x = np.zeros((1, 1, 4, 4), np.float32)
    dy = np.arange(1, 5, dtype=np.float32).reshape(1, 1, 2, 2)
    dx = ops.max_pool2d_backward(x, dy, 2)
    want = np.zeros((4, 4), np.float32)
    want[0, 0], want[0, 2], want[2, 0], want[2, 2] = 1, 2, 3, 4
    np.testing.assert_array_equal(dx[0, 0], want)
    # with padding the first in-bounds element wins (padding never does)
    dx = ops.max_pool2d_backward(x, np.ones((1, 1, 3, 3), np.float32), 3, stride=2, padding=1,
                                 ceil_mode=True)
    want = np.zeros((4, 4), np.float32)
    want[0, 0] = want[0, 1] = want[0, 3] = 1
    want[1, 0] = want[1, 1] = want[1, 3] = 1
    want[3, 0] = want[3, 1] = want[3, 3] = 1
    np.testing.assert_array_equal(dx[0, 0], want)


@pytest.mark.parametrize("case", [CASES[4], CASES[6], CASES[9], CASES[13]], ids=_case_id)
def test_max_pool_many_ties(simd, rng, case):
    """Data from {-1, 0, 1}, -0.0 among the zeros: ties everywhere, also in the
    vectorised interior; the argmax must be the reference's first one."""
    n, c, h, w, k, s, p, ceil = case
    x = rng.integers(-1, 2, (n, c, h, w)).astype(np.float32)
    x[rng.random(x.shape) < 0.3] = -0.0
    y = ops.max_pool2d(x, k, **_kw(case))
    np.testing.assert_array_equal(y, ref.max_pool2d(x, k, s, p, ceil))
    dy = _small_ints(rng, *y.shape)
    np.testing.assert_array_equal(ops.max_pool2d_backward(x, dy, k, **_kw(case)),
                                  ref.max_pool2d_backward(x, dy, k, s, p, ceil))
    _check_taps(x, dy, case)


@pytest.mark.parametrize("case", [CASES[4], CASES[6], CASES[11], CASES[13]], ids=_case_id)
def test_max_pool_nan_and_inf(simd, rng, case):
    n, c, h, w, k, s, p, ceil = case
    x = _distinct(rng, n, c, h, w)
    x[rng.random(x.shape) < 0.03] = np.nan
    x[rng.random(x.shape) < 0.03] = np.inf
    x[:, :, : h // 2, : w // 2] = -np.inf                 # windows of only -inf
    y = ops.max_pool2d(x, k, **_kw(case))
    want = ref.max_pool2d(x, k, s, p, ceil)
    assert np.isnan(y).any() and np.isinf(y).any()
    np.testing.assert_array_equal(y, want)               # NaN where the window has one
    dy = _small_ints(rng, *y.shape)
    dx = ops.max_pool2d_backward(x, dy, k, **_kw(case))  # gradient to the last NaN
    np.testing.assert_array_equal(dx, ref.max_pool2d_backward(x, dy, k, s, p, ceil))
    _check_taps(x, dy, case)


def test_max_pool_padding_never_wins(simd, rng):
    x = -1.0 - rng.random((2, 3, 9, 30)).astype(np.float32)
    y = ops.max_pool2d(x, 3, stride=1, padding=1)
    assert (y < -1.0).all()
    np.testing.assert_array_equal(y, ref.max_pool2d(x, (3, 3), (1, 1), (1, 1)))


@pytest.mark.skipif(minidl.cpu_simd() == "scalar", reason="needs AVX2")
@pytest.mark.parametrize("nan", [True, False], ids=["nan", "no-nan"])
@pytest.mark.parametrize("case", CASES[2:], ids=_case_id)
def test_max_pool_simd_levels_bit_identical(rng, case, nan):
    """Every SIMD level gives the reference's bits, with ties (-0.0 among them) and,
    with or without NaNs (the AVX-512 kernel hands a plane with one to the AVX2 one)."""
    n, c, h, w, k, s, p, ceil = case
    x = f32(rng, n, c, h, w)
    if nan:
        x[rng.random(x.shape) < 0.02] = np.nan
    x[rng.random(x.shape) < 0.2] = 0.5                    # ties
    x[rng.random(x.shape) < 0.05] = -0.0
    x[rng.random(x.shape) < 0.05] = 0.0
    dy = None
    out = []
    try:
        for level in SIMD_LEVELS:
            minidl.set_simd(level)
            y = ops.max_pool2d(x, k, **_kw(case))
            if dy is None:
                dy = f32(rng, *y.shape)
            out.append((y, ops.max_pool2d_backward(x, dy, k, **_kw(case))))
    finally:
        minidl.set_simd(minidl.cpu_simd())
    y0, dx0 = out[0]
    for y1, dx1 in out[1:]:
        np.testing.assert_array_equal(_bits(y0), _bits(y1))
        np.testing.assert_array_equal(_bits(dx0), _bits(dx1))


# ---- average pooling --------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_avg_pool(simd, rng, case):
    n, c, h, w, k, s, p, ceil = case
    x = f32(rng, n, c, h, w)
    y = ops.avg_pool2d(x, k, **_kw(case))
    assert_close(y, ref.avg_pool2d(x, k, s, p, ceil), "reduction", "avg_pool2d")
    dy = f32(rng, *y.shape)
    dx = ops.avg_pool2d_backward(x, dy, k, **_kw(case))
    assert_close(dx, ref.avg_pool2d_backward(x.shape, dy, k, s, p, ceil), "reduction",
                 "avg_pool2d_backward")
    # the backward is the adjoint of the forward: <avg(x), dy> == <x, avg_backward(dy)>
    lhs = np.dot(ref.avg_pool2d(x, k, s, p, ceil).ravel(), dy.astype(np.float64).ravel())
    rhs = np.dot(x.astype(np.float64).ravel(), dx.astype(np.float64).ravel())
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, np.abs(x).sum())


@pytest.mark.parametrize("case", [CASES[5], CASES[11]], ids=_case_id)
def test_avg_pool_threads(simd, threads, rng, case):
    n, c, h, w, k, s, p, ceil = case
    x = f32(rng, 8, 12, h, w)
    y = ops.avg_pool2d(x, k, **_kw(case))
    assert_close(y, ref.avg_pool2d(x, k, s, p, ceil), "reduction")
    dy = f32(rng, *y.shape)
    assert_close(ops.avg_pool2d_backward(x, dy, k, **_kw(case)),
                 ref.avg_pool2d_backward(x.shape, dy, k, s, p, ceil), "reduction")


def test_avg_pool_divisor_like_pytorch(simd):
    """count_include_pad=True: padding counts, but a ceil-mode window running past
    the padded input divides only by its part inside it."""
    x = np.ones((1, 1, 1, 6), np.float32)
    y = ops.avg_pool2d(x, (1, 3), stride=(1, 2), padding=(0, 1), ceil_mode=True)
    np.testing.assert_allclose(y[0, 0, 0], [2 / 3, 1, 1, 1 / 2], rtol=1e-6)
    x = np.ones((1, 1, 5, 5), np.float32)
    y = ops.avg_pool2d(x, 2, ceil_mode=True)
    np.testing.assert_allclose(y[0, 0], np.ones((3, 3)), rtol=1e-6)
    dx = ops.avg_pool2d_backward(x, np.ones((1, 1, 3, 3), np.float32), 2, ceil_mode=True)
    want = np.full((5, 5), 0.25)
    want[4, :4] = want[:4, 4] = 0.5
    want[4, 4] = 1.0
    np.testing.assert_allclose(dx[0, 0], want, rtol=1e-6)


# ---- global average pooling -------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 7), (3, 10, 5, 9), (1, 13, 1, 37),
                                   (4, 64, 16, 17), (1, 3, 56, 57)])
def test_global_avg_pool(simd, threads, rng, shape):
    x = f32(rng, *shape) + 0.5
    y = ops.global_avg_pool2d(x)
    assert y.shape == shape[:2]
    assert_close(y, ref.global_avg_pool2d(x), "reduction", "global_avg_pool2d")
    dy = f32(rng, *shape[:2])
    assert_close(ops.global_avg_pool2d_backward(x, dy), ref.global_avg_pool2d_backward(shape, dy),
                 "elementwise", "global_avg_pool2d_backward")


def test_empty_batch_and_channels():
    x = np.zeros((0, 3, 8, 8), np.float32)
    assert ops.max_pool2d(x, 2).shape == (0, 3, 4, 4)
    assert ops.avg_pool2d_backward(x, np.zeros((0, 3, 4, 4), np.float32), 2).shape == x.shape
    assert ops.global_avg_pool2d(np.zeros((2, 0, 3, 3), np.float32)).shape == (2, 0)


# ---- bad input --------------------------------------------------------------------

X = np.zeros((2, 3, 8, 8), np.float32)
DY = np.zeros((2, 3, 4, 4), np.float32)
WINDOW_OPS = [
    ("max_pool2d", lambda x, **kw: ops.max_pool2d(x, kw.pop("k", 2), **kw)),
    ("max_pool2d_backward",
     lambda x, **kw: ops.max_pool2d_backward(x, kw.pop("dy", DY), kw.pop("k", 2), **kw)),
    ("avg_pool2d", lambda x, **kw: ops.avg_pool2d(x, kw.pop("k", 2), **kw)),
    ("avg_pool2d_backward",
     lambda x, **kw: ops.avg_pool2d_backward(x, kw.pop("dy", DY), kw.pop("k", 2), **kw)),
]


@pytest.mark.parametrize("name,op", WINDOW_OPS, ids=[n for n, _ in WINDOW_OPS])
@pytest.mark.parametrize("x,kw,exc,match", [
    (X.astype(np.int32), {}, TypeError, "x must be a float32 array"),
    (X.tolist(), {}, TypeError, "x must be a numpy.ndarray"),
    (X[0], {}, ValueError, r"x must be 4-D \(N, C, H, W\)"),
    (X, {"k": 0}, ValueError, "kernel_size must be >= 1, got 0"),
    (X, {"k": (2, 2, 2)}, ValueError, "kernel_size must be an int or an"),
    (X, {"k": 2.0}, TypeError, "kernel_size must be an int"),
    (X, {"stride": 0}, ValueError, "stride must be >= 1, got 0"),
    (X, {"stride": (2, -1)}, ValueError, "stride must be >= 1, got -1"),
    (X, {"padding": -1}, ValueError, "padding must be >= 0, got -1"),
    (X, {"padding": (0, 2)}, ValueError, r"padding must be at most half of kernel_size.*\(0, 2\)"),
    (X, {"k": 11, "padding": 1}, ValueError, "output too small: h_out = 0 for h = 8, kh = 11"),
    (X[:, :, :, :1], {"k": (1, 2), "stride": 1}, ValueError, "output too small: w_out = 0 for w = 1, kw = 2"),
    (X[:, :, :0], {}, ValueError, "H >= 1 and W >= 1"),
    (X, {"ceil_mode": "yes"}, TypeError, "ceil_mode must be a bool"),
])
def test_window_ops_bad_input(name, op, x, kw, exc, match):
    with pytest.raises(exc, match=match):
        op(x, **dict(kw))


@pytest.mark.parametrize("name,op", WINDOW_OPS[1::2], ids=[n for n, _ in WINDOW_OPS[1::2]])
@pytest.mark.parametrize("dy,exc,match", [
    (DY[:, :, :3], ValueError, r"dy must have the output shape \(2, 3, 4, 4\)"),
    (DY[0], ValueError, "dy must be 4-D"),
    (DY.astype(np.int64), TypeError, "dy must be a float32 array"),
    (None, TypeError, "dy must be a numpy.ndarray"),
])
def test_window_backward_bad_dy(name, op, dy, exc, match):
    with pytest.raises(exc, match=match):
        op(X, dy=dy)


def test_global_avg_pool_bad_input():
    with pytest.raises(TypeError, match="x must be a float32 array"):
        ops.global_avg_pool2d(X.astype(np.int32))
    with pytest.raises(ValueError, match=r"x must be 4-D \(N, C, H, W\)"):
        ops.global_avg_pool2d(X[0])
    with pytest.raises(ValueError, match="H >= 1 and W >= 1"):
        ops.global_avg_pool2d(X[:, :, :, :0])
    with pytest.raises(ValueError, match=r"dy must have shape \(N, C\) = \(2, 3\)"):
        ops.global_avg_pool2d_backward(X, np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"dy must be 2-D \(N, C\)"):
        ops.global_avg_pool2d_backward(X, np.zeros((2, 3, 1, 1), np.float32))
    with pytest.raises(TypeError, match="dy must be a float32 array"):
        ops.global_avg_pool2d_backward(X, np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="x must be 4-D"):
        ops.global_avg_pool2d_backward(X[0], np.zeros((2, 3), np.float32))
