"""resnet20/32/56/110: the CIFAR ResNets of He et al. 2016 ("Deep Residual Learning"), option B.

A 3x3 convolution to 16 channels, three stages of n = (depth - 2) / 6 basic blocks
(16, 32, 64 channels; the first block of stages 2 and 3 halves the resolution),
global average pooling and a fully connected layer.  A block is
relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); the shortcut is the identity,
or, where the shape changes, option B: a 1x1 stride-2 convolution and BatchNorm
(torchvision's "downsample").  Convolutions have no bias; Kaiming initialisation.
Names follow torchvision (layer1.0.conv1.weight, ...).
"""
INPUT = (3, 32, 32)
TRAIN = dict(dataset="cifar10", epochs=30, batch_size=128, optimizer="sgd", lr=0.1,
             momentum=0.9, weight_decay=5e-4, lr_schedule="cosine", warmup_epochs=1)


def spec(input_shape, num_classes, depth):
    if (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n + 2, got {depth}")
    n = (depth - 2) // 6
    conv = dict(kernel_size=3, padding=1, bias=False)
    layers = [("conv1", "Conv2d", dict(out_channels=16, **conv)),
              ("bn1", "BatchNorm2d", {}), ("relu", "ReLU", {})]
    x, channels = "relu", 16
    for stage, width in enumerate((16, 32, 64), start=1):
        for i in range(n):
            b = f"layer{stage}.{i}"
            stride = 2 if stage > 1 and i == 0 else 1
            layers += [(f"{b}.conv1", "Conv2d", dict(out_channels=width, stride=stride, **conv),
                        x),
                       (f"{b}.bn1", "BatchNorm2d", {}), (f"{b}.relu1", "ReLU", {}),
                       (f"{b}.conv2", "Conv2d", dict(out_channels=width, **conv)),
                       (f"{b}.bn2", "BatchNorm2d", {})]
            shortcut = x
            if stride != 1 or width != channels:
                layers += [(f"{b}.downsample.0", "Conv2d",
                            dict(out_channels=width, kernel_size=1, stride=stride, bias=False), x),
                           (f"{b}.downsample.1", "BatchNorm2d", {})]
                shortcut = f"{b}.downsample.1"
            layers += [(f"{b}.add", "Add", {}, [f"{b}.bn2", shortcut]),
                       (f"{b}.relu2", "ReLU", {})]
            x, channels = f"{b}.relu2", width
    layers += [("avgpool", "GlobalAvgPool2d", {}), ("fc", "Linear", dict(out_features=num_classes))]
    return dict(input=input_shape, layers=layers)
