import numpy as np
import pytest

from minidl import ops

from helpers import assert_close, f32
import reference as ref

SHAPES = [(1,), (7,), (8,), (33,), (2, 3, 5, 7), (4, 16, 9, 9), (1, 1, 1, 1), (3, 1000)]


@pytest.mark.parametrize("shape", SHAPES)
def test_relu(simd, threads, rng, shape):
    x = f32(rng, *shape)
    dy = f32(rng, *shape)
    assert_close(ops.relu(x), ref.relu(x), "elementwise")
    assert_close(ops.relu_backward(x, dy), ref.relu_backward(x, dy), "elementwise")


def test_relu_nan_and_zero(simd):
    x = np.array([np.nan, -0.0, 0.0, -1, 1, np.inf, -np.inf, 2, 3], np.float32)
    y = ops.relu(x)
    assert np.isnan(y[0])
    np.testing.assert_array_equal(y[1:], [0, 0, 0, 1, np.inf, 0, 2, 3])
    dx = ops.relu_backward(x, np.ones_like(x))
    np.testing.assert_array_equal(dx, [0, 0, 0, 0, 1, 1, 0, 1, 1])


@pytest.mark.parametrize("shape", SHAPES)
def test_add(simd, threads, rng, shape):
    a, b = f32(rng, *shape), f32(rng, *shape)
    assert_close(ops.add(a, b), ref.add(a, b), "elementwise")


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_dropout(simd, threads, rng, p):
    x = f32(rng, 4, 8, 33, 17)
    y = ops.dropout(x, p, seed=1234)
    kept = y != 0
    # kept elements are scaled by 1/(1-p), dropped ones are exactly zero
    np.testing.assert_allclose(y[kept], x[kept] / np.float32(1 - p), rtol=1e-6)
    # the drop rate matches p (n = 75k: 5 standard deviations)
    n = x.size
    assert abs((~kept).mean() - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12
    # backward: the same mask and scale applied to dy
    dy = f32(rng, *x.shape)
    dx = ops.dropout_backward(dy, p, seed=1234)
    np.testing.assert_array_equal(dx != 0, kept)
    np.testing.assert_allclose(dx[kept], dy[kept] / np.float32(1 - p), rtol=1e-6)


def test_dropout_same_mask_on_every_path(rng):
    """The mask is a pure function of (seed, index): scalar, AVX2, 1 or 2 threads agree."""
    import minidl
    x = f32(rng, 100003)
    results = []
    for level in ["scalar", minidl.cpu_simd()]:
        for nt in (1, 2):
            minidl.set_simd(level)
            minidl.set_num_threads(nt)
            results.append(ops.dropout(x, 0.3, seed=99))
    minidl.set_simd(minidl.cpu_simd())
    minidl.set_num_threads(0)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    assert not np.array_equal(ops.dropout(x, 0.3, seed=100), results[0])
