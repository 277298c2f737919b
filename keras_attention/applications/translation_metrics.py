"""Token accuracy and cross-entropy of the translators and the causal
language model (teacher forcing), and their loss's per-sentence weights.

BLEU is `text_preprocessing.corpus_bleu` (keras-hub's).
"""

import keras
from keras import ops

from keras_attention._validation import check_bool


@keras.saving.register_keras_serializable(package="keras_attention")
def token_accuracy(y_true, y_pred):
    """Share of non-padding target tokens of **one batch** predicted exactly.

    As a function in `metrics=`, Keras averages it over batches, which
    weighs a batch of short sentences like one of long ones; the models'
    default is the `TokenAccuracy` metric, which counts tokens.
    """
    y_true = ops.cast(y_true, "int32")
    predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
    real = ops.not_equal(y_true, 0)
    hits = ops.logical_and(real, ops.equal(predicted, y_true))
    count = ops.sum(ops.cast(real, "float32"))
    return ops.sum(ops.cast(hits, "float32")) / ops.maximum(count, 1.0)


@keras.saving.register_keras_serializable(package="keras_attention")
class TokenAccuracy(keras.metrics.Metric):
    """Share of the non-padding target tokens predicted exactly.

    Counts tokens over everything it has seen (`hits / tokens`), not a
    mean of per-batch ratios, so batches with more padding weigh less.
    A `sample_weight` of shape `(B,)` (per sentence) or `(B, T)` (per
    token) weighs the tokens; padding (`padding_id`) never counts.

    Args:
        padding_id: the target id that marks padding (0).
        name, dtype: as for any `keras.metrics.Metric`.

    Example:

    ```python
    metric = TokenAccuracy()
    metric.update_state([[5, 6, 0]], [[[0, 0, 0, 0, 0, 1, 0],
                                       [0, 0, 0, 0, 0, 1, 0],
                                       [1, 0, 0, 0, 0, 0, 0]]])
    float(metric.result())  # 0.5: one of the two real tokens
    ```
    """

    def __init__(self, padding_id=0, name="token_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.padding_id = int(padding_id)
        self.hits = self.add_variable((), initializer="zeros", name="hits")
        self.tokens = self.add_variable((), initializer="zeros", name="tokens")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        weight = _token_weights(y_true, self.padding_id, sample_weight)
        correct = ops.cast(ops.equal(predicted, y_true), "float32")
        self.hits.assign_add(ops.sum(weight * correct))
        self.tokens.assign_add(ops.sum(weight))

    def result(self):
        return ops.divide_no_nan(self.hits, self.tokens)

    def get_config(self):
        return {**super().get_config(), "padding_id": self.padding_id}


def _token_weights(y_true, padding_id, sample_weight):
    """`(B, T)` float weights: 0 on padding, times `sample_weight`."""
    weight = ops.cast(ops.not_equal(y_true, padding_id), "float32")
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, "float32")
        # `(B,)` -> `(B, 1)`, `(B, T)` unchanged; a graph trace (`fit` with
        # `jit_compile=False`) can leave the rank unknown, where
        # `len(shape)` raised.
        sample_weight = ops.reshape(sample_weight, (ops.shape(y_true)[0], -1))
        weight = weight * sample_weight
    return weight


@keras.saving.register_keras_serializable(package="keras_attention")
class TokenCrossEntropy(keras.metrics.Metric):
    """Mean cross-entropy per non-padding target token, over everything seen.

    Keras's `loss` / `val_loss` is a mean of per-batch means (each batch
    weighted by its number of sentences), so a batch with much padding
    weighs as much as one of long sentences; this metric sums the tokens'
    cross-entropies and divides by the number of tokens. Weights as in
    `TokenAccuracy`; `exp` of it is the perplexity.

    Args:
        padding_id: the target id that marks padding (0).
        from_logits: whether `y_pred` holds logits (the translators') or
            probabilities.
        name, dtype: as for any `keras.metrics.Metric`.

    Example:

    ```python
    metric = TokenCrossEntropy(from_logits=False)
    metric.update_state([[1, 0]], [[[0.5, 0.5], [1.0, 0.0]]])
    float(metric.result())  # 0.693: -log 0.5, the padding not counted
    ```
    """

    def __init__(
        self, padding_id=0, from_logits=True, name="token_loss", dtype=None
    ):
        super().__init__(name=name, dtype=dtype)
        self.padding_id = int(padding_id)
        self.from_logits = check_bool("from_logits", from_logits)
        self.total = self.add_variable((), initializer="zeros", name="total")
        self.tokens = self.add_variable((), initializer="zeros", name="tokens")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        weight = _token_weights(y_true, self.padding_id, sample_weight)
        losses = keras.losses.sparse_categorical_crossentropy(
            y_true, ops.cast(y_pred, "float32"), from_logits=self.from_logits
        )
        self.total.assign_add(ops.sum(weight * losses))
        self.tokens.assign_add(ops.sum(weight))

    def result(self):
        return ops.divide_no_nan(self.total, self.tokens)

    def get_config(self):
        return {
            **super().get_config(),
            "padding_id": self.padding_id,
            "from_logits": self.from_logits,
        }


class PaddedTokenLoss:
    """`compute_loss` of a model whose loss ignores the padding id
    (`SparseCategoricalCrossentropy(ignore_class=0)`) on `(B, T)` targets:
    a per-sentence `sample_weight` `(B,)` weighs every token of its
    sentence (Keras multiplied it with the `(B, T)` padding mask of
    `ignore_class`: a shape error in `fit`/`evaluate`)."""

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        if sample_weight is not None and not isinstance(
            sample_weight, (dict, list, tuple)
        ):
            # `(B,)` -> `(B, T)`, a new tensor (torch's in-place product
            # with the padding mask refuses a `(B, 1)` or broadcast view).
            sample_weight = ops.convert_to_tensor(sample_weight)
            sample_weight = ops.reshape(
                sample_weight, (ops.shape(y)[0], -1)
            ) * ops.ones(ops.shape(y), dtype=sample_weight.dtype)
        return super().compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
            training=training,
        )
