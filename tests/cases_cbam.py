"""Harness cases and NumPy references for CBAM and the non-local block.

The references follow the papers' equations literally (Woo et al. 2018,
eqs. 2-3; Wang et al. 2018, eqs. 1-6), with the layer's own weights.
"""

import itertools
import math

import numpy as np

from tests.harness import LayerCase
from tests.harness import ScoreContract


def value(variable):
    return None if variable is None else np.asarray(variable.numpy(), "float64")


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, mask=None):
    x = np.asarray(x, "float64")
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0.0)


def dense(x, kernel, bias):
    y = x @ kernel
    return y if bias is None else y + bias


# ---------------------------------------------------------------- CBAM


def channel_weights(layer, x, mask=None):
    """M_c(F) = sigmoid(MLP(AvgPool(F)) + MLP(MaxPool(F))), `(B, C)`."""
    x = np.asarray(x, "float64")
    axes = tuple(range(1, x.ndim - 1))
    if mask is None:
        avg, peak = x.mean(axis=axes), x.max(axis=axes)
    else:
        m = np.asarray(mask, bool)[..., None]
        avg = np.where(m, x, 0).sum(axis=axes) / np.maximum(m.sum(axis=axes), 1)
        peak = np.where(m, x, -np.inf).max(axis=axes)

    def mlp(d):
        hidden = np.maximum(dense(d, value(layer.hidden_kernel), value(layer.hidden_bias)), 0)
        return dense(hidden, value(layer.output_kernel), value(layer.output_bias))

    return sigmoid(mlp(avg) + mlp(peak))


def channel_reference(layer, x, mask=None):
    w = channel_weights(layer, x, mask)
    return np.asarray(x, "float64") * w.reshape(
        (w.shape[0],) + (1,) * (np.ndim(x) - 2) + (w.shape[1],)
    )


def conv_same(x, kernel):
    """N-d cross-correlation, stride 1, zero "same" padding: `(B, ..., Cin)`."""
    k = kernel.shape[:-2]
    pads = [(0, 0)] + [((s - 1) // 2, s // 2) for s in k] + [(0, 0)]
    padded = np.pad(x, pads)
    spatial = x.shape[1:-1]
    out = np.zeros(x.shape[:-1] + (kernel.shape[-1],))
    for offset in itertools.product(*[range(s) for s in k]):
        window = padded[(slice(None),) + tuple(
            slice(o, o + n) for o, n in zip(offset, spatial)
        )]
        out += window @ kernel[offset]
    return out


def spatial_map(layer, x, mask=None):
    """M_s(F) = sigmoid(conv([AvgPool_c(F); MaxPool_c(F)])), `(B, ..., 1)`."""
    x = np.asarray(x, "float64")
    pooled = np.concatenate([x.mean(-1, keepdims=True), x.max(-1, keepdims=True)], -1)
    if mask is not None:
        pooled = np.where(np.asarray(mask, bool)[..., None], pooled, 0.0)
    logits = conv_same(pooled, value(layer.kernel))
    if layer.bias is not None:
        logits = logits + value(layer.bias)
    return sigmoid(logits)


def spatial_reference(layer, x, mask=None):
    return np.asarray(x, "float64") * spatial_map(layer, x, mask)


def cbam_reference(layer, x, mask=None):
    refined = channel_reference(layer.channel_attention, x, mask)
    return spatial_reference(layer.spatial_attention, refined, mask)


# ---------------------------------------------------------------- non-local


def max_pool_same(x, size):
    """Max-pool `(B, ..., C)` with stride = size and TF "same" padding."""
    if size is None:
        return x
    pads = [(0, 0)]
    for n, p in zip(x.shape[1:-1], size):
        total = math.ceil(n / p) * p - n
        pads.append((total // 2, total - total // 2))
    pads.append((0, 0))
    padded = np.pad(x, pads, constant_values=-np.inf)
    shape = [padded.shape[0]]
    for n, p in zip(padded.shape[1:-1], size):
        shape += [n // p, p]
    shape.append(padded.shape[-1])
    blocks = padded.reshape(shape)
    return blocks.max(axis=tuple(range(2, 2 * len(size) + 1, 2)))


def non_local_reference(layer, x, mask=None, return_weights=False):
    """z = W_z y + x, y_i = 1/C(x) sum_j f(x_i, x_j) g(x_j) (eqs. 1 and 6)."""
    x = np.asarray(x, "float64")
    b, channels = x.shape[0], x.shape[-1]
    size = layer.pool_size(x.ndim - 2)

    def keys(t):  # sub-sample phi / g, masked positions never win
        if mask is not None:
            t = np.where(np.asarray(mask, bool)[..., None], t, -np.inf)
        t = max_pool_same(t, size)
        return t.reshape(b, -1, t.shape[-1])

    key_mask = None
    if mask is not None:
        m = np.asarray(mask, "float64")[..., None]
        key_mask = max_pool_same(m, size).reshape(b, -1) > 0.5

    g = keys(dense(x, value(layer.g_kernel), value(layer.g_bias)))
    if layer.mode == "gaussian":
        theta, phi = x.reshape(b, -1, channels), keys(x)
    else:
        theta = dense(x, value(layer.theta_kernel), value(layer.theta_bias))
        theta = theta.reshape(b, -1, theta.shape[-1])
        phi = keys(dense(x, value(layer.phi_kernel), value(layer.phi_bias)))
    if key_mask is not None:
        g = np.where(key_mask[..., None], g, 0.0)
        phi = np.where(key_mask[..., None], phi, 0.0)

    if layer.mode in ("gaussian", "embedded_gaussian"):
        # f = exp(theta_i . phi_j), C(x) = sum_j f: a softmax over j.
        weights = softmax(theta @ np.swapaxes(phi, 1, 2),
                          None if key_mask is None else key_mask[:, None, :])
    else:
        if layer.mode == "dot":
            f = theta @ np.swapaxes(phi, 1, 2)
        else:
            # ReLU(w_f^T [theta_i, phi_j]) on the explicit concatenation.
            t, s = theta.shape[1], phi.shape[1]
            pairs = np.concatenate(
                [np.broadcast_to(theta[:, :, None, :], (b, t, s, theta.shape[-1])),
                 np.broadcast_to(phi[:, None, :, :], (b, t, s, phi.shape[-1]))],
                axis=-1,
            )
            f = np.maximum(pairs @ value(layer.concat_kernel), 0.0)
        if key_mask is None:
            count = np.full((b, 1, 1), phi.shape[1], "float64")
        else:
            f = f * key_mask[:, None, :]
            count = np.maximum(key_mask.sum(-1), 1)[:, None, None]
        weights = f / count
    if mask is not None:  # a masked position attends to nothing
        weights = weights * np.asarray(mask, bool).reshape(b, -1, 1)
    y = (weights @ g).reshape(x.shape[:-1] + (g.shape[-1],))
    z = dense(y, value(layer.output_kernel), value(layer.output_bias))
    if layer.batch_norm is not None:  # inference: moving statistics
        bn = layer.batch_norm
        z = (z - value(bn.moving_mean)) / np.sqrt(value(bn.moving_variance) + bn.epsilon)
        z = z * value(bn.gamma) + value(bn.beta)
    out = x + z
    if return_weights:
        return out, weights[:, None]
    return out


# ---------------------------------------------------------------- cases


def normal(*shape):
    return lambda rng: rng.normal(size=shape).astype("float32")


def sequence_mask(rng, b=2, t=7):
    m = rng.random((b, t)) > 0.4
    m[:, 0] = True
    return m


def first_sample_masked(rng, x):
    """A Keras mask that hides every position of the first sample: its
    queries see no key; their weights are `weights[0]`."""
    mask = np.ones(x.shape[:-1], bool)
    mask[0] = False
    return {"mask": mask}, (0,)


CASES = {
    # A 1D sequence with padding: any rank works, masks keep pads out.
    "channel": LayerCase(
        kwargs={"reduction": 2},
        make_inputs=normal(2, 7, 8),
        reference=channel_reference,
        mask=sequence_mask,
        scores=ScoreContract(
            shapes=lambda x: [(x.shape[0], x.shape[-1])], kinds=("gate",)
        ),
    ),
    "spatial": LayerCase(
        kwargs={"kernel_size": 3},
        make_inputs=normal(2, 6, 5, 4),
        reference=spatial_reference,
        scores=ScoreContract(
            shapes=lambda x: [x.shape[:-1] + (1,)], kinds=("gate",)
        ),
    ),
    "cbam": LayerCase(
        kwargs={"reduction": 4, "kernel_size": 3},
        make_inputs=normal(2, 6, 5, 8),
        reference=cbam_reference,
        scores=ScoreContract(
            shapes=lambda x: [(x.shape[0], x.shape[-1]), x.shape[:-1] + (1,)],
            kinds=("gate", "gate"),
        ),
    ),
    # zero_init_residual=False, or the reference would only see the identity.
    "non_local": LayerCase(
        kwargs={
            "mode": "embedded_gaussian",
            "sub_sample": True,
            "use_batch_norm": True,
            "zero_init_residual": False,
        },
        make_inputs=normal(2, 5, 4, 6),
        reference=non_local_reference,
        # (B, 1, T, S): T = 5 * 4 positions, S = 3 * 2 pooled positions.
        scores=ScoreContract(
            shapes=lambda x: [(x.shape[0], 1, 20, 6)],
            no_key=first_sample_masked,
        ),
    ),
}
