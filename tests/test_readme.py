"""The README's Python example runs as written."""
import os
import re

import numpy as np

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "README.md")


def test_readme_python_example():
    blocks = re.findall(r"```python\n(.*?)```", open(README).read(), re.S)
    assert blocks, "README has no python example"
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert scope["y"].shape == (8, 16, 32, 32)
    assert scope["logits"].shape == (8, 10)
    assert np.isfinite(scope["loss"])
