"""The labels `fit` and `evaluate` take, checked the same way for every
task whose loss reads class ids (`InputChecks.label_ids`): of the shape
the loss needs, whole numbers, inside the head's classes or the
vocabulary. Under XLA (the translators' and the language model's default
on every device) an id outside the logits makes the loss NaN and `fit`
turned every weight to NaN without an error; a label of another shape
left keras's `fit` unable to run again."""

import keras
import numpy as np
import pytest

from keras_attention.applications import CausalLM
from keras_attention.applications import GATNodeClassifier
from keras_attention.applications import TransformerTranslator
from keras_attention.applications import VisionTransformer
from keras_attention.applications.masked_lm import MaskedLanguageModel
from keras_attention.applications.node_classification import node_classification_data
from keras_attention.applications.text_classifier import TextClassifierBackbone
from keras_attention.applications.translation import TranslationPreprocessor
from keras_attention.datasets import load_karate_club

RNG = np.random.default_rng(0)


def causal_lm():
    model = CausalLM(vocabulary_size=20, hidden_dim=8, depth=1, num_heads=2)
    model.compile()
    x = RNG.integers(1, 20, (4, 8))
    return model, x[:, :-1], x[:, 1:], 20


def translator():
    model = TransformerTranslator(
        TranslationPreprocessor(source_length=6, target_length=6),
        num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=8,
    )
    model.compile()
    size = model.preprocessor.target_vocabulary_size
    x = {"source_ids": RNG.integers(1, 20, (3, 6)),
         "target_ids": RNG.integers(1, 20, (3, 5))}
    return model, x, RNG.integers(1, 20, (3, 5)), size


def masked_lm():
    backbone = TextClassifierBackbone(
        vocabulary_size=30, sequence_length=8, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8,
    )
    model = MaskedLanguageModel(backbone, mask_length=2)
    model.compile(jit_compile=False)
    x = {"token_ids": RNG.integers(3, 30, (3, 8)),
         "mask_positions": RNG.integers(0, 8, (3, 2))}
    return model, x, RNG.integers(3, 30, (3, 2)), 30


def vit():
    model = VisionTransformer(
        image_size=8, num_channels=1, patch_size=4, num_classes=3,
        hidden_dim=8, depth=1, num_heads=2, mlp_dim=8,
    )
    model.compile()
    return model, np.zeros((6, 8, 8, 1), "float32"), np.arange(6) % 3, 3


def gat():
    data = node_classification_data(load_karate_club())
    model = GATNodeClassifier(num_features=data.inputs[0].shape[-1], num_classes=2)
    model.compile()
    return model, data.inputs, data.labels, 2


TASKS = {"causal_lm": causal_lm, "translator": translator,
         "masked_lm": masked_lm, "vit": vit, "gat": gat}


def unchanged(model, before):
    return all(np.array_equal(a, b.numpy()) for a, b in zip(before, model.weights))


@pytest.mark.parametrize("task", sorted(TASKS))
def test_ids_outside_the_logits_are_refused_and_nothing_changes(task):
    model, x, y, stop = TASKS[task]()
    before = [w.numpy().copy() for w in model.weights]
    for bad, found in [(y + stop, "values in"), (y - y.max() - 1, "values in"),
                       (y + 0.5, "whole-number")]:
        for method in ("fit", "evaluate"):
            with pytest.raises(ValueError, match=rf"`y`.*in \[0, {stop}\)") as info:
                getattr(model, method)(x, bad, verbose=0)
            assert found in str(info.value)
    with pytest.raises(ValueError, match=r"`validation_data\[1\]`"):
        model.fit(x, y, validation_data=(x, y + stop), verbose=0)
    wrong = y[..., :-1] if task != "vit" else y[:-1]
    with pytest.raises(ValueError, match=r"class ids of shape .* Received: y.shape="):
        model.fit(x, wrong, verbose=0)
    assert unchanged(model, before)
    # Whole numbers in float arrays pass (keras hands float ids under a
    # `tf.distribute` strategy).
    model.evaluate(x, y.astype("float32"), verbose=0)


def test_one_hot_labels_with_the_sparse_loss_name_the_loss_to_use():
    model, x, y, stop = vit()
    with pytest.raises(ValueError, match="categorical_crossentropy"):
        model.fit(x, keras.utils.to_categorical(y, stop), verbose=0)
    # And `fit` still runs afterwards (keras's own first trace failed on
    # such labels and its later traces too).
    model.fit(x, y, verbose=0)


def test_labels_with_a_trailing_one_and_without_train_alike():
    # Keras's loss takes `(B,)` and `(B, 1)`; the same model given both
    # failed the second time ("Cannot take the length of shape with
    # unknown rank"): the trailing axis is dropped before keras sees it.
    model, x, y, _ = vit()
    model.fit(x, y[:, None], verbose=0)
    model.fit(x, y, verbose=0)
    model.fit(x, y[:, None], validation_data=(x, y[:, None]), verbose=0)
    model.evaluate(x, keras.ops.convert_to_tensor(y[:, None]), verbose=0)


def test_ignored_class_passes():
    model, x, y, stop = causal_lm()
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=-100))
    y = y.copy()
    y[:, -1] = -100
    model.evaluate(x, y, verbose=0)
    y[0, 0] = -1
    with pytest.raises(ValueError, match=r"values in \[-1,"):
        model.evaluate(x, y, verbose=0)


def test_split_weights_of_another_node_count_are_refused():
    model, x, y, _ = gat()
    data = node_classification_data(load_karate_club())
    with pytest.raises(ValueError, match=r"`sample_weight`.*\(1, 34\)"):
        model.fit(x, y, sample_weight=data.train_weights[:, :30], verbose=0)
    with pytest.raises(ValueError, match=r"`validation_data\[2\]`.*\(1, 34\)"):
        model.fit(x, y, sample_weight=data.train_weights, verbose=0,
                  validation_data=(x, y, data.val_weights[:, :30]))


def test_loading_another_configurations_weights_changes_nothing(tmp_path):
    # keras's `load_weights` raised after loading what fitted (8 of the
    # 24 weights of this ViT).
    model, x, y, _ = vit()
    model.fit(x, y, verbose=0)  # an optimizer with state too
    other = VisionTransformer(
        image_size=8, num_channels=1, patch_size=4, num_classes=5,
        hidden_dim=8, depth=1, num_heads=2, mlp_dim=8,
    )
    other.save_weights(str(tmp_path / "other.weights.h5"))
    variables = list(model.variables) + list(model.optimizer.variables)
    before = [keras.ops.convert_to_numpy(v.value).copy() for v in variables]
    with pytest.raises(ValueError):
        model.load_weights(str(tmp_path / "other.weights.h5"))
    for variable, value in zip(variables, before):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable.value), value)
