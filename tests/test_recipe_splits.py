"""Which split each recipe scores: the translation and language-model
recipes run with their training and scoring replaced by recorders, and the
data the scoring got is compared with the split the reported figure names
(the classification and detection recipes: `tests/test_picture_checks.py`;
node classification: `tests/test_evaluation.py`). And the date accuracy the
causal-LM figures quote, against a count by hand."""

import keras
import numpy as np
import pytest

from keras_attention import recipes
from keras_attention import training
from keras_attention import visualization


def _recording(calls, result):
    def method(*args, **kwargs):
        calls.append((args, kwargs))
        return result
    return method


@pytest.fixture
def no_files(monkeypatch):
    monkeypatch.setattr(recipes, "_save", lambda model, out, name: name)
    monkeypatch.setattr(recipes, "_explore", lambda *a, **k: "page.html")
    monkeypatch.setattr(recipes, "_close", lambda fig: None)


def test_translation_recipe_scores_the_test_sentences(monkeypatch, tmp_path, no_files):
    from keras_attention.applications import translation

    fitted, scored = [], []
    monkeypatch.setattr(keras.Model, "fit", _recording(fitted, None))
    monkeypatch.setattr(
        translation.Translator, "evaluate_translations",
        _recording(scored, {"bleu": 12.5, "exact_match": 0.25}),
    )
    monkeypatch.setattr(
        translation.Translator, "translate",
        lambda self, sources, return_attention=False: (
            ["2000-01-01"] * len(sources),
            [{"weights": np.ones((2, 3)), "source_tokens": ["a", "b", "c"],
              "target_tokens": ["x", "y"]}] * len(sources),
        ),
    )
    result = recipes.run_translation("seq2seq", None, 1, str(tmp_path), 0, quick=True)
    corpus = translation.load_translation_corpus(
        None, num_train=2000, num_val=200, num_test=200, seed=0
    )
    (_, sources, references), _ = scored[0]
    assert list(sources) == list(corpus["test"][0])
    assert list(references) == list(corpus["test"][1])
    assert not set(sources) & set(corpus["train"][0])
    # Trained on the training pairs, monitored on the validation ones.
    (_, x, _), kwargs = fitted[0]
    assert x["source_ids"].shape[0] == len(corpus["train"][0])
    validation_x = kwargs["validation_data"][0]
    assert validation_x["source_ids"].shape[0] == len(corpus["val"][0])
    assert result.metrics == {"bleu": 12.5, "exact_match": 0.25}
    assert "'test' split (200 sentences)" in " ".join(result.notes)


def test_causal_lm_recipe_scores_validation_windows_and_test_dates(
    monkeypatch, tmp_path, no_files
):
    from keras_attention import datasets
    from keras_attention.applications import CausalLM

    fitted, scored, dated = [], [], []
    monkeypatch.setattr(training, "fit_causal_lm", _recording(fitted, None))
    monkeypatch.setattr(keras.Model, "evaluate", _recording(scored, {"loss": np.log(2.0)}))
    monkeypatch.setattr(training, "date_completion_accuracy", _recording(dated, 0.5))
    monkeypatch.setattr(
        CausalLM, "generate_text", lambda self, prompts, **k: list(prompts)
    )
    monkeypatch.setattr(visualization, "attention_maps", lambda *a, **k: {})
    result = recipes.run_causal_lm("rope", None, 1, str(tmp_path), 0, quick=True)
    corpus = datasets.load_text_corpus(num_train=2000, seed=0)
    (_, train_text), kwargs = fitted[0]
    assert train_text == corpus["train"] and kwargs["validation_text"] == corpus["val"]
    (model, x, y), _ = scored[0]
    length = training.CAUSAL_LM_RECIPES["causal_lm_dates"]["sequence_length"]
    x_val, y_val = model.preprocessor.sequences(corpus["val"], length)
    np.testing.assert_array_equal(x, x_val)
    np.testing.assert_array_equal(y, y_val)
    (_, text, count), _ = dated[0]
    assert text == corpus["test"] and count == 100
    assert result.metrics == {"val_bits_per_char": 1.0, "date_accuracy": 0.5}
    assert f"{y_val.size} characters" in result.notes[1]


class _Completer:
    """A model whose greedy completion of each prompt is given."""

    def __init__(self, completions):
        self.completions = completions
        self.prompts = []

    def generate_text(self, prompts, max_length):
        self.prompts += prompts
        return [p + self.completions[p] for p in prompts]


def test_date_completion_accuracy_counts_exact_completions():
    text = (
        "5 may 1990 = 1990-05-05\n"
        "june 1st, 2001 = 2001-06-01\n"
        "a line without a date\n"
        "the 3rd of march 1977 = 1977-03-03\n"
    )
    model = _Completer({
        "5 may 1990 = ": "1990-05-05",          # right
        "june 1st, 2001 = ": "2001-06-02",      # one digit off
        "the 3rd of march 1977 = ": "1977-03-03\n",  # more than the date
    })
    accuracy = training.date_completion_accuracy(model, text, batch_size=2)
    assert accuracy == pytest.approx(1 / 3)
    assert model.prompts == [
        "5 may 1990 = ", "june 1st, 2001 = ", "the 3rd of march 1977 = "
    ]
    assert training.date_completion_accuracy(model, text, max_examples=1) == 1.0
