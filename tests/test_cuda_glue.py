"""The cuda device's call adapter, without a GPU: arguments given in the CPU
binding's order reach the CUDA binding's parameters (addresses, workspace sizes,
element counts, a loss written to device memory)."""
import types

import numpy as np

from minidl.device import DeviceArray
from minidl.device.cuda import CudaDevice


class _Mem:
    def __init__(self, ptr):
        self.ptr = ptr


def _device():
    dev = object.__new__(CudaDevice)  # no GPU: only what _launch touches
    dev.name, dev.launches = "cuda:0", 0
    dev.current = types.SimpleNamespace(handle=77)
    dev.empty = lambda shape: DeviceArray(dev, _Mem(9000), tuple(shape), np.float32)
    dev.to_host = lambda a: np.array([2.5], np.float32)
    return dev


def _array(dev, ptr, shape):
    return DeviceArray(dev, _Mem(ptr), shape, np.float32)


def test_relu_gets_addresses_and_the_element_count():
    dev, seen = _device(), {}

    def relu_forward(x, y, count, stream=0):
        seen.update(x=x, y=y, count=count, stream=stream)
    dev._launch("relu_forward", relu_forward, (_array(dev, 100, (2, 3)), _array(dev, 200, (2, 3))))
    assert seen == {"x": 100, "y": 200, "count": 6, "stream": 77} and dev.launches == 1


def test_a_workspace_passes_its_size_and_none_is_null():
    dev, seen = _device(), {}

    def conv2d_forward(shape, x, w, bias, y, ws=0, ws_bytes=0, stream=0):
        seen.update(bias=bias, ws=ws, ws_bytes=ws_bytes)
    a = _array(dev, 8, (4,))
    dev._launch("conv2d_forward", conv2d_forward,
                ((1, 1, 2, 2, 1, 1, 1, 1, 1, 0, 0), a, a, None, a, _array(dev, 64, (10,))))
    assert seen == {"bias": 0, "ws": 64, "ws_bytes": 40}


def test_the_loss_comes_back_as_a_float():
    dev, seen = _device(), {}

    def softmax_cross_entropy(n, classes, logits, labels, dlogits, loss, stream=0):
        seen.update(loss=loss)
    a = _array(dev, 8, (2, 3))
    loss = dev._launch("softmax_cross_entropy", softmax_cross_entropy, (2, 3, a, a, a))
    assert loss == 2.5 and seen == {"loss": 9000}
