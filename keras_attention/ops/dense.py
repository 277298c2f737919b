"""The dense core with its own backward pass, whole or in query chunks.

`dense_core` is the dense path's core when no weights, bias or dropout are
involved: `softmax(q k^T, mask) v` on `(B, H, T, D)` heads, the `(B, H, T,
S)` weights kept from the forward pass for the backward one.

`chunked_heads` is the same core over chunks of queries, each against all
its keys, with the weights recomputed in the backward pass instead of kept
(flash attention's trade with chunks of whole rows): memory `O(chunk * S)`
per head, never `O(T * S)`, and each chunk's products are the dense core's
large matrix products, which a graph executor runs at full speed where the
blocked path's small block products do not (BENCHMARKS.md, "Intel Xeon
with AMX": 16,384 tokens). Both share one forward (`_weights`) and one
backward (`_backward`) per set of rows, so the chunked path is the dense
core's arithmetic by construction (and tested equal to it).
"""

import keras
from keras import ops

from keras_attention.ops import autotune
from keras_attention.ops import xla_cpu
from keras_attention.ops.blocked import block_mask
from keras_attention.ops.blocked import pad_queries
from keras_attention.ops.masks import masked_softmax
from keras_attention.ops.positions import alibi_bias
from keras_attention.ops.shapes import check_mask_rows
from keras_attention.ops.shapes import repeat_heads
from keras_attention.ops.shapes import static_dim
from keras_attention.ops.shapes import static_lengths

# A chunk's scores take at most about this many bytes per (B, H, rows, S)
# tensor: at 16,384 keys, batch 1 and 8 heads, chunks of 1,024 rows; 3 %
# slower than 2,048-row chunks there, at half their memory, 4 % faster
# than 512-row ones (BENCHMARKS.md, "Intel Xeon with AMX").
CHUNK_SCORE_BYTES = 512 * 2**20


def _is_low(x):
    return keras.backend.standardize_dtype(x.dtype) == "bfloat16"


def _weights(q, k, mask, bias, dtype, empty_rows=True):
    """The softmax of `q k^T (+ bias)` under `mask`, in `dtype`.

    bfloat16 heads keep their scores and weights in bfloat16 (the backend's
    fused softmax accumulates in float32), where float32 copies would cost
    as much as the bfloat16 products save."""
    low = _is_low(q)
    scores = ops.einsum("bhtd,bhsd->bhts", q, k)
    if bias is not None:
        scores = ops.cast(scores, "float32") + bias
        scores = ops.cast(scores, q.dtype) if low else scores
    weights = masked_softmax(scores, mask, float32=not low, empty_rows=empty_rows)
    return ops.cast(weights, dtype)


def _delta(d_out, out):
    """`rowsum(dO * O)` `(B, H, T, 1)`, in float32."""
    return ops.sum(
        ops.cast(d_out, "float32") * ops.cast(out, "float32"),
        axis=-1,
        keepdims=True,
    )


def _backward(q, k, v, weights, d_out, delta):
    """`(dQ, dK, dV)` of rows `q` given their `weights` (flash attention's
    backward with the weights at hand): `dV = P^T dO`, `dS = P (dP -
    delta)`, `dQ = dS K`, `dK = dS^T Q`; `dP - delta` is one product,
    `[dO, -delta] [V, 1]^T`, a pass over the `(B, H, T, S)` tensors fewer
    than subtracting after."""
    low = _is_low(q)
    d_out = ops.cast(d_out, v.dtype)
    d_v = xla_cpu.keys_product(weights, d_out)
    d_p = ops.einsum(
        "bhtd,bhsd->bhts",
        ops.concatenate([d_out, ops.cast(-delta, d_out.dtype)], -1),
        ops.concatenate([v, ops.ones_like(v[..., :1])], -1),
    )
    if low:
        d_s = weights * d_p
    else:
        d_s = ops.cast(weights, "float32") * ops.cast(d_p, "float32")
    d_s = ops.cast(d_s, q.dtype)
    return ops.matmul(d_s, k), xla_cpu.keys_product(d_s, q), d_v


def dense_core(q, k, v, mask):
    """`softmax(q k^T, mask) v` on `(B, H, T, D)` heads, with its own gradient.

    `q` is already scaled. The backward pass is the one of flash attention
    (Dao et al., 2022) with the weights kept from the forward pass instead
    of recomputed (`_backward`): `delta = rowsum(dO * O)` is a `(B, H, T)`
    reduction over the head size, where autodiff reduces `dP * P` over all
    `S` keys. Fewer passes over the `(B, H, T, S)` tensors than autodiff
    through `masked_softmax`, the same values (tested). The products are
    einsums, so no `(B, H, T, S)` tensor is ever transposed in memory (the
    backends contract along either axis); float16 heads go through float32
    (its range is too short for scores). Under XLA on a CPU, float32 heads
    take `xla_cpu.unnormalised_attention` (the same values, one pass over
    the weights fewer) and `dV`, `dK` take `xla_cpu.keys_product`'s loop.
    """
    if xla_cpu.takes_unnormalised(q):
        return xla_cpu.unnormalised_attention(q, k, v, mask)

    @ops.custom_gradient
    def attend(q, k, v):
        weights = _weights(q, k, mask, None, v.dtype)
        out = ops.matmul(weights, v)  # (B, H, T, Dv)

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            return _backward(q, k, v, weights, d_out, _delta(d_out, out))

        return out, grad

    return attend(q, k, v)


def chunk_rows(batch, heads, s_len, t_len):
    """Query rows per chunk: the largest power of two whose `(B, H, rows,
    S)` scores fit `CHUNK_SCORE_BYTES` and whose three such tensors fit
    the memory budget (`autotune.set_autotune`), at least
    `autotune.MIN_CHUNK_ROWS`, at most `T`."""
    per_row = 4 * (batch or 1) * heads * s_len
    limit = min(CHUNK_SCORE_BYTES, autotune.memory_budget() // 3)
    rows = autotune.MIN_CHUNK_ROWS
    while rows * 2 * per_row <= limit and rows < t_len:
        rows *= 2
    return min(rows, t_len)


def _loop(count, body, init):
    """`body(i, carry)` for `i < count`, one iteration at a time.

    TensorFlow's loop would otherwise start up to ten iterations at once
    (`parallel_iterations`): each chunk's scores only need the counter, so
    ten chunks' `(B, H, rows, S)` tensors would be alive together."""
    if keras.backend.backend() != "tensorflow":
        return ops.fori_loop(0, count, body, init)
    import tensorflow as tf

    return tf.while_loop(
        lambda i, carry: i < count,
        lambda i, carry: (i + 1, body(i, carry)),
        (tf.constant(0), init),
        parallel_iterations=1,
    )[1]


def _chunked_core(q, k, v, chunk, num_chunks, mask_of, bias_of, key_end=None,
                  empty_rows=True):
    """`dense_core` over `num_chunks` chunks of `chunk` query rows (`q`
    padded to them), recomputing each chunk's weights in the backward
    pass. `mask_of(start, keys)`, `bias_of(start, keys)`: the mask and bias
    of the chunk from query `start` against the first `keys` keys
    (constants: they get no gradient). `key_end(i)`: how many keys chunk
    `i` can see (a causal chunk sees none after its last query), or `None`
    for all of them; the keys after are skipped, not masked. `empty_rows`:
    whether a query may see no key (`masked_softmax`)."""

    def rows(x, i):
        shape = list(ops.shape(x))
        shape[2] = chunk
        return ops.slice(x, [0, 0, i * chunk, 0], shape)

    def first(x, n):
        if key_end is None:
            return x
        shape = list(ops.shape(x))
        shape[2] = n
        return ops.slice(x, [0, 0, 0, 0], shape)

    def chunk_of(q, k, v, i):
        """Chunk `i`'s queries, its keys and values, and its weights."""
        n = k.shape[2] if key_end is None else key_end(i)
        k_i, v_i = first(k, n), first(v, n)
        start = i * chunk
        w = _weights(rows(q, i), k_i, mask_of(start, n), bias_of(start, n), v.dtype,
                     empty_rows)
        return rows(q, i), k_i, v_i, w

    def to_all_keys(d, like):
        if key_end is None:
            return ops.cast(d, "float32")
        missing = ops.shape(like)[2] - ops.shape(d)[2]
        return ops.pad(ops.cast(d, "float32"), [[0, 0], [0, 0], [0, missing], [0, 0]])

    @ops.custom_gradient
    def attend(q, k, v):
        def forward(i, out):
            _, _, v_i, w = chunk_of(q, k, v, i)
            return ops.slice_update(out, [0, 0, i * chunk, 0], ops.matmul(w, v_i))

        b, h, t = ops.shape(q)[0], q.shape[1], q.shape[2]
        out = _loop(num_chunks, forward, ops.zeros((b, h, t, v.shape[-1]), v.dtype))

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            delta = _delta(d_out, out)

            def backward(i, carry):
                d_q, d_k, d_v = carry
                q_i, k_i, v_i, w = chunk_of(q, k, v, i)
                d_q_i, d_k_i, d_v_i = _backward(
                    q_i, k_i, v_i, w, rows(d_out, i), rows(delta, i)
                )
                return (
                    ops.slice_update(d_q, [0, 0, i * chunk, 0], d_q_i),
                    d_k + to_all_keys(d_k_i, k),
                    d_v + to_all_keys(d_v_i, v),
                )

            # Keys' gradients sum over the chunks: accumulated in float32.
            init = (
                ops.zeros_like(q),
                ops.zeros(ops.shape(k), "float32"),
                ops.zeros(ops.shape(v), "float32"),
            )
            d_q, d_k, d_v = _loop(num_chunks, backward, init)
            return d_q, ops.cast(d_k, k.dtype), ops.cast(d_v, v.dtype)

        return out, grad

    return attend(q, k, v)


def _skips_keys():
    """Whether chunks may see fewer keys than the call has: a dynamic
    shape per loop step, which TensorFlow's graph executor takes and XLA
    (TensorFlow's `jit_compile`, JAX) does not."""
    return keras.backend.backend() == "tensorflow" and autotune.tf_mode() != "xla"


def chunked_heads(query, key, value, mask, is_causal, scale,
                  sliding_window=None, alibi_slopes=None, chunk=None):
    """The chunked path on inputs `dot_product_attention` has checked.

    `query` `(B, T, H, D)`, `key`/`value` `(B, S, K, D|Dv)` (grouped heads
    are repeated to `H`, as on the dense path); `mask` rank 4 or `None`;
    `scale` a number; `sliding_window`, `is_causal` and `alibi_slopes` are
    applied chunk by chunk. With `is_causal`, outside XLA on TensorFlow,
    each chunk visits only the keys up to its last query (about half the
    work); otherwise every chunk visits all keys (for a window the blocked
    path skips the blocks outside the band). `chunk`:
    query rows per chunk (default `chunk_rows`); `T` is padded to whole
    chunks and the padding dropped after. Returns `(B, T, H, Dv)` in
    `value`'s dtype.
    """
    num_heads = query.shape[2]
    t_len, s_len = static_lengths(query, key, "chunked")
    check_mask_rows(mask, t_len)
    skips = is_causal and _skips_keys()
    if not chunk:
        chunk = chunk_rows(static_dim(query, 0), num_heads, s_len, t_len)
        if skips:
            # At least four causal chunks: 5/8 of the keys or fewer are
            # visited (two chunks would visit 3/4). At 2,048 causal tokens
            # `auto` then measured the chunked path in 15 % less time than
            # the dense one (BENCHMARKS.md, "Shorter causal calls").
            chunk = min(chunk, max(autotune.MIN_CHUNK_ROWS, t_len // 4))
    chunk = max(1, min(int(chunk), t_len))
    num_chunks = -(-t_len // chunk)
    q, mask = pad_queries(query, mask, t_len, num_chunks * chunk)
    low = _is_low(query)
    dtype = query.dtype if low else "float32"
    q = ops.transpose(ops.cast(q, dtype), (0, 2, 1, 3)) * ops.cast(scale, dtype)
    k = ops.transpose(ops.cast(repeat_heads(key, num_heads), dtype), (0, 2, 1, 3))
    v = ops.transpose(ops.cast(repeat_heads(value, num_heads), dtype), (0, 2, 1, 3))

    def mask_of(start, keys):
        return block_mask(mask, start, chunk, 0, keys, is_causal, sliding_window)

    def bias_of(start, keys):
        if alibi_slopes is None:
            return None
        return alibi_bias(alibi_slopes, start, chunk, 0, keys)

    key_end = None
    if skips:
        # A causal chunk sees no key after its last query: about half the
        # work of a causal self-attention.
        def key_end(i):
            return ops.minimum((i + 1) * chunk, s_len)

    # Under a causal mask alone every query sees a key (the first one).
    empty_rows = mask is not None or sliding_window is not None or not is_causal
    out = _chunked_core(
        q, k, v, chunk, num_chunks, mask_of, bias_of, key_end, empty_rows
    )
    out = ops.transpose(out, (0, 2, 1, 3))[:, :t_len]
    return ops.cast(out, value.dtype)
