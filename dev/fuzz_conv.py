"""dev/fuzz_conv.py [SEED [SECONDS]]: the convolution family on random shapes against
tests/reference.py's float64 convolution, for SECONDS (default 600) from SEED
(default 0).  Each case draws a batch, channels, image size, kernel (up to 7x7, not
always square), stride, padding, bias, SIMD level, 1 or 2 threads (every region
split) and algorithm (auto, gemm, winograd), and checks conv2d; conv2d_fused with an
input map (scale and shift, ReLU), an output ReLU and the channel sums;
conv2d_backward through the map, with and without dx, adding dx to a given
gradient; and conv2d_pooled after a max or average pool.  Prints each case over
the tolerance and a summary."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package built in place, the tests
import minidl  # noqa: E402
import reference as ref  # noqa: E402
from helpers import rel_err  # noqa: E402
from minidl import ops  # noqa: E402

import fuzzing  # noqa: E402  (dev/, this script's folder)


def draw(rng):
    """A case that fits: (n, ci, h, w, co, kh, kw, stride, padding), or None."""
    n = int(rng.choice([1, 2, 3, 5, 8, 16, 17]))
    ci = int(rng.choice([1, 2, 3, 7, 8, 16, 24, 32, 33, 64, 65]))
    co = int(rng.choice([1, 4, 8, 15, 16, 32, 40, 64]))
    kh = int(rng.choice([1, 2, 3, 3, 3, 5, 7]))
    kw = kh if rng.random() < 0.8 else int(rng.integers(1, 6))
    same = rng.random() < 0.85
    stride = (int(rng.choice([1, 1, 1, 2, 3])),) * 2 if same else tuple(rng.integers(1, 4, 2))
    padding = (int(rng.integers(0, 4)),) * 2 if same else tuple(rng.integers(0, 4, 2))
    h = int(rng.choice([1, 2, 4, 5, 6, 7, 8, 9, 12, 14, 15, 16, 17, 28, 32, 33]))
    w = h if rng.random() < 0.7 else int(rng.integers(1, 36))
    if h + 2 * padding[0] < kh or w + 2 * padding[1] < kw or n * ci * h * w * co * kh * kw > 3e7:
        return None
    return n, ci, h, w, co, kh, kw, tuple(map(int, stride)), tuple(map(int, padding))


def check(rng, case):
    """{what: relative error} of one case's ops."""
    n, ci, h, w, co, kh, kw, stride, padding = case
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    kw_ = dict(stride=stride, padding=padding)
    x, wt = f32(n, ci, h, w), f32(co, ci, kh, kw)
    b = f32(co) if rng.random() < 0.7 else None
    relu = bool(rng.random() < 0.5)
    out = lambda y: np.maximum(y, 0) if relu else y  # noqa: E731
    want = out(ref.conv2d(x, wt, b, **kw_))
    errs = {"conv2d": rel_err(ops.conv2d(x, wt, b, relu=relu, **kw_), want)}
    mapped, x_relu = bool(rng.random() < 0.6), bool(rng.random() < 0.5)
    scale, shift = (f32(ci), f32(ci)) if mapped else (None, None)
    a = x.astype(np.float64)
    if mapped:
        a = a * scale[:, None, None] + shift[:, None, None]
    if x_relu:
        a = np.maximum(a, 0)
    y, s1, s2 = ops.conv2d_fused(x, wt, b, x_scale=scale, x_shift=shift, x_relu=x_relu,
                                 relu=relu, stats=True, **kw_)
    want_f = out(ref.conv2d(a, wt, b, **kw_))
    per_channel = np.sqrt(n * want_f[0, 0].size)  # sums that may cancel
    errs["fused"] = rel_err(y, want_f)
    errs["sum"] = rel_err(s1, want_f.sum((0, 2, 3)),
                          per_channel * max(np.abs(want_f).max(), 1e-3))
    errs["sumsq"] = rel_err(s2, (want_f ** 2).sum((0, 2, 3)))
    dy = f32(*want.shape)
    rdx, rdw, rdb = ref.conv2d_backward(a, wt, dy, **kw_)
    other = f32(*x.shape) if rng.random() < 0.4 else None
    need_dx = other is not None or rng.random() < 0.9
    dx, dw, db = ops.conv2d_backward(x, wt, dy, x_scale=scale, x_shift=shift, x_relu=x_relu,
                                     need_dx=need_dx,
                                     add_dx_to=None if other is None else other.copy(), **kw_)
    if need_dx:
        errs["dx"] = rel_err(dx, rdx if other is None else rdx + other)
    errs["dw"] = rel_err(dw, rdw, per_channel)
    errs["db"] = rel_err(db, rdb, per_channel)
    k = int(rng.choice([2, 3]))
    p_stride, p_pad = int(rng.choice([1, 2, k])), int(rng.integers(0, k // 2 + 1))
    ceil, kind, p_relu = bool(rng.random() < 0.3), str(rng.choice(["max", "avg"])), \
        bool(rng.random() < 0.3)
    if min(want.shape[2:]) + 2 * p_pad >= k:
        yp = ops.conv2d_pooled(x, wt, b, relu=relu, pool=kind, kernel_size=k,
                               pool_stride=p_stride, pool_padding=p_pad, ceil_mode=ceil,
                               pool_relu=p_relu, **kw_)
        pooled = (ref.max_pool2d if kind == "max" else ref.avg_pool2d)(
            want, (k, k), (p_stride, p_stride), (p_pad, p_pad), ceil)
        errs["pooled"] = rel_err(yp, np.maximum(pooled, 0) if p_relu else pooled)
    return errs


def case(rng):
    drawn = draw(rng)
    if drawn is None:
        return None
    algo = str(rng.choice(["auto", "auto", "gemm", "winograd"]))
    minidl.set_conv_algo(algo)
    tol = 2e-5 * max(1.0, np.sqrt(drawn[1] * drawn[5] * drawn[6] / 64))  # longer sums
    return (drawn, algo), {k: (e, tol) for k, e in check(rng, drawn).items()}


def main(seed: int = 0, seconds: float = 600) -> int:
    return fuzzing.run(seed, seconds, case)


if __name__ == "__main__":
    sys.exit(main(*(f(a) for f, a in zip((int, float), sys.argv[1:]))))
