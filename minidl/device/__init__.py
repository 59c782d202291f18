"""minidl.device -- where arrays live and kernels run: ``cpu``, ``sim`` and ``cuda``
behind one small interface.

    dev = get_device("sim", memory="512MB")     # or "cpu", "cuda", "cuda:1"
    x = dev.to_device(host_batch)               # an explicit, counted copy
    y = ops.relu(x)                             # runs on x's device, y stays there
    host = dev.to_host(y)                       # an explicit, counted copy back

A `Device` allocates and frees memory against a byte budget (`budget`, `in_use`,
`peak`, `reset_peak()`), copies between host and device (`to_device`, `to_host`, and
`*_async` variants on a `Stream`), records and waits on `Event`s, and launches
kernels (`kernels`: the functions of `minidl._C` with device arrays as buffers).
Arrays on ``sim`` and ``cuda`` are `DeviceArray`s: shape, dtype and a reference to
their allocation, which reshape views share; they are not NumPy arrays, so host
and device data never mix by accident.  On ``cpu`` arrays are plain NumPy arrays
and nothing is copied.  A request the budget cannot take raises `OutOfDeviceMemory`
before anything is allocated or written.

This package sits between `minidl.ops` (which dispatches on the array type) and the
bindings: it imports neither ops nor anything above it, and never pycuda unless a
``cuda`` device is asked for.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import re
from decimal import Decimal, InvalidOperation
from typing import Dict, Optional, Tuple, Union

import numpy as np

Shape = Tuple[int, ...]

__all__ = ["Device", "DeviceArray", "Stream", "Event", "OutOfDeviceMemory", "OutOfHostMemory",
           "get_device", "from_options", "parse_bytes", "format_bytes", "asnumpy", "copy_into",
           "zeros_like", "fill", "device_of"]


# ---- sizes -------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(v: Union[int, str]) -> int:
    """A byte count from an int or a string: "512MB" (10**6), "2GiB" (2**30), "1.5G"
    (a bare K/M/G/T is binary, as in `ulimit`), "4096" or "4096B".  Units are
    case-insensitive; the result must be a whole number of bytes >= 0."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"a byte count must be an int or a string such as '512MB', got {v!r}")
    if isinstance(v, numbers.Integral):
        if v < 0:
            raise ValueError(f"a byte count must be >= 0, got {v}")
        return int(v)
    if not isinstance(v, str):
        raise TypeError(f"a byte count must be an int or a string such as '512MB', "
                        f"got {type(v).__name__} {v!r}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", v)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"cannot read {v!r} as a size: use a number and a unit such as "
                         f"512MB, 2GiB, 1.5G or 4096 (units: B, K, M, G, T, KB, MB, GB, TB, "
                         f"KiB, MiB, GiB, TiB)")
    try:
        n = Decimal(m.group(1)) * _UNITS[unit]
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"cannot read {v!r} as a size") from None
    if n != n.to_integral_value():
        raise ValueError(f"{v!r} is not a whole number of bytes ({n})")
    return int(n)


def format_bytes(n: Optional[int]) -> str:
    """A readable size: '1.50 MiB (1572864 bytes)'."""
    if n is None:
        return "unlimited"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit} ({n} bytes)"
    return f"{n} bytes"


class OutOfDeviceMemory(MemoryError):
    """An allocation (or a step the plan says needs `requested` bytes) does not fit in
    a device's budget.  Raised before anything is allocated or written."""

    def __init__(self, device: "Device", requested: int, what: str = "an allocation"):
        self.device_name = device.name
        self.requested, self.budget = requested, device.budget
        self.in_use, self.peak = device.in_use, device.peak
        super().__init__(self._message(what))

    def _message(self, what: str) -> str:
        return (f"{self.device_name}: out of device memory: {what} asks for "
                f"{format_bytes(self.requested)} with {format_bytes(self.in_use)} in use of a "
                f"{format_bytes(self.budget)} budget (peak so far {format_bytes(self.peak)}); "
                f"use a smaller batch or a larger budget (--sim-memory / --gpu-memory / "
                f"MINIDL_GPU_MEMORY_LIMIT)")


class OutOfHostMemory(OutOfDeviceMemory):
    """A step the plan says needs `requested` bytes on the cpu is more than the host
    has free (`available`, memory and swap).  Raised before the step starts."""

    def __init__(self, device: "Device", requested: int, available: int,
                 what: str = "an allocation"):
        self.available = available
        super().__init__(device, requested, what)

    def _message(self, what: str) -> str:
        return (f"{self.device_name}: {what} needs {format_bytes(self.requested)}, more than "
                f"the {format_bytes(self.available)} this host has free (memory and swap); "
                f"use a smaller batch")


# ---- arrays ------------------------------------------------------------------------


def _shape(shape) -> Shape:
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape  # the common case, as it is
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"array dimensions must be >= 0, got {shape}")
    return shape


class DeviceArray:
    """A C-contiguous array in a device's memory.  `mem` is the allocation (freed when
    the last array using it goes away), `offset` the first element's index in it."""

    __slots__ = ("device", "shape", "dtype", "mem", "offset", "size", "__weakref__")

    def __init__(self, device: "Device", mem, shape: Shape, dtype, offset: int = 0):
        self.device, self.mem, self.shape = device, mem, shape
        self.dtype, self.offset = np.dtype(dtype), offset
        self.size = math.prod(shape)  # the number of elements (shape never changes)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def reshape(self, *shape) -> "DeviceArray":
        """A view with another shape (one dimension may be -1), sharing the memory."""
        if shape == (-1,):
            return self.ravel()
        if len(shape) == 1 and (isinstance(shape[0], (tuple, list)) or
                                not isinstance(shape[0], numbers.Integral)):
            shape = shape[0]
        shape = tuple(map(int, shape))
        if -1 in shape and shape.count(-1) == 1:
            rest = math.prod(d for d in shape if d != -1)
            if rest == 0 or self.size % rest:
                raise ValueError(f"cannot reshape an array of shape {self.shape} into {shape}")
            shape = tuple(self.size // rest if d == -1 else d for d in shape)
        if math.prod(shape) != self.size or (shape and min(shape) < 0):
            raise ValueError(f"cannot reshape an array of shape {self.shape} into {shape}")
        return DeviceArray(self.device, self.mem, shape, self.dtype, self.offset)

    def ravel(self) -> "DeviceArray":
        """A 1-D view (reshape(-1) without its argument handling, for the hot paths)."""
        return self if len(self.shape) == 1 else \
            DeviceArray(self.device, self.mem, (self.size,), self.dtype, self.offset)

    def __array__(self, *args, **kwargs):
        raise TypeError(f"this array is in {self.device.name} memory, not a NumPy array: "
                        f"copy it explicitly with device.to_host(a) (or minidl.device.asnumpy)")

    def __repr__(self) -> str:
        return f"DeviceArray({self.device.name}, shape={self.shape}, dtype={self.dtype})"


# ---- streams and events ------------------------------------------------------------


class Stream:
    """An ordered queue of copies and kernels on a device; work on different streams
    may overlap.  `wait(event)` makes later work wait for an event recorded elsewhere."""

    def __init__(self, device: "Device"):
        self.device = device

    def wait(self, event: "Event") -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Blocks the host until everything queued so far has run."""


class Event:
    """A point in a stream: `record(stream)` marks it, `synchronize()` waits for it."""

    def __init__(self, device: "Device"):
        self.device = device

    def record(self, stream: Optional[Stream] = None) -> "Event":
        raise NotImplementedError

    def synchronize(self) -> None:
        pass


# ---- the device interface ----------------------------------------------------------


class Device:
    """What every device offers; see the module docstring.  Subclasses implement
    `_allocate`, the copies and the streams."""

    kind = "?"

    def __init__(self, name: str, memory: Union[int, str, None] = None):
        self.name = name
        #: bytes this device may hold (None: no limit); may be changed between steps
        self.budget: Optional[int] = None if memory is None else parse_bytes(memory)
        if self.budget is not None and self.budget <= 0:
            raise ValueError(f"{name}: the memory budget must be positive, got {memory!r}")
        self.in_use = 0   # bytes held now (on cuda: including the allocator's cache)
        self.peak = 0     # the most ever held since creation or reset_peak()
        self.copies: Dict[str, Dict[str, int]] = {}
        self.launches = 0  # kernels run
        self.reset_counters()
        self.default_stream: Stream = None  # set by subclasses
        self.current: Stream = None         # the stream kernels and plain copies use

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}, budget {format_bytes(self.budget)}>"

    # -- accounting ------------------------------------------------------------------
    def _charge(self, nbytes: int, what: str = "an allocation") -> None:
        if self.budget is not None and self.in_use + nbytes > self.budget:
            raise OutOfDeviceMemory(self, nbytes, what)
        self.in_use += nbytes
        if self.in_use > self.peak:
            self.peak = self.in_use

    def _uncharge(self, nbytes: int) -> None:
        self.in_use -= nbytes

    def check_fits(self, nbytes: int, what: str) -> None:
        """Raises OutOfDeviceMemory if nbytes more would exceed the budget (a plan's
        check before a step, so that a step never stops half way)."""
        if self.budget is not None and self.in_use + nbytes > self.budget:
            raise OutOfDeviceMemory(self, nbytes, what)

    def reset_peak(self) -> None:
        self.peak = self.in_use

    def reset_counters(self) -> None:
        """Zeroes the copy counters (count and bytes per direction) and `launches`."""
        self.copies = {"h2d": {"count": 0, "bytes": 0}, "d2h": {"count": 0, "bytes": 0}}
        self.launches = 0

    def _count(self, direction: str, nbytes: int) -> None:
        c = self.copies[direction]
        c["count"] += 1
        c["bytes"] += nbytes

    # -- arrays ----------------------------------------------------------------------
    def empty(self, shape, dtype=np.float32) -> DeviceArray:
        shape, dtype = _shape(shape), np.dtype(dtype)
        count = math.prod(shape)
        return DeviceArray(self, self._allocate(count * dtype.itemsize, count, dtype), shape,
                           dtype)

    def _allocate(self, nbytes: int, count: int, dtype):
        raise NotImplementedError

    def zeros(self, shape, dtype=np.float32) -> DeviceArray:
        return self.full(shape, 0, dtype)

    def full(self, shape, value, dtype=np.float32) -> DeviceArray:
        a = self.empty(shape, dtype)
        self.fill(a, value)
        return a

    def fill(self, a: DeviceArray, value) -> None:
        raise NotImplementedError

    def workspace(self, nbytes: int):
        """Scratch memory for one kernel call, or None where the kernels take their own."""
        return None

    def pinned_empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A host array the device can copy from and to asynchronously."""
        return np.empty(_shape(shape), dtype)

    # -- copies ----------------------------------------------------------------------
    def to_device(self, a: np.ndarray, out: Optional[DeviceArray] = None) -> DeviceArray:
        """A device copy of host array a (into out when given); returns when done."""
        out = self.to_device_async(a, out, self.current)
        self.current.synchronize()
        return out

    def to_host(self, a: DeviceArray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """A host copy of device array a (into out when given); returns when done."""
        out = self.to_host_async(a, out, self.current)
        self.current.synchronize()
        return out

    def to_device_async(self, a: np.ndarray, out: Optional[DeviceArray] = None,
                        stream: Optional[Stream] = None) -> DeviceArray:
        raise NotImplementedError

    def to_host_async(self, a: DeviceArray, out: Optional[np.ndarray] = None,
                      stream: Optional[Stream] = None) -> np.ndarray:
        raise NotImplementedError

    def _host_source(self, a, out) -> Tuple[np.ndarray, DeviceArray]:
        """Checks a host->device copy; allocates out when None."""
        if not isinstance(a, np.ndarray):
            raise TypeError(f"to_device takes a NumPy array, got {type(a).__name__}")
        a = np.ascontiguousarray(a)
        if out is None:
            return a, self.empty(a.shape, a.dtype)
        self._check_pair(a, out, "out")
        return a, out

    def _host_target(self, a, out) -> np.ndarray:
        """Checks a device->host copy; allocates out when None."""
        if not isinstance(a, DeviceArray) or a.device is not self:
            raise TypeError(f"to_host takes an array on {self.name}, got {_where(a)}")
        if out is None:
            return np.empty(a.shape, a.dtype)
        if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be a C-contiguous writable NumPy array")
        self._check_pair(a, out, "out")
        return out

    def _check_pair(self, src, dst, name) -> None:
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"{name} must have shape {src.shape} and dtype {src.dtype}, got "
                             f"{dst.shape} {dst.dtype}")
        if isinstance(dst, DeviceArray) and dst.device is not self:
            raise ValueError(f"{name} must be on {self.name}, got {dst.device.name}")

    # -- streams, events, kernels ----------------------------------------------------
    def stream(self) -> Stream:
        raise NotImplementedError

    def event(self) -> Event:
        raise NotImplementedError

    @contextlib.contextmanager
    def use(self, stream: Stream):
        """Kernels and plain copies go to `stream` inside the block."""
        before, self.current = self.current, stream
        try:
            yield stream
        finally:
            self.current = before

    def synchronize(self) -> None:
        """Waits until all work on the device is done."""


class Kernels:
    """A device's kernels: the functions of `module` (minidl._C or minidl._cuda) by
    name, taking DeviceArrays where the module takes buffers.  Each call goes through
    `device._launch(name, fn, args)`; size queries (`*_size`) are passed through."""

    def __init__(self, device: "Device", module):
        self._device, self._module = device, module

    def __getattr__(self, name: str):
        fn = getattr(self._module, name)
        if not name.endswith("_size"):
            dev, kernel = self._device, fn

            def fn(*args):
                return dev._launch(name, kernel, args)
            fn.__name__ = name
        setattr(self, name, fn)  # found directly from now on
        return fn


def _where(a) -> str:
    if isinstance(a, DeviceArray):
        return f"an array on {a.device.name}"
    if isinstance(a, np.ndarray):
        return "a host NumPy array"
    return type(a).__name__


# ---- choosing a device -------------------------------------------------------------

_DEFAULT: Dict[str, Device] = {}


def canonical_name(spec: str) -> str:
    """"cpu", "sim", "cuda" -> "cuda:0", "cuda:N"; ValueError for anything else."""
    if not isinstance(spec, str):
        raise TypeError(f"a device is named by a string such as 'cpu', 'sim' or 'cuda:0', "
                        f"got {spec!r}")
    m = re.fullmatch(r"(cpu|sim|cuda)(?::(\d+))?", spec.strip().lower())
    if m is None or (m.group(2) is not None and m.group(1) != "cuda"):
        raise ValueError(f"unknown device {spec!r}: use cpu, sim, cuda or cuda:N")
    return f"cuda:{int(m.group(2) or 0)}" if m.group(1) == "cuda" else m.group(1)


def get_device(spec: Union[str, Device] = "cpu", memory: Union[int, str, None] = None,
               **options) -> Device:
    """The device named by spec ("cpu", "sim", "cuda", "cuda:N"), or spec itself when it
    is a Device.  Without memory or options it is the process's shared instance of that
    name; with them a new, independent one (its own budget, counters and clock).
    sim options: the cost model (see minidl.device.sim).  For cuda, memory defaults to
    $MINIDL_GPU_MEMORY_LIMIT, else the whole GPU."""
    if isinstance(spec, Device):
        if memory is not None or options:
            raise ValueError("memory and options apply when a device is created by name")
        return spec
    name = canonical_name(spec)
    shared = memory is None and not options
    if shared and name in _DEFAULT:
        return _DEFAULT[name]
    if name == "cpu":
        from minidl.device.cpu import CpuDevice
        dev = CpuDevice(memory, **options)
    elif name == "sim":
        from minidl.device.sim import SimDevice
        dev = SimDevice(memory, **options)
    else:
        from minidl.device.cuda import CudaDevice
        dev = CudaDevice(int(name.split(":")[1]), memory, **options)
    if shared:
        _DEFAULT[name] = dev
    return dev


def from_options(device: str = "cpu", sim_memory=None, gpu_memory=None) -> Device:
    """The device of the command-line options --device, --sim-memory and --gpu-memory
    (a memory option for another kind of device is an error, not ignored)."""
    name = canonical_name(device)
    kind = name.split(":")[0]
    for option, value, applies in (("--sim-memory", sim_memory, "sim"),
                                   ("--gpu-memory", gpu_memory, "cuda")):
        if value is not None and kind != applies:
            raise ValueError(f"{option} applies to --device {applies}, not {name}")
    memory = sim_memory if kind == "sim" else gpu_memory
    return get_device(name, memory=memory)


# ---- helpers that take host or device arrays alike ---------------------------------


def device_of(a) -> Device:
    """The device an array lives on (the cpu device for NumPy arrays)."""
    return a.device if isinstance(a, DeviceArray) else get_device("cpu")


def asnumpy(a) -> np.ndarray:
    """a itself for a NumPy array, else a host copy of the device array (counted)."""
    return a.device.to_host(a) if isinstance(a, DeviceArray) else a


def copy_into(dst, src) -> None:
    """dst[...] = src for a host or device dst; src a host array (or a device array on
    dst's device only when dst is one too)."""
    if isinstance(dst, DeviceArray):
        if isinstance(src, DeviceArray):
            src = src.device.to_host(src)
        dst.device.to_device(np.ascontiguousarray(src, dst.dtype), out=dst)
    else:
        dst[...] = asnumpy(src)


def zeros_like(a):
    """Zeros of a's shape and dtype, where a lives."""
    return a.device.zeros(a.shape, a.dtype) if isinstance(a, DeviceArray) else np.zeros_like(a)


def fill(a, value) -> None:
    if isinstance(a, DeviceArray):
        a.device.fill(a, value)
    else:
        a.fill(value)
