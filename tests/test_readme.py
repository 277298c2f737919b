"""The README's Python examples run as written."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")
BLOCKS = re.findall(r"```python\n(.*?)```", open(README, encoding="utf-8").read(), re.S)
# Blocks with "..." (a plugin's class body) or that start with "# sketch"
# (they need hardware or data a test machine lacks) are not run.
RUNNABLE = [
    b for b in BLOCKS if "    ...\n" not in b and not b.startswith("# sketch")
]


def test_readme_has_examples():
    assert len(RUNNABLE) >= 2


def test_readme_examples_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for block in RUNNABLE:
        exec(compile(block, README, "exec"), namespace)
