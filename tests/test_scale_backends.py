"""Long context, the key/value cache, generation, sampled GAT training and
beam search give the same values on every backend: a cross-backend check,
`large` (on TensorFlow alone it repeats test_kv_cache, test_causal_lm and
test_graph_sampling; about 20 s there, 80 s on JAX). Run it with
`KERAS_BACKEND=jax python -m pytest --run-large tests/test_scale_backends.py`
(and `torch`, and without the variable for TensorFlow).

Weights come from a NumPy generator, not Keras's initializers (whose random
numbers differ between backends), so the decoded ids below, recorded on
TensorFlow, are the same weights' ids on every backend. The long-context
chunked layer path is TensorFlow and JAX only (design.md); on torch the same
call keeps the general path, which the test checks by its reason.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from keras import ops  # noqa: E402

from keras_attention.applications import CausalLM  # noqa: E402
from keras_attention.applications import GATNodeClassifier  # noqa: E402
from keras_attention.applications import TransformerTranslator  # noqa: E402
from keras_attention.applications import TranslationPreprocessor  # noqa: E402
from keras_attention.applications import layerwise_predict  # noqa: E402
from keras_attention.applications import sampled_node_dataset  # noqa: E402
from keras_attention.datasets import load_karate_club  # noqa: E402
from keras_attention.layers import MultiHeadAttention  # noqa: E402

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.large


def numpy(x):
    return ops.convert_to_numpy(x)


def numpy_weights(model, seed=0, scale=0.3):
    """Backend-independent weights: every float weight from one generator."""
    rng = np.random.default_rng(seed)
    for w in model.trainable_weights:
        w.assign(rng.normal(0.0, scale, tuple(w.shape)).astype(w.dtype))


def windowed_layer(**kwargs):
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, sliding_window=16, use_causal_mask=True,
        position_encoding="rope", **kwargs,
    )
    layer.build((1, None, 8))
    numpy_weights(layer)
    return layer


# -------------------------------------------------------------- long context


def test_windowed_causal_paths_agree_on_a_long_sequence():
    x = np.random.default_rng(1).normal(size=(1, 768, 8)).astype("float32")
    want = numpy(windowed_layer(implementation="dense")(x))
    for implementation in ("auto", "blocked", "chunked"):
        got = numpy(windowed_layer(implementation=implementation)(x))
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=implementation)
    # The layer-level chunked path, thresholds lowered on one layer.
    layer = windowed_layer()
    layer._long_context_min_length, layer._long_context_chunk = 256, 64
    layer._long_context_query_block = 32
    reason = layer._long_context_reason(x, None, None)
    # TensorFlow and JAX only (design.md): torch keeps the general path.
    assert reason == ("backend" if BACKEND == "torch" else None)
    np.testing.assert_allclose(numpy(layer(x)), want, atol=2e-5)


def test_long_path_gradients_equal_the_dense_ones():
    if BACKEND == "torch":
        pytest.skip("the chunked long-context layer path is TensorFlow and "
                    "JAX only (docs/design.md); torch keeps the general path")
    x = np.random.default_rng(2).normal(size=(1, 96, 8)).astype("float32")
    long, dense = windowed_layer(), windowed_layer(implementation="dense")
    long._long_context_min_length, long._long_context_chunk = 64, 16
    long._long_context_query_block = 8
    assert long._long_context_reason(x, None, None) is None
    upstream = np.random.default_rng(3).normal(size=(1, 96, 8)).astype("float32")
    grads = [_gradients(layer, x, upstream) for layer in (long, dense)]
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, atol=2e-5)


def _gradients(layer, x, upstream):
    """d(sum(layer(x) * upstream)) for x and the layer's weights."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x) * upstream)
        grads = tape.gradient(loss, [x] + layer.trainable_weights)
        return [numpy(g) for g in grads]
    import jax

    weights = layer.trainable_weights

    def loss(x, values):
        mapping = list(zip(weights, values))
        with keras.StatelessScope(state_mapping=mapping):
            return (layer(x) * upstream).sum()

    gx, gw = jax.grad(loss, argnums=(0, 1))(x, [w.value for w in weights])
    return [numpy(g) for g in [gx] + list(gw)]


# ------------------------------------------------------------ the kv cache


def test_ring_cache_decoding_equals_the_full_causal_forward():
    layer = windowed_layer()
    x = np.random.default_rng(4).normal(size=(2, 40, 8)).astype("float32")
    want = numpy(layer(x))
    cache = np.zeros((2, 2, 16, 2, 4), "float32")  # a ring of the window
    out, cache = layer(x[:, :20], cache=cache, cache_update_index=0)
    got = [numpy(out)]
    for i in range(20, 40):
        out, cache = layer(x[:, i:i + 1], cache=cache, cache_update_index=i)
        got.append(numpy(out))
    np.testing.assert_allclose(np.concatenate(got, 1), want, atol=2e-5)
    assert tuple(cache.shape) == (2, 2, 16, 2, 4)
    with pytest.raises(ValueError, match="`cache`, expected a tensor"):
        layer(x[:, :1], cache=np.zeros((2, 2, 16, 3, 4), "float32"),
              cache_update_index=0)


# ------------------------------------------------------------- causal LM

PROMPTS = np.array([[5, 9, 3, 0], [7, 2, 11, 4]], "int32")  # one right-padded
GREEDY = [[5, 9, 3, 13, 16, 13, 16, 13, 16, 13],
          [7, 2, 11, 4, 16, 13, 16, 13, 16, 13]]


@pytest.fixture(scope="module")
def causal_lm():
    keras.utils.set_random_seed(0)
    model = CausalLM(vocabulary_size=20, hidden_dim=8, depth=2, num_heads=2,
                     num_key_value_heads=1, mlp_dim=16, sliding_window=4)
    model(PROMPTS)
    numpy_weights(model, scale=0.5)
    return model


def test_generate_greedy_cached_uncached_and_compiled(causal_lm):
    for use_cache, jit_compile in ((True, False), (False, False), (True, True)):
        got = causal_lm.generate(PROMPTS, max_length=10, use_cache=use_cache,
                                 jit_compile=jit_compile)
        np.testing.assert_array_equal(got, GREEDY, err_msg=str(use_cache))


def test_generate_stop_tokens_sampling_and_keras_file(causal_lm, tmp_path):
    stop = GREEDY[0][3]
    got = causal_lm.generate(PROMPTS, max_length=10, stop_token_ids=[stop],
                             jit_compile=False)
    np.testing.assert_array_equal(got[0], GREEDY[0][:4] + [0] * 6)
    keras.utils.set_random_seed(5)
    first = causal_lm.generate(PROMPTS, 10, sampler="top_k", jit_compile=False)
    keras.utils.set_random_seed(5)
    again = causal_lm.generate(PROMPTS, 10, sampler="top_k", jit_compile=False)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first[:, :3], PROMPTS[:, :3])
    path = str(tmp_path / "lm.keras")
    causal_lm.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(numpy(loaded(PROMPTS)), numpy(causal_lm(PROMPTS)),
                               atol=1e-6)
    np.testing.assert_array_equal(
        loaded.generate(PROMPTS, max_length=10, jit_compile=False), GREEDY
    )


# ------------------------------------------------------ sampled GAT training


def test_sampled_gat_fit_evaluate_predict_on_the_karate_club():
    graph = load_karate_club()
    keras.utils.set_random_seed(0)
    model = GATNodeClassifier(num_features=graph.features.shape[1],
                              num_classes=2, hidden_units=4, num_heads=2,
                              dropout=0.0)
    model.compile(jit_compile=False)
    train = sampled_node_dataset(graph, graph.train_mask, [3, 3], batch_size=4)
    history = model.fit(train, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    numpy_weights(model, seed=1)
    test = np.flatnonzero(~graph.train_mask)
    data = sampled_node_dataset(graph, test, [3, 3], batch_size=8,
                                shuffle=False, seed=2)
    result = model.evaluate(data, verbose=0, return_dict=True)
    logits = numpy(model.predict(data, verbose=0))
    correct = total = 0
    for (inputs, labels, weights), rows in zip(data, logits):
        seeds = numpy(weights)[0] > 0
        correct += int((rows[seeds].argmax(-1) == numpy(labels)[0][seeds]).sum())
        total += int(seeds.sum())
    assert total == len(test)
    assert result["accuracy"] == pytest.approx(correct / total, abs=1e-6)
    full = numpy(model([graph.features[None], graph.edges[None]]))[0]
    np.testing.assert_allclose(
        layerwise_predict(model, graph.features, graph.edges, 10), full,
        atol=1e-5,
    )
    np.testing.assert_allclose(full[:3], KARATE_LOGITS, atol=1e-4)


KARATE_LOGITS = [[-0.4108, -0.0004], [-0.4057, 0.0041], [-0.4216, -0.0178]]


# ------------------------------------------------------------- translators

WORDS = ["abc", "hgfe", "dd"]
BEAM_IDS = [[103, 103, 20, 103, 103, 103], [103, 103, 20, 20, 20, 20],
            [103, 103, 20, 103, 103, 103]]


def test_translator_beam_search_with_and_without_cache():
    keras.utils.set_random_seed(0)
    model = TransformerTranslator(
        TranslationPreprocessor(source_length=6, target_length=6),
        num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=16,
        dropout=0.0,
    )
    inputs, _ = model.prepare(WORDS, WORDS)
    source = inputs["source_ids"]
    model(inputs)
    numpy_weights(model, scale=0.5)
    results = {}
    for beam_width in (1, 3):
        for use_cache in (True, False):
            ids = model.generate_ids(source, beam_width=beam_width,
                                     use_cache=use_cache, jit_compile=False)
            ids = ids[0] if isinstance(ids, tuple) else ids
            results[beam_width, use_cache] = numpy(ids).tolist()
        assert results[beam_width, True] == results[beam_width, False]
    assert results[3, True] == BEAM_IDS
    assert len(model.translate(WORDS, beam_width=3, jit_compile=False)) == 3
