"""Data-parallel scaling: 2 MPI ranks x 1 thread against 1 rank x 1 thread, side by side,
and a model of larger jobs built from the measured figures.

    python3 bench/bench_mpi.py [--model cifar10_quick] [--batch-size 100] [--ranks 2]
        [--steps 20] [--repeats 5] [--json bench/results/mpi-DATE.json]

Each round runs, in fresh processes and in this order (A B C A B C ...):

    A  minidl bench --threads 1 --batch-size B                    1 rank
    B  minidl bench --threads 1 --batch-size R*B --nproc R        R ranks x B (weak scaling)
    C  minidl bench --threads 1 --batch-size B --nproc R          R ranks x B/R (strong scaling)
    D  R copies of A at once, without MPI                          the machine's own ceiling

Scaling is the median over rounds of the per-round ratio of images/s (all ranks)
to the 1-rank images/s, and the ratio of the best runs (the quiet machine); the rank runs also report the time a step waits for the
gradient exchange and the bytes each rank sends into the allreduce.

The model: a step on N ranks takes compute + max(0, allreduce - overlap), where the
ring allreduce of G gradient bytes costs 2 (N - 1) / N * G / bandwidth + 2 (N - 1) *
latency, and overlap is the backward time left after the first bucket of gradients
is ready (from the 1-rank per-layer times and minidl's 256 KiB buckets).  It is
evaluated twice: with the measured CPU step, and with the step time that the sim
device's cost model gives for a GPU (`minidl bench --device sim`), the overlap
window scaled in proportion.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from machine import cpu_model, git_commit  # bench/, the script's own directory

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUCKET = 1 << 18
NETWORKS = {"10 Gb/s Ethernet": 10e9 / 8, "25 Gb/s Ethernet": 25e9 / 8,
            "100 Gb/s InfiniBand": 100e9 / 8}
LATENCY = {"10 Gb/s Ethernet": 20e-6, "25 Gb/s Ethernet": 10e-6, "100 Gb/s InfiniBand": 2e-6}
SCALES = (8, 64, 512)


def run(args, ranks, batch, extra=(), copies=1):
    """One `minidl bench` (as `ranks` MPI ranks), or `copies` independent ones at once
    (their images/s added up)."""
    cmd = [sys.executable, "-m", "minidl", "bench", "--model", args.model, "--batch-size",
           str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", "1", "--json", *extra] + (["--nproc", str(ranks)] if ranks > 1 else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(copies)]
    reports = []
    for p in procs:
        out = p.communicate()[0]
        if p.returncode:
            raise subprocess.CalledProcessError(p.returncode, cmd)
        reports.append(json.loads(out.strip().splitlines()[-1]))
    time.sleep(args.pause)
    if copies > 1:
        return {"train_images_per_s": sum(r["train_images_per_s"] for r in reports),
                "copies": reports}
    return reports[0]


def overlap_window(layers, param_bytes):
    """Backward seconds still to run when the first gradient bucket is complete."""
    backward = [(l["backward_ms"] / 1e3, param_bytes.get(l["name"], 0))
                for l in reversed(layers)]
    total = sum(t for t, _ in backward)
    done = filled = 0.0
    for t, b in backward:
        done += t
        filled += b
        if filled >= BUCKET:
            break
    return total - done


def model_table(compute, batch, grad_bytes, window, scenario):
    rows = []
    for n in SCALES:
        for net, bw in NETWORKS.items():
            comm = 2 * (n - 1) / n * grad_bytes / bw + 2 * (n - 1) * LATENCY[net]
            exposed = max(0.0, comm - window)
            step = compute + exposed
            rows.append({"scenario": scenario, "ranks": n, "network": net,
                         "allreduce_ms": 1e3 * comm,
                         "exposed_ms": 1e3 * exposed, "step_ms": 1e3 * step,
                         "efficiency": compute / step,
                         "images_per_s": n * batch / step})
    return rows


def crossover(grad_bytes, window):
    """Per network, the smallest rank count whose allreduce outlasts the overlap window
    (None: not below a million ranks)."""
    out = {}
    for net, bw in NETWORKS.items():
        n = 2
        while n < 1 << 20 and 2 * (n - 1) / n * grad_bytes / bw + 2 * (n - 1) * LATENCY[net] \
                <= window:
            n *= 2
        lo = n // 2  # the answer lies in (lo, n]: bisect
        while n - lo > 1:
            mid = (lo + n) // 2
            cost = 2 * (mid - 1) / mid * grad_bytes / bw + 2 * (mid - 1) * LATENCY[net]
            lo, n = (mid, n) if cost <= window else (lo, mid)
        out[net] = n if n < 1 << 20 else None
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cifar10_quick")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--pause", type=float, default=1.0)
    p.add_argument("--json")
    args = p.parse_args()
    r, b = args.ranks, args.batch_size
    rounds = []
    for i in range(args.repeats):
        rounds.append({"one": run(args, 1, b), "weak": run(args, r, r * b),
                       "strong": run(args, r, b), "ceiling": run(args, 1, b, copies=r)})
        x = {k: v["train_images_per_s"] for k, v in rounds[-1].items()}
        print(f"round {i + 1}: 1 rank {x['one']:.0f} images/s; {r} ranks x {b}: "
              f"{x['weak'] / x['one']:.2f}x; {r} ranks x {b // r}: {x['strong'] / x['one']:.2f}x; "
              f"{r} processes without MPI: {x['ceiling'] / x['one']:.2f}x", flush=True)

    def med(kind, key):
        return statistics.median(x[kind][key] for x in rounds)

    summary = {}
    for kind in ("weak", "strong", "ceiling"):
        ratios = [x[kind]["train_images_per_s"] / x["one"]["train_images_per_s"]
                  for x in rounds]
        best = max(x[kind]["train_images_per_s"] for x in rounds) / \
            max(x["one"]["train_images_per_s"] for x in rounds)
        summary[kind] = {
            "scaling_median": statistics.median(ratios), "scaling_best_of": best,
            "scaling_min": min(ratios),
            "scaling_max": max(ratios), "images_per_s_median": med(kind, "train_images_per_s")}
        if kind != "ceiling":
            summary[kind].update(
                comm_wait_ms_per_step_median=med(kind, "comm_wait_ms_per_step"),
                bytes_exchanged_per_step=rounds[0][kind]["bytes_exchanged_per_step"],
                train_step_ms_median=med(kind, "train_step_ms"))
    summary["one"] = {"images_per_s_median": med("one", "train_images_per_s"),
                      "train_step_ms_median": med("one", "train_step_ms")}
    best_one = min((x["one"] for x in rounds), key=lambda o: o["train_step_ms"])
    sys.path.insert(0, ROOT)
    from minidl import models
    net = models.build(args.model, seed=0)
    param_bytes = {k: sum(p.data.nbytes for p in n.layer.params.values())
                   for k, n in net.layers()}
    grad_bytes = sum(param_bytes.values())
    window = overlap_window(best_one["layers"], param_bytes)
    cpu_s = best_one["train_step_ms"] / 1e3
    gpu = run(argparse.Namespace(**{**vars(args), "steps": 1, "warmup": 0, "pause": 0}), 1, b,
              ["--device", "sim"])
    gpu_s = gpu["modelled_train_step_ms"] / 1e3
    scenarios = {"cpu (measured)": (cpu_s, window),
                 "gpu (sim cost model)": (gpu_s, window * gpu_s / cpu_s)}
    table = [row for name, (t, w) in scenarios.items()
             for row in model_table(t, b, grad_bytes, w, name)]
    hidden_until = {name: crossover(grad_bytes, w) for name, (_, w) in scenarios.items()}

    print(f"\n{args.model}, 1 thread per rank, {args.repeats} rounds (median [min, max]):")
    print(f"  1 rank x {b}: {summary['one']['images_per_s_median']:.0f} images/s")
    for kind, local in (("weak", b), ("strong", b // r)):
        s = summary[kind]
        print(f"  {r} ranks x {local}: {s['images_per_s_median']:.0f} images/s, scaling "
              f"{s['scaling_median']:.2f}x [{s['scaling_min']:.2f}, {s['scaling_max']:.2f}], "
              f"best of each {s['scaling_best_of']:.2f}x, "
              f"waits {s['comm_wait_ms_per_step_median']:.2f} ms/step for the exchange of "
              f"{s['bytes_exchanged_per_step'] / 1e6:.2f} MB per rank")
    s = summary["ceiling"]
    print(f"  {r} independent processes x {b}, no MPI: {s['images_per_s_median']:.0f} images/s, "
          f"{s['scaling_median']:.2f}x [{s['scaling_min']:.2f}, {s['scaling_max']:.2f}], best of "
          f"each {s['scaling_best_of']:.2f}x (what the machine allows)")
    print(f"\nmodel: {grad_bytes / 1e6:.2f} MB of gradients; compute {1e3 * cpu_s:.1f} ms/step "
          f"on the cpu (best 1-rank step, overlap window {1e3 * window:.1f} ms), "
          f"{1e3 * gpu_s:.3f} ms/step modelled for a GPU")
    print(f"  {'scenario':<21} {'ranks':>5} {'network':<20} {'allreduce ms':>12} "
          f"{'exposed ms':>10} {'step ms':>8} {'efficiency':>10} {'images/s':>10}")
    for row in table:
        print(f"  {row['scenario']:<21} {row['ranks']:>5} {row['network']:<20} "
              f"{row['allreduce_ms']:>12.2f} {row['exposed_ms']:>10.2f} {row['step_ms']:>8.2f} "
              f"{row['efficiency']:>10.2f} {row['images_per_s']:>10.0f}")
    for name, nets in hidden_until.items():
        for net, n in nets.items():
            print(f"  {name}, {net}: the overlap hides the exchange up to "
                  f"{n - 1 if n else 'over a million'} ranks "
                  f"(latency {LATENCY[net] * 1e6:.0f} us per ring hop)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "commit": git_commit(),
                       "cpu": cpu_model(), "model": args.model, "batch_size": b, "ranks": r,
                       "command": " ".join(["python3", "bench/bench_mpi.py", *sys.argv[1:]]),
                       "summary": summary, "scale_model": {
                           "gradient_bytes": grad_bytes, "overlap_window_ms": 1e3 * window,
                           "step_ms": {k: 1e3 * t for k, (t, _) in scenarios.items()},
                           "latency_s": LATENCY, "rows": table,
                           "first_exposed_ranks": hidden_until},
                       "rounds": rounds}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
