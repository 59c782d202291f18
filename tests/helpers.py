"""The one comparison every op test uses, with its tolerances in one table.

Error measure: max |got - want| / max(max |want|, scale), where `want` is the
float64 reference and `scale` (default 1e-3) the magnitude of the inputs where
the result may cancel to far below them (an optimizer state after several
steps).  Normalising by the largest value, not element-wise, keeps entries that
cancel to near zero from dominating.
"""
import numpy as np

# float32 kernels against float64 references, at the sizes the tests use.
TOL = {
    "elementwise": 1e-6,   # one rounding per element
    "reduction": 1e-5,     # sums over up to a few thousand terms
    "gemm": 2e-5,          # dot products of length up to ~1000
    "conv": 2e-5,
    "batch_norm": 5e-5,    # statistics, then normalisation and its backward
    "loss": 1e-5,
    "optim": 1e-5,
}


def rel_err(got, want, scale: float = 1e-3) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != reference {want.shape}"
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), scale))


def assert_close(got, want, kind: str, what: str = "", scale: float = 1e-3) -> None:
    err = rel_err(got, want, scale)
    tol = TOL[kind]
    assert err <= tol, f"{what or kind}: relative error {err:.3g} > tolerance {tol:g}"


def f32(rng, *shape, scale=1.0):
    """Standard-normal float32 test data."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)
