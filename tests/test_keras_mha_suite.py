"""keras's own test file for `keras.layers.MultiHeadAttention`, run on ours.

The file ships inside the keras wheel
(`keras/src/layers/attention/multi_head_attention_test.py`). Its test case
is subclassed here with one change: the name `layers.MultiHeadAttention`
that the file uses points to `keras_attention.layers.MultiHeadAttention`
(every other `layers.*` name is keras's). Nothing is skipped but what the
file skips itself (flash attention on a backend without it).
"""

import importlib
import types

import pytest

import keras_attention

try:
    suite = importlib.import_module(
        "keras.src.layers.attention.multi_head_attention_test"
    )
except ImportError:  # pragma: no cover - a keras wheel without its tests
    pytest.skip("keras's MultiHeadAttention tests are not installed", allow_module_level=True)


class _Layers(types.ModuleType):
    """`keras.src.layers` with our `MultiHeadAttention` in place of keras's."""

    def __init__(self, layers):
        super().__init__(layers.__name__)
        self._layers = layers
        self.MultiHeadAttention = keras_attention.layers.MultiHeadAttention

    def __getattr__(self, name):
        return getattr(self._layers, name)


class TestKerasMultiHeadAttentionSuite(suite.MultiHeadAttentionTest):
    def setUp(self):
        self._keras_layers = suite.layers
        suite.layers = _Layers(self._keras_layers)
        super().setUp()

    def tearDown(self):
        super().tearDown()
        suite.layers = self._keras_layers


def test_the_suite_runs_our_class():
    layers = _Layers(suite.layers)
    assert layers.MultiHeadAttention is keras_attention.layers.MultiHeadAttention
    assert layers.Embedding is suite.layers.Embedding
