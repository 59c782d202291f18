"""One real-data run: LeNet on Fashion-MNIST (Debian's dataset-fashion-mnist, which CI
installs), one epoch over the 60,000 training images, at least 85% test accuracy."""
import json
from pathlib import Path

import pytest

from minidl.train import TrainConfig, train

FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.slow
@pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_lenet_fashion_mnist_one_epoch(tmp_path):
    summary = train(TrainConfig(model="lenet", dataset="fashion-mnist", epochs=1,
                                data=str(tmp_path / "no-data-here"), out=str(tmp_path),
                                progress=False, download=False))
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    print(f"lenet fashion-mnist 1 epoch: test accuracy {row['test_acc']:.4f}, "
          f"{row['wall_s']:.1f} s, {row['images_per_s']:.0f} images/s")
    assert summary["final_test_acc"] >= 0.85
