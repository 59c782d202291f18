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


# ---- convolution -----------------------------------------------------------------


# ---- pooling ---------------------------------------------------------------------


# ---- batch norm ------------------------------------------------------------------

def _bn_axes(x):
    """The axes statistics run over (all but the channel axis 1) and a per-channel reshape."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return axes, shape


def batch_norm_train(x, gamma, beta, eps, running_mean=None, running_var=None, momentum=0.1):
    """torch.nn.functional.batch_norm(training=True): returns (y, mean, invstd, new
    running_mean, new running_var); the running statistics use the unbiased variance."""
    x, gamma, beta = _f64(x, gamma, beta)
    axes, shape = _bn_axes(x)
    m = x.size // x.shape[1]
    mean = x.mean(axis=axes)
    var = ((x - mean.reshape(shape)) ** 2).mean(axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean.reshape(shape)) * (invstd * gamma).reshape(shape) + beta.reshape(shape)
    rm = rv = None
    if running_mean is not None:
        rm = (1 - momentum) * np.asarray(running_mean, np.float64) + momentum * mean
        rv = (1 - momentum) * np.asarray(running_var, np.float64) + momentum * var * m / (m - 1)
    return y, mean, invstd, rm, rv


def batch_norm_infer(x, gamma, beta, running_mean, running_var, eps):
    x, gamma, beta, rm, rv = _f64(x, gamma, beta, running_mean, running_var)
    _, shape = _bn_axes(x)
    return (x - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + eps) * gamma.reshape(shape) \
        + beta.reshape(shape)


def batch_norm_backward(x, gamma, dy, mean, invstd):
    """Gradients of the training forward, given its saved mean and invstd: (dx, dgamma, dbeta)."""
    x, gamma, dy, mean, invstd = _f64(x, gamma, dy, mean, invstd)
    axes, shape = _bn_axes(x)
    m = x.size // x.shape[1]
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    dbeta = dy.sum(axis=axes)
    dgamma = (dy * xhat).sum(axis=axes)
    dx = (gamma * invstd / m).reshape(shape) * (
        m * dy - dbeta.reshape(shape) - xhat * dgamma.reshape(shape))
    return dx, dgamma, dbeta



# ---- loss ------------------------------------------------------------------------


# ---- optimizers ------------------------------------------------------------------
