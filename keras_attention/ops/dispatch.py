"""Attention dispatch: the dense path, the fused kernels, the long paths.

`dot_product_attention` checks its inputs once and picks a path: the
backend's fused kernel; for long sequences the memory-efficient blocked
path (`ops/blocked.py`) or the chunked one (`ops/dense.py`); or the dense
path, which has its own backward pass when no weights, bias or dropout are
involved (`dense.dense_core`; `dense_custom_gradient(False)` or the
`custom_gradient=False` argument gives autodiff's, for comparisons).
"""

import contextlib
import math
import numbers
import threading

import keras
from keras import ops

from keras_attention._validation import check_positive_int
from keras_attention._validation import check_rate
from keras_attention.ops import autotune
from keras_attention.ops import xla_cpu
from keras_attention.ops.blocked import DEFAULT_BLOCK_SIZE
from keras_attention.ops.blocked import DEFAULT_QUERY_BLOCK_SIZE
from keras_attention.ops.blocked import blocked_heads
from keras_attention.ops.dense import chunked_heads
from keras_attention.ops.dense import dense_core
from keras_attention.ops.dense import scores_of
from keras_attention.ops.masks import causal_mask
from keras_attention.ops.masks import check_sliding_window
from keras_attention.ops.masks import expand_mask
from keras_attention.ops.masks import masked_softmax
from keras_attention.ops.masks import matmul
from keras_attention.ops.masks import scalar_as
from keras_attention.ops.masks import sliding_window_mask
from keras_attention.ops.masks import wide_dtype
from keras_attention.ops.positions import alibi_bias
from keras_attention.ops.random import hash_dropout
from keras_attention.ops.shapes import check_attention_inputs
from keras_attention.ops.shapes import check_alibi_slopes
from keras_attention.ops.shapes import check_attention_mask
from keras_attention.ops.shapes import check_bias
from keras_attention.ops.shapes import repeat_heads
from keras_attention.ops.shapes import static_dim

# The dense path is used below this many scores per (batch, head) pair.
DENSE_THRESHOLD = 1024 * 1024

_CONFIG = {"dense_custom_gradient": True}
# A `dense_custom_gradient` block's setting, per thread (Keras's scopes
# are per thread too): another thread keeps the process-wide one.
_BLOCKS = threading.local()

IMPLEMENTATIONS = ("auto", "dense", "blocked", "chunked", "fused")


def set_dense_custom_gradient(enabled):
    """Whether the dense path uses its own backward pass (default `True`),
    for every thread outside a `dense_custom_gradient` block.

    Read when a function is traced; the `custom_gradient` argument of
    `dot_product_attention` overrides it for one call.
    """
    _CONFIG["dense_custom_gradient"] = bool(enabled)


def _dense_custom_gradient_setting():
    blocks = getattr(_BLOCKS, "stack", None)
    return blocks[-1] if blocks else _CONFIG["dense_custom_gradient"]


@contextlib.contextmanager
def dense_custom_gradient(enabled):
    """`set_dense_custom_gradient(enabled)` inside a `with` block only, for
    the calling thread (other threads, and functions they trace
    meanwhile, keep theirs).

    Example:

    >>> from keras_attention.ops import dense_custom_gradient
    >>> with dense_custom_gradient(False):
    ...     pass  # e.g. jax.jvp through the layers: autodiff's backward
    """
    stack = getattr(_BLOCKS, "stack", None)
    if stack is None:
        stack = _BLOCKS.stack = []
    stack.append(bool(enabled))
    try:
        yield
    finally:
        stack.pop()


def check_path_takes_weights(implementation, received):
    """Raise if `implementation` cannot return weights, add a `bias` or
    drop out (`received` says which was asked for); layers call it when
    they trace symbolically, so a functional model is refused as it is
    built."""
    if implementation in ("blocked", "chunked", "fused"):
        raise ValueError(
            f"The {implementation} implementation returns no weights and "
            "supports no `bias` or dropout (in a layer: no "
            "`return_attention_scores=True` and no `dropout` while "
            "training; `implementation='dense'` or 'auto' have them). "
            f"Received: {received}"
        )


def _check_implementation(implementation, can_block, same_dims, query, value, received):
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            "Received an invalid value for argument `implementation`, "
            "expected one of 'auto', 'dense', 'blocked', 'chunked', 'fused'. "
            f"Received: implementation={implementation!r}"
        )
    if not can_block:
        check_path_takes_weights(implementation, received)
    if implementation == "fused" and not same_dims:
        raise ValueError(
            "The fused implementation needs values of the queries' head size. "
            f"Received: query.shape={tuple(query.shape)}, "
            f"value.shape={tuple(value.shape)}"
        )


def dot_product_attention(
    query,
    key,
    value,
    attention_mask=None,
    bias=None,
    is_causal=False,
    scale=None,
    dropout_rate=0.0,
    seed=None,
    training=False,
    return_weights=False,
    implementation="auto",
    block_size=None,
    custom_gradient=None,
    sliding_window=None,
    alibi_slopes=None,
    flash_attention=None,
):
    """Scaled dot-product attention (Vaswani et al., 2017).

    `softmax(Q K^T * scale + bias, masked) V`, softmax accumulated in float32
    (float16 scores too; bfloat16 heads keep bfloat16 scores on the dense
    and chunked paths, as Keras's op on TensorFlow: faster, less exact for
    large logits, BENCHMARKS.md); a fully masked query outputs zeros.

    Args:
        query: `(B, T, H, D)`.
        key: `(B, S, K, D)`; `K` divides `H` (grouped-query attention).
        value: `(B, S, K, Dv)`.
        attention_mask: optional boolean, `True` where a query may attend to
            a key: `(B, S)` (key padding), `(B, T, S)` or anything
            broadcastable to `(B, H, T, S)`.
        bias: optional additive bias broadcastable to `(B, H, T, S)`.
        is_causal: if `True`, query `t` only sees keys `s <= t`.
        scale: the score scale; defaults to `1 / sqrt(D)`.
        dropout_rate: dropout on the attention weights during training.
        seed: a `keras.random.SeedGenerator` or an int, for the dropout
            (a counter-based mask, `hash_dropout`; without a seed,
            `keras.random.dropout`).
        training: whether dropout is active.
        return_weights: also return the weights `(B, H, T, S)`, taken
            before dropout (normalised over keys, zero for a query that
            sees no key).
        implementation: `"auto"`, `"dense"`, `"blocked"`, `"chunked"`
            (the dense core over chunks of queries) or `"fused"`. `"auto"`,
            without weights, bias or dropout, takes the backend's fused
            kernel where there is one (PyTorch SDPA on torch, cuDNN on JAX
            with a GPU; not float64); elsewhere, once `T * S` passes
            `DENSE_THRESHOLD`, the fastest path for this machine and shape,
            measured at the first call (`dispatch_choices()` says what);
            else dense. A length unknown when traced (TensorFlow): dense
            while its scores fit the memory budget, else chunked, decided
            when run (under XLA dense); `"blocked"` refuses it.
        block_size: key block length of the memory-efficient path.
        custom_gradient: whether the dense path (no weights returned, no
            bias, no dropout) uses its own backward pass
            (`dense.dense_core`) instead of autodiff's; `None` takes
            `dense_custom_gradient()` (on by default).
        sliding_window: if set, query `t` sees only keys `s` with
            `|t - s| < sliding_window` (keras's meaning); with `is_causal`,
            `0 <= t - s < sliding_window` (Mistral). The blocked path then
            visits only the key blocks each query block's band meets
            (`O(T * sliding_window)` work); the dense and fused paths add
            the `(T, S)` band to the mask.
        alibi_slopes: optional ALiBi slopes, one per query head `(H,)`
            (`keras_attention.ops.positions.alibi_slopes`): adds
            `slope * (s - t)` to the scaled scores, block by block on the
            blocked path (never a `T x S` tensor there), as a bias on the
            dense and fused paths.
        flash_attention: given to the fused kernel (`"fused"`, or `"auto"`'s)
            as `keras.ops.dot_product_attention` takes it; `None` is `False`
            after `keras.config.disable_flash_attention()`, else the backend's.

    Returns:
        `output` `(B, T, H, Dv)` in `value`'s dtype, and the weights
        `(B, H, T, S)` if `return_weights`.
    """
    sliding_window = check_sliding_window(sliding_window)
    dropout_rate = _check_arguments(
        query, key, value, bias, dropout_rate, block_size, alibi_slopes
    )
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    mask = expand_mask(attention_mask)
    check_attention_mask(attention_mask, mask, query, key)
    dropout_active = dropout_rate > 0.0 and bool(training)  # RematScope: traced
    can_block = not return_weights and bias is None and not dropout_active
    same_dims = value.shape[-1] == query.shape[-1]  # the fused kernels need it
    _check_implementation(
        implementation, can_block, same_dims, query, value,
        f"return_weights={return_weights}, bias={bias is not None}, "
        f"dropout_rate={dropout_rate}, training={training}",
    )
    path = _pick_path(implementation, can_block, same_dims, query, key, sliding_window)
    if path == "measure":
        path = _measured_path(
            query, key, value, mask, is_causal, scale, block_size,
            sliding_window, alibi_slopes, training,
        )
    if path in ("chunked", "blocked", "by length"):
        return _long_path(
            path, query, key, value, mask, is_causal, scale, block_size,
            sliding_window, alibi_slopes, custom_gradient,
        )
    mask = _with_band(mask, sliding_window, query, key)
    if path == "fused":
        return fused_attention(
            query, key, value, mask, is_causal, scale, alibi_slopes,
            flash_attention,
        )

    if custom_gradient is None:
        custom_gradient = _dense_custom_gradient_setting()
    if alibi_slopes is not None:
        bias = _with_alibi(bias, alibi_slopes, query, key)
        custom_gradient = False  # its backward pass takes no bias
    return _dense_path(
        query, key, value, mask, bias, is_causal, scale, dropout_rate, seed,
        dropout_active, return_weights, custom_gradient and can_block,
    )


def _with_band(mask, sliding_window, query, key):
    """`mask` and the `(T, S)` band of `sliding_window` (if any)."""
    if sliding_window is None:
        return mask
    band = sliding_window_mask(
        ops.shape(query)[1], ops.shape(key)[1], sliding_window
    )
    return band if mask is None else ops.logical_and(mask, band)


def _check_arguments(query, key, value, bias, dropout_rate, block_size,
                     alibi_slopes):
    """Raise a `ValueError` naming the first bad argument; returns
    `dropout_rate` (a float, or the caller's tensor)."""
    check_attention_inputs(query, key, value)
    check_positive_int("block_size", block_size, allow_none=True)
    if isinstance(dropout_rate, numbers.Real):
        dropout_rate = check_rate("dropout_rate", dropout_rate)
    check_bias(bias, query, key)
    check_alibi_slopes(alibi_slopes, query)
    return dropout_rate


def _long_path(path, query, key, value, mask, is_causal, scale, block_size,
               sliding_window, alibi_slopes, custom_gradient=None):
    """The chunked or the blocked path, neither of which holds the
    `(B, H, T, S)` scores; `"by length"`: the chunked path or the dense
    one, picked when run by the lengths (TensorFlow, a length unknown
    when traced)."""
    if path == "by length":
        return _by_length(
            query, key, mask, is_causal, sliding_window, alibi_slopes,
            lambda: dot_product_attention(
                query, key, value, mask, is_causal=is_causal, scale=scale,
                implementation="dense", custom_gradient=custom_gradient,
                sliding_window=sliding_window, alibi_slopes=alibi_slopes,
            ),
            lambda: _long_path(
                "chunked", query, key, value, mask, is_causal, scale,
                block_size, sliding_window, alibi_slopes,
            ),
        )
    if path == "chunked" or query.shape[0] == 0:
        # An empty batch goes to the chunked path: Keras refuses the blocked
        # core's running maximum of an empty tensor on TensorFlow.
        return chunked_heads(
            query, key, value, mask, is_causal, scale, sliding_window,
            alibi_slopes,
        )
    return blocked_heads(
        query, key, value, mask, is_causal, scale,
        block_size or DEFAULT_BLOCK_SIZE, DEFAULT_QUERY_BLOCK_SIZE,
        sliding_window, alibi_slopes,
        xla_cpu.compiles_blocked_core(query, key, value),
    )


def _pick_path(implementation, can_block, same_dims, query, key, sliding_window):
    """The path asked for, or `"auto"`'s: `"fused"`, `"dense"`,
    `"measure"` (long sequences without a fused kernel: `autotune` picks
    dense or blocked), or `"by length"` (TensorFlow, a length unknown when
    traced: the chunked path for long ones, chosen when run)."""
    if implementation != "auto":
        return implementation
    t_len, s_len = static_dim(query, 1), static_dim(key, 1)
    if (
        None in (t_len, s_len) and can_block
        and keras.backend.backend() == "tensorflow"
        and autotune.tf_mode() == "graph" and not _fused_kernel_available()
    ):
        # Under XLA the dense path stays: XLA refused the gradient of the
        # condition (its branches see the lengths as dynamic sizes).
        return "by length"
    long_enough = (
        t_len is not None
        and s_len is not None
        and t_len * s_len > DENSE_THRESHOLD
    )
    if can_block and long_enough and (
        sliding_window is not None or not _fused_kernel_available()
    ):
        return "measure"
    if can_block and same_dims and _fused_kernel_available() and not (
        keras.backend.standardize_dtype(query.dtype) == "float64"
    ):
        # Keras 3.15's fused op computes float64 in float32 (its
        # `result_type`), so a float64 call stays on the dense path.
        return "fused"
    return "dense"


def _by_length(query, key, mask, is_causal, sliding_window, alibi_slopes,
               dense, chunked):
    """`dense()` while the call's three `(B, H, T, S)` float32 score
    tensors fit the memory budget (`autotune.memory_budget`, the rule that
    makes the dense path a candidate of `autotune.choose`), else
    `chunked()`: decided when run (`keras.ops.cond`; both are traced),
    against the budget as it was when traced (a constant of the graph,
    exported with it)."""
    autotune.record_rule(
        ("unknown length", keras.backend.backend(), autotune.tf_mode(),
         tuple(query.shape), tuple(key.shape),
         keras.backend.standardize_dtype(query.dtype), bool(is_causal),
         sliding_window, None if mask is None else tuple(mask.shape),
         alibi_slopes is not None),
        "dense or chunked",
        "rule: a length unknown when traced; when run, dense while its "
        f"scores fit the memory budget ({autotune.memory_budget():,} "
        "bytes), else chunked",
    )
    size = 3 * 4 * query.shape[2]
    for n in (ops.shape(query)[0], ops.shape(query)[1], ops.shape(key)[1]):
        size = size * ops.cast(n, "int64")
    return ops.cond(size > autotune.memory_budget(), chunked, dense)


def _measured_path(
    query, key, value, mask, is_causal, scale, block_size, sliding_window,
    alibi_slopes, training,
):
    """`"dense"`, `"blocked"` or `"chunked"`, the fastest for this call
    (`autotune`)."""

    def run(path, q, k, v, m, causal=is_causal):
        return dot_product_attention(
            q, k, v, attention_mask=m, is_causal=causal, scale=scale,
            implementation=path, block_size=block_size,
            sliding_window=sliding_window, alibi_slopes=alibi_slopes,
        )

    return autotune.choose(
        run, query, key, value, mask, is_causal, sliding_window, training,
        alibi=alibi_slopes is not None,
    )


def _with_alibi(bias, alibi_slopes, query, key):
    """`bias` plus ALiBi's `slope * (s - t)`, in float32 (float64 for
    float64 queries)."""
    wide = wide_dtype(query.dtype)
    alibi = alibi_bias(
        alibi_slopes, 0, ops.shape(query)[1], 0, ops.shape(key)[1], wide
    )
    return alibi if bias is None else ops.cast(bias, wide) + alibi


def _dense_path(
    query, key, value, mask, bias, is_causal, scale, dropout_rate, seed,
    dropout_active, return_weights, custom_gradient,
):
    """The dense path: the `(B, H, T, S)` scores, their softmax, the sum.

    float16 heads multiply the weights by the values in float32 (the
    backward's `dO V^T` overflowed float16's 65,504 for large values and
    gradients: NaN where the other paths are finite), and with a `scale`
    above 1 the whole path runs in float32 (`q * scale` overflowed)."""
    num_heads = query.shape[2]
    out_dtype, weights_dtype = value.dtype, query.dtype
    half = keras.backend.standardize_dtype(query.dtype) == "float16"
    if half and not (isinstance(scale, numbers.Real) and scale <= 1):
        query, key, value = (ops.cast(x, "float32") for x in (query, key, value))
        half = False
    key = repeat_heads(key, num_heads)
    value = repeat_heads(value, num_heads)
    q = ops.transpose(query, (0, 2, 1, 3)) * scalar_as(scale, query.dtype)
    mask = _with_causal(mask, is_causal, query, key)
    if custom_gradient:
        out = dense_core(
            q,
            ops.transpose(key, (0, 2, 1, 3)),
            ops.transpose(value, (0, 2, 1, 3)),
            mask,
        )
        return ops.cast(ops.transpose(out, (0, 2, 1, 3)), out_dtype)
    scores = scores_of(q, ops.transpose(key, (0, 2, 1, 3)))  # (B, H, T, S)
    if bias is not None:
        wide = wide_dtype(scores.dtype)
        scores = ops.cast(scores, wide) + ops.cast(bias, wide)
    weights = masked_softmax(scores, mask)
    # The weights returned are those before dropout (they sum to one), as
    # keras.layers.MultiHeadAttention returns them; dropout only reaches the
    # weighted sum.
    dropped = weights
    if dropout_active:
        if seed is None:
            dropped = keras.random.dropout(weights, dropout_rate)
        else:
            # Counter-based mask: a few fused integer operations under XLA,
            # where the backend's generator is slow on CPU (`hash_dropout`).
            dropped = hash_dropout(weights, dropout_rate, seed)
    v = ops.transpose(value, (0, 2, 1, 3))
    v = ops.cast(v, "float32") if half else v
    out = matmul(ops.cast(dropped, v.dtype), v)  # (B, H, T, Dv)
    out = ops.cast(ops.transpose(out, (0, 2, 1, 3)), out_dtype)
    if return_weights:
        # In the heads' dtype, as without a bias (and as keras's layer).
        return out, ops.cast(weights, weights_dtype)
    return out


_FUSED = {}


def _fused_kernel_available():
    """Whether `keras.ops.dot_product_attention` runs a fused kernel.

    True on the torch backend, CPU or CUDA (`scaled_dot_product_attention`
    has fused kernels for both), and on the JAX backend with a GPU (cuDNN's
    flash attention through `jax.nn.dot_product_attention`). TensorFlow's
    version, and JAX's on the CPU, are chains of plain ops, so there the
    blocked path stays.
    """
    backend = keras.backend.backend()
    if backend not in _FUSED:
        available = False
        try:
            if backend == "jax":
                import jax

                available = jax.default_backend() == "gpu"
            elif backend == "torch":
                available = True
        except Exception:  # pragma: no cover - a broken accelerator stack
            available = False
        _FUSED[backend] = available
    return _FUSED[backend]


def fused_attention(query, key, value, mask=None, is_causal=False, scale=None,
                    alibi_slopes=None, flash_attention=None):
    """`keras.ops.dot_product_attention` with this module's semantics.

    Same layout and arguments as `dot_product_attention` (boolean `mask`
    broadcastable to `(B, H, T, S)`); grouped key/value heads go to the
    backend as they are (each backend's kernel shares them), and a query
    whose keys are all masked outputs zeros (the fused kernels would average
    the masked values). `alibi_slopes` `(H,)` go to the kernel as a
    `(1, H, T, S)` bias, with the mask and causality folded into it when
    there are any (torch's kernel takes a bias or a mask, not both).
    """
    num_heads = query.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    flash = _flash_setting() if flash_attention is None else flash_attention
    out_dtype = value.dtype
    if keras.backend.backend() == "tensorflow" and (
        keras.backend.standardize_dtype(query.dtype) == "float16"
    ):
        # keras's TensorFlow kernel computes the scores in float16, which
        # overflow (NaN) where the others accumulate in float32.
        query, key, value = (ops.cast(x, "float32") for x in (query, key, value))
    if keras.backend.backend() == "tensorflow" and key.shape[2] == 1 < num_heads:
        # keras's TensorFlow kernel shares grouped heads only from two of
        # them: one key/value head fails in its einsum.
        key, value = repeat_heads(key, num_heads), repeat_heads(value, num_heads)
    bias = None
    if alibi_slopes is not None:
        bias = alibi_bias(
            alibi_slopes, 0, ops.shape(query)[1], 0, ops.shape(key)[1],
            wide_dtype(query.dtype),
        )
        bias = ops.cast(bias, query.dtype)
        if mask is not None or is_causal:
            # torch's kernel takes a bias or a mask, and no bias with
            # `is_causal`: the mask goes into the bias, on every backend.
            mask, is_causal = _with_causal(mask, is_causal, query, key), False
            bias = ops.where(mask, bias, _large_negative(query.dtype))
            out = ops.dot_product_attention(
                query, key, value, bias=bias, scale=scale,
                flash_attention=flash,
            )
            return _zero_unseen(out, mask, False, num_heads, out_dtype)
    out = ops.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=scale,
        is_causal=is_causal, flash_attention=flash,
    )
    return _zero_unseen(out, mask, is_causal, num_heads, out_dtype)


def _flash_setting():
    """`False` after `keras.config.disable_flash_attention()`, else `None`
    (the backend decides), as Keras's own layer passes it: without it the
    kernel could take flash attention the user switched off."""
    return False if keras.config.is_flash_attention_enabled() is False else None


def _with_causal(mask, is_causal, query, key):
    """`mask` and, with `is_causal`, the causal `(T, S)` mask: one boolean
    mask broadcastable to `(B, H, T, S)`."""
    if not is_causal:
        return mask
    causal = causal_mask(ops.shape(query)[1], ops.shape(key)[1])
    return causal if mask is None else ops.logical_and(mask, causal)


def _large_negative(dtype):
    """A score no key outweighs, finite in `dtype` (as keras's kernels)."""
    dtype = keras.backend.standardize_dtype(dtype)
    return ops.cast(-0.7 * (65504.0 if dtype == "float16" else 3.38e38), dtype)


def _zero_unseen(out, mask, is_causal, num_heads, out_dtype):
    """The fused kernel's output `(B, T, H, D)` with zeros for a query that
    sees no key under `mask` (and causality), in `out_dtype`."""
    if mask is not None:
        # Does query t see any key at all? (B, 1|H, 1|T) from the mask.
        seen = ops.any(mask, axis=-1)
        if is_causal:
            # With the causal mask it must see a key s <= t: the first
            # unmasked key (per row of the mask) must come no later than t.
            first = ops.argmax(ops.cast(mask, "int32"), axis=-1)
            t_index = ops.arange(ops.shape(out)[1])
            seen = ops.logical_and(seen, first <= t_index)
        seen = ops.broadcast_to(
            seen, (ops.shape(out)[0], num_heads, ops.shape(out)[1])
        )
        seen = ops.transpose(seen, (0, 2, 1))  # (B, T, H)
        out = ops.where(ops.expand_dims(seen, -1), out, ops.zeros_like(out))
    return ops.cast(out, out_dtype)
