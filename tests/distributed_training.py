"""Train every application on one device and under `MirroredStrategy`.

Run by `tests/test_distributed.py` in a subprocess, because TensorFlow's
logical devices must be configured before TensorFlow initialises:

    python tests/distributed_training.py OUT.json [APPLICATION ...]

The CPU is split into two logical devices; for each application the same
model (same initial weights) trains the same steps with plain SGD (so a
wrong gradient scale shows, which Adam would hide) once on the default
strategy and once under `tf.distribute.MirroredStrategy` over both devices.
The losses and final weights of both runs go to OUT.json.

One `MirroredStrategy` serves every application: two instances in one
process may reuse collective instance keys and abort each other.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _CPU, [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_attention import applications  # noqa: E402

REPLICAS = 2


def synchronize_batch_norm(model):
    """Batch statistics over the global batch, not each replica's share."""
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = True


def image_data(n=8, size=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, size, size, 1)).astype("float32")
    y = (np.arange(n) % 3).astype("int32")
    x[np.arange(n), y * 2, :, :] += 1.0
    return dict(x=x, y=y, batch_size=n)


def vision_transformer():
    model = applications.VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
        num_heads=2, mlp_dim=32, num_channels=1,
    )
    return model, image_data()


def cbam_resnet():
    model = applications.CBAMResNet(
        image_size=8, num_channels=1, num_classes=3, filters=(8, 16)
    )
    return model, image_data()


def text_classifier():
    model = applications.TextClassifier(
        vocabulary_size=40, sequence_length=8, num_classes=2, hidden_dim=16,
        depth=1, num_heads=2, mlp_dim=16, dropout=0.0, pooling_units=8,
    )
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 40, size=(8, 8)).astype("int32")
    ids[::2, 5:] = 0  # padding, in both replicas' halves
    y = (ids[:, 0] % 2).astype("int32")
    return model, dict(x=ids, y=y, batch_size=8)


def gat_node_classifier():
    rng = np.random.default_rng(2)
    nodes, features = 9, 5
    x = rng.normal(size=(1, nodes, features)).astype("float32")
    edges = rng.integers(0, nodes, size=(1, 2, 24)).astype("int32")
    labels = (np.arange(nodes) % 2).astype("int32")[None]
    weights = np.ones((1, nodes), "float32")
    weights[0, ::3] = 0.0  # unlabelled nodes
    model = applications.GATNodeClassifier(
        num_features=features, num_classes=2, hidden_units=4, num_heads=2,
        dropout=0.0, weight_decay=5e-3,
    )
    single = dict(x=[x, edges], y=labels, sample_weight=weights, batch_size=1)
    # The model takes a batch of one graph, and `fit` checks the global
    # batch of arrays: a dataset of batches of one copy per replica passes.
    copies = tf.data.Dataset.from_tensors(((x[0], edges[0]), labels[0], weights[0]))
    copies = dict(x=copies.repeat(REPLICAS).batch(REPLICAS), y=None)
    return model, single, copies


def _translation_data(model):
    # Words of one length: each replica's half has as many target tokens as
    # the other, so per-replica token means average to the global mean.
    rng = np.random.default_rng(3)
    words = ["".join(rng.choice(list("abcdefgh"), size=3)) for _ in range(8)]
    x, y = model.prepare(words, words)
    return dict(x=x, y=y, batch_size=8)


def _translation_preprocessor():
    return applications.TranslationPreprocessor(source_length=4, target_length=5)


def seq2seq_translator():
    model = applications.Seq2SeqTranslator(
        _translation_preprocessor(), embedding_dim=8, hidden_dim=8
    )
    return model, _translation_data(model)


def transformer_translator():
    model = applications.TransformerTranslator(
        _translation_preprocessor(), num_layers=1, hidden_dim=16, num_heads=2,
        intermediate_dim=16, dropout=0.0,
    )
    return model, _translation_data(model)


def detr():
    model = applications.DETR(
        num_classes=3, num_queries=4, hidden_dim=16, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, feedforward_dim=16,
        backbone_filters=(8,),
    )
    rng = np.random.default_rng(4)
    n, size = 8, 16
    images = rng.random((n, size, size, 1)).astype("float32") * 0.1
    boxes = np.zeros((n, 3, 4), "float32")
    labels = np.full((n, 3), -1, "int32")
    for i in range(n):
        # 0..3 objects per image: 6 in each replica's half of the batch.
        for j in range(i % 4):
            top, left = 1 + 5 * j, int(rng.integers(0, size - 4))
            labels[i, j] = int(rng.integers(3))
            images[i, top:top + 4, left:left + 4, 0] = (labels[i, j] + 1) / 3
            boxes[i, j] = [(left + 2) / size, (top + 2) / size, 0.25, 0.25]
    return model, dict(x=images, y={"boxes": boxes, "labels": labels}, batch_size=n)


APPLICATIONS = {
    "VisionTransformer": (vision_transformer, 0.05),
    "CBAMResNet": (cbam_resnet, 0.05),
    "TextClassifier": (text_classifier, 0.05),
    "GATNodeClassifier": (gat_node_classifier, 0.05),
    "Seq2SeqTranslator": (seq2seq_translator, 0.5),
    "TransformerTranslator": (transformer_translator, 0.05),
    "DETR": (detr, 0.001),
}
EPOCHS = 2


def first_item(x):
    """The first example of a batch (arrays, lists or dicts of arrays)."""
    if isinstance(x, dict):
        return {k: v[:1] for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [v[:1] for v in x]
    return x[:1]


def train(name, strategy, initial_weights=None):
    """`(initial weights, final weights, losses)` of EPOCHS epochs under strategy.

    The initial weights are the model's own unless `initial_weights` is given.
    """
    build, learning_rate = APPLICATIONS[name]
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, *data = build()
        model(first_item(data[0]["x"]), training=False)  # variables in scope
        # CBAMResNet and DETR normalise batches: with synchronized statistics
        # a replica normalises as one device does (Keras's default is each
        # replica's own share of the batch).
        synchronize_batch_norm(model)
        if initial_weights is not None:
            model.set_weights(initial_weights)
        initial_weights = model.get_weights()
        # XLA cannot compile a step whose variables live on several logical
        # CPU devices ("tfvariable_on_a_different_device"), so both runs
        # are traced without it.
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate), jit_compile=False
        )
    data = data[0] if strategy.num_replicas_in_sync == 1 else data[-1]
    fit_kwargs = dict(data)
    x, y = fit_kwargs.pop("x"), fit_kwargs.pop("y")
    history = model.fit(
        x, y, epochs=EPOCHS, shuffle=False, verbose=0, **fit_kwargs
    )
    return initial_weights, model.get_weights(), history.history["loss"]


def main(out_path, names):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == REPLICAS
    results = {}
    for name in names:
        start = time.time()
        initial, single, single_loss = train(name, tf.distribute.get_strategy())
        middle = time.time()
        _, replicated, replicated_loss = train(name, mirrored, initial)
        results[name] = dict(
            initial=[w.tolist() for w in initial],
            single=[w.tolist() for w in single],
            mirrored=[w.tolist() for w in replicated],
            single_loss=single_loss,
            mirrored_loss=replicated_loss,
            seconds=[middle - start, time.time() - middle],
        )
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(APPLICATIONS))
