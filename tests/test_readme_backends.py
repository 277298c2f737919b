"""The README's layer examples (its "Layers" section, long context and the
key/value cache included) run as written on the backend of the process:
the README says the layers work on every backend, so the PyTorch line of
CI runs this file too (`tests/test_readme.py` runs every example on
TensorFlow; JAX passed them in a review, and its CI line is the longest)."""

import os
import re

import keras
import pytest

README = os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")


def layer_blocks():
    text = open(README, encoding="utf-8").read()
    section = text[text.index("\n## Layers\n"):]
    section = section[: section.index("\n## ", 1)]
    return [
        b for b in re.findall(r"```python\n(.*?)```", section, re.S)
        if not b.startswith("# sketch") and "    ...\n" not in b
    ]


@pytest.mark.skipif(
    keras.backend.backend() == "tensorflow",
    reason="tests/test_readme.py runs every example on TensorFlow",
)
def test_the_layer_examples_run_on_this_backend(tmp_path, monkeypatch):
    blocks = layer_blocks()
    assert len(blocks) >= 5, blocks  # the section's examples were found
    monkeypatch.chdir(tmp_path)  # files they write (model.keras) land here
    namespace = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"<README layers example {i}>", "exec"), namespace)
