"""Fused Conv+BatchNorm+ReLU: the kernels against float64 references (every SIMD
level, 1 and 2 threads), the planner pass `fusion`, and fused training against the
plain plan on cpu and sim."""
import numpy as np
import pytest

import minidl
from minidl import _C, models, ops
from minidl.nn import (Add, AvgPool2d, BatchNorm2d, Conv2d, Flatten, GlobalAvgPool2d, Linear,
                       Mapped, ReLU)
from minidl.optim import SGD
from minidl.plan import fusion, make_plan
from minidl.runtime import Executor

from helpers import assert_close, f32
import reference as ref
from test_conv import WINOGRAD, c_shape, ids, make, ref_kw

# (n, c_in, h, w, c_out, kh, kw, stride, padding): each path that reads the input --
# phase planes (16- and 8-wide rows, stride 2), the column matrix, a pointwise kernel
CASES = [
    (2, 5, 16, 16, 6, 3, 3, 1, 1),
    (2, 4, 8, 8, 7, 3, 3, 1, 1),
    (2, 5, 16, 16, 6, 3, 3, 2, 1),
    (3, 3, 11, 13, 8, 3, 3, 1, 1),
    (2, 4, 10, 9, 7, 5, 5, 2, 2),
    (2, 5, 7, 7, 13, 1, 1, 1, 0),
    (2, 6, 16, 16, 5, 1, 1, 2, 0),
    (1, 1, 1, 1, 1, 1, 1, 1, 0),
    (33, 8, 2, 2, 6, 1, 1, 1, 0),  # 1x1 kernel, few pixels: the images side by side
    (16, 4, 2, 2, 5, 3, 3, 1, 1),  # dense weights: the mapped input copied whole
    (17, 17, 4, 4, 19, 3, 3, 1, 1),  # batched: the map applied as the batch planes are made
]
MAPS = {"bn+relu": (True, True), "bn": (True, False), "relu": (False, True)}


def mapped(rng, x, use_affine, relu):
    """(scale, shift) or (None, None), and x read through them in float64."""
    c = x.shape[1]
    scale = f32(rng, c) if use_affine else None
    shift = f32(rng, c) if use_affine else None
    a = x.astype(np.float64)
    if use_affine:
        a = a * scale[:, None, None].astype(np.float64) + shift[:, None, None]
    return scale, shift, np.maximum(a, 0) if relu else a


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("kind", sorted(MAPS))
def test_conv2d_fused(simd, threads, rng, case, kind):
    """The forward and dw of the convolution of the input read through its map, dx
    with respect to the mapped input, and the output's channel sums."""
    x, wt, b, kw = make(rng, case)
    scale, shift, a = mapped(rng, x, *MAPS[kind])
    y, s, q = ops.conv2d_fused(x, wt, b, x_scale=scale, x_shift=shift, x_relu=MAPS[kind][1],
                               stats=True, **kw)
    want = ref.conv2d(a, wt, b, **ref_kw(kw))
    assert_close(y, want, "conv", "y")
    scale_s = np.sqrt(want[:, 0].size) * max(np.abs(want).max(), 1e-3)
    assert np.allclose(s, want.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6 * scale_s)
    assert np.allclose(q, (want ** 2).sum(axis=(0, 2, 3)), rtol=1e-5,
                       atol=1e-6 * scale_s * np.abs(want).max())
    dy = f32(rng, *y.shape)
    dx, dw, db = ops.conv2d_backward(x, wt, dy, x_scale=scale, x_shift=shift,
                                     x_relu=MAPS[kind][1], **kw)
    rdx, rdw, rdb = ref.conv2d_backward(a, wt, dy, **ref_kw(kw))
    assert_close(dx, rdx, "conv", "dx")
    assert_close(dw, rdw, "conv", "dw")
    assert_close(db, rdb, "conv", "db")


@pytest.mark.parametrize("kind", sorted(MAPS))
def test_conv2d_fused_weights_by_winograd_sums(simd, threads, rng, kind):
    """dw of the mapped input where Winograd's dU is summed by SGEMMs (c_in c_out above
    128 x 128; the map applied as each image is transposed)."""
    x, wt, _, kw = make(rng, (2, 128, 6, 5, 144, 3, 3, 1, 1))
    scale, shift, a = mapped(rng, x, *MAPS[kind])
    dy = f32(rng, 2, 144, 6, 5)
    dw = ops.conv2d_backward(x, wt, dy, x_scale=scale, x_shift=shift, x_relu=MAPS[kind][1],
                             need_dx=False, **kw)[1]
    assert_close(dw, ref.conv2d_backward(a, wt, dy, **ref_kw(kw))[1], "conv")


@pytest.fixture(params=["gemm", "winograd"])
def conv_algo(request):
    minidl.set_conv_algo(request.param)
    yield request.param
    minidl.set_conv_algo("auto")


@pytest.mark.parametrize("case", WINOGRAD[:3], ids=ids)
def test_conv2d_fused_each_algorithm(simd, conv_algo, rng, case):
    x, wt, b, kw = make(rng, case)
    scale, shift, a = mapped(rng, x, True, True)
    y, _, _ = ops.conv2d_fused(x, wt, b, x_scale=scale, x_shift=shift, x_relu=True, relu=True,
                               **kw)
    assert_close(y, np.maximum(ref.conv2d(a, wt, b, **ref_kw(kw)), 0), "conv")
    dy, other = f32(rng, *y.shape), f32(rng, *x.shape)  # adding dx: AVX2's Winograd steps aside
    dx = ops.conv2d_backward(x, wt, dy, add_dx_to=other.copy(), **kw)[0]
    assert_close(dx, ref.conv2d_backward(x, wt, dy, **ref_kw(kw))[0] + other, "conv")


@pytest.mark.parametrize("case", CASES + WINOGRAD[:2] + [(2, 9, 6, 7, 5, 3, 3, 1, (3, 0)),
                                                          (3, 192, 6, 5, 192, 3, 3, 1, 1)],
                         ids=ids)
def test_conv2d_backward_adds_dx_to_a_gradient(simd, threads, rng, case):
    """dx added in the kernel's store to an existing gradient, on every path (in
    place, column matrix, pointwise, strided chunks, Winograd's shapes: AVX-512's adds
    in its output transform)."""
    x, wt, b, kw = make(rng, case)
    dy = f32(rng, *ops.conv2d(x, wt, **kw).shape)
    other = f32(rng, *x.shape)
    target = other.copy()
    dx, dw, _ = ops.conv2d_backward(x, wt, dy, add_dx_to=target, **kw)
    assert dx is target
    rdx, rdw, _ = ref.conv2d_backward(x, wt, dy, **ref_kw(kw))
    assert_close(dx, rdx + other, "conv", "dx + other")
    assert_close(dw, rdw, "conv", "dw")
    with pytest.raises(ValueError, match="add_dx_to must not overlap"):
        ops.conv2d_backward(x, wt, dy, add_dx_to=x, **kw)
    with pytest.raises(ValueError, match="add_dx_to needs need_dx=True"):
        ops.conv2d_backward(x, wt, dy, add_dx_to=target, need_dx=False, **kw)


def test_conv2d_fused_without_a_map_is_conv2d(rng):
    x, wt, b, kw = make(rng, CASES[0])
    y, s, q = ops.conv2d_fused(x, wt, b, relu=True, **kw)
    np.testing.assert_array_equal(y, ops.conv2d(x, wt, b, relu=True, **kw))
    assert s is None and q is None


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 1, 1, 1), (3, 17, 1, 1), (2, 4, 33),
                                   (2, 9, 16, 16)])
@pytest.mark.parametrize("with_b", [True, False], ids=["a+b", "a"])
def test_affine_add(simd, threads, rng, shape, with_b):
    a, b = f32(rng, *shape), f32(rng, *shape) if with_b else None
    c = shape[1]
    sa, ta, sb, tb = (f32(rng, c) for _ in range(4))
    for a_relu, b_relu, relu in [(False, False, False), (True, False, True), (False, True, True),
                                 (True, True, False)]:
        maps = dict(a_scale=sa, a_shift=ta, a_relu=a_relu)
        if with_b:
            maps.update(b_scale=sb, b_shift=tb, b_relu=b_relu)
        y = ops.affine_add(a, b, relu=relu, **maps)
        fa = mapped_with(a, sa, ta, a_relu)
        fb = mapped_with(b, sb, tb, b_relu) if with_b else 0
        want = fa + fb
        # two roundings of the operands' size, where their sum may cancel
        assert_close(y, np.maximum(want, 0) if relu else want, "elementwise",
                     scale=max(np.abs(fa).max() + np.abs(fb).max(), 1e-3))
    if with_b:  # no maps: the plain sum, exactly
        np.testing.assert_array_equal(ops.affine_add(a, b), ops.add(a, b))


def mapped_with(x, scale, shift, relu):
    """x read through a map, in float64."""
    s = (1, -1) + (1,) * (x.ndim - 2)
    v = x.astype(np.float64) * scale.reshape(s) + shift.reshape(s)
    return np.maximum(v, 0) if relu else v


@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (2, 3, 1, 1), (8, 16, 8, 8)])
def test_batch_norm_stats_from_sums(simd, rng, shape):
    """The statistics of batch_norm from float64 sums, the running statistics updated
    alike, and the map reproducing batch_norm's output."""
    x = (f32(rng, *shape) * 3 + 2).astype(np.float32)
    g, beta = f32(rng, shape[1]), f32(rng, shape[1])
    rm, rv = f32(rng, shape[1]), np.abs(f32(rng, shape[1])) + 0.5
    want, wmean, winvstd, wrm, wrv = ref.batch_norm_train(x, g, beta, 1e-5, rm, rv, 0.1)
    x64 = x.astype(np.float64)
    mean, invstd, scale, shift = ops.batch_norm_stats(
        x64.sum((0, 2, 3)), (x64 ** 2).sum((0, 2, 3)), x.size // shape[1], g, beta,
        running_mean=rm, running_var=rv, momentum=0.1, eps=1e-5)
    assert_close(mean, wmean, "batch_norm", "mean")
    assert_close(invstd, winvstd, "batch_norm", "invstd")
    assert_close(rm, wrm, "batch_norm", "running_mean")
    assert_close(rv, wrv, "batch_norm", "running_var")
    y = ops.affine_add(x, a_scale=scale, a_shift=shift)
    assert_close(y, want, "batch_norm", "x * scale + shift")


def test_batch_norm_stats_running_statistics_share_nothing():
    s, g = np.ones(3), np.ones(3, np.float32)
    for rm, rv, match in ((g.copy(), None, "running_mean and running_var must be given together"),
                          (g.copy(),) * 2 + ("running_mean and running_var",),
                          (g, g.copy(), "running_mean and gamma"),
                          (g.copy(), g, "running_var and gamma")):
        with pytest.raises(ValueError, match=match):
            ops.batch_norm_stats(s, s, 4, g, None, running_mean=rm, running_var=rv)


@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (3, 5, 1, 1), (8, 16, 8, 8), (2, 3, 37)])
def test_batch_norm_relu_backward(simd, threads, rng, shape):
    """The backward of max(batch_norm(x), 0) with the ReLU's mask recomputed from x."""
    x = f32(rng, *shape)
    g, beta = f32(rng, shape[1]), f32(rng, shape[1])
    x64 = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    mean, invstd, scale, shift = ops.batch_norm_stats(
        x64.sum(axes), (x64 ** 2).sum(axes), x.size // shape[1], g, beta)
    dy = f32(rng, *shape)
    s = (1, -1) + (1,) * (x.ndim - 2)
    mask = x.astype(np.float64) * scale.reshape(s) + shift.reshape(s) > 0
    want = ref.batch_norm_backward(x, g, dy * mask, mean, invstd)
    got = ops.batch_norm_backward(x, g, dy, mean, invstd, relu_scale=scale, relu_shift=shift)
    for w_, g_, name in zip(want, got, ("dx", "dgamma", "dbeta")):
        assert_close(g_, w_, "batch_norm", name)


@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (3, 5, 1, 1), (8, 16, 8, 8), (2, 3, 37),
                                   (3, 4, 16)])
@pytest.mark.parametrize("kind", sorted(MAPS) + ["none"])
def test_batch_norm_add_relu_backward(simd, threads, rng, shape, kind):
    """The backward of max(batch_norm(x) + fb(b), 0) with x reconstructed from the sum
    before the ReLU and b: batch_norm_backward's gradients of x with dy masked where
    the sum is > 0, and that masked dy for b."""
    x, b = (f32(rng, *shape) * 2 + 0.5).astype(np.float32), f32(rng, *shape)
    c = shape[1]
    g = (rng.uniform(0.5, 1.5, c) * rng.choice([-1, 1], c)).astype(np.float32)
    beta = f32(rng, c)
    x64 = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    mean, invstd, scale, shift = ops.batch_norm_stats(
        x64.sum(axes), (x64 ** 2).sum(axes), x.size // c, g, beta)
    affine, relu = MAPS.get(kind, (False, False))
    bscale, bshift = (f32(rng, c), f32(rng, c)) if affine else (None, None)
    m = dict(b_scale=bscale, b_shift=bshift, b_relu=relu)
    s = ops.affine_add(x, b, a_scale=scale, a_shift=shift, **m)  # as the fused forward
    dy = f32(rng, *shape)
    want_db = np.where(s > 0, dy, 0)
    want = ref.batch_norm_backward(x, g, want_db, mean, invstd)
    dx, db, dgamma, dbeta = ops.batch_norm_add_relu_backward(s, b, g, beta, dy, invstd, **m)
    np.testing.assert_array_equal(db, want_db)
    # the reconstruction's error: a rounding of |s| + |fb(b)| + |beta| over |gamma| in xhat
    for w_, g_, name in zip(want, (dx, dgamma, dbeta), ("dx", "dgamma", "dbeta")):
        assert_close(g_, w_, "batch_norm", name, scale=max(1.0, float(np.abs(s).max())))
    # db may be dy itself (the C kernel in place)
    n, hw = shape[0], x.size // (shape[0] * c)
    dy2, dx2, dg2, db2 = dy.copy().ravel(), np.empty(x.size, np.float32), *(
        np.empty(c, np.float32) for _ in range(2))
    _C.batch_norm_add_relu_backward(n, c, hw, s.ravel(), b.ravel(), bscale, bshift, m["b_relu"],
                                    g, beta, dy2, invstd, dx2, dy2, dg2, db2)
    np.testing.assert_array_equal(dy2, db.ravel())
    np.testing.assert_array_equal(dx2, dx.ravel())


def test_batch_norm_add_relu_backward_bad_input(rng):
    s, b = f32(rng, 2, 3, 4, 4), f32(rng, 2, 3, 4, 4)
    one = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="b must have the shape of s"):
        ops.batch_norm_add_relu_backward(s, b[:1], one, one, s, one)
    with pytest.raises(ValueError, match="beta must have shape"):
        ops.batch_norm_add_relu_backward(s, b, one, one[:2], s, one)
    with pytest.raises(ValueError, match="x_scale and x_shift must be given together"):
        ops.batch_norm_add_relu_backward(s, b, one, one, s, one, b_scale=one)
    with pytest.raises(ValueError, match="channel 1 has gamma = 0"):
        ops.batch_norm_add_relu_backward(s, b, np.array([1, 0, 1], np.float32), one, s, one)


POOLS = [((2, 3, 8, 8), 2, 2, 0, False), ((2, 5, 9, 7), 3, 2, 1, False),
         ((1, 4, 7, 7), 3, 2, 0, True), ((3, 2, 5, 6), 2, 1, 1, False)]


@pytest.mark.parametrize("shape, k, stride, pad, ceil", POOLS)
@pytest.mark.parametrize("kind", sorted(MAPS))
def test_max_pool2d_reads_through_a_map(simd, threads, rng, shape, k, stride, pad, ceil, kind):
    """Max pooling of the mapped input and its backward: what the plain op gives on the
    mapped input written out (the same maxima, ties and NaN rules)."""
    x = f32(rng, *shape)
    scale, shift, _ = mapped(rng, x, *MAPS[kind])
    m = dict(x_scale=scale, x_shift=shift, x_relu=MAPS[kind][1])
    a = ops.affine_add(x, a_scale=scale, a_shift=shift, a_relu=MAPS[kind][1]) \
        if scale is not None else np.maximum(x, 0)
    kw = dict(stride=stride, padding=pad, ceil_mode=ceil)
    np.testing.assert_array_equal(ops.max_pool2d(x, k, **kw, **m), ops.max_pool2d(a, k, **kw))
    dy = f32(rng, *ops.max_pool2d(a, k, **kw).shape)
    np.testing.assert_array_equal(ops.max_pool2d_backward(x, dy, k, **kw, **m),
                                  ops.max_pool2d_backward(a, dy, k, **kw))


def test_fused_ops_bad_input(rng):
    x, wt, b, kw = make(rng, CASES[0])
    c = x.shape[1]
    with pytest.raises(ValueError, match="x_scale and x_shift must be given together"):
        ops.conv2d_fused(x, wt, x_scale=f32(rng, c))
    with pytest.raises(ValueError, match=r"x_shift must have shape \(5,\)"):
        ops.conv2d_backward(x, wt, np.zeros((2, 6, 16, 16), np.float32),
                            x_scale=f32(rng, c), x_shift=f32(rng, c + 1), **kw)
    with pytest.raises(ValueError, match="b_scale, b_shift and b_relu need an operand b"):
        ops.affine_add(x, b_relu=True)
    with pytest.raises(ValueError, match="b must have the shape of a"):
        ops.affine_add(x, x[:1])
    s = np.ones(c)
    with pytest.raises(ValueError, match="count must be"):
        ops.batch_norm_stats(s, s, 1, None, None)
    with pytest.raises(TypeError, match="channel_sum must be a float64"):
        ops.batch_norm_stats(s.astype(np.float32), s, 4, None, None)
    with pytest.raises(ValueError, match="relu_scale and relu_shift must be given together"):
        ops.batch_norm_backward(x, None, x, s.astype(np.float32), s.astype(np.float32),
                                relu_scale=s.astype(np.float32))


def test_c_affine_needs_scale_and_shift_together(rng):
    x, wt, b, kw = make(rng, CASES[0])
    s = f32(rng, x.shape[1])
    y = np.empty((2, 6, 16, 16), np.float32)
    with pytest.raises(ValueError, match="in->scale and in->shift must both be given"):
        _C.conv2d_forward_fused(c_shape(CASES[0]), x.ravel(), s, None, False, wt.ravel(), None,
                                False, None, None, y.ravel())
    with pytest.raises(ValueError, match="fa->scale and fa->shift"):
        _C.affine_add(2, 5, 256, x.ravel(), s, None, False, None, None, None, False, False,
                      np.empty(x.size, np.float32))
    with pytest.raises(ValueError, match="count > 1"):
        _C.batch_norm_stats(5, 1, np.zeros(5), np.zeros(5), s, s, 1e-5, 0.1, None, None,
                            *(np.empty(5, np.float32) for _ in range(4)))


# ---- the planner pass -------------------------------------------------------------

def test_fusion_pass_on_resnet20():
    tags = fusion(models.build("resnet20", seed=None))
    assert tags["conv1"] == ["stats"]
    assert tags["bn1"] == ["from-sums", "mapped", "masks-relu"]
    assert tags["relu"] == ["mapped"]
    # reads the stem's ReLU; adds its input gradient to the shortcut's
    assert tags["layer1.0.conv1"] == ["mapped-in", "stats", "accumulates-dx"]
    # after the downsample's; reads a block's sum through the ReLU
    assert tags["layer2.0.conv1"] == ["stats", "mapped-in", "accumulates-dx"]
    assert tags["layer1.0.conv2"] == ["mapped-in", "stats"]
    # read by the Add, which writes the sum before the ReLU and reconstructs bn2's input
    assert tags["layer1.0.bn2"] == ["from-sums", "mapped", "reconstructed"]
    assert tags["layer1.0.add"] == ["mapped-in", "reconstructs-a"]
    assert tags["layer1.0.relu2"] == ["mapped"]
    assert tags["layer2.0.downsample.1"] == ["from-sums", "mapped"]  # kept: reconstructs bn2
    assert tags["layer2.0.add"] == ["mapped-in", "reconstructs-a"]
    # the last block's ReLU is read by the average pool: written, bn2's input kept
    assert tags["layer3.2.bn2"] == ["from-sums", "mapped"]
    assert tags["layer3.2.add"] == ["mapped-in", "applies-relu"]
    assert tags["layer3.2.relu2"] == ["absorbed"]
    assert "avgpool" not in tags and "fc" not in tags


def test_fusion_pass_maps_what_a_max_pool_reads():
    """VGG: BatchNorm+ReLU read by a max pool or a convolution are never written."""
    tags = fusion(models.build("vgg11_bn", seed=None))
    assert tags["bn1"] == ["from-sums", "mapped", "masks-relu"] and tags["relu1"] == ["mapped"]
    assert tags["pool1"] == ["mapped-in"]
    assert tags["conv4"] == ["mapped-in", "stats"]


def test_fusion_pass_keeps_a_max_pools_taps_where_its_input_is_not_kept():
    """cifar10_quick's pool1 reads conv1's output, which nothing else keeps: the pool
    keeps its taps (1 byte per output) instead.  VGG's pools read a BatchNorm+ReLU whose
    convolution output the BatchNorm's backward keeps anyway: no taps."""
    net = models.build("cifar10_quick", seed=None)
    tags = fusion(net)
    assert tags["pool1"] == ["keeps-taps", "applies-relu"]
    assert tags["relu1"] == ["absorbed", "pool-masks"]  # its mask in the pool's taps
    # relu2 and relu3, applied by their convolutions, masked by the average pools after them
    assert tags["relu2"] == tags["relu3"] == ["absorbed", "pool-masks"]
    assert tags["pool2"] == tags["pool3"] == ["masks-relu"]
    fused, plain = make_plan(net, 100), make_plan(net, 100, fuse=False)
    assert fused.step("pool1").kept == [] and plain.step("pool1").kept == ["conv1"]
    assert fused.step("relu1").kept == [] and plain.step("relu1").kept == ["relu1"]
    assert fused.step("relu1").bytes_forward == fused.step("relu1").bytes_backward == 0
    assert fused.step("relu1").grad_view and fused.step("conv2").kept == ["pool1"]
    assert fused.step("relu2").kept == [] and fused.step("pool2").kept == ["conv2"]
    assert fused.step("relu2").bytes_backward == 0
    assert fused.step("pool1").saved_bytes == 100 * 32 * 16 * 16
    assert fused.memory["kept_activations"] == \
        plain.memory["kept_activations"] - 100 * 32 * 32 * 32 * 4 + 100 * 32 * 16 * 16
    vgg = fusion(models.build("vgg11_bn", seed=None))
    assert not any("keeps-taps" in t for t in vgg.values())


def test_fusion_pass_leaves_what_it_cannot_fuse():
    net = minidl.Net((3, 8, 8))
    net.add("conv", Conv2d(out_channels=4, padding=1))
    net.add("bn", BatchNorm2d())
    net.add("relu", ReLU())           # the output: stays written
    assert fusion(net) == {"conv": ["stats"], "bn": ["from-sums", "applies-relu"],
                           "relu": ["absorbed"]}
    net.nodes["bn"].layer.sync = object()  # synchronised BatchNorm: not fused
    assert fusion(net) == {}
    two = minidl.Net((3, 8, 8))
    two.add("conv", Conv2d(out_channels=4, padding=1))
    two.add("bn", BatchNorm2d())
    two.add("other", ReLU(), "conv")  # the convolution has two readers
    assert "bn" not in fusion(two)


def _unread_branches_net():
    """A branch whose last node nothing reads (computed, but no gradient flows back),
    a BatchNorm's ReLU; and a BatchNorm whose convolution the Add after it reads too
    (so that BatchNorm is not fused)."""
    net = minidl.Net((3, 8, 8))
    net.add("conv1", Conv2d(out_channels=4, padding=1, bias=False))
    net.add("bn1", BatchNorm2d())
    net.add("relu1", ReLU())                                  # read by nothing
    net.add("conv2", Conv2d(out_channels=4, padding=1, bias=False), "input")
    net.add("bn2", BatchNorm2d())
    net.add("add", Add(), ["conv2", "bn2"])
    net.add("relu2", ReLU())
    net.add("conv3", Conv2d(out_channels=4, padding=1, bias=False))
    net.add("bn3", BatchNorm2d())
    net.add("pool", GlobalAvgPool2d())
    net.add("fc", Linear(out_features=3))
    return net


def test_branches_nothing_reads_train_as_the_plain_plan(rng):
    """The fusion pass leaves outputs nothing reads written, the plan's memory is what
    the executor holds (such an output lives to the end of forward), and the gradients
    are the plain plan's (none for the branch nothing reads)."""
    net = _unread_branches_net().initialize(0)
    tags = fusion(net)
    assert tags["bn1"] == ["from-sums", "applies-relu"] and "bn2" not in tags
    x, y = f32(rng, 4, 3, 8, 8), rng.integers(0, 3, 4)
    grads = {}
    for fuse in (False, True):
        plan = make_plan(net, 4, fuse=fuse)
        ex = Executor(net, plan)
        ex.track_memory = True
        ex.train_step(x, y)
        assert ex.peak_activation_bytes == plan.memory["activation_peak"], fuse
        grads[fuse] = {k: p.grad for k, p in net.parameters().items()}
    for k, g in grads[False].items():
        if k.startswith(("conv1.", "bn1.")):
            assert g is None and grads[True][k] is None, k
        else:
            assert_close(grads[True][k], g, "batch_norm", k)


def test_step_bytes_from_the_shapes():
    """Each step's bytes: its kernels' passes over their operands (minidl.plan._traffic)."""
    net = minidl.Net((3, 8, 8))
    net.add("conv1", Conv2d(out_channels=4, padding=1, bias=False))
    net.add("bn", BatchNorm2d())
    net.add("relu", ReLU())
    net.add("conv2", Conv2d(out_channels=4, padding=1, bias=False))
    x, y, w1, w2, bn = 2 * 3 * 64 * 4, 2 * 4 * 64 * 4, 4 * 3 * 9 * 4, 4 * 4 * 9 * 4, 2 * 4 * 4
    plain, fused = make_plan(net, 2, fuse=False), make_plan(net, 2)
    want = {"conv1": (x + w1 + y, x + y + w1),               # no dx for the input
            "bn": (3 * y + bn, 5 * y + bn),                  # stats + normalise; 2 passes back
            "relu": (2 * y, 3 * y),
            "conv2": (y + w2 + y, (y + w2 + y) + (y + y + w2))}
    for k, (f, b) in want.items():
        assert (plain.step(k).bytes_forward, plain.step(k).bytes_backward) == (f, b), k
    assert fused.step("bn").bytes_forward == bn and fused.step("relu").bytes_forward == 0
    assert fused.step("relu").bytes_backward == 0 and fused.step("bn").bytes_backward == 5 * y + bn
    assert fused.bytes_moved() == plain.bytes_moved() - 3 * y - 2 * y - 3 * y


def test_fused_plan_moves_fewer_bytes_and_keeps_less():
    net = models.build("resnet20", seed=None)
    plain, fused = make_plan(net, 128, fuse=False), make_plan(net, 128)
    assert plain.passes == [] and fused.passes == ["fusion"]
    assert not any(s.fused for s in plain.steps)
    assert fused.step("bn1").output_bytes == 0 and fused.step("relu").kept == []
    assert fused.step("layer1.0.conv2").kept == ["layer1.0.conv1"]  # y, not the ReLU's output
    assert fused.bytes_moved() < 0.67 * plain.bytes_moved()
    assert fused.memory["kept_activations"] < 0.55 * plain.memory["kept_activations"]
    assert "fusion" in str(fused) and "mapped-in" in str(fused)
    # a reconstructed BatchNorm keeps nothing; its Add keeps its sum and the block input
    assert fused.step("layer1.1.bn2").kept == []
    assert fused.step("layer1.1.add").kept == ["layer1.0.add", "layer1.1.add"]
    assert fused.step("layer1.1.bn2").bytes_backward == fused.step("layer1.1.bn2").param_bytes
    y = 128 * 16 * 32 * 32 * 4
    assert fused.step("layer1.1.add").bytes_backward == 8 * y


def _residual_net(bn_first: bool):
    """conv -> bn -> Add(bn, shortcut) -> ReLU -> conv: the BatchNorm as the Add's
    first or second operand."""
    net = minidl.Net((3, 8, 8))
    net.add("conv0", Conv2d(out_channels=4, padding=1, bias=False))
    net.add("conv", Conv2d(out_channels=4, padding=1, bias=False))
    net.add("bn", BatchNorm2d())
    net.add("add", Add(), ["bn", "conv0"] if bn_first else ["conv0", "bn"])
    net.add("relu", ReLU())
    net.add("head", Conv2d(out_channels=2, kernel_size=8, bias=False))
    net.add("flat", Flatten())
    return net


def _gradients(net, fuse, x, y):
    Executor(net, make_plan(net, len(x), fuse=fuse)).train_step(x, y)
    return {k: p.grad.copy() for k, p in net.parameters().items()}


@pytest.mark.parametrize("bn_first", [True, False], ids=["a", "b"])
def test_reconstructed_batch_norm_gradients(rng, bn_first):
    """Either operand of the Add can be the reconstructed BatchNorm; gradients as the
    plain plan's.  With a |gamma| below RECONSTRUCT_MIN_GAMMA the BatchNorm keeps its
    input for that step (with a warning), gradients still the plain plan's."""
    net = _residual_net(bn_first)
    net.initialize(0)
    tags = make_plan(net, 4).step("add").fused
    assert ("reconstructs-a" if bn_first else "reconstructs-b") in tags
    x, y = f32(rng, 4, 3, 8, 8), rng.integers(0, 2, 4)
    plain = _gradients(net, False, x, y)
    fused = _gradients(net, True, x, y)
    for k in plain:
        assert_close(fused[k], plain[k], "batch_norm", k)
    net.nodes["bn"].layer.params["weight"].data[1] = 1e-4
    plain = _gradients(net, False, x, y)
    with pytest.warns(RuntimeWarning, match="keeps its input"):
        fused = _gradients(net, True, x, y)
    for k in plain:
        assert_close(fused[k], plain[k], "batch_norm", k)


def test_reconstruction_checks_do_not_stop_the_device(monkeypatch, rng):
    """On a device, each reconstructed BatchNorm's check of its gamma is a copy started
    before the batch's and waited for with it: a fused step waits for the device as
    often as the plain plan's step, not once more per BatchNorm in the middle of the
    forward.  A small gamma on the device still makes it keep its input, with the
    plain plan's gradients."""
    from minidl.device.sim import SimStream
    waits = []
    monkeypatch.setattr(SimStream, "synchronize", lambda self: waits.append(1))
    x, y = f32(rng, 4, 3, 8, 8), rng.integers(0, 2, 4)
    net = _residual_net(True)
    net.initialize(0)
    sim = net.to("sim")

    def grads(fuse):
        waits.clear()
        Executor(sim, make_plan(sim, 4, device=sim.device, fuse=fuse)).train_step(x, y)
        return len(waits), {k: minidl.device.asnumpy(p.grad)
                            for k, p in sim.parameters().items()}

    assert grads(True)[0] == grads(False)[0]
    gamma = sim.nodes["bn"].layer.params["weight"].data
    small = minidl.device.asnumpy(gamma).copy()
    small[1] = 1e-4
    minidl.device.copy_into(gamma, small)
    plain = grads(False)[1]
    with pytest.warns(RuntimeWarning, match="keeps its input"):
        fused = grads(True)[1]
    for k in plain:
        assert_close(fused[k], plain[k], "batch_norm", k)


# ---- fused training against the plain plan ----------------------------------------

def _train(model, device, fuse, batch, steps, lr=0.01):
    """model: a zoo name, or a function making a net of (3, 32, 32) inputs from a seed."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    net = (models.build(model, seed=0) if isinstance(model, str) else model(0)).to(device)
    opt = SGD(net.parameters(), lr=lr, momentum=0.9)
    ex = Executor(net, make_plan(net, batch, device=device, fuse=fuse), seed=0)
    first = None
    for i in range(steps):
        ex.train_step(x, y)
        if first is None:
            first = {k: np.asarray(minidl.device.asnumpy(p.grad))
                     for k, p in net.parameters().items()}
        opt.step()
    return net.state_dict(), first, ex


def _rel_l2(a, b):
    keys = [k for k in a if a[k].dtype == np.float32]
    u = np.concatenate([a[k].ravel() for k in keys]).astype(np.float64)
    v = np.concatenate([b[k].ravel() for k in keys]).astype(np.float64)
    return np.linalg.norm(u - v) / np.linalg.norm(u)


def _cuda_missing():
    try:
        minidl.device.get_device("cuda")
    except RuntimeError as e:
        return str(e)
    return None


def _resnet20_plain_and_fused(device, algo, steps):
    """resnet20 (batch 16) trained `steps` steps with the convolutions' algorithm `algo`,
    by the plain plan on the cpu and the fused one on `device`: the parameters and the
    first step's gradients of each."""
    minidl.set_conv_algo(algo)
    try:
        plain, g_plain, _ = _train("resnet20", "cpu", False, 16, steps)
        fused, g_fused, ex = _train("resnet20", device, True, 16, steps)
    finally:
        minidl.set_conv_algo("auto")
    assert ex.plan.passes == ["fusion"]
    return plain, g_plain, fused, g_fused


_DEVICES = ["cpu", pytest.param("sim", marks=pytest.mark.slow), pytest.param(
    "cuda", marks=pytest.mark.skipif(_cuda_missing() is not None, reason="needs CUDA"))]


@pytest.mark.parametrize("algo", ["gemm", "auto"])
@pytest.mark.parametrize("device", _DEVICES)
def test_fused_first_steps_match_the_plain_plan(device, algo):
    """resnet20, 2 SGD steps (batch 16, momentum 0.9): the kernels of the 20-step
    comparison below, in a run short enough for `make sanitize`.  With the convolutions'
    GEMM the first step's gradients agree per tensor within 5e-5 and the parameters after
    2 steps within a relative L2 distance of 1e-6 (2.4e-8 measured on AVX2); with the
    default algorithm, whose Winograd rounds otherwise (3.7e-5 measured on AVX2), 2e-3."""
    plain, g_plain, fused, g_fused = _resnet20_plain_and_fused(device, algo, 2)
    if algo == "gemm":
        for k in g_plain:
            assert_close(g_fused[k], g_plain[k], "batch_norm", f"first step's gradient of {k}")
    assert _rel_l2(plain, fused) < (1e-6 if algo == "gemm" else 2e-3)
    assert fused["bn1.num_batches_tracked"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["gemm", "auto"])
@pytest.mark.parametrize("device", _DEVICES)
def test_fused_training_matches_the_plain_plan(device, algo):
    """resnet20, 20 SGD steps (batch 16, momentum 0.9): the parameters and running
    statistics after 20 steps agree within a relative L2 distance over all of them of
    3e-3 with the convolutions' GEMM and 5e-3 with the default algorithm (on AVX-512,
    Winograd F(4x4, 3x3), whose rounding error per convolution is about ten times the
    GEMM's).  This net at this batch is very sensitive to rounding: the input times
    (1 + 1e-6 noise) moves the first step's gradients by up to 7%; the plain plan with
    GEMM against Winograd ends 2.7e-3 apart; summing the strided layers' data gradient
    by phases instead of by col2im (the same products, in another order) moved the
    plain plan's parameters by 2.1e-3; fused against plain: 2.1e-3 (GEMM) and 3.1e-3."""
    plain, _, fused, _ = _resnet20_plain_and_fused(device, algo, 20)
    assert _rel_l2(plain, fused) < (3e-3 if algo == "gemm" else 5e-3)
    assert fused["bn1.num_batches_tracked"] == 20


def test_fused_vgg_trains_like_the_plain_plan():
    """The written BatchNorm+ReLU path (before each max pool) and mapped inputs."""
    _, g_plain, _ = _train("vgg11_bn", "cpu", False, 4, 1)
    _, g_fused, _ = _train("vgg11_bn", "cpu", True, 4, 1)
    for k in g_plain:
        assert_close(g_fused[k], g_plain[k], "batch_norm", f"gradient of {k}")


@pytest.mark.parametrize("device", ["cpu", "sim", pytest.param(
    "cuda", marks=pytest.mark.skipif(_cuda_missing() is not None, reason="needs CUDA"))])
def test_max_pool_taps_train_as_the_plain_plan(device):
    """cifar10_quick (no BatchNorm; the ReLU after pool1 applied by it, its mask in the
    taps): the same gradients and parameters as the plain plan on the same device, bit
    for bit, over 3 steps."""
    plain, g_plain, _ = _train("cifar10_quick", device, False, 8, 3)
    fused, g_fused, ex = _train("cifar10_quick", device, True, 8, 3)
    assert ex.plan.step("pool1").fused == ["keeps-taps", "applies-relu"]
    for k in g_plain:
        np.testing.assert_array_equal(g_fused[k], g_plain[k], err_msg=k)
    for k in plain:
        np.testing.assert_array_equal(fused[k], plain[k], err_msg=k)


def _pool_relu_pool(seed):
    """A written ReLU (no convolution to absorb it) between two average pools."""
    net = minidl.Net((3, 32, 32))
    net.add("conv", Conv2d(out_channels=4, padding=1))
    net.add("pool_a", AvgPool2d(2))
    net.add("relu", ReLU())
    net.add("pool_b", AvgPool2d(3, stride=2, padding=1))
    net.add("flat", Flatten())
    net.add("fc", Linear(out_features=10))
    return net.initialize(seed)


@pytest.mark.parametrize("device", ["cpu", "sim", pytest.param(
    "cuda", marks=pytest.mark.skipif(_cuda_missing() is not None, reason="needs CUDA"))])
def test_average_pool_masking_for_a_relu_trains_as_the_plain_plan(device):
    """The ReLU's mask applied by the average pool's backward: the plain plan's gradients
    and parameters, bit for bit; the ReLU keeps nothing, the pool keeps its output."""
    tags = fusion(_pool_relu_pool(0))
    assert tags == {"relu": ["pool-masks"], "pool_b": ["masks-relu"]}
    plain, g_plain, _ = _train(_pool_relu_pool, device, False, 6, 3)
    fused, g_fused, ex = _train(_pool_relu_pool, device, True, 6, 3)
    assert ex.plan.step("relu").kept == [] and ex.plan.step("pool_b").kept == ["relu"]
    for k in g_plain:
        np.testing.assert_array_equal(g_fused[k], g_plain[k], err_msg=k)
    for k in plain:
        np.testing.assert_array_equal(fused[k], plain[k], err_msg=k)


def test_evaluation_ignores_the_training_fusion():
    net = models.build("resnet20", seed=0)
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
    fused = Executor(net, make_plan(net, 3)).predict(x)
    plain = Executor(net, make_plan(net, 3, fuse=False)).predict(x)
    np.testing.assert_array_equal(fused, plain)


def test_mapped_materializes():
    x = np.arange(-4, 4, dtype=np.float32).reshape(1, 2, 2, 2)
    m = Mapped(x, np.array([2, 1], np.float32), np.array([1, 0], np.float32), relu=True)
    assert m.shape == x.shape
    np.testing.assert_array_equal(m.materialize(),
                                  np.maximum(x * np.array([2, 1])[:, None, None]
                                             + np.array([1, 0])[:, None, None], 0))


def test_cli_plan_and_bench_fuse_flags(capsys):
    from minidl import cli
    import json
    assert cli.main(["plan", "--model", "resnet20", "--batch-size", "4", "--json"]) == 0
    fused = json.loads(capsys.readouterr().out)
    assert cli.main(["plan", "--model", "resnet20", "--batch-size", "4", "--json",
                     "--no-fuse"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert fused["passes"] == ["fusion"] and plain["passes"] == []
    assert any(s["fused"] for s in fused["steps"]) and not any(s["fused"] for s in plain["steps"])
    for flag in ("--fuse", "--no-fuse"):
        assert cli.main(["bench", "--model", "lenet", "--batch-size", "4", "--steps", "1",
                         "--warmup", "0", "--json", flag]) == 0
        r = json.loads(capsys.readouterr().out)
        assert r["fused"] == (flag == "--fuse") and r["bytes_moved"] > 0
        assert r["activation_bytes"] > 0
