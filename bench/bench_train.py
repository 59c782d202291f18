"""Training and inference throughput: minidl against PyTorch (NCHW and channels_last), side by side.

On the CPU, bench/bench_cpu.py is the complete comparison (it adds 1-thread runs,
SGEMM against the measured FMA peak and the goal verdicts, and reuses this
script's run helpers); this script stays for --device cuda and quick races.

    python3 bench/bench_train.py [--models cifar10_quick:100,resnet20:128] [--threads 2] [--device cuda]
        [--steps 20] [--warmup 5] [--repeats 3] [--torch-python PATH] [--json bench/results/train-DATE.json]

For each model (name:batch_size), `--repeats` rounds of three runs, interleaved
so that slow phases of a shared machine hit all three alike:

    A  python -m minidl bench --model M --batch-size B --steps N --threads T --json
    B  bench/torch_nets.py, NCHW
    C  bench/torch_nets.py, channels_last

each in a fresh process (so peak RSS is that run's own), with --pause seconds
of idle time between runs (worker threads of the previous run stop spinning).
Each run prints one JSON object with train_images_per_s, infer_images_per_s
and peak_rss_mb (minidl's also has per-layer times, kept in the JSON output).
The table shows per model the best and median images/s of each, and the
median over rounds of the per-round ratio minidl / torch, against torch NCHW
and against torch's faster layout (the one with the higher median).

PyTorch runs under --torch-python (default: $TORCH_PYTHON, else this
interpreter if it has torch); minidl under this interpreter, from this
checkout (build it first: python3 setup.py build_ext --inplace).
"""
import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time

from machine import cpu_model, git_commit  # bench/, the script's own directory

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_NETS = os.path.join(HERE, "torch_nets.py")

REQUIRED = ("train_images_per_s", "infer_images_per_s", "peak_rss_mb")
VARIANTS = ("minidl", "torch_nchw", "torch_channels_last")
LABELS = {"minidl": "minidl", "torch_nchw": "torch NCHW", "torch_channels_last": "torch NHWC"}


class RunFailed(Exception):
    pass


def minidl_command(model: str, batch_size: int, steps: int, threads: int, prefix=None,
                   device: str = "cpu") -> list:
    """The command line of one minidl run; `prefix` replaces ``python -m minidl bench``."""
    if prefix is None:
        prefix = [sys.executable, "-m", "minidl", "bench"]
    return list(prefix) + ["--model", model, "--batch-size", str(batch_size), "--steps", str(steps),
                           "--threads", str(threads), "--json"] + _device(device)


def torch_command(python: str, model: str, batch_size: int, steps: int, threads: int,
                  warmup: int, channels_last: bool, device: str = "cpu") -> list:
    cmd = [python, TORCH_NETS, "--model", model, "--batch-size", str(batch_size),
           "--steps", str(steps), "--threads", str(threads), "--warmup", str(warmup), "--json"]
    return cmd + (["--channels-last"] if channels_last else []) + _device(device)


def _device(device: str) -> list:
    return [] if device == "cpu" else ["--device", device]


def parse_models(spec: str) -> list:
    models = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, batch = item.partition(":")
        if not sep or not name or not batch.isdigit() or int(batch) < 1:
            raise argparse.ArgumentTypeError(f"expected NAME:BATCH_SIZE, got {item!r}")
        models.append((name, int(batch)))
    if not models:
        raise argparse.ArgumentTypeError("no models given")
    return models


def default_torch_python():
    if os.environ.get("TORCH_PYTHON"):
        return os.environ["TORCH_PYTHON"]
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", type=parse_models, default="cifar10_quick:100,resnet20:128",
                   help="comma-separated NAME:BATCH_SIZE (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: minidl's CUDA kernels "
                   "against PyTorch with cuDNN (fp32, TF32 off)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per phase and run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before timing (torch runs)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of minidl, torch NCHW, torch NHWC")
    p.add_argument("--pause", type=float, default=1.0, help="idle seconds between runs")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for one run")
    p.add_argument("--torch-python", default=default_torch_python(),
                   help="interpreter with torch (default: $TORCH_PYTHON, else this one if it has torch)")
    p.add_argument("--json", metavar="OUT", help="write runs, summary and machine info here")
    # for testing the driver: replaces `python -m minidl bench` (split like a shell would)
    p.add_argument("--minidl-cmd", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.torch_python is None:
        p.error("no interpreter with torch: pass --torch-python PATH or set TORCH_PYTHON")
    if min(args.threads, args.steps, args.repeats) < 1 or args.warmup < 0:
        p.error("--threads, --steps and --repeats must be >= 1, --warmup >= 0")
    return args


def run_json(cmd: list, label: str, env: dict, timeout: float, required=REQUIRED) -> dict:
    """Run one benchmark process; its stdout must hold one JSON object with the `required`
    numeric fields."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RunFailed(f"{label}: timed out after {timeout:g} s: {shlex.join(cmd)}\n"
                        f"{e.stderr or ''}") from None
    except OSError as e:
        raise RunFailed(f"{label}: cannot run {shlex.join(cmd)}: {e}") from None
    if proc.returncode != 0:
        raise RunFailed(f"{label}: exit status {proc.returncode}: {shlex.join(cmd)}\n"
                        f"--- stderr ---\n{proc.stderr}--- stdout ---\n{proc.stdout}")
    result = None
    text = proc.stdout.strip()
    candidates = [text] + [line for line in reversed(text.splitlines()) if line.startswith("{")]
    for candidate in candidates:
        try:
            result = json.loads(candidate)
            break
        except ValueError:
            continue
    if not isinstance(result, dict):
        raise RunFailed(f"{label}: no JSON object on stdout: {shlex.join(cmd)}\n"
                        f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")
    bad = [k for k in required if not isinstance(result.get(k), (int, float))]
    if bad:
        raise RunFailed(f"{label}: output lacks numeric {', '.join(bad)}: {shlex.join(cmd)}\n"
                        f"--- stdout ---\n{proc.stdout}")
    return result


def summarise(runs: list) -> dict:
    """Best/median per variant and the median per-round ratios minidl / torch."""
    by = {v: [r["result"] for r in runs if r["variant"] == v] for v in VARIANTS}
    out = {}
    for v, results in by.items():
        out[v] = {}
        for metric in ("train_images_per_s", "infer_images_per_s"):
            values = [r[metric] for r in results]
            out[v][metric] = {"best": max(values), "median": statistics.median(values),
                              "all": values}
        rss = [r["peak_rss_mb"] for r in results]
        out[v]["peak_rss_mb"] = {"max": max(rss), "median": statistics.median(rss)}
    ratios = {}
    for metric, short in (("train_images_per_s", "train"), ("infer_images_per_s", "infer")):
        mine = [r[metric] for r in by["minidl"]]
        nchw = [r[metric] for r in by["torch_nchw"]]
        best_layout = max(("torch_nchw", "torch_channels_last"),
                          key=lambda v: out[v][metric]["median"])
        best = [r[metric] for r in by[best_layout]]
        ratios[f"{short}_vs_torch_nchw"] = statistics.median(a / b for a, b in zip(mine, nchw))
        ratios[f"{short}_vs_torch_best_layout"] = statistics.median(a / b for a, b in zip(mine, best))
        ratios[f"{short}_torch_best_layout"] = best_layout
    out["ratios"] = ratios
    return out


def portable(text: str, torch_python: str) -> str:
    """A command as recorded in the results: no paths of the machine it ran on (the
    interpreters by role, whole paths only: a torch_python named without its folder,
    like python3, is looked up on PATH first)."""
    text = text.replace(TORCH_NETS, "bench/torch_nets.py")
    torch_path = shutil.which(torch_python) if torch_python else None
    for path, name in ((sys.executable, "python"), (torch_path, "TORCH_PYTHON")):
        if path:
            text = text.replace(path, name)
    return text.replace(ROOT + os.sep, "")


def print_table(name: str, batch: int, threads: int, repeats: int, s: dict) -> None:
    print(f"\n{name}, batch {batch}, {threads} threads, {repeats} rounds "
          "(images/s: best / median of rounds)")
    print(f"  {'':<12} {'train img/s':>19} {'infer img/s':>19} {'peak RSS MB':>12}")
    for v in VARIANTS:
        t, i = s[v]["train_images_per_s"], s[v]["infer_images_per_s"]
        print(f"  {LABELS[v]:<12} {t['best']:>8.1f} / {t['median']:>8.1f} "
              f"{i['best']:>8.1f} / {i['median']:>8.1f} {s[v]['peak_rss_mb']['max']:>12.0f}")
    r = s["ratios"]
    print(f"  minidl / torch NCHW, median ratio: train {r['train_vs_torch_nchw']:.2f}, "
          f"infer {r['infer_vs_torch_nchw']:.2f}")
    print(f"  minidl / torch best layout: train {r['train_vs_torch_best_layout']:.2f} "
          f"({LABELS[r['train_torch_best_layout']]}), infer {r['infer_vs_torch_best_layout']:.2f} "
          f"({LABELS[r['infer_torch_best_layout']]})")


def load_average() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(args.threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    prefix = shlex.split(args.minidl_cmd) if args.minidl_cmd else None

    info = {
        "benchmark": "train",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "git_commit": git_commit(short=True),
        "cpu": cpu_model(),
        "threads": args.threads,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "pause_s": args.pause,
        "python": platform.python_version(),
        "torch_python": "TORCH_PYTHON",
        "torch_version": None,
        "device": args.device,
        "minidl_command": portable(shlex.join(minidl_command("MODEL", "BATCH", args.steps,
                                                             args.threads, prefix, args.device)),
                                   args.torch_python),
        "loadavg_start": load_average(),
    }
    print(f"{info['cpu']}, {args.threads} threads, commit {info['git_commit']}, "
          f"load {info['loadavg_start']}")
    models = {}
    first = True
    try:
        for name, batch in args.models:
            runs = []
            for rnd in range(args.repeats):
                for variant in VARIANTS:
                    if variant == "minidl":
                        cmd = minidl_command(name, batch, args.steps, args.threads, prefix,
                                             args.device)
                    else:
                        cmd = torch_command(args.torch_python, name, batch, args.steps, args.threads,
                                            args.warmup, variant == "torch_channels_last",
                                            args.device)
                    if not first:
                        time.sleep(args.pause)
                    first = False
                    label = f"{name} round {rnd + 1} {LABELS[variant]}"
                    t0 = time.monotonic()
                    result = run_json(cmd, label, env, args.timeout)
                    print(f"  {label:<40} train {result['train_images_per_s']:9.1f}  "
                          f"infer {result['infer_images_per_s']:9.1f} img/s  "
                          f"({time.monotonic() - t0:.0f} s)", flush=True)
                    if variant != "minidl" and info["torch_version"] is None:
                        info["torch_version"] = result.get("torch_version")
                    runs.append({"round": rnd + 1, "variant": variant,
                                 "command": portable(shlex.join(cmd), args.torch_python),
                                 "result": result})
            models[name] = {"batch_size": batch, "runs": runs, "summary": summarise(runs)}
    except RunFailed as e:
        print(f"bench_train: {e}", file=sys.stderr)
        return 1

    for name, batch in args.models:
        print_table(name, batch, args.threads, args.repeats, models[name]["summary"])
    info["loadavg_end"] = load_average()
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"machine": info, "models": models}, f, indent=2)
            f.write("\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
