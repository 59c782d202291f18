"""Plans: what the executor does in one training step, as pure, printable data.

A Plan lists the steps of a Net in execution order (one per layer node) with the
decisions later planner passes make: the device each step runs on, the slices of a
batch, which layers are fused and which activations are kept for backward.  The
plan is everything on one device (cpu, sim or cuda:N), one slice, with the pass
`fusion` (on by default, `make_plan(fuse=False)` for the plain plan), which fuses
Conv+BatchNorm+ReLU for training:

- a BatchNorm2d that is the sole reader of a Conv2d takes its statistics from the
  convolution's epilogue (per-channel sums while each output tile is in registers):
  conv tag "stats", BatchNorm tag "from-sums", no statistics pass;
- if every reader of the BatchNorm (or of the ReLU that is its sole reader) is a
  Conv2d, an Add or a MaxPool2d, its output is never written: BatchNorm tag "mapped" (and the
  ReLU's), the readers' tag "mapped-in": they apply x * scale + shift and the ReLU
  as they read; backward recomputes them from the stored convolution output, the
  BatchNorm's backward masking for the ReLU (tag "masks-relu");
- otherwise the BatchNorm writes its output with the ReLU applied in the same pass
  (tag "applies-relu", the ReLU "absorbed": its output is its input);
- a ReLU that is the sole reader of an Add or a Conv2d is applied by it the same
  way ("applies-relu" / "absorbed");
- at a residual block's end, Add (+ ReLU) of a mapped BatchNorm (the Add its sole
  reader) and another operand that a step keeps anyway (the block's input, or the
  shortcut's convolution output), the BatchNorm's input is not kept: the Add writes
  its sum before the ReLU and keeps it, the ReLU is "mapped" (its readers must be
  Conv2d, Add or MaxPool2d), and the Add's backward does the BatchNorm's, with its
  input reconstructed from the sum and the other operand (Add tag "reconstructs-a"
  or "-b" for the BatchNorm's side, BatchNorm tag "reconstructed"; the reconstruction
  divides by gamma, see minidl.ops.batch_norm_add_relu_backward);
- where several gradients flow into a node (a residual block's input), a Conv2d
  reader whose backward runs after another reader's adds its input gradient to the
  one already there in its kernel's store instead of a separate sum ("accumulates-dx";
  the executor does so when nothing else holds that gradient);
- a MaxPool2d whose input no other step keeps for backward keeps its taps (each
  maximum's position in its window, 1 byte per output) instead of that input
  ("keeps-taps"; its backward then scatters dy to the taps without reading x);
- a ReLU that is the sole reader of such a MaxPool2d is applied by it ("applies-relu":
  the window's maximum, then the ReLU, in one pass); the ReLU is "absorbed" and
  "pool-masks": where it passes no gradient the pool records no tap, so the pool's
  backward applies its mask and the ReLU's backward hands dy on;
- an AvgPool2d that is the sole reader of a ReLU (written, or absorbed by its
  convolution) applies the ReLU's mask in its backward ("masks-relu": it keeps its
  input, the ReLU's output, which the ReLU no longer keeps; the ReLU "pool-masks").

`inference_fusion` says which layers each convolution absorbs in evaluation mode
(BatchNorm folded into its weights, ReLU in its epilogue), and each residual Add (the
ReLU after it).  Each step also states the bytes its kernels read and write
(`bytes_forward`, `bytes_backward`, from the shapes: what each kernel's passes over
memory touch) and `bytes_moved()` adds up a training step.  `make_plan` also predicts the
step's peak memory by replaying the executor's allocation order over the tensor
sizes, without running a kernel: `peak` = parameters + float buffers + optimizer
state + the step's peak (the batch, activations, saved statistics, activation and
parameter gradients).  Kernel workspaces (such as the im2col buffer) are not
counted: the C kernels take them from the host, and on cuda they are extra.
"""
from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import numpy as np

from minidl import nn, ops
from minidl.device import Device, canonical_name
from minidl.graph import INPUT, Net
from minidl.nn.layers import reconstructed_input

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
    saved_bytes: int            # bytes kept for backward besides those (BatchNorm statistics,
                                # a max pool's taps)
    flops: int                  # forward, whole batch
    need_dx: List[bool]         # which inputs need a gradient
    fused: List[str] = field(default_factory=list)  # the fusion pass's tags (module doc)
    grad_view: bool = False     # backward hands dy on as the input gradients, uncopied
    bytes_forward: int = 0      # bytes the step's kernels read and write, forward
    bytes_backward: int = 0     # ... and backward (with the gradient sums of its output)


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
        mib = 1 / 2**20
        head = (f"plan for {self.net!r}, batch {self.batch_size}, device {self.device}, "
                f"{self.slices} slice(s), passes: {', '.join(self.passes) or 'none'}")
        rows = [f"{'#':>3} {'node':<22} {'layer':<16} {'output shape':<20} {'params MiB':>10} "
                f"{'output MiB':>10} {'kept':<14} {'GFLOP':>7} {'MiB moved':>9}  fused"]
        for i, s in enumerate(self.steps):
            rows.append(f"{i:>3} {s.name:<22} {s.kind:<16} {str(tuple(s.shape)):<20} "
                        f"{s.param_bytes * mib:>10.3f} {s.output_bytes * mib:>10.2f} "
                        f"{','.join(s.kept) or '-':<14.14} {s.flops / 1e9:>7.3f} "
                        f"{(s.bytes_forward + s.bytes_backward) * mib:>9.1f}  "
                        f"{','.join(s.fused) or '-'}")
        m = self.memory
        foot = [f"parameters {m['params'] * mib:.2f} MiB, buffers {m['buffers'] * mib:.2f} MiB, "
                f"gradients {m['grads'] * mib:.2f} MiB, optimizer state "
                f"{m['optimizer'] * mib:.2f} MiB",
                f"activations kept for backward {m['kept_activations'] * mib:.2f} MiB, "
                f"activation peak {m['activation_peak'] * mib:.2f} MiB, step peak (with the "
                f"gradients) {m['step_peak'] * mib:.2f} MiB",
                f"predicted peak {m['peak'] * mib:.2f} MiB; forward {self.flops() / 1e9:.2f} GFLOP, "
                f"training step about {3 * self.flops() / 1e9:.2f} GFLOP, "
                f"{self.bytes_moved() * mib:.1f} MiB moved"]
        return "\n".join([head] + rows + foot)

    def flops(self) -> int:
        return sum(s.flops for s in self.steps)

    def bytes_moved(self) -> int:
        """Bytes the kernels of a training step read and write (forward and backward;
        the loss and the optimizer's update not counted)."""
        return sum(s.bytes_forward + s.bytes_backward for s in self.steps)


def storage_of(net: Net, fused: Optional[Dict[str, List[str]]] = None) -> Dict[str, str]:
    """The node whose memory each node's output is (a view shares its input's, as do
    the outputs the fusion pass does not write: tags "mapped" and "absorbed")."""
    fused = fused or {}
    root: Dict[str, str] = {}
    for k, n in net.nodes.items():
        view = n.layer is not None and (n.layer.output_is_view or
                                        bool({"mapped", "absorbed"} & set(fused.get(k, ()))))
        root[k] = root[n.inputs[0]] if view else k
    return root


def _readers(net: Net) -> Dict[str, List[str]]:
    """The layers reading each node, in plan order."""
    readers: Dict[str, List[str]] = {}
    for k, n in net.layers():
        for x in dict.fromkeys(n.inputs):
            readers.setdefault(x, []).append(k)
    return readers


def _sole_reader(net: Net, readers, k: str, kind: str) -> Optional[str]:
    """The one layer reading node k if it is a `kind` and k is not the net's output."""
    r = readers.get(k, [])
    if k != net.output and len(r) == 1 and type(net.nodes[r[0]].layer).__name__ == kind:
        return r[0]
    return None


MAPPED_READERS = ("Conv2d", "Add", "MaxPool2d")  # the layers that read a Mapped input


def _read_mapped(net: Net, readers, kind, k: str) -> bool:
    """Whether node k can be left unwritten: it is not the net's output and is read,
    by layers that all read a Mapped input (a node nothing reads is written)."""
    return k != net.output and bool(readers.get(k)) and \
        all(kind[r] in MAPPED_READERS for r in readers[k])


def fusion(net: Net) -> Dict[str, List[str]]:
    """The fusion pass: tags per node name (the module doc says what each means)."""
    readers = _readers(net)
    kind = {k: type(n.layer).__name__ for k, n in net.layers()}

    def sole_reader(k: str, want: str) -> Optional[str]:
        return _sole_reader(net, readers, k, want)

    tags: Dict[str, List[str]] = {}

    def tag(k, *new):
        tags.setdefault(k, []).extend(t for t in new if t not in tags[k])

    for k, n in net.layers():
        if kind[k] == "BatchNorm2d" and n.layer.sync is None and len(n.shape) == 3 \
                and kind.get(n.inputs[0]) == "Conv2d" and sole_reader(n.inputs[0], kind[k]) == k:
            tag(n.inputs[0], "stats")
            tag(k, "from-sums")
            relu = sole_reader(k, "ReLU")
            last = relu or k
            if _read_mapped(net, readers, kind, last):
                tag(k, "mapped", *(("masks-relu",) if relu else ()))
                if relu:
                    tag(relu, "mapped")
                for r in readers[last]:
                    tag(r, "mapped-in")
            elif relu:
                tag(k, "applies-relu")
                tag(relu, "absorbed")
    for k, n in net.layers():
        relu = sole_reader(k, "ReLU") if kind[k] in ("Add", "Conv2d") else None
        if relu and relu not in tags and "stats" not in tags.get(k, ()):
            tag(k, "applies-relu")
            tag(relu, "absorbed")
    _reconstruction(net, readers, kind, tags)
    _pool_taps(net, tags)
    for k, n in net.layers():
        relu = sole_reader(k, "ReLU") if "keeps-taps" in tags.get(k, ()) else None
        if relu and relu not in tags and n.layer.taps_fit(relu=True):
            tag(k, "applies-relu")
            tag(relu, "absorbed", "pool-masks")
        pool = sole_reader(k, "AvgPool2d") if kind[k] == "ReLU" else None
        if pool and set(tags.get(k, ())) <= {"absorbed"}:
            tag(k, "pool-masks")
            tag(pool, "masks-relu")
    for x, r in readers.items():  # r in plan order: the last one's backward runs first
        if x != INPUT:
            for k in r[:-1]:
                if kind[k] == "Conv2d":
                    tag(k, "accumulates-dx")
    return tags


def _kept(net: Net, tags, root, k: str) -> List[str]:
    """The storage (node names) step k keeps for backward under the fusion tags."""
    n = net.nodes[k]
    layer, t = n.layer, tags.get(k, ())
    i = reconstructed_input(t)
    if i is not None:  # its sum, and the other operand to reconstruct from
        return sorted({root[k], root[n.inputs[1 - i]]})
    if "reconstructed" in t or "keeps-taps" in t or (
            isinstance(layer, nn.ReLU) and {"mapped", "pool-masks"} & set(t)):
        return []
    if "masks-relu" in t and isinstance(layer, nn.AvgPool2d):
        return [root[n.inputs[0]]]
    return sorted({root[n.inputs[0]] if s == "in" else root[k] for s in layer.saves})


def _reconstruction(net: Net, readers, kind, tags) -> None:
    """The fusion pass's residual-end step (module doc), tags updated in place."""
    root = storage_of(net, tags)
    for k, n in net.layers():
        relu = _sole_reader(net, readers, k, "ReLU") if kind[k] == "Add" else None
        if relu is None or tags.get(relu) != ["absorbed"] or \
                not _read_mapped(net, readers, kind, relu):
            continue
        for i, x in enumerate(n.inputs):
            if kind.get(x) != "BatchNorm2d" or "mapped" not in tags.get(x, ()) or \
                    "masks-relu" in tags[x] or readers[x] != [k]:
                continue
            other = root[n.inputs[1 - i]]
            if not any(other in _kept(net, tags, root, j)
                       for j, _ in net.layers() if j not in (k, x)):
                continue
            tags[x].append("reconstructed")
            tags[k] = [t for t in tags[k] if t != "applies-relu"] + ["reconstructs-" + "ab"[i]]
            tags[relu] = ["mapped"]
            for r in readers[relu]:
                if "mapped-in" not in tags.setdefault(r, []):
                    tags[r].append("mapped-in")
            break


def _pool_taps(net: Net, tags) -> None:
    """The fusion pass's max pooling step (module doc), tags updated in place."""
    root = storage_of(net, tags)
    for k, n in net.layers():
        if isinstance(n.layer, nn.MaxPool2d) and n.layer.taps_fit() and not any(
                root[n.inputs[0]] in _kept(net, tags, root, j) for j, _ in net.layers() if j != k):
            tags.setdefault(k, []).append("keeps-taps")


def _traffic(kind: str, tags, in_bytes: List[int], out_bytes: int, param_bytes: int,
             need_dx: List[bool], saved_bytes: int = 0):
    """(forward, backward) bytes a step's kernels read and write, from the passes each
    makes over memory: a convolution or a linear layer reads its input and weights and
    writes its output; backward reads dy and the weights and writes dx, reads the
    input and dy and writes dw.  BatchNorm reads its input twice (statistics, then
    normalisation) and writes once; with its statistics from the convolution's sums
    it reads once, and nothing when mapped; backward reads x and dy twice (sums, then
    dx) and writes dx.  Elementwise layers read their inputs and write their output
    (a mapped or absorbed ReLU moves nothing forward; a mapped or pool-masks one nothing
    backward).  Max pooling keeping its taps writes them (saved_bytes) and its backward
    reads them instead of the input; average pooling that masks for a ReLU reads its
    input in backward."""
    x = in_bytes[0]
    dx = sum(b for b, need in zip(in_bytes, need_dx) if need)
    if kind in ("Conv2d", "Linear"):
        data = out_bytes + param_bytes + dx if any(need_dx) else 0
        return x + param_bytes + out_bytes, data + x + out_bytes + param_bytes
    if kind == "BatchNorm2d":
        fwd = 0 if "mapped" in tags else (1 if "from-sums" in tags else 2) * x + out_bytes
        return fwd + param_bytes, (0 if "reconstructed" in tags else 4 * x + dx) + param_bytes
    if kind == "ReLU":
        if "mapped" in tags:
            return 0, 0
        return (0 if "absorbed" in tags else x + out_bytes), \
            (0 if "pool-masks" in tags else 2 * out_bytes + dx)
    if kind == "Add":  # reconstructing: two passes reading dy (then db), s and b
        return sum(in_bytes) + out_bytes, 0 if reconstructed_input(tags) is None else 8 * x
    if kind == "MaxPool2d":
        return x + out_bytes + saved_bytes, (saved_bytes or x) + out_bytes + dx
    if kind in ("AvgPool2d", "GlobalAvgPool2d", "Dropout"):
        return x + out_bytes, out_bytes + dx + (x if "masks-relu" in tags else 0)
    return 0, 0  # a kind it does not know


def make_plan(net: Net, batch_size: int, *, optimizer_slots: int = 1,
              device="cpu", fuse: bool = True) -> Plan:
    """The plan of net at batch_size on device (a name such as "sim" or "cuda:0", or
    a Device), with the fusion pass unless fuse is False; optimizer_slots is the
    number of parameter-sized arrays the optimizer keeps (SGD with momentum 1, Adam 2)."""
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, numbers.Integral) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    batch_size, optimizer_slots = int(batch_size), ops._int("optimizer_slots", optimizer_slots, 0)
    if not isinstance(fuse, (bool, np.bool_)):
        raise TypeError(f"fuse must be a bool, got {fuse!r}")
    device = device.name if isinstance(device, Device) else canonical_name(device)
    fused = fusion(net) if fuse else {}
    root = storage_of(net, fused)
    size = {k: batch_size * int(np.prod(n.shape)) * F32 for k, n in net.nodes.items()}
    readers = {k: 0 for k in net.nodes}  # gradients flowing into each node
    last_reader = {i: k for k, n in net.layers() for i in n.inputs}
    steps = []
    for k, n in net.layers():
        layer, tags = n.layer, fused.get(k, [])
        in_shapes = [net.nodes[i].shape for i in n.inputs]
        relu_passes = isinstance(layer, nn.ReLU) and bool({"mapped", "pool-masks"} & set(tags))
        kept = _kept(net, fused, root, k)
        need_dx = [i != INPUT for i in n.inputs]
        for i, need in zip(n.inputs, need_dx):
            readers[i] += need
        params = sum(p.data.nbytes for p in layer.params.values())
        # a max pool's taps: a byte per output
        saved = batch_size * int(np.prod(n.shape)) if "keeps-taps" in tags else layer.saved_bytes()
        fwd, bwd = (0, 0) if layer.output_is_view else _traffic(  # a view moves nothing
            type(layer).__name__, tags, [size[i] for i in n.inputs], size[k], params,
            need_dx, saved)
        steps.append(Step(
            name=k, kind=type(layer).__name__, inputs=list(n.inputs),
            shape=[batch_size, *n.shape], device=device, param_bytes=params,
            output_bytes=0 if root[k] != k else size[k], kept=kept,
            saved_bytes=saved * (2 if "mapped" in tags else 1),  # + the map
            flops=batch_size * layer.flops(in_shapes, n.shape), need_dx=need_dx,
            fused=list(tags), grad_view=reconstructed_input(tags) is None and (
                layer.gradient_is_view or relu_passes or "reconstructed" in tags),
            bytes_forward=fwd, bytes_backward=bwd))
    # where several gradients flow into a node they are added: 3 passes each, or 1 more
    # read where a convolution's store adds its own (the first backward makes the array)
    by_name = {s.name: s for s in steps}
    for s in steps:
        for x in dict.fromkeys(s.inputs):
            if x in by_name and readers[x] > 1 and s.name != last_reader[x]:
                by_name[x].bytes_backward += size[x] * (1 if "accumulates-dx" in s.fused else 3)
    plan = Plan(net.name, batch_size, steps, device, passes=["fusion"] if fuse else [])
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
    (applied by its epilogue), or a ReLU alone; then a MaxPool2d or AvgPool2d (each
    image's output pooled while it is in the cache, minidl.ops.conv2d_pooled), then a
    ReLU after the pooling.  And the ReLU after a residual Add (applied in the same
    pass, minidl.ops.affine_add).  A layer is absorbed only when it is the sole reader
    of the one before it, whose output then never exists."""
    readers = _readers(net)

    def take(chain: List[str], *kinds: str) -> bool:
        """Appends the sole reader of chain's last node if it is of one of kinds."""
        r = next((r for r in (_sole_reader(net, readers, chain[-1], kind) for kind in kinds)
                  if r is not None), None)
        if r is not None:
            chain.append(r)
        return r is not None

    groups = {}
    for k, n in net.layers():
        kind = type(n.layer).__name__
        chain = [k]
        if kind == "Add":
            take(chain, "ReLU")
        elif kind == "Conv2d":
            take(chain, "BatchNorm2d")
            take(chain, "ReLU")
            if take(chain, "MaxPool2d", "AvgPool2d"):
                take(chain, "ReLU")
        chain = chain[1:]
        if chain:
            groups[k] = chain
    return groups


def simulate_activations(net: Net, plan: Plan):
    """(bytes kept for backward at the end of forward, peak activation bytes, peak step
    bytes), replaying the executor's references: the batch (images, int64 labels) is
    on the device from the start, the labels until the loss; a forward output lives
    while a later step still reads it or a step keeps it for backward (one nothing
    reads, to the end of forward), with what a layer saves besides (BatchNorm's
    statistics); a gradient lives until its node's backward step has run; a layer's
    backward makes all its input gradients at once, and where a node already has one
    the sum replaces both; layers with gradient_is_view pass it on uncopied.  The step
    peak adds the parameter gradients, made by each backward step and kept to the end
    (the executor drops the previous step's at the start of a step), and in a fused
    forward a convolution's float64 channel sums until its BatchNorm's forward, and a
    written BatchNorm's map (scale, shift) while it writes its output."""
    root = storage_of(net, {s.name: s.fused for s in plan.steps})
    by_name = {s.name: s for s in plan.steps}
    size = {k: plan.batch_size * int(np.prod(n.shape)) * F32 for k, n in net.nodes.items()}
    last_read = {x: i for i, s in enumerate(plan.steps) for x in s.inputs}
    refs: Dict[tuple, int] = {}
    nbytes: Dict[tuple, int] = {}
    cur = {"act": 0, "all": 0}
    peak = dict(cur)

    step_only = ("param_grad", "sums", "map")  # in the step's bytes, not the activations'

    def new(key, b):
        refs[key], nbytes[key] = 1, b
        for k in cur if key[0] not in step_only else ("all",):
            cur[k] += b
            peak[k] = max(peak[k], cur[k])

    def inc(key):
        refs[key] += 1

    def dec(key):
        refs[key] -= 1
        if refs[key] == 0:
            b = nbytes.pop(key)
            del refs[key]
            for k in cur if key[0] not in step_only else ("all",):
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
        channels = net.nodes[s.name].shape[0]
        if "stats" in s.fused:  # float64 sums per channel, kept for the BatchNorm's forward
            new(("sums", s.name), 16 * channels)
        if "from-sums" in s.fused:
            if "mapped" not in s.fused:  # the map (scale, shift) while the output is written
                new(("map", s.name), 8 * channels)
                dec(("map", s.name))
            dec(("sums", s.inputs[0]))
        for t in s.kept:
            inc(("act", t))
        for x in dict.fromkeys(s.inputs):
            if last_read[x] == i:
                dec(("act", root[x]))
    kept = sum(nbytes[("act", t)] for t in {t for s in plan.steps for t in s.kept})
    kept += sum(s.saved_bytes for s in plan.steps)
    for s in plan.steps:  # outputs nothing reads live to the end of forward
        if s.name not in last_read and s.name != net.output:
            dec(("act", root[s.name]))
    grads = {net.output: ("grad", net.output)}
    new(grads[net.output], size[net.output])  # dlogits from the loss
    dec(("act", root[net.output]))
    dec(("labels",))
    for i in range(len(plan.steps) - 1, -1, -1):
        s = plan.steps[i]
        dy = grads.pop(s.name, None)
        if dy is not None:
            # parameter gradients: a reconstructed BatchNorm's made by the Add after it
            owners = [] if "reconstructed" in s.fused else [s.name]
            bn = reconstructed_input(s.fused)
            if bn is not None:
                owners.append(s.inputs[bn])
            for k in owners:
                if by_name[k].param_bytes:
                    new(("param_grad", k), by_name[k].param_bytes)
            x = s.inputs[0]  # dx added to a gradient nothing else holds (as the Executor)
            adds = "accumulates-dx" in s.fused and x in grads and refs[grads[x]] == 1
            dxs = {}  # the input gradients, all made by the layer's backward
            for j, (x, need) in enumerate(zip(s.inputs, s.need_dx)):
                if not need or adds:
                    continue
                if s.grad_view:
                    dxs[j] = dy
                    inc(dy)
                else:
                    dxs[j] = ("grad", s.name, j)
                    new(dxs[j], size[x])
            for j, dx in dxs.items():
                x = s.inputs[j]
                if x in grads:  # a second consumer's gradient: their sum is a new array
                    total = ("sum", x, i, j)
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
