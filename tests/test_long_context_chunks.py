"""`MultiHeadAttention`'s chunked long-context path (`_multi_head_long.py`):
windowed self-attention computed chunk by chunk, projections included, with
a backward loop that recomputes each chunk. It must equal the general path
(`implementation="dense"`, same window) in the output and in the gradients
for the input and every weight, and be taken exactly when it applies.

Small sequences with small chunks: a layer's `_long_context_chunk` and
`_long_context_min_length` are set on the instance. Runs on TensorFlow and
JAX (`KERAS_BACKEND=jax python -m pytest tests/test_long_context_chunks.py`).
"""

import keras
import numpy as np
import pytest

from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import _multi_head_long
from tests import harness

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.skipif(
    BACKEND not in ("tensorflow", "jax"),
    reason="the chunked long-context path runs on TensorFlow and JAX only "
    "(`_long_context_reason` is 'backend' elsewhere)",
)


def make_pair(t, window, chunk, causal=True, dim=16, batch=2, query_block=None,
              **kwargs):
    """The same layer twice, equal weights: chunked ("auto") and dense."""
    config = dict(
        num_heads=4, key_dim=8, sliding_window=window, use_causal_mask=causal,
        **kwargs,
    )
    chunked = MultiHeadAttention(implementation="auto", **config)
    dense = MultiHeadAttention(implementation="dense", **config)
    x = np.random.default_rng(t + window).standard_normal((batch, t, dim))
    x = x.astype("float32")
    chunked(x[:, :4])
    dense(x[:, :4])
    rng = np.random.default_rng(chunk)
    weights = [
        (0.3 * rng.standard_normal(w.shape)).astype("float32")
        for w in chunked.weights
    ]
    chunked.set_weights(weights)
    dense.set_weights(weights)
    chunked._long_context_chunk = chunk
    chunked._long_context_query_block = query_block or chunk
    chunked._long_context_min_length = 0
    return chunked, dense, x


def values_and_grads(layer, x, jit):
    """The output and the gradients of a row-weighted loss for `x` and the
    trainable weights (every row's gradient differs)."""

    def fn(x):
        out = keras.ops.cast(layer(x), "float32")
        rows = keras.ops.arange(1.0, 1.0 + out.shape[1])[None, :, None]
        return out, keras.ops.mean(out ** 2 * rows + keras.ops.sin(out))

    return harness.values_and_grads(
        fn, x, variables=layer.trainable_variables, jit=jit
    )


def assert_same(chunked, dense, x, jit):
    got = values_and_grads(chunked, x, jit)
    want = values_and_grads(dense, x, jit)
    assert len(got) == len(want) == 2 + len(dense.trainable_weights)
    for name, g, w in zip(["output", "x"] + [v.path for v in dense.trainable_weights],
                          got, want):
        # atol: with a one-key window the query and key kernels' gradients
        # are zero but for rounding (5e-6 of it is seen).
        np.testing.assert_allclose(g, w, atol=3e-5, rtol=1e-4, err_msg=name)


# Every shape eagerly; under XLA the shapes that exercise the most of the
# loop (padding, only the diagonal, a window wider than a chunk, a query
# block not dividing its chunk); the other XLA compiles (about 5 s each)
# run with `--run-large`.
SHAPES = [
    (64, 8, 16, None, True),
    (64, 8, 16, None, False),
    (70, 20, 16, None, True),   # T not a multiple of the chunk
    (70, 20, 16, 4, False),
    (50, 30, 16, None, False),  # the band reaches past both ends
    (96, 1, 32, 8, True),       # only the diagonal
    (40, 16, 64, None, True),   # one chunk longer than T
    (100, 12, 32, 8, True),     # query blocks inside the chunks
    (100, 12, 32, 8, False),
    (90, 40, 32, 4, True),      # a window wider than a chunk
    (64, 10, 16, 5, True),      # a block not dividing the chunk
]
XLA_SHAPES = {2, 5, 9, 10}


@pytest.mark.parametrize(
    "t, window, chunk, query_block, causal, jit",
    [shape + (False,) for shape in SHAPES]
    + [
        pytest.param(*shape, True,
                     marks=() if i in XLA_SHAPES else pytest.mark.large)
        for i, shape in enumerate(SHAPES)
    ],
)
def test_chunked_equals_dense(t, window, chunk, query_block, causal, jit):
    chunked, dense, x = make_pair(t, window, chunk, causal, query_block=query_block)
    assert chunked._long_context_reason(x, None, None) is None
    assert_same(chunked, dense, x, jit)


OPTIONS = [
    dict(position_encoding="rope"),
    dict(position_encoding="alibi"),
    dict(num_key_value_heads=2),
    dict(num_key_value_heads=1, position_encoding="rope"),
    dict(use_gate=True),
    dict(output_shape=(6,), use_bias=False),
    dict(value_dim=4),
]
XLA_OPTIONS = {0, 1, 3}  # the positions, added inside the loop's steps


@pytest.mark.parametrize(
    "options, causal, jit",
    [(o, causal, False) for o in OPTIONS for causal in (True, False)]
    + [
        pytest.param(o, True, True,
                     marks=() if i in XLA_OPTIONS else pytest.mark.large)
        for i, o in enumerate(OPTIONS)
    ],
)
def test_chunked_options_equal_dense(options, causal, jit):
    # Every option eagerly both ways; the causal ones compiled (XLA) too,
    # those with position encodings in CI, the rest with `--run-large`.
    chunked, dense, x = make_pair(72, 12, 16, causal, query_block=8, **options)
    assert chunked._long_context_reason(x, None, None) is None
    assert_same(chunked, dense, x, jit=jit)


def test_chunked_inference_and_lora_equal_dense():
    chunked, dense, x = make_pair(48, 10, 16)
    np.testing.assert_allclose(chunked(x), dense(x), atol=1e-5)
    for layer in (chunked, dense):
        layer.enable_lora(2)
    rng = np.random.default_rng(3)
    for a, b in zip(chunked.trainable_weights, dense.trainable_weights):
        value = (0.2 * rng.standard_normal(a.shape)).astype("float32")
        a.assign(value)
        b.assign(value)
    assert_same(chunked, dense, x, jit=False)


def test_path_is_taken_exactly_when_it_applies(monkeypatch):
    calls = []
    original = _multi_head_long.long_self_attention

    def spy(layer, x, causal, chunk, query_block):
        calls.append((tuple(x.shape), causal, chunk))
        return original(layer, x, causal, chunk, query_block)

    monkeypatch.setattr(_multi_head_long, "long_self_attention", spy)
    chunked, dense, x = make_pair(64, 8, 16)
    chunked(x)
    assert calls == [((2, 64, 16), True, 16)]
    tensor = keras.ops.convert_to_tensor(x)
    chunked(tensor, tensor)  # the same tensor as value: self-attention
    chunked([x])
    assert len(calls) == 3
    chunked(x, x)  # two arrays, two tensors: taken as cross-attention
    dense(x)  # implementation="dense"
    chunked(x, x[:, ::-1])  # cross-attention
    chunked(x, attention_mask=np.ones((2, 64, 64), bool))
    chunked(x, query_mask=np.ones((2, 64), bool))
    assert len(calls) == 3
    reason = chunked._long_context_reason
    assert reason(x, x[:, :3], None) == "not self-attention"
    assert reason(x, None, None, masks=(None, np.ones((2, 64), bool))) == "a mask"
    assert reason(x, None, None, return_attention_scores=True) == (
        "return_attention_scores"
    )
    assert dense._long_context_reason(x, None, None) == "implementation"
    chunked._long_context_min_length = 65
    assert reason(x, None, None) == "short"
    chunked._long_context_min_length = 0
    chunked._long_context_chunk = 3  # a window of 8 spans over 2 chunks
    assert reason(x, None, None) == "window over 2 chunks"
    # The chunked path projects past `EinsumDense.__call__`, which adds
    # the activity losses.
    chunked._long_context_chunk = 16
    chunked._activity_regularizer = keras.regularizers.L1(1.0)
    assert reason(x, None, None) == "activity_regularizer"


def test_defaults_keep_short_sequences_on_the_general_path():
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, sliding_window=8, use_causal_mask=True
    )
    x = np.zeros((1, 64, 8), "float32")
    layer(x)
    assert layer._long_context_chunk == _multi_head_long.LONG_CONTEXT_CHUNK == 512
    assert layer._long_context_query_block == 256
    assert layer._long_context_min_length == 8192
    assert layer._long_context_reason(x, None, None) == "short"
    unwindowed = MultiHeadAttention(num_heads=2, key_dim=4)
    unwindowed(x)
    assert unwindowed._long_context_reason(x, None, None) == "no sliding_window"
    # "blocked" asks for the blocked core around the projections: the
    # general path, whatever the length.
    blocked = MultiHeadAttention(
        num_heads=2, key_dim=4, sliding_window=8, use_causal_mask=True,
        implementation="blocked",
    )
    blocked(x)
    blocked._long_context_min_length = 16
    assert blocked._long_context_reason(x, None, None) == "implementation"


def test_dropout_and_subclass_keep_the_general_path():
    chunked, _, x = make_pair(32, 8, 16, dropout=0.5)
    assert chunked._long_context_reason(x, None, None, training=True) == "dropout"
    assert chunked._long_context_reason(x, None, None, training=False) is None

    class Custom(MultiHeadAttention):
        def _compute_attention(self, query, key, value, attention_mask=None,
                               training=None, return_attention_scores=False):
            return super()._compute_attention(
                query, key, value, attention_mask, training,
                return_attention_scores,
            )

    layer = Custom(num_heads=2, key_dim=4, sliding_window=4, use_causal_mask=True)
    layer._long_context_min_length = 0
    calls = []
    layer._long_context_call = lambda *a: calls.append(a)
    out = layer(x[:, :, :8])
    assert calls == [] and tuple(out.shape) == (2, 32, 8)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "bfloat16"])
def test_chunked_bfloat16_close_to_dense(policy):
    chunked, dense, x = make_pair(64, 8, 16, dtype=policy)
    got = values_and_grads(chunked, x, jit=True)
    want = values_and_grads(dense, x, jit=True)
    names = ["output", "x"] + [v.path for v in dense.trainable_weights]
    for name, g, w in zip(names, got, want):
        if name.endswith("key/bias"):
            continue  # its gradient is zero up to rounding (softmax shift)
        scale = np.abs(w).max()
        assert np.abs(g - w).max() <= 0.05 * scale, name


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's memory analysis via JAX")
def test_chunked_backward_keeps_no_length_sized_projection():
    """XLA's buffer plan of forward + backward at T = 4,096: besides the
    input and `dx`, the chunked path's temporaries hold about one `(T, dim)`
    tensor (the output, whose gradient becomes `dx`); the general path's hold
    q, k, v, their gradients and more."""
    import jax
    import jax.numpy as jnp

    length, dim = 4096, 64
    chunked, _, x = make_pair(length, 16, 64, dim=dim, batch=1)
    general = MultiHeadAttention.from_config(chunked.get_config())
    general(x[:, :4])
    general.set_weights(chunked.get_weights())
    general._long_context_min_length = 10**9
    tensors = {}
    for name, layer in (("chunked", chunked), ("general", general)):
        trainable = [v.value for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]

        def loss(x, trainable, layer=layer, fixed=fixed):
            out, _ = layer.stateless_call(trainable, fixed, x)
            return jnp.mean(out ** 2)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(
            jnp.asarray(x), trainable
        ).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        tensors[name] = temp / (length * dim * 4)
    assert tensors["chunked"] < 1.5, tensors
    assert tensors["general"] > 4, tensors


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a TensorFlow graph")
def test_chunked_in_a_graph_with_an_unknown_batch_size():
    import tensorflow as tf

    chunked, dense, x = make_pair(70, 12, 16, query_block=8)

    def grads(layer):
        @tf.function(input_signature=[tf.TensorSpec([None, 70, 16], tf.float32)])
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = layer(x)
                loss = tf.reduce_mean(out ** 2)
            return [out] + tape.gradient(loss, [x] + layer.trainable_weights)

        return step(tf.constant(x))

    for got, want in zip(grads(chunked), grads(dense)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    model = keras.Sequential([keras.Input((70, 16)), chunked])
    model.compile("sgd", "mse")
    history = model.fit(x, np.zeros_like(x), epochs=1, verbose=0, batch_size=2)
    assert np.isfinite(history.history["loss"][0])


def test_quantized_projections_keep_the_general_path():
    chunked, _, x = make_pair(48, 8, 16, use_gate=True)
    model = keras.Sequential([keras.Input((48, 16)), chunked])
    model.quantize("int8")
    assert chunked._long_context_reason(x, None, None) == "quantized"
    assert tuple(model(x).shape) == (2, 48, 16)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's tapes")
def test_second_order_gradients_equal_the_dense_layers():
    # A Hessian-vector product and a gradient penalty through the
    # chunked projections' own backward pass (its blocks written with
    # `ops.slice_update`, its loops differentiated again), in a
    # `tf.function`. (Under `jit_compile=True` XLA refuses the gradient
    # of the backward's own per-chunk gradient inside its loop: a
    # reduction's shape computed at run time, "must be a compile-time
    # constant".)
    import tensorflow as tf

    chunked, dense, x = make_pair(20, 3, 8)
    x = tf.constant(x)
    direction = tf.constant(np.random.default_rng(2).standard_normal(x.shape),
                            "float32")

    def second_order(layer, x):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                out = layer(x)
                loss = tf.reduce_sum(out * tf.cos(out))
            d_x = inner.gradient(loss, x)
            along = tf.reduce_sum(d_x * direction)
            penalty = tf.reduce_sum(d_x**2)
        return [outer.gradient(along, x)] + outer.gradient(
            penalty, layer.trainable_variables
        )

    got = tf.function(second_order)(chunked, x)
    want = second_order(dense, x)
    # Rounding scales with the largest gradient (a key bias's is zero).
    scale = max(float(np.max(np.abs(b))) for b in want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4,
                                   atol=2e-6 * scale)
