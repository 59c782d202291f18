"""lenet: Caffe's examples/mnist LeNet for 28x28 grey images (MNIST, Fashion-MNIST).

conv 20 5x5, max pool 2/2, conv 50 5x5, max pool 2/2, fully connected 500, ReLU,
fully connected num_classes; Xavier initialisation as in Caffe.  431,080 parameters.
"""
INPUT = (1, 28, 28)
TRAIN = dict(dataset="fashion-mnist", epochs=1, batch_size=64, optimizer="sgd", lr=0.01,
             momentum=0.9, weight_decay=5e-4, lr_schedule="constant", warmup_epochs=0)


def spec(input_shape, num_classes):
    return dict(input=input_shape, layers=[
        ("conv1", "Conv2d", dict(out_channels=20, kernel_size=5, weight_init="xavier")),
        ("pool1", "MaxPool2d", dict(kernel_size=2, stride=2)),
        ("conv2", "Conv2d", dict(out_channels=50, kernel_size=5, weight_init="xavier")),
        ("pool2", "MaxPool2d", dict(kernel_size=2, stride=2)),
        ("flatten", "Flatten", {}),
        ("ip1", "Linear", dict(out_features=500, weight_init="xavier")),
        ("relu1", "ReLU", {}),
        ("ip2", "Linear", dict(out_features=num_classes, weight_init="xavier")),
    ])
