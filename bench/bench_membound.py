"""Memory-bound layers against the machine's memory bandwidth, measured in the same run.

    python3 bench/bench_membound.py [--threads N] [--rounds 7] [--only SUBSTR]
                                    [--json bench/results/membound-DATE.json]

Bandwidth: STREAM-style copy (a = b) and triad (a = b + s * c) in C with OpenMP
(bench/stream.c, compiled here with the system C compiler into a temporary
library and called through ctypes), with minidl's thread count, plain stores,
STREAM's byte count.  Two sizes: arrays of 256 MiB each (far above the 32 MiB
L3: DRAM) and of 4 MiB each (12 MiB for triad: the footprint of the layers
below, L3).  The reference figure is the DRAM triad.

Ops: every memory-bound layer of cifar10_quick (batch 100) and resnet20
(batch 128) at its real shape, forward and backward, plus the optimizer
updates over all resnet20 parameters.  Each op is timed two ways:
  kernel  minidl._C with preallocated outputs (the C kernel and the binding)
  api     minidl.ops / minidl.optim as the layers call them (argument checks,
          output allocation; for the optimizers the Python loop over the
          parameters)
Bytes are the minimum: each input read once, each output written once (an
in-place array counts as read and written), from the shapes.  GB/s and the
fraction of the DRAM triad bandwidth are from the kernel time; the tensors
here (4-16 MiB) mostly fit in the L3, so fractions above 100% are possible, and
the fraction of the L3-sized triad is given too.

Each round times every op for at least --min-time seconds, calls back to back,
each call timed by itself; the table shows the median call over all rounds (on a
shared 2-core machine a call whose thread was descheduled takes a scheduler
tick longer: medians of single calls keep those out, means do not).
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import cpu_model, git_commit  # noqa: E402

MiB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=None, help="minidl threads (default: its own)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per timed sample")
    p.add_argument("--only", default="", help="run the ops whose name contains this")
    p.add_argument("--no-api", action="store_true", help="time the kernels only")
    p.add_argument("--no-stream", action="store_true",
                   help="skip the bandwidth measurement (fractions are then left out)")
    p.add_argument("--json", metavar="PATH", help="write the results and machine info here")
    return p.parse_args(argv)


# ---- bandwidth ----------------------------------------------------------------------

def load_stream():
    tmp = tempfile.mkdtemp(prefix="mdl_stream_")
    so = os.path.join(tmp, "stream.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-shared",
                    os.path.join(HERE, "stream.c"), "-o", so], check=True)
    lib = ctypes.CDLL(so)
    fp = ctypes.POINTER(ctypes.c_float)
    lib.stream_copy.argtypes = [fp, fp, ctypes.c_int64, ctypes.c_int]
    lib.stream_triad.argtypes = [fp, fp, fp, ctypes.c_float, ctypes.c_int64, ctypes.c_int]
    return lib


def stream(np, lib, mib: int, threads: int, rounds: int, min_time: float):
    n = mib * MiB // 4
    a, b, c = (np.full(n, 1.0, np.float32) for _ in range(3))
    fp = ctypes.POINTER(ctypes.c_float)
    pa, pb, pc = (x.ctypes.data_as(fp) for x in (a, b, c))
    copy = lambda: lib.stream_copy(pa, pb, n, threads)  # noqa: E731
    triad = lambda: lib.stream_triad(pa, pb, pc, 0.5, n, threads)  # noqa: E731
    tc, tt = [], []
    for _ in range(rounds):
        tc += timed(copy, min_time)
        tt += timed(triad, min_time)
    # the median call, as for the ops; the best call for what the machine can give at most
    return dict(array_mib=mib, copy_gbs=8 * n / statistics.median(tc) / 1e9,
                triad_gbs=12 * n / statistics.median(tt) / 1e9,
                copy_gbs_best=8 * n / min(tc) / 1e9, triad_gbs_best=12 * n / min(tt) / 1e9)


def timed(fn, min_time: float) -> list:
    """Seconds of each call of fn, called back to back for at least min_time (after one
    untimed call).  Each call is timed by itself, so that a call stalled by the
    scheduler (2 cores shared with other work) shows as one outlier, not a slower mean."""
    fn()
    times, t_end = [], time.perf_counter() + min_time
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if t1 >= t_end and len(times) >= 3:
            return times


# ---- the ops ------------------------------------------------------------------------

def make_ops(np, minidl, want_api: bool):
    """(name, model, shape, bytes, kernel fn, api fn or None) for every op."""
    from minidl import _C, ops, models
    from minidl.optim import SGD, Adam

    rng = np.random.default_rng(0)
    out = []

    def arr(shape, pos=False):
        a = rng.standard_normal(shape, dtype=np.float32)
        return np.abs(a) + np.float32(0.5) if pos else a

    F = 4  # bytes per float

    def relu(model, shape):
        x, dy = arr(shape), arr(shape)
        y, dx = np.empty_like(x), np.empty_like(x)
        fx, fy, fdy, fdx = (a.reshape(-1) for a in (x, y, dy, dx))
        size = x.size * F
        out.append((f"relu fwd", model, shape, 2 * size, lambda: _C.relu_forward(fx, fy),
                    lambda: ops.relu(x)))
        out.append((f"relu bwd", model, shape, 3 * size,
                    lambda: _C.relu_backward(fx, fdy, fdx), lambda: ops.relu_backward(x, dy)))

    def pool(model, shape, kind, k=3, s=2, ceil=True):
        x = arr(shape)
        _, ps, (ho, wo) = ops._pool_args(x, k, s, 0, ceil)
        oshape = shape[:2] + (ho, wo)
        y, dy, dx = np.empty(oshape, np.float32), arr(oshape), np.empty_like(x)
        fx, fy, fdy, fdx = (a.reshape(-1) for a in (x, y, dy, dx))
        kw = dict(stride=s, padding=0, ceil_mode=ceil)
        if kind == "max":
            out.append((f"max pool {k}x{k}/{s} fwd", model, shape, (x.size + y.size) * F,
                        lambda: _C.max_pool2d_forward(ps, fx, fy),
                        lambda: ops.max_pool2d(x, k, **kw)))
            out.append((f"max pool {k}x{k}/{s} bwd", model, shape,
                        (x.size + dy.size + dx.size) * F,
                        lambda: _C.max_pool2d_backward(ps, fx, fdy, fdx),
                        lambda: ops.max_pool2d_backward(x, dy, k, **kw)))
            tap = np.empty(oshape, np.uint8)
            ft = tap.reshape(-1)
            out.append((f"max pool {k}x{k}/{s} fwd, taps", model, shape,
                        (x.size + y.size) * F + tap.size,
                        lambda: _C.max_pool2d_forward_argmax(ps, fx, None, None, False, fy, ft),
                        lambda: ops.max_pool2d_argmax(x, k, **kw)))
            out.append((f"max pool {k}x{k}/{s} bwd, taps", model, shape,
                        (dy.size + dx.size) * F + tap.size,
                        lambda: _C.max_pool2d_backward_argmax(ps, ft, fdy, fdx),
                        lambda: ops.max_pool2d_backward_argmax(tap, dy, x.shape, k, **kw)))
        else:
            out.append((f"avg pool {k}x{k}/{s} fwd", model, shape, (x.size + y.size) * F,
                        lambda: _C.avg_pool2d_forward(ps, fx, fy),
                        lambda: ops.avg_pool2d(x, k, **kw)))
            out.append((f"avg pool {k}x{k}/{s} bwd", model, shape, (dy.size + dx.size) * F,
                        lambda: _C.avg_pool2d_backward(ps, fdy, fdx),
                        lambda: ops.avg_pool2d_backward(x.shape, dy, k, **kw)))

    def bn(model, shape):
        n, c = shape[:2]
        hw = x_size = 1
        for d in shape[2:]:
            hw *= d
        x, dy = arr(shape) * np.float32(2) + np.float32(1), arr(shape)
        x_size = x.size
        g, b = arr(c, pos=True), arr(c)
        rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)
        y, dx = np.empty_like(x), np.empty_like(x)
        mean, inv, dg, db = (np.empty(c, np.float32) for _ in range(4))
        fx, fy, fdy, fdx = (a.reshape(-1) for a in (x, y, dy, dx))
        _C.batch_norm_forward_train(n, c, hw, fx, g, b, 1e-5, 0.1, rm, rv, fy, mean, inv)
        out.append(("bn train fwd", model, shape, 2 * x_size * F,
                    lambda: _C.batch_norm_forward_train(n, c, hw, fx, g, b, 1e-5, 0.1, rm, rv,
                                                        fy, mean, inv),
                    lambda: ops.batch_norm(x, g, b, running_mean=rm, running_var=rv)))
        out.append(("bn train bwd", model, shape, 3 * x_size * F,
                    lambda: _C.batch_norm_backward(n, c, hw, fx, g, fdy, mean, inv, fdx, dg, db),
                    lambda: ops.batch_norm_backward(x, g, dy, mean, inv)))
        out.append(("bn infer", model, shape, 2 * x_size * F,
                    lambda: _C.batch_norm_forward_infer(n, c, hw, fx, g, b, rm, rv, 1e-5, fy),
                    lambda: ops.batch_norm(x, g, b, training=False, running_mean=rm,
                                           running_var=rv)))

    def add(model, shape):
        a, b = arr(shape), arr(shape)
        y = np.empty_like(a)
        fa, fb, fy = (t.reshape(-1) for t in (a, b, y))
        out.append(("add", model, shape, 3 * a.size * F, lambda: _C.add(fa, fb, fy),
                    lambda: ops.add(a, b)))

    def gap(model, shape):
        n, c, h, w = shape
        x, dy = arr(shape), arr((n, c))
        y, dx = np.empty((n, c), np.float32), np.empty_like(x)
        fx, fy, fdy, fdx = (a.reshape(-1) for a in (x, y, dy, dx))
        out.append(("global avg pool fwd", model, shape, (x.size + y.size) * F,
                    lambda: _C.global_avg_pool2d_forward(n, c, h, w, fx, fy),
                    lambda: ops.global_avg_pool2d(x)))
        out.append(("global avg pool bwd", model, shape, (x.size + y.size) * F,
                    lambda: _C.global_avg_pool2d_backward(n, c, h, w, fdy, fdx),
                    lambda: ops.global_avg_pool2d_backward(x.shape, dy)))

    def xent(model, shape):
        z = arr(shape)
        labels = rng.integers(0, shape[1], shape[0]).astype(np.int64)
        d = np.empty_like(z)
        fz, fd = z.reshape(-1), d.reshape(-1)
        out.append(("softmax xent fwd+bwd", model, shape, (2 * z.size + shape[0] * 2) * F,
                    lambda: _C.softmax_cross_entropy(shape[0], shape[1], fz, labels, fd),
                    lambda: ops.softmax_cross_entropy(z, labels)))

    def optim(model):
        net = models.build(model, seed=0)
        params = net.parameters()
        for p in params.values():
            p.grad = arr(p.data.shape) * np.float32(1e-3)
        total = sum(p.data.size for p in params.values())
        shape = (len(params), total)  # (tensors, elements)
        sgd = SGD(params, lr=1e-3, momentum=0.9, weight_decay=5e-4)
        sgd.step()  # past the first step (buffer = grad)
        plist = [(p.data.reshape(-1), p.grad.reshape(-1),
                  sgd.state["momentum_buffer"][k].reshape(-1)) for k, p in params.items()]

        def sgd_kernel():
            for p, g, buf in plist:
                _C.sgd_step(p, g, buf, 1e-3, 0.9, 0.0, 5e-4, False, False)

        out.append(("sgd momentum step", model, shape, 5 * total * F, sgd_kernel, sgd.step))
        adam = Adam(params, lr=1e-3, weight_decay=5e-4)
        alist = [(p.data.reshape(-1), p.grad.reshape(-1), adam.state["exp_avg"][k].reshape(-1),
                  adam.state["exp_avg_sq"][k].reshape(-1)) for k, p in params.items()]

        def adam_kernel():
            for p, g, m, v in alist:
                _C.adam_step(p, g, m, v, 10, 1e-3, 0.9, 0.999, 1e-8, 5e-4, False)

        out.append(("adam step", model, shape, 7 * total * F, adam_kernel, adam.step))

    q = "cifar10_quick"
    pool(q, (100, 32, 32, 32), "max")
    relu(q, (100, 32, 16, 16))
    relu(q, (100, 64, 8, 8))
    pool(q, (100, 32, 16, 16), "avg")
    pool(q, (100, 64, 8, 8), "avg")
    xent(q, (100, 10))
    r = "resnet20"
    for s in ((128, 16, 32, 32), (128, 32, 16, 16), (128, 64, 8, 8)):
        bn(r, s)
    relu(r, (128, 16, 32, 32))
    relu(r, (128, 64, 8, 8))
    add(r, (128, 16, 32, 32))
    add(r, (128, 64, 8, 8))
    gap(r, (128, 64, 8, 8))
    xent(r, (128, 10))
    optim(r)
    if not want_api:
        out = [o[:5] + (None,) for o in out]
    return out


def main(argv=None):
    args = parse_args(argv)
    root = os.path.dirname(HERE)
    if root not in sys.path and not os.environ.get("MINIDL_BENCH_KEEP_PATH"):
        sys.path.insert(0, root)
    import numpy as np
    import minidl

    if args.threads is not None:
        minidl.set_num_threads(args.threads)
    threads = minidl.get_num_threads()
    print(f"minidl {minidl.__version__} ({minidl.get_simd()}) from "
          f"{os.path.dirname(minidl.__file__)}, {threads} threads, {cpu_model()}")
    if args.no_stream:
        nan = float("nan")
        dram = l3 = dict(copy_gbs=nan, triad_gbs=nan)
    else:
        lib = load_stream()
        srounds = max(3, args.rounds // 2)
        dram = stream(np, lib, 256, threads, srounds, args.min_time)
        l3 = stream(np, lib, 4, threads, srounds, args.min_time)
    for s in (dram, l3) if not args.no_stream else ():
        print(f"stream {s['array_mib']:>3} MiB arrays: copy {s['copy_gbs']:.1f} GB/s, "
              f"triad {s['triad_gbs']:.1f} GB/s (median call; best "
              f"{s['copy_gbs_best']:.1f}, {s['triad_gbs_best']:.1f})")
    bw, bw_l3 = dram["triad_gbs"], l3["triad_gbs"]

    ops = [o for o in make_ops(np, minidl, not args.no_api) if args.only in o[0]]
    tk = {i: [] for i in range(len(ops))}
    ta = {i: [] for i in range(len(ops))}
    for _ in range(args.rounds):
        for i, (_, _, _, _, kern, api) in enumerate(ops):
            tk[i].append(timed(kern, args.min_time))
            if api is not None:
                ta[i] += timed(api, args.min_time)
    rows = []
    print(f"{'op':<22} {'model':<13} {'shape':<20} {'MB':>6} | {'kernel ms':>9} {'GB/s':>6} "
          f"{'%DRAM':>6} {'%L3':>5} {'best ms':>8} | {'api ms':>7}")
    for i, (name, model, shape, nbytes, _, api) in enumerate(ops):
        calls = sorted(v for r in tk[i] for v in r)
        t = statistics.median(calls)
        t_best = calls[0]
        t_p10 = calls[len(calls) // 10]
        gbs = nbytes / t / 1e9
        row = dict(op=name, model=model, shape=list(shape), bytes=nbytes,
                   kernel_ms=round(1e3 * t, 4), gbs=round(gbs, 2),
                   frac_dram=round(gbs / bw, 3), frac_l3=round(gbs / bw_l3, 3),
                   kernel_ms_p10=round(1e3 * t_p10, 4), kernel_ms_best=round(1e3 * t_best, 4),
                   gbs_best=round(nbytes / t_best / 1e9, 2), calls=len(calls),
                   kernel_ms_rounds=[round(1e3 * statistics.median(r), 4) for r in tk[i]])
        api_s = ""
        if ta[i]:
            row["api_ms"] = round(1e3 * statistics.median(ta[i]), 4)
            api_s = f"{row['api_ms']:7.3f}"
        rows.append(row)
        shp = "x".join(map(str, shape))
        print(f"{name:<22} {model:<13} {shp:<20} {nbytes / 1e6:6.2f} | {1e3 * t:9.3f} "
              f"{gbs:6.1f} {100 * gbs / bw:5.0f}% {100 * gbs / bw_l3:4.0f}% {1e3 * t_best:8.3f} | "
              f"{api_s}")
    print(f"bandwidth reference: DRAM triad {bw:.1f} GB/s, L3-sized triad {bw_l3:.1f} GB/s; "
          f"times: median call over {args.rounds} rounds (best: fastest call); optimizer shape: "
          f"(tensors, elements)")
    if args.json:
        info = dict(cpu=cpu_model(), threads=threads, minidl=minidl.__version__,
                    simd=minidl.get_simd(), numpy=np.__version__,
                    python=platform.python_version(),
                    date=datetime.datetime.now().isoformat(timespec="seconds"),
                    git_commit=git_commit(short=False), loadavg=os.getloadavg(),
                    rounds=args.rounds, min_time_s=args.min_time)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(benchmark="membound", machine=info,
                           bandwidth=dict(dram=dram, l3=l3, reference_gbs=bw),
                           results=rows), f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
