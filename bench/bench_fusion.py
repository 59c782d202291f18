"""Fused against unfused Conv+BatchNorm+ReLU training, side by side in one run.

    python3 bench/bench_fusion.py [--models resnet20,resnet56,vgg11_bn] [--batch-size 128]
                                  [--threads 2] [--repeats 15] [--steps 1] [--device cpu]
                                  [--json bench/results/fusion-DATE-COMMIT.json]

For each model: the plan's figures for both plans (`bytes_moved`: the bytes the
kernels of a training step read and write; `activation_bytes`: what forward keeps
for backward; minidl.plan computes both from the shapes), then the training step
time of the fused and the unfused plan on the same random batch, alternating
(fused, unfused, unfused, fused, ...) for --repeats rounds of --steps timed steps
each after one warm-up step; the median step of each, the median of the rounds'
ratios unfused / fused with their range, and per-layer-kind forward and backward
times (from the executor's timings: the median over five more steps each,
alternating too).  Prints a table; --json writes every
figure.  With --device cuda the nets run on the GPU and each step (and each
layer's timing) ends at the device's synchronisation.
"""
import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import minidl  # noqa: E402
from machine import git_commit  # noqa: E402
from minidl import models  # noqa: E402
from minidl.device import get_device  # noqa: E402
from minidl.optim import SGD  # noqa: E402
from minidl.plan import make_plan  # noqa: E402
from minidl.runtime import Executor  # noqa: E402


def _setup(model, batch, fuse, dev):
    net = models.build(model, seed=0).to(dev)
    opt = SGD(net.parameters(), lr=1e-3, momentum=0.9)
    plan = make_plan(net, batch, optimizer_slots=len(opt.slots), device=dev, fuse=fuse)
    return Executor(net, plan, seed=0), opt


def _steps(ex, opt, x, y, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ex.train_step(x, y)
        opt.step()
        ex.device.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def _by_kind(ex, opt, x, y):
    """One step's ms, forward and backward, added up per layer kind."""
    ex.timings = {}
    _steps(ex, opt, x, y, 1)
    kinds = {}
    for s in ex.plan.steps:
        f, b = ex.timings.get(s.name, (0.0, 0.0))
        k = kinds.setdefault(s.kind, [0.0, 0.0])
        k[0] += 1e3 * f
        k[1] += 1e3 * b
    ex.timings = None
    return kinds


def run(model, batch, repeats, steps, dev):
    rng = np.random.default_rng(0)
    exs = {fuse: _setup(model, batch, fuse, dev) for fuse in (True, False)}
    net = exs[True][0].net
    x = rng.standard_normal((batch, *net.input_shape)).astype(np.float32)
    y = rng.integers(0, net.output_shape[0], batch)
    r = {"model": model, "batch_size": batch}
    for fuse, (ex, _) in exs.items():
        key = "fused" if fuse else "unfused"
        r[key] = {"bytes_moved": ex.plan.bytes_moved(),
                  "activation_bytes": ex.plan.memory["kept_activations"],
                  "predicted_peak_bytes": ex.plan.memory["peak"]}
    for fuse, (ex, opt) in exs.items():
        _steps(ex, opt, x, y, 1)
    rounds = {True: [], False: []}
    for i in range(repeats):
        for fuse in ((True, False) if i % 2 == 0 else (False, True)):
            rounds[fuse].append(statistics.median(_steps(*exs[fuse], x, y, steps)))
    layers = {True: [], False: []}
    for i in range(5):
        for fuse in ((True, False) if i % 2 == 0 else (False, True)):
            layers[fuse].append(_by_kind(*exs[fuse], x, y))
    for fuse in exs:
        key = "fused" if fuse else "unfused"
        r[key].update(step_ms=1e3 * statistics.median(rounds[fuse]),
                      rounds_ms=[1e3 * t for t in rounds[fuse]],
                      layers={k: {"forward_ms": statistics.median(s[k][0] for s in layers[fuse]),
                                  "backward_ms": statistics.median(s[k][1] for s in layers[fuse])}
                              for k in layers[fuse][0]})
    ratios = [u / f for u, f in zip(rounds[False], rounds[True])]
    r["speedup"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    r["bytes_moved_reduction"] = 1 - r["fused"]["bytes_moved"] / r["unfused"]["bytes_moved"]
    r["activation_reduction"] = (1 - r["fused"]["activation_bytes"] /
                                 r["unfused"]["activation_bytes"])
    return r


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet20,resnet56,vgg11_bn")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--json")
    a = p.parse_args(argv)
    minidl.set_num_threads(a.threads)
    dev = get_device(a.device)
    mb = 1 / 2**20
    results = []
    print(f"{'model':<10} {'MiB moved f/u':>17} {'less':>6} {'MiB kept f/u':>15} {'less':>6} "
          f"{'step ms f/u':>15} {'unfused/fused [min, max]':>26}")
    for model in a.models.split(","):
        r = run(model, a.batch_size, a.repeats, a.steps, dev)
        results.append(r)
        f, u, s = r["fused"], r["unfused"], r["speedup"]
        print(f"{model:<10} {f['bytes_moved'] * mb:>8.0f}/{u['bytes_moved'] * mb:<8.0f} "
              f"{r['bytes_moved_reduction']:>6.1%} "
              f"{f['activation_bytes'] * mb:>7.1f}/{u['activation_bytes'] * mb:<7.1f} "
              f"{r['activation_reduction']:>6.1%} {f['step_ms']:>7.1f}/{u['step_ms']:<7.1f} "
              f"{s['median']:>10.2f}x [{s['min']:.2f}, {s['max']:.2f}]", flush=True)
        for kind in u["layers"]:
            lf, lu = f["layers"].get(kind, {}), u["layers"][kind]
            print(f"    {kind:<16} forward {lf.get('forward_ms', 0):7.1f} / "
                  f"{lu['forward_ms']:7.1f} ms, backward {lf.get('backward_ms', 0):7.1f} / "
                  f"{lu['backward_ms']:7.1f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "commit": git_commit(),
            "device": dev.name, "device_name": getattr(dev, "gpu_name", None),
            "threads": a.threads, "simd": minidl.get_simd(), "repeats": a.repeats,
            "steps": a.steps, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
