"""Text generation as a user drives it: the translators' searches never
write padding or `[START]` mid-sentence, and `CausalLM.generate` takes
keras-hub's samplers (beam search too), seeds, NumPy lengths and refuses
settings keras-hub would only fail on inside the loop."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_attention.applications import CausalLM
from keras_attention.applications import TransformerTranslator
from keras_attention.applications import TranslationPreprocessor

SOURCES = ["abc", "hgfe", "a", "dcbabcd"]


def untrained_translator():
    # The grouped-query model of test_translator_recorded: untrained, its
    # argmax was padding or [START] in every row.
    keras.utils.set_random_seed(7)
    preprocessor = TranslationPreprocessor(source_length=8, target_length=8)
    return TransformerTranslator(
        preprocessor, num_layers=2, hidden_dim=16, num_heads=2,
        intermediate_dim=32, dropout=0.0,
        attention_kwargs={"num_key_value_heads": 1},
    )


def before_end(row, end_id):
    row = list(row)
    return row[: row.index(end_id)] if end_id in row else row


@pytest.mark.parametrize("beam_width", [1, 3])
def test_translator_search_never_writes_padding_or_start(beam_width):
    # Before: greedy gave [[2, 2, 5, ...], ..., [0, 78, 27, ...]]: [START]
    # and padding mid-translation; a generated pad is hidden from the
    # uncached decoder (a padding key) but not from the cached one, so the
    # two searches disagreed from there on.
    model = untrained_translator()
    p = model.preprocessor
    source_ids = p.encode_sources(SOURCES)
    ids, weights = model.generate_ids(
        source_ids, beam_width=beam_width, search="beam", jit_compile=False
    )
    for row in ids:
        assert not np.isin(before_end(row, p.end_id), (p.pad_id, p.start_id)).any()
    uncached, uncached_weights = model.generate_ids(
        source_ids, beam_width=beam_width, search="beam", use_cache=False,
        jit_compile=False,
    )
    np.testing.assert_array_equal(uncached, ids)
    np.testing.assert_allclose(uncached_weights, weights, atol=1e-5)


def test_greedy_translation_is_the_argmax_over_the_allowed_ids():
    model = untrained_translator()
    p = model.preprocessor
    source_ids = p.encode_sources(SOURCES)
    ids, _ = model.generate_ids(source_ids, jit_compile=False)
    # Teacher-forced: the decoder's inputs are [START] and the ids so far.
    inputs = np.concatenate(
        [np.full((len(ids), 1), p.start_id, "int32"), ids[:, :-1]], axis=1
    )
    logits, _ = model.decode_sequence(inputs, model.encode(source_ids))
    logits = np.array(keras.ops.convert_to_numpy(logits))
    logits[..., [p.pad_id, p.start_id]] = -np.inf
    for row, row_logits in zip(ids, logits):
        written = before_end(row, p.end_id)
        expected = np.argmax(row_logits, -1)[: len(written) + 1]
        np.testing.assert_array_equal(row[: len(expected)], expected)


V = 8


def untrained_lm():
    # Seed 0's greedy continuation of row 1 was [6, 3, 0, 3, 1, ...]: the
    # padding id mid-text, which `decode` drops and a stop token's padding
    # cannot be told from.
    keras.utils.set_random_seed(0)
    model = CausalLM(vocabulary_size=V, hidden_dim=8, depth=1, num_heads=2)
    prompts = np.random.default_rng(0).integers(1, V, (2, 3)).astype("int32")
    return model, prompts


@pytest.mark.parametrize(
    "sampler", ["greedy", keras_hub.samplers.BeamSampler(num_beams=2)]
)
def test_causal_lm_never_generates_the_padding_id(sampler):
    model, prompts = untrained_lm()
    out = model.generate(prompts, max_length=10, sampler=sampler,
                         jit_compile=False)
    assert (out[:, 3:] != 0).all()
    # Still the most likely id other than padding.
    logits = np.array(keras.ops.convert_to_numpy(model(out)))
    if sampler == "greedy":
        logits[..., 0] = -np.inf
        np.testing.assert_array_equal(np.argmax(logits[:, 2:-1], -1), out[:, 3:])


def test_beam_sampler_decodes_through_the_cache():
    # Before: the cached step sliced B rows of the B * num_beams the beam
    # sampler passes, and the cache check refused the call.
    model, prompts = untrained_lm()
    greedy = model.generate(prompts, max_length=8, jit_compile=False)
    one_beam = model.generate(
        prompts, max_length=8, jit_compile=False,
        sampler=keras_hub.samplers.BeamSampler(num_beams=1),
    )
    np.testing.assert_array_equal(one_beam, greedy)
    beams = keras_hub.samplers.BeamSampler(num_beams=3)
    cached = model.generate(prompts, max_length=8, sampler=beams,
                            jit_compile=False)
    recomputed = model.generate(prompts, max_length=8, sampler=beams,
                                use_cache=False, jit_compile=False)
    np.testing.assert_array_equal(cached, recomputed)


@pytest.mark.parametrize(
    "sampler, match",
    [
        # Before: a raw TensorFlow TopKV2 error ("at least k columns").
        (keras_hub.samplers.TopKSampler(k=V + 1), rf"k in \[1, vocabulary_size={V}\]"),
        # Before: a raw gather error (top-k), or NaN probabilities whose
        # argmax wrote arbitrary ids, padding included (greedy).
        (keras_hub.samplers.TopKSampler(k=2, temperature=0), "temperature"),
        (keras_hub.samplers.GreedySampler(temperature=0), "temperature"),
        (keras_hub.samplers.RandomSampler(temperature=-1.0), "temperature"),
        # Before: keras-hub's "requires passing a `hidden_states`".
        (keras_hub.samplers.ContrastiveSampler(), "ContrastiveSampler"),
        # Before: a tuple NumPy could not convert.
        (keras_hub.samplers.BeamSampler(return_all_beams=True), "return_all_beams"),
        # Before: "Cannot convert 2.5 to EagerTensor"; p out of (0, 1]
        # ran silently (as greedy, or over every id).
        (keras_hub.samplers.TopKSampler(k=2.5), "an integer k"),
        (keras_hub.samplers.TopPSampler(p=0.0), r"p in \(0, 1\]"),
        (keras_hub.samplers.TopPSampler(p=1.5), r"p in \(0, 1\]"),
    ],
)
def test_sampler_settings_are_refused_before_decoding(sampler, match):
    model, prompts = untrained_lm()
    with pytest.raises(ValueError, match=rf"`sampler`.*{match}"):
        model.generate(prompts, max_length=6, sampler=sampler, jit_compile=False)


def test_a_named_sampler_is_checked_with_keras_hubs_defaults():
    # "top_k" is k=5: a vocabulary of 4 failed deep in TensorFlow's TopKV2.
    keras.utils.set_random_seed(0)
    model = CausalLM(vocabulary_size=4, hidden_dim=8, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"`sampler`.*'top_k', keras-hub's TopKSampler\(k=5\)"):
        model.generate([[1, 2]], max_length=5, sampler="top_k", jit_compile=False)


class _Forbid(keras_hub.samplers.GreedySampler):
    """keras-hub's own example of a custom sampler: greedy, some ids banned."""

    def __init__(self, forbidden_tokens, **kwargs):
        super().__init__(**kwargs)
        self.forbidden_tokens = forbidden_tokens

    def get_next_token(self, probabilities):
        ids = keras.ops.arange(keras.ops.shape(probabilities)[-1])
        banned = keras.ops.any(keras.ops.equal(
            ids[:, None], keras.ops.convert_to_tensor(self.forbidden_tokens)[None, :]
        ), axis=1)
        return keras.ops.argmax(
            keras.ops.where(banned[None, :], -1.0, probabilities), axis=-1
        )


def test_a_sampler_class_of_the_users_runs_as_given():
    # Rebuilt from keras-hub's `get_config` before: its own settings were
    # dropped (the banned ids written), a required argument failed in
    # `from_config`, and a class redefined under one name kept the old one.
    model, prompts = untrained_lm()
    greedy = model.generate(prompts, max_length=10, jit_compile=False)
    banned = sorted(set(greedy[:, 3:].ravel().tolist()))[:2]
    for jit_compile in (False, True):
        out = model.generate(prompts, max_length=10, jit_compile=jit_compile,
                             sampler=_Forbid(banned))
        assert not np.isin(out[:, 3:], banned).any()
        assert (out[:, 3:] != 0).all()

    class Always(keras_hub.samplers.GreedySampler):
        def get_next_token(self, probabilities):
            return keras.ops.full(keras.ops.shape(probabilities)[:1], 1, "int32")

    first = model.generate(prompts, max_length=6, sampler=Always(), jit_compile=False)
    assert (first[:, 3:] == 1).all()

    class Always(keras_hub.samplers.GreedySampler):  # noqa: F811 - a notebook's re-run
        def get_next_token(self, probabilities):
            return keras.ops.full(keras.ops.shape(probabilities)[:1], 2, "int32")

    again = model.generate(prompts, max_length=6, sampler=Always(), jit_compile=False)
    assert (again[:, 3:] == 2).all()


@pytest.mark.parametrize("stop", [[0], [], [V], [1.5], [True]])
def test_stop_token_ids_outside_the_vocabulary_or_padding_are_refused(stop):
    # [0] ended every row at once (keras-hub read the unwritten slots as
    # stops), [] failed with "tuple index out of range".
    model, prompts = untrained_lm()
    with pytest.raises(ValueError, match=r"`stop_token_ids`.*\[1, vocabulary_size=8\)"):
        model.generate(prompts, max_length=6, stop_token_ids=stop, jit_compile=False)


def test_max_length_takes_numpy_integers():
    # Before: "expected an integer ... Received: max_length=np.int64(6)",
    # though the translators take NumPy's integers.
    model, prompts = untrained_lm()
    want = model.generate(prompts, max_length=6, jit_compile=False)
    got = model.generate(prompts, max_length=np.int64(6), jit_compile=False)
    np.testing.assert_array_equal(got, want)
    for bad in (-3, 3, 6.0, True):
        with pytest.raises(ValueError, match="max_length"):
            model.generate(prompts, max_length=bad, jit_compile=False)


def test_named_samplers_follow_keras_set_random_seed():
    # Before: the named sampler was made once per model, its seed drawn
    # then: `set_random_seed` before `generate` did not repeat the text.
    model, prompts = untrained_lm()
    runs = []
    for _ in range(2):
        keras.utils.set_random_seed(3)
        runs.append([
            model.generate(prompts, max_length=12, sampler="top_k",
                           jit_compile=False)
            for _ in range(2)
        ])
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert (runs[0][0] != runs[0][1]).any()  # a new stream per call
    assert (np.concatenate(runs[0])[:, 3:] != 0).all()


def test_left_and_right_padded_prompts_continue_as_ragged_rows():
    # Before: a padded (B, P) batch was read as P ids a row, the zeros as
    # tokens: [5, 6, 7, 0, 0] continued after the padding.
    model, _ = untrained_lm()
    rows = [np.array([5, 6, 7]), np.array([1, 2, 3, 4, 5])]
    want = model.generate(rows, max_length=8, jit_compile=False)
    right = np.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 5]], "int32")
    left = np.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]], "int32")
    for padded in (right, left):
        got = model.generate(padded, max_length=8, jit_compile=False)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="`prompt_ids`.*other than the padding"):
        model.generate([[1, 2], [0, 0]], max_length=8, jit_compile=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        # Before: ZeroDivisionError from the schedule's steps.
        (dict(batch_size=0), "`batch_size`"),
        # Before: no training at all (0 epochs), or gradient ascent.
        (dict(epochs=0), "`epochs`"),
        (dict(learning_rate=-1e-3), "`learning_rate`"),
        (dict(learning_rate=float("nan")), "`learning_rate`"),
    ],
)
def test_fit_causal_lm_refuses_bad_settings(kwargs, match):
    from keras_attention.applications import CausalLMPreprocessor
    from keras_attention.training import date_completion_accuracy
    from keras_attention.training import fit_causal_lm

    model = CausalLM(preprocessor=CausalLMPreprocessor(), hidden_dim=8,
                     depth=1, num_heads=2)
    with pytest.raises(ValueError, match=match):
        fit_causal_lm(model, "1 may 2000 = 2000-05-01\n" * 4,
                      sequence_length=8, **kwargs)
    # Before: AttributeError "'NoneType' object has no attribute 'sequences'".
    with pytest.raises(ValueError, match="`preprocessor`"):
        fit_causal_lm(untrained_lm()[0], "abcdefgh" * 4, sequence_length=8)
    # Before: range()'s "arg 3 must not be zero".
    with pytest.raises(ValueError, match="`batch_size`"):
        date_completion_accuracy(model, "1 may 2000 = 2000-05-01", batch_size=0)
