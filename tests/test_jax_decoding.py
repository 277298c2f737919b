"""`jit_compile=True` on JAX: the translators' and the causal LM's decoding
loops run under `jax.jit`, give the ids of the loop run op by op, see
weights changed after the first compiled call, and keep a sampler's seed
state advancing as it does without jit."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_attention.applications import CausalLM
from keras_attention.applications import Seq2SeqTranslator
from keras_attention.applications import TransformerTranslator
from keras_attention.applications import TranslationPreprocessor

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="jax.jit of the decoding loops: JAX backend",
)

V = 40


def transformer():
    keras.utils.set_random_seed(0)
    return TransformerTranslator(
        TranslationPreprocessor(source_length=8, target_length=8),
        num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32,
    )


def rnn():
    keras.utils.set_random_seed(0)
    return Seq2SeqTranslator(
        TranslationPreprocessor(source_length=8, target_length=8),
        embedding_dim=8, hidden_dim=16,
    )


def causal_lm():
    keras.utils.set_random_seed(0)
    return CausalLM(vocabulary_size=V, hidden_dim=16, depth=1, num_heads=2,
                    num_key_value_heads=1, mlp_dim=32)


def sources(model, seed=0):
    high = model.preprocessor.source_vocabulary_size
    return np.random.default_rng(seed).integers(4, high, (2, 8)).astype("int32")


def prompts(seed=0):
    return np.random.default_rng(seed).integers(1, V, (2, 5)).astype("int32")


def check_translator_ids(model, **kwargs):
    x = sources(model)
    tokens, weights = model.generate_ids(x, jit_compile=True, **kwargs)
    expected, expected_weights = model.generate_ids(x, jit_compile=False, **kwargs)
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-5)
    return tokens


def scale_weights(model, factor):
    rng = np.random.default_rng(1)
    model.set_weights([
        w * factor + rng.normal(0, 0.5, w.shape).astype(w.dtype)
        if np.issubdtype(w.dtype, np.floating) else w
        for w in model.get_weights()
    ])


@pytest.mark.parametrize("make", [transformer, rnn], ids=["transformer", "rnn"])
@pytest.mark.parametrize("beam_width", [1, 3])
@pytest.mark.parametrize("use_cache", [True, False])
def test_translator_ids_equal_the_loop_without_jit(make, beam_width, use_cache):
    check_translator_ids(make(), beam_width=beam_width, use_cache=use_cache)


@pytest.mark.parametrize("make", [transformer, rnn], ids=["transformer", "rnn"])
def test_translator_jitted_loop_sees_new_weights(make):
    model = make()
    before = check_translator_ids(model, beam_width=2)
    scale_weights(model, 3.0)  # new values, the same variables
    after = check_translator_ids(model, beam_width=2)
    assert not np.array_equal(before, after)  # the test sees the change


@pytest.mark.parametrize("sampler", ["greedy", "top_k", "random"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_causal_lm_ids_equal_the_loop_without_jit(sampler, use_cache):
    model = causal_lm()
    out = {}
    for jit in (True, False):
        keras.utils.set_random_seed(3)
        out[jit] = [
            model.generate(prompts(), 12, sampler=sampler,
                           use_cache=use_cache, jit_compile=jit)
            for _ in range(2)
        ]
    np.testing.assert_array_equal(out[True], out[False])


def test_seeded_sampler_advances_as_without_jit():
    # A given sampler's seed state moves on at each call (keras-hub
    # assigns it after its loop): jit must write it back too.
    model = causal_lm()
    out = {}
    for jit in (True, False):
        sampler = keras_hub.samplers.RandomSampler(seed=7)
        out[jit] = [
            model.generate(prompts(), 16, sampler=sampler, jit_compile=jit)
            for _ in range(3)
        ]
        out[jit, "state"] = keras.ops.convert_to_numpy(sampler.variables[0])
    np.testing.assert_array_equal(out[True], out[False])
    np.testing.assert_array_equal(out[True, "state"], out[False, "state"])
    assert not np.array_equal(out[True][0], out[True][1])  # it advanced


def test_causal_lm_jitted_loop_sees_fit_and_set_weights():
    model = causal_lm()

    def same():
        jit = model.generate(prompts(), 12, jit_compile=True)
        np.testing.assert_array_equal(
            jit, model.generate(prompts(), 12, jit_compile=False)
        )
        return jit

    first = same()
    model.compile(optimizer=keras.optimizers.SGD(5.0), jit_compile=False)
    model.fit(prompts(1), prompts(2), epochs=1, verbose=0)
    after_fit = same()
    scale_weights(model, 3.0)
    after_set = same()
    assert not np.array_equal(first, after_set)
    assert not np.array_equal(after_fit, after_set)


def test_the_loops_run_under_jax_jit(monkeypatch):
    import jax

    jitted, traces = [], []
    real_jit = jax.jit

    def spy_jit(function, **kwargs):
        jitted.append(function)
        return real_jit(function, **kwargs)

    monkeypatch.setattr(jax, "jit", spy_jit)
    model = transformer()
    real_greedy = model._greedy

    def greedy(*args):
        traces.append(args)
        return real_greedy(*args)

    monkeypatch.setattr(model, "_greedy", greedy)
    for _ in range(3):
        model.generate_ids(sources(model), jit_compile=True)
    assert len(jitted) == 1 and len(traces) == 1  # traced once, then reused
    model.generate_ids(sources(model), jit_compile=False)
    assert len(jitted) == 1 and len(traces) == 2  # op by op: not jitted

    lm = causal_lm()
    real_call = lm.call_with_cache
    calls = []

    def call_with_cache(*args):
        calls.append(args)
        return real_call(*args)

    monkeypatch.setattr(lm, "call_with_cache", call_with_cache)
    lm.generate(prompts(), 12, jit_compile=True)
    traced = len(calls)
    lm.generate(prompts(), 12, jit_compile=True)
    assert len(jitted) == 2 and len(calls) == traced
