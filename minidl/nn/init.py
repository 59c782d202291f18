"""Weight initialisers.  Each takes the array's shape, its fan-in and fan-out and a
NumPy Generator and returns a float32 array; `make(spec)` turns a declarative spec
(as models/ write them) into one.

Specs: "kaiming" (He et al. 2015: normal, std = sqrt(2 / fan_in)), "xavier"
(Glorot and Bengio 2010: uniform in +-sqrt(6 / (fan_in + fan_out))),
("gaussian", std) (normal with the given std, Caffe's "gaussian" filler),
("constant", value) or a bare number (every element that value).
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Tuple, Union

import numpy as np

Init = Callable[[Tuple[int, ...], int, int, np.random.Generator], np.ndarray]
Spec = Union[str, float, Tuple[str, float]]


def kaiming(shape, fan_in, fan_out, rng):
    return rng.normal(0.0, math.sqrt(2.0 / fan_in), shape).astype(np.float32)


def xavier(shape, fan_in, fan_out, rng):
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def gaussian(std: float) -> Init:
    return lambda shape, fan_in, fan_out, rng: rng.normal(0.0, std, shape).astype(np.float32)


def constant(value: float) -> Init:
    return lambda shape, fan_in, fan_out, rng: np.full(shape, value, np.float32)


def make(spec: Spec) -> Init:
    """The initialiser a spec names; ValueError for anything else."""
    if isinstance(spec, numbers.Real) and not isinstance(spec, bool):
        return constant(float(spec))
    if spec == "kaiming":
        return kaiming
    if spec == "xavier":
        return xavier
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[1], numbers.Real):
        if spec[0] == "gaussian" and spec[1] > 0:
            return gaussian(float(spec[1]))
        if spec[0] == "constant":
            return constant(float(spec[1]))
    raise ValueError(f"unknown initialiser {spec!r}: use 'kaiming', 'xavier', "
                     f"('gaussian', std > 0), ('constant', value) or a number")
