"""Devices: the sim device against the cpu (bit for bit: same kernels), its memory
budget, copy counters and modelled clock, the plan's memory prediction against the
device's own peak, moving nets, checkpoints across devices, and the command line.
The cuda tests at the end run only where pycuda, minidl._cuda and a GPU are present."""
import inspect
import json
import subprocess
import sys

import numpy as np
import pytest

import minidl
from minidl import models, nn, ops
from minidl.device import (DeviceArray, OutOfDeviceMemory, OutOfHostMemory, asnumpy, get_device,
                           parse_bytes)
from minidl.device import cpu as cpu_device
from minidl.optim import SGD, Adam
from minidl.plan import make_plan
from minidl.runtime import Executor
from minidl.train import train
from test_train import lenet_config, run_cli, write_cifar_bin, write_idx


def sim(memory="1GiB", **kw):
    return get_device("sim", memory=memory, **kw)


# ---- sizes and names ---------------------------------------------------------------------


@pytest.mark.parametrize("text,n", [
    ("512MB", 512 * 10**6), ("2GiB", 2 * 2**30), ("1.5G", 3 * 2**29), ("4096", 4096),
    ("4096B", 4096), (" 64 kib ", 64 * 1024), ("1.1GB", 1_100_000_000), ("0", 0), (7, 7),
    ("1T", 2**40), ("0.5KB", 500)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("bad,exc,match", [
    ("", ValueError, "cannot read"), ("12 parsecs", ValueError, "cannot read"),
    ("-5MB", ValueError, "cannot read"), ("0.3B", ValueError, "not a whole number"),
    ("1e9", ValueError, "cannot read"), (-1, ValueError, ">= 0"), (True, TypeError, "int"),
    (2.0, TypeError, "int or a string"), (None, TypeError, "int or a string")])
def test_parse_bytes_rejects(bad, exc, match):
    with pytest.raises(exc, match=match):
        parse_bytes(bad)


def test_importing_minidl_needs_no_cuda():
    code = ("import sys, minidl, minidl.device, minidl.train; "
            "assert not {'pycuda', 'minidl._cuda', 'minidl.device.cuda'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_device_names():
    assert get_device("cpu") is get_device("CPU") and get_device("sim") is get_device("sim")
    assert sim() is not get_device("sim")  # options make an independent device
    assert make_plan(models.build("lenet", seed=None), 2, device="sim").device == "sim"
    for bad in ("gpu", "sim:1", "cuda:x", "cpu:0"):
        with pytest.raises(ValueError, match="unknown device"):
            get_device(bad)
    with pytest.raises(ValueError, match="no memory budget"):
        get_device("cpu", memory="1GB")
    with pytest.raises(ValueError, match="positive"):
        sim(memory=0)


# ---- arrays and memory -------------------------------------------------------------------


def test_sim_arrays_are_not_numpy_arrays_and_views_share_memory():
    dev = sim("1KiB")
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = dev.to_device(host)
    assert isinstance(a, DeviceArray) and a.shape == (3, 4) and a.nbytes == 48
    with pytest.raises(TypeError, match="to_host"):
        np.asarray(a)
    with pytest.raises(TypeError):
        a + 1
    v = a.reshape(-1)
    assert v.shape == (12,) and v.mem is a.mem and dev.in_use == 48
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5, -1)
    del a
    assert dev.in_use == 48  # the view keeps the allocation
    np.testing.assert_array_equal(dev.to_host(v), host.reshape(-1))
    out = np.empty(12, np.float32)
    assert dev.to_host(v, out=out) is out
    del v
    assert dev.in_use == 0 and dev.peak == 48
    dev.reset_peak()
    assert dev.peak == 0


def test_out_of_budget_raises_before_allocating_and_names_the_numbers():
    dev = sim("1000B")
    a = dev.empty(200)  # 800 bytes
    with pytest.raises(OutOfDeviceMemory) as e:
        dev.empty(100)
    assert isinstance(e.value, MemoryError)
    msg = str(e.value)
    for figure in ("400 bytes", "800 bytes", "1000 bytes", "budget", "peak"):
        assert figure in msg, msg
    assert (e.value.requested, e.value.budget, e.value.in_use) == (400, 1000, 800)
    assert dev.in_use == 800
    # an op whose output does not fit leaves its operands alone and allocates nothing
    x = dev.to_device(np.ones(40, np.float32))  # 160 bytes: 960 in use
    with pytest.raises(OutOfDeviceMemory):
        ops.relu(x)
    assert dev.in_use == 960
    np.testing.assert_array_equal(dev.to_host(x), np.ones(40, np.float32))
    del a
    np.testing.assert_array_equal(dev.to_host(ops.relu(x)), np.ones(40, np.float32))


# ---- ops on sim equal ops on the cpu ---------------------------------------------------------


def _r(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


OPS = {  # name -> (inputs(rng), call(ops arrays...)); outputs compared bit for bit
    "sgemm": (lambda r: (_r(r, 5, 7), _r(r, 9, 7)), lambda a, b: ops.sgemm(a, b, trans_b=True)),
    "conv2d": (lambda r: (_r(r, 2, 3, 9, 8), _r(r, 4, 3, 3, 3), _r(r, 4)),
               lambda x, w, b: ops.conv2d(x, w, b, stride=2, padding=1)),
    "conv2d_backward": (lambda r: (_r(r, 2, 3, 9, 8), _r(r, 4, 3, 3, 3), _r(r, 2, 4, 5, 4)),
                        lambda x, w, dy: ops.conv2d_backward(x, w, dy, stride=2, padding=1)),
    "max_pool2d": (lambda r: (_r(r, 2, 3, 7, 7),),
                   lambda x: ops.max_pool2d(x, 3, stride=2, ceil_mode=True)),
    "max_pool2d_backward": (lambda r: (_r(r, 2, 3, 7, 7), _r(r, 2, 3, 3, 3)),
                            lambda x, dy: ops.max_pool2d_backward(x, dy, 3, stride=2)),
    "max_pool2d_argmax": (lambda r: (_r(r, 2, 3, 7, 7),),
                          lambda x: ops.max_pool2d_argmax(x, 3, stride=2, relu=True)),
    "max_pool2d_backward_argmax": (
        lambda r: (r.integers(0, 9, (2, 3, 3, 3)).astype(np.uint8), _r(r, 2, 3, 3, 3)),
        lambda tap, dy: ops.max_pool2d_backward_argmax(tap, dy, (2, 3, 7, 7), 3, stride=2)),
    "avg_pool2d": (lambda r: (_r(r, 2, 3, 7, 7),), lambda x: ops.avg_pool2d(x, 3, stride=2)),
    "avg_pool2d_backward": (lambda r: (_r(r, 2, 3, 3, 3),),
                            lambda dy: ops.avg_pool2d_backward((2, 3, 7, 7), dy, 3, stride=2)),
    "global_avg_pool2d": (lambda r: (_r(r, 2, 3, 5, 4),), ops.global_avg_pool2d),
    "global_avg_pool2d_backward": (lambda r: (_r(r, 2, 3),),
                                   lambda dy: ops.global_avg_pool2d_backward((2, 3, 5, 4), dy)),
    "relu": (lambda r: (_r(r, 3, 33),), ops.relu),
    "relu_backward": (lambda r: (_r(r, 3, 33), _r(r, 3, 33)), ops.relu_backward),
    "add": (lambda r: (_r(r, 4, 5), _r(r, 4, 5)), ops.add),
    "dropout": (lambda r: (_r(r, 100),), lambda x: ops.dropout(x, 0.3, seed=5)),
    "dropout_backward": (lambda r: (_r(r, 100),), lambda dy: ops.dropout_backward(dy, 0.3, seed=5)),
    "batch_norm": (lambda r: (_r(r, 4, 3, 5, 5), _r(r, 3), _r(r, 3), np.zeros(3, np.float32),
                              np.ones(3, np.float32)),
                   lambda x, g, b, rm, rv: ops.batch_norm(x, g, b, running_mean=rm,
                                                          running_var=rv) + (rm, rv)),
    "batch_norm_infer": (lambda r: (_r(r, 4, 3, 5, 5), _r(r, 3), np.ones(3, np.float32) * 2),
                         lambda x, rm, rv: ops.batch_norm(x, None, None, training=False,
                                                          running_mean=rm, running_var=rv)[0]),
    "batch_norm_backward": (lambda r: (_r(r, 4, 3, 5), _r(r, 3), _r(r, 4, 3, 5), _r(r, 3),
                                       np.abs(_r(r, 3)) + 1),
                            ops.batch_norm_backward),
    "linear": (lambda r: (_r(r, 6, 10), _r(r, 4, 10), _r(r, 4)), ops.linear),
    "linear_backward": (lambda r: (_r(r, 6, 10), _r(r, 4, 10), _r(r, 6, 4)), ops.linear_backward),
    "softmax_cross_entropy": (lambda r: (_r(r, 6, 10), np.arange(6) % 10),
                              ops.softmax_cross_entropy),
    "sgd_step": (lambda r: (_r(r, 50), _r(r, 50), _r(r, 50)),
                 lambda p, g, m: (ops.sgd_step(p, g, m, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=1e-3), m)),
    "adam_step": (lambda r: (_r(r, 50), _r(r, 50), _r(r, 50), np.abs(_r(r, 50))),
                  lambda p, g, m, v: (ops.adam_step(p, g, m, v, step=3, weight_decay=0.1,
                                                    decoupled=True), m, v)),
}


def _outputs(result):
    items = result if isinstance(result, tuple) else (result,)
    return [asnumpy(a) if isinstance(a, DeviceArray) else a for a in items]


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_on_sim_equal_the_cpu(name, rng):
    inputs, call = OPS[name]
    args = inputs(rng)
    want = _outputs(call(*[a.copy() for a in args]))
    dev = sim()
    got = _outputs(call(*[dev.to_device(a) for a in args]))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, float):
            assert g == w
        else:
            assert not isinstance(g, DeviceArray) and g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    assert dev.launches >= 1


def test_every_op_takes_device():
    for name in ops.__all__:
        assert "device" in inspect.signature(getattr(ops, name)).parameters, name


def test_ops_take_device_and_refuse_mixed_devices(rng):
    x, w = _r(rng, 2, 3, 6, 6), _r(rng, 4, 3, 3, 3)
    dev = sim()
    y = ops.conv2d(x, w, padding=1, device=dev)
    assert isinstance(y, DeviceArray) and y.device is dev
    assert dev.copies["h2d"] == {"count": 2, "bytes": x.nbytes + w.nbytes}
    np.testing.assert_array_equal(dev.to_host(y), ops.conv2d(x, w, padding=1))
    assert ops.relu(x, device="cpu").shape == x.shape
    with pytest.raises(ValueError, match="one device.*x on sim, w on cpu"):
        ops.conv2d(dev.to_device(x), w)
    with pytest.raises(ValueError, match="one device"):
        ops.add(dev.to_device(x), sim().to_device(x))
    with pytest.raises(ValueError, match="param is updated in place"):
        ops.sgd_step(_r(rng, 3), _r(rng, 3), lr=0.1, device=dev)
    with pytest.raises(TypeError, match="float32"):
        ops.relu(dev.to_device(np.ones(3)))  # float64 stays float64 on a device
    assert "device" in str(__import__("inspect").signature(ops.conv2d))


def test_subclasses_of_ndarray_are_host_arrays(rng, tmp_path):
    """np.memmap (or any subclass) updated in place, as NumPy arrays are"""
    files = iter(range(100))

    def mm(a):
        m = np.memmap(tmp_path / f"{next(files)}.bin", np.float32, "w+", shape=a.shape)
        m[...] = a
        return m

    p, g = _r(rng, 5), _r(rng, 5)
    want = p - 0.1 * g
    got = ops.sgd_step(mm(p), g, lr=0.1)
    assert isinstance(got, np.memmap)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    a, b = _r(rng, 3, 4), _r(rng, 4, 2)
    np.testing.assert_allclose(ops.sgemm(mm(a), b, out=mm(np.zeros((3, 2), np.float32))),
                               a @ b, rtol=1e-5)
    x = _r(rng, 4, 3)
    rm, rv = mm(np.zeros(3, np.float32)), mm(np.ones(3, np.float32))
    ops.batch_norm(x, None, None, running_mean=rm, running_var=rv)
    np.testing.assert_allclose(rm, 0.1 * x.mean(0), rtol=1e-5)


# ---- training on sim equals training on the cpu -------------------------------------------


def _train(model, device, optimizer, steps=3, batch=8, **dev_kw):
    dev = get_device(device) if device == "cpu" else sim(**dev_kw)
    net = models.build(model, seed=0).to(dev)
    opt = optimizer(net.parameters())
    ex = Executor(net, make_plan(net, batch, optimizer_slots=len(opt.slots), device=dev), seed=1)
    r = np.random.default_rng(1)
    losses = []
    for _ in range(steps):
        x = r.standard_normal((batch, *net.input_shape)).astype(np.float32)
        loss, logits = ex.train_step(x, r.integers(0, 10, batch))
        assert isinstance(logits, np.ndarray) and logits.shape == (batch, 10)
        opt.step()
        losses.append(loss)
    return net, opt, ex, losses


OPTIMIZERS = {"sgd_momentum": lambda p: SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
              "adam": lambda p: Adam(p, lr=1e-3)}


@pytest.mark.parametrize("model", ["cifar10_quick", "resnet20"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_on_sim_is_bit_identical_to_the_cpu(model, optimizer):
    cpu_net, cpu_opt, _, cpu_losses = _train(model, "cpu", OPTIMIZERS[optimizer])
    sim_net, sim_opt, ex, sim_losses = _train(model, "sim", OPTIMIZERS[optimizer])
    assert ex.device.kind == "sim" and sim_losses == cpu_losses
    a, b = cpu_net.state_dict(), sim_net.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert isinstance(b[k], np.ndarray)
        assert np.array_equal(a[k], b[k]), k
    for k, v in cpu_opt.state_dict().items():
        assert np.array_equal(v, sim_opt.state_dict()[k]), k


def test_a_step_copies_the_batch_once_and_brings_back_the_loss_and_logits():
    dev = sim()
    net = models.build("cifar10_quick", seed=0).to(dev)
    ex = Executor(net, batch_size=16)
    x = np.zeros((16, 3, 32, 32), np.float32)
    dev.reset_counters()
    for step in range(2):
        ex.train_step(x, np.arange(16) % 10)
        assert dev.copies == {"h2d": {"count": 2 * (step + 1), "bytes": (step + 1) * (x.nbytes + 16 * 8)},
                              "d2h": {"count": 2 * (step + 1), "bytes": (step + 1) * (4 + 16 * 10 * 4)}}
    dev.reset_counters()
    assert ex.predict(x).shape == (16, 10)
    assert dev.copies == {"h2d": {"count": 1, "bytes": x.nbytes},
                          "d2h": {"count": 1, "bytes": 16 * 10 * 4}}


@pytest.mark.parametrize("name", ["cifar10_quick", "lenet", "resnet20", "cifar10_full",
                                  "vgg11_bn"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_plan_predicts_the_peak_the_sim_device_measures(name, optimizer, rng):
    """Parameters + float buffers + optimizer state + the step (batch, activations,
    BatchNorm statistics, activation and parameter gradients): exactly the device's
    peak.  Kernel workspaces are excluded (on sim the C kernels take them from the host)."""
    dev = sim()
    net = models.build(name, seed=0).to(dev)
    opt = OPTIMIZERS[optimizer](net.parameters())
    plan = make_plan(net, 4, optimizer_slots=len(opt.slots), device=dev)
    ex = Executor(net, plan)
    ex.track_memory = True
    classes = net.output_shape[0]
    for _ in range(2):  # the second step starts with gradients and optimizer state there
        ex.train_step(_r(rng, 4, *net.input_shape), rng.integers(0, classes, 4))
        opt.step()
        assert ex.peak_device_bytes == plan.memory["peak"]
    m = plan.memory
    assert dev.in_use == m["params"] + m["buffers"] + m["grads"] + m["optimizer"]


def _summed_gradient_net():
    """conv3's data gradient is added to the one the Add gave conv2's output, and is
    freed then, before conv2's backward makes its larger input gradient."""
    net = minidl.Net((1, 8, 8))
    net.add("conv1", nn.Conv2d(out_channels=4, padding=1))
    net.add("conv2", nn.Conv2d(out_channels=8, stride=2, padding=1, bias=False))
    net.add("conv3", nn.Conv2d(out_channels=8, padding=1, bias=False))
    net.add("add", nn.Add(), ["conv3", "conv2"])
    net.add("flat", nn.Flatten())
    net.add("fc", nn.Linear(out_features=3))
    return net


def _shared_shortcut_net():
    """relu1 read by a convolution and two Adds: fused, add1's backward (which does bn2's)
    makes both its input gradients at once, and relu1's is added to add2's."""
    net = minidl.Net((3, 8, 8))
    net.add("conv1", nn.Conv2d(out_channels=8, padding=1, bias=False))
    net.add("bn1", nn.BatchNorm2d())
    net.add("relu1", nn.ReLU())
    net.add("conv2", nn.Conv2d(out_channels=8, padding=1, bias=False))
    net.add("bn2", nn.BatchNorm2d())
    net.add("add1", nn.Add(), ["relu1", "bn2"])
    net.add("relu2", nn.ReLU())
    net.add("conv3", nn.Conv2d(out_channels=8, padding=1, bias=False))
    net.add("add2", nn.Add(), ["relu1", "conv3"])
    net.add("conv4", nn.Conv2d(out_channels=4, kernel_size=1, bias=False))
    net.add("pool", nn.GlobalAvgPool2d())
    net.add("fc", nn.Linear(out_features=3))
    return net


@pytest.mark.parametrize("make", [_summed_gradient_net, _shared_shortcut_net])
@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
def test_plan_predicts_the_peak_where_input_gradients_are_summed(make, fuse, rng):
    """Where a node's second gradient arrives, the sum replaces both at once, after the
    layer's backward has made all its input gradients: the cpu's activation peak and
    sim's device peak are the plan's."""
    _check_predicted_peaks(make, fuse, rng)


def _identity_dropout_net():
    """Dropout(0) hands on its input and its gradient, as Flatten does."""
    net = minidl.Net((3, 8, 8))
    net.add("conv1", nn.Conv2d(out_channels=4, padding=1))
    net.add("relu1", nn.ReLU())
    net.add("drop1", nn.Dropout(0.0))
    net.add("conv2", nn.Conv2d(out_channels=4, padding=1, bias=False))
    net.add("bn2", nn.BatchNorm2d())
    net.add("drop2", nn.Dropout(0.0))
    net.add("add", nn.Add(), ["drop2", "drop1"])
    net.add("flat", nn.Flatten())
    net.add("drop3", nn.Dropout(0.0))
    net.add("fc", nn.Linear(out_features=3))
    return net


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
def test_plan_predicts_the_peak_with_identity_dropout(fuse, rng):
    _check_predicted_peaks(_identity_dropout_net, fuse, rng)
    plan = make_plan(_identity_dropout_net(), 4, fuse=fuse)
    for k in ("drop2", "drop3"):  # (drop1's backward adds its two readers' gradients)
        s = plan.step(k)
        assert (s.output_bytes, s.bytes_forward, s.bytes_backward, s.grad_view) == \
            (0, 0, 0, True), k


def test_a_scaled_loss_gradient_stays_within_the_plan(rng):
    """grad_scale (data-parallel training's 1 / ranks) on a device: the scaled copy of
    dlogits is made after the unscaled one is freed, so a net whose step peaks at the
    loss runs at the planned budget"""
    net = minidl.Net((1, 2, 2), "wide")
    net.add("flat", nn.Flatten())
    net.add("fc", nn.Linear(out_features=20000))
    dev = sim()
    net.initialize(0).to(dev)
    plan = make_plan(net, 64, device=dev, optimizer_slots=0)
    ex = Executor(net, plan)
    ex.track_memory = True
    x, y = _r(rng, 64, 1, 2, 2), rng.integers(0, 20000, 64)
    ex.train_step(x, y, grad_scale=0.5)
    assert ex.peak_device_bytes == plan.memory["peak"]
    dev.budget = plan.memory["peak"]
    ex.train_step(x, y, grad_scale=0.5)


def test_a_small_gamma_is_counted_before_the_step(rng):
    """A reconstructed BatchNorm with |gamma| < RECONSTRUCT_MIN_GAMMA keeps its input:
    the budget check counts it, so the step fails before it starts (it failed part way,
    the BatchNorms before it updated) and runs with that much more"""
    dev = sim()
    net = models.build("resnet20", seed=0).to(dev)
    opt = SGD(net.parameters(), lr=0.1, momentum=0.9)  # noqa: F841 (its state: the plan's slot)
    plan = make_plan(net, 4, device=dev)
    g = net.nodes["layer1.0.bn2"].layer.params["weight"].data
    assert "reconstructed" in plan.step("layer1.0.bn2").fused
    h = asnumpy(g).copy()
    h[0] = 1e-4
    dev.to_device(h, out=g)
    ex = Executor(net, plan)
    ex.track_memory = True
    x, y = _r(rng, 4, 3, 32, 32), rng.integers(0, 10, 4)
    before = net.state_dict()
    dev.budget = plan.memory["peak"]
    kept = 4 * 16 * 32 * 32 * 4  # the BatchNorm's input, batch 4
    with pytest.raises(OutOfDeviceMemory, match=f"and {kept} bytes of inputs that BatchNorms"):
        ex.train_step(x, y)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    dev.budget = plan.memory["peak"] + kept
    with pytest.warns(RuntimeWarning, match="keeps its input"):
        ex.train_step(x, y)
    assert plan.memory["peak"] < ex.peak_device_bytes <= dev.budget


def test_training_at_the_planned_budget_also_evaluates_within_it(tmp_path, rng):
    """Evaluation on a device runs in the training batch, whose forward fits where its
    training step fits (in batches of 256 it needed twice lenet's budget at batch 8,
    and the run failed after its epoch)"""
    root = write_idx(tmp_path / "data", rng)
    peak = make_plan(models.build("lenet", seed=None), 8, device="sim").memory["peak"]
    assert run_cli("train", "--model", "lenet", "--dataset", "mnist", "--data", root,
                   "--epochs", 1, "--limit-train", 64, "--batch-size", 8, "--no-progress",
                   "--no-download", "--out", tmp_path / "run", "--device", "sim",
                   "--sim-memory", peak) == 0
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["epoch"] == 1


def _check_predicted_peaks(make, fuse, rng):
    x, y = _r(rng, 4, *make().input_shape), rng.integers(0, 3, 4)
    net = make().initialize(0)
    plan = make_plan(net, 4, fuse=fuse)
    ex = Executor(net, plan)
    ex.track_memory = True
    ex.train_step(x, y)
    assert ex.peak_activation_bytes == plan.memory["activation_peak"]
    dev = sim()
    net = make().initialize(0).to(dev)
    opt = SGD(net.parameters(), lr=0.1, momentum=0.9)
    plan = make_plan(net, 4, device=dev, fuse=fuse)
    ex = Executor(net, plan)
    ex.track_memory = True
    for _ in range(2):
        ex.train_step(x, y)
        opt.step()
        assert ex.peak_device_bytes == plan.memory["peak"]


def test_a_step_over_budget_changes_nothing_and_a_bigger_budget_then_works():
    ref_net, ref_opt, _, _ = _train("resnet20", "cpu", OPTIMIZERS["sgd_momentum"], steps=2)
    dev = sim()
    net = models.build("resnet20", seed=0).to(dev)
    opt = OPTIMIZERS["sgd_momentum"](net.parameters())
    plan = make_plan(net, 8, optimizer_slots=1, device=dev)
    ex = Executor(net, plan, seed=1)
    r = np.random.default_rng(1)
    x, y = r.standard_normal((8, 3, 32, 32)).astype(np.float32), r.integers(0, 10, 8)
    ex.train_step(x, y)
    opt.step()
    before = (net.state_dict(), opt.state_dict())
    dev.budget = plan.memory["peak"] - 1  # one byte short of the plan's prediction
    with pytest.raises(OutOfDeviceMemory, match=r"batch 8 \(the plan's prediction\) asks for"):
        ex.train_step(x2 := r.standard_normal((8, 3, 32, 32)).astype(np.float32),
                      y2 := r.integers(0, 10, 8))
    with pytest.raises(OutOfDeviceMemory, match="an allocation asks for"):
        dev.empty(dev.budget - dev.in_use + 1, np.uint8)
    for old, new in zip(before, (net.state_dict(), opt.state_dict())):
        for k in old:
            assert np.array_equal(old[k], new[k]), k
    dev.budget = plan.memory["peak"]  # exactly enough
    ex.train_step(x2, y2)
    opt.step()
    for k, v in ref_net.state_dict().items():
        assert np.array_equal(v, net.state_dict()[k]), k
    for k, v in ref_opt.state_dict().items():
        assert np.array_equal(v, opt.state_dict()[k]), k


def test_a_step_the_host_cannot_hold_stops_before_it_starts(monkeypatch, capsys):
    """On the cpu, a step the plan says needs more than the host has free raises at once
    (checked at each batch size's first step), instead of swapping or being killed."""
    net = models.build("lenet", seed=0)
    plan = make_plan(net, 8)
    ex = Executor(net, plan)
    r = np.random.default_rng(1)
    x, y = r.standard_normal((8, 1, 28, 28)).astype(np.float32), r.integers(0, 10, 8)
    free = plan.memory["step_peak"] - 1
    monkeypatch.setattr(cpu_device, "available_bytes", lambda: free)
    before = net.state_dict()
    with pytest.raises(OutOfHostMemory, match=r"cpu: a training step of batch 8 \(the plan's "
                       r"prediction\) needs .* more than the .* this host has free"):
        ex.train_step(x, y)
    for k, v in before.items():
        assert np.array_equal(v, net.state_dict()[k]), k
    free += 1
    ex.train_step(x, y)
    free = 0  # not read again at this batch size
    ex.train_step(x, y)
    with pytest.raises(OutOfHostMemory, match="batch 5"):
        ex.train_step(x[:5], y[:5])
    assert run_cli("bench", "--model", "lenet", "--batch-size", 4, "--steps", 1) == 1
    assert capsys.readouterr().err.startswith("minidl bench: error: cpu: a training step")
    monkeypatch.undo()
    assert cpu_device.available_bytes() > 0  # read from /proc/meminfo


def test_net_moves_between_devices_and_state_dicts_are_host_arrays():
    net = models.build("cifar10_full", seed=0)
    want = net.state_dict()
    dev = sim()
    net.to(dev)
    assert net.device is dev and dev.in_use == sum(
        a.nbytes for k, a in want.items() if a.dtype == np.float32)
    assert isinstance(net.buffers()["norm1.running_mean"], DeviceArray)
    assert isinstance(net.buffers()["norm1.num_batches_tracked"], np.ndarray)  # a host counter
    got = net.state_dict()
    assert all(type(a) is np.ndarray and np.array_equal(a, want[k]) for k, a in got.items())
    net.initialize(7)
    net.load_state_dict(want)
    assert all(np.array_equal(a, want[k]) for k, a in net.state_dict().items())
    net.to("cpu")
    assert net.device.kind == "cpu" and dev.in_use == 0
    with pytest.raises(ValueError, match="net.to"):
        Executor(net, make_plan(net, 2, device="sim"))


# ---- the modelled clock ---------------------------------------------------------------------


def test_the_clock_is_monotone_and_copies_overlap_compute_on_other_streams():
    dev = sim(compute_flops=1e9, memory_bandwidth=1e9, pcie_bandwidth=1e8, launch_latency=0.0)
    x = np.ones(25_000, np.float32)  # 100 kB: a copy takes 1 ms, a relu (200 kB) 0.2 ms
    copy_s, relu_s = 1e-3, 2e-4
    a = dev.to_device(x)
    assert dev.clock == pytest.approx(copy_s)
    times = [dev.clock]
    ops.relu(a)
    times.append(dev.clock)
    assert times[-1] == pytest.approx(copy_s + relu_s)  # same stream: in order
    # a copy on another stream overlaps a kernel on the default stream
    s = dev.stream()
    t0 = dev.clock
    s.wait(dev.event().record())  # s starts where the default stream is now
    dev.to_device_async(x, stream=s)
    ops.relu(a)
    assert dev.clock == pytest.approx(t0 + copy_s)
    assert dev.default_stream.time == pytest.approx(t0 + relu_s)
    # a kernel that waits for the copy's event starts after it
    s2 = dev.stream()
    t1 = dev.clock
    dev.default_stream.wait(dev.event().record(s))
    s2.wait(dev.event().record())
    b = dev.to_device_async(x, stream=s2)
    done = dev.event().record(s2)
    dev.default_stream.wait(done)
    ops.relu(b)
    assert dev.clock == pytest.approx(t1 + copy_s + relu_s)
    # kernels on two streams take turns on the compute engine
    t2 = dev.clock
    with dev.use(s):
        ops.relu(a)
    ops.relu(a)
    assert dev.clock == pytest.approx(t2 + 2 * relu_s)
    times.append(dev.clock)
    assert times == sorted(times)


def test_the_clock_follows_the_cost_model_for_a_training_step():
    dev = sim(launch_latency=0.0)
    net = models.build("cifar10_quick", seed=0).to(dev)
    ex = Executor(net, batch_size=32)
    t = [dev.clock]
    for _ in range(3):
        ex.train_step(np.zeros((32, 3, 32, 32), np.float32), np.zeros(32, np.int64))
        t.append(dev.clock)
    steps = np.diff(t)
    assert (steps > 0).all() and np.allclose(steps, steps[0])
    flops = 3 * ex.plan.flops()  # forward and the two backward GEMMs per layer
    assert steps[0] >= (32 * 3 * 32 * 32 * 4) / dev.pcie_bandwidth  # the batch's copy
    assert steps[0] >= 0.9 * flops / dev.compute_flops


# ---- training loop, checkpoints and command line ----------------------------------------------


def test_a_run_on_sim_resumes_on_the_cpu(tmp_path, rng):
    root = write_cifar_bin(tmp_path / "data", rng)
    kw = dict(model="cifar10_full", dataset="cifar10", batch_size=32, lr=0.02, augment=True,
              lr_schedule="constant")  # the same rates whatever the number of epochs
    whole = tmp_path / "whole"
    train(lenet_config(root, whole, epochs=2, **kw), log=lambda *a: None)
    part = tmp_path / "part"
    train(lenet_config(root, part, epochs=1, device="sim", sim_memory="256MB", **kw),
          log=lambda *a: None)
    train(lenet_config(root, part, epochs=2, resume=str(part / "checkpoint.safetensors"), **kw),
          log=lambda *a: None)
    from minidl import safetensors
    a, _ = safetensors.load(whole / "checkpoint.safetensors")
    b, _ = safetensors.load(part / "checkpoint.safetensors")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_cli_device_sim_end_to_end(tmp_path, rng, capsys):
    root = write_idx(tmp_path / "data", rng)
    out = tmp_path / "run"
    assert run_cli("train", "--model", "lenet", "--dataset", "mnist", "--data", root,
                   "--epochs", 1, "--limit-train", 200, "--batch-size", 32, "--lr", 0.01,
                   "--no-progress", "--no-download", "--out", out, "--device", "sim",
                   "--sim-memory", "512MB") == 0
    assert "device sim" in capsys.readouterr().out
    assert json.loads((out / "metrics.jsonl").read_text())["epoch"] == 1
    assert run_cli("bench", "--model", "lenet", "--batch-size", 4, "--steps", 1, "--warmup", 0,
                   "--json", "--device", "sim", "--sim-memory", "64MiB") == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == "sim" and r["modelled_train_step_ms"] > 0
    assert 0 < r["device_peak_bytes"] <= 64 * 2**20
    assert r["copies_per_step"]["h2d"] == {"count": 2, "bytes": 4 * 28 * 28 * 4 + 4 * 8}
    assert run_cli("bench", "--model", "lenet", "--batch-size", 64, "--steps", 1, "--device",
                   "sim", "--sim-memory", "1MB") == 1
    err = capsys.readouterr().err
    assert err.startswith("minidl bench: error: sim: out of device memory") and "\n" == err[-1]
    assert run_cli("train", "--device", "cpu", "--sim-memory", "1GB") == 1
    assert "--sim-memory applies to --device sim" in capsys.readouterr().err


def _cuda_missing():
    try:
        get_device("cuda")
    except RuntimeError as e:
        return str(e)
    return None


CUDA_MISSING = _cuda_missing()


@pytest.mark.skipif(CUDA_MISSING is None, reason="CUDA is available here")
def test_cli_device_cuda_without_cuda_says_so_once(tmp_path, capsys):
    assert run_cli("train", "--model", "lenet", "--device", "cuda", "--out", tmp_path) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("minidl train: error: cannot use --device cuda:")
    assert "pip install '.[cuda]'" in err


# ---- cuda (skipped without pycuda, minidl._cuda and a GPU) ------------------------------------

needs_cuda = pytest.mark.skipif(CUDA_MISSING is not None, reason=str(CUDA_MISSING))
CUDA_RTOL = 1e-4  # float32 kernels in another summation order: max |diff| / max |want|


def _rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-3) if want.size else 0.0


def _close(got, want, rtol=CUDA_RTOL, what=""):
    err = _rel_err(got, want)
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol:.3g}"


@needs_cuda
@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_on_cuda_match_the_cpu(name, rng):
    inputs, call = OPS[name]
    args = inputs(rng)
    want = _outputs(call(*[a.copy() for a in args]))
    dev = get_device("cuda")
    got = _outputs(call(*[dev.to_device(a) for a in args]))
    for i, (g, w) in enumerate(zip(got, want)):
        _close(g, w, what=f"{name} output {i}")


@needs_cuda
@pytest.mark.parametrize("model", ["cifar10_quick", "resnet20"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_on_cuda_matches_the_cpu(model, optimizer):
    """3 steps; each loss within 1e-4 and each parameter within 1e-3 of its largest
    magnitude, or within 4 times what the CPU's own scalar and SIMD kernels differ by
    there: resnet20's BatchNorm biases sum gradients that nearly cancel, and the CPU's
    two versions differ by up to 2e-2 (SGD) and 1e-1 (Adam) on them after 3 steps
    (summation orders compound), and by up to 1e-3 in the third step's loss."""
    cpu_net, _, _, cpu_losses = _train(model, "cpu", OPTIMIZERS[optimizer])
    minidl.set_simd("scalar")
    try:
        other_net, _, _, other_losses = _train(model, "cpu", OPTIMIZERS[optimizer])
    finally:
        minidl.set_simd(minidl.cpu_simd())
    dev = get_device("cuda", memory="2GiB")
    net = models.build(model, seed=0).to(dev)
    opt = OPTIMIZERS[optimizer](net.parameters())
    ex = Executor(net, make_plan(net, 8, optimizer_slots=len(opt.slots), device=dev), seed=1)
    r = np.random.default_rng(1)
    for i in range(3):
        x = r.standard_normal((8, *net.input_shape)).astype(np.float32)
        loss, _ = ex.train_step(x, r.integers(0, 10, 8))
        opt.step()
        assert abs(loss - cpu_losses[i]) <= max(1e-4 * max(1.0, abs(cpu_losses[i])),
                                                4 * abs(other_losses[i] - cpu_losses[i]))
    want, other = cpu_net.state_dict(), other_net.state_dict()
    for k, v in net.state_dict().items():
        _close(v, want[k], rtol=max(1e-3, 4 * _rel_err(other[k], want[k])), what=k)
    assert dev.peak <= dev.budget


@needs_cuda
def test_the_cuda_allocator_caches_blocks_and_releases_them_under_pressure():
    dev = get_device("cuda", memory="1MiB")
    a = dev.empty((1000,))  # 4000 bytes, rounded up to 4096
    ptr = dev.address(a)
    del a
    assert dev.in_use == 4096 and dev.cached == 4096
    b = dev.empty((1024,))  # the same rounded size: the cached block
    assert dev.address(b) == ptr and dev.cached == 0
    del b
    c = dev.empty((261_200,))  # fits only once the cache is given back
    assert dev.cached == 0 and dev.in_use == 1044992
    with pytest.raises(OutOfDeviceMemory):
        dev.empty((1000,))
    del c
    dev.empty_cache()
    assert dev.in_use == 0 and dev.peak == 1044992
    np.testing.assert_array_equal(dev.to_host(dev.full((5,), 7, np.int32)), [7] * 5)
    np.testing.assert_array_equal(dev.to_host(dev.zeros((5,), np.uint8)), [0] * 5)


@needs_cuda
def test_cuda_kernels_and_copies_run_on_the_current_stream_between_events():
    dev = get_device("cuda")
    h = dev.pinned_empty((3,))
    h[:] = [-1, 0, 2]
    with dev.use(dev.stream()) as s:
        start = dev.event().record()
        y = dev.to_host_async(ops.relu(dev.to_device_async(h)))
        end = dev.event().record()
    s.synchronize()
    np.testing.assert_array_equal(y, [0, 0, 2])
    assert start.elapsed_ms(end) >= 0


@needs_cuda
def test_cli_device_cuda_end_to_end_matches_the_cpu(tmp_path, rng, capsys):
    root = write_idx(tmp_path / "data", rng)
    metrics = []
    for device in ("cpu", "cuda"):
        assert run_cli("train", "--model", "lenet", "--dataset", "mnist", "--data", root,
                       "--epochs", 1, "--limit-train", 64, "--limit-test", 32, "--batch-size",
                       32, "--no-progress", "--no-download", "--out", tmp_path / device,
                       "--device", device) == 0
        metrics.append(json.loads((tmp_path / device / "metrics.jsonl").read_text()))
    assert "device cuda:0" in capsys.readouterr().out
    for k in ("train_loss", "test_loss"):
        assert abs(metrics[1][k] - metrics[0][k]) <= 1e-4 * max(1.0, abs(metrics[0][k])), k
    assert run_cli("bench", "--model", "lenet", "--batch-size", 4, "--steps", 1, "--warmup", 0,
                   "--json", "--device", "cuda", "--gpu-memory", "64MiB") == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == "cuda:0" and 0 < r["device_peak_bytes"] <= 64 * 2**20
