"""The cpu device: arrays are plain NumPy arrays and kernels are minidl._C's, so the
NumPy path of minidl.ops runs untouched.  Copies to and from it are no copies at
all (to_device returns the array itself when it is already C-contiguous) and are
not counted.  Streams and events exist so that code written for a GPU runs here
unchanged; everything is synchronous.

It has no budget and its counters stay at zero: the ops allocate with NumPy
directly, and counting that would cost every op.  Measure a step on the cpu with
`Executor.track_memory` (the bytes of the arrays the executor holds), or model a
device budget with sim.  `check_fits` compares a request with what the host has
free (`available_bytes`), so that a step the plan says cannot fit fails at once with
OutOfHostMemory instead of swapping or being killed half way.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from minidl import _C
from minidl.device import Device, Event, OutOfHostMemory, Stream, _shape


def available_bytes() -> Optional[int]:
    """The host's available memory and free swap (Linux's /proc/meminfo); None where
    the system does not say.  A container's own limit may be lower."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (ln.split(":", 1) for ln in f)}
        return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, KeyError, ValueError):
        return None


class CpuStream(Stream):
    def wait(self, event: Event) -> None:
        pass


class CpuEvent(Event):
    def record(self, stream: Optional[Stream] = None) -> "CpuEvent":
        return self


class CpuDevice(Device):
    kind = "cpu"

    def __init__(self, memory=None):
        if memory is not None:
            raise ValueError("the cpu device has no memory budget; model one with "
                             "--device sim --sim-memory SIZE")
        super().__init__("cpu")
        self.kernels = _C
        self.default_stream = self.current = CpuStream(self)

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        return np.empty(_shape(shape), dtype)

    def check_fits(self, nbytes: int, what: str) -> None:
        """Raises OutOfHostMemory if nbytes is more than the host has free."""
        free = available_bytes()
        if free is not None and nbytes > free:
            raise OutOfHostMemory(self, nbytes, free, what)

    def fill(self, a: np.ndarray, value) -> None:
        a.fill(value)

    def to_device_async(self, a, out=None, stream=None) -> np.ndarray:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"to_device takes a NumPy array, got {type(a).__name__}")
        if out is None:
            return np.ascontiguousarray(a)
        out[...] = a
        return out

    def to_host_async(self, a, out=None, stream=None) -> np.ndarray:
        if out is None:
            return a
        out[...] = a
        return out

    def stream(self) -> CpuStream:
        return CpuStream(self)

    def event(self) -> CpuEvent:
        return CpuEvent(self)
