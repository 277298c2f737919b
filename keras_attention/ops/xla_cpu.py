"""Forms XLA's CPU backend runs faster than the simple ones.

Each function here computes what its simple counterpart computes (tested
equal in values and gradients, `tests/test_xla_cpu.py`), and takes its own
form only inside code that XLA compiles for a CPU (`autotune.xla_on_cpu()`);
elsewhere it is the simple form. Each choice is recorded once per shape in
`dispatch_choices()` (BENCHMARKS.md, "Speed per machine").
"""

import math

import keras
from keras import ops

from keras_attention.ops import autotune
from keras_attention.ops.gradients import custom_gradient
from keras_attention.ops.masks import MASK_VALUE
from keras_attention.ops.masks import mask_arguments
from keras_attention.ops.shapes import fori_loop

# `keys_product` loops from this many scores per (batch, head) pair
# (`benchmarks/bench_xla_products.py`, idle AVX-512 CPU): the loop is 2.2x
# faster at 2,048 x 2,048, 1.85x at 1,024, 1.08x at 512, even at 256 and
# 2x slower at 65 x 65 (ViT's tokens), where its own cost is not repaid.
_LOOPED_PRODUCT_SIZE = 512 * 512
# Up to this many scores per pair the loop takes `_PAIRS_PER_STEP` pairs a
# step (`keys_product`).
_GROUPED_PRODUCT_SIZE = 1024 * 1024
_PAIRS_PER_STEP = 4


def _flat_equation(dense):
    """`(bound, outs)` letter counts when `dense.equation` reads
    `free + bound, bound + outs -> free + outs` (every projection of the
    attention layers), else `None`."""
    equation = getattr(dense, "equation", "")
    if "->" not in equation or "," not in equation or "." in equation:
        return None
    inputs, out = equation.split("->")
    x_letters, kernel_letters = inputs.split(",")
    bound = [c for c in kernel_letters if c in x_letters and c not in out]
    n = len(bound)
    if n == 0 or len(set(x_letters)) != len(x_letters):
        return None
    free, outs = x_letters[: len(x_letters) - n], kernel_letters[n:]
    if x_letters[len(free):] != kernel_letters[:n] or out != free + outs:
        return None
    return n, len(outs)


def _can_flatten(dense, x):
    if not isinstance(dense, keras.layers.EinsumDense) or not dense.built:
        return False
    if getattr(dense, "quantization_mode", None) is not None:
        return False
    if dense.activity_regularizer is not None:
        return False  # its loss is added by `dense.__call__`
    dtype = keras.backend.standardize_dtype(x.dtype)
    if dtype != dense.compute_dtype or dtype != dense.variable_dtype:
        return False
    if _flat_equation(dense) is None:
        return False
    return autotune.xla_on_cpu()


def projection(dense, x):
    """`dense(x)` for a built `keras.layers.EinsumDense` projection.

    Under XLA on a CPU, with the layer's dtype and no quantization, the
    same product as one 2-D matmul, `(N, bound) x (bound, outs)`, plus the
    bias and the activation: its backward is then two plain 2-D products
    on the same `(N, outs)` gradient. The einsum's backward is a batched
    product and a sum, and XLA computes the transpose that feeds the
    gradient once for each of its two consumers (a `(B, T, H, D)` gradient
    coming from `(B, H, D, T)` heads is transposed twice); the flat form
    shares one. `dense.kernel` includes LoRA's update when it is enabled.
    Elsewhere (another backend or mode, mixed precision, a quantized
    kernel, an activity regularizer) this is `dense(x)`.
    """
    if not _can_flatten(dense, x):
        return dense(x)
    n_bound, n_outs = _flat_equation(dense)
    kernel = dense.kernel
    k_shape = tuple(kernel.shape)
    bound, outs = math.prod(k_shape[:n_bound]), math.prod(k_shape[n_bound:])
    autotune.record_rule(
        ("projection", keras.backend.backend(), dense.equation,
         tuple(x.shape), keras.backend.standardize_dtype(x.dtype)),
        "flat matmul",
        "rule: XLA on a CPU computes an EinsumDense projection as one 2-D "
        "matmul (one transpose for both gradient products)",
    )
    y = ops.matmul(ops.reshape(x, (-1, bound)), ops.reshape(kernel, (bound, outs)))
    bias = dense.bias
    full_bias = bias is not None and tuple(bias.shape) == k_shape[n_bound:]
    if full_bias:
        # Its gradient is then a sum over the rows of a 2-D tensor, which
        # XLA's CPU backend reduces much faster than over two leading axes
        # (BENCHMARKS.md, "Speed per machine").
        y = y + ops.reshape(bias, (outs,))
    free = len(x.shape) - n_bound
    lead = tuple(ops.shape(x)[i] for i in range(free))
    y = ops.reshape(y, lead + k_shape[n_bound:])
    if bias is not None and not full_bias:
        y = ops.add(y, bias)  # EinsumDense's broadcast
    if dense.activation is not None:
        y = dense.activation(y)
    return y


# The blocked core is compiled on its own from this many scores per
# (batch, head) pair (static lengths): below, its loop is short and XLA's
# compilation (seconds per shape) would cost more than it saves.
_COMPILED_BLOCKED_SIZE = 1024 * 1024


def compiles_blocked_core(query=None, key=None, value=None):
    """Whether the blocked core runs as its own XLA computation here: on
    TensorFlow without a GPU, outside code XLA compiles already (a plain
    `tf.function`, or eager), for at least `_COMPILED_BLOCKED_SIZE` scores
    per (batch, head) pair. With the inputs given, a choice is recorded in
    `dispatch_choices()`.

    TensorFlow's graph executor runs the blocked path's loop of small
    block products one op at a time, much slower than XLA runs the same
    loop (AVX2-only CPU, TF 2.21, 8 heads of 64, forward + backward: the
    layer at 4,096 tokens 4.2-5.1 s in graph mode, 1.9-2.7 s with its
    core compiled; at 16,384, 209 s before, 45 s after, as fast as the
    whole step under XLA; BENCHMARKS.md, "AVX2 only"). Compiled on its
    own, the core keeps its values and gradients
    (`tests/test_fast_paths.py`) while the rest of the graph stays as the
    user traced it.
    """
    if keras.backend.backend() != "tensorflow":
        return False
    if autotune.tf_mode() == "xla":
        return False
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU"):
        return False
    if query is None:
        return True
    t_len, s_len = query.shape[1], key.shape[1]
    if None in (t_len, s_len) or t_len * s_len < _COMPILED_BLOCKED_SIZE:
        return False
    autotune.record_rule(
        ("blocked core", tuple(query.shape), tuple(key.shape),
         tuple(value.shape), keras.backend.standardize_dtype(query.dtype)),
        "blocked, compiled by XLA",
        "rule: TensorFlow on a CPU outside XLA runs a long blocked core as "
        "its own XLA computation (its loop of block products is 2 to 5x "
        "faster there)",
    )
    return True


_COMPILED = {}


def compiled(function):
    """`function` as one XLA computation (a `tf.function` with
    `jit_compile=True`, made once per function); its Python arguments
    (flags, block sizes) are part of each trace."""
    if function not in _COMPILED:
        import tensorflow as tf

        _COMPILED[function] = tf.function(
            function, jit_compile=True, autograph=False
        )
    return _COMPILED[function]


def _static(*sizes):
    """Whether every size is a known int: not `None`, and not one of the
    symbolic sizes JAX traces unknown ones with (`model.export`), which
    cannot be compared with an int."""
    return all(isinstance(n, int) for n in sizes)


def keys_product(p, x):
    """`einsum("bhts,bhtd->bhsd", p, x)`: `dV = P^T dO` and `dK = dS^T Q`.

    XLA's CPU backend folds any transpose around this product into the
    product itself and then runs it about 4x slower than the same
    arithmetic with the `(T, S)` operand on the right (`D x T` times
    `T x S`; measured on TF 2.21 and JAX 0.10 CPUs, BENCHMARKS.md "Speed
    per machine"). There, from `_LOOPED_PRODUCT_SIZE` scores per pair
    (static lengths), each `(batch, head)` pair's `x^T p` is computed in a
    loop, whose body XLA cannot fold the final transpose into; every other
    backend and mode keeps the single product (oneDNN and cuBLAS run it at
    full speed, and the loop would cost them).
    """
    heads, t_len, s_len = p.shape[1], p.shape[2], p.shape[3]
    if (
        not _static(heads, t_len, s_len)
        or t_len * s_len < _LOOPED_PRODUCT_SIZE
        or not autotune.xla_on_cpu()
    ):
        return ops.einsum("bhts,bhtd->bhsd", p, x)
    d_len = x.shape[-1]
    autotune.record_rule(
        ("keys product", keras.backend.backend(), heads, t_len, s_len, d_len,
         keras.backend.standardize_dtype(p.dtype)),
        "loop over (batch, head) pairs",
        "rule: XLA on a CPU, from 512 x 512 scores per pair, computes "
        "dV = P^T dO and dK = dS^T Q pair by pair (up to "
        f"{_PAIRS_PER_STEP} pairs a step to 1,024 x 1,024 scores)",
    )
    p = ops.reshape(p, (-1, t_len, s_len))
    # `x^T` laid out once, outside the loop, so that each step's product is
    # the plain `(D, T) x (T, S)` one: 15 % less CPU time at 2,048 than
    # contracting `x`'s first axis in the step, 11 % at 512 (`python
    # benchmarks/bench_xla_products.py --what loop`; BENCHMARKS.md, "Intel
    # Xeon with AMX", "x^T laid out once").
    x_t = ops.swapaxes(ops.reshape(x, (-1, t_len, d_len)), 1, 2)
    pairs = ops.shape(p)[0]
    # A few pairs per step: their products are independent, and XLA's CPU
    # runtime runs them side by side on its threads (the dense core at 512
    # in 81 against 91 ms, `python benchmarks/bench_xla_products.py --what
    # core --length 512`; BENCHMARKS.md, "Intel Xeon with AMX", "The keys
    # in place"); a larger product fills the threads alone. Never more
    # than the heads, so never more than the pairs; the last step starts
    # early enough to end at the last pair (recomputing a few, the same
    # values).
    group = min(heads, _PAIRS_PER_STEP if t_len * s_len <= _GROUPED_PRODUCT_SIZE
                else 1)

    def step(j, result):
        start = ops.minimum(j * group, pairs - group)
        products = [
            ops.matmul(ops.take(x_t, start + g, axis=0),
                       ops.take(p, start + g, axis=0))
            for g in range(group)
        ]
        return ops.slice_update(result, (start, 0, 0), ops.stack(products))

    result = fori_loop(
        0, (pairs + group - 1) // group, step,
        ops.zeros((pairs, d_len, s_len), dtype=x.dtype),
    )
    return ops.reshape(ops.swapaxes(result, 1, 2), (-1, heads, s_len, d_len))


def scores_product(a, b):
    """`einsum("bhtd,bhsd->bhts", a, b)`: the scores `Q K^T` and, in the
    backward pass, `dP = dO V^T`.

    Keras's TensorFlow einsum runs this equation as `matmul(a, b,
    transpose_b=True)`, which TensorFlow hands to XLA with `b^T` written
    out: a `(B, H, S, D) -> (B, H, D, S)` transpose that XLA's CPU backend
    runs slowly (61 ms of the layer's 3.0 s at 2,048 tokens, one thread;
    BENCHMARKS.md, "Intel Xeon with AMX", "The keys in place"). So inside
    code XLA compiles for a CPU, TensorFlow's own einsum: one dot that
    reads `b` where it lies. Elsewhere `ops.einsum` (oneDNN's matmul takes
    the transposed operand itself; JAX's einsum is that dot already).
    """
    if keras.backend.backend() == "tensorflow" and autotune.xla_on_cpu():
        import tensorflow as tf

        autotune.record_rule(
            ("scores product", tuple(a.shape), tuple(b.shape),
             keras.backend.standardize_dtype(a.dtype)),
            "TensorFlow's einsum",
            "rule: XLA on a CPU reads the keys where they lie (keras's "
            "TensorFlow einsum would have XLA transpose them in memory)",
        )
        return tf.einsum("bhtd,bhsd->bhts", a, b)
    return ops.einsum("bhtd,bhsd->bhts", a, b)


def takes_unnormalised(q, k, v):
    """Whether the dense core takes `unnormalised_attention`: float32 heads
    (all three: its gradients take their dtype) inside code XLA compiles
    for a CPU."""
    return all(
        keras.backend.standardize_dtype(x.dtype) == "float32" for x in (q, k, v)
    ) and autotune.xla_on_cpu()


def unnormalised_attention(q, k, v, mask):
    """The dense core `softmax(q k^T, mask) v` with the normalisation
    deferred to the `(B, H, T, Dv)` output, and its own gradient.

    `q` (scaled), `k`, `v`: `(B, H, T|S, D)` float32 heads; `mask` boolean,
    broadcastable to `(B, H, T, S)`, or `None`. It keeps
    `E = exp(s - rowmax(s))` (zero where masked) and `l = rowsum(E)`,
    returns `(E v) / l` (zero where a query sees no key), and its backward
    divides the `(B, H, T, D)` tensors by `l` instead of the `(B, H, T, S)`
    ones: `dV = E^T (dO / l)`, `dS~ = E (dP - delta)` with `dP = dO v^T`,
    `delta = rowsum(dO * O)`, `dQ = (dS~ k) / l`, `dK = dS~^T (q / l)`.
    Under XLA on a CPU this saves the softmax's division pass over the
    `(B, H, T, S)` weights (a write and a read of the largest tensor),
    which oneDNN's fused softmax does not need in graph mode. Above
    1,024 x 1,024 scores a pair the backward runs pair by pair
    (`_backward_in_pairs`), and on JAX the forward too
    (`_forward_in_pairs`). Tested equal to autodiff through
    `masked_softmax` (`tests/test_fast_paths.py`, `tests/test_xla_cpu.py`).
    """
    autotune.record_rule(
        ("dense core", keras.backend.backend(), tuple(q.shape), tuple(k.shape),
         tuple(v.shape), mask is not None),
        "unnormalised weights",
        "rule: XLA on a CPU divides the dense core's output by the softmax's "
        "row sums instead of its (B, H, T, S) weights",
    )

    @custom_gradient
    def attend(q, k, v, *masks):
        mask = masks[0] if masks else None
        if _forward_in_pairs_taken(q, k):
            out, e, inverse = _forward_in_pairs(q, k, v, mask)
        else:
            e, inverse = _unnormalised_weights(scores_product(q, k), mask)
            out = ops.matmul(e, v) * inverse  # (B, H, T, Dv)

        def grad(*args, upstream=None):
            d_out = upstream if upstream is not None else args[0]
            d_out = ops.cast(d_out, v.dtype)
            delta = ops.sum(d_out * out, axis=-1, keepdims=True)
            if _backward_in_pairs_taken(e):
                grads = _backward_in_pairs(q, k, v, e, inverse, d_out, delta)
                return tuple(grads) + (None,) * len(masks)
            d_v = keys_product(e, d_out * inverse)
            d_p = scores_product(d_out, v)
            # Unscaled by `inverse`, so that XLA computes it once for both
            # of its products (a row-scaled one is duplicated per consumer).
            d_s = e * (d_p - delta)
            d_q = ops.matmul(d_s, k) * inverse
            d_k = keys_product(d_s, q * inverse)
            return (d_q, d_k, d_v) + (None,) * len(masks)

        return out, grad

    return attend(q, k, v, *mask_arguments(mask))


def _unnormalised_weights(scores, mask):
    """`(E, 1 / l)`: `E = exp(s - rowmax(s))`, zero where `mask` is False,
    and the inverse of its row sums (zero for a row with no key)."""
    if mask is not None:
        scores = ops.where(mask, scores, MASK_VALUE)
    e = ops.exp(scores - ops.amax(scores, axis=-1, keepdims=True))
    if mask is not None:
        # A query with no key would see exp(0) everywhere: zeros.
        e = ops.where(mask, e, 0.0)
    total = ops.sum(e, axis=-1, keepdims=True)
    return e, ops.where(total > 0.0, 1.0 / ops.maximum(total, 1e-30), 0.0)


def _forward_in_pairs_taken(q, k):
    """Whether `unnormalised_attention`'s forward runs pair by pair: on
    Keras's JAX backend, above `_GROUPED_PRODUCT_SIZE` scores a pair (see
    `_forward_in_pairs`)."""
    heads, t_len, s_len = q.shape[1], q.shape[2], k.shape[2]
    return (keras.backend.backend() == "jax"
            and _static(heads, t_len, s_len)
            and t_len * s_len > _GROUPED_PRODUCT_SIZE)


def _forward_in_pairs(q, k, v, mask):
    """`unnormalised_attention`'s forward in one loop over the `(batch,
    head)` pairs: `(out, E, 1 / l)`, each step one pair's scores, weights
    and output; the scores are never a whole `(B, H, T, S)` tensor, and a
    pair's passes over them (row maximum, exponential, row sum, product
    with `v`) read the few megabytes the cache still holds. On Keras's JAX
    backend (CPU) at 2,048 tokens the dense core's forward took 516
    against 1,038 ms, forward + backward 1,670 against 2,005 (`python
    benchmarks/bench_jax_core.py --lengths 2048 [--forward]`; AMD EPYC
    with AVX-512, BENCHMARKS.md "The AVX-512 kind again, 2026-12-04").
    Not on TensorFlow, where under `jit_compile=True` the forward +
    backward ran slower this way in scratch runs (the loop writes `E`
    for the backward pass into a buffer XLA first fills with zeros) and
    the forward alone within noise."""
    _, heads, t_len, d_len = q.shape
    s_len, dv_len = k.shape[2], v.shape[-1]
    autotune.record_rule(
        ("dense core forward", keras.backend.backend(), heads, t_len, s_len,
         d_len, dv_len, None if mask is None else tuple(mask.shape)),
        "loop over (batch, head) pairs",
        "rule: XLA on a CPU (JAX), above 1,024 x 1,024 scores per pair, "
        "computes the dense core's forward pair by pair (the scores never whole)",
    )
    q_p, k_p, v_p = (ops.reshape(x, (-1,) + tuple(x.shape[2:])) for x in (q, k, v))
    if mask is not None:
        mask = ops.convert_to_tensor(mask)
        while len(mask.shape) < 4:
            mask = mask[None]

    def step(j, state):
        out, e, inverse = state

        def pair(x, rows, cols):
            return ops.reshape(ops.take(x, j, axis=0), (1, 1, rows, cols))

        mask_j = None
        if mask is not None:
            # The pair's own mask, from one broadcast over batch or heads.
            b = j // heads if mask.shape[0] != 1 else 0
            h = j % heads if mask.shape[1] != 1 else 0
            mask_j = ops.take(ops.take(mask, b, axis=0), h, axis=0)[None, None]
        e_j, inverse_j = _unnormalised_weights(
            scores_product(pair(q_p, t_len, d_len), pair(k_p, s_len, d_len)), mask_j)
        out_j = ops.matmul(e_j, pair(v_p, s_len, dv_len)) * inverse_j
        return (ops.slice_update(out, (j, 0, 0), out_j[0]),
                ops.slice_update(e, (j, 0, 0), e_j[0]),
                ops.slice_update(inverse, (j, 0, 0), inverse_j[0]))

    pairs = ops.shape(q_p)[0]
    out, e, inverse = fori_loop(
        0, pairs, step,
        (ops.zeros((pairs, t_len, dv_len), q.dtype),
         ops.zeros((pairs, t_len, s_len), q.dtype),
         ops.zeros((pairs, t_len, 1), q.dtype)),
    )
    return tuple(ops.reshape(x, (-1, heads) + tuple(x.shape[1:]))
                 for x in (out, e, inverse))


def _backward_in_pairs_taken(e):
    """Whether `unnormalised_attention`'s backward runs pair by pair: static
    lengths of more than `_GROUPED_PRODUCT_SIZE` scores a pair (where
    `keys_product` takes one pair a step too)."""
    heads, t_len, s_len = e.shape[1], e.shape[2], e.shape[3]
    return _static(heads, t_len, s_len) and t_len * s_len > _GROUPED_PRODUCT_SIZE


def _backward_in_pairs(q, k, v, e, inverse, d_out, delta):
    """`unnormalised_attention`'s `(dQ, dK, dV)` in one loop over the
    `(batch, head)` pairs, each step a pair's `dP`, `dS` and four
    products: `dP` and `dS` are never whole `(B, H, T, S)` tensors (two
    writes and reads of the largest tensors fewer, and their memory), and
    `dV`, `dK` are `keys_product`'s `x^T p`, with no `dS` slice copied out
    of a whole one. Under XLA on a CPU the dense core's forward + backward
    at 2,048 tokens took 1,950 against 2,094 CPU-ms (1,031 against 1,102
    ms wall), on Keras's JAX backend 1,651 against 3,324 ms; at 1,024
    the same within noise, at 512 slower, hence
    `_backward_in_pairs_taken` (`python benchmarks/bench_xla_products.py
    --what core --length 2048`, `python benchmarks/bench_jax_core.py`;
    BENCHMARKS.md "Intel Xeon with AMX", "The backward pair by pair").
    Tested equal to autodiff (`tests/test_xla_cpu.py`,
    `tests/test_backends.py` on JAX).
    """
    heads, t_len, s_len = e.shape[1], e.shape[2], e.shape[3]
    d_len, dv_len = q.shape[-1], v.shape[-1]
    autotune.record_rule(
        ("dense core backward", keras.backend.backend(), heads, t_len, s_len,
         d_len, dv_len),
        "loop over (batch, head) pairs",
        "rule: XLA on a CPU, above 1,024 x 1,024 scores per pair, computes "
        "the dense core's backward pair by pair (dP and dS never whole; dV "
        "and dK as x^T p)",
    )

    def pairs_of(x):  # (B, H, R, C) -> (B * H, R, C)
        return ops.reshape(x, (-1,) + tuple(x.shape[2:]))

    e, d_out, v, k = pairs_of(e), pairs_of(d_out), pairs_of(v), pairs_of(k)
    delta, inverse = pairs_of(delta), pairs_of(inverse)
    # Laid out once, outside the loop: each step's dV^T and dK^T are then
    # plain `(D, T) x (T, S)` products (see `keys_product`).
    d_out_t = ops.swapaxes(d_out * inverse, 1, 2)
    q_t = ops.swapaxes(pairs_of(q) * inverse, 1, 2)

    def step(j, grads):
        d_v_t, d_k_t, d_q = grads

        def pair(x):
            return ops.take(x, j, axis=0)

        e_j = pair(e)
        d_s = e_j * (scores_product(ops.reshape(pair(d_out), (1, 1, t_len, dv_len)),
                                    ops.reshape(pair(v), (1, 1, s_len, dv_len)))[0, 0]
                     - pair(delta))
        return (
            ops.slice_update(d_v_t, (j, 0, 0), ops.matmul(pair(d_out_t), e_j)[None]),
            ops.slice_update(d_k_t, (j, 0, 0), ops.matmul(pair(q_t), d_s)[None]),
            ops.slice_update(
                d_q, (j, 0, 0), (ops.matmul(d_s, pair(k)) * pair(inverse))[None]
            ),
        )

    pairs = ops.shape(e)[0]
    d_v_t, d_k_t, d_q = fori_loop(
        0, pairs, step,
        (ops.zeros((pairs, dv_len, s_len), v.dtype),
         ops.zeros((pairs, d_len, s_len), q.dtype),
         ops.zeros((pairs, t_len, d_len), q.dtype)),
    )

    def heads_of(x, rows, cols):
        return ops.reshape(x, (-1, heads, rows, cols))

    return (
        heads_of(d_q, t_len, d_len),
        heads_of(ops.swapaxes(d_k_t, 1, 2), s_len, d_len),
        heads_of(ops.swapaxes(d_v_t, 1, 2), s_len, dv_len),
    )
