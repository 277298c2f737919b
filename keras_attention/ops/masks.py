"""Masks and softmaxes: float32 softmax where a fully masked row gives 0."""

import numbers
import warnings

import keras
import numpy as np
from keras import ops

from keras_attention._validation import check_known_ids
from keras_attention.ops.shapes import broadcasts

# A finite "minus infinity": large enough that exp() underflows to 0 in
# float32, small enough that subtracting two of them never gives inf - inf.
MASK_VALUE = -1e30


def wide_dtype(dtype):
    """The dtype softmaxes and gradient sums accumulate in: float64 for
    float64 tensors, float32 for every other float dtype."""
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"


def widened(x):
    """`x` in `wide_dtype` when it is a float tensor (float16 or bfloat16
    weights read as float32, for NumPy and pictures), else unchanged."""
    dtype = keras.backend.standardize_dtype(x.dtype)
    return ops.cast(x, wide_dtype(dtype)) if "float" in dtype else x


def matmul(x1, x2):
    """`ops.matmul` that multiplies float64 operands in float64. Keras's
    matmul computes in `keras.backend.result_type` of its operands, which
    maps float64 to float32 on every backend but TensorFlow (Keras 3.15,
    `BIT64_TO_BIT32_DTYPE`): float64 attention on torch was float32-accurate
    (~1e-7). `ops.einsum` multiplies in the operands' own dtype."""
    if (
        keras.backend.backend() == "tensorflow"
        or keras.backend.standardize_dtype(x1.dtype) != "float64"
    ):
        return ops.matmul(x1, x2)
    equation = "...ij,j->...i" if len(x2.shape) == 1 else "...ij,...jk->...ik"
    return ops.einsum(equation, x1, x2)


def scalar_as(value, dtype):
    """`value` as a scalar of `dtype`, a Python number rounded once: on
    TensorFlow `ops.cast` of a Python float goes through float32 (keras's
    floatx), so a float64 score scale like `1 / sqrt(8)` kept float32's
    precision only. (TensorFlow only: elsewhere a Python float converts
    exactly, and a NumPy scalar broke `torch.compile`'s graph.)"""
    if isinstance(value, numbers.Real) and keras.backend.backend() == "tensorflow":
        value = np.float64(value)
    return ops.cast(value, dtype)


def masked_softmax(scores, mask=None, axis=-1, float32=True, empty_rows=True):
    """Softmax of `scores` along `axis`, in float32 (float64 for float64
    scores), ignoring masked entries.

    Args:
        scores: a float tensor of any dtype.
        mask: optional boolean tensor broadcastable to `scores`; `True`
            keeps an entry, `False` removes it.
        axis: the axis to normalise over.
        float32: compute in float32, float64 for float64 scores
            (`False`: in `scores`' dtype, as the
            bfloat16 attention core does; the backend's softmax
            accumulates in float32 either way).
        empty_rows: whether a row may have all its entries masked (`False`
            when the caller knows each row keeps one, as under a causal
            mask alone: a pass over the scores fewer).

    Returns:
        A tensor of `scores`' shape and dtype. Rows whose entries are all
        masked are all zeros. Over an axis of one entry (one key) the
        weights are 1, without Keras's "did you mean a sigmoid?" warning.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> scores = np.array([[1.0, 2.0, 3.0]], "float32")
    >>> w = masked_softmax(scores, np.array([[1, 1, 0]]))
    >>> np.round(keras.ops.convert_to_numpy(w), 3)
    array([[0.269, 0.731, 0.   ]], dtype=float32)
    """
    dtype = keras.backend.standardize_dtype(scores.dtype)
    x = ops.cast(scores, wide_dtype(dtype)) if float32 else scores
    if mask is not None:
        if not broadcasts(mask.shape, scores.shape):
            raise ValueError(
                "Received an invalid value for argument `mask`, expected a "
                "shape that broadcasts to scores.shape="
                f"{tuple(scores.shape)}. Received: mask.shape={tuple(mask.shape)}"
            )
        mask = ops.cast(mask, "bool")
        # The backend's fused softmax (one pass where the masked loop took
        # five); a fully masked row comes out uniform and is zeroed after.
        x = ops.where(mask, x, ops.cast(MASK_VALUE, x.dtype))
    if x.shape[axis] == 1:
        # One key: the weights are 1, which Keras warns about. The same
        # softmax, not a one-key form: torch's ONNX export traces unknown
        # sizes as 1, and would write that form for every length.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "You are using a softmax over axis")
            weights = ops.softmax(x, axis=axis)
    else:
        weights = ops.softmax(x, axis=axis)
    if mask is not None and empty_rows:
        weights = ops.where(mask, weights, ops.cast(0.0, weights.dtype))
    return ops.cast(weights, dtype)


def _check_segments(scores, segment_ids, num_segments):
    """`segment_ids` one per entry of `scores`, in `[0, num_segments)` where
    their values are known (TensorFlow raised from inside its segment op;
    a negative id was silently a segment of its own)."""
    if isinstance(num_segments, (bool, float)) or (
        isinstance(num_segments, numbers.Integral) and num_segments < 0
    ):
        raise ValueError(
            "Received an invalid value for argument `num_segments`, expected "
            f"an int >= 0. Received: num_segments={num_segments!r}"
        )
    if isinstance(segment_ids, (list, tuple)):
        segment_ids = np.asarray(segment_ids)
    shape = tuple(segment_ids.shape)
    entries = scores.shape[0] if len(scores.shape) else None
    if len(shape) != 1 or (
        shape[0] is not None and entries is not None and shape[0] != entries
    ):
        raise ValueError(
            "Received an invalid value for argument `segment_ids`, expected "
            f"one id per entry of `scores`, shape ({entries},). Received: "
            f"segment_ids.shape={shape}"
        )
    if isinstance(num_segments, numbers.Integral):  # not a traced size
        check_known_ids(
            "segment_ids", segment_ids, num_segments, "segment ids",
            f"num_segments={num_segments}",
        )


def segment_softmax(scores, segment_ids, num_segments, mask=None):
    """Softmax of `scores` within each segment (e.g. a node's incoming edges).

    Args:
        scores: float tensor `(E, ...)`.
        segment_ids: int tensor `(E,)`, the segment of each entry, in
            `[0, num_segments)`.
        num_segments: the static number of segments.
        mask: optional boolean `(E,)` or `(E, ...)`; masked entries get 0.

    Returns:
        A tensor of `scores`' shape and dtype; the entries of each segment sum
        to 1 (or are all 0 if the segment has no unmasked entry).

    Raises:
        ValueError: `num_segments` not an int >= 0, `segment_ids` not one
            per entry of `scores`, or (where their values are known) ids
            outside `[0, num_segments)`.

    Example:

    >>> import numpy as np
    >>> weights = segment_softmax(
    ...     np.zeros(3, "float32"), np.array([0, 0, 1]), num_segments=2)
    >>> ops.convert_to_numpy(weights).tolist()
    [0.5, 0.5, 1.0]
    """
    _check_segments(scores, segment_ids, num_segments)
    return segment_softmax_of_checked_ids(scores, segment_ids, num_segments, mask)


def segment_softmax_of_checked_ids(scores, segment_ids, num_segments, mask=None):
    """`segment_softmax` without the checks of `segment_ids`, for a caller
    that has checked them (`GraphAttention` checks its edges): their values
    are not read back from the device on every eager call."""
    dtype = keras.backend.standardize_dtype(scores.dtype)
    x = ops.cast(scores, wide_dtype(dtype))
    if mask is not None:
        mask = ops.cast(mask, "bool")
        while len(mask.shape) < len(x.shape):
            mask = ops.expand_dims(mask, -1)
        x = ops.where(mask, x, MASK_VALUE)
    if x.shape[0] == 0:
        # No edges (an empty graph): nothing to normalise, and Keras's
        # torch `segment_max` refuses an empty input.
        return ops.cast(x, dtype)
    seg_max = ops.segment_max(x, segment_ids, num_segments=num_segments)
    # Empty segments get -inf from segment_max; they are never gathered.
    seg_max = ops.stop_gradient(ops.where(ops.isfinite(seg_max), seg_max, 0.0))
    e = ops.exp(x - ops.take(seg_max, segment_ids, axis=0))
    if mask is not None:
        e = ops.where(mask, e, 0.0)
    total = ops.segment_sum(e, segment_ids, num_segments=num_segments)
    total = ops.take(total, segment_ids, axis=0)
    return ops.cast(e / ops.maximum(total, 1e-30), dtype)


def causal_mask(query_length, key_length, offset=0):
    """Boolean `(T, S)` mask, `True` where query `t + offset` may see key `s`.

    The default `offset=0` aligns the first query with the first key, as
    `keras.layers.MultiHeadAttention` does. With `offset = S - T` the last
    query sees every key (queries that continue a cache of `S - T` earlier
    positions).
    """
    # int32 given: Keras's torch `arange` cannot infer the type of a
    # symbolic length (`torch.compile(dynamic=True)`, `torch.export`).
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32") + offset, -1)
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    return ops.greater_equal(rows, cols)


def sliding_window_mask(query_length, key_length, window, offset=0,
                        is_causal=False):
    """Boolean `(T, S)` band, `True` where `|t + offset - s| < window`.

    keras's `sliding_window`: a symmetric band; with `is_causal` only its
    lower half `0 <= t + offset - s < window` (Mistral's causal window).
    Built from two aranges, never from a larger mask.
    """
    # int32 given: Keras's torch `arange` cannot infer the type of a
    # symbolic length (`torch.compile(dynamic=True)`, `torch.export`).
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32") + offset, -1)
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    distance = rows - cols
    if is_causal:
        return ops.logical_and(
            ops.greater_equal(distance, 0), ops.less(distance, window)
        )
    return ops.less(ops.abs(distance), window)


def check_sliding_window(sliding_window):
    """`sliding_window` if it is `None` or a positive int, else `ValueError`."""
    if sliding_window is None:
        return None
    if (
        isinstance(sliding_window, bool)
        or not isinstance(sliding_window, numbers.Integral)
        or sliding_window <= 0
    ):
        raise ValueError(
            "Received an invalid value for argument `sliding_window`, "
            "expected a positive integer or None. "
            f"Received: sliding_window={sliding_window!r}"
        )
    return int(sliding_window)


def expand_mask(mask):
    """A mask of rank 2 `(B, S)` or 3 `(B, T, S)` as rank 4 `(B, 1|H, T, S)`."""
    if mask is None:
        return None
    mask = ops.cast(mask, "bool")
    rank = len(mask.shape)
    # `expand_dims`, not `[:, None]`: LiteRT runs a strided slice that adds
    # axes to a tensor of unknown size only with TensorFlow's own ops.
    if rank == 2:
        return ops.expand_dims(ops.expand_dims(mask, 1), 1)
    if rank == 3:
        return ops.expand_dims(mask, 1)
    if rank == 4:
        return mask
    raise ValueError(
        "Received an invalid value for argument `attention_mask`, expected a "
        "boolean tensor of rank 2 (B, S), 3 (B, T, S) or 4 (B, H, T, S). "
        f"Received: attention_mask.shape={tuple(mask.shape)}"
    )


def mask_arguments(mask):
    """`(mask,)` as a tensor, or `()`: a custom gradient's extra arguments.

    The mask goes into the custom gradient as an argument, never in its
    closure: JAX's SavedModel export (`model.export` through jax2tf)
    converts the backward pass on its own, where a tracer closed over from
    the forward pass is unbound."""
    return () if mask is None else (ops.convert_to_tensor(mask),)
