"""The chunked path (`ops/dense.py`): the dense core over chunks of queries,
the weights recomputed in the backward pass. Equal to the dense path in
values and gradients, whatever the chunking, mask, window or heads."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops
from keras_attention.layers import MultiHeadAttention
from keras_attention.ops import autotune
from keras_attention.ops import dense
from keras_attention.ops.masks import expand_mask
from keras_attention.ops.positions import alibi_slopes
from tests.test_ops import attention_reference
from tests.test_ops import random_qkv

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="TensorFlow tapes (the path itself runs on every backend: "
    "tests/test_backends.py)",
)


def values_and_grads(fn, q, k, v):
    """`[out, d_q, d_k, d_v]` of `sum(out * cos(out))` (in float32), as
    tensors: traced inside `tf.function` by some tests."""
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = fn(q, k, v)
        loss = tf.reduce_sum(tf.cast(out, "float32") * tf.cos(tf.cast(out, "float32")))
    return [out] + tape.gradient(loss, [q, k, v])


def mask_of(kind, rng, b, t, s):
    if kind == "keys":
        mask = rng.random((b, s)) > 0.3
        mask[1] = False  # a batch row that sees no key: zeros, no NaN
        return mask
    if kind == "full":
        mask = rng.random((b, t, s)) > 0.5
        mask[0, 3] = False
        return mask
    return None


@pytest.mark.parametrize("chunk", [1, 5, 8, 37, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
def test_chunked_equals_dense_in_values_and_gradients(chunk, causal, mask_kind):
    # 37 queries (no chunk size but 1 and 37 divides them: padded rows),
    # 29 keys, 4 query heads on 2 key heads, a value head size of 6.
    rng = np.random.default_rng(chunk)
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=37, s=29, dv=6))
    mask = mask_of(mask_kind, rng, 2, 37, 29)
    scale = 8**-0.5

    def chunked(q, k, v):
        m = None if mask is None else expand_mask(tf.constant(mask))
        return dense.chunked_heads(q, k, v, m, causal, scale, chunk=chunk)

    def dense_path(q, k, v):
        return attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=causal, implementation="dense"
        )

    got, want = values_and_grads(chunked, q, k, v), values_and_grads(dense_path, q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5)
    ref = attention_reference(
        q, k, v, None if mask is None else expand_mask(mask).numpy(), causal
    )[0]
    np.testing.assert_allclose(got[0].numpy(), ref, atol=1e-5)
    if mask_kind == "keys":
        assert np.all(got[0].numpy()[1] == 0.0)


@pytest.mark.parametrize("causal", [False, True])
def test_windows_and_alibi_chunk_by_chunk_equal_the_dense_path(causal):
    rng = np.random.default_rng(5)
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=40, s=40, h=4, k=4))
    slopes = alibi_slopes(4)
    results = {}
    for implementation in ("dense", "chunked"):
        def fn(q, k, v, implementation=implementation):
            return attention_ops.dot_product_attention(
                q, k, v, is_causal=causal, sliding_window=7,
                alibi_slopes=slopes, implementation=implementation,
            )
        results[implementation] = values_and_grads(fn, q, k, v)
    for a, b in zip(results["chunked"], results["dense"]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_several_chunks_through_the_public_call_in_graph_and_xla(monkeypatch, causal):
    # A budget of 16 rows per chunk: 3 chunks of 40 queries, padded. A
    # causal chunk skips the keys after its last query outside XLA (a
    # dynamic number of keys per step) and masks them under XLA.
    monkeypatch.setattr(dense, "CHUNK_SCORE_BYTES", 16 * 4 * 2 * 4 * 48)
    rng = np.random.default_rng(11)
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=40, s=48, h=4, k=2, dv=8))
    mask = rng.random((2, 48)) > 0.2
    want = None
    for how in ("eager", "graph", "xla"):
        def fn(q, k, v):
            return attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, is_causal=causal,
                implementation="chunked",
            )
        if how != "eager":
            fn = tf.function(fn, jit_compile=how == "xla")
        got = values_and_grads(fn, q, k, v)
        if want is None:
            want = values_and_grads(
                lambda q, k, v: attention_ops.dot_product_attention(
                    q, k, v, attention_mask=mask, is_causal=causal,
                    implementation="dense",
                ), q, k, v,
            )
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5, rtol=1e-5)
    assert dense.chunk_rows(2, 4, 48, 40) == 16


def test_a_causal_chunk_visits_only_the_keys_up_to_its_last_query(monkeypatch):
    seen = []
    weights = dense._weights

    def spy(q, k, *args):
        seen.append(int(k.shape[2]))
        return weights(q, k, *args)

    monkeypatch.setattr(dense, "_weights", spy)
    rng = np.random.default_rng(8)
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=40, s=40, h=2, k=2))
    for causal, want in ((True, [16, 32, 40]), (False, [40, 40, 40])):
        seen.clear()
        dense.chunked_heads(q, k, v, None, causal, 0.3, chunk=16)  # eagerly
        assert seen == want
    # The default chunks: one of all 40 rows; causal, at least four (of the
    # fewest rows, 16, here).
    for causal, want in ((True, [16, 32, 40]), (False, [40])):
        seen.clear()
        dense.chunked_heads(q, k, v, None, causal, 0.3)
        assert seen == want


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_kept_and_recomputed_chunks_give_the_dense_values_and_gradients(
        monkeypatch, graph, causal):
    # 37 queries in chunks of 8 (five, the last padded): none, some or all
    # keep their weights in a graph; the backward pass recomputes only the
    # others.
    rng = np.random.default_rng(11)
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=37, s=37, dv=6))
    mask = expand_mask(tf.constant(mask_of("keys", rng, 2, 37, 37)))
    want = values_and_grads(
        lambda q, k, v: attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask[:, 0, 0], is_causal=causal,
            implementation="dense"),
        q, k, v,
    )
    calls = []
    weights = dense._weights
    monkeypatch.setattr(dense, "_weights", lambda *a, **kw: calls.append(1) or weights(*a, **kw))
    for keep in (0, 2, 5):
        calls.clear()

        def chunked(q, k, v):
            return dense.chunked_heads(q, k, v, mask, causal, 8**-0.5, chunk=8, keep=keep)

        run = tf.function(values_and_grads, autograph=False) if graph else values_and_grads
        got = run(chunked, q, k, v)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5)
        if graph:  # a trace per loop: forward kept, forward, backward
            assert len(calls) == (keep > 0) + 2 * (keep < 5)
        else:  # eagerly none is kept (`tape.jacobian` traces the backward)
            assert len(calls) == 5 + 5


def test_kept_chunks_fit_the_memory_budget(monkeypatch):
    # Batch 2, 4 heads, 256 keys, chunks of 32 rows: 256 KiB of float32
    # weights per chunk, and three chunks' worth of work (768 KiB) first.
    chunk_bytes = 4 * 2 * 4 * 32 * 256

    def kept(budget, t_len=256, causal=False, itemsize=4):
        monkeypatch.setitem(autotune._OPTIONS, "memory_budget", budget)
        return dense.kept_chunks(2, 4, 32, t_len, 256, causal, itemsize)

    assert kept(3 * chunk_bytes) == 0
    assert kept(3 * chunk_bytes + 5 * chunk_bytes) == 5
    assert kept(3 * chunk_bytes + 5 * chunk_bytes - 1) == 4
    assert kept(2**40) == 8
    assert kept(3 * chunk_bytes + 5 * chunk_bytes, itemsize=2) == 8  # bfloat16
    # Causal chunks that skip keys hold 1/8, 2/8, ... of a full chunk.
    assert kept(3 * chunk_bytes + chunk_bytes * (1 + 2 + 3) / 8, causal=True) == 3
    assert dense.kept_chunks(None, 4, 32, 256, 256, False, 4) == 0
    # A timed slice of 64 of 256 queries keeps the share the call would.
    monkeypatch.setitem(autotune._MEASURED_CALL, "rows", 256)
    assert kept(3 * chunk_bytes + 4 * chunk_bytes, t_len=64) == 1
    assert kept(3 * chunk_bytes + 3 * chunk_bytes, t_len=64) == 0


def test_only_a_call_a_tape_records_keeps_weights(monkeypatch):
    # Inference has no backward pass to read them: nothing kept there.
    made = []
    kept_weights = dense._kept_weights
    monkeypatch.setattr(dense, "_kept_weights", lambda *a: made.append(a) or kept_weights(*a))
    q, k, v = (tf.constant(x) for x in random_qkv(np.random.default_rng(3), t=32, s=32))

    def call(q, k, v):
        return dense.chunked_heads(q, k, v, None, False, 0.3, chunk=8)

    tf.function(call)(q, k, v)
    assert made == []
    # A training step: its tape inside the function, as in `fit`.
    tf.function(lambda q, k, v: values_and_grads(call, q, k, v))(q, k, v)
    assert len(made) == 1 and made[0][0] == 4  # all four chunks, in the budget
    # `autotune` timing a training call takes symbolic gradients, no tape.
    monkeypatch.setitem(autotune._MEASURED_CALL, "training", True)
    tf.function(call)(q, k, v)
    assert len(made) == 2


def test_the_graph_loop_runs_one_chunk_at_a_time():
    # TensorFlow's while loop would otherwise start ten iterations at once,
    # ten chunks of scores alive together.
    rng = np.random.default_rng(2)
    q, k, v = (tf.constant(x) for x in random_qkv(rng, t=32, s=32, h=2, k=2, d=8, dv=8))

    @tf.function
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch(q)
            loss = tf.reduce_sum(dense.chunked_heads(q, k, v, None, False, 0.3, chunk=8))
        return tape.gradient(loss, q)

    graph = step.get_concrete_function(q, k, v).graph
    loops = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    for function in graph._functions.values():
        loops += [n for n in function.definition.node_def if n.op in ("While", "StatelessWhile")]
    assert len(loops) >= 2  # the forward and the backward loop
    for op in loops:
        attr = op.get_attr("parallel_iterations") if hasattr(op, "get_attr") else (
            op.attr["parallel_iterations"].i
        )
        assert attr == 1


@pytest.mark.parametrize("keep", [None, 0])
def test_bfloat16_heads_stay_close_to_float32(keep):
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, t=33, s=33, h=2, k=2, d=16, dv=16)
    low = [tf.constant(x, "bfloat16") for x in (q, k, v)]
    got = values_and_grads(
        lambda q, k, v: dense.chunked_heads(q, k, v, None, True, 0.25, chunk=8, keep=keep),
        *low,
    )
    want = values_and_grads(
        lambda q, k, v: dense.chunked_heads(q, k, v, None, True, 0.25, chunk=8),
        *(tf.cast(x, "float32") for x in low),
    )
    assert got[0].dtype == tf.bfloat16
    for a, b in zip(got, want):
        a, b = tf.cast(a, "float32").numpy(), b.numpy()
        assert np.max(np.abs(a - b)) <= 0.05 * max(1.0, np.max(np.abs(b)))


def test_the_layer_takes_the_chunked_path_and_saves_it():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 24, 16)).astype("float32")
    chunked = MultiHeadAttention(num_heads=2, key_dim=8, implementation="chunked")
    out = chunked(x, x, use_causal_mask=True)
    plain = MultiHeadAttention.from_config(
        dict(chunked.get_config(), implementation="dense")
    )
    plain(x, x)
    plain.set_weights(chunked.get_weights())
    np.testing.assert_allclose(
        out.numpy(), plain(x, x, use_causal_mask=True).numpy(), atol=1e-5
    )
    restored = MultiHeadAttention.from_config(chunked.get_config())
    assert restored.implementation == "chunked"


def test_a_model_with_an_unknown_batch_trains_saves_and_loads(tmp_path):
    inputs = keras.Input((24, 16))
    layer = MultiHeadAttention(num_heads=2, key_dim=8, implementation="chunked")
    model = keras.Model(inputs, layer(inputs, inputs))
    model.compile("adam", "mse")
    x = np.random.default_rng(1).normal(size=(4, 24, 16)).astype("float32")
    history = model.fit(x, x, epochs=2, batch_size=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    path = tmp_path / "chunked.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-6)
    assert loaded.layers[-1].implementation == "chunked"


def test_what_the_chunked_path_cannot_do_is_named():
    q, k, v = random_qkv(np.random.default_rng(7))
    with pytest.raises(ValueError, match="return_weights"):
        attention_ops.dot_product_attention(
            q, k, v, implementation="chunked", return_weights=True
        )


def test_a_softmax_told_no_row_is_empty_gives_the_same_weights():
    # The chunked path's causal chunks skip the zeroing pass for rows
    # without keys: under a causal mask alone there are none.
    rng = np.random.default_rng(6)
    scores = rng.normal(size=(2, 3, 7, 9)).astype("float32")
    causal = attention_ops.causal_mask(7, 9)
    for float32 in (True, False):
        got = attention_ops.masked_softmax(scores, causal, float32=float32, empty_rows=False)
        want = attention_ops.masked_softmax(scores, causal, float32=float32)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(got),
                                      keras.ops.convert_to_numpy(want))


def test_an_eager_jacobian_through_the_chunked_path_equals_the_dense_ones():
    # `tape.jacobian` traces the backward pass with a symbolic index:
    # eager chunks kept their weights in an eager TensorArray, which
    # refused it ("Using a symbolic tf.Tensor as a Python bool").
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 5, 6)), "float32")
    jacobians, weights = [], None
    for implementation in ("chunked", "dense"):
        layer = MultiHeadAttention(2, 3, implementation=implementation)
        layer(x)
        if weights is None:
            weights = layer.get_weights()
        layer.set_weights(weights)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, use_causal_mask=True)
        jacobians.append(tape.jacobian(y, x).numpy())
    np.testing.assert_allclose(jacobians[0], jacobians[1], atol=1e-5)


def test_a_causal_chunked_call_on_one_key_trains_in_a_graph():
    # The causal chunks' key gradients were padded to an unknown width: a
    # single key's static length 1 then broadcast the loop's sum to an
    # unknown one, and `tf.while_loop` refused it ("enters the loop with
    # shape (2, 4, 1, 4), but has shape (2, 4, None, 4)").
    for t in (1, 5):
        q, k, v = (tf.constant(x) for x in random_qkv(np.random.default_rng(t), t=t, s=1))

        def run(implementation):
            return lambda q, k, v: attention_ops.dot_product_attention(
                q, k, v, is_causal=True, implementation=implementation
            )

        got = tf.function(lambda q, k, v: values_and_grads(run("chunked"), q, k, v))(q, k, v)
        for g, w in zip(got, values_and_grads(run("dense"), q, k, v)):
            np.testing.assert_allclose(g, w, atol=1e-5)
