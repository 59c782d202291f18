"""First-step gradients of a net on random inputs: each of minidl's paths (GEMM,
Winograd or automatic convolutions; fused or not) and PyTorch's float32 against
PyTorch's float64, and how far the float64 gradients move when the input moves by a
relative 1e-7 to 1e-5 (ReLU inputs within rounding of zero: gradients are only
piecewise smooth).  Needs torch.

    python3 dev/kinks.py [MODEL [BATCH [SEED ...]]]      (default: resnet20 8 2 3 4 5)
"""
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]
import minidl  # noqa: E402
import torch_nets  # noqa: E402
from minidl import models  # noqa: E402
from minidl.plan import make_plan  # noqa: E402
from minidl.runtime import Executor  # noqa: E402


def median_distance(g, ref):
    return float(np.median([np.linalg.norm(g[k] - ref[k]) / max(np.linalg.norm(ref[k]), 1e-30)
                            for k in ref]))


def main(argv):
    name = argv[0] if argv else "resnet20"
    batch = int(argv[1]) if len(argv) > 1 else 8
    seeds = [int(s) for s in argv[2:]] or [2, 3, 4, 5]
    state = {k: np.array(v) for k, v in models.build(name, seed=0).state_dict().items()}
    shape = models.build(name, seed=None).input_shape
    for seed in seeds:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((batch,) + tuple(shape)).astype(np.float32)
        y = rng.integers(0, 10, batch)

        def torch_grads(dtype, xx=x):
            net = torch_nets.build(name).to(dtype).train()
            net.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
            loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(xx).to(dtype)),
                                                     torch.from_numpy(y))
            loss.backward()
            return {k: p.grad.double().numpy() for k, p in net.named_parameters()}

        exact = torch_grads(torch.float64)
        moved = []
        for eps in (1e-7, 1e-6, 1e-5):
            g = torch_grads(torch.float64, x * (1 + eps * rng.standard_normal(x.shape)))
            moved.append(f"{eps:.0e}: {median_distance(g, exact):.1e}")
        moved = ", ".join(moved)
        print(f"{name}, batch {batch}, seed {seed}: the float64 gradients moved by the "
              f"input moved by {moved}")
        print(f"  torch float32            "
              f"{median_distance(torch_grads(torch.float32), exact):.1e}")
        for algo in ("gemm", "winograd", "auto"):
            minidl.set_conv_algo(algo)
            for fuse in (False, True):
                net = models.build(name, seed=0)
                Executor(net, make_plan(net, batch, fuse=fuse)).train_step(x, y)
                g = {k: p.grad.astype(np.float64) for k, p in net.parameters().items()}
                print(f"  minidl {algo:8s} {'fused' if fuse else 'plain'}  "
                      f"{median_distance(g, exact):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
