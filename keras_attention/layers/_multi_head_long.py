"""`MultiHeadAttention`'s long-context path: windowed self-attention in chunks.

With a `sliding_window`, the output rows of a chunk of `C` queries depend
only on the input rows their band reaches: `[start - W + 1, start + C)`
with a causal window of `W`, `[start - W + 1, start + C + W - 1)` with a
symmetric one. This path runs the whole layer (the query, key, value and
gate projections, RoPE or ALiBi, the banded softmax, the output projection)
one such chunk at a time inside a loop, under a custom gradient that saves
only the input `x` (the attention inside a chunk runs in query blocks of
`_long_context_query_block`, 256, each on the keys its band reaches, so
its scores stay in cache). The backward loop recomputes each chunk, takes
its vector-Jacobian product with respect to its input rows and the weights
(`tf.GradientTape` inside the loop body on TensorFlow, `jax.vjp` on JAX),
adds the rows' gradient into `dx` in place and sums the weights'. So the
length-sized tensors of a forward + backward are `x`, the output, its
gradient and `dx` (with a causal window `dx` is written into the rows of the
output's gradient once they are read, which makes three): never `q`, `k`,
`v` or their gradients (`O(C * (C + W))` per chunk instead).

A `(B, T, dim)` self-attention call takes it when every condition holds
(`LongContext._long_context_reason` says which one fails):

- the TensorFlow or JAX backend;
- `sliding_window` set, at most twice the chunk (`_long_context_chunk`,
  512), and `T >= _long_context_min_length` (8,192);
- `implementation="auto"` (`"blocked"` asks for the blocked core around
  length-sized projections: about 1.1x faster at 16,384 to 65,536 tokens
  on the machine of BENCHMARKS.md, and twice the memory), no `flash_attention`, and
  keras_attention's own `_compute_attention` (a subclass overriding it keeps
  the general path);
- no mask of any kind, no `return_attention_scores`, no cache, no active
  dropout, no quantized projection (LoRA is fine: the kernels enter as
  tensors).

Example:

```python
layer = MultiHeadAttention(num_heads=8, key_dim=64, sliding_window=512,
                           use_causal_mask=True)
x = np.random.rand(1, 131072, 512).astype("float32")
layer(x).shape  # (1, 131072, 512): the chunked path, ~3 length-sized tensors
layer._long_context_reason(x, None, None)  # None: the path is taken
```

`_long_context_chunk`, `_long_context_query_block` and
`_long_context_min_length` are class attributes that an instance may
override (tests set small values on one layer). Measured in BENCHMARKS.md
("The chunked path"): 1.9 GB of process memory for forward + backward at
131,072 tokens on TensorFlow instead of 3.1 GB.

"""

import keras
from keras import ops

from keras_attention.ops import positions
from keras_attention.ops.gradients import custom_gradient
from keras_attention.ops.masks import MASK_VALUE
from keras_attention.ops.masks import scalar_as
from keras_attention.ops.masks import sliding_window_mask
from keras_attention.ops.masks import wide_dtype
from keras_attention.ops.shapes import fori_loop

LONG_CONTEXT_CHUNK = 512
LONG_CONTEXT_QUERY_BLOCK = 256
LONG_CONTEXT_MIN_LENGTH = 8192


def _vjp(fn, primals, cotangent):
    """Gradients of `fn(*primals)` for `primals`, given `cotangent`."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(primals)
            out = fn(*primals)
        return tape.gradient(
            out, primals, output_gradients=cotangent,
            unconnected_gradients=tf.UnconnectedGradients.ZERO,
        )
    import jax

    _, pullback = jax.vjp(fn, *primals)
    return list(pullback(cotangent))


def _project(dense, x, kernel, bias):
    """`dense(x)` (an `EinsumDense`) with the given kernel and bias."""
    y = ops.einsum(dense.equation, x, kernel)
    if bias is not None:
        y = ops.add(y, bias)
    if dense.activation is not None:
        y = dense.activation(y)
    return y


class _Chunks:
    """The static layout: `T` rows, chunks of `C` queries reading `L` rows;
    inside a chunk, query blocks of `sub` rows reading `keys` of them."""

    def __init__(self, length, chunk, window, causal, query_block):
        self.length = length
        self.chunk = min(chunk, length)
        self.window = window
        self.causal = causal
        self.reach = (window - 1) * (1 if causal else 2)
        self.rows = min(length, self.chunk + self.reach)
        self.count = -(-length // self.chunk)
        sub = min(query_block or self.chunk, self.chunk)
        self.sub = sub if self.chunk % sub == 0 else self.chunk
        self.keys = min(self.rows, self.sub + self.reach)

    def starts(self, i):
        """First query row and first input row of chunk `i` (tensors).

        The last chunk is moved back to end at `T` (it recomputes rows of
        the one before); the input rows are clipped into `[0, T)`, which
        keeps every row a query's band reaches.
        """
        q_start = ops.minimum(i * self.chunk, self.length - self.chunk)
        k_start = ops.clip(
            q_start - (self.window - 1), 0, self.length - self.rows
        )
        return q_start, k_start


def _attend_rows(q, k, v, q_at, k_at, alibi_slopes, layout):
    """Heads `(B, sub, H, Dv)` of the `sub` queries `q` `(B, sub, H, D)`
    (scaled) at local row `q_at` of the chunk's keys `k`, `v`; `k_at` is
    the chunk's first input row (for ALiBi)."""
    sub, keys = layout.sub, layout.keys
    heads, kv_heads, size = q.shape[2], k.shape[2], q.shape[3]
    groups = heads // kv_heads
    # The keys this block's band reaches, clipped into the chunk's rows.
    first = ops.clip(q_at - (layout.window - 1), 0, layout.rows - keys)
    batch = ops.shape(k)[0]
    k = ops.slice(k, [0, first, 0, 0], [batch, keys, kv_heads, size])
    v = ops.slice(v, [0, first, 0, 0], [batch, keys, kv_heads, v.shape[-1]])
    q = ops.reshape(q, (-1, sub, kv_heads, groups, size))
    s = ops.einsum("bqkgd,bskd->bkgqs", q, k)
    s = ops.reshape(ops.cast(s, wide_dtype(q.dtype)), (-1, heads, sub, keys))
    if alibi_slopes is not None:
        s = s + positions.alibi_bias(
            alibi_slopes, q_at + k_at, sub, first + k_at, keys, wide_dtype(q.dtype)
        )
    band = sliding_window_mask(
        sub, keys, layout.window, q_at - first, layout.causal
    )
    # Every query sees at least itself, so no row is empty.
    p = ops.softmax(ops.where(band, s, MASK_VALUE), axis=-1)
    p = ops.reshape(ops.cast(p, v.dtype), (-1, kv_heads, groups, sub, keys))
    out = ops.einsum("bkgqs,bskd->bqkgd", p, v)
    return ops.reshape(out, (-1, sub, heads, v.shape[-1]))


def _attend_chunk(layer, denses, x_rows, weights, q_start, k_start, layout):
    """The layer's output `(B, C, *out)` for the `C` queries from `q_start`,
    from its input rows `x_rows` `(B, L, dim)` starting at `k_start`.

    The projections run on the whole chunk; the attention on query blocks
    of `layout.sub` rows, each on the keys its band reaches (its scores
    stay in cache)."""
    params, at = [], 0
    for dense in denses:
        has_bias = dense.bias is not None
        params.append((weights[at], weights[at + 1] if has_bias else None))
        at += 2 if has_bias else 1
    c, sub = layout.chunk, layout.sub
    offset = q_start - k_start
    x_q = ops.slice(
        x_rows, [0, offset, 0], [ops.shape(x_rows)[0], c, x_rows.shape[-1]]
    )
    q = _project(denses[0], x_q, *params[0])  # (B, C, H, D)
    k = _project(denses[1], x_rows, *params[1])  # (B, L, K, D)
    v = _project(denses[2], x_rows, *params[2])  # (B, L, K, Dv)
    q, k, extra = layer._encode_positions(q, k, {}, True, q_start, k_start)
    q = q * scalar_as(layer._inverse_sqrt_key_dim, q.dtype)
    out = [
        _attend_rows(
            q[:, j : j + sub], k, v, offset + j, k_start,
            extra.get("alibi_slopes"), layout,
        )
        for j in range(0, c, sub)
    ]
    out = out[0] if len(out) == 1 else ops.concatenate(out, axis=1)
    if layer._use_gate:
        out = ops.multiply(out, _project(denses[4], x_q, *params[4]))
    return _project(denses[3], out, *params[3])


def _backward(x, weights, d_out, chunk_fn, layout):
    """`dx` and the weights' gradients, recomputing chunk by chunk."""
    batch, dim = ops.shape(x)[0], x.shape[-1]
    out_tail = [0] * (len(d_out.shape) - 2)
    # With a causal window, chunk i reads and writes no row below
    # `i * C - W + 1` nor above its last query, so `dx` can take the rows
    # of `d_out` once they are read.
    reuse = (
        layout.causal
        and tuple(d_out.shape) == tuple(x.shape)
        and d_out.dtype == x.dtype
    )
    # The accumulators depend on `d_out`: XLA would make an input-less
    # buffer at the start of the program.
    wide = wide_dtype(x.dtype)  # the weights' sums: float64 for float64
    zero = ops.sum(ops.cast(ops.ravel(d_out)[:1], wide)) * 0.0
    d_x = d_out if reuse else ops.zeros(ops.shape(x), x.dtype) + ops.cast(zero, x.dtype)
    d_ws = [ops.zeros(ops.shape(w), wide) + zero for w in weights]
    c, rows = layout.chunk, layout.rows
    source = d_x if reuse else d_out

    def rows_of(buffer, i):
        """Chunk `i`'s rows of the output's gradient `(B, C, *out)`."""
        return ops.slice(
            buffer, [0, layout.starts(i)[0]] + out_tail,
            [batch, c] + list(d_out.shape[2:]),
        )

    def step(i, carry):
        d_x, d_y, d_ws = carry[0], carry[1], list(carry[2:])
        q_start, k_start = layout.starts(i)
        # Rows of the last chunk that the one before already covered.
        fresh_q = ops.arange(c) + q_start >= i * c
        fresh_shape = (1, c) + (1,) * len(out_tail)
        d_y = ops.where(ops.reshape(fresh_q, fresh_shape), d_y, 0.0)
        x_rows = ops.slice(x, [0, k_start, 0], [batch, rows, dim])
        grads = _vjp(
            lambda xr, *ws: chunk_fn(xr, ws, q_start, k_start),
            [x_rows] + list(weights), ops.cast(d_y, x.dtype),
        )
        old = ops.slice(d_x, [0, k_start, 0], [batch, rows, dim])
        g_x = ops.cast(grads[0], x.dtype)
        if reuse:
            index = ops.reshape(ops.arange(rows) + k_start, (1, rows, 1))
            # Below i * C: dx so far; up to the last query: d_out just read
            # (replaced); above: d_out of later chunks (kept).
            new = ops.where(
                index < i * c, old + g_x,
                ops.where(index < q_start + c, g_x, old),
            )
        else:
            new = old + g_x
        d_x = ops.slice_update(d_x, [0, k_start, 0], new)
        # The next chunk's rows are read after the update (they are not
        # among those written): a read before it, in the same step, makes
        # XLA copy the whole buffer to update it in place.
        d_y = rows_of(d_x if reuse else d_out, i + 1)
        d_ws = [a + ops.cast(g, wide) for a, g in zip(d_ws, grads[1:])]
        return (d_x, d_y, *d_ws)

    result = fori_loop(
        0, layout.count, step, (d_x, rows_of(source, 0), *d_ws)
    )
    d_ws = [ops.cast(g, w.dtype) for g, w in zip(result[2:], weights)]
    return (result[0], *d_ws)


def long_self_attention(layer, x, causal, chunk, query_block=None):
    """The layer's self-attention output on `x` `(B, T, dim)`, chunked.

    See the module. `chunk` is the number of queries per chunk (their
    projections run together), `query_block` the number per attention block
    inside a chunk (a divisor of `chunk`; else the whole chunk).
    """
    x = ops.cast(x, layer.compute_dtype)
    denses = [layer._query_dense, layer._key_dense, layer._value_dense,
              layer._output_dense]
    if layer._use_gate:
        denses.append(layer._gate_dense)
    weights = []
    for dense in denses:
        weights.append(ops.cast(dense.kernel, layer.compute_dtype))
        if dense.bias is not None:
            weights.append(ops.cast(dense.bias, layer.compute_dtype))
    layout = _Chunks(
        x.shape[1], chunk, layer._sliding_window, causal, query_block
    )
    out_shape = tuple(
        layer.compute_output_shape(tuple(x.shape))[2:]
    )

    def chunk_fn(x_rows, ws, q_start, k_start):
        return _attend_chunk(
            layer, denses, x_rows, ws, q_start, k_start, layout
        )

    @custom_gradient
    def attend(x, *weights):
        batch, dim = ops.shape(x)[0], x.shape[-1]
        tail = [0] * len(out_shape)

        def step(i, out):
            q_start, k_start = layout.starts(i)
            x_rows = ops.slice(x, [0, k_start, 0], [batch, layout.rows, dim])
            y = chunk_fn(x_rows, weights, q_start, k_start)
            return ops.slice_update(out, [0, q_start] + tail, ops.cast(y, out.dtype))

        out = ops.zeros((batch, layout.length) + out_shape, x.dtype)
        out = fori_loop(0, layout.count, step, out)

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            return _backward(x, list(weights), ops.cast(d_out, x.dtype), chunk_fn, layout)

        return out, grad

    return attend(x, *weights)


class LongContext:
    """`MultiHeadAttention`'s chunked long-context path (see the module)."""

    _long_context_chunk = LONG_CONTEXT_CHUNK
    _long_context_query_block = LONG_CONTEXT_QUERY_BLOCK
    _long_context_min_length = LONG_CONTEXT_MIN_LENGTH

    def _long_context_reason(self, query, value, key, masks=(), training=None,
                             return_attention_scores=False, own_core=True):
        """Why this self-attention call keeps the general path (a string),
        or `None` when it takes the chunked one."""
        window = self._sliding_window
        # A static length only: a symbolic one (JAX's export) can't be compared.
        length = query.shape[1] if len(query.shape) == 3 else None
        length = length if isinstance(length, int) else None
        chunk = min(int(self._long_context_chunk), length or 1)
        checks = (
            (keras.backend.backend() in ("tensorflow", "jax"), "backend"),
            (window is not None, "no sliding_window"),
            (len(query.shape) == 3, "not (B, T, dim)"),
            ((value is None or value is query)
             and (key is None or key is query), "not self-attention"),
            (self.implementation == "auto", "implementation"),
            (not self._flash_attention, "flash_attention"),
            (own_core, "a subclass's _compute_attention"),
            (all(m is None for m in masks), "a mask"),
            (not return_attention_scores, "return_attention_scores"),
            (not (self._dropout > 0 and training), "dropout"),
            (all(getattr(d, "quantization_mode", None) is None
                 for d in (self._query_dense, self._key_dense,
                           self._value_dense, self._output_dense,
                           getattr(self, "_gate_dense", None))),
             "quantized"),
            (self._activity_regularizer is None, "activity_regularizer"),
            (isinstance(length, int)
             and length >= self._long_context_min_length, "short"),
            (window is not None and window <= 2 * chunk, "window over 2 chunks"),
        )
        for ok, reason in checks:
            if not ok:
                return reason
        return None

    def _long_context_call(self, query, causal):
        return long_self_attention(
            self, query, causal, int(self._long_context_chunk),
            int(self._long_context_query_block),
        )
