"""The recipes of the image classification presets (`vit_digits`, ...).

AdamW with a cosine decay and random shifts of up to `shift` pixels (zero
fill) as the only augmentation; `fit_image_classifier` runs one and can stop
at a CPU-time budget. `benchmarks/train_presets.py` trains the shipped
weights with them and `benchmarks/bench_classification.py` measures them.
"""

import os
import time

import keras
import numpy as np

from keras_attention.training.budget import cpu_seconds

# Training recipes, by preset name.
IMAGE_RECIPES = {
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


def fit_image_classifier(
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
    cpu_budget=None,
):
    """Compiles and fits `model` with a recipe; returns the run's figures.

    With `cpu_budget` (CPU seconds), training stops before an epoch that
    would, at the pace of the last epoch, end past the budget; the returned
    `epochs_run` says how many epochs ran (compilation counts: it is part of
    the first epoch's time).

    Returns:
        A dict: `wall` and `cpu` seconds of the fit, `epochs_run`, `epochs`,
        `load` (load average before and after).
    """
    from keras_attention.applications.compiling import DefaultJitCompile
    from keras_attention.applications.compiling import xla_slower_here

    steps = epochs * int(np.ceil(len(x_train) / batch_size))
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, steps)
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=weight_decay),
        # XLA where it is faster (not torch's `torch.compile`, nor a
        # half-precision policy on a CPU): the applications' default, saved
        # as one (`None`) so that the backend loading the file decides.
        jit_compile=None if isinstance(model, DefaultJitCompile)
        else not xla_slower_here(model),
    )
    rng = np.random.default_rng(seed)
    start, cpu, load = time.perf_counter(), cpu_seconds(), os.getloadavg()[0]
    epochs_run, last_epoch_cpu = 0, 0.0
    for epoch in range(epochs):
        used = cpu_seconds() - cpu
        if cpu_budget is not None and used + last_epoch_cpu > cpu_budget:
            print(
                f"  CPU budget: stopping after {epochs_run} of {epochs} epochs "
                f"({used:.0f} of {cpu_budget:.0f} CPU s used)",
                flush=True,
            )
            break
        epoch_start = cpu_seconds()
        history = model.fit(
            random_shift(x_train, shift, rng),
            y_train,
            batch_size=batch_size,
            epochs=1,
            shuffle=True,
            verbose=0,
        )
        last_epoch_cpu = cpu_seconds() - epoch_start
        epochs_run += 1
        if verbose and (epoch + 1) % 10 == 0:
            print(
                f"  epoch {epoch + 1}: loss {history.history['loss'][-1]:.4f}, "
                f"{time.perf_counter() - start:.0f} s, "
                f"{cpu_seconds() - cpu:.0f} CPU s",
                flush=True,
            )
    return dict(
        wall=time.perf_counter() - start,
        cpu=cpu_seconds() - cpu,
        epochs_run=epochs_run,
        epochs=epochs,
        load=(load, os.getloadavg()[0]),
    )


def digits_for_preset(preset):
    """scikit-learn's digits split (seed 0, 20 % test) at the preset's size."""
    from keras_attention import datasets
    from keras_attention.applications import presets

    size = presets.get_preset(preset).config["image_size"]
    return datasets.load_digits_images(seed=0, image_size=None if size == 8 else size)


def accuracy(model, x, y):
    """The fraction of `x` whose largest logit is at the label `y`."""
    logits = model.predict(x, batch_size=256, verbose=0)
    return float((np.argmax(logits, -1) == y).mean())


def train_image_preset(
    preset,
    x_train,
    y_train,
    x_test,
    y_test,
    seed=0,
    cpu_budget=None,
    verbose=False,
    **overrides,
):
    """Trains the configuration of `preset` from scratch with its recipe.

    Returns `(model, test accuracy, figures)`, figures as
    `fit_image_classifier` returns them.
    """
    from keras_attention import applications
    from keras_attention.applications import presets

    keras.utils.set_random_seed(seed)
    cls = getattr(applications, presets.get_preset(preset).class_name)
    model = cls.from_preset(preset, load_weights=False, **overrides)
    figures = fit_image_classifier(
        model,
        x_train,
        y_train,
        seed=seed,
        cpu_budget=cpu_budget,
        verbose=verbose,
        **IMAGE_RECIPES[preset],
    )
    return model, accuracy(model, x_test, y_test), figures
