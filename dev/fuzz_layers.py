"""dev/fuzz_layers.py [SEED [SECONDS]]: BatchNorm, pooling and the fused training passes
on random shapes against tests/reference.py's float64 ops, for SECONDS (default 600)
from SEED (default 0).  Each case draws a shape ((N, C), (N, C, L) or (N, C, H, W), up to
33 x 33 and 64 channels), the SIMD level and 1 or 2 threads (every region split), and
checks: batch_norm in training (running statistics included) and its backward; the
backward with the ReLU's mask recomputed from a map (x kept away from the map's kink,
where float32 rounding may take either side); batch_norm_add_relu_backward with the sum
before the ReLU made by affine_add (db exactly the masked dy); affine_add; and on images
max and average pooling (random window, stride, padding, ceil mode), max pooling through
a map bit for bit as the plain op on the mapped input written out, and its taps (ReLU
included) as the plain op and the ReLU's mask.  Prints each case over the tolerance and
a summary."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package built in place, the tests
import reference as ref  # noqa: E402
from helpers import TOL, rel_err  # noqa: E402
from minidl import ops  # noqa: E402

import fuzzing  # noqa: E402  (dev/, this script's folder)


def draw(rng):
    """A shape of at most 2M values with more than one value per channel."""
    n = int(rng.choice([1, 2, 3, 5, 8, 17]))
    c = int(rng.choice([1, 2, 3, 7, 8, 9, 16, 17, 33, 64]))
    r = rng.random()
    if r < 0.1:
        shape = (n, c)
    elif r < 0.2:
        shape = (n, c, int(rng.integers(1, 70)))
    else:
        h = int(rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33]))
        shape = (n, c, h, h if rng.random() < 0.7 else int(rng.integers(1, 34)))
    size = int(np.prod(shape))
    return shape if size <= 2e6 and size // c > 1 else None


def per_channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def same(got, want):
    """(error, tolerance) of a result that must be the other's bit for bit"""
    return (0.0 if np.array_equal(got, want) else np.inf, 0.0)


def backward_scales(x, g, dy, mean, invstd):
    """The size of the terms that dx, dgamma and dbeta of batch_norm_backward sum, in
    float64: over few values per channel they cancel far below them (over 2, dx is 0
    but for eps)."""
    x, g, dy, mean, invstd = (np.asarray(a, np.float64) for a in (x, g, dy, mean, invstd))
    nd, axes, m = x.ndim, (0,) + tuple(range(2, x.ndim)), x.size // x.shape[1]
    xhat = np.abs((x - per_channel(mean, nd)) * per_channel(invstd, nd))
    sdb, sdg = np.abs(dy).sum(axes), (np.abs(dy) * xhat).sum(axes)
    sdx = per_channel(np.abs(g) * invstd / m, nd) * (
        m * np.abs(dy) + per_channel(sdb, nd) + xhat * per_channel(sdg, nd))
    return sdx.max(), sdg.max(), sdb.max()


def backward_errors(prefix, got, want, scales, errs):
    for name, g_, w, sc in zip(("dx", "dgamma", "dbeta"), got, want, scales):
        errs[f"{prefix} {name}"] = (rel_err(g_, w, max(sc, 1e-30)), TOL["batch_norm"])


def check_batch_norm(rng, shape, f32, errs):
    c, nd = shape[1], len(shape)
    axes = (0,) + tuple(range(2, nd))
    x = f32(*shape) * 2 + per_channel(f32(c), nd)
    g, beta, dy = f32(c), f32(c), f32(*shape)
    rm, rv = f32(c), np.abs(f32(c)) + 0.5
    want = ref.batch_norm_train(x, g, beta, 1e-5, rm, rv, 0.1)
    y, mean, invstd = ops.batch_norm(x, g, beta, running_mean=rm, running_var=rv)
    big = float(np.abs(x).max())  # the mean's terms
    for name, got, w, sc in zip(("bn y", "bn mean", "bn invstd", "bn running_mean",
                                 "bn running_var"), (y, mean, invstd, rm, rv), want,
                                (1.0, big, 1e-3, big, 1e-3)):
        errs[name] = (rel_err(got, w, sc), TOL["batch_norm"])
    backward_errors("bn", ops.batch_norm_backward(x, g, dy, mean, invstd),
                    ref.batch_norm_backward(x, g, dy, mean, invstd),
                    backward_scales(x, g, dy, mean, invstd), errs)
    # the ReLU's mask from a map, x moved 0.01 off the map's kink where it lay within 1e-3
    s = (rng.uniform(0.5, 2, c) * rng.choice([-1, 1], c)).astype(np.float32)
    t = f32(c)
    v = x.astype(np.float64) * per_channel(s, nd) + per_channel(t, nd)
    x = np.where(np.abs(v) < 1e-3, x + np.where(v < 0, -0.01, 0.01) / per_channel(s, nd),
                 x).astype(np.float32)
    x64 = x.astype(np.float64)
    mask = x64 * per_channel(s, nd) + per_channel(t, nd) > 0
    mean = x64.mean(axes).astype(np.float32)
    invstd = (1 / np.sqrt(x64.var(axes) + 1e-5)).astype(np.float32)
    backward_errors("masked",
                    ops.batch_norm_backward(x, g, dy, mean, invstd, relu_scale=s, relu_shift=t),
                    ref.batch_norm_backward(x, g, dy * mask, mean, invstd),
                    backward_scales(x, g, dy * mask, mean, invstd), errs)


def check_add_relu(rng, shape, f32, errs):
    c, nd = shape[1], len(shape)
    axes = (0,) + tuple(range(2, nd))
    x, b, dy = f32(*shape) * 2 + 0.5, f32(*shape), f32(*shape)
    g = (rng.uniform(0.5, 1.5, c) * rng.choice([-1, 1], c)).astype(np.float32)
    beta = f32(c)
    x64 = x.astype(np.float64)
    mean, invstd, scale, shift = ops.batch_norm_stats(x64.sum(axes), (x64 ** 2).sum(axes),
                                                      x.size // c, g, beta)
    affine, b_relu = bool(rng.random() < 0.6), bool(rng.random() < 0.5)
    bs, bt = (f32(c), f32(c)) if affine else (None, None)
    m = dict(b_scale=bs, b_shift=bt, b_relu=b_relu)
    s = ops.affine_add(x, b, a_scale=scale, a_shift=shift, **m)  # as the fused forward
    fb = b.astype(np.float64)
    if affine:
        fb = fb * per_channel(bs, nd) + per_channel(bt, nd)
    if b_relu:
        fb = np.maximum(fb, 0)
    fa = x64 * per_channel(scale, nd) + per_channel(shift, nd)
    errs["affine_add"] = (rel_err(s, fa + fb, np.abs(fa).max() + np.abs(fb).max()),
                          TOL["elementwise"])
    dx, db, dgamma, dbeta = ops.batch_norm_add_relu_backward(s, b, g, beta, dy, invstd, **m)
    want_db = np.where(s > 0, dy, 0)
    errs["add_relu db"] = same(db, want_db)
    # the reconstruction rounds |s| + |fb(b)| + |beta| over |gamma| in xhat
    scales = backward_scales(x, g, want_db, mean, invstd)
    backward_errors("add_relu", (dx, dgamma, dbeta),
                    ref.batch_norm_backward(x, g, want_db, mean, invstd),
                    [max(sc, float(np.abs(s).max())) for sc in scales], errs)


def check_pools(rng, shape, f32, errs):
    h, w = shape[2:]
    k = tuple(int(rng.integers(1, 6)) for _ in range(2)) if rng.random() < 0.3 else \
        (int(rng.choice([2, 3])),) * 2
    stride = tuple(int(v) for v in rng.choice([1, 2, 3, k[0]], 2)) if rng.random() < 0.3 \
        else (int(rng.choice([1, 2, k[0]])),) * 2
    pad = tuple(int(rng.integers(0, kk // 2 + 1)) for kk in k)
    ceil = bool(rng.random() < 0.3)
    if h + 2 * pad[0] < k[0] or w + 2 * pad[1] < k[1]:
        return
    kw = dict(stride=stride, padding=pad, ceil_mode=ceil)
    x = f32(*shape)
    y = ops.max_pool2d(x, k, **kw)
    if y.size == 0:
        return
    dy = f32(*y.shape)
    errs["max pool"] = (rel_err(y, ref.max_pool2d(x, k, stride, pad, ceil)), 0.0)
    errs["max pool dx"] = (rel_err(ops.max_pool2d_backward(x, dy, k, **kw),
                                   ref.max_pool2d_backward(x, dy, k, stride, pad, ceil)),
                           TOL["elementwise"])
    errs["avg pool"] = (rel_err(ops.avg_pool2d(x, k, **kw),
                                ref.avg_pool2d(x, k, stride, pad, ceil)), TOL["reduction"])
    r = np.maximum(x, 0)  # a ReLU's output before the average pool
    errs["avg pool dx relu"] = (
        rel_err(ops.avg_pool2d_backward(r, dy, k, relu=True, **kw),
                ref.avg_pool2d_backward(x.shape, dy, k, stride, pad, ceil) * (r > 0)),
        TOL["reduction"])
    # through a map, bit for bit as the plain op on the mapped input written out
    c = shape[1]
    s, t, x_relu = f32(c), f32(c), bool(rng.random() < 0.5)
    m = dict(x_scale=s, x_shift=t, x_relu=x_relu)
    a = ops.affine_add(x, a_scale=s, a_shift=t, a_relu=x_relu)
    ya = ops.max_pool2d(a, k, **kw)
    errs["max pool map"] = same(ops.max_pool2d(x, k, **kw, **m), ya)
    errs["max pool map dx"] = same(ops.max_pool2d_backward(x, dy, k, **kw, **m),
                                   ops.max_pool2d_backward(a, dy, k, **kw))
    if k[0] * k[1] < ops.MAX_POOL_TAPS:
        relu = bool(rng.random() < 0.5)
        yt, tap = ops.max_pool2d_argmax(x, k, **kw, **m, relu=relu)
        errs["taps y"] = same(yt, np.maximum(ya, 0) if relu else ya)
        errs["taps dx"] = same(ops.max_pool2d_backward_argmax(tap, dy, x.shape, k, **kw),
                               ops.max_pool2d_backward(a, dy * (ya > 0) if relu else dy, k,
                                                       **kw))


def case(rng):
    shape = draw(rng)
    if shape is None:
        return None
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    errs = {}
    check_batch_norm(rng, shape, f32, errs)
    check_add_relu(rng, shape, f32, errs)
    if len(shape) == 4:
        check_pools(rng, shape, f32, errs)
    return shape, errs


def main(seed: int = 0, seconds: float = 600) -> int:
    return fuzzing.run(seed, seconds, case)


if __name__ == "__main__":
    sys.exit(main(*(f(a) for f, a in zip((int, float), sys.argv[1:]))))
