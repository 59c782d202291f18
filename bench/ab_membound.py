"""A/B of the memory-bound ops between two builds of minidl, interleaved in one run.

    python3 bench/ab_membound.py --a /tmp/old --b . [--pairs 5] [--only SUBSTR]

--a and --b are directories holding a built `minidl` package (e.g. a copy of the
tree, extension included, made before a change).  The runs alternate A B A B ...,
each a subprocess running bench_membound.py --rounds 1 --no-stream --no-api with
that directory first on sys.path; per op, the table shows the median over the
runs of each side's median call, and the ratio A / B of those medians.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--only", default="")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--min-time", type=float, default=0.05)
    args = p.parse_args()
    res = {"a": [], "b": []}
    tmp = tempfile.mkdtemp(prefix="mdl_ab_")
    for i in range(args.pairs):
        for side in ("a", "b"):
            out = os.path.join(tmp, f"{side}{i}.json")
            env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(args, side)),
                       MINIDL_BENCH_KEEP_PATH="1")
            cmd = [sys.executable, os.path.join(HERE, "bench_membound.py"), "--rounds", "1",
                   "--no-stream", "--no-api", "--only", args.only, "--min-time",
                   str(args.min_time), "--json", out]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                res[side].append(json.load(f)["results"])
    print(f"A = {args.a}, B = {args.b}, {args.pairs} interleaved runs each")
    print(f"{'op':<22} {'model':<13} {'shape':<16} | {'A ms':>8} {'B ms':>8} {'A/B':>5} | "
          f"{'A GB/s':>6} {'B GB/s':>6}")
    rows = []
    for j, r in enumerate(res["a"][0]):
        ta = statistics.median(run[j]["kernel_ms"] for run in res["a"])
        tb = statistics.median(run[j]["kernel_ms"] for run in res["b"])
        gb = r["bytes"] / 1e6
        shp = "x".join(map(str, r["shape"]))
        print(f"{r['op']:<22} {r['model']:<13} {shp:<16} | {ta:8.3f} {tb:8.3f} {ta / tb:5.2f} | "
              f"{gb / ta:6.1f} {gb / tb:6.1f}")
        rows.append(dict(op=r["op"], model=r["model"], shape=r["shape"], a_ms=ta, b_ms=tb))
    return rows


if __name__ == "__main__":
    main()
