"""`--run-large` runs the tests marked `large` (skipped by default).

Triton (which PyTorch's CUDA builds bring, and timm's torchvision import
loads) crashes the process when it is first imported after TensorFlow; it
is imported here, before any test module imports Keras.
"""

import importlib.util

import pytest

if importlib.util.find_spec("triton") is not None:
    import triton  # noqa: F401


def pytest_addoption(parser):
    parser.addoption(
        "--run-large", action="store_true", help="also run the `large` tests"
    )


# The modules with the longest tests (seconds of their longest test under
# `pytest -n 2` on 2 cores, from `--durations`), run first and each kept
# whole (their module fixtures are set up once): pytest-xdist hands out the
# first tests in turn to each worker, so the long ones start at once and
# the short ones fill the gaps, instead of one starting last and running
# alone.
LONGEST_FIRST = (
    "tests/test_readme.py",  # 112-168
    "tests/test_pictures.py",  # 79-95
    "tests/test_distributed.py",  # 42
    "tests/test_sharding.py",  # 47 (setup)
    "tests/test_visualization.py",  # 31
    "tests/test_translation.py",  # 29
    "tests/test_multi_worker.py",  # 23
)


def _rank(item):
    module = item.nodeid.split("::")[0]
    if module in LONGEST_FIRST:
        return LONGEST_FIRST.index(module)
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the rest keep their order
    if config.getoption("--run-large"):
        return
    skip = pytest.mark.skip(reason="a large test: run with --run-large")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def assigned_variables(monkeypatch):
    """The paths of the Keras variables assigned during the test (the
    converters' tests check that a mismatch assigns none)."""
    import keras

    writes = []
    original = keras.Variable.assign

    def assign(self, value):
        writes.append(self.path)
        return original(self, value)

    monkeypatch.setattr(keras.Variable, "assign", assign)
    return writes
