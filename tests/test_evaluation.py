"""Every reported metric counts what its name says (issue: the GAT figures).

Keras 3 updates `metrics=` without `sample_weight`, so an accuracy there
counts every example even when `evaluate` is given the weights of one split.
Each test compares what `evaluate` returns with the same number computed by
hand on the split (or on the non-padding tokens), on data where the wrong
number would differ.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_attention.applications import presets  # noqa: E402
from keras_attention.applications.node_classification import (  # noqa: E402
    GATNodeClassifier,
    node_classification_data,
)
from keras_attention.applications.translation_metrics import TokenAccuracy  # noqa: E402
from keras_attention.applications.translation_metrics import (  # noqa: E402
    TokenCrossEntropy,
)
from keras_attention.datasets import load_karate_club  # noqa: E402


def numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def karate():
    return node_classification_data(load_karate_club(seed=0, num_train_per_class=4))


def split_accuracy(model, data, weights):
    predicted = numpy(model(data.inputs, training=False))[0].argmax(-1)
    mask = weights[0] > 0
    return float(np.mean(predicted[mask] == data.labels[0][mask]))


def test_gat_evaluate_counts_the_test_nodes_only(karate):
    keras.utils.set_random_seed(3)
    model = GATNodeClassifier(num_features=34, num_classes=2, hidden_units=4, num_heads=2)
    model.compile(jit_compile=False)
    model.fit(
        karate.inputs, karate.labels, sample_weight=karate.train_weights,
        epochs=3, verbose=0,
    )
    predicted = numpy(model(karate.inputs, training=False))[0].argmax(-1)
    every_node = float(np.mean(predicted == karate.labels[0]))
    for weights in (karate.test_weights, karate.val_weights, karate.train_weights):
        by_hand = split_accuracy(model, karate, weights)
        logs = model.evaluate(
            karate.inputs, karate.labels, sample_weight=weights,
            return_dict=True, verbose=0,
        )
        assert logs["accuracy"] == pytest.approx(by_hand, abs=1e-6)
    # The test can fail: on this graph the all-node figure is another number.
    assert every_node != pytest.approx(split_accuracy(model, karate, karate.test_weights))


def test_gat_validation_accuracy_in_fit_counts_the_validation_nodes(karate):
    keras.utils.set_random_seed(1)
    model = GATNodeClassifier(num_features=34, num_classes=2, hidden_units=4, num_heads=2)
    model.compile(jit_compile=False)

    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((logs["val_accuracy"], split_accuracy(model, karate, karate.val_weights)))

    model.fit(
        karate.inputs, karate.labels, sample_weight=karate.train_weights,
        validation_data=(karate.inputs, karate.labels, karate.val_weights),
        epochs=3, verbose=0, callbacks=[Record()],
    )
    for logged, by_hand in seen:
        assert logged == pytest.approx(by_hand, abs=1e-6)


def test_gat_validation_cross_entropy_is_the_mean_over_validation_nodes(karate):
    # The loss of the paper's early stopping: the validation nodes' mean
    # cross-entropy, without the L2 penalty, which Keras's `val_loss` adds
    # (to the same mean: the split's weights have mean 1 over the nodes).
    keras.utils.set_random_seed(2)
    model = GATNodeClassifier(
        num_features=34, num_classes=2, hidden_units=4, num_heads=2,
        weight_decay=0.05,
    )
    model.compile(jit_compile=False)
    logs = model.evaluate(
        karate.inputs, karate.labels, sample_weight=karate.val_weights,
        return_dict=True, verbose=0,
    )
    logits = numpy(model(karate.inputs, training=False))[0].astype("float64")
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    mask = karate.val_weights[0] > 0
    picked = -log_p[np.arange(len(logits)), karate.labels[0]]
    by_hand = float(picked[mask].mean())
    assert logs["cross_entropy"] == pytest.approx(by_hand, rel=1e-5)
    # The figure Keras logs: the same mean plus the penalty, 0.05 / 2 of
    # every kernel's and attention vector's squared norm.
    penalty = sum(float(numpy(loss)) for loss in model.losses)
    assert penalty > 0.01
    assert logs["loss"] == pytest.approx(by_hand + penalty, rel=1e-5)


def test_classifier_accuracy_honours_sample_weight():
    from keras_attention.applications import VisionTransformer

    keras.utils.set_random_seed(0)
    model = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
        num_heads=2, mlp_dim=32, num_channels=1,
    )
    model.compile(jit_compile=False)
    rng = np.random.default_rng(0)
    x = rng.random((40, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, 40).astype("int32")
    weights = np.zeros(40, "float32")
    weights[:13] = 1.0
    predicted = numpy(model(x, training=False)).argmax(-1)
    by_hand = float(np.mean(predicted[:13] == y[:13]))
    logs = model.evaluate(
        x, y, sample_weight=weights, batch_size=16, return_dict=True, verbose=0
    )
    assert logs["accuracy"] == pytest.approx(by_hand, abs=1e-6)
    assert float(np.mean(predicted == y)) != pytest.approx(by_hand)
    # Without weights it is the plain accuracy.
    logs = model.evaluate(x, y, batch_size=16, return_dict=True, verbose=0)
    assert logs["accuracy"] == pytest.approx(float(np.mean(predicted == y)), abs=1e-6)


def test_token_accuracy_counts_tokens_across_batches():
    # Batch 1: two sentences, 4 real tokens of which 3 are right.
    # Batch 2: one sentence, 1 real token, wrong. Tokens: 3 / 5 = 0.6;
    # the mean of the two batch ratios would be (0.75 + 0) / 2 = 0.375.
    y_true = np.array([[2, 3, 0], [4, 5, 0], [3, 0, 0]], "int32")
    guesses = np.array([[2, 3, 1], [4, 1, 2], [5, 4, 4]], "int32")
    y_pred = np.eye(6, dtype="float32")[guesses]
    metric = TokenAccuracy()
    metric.update_state(y_true[:2], y_pred[:2])
    metric.update_state(y_true[2:], y_pred[2:])
    assert float(metric.result()) == pytest.approx(0.6)
    # Per-sentence weights: only the first sentence (2 of 2 right) counts.
    weighted = TokenAccuracy()
    weighted.update_state(y_true, y_pred, sample_weight=np.array([1.0, 0.0, 0.0]))
    assert float(weighted.result()) == pytest.approx(1.0)
    restored = TokenAccuracy.from_config(metric.get_config())
    assert restored.padding_id == 0 and restored.name == "token_accuracy"


def test_translator_evaluate_equals_hand_count():
    from keras_attention.applications import TransformerTranslator
    from keras_attention.applications import TranslationPreprocessor

    keras.utils.set_random_seed(0)
    model = TransformerTranslator(
        TranslationPreprocessor(source_length=8, target_length=8),
        num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, dropout=0.0,
    )
    model.compile(jit_compile=False)
    words = ["abc", "h", "gfedcba", "de", "abcdefg"]
    x, labels = model.prepare(words, words)
    predicted = numpy(model(x, training=False)).argmax(-1)
    labels = numpy(labels)
    real = labels != 0
    by_hand = float(np.sum((predicted == labels) & real) / np.sum(real))
    # Batches of 2, 2 and 1 sentences with different padding.
    logs = model.evaluate(x, labels, batch_size=2, return_dict=True, verbose=0)
    assert logs["token_accuracy"] == pytest.approx(by_hand, abs=1e-6)
    # The cross-entropy per real token, by hand (Keras's `loss` is a mean
    # of the three batches' means, weighted 2 : 2 : 1 by sentences).
    logits = numpy(model(x, training=False)).astype("float64")
    logits -= logits.max(-1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
    token_loss = float(picked[real].mean())
    assert logs["token_loss"] == pytest.approx(token_loss, rel=1e-4)
    per_batch = [picked[i : i + 2][real[i : i + 2]].mean() for i in (0, 2, 4)]
    batch_mean = float(np.average(per_batch, weights=[2, 2, 1]))
    assert abs(batch_mean - token_loss) > 1e-3  # the two differ here
    assert logs["loss"] == pytest.approx(batch_mean, rel=1e-4)


def test_token_cross_entropy_counts_tokens_and_weights():
    y_true = np.array([[2, 1, 0], [1, 0, 0]], "int32")
    probs = np.full((2, 3, 3), 1 / 3, "float32")
    probs[0, 0] = [0.1, 0.1, 0.8]
    metric = TokenCrossEntropy(from_logits=False)
    metric.update_state(y_true[:1], probs[:1])
    metric.update_state(y_true[1:], probs[1:])
    expected = (-np.log(0.8) - 2 * np.log(1 / 3)) / 3
    assert float(metric.result()) == pytest.approx(expected, rel=1e-5)
    weighted = TokenCrossEntropy(from_logits=False)
    weighted.update_state(y_true, probs, sample_weight=np.array([0.0, 1.0]))
    assert float(weighted.result()) == pytest.approx(np.log(3), rel=1e-5)
    restored = TokenCrossEntropy.from_config(metric.get_config())
    assert restored.from_logits is False and restored.name == "token_loss"


def test_detr_loss_terms_are_weighted_by_images():
    from keras_attention.applications.detection import DETR
    from tests.test_detection import TINY, tiny_data

    keras.utils.set_random_seed(0)
    model = DETR(**TINY)
    model.compile(optimizer="adam", jit_compile=False)
    images, boxes, labels = tiny_data(3)
    logs = model.evaluate(
        images, {"boxes": boxes, "labels": labels}, batch_size=2,
        return_dict=True, verbose=0,
    )
    # By hand: the last decoder layer's class loss of each batch, weighed
    # by its number of images (2, then 1), as Keras weighs `loss`.
    terms = []
    for batch in (slice(0, 2), slice(2, 3)):
        y = model.validate_targets({"boxes": boxes[batch], "labels": labels[batch]})
        _, last = model._loss_terms(y, model(images[batch], training=False))
        terms.append(float(last["class_loss"]))
    expected = (2 * terms[0] + terms[1]) / 3
    assert logs["class_loss"] == pytest.approx(expected, rel=1e-5)
    assert np.mean(terms) != pytest.approx(expected, rel=1e-5)


def test_node_classification_recipe_reports_the_test_nodes(tmp_path):
    from keras_attention import recipes
    from keras_attention.datasets import load_karate_club

    result = recipes.run_node_classification("gat", None, 5, str(tmp_path), 0, quick=True)
    model = keras.saving.load_model(
        os.path.join(str(tmp_path), "node_classification_gat.keras")
    )
    data = node_classification_data(load_karate_club(seed=0))
    by_hand = split_accuracy(model, data, data.test_weights)
    assert result.metrics["test_accuracy"] == pytest.approx(by_hand, abs=1e-4)


def test_metrics_given_to_compile_come_beside_the_weighted_defaults(karate):
    # As the compile docstring says: the user's `metrics=` are unweighted
    # (Keras 3), the default weighted accuracy stays, renamed by keras.
    keras.utils.set_random_seed(4)
    model = GATNodeClassifier(num_features=34, num_classes=2, hidden_units=4, num_heads=2)
    model.compile(metrics=["accuracy"], jit_compile=False)
    logs = model.evaluate(
        karate.inputs, karate.labels, sample_weight=karate.test_weights,
        return_dict=True, verbose=0,
    )
    assert logs["weighted_accuracy"] == pytest.approx(
        split_accuracy(model, karate, karate.test_weights), abs=1e-6
    )
    every_node = np.ones_like(karate.test_weights)
    assert logs["accuracy"] == pytest.approx(
        split_accuracy(model, karate, every_node), abs=1e-6
    )
    model.compile(metrics=["accuracy"], weighted_metrics=None, jit_compile=False)
    logs = model.evaluate(karate.inputs, karate.labels, return_dict=True, verbose=0)
    assert set(logs) == {"loss", "accuracy"}
