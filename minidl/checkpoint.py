"""Checkpoints: a Net's parameters and buffers (PyTorch-style names), the optimizer's
state (under "optimizer."), and the training position in one safetensors file,
written atomically so that a kill during a save never destroys the previous file.

The metadata holds JSON: "minidl" (format version), "model", "input_shape",
"num_classes", "epoch" (epochs completed), "global_step", "config" and "rng".  All
of minidl's training randomness is counter-based (parameter init from the seed;
shuffling, crops and flips from (seed, epoch, batch); dropout masks from (seed,
step)), so "rng" is just those counters and a resumed run repeats the same draws.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

import numpy as np

from minidl import safetensors
from minidl.graph import Net
from minidl.optim import Optimizer

FORMAT = "1"
_OPT = "optimizer."


def save(path, net: Net, optimizer: Optional[Optimizer], **meta: Any) -> None:
    tensors = net.state_dict()
    clash = next((k for k in tensors if k.startswith(_OPT)), None)
    if clash is not None:  # load would take it for the optimizer's
        raise ValueError(f"checkpoint.save: the net's tensor {clash!r} starts with "
                         f"{_OPT!r}, which checkpoints keep for the optimizer's state; "
                         "rename that layer")
    if optimizer is not None:
        tensors.update({_OPT + k: v for k, v in optimizer.state_dict().items()})
    info = {"minidl": FORMAT, "model": net.name, "input_shape": list(net.input_shape),
            "num_classes": int(net.output_shape[0]), **meta}
    safetensors.save(path, tensors, {k: json.dumps(v) for k, v in info.items()})


def load(path, tensors: bool = True
         ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray], Dict[str, Any]]:
    """(net state, optimizer state, metadata) of a checkpoint; tensors=False reads the
    metadata alone (the states are then empty)."""
    arrays, raw = safetensors.load(path, tensors=tensors)
    try:
        meta = {k: json.loads(v) for k, v in raw.items()}
    except (ValueError, RecursionError) as e:
        raise safetensors.SafetensorsError(f"{path}: metadata is not minidl's ({e!r})") from None
    if meta.get("minidl") != FORMAT or "model" not in meta:
        raise safetensors.SafetensorsError(
            f"{path}: not a minidl checkpoint (format {meta.get('minidl')!r})")
    net_state = {k: v for k, v in arrays.items() if not k.startswith(_OPT)}
    opt_state = {k[len(_OPT):]: v for k, v in arrays.items() if k.startswith(_OPT)}
    return net_state, opt_state, meta


def load_net(path) -> Tuple[Net, Dict[str, Any]]:
    """The net a checkpoint holds (built from models/ by name), with its weights."""
    from minidl import models
    state, _, meta = load(path)
    shape, classes = meta.get("input_shape"), meta.get("num_classes")
    if not (isinstance(meta["model"], str) and isinstance(shape, list) and shape
            and all(_is_count(d) for d in shape) and _is_count(classes)
            # the classifier's weights hold at least one value per class
            and classes <= max((v.size for v in state.values()), default=0)):
        raise safetensors.SafetensorsError(
            f"{path}: metadata model {meta['model']!r}, input_shape {shape!r}, num_classes "
            f"{classes!r} do not describe a net of these tensors")
    net = models.build(meta["model"], shape, classes, seed=None)
    net.load_state_dict(state)
    return net, meta


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1
