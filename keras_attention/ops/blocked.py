"""Memory-efficient attention: key blocks with an online softmax.

The same result as the dense path, computed one key block at a time with
running maxima and sums (Milakov & Gimelshein 2018; Rabe & Staats 2021;
Dao et al. 2022). The backward pass recomputes each block's weights from the
saved row maxima and log-sums instead of storing them (`exp((s - max) -
log(sum))`: flash attention's single log-sum-exp `max + log(sum)` in
float32 loses `log(sum)` to the rounding of a large maximum, and at logits
of 2e6 gave gradients 5 % off the dense path's), so memory is `O(T * block_size)`
per head in both passes, never `O(T * S)`. Queries are also taken
`query_block_size` at a time when that divides `T` (the working set of one
step is then `query_block_size * block_size` scores per head, which stays in
cache on a CPU).

Length-sized tensors stay in the caller's `(B, T, H, D)` / `(B, S, K, D)`
layout and dtype: each block is sliced, cast to float32 (float64 for
float64 inputs), scaled and transposed on its own, grouped-query heads
are grouped per block (never
repeated to `H`), and the pass saves only the output and the row
statistics `(B, H, T, 2)` for the backward. So a layer's projections reach the core
and its gradients leave it without a length-sized transpose or copy; the
backward pass holds q, k, v, dO (whose rows become dq once read) and the
dk, dv accumulators (float32 or float64, cast once at the end).
A `_Plan` holds the static block layout and the rank-4 mask that every
step reads.
"""

import collections
import math

import keras
from keras import ops

from keras_attention._validation import check_positive_int
from keras_attention.ops.gradients import custom_gradient
from keras_attention.ops.masks import MASK_VALUE
from keras_attention.ops.masks import causal_mask
from keras_attention.ops.masks import check_sliding_window
from keras_attention.ops.masks import expand_mask
from keras_attention.ops.masks import sliding_window_mask
from keras_attention.ops.masks import wide_dtype
from keras_attention.ops.positions import alibi_bias
from keras_attention.ops.shapes import broadcast_unknown_mask_axes
from keras_attention.ops.shapes import check_alibi_slopes
from keras_attention.ops.shapes import check_attention_inputs
from keras_attention.ops.shapes import check_attention_mask
from keras_attention.ops.shapes import check_mask_rows
from keras_attention.ops.shapes import fori_loop
from keras_attention.ops.shapes import pad
from keras_attention.ops.shapes import static_lengths
from keras_attention.ops.xla_cpu import compiled as xla_compiled

DEFAULT_BLOCK_SIZE = 256
DEFAULT_QUERY_BLOCK_SIZE = 256

# block: key block length; q_block: query block length; mask: rank 4 or
# None, keys padded to whole blocks; rows_may_be_empty: a query may see no
# key (without a mask every query sees one, a causal row its first key);
# window: the sliding window or None; span: how many key blocks each query
# block visits (all of them without a window); slopes: ALiBi slopes `(H,)`
# or None; scale: the score scale; groups: query heads per key head (GQA);
# wide: the dtype blocks are computed in (float32, float64 for float64).
_Plan = collections.namedtuple(
    "_Plan",
    "block num_blocks q_block num_q_blocks mask is_causal d_v rows_may_be_empty "
    "window span slopes scale groups wide",
)


def _window_span(q_block, block, num_blocks, window, is_causal):
    """The number of key blocks a query block's band can touch (static).

    Query rows `[a, a + q_block)` see keys from `a - window + 1` to
    `a + q_block - 1` (to `a + q_block + window - 2` without `is_causal`):
    an interval of `q_block + window - 1` (or `q_block + 2 * window - 2`)
    keys, which meets at most `ceil((length - 1) / block) + 1` blocks
    wherever it starts.
    """
    if window is None:
        return num_blocks
    length = q_block + (window - 1) * (1 if is_causal else 2)
    return min(num_blocks, -(-(length - 1) // block) + 1)


def _first_key_block(i, plan):
    """The first key block visited by query block `i` (int or tensor).

    Its band starts at key `i * q_block - window + 1`; the start is clipped
    so that all `span` blocks lie inside the keys (the band's own blocks
    are still among them; the mask removes the rest).
    """
    if plan.span == plan.num_blocks:
        return 0
    last = plan.num_blocks - plan.span
    if isinstance(i, int):
        return min(max((i * plan.q_block - plan.window + 1) // plan.block, 0), last)
    first = ops.floor_divide(i * plan.q_block - plan.window + 1, plan.block)
    return ops.clip(first, 0, last)


def block_mask(mask, q_start, q_size, k_start, k_size, is_causal, window=None):
    """The `(B|1, H|1, q_size|1, k_size|1)` mask of a query and key block."""
    block = None
    if mask is not None:
        starts, shape, sliced = [0, 0, 0, 0], list(ops.shape(mask)), False
        if q_start is not None and mask.shape[2] != 1:
            starts[2], shape[2], sliced = q_start, q_size, True
        if mask.shape[3] != 1:
            starts[3], shape[3], sliced = k_start, k_size, True
        block = ops.slice(mask, starts, shape) if sliced else mask
    offset = -k_start if q_start is None else q_start - k_start
    if window is not None:
        band = sliding_window_mask(q_size, k_size, window, offset, is_causal)
        block = band if block is None else ops.logical_and(block, band)
    elif is_causal:
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


def _rows(x, i, plan):
    """Query block `i` of `x` `(B, T, H, D)`."""
    if plan.num_q_blocks == 1:
        return x
    shape = list(ops.shape(x))
    shape[1] = plan.q_block
    return ops.slice(x, [0, i * plan.q_block] + [0] * (len(shape) - 2), shape)


def _row_stats(x, i, plan):
    """Query block `i` of row statistics `(B, H, T, n)`."""
    if plan.num_q_blocks == 1:
        return x
    shape = list(ops.shape(x))
    shape[2] = plan.q_block
    return ops.slice(x, [0, 0, i * plan.q_block, 0], shape)


def _keys(x, j, plan):
    """Key block `j` of `x` `(B, S, K, D)`, in `plan.wide`."""
    shape = list(ops.shape(x))
    shape[1] = plan.block
    return ops.cast(ops.slice(x, [0, j * plan.block, 0, 0], shape), plan.wide)


def _grouped(x, plan):
    """`(B, n, H, D) -> (B, n, K, G, D)`: query heads by their key head."""
    n, heads, size = x.shape[1], x.shape[2], x.shape[3]
    return ops.reshape(x, (-1, n, heads // plan.groups, plan.groups, size))


def _by_head(x):
    """`(B, K, G, n, m) -> (B, H, n, m)`."""
    k, g, n, m = x.shape[1:]
    return ops.reshape(x, (-1, k * g, n, m))


def _by_group(x, plan):
    """`(B, H, n, m) -> (B, K, G, n, m)`."""
    h, n, m = x.shape[1:]
    return ops.reshape(x, (-1, h // plan.groups, plan.groups, n, m))


def _query_block(q, i, plan):
    """Query block `i`, in `plan.wide` and scaled, grouped `(B, Tq, K, G, D)`."""
    return _grouped(ops.cast(_rows(q, i, plan), plan.wide) * plan.scale, plan)


def _scores(q_i, k_j, i, j, plan):
    """Scores `(B, H, Tq, block)` of query block `i`, key block `j`, and mask.

    `q_i`: `_query_block`; `k_j`: `_keys`."""
    s = _by_head(ops.einsum("bqkgd,bskd->bkgqs", q_i, k_j))
    q_start = None if plan.num_q_blocks == 1 else i * plan.q_block
    if plan.slopes is not None:
        s = s + alibi_bias(
            plan.slopes, 0 if q_start is None else q_start, plan.q_block,
            j * plan.block, plan.block, plan.wide,
        )
    mask = block_mask(
        plan.mask, q_start, plan.q_block, j * plan.block, plan.block,
        plan.is_causal, plan.window,
    )
    return s, mask


def _maximum(x, y):
    """`ops.maximum` in the inputs' dtype. keras's torch backend takes it in
    float32 for float64 tensors (its promotion maps 64 bits to 32, as JAX
    without x64): the running maximum's `MASK_VALUE` start became
    `-1.0000000150474662e30`, and `exp` of the difference `inf`."""
    if keras.backend.backend() == "torch":
        return ops.where(x >= y, x, y)
    return ops.maximum(x, y)


def _forward_rows(q, k, v, i, plan):
    """Output `(B, Tq, H, Dv)` (`plan.wide`) and the row maxima and
    log-sums `(B, H, Tq, 2)` of query block `i` over the key blocks it
    visits (`plan.span` of them from `_first_key_block`)."""
    q_i = _query_block(q, i, plan)
    first = _first_key_block(i, plan)

    def step(r, carry):
        j = first + r
        acc, row_max, row_sum = carry
        s, m = _scores(q_i, _keys(k, j, plan), i, j, plan)
        if m is not None:
            s = ops.where(m, s, MASK_VALUE)
        new_max = _maximum(row_max, ops.amax(s, axis=-1, keepdims=True))
        p = ops.exp(s - new_max)
        if m is not None:
            p = ops.where(m, p, 0.0)
        correction = ops.exp(row_max - new_max)
        row_sum = row_sum * correction + ops.sum(p, axis=-1, keepdims=True)
        pv = ops.einsum("bkgqs,bskd->bkgqd", _by_group(p, plan), _keys(v, j, plan))
        acc = acc * correction + _by_head(pv)
        return acc, new_max, row_sum

    # (B, H, Tq, 1), the batch size as the queries have it.
    row_zeros = ops.zeros_like(
        ops.transpose(_rows(q, i, plan)[..., :1], (0, 2, 1, 3)), plan.wide
    )
    init = (
        row_zeros + ops.zeros((plan.d_v,), plan.wide),
        row_zeros + MASK_VALUE,
        row_zeros,
    )
    acc, row_max, row_sum = fori_loop(0, plan.span, step, init)
    if not plan.rows_may_be_empty:
        out, log_sum = acc / row_sum, ops.log(row_sum)
    else:
        has_keys = row_sum > 0.0
        safe_sum = ops.where(has_keys, row_sum, 1.0)
        out = ops.where(has_keys, acc / safe_sum, 0.0)
        # Rows without keys never contribute gradients (their mask is
        # False everywhere).
        row_max = ops.where(has_keys, row_max, 0.0)
        log_sum = ops.where(has_keys, ops.log(safe_sum), 0.0)
    return ops.transpose(out, (0, 2, 1, 3)), ops.concatenate([row_max, log_sum], -1)


def _backward_rows(q, k, v, d_out, delta, lse, i, d_k, d_v, plan):
    """`d_q` `(B, Tq, H, D)` of query block `i` (with respect to the
    scaled query); adds its part to `d_k`, `d_v` `(B, S, K, D)`."""
    q_i = _query_block(q, i, plan)
    do_i = ops.cast(_rows(d_out, i, plan), plan.wide)
    do_i = _grouped(do_i, plan)  # (B, Tq, K, G, Dv)
    delta_i, lse_i = _row_stats(delta, i, plan), _row_stats(lse, i, plan)
    first = _first_key_block(i, plan)
    # With several query blocks, a key block's gradient sums their parts.
    accumulate = plan.num_q_blocks > 1

    def step(r, carry):
        j = first + r
        d_q_i, d_k, d_v = carry
        k_j, v_j = _keys(k, j, plan), _keys(v, j, plan)
        s, m = _scores(q_i, k_j, i, j, plan)
        p = ops.exp((s - lse_i[..., :1]) - lse_i[..., 1:])
        if m is not None:
            p = ops.where(m, p, 0.0)
        d_v_j = ops.einsum("bkgqs,bqkgd->bskd", _by_group(p, plan), do_i)
        d_p = _by_head(ops.einsum("bqkgd,bskd->bkgqs", do_i, v_j))
        d_s = _by_group(p * (d_p - delta_i), plan)
        d_q_i = d_q_i + ops.einsum("bkgqs,bskd->bqkgd", d_s, k_j)
        d_k_j = ops.einsum("bkgqs,bqkgd->bskd", d_s, q_i)
        if accumulate:
            d_k_j = d_k_j + _keys(d_k, j, plan)
            d_v_j = d_v_j + _keys(d_v, j, plan)
        d_k = ops.slice_update(d_k, [0, j * plan.block, 0, 0], d_k_j)
        d_v = ops.slice_update(d_v, [0, j * plan.block, 0, 0], d_v_j)
        return d_q_i, d_k, d_v

    d_q_i, d_k, d_v = fori_loop(
        0, plan.span, step, (ops.zeros_like(q_i), d_k, d_v)
    )
    return ops.reshape(d_q_i, ops.shape(q_i)[:2] + (-1, q_i.shape[-1])), d_k, d_v


def _forward(q, k, v, out_dtype, plan):
    """Output `(B, T, H, Dv)` in `out_dtype` and the row statistics
    `(B, H, T, 2)` (`_forward_rows`)."""
    if plan.num_q_blocks == 1:
        out, lse = _forward_rows(q, k, v, 0, plan)
        return ops.cast(out, out_dtype), lse

    def step(i, carry):
        out_all, lse_all = carry
        out_i, lse_i = _forward_rows(q, k, v, i, plan)
        return (
            ops.slice_update(
                out_all, [0, i * plan.q_block, 0, 0], ops.cast(out_i, out_dtype)
            ),
            ops.slice_update(lse_all, [0, 0, i * plan.q_block, 0], lse_i),
        )

    b, t, h = ops.shape(q)[0], q.shape[1], q.shape[2]
    # Zeros that depend on `q` (batched with it under `torch.func.vmap`,
    # where writing batched rows into an unbatched buffer fails); not
    # `0 * q`, which a NaN query would make NaN everywhere.
    zero = ops.zeros_like(q[:1, :1, :1, :1], plan.wide)
    init = (
        ops.zeros((b, t, h, plan.d_v), out_dtype) + ops.cast(zero, out_dtype),
        ops.zeros((b, h, t, 2), plan.wide) + zero,
    )
    return fori_loop(0, plan.num_q_blocks, step, init)


def _backward(q, k, v, out, lse, d_out, plan):
    """`(d_q, d_k, d_v)` in the inputs' dtypes, recomputing each block's
    weights from `lse`, the row statistics of `_forward`."""
    # delta = rowsum(dO * O) (B, H, T, 1); then O is no longer needed.
    delta = ops.sum(
        ops.cast(d_out, plan.wide) * ops.cast(out, plan.wide), axis=-1
    )
    delta = ops.expand_dims(ops.transpose(delta, (0, 2, 1)), -1)
    # The zero accumulators depend on `delta` (`0 * x`, which XLA keeps for
    # floats): a plain zeros buffer has no input, and XLA's scheduler makes
    # it at the start of the program, alive through the whole forward pass.
    zero = ops.sum(delta[:1, :1, :1]) * 0.0
    d_k = ops.zeros(ops.shape(k), plan.wide) + zero
    d_v = ops.zeros(ops.shape(v), plan.wide) + zero

    def finish(d_q):
        return ops.cast(d_q * plan.scale, q.dtype)

    if plan.num_q_blocks == 1:
        d_q, d_k, d_v = _backward_rows(
            q, k, v, d_out, delta, lse, 0, d_k, d_v, plan
        )
        return finish(d_q), ops.cast(d_k, k.dtype), ops.cast(d_v, v.dtype)
    # Query block i's d_q overwrites its own rows of dO once they are read,
    # so d_q needs no buffer of its own (when the shapes and dtypes agree).
    reuse = tuple(d_out.shape) == tuple(q.shape) and d_out.dtype == q.dtype
    d_q = d_out if reuse else ops.zeros(ops.shape(q), q.dtype) + ops.cast(zero, q.dtype)

    def step(i, carry):
        d_q, d_k, d_v = carry
        d_q_i, d_k, d_v = _backward_rows(
            q, k, v, d_q if reuse else d_out, delta, lse, i, d_k, d_v, plan
        )
        d_q = ops.slice_update(d_q, [0, i * plan.q_block, 0, 0], finish(d_q_i))
        return d_q, d_k, d_v

    d_q, d_k, d_v = fori_loop(0, plan.num_q_blocks, step, (d_q, d_k, d_v))
    return d_q, ops.cast(d_k, k.dtype), ops.cast(d_v, v.dtype)


def _pad_keys(k, v, mask, s_len, padded):
    """Keys and values `(B, S, K, D)` padded to whole blocks, the padding
    masked."""
    if padded == s_len:
        return k, v, mask
    widths = [[0, 0], [0, padded - s_len], [0, 0], [0, 0]]
    k, v = pad(k, widths), pad(v, widths)
    valid = ops.reshape(ops.arange(padded) < s_len, (1, 1, 1, padded))
    if mask is None:
        return k, v, valid
    if mask.shape[-1] != 1:
        mask = pad(
            mask, [[0, 0], [0, 0], [0, 0], [0, padded - s_len]],
            constant_values=False,
        )
    return k, v, ops.logical_and(mask, valid)


def blocked_heads(query, key, value, mask, is_causal, scale, block_size,
                  query_block_size, sliding_window=None, alibi_slopes=None,
                  compiled=False):
    """The blocked path on inputs `dot_product_attention` has checked.

    `mask` is rank 4 or `None`; `scale` a number. With `sliding_window`,
    each query block visits only the key blocks its band meets (a static
    count, `_window_span`), so the work is `O(T * window)`; the queries are
    then padded to whole query blocks. `alibi_slopes` `(H,)` adds
    `slope * (s - t)` to each block's scores. With `compiled`, the forward
    and the backward pass each run as their own XLA computation
    (`xla_cpu.compiles_blocked_core`); the custom gradient stays outside
    them, so no XLA computation is ever differentiated. Returns
    `(B, T, H, Dv)` in `value`'s dtype.
    """
    num_heads, kv_heads = query.shape[2], key.shape[2]
    t_len, s_len = static_lengths(query, key, "blocked")
    block = max(1, min(int(block_size), s_len))
    num_blocks = -(-s_len // block)
    mask = broadcast_unknown_mask_axes(mask, t_len, s_len)
    k, v, mask = _pad_keys(key, value, mask, s_len, num_blocks * block)
    check_mask_rows(mask, t_len)
    q = query
    if sliding_window is None:
        q_block = _pick_query_block(t_len, query_block_size)
        padded_t = t_len
    else:
        # Query blocks are what lets a window skip keys: pad T to them.
        q_block = max(1, min(int(query_block_size or t_len), t_len))
        padded_t = -(-t_len // q_block) * q_block
        q, mask = pad_queries(q, mask, t_len, padded_t)
    num_q_blocks = padded_t // q_block
    plan = _Plan(
        block, num_blocks, q_block, num_q_blocks, mask, is_causal,
        v.shape[-1],
        # A band can leave a row without keys (and so can padded rows).
        mask is not None or sliding_window is not None,
        sliding_window,
        _window_span(q_block, block, num_blocks, sliding_window, is_causal),
        alibi_slopes,
        float(scale),
        num_heads // kv_heads,
        wide_dtype(query.dtype),
    )
    out_dtype = value.dtype
    forward, backward = _forward, _backward
    if compiled:
        forward, backward = xla_compiled(_forward), xla_compiled(_backward)

    # The plan's tensors go into the custom gradient as arguments, never in
    # its closure: under JAX's transforms (`jax.checkpoint`, `lax.scan`, a
    # `vjp` of a jitted call) a tracer closed over from the forward pass is
    # unbound in the backward (`masks.mask_arguments`).
    tensors = tuple(
        ops.convert_to_tensor(x) for x in (plan.mask, plan.slopes)
        if x is not None
    )

    @custom_gradient
    def attend(q, k, v, *given):
        # Saved for the backward: the inputs, the output and the
        # log-sum-exp, nothing else of length size.
        given = iter(given)
        bound = plan._replace(**{
            name: next(given) for name in ("mask", "slopes")
            if getattr(plan, name) is not None
        })
        if compiled:
            # Not recorded by a tape: a compiled call under one would be
            # made to output its loops' intermediates for a gradient
            # (which XLA cannot), and `grad` is its gradient anyway.
            out, lse = forward(
                *(ops.stop_gradient(x) for x in (q, k, v)), out_dtype, bound
            )
        else:
            out, lse = forward(q, k, v, out_dtype, bound)

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            grads = backward(q, k, v, out, lse, d_out, bound)
            return tuple(grads) + (None,) * len(tensors)

        return out, grad

    out = attend(q, k, v, *tensors)  # (B, T, H, Dv)
    if padded_t != t_len:
        out = out[:, :t_len]
    return out


def pad_queries(q, mask, t_len, padded):
    """Queries `(B, T, H, D)` padded to whole query blocks (their rows are
    dropped after)."""
    if isinstance(padded, int) and padded == t_len:
        return q, mask
    q = pad(q, [[0, 0], [0, padded - t_len], [0, 0], [0, 0]])
    if mask is not None and mask.shape[2] != 1:
        mask = pad(
            mask, [[0, 0], [0, 0], [0, padded - t_len], [0, 0]],
            constant_values=False,
        )
    return q, mask


def blocked_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    scale=None,
    block_size=DEFAULT_BLOCK_SIZE,
    query_block_size=DEFAULT_QUERY_BLOCK_SIZE,
    sliding_window=None,
    alibi_slopes=None,
):
    """Memory-efficient attention: key blocks with an online softmax.

    See the module. `dot_product_attention(..., implementation="blocked")`
    takes this path after its own checks.

    Args: as `dot_product_attention` (no bias, dropout or weights).

    Returns:
        `(B, T, H, Dv)` in `value`'s dtype.
    """
    sliding_window = check_sliding_window(sliding_window)
    check_attention_inputs(query, key, value)
    check_positive_int("block_size", block_size)
    check_positive_int("query_block_size", query_block_size, allow_none=True)
    check_alibi_slopes(alibi_slopes, query)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    mask = expand_mask(attention_mask)
    check_attention_mask(attention_mask, mask, query, key)
    return blocked_heads(
        query, key, value, mask, is_causal, scale,
        block_size, query_block_size, sliding_window, alibi_slopes,
    )
