"""The `minidl` command (also `python -m minidl`):

    minidl train --model cifar10_quick --dataset cifar10 --epochs 10 --out runs/quick
    minidl eval --checkpoint runs/quick/checkpoint.safetensors
    minidl bench --model resnet20 --batch-size 128 --steps 20 --threads 2 --json
    minidl train ... --device sim --sim-memory 512MB      (or --device cuda[:N])
    minidl train --nproc 2 ...      data-parallel over 2 MPI ranks (or: mpiexec -n 2 minidl train ...)
    minidl plan --model resnet20 --batch-size 128 [--json]
    minidl models
    minidl --cflags --libs          compiler/linker flags for the C library
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

import minidl
from minidl.device import OutOfDeviceMemory, from_options

THREADS_HELP = ("kernel threads (default, or 0: $MINIDL_NUM_THREADS, else the cores this "
                "process may use{})")


def _train_parser(sub):
    p = sub.add_parser("train", help="train a model", description="Train a model; options "
                       "left out come from the model's recipe (see `minidl models`).")
    p.add_argument("--model", help="default: cifar10_quick")
    p.add_argument("--dataset", choices=["cifar10", "fashion-mnist", "mnist"])
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"])
    p.add_argument("--lr", type=float)
    p.add_argument("--momentum", type=float)
    p.add_argument("--nesterov", action="store_true", default=None)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--lr-schedule", choices=["step", "cosine", "constant"],
                   help="step: the rate times 0.1 at 50%% and at 75%% of the run; cosine: "
                   "down to 0 along a half cosine; constant")
    p.add_argument("--warmup-epochs", type=float, help="the schedule's rate scaled by a "
                   "linear ramp up to 1 over these first epochs")
    p.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                   help="random crop + flip (default: the recipe's, else on for CIFAR-10)")
    p.add_argument("--data", help="data root (default: $MINIDL_DATA, else ~/.cache/minidl)")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="never fetch a missing data set")
    p.add_argument("--threads", type=int, help=THREADS_HELP.format(
        "; with several ranks, the host's cores divided among them"))
    p.add_argument("--seed", type=int, help="in [0, 2^32); default: 0")
    p.add_argument("--out", help="output directory (default: runs/MODEL)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run's checkpoint and metrics in --out")
    p.add_argument("--resume", metavar="CKPT", help="continue from a checkpoint, with its "
                   "settings (options that change the run's course may not differ; "
                   "--epochs may, to extend it)")
    p.add_argument("--limit-train", type=int, help="use only the first N training images")
    p.add_argument("--limit-test", type=int, help="use only the first N test images")
    p.add_argument("--plot", action="store_true", help="write curves.png (needs matplotlib)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    _device_options(p)
    _nproc_argument(p)
    p.add_argument("--sync-bn", action="store_true", default=None, help="BatchNorm "
                   "statistics over all ranks' batches (default: per rank)")
    _fuse_argument(p, None)
    p.set_defaults(run=_train)


def _fuse_argument(p, default=True):
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=default,
                   help="fuse Conv+BatchNorm+ReLU in training (the plan's pass `fusion`; "
                        "default: on)")


def _nproc_argument(p):
    p.add_argument("--nproc", type=int, help="data-parallel ranks on this machine, started "
                   "with mpiexec (--batch-size is the global batch; needs mpi4py)")
    p.add_argument("--grad-exchange", choices=["host", "device"], default="host",
                   help="reduce gradients from host buffers (works everywhere) or in device "
                   "memory (a CUDA-aware MPI on GPUs; sim's memory on sim)")


def _device_options(p):
    p.add_argument("--device", default="cpu", help="cpu, sim (a modelled GPU) or cuda[:N]")
    p.add_argument("--sim-memory", metavar="SIZE",
                   help="the sim device's memory budget, e.g. 512MB or 2GiB (default: none)")
    p.add_argument("--gpu-memory", metavar="SIZE", help="cap the GPU memory minidl uses "
                   "(default: $MINIDL_GPU_MEMORY_LIMIT, else all of it)")


def _train(a):
    from minidl.train import TrainConfig, train
    cfg = TrainConfig(**{f.name: getattr(a, f.name) for f in fields(TrainConfig)})
    train(cfg)
    return 0


def _eval(a):
    from minidl import checkpoint, data
    from minidl.runtime import Executor
    from minidl.train import TrainConfig, _plural, evaluate, make_loader
    if a.threads is not None:
        minidl.set_num_threads(a.threads)
    net, meta = checkpoint.load_net(a.checkpoint)
    saved = meta.get("config")
    # the settings this version knows (a checkpoint of another may hold more)
    saved = {f.name: saved[f.name] for f in fields(TrainConfig)
             if f.name in saved} if isinstance(saved, dict) else {}
    dataset = a.dataset or saved.get("dataset")
    if dataset not in data.DATASETS:
        raise ValueError(f"{a.checkpoint} names no data set this version knows "
                         f"({dataset!r}): give --dataset ({', '.join(data.DATASETS)})")
    cfg = TrainConfig(**{**saved, "data": a.data or saved.get("data"), "dataset": dataset,
                         "limit_test": a.limit_test, "download": a.download})
    test_loader = make_loader(cfg.resolved(), train=False)
    r = evaluate(Executor(net, batch_size=test_loader.batch_size), test_loader)
    print(f"{meta['model']} after {_plural(meta['epoch'], 'epoch')} on {cfg.dataset}: test "
          f"accuracy {r['acc']:.4f} (loss {r['loss']:.4f}, {len(test_loader.labels)} images)")
    return 0


def _bench(a):
    from minidl import bench, distributed
    comm = distributed.init()
    if a.nproc is not None and a.nproc != comm.size:
        raise ValueError(f"--nproc is {a.nproc} but this job runs {comm.size} rank(s)")
    device = from_options(distributed.local_device(a.device, comm), a.sim_memory,
                          a.gpu_memory)
    r = bench.run(a.model, a.batch_size, a.steps, a.threads, a.warmup, device=device,
                  comm=comm, exchange=a.grad_exchange, fuse=a.fuse)
    if comm.rank == 0:
        print(json.dumps(r) if a.json else bench.format_report(r))
    return 0


def _plan(a):
    from minidl import models
    from minidl.plan import make_plan
    plan = make_plan(models.build(a.model, seed=None), a.batch_size, device=a.device,
                     fuse=a.fuse)
    print(plan.to_json(indent=1) if a.json else plan)
    return 0


def _models(a):
    from minidl import models
    print(f"{'model':<15} {'parameters':>11}  {'input':<12} description")
    for name in models.names():
        info = models.info(name)
        n = models.build(name, seed=None).num_parameters()
        print(f"{name:<15} {n:>11,}  {str(info['input']):<12} {info['doc']}")
        print(" " * 17 + "recipe: " + " ".join(
            (f"--{k.replace('_', '-')}" if v else f"--no-{k}") if isinstance(v, bool)
            else f"--{k.replace('_', '-')} {v}" for k, v in info["train"].items()))
    return 0


def _flags(a):
    out = []
    if a.version:
        out.append(minidl.__version__)
    if a.cflags:
        out.append(f"-I{minidl.get_include()}")
    if a.libs:
        lib = minidl.get_library_dir()
        out.append(f"-L{lib} -Wl,-rpath,{lib} -lminidl")
    print(" ".join(out))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minidl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cflags", action="store_true", help="print the include flags")
    p.add_argument("--libs", action="store_true",
                   help="print the flags that link libminidl.so (with an rpath)")
    p.add_argument("--version", action="store_true", help="print the version")
    sub = p.add_subparsers(dest="command")
    _train_parser(sub)
    e = sub.add_parser("eval", help="test accuracy of a checkpoint")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--dataset", choices=["cifar10", "fashion-mnist", "mnist"])
    e.add_argument("--data")
    e.add_argument("--threads", type=int, help=THREADS_HELP.format(""))
    e.add_argument("--limit-test", type=int)
    e.add_argument("--no-download", dest="download", action="store_false",
                   help="never fetch a missing data set")
    e.set_defaults(run=_eval)
    b = sub.add_parser("bench", help="time training steps and inference on random data")
    b.add_argument("--model", default="cifar10_quick")
    b.add_argument("--batch-size", type=int, default=100)
    b.add_argument("--steps", type=int, default=20)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--threads", type=int, help=THREADS_HELP.format(""))
    b.add_argument("--json", action="store_true", help="print one JSON object")
    _device_options(b)
    _nproc_argument(b)
    _fuse_argument(b)
    b.set_defaults(run=_bench)
    pl = sub.add_parser("plan", help="print the plan of a model")
    pl.add_argument("--model", default="cifar10_quick")
    pl.add_argument("--batch-size", type=int, default=100)
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--device", default="cpu", help="the device the plan is for")
    _fuse_argument(pl)
    pl.set_defaults(run=_plan)
    m = sub.add_parser("models", help="list the models with their parameter counts "
                       "and training recipes")
    m.set_defaults(run=_models)
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.command is None:
        if not (a.cflags or a.libs or a.version):
            p.print_help()
            return 2
        return _flags(a)
    from minidl import distributed
    if getattr(a, "nproc", None) not in (None, 1) and not distributed.launched_by_mpi():
        return _launch(a.nproc, sys.argv[1:] if argv is None else argv)
    try:
        comm = distributed.init()
        return distributed.run_or_abort(comm, a.run, a)
    except KeyboardInterrupt:
        go_on = " (train: --resume the checkpoint in --out to go on)" * (a.command == "train")
        print(f"minidl {a.command}: interrupted{go_on}", file=sys.stderr)
        return 130
    except (ValueError, KeyError, RuntimeError, OSError, OutOfDeviceMemory,
            FloatingPointError) as e:  # the last: a diverging run's advice
        print(f"minidl {a.command}: error: {e}", file=sys.stderr)
        return 1


def _launch(nproc: int, argv) -> int:
    """Runs this same command as nproc MPI ranks on this machine."""
    if nproc < 1:
        print(f"minidl: error: --nproc must be a positive integer, got {nproc}", file=sys.stderr)
        return 2
    import os
    import shutil
    import subprocess
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    import importlib.util
    if mpiexec is None or importlib.util.find_spec("mpi4py") is None:
        print("minidl: error: --nproc needs MPI (mpiexec and mpi4py): pip install mpi4py mpich, "
              "or pip install '.[mpi]' in minidl's source tree", file=sys.stderr)
        return 1
    return subprocess.call([mpiexec, "-n", str(nproc), sys.executable, "-m", "minidl", *argv])
