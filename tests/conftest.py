"""`--run-large` runs the tests marked `large` (skipped by default).

Triton (which PyTorch's CUDA builds bring, and timm's torchvision import
loads) crashes the process when it is first imported after TensorFlow; it
is imported here, before any test module imports Keras.
"""

import gc
import importlib.util

import pytest

if importlib.util.find_spec("triton") is not None:
    import triton  # noqa: F401


def pytest_addoption(parser):
    parser.addoption(
        "--run-large", action="store_true", help="also run the `large` tests"
    )
    parser.addoption(
        "--tolerance-margins", metavar="DIR", default=None,
        help="record, for each `np.testing.assert_allclose` call of the "
        "tests, the largest |actual - desired| / (atol + rtol |desired|) "
        "seen (1 fails); the calls nearest 1 are printed at the end",
    )


def pytest_configure(config):
    folder = config.getoption("--tolerance-margins")
    if folder:
        from tests import tolerance_margins

        tolerance_margins.start(config, folder)


def pytest_collection_finish(session):
    """Move everything the imports made (TensorFlow, Keras, torch: ~600,000
    objects) to the collector's permanent generation. Keras runs a full
    `gc.collect()` each time a layer deletes a variable (every kernel that
    `quantize` replaces) and in `clear_session`; over all those objects
    each took 0.3 s, so quantizing `vit_digits` took 8.0 s, and 0.04 s
    after the freeze (`benchmarks/bench_quantize_gc.py`). Objects the
    tests make are collected as before."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _freeze_what_earlier_modules_left():
    """The same again as each test module starts: what the modules before
    it left in a long-lived worker (models, traced functions) is frozen
    too. Keras's full collections otherwise walked all of it each time:
    saving and loading a quantized translator took 47.7 s late in a full
    run and 2.5 s alone (`--durations`, 2026-12-04)."""
    gc.collect()
    gc.freeze()
    yield


def pytest_collection_modifyitems(config, items):
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
