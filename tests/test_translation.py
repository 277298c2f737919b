"""Tests of the translation applications (keras_attention/applications).

Small configurations only. The two trained models (module fixtures) learn a
character copy task with `jit_compile=True`; most checks reuse them and run
the decoding eagerly, so each XLA compilation happens once.
"""

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from keras import ops  # noqa: E402

import keras_attention  # noqa: E402
from keras_attention.applications import translation  # noqa: E402
from keras_attention.applications.text_preprocessing import RESERVED_TOKENS  # noqa: E402
from keras_attention.applications import Seq2SeqTranslator  # noqa: E402
from keras_attention.applications import TransformerTranslator  # noqa: E402
from keras_attention.applications import TranslationPreprocessor  # noqa: E402
from keras_attention.applications import Translator  # noqa: E402
from keras_attention.applications import corpus_bleu  # noqa: E402

ALPHABET = list("abcdefgh")


def random_words(count, seed):
    rng = np.random.default_rng(seed)
    return [
        "".join(rng.choice(ALPHABET, size=int(rng.integers(2, 7))))
        for _ in range(count)
    ]


def copy_preprocessor():
    return TranslationPreprocessor(source_length=8, target_length=8)


def tiny_rnn(**kwargs):
    kwargs.setdefault("embedding_dim", 16)
    kwargs.setdefault("hidden_dim", 32)
    return Seq2SeqTranslator(copy_preprocessor(), **kwargs)


def tiny_transformer(**kwargs):
    config = dict(num_layers=1, hidden_dim=32, num_heads=2, intermediate_dim=64)
    config.update(dropout=0.0)
    config.update(kwargs)
    return TransformerTranslator(copy_preprocessor(), **config)


def train_copy(model, learning_rate, epochs):
    keras.utils.set_random_seed(0)
    # 2,084 pairs in batches of 64: the last batch has 36, so the compiled
    # step also sees a second batch size (XLA cannot differentiate a
    # `while` loop over a dynamic batch; the RNN decoder's loop is
    # unrolled).
    words = random_words(2084, seed=0)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate), jit_compile=True
    )
    x, y = model.prepare(words, words)
    history = model.fit(x, y, batch_size=64, epochs=epochs, verbose=0)
    return history.history["loss"]


@pytest.fixture(scope="module")
def rnn():
    keras.utils.set_random_seed(1)
    model = tiny_rnn()
    return model, train_copy(model, 0.01, epochs=6)


@pytest.fixture(scope="module")
def transformer():
    keras.utils.set_random_seed(1)
    model = tiny_transformer()
    return model, train_copy(model, 0.005, epochs=4)


MODELS = ["rnn", "transformer"]


@pytest.fixture(params=MODELS)
def trained(request):
    return request.getfixturevalue(request.param)[0]


def test_preprocessor_pairs_and_decoding():
    p = copy_preprocessor()
    x, labels = p.encode_pairs(["abc", "h"], ["cab", "hhhh"])
    # Labels: tokens then [END]; inputs: [START] then the labels shifted.
    np.testing.assert_array_equal(
        labels[0], [ord("c"), ord("a"), ord("b"), p.end_id, 0, 0, 0, 0]
    )
    np.testing.assert_array_equal(x["target_ids"][:, 0], [p.start_id] * 2)
    np.testing.assert_array_equal(x["target_ids"][:, 1:], labels[:, :-1])
    np.testing.assert_array_equal(x["source_ids"][1], [ord("h")] + [0] * 7)
    assert p.decode(labels) == ["cab", "hhhh"]
    assert p.token_strings(labels[0], source=False) == ["c", "a", "b", "[END]"]


def test_word_piece_vocabulary_from_corpus():
    sources = ["a man rides a horse .", "two dogs play in the snow .", "a ball ."] * 4
    targets = [
        "ein mann (im t-shirt) reitet 2.5 pferde.",
        "zwei hunde spielen im schnee, oder?",
        # 13a (BLEU) keeps an apostrophe in its word: "dog ' s" cost a
        # perfect translation half its BLEU.
        "the dog's ball isn't red, l'homme qu'il voit.",
    ] * 4
    p = TranslationPreprocessor.from_corpus(sources, targets, vocabulary_size=100)
    assert p.tokenizer == "word_piece"
    assert p.source_vocabulary[:4] == list(RESERVED_TOKENS)
    assert p.target_vocabulary[:4] == list(RESERVED_TOKENS)
    x, labels = p.encode_pairs(sources[:3], targets[:3])
    # The lengths cover the longest sentence of the corpus (+ [END]).
    assert ((labels == p.end_id).sum(axis=1) == 1).all()
    assert (x["source_ids"][:, -1] != 0).any()
    # Punctuation, split off by the tokenizer, gets its spacing back.
    assert p.decode(labels) == targets[:3]
    # An unknown word piece maps to [UNK], id 1.
    assert p.unknown_id in p.encode_sources(["a zebra ☃"])[0]


def test_bad_sentences():
    p = copy_preprocessor()
    with pytest.raises(ValueError, match=r"sentences\[1\]"):
        p.encode_sources(["abc", "  "])
    with pytest.raises(ValueError, match="not one string"):
        p.encode_sources("abc")
    with pytest.raises(ValueError, match=r"sentences\[0\]"):
        p.encode_sources([3])
    for value in (None, 3, np.array("abc")):
        with pytest.raises(ValueError, match=r"`sentences`, expected a list"):
            p.encode_sources(value)
    with pytest.raises(ValueError, match="as many targets"):
        p.encode_pairs(["a", "b"], ["a"])
    with pytest.warns(UserWarning, match="truncated to 8 tokens"):
        ids = p.encode_sources(["abcdefghij"])
    np.testing.assert_array_equal(ids[0], [ord(c) for c in "abcdefgh"])
    with pytest.warns(UserWarning, match="truncated"):
        _, labels = p.encode_targets(["abcdefghij"])
    assert p.end_id not in labels[0]
    # Unknown characters (beyond ASCII, control characters) are [UNK].
    ids = p.encode_sources(["aé\x02日"])[0]
    np.testing.assert_array_equal(ids[:4], [ord("a")] + [p.unknown_id] * 3)
    with pytest.raises(ValueError, match="tokenizer"):
        TranslationPreprocessor(tokenizer="bytes")
    with pytest.raises(ValueError, match="source_vocabulary"):
        TranslationPreprocessor(tokenizer="word_piece", source_vocabulary=["a"])


def test_corpus_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        translation.load_translation_corpus(tmp_path / "nowhere")
    (tmp_path / "train.en").write_text("a man\na dog\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="train.de"):
        translation.load_translation_corpus(tmp_path)
    (tmp_path / "train.de").write_text("ein mann\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not aligned"):
        translation.load_translation_corpus(tmp_path)
    (tmp_path / "train.de").write_text("ein mann\nein hund\n", encoding="utf-8")
    corpus = translation.load_translation_corpus(tmp_path)
    assert corpus["train"] == (["a man", "a dog"], ["ein mann", "ein hund"])
    dates = translation.load_translation_corpus(num_train=5, num_val=2, num_test=2)
    assert len(dates["train"][0]) == 5 and len(dates["test"][1][0]) == 10


@pytest.mark.parametrize("name", MODELS)
def test_shapes_and_padding_do_not_change_outputs(name):
    keras.utils.set_random_seed(2)
    model = tiny_rnn() if name == "rnn" else tiny_transformer()
    x, labels = model.prepare(["abc", "hgfedc"], ["cba", "cdefgh"])
    logits = ops.convert_to_numpy(model(x))
    v = model.preprocessor.target_vocabulary_size
    assert logits.shape == (2, 8, v)
    weights = ops.convert_to_numpy(model.cross_attention(x))
    assert weights.shape == (2, 8, 8)
    # No attention on padded source positions; each real row sums to 1.
    np.testing.assert_allclose(weights[0, :, 3:], 0.0, atol=1e-7)
    real = x["target_ids"] != 0
    np.testing.assert_allclose(weights.sum(-1)[real], 1.0, atol=1e-5)
    # Checked as `call` checks its ids (JAX clamped this one: garbage maps).
    bad = dict(x, target_ids=np.where(x["target_ids"] > 0, 10**6, 0))
    with pytest.raises(ValueError, match="`target_ids`"):
        model.cross_attention(bad)
    # Fewer padding columns in the source: identical outputs.
    short = dict(x, source_ids=x["source_ids"][:, :6])
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(short)), logits, atol=1e-5
    )
    # A padded target position changes nothing before it (the first
    # sentence's targets end at position 4; fill the rest with tokens).
    filled = dict(x, target_ids=x["target_ids"].copy())
    filled["target_ids"][0, 5:] = ord("a")
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(filled))[0, :5], logits[0, :5], atol=1e-5
    )
    # The padding embedding is not what keeps outputs equal: changing the
    # real tokens does change them.
    other = dict(x, source_ids=x["source_ids"].copy())
    other["source_ids"][0, 0] = ord("h")
    assert not np.allclose(ops.convert_to_numpy(model(other))[0], logits[0])


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
@pytest.mark.parametrize("name", MODELS)
def test_fit_with_xla_lowers_loss_and_learns_copy(name, request):
    model, losses = request.getfixturevalue(name)
    assert model.jit_compile is True  # and each epoch ended on 36 pairs
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.2 * losses[0], losses
    words = random_words(48, seed=7)
    translations = model.translate(words, jit_compile=False)
    assert np.mean([t == w for t, w in zip(translations, words)]) >= 0.95


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
def test_greedy_equals_beam_search_of_width_one(trained):
    source_ids = trained.preprocessor.encode_sources(random_words(6, seed=3))
    greedy = trained.generate_ids(source_ids, search="greedy", jit_compile=False)
    beam = trained.generate_ids(
        source_ids, beam_width=1, search="beam", jit_compile=False
    )
    np.testing.assert_array_equal(greedy[0], beam[0])
    np.testing.assert_allclose(greedy[1], beam[1], atol=1e-6)


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
def test_cached_decoding_equals_uncached(trained):
    source_ids = trained.preprocessor.encode_sources(random_words(2, seed=4))
    for beam_width in (1, 3):
        cached = trained.generate_ids(
            source_ids, beam_width, use_cache=True, jit_compile=False
        )
        uncached = trained.generate_ids(
            source_ids, beam_width, use_cache=False, jit_compile=False
        )
        np.testing.assert_array_equal(cached[0], uncached[0])
        np.testing.assert_allclose(cached[1], uncached[1], atol=1e-5)
    # Step by step, the cached logits equal the teacher-forced ones.
    x, _ = trained.prepare(["abcd", "hh"], ["abcd", "hh"])
    source = ops.convert_to_tensor(x["source_ids"])
    full_logits = ops.convert_to_numpy(trained(x))
    encoded = trained.prepare_decoding(trained.encode(source))
    cache = trained.initial_cache(encoded, 8)
    for t in range(8):
        tokens = ops.convert_to_tensor(x["target_ids"][:, t])
        logits, cache, _ = trained.decode_step(tokens, t, cache, encoded)
        # Padded positions differ: the full pass masks them as queries.
        real = x["target_ids"][:, t] != 0
        np.testing.assert_allclose(
            ops.convert_to_numpy(logits)[real], full_logits[real, t], atol=1e-4
        )


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
def test_transformer_cache_holds_past_keys(transformer):
    model = transformer[0]
    source = ops.convert_to_tensor(model.preprocessor.encode_sources(["abc"]))
    encoded = model.prepare_decoding(model.encode(source))
    cache = model.initial_cache(encoded, 8)
    # The self-attention's own cache: (B, 2, L, K, D), keys then values.
    assert tuple(cache[0].shape) == (1, 2, 8, 2, 16)
    token = ops.convert_to_tensor([model.preprocessor.start_id])
    _, cache, _ = model.decode_step(token, 0, cache, encoded)
    entries = ops.convert_to_numpy(cache[0])
    assert np.abs(entries[0, :, 0]).sum() > 0
    assert np.abs(entries[0, :, 1:]).sum() == 0


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
def test_xla_decoding_equals_eager(rnn, transformer):
    words = random_words(5, seed=5)
    for model, beam_width in ((rnn[0], 1), (transformer[0], 2)):
        ids = model.preprocessor.encode_sources(words)
        eager = model.generate_ids(ids, beam_width, jit_compile=False)
        compiled = model.generate_ids(ids, beam_width, jit_compile=True)
        np.testing.assert_array_equal(eager[0], compiled[0])
        np.testing.assert_allclose(eager[1], compiled[1], atol=1e-4)


def test_compiled_decoding_traces_again_after_lora_is_enabled():
    # The compiled decoding loop was kept per setting with the variables it
    # was traced with: after `enable_lora` (and training the low-rank
    # factors) `translate` kept decoding with the base model.
    keras.utils.set_random_seed(0)
    model = tiny_transformer()
    ids = model.preprocessor.encode_sources(random_words(4, seed=7))
    before = model.generate_ids(ids)[0]
    keras_attention.layers.enable_lora(model, 2)
    rng = np.random.default_rng(0)
    for v in model.trainable_weights:
        v.assign(rng.normal(size=v.shape).astype(v.dtype))
    eager = model.generate_ids(ids, jit_compile=False)[0]
    assert (eager != before).any()  # the adapted model decodes otherwise
    np.testing.assert_array_equal(model.generate_ids(ids)[0], eager)


class MarkovTranslator(Translator):
    """A decoder with known probabilities: a fixed table P(next | previous)."""

    def __init__(self, table, **kwargs):
        super().__init__(
            preprocessor=TranslationPreprocessor(source_length=2, target_length=4),
            **kwargs,
        )
        self.table = np.asarray(table, "float32")

    def encode(self, source_ids, training=False):
        return {"source": ops.cast(source_ids, "float32")}

    def initial_cache(self, encoded, max_length):
        return ops.zeros_like(encoded["source"][:, :1])

    def decode_step(self, tokens, index, cache, encoded):
        logits = ops.take(ops.convert_to_tensor(self.table), tokens, axis=0)
        weights = ops.zeros_like(encoded["source"])
        return logits, cache, weights


def test_beam_search_matches_exhaustive_search():
    a, b, end = ord("a"), ord("b"), 3
    v = 128
    table = np.full((v, v), -1e4, "float32")
    start = 2
    # Greedy takes "a" first, but "b" leads to a much better completion.
    for previous, options in {
        start: {a: 0.6, b: 0.4},
        a: {a: 0.35, b: 0.35, end: 0.3},
        b: {end: 0.95, a: 0.05},
    }.items():
        for token, prob in options.items():
            table[previous, token] = np.log(prob)
    model = MarkovTranslator(table)
    source = np.ones((1, 2), "int32")

    def log_prob(sequence):
        total, previous = 0.0, start
        for token in sequence:
            total += table[previous, token]
            previous = token
        return total

    # Every sequence over {a, b} that ends with [END] within 4 tokens.
    candidates = [[end]]
    for length in range(1, 4):
        for body in np.ndindex(*(2,) * length):
            candidates.append([(a, b)[i] for i in body] + [end])
    best = max(candidates, key=log_prob)
    assert best == [b, end]
    beam, _ = model.generate_ids(
        source, beam_width=4, length_penalty=0.0, jit_compile=False
    )
    assert model._generated_ids(beam[0]) == best
    greedy, _ = model.generate_ids(source, jit_compile=False)
    assert model._generated_ids(greedy[0])[:2] == [a, a]


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
@pytest.mark.parametrize("name", MODELS)
def test_save_and_load_translate_identically(name, request, tmp_path):
    model = request.getfixturevalue(name)[0]
    path = str(tmp_path / "translator.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode, no custom_objects
    assert type(loaded) is type(model)
    assert loaded.get_config() == model.get_config()
    words = random_words(8, seed=6)
    kwargs = dict(beam_width=2, jit_compile=False)
    assert loaded.translate(words, **kwargs) == model.translate(words, **kwargs)


def test_word_piece_vocabulary_is_saved(tmp_path):
    vocabulary = list(RESERVED_TOKENS) + ["a", "man", "dog", "##s", "."]
    target = list(RESERVED_TOKENS) + ["ein", "mann", "hund", "##e", "."]
    p = TranslationPreprocessor(
        tokenizer="word_piece",
        source_vocabulary=vocabulary,
        target_vocabulary=target,
        source_length=6,
        target_length=6,
    )
    model = Seq2SeqTranslator(p, embedding_dim=8, hidden_dim=8)
    path = str(tmp_path / "words.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.preprocessor.source_vocabulary == vocabulary
    assert loaded.preprocessor.target_vocabulary == target
    sentences = ["a man .", "dogs"]
    assert loaded.translate(sentences, jit_compile=False) == model.translate(
        sentences, jit_compile=False
    )


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
def test_return_attention(rnn):
    model = rnn[0]
    texts, maps = model.translate(
        ["abcdef", "hg"], return_attention=True, jit_compile=False
    )
    for text, item in zip(texts, maps):
        weights = item["weights"]
        assert item["target_tokens"] == list(text) + ["[END]"]
        assert weights.shape == (len(text) + 1, len(item["source_tokens"]))
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert maps[0]["source_tokens"] == list("abcdef")
    # Copying: output character i attends mostly to source character i.
    weights = maps[0]["weights"][:6]
    assert np.mean(weights.argmax(-1) == np.arange(6)) >= 0.8
    single, single_map = model.translate(
        "abcdef", return_attention=True, jit_compile=False
    )
    assert single == texts[0]
    np.testing.assert_allclose(single_map["weights"], maps[0]["weights"], atol=1e-6)


def test_attention_selected_by_name():
    luong = tiny_rnn(attention="scaled_dot_product", cell="lstm")
    layer = luong.attention_layer
    assert isinstance(layer, keras_attention.layers.ScaledDotProductAttention)
    assert layer.score_mode == "general"
    assert isinstance(
        tiny_rnn().attention_layer, keras_attention.layers.AdditiveAttention
    )
    plain = tiny_rnn(attention=None)
    assert plain.attention_layer is None
    x, _ = plain.prepare(["abc"], ["abc"])
    for model in (luong, plain):
        assert ops.convert_to_numpy(model(x)).shape == (1, 8, 128)
    # Without attention the context is the same at every step: no weights.
    np.testing.assert_array_equal(
        ops.convert_to_numpy(plain.cross_attention(x)), 0.0
    )
    _, maps = plain.translate(["abc"], return_attention=True, jit_compile=False)
    assert maps[0]["weights"].shape[1] == 3


def test_presets_and_invalid_arguments():
    tiny = Seq2SeqTranslator.from_preset("tiny")
    small = Seq2SeqTranslator.from_preset("small", dropout=0.0)
    assert tiny.count_params() < small.count_params()
    assert small.dropout == 0.0
    assert tiny.preprocessor.source_length == 32  # the date task's
    t_tiny = TransformerTranslator.from_preset("tiny")
    assert t_tiny.num_layers == 2 and t_tiny.hidden_dim == 64
    with pytest.raises(ValueError, match="preset"):
        Seq2SeqTranslator.from_preset("huge")
    with pytest.raises(ValueError, match="attention"):
        tiny_rnn(attention="no_such_layer")
    with pytest.raises(ValueError, match="cell"):
        tiny_rnn(cell="rnn")
    with pytest.raises(ValueError, match="num_heads"):
        tiny_transformer(num_heads=5)
    with pytest.raises(ValueError, match="max_length"):
        t_tiny.translate(["1 May 2000"], max_length=12)
    with pytest.raises(ValueError, match="beam_width"):
        tiny.translate(["1 May 2000"], beam_width=0)
    with pytest.raises(ValueError, match="source_ids"):
        t_tiny(
            {
                "source_ids": np.ones((1, 40), "int32"),
                "target_ids": np.ones((1, 11), "int32"),
            }
        )


@pytest.mark.parametrize(
    "cls, name",
    [(TransformerTranslator, "transformer_dates"), (Seq2SeqTranslator, "seq2seq_dates")],
)
def test_date_presets_translate_held_out_dates(cls, name):
    from keras_attention.applications import presets

    spec = presets.get_preset(name)
    assert name in cls.presets() and name in presets()
    assert os.path.getsize(spec.weights_path) < 1_500_000
    assert spec.metadata()["exact_match"] >= 0.99
    model = cls.from_preset(name)
    # The first test dates of the split the weights were trained beside:
    # calendar days they never saw. Recorded exact match: 1.0 on 1,000.
    sources, targets = translation.load_translation_corpus(
        None, num_train=0, num_val=0, num_test=40, seed=0
    )["test"]
    assert model.translate(list(sources)) == list(targets)
    assert model.translate("14 July 1989") == "1989-07-14"
    fresh = cls.from_preset(name, load_weights=False)
    assert fresh.translate("14 July 1989") != "1989-07-14"
    with pytest.raises(ValueError, match="hidden_dim.*load_weights=False"):
        cls.from_preset(name, hidden_dim=32)


@pytest.mark.large  # a minute: fine-tuning, 300 translations, pictures
def test_run_recipe_fine_tunes_the_shipped_weights(tmp_path):
    from keras_attention import recipes

    result = recipes.TASKS["translation"].run(
        model_name="transformer", data=None, epochs=None, out=str(tmp_path),
        seed=0, quick=True,
    )
    assert result.metrics["exact_match"] > 0.95
    assert "transformer_dates" in result.notes[0]
    assert {os.path.basename(f) for f in result.files} >= {
        "translation_transformer.keras", "translation_attention_0.png",
    }


def test_corpus_bleu():
    assert corpus_bleu(["a man rides a horse ."], ["a man rides a horse ."]) == (
        pytest.approx(100.0)
    )
    assert corpus_bleu(["a b c d"], ["e f g h"]) == 0.0
    # By hand: 3 of 4 unigrams, 2 of 3 bigrams, 1 of 2 trigrams match; equal
    # lengths, so no brevity penalty.
    import keras_hub

    metric = keras_hub.metrics.Bleu(max_order=3)
    metric.update_state([["a b c d"]], ["a b c e"])
    expected = np.exp((np.log(3 / 4) + np.log(2 / 3) + np.log(1 / 2)) / 3)
    assert float(metric.result()) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="as many"):
        corpus_bleu(["a"], [])


def test_corpus_bleu_takes_sentences_with_other_numbers_of_references():
    # Was keras-hub's "Can't convert non-rectangular Python sequence".
    hypotheses = ["a b c d", "w x y z"]
    # The second sentence matches only its second reference: 100 if both
    # are read.
    assert corpus_bleu(
        ["a b c d", ["e f g h", "w x y z"]], hypotheses
    ) == pytest.approx(100.0)
    assert corpus_bleu(
        [["a b c d"], ["e f g h", "w x y z", "w x y q"]], hypotheses
    ) == pytest.approx(100.0)
    with pytest.raises(ValueError, match=r"references\[0\]=\[\]"):
        corpus_bleu([[], "w x y z"], hypotheses)


def test_corpus_bleu_equals_sacrebleu_unsmoothed():
    # Values of sacrebleu 2.x: corpus_bleu(hypotheses, [references]).score
    # (13a tokenisation), here with its default smoothing irrelevant...
    references = ["The cat sat on the mat.", "A dog runs in the park!"]
    hypotheses = ["The cat sat on a mat.", "The dog runs in a park!"]
    assert corpus_bleu(references, hypotheses) == pytest.approx(36.2079, abs=1e-4)
    # ...and here, where no 4-gram matches, sacrebleu's smooth_method="none"
    # (its default "exp" gives 28.8843): keras-hub's Bleu does not smooth.
    references = ["Ein Mann mit T-Shirt.", "Zwei Hunde spielen im Schnee."]
    hypotheses = ["Ein Mann im T-Shirt.", "Zwei Hunde spielen."]
    assert corpus_bleu(references, hypotheses) == 0.0
    # Two references per sentence: sacrebleu's 72.1399.
    references = [["The cat sat on the mat.", "A cat is on the mat."],
                  ["A dog runs in the park!", "The dog runs."]]
    hypotheses = ["A cat is on the mat.", "The dog runs in a park!"]
    assert corpus_bleu(references, hypotheses) == pytest.approx(72.1399, abs=1e-4)


def test_evaluate_translations_with_several_references_per_sentence():
    model = TransformerTranslator.from_preset("transformer_dates")
    sources = ["14 July 1989", "March 3, 1998"]
    plain = model.evaluate_translations(sources, ["1989-07-14", "1998-03-03"])
    assert plain == {"bleu": pytest.approx(100.0), "exact_match": 1.0}
    several = model.evaluate_translations(
        sources, [["1989-07-14", "14/07/1989"], ("03/03/1998", "1998-03-03")]
    )
    assert several == plain  # exact when equal to any reference (was 0.0)
    wrong = model.evaluate_translations(sources, [["x"], ["1998-03-03"]])
    assert wrong["exact_match"] == 0.5
    with pytest.raises(ValueError, match=r"len\(sources\)=2, len\(references\)=1"):
        model.evaluate_translations(sources, ["1989-07-14"])


@pytest.mark.xdist_group("translation_trained")  # one build of the fixtures
def test_warns_when_translating_long_sentences(rnn):
    model = rnn[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.translate(["abcdefghabcd"], jit_compile=False)
    assert any("truncated" in str(w.message) for w in caught)
    assert isinstance(out, list) and len(out) == 1
    with pytest.raises(ValueError, match="empty"):
        model.translate(["abc", ""])


@pytest.mark.parametrize(
    "make", [tiny_rnn, pytest.param(tiny_transformer, marks=pytest.mark.large)]
)
def test_ids_outside_the_vocabularies_are_refused_by_name(make):
    # Before: accepted (a gather error on TensorFlow, a silent clamp and
    # garbage on JAX and torch).
    model = make()
    model.compile(jit_compile=False)  # the checks, not XLA
    x, y = model.prepare(["abc", "de"], ["abc", "de"])
    source_size = model.preprocessor.source_vocabulary_size
    target_size = model.preprocessor.target_vocabulary_size
    bad_source = {**x, "source_ids": np.full_like(x["source_ids"], source_size)}
    with pytest.raises(ValueError, match=rf"`source_ids`.*\[0, {source_size}\)"):
        model.predict(bad_source, verbose=0)
    bad_target = {**x, "target_ids": np.full_like(x["target_ids"], target_size + 3)}
    with pytest.raises(ValueError, match=r"`target_ids`, expected token ids in"):
        model.fit(bad_target, y, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"`source_ids`.*\[0, "):
        model([bad_source["source_ids"], x["target_ids"]])
    with pytest.raises(ValueError, match=r"`target_ids`, expected token ids \(B, length\)"):
        model.predict({**x, "target_ids": x["target_ids"][0]}, verbose=0)
    # Good ids still train and predict.
    model.fit(x, y, epochs=1, verbose=0)
    assert model.predict(x, verbose=0).shape[:2] == x["target_ids"].shape
