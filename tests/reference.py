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


# ---- loss ------------------------------------------------------------------------


# ---- optimizers ------------------------------------------------------------------
