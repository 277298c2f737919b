"""Relative positions inside attention: rotary embeddings and ALiBi slopes.

- `rotary_embedding` rotates query and key heads by their positions (Su et
  al., 2021), as keras-hub's `RotaryEmbedding` does (its default "linear"
  scaling: the frequencies divided by `scaling_factor`).
- `alibi_slopes` gives each head the slope of its linear distance penalty
  (Press et al., 2022), as keras-hub's `AlibiBias`. The core adds
  `slope * (s - t)` to the scores itself (`dot_product_attention(...,
  alibi_slopes=...)`): one block at a time on the blocked path, never a
  `T x S` tensor there. keras-hub adds `slope * (s - (S - 1))`, which
  differs by a constant per query row: the same softmax.
"""

import math

from keras import ops

from keras_attention._validation import check_positive_int
from keras_attention._validation import known_dim
from keras_attention.ops.masks import wide_dtype


def rotary_embedding(x, positions=None, start_index=0, max_wavelength=10000,
                     scaling_factor=1.0):
    """Rotary position embedding of heads `x` `(B, T, H, D)`, `D` even.

    Args:
        x: query or key heads.
        positions: optional positions `(T,)` or `(B, T)`; defaults to
            `start_index + arange(T)`.
        start_index: the first position (an int or a scalar tensor), e.g.
            where a cached decoding step writes.
        max_wavelength: the longest wavelength (RoPE's base, "theta").
        scaling_factor: positions are divided by it (linear scaling, to
            stretch a trained context).

    Returns:
        `x` rotated, in its dtype: the halves `(x1, x2)` of each head become
        `(x1 cos - x2 sin, x2 cos + x1 sin)` at angles
        `position / scaling_factor * max_wavelength ** (-2i / D)`, computed
        in float32 (float64 for float64 heads).

    Example:

    >>> import numpy as np
    >>> heads = np.ones((1, 4, 2, 8), "float32")  # (B, T, H, D)
    >>> rotated = ops.convert_to_numpy(rotary_embedding(heads))
    >>> rotated.shape, bool((rotated[0, 0] == 1).all())  # position 0 stays
    ((1, 4, 2, 8), True)
    """
    x = ops.convert_to_tensor(x)  # NumPy heads: `x * cos` on torch
    dim = x.shape[-1]
    if len(x.shape) != 4 or (known_dim(dim) or 0) % 2:
        raise ValueError(
            "Received an invalid value for argument `x`, expected a rank-4 "
            "tensor (B, T, H, D) with an even head size D. "
            f"Received: x.shape={tuple(x.shape)}"
        )
    wide = wide_dtype(x.dtype)
    if positions is None:
        positions = ops.arange(ops.shape(x)[1], dtype=wide)
        positions = positions + ops.cast(start_index, wide)
    positions = ops.cast(positions, wide)
    if len(positions.shape) == 1:
        positions = positions[None]
    if len(positions.shape) != 2 or not all(
        None in (p, e) or p in (1, e)
        for p, e in zip(map(known_dim, positions.shape), map(known_dim, x.shape[:2]))
    ):
        raise ValueError(
            "Received an invalid value for argument `positions`, expected "
            f"a tensor (T,) or (B, T) for x.shape={tuple(x.shape)}. "
            f"Received: positions.shape={tuple(positions.shape)}"
        )
    inverse_freq = ops.power(
        float(max_wavelength),
        -ops.arange(0, dim, 2, dtype=wide) / float(dim),
    ) / float(scaling_factor)
    angles = positions[..., None] * inverse_freq  # (B|1, T, D/2)
    angles = ops.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos = ops.cast(ops.cos(angles), x.dtype)
    sin = ops.cast(ops.sin(angles), x.dtype)
    x1, x2 = ops.split(x, 2, axis=-1)
    rotated = ops.concatenate([-x2, x1], axis=-1)
    return x * cos + rotated * sin


def alibi_slopes(num_heads, alibi_bias_max=8):
    """The ALiBi slope of each of `num_heads` heads, a list of floats.

    The geometric sequence of Press et al. (2022) from `2 ** (-alibi_bias_max
    / n)`; a head count that is not a power of two takes the next power's
    odd slopes for the rest, as the paper's code (and keras-hub) do.
    """

    check_positive_int("num_heads", num_heads)

    def powers_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - math.log2(alibi_bias_max))))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return powers_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return (
        powers_of_two(closest)
        + alibi_slopes(2 * closest, alibi_bias_max)[0::2][: num_heads - closest]
    )


def alibi_bias(slopes, q_start, q_size, k_start, k_size, dtype="float32"):
    """`slope * (s - t)` `(1, H, q_size, k_size)` for query rows from
    `q_start` and keys from `k_start` (ints or scalar tensors), in `dtype`
    (float32, or float64 for float64 scores)."""
    rows = ops.arange(q_size, dtype=dtype) + ops.cast(q_start, dtype)
    cols = ops.arange(k_size, dtype=dtype) + ops.cast(k_start, dtype)
    distance = cols[None, :] - rows[:, None]  # (q_size, k_size)
    slopes = ops.reshape(ops.convert_to_tensor(slopes, dtype), (1, -1, 1, 1))
    return slopes * distance[None, None]
