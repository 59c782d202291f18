"""Finite-difference gradient checks through the layer API and through whole nets.

Each check draws a random cotangent r, takes L = sum(layer(x) * r) accumulated in
float64, and compares every coordinate of the analytic gradients (inputs and
parameters; a random sample of 60 coordinates for large arrays) with the central
difference (L(v + h) - L(v - h)) / 2h.  The step and the threshold are stated once;
inputs are kept at least 4h away from the kinks of ReLU and max pooling.
"""
import numpy as np
import pytest

from minidl import Net, nn
from minidl.runtime import Executor

H = 1e-2           # finite-difference step (1e-3 through whole nets, where a larger
                   # step on a weight moves many activations across ReLU and max-pool kinks)
TOL = 2e-3         # |numeric - analytic| <= TOL * max(1, max |analytic|)
SAMPLES = 60


def _away_from_kinks(x):
    """Values spaced at least 4h apart from each other and from 0 (ReLU, max-pool ties)."""
    flat = x.reshape(-1)
    order = np.argsort(flat)
    vals = (np.arange(flat.size) - flat.size // 2 + 0.5) * 4.5 * H
    out = np.empty_like(flat)
    out[order] = vals
    return out.reshape(x.shape).astype(np.float32)


def _coords(a, rng):
    n = a.size
    return range(n) if n <= SAMPLES else rng.choice(n, SAMPLES, replace=False)


def _check(f, arrays, analytic, rng, what, h=H):
    """f() -> float64 loss; arrays: name -> float32 array perturbed in place;
    analytic: name -> gradient."""
    for name, a in arrays.items():
        g = np.asarray(analytic[name], np.float64).reshape(-1)
        flat = a.reshape(-1)
        scale = max(1.0, float(np.abs(g).max()))
        for i in _coords(a, rng):
            v = flat[i]
            flat[i] = v + h
            up = f()
            flat[i] = v - h
            down = f()
            flat[i] = v
            num = (up - down) / (2 * h)
            assert abs(num - g[i]) <= TOL * scale, \
                f"{what}: d/d{name}[{i}] numeric {num:.6g} vs analytic {g[i]:.6g}"


def gradcheck_layer(layer, in_shapes, rng, batch=3, kinks=False, training=True):
    layer.build(in_shapes)
    layer.reset_parameters(rng)
    for p in layer.params.values():  # non-trivial gammas/biases too
        p.data += (0.1 * rng.standard_normal(p.data.shape)).astype(np.float32)
    xs = [rng.standard_normal((batch, *s)).astype(np.float32) for s in in_shapes]
    if kinks:
        xs = [_away_from_kinks(x) for x in xs]
    y, saved = layer.forward(xs, training, seed=11)
    r = rng.standard_normal(y.shape)
    dxs = layer.backward(r.astype(np.float32), saved, need_dx=True)

    def loss():
        return float(np.sum(layer.forward(xs, training, seed=11)[0].astype(np.float64) * r))

    arrays = {f"x{i}": x for i, x in enumerate(xs)}
    analytic = {f"x{i}": dx for i, dx in enumerate(dxs)}
    for k, p in layer.params.items():
        arrays[k], analytic[k] = p.data, p.grad
    _check(loss, arrays, analytic, rng, type(layer).__name__)


CASES = [
    ("conv", lambda: nn.Conv2d(None, 4, 3, stride=2, padding=1), [(3, 7, 6)], False),
    ("conv 1x1 no bias", lambda: nn.Conv2d(None, 5, 1, bias=False), [(3, 4, 4)], False),
    ("conv 5x5", lambda: nn.Conv2d(None, 2, 5, padding=2), [(2, 6, 5)], False),
    ("batchnorm 4d", lambda: nn.BatchNorm2d(), [(3, 4, 5)], False),
    ("batchnorm 2d", lambda: nn.BatchNorm2d(), [(6,)], False),
    ("relu", nn.ReLU, [(2, 3, 4)], True),
    ("maxpool ceil", lambda: nn.MaxPool2d(3, 2, ceil_mode=True), [(2, 7, 6)], True),
    ("maxpool pad", lambda: nn.MaxPool2d(3, 2, padding=1), [(2, 5, 5)], True),
    ("avgpool ceil", lambda: nn.AvgPool2d(3, 2, ceil_mode=True), [(2, 8, 7)], False),
    ("global avgpool", nn.GlobalAvgPool2d, [(3, 4, 5)], False),
    ("linear", lambda: nn.Linear(None, 4), [(7,)], False),
    ("dropout", lambda: nn.Dropout(0.3), [(4, 5)], False),
    ("flatten", nn.Flatten, [(2, 3, 4)], False),
    ("add", nn.Add, [(2, 3, 3), (2, 3, 3)], False),
]


@pytest.mark.parametrize("name,make,shapes,kinks", CASES, ids=[c[0] for c in CASES])
def test_layer_gradients(name, make, shapes, kinks, rng):
    gradcheck_layer(make(), shapes, rng, kinks=kinks)


def test_batchnorm_eval_gradients(rng):
    """In evaluation BatchNorm is affine in x with the running statistics."""
    layer = nn.BatchNorm2d()
    layer.build([(3, 4, 4)])
    layer.buffers["running_mean"][:] = [0.5, -1.0, 2.0]
    layer.buffers["running_var"][:] = [0.25, 2.0, 1.5]
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    y, _ = layer.forward([x], training=False)
    inv = 1 / np.sqrt(layer.buffers["running_var"].astype(np.float64) + layer.eps)
    want = (x - layer.buffers["running_mean"][:, None, None]) * inv[:, None, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_loss_head_gradient(rng):
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 5)
    loss_fn = nn.SoftmaxCrossEntropy()
    _, d = loss_fn(logits, labels)
    _check(lambda: float(loss_fn(logits, labels)[0]), {"logits": logits}, {"logits": d}, rng,
           "SoftmaxCrossEntropy")


def _tiny_resnet():
    """A branch that is read by two layers (gradients summed), BN, pooling, a head."""
    net = Net((3, 6, 6), "tiny")
    net.add("conv1", nn.Conv2d(None, 4, 3, padding=1))
    net.add("bn1", nn.BatchNorm2d())
    net.add("relu1", nn.ReLU())
    net.add("conv2", nn.Conv2d(None, 4, 3, padding=1, bias=False))
    net.add("bn2", nn.BatchNorm2d())
    net.add("add", nn.Add(), ["bn2", "relu1"])
    net.add("relu2", nn.ReLU())
    net.add("pool", nn.MaxPool2d(2))
    net.add("drop", nn.Dropout(0.25))
    net.add("gap", nn.GlobalAvgPool2d())
    net.add("fc", nn.Linear(None, 3))
    return net


def test_net_gradients_through_the_executor(rng):
    """Every parameter gradient of a residual net, from Executor.train_step, against
    finite differences of the loss (dropout masks fixed by the step counter)."""
    net = _tiny_resnet().initialize(3)
    ex = Executor(net, batch_size=4)
    x = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 4)
    ex.train_step(x, labels)
    params = net.parameters()
    analytic = {k: p.grad.copy() for k, p in params.items()}

    def loss():
        ex.step_count = 0  # same dropout mask every time
        return float(ex.loss(ex._forward(x, True)[0], labels)[0])

    ex.step_count = 0
    _check(loss, {k: p.data for k, p in params.items()}, analytic, rng, "tiny resnet",
           h=1e-3)
