"""ops.linear / ops.linear_backward against the float64 reference."""
import numpy as np
import pytest

from minidl import _C, ops

from helpers import assert_close, f32
import reference as ref

# (leading shape of x, in, out)
SHAPES = [((1,), 1, 1), ((2,), 7, 15), ((17,), 33, 16), ((100,), 17, 33), ((5,), 321, 10),
          ((3, 4), 16, 7), ((), 9, 5), ((64,), 200, 100)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead,n_in,n_out", SHAPES)
def test_linear_forward(simd, threads, rng, lead, n_in, n_out, bias):
    x, w = f32(rng, *lead, n_in), f32(rng, n_out, n_in)
    b = f32(rng, n_out) if bias else None
    y = ops.linear(x, w, b)
    assert y.shape == lead + (n_out,) and y.dtype == np.float32
    assert_close(y, ref.linear(x, w, b), "gemm")


@pytest.mark.parametrize("lead,n_in,n_out", SHAPES)
def test_linear_backward(simd, threads, rng, lead, n_in, n_out):
    x, w, dy = f32(rng, *lead, n_in), f32(rng, n_out, n_in), f32(rng, *lead, n_out)
    dx, dw, db = ops.linear_backward(x, w, dy)
    want_dx, want_dw, want_db = ref.linear_backward(x, w, dy)
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (n_out,)
    assert_close(dx, want_dx, "gemm", "dx")
    assert_close(dw, want_dw, "gemm", "dw")
    assert_close(db, want_db, "reduction", "db")


def test_linear_empty_input_features(simd, rng):
    """in = 0: y is the bias alone, dw is empty, db still sums dy."""
    x, w, b = np.empty((4, 0), np.float32), np.empty((3, 0), np.float32), f32(rng, 3)
    np.testing.assert_array_equal(ops.linear(x, w, b), np.tile(b, (4, 1)))
    dy = f32(rng, 4, 3)
    dx, dw, db = ops.linear_backward(x, w, dy)
    assert dx.shape == (4, 0) and dw.shape == (3, 0)
    assert_close(db, dy.astype(np.float64).sum(0), "reduction")


def test_linear_empty_batch(simd, rng):
    x, w, dy = np.empty((0, 6), np.float32), f32(rng, 3, 6), np.empty((0, 3), np.float32)
    assert ops.linear(x, w).shape == (0, 3)
    dx, dw, db = ops.linear_backward(x, w, dy)
    assert dx.shape == (0, 6)
    np.testing.assert_array_equal(dw, 0)
    np.testing.assert_array_equal(db, 0)


@pytest.mark.parametrize("accumulate", [False, True])
def test_linear_backward_weights_accumulate(simd, threads, rng, accumulate):
    n, n_in, n_out = 37, 29, 19
    x, dy = f32(rng, n, n_in), f32(rng, n, n_out)
    dw0, db0 = f32(rng, n_out, n_in), f32(rng, n_out)
    dw, db = dw0.copy(), db0.copy()
    _C.linear_backward_weights(n, n_in, n_out, x.reshape(-1), dy.reshape(-1), dw.reshape(-1),
                               db, accumulate)
    _, want_dw, want_db = ref.linear_backward(x, np.zeros((n_out, n_in)), dy)
    if accumulate:
        want_dw, want_db = want_dw + dw0, want_db + db0
    assert_close(dw, want_dw, "gemm", "dw")
    assert_close(db, want_db, "reduction", "db")
    # db may be NULL: dw alone
    dw2 = np.full((n_out, n_in), np.nan, np.float32)
    _C.linear_backward_weights(n, n_in, n_out, x.reshape(-1), dy.reshape(-1), dw2.reshape(-1),
                               None, False)
    assert_close(dw2, ref.linear_backward(x, np.zeros((n_out, n_in)), dy)[1], "gemm")


def test_linear_workspace_contract(rng):
    n, n_in, n_out = 8, 30, 12
    x, w = f32(rng, n, n_in), f32(rng, n_out, n_in)
    size = _C.linear_workspace_size(n, n_in, n_out)
    assert size >= max(_C.sgemm_workspace_size(n, n_out, n_in),
                       _C.sgemm_workspace_size(n, n_in, n_out),
                       _C.sgemm_workspace_size(n_out, n_in, n))
    y = np.empty((n, n_out), np.float32)
    _C.linear_forward(n, n_in, n_out, x.reshape(-1), w.reshape(-1), None, y.reshape(-1),
                      np.empty(size // 4, np.float32))
    assert_close(y, ref.linear(x, w), "gemm")
    with pytest.raises(ValueError, match="mdl_linear_forward: workspace"):
        _C.linear_forward(n, n_in, n_out, x.reshape(-1), w.reshape(-1), None, y.reshape(-1),
                          np.empty(size // 4 - 1, np.float32))


def test_linear_c_argument_checks():
    one = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="mdl_linear_forward: n must be >= 0"):
        _C.linear_forward(-1, 2, 2, one, one, None, one)
    with pytest.raises(ValueError, match="mdl_linear_backward_data: w must not be NULL"):
        _C.linear_backward_data(2, 2, 2, one, None, one)
    with pytest.raises(ValueError, match="mdl_linear_backward_weights: dy must not be NULL"):
        _C.linear_backward_weights(2, 2, 2, one, None, one, None)


# ---- bad input ---------------------------------------------------------------------

X = np.ones((4, 3), np.float32)
W = np.ones((5, 3), np.float32)


@pytest.mark.parametrize("args,exc,match", [
    ((X.astype(np.int32), W), TypeError, "x must be a float32 array"),
    ((X, W.astype(np.int64)), TypeError, "w must be a float32 array"),
    ((X.tolist(), W), TypeError, "x must be a numpy.ndarray"),
    ((X, W.tolist()), TypeError, "w must be a numpy.ndarray"),
    ((X, W, [1.0] * 5), TypeError, "b must be a numpy.ndarray"),
    ((X, W, np.ones(5, np.int32)), TypeError, "b must be a float32 array"),
    ((np.ones((), np.float32), W), ValueError, "x must have at least 1 dimension"),
    ((X, np.ones(3, np.float32)), ValueError, "w must be 2-D"),
    ((X, np.ones((3, 5), np.float32)), ValueError, "last dimension in = 5"),
    ((X, W, np.ones(4, np.float32)), ValueError, r"b must have shape \(5,\)"),
    ((X, W, np.ones((1, 5), np.float32)), ValueError, "b must be 1-D"),
])
def test_linear_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        ops.linear(*args)


@pytest.mark.parametrize("args,exc,match", [
    ((X, W, np.ones((4, 5), np.int32)), TypeError, "dy must be a float32 array"),
    ((X, W, np.ones((4, 5), np.float32).tolist()), TypeError, "dy must be a numpy.ndarray"),
    ((X, W, np.ones((4, 3), np.float32)), ValueError, r"dy must have shape \(4, 5\)"),
    ((X, W, np.ones((5,), np.float32)), ValueError, r"dy must have shape \(4, 5\)"),
    ((X, np.ones((5, 4), np.float32), np.ones((4, 5), np.float32)), ValueError, "last dimension"),
    ((X.astype(np.complex64), W, np.ones((4, 5), np.float32)), TypeError, "x must be a float32"),
])
def test_linear_backward_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        ops.linear_backward(*args)
