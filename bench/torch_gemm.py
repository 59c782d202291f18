"""PyTorch's SGEMM (torch.mm, its BLAS: MKL in the x86 wheels), timed on request: the
third column of bench/bench_cpu.py's SGEMM stage, which runs this file under
--torch-python as a child and keeps it for the whole stage.

    TORCH_PYTHON bench/torch_gemm.py --threads 2

The first line written is {"torch_version": ..., "blas": ...}.  Then each line read
is one request, {"m", "n", "k", "trans_a", "trans_b", "min_time", "settle", "seed"},
and each line written its answer, {"seconds": per call, "error": largest difference
from a float64 product relative to its largest entry}: torch.mm into a preallocated
C, op(A) = A^T with trans_a (A stored k x m) and likewise op(B), the operands at a
random multiple of 16 bytes into a 4 KiB page as bench_gemm.placed puts NumPy's,
timed by bench_gemm.timed (after `settle` idle seconds).  An error answers
{"failed": message}; end of input ends the process.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import timed  # noqa: E402  (bench/; it needs neither NumPy nor minidl)

import torch  # noqa: E402


def blas() -> str:
    """'mkl' (and the MKL version line) from torch's build configuration."""
    config = torch.__config__.show()
    name = re.search(r"BLAS_INFO=(\w+)", config)
    version = re.search(r"Math Kernel Library Version ([^\s]+)", config)
    return " ".join(x.group(1) for x in (name, version) if x) or "unknown"


def placed(shape, gen):
    """An uninitialised float32 tensor starting a random multiple of 16 bytes into a page."""
    size = shape[0] * shape[1]
    buf = torch.empty(size + 2048, dtype=torch.float32)
    start = ((-buf.data_ptr()) % 4096 + 16 * int(torch.randint(0, 256, (1,), generator=gen))) // 4
    return buf[start:start + size].view(shape)


def answer(req: dict) -> dict:
    m, n, k, ta, tb = (req[key] for key in ("m", "n", "k", "trans_a", "trans_b"))
    gen = torch.Generator().manual_seed(int(req.get("seed", 0)))
    a = placed((k, m) if ta else (m, k), gen)
    b = placed((n, k) if tb else (k, n), gen)
    a.normal_(generator=gen)
    b.normal_(generator=gen)
    c = placed((m, n), gen)
    at, bt = (a.t() if ta else a), (b.t() if tb else b)

    def run():
        torch.mm(at, bt, out=c)

    run()
    ref = at.double() @ bt.double()
    error = float((c.double() - ref).abs().max() / max(float(ref.abs().max()), 1e-3))
    return {"seconds": timed(run, float(req["min_time"]), float(req["settle"])), "error": error}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps({"torch_version": torch.__version__, "blas": blas()}), flush=True)
    for line in sys.stdin:
        try:
            out = answer(json.loads(line))
        except Exception as e:  # the parent reports it; this process goes on
            out = {"failed": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
