"""pytest plugin for dev/cuda_emu: a stand-in for pycuda.driver whose "device
memory" is host memory, so the kernel tests and the cuda device (minidl.device.cuda)
run against the CPU-emulated libminidl_cuda (found first through LD_LIBRARY_PATH).
Only what those use: allocations (filled with 0xFF bytes, NaN as float32, since
cudaMalloc does not zero), copies and memsets (async = done at once), pinned host
arrays (plain ones), streams and events (everything has run when it is queued; an
event keeps the host clock), one device of TOTAL bytes whose primary context is a
no-op, and drv.MemoryError when allocations pass TOTAL."""
import ctypes
import sys
import time
import types

import numpy as np

TOTAL = 4 << 30
keep = {}  # address -> live allocation
held = [0]  # bytes allocated


class Error(Exception): pass
class MemoryError_(Error): pass  # pycuda.driver.MemoryError


class _Alloc:
    def __init__(self, n):
        n = max(int(n), 8)
        if held[0] + n > TOTAL:
            raise MemoryError_("cuMemAlloc failed: out of memory")
        self.n, self.buf = n, np.full(n + 64, 0xFF, np.uint8)
        self.p = (self.buf.ctypes.data + 63) // 64 * 64
        keep[self.p] = self
        held[0] += n
    def free(self):
        if keep.pop(self.p, None) is not None:
            held[0] -= self.n
            self.buf = None
    def __int__(self): return self.p
    __index__ = __int__


def _view(ptr, ctype, n):
    return np.ctypeslib.as_array((ctype * n).from_address(int(ptr))) if n else np.empty(0)

def memcpy_htod(dst, src, stream=None):
    src = np.ascontiguousarray(src); ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)
def memcpy_dtoh(dst, src, stream=None):
    ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)
def memset_d32(ptr, value, count, stream=None): _view(ptr, ctypes.c_uint32, count)[:] = value
def memset_d8(ptr, value, count, stream=None): _view(ptr, ctypes.c_uint8, count)[:] = value

class _Ctx:
    def push(self): pass
    pop = staticmethod(lambda: None)
class Device:
    def __init__(self, i):
        if not 0 <= i < 1: raise Error(f"cuDeviceGet: invalid device ordinal {i}")
    count = staticmethod(lambda: 1)
    def name(self): return "emulated GPU (host memory)"
    def total_memory(self): return TOTAL
    def compute_capability(self): return (8, 0)
    def retain_primary_context(self): return _Ctx()
class Context:
    pop = synchronize = staticmethod(lambda: None)
class Stream:
    handle = 0  # the emulation runs every launch at once, in order
    def synchronize(self): pass
    def wait_for_event(self, event): pass
class Event:
    t = None
    def record(self, stream=None): self.t = time.perf_counter(); return self
    def synchronize(self): return self
    def query(self): return True
    def time_since(self, start): return (self.t - start.t) * 1e3
    def time_till(self, end): return (end.t - self.t) * 1e3

drv = types.ModuleType("pycuda.driver")
drv.__dict__.update(
    init=lambda flags=0: None, mem_alloc=_Alloc, mem_get_info=lambda: (TOTAL - held[0], TOTAL),
    memcpy_htod=memcpy_htod, memcpy_dtoh=memcpy_dtoh, memcpy_htod_async=memcpy_htod,
    memcpy_dtoh_async=memcpy_dtoh, memset_d32=memset_d32, memset_d8=memset_d8,
    memset_d32_async=memset_d32, memset_d8_async=memset_d8,
    pagelocked_empty=lambda shape, dtype, order="C", mem_flags=0: np.empty(shape, dtype, order),
    Device=Device, Context=Context, Stream=Stream, Event=Event, Error=Error,
    MemoryError=MemoryError_)
pkg = types.ModuleType("pycuda"); pkg.driver = drv
sys.modules["pycuda"] = pkg; sys.modules["pycuda.driver"] = drv
