"""`implementation="auto"` for long sequences: a measured, visible choice."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops
from keras_attention.ops import autotune
from tests.test_ops import attention_reference
from tests.test_ops import count_calls
from tests.test_ops import random_qkv

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="the measured choice is made on TensorFlow (other backends: a rule)",
)


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    """Every test starts with no choice made and the default options."""
    monkeypatch.setattr(autotune, "_OPTIONS", dict(autotune._OPTIONS, enabled=True))
    monkeypatch.setattr(autotune, "_CHOICES", {})
    monkeypatch.setattr(attention_ops.dispatch, "DENSE_THRESHOLD", 1000)


def path_choices():
    """The dense-or-blocked choices (not the rule that compiles the blocked
    core outside XLA, `tests/test_fast_paths.py`)."""
    return [
        c for c in attention_ops.dispatch_choices()
        if c.implementation != "blocked, compiled by XLA"
    ]


def long_qkv():
    return random_qkv(np.random.default_rng(3), t=40, s=48, h=2, k=2, d=8, dv=8)


def fake_measure(dense_ms, blocked_ms, chunked_ms=None):
    """Times for the candidates asked for (the chunked path, unless timed
    here, as the slowest)."""
    table = {"dense": dense_ms, "blocked": blocked_ms,
             "chunked": chunked_ms if chunked_ms is not None else 1e9}

    def measure(*args, **kwargs):
        measure.calls += 1
        measure.shapes = list(args[1])
        measure.candidates = list(args[7])
        return {c: table[c] for c in args[7]}

    measure.calls = 0
    return measure


@pytest.mark.parametrize("faster", ["dense", "blocked"])
def test_the_faster_measured_path_runs_and_the_choice_is_recorded(monkeypatch, faster):
    measure = fake_measure(1.0, 2.0) if faster == "dense" else fake_measure(2.0, 1.0)
    monkeypatch.setattr(autotune, "_measure", measure)
    calls = count_calls(monkeypatch, "blocked_heads")
    q, k, v = long_qkv()
    out = attention_ops.dot_product_attention(q, k, v, is_causal=True)
    assert bool(calls) == (faster == "blocked")
    np.testing.assert_allclose(
        out.numpy(), attention_reference(q, k, v, causal=True)[0], atol=1e-5
    )
    (choice,) = path_choices()
    assert choice.implementation == faster
    assert choice.timings_ms == (
        {"dense": 1.0, "blocked": 2.0, "chunked": 1e9} if faster == "dense"
        else {"dense": 2.0, "blocked": 1.0, "chunked": 1e9}
    )
    assert choice.reason.startswith("measured: dense")
    assert choice.key[3:6] == (2, 40, 48)  # B, T, S
    # The same shape again: no new measurement, the same path.
    attention_ops.dot_product_attention(q, k, v, is_causal=True)
    assert measure.calls == 1
    assert len(path_choices()) == 1


def test_a_real_measurement_in_graph_and_xla_gives_the_reference_values():
    q, k, v = long_qkv()
    mask = np.ones((2, 48), bool)
    mask[1, 30:] = False
    ref = attention_reference(q, k, v, mask=mask[:, None, None, :])[0]
    grads = []
    for jit in (False, True):

        @tf.function(jit_compile=jit)
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch(q)
                out = attention_ops.dot_product_attention(
                    q, k, v, attention_mask=mask, training=True
                )
                loss = tf.reduce_sum(out * out)
            return out, tape.gradient(loss, q)

        out, grad = step(tf.constant(q), tf.constant(k), tf.constant(v))
        np.testing.assert_allclose(out.numpy(), ref, atol=1e-5)
        grads.append(grad.numpy())
    # The gradient through whichever path each mode took is the same.
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-5)
    # (Under XLA the fast forms' rules are listed too: `ops/xla_cpu.py`.)
    choices = [c for c in path_choices()
               if c.implementation in ("dense", "blocked", "chunked")]
    assert [c.key[1] for c in choices] == ["graph", "xla"]
    # Under a gradient tape without training=True: timed as training too.
    with tf.GradientTape() as tape:
        q_ = tf.constant(q)
        tape.watch(q_)
        attention_ops.dot_product_attention(q_, k, v, attention_mask=mask)
    assert path_choices()[-1].key[2] == "train"
    for choice in choices:
        assert choice.key[2] == "train"
        # The chunked path is a candidate outside XLA only.
        assert set(choice.timings_ms) == (
            {"dense", "blocked"} if choice.key[1] == "xla"
            else {"dense", "blocked", "chunked"}
        )
        assert all(t > 0 for t in choice.timings_ms.values())
        # The fastest, or the rule's (blocked) within timing noise of it.
        assert choice.implementation == autotune._fastest(
            choice.key, choice.timings_ms, rule="blocked"
        ).implementation


def test_rules_when_not_measured(monkeypatch):
    monkeypatch.setattr(autotune, "_measure", fake_measure(1.0, 2.0))
    q, k, v = long_qkv()
    attention_ops.set_autotune(memory_budget=1024)
    attention_ops.dot_product_attention(q, k, v)
    (choice,) = path_choices()
    assert choice.implementation == "blocked"
    assert "over the budget" in choice.reason and choice.timings_ms == {}
    attention_ops.clear_dispatch_choices()
    attention_ops.set_autotune(enabled=False, memory_budget=2**40)
    attention_ops.dot_product_attention(q, k, v)
    (choice,) = path_choices()
    assert (choice.implementation, choice.reason) == ("blocked", "rule: autotune is off")
    # (An unknown batch alone is measured: the next test. Other unknown
    # dimensions keep the rule, "shapes not static".)


def test_an_unknown_batch_alone_is_measured_at_batch_one(monkeypatch):
    # Keras's `fit` on TensorFlow traces an unknown batch whenever the last
    # batch is partial: every step ran the fixed rule (3.6x slower at 1,100
    # tokens on one machine).
    measure = fake_measure(1.0, 2.0)
    monkeypatch.setattr(autotune, "_measure", measure)
    function = tf.function(attention_ops.dot_product_attention)
    specs = [tf.TensorSpec((None, 40, 2, 8)), tf.TensorSpec((None, 48, 2, 8))]
    function.get_concrete_function(specs[0], specs[1], specs[1])
    (choice,) = path_choices()
    assert choice.implementation == "dense" and choice.key[3] is None
    assert "batch unknown when traced: timed at batch 1" in choice.reason
    assert [shape[0] for shape in measure.shapes] == [1, 1, 1]
    # The memory budget counts 32 examples: the dense path is no candidate.
    attention_ops.clear_dispatch_choices()
    attention_ops.set_autotune(memory_budget=3 * 4 * 2 * 40 * 48 * 31)
    function = tf.function(attention_ops.dot_product_attention)
    function.get_concrete_function(specs[0], specs[1], specs[1])
    (choice,) = path_choices()
    assert "dense" not in measure.candidates


def test_short_sequences_and_explicit_implementations_are_not_measured(monkeypatch):
    measure = fake_measure(1.0, 2.0)
    monkeypatch.setattr(autotune, "_measure", measure)
    q, k, v = random_qkv(np.random.default_rng(0), t=9, s=13)
    attention_ops.dot_product_attention(q, k, v)  # T * S under the threshold
    q, k, v = long_qkv()
    attention_ops.dot_product_attention(q, k, v, implementation="blocked")
    attention_ops.dot_product_attention(q, k, v, return_weights=True)
    assert measure.calls == 0 and path_choices() == []


@pytest.mark.parametrize(
    "kwargs, match",
    [({"memory_budget": -1}, "memory_budget"), ({"repeats": 0}, "repeats"),
     ({"repeats": 1.5}, "repeats")],
)
def test_bad_options_raise_and_change_nothing(kwargs, match):
    before = dict(autotune._OPTIONS)
    with pytest.raises(ValueError, match=match):
        attention_ops.set_autotune(**kwargs)
    assert autotune._OPTIONS == before


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_half_precision_applications_compile_without_xla_on_a_cpu(dtype):
    """XLA's CPU backend has no bfloat16 units: a bf16 model compiles in
    graph mode by default there (even where an application's default is
    XLA, as the translators'); float32 keeps the default; an explicit
    `jit_compile` is always kept."""
    from keras_attention.applications import VisionTransformer

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype)
    try:
        model = VisionTransformer(
            image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_channels=1,
        )
    finally:
        keras.config.set_dtype_policy(previous)
    model.compile()
    on_cpu = not tf.config.list_logical_devices("GPU")
    if on_cpu and dtype == "mixed_bfloat16":
        assert model.jit_compile is False
    else:  # Keras's "auto" (itself graph mode on a CPU-only machine)
        assert model.jit_compile == model._resolve_auto_jit_compile()
    model.compile(jit_compile=True)
    assert model.jit_compile is True
    x = np.zeros((2, 8, 8, 1), "float32")
    model.compile()
    model.train_on_batch(x, np.array([0, 1]))


def test_a_causal_call_is_timed_unmasked_on_a_slice_of_its_queries(monkeypatch):
    # The chunked path skips a causal chunk's later keys; the first queries
    # that are timed see few of them, which would favour it unfairly.
    seen = []
    timed = autotune._timed_fn

    def spy(run, implementation, mask, mode, training, causal=False):
        seen.append((implementation, causal))
        return timed(run, implementation, mask, mode, training, causal)

    monkeypatch.setattr(autotune, "_timed_fn", spy)
    q, k, v = long_qkv()  # 40 queries
    # All of them timed: causal, as called.
    attention_ops.dot_product_attention(q, k, v, is_causal=True)
    assert sorted(seen) == [("blocked", True), ("chunked", True), ("dense", True)]
    # The first 16 of them timed: unmasked.
    monkeypatch.setattr(autotune, "MEASURED_ROWS", 16)
    attention_ops.clear_dispatch_choices()
    seen.clear()
    attention_ops.dot_product_attention(q, k, v, is_causal=True)
    assert sorted(seen) == [("blocked", False), ("chunked", False), ("dense", False)]
    seen.clear()
    # With a window the blocked path's work depends on the band's side.
    attention_ops.dot_product_attention(q, k, v, is_causal=True, sliding_window=5)
    assert sorted(seen) == [("blocked", True), ("dense", True)]


def test_a_path_within_timing_noise_of_the_rule_leaves_the_rule():
    # dense 39.2 ms against blocked 39.4 picked dense in one run and blocked
    # in the next, and the results differed in their last bits.
    close = autotune._fastest("k", {"dense": 39.2, "blocked": 39.4}, rule="blocked")
    assert close.implementation == "blocked" and "within 5%" in close.reason
    far = autotune._fastest("k", {"dense": 30.0, "blocked": 39.4}, rule="blocked")
    assert far.implementation == "dense"
    assert autotune._fastest("k", {"dense": 39.2, "blocked": 39.4}).implementation == "dense"
