"""Where a training step's time goes on the GPU: kernel by kernel, and on the host.

    python3 bench/profile_gpu.py [--model resnet20] [--batch-size 128] [--steps 3]
                                 [--json bench/results/gpu-profile-DATE-COMMIT.json]

For the fused and the unfused plan: after two warm-up steps, --steps training steps
run under Nsight Compute (ncu, from PATH or the CUDA toolkit), which times every
kernel alone (gpu__time_duration, the clocks as the card sets them); the table sums
them per kernel and per step.  Then, without ncu, the same steps are timed by the
wall clock (each ending at the device's synchronisation) and run under cProfile:
the step's wall time against its kernels' time says how much of it the host takes,
and cProfile says where (the functions with the most time of their own).
Needs a GPU, pycuda and minidl built with its CUDA kernels.
"""
import argparse
import cProfile
import csv
import datetime
import io
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from bench_fusion import _setup as fusion_setup  # noqa: E402
from machine import git_commit  # noqa: E402
from minidl.device import get_device  # noqa: E402

WARMUP = 2


def _setup(model, batch, fuse):
    dev = get_device("cuda")
    ex, opt = fusion_setup(model, batch, fuse, dev)
    net = ex.net
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *net.input_shape)).astype(np.float32)
    y = rng.integers(0, net.output_shape[0], batch)

    def step():
        ex.train_step(x, y)
        opt.step()
        dev.synchronize()
    for _ in range(WARMUP):
        step()
    return dev, step


def _inner(a):
    """Under ncu: the profiled steps only (profiling starts off)."""
    dev, step = _setup(a.model, a.batch_size, a.fuse)
    dev.drv.start_profiler()
    for _ in range(a.steps):
        step()
    dev.drv.stop_profiler()


def _ncu():
    found = shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None)
    if found is None:
        raise SystemExit("profile_gpu.py: ncu (Nsight Compute) not found")
    return found


def _kernels(a, fuse):
    """ms per step of each kernel (by name without its parameters), and launches per step."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ncu.csv")
        cmd = [_ncu(), "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum",
               "--csv", "--print-units", "base", "--clock-control", "none", "--log-file", log,
               sys.executable, __file__, "--inner", "--model", a.model, "--batch-size",
               str(a.batch_size), "--steps", str(a.steps), "--fuse" if fuse else "--no-fuse"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [r for r in csv.reader(open(log)) if len(r) > 5]
    head = rows[0]
    name_at, value_at = head.index("Kernel Name"), head.index("Metric Value")
    per = defaultdict(lambda: [0, 0.0])
    for r in rows[1:]:
        name = re.sub(r"\(.*", "", r[name_at]).replace("(anonymous namespace)::", "")
        name = re.sub(r"<unnamed>::|^void ", "", name)
        per[name][0] += 1
        per[name][1] += float(r[value_at].replace(",", "")) / 1e6  # ns -> ms
    kernels = {k: {"launches": n / a.steps, "ms": ms / a.steps}
               for k, (n, ms) in sorted(per.items(), key=lambda kv: -kv[1][1])}
    return kernels


def _host(a, fuse):
    """Wall ms per step, and cProfile's functions with the most time of their own."""
    _, step = _setup(a.model, a.batch_size, fuse)
    times = []
    for _ in range(max(a.steps, 5)):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        step()
    prof.disable()
    st = pstats.Stats(prof, stream=io.StringIO())
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:25]
    return {"wall_ms": float(np.median(times)),
            "profiled_ms": 1e3 * st.total_tt / a.steps,
            "top": [{"function": f"{Path(f).name}:{line}:{fn}", "calls": nc / a.steps,
                     "own_ms": 1e3 * tt / a.steps, "cumulative_ms": 1e3 * ct / a.steps}
                    for (f, line, fn), (_, nc, tt, ct, _) in top]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.inner:
        return _inner(a)
    out = {"date": datetime.date.today().isoformat(), "commit": git_commit(),
           "model": a.model, "batch_size": a.batch_size, "steps": a.steps,
           "device_name": get_device("cuda").gpu_name}
    for fuse in (True, False):
        key = "fused" if fuse else "unfused"
        r = out[key] = {"kernels": _kernels(a, fuse), **_host(a, fuse)}
        r["kernel_ms"] = sum(k["ms"] for k in r["kernels"].values())
        r["launches"] = sum(k["launches"] for k in r["kernels"].values())
        print(f"{a.model} {key}: {r['launches']:.0f} launches, kernels {r['kernel_ms']:.2f} ms, "
              f"step {r['wall_ms']:.2f} ms wall (host and gaps {r['wall_ms'] - r['kernel_ms']:.2f})")
        for k, v in list(r["kernels"].items())[:12]:
            print(f"    {v['ms']:7.3f} ms {v['launches']:5.0f}x  {k}")
        print("  host, most time of their own (ms per step):")
        for t in r["top"][:12]:
            print(f"    {t['own_ms']:7.3f} {t['calls']:7.0f}x  {t['function']}")
    f, u = out["fused"], out["unfused"]
    print(f"kernels unfused / fused: {u['kernel_ms'] / f['kernel_ms']:.2f}x; "
          f"wall: {u['wall_ms'] / f['wall_ms']:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
