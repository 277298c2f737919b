"""Mixed precision with huge attention logits, through the layers.

`mixed_float16` computes in float16, whose largest value is 65504: a naive
softmax of logits around 1e4 overflows (`exp(8192) = inf`, then `inf / inf`
is NaN). The layers take the softmax in float32 (`ops.masked_softmax`), so
their outputs stay finite and equal the float32 layer's.

The inputs are built so that every logit is exactly representable in both
dtypes (entries `+-64`, identity projections, logits in
`{0, +-4096, +-8192}`): the float16 and float32 layers then see the same
scores, ties included, and must agree up to float16 rounding of the
weighted sum of values (relative tolerance `RTOL`).

`mixed_bfloat16` against float32 is checked for every layer by the shared
harness (`tests/test_harness.py::test_mixed_precision`, tolerance
`LayerCase.low_precision_atol`, 5e-2 relative to the output's scale).
"""

import keras
import numpy as np
import pytest

from keras_attention.layers import MultiHeadAttention, ScaledDotProductAttention
from tests.harness import values_and_grads

MAGNITUDE = 64.0  # entries of the inputs
HEAD_DIM = 4
RTOL = 2e-3  # of the largest |output|: float16 rounds at 2**-11 ~ 4.9e-4


def signs(seed, shape):
    rng = np.random.default_rng(seed)
    return (rng.choice([-1.0, 1.0], size=shape) * MAGNITUDE).astype("float32")


def padding_mask(seed, batch, length):
    rng = np.random.default_rng(seed + 100)
    mask = rng.random((batch, length)) < 0.7
    mask[0] = False  # one fully masked element
    return mask


def identity_mha(dtype, num_heads=2, implementation="dense"):
    """Multi-head attention whose projections copy features to heads."""
    dim = num_heads * HEAD_DIM
    layer = MultiHeadAttention(
        num_heads=num_heads, key_dim=HEAD_DIM, dtype=dtype,
        implementation=implementation,
    )
    layer.build((None, None, dim))
    eye = np.eye(dim, dtype="float32")
    kernel = eye.reshape(dim, num_heads, HEAD_DIM)
    weights = []
    for w in layer.weights:
        if w.path.endswith("attention_output/kernel"):
            weights.append(eye.reshape(num_heads, HEAD_DIM, dim))
        elif "kernel" in w.path:
            weights.append(kernel)
        else:
            weights.append(np.zeros(w.shape, "float32"))
    layer.set_weights(weights)
    return layer


def logits_of(x, scale):
    # (B, T, H*D) -> per-head logits (B, H, T, T), as the layer computes them.
    b, t, _ = x.shape
    heads = x.reshape(b, t, -1, HEAD_DIM).transpose(0, 2, 1, 3)
    return (heads * scale) @ heads.transpose(0, 1, 3, 2)


def assert_matches(low, high):
    low = keras.ops.convert_to_numpy(low).astype("float32")
    high = keras.ops.convert_to_numpy(high)
    assert np.all(np.isfinite(low))
    tolerance = RTOL * max(1.0, float(np.abs(high).max()))
    error = float(np.abs(low - high).max())
    assert error <= tolerance, f"max abs error {error:.3g} > {tolerance:.3g}"


def test_the_inputs_overflow_a_naive_float16_softmax():
    x = signs(0, (2, 6, 2 * HEAD_DIM))
    logits = logits_of(x, 1.0 / np.sqrt(HEAD_DIM))
    assert np.abs(logits).max() == 8192.0
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(logits.astype("float16"))
        naive = e / e.sum(-1, keepdims=True)
    assert not np.all(np.isfinite(naive))


@pytest.mark.parametrize("implementation", ["dense", "blocked"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multi_head_float16_with_logits_of_1e4(seed, implementation):
    x = signs(seed, (3, 6, 2 * HEAD_DIM))
    mask = padding_mask(seed, 3, 6)
    causal = seed % 2 == 1
    outputs = {}
    for dtype in ("float32", "mixed_float16"):
        layer = identity_mha(dtype, implementation=implementation)
        outputs[dtype] = layer(x, value_mask=mask, use_causal_mask=causal)
    assert keras.backend.standardize_dtype(outputs["mixed_float16"].dtype) == "float16"
    assert_matches(outputs["mixed_float16"], outputs["float32"])
    # The fully masked element attends to nothing: zeros (no output bias).
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(outputs["mixed_float16"])[0], 0.0
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_scaled_dot_product_float16_with_logits_of_1e4(seed):
    query = signs(seed, (2, 5, HEAD_DIM))
    value = signs(seed + 10, (2, 7, HEAD_DIM))
    mask = padding_mask(seed, 2, 7)
    outputs, scores = {}, {}
    for dtype in ("float32", "mixed_float16"):
        layer = ScaledDotProductAttention(dtype=dtype)
        outputs[dtype], scores[dtype] = layer(
            [query, value], value_mask=mask, return_attention_scores=True
        )
    # logits q.k / 2 reach 8192 here
    assert np.abs(query @ value.transpose(0, 2, 1) / 2).max() == 8192.0
    assert_matches(outputs["mixed_float16"], outputs["float32"])
    assert_matches(scores["mixed_float16"], scores["float32"])


def test_multi_head_float16_gradients_are_finite_with_logits_of_1e4():
    x = signs(3, (2, 6, 2 * HEAD_DIM))
    layer = identity_mha("mixed_float16")

    def fn(x):
        out = layer(x, use_causal_mask=True)
        return out, keras.ops.sum(keras.ops.cast(out, "float32")) * 1e-3

    out, *grads = values_and_grads(fn, x, variables=layer.trainable_variables)
    assert out.dtype == np.float16
    assert len(grads) == 1 + len(layer.trainable_variables)
    for g in grads:
        assert np.all(np.isfinite(g))


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("implementation", ["dense", "blocked", "auto"])
def test_float16_logits_beyond_its_range(implementation, weights):
    # Entries +-256: logits up to 131,072, past float16's 65,504. The
    # scores' product of both dense paths (with its own gradient, and
    # autodiff's when the weights are returned) runs in float32, as the
    # blocked path's does: before, the dense paths' scores were infinite
    # and every output NaN.
    x = signs(4, (2, 6, 2 * HEAD_DIM)) * 4
    assert np.abs(logits_of(x, HEAD_DIM ** -0.5)).max() > 65504
    if weights and implementation == "blocked":
        pytest.skip("the blocked path returns no weights")
    results = {}
    for dtype in ("float32", "mixed_float16"):
        layer = identity_mha(dtype, implementation=implementation)
        results[dtype] = layer(
            x, use_causal_mask=True, return_attention_scores=weights
        )
    if weights:
        assert_matches(results["mixed_float16"][1], results["float32"][1])
        results = {k: v[0] for k, v in results.items()}
    assert_matches(results["mixed_float16"], results["float32"])


def float64_attention_grads(q, k, v, scale, d_out):
    """Output and `(dq, dk, dv)` of one head `(T, D)` in float64."""
    q, k, v, d_out = (np.asarray(x, "float64") for x in (q, k, v, d_out))
    s = q @ k.T * scale
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d_p = d_out @ v.T
    d_s = p * (d_p - (d_p * p).sum(1, keepdims=True))
    return p @ v, d_s @ k * scale, d_s.T @ q * scale, p.T @ d_out


@pytest.mark.parametrize("implementation", ["dense", "auto", "blocked", "chunked"])
@pytest.mark.parametrize("case", ["large values", "scale above one"])
def test_float16_attention_with_large_values_equals_float64(implementation, case):
    # float16's range ends at 65,504. Values near 2e4 made the dense
    # backward's `dO V^T` and `delta` infinite (NaN gradients), and a
    # `scale` of 100 made `q * scale` infinite (NaN outputs), where the
    # blocked and chunked paths (float32 inside) were right.
    from keras_attention.ops import dot_product_attention

    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((1, 3, 1, 4)).astype("float16") for _ in range(2))
    v = (2e4 + rng.standard_normal((1, 3, 1, 4)) * 5e3).astype("float16")
    scale = 0.5
    if case == "scale above one":
        q, v, scale = (q * 7).astype("float16"), (v / 2e4).astype("float16"), 100.0

    def fn(q, k, v):
        out = dot_product_attention(q, k, v, scale=scale, implementation=implementation)
        return out, keras.ops.sum(keras.ops.cast(out, "float32"))

    got = values_and_grads(fn, q, k, v)
    want = float64_attention_grads(q[0, :, 0], k[0, :, 0], v[0, :, 0], scale, np.ones((3, 4)))
    for g, w, name in zip(got, want, ["out", "d_q", "d_k", "d_v"]):
        g = np.asarray(g, "float64")[0, :, 0]
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, w, atol=4e-3 * np.abs(w).max() + 1e-3, err_msg=name)


@pytest.mark.parametrize("implementation", ["dense", "blocked", "chunked"])
def test_tied_keys_at_huge_logits_share_the_gradient_equally(implementation):
    # Three identical keys: weights 1/3 each, whatever the logits. The
    # blocked backward rebuilt the weights from one float32 log-sum-exp
    # `max + log(sum)`, which at logits of 2e6 lost `log(sum)` to rounding:
    # `dV` 5 % off at 2e6, three times too large at 1.8e7.
    from keras_attention.ops import dot_product_attention

    for c in (1e2, 1e3, 3e3):  # logits 0.5 * 4 * c**2, up to 1.8e7
        q = np.full((1, 1, 1, 4), c, "float32")
        k = np.full((1, 3, 1, 4), c, "float32")
        v = np.arange(1.0, 4.0, dtype="float32").reshape(1, 3, 1, 1) * np.ones((1, 1, 1, 4), "float32")

        def fn(v):
            out = dot_product_attention(q, k, v, implementation=implementation)
            return out, keras.ops.sum(out)

        out, d_v = values_and_grads(fn, v)
        np.testing.assert_allclose(out, 2.0, rtol=1e-6)
        np.testing.assert_allclose(d_v, 1 / 3, rtol=1e-6)
