"""Random nets (seeded DAGs of every layer kind: residual Adds, branches read twice or
not at all, pools, strided convolutions, dropout, hidden Linear layers) through the planner
and the executor, fused and not: the plan's memory prediction is what the cpu and sim
measure, the fused plan computes the plain plan's loss, and both plans' gradients are
those of a float64 interpretation of the graph."""
import os
import subprocess
import sys

import numpy as np
import pytest

import minidl
import reference as ref
from minidl import nn
from minidl.device import get_device
from minidl.graph import INPUT
from minidl.optim import SGD
from minidl.plan import make_plan
from minidl.runtime import Executor


def random_net(seed: int) -> minidl.Net:
    r = np.random.default_rng(seed)
    size = int(r.choice([8, 9, 12]))
    net = minidl.Net((int(r.choice([1, 3])), size, size), f"random{seed}")
    names = []

    def add(layer, inputs=None):
        names.append(f"n{len(names)}_{type(layer).__name__}")
        net.add(names[-1], layer, inputs)
        return names[-1]

    def bn_fits(node):  # at least 8 values per channel at batch 2, no BatchNorm of one
        c, h, w = net.nodes[node].shape
        return h * w >= 4 and not isinstance(net.nodes[node].layer, nn.BatchNorm2d)

    cur = add(nn.Conv2d(out_channels=int(r.choice([4, 8])), padding=1, bias=bool(r.random() < .3)))
    for _ in range(int(r.integers(3, 10))):
        c, h, _ = net.nodes[cur].shape
        t = r.random()
        if t < .25:
            k = int(r.choice([1, 3, 5]))
            cur = add(nn.Conv2d(out_channels=int(r.choice([c, 2 * c])), kernel_size=k,
                                stride=int(r.choice([1, 2])) if h > 4 else 1, padding=k // 2,
                                bias=bool(r.random() < .3)), cur)
        elif t < .4 and bn_fits(cur):
            cur = add(nn.BatchNorm2d(), cur)
        elif t < .55:
            cur = add(nn.ReLU(), cur)
        elif t < .65 and h >= 4:
            cur = add(nn.MaxPool2d(int(r.choice([2, 3])), stride=2, ceil_mode=bool(r.random() < .3))
                      if r.random() < .6 else nn.AvgPool2d(2), cur)
        elif t < .7:
            cur = add(nn.Dropout(0.2), cur)
        elif t < .9:  # a residual block: conv (bn) (relu conv (bn)), added to a same-shape node
            b = add(nn.Conv2d(out_channels=c, padding=1, bias=False), cur)
            if bn_fits(b) and r.random() < .8:
                b = add(nn.BatchNorm2d(), b)
            if r.random() < .6:
                b = add(nn.Conv2d(out_channels=c, padding=1, bias=False), add(nn.ReLU(), b))
                if bn_fits(b) and r.random() < .8:
                    b = add(nn.BatchNorm2d(), b)
            same = [k for k in names if k != b and net.nodes[k].shape == net.nodes[b].shape]
            other = str(r.choice(same)) if same and r.random() < .4 else cur
            cur = add(nn.Add(), [b, other] if r.random() < .5 else [other, b])
            if r.random() < .7:
                cur = add(nn.ReLU(), cur)
        else:  # go on from an earlier node: cur is read by nothing more, or by fewer
            cur = str(r.choice(names))
    add(nn.GlobalAvgPool2d() if r.random() < .5 else nn.Flatten(), cur)
    if r.random() < .4:  # a hidden layer: Linear (BatchNorm) (ReLU) (Dropout)
        add(nn.Linear(out_features=int(r.choice([7, 16]))))
        for layer, p in ((nn.BatchNorm2d(), .5), (nn.ReLU(), .7), (nn.Dropout(0.5), .3)):
            if r.random() < p:
                add(layer)
    add(nn.Linear(out_features=10))
    return net


SEEDS = [*range(40),
         79100, 81964,  # a bias ahead of a BatchNorm whose rounding passed 1e-4 of the floor
         203580, 206307,  # weights behind BatchNorms over 4 samples, 1.1e-4 and 1.8e-4
         15100]  # a fused loss 1.6e-4 off the plain one's behind a BatchNorm over 2 samples


@pytest.mark.parametrize("seed", SEEDS)
def test_random_nets_memory_and_fusion(seed):
    batch = 2 + seed % 4
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *random_net(seed).input_shape)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    losses = []
    for fuse in (False, True):
        net = random_net(seed).initialize(seed)
        plan = make_plan(net, batch, fuse=fuse)
        ex = Executor(net, plan)
        ex.track_memory = True
        losses.append(ex.train_step(x, y)[0])
        assert ex.peak_activation_bytes == plan.memory["activation_peak"], fuse
        dev = get_device("sim")
        net = random_net(seed).initialize(seed).to(dev)
        opt = SGD(net.parameters(), lr=0.01, momentum=0.9)
        plan = make_plan(net, batch, device=dev, fuse=fuse)
        ex = Executor(net, plan)
        ex.track_memory = True
        for _ in range(2):
            ex.train_step(x, y)
            opt.step()
            assert ex.peak_device_bytes == plan.memory["peak"], fuse
    # The fused loss is the plain one's within rounding: 1e-4 of it, or, where the net
    # amplifies rounding more (a BatchNorm of a hidden layer over 2 or 3 values, whose
    # input's differences cancel: 1.6e-4 at seed 15100), as much as the plain loss moves
    # when each input value moves by 2^-16 of itself (Winograd's rounding is about 2^-17.6)
    net = random_net(seed).initialize(seed)
    signs = np.random.default_rng(seed).choice(np.float32([-1, 1]), x.shape)
    moved = Executor(net, make_plan(net, batch, fuse=False)).train_step(
        x * (1 + 2.0**-16 * signs), y)[0]
    tol = max(1e-4 * abs(losses[0]), abs(moved - losses[0]))
    assert np.isfinite(losses[0]) and abs(losses[1] - losses[0]) <= tol, (losses, moved)


def _kink_margin(layer, x) -> float:
    """How near x is to a kink of layer: the smallest |input| of a ReLU, or the
    smallest gap between a max pool window's two largest values (exact zeros and ties,
    which float32 reproduces, left out), over the largest |x| where that exceeds 1
    (float32 rounds in proportion to the values: a ReLU of inputs up to 20 flipped at
    1.35e-5); inf for the other layers."""
    if isinstance(layer, nn.ReLU):
        gaps = np.abs(x)
    elif isinstance(layer, nn.MaxPool2d):
        rows, cols = ref._pool_geometry(x, *_pool(layer))
        gaps = np.concatenate([
            np.diff(np.sort(x[:, :, h0:h1, w0:w1].reshape(*x.shape[:2], -1))[..., -2:]).ravel()
            for h0, h1, _ in rows for w0, w1, _ in cols])
    else:
        return np.inf
    scale = max(1.0, float(np.abs(x).max(initial=0.0)))
    return float(gaps[gaps > 0].min(initial=np.inf)) / scale


def _pool(layer):
    return layer.kernel_size, layer.stride, layer.padding, layer.ceil_mode


def _p(layer, name):
    return np.asarray(layer.params[name].data, np.float64) if name in layer.params else None


def reference_forward(net, x):
    """(every node's output, each BatchNorm's (mean, invstd), kink margin) of net in
    training mode, in float64 from tests/reference.py's ops; the margin is the smallest
    `_kink_margin` of its layers.  Dropout must be off."""
    out, stats, margin = {INPUT: np.asarray(x, np.float64)}, {}, np.inf
    for k, n in net.layers():
        layer, xs = n.layer, [out[i] for i in n.inputs]
        margin = min(margin, _kink_margin(layer, xs[0]))
        if isinstance(layer, nn.Conv2d):
            y_ = ref.conv2d(xs[0], _p(layer, "weight"), _p(layer, "bias"), layer.stride,
                            layer.padding)
        elif isinstance(layer, nn.BatchNorm2d):
            y_, *stats[k] = ref.batch_norm_train(xs[0], _p(layer, "weight"), _p(layer, "bias"),
                                                 layer.eps)[:3]
        elif isinstance(layer, nn.Linear):
            y_ = ref.linear(xs[0], _p(layer, "weight"), _p(layer, "bias"))
        elif isinstance(layer, nn.MaxPool2d):
            y_ = ref.max_pool2d(xs[0], *_pool(layer))
        elif isinstance(layer, nn.AvgPool2d):
            y_ = ref.avg_pool2d(xs[0], *_pool(layer))
        elif isinstance(layer, nn.GlobalAvgPool2d):
            y_ = ref.global_avg_pool2d(xs[0])
        elif isinstance(layer, nn.ReLU):
            y_ = ref.relu(xs[0])
        elif isinstance(layer, nn.Add):
            y_ = ref.add(*xs)
        else:  # Flatten, Dropout(0)
            assert isinstance(layer, nn.Flatten) or layer.p == 0, layer
            y_ = xs[0].reshape(len(xs[0]), *n.shape)
        out[k] = y_
    return out, stats, margin


def reference_gradients(net, x, y):
    """(mean cross-entropy, {parameter name: gradient}, kink margin, {bias name: sums of
    |dy|}) of net in training mode, in float64: `reference_forward`, then backward in
    reverse node order, each node's gradients summed over its readers.  A bias's gradient
    sums its dy over the batch and the pixels; the same sums of |dy| give the size of
    the terms whose float32 rounding it holds."""
    out, stats, margin = reference_forward(net, x)
    loss, dy = ref.softmax_cross_entropy(out[net.output], y)
    grads, terms = {net.output: dy}, {}
    for k, n in reversed(list(net.layers())):
        if k not in grads:  # nothing reads it
            continue
        layer, xs, dy = n.layer, [out[i] for i in n.inputs], grads[k]
        if isinstance(layer, (nn.Conv2d, nn.Linear, nn.BatchNorm2d)):
            terms[f"{k}.bias"] = np.abs(dy).sum(axis=(0, *range(2, dy.ndim)))
        if isinstance(layer, nn.Conv2d):
            dx, grads[f"{k}.weight"], grads[f"{k}.bias"] = ref.conv2d_backward(
                xs[0], _p(layer, "weight"), dy, layer.stride, layer.padding)
            dxs = [dx]
        elif isinstance(layer, nn.Linear):
            dx, grads[f"{k}.weight"], grads[f"{k}.bias"] = ref.linear_backward(
                xs[0], _p(layer, "weight"), dy)
            dxs = [dx]
        elif isinstance(layer, nn.BatchNorm2d):
            dx, grads[f"{k}.weight"], grads[f"{k}.bias"] = ref.batch_norm_backward(
                xs[0], _p(layer, "weight"), dy, *stats[k])
            dxs = [dx]
        elif isinstance(layer, nn.MaxPool2d):
            dxs = [ref.max_pool2d_backward(xs[0], dy, *_pool(layer))]
        elif isinstance(layer, nn.AvgPool2d):
            dxs = [ref.avg_pool2d_backward(xs[0].shape, dy, *_pool(layer))]
        elif isinstance(layer, nn.GlobalAvgPool2d):
            dxs = [ref.global_avg_pool2d_backward(xs[0].shape, dy)]
        elif isinstance(layer, nn.ReLU):
            dxs = [ref.relu_backward(xs[0], dy)]
        elif isinstance(layer, nn.Add):
            dxs = [dy, dy]
        else:
            dxs = [dy.reshape(xs[0].shape)]
        for i, dx in zip(n.inputs, dxs):
            grads[i] = grads[i] + dx if i in grads else dx
    params = net.parameters()
    return (loss, {k: grads.get(k, np.zeros(v.data.shape)) for k, v in params.items()}, margin,
            terms)


KINK = 1e-5  # of _kink_margin: activations rounded through float32 layers flipped up to 9e-6
# Winograd's own rounding (about 5e-6 of a convolution's largest output) adds up over a
# deep random net to 1e-4 - 2e-4 in a gradient; GEMM convolutions' to a few 1e-6, but a
# BatchNorm over 4 samples amplifies it: up to 1.8e-4 in 25,500 nets, with the scalar
# kernels as with AVX2, fused or not
TOLERANCE = {"gemm": 3e-4, "auto": 1e-3}


@pytest.mark.parametrize("algo", sorted(TOLERANCE))
@pytest.mark.parametrize("seed", SEEDS)
def test_random_nets_gradients_are_the_float64_graphs(seed, algo):
    """Plain and fused, each parameter's gradient within TOLERANCE (relative L2) of the
    float64 one, over a floor of 10% of the largest gradient's norm and, for a bias, the
    norm of its sums of |dy|: a bias ahead of a BatchNorm has an exact gradient of 0, so
    it holds rounding alone, of the size of the terms it sums; the loss within a tenth
    of it.  At least 4 samples: a BatchNorm of a hidden layer over 2 or 3 values
    amplifies rounding (its input's differences cancel) past any fixed tolerance.  A
    net whose gradients fail with a ReLU input or a max pool's gap within KINK of its
    kink is skipped: float32 rounding may take the other side there, which moves the
    gradients but not the loss (about 1 net in 600)."""
    net = random_net(seed).initialize(seed)
    for _, n in net.layers():
        if isinstance(n.layer, nn.Dropout):
            n.layer.p = 0.0
    batch = 4 + seed % 3
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *net.input_shape)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    loss, want, margin, terms = reference_gradients(net, x, y)
    floor = 0.1 * max(np.linalg.norm(g) for g in want.values())
    tol, bad = TOLERANCE[algo], []
    minidl.set_conv_algo(algo)
    try:
        for fuse in (False, True):
            got = Executor(net, make_plan(net, batch, fuse=fuse)).train_step(x, y)[0]
            # the loss is continuous at a kink: never excused by one
            assert abs(got - loss) <= tol / 10 * loss, (fuse, got, loss)
            for k, prm in net.parameters().items():
                g = np.zeros(prm.data.shape) if prm.grad is None else prm.grad
                scale = max(np.linalg.norm(want[k]), floor, np.linalg.norm(terms.get(k, 0)))
                err = np.linalg.norm(g - want[k]) / scale
                if not err <= tol:
                    bad.append((fuse, k, err))
    finally:
        minidl.set_conv_algo("auto")
    if bad and margin < KINK:
        pytest.skip(f"a kink {margin:.1e} away")
    assert not bad, (f"nearest kink {margin:.1e}", bad)


@pytest.mark.parametrize("script", ["fuzz_conv.py", "fuzz_gemm.py", "fuzz_layers.py",
                                    "fuzz_nets.py"])
def test_the_fuzz_scripts_run(script):
    """dev/'s longer runs of this check, of the convolution family, of the SGEMM and of
    BatchNorm and pooling, for 2 seconds."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "dev", script)
    run = subprocess.run([sys.executable, path, "7", "2"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and ", 0 " in run.stdout, run.stdout + run.stderr
