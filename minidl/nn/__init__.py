"""Layers of minidl (see minidl.nn.layers for the protocol) and their initialisers."""
from minidl.nn import init  # noqa: F401
from minidl.nn.layers import (LAYERS, Add, AvgPool2d, BatchNorm2d, Conv2d, Dropout,  # noqa: F401
                              Flatten, GlobalAvgPool2d, Layer, Linear, Mapped, MaxPool2d,
                              Parameter,
                              ReLU, ShapeError, SoftmaxCrossEntropy)
