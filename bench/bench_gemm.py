"""SGEMM throughput: minidl's kernels (one or more SIMD levels) against NumPy's matmul (its BLAS).

    python3 bench/bench_gemm.py [--simd avx2,avx512] [--threads 2] [--rounds 7]
                                [--json bench/results/gemm-DATE.json] [--against TREE]

Both run with the same thread count (the BLAS thread variables are set before
NumPy is imported).  Each round times every selected minidl level, then NumPy,
on the same operands (A B C A B C ...), each for at least --min-time seconds;
the table shows the best round of each (the machine at its quietest) and the
median over rounds of the per-round ratio minidl / NumPy.  Before each timed
sample the bench sleeps --settle seconds: OpenBLAS's worker threads busy-wait
for about 0.1 s after a call (and OpenMP's for a shorter while), and on 2 cores
spinning workers of one library halve the speed of the other; then it makes one
untimed call, since after an idle moment this VM's host runs both vCPUs on one core
for the next few ms (bench/NOTES.md, bench/omp_wake.c).  minidl is called
through minidl._C with a preallocated workspace, as the convolution layers call
it, with the transposes the convolution passes use.

--against TREE: another source tree, built (`make ext`), whose minidl._C is loaded
into this process too and timed on the same operands next to this tree's in each
round (first in every other round); the columns "other" and "this/other" (the
median of the per-round speed ratios, above 1: this tree is faster) are before and
after figures free of the differences between two processes.

Peak: measured in the same run by bench/fma_peak.c (compiled here with cc, one
copy per thread at the same time, the sum of the best of AVX2 and AVX-512 per
copy); --ghz x 32 FLOP x threads only when that cannot be built or run.

Shapes: squares 512, 1024, 2048; the im2col GEMMs of cifar10_quick (batch 100)
and resnet20 (batch 128) with the chunking of src_c/conv.c (M = c_out, N = B
images x h_out x w_out, K = c_in x kh x kw for the forward; M = K, K = c_out,
A transposed for the data gradient; M = c_out, N = K, K = B x P, B transposed
for the weight gradient); and the shapes of the earlier runs.

The functions (set_threads, load_libraries, make_case, timed) are also
used by bench/bench_cpu.py, timed by bench/torch_gemm.py.
"""
import argparse
import collections
import datetime
import glob
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from machine import cpu_model, git_commit  # bench/, the script's own directory

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK_FLOATS = 2 << 20  # src_c/conv.c: target size of a chunk's column + output buffers

# (net, layer, batch, c_in, c_out, kernel, stride, pad, h_in)
CONV_LAYERS = [
    ("cifar10_quick", "conv1", 100, 3, 32, 5, 1, 2, 32),
    ("cifar10_quick", "conv2", 100, 32, 32, 5, 1, 2, 16),
    ("cifar10_quick", "conv3", 100, 32, 64, 5, 1, 2, 8),
    ("resnet20", "conv1", 128, 3, 16, 3, 1, 1, 32),
    ("resnet20", "16->16", 128, 16, 16, 3, 1, 1, 32),
    ("resnet20", "32->32", 128, 32, 32, 3, 1, 1, 16),
    ("resnet20", "64->64", 128, 64, 64, 3, 1, 1, 8),
]


def conv_gemms():
    """(label, m, n, k, trans_a, trans_b) of the forward, data- and weight-gradient GEMMs
    of a full chunk, as src_c/conv.c runs them."""
    out = []
    for net, layer, batch, c_in, c_out, ks, stride, pad, h in CONV_LAYERS:
        ho = (h + 2 * pad - ks) // stride + 1
        K, P = c_in * ks * ks, ho * ho
        B = max(1, min(batch, CHUNK_FLOATS // ((K + c_out) * P)))
        N = B * P
        name = f"{net} {layer}"
        out += [(f"{name} fwd", c_out, N, K, False, False),
                (f"{name} bwd-data", K, N, c_out, True, False),
                (f"{name} bwd-w", c_out, K, N, False, True)]
    return out


SHAPES = ([(f"square {s}", s, s, s, False, False) for s in (512, 1024, 2048)] + conv_gemms() +
          [(f"earlier {m}x{n}x{k}", m, n, k, False, False)
           for m, n, k in [(16, 1024, 27), (64, 1024, 576), (128, 256, 1152), (256, 64, 2304),
                           (128, 4096, 1152)]])


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--simd", default="best",
                   help="comma-separated minidl levels to time (scalar, avx2, avx512, best); "
                        "default: the best this CPU has")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per timed sample")
    p.add_argument("--settle", type=float, default=0.3,
                   help="idle seconds before each sample, so the other library's threads stop spinning")
    p.add_argument("--ghz", type=float, default=2.6,
                   help="clock for the peak figure, only when fma_peak.c cannot be measured")
    p.add_argument("--only", help="run only the shapes whose label contains this text")
    p.add_argument("--json", metavar="PATH", help="write the results and machine info here")
    p.add_argument("--against", metavar="TREE", help="another built source tree to compare with")
    return p.parse_args()


def measured_peak(threads):
    """GFLOP/s of `threads` concurrent copies of bench/fma_peak.c (summed), with the
    per-copy figures; None when it cannot be built or run."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "fma_peak")
        try:
            subprocess.run([cc, "-O3", "-funroll-loops", os.path.join(HERE, "fma_peak.c"), "-o", exe],
                           check=True, capture_output=True)
            procs = [subprocess.Popen([exe], stdout=subprocess.PIPE, text=True)
                     for _ in range(threads)]
            copies = [json.loads(p.communicate()[0]) for p in procs]
        except (OSError, subprocess.CalledProcessError, ValueError):
            return None
    per_copy = [max(c["avx2_gflops"], c["avx512_gflops"]) for c in copies]
    return sum(per_copy), copies


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


def load_other(tree: str, threads: int):
    """The minidl._C of another built source tree, loaded beside this tree's."""
    paths = glob.glob(os.path.join(tree, "minidl", "_C.*.so"))
    if not paths:
        raise SystemExit(f"--against: no built minidl/_C.*.so in {tree} (run make ext there)")
    spec = importlib.util.spec_from_file_location("minidl._C", paths[0])
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    other.set_num_threads(threads)
    return other


def timed(fn, min_time, settle):
    """Seconds per call, from enough back-to-back calls to last min_time, after
    `settle` idle seconds and one untimed call."""
    time.sleep(settle)
    fn()
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return dt / reps
        reps = max(reps * 2, int(reps * min_time / max(dt, 1e-9)) + 1)


def placed(np, rng, shape):
    """An uninitialised float32 array that starts a random multiple of 16 bytes into a
    4 KiB page (malloc hands a freed block back at the same address: without this, every
    case of a shape would see the same layout)."""
    size = int(np.prod(shape)) * 4
    buf = np.empty(size + 8192, np.uint8)
    start = (-buf.ctypes.data) % 4096 + 16 * int(rng.integers(0, 256))
    return buf[start:start + size].view(np.float32).reshape(shape)


Case = collections.namedtuple("Case", "run_minidl run_numpy error layout run_other",
                              defaults=(None,))


def make_case(np, _C, m, n, k, rng, ta=False, tb=False, other=None):
    """A Case on random operands (op(A) = A^T with ta, op(B) = B^T with tb), each at a
    random place in a page: run_minidl and run_numpy compute C = op(A) op(B) into their
    own outputs, error() runs both and returns the largest difference relative to NumPy's
    largest entry (checked below 1e-4 here, at the SIMD level in use); layout: where C
    starts after B modulo 4 KiB and A's, B's and C's offsets in their cache lines (the
    speed of thin products on two threads depends on it, bench/NOTES.md); run_other:
    another build's _C (`other`) on the same operands, into an output of its own."""
    a = placed(np, rng, (k, m) if ta else (m, k))
    b = placed(np, rng, (n, k) if tb else (k, n))
    a[...] = rng.standard_normal(a.shape)
    b[...] = rng.standard_normal(b.shape)
    c, c_ref = placed(np, rng, (m, n)), placed(np, rng, (m, n))
    ws = np.empty(_C.sgemm_workspace_size(m, n, k) // 4 + 1, np.float32)
    fa, fb, fc = a.reshape(-1), b.reshape(-1), c.reshape(-1)
    lda, ldb = a.shape[1], b.shape[1]
    at, bt = (a.T if ta else a), (b.T if tb else b)

    def run_minidl():
        _C.sgemm(ta, tb, m, n, k, 1.0, fa, lda, fb, ldb, 0.0, fc, n, ws)

    def run_numpy():
        np.matmul(at, bt, out=c_ref)

    run_other = None
    if other is not None:
        ws_o = np.empty(other.sgemm_workspace_size(m, n, k) // 4 + 1, np.float32)
        c_o = placed(np, rng, (m, n))
        fc_o = c_o.reshape(-1)

        def run_other():
            other.sgemm(ta, tb, m, n, k, 1.0, fa, lda, fb, ldb, 0.0, fc_o, n, ws_o)

    def error():
        run_minidl()
        run_numpy()
        outs = [c]
        if run_other is not None:
            run_other()
            outs.append(c_o)
        return max(float(np.abs(x - c_ref).max() / max(np.abs(c_ref).max(), 1e-3)) for x in outs)

    err = error()
    if not err < 1e-4:
        raise AssertionError(f"minidl and NumPy disagree at {m}x{n}x{k}: {err:.3g}")
    pa, pb, pc = (x.ctypes.data for x in (a, b, c))
    layout = {"c_after_b_mod_4k": (pc - pb) % 4096, "line_offsets": [pa % 64, pb % 64, pc % 64]}
    return Case(run_minidl, run_numpy, error, layout, run_other)


def main():
    args = parse_args()
    np, minidl, _C = load_libraries(args.threads)
    other = load_other(args.against, args.threads) if args.against else None
    levels = [minidl.cpu_simd() if lv == "best" else lv for lv in args.simd.split(",")]
    for lv in levels:
        minidl.set_simd(lv)  # fails early on an unknown level or one the CPU lacks
    measured = measured_peak(args.threads)
    if measured is not None:
        peak, peak_copies = measured
        peak_how = f"measured by fma_peak.c, {args.threads} copies: " + ", ".join(
            f"{max(c['avx2_gflops'], c['avx512_gflops']):.1f}" for c in peak_copies)
    else:
        peak, peak_copies = args.ghz * 32 * args.threads, None
        peak_how = f"{args.ghz} GHz x 32 FLOP/cycle x {args.threads} cores (fma_peak.c not run)"
    rng = np.random.default_rng(0)
    rows = []
    print(f"minidl {minidl.__version__} ({', '.join(levels)}), NumPy {np.__version__} "
          f"({numpy_blas(np)}), {args.threads} threads, {cpu_model()}")
    print(f"peak {peak:.1f} GFLOP/s ({peak_how})")
    head = "".join(f" | {lv + ' GF/s':>12} {'%pk':>4} {'ratio':>5}" +
                   (f" {'other':>6} {'this/other':>10}" if other else "") for lv in levels)
    print(f"{'shape':<32} {'m':>5} {'n':>5} {'k':>5} {'t':>2}{head} | {'NumPy GF/s':>10} {'%pk':>4}")
    shapes = [s for s in SHAPES if args.only is None or args.only in s[0]]

    def use(lv):
        minidl.set_simd(lv)
        if other is not None:
            other.set_simd(lv)

    for label, m, n, k, ta, tb in shapes:
        case = make_case(np, _C, m, n, k, rng, ta, tb, other)
        run_minidl, run_numpy, run_other = case.run_minidl, case.run_numpy, case.run_other
        for lv in levels:
            use(lv)
            err = case.error()
            assert err < 1e-4, f"minidl ({lv}) and NumPy disagree at {m}x{n}x{k}: {err:.3g}"
        t_mdl = {lv: [] for lv in levels}
        t_other = {lv: [] for lv in levels}
        t_np = []
        for r in range(args.rounds):
            for lv in levels:
                use(lv)
                pair = [(t_mdl[lv], run_minidl)] + ([(t_other[lv], run_other)] if other else [])
                for times, fn in pair if r % 2 == 0 else pair[::-1]:
                    times.append(timed(fn, args.min_time, args.settle))
            t_np.append(timed(run_numpy, args.min_time, args.settle))
        flop = 2.0 * m * n * k
        g_np = flop / min(t_np) / 1e9
        row = dict(label=label, m=m, n=n, k=k, trans_a=ta, trans_b=tb, rounds=args.rounds,
                   numpy_gflops=round(g_np, 2), numpy_pct_peak=round(100 * g_np / peak, 1),
                   numpy_median_gflops=round(flop / statistics.median(t_np) / 1e9, 2))
        line = f"{label:<32} {m:5d} {n:5d} {k:5d} {'T' if ta else 'N'}{'T' if tb else 'N'}"
        for lv in levels:
            g = flop / min(t_mdl[lv]) / 1e9
            ratio = statistics.median(tn / tm for tm, tn in zip(t_mdl[lv], t_np))
            row[lv] = dict(gflops=round(g, 2), pct_peak=round(100 * g / peak, 1),
                           median_gflops=round(flop / statistics.median(t_mdl[lv]) / 1e9, 2),
                           median_ratio_vs_numpy=round(ratio, 3))
            line += f" | {g:12.1f} {100 * g / peak:3.0f}% {ratio:5.2f}"
            if other is not None:
                g_o = flop / min(t_other[lv]) / 1e9
                vs = statistics.median(to / tm for tm, to in zip(t_mdl[lv], t_other[lv]))
                row[lv]["against"] = dict(tree=os.path.abspath(args.against), gflops=round(g_o, 2),
                                          median_ratio_this_over_other=round(vs, 3))
                line += f" {g_o:6.1f} {vs:10.3f}"
        rows.append(row)
        print(f"{line} | {g_np:10.1f} {100 * g_np / peak:3.0f}%", flush=True)
    minidl.set_simd(minidl.cpu_simd())
    print("GF/s: best round; %pk: of the peak above; ratio: median of minidl / NumPy speed per "
          "round; t: transposes of A and B" +
          ("; other: --against's GF/s, this/other: median of this tree's / its speed per round"
           if other else ""))
    if args.json:
        info = dict(cpu=cpu_model(), threads=args.threads, peak_gflops=round(peak, 1),
                    peak_source=peak_how, peak_copies=peak_copies, settle_s=args.settle,
                    numpy=np.__version__, numpy_blas=numpy_blas(np), minidl=minidl.__version__,
                    simd_levels=levels, cpu_simd=minidl.cpu_simd(),
                    python=platform.python_version(),
                    date=datetime.datetime.now().isoformat(timespec="seconds"),
                    git_commit=git_commit(short=False), loadavg=load_average())
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(benchmark="gemm", machine=info, results=rows), f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
