"""SGEMM throughput: minidl's kernel against NumPy's matmul (its BLAS), side by side.

    python3 bench/bench_gemm.py [--threads 2] [--rounds 9] [--json bench/results/gemm-DATE.json]

Both run with the same thread count (the BLAS thread variables are set before
NumPy is imported).  Each round times minidl then NumPy on the same operands
(A B A B ...), each for at least --min-time seconds; the table shows the best
round of each (the machine at its quietest) and the median over rounds of the
per-round ratio minidl / NumPy.  Before each timed sample the bench sleeps
--settle seconds: OpenBLAS's worker threads busy-wait for about 0.1 s after a
call (and OpenMP's for a shorter while), and on 2 cores spinning workers of
one library halve the speed of the other.  minidl is called through minidl._C with a
preallocated workspace, as the convolution layers call it.  Peak: 2 x 8-wide
FMA per cycle per core, --ghz (default 2.6) x 32 FLOP x threads.

The functions (set_threads, load_libraries, make_case, time_shape) are also
used by bench/bench_cpu.py.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

from machine import cpu_model, git_commit  # bench/, the script's own directory

HERE = os.path.dirname(os.path.abspath(__file__))

# (m, n, k): the square reference and im2col GEMMs of convolutions (c_out x hw x c_in*kh*kw)
SHAPES = [(1024, 1024, 1024), (16, 1024, 27), (64, 1024, 576), (128, 256, 1152),
          (256, 64, 2304), (128, 4096, 1152)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per timed sample")
    p.add_argument("--settle", type=float, default=0.3,
                   help="idle seconds before each sample, so the other library's threads stop spinning")
    p.add_argument("--ghz", type=float, default=2.6, help="clock for the peak figure")
    p.add_argument("--json", metavar="PATH", help="write the results and machine info here")
    return p.parse_args()


def load_average() -> str:
    """1, 5 and 15 minute load averages: a busy machine makes the figures worthless."""
    try:
        return " ".join(os.getloadavg().__repr__().strip("()").split(", "))
    except OSError:
        return "unknown"


def numpy_blas(np) -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older NumPy: no dict mode
        return "unknown"


def set_threads(threads: int) -> None:
    """The BLAS and OpenMP thread counts; effective only before NumPy is first imported."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def load_libraries(threads: int):
    """(numpy, minidl, minidl._C), minidl from this checkout, with `threads` threads."""
    if "numpy" in sys.modules and os.environ.get("OPENBLAS_NUM_THREADS") != str(threads):
        raise RuntimeError("NumPy was imported before its thread count was set")
    set_threads(threads)
    root = os.path.dirname(HERE)
    if root not in sys.path:
        sys.path.insert(0, root)
    import numpy as np
    import minidl
    from minidl import _C

    minidl.set_num_threads(threads)
    return np, minidl, _C


def timed(fn, min_time, settle):
    """Seconds per call, from enough back-to-back calls to last min_time, after
    `settle` idle seconds."""
    time.sleep(settle)
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return dt / reps
        reps = max(reps * 2, int(reps * min_time / max(dt, 1e-9)) + 1)


def make_case(np, _C, m, n, k, rng):
    """(run_minidl, run_numpy) on the same random operands, after checking that they agree."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    c_ref = np.empty((m, n), np.float32)
    ws = np.empty(_C.sgemm_workspace_size(m, n, k) // 4 + 1, np.float32)
    fa, fb, fc = a.reshape(-1), b.reshape(-1), c.reshape(-1)

    def run_minidl():
        _C.sgemm(False, False, m, n, k, 1.0, fa, k, fb, n, 0.0, fc, n, ws)

    def run_numpy():
        np.matmul(a, b, out=c_ref)

    run_minidl()
    run_numpy()
    err = float(np.abs(c - c_ref).max() / max(np.abs(c_ref).max(), 1e-3))
    if not err < 1e-4:
        raise AssertionError(f"minidl and NumPy disagree at {m}x{n}x{k}: {err:.3g}")
    return run_minidl, run_numpy


def time_shape(np, _C, m, n, k, rounds, min_time, settle, rng):
    """Seconds per call of minidl and of NumPy, one sample of each per round, alternating."""
    run_minidl, run_numpy = make_case(np, _C, m, n, k, rng)
    t_mdl, t_np = [], []
    for _ in range(rounds):
        t_mdl.append(timed(run_minidl, min_time, settle))
        t_np.append(timed(run_numpy, min_time, settle))
    return t_mdl, t_np


def main():
    args = parse_args()
    np, minidl, _C = load_libraries(args.threads)
    peak = args.ghz * 32 * args.threads
    rng = np.random.default_rng(0)
    rows = []
    print(f"minidl {minidl.__version__} ({minidl.get_simd()}), NumPy {np.__version__} "
          f"({numpy_blas(np)}), {args.threads} threads, {cpu_model()}")
    print(f"{'m':>5} {'n':>5} {'k':>5} | {'minidl GF/s':>11} {'% peak':>6} | "
          f"{'NumPy GF/s':>10} {'% peak':>6} | {'ratio':>5}")
    for m, n, k in SHAPES:
        t_mdl, t_np = time_shape(np, _C, m, n, k, args.rounds, args.min_time, args.settle, rng)
        flop = 2.0 * m * n * k
        g_mdl, g_np = flop / min(t_mdl) / 1e9, flop / min(t_np) / 1e9
        ratio = statistics.median(tn / tm for tm, tn in zip(t_mdl, t_np))
        rows.append(dict(m=m, n=n, k=k, minidl_gflops=round(g_mdl, 2),
                         numpy_gflops=round(g_np, 2), minidl_pct_peak=round(100 * g_mdl / peak, 1),
                         numpy_pct_peak=round(100 * g_np / peak, 1),
                         median_ratio=round(ratio, 3), rounds=args.rounds))
        print(f"{m:5d} {n:5d} {k:5d} | {g_mdl:11.1f} {100 * g_mdl / peak:5.0f}% | "
              f"{g_np:10.1f} {100 * g_np / peak:5.0f}% | {ratio:5.2f}")
    print(f"peak: {peak:.0f} GFLOP/s ({args.ghz} GHz x 32 FLOP/cycle x {args.threads} cores, AVX2 FMA); "
          "GF/s: best round; ratio: median of minidl / NumPy speed per round")
    if args.json:
        info = dict(cpu=cpu_model(), threads=args.threads, peak_gflops=peak, settle_s=args.settle,
                    numpy=np.__version__, numpy_blas=numpy_blas(np), minidl=minidl.__version__,
                    simd=minidl.get_simd(), python=platform.python_version(),
                    date=datetime.datetime.now().isoformat(timespec="seconds"),
                    git_commit=git_commit(short=False), loadavg=load_average())
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(benchmark="gemm", machine=info, results=rows), f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
