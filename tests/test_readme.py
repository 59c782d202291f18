"""The README's Python examples run as written."""
import os
import re

import numpy as np

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "README.md")


def _blocks():
    blocks = re.findall(r"```python\n(.*?)```", open(README).read(), re.S)
    assert len(blocks) == 3, "README should have the library, functional and device examples"
    return blocks


def _run(code):
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    return scope


def test_readme_library_example():
    scope = _run(_blocks()[0])
    assert scope["logits"].shape == (32, 10)
    assert np.isfinite(scope["loss"])
    assert scope["net"].nodes["res"].shape == (16, 32, 32)


def test_readme_functional_example():
    scope = _run(_blocks()[1])
    assert scope["y"].shape == (8, 16, 32, 32)
    assert scope["logits"].shape == (8, 10)
    assert np.isfinite(scope["loss"])


def test_readme_device_example():
    scope = _run(_blocks()[2])
    dev = scope["dev"]
    assert dev.kind == "sim" and scope["logits"].shape == (32, 10)
    # the parameters (net.to), the batch's images and labels, then x for the op
    assert dev.copies["h2d"]["count"] == len(scope["net"].parameters()) + 3
    assert dev.peak <= dev.budget
    assert np.array_equal(scope["host"], np.maximum(scope["x"], 0))
