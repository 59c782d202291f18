"""cifar10_quick: Caffe's examples/cifar10 quick net, layer for layer.

Three 5x5 convolutions (32, 32, 64 channels, pad 2), a 3x3 stride-2 max pool then
two 3x3 stride-2 average pools in ceil mode, fully connected 64 then num_classes
(no ReLU between them, as in Caffe), Caffe's Gaussian initialisation (std 1e-4 for
conv1, 1e-2 for conv2/3, 1e-1 for ip1/ip2; biases 0).  145,578 parameters.
"""
INPUT = (3, 32, 32)
# like Caffe's solver, no augmentation (crops and flips pay off only over more epochs)
TRAIN = dict(dataset="cifar10", epochs=10, batch_size=100, optimizer="sgd", lr=0.02,
             momentum=0.9, weight_decay=1e-3, lr_schedule="cosine", warmup_epochs=0,
             augment=False)


def spec(input_shape, num_classes):
    pool = dict(kernel_size=3, stride=2, ceil_mode=True)
    conv = dict(kernel_size=5, padding=2)
    return dict(input=input_shape, layers=[
        ("conv1", "Conv2d", dict(out_channels=32, weight_init=("gaussian", 1e-4), **conv)),
        ("pool1", "MaxPool2d", pool),
        ("relu1", "ReLU", {}),
        ("conv2", "Conv2d", dict(out_channels=32, weight_init=("gaussian", 1e-2), **conv)),
        ("relu2", "ReLU", {}),
        ("pool2", "AvgPool2d", pool),
        ("conv3", "Conv2d", dict(out_channels=64, weight_init=("gaussian", 1e-2), **conv)),
        ("relu3", "ReLU", {}),
        ("pool3", "AvgPool2d", pool),
        ("flatten", "Flatten", {}),
        ("ip1", "Linear", dict(out_features=64, weight_init=("gaussian", 1e-1))),
        ("ip2", "Linear", dict(out_features=num_classes, weight_init=("gaussian", 1e-1))),
    ])
