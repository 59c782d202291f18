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

def _conv_windows(xp, kh, kw, stride, ho, wo):
    """(i, j, view) for every kernel offset: view[n, c, oh, ow] = xp[n, c, oh*sh + i, ow*sw + j]."""
    sh, sw = stride
    for i in range(kh):
        for j in range(kw):
            yield i, j, (slice(None), slice(None), slice(i, i + sh * (ho - 1) + 1, sh),
                         slice(j, j + sw * (wo - 1) + 1, sw))


def conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    """torch.nn.functional.conv2d: zero-pad x, then add up one (C_out x C_in) matrix
    product per kernel offset over the strided window view of the padded input."""
    x, w = _f64(x, w)
    (ph, pw), (sh, sw) = padding, stride
    c_out, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (xp.shape[2] - kh) // sh + 1
    wo = (xp.shape[3] - kw) // sw + 1
    y = np.zeros((x.shape[0], c_out, ho, wo))
    for i, j, win in _conv_windows(xp, kh, kw, stride, ho, wo):
        y += np.einsum("nchw,oc->nohw", xp[win], w[:, :, i, j])
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return y


def conv2d_backward(x, w, dy, stride=(1, 1), padding=(0, 0)):
    """(dx, dw, db) of conv2d for the output gradient dy: the exact adjoint of the
    forward above, offset by offset."""
    x, w, dy = _f64(x, w, dy)
    (ph, pw), (sh, sw) = padding, stride
    _, _, h, wd = x.shape
    _, _, kh, kw = w.shape
    ho, wo = dy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for i, j, win in _conv_windows(xp, kh, kw, stride, ho, wo):
        dxp[win] += np.einsum("nohw,oc->nchw", dy, w[:, :, i, j])
        dw[:, :, i, j] = np.einsum("nohw,nchw->oc", dy, xp[win])
    dx = dxp[:, :, ph:ph + h, pw:pw + wd]
    return dx, dw, dy.sum(axis=(0, 2, 3))


# ---- pooling ---------------------------------------------------------------------


# ---- batch norm ------------------------------------------------------------------


# ---- loss ------------------------------------------------------------------------


# ---- optimizers ------------------------------------------------------------------
