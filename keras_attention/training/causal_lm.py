"""The causal language model's recipe: windows of text, AdamW, cosine decay.

`benchmarks/train_presets.py causal_lm_dates` and `keras-attention run
causal-lm` train with `fit_causal_lm`; `date_completion_accuracy` scores a
model on the date lines (the prompt `"<date> = "` completed with exactly
the ISO date, greedy decoding through the key/value cache).
"""

import os
import time

import keras

from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention._validation import check_positive_number
from keras_attention.training.budget import TimeBudget
from keras_attention.training.budget import cpu_seconds

# The recipe of each preset with shipped weights.
CAUSAL_LM_RECIPES = {
    "causal_lm_dates": dict(
        sequence_length=128, batch_size=32, epochs=12, learning_rate=3e-3,
        num_train=50000,
    ),
}


def fit_causal_lm(
    model,
    text,
    sequence_length=128,
    batch_size=32,
    epochs=1,
    learning_rate=3e-3,
    validation_text=None,
    cpu_budget=None,
    verbose=0,
):
    """Fits `model` (a `CausalLM` with a preprocessor) on `text`.

    Windows of `sequence_length` characters (half overlapping), AdamW with
    a warm-up and cosine decay over the epochs, XLA.

    Args:
        model: a `CausalLM` with a `preprocessor` (it cuts the text).
        text: the training text (a string).
        sequence_length: characters a window; `text` needs one more.
        batch_size, epochs, learning_rate: of the fit (the peak rate of
            the schedule).
        validation_text: optional text scored after each epoch
            (`val_loss`), in windows of `sequence_length` (none
            overlapping); it needs `sequence_length + 1` characters.
        cpu_budget: optional CPU seconds after which training stops
            (`TimeBudget`).
        verbose: Keras's `verbose` of `fit`.

    Returns:
        `{"wall", "cpu", "load", "history"}`: seconds of `fit` (wall and
        CPU), the load average, and Keras's history.

    Raises:
        ValueError: a model without a preprocessor, a bad number (naming
            it), or a `text` or `validation_text` shorter than one window.

    Example:

    ```python
    corpus = load_text_corpus(num_train=500, num_val=50, num_test=50)
    lm = CausalLM(preprocessor=CausalLMPreprocessor(), hidden_dim=32,
                  depth=2, num_heads=4)
    figures = fit_causal_lm(lm, corpus["train"], sequence_length=64,
                            validation_text=corpus["val"])
    figures["history"]["val_loss"]  # one value an epoch
    ```
    """
    if getattr(model, "preprocessor", None) is None:
        raise ValueError(
            "fit_causal_lm cuts `text` with the model's preprocessor: expected "
            "a CausalLM with a `preprocessor`. Received: preprocessor=None"
        )
    check_positive_int("batch_size", batch_size)
    check_positive_int("epochs", epochs)
    check_positive_number("learning_rate", learning_rate)
    x, y = model.preprocessor.sequences(
        text, sequence_length, stride=sequence_length // 2 or 1
    )
    validation = None
    if validation_text is not None:
        if len(validation_text) < sequence_length + 1:
            # It was skipped without a word, and no val_loss came back.
            raise invalid(
                "validation_text",
                f"at least sequence_length + 1 = {sequence_length + 1} "
                "characters (one window)",
                f"<text of {len(validation_text)} characters>",
            )
        validation = model.preprocessor.sequences(validation_text, sequence_length)
    steps = max(1, epochs * (len(x) // batch_size))
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, steps, alpha=0.05, warmup_target=learning_rate,
        warmup_steps=min(100, steps // 10),
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01,
                                         global_clipnorm=1.0),
    )
    callbacks = [TimeBudget(cpu_seconds=cpu_budget)] if cpu_budget else []
    wall, cpu = time.time(), cpu_seconds()
    history = model.fit(
        x, y, batch_size=batch_size, epochs=epochs, shuffle=True,
        validation_data=validation, callbacks=callbacks, verbose=verbose,
    )
    return {
        "wall": time.time() - wall,
        "cpu": cpu_seconds() - cpu,
        "load": os.getloadavg(),
        "history": history.history,
    }


def date_completion_accuracy(model, text, max_examples=200, batch_size=50):
    """Share of date lines `"<date> = <ISO>"` of `text` whose prompt
    `"<date> = "` the model completes with exactly `<ISO>` (greedy)."""
    check_positive_int("max_examples", max_examples)
    check_positive_int("batch_size", batch_size)
    lines = [line for line in text.split("\n") if " = " in line][:max_examples]
    if not lines:  # an accuracy of 0 would read as a result
        raise ValueError(
            "Received an invalid value for argument `text`, expected date "
            "lines '<date> = <ISO date>' (an empty split has none). "
            f"Received: text of {len(text)} characters without ' = '"
        )
    correct = 0
    for start in range(0, len(lines), batch_size):
        batch = lines[start:start + batch_size]
        prompts = [line.rsplit(" = ", 1)[0] + " = " for line in batch]
        outputs = model.generate_text(prompts, max_length=max(map(len, batch)) + 4)
        correct += sum(out == line for out, line in zip(outputs, batch))
    return correct / len(lines)


def train_causal_lm_preset(preset, seed=0, cpu_budget=None, verbose=0):
    """Trains the configuration of `preset` on the date lines from scratch.

    Returns `(model, metrics, figures)`: the date-completion accuracy on
    the test lines and the validation loss, and `fit_causal_lm`'s figures.
    """
    from keras_attention.applications import CausalLM
    from keras_attention.datasets import load_text_corpus

    recipe = CAUSAL_LM_RECIPES[preset]
    keras.utils.set_random_seed(seed)
    corpus = load_text_corpus(num_train=recipe["num_train"], seed=seed)
    model = CausalLM.from_preset(preset, load_weights=False)
    options = {k: v for k, v in recipe.items() if k != "num_train"}
    figures = fit_causal_lm(
        model, corpus["train"], validation_text=corpus["val"],
        cpu_budget=cpu_budget, verbose=verbose, **options,
    )
    metrics = {
        "date_accuracy": date_completion_accuracy(model, corpus["test"]),
        "val_loss": float(figures["history"]["val_loss"][-1]),
    }
    return model, metrics, figures
