"""Lengths unknown where the call is traced (TensorFlow: a `tf.function`
or export signature with `None`, `model.fit` on `padded_batch` data,
`model.predict` after its first length). The chunked path takes them, its
chunk count decided when run; `implementation="auto"` in a graph takes the
dense path while its scores fit the memory budget and the chunked one
after, decided when run. Both equal the dense path in values and
gradients."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops
from keras_attention.layers import MultiHeadAttention
from keras_attention.ops import autotune
from keras_attention.ops import dense
from keras_attention.ops import dispatch
from keras_attention.ops.positions import alibi_slopes
from tests.test_ops import random_qkv

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="only TensorFlow traces unknown lengths (JAX traces each length, "
    "torch runs eagerly or with symbolic sizes)",
)


@pytest.fixture(autouse=True)
def fresh_options(monkeypatch):
    monkeypatch.setattr(autotune, "_OPTIONS", dict(autotune._OPTIONS))
    monkeypatch.setattr(autotune, "_CHOICES", {})
    monkeypatch.setattr(autotune, "_RULE_KEYS", type(autotune._RULE_KEYS)())


@pytest.fixture
def chunk_runs(monkeypatch):
    """How many calls ran the chunked path (counted when run, not traced:
    a condition traces both of its branches)."""
    runs = []

    def counted(*args, **kwargs):
        out = dense.chunked_heads(*args, **kwargs)
        tick = tf.numpy_function(lambda: runs.append(1) or np.float32(0), [], tf.float32)
        tick.set_shape(())
        return out + tf.cast(tick, out.dtype)

    monkeypatch.setattr(dispatch, "chunked_heads", counted)
    return runs


def values_and_grads(q, k, v, **kwargs):
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = attention_ops.dot_product_attention(q, k, v, **kwargs)
        loss = tf.reduce_sum(out * tf.cos(out))
    return [out] + tape.gradient(loss, [q, k, v])


def unknown_lengths(fn, q, k, v, mask, jit_compile=False):
    """`fn(q, k, v, mask)` traced with every length unknown."""
    spec = [tf.TensorSpec((None, None) + tuple(x.shape[2:]), x.dtype) for x in (q, k, v)]
    if mask is not None:
        spec.append(tf.TensorSpec((None,) * mask.ndim, tf.bool))
    traced = tf.function(fn, input_signature=spec, jit_compile=jit_compile)
    return traced(q, k, v) if mask is None else traced(q, k, v, mask)


CASES = {
    "keys mask": dict(mask="keys"),
    "causal": dict(is_causal=True),
    "full mask, causal": dict(mask="full", is_causal=True),
    "window": dict(sliding_window=6, is_causal=True),
    "alibi": dict(alibi=True, mask="keys"),
}


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_chunked_path_takes_lengths_unknown_when_traced(monkeypatch, case, jit_compile):
    # Chunks of 8 rows: 37 queries are five chunks, the last padded.
    monkeypatch.setattr(dense, "DYNAMIC_CHUNK_ROWS", 8)
    options = dict(CASES[case])
    rng = np.random.default_rng(len(case))
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=37, s=37 if options.get("is_causal") else 29))
    mask = options.pop("mask", None)
    if mask == "keys":
        mask = rng.random((2, k.shape[1])) > 0.3
        mask[1] = False  # a batch row that sees no key: zeros
    elif mask == "full":
        mask = rng.random((2, 37, 37)) > 0.5
    if options.pop("alibi", False):
        options["alibi_slopes"] = alibi_slopes(4)

    def run(implementation):
        def fn(q, k, v, m=None):
            return values_and_grads(q, k, v, attention_mask=m, implementation=implementation, **options)
        return fn

    want = run("dense")(q, k, v, mask)
    got = unknown_lengths(run("chunked"), q, k, v, mask, jit_compile)
    for g, w, name in zip(got, want, ["out", "d_q", "d_k", "d_v"]):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, atol=2e-5, err_msg=name)


def test_auto_takes_the_dense_path_while_it_fits_and_the_chunked_one_after(chunk_runs):
    # Twelve bytes per score of `(B, H, T, S)`: 2 x 4 x 20 x 20 fit the
    # budget, 2 x 4 x 40 x 40 do not; one traced function runs both.
    attention_ops.set_autotune(memory_budget=12 * 2 * 4 * 30 * 30)
    traced = None
    for length in (20, 40, 20):
        q, k, v = (tf.constant(x) for x in random_qkv(np.random.default_rng(length), t=length, s=length))
        want = values_and_grads(q, k, v, is_causal=True, implementation="dense")

        def fn(q, k, v):
            return values_and_grads(q, k, v, is_causal=True)

        if traced is None:
            spec = [tf.TensorSpec((None, None) + tuple(x.shape[2:])) for x in (q, k, v)]
            traced = tf.function(fn, input_signature=spec)
        got = traced(q, k, v)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=2e-5)
    assert len(chunk_runs) == 1  # the 40-token call only
    assert traced.experimental_get_tracing_count() == 1
    (choice,) = [c for c in attention_ops.dispatch_choices() if c.key[0] == "unknown length"]
    assert choice.implementation == "dense or chunked"
    assert "memory budget" in choice.reason


def test_fit_on_padded_batches_of_long_texts_trains_as_the_dense_path(chunk_runs):
    # `model.fit` on a `padded_batch` pipeline traces the length as `None`:
    # the batches over the budget run the chunked path, and the weights
    # trained are the dense path's.
    attention_ops.set_autotune(memory_budget=12 * 2 * 2 * 24 * 24)
    lengths = [7, 30, 12, 33, 5, 9]
    rng = np.random.default_rng(0)
    texts = [rng.normal(size=(n, 6)).astype("float32") for n in lengths]

    def data():
        ds = tf.data.Dataset.from_generator(
            lambda: ((x, np.float32(x.sum() > 0)) for x in texts),
            output_signature=(tf.TensorSpec((None, 6)), tf.TensorSpec(())),
        )
        return ds.padded_batch(2)

    def model(implementation):
        keras.utils.set_random_seed(1)
        inputs = keras.Input((None, 6))
        x = MultiHeadAttention(2, 4, implementation=implementation)(inputs, use_causal_mask=True)
        outputs = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(x))
        built = keras.Model(inputs, outputs)
        built.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
        return built

    auto, reference = model("auto"), model("dense")
    auto.fit(data(), epochs=2, verbose=0)
    runs = len(chunk_runs)
    reference.fit(data(), epochs=2, verbose=0)
    assert runs == 4  # the batches of 30 and 33 tokens, twice
    for a, b in zip(auto.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_blocked_path_still_names_the_way_out():
    q, k, v = random_qkv(np.random.default_rng(7))
    with pytest.raises(ValueError, match="static sequence lengths") as raised:
        tf.function(
            lambda q, k, v: attention_ops.dot_product_attention(
                q, k, v, implementation="blocked"
            )
        ).get_concrete_function(
            tf.TensorSpec((2, None, 4, 8)), tf.TensorSpec((2, 13, 2, 8)),
            tf.TensorSpec((2, 13, 2, 5)),
        )
    assert "implementation='chunked'" in str(raised.value)


def test_an_unknown_length_of_zero_queries_gives_an_empty_output():
    spec = [tf.TensorSpec((2, None, 4, 8)), tf.TensorSpec((2, None, 2, 8)), tf.TensorSpec((2, None, 2, 5))]
    traced = tf.function(
        lambda q, k, v: attention_ops.dot_product_attention(q, k, v, implementation="chunked"),
        input_signature=spec,
    )
    q, k, v = random_qkv(np.random.default_rng(2), t=0)
    assert tuple(traced(q, k, v).shape) == (2, 0, 4, 5)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_a_broadcast_mask_of_unknown_shape_and_no_queries_take_the_chunked_path(
    monkeypatch, jit_compile
):
    # A `(B, 1, S)` or `(B, T, 1)` mask traced as `(None, None, None)`: the
    # chunked path sliced its size-1 axis as if it were `T` or `S` ("Expected
    # size[2] in [0, 1]"); and under XLA a call of no queries compiled a
    # one-row slice of none.
    monkeypatch.setattr(dense, "DYNAMIC_CHUNK_ROWS", 8)
    rng = np.random.default_rng(3)
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=21, s=21))
    for mask in (rng.random((2, 1, 21)) > 0.3, rng.random((2, 21, 1)) > 0.3):
        def run(implementation):
            def fn(q, k, v, m):
                return values_and_grads(q, k, v, attention_mask=m, implementation=implementation)
            return fn

        got = unknown_lengths(run("chunked"), q, k, v, mask, jit_compile)
        for g, w in zip(got, run("dense")(q, k, v, mask)):
            np.testing.assert_allclose(g, w, atol=2e-5)
    empty = tf.zeros((2, 0, 4, 8))
    out = unknown_lengths(
        lambda q, k, v: attention_ops.dot_product_attention(q, k, v, implementation="chunked"),
        empty, k, v, None, jit_compile,
    )
    assert tuple(out.shape) == (2, 0, 4, 5)
