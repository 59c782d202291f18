"""minidl.ops against PyTorch itself (float64, gradients by autograd).

The float64 NumPy references in reference.py are the oracle for every op; this
file checks that those semantics are PyTorch's: output sizes (ceil mode,
padding rules), the avg-pool divisor, max-pool tie and gradient routing,
BatchNorm's running statistics, cross-entropy and the optimizer steps.
It runs where torch is installed (`pip install torch==2.13.0`; CI does) and is
skipped elsewhere.
"""
import itertools

import numpy as np
import pytest

from minidl import ops

from helpers import assert_close, f32

pytestmark = pytest.mark.external
torch = pytest.importorskip("torch")
F = torch.nn.functional
torch.set_num_threads(1)


def t64(a, grad=False):
    return torch.tensor(np.asarray(a, np.float64), requires_grad=grad)


def npy(t):
    return t.detach().numpy()


# ---- output sizes: every small combination, errors included --------------------

def _outcome(fn):
    try:
        return tuple(fn().shape)
    except (ValueError, RuntimeError):
        return "error"


def test_pool_output_sizes_match_torch():
    mismatches = []
    for h, k, s, p, ceil in itertools.product(range(1, 11), range(1, 6), range(1, 4), range(0, 4),
                                              (False, True)):
        x = np.zeros((1, 1, h, 3), np.float32)
        ours = _outcome(lambda: ops.max_pool2d(x, (k, 1), stride=(s, 1), padding=(p, 0),
                                               ceil_mode=ceil))
        theirs = _outcome(lambda: F.max_pool2d(torch.zeros(1, 1, h, 3), (k, 1), stride=(s, 1),
                                               padding=(p, 0), ceil_mode=ceil))
        if ours != theirs:
            mismatches.append((h, k, s, p, ceil, ours, theirs))
    assert not mismatches, mismatches[:10]


def test_conv_output_sizes_match_torch():
    mismatches = []
    for h, k, s, p in itertools.product(range(1, 10), range(1, 6), range(1, 4), range(0, 4)):
        x, w = np.zeros((1, 1, h, 2), np.float32), np.zeros((1, 1, k, 1), np.float32)
        ours = _outcome(lambda: ops.conv2d(x, w, stride=(s, 1), padding=(p, 0)))
        theirs = _outcome(lambda: F.conv2d(torch.zeros(1, 1, h, 2), torch.zeros(1, 1, k, 1),
                                           stride=(s, 1), padding=(p, 0)))
        if ours != theirs:
            mismatches.append((h, k, s, p, ours, theirs))
    assert not mismatches, mismatches[:10]


# ---- ops, forward and backward -------------------------------------------------

CONV_CASES = [  # (n, c_in, h, w, c_out, kh, kw, stride, padding)
    (2, 3, 9, 11, 5, 3, 3, 1, 1),
    (1, 4, 8, 8, 6, 5, 3, (2, 1), (2, 0)),
    (3, 1, 7, 5, 2, 1, 1, 1, 0),
    (2, 5, 12, 10, 3, 7, 7, 3, 3),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(rng, case):
    n, c_in, h, w, c_out, kh, kw, stride, padding = case
    x, wt, b = f32(rng, n, c_in, h, w), f32(rng, c_out, c_in, kh, kw), f32(rng, c_out)
    tx, tw, tb = t64(x, True), t64(wt, True), t64(b, True)
    ty = F.conv2d(tx, tw, tb, stride=stride, padding=padding)
    dy = f32(rng, *ty.shape)
    ty.backward(t64(dy))
    assert_close(ops.conv2d(x, wt, b, stride=stride, padding=padding), npy(ty), "conv")
    dx, dw, db = ops.conv2d_backward(x, wt, dy, stride=stride, padding=padding)
    assert_close(dx, npy(tx.grad), "conv", "dx")
    assert_close(dw, npy(tw.grad), "conv", "dw")
    assert_close(db, npy(tb.grad), "conv", "db")


POOL_CASES = [  # (h, w, kernel, stride, padding, ceil_mode)
    (9, 9, 3, 2, 1, True),
    (8, 7, 3, 2, 0, True),
    (5, 5, 3, 3, 1, True),
    (10, 6, (3, 2), (2, 1), (1, 0), False),
    (7, 7, 2, None, 0, False),
]


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool2d(rng, case):
    h, w, k, s, p, ceil = case
    x = rng.permutation(2 * 3 * h * w).reshape(2, 3, h, w).astype(np.float32)  # no ties
    tx = t64(x, True)
    ty = F.max_pool2d(tx, k, stride=s, padding=p, ceil_mode=ceil)
    dy = f32(rng, *ty.shape)
    ty.backward(t64(dy))
    np.testing.assert_array_equal(ops.max_pool2d(x, k, stride=s, padding=p, ceil_mode=ceil),
                                  npy(ty))
    assert_close(ops.max_pool2d_backward(x, dy, k, stride=s, padding=p, ceil_mode=ceil),
                 npy(tx.grad), "reduction")


@pytest.mark.parametrize("case", POOL_CASES)
def test_avg_pool2d(rng, case):
    h, w, k, s, p, ceil = case
    x = f32(rng, 2, 3, h, w)
    tx = t64(x, True)
    ty = F.avg_pool2d(tx, k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=True)
    dy = f32(rng, *ty.shape)
    ty.backward(t64(dy))
    assert_close(ops.avg_pool2d(x, k, stride=s, padding=p, ceil_mode=ceil), npy(ty), "reduction")
    assert_close(ops.avg_pool2d_backward(x, dy, k, stride=s, padding=p, ceil_mode=ceil),
                 npy(tx.grad), "reduction")


def test_max_pool2d_ties_route_like_torch():
    x = np.array([[[[1, 3, 3], [3, 0, 3], [2, 3, 1]]]], np.float32)
    tx = t64(x, True)
    F.max_pool2d(tx, 2, stride=1).sum().backward()
    np.testing.assert_array_equal(ops.max_pool2d_backward(x, np.ones((1, 1, 2, 2), np.float32), 2,
                                                          stride=1), npy(tx.grad))


def test_global_avg_pool_relu_add_linear(rng):
    x = f32(rng, 3, 5, 4, 6)
    tx = t64(x, True)
    ty = tx.mean((2, 3))
    dy = f32(rng, 3, 5)
    ty.backward(t64(dy))
    assert_close(ops.global_avg_pool2d(x), npy(ty), "reduction")
    assert_close(ops.global_avg_pool2d_backward(x, dy), npy(tx.grad), "reduction")
    assert_close(ops.relu(x), npy(F.relu(t64(x))), "elementwise")
    assert_close(ops.add(x, x), npy(torch.add(t64(x), t64(x))), "elementwise")

    a, w, b = f32(rng, 4, 2, 7), f32(rng, 3, 7), f32(rng, 3)
    ta, tw, tb = t64(a, True), t64(w, True), t64(b, True)
    ty = F.linear(ta, tw, tb)
    dy = f32(rng, *ty.shape)
    ty.backward(t64(dy))
    assert_close(ops.linear(a, w, b), npy(ty), "gemm")
    dx, dw, db = ops.linear_backward(a, w, dy)
    for got, want in ((dx, ta.grad), (dw, tw.grad), (db, tb.grad)):
        assert_close(got, npy(want), "gemm")


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (1, 6, 3, 7), (8, 5)])
def test_batch_norm(rng, shape):
    c = shape[1]
    x = f32(rng, *shape, scale=2.0) + 1.0
    gamma, beta = f32(rng, c), f32(rng, c)
    rm, rv = f32(rng, c), np.abs(f32(rng, c)) + 0.5
    trm, trv = t64(rm), t64(rv)
    tx, tg, tb = t64(x, True), t64(gamma, True), t64(beta, True)
    ty = F.batch_norm(tx, trm, trv, tg, tb, training=True, momentum=0.2, eps=1e-3)
    dy = f32(rng, *shape)
    ty.backward(t64(dy))
    y, mean, invstd = ops.batch_norm(x, gamma, beta, training=True, running_mean=rm,
                                     running_var=rv, momentum=0.2, eps=1e-3)
    assert_close(y, npy(ty), "batch_norm")
    assert_close(rm, npy(trm), "batch_norm", "running_mean")
    assert_close(rv, npy(trv), "batch_norm", "running_var")  # unbiased variance, as torch
    dx, dgamma, dbeta = ops.batch_norm_backward(x, gamma, dy, mean, invstd)
    assert_close(dx, npy(tx.grad), "batch_norm", "dx")
    assert_close(dgamma, npy(tg.grad), "batch_norm", "dgamma")
    assert_close(dbeta, npy(tb.grad), "batch_norm", "dbeta")
    y_eval, _, _ = ops.batch_norm(x, gamma, beta, training=False, running_mean=rm,
                                  running_var=rv, eps=1e-3)
    ty_eval = F.batch_norm(t64(x), trm, trv, t64(gamma), t64(beta), training=False, eps=1e-3)
    assert_close(y_eval, npy(ty_eval), "batch_norm", "inference")


@pytest.mark.parametrize("n, classes", [(1, 1), (5, 10), (16, 1000)])
def test_softmax_cross_entropy(rng, n, classes):
    logits = f32(rng, n, classes, scale=5.0)
    labels = rng.integers(0, classes, n)
    tl = t64(logits, True)
    tloss = F.cross_entropy(tl, torch.tensor(labels))
    tloss.backward()
    loss, dlogits = ops.softmax_cross_entropy(logits, labels)
    assert_close(loss, tloss.item(), "loss")
    assert_close(dlogits, npy(tl.grad), "loss", "dlogits")


# ---- optimizers: three steps from the same state --------------------------------

# hyper-parameters exactly representable in float32, so both sides use the same values
SGD_CONFIGS = [dict(momentum=0.0), dict(momentum=0.875, weight_decay=0.0625),
               dict(momentum=0.875, dampening=0.25), dict(momentum=0.875, nesterov=True,
                                                         weight_decay=0.0625)]


@pytest.mark.parametrize("cfg", SGD_CONFIGS)
def test_sgd(rng, cfg):
    lr = 0.125
    param = f32(rng, 37)
    tp = torch.nn.Parameter(t64(param))
    opt = torch.optim.SGD([tp], lr=lr, **cfg)
    buf = np.zeros_like(param) if cfg.get("momentum") else None
    for step in range(3):
        grad = f32(rng, 37)
        tp.grad = t64(grad)
        opt.step()
        ops.sgd_step(param, grad, buf, lr=lr, first_step=step == 0, **cfg)
    assert_close(param, npy(tp), "optim", "param", scale=1.0)
    if buf is not None:
        assert_close(buf, npy(opt.state[tp]["momentum_buffer"]), "optim", "buffer", scale=1.0)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.0625])
def test_adam(rng, decoupled, weight_decay):
    hp = dict(lr=2.0 ** -7, betas=(0.875, 1 - 2.0 ** -10), eps=2.0 ** -20,
              weight_decay=weight_decay)
    param = f32(rng, 41)
    tp = torch.nn.Parameter(t64(param))
    opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)([tp], **hp)
    m, v = np.zeros_like(param), np.zeros_like(param)
    for step in range(1, 4):
        grad = f32(rng, 41)
        tp.grad = t64(grad)
        opt.step()
        ops.adam_step(param, grad, m, v, step=step, decoupled=decoupled, **hp)
    assert_close(param, npy(tp), "optim", "param", scale=1.0)
    assert_close(m, npy(opt.state[tp]["exp_avg"]), "optim", "exp_avg")
    assert_close(v, npy(opt.state[tp]["exp_avg_sq"]), "optim", "exp_avg_sq")
