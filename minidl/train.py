"""The training loop: data, Net, Plan, executor, optimizer, schedule, evaluation,
checkpoints and metrics, for `minidl train` and for library users.

    from minidl.train import TrainConfig, train
    summary = train(TrainConfig(model="cifar10_quick", epochs=10, out="runs/quick"))

Deterministic: with the same seed and thread count, a run stopped after any epoch
and resumed from its checkpoint ends with the same parameters as an uninterrupted one.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Dict, Optional

import numpy as np

import minidl
from minidl import checkpoint, data, distributed, models
from minidl.device import canonical_name, from_options
from minidl.nn.layers import BatchNorm2d
from minidl.optim import OPTIMIZERS, make_schedule
from minidl.plan import make_plan
from minidl.runtime import Executor


@dataclass
class TrainConfig:
    """None means the model's own recipe (models/<name>.py TRAIN), else the default
    noted; resuming, the checkpoint's setting."""
    model: Optional[str] = None  # cifar10_quick
    dataset: Optional[str] = None
    epochs: Optional[int] = None
    batch_size: Optional[int] = None
    optimizer: Optional[str] = None
    lr: Optional[float] = None
    momentum: Optional[float] = None
    nesterov: Optional[bool] = None  # False
    weight_decay: Optional[float] = None
    lr_schedule: Optional[str] = None
    warmup_epochs: Optional[float] = None
    augment: Optional[bool] = None  # default: crop + flip for CIFAR-10 only
    data: Optional[str] = None
    download: bool = True  # fetch a missing data set (when the network allows)
    threads: Optional[int] = None
    seed: Optional[int] = None  # 0
    out: Optional[str] = None
    overwrite: bool = False  # replace the files of an earlier run in out
    resume: Optional[str] = None
    limit_train: Optional[int] = None
    limit_test: Optional[int] = None
    plot: bool = False
    progress: bool = True
    device: str = "cpu"                # cpu, sim, cuda or cuda:N
    sim_memory: Optional[str] = None   # the sim device's budget, e.g. "512MB"
    gpu_memory: Optional[str] = None   # a cap on the GPU's memory, e.g. "4GiB"
    nproc: Optional[int] = None  # ranks of a data-parallel job (checked against MPI's)
    sync_bn: Optional[bool] = None  # BatchNorm statistics over all ranks' batches (False)
    grad_exchange: str = "host"  # gradients reduced from host buffers or in device memory
    fuse: Optional[bool] = None  # Conv+BatchNorm+ReLU fused (the plan's pass `fusion`; True)

    def resolved(self) -> "TrainConfig":
        """A copy with every None filled in from the model's recipe and the defaults."""
        values = asdict(self)
        for name, default in _DEFAULTS.items():
            if values[name] is None:
                values[name] = default
        recipe = models.info(values["model"])["train"]
        if values["optimizer"] not in (None, recipe.get("optimizer")):
            # the recipe's rate and momentum are for its own optimizer
            recipe = {k: v for k, v in recipe.items() if k not in ("lr", "momentum")}
        for f in fields(self):
            if values[f.name] is None and f.name in recipe:
                values[f.name] = recipe[f.name]
        if values["augment"] is None:
            values["augment"] = values["dataset"] == "cifar10"
        if values["out"] is None:
            values["out"] = os.path.join("runs", values["model"])
        return TrainConfig(**values)

    def resumed(self) -> "TrainConfig":
        """A copy whose settings that decide the run's course (_RESUMED) come from the
        checkpoint of `resume` where they are None, and a setting given that differs
        from the checkpoint's is an error; _RESUMED_UNLESS_GIVEN ones may differ (a
        run may be extended, its data moved), but a run at its epochs is an error."""
        meta = checkpoint.load(self.resume, tensors=False)[2]
        saved, values = meta.get("config"), asdict(self)
        saved = saved if isinstance(saved, dict) else {}
        differ = []
        for name in _RESUMED + _RESUMED_UNLESS_GIVEN:
            if values[name] is None:
                values[name] = saved.get(name)
            elif name in _RESUMED and name in saved and values[name] != saved[name]:
                differ.append(f"{name} {values[name]!r} (the checkpoint's: {saved[name]!r})")
        if differ:
            raise ValueError(f"{self.resume} was trained with other settings: "
                             f"{'; '.join(differ)}; leave these options out to resume it")
        done = int(meta.get("epoch", 0))
        if values["epochs"] is not None and done >= values["epochs"]:
            raise ValueError(f"{self.resume} has trained {done} of {values['epochs']} epochs "
                             f"already: give --epochs above {done} to extend the run")
        return TrainConfig(**values)


_DEFAULTS = {"model": "cifar10_quick", "nesterov": False, "seed": 0, "sync_bn": False,
             "fuse": True}
# what a run's course depends on: resuming, the checkpoint's unless given
_RESUMED = ("model", "dataset", "batch_size", "optimizer", "lr", "momentum", "nesterov",
            "weight_decay", "lr_schedule", "warmup_epochs", "augment", "seed", "limit_train",
            "sync_bn", "fuse")
_RESUMED_UNLESS_GIVEN = ("epochs", "limit_test", "data")


def _check(cfg: TrainConfig) -> None:
    for name in ("epochs", "batch_size"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    for name in ("limit_train", "limit_test"):
        v = getattr(cfg, name)
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if cfg.lr is None:
        raise ValueError(f"give --lr: the recipe of {cfg.model} has none for {cfg.optimizer}")
    if cfg.optimizer != "sgd" and (cfg.momentum or cfg.nesterov) and not cfg.resume:
        raise ValueError(f"momentum and nesterov are sgd's; {cfg.optimizer} has its own "
                         "betas")
    if not 0 < cfg.lr < math.inf:
        raise ValueError(f"lr must be a positive finite number, got {cfg.lr!r}")
    for name in ("momentum", "weight_decay", "warmup_epochs"):
        v = getattr(cfg, name)
        if v is not None and not 0 <= v < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    # below 2^32: the loader's streams take [seed, epoch], which SeedSequence reads as
    # 32-bit words (2^32 + s would give seed s's next epoch), and each rank's dropout
    # stream seed + (rank << 32)
    if cfg.seed is not None and (isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int)
                                 or not 0 <= cfg.seed < 1 << 32):
        raise ValueError(f"seed must be an integer in [0, 2^32), got {cfg.seed!r}")
    if cfg.threads is not None and cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: the default), got {cfg.threads!r}")
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose {', '.join(OPTIMIZERS)}")
    if cfg.dataset not in data.DATASETS:
        raise ValueError(f"unknown dataset {cfg.dataset!r}; choose {', '.join(data.DATASETS)}")


def _optimizer(cfg: TrainConfig, net):
    kw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay or 0.0)
    if cfg.optimizer == "sgd":
        kw.update(momentum=cfg.momentum or 0.0, nesterov=cfg.nesterov)
    return OPTIMIZERS[cfg.optimizer](net.parameters(), **kw)


def evaluate(executor: Executor, loader, comm: Optional[distributed.Comm] = None
             ) -> Dict[str, float]:
    """Mean loss and accuracy of the net over a loader, in evaluation mode (over all
    ranks' shards of it when comm is given)."""
    total, loss_sum, correct = 0, 0.0, 0
    for x, y in loader:
        logits = executor.predict(x)
        loss, _ = executor.loss(logits, y)
        loss_sum += loss * len(y)
        correct += int((logits.argmax(1) == y).sum())
        total += len(y)
    if comm is not None:
        total, loss_sum, correct = comm.allreduce(np.array([total, loss_sum, correct]))
    return {"loss": loss_sum / max(total, 1), "acc": correct / max(total, 1)}


def make_loader(cfg: TrainConfig, train: bool, shard=(0, 1)):
    """The training loader (shuffled, augmented as cfg says) or the test loader; with
    shard=(rank, ranks), that rank's part of every batch."""
    info = data.DATASETS[cfg.dataset]
    images, labels = data.load_dataset(cfg.dataset, data.data_root(cfg.data), train,
                                       cfg.download)
    limit = cfg.limit_train if train else cfg.limit_test
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    # evaluation in batches of at least 256 on the cpu; on a device in the training batch,
    # whose forward fits wherever its training step does
    eval_batch = max(cfg.batch_size, 256) if canonical_name(cfg.device) == "cpu" \
        else cfg.batch_size
    try:
        return data.DataLoader(images, labels, cfg.batch_size if train else eval_batch,
                               shuffle=train, augment=train and cfg.augment, mean=info.mean,
                               std=info.std, seed=cfg.seed, shard=shard)
    except ValueError as e:
        raise ValueError(f"the {'training' if train else 'test'} set: {e}") from None


def train(config: TrainConfig, log=print) -> Dict:
    """Trains as config says; returns the summary (also the last line of metrics.jsonl's
    run).  Writes checkpoint.safetensors and metrics.jsonl (and curves.png with plot).

    Started as several MPI ranks, each trains on its part of every global batch of
    config.batch_size and the ranks' gradients are summed into that of the global
    batch (minidl.distributed); rank 0 alone logs and writes files."""
    cfg = (config.resumed() if config.resume else config).resolved()
    _check(cfg)
    if cfg.data is not None:  # the checkpoint's, for eval and resume from anywhere
        cfg = replace(cfg, data=os.path.abspath(cfg.data))
    if cfg.plot:
        _matplotlib()  # fails before the run, not after it
    comm = distributed.init()
    _check_ranks(cfg, comm)
    if comm.rank != 0:
        log = _quiet
        cfg = TrainConfig(**{**asdict(cfg), "progress": False})
    device = from_options(distributed.local_device(cfg.device, comm), cfg.sim_memory,
                          cfg.gpu_memory)  # fails early
    if cfg.threads:
        minidl.set_num_threads(cfg.threads)
    elif comm.size > 1 and not os.environ.get("MINIDL_NUM_THREADS"):
        # share the cores this process may use among the host's ranks
        minidl.set_num_threads(max(1, len(os.sched_getaffinity(0)) // comm.local_size))
    elif cfg.threads == 0:
        minidl.set_num_threads(0)
    out = Path(cfg.out)
    if comm.rank == 0:
        _check_out(cfg, out)
    shard = (comm.rank, comm.size)
    train_loader, test_loader = make_loader(cfg, True, shard), make_loader(cfg, False, shard)
    num_classes = len(data.DATASETS[cfg.dataset].classes)
    net = models.build(cfg.model, train_loader.images.shape[1:], num_classes, seed=cfg.seed)
    comm.check_same("the data", (len(train_loader.labels), len(test_loader.labels),
                                 train_loader.images.shape[1:]))
    comm.check_same("the model", (net.name, net.num_parameters()))
    comm.broadcast([p.data for p in net.parameters().values()] + list(net.buffers().values()))
    if cfg.sync_bn and comm.size > 1:
        for _, node in net.layers():
            if isinstance(node.layer, BatchNorm2d):
                node.layer.sync = comm
    net.to(device)
    opt = _optimizer(cfg, net)
    local_batch = cfg.batch_size // comm.size
    executor = Executor(net, make_plan(net, local_batch, optimizer_slots=len(opt.slots),
                                       device=device, fuse=cfg.fuse),
                        seed=cfg.seed + (comm.rank << 32))  # own dropout masks per rank
    # a last batch that takes the remainder gives some ranks one sample more: checked
    # now, not after an epoch
    largest = max(len(train_loader.rows(i)) for i in range(len(train_loader)))
    executor.check_budget(-(-largest // comm.size))
    reducer = distributed.GradientReducer(net, comm, exchange=cfg.grad_exchange)
    if comm.size > 1:
        executor.backward_hook = reducer.ready
    steps_per_epoch = len(train_loader)
    schedule = make_schedule(cfg.lr_schedule, cfg.lr, cfg.epochs * steps_per_epoch,
                             warmup_steps=round((cfg.warmup_epochs or 0) * steps_per_epoch))
    start_epoch, history = 0, []
    if cfg.resume:
        net_state, opt_state, meta = checkpoint.load(cfg.resume)
        net.load_state_dict(net_state)
        opt.load_state_dict(opt_state)
        start_epoch = int(meta["epoch"])
        executor.step_count = int(meta["rng"]["step_count"])
        history = list(meta.get("history", []))
        log(f"resumed from {cfg.resume} after epoch {start_epoch}")
    metrics_path = out / "metrics.jsonl"
    if comm.rank == 0:  # the checkpoint's epochs, none of a run or an epoch it lacks
        out.mkdir(parents=True, exist_ok=True)
        metrics_path.write_text("".join(json.dumps(row) + "\n" for row in history))
    ranks = (f", {comm.size} ranks x batch {local_batch} (BatchNorm statistics "
             f"{'over all ranks' if cfg.sync_bn else 'per rank'})" if comm.size > 1 else "")
    log(f"training {cfg.model} ({net.num_parameters():,} parameters) on {cfg.dataset}: "
        f"{len(train_loader.labels):,} train / {len(test_loader.labels):,} test images, "
        f"batch {cfg.batch_size}, {_plural(cfg.epochs, 'epoch')}, "
        f"{_plural(minidl.get_num_threads(), 'thread')}"
        f"{' per rank' if comm.size > 1 else ''}, device {device.name}{ranks}")
    if comm.size > 1:  # so that a launcher's report of a dead process id names its rank
        where = comm.allgather(f"{os.getpid()}@{socket.gethostname()}:{device.name}")
        log("ranks (pid@host:device): " + ", ".join(f"{r}: {w}" for r, w in enumerate(where)))
    run_start = time.perf_counter() - (history[-1]["wall_s"] if history else 0.0)
    for epoch in range(start_epoch, cfg.epochs):
        row = _epoch(cfg, epoch, executor, opt, schedule, train_loader, test_loader,
                     steps_per_epoch, comm, reducer)
        row["wall_s"] = round(time.perf_counter() - run_start, 3)
        history.append(row)
        if comm.rank == 0:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            checkpoint.save(out / "checkpoint.safetensors", net, opt, epoch=epoch + 1,
                            global_step=(epoch + 1) * steps_per_epoch, config=asdict(cfg),
                            rng={"seed": cfg.seed, "step_count": executor.step_count},
                            history=history)
        log(f"epoch {epoch + 1}/{cfg.epochs}: train loss {row['train_loss']:.4f} "
            f"acc {row['train_acc']:.4f}, test loss {row['test_loss']:.4f} "
            f"acc {row['test_acc']:.4f}, {row['images_per_s']:.0f} images/s, "
            f"{row['wall_s']:.0f} s")
    summary = summarize(cfg, history)
    log(f"done: final test accuracy {summary['final_test_acc']:.4f}, best "
        f"{summary['best_test_acc']:.4f}, {summary['wall_s']:.0f} s, "
        f"{summary['images_per_s']:.0f} images/s")
    if cfg.plot and comm.rank == 0:
        plot(history, out / "curves.png")
    comm.barrier()  # the checkpoint is complete before any rank returns
    return summary


def _check_out(cfg: TrainConfig, out: Path) -> None:
    """An earlier run's checkpoint and metrics in out are replaced only with overwrite,
    or continued by resuming that checkpoint."""
    ckpt, metrics = out / "checkpoint.safetensors", out / "metrics.jsonl"
    if cfg.overwrite or (cfg.resume and ckpt.exists() and ckpt.samefile(cfg.resume)):
        return
    found = [p.name for p in (ckpt, metrics) if p.exists() and p.stat().st_size > 0]
    if found:
        resume = f"continue it with --resume {ckpt}, " if ckpt.exists() else ""
        raise FileExistsError(f"{out} holds an earlier run ({', '.join(found)}): {resume}"
                              "write to another --out, or replace it with --overwrite")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _quiet(*args, **kwargs) -> None:
    pass


def _check_ranks(cfg: TrainConfig, comm) -> None:
    if cfg.nproc is not None and cfg.nproc != comm.size:
        raise ValueError(f"nproc is {cfg.nproc} but this job runs {comm.size} rank(s); start "
                         f"it with `minidl train --nproc N` or `mpiexec -n N minidl train`")
    if cfg.batch_size % comm.size:
        raise ValueError(f"the global batch size {cfg.batch_size} must be divisible by the "
                         f"{comm.size} ranks")
    per_host = {k: v for k, v in asdict(cfg).items() if k not in ("threads", "progress")}
    comm.check_same("the training configuration", per_host)


def _epoch(cfg, epoch, executor, opt, schedule, train_loader, test_loader, steps_per_epoch,
           comm, reducer):
    train_loader.set_epoch(epoch)
    bar = _progress(cfg, epoch, steps_per_epoch)
    seen = correct = 0
    loss_sum = 0.0
    busy = 0.0
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(train_loader):
        ts = time.perf_counter()
        opt.lr = schedule(epoch * steps_per_epoch + i)
        loss, logits = executor.train_step(
            x, y, grad_scale=comm.grad_scale(len(y), len(train_loader.rows(i))))
        if not np.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at epoch {epoch + 1}, batch {i}; "
                                     f"try a smaller learning rate (now {opt.lr:g})")
        reducer.finish()
        opt.step()
        busy += time.perf_counter() - ts
        seen += len(y)
        loss_sum += loss * len(y)
        correct += int((logits.argmax(1) == y).sum())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.4f}",
                            img_s=f"{comm.size * seen / (time.perf_counter() - t0):.0f}",
                            refresh=False)
    if bar is not None:
        bar.close()
    epoch_s = time.perf_counter() - t0
    seen, loss_sum, correct = comm.allreduce(np.array([seen, loss_sum, correct], np.float64))
    if not cfg.sync_bn:  # evaluate the statistics the checkpoint keeps
        distributed.broadcast_buffers(executor.net, comm)
    test = evaluate(executor, test_loader, comm)
    return {"epoch": epoch + 1, "lr": opt.lr, "train_loss": loss_sum / seen,
            "train_acc": correct / seen, "test_loss": test["loss"], "test_acc": test["acc"],
            "images_per_s": seen / epoch_s, "step_images_per_s": seen / busy,
            "epoch_s": round(epoch_s, 3)}


def _progress(cfg, epoch, total):
    if not cfg.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch",
                file=sys.stderr, dynamic_ncols=True, leave=False)


def summarize(cfg: TrainConfig, history) -> Dict:
    total_images = sum(r["images_per_s"] * r["epoch_s"] for r in history)
    train_s = sum(r["epoch_s"] for r in history)
    return {"model": cfg.model, "dataset": cfg.dataset, "epochs": len(history),
            "final_test_acc": history[-1]["test_acc"],
            "best_test_acc": max(r["test_acc"] for r in history),
            "wall_s": history[-1]["wall_s"], "images_per_s": total_images / train_s}


def _matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib (or minidl's "
                           "extra: pip install '.[plot]' in its source tree)") from None
    return plt


def plot(history, path) -> None:
    """Loss and accuracy curves per epoch as a PNG (needs matplotlib)."""
    plt = _matplotlib()
    ep = [r["epoch"] for r in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ep, [r["train_loss"] for r in history], "o-", label="train")
    a.plot(ep, [r["test_loss"] for r in history], "o-", label="test")
    a.set(xlabel="epoch", ylabel="loss", title="loss")
    b.plot(ep, [r["train_acc"] for r in history], "o-", label="train")
    b.plot(ep, [r["test_acc"] for r in history], "o-", label="test")
    b.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for ax in (a, b):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
