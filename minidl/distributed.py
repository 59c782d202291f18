"""Data-parallel training over MPI (mpi4py).

One program runs as one process or as N ranks started by ``mpiexec -n N`` (or
``minidl train --nproc N``), on one host or many.  With one process every
function here is a no-op, so the training loop never branches on it:

- ``init()`` returns a ``Comm``: the MPI world when the process was started by an
  MPI launcher with more than one rank, else a single-process stand-in.  mpi4py is
  imported only in the first case (``pip install mpi4py mpich``).
- ``Comm.broadcast(arrays)`` copies rank 0's arrays to every rank (initial
  parameters and buffers).
- ``GradientReducer`` sums the gradients across ranks in buckets: a bucket's
  non-blocking allreduce starts as soon as backward has produced all of its
  gradients, so the exchange overlaps the rest of backward; ``finish()`` waits.
- ``Comm.allreduce`` sums small arrays (metrics, synchronised BatchNorm statistics).
- ``Comm.check_same(what, value)``: a clear error when ranks disagree (model, data,
  configuration) before training starts.

Gradients are exchanged through host memory by default, which works with every
MPI library, or in place in device memory (``exchange="device"``) where the MPI
library can read it.  Each rank scales its loss gradient by ``local_batch /
global_batch`` (``Comm.grad_scale``; the local batches of the last global batch of
an epoch may differ in size), so the sum over the ranks is exactly the gradient of
the mean loss over the global batch.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from minidl.device import asnumpy, copy_into, zeros_like

# variables that MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm) set in every rank
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
ABORT_GRACE_S = 1.0  # seconds between printing a rank's error and aborting the job


def launched_by_mpi() -> bool:
    """Whether this process is one of several ranks started by an MPI launcher."""
    for var in _LAUNCHER_SIZE_VARS:
        try:
            if int(os.environ.get(var, "1")) > 1:
                return True
        except ValueError:
            pass
    return False


class Comm:
    """One process: rank 0 of 1.  Every collective returns its input."""

    rank, size, local_rank, local_size = 0, 1, 0, 1

    def __init__(self):
        self.wait_s = 0.0          # time spent waiting on gradient exchange
        self.bytes_reduced = 0     # gradient bytes this rank contributed to allreduces

    def broadcast(self, arrays: Sequence[np.ndarray]) -> None:
        pass

    def allreduce(self, a: np.ndarray) -> np.ndarray:
        """The element-wise sum of `a` over the ranks (a new array)."""
        return np.array(a, copy=True)

    def iallreduce(self, a: np.ndarray):
        """Starts an in-place sum of the contiguous array `a` over the ranks;
        returns a request for `wait`/`test` (None with one process)."""
        return None

    def test(self, requests) -> None:
        """Lets pending non-blocking collectives progress (MPI progresses them only
        inside MPI calls)."""

    def wait(self, requests) -> None:
        pass

    def allgather(self, value) -> list:
        return [value]

    def barrier(self) -> None:
        pass

    def abort(self, code: int = 1) -> None:
        sys.exit(code)

    def check_same(self, what: str, value) -> None:
        """Raises ValueError naming the first rank whose `value` differs from rank 0's."""
        values = self.allgather(value)
        for r, v in enumerate(values):
            if v != values[0]:
                first = values[0]
                if isinstance(v, dict) and isinstance(first, dict):  # only what differs
                    keys = [k for k in {**first, **v} if first.get(k) != v.get(k)]
                    first, v = ({k: d.get(k) for k in keys} for d in (first, v))
                raise ValueError(f"ranks disagree on {what}: rank 0 has {first!r}, "
                                 f"rank {r} has {v!r}")

    def grad_scale(self, local: int, total: int) -> float:
        """The factor on a rank's mean-loss gradient that makes the sum over the ranks
        the gradient of the mean loss over the global batch of `total` samples."""
        return local / total


class MPIComm(Comm):
    """The MPI world communicator through mpi4py."""

    def __init__(self):
        super().__init__()
        try:
            from mpi4py import MPI
        except ImportError:
            raise RuntimeError("this process was started by an MPI launcher but mpi4py is "
                               "missing: pip install mpi4py mpich") from None
        self.MPI = MPI
        self.world = MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        node = self.world.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()

    def broadcast(self, arrays):
        for a in arrays:
            self.world.Bcast(a, root=0)

    def allreduce(self, a):
        a = np.ascontiguousarray(a)
        out = np.empty_like(a)
        self.world.Allreduce(a, out, op=self.MPI.SUM)
        return out

    def iallreduce(self, a):
        return self.world.Iallreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM)

    def test(self, requests):
        if requests:
            self.MPI.Request.Testall(requests)

    def wait(self, requests):
        if requests:
            self.MPI.Request.Waitall(requests)

    def allgather(self, value):
        return self.world.allgather(value)

    def barrier(self):
        self.world.Barrier()

    def abort(self, code=1):
        sys.stdout.flush()
        sys.stderr.flush()
        # MPI_Abort kills every process at once; a moment first lets the launcher
        # forward what the ranks have just printed (their error messages).
        time.sleep(ABORT_GRACE_S)
        self.world.Abort(code)


_comm: Optional[Comm] = None


def init() -> Comm:
    """The communicator of this process (created once)."""
    global _comm
    if _comm is None:
        _comm = MPIComm() if launched_by_mpi() else Comm()
    return _comm


def broadcast_buffers(net, comm: Comm) -> None:
    """Rank 0's buffers (BatchNorm running statistics) to every rank, wherever they
    live: per-rank statistics drift apart, and the checkpoint holds rank 0's."""
    if comm.size == 1:
        return
    for b in net.buffers().values():
        host = np.ascontiguousarray(asnumpy(b))
        comm.broadcast([host])
        copy_into(b, host)


def run_or_abort(comm: Comm, fn, *args, **kwargs):
    """Runs fn; if it raises on any rank of a multi-rank job, prints the error with
    the rank's number and aborts the whole job (every rank stops at once, non-zero
    exit) instead of leaving the other ranks waiting in a collective."""
    if comm.size == 1:
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except BaseException as e:  # noqa: B902 -- any failure must stop every rank
        if isinstance(e, SystemExit) and not e.code:
            raise
        print(f"minidl: rank {comm.rank} of {comm.size} failed: {type(e).__name__}: {e}; "
              f"stopping all ranks", file=sys.stderr, flush=True)
        comm.abort(1)


EXCHANGES = ("host", "device")


def local_device(spec: str, comm: Comm) -> str:
    """The device a rank uses: "cuda" without an index becomes this rank's local GPU,
    cuda:(local_rank mod GPUs on the host); anything else is kept."""
    if spec != "cuda" or comm.size == 1:
        return spec
    try:
        from minidl import _cuda
        count = _cuda.device_count()
    except (ImportError, RuntimeError):
        return spec  # the device layer reports what is missing
    return f"cuda:{comm.local_rank % max(count, 1)}"


def cuda_aware(comm: Comm) -> bool:
    """Whether the MPI library reads and writes GPU memory itself."""
    query = getattr(getattr(comm, "MPI", None), "Query_cuda_support", None)
    return bool(query and query())


class GradientReducer:
    """Sums the gradients of `net`'s parameters over the ranks of `comm` (the executor
    has scaled each rank's loss gradient by its share of the global batch, so the sum
    is the gradient of the global batch's mean loss).

    exchange="host" (the default, works with every MPI library): parameters are
    grouped, in the order backward produces them (the reverse of the plan), into
    buckets of about `bucket_bytes` with a flat host buffer each (page-locked for a
    GPU).  The executor calls ``ready(step)`` after each step's backward; a bucket
    whose gradients are all there is copied into its buffer and its non-blocking
    allreduce starts.  ``finish()`` starts what is left, waits for every bucket and
    copies the sums back into each parameter's ``.grad``, wherever it lives.

    exchange="device": each gradient is reduced in place in device memory as soon as
    its step's backward has run, one allreduce per tensor, with no host copies: on a
    GPU this needs a CUDA-aware MPI; on `sim` MPI reads the simulated device memory.

    With one process it does nothing."""

    def __init__(self, net, comm: Comm, bucket_bytes: int = 1 << 18, exchange: str = "host"):
        if exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {', '.join(EXCHANGES)}, got {exchange!r}")
        self.comm, self.exchange = comm, exchange
        self.buckets: List[dict] = []
        self._bucket_of: Dict[str, List[int]] = {}
        if comm.size == 1:
            return
        self.device = net.device
        if exchange == "device":
            if self.device.kind == "cpu":
                raise ValueError("exchange 'device' needs a device other than the cpu "
                                 "(on the cpu, 'host' already reduces in place)")
            if self.device.kind == "cuda" and not cuda_aware(comm):
                raise ValueError("exchange 'device' on a GPU needs a CUDA-aware MPI library; "
                                 "this one is not: use exchange 'host'")
        layers = reversed(list(net.layers()))
        current: Optional[dict] = None
        for name, node in layers:
            params = list(node.layer.params.values())
            if not params:
                continue
            if exchange == "device" or current is None or current["bytes"] >= bucket_bytes:
                current = {"params": [], "steps": set(), "bytes": 0}
                self.buckets.append(current)
            current["params"] += params
            current["steps"].add(name)
            current["bytes"] += sum(p.data.nbytes for p in params)
            self._bucket_of.setdefault(name, []).append(len(self.buckets) - 1)
        if exchange == "host":
            for b in self.buckets:
                b["buffer"] = self.device.pinned_empty((b["bytes"] // 4,)) \
                    if self.device.kind != "cpu" else np.empty(b["bytes"] // 4, np.float32)
        self._reset()

    def _reset(self):
        self._pending = [set(b["steps"]) for b in self.buckets]
        self._requests: List = []
        self._started = [False] * len(self.buckets)

    def ready(self, step: str) -> None:
        for i in self._bucket_of.get(step, ()):
            self._pending[i].discard(step)
            if not self._pending[i]:
                self._start(i)
        self.comm.test(self._requests)

    def _grads(self, b):
        """(parameter, its gradient, offset in the bucket) of bucket b; a parameter that
        received no gradient this step gets zeros where it lives."""
        offset = 0
        for p in b["params"]:
            if p.grad is None:
                p.grad = zeros_like(p.data)
            yield p, p.grad, offset
            offset += p.data.size

    def _start(self, i: int) -> None:
        b = self.buckets[i]
        self._started[i] = True
        self.comm.bytes_reduced += b["bytes"]
        if self.exchange == "device":
            for _, g, _ in self._grads(b):
                self._requests.append(self.comm.iallreduce(self.device.exchange_buffer(g)))
            return
        buf = b["buffer"]
        for _, g, o in self._grads(b):
            view = buf[o:o + g.size]
            if isinstance(g, np.ndarray):
                view[...] = g.reshape(-1)
            else:
                g.device.to_host(g, out=view.reshape(g.shape))
        self._requests.append(self.comm.iallreduce(buf))

    def finish(self) -> None:
        if self.comm.size == 1:
            return
        for i, started in enumerate(self._started):
            if not started:
                self._start(i)
        t0 = time.perf_counter()
        self.comm.wait(self._requests)
        self.comm.wait_s += time.perf_counter() - t0
        if self.exchange == "host":
            for b in self.buckets:
                for p, g, o in self._grads(b):
                    copy_into(g, b["buffer"][o:o + g.size].reshape(g.shape))
        self._reset()

    @property
    def gradient_bytes(self) -> int:
        return sum(b["bytes"] for b in self.buckets)
