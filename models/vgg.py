"""vgg11_bn: VGG-11 (Simonyan and Zisserman 2015, configuration A) with BatchNorm after
every convolution, for 32x32 images: eight 3x3 convolutions (64, M, 128, M, 256, 256,
M, 512, 512, M, 512, 512, M; M a 2x2 max pool) each followed by BatchNorm and ReLU,
then one fully connected layer, as CIFAR versions of VGG commonly are.
"""
INPUT = (3, 32, 32)
TRAIN = dict(dataset="cifar10", epochs=30, batch_size=128, optimizer="sgd", lr=0.05,
             momentum=0.9, weight_decay=5e-4, lr_schedule="cosine", warmup_epochs=1)
CONFIGS = {11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]}


def spec(input_shape, num_classes, depth):
    layers, conv, pool = [], 0, 0
    for v in CONFIGS[depth]:
        if v == "M":
            pool += 1
            layers.append((f"pool{pool}", "MaxPool2d", dict(kernel_size=2, stride=2)))
        else:
            conv += 1
            layers += [(f"conv{conv}", "Conv2d", dict(out_channels=v, kernel_size=3, padding=1,
                                                      bias=False)),
                       (f"bn{conv}", "BatchNorm2d", {}), (f"relu{conv}", "ReLU", {})]
    layers += [("flatten", "Flatten", {}), ("fc", "Linear", dict(out_features=num_classes))]
    return dict(input=input_shape, layers=layers)
