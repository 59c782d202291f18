"""ops.sgemm against the float64 reference, on every SIMD level (scalar, AVX2, AVX-512
where the CPU has it), 1 and 2 threads.

The AVX2 kernel works in blocks: K in blocks of up to 320 (split evenly), rows of
C in groups of 144 per thread and 1536 per packing step, columns in steps of up to
4096, tiles of 6 x 16; when a K block of op(B) holds at most 64K floats and C at
most 18 rows, the threads split the columns (op(B) read in place when it is not
transposed and M <= 12, else each thread packs its own panels); otherwise, for M <=
144 and K > 32, a thread that shares its columns with no other packs op(B) 8
micro-panels at a time.

The AVX-512 kernel: K in blocks of up to 384, tiles of 14 x 32 with masked column
edges, and three drivers chosen by shape: when a K block of op(B) holds at most 128K
floats and all of it at most 512K, the threads split the columns for M <= 28 (op(B)
read in place when it is not transposed, else packed per thread) or the rows (op(B)
packed whole), and op(A) is read in place when it is not transposed and alpha is 1;
the columns split with op(B) in place also for larger op(B) when it is not
transposed, M <= 28 and K <= 384 (on AVX2: M <= 12, K <= 320), but for K <= 32
where its tiles would have more than 8 rows with op(B) packed 4 micro-panels at a
time into the thread's buffer and tiles of at most 8 rows; otherwise rows in
packing steps of 1540 (tiles of at most 8 rows for K <= 32 here too), columns in steps of up to 4096 and groups of 8 x 32, op(B)
read in place when it is not transposed and M <= 64, or 64-byte aligned and M <=
256 (on CPUs other than Intel's: _C.set_sgemm_b), else packed a group at a time when
the threads split only the columns; but with
op(A) not transposed and op(B) transposed (rows of both along K), C of m + n <= 320
and at most 32 (m + n) elements and K >= 256, dot products over K (both levels) in
chunks of up to 4096 (from 192K floats / (m + n), a multiple of 64, at least 256), 4
x 4 of them to a tile on AVX-512 and 3 x 3 on AVX2 (its loads from where its first row
of B^T reaches a 64-byte, on AVX2 a 32-byte, boundary; a work item's rows of A copied
to lie as B^T's when they lie otherwise and ldb % 16 = 0), the chunks' partial sums added
in chunk order; and other such products with fewer rows than columns, K >= 256 and the
rows padded to a micro-panel of B^T by at most an eighth of one, as (B @ A^T)^T, B read
in place by the rows split (also those of the dot products' shapes where n >= 4 m and
n k >= 256K).  With K <= 32, N >= 512 and C's rows starting inside a
line, all alike, the columns up to the first line boundary are a product of their own.
The shapes below cross each of these boundaries.
"""
import numpy as np
import pytest

import minidl
from minidl import _C, ops

from helpers import assert_close, f32
import reference as ref

TRANS = [(False, False), (False, True), (True, False), (True, True)]

SQUARE = [(s, s, s) for s in (1, 2, 7, 15, 16, 17, 33, 100)]
MIXED = [
    (1, 100, 7), (100, 1, 7), (6, 16, 1), (5, 17, 3), (13, 47, 9),
    (7, 33, 321),     # two K blocks, the second of one element more
    (12, 40, 700),    # three K blocks
    (150, 35, 20),    # a thread's row group (144) plus a partial one
    (290, 18, 5),     # more than two row groups
    (1540, 17, 4),    # two row packing steps (1536)
    (9, 4100, 3),     # two column steps (4096)
    (16, 1024, 27),   # a convolution-like shape: small M, wide N
    (29, 257, 385),   # AVX-512: 14-row tiles + 1, a column group (256) + 1, two K blocks
    (1541, 33, 5),    # AVX-512: two row packing steps (1540), a masked column tile
    (64, 31, 770),    # three AVX-512 K blocks; N below one 32-column tile
    (20, 300, 800),   # AVX-512 rows split, B in place (not transposed): three K blocks
    (9, 4100, 40),    # columns split over an op(B) beyond L2 (not transposed: in place)
    (30, 4100, 40),   # shared blocks: two column steps (4096); AVX2: op(B) packed in
                      # groups of 8 micro-panels, the last one partial
    (144, 1700, 40),  # AVX2 shared blocks: one row group of 24 tiles, op(B) in groups
    (145, 1700, 40),  # ... two row groups: op(B) packed whole first
    (40, 1100, 800),  # AVX-512 shared blocks, B in place (not transposed): three K blocks
    (1541, 520, 300), # AVX-512 shared blocks: two row packing steps (1540)
    (300, 40, 900),   # AVX-512 rows split, A read in place: three K blocks, 22 row panels
    # K <= 32 (AVX-512: tiles of at most 8 rows):
    (27, 8200, 16),   # columns split over a large op(B), B packed 4 panels at a time
    (27, 8200, 33),   # ... K of one more: B in place, 14-row tiles
    (100, 9000, 32),  # shared blocks: 13 row panels, 12 of 8 rows and one of 4
    # dot products (op(B) transposed only; AVX-512 4 x 4 tiles, AVX2 3 x 3):
    (16, 27, 4100),   # two K chunks (4096), the second of 4; a tile of 3 columns
    (7, 33, 9000),    # three K chunks, tiles of 3 rows and of 1 column, K % 16 = 8
    (1, 300, 700),    # m + n = 301: chunks of 576, one row
    (100, 10, 1000),  # 25 row blocks, tiles of 2 columns
    (5, 20, 600),     # AVX2 (3 x 3 tiles): tiles of 2 rows and of 2 columns
]

# edge sizes: every row count of a tile, column counts around 16 and 32
EDGE_M = [1, 2, 5, 6, 7, 12, 13, 14, 15, 16, 27, 28, 29, 43, 70]
EDGE_NK = [(1, 1), (3, 70), (8, 9), (15, 16), (16, 17), (17, 33), (31, 8), (32, 3),
           (33, 64), (47, 2), (48, 31), (63, 1), (64, 65), (65, 20), (70, 69)]


def operands(rng, m, n, k, trans_a, trans_b):
    a = f32(rng, *((k, m) if trans_a else (m, k)))
    b = f32(rng, *((n, k) if trans_b else (k, n)))
    return a, b


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("m,n,k", SQUARE + MIXED)
def test_sgemm(simd, threads, rng, m, n, k, trans_a, trans_b):
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    got = ops.sgemm(a, b, trans_a=trans_a, trans_b=trans_b)
    assert got.shape == (m, n) and got.dtype == np.float32
    assert_close(got, ref.sgemm(a, b, trans_a, trans_b), "gemm", f"sgemm {m}x{n}x{k}")


def placed(x, offset):
    """A copy of x whose data starts `offset` floats past a 64-byte boundary."""
    buf = np.empty(x.size + 32, np.float32)
    start = (-buf.ctypes.data // 4) % 16 + offset
    y = buf[start:start + x.size].reshape(x.shape)
    y[...] = x
    return y


@pytest.mark.parametrize("offset", [0, 4])
@pytest.mark.parametrize("m,n,k", [(40, 1024, 800), (256, 512, 700), (16, 1024, 27),
                                   (12, 64, 900)])
def test_sgemm_b_read_in_place(simd, threads, rng, m, n, k, offset):
    """AVX-512 reads op(B) in place when it is not transposed and C has few rows (in
    the shared-blocks driver only when B's rows are 64-byte aligned, and not on Intel
    CPUs: set_sgemm_b): aligned and not."""
    a, b = f32(rng, m, k), placed(f32(rng, k, n), offset)
    assert (b.ctypes.data % 64 == 0) == (offset == 0)
    assert_close(ops.sgemm(a, b), ref.sgemm(a, b), "gemm", f"sgemm {m}x{n}x{k}")


@pytest.mark.parametrize("offset", [0, 4])
@pytest.mark.parametrize("m,n,k", [(40, 1100, 800), (64, 3264, 576), (200, 700, 300)])
def test_sgemm_b_modes_agree(simd, threads, rng, m, n, k, offset):
    """op(B) read in place or packed (set_sgemm_b; "auto" is one of them): the same
    products in the same order, bit for bit, so that test_sgemm_b_read_in_place's check
    against the reference holds for both on any CPU."""
    a, b = f32(rng, m, k), placed(f32(rng, k, n), offset)
    out = {}
    try:
        for mode in ("in-place", "packed", "auto"):
            _C.set_sgemm_b(mode)
            out[mode] = ops.sgemm(a, b)
    finally:
        _C.set_sgemm_b("auto")
    assert np.array_equal(out["in-place"], out["packed"])
    assert np.array_equal(out["auto"], out["packed"])
    with pytest.raises(ValueError, match="sgemm b mode"):
        _C.set_sgemm_b("sideways")


@pytest.mark.parametrize("offset", [0, 1, 12])
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("m,n,k", [(20, 640, 16), (150, 600, 20), (100, 9000, 32)])
def test_sgemm_short_k_c_inside_a_line(simd, threads, rng, m, n, k, trans_a, trans_b, offset):
    """K <= 32, N >= 512 and C's rows starting `offset` floats into a line (ldc a multiple
    of 16): the columns up to the line boundary are a product of their own; alpha, beta."""
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    c = f32(rng, m, n)
    out = placed(c, offset)
    got = ops.sgemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=-0.5, beta=0.75, out=out)
    assert got is out
    assert_close(out, ref.sgemm(a, b, trans_a, trans_b, -0.5, 0.75, c), "gemm",
                 f"sgemm {m}x{n}x{k} C {offset} floats into a line")


@pytest.mark.parametrize("m,n,k", [(16, 27, 4100), (7, 33, 9000), (5, 20, 608), (64, 64, 2048)])
def test_sgemm_dot_products_wherever_the_rows_lie(simd, threads, rng, m, n, k):
    """The dot products' loads start where a row of B^T reaches a line and rotate their
    lanes back, and A's rows are copied to lie as B^T's do where they lie otherwise: the
    same bits for A and B^T at any offset into a line, and the reference's values.  Rows
    all alike for K % 16 = 0 (A copied unless both lie at one offset; 608: tiles of 1
    and 2 rows), each its own for 4100 and 9000 (no copy); 4100's last chunk of 4 floats
    is shorter than most offsets."""
    a, bt = f32(rng, m, k), f32(rng, n, k)
    want = ops.sgemm(placed(a, 0), placed(bt, 0), trans_b=True)
    assert_close(want, ref.sgemm(a, bt, False, True), "gemm", f"sgemm {m}x{n}x{k} NT")
    for oa, ob in [(0, 1), (4, 4), (4, 8), (9, 15), (15, 0)]:
        got = ops.sgemm(placed(a, oa), placed(bt, ob), trans_b=True)
        np.testing.assert_array_equal(got, want, err_msg=f"A {oa}, B^T {ob} floats into a line")


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("m", EDGE_M)
def test_sgemm_edge_sizes(simd, threads, rng, m, trans_a, trans_b):
    """m, n, k from 1 to 70, alpha and beta, C a view with ldc > n."""
    for n, k in EDGE_NK:
        a, b = operands(rng, m, n, k, trans_a, trans_b)
        got = ops.sgemm(a, b, trans_a=trans_a, trans_b=trans_b)
        assert_close(got, ref.sgemm(a, b, trans_a, trans_b), "gemm", f"sgemm {m}x{n}x{k}")
        wide = f32(rng, m, n + 5)
        ldc = n + 5
        c = wide[:, :n].copy()
        fa = np.ascontiguousarray(a).reshape(-1)
        fb = np.ascontiguousarray(b).reshape(-1)
        out = wide.copy().reshape(-1)
        _C.sgemm(trans_a, trans_b, m, n, k, -0.5, fa, a.shape[1], fb, b.shape[1], 0.75, out, ldc)
        out = out.reshape(m, ldc)
        assert_close(out[:, :n], ref.sgemm(a, b, trans_a, trans_b, -0.5, 0.75, c), "gemm",
                     f"sgemm ldc {m}x{n}x{k}")
        np.testing.assert_array_equal(out[:, n:], wide[:, n:])  # the padding is untouched


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("alpha,beta", [(0.5, 0.0), (1.0, 1.0), (-2.0, 0.25), (0.0, -1.5)])
@pytest.mark.parametrize("m,n,k", [(7, 15, 17), (33, 100, 2), (20, 37, 400)])
def test_sgemm_alpha_beta_in_place(simd, threads, rng, m, n, k, trans_a, trans_b, alpha, beta):
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    c = f32(rng, m, n)
    out = c.copy()
    got = ops.sgemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, out=out)
    assert got is out
    assert_close(out, ref.sgemm(a, b, trans_a, trans_b, alpha, beta, c), "gemm")


@pytest.mark.parametrize("m,n,k", [(32, 300, 256), (30, 400, 300), (64, 70, 500), (32, 128, 2048),
                                   (32, 300, 255), (20, 300, 256), (32, 127, 2100),
                                   (32, 128, 2040)])
def test_sgemm_a_b_transposed_computed_swapped(simd, threads, rng, m, n, k):
    """C = A @ B^T with fewer rows than columns, K >= 256 and A's rows padded to a
    micro-panel by at most an eighth of one is computed as (B @ A^T)^T (the first four
    shapes, the fourth one of the dot products' too, n = 4 m and n k = 256K; not the
    last four, at the boundaries: the last two take the dot products): alpha, beta, C a
    view with ldc > n, and a C of NaN with beta 0."""
    a, b = f32(rng, m, k), f32(rng, n, k)
    wide = f32(rng, m, n + 5)
    c = wide[:, :n].copy()
    out = wide.copy().reshape(-1)
    _C.sgemm(False, True, m, n, k, -0.5, a.reshape(-1), k, b.reshape(-1), k, 0.75, out, n + 5)
    out = out.reshape(m, n + 5)
    assert_close(out[:, :n], ref.sgemm(a, b, False, True, -0.5, 0.75, c), "gemm")
    np.testing.assert_array_equal(out[:, n:], wide[:, n:])  # the padding is untouched
    nan = np.full((m, n), np.nan, np.float32)
    ops.sgemm(a, b, trans_b=True, alpha=1.5, beta=0.0, out=nan)
    assert_close(nan, ref.sgemm(a, b, False, True, 1.5), "gemm")


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 33, 5), (16, 32, 12), (50, 70, 330)])
def test_sgemm_beta0_ignores_nan_in_out(simd, threads, rng, m, n, k):
    a, b = f32(rng, m, k), f32(rng, k, n)
    out = np.full((m, n), np.nan, np.float32)
    ops.sgemm(a, b, alpha=1.5, beta=0.0, out=out)
    assert np.isfinite(out).all()
    assert_close(out, ref.sgemm(a, b, alpha=1.5), "gemm")


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_sgemm_k0_scales_out(simd, threads, rng, beta):
    c = f32(rng, 9, 20)
    out = c.copy() if beta else np.full((9, 20), np.nan, np.float32)
    ops.sgemm(np.empty((9, 0), np.float32), np.empty((0, 20), np.float32), beta=beta, out=out)
    np.testing.assert_array_equal(out, beta * c if beta else np.zeros((9, 20), np.float32))


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_sgemm_alpha0_reads_neither_a_nor_b(simd, threads, rng, beta):
    """As BLAS: alpha == 0 gives beta * C, NaN and Inf in A or B not reaching it."""
    a = np.full((40, 70), np.nan, np.float32)
    b = np.full((70, 30), np.inf, np.float32)
    c = f32(rng, 40, 30)
    out = c.copy() if beta else np.full((40, 30), np.nan, np.float32)
    ops.sgemm(a, b, alpha=0.0, beta=beta, out=out)
    np.testing.assert_array_equal(out, beta * c if beta else np.zeros((40, 30), np.float32))


def test_sgemm_empty_result(simd):
    assert ops.sgemm(np.empty((0, 5), np.float32), f32(np.random.default_rng(0), 5, 3)).shape == (0, 3)
    assert ops.sgemm(np.ones((4, 5), np.float32), np.empty((5, 0), np.float32)).shape == (4, 0)


def test_sgemm_nan_in_inputs_propagates(simd):
    a = np.ones((8, 8), np.float32)
    a[3, 2] = np.nan
    got = ops.sgemm(a, np.ones((8, 20), np.float32))
    assert np.isnan(got[3]).all() and np.isfinite(np.delete(got, 3, axis=0)).all()


@pytest.mark.parametrize("m,n,k,trans_b", [
    (130, 200, 333, False), (16, 2000, 800, False), (256, 64, 2304, False),
    (20, 300, 800, False), (16, 1024, 27, False), (5, 100, 300, False),
    (16, 27, 9000, True), (33, 64, 2000, True), (27, 8200, 16, False), (100, 9000, 32, False),
    (32, 400, 600, True)])
def test_sgemm_same_result_for_any_thread_count(simd, rng, m, n, k, trans_b):
    """Each SIMD kernel sums each element in the same order whatever the thread grid."""
    a, b = f32(rng, m, k), f32(rng, *((n, k) if trans_b else (k, n)))
    before = minidl.get_num_threads()
    try:
        results = []
        for nt in (1, 2, 3):
            minidl.set_num_threads(nt)
            results.append(ops.sgemm(a, b, trans_b=trans_b))
    finally:
        minidl.set_num_threads(before)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


@pytest.mark.skipif(minidl.cpu_simd() != "avx512", reason="the AVX-512 tiles' column groups")
def test_sgemm_threads_with_their_own_b(rng):
    """Threads with rows of their own each pack B themselves and wait for no other
    within a block of rows; between blocks of rows of different sizes (812 and 788
    rows here), which split their A micro-panels differently, they do wait.  Each call
    alike, and like one thread's."""
    a, b = f32(rng, 1600, 300), f32(rng, 300, 800)
    before = minidl.get_num_threads()
    try:
        minidl.set_num_threads(1)
        want = ops.sgemm(a, b)
        for nt in (2, 3):
            minidl.set_num_threads(nt)
            for _ in range(4):
                np.testing.assert_array_equal(ops.sgemm(a, b), want)
    finally:
        minidl.set_num_threads(before)
    assert_close(want, a.astype(np.float64) @ b, "gemm")


def test_sgemm_workspace_fits_every_level(rng):
    """The workspace size is one for all levels: a buffer sized under one level
    serves a call made under another."""
    m, n, k = 50, 300, 400
    a, b = f32(rng, m, k), f32(rng, k, n)
    size = _C.sgemm_workspace_size(m, n, k)
    try:
        levels = ["scalar", "avx2", "avx512"]
        for level in levels[:levels.index(minidl.cpu_simd()) + 1]:
            minidl.set_simd(level)
            assert _C.sgemm_workspace_size(m, n, k) == size
            c = np.empty((m, n), np.float32)
            _C.sgemm(False, False, m, n, k, 1.0, a.reshape(-1), k, b.reshape(-1), n, 0.0,
                     c.reshape(-1), n, np.empty(size // 4, np.float32))
            assert_close(c, ref.sgemm(a, b), "gemm")
    finally:
        minidl.set_simd(minidl.cpu_simd())


def test_sgemm_non_contiguous_and_float64_inputs(simd, rng):
    a = f32(rng, 20, 30)[:, ::2]           # (20, 15), strided
    b = rng.standard_normal((15, 9))       # float64: converted
    assert_close(ops.sgemm(a, b), ref.sgemm(a, b.astype(np.float32)), "gemm")


def test_sgemm_workspace_contract(simd, rng):
    m, n, k = 30, 40, 50
    a, b = f32(rng, m, k), f32(rng, k, n)
    size = _C.sgemm_workspace_size(m, n, k)
    assert size > 0 and _C.sgemm_workspace_size(m, n, 0) == 0
    c = np.empty((m, n), np.float32)
    _C.sgemm(False, False, m, n, k, 1.0, a.reshape(-1), k, b.reshape(-1), n, 0.0,
             c.reshape(-1), n, np.empty(size // 4, np.float32))
    assert_close(c, ref.sgemm(a, b), "gemm")
    with pytest.raises(ValueError, match="workspace"):
        _C.sgemm(False, False, m, n, k, 1.0, a.reshape(-1), k, b.reshape(-1), n, 0.0,
                 c.reshape(-1), n, np.empty(size // 4 - 1, np.float32))


def test_sgemm_c_argument_checks():
    one = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="m must be >= 0"):
        _C.sgemm(False, False, -1, 2, 2, 1.0, one, 2, one, 2, 0.0, one, 2)
    with pytest.raises(ValueError, match="lda"):
        _C.sgemm(False, False, 2, 2, 2, 1.0, one, 1, one, 2, 0.0, one, 2)
    with pytest.raises(ValueError, match="ldb"):
        _C.sgemm(False, True, 2, 2, 2, 1.0, one, 2, one, 1, 0.0, one, 2)
    with pytest.raises(ValueError, match="ldc"):
        _C.sgemm(False, False, 2, 2, 2, 1.0, one, 2, one, 2, 0.0, one, 1)
    with pytest.raises(ValueError, match="must not be NULL"):
        _C.sgemm(False, False, 2, 2, 2, 1.0, None, 2, one, 2, 0.0, one, 2)


# ---- bad input through ops.sgemm ---------------------------------------------------

A = np.ones((3, 4), np.float32)
B = np.ones((4, 5), np.float32)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(a=A.astype(np.int32), b=B), TypeError, "a must be a float32 array"),
    (dict(a=A, b=B.astype(bool)), TypeError, "b must be a float32 array"),
    (dict(a=A.tolist(), b=B), TypeError, "a must be a numpy.ndarray"),
    (dict(a=A, b=B.tolist()), TypeError, "b must be a numpy.ndarray"),
    (dict(a=np.ones(4, np.float32), b=B), ValueError, "a must be 2-D"),
    (dict(a=A, b=np.ones((1, 4, 5), np.float32)), ValueError, "b must be 2-D"),
    (dict(a=A, b=np.ones((3, 5), np.float32)), ValueError, "inner dimensions differ"),
    (dict(a=A, b=B, trans_a=True), ValueError, "inner dimensions differ"),
    (dict(a=A, b=B, trans_a=1), TypeError, "trans_a must be a bool"),
    (dict(a=A, b=B, trans_b="no"), TypeError, "trans_b must be a bool"),
    (dict(a=A, b=B, alpha="2"), TypeError, "alpha must be a real number"),
    (dict(a=A, b=B, alpha=np.nan), ValueError, "alpha"),
    (dict(a=A, b=B, beta=1.0), ValueError, "beta != 0 needs out"),
    (dict(a=A, b=B, out=np.empty((5, 3), np.float32)), ValueError, r"out must have shape \(3, 5\)"),
    (dict(a=A, b=B, out=np.empty((3, 5))), TypeError, "out must be a float32 array"),
    (dict(a=A, b=B, out=np.empty((3, 5), np.float32).tolist()), TypeError, "out must be a numpy"),
    (dict(a=A, b=B, out=np.empty((5, 3), np.float32).T), ValueError, "out must be C-contiguous"),
])
def test_sgemm_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ops.sgemm(**kwargs)


def test_sgemm_read_only_or_overlapping_out():
    out = np.empty((3, 5), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writable"):
        ops.sgemm(A, B, out=out)
    sq = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="must not overlap"):
        ops.sgemm(sq, np.ones((4, 4), np.float32), out=sq)


@pytest.mark.parametrize("a,exc,match", [
    (np.ones(6), ValueError, "expected float32 data, got float64"),
    (np.ones((2, 3), np.float32), ValueError, r"1-D C-contiguous array, got shape \(2, 3\)"),
    (np.ones(12, np.float32)[::2], ValueError, "1-D C-contiguous"),
    (bytearray(24), TypeError, "expected a NumPy array, got bytearray"),
])
def test_binding_checks_arrays(a, exc, match):
    """The bindings take the data pointer from the array itself, after checking its
    type, dimensions and layout."""
    b, c = np.ones(6, np.float32), np.zeros(4, np.float32)
    with pytest.raises(exc, match=match):
        _C.sgemm(False, False, 2, 2, 3, 1.0, a, 3, b, 2, 0.0, c, 2)
    c.flags.writeable = False
    with pytest.raises(ValueError, match="output array is read-only"):
        _C.sgemm(False, False, 2, 2, 3, 1.0, np.ones(6, np.float32), 3, b, 2, 0.0, c, 2)
    c = np.zeros(4, np.float32)
    _C.sgemm(False, False, 2, 2, 3, 1.0, np.ones(6, np.float32), 3, b, 2, 0.0, c, 2)
    np.testing.assert_array_equal(c, 3.0)
