"""SGD, Adam and AdamW steps against the float64 references, over several steps."""
import numpy as np
import pytest

from minidl import _C, ops

from helpers import assert_close, f32
import reference as ref

# 40001 is large enough for the range to be split over threads
SIZES = [1, 7, 8, 1000, 4097, 40001]
STEPS = 5

SGD_CONFIGS = [
    dict(),
    dict(weight_decay=1e-2),
    dict(momentum=0.9),
    dict(momentum=0.9, dampening=0.1),
    dict(momentum=0.9, dampening=0.5, weight_decay=1e-2),
    dict(momentum=0.9, nesterov=True),
    dict(momentum=0.9, nesterov=True, weight_decay=1e-2),
]


def _id(cfg):
    return ",".join(f"{k}={v}" for k, v in cfg.items()) or "plain"


@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=_id)
@pytest.mark.parametrize("size", SIZES)
def test_sgd(simd, threads, rng, size, cfg):
    lr = 0.1
    param = f32(rng, size)
    buf = np.full(size, np.nan, np.float32) if "momentum" in cfg else None  # never read on step 1
    want_p, want_b = param.astype(np.float64), None
    for step in range(STEPS):
        grad = f32(rng, size)
        first = step == 0
        out = ops.sgd_step(param, grad, buf, lr=lr, first_step=first, **cfg)
        assert out is param
        want_p, want_b = ref.sgd_step(want_p, grad, want_b, lr=lr, first_step=first, **cfg)
        if first and buf is not None and "weight_decay" not in cfg:
            np.testing.assert_array_equal(buf, grad)  # buf = g on the first step
    assert_close(param, want_p, "optim", "param", scale=1.0)  # params start ~N(0, 1)
    if buf is not None:
        assert_close(buf, want_b, "optim", "momentum_buffer", scale=1.0)


def test_sgd_2d_param_and_untouched_buffer(rng):
    param = f32(rng, 3, 5)
    grad = f32(rng, 3, 5)
    buf = f32(rng, 3, 5)
    before = buf.copy()
    want, _ = ref.sgd_step(param, grad, None, lr=0.5)
    ops.sgd_step(param, grad, buf, lr=0.5)  # momentum 0: the buffer is not used
    assert_close(param, want, "optim")
    np.testing.assert_array_equal(buf, before)


ADAM_CONFIGS = [
    dict(),
    dict(weight_decay=1e-2),
    dict(decoupled=True),
    dict(weight_decay=1e-2, decoupled=True),
    dict(betas=(0.3, 0.99), weight_decay=0.1),  # 1 - beta1 >= 0.5: the other lerp form
    dict(betas=(0.0, 0.5), eps=1e-3, decoupled=True, weight_decay=0.5),
]


@pytest.mark.parametrize("cfg", ADAM_CONFIGS, ids=_id)
@pytest.mark.parametrize("size", SIZES)
def test_adam(simd, threads, rng, size, cfg):
    hp = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    hp.update(cfg)
    # the C API takes float32 hyper-parameters: 1 - float32(0.999) differs from
    # 1 - 0.999 by 1.3e-5 relative, so the reference uses the rounded betas
    ref_hp = dict(hp, betas=tuple(float(np.float32(b)) for b in hp["betas"]))
    param = f32(rng, size)
    m = np.zeros(size, np.float32)
    v = np.zeros(size, np.float32)
    want = (param.astype(np.float64), np.zeros(size), np.zeros(size))
    for step in range(1, STEPS + 1):
        grad = f32(rng, size)
        assert ops.adam_step(param, grad, m, v, step=step, **hp) is param
        want = ref.adam_step(*want[:1], grad, *want[1:], step=step, **ref_hp)
    assert_close(param, want[0], "optim", "param", scale=1.0)
    assert_close(m, want[1], "optim", "exp_avg")
    assert_close(v, want[2], "optim", "exp_avg_sq")


def test_adam_takes_gradients_whose_square_overflows_float32(simd):
    """exp_avg_sq gains (1 - beta2) * g * g in that order (PyTorch's addcmul): g * g first
    made it inf from |g| ~ 1.8e19, and the parameter never moved again"""
    param, grad = np.zeros(19, np.float32), np.full(19, 1e20, np.float32)
    m, v = np.zeros(19, np.float32), np.zeros(19, np.float32)
    ops.adam_step(param, grad, m, v, step=1, lr=1e-3)
    np.testing.assert_allclose(v, (1 - float(np.float32(0.999))) * 1e40, rtol=1e-6)
    np.testing.assert_allclose(param, -1e-3, rtol=1e-5)


def test_adam_weight_decay_kinds_differ(rng):
    """Adam folds weight decay into the gradient, AdamW decays the parameter: with
    the same inputs the two must give different parameters."""
    grad = f32(rng, 64)
    out = []
    for decoupled in (False, True):
        param = np.ones(64, np.float32)
        m, v = np.zeros(64, np.float32), np.zeros(64, np.float32)
        ops.adam_step(param, grad, m, v, step=1, lr=0.1, weight_decay=0.5, decoupled=decoupled)
        out.append(param)
    assert np.abs(out[0] - out[1]).max() > 1e-3


def test_empty_param_is_a_no_op():
    e = np.zeros(0, np.float32)
    ops.sgd_step(e, e.copy(), e.copy(), lr=0.1, momentum=0.9)
    ops.adam_step(e, e.copy(), e.copy(), e.copy(), step=1)


def test_sgd_bad_inputs(rng):
    p, g, b = f32(rng, 6), f32(rng, 6), f32(rng, 6)
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        ops.sgd_step(p, g, lr=-1)
    with pytest.raises(ValueError, match="Invalid learning rate: nan"):
        ops.sgd_step(p, g, lr=float("nan"))
    with pytest.raises(TypeError, match="learning rate must be a real number"):
        ops.sgd_step(p, g, lr="0.1")
    with pytest.raises(ValueError, match="Invalid momentum value: -0.5"):
        ops.sgd_step(p, g, b, lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.1"):
        ops.sgd_step(p, g, lr=0.1, weight_decay=-0.1)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero damp"):
        ops.sgd_step(p, g, b, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero damp"):
        ops.sgd_step(p, g, b, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="momentum_buffer is required when momentum != 0"):
        ops.sgd_step(p, g, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"grad must have the shape of param \(6,\)"):
        ops.sgd_step(p, g[:5], lr=0.1)
    with pytest.raises(ValueError, match=r"momentum_buffer must have shape \(6,\)"):
        ops.sgd_step(p, g, b[:5], lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match="param must be a float32 array"):
        ops.sgd_step(p.astype(np.float64), g, lr=0.1)
    with pytest.raises(TypeError, match="param must be a numpy.ndarray"):
        ops.sgd_step(list(p), g, lr=0.1)
    with pytest.raises(ValueError, match="param must be C-contiguous"):
        ops.sgd_step(f32(rng, 12)[::2], g, lr=0.1)
    with pytest.raises(TypeError, match="momentum_buffer must be a float32 array"):
        ops.sgd_step(p, g, b.astype(np.float64), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="param and momentum_buffer must not share memory"):
        ops.sgd_step(p, g, p, lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match="grad must be a float32 array"):
        ops.sgd_step(p, g.astype(np.int32), lr=0.1)


def test_adam_bad_inputs(rng):
    p, g, m, v = (f32(rng, 6) for _ in range(4))
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        ops.adam_step(p, g, m, v, step=1, lr=-1)
    with pytest.raises(ValueError, match="Invalid epsilon value: -1e-08"):
        ops.adam_step(p, g, m, v, step=1, eps=-1e-8)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0: 1.0"):
        ops.adam_step(p, g, m, v, step=1, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: -0.1"):
        ops.adam_step(p, g, m, v, step=1, betas=(0.9, -0.1))
    with pytest.raises(ValueError, match="betas must be a pair"):
        ops.adam_step(p, g, m, v, step=1, betas=(0.9,))
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.01"):
        ops.adam_step(p, g, m, v, step=1, weight_decay=-0.01)
    with pytest.raises(ValueError, match="step must be >= 1, got 0"):
        ops.adam_step(p, g, m, v, step=0)
    with pytest.raises(TypeError, match="step must be an int"):
        ops.adam_step(p, g, m, v, step=1.0)
    with pytest.raises(ValueError, match=r"exp_avg_sq must have shape \(6,\)"):
        ops.adam_step(p, g, m, v[:4], step=1)
    with pytest.raises(ValueError, match=r"grad must have the shape of param \(6,\)"):
        ops.adam_step(p, g.reshape(2, 3), m, v, step=1)
    with pytest.raises(TypeError, match="exp_avg must be a float32 array"):
        ops.adam_step(p, g, m.astype(np.float64), v, step=1)
    with pytest.raises(ValueError, match="exp_avg and exp_avg_sq must not share memory"):
        ops.adam_step(p, g, m, m, step=1)
    ro = m.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="exp_avg must be writable"):
        ops.adam_step(p, g, ro, v, step=1)


def test_c_core_checks(rng):
    """The C core checks what the Python layer already did (other callers link it)."""
    p, g, b = f32(rng, 6), f32(rng, 6), f32(rng, 6)
    with pytest.raises(ValueError, match="momentum_buf must not be NULL when momentum != 0"):
        _C.sgd_step(p, g, None, 0.1, 0.9, 0.0, 0.0, False, False)
    with pytest.raises(ValueError, match="nesterov needs momentum > 0 and dampening == 0"):
        _C.sgd_step(p, g, b, 0.1, 0.9, 0.5, 0.0, True, False)
    with pytest.raises(ValueError, match="nesterov needs momentum > 0"):
        _C.sgd_step(p, g, b, 0.1, 0.0, 0.0, 0.0, True, False)
    with pytest.raises(ValueError, match="lr must be >= 0, got -1"):
        _C.sgd_step(p, g, b, -1.0, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(ValueError, match="momentum must be >= 0, got -0.5"):
        _C.sgd_step(p, g, b, 0.1, -0.5, 0.0, 0.0, False, False)
    with pytest.raises(ValueError, match="grad must not be NULL"):
        _C.sgd_step(p, None, b, 0.1, 0.0, 0.0, 0.0, False, False)
    m, v = f32(rng, 6), np.abs(f32(rng, 6))
    with pytest.raises(ValueError, match="step must be >= 1, got 0"):
        _C.adam_step(p, g, m, v, 0, 1e-3, 0.9, 0.999, 1e-8, 0.0, False)
    with pytest.raises(ValueError, match="beta1 must be in \\[0, 1\\), got 1"):
        _C.adam_step(p, g, m, v, 1, 1e-3, 1.0, 0.999, 1e-8, 0.0, False)
    with pytest.raises(ValueError, match="beta2 must be in \\[0, 1\\), got -0.5"):
        _C.adam_step(p, g, m, v, 1, 1e-3, 0.9, -0.5, 1e-8, 0.0, False)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        _C.adam_step(p, g, m, v, 1, 1e-3, 0.9, 0.999, -1.0, 0.0, False)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        _C.adam_step(p, g, m, v, 1, 1e-3, 0.9, 0.999, 1e-8, -1.0, True)
    with pytest.raises(ValueError, match="exp_avg_sq must not be NULL"):
        _C.adam_step(p, g, m, None, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, False)
