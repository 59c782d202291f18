"""Convolution layers of cifar10_quick (batch 100) and resnet20 (batch 128), one op at a time.

    python3 bench/bench_conv.py [--threads 2] [--reps 5] [--layers nets|off-path] [--json PATH]
    python3 bench/bench_conv.py --against OTHER_TREE [--rounds 5]
    python3 bench/bench_conv.py --torch-python PY [--rounds 5]

Times forward, backward-data and backward-weights of every distinct convolution
shape of the two nets through minidl.ops (best of --reps calls each) and prints
ms and GFLOP/s.  With --against, the same measurement runs alternately in fresh
processes importing this tree's minidl and OTHER_TREE's (A B A B ..., --rounds
each), and the table gives each side's median and the median per-round ratio
other / this (above 1: this tree is faster): the before/after figures of
bench/NOTES.md.  With --torch-python, the other side is PyTorch (torch.conv2d and
torch.nn.grad's conv2d_input and conv2d_weight) run by that interpreter, and the
ratio is PyTorch's time / minidl's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (name, n, c_in, h, w, c_out, k, stride, pad): each distinct shape once
LAYERS = [
    ("quick.conv1", 100, 3, 32, 32, 32, 5, 1, 2),
    ("quick.conv2", 100, 32, 16, 16, 32, 5, 1, 2),
    ("quick.conv3", 100, 32, 8, 8, 64, 5, 1, 2),
    ("r20.conv1", 128, 3, 32, 32, 16, 3, 1, 1),
    ("r20.3x3.16", 128, 16, 32, 32, 16, 3, 1, 1),
    ("r20.3x3.16-32/2", 128, 16, 32, 32, 32, 3, 2, 1),
    ("r20.3x3.32", 128, 32, 16, 16, 32, 3, 1, 1),
    ("r20.1x1.16-32/2", 128, 16, 32, 32, 32, 1, 2, 0),
    ("r20.3x3.32-64/2", 128, 32, 16, 16, 64, 3, 2, 1),
    ("r20.3x3.64", 128, 64, 8, 8, 64, 3, 1, 1),
    ("r20.1x1.32-64/2", 128, 32, 16, 16, 64, 1, 2, 0),
]
# shapes off the CIFAR nets' path: deep layers in batches of 1-8 (few Winograd tiles
# a call), 1x1 kernels on maps of 1x1 and 2x2 (few pixels an image)
OFF_PATH = [
    ("512@4x4 n1", 1, 512, 4, 4, 512, 3, 1, 1),
    ("512@4x4 n8", 8, 512, 4, 4, 512, 3, 1, 1),
    ("256@8x8 n1", 1, 256, 8, 8, 256, 3, 1, 1),
    ("512@7x7 n1", 1, 512, 7, 7, 512, 3, 1, 1),
    ("128@8x8 n1", 1, 128, 8, 8, 128, 3, 1, 1),
    ("1x1 256@1x1 n64", 64, 256, 1, 1, 256, 1, 1, 0),
    ("1x1 512@2x2 n128", 128, 512, 2, 2, 512, 1, 1, 0),
    ("1x1 1024@1x1 n8", 8, 1024, 1, 1, 1000, 1, 1, 0),
]
LAYER_SETS = {"nets": LAYERS, "off-path": OFF_PATH}
# how many times each shape occurs in its net (for the per-net totals)
COUNT = {"r20.3x3.16": 6, "r20.3x3.32": 5, "r20.3x3.64": 5}
OPS = ("forward", "backward_data", "backward_weights")


def best_seconds(fn, reps):
    """The fastest of reps calls, after one untimed."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(threads, reps, layers="nets"):
    import numpy as np
    import minidl
    from minidl import _C
    minidl.set_num_threads(threads)
    rng = np.random.default_rng(0)
    out = {}
    for name, n, ci, h, w, co, k, st, pad in LAYER_SETS[layers]:
        shape = (n, ci, h, w, co, k, k, st, st, pad, pad)
        ho, wo = _C.conv2d_output_size(shape)
        x = rng.standard_normal(n * ci * h * w, dtype=np.float32)
        wt = rng.standard_normal(co * ci * k * k, dtype=np.float32) * 0.1
        dy = rng.standard_normal(n * co * ho * wo, dtype=np.float32)
        y, dx, dw = np.empty_like(dy), np.empty_like(x), np.empty_like(wt)
        ws = np.empty(-(-_C.conv2d_workspace_size(shape) // 4), np.float32)
        calls = {
            "forward": lambda: _C.conv2d_forward(shape, x, wt, None, y, ws),
            "backward_data": lambda: _C.conv2d_backward_data(shape, dy, wt, dx, ws),
            "backward_weights": lambda: _C.conv2d_backward_weights(shape, x, dy, dw, False, ws),
        }
        flop = 2.0 * n * co * ci * k * k * ho * wo
        row = {}
        for op, fn in calls.items():
            best = best_seconds(fn, reps)
            row[op] = {"ms": best * 1e3, "gflops": flop / best / 1e9}
        out[name] = row
    return out


def measure_torch(threads, reps, layers="nets"):
    """measure's table for PyTorch's convolutions on the same shapes."""
    import torch
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, n, ci, h, w, co, k, st, pad in LAYER_SETS[layers]:
        x = torch.randn(n, ci, h, w, generator=g)
        wt = torch.randn(co, ci, k, k, generator=g) * 0.1
        y = torch.conv2d(x, wt, None, st, pad)
        dy = torch.randn(y.shape, generator=g)
        calls = {
            "forward": lambda: torch.conv2d(x, wt, None, st, pad),
            "backward_data": lambda: torch.nn.grad.conv2d_input(x.shape, wt, dy, st, pad),
            "backward_weights": lambda: torch.nn.grad.conv2d_weight(x, wt.shape, dy, st, pad),
        }
        with torch.no_grad():
            out[name] = {op: {"ms": best_seconds(fn, reps) * 1e3} for op, fn in calls.items()}
    return out


def child(tree, threads, reps, layers, python=sys.executable, fn="measure"):
    env = dict(os.environ, PYTHONPATH=tree)
    code = (f"import sys, json; sys.path.insert(0, {HERE!r}); import bench_conv; "
            f"print(json.dumps(bench_conv.{fn}({threads}, {reps}, {layers!r})))")
    r = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                       check=True, cwd="/")
    return json.loads(r.stdout)


def table(this, other=None):
    head = f"{'layer':18s}" + "".join(f"{op:>24s}" for op in OPS)
    print(head)
    for name in this:
        cells = []
        for op in OPS:
            a = this[name][op]
            if other is None:
                cells.append(f"{a['ms']:8.2f} ms {a['gflops']:6.1f} GF/s")
            else:
                cells.append(f"{other[name][op]['ms']:7.2f} -> {a['ms']:6.2f} ({a['ratio']:.2f}x)")
        print(f"{name:18s}" + "".join(f"{c:>24s}" for c in cells))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--against", metavar="TREE", help="another source tree to compare with")
    p.add_argument("--torch-python", metavar="PY",
                   help="a Python with torch: PyTorch is the other side")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layers", choices=sorted(LAYER_SETS), default="nets",
                   help="the nets' shapes, or shapes off their path")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args()
    if not a.against and not a.torch_python:
        sys.path.append(ROOT)  # after PYTHONPATH: an installed or chosen minidl wins
        res = measure(a.threads, a.reps, a.layers)
        table(res)
        report = {"threads": a.threads, "layers": res}
    else:
        runs = {"this": [], "other": []}
        for _ in range(a.rounds):
            runs["other"].append(
                child(ROOT, a.threads, a.reps, a.layers, a.torch_python, "measure_torch")
                if a.torch_python else
                child(os.path.abspath(a.against), a.threads, a.reps, a.layers))
            runs["this"].append(child(ROOT, a.threads, a.reps, a.layers))
        med = {side: {name: {op: {"ms": statistics.median(r[name][op]["ms"] for r in rs)}
                             for op in OPS} for name in rs[0]} for side, rs in runs.items()}
        for name in med["this"]:
            for op in OPS:
                med["this"][name][op]["ratio"] = statistics.median(
                    o[name][op]["ms"] / t[name][op]["ms"]
                    for o, t in zip(runs["other"], runs["this"]))
        table(med["this"], med["other"])
        report = {"threads": a.threads, "rounds": a.rounds,
                  "against": a.against or f"torch ({a.torch_python})", "median": med, "runs": runs}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
