"""minidl.data: data sets in their official file layouts and a batch loader.

Readers return ``(images uint8 (N, C, H, W), labels int64 (N,))``;
:class:`DataLoader` turns them into normalised float32 batches.  The data
directory is ``--data DIR``, else ``$MINIDL_DATA``, else ``~/.cache/minidl``
(:func:`data_root`).
"""
from minidl.data.loader import DataLoader
from minidl.data.readers import (DATASETS, DatasetError, DatasetInfo, data_root, load_cifar10,
                                 load_dataset, load_fashion_mnist, load_idx, load_mnist)

__all__ = ["DATASETS", "DataLoader", "DatasetError", "DatasetInfo", "data_root", "load_cifar10",
           "load_dataset", "load_fashion_mnist", "load_idx", "load_mnist"]
