"""dev/fuzz_gemm.py [SEED [SECONDS]]: the SGEMM on random problems against
tests/reference.py's float64 one, for SECONDS (default 600) from SEED (default 0).
Each case draws m, n and k (from 1 to a few thousand, often next to a block or tile
size of the drivers), op(A) and op(B) transposed or not, alpha and beta (beta 0 over a
C of NaN), leading dimensions with or without padding, each operand's offset into a
64-byte line, a workspace of the size asked or none, the SIMD level, 1 or 2 threads
(every region split) and how the AVX-512 driver reads op(B) (in place, packed, auto);
checks C against the reference, relative to the size of its terms, and that C's
padding is untouched.  Prints each case over the tolerance and a summary."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package built in place, the tests
import reference as ref  # noqa: E402
from helpers import rel_err  # noqa: E402
from minidl import _C  # noqa: E402

import fuzzing  # noqa: E402  (dev/, this script's folder)

# sizes of the drivers' tiles, blocks and thresholds (tests/test_gemm.py's docstring)
EDGES = [6, 8, 12, 14, 16, 18, 28, 32, 64, 144, 256, 300, 320, 384, 512, 1536, 1540, 4096]


def dim(rng) -> int:
    r = rng.random()
    if r < 0.4:
        return int(rng.integers(1, 81))
    if r < 0.7:
        return max(1, int(rng.choice(EDGES)) + int(rng.integers(-2, 3)))
    return int(np.exp(rng.uniform(0, np.log(5000))))


def draw(rng):
    """(m, n, k) of at most 3e7 multiply-adds, or None."""
    m, n, k = dim(rng), dim(rng), dim(rng)
    return (m, n, k) if m * n * k <= 3e7 else None


def stored(rng, rows, cols, pad, offset, fill=None):
    """(flat array for the C API, its (rows, cols) view, leading dimension): rows of
    cols + pad floats, the first at `offset` floats past a 64-byte boundary; the padding
    and the matrix random (or `fill`)."""
    ld = cols + pad
    buf = np.empty(rows * ld + 32, np.float32)
    start = (-buf.ctypes.data // 4) % 16 + offset
    flat = buf[start:start + rows * ld]
    flat[:] = rng.standard_normal(flat.size)
    view = flat.reshape(rows, ld)[:, :cols]
    if fill is not None:
        view[...] = fill
    return flat, view, max(ld, 1)


def check(rng, case):
    """(relative error of C, whether C's padding is untouched) of one case."""
    m, n, k = case
    trans_a, trans_b = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    alpha = float(rng.choice([1.0, 1.0, -0.5, 2.0, 0.0]))
    beta = float(rng.choice([0.0, 0.0, 1.0, 0.75]))
    pad = lambda: int(rng.choice([0, 0, 1, 3, 16, int(rng.integers(1, 40))]))  # noqa: E731
    off = lambda: int(rng.integers(0, 16)) if rng.random() < 0.5 else 0  # noqa: E731
    fa, a, lda = stored(rng, *((k, m) if trans_a else (m, k)), pad(), off())
    fb, b, ldb = stored(rng, *((n, k) if trans_b else (k, n)), pad(), off())
    fc, c, ldc = stored(rng, m, n, pad(), off(), np.nan if beta == 0.0 else None)
    c0, before = c.copy(), fc.copy()
    ws = None
    if rng.random() < 0.5:
        ws = np.empty(-(-_C.sgemm_workspace_size(m, n, k) // 4), np.float32)
    _C.sgemm(trans_a, trans_b, m, n, k, alpha, fa, lda, fb, ldb, beta, fc, ldc, ws)
    want = ref.sgemm(a, b, trans_a, trans_b, alpha, beta, c0)
    # errors relative to the terms' size, |alpha| |op(A)| |op(B)| + |beta| |C|: a result
    # that cancels to far below them (m = n = 1, k = 2) holds their rounding
    terms = ref.sgemm(abs(a), abs(b), trans_a, trans_b, abs(alpha), abs(beta), abs(c0))
    inside = np.zeros((m, ldc), bool)
    inside[:, :n] = True
    untouched = np.array_equal(fc.reshape(m, ldc)[~inside], before.reshape(m, ldc)[~inside])
    return (rel_err(c, want, max(terms.max(initial=0.0), 1e-30)), untouched,
            (trans_a, trans_b, alpha, beta, lda, ldb, ldc))


def case(rng):
    drawn = draw(rng)
    if drawn is None:
        return None
    b_mode = str(rng.choice(["auto", "in-place", "packed"]))
    _C.set_sgemm_b(b_mode)
    err, untouched, how = check(rng, drawn)
    tol = 2e-5 * max(1.0, np.sqrt(drawn[2] / 64))  # longer sums
    return (drawn, how, f"b {b_mode}"), {"c": (err, tol),
                                         "c's padding": (0.0 if untouched else np.inf, 0.0)}


def main(seed: int = 0, seconds: float = 600) -> int:
    try:
        return fuzzing.run(seed, seconds, case)
    finally:
        _C.set_sgemm_b("auto")


if __name__ == "__main__":
    sys.exit(main(*(f(a) for f, a in zip((int, float), sys.argv[1:]))))
