"""BatchNorm: ops.batch_norm / batch_norm_backward and the C kernels behind them,
against the float64 references in reference.py, on both kernel versions."""
import numpy as np
import pytest

import minidl
from minidl import _C, ops

from helpers import TOL, assert_close, f32
import reference as ref

# (N, C, H, W) and (N, C): batch 1 with hw > 1, 1x1 spatial with n > 1, odd sizes,
# channels not a multiple of 8, 2-D input (hw == 1: the AVX2 kernels sweep 16, then 8
# channels at once, the rest go to the scalar tail), and sizes large enough for 2 threads.
SHAPES = [
    (2, 3, 5, 7), (1, 5, 4, 6), (7, 9, 1, 1), (3, 17, 3, 3), (4, 13, 11, 5), (1, 2, 1, 2),
    (2, 16, 9, 9), (5, 8), (16, 33), (2, 24), (3, 1, 40, 41),
    (4, 12, 24, 24), (3000, 21), (2, 3, 17), (40, 29), (1000, 45),
]


def _params(rng, c):
    gamma = f32(rng, c) + np.float32(1)
    beta = f32(rng, c)
    rm = f32(rng, c)
    rv = (rng.random(c) + 0.5).astype(np.float32)
    return gamma, beta, rm, rv


def _data(rng, shape):
    """Per-channel offsets and scales, so each channel has its own statistics."""
    c = shape[1]
    pshape = (1, c) + (1,) * (len(shape) - 2)
    off = rng.standard_normal(c).reshape(pshape) * 3
    scale = (rng.random(c) * 2 + 0.1).reshape(pshape)
    return (rng.standard_normal(shape) * scale + off).astype(np.float32)


# ---- training forward ---------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_train_forward(simd, threads, rng, shape):
    x = _data(rng, shape)
    gamma, beta, rm, rv = _params(rng, shape[1])
    rm0, rv0 = rm.copy(), rv.copy()
    y, mean, invstd = ops.batch_norm(x, gamma, beta, running_mean=rm, running_var=rv,
                                     momentum=0.3, eps=1e-3)
    y_r, mean_r, invstd_r, rm_r, rv_r = ref.batch_norm_train(x, gamma, beta, 1e-3, rm0, rv0, 0.3)
    assert y.shape == x.shape and y.dtype == np.float32
    assert_close(y, y_r, "batch_norm", "y")
    assert_close(mean, mean_r, "batch_norm", "mean")
    assert_close(invstd, invstd_r, "batch_norm", "invstd")
    assert_close(rm, rm_r, "batch_norm", "running_mean")
    assert_close(rv, rv_r, "batch_norm", "running_var (unbiased)")


def test_running_var_is_unbiased(simd):
    """momentum 1 puts the batch statistics themselves in the running buffers."""
    x = np.array([[1.0], [3.0]], np.float32)  # (N=2, C=1): mean 2, biased var 1, unbiased 2
    rm, rv = np.zeros(1, np.float32), np.zeros(1, np.float32)
    y, mean, invstd = ops.batch_norm(x, None, None, running_mean=rm, running_var=rv,
                                     momentum=1.0, eps=0.0)
    np.testing.assert_allclose(mean, [2.0])
    np.testing.assert_allclose(invstd, [1.0])
    np.testing.assert_allclose(y, [[-1.0], [1.0]])
    np.testing.assert_allclose(rm, [2.0])
    np.testing.assert_allclose(rv, [2.0])


@pytest.mark.parametrize("momentum", [0.0, 0.1, 1.0])
def test_running_momentum(simd, rng, momentum):
    x = _data(rng, (4, 10, 3, 3))
    gamma, beta, rm, rv = _params(rng, 10)
    rm0, rv0 = rm.copy(), rv.copy()
    ops.batch_norm(x, gamma, beta, running_mean=rm, running_var=rv, momentum=momentum)
    _, _, _, rm_r, rv_r = ref.batch_norm_train(x, gamma, beta, 1e-5, rm0, rv0, momentum)
    assert_close(rm, rm_r, "batch_norm", "running_mean")
    assert_close(rv, rv_r, "batch_norm", "running_var")
    if momentum == 0.0:
        np.testing.assert_array_equal(rm, rm0)
        np.testing.assert_array_equal(rv, rv0)


@pytest.mark.parametrize("shape,offset", [((8, 4, 32, 32), 100.0), ((4, 1, 512, 512), 100.0),
                                          ((50000, 3), 100.0), ((1, 2, 3, 5), 100.0),
                                          ((4, 3, 20, 20), 1000.0), ((500, 11), -1000.0)])
def test_train_large_offset(simd, rng, shape, offset):
    """|mean| >> std (mean 100 or 1000, std 0.1): the statistics must not lose the
    variance, up to a million values per channel, and y must not inherit the rounding
    of the mean to float32 (at mean 1000 that alone is ~3e-4 of the std)."""
    x = (rng.standard_normal(shape) * 0.1 + offset).astype(np.float32)
    c = shape[1]
    gamma, beta = np.ones(c, np.float32), np.zeros(c, np.float32)
    rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)
    y, mean, invstd = ops.batch_norm(x, gamma, beta, running_mean=rm, running_var=rv)
    y_r, mean_r, invstd_r, rm_r, rv_r = ref.batch_norm_train(x, gamma, beta, 1e-5,
                                                             np.zeros(c), np.ones(c), 0.1)
    assert_close(y, y_r, "batch_norm", "y")
    assert_close(mean, mean_r, "batch_norm", "mean")
    assert_close(invstd, invstd_r, "batch_norm", "invstd")
    assert_close(rv, rv_r, "batch_norm", "running_var")


@pytest.mark.parametrize("shape", [(64, 3, 16, 16), (128, 2, 8, 8), (200, 24), (9, 5, 7, 3)])
def test_train_first_row_outlier(simd, rng, shape):
    """The one-pass statistics are taken about a shift drawn from the first row of each
    channel; a first row far from the rest (here 30 standard deviations of the others)
    must not cost the variance its accuracy."""
    x = (rng.standard_normal(shape) * 0.5 + 3.0).astype(np.float32)
    x[0] += np.float32(15.0)
    c = shape[1]
    gamma, beta = np.ones(c, np.float32), np.zeros(c, np.float32)
    y, mean, invstd = ops.batch_norm(x, gamma, beta)
    y_r, mean_r, invstd_r, _, _ = ref.batch_norm_train(x, gamma, beta, 1e-5)
    assert_close(y, y_r, "batch_norm", "y")
    assert_close(mean, mean_r, "batch_norm", "mean")
    assert_close(invstd, invstd_r, "batch_norm", "invstd")


def test_train_without_running_stats(simd, rng):
    x = _data(rng, (3, 11, 4, 4))
    gamma, beta, _, _ = _params(rng, 11)
    y, mean, invstd = ops.batch_norm(x, gamma, beta)
    y_r, mean_r, invstd_r, _, _ = ref.batch_norm_train(x, gamma, beta, 1e-5)
    assert_close(y, y_r, "batch_norm", "y")
    assert_close(mean, mean_r, "batch_norm", "mean")
    assert_close(invstd, invstd_r, "batch_norm", "invstd")


def test_gamma_beta_default(simd, rng):
    x = _data(rng, (3, 5, 2, 2))
    y, _, _ = ops.batch_norm(x, None, None)
    y1, _, _ = ops.batch_norm(x, np.ones(5, np.float32), np.zeros(5, np.float32))
    np.testing.assert_array_equal(y, y1)


def test_threads_give_identical_results(simd, rng):
    """Channels are split between threads, so the thread count changes nothing."""
    x = _data(rng, (4, 12, 24, 24))
    gamma, beta, _, _ = _params(rng, 12)
    dy = f32(rng, *x.shape)
    out = []
    for nt in (1, 2):
        minidl.set_num_threads(nt)
        y, mean, invstd = ops.batch_norm(x, gamma, beta)
        out.append((y, mean, invstd) + ops.batch_norm_backward(x, gamma, dy, mean, invstd))
    minidl.set_num_threads(0)
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def test_nan_flows_to_y(simd):
    x = np.ones((2, 3, 4, 4), np.float32)
    x[:, 1] = np.arange(32, dtype=np.float32).reshape(2, 4, 4)
    x[1, 0, 2, 3] = np.nan
    y, mean, invstd = ops.batch_norm(x, None, None)
    assert np.isnan(y[:, 0]).all() and np.isnan(mean[0])
    assert np.isfinite(y[:, 1:]).all()
    y_r = ref.batch_norm_train(x[:, 1:], np.ones(2), np.zeros(2), 1e-5)[0]
    assert_close(y[:, 1:], y_r, "batch_norm", "channels without NaN")


# ---- inference forward --------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES + [(1, 3, 1, 1), (1, 20)])
def test_infer_forward(simd, threads, rng, shape):
    x = _data(rng, shape)
    gamma, beta, rm, rv = _params(rng, shape[1])
    rm0, rv0 = rm.copy(), rv.copy()
    y, mean, invstd = ops.batch_norm(x, gamma, beta, training=False, running_mean=rm,
                                     running_var=rv, eps=1e-4)
    assert_close(y, ref.batch_norm_infer(x, gamma, beta, rm0, rv0, 1e-4), "batch_norm", "y")
    np.testing.assert_array_equal(mean, rm0)
    assert_close(invstd, 1 / np.sqrt(rv0.astype(np.float64) + 1e-4), "batch_norm", "invstd")
    np.testing.assert_array_equal(rm, rm0)  # running statistics untouched
    np.testing.assert_array_equal(rv, rv0)


# ---- backward -----------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_backward(simd, threads, rng, shape):
    x = _data(rng, shape)
    gamma, beta, _, _ = _params(rng, shape[1])
    dy = f32(rng, *shape)
    _, mean, invstd = ops.batch_norm(x, gamma, beta)
    dx, dgamma, dbeta = ops.batch_norm_backward(x, gamma, dy, mean, invstd)
    dx_r, dgamma_r, dbeta_r = ref.batch_norm_backward(x, gamma, dy, mean, invstd)
    if x.size // shape[1] == 2:
        # two values per channel: xhat = -1, +1 and dx cancels to ~eps-sized values, so
        # its error is measured against the size of the terms that cancel, gamma*invstd*dy
        scale = np.max(np.abs(gamma.reshape(1, -1, 1, 1) * invstd.reshape(1, -1, 1, 1) * dy))
        assert np.max(np.abs(dx - dx_r)) <= TOL["batch_norm"] * scale
    else:
        assert_close(dx, dx_r, "batch_norm", "dx")
    assert_close(dgamma, dgamma_r, "batch_norm", "dgamma")
    assert_close(dbeta, dbeta_r, "batch_norm", "dbeta")


@pytest.mark.parametrize("shape", [(4, 1, 512, 512), (20000, 10)])
def test_backward_large_offset(simd, rng, shape):
    x = (rng.standard_normal(shape) * 0.1 + 100.0).astype(np.float32)
    c = shape[1]
    gamma = np.full(c, 0.5, np.float32)
    dy = (rng.standard_normal(shape) + 0.3).astype(np.float32)
    _, mean, invstd = ops.batch_norm(x, gamma, None)
    dx, dgamma, dbeta = ops.batch_norm_backward(x, gamma, dy, mean, invstd)
    dx_r, dgamma_r, dbeta_r = ref.batch_norm_backward(x, gamma, dy, mean, invstd)
    assert_close(dx, dx_r, "batch_norm", "dx")
    assert_close(dgamma, dgamma_r, "batch_norm", "dgamma")
    assert_close(dbeta, dbeta_r, "batch_norm", "dbeta")


@pytest.mark.parametrize("shape", [(3, 17, 3, 3), (16, 33)])
def test_backward_accumulate(simd, threads, rng, shape):
    """accumulate=True adds to dgamma/dbeta and leaves dx as it would be without it."""
    x = _data(rng, shape)
    n, c = shape[:2]
    hw = x.size // (n * c)
    gamma, _, _, _ = _params(rng, c)
    dy = f32(rng, *shape)
    _, mean, invstd = ops.batch_norm(x, gamma, None)
    dx_r, dgamma_r, dbeta_r = ref.batch_norm_backward(x, gamma, dy, mean, invstd)
    dx = np.full_like(x, 7.0)
    dgamma0, dbeta0 = f32(rng, c), f32(rng, c)
    dgamma, dbeta = dgamma0.copy(), dbeta0.copy()
    _C.batch_norm_backward(n, c, hw, x.reshape(-1), gamma, dy.reshape(-1), mean, invstd,
                           dx.reshape(-1), dgamma, dbeta, True)
    assert_close(dx, dx_r, "batch_norm", "dx")
    assert_close(dgamma, dgamma0 + dgamma_r, "batch_norm", "dgamma accumulated")
    assert_close(dbeta, dbeta0 + dbeta_r, "batch_norm", "dbeta accumulated")
    _C.batch_norm_backward(n, c, hw, x.reshape(-1), gamma, dy.reshape(-1), mean, invstd,
                           dx.reshape(-1), dgamma, dbeta, False)
    assert_close(dgamma, dgamma_r, "batch_norm", "dgamma overwritten")
    assert_close(dbeta, dbeta_r, "batch_norm", "dbeta overwritten")


def test_backward_finite_differences(simd):
    """dx, dgamma, dbeta against central differences of the float64 reference forward
    on L = sum(y * w): checks the backward formula itself, not only its implementation."""
    rng = np.random.default_rng(5)
    x64 = rng.standard_normal((3, 2, 2, 2))
    gamma64, beta64 = rng.standard_normal(2) + 1, rng.standard_normal(2)
    w = rng.standard_normal(x64.shape)
    eps, h = 1e-5, 1e-6

    def loss(x_, g_, b_):
        return float((ref.batch_norm_train(x_, g_, b_, eps)[0] * w).sum())

    def numgrad(a, f):
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            e = np.zeros_like(a)
            e[i] = h
            g[i] = (f(a + e) - f(a - e)) / (2 * h)
        return g

    dx_n = numgrad(x64, lambda a: loss(a, gamma64, beta64))
    dg_n = numgrad(gamma64, lambda a: loss(x64, a, beta64))
    db_n = numgrad(beta64, lambda a: loss(x64, gamma64, a))
    x, gamma, dy = x64.astype(np.float32), gamma64.astype(np.float32), w.astype(np.float32)
    _, mean, invstd = ops.batch_norm(x, gamma, beta64, eps=eps)
    dx, dgamma, dbeta = ops.batch_norm_backward(x, gamma, dy, mean, invstd)
    assert_close(dx, dx_n, "batch_norm", "dx vs finite differences")
    assert_close(dgamma, dg_n, "batch_norm", "dgamma vs finite differences")
    assert_close(dbeta, db_n, "batch_norm", "dbeta vs finite differences")


# ---- bad input ----------------------------------------------------------------------

def _ok(c=3):
    return np.ones(c, np.float32), np.zeros(c, np.float32)


def test_bad_x():
    g, b = _ok()
    with pytest.raises(TypeError, match="x must be a float32"):
        ops.batch_norm(np.ones((2, 3, 4, 4), np.int32), g, b)
    with pytest.raises(TypeError, match="x must be a numpy"):
        ops.batch_norm([[1.0, 2.0, 3.0]], g, b)
    with pytest.raises(ValueError, match="x must be 2-D"):
        ops.batch_norm(np.ones(3, np.float32), g, b)
    with pytest.raises(ValueError, match="x must be 2-D"):
        ops.batch_norm(np.ones((2, 3, 2, 2, 2), np.float32), g, b)
    with pytest.raises(ValueError, match="x must not be empty"):
        ops.batch_norm(np.ones((0, 3, 2, 2), np.float32), g, b)


def test_bad_params():
    x = np.ones((2, 3, 4, 4), np.float32)
    g, b = _ok()
    with pytest.raises(ValueError, match=r"gamma must have shape \(3,\)"):
        ops.batch_norm(x, np.ones(4, np.float32), b)
    with pytest.raises(ValueError, match=r"beta must have shape \(3,\)"):
        ops.batch_norm(x, g, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="gamma must be 1-D"):
        ops.batch_norm(x, np.ones((3, 1), np.float32), b)
    with pytest.raises(TypeError, match="beta must be a float32"):
        ops.batch_norm(x, g, np.zeros(3, np.int64))
    for eps in (-1e-5, np.inf, np.nan):
        with pytest.raises(ValueError, match="eps must be in"):
            ops.batch_norm(x, g, b, eps=eps)
    for m in (-0.1, 1.5, np.nan):
        with pytest.raises(ValueError, match="momentum must be in"):
            ops.batch_norm(x, g, b, momentum=m)
    with pytest.raises(TypeError, match="training must be a bool"):
        ops.batch_norm(x, g, b, training="yes")


def test_bad_running_stats():
    x = np.ones((2, 3, 4, 4), np.float32)
    g, b = _ok()
    good = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="running_mean must be C-contiguous"):
        ops.batch_norm(x, g, b, running_mean=np.zeros(6, np.float32)[::2], running_var=good)
    with pytest.raises(TypeError, match="running_var must be a float32"):
        ops.batch_norm(x, g, b, running_mean=good, running_var=np.ones(3))
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="running_mean must be writable"):
        ops.batch_norm(x, g, b, running_mean=ro, running_var=np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"running_var must have shape \(3,\)"):
        ops.batch_norm(x, g, b, running_mean=good, running_var=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="given together, got only running_mean"):
        ops.batch_norm(x, g, b, running_mean=good)
    with pytest.raises(ValueError, match="running_mean and running_var must not share memory"):
        ops.batch_norm(x, g, b, running_mean=good, running_var=good)
    # running statistics written while x, gamma or beta is read (a row of x was
    # overwritten before it was normalised)
    xs = np.ascontiguousarray(x.reshape(x.shape[0], 3, -1)[:, :, 0])
    for name, r in (("x", xs[1]), ("gamma", g), ("beta", b)):
        with pytest.raises(ValueError, match=f"running_mean and {name} must not share memory"):
            ops.batch_norm(xs, g, b, running_mean=r, running_var=np.ones(3, np.float32))
    y, _, _ = ops.batch_norm(xs, g, b, training=False, running_mean=xs[1], running_var=good + 1)
    np.testing.assert_allclose(y, (xs - xs[1]) / np.sqrt(good + 1 + 1e-5) * g + b, atol=1e-5)
    with pytest.raises(ValueError, match="training=False needs running_mean"):
        ops.batch_norm(x, g, b, training=False)


def test_single_value_per_channel_in_training():
    g, b = _ok()
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    for shape in [(1, 3), (1, 3, 1, 1)]:
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            ops.batch_norm(np.ones(shape, np.float32), g, b, running_mean=rm, running_var=rv)
    np.testing.assert_array_equal(rv, 1)  # nothing written
    # inference is fine with one value
    y, _, _ = ops.batch_norm(np.full((1, 3), 2.0, np.float32), g, b, training=False,
                             running_mean=rm, running_var=rv, eps=0.0)
    np.testing.assert_array_equal(y, [[2.0, 2.0, 2.0]])


def test_bad_backward_args():
    x = np.ones((2, 3, 4, 4), np.float32)
    g, _ = _ok()
    with pytest.raises(ValueError, match="dy must have the shape of x"):
        ops.batch_norm_backward(x, g, np.ones((2, 3, 4, 5), np.float32), g, g)
    with pytest.raises(ValueError, match=r"mean must have shape \(3,\)"):
        ops.batch_norm_backward(x, g, x, np.ones(2, np.float32), g)
    with pytest.raises(ValueError, match=r"invstd must have shape \(3,\)"):
        ops.batch_norm_backward(x, g, x, g, np.ones(5, np.float32))
    with pytest.raises(TypeError, match="dy must be a float32"):
        ops.batch_norm_backward(x, g, np.ones(x.shape, np.int32), g, g)


def test_c_checks():
    """The C core checks on its own, naming the argument and the value."""
    v = np.ones(12, np.float32)
    c3 = np.ones(3, np.float32)
    o3 = np.empty(3, np.float32)
    train = _C.batch_norm_forward_train
    with pytest.raises(ValueError, match="mdl_batch_norm_forward_train: n must be >= 1, got 0"):
        train(0, 3, 4, v, c3, c3, 1e-5, 0.1, None, None, v, o3, o3)
    with pytest.raises(ValueError, match="hw must be >= 1, got -2"):
        train(1, 3, -2, v, c3, c3, 1e-5, 0.1, None, None, v, o3, o3)
    with pytest.raises(ValueError, match="eps must be finite and >= 0, got -1"):
        train(1, 3, 4, v, c3, c3, -1.0, 0.1, None, None, v, o3, o3)
    with pytest.raises(ValueError, match="momentum must be in \\[0, 1\\], got 2"):
        train(1, 3, 4, v, c3, c3, 1e-5, 2.0, None, None, v, o3, o3)
    with pytest.raises(ValueError, match="gamma must not be NULL"):
        train(1, 3, 4, v, None, c3, 1e-5, 0.1, None, None, v, o3, o3)
    with pytest.raises(ValueError, match="save_invstd must not be NULL"):
        train(1, 3, 4, v, c3, c3, 1e-5, 0.1, None, None, v, o3, None)
    with pytest.raises(ValueError, match="both given or both NULL, got only running_var NULL"):
        train(1, 3, 4, v, c3, c3, 1e-5, 0.1, o3, None, v, o3, o3)
    with pytest.raises(ValueError,
                       match=r"more than 1 value per channel when training, got n \* hw = 1"):
        train(1, 12, 1, v, v, v, 1e-5, 0.1, None, None, v, v, v)
    with pytest.raises(ValueError, match="_forward_infer: running_var must not be NULL"):
        _C.batch_norm_forward_infer(1, 3, 4, v, c3, c3, c3, None, 1e-5, v)
    with pytest.raises(ValueError, match="mdl_batch_norm_forward_infer: eps must be finite"):
        _C.batch_norm_forward_infer(1, 3, 4, v, c3, c3, c3, c3, float("inf"), v)
    with pytest.raises(ValueError, match="mdl_batch_norm_backward: c must be >= 1, got 0"):
        _C.batch_norm_backward(1, 0, 4, v, c3, v, c3, c3, v, o3, o3)
    with pytest.raises(ValueError, match="mdl_batch_norm_backward: dbeta must not be NULL"):
        _C.batch_norm_backward(1, 3, 4, v, c3, v, c3, c3, v, o3, None)
