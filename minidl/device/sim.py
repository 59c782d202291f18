"""The sim device: a CPU-backed stand-in for a GPU, so that plans which place, move or
pipeline data run and are checked on machines without one.

- Memory: every array is charged against the budget (`--sim-memory`, exact byte
  counts, no rounding) and released when its last reference goes; `peak` is the
  most ever held.  A request over budget raises OutOfDeviceMemory before anything
  is allocated.  Kernel workspaces are not charged: the C kernels take their own
  scratch on the host (on cuda they come from the device allocator and are).
- Data: a sim array is a DeviceArray over private host storage, not a NumPy array;
  it reaches the host only through `to_host` (or `asnumpy`), and every copy is
  counted (`copies["h2d"|"d2h"]`: count and bytes).  A kernel that returns a scalar
  to the host (the loss) counts as a 4-byte d2h copy.
- Kernels: the same C kernels as the cpu device on the same buffers, so results are
  bit-identical to the CPU's.
- Time: a modelled device clock.  Three engines -- compute, an h2d copy engine and
  a d2h copy engine -- each run one operation at a time, in issue order.  An
  operation on stream s starts when both s and its engine are free:
      start = max(s.time, engine.free);  s.time = engine.free = start + cost
  so copies on one stream overlap kernels on another, kernels on two streams take
  turns on the compute engine, and `s.wait(event)` delays s to the time the event
  was recorded at (a new stream starts at time 0: order it after another
  with an event).  Costs (a roofline with a fixed launch latency):
      kernel: launch_latency + max(flops / compute_flops, bytes / memory_bandwidth)
      copy:   launch_latency + bytes / pcie_bandwidth
  where bytes are the sizes of all the kernel's array arguments (each read or
  written once) and flops 2*M*N*K for GEMM, convolution and linear kernels, one
  per element for the rest.  `clock` is the time the last operation ends.  The
  host is not modelled: it issues work instantly and synchronizing costs nothing.
  Defaults are an NVIDIA H100 SXM's fp32 rate (67 TFLOP/s without tensor cores)
  and HBM3 bandwidth (3.35 TB/s), a PCIe 4.0 x16 link (25 GB/s achieved of 31.5)
  and 4 us per launch; each is an argument of SimDevice (and get_device).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from minidl import _C
from minidl.device import Device, DeviceArray, Event, Kernels, Stream


def _conv_flops(shape, *_):
    n, c_in, _h, _w, c_out, kh, kw = shape[:7]
    ho, wo = _C.conv2d_output_size((max(n, 1),) + tuple(shape[1:]))
    return 2 * n * c_out * ho * wo * c_in * kh * kw


def _linear_flops(n, in_, out, *_):
    return 2 * n * in_ * out


FLOPS = {
    "sgemm": lambda trans_a, trans_b, m, n, k, *_: 2 * m * n * k,
    "conv2d_forward": _conv_flops,
    "conv2d_backward_data": _conv_flops,
    "conv2d_backward_weights": _conv_flops,
    "conv2d_forward_fused": _conv_flops,
    "conv2d_backward_weights_fused": _conv_flops,
    "conv2d_backward_data_fused": _conv_flops,
    "linear_forward": _linear_flops,
    "linear_backward_data": _linear_flops,
    "linear_backward_weights": _linear_flops,
}
"""Floating-point operations of the kernels that are not one per element."""


class SimStream(Stream):
    def __init__(self, device: "SimDevice"):
        super().__init__(device)
        self.time = 0.0  # when the work queued on it so far ends (modelled seconds)

    def wait(self, event: "SimEvent") -> None:
        self.time = max(self.time, event.time)


class SimEvent(Event):
    def __init__(self, device: "SimDevice"):
        super().__init__(device)
        self.time = 0.0

    def record(self, stream: Optional[SimStream] = None) -> "SimEvent":
        self.time = (stream or self.device.current).time
        return self


class _Block:
    """Host storage standing in for device memory; uncharged when freed."""

    __slots__ = ("device", "nbytes", "host")

    def __init__(self, device, nbytes, host):
        self.device, self.nbytes, self.host = device, nbytes, host

    def __del__(self):
        self.device._uncharge(self.nbytes)


class SimDevice(Device):
    kind = "sim"

    def __init__(self, memory=None, *, compute_flops: float = 67e12,
                 memory_bandwidth: float = 3.35e12, pcie_bandwidth: float = 25e9,
                 launch_latency: float = 4e-6):
        super().__init__("sim", memory)
        for k, v in (("compute_flops", compute_flops), ("memory_bandwidth", memory_bandwidth),
                     ("pcie_bandwidth", pcie_bandwidth)):
            if not v > 0:
                raise ValueError(f"sim: {k} must be positive, got {v!r}")
        if not launch_latency >= 0:
            raise ValueError(f"sim: launch_latency must be >= 0, got {launch_latency!r}")
        self.compute_flops, self.memory_bandwidth = float(compute_flops), float(memory_bandwidth)
        self.pcie_bandwidth, self.launch_latency = float(pcie_bandwidth), float(launch_latency)
        self.engines = {"compute": 0.0, "h2d": 0.0, "d2h": 0.0}  # when each is free
        self.kernels = Kernels(self, _C)
        self.default_stream = self.current = SimStream(self)

    @property
    def clock(self) -> float:
        """Modelled seconds until everything issued so far has run."""
        return max(self.engines.values())

    def _run(self, engine: str, seconds: float, stream: SimStream) -> None:
        end = max(stream.time, self.engines[engine]) + seconds
        stream.time = self.engines[engine] = end

    # -- memory ----------------------------------------------------------------------
    def _allocate(self, nbytes, count, dtype):
        self._charge(nbytes)
        return _Block(self, nbytes, np.empty(count, dtype))

    @staticmethod
    def _buffer(a: DeviceArray) -> np.ndarray:
        host = a.mem.host
        n = a.size
        return host if a.offset == 0 and n == host.size else host[a.offset:a.offset + n]

    def exchange_buffer(self, a: DeviceArray) -> np.ndarray:
        """The device memory of a itself, for an MPI exchange in place (as a CUDA-aware
        MPI reads GPU memory): no copy, none counted."""
        return self._buffer(a)

    def fill(self, a: DeviceArray, value) -> None:
        self._buffer(a)[...] = value
        self.launches += 1
        self._run("compute", self.launch_latency + a.nbytes / self.memory_bandwidth, self.current)

    # -- copies ----------------------------------------------------------------------
    def _copy(self, direction: str, nbytes: int, stream: SimStream) -> None:
        self._count(direction, nbytes)
        self._run(direction, self.launch_latency + nbytes / self.pcie_bandwidth, stream)

    def to_device_async(self, a, out=None, stream=None) -> DeviceArray:
        a, out = self._host_source(a, out)
        self._buffer(out)[...] = a.reshape(-1)
        self._copy("h2d", a.nbytes, stream or self.current)
        return out

    def to_host_async(self, a, out=None, stream=None) -> np.ndarray:
        out = self._host_target(a, out)
        out.reshape(-1)[...] = self._buffer(a)
        self._copy("d2h", a.nbytes, stream or self.current)
        return out

    # -- streams, events, kernels ----------------------------------------------------
    def stream(self) -> SimStream:
        return SimStream(self)

    def event(self) -> SimEvent:
        return SimEvent(self)

    def _launch(self, name, fn, args):
        nbytes, call = 0, []
        for a in args:
            if isinstance(a, DeviceArray):
                if a.device is not self:
                    raise ValueError(f"{name}: an operand is on {a.device.name}, not {self.name}")
                nbytes += a.nbytes
                call.append(self._buffer(a))
            elif isinstance(a, np.ndarray):
                raise TypeError(f"{name}: a host NumPy array was passed to a {self.name} "
                                f"kernel; copy it to the device first (to_device)")
            else:
                call.append(a)
        flops = FLOPS[name](*args) if name in FLOPS else nbytes // 4
        result = fn(*call)
        self.launches += 1
        self._run("compute", self.launch_latency + max(flops / self.compute_flops,
                                                       nbytes / self.memory_bandwidth),
                  self.current)
        if result is not None:  # a scalar brought back to the host (the loss)
            self._copy("d2h", 4, self.current)
        return result
