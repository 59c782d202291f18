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

def softmax_cross_entropy(logits, labels):
    """(mean loss, dlogits) of torch.nn.functional.cross_entropy, reduction="mean"."""
    (z,) = _f64(logits)
    labels = np.asarray(labels, np.int64)
    n = z.shape[0]
    rows = np.arange(n)
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(s[:, 0])
    loss = np.mean(lse - z[rows, labels])
    d = e / s
    d[rows, labels] -= 1.0
    return loss, d / n


# ---- optimizers ------------------------------------------------------------------

def sgd_step(param, grad, buf, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False, first_step=False):
    """torch.optim.SGD, one step: returns (param, momentum buffer or None)."""
    p, g = _f64(param, grad)
    d = g + weight_decay * p if weight_decay != 0 else g
    b = None
    if momentum != 0:
        b = d.copy() if first_step else momentum * np.asarray(buf, np.float64) + (1 - dampening) * d
        d = d + momentum * b if nesterov else b
    return p - lr * d, b


def adam_step(param, grad, exp_avg, exp_avg_sq, *, step, lr, betas, eps, weight_decay=0.0,
              decoupled=False):
    """torch.optim.Adam (decoupled=False) / AdamW (decoupled=True), one step:
    returns (param, exp_avg, exp_avg_sq)."""
    p, g, m, v = _f64(param, grad, exp_avg, exp_avg_sq)
    b1, b2 = betas
    if weight_decay != 0:
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    bc1 = 1 - b1 ** step
    bc2 = 1 - b2 ** step
    denom = np.sqrt(v) / np.sqrt(bc2) + eps
    return p - lr / bc1 * m / denom, m, v
