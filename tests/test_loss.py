"""Softmax cross-entropy against the float64 reference, on both kernel versions."""
import numpy as np
import pytest

import minidl
from minidl import _C, ops

from helpers import assert_close, f32
import reference as ref

# (batch, classes): batch 1, one class, odd class counts, and sizes large
# enough (n * classes >= 4096) for the rows to be split over threads
SHAPES = [(1, 1), (1, 2), (1, 10), (1, 1000), (5, 1), (3, 7), (16, 8), (33, 10), (64, 1000),
          (300, 17)]


def check(logits, labels):
    loss, d = ops.softmax_cross_entropy(logits, labels)
    want_loss, want_d = ref.softmax_cross_entropy(logits, labels)
    assert isinstance(loss, float)
    assert d.dtype == np.float32 and d.shape == logits.shape
    assert_close(np.array(loss), np.array(want_loss), "loss", "loss")
    assert_close(d, want_d, "loss", "dlogits")
    return loss, d


@pytest.mark.parametrize("n,c", SHAPES)
def test_softmax_cross_entropy(simd, threads, rng, n, c):
    logits = f32(rng, n, c, scale=3.0)
    labels = rng.integers(0, c, n)
    check(logits, labels)


@pytest.mark.parametrize("n,c", [(1, 2), (1, 1000), (8, 10), (64, 1000)])
def test_large_logits_are_stable(simd, rng, n, c):
    """Logits of +-1e4: exp(z) overflows float32 without the max subtraction."""
    logits = (rng.uniform(-1, 1, (n, c)) * 1e4).astype(np.float32)
    labels = rng.integers(0, c, n)
    loss, d = check(logits, labels)
    assert np.isfinite(loss) and np.all(np.isfinite(d))
    # all logits equal and huge: uniform softmax
    loss, d = check(np.full((n, c), 3e4, np.float32), labels)
    assert loss == pytest.approx(np.log(c), rel=1e-6)


def test_softmax_values_over_a_wide_range(simd):
    """Each softmax entry (not just the largest) is accurate to a few float32 ulps,
    down to exp(-80): this checks the exponential itself on both kernel versions."""
    z = np.linspace(-80, 0, 4001, dtype=np.float32).reshape(1, -1)
    _, d = ops.softmax_cross_entropy(z, np.array([0]))
    _, want = ref.softmax_cross_entropy(z, np.array([0]))
    rel = np.abs(d[0, 1:] - want[0, 1:]) / np.abs(want[0, 1:])
    assert rel.max() < 4e-7, f"worst relative error {rel.max():.3g}"


def test_very_negative_and_minus_inf_logits(simd):
    z = np.array([[0, -1e30, -np.inf, -200, -100, 1, 2, 3, -np.inf, 0.5]], np.float32)
    loss, d = check(z, np.array([7]))
    assert np.all(np.isfinite(d)) and np.isfinite(loss)
    assert d[0, 1] == 0 and d[0, 2] == 0 and d[0, 3] == 0 and d[0, 8] == 0
    # the label on a -inf logit: infinite loss, as in PyTorch
    loss, _ = ops.softmax_cross_entropy(z, np.array([2]))
    assert loss == np.inf


@pytest.mark.parametrize("c", [3, 8, 21])
def test_nan_and_inf_flow_without_crash(simd, threads, rng, c):
    logits = f32(rng, 6, c)
    labels = rng.integers(0, c, 6)
    logits[2, 1] = np.nan
    loss, d = ops.softmax_cross_entropy(logits, labels)
    assert np.isnan(loss)
    assert np.all(np.isnan(d[2]))
    rows = [0, 1, 3, 4, 5]
    _, want = ref.softmax_cross_entropy(logits[rows], labels[rows])
    assert_close(d[rows] * 6 / 5, want, "loss", "dlogits of the rows without NaN")
    logits[2, 1] = np.inf
    loss, d = ops.softmax_cross_entropy(logits, labels)  # inf - inf: NaN, as in PyTorch
    assert np.isnan(loss)
    assert np.all(np.isfinite(np.delete(d, 2, axis=0)))


def test_result_does_not_depend_on_threads_or_repeats(rng):
    logits = f32(rng, 257, 100, scale=2.0)
    labels = rng.integers(0, 100, 257)
    results = []
    for nt in (1, 2, 1, 2):
        minidl.set_num_threads(nt)
        results.append(ops.softmax_cross_entropy(logits, labels))
    minidl.set_num_threads(0)
    for loss, d in results[1:]:
        np.testing.assert_array_equal(d, results[0][1])
        assert loss == pytest.approx(results[0][0], rel=1e-7)
    assert results[2][0] == results[0][0] and results[3][0] == results[1][0]


def test_scalar_and_avx2_agree(rng):
    if minidl.cpu_simd() == "scalar":
        pytest.skip("no AVX2 on this CPU")
    logits = f32(rng, 37, 1003, scale=4.0)
    labels = rng.integers(0, 1003, 37)
    out = {}
    for level in ("scalar", "avx2"):
        minidl.set_simd(level)
        out[level] = ops.softmax_cross_entropy(logits, labels)
    minidl.set_simd(minidl.cpu_simd())
    assert out["avx2"][0] == pytest.approx(out["scalar"][0], rel=1e-6)
    assert_close(out["avx2"][1], out["scalar"][1], "loss")


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64,
                                   np.uint64])
def test_label_dtypes(rng, dtype):
    logits = f32(rng, 9, 5)
    labels = rng.integers(0, 5, 9)
    want = ops.softmax_cross_entropy(logits, labels)
    got = ops.softmax_cross_entropy(logits, labels.astype(dtype))
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    # float64 logits are converted, a non-contiguous label array is copied
    got = ops.softmax_cross_entropy(logits.astype(np.float64), np.repeat(labels, 2)[::2])
    np.testing.assert_array_equal(got[1], want[1])


def test_bad_inputs(rng):
    logits = f32(rng, 4, 3)
    labels = np.array([0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"labels\[2\] = 3 is out of range \[0, 3\)"):
        ops.softmax_cross_entropy(logits, np.array([0, 1, 3, 1]))
    with pytest.raises(ValueError, match=r"labels\[1\] = -1 "):
        ops.softmax_cross_entropy(logits, np.array([0, -1, 5, 1], np.int8))
    with pytest.raises(ValueError, match=r"labels\[0\] = 18446744073709551615"):
        ops.softmax_cross_entropy(logits, np.array([2**64 - 1, 0, 0, 0], np.uint64))
    with pytest.raises(TypeError, match="labels must be an integer array"):
        ops.softmax_cross_entropy(logits, labels.astype(np.float32))
    with pytest.raises(TypeError, match="labels must be an integer array"):
        ops.softmax_cross_entropy(logits, labels.astype(bool))
    with pytest.raises(TypeError, match="labels must be a numpy.ndarray"):
        ops.softmax_cross_entropy(logits, [0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"labels must have shape \(4,\)"):
        ops.softmax_cross_entropy(logits, labels[:3])
    with pytest.raises(ValueError, match=r"labels must have shape \(4,\)"):
        ops.softmax_cross_entropy(logits, labels.reshape(4, 1))
    with pytest.raises(ValueError, match="logits must be 2-D"):
        ops.softmax_cross_entropy(logits.reshape(-1), labels)
    with pytest.raises(TypeError, match="logits must be a float32 array"):
        ops.softmax_cross_entropy(logits.astype(np.int32), labels)
    with pytest.raises(ValueError, match="N >= 1 rows and C >= 1 classes"):
        ops.softmax_cross_entropy(np.zeros((0, 3), np.float32), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="N >= 1 rows and C >= 1 classes"):
        ops.softmax_cross_entropy(np.zeros((2, 0), np.float32), np.zeros(2, np.int64))


def test_c_core_checks(rng):
    """The C core checks what the Python layer already did (other callers link it)."""
    logits = f32(rng, 3, 4).reshape(-1)
    d = np.empty(12, np.float32)
    with pytest.raises(ValueError, match=r"labels\[1\] = 4 is out of range \[0, 4\)"):
        _C.softmax_cross_entropy(3, 4, logits, np.array([0, 4, 1], np.int64), d)
    with pytest.raises(ValueError, match=r"labels\[2\] = -7 "):
        _C.softmax_cross_entropy(3, 4, logits, np.array([0, 1, -7], np.int64), None)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        _C.softmax_cross_entropy(0, 4, logits, np.array([0], np.int64), d)
    with pytest.raises(ValueError, match="classes must be >= 1, got 0"):
        _C.softmax_cross_entropy(3, 0, logits, np.array([0, 0, 0], np.int64), d)
    with pytest.raises(ValueError, match="labels must not be NULL"):
        _C.softmax_cross_entropy(3, 4, logits, np.zeros(0, np.int64), d)
    # dlogits is optional: the loss alone
    labels = np.array([0, 1, 2], np.int64)
    want, _ = ref.softmax_cross_entropy(logits.reshape(3, 4), labels)
    assert _C.softmax_cross_entropy(3, 4, logits, labels, None) == pytest.approx(want, rel=1e-5)
