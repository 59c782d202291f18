"""`minidl bench`: training-step and inference throughput of a model on random data,
with per-layer forward/backward times (like `caffe time`) and peak memory.

The JSON fields train_images_per_s, infer_images_per_s, peak_rss_mb and layers are
stable; later features add fields.  `fused` says whether the training plan has the
pass `fusion` (`--fuse/--no-fuse`); `bytes_moved` is the bytes the kernels of a
training step read and write and `activation_bytes` the bytes kept from forward for
backward, both from the plan (minidl.plan, from the shapes).  On a device other than the cpu: `device`,
`device_peak_bytes` (the device's own peak over the run), `copies_per_step` (count
and bytes, h2d and d2h, of one training step) and `launches_per_step`; on sim also
`modelled_train_step_ms` and `modelled_train_images_per_s` from its cost model.
Times are host wall-clock times (on sim: the CPU running the kernels).  Run as
several MPI ranks (``minidl bench --nproc N`` or ``mpiexec -n N minidl bench``),
batch_size is the global batch, the rates are those of all ranks together, and the
report adds ``ranks``, ``comm_wait_ms_per_step`` (time a step waits for the gradient
exchange after backward) and ``bytes_exchanged_per_step`` (gradient bytes each rank
sends into the allreduce).
"""
from __future__ import annotations

import resource
import time
from typing import Dict, Optional

import numpy as np

import minidl
from minidl import distributed, models
from minidl.device import get_device
from minidl.optim import SGD
from minidl.plan import make_plan
from minidl.runtime import Executor


def _median_time(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run(model: str, batch_size: int, steps: int = 20, threads: Optional[int] = None,
        warmup: int = 3, seed: int = 0, device="cpu",
        comm: Optional[distributed.Comm] = None, exchange: str = "host",
        fuse: bool = True) -> Dict:
    comm = comm or distributed.Comm()
    if threads is not None:
        minidl.set_num_threads(threads)
    if steps < 1 or warmup < 0 or batch_size < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0 and batch_size >= 1, got {steps}, "
                         f"{warmup}, {batch_size}")
    if batch_size % comm.size:
        raise ValueError(f"the global batch size {batch_size} must be divisible by the "
                         f"{comm.size} ranks")
    local = batch_size // comm.size
    dev = get_device(device)
    net = models.build(model, seed=seed).to(dev)
    opt = SGD(net.parameters(), lr=1e-3, momentum=0.9)
    plan = make_plan(net, local, optimizer_slots=len(opt.slots), device=dev, fuse=fuse)
    ex = Executor(net, plan, seed=seed)
    reducer = distributed.GradientReducer(net, comm, exchange=exchange)
    if comm.size > 1:
        ex.backward_hook = reducer.ready
    rng = np.random.default_rng([seed, comm.rank])
    x = rng.standard_normal((local, *net.input_shape), dtype=np.float32)
    y = rng.integers(0, net.output_shape[0], local)

    def train_step():
        ex.train_step(x, y, grad_scale=1 / comm.size)
        reducer.finish()
        opt.step()
        dev.synchronize()  # a step is over when the device is done with it

    for _ in range(warmup):
        train_step()
    comm.barrier()
    comm.wait_s, comm.bytes_reduced = 0.0, 0
    train_s = _median_time(train_step, steps)
    wait_s, sent = comm.wait_s, comm.bytes_reduced
    for _ in range(warmup):
        ex.predict(x)
    comm.barrier()
    infer_s = _median_time(lambda: ex.predict(x), steps)
    ex.timings = {}  # per-layer times from separate steps, so timing does not slow the above
    layer_steps = max(1, min(steps, 5))
    for _ in range(layer_steps):
        train_step()
    layers = [{"name": s.name, "kind": s.kind,
               "forward_ms": 1e3 * ex.timings[s.name][0] / layer_steps,
               "backward_ms": 1e3 * ex.timings.get(s.name, [0, 0])[1] / layer_steps}
              for s in plan.steps]
    flops = 3 * plan.flops() * comm.size
    ex.timings = None
    extra = {} if dev.kind == "cpu" else _device_step(dev, train_step, local)
    # the slowest rank sets the pace of synchronous training; inference runs independently
    train_s = max(comm.allgather(train_s))
    r = {
        "device": dev.name, **extra,
        "model": model, "batch_size": batch_size, "threads": minidl.get_num_threads(),
        "steps": steps, "simd": minidl.get_simd(), "version": minidl.__version__,
        "train_images_per_s": batch_size / train_s,
        "infer_images_per_s": sum(comm.allgather(local / infer_s)),
        "train_step_ms": 1e3 * train_s, "infer_step_ms": 1e3 * infer_s,
        "train_gflops_per_s": flops / train_s / 1e9,
        "peak_rss_mb": max(comm.allgather(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)),
        "predicted_peak_mb": plan.memory["peak"] / 2**20,
        "fused": fuse, "bytes_moved": plan.bytes_moved() * comm.size,
        "activation_bytes": plan.memory["kept_activations"] * comm.size,
        "layers": layers,
    }
    if comm.size > 1:
        r.update(ranks=comm.size, local_batch_size=local, grad_exchange=exchange,
                 comm_wait_ms_per_step=1e3 * wait_s / steps,
                 bytes_exchanged_per_step=sent // steps)
    return r


def _device_step(dev, train_step, batch_size: int) -> Dict:
    """Counters of one more training step on a device, and the peak over the run."""
    dev.reset_counters()
    start = getattr(dev, "clock", None)
    train_step()
    dev.synchronize()
    r = {"device_peak_bytes": dev.peak,
         "copies_per_step": {k: dict(v) for k, v in dev.copies.items()},
         "launches_per_step": dev.launches}
    if start is not None:
        step_s = dev.clock - start
        r.update(modelled_train_step_ms=1e3 * step_s,
                 modelled_train_images_per_s=batch_size / step_s)
    if hasattr(dev, "gpu_name"):
        r["device_name"] = dev.gpu_name
    return r


def format_report(r: Dict) -> str:
    ranks = f", {r['ranks']} ranks" if "ranks" in r else ""
    threads = f"{r['threads']} thread{'s' if r['threads'] != 1 else ''}"
    lines = [f"{r['model']}, batch {r['batch_size']}{ranks}, {threads} "
             f"({r['simd']}), device {r['device']}, {'fused' if r['fused'] else 'unfused'}:",
             f"  train {r['train_images_per_s']:.0f} images/s ({r['train_step_ms']:.1f} ms/step, "
             f"{r['train_gflops_per_s']:.1f} GFLOP/s), infer {r['infer_images_per_s']:.0f} "
             f"images/s, peak RSS {r['peak_rss_mb']:.0f} MiB",
             f"  per step {r['bytes_moved'] / 2**20:.0f} MiB moved, "
             f"{r['activation_bytes'] / 2**20:.1f} MiB kept for backward, the plan's predicted "
             f"peak {r['predicted_peak_mb']:.1f} MiB",
             *([f"  gradient exchange: {r['bytes_exchanged_per_step'] / 1e6:.2f} MB per rank "
                f"per step, {r['comm_wait_ms_per_step']:.2f} ms waited per step"]
               if "ranks" in r else []),
             f"  {'layer':<24} {'kind':<16} {'forward ms':>10} {'backward ms':>11}"]
    if "device_peak_bytes" in r:
        c = r["copies_per_step"]
        lines.insert(2, f"  device peak {r['device_peak_bytes'] / 2**20:.1f} MiB; per step "
                        f"{c['h2d']['count']} h2d copies ({c['h2d']['bytes']} bytes), "
                        f"{c['d2h']['count']} d2h ({c['d2h']['bytes']} bytes), "
                        f"{r['launches_per_step']} kernels"
                     + (f"; modelled step {r['modelled_train_step_ms']:.3f} ms "
                        f"({r['modelled_train_images_per_s']:.0f} images/s)"
                        if "modelled_train_step_ms" in r else ""))
    for layer in r["layers"]:
        lines.append(f"  {layer['name']:<24} {layer['kind']:<16} {layer['forward_ms']:>10.2f} "
                     f"{layer['backward_ms']:>11.2f}")
    return "\n".join(lines)
