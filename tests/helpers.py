"""The one comparison every op test uses, with its tolerances in one table.

Error measure: max |got - want| / max(max |want|, scale), where `want` is the
float64 reference and `scale` (default 1e-3) the magnitude of the inputs where
the result may cancel to far below them (an optimizer state after several
steps).  Normalising by the largest value, not element-wise, keeps entries that
cancel to near zero from dominating.
"""
import json
import os
import subprocess
import sys

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


def null_pointer_statuses(header: str, library: str) -> dict:
    """tests/c/null_pointers.py on one of the package's headers and its library, in a
    fresh interpreter: {function: {"valid": status, "null": {argument: status}}}.  Under
    `make sanitize` an AddressSanitizer report is exit code 99, never a status."""
    import minidl
    env = {**os.environ, "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":exitcode=99"}
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, os.path.join(here, "c", "null_pointers.py"),
                          os.path.join(minidl.get_include(), header),
                          os.path.join(minidl.get_library_dir(), library)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)
