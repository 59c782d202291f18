"""The cuda device: an NVIDIA GPU through pycuda (context, memory, streams, events,
pinned host memory) and the CUDA twins of the C kernels in minidl._cuda (same names
and argument order, device addresses as ints for buffers, a final `stream=`).

Memory comes from a caching allocator: sizes are rounded up to a multiple of 512
bytes and freed blocks go back to a free list per rounded size, to be reused by
the next request of that size.  Cached blocks count toward the budget
(`--gpu-memory`, else $MINIDL_GPU_MEMORY_LIMIT, else the whole GPU), so a big GPU
can act as a small one; under budget pressure (or when the driver itself runs out)
the cache is released before OutOfDeviceMemory is raised.  `in_use` is what the
allocator holds from the GPU (live + `cached`).  Kernel workspaces are allocated
here too, for the length of one op, and are charged.

Blocks are reused in stream order: work that uses an array on a stream other than
the one it was freed on must be fenced with an event first.  The device uses the
GPU's primary context (shared with other libraries in the process), made current
when the device is created.
"""
from __future__ import annotations

import atexit
import functools
import inspect
import os
from typing import Dict, List, Optional

import numpy as np

from minidl.device import Device, DeviceArray, Event, Kernels, OutOfDeviceMemory, Stream

GRANULE = 512


@functools.lru_cache(maxsize=None)
def _c_params(name: str):
    """The parameter names of the CPU binding's kernel: the order callers use."""
    from minidl import _C
    return tuple(inspect.signature(getattr(_C, name)).parameters)


@functools.lru_cache(maxsize=None)
def _cuda_params(fn):
    return frozenset(inspect.signature(fn).parameters)


class CudaUnavailable(RuntimeError):
    """Asked for a cuda device where pycuda, minidl._cuda or a GPU is missing."""


def _modules():
    """(pycuda.driver, minidl._cuda), or CudaUnavailable saying what is missing."""
    missing = []
    try:
        import pycuda.driver as drv
    except ImportError:
        drv = None
        missing.append("pycuda is not installed (pip install '.[cuda]')")
    try:
        from minidl import _cuda
    except ImportError:
        _cuda = None
        missing.append("minidl was built without its CUDA kernels (minidl._cuda): rebuild "
                       "with the CUDA toolkit, `pip install '.[cuda]'` with nvcc on PATH or "
                       "CUDA_HOME set")
    if drv is not None:
        try:
            drv.init()
            if drv.Device.count() == 0:
                missing.append("no CUDA GPU is visible (check nvidia-smi and "
                               "CUDA_VISIBLE_DEVICES)")
        except Exception as e:  # the driver library or a GPU is missing
            missing.append(f"the CUDA driver reports no usable GPU ({e})")
    if missing:
        raise CudaUnavailable("cannot use --device cuda: " + "; ".join(missing)
                              + ". Use --device cpu, or --device sim to model a GPU.")
    return drv, _cuda


class CudaStream(Stream):
    def __init__(self, device: "CudaDevice", stream=None):
        super().__init__(device)
        self.stream = stream  # a pycuda Stream; None is the default stream
        self.handle = 0 if stream is None else stream.handle

    def wait(self, event: "CudaEvent") -> None:
        if self.stream is None:
            event.synchronize()  # pycuda has no wait_for_event on the default stream
        else:
            self.stream.wait_for_event(event.event)

    def synchronize(self) -> None:
        if self.stream is None:
            self.device.drv.Context.synchronize()
        else:
            self.stream.synchronize()


class CudaEvent(Event):
    def __init__(self, device: "CudaDevice"):
        super().__init__(device)
        self.event = device.drv.Event()

    def record(self, stream: Optional[CudaStream] = None) -> "CudaEvent":
        self.event.record((stream or self.device.current).stream)
        return self

    def synchronize(self) -> None:
        self.event.synchronize()

    def elapsed_ms(self, end: "CudaEvent") -> float:
        """Milliseconds from this event to end (both recorded and completed)."""
        return end.event.time_since(self.event)


class _CudaBuffer:
    """Device memory described by __cuda_array_interface__ (what mpi4py passes to a
    CUDA-aware MPI)."""

    def __init__(self, ptr: int, size: int, dtype):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": np.dtype(dtype).str,
                                         "data": (ptr, False), "version": 3, "strides": None}


class _Block:
    __slots__ = ("device", "alloc", "size", "ptr")

    def __init__(self, device, alloc, size):
        self.device, self.alloc, self.size = device, alloc, size
        self.ptr = 0 if alloc is None else int(alloc)

    def __del__(self):
        self.device._release(self)


class CudaDevice(Device):
    kind = "cuda"

    def __init__(self, index: int = 0, memory=None):
        self.drv, cuda_kernels = _modules()
        count = self.drv.Device.count()
        if not 0 <= index < count:
            raise ValueError(f"cuda:{index}: there are {count} GPU(s) (cuda:0 to "
                             f"cuda:{count - 1})")
        self.gpu = self.drv.Device(index)
        self.context = self.gpu.retain_primary_context()
        self.context.push()
        atexit.register(self._close)
        if memory is None:
            memory = os.environ.get("MINIDL_GPU_MEMORY_LIMIT") or self.gpu.total_memory()
        super().__init__(f"cuda:{index}", memory)
        self.gpu_name = self.gpu.name()
        self.cached = 0
        self._free: Dict[int, List] = {}  # rounded size -> DeviceAllocations
        self.kernels = Kernels(self, cuda_kernels)
        self.default_stream = self.current = CudaStream(self)

    def _close(self) -> None:
        try:
            self.synchronize()
            self.empty_cache()
            self.context.pop()
        except Exception:  # the driver may be shutting down already
            pass

    # -- the caching allocator -------------------------------------------------------
    def _allocate(self, nbytes, count, dtype):
        if nbytes == 0:
            return _Block(self, None, 0)
        size = -(-nbytes // GRANULE) * GRANULE
        cached = self._free.get(size)
        if cached:
            self.cached -= size
            return _Block(self, cached.pop(), size)
        if self.budget is not None and self.in_use + size > self.budget:
            self.empty_cache()
        self._charge(size)  # raises OutOfDeviceMemory with the numbers, nothing allocated
        try:
            alloc = self.drv.mem_alloc(size)
        except self.drv.MemoryError:
            self.empty_cache()
            try:
                alloc = self.drv.mem_alloc(size)
            except self.drv.MemoryError:
                self._uncharge(size)
                raise OutOfDeviceMemory(self, size, "an allocation (the GPU itself is full)") \
                    from None
        return _Block(self, alloc, size)

    def _release(self, block: _Block) -> None:
        if block.alloc is not None:
            self._free.setdefault(block.size, []).append(block.alloc)
            self.cached += block.size

    def empty_cache(self) -> None:
        """Gives every cached block back to the GPU."""
        for allocs in self._free.values():
            for a in allocs:
                a.free()
        self._free.clear()
        self._uncharge(self.cached)
        self.cached = 0

    @staticmethod
    def address(a: DeviceArray) -> int:
        return a.mem.ptr + a.offset * a.dtype.itemsize

    def exchange_buffer(self, a: DeviceArray):
        """a's GPU memory as an object a CUDA-aware MPI reads and writes in place
        (__cuda_array_interface__); the device is synchronised first."""
        self.synchronize()
        return _CudaBuffer(self.address(a), a.size, a.dtype)

    def workspace(self, nbytes: int):
        return self.empty((-(-nbytes // 4),), np.float32) if nbytes > 0 else None

    def pinned_empty(self, shape, dtype=np.float32) -> np.ndarray:
        return self.drv.pagelocked_empty(tuple(shape), dtype)

    def fill(self, a: DeviceArray, value) -> None:
        if a.size == 0:
            return
        s = self.current.stream
        if a.dtype.itemsize == 4:
            bits = int(np.array(value, a.dtype).view(np.uint32))
            self.drv.memset_d32_async(self.address(a), bits, a.size, s)
        elif value == 0:
            self.drv.memset_d8_async(self.address(a), 0, a.nbytes, s)
        else:
            raise TypeError(f"cuda fill: {a.dtype} arrays can only be zeroed")

    # -- copies ----------------------------------------------------------------------
    def to_device_async(self, a, out=None, stream=None) -> DeviceArray:
        """The copy is asynchronous only from pinned memory (pinned_empty); a must not
        change until the stream has passed the copy."""
        a, out = self._host_source(a, out)
        if a.nbytes:
            self.drv.memcpy_htod_async(self.address(out), a, (stream or self.current).stream)
        self._count("h2d", a.nbytes)
        return out

    def to_host_async(self, a, out=None, stream=None) -> np.ndarray:
        out = self._host_target(a, out)
        if a.nbytes:
            self.drv.memcpy_dtoh_async(out, self.address(a), (stream or self.current).stream)
        self._count("d2h", a.nbytes)
        return out

    # -- streams, events, kernels ----------------------------------------------------
    def stream(self) -> CudaStream:
        return CudaStream(self, self.drv.Stream())

    def event(self) -> CudaEvent:
        return CudaEvent(self)

    def synchronize(self) -> None:
        self.drv.Context.synchronize()

    def _launch(self, name, fn, args):
        """Calls the _cuda twin of _C.<name> with the arguments given in _C's order:
        buffers become device addresses, a workspace also passes its size (ws_bytes),
        an element count is the first buffer's size, and a loss the kernel writes to
        device memory comes back as a float (_C returns it)."""
        kw, first = {}, None
        for pname, a in zip(_c_params(name), args):
            if isinstance(a, DeviceArray):
                if a.device is not self:
                    raise ValueError(f"{name}: an operand is on {a.device.name}, not {self.name}")
                kw[pname] = self.address(a)
                first = a if first is None else first
                if pname == "ws":
                    kw["ws_bytes"] = a.nbytes
            elif isinstance(a, np.ndarray):
                raise TypeError(f"{name}: a host NumPy array was passed to a {self.name} "
                                f"kernel; copy it to the device first (to_device)")
            else:
                kw[pname] = 0 if a is None else a
        wants = _cuda_params(fn)
        if "count" in wants and "count" not in kw:
            kw["count"] = first.size if first is not None else 0
        loss = None
        if "loss" in wants and "loss" not in kw:
            loss = self.empty((1,))
            kw["loss"] = self.address(loss)
        self.launches += 1
        out = fn(**kw, stream=self.current.handle)
        return float(self.to_host(loss)[0]) if loss is not None else out
