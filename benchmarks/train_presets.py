"""Trains the presets that ship weights and writes them into the package.

For each preset with a weights file, builds its configuration, trains it
with its recipe from `keras_attention.training`, and writes
`keras_attention/presets/<name>.weights.h5` and `<name>.json`
(configuration, recipe, the test figure, wall and CPU seconds of `fit`,
load average, versions):

- `vit_digits`, `cbam_resnet_digits`: `IMAGE_RECIPES` on scikit-learn's
  digits (stratified 80/20 split, seed 0); test accuracy;
- `causal_lm_dates`: `CAUSAL_LM_RECIPES` on the date lines; greedy
  date-completion accuracy on test lines;
- `transformer_dates`, `seq2seq_dates`: `TRANSLATION_RECIPES` on 50,000
  generated dates; greedy exact match on 1,000 test dates (calendar days
  not drawn for training).

    python benchmarks/train_presets.py            # all presets with weights
    python benchmarks/train_presets.py vit_digits

The shipped files: `vit_digits` 0.9777 and `cbam_resnet_digits` 0.9889 test
accuracy (0.65 and 1.35 MB, weights only, no optimizer state). Training is
deterministic here: `bench_classification.py --tasks digits` retrains both
recipes from scratch to the same accuracies, in 142 and 105 CPU seconds of
`fit` (budget: 360, "3 minutes on 2 cores"; 2 shared cores, load about 8).
`transformer_dates` and `seq2seq_dates`: exact match 1.000 both (0.97 and
0.58 MB; 203 and 137 CPU seconds of `fit`, 2026-12-02, AMD EPYC 2 cores,
avx512f/avx512_bf16, TensorFlow 2.21, Keras 3.15.1).
"""

import argparse
import datetime
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# This checkout's package, whichever one is installed (an installed copy
# elsewhere would be measured otherwise).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402

import keras_attention  # noqa: E402
from keras_attention import training  # noqa: E402
from keras_attention.applications import presets  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402

SHIPPED = (
    "cbam_resnet_digits", "vit_digits", "causal_lm_dates", "transformer_dates",
    "seq2seq_dates",
)


def save_model_weights(model, spec):
    """Writes the weights of `model` without its optimizer's state.

    (`save_weights` of a compiled model also writes the optimizer's
    variables, which would triple the size of an Adam-trained file.)
    """
    clean = type(model).from_preset(spec.name, load_weights=False)
    clean.set_weights(model.get_weights())
    clean.save_weights(spec.weights_path)


# The presets of a library `train_*_preset`: its recipes, and what its data
# and metrics are (for `<name>.json`).
TEXT_PRESETS = (
    (
        training.CAUSAL_LM_RECIPES,
        training.train_causal_lm_preset,
        "date lines '<date> = <ISO date>' of keras_attention.datasets."
        "load_text_corpus(num_train={num_train}, seed={seed}); date_accuracy: "
        "greedy completions of the first 200 test lines",
    ),
    (
        training.TRANSLATION_RECIPES,
        training.train_translator_preset,
        "the date task: keras_attention.applications.translation."
        "load_translation_corpus(None, num_train={num_train}, num_val=1000, "
        "num_test=1000, seed={seed}); exact_match and bleu: greedy "
        "translations of the 1,000 test dates (calendar days not drawn for "
        "training)",
    ),
)


def train_text_preset(name, seed, trainer, recipe, data):
    """A preset that a library `train_*_preset` trains (`trainer`: the
    causal LM's or the translators'), saved with its metrics."""
    spec = presets.get_preset(name)
    model, metrics, figures = trainer(name, seed=seed, verbose=2)
    save_model_weights(model, spec)
    write_metadata(spec, seed, figures, {
        "data": data,
        "recipe": recipe,
        **{k: round(v, 4) for k, v in metrics.items()},
    })
    size = os.path.getsize(spec.weights_path) / 1e6
    print(f"{name}: {metrics}, fit {figures['wall']:.0f} s wall / "
          f"{figures['cpu']:.0f} s CPU, {spec.weights_path} ({size:.2f} MB)",
          flush=True)


def write_metadata(spec, seed, figures, fields):
    """`<name>.json` beside the weights: config, recipe, figures, versions."""
    metadata = {
        "name": spec.name,
        "class_name": spec.class_name,
        "config": spec.config,
        "weights": spec.weights,
        **fields,
        "seed": seed,
        "train_seconds": round(figures["wall"], 1),
        "train_cpu_seconds": round(figures["cpu"], 1),
        "load_average": [round(v, 1) for v in figures["load"]],
        "keras_version": keras.__version__,
        "keras_attention_version": keras_attention.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python benchmarks/train_presets.py " + spec.name,
    }
    with open(spec.metadata_path, "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=2)
        f.write("\n")


def train_preset(name, seed=0):
    for recipes, trainer, data in TEXT_PRESETS:
        if name in recipes:
            recipe = recipes[name]
            data = data.format(num_train=recipe["num_train"], seed=seed)
            return train_text_preset(name, seed, trainer, recipe, data)
    spec = presets.get_preset(name)
    (x_train, y_train), (x_test, y_test) = training.digits_for_preset(name)
    model, acc, figures = training.train_image_preset(
        name, x_train, y_train, x_test, y_test, seed=seed, verbose=True
    )
    wall, cpu = figures["wall"], figures["cpu"]
    save_model_weights(model, spec)
    write_metadata(spec, seed, figures, {
        "data": "sklearn.datasets.load_digits via "
        "keras_attention.datasets.load_digits_images(seed=0, test_fraction=0.2, "
        f"image_size={spec.config['image_size']})",
        "recipe": training.IMAGE_RECIPES[name],
        "test_accuracy": round(acc, 4),
    })
    size = os.path.getsize(spec.weights_path) / 1e6
    print(
        f"{name}: test accuracy {acc:.4f}, fit {wall:.0f} s wall / {cpu:.0f} s "
        f"CPU, {spec.weights_path} ({size:.2f} MB)",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", default=list(SHIPPED))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"# {describe()}", flush=True)
    for name in args.names:
        if name not in SHIPPED:
            parser.error(f"{name!r} ships no weights; choose from {sorted(SHIPPED)}")
        train_preset(name, args.seed)


if __name__ == "__main__":
    main()
