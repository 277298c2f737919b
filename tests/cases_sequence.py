"""Harness cases and NumPy references for the three sequence layers."""

import keras
import numpy as np

from tests.harness import LayerCase
from tests.harness import ScoreContract


def softmax(x, mask=None):
    x = np.asarray(x, "float64")
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0.0)


def seq(rng, b=2, t=5, d=8):
    return rng.normal(size=(b, t, d)).astype("float32")


def cross(rng):
    return [seq(rng, t=4, d=6), seq(rng, t=7, d=10)]


def padding_mask(rng, b=2, t=5):
    m = rng.random((b, t)) > 0.4
    m[:, 0] = True
    return m


def np_(variable):
    return np.asarray(keras.ops.convert_to_numpy(variable))


def mha_reference(layer, inputs):
    wq, bq, wk, bk, wv, bv, wo, bo = layer.get_weights()
    x = inputs
    q = np.einsum("btm,mhd->bthd", x, wq) + bq
    k = np.einsum("bsm,mhd->bshd", x, wk) + bk
    v = np.einsum("bsm,mhd->bshd", x, wv) + bv
    heads = q.shape[2]
    rep = heads // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    t = x.shape[1]
    causal = np.tril(np.ones((t, t), bool)) if layer.use_causal_mask else None
    w = softmax(scores, causal)
    out = np.einsum("bhts,bshd->bthd", w, v)
    return np.einsum("bthd,hdo->bto", out, wo) + bo


def additive_reference(layer, inputs):
    query, value = inputs
    w1, w2 = np_(layer.query_kernel), np_(layer.key_kernel)
    b, v = np_(layer.bias), np_(layer.score_kernel)
    hidden = (query @ w1)[:, :, None, :] + (value @ w2)[:, None, :, :] + b
    scores = np.tanh(hidden) @ v
    return softmax(scores) @ value


def sdpa_reference(layer, inputs):
    x = inputs
    scores = x @ np.swapaxes(x, 1, 2) / np.sqrt(x.shape[-1])
    return softmax(scores) @ x


def luong_general_reference(layer, inputs):
    query, value = inputs
    (w,) = layer.get_weights()
    return softmax(query @ w @ np.swapaxes(value, 1, 2)) @ value


def no_key_for_query_1(rank=3):
    """An attention mask `(B, T, S)` that hides every key from query 1 of
    the first sample; the weights' index of that query."""

    def make(rng, inputs):
        query = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        value = inputs[1] if isinstance(inputs, (list, tuple)) else inputs
        mask = np.ones((query.shape[0], query.shape[1], value.shape[1]), bool)
        mask[0, 1] = False
        index = (0, slice(None), 1) if rank == 4 else (0, 1)
        return {"attention_mask": mask}, index

    return make


def sequence_scores(heads=None):
    def shapes(inputs):
        query = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        value = inputs[1] if isinstance(inputs, (list, tuple)) else inputs
        b, t, s = query.shape[0], query.shape[1], value.shape[1]
        return [(b, t, s) if heads is None else (b, heads, t, s)]

    return shapes


CASES = {
    "multi_head": LayerCase(
        kwargs=dict(num_heads=4, key_dim=4, num_key_value_heads=2, use_causal_mask=True),
        make_inputs=seq,
        reference=mha_reference,
        mask=padding_mask,
        scores=ScoreContract(
            shapes=sequence_scores(heads=4),  # keras's (B, H, T, S)
            dropout={"dropout": 0.5, "seed": 1},
            no_key=no_key_for_query_1(rank=4),
        ),
    ),
    "additive": LayerCase(
        kwargs=dict(units=6),
        make_inputs=cross,
        reference=additive_reference,
        mask=lambda rng: padding_mask(rng, t=4),
        scores=ScoreContract(
            shapes=sequence_scores(),  # keras's AdditiveAttention: (B, T, S)
            dropout={"dropout": 0.5, "seed": 1},
            no_key=no_key_for_query_1(),
        ),
    ),
    "scaled_dot_product": LayerCase(
        kwargs=dict(),
        make_inputs=seq,
        reference=sdpa_reference,
        mask=padding_mask,
        trainable=False,
        scores=ScoreContract(
            shapes=sequence_scores(),  # keras's Attention: (B, T, S)
            dropout={"dropout": 0.5, "seed": 1},
            no_key=no_key_for_query_1(),
        ),
    ),
}

# Luong's "general" score, checked by tests/test_sequence_layers.py.
LUONG_GENERAL = LayerCase(
    kwargs=dict(score_mode="general"),
    make_inputs=cross,
    reference=luong_general_reference,
)
