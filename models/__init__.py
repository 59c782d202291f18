"""The model zoo: one declarative definition per net (a file here), packaged into the
wheel as minidl.models.

Each definition module has `spec(input_shape, num_classes) -> dict` (the layers as
(name, layer type, arguments, inputs) tuples, see minidl.Net.from_spec), INPUT (the
per-sample shape it was designed for) and TRAIN (the training recipe `minidl train`
uses unless told otherwise).  Families (ResNet-20/32/56/110) share one builder.
"""
from __future__ import annotations

import importlib
from typing import Dict, Optional, Sequence

from minidl.graph import Net

# name -> (module, keyword arguments of its spec())
_REGISTRY = {
    "cifar10_quick": ("cifar10_quick", {}),
    "cifar10_full": ("cifar10_full", {}),
    "lenet": ("lenet", {}),
    "resnet20": ("resnet", {"depth": 20}),
    "resnet32": ("resnet", {"depth": 32}),
    "resnet56": ("resnet", {"depth": 56}),
    "resnet110": ("resnet", {"depth": 110}),
    "vgg11_bn": ("vgg", {"depth": 11}),
}


def names():
    return list(_REGISTRY)


def _module(name: str):
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(_REGISTRY)}")
    return importlib.import_module(f"{__name__}.{_REGISTRY[name][0]}")


def info(name: str) -> Dict:
    """{"input": shape, "train": recipe, "doc": what it is} of a model: doc is its
    docstring's first paragraph without the leading "name: ", up to any colon."""
    m = _module(name)
    doc = " ".join((m.__doc__ or "").strip().split("\n\n")[0].split())
    return {"input": tuple(m.INPUT), "train": dict(m.TRAIN),
            "doc": doc.split(": ", 1)[-1].split(": ")[0]}


def spec(name: str, input_shape: Optional[Sequence[int]] = None,
         num_classes: int = 10) -> Dict:
    m = _module(name)
    s = m.spec(tuple(input_shape or m.INPUT), num_classes, **_REGISTRY[name][1])
    s["name"] = name
    return s


def build(name: str, input_shape: Optional[Sequence[int]] = None, num_classes: int = 10,
          seed: Optional[int] = 0) -> Net:
    """The named net, its parameters drawn from seed (None: skip the draw, for nets whose
    weights are loaded next)."""
    net = Net.from_spec(spec(name, input_shape, num_classes))
    return net if seed is None else net.initialize(seed)
