"""Harness case and NumPy reference for LocalWindowAttention (Swin)."""

import numpy as np

from tests.harness import LayerCase
from tests.harness import ScoreContract


def swin_reference(
    x,
    table,
    qkv_kernel,
    qkv_bias,
    out_kernel,
    out_bias,
    num_heads,
    window_size,
    shift_size,
):
    """Swin's shifted-window attention in float64, from the paper.

    Pad bottom/right to window multiples, roll by `-shift`, label the rolled
    grid with Swin's three row and column slices, attend inside each window
    with the relative position bias `B[(dy + W - 1) * (2W - 1) + dx + W - 1]`
    and a mask that drops keys of another label or of padding, project,
    roll back, crop.

    Returns:
        The output `(B, height, width, C)` and the weights
        `(B, num_windows, heads, w**2, w**2)`.
    """
    x = np.asarray(x, "float64")
    b, height, width, _ = x.shape
    win, shift = window_size, shift_size
    if min(height, width) <= win:  # Swin: one window across, no shift
        win, shift = min(height, width), 0
    hp, wp = -(-height // win) * win, -(-width // win) * win
    padded = np.zeros((b, hp, wp, x.shape[-1]))
    padded[:, :height, :width] = x
    real = np.zeros((hp, wp), bool)
    real[:height, :width] = True
    # Swin's image mask: regions of the rolled grid, numbered 0..8.
    labels = np.zeros((hp, wp), int)
    slices = (
        (slice(0, -win), slice(-win, -shift), slice(-shift, None))
        if shift
        else (slice(None),)
    )
    count = 0
    for rows in slices:
        for cols in slices:
            labels[rows, cols] = count
            count += 1
    rolled = np.roll(padded, (-shift, -shift), axis=(1, 2))
    real = np.roll(real, (-shift, -shift), axis=(0, 1))

    heads = num_heads
    d = qkv_kernel.shape[-1] // (3 * heads)
    out = np.zeros((b, hp, wp, out_kernel.shape[-1]))
    all_weights = []
    ii, jj = np.meshgrid(np.arange(win), np.arange(win), indexing="ij")
    ii, jj = ii.reshape(-1), jj.reshape(-1)  # row-major tokens of a window
    dy = ii[:, None] - ii[None, :] + window_size - 1
    dx = jj[:, None] - jj[None, :] + window_size - 1
    bias = table[dy * (2 * window_size - 1) + dx]  # (T, T, heads)
    bias = np.transpose(bias, (2, 0, 1))
    for wr in range(hp // win):
        for wc in range(wp // win):
            rr, cc = wr * win + ii, wc * win + jj
            tokens = rolled[:, rr, cc]  # (B, T, C)
            lab = labels[rr, cc]
            allowed = (lab[:, None] == lab[None, :]) & real[rr, cc][None, :]
            qkv = tokens @ qkv_kernel + qkv_bias
            qkv = qkv.reshape(b, win * win, 3, heads, d)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d) + bias
            # A padded query may have no key left: its weights are zeros.
            scores = np.where(allowed, scores, -np.inf)
            row_max = scores.max(-1, keepdims=True)
            e = np.exp(scores - np.where(np.isfinite(row_max), row_max, 0.0))
            total = e.sum(-1, keepdims=True)
            weights = e / np.where(total > 0, total, 1.0)
            heads_out = np.einsum("bhts,bshd->bthd", weights, v)
            o = heads_out.reshape(b, win * win, heads * d) @ out_kernel + out_bias
            out[:, rr, cc] = o
            all_weights.append(weights)
    out = np.roll(out, (shift, shift), axis=(1, 2))[:, :height, :width]
    return out, np.stack(all_weights, axis=1)


def layer_weights(layer):
    """The layer's weights as NumPy arrays, zero biases when it has none."""
    qkv_k = np.asarray(layer.qkv.kernel.numpy())
    out_k = np.asarray(layer.output_dense.kernel.numpy())
    qkv_b = layer.qkv.bias.numpy() if layer.use_bias else np.zeros(qkv_k.shape[-1])
    out_b = (
        layer.output_dense.bias.numpy() if layer.use_bias else np.zeros(out_k.shape[-1])
    )
    return (
        np.asarray(layer.relative_position_bias_table.numpy(), "float64"),
        qkv_k.astype("float64"),
        np.asarray(qkv_b, "float64"),
        out_k.astype("float64"),
        np.asarray(out_b, "float64"),
    )


def local_window_reference(layer, inputs):
    out, _ = swin_reference(
        inputs,
        *layer_weights(layer),
        num_heads=layer.num_heads,
        window_size=layer.window_size,
        shift_size=layer.shift_size,
    )
    return out


def image(rng, b=2, height=6, width=7, channels=8):
    # 6 x 7 with 4 x 4 windows: padded to 8 x 8, shifted by 2.
    return rng.normal(size=(b, height, width, channels)).astype("float32")


CASES = {
    "local_window": LayerCase(
        kwargs=dict(
            num_heads=2,
            window_size=4,
            shift_size=2,
            bias_initializer="random_normal",
        ),
        make_inputs=image,
        reference=local_window_reference,
        # (B, nW, H, T, T): 2 x 2 windows of 4 x 4 tokens on the 8 x 8 padding.
        scores=ScoreContract(
            shapes=lambda x: [(x.shape[0], 4, 2, 16, 16)],
            dropout={"dropout": 0.5, "seed": 1},
        ),
    ),
}
