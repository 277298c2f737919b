"""The attention core against NumPy, and the blocked path against the dense one."""

import warnings

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops
from tests.cases_sequence import softmax
from tests.harness import values_and_grads


def attention_reference(q, k, v, mask=None, causal=False, bias=None, scale=None):
    """softmax(Q K^T * scale + bias) V from the paper, in float64. (B,T,H,D)."""
    q, k, v = (np.asarray(x, "float64") for x in (q, k, v))
    heads = q.shape[2]
    k = np.repeat(k, heads // k.shape[2], axis=2)
    v = np.repeat(v, heads // v.shape[2], axis=2)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("bthd,bshd->bhts", q, k) * scale
    if bias is not None:
        scores = scores + bias
    full = np.ones(scores.shape, bool)
    if mask is not None:
        m = np.asarray(mask, bool)
        m = m[:, None, None, :] if m.ndim == 2 else (m[:, None] if m.ndim == 3 else m)
        full &= m
    if causal:
        t, s = scores.shape[-2:]
        full &= np.tril(np.ones((t, s), bool))
    w = softmax(scores, full)
    return np.einsum("bhts,bshd->bthd", w, v), w


def count_calls(monkeypatch, name):
    """Wraps `<name>` where the dispatcher calls it; returns the list that
    grows per call."""
    calls = []
    original = getattr(attention_ops.dispatch, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention_ops.dispatch, name, spy)
    return calls


def random_qkv(rng, b=2, t=9, s=13, h=4, k=2, d=8, dv=5):
    return (
        rng.normal(size=(b, t, h, d)).astype("float32"),
        rng.normal(size=(b, s, k, d)).astype("float32"),
        rng.normal(size=(b, s, k, dv)).astype("float32"),
    )


def test_masked_softmax_matches_numpy_and_zeroes_empty_rows():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4, 6)).astype("float32")
    mask = rng.random((3, 4, 6)) > 0.5
    mask[1, 2] = False
    out = keras.ops.convert_to_numpy(attention_ops.masked_softmax(x, mask))
    np.testing.assert_allclose(out, softmax(x, mask), atol=1e-6)
    assert np.all(out[1, 2] == 0.0)
    assert not np.isnan(out).any()


def test_masked_softmax_is_float32_inside_for_half_inputs():
    logits = np.array([[1e4, 1e4 - 1.0, -1e4]], "float16")
    out = attention_ops.masked_softmax(keras.ops.convert_to_tensor(logits))
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    out = keras.ops.convert_to_numpy(out).astype("float32")
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, softmax(logits.astype("float32")), atol=1e-3)


def test_masked_softmax_in_the_input_dtype_matches_float32():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 5)).astype("float32")
    mask = rng.random((2, 3, 5)) > 0.4
    mask[0, 1] = False
    low = keras.ops.convert_to_tensor(x, "bfloat16")
    out = attention_ops.masked_softmax(low, mask, float32=False)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    out = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
    np.testing.assert_allclose(out, softmax(x, mask), atol=1e-2)
    assert np.all(out[0, 1] == 0.0)


@pytest.mark.parametrize("float32", [True, False])
def test_masked_softmax_over_one_key_is_one_without_a_warning(float32):
    x = np.array([[[0.5]], [[-3.0]], [[np.nan]]], "float32")  # (3, 1, 1)
    mask = np.array([[[True]], [[False]], [[True]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras's "did you mean a sigmoid?"
        plain = attention_ops.masked_softmax(x, float32=float32)
        masked = attention_ops.masked_softmax(x, mask, float32=float32)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(plain), [[[1.0]], [[1.0]], [[np.nan]]])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(masked), [[[1.0]], [[0.0]], [[np.nan]]])


@pytest.mark.parametrize("name", ["multi_head", "scaled_dot_product", "additive"])
def test_one_key_attends_fully_without_a_warning(name):
    import keras_attention

    arguments = {"multi_head": dict(num_heads=2, key_dim=4),
                 "additive": dict(units=4)}.get(name, {})
    layer = keras_attention.get(name, **arguments)
    query = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    value = np.random.default_rng(1).normal(size=(2, 1, 8)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, weights = layer(query, value, return_attention_scores=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), 1.0)


def test_segment_softmax_sums_to_one_per_segment():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(10, 3)).astype("float32")
    segments = np.array([0, 0, 1, 1, 1, 3, 3, 3, 3, 0])
    out = keras.ops.convert_to_numpy(
        attention_ops.segment_softmax(scores, segments, num_segments=5)
    )
    for seg in (0, 1, 3):
        rows = segments == seg
        np.testing.assert_allclose(out[rows], softmax(scores[rows].T).T, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
def test_dense_attention_matches_reference(causal, mask_kind):
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng)
    mask = None
    if mask_kind == "keys":
        mask = rng.random((2, 13)) > 0.3
        mask[1] = False  # a batch element with no key at all
    elif mask_kind == "full":
        mask = rng.random((2, 9, 13)) > 0.3
    bias = rng.normal(size=(1, 4, 9, 13)).astype("float32")
    out, w = attention_ops.dot_product_attention(
        q, k, v, attention_mask=mask, bias=bias, is_causal=causal,
        return_weights=True, implementation="dense",
    )
    ref_out, ref_w = attention_reference(q, k, v, mask, causal, bias)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(w), ref_w, atol=2e-6)


def _cos_loss(out):
    return out, keras.ops.sum(out * keras.ops.cos(out))


@pytest.mark.parametrize("block_size", [4, 13, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
def test_blocked_equals_dense_forward_and_gradient(block_size, causal, mask_kind):
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng)
    mask = None
    if mask_kind == "keys":
        mask = rng.random((2, 13)) > 0.3
        mask[1] = False
    elif mask_kind == "full":
        mask = rng.random((2, 1, 9, 13)) > 0.5
    results = {
        impl: values_and_grads(
            lambda q, k, v: _cos_loss(attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, is_causal=causal,
                implementation=impl, block_size=block_size,
            )),
            q, k, v,
        )
        for impl in ("dense", "blocked")
    }
    for dense, blocked in zip(results["dense"], results["blocked"]):
        np.testing.assert_allclose(blocked, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys", "full", "late_keys"])
def test_fused_equals_dense_forward_and_gradient(causal, mask_kind):
    # The GPU fast path (keras.ops.dot_product_attention) keeps the core's
    # semantics: grouped heads, T != S, and zeros for queries that see no key.
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, dv=8)
    mask = None
    if mask_kind == "keys":
        mask = rng.random((2, 13)) > 0.3
        mask[1] = False  # every query of example 1 sees nothing
    elif mask_kind == "full":
        mask = rng.random((2, 1, 9, 13)) > 0.5
        mask[0, 0, 3] = False
    elif mask_kind == "late_keys":
        # Only keys 4.. are real: under the causal mask queries 0-3 see none.
        mask = np.arange(13)[None, :].repeat(2, 0) >= 4
    results = {
        impl: values_and_grads(
            lambda q, k, v: _cos_loss(attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, is_causal=causal,
                implementation=impl,
            )),
            q, k, v,
        )
        for impl in ("dense", "fused")
    }
    ref, _ = attention_reference(q, k, v, mask=mask, causal=causal)
    np.testing.assert_allclose(results["fused"][0], ref, atol=1e-5)
    for dense, fused in zip(results["dense"], results["fused"]):
        np.testing.assert_allclose(fused, dense, atol=1e-5)


def test_fused_takes_one_key_value_head():
    # keras's TensorFlow kernel shares grouped heads only from two of them.
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, k=1, dv=8)
    mask = rng.random((2, 13)) > 0.3
    out = [
        keras.ops.convert_to_numpy(attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask, implementation=impl,
        ))
        for impl in ("dense", "fused")
    ]
    np.testing.assert_allclose(out[1], out[0], atol=1e-5)


def test_auto_takes_the_fused_kernel_only_where_a_gpu_offers_one(monkeypatch):
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng, dv=8)
    calls = count_calls(monkeypatch, "fused_attention")
    attention_ops.dot_product_attention(q, k, v)
    # TensorFlow (and JAX) on a CPU: no fused kernel; torch: SDPA's CPU one.
    assert bool(calls) == (keras.backend.backend() == "torch")
    calls.clear()
    monkeypatch.setattr(attention_ops.dispatch, "_fused_kernel_available", lambda: True)
    out = attention_ops.dot_product_attention(q, k, v)
    assert calls
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out), attention_reference(q, k, v)[0], atol=1e-5
    )
    # Weights, a bias or dropout need the dense path.
    calls.clear()
    attention_ops.dot_product_attention(q, k, v, return_weights=True)
    assert not calls
    with pytest.raises(ValueError, match="fused implementation returns no weights"):
        attention_ops.dot_product_attention(
            q, k, v, implementation="fused", return_weights=True
        )
    # Values of another head size than the queries': not for the kernels.
    q, k, v = random_qkv(rng, dv=5)
    attention_ops.dot_product_attention(q, k, v)
    assert not calls
    with pytest.raises(ValueError, match="head size"):
        attention_ops.dot_product_attention(q, k, v, implementation="fused")


def _xla_compiled(fn):
    """`fn` compiled with XLA: `tf.function(jit_compile=True)` or
    `jax.jit`."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


@pytest.mark.skipif(
    keras.backend.backend() not in ("tensorflow", "jax"),
    reason="XLA compilation exists on TensorFlow and JAX only (torch has no "
    "XLA compile), and torch's auto dispatch takes its fused SDPA kernel, "
    "not the blocked path, for long sequences",
)
def test_blocked_path_compiles_with_xla_and_is_chosen_for_long_sequences(monkeypatch):
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, t=40, s=40, h=2, k=2, d=4, dv=4)
    calls = count_calls(monkeypatch, "blocked_heads")
    monkeypatch.setattr(attention_ops.dispatch, "DENSE_THRESHOLD", 1000)
    # The fixed rule (a measured choice may take the dense path:
    # tests/test_autotune.py).
    monkeypatch.setitem(attention_ops.autotune._OPTIONS, "enabled", False)
    attention_ops.clear_dispatch_choices()
    compiled = _xla_compiled(
        lambda q, k, v: attention_ops.dot_product_attention(q, k, v, is_causal=True)
    )
    out = compiled(q, k, v)
    assert calls, "the blocked path was not used for a long sequence"
    ref, _ = attention_reference(q, k, v, causal=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), ref, atol=1e-5)
    # Asking for the weights takes the dense path.
    calls.clear()
    attention_ops.dot_product_attention(q, k, v, return_weights=True)
    assert not calls


def test_gradient_agrees_with_finite_differences():
    rng = np.random.default_rng(5)
    inputs = random_qkv(rng, b=1, t=3, s=4, h=2, k=1, d=3, dv=2)
    mask = np.array([[True, True, False, True]])
    delta = 1e-2

    def attend(q, k, v, impl):
        mask_ = np.repeat(mask, q.shape[0], axis=0)
        return attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask_, implementation=impl, block_size=3
        )

    for impl in ("dense", "blocked"):
        theoretical = values_and_grads(
            lambda q, k, v: ((), keras.ops.sum(keras.ops.sin(attend(q, k, v, impl)))),
            *inputs,
        )
        # Central differences in one batch: per element j of input i, an
        # example that adds `delta` to it and one that subtracts it.
        sizes = [x.size for x in inputs]
        batch = [np.repeat(x, 2 * sum(sizes), axis=0) for x in inputs]
        row = 0
        for i, n in enumerate(sizes):
            flat = batch[i].reshape(len(batch[i]), n)
            for j in range(n):
                flat[row + 2 * j, j] += delta
                flat[row + 2 * j + 1, j] -= delta
            row += 2 * n
        out = keras.ops.convert_to_numpy(attend(*batch, impl)).astype("float64")
        f = np.sin(out).reshape(len(out), -1).sum(-1)
        numerical = (f[0::2] - f[1::2]) / (2 * delta)
        for i, x in enumerate(inputs):
            start = sum(sizes[:i])
            np.testing.assert_allclose(
                theoretical[i],
                numerical[start:start + sizes[i]].reshape(x.shape),
                atol=5e-3,
            )


def test_dropout_is_applied_in_training_only_and_weights_come_before_it():
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng)
    out_train, w_train = attention_ops.dot_product_attention(
        q, k, v, dropout_rate=0.5, seed=1, training=True, return_weights=True
    )
    out_eval, w_eval = attention_ops.dot_product_attention(
        q, k, v, dropout_rate=0.5, seed=1, training=False, return_weights=True
    )
    w_train = keras.ops.convert_to_numpy(w_train)
    w_eval = keras.ops.convert_to_numpy(w_eval)
    # The weights are returned before dropout, as keras's layer returns them.
    np.testing.assert_allclose(w_train, w_eval, atol=1e-6)
    np.testing.assert_allclose(w_train.sum(-1), 1.0, atol=1e-5)
    # The output is the dropped weights times the values: the dropped
    # weights are zero or w / (1 - rate).
    out_train = keras.ops.convert_to_numpy(out_train)
    out_eval = keras.ops.convert_to_numpy(out_eval)
    assert not np.allclose(out_train, out_eval, atol=1e-3)
    keep = attention_ops.hash_dropout(np.ones(w_eval.shape, "float32"), 0.5, 1)
    dropped = w_eval * keras.ops.convert_to_numpy(keep)
    # (B, H, T, S) x (B, S, H, D) -> (B, T, H, D)
    v = np.repeat(v, q.shape[2] // v.shape[2], axis=2)  # grouped heads
    expected = np.einsum("bhts,bshd->bthd", dropped, v)
    np.testing.assert_allclose(out_train, expected, atol=1e-5)


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((2, 3, 4), (2, 5, 4, 8), (2, 5, 4, 8)), "query"),
        (((2, 3, 4, 8), (2, 5, 3, 8), (2, 5, 3, 8)), "multiple"),
        (((2, 3, 4, 8), (2, 5, 4, 6), (2, 5, 4, 8)), "head size"),
    ],
)
def test_bad_shapes_raise_value_error(shapes, message):
    q, k, v = (np.zeros(s, "float32") for s in shapes)
    with pytest.raises(ValueError, match=message):
        attention_ops.dot_product_attention(q, k, v)


def test_bad_implementation_and_blocked_with_weights():
    q, k, v = random_qkv(np.random.default_rng(7))
    with pytest.raises(ValueError, match="implementation"):
        attention_ops.dot_product_attention(q, k, v, implementation="flash")
    for implementation in ("blocked", "chunked"):
        with pytest.raises(ValueError, match="return_weights"):
            attention_ops.dot_product_attention(
                q, k, v, implementation=implementation, return_weights=True
            )


@pytest.mark.parametrize("implementation", ["dense", "blocked", "chunked"])
@pytest.mark.parametrize(
    "mask_shape",
    [(2, 3, 4, 5), (2, 4, 4), (3, 5), (2, 6), (2, 1, 4, 6)],
    ids=["heads", "keys_as_queries", "batch", "keys", "keys_rank4"],
)
def test_a_mask_that_does_not_broadcast_is_named(implementation, mask_shape):
    # (B, T, H, D) = (2, 4, 1, 8) against S = 5 keys: each mask used to
    # give a deep TensorFlow error, a wrong output shape (the head axis)
    # or, blocked with one key too many, no error at all.
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 4, 1, 8)).astype("float32")
    k = rng.normal(size=(2, 5, 1, 8)).astype("float32")
    mask = np.ones(mask_shape, bool)
    with pytest.raises(ValueError, match="attention_mask") as info:
        attention_ops.dot_product_attention(
            q, k, k, attention_mask=mask, implementation=implementation
        )
    assert f"attention_mask.shape={mask_shape}" in str(info.value)
    for good in [(2, 5), (1, 5), (2, 4, 5), (2, 1, 1, 5), (1, 1, 4, 5)]:
        attention_ops.dot_product_attention(
            q, k, k, attention_mask=np.ones(good, bool),
            implementation=implementation,
        )


def test_the_fused_path_accumulates_float16_scores_in_float32():
    # keras's TensorFlow kernel computed float16 scores in float16: large
    # logits overflowed to NaN there, where every other path and backend
    # keeps float32 scores.
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((1, 6, 2, 4)) * 150 for _ in range(2))
    v = rng.standard_normal((1, 6, 2, 4))
    reference = keras.ops.convert_to_numpy(
        attention_ops.dot_product_attention(
            *(keras.ops.cast(x, "float32") for x in (q, k, v)), implementation="dense"
        )
    )
    half = [keras.ops.cast(x, "float16") for x in (q, k, v)]
    out = attention_ops.dot_product_attention(*half, implementation="fused")
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")), reference, atol=5e-3
    )
