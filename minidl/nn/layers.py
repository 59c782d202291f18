"""Layers: parameters, shape inference and forward/backward through minidl.ops.

A layer works on whole batches but reasons about per-sample shapes: `build` takes
the per-sample shapes of its inputs (C, H, W) or (F,), creates its parameters and
returns the per-sample output shape, raising ShapeError when the inputs do not fit.
`forward(xs, training, seed)` returns (y, saved) and `backward(dy, saved, need_dx)`
returns one input gradient per input (None where need_dx is False) and sets each
parameter's `grad` (overwritten, never accumulated: a parameter belongs to one layer).
What a layer keeps for backward is declared in `saves` ("in": its input, "out": its
output, as arrays shared with the graph), and whether its output and its input
gradients are views rather than new arrays in `output_is_view` and
`gradient_is_view`, so planners can count memory without running; what a layer
keeps besides activations (BatchNorm's statistics) is `saved_bytes()`.

Activations may live on any device (minidl.device): layers touch them only through
minidl.ops and array methods both kinds share (shape, reshape), and `to(device)`
moves a layer's parameters and float buffers.

Fused training (minidl.plan's pass `fusion`): `forward_fused(xs, tags, seed,
stats)` runs a layer as the plan's tags for its node say and returns (y, saved,
stats out).  A convolution tagged "stats" returns its output's per-channel sums,
which the executor hands to the BatchNorm that follows; a BatchNorm or ReLU tagged
"mapped" returns a `Mapped` activation, never written, which the Conv2d and Add
that read it apply as they read; backward then recomputes it from the stored
convolution output.  At a residual block's end (tags "reconstructed" on the
BatchNorm, "reconstructs-a" or "-b" on the Add) the Add writes its sum before the
ReLU and keeps it, and its backward does the BatchNorm's too, with the BatchNorm's
input reconstructed from that sum (ops.batch_norm_add_relu_backward), which is
therefore not kept.  A MaxPool2d tagged "keeps-taps" keeps its taps (1 byte per
output) instead of its input.
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from minidl import ops
from minidl.device import DeviceArray, asnumpy, copy_into, fill, get_device
from minidl.nn import init as _init

Shape = Tuple[int, ...]

# A BatchNorm tagged "reconstructed" keeps its input after all (and warns) in a step
# where some |gamma| is below this: the reconstruction divides by gamma.
RECONSTRUCT_MIN_GAMMA = 1e-3


def reconstructed_input(tags) -> Optional[int]:
    """Which input of an Add is the BatchNorm whose backward it does (fusion tag
    "reconstructs-a" or "-b"), or None."""
    for i, mark in enumerate(("reconstructs-a", "reconstructs-b")):
        if mark in tags:
            return i
    return None


def _where(a: np.ndarray, like):
    """The host array a, moved to the device `like` lives on."""
    return like.device.to_device(a) if isinstance(like, DeviceArray) else a


class ShapeError(ValueError):
    """The inputs of a layer do not have shapes it can take."""


class Parameter:
    """A trainable float32 array, its gradient (set by backward) and how to initialise it."""

    __slots__ = ("data", "grad", "init", "fan_in", "fan_out")

    def __init__(self, shape: Shape, init: _init.Spec, fan_in: int = 1, fan_out: int = 1):
        self.grad: Optional[np.ndarray] = None
        self.init = _init.make(init)
        self.fan_in, self.fan_out = fan_in, fan_out
        self.data = np.zeros(shape, np.float32)
        self.reset(np.random.default_rng(0))  # usable at once; Net.initialize(seed) redraws

    def reset(self, rng: np.random.Generator) -> None:
        copy_into(self.data, self.init(self.data.shape, self.fan_in, self.fan_out, rng))

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape})"


def _move(a, dev):
    """a on dev: itself if already there, else an explicit copy (through the host)."""
    if isinstance(a, DeviceArray):
        if a.device is dev:
            return a
        a = a.device.to_host(a)
    return dev.to_device(a)


def _pair(name: str, v) -> Tuple[int, int]:
    """An int or an (h, w) pair, as a pair; build checks the values."""
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return tuple(v)
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return v, v
    raise TypeError(f"{name} must be an int or an (h, w) pair of ints, got {v!r}")


def _dry_run(f, in_shape: Shape, *args, **kwargs) -> Shape:
    """The per-sample output shape of op f on an empty batch: the op's own checks and
    output-size rule, with its messages turned into ShapeError."""
    try:
        return f(np.empty((0,) + tuple(in_shape), np.float32), *args, **kwargs).shape[1:]
    except ValueError as e:
        raise ShapeError(f"{e} (input shape {tuple(in_shape)})") from None


class Mapped:
    """An activation the fusion pass keeps out of memory: max(x * scale[c] + shift[c],
    0) per channel c of x (the max only when relu; scale and shift (C,) or both None),
    applied by its readers as they read x.  source: (the BatchNorm2d, its invstd) when
    the Add that reads it reconstructs x in backward (tag "reconstructed")."""

    __slots__ = ("x", "scale", "shift", "relu", "source")

    def __init__(self, x, scale=None, shift=None, relu: bool = False, source=None):
        self.x, self.scale, self.shift, self.relu, self.source = x, scale, shift, relu, source

    @property
    def shape(self):
        return self.x.shape

    def map_args(self, prefix: str = "x") -> dict:
        """The map as the keyword arguments of minidl.ops (x_scale, x_shift, x_relu)."""
        return {f"{prefix}_scale": self.scale, f"{prefix}_shift": self.shift,
                f"{prefix}_relu": self.relu}

    def materialize(self):
        return ops.affine_add(self.x, **self.map_args("a"))


def _unmapped(x, prefix: str = "x"):
    """(the array a reader reads, the ops keyword arguments of its map)."""
    return (x.x, x.map_args(prefix)) if isinstance(x, Mapped) else (x, {})


class Layer:
    """Base class; see the module docstring for the protocol."""

    num_inputs = 1
    saves: Tuple[str, ...] = ()
    output_is_view = False    # forward returns a view of its input
    gradient_is_view = False  # backward returns dy itself (or a view) for every input

    def __init__(self) -> None:
        self.params: Dict[str, Parameter] = {}
        self.buffers: Dict[str, np.ndarray] = {}

    # -- subclasses override ---------------------------------------------------------
    def build(self, in_shapes: Sequence[Shape]) -> Shape:
        return tuple(in_shapes[0])

    def forward(self, xs: List[np.ndarray], training: bool, seed: int = 0):
        raise NotImplementedError

    def backward(self, dy: np.ndarray, saved, need_dx: bool = True) -> List[Optional[np.ndarray]]:
        raise NotImplementedError

    def forward_fused(self, xs: list, tags: Sequence[str], seed: int = 0, stats=None):
        """A training forward as the fusion pass's tags say: (y, saved, the output's
        channel sums or None).  This default writes any Mapped input out first."""
        y, saved = self.forward([x.materialize() if isinstance(x, Mapped) else x for x in xs],
                                True, seed)
        return y, saved, None

    def flops(self, in_shapes: Sequence[Shape], out_shape: Shape) -> int:
        """Forward floating-point operations per sample (multiply-add = 2)."""
        return int(np.prod(out_shape))

    def args(self) -> str:
        return ""

    def saved_bytes(self) -> int:
        """Bytes a training forward keeps for backward besides activations."""
        return 0

    # -- shared ----------------------------------------------------------------------
    def reset_parameters(self, rng: np.random.Generator) -> None:
        for p in self.params.values():
            p.reset(rng)

    def to(self, device) -> "Layer":
        """Moves parameters and float32 buffers to device (explicit copies); integer
        buffers (counters) stay on the host.  Gradients are dropped."""
        dev = get_device(device)
        for p in self.params.values():
            p.data, p.grad = _move(p.data, dev), None
        for k, b in self.buffers.items():
            if b.dtype == np.float32:
                self.buffers[k] = _move(b, dev)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.args()})"

    @staticmethod
    def _expect_ndim(in_shape: Shape, ndim: int, what: str) -> None:
        if len(in_shape) != ndim:
            raise ShapeError(f"expects {what} per sample, got shape {tuple(in_shape)}")


class Conv2d(Layer):
    """2-D convolution: (C_in, H, W) -> (C_out, H_out, W_out); weight (C_out, C_in, kh, kw),
    bias (C_out,).  in_channels is taken from the input when None."""

    saves = ("in",)

    def __init__(self, in_channels: Optional[int] = None, out_channels: int = 1,
                 kernel_size=3, stride=1, padding=0, bias: bool = True,
                 weight_init: _init.Spec = "kaiming", bias_init: _init.Spec = 0.0):
        super().__init__()
        self.in_channels = None if in_channels is None else ops._int("in_channels", in_channels, 1)
        self.out_channels = ops._int("out_channels", out_channels, 1)
        self.kernel_size, self.stride, self.padding = (
            _pair("kernel_size", kernel_size), _pair("stride", stride), _pair("padding", padding))
        self.bias, self.weight_init, self.bias_init = bias, weight_init, bias_init

    def build(self, in_shapes):
        self._expect_ndim(in_shapes[0], 3, "(C, H, W)")
        c, h, w = in_shapes[0]
        if self.in_channels is not None and c != self.in_channels:
            raise ShapeError(f"expects {self.in_channels} input channels, got shape {(c, h, w)}")
        kh, kw = self.kernel_size
        out = _dry_run(ops.conv2d, (c, h, w), np.empty((self.out_channels, c, kh, kw), np.float32),
                       stride=self.stride, padding=self.padding)
        self.in_channels = c
        fan_in, fan_out = c * kh * kw, self.out_channels * kh * kw
        self.params = {"weight": Parameter((self.out_channels, c, kh, kw), self.weight_init,
                                           fan_in, fan_out)}
        if self.bias:
            self.params["bias"] = Parameter((self.out_channels,), self.bias_init, fan_in, fan_out)
        return out

    def forward(self, xs, training, seed=0):
        b = self.params.get("bias")
        y = ops.conv2d(xs[0], self.params["weight"].data, None if b is None else b.data,
                       stride=self.stride, padding=self.padding)
        return y, xs[0]

    def forward_fused(self, xs, tags, seed=0, stats=None):
        """The input read through its map (tag "mapped-in"), ReLU in the epilogue
        ("applies-relu"), the output's channel sums for a BatchNorm ("stats"); saved:
        the input as read, a Mapped one recomputed by backward."""
        x, m = _unmapped(xs[0])
        b = self.params.get("bias")
        y, s1, s2 = ops.conv2d_fused(x, self.params["weight"].data, None if b is None else b.data,
                                     stride=self.stride, padding=self.padding,
                                     relu="applies-relu" in tags, stats="stats" in tags, **m)
        return y, xs[0], (s1, s2) if s1 is not None else None

    def forward_folded(self, x, scale=None, shift=None, relu: bool = False, pool=None,
                       pool_relu: bool = False):
        """Evaluation-mode forward (host arrays) with a per-channel affine map y * scale
        + shift folded into the weights and bias (a following BatchNorm's,
        BatchNorm2d.folding) and ReLU applied by the convolution's epilogue: one pass
        over the output instead of up to three.  pool: a MaxPool2d or AvgPool2d that
        pools the output in the same call (ops.conv2d_pooled), then a ReLU when
        pool_relu."""
        w, b = self.params["weight"].data, self.params.get("bias")
        b = None if b is None else b.data
        if scale is not None:  # in float32: one pass over w (a float64 product took three)
            w = w * scale.astype(np.float32).reshape(-1, 1, 1, 1)
            b = ((0.0 if b is None else b) * scale + shift).astype(np.float32)
        if pool is None:
            return ops.conv2d(x, w, b, stride=self.stride, padding=self.padding, relu=relu)
        return ops.conv2d_pooled(x, w, b, stride=self.stride, padding=self.padding, relu=relu,
                                 pool="max" if isinstance(pool, MaxPool2d) else "avg",
                                 kernel_size=pool.kernel_size, pool_stride=pool.stride,
                                 pool_padding=pool.padding, ceil_mode=pool.ceil_mode,
                                 pool_relu=pool_relu)

    def backward(self, dy, saved, need_dx=True, add_dx_to=None):
        """add_dx_to: an existing gradient of the input, which dx is added to in place
        (fusion: a residual block's sum of gradients) and which is returned."""
        w = self.params["weight"]
        x, m = _unmapped(saved)
        dx, w.grad, db = ops.conv2d_backward(x, w.data, dy, stride=self.stride,
                                             padding=self.padding, need_dx=need_dx,
                                             need_db=self.bias, add_dx_to=add_dx_to, **m)
        if self.bias:
            self.params["bias"].grad = db
        return [dx]

    def flops(self, in_shapes, out_shape):
        kh, kw = self.kernel_size
        return 2 * int(np.prod(out_shape)) * in_shapes[0][0] * kh * kw

    def args(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, bias={self.bias}")


class BatchNorm2d(Layer):
    """Batch normalisation per channel of (C, H, W) or (C,) inputs; weight (gamma) and bias
    (beta) (C,); buffers running_mean, running_var (C,) and num_batches_tracked (int64).
    PyTorch's conventions: momentum 0.1, eps 1e-5, unbiased running variance."""

    saves = ("in",)

    def __init__(self, num_features: Optional[int] = None, eps: float = 1e-5,
                 momentum: float = 0.1):
        super().__init__()
        if not (isinstance(momentum, numbers.Real) and 0.0 <= momentum <= 1.0):
            raise ValueError(f"BatchNorm2d momentum must be a number in [0, 1], got {momentum!r}")
        if not (isinstance(eps, numbers.Real) and 0.0 <= eps < float("inf")):
            raise ValueError(f"BatchNorm2d eps must be a finite number >= 0, got {eps!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        # a minidl.distributed.Comm: training statistics over the ranks' whole batch
        self.sync = None
        self._gamma_host, self._gamma_fetched = None, False  # fetch_gamma's copy

    def build(self, in_shapes):
        s = tuple(in_shapes[0])
        if len(s) not in (1, 3):
            raise ShapeError(f"expects (C, H, W) or (C,) per sample, got shape {s}")
        if self.num_features is not None and s[0] != self.num_features:
            raise ShapeError(f"expects {self.num_features} channels, got shape {s}")
        c = self.num_features = s[0]
        self.params = {"weight": Parameter((c,), 1.0), "bias": Parameter((c,), 0.0)}
        self.buffers = {"running_mean": np.zeros(c, np.float32),
                        "running_var": np.ones(c, np.float32),
                        "num_batches_tracked": np.zeros((), np.int64)}
        return s

    def reset_parameters(self, rng):
        super().reset_parameters(rng)
        fill(self.buffers["running_mean"], 0.0)
        fill(self.buffers["running_var"], 1.0)
        self.buffers["num_batches_tracked"].fill(0)

    def saved_bytes(self):
        return 8 * self.num_features  # the batch mean and 1/std, float32 per channel

    def folding(self):
        """(scale, shift), float64 per channel: evaluation mode is x * scale + shift."""
        b = self.buffers
        scale = self.params["weight"].data / np.sqrt(b["running_var"].astype(np.float64)
                                                     + self.eps)
        return scale, self.params["bias"].data - b["running_mean"] * scale

    def forward(self, xs, training, seed=0):
        b = self.buffers
        if training and self.sync is not None:
            return self._forward_sync(xs[0])
        y, mean, invstd = ops.batch_norm(xs[0], self.params["weight"].data,
                                         self.params["bias"].data, training=training,
                                         running_mean=b["running_mean"],
                                         running_var=b["running_var"],
                                         momentum=self.momentum, eps=self.eps)
        if training:
            b["num_batches_tracked"] += 1
        return y, (xs[0], mean, invstd)

    def forward_fused(self, xs, tags, seed=0, stats=None):
        """Statistics from the convolution's sums (tag "from-sums"); the output a
        Mapped (tag "mapped", with the ReLU after it folded in by that ReLU), or written
        in one pass with the ReLU applied ("applies-relu").  saved: (x, mean, invstd),
        and when mapped the map and whether backward masks for the ReLU ("masks-relu")."""
        if "from-sums" not in tags or stats is None:
            return super().forward_fused(xs, tags, seed, stats)
        x, b = xs[0], self.buffers
        mean, invstd, scale, shift = ops._batch_norm_stats(
            stats[0], stats[1], x.size // x.shape[1], self.params["weight"].data,
            self.params["bias"].data, b["running_mean"], b["running_var"], self.momentum,
            self.eps)
        b["num_batches_tracked"] += 1
        if "reconstructed" in tags and self._reconstructible():
            # the Add that reads it does this backward, from its sum: x is not kept
            return Mapped(x, scale, shift, source=(self, invstd)), \
                (None, mean, invstd, (scale, shift)), None
        if "mapped" in tags:
            y = Mapped(x, scale, shift)
        else:
            y = ops.affine_add(x, a_scale=scale, a_shift=shift, relu="applies-relu" in tags)
        # mapped: the map lives until this backward (the readers' may reference it), and
        # backward masks with it for the ReLU when the ReLU was folded in
        saved = (x, mean, invstd) + (((scale, shift), "masks-relu" in tags)
                                     if "mapped" in tags else ())
        return y, saved, None

    def fetch_gamma(self) -> None:
        """Starts a copy of gamma to the host on the device's current stream, for this
        step's reconstruction check; the caller waits for the stream before the forward
        (the executor does so once for all of them, with the batch's copy), so that the
        check does not stop the device in the middle of the forward."""
        g = self.params["weight"].data
        if isinstance(g, DeviceArray):
            if self._gamma_host is None or self._gamma_host.shape != g.shape:
                self._gamma_host = g.device.pinned_empty(g.shape, g.dtype)
            g.device.to_host_async(g, self._gamma_host)
            self._gamma_fetched = True

    def gamma_is_small(self) -> bool:
        """Whether some |gamma| is below RECONSTRUCT_MIN_GAMMA (from this step's copy,
        when fetch_gamma made one and the device has finished it)."""
        g = self._gamma_host if self._gamma_fetched else self.params["weight"].data
        return float(np.abs(asnumpy(g)).min()) < RECONSTRUCT_MIN_GAMMA

    def _reconstructible(self) -> bool:
        small = self.gamma_is_small()
        self._gamma_fetched = False  # this step's copy is used
        if small:
            warnings.warn(f"a BatchNorm2d has |gamma| < {RECONSTRUCT_MIN_GAMMA:g}: it keeps its "
                          f"input for backward in this step instead of reconstructing it, "
                          f"more memory than the plan predicts", RuntimeWarning, stacklevel=3)
        return not small

    def backward(self, dy, saved, need_dx=True):
        x, mean, invstd = saved[:3]
        g, beta = self.params["weight"], self.params["bias"]
        if x is None:  # reconstructed: the Add after it did this backward
            return [dy]
        if len(saved) == 4:
            return [self._backward_sync(dy, saved)]
        relu = {}
        if len(saved) == 5 and saved[4]:  # fused, mapped, with the ReLU after it folded in
            relu = dict(relu_scale=saved[3][0], relu_shift=saved[3][1])
        dx, g.grad, beta.grad = ops.batch_norm_backward(x, g.data, dy, mean, invstd, **relu)
        return [dx]

    # Synchronised BatchNorm: the statistics of the global batch, from per-channel sums
    # (float64) added over the ranks; backward adds the ranks' sums of dy and dy * xhat.
    # It computes on the host (arrays on a device make a round trip).
    @staticmethod
    def _channels(a):
        return a.reshape(a.shape[0], a.shape[1], -1)

    def _forward_sync(self, x_in):
        x = asnumpy(x_in)
        c = x.shape[1]
        x3 = self._channels(x).astype(np.float64)
        local = np.concatenate([x3.sum((0, 2)), np.square(x3).sum((0, 2)), [x3[:, 0].size]])
        total = self.sync.allreduce(local)
        m = total[-1]
        if m <= 1:
            raise ValueError(f"expected more than 1 value per channel when training, got {m:g}")
        mean = total[:c] / m
        var = np.maximum(total[c:2 * c] / m - mean * mean, 0.0)
        b = self.buffers
        y, mean32, invstd = ops.batch_norm(x, asnumpy(self.params["weight"].data),
                                           asnumpy(self.params["bias"].data), training=False,
                                           running_mean=mean.astype(np.float32),
                                           running_var=var.astype(np.float32), eps=self.eps)
        for name, stat in (("running_mean", mean), ("running_var", var * m / (m - 1))):
            copy_into(b[name], ((1 - self.momentum) * asnumpy(b[name]) + self.momentum * stat
                                ).astype(np.float32))
        b["num_batches_tracked"] += 1
        return _where(y, x_in), (x_in, mean32, invstd, m)

    def _backward_sync(self, dy_in, saved):
        x_in, mean, invstd, m = saved
        x, dy = asnumpy(x_in), asnumpy(dy_in)
        g, beta = self.params["weight"], self.params["bias"]
        c = x.shape[1]
        xhat = self._channels(x - mean.reshape(-1, *[1] * (x.ndim - 2)))
        xhat *= invstd[:, None]
        dy3 = self._channels(dy)
        dbeta = dy3.sum((0, 2), dtype=np.float64)
        dgamma = np.einsum("nci,nci->c", dy3, xhat, dtype=np.float64)
        beta.grad = _where(dbeta.astype(np.float32), g.data)
        g.grad = _where(dgamma.astype(np.float32), g.data)
        total = self.sync.allreduce(np.concatenate([dbeta, dgamma]))
        scale = (asnumpy(g.data) * invstd)[:, None]
        dx = dy3 - (total[:c] / m).astype(np.float32)[:, None]
        dx -= xhat * (total[c:] / m).astype(np.float32)[:, None]
        dx *= scale
        return _where(dx.reshape(x.shape), x_in)

    def flops(self, in_shapes, out_shape):
        return 4 * int(np.prod(out_shape))

    def args(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class ReLU(Layer):
    """max(x, 0), any shape."""

    saves = ("out",)

    def forward(self, xs, training, seed=0):
        y = ops.relu(xs[0])
        return y, y

    def forward_fused(self, xs, tags, seed=0, stats=None):
        """"mapped": the Mapped input with the ReLU added to its map (its BatchNorm's
        backward masks), or the input (an Add's sum) as a Mapped ReLU (the Add's backward
        masks), saved None; "absorbed": the input, already max(., 0).  "pool-masks": saved
        None, a pool next to it applies the mask in its backward."""
        x = xs[0]
        if "mapped" in tags:
            return (Mapped(x.x, x.scale, x.shift, relu=True) if isinstance(x, Mapped)
                    else Mapped(x, relu=True)), None, None
        y = x if "absorbed" in tags else super().forward_fused(xs, tags, seed, stats)[0]
        return y, (None if "pool-masks" in tags else y), None

    def backward(self, dy, saved, need_dx=True):
        if saved is None:  # mapped or pool-masks: a layer next to it applies the mask
            return [dy]
        return [ops.relu_backward(saved, dy)]  # y > 0 exactly where x > 0


class _Pool2d(Layer):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size = _pair("kernel_size", kernel_size)
        self.stride = self.kernel_size if stride is None else _pair("stride", stride)
        if not isinstance(ceil_mode, (bool, np.bool_)):
            raise TypeError(f"ceil_mode must be a bool, got {ceil_mode!r}")
        self.padding, self.ceil_mode = _pair("padding", padding), bool(ceil_mode)

    def build(self, in_shapes):
        self._expect_ndim(in_shapes[0], 3, "(C, H, W)")
        return _dry_run(self._op, in_shapes[0], self.kernel_size, **self._kw())

    def _kw(self):
        return dict(stride=self.stride, padding=self.padding, ceil_mode=self.ceil_mode)

    def flops(self, in_shapes, out_shape):
        return int(np.prod(out_shape)) * self.kernel_size[0] * self.kernel_size[1]

    def args(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"ceil_mode={self.ceil_mode}")


class MaxPool2d(_Pool2d):
    """Max pooling (C, H, W) -> (C, H_out, W_out); ceil_mode as PyTorch and Caffe."""

    saves = ("in",)
    _op = staticmethod(ops.max_pool2d)

    def taps_fit(self, relu: bool = False) -> bool:
        """Whether a window's tap fits a byte (ops.max_pool2d_argmax; with relu, beside
        ops.NO_TAP)."""
        return self.kernel_size[0] * self.kernel_size[1] <= ops.MAX_POOL_TAPS - relu

    def forward(self, xs, training, seed=0):
        return ops.max_pool2d(xs[0], self.kernel_size, **self._kw()), xs[0]

    def forward_fused(self, xs, tags, seed=0, stats=None):
        """A Mapped input read through its map ("mapped-in"); saved: the taps
        ("keeps-taps", with the ReLU after the pool applied and its mask in them with
        "applies-relu"), or the input as it is (backward recomputes the maxima from it)."""
        x, m = _unmapped(xs[0])
        if "keeps-taps" in tags:
            y, tap = ops.max_pool2d_argmax(x, self.kernel_size, **self._kw(), **m,
                                           relu="applies-relu" in tags)
            return y, (tap, x.shape), None
        return ops.max_pool2d(x, self.kernel_size, **self._kw(), **m), xs[0], None

    def backward(self, dy, saved, need_dx=True):
        if isinstance(saved, tuple):  # the taps and x's shape
            tap, x_shape = saved
            return [ops.max_pool2d_backward_argmax(tap, dy, x_shape, self.kernel_size,
                                                   **self._kw())]
        x, m = _unmapped(saved)
        return [ops.max_pool2d_backward(x, dy, self.kernel_size, **self._kw(), **m)]


class AvgPool2d(_Pool2d):
    """Average pooling, padding counted (C, H, W) -> (C, H_out, W_out)."""

    _op = staticmethod(ops.avg_pool2d)

    def forward(self, xs, training, seed=0):
        return ops.avg_pool2d(xs[0], self.kernel_size, **self._kw()), xs[0].shape

    def forward_fused(self, xs, tags, seed=0, stats=None):
        """"masks-relu": saved x itself, the output of the ReLU whose mask the backward
        applies."""
        y, shape, _ = super().forward_fused(xs, tags, seed, stats)
        return y, (xs[0] if "masks-relu" in tags else shape), None

    def backward(self, dy, saved, need_dx=True):  # saved: x's shape, or x ("masks-relu")
        relu = not isinstance(saved, tuple)
        return [ops.avg_pool2d_backward(saved if relu else tuple(saved), dy, self.kernel_size,
                                        **self._kw(), relu=relu)]


class GlobalAvgPool2d(Layer):
    """Mean over H and W: (C, H, W) -> (C,)."""

    def build(self, in_shapes):
        self._expect_ndim(in_shapes[0], 3, "(C, H, W)")
        return (in_shapes[0][0],)

    def forward(self, xs, training, seed=0):
        return ops.global_avg_pool2d(xs[0]), xs[0].shape

    def backward(self, dy, saved, need_dx=True):
        return [ops.global_avg_pool2d_backward(tuple(saved), dy)]


class Linear(Layer):
    """Fully connected: (in_features,) -> (out_features,); weight (out, in), bias (out,).
    Flatten first for image-shaped inputs."""

    saves = ("in",)

    def __init__(self, in_features: Optional[int] = None, out_features: int = 1,
                 bias: bool = True, weight_init: _init.Spec = "kaiming",
                 bias_init: _init.Spec = 0.0):
        super().__init__()
        self.in_features = None if in_features is None else ops._int("in_features", in_features, 1)
        self.out_features = ops._int("out_features", out_features, 1)
        self.bias, self.weight_init, self.bias_init = bias, weight_init, bias_init

    def build(self, in_shapes):
        if len(in_shapes[0]) != 1:
            raise ShapeError(f"expects (features,) per sample, got shape {tuple(in_shapes[0])}; "
                             f"put a Flatten before it")
        f = in_shapes[0][0]
        if self.in_features is not None and f != self.in_features:
            raise ShapeError(f"expects {self.in_features} input features, got {f}")
        self.in_features = f
        self.params = {"weight": Parameter((self.out_features, f), self.weight_init, f,
                                           self.out_features)}
        if self.bias:
            self.params["bias"] = Parameter((self.out_features,), self.bias_init, f,
                                            self.out_features)
        return (self.out_features,)

    def forward(self, xs, training, seed=0):
        b = self.params.get("bias")
        return ops.linear(xs[0], self.params["weight"].data, None if b is None else b.data), xs[0]

    def backward(self, dy, saved, need_dx=True):
        w = self.params["weight"]
        dx, w.grad, db = ops.linear_backward(saved, w.data, dy)
        if "bias" in self.params:
            self.params["bias"].grad = db
        return [dx if need_dx else None]

    def flops(self, in_shapes, out_shape):
        return 2 * self.in_features * self.out_features

    def args(self):
        return f"{self.in_features}, {self.out_features}, bias={self.bias}"


class Dropout(Layer):
    """Inverted dropout with probability p in training, identity in evaluation.  The mask
    is a function of the step's seed, so backward recomputes it and nothing is kept."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout p must be in [0, 1), got {p}")
        self.p = p

    @property
    def output_is_view(self) -> bool:  # p = 0 is the identity: forward and backward
        return self.p == 0.0           # hand on the array they are given

    gradient_is_view = output_is_view

    def forward(self, xs, training, seed=0):
        if not training or self.p == 0.0:
            return xs[0], None
        return ops.dropout(xs[0], self.p, seed=seed), seed

    def backward(self, dy, saved, need_dx=True):
        return [dy if saved is None else ops.dropout_backward(dy, self.p, seed=saved)]

    def args(self):
        return f"p={self.p}"


class Flatten(Layer):
    """(C, H, W) -> (C * H * W,) without a copy."""

    output_is_view = gradient_is_view = True

    def build(self, in_shapes):
        return (int(np.prod(in_shapes[0])),)

    def forward(self, xs, training, seed=0):
        return xs[0].reshape(xs[0].shape[0], math.prod(xs[0].shape[1:])), xs[0].shape

    def backward(self, dy, saved, need_dx=True):
        return [dy.reshape(saved)]

    def flops(self, in_shapes, out_shape):
        return 0


class Add(Layer):
    """Sum of two inputs of the same shape (residual connections)."""

    num_inputs = 2
    gradient_is_view = True

    def build(self, in_shapes):
        a, b = (tuple(s) for s in in_shapes)
        if a != b:
            raise ShapeError(f"inputs must have the same shape, got {a} and {b}")
        return a

    def forward(self, xs, training, seed=0):
        return ops.add(xs[0], xs[1]), None

    def forward_fused(self, xs, tags, seed=0, stats=None):
        """Mapped inputs read through their maps, the ReLU after it applied
        ("applies-relu"), in one pass.  "reconstructs-a" (or "-b"): input a (b) is a
        BatchNorm's Mapped output whose backward this layer does; the output is the sum
        before the ReLU (the ReLU after it is mapped), saved with the other input."""
        (a, ma), (b, mb) = _unmapped(xs[0], "a"), _unmapped(xs[1], "b")
        y = ops.affine_add(a, b, relu="applies-relu" in tags, **ma, **mb)
        i = reconstructed_input(tags)
        return y, None if i is None else (y, xs[1 - i], xs[i].source, i), None

    def backward(self, dy, saved, need_dx=True):
        if saved is None:
            return [dy, dy]
        s, other, source, i = saved
        if source is None:  # the BatchNorm kept its input (small gamma): mask only
            g = ops.relu_backward(s, dy)
            return [g, g]
        bn, invstd = source
        b, m = _unmapped(other, "b")
        gamma, beta = bn.params["weight"], bn.params["bias"]
        dx, db, gamma.grad, beta.grad = ops.batch_norm_add_relu_backward(
            s, b, gamma.data, beta.data, dy, invstd, **m)
        return [dx, db] if i == 0 else [db, dx]


class SoftmaxCrossEntropy:
    """The loss head: mean softmax cross-entropy of logits (N, classes) against int labels
    (N,); forward returns (loss, dlogits) in one pass."""

    def __call__(self, logits: np.ndarray, labels: np.ndarray):
        return ops.softmax_cross_entropy(logits, labels)


LAYERS = {cls.__name__: cls for cls in (Conv2d, BatchNorm2d, ReLU, MaxPool2d, AvgPool2d,
                                        GlobalAvgPool2d, Linear, Dropout, Flatten, Add)}
