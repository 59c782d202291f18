"""Data-parallel training over MPI: sharding, equivalence with one process, sync BN,
faults, checkpoints.  The multi-rank tests start 2 ranks with mpiexec and skip where
mpi4py or mpiexec is missing (`pip install '.[mpi]'` provides both)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from minidl import checkpoint, distributed
from minidl.data import DataLoader
from minidl.nn.layers import BatchNorm2d

from test_train import write_cifar_bin

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- one process: sharding and the no-op communicator --------------------------------

def _loader(n, batch, shard=(0, 1), augment=True):
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8)
    return DataLoader(images, np.arange(n, dtype=np.int64), batch, shuffle=True, seed=3,
                      mean=[0.5] * 3, std=[0.25] * 3, augment=augment, prefetch=0, shard=shard)


@pytest.mark.parametrize("n,batch,ranks", [(40, 8, 2), (45, 8, 2), (41, 8, 2), (43, 9, 3),
                                           (25, 6, 4)])
def test_shards_make_up_the_one_process_batches(n, batch, ranks):
    whole = _loader(n, batch)
    parts = [_loader(n, batch, (r, ranks)) for r in range(ranks)]
    assert len({len(p) for p in parts}) == 1
    for epoch in (0, 2):
        for loader in [whole, *parts]:
            loader.set_epoch(epoch)
        seen = []
        for i, batches in enumerate(zip(*parts)):
            assert all(len(y) >= 1 for _, y in batches)
            assert sum(len(y) for _, y in batches) == len(parts[0].rows(i))
            seen += [int(v) for _, y in batches for v in y]
            if len(parts[0].rows(i)) == len(whole.rows(i)):  # same batch as one process
                x1, y1 = whole._batch(epoch, np.random.default_rng([3, epoch]).permutation(n), i)
                np.testing.assert_array_equal(np.concatenate([x for x, _ in batches]), x1)
                np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), y1)
        assert sorted(seen) == list(range(n))  # every sample exactly once per epoch


def test_shard_arguments_are_checked():
    with pytest.raises(ValueError, match="rank 2 is not below"):
        _loader(10, 4, (2, 2))
    with pytest.raises(ValueError, match="3 samples cannot be shared by 4 ranks"):
        _loader(3, 4, (0, 4))
    with pytest.raises(ValueError, match="a batch of 3 cannot be shared by 4 ranks"):
        _loader(10, 3, (0, 4))
    for shard in ((0,), None, (0, 2, 1)):
        with pytest.raises(ValueError, match="shard must be a pair"):
            _loader(10, 4, shard)
    with pytest.raises(ValueError, match="no samples: the data set is empty"):
        _loader(0, 4)
    images = np.zeros((4, 3, 8, 8), np.uint8)
    for mean, std in (([np.nan] * 3, [0.25] * 3), ([0.5] * 3, [np.inf] * 3)):
        with pytest.raises(ValueError, match="mean must be finite and std positive and finite"):
            DataLoader(images, np.arange(4, dtype=np.int64), 2, shuffle=False, mean=mean, std=std)


class _TwoRanks(distributed.Comm):
    """Rank 1's view of a disagreement on the seed."""

    def allgather(self, value):
        return [value, {**value, "seed": 1}]


def test_one_process_comm_is_a_no_op():
    comm = distributed.Comm()
    a = np.arange(3.0)
    assert comm.size == 1 and comm.rank == 0
    np.testing.assert_array_equal(comm.allreduce(a), a)
    comm.check_same("anything", 1)
    assert comm.grad_scale(4, 4) == 1.0
    with pytest.raises(ValueError, match=r"rank 0 has \{'seed': 0\}, rank 1 has \{'seed': 1\}"):
        _TwoRanks().check_same("the configuration", {"seed": 0, "model": "m"})
    assert not distributed.launched_by_mpi() or "PMI_SIZE" in os.environ


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 7)])
def test_sync_batchnorm_path_equals_batchnorm_on_one_process(rng, shape):
    """The synchronised path (global sums, then normalise) computes what the fused
    kernel does when there is one rank."""
    plain, synced = BatchNorm2d(), BatchNorm2d()
    for layer in (plain, synced):
        layer.build([shape[1:]])
        layer.params["weight"].data[:] = np.linspace(0.5, 2, shape[1])
    synced.sync = distributed.Comm()
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    y1, s1 = plain.forward([x], True)
    y2, s2 = synced.forward([x], True)
    np.testing.assert_allclose(y2, y1, rtol=1e-5, atol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_allclose(synced.buffers[name], plain.buffers[name], rtol=1e-6)
    dx1, dx2 = plain.backward(dy, s1)[0], synced.backward(dy, s2)[0]
    np.testing.assert_allclose(dx2, dx1, rtol=1e-4, atol=1e-5)
    for p in ("weight", "bias"):
        np.testing.assert_allclose(synced.params[p].grad, plain.params[p].grad, rtol=1e-5,
                                   atol=1e-5)


class _TwoLikeRanks(distributed.Comm):
    """Sums as two ranks holding the same batch would give them."""

    def allreduce(self, a):
        return 2 * np.asarray(a)


def test_a_synchronised_batchnorm_takes_one_sample_per_rank():
    """Its statistics count every rank's samples, so a local batch of 1 is enough"""
    from minidl import Net, nn
    from minidl.runtime import Executor
    net = Net((4,))
    net.add("fc", nn.Linear(out_features=3))
    net.add("bn", BatchNorm2d())
    net.initialize(0)
    net.nodes["bn"].layer.sync = _TwoLikeRanks()
    loss, _ = Executor(net, batch_size=1).train_step(np.ones((1, 4), np.float32),
                                                     np.zeros(1, np.int64))
    assert np.isfinite(loss)


# ---- several ranks -------------------------------------------------------------------

def _mpiexec():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


try:
    import mpi4py  # noqa: F401
    HAVE_MPI = _mpiexec() is not None
except ImportError:
    HAVE_MPI = False


def mpi(test):
    """A multi-rank test: needs mpi4py and mpiexec; third-party, so not under sanitizers."""
    skip = pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec "
                              "(pip install '.[mpi]')")
    return pytest.mark.external(skip(test))

LIMIT = 60  # seconds: a job with a failed rank must be over well within this


def _env():
    env = dict(os.environ, MINIDL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    return env


def _run(args, ranks=1, script=None, timeout=120):
    """`minidl ARGS` (or a script) as `ranks` MPI ranks; returns the finished process."""
    cmd = [sys.executable, *(["-c", script] if script else ["-m", "minidl"]), *args]
    if ranks > 1:
        cmd = [_mpiexec(), "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    return write_cifar_bin(tmp_path_factory.mktemp("d") / "data", np.random.default_rng(0),
                           n_train=120, n_test=40)


def _train_args(root, out, model="cifar10_quick", batch=40, epochs=1, *extra):
    return ["train", "--model", model, "--dataset", "cifar10", "--data", str(root),
            "--out", str(out), "--epochs", str(epochs), "--batch-size", str(batch),
            "--no-progress", "--lr", "0.01", *extra]


def _params(out):
    return checkpoint.load(os.path.join(out, "checkpoint.safetensors"))[0]


def _rel_diff(a, b):
    return max(np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(b[k]), NOISE_NORM)
               for k in b if not k.endswith("num_batches_tracked"))


# relative L2 per tensor: float32 sums taken in another order.  Once the first step's
# rounding differs, each later step's results differ by the kernels' own rounding
# (Winograd F(4x4, 5x5): about 5e-6 of a convolution's largest output), so after 3
# steps the weights agree to 1e-8 - 4e-5.  Tensors whose exact gradient is zero or
# nearly (a convolution's bias ahead of a BatchNorm, the BatchNorm shifts, cifar10_quick's
# conv1 initialised at std 1e-4) hold little but that noise, norms of 1e-4 - 5e-3: their
# differences (up to 1.4e-6 in L2) count against NOISE_NORM instead of their own norm.
TOL = 3e-4
NOISE_NORM = 0.03


@mpi
@pytest.mark.parametrize("model,extra", [("cifar10_quick", ["--augment"]),
                                         ("cifar10_full", ["--sync-bn"])])
def test_two_ranks_follow_the_one_process_trajectory(cifar, tmp_path, model, extra):
    """2 ranks x batch 20 == 1 rank x batch 40, 3 steps with crops, flips, momentum and
    the cosine schedule; for the BN net with --sync-bn."""
    one = _run(_train_args(cifar, tmp_path / "one", model, 40, 1, *extra))
    two = _run(_train_args(cifar, tmp_path / "two", model, 40, 1, *extra), ranks=2)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    assert "2 ranks x batch 20" in two.stdout
    assert _rel_diff(_params(tmp_path / "two"), _params(tmp_path / "one")) < TOL
    m1, m2 = (json.loads((tmp_path / d / "metrics.jsonl").read_text()) for d in ("one", "two"))
    for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k


@mpi
@pytest.mark.parametrize("model,exchange,extra", [("cifar10_quick", "host", []),
                                                  ("cifar10_quick", "device", []),
                                                  ("cifar10_full", "host", ["--sync-bn"])])
def test_two_ranks_on_sim_follow_the_one_process_trajectory(cifar, tmp_path, model, exchange,
                                                            extra):
    """Gradients on a (simulated) device: staged through host buffers, or reduced in
    place in device memory as with a CUDA-aware MPI; synchronised BatchNorm there."""
    one = _run(_train_args(cifar, tmp_path / "one", model, 40, 1, *extra))
    two = _run(_train_args(cifar, tmp_path / "two", model, 40, 1, "--device", "sim",
                           "--grad-exchange", exchange, *extra), ranks=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert "device sim" in two.stdout
    assert _rel_diff(_params(tmp_path / "two"), _params(tmp_path / "one")) < TOL


@mpi
def test_batchnorm_statistics_are_per_rank_without_sync_bn(cifar, tmp_path):
    """The default keeps per-rank statistics, which the equivalence test would catch."""
    one = _run(_train_args(cifar, tmp_path / "one", "cifar10_full"))
    two = _run(_train_args(cifar, tmp_path / "two", "cifar10_full"), ranks=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert "BatchNorm statistics per rank" in two.stdout
    assert _rel_diff(_params(tmp_path / "two"), _params(tmp_path / "one")) > 100 * TOL
    # the test metrics are those of the checkpoint's (rank 0's) statistics, which after
    # 6 steps at a higher rate differ from rank 1's (test losses 0.13% apart when each
    # rank evaluated with its own)
    out = tmp_path / "stats"
    two = _run(_train_args(cifar, out, "cifar10_full", 12, 2, "--limit-train", "36", "--lr",
                           "0.05", "--lr-schedule", "constant"), ranks=2)
    ev = _run(["eval", "--checkpoint", str(out / "checkpoint.safetensors")])
    assert two.returncode == 0 and ev.returncode == 0, two.stderr + ev.stderr
    loss = float(re.search(r"\(loss ([0-9.]+),", ev.stdout).group(1))
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert loss == pytest.approx(row["test_loss"], rel=2e-4), ev.stdout


@mpi
def test_two_rank_resume_matches_an_uninterrupted_run(cifar, tmp_path):
    """Every rank resumes from rank 0's checkpoint (a constant learning rate, so that
    the first job's --epochs 1 does not change the schedule)."""
    sync = ["--sync-bn", "--lr-schedule", "constant"]
    whole = _run(_train_args(cifar, tmp_path / "whole", "cifar10_full", 40, 2, *sync), ranks=2)
    first = _run(_train_args(cifar, tmp_path / "part", "cifar10_full", 40, 1, *sync), ranks=2)
    assert whole.returncode == 0 and first.returncode == 0, whole.stderr + first.stderr
    ckpt = tmp_path / "part" / "checkpoint.safetensors"
    rest = _run(_train_args(cifar, tmp_path / "part", "cifar10_full", 40, 2, *sync,
                            "--resume", str(ckpt)), ranks=2)
    assert rest.returncode == 0, rest.stderr
    a, b = _params(tmp_path / "part"), _params(tmp_path / "whole")
    assert all(np.array_equal(a[k], b[k]) for k in b)
    assert len((tmp_path / "part" / "metrics.jsonl").read_text().splitlines()) == 2


FAIL_AT_STEP = """
import os, sys, signal
from minidl import cli
from minidl.runtime import Executor
how, argv = sys.argv[1], sys.argv[2:]
step = Executor.train_step
def failing(self, *a, **k):
    if int(os.environ["PMI_RANK"]) == 1 and self.step_count == 2:
        if how == "raise":
            raise RuntimeError("injected failure")
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, *a, **k)
Executor.train_step = failing
sys.exit(cli.main(argv))
"""


@mpi
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_rank_stops_the_job(cifar, tmp_path, how):
    t0 = time.monotonic()
    r = _run([how, *_train_args(cifar, tmp_path / "out", "cifar10_quick", 20, 3)], ranks=2,
             script=FAIL_AT_STEP, timeout=LIMIT + 30)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert took < LIMIT
    if how == "raise":
        assert "rank 1 of 2 failed: RuntimeError: injected failure" in r.stderr
    else:  # MPICH's launcher names a process id that it saw end badly: rank 1, or rank 0
        # when the launcher's own kill of it was seen first; the log maps either to its rank
        pid = re.search(r"PID (\d+) RUNNING AT", r.stdout).group(1)
        ranks = re.search(r"ranks \(pid@host:device\): (.*)", r.stdout).group(1)
        assert re.search(rf"\b[01]: {pid}@", ranks)


DISAGREE = """
import os, sys
from minidl import cli
sys.exit(cli.main(sys.argv[1:] + ["--seed", os.environ["PMI_RANK"]]))
"""


@mpi
def test_bad_configurations_are_clear_errors(cifar, tmp_path):
    r = _run(_train_args(cifar, tmp_path / "a", "cifar10_quick", 41), ranks=2)
    assert r.returncode != 0
    assert "global batch size 41 must be divisible by the 2 ranks" in r.stderr
    r = _run(_train_args(cifar, tmp_path / "b"), ranks=2, script=DISAGREE)
    assert r.returncode != 0
    assert "ranks disagree on the training configuration" in r.stderr
    r = _run(_train_args(cifar, tmp_path / "c", "cifar10_quick", 40, 1, "--nproc", "3"),
             ranks=2)
    assert r.returncode != 0 and "nproc is 3 but this job runs 2 rank(s)" in r.stderr
    r = _run(_train_args(cifar, tmp_path / "d", "cifar10_quick", 40, 1, "--grad-exchange",
                         "device"), ranks=2)
    assert r.returncode != 0 and "exchange 'device' needs a device other than the cpu" in r.stderr
    r = _run(_train_args(cifar, tmp_path / "e", "cifar10_quick", 40, 1, "--limit-test", "1"),
             ranks=2)
    assert r.returncode != 0 and "the test set: shard: 1 samples cannot be shared by 2" in r.stderr


@mpi
def test_bench_nproc_prints_one_global_report():
    r = _run(["bench", "--model", "cifar10_quick", "--batch-size", "16", "--steps", "2",
              "--warmup", "1", "--threads", "1", "--nproc", "2", "--json"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    rep = json.loads(lines[0])
    assert rep["ranks"] == 2 and rep["local_batch_size"] == 8 and rep["batch_size"] == 16
    grads = 145_578 * 4
    assert rep["bytes_exchanged_per_step"] == grads
    assert rep["comm_wait_ms_per_step"] >= 0 and rep["train_images_per_s"] > 0


@mpi
def test_the_mpi_fuzz_script_runs():
    """dev/fuzz_mpi.py, the longer run of random nets trained over 2 ranks against one
    process (sync BN and per rank, plain and fused, cpu and sim), for 2 seconds."""
    path = os.path.join(os.path.dirname(HERE), "dev", "fuzz_mpi.py")
    r = subprocess.run([_mpiexec(), "-n", "2", sys.executable, path, "7", "2"],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0 and "on 2 ranks, 0 failed" in r.stdout, r.stdout + r.stderr
