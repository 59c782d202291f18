"""mpiexec -n RANKS python3 dev/fuzz_mpi.py [FIRST_SEED [SECONDS]]: data-parallel training
of tests/test_random_nets.py's random nets (dropout off: its masks are drawn per rank)
against one process, from FIRST_SEED (default 1000) on for SECONDS (default 600).

Each rank trains its share of a global batch (shares of unequal size where the batch
does not divide) for 2 SGD steps, its gradients summed over the ranks by
`GradientReducer`, and checks them against the gradients that it computes alone:
- BatchNorm synchronised over the ranks: the gradients of the whole batch in one process;
  the running statistics too;
- BatchNorm per rank: the sum of each share's gradients, weighted by its size.
Plain and fused plans, on the cpu (exchange "host") and on sim ("host" and "device").
Every rank must also end with the same parameters, bit for bit.  A case that fails
while its reference has a ReLU input or a max pool gap within MARGIN of its kink at
either step (in float64) is counted apart: float32 rounding may take the other side
there.  Rank 0 prints
each failing seed and case.  A fault that stops one rank alone can leave the others
waiting in a collective: run it under `timeout`."""
import hashlib
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package built in place, the tests
from minidl import distributed, nn  # noqa: E402
from minidl.device import asnumpy  # noqa: E402
from minidl.optim import SGD  # noqa: E402
from minidl.plan import make_plan  # noqa: E402
from minidl.runtime import Executor  # noqa: E402
from test_random_nets import random_net, reference_gradients  # noqa: E402

CASES = [(sync, fuse, device, exchange) for sync in (True, False) for fuse in (False, True)
         for device, exchange in (("cpu", "host"), ("sim", "host"), ("sim", "device"))]
STEPS = 2
# relative L2 per tensor, over a floor of FLOOR times the largest tensor's norm and, for a
# bias, the norm of its sums of |dy|: where the exact gradient is (nearly) zero (a bias
# ahead of a BatchNorm) it holds rounding alone, of the size of the terms it sums, and the
# ranks' sums are taken in another order than one process's
TOL, FLOOR = 1e-4, 3e-2
# of tests/test_random_nets.py's _kink_margin (relative to activations above 1), as its
# KINK: the second step compares parameters already apart by rounding, and a
# synchronised BatchNorm (never fused) against the fused one-process reference (a ReLU
# input 3.2e-6 from 0 flipped there)
MARGIN = 1e-5


def _net(seed, comm=None, device="cpu"):
    net = random_net(seed).initialize(seed)
    for _, n in net.layers():
        if isinstance(n.layer, nn.Dropout):
            n.layer.p = 0.0
        if isinstance(n.layer, nn.BatchNorm2d):
            n.layer.sync = comm
    return net.to(device)


def _grads(net):
    return {k: np.zeros(p.data.shape, np.float32) if p.grad is None else asnumpy(p.grad).copy()
            for k, p in net.parameters().items()}  # no gradient where nothing reads a branch


def _reference(seed, x, y, shares, sync, fuse):
    """(gradients of each step with their biases' sums of |dy| (float64), running
    statistics at the end, the nearest kink) in one process."""
    net = _net(seed)
    opt = SGD(net.parameters(), lr=0.05, momentum=0.9)
    batches = [np.arange(len(y))] if sync else shares
    executors = {len(b): Executor(net, make_plan(net, len(b), fuse=fuse)) for b in batches}
    steps, margin = [], np.inf
    for _ in range(STEPS):
        total, terms = None, {}
        for b in batches:
            _, _, m, t = reference_gradients(net, x[b], y[b])
            margin = min(margin, m)
            terms = {k: terms.get(k, 0) + len(b) / len(y) * v for k, v in t.items()}
            executors[len(b)].train_step(x[b], y[b], grad_scale=len(b) / len(y))
            g = _grads(net)
            total = g if total is None else {k: total[k] + g[k] for k in g}
        for k, p in net.parameters().items():
            p.grad = total[k]
        steps.append((total, terms))
        opt.step()
    return steps, {k: b.copy() for k, b in net.buffers().items()}, margin


def _off(got, want, terms=None):
    """{name: relative error} of the tensors in `got` against those in `want` (and the
    sizes of their terms, `terms`)."""
    floor = FLOOR * max((np.linalg.norm(v) for v in want.values()), default=0.0)
    return {k: float(np.linalg.norm(got[k] - v) / max(np.linalg.norm(v), floor, 1e-30,
                                                       np.linalg.norm((terms or {}).get(k, 0))))
            for k, v in want.items()}


def check(seed, comm):
    """(the failures, as strings, of the cases of one seed; the cases that failed near
    a kink)."""
    r = np.random.default_rng([seed, 7])
    shape = random_net(seed).input_shape
    total = comm.size * (2 + seed % 3) + seed % comm.size
    x = r.standard_normal((total, *shape)).astype(np.float32)
    y = r.integers(0, 10, total)
    shares = np.array_split(np.arange(total), comm.size)
    mine = shares[comm.rank]
    refs = {(sync, fuse): _reference(seed, x, y, shares, sync, fuse)
            for sync in (True, False) for fuse in (False, True)}
    failures, skipped = [], 0
    for sync, fuse, device, exchange in CASES:
        case = f"sync_bn={sync} fuse={fuse} {device}/{exchange}"
        ref_steps, ref_buffers, margin = refs[sync, fuse]
        bad = []
        net = _net(seed, comm if sync else None, device)
        opt = SGD(net.parameters(), lr=0.05, momentum=0.9)
        ex = Executor(net, make_plan(net, len(mine), device=device, fuse=fuse))
        reducer = distributed.GradientReducer(net, comm, bucket_bytes=int(r.choice([1, 4096])),
                                              exchange=exchange)
        ex.backward_hook = reducer.ready
        for step in range(STEPS):
            ex.train_step(x[mine], y[mine], grad_scale=comm.grad_scale(len(mine), total))
            reducer.finish()
            for k, e in _off(_grads(net), *ref_steps[step]).items():
                if not e <= TOL:
                    bad.append(f"{case}: step {step} {k} gradient off by {e:.2e}")
            opt.step()
        if sync:
            buffers = {k: asnumpy(b) for k, b in net.buffers().items()}
            for k, e in _off(buffers, ref_buffers).items():
                if not e <= TOL:
                    bad.append(f"{case}: {k} off by {e:.2e}")
        digest = hashlib.sha256(b"".join(asnumpy(p.data).tobytes()
                                         for p in net.parameters().values())).hexdigest()
        if len(set(comm.allgather(digest))) != 1:
            failures.append(f"{case}: the ranks' parameters differ")
        if bad and margin < MARGIN:
            skipped += 1
        else:
            failures += bad
    return failures, skipped


def main(first: int = 1000, seconds: float = 600) -> int:
    comm = distributed.init()
    end = time.time() + seconds
    seed, failed, skipped = first, 0, 0
    while True:
        if comm.allreduce(np.array([time.time() >= end], np.float64))[0]:
            break  # every rank stops at the same seed
        try:
            failures, n = check(seed, comm)
            skipped += n
        except Exception:
            failures = [traceback.format_exc(limit=3)]
        failures = [f for part in comm.allgather(failures) for f in part]
        if failures:
            failed += 1
            if comm.rank == 0:
                print(f"seed {seed}:", *sorted(set(failures))[:8], sep="\n  ", flush=True)
        seed += 1
    if comm.rank == 0:
        print(f"{seed - first} nets from seed {first} on {comm.size} ranks, {failed} failed, "
              f"{skipped} cases off near a kink")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*(f(a) for f, a in zip((int, float), sys.argv[1:]))))
