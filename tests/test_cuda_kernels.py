"""Every CUDA kernel, forward and backward, against the CPU kernel on the same
float32 inputs.  Needs pycuda, the minidl._cuda extension and a GPU; skipped
otherwise.

The inputs are uploaded with pycuda in the device's primary context (the one
the CUDA runtime inside libminidl_cuda uses), the _cuda function runs on the
default stream, and the download (synchronous) is compared with minidl.ops /
minidl._C.  Error measure: helpers.rel_err (max abs difference over the
largest reference value, or over the size of the terms a result sums where
they can cancel: BatchNorm's dx); tolerances in one table.  Dropout masks, ReLU
and add must match bit for bit, except that a NaN matches any NaN (the GPU
writes its canonical NaN, not the payload of the NaN it read).
"""
import numpy as np
import pytest

from minidl import _C, ops

from helpers import rel_err

drv = pytest.importorskip("pycuda.driver", reason="pycuda is not installed (pip install .[cuda])")
cuda = pytest.importorskip("minidl._cuda", reason="minidl was built without nvcc")

# GPU result against the CPU result on the same float32 inputs (both round; the
# GPU sums in another order).
TOL = {
    "exact": 0.0,          # relu, add, dropout, the pool gradients' gathers of single values
    "elementwise": 1e-6,   # one or two roundings per element (FMA contraction)
    "reduction": 1e-5,     # pools, global average, bias gradients
    "gemm": 2e-5,          # dot products of length up to ~2000
    "conv": 2e-5,
    "batch_norm": 5e-5,    # statistics, then normalisation and its backward
    "loss": 1e-5,
    "optim": 1e-5,
    "chain": 1e-4,         # a convolution, BatchNorm statistics, then a second convolution
}


def check(got, want, kind, what="", scale=1e-3):
    """`scale`: the error's denominator when the reference's largest value is smaller."""
    if TOL[kind] == 0.0:
        g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
        differ = (g.view(np.uint32) != w.view(np.uint32)) & ~(np.isnan(g) & np.isnan(w))
        assert not differ.any(), f"{what}: not bit-identical ({int(differ.sum())} differ)"
        return
    err = rel_err(got, want, scale)
    assert err <= TOL[kind], f"{what or kind}: relative error {err:.3g} > {TOL[kind]:g}"


def dx_scale(gamma, invstd, dy):
    """The largest term BatchNorm's dx sums (gamma * invstd * dy and its means): dx
    cancels far below it where a channel holds few values (to zero for two), so its
    error is measured against that term."""
    return float(np.max(np.abs(gamma * invstd)[:, None] * np.abs(dy)))


class Gpu:
    """Device buffers for one test: up() copies an array in, empty() allocates, down()
    copies out; every call is followed by synchronize() so kernel errors surface there."""

    def __init__(self):
        self.keep = []

    def _alloc(self, nbytes):
        buf = drv.mem_alloc(max(int(nbytes), 4))
        self.keep.append(buf)
        return buf

    def up(self, a):
        a = np.ascontiguousarray(a)
        buf = self._alloc(a.nbytes)
        if a.nbytes:
            drv.memcpy_htod(buf, a)
        return int(buf)

    def empty(self, shape, dtype=np.float32, fill=np.nan):
        """A buffer pre-filled with NaN, so that an element a kernel forgets shows up."""
        return self.up(np.full(shape, fill, dtype))

    def down(self, ptr, shape, dtype=np.float32):
        out = np.empty(shape, dtype)
        if out.nbytes:
            drv.memcpy_dtoh(out, ptr)
        return out

    def ws(self, nbytes):
        return (int(self._alloc(nbytes)), nbytes) if nbytes else (0, 0)


@pytest.fixture(scope="module")
def context():
    if cuda.device_count() == 0:
        pytest.skip("no CUDA device")
    drv.init()
    ctx = drv.Device(0).retain_primary_context()
    ctx.push()
    yield ctx
    drv.Context.pop()


@pytest.fixture
def gpu(context):
    g = Gpu()
    yield g
    cuda.synchronize()
    g.keep.clear()


def run(fn, *args, **kw):
    fn(*args, **kw)
    cuda.synchronize()


@pytest.fixture
def rng(request):
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- SGEMM --------------------------------------------------------------------------------

GEMM_SHAPES = [(1, 1, 1), (7, 13, 5), (33, 65, 17), (128, 128, 64), (300, 257, 129),
               (5, 1000, 3), (2100, 2100, 40), (64, 48, 0)]


@pytest.mark.parametrize("m, n, k", GEMM_SHAPES)
@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_sgemm(gpu, rng, m, n, k, trans_a, trans_b, beta):
    pad = 3  # leading dimensions larger than the rows
    a = f32(rng, *((k, m + pad) if trans_a else (m, k + pad)))
    b = f32(rng, *((n, k + pad) if trans_b else (k, n + pad)))
    c = f32(rng, m, n + pad)
    lda, ldb, ldc = a.shape[1], b.shape[1], c.shape[1]
    want = c.copy()
    _C.sgemm(trans_a, trans_b, m, n, k, 1.5, a.reshape(-1), lda, b.reshape(-1), ldb, beta,
             want.reshape(-1), ldc)
    pc = gpu.up(c)
    run(cuda.sgemm, trans_a, trans_b, m, n, k, 1.5, gpu.up(a), lda, gpu.up(b), ldb, beta, pc, ldc)
    got = gpu.down(pc, c.shape)
    check(got[:, :n], want[:, :n], "gemm", "C")
    check(got[:, n:], c[:, n:], "exact", "C beyond n (untouched)")


def test_sgemm_beta_zero_ignores_nan(gpu, rng):
    a, b = f32(rng, 9, 4), f32(rng, 4, 6)
    pc = gpu.empty((9, 6))  # NaN: beta == 0 must not read it
    run(cuda.sgemm, 0, 0, 9, 6, 4, 1.0, gpu.up(a), 4, gpu.up(b), 6, 0.0, pc, 6)
    check(gpu.down(pc, (9, 6)), a @ b, "gemm")


def test_sgemm_alpha_zero_reads_neither_a_nor_b(gpu, rng):
    c = f32(rng, 9, 6)
    pc = gpu.up(c)
    nan = gpu.empty((9, 4))  # NaN: alpha == 0 must not read A or B
    run(cuda.sgemm, 0, 0, 9, 6, 4, 0.0, nan, 4, nan, 6, 0.5, pc, 6)
    check(gpu.down(pc, (9, 6)), 0.5 * c, "exact", "C")


# ---- convolution ----------------------------------------------------------------------------

# (n, c_in, h, w, c_out, kh, kw, stride, padding)
CONV_SHAPES = [
    (1, 1, 1, 1, 1, 1, 1, 1, 0),
    (2, 3, 7, 5, 4, 3, 3, 1, 1),
    (3, 5, 9, 9, 7, 3, 3, 2, 1),
    (1, 16, 8, 8, 33, 1, 1, 1, 0),
    (4, 3, 11, 13, 5, 5, 5, 2, 2),
    (2, 6, 10, 10, 20, 3, 2, (2, 1), (0, 1)),
    (8, 40, 12, 12, 70, 3, 3, 1, 1),
    (64, 16, 16, 16, 16, 3, 3, 1, 1),      # long n*h*w: split-K weight gradient
    (16, 8, 32, 32, 256, 3, 3, 1, 1),      # 128 x 128 tiles
    (5, 3, 32, 32, 32, 5, 5, 1, 2),        # cifar10_quick's first layer
]


def conv_case(rng, n, c_in, h, w, c_out, kh, kw, stride, padding):
    sh, sw = stride if isinstance(stride, tuple) else (stride, stride)
    ph, pw = padding if isinstance(padding, tuple) else (padding, padding)
    shape = (n, c_in, h, w, c_out, kh, kw, sh, sw, ph, pw)
    ho, wo = _C.conv2d_output_size(shape)
    x, wt, bias = f32(rng, n, c_in, h, w), f32(rng, c_out, c_in, kh, kw), f32(rng, c_out)
    dy = f32(rng, n, c_out, ho, wo)
    return shape, (ho, wo), x, wt, bias, dy, dict(stride=(sh, sw), padding=(ph, pw))


@pytest.mark.parametrize("case", CONV_SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv2d_forward(gpu, rng, case, with_bias):
    shape, (ho, wo), x, wt, bias, _, kw = conv_case(rng, *case)
    want = ops.conv2d(x, wt, bias if with_bias else None, **kw)
    py = gpu.empty(want.shape)
    run(cuda.conv2d_forward, shape, gpu.up(x), gpu.up(wt), gpu.up(bias) if with_bias else 0, py)
    check(gpu.down(py, want.shape), want, "conv", "y")


def test_conv2d_relu_keeps_nan(gpu, rng):
    """The ReLU in the store keeps NaN, as the CPU's does (max(NaN, 0) is NaN): NaN in
    the outputs whose windows hold the NaN input, as the CPU's GEMM path gives them
    (its Winograd spreads it over the 4 x 4 output tile)."""
    shape, (ho, wo), x, wt, bias, _, kw = conv_case(rng, 2, 8, 6, 6, 16, 3, 3, 1, 1)
    x[0, 1, 2, 2] = np.nan
    _C.set_conv_algo("gemm")
    try:
        want = ops.conv2d(x, wt, bias, relu=True, **kw)
    finally:
        _C.set_conv_algo("auto")
    py = gpu.empty(want.shape)
    run(cuda.conv2d_forward_ex, shape, gpu.up(x), gpu.up(wt), gpu.up(bias), True, 0, 0, py)
    got, nan = gpu.down(py, want.shape), np.isnan(want)
    assert nan.any() and not nan.all()
    np.testing.assert_array_equal(np.isnan(got), nan)
    check(got[~nan], want[~nan], "conv", "relu(y) beside the NaN")


@pytest.mark.parametrize("case", CONV_SHAPES)
def test_conv2d_forward_epilogue(gpu, rng, case):
    """bias + ReLU in the store and the float64 channel sums, against the CPU kernel: with
    the workspace the sums of each tile in the kernel's epilogue (the same bits when run
    again), without it a pass over y."""
    shape, (ho, wo), x, wt, bias, _, kw = conv_case(rng, *case)
    c_out = wt.shape[0]
    want = np.empty((x.shape[0], c_out, ho, wo), np.float32)
    want_s, want_q = np.empty(c_out), np.empty(c_out)
    _C.conv2d_forward_ex(shape, x.ravel(), wt.ravel(), bias, True, want_s, want_q, want.ravel())
    scale = np.sqrt(want.size / c_out) * max(np.abs(want).max(), 1.0)
    ws, ws_bytes = gpu.ws(cuda.conv2d_workspace_size(shape))
    assert ws_bytes >= 16 * c_out  # at least one tile's pair of doubles a channel
    sums = {}
    for how, args in (("epilogue", (ws, ws_bytes)), ("epilogue again", (ws, ws_bytes)),
                      ("pass", ())):
        py, ps, pq = (gpu.empty(want.shape), gpu.empty(c_out, np.float64),
                      gpu.empty(c_out, np.float64))
        run(cuda.conv2d_forward_ex, shape, gpu.up(x), gpu.up(wt), gpu.up(bias), True, ps, pq, py,
            *args)
        check(gpu.down(py, want.shape), want, "conv", f"relu(y), {how}")
        sums[how] = gpu.down(ps, c_out, np.float64), gpu.down(pq, c_out, np.float64)
        assert np.allclose(sums[how][0], want_s, rtol=1e-5, atol=1e-5 * scale), how
        assert np.allclose(sums[how][1], want_q, rtol=1e-5, atol=1e-5 * scale ** 2), how
    for a, b in zip(sums["epilogue"], sums["epilogue again"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", [(2, 8, 9, 7, 16, 3, 3, 1, 1), (3, 16, 12, 12, 40, 1, 1, 1, 0)])
def test_conv2d_channel_sums_far_from_zero(gpu, rng, case):
    """The channel sums in double (the tiles' in the epilogue, into a workspace 4 bytes
    off an 8-byte boundary, and the pass over y): outputs whose mean is hundreds of
    times their spread give the variance of the float64 outputs (float sums lost up to
    a fifth of it at 1000 times)."""
    shape, (ho, wo), x, wt, _, _, _ = conv_case(rng, *case)
    wt *= 0.1
    c_out = wt.shape[0]
    bias = np.full(c_out, 1000.0, np.float32)
    need = cuda.conv2d_workspace_size(shape)
    ws, _ = gpu.ws(need + 4)
    for args in ((ws + 4, need), ()):
        py, ps, pq = (gpu.empty((x.shape[0], c_out, ho, wo)), gpu.empty(c_out, np.float64),
                      gpu.empty(c_out, np.float64))
        run(cuda.conv2d_forward_ex, shape, gpu.up(x), gpu.up(wt), gpu.up(bias), False, ps, pq,
            py, *args)
        y = gpu.down(py, (x.shape[0], c_out, ho, wo)).astype(np.float64)
        s, q = gpu.down(ps, c_out, np.float64), gpu.down(pq, c_out, np.float64)
        count = y.size // c_out
        var = y.var(axis=(0, 2, 3))
        assert np.all(y.mean(axis=(0, 2, 3)) > 300 * np.sqrt(var))
        np.testing.assert_allclose(s / count, y.mean(axis=(0, 2, 3)), rtol=1e-12)
        np.testing.assert_allclose(q / count - (s / count) ** 2, var, rtol=1e-6)


@pytest.mark.parametrize("case", CONV_SHAPES)
def test_conv2d_backward(gpu, rng, case):
    shape, _, x, wt, bias, dy, kw = conv_case(rng, *case)
    want_dx, want_dw, want_db = ops.conv2d_backward(x, wt, dy, **kw)
    px, pw, pdy = gpu.up(x), gpu.up(wt), gpu.up(dy)
    pdx = gpu.empty(x.shape)
    run(cuda.conv2d_backward_data, shape, pdy, pw, pdx)
    check(gpu.down(pdx, x.shape), want_dx, "conv", "dx")

    ws, ws_bytes = gpu.ws(cuda.conv2d_workspace_size(shape))
    for use_ws in (True, False):  # split-K with partial sums in the workspace, or one pass
        args = (ws, ws_bytes) if use_ws else ()
        pdw = gpu.empty(wt.shape)
        run(cuda.conv2d_backward_weights, shape, px, pdy, pdw, False, *args)
        check(gpu.down(pdw, wt.shape), want_dw, "conv", f"dw (workspace {use_ws})")
        start = f32(rng, *wt.shape)
        pdw = gpu.up(start)
        run(cuda.conv2d_backward_weights, shape, px, pdy, pdw, True, *args)
        check(gpu.down(pdw, wt.shape), start + want_dw, "conv", f"dw += (workspace {use_ws})")

    pdb = gpu.empty(bias.shape)
    run(cuda.conv2d_backward_bias, shape, pdy, pdb, False)
    check(gpu.down(pdb, bias.shape), want_db, "reduction", "db")
    pdb = gpu.up(bias)
    run(cuda.conv2d_backward_bias, shape, pdy, pdb, True)
    check(gpu.down(pdb, bias.shape), bias + want_db, "reduction", "db +=")


def test_conv2d_weight_gradient_is_reproducible(gpu, rng):
    shape, _, x, wt, _, dy, _ = conv_case(rng, *CONV_SHAPES[7])
    ws, ws_bytes = gpu.ws(cuda.conv2d_workspace_size(shape))
    px, pdy, pdw = gpu.up(x), gpu.up(dy), gpu.empty(wt.shape)
    outs = []
    for _ in range(2):
        run(cuda.conv2d_backward_weights, shape, px, pdy, pdw, False, ws, ws_bytes)
        outs.append(gpu.down(pdw, wt.shape))
    check(outs[1], outs[0], "exact", "dw run twice")


# ---- pooling ---------------------------------------------------------------------------------

# (n, c, h, w, kernel, stride, padding, ceil_mode)
POOL_SHAPES = [
    (1, 1, 1, 1, 1, 1, 0, False),
    (2, 3, 7, 7, 3, 2, 1, True),
    (2, 3, 8, 8, 2, 2, 0, False),
    (1, 5, 9, 11, 3, 2, 0, True),
    (3, 2, 6, 5, (3, 2), (2, 1), (1, 0), True),
    (2, 33, 32, 32, 3, 2, 0, True),    # cifar10_quick's pools
    (1, 2, 10, 10, 3, 1, 1, False),    # overlapping windows
]


def pool_case(n, c, h, w, kernel, stride, padding, ceil_mode):
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    sh, sw = stride if isinstance(stride, tuple) else (stride, stride)
    ph, pw = padding if isinstance(padding, tuple) else (padding, padding)
    shape = (n, c, h, w, kh, kw, sh, sw, ph, pw, int(ceil_mode))
    return shape, _C.pool2d_output_size(shape), dict(kernel_size=(kh, kw), stride=(sh, sw),
                                                     padding=(ph, pw), ceil_mode=ceil_mode)


@pytest.mark.parametrize("case", POOL_SHAPES)
@pytest.mark.parametrize("ties", [False, True])
def test_max_pool2d(gpu, rng, case, ties):
    shape, (ho, wo), kw = pool_case(*case)
    n, c, h, w = case[:4]
    # ties: few distinct values, so windows often hold several maxima (the first wins)
    x = rng.integers(0, 3, (n, c, h, w)).astype(np.float32) if ties else f32(rng, n, c, h, w)
    dy = f32(rng, n, c, ho, wo)
    px, pdy = gpu.up(x), gpu.up(dy)
    py, pdx = gpu.empty((n, c, ho, wo)), gpu.empty(x.shape)
    run(cuda.max_pool2d_forward, shape, px, py)
    check(gpu.down(py, (n, c, ho, wo)), ops.max_pool2d(x, **kw), "exact", "y")
    run(cuda.max_pool2d_backward, shape, px, pdy, pdx)
    check(gpu.down(pdx, x.shape), ops.max_pool2d_backward(x, dy, **kw), "reduction", "dx")


def test_max_pool2d_nan(gpu):
    shape, (ho, wo), kw = pool_case(1, 1, 4, 4, 2, 2, 0, False)
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    py = gpu.empty((1, 1, ho, wo), fill=0.0)
    run(cuda.max_pool2d_forward, shape, gpu.up(x), py)
    got, want = gpu.down(py, (1, 1, ho, wo)), ops.max_pool2d(x, **kw)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[0, 0, 0, 0])


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_conv2d_forward_pooled(gpu, rng, pool):
    """cifar10_quick's conv1 then pool1 then relu1 in one call, against the CPU's;
    without a workspace the call fails."""
    shape, (ho, wo), x, wt, bias, _, kw = conv_case(rng, 5, 3, 32, 32, 32, 5, 5, 1, 2)
    pshape = (5, 32, ho, wo, 3, 3, 2, 2, 0, 0, 1)
    pho, pwo = _C.pool2d_output_size(pshape)
    want = np.empty((5, 32, pho, pwo), np.float32)
    _C.conv2d_forward_pooled(shape, x.ravel(), wt.ravel(), bias, True, pshape, pool == "avg",
                             True, want.ravel())
    py = gpu.empty(want.shape)
    args = (shape, gpu.up(x), gpu.up(wt), gpu.up(bias), True, pshape, pool == "avg", True, py)
    with pytest.raises(ValueError, match="workspace has 0 bytes, needs"):
        cuda.conv2d_forward_pooled(*args)
    run(cuda.conv2d_forward_pooled, *args,
        *gpu.ws(cuda.conv2d_pooled_workspace_size(shape, pshape)))
    check(gpu.down(py, want.shape), want, "conv", "pooled y")


@pytest.mark.parametrize("case", POOL_SHAPES)
def test_avg_pool2d(gpu, rng, case):
    shape, (ho, wo), kw = pool_case(*case)
    n, c, h, w = case[:4]
    x, dy = f32(rng, n, c, h, w), f32(rng, n, c, ho, wo)
    py, pdx = gpu.empty((n, c, ho, wo)), gpu.empty(x.shape)
    run(cuda.avg_pool2d_forward, shape, gpu.up(x), py)
    check(gpu.down(py, (n, c, ho, wo)), ops.avg_pool2d(x, **kw), "reduction", "y")
    run(cuda.avg_pool2d_backward, shape, gpu.up(dy), pdx)
    check(gpu.down(pdx, x.shape), ops.avg_pool2d_backward(x, dy, **kw), "reduction", "dx")
    # with the mask of a ReLU before the pool (x its output): zero exactly where x <= 0
    a = np.maximum(x, 0)
    a.reshape(-1)[::3] = np.float32(-0.0)
    pda = gpu.empty(x.shape)
    run(cuda.avg_pool2d_backward, shape, gpu.up(dy), pda, gpu.up(a))
    got = gpu.down(pda, x.shape)
    assert np.array_equal(got == 0, ~(a > 0) | (ops.avg_pool2d_backward(x, dy, **kw) == 0))
    check(got, ops.avg_pool2d_backward(a, dy, **kw, relu=True), "reduction", "dx through a ReLU")


@pytest.mark.parametrize("k", [65536, 65537])
def test_avg_pool2d_divides_by_windows_over_2_to_the_32(gpu, rng, k):
    """A window's size, padding counted, is a 64-bit product: one pixel under a k x k
    window (2^32 wrapped to 0, and 65537^2 to 131073, in 32 bits)"""
    shape, (ho, wo), kw = pool_case(1, 1, 1, 1, k, 1, k // 2, False)
    x, dy = f32(rng, 1, 1, 1, 1), f32(rng, 1, 1, ho, wo)
    py, pdx = gpu.empty((1, 1, ho, wo)), gpu.empty((1, 1, 1, 1))
    run(cuda.avg_pool2d_forward, shape, gpu.up(x), py)
    run(cuda.avg_pool2d_backward, shape, gpu.up(dy), pdx)
    check(gpu.down(py, (1, 1, ho, wo)), ops.avg_pool2d(x, **kw), "reduction", "y")
    check(gpu.down(pdx, (1, 1, 1, 1)), ops.avg_pool2d_backward(x, dy, **kw), "reduction", "dx")


@pytest.mark.parametrize("n, c, h, w", [(1, 1, 1, 1), (2, 3, 8, 8), (5, 7, 3, 5), (128, 64, 8, 8),
                                        (1, 2, 100, 90)])
def test_global_avg_pool2d(gpu, rng, n, c, h, w):
    x, dy = f32(rng, n, c, h, w), f32(rng, n, c)
    py, pdx = gpu.empty((n, c)), gpu.empty(x.shape)
    run(cuda.global_avg_pool2d_forward, n, c, h, w, gpu.up(x), py)
    check(gpu.down(py, (n, c)), ops.global_avg_pool2d(x), "reduction", "y")
    run(cuda.global_avg_pool2d_backward, n, c, h, w, gpu.up(dy), pdx)
    check(gpu.down(pdx, x.shape), ops.global_avg_pool2d_backward(x, dy), "exact", "dx")


# ---- elementwise -----------------------------------------------------------------------------

COUNTS = [1, 7, 1000, 100003]


@pytest.mark.parametrize("count", COUNTS)
def test_relu_and_add(gpu, rng, count):
    x, dy, b = f32(rng, count), f32(rng, count), f32(rng, count)
    x[::5] = 0.0
    if count > 2:
        x[1] = np.nan
    px = gpu.up(x)
    py, pdx, ps = gpu.empty(count), gpu.empty(count), gpu.empty(count)
    run(cuda.relu_forward, px, py, count)
    check(gpu.down(py, count), ops.relu(x), "exact", "relu")
    run(cuda.relu_backward, px, gpu.up(dy), pdx, count)
    check(gpu.down(pdx, count), ops.relu_backward(x, dy), "exact", "relu backward")
    run(cuda.add, px, gpu.up(b), ps, count)
    check(gpu.down(ps, count), ops.add(x, b), "exact", "add")


def test_relu_in_place(gpu, rng):
    x = f32(rng, 513)
    px = gpu.up(x)
    run(cuda.relu_forward, px, px, 513)
    check(gpu.down(px, 513), ops.relu(x), "exact")


def test_on_a_stream(gpu, rng):
    """Kernels run on the stream they are given (a pycuda Stream's handle)."""
    stream = drv.Stream()
    x, w = f32(rng, 4, 3, 9, 9), f32(rng, 5, 3, 3, 3)
    shape = (4, 3, 9, 9, 5, 3, 3, 1, 1, 1, 1)
    px, py, pz = gpu.up(x), gpu.empty((4, 5, 9, 9)), gpu.empty((4, 5, 9, 9))
    cuda.conv2d_forward(shape, px, gpu.up(w), 0, py, stream=stream.handle)
    cuda.relu_forward(py, pz, 4 * 5 * 81, stream=stream.handle)
    stream.synchronize()
    check(gpu.down(pz, (4, 5, 9, 9)), ops.relu(ops.conv2d(x, w, padding=1)), "conv")


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 12345, 2**63 + 7])
def test_dropout_bit_identical(gpu, rng, count, p, seed):
    x, dy = f32(rng, count), f32(rng, count)
    py, pdx = gpu.empty(count), gpu.empty(count)
    run(cuda.dropout_forward, p, seed, gpu.up(x), py, count)
    check(gpu.down(py, count), ops.dropout(x, p, seed=seed), "exact", "dropout")
    run(cuda.dropout_backward, p, seed, gpu.up(dy), pdx, count)
    check(gpu.down(pdx, count), ops.dropout_backward(dy, p, seed=seed), "exact", "dropout backward")


# ---- batch norm ------------------------------------------------------------------------------

BN_SHAPES = [(2, 3, 1), (1, 4, 7), (8, 16, 64), (3, 5, 33), (64, 70, 1), (128, 16, 1024)]


@pytest.mark.parametrize("n, c, hw", BN_SHAPES)
@pytest.mark.parametrize("offset", [0.0, 100.0])  # |mean| >> std: the shifted sums matter
def test_batch_norm(gpu, rng, n, c, hw, offset):
    x = f32(rng, n, c, hw) + np.float32(offset)
    gamma, beta, dy = f32(rng, c), f32(rng, c), f32(rng, n, c, hw)
    rm0, rv0 = f32(rng, c), np.abs(f32(rng, c)) + 0.5
    rm, rv = rm0.copy(), rv0.copy()
    y, mean, invstd = ops.batch_norm(x, gamma, beta, training=True, running_mean=rm,
                                     running_var=rv, momentum=0.1, eps=1e-5)
    px, pg, pb = gpu.up(x), gpu.up(gamma), gpu.up(beta)
    prm, prv = gpu.up(rm0), gpu.up(rv0)
    py, pmean, pinv = gpu.empty(x.shape), gpu.empty(c), gpu.empty(c)
    run(cuda.batch_norm_forward_train, n, c, hw, px, pg, pb, 1e-5, 0.1, prm, prv, py, pmean, pinv)
    check(gpu.down(py, x.shape), y, "batch_norm", "y")
    check(gpu.down(pmean, c), mean, "batch_norm", "mean")
    check(gpu.down(pinv, c), invstd, "batch_norm", "invstd")
    check(gpu.down(prm, c), rm, "batch_norm", "running_mean")
    check(gpu.down(prv, c), rv, "batch_norm", "running_var")
    # without running statistics
    py2 = gpu.empty(x.shape)
    run(cuda.batch_norm_forward_train, n, c, hw, px, pg, pb, 1e-5, 0.1, 0, 0, py2, pmean, pinv)
    check(gpu.down(py2, x.shape), y, "batch_norm", "y (no running stats)")

    # inference with the updated running statistics
    want, _, _ = ops.batch_norm(x, gamma, beta, training=False, running_mean=rm, running_var=rv)
    pyi = gpu.empty(x.shape)
    run(cuda.batch_norm_forward_infer, n, c, hw, px, pg, pb, gpu.up(rm), gpu.up(rv), 1e-5, pyi)
    check(gpu.down(pyi, x.shape), want, "batch_norm", "y (inference)")

    # backward from the CPU's saved statistics, = and +=
    dx, dgamma, dbeta = ops.batch_norm_backward(x, gamma, dy, mean, invstd)
    pdx = gpu.empty(x.shape)
    g0, b0 = f32(rng, c), f32(rng, c)
    for accumulate in (False, True):
        pdg, pdb = gpu.up(g0), gpu.up(b0)
        run(cuda.batch_norm_backward, n, c, hw, px, pg, gpu.up(dy), gpu.up(mean), gpu.up(invstd),
            pdx, pdg, pdb, accumulate)
        check(gpu.down(pdx, x.shape), dx, "batch_norm", "dx", dx_scale(gamma, invstd, dy))
        check(gpu.down(pdg, c), dgamma + (g0 if accumulate else 0), "batch_norm", "dgamma")
        check(gpu.down(pdb, c), dbeta + (b0 if accumulate else 0), "batch_norm", "dbeta")


# ---- fused kernels: a BatchNorm's map (and the ReLU after it) applied as operands are read ---

# (n, c_in, h, w, c_out, kh, kw, stride, padding)
FUSED_CONV_SHAPES = [
    (2, 3, 7, 5, 4, 3, 3, 1, 1),
    (3, 5, 9, 9, 7, 3, 3, 2, 1),           # stride 2, padding 1
    (1, 16, 8, 8, 33, 1, 1, 1, 0),         # 1x1
    (2, 6, 10, 10, 20, 3, 2, (2, 1), (0, 1)),
    (64, 16, 16, 16, 16, 3, 3, 1, 1),      # long n*h*w: split-K weight gradient
    (16, 8, 32, 32, 256, 3, 3, 1, 1),      # 128 x 128 tiles
]

# How an operand is read: as it is (a NULL map), through scale and shift, that and a ReLU,
# or a ReLU alone (scale and shift NULL).
MAPS = ["none", "affine", "affine+relu", "relu"]


def affine_map(rng, kind, c):
    """(scale, shift, relu) for an operand of c channels read the `kind` way (None: NULL)."""
    if kind in ("none", "relu"):
        return None, None, kind == "relu"
    scale = (rng.uniform(0.5, 2.0, c) * rng.choice([-1.0, 1.0], c)).astype(np.float32)
    return scale, f32(rng, c), kind == "affine+relu"


def mapped(a, scale, shift, relu):
    """a (n, c, ...) read through the map, in float64."""
    v = a.astype(np.float64)
    if scale is not None:
        bc = (1, -1) + (1,) * (a.ndim - 2)
        v = v * scale.reshape(bc) + shift.reshape(bc)
    return np.maximum(v, 0.0) if relu else v


def dev(gpu, a):
    """a copied to the device, or 0 (NULL) for None."""
    return 0 if a is None else gpu.up(a)


@pytest.mark.parametrize("case", FUSED_CONV_SHAPES)
@pytest.mark.parametrize("kind", MAPS)
@pytest.mark.parametrize("relu", [False, True])
def test_conv2d_forward_fused(gpu, rng, case, kind, relu):
    """Against _C's fused forward, and against the plain forward of the input mapped
    beforehand: the map applies to real pixels only (the shift is large, so a mapped
    padding would show at the borders)."""
    shape, (ho, wo), x, wt, bias, _, _ = conv_case(rng, *case)
    n, c_in, c_out = x.shape[0], x.shape[1], wt.shape[0]
    scale, shift, in_relu = affine_map(rng, kind, c_in)
    if shift is not None:
        shift += np.float32(3.0)
    b = bias if relu else None
    want = np.empty((n, c_out, ho, wo), np.float32)
    want_s, want_q = np.empty(c_out), np.empty(c_out)
    _C.conv2d_forward_fused(shape, x.ravel(), scale, shift, in_relu, wt.ravel(), b, relu,
                            want_s, want_q, want.ravel())
    py, ps, pq = gpu.empty(want.shape), gpu.empty(c_out, np.float64), gpu.empty(c_out, np.float64)
    ws, ws_bytes = gpu.ws(cuda.conv2d_workspace_size(shape))  # the plain convolution's size
    run(cuda.conv2d_forward_fused, shape, gpu.up(x), dev(gpu, scale), dev(gpu, shift), in_relu,
        gpu.up(wt), dev(gpu, b), relu, ps, pq, py, ws, ws_bytes)
    got = gpu.down(py, want.shape)
    check(got, want, "conv", "y")
    mag = np.sqrt(want.size / c_out) * max(np.abs(want).max(), 1.0)
    assert np.allclose(gpu.down(ps, c_out, np.float64), want_s, rtol=1e-5, atol=1e-5 * mag)
    assert np.allclose(gpu.down(pq, c_out, np.float64), want_q, rtol=1e-5, atol=1e-5 * mag ** 2)

    pz = gpu.empty(want.shape)
    xm = mapped(x, scale, shift, in_relu).astype(np.float32)
    run(cuda.conv2d_forward_ex, shape, gpu.up(xm), gpu.up(wt), dev(gpu, b), relu, 0, 0, pz)
    check(got, gpu.down(pz, want.shape), "conv", "y against the input mapped first")


@pytest.mark.parametrize("case", FUSED_CONV_SHAPES)
@pytest.mark.parametrize("kind", MAPS)
def test_conv2d_backward_weights_fused(gpu, rng, case, kind):
    """= and +=, with the workspace (split-K where the shape splits) and without, against
    _C and against the plain weight gradient of the input mapped beforehand."""
    shape, _, x, wt, _, dy, _ = conv_case(rng, *case)
    scale, shift, in_relu = affine_map(rng, kind, x.shape[1])
    if shift is not None:
        shift += np.float32(3.0)
    px, pdy, psc, psh = gpu.up(x), gpu.up(dy), dev(gpu, scale), dev(gpu, shift)
    pxm = gpu.up(mapped(x, scale, shift, in_relu).astype(np.float32))
    ws, ws_bytes = gpu.ws(cuda.conv2d_workspace_size(shape))
    start = f32(rng, *wt.shape)
    for accumulate in (False, True):
        want = start.copy()
        _C.conv2d_backward_weights_fused(shape, x.ravel(), scale, shift, in_relu, dy.ravel(),
                                         want.ravel(), accumulate)
        for use_ws in (True, False):
            args = (ws, ws_bytes) if use_ws else ()
            what = f"dw {'+=' if accumulate else '='} (workspace {use_ws})"
            pdw = gpu.up(start) if accumulate else gpu.empty(wt.shape)
            run(cuda.conv2d_backward_weights_fused, shape, px, psc, psh, in_relu, pdy, pdw,
                accumulate, *args)
            got = gpu.down(pdw, wt.shape)
            check(got, want, "conv", what)
            pref = gpu.up(start) if accumulate else gpu.empty(wt.shape)
            run(cuda.conv2d_backward_weights, shape, pxm, pdy, pref, accumulate, *args)
            check(got, gpu.down(pref, wt.shape), "conv", what + " against the input mapped first")


# (n, c_in, h, w, c_out, kh, kw, stride, padding)
BACKWARD_DATA_FUSED_SHAPES = [
    (2, 3, 7, 5, 4, 3, 3, 1, 1),           # stride 1, padding 1
    (3, 5, 9, 9, 7, 3, 3, 2, 1),           # stride 2, padding 1
    (4, 3, 11, 13, 5, 5, 5, 2, 2),         # stride 2, 5x5
    (1, 16, 8, 8, 33, 1, 1, 1, 0),         # 1x1
    (8, 40, 12, 12, 70, 3, 3, 1, 1),       # c_in > 32: 64 x 64 tiles
]


@pytest.mark.parametrize("case", BACKWARD_DATA_FUSED_SHAPES)
def test_conv2d_backward_data_fused(gpu, rng, case):
    """dx = and += conv_transpose(dy, w) against _C's fused kernel, and bit for bit against
    the plain backward_data: = is its result, += is the start plus its result (the whole
    sum added once, in the store)."""
    shape, _, x, wt, _, dy, _ = conv_case(rng, *case)
    pw, pdy = gpu.up(wt), gpu.up(dy)
    ws, ws_bytes = gpu.ws(cuda.conv2d_workspace_size(shape))
    pplain = gpu.empty(x.shape)
    run(cuda.conv2d_backward_data, shape, pdy, pw, pplain)
    plain = gpu.down(pplain, x.shape)
    start = f32(rng, *x.shape)
    for accumulate in (False, True):
        want = start.copy()
        _C.conv2d_backward_data_fused(shape, dy.ravel(), wt.ravel(), want.ravel(), accumulate)
        for use_ws in (True, False):
            args = (ws, ws_bytes) if use_ws else ()
            what = f"dx {'+=' if accumulate else '='} (workspace {use_ws})"
            pdx = gpu.up(start) if accumulate else gpu.empty(x.shape)  # NaN: = must not read it
            run(cuda.conv2d_backward_data_fused, shape, pdy, pw, pdx, accumulate, *args)
            got = gpu.down(pdx, x.shape)
            check(got, want, "conv", what)
            check(got, start + plain if accumulate else plain, "exact",
                  what + " against the plain backward_data")


# (n, c, h, w, kernel, stride, padding, ceil_mode)
FUSED_POOL_SHAPES = [
    (2, 3, 8, 8, 2, 2, 0, False),          # kernel 2, stride 2
    (2, 4, 7, 9, 3, 2, 1, False),          # kernel 3, stride 2, padding 1
    (3, 5, 9, 11, 3, 2, 1, True),          # ceil mode, padding
    (2, 33, 32, 32, 3, 2, 0, True),        # cifar10_quick's pools (ceil mode)
    (1, 2, 10, 10, 3, 1, 1, False),        # overlapping windows
    (3, 2, 6, 5, (3, 2), (2, 1), (1, 0), True),
]


def premapped(gpu, px, x, psc, psh, in_relu):
    """in(x) on the device (affine_add with no b: the same map and fmaf as the fused kernels)."""
    n, c = x.shape[:2]
    pxm = gpu.empty(x.shape)
    run(cuda.affine_add, n, c, x[0, 0].size, px, psc, psh, in_relu, 0, 0, 0, False, False, pxm)
    return pxm


@pytest.mark.parametrize("case", FUSED_POOL_SHAPES)
@pytest.mark.parametrize("kind", MAPS)
def test_max_pool2d_fused(gpu, rng, case, kind):
    """Forward and backward against _C's fused pair, and bit for bit against the plain
    kernels on the input mapped beforehand.  With a ReLU about half of each window maps to
    0: ties, which the first maximum wins."""
    shape, (ho, wo), _ = pool_case(*case)
    n, c, h, w = case[:4]
    x, dy = f32(rng, n, c, h, w), f32(rng, n, c, ho, wo)
    scale, shift, in_relu = affine_map(rng, kind, c)
    want_y, want_dx = np.empty((n, c, ho, wo), np.float32), np.empty_like(x)
    _C.max_pool2d_forward_fused(shape, x.ravel(), scale, shift, in_relu, want_y.ravel())
    _C.max_pool2d_backward_fused(shape, x.ravel(), scale, shift, in_relu, dy.ravel(),
                                 want_dx.ravel())
    px, pdy, psc, psh = gpu.up(x), gpu.up(dy), dev(gpu, scale), dev(gpu, shift)
    py, pdx = gpu.empty(want_y.shape), gpu.empty(x.shape)
    run(cuda.max_pool2d_forward_fused, shape, px, psc, psh, in_relu, py)
    run(cuda.max_pool2d_backward_fused, shape, px, psc, psh, in_relu, pdy, pdx)
    got_y, got_dx = gpu.down(py, want_y.shape), gpu.down(pdx, x.shape)
    check(got_y, want_y, "exact", "y")
    check(got_dx, want_dx, "reduction", "dx")

    pxm = premapped(gpu, px, x, psc, psh, in_relu)
    pz, pdz = gpu.empty(want_y.shape), gpu.empty(x.shape)
    run(cuda.max_pool2d_forward, shape, pxm, pz)
    run(cuda.max_pool2d_backward, shape, pxm, pdy, pdz)
    check(got_y, gpu.down(pz, want_y.shape), "exact", "y against the input mapped first")
    check(got_dx, gpu.down(pdz, x.shape), "exact", "dx against the input mapped first")


@pytest.mark.parametrize("kind", ["relu", "affine+relu"])
def test_max_pool2d_fused_nan(gpu, rng, kind):
    """A NaN passes the map's ReLU and wins its windows (the plain kernel's rule)."""
    shape, (ho, wo), _ = pool_case(2, 3, 7, 7, 3, 2, 1, True)
    x, dy = f32(rng, 2, 3, 7, 7), f32(rng, 2, 3, ho, wo)
    x[0, 1, 2, 3] = x[1, 2, 0, 0] = x[1, 2, 6, 6] = np.nan
    scale, shift, in_relu = affine_map(rng, kind, 3)
    want_y, want_dx = np.empty((2, 3, ho, wo), np.float32), np.empty_like(x)
    _C.max_pool2d_forward_fused(shape, x.ravel(), scale, shift, in_relu, want_y.ravel())
    _C.max_pool2d_backward_fused(shape, x.ravel(), scale, shift, in_relu, dy.ravel(),
                                 want_dx.ravel())
    px, psc, psh = gpu.up(x), dev(gpu, scale), dev(gpu, shift)
    py, pdx = gpu.empty(want_y.shape, fill=0.0), gpu.empty(x.shape)
    run(cuda.max_pool2d_forward_fused, shape, px, psc, psh, in_relu, py)
    run(cuda.max_pool2d_backward_fused, shape, px, psc, psh, in_relu, gpu.up(dy), pdx)
    got_y = gpu.down(py, want_y.shape)
    nan = np.isnan(want_y)
    assert nan.any() and np.array_equal(np.isnan(got_y), nan)
    check(got_y[~nan], want_y[~nan], "exact", "y where not NaN")
    check(gpu.down(pdx, x.shape), want_dx, "reduction", "dx")


# the pools above, and windows of 256 elements (the most a one-byte tap can name)
ARGMAX_POOL_SHAPES = POOL_SHAPES + [(2, 3, 18, 17, 16, (1, 2), (8, 7), False)]


def max_pool_argmax_cpu(shape, x, scale, shift, in_relu, dy, relu=False):
    """_C's y and taps of x read through the map (a ReLU after the pool with relu), and
    its dx from those taps."""
    n, c = x.shape[:2]
    ho, wo = _C.pool2d_output_size(shape)
    y, tap = np.empty((n, c, ho, wo), np.float32), np.empty((n, c, ho, wo), np.uint8)
    dx = np.empty_like(x)
    _C.max_pool2d_forward_argmax(shape, x.ravel(), scale, shift, in_relu, y.ravel(), tap.ravel(),
                                 relu)
    _C.max_pool2d_backward_argmax(shape, tap.ravel(), dy.ravel(), dx.ravel())
    return y, tap, dx


@pytest.mark.parametrize("case", ARGMAX_POOL_SHAPES)
@pytest.mark.parametrize("ties", [False, True])
def test_max_pool2d_argmax(gpu, rng, case, ties):
    """y, the taps and dx from the taps bit for bit _C's, and dx that of the backward
    that finds the maxima in x again."""
    shape, (ho, wo), _ = pool_case(*case)
    n, c, h, w = case[:4]
    x = rng.integers(0, 3, (n, c, h, w)).astype(np.float32) if ties else f32(rng, n, c, h, w)
    dy = f32(rng, n, c, ho, wo)
    want_y, want_tap, want_dx = max_pool_argmax_cpu(shape, x, None, None, False, dy)
    px, pdy = gpu.up(x), gpu.up(dy)
    py, ptap = gpu.empty(want_y.shape), gpu.empty(want_tap.shape, np.uint8, fill=255)
    pdx, pdz = gpu.empty(x.shape), gpu.empty(x.shape)
    run(cuda.max_pool2d_forward_argmax, shape, px, 0, 0, False, py, ptap)
    np.testing.assert_array_equal(gpu.down(py, want_y.shape), want_y)
    np.testing.assert_array_equal(gpu.down(ptap, want_tap.shape, np.uint8), want_tap)
    run(cuda.max_pool2d_backward_argmax, shape, ptap, pdy, pdx)
    got_dx = gpu.down(pdx, x.shape)
    check(got_dx, want_dx, "exact", "dx")
    run(cuda.max_pool2d_backward, shape, px, pdy, pdz)
    check(got_dx, gpu.down(pdz, x.shape), "exact", "dx against the backward from x")


@pytest.mark.parametrize("case", POOL_SHAPES)
@pytest.mark.parametrize("kind", ["none", "affine"])
def test_max_pool2d_argmax_relu(gpu, rng, case, kind):
    """A ReLU after the pool: y, the taps (NO_TAP where y is not above 0, a NaN's window
    included) and dx from the taps bit for bit _C's."""
    shape, (ho, wo), _ = pool_case(*case)
    n, c, h, w = case[:4]
    x, dy = f32(rng, n, c, h, w) - 0.7, f32(rng, n, c, ho, wo)
    x[0, 0] = -np.abs(x[0, 0])
    x.reshape(-1)[-1] = np.nan
    scale, shift, in_relu = affine_map(rng, kind, c)
    want_y, want_tap, want_dx = max_pool_argmax_cpu(shape, x, scale, shift, in_relu, dy, True)
    assert (want_tap == 255).any()
    py, ptap = gpu.empty(want_y.shape), gpu.empty(want_tap.shape, np.uint8, fill=0)
    run(cuda.max_pool2d_forward_argmax, shape, gpu.up(x), dev(gpu, scale), dev(gpu, shift),
        in_relu, py, ptap, True)
    np.testing.assert_array_equal(gpu.down(py, want_y.shape), want_y)
    np.testing.assert_array_equal(gpu.down(ptap, want_tap.shape, np.uint8), want_tap)
    pdx = gpu.empty(x.shape)
    run(cuda.max_pool2d_backward_argmax, shape, ptap, gpu.up(dy), pdx)
    check(gpu.down(pdx, x.shape), want_dx, "exact", "dx")


@pytest.mark.parametrize("case", FUSED_POOL_SHAPES)
@pytest.mark.parametrize("kind", MAPS)
def test_max_pool2d_argmax_fused(gpu, rng, case, kind):
    """x read through the map: y and the taps _C's, y that of the fused forward, and dx
    from the taps _C's and that of the fused backward (which finds the maxima again)."""
    shape, (ho, wo), _ = pool_case(*case)
    n, c, h, w = case[:4]
    x, dy = f32(rng, n, c, h, w), f32(rng, n, c, ho, wo)
    scale, shift, in_relu = affine_map(rng, kind, c)
    want_y, want_tap, want_dx = max_pool_argmax_cpu(shape, x, scale, shift, in_relu, dy)
    px, pdy, psc, psh = gpu.up(x), gpu.up(dy), dev(gpu, scale), dev(gpu, shift)
    py, ptap = gpu.empty(want_y.shape), gpu.empty(want_tap.shape, np.uint8, fill=255)
    run(cuda.max_pool2d_forward_argmax, shape, px, psc, psh, in_relu, py, ptap)
    got_y = gpu.down(py, want_y.shape)
    np.testing.assert_array_equal(got_y, want_y)
    np.testing.assert_array_equal(gpu.down(ptap, want_tap.shape, np.uint8), want_tap)
    pdx = gpu.empty(x.shape)
    run(cuda.max_pool2d_backward_argmax, shape, ptap, pdy, pdx)
    got_dx = gpu.down(pdx, x.shape)
    check(got_dx, want_dx, "exact", "dx")

    pz, pdz = gpu.empty(want_y.shape), gpu.empty(x.shape)
    run(cuda.max_pool2d_forward_fused, shape, px, psc, psh, in_relu, pz)
    run(cuda.max_pool2d_backward_fused, shape, px, psc, psh, in_relu, pdy, pdz)
    check(got_y, gpu.down(pz, want_y.shape), "exact", "y against the fused forward")
    check(got_dx, gpu.down(pdz, x.shape), "exact", "dx against the fused backward")


@pytest.mark.parametrize("kind", ["none", "relu", "affine+relu"])
def test_max_pool2d_argmax_nan(gpu, rng, kind):
    """A NaN wins its windows (after the map's ReLU too): its tap is _C's."""
    shape, (ho, wo), _ = pool_case(2, 3, 7, 7, 3, 2, 1, True)
    x, dy = f32(rng, 2, 3, 7, 7), f32(rng, 2, 3, ho, wo)
    x[0, 1, 2, 3] = x[1, 2, 0, 0] = x[1, 2, 6, 6] = np.nan
    scale, shift, in_relu = affine_map(rng, kind, 3)
    want_y, want_tap, want_dx = max_pool_argmax_cpu(shape, x, scale, shift, in_relu, dy)
    assert np.isnan(want_y).any()
    py, ptap = gpu.empty(want_y.shape, fill=0.0), gpu.empty(want_tap.shape, np.uint8, fill=255)
    pdx = gpu.empty(x.shape)
    run(cuda.max_pool2d_forward_argmax, shape, gpu.up(x), dev(gpu, scale), dev(gpu, shift),
        in_relu, py, ptap)
    run(cuda.max_pool2d_backward_argmax, shape, ptap, gpu.up(dy), pdx)
    np.testing.assert_array_equal(gpu.down(py, want_y.shape), want_y)
    np.testing.assert_array_equal(gpu.down(ptap, want_tap.shape, np.uint8), want_tap)
    check(gpu.down(pdx, x.shape), want_dx, "exact", "dx")


def test_max_pool2d_backward_argmax_drops_foreign_taps(gpu, rng):
    """A tap that names no element of the input (one in the padding, or >= kh * kw) adds
    nothing: the kernel cannot report it (_C's backward rejects such taps)."""
    shape, (ho, wo), _ = pool_case(1, 2, 7, 7, 3, 2, 1, False)
    dy = f32(rng, 1, 2, ho, wo)
    tap = np.full((1, 2, ho, wo), 4, np.uint8)  # the window's centre: inside the input
    tap[0, 0, 0, 0] = 0      # window (0, 0) starts at (-1, -1): its taps 0-3 and 6 are padding
    tap[0, 0, 2, 3] = 5      # window (2, 3) ends past the last column: tap 5 is padding
    tap[0, 1, 1, 2] = 9      # kh * kw
    tap[0, 1, 3, 3] = 255
    want = np.zeros((1, 2, 7, 7), np.float32)
    for p in range(2):
        for oh in range(ho):
            for ow in range(wo):
                t = int(tap[0, p, oh, ow])
                r, col = 2 * oh - 1 + t // 3, 2 * ow - 1 + t % 3
                if t < 9 and 0 <= r < 7 and 0 <= col < 7:
                    want[0, p, r, col] += dy[0, p, oh, ow]
    pdx = gpu.empty(want.shape)
    run(cuda.max_pool2d_backward_argmax, shape, gpu.up(tap), gpu.up(dy), pdx)
    check(gpu.down(pdx, want.shape), want, "exact", "dx")


@pytest.mark.parametrize("n, c, hw", [(1, 1, 1), (2, 3, 5), (4, 16, 64), (2, 64, 1000)])
@pytest.mark.parametrize("a_kind", MAPS)
@pytest.mark.parametrize("b_kind", MAPS + ["no b"])
@pytest.mark.parametrize("relu", [False, True])
def test_affine_add(gpu, rng, n, c, hw, a_kind, b_kind, relu):
    a, b = f32(rng, n, c, hw), f32(rng, n, c, hw)
    sa, ta, ra = affine_map(rng, a_kind, c)
    sb, tb, rb = affine_map(rng, "none" if b_kind == "no b" else b_kind, c)
    if b_kind == "no b":
        b = None
    want = np.empty((n, c, hw), np.float32)
    _C.affine_add(n, c, hw, a.ravel(), sa, ta, ra, None if b is None else b.ravel(), sb, tb, rb,
                  relu, want.ravel())
    py = gpu.empty(want.shape)
    run(cuda.affine_add, n, c, hw, gpu.up(a), dev(gpu, sa), dev(gpu, ta), ra, dev(gpu, b),
        dev(gpu, sb), dev(gpu, tb), rb, relu, py)
    got = gpu.down(py, want.shape)
    check(got, want, "elementwise", "y")
    ref = mapped(a, sa, ta, ra) + (0.0 if b is None else mapped(b, sb, tb, rb))
    check(got, np.maximum(ref, 0.0) if relu else ref, "elementwise", "y against float64")


def test_affine_add_in_place(gpu, rng):
    """y may be a or b."""
    n, c, hw = 3, 8, 50
    a, b = f32(rng, n, c, hw), f32(rng, n, c, hw)
    sa, ta, _ = affine_map(rng, "affine", c)
    sb, tb, _ = affine_map(rng, "affine", c)
    want = np.empty_like(a)
    _C.affine_add(n, c, hw, a.ravel(), sa, ta, True, b.ravel(), sb, tb, False, True, want.ravel())
    for target in ("a", "b"):
        pa, pb = gpu.up(a), gpu.up(b)
        py = pa if target == "a" else pb
        run(cuda.affine_add, n, c, hw, pa, gpu.up(sa), gpu.up(ta), True, pb, gpu.up(sb),
            gpu.up(tb), False, True, py)
        check(gpu.down(py, a.shape), want, "elementwise", f"y written over {target}")


@pytest.mark.parametrize("c, count", [(1, 2), (3, 7), (64, 4096), (1000, 50)])
@pytest.mark.parametrize("running", [True, False])
@pytest.mark.parametrize("offset", [0.0, 10.0])
def test_batch_norm_stats(gpu, rng, c, count, running, offset):
    v = f32(rng, count, c).astype(np.float64) + offset
    s, q = v.sum(0), (v * v).sum(0)
    gamma, beta = f32(rng, c), f32(rng, c)
    rm0, rv0 = f32(rng, c), np.abs(f32(rng, c)) + 0.5
    rm, rv = rm0.copy(), rv0.copy()
    want = [np.empty(c, np.float32) for _ in range(4)]
    _C.batch_norm_stats(c, count, s, q, gamma, beta, 1e-5, 0.1, rm if running else None,
                        rv if running else None, *want)
    prm, prv = (gpu.up(rm0), gpu.up(rv0)) if running else (0, 0)
    outs = [gpu.empty(c) for _ in range(4)]
    run(cuda.batch_norm_stats, c, count, gpu.up(s), gpu.up(q), gpu.up(gamma), gpu.up(beta), 1e-5,
        0.1, prm, prv, *outs)
    for name, p, w in zip(("save_mean", "save_invstd", "scale", "shift"), outs, want):
        check(gpu.down(p, c), w, "elementwise", name)
    if running:
        check(gpu.down(prm, c), rm, "elementwise", "running_mean")
        check(gpu.down(prv, c), rv, "elementwise", "running_var")


@pytest.mark.parametrize("n, c, hw", BN_SHAPES)
def test_batch_norm_relu_backward(gpu, rng, n, c, hw):
    """= and +=, against _C and against the plain backward of dy masked beforehand."""
    x = f32(rng, n, c, hw) + np.float32(0.5)
    gamma, beta, dy = f32(rng, c), f32(rng, c), f32(rng, n, c, hw)
    _, mean, invstd = ops.batch_norm(x, gamma, beta, training=True)
    sc = (gamma.astype(np.float64) * invstd).astype(np.float32)
    sh = (beta - mean.astype(np.float64) * sc).astype(np.float32)
    # where x * sc + sh > 0 (the float64 value has the sign of fmaf's)
    masked = np.where(mapped(x, sc, sh, False) > 0, dy, np.float32(0.0))
    px, pg, pdy, pmdy = gpu.up(x), gpu.up(gamma), gpu.up(dy), gpu.up(masked)
    pm, pi, psc, psh = gpu.up(mean), gpu.up(invstd), gpu.up(sc), gpu.up(sh)
    g0, b0 = f32(rng, c), f32(rng, c)
    for accumulate in (False, True):
        dx, dg, db = np.empty_like(x), g0.copy(), b0.copy()
        _C.batch_norm_relu_backward(n, c, hw, x.ravel(), gamma, dy.ravel(), mean, invstd, sc, sh,
                                    dx.ravel(), dg, db, accumulate)
        pdx, pdg, pdb = gpu.empty(x.shape), gpu.up(g0), gpu.up(b0)
        run(cuda.batch_norm_relu_backward, n, c, hw, px, pg, pdy, pm, pi, psc, psh, pdx, pdg, pdb,
            accumulate)
        got = gpu.down(pdx, x.shape), gpu.down(pdg, c), gpu.down(pdb, c)
        scales = dx_scale(gamma, invstd, dy), 1e-3, 1e-3
        for name, g, w, e in zip(("dx", "dgamma", "dbeta"), got, (dx, dg, db), scales):
            check(g, w, "batch_norm", f"{name} (accumulate {accumulate})", e)
        qdx, qdg, qdb = gpu.empty(x.shape), gpu.up(g0), gpu.up(b0)
        run(cuda.batch_norm_backward, n, c, hw, px, pg, pmdy, pm, pi, qdx, qdg, qdb, accumulate)
        plain = gpu.down(qdx, x.shape), gpu.down(qdg, c), gpu.down(qdb, c)
        for name, g, w, e in zip(("dx", "dgamma", "dbeta"), got, plain, scales):
            check(g, w, "batch_norm", f"{name} against dy masked first (accumulate {accumulate})",
                  e)


def add_relu_case(rng, n, c, hw, kind):
    """s = BatchNorm(x) + fb(b) (float32) with b read the `kind` way, and the rest of
    batch_norm_add_relu_backward's inputs."""
    x, b = f32(rng, n, c, hw) + np.float32(0.5), f32(rng, n, c, hw)
    gamma, beta, dy = f32(rng, c), f32(rng, c), f32(rng, n, c, hw)
    y, _, invstd = ops.batch_norm(x, gamma, beta, training=True)
    sb, tb, rb = affine_map(rng, kind, c)
    s = (y + mapped(b, sb, tb, rb)).astype(np.float32)
    return s, b, (sb, tb, rb), gamma, beta, dy, invstd


@pytest.mark.parametrize("n, c, hw", BN_SHAPES)
@pytest.mark.parametrize("kind", MAPS)
def test_batch_norm_add_relu_backward(gpu, rng, n, c, hw, kind):
    """= and +=, against _C: dx, dgamma, dbeta and db = dy where s > 0."""
    s, b, (sb, tb, rb), gamma, beta, dy, invstd = add_relu_case(rng, n, c, hw, kind)
    ps, pb, pg, pbt, pdy, pi = (gpu.up(a) for a in (s, b, gamma, beta, dy, invstd))
    psb, ptb = dev(gpu, sb), dev(gpu, tb)
    g0, b0 = f32(rng, c), f32(rng, c)
    for accumulate in (False, True):
        dx, db, dg, dbt = np.empty_like(s), np.empty_like(s), g0.copy(), b0.copy()
        _C.batch_norm_add_relu_backward(n, c, hw, s.ravel(), b.ravel(), sb, tb, rb, gamma, beta,
                                        dy.ravel(), invstd, dx.ravel(), db.ravel(), dg, dbt,
                                        accumulate)
        pdx, pdb, pdg, pdbt = gpu.empty(s.shape), gpu.empty(s.shape), gpu.up(g0), gpu.up(b0)
        run(cuda.batch_norm_add_relu_backward, n, c, hw, ps, pb, psb, ptb, rb, pg, pbt, pdy, pi,
            pdx, pdb, pdg, pdbt, accumulate)
        check(gpu.down(pdb, s.shape), db, "exact", f"db (accumulate {accumulate})")
        got = gpu.down(pdx, s.shape), gpu.down(pdg, c), gpu.down(pdbt, c)
        scales = dx_scale(gamma, invstd, dy), 1e-3, 1e-3
        for name, g, w, e in zip(("dx", "dgamma", "dbeta"), got, (dx, dg, dbt), scales):
            check(g, w, "batch_norm", f"{name} (accumulate {accumulate})", e)


def test_batch_norm_add_relu_backward_db_over_dy(gpu, rng):
    """db may be dy."""
    n, c, hw = 4, 6, 45
    s, b, (sb, tb, rb), gamma, beta, dy, invstd = add_relu_case(rng, n, c, hw, "affine+relu")
    dx, db = np.empty_like(s), np.empty_like(s)
    dg, dbt = np.empty(c, np.float32), np.empty(c, np.float32)
    _C.batch_norm_add_relu_backward(n, c, hw, s.ravel(), b.ravel(), sb, tb, rb, gamma, beta,
                                    dy.ravel(), invstd, dx.ravel(), db.ravel(), dg, dbt)
    pdy, pdx, pdg, pdbt = gpu.up(dy), gpu.empty(s.shape), gpu.empty(c), gpu.empty(c)
    run(cuda.batch_norm_add_relu_backward, n, c, hw, gpu.up(s), gpu.up(b), gpu.up(sb), gpu.up(tb),
        rb, gpu.up(gamma), gpu.up(beta), pdy, gpu.up(invstd), pdx, pdy, pdg, pdbt)
    check(gpu.down(pdy, s.shape), db, "exact", "db written over dy")
    got = gpu.down(pdx, s.shape), gpu.down(pdg, c), gpu.down(pdbt, c)
    for name, g, w in zip(("dx", "dgamma", "dbeta"), got, (dx, dg, dbt)):
        check(g, w, "batch_norm", name)

def test_fused_batch_norm_relu_chain(gpu, rng):
    """conv (channel sums) -> batch_norm_stats -> a stride-2 conv and affine_add reading
    relu(BatchNorm(y)) through the map, against ops' unfused batch_norm, relu and conv2d."""
    n, c_in, h, w, c = 4, 3, 10, 10, 8
    x, w1, w2 = f32(rng, n, c_in, h, w), f32(rng, c, c_in, 3, 3), f32(rng, 5, c, 3, 3)
    gamma, beta = f32(rng, c), f32(rng, c)
    y = ops.conv2d(x, w1, padding=1)
    z, mean, invstd = ops.batch_norm(y, gamma, beta, training=True)
    r = ops.relu(z)
    want = ops.conv2d(r, w2, stride=2, padding=1)

    shape1 = (n, c_in, h, w, c, 3, 3, 1, 1, 1, 1)
    shape2 = (n, c, h, w, 5, 3, 3, 2, 2, 1, 1)
    py, ps, pq = gpu.empty(y.shape), gpu.empty(c, np.float64), gpu.empty(c, np.float64)
    run(cuda.conv2d_forward_ex, shape1, gpu.up(x), gpu.up(w1), 0, False, ps, pq, py)
    pm, pi, psc, psh = (gpu.empty(c) for _ in range(4))
    run(cuda.batch_norm_stats, c, n * h * w, ps, pq, gpu.up(gamma), gpu.up(beta), 1e-5, 0.1, 0, 0,
        pm, pi, psc, psh)
    check(gpu.down(pm, c), mean, "batch_norm", "mean")
    check(gpu.down(pi, c), invstd, "batch_norm", "invstd")
    pz = gpu.empty(want.shape)
    run(cuda.conv2d_forward_fused, shape2, py, psc, psh, True, gpu.up(w2), 0, False, 0, 0, pz)
    check(gpu.down(pz, want.shape), want, "chain", "conv2d(relu(batch_norm(y)))")
    pr = gpu.empty(y.shape)
    run(cuda.affine_add, n, c, h * w, py, psc, psh, True, 0, 0, 0, False, False, pr)
    check(gpu.down(pr, y.shape), r, "chain", "relu(batch_norm(y))")


# ---- linear ----------------------------------------------------------------------------------

LINEAR_SHAPES = [(1, 1, 1), (3, 7, 5), (128, 64, 10), (33, 257, 65), (100, 1024, 64),
                 (1, 3000, 2)]


@pytest.mark.parametrize("n, in_, out", LINEAR_SHAPES)
def test_linear(gpu, rng, n, in_, out):
    x, w, b, dy = f32(rng, n, in_), f32(rng, out, in_), f32(rng, out), f32(rng, n, out)
    px, pw, pdy = gpu.up(x), gpu.up(w), gpu.up(dy)
    for bias in (b, None):
        py = gpu.empty((n, out))
        run(cuda.linear_forward, n, in_, out, px, pw, gpu.up(b) if bias is not None else 0, py)
        check(gpu.down(py, (n, out)), ops.linear(x, w, bias), "gemm", "y")
    dx, dw, db = ops.linear_backward(x, w, dy)
    pdx = gpu.empty(x.shape)
    run(cuda.linear_backward_data, n, in_, out, pdy, pw, pdx)
    check(gpu.down(pdx, x.shape), dx, "gemm", "dx")
    w0, b0 = f32(rng, out, in_), f32(rng, out)
    for accumulate in (False, True):
        pdw, pdb = gpu.up(w0), gpu.up(b0)
        run(cuda.linear_backward_weights, n, in_, out, px, pdy, pdw, pdb, accumulate)
        check(gpu.down(pdw, w.shape), dw + (w0 if accumulate else 0), "gemm", "dw")
        check(gpu.down(pdb, out), db + (b0 if accumulate else 0), "reduction", "db")
    pdw = gpu.empty(w.shape)
    run(cuda.linear_backward_weights, n, in_, out, px, pdy, pdw, 0, False)  # db NULL
    check(gpu.down(pdw, w.shape), dw, "gemm", "dw (no db)")


def test_linear_empty_sizes(gpu, rng):
    """in == 0: y = b; n == 0: dw = 0 (or unchanged with accumulate), db likewise."""
    b = f32(rng, 4)
    py = gpu.empty((3, 4))
    run(cuda.linear_forward, 3, 0, 4, 0, 0, gpu.up(b), py)
    check(gpu.down(py, (3, 4)), np.broadcast_to(b, (3, 4)), "exact", "y = b")
    w0, b0 = f32(rng, 4, 5), f32(rng, 4)
    pdw, pdb = gpu.up(w0), gpu.up(b0)
    run(cuda.linear_backward_weights, 0, 5, 4, 0, 0, pdw, pdb, False)
    check(gpu.down(pdw, (4, 5)), np.zeros((4, 5), np.float32), "exact", "dw = 0")
    check(gpu.down(pdb, 4), np.zeros(4, np.float32), "exact", "db = 0")
    pdw, pdb = gpu.up(w0), gpu.up(b0)
    run(cuda.linear_backward_weights, 0, 5, 4, 0, 0, pdw, pdb, True)
    check(gpu.down(pdw, (4, 5)), w0, "exact", "dw unchanged")
    check(gpu.down(pdb, 4), b0, "exact", "db unchanged")


# ---- loss ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, classes", [(1, 1), (1, 10), (7, 3), (128, 10), (64, 1000), (5, 33),
                                        (3000, 10)])
def test_softmax_cross_entropy(gpu, rng, n, classes):
    logits = f32(rng, n, classes, scale=5.0)
    labels = rng.integers(0, classes, n).astype(np.int64)
    loss, dlogits = ops.softmax_cross_entropy(logits, labels)
    pl, plab = gpu.up(logits), gpu.up(labels)
    ploss, pd = gpu.empty(1), gpu.empty((n, classes))
    run(cuda.softmax_cross_entropy, n, classes, pl, plab, pd, ploss)
    check(gpu.down(ploss, 1), np.float32([loss]), "loss", "loss")
    check(gpu.down(pd, (n, classes)), dlogits, "loss", "dlogits")
    ploss2 = gpu.empty(1)
    run(cuda.softmax_cross_entropy, n, classes, pl, plab, 0, ploss2)  # no dlogits
    check(gpu.down(ploss2, 1), gpu.down(ploss, 1), "exact", "loss without dlogits")


def test_softmax_cross_entropy_bad_label_is_nan(gpu, rng):
    logits, labels = f32(rng, 2, 3), np.array([0, 5], np.int64)
    ploss, pd = gpu.empty(1, fill=0.0), gpu.empty((2, 3), fill=0.0)
    run(cuda.softmax_cross_entropy, 2, 3, gpu.up(logits), gpu.up(labels), pd, ploss)
    assert np.isnan(gpu.down(ploss, 1)[0])
    d = gpu.down(pd, (2, 3))
    assert np.isnan(d[1]).all() and not np.isnan(d[0]).any()


# ---- optimizers ------------------------------------------------------------------------------

SGD_CASES = [dict(momentum=0.0), dict(momentum=0.9, first_step=True), dict(momentum=0.9),
             dict(momentum=0.9, dampening=0.1, weight_decay=1e-2),
             dict(momentum=0.9, nesterov=True, weight_decay=5e-4), dict(weight_decay=1e-2)]


@pytest.mark.parametrize("count", [1, 1000, 4097])
@pytest.mark.parametrize("hp", SGD_CASES, ids=str)
def test_sgd_step(gpu, rng, count, hp):
    param, grad, buf = f32(rng, count), f32(rng, count), f32(rng, count)
    want_p, want_b = param.copy(), buf.copy()
    ops.sgd_step(want_p, grad, want_b if hp.get("momentum") else None, lr=0.1, **hp)
    pp, pb = gpu.up(param), gpu.up(buf)
    full = dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, first_step=False)
    full.update(hp)
    run(cuda.sgd_step, pp, gpu.up(grad), pb if hp.get("momentum") else 0, 0.1, full["momentum"],
        full["dampening"], full["weight_decay"], full["nesterov"], full["first_step"], count)
    check(gpu.down(pp, count), want_p, "optim", "param")
    if hp.get("momentum"):
        check(gpu.down(pb, count), want_b, "optim", "momentum buffer")


@pytest.mark.parametrize("count", [1, 1000, 4097])
@pytest.mark.parametrize("step", [1, 10])
@pytest.mark.parametrize("decoupled, weight_decay", [(False, 0.0), (False, 1e-2), (True, 1e-2)])
def test_adam_step(gpu, rng, count, step, decoupled, weight_decay):
    param, grad = f32(rng, count), f32(rng, count)
    m, v = f32(rng, count, scale=0.1), np.abs(f32(rng, count, scale=0.01))
    want_p, want_m, want_v = param.copy(), m.copy(), v.copy()
    ops.adam_step(want_p, grad, want_m, want_v, step=step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                  weight_decay=weight_decay, decoupled=decoupled)
    pp, pm, pv = gpu.up(param), gpu.up(m), gpu.up(v)
    run(cuda.adam_step, pp, gpu.up(grad), pm, pv, step, 1e-3, 0.9, 0.999, 1e-8, weight_decay,
        decoupled, count)
    check(gpu.down(pp, count), want_p, "optim", "param")
    check(gpu.down(pm, count), want_m, "optim", "exp_avg")
    check(gpu.down(pv, count), want_v, "optim", "exp_avg_sq")


# ---- errors ----------------------------------------------------------------------------------

def test_bad_argument_raises(gpu):
    px = gpu.empty(16)
    with pytest.raises(ValueError, match="mdl_cuda_conv2d_forward: kernel size can't be greater"):
        cuda.conv2d_forward((1, 1, 2, 2, 1, 5, 5, 1, 1, 0, 0), px, px, 0, px)
    with pytest.raises(ValueError, match="mdl_cuda_relu_forward: y must not be NULL"):
        cuda.relu_forward(px, 0, 16)
    shape = (256, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1)
    need = cuda.conv2d_workspace_size(shape)
    with pytest.raises(ValueError, match="workspace has"):
        cuda.conv2d_backward_weights(shape, px, px, px, False, px, need - 1)
    with pytest.raises(ValueError, match="mdl_cuda_conv2d_backward_data_fused: dy must not be"):
        cuda.conv2d_backward_data_fused((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), 0, px, px, True)
    cuda.synchronize()  # nothing was launched, nothing failed
