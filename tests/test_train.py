"""The training loop, checkpoints and resume, and the command line, on small data sets
written here in the official file layouts."""
import gzip
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from minidl import checkpoint, cli, models, safetensors
from minidl.train import TrainConfig, train


def _patterns(rng, n, shape, classes=10):
    """Learnable images: each class a fixed random pattern plus noise, as uint8."""
    protos = rng.uniform(40, 215, (classes, *shape))
    labels = rng.integers(0, classes, n)
    images = protos[labels] + rng.normal(0, 25, (n, *shape))
    return np.clip(images, 0, 255).astype(np.uint8), labels


def write_cifar_bin(root, rng, n_train=160, n_test=60):
    d = root / "cifar-10-batches-bin"
    d.mkdir(parents=True)
    images, labels = _patterns(rng, n_train + n_test, (3, 32, 32))
    recs = np.concatenate([labels[:, None].astype(np.uint8), images.reshape(len(labels), -1)], 1)
    train, test = recs[:n_train], recs[n_train:]
    for i, part in enumerate(np.array_split(train, 5), start=1):
        part.tofile(d / f"data_batch_{i}.bin")
    test.tofile(d / "test_batch.bin")
    return root


def write_idx(root, rng, name="mnist", n_train=256, n_test=64):
    d = root / name
    d.mkdir(parents=True)
    images, labels = _patterns(rng, n_train + n_test, (28, 28))
    for prefix, sl in (("train", slice(0, n_train)), ("t10k", slice(n_train, None))):
        im, lb = images[sl], labels[sl].astype(np.uint8)
        with gzip.open(d / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 2051, len(im), 28, 28) + im.tobytes())
        (d / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, len(lb))
                                                        + lb.tobytes())
    return root


@pytest.fixture
def mnist_root(tmp_path, rng):
    return write_idx(tmp_path / "data", rng)


@pytest.fixture
def cifar_root(tmp_path, rng):
    return write_cifar_bin(tmp_path / "data", rng)


def lenet_config(root, out, **kw):
    base = dict(model="lenet", dataset="mnist", data=str(root), out=str(out), epochs=2,
                batch_size=32, lr=0.01, progress=False, download=False)
    base.update(kw)
    return TrainConfig(**base)


def test_training_learns_and_writes_metrics_and_checkpoint(mnist_root, tmp_path):
    out = tmp_path / "run"
    summary = train(lenet_config(mnist_root, out), log=lambda *a: None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    for key in ("epoch", "train_loss", "train_acc", "test_loss", "test_acc", "images_per_s",
                "wall_s", "lr"):
        assert all(key in r for r in rows)
    assert rows[1]["train_loss"] < rows[0]["train_loss"]
    assert rows[1]["test_acc"] > 0.9          # the patterns are easy to tell apart
    assert rows[1]["wall_s"] >= rows[0]["wall_s"] > 0
    assert summary["final_test_acc"] == rows[1]["test_acc"]
    assert summary["best_test_acc"] == max(r["test_acc"] for r in rows)
    net, meta = checkpoint.load_net(out / "checkpoint.safetensors")
    assert meta["epoch"] == 2 and meta["model"] == "lenet" and meta["input_shape"] == [1, 28, 28]
    assert set(net.state_dict()) == set(models.build("lenet", seed=None).state_dict())
    tensors, _ = safetensors.load(out / "checkpoint.safetensors")
    assert "optimizer.momentum_buffer.conv1.weight" in tensors and "conv1.weight" in tensors


@pytest.mark.parametrize("meta", [dict(input_shape=None), dict(input_shape=[1, 0, 28]),
                                  dict(model=["lenet"]), dict(num_classes=True),
                                  dict(num_classes=10 ** 9), dict(num_classes=-1)])
def test_load_net_refuses_metadata_that_does_not_describe_the_tensors(tmp_path, meta):
    path = tmp_path / "c.safetensors"
    checkpoint.save(path, models.build("lenet", seed=0), None, **meta)
    with pytest.raises(safetensors.SafetensorsError, match="do not describe a net"):
        checkpoint.load_net(path)


def test_resume_ends_where_an_uninterrupted_run_ends(cifar_root, tmp_path, monkeypatch):
    """BatchNorm, momentum, a cosine schedule with warm-up, shuffling and crop + flip:
    3 epochs in one go equal 1 epoch, a crash, and a resume, bit for bit."""
    kw = dict(model="cifar10_full", dataset="cifar10", epochs=3, batch_size=32, lr=0.02,
              lr_schedule="cosine", warmup_epochs=1, augment=True)
    whole = tmp_path / "whole"
    train(lenet_config(cifar_root, whole, **kw), log=lambda *a: None)

    import minidl.train as T
    real_epoch = T._epoch

    def crash_in_second_epoch(cfg, epoch, *a):
        if epoch == 1:
            raise KeyboardInterrupt
        return real_epoch(cfg, epoch, *a)

    part = tmp_path / "part"
    monkeypatch.setattr(T, "_epoch", crash_in_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        train(lenet_config(cifar_root, part, **kw), log=lambda *a: None)
    monkeypatch.setattr(T, "_epoch", real_epoch)
    assert checkpoint.load(part / "checkpoint.safetensors")[2]["epoch"] == 1
    train(lenet_config(cifar_root, part, resume=str(part / "checkpoint.safetensors"), **kw),
          log=lambda *a: None)
    a, _ = safetensors.load(whole / "checkpoint.safetensors")
    b, _ = safetensors.load(part / "checkpoint.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    rows = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]


def test_resume_takes_the_checkpoints_settings_and_refuses_others(mnist_root, tmp_path):
    out = tmp_path / "run"
    ckpt = str(out / "checkpoint.safetensors")
    train(lenet_config(mnist_root, out, epochs=1, seed=3, limit_train=96, lr_schedule="cosine"),
          log=lambda *a: None)
    first = checkpoint.load(ckpt)[2]["config"]
    # only where the data is and the epochs: the rest is the checkpoint's
    train(TrainConfig(resume=ckpt, epochs=2, data=str(mnist_root), out=str(out), progress=False,
                      download=False), log=lambda *a: None)
    meta = checkpoint.load(ckpt)[2]
    assert meta["epoch"] == 2
    assert {k: v for k, v in meta["config"].items() if k not in ("epochs", "resume")} == \
        {k: v for k, v in first.items() if k not in ("epochs", "resume")}
    for kw, match in ((dict(model="resnet20"), "model 'resnet20' \\(the checkpoint's: 'lenet'\\)"),
                      (dict(batch_size=64, lr=0.5), "batch_size 64 .*; lr 0.5 \\(the checkpoint's: 0.01\\)"),
                      (dict(seed=0), "seed 0 \\(the checkpoint's: 3\\)"),
                      (dict(fuse=False), "fuse False")):
        with pytest.raises(ValueError, match=f"{ckpt} was trained with other settings: {match}"):
            train(TrainConfig(resume=ckpt, data=str(mnist_root), out=str(tmp_path / "b"),
                              progress=False, download=False, **kw), log=lambda *a: None)


def test_bad_configuration_is_a_clear_error(mnist_root, tmp_path):
    for kw, match in ((dict(epochs=0), "epochs must be a positive integer"),
                      (dict(lr=-1.0), "lr must be a positive finite number"),
                      (dict(lr=float("nan")), "lr must be a positive finite number"),
                      (dict(lr=float("inf")), "lr must be a positive finite number"),
                      (dict(momentum=-0.5), "momentum must be a finite number >= 0"),
                      (dict(weight_decay=float("nan")), "weight_decay must be a finite"),
                      (dict(warmup_epochs=-1.0), "warmup_epochs must be a finite"),
                      (dict(threads=-2), r"threads must be >= 0 \(0: the default\)"),
                      (dict(seed=1 << 32), r"seed must be an integer in \[0, 2\^32\)"),
                      (dict(seed=-1), r"seed must be an integer in \[0, 2\^32\)"),
                      (dict(optimizer="lbfgs"), "unknown optimizer 'lbfgs'"),
                      (dict(optimizer="adam", lr=None), "give --lr: the recipe of lenet has "
                       "none for adam"),
                      (dict(optimizer="adam", momentum=0.9), "momentum and nesterov are sgd's"),
                      (dict(optimizer="adamw", nesterov=True), "momentum and nesterov are sgd's"),
                      (dict(model="nope"), "unknown model 'nope'")):
        with pytest.raises(ValueError, match=match):
            train(lenet_config(mnist_root, tmp_path / "x", **kw), log=lambda *a: None)


def test_adam_takes_no_sgd_recipe_settings(mnist_root, tmp_path):
    out = tmp_path / "adam"
    train(lenet_config(mnist_root, out, optimizer="adam", lr=1e-3, epochs=1, limit_train=64),
          log=lambda *a: None)
    _, opt_state, meta = checkpoint.load(out / "checkpoint.safetensors")
    assert meta["config"]["momentum"] is None and meta["config"]["lr"] == 1e-3
    assert any(k.startswith("exp_avg_sq.") for k in opt_state)


def test_plot_without_matplotlib_fails_before_training(mnist_root, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    with pytest.raises(RuntimeError, match="--plot needs matplotlib: pip install matplotlib"):
        train(lenet_config(mnist_root, tmp_path / "x", plot=True), log=lambda *a: None)
    assert not (tmp_path / "x").exists()


def test_a_diverging_run_stops_with_advice(mnist_root, tmp_path):
    with pytest.raises(FloatingPointError, match="smaller learning rate"):
        train(lenet_config(mnist_root, tmp_path / "x", lr=1e6), log=lambda *a: None)


def run_cli(*args):
    return cli.main([str(a) for a in args])


def test_an_earlier_run_is_replaced_only_when_asked(mnist_root, tmp_path, capsys):
    out, other = tmp_path / "run", tmp_path / "other"
    cfg = dict(epochs=1, limit_train=64)
    train(lenet_config(mnist_root, out, **cfg), log=lambda *a: None)
    train(lenet_config(mnist_root, other, seed=1, **cfg), log=lambda *a: None)
    ckpt = out / "checkpoint.safetensors"
    before = ckpt.read_bytes(), (out / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match=f"{out} holds an earlier run "
                       r"\(checkpoint.safetensors, metrics.jsonl\): continue it with --resume"):
        train(lenet_config(mnist_root, out, **cfg), log=lambda *a: None)
    # another run's checkpoint resumed into out would replace out's as well
    with pytest.raises(FileExistsError, match="holds an earlier run"):
        train(TrainConfig(resume=str(other / "checkpoint.safetensors"), epochs=2, out=str(out),
                          data=str(mnist_root), progress=False, download=False),
              log=lambda *a: None)
    assert run_cli("train", "--model", "lenet", "--dataset", "mnist", "--data", mnist_root,
                   "--epochs", 1, "--out", out, "--no-progress", "--no-download") == 1
    assert "replace it with --overwrite" in capsys.readouterr().err
    assert (ckpt.read_bytes(), (out / "metrics.jsonl").read_text()) == before
    # resuming out's own checkpoint continues it; overwrite starts afresh
    train(TrainConfig(resume=str(ckpt), epochs=2, out=str(out), data=str(mnist_root),
                      progress=False, download=False), log=lambda *a: None)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    train(lenet_config(mnist_root, out, seed=1, overwrite=True, **cfg), log=lambda *a: None)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    mine, theirs = checkpoint.load(ckpt)[0], checkpoint.load(other / "checkpoint.safetensors")[0]
    for k in theirs:
        np.testing.assert_array_equal(mine[k], theirs[k], err_msg=k)


def test_cli_train_eval_plan_bench_models(mnist_root, tmp_path, capsys):
    out = tmp_path / "cli"
    assert run_cli("train", "--model", "lenet", "--dataset", "mnist", "--data", mnist_root,
                   "--epochs", 1, "--batch-size", 64, "--lr", 0.01, "--momentum", 0.9,
                   "--weight-decay", 5e-4, "--lr-schedule", "step", "--threads", 1, "--seed", 3,
                   "--out", out, "--limit-train", 128, "--no-progress", "--no-download") == 0
    text = capsys.readouterr().out
    assert "epoch 1/1" in text and "final test accuracy" in text
    row = json.loads((out / "metrics.jsonl").read_text())
    assert row["epoch"] == 1
    cfg = checkpoint.load(out / "checkpoint.safetensors")[2]["config"]
    assert cfg["seed"] == 3 and cfg["limit_train"] == 128 and cfg["weight_decay"] == 5e-4

    assert run_cli("eval", "--checkpoint", out / "checkpoint.safetensors", "--data",
                   mnist_root) == 0
    text = capsys.readouterr().out
    assert f"test accuracy {row['test_acc']:.4f}" in text

    assert run_cli("bench", "--model", "lenet", "--batch-size", 4, "--steps", 2, "--warmup", 1,
                   "--threads", 1, "--json") == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("train_images_per_s", "infer_images_per_s", "peak_rss_mb"):
        assert r[key] > 0
    assert [layer["name"] for layer in r["layers"]][:2] == ["conv1", "pool1"]
    assert all(layer["forward_ms"] >= 0 and layer["backward_ms"] >= 0 for layer in r["layers"])

    assert run_cli("plan", "--model", "resnet20", "--batch-size", 8, "--json") == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 8
    assert run_cli("plan", "--model", "cifar10_quick") == 0
    assert "predicted peak" in capsys.readouterr().out
    assert run_cli("models") == 0
    text = capsys.readouterr().out
    assert "cifar10_quick" in text and "145,578" in text and "resnet110" in text
    assert "recipe: --dataset cifar10 --epochs 10 --batch-size 100 --optimizer sgd" in text
    assert "--no-augment\n" in text
    assert "with BatchNorm after every convolution, for 32x32 images\n" in text


def _epochs(out):
    return [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_metrics_hold_the_checkpoints_epochs(mnist_root, tmp_path, monkeypatch):
    import minidl.train as T
    kw = dict(limit_train=64, epochs=2)
    out, copy, other = tmp_path / "run", tmp_path / "copy", tmp_path / "other"
    real_save = T.checkpoint.save

    def fail_second(path, *a, epoch, **k):  # as a kill after an epoch's metrics line
        if epoch == 2:
            raise KeyboardInterrupt
        real_save(path, *a, epoch=epoch, **k)

    monkeypatch.setattr(T.checkpoint, "save", fail_second)
    with pytest.raises(KeyboardInterrupt):
        train(lenet_config(mnist_root, out, **kw), log=lambda *a: None)
    monkeypatch.setattr(T.checkpoint, "save", real_save)
    assert _epochs(out) == [1, 2]  # the checkpoint holds 1
    ckpt = str(out / "checkpoint.safetensors")
    resume = dict(data=str(mnist_root), progress=False, download=False)
    train(TrainConfig(resume=ckpt, out=str(out), **resume), log=lambda *a: None)
    assert _epochs(out) == [1, 2]
    # another directory: the checkpoint's epochs first, whatever was there with overwrite
    train(TrainConfig(resume=ckpt, out=str(copy), epochs=3, **resume), log=lambda *a: None)
    assert _epochs(copy) == [1, 2, 3]
    train(lenet_config(mnist_root, other, limit_train=64, epochs=1, seed=5), log=lambda *a: None)
    train(TrainConfig(resume=ckpt, out=str(other), epochs=3, overwrite=True, **resume),
          log=lambda *a: None)
    assert _epochs(other) == [1, 2, 3]
    with pytest.raises(ValueError, match="has trained 2 of 2 epochs already: give --epochs "
                       "above 2 to extend the run"):
        train(TrainConfig(resume=ckpt, out=str(out), **resume), log=lambda *a: None)


def test_the_data_root_is_kept_absolute(mnist_root, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(mnist_root.parent)
    out = tmp_path / "run"
    train(lenet_config(mnist_root.name, out, epochs=1, limit_train=64), log=lambda *a: None)
    assert checkpoint.load(out / "checkpoint.safetensors")[2]["config"]["data"] == str(mnist_root)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert run_cli("eval", "--checkpoint", out / "checkpoint.safetensors", "--no-download") == 0
    assert "lenet after 1 epoch on mnist" in capsys.readouterr().out


def test_eval_of_a_checkpoint_from_another_version(mnist_root, tmp_path, capsys):
    out = tmp_path / "run"
    train(lenet_config(mnist_root, out, epochs=1, limit_train=64), log=lambda *a: None)
    tensors, meta = safetensors.load(out / "checkpoint.safetensors")
    config = json.loads(meta["config"])
    for change, result in (({**config, "a_later_setting": 1}, "test accuracy"),
                           (None, "names no data set this version knows (None): give --dataset"),
                           ({**config, "dataset": "imagenet"}, "('imagenet'): give --dataset")):
        path = tmp_path / "other.safetensors"
        safetensors.save(path, tensors, {**meta, "config": json.dumps(change)})
        code = run_cli("eval", "--checkpoint", path, "--no-download")
        text = capsys.readouterr()
        assert result in (text.out if code == 0 else text.err), text


def test_ctrl_c_is_one_line(monkeypatch, capsys):
    import minidl.train as T

    def interrupted(cfg):
        raise KeyboardInterrupt
    monkeypatch.setattr(T, "train", interrupted)
    assert run_cli("train", "--model", "lenet") == 130
    assert capsys.readouterr().err == ("minidl train: interrupted (train: --resume the "
                                      "checkpoint in --out to go on)\n")


def test_a_layer_named_optimizer_is_refused_by_checkpoints(tmp_path):
    from minidl import nn
    from minidl.graph import Net
    net = Net((4,), "c")
    net.add("optimizer", nn.Linear(out_features=3))
    net.initialize(0)
    with pytest.raises(ValueError, match="'optimizer.weight' starts with 'optimizer.'"):
        checkpoint.save(tmp_path / "c.safetensors", net, None)
    assert not (tmp_path / "c.safetensors").exists()


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert run_cli("train", "--model", "lenet", "--dataset", "mnist", "--data", tmp_path,
                   "--no-download", "--out", tmp_path / "o") == 1
    err = capsys.readouterr().err
    assert err.startswith("minidl train: error:") and "mnist" in err
    assert run_cli("eval", "--checkpoint", tmp_path / "missing.safetensors") == 1
    assert "missing.safetensors" in capsys.readouterr().err


def test_cli_a_diverging_run_is_a_one_line_error(mnist_root, tmp_path, capsys):
    assert run_cli("train", "--model", "lenet", "--dataset", "mnist", "--data", mnist_root,
                   "--epochs", 1, "--lr", 1e6, "--limit-train", 256, "--no-progress",
                   "--out", tmp_path / "o") == 1
    err = capsys.readouterr().err
    assert err.startswith("minidl train: error: loss became") and "smaller learning rate" in err


def test_plot_writes_a_png(mnist_root, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plot"
    train(lenet_config(mnist_root, out, epochs=1, plot=True), log=lambda *a: None)
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "minidl", "models"], capture_output=True,
                       text=True, check=True)
    assert "resnet20" in r.stdout
