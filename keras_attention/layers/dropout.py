"""`HashDropout`: dropout with a counter-based mask, fast under XLA."""

import keras

from keras_attention._config import ArgumentConfig
from keras_attention._validation import check_rate
from keras_attention.ops import hash_dropout


@keras.saving.register_keras_serializable(package="keras_attention")
class HashDropout(ArgumentConfig, keras.layers.Layer):
    """Dropout with a counter-based mask, fast under XLA (see `hash_dropout`).

    A drop-in replacement for `keras.layers.Dropout` (without
    `noise_shape`) for inputs of static shape, e.g. the node features of a
    graph in a GAT.

    Args:
        rate: the drop probability, a float in `[0, 1)`.
        seed: an optional int seed.

    Call arguments:
        inputs: a float tensor of static shape.
        training: whether dropout is active.

    Returns:
        A tensor of the shape and dtype of `inputs`.

    Raises:
        ValueError: `rate` outside `[0, 1)`, naming it.

    Example:

    ```python
    x = keras.Input(shape=(1433,), batch_size=2708)
    y = HashDropout(0.6)(x)
    ```
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = check_rate("rate", rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True
        self.built = True

    def call(self, inputs, training=False):
        if training and self.rate > 0.0:
            return hash_dropout(inputs, self.rate, self.seed_generator)
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape
