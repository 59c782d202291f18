"""The PyTorch twins of minidl's networks, and a training/inference benchmark of them.

    python bench/torch_nets.py --model cifar10_quick --batch-size 100 --steps 20 \\
        --threads 2 [--channels-last] [--warmup 5] [--json]

Parameter names (state_dict keys) are the ones minidl uses, so weights can be
copied across either way.  The benchmark reports the same fields as
``python -m minidl bench``: ``train_images_per_s`` (forward, backward and an
SGD step with momentum 0.9 on a cross-entropy loss), ``infer_images_per_s``
(eval mode, no_grad) and ``peak_rss_mb`` (of this process: run it in a process
of its own).  Images/s come from the median of per-step times after warm-up,
on random data.  PyTorch is needed by this script only, never by minidl.
"""
import argparse
import collections
import json
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES = 10
INPUT_SHAPE = (3, 32, 32)


class Cifar10Quick(nn.Module):
    """Caffe's examples/cifar10 "quick" net, layer for layer.

    conv1 -> pool1 (max) -> relu -> conv2 -> relu -> pool2 (avg) -> conv3 -> relu
    -> pool3 (avg) -> ip1 -> ip2.  Caffe rounds pooled sizes up (32 -> 16 -> 8 -> 4)
    and has no non-linearity between ip1 and ip2.  Caffe's average pooling
    divides border windows by their clipped size, which with padding 0 is what
    PyTorch's avg_pool2d does too.  Weights start from Caffe's Gaussian fillers.
    """

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 5, padding=2)
        self.pool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = nn.Conv2d(32, 32, 5, padding=2)
        self.pool2 = nn.AvgPool2d(3, stride=2, ceil_mode=True)
        self.conv3 = nn.Conv2d(32, 64, 5, padding=2)
        self.pool3 = nn.AvgPool2d(3, stride=2, ceil_mode=True)
        self.ip1 = nn.Linear(64 * 4 * 4, 64)
        self.ip2 = nn.Linear(64, num_classes)
        for layer, std in [(self.conv1, 1e-4), (self.conv2, 1e-2), (self.conv3, 1e-2),
                           (self.ip1, 1e-1), (self.ip2, 1e-1)]:
            nn.init.normal_(layer.weight, std=std)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        x = F.relu(self.pool1(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = self.pool3(F.relu(self.conv3(x)))
        x = torch.flatten(x, 1)
        return self.ip2(self.ip1(x))


class BasicBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); the shortcut is the
    identity, or (option B) a strided 1x1 convolution and batch norm where the
    shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes))
        else:
            self.downsample = None

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class CifarResNet(nn.Module):
    """He et al. 2016's CIFAR ResNet: conv1/bn1 (16 channels), three stages of
    n basic blocks at 16, 32, 64 channels (the first block of stages 2 and 3
    halves the resolution), global average pooling, fc.  depth = 6n + 2."""

    def __init__(self, depth: int = 20, num_classes: int = NUM_CLASSES):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth must be 6n + 2 with n >= 1, got {depth}")
        n = (depth - 2) // 6
        self.depth = depth
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        in_planes = 16
        for stage, (planes, stride) in enumerate([(16, 1), (32, 2), (64, 2)], start=1):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class VGG11BN(nn.Sequential):
    """minidl's vgg11_bn (models/vgg.py): eight 3x3 convolutions without bias, each
    followed by BatchNorm and ReLU, 2x2 max pools after the 1st, 2nd, 4th, 6th and 8th,
    then one fully connected layer; modules named as minidl names its layers."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        layers, c_in, conv, pool = [], 3, 0, 0
        for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
            if v == "M":
                pool += 1
                layers.append((f"pool{pool}", nn.MaxPool2d(2, 2)))
                continue
            conv += 1
            layers += [(f"conv{conv}", nn.Conv2d(c_in, v, 3, padding=1, bias=False)),
                       (f"bn{conv}", nn.BatchNorm2d(v)), (f"relu{conv}", nn.ReLU())]
            c_in = v
        layers += [("flatten", nn.Flatten()), ("fc", nn.Linear(c_in, num_classes))]
        super().__init__(collections.OrderedDict(layers))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


def cifar10_quick(num_classes: int = NUM_CLASSES) -> Cifar10Quick:
    return Cifar10Quick(num_classes)


def resnet(depth: int, num_classes: int = NUM_CLASSES) -> CifarResNet:
    """The CIFAR ResNet of the given depth: 20, 32, 44, 56, 110, ... (6n + 2)."""
    return CifarResNet(depth, num_classes)


def resnet20(num_classes: int = NUM_CLASSES) -> CifarResNet:
    return CifarResNet(20, num_classes)


MODELS = {
    "cifar10_quick": cifar10_quick,
    "resnet20": resnet20,
    "resnet32": lambda num_classes=NUM_CLASSES: resnet(32, num_classes),
    "resnet56": lambda num_classes=NUM_CLASSES: resnet(56, num_classes),
    "resnet110": lambda num_classes=NUM_CLASSES: resnet(110, num_classes),
    "vgg11_bn": VGG11BN,
}


def build(name: str) -> nn.Module:
    try:
        return MODELS[name]()
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})") from None


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def _time_steps(step, warmup: int, steps: int, sync=lambda: None):
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def torch_bench(model: str, batch_size: int, steps: int, threads: int,
                channels_last: bool = False, warmup: int = 5, seed: int = 0,
                lr: float = 0.01, device: str = "cpu") -> dict:
    """Time training steps, then inference, of `model` on random data.

    A training step is zero_grad, forward, cross-entropy, backward and an SGD
    step (momentum 0.9, no weight decay); inference is a forward pass in eval
    mode under no_grad.  Each phase runs `warmup` untimed steps, then `steps`
    timed ones; images/s = batch_size / median step time.  On a GPU (device
    "cuda"): cuDNN in fp32 with TF32 off, each step timed to its synchronisation.
    """
    if batch_size < 1 or steps < 1 or threads < 1 or warmup < 0:
        raise ValueError("batch_size, steps and threads must be >= 1, warmup >= 0")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    sync = lambda: None  # noqa: E731
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        sync = torch.cuda.synchronize
    net = build(model)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(device=device, memory_format=fmt)
    x = torch.randn(batch_size, *INPUT_SHAPE).to(device=device, memory_format=fmt)
    y = torch.randint(0, NUM_CLASSES, (batch_size,)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    net.train()
    train_times = _time_steps(train_step, warmup, steps, sync)

    net.eval()
    with torch.no_grad():
        infer_times = _time_steps(lambda: net(x), warmup, steps, sync)

    train_med, infer_med = statistics.median(train_times), statistics.median(infer_times)
    return {
        "model": model,
        "framework": "torch",
        "layout": "channels_last" if channels_last else "nchw",
        "device": device if device == "cpu" else torch.cuda.get_device_name(),
        "batch_size": batch_size,
        "steps": steps,
        "warmup": warmup,
        "threads": threads,
        "train_images_per_s": batch_size / train_med,
        "infer_images_per_s": batch_size / infer_med,
        "train_step_ms_median": train_med * 1e3,
        "train_step_ms_min": min(train_times) * 1e3,
        "infer_step_ms_median": infer_med * 1e3,
        "infer_step_ms_min": min(infer_times) * 1e3,
        "peak_rss_mb": peak_rss_mb(),
        "parameters": sum(p.numel() for p in net.parameters()),
        "torch_version": torch.__version__,
    }


# The kinds of the ops a forward calls outside any leaf module (F.relu, +, ...), named
# as minidl names their layers' kinds (the loss is none of them: the step's rest)
FUNCTIONAL_KINDS = {"aten::relu": "ReLU", "aten::relu_": "ReLU", "aten::add": "Add",
                    "aten::add_": "Add", "aten::adaptive_avg_pool2d": "GlobalAvgPool2d",
                    "aten::flatten": "Flatten"}


def torch_layer_times(model: str, batch_size: int, steps: int, threads: int,
                      channels_last: bool = False, warmup: int = 3, seed: int = 0) -> dict:
    """Per-layer forward and backward times of training steps, from PyTorch's profiler.

    Every module's forward runs inside a profiler range (forward hooks).  A leaf module
    (Conv2d, BatchNorm2d, ...) is a layer under its state_dict name, its forward the
    range's time; an op called outside any leaf module (F.relu, the residual +) is a layer
    named after the module that called it, its kind and its rank among that module's
    ops of that kind ("layer1.0.relu1", "layer1.0.add1", "relu1").  A layer's backward
    is the time of the autograd functions whose sequence numbers its forward ops took.
    The rest of a step (loss, gradient accumulation, autograd's bookkeeping, the SGD
    step) is `other_ms`.  Times are per step, averaged over `steps` profiled steps."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    net = build(model)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt).train()
    x = torch.randn(batch_size, *INPUT_SHAPE).to(memory_format=fmt)
    y = torch.randint(0, NUM_CLASSES, (batch_size,))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    kinds, open_ranges = {}, {}
    for path, mod in net.named_modules():
        leaf = next(mod.children(), None) is None
        kinds[path] = type(mod).__name__ if leaf else None

        def enter(m, args, path=path):
            open_ranges[path] = r = record_function(f"layer::{path}")
            r.__enter__()

        def leave(m, args, out, path=path):
            open_ranges.pop(path).__exit__(None, None, None)

        mod.register_forward_pre_hook(enter)
        mod.register_forward_hook(leave)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps

    def module_of(ev):
        """The innermost module range around ev: (path, range event)."""
        e = ev.cpu_parent
        while e is not None and not e.name.startswith("layer::"):
            e = e.cpu_parent
        return (None, None) if e is None else (e.name[len("layer::"):], e)

    layers, seq_owner, ranks = {}, {}, {}

    def layer(name, kind):
        return layers.setdefault(name, {"name": name, "kind": kind, "forward_ms": 0.0,
                                        "backward_ms": 0.0})

    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    for ev in events:
        if ev.name.startswith("layer::"):
            path = ev.name[len("layer::"):]
            if kinds.get(path):
                layer(path, kinds[path])["forward_ms"] += ev.cpu_time_total / 1e3
            continue
        path, rng = module_of(ev)
        if path is None or ev.name.startswith("autograd::"):
            continue
        if kinds.get(path):  # inside a leaf module
            if ev.sequence_nr >= 0:
                seq_owner[ev.sequence_nr] = path
            continue
        kind = FUNCTIONAL_KINDS.get(ev.name)
        if kind is None or ev.cpu_parent is not rng:
            continue
        # rank among the calling module's ops of this kind, counted in this call of it
        key = (id(rng), kind)
        ranks[key] = ranks.get(key, 0) + 1
        name = f"{path + '.' if path else ''}{kind.lower()}{ranks[key]}"
        layer(name, kind)["forward_ms"] += ev.cpu_time_total / 1e3
        if ev.sequence_nr >= 0:
            seq_owner[ev.sequence_nr] = name
    for ev in events:
        if ev.name.startswith("autograd::engine::evaluate_function") and ev.cpu_parent is None:
            owner = seq_owner.get(ev.sequence_nr)
            if owner is not None:
                layers[owner]["backward_ms"] += ev.cpu_time_total / 1e3
    out = list(layers.values())
    for r in out:
        r["forward_ms"] /= steps
        r["backward_ms"] /= steps
    return {"model": model, "framework": "torch", "torch_version": torch.__version__,
            "layout": "channels_last" if channels_last else "nchw", "batch_size": batch_size,
            "threads": threads, "steps": steps, "profiled_step_ms": wall_ms, "layers": out,
            "other_ms": wall_ms - sum(r["forward_ms"] + r["backward_ms"] for r in out)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--channels-last", action="store_true", help="NHWC memory format")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--layers", action="store_true",
                   help="per-layer forward/backward times of training from PyTorch's profiler "
                        "(torch_layer_times) instead of the benchmark")
    args = p.parse_args(argv)
    if args.layers:
        r = torch_layer_times(args.model, args.batch_size, args.steps, args.threads,
                              channels_last=args.channels_last, warmup=args.warmup)
        if args.json:
            print(json.dumps(r))
        else:
            for row in r["layers"]:
                print(f"{row['name']:<24} {row['kind']:<16} forward {row['forward_ms']:7.2f} ms"
                      f"  backward {row['backward_ms']:7.2f} ms")
            print(f"other {r['other_ms']:.2f} ms of a profiled step of "
                  f"{r['profiled_step_ms']:.1f} ms")
        return 0
    r = torch_bench(args.model, args.batch_size, args.steps, args.threads,
                    channels_last=args.channels_last, warmup=args.warmup, device=args.device)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['model']} torch {r['torch_version']} {r['layout']}, batch {r['batch_size']}, "
              f"{r['threads']} threads: train {r['train_images_per_s']:.1f} img/s "
              f"({r['train_step_ms_median']:.1f} ms/step), infer {r['infer_images_per_s']:.1f} img/s "
              f"({r['infer_step_ms_median']:.1f} ms/step), peak RSS {r['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
