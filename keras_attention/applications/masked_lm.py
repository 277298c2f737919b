"""BERT's masked-language-model task on the text encoder.

`MaskedLanguageModel` puts keras-hub's `MaskedLMHead` (Dense, GELU,
LayerNorm, then the token embedding transposed as the output projection,
plus a bias) on a `TextClassifierBackbone`'s tokens and predicts the word
pieces at the masked positions. `masked_lm_dataset` masks ids as BERT's
reference code does, from a seed (`_masking.bert_masks`; keras-hub's
`MaskedLMMaskGenerator` follows none): 15 % of the word pieces (never padding, nor the
`unselectable_ids` given: `pretrain_masked_lm` passes `[CLS]` and `[SEP]`)
are chosen; of those, 80 % become `[MASK]`, 10 % a random
token, 10 % stay (Devlin et al., 2019), drawn anew every epoch.

The loss and the accuracy count the chosen positions only: each example's
`mask_weights` are the sample weights, the loss is divided by their sum
(`reduction="mean_with_sample_weight"`) and the accuracy is a weighted
metric (Keras 3 ignores sample weights in `metrics=`).
"""

import keras
import numpy as np

from keras_attention import _validation as base
from keras_attention.applications import base as app_base
from keras_attention.applications import compiling
from keras_attention.applications.blocks.transformer import gelu
from keras_attention.applications.text_classifier import TextClassifier
from keras_attention.applications.text_classifier import TextClassifierBackbone


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class MaskedLanguageModel(
    app_base.TaskConfig, compiling.CompileDefaults, app_base.InputChecks,
    app_base.QuickQuantize, keras.Model,
):
    """A text backbone and a masked-LM head (BERT's pretraining task).

    Args:
        backbone: a `TextClassifierBackbone`.
        mask_length: how many positions `P` each example predicts (the
            generator's `mask_selection_length`).
        preprocessor: optional, kept in the `.keras` file and handed to
            the classifier of `with_head`.

    Call arguments:
        inputs: the backbone's inputs (token ids, or the dict with
            `"token_type_ids"`) as `"token_ids"` (and `"token_type_ids"`),
            plus `"mask_positions"` int `(B, P)`.

    Returns:
        Logits `(B, P, vocabulary_size)` at the masked positions.

    Raises:
        ValueError: naming the argument: `backbone` not a
            `TextClassifierBackbone`; `mask_length` not a positive
            integer; inputs that are not a dict of `token_ids` (as the
            backbone checks them) and `mask_positions` `(B, mask_length)`
            in `[0, sequence_length)`; in `fit` and `evaluate`, labels
            outside the backbone's vocabulary.

    Example:

    ```python
    backbone = TextClassifierBackbone(vocabulary_size=100, sequence_length=16)
    model = MaskedLanguageModel(backbone)
    model.compile()
    ids = np.random.randint(3, 100, (64, 16))
    model.fit(masked_lm_dataset(ids, mask_token_id=2), epochs=2)
    classifier = model.with_head(num_classes=2)  # then fine-tune
    ```

    References:
        - Devlin et al., BERT: Pre-training of Deep Bidirectional
          Transformers for Language Understanding, 2019.
          https://arxiv.org/abs/1810.04805
    """

    backbone_class = TextClassifierBackbone

    def __init__(self, backbone, mask_length=None, preprocessor=None, **kwargs):
        import keras_hub

        preprocessor = app_base.deserialize_preprocessor(preprocessor)
        if not isinstance(backbone, self.backbone_class):
            raise base.invalid("backbone", "a TextClassifierBackbone", backbone)
        length = backbone.sequence_length
        self.mask_length = mask_length or default_mask_length(length)
        base.check_positive_int("mask_length", self.mask_length)
        token_inputs = backbone.input
        positions = keras.Input((self.mask_length,), dtype="int32", name="mask_positions")
        if isinstance(token_inputs, dict):
            inputs = {**token_inputs, "mask_positions": positions}
        else:
            inputs = {"token_ids": token_inputs, "mask_positions": positions}
        tokens = backbone.tokens_model(token_inputs)
        embedding = backbone.get_layer("embedding").token_embedding
        head = keras_hub.layers.MaskedLMHead(
            vocabulary_size=backbone.vocabulary_size,
            token_embedding=embedding,
            intermediate_activation=gelu,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            # float32 whatever the policy, as a mixed-precision model's
            # output layer: under a bfloat16 one keras-hub's head adds its
            # float32 bias to bfloat16 logits and fails on TensorFlow
            # (its own BertMaskedLM too); the logits are float32 anyway.
            dtype="float32",
            name="mlm_head",
        )
        # The padding mask ends here (the head gathers the masked positions).
        head.supports_masking = True
        head.compute_mask = _no_mask
        logits = head(tokens, mask_positions=positions)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.backbone = backbone
        self.preprocessor = preprocessor

    @property
    def trainable_weights(self):
        """The backbone's and the head's, without the backbone's pooling
        (kept and saved, but the masked LM does not train it)."""
        pooling = self.backbone.layers[-1].weights
        unused = {id(v) for v in pooling}
        return [v for v in super().trainable_weights if id(v) not in unused]

    @property
    def trainable_variables(self):
        return self.trainable_weights

    @property
    def non_trainable_weights(self):
        """Keras's, and the pooling `trainable_weights` leaves out (so that
        `summary` and the backends' stateless steps see every weight)."""
        kept = {id(v) for v in self.trainable_weights}
        left = [v for v in super().trainable_weights if id(v) not in kept]
        return super().non_trainable_weights + left

    @property
    def non_trainable_variables(self):
        return self.non_trainable_weights

    def compile_defaults(self):
        """AdamW (1e-3), the cross-entropy and accuracy of masked positions."""
        return {
            "optimizer": keras.optimizers.AdamW(1e-3, weight_decay=0.01),
            "loss": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"
            ),
            "weighted_metrics": [
                keras.metrics.SparseCategoricalAccuracy(name="accuracy")
            ],
        }

    def check_inputs(self, inputs):
        # Before Keras traces them: ids outside the vocabulary were a silent
        # clamp on JAX and torch, and a shape error inside JAX's traced
        # `predict` left the model's variables emptied.
        if not isinstance(inputs, dict) or "mask_positions" not in inputs:
            raise base.invalid(
                "inputs", 'a dict with "token_ids" and "mask_positions"',
                type(inputs).__name__,
            )
        tokens = {k: v for k, v in inputs.items() if k != "mask_positions"}
        self.backbone.check_inputs(
            tokens if self.backbone.token_types else tokens.get("token_ids")
        )
        positions = inputs["mask_positions"]
        shape, length = tuple(positions.shape), self.backbone.sequence_length
        if len(shape) != 2 or shape[1] not in (None, self.mask_length):
            raise ValueError(
                "Received an invalid value for argument `mask_positions`, "
                f"expected integer positions of shape (None, {self.mask_length}) "
                f"for mask_length={self.mask_length}. Received: "
                f"mask_positions.shape={shape}"
            )
        base.check_known_ids(
            "mask_positions", positions, length, "positions",
            f"sequence_length={length}",
        )

    def label_ids(self, x):
        """The original token's id at each masked position, `(B, P)`."""
        if not isinstance(x, dict) or "mask_positions" not in x:
            return None
        size = self.backbone.vocabulary_size
        return (
            tuple(x["mask_positions"].shape), size, f"vocabulary_size={size}"
        )

    def with_head(self, num_classes, **kwargs):
        """A `TextClassifier` on this (pretrained) backbone, shared."""
        kwargs.setdefault("preprocessor", self.preprocessor)
        return TextClassifier(backbone=self.backbone, num_classes=num_classes, **kwargs)

    def task_arguments(self):
        return {"mask_length": self.mask_length}

    @classmethod
    def from_transformers(cls, source, sequence_length=None, mask_length=None, **kwargs):
        """A Hugging Face `BertForMaskedLM` / `BertForPreTraining`, head too.

        Builds the BERT layout of `TextClassifierBackbone` as
        `TextClassifier.from_transformers` does and loads the encoder and
        the masked-LM head (`cls.predictions`: the transform's dense and
        LayerNorm, the output bias; the decoder is the word embeddings,
        tied); the logits at `mask_positions` match Hugging Face's within
        float32 rounding. `BertForPreTraining`'s next-sentence head is left
        out; `BertForMaskedLM` has no pooler, so the backbone keeps an
        initial one (unused here, trained by `with_head`). Every tensor is
        checked first, and on any problem (a missing, extra or misshapen
        tensor, no `cls.predictions` head, a decoder that differs from the
        word embeddings) a `ValueError` names it and no weight is assigned.

        Args:
            source: a `transformers` BERT model, or a local folder of
                `save_pretrained` / a hub snapshot (`config.json` and
                `model.safetensors`, read without torch, or
                `pytorch_model.bin`). A `vocab.txt` there gives the model a
                `BertPreprocessor`.
            sequence_length: the input length `T` (default: the config's
                `max_position_embeddings`).
            mask_length: positions `P` predicted per example (default:
                `default_mask_length(T)`).
            **kwargs: other `TextClassifierBackbone` arguments.

        Returns:
            A `MaskedLanguageModel` taking `{"token_ids", "token_type_ids",
            "mask_positions"}`.

        Example:

        ```python
        from transformers import BertConfig, BertForMaskedLM

        reference = BertForMaskedLM(BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64))
        model = MaskedLanguageModel.from_transformers(
            reference, sequence_length=16, mask_length=4)
        classifier = model.with_head(num_classes=2)  # then fine-tune
        ```
        """
        from keras_attention.applications.converters import bert

        return bert.masked_lm_from_transformers(
            cls, source, sequence_length=sequence_length,
            mask_length=mask_length, **kwargs,
        )


def _no_mask(*args, **kwargs):
    return None


def default_mask_length(sequence_length, rate=0.15):
    """Room for the chosen positions: `rate * T` and a margin, at most `T`."""
    return min(sequence_length, int(np.ceil(rate * sequence_length)) + 2)


def masked_lm_dataset(
    token_ids,
    mask_token_id,
    vocabulary_size=None,
    batch_size=32,
    mask_rate=0.15,
    mask_length=None,
    unselectable_ids=(0,),
    token_type_ids=None,
    shuffle=True,
    seed=None,
    remask_each_epoch=True,
):
    """A `tf.data.Dataset` of masked batches for `MaskedLanguageModel.fit`.

    Args:
        token_ids: int `(N, T)`, 0 for padding.
        mask_token_id: the id of `[MASK]`.
        vocabulary_size: for the random replacements, drawn from
            `[1, vocabulary_size)` (default: one more than the largest id
            seen).
        batch_size: examples per batch.
        mask_rate: the share of word pieces chosen (BERT: 0.15).
        mask_length: positions per example (default:
            `default_mask_length(T)`); extra choices beyond it are dropped.
        unselectable_ids: ids never chosen; padding only by default, so
            for rows packed with special tokens pass theirs too, e.g.
            `(0, p.cls_id, p.sep_id)` for a `BertPreprocessor` `p` (else
            about a third of the choices fall on `[CLS]`/`[SEP]`).
        token_type_ids: optional int `(N, T)` for a backbone with token types.
        shuffle: reshuffle every epoch.
        seed: the op seed of the shuffle and the masks. As for every
            TensorFlow random op, TensorFlow's global seed
            (`keras.utils.set_random_seed`) goes with it: the same seed
            under the same global seed gives the same batches, epoch by
            epoch (`None`: the global seed alone).
        remask_each_epoch: draw other masks every epoch (for training);
            `False` keeps the first epoch's (a validation set's loss then
            moves with the weights only).

    Returns:
        Batches `(inputs, mask_ids, mask_weights)`: `inputs` holds the
        masked `"token_ids"`, `"mask_positions"` (and `"token_type_ids"`).
    """
    import tensorflow as tf

    from keras_attention.applications._masking import bert_masks

    token_ids = np.asarray(token_ids, "int32")
    if token_ids.ndim != 2:
        raise base.invalid("token_ids", "int ids of shape (N, T)", token_ids.shape)
    if not 0.0 < mask_rate < 1.0:
        raise base.invalid("mask_rate", "a rate in (0, 1)", mask_rate)
    if vocabulary_size is None:
        vocabulary_size = int(max(token_ids.max(), mask_token_id)) + 1
    mask_length = mask_length or default_mask_length(token_ids.shape[1], mask_rate)
    unselectable = [int(i) for i in unselectable_ids]
    data = {"token_ids": token_ids}
    if token_type_ids is not None:
        data["token_type_ids"] = np.asarray(token_type_ids, "int32")
    dataset = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        dataset = dataset.shuffle(len(token_ids), seed=seed, reshuffle_each_iteration=True)
    # One seed per batch, other ones every epoch (pass over the dataset)
    # unless kept; the same ones for the same `seed` (or global seed).
    seeds = tf.data.Dataset.random(
        seed=seed, rerandomize_each_iteration=bool(remask_each_epoch)
    )

    def mask(batch, batch_seed):
        masked, positions, mask_ids, weights = bert_masks(
            batch["token_ids"], tf.stack([batch_seed, 0]), mask_token_id,
            vocabulary_size, mask_rate, mask_length, unselectable,
        )
        inputs = {"token_ids": masked, "mask_positions": positions}
        if "token_type_ids" in batch:
            inputs["token_type_ids"] = batch["token_type_ids"]
        return inputs, mask_ids, weights

    dataset = tf.data.Dataset.zip(dataset.batch(batch_size), seeds)
    return dataset.map(mask, num_parallel_calls=tf.data.AUTOTUNE)
