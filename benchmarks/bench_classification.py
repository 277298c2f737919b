"""Image and text classification benchmarks of the applications.

Tasks (`--tasks`, any of):

- `digits`: VisionTransformer and CBAMResNet (their `*_digits` preset
  configurations, trained from scratch) on scikit-learn's 8x8 digits,
  stratified 80/20 split (seed 0); test accuracy and training time.
- `ablation`: CBAMResNet with each attention module (`cbam`, `channel`,
  `spatial`, `non_local`) and without (`None`), same recipe.
- `mnist`: both image models on the MNIST test set read from `--mnist`
  (first 8,000 images to train, last 2,000 to test).
- `finetune`: the shipped `vit_digits` / `cbam_resnet_digits` weights,
  backbone frozen, a new 2-class head (digits 0-4 vs 5-9), one epoch.
- `text`: TextClassifier on the generated sentiment task; accuracy and the
  share of pooling weight on the tokens that decide the class.

    python benchmarks/bench_classification.py --tasks digits ablation finetune

Times are wall-clock seconds of `fit` (compilation included) and the
process's CPU seconds; the load average is printed, as the machine may be
shared.
"""

import argparse
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_attention import datasets  # noqa: E402
from keras_attention.applications import presets  # noqa: E402
from keras_attention.applications.cbam_resnet import CBAMResNet  # noqa: E402
from keras_attention.applications.vision_transformer import VisionTransformer  # noqa: E402

MODELS = {"vit": VisionTransformer, "cbam_resnet": CBAMResNet}

# Training recipes, by preset name: AdamW with a cosine decay, random
# shifts of up to `shift` pixels (zero fill) as the only augmentation.
RECIPES = {
    "vit_digits": dict(
        epochs=60, batch_size=64, learning_rate=2e-3, weight_decay=0.05, shift=1
    ),
    "cbam_resnet_digits": dict(
        epochs=20, batch_size=64, learning_rate=3e-3, weight_decay=1e-4, shift=1
    ),
    "vit_mnist": dict(
        epochs=25, batch_size=64, learning_rate=2e-3, weight_decay=0.05, shift=2
    ),
    "cbam_resnet_mnist": dict(
        epochs=10, batch_size=64, learning_rate=3e-3, weight_decay=1e-4, shift=2
    ),
}


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def random_shift(images, max_shift, rng):
    """Each image moved by up to `max_shift` pixels, zeros shifted in."""
    if not max_shift:
        return images
    n, h, w, _ = images.shape
    padded = np.pad(
        images, [(0, 0), (max_shift, max_shift), (max_shift, max_shift), (0, 0)]
    )
    dy, dx = rng.integers(0, 2 * max_shift + 1, size=(2, n))
    rows = dy[:, None] + np.arange(h)[None]  # (N, H)
    cols = dx[:, None] + np.arange(w)[None]
    return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def train(
    model,
    x_train,
    y_train,
    epochs,
    batch_size,
    learning_rate,
    weight_decay,
    shift=0,
    seed=0,
    verbose=False,
):
    """Fits `model` with the recipe; returns (wall seconds, CPU seconds)."""
    steps = epochs * int(np.ceil(len(x_train) / batch_size))
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, steps)
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=weight_decay),
        jit_compile=True,
    )
    rng = np.random.default_rng(seed)
    start, cpu = time.perf_counter(), cpu_seconds()
    for epoch in range(epochs):
        history = model.fit(
            random_shift(x_train, shift, rng),
            y_train,
            batch_size=batch_size,
            epochs=1,
            shuffle=True,
            verbose=0,
        )
        if verbose and (epoch + 1) % 10 == 0:
            print(
                f"  epoch {epoch + 1}: loss {history.history['loss'][-1]:.4f}",
                flush=True,
            )
    return time.perf_counter() - start, cpu_seconds() - cpu


def accuracy(model, x, y):
    logits = model.predict(x, batch_size=256, verbose=0)
    return float((np.argmax(logits, -1) == y).mean())


def load_digits_for(preset):
    """The digits split (seed 0, 20 % test), resized to the preset's input."""
    size = presets.get_preset(preset).config["image_size"]
    return datasets.load_digits_images(seed=0, image_size=None if size == 8 else size)


def run_image(kind, preset, x_train, y_train, x_test, y_test, seed=0, **overrides):
    keras.utils.set_random_seed(seed)
    model = MODELS[kind].from_preset(preset, load_weights=False, **overrides)
    wall, cpu = train(model, x_train, y_train, seed=seed, **RECIPES[preset])
    return model, accuracy(model, x_test, y_test), wall, cpu


def digits_task(args):
    for kind in ("vit", "cbam_resnet"):
        (x_train, y_train), (x_test, y_test) = load_digits_for(f"{kind}_digits")
        print(
            f"digits: {len(x_train)} train / {len(x_test)} test images of "
            f"{x_train.shape[1]}x{x_train.shape[2]}"
        )
        _, acc, wall, cpu = run_image(
            kind, f"{kind}_digits", x_train, y_train, x_test, y_test
        )
        print(
            f"digits {kind}: test accuracy {acc:.4f}; fit {wall:.0f} s wall, "
            f"{cpu:.0f} s CPU",
            flush=True,
        )


def ablation_task(args):
    (x_train, y_train), (x_test, y_test) = load_digits_for("cbam_resnet_digits")
    rows = []
    for attention in ("cbam", "channel", "spatial", "non_local", None):
        accuracies, walls = [], []
        for seed in range(args.seeds):
            model, acc, wall, _ = run_image(
                "cbam_resnet",
                "cbam_resnet_digits",
                x_train,
                y_train,
                x_test,
                y_test,
                seed=seed,
                attention=attention,
            )
            accuracies.append(acc)
            walls.append(wall)
        rows.append((attention, model.count_params(), accuracies, np.mean(walls)))
        print(
            f"ablation {attention}: accuracies {accuracies}, fit "
            f"{np.mean(walls):.0f} s",
            flush=True,
        )
    print("\n| attention | parameters | test accuracy (mean over seeds) | fit s |")
    print("|---|---|---|---|")
    for attention, params, accuracies, wall in rows:
        print(
            f"| {attention} | {params:,} | {np.mean(accuracies):.4f} "
            f"({', '.join(f'{a:.4f}' for a in accuracies)}) | {wall:.0f} |"
        )


def mnist_task(args):
    (x_train, y_train), (x_test, y_test) = datasets.load_mnist_t10k_split(args.mnist)
    print(f"mnist: {len(x_train)} train / {len(x_test)} test images of 28x28")
    for kind in ("vit", "cbam_resnet"):
        _, acc, wall, cpu = run_image(
            kind, f"{kind}_mnist", x_train, y_train, x_test, y_test
        )
        print(
            f"mnist {kind}: test accuracy {acc:.4f}; fit {wall:.0f} s wall, "
            f"{cpu:.0f} s CPU",
            flush=True,
        )


def finetune_task(args):
    for kind in ("vit", "cbam_resnet"):
        (x_train, y_train), (x_test, y_test) = load_digits_for(f"{kind}_digits")
        binary_train = (y_train >= 5).astype("int32")
        binary_test = (y_test >= 5).astype("int32")
        keras.utils.set_random_seed(0)
        model = MODELS[kind].from_preset(f"{kind}_digits", num_classes=2)
        model.backbone.trainable = False
        model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=True)
        start = time.perf_counter()
        model.fit(x_train, binary_train, batch_size=32, epochs=1, verbose=0)
        wall = time.perf_counter() - start
        print(
            f"finetune {kind}_digits (frozen backbone, new 2-class head, 1 "
            f"epoch): test accuracy {accuracy(model, x_test, binary_test):.4f}; "
            f"{len(model.trainable_weights)} trainable tensors; fit {wall:.0f} s",
            flush=True,
        )


def text_task(args):
    from keras_attention.applications.text_classifier import TextClassifier
    from keras_attention.applications.text_classifier import TextClassifierPreprocessor

    texts, labels, keys = datasets.make_sentiment_task(
        4000, seed=0, return_key_positions=True
    )
    test_texts, test_labels, test_keys = datasets.make_sentiment_task(
        1000, seed=1, return_key_positions=True
    )
    keras.utils.set_random_seed(0)
    preprocessor = TextClassifierPreprocessor.from_texts(
        texts, vocabulary_size=512, sequence_length=32
    )
    model = TextClassifier.from_preset(
        "text_sentiment_small", preprocessor=preprocessor
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True)
    start = time.perf_counter()
    model.fit(preprocessor(texts), labels, batch_size=64, epochs=10, verbose=0)
    wall = time.perf_counter() - start
    ids = preprocessor(test_texts)
    acc = accuracy(model, ids, test_labels)
    weights = model.token_weights(ids)
    # Whole words only: a key position counts when the word is one piece.
    on_keys, uniform = [], []
    for row, text, key in zip(weights, test_texts, test_keys):
        words = text.split(" ")
        if len(preprocessor.tokens([text])[0]) != len(words):
            continue
        on_keys.append(row[key].sum())
        uniform.append(len(key) / len(words))
    print(
        f"text: test accuracy {acc:.4f}; pooling weight on the deciding "
        f"tokens {np.mean(on_keys):.3f} (uniform would give "
        f"{np.mean(uniform):.3f}, {len(on_keys)} sentences); fit {wall:.0f} s",
        flush=True,
    )


TASKS = {
    "digits": digits_task,
    "ablation": ablation_task,
    "mnist": mnist_task,
    "finetune": finetune_task,
    "text": text_task,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["digits", "ablation", "finetune"])
    parser.add_argument("--mnist", default="/work/shared/data/mnist_t10k")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of the ablation")
    args = parser.parse_args()
    for task in args.tasks:
        if task not in TASKS:
            parser.error(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    start, cpu, load = time.perf_counter(), cpu_seconds(), os.getloadavg()[0]
    for task in args.tasks:
        TASKS[task](args)
    print(
        f"total: {time.perf_counter() - start:.0f} s wall, "
        f"{cpu_seconds() - cpu:.0f} s CPU; load average {load:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end ({os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
