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
    if optimizer is not None:
        tensors.update({_OPT + k: v for k, v in optimizer.state_dict().items()})
    info = {"minidl": FORMAT, "model": net.name, "input_shape": list(net.input_shape),
            "num_classes": int(net.output_shape[0]), **meta}
    safetensors.save(path, tensors, {k: json.dumps(v) for k, v in info.items()})


def load(path) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray], Dict[str, Any]]:
    """(net state, optimizer state, metadata) of a checkpoint."""
    tensors, raw = safetensors.load(path)
    try:
        meta = {k: json.loads(v) for k, v in raw.items()}
    except ValueError as e:
        raise safetensors.SafetensorsError(f"{path}: metadata is not minidl's ({e})") from None
    if meta.get("minidl") != FORMAT or "model" not in meta:
        raise safetensors.SafetensorsError(
            f"{path}: not a minidl checkpoint (format {meta.get('minidl')!r})")
    net_state = {k: v for k, v in tensors.items() if not k.startswith(_OPT)}
    opt_state = {k[len(_OPT):]: v for k, v in tensors.items() if k.startswith(_OPT)}
    return net_state, opt_state, meta


def load_net(path) -> Tuple[Net, Dict[str, Any]]:
    """The net a checkpoint holds (built from models/ by name), with its weights."""
    from minidl import models
    state, _, meta = load(path)
    net = models.build(meta["model"], meta["input_shape"], meta["num_classes"], seed=None)
    net.load_state_dict(state)
    return net, meta
