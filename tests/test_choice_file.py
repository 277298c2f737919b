"""Measured choices kept in a file for later processes
(`set_autotune(cache_file=...)`, `ops/choice_file.py`)."""

import json
import os

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops
from keras_attention.ops import autotune
from keras_attention.ops import choice_file
from tests.test_autotune import fake_measure
from tests.test_autotune import long_qkv
from tests.test_autotune import path_choices
from tests.test_ops import attention_reference

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="the measured choice is made on TensorFlow (other backends: a rule)",
)


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(
        autotune, "_OPTIONS", dict(autotune._OPTIONS, enabled=True, cache_file=None)
    )
    monkeypatch.setattr(autotune, "_CHOICES", {})
    monkeypatch.setattr(attention_ops.dispatch, "DENSE_THRESHOLD", 1000)
    monkeypatch.setattr(choice_file, "_WARNED", set())


def call_long(measure, monkeypatch):
    """One long call (a new process's first: no choice in memory)."""
    autotune.clear_dispatch_choices()
    monkeypatch.setattr(autotune, "_measure", measure)
    q, k, v = long_qkv()
    out = attention_ops.dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(
        out.numpy(), attention_reference(q, k, v, causal=True)[0], atol=1e-5
    )
    (choice,) = path_choices()
    return choice


def test_a_measured_choice_is_kept_and_taken_without_measuring(tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    attention_ops.set_autotune(cache_file=path)
    first = call_long(fake_measure(2.0, 1.0), monkeypatch)
    assert first.implementation == "blocked"
    content = json.loads(path.read_text())
    assert content["format"] == choice_file.FORMAT
    (entry,) = content["entries"]
    assert entry["implementation"] == "blocked"
    assert entry["key"] == repr(first.key)
    assert entry["machine"]["cores"] >= 1 and entry["machine"]["backend"] == "tensorflow"
    # A later process: the file's choice, nothing measured, the same values.
    again = fake_measure(1.0, 2.0)
    kept = call_long(again, monkeypatch)
    assert again.calls == 0
    assert kept.implementation == "blocked"
    assert kept.timings_ms == first.timings_ms
    assert kept.reason == f"{first.reason} (kept in {path})"
    # Without the file: measured again.
    attention_ops.set_autotune(cache_file=False)
    assert call_long(again, monkeypatch).implementation == "dense"
    assert again.calls == 1


def test_another_machine_or_budget_measures_again_and_adds_its_entry(
        tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    attention_ops.set_autotune(cache_file=str(path))
    call_long(fake_measure(2.0, 1.0), monkeypatch)
    real = choice_file.machine
    monkeypatch.setattr(
        choice_file, "machine", lambda onednn: dict(real(onednn), cpu="another CPU")
    )
    measure = fake_measure(1.0, 2.0)
    assert call_long(measure, monkeypatch).implementation == "dense"
    assert measure.calls == 1
    attention_ops.set_autotune(memory_budget=2**40)
    call_long(measure, monkeypatch)
    assert measure.calls == 2
    entries = json.loads(path.read_text())["entries"]
    assert [e["implementation"] for e in entries] == ["blocked", "dense", "dense"]
    assert entries[0]["machine"]["cpu"] != "another CPU"


def test_a_file_that_is_not_ours_is_left_as_it_is(tmp_path, monkeypatch):
    path = tmp_path / "settings.json"
    path.write_text('{"learning_rate": 0.1}')
    attention_ops.set_autotune(cache_file=path)
    with pytest.warns(UserWarning, match="not a keras_attention choice file"):
        choice = call_long(fake_measure(2.0, 1.0), monkeypatch)
    assert choice.implementation == "blocked" and "kept in" not in choice.reason
    assert path.read_text() == '{"learning_rate": 0.1}'
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    attention_ops.set_autotune(cache_file=broken)
    with pytest.warns(UserWarning, match="cannot be read"):
        call_long(fake_measure(2.0, 1.0), monkeypatch)
    assert broken.read_text() == '{"format": '


@pytest.mark.parametrize("bad", [3, True, "", "no/such/folder/choices.json", "."])
def test_a_bad_cache_file_raises_and_changes_nothing(bad):
    before = dict(autotune._OPTIONS)
    with pytest.raises(ValueError, match="cache_file"):
        attention_ops.set_autotune(enabled=False, cache_file=bad)
    assert autotune._OPTIONS == before


_STORER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("choice_file", sys.argv[1])
choice_file = importlib.util.module_from_spec(spec)
spec.loader.exec_module(choice_file)
for i in range(int(sys.argv[4])):
    choice_file.store(sys.argv[2], {"cpu": "x"}, (sys.argv[3], i), 1, "dense",
                      "measured", {"dense": 1.0})
"""


def test_processes_storing_at_once_keep_every_entry(tmp_path):
    # Each process reads the file, adds its entry and writes it whole: without
    # the lock, one process's write drops what another added meanwhile.
    import subprocess
    import sys

    path, processes, each = str(tmp_path / "choices.json"), 6, 15
    storers = [
        subprocess.Popen([sys.executable, "-c", _STORER, choice_file.__file__,
                          path, f"process {n}", str(each)])
        for n in range(processes)
    ]
    assert [p.wait(timeout=120) for p in storers] == [0] * processes
    with open(path, encoding="utf-8") as handle:
        keys = {entry["key"] for entry in json.load(handle)["entries"]}
    assert len(keys) == processes * each


def test_a_cache_file_named_by_the_environment_is_checked(tmp_path, monkeypatch):
    # A folder (or a file in a missing folder) was taken, warned about only
    # at the first long call, and a stray `<folder>.lock` made beside it.
    monkeypatch.setenv("KERAS_ATTENTION_AUTOTUNE_CACHE", str(tmp_path / "choices.json"))
    assert autotune._cache_from_environment() == str(tmp_path / "choices.json")
    for bad in (str(tmp_path), str(tmp_path / "missing" / "choices.json")):
        monkeypatch.setenv("KERAS_ATTENTION_AUTOTUNE_CACHE", bad)
        with pytest.warns(UserWarning, match="KERAS_ATTENTION_AUTOTUNE_CACHE.*ignored"):
            assert autotune._cache_from_environment() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_the_umask_is_read_without_setting_it(monkeypatch):
    # Setting it to 0 to read it opened, for that instant, any file another
    # thread of the process made to everyone.
    real = os.umask(0o022)
    os.umask(real)

    def refuse(mask):
        raise AssertionError("os.umask was called")

    monkeypatch.setattr(choice_file.os, "umask", refuse)
    assert choice_file._umask() == real
