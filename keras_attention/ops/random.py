"""Counter-based random bits and dropout masks, fused by XLA."""

import numbers

import keras
import numpy as np
from keras import ops


def _shift_right(x, bits):
    # A logical shift of int32 words: the arithmetic shift, then the sign
    # bits it copied in are cleared.
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _mix32(x):
    """`lowbias32` (C. Wellons), a bijective hash of 32-bit words, on int32.

    int32 multiplication wraps modulo 2**32 on every backend, so the bits are
    those of the unsigned hash.
    """
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, np.int32(0x7FEB352D))
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = ops.multiply(x, np.int32(0x846CA68B - (1 << 32)))
    return ops.bitwise_xor(x, _shift_right(x, 16))


def _seed_words(seed):
    """Two int32 scalars from a `SeedGenerator`, an int or a `(2,)` tensor."""
    if isinstance(seed, keras.random.SeedGenerator):
        state = seed.next()
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        state = np.array([int(seed) % (1 << 31), 0], "int32")
    elif seed is None:
        raise ValueError(
            "Received an invalid value for argument `seed`, expected a "
            "`keras.random.SeedGenerator`, an integer or a (2,) integer "
            "tensor. Received: seed=None"
        )
    else:
        state = seed
    # Casting keeps the low 32 bits of an int64 (TensorFlow's seed state).
    state = ops.cast(state, "int32")
    return state[0], state[1]


def hash_bits(shape, seed):
    """32 uniform random bits per element, as an int32 tensor of `shape`.

    A counter-based generator: element `i` gets `lowbias32(i * a + b)`,
    where the odd multiplier `a` and the offset `b` are hashes of the seed.
    Two seeds map the counters to unrelated arithmetic progressions modulo
    `2**32`, so their bits are unrelated; the whole tensor is a dozen
    element-wise integer operations that XLA fuses into one loop, with no
    random-number state beyond the seed.

    Args:
        shape: a shape: a tuple of ints, or `keras.ops.shape(x)` of a
            tensor whose dimensions are known only when the graph runs.
        seed: a `keras.random.SeedGenerator` (a new seed is drawn from it),
            an int, or a `(2,)` int tensor.
    """
    s0, s1 = _seed_words(seed)
    multiplier = ops.bitwise_or(_mix32(ops.bitwise_xor(s0, _mix32(s1))), 1)
    offset = _mix32(ops.add(multiplier, s1))
    if all(isinstance(d, (int, np.integer)) for d in shape):
        size = int(np.prod(shape, dtype="int64"))
    else:
        size = ops.prod(ops.convert_to_tensor(shape, "int32"))
    counter = ops.reshape(ops.arange(size, dtype="int32"), shape)
    return _mix32(ops.add(ops.multiply(counter, multiplier), offset))


def hash_dropout(inputs, rate, seed):
    """Inverted dropout with a counter-based (hashed) random mask.

    Each element is kept with probability `1 - rate` and scaled by
    `1 / (1 - rate)`, like `keras.random.dropout`; the mask comes from
    `hash_bits` instead of the backend's random generator. Under XLA on CPU
    (TensorFlow's `jit_compile=True`), `keras.random.dropout` lowers to a
    slow generator (seconds for a Cora feature matrix, 2708 x 1433) while
    this fuses into a few element-wise integer operations (milliseconds).
    JAX on CPU gains too (threefry is slower); without a compiler fusing
    the operations (TensorFlow's plain `tf.function`, PyTorch) it costs about
    as much as `keras.random.dropout`, up to 1.5 times more.

    Args:
        inputs: a float tensor.
        rate: the drop probability, a float in `[0, 1)`.
        seed: a `keras.random.SeedGenerator` (one seed is drawn per call, so
            each training step gets a new mask), an int (always the same
            mask), or a `(2,)` int tensor.

    Returns:
        A tensor of the shape and dtype of `inputs`.

    Example:

    >>> x = np.ones((4, 1000), "float32")
    >>> y = hash_dropout(x, 0.5, keras.random.SeedGenerator(1))
    >>> 0.45 < float(keras.ops.mean(keras.ops.cast(y > 0, "float32"))) < 0.55
    True
    """
    if isinstance(rate, (bool, np.bool_)) or not isinstance(
        rate, numbers.Real
    ) or not 0.0 <= rate < 1.0:  # NumPy's floats too
        raise ValueError(
            "Received an invalid value for argument `rate`, expected a float "
            f"in [0, 1). Received: rate={rate!r}"
        )
    rate = float(rate)
    # A NumPy array times a torch tensor raises: a tensor first.
    inputs = ops.convert_to_tensor(inputs)
    if rate == 0.0:
        return inputs
    shape = tuple(inputs.shape)
    if any(d is None for d in shape):
        # Known when the graph runs (sequences of any length, a batch
        # dimension): XLA still compiles one program per concrete shape.
        shape = ops.shape(inputs)
    # The bits are uniform over the int32 range [-2**31, 2**31).
    threshold = int(round(rate * (1 << 32))) - (1 << 31)
    keep = ops.greater_equal(hash_bits(shape, seed), threshold)
    scale = ops.cast(1.0 / (1.0 - rate), inputs.dtype)
    return ops.where(keep, inputs * scale, ops.zeros_like(inputs))
