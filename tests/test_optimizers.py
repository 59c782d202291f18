"""minidl.optim: the optimizer classes over named parameters (state, skipping
parameters without gradients, state round trip) and the learning-rate schedules."""
import math

import numpy as np
import pytest

from minidl import optim
from minidl.nn import Parameter


def params(rng, shapes=((3, 4), (5,))):
    ps = {}
    for i, s in enumerate(shapes):
        p = Parameter(s, 0.0)
        p.data[...] = rng.standard_normal(s)
        ps[f"p{i}"] = p
    return ps


def sgd_reference(p, grads, lr, momentum, wd, nesterov):
    """torch.optim.SGD's update in float64."""
    p = p.astype(np.float64)
    buf = None
    for g in grads:
        g = g + wd * p
        buf = g.copy() if buf is None else momentum * buf + g
        p = p - lr * (g + momentum * buf if nesterov else buf)
    return p


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_follows_torch_rule_over_steps(rng, nesterov):
    ps = params(rng)
    start = {k: p.data.copy() for k, p in ps.items()}
    opt = optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2, nesterov=nesterov)
    grads = {k: [rng.standard_normal(p.data.shape).astype(np.float32) for _ in range(4)]
             for k, p in ps.items()}
    for i in range(4):
        for k, p in ps.items():
            p.grad = grads[k][i]
        opt.step()
    for k, p in ps.items():
        want = sgd_reference(start[k], grads[k], 0.1, 0.9, 1e-2, nesterov)
        np.testing.assert_allclose(p.data, want, rtol=1e-5, atol=1e-6)
    assert opt.steps == 4


def test_adam_and_adamw(rng):
    for cls, decoupled in ((optim.Adam, False), (optim.AdamW, True)):
        ps = params(rng)
        start = {k: p.data.astype(np.float64) for k, p in ps.items()}
        opt = cls(ps, lr=0.01, betas=(0.5, 0.75), weight_decay=0.1)
        g = {k: rng.standard_normal(p.data.shape).astype(np.float32) for k, p in ps.items()}
        for k, p in ps.items():
            p.grad = g[k]
        opt.step()
        for k, p in ps.items():
            x = start[k] * (1 - 0.01 * 0.1) if decoupled else start[k]
            gg = g[k] + (0 if decoupled else 0.1 * start[k])
            m, v = 0.5 * gg, 0.25 * gg * gg        # bias-corrected: (1-b1) g / (1-b1) = g
            want = x - 0.01 * (m / 0.5) / (np.sqrt(v / 0.25) + 1e-8)
            np.testing.assert_allclose(p.data, want, rtol=1e-5, atol=1e-6)


def test_parameters_without_gradient_are_left_alone(rng):
    ps = params(rng)
    before = ps["p1"].data.copy()
    ps["p0"].grad = np.ones_like(ps["p0"].data)
    optim.SGD(ps, lr=0.1, momentum=0.9).step()
    np.testing.assert_array_equal(ps["p1"].data, before)


def test_state_round_trip_continues_identically(rng):
    ps, qs = params(rng), params(rng)
    for k in ps:
        qs[k].data[...] = ps[k].data
    a = optim.SGD(ps, lr=0.1, momentum=0.9)
    g = {k: rng.standard_normal(p.data.shape).astype(np.float32) for k, p in ps.items()}
    for k, p in ps.items():
        p.grad = g[k]
    a.step()
    b = optim.SGD(qs, lr=0.1, momentum=0.9)
    b.load_state_dict({k: v.copy() for k, v in a.state_dict().items()})
    for k in qs:
        qs[k].data[...] = ps[k].data
        qs[k].grad = g[k]
    a.step()
    b.step()
    for k in ps:
        np.testing.assert_array_equal(ps[k].data, qs[k].data)
    assert set(a.state_dict()) == {"momentum_buffer.p0", "momentum_buffer.p1", "steps"}
    with pytest.raises(KeyError, match="missing"):
        b.load_state_dict({"steps": np.array(1)})
    before = b.state_dict()
    for key, value, message in (("momentum_buffer.p1", np.zeros(2, np.float32), "expected shape"),
                                ("steps", np.array("x"), "steps: expected an array of numbers"),
                                ("steps", np.array(np.inf), "steps: expected whole numbers")):
        bad = dict(a.state_dict(), **{key: value})
        with pytest.raises((TypeError, ValueError), match=message):
            b.load_state_dict(bad)
        for k, v in b.state_dict().items():  # nothing changed, not even p0's buffer
            np.testing.assert_array_equal(v, before[k])
    with pytest.raises(ValueError, match="no parameters"):
        optim.SGD({}, lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD(ps, lr=0.1, nesterov=True)


@pytest.mark.parametrize("cls,kw", [(optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-2)),
                                    (optim.SGD, dict(lr=0.1)),
                                    (optim.Adam, dict(lr=1e-2, weight_decay=1e-2)),
                                    (optim.AdamW, dict(lr=1e-2))])
def test_direct_kernel_path_matches_ops_path(rng, cls, kw):
    """Host float32 gradients go to the C kernel directly; float64 or non-contiguous
    gradients through minidl.ops (which converts them).  Both give the same bits."""
    shapes = ((3, 4), (5,), (2, 3, 3, 3))
    a, b = params(rng, shapes), params(rng, shapes)
    for k in b:
        b[k].data[...] = a[k].data
    oa, ob = cls(a, **kw), cls(b, **kw)
    for _ in range(3):
        for k in a:
            g = rng.standard_normal(a[k].data.shape).astype(np.float32)
            a[k].grad = g
            wide = np.empty(g.shape + (2,), np.float32)
            wide[..., 0] = g
            b[k].grad = wide[..., 0] if g.ndim > 1 else g.astype(np.float64)  # not direct
        oa.step()
        ob.step()
    for k in a:
        np.testing.assert_array_equal(a[k].data, b[k].data)


@pytest.mark.parametrize("cls,kw", [(optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-2)),
                                    (optim.Adam, dict(lr=1e-2, weight_decay=1e-2))])
def test_device_parameters_take_the_direct_path(rng, monkeypatch, cls, kw):
    """Parameters, gradients and state on one device go to the device's kernel directly
    (one launch each, none through minidl.ops): the same bits as on the host; a
    gradient left on the host goes through minidl.ops, which refuses it."""
    from minidl.device import get_device
    sim = get_device("sim")
    shapes = ((3, 4), (5,), (2, 3, 3, 3))
    a = params(rng, shapes)
    b = {k: Parameter(p.data.shape, 0.0) for k, p in a.items()}
    for k in b:
        b[k].data = sim.to_device(a[k].data)
    oa, ob = cls(a, **kw), cls(b, **kw)
    real = getattr(optim.ops, cls.__name__.lower() + "_step")
    monkeypatch.setattr(optim.ops, real.__name__, lambda *a, **k: pytest.fail("not direct"))
    for _ in range(3):
        for k in a:
            a[k].grad = rng.standard_normal(a[k].data.shape).astype(np.float32)
            b[k].grad = sim.to_device(a[k].grad)
        oa.step()
        launches = sim.launches
        ob.step()
        assert sim.launches - launches == len(b)
    for k in a:
        np.testing.assert_array_equal(a[k].data, sim.to_host(b[k].data))
    monkeypatch.setattr(optim.ops, real.__name__, real)
    b["p0"].grad = a["p0"].grad
    with pytest.raises(ValueError, match="one device"):
        ob.step()


def test_hyper_parameters_checked_each_step(rng):
    ps = params(rng)
    for p in ps.values():
        p.grad = np.ones(p.data.shape, np.float32)
    for opt, attr in ((optim.SGD(ps, lr=0.1, momentum=0.9), "momentum"),
                      (optim.Adam(ps), "eps")):
        opt.lr = -1.0
        with pytest.raises(ValueError, match="Invalid learning rate"):
            opt.step()
        opt.lr = 0.1
        setattr(opt, attr, -1.0)
        with pytest.raises(ValueError, match="Invalid"):
            opt.step()


def test_bad_arguments_fail_at_construction(rng):
    ps = params(rng)
    for make, error, match in ((lambda: optim.SGD(ps, lr=-1), ValueError, "Invalid learning rate"),
                               (lambda: optim.SGD(ps, lr=0.1, dampening=float("nan")), ValueError,
                                "Invalid dampening"),
                               (lambda: optim.Adam(ps, betas=(0.9, 1.0)), ValueError,
                                "Invalid beta parameter at index 1"),
                               (lambda: optim.AdamW(ps, eps=-1), ValueError, "Invalid epsilon"),
                               (lambda: optim.SGD(list(ps.values()), lr=0.1), TypeError,
                                "params must map names to Parameters")):
        with pytest.raises(error, match=match):
            make()


def test_schedules():
    s = optim.multistep(1.0, [10, 20], gamma=0.1)
    assert [s(0), s(9), s(10), s(19), s(20)] == [1.0, 1.0, pytest.approx(0.1),
                                                   pytest.approx(0.1), pytest.approx(0.01)]
    c = optim.cosine(0.4, 100)
    assert c(0) == pytest.approx(0.4) and c(50) == pytest.approx(0.2) and c(100) == 0.0
    assert c(150) == 0.0
    w = optim.warmup(optim.constant(0.1), 10)
    assert w(0) == pytest.approx(0.01) and w(9) == pytest.approx(0.1) and w(50) == 0.1
    st = optim.make_schedule("step", 1.0, 100)             # x0.1 at 50% and 75%
    assert (st(49), st(50), st(75)) == (1.0, pytest.approx(0.1), pytest.approx(0.01))
    cw = optim.make_schedule("cosine", 1.0, 100, warmup_steps=5)
    assert cw(0) == pytest.approx(0.2 * 0.5 * (1 + math.cos(0)))
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'linear'"):
        optim.make_schedule("linear", 1.0, 10)
