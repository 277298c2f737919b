"""The applications check a `tf.data` dataset's batches, not only its spec.

A dataset's spec holds shapes, not values: ids outside an embedding (a
silent clamp, garbage, on JAX, torch and under XLA), class ids outside the
classes (NaN weights under XLA) and rows longer than a position table (a
raw broadcast error from the gradient) went unchecked. `InputChecks` maps
the dataset through TensorFlow assertions with `check_inputs`'s message,
and on JAX puts back the weights Keras's `fit` had taken out when its first
step raised. Run on TensorFlow here, on JAX and torch from `test_backends`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_attention import applications  # noqa: E402


def _classifier():
    keras.utils.set_random_seed(0)
    model = applications.TextClassifier(
        vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
        depth=1, num_heads=2, mlp_dim=8,
    )
    model.compile(optimizer="adam", jit_compile=False)
    return model


def _rows(lengths, stop=20):
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, stop, size=n).astype("int32") for n in lengths]
    labels = (np.arange(len(rows)) % 2).astype("int32")
    return tf.data.Dataset.from_generator(
        lambda: zip(rows, labels),
        output_signature=(
            tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)
        ),
    ).padded_batch(2)


def _weights(model):
    return [np.array(w) for w in model.get_weights()]


def _kept(model, before):
    return all(np.array_equal(a, b) for a, b in zip(before, _weights(model)))


def test_padded_rows_up_to_the_position_table_train_and_longer_ones_fail():
    model = _classifier()
    # Batches of 5 and 4 tokens: shorter than the table of 6 rows, padded.
    model.fit(_rows([3, 5, 4, 2]), epochs=1, verbose=0)
    before = _weights(model)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        model.fit(_rows([9, 2, 3, 5]), epochs=1, verbose=0)  # first batch
    message = str(error.value)
    assert "argument `token_ids`" in message and "at most 6" in message
    assert "a position table of 6 rows" in message and "[9]" in message
    assert _kept(model, before)
    with pytest.raises(tf.errors.InvalidArgumentError, match="token_ids"):
        model.predict(_rows([7, 2]).map(lambda x, y: x), verbose=0)


def test_ids_outside_the_vocabulary_fail_and_the_weights_are_kept():
    # Without XLA: the checks run in the input pipeline, outside any
    # compiled step (XLA drops assertions; the pipeline's stay).
    model = _classifier()
    x = np.random.default_rng(1).integers(1, 20, size=(4, 6)).astype("int32")
    y = np.array([0, 1, 0, 1], "int32")
    bad = x.copy()
    bad[0, 3] = 25  # in the first batch: where Keras's JAX fit lost weights
    data = tf.data.Dataset.from_tensor_slices((bad, y)).batch(2)
    before = _weights(model)
    for method, given in (
        ("fit", data), ("evaluate", data),
        ("predict", data.map(lambda ids, labels: ids)),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            getattr(model, method)(given, verbose=0)
        message = str(error.value)
        assert "argument `token_ids`" in message, method
        assert "in [0, 20) for vocabulary_size=20" in message and "[25]" in message
        assert _kept(model, before), method
    # The model goes on: the same calls on good data run.
    good = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    history = model.fit(good, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert np.isfinite(model.evaluate(good, verbose=0)).all()
    assert np.isfinite(model.predict(x, verbose=0)).all()


def test_class_ids_outside_the_classes_fail_in_fit_and_in_validation_data():
    model = _classifier()
    x = np.random.default_rng(2).integers(1, 20, size=(4, 6)).astype("int32")
    good = tf.data.Dataset.from_tensor_slices((x, np.array([0, 1, 1, 0]))).batch(2)
    bad = tf.data.Dataset.from_tensor_slices((x, np.array([0, 1, 3, 0]))).batch(2)
    expected = "argument `y`, expected class ids in \\[0, 2\\) for num_classes=2"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        model.fit(bad, epochs=1, verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        model.fit(good, validation_data=bad, epochs=1, verbose=0)


def test_a_causal_lm_dataset_passes_its_ignored_padding_and_checks_the_rest():
    keras.utils.set_random_seed(0)
    model = applications.CausalLM(
        vocabulary_size=12, hidden_dim=8, depth=1, num_heads=2, mlp_dim=8,
    )
    model.compile(optimizer="adam", jit_compile=False)
    ids = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], "int32")  # 0: padding
    good = tf.data.Dataset.from_tensor_slices((ids, ids)).batch(2)
    model.fit(good, epochs=1, verbose=0)
    labels = ids.copy()
    labels[1, 1] = 12
    bad = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="argument `y`"):
        model.fit(bad, epochs=1, verbose=0)


def test_a_graph_dataset_with_edges_outside_its_nodes_fails_naming_edges():
    keras.utils.set_random_seed(0)
    model = applications.GATNodeClassifier(
        num_features=4, num_classes=2, hidden_units=2, num_heads=2,
    )
    model.compile(jit_compile=False)
    features = np.random.default_rng(0).random((1, 5, 4)).astype("float32")
    edges = np.array([[[0, 1, 2, 3], [1, 2, 3, 7]]], "int32")  # node 7 of 5
    labels = np.array([[0, 1, 0, 1, 0]], "int32")
    data = tf.data.Dataset.from_tensors(((features, edges), labels))
    with pytest.raises(tf.errors.InvalidArgumentError, match=(
        r"argument `edges`, expected node ids in \[0, 5\) for the 5 nodes"
    )):
        model.fit(data, epochs=1, verbose=0)
