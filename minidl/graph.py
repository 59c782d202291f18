"""Net: a directed acyclic graph of layers with shape inference.

Nodes are added in order, each naming its inputs among the nodes already there, so
the insertion order is a topological order and cycles cannot be built.  Shapes are
inferred as nodes are added (per sample, without the batch dimension); a layer whose
inputs do not fit raises ShapeError naming the node, the layer and the input shapes.
Parameters and buffers are addressed by PyTorch-style names "<node>.<param>".
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from minidl import nn
from minidl.device import Device, asnumpy, copy_into, device_of, get_device
from minidl.nn.layers import Layer, Parameter, Shape, ShapeError

INPUT = "input"


@dataclass
class Node:
    name: str
    layer: Optional[Layer]  # None for the input node
    inputs: List[str]
    shape: Shape  # per-sample output shape
    consumers: List[str] = field(default_factory=list)


def checked_state_value(name: str, value, shape, integer: bool = False) -> np.ndarray:
    """A value that load_state_dict may copy into an array of `shape`: numbers of that
    shape, and whole ones for an integer array (a float NaN would become -2^63)."""
    src = np.asarray(value)
    if src.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected an array of numbers, got dtype {src.dtype}")
    if src.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {src.shape}")
    if integer and src.dtype.kind == "f" and not (np.isfinite(src) & (src == np.trunc(src))).all():
        raise ValueError(f"{name}: expected whole numbers, got {src.ravel()[:5]}")
    return src


class Net:
    """A DAG of layers.  `Net((3, 32, 32))` starts with the node "input" of that per-sample
    shape; `add(name, layer, inputs)` appends a node (inputs default to the last node)."""

    def __init__(self, input_shape: Sequence[int], name: str = "net"):
        shape = tuple(input_shape)
        if not shape or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool)
                                and d >= 1 for d in shape):
            raise ValueError(f"input_shape must be positive sizes, got {shape}")
        shape = tuple(int(d) for d in shape)
        self.name = name
        self.nodes: Dict[str, Node] = {INPUT: Node(INPUT, None, [], shape)}
        self._last = INPUT

    # -- building --------------------------------------------------------------------
    def add(self, name: str, layer: Layer, inputs: Union[str, Sequence[str], None] = None) -> str:
        if not isinstance(name, str) or not name or name in self.nodes:
            raise ValueError(f"node name must be a new non-empty string, got {name!r}"
                             + (" (already in the net)" if name in self.nodes else ""))
        if not isinstance(layer, Layer):
            raise TypeError(f"node {name!r}: expected a minidl.nn layer, got {layer!r}")
        if getattr(layer, "_node", None) is not None:
            raise ValueError(f"node {name!r}: this {type(layer).__name__} is already node "
                             f"{layer._node!r} of a net; each node needs a layer of its own "
                             f"(parameters are not shared)")
        ins = [self._last] if inputs is None else [inputs] if isinstance(inputs, str) \
            else list(inputs)
        missing = [i for i in ins if i not in self.nodes]
        if missing:
            raise ValueError(f"node {name!r}: unknown input {missing[0]!r}; inputs must be "
                             f"nodes added before it ({', '.join(self.nodes)})")
        if len(ins) != layer.num_inputs:
            raise ValueError(f"node {name!r}: {type(layer).__name__} takes {layer.num_inputs} "
                             f"input(s), got {len(ins)}: {ins}")
        in_shapes = [self.nodes[i].shape for i in ins]
        try:
            shape = tuple(int(d) for d in layer.build(in_shapes))
        except ShapeError as e:
            desc = ", ".join(f"{i} {s}" for i, s in zip(ins, in_shapes))
            raise ShapeError(f"node {name!r} ({type(layer).__name__}): {e}; inputs: {desc}") \
                from None
        self.nodes[name] = Node(name, layer, ins, shape)
        layer._node = name
        for i in ins:
            self.nodes[i].consumers.append(name)
        self._last = name
        return name

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> "Net":
        """Builds a net from a declarative spec: {"name", "input": shape, "layers":
        [(name, LayerType, {kwargs}, inputs-or-None), ...]} (see models/)."""
        net = cls(spec["input"], spec.get("name", "net"))
        for entry in spec["layers"]:
            name, kind, kwargs, inputs = (tuple(entry) + (None,))[:4]
            if kind not in nn.LAYERS:
                raise ValueError(f"node {name!r}: unknown layer type {kind!r}; "
                                 f"known: {', '.join(sorted(nn.LAYERS))}")
            net.add(name, nn.LAYERS[kind](**(kwargs or {})), inputs)
        return net

    # -- queries ---------------------------------------------------------------------
    @property
    def output(self) -> str:
        return self._last

    @property
    def input_shape(self) -> Shape:
        return self.nodes[INPUT].shape

    @property
    def output_shape(self) -> Shape:
        return self.nodes[self._last].shape

    def layers(self):
        """(name, node) of every layer node in topological order."""
        return [(k, n) for k, n in self.nodes.items() if n.layer is not None]

    def parameters(self) -> Dict[str, Parameter]:
        return {f"{k}.{p}": v for k, n in self.layers() for p, v in n.layer.params.items()}

    def buffers(self) -> Dict[str, np.ndarray]:
        return {f"{k}.{b}": v for k, n in self.layers() for b, v in n.layer.buffers.items()}

    def num_parameters(self) -> int:
        return sum(p.data.size for p in self.parameters().values())

    def state_dict(self) -> Dict[str, np.ndarray]:
        """Host copies of every parameter and buffer under their names, wherever they live."""
        d = {k: p.data for k, p in self.parameters().items()}
        d.update(self.buffers())
        return {k: a.copy() if isinstance(a, np.ndarray) else asnumpy(a) for k, a in d.items()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copies values in; every name must be present with its exact shape, and no others."""
        targets = {k: p.data for k, p in self.parameters().items()}
        targets.update(self.buffers())
        missing = sorted(set(targets) - set(state))
        extra = sorted(set(state) - set(targets))
        if missing or extra:
            raise KeyError(f"state does not match net {self.name!r}: missing {missing[:5]}, "
                           f"unexpected {extra[:5]}")
        sources = {k: checked_state_value(k, state[k], dst.shape,
                                          integer=np.dtype(dst.dtype).kind in "iu")
                   for k, dst in targets.items()}
        for k, dst in targets.items():  # all checked first: nothing changes on an error
            copy_into(dst, sources[k])

    def to(self, device) -> "Net":
        """Moves every parameter and float32 buffer to device ("cpu", "sim", "cuda:0" or
        a Device) with explicit copies; gradients are dropped.  Returns self."""
        dev = get_device(device)
        for _, n in self.layers():
            n.layer.to(dev)
        return self

    @property
    def device(self) -> Device:
        """The device of the parameters (cpu for a net without any)."""
        for p in self.parameters().values():
            return device_of(p.data)
        return get_device("cpu")

    def initialize(self, seed: int) -> "Net":
        """Draws every parameter from its initialiser with one Generator seeded by seed,
        in node order, and resets buffers."""
        rng = np.random.default_rng(seed)
        for _, n in self.layers():
            n.layer.reset_parameters(rng)
        return self

    def __repr__(self) -> str:
        lines = [f"Net {self.name!r}: input {self.input_shape}"]
        for k, n in self.layers():
            lines.append(f"  {k:<22} {n.layer!r:<60} <- {', '.join(n.inputs):<16} {n.shape}")
        return "\n".join(lines)
