"""The loop the dev/fuzz_*.py scripts share: cases drawn from one seed for a time, each
on a random SIMD level of this CPU and 1 or 2 threads (with 2, every parallel region
split, as the tests' `threads` fixture does)."""
import time

import numpy as np

import minidl
from minidl import _C

LEVELS = ["scalar", "avx2", "avx512"]


def run(seed: int, seconds: float, case) -> int:
    """case(rng) -> None where no case was drawn, else (what, {check: (error, tolerance)}).
    Prints each case with a check over its tolerance and a summary; returns the exit
    status (1 when any failed)."""
    rng = np.random.default_rng(seed)
    levels = LEVELS[:LEVELS.index(minidl.cpu_simd()) + 1]
    end, cases, failed = time.time() + seconds, 0, 0
    while time.time() < end:
        simd, threads = str(rng.choice(levels)), int(rng.choice([1, 2]))
        minidl.set_simd(simd)
        minidl.set_num_threads(threads)
        _C.set_min_parallel_work(0 if threads > 1 else 65536)
        drawn = case(rng)
        if drawn is None:
            continue
        what, errs = drawn
        cases += 1
        bad = {k: f"{e:.2e}" for k, (e, tol) in errs.items() if not e <= tol}
        if bad:
            failed += 1
            print("case", what, simd, f"{threads} threads", bad, flush=True)
    print(f"{cases} cases from seed {seed}, {failed} over the tolerance")
    return 1 if failed else 0
