"""minidl.ops -- the functional API: NumPy float32 arrays in and out, NCHW.

Shapes, argument names and semantics follow the PyTorch functions named in
each docstring, so results can be compared with PyTorch directly.

Input arrays: float32 arrays are used as they are; other floating dtypes
(float16, float64) are converted to float32 and non-contiguous arrays are
copied to C order.  Integer, boolean or complex arrays and non-arrays raise
TypeError.  Arrays that an op updates in place (``out``, running statistics,
optimizer state) are never converted: they must already be C-contiguous,
writable float32 arrays of the exact shape, or the op raises.  Wrong ranks,
mismatched shapes and bad hyper-parameters raise ValueError naming the
argument and the value expected.  NaN and Inf flow through like any number.
"""
from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import numpy as np

from minidl import _C

IntPair = Union[int, Tuple[int, int]]

__all__ = [
    "sgemm",
    "conv2d", "conv2d_backward",
    "max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
    "global_avg_pool2d", "global_avg_pool2d_backward",
    "relu", "relu_backward", "add", "dropout", "dropout_backward",
    "batch_norm", "batch_norm_backward",
    "linear", "linear_backward",
    "softmax_cross_entropy",
    "sgd_step", "adam_step",
]

# ---- argument checking (shared by every op) ----------------------------------


def _input(name: str, a, ndim: Optional[int] = None, layout: str = "") -> np.ndarray:
    """A read-only operand as a C-contiguous float32 array (converted if needed)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype != np.float32:
        if a.dtype.kind != "f":
            raise TypeError(f"{name} must be a float32 array, got dtype {a.dtype}")
        a = a.astype(np.float32)
    if ndim is not None and a.ndim != ndim:
        what = f" {layout}" if layout else ""
        raise ValueError(f"{name} must be {ndim}-D{what}, got shape {a.shape}")
    return np.ascontiguousarray(a)


def _inout(name: str, a, shape: Tuple[int, ...]) -> np.ndarray:
    """An array updated in place: must be C-contiguous, writable float32 of `shape`."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 array (it is updated in place), got dtype {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (it is updated in place)")
    if not a.flags.writeable:
        raise ValueError(f"{name} must be writable (it is updated in place)")
    return a


def _int(name: str, v, minimum: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {v!r}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def _pair(name: str, v, minimum: int) -> Tuple[int, int]:
    """An int or an (h, w) pair of ints, each >= minimum."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or an (h, w) pair, got {v!r}")
        return _int(name, v[0], minimum), _int(name, v[1], minimum)
    v = _int(name, v, minimum)
    return v, v


def _float(name: str, v, lo: float = -np.inf, hi: float = np.inf, *, lo_open=False,
           hi_open=False) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {v!r}")
    v = float(v)
    bad = (v != v or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi))
    if bad:
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"{name} must be in {lb}{lo}, {hi}{rb}, got {v}")
    return v


def _flat(a: Optional[np.ndarray]):
    return None if a is None else a.reshape(-1)


# ---- GEMM -------------------------------------------------------------------------


def sgemm(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False, trans_b: bool = False,
          alpha: float = 1.0, beta: float = 0.0, out: Optional[np.ndarray] = None) -> np.ndarray:
    """alpha * op(a) @ op(b) + beta * out, with op(x) = x.T when trans_x.

    a: (m, k), or (k, m) with trans_a; b: (k, n), or (n, k) with trans_b.
    Returns out (m, n), written in place when given; beta != 0 needs out.
    """
    a = _input("a", a, 2)
    b = _input("b", b, 2)
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb:
        raise ValueError(f"sgemm: inner dimensions differ: op(a) is {m}x{k}, op(b) is {kb}x{n}")
    alpha = _float("alpha", alpha)
    beta = _float("beta", beta)
    if out is None:
        if beta != 0.0:
            raise ValueError("sgemm: beta != 0 needs out (the matrix it scales)")
        out = np.empty((m, n), np.float32)
    else:
        _inout("out", out, (m, n))
        if np.shares_memory(out, a) or np.shares_memory(out, b):
            raise ValueError("sgemm: out must not overlap a or b")
    _C.sgemm(trans_a, trans_b, m, n, k, alpha, a.reshape(-1), max(a.shape[1], 1),
             b.reshape(-1), max(b.shape[1], 1), beta, out.reshape(-1), max(n, 1))
    return out


# ---- convolution ------------------------------------------------------------------

# ---- pooling ----------------------------------------------------------------------

# ---- elementwise ------------------------------------------------------------------


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0), any shape [torch.nn.functional.relu]."""
    x = _input("x", x)
    y = np.empty_like(x)
    _C.relu_forward(x.reshape(-1), y.reshape(-1))
    return y


def relu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx = dy where x > 0, else 0; x and dy of the same shape."""
    x = _input("x", x)
    dy = _input("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    dx = np.empty_like(x)
    _C.relu_backward(x.reshape(-1), dy.reshape(-1), dx.reshape(-1))
    return dx


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b for arrays of the same shape (no broadcasting) [torch.add]."""
    a = _input("a", a)
    b = _input("b", b)
    if a.shape != b.shape:
        raise ValueError(f"b must have the shape of a {a.shape} (no broadcasting), got {b.shape}")
    y = np.empty_like(a)
    _C.add(a.reshape(-1), b.reshape(-1), y.reshape(-1))
    return y


def _seed(seed) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return int(seed)


def dropout(x: np.ndarray, p: float = 0.5, *, seed: int) -> np.ndarray:
    """Inverted dropout [torch.nn.functional.dropout, training=True]: each element is
    zeroed with probability p and the rest scaled by 1 / (1 - p).  The mask is a pure
    function of (seed, element index), so dropout_backward recomputes it."""
    x = _input("x", x)
    p = _float("p", p, 0.0, 1.0, hi_open=True)
    y = np.empty_like(x)
    _C.dropout_forward(p, _seed(seed), x.reshape(-1), y.reshape(-1))
    return y


def dropout_backward(dy: np.ndarray, p: float = 0.5, *, seed: int) -> np.ndarray:
    """dx for dropout(x, p, seed=seed): dy masked and scaled the same way."""
    dy = _input("dy", dy)
    p = _float("p", p, 0.0, 1.0, hi_open=True)
    dx = np.empty_like(dy)
    _C.dropout_backward(p, _seed(seed), dy.reshape(-1), dx.reshape(-1))
    return dx


# ---- batch norm -------------------------------------------------------------------


def _bn_x(x) -> Tuple[np.ndarray, int, int, int]:
    """x as (N, C), (N, C, L) or (N, C, H, W) float32, and its (n, c, hw)."""
    x = _input("x", x)
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"x must be 2-D (N, C), 3-D (N, C, L) or 4-D (N, C, H, W), "
                         f"got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"x must not be empty, got shape {x.shape}")
    n, c = x.shape[:2]
    return x, n, c, x.size // (n * c)


def _bn_param(name: str, a, c: int, fill: Optional[float] = None) -> np.ndarray:
    """A per-channel (C,) operand; None means `fill` where that is allowed."""
    if a is None and fill is not None:
        return np.full(c, fill, np.float32)
    a = _input(name, a, 1, "(C,)")
    if a.shape != (c,):
        raise ValueError(f"{name} must have shape ({c},) (one value per channel of x), "
                         f"got {a.shape}")
    return a


def batch_norm(x: np.ndarray, gamma: Optional[np.ndarray], beta: Optional[np.ndarray], *,
               training: bool = True, running_mean: Optional[np.ndarray] = None,
               running_var: Optional[np.ndarray] = None, momentum: float = 0.1,
               eps: float = 1e-5) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Batch normalisation [torch.nn.functional.batch_norm], statistics per channel.

    x: (N, C), (N, C, L) or (N, C, H, W); gamma, beta: (C,) (None: ones, zeros).
    training=True normalises with the batch mean and biased variance over N and
    the spatial axes (more than one value per channel needed) and, when
    running_mean and running_var are given, updates them in place:
    r = (1 - momentum) * r + momentum * stat, with the unbiased variance.
    training=False normalises with running_mean and running_var (required).
    Running statistics must be C-contiguous, writable float32 (C,) arrays.
    Returns (y like x, mean (C,), invstd (C,)) where invstd = 1 / sqrt(var + eps):
    the batch statistics in training (what batch_norm_backward takes), else
    copies of running_mean and 1 / sqrt(running_var + eps).
    """
    x, n, c, hw = _bn_x(x)
    gamma = _bn_param("gamma", gamma, c, 1.0)
    beta = _bn_param("beta", beta, c, 0.0)
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"training must be a bool, got {training!r}")
    eps = _float("eps", eps, 0.0, np.inf, hi_open=True)
    if (running_mean is None) != (running_var is None):
        given = "running_mean" if running_mean is not None else "running_var"
        raise ValueError(f"running_mean and running_var must be given together, got only {given}")
    if running_mean is not None:
        _inout("running_mean", running_mean, (c,))
        _inout("running_var", running_var, (c,))
        if np.shares_memory(running_mean, running_var):
            raise ValueError("running_mean and running_var must not overlap")
    y = np.empty_like(x)
    if training:
        momentum = _float("momentum", momentum, 0.0, 1.0)
        if n * hw <= 1:
            raise ValueError(f"expected more than 1 value per channel when training, "
                             f"got x of shape {x.shape}")
        mean = np.empty(c, np.float32)
        invstd = np.empty(c, np.float32)
        _C.batch_norm_forward_train(n, c, hw, x.reshape(-1), gamma, beta, eps, momentum,
                                    running_mean, running_var, y.reshape(-1), mean, invstd)
        return y, mean, invstd
    if running_mean is None:
        raise ValueError("batch_norm with training=False needs running_mean and running_var")
    _C.batch_norm_forward_infer(n, c, hw, x.reshape(-1), gamma, beta, running_mean,
                                running_var, eps, y.reshape(-1))
    invstd = (1.0 / np.sqrt(running_var.astype(np.float64) + eps)).astype(np.float32)
    return y, running_mean.copy(), invstd


def batch_norm_backward(x: np.ndarray, gamma: Optional[np.ndarray], dy: np.ndarray,
                        mean: np.ndarray, invstd: np.ndarray
                        ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of batch_norm(x, gamma, beta, training=True).

    x, dy: (N, C[, L | H, W]) of the same shape; gamma (None: ones), mean, invstd: (C,),
    mean and invstd as returned by the forward.  Returns (dx like x, dgamma (C,),
    dbeta (C,)), with xhat = (x - mean) * invstd and m = N * H * W values per channel:
    dbeta = sum(dy), dgamma = sum(dy * xhat),
    dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma).
    """
    x, n, c, hw = _bn_x(x)
    dy = _input("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    gamma = _bn_param("gamma", gamma, c, 1.0)
    mean = _bn_param("mean", mean, c)
    invstd = _bn_param("invstd", invstd, c)
    dx = np.empty_like(x)
    dgamma = np.empty(c, np.float32)
    dbeta = np.empty(c, np.float32)
    _C.batch_norm_backward(n, c, hw, x.reshape(-1), gamma, dy.reshape(-1), mean, invstd,
                           dx.reshape(-1), dgamma, dbeta)
    return dx, dgamma, dbeta


# ---- linear -----------------------------------------------------------------------

# ---- loss -------------------------------------------------------------------------

# ---- optimizers -------------------------------------------------------------------
