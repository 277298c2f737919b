"""The dense core in groups of `(batch, head)` pairs side by side, in a
TensorFlow graph: the same values, a measured and visible choice
(`autotune.pair_group`)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops
from keras_attention.ops import autotune
from keras_attention.ops import dense
from keras_attention.ops import timing

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="groups of pairs are a TensorFlow graph's choice (elsewhere: never)",
)

B, H, T, S = 3, 4, 20, 24


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(autotune, "_OPTIONS", dict(autotune._OPTIONS, enabled=True))
    monkeypatch.setattr(autotune, "_CHOICES", {})


def heads(seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=(B, H, n, d)), "float32")
            for n, d in ((T, 8), (S, 8), (S, 5))]


def pair_choices():
    return [c for c in attention_ops.dispatch_choices() if c.key[0] == "pair groups"]


def core_and_grads(q, k, v, mask, pairs, jit=False):
    @tf.function(jit_compile=jit)
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = dense.dense_core(q, k, v, mask, pairs)
            loss = tf.reduce_sum(out * out)
        return [out] + tape.gradient(loss, [q, k, v])

    return [x.numpy() for x in step(q, k, v)]


@pytest.mark.parametrize("pairs", [1, 5])
@pytest.mark.parametrize(
    "mask_shape",
    [None, (B, 1, 1, S), (B, 1, T, S), (T, S), (1, H, T, S), (B, H, T, S)],
)
def test_groups_of_pairs_give_the_cores_values_and_gradients(mask_shape, pairs):
    q, k, v = heads()
    mask = None
    if mask_shape is not None:
        mask = np.random.default_rng(1).random(mask_shape) > 0.3
        mask[..., 0, :] = False  # a query that sees no key: zeros
        mask = tf.constant(mask)
    whole = core_and_grads(q, k, v, mask, 0)
    # 12 pairs in groups of 5: uneven groups (5, 5, 2).
    for got, want in zip(core_and_grads(q, k, v, mask, pairs), whole):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_bfloat16_heads_in_groups_keep_the_cores_values():
    q, k, v = (tf.cast(x, "bfloat16") for x in heads(4))
    mask = tf.constant(np.random.default_rng(5).random((B, 1, T, S)) > 0.3)
    whole = core_and_grads(q, k, v, mask, 0)
    for got, want in zip(core_and_grads(q, k, v, mask, 3), whole):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(
            np.asarray(got, "float32"), np.asarray(want, "float32"), atol=2e-2
        )


def fake_measure(all_ms, grouped_ms):
    def measure(run, shapes, q_dtype, v_dtype, mask_shape, mode, training,
                candidates, *args):
        measure.calls.append((mode, training, list(candidates)))
        return dict(zip(candidates, (all_ms, grouped_ms)))

    measure.calls = []
    return measure


def count_groups(monkeypatch):
    calls = []
    original = dense._pair_groups

    def spy(q, k, v, mask, pairs):
        calls.append(pairs)
        return original(q, k, v, mask, pairs)

    monkeypatch.setattr(dense, "_pair_groups", spy)
    return calls


@pytest.mark.parametrize("grouped_faster", [True, False])
def test_the_group_size_is_measured_once_in_a_graph_and_recorded(
        monkeypatch, grouped_faster):
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 2 * 4 * T * S)  # 2 pairs
    measure = fake_measure(2.0, 1.0) if grouped_faster else fake_measure(1.0, 2.0)
    monkeypatch.setattr(autotune, "_measure", measure)
    groups = count_groups(monkeypatch)
    q, k, v = heads()
    whole = core_and_grads(q, k, v, None, 0)
    got = core_and_grads(q, k, v, None, None)  # None: as measured
    for a, b in zip(got, whole):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert groups == ([2] if grouped_faster else [])
    assert measure.calls == [("graph", True, ["all pairs", "2 pairs a group"])]
    (choice,) = pair_choices()
    assert choice.implementation == ("2 pairs a group" if grouped_faster else "all pairs")
    assert choice.reason.startswith("measured: all pairs")
    assert choice.key[3] == "train" and choice.key[4] == (B, H, T, 8)
    # The same shape again: no new measurement.
    core_and_grads(q, k, v, None, None)
    assert len(measure.calls) == 1 and len(pair_choices()) == 1


def test_many_pairs_make_larger_groups_not_more(monkeypatch):
    # 12 pairs of one pair a group by size, but at most 5 groups: groups of
    # 3 (every group is a copy of the core in the traced graph).
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 4 * T * S)
    monkeypatch.setattr(autotune, "MAX_PAIR_GROUPS", 5)
    measure = fake_measure(2.0, 1.0)
    monkeypatch.setattr(autotune, "_measure", measure)
    groups = count_groups(monkeypatch)
    q, k, v = heads()
    got = core_and_grads(q, k, v, None, None)
    for a, b in zip(got, core_and_grads(q, k, v, None, 0)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert groups == [3]
    assert measure.calls == [("graph", True, ["all pairs", "3 pairs a group"])]
    # At most one group: all pairs at once, nothing to measure.
    monkeypatch.setattr(autotune, "MAX_PAIR_GROUPS", 1)
    monkeypatch.setattr(autotune, "_CHOICES", {})
    core_and_grads(q, k, v, None, None)
    assert groups == [3] and len(measure.calls) == 1


def test_no_groups_under_xla_eagerly_or_for_short_or_unknown_shapes(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(autotune, "_measure", never)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 4 * T * S)
    q, k, v = heads()
    # Under the size floor (the default, 1,024 x 1,024 scores a pair).
    core_and_grads(q, k, v, None, None)
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    dense.dense_core(q, k, v, None)  # eager: one operation at a time
    core_and_grads(q, k, v, None, None, jit=True)  # XLA runs its own way
    spec = tf.TensorSpec((None, H, T, 8))
    tf.function(lambda q: dense.dense_core(q, q, q, None)).get_concrete_function(spec)
    assert pair_choices() == []
    # Autotune off: all pairs at once, by rule.
    attention_ops.set_autotune(enabled=False)
    groups = count_groups(monkeypatch)
    core_and_grads(q, k, v, None, None)
    (choice,) = pair_choices()
    assert (choice.implementation, choice.reason) == ("all pairs", "rule: autotune is off")
    assert groups == []


def test_a_real_measurement_keeps_the_values(monkeypatch):
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 4 * 4 * T * S)  # 4 pairs
    q, k, v = heads(2)
    mask = tf.constant(np.random.default_rng(3).random((B, 1, 1, S)) > 0.2)
    got = core_and_grads(q, k, v, mask, None)
    for a, b in zip(got, core_and_grads(q, k, v, mask, 0)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    (choice,) = pair_choices()
    assert set(choice.timings_ms) == {"all pairs", "4 pairs a group"}
    assert all(t > 0 for t in choice.timings_ms.values())
    assert choice.key[-1] == (B, 1, 1, S)


def test_a_nested_measurement_leaves_the_outer_one_as_it_was(monkeypatch):
    # `choose` timing the dense path with part of a call's queries traces
    # the dense core, which may measure its group size inside.
    outer = {"rows": 77, "training": True, "cores": None}
    monkeypatch.setattr(autotune, "_MEASURED_CALL", dict(outer))
    shapes = [(1, 2, 3)] * 3
    timings = autotune._measure(
        lambda name, q, k, v, m, causal: q, shapes, "float32", "float32",
        None, "graph", False, ["a"],
    )
    assert set(timings) == {"a"}
    assert autotune._MEASURED_CALL == outer


def test_the_dense_path_is_timed_by_its_cores_measurement(monkeypatch):
    # `choose` timing the dense path: its trace measured the core's pair
    # groups on the same shapes, whose best time is the dense path's.
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 4 * 4 * T * S)  # 4 pairs
    # No other path close to it (at these sizes any could be).
    monkeypatch.setattr(autotune, "CLOSE_RATIO", 0.0)

    def run(name, q, k, v, m, causal):
        if name == "dense":
            return dense.dense_core(q, k, v, m)
        return tf.tanh(q) + tf.reduce_mean(k) + tf.reduce_mean(v)  # timed itself

    shapes = [(B, H, T, 8), (B, H, S, 8), (B, H, S, 5)]
    notes = []
    timings = autotune._measure(run, shapes, "float32", "float32", None,
                                "graph", True, ["dense", "other"], notes=notes)
    (choice,) = pair_choices()
    assert choice.key[3] == "train"
    assert timings["dense"] == min(choice.timings_ms.values())
    assert timings["other"] > 0
    assert notes == ["dense timed by its core's pair-group measurement"]
    # Found, not measured, the second time; still the dense path's time.
    notes = []
    again = autotune._measure(run, shapes, "float32", "float32", None,
                              "graph", True, ["dense"], notes=notes)
    assert again["dense"] == timings["dense"] and len(pair_choices()) == 1
    assert notes == ["dense timed by its core's pair-group measurement"]


def test_a_losing_candidate_is_timed_once(monkeypatch):
    calls = []

    def fn(*args):
        calls.append(args)
        return np.zeros(())

    # Slower than 1.5x the fastest (0 ms) after its first timed call.
    timing.best_ms(fn, (1,), 0.0, 3)
    assert len(calls) == 2  # the untimed first call, one timed
    calls.clear()
    timing.best_ms(fn, (1,), float("inf"), 3)
    assert len(calls) == 4


@pytest.mark.parametrize("dtype, group", [("float32", 2), ("float16", 2), ("bfloat16", 4)])
def test_groups_hold_the_same_bytes_of_scores_in_any_dtype(monkeypatch, dtype, group):
    # bfloat16 heads keep bfloat16 scores: twice the pairs in the same bytes.
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 2 * 4 * T * S)
    measure = fake_measure(2.0, 1.0)
    monkeypatch.setattr(autotune, "_measure", measure)
    q, k, v = (tf.cast(x, dtype) for x in heads())
    core_and_grads(q, k, v, None, None)
    assert measure.calls[0][2] == ["all pairs", f"{group} pairs a group"]


def test_the_dense_path_is_timed_itself_when_another_comes_close(monkeypatch):
    # Another path within `CLOSE_RATIO` of the core's time: the core leaves
    # out the layout changes around it, so the dense path is run and timed.
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 4 * 4 * T * S)
    monkeypatch.setattr(autotune, "CLOSE_RATIO", 1e9)

    def run(name, q, k, v, m, causal):
        if name == "dense":
            return dense.dense_core(q, k, v, m)
        return tf.tanh(q) + tf.reduce_mean(k) + tf.reduce_mean(v)

    shapes = [(B, H, T, 8), (B, H, S, 8), (B, H, S, 5)]
    notes = []
    timings = autotune._measure(run, shapes, "float32", "float32", None,
                                "graph", True, ["dense", "other"], notes=notes)
    (choice,) = pair_choices()
    assert timings["dense"] not in choice.timings_ms.values()
    assert notes == []


@pytest.mark.parametrize("close", [False, True])
def test_the_dense_path_is_traced_in_groups_only_when_it_runs(monkeypatch, close):
    # The trace that measures the core's groups is run only if another path
    # comes close; until then it leaves the groups out (cheaper to trace),
    # and the dense path timed itself is traced again, in its groups.
    monkeypatch.setattr(autotune, "PAIR_GROUPS_FROM", 1)
    monkeypatch.setattr(autotune, "PAIR_GROUP_BYTES", 4 * 4 * T * S)  # 4 pairs
    monkeypatch.setattr(autotune, "CLOSE_RATIO", 1e9 if close else 0.0)
    grouped = []
    real_groups = dense._pair_groups
    monkeypatch.setattr(dense, "_pair_groups",
                        lambda *args: grouped.append(args[-1]) or real_groups(*args))
    # All pairs 2 ms, four a group 1 ms (the nested measurement), the
    # other path 5 ms, the dense path timed itself 3 ms.
    times = iter([2.0, 1.0, 5.0, 3.0])

    def best_ms(fn, args, fastest_ms, repeats):
        fn(*args)  # traced here if not yet
        return next(times)

    monkeypatch.setattr(timing, "best_ms", best_ms)

    def run(name, q, k, v, m, causal):
        if name == "dense":
            return dense.dense_core(q, k, v, m)
        return tf.tanh(q) + tf.reduce_mean(k) + tf.reduce_mean(v)

    shapes = [(B, H, T, 8), (B, H, S, 8), (B, H, S, 5)]
    timings = autotune._measure(run, shapes, "float32", "float32", None,
                                "graph", True, ["dense", "other"])
    assert pair_choices()[0].implementation == "4 pairs a group"
    # One trace in groups for the nested measurement, one for the dense
    # path when it is timed itself.
    assert grouped == ([4, 4] if close else [4])
    assert timings == {"dense": 3.0 if close else 1.0, "other": 5.0}
