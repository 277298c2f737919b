"""What `import keras_attention` sets before TensorFlow loads
(`keras_attention/_startup.py`), and `ops.onednn_status()`."""

import os
import sys

import keras
import pytest

from keras_attention import _startup
from keras_attention import ops as attention_ops


@pytest.fixture
def fresh_start(monkeypatch):
    """A process that has not loaded TensorFlow, with no settings of the
    user's."""
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    return monkeypatch


def test_startup_quietens_tensorflow_and_leaves_onednn_to_the_user(fresh_start):
    _startup.before_tensorflow()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ


def test_startup_keeps_a_users_setting_and_changes_nothing_late(fresh_start):
    fresh_start.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    _startup.before_tensorflow()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    fresh_start.delenv("TF_CPP_MIN_LOG_LEVEL")
    fresh_start.setitem(sys.modules, "tensorflow", object())
    _startup.before_tensorflow()
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="TensorFlow's kernels"
)
def test_onednn_status_says_what_runs_and_how_to_change_it(monkeypatch):
    from tensorflow.python.util import _pywrap_util_port

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setattr(_pywrap_util_port, "IsMklEnabled", lambda: False)
    status = attention_ops.onednn_status()
    assert status.startswith("off: TensorFlow's default on this CPU; ")
    assert "TF_ENABLE_ONEDNN_OPTS=1" in status
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert attention_ops.onednn_status() == "off: TF_ENABLE_ONEDNN_OPTS=0"
    monkeypatch.setattr(_pywrap_util_port, "IsMklEnabled", lambda: True)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    assert attention_ops.onednn_status() == "on: TensorFlow's default on this CPU"
