"""pytest plugin for dev/cuda_emu: a stand-in for pycuda.driver whose "device
memory" is host memory, so tests/test_cuda_kernels.py runs against the
CPU-emulated libminidl_cuda (found first through LD_LIBRARY_PATH)."""
import ctypes
import sys
import types

import numpy as np

keep = {}

class _Alloc:
    def __init__(self, n):
        self.buf = np.zeros(max(int(n), 8) + 64, np.uint8)
        self.p = (self.buf.ctypes.data + 63) // 64 * 64
        keep[self.p] = self
    def __int__(self): return self.p
    __index__ = __int__

drv = types.ModuleType("pycuda.driver")
drv.mem_alloc = _Alloc
def memcpy_htod(dst, src):
    src = np.ascontiguousarray(src); ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)
def memcpy_dtoh(dst, src):
    ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)
drv.memcpy_htod, drv.memcpy_dtoh = memcpy_htod, memcpy_dtoh
class _Ctx:
    def push(self): pass
class Device:
    def __init__(self, i): pass
    def retain_primary_context(self): return _Ctx()
class Context:
    @staticmethod
    def pop(): pass
class Stream:
    handle = 0  # the emulation runs every launch at once, in order
    def synchronize(self): pass
drv.init, drv.Device, drv.Context, drv.Stream = (lambda: None), Device, Context, Stream
pkg = types.ModuleType("pycuda"); pkg.driver = drv
sys.modules["pycuda"] = pkg; sys.modules["pycuda.driver"] = drv
