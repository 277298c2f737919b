"""A user's checks of `implementation="auto"`: its settings, its threads,
its keys and its choice file (`ops/autotune.py`, `ops/choice_file.py`)."""

import importlib.util
import json
import math
import os
import stat
import threading
import time
import warnings

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops
from keras_attention.ops import autotune
from keras_attention.ops import choice_file
from tests.test_autotune import fake_measure
from tests.test_autotune import long_qkv
from tests.test_autotune import path_choices
from tests.test_choice_file import fresh_choices  # noqa: F401 - autouse
from tests.test_ops import attention_reference

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="the measured choice is made on TensorFlow (other backends: a rule)",
)




def fresh_autotune_module():
    """`ops/autotune.py` imported again, reading the environment again."""
    spec = importlib.util.spec_from_file_location("autotune_again", autotune.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_environment_variable_reads_its_words(monkeypatch):
    for value, enabled in [("false", False), ("Off", False), ("0", False),
                           ("true", True), ("1", True), ("", True)]:
        monkeypatch.setenv("KERAS_ATTENTION_AUTOTUNE", value)
        assert fresh_autotune_module()._OPTIONS["enabled"] is enabled, value


def test_a_bad_environment_variable_raises_naming_it(monkeypatch):
    monkeypatch.setenv("KERAS_ATTENTION_AUTOTUNE", "sometimes")
    with pytest.raises(ValueError, match="KERAS_ATTENTION_AUTOTUNE='sometimes'"):
        fresh_autotune_module()


@pytest.mark.parametrize("kwargs, name", [
    ({"enabled": "no"}, "enabled"),
    ({"memory_budget": "1GB"}, "memory_budget"),
    ({"memory_budget": True}, "memory_budget"),
    ({"memory_budget": math.inf}, "memory_budget"),
    ({"enabled": False, "memory_budget": math.nan}, "memory_budget"),
    ({"repeats": math.inf}, "repeats"),
    ({"repeats": True}, "repeats"),
])
def test_bad_settings_raise_naming_them_and_change_nothing(kwargs, name):
    before = dict(autotune._OPTIONS)
    with pytest.raises(ValueError, match=f"argument `{name}`"):
        attention_ops.set_autotune(**kwargs)
    assert autotune._OPTIONS == before


def test_a_measurement_in_one_thread_leaves_another_threads_calls_alone():
    # While a thread times a training call, another thread's inference call
    # must not be taken for a training one (nor a slice of a longer call).
    measuring, done = threading.Event(), threading.Event()

    def measure():
        autotune._MEASURED_CALL.update(training=True, rows=4096)
        measuring.set()
        done.wait(5)

    thread = threading.Thread(target=measure)
    thread.start()
    try:
        assert measuring.wait(5)
        assert autotune.gradient_recorded("tensorflow") is False
        assert autotune.measured_call_rows() is None
    finally:
        done.set()
        thread.join()


def test_threads_calling_a_new_shape_at_once_measure_it_once(monkeypatch):
    measure = fake_measure(1.0, 2.0)

    def slow_measure(*args, **kwargs):
        time.sleep(0.3)  # both threads are past their first look meanwhile
        return measure(*args, **kwargs)

    monkeypatch.setattr(autotune, "_measure", slow_measure)
    q, k, v = long_qkv()
    start, outs = threading.Barrier(2), []

    def call():
        start.wait()
        outs.append(attention_ops.dot_product_attention(q, k, v).numpy())

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert measure.calls == 1 and len(path_choices()) == 1
    want = attention_reference(q, k, v)[0]
    for out in outs:
        np.testing.assert_allclose(out, want, atol=1e-5)


def test_a_call_with_alibi_is_chosen_apart_from_one_without(monkeypatch):
    # With ALiBi the dense path takes autodiff's backward pass: another cost.
    measure = fake_measure(1.0, 2.0)
    monkeypatch.setattr(autotune, "_measure", measure)
    q, k, v = long_qkv()
    attention_ops.dot_product_attention(q, k, v)
    attention_ops.dot_product_attention(
        q, k, v, alibi_slopes=np.array([0.5, 0.25], "float32"))
    assert measure.calls == 2
    assert [c.key[-1] for c in path_choices()] == [False, True]


def call_long(monkeypatch, measure):
    """A new process's first long call, with the file set."""
    autotune.clear_dispatch_choices()
    monkeypatch.setattr(autotune, "_measure", measure)
    q, k, v = long_qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention_ops.dot_product_attention(q, k, v)
    (choice,) = path_choices()
    return choice


def test_an_empty_choice_file_takes_the_choices(tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    path.touch()  # made for them
    attention_ops.set_autotune(cache_file=path)
    call_long(monkeypatch, fake_measure(2.0, 1.0))
    (entry,) = json.loads(path.read_text())["entries"]
    assert entry["implementation"] == "blocked"


def test_the_choice_file_keeps_its_permissions(tmp_path, monkeypatch):
    path = tmp_path / "shared.json"
    path.write_text(json.dumps(
        {"format": choice_file.FORMAT, "version": choice_file.VERSION, "entries": []}))
    os.chmod(path, 0o644)  # shared by the users of a machine
    attention_ops.set_autotune(cache_file=path)
    call_long(monkeypatch, fake_measure(2.0, 1.0))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    new = tmp_path / "new.json"
    attention_ops.set_autotune(cache_file=new)
    call_long(monkeypatch, fake_measure(2.0, 1.0))
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o666 & ~umask


def test_a_read_only_choice_file_is_read_and_left_as_it_is(tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    attention_ops.set_autotune(cache_file=path)
    call_long(monkeypatch, fake_measure(2.0, 1.0))
    os.chmod(path, 0o444)
    before = path.read_text()
    # Its choice is taken; a new one is measured and not written.
    again = fake_measure(1.0, 2.0)
    assert call_long(monkeypatch, again).implementation == "blocked"
    assert again.calls == 0
    monkeypatch.setattr(autotune, "_measure", again)
    with pytest.warns(UserWarning, match="read-only"):
        attention_ops.dot_product_attention(*long_qkv(), is_causal=True)
    assert again.calls == 1
    assert path.read_text() == before
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444


def test_a_kept_choice_that_is_no_candidate_is_measured_again(tmp_path, monkeypatch):
    # A file edited by hand, or by another version, may name another path.
    path = tmp_path / "choices.json"
    attention_ops.set_autotune(cache_file=path)
    call_long(monkeypatch, fake_measure(2.0, 1.0))
    content = json.loads(path.read_text())
    content["entries"][0]["implementation"] = "quantum"
    path.write_text(json.dumps(content))
    measure = fake_measure(1.0, 2.0)
    assert call_long(monkeypatch, measure).implementation == "dense"
    assert measure.calls == 1
    (entry,) = json.loads(path.read_text())["entries"]
    assert entry["implementation"] == "dense"


def test_a_dense_custom_gradient_block_holds_for_its_own_thread_only():
    # The block set the process's value: another thread read it, and two
    # blocks of two threads ending out of order left it changed for good.
    from keras_attention.ops import dense_custom_gradient
    from keras_attention.ops import dispatch

    seen = {}
    entered, other_entered, first_left = (threading.Event() for _ in range(3))

    def first():
        with dense_custom_gradient(False):
            entered.set()
            other_entered.wait(10)
            seen["first"] = dispatch._dense_custom_gradient_setting()
        first_left.set()

    def second():
        entered.wait(10)
        seen["outside"] = dispatch._dense_custom_gradient_setting()
        with dense_custom_gradient(True):
            other_entered.set()
            first_left.wait(10)
            seen["second"] = dispatch._dense_custom_gradient_setting()

    threads = [threading.Thread(target=f) for f in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen == {"outside": True, "first": False, "second": True}
    assert dispatch._dense_custom_gradient_setting() is True


def test_rule_choices_are_kept_for_the_latest_shapes_only(monkeypatch):
    # Every shape traced under XLA records a few rules: a service of many
    # lengths grew `dispatch_choices()` for good. Measured ones stay.
    monkeypatch.setattr(autotune, "MAX_RULE_CHOICES", 5)
    autotune.clear_dispatch_choices()
    measured = autotune.Choice(("measured",), "dense", "measured", {"dense": 1.0})
    autotune._CHOICES[measured.key] = measured
    for length in range(12):
        autotune.record_rule(("rule", length), "flat matmul", "rule")
    keys = [choice.key for choice in autotune.dispatch_choices()]
    assert keys == [("measured",)] + [("rule", n) for n in range(7, 12)]
    autotune.clear_dispatch_choices()
