"""The executor: carries out one training step (or an inference) of a Net under a Plan.

It runs the plan's steps in order, keeps what each layer saved for backward, drops
every forward output after its last reader, and in backward hands each gradient to
the node's inputs, summing where a node feeds several layers (residual nets).  It
makes no decisions: everything it does is in the Plan.  Optional instruments: per
step forward/backward seconds (`timings`) and the activation bytes it holds, counted
from the arrays themselves (`track_memory`), to check the plan's prediction.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Iterable, Optional, Tuple

import numpy as np

from minidl import ops
from minidl.graph import INPUT, Net
from minidl.nn.layers import SoftmaxCrossEntropy
from minidl.plan import Plan, make_plan

_MASK64 = (1 << 64) - 1


def _arrays(objs: Iterable) -> Iterable[np.ndarray]:
    for o in objs:
        if isinstance(o, np.ndarray):
            yield o
        elif isinstance(o, (tuple, list)):
            yield from _arrays(o)


def live_bytes(*objs) -> int:
    """Bytes of the distinct memory blocks behind the arrays in objs (views counted once)."""
    seen = {}
    for a in _arrays(objs):
        while isinstance(a.base, np.ndarray):
            a = a.base
        seen[id(a)] = a.nbytes
    return sum(seen.values())


class Executor:
    """Runs `net` under `plan` (the plain plan for batch_size when none is given).
    Batches of any size run; the plan's batch size is what its memory figures assume."""

    def __init__(self, net: Net, plan: Optional[Plan] = None, *, batch_size: int = 1,
                 seed: int = 0):
        self.net = net
        self.plan = plan if plan is not None else make_plan(net, batch_size)
        if [s.name for s in self.plan.steps] != [k for k, _ in net.layers()]:
            raise ValueError(f"plan for {self.plan.net!r} does not match the layers of net "
                             f"{net.name!r}")
        if self.plan.device != "cpu" or self.plan.slices != 1:
            raise NotImplementedError(f"this executor runs CPU plans of one slice, got device "
                                      f"{self.plan.device!r} with {self.plan.slices} slices")
        self.loss = SoftmaxCrossEntropy()
        self.seed = seed
        self.step_count = 0  # training steps run; with seed it fixes every dropout mask
        self.timings: Optional[Dict[str, list]] = None  # name -> [forward s, backward s]
        self.track_memory = False
        self.peak_activation_bytes = 0
        # called with a step's name once its backward has run (its parameters' gradients
        # are final): data-parallel training starts exchanging them from there
        self.backward_hook: Optional[Callable[[str], None]] = None
        self._last_read = {x: i for i, s in enumerate(self.plan.steps) for x in s.inputs}

    # -- public ----------------------------------------------------------------------
    def train_step(self, x: np.ndarray, labels: np.ndarray, *,
                   grad_scale: float = 1.0) -> Tuple[float, np.ndarray]:
        """Forward, loss and backward on one batch; leaves each parameter's gradient in
        its .grad: that of the mean loss, times grad_scale.  Returns (mean loss, logits)."""
        logits, ctx = self._forward(x, training=True)
        loss, dlogits = self.loss(logits, labels)
        if grad_scale != 1.0:
            dlogits *= np.float32(grad_scale)
        self._backward(dlogits, ctx)
        self.step_count += 1
        return loss, logits

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Logits in evaluation mode (BatchNorm running statistics, no dropout)."""
        return self._forward(x, training=False)[0]

    # -- internals -------------------------------------------------------------------
    def _check_input(self, x) -> np.ndarray:
        if not isinstance(x, np.ndarray) or x.ndim != len(self.net.input_shape) + 1 \
                or x.shape[1:] != self.net.input_shape:
            got = x.shape if isinstance(x, np.ndarray) else type(x).__name__
            raise ValueError(f"net {self.net.name!r} takes batches of shape "
                             f"(N, {', '.join(map(str, self.net.input_shape))}), got {got}")
        return x

    def _seed(self, i: int) -> int:
        return (self.seed * 0x9E3779B97F4A7C15 + self.step_count * 0x100000001B3 + i) & _MASK64

    def _measure(self, *objs) -> None:
        self.peak_activation_bytes = max(self.peak_activation_bytes, live_bytes(*objs))

    def _time(self, name: str, slot: int, t0: float) -> None:
        self.timings.setdefault(name, [0.0, 0.0])[slot] += time.perf_counter() - t0

    def _forward(self, x, training: bool):
        outs = {INPUT: self._check_input(x)}
        ctx: Dict[str, object] = {}
        nodes = self.net.nodes
        for i, s in enumerate(self.plan.steps):
            t0 = time.perf_counter()
            y, saved = nodes[s.name].layer.forward([outs[k] for k in s.inputs], training,
                                                   self._seed(i))
            if self.timings is not None:
                self._time(s.name, 0, t0)
            outs[s.name] = y
            if training:
                ctx[s.name] = saved
            del y, saved
            if self.track_memory:
                self._measure(list(outs.values()), list(ctx.values()))
            for k in dict.fromkeys(s.inputs):
                if self._last_read[k] == i:
                    del outs[k]
        return outs[self.net.output], ctx

    def _backward(self, dlogits: np.ndarray, ctx: Dict[str, object]) -> None:
        grads = {self.net.output: dlogits}
        del dlogits
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
            dxs = nodes[s.name].layer.backward(dy, saved, need_dx=any(s.need_dx))
            if self.timings is not None:
                self._time(s.name, 1, t0)
            for x, need, dx in zip(s.inputs, s.need_dx, dxs):
                if not need:
                    continue
                if x in grads:
                    total = ops.add(grads[x], dx)
                    if self.track_memory:
                        self._measure(list(grads.values()), list(ctx.values()), saved, dy,
                                      dxs, total)
                    grads[x] = total
                    del total
                else:
                    grads[x] = dx
            if self.track_memory:
                self._measure(list(grads.values()), list(ctx.values()), saved, dy, dxs)
            del dy, dxs, saved
            if hook is not None:
                hook(s.name)
