"""CausalLM: cached generation equals recomputing the prefix, the cached
step equals the full causal forward, presets, .keras files, attention maps,
training and bad arguments."""

import os
import sys

import keras
import keras_hub
import numpy as np
import pytest

from keras_attention import training
from keras_attention import visualization
from keras_attention.applications import CausalLM
from keras_attention.applications import CausalLMBackbone
from keras_attention.applications import CausalLMPreprocessor
from keras_attention.applications import presets
from keras_attention.datasets import load_text_corpus

V = 40


def tiny(**kwargs):
    keras.utils.set_random_seed(0)
    config = dict(vocabulary_size=V, hidden_dim=16, depth=2, num_heads=4,
                  num_key_value_heads=2, mlp_dim=32)
    config.update(kwargs)
    return CausalLM(**config)


def ids(batch=2, length=12, seed=0):
    return np.random.default_rng(seed).integers(1, V, (batch, length)).astype("int32")


def numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"sliding_window": 4},  # a ring cache of 4 entries
        {"position_encoding": "alibi", "num_key_value_heads": None},
        # ALiBi's ring: its slots put in position order for the core
        {"position_encoding": "alibi", "sliding_window": 4},
        {"tie_weights": False, "sliding_window": 20},  # window > length
    ],
)
def test_cached_steps_give_the_logits_of_the_full_causal_forward(options):
    model, x = tiny(**options), ids()
    want = numpy(model(x))
    cache = model.backbone.empty_cache(2, x.shape[1])
    got, cache = model.call_with_cache(x[:, :5], cache, 0)
    got = [numpy(got)]
    for i in range(5, x.shape[1]):
        logits, cache = model.call_with_cache(x[:, i:i + 1], cache, i)
        got.append(numpy(logits))
    np.testing.assert_allclose(np.concatenate(got, 1), want, atol=1e-5)
    window = options.get("sliding_window")
    size = x.shape[1] if window is None else min(window, x.shape[1])
    assert tuple(cache[0].shape) == (2, 2, size, model.backbone.blocks[0]
                                     .attention_layer.kv_heads, 4)


@pytest.mark.parametrize("window, encoding", [(None, "rope"), (3, "rope"), (3, "alibi")])
def test_cached_generation_gives_the_tokens_of_recomputing_the_prefix(window, encoding):
    model = tiny(sliding_window=window, position_encoding=encoding)
    prompts = [ids(1, 3, seed=1)[0], ids(1, 6, seed=2)[0]]  # ragged
    cached = model.generate(prompts, max_length=24)
    recomputed = model.generate(prompts, max_length=24, use_cache=False)
    np.testing.assert_array_equal(cached, recomputed)
    assert cached.shape == (2, 24)
    np.testing.assert_array_equal(cached[1, :6], prompts[1])
    # Eager keras.ops loop, same tokens.
    eager = model.generate(prompts, max_length=24, jit_compile=False)
    np.testing.assert_array_equal(eager, cached)
    # And the greedy tokens are the argmax of the full forward.
    logits = numpy(model(cached))
    np.testing.assert_array_equal(
        np.argmax(logits[0, 2:-1], -1), cached[0, 3:]
    )


def test_samplers_stop_tokens_and_one_prompt():
    model = tiny()
    prompt = ids(1, 4)[0]
    # Eager loops: one XLA compilation per sampler is slow on a busy CPU.
    for sampler in ("top_k", "top_p", keras_hub.samplers.TopKSampler(k=3, seed=1)):
        out = model.generate(prompt, max_length=10, sampler=sampler,
                             jit_compile=False)
        assert out.shape == (10,)
        np.testing.assert_array_equal(out[:4], prompt)
        assert out.min() >= 0 and out.max() < V
    greedy = model.generate(prompt, max_length=10)
    stop = int(greedy[5])
    stopped = model.generate(prompt, max_length=10, stop_token_ids=[stop],
                             jit_compile=False)
    first = 4 + int(np.flatnonzero(greedy[4:] == stop)[0])
    np.testing.assert_array_equal(stopped[:first + 1], greedy[:first + 1])
    assert not stopped[first + 1:].any()


def test_keras_file_round_trip_keeps_outputs_and_preprocessor(tmp_path):
    keras.utils.set_random_seed(0)
    model = CausalLM(preprocessor=CausalLMPreprocessor(), hidden_dim=16,
                     depth=1, num_heads=2, sliding_window=8)
    x = model.preprocessor.encode(["1 may 2000 = 2000-05-01"])[0][None]
    path = os.path.join(tmp_path, "lm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(numpy(loaded(x)), numpy(model(x)), atol=1e-6)
    assert loaded.backbone.sliding_window == 8
    assert loaded.preprocessor.vocabulary_size == 128
    assert loaded.generate_text("3 may") == model.generate_text("3 may")


def test_frozen_block_stays_frozen_after_loading(tmp_path):
    model = tiny()
    model.backbone.blocks[0].trainable = False
    trainable = len(model.trainable_weights)
    path = os.path.join(tmp_path, "lm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert [b.trainable for b in loaded.backbone.blocks] == [False, True]
    assert len(loaded.trainable_weights) == trainable


def test_attention_maps_are_causal_and_windowed():
    model, x = tiny(sliding_window=3), ids(1, 8)
    maps = visualization.attention_maps(model, x)
    assert len(maps) == 2
    for weights in maps.values():
        assert weights.shape == (1, 4, 8, 8)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        t, s = np.indices((8, 8))
        assert not weights[..., (s > t) | (t - s >= 3)].any()
    scores = model.attention_scores(x)
    np.testing.assert_allclose(numpy(scores[1]), list(maps.values())[1], atol=1e-6)


@pytest.mark.large  # an XLA train step; the README's example fits too
def test_fit_lowers_the_loss_on_text():
    keras.utils.set_random_seed(0)
    model = CausalLM(preprocessor=CausalLMPreprocessor(), hidden_dim=16,
                     depth=1, num_heads=2)
    text = load_text_corpus(num_train=300, num_val=20, num_test=20)["train"]
    figures = training.fit_causal_lm(model, text, sequence_length=32, epochs=2)
    losses = figures["history"]["loss"]
    assert losses[-1] < losses[0]
    # A validation text shorter than one window was skipped without a word
    # (no val_loss came back); it is refused before training now.
    with pytest.raises(ValueError, match=r"`validation_text`.*33 characters"):
        training.fit_causal_lm(model, text, sequence_length=32,
                               validation_text="too short")


def test_preset_is_registered_and_loads_its_weights():
    spec = presets.get_preset("causal_lm_dates")
    assert spec.class_name == "CausalLM"
    assert "causal_lm_dates" in CausalLM.presets()
    assert os.path.getsize(spec.weights_path) < 1_000_000
    model = CausalLM.from_preset("causal_lm_dates")
    assert model.backbone.sliding_window == 64
    out = model.generate_text(["14 july 1989 = ", "march 3rd, 2001 = "])
    assert out == ["14 july 1989 = 1989-07-14", "march 3rd, 2001 = 2001-03-03"]
    backbone = CausalLMBackbone.from_preset("causal_lm_dates")
    np.testing.assert_array_equal(
        backbone.get_weights()[0], model.backbone.get_weights()[0]
    )


def test_preprocessor_and_text_folder(tmp_path):
    p = CausalLMPreprocessor()
    assert p.decode(p.encode("ab\ncd")) == "ab\ncd"
    assert p.encode("\té")[0] == p.encode("é")[0] == 127
    # The unknown id decoded as its own code point: DEL here, and a real
    # letter ("c", 99) for a vocabulary of 100.
    assert p.decode(p.encode("naïve\x01!")) == "na\ufffdve\ufffd!"
    assert CausalLMPreprocessor(100).decode([98, 99, 97]) == "b\ufffda"
    os.makedirs(os.path.join(tmp_path, "sub"))
    for name, text in (("a.txt", "hello world\n" * 20), ("sub/b.txt", "bye\n")):
        with open(os.path.join(tmp_path, name), "w") as f:
            f.write(text)
    corpus = load_text_corpus(str(tmp_path), val_fraction=0.1)
    assert corpus["train"].startswith("hello world") and corpus["val"].endswith("bye\n")
    x, y = p.sequences(corpus["train"], 16)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="Missing text file"):
        load_text_corpus(str(tmp_path / "sub" / "missing"))
    os.makedirs(os.path.join(tmp_path, "empty"))
    with pytest.raises(ValueError, match="path"):
        load_text_corpus(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="sequence_length"):
        p.sequences("short", 16)
    with pytest.raises(ValueError, match="`stride`"):  # was the default stride
        p.sequences(corpus["train"], 16, stride=0)
    x2, _ = p.sequences(corpus["train"], 16, stride=np.int64(8))
    assert len(x2) > len(x)
    with pytest.raises(ValueError, match="vocabulary_size"):
        CausalLMPreprocessor(vocabulary_size=10)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(position_encoding="learned"), "position_encoding"),
        (dict(sliding_window=0), "sliding_window"),
        (dict(num_heads=0), "num_heads"),
        (dict(dropout=1.5), "dropout"),
        (dict(tie_weights="yes"), "tie_weights"),
        (dict(window=3), "window"),
        (dict(vocabulary_size=None), "vocabulary_size"),
        # A layer without RoPE/ALiBi: keras's "Unrecognized keyword
        # arguments" from deep inside the block before.
        (dict(attention="additive"), r"`attention`.*'additive', which does not take \["),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kwargs)


def test_bad_generate_arguments():
    model = tiny()
    with pytest.raises(ValueError, match="max_length"):
        model.generate(ids(1, 6), max_length=6)
    with pytest.raises(ValueError, match="prompt_ids"):
        model.generate([[1, 2, V]], max_length=8)
    with pytest.raises(ValueError, match="prompt_ids"):
        model.generate([[]], max_length=8)
    with pytest.raises(ValueError, match="sampler"):
        model.generate(ids(1, 3), max_length=8, sampler="beam")
    with pytest.raises(ValueError, match="preprocessor"):
        model.generate_text("hello")
    with pytest.raises(ValueError, match="backbone"):
        CausalLM(backbone=model.backbone, hidden_dim=8)
    with pytest.raises(ValueError, match="token_ids"):
        CausalLMBackbone(vocabulary_size=V, hidden_dim=8, num_heads=2)(
            np.ones((2, 3, 4), "int32")
        )


@pytest.mark.parametrize("bad", [V, -1])
def test_token_ids_outside_the_vocabulary_are_refused(bad):
    # Before: a raw TensorFlow gather error for V, silent logits for -1.
    model = tiny(depth=1)
    model.compile(jit_compile=False)
    x = ids(2, 5)
    x[1, 2] = bad
    match = rf"`token_ids`.*\[0, {V}\).*vocabulary_size={V}"
    with pytest.raises(ValueError, match=match):
        model(x)
    with pytest.raises(ValueError, match=match):
        model.predict(x, verbose=0)
    with pytest.raises(ValueError, match=match):
        model.evaluate(x, ids(2, 5), verbose=0)
    with pytest.raises(ValueError, match=match):
        model.fit(x, ids(2, 5), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=match):
        model.attention_scores(x)


def test_date_accuracy_of_a_text_without_date_lines_raises():
    # Before: 0.0, as if the model had missed every date.
    model = tiny(depth=1)
    with pytest.raises(ValueError, match="`text`, expected date lines"):
        training.date_completion_accuracy(model, "")
    with pytest.raises(ValueError, match="`text`, expected date lines"):
        training.date_completion_accuracy(model, "no dates\nhere")


@pytest.mark.large  # a minute or two: fine-tuning, 100 generations, pictures
def test_run_recipe_quick(tmp_path):
    from keras_attention import recipes

    result = recipes.TASKS["causal-lm"].run(
        model_name="rope", data=None, epochs=None, out=str(tmp_path), seed=0,
        quick=True,
    )
    assert result.metrics["date_accuracy"] > 0.5
    # The report names the split of each figure.
    assert any("validation text" in n for n in result.notes)
    assert any("100 test lines" in n for n in result.notes)
    assert {os.path.basename(f) for f in result.files} >= {
        "causal_lm_rope.keras", "causal_lm_attention_0.png",
        "causal_lm_explorer.html",
    }


@pytest.mark.parametrize("lines", [2000, 4000])
def test_the_recipe_scores_the_shipped_weights_on_days_they_never_saw(lines):
    # `run causal-lm` fine-tunes causal_lm_dates, trained on seed 0's days:
    # its val and test days must come from that split whatever `--seed`.
    from keras_attention.datasets import make_date_corpus
    from keras_attention.training import CAUSAL_LM_RECIPES

    shipped = make_date_corpus(CAUSAL_LM_RECIPES["causal_lm_dates"]["num_train"],
                               500, 500, seed=0)
    recipe = make_date_corpus(lines, 500, 500, seed=0)
    seen = set(shipped["train"][1])
    assert not seen & (set(recipe["val"][1]) | set(recipe["test"][1]))
    # Another seed splits the days another way: the reason for seed 0.
    other = make_date_corpus(lines, 500, 500, seed=1)
    assert seen & set(other["test"][1])


@pytest.mark.parametrize("model_name, corpus_seed", [("rope", 0), ("alibi", 3)])
def test_the_recipe_takes_the_shipped_split_when_it_fine_tunes(
    monkeypatch, tmp_path, model_name, corpus_seed
):
    from keras_attention import datasets
    from keras_attention import recipes

    asked = {}

    class Stop(Exception):
        pass

    def record(**kwargs):
        asked.update(kwargs)
        raise Stop

    monkeypatch.setattr(datasets, "load_text_corpus", record)
    with pytest.raises(Stop):
        recipes.run_causal_lm(model_name, None, 1, str(tmp_path), seed=3, quick=True)
    assert asked["seed"] == corpus_seed


def test_prompts_as_backend_tensors_and_no_prompts():
    # Before: a (B, P) tensor (tf.Tensor, jax.Array...) was read as one row
    # and refused ("expected non-empty rows"), though a (P,) tensor and a
    # (B, P) NumPy array were taken; `generate_text([])` raised max()'s
    # "empty sequence" instead of returning [] as `translate([])` does.
    model = tiny(depth=1)
    x = ids(2, 3)
    want = model.generate(x, max_length=6, jit_compile=False)
    got = model.generate(keras.ops.convert_to_tensor(x), max_length=6,
                         jit_compile=False)
    np.testing.assert_array_equal(got, want)
    one = model.generate(keras.ops.convert_to_tensor(x[0]), max_length=6,
                         jit_compile=False)
    np.testing.assert_array_equal(one, want[0])
    lm = tiny(depth=1, vocabulary_size=128)
    lm.preprocessor = CausalLMPreprocessor()
    assert lm.generate_text([]) == []


def test_generation_traces_again_after_lora_is_enabled():
    # The compiled generation loop was kept per batch and length, with the
    # variables it was traced with: after `enable_lora` (and training the
    # low-rank factors) `generate` kept decoding with the base model.
    model = tiny(depth=1)
    prompts = ids(2, 3)
    before = model.generate(prompts, max_length=8)
    model.backbone.enable_lora(rank=2)
    rng = np.random.default_rng(0)
    for v in model.trainable_weights:
        v.assign(rng.normal(size=v.shape).astype(v.dtype))
    eager = model.generate(prompts, max_length=8, jit_compile=False)
    assert (eager != before).any()  # the adapted model decodes otherwise
    np.testing.assert_array_equal(model.generate(prompts, max_length=8), eager)


def test_preprocessor_lowercases_unless_told_not_to():
    # keras-hub's tokenizer lowercases by default: a cased corpus lost its
    # case silently. The default stays (the presets were trained so).
    assert CausalLMPreprocessor().decode(
        CausalLMPreprocessor().encode(["Hello World"])) == ["hello world"]
    cased = CausalLMPreprocessor(lowercase=False)
    assert cased.decode(cased.encode(["Hello World"])) == ["Hello World"]
    again = CausalLMPreprocessor.from_config(cased.get_config())
    assert again.decode(again.encode(["AbC"])) == ["AbC"]
    # Files written before the argument lowercase, as they did.
    assert CausalLMPreprocessor.from_config({"vocabulary_size": 128}).lowercase
    with pytest.raises(ValueError, match="`lowercase`"):
        CausalLMPreprocessor(lowercase="no")


def test_beam_search_gives_each_row_its_result_alone():
    # keras-hub's beam search ranks the beams before putting a prompt's
    # next id back: a short row beside a longer one got duplicate beams and
    # another result than alone (the longer row here: '...2011-12-25 197'
    # against '... the', of lower probability). Rows of each length now
    # run on their own.
    model = CausalLM.from_preset("causal_lm_dates")
    rows = model.preprocessor.encode(["7/8/09 = ", "december 25, 2011 = "])
    beam = keras_hub.samplers.BeamSampler(num_beams=3)
    batched = model.generate(rows, 34, sampler=beam, jit_compile=False)
    for row, got in zip(rows, batched):
        alone = model.generate(row, 34, sampler=beam, jit_compile=False)
        np.testing.assert_array_equal(got, alone)


def test_prompts_and_lengths_of_one_bucket_share_a_compiled_loop():
    # Every prompt length and `max_length` (generate_text: the longest
    # prompt plus 32) compiled its own XLA loop: 7 s a call on TensorFlow.
    model = tiny()
    lengths, max_lengths = (3, 14), (17, 23)
    for length in lengths:
        for max_length in max_lengths:
            prompt = ids(1, length, seed=length)[0]
            out = model.generate(prompt, max_length=max_length, jit_compile=False)
            assert out.shape == (max_length,)
            np.testing.assert_array_equal(out[:length], prompt)
            # Greedy: each id the argmax of the full forward of those before.
            logits = numpy(model(out[None]))[0]
            np.testing.assert_array_equal(
                np.argmax(logits[length - 1:-1, 1:], -1) + 1, out[length:]
            )
    assert len(model._generation.loops._loops) == 1


def test_a_new_sampler_object_with_the_same_settings_shares_the_loop():
    # A new `TopKSampler(k=5)` at each call (the docstring's way) compiled
    # a new loop each time, and every one stayed cached. The model's twin
    # of it runs now, seeded from the object, and hands its state back.
    model = tiny()
    prompt = ids(2, 4)
    first = model.generate(prompt, max_length=10, jit_compile=False,
                           sampler=keras_hub.samplers.TopKSampler(k=V, seed=3))
    sampler = keras_hub.samplers.TopKSampler(k=V, seed=3)
    start = [numpy(v) for v in sampler.variables]
    again = model.generate(prompt, max_length=10, sampler=sampler, jit_compile=False)
    np.testing.assert_array_equal(again, first)  # the same seed, the same ids
    assert len(model._generation.loops._loops) == 1
    moved = [numpy(v) for v in sampler.variables]
    assert any((a != b).any() for a, b in zip(start, moved))  # it advanced
    third = model.generate(prompt, max_length=10, sampler=sampler, jit_compile=False)
    assert (third != again).any()  # from the advanced state, as its own run
    model.generate(prompt, max_length=10, jit_compile=False,
                   sampler=keras_hub.samplers.TopKSampler(k=3, seed=3))
    assert len(model._generation.loops._loops) == 2  # other settings


def test_compiled_loops_keep_the_most_recent():
    from keras_attention.applications.compiling import CompiledLoops

    loops, model = CompiledLoops(), tiny()
    for key in range(CompiledLoops.MAX_LOOPS + 3):
        loops.get(model, key, lambda: (lambda: None), jit_compile=False)
    loops.get(model, 3, lambda: (lambda: None), jit_compile=False)  # used again
    loops.get(model, "new", lambda: (lambda: None), jit_compile=False)
    assert len(loops._loops) == CompiledLoops.MAX_LOOPS
    assert 3 in loops._loops and 4 not in loops._loops


def test_generation_from_threads_gives_each_request_its_own_ids():
    # Requests with their own seeded sampler shared the model's twin
    # sampler and its seed state: from threads, other ids than alone.
    import threading

    lm = tiny(depth=1)
    prompt = ids(length=4)

    def request():
        sampler = keras_hub.samplers.TopKSampler(k=5, seed=1, temperature=3.0)
        return lm.generate(prompt, max_length=8, sampler=sampler, jit_compile=False)

    want = request()
    got = [None] * 4
    threads = [
        threading.Thread(target=lambda i=i: got.__setitem__(i, request()))
        for i in range(len(got))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for row in got:
        np.testing.assert_array_equal(row, want)


def test_decoding_loops_from_threads_are_built_once():
    import threading

    from keras_attention.applications.compiling import CompiledLoops

    class Model:
        weights = ()

    loops, built, errors = CompiledLoops(), [], []

    def build():
        built.append(1)
        return lambda: None

    def work(keys):
        try:
            for _ in range(300):
                for key in keys:
                    assert loops.get(Model, key, build, jit_compile=False)
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    def run(keys, count):
        threads = [threading.Thread(target=work, args=(keys,)) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: races show
    try:
        run(["same"], 4)
        assert len(built) == 1
        run(range(40), 3)  # more keys than are kept: some dropped
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    assert len(loops._loops) == CompiledLoops.MAX_LOOPS


def test_padded_targets_are_left_out_of_the_loss_and_accuracy():
    # Lines padded on the right: the real tokens' logits do not see the
    # padding (causal), and `evaluate` counts only the real targets, per
    # sentence weights too (checked by hand on the logits).
    model = tiny()
    model.compile()
    x = ids(batch=3, length=8, seed=4)
    y = ids(batch=3, length=8, seed=5)
    lengths = np.array([8, 5, 2])
    real = np.arange(8)[None, :] < lengths[:, None]
    x, y = np.where(real, x, 0), np.where(real, y, 0)
    logits = numpy(model.predict(x, verbose=0)).astype("float64")
    np.testing.assert_allclose(logits[2, :2], numpy(model.predict(x[2:, :2], verbose=0))[0],
                               atol=1e-5)
    log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    losses = -np.take_along_axis(log_p, y[..., None], -1)[..., 0]
    hits = logits.argmax(-1) == y
    weights = np.array([1.0, 2.0, 0.5])
    for sample_weight in (None, weights):
        w = real * (1.0 if sample_weight is None else sample_weight[:, None])
        got = model.evaluate(x, y, sample_weight=sample_weight, batch_size=3,
                             verbose=0, return_dict=True)
        np.testing.assert_allclose(got["accuracy"], (hits * w).sum() / w.sum(), atol=1e-6)
        # Keras's loss ("sum_over_batch_size"): the weighted sum over the
        # real targets, divided by their count.
        np.testing.assert_allclose(got["loss"], (losses * w).sum() / real.sum(), rtol=1e-5)
