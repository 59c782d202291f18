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
    ph, pw = padding
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

def pool_output_size(size, k, s, p, ceil_mode):
    """PyTorch's pooling output size, counted window by window over the padded input
    [-p, size + p) of length L: in floor mode the windows that fit in it; in ceil mode
    also one that runs past its end when the window before did not reach the end,
    unless it would start in the right padding (PyTorch's last-window rule)."""
    length = size + 2 * p
    out = 0
    while True:
        if ceil_mode:
            ok = (out - 1) * s + k < length and out * s - p < size
        else:
            ok = out * s + k <= length
        if not ok:
            return out
        out += 1


def _windows(size, k, s, p, out):
    """For each output position: (first, last + 1) of the in-bounds part of its
    window and the number of its positions inside the padded input [-p, size + p)."""
    spans = []
    for o in range(out):
        taps = [o * s - p + t for t in range(k)]
        inside = [i for i in taps if 0 <= i < size]
        counted = sum(1 for i in taps if -p <= i < size + p)
        spans.append((inside[0], inside[-1] + 1, counted))
    return spans


def _pool_geometry(x, kernel, stride, padding, ceil_mode):
    kh, kw = kernel
    sh, sw = stride
    ph, pw = padding
    h, w = x.shape[2:]
    ho = pool_output_size(h, kh, sh, ph, ceil_mode)
    wo = pool_output_size(w, kw, sw, pw, ceil_mode)
    return _windows(h, kh, sh, ph, ho), _windows(w, kw, sw, pw, wo)


def _window_argmax(win):
    """(N, C, kh*kw) window values in row-major order -> (max, index) with PyTorch's
    CPU rule: start at -inf with index 0; an element replaces the max when it is
    greater or NaN (ties: first wins; with NaNs: the last NaN)."""
    m = np.full(win.shape[:2], -np.inf)
    idx = np.zeros(win.shape[:2], np.int64)
    for t in range(win.shape[2]):
        v = win[:, :, t]
        take = (v > m) | np.isnan(v)
        m = np.where(take, v, m)
        idx = np.where(take, t, idx)
    return m, idx


def max_pool2d(x, kernel, stride, padding, ceil_mode=False):
    (x,) = _f64(x)
    rows, cols = _pool_geometry(x, kernel, stride, padding, ceil_mode)
    y = np.empty(x.shape[:2] + (len(rows), len(cols)))
    for i, (h0, h1, _) in enumerate(rows):
        for j, (w0, w1, _) in enumerate(cols):
            win = x[:, :, h0:h1, w0:w1].reshape(x.shape[0], x.shape[1], -1)
            y[:, :, i, j] = _window_argmax(win)[0]
    return y


def max_pool2d_backward(x, dy, kernel, stride, padding, ceil_mode=False):
    x, dy = _f64(x, dy)
    rows, cols = _pool_geometry(x, kernel, stride, padding, ceil_mode)
    n, c = x.shape[:2]
    dx = np.zeros_like(x)
    nn, cc = np.meshgrid(np.arange(n), np.arange(c), indexing="ij")
    for i, (h0, h1, _) in enumerate(rows):
        for j, (w0, w1, _) in enumerate(cols):
            win = x[:, :, h0:h1, w0:w1].reshape(n, c, -1)
            t = _window_argmax(win)[1]
            dx[nn, cc, h0 + t // (w1 - w0), w0 + t % (w1 - w0)] += dy[:, :, i, j]
    return dx


def max_pool2d_taps(x, kernel, stride, padding, ceil_mode=False):
    """Each window's argmax as ky * kw + kx from its unclipped top-left corner."""
    (x,) = _f64(x)
    rows, cols = _pool_geometry(x, kernel, stride, padding, ceil_mode)
    tap = np.empty(x.shape[:2] + (len(rows), len(cols)), np.int64)
    for i, (h0, h1, _) in enumerate(rows):
        for j, (w0, w1, _) in enumerate(cols):
            win = x[:, :, h0:h1, w0:w1].reshape(x.shape[0], x.shape[1], -1)
            t = _window_argmax(win)[1]
            ky = h0 + t // (w1 - w0) - (i * stride[0] - padding[0])
            kx = w0 + t % (w1 - w0) - (j * stride[1] - padding[1])
            tap[:, :, i, j] = ky * kernel[1] + kx
    return tap


def avg_pool2d(x, kernel, stride, padding, ceil_mode=False):
    """count_include_pad=True: divide by the window positions inside the padded input."""
    (x,) = _f64(x)
    rows, cols = _pool_geometry(x, kernel, stride, padding, ceil_mode)
    y = np.empty(x.shape[:2] + (len(rows), len(cols)))
    for i, (h0, h1, hc) in enumerate(rows):
        for j, (w0, w1, wc) in enumerate(cols):
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].sum((2, 3)) / (hc * wc)
    return y


def avg_pool2d_backward(x_shape, dy, kernel, stride, padding, ceil_mode=False):
    (dy,) = _f64(dy)
    dx = np.zeros(x_shape)
    rows, cols = _pool_geometry(dx, kernel, stride, padding, ceil_mode)
    for i, (h0, h1, hc) in enumerate(rows):
        for j, (w0, w1, wc) in enumerate(cols):
            dx[:, :, h0:h1, w0:w1] += (dy[:, :, i, j] / (hc * wc))[:, :, None, None]
    return dx


def global_avg_pool2d(x):
    (x,) = _f64(x)
    return x.mean((2, 3))


def global_avg_pool2d_backward(x_shape, dy):
    (dy,) = _f64(dy)
    n, c, h, w = x_shape
    return np.broadcast_to(dy[:, :, None, None] / (h * w), x_shape).copy()


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
