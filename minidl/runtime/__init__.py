"""The executor: carries out one training step (or an inference) of a Net under a Plan.

It runs the plan's steps in order, keeps what each layer saved for backward, drops
every forward output after its last reader, and in backward hands each gradient to
the node's inputs, summing where a node feeds several layers (residual nets).  It
makes no decisions: everything it does is in the Plan.

On a device (the plan's: cpu, sim or cuda:N; the net must be there, `net.to`) it
copies each batch there (images and int64 labels: two counted copies), keeps every
activation and gradient there, computes the loss there and brings back only the
loss and the logits.  Parameter gradients are made by backward where the
parameters live; the previous step's are dropped when a step starts.  With a
budget, a step the plan predicts will not fit (counting the inputs that reconstructed
BatchNorms keep after all, RECONSTRUCT_MIN_GAMMA) raises OutOfDeviceMemory before it
starts, so a failed step changes nothing but the dropped gradients; on the cpu,
OutOfHostMemory where the host has less memory free than the step needs.

In training, steps the plan's fusion pass tagged run fused (Layer.forward_fused):
a convolution's channel sums go to the BatchNorm that follows, and activations
tagged "mapped" stay out of memory (minidl.plan says how).  In evaluation mode on
the cpu, each convolution absorbs the BatchNorm2d and ReLU that directly follow it
(minidl.plan.inference_fusion): the BatchNorm folded into its weights and bias, the
ReLU applied by its epilogue; a residual Add applies the ReLU after it in its pass.

Optional instruments: per step forward/backward seconds (`timings`; a layer's
backward includes adding its input gradients to those already there) and memory
(`track_memory`): on the cpu the activation bytes the executor holds, counted from
the arrays themselves; on a device the device's own peak over the step.
"""
from __future__ import annotations

import ctypes
import math
import os
import time
from typing import Callable, Dict, Iterable, Optional, Tuple

import numpy as np

from minidl import ops
from minidl.device import DeviceArray, get_device
from minidl.graph import INPUT, Net
from minidl.nn.layers import (RECONSTRUCT_MIN_GAMMA, BatchNorm2d, Mapped,
                               SoftmaxCrossEntropy)
from minidl.plan import Plan, inference_fusion, make_plan

_MASK64 = (1 << 64) - 1


def _arrays(objs: Iterable) -> Iterable[np.ndarray]:
    for o in objs:
        if isinstance(o, np.ndarray):
            yield o
        elif isinstance(o, (tuple, list)):
            yield from _arrays(o)
        elif isinstance(o, Mapped):
            yield from _arrays((o.x, o.scale, o.shift))


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_KEEP = 1 << 30
_kept_memory: Optional[bool] = None


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve blocks up to 1 GiB from its heap and keep freed
    memory there, so that each step's activations reuse the pages of the step before
    instead of the kernel mapping and zeroing fresh ones (page faults: on 2 threads
    several ms per step).  Peak memory is unchanged; the process keeps its peak after
    a step.  The kernels still keep their own scratch block (minidl.set_keep_workspace):
    given back to malloc after each call, blocks of tens of MB interleaved with the
    activations and fragmented the heap (vgg11_bn's peak RSS 315-800 MB by plan and
    step count against 360-500 kept: bench/NOTES.md).
    The cpu executor calls it; MINIDL_KEEP_MEMORY=0 leaves malloc alone.
    Returns whether the setting is in force (False off glibc, or where another malloc
    is interposed, such as AddressSanitizer's, which ignores mallopt)."""
    global _kept_memory
    if _kept_memory is None:
        _kept_memory = False
        if os.environ.get("MINIDL_KEEP_MEMORY", "1") != "0":
            try:
                libc = ctypes.CDLL(None)
                _kept_memory = bool(libc.gnu_get_libc_version and
                                    libc.mallopt(_M_MMAP_THRESHOLD, _KEEP) and
                                    libc.mallopt(_M_TRIM_THRESHOLD, _KEEP))
            except (OSError, AttributeError):
                pass
    return _kept_memory


def live_bytes(*objs) -> int:
    """Bytes of the distinct memory blocks behind the arrays in objs (views counted once)."""
    seen = {}
    for a in _arrays(objs):
        while isinstance(a.base, np.ndarray):
            a = a.base
        seen[id(a)] = a.nbytes
    return sum(seen.values())


class Executor:
    """Runs `net` under `plan` (the plain plan for batch_size when none is given) on
    `device` (default: where the net's parameters are; the plan must be for it).  Batches of any size run;
    the plan's batch size is what its memory figures assume."""

    def __init__(self, net: Net, plan: Optional[Plan] = None, *, batch_size: int = 1,
                 seed: int = 0, device=None, fuse_inference: bool = True):
        self.net = net
        self.device = dev = net.device if device is None else get_device(device)
        self.plan = plan if plan is not None else make_plan(net, batch_size, device=dev)
        if [(s.name, s.kind, tuple(s.shape[1:])) for s in self.plan.steps] != \
                [(k, type(n.layer).__name__, n.shape) for k, n in net.layers()]:
            raise ValueError(f"plan for {self.plan.net!r} does not match the layers of net "
                             f"{net.name!r} (their names, kinds and output shapes)")
        if self.plan.slices != 1:
            raise NotImplementedError(f"this executor runs plans of one slice, got "
                                      f"{self.plan.slices} slices")
        if self.plan.device != dev.name:
            raise ValueError(f"the plan is for device {self.plan.device!r}, the executor runs "
                             f"on {dev.name!r} (move the net there with net.to(device))")
        elsewhere = [k for k, p in net.parameters().items() if not self._here(p.data)]
        if elsewhere:
            raise ValueError(f"net {net.name!r} has parameters off {dev.name} "
                             f"({elsewhere[0]}, ...): move it first with net.to(device)")
        self.host = dev.kind == "cpu"
        if self.host:
            keep_freed_memory()
        self.loss = SoftmaxCrossEntropy()
        self.seed = seed
        self.step_count = 0  # training steps run; with seed it fixes every dropout mask
        self.timings: Optional[Dict[str, list]] = None  # name -> [forward s, backward s]
        self.track_memory = False
        self.peak_activation_bytes = 0  # cpu, with track_memory
        self.peak_device_bytes = 0      # other devices, with track_memory: the last step's
        # called with a step's name once its backward has run (its parameters' gradients
        # are final): data-parallel training starts exchanging them from there
        self.backward_hook: Optional[Callable[[str], None]] = None
        self._last_read = {x: i for i, s in enumerate(self.plan.steps) for x in s.inputs}
        # the BatchNorms whose input the plan reconstructs: each checks its gamma per step
        self._reconstructed = [net.nodes[s.name].layer for s in self.plan.steps
                               if "reconstructed" in s.fused]
        # values per channel and sample of each BatchNorm (training needs more than 1)
        self._bn_values = {k: math.prod(n.shape[1:]) for k, n in net.layers()
                           if isinstance(n.layer, BatchNorm2d)}
        # ... and the bytes per sample of the input each keeps when its gamma is small
        self._input_bytes = {net.nodes[s.name].layer: 4 * math.prod(net.nodes[s.inputs[0]].shape)
                             for s in self.plan.steps if "reconstructed" in s.fused}
        # evaluation mode on the cpu: the layers each convolution absorbs (BatchNorm
        # folded into its weights, ReLU in its epilogue) and each Add (its ReLU;
        # minidl.plan.inference_fusion)
        self.inference_groups = inference_fusion(net) if fuse_inference and self.host else {}
        self._step_bytes = {self.plan.batch_size: self.plan.memory["step_peak"]}
        self._fits_on_host: set = set()

    # -- public ----------------------------------------------------------------------
    def train_step(self, x: np.ndarray, labels: np.ndarray, *,
                   grad_scale: float = 1.0) -> Tuple[float, np.ndarray]:
        """Forward, loss and backward on one batch; leaves each parameter's gradient in
        its .grad (where the parameter lives): that of the mean loss, times grad_scale.
        Returns (mean loss, logits on the host)."""
        dev = self.device
        n = len(self._check_input(x))
        if n == 0:
            raise ValueError("a training step needs a batch of at least 1 sample, got 0")
        for k, m in self._bn_values.items():  # a synchronised one counts every rank's
            if n * m <= 1 and self.net.nodes[k].layer.sync is None:
                raise ValueError(f"a training step needs more than 1 value per channel in "
                                 f"BatchNorm {k!r}: got a batch of {n}")
        for p in self.net.parameters().values():
            p.grad = None
        if not self.host:  # the gammas' copies, for the budget check and the forward
            for layer in self._reconstructed:
                layer.fetch_gamma()
        self.check_budget(n)
        if self.track_memory and not self.host:
            dev.reset_peak()
        y = labels if self.host else dev.to_device(self._check_labels(labels, n))
        logits, ctx = self._forward(x, True, (y,))
        loss, dlogits = self.loss(logits, y)
        if self.track_memory:  # the logits, their gradient and the labels at once
            self._measure(list(ctx.values()), logits, dlogits, y)
        if grad_scale != 1.0 and self.host:
            dlogits *= np.float32(grad_scale)
        elif grad_scale != 1.0:  # scaled on the host: (N, classes) is small
            host = dev.to_host(dlogits)
            host *= np.float32(grad_scale)
            del dlogits  # freed before its scaled copy is made, as the plan counts one
            dlogits = dev.to_device(host)
        grads = {self.net.output: dlogits}  # the only reference: freed in backward
        del y, dlogits
        if not self.host:
            logits = dev.to_host(logits)
        self._backward(grads, ctx)
        if self.track_memory and not self.host:
            self.peak_device_bytes = dev.peak
        self.step_count += 1
        return loss, logits

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Logits on the host, in evaluation mode (BatchNorm running statistics, no dropout)."""
        logits = self._forward(x, training=False)[0]
        return logits if self.host else self.device.to_host(logits)

    # -- internals -------------------------------------------------------------------
    def _here(self, a) -> bool:
        return a.device is self.device if isinstance(a, DeviceArray) else \
            self.device.kind == "cpu"

    def _check_input(self, x):
        if not isinstance(x, (np.ndarray, DeviceArray)) \
                or x.ndim != len(self.net.input_shape) + 1 \
                or x.shape[1:] != self.net.input_shape:
            got = x.shape if isinstance(x, (np.ndarray, DeviceArray)) else type(x).__name__
            raise ValueError(f"net {self.net.name!r} takes batches of shape "
                             f"(N, {', '.join(map(str, self.net.input_shape))}), got {got}")
        if isinstance(x, DeviceArray) and not self._here(x):
            raise ValueError(f"the batch is on {x.device.name}, the executor runs on "
                             f"{self.device.name}")
        return x

    def _check_labels(self, labels, n: int) -> np.ndarray:
        """Host labels checked here (a device cannot report a bad one) as int64."""
        classes = self.net.output_shape[-1]
        if not isinstance(labels, np.ndarray) or labels.dtype.kind not in "iu" \
                or labels.shape != (n,):
            got = (f"{labels.dtype} {labels.shape}" if isinstance(labels, np.ndarray)
                   else type(labels).__name__)
            raise ValueError(f"labels must be a host integer array of shape ({n},), got {got}")
        if n and (labels.min() < 0 or labels.max() >= classes):
            raise ValueError(f"labels must be class indices in [0, {classes}), got values "
                             f"from {labels.min()} to {labels.max()}")
        return np.ascontiguousarray(labels, np.int64)

    def check_budget(self, n: int) -> None:
        """A step of batch n that the plan says will not fit (in the device's budget; on
        the cpu, in what the host has free) fails here, before it starts."""
        if (self.device.budget is None and not self.host) or n in self._fits_on_host:
            return
        if n not in self._step_bytes:
            self._step_bytes[n] = make_plan(self.net, n, device=self.device,
                                            fuse="fusion" in self.plan.passes
                                            ).memory["step_peak"]
        kept = self._kept_after_all(n)
        self.device.check_fits(self._step_bytes[n] + kept, f"a training step of batch {n} "
                               f"(the plan's prediction" + (f", and {kept} bytes of inputs "
                               f"that BatchNorms with |gamma| < {RECONSTRUCT_MIN_GAMMA:g} keep"
                               if kept else "") + ")")
        if self.host:  # the host's free memory is read at a batch size's first step
            self._fits_on_host.add(n)

    def _kept_after_all(self, n: int) -> int:
        """The bytes of the inputs that reconstructed BatchNorms keep in this step after
        all (their gamma is small), which the plan does not count: an upper bound on
        what they add to the step's peak (from train_step's copies of the gammas)."""
        if not self._reconstructed or self.host:
            return 0
        self.device.current.synchronize()
        return sum(n * self._input_bytes[layer] for layer in self._reconstructed
                   if layer.gamma_is_small())

    def _seed(self, i: int) -> int:
        return (self.seed * 0x9E3779B97F4A7C15 + self.step_count * 0x100000001B3 + i) & _MASK64

    def _measure(self, *objs) -> None:
        if self.host:
            self.peak_activation_bytes = max(self.peak_activation_bytes, live_bytes(*objs))

    def _time(self, name: str, slot: int, t0: float) -> None:
        self.device.synchronize()
        self.timings.setdefault(name, [0.0, 0.0])[slot] += time.perf_counter() - t0

    def _forward(self, x, training: bool, held=()):
        x = self._check_input(x)
        # train_step's copies of the gammas are done by the wait for the batch's copy (or
        # the one below)
        if not self.host and isinstance(x, np.ndarray):
            x = self.device.to_device(np.ascontiguousarray(x, np.float32))
        elif training and not self.host and self._reconstructed:
            self.device.current.synchronize()
        outs = {INPUT: x}
        del x  # outs holds the only reference: the batch is freed after its last reader
        ctx: Dict[str, object] = {}
        nodes = self.net.nodes
        groups = {} if training else self.inference_groups
        absorbed: Dict[str, object] = {}  # absorbed step -> its output, made by its conv
        stats: Dict[str, object] = {}  # a convolution's channel sums, for its BatchNorm
        for i, s in enumerate(self.plan.steps):
            t0 = time.perf_counter()
            if s.name in absorbed:
                y, saved = absorbed.pop(s.name), None
            elif s.name in groups:
                y = self._fused(s.name, groups[s.name], [outs[k] for k in s.inputs])
                saved = None
                absorbed.update(dict.fromkeys(groups[s.name], y))
            elif training and s.fused:
                y, saved, sums = nodes[s.name].layer.forward_fused(
                    [outs[k] for k in s.inputs], s.fused, self._seed(i), stats.pop(s.inputs[0], None))
                if sums is not None:
                    stats[s.name] = sums
                del sums
            else:
                y, saved = nodes[s.name].layer.forward([outs[k] for k in s.inputs], training,
                                                       self._seed(i))
            if self.timings is not None:
                self._time(s.name, 0, t0)
            outs[s.name] = y
            if training:
                ctx[s.name] = saved
            del y, saved
            if self.track_memory:
                self._measure(list(outs.values()), list(ctx.values()), held)
            for k in dict.fromkeys(s.inputs):
                if self._last_read[k] == i:
                    del outs[k]
        return outs[self.net.output], ctx

    def _fused(self, name: str, chain, xs):
        """Evaluation-mode output of a convolution or a residual Add and the layers it
        absorbs (inference_groups)."""
        nodes = self.net.nodes
        if type(nodes[name].layer).__name__ == "Add":  # the ReLU after it, in its pass
            return nodes[name].layer.forward_fused(xs, ("applies-relu",))[0]
        kinds = [type(nodes[k].layer).__name__ for k in chain]
        scale = shift = None
        if kinds[0] == "BatchNorm2d":
            scale, shift = nodes[chain[0]].layer.folding()
        at = next((i for i, k in enumerate(kinds) if k.endswith("Pool2d")), len(kinds))
        pool = nodes[chain[at]].layer if at < len(kinds) else None
        return nodes[name].layer.forward_folded(xs[0], scale, shift, relu="ReLU" in kinds[:at],
                                                pool=pool, pool_relu=at + 1 < len(kinds))

    @staticmethod
    def _sole_holder(grads, x, dy) -> bool:
        """x has a gradient that nothing else holds (no view of it is pending and it is
        not dy), so a kernel may add to it in place."""
        g = grads.get(x)
        return g is not None and g is not dy and \
            not any(v is g for k, v in grads.items() if k != x)

    def _backward(self, grads: Dict[str, object], ctx: Dict[str, object]) -> None:
        nodes = self.net.nodes
        hook = self.backward_hook
        for s in reversed(self.plan.steps):
            saved = ctx.pop(s.name)
            dy = grads.pop(s.name, None)
            if dy is None:
                if hook is not None:
                    hook(s.name)
                continue
            t0 = time.perf_counter()
            kw = {}
            if "accumulates-dx" in s.fused and self._sole_holder(grads, s.inputs[0], dy):
                kw["add_dx_to"] = grads[s.inputs[0]]  # the sum made by the kernel's store
            dxs = list(nodes[s.name].layer.backward(dy, saved, need_dx=any(s.need_dx), **kw))
            for j, (x, need) in enumerate(zip(s.inputs, s.need_dx)):
                if not need or kw:
                    continue
                if x in grads:  # a second gradient: the sum replaces both
                    total = ops.add(grads[x], dxs[j])
                    if self.track_memory:
                        self._measure(list(grads.values()), list(ctx.values()), saved, dy,
                                      dxs, total)
                    grads[x], dxs[j] = total, None
                    del total
                else:
                    grads[x] = dxs[j]
            if self.timings is not None:  # the sums included, as where a kernel's store adds
                self._time(s.name, 1, t0)
            if self.track_memory:
                self._measure(list(grads.values()), list(ctx.values()), saved, dy, dxs)
            del dy, dxs, saved
            if hook is not None:
                hook(s.name)
