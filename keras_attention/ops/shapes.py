"""Shape checks and head layout shared by the attention paths."""

import keras
from keras import ops

from keras_attention._validation import check_dtype
from keras_attention._validation import known_dim


def static_dim(x, axis):
    """`x.shape[axis]` as an int, or `None` where it is unknown (`known_dim`)."""
    return known_dim(x.shape[axis])


def pad(x, widths, constant_values=None):
    """`keras.ops.pad(x, widths, constant_values=...)`, constant mode.

    On torch a tensor goes to `torch.nn.functional.pad` directly: Keras's
    `ops.pad` builds an `Operation` at every call, and after it
    `torch.compile` breaks the graph at the next Keras layer call (Dynamo
    cannot trace the `inspect` binding of a class made in the trace).
    """
    if keras.backend.backend() == "torch":
        import torch

        if isinstance(x, torch.Tensor):
            flat = [n for pair in reversed(widths) for n in pair]
            value = 0 if constant_values is None else constant_values
            return torch.nn.functional.pad(x, flat, value=value)
    return ops.pad(x, widths, constant_values=constant_values)


def fori_loop(lower, upper, body, init, one_at_a_time=False):
    """`keras.ops.fori_loop(lower, upper, body, init)` for every loop of
    the attention paths.

    On TensorFlow, with bounds known when traced, the loop is told its
    trip count (`maximum_iterations`): XLA compiles the gradient of a
    loop only then. A second-order gradient (a Hessian-vector product, a
    gradient penalty) differentiates the loops of our cores' own backward
    passes, which under `jit_compile=True` otherwise failed ("XLA
    compilation requires a fixed tensor list size"). `one_at_a_time`:
    TensorFlow's graph executor starts no iteration before the last one
    ended (its default starts up to ten at once, each holding its step's
    tensors). Elsewhere, `keras.ops.fori_loop`.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.fori_loop(lower, upper, body, init)
    import tensorflow as tf

    count = None
    if isinstance(lower, int) and isinstance(upper, int):
        count = max(0, upper - lower)
    elif isinstance(lower, int) and lower == 0:
        # A length known only when run (`chunked_heads` on an unknown
        # length): XLA folds the count from the input's shape.
        count = tf.maximum(upper, 0)
    return tf.while_loop(
        lambda i, carry: i < upper,
        lambda i, carry: (i + 1, body(i, carry)),
        (tf.constant(lower) if isinstance(lower, int) else lower, init),
        maximum_iterations=count,
        parallel_iterations=1 if one_at_a_time else 10,
    )[1]


def jax_x64():
    """Whether Keras runs on JAX with `jax_enable_x64` on."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    return bool(jax.config.jax_enable_x64)


def index_dtype():
    """The integer type of Python ints in index arithmetic: int64 in JAX's
    x64 mode, else int32 (positions given to keras-hub's layers, which add
    Python ints to them)."""
    return "int64" if jax_x64() else "int32"


def start_indices(*starts):
    """`starts` for `ops.slice` / `ops.slice_update`, all of one integer
    type: in JAX's x64 mode a Python int becomes an int64 beside an int32
    index tensor (a sampler's, a cache's), which `dynamic_slice` refuses.
    Unchanged on the other backends."""
    if keras.backend.backend() != "jax":
        return list(starts)
    tensors = [x for x in starts if not isinstance(x, int)]
    if not tensors:
        return list(starts)
    dtype = keras.backend.standardize_dtype(tensors[0].dtype)
    return [ops.cast(x, dtype) for x in starts]


def _disagree(a, b):
    """Whether two dimensions are both known and differ."""
    a, b = known_dim(a), known_dim(b)
    return None not in (a, b) and a != b


def broadcasts(shape, target):
    """Whether a static `shape` broadcasts to `target` (aligned on the
    right) wherever both sizes are known: the one rule of the masks' and
    biases' checks."""
    shape, target = tuple(shape), tuple(target)
    return len(shape) <= len(target) and all(
        not _disagree(d, e) or known_dim(d) == 1
        for d, e in zip(reversed(shape), reversed(target))
    )


def check_attention_inputs(query, key, value):
    """Raise unless `query` `(B, T, H, D)`, `key` `(B, S, K, D)` and
    `value` `(B, S, K, Dv)` are float tensors that agree wherever their
    dimensions are known."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if len(x.shape) != 4:
            raise ValueError(
                f"Received an invalid value for argument `{name}`, expected a "
                f"rank-4 tensor (B, T, H, D). Received: {name}.shape="
                f"{tuple(x.shape)}"
            )
        # An integer query would be scaled by an integer `scale` (0).
        check_dtype(name, x, "float", "a float tensor")
    if _disagree(key.shape[0], query.shape[0]) or _disagree(
        value.shape[0], query.shape[0]
    ):
        raise ValueError(
            "Expected `query`, `key` and `value` to have the same batch size. "
            f"Received: query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}"
        )
    if _disagree(key.shape[1], value.shape[1]):
        raise ValueError(
            "Expected `key` and `value` to have the same length S. "
            f"Received: key.shape={tuple(key.shape)}, "
            f"value.shape={tuple(value.shape)}"
        )
    q_heads, k_heads, v_heads = query.shape[2], key.shape[2], value.shape[2]
    if k_heads != v_heads:
        raise ValueError(
            "Expected `key` and `value` to have the same number of heads. "
            f"Received: key.shape={tuple(key.shape)}, "
            f"value.shape={tuple(value.shape)}"
        )
    if None not in (q_heads, k_heads) and q_heads % k_heads:
        raise ValueError(
            "Expected the number of query heads to be a multiple of the "
            f"number of key heads. Received: query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )
    if None not in (query.shape[-1], key.shape[-1]) and (
        query.shape[-1] != key.shape[-1]
    ):
        raise ValueError(
            "Expected `query` and `key` to have the same head size. "
            f"Received: query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )


def check_attention_mask(attention_mask, mask, query, key):
    """Raise unless `mask` (`attention_mask` made rank 4 by `expand_mask`)
    broadcasts to the scores `(B, H, T, S)` wherever both are known."""
    if mask is None:
        return
    scores = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
    if not broadcasts(mask.shape, scores):
        raise ValueError(
            "Received an invalid value for argument `attention_mask`, "
            "expected a boolean tensor that broadcasts to the scores "
            f"(B, H, T, S) = {scores} as (B, S), (B, T, S) or (B, H, T, S). "
            f"Received: attention_mask.shape={tuple(attention_mask.shape)}"
        )


def check_bias(bias, query, key):
    """Raise unless `bias` broadcasts to the scores `(B, H, T, S)` wherever
    both are known."""
    if bias is None:
        return
    scores = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
    shape = tuple(getattr(bias, "shape", ()))
    if not broadcasts(shape, scores):
        raise ValueError(
            "Received an invalid value for argument `bias`, expected a tensor "
            f"that broadcasts to the scores (B, H, T, S) = {scores}. "
            f"Received: bias.shape={shape}"
        )


def check_alibi_slopes(alibi_slopes, query):
    """Raise unless `alibi_slopes` holds one slope per query head `(H,)`."""
    if alibi_slopes is None:
        return
    shape = tuple(getattr(alibi_slopes, "shape", (len(alibi_slopes),)))
    if len(shape) != 1 or _disagree(shape[0], query.shape[2]):
        raise ValueError(
            "Received an invalid value for argument `alibi_slopes`, expected "
            f"one slope per query head, shape ({query.shape[2]},). "
            f"Received: alibi_slopes.shape={shape}"
        )


def repeat_heads(x, num_heads):
    # (B, S, K, D) -> (B, S, H, D) for grouped-query attention.
    k = x.shape[2]
    if k == num_heads:
        return x
    return ops.repeat(x, num_heads // k, axis=2)


def static_lengths(query, key, path):
    """`(T, S)` as ints, or a `ValueError` naming `path` (the blocked
    path needs them static)."""
    t_len, s_len = static_dim(query, 1), static_dim(key, 1)
    if s_len is None or t_len is None:
        raise ValueError(
            f"Received an invalid value for argument `implementation`: the "
            f"{path} attention path needs static sequence lengths, and a "
            f"traced length is unknown (a `tf.function` or export signature "
            f"with `None`, or `model.predict` retracing for a second "
            f"length). Give the inputs one fixed length (pad them), or use "
            f"implementation='chunked' (which takes unknown lengths on "
            f"TensorFlow) or implementation='auto'. Received: "
            f"query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )
    return t_len, s_len


def lengths(query, key):
    """`(T, S)`: ints where known when traced, else scalar tensors
    (TensorFlow's unknown lengths, which the chunked path takes)."""
    t_len, s_len = static_dim(query, 1), static_dim(key, 1)
    return (
        ops.shape(query)[1] if t_len is None else t_len,
        ops.shape(key)[1] if s_len is None else s_len,
    )


def broadcast_unknown_mask_axes(mask, t_len, s_len):
    """The rank-4 `mask`, broadcast to `T` (`S`) on its query (key) axis
    where that axis's size is unknown when traced: the chunked and blocked
    paths slice an axis unless it is known to be 1, and a `(B, 1, S)` mask
    traced as `(None, None, None)` failed when run ("Expected size[2] in
    [0, 1]")."""
    if mask is None or None not in tuple(mask.shape)[2:]:
        return mask
    shape = list(ops.shape(mask))
    for axis, size in ((2, t_len), (3, s_len)):
        if mask.shape[axis] is None:
            shape[axis] = size
    return ops.broadcast_to(mask, shape)


def check_mask_rows(mask, t_len):
    """Raise unless the rank-4 `mask`'s query axis is 1 or `T` (when
    both are known when traced)."""
    if not isinstance(t_len, int) or mask is None or mask.shape[2] is None:
        return
    if mask.shape[2] not in (1, t_len):
        raise ValueError(
            "Received an invalid value for argument `attention_mask`, its "
            f"query axis must be 1 or {t_len}. Received: "
            f"attention_mask.shape={tuple(mask.shape)}"
        )
