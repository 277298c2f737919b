"""The documented training recipes behind `keras-attention run` and `demo`.

Each recipe loads its data (the embedded default, or a folder given by
`--data`), builds the application, trains it with `fit` (XLA, Keras's
progress bar), evaluates it, saves the `.keras` model and draws the
attention pictures. `run` returns a `Result` with the metrics and the files.
"""

import dataclasses
import os
import sys
import time
from typing import Callable

import keras
import numpy as np

from keras_attention._cli_arguments import DEMO_TASKS
from keras_attention._cli_arguments import TASK_MODELS
from keras_attention._run_data import check_causal_lm_text
from keras_attention._run_data import image_data
from keras_attention._run_data import planetoid_name
from keras_attention._run_data import quick_slice
from keras_attention._run_data import translation_test_split
from keras_attention._writing import write_atomically


@dataclasses.dataclass
class Result:
    task: str
    model: str
    metrics: dict
    files: list
    seconds: float
    data: str
    notes: list = dataclasses.field(default_factory=list)
    # CPU time of the process (all threads) while the task ran; on a shared
    # machine it says more about the cost than the wall-clock seconds.
    cpu_seconds: float = None


@dataclasses.dataclass
class Recipe:
    task: str
    models: tuple
    run: Callable
    demo_epochs: int
    quick_epochs: int = 1


def _verbose():
    # The progress bar on a terminal; one line per epoch in logs and CI.
    return 1 if sys.stdout.isatty() else 2


class EpochProgress(keras.callbacks.Callback):
    """One progress bar over a run's epochs, for the short epochs (one
    step each: the whole graph) that Keras would give a bar each: its loss
    and validation figures at every epoch on a terminal, a line every
    tenth of the run in logs. The validation loss shown is what
    `GATEarlyStopping` watches, `val_cross_entropy` (Keras's `val_loss`
    adds the L2 penalty)."""

    shown = ("loss", "val_cross_entropy", "val_accuracy")

    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs
        # Each epoch's own figures (without `stateful_metrics` the bar
        # showed their running means over the epochs so far).
        self.bar = keras.utils.Progbar(
            epochs, verbose=1, unit_name="epoch", stateful_metrics=self.shown,
        )
        self.every = max(1, epochs // 10)

    def on_epoch_end(self, epoch, logs=None):
        values = [(k, float(v)) for k, v in (logs or {}).items()
                  if k in self.shown]
        if sys.stdout.isatty():
            self.bar.update(epoch + 1, values=values)
        elif (epoch + 1) % self.every == 0 or epoch + 1 == self.epochs:
            self._print(epoch, values)
        self.last = (epoch, values)

    def on_train_end(self, logs=None):
        epoch, values = getattr(self, "last", (None, None))
        stopped = epoch is not None and epoch + 1 < self.epochs
        if stopped and not sys.stdout.isatty() and (epoch + 1) % self.every:
            self._print(epoch, values)  # stopped early: its last epoch

    def _print(self, epoch, values):
        shown = " - ".join(f"{k}: {v:.4f}" for k, v in values)
        print(f"epoch {epoch + 1}/{self.epochs} - {shown}", flush=True)


def _save(model, out, name):
    path = os.path.join(out, f"{name}.keras")
    write_atomically(path, model.save, suffix=".keras")
    return path


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def _explore(model, inputs, out, name, **kwargs):
    """The interactive attention page of the trained model (report.html's)."""
    from keras_attention import visualization

    return visualization.explore(
        model, inputs, os.path.join(out, f"{name}_explorer.html"), **kwargs
    )


# Translation -----------------------------------------------------------------


def run_translation(model_name, data, epochs, out, seed, quick=False):
    from keras_attention import visualization
    from keras_attention import applications
    from keras_attention.applications import translation

    start = time.time()
    keras.utils.set_random_seed(seed)
    prefix = "transformer" if model_name == "transformer" else "seq2seq"
    learning_rate = None
    if data is None:
        # The date task fine-tunes the shipped `<model>_dates` weights
        # (`benchmarks/train_presets.py`). Its dates come from the calendar
        # days of the preset's own split (seed 0), so the test dates stay
        # days it never trained on; `seed` draws the model's shuffling.
        size = (2000, 200, 200) if quick else (4000, 300, 300)
        corpus = translation.load_translation_corpus(
            None, num_train=size[0], num_val=size[1], num_test=size[2], seed=0
        )
        preprocessor = translation.date_task_preprocessor()
        preset, data_name = f"{prefix}_dates", "generated dates (embedded)"
        test_split = "test"
        epochs = epochs or 1
        learning_rate = 1e-4
    else:
        corpus = translation.load_translation_corpus(data)
        corpus = quick_slice(corpus) if quick else corpus
        test_split = translation_test_split(corpus, data)  # before training
        sources, targets = corpus["train"]
        preprocessor = applications.TranslationPreprocessor.from_corpus(
            sources, targets, vocabulary_size=8000
        )
        preset, data_name = "small", data
        epochs = epochs or (1 if quick else 10)
    cls = (
        applications.TransformerTranslator
        if model_name == "transformer"
        else applications.Seq2SeqTranslator
    )
    model = cls.from_preset(preset, preprocessor=preprocessor)
    if learning_rate is None:
        model.compile()
    else:
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate, clipnorm=1.0)
        )
    x, y = model.prepare(*corpus["train"])
    validation = model.prepare(*corpus["val"]) if "val" in corpus else None
    model.fit(
        x, y, validation_data=validation, epochs=epochs, batch_size=64,
        verbose=_verbose(),
    )
    sources, references = corpus[test_split]
    sources, references = list(sources)[:500], list(references)[:500]
    metrics = model.evaluate_translations(sources, references)
    files = [_save(model, out, f"translation_{model_name}")]
    examples, maps = model.translate(sources[:3], return_attention=True)
    for i, (text, attention) in enumerate(zip(examples, maps)):
        path = os.path.join(out, f"translation_attention_{i}.png")
        fig = visualization.plot_attention_heatmap(
            attention["weights"],
            attention["source_tokens"],
            attention["target_tokens"],
            title=f"{test_split} sentence {i}: {sources[i]!r} -> {text!r}",
            path=path,
        )
        _close(fig)
        files.append(path)
    files.append(_explore(model, sources[0], out, "translation"))
    notes = [f"metrics on the {test_split!r} split ({len(sources)} sentences)"]
    if data is None:
        notes.insert(0, f"fine-tuned from the shipped {preset} weights")
    notes += [f"{s!r} -> {t!r}" for s, t in zip(sources[:3], examples)]
    return Result(
        "translation", model_name,
        {k: round(float(v), 4) for k, v in metrics.items()},
        files, time.time() - start, data_name, notes,
    )


# Classification --------------------------------------------------------------


def run_classification(model_name, data, epochs, out, seed, quick=False):
    from keras_attention import visualization
    from keras_attention.applications import CBAMResNet, VisionTransformer
    from keras_attention.applications import presets

    start = time.time()
    keras.utils.set_random_seed(seed)
    cls, stem = (
        (VisionTransformer, "vit")
        if model_name == "vit"
        else (CBAMResNet, "cbam_resnet")
    )
    preset = f"{stem}_{'digits' if data is None else 'mnist'}"
    image_size = presets.get_preset(preset).config["image_size"]
    (x_train, y_train), (x_test, y_test), data_name = image_data(
        data, seed, quick, image_size
    )
    model = cls.from_preset(preset, load_weights=False)
    # The applications' default: XLA, but eager on torch (no XLA there).
    model.compile(optimizer=keras.optimizers.Adam(2e-3))
    model.fit(
        x_train, y_train, validation_split=0.1, batch_size=64,
        epochs=epochs or (1 if quick else 30), verbose=_verbose(),
    )
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    files = [_save(model, out, f"classification_{model_name}")]
    images, labels = x_test[:4], y_test[:4]
    predicted = np.argmax(keras.ops.convert_to_numpy(model.predict(images, verbose=0)), -1)
    cams = visualization.grad_cam(model, images)
    rollout = (
        visualization.attention_rollout(model, images) if model_name == "vit" else None
    )
    for i in range(len(images)):
        # The image itself, then each map over it.
        maps = {"Grad-CAM": cams[i]}
        if rollout is not None:
            maps["attention rollout"] = rollout[i]
        path = os.path.join(out, f"classification_gradcam_{i}.png")
        title = f"test image {i}: label {labels[i]}, predicted {predicted[i]}"
        _close(visualization.plot_image_overlay(images[i], maps, title=title, path=path))
        files.append(path)
    files.append(_explore(model, images[:1], out, "classification"))
    return Result(
        "classification", model_name,
        {"accuracy": round(float(accuracy), 4), "loss": round(float(loss), 4)},
        files, time.time() - start, data_name,
        [f"accuracy and loss on the test split ({len(x_test)} images, never "
         "trained on; 10 % of the training images monitored the fit)"],
    )


# Detection -------------------------------------------------------------------


def run_detection(model_name, data, epochs, out, seed, quick=False):
    from keras_attention import datasets, visualization
    from keras_attention import applications
    from keras_attention.applications import detection

    if data is not None:
        raise ValueError(
            "--data: the detection task trains on the generated digit canvases "
            "only (no folder format is read yet)."
        )
    start = time.time()
    keras.utils.set_random_seed(seed)
    sizes = (256, 64) if quick else (2000, 200)
    train = datasets.make_detection_set(sizes[0], seed=seed, digit_split="train")
    test = datasets.make_detection_set(sizes[1], seed=seed + 1000, digit_split="test")
    overrides = {"attention_module": "cbam"} if model_name == "detr_cbam" else {}
    # DETR learns slowly (its classes only after ~10 epochs of the 20-minute
    # recipe), so "detr" fine-tunes the shipped detr_digits weights; the
    # CBAM variant has other weights and trains from scratch.
    pretrained = model_name == "detr"
    model = detection.DETR.from_preset(
        "detr_digits", load_weights=pretrained, **overrides
    )
    epochs = epochs or (1 if quick else (2 if pretrained else 30))
    steps = epochs * -(-len(train.images) // 32)
    peak = 2e-4 if pretrained else 2e-3
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, max(steps - 100, 1), warmup_target=peak, warmup_steps=min(100, steps),
        alpha=0.05,
    )
    model.compile(
        # DETR's default `jit_compile`: XLA where it is faster (not torch's
        # `torch.compile`, nor a half-precision policy on a CPU), saved as
        # a default so that the backend loading the file decides.
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=1e-4, global_clipnorm=1.0),
    )
    model.fit(
        train.images, {"boxes": train.boxes, "labels": train.labels},
        epochs=epochs, batch_size=32, verbose=_verbose(),
    )
    metrics = applications.evaluate_detections(model, test.images, test.boxes, test.labels)
    files = [_save(model, out, f"detection_{model_name}")]
    found = model.predict_boxes(
        test.images[:3], score_threshold=0.5, return_attention=True
    )
    for i, item in enumerate(found):
        path = os.path.join(out, f"detection_{i}.png")
        fig = visualization.plot_detections(
            test.images[i], item["boxes"], item["labels"], item["scores"],
            attention_maps=item["attention"], box_format="xyxy", normalized=False,
            title=f"test canvas {i}", path=path,
        )
        _close(fig)
        files.append(path)
    files.append(_explore(model, test.images[:1], out, "detection"))
    notes = (
        ["fine-tuned from the shipped detr_digits weights (trained by "
         "benchmarks/bench_detection.py)"]
        if pretrained else []
    )
    notes.append(
        f"mAP (COCO's convention, faster-coco-eval) on {len(test.images)} "
        "test canvases, drawn from the digits' test split"
    )
    return Result(
        "detection", model_name,
        {k: round(float(metrics[k]), 4) for k in ("map50", "map") if k in metrics},
        files, time.time() - start, "generated digit canvases 64x64 (embedded)",
        notes,
    )


# Node classification ---------------------------------------------------------


def run_node_classification(model_name, data, epochs, out, seed, quick=False):
    from keras_attention import datasets, visualization
    from keras_attention.applications import node_classification as nc

    start = time.time()
    keras.utils.set_random_seed(seed)
    if data is None:
        graph = datasets.load_karate_club(seed=seed)
        data_name = "Zachary's karate club (networkx, embedded)"
    else:
        folder, name = planetoid_name(data)
        graph = datasets.load_planetoid(folder, name, normalize_features=True)
        data_name = f"{name} ({data})"
    prepared = nc.node_classification_data(graph)
    model = nc.GATNodeClassifier(
        num_features=prepared.inputs[0].shape[-1],
        num_classes=int(np.max(prepared.labels)) + 1,
        version="v2" if model_name == "gatv2" else "v1",
    )
    model.compile()
    epochs = epochs or (5 if quick else 300)
    model.fit(
        prepared.inputs, prepared.labels, sample_weight=prepared.train_weights,
        validation_data=(prepared.inputs, prepared.labels, prepared.val_weights),
        epochs=epochs, verbose=0,
        callbacks=[nc.GATEarlyStopping(patience=100), EpochProgress(epochs)],
    )
    # The compiled accuracy is a weighted metric: the test nodes only.
    accuracy = model.evaluate(
        prepared.inputs, prepared.labels, sample_weight=prepared.test_weights,
        return_dict=True, verbose=0,
    )["accuracy"]
    files = [_save(model, out, f"node_classification_{model_name}")]
    first_layer = model.attention_scores(prepared.inputs)[0]
    edges = visualization_edges(prepared.inputs[1][0], prepared.inputs[0].shape[1])
    if prepared.inputs[0].shape[1] <= 200:  # draw small graphs only
        path = os.path.join(out, "node_classification_attention.png")
        fig = visualization.plot_graph_attention(
            edges, keras.ops.convert_to_numpy(first_layer).mean(-1),
            labels=np.asarray(graph.labels), num_nodes=prepared.inputs[0].shape[1],
            title="first layer (mean of heads), every node (train, val, test)",
            path=path,
        )
        _close(fig)
        files.append(path)
    files.append(
        _explore(
            model, prepared.inputs, out, "node_classification",
            node_labels=np.asarray(graph.labels),
        )
    )
    test_nodes = int(np.count_nonzero(prepared.test_weights))
    return Result(
        "node-classification", model_name,
        {"test_accuracy": round(float(accuracy), 4)},
        files, time.time() - start, data_name,
        [f"test_accuracy on the test split ({test_nodes} nodes, never "
         "trained on)"],
    )


# Masked-LM pretraining ---------------------------------------------------------


def run_pretraining(model_name, data, epochs, out, seed, quick=False):
    """BERT's recipe (`training.pretraining.run_recipe`)."""
    from keras_attention.training import pretraining

    start = time.time()
    metrics, files, data_name = pretraining.run_recipe(
        data, epochs, out, seed, quick=quick, verbose=_verbose(),
        name=f"pretraining_{model_name}",
    )
    return Result(
        "pretraining", model_name, metrics, files, time.time() - start, data_name,
    )


def visualization_edges(edges, num_nodes):
    """The edge list the coefficients refer to (self loops appended)."""
    from keras_attention.layers.graph import with_self_loops

    return keras.ops.convert_to_numpy(with_self_loops(edges, num_nodes))


# Causal language model -------------------------------------------------------


def run_causal_lm(model_name, data, epochs, out, seed, quick=False):
    from keras_attention import datasets, training, visualization
    from keras_attention.applications import CausalLM

    start = time.time()
    keras.utils.set_random_seed(seed)
    recipe = dict(training.CAUSAL_LM_RECIPES["causal_lm_dates"])
    # "rope" on the date lines fine-tunes the shipped causal_lm_dates
    # weights (trained by benchmarks/train_presets.py); the rest train
    # from scratch.
    pretrained = data is None and model_name == "rope"
    if data is None:
        lines = 2000 if quick else (4000 if pretrained else recipe["num_train"])
        # Fine-tuning, the calendar days of the preset's own split (seed 0),
        # so that its validation and test days are days it never trained
        # on (other seeds split the days another way); `seed` still draws
        # the weights' shuffling.
        corpus = datasets.load_text_corpus(
            num_train=lines, seed=0 if pretrained else seed
        )
        data_name = "date lines '<date> = <ISO date>' (embedded)"
    else:
        corpus, data_name = datasets.load_text_corpus(data), data
        corpus = quick_slice(corpus) if quick else corpus
        check_causal_lm_text(corpus, data, recipe["sequence_length"], quick)
    model = CausalLM.from_preset(
        "causal_lm_dates", load_weights=pretrained,
        position_encoding="alibi" if model_name == "alibi" else "rope",
    )
    recipe.update(
        epochs=epochs or (1 if quick or pretrained else recipe["epochs"]),
        learning_rate=3e-4 if pretrained else recipe["learning_rate"],
    )
    recipe.pop("num_train")
    training.fit_causal_lm(
        model, corpus["train"], validation_text=corpus["val"],
        verbose=_verbose(), **recipe,
    )
    x_val, y_val = model.preprocessor.sequences(
        corpus["val"], recipe["sequence_length"]
    )
    loss = model.evaluate(x_val, y_val, verbose=0, return_dict=True)["loss"]
    metrics = {"val_bits_per_char": round(float(loss / np.log(2)), 4)}
    prompts = ["14 july 1989 = ", "march 3rd, 2001 = ", "the 2nd of may 1977 = "]
    if data is None:
        metrics["date_accuracy"] = round(
            training.date_completion_accuracy(model, corpus["test"], 100), 4
        )
    else:
        prompts = [corpus["val"][:40]]
    files = [_save(model, out, f"causal_lm_{model_name}")]
    texts = model.generate_text(prompts, max_length=80)
    ids = model.preprocessor.encode(texts[0])[None]
    maps = visualization.attention_maps(model, ids)
    # Characters as labels, a space and a line end visible.
    tokens = ["\u2423" if c == " " else repr(c)[1:-1] for c in texts[0]]
    for i, (name, weights) in enumerate(maps.items()):
        path = os.path.join(out, f"causal_lm_attention_{i}.png")
        _close(visualization.plot_attention_heatmap(
            weights[0], tokens, tokens,
            title=f"{name} (mean of heads), generated text",
            path=path, xlabel="key (earlier characters)", ylabel="query",
        ))
        files.append(path)
    files.append(_explore(model, ids, out, "causal_lm", tokens=tokens))
    notes = [f"val_bits_per_char: the next-character predictions of "
             f"{y_val.size} characters of the {len(corpus['val'])}-character "
             f"validation text (windows of {recipe['sequence_length']}, not "
             "overlapping; the rest of the text is not scored)"]
    if data is None:
        notes.append("date_accuracy: greedy completions of 100 test lines "
                     "(calendar days never trained on)")
    notes += [f"generated (greedy, cached): {t!r}" for t in texts]
    if pretrained:
        notes.insert(0, "fine-tuned from the shipped causal_lm_dates weights")
    return Result(
        "causal-lm", model_name, metrics, files, time.time() - start,
        data_name, notes,
    )


TASKS = {
    "translation": Recipe(
        "translation", TASK_MODELS["translation"], run_translation, demo_epochs=1
    ),
    "classification": Recipe(
        "classification", TASK_MODELS["classification"], run_classification,
        demo_epochs=8,
    ),
    "detection": Recipe(
        "detection", TASK_MODELS["detection"], run_detection, demo_epochs=2
    ),
    "node-classification": Recipe(
        "node-classification", TASK_MODELS["node-classification"],
        run_node_classification, demo_epochs=200, quick_epochs=5,
    ),
    "causal-lm": Recipe(
        "causal-lm", TASK_MODELS["causal-lm"], run_causal_lm, demo_epochs=1
    ),
    "pretraining": Recipe(
        "pretraining", TASK_MODELS["pretraining"], run_pretraining, demo_epochs=10
    ),
}
DEMO_ORDER = [t for t in DEMO_TASKS if t in TASKS]
