"""Plans: what the executor does in one training step, as pure, printable data.

A Plan lists the steps of a Net in execution order (one per layer node) with the
decisions later planner passes make: the device each step runs on, the slices of a
batch, and which activations are kept for backward.  Today's only plan is the plain
one: everything on one device (cpu, sim or cuda:N), unfused, one slice, every
activation a layer needs for backward kept in memory.  `inference_fusion` says
which layers each convolution absorbs in evaluation mode (BatchNorm folded into
its weights, ReLU in its epilogue).  `make_plan` also predicts the
step's peak memory by replaying the executor's allocation order over the tensor
sizes, without running a kernel: `peak` = parameters + float buffers + optimizer
state + the step's peak (the batch, activations, saved statistics, activation and
parameter gradients).  Kernel workspaces (such as the im2col buffer) are not
counted: the C kernels take them from the host, and on cuda they are extra.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Dict, List

import numpy as np

from minidl.device import Device, canonical_name
from minidl.graph import INPUT, Net

F32 = 4
LABEL_BYTES = 8  # int64 class indices


@dataclass
class Step:
    name: str
    kind: str
    inputs: List[str]
    shape: List[int]            # output shape, batch included
    device: str
    param_bytes: int
    output_bytes: int           # 0 when the output is a view of the input
    kept: List[str]             # tensors (by node name) kept from forward for backward
    saved_bytes: int            # bytes kept for backward besides those (BatchNorm statistics)
    flops: int                  # forward, whole batch
    need_dx: List[bool]         # which inputs need a gradient


@dataclass
class Plan:
    net: str
    batch_size: int
    steps: List[Step]
    device: str = "cpu"
    slices: int = 1
    passes: List[str] = field(default_factory=list)
    memory: Dict[str, int] = field(default_factory=dict)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step named {name!r} in the plan of {self.net!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def __str__(self) -> str:
        mb = 1 / 2**20
        head = (f"plan for {self.net!r}, batch {self.batch_size}, device {self.device}, "
                f"{self.slices} slice(s), passes: {', '.join(self.passes) or 'none'}")
        rows = [f"{'#':>3} {'node':<22} {'layer':<16} {'output shape':<20} {'params MB':>9} "
                f"{'output MB':>9} {'kept':<14} {'GFLOP':>7}"]
        for i, s in enumerate(self.steps):
            rows.append(f"{i:>3} {s.name:<22} {s.kind:<16} {str(tuple(s.shape)):<20} "
                        f"{s.param_bytes * mb:>9.3f} {s.output_bytes * mb:>9.2f} "
                        f"{','.join(s.kept) or '-':<14.14} {s.flops / 1e9:>7.3f}")
        m = self.memory
        foot = [f"parameters {m['params'] * mb:.2f} MB, buffers {m['buffers'] * mb:.2f} MB, "
                f"gradients {m['grads'] * mb:.2f} MB, optimizer state "
                f"{m['optimizer'] * mb:.2f} MB",
                f"activations kept for backward {m['kept_activations'] * mb:.2f} MB, "
                f"activation peak {m['activation_peak'] * mb:.2f} MB, step peak (with the "
                f"gradients) {m['step_peak'] * mb:.2f} MB",
                f"predicted peak {m['peak'] * mb:.2f} MB; forward {self.flops() / 1e9:.2f} GFLOP, "
                f"training step about {3 * self.flops() / 1e9:.2f} GFLOP"]
        return "\n".join([head] + rows + foot)

    def flops(self) -> int:
        return sum(s.flops for s in self.steps)


def storage_of(net: Net) -> Dict[str, str]:
    """The node whose memory each node's output is (a view shares its input's)."""
    root: Dict[str, str] = {}
    for k, n in net.nodes.items():
        root[k] = root[n.inputs[0]] if n.layer is not None and n.layer.output_is_view else k
    return root


def make_plan(net: Net, batch_size: int, *, optimizer_slots: int = 1,
              device="cpu") -> Plan:
    """The plain plan of net at batch_size on device (a name such as "sim" or
    "cuda:0", or a Device); optimizer_slots is the number of parameter-sized arrays
    the optimizer keeps (SGD with momentum 1, Adam 2)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    device = device.name if isinstance(device, Device) else canonical_name(device)
    root = storage_of(net)
    steps = []
    for k, n in net.layers():
        layer = n.layer
        in_shapes = [net.nodes[i].shape for i in n.inputs]
        kept = sorted({root[n.inputs[0]] if s == "in" else root[k] for s in layer.saves})
        steps.append(Step(
            name=k, kind=type(layer).__name__, inputs=list(n.inputs),
            shape=[batch_size, *n.shape], device=device,
            param_bytes=sum(p.data.nbytes for p in layer.params.values()),
            output_bytes=0 if root[k] != k else batch_size * int(np.prod(n.shape)) * F32,
            kept=kept, saved_bytes=layer.saved_bytes(),
            flops=batch_size * layer.flops(in_shapes, n.shape),
            need_dx=[i != INPUT for i in n.inputs]))
    plan = Plan(net.name, batch_size, steps, device)
    params = sum(p.data.nbytes for p in net.parameters().values())
    buffers = sum(b.nbytes for b in net.buffers().values() if b.dtype == np.float32)
    kept, act_peak, step_peak = simulate_activations(net, plan)
    plan.memory = dict(params=params, buffers=buffers, grads=params,
                       optimizer=optimizer_slots * params, kept_activations=kept,
                       activation_peak=act_peak, step_peak=step_peak,
                       peak=(1 + optimizer_slots) * params + buffers + step_peak)
    return plan


def inference_fusion(net: Net) -> Dict[str, List[str]]:
    """The layers each convolution absorbs in evaluation mode, by node name: a
    BatchNorm2d right after it (folded into its weights and bias), then a ReLU
    (applied by its epilogue), or a ReLU alone.  A layer is absorbed only when it is
    the sole reader of the one before it, whose output then never exists."""
    readers: Dict[str, List[str]] = {}
    for k, n in net.layers():
        for x in dict.fromkeys(n.inputs):
            readers.setdefault(x, []).append(k)

    def only_reader(k: str, kind: str):
        r = readers.get(k, [])
        if k != net.output and len(r) == 1 and type(net.nodes[r[0]].layer).__name__ == kind:
            return r[0]
        return None

    groups = {}
    for k, n in net.layers():
        if type(n.layer).__name__ != "Conv2d":
            continue
        chain = []
        bn = only_reader(k, "BatchNorm2d")
        if bn is not None:
            chain.append(bn)
        relu = only_reader(chain[-1] if chain else k, "ReLU")
        if relu is not None:
            chain.append(relu)
        if chain:
            groups[k] = chain
    return groups


def simulate_activations(net: Net, plan: Plan):
    """(bytes kept for backward at the end of forward, peak activation bytes, peak step
    bytes), replaying the executor's references: the batch (images, int64 labels) is
    on the device from the start, the labels until the loss; a forward output lives
    while a later step still reads it or a step keeps it for backward, with what a
    layer saves besides (BatchNorm's statistics); a gradient lives until its node's
    backward step has run; layers with gradient_is_view pass it on uncopied.  The step
    peak adds the parameter gradients, made by each backward step and kept to the end
    (the executor drops the previous step's at the start of a step)."""
    root = storage_of(net)
    size = {k: plan.batch_size * int(np.prod(n.shape)) * F32 for k, n in net.nodes.items()}
    last_read = {x: i for i, s in enumerate(plan.steps) for x in s.inputs}
    refs: Dict[tuple, int] = {}
    nbytes: Dict[tuple, int] = {}
    cur = {"act": 0, "all": 0}
    peak = dict(cur)

    def new(key, b):
        refs[key], nbytes[key] = 1, b
        for k in cur if key[0] != "param_grad" else ("all",):
            cur[k] += b
            peak[k] = max(peak[k], cur[k])

    def inc(key):
        refs[key] += 1

    def dec(key):
        refs[key] -= 1
        if refs[key] == 0:
            b = nbytes.pop(key)
            del refs[key]
            for k in cur if key[0] != "param_grad" else ("all",):
                cur[k] -= b

    new(("act", INPUT), size[INPUT])
    new(("labels",), plan.batch_size * LABEL_BYTES)
    for i, s in enumerate(plan.steps):
        if root[s.name] == s.name:
            new(("act", s.name), size[s.name])
        else:
            inc(("act", root[s.name]))
        if s.saved_bytes:
            new(("saved", s.name), s.saved_bytes)
        for t in s.kept:
            inc(("act", t))
        for x in dict.fromkeys(s.inputs):
            if last_read[x] == i:
                dec(("act", root[x]))
    kept = sum(nbytes[("act", t)] for t in {t for s in plan.steps for t in s.kept})
    kept += sum(s.saved_bytes for s in plan.steps)
    grads = {net.output: ("grad", net.output)}
    new(grads[net.output], size[net.output])  # dlogits from the loss
    dec(("act", root[net.output]))
    dec(("labels",))
    for i in range(len(plan.steps) - 1, -1, -1):
        s = plan.steps[i]
        dy = grads.pop(s.name, None)
        if dy is not None:
            if s.param_bytes:
                new(("param_grad", s.name), s.param_bytes)
            for j, (x, need) in enumerate(zip(s.inputs, s.need_dx)):
                if not need:
                    continue
                if net.nodes[s.name].layer.gradient_is_view:
                    dx = dy
                    inc(dy)
                else:
                    dx = ("grad", s.name, j)
                    new(dx, size[x])
                if x in grads:  # a second consumer's gradient: their sum is a new array
                    total = ("sum", x, i)
                    new(total, size[x])
                    dec(grads[x])
                    dec(dx)
                    grads[x] = total
                else:
                    grads[x] = dx
            dec(dy)
        # else a dead end: nothing flows back through it
        for t in s.kept:
            dec(("act", t))
        if s.saved_bytes:
            dec(("saved", s.name))
    return kept, peak["act"], peak["all"]
