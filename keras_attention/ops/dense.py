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
with AMX": 16,384 tokens). On TensorFlow outside XLA the first chunks
keep their weights instead, as many as fit the memory budget
(`kept_chunks`): each kept chunk saves its scores' product and softmax in
the backward pass (at 16,384 tokens, 8 of 16 chunks kept took the core
from 11.1 to 10.3 s, all 16 to 9.1 s; BENCHMARKS.md, "Kept chunks").
Both share one forward (`_weights`) and one backward (`_backward`) per
set of rows, so the chunked path is the dense core's arithmetic by
construction (and tested equal to it).
"""

import keras
from keras import ops

from keras_attention.ops import autotune
from keras_attention.ops.gradients import custom_gradient
from keras_attention.ops import xla_cpu
from keras_attention.ops.blocked import block_mask
from keras_attention.ops.blocked import pad_queries
from keras_attention.ops.masks import mask_arguments
from keras_attention.ops.masks import masked_softmax
from keras_attention.ops.masks import matmul
from keras_attention.ops.masks import scalar_as
from keras_attention.ops.masks import wide_dtype
from keras_attention.ops.positions import alibi_bias
from keras_attention.ops.shapes import broadcast_unknown_mask_axes
from keras_attention.ops.shapes import check_mask_rows
from keras_attention.ops.shapes import fori_loop
from keras_attention.ops.shapes import lengths
from keras_attention.ops.shapes import pad
from keras_attention.ops.shapes import repeat_heads
from keras_attention.ops.shapes import static_dim
from keras_attention.ops.shapes import static_lengths

# A chunk's scores take at most about this many bytes per (B, H, rows, S)
# tensor: at 16,384 keys, batch 1 and 8 heads, chunks of 1,024 rows; 3 %
# slower than 2,048-row chunks there, at half their memory, 4 % faster
# than 512-row ones (BENCHMARKS.md, "Intel Xeon with AMX").
CHUNK_SCORE_BYTES = 512 * 2**20

# Query rows per chunk when a length is unknown when traced (TensorFlow):
# the chunk count then follows the length at run time, and the memory
# `O(rows * S)` per head.
DYNAMIC_CHUNK_ROWS = 128


def _is_low(x):
    return keras.backend.standardize_dtype(x.dtype) == "bfloat16"


def scores_of(q, k):
    """The scores `q k^T` `(B, H, T, S)` of heads `(B, H, T, D)` and
    `(B, H, S, D)`, for both dense paths. float16 heads' product runs in
    float32: float16's range ends at 65,504, and larger logits (inputs of
    1e4 under `mixed_float16`) were infinite, every weight NaN, where the
    blocked and chunked paths (float32 already) gave the float32 result."""
    if keras.backend.standardize_dtype(q.dtype) == "float16":
        q, k = ops.cast(q, "float32"), ops.cast(k, "float32")
    return xla_cpu.scores_product(q, k)


def _weights(q, k, mask, bias, dtype, empty_rows=True):
    """The softmax of `q k^T (+ bias)` under `mask`, in `dtype`.

    bfloat16 heads keep their scores and weights in bfloat16 (the backend's
    fused softmax accumulates in float32), where float32 copies would cost
    as much as the bfloat16 products save."""
    low = _is_low(q)
    scores = scores_of(q, k)
    if bias is not None:
        scores = ops.cast(scores, wide_dtype(q.dtype)) + ops.cast(bias, wide_dtype(q.dtype))
        scores = ops.cast(scores, q.dtype) if low else scores
    weights = masked_softmax(scores, mask, float32=not low, empty_rows=empty_rows)
    return ops.cast(weights, dtype)


def _delta(d_out, out):
    """`rowsum(dO * O)` `(B, H, T, 1)`, in float32 (float64 for float64)."""
    wide = wide_dtype(out.dtype)
    return ops.sum(
        ops.cast(d_out, wide) * ops.cast(out, wide),
        axis=-1,
        keepdims=True,
    )


def _backward(q, k, v, weights, d_out, delta):
    """`(dQ, dK, dV)` of rows `q` given their `weights` (flash attention's
    backward with the weights at hand): `dV = P^T dO`, `dS = P (dP -
    delta)`, `dQ = dS K`, `dK = dS^T Q`; `dP - delta` is one product,
    `[dO, -delta] [V, 1]^T`, a pass over the `(B, H, T, S)` tensors fewer
    than subtracting after. float16 rows run it in float32: `dP` and
    `delta` of large values and gradients overflowed float16's 65,504
    (NaN where the float32 chunked and blocked paths are finite)."""
    if keras.backend.standardize_dtype(q.dtype) == "float16":
        wide = (ops.cast(x, "float32") for x in (q, k, v, weights, d_out))
        return tuple(ops.cast(g, "float16") for g in _backward(*wide, delta))
    low = _is_low(q)
    d_out = ops.cast(d_out, v.dtype)
    d_v = xla_cpu.keys_product(weights, d_out)
    d_p = xla_cpu.scores_product(
        ops.concatenate([d_out, ops.cast(-delta, d_out.dtype)], -1),
        ops.concatenate([v, ops.ones_like(v[..., :1])], -1),
    )
    if low:
        d_s = weights * d_p
    else:
        wide = wide_dtype(q.dtype)
        d_s = ops.cast(weights, wide) * ops.cast(d_p, wide)
    d_s = ops.cast(d_s, q.dtype)
    return matmul(d_s, k), xla_cpu.keys_product(d_s, q), d_v


def dense_core(q, k, v, mask, pairs=None):
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
    the weights fewer) and `dV`, `dK` take `xla_cpu.keys_product`'s loop,
    or above 1,024 x 1,024 scores a pair the whole backward runs pair by
    pair (on JAX the forward too).
    In a TensorFlow graph on a CPU the core may run in groups of `(batch,
    head)` pairs side by side (`pairs` of them a group; `None`: as
    `autotune.pair_group` measured, `0`: all at once).
    """
    if xla_cpu.takes_unnormalised(q, k, v):
        return xla_cpu.unnormalised_attention(q, k, v, mask)
    if pairs is None:
        pairs = autotune.pair_group(
            q, k, v, mask,
            lambda size, q, k, v, mask, causal: dense_core(q, k, v, mask, size),
        )
    if pairs:
        return _pair_groups(q, k, v, mask, pairs)

    @custom_gradient
    def attend(q, k, v, *masks):
        weights = _weights(q, k, masks[0] if masks else None, None, v.dtype)
        out = matmul(weights, v)  # (B, H, T, Dv)

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            grads = _backward(q, k, v, weights, d_out, _delta(d_out, out))
            return tuple(grads) + (None,) * len(masks)

        return out, grad

    return attend(q, k, v, *mask_arguments(mask))


def _pair_groups(q, k, v, mask, pairs):
    """`dense_core` on groups of `pairs` `(batch, head)` pairs (static
    batch and heads), each group independent work with its own backward
    pass: the same values, computed group by group."""
    batch, heads = q.shape[0], q.shape[1]
    cuts = list(range(pairs, batch * heads, pairs))

    def groups(x):  # (B, H, R, C) -> [(pairs, 1, R, C), ...]
        x = ops.reshape(x, (batch * heads, 1) + tuple(x.shape[2:]))
        return ops.split(x, cuts, axis=0)

    masks = [None] * (len(cuts) + 1)
    if mask is not None:
        mask = ops.reshape(mask, (1,) * (4 - len(mask.shape)) + tuple(mask.shape))
        if mask.shape[0] == 1 and mask.shape[1] == 1:
            masks = [mask] * len(masks)  # the same for every pair
        else:
            masks = groups(ops.broadcast_to(mask, (batch, heads) + tuple(mask.shape[2:])))
    outs = [
        dense_core(q_g, k_g, v_g, m_g, 0)
        for q_g, k_g, v_g, m_g in zip(groups(q), groups(k), groups(v), masks)
    ]
    out = ops.concatenate(outs, axis=0)
    return ops.reshape(out, (batch, heads) + tuple(out.shape[2:]))


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


def kept_chunks(batch, heads, chunk, t_len, s_len, causal_skips, itemsize):
    """How many of a call's first chunks keep their weights for the
    backward pass instead of recomputing them: as many as fit the memory
    budget (`autotune.memory_budget`) beside the three `(B, H, rows, S)`
    float32 tensors one chunk's work takes; none when the batch is not
    known. While `autotune` times a slice of a longer call's queries, the
    slice keeps the same share of its chunks as the whole call would."""
    if not batch:
        return 0
    left = autotune.memory_budget() - 3 * 4 * batch * heads * chunk * s_len
    call_chunks = -(-(autotune.measured_call_rows() or t_len) // chunk)
    keep = 0
    while keep < call_chunks:
        keys = min((keep + 1) * chunk, s_len) if causal_skips else s_len
        left -= itemsize * batch * heads * chunk * keys
        if left < 0:
            break
        keep += 1
    return keep * -(-t_len // chunk) // call_chunks


def _loop(start, stop, body, init):
    """`body(i, carry)` for `start <= i < stop`, one iteration at a time.

    TensorFlow's loop would otherwise start up to ten iterations at once
    (`parallel_iterations`): each chunk's scores only need the counter, so
    ten chunks' `(B, H, rows, S)` tensors would be alive together."""
    if isinstance(stop, int) and start >= stop:
        return init
    return fori_loop(start, stop, body, init, one_at_a_time=True)


def _kept_weights(keep, heads, chunk, keys, dtype):
    """A TensorFlow `TensorArray` for the weights of the first `keep`
    chunks (`(B, H, chunk, S)` each, `S` unknown when chunks skip keys).

    Each is read again when the backward pass is itself differentiated
    (a second-order gradient runs it once more for the outer tape), so
    reads leave it in place: the backward pass starts with all of them
    alive either way, its memory peak."""
    import tensorflow as tf

    return tf.TensorArray(
        dtype, size=keep, infer_shape=False, clear_after_read=False,
        element_shape=tf.TensorShape([None, heads, chunk, keys]),
    )


def _chunked_core(q, k, v, chunk, num_chunks, mask_of, bias_of, key_end=None,
                  empty_rows=True, keep=0, tensors=()):
    """`dense_core` over `num_chunks` chunks of `chunk` query rows (`q`
    padded to them), recomputing each chunk's weights in the backward
    pass but for the first `keep` chunks', kept from the forward pass
    (TensorFlow only; `chunked_heads` sizes them to the memory budget).
    `mask_of(start, keys, *tensors)`, `bias_of(start, keys, *tensors)`:
    the mask and bias of the chunk from query `start` against the first
    `keys` keys, from `tensors` (the mask, ALiBi's slopes: constants, no
    gradient), which enter the custom gradient as arguments, never in its
    closure (`masks.mask_arguments`: a tensor made under `torch.func` or
    JAX's transforms and closed over is unbound in the backward pass). `key_end(i)`: how many keys chunk
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

    def inputs_of(q, k, v, i):
        """Chunk `i`'s queries, and the keys and values it sees."""
        n = k.shape[2] if key_end is None else key_end(i)
        return rows(q, i), first(k, n), first(v, n)

    def weights_of(q_i, k_i, i, given):
        n, start = ops.shape(k_i)[2], i * chunk
        return _weights(q_i, k_i, mask_of(start, n, *given),
                        bias_of(start, n, *given), v.dtype, empty_rows)

    wide = wide_dtype(k.dtype)  # the keys' gradient sums

    def to_all_keys(d, like):
        if key_end is None:
            return ops.cast(d, wide)
        missing = ops.shape(like)[2] - ops.shape(d)[2]
        padded = pad(ops.cast(d, wide), [[0, 0], [0, 0], [0, missing], [0, 0]])
        # The keys' static length again: a pad of unknown width loses it,
        # and a length of 1 then broadcast the loop's sum to an unknown one.
        return ops.reshape(padded, ops.shape(like))

    @custom_gradient
    def attend(q, k, v, *given):
        def forward(i, out, kept=None):
            q_i, k_i, v_i = inputs_of(q, k, v, i)
            w = weights_of(q_i, k_i, i, given)
            out = ops.slice_update(out, [0, 0, i * chunk, 0], matmul(w, v_i))
            return out if kept is None else (out, kept.write(i, w))

        b, h, t = ops.shape(q)[0], q.shape[1], ops.shape(q)[2]
        # Zeros that depend on `q` (batched with it under `torch.func.vmap`,
        # where writing batched rows into an unbatched buffer fails).
        out = ops.zeros((b, h, t, v.shape[-1]), v.dtype) + ops.zeros_like(
            q[:1, :1, :1, :1], v.dtype
        )
        kept = None
        if keep:
            kept = _kept_weights(
                keep, h, chunk, None if key_end else k.shape[2], v.dtype
            )
            out, kept = _loop(0, keep, lambda i, c: forward(i, *c), (out, kept))
        out = _loop(keep, num_chunks, forward, out)

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            delta = _delta(d_out, out)

            def backward(i, carry, kept=None):
                d_q, d_k, d_v = carry
                q_i, k_i, v_i = inputs_of(q, k, v, i)
                w = weights_of(q_i, k_i, i, given) if kept is None else kept.read(i)
                d_q_i, d_k_i, d_v_i = _backward(
                    q_i, k_i, v_i, w, rows(d_out, i), rows(delta, i)
                )
                return (
                    ops.slice_update(d_q, [0, 0, i * chunk, 0], d_q_i),
                    d_k + to_all_keys(d_k_i, k),
                    d_v + to_all_keys(d_v_i, v),
                )

            # Keys' gradients sum over the chunks: accumulated in float32
            # (float64 for float64). The zeros depend on `delta`: under
            # `torch.func.vmap` (`jacrev`) the upstream is batched and the
            # inputs are not, and a write of batched rows into an
            # unbatched buffer fails.
            zero = ops.zeros_like(delta[:1, :1, :1])
            grads = (
                ops.zeros_like(q) + ops.cast(zero, q.dtype),
                ops.zeros(ops.shape(k), wide) + ops.cast(zero, wide),
                ops.zeros(ops.shape(v), wide) + ops.cast(zero, wide),
            )
            if keep:
                grads = _loop(0, keep, lambda i, c: backward(i, c, kept), grads)
            d_q, d_k, d_v = _loop(keep, num_chunks, backward, grads)
            return (d_q, ops.cast(d_k, k.dtype), ops.cast(d_v, v.dtype)) + (
                (None,) * len(given)
            )

        return out, grad

    return attend(q, k, v, *tensors)


def _executing_eagerly():
    import tensorflow as tf

    return tf.executing_eagerly()


def _graph_executor():
    """Whether chunks may see fewer keys than the call has (a dynamic
    shape per loop step) and keep their weights in a `TensorArray` of such
    shapes: TensorFlow's graph executor (or eager) takes both, XLA
    (TensorFlow's `jit_compile`, JAX) does not."""
    return keras.backend.backend() == "tensorflow" and autotune.tf_mode() != "xla"


def chunked_heads(query, key, value, mask, is_causal, scale,
                  sliding_window=None, alibi_slopes=None, chunk=None, keep=None):
    """The chunked path on inputs `dot_product_attention` has checked.

    `query` `(B, T, H, D)`, `key`/`value` `(B, S, K, D|Dv)` (grouped heads
    are repeated to `H`, as on the dense path); `mask` rank 4 or `None`;
    `scale` a number; `sliding_window`, `is_causal` and `alibi_slopes` are
    applied chunk by chunk. With `is_causal`, outside XLA on TensorFlow,
    each chunk visits only the keys up to its last query (about half the
    work); otherwise every chunk visits all keys (for a window the blocked
    path skips the blocks outside the band). `chunk`:
    query rows per chunk (default `chunk_rows`); `T` is padded to whole
    chunks and the padding dropped after. `keep`: how many of the first
    chunks keep their weights from the forward pass for the backward one
    (default `kept_chunks`, within the memory budget, when a gradient tape
    records the call; TensorFlow's graphs only, else none: eagerly,
    `tape.jacobian` traces the backward pass, which an eager
    `TensorArray` refuses). On TensorFlow a length unknown when traced
    is planned when run: chunks of at most `DYNAMIC_CHUNK_ROWS` rows (a
    shorter call one chunk), none kept. Returns
    `(B, T, H, Dv)` in `value`'s dtype.
    """
    num_heads = query.shape[2]
    if keras.backend.backend() == "tensorflow":
        t_len, s_len = lengths(query, key)  # tensors where unknown
    else:
        t_len, s_len = static_lengths(query, key, "chunked")
    known = isinstance(t_len, int) and isinstance(s_len, int)
    check_mask_rows(mask, t_len)
    mask = broadcast_unknown_mask_axes(mask, t_len, s_len)
    skips = is_causal and _graph_executor()
    if not known:
        # Rows per chunk fixed when traced: at most `DYNAMIC_CHUNK_ROWS`, a
        # shorter `T` one chunk of its own length (no padding).
        chunk = ops.maximum(ops.minimum(int(chunk or DYNAMIC_CHUNK_ROWS), t_len), 1)
    elif not chunk:
        chunk = chunk_rows(static_dim(query, 0), num_heads, s_len, t_len)
        if skips:
            # At least four causal chunks: 5/8 of the keys or fewer are
            # visited (two chunks would visit 3/4). At 2,048 causal tokens
            # `auto` then measured the chunked path in 15 % less time than
            # the dense one (BENCHMARKS.md, "Shorter causal calls").
            chunk = min(chunk, max(autotune.MIN_CHUNK_ROWS, t_len // 4))
    chunk = max(1, min(int(chunk), t_len)) if known else chunk
    num_chunks = -(-t_len // chunk)  # a tensor when `T` is unknown
    if not known:
        # At least one: XLA compiles the loop's body, and its row slice of
        # a call of no queries failed ("Expected size[2] in [0, 0]").
        num_chunks = ops.maximum(num_chunks, 1)
    q, mask = pad_queries(query, mask, t_len, num_chunks * chunk)
    low = _is_low(query)
    dtype = query.dtype if low else wide_dtype(query.dtype)
    q = ops.transpose(ops.cast(q, dtype), (0, 2, 1, 3)) * scalar_as(scale, dtype)
    k = ops.transpose(ops.cast(repeat_heads(key, num_heads), dtype), (0, 2, 1, 3))
    v = ops.transpose(ops.cast(repeat_heads(value, num_heads), dtype), (0, 2, 1, 3))

    tensors = mask_arguments(mask) + mask_arguments(alibi_slopes)

    def mask_of(start, keys, *given):
        given_mask = given[0] if mask is not None else None
        return block_mask(given_mask, start, chunk, 0, keys, is_causal, sliding_window)

    def bias_of(start, keys, *given):
        if alibi_slopes is None:
            return None
        return alibi_bias(given[-1], start, chunk, 0, keys, wide_dtype(dtype))

    key_end = None
    if skips:
        # A causal chunk sees no key after its last query: about half the
        # work of a causal self-attention.
        def key_end(i):
            return ops.minimum((i + 1) * chunk, s_len)

    if not known:
        keep = 0  # the chunk count is only known when run
    elif not _graph_executor() or _executing_eagerly():
        keep = 0  # eagerly, `tape.jacobian` traces the backward: no kept tensors
    elif keep is None and not autotune.gradient_recorded():
        keep = 0  # no backward pass will read them (inference)
    elif keep is None:
        keep = kept_chunks(static_dim(query, 0), num_heads, chunk, t_len, s_len,
                           skips, 2 if low else 8 if dtype == "float64" else 4)
    if known:  # else none (above)
        keep = max(0, min(int(keep), num_chunks))
    # Under a causal mask alone every query sees a key (the first one).
    empty_rows = mask is not None or sliding_window is not None or not is_causal
    out = _chunked_core(
        q, k, v, chunk, num_chunks, mask_of, bias_of, key_end, empty_rows, keep,
        tensors,
    )
    out = ops.transpose(out, (0, 2, 1, 3))[:, :t_len]
    return ops.cast(out, value.dtype)
