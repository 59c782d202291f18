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
argument and the value expected.  NaN and Inf flow through like any number,
except: a Winograd convolution spreads them over its output tile (README, "The
functional API"); dropout's zeros replace what they drop, NaN included; and
relu_backward passes no gradient where x is NaN.

Devices: every op also takes arrays of one device (minidl.device: sim, cuda) and
runs there, its results staying on that device; operands on different devices
raise ValueError (copies are explicit: device.to_device / device.to_host).  On a
device, inputs must already be float32 (nothing is converted there).  `device=`
("sim", "cuda:0", a Device) runs an op on that device, copying its host inputs
there first (counted); arrays an op updates in place must already be there.
"""
from __future__ import annotations

import functools
import inspect
import numbers
from typing import Optional, Tuple, Union

import numpy as np

from minidl import _C
from minidl.device import DeviceArray, get_device
from minidl.device import fill as _fill

IntPair = Union[int, Tuple[int, int]]

__all__ = [
    "sgemm",
    "conv2d", "conv2d_fused", "conv2d_pooled", "conv2d_backward",
    "max_pool2d", "max_pool2d_backward", "max_pool2d_argmax", "max_pool2d_backward_argmax",
    "avg_pool2d", "avg_pool2d_backward",
    "global_avg_pool2d", "global_avg_pool2d_backward",
    "relu", "relu_backward", "add", "affine_add", "dropout", "dropout_backward",
    "batch_norm", "batch_norm_stats", "batch_norm_backward",
    "batch_norm_add_relu_backward",
    "linear", "linear_backward",
    "softmax_cross_entropy",
    "sgd_step", "adam_step",
]

# ---- argument checking (shared by every op) ----------------------------------


_F32 = np.dtype(np.float32)


def _not_array(name: str, a) -> TypeError:
    return TypeError(f"{name} must be a numpy.ndarray or a device array, got {type(a).__name__}")


def _input(name: str, a, ndim: Optional[int] = None, layout: str = "") -> np.ndarray:
    """A read-only operand as a C-contiguous float32 array (converted if needed; device
    arrays are always C-contiguous and must already be float32)."""
    if type(a) is np.ndarray and a.dtype is _F32 and a.flags.c_contiguous \
            and (ndim is None or a.ndim == ndim):
        return a  # the common case, as it is
    host = isinstance(a, np.ndarray)
    if not host and not isinstance(a, DeviceArray):
        raise _not_array(name, a)
    if a.dtype != np.float32:
        if a.dtype.kind != "f" or not host:
            raise TypeError(f"{name} must be a float32 array, got dtype {a.dtype}")
        a = a.astype(np.float32)
    if ndim is not None and a.ndim != ndim:
        what = f" {layout}" if layout else ""
        raise ValueError(f"{name} must be {ndim}-D{what}, got shape {a.shape}")
    return np.ascontiguousarray(a) if host else a


def _inout(name: str, a, shape: Tuple[int, ...]) -> np.ndarray:
    """An array updated in place: must be C-contiguous, writable float32 of `shape`."""
    host = isinstance(a, np.ndarray)
    if not host and not isinstance(a, DeviceArray):
        raise _not_array(name, a)
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 array (it is updated in place), got dtype {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    if host and not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (it is updated in place)")
    if host and not a.flags.writeable:
        raise ValueError(f"{name} must be writable (it is updated in place)")
    return a


def _kernels(**operands):
    """The kernels for the operands' device (minidl._C for NumPy arrays); all operands
    (None skipped) must live on one device."""
    for a in operands.values():
        if a is not None and type(a) is not np.ndarray:
            break
    else:
        return _C  # the NumPy path
    devices = {None if isinstance(a, np.ndarray) else a.device
               for a in operands.values() if a is not None}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {'cpu (NumPy)' if isinstance(a, np.ndarray) else a.device.name}"
                          for k, a in operands.items() if a is not None)
        raise ValueError(f"operands must be on one device, got {where}; move them explicitly "
                         f"(device.to_device / device.to_host)")
    device = devices.pop()
    return _C if device is None else device.kernels  # None: subclasses of ndarray


def _empty(like, shape, dtype=np.float32):
    """An uninitialised output on like's device."""
    return np.empty(shape, dtype) if isinstance(like, np.ndarray) else like.device.empty(shape, dtype)


def _workspace(k, like, size_fn: str, *args):
    """Scratch for a device kernel (None on the host and where kernels take their own)."""
    return None if k is _C else like.device.workspace(getattr(k, size_fn)(*args))


def _overlap(a, b) -> bool:
    if isinstance(a, DeviceArray) or isinstance(b, DeviceArray):
        return getattr(a, "mem", None) is getattr(b, "mem", 0)
    return np.shares_memory(a, b)


def _shape_arg(name: str, x, ndim: int, layout: str) -> Tuple[int, ...]:
    """The shape of x, or x itself when it is a shape tuple (ops that need only x's shape)."""
    if isinstance(x, tuple):
        if len(x) != ndim or not all(isinstance(d, numbers.Integral) and d >= 0 for d in x):
            raise ValueError(f"{name} must be a {ndim}-D array {layout} or its shape, got {x!r}")
        return tuple(int(d) for d in x)
    return _input(name, x, ndim, layout).shape


def _int(name: str, v, minimum: int) -> int:
    if type(v) is int and v >= minimum:
        return v
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
    return None if a is None else a.ravel()


# ---- GEMM -------------------------------------------------------------------------


def sgemm(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False, trans_b: bool = False,
          alpha: float = 1.0, beta: float = 0.0, out: Optional[np.ndarray] = None) -> np.ndarray:
    """alpha * op(a) @ op(b) + beta * out, with op(x) = x.T when trans_x.

    a: (m, k), or (k, m) with trans_a; b: (k, n), or (n, k) with trans_b.
    Returns out (m, n), written in place when given; beta != 0 needs out.
    """
    for name, flag in (("trans_a", trans_a), ("trans_b", trans_b)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
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
        out = _empty(a, (m, n))  # on a's device; a device check follows
    else:
        _inout("out", out, (m, n))
        if _overlap(out, a) or _overlap(out, b):
            raise ValueError("sgemm: out must not overlap a or b")
    kern = _kernels(a=a, b=b, out=out)
    kern.sgemm(bool(trans_a), bool(trans_b), m, n, k, alpha, a.reshape(-1), max(a.shape[1], 1),
               b.reshape(-1), max(b.shape[1], 1), beta, out.reshape(-1), max(n, 1),
               _workspace(kern, a, "sgemm_workspace_size", m, n, k))
    return out


# ---- convolution ------------------------------------------------------------------


def _conv_shapes(x: np.ndarray, w: np.ndarray, stride, padding):
    """Checks x, w and the hyper-parameters; returns the 11-tuple shape of the C
    API and the output size (h_out, w_out)."""
    n, c_in, h, wd = x.shape
    c_out, w_c_in, kh, kw = w.shape
    if c_in < 1 or h < 1 or wd < 1:
        raise ValueError(f"x (N, C_in, H, W) must have C_in, H and W >= 1, got shape {x.shape}")
    if c_out < 1 or kh < 1 or kw < 1:
        raise ValueError(f"w (C_out, C_in, kh, kw) must have C_out, kh and kw >= 1, "
                         f"got shape {w.shape}")
    if w_c_in != c_in:
        raise ValueError(f"w must have C_in = {c_in} input channels (x.shape[1]) in dimension 1, "
                         f"got w of shape {w.shape}")
    sh, sw = _pair("stride", stride, 1)
    ph, pw = _pair("padding", padding, 0)
    hp, wp = h + 2 * ph, wd + 2 * pw
    if hp < kh or wp < kw:
        raise ValueError(f"output too small: kernel (kh, kw) = ({kh}, {kw}) is larger than the "
                         f"padded input (H + 2*pad_h, W + 2*pad_w) = ({hp}, {wp}); "
                         f"use a smaller kernel or more padding")
    shape = (n, c_in, h, wd, c_out, kh, kw, sh, sw, ph, pw)
    return shape, _C.conv2d_output_size((max(n, 1),) + shape[1:])


def _conv_args(x, w, b, stride, padding):
    """x, w, b checked and converted; the C shape tuple and the output size."""
    x = _input("x", x, 4, "(N, C_in, H, W)")
    w = _input("w", w, 4, "(C_out, C_in, kh, kw)")
    shape, (ho, wo) = _conv_shapes(x, w, stride, padding)
    c_out = shape[4]
    if b is not None:
        b = _input("b", b, 1, "(C_out,)")
        if b.shape != (c_out,):
            raise ValueError(f"b must have shape (C_out,) = ({c_out},), got {b.shape}")
    return x, w, b, shape, ho, wo


def _input_map(x, scale, shift):
    """The per-channel map (scale, shift) through which an op reads x: both or neither,
    each (C,) with C = x.shape[1]."""
    if (scale is None) != (shift is None):
        raise ValueError("x_scale and x_shift must be given together (or neither)")
    if scale is None:
        return None, None
    c = x.shape[1]
    return _bn_param("x_scale", scale, c), _bn_param("x_shift", shift, c)


def conv2d(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None, *,
           stride: IntPair = 1, padding: IntPair = 0, relu: bool = False) -> np.ndarray:
    """2-D convolution (cross-correlation) with zero padding [torch.nn.functional.conv2d].

    x: (N, C_in, H, W), w: (C_out, C_in, kh, kw), b: (C_out,) or None.
    stride (>= 1) and padding (>= 0): an int or an (h, w) pair.
    relu: return max(y, 0), applied by the convolution's epilogue (no second pass);
    NaN stays NaN, as in relu.
    Returns y: (N, C_out, H_out, W_out), H_out = (H + 2 * pad_h - kh) // stride_h + 1.
    """
    x, w, b, shape, ho, wo = _conv_args(x, w, b, stride, padding)
    k = _kernels(x=x, w=w, b=b)
    y = _empty(x, (x.shape[0], shape[4], ho, wo))
    if x.shape[0] == 0:
        return y
    # no workspace: without channel sums a device's forward needs none, and the host's
    # kernels take their own
    if relu:
        k.conv2d_forward_ex(shape, x.reshape(-1), w.reshape(-1), _flat(b), True, None, None,
                            y.reshape(-1))
    else:
        k.conv2d_forward(shape, x.reshape(-1), w.reshape(-1), _flat(b), y.reshape(-1))
    return y


def conv2d_pooled(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None, *,
                  stride: IntPair = 1, padding: IntPair = 0, relu: bool = False,
                  pool: str = "max", kernel_size: IntPair, pool_stride: Optional[IntPair] = None,
                  pool_padding: IntPair = 0, ceil_mode: bool = False,
                  pool_relu: bool = False) -> np.ndarray:
    """conv2d (stride, padding, relu as there), then max_pool2d (pool "max") or
    avg_pool2d (pool "avg") of its output (kernel_size, pool_stride, pool_padding,
    ceil_mode as their kernel_size, stride, padding, ceil_mode), then a ReLU when
    pool_relu: the same values as those ops in turn.  On the host each image's
    convolution output is pooled while it is in the cache, so it never reaches memory;
    on a device the ops run in turn.  Returns (N, C_out, pooled H, pooled W)."""
    if pool not in ("max", "avg"):
        raise ValueError(f"pool must be 'max' or 'avg', got {pool!r}")
    x, w, b, shape, ho, wo = _conv_args(x, w, b, stride, padding)
    k = _kernels(x=x, w=w, b=b)
    n, c_out = x.shape[0], shape[4]
    _, pshape, (pho, pwo) = _pool_args((n, c_out, ho, wo), kernel_size, pool_stride,
                                       pool_padding, ceil_mode)
    if k is not _C or n == 0:
        y = conv2d(x, w, b, stride=stride, padding=padding, relu=relu)
        y = (max_pool2d if pool == "max" else avg_pool2d)(
            y, kernel_size, stride=pool_stride, padding=pool_padding, ceil_mode=ceil_mode)
        return _relu(y) if pool_relu else y
    y = np.empty((n, c_out, pho, pwo), np.float32)
    k.conv2d_forward_pooled(shape, x.reshape(-1), w.reshape(-1), _flat(b), bool(relu), pshape,
                            pool == "avg", bool(pool_relu), y.reshape(-1))
    return y


def conv2d_fused(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None, *,
                 stride: IntPair = 1, padding: IntPair = 0, x_scale: Optional[np.ndarray] = None,
                 x_shift: Optional[np.ndarray] = None, x_relu: bool = False,
                 relu: bool = False, stats: bool = False):
    """conv2d of x read through a per-channel map, with the output's channel sums.

    The convolution reads a = max(x * x_scale[c] + x_shift[c], 0) for each input
    channel c (the max only when x_relu; x_scale and x_shift (C_in,) both given or
    both None), the zero padding staying zero: a BatchNorm's normalisation and the
    ReLU after it applied as each image is read, so a is never written.  relu as in
    conv2d.  Returns (y, channel_sum, channel_sumsq): with stats, the float64 (C_out,)
    sum and sum of squares of the final y over N, H_out and W_out, taken while each
    output tile is in registers (a following BatchNorm's statistics); else None, None.
    """
    x, w, b, shape, ho, wo = _conv_args(x, w, b, stride, padding)
    x_scale, x_shift = _input_map(x, x_scale, x_shift)
    k = _kernels(x=x, w=w, b=b, x_scale=x_scale, x_shift=x_shift)
    c_out = shape[4]
    y = _empty(x, (x.shape[0], c_out, ho, wo))
    sums = (_empty(x, (c_out,), np.float64), _empty(x, (c_out,), np.float64)) if stats \
        else (None, None)
    if x.shape[0] == 0:
        for a in sums:
            if a is not None:
                _fill(a, 0.0)
        return (y,) + sums
    ws = _workspace(k, x, "conv2d_workspace_size", shape)
    k.conv2d_forward_fused(shape, x.reshape(-1), x_scale, x_shift, bool(x_relu), w.reshape(-1),
                           _flat(b), bool(relu), sums[0], sums[1], y.reshape(-1), ws)
    return (y,) + sums


def conv2d_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray, *, stride: IntPair = 1,
                    padding: IntPair = 0, need_dx: bool = True, need_db: bool = True,
                    x_scale: Optional[np.ndarray] = None, x_shift: Optional[np.ndarray] = None,
                    x_relu: bool = False, add_dx_to: Optional[np.ndarray] = None
                    ) -> Tuple[Optional[np.ndarray], np.ndarray, Optional[np.ndarray]]:
    """Gradients of conv2d(x, w, b, stride=stride, padding=padding) given dy = dL/dy.

    x: (N, C_in, H, W), w: (C_out, C_in, kh, kw), dy: (N, C_out, H_out, W_out), exactly
    the output shape.  Returns (dx, dw, db) with the shapes of x, w and (C_out,);
    dx is None when need_dx is False (a network's first layer needs no input gradient)
    and db None when need_db is False (a convolution without bias).  With x_scale,
    x_shift and x_relu (conv2d_fused's input map), the gradients of the convolution of
    the mapped input: dw recomputes it as each image is read, and dx is the gradient
    with respect to the mapped input, not x.  add_dx_to: an existing gradient of x
    (x's shape, C-contiguous writable float32) that dx is added to in place, in the
    kernel's store (a residual block's sum of gradients without a pass of its own);
    it is returned as dx.
    """
    x, w, _, shape, ho, wo = _conv_args(x, w, None, stride, padding)
    x_scale, x_shift = _input_map(x, x_scale, x_shift)
    dy = _input("dy", dy, 4, "(N, C_out, H_out, W_out)")
    n, c_out = x.shape[0], shape[4]
    if dy.shape != (n, c_out, ho, wo):
        raise ValueError(f"dy must have the output shape (N, C_out, H_out, W_out) = "
                         f"{(n, c_out, ho, wo)}, got {dy.shape}")
    if add_dx_to is not None:
        if not need_dx:
            raise ValueError("add_dx_to needs need_dx=True")
        _inout("add_dx_to", add_dx_to, x.shape)
        if _overlap(add_dx_to, dy) or _overlap(add_dx_to, x):
            raise ValueError("add_dx_to must not overlap x or dy")
    k = _kernels(x=x, w=w, dy=dy, x_scale=x_scale, x_shift=x_shift, add_dx_to=add_dx_to)
    dx = add_dx_to if add_dx_to is not None else _empty(x, x.shape) if need_dx else None
    dw = _empty(x, w.shape)
    db = _empty(x, (c_out,)) if need_db else None
    if n == 0:
        for a in (dw, db):
            if a is not None:
                _fill(a, 0.0)
        return dx, dw, db
    if k is _C:  # both gradients in one call, which reads dy once where it can, in the
        # core's own workspace, kept from call to call (a fresh one had every page zeroed)
        k.conv2d_backward(shape, x.reshape(-1), x_scale, x_shift, bool(x_relu), dy.reshape(-1),
                          w.reshape(-1), None if dx is None else dx.reshape(-1),
                          add_dx_to is not None, dw.reshape(-1), False, None)
    else:  # one workspace for both calls
        ws = _workspace(k, x, "conv2d_workspace_size", shape)
        if add_dx_to is not None:
            k.conv2d_backward_data_fused(shape, dy.reshape(-1), w.reshape(-1), dx.reshape(-1),
                                         True, ws)
        elif need_dx:
            k.conv2d_backward_data(shape, dy.reshape(-1), w.reshape(-1), dx.reshape(-1), ws)
        if x_scale is None and not x_relu:
            k.conv2d_backward_weights(shape, x.reshape(-1), dy.reshape(-1), dw.reshape(-1), False,
                                      ws)
        else:
            k.conv2d_backward_weights_fused(shape, x.reshape(-1), x_scale, x_shift, bool(x_relu),
                                            dy.reshape(-1), dw.reshape(-1), False, ws)
    if need_db:
        k.conv2d_backward_bias(shape, dy.reshape(-1), db)
    return dx, dw, db


# ---- pooling ----------------------------------------------------------------------


def _pool_args(x, kernel_size, stride, padding, ceil_mode):
    """x as (N, C, H, W) float32 and the 11-tuple shape of the C API, after the checks
    PyTorch makes (with messages naming the argument).  x may be a shape tuple where
    only its shape is needed (it is returned as is then)."""
    x_shape = _shape_arg("x", x, 4, "(N, C, H, W)")
    if not isinstance(x, tuple):
        x = _input("x", x, 4, "(N, C, H, W)")
    kh, kw = _pair("kernel_size", kernel_size, 1)
    sh, sw = (kh, kw) if stride is None else _pair("stride", stride, 1)
    ph, pw = _pair("padding", padding, 0)
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(f"padding must be at most half of kernel_size: at most "
                         f"({kh // 2}, {kw // 2}) for kernel_size ({kh}, {kw}), got ({ph}, {pw})")
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise TypeError(f"ceil_mode must be a bool, got {ceil_mode!r}")
    n, c, h, w = x_shape
    if h == 0 or w == 0:
        raise ValueError(f"x must have H >= 1 and W >= 1, got shape {x_shape}")
    geometry = (h, w, kh, kw, sh, sw, ph, pw, int(bool(ceil_mode)))
    # the output size (PyTorch's rule, ceil mode included) comes from the C core, which
    # raises "output too small" when it is < 1; it does not depend on n and c
    return x, (n, c) + geometry, _C.pool2d_output_size((1, 1) + geometry)


def _pool_forward(kernel: str, x, kernel_size, stride, padding, ceil_mode) -> np.ndarray:
    x, shape, (ho, wo) = _pool_args(x, kernel_size, stride, padding, ceil_mode)
    k = _kernels(x=x)
    y = _empty(x, x.shape[:2] + (ho, wo))
    if y.size:
        getattr(k, kernel)(shape, x.reshape(-1), y.reshape(-1))
    return y


def _pool_dy(dy, n: int, c: int, ho: int, wo: int) -> np.ndarray:
    dy = _input("dy", dy, 4, "(N, C, H_out, W_out)")
    if dy.shape != (n, c, ho, wo):
        raise ValueError(f"dy must have the output shape {(n, c, ho, wo)}, got {dy.shape}")
    return dy


def max_pool2d(x: np.ndarray, kernel_size: IntPair, *, stride: Optional[IntPair] = None,
               padding: IntPair = 0, ceil_mode: bool = False,
               x_scale: Optional[np.ndarray] = None, x_shift: Optional[np.ndarray] = None,
               x_relu: bool = False) -> np.ndarray:
    """Max over each window [torch.nn.functional.max_pool2d]: x (N, C, H, W) ->
    (N, C, H_out, W_out).  kernel_size, stride, padding: int or (h, w); stride None
    means kernel_size; padding (never the maximum) at most kernel_size // 2.  NaN
    propagates; ties go to the first element in row-major window order.  x_scale,
    x_shift, x_relu: the pooling of x read through that per-channel map (as in
    conv2d_fused)."""
    if x_scale is None and x_shift is None and not x_relu:
        return _pool_forward("max_pool2d_forward", x, kernel_size, stride, padding, ceil_mode)
    x, shape, (ho, wo) = _pool_args(x, kernel_size, stride, padding, ceil_mode)
    x_scale, x_shift = _input_map(x, x_scale, x_shift)
    k = _kernels(x=x, x_scale=x_scale, x_shift=x_shift)
    y = _empty(x, x.shape[:2] + (ho, wo))
    if y.size:
        k.max_pool2d_forward_fused(shape, x.reshape(-1), x_scale, x_shift, bool(x_relu),
                                   y.reshape(-1))
    return y


def max_pool2d_backward(x: np.ndarray, dy: np.ndarray, kernel_size: IntPair, *,
                        stride: Optional[IntPair] = None, padding: IntPair = 0,
                        ceil_mode: bool = False, x_scale: Optional[np.ndarray] = None,
                        x_shift: Optional[np.ndarray] = None, x_relu: bool = False
                        ) -> np.ndarray:
    """dx (N, C, H, W) for max_pool2d(x, ...): dy (N, C, H_out, W_out) goes to each
    window's maximum (recomputed from x), summed where windows overlap.  With a map
    (x_scale, x_shift, x_relu), the maxima of the mapped input, dx with respect to it."""
    if isinstance(x, tuple):
        raise TypeError("x must be a numpy.ndarray or a device array (max pooling's backward "
                        "reads its values), got tuple")
    x, shape, (ho, wo) = _pool_args(x, kernel_size, stride, padding, ceil_mode)
    dy = _pool_dy(dy, x.shape[0], x.shape[1], ho, wo)
    x_scale, x_shift = _input_map(x, x_scale, x_shift)
    k = _kernels(x=x, dy=dy, x_scale=x_scale, x_shift=x_shift)
    dx = _empty(x, x.shape)
    if not dx.size:
        return dx
    if x_scale is None and not x_relu:
        k.max_pool2d_backward(shape, x.reshape(-1), dy.reshape(-1), dx.reshape(-1))
    else:
        k.max_pool2d_backward_fused(shape, x.reshape(-1), x_scale, x_shift, bool(x_relu),
                                    dy.reshape(-1), dx.reshape(-1))
    return dx


MAX_POOL_TAPS = 256  # a max pooling window's tap is one byte


NO_TAP = _C.POOL_NO_TAP  # the tap of an output that passes no gradient back (relu=True)


def max_pool2d_argmax(x: np.ndarray, kernel_size: IntPair, *, stride: Optional[IntPair] = None,
                      padding: IntPair = 0, ceil_mode: bool = False,
                      x_scale: Optional[np.ndarray] = None, x_shift: Optional[np.ndarray] = None,
                      x_relu: bool = False, relu: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """(y, tap): max_pool2d(x, ...) and, per output, the position of its window's
    maximum as ky * kw + kx from the window's top-left corner (padding included), uint8
    (N, C, H_out, W_out), which is all max_pool2d_backward_argmax needs (1 byte per
    output instead of x).  Windows of at most 256 elements.  Arguments as max_pool2d.
    relu: y = relu(max_pool2d(x, ...)) in the same pass, and the tap NO_TAP where y is
    not above 0, so that the backward from the taps is that of both (the ReLU's mask
    included); windows of at most 255 elements then."""
    x, shape, (ho, wo) = _pool_args(x, kernel_size, stride, padding, ceil_mode)
    taps = MAX_POOL_TAPS - 1 if relu else MAX_POOL_TAPS
    if shape[4] * shape[5] > taps:
        raise ValueError(f"a window of {shape[4]} x {shape[5]} elements has more than "
                         f"{taps} taps: its tap does not fit a byte"
                         f"{' beside NO_TAP' if relu else ''} (use max_pool2d)")
    x_scale, x_shift = _input_map(x, x_scale, x_shift)
    k = _kernels(x=x, x_scale=x_scale, x_shift=x_shift)
    y = _empty(x, x.shape[:2] + (ho, wo))
    tap = _empty(x, y.shape, np.uint8)
    if y.size:
        k.max_pool2d_forward_argmax(shape, x.reshape(-1), x_scale, x_shift, bool(x_relu),
                                    y.reshape(-1), tap.reshape(-1), bool(relu))
    return y, tap


def max_pool2d_backward_argmax(tap: np.ndarray, dy: np.ndarray, x_shape: Tuple[int, ...],
                               kernel_size: IntPair, *, stride: Optional[IntPair] = None,
                               padding: IntPair = 0, ceil_mode: bool = False) -> np.ndarray:
    """dx (x_shape) for max_pool2d_argmax(x, ...) from its taps: dy goes to each window's
    maximum, summed where windows overlap, the same sums as max_pool2d_backward (with
    relu=True, as max_pool2d_backward of relu_backward's dy); NO_TAP sends nothing."""
    x_shape, shape, (ho, wo) = _pool_args(tuple(x_shape), kernel_size, stride, padding,
                                          ceil_mode)
    n, c = shape[0], shape[1]
    dy = _pool_dy(dy, n, c, ho, wo)
    host = isinstance(tap, np.ndarray)
    if not host and not isinstance(tap, DeviceArray):
        raise _not_array("tap", tap)
    if tap.dtype != np.uint8 or tuple(tap.shape) != (n, c, ho, wo):
        raise ValueError(f"tap must be uint8 of shape {(n, c, ho, wo)} (from "
                         f"max_pool2d_argmax), got {tap.dtype} {tuple(tap.shape)}")
    if host:
        tap = np.ascontiguousarray(tap)
    k = _kernels(tap=tap, dy=dy)
    dx = _empty(dy, x_shape)
    if dx.size:
        k.max_pool2d_backward_argmax(shape, tap.reshape(-1), dy.reshape(-1), dx.reshape(-1))
    return dx


def avg_pool2d(x: np.ndarray, kernel_size: IntPair, *, stride: Optional[IntPair] = None,
               padding: IntPair = 0, ceil_mode: bool = False) -> np.ndarray:
    """Mean over each window, padding counted [torch.nn.functional.avg_pool2d,
    count_include_pad=True]: x (N, C, H, W) -> (N, C, H_out, W_out).  Arguments as
    for max_pool2d; in ceil mode a window reaching past the padded input divides by
    the part that lies inside it, as PyTorch does."""
    return _pool_forward("avg_pool2d_forward", x, kernel_size, stride, padding, ceil_mode)


def avg_pool2d_backward(x: np.ndarray, dy: np.ndarray, kernel_size: IntPair, *,
                        stride: Optional[IntPair] = None, padding: IntPair = 0,
                        ceil_mode: bool = False, relu: bool = False) -> np.ndarray:
    """dx (N, C, H, W) for avg_pool2d(x, ...), dy (N, C, H_out, W_out); x gives
    only the shape (an array or its shape tuple); dx is on dy's device.  relu: x is the
    output of a ReLU right before the pool (an array), and dx is also that ReLU's
    backward, 0 where x is not above 0, in the same pass (relu_backward(x, dx))."""
    if relu and isinstance(x, tuple):
        raise TypeError("avg_pool2d_backward(relu=True) needs x itself (the ReLU's "
                        "output), not its shape")
    x, shape, (ho, wo) = _pool_args(x, kernel_size, stride, padding, ceil_mode)
    dy = _pool_dy(dy, shape[0], shape[1], ho, wo)
    k = _kernels(dy=dy, x=x if relu else None)
    dx = _empty(dy, shape[:4])
    if dx.size:
        k.avg_pool2d_backward(shape, dy.reshape(-1), dx.reshape(-1),
                              x.reshape(-1) if relu else None)
    return dx


def global_avg_pool2d(x: np.ndarray) -> np.ndarray:
    """Mean over H and W: x (N, C, H, W) -> (N, C) [x.mean((2, 3))]."""
    x = _input("x", x, 4, "(N, C, H, W)")
    n, c, h, w = x.shape
    if h == 0 or w == 0:
        raise ValueError(f"x must have H >= 1 and W >= 1, got shape {x.shape}")
    k = _kernels(x=x)
    y = _empty(x, (n, c))
    if y.size:
        k.global_avg_pool2d_forward(n, c, h, w, x.reshape(-1), y.reshape(-1))
    return y


def global_avg_pool2d_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx (N, C, H, W) = dy (N, C) / (H * W) broadcast; x gives only the shape (an
    array or its shape tuple); dx is on dy's device."""
    n, c, h, w = x_shape = _shape_arg("x", x, 4, "(N, C, H, W)")
    if h == 0 or w == 0:
        raise ValueError(f"x must have H >= 1 and W >= 1, got shape {x_shape}")
    dy = _input("dy", dy, 2, "(N, C)")
    if dy.shape != (n, c):
        raise ValueError(f"dy must have shape (N, C) = {(n, c)}, got {dy.shape}")
    k = _kernels(dy=dy)
    dx = _empty(dy, x_shape)
    if dx.size:
        k.global_avg_pool2d_backward(n, c, h, w, dy.reshape(-1), dx.reshape(-1))
    return dx


# ---- elementwise ------------------------------------------------------------------


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0), any shape [torch.nn.functional.relu]."""
    x = _input("x", x)
    k = _kernels(x=x)
    y = _empty(x, x.shape)
    k.relu_forward(x.reshape(-1), y.reshape(-1))
    return y


_relu = relu  # for the ops whose argument `relu` hides it


def relu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx = dy where x > 0, else 0; x and dy of the same shape."""
    x = _input("x", x)
    dy = _input("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    k = _kernels(x=x, dy=dy)
    dx = _empty(x, x.shape)
    k.relu_backward(x.reshape(-1), dy.reshape(-1), dx.reshape(-1))
    return dx


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b for arrays of the same shape (no broadcasting) [torch.add]."""
    a = _input("a", a)
    b = _input("b", b)
    if a.shape != b.shape:
        raise ValueError(f"b must have the shape of a {a.shape} (no broadcasting), got {b.shape}")
    k = _kernels(a=a, b=b)
    y = _empty(a, a.shape)
    k.add(a.reshape(-1), b.reshape(-1), y.reshape(-1))
    return y


def affine_add(a: np.ndarray, b: Optional[np.ndarray] = None, *,
               a_scale: Optional[np.ndarray] = None, a_shift: Optional[np.ndarray] = None,
               a_relu: bool = False, b_scale: Optional[np.ndarray] = None,
               b_shift: Optional[np.ndarray] = None, b_relu: bool = False,
               relu: bool = False) -> np.ndarray:
    """act(fa(a) + fb(b)) in one pass, per channel of (N, C, ...) arrays of one shape:
    f(x) = max(x * scale[c] + shift[c], 0) with each operand's (C,) scale and shift
    (both or neither) and ReLU flag, act = max(., 0) when relu.  b None: act(fa(a)).
    A BatchNorm's normalisation, a residual addition and the ReLU after them without
    writing the normalised operands."""
    a = _input("a", a)
    if a.ndim < 2:
        raise ValueError(f"a must be (N, C, ...), at least 2-D, got shape {a.shape}")
    a_scale, a_shift = _input_map(a, a_scale, a_shift)
    if b is not None:
        b = _input("b", b)
        if b.shape != a.shape:
            raise ValueError(f"b must have the shape of a {a.shape}, got {b.shape}")
        b_scale, b_shift = _input_map(b, b_scale, b_shift)
    elif b_scale is not None or b_shift is not None or b_relu:
        raise ValueError("b_scale, b_shift and b_relu need an operand b")
    k = _kernels(a=a, b=b, a_scale=a_scale, a_shift=a_shift, b_scale=b_scale, b_shift=b_shift)
    y = _empty(a, a.shape)
    n, c = a.shape[:2]
    if a.size:
        k.affine_add(n, c, a.size // (n * c), a.reshape(-1), a_scale, a_shift, bool(a_relu),
                     _flat(b), b_scale, b_shift, bool(b_relu), bool(relu), y.reshape(-1))
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
    k = _kernels(x=x)
    y = _empty(x, x.shape)
    k.dropout_forward(p, _seed(seed), x.reshape(-1), y.reshape(-1))
    return y


def dropout_backward(dy: np.ndarray, p: float = 0.5, *, seed: int) -> np.ndarray:
    """dx for dropout(x, p, seed=seed): dy masked and scaled the same way."""
    dy = _input("dy", dy)
    p = _float("p", p, 0.0, 1.0, hi_open=True)
    k = _kernels(dy=dy)
    dx = _empty(dy, dy.shape)
    k.dropout_backward(p, _seed(seed), dy.reshape(-1), dx.reshape(-1))
    return dx


# ---- batch norm -------------------------------------------------------------------


def _bn_x(x, name: str = "x") -> Tuple[np.ndarray, int, int, int]:
    """x as (N, C), (N, C, L) or (N, C, H, W) float32, and its (n, c, hw)."""
    x = _input(name, x)
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"{name} must be 2-D (N, C), 3-D (N, C, L) or 4-D (N, C, H, W), "
                         f"got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {x.shape}")
    n, c = x.shape[:2]
    return x, n, c, x.size // (n * c)


def _bn_param(name: str, a, c: int, fill: Optional[float] = None, like=None) -> np.ndarray:
    """A per-channel (C,) operand; None means `fill` (on like's device) where allowed."""
    if a is None and fill is not None:
        if isinstance(like, DeviceArray):
            return like.device.full((c,), fill)
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
    copies of running_mean and 1 / sqrt(running_var + eps) -- on a device (None, None)
    instead: inference keeps its statistics in running_mean and running_var.
    """
    x, n, c, hw = _bn_x(x)
    gamma = _bn_param("gamma", gamma, c, 1.0, x)
    beta = _bn_param("beta", beta, c, 0.0, x)
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"training must be a bool, got {training!r}")
    eps = _float("eps", eps, 0.0, np.inf, hi_open=True)
    if (running_mean is None) != (running_var is None):
        given = "running_mean" if running_mean is not None else "running_var"
        raise ValueError(f"running_mean and running_var must be given together, got only {given}")
    if running_mean is not None:
        _inout("running_mean", running_mean, (c,))
        _inout("running_var", running_var, (c,))
        _distinct(dict(x=x, gamma=gamma, beta=beta) if training else None,
                  running_mean=running_mean, running_var=running_var)
    k = _kernels(x=x, gamma=gamma, beta=beta, running_mean=running_mean,
                 running_var=running_var)
    if training:
        momentum = _float("momentum", momentum, 0.0, 1.0)
        if n * hw <= 1:
            raise ValueError(f"expected more than 1 value per channel when training, "
                             f"got x of shape {x.shape}")
        y = _empty(x, x.shape)
        mean = _empty(x, (c,))
        invstd = _empty(x, (c,))
        k.batch_norm_forward_train(n, c, hw, x.reshape(-1), gamma, beta, eps, momentum,
                                   running_mean, running_var, y.reshape(-1), mean, invstd)
        return y, mean, invstd
    if running_mean is None:
        raise ValueError("batch_norm with training=False needs running_mean and running_var")
    y = _empty(x, x.shape)
    k.batch_norm_forward_infer(n, c, hw, x.reshape(-1), gamma, beta, running_mean,
                               running_var, eps, y.reshape(-1))
    if k is not _C:
        return y, None, None
    invstd = (1.0 / np.sqrt(running_var.astype(np.float64) + eps)).astype(np.float32)
    return y, running_mean.copy(), invstd


def batch_norm_stats(channel_sum, channel_sumsq, count: int, gamma: Optional[np.ndarray],
                     beta: Optional[np.ndarray], *, running_mean: Optional[np.ndarray] = None,
                     running_var: Optional[np.ndarray] = None, momentum: float = 0.1,
                     eps: float = 1e-5) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """batch_norm's training statistics from float64 (C,) sums of its count inputs per
    channel (conv2d_fused(stats=True)), updating running_mean and running_var as
    batch_norm does.  Returns (mean, invstd, scale, shift), float32 (C,): the batch
    statistics as batch_norm returns them and the normalisation as a map, y = x * scale
    + shift with scale = gamma * invstd and shift = beta - mean * scale."""
    for name, a in (("channel_sum", channel_sum), ("channel_sumsq", channel_sumsq)):
        if not isinstance(a, (np.ndarray, DeviceArray)) or a.dtype != np.float64 or a.ndim != 1:
            raise TypeError(f"{name} must be a float64 (C,) array, got "
                            f"{getattr(a, 'dtype', type(a).__name__)} "
                            f"{getattr(a, 'shape', '')}")
    c = channel_sum.shape[0]
    if channel_sumsq.shape != (c,):
        raise ValueError(f"channel_sumsq must have shape ({c},), got {channel_sumsq.shape}")
    count = _int("count", count, 2)
    gamma = _bn_param("gamma", gamma, c, 1.0, channel_sum)
    beta = _bn_param("beta", beta, c, 0.0, channel_sum)
    momentum = _float("momentum", momentum, 0.0, 1.0)
    eps = _float("eps", eps, 0.0, np.inf, hi_open=True)
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together")
    if running_mean is not None:
        _inout("running_mean", running_mean, (c,))
        _inout("running_var", running_var, (c,))
        _distinct(dict(channel_sum=channel_sum, channel_sumsq=channel_sumsq, gamma=gamma,
                       beta=beta), running_mean=running_mean, running_var=running_var)
    return _batch_norm_stats(channel_sum, channel_sumsq, count, gamma, beta, running_mean,
                             running_var, momentum, eps)


def _batch_norm_stats(channel_sum, channel_sumsq, count, gamma, beta, running_mean, running_var,
                      momentum, eps):
    """batch_norm_stats on operands already checked (a fused BatchNorm's own arrays: it
    runs right after its convolution, where each line of Python costs the most)."""
    c = channel_sum.shape[0]
    k = _kernels(channel_sum=channel_sum, channel_sumsq=channel_sumsq, gamma=gamma, beta=beta,
                 running_mean=running_mean, running_var=running_var)
    out = [_empty(gamma, (c,)) for _ in range(4)]
    k.batch_norm_stats(c, count, channel_sum, channel_sumsq, gamma, beta, eps, momentum,
                       running_mean, running_var, *out)
    return tuple(out)


def batch_norm_backward(x: np.ndarray, gamma: Optional[np.ndarray], dy: np.ndarray,
                        mean: np.ndarray, invstd: np.ndarray, *,
                        relu_scale: Optional[np.ndarray] = None,
                        relu_shift: Optional[np.ndarray] = None
                        ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of batch_norm(x, gamma, beta, training=True).

    x, dy: (N, C[, L | H, W]) of the same shape; gamma (None: ones), mean, invstd: (C,),
    mean and invstd as returned by the forward.  Returns (dx like x, dgamma (C,),
    dbeta (C,)), with xhat = (x - mean) * invstd and m = N * H * W values per channel:
    dbeta = sum(dy), dgamma = sum(dy * xhat),
    dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma).
    With relu_scale and relu_shift (batch_norm_stats' scale and shift), the gradients
    of max(batch_norm(x), 0): dy is the ReLU output's gradient, counted only where
    x * relu_scale + relu_shift > 0 (the ReLU's output recomputed, not stored).
    """
    x, n, c, hw = _bn_x(x)
    dy = _input("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    gamma = _bn_param("gamma", gamma, c, 1.0, x)
    mean = _bn_param("mean", mean, c)
    invstd = _bn_param("invstd", invstd, c)
    if (relu_scale is None) != (relu_shift is None):
        raise ValueError("relu_scale and relu_shift must be given together (or neither)")
    if relu_scale is not None:
        relu_scale = _bn_param("relu_scale", relu_scale, c)
        relu_shift = _bn_param("relu_shift", relu_shift, c)
    k = _kernels(x=x, gamma=gamma, dy=dy, mean=mean, invstd=invstd, relu_scale=relu_scale,
                 relu_shift=relu_shift)
    dx = _empty(x, x.shape)
    dgamma = _empty(x, (c,))
    dbeta = _empty(x, (c,))
    if relu_scale is None:
        k.batch_norm_backward(n, c, hw, x.reshape(-1), gamma, dy.reshape(-1), mean, invstd,
                              dx.reshape(-1), dgamma, dbeta)
    else:
        k.batch_norm_relu_backward(n, c, hw, x.reshape(-1), gamma, dy.reshape(-1), mean,
                                   invstd, relu_scale, relu_shift, dx.reshape(-1), dgamma,
                                   dbeta)
    return dx, dgamma, dbeta


def batch_norm_add_relu_backward(s: np.ndarray, b: np.ndarray, gamma: np.ndarray,
                                 beta: np.ndarray, dy: np.ndarray, invstd: np.ndarray, *,
                                 b_scale: Optional[np.ndarray] = None,
                                 b_shift: Optional[np.ndarray] = None, b_relu: bool = False
                                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of y = max(batch_norm(x, gamma, beta) + fb(b), 0) (a residual block's
    end) without x: it is reconstructed from s = batch_norm(x) + fb(b), the sum before
    the ReLU, and b, read through fb (b_scale, b_shift, b_relu as affine_add's):
    x - mean = (s - fb(b) - beta) / (gamma * invstd).  s, b, dy: (N, C, ...) of one
    shape; gamma, beta, invstd (C,), invstd as the forward returned it.  Returns (dx,
    db, dgamma, dbeta): dx, dgamma, dbeta as batch_norm_backward's with dy where s > 0,
    and db = dy where s > 0, else 0, the gradient of fb(b).  Every gamma * invstd must
    be non-zero; the reconstructed xhat is off by about 2**-24 * (|s| + |fb(b)| +
    |beta|) / |gamma|."""
    s, n, c, hw = _bn_x(s, "s")
    b = _input("b", b)
    dy = _input("dy", dy)
    for name, a in (("b", b), ("dy", dy)):
        if a.shape != s.shape:
            raise ValueError(f"{name} must have the shape of s {s.shape}, got {a.shape}")
    b_scale, b_shift = _input_map(b, b_scale, b_shift)
    gamma = _bn_param("gamma", gamma, c)
    beta = _bn_param("beta", beta, c)
    invstd = _bn_param("invstd", invstd, c)
    k = _kernels(s=s, b=b, dy=dy, gamma=gamma, beta=beta, invstd=invstd, b_scale=b_scale,
                 b_shift=b_shift)
    dx, db = _empty(s, s.shape), _empty(s, s.shape)
    dgamma, dbeta = _empty(s, (c,)), _empty(s, (c,))
    k.batch_norm_add_relu_backward(n, c, hw, s.reshape(-1), b.reshape(-1), b_scale, b_shift,
                                   bool(b_relu), gamma, beta, dy.reshape(-1), invstd,
                                   dx.reshape(-1), db.reshape(-1), dgamma, dbeta)
    return dx, db, dgamma, dbeta

# ---- linear -----------------------------------------------------------------------


def _linear_args(x, w):
    """x (*, in) and w (out, in) checked and as float32, with out, in, the leading
    dimensions of x and their product."""
    if isinstance(x, (np.ndarray, DeviceArray)) and x.ndim < 1:  # before _input: it makes 0-D arrays 1-D
        raise ValueError(f"x must have at least 1 dimension (*, in), got shape {x.shape}")
    x = _input("x", x)
    w = _input("w", w, 2, "(out, in)")
    out_f, in_f = w.shape
    if x.shape[-1] != in_f:
        raise ValueError(f"x must have last dimension in = {in_f} (w is {w.shape}), "
                         f"got shape {x.shape}")
    lead = x.shape[:-1]
    return x, w, out_f, in_f, lead, int(np.prod(lead, dtype=np.int64))


def linear(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None) -> np.ndarray:
    """y = x @ w.T + b [torch.nn.functional.linear].

    x: (*, in) with at least one dimension; w: (out, in); b: (out,) or None.
    Returns y (*, out).
    """
    x, w, out_f, in_f, lead, n = _linear_args(x, w)
    if b is not None:
        b = _input("b", b, 1, "(out,)")
        if b.shape != (out_f,):
            raise ValueError(f"b must have shape ({out_f},), got {b.shape}")
    k = _kernels(x=x, w=w, b=b)
    y = _empty(x, lead + (out_f,))
    k.linear_forward(n, in_f, out_f, x.reshape(-1), w.reshape(-1), _flat(b), y.reshape(-1),
                     _workspace(k, x, "linear_workspace_size", n, in_f, out_f))
    return y


def linear_backward(x: np.ndarray, w: np.ndarray,
                    dy: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of y = linear(x, w, b): returns (dx, dw, db).

    x: (*, in); w: (out, in); dy: (*, out) with the leading dimensions of x.
    dx = dy @ w has the shape of x, dw = dy^T @ x is (out, in), db = dy summed
    over the leading dimensions is (out,) (returned whether or not the layer has a bias).
    """
    x, w, out_f, in_f, lead, n = _linear_args(x, w)
    dy = _input("dy", dy)
    if dy.shape != lead + (out_f,):
        raise ValueError(f"dy must have shape {lead + (out_f,)} (x's leading dimensions, out), "
                         f"got {dy.shape}")
    k = _kernels(x=x, w=w, dy=dy)
    dx = _empty(x, x.shape)
    dw = _empty(x, (out_f, in_f))
    db = _empty(x, (out_f,))
    ws = _workspace(k, x, "linear_workspace_size", n, in_f, out_f)
    k.linear_backward_data(n, in_f, out_f, dy.reshape(-1), w.reshape(-1), dx.reshape(-1), ws)
    k.linear_backward_weights(n, in_f, out_f, x.reshape(-1), dy.reshape(-1), dw.reshape(-1),
                              db.reshape(-1), False, ws)
    return dx, dw, db

# ---- loss -------------------------------------------------------------------------


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> Tuple[float, np.ndarray]:
    """Mean softmax cross-entropy and its gradient [torch.nn.functional.cross_entropy,
    reduction="mean"].

    logits: (N, C) float; labels: (N,) integer class indices in [0, C), any integer
    dtype.  Returns (loss, dlogits): loss a Python float, dlogits (N, C) float32 =
    (softmax(logits) - onehot(labels)) / N.  On a device, labels must be int64 there
    too, and their range is checked by the kernel.
    """
    logits = _input("logits", logits, 2, "(N, C)")
    n, c = logits.shape
    if n < 1 or c < 1:
        raise ValueError(f"logits must have N >= 1 rows and C >= 1 classes, "
                         f"got shape {logits.shape}")
    if isinstance(labels, DeviceArray):
        if labels.dtype != np.int64 or labels.shape != (n,):
            raise TypeError(f"labels on a device must be int64 of shape ({n},), got "
                            f"{labels.dtype} {labels.shape}")
        k = _kernels(logits=logits, labels=labels)
        dlogits = _empty(logits, logits.shape)
        loss = k.softmax_cross_entropy(n, c, logits.reshape(-1), labels, dlogits.reshape(-1))
        return float(loss), dlogits
    if not isinstance(labels, np.ndarray):
        raise TypeError(f"labels must be a numpy.ndarray, got {type(labels).__name__}")
    if labels.dtype.kind not in "iu":
        raise TypeError(f"labels must be an integer array (class indices), "
                        f"got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},) to match logits {logits.shape}, "
                         f"got {labels.shape}")
    bad = (labels < 0) | (labels >= c)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"labels[{i}] = {labels[i]} is out of range [0, {c})")
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    k = _kernels(logits=logits, labels=labels)
    dlogits = _empty(logits, logits.shape)
    loss = k.softmax_cross_entropy(n, c, logits.reshape(-1), labels, dlogits.reshape(-1))
    return float(loss), dlogits


# ---- optimizers -------------------------------------------------------------------


def _hyper(message: str, v, ok) -> float:
    """A real hyper-parameter checked as torch.optim does: ValueError(f"{message}: {v}")."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{message.replace('Invalid ', '')} must be a real number, got {v!r}")
    if not ok(float(v)):
        raise ValueError(f"{message}: {v}")
    return float(v)


def _distinct(read=None, **updated) -> None:
    """Arrays updated in place must not overlap one another, nor any array of `read`
    (name -> array), which the kernel reads while it writes them."""
    items = [(k, a) for k, a in updated.items() if a is not None]
    for i, (ka, a) in enumerate(items):
        for kb, b in items[i + 1:] + [(k, r) for k, r in (read or {}).items() if r is not None]:
            if _overlap(a, b):
                raise ValueError(f"{ka} and {kb} must not share memory")


def sgd_step(param: np.ndarray, grad: np.ndarray, momentum_buffer: Optional[np.ndarray] = None,
             *, lr: float, momentum: float = 0.0, dampening: float = 0.0,
             weight_decay: float = 0.0, nesterov: bool = False,
             first_step: bool = False) -> np.ndarray:
    """One SGD step in place [torch.optim.SGD]; param, grad and momentum_buffer share
    one shape.

    g = grad + weight_decay * param; with momentum != 0 the buffer becomes g on the
    first step (first_step=True) and momentum * buf + (1 - dampening) * g after;
    g = g + momentum * buf with nesterov, else buf.  param -= lr * g.
    momentum_buffer (float32, updated in place) is required when momentum != 0.
    Returns param.
    """
    lr = _hyper("Invalid learning rate", lr, lambda v: v >= 0.0)
    momentum = _hyper("Invalid momentum value", momentum, lambda v: v >= 0.0)
    dampening = _hyper("Invalid dampening value", dampening, lambda v: v == v)
    weight_decay = _hyper("Invalid weight_decay value", weight_decay, lambda v: v >= 0.0)
    if nesterov and (momentum <= 0.0 or dampening != 0.0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening "
                         f"(momentum={momentum}, dampening={dampening})")
    if not isinstance(param, (np.ndarray, DeviceArray)):
        raise _not_array("param", param)
    _inout("param", param, param.shape)
    grad = _input("grad", grad)
    if grad.shape != param.shape:
        raise ValueError(f"grad must have the shape of param {param.shape}, got {grad.shape}")
    if momentum_buffer is not None:
        _inout("momentum_buffer", momentum_buffer, param.shape)
    elif momentum != 0.0:
        raise ValueError(f"momentum_buffer is required when momentum != 0 (momentum={momentum})")
    _distinct(param=param, momentum_buffer=momentum_buffer)
    k = _kernels(param=param, grad=grad, momentum_buffer=momentum_buffer)
    k.sgd_step(param.reshape(-1), grad.reshape(-1), _flat(momentum_buffer), lr, momentum,
               dampening, weight_decay, bool(nesterov), bool(first_step))
    return param


def adam_step(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray,
              exp_avg_sq: np.ndarray, *, step: int, lr: float = 1e-3,
              betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
              weight_decay: float = 0.0, decoupled: bool = False) -> np.ndarray:
    """One Adam step in place [torch.optim.Adam], or AdamW with decoupled=True
    [torch.optim.AdamW]; param, grad, exp_avg and exp_avg_sq share one shape.

    step is the 1-based index of this step (bias corrections 1 - beta^step).
    Adam adds weight_decay * param to the gradient; AdamW first multiplies param by
    1 - lr * weight_decay.  exp_avg and exp_avg_sq (float32, zeros before the first
    step) are updated in place.  Returns param.
    """
    lr = _hyper("Invalid learning rate", lr, lambda v: v >= 0.0)
    eps = _hyper("Invalid epsilon value", eps, lambda v: v >= 0.0)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    b1 = _hyper("Invalid beta parameter at index 0", betas[0], lambda v: 0.0 <= v < 1.0)
    b2 = _hyper("Invalid beta parameter at index 1", betas[1], lambda v: 0.0 <= v < 1.0)
    weight_decay = _hyper("Invalid weight_decay value", weight_decay, lambda v: v >= 0.0)
    step = _int("step", step, 1)
    if not isinstance(param, (np.ndarray, DeviceArray)):
        raise _not_array("param", param)
    _inout("param", param, param.shape)
    grad = _input("grad", grad)
    if grad.shape != param.shape:
        raise ValueError(f"grad must have the shape of param {param.shape}, got {grad.shape}")
    _inout("exp_avg", exp_avg, param.shape)
    _inout("exp_avg_sq", exp_avg_sq, param.shape)
    _distinct(param=param, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    k = _kernels(param=param, grad=grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    k.adam_step(param.reshape(-1), grad.reshape(-1), exp_avg.reshape(-1),
                exp_avg_sq.reshape(-1), step, lr, b1, b2, eps, weight_decay, bool(decoupled))
    return param


# ---- device= ----------------------------------------------------------------------

_IN_PLACE = {"sgemm": ("out",), "batch_norm": ("running_mean", "running_var"),
             "conv2d_backward": ("add_dx_to",),
             "batch_norm_stats": ("running_mean", "running_var"),
             "sgd_step": ("param", "momentum_buffer"),
             "adam_step": ("param", "exp_avg", "exp_avg_sq")}
"""Arguments ops update in place: with device=, these must already be on the device."""


def _with_device(f):
    """f with a keyword device=: host NumPy operands are copied to that device first
    (floating ones as float32), and f runs there.  Without device=, f unchanged."""
    sig = inspect.signature(f)
    in_place = _IN_PLACE.get(f.__name__, ())

    @functools.wraps(f)
    def op(*args, device=None, **kwargs):
        if device is None:
            return f(*args, **kwargs)
        dev = get_device(device)
        bound = sig.bind(*args, **kwargs)
        for name, v in bound.arguments.items():
            if isinstance(v, np.ndarray) and dev.kind != "cpu":
                if name in in_place:
                    raise ValueError(f"{f.__name__}(device={dev.name!r}): {name} is updated in "
                                     f"place, so it must already be on {dev.name}, not a host "
                                     f"array (device.to_device)")
                if v.dtype.kind == "f":
                    v = v.astype(np.float32, copy=False)
                bound.arguments[name] = dev.to_device(v)
        return f(*bound.args, **bound.kwargs)

    params = list(sig.parameters.values())
    op.__signature__ = sig.replace(parameters=params + [inspect.Parameter(
        "device", inspect.Parameter.KEYWORD_ONLY, default=None)])
    return op


for _name in __all__:
    globals()[_name] = _with_device(globals()[_name])
del _name
