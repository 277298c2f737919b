"""The attention core shared by every layer, on `keras.ops` only.

Shape letters, used everywhere in keras_attention: `B` batch, `T` query
length, `S` key length, `H` query heads, `K` key/value heads (grouped-query
attention, `H % K == 0`), `D` head size, `E` edges, `N` nodes.

- `masked_softmax`: softmax in float32 whatever the input dtype; a row whose
  entries are all masked gives zeros, never NaN.
- `dot_product_attention`: scaled dot-product attention with padding masks,
  an arbitrary boolean mask, a causal flag, an additive bias, dropout on the
  weights and optionally the weights themselves. Long sequences take a
  memory-efficient path (key blocks, online softmax, recomputation in the
  backward pass) that never holds the `T x S` score matrix; shorter ones the
  dense path, with its own backward pass when no weights, bias or dropout
  are involved (`_dense_attention`).
- `segment_softmax`: softmax over groups of entries (a graph's incoming edges).
- `hash_bits`, `hash_dropout`: counter-based random bits and dropout masks,
  a few integer operations that XLA fuses (the backend's generator is slow
  under XLA on CPU); the attention core's dropout when a seed is given.
"""

import math

import keras
import numpy as np
from keras import ops

# A finite "minus infinity": large enough that exp() underflows to 0 in
# float32, small enough that subtracting two of them never gives inf - inf.
_MASK_VALUE = -1e30

# The dense path is used below this many scores per (batch, head) pair.
DENSE_THRESHOLD = 1024 * 1024
DEFAULT_BLOCK_SIZE = 256
DEFAULT_QUERY_BLOCK_SIZE = 256


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax of `scores` along `axis`, in float32, ignoring masked entries.

    Args:
        scores: a float tensor of any dtype.
        mask: optional boolean tensor broadcastable to `scores`; `True`
            keeps an entry, `False` removes it.
        axis: the axis to normalise over.

    Returns:
        A tensor of `scores`' shape and dtype. Rows whose entries are all
        masked are all zeros.

    Example:

    >>> w = masked_softmax(np.array([[1.0, 2.0, 3.0]]), np.array([[1, 1, 0]]))
    >>> np.round(keras.ops.convert_to_numpy(w), 3)
    array([[0.269, 0.731, 0.   ]], dtype=float32)
    """
    dtype = keras.backend.standardize_dtype(scores.dtype)
    x = ops.cast(scores, "float32")
    if mask is not None:
        mask = ops.cast(mask, "bool")
        x = ops.where(mask, x, _MASK_VALUE)
    x_max = ops.stop_gradient(ops.max(x, axis=axis, keepdims=True))
    e = ops.exp(x - x_max)
    if mask is not None:
        # A fully masked row has x == x_max == _MASK_VALUE, so e == 1 there;
        # zero it explicitly.
        e = ops.where(mask, e, 0.0)
    total = ops.sum(e, axis=axis, keepdims=True)
    weights = e / ops.maximum(total, 1e-30)
    return ops.cast(weights, dtype)


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
    """
    dtype = keras.backend.standardize_dtype(scores.dtype)
    x = ops.cast(scores, "float32")
    if mask is not None:
        mask = ops.cast(mask, "bool")
        while len(mask.shape) < len(x.shape):
            mask = ops.expand_dims(mask, -1)
        x = ops.where(mask, x, _MASK_VALUE)
    seg_max = ops.segment_max(x, segment_ids, num_segments=num_segments)
    # Empty segments get -inf from segment_max; they are never gathered.
    seg_max = ops.stop_gradient(ops.where(ops.isfinite(seg_max), seg_max, 0.0))
    e = ops.exp(x - ops.take(seg_max, segment_ids, axis=0))
    if mask is not None:
        e = ops.where(mask, e, 0.0)
    total = ops.segment_sum(e, segment_ids, num_segments=num_segments)
    total = ops.take(total, segment_ids, axis=0)
    return ops.cast(e / ops.maximum(total, 1e-30), dtype)


def _static_dim(x, axis):
    dim = x.shape[axis]
    return None if dim is None else int(dim)


def causal_mask(query_length, key_length, offset=0):
    """Boolean `(T, S)` mask, `True` where query `t + offset` may see key `s`.

    The default `offset=0` aligns the first query with the first key, as
    `keras.layers.MultiHeadAttention` does. With `offset = S - T` the last
    query sees every key (queries that continue a cache of `S - T` earlier
    positions).
    """
    rows = ops.expand_dims(ops.arange(query_length) + offset, -1)
    cols = ops.expand_dims(ops.arange(key_length), 0)
    return ops.greater_equal(rows, cols)


def _expand_mask(mask):
    """A mask of rank 2 `(B, S)` or 3 `(B, T, S)` as rank 4 `(B, 1|H, T, S)`."""
    if mask is None:
        return None
    mask = ops.cast(mask, "bool")
    rank = len(mask.shape)
    if rank == 2:
        return mask[:, None, None, :]
    if rank == 3:
        return mask[:, None, :, :]
    if rank == 4:
        return mask
    raise ValueError(
        "Received an invalid value for argument `attention_mask`, expected a "
        "boolean tensor of rank 2 (B, S), 3 (B, T, S) or 4 (B, H, T, S). "
        f"Received: attention_mask.shape={tuple(mask.shape)}"
    )


def _check_attention_inputs(query, key, value):
    for name, x in (("query", query), ("key", key), ("value", value)):
        if len(x.shape) != 4:
            raise ValueError(
                f"Received an invalid value for argument `{name}`, expected a "
                f"rank-4 tensor (B, T, H, D). Received: {name}.shape="
                f"{tuple(x.shape)}"
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


def _repeat_heads(x, num_heads):
    # (B, S, K, D) -> (B, S, H, D) for grouped-query attention.
    k = x.shape[2]
    if k == num_heads:
        return x
    return ops.repeat(x, num_heads // k, axis=2)


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
):
    """Scaled dot-product attention (Vaswani et al., 2017).

    `softmax(Q K^T * scale + bias, masked) V`, the softmax in float32 whatever
    the inputs' dtype. A query whose keys are all masked outputs zeros.

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
        implementation: `"auto"`, `"dense"`, `"blocked"` or `"fused"`.
            `"auto"`, when the weights are not requested and no bias or
            dropout applies, takes the backend's fused kernel on a GPU
            (`keras.ops.dot_product_attention`: cuDNN / PyTorch SDPA, on
            the JAX and torch backends) and elsewhere the memory-efficient
            blocked path once `T * S` is large; otherwise the dense path.
        block_size: key block length of the memory-efficient path.

    Returns:
        `output` `(B, T, H, Dv)` in `value`'s dtype, and the weights
        `(B, H, T, S)` if `return_weights`.
    """
    _check_attention_inputs(query, key, value)
    if implementation not in ("auto", "dense", "blocked", "fused"):
        raise ValueError(
            "Received an invalid value for argument `implementation`, "
            "expected one of 'auto', 'dense', 'blocked', 'fused'. "
            f"Received: implementation={implementation!r}"
        )
    num_heads = query.shape[2]
    head_dim = query.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    mask = _expand_mask(attention_mask)
    dropout_active = bool(training) and dropout_rate > 0.0
    t_len, s_len = _static_dim(query, 1), _static_dim(key, 1)
    long_enough = (
        t_len is not None
        and s_len is not None
        and t_len * s_len > DENSE_THRESHOLD
    )
    can_block = not return_weights and bias is None and not dropout_active
    if implementation in ("blocked", "fused") and not can_block:
        raise ValueError(
            f"The {implementation} implementation returns no weights and "
            "supports no bias or dropout. Received: "
            f"return_weights={return_weights}, bias={bias is not None}, "
            f"dropout_rate={dropout_rate}, training={training}"
        )
    same_dims = value.shape[-1] == head_dim  # the fused kernels need it
    if implementation == "fused" and not same_dims:
        raise ValueError(
            "The fused implementation needs values of the queries' head size. "
            f"Received: query.shape={tuple(query.shape)}, "
            f"value.shape={tuple(value.shape)}"
        )
    if implementation == "fused" or (
        implementation == "auto"
        and can_block
        and same_dims
        and _fused_kernel_available()
    ):
        return fused_attention(query, key, value, mask, is_causal, scale)
    if implementation == "blocked" or (
        implementation == "auto" and can_block and long_enough
    ):
        return blocked_attention(
            query,
            key,
            value,
            attention_mask=mask,
            is_causal=is_causal,
            scale=scale,
            block_size=block_size or DEFAULT_BLOCK_SIZE,
            query_block_size=DEFAULT_QUERY_BLOCK_SIZE,
        )

    out_dtype = value.dtype
    key = _repeat_heads(key, num_heads)
    value = _repeat_heads(value, num_heads)
    q = ops.transpose(query, (0, 2, 1, 3)) * ops.cast(scale, query.dtype)
    if is_causal:
        causal = causal_mask(ops.shape(query)[1], ops.shape(key)[1])
        mask = causal if mask is None else ops.logical_and(mask, causal)
    if DENSE_CUSTOM_GRADIENT and can_block:
        out = _dense_attention(
            q,
            ops.transpose(key, (0, 2, 1, 3)),
            ops.transpose(value, (0, 2, 1, 3)),
            mask,
        )
        return ops.cast(ops.transpose(out, (0, 2, 1, 3)), out_dtype)
    k = ops.transpose(key, (0, 2, 3, 1))
    scores = ops.matmul(q, k)  # (B, H, T, S)
    if bias is not None:
        scores = ops.cast(scores, "float32") + ops.cast(bias, "float32")
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
    out = ops.matmul(ops.cast(dropped, v.dtype), v)  # (B, H, T, Dv)
    out = ops.cast(ops.transpose(out, (0, 2, 1, 3)), out_dtype)
    if return_weights:
        return out, weights
    return out


# Whether the dense path (no weights returned, no bias, no dropout) uses its
# own backward pass (see `_dense_attention`) instead of autodiff's.
DENSE_CUSTOM_GRADIENT = True


def _dense_attention(q, k, v, mask):
    """`softmax(q k^T, mask) v` on `(B, H, T, D)` heads, with its own gradient.

    `q` is already scaled. The backward pass is the one of flash attention
    (Dao et al., 2022) with the weights kept from the forward pass instead
    of recomputed: `dV = P^T dO`, `dP = dO V^T`, `dS = P (dP - delta)` with
    `delta = rowsum(dO * O)` (a `(B, H, T)` reduction over the head size,
    where autodiff reduces `dP * P` over all `S` keys), `dQ = dS K`,
    `dK = dS^T Q`. Fewer passes over the `(B, H, T, S)` tensors than
    autodiff through `masked_softmax`, the same values (tested).
    """

    @ops.custom_gradient
    def attend(q, k, v):
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))  # (B, H, T, S)
        weights = ops.cast(masked_softmax(scores, mask), v.dtype)
        out = ops.matmul(weights, v)  # (B, H, T, Dv)

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            d_out = ops.cast(d_out, v.dtype)
            delta = ops.sum(
                ops.cast(d_out, "float32") * ops.cast(out, "float32"),
                axis=-1,
                keepdims=True,
            )
            d_v = ops.matmul(ops.transpose(weights, (0, 1, 3, 2)), d_out)
            d_p = ops.matmul(d_out, ops.transpose(v, (0, 1, 3, 2)))
            d_s = ops.cast(weights, "float32") * (ops.cast(d_p, "float32") - delta)
            d_s = ops.cast(d_s, q.dtype)
            d_q = ops.matmul(d_s, k)
            d_k = ops.matmul(ops.transpose(d_s, (0, 1, 3, 2)), q)
            return d_q, d_k, d_v

        return out, grad

    return attend(q, k, v)


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


def fused_attention(query, key, value, mask=None, is_causal=False, scale=None):
    """`keras.ops.dot_product_attention` with this module's semantics.

    Same layout and arguments as `dot_product_attention` (boolean `mask`
    broadcastable to `(B, H, T, S)`); grouped key/value heads go to the
    backend as they are (each backend's kernel shares them), and a query
    whose keys are all masked outputs zeros (the fused kernels would average
    the masked values).
    """
    num_heads = query.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    out_dtype = value.dtype
    out = ops.dot_product_attention(
        query, key, value, mask=mask, scale=scale, is_causal=is_causal
    )
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
        out = ops.where(seen[..., None], out, ops.zeros_like(out))
    return ops.cast(out, out_dtype)


def _block_mask(mask, q_start, q_size, k_start, k_size, is_causal):
    """The `(B|1, H|1, q_size|1, k_size|1)` mask of a query and key block."""
    block = None
    if mask is not None:
        starts, shape, sliced = [0, 0, 0, 0], list(ops.shape(mask)), False
        if q_start is not None and mask.shape[2] != 1:
            starts[2], shape[2], sliced = q_start, q_size, True
        if mask.shape[3] != 1:
            starts[3], shape[3], sliced = k_start, k_size, True
        block = ops.slice(mask, starts, shape) if sliced else mask
    if is_causal:
        offset = -k_start if q_start is None else q_start - k_start
        causal = causal_mask(q_size, k_size, offset=offset)
        block = causal if block is None else ops.logical_and(block, causal)
    return block


def _pick_query_block(t_len, query_block_size):
    """The query block: `query_block_size` if it divides `T`, else all of `T`."""
    if not query_block_size or query_block_size >= t_len:
        return t_len
    if t_len % int(query_block_size):
        return t_len
    return int(query_block_size)


def blocked_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    scale=None,
    block_size=DEFAULT_BLOCK_SIZE,
    query_block_size=DEFAULT_QUERY_BLOCK_SIZE,
):
    """Memory-efficient attention: key blocks with an online softmax.

    The same result as the dense path, computed one key block at a time with
    running maxima and sums (Milakov & Gimelshein 2018; Rabe & Staats 2021;
    Dao et al. 2022). The backward pass recomputes each block's weights from
    the saved log-sum-exp instead of storing them, so memory is
    `O(T * block_size)` per head in both passes, never `O(T * S)`. Queries
    are also taken `query_block_size` at a time when that divides `T`
    (the working set of one step is then `query_block_size * block_size`
    scores per head, which stays in cache on a CPU).

    Args: as `dot_product_attention` (the mask already of rank 4, and no
    bias, dropout or weights).
    """
    _check_attention_inputs(query, key, value)
    num_heads = query.shape[2]
    head_dim = query.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    s_len = _static_dim(key, 1)
    t_len = _static_dim(query, 1)
    if s_len is None or t_len is None:
        raise ValueError(
            "The blocked attention path needs static sequence lengths. "
            f"Received: query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )
    mask = _expand_mask(attention_mask)
    block = max(1, min(int(block_size), s_len))
    num_blocks = -(-s_len // block)
    padded = num_blocks * block
    q_block = _pick_query_block(t_len, query_block_size)
    num_q_blocks = t_len // q_block
    out_dtype = value.dtype
    key = _repeat_heads(key, num_heads)
    value = _repeat_heads(value, num_heads)
    # Work in float32 (B, H, T, D) layout; pad keys to whole blocks and mask
    # the padding.
    q = ops.transpose(ops.cast(query, "float32"), (0, 2, 1, 3)) * scale
    k = ops.transpose(ops.cast(key, "float32"), (0, 2, 1, 3))
    v = ops.transpose(ops.cast(value, "float32"), (0, 2, 1, 3))
    if padded != s_len:
        pad = [[0, 0], [0, 0], [0, padded - s_len], [0, 0]]
        k = ops.pad(k, pad)
        v = ops.pad(v, pad)
        valid = ops.arange(padded) < s_len
        valid = ops.reshape(valid, (1, 1, 1, padded))
        if mask is None:
            mask = valid
        else:
            if mask.shape[-1] != 1:
                mask = ops.pad(
                    mask,
                    [[0, 0], [0, 0], [0, 0], [0, padded - s_len]],
                    constant_values=False,
                )
            mask = ops.logical_and(mask, valid)
    if mask is not None and mask.shape[2] not in (1, t_len):
        raise ValueError(
            "Received an invalid value for argument `attention_mask`, its "
            f"query axis must be 1 or {t_len}. Received: "
            f"attention_mask.shape={tuple(mask.shape)}"
        )
    d_v = v.shape[-1]
    # Without a mask every query has keys (a causal row sees at least its
    # first key), so the "no key" bookkeeping can be skipped.
    rows_may_be_empty = mask is not None

    def rows(x, i):
        if num_q_blocks == 1:
            return x
        shape = list(ops.shape(x))
        shape[2] = q_block
        return ops.slice(x, [0, 0, i * q_block, 0], shape)

    def block_kv(x, j):
        shape = list(ops.shape(x))
        shape[2] = block
        return ops.slice(x, [0, 0, j * block, 0], shape)

    def block_mask(i, j):
        q_start = None if num_q_blocks == 1 else i * q_block
        return _block_mask(mask, q_start, q_block, j * block, block, is_causal)

    def scores_of(q_i, kk, i, j):
        s = ops.matmul(q_i, ops.transpose(kk, (0, 1, 3, 2)))  # (B, H, Tq, blk)
        return s, block_mask(i, j)

    def forward_rows(qq, kk, vv, i):
        """Output and log-sum-exp of query block `i` over all key blocks."""
        q_i = rows(qq, i)

        def forward_step(j, carry):
            acc, row_max, row_sum = carry
            s, m = scores_of(q_i, block_kv(kk, j), i, j)
            if m is not None:
                s = ops.where(m, s, _MASK_VALUE)
            new_max = ops.maximum(row_max, ops.max(s, axis=-1, keepdims=True))
            p = ops.exp(s - new_max)
            if m is not None:
                p = ops.where(m, p, 0.0)
            correction = ops.exp(row_max - new_max)
            row_sum = row_sum * correction + ops.sum(p, axis=-1, keepdims=True)
            acc = acc * correction + ops.matmul(p, block_kv(vv, j))
            return acc, new_max, row_sum

        row_zeros = ops.zeros_like(q_i[..., :1])  # (B, H, Tq, 1)
        init = (
            row_zeros + ops.zeros((d_v,), "float32"),
            row_zeros + _MASK_VALUE,
            row_zeros,
        )
        acc, row_max, row_sum = ops.fori_loop(0, num_blocks, forward_step, init)
        if not rows_may_be_empty:
            return acc / row_sum, row_max + ops.log(row_sum)
        has_keys = row_sum > 0.0
        safe_sum = ops.where(has_keys, row_sum, 1.0)
        out = ops.where(has_keys, acc / safe_sum, 0.0)
        # log-sum-exp per row; rows without keys never contribute gradients
        # (their mask is False everywhere).
        lse = ops.where(has_keys, row_max + ops.log(safe_sum), 0.0)
        return out, lse

    def backward_rows(qq, kk, vv, d_out, delta, lse, i, d_k, d_v_all):
        """d_q of query block `i`; adds its part of d_k, d_v."""
        q_i, do_i, delta_i, lse_i = (rows(x, i) for x in (qq, d_out, delta, lse))

        def backward_step(j, carry):
            d_q_i, d_k, d_v_all = carry
            k_j, v_j = block_kv(kk, j), block_kv(vv, j)
            s, m = scores_of(q_i, k_j, i, j)
            p = ops.exp(s - lse_i)
            if m is not None:
                p = ops.where(m, p, 0.0)
            d_v_j = ops.matmul(ops.transpose(p, (0, 1, 3, 2)), do_i)
            d_p = ops.matmul(do_i, ops.transpose(v_j, (0, 1, 3, 2)))
            d_s = p * (d_p - delta_i)
            d_q_i = d_q_i + ops.matmul(d_s, k_j)
            d_k_j = ops.matmul(ops.transpose(d_s, (0, 1, 3, 2)), q_i)
            if num_q_blocks > 1:
                d_k_j = d_k_j + block_kv(d_k, j)
                d_v_j = d_v_j + block_kv(d_v_all, j)
            d_k = ops.slice_update(d_k, [0, 0, j * block, 0], d_k_j)
            d_v_all = ops.slice_update(d_v_all, [0, 0, j * block, 0], d_v_j)
            return d_q_i, d_k, d_v_all

        init = (ops.zeros_like(q_i), d_k, d_v_all)
        return ops.fori_loop(0, num_blocks, backward_step, init)

    @ops.custom_gradient
    def attend(qq, kk, vv):
        if num_q_blocks == 1:
            out, lse = forward_rows(qq, kk, vv, 0)
        else:

            def forward_block(i, carry):
                out_all, lse_all = carry
                out_i, lse_i = forward_rows(qq, kk, vv, i)
                out_all = ops.slice_update(out_all, [0, 0, i * q_block, 0], out_i)
                lse_all = ops.slice_update(lse_all, [0, 0, i * q_block, 0], lse_i)
                return out_all, lse_all

            row_zeros = ops.zeros_like(qq[..., :1])
            out, lse = ops.fori_loop(
                0,
                num_q_blocks,
                forward_block,
                (row_zeros + ops.zeros((d_v,), "float32"), row_zeros),
            )

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            d_out = ops.cast(d_out, "float32")
            delta = ops.sum(d_out * out, axis=-1, keepdims=True)
            d_k, d_v_all = ops.zeros_like(kk), ops.zeros_like(vv)
            if num_q_blocks == 1:
                return backward_rows(qq, kk, vv, d_out, delta, lse, 0, d_k, d_v_all)

            def backward_block(i, carry):
                d_q, d_k, d_v_all = carry
                d_q_i, d_k, d_v_all = backward_rows(
                    qq, kk, vv, d_out, delta, lse, i, d_k, d_v_all
                )
                d_q = ops.slice_update(d_q, [0, 0, i * q_block, 0], d_q_i)
                return d_q, d_k, d_v_all

            return ops.fori_loop(
                0, num_q_blocks, backward_block, (ops.zeros_like(qq), d_k, d_v_all)
            )

        return out, grad

    out = attend(q, k, v)  # (B, H, T, Dv)
    return ops.cast(ops.transpose(out, (0, 2, 1, 3)), out_dtype)


# ------------------------------------------------------------ hash dropout

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
    if not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
        raise ValueError(
            "Received an invalid value for argument `rate`, expected a float "
            f"in [0, 1). Received: rate={rate!r}"
        )
    rate = float(rate)
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
