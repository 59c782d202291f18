"""Optimizers over a Net's named parameters, through the C kernels (minidl.ops), and
learning-rate schedules as pure functions of the global step (so a resumed run gets
exactly the rates of an uninterrupted one).

    opt = SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sched = cosine(0.1, total_steps)
    opt.lr = sched(step); opt.step()
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Mapping, Sequence, Tuple

import numpy as np

from minidl import _C, ops
from minidl.device import DeviceArray, asnumpy, copy_into, zeros_like
from minidl.graph import checked_state_value
from minidl.nn.layers import Parameter

Schedule = Callable[[int], float]


class Optimizer:
    """Holds the parameters by name and per-parameter state arrays by name.  State lives
    where each parameter lives (create the optimizer after moving the net) and is
    updated there; state_dict gives host arrays."""

    slots: Tuple[str, ...] = ()

    def __init__(self, params: Mapping[str, Parameter], lr: float):
        if not isinstance(params, Mapping):
            raise TypeError(f"params must map names to Parameters (net.parameters()), got "
                            f"{type(params).__name__}")
        if not params:
            raise ValueError("optimizer got no parameters")
        self.params: Dict[str, Parameter] = dict(params)
        self.lr = float(lr)
        self.steps = 0  # steps taken
        self.state: Dict[str, Dict[str, np.ndarray]] = {
            slot: {k: zeros_like(p.data) for k, p in self.params.items()}
            for slot in self.slots}

    def step(self) -> None:
        self._check_hyper()
        for k, p in self.params.items():
            if p.grad is not None:
                self._update(k, p)
        self.steps += 1

    def _check_hyper(self) -> None:
        """The hyper-parameter checks of the ops, made once per step (the direct kernel
        calls in _update skip them)."""

    @staticmethod
    def _direct(p: Parameter, *state):
        """The kernels the update may call directly, without ops' per-call checks, or
        None: minidl._C for host float32 arrays, C-contiguous, of the parameter's shape,
        the parameter and its state writable; the device's kernels for float32 arrays of
        that shape all on the parameter's device (state arrays are the optimizer's own,
        distinct from the parameter by construction)."""
        d, g = p.data, p.grad
        if type(d) is DeviceArray:
            for a in (d, g) + state:
                if type(a) is not DeviceArray or a.device is not d.device \
                        or a.dtype != np.float32 or a.shape != d.shape:
                    return None
            return d.device.kernels
        if type(d) is not np.ndarray or type(g) is not np.ndarray:
            return None
        if g.dtype != np.float32 or g.shape != d.shape or not g.flags.c_contiguous:
            return None
        for a in (d,) + state:
            if type(a) is not np.ndarray or a.dtype != np.float32 or a.shape != d.shape \
                    or not a.flags.c_contiguous or not a.flags.writeable:
                return None
        return _C

    def _update(self, name: str, p: Parameter) -> None:
        raise NotImplementedError

    def state_dict(self) -> Dict[str, np.ndarray]:
        """Flat host arrays "<slot>.<param name>" plus "steps" (int64)."""
        d = {f"{slot}.{k}": asnumpy(a) for slot, arrays in self.state.items()
             for k, a in arrays.items()}
        d["steps"] = np.array(self.steps, np.int64)
        return d

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        expected = set(self.state_dict())
        if set(state) != expected:
            raise KeyError(f"optimizer state does not match: missing "
                           f"{sorted(expected - set(state))[:5]}, unexpected "
                           f"{sorted(set(state) - expected)[:5]}")
        sources = {(slot, k): checked_state_value(f"optimizer state {slot}.{k}",
                                              state[f"{slot}.{k}"], a.shape)
                   for slot, arrays in self.state.items() for k, a in arrays.items()}
        steps = checked_state_value("optimizer state steps", state["steps"], (), integer=True)
        for (slot, k), src in sources.items():  # all checked first: nothing changes on an error
            copy_into(self.state[slot][k], src)
        self.steps = int(steps)


class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, Nesterov, L2 weight decay."""

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        self.slots = ("momentum_buffer",) if momentum else ()
        super().__init__(params, lr)
        self.momentum, self.dampening = momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, nesterov
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening 0")
        self._check_hyper()

    def _check_hyper(self):
        ops._hyper("Invalid learning rate", self.lr, lambda v: v >= 0.0)
        ops._hyper("Invalid momentum value", self.momentum, lambda v: v >= 0.0)
        ops._hyper("Invalid dampening value", self.dampening, lambda v: v == v)
        ops._hyper("Invalid weight_decay value", self.weight_decay, lambda v: v >= 0.0)

    def _update(self, name, p):
        buf = self.state["momentum_buffer"][name] if self.momentum else None
        k = self._direct(p, *(() if buf is None else (buf,)))
        if k is not None:
            k.sgd_step(p.data.ravel(), p.grad.ravel(), None if buf is None else buf.ravel(),
                       self.lr, self.momentum, self.dampening, self.weight_decay,
                       bool(self.nesterov), self.steps == 0)
            return
        ops.sgd_step(p.data, p.grad, buf, lr=self.lr, momentum=self.momentum,
                     dampening=self.dampening, weight_decay=self.weight_decay,
                     nesterov=self.nesterov, first_step=self.steps == 0)


class Adam(Optimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient); AdamW decouples it."""

    slots = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self._check_hyper()

    def _check_hyper(self):
        ops._hyper("Invalid learning rate", self.lr, lambda v: v >= 0.0)
        ops._hyper("Invalid epsilon value", self.eps, lambda v: v >= 0.0)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {self.betas!r}")
        for i, b in enumerate(self.betas):
            ops._hyper(f"Invalid beta parameter at index {i}", b, lambda v: 0.0 <= v < 1.0)
        ops._hyper("Invalid weight_decay value", self.weight_decay, lambda v: v >= 0.0)

    def _update(self, name, p):
        m, v = self.state["exp_avg"][name], self.state["exp_avg_sq"][name]
        k = self._direct(p, m, v)
        if k is not None:
            k.adam_step(p.data.ravel(), p.grad.ravel(), m.ravel(), v.ravel(), self.steps + 1,
                        self.lr, self.betas[0], self.betas[1], self.eps, self.weight_decay,
                        bool(self.decoupled))
            return
        ops.adam_step(p.data, p.grad, self.state["exp_avg"][name],
                      self.state["exp_avg_sq"][name], step=self.steps + 1, lr=self.lr,
                      betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                      decoupled=self.decoupled)


class AdamW(Adam):
    """torch.optim.AdamW: param *= 1 - lr * weight_decay before the Adam step."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


# ---- learning-rate schedules: step index (0-based) -> rate --------------------------


def constant(base_lr: float) -> Schedule:
    return lambda step: base_lr


def multistep(base_lr: float, milestones: Sequence[int], gamma: float = 0.1) -> Schedule:
    """base_lr * gamma ** (number of milestones <= step)."""
    ms = sorted(milestones)
    return lambda step: base_lr * gamma ** sum(step >= m for m in ms)


def cosine(base_lr: float, total_steps: int, min_lr: float = 0.0) -> Schedule:
    """Half a cosine from base_lr at step 0 to min_lr at total_steps."""
    total = max(1, total_steps)
    return lambda step: min_lr + 0.5 * (base_lr - min_lr) * (
        1 + math.cos(math.pi * min(step, total) / total))


def warmup(schedule: Schedule, warmup_steps: int) -> Schedule:
    """Linear ramp over the first warmup_steps steps, to the schedule's rate at that step."""
    if warmup_steps <= 0:
        return schedule
    return lambda step: schedule(step) * min(1.0, (step + 1) / warmup_steps)


def make_schedule(kind: str, base_lr: float, total_steps: int, *, warmup_steps: int = 0,
                  milestones: Sequence[float] = (0.5, 0.75), gamma: float = 0.1) -> Schedule:
    """kind "constant", "step" (times gamma at each milestone, given as fractions of the
    run) or "cosine", wrapped in a linear warm-up."""
    if kind == "constant":
        s = constant(base_lr)
    elif kind == "step":
        s = multistep(base_lr, [round(f * total_steps) for f in milestones], gamma)
    elif kind == "cosine":
        s = cosine(base_lr, total_steps)
    else:
        raise ValueError(f"unknown learning-rate schedule {kind!r}: use constant, step or cosine")
    return warmup(s, warmup_steps)


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}
