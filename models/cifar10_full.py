"""cifar10_full: Caffe's examples/cifar10 full net with BatchNorm in place of its LRN.

Caffe's layers in Caffe's order (conv 32 5x5 pad 2, max pool 3/2, ReLU, conv 32,
ReLU, average pool 3/2, conv 64, ReLU, average pool 3/2, fully connected), ceil-mode
pooling and Gaussian initialisation; its two local response normalisation layers,
which minidl does not have, are BatchNorm2d layers here.
"""
INPUT = (3, 32, 32)
TRAIN = dict(dataset="cifar10", epochs=20, batch_size=100, optimizer="sgd", lr=0.05,
             momentum=0.9, weight_decay=0.004, lr_schedule="cosine", warmup_epochs=0)


def spec(input_shape, num_classes):
    pool = dict(kernel_size=3, stride=2, ceil_mode=True)
    conv = dict(kernel_size=5, padding=2)
    return dict(input=input_shape, layers=[
        ("conv1", "Conv2d", dict(out_channels=32, weight_init=("gaussian", 1e-4), **conv)),
        ("pool1", "MaxPool2d", pool),
        ("relu1", "ReLU", {}),
        ("norm1", "BatchNorm2d", {}),
        ("conv2", "Conv2d", dict(out_channels=32, weight_init=("gaussian", 1e-2), **conv)),
        ("relu2", "ReLU", {}),
        ("pool2", "AvgPool2d", pool),
        ("norm2", "BatchNorm2d", {}),
        ("conv3", "Conv2d", dict(out_channels=64, weight_init=("gaussian", 1e-2), **conv)),
        ("relu3", "ReLU", {}),
        ("pool3", "AvgPool2d", pool),
        ("flatten", "Flatten", {}),
        ("ip1", "Linear", dict(out_features=num_classes, weight_init=("gaussian", 1e-2))),
    ])
