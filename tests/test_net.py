"""Net: building, shape inference and its error messages, names, state; the model
zoo; the Plan and its memory prediction against what the executor holds."""
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import pytest

from minidl import Net, models, nn, runtime
from minidl.nn import ShapeError
from minidl.plan import inference_fusion, make_plan
from minidl.runtime import Executor


def test_shapes_are_inferred_per_node():
    net = models.build("cifar10_quick")
    shapes = {k: n.shape for k, n in net.nodes.items()}
    assert shapes["conv1"] == (32, 32, 32)
    assert shapes["pool1"] == (32, 16, 16)   # ceil mode: ceil((32 - 3) / 2) + 1
    assert shapes["pool2"] == (32, 8, 8)
    assert shapes["pool3"] == (64, 4, 4)
    assert shapes["flatten"] == (1024,)
    assert net.output_shape == (10,)


@pytest.mark.parametrize("name,params", [
    ("cifar10_quick", 145_578), ("lenet", 431_080), ("resnet20", 272_474),
    ("resnet32", 466_906), ("resnet56", 855_770), ("resnet110", 1_730_714),
    ("cifar10_full", 89_706), ("vgg11_bn", 9_228_362)])
def test_model_parameter_counts(name, params):
    # cifar10_quick and lenet: Caffe's nets (145,578 = 2432 + 25632 + 51264 + 65600 + 650);
    # ResNets: He et al.'s 0.27M/0.46M/0.85M/1.7M plus the option-B projections
    assert models.build(name, seed=None).num_parameters() == params


def test_models_take_other_inputs_and_class_counts():
    net = models.build("resnet20", (1, 28, 28), num_classes=7)
    assert net.input_shape == (1, 28, 28) and net.output_shape == (7,)
    with pytest.raises(ValueError, match="unknown model 'nope'.*cifar10_quick"):
        models.build("nope")
    from minidl.models import resnet
    with pytest.raises(ValueError, match="6n \\+ 2"):
        resnet.spec((3, 32, 32), 10, depth=21)


def test_residual_names_follow_torchvision():
    names = models.build("resnet20", seed=None).parameters()
    for k in ("conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer1.2.bn2.bias",
              "layer2.0.downsample.0.weight", "layer3.0.downsample.1.weight", "fc.weight",
              "fc.bias"):
        assert k in names
    assert "layer1.0.downsample.0.weight" not in names  # identity where shapes agree
    buffers = models.build("resnet20", seed=None).buffers()
    assert buffers["bn1.num_batches_tracked"].dtype == np.int64


def test_shape_errors_name_the_node_and_the_inputs():
    net = Net((3, 8, 8))
    net.add("conv", nn.Conv2d(3, 4, 3))
    with pytest.raises(ShapeError, match=r"node 'conv2' \(Conv2d\): expects 5 input channels.*"
                                         r"inputs: conv \(4, 6, 6\)"):
        net.add("conv2", nn.Conv2d(5, 4, 3))
    with pytest.raises(ShapeError, match=r"node 'big' \(Conv2d\): output too small"):
        net.add("big", nn.Conv2d(None, 4, 9))
    with pytest.raises(ShapeError, match=r"node 'fc' \(Linear\).*put a Flatten before it"):
        net.add("fc", nn.Linear(None, 3))
    net.add("other", nn.Conv2d(None, 4, 1), "input")
    with pytest.raises(ShapeError, match=r"node 'sum' \(Add\): inputs must have the same shape, "
                                         r"got \(4, 6, 6\) and \(4, 8, 8\)"):
        net.add("sum", nn.Add(), ["conv", "other"])
    with pytest.raises(ShapeError, match=r"'pool'.*padding must be at most half"):
        net.add("pool", nn.MaxPool2d(2, padding=2))
    with pytest.raises(ValueError, match="unknown input 'nowhere'"):
        net.add("x", nn.ReLU(), "nowhere")
    with pytest.raises(ValueError, match="already in the net"):
        net.add("conv", nn.ReLU())
    with pytest.raises(ValueError, match="Add takes 2 input"):
        net.add("y", nn.Add(), "conv")
    with pytest.raises(TypeError, match="expected a minidl.nn layer"):
        net.add("z", lambda x: x)
    with pytest.raises(ValueError, match="unknown layer type 'Conv3d'"):
        Net.from_spec({"input": (3, 4, 4), "layers": [("c", "Conv3d", {})]})
    with pytest.raises(ValueError, match="input_shape"):
        Net((3, 0, 4))


@pytest.mark.parametrize("make, error, message", [
    (lambda: nn.Conv2d(None, 4, kernel_size=(3,)), TypeError,
     r"kernel_size must be an int or an \(h, w\) pair of ints, got \(3,\)"),
    (lambda: nn.Conv2d(None, 4, 2.5), TypeError, "kernel_size must be an int or .* got 2.5"),
    (lambda: nn.MaxPool2d(2, stride="2"), TypeError, "stride must be an int or .* got '2'"),
    (lambda: nn.AvgPool2d(2, padding=True), TypeError, "padding must be an int or"),
    (lambda: nn.BatchNorm2d(momentum=2), ValueError, r"momentum must be a number in \[0, 1\]"),
    (lambda: nn.BatchNorm2d(momentum=None), ValueError, "momentum must be a number"),
    (lambda: nn.BatchNorm2d(eps=-1e-5), ValueError, "eps must be a finite number >= 0"),
    (lambda: nn.Conv2d(3, -1), ValueError, "out_channels must be >= 1, got -1"),
    (lambda: nn.Conv2d(0, 4), ValueError, "in_channels must be >= 1, got 0"),
    (lambda: nn.Conv2d(3, 4.0), TypeError, "out_channels must be an int, got 4.0"),
    (lambda: nn.Linear(None, 0), ValueError, "out_features must be >= 1, got 0"),
    (lambda: nn.MaxPool2d(2, ceil_mode="no"), TypeError, "ceil_mode must be a bool, got 'no'"),
    (lambda: Net((3.7, 4, 4)), ValueError, r"input_shape must be positive sizes, got \(3.7, 4, 4\)"),
])
def test_layer_arguments_of_the_wrong_form(make, error, message):
    with pytest.raises(error, match=message):
        make()
    assert nn.Conv2d(None, 4, np.int64(3)).kernel_size == (3, 3)


def test_state_dict_round_trip_and_errors():
    a = models.build("resnet20", seed=1)
    b = models.build("resnet20", seed=2)
    assert not np.array_equal(a.parameters()["conv1.weight"].data,
                              b.parameters()["conv1.weight"].data)
    b.load_state_dict(a.state_dict())
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v, b.state_dict()[k])
    state = a.state_dict()
    del state["fc.bias"]
    with pytest.raises(KeyError, match="missing \\['fc.bias'\\]"):
        b.load_state_dict(state)
    # a bad value anywhere changes nothing, even in the tensors before it
    c = models.build("resnet20", seed=2)
    for key, value, error, message in (
            ("fc.bias", np.zeros(3, np.float32), ValueError, "fc.bias: expected shape \\(10,\\)"),
            ("fc.weight", np.full((10, 64), "x"), TypeError, "fc.weight: expected an array of numbers"),
            ("fc.weight", np.ones((10, 64), bool), TypeError, "expected an array of numbers"),
            ("layer3.2.bn2.num_batches_tracked", np.array(np.nan), ValueError,
             "num_batches_tracked: expected whole numbers, got \\[nan\\]"),
            ("bn1.num_batches_tracked", np.array(2.5), ValueError, "expected whole numbers")):
        state = a.state_dict()
        state[key] = value
        with pytest.raises(error, match=message):
            b.load_state_dict(state)
        with pytest.raises(error, match=message):
            c.load_state_dict(state)
        for k, v in models.build("resnet20", seed=2).state_dict().items():
            np.testing.assert_array_equal(c.state_dict()[k], v)


def test_a_layer_is_one_node_of_one_net():
    """A layer added twice would share its parameters, whose gradients the second
    backward overwrites; added to a second net it would be built again, its first
    net's weights redrawn."""
    net = Net((3, 8, 8))
    conv = nn.Conv2d(3, 3, 3, padding=1)
    net.add("c1", conv)
    with pytest.raises(ValueError, match="'c2': this Conv2d is already node 'c1' of a net"):
        net.add("c2", conv)
    with pytest.raises(ValueError, match="already node 'c1'"):
        Net((3, 8, 8)).add("c", conv)
    assert list(net.nodes) == ["input", "c1"]


def test_initialize_is_deterministic_and_follows_the_spec():
    a, b = models.build("cifar10_quick", seed=5), models.build("cifar10_quick", seed=5)
    for k, p in a.parameters().items():
        np.testing.assert_array_equal(p.data, b.parameters()[k].data)
    w = models.build("cifar10_quick", seed=0).parameters()
    assert abs(w["conv1.weight"].data.std() - 1e-4) < 1e-5     # Caffe's Gaussian(0.0001)
    assert abs(w["ip1.weight"].data.std() - 0.1) < 5e-3
    assert not w["conv1.bias"].data.any()


@pytest.mark.parametrize("name", ["cifar10_quick", "lenet", "resnet20", "cifar10_full",
                                  "vgg11_bn"])
def test_plan_predicts_the_activation_memory_the_executor_holds(name, rng):
    net = models.build(name, seed=0)
    batch = 3
    plan = make_plan(net, batch)
    ex = Executor(net, plan)
    ex.track_memory = True
    x = rng.standard_normal((batch, *net.input_shape)).astype(np.float32)
    ex.train_step(x, rng.integers(0, 10, batch))  # int64 labels, as the loader's
    # the batch (images and labels), activations and gradients, BatchNorm's statistics
    assert ex.peak_activation_bytes == plan.memory["activation_peak"]


def test_the_executor_measures_at_the_loss(rng):
    """A net whose activation peak is its logits and their gradient, at the loss (the
    executor measures there too, as the plan counts)."""
    net = Net((1, 4, 4))
    net.add("flat", nn.Flatten())
    net.add("fc", nn.Linear(None, 1000))
    net.initialize(0)
    plan = make_plan(net, 2)
    ex = Executor(net, plan)
    ex.track_memory = True
    ex.train_step(rng.standard_normal((2, 1, 4, 4)).astype(np.float32), np.array([3, 7]))
    assert ex.peak_activation_bytes == plan.memory["activation_peak"] == \
        2 * (16 + 2 * 1000) * 4 + 2 * 8  # the batch, logits, dlogits, labels


def test_plan_is_printable_data():
    plan = make_plan(models.build("resnet20", seed=None), 128)
    d = json.loads(plan.to_json())
    assert d["batch_size"] == 128 and d["device"] == "cpu" and d["slices"] == 1
    assert len(d["steps"]) == len(plan.steps)
    first = plan.step("conv1")
    assert first.shape == [128, 16, 32, 32] and first.need_dx == [False]
    assert first.flops == 2 * 128 * 16 * 32 * 32 * 27
    assert plan.step("layer1.0.add").inputs == ["layer1.0.bn2", "relu"]
    m = plan.memory
    assert m["peak"] == m["params"] + m["buffers"] + m["optimizer"] + m["step_peak"]
    assert m["activation_peak"] < m["step_peak"] <= m["activation_peak"] + m["grads"]
    text = str(plan)
    assert "layer3.2.conv2" in text and "predicted peak" in text
    with pytest.raises(KeyError, match="no step named"):
        plan.step("nope")
    lenet = models.build("lenet", seed=None)
    for kw, error, match in ((dict(batch_size=0), ValueError, "batch_size must be a positive int"),
                             (dict(batch_size=True), ValueError, "batch_size"),
                             (dict(optimizer_slots=-1), ValueError, "optimizer_slots must be >= 0"),
                             (dict(optimizer_slots=2.5), TypeError, "optimizer_slots must be an int"),
                             (dict(fuse="no"), TypeError, "fuse must be a bool, got 'no'")):
        with pytest.raises(error, match=match):
            make_plan(lenet, **{"batch_size": 4, **kw})
    assert make_plan(lenet, np.int64(4), optimizer_slots=np.int64(2)).batch_size == 4


def test_executor_checks_its_input(rng):
    net = models.build("lenet", seed=0)
    ex = Executor(net, batch_size=2)
    with pytest.raises(ValueError, match=r"takes batches of shape \(N, 1, 28, 28\)"):
        ex.predict(np.zeros((2, 3, 28, 28), np.float32))
    with pytest.raises(ValueError, match="does not match the layers"):
        Executor(net, make_plan(models.build("cifar10_quick", seed=None), 2))
    with pytest.raises(ValueError, match="names, kinds and output shapes"):  # other inputs
        Executor(models.build("resnet20", seed=0),
                 make_plan(models.build("resnet20", (3, 8, 8), seed=None), 2))


def test_training_steps_that_cannot_run_fail_before_they_start():
    for fuse in (False, True):
        ex = Executor(models.build("resnet20", seed=0), make_plan(
            models.build("resnet20", seed=None), 2, fuse=fuse))
        with pytest.raises(ValueError, match="needs a batch of at least 1 sample, got 0"):
            ex.train_step(np.zeros((0, 3, 32, 32), np.float32), np.zeros(0, np.int64))
        net = Net((4,))
        net.add("fc", nn.Linear(out_features=3))
        net.add("bn", nn.BatchNorm2d())
        net.initialize(0)
        ex = Executor(net, make_plan(net, 1, fuse=fuse))
        with pytest.raises(ValueError, match="more than 1 value per channel in BatchNorm 'bn': "
                                             "got a batch of 1"):
            ex.train_step(np.zeros((1, 4), np.float32), np.zeros(1, np.int64))
        assert net.buffers()["bn.num_batches_tracked"] == 0


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick", "resnet20"])
def test_predict_on_an_empty_batch(name):
    net = models.build(name, seed=0)
    empty = np.zeros((0, *net.input_shape), np.float32)
    assert Executor(net, batch_size=2).predict(empty).shape == (0, 10)


def test_timings_count_the_gradient_sums_in_the_layer_that_adds(rng, monkeypatch):
    """A residual block's input gradient is summed by the executor in the plain plan and
    by the convolution's store in the fused one: either way the layer's backward time
    includes it, so the two plans' per-layer times compare like with like."""
    net = models.build("resnet20", seed=0)
    ex = Executor(net, make_plan(net, 2, fuse=False))
    add = runtime.ops.add

    def slow_add(a, b):
        time.sleep(0.05)
        return add(a, b)

    monkeypatch.setattr(runtime.ops, "add", slow_add)
    ex.timings = {}
    ex.train_step(rng.standard_normal((2, 3, 32, 32)).astype(np.float32), np.array([1, 2]))
    summed = [k for k, (_, back) in ex.timings.items() if back >= 0.05]
    # each block's first convolution hands back the gradient that meets the shortcut's
    assert summed == [f"layer{i}.{j}.conv1" for i in (1, 2, 3) for j in range(3)]


def test_predict_uses_running_statistics_and_no_dropout(rng):
    net = Net((4,))
    net.add("bn", nn.BatchNorm2d())
    net.add("drop", nn.Dropout(0.5))
    ex = Executor(net, batch_size=8)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    np.testing.assert_allclose(ex.predict(x), x / np.sqrt(1 + 1e-5), rtol=1e-6)
    ex.train_step(x, rng.integers(0, 4, 8))
    assert int(net.buffers()["bn.num_batches_tracked"]) == 1
    assert not np.allclose(net.buffers()["bn.running_mean"], 0)


def test_inference_fusion_finds_conv_bn_relu_chains():
    g = inference_fusion(models.build("resnet20", seed=None))
    assert g["conv1"] == ["bn1", "relu"]
    assert g["layer1.0.conv1"] == ["layer1.0.bn1", "layer1.0.relu1"]
    assert g["layer1.0.conv2"] == ["layer1.0.bn2"]  # then the add: the ReLU reads the sum
    assert g["layer2.0.downsample.0"] == ["layer2.0.downsample.1"]
    assert g["layer1.0.add"] == ["layer1.0.relu2"]
    assert g["layer3.2.add"] == ["layer3.2.relu2"]  # the last block's too (the pool reads it)
    assert len(g) == 21 + 9  # every convolution and every residual addition
    # poolings too, and a ReLU after a pooling
    assert inference_fusion(models.build("cifar10_quick", seed=None)) == {
        "conv1": ["pool1", "relu1"], "conv2": ["relu2", "pool2"], "conv3": ["relu3", "pool3"]}
    g = inference_fusion(models.build("vgg11_bn", seed=None))
    assert g["conv1"] == ["bn1", "relu1", "pool1"] and g["conv3"] == ["bn3", "relu3"]
    # an output read twice exists: nothing after it is absorbed
    net = Net((2, 6, 6))
    net.add("conv", nn.Conv2d(out_channels=3, padding=1))
    net.add("bn", nn.BatchNorm2d())
    net.add("relu", nn.ReLU())
    net.add("sum", nn.Add(), inputs=["bn", "relu"])
    assert inference_fusion(net) == {"conv": ["bn"]}


@pytest.mark.parametrize("name", ["resnet20", "cifar10_quick", "vgg11_bn", "lenet"])
def test_predict_folds_batchnorm_and_fuses_relu(name, rng):
    """Evaluation with BatchNorm folded into the convolutions, ReLU in their epilogue and
    the poolings in their calls gives the unfused logits within float32 rounding (bit for
    bit without a fold)."""
    net = models.build(name, seed=1)
    for k, b in net.buffers().items():  # statistics far from the identity
        if k.endswith("running_mean"):
            b[...] = rng.standard_normal(b.shape)
        elif k.endswith("running_var"):
            b[...] = rng.uniform(0.2, 3.0, b.shape)
    for k, p in net.parameters().items():
        if "bn" in k or "downsample.1" in k:
            p.data[...] = rng.uniform(0.5, 1.5, p.data.shape)
    x = rng.standard_normal((3, *net.input_shape)).astype(np.float32)
    fused = Executor(net, batch_size=3)
    assert fused.inference_groups == inference_fusion(net)
    plain = Executor(net, batch_size=3, fuse_inference=False).predict(x)
    got = fused.predict(x)
    if name in ("cifar10_quick", "lenet"):
        np.testing.assert_array_equal(got, plain)
    else:
        assert np.abs(got - plain).max() <= 1e-5 * np.abs(plain).max()
    # training is not fused: the step's logits are the unfused forward's
    ex = Executor(net, batch_size=3)
    ref_ex = Executor(net, batch_size=3, fuse_inference=False)
    y = rng.integers(0, 10, 3)
    np.testing.assert_array_equal(ex.train_step(x, y)[1], ref_ex.train_step(x, y)[1])


def test_cpu_executor_keeps_freed_memory_unless_told_not_to():
    """... and the kernels keep their own scratch block either way (minidl.set_keep_workspace):
    given back after each call, it fragmented the heap that malloc keeps."""
    code = ("import minidl; from minidl import models; from minidl.runtime import Executor,"
            " keep_freed_memory; Executor(models.build('lenet', seed=None)); "
            "print(keep_freed_memory(), minidl.get_keep_workspace())")
    env = dict(os.environ)
    # glibc's own malloc (an interposed one, such as AddressSanitizer's, ignores mallopt)
    glibc = platform.libc_ver()[0] == "glibc" and "asan" not in os.environ.get("LD_PRELOAD", "")
    for value, want in (("1", f"{glibc} True"), ("0", "False True")):
        env["MINIDL_KEEP_MEMORY"] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == want
