"""minidl against PyTorch on the CPU, in one run: training, inference, threading, memory, SGEMM.

    python3 bench/bench_cpu.py [--repeats 5] [--threads 2] [--torch-python PY]
        [--json bench/results/cpu-DATE.json] [--quick]
    python3 bench/bench_cpu.py --markdown bench/results/cpu-DATE.json   # the README's tables

Per net (--models, default cifar10_quick:100,resnet20:128), --repeats rounds of
fresh processes, in the order

    D  minidl bench, 1 thread              (for the threading ratio T / 1 thread)
    A  minidl bench, --threads T           (python -m minidl bench ... --json)
    B  bench/torch_nets.py, NCHW, T threads
    C  bench/torch_nets.py, channels_last, T threads

D A B C D A B C ..., so that each ratio's two runs are close in time (the machine's
speed drifts over minutes), with --settle idle seconds before every run so that one
process's spinning worker threads do not slow the next.  Each run reports
training and inference images/s (median step time after warm-up) and its own
peak RSS.  minidl's SIMD level (MINIDL_SIMD) and the thread counts
(OMP_NUM_THREADS, --threads) are explicit in every child's command line; a
minidl run that reports another SIMD level than --simd is an error.

After the nets: the machine's FMA peak (bench/fma_peak.c, compiled into a
temporary directory, one copy per thread at once; skipped without a C compiler)
and the SGEMM shapes (square 512-2048 and the GEMMs of the nets' convolutions:
forward, data and weight gradient of each layer as bench_gemm.conv_gemms lays them
out, op(A) or op(B) transposed as there),
minidl and NumPy alternating with bench_gemm.py's code, in this process, and
PyTorch's torch.mm (MKL) after them in a child under --torch-python
(bench/torch_gemm.py; left out without one), in rounds over all the shapes (so
that one shape's samples are spread over the whole stage, not taken in one slow
minute), each round on fresh operands at random places in their pages (a thin
product's speed on two threads depends on where C lies against B,
bench/NOTES.md; the median is then over layouts, each round's recorded).  The
peak is measured before and after the SGEMM shapes and the higher figure is
used.  The JSON is written after each stage ("complete": false until the end).

Ratios are medians of per-round ratios: minidl / PyTorch's faster layout in
that round (NCHW or channels_last, decided per round), T threads / 1 thread
for minidl's training, NumPy's (and PyTorch's) time / minidl's time per SGEMM
sample pair.  PyTorch's SGEMM is a reference only: no goal is checked against it.
The goals (GOALS) are checked on the medians and reported as pass/fail, in the
output and in the JSON, which also holds every raw sample and machine info.

PyTorch runs under --torch-python (default: $TORCH_PYTHON, else this
interpreter if it has torch); minidl under this interpreter, from this checkout
(build it first: make ext).  --quick: 2 rounds of 3 steps and fewer SGEMM
samples, to check that everything runs (its figures mean little).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

from bench_gemm import conv_gemms  # bench/
from bench_train import (ROOT, TORCH_NETS, RunFailed, default_torch_python,  # bench/
                         parse_models, portable, run_json)
from machine import cpu_model, git_commit

HERE = os.path.dirname(os.path.abspath(__file__))

VARIANTS = ("minidl", "torch_nchw", "torch_channels_last", "minidl_1thread")
# the order of a round's runs: minidl's two thread counts next to each other (their
# ratio is the threading goal) and minidl next to PyTorch NCHW
RUN_ORDER = ("minidl_1thread", "minidl", "torch_nchw", "torch_channels_last")
TORCH_VARIANTS = ("torch_nchw", "torch_channels_last")
LABELS = {"minidl": "minidl", "torch_nchw": "torch NCHW",
          "torch_channels_last": "torch channels_last", "minidl_1thread": "minidl 1 thread"}
METRICS = ("train_images_per_s", "infer_images_per_s")
SHORT = {"train_images_per_s": "train", "infer_images_per_s": "infer"}

GEMM_SQUARE = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048)]
# the GEMMs of cifar10_quick's and resnet20's convolutions, (label, m, n, k, trans_a,
# trans_b): c_out x (images h_out w_out) x (c_in kh kw) forward, its data and weight
# gradients, for a chunk of images as src_c/conv.c forms them
GEMM_CONV = conv_gemms()

GOALS = {
    "train_vs_torch": 1.5,      # minidl / PyTorch's faster layout, training images/s
    "infer_vs_torch": 1.25,     # the same for inference
    "gemm_square_pct_peak": 85.0,  # % of the measured FMA peak on --threads threads
    "gemm_conv_pct_peak": 70.0,
    "gemm_vs_numpy": 1.0,       # NumPy's time / minidl's time, every shape
    "threads_speedup": 1.8,     # minidl training, --threads threads / 1 thread
    "rss_vs_torch": 1.0,        # minidl's peak RSS / PyTorch's (lower layout), at most
}


# ---- pure functions: statistics, ratios, verdicts, tables ----------------------------

def stats(samples) -> dict:
    """median, min and max of the samples, and the samples themselves."""
    samples = list(samples)
    if not samples:
        return {"median": None, "min": None, "max": None, "samples": []}
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "samples": samples}


def by_round(runs) -> dict:
    """{round: {variant: result}} over the runs that succeeded."""
    rounds = {}
    for r in runs:
        if r.get("result") is not None:
            rounds.setdefault(r["round"], {})[r["variant"]] = r["result"]
    return rounds


def round_ratios(runs, metric, num="minidl", den=TORCH_VARIANTS):
    """Per round (with all the variants): (num's metric / the best of den's, the best den)."""
    out = []
    for rnd, res in sorted(by_round(runs).items()):
        if num not in res or not all(d in res for d in den):
            continue
        best = max(den, key=lambda d: res[d][metric])
        out.append((res[num][metric] / res[best][metric], best))
    return out


def summarise_net(runs) -> dict:
    """Statistics per variant and metric, and the median per-round ratios."""
    rounds = by_round(runs)
    out = {"variants": {}, "ratios": {}}
    for v in VARIANTS:
        results = [res[v] for _, res in sorted(rounds.items()) if v in res]
        if results:
            out["variants"][v] = {m: stats(r[m] for r in results)
                                  for m in METRICS + ("peak_rss_mb",)}
    for m in METRICS:
        pairs = round_ratios(runs, m)
        out["ratios"][f"{SHORT[m]}_vs_torch_best"] = stats(p[0] for p in pairs)
        out["ratios"][f"{SHORT[m]}_torch_best_per_round"] = [p[1] for p in pairs]
        out["ratios"][f"{SHORT[m]}_vs_torch_nchw"] = stats(
            p[0] for p in round_ratios(runs, m, den=("torch_nchw",)))
    out["ratios"]["threads_speedup"] = stats(
        p[0] for p in round_ratios(runs, "train_images_per_s", den=("minidl_1thread",)))
    return out


def summarise_gemm(rows, peak_gflops) -> list:
    """Per shape: GFLOP/s statistics of each library (PyTorch's where it ran), % of peak
    of minidl's and PyTorch's medians, and the median per-round speed ratios minidl /
    NumPy and minidl / PyTorch."""
    def pct(g):
        return 100 * g["median"] / peak_gflops if peak_gflops and g["median"] is not None \
            else None

    out = []
    for row in rows:
        flop = 2.0 * row["m"] * row["n"] * row["k"]
        g_mdl = stats(flop / t / 1e9 for t in row["minidl_s"])
        g_np = stats(flop / t / 1e9 for t in row["numpy_s"])
        g_torch = stats(flop / t / 1e9 for t in row.get("torch_s", []))
        out.append({**{key: row[key] for key in ("m", "n", "k", "kind", "label", "trans_a",
                                                  "trans_b") if key in row},
                    "minidl_gflops": g_mdl, "numpy_gflops": g_np, "torch_gflops": g_torch,
                    "minidl_pct_peak": pct(g_mdl), "torch_pct_peak": pct(g_torch),
                    "vs_numpy": stats(tn / tm for tm, tn in zip(row["minidl_s"], row["numpy_s"])),
                    "vs_torch": stats(tt / tm for tm, tt in zip(row["minidl_s"],
                                                                 row.get("torch_s", [])))})
    return out


def gemm_name(row, sep="x") -> str:
    """'16x27x48128 NT (resnet20 conv1 bwd-w)', or '512x512x512 (square)' (sep " x " for
    the tables; rows of older results have neither transposes nor label)."""
    t = "".join("T" if row.get(f"trans_{x}") else "N" for x in "ab")
    dims = sep.join(str(row[d]) for d in "mnk") + ("" if t == "NN" else f" {t}")
    return f"{dims} ({row.get('label') or row['kind']})"


def _verdict(goal, subject, value, target, higher_is_better=True, unit="x"):
    passed = None if value is None else (value >= target if higher_is_better else value <= target)
    return {"goal": goal, "subject": subject, "value": value, "target": target,
            "comparison": ">=" if higher_is_better else "<=", "unit": unit, "pass": passed}


def verdicts(nets: dict, gemm: list, threads: int, goals: dict = GOALS) -> list:
    """One entry per goal and subject: value, target and pass (None: not measured)."""
    out = []
    for name, net in nets.items():
        s, subject = net["summary"], f"{name}, batch {net['batch_size']}"
        for m in METRICS:
            short = SHORT[m]
            out.append(_verdict(f"{short}_vs_torch", subject,
                                s["ratios"][f"{short}_vs_torch_best"]["median"],
                                goals[f"{short}_vs_torch"]))
        out.append(_verdict("threads_speedup", subject, s["ratios"]["threads_speedup"]["median"],
                            goals["threads_speedup"]))
        rss_mdl = s["variants"].get("minidl", {}).get("peak_rss_mb", {}).get("median")
        rss_torch = [s["variants"][v]["peak_rss_mb"]["median"] for v in TORCH_VARIANTS
                     if v in s["variants"]]
        ratio = rss_mdl / min(rss_torch) if rss_mdl is not None and rss_torch else None
        out.append(_verdict("rss_vs_torch", subject, ratio, goals["rss_vs_torch"],
                            higher_is_better=False))
    for row in gemm:
        subject = f"sgemm {gemm_name(row)}, {threads} threads"
        goal = f"gemm_{row['kind']}_pct_peak"
        out.append(_verdict(goal, subject, row["minidl_pct_peak"], goals[goal], unit="%"))
        out.append(_verdict("gemm_vs_numpy", subject, row["vs_numpy"]["median"],
                            goals["gemm_vs_numpy"]))
    return out


GOAL_TEXT = {
    "train_vs_torch": "training images/s, minidl / PyTorch's faster layout",
    "infer_vs_torch": "inference images/s, minidl / PyTorch's faster layout",
    "threads_speedup": "minidl training, {threads} threads / 1 thread",
    "rss_vs_torch": "peak RSS, minidl / PyTorch (lower layout)",
    "gemm_square_pct_peak": "SGEMM, % of the measured FMA peak",
    "gemm_conv_pct_peak": "SGEMM, % of the measured FMA peak",
    "gemm_vs_numpy": "SGEMM, minidl / NumPy speed",
}


def _num(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


def _spread(s, digits=0):
    """'median [min, max]'"""
    if s is None or s.get("median") is None:
        return "-"
    return f"{_num(s['median'], digits)} [{_num(s['min'], digits)}, {_num(s['max'], digits)}]"


def _pass(p):
    return {True: "pass", False: "**fail**", None: "n/a"}[p]


def _value(v):
    if v["value"] is None:
        return "-"
    return f"{v['value']:.0f}%" if v["unit"] == "%" else f"{v['value']:.2f}x"


def render_markdown(data: dict) -> str:
    """The README's tables from a results JSON."""
    m, threads = data["machine"], data["config"]["threads"]
    lines = [f"{m['cpu']}, {threads} threads, minidl {m.get('minidl_simd', '?')}, PyTorch "
             f"{m.get('torch_version') or '?'}, commit {str(m.get('git_commit', '?'))[:7]}, "
             f"{m['date'][:10]}, {data['config']['repeats']} rounds; load average before / after "
             f"{' '.join(map(str, m.get('loadavg_start', [])))} / "
             f"{' '.join(map(str, m.get('loadavg_end', [])))}.  Images/s and GFLOP/s: median "
             "[min, max] over rounds; ratios: median [min, max] of per-round ratios."
             + ("  INCOMPLETE RUN." if data.get("complete") is False else ""), ""]
    lines += ["| net, batch | | minidl | PyTorch NCHW | PyTorch channels_last | "
              "minidl / PyTorch best layout |",
              "|---|---|---|---|---|---|"]
    for name, net in data["nets"].items():
        s = net["summary"]
        v = s["variants"]
        for metric in METRICS:
            r = s["ratios"][f"{SHORT[metric]}_vs_torch_best"]
            cells = [_spread(v.get(x, {}).get(metric)) for x in ("minidl",) + TORCH_VARIANTS]
            lines.append(f"| {name}, {net['batch_size']} | {SHORT[metric]} images/s | "
                         + " | ".join(cells) + f" | {_spread(r, 2)} |")
        cells = [_num(v.get(x, {}).get("peak_rss_mb", {}).get("median"))
                 for x in ("minidl",) + TORCH_VARIANTS]
        lines.append(f"| {name}, {net['batch_size']} | peak RSS MB | " + " | ".join(cells) + " | |")
        lines.append(f"| {name}, {net['batch_size']} | minidl training, 1 thread | "
                     f"{_spread(v.get('minidl_1thread', {}).get('train_images_per_s'))} | | | "
                     f"{threads} / 1 thread: {_spread(s['ratios']['threads_speedup'], 2)} |")
    peak = data.get("fma_peak", {}).get("peak_gflops")
    lines += ["", f"| SGEMM, {threads} threads, m x n x k | minidl GFLOP/s | % of peak "
              f"({_num(peak)} GFLOP/s measured) | NumPy GFLOP/s | minidl / NumPy | "
              "PyTorch GFLOP/s | PyTorch % of peak | minidl / PyTorch |",
              "|---|---|---|---|---|---|---|---|"]
    for row in data["gemm"]["summary"]:
        pcts = ["-" if row.get(key) is None else f"{row[key]:.0f}%"
                for key in ("minidl_pct_peak", "torch_pct_peak")]
        lines.append(f"| {gemm_name(row, ' x ')} | "
                     f"{_spread(row['minidl_gflops'])} | {pcts[0]} | "
                     f"{_spread(row['numpy_gflops'])} | {_spread(row['vs_numpy'], 2)} | "
                     f"{_spread(row.get('torch_gflops'))} | {pcts[1]} | "
                     f"{_spread(row.get('vs_torch'), 2)} |")
    lines += ["", "| goal | subject | measured | target | verdict |", "|---|---|---|---|---|"]
    for v in data["verdicts"]:
        target = f"{v['target']:.0f}%" if v["unit"] == "%" else f"{v['target']:.2f}x"
        lines.append(f"| {GOAL_TEXT[v['goal']].format(threads=threads)} | {v['subject']} | "
                     f"{_value(v)} | {v['comparison']} {target} | {_pass(v['pass'])} |")
    passed = sum(v["pass"] is True for v in data["verdicts"])
    lines += ["", f"{passed} of {len(data['verdicts'])} goals met."]
    return "\n".join(lines)


def format_text(data: dict) -> str:
    """The terminal report: the markdown tables, which also read well as text."""
    return render_markdown(data).replace("**", "")


# ---- measuring -----------------------------------------------------------------------

def best_simd() -> str:
    """minidl's best SIMD level on this CPU, asked of a child process (this one must not
    import NumPy before the thread counts are set)."""
    out = subprocess.run([sys.executable, "-c", "import minidl; print(minidl.cpu_simd())"],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    return out.stdout.strip()


def minidl_command(model, batch, steps, warmup, threads, simd, python=sys.executable) -> list:
    return ["env", f"MINIDL_SIMD={simd}", f"OMP_NUM_THREADS={threads}", python, "-m", "minidl",
            "bench", "--model", model, "--batch-size", str(batch), "--steps", str(steps),
            "--warmup", str(warmup), "--threads", str(threads), "--json"]


def torch_command(python, model, batch, steps, warmup, threads, channels_last) -> list:
    return (["env", f"OMP_NUM_THREADS={threads}", f"MKL_NUM_THREADS={threads}", python,
             TORCH_NETS, "--model", model, "--batch-size", str(batch), "--steps", str(steps),
             "--warmup", str(warmup), "--threads", str(threads), "--json"]
            + (["--channels-last"] if channels_last else []))


def load_average() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def measure_fma_peak(threads: int) -> dict:
    """bench/fma_peak.c, `threads` copies at once (bench_gemm.measured_peak); the peak is
    the sum of each copy's best of AVX2 and AVX-512; None without a compiler."""
    import bench_gemm
    measured = bench_gemm.measured_peak(threads)
    if measured is None:
        return {"peak_gflops": None, "error": "fma_peak.c could not be built or run"}
    return {"copies": measured[1], "peak_gflops": measured[0]}


class TorchGemm:
    """bench/torch_gemm.py under the torch interpreter, kept for the whole SGEMM stage and
    asked for one sample at a time."""

    def __init__(self, python, threads):
        cmd = ["env", f"OMP_NUM_THREADS={threads}", f"MKL_NUM_THREADS={threads}", python,
               os.path.join(HERE, "torch_gemm.py"), "--threads", str(threads)]
        try:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
        except OSError as e:
            raise RunFailed(f"sgemm: cannot run {shlex.join(cmd)}: {e}") from None
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        try:
            out = json.loads(line)
        except ValueError:
            raise RunFailed(f"sgemm: bench/torch_gemm.py ended (exit status "
                            f"{self.proc.poll()}) or wrote {line[:200]!r}") from None
        if "failed" in out:
            raise RunFailed(f"sgemm: bench/torch_gemm.py: {out['failed']}")
        return out

    def seconds(self, row, min_time, settle, seed) -> float:
        request = {key: row[key] for key in ("m", "n", "k", "trans_a", "trans_b")}
        request.update(min_time=min_time, settle=settle, seed=seed)
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise RunFailed(f"sgemm: bench/torch_gemm.py: {e}") from None
        out = self._read()
        if not out["error"] < 1e-4:
            raise RunFailed(f"sgemm: PyTorch's {gemm_name(row)} is {out['error']:.3g} from "
                            "the float64 product")
        return out["seconds"]

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


def run_gemm(shapes, threads, rounds, min_time, settle, simd, torch_python=None,
             progress=print) -> list:
    """SGEMM samples (seconds per call) of minidl, NumPy and, with torch_python,
    PyTorch, alternating: the first two in this process, PyTorch in a child."""
    import bench_gemm
    os.environ["MINIDL_SIMD"] = simd
    np, minidl, _C = bench_gemm.load_libraries(threads)
    if minidl.get_simd() != simd:
        raise RunFailed(f"sgemm: minidl runs {minidl.get_simd()}, not {simd}")
    info = {"numpy": np.__version__, "numpy_blas": bench_gemm.numpy_blas(np),
            "minidl_version": minidl.__version__, "minidl_simd": minidl.get_simd()}
    torch = None
    if torch_python:
        try:
            torch = TorchGemm(torch_python, threads)
            info.update(torch_version=torch.info["torch_version"], torch_blas=torch.info["blas"])
        except RunFailed as e:
            progress(f"  {e}: no PyTorch column")
    rng = np.random.default_rng(0)
    rows = [{**shape, "minidl_s": [], "numpy_s": [], "torch_s": [], "layout": []}
            for shape in shapes]
    try:
        for rnd in range(rounds):
            for i, row in enumerate(rows):
                case = bench_gemm.make_case(np, _C, row["m"], row["n"], row["k"], rng,
                                            row["trans_a"], row["trans_b"])
                row["minidl_s"].append(bench_gemm.timed(case.run_minidl, min_time, settle))
                row["numpy_s"].append(bench_gemm.timed(case.run_numpy, min_time, settle))
                row["layout"].append(case.layout)
                del case  # its operands go before the next shape's
                if torch is not None:
                    try:
                        row["torch_s"].append(torch.seconds(row, min_time, settle,
                                                            seed=rnd * len(rows) + i))
                    except RunFailed as e:
                        progress(f"  {e}: no more PyTorch samples")
                        torch.close()
                        torch = None
            progress(f"  sgemm round {rnd + 1} of {rounds} done")
    finally:
        if torch is not None:
            torch.close()
    for row in rows:
        flop = 2.0 * row["m"] * row["n"] * row["k"]
        medians = "  ".join(f"{name} {flop / statistics.median(row[key]) / 1e9:7.1f}"
                            for name, key in (("minidl", "minidl_s"), ("NumPy", "numpy_s"),
                                              ("PyTorch", "torch_s")) if row[key])
        progress(f"  sgemm {gemm_name(row):<44} {medians} GFLOP/s (medians)")
    return rows, info


def save(data, args, complete: bool) -> None:
    """Verdicts on what is measured so far, and the JSON file."""
    data["complete"] = complete
    data["verdicts"] = verdicts(data["nets"], data["gemm"]["summary"], args.threads)
    data["machine"]["loadavg_end"] = load_average()
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def run_nets(args, models, env, info, progress=print) -> dict:
    nets = {}
    for name, batch in models:
        runs = []
        for rnd in range(1, args.repeats + 1):
            for variant in RUN_ORDER:
                if variant.startswith("minidl"):
                    t = 1 if variant == "minidl_1thread" else args.threads
                    cmd = minidl_command(name, batch, args.steps, args.warmup, t, args.simd)
                else:
                    cmd = torch_command(args.torch_python, name, batch, args.steps, args.warmup,
                                        args.threads, variant == "torch_channels_last")
                time.sleep(args.settle)
                label = f"{name} round {rnd} {LABELS[variant]}"
                record = {"round": rnd, "variant": variant, "loadavg": load_average(),
                          "command": portable(shlex.join(cmd), args.torch_python)}
                t0 = time.monotonic()
                try:
                    result = run_json(cmd, label, env, args.timeout)
                    if variant.startswith("minidl") and result.get("simd") != args.simd:
                        raise RunFailed(f"{label}: minidl ran {result.get('simd')}, "
                                        f"not {args.simd}")
                    record["result"] = result
                    progress(f"  {label:<42} train {result['train_images_per_s']:8.1f}  infer "
                             f"{result['infer_images_per_s']:8.1f} img/s  RSS "
                             f"{result['peak_rss_mb']:5.0f} MB  ({time.monotonic() - t0:.0f} s)")
                    if variant.startswith("torch") and not info.get("torch_version"):
                        info["torch_version"] = result.get("torch_version")
                except RunFailed as e:
                    record["result"], record["error"] = None, str(e)[-2000:]
                    progress(f"  {label}: FAILED\n{e}")
                runs.append(record)
        nets[name] = {"batch_size": batch, "runs": runs, "summary": summarise_net(runs)}
    return nets


def git_dirty() -> bool:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return bool(out.strip())
    except (OSError, subprocess.CalledProcessError):
        return False


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--markdown", metavar="JSON", help="print the README tables of a results file")
    p.add_argument("--models", type=parse_models, default="cifar10_quick:100,resnet20:128",
                   help="comma-separated NAME:BATCH_SIZE (default: %(default)s)")
    p.add_argument("--repeats", type=int, help="rounds (default 5; --quick: 2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--simd", choices=["avx512", "avx2", "scalar"],
                   help="minidl's SIMD level (default: the best this CPU has)")
    p.add_argument("--steps", type=int, help="timed steps per phase and run (default 6; --quick: 3)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 2; --quick: 1)")
    p.add_argument("--settle", type=float, default=2.0, help="idle seconds before each run")
    p.add_argument("--gemm-rounds", type=int, help="SGEMM samples per library and shape "
                   "(default: --repeats)")
    p.add_argument("--gemm-min-time", type=float, help="seconds per SGEMM sample (default 0.1; "
                   "--quick: 0.02)")
    p.add_argument("--gemm-settle", type=float, default=0.3,
                   help="idle seconds before each SGEMM sample")
    p.add_argument("--no-nets", action="store_true", help="only the FMA peak and SGEMM")
    p.add_argument("--no-gemm", action="store_true", help="only the nets")
    p.add_argument("--timeout", type=float, default=1200, help="seconds allowed for one run")
    p.add_argument("--torch-python", default=default_torch_python(),
                   help="interpreter with torch (default: $TORCH_PYTHON, else this one if it has it)")
    p.add_argument("--json", metavar="OUT", help="write the samples, summary, verdicts and "
                   "machine info here (default bench/results/cpu-DATE.json)")
    p.add_argument("--quick", action="store_true", help="a short run that checks the plumbing")
    args = p.parse_args(argv)
    if args.markdown:
        return args
    q = args.quick
    args.repeats = args.repeats or (2 if q else 5)
    args.steps = args.steps or (3 if q else 6)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    args.gemm_rounds = args.gemm_rounds or args.repeats
    args.gemm_min_time = args.gemm_min_time or (0.02 if q else 0.1)
    if args.json is None:
        args.json = os.path.join(HERE, "results", f"cpu-{datetime.date.today().isoformat()}"
                                 + ("-quick" if q else "") + ".json")
    if not args.no_nets and args.torch_python is None:
        p.error("no interpreter with torch: pass --torch-python PATH or set TORCH_PYTHON")
    if min(args.threads, args.steps, args.repeats, args.gemm_rounds) < 1 or args.warmup < 0:
        p.error("--threads, --steps, --repeats and --gemm-rounds must be >= 1, --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(render_markdown(json.load(f)))
        return 0
    args.simd = args.simd or best_simd()
    # NumPy (imported for SGEMM, in this process) takes its thread count from these
    import bench_gemm
    bench_gemm.set_threads(args.threads)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    info = {
        "cpu": cpu_model(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "git_commit": git_commit(short=False), "git_dirty": git_dirty(),
        "python": platform.python_version(), "torch_python": "TORCH_PYTHON",
        "torch_version": None, "minidl_simd": args.simd, "loadavg_start": load_average(),
    }
    config = {k: getattr(args, k) for k in ("repeats", "threads", "simd", "steps", "warmup",
                                              "settle", "gemm_rounds", "gemm_min_time",
                                              "gemm_settle", "quick")}
    config["models"] = [list(m) for m in args.models]
    config["goals"] = GOALS
    print(f"{info['cpu']}, {args.threads} threads, {args.simd}, commit {info['git_commit'][:7]}"
          f"{' (dirty)' if info['git_dirty'] else ''}, load {info['loadavg_start']}", flush=True)
    progress = lambda s: print(s, flush=True)  # noqa: E731
    data = {"benchmark": "cpu", "machine": info, "config": config}

    # the nets first: a child's peak RSS starts from its parent's at fork (Linux carries
    # ru_maxrss over fork and exec), and after SGEMM this process holds ~150 MB
    data["nets"] = {}
    data["fma_peak"] = {"peak_gflops": None}
    data["gemm"] = {"rows": [], "summary": []}
    if not args.no_nets:
        for model in args.models:
            data["nets"].update(run_nets(args, [model], env, info, progress))
            save(data, args, complete=args.no_gemm and model == args.models[-1])
    fma = {"peak_gflops": None}
    gemm_rows = []
    if not args.no_gemm:
        time.sleep(args.settle)
        before = measure_fma_peak(args.threads)
        progress(f"  FMA peak, {args.threads} copies: {before}")
        shapes = ([{"kind": "square", "label": None, "m": m, "n": n, "k": k, "trans_a": False,
                    "trans_b": False} for m, n, k in GEMM_SQUARE]
                  + [{"kind": "conv", "label": label, "m": m, "n": n, "k": k, "trans_a": ta,
                      "trans_b": tb} for label, m, n, k, ta, tb in GEMM_CONV])
        try:
            gemm_rows, gemm_info = run_gemm(shapes, args.threads, args.gemm_rounds,
                                            args.gemm_min_time, args.gemm_settle, args.simd,
                                            args.torch_python, progress)
            info.update(gemm_info)
        except RunFailed as e:
            progress(f"  sgemm: FAILED: {e}")
        time.sleep(args.settle)
        after = measure_fma_peak(args.threads)
        progress(f"  FMA peak, {args.threads} copies: {after}")
        peaks = [x["peak_gflops"] for x in (before, after) if x.get("peak_gflops")]
        fma = {"before": before, "after": after, "peak_gflops": max(peaks) if peaks else None,
               "threads": args.threads,
               "build": "cc -O3 -funroll-loops bench/fma_peak.c"}
    data["fma_peak"] = fma
    data["gemm"] = {"rows": gemm_rows, "summary": summarise_gemm(gemm_rows, fma["peak_gflops"])}
    save(data, args, complete=True)

    print()
    print(format_text(data))
    print(f"\nwrote {args.json}")
    failed_runs = sum(1 for n in data["nets"].values() for r in n["runs"] if r.get("result") is None)
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
