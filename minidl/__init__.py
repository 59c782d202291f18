"""minidl: a minimal deep-learning training runtime on hand-written C kernels.

``minidl.ops`` is the functional API (NumPy float32 arrays in and out, NCHW, or
arrays of one ``minidl.device``: cpu, sim or cuda);
``minidl.nn`` the layers, ``minidl.Net`` a graph of them, ``minidl.plan`` and
``minidl.runtime`` what one training step does and its executor, ``minidl.optim``,
``minidl.data``, ``minidl.models`` and ``minidl.train`` the rest of training.
``get_include()`` and ``get_library_dir()`` locate the C header and the
libminidl shared/static libraries installed with this package, so that C
programs can link the same core (``python -m minidl --cflags --libs``).
"""
import os

from minidl import _C
from minidl._C import (cpu_simd, get_conv_algo, get_keep_workspace,  # noqa: F401
                       get_num_threads, get_simd, set_conv_algo, set_keep_workspace,
                       set_num_threads, set_simd)

__version__ = _C.version()
__all__ = ["ops", "nn", "Net", "optim", "models", "get_include", "get_library_dir",
           "set_num_threads", "get_num_threads", "set_simd", "get_simd", "cpu_simd", "set_conv_algo",
           "get_conv_algo", "set_keep_workspace", "get_keep_workspace",
           "__version__"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn_about_ignored_settings() -> None:
    """The C core ignores an environment setting it cannot read; say so."""
    import re
    import warnings
    for name, expected, ok in (
            ("MINIDL_SIMD", "scalar | avx2 | avx512", lambda v: v in ("scalar", "avx2", "avx512")),
            ("MINIDL_CONV", "auto | gemm | winograd", lambda v: v in ("auto", "gemm", "winograd")),
            ("MINIDL_NUM_THREADS", "an integer in [1, 4096]",  # as strtol reads it
             lambda v: re.fullmatch(r"\s*[+-]?\d+", v) is not None and 1 <= int(v) <= 4096)):
        value = os.environ.get(name)
        if value and not ok(value):
            warnings.warn(f"{name}={value!r} is ignored (expected {expected})", RuntimeWarning,
                          stacklevel=3)


_warn_about_ignored_settings()


def get_include() -> str:
    """The directory holding ``minidl.h``."""
    return os.path.join(_HERE, "include")


def get_library_dir() -> str:
    """The directory holding ``libminidl.so`` and ``libminidl.a``."""
    return os.path.join(_HERE, "lib")


from minidl import ops, nn, optim  # noqa: E402,F401
from minidl.graph import Net  # noqa: E402,F401
