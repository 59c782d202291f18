"""float64 NumPy references for every op: the test oracle.  Written for
clarity, not speed; each mirrors the PyTorch function its op follows."""
import numpy as np


def _f64(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


# ---- elementwise -----------------------------------------------------------------

def relu(x):
    (x,) = _f64(x)
    return np.where(x < 0, 0.0, x)


def relu_backward(x, dy):
    x, dy = _f64(x, dy)
    return np.where(x > 0, dy, 0.0)


def add(a, b):
    a, b = _f64(a, b)
    return a + b


# ---- gemm / linear ---------------------------------------------------------------

def sgemm(a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, c=None):
    a, b = _f64(a, b)
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    y = alpha * (a @ b)
    if beta != 0.0:
        y = y + beta * np.asarray(c, np.float64)
    return y


def linear(x, w, b=None):
    x, w = _f64(x, w)
    y = x @ w.T
    return y if b is None else y + np.asarray(b, np.float64)


def linear_backward(x, w, dy):
    x, w, dy = _f64(x, w, dy)
    x2 = x.reshape(-1, w.shape[1])
    dy2 = dy.reshape(-1, w.shape[0])
    return (dy2 @ w).reshape(x.shape), dy2.T @ x2, dy2.sum(axis=0)



# ---- convolution -----------------------------------------------------------------


# ---- pooling ---------------------------------------------------------------------


# ---- batch norm ------------------------------------------------------------------


# ---- loss ------------------------------------------------------------------------


# ---- optimizers ------------------------------------------------------------------
