"""Swin window attention: shifted windows with a relative position bias."""

import math

import keras
from keras import ops

from keras_attention._validation import check_channels_last
from keras_attention._validation import check_positive_int
from keras_attention._validation import check_rate
from keras_attention._validation import invalid
from keras_attention._validation import known_dim
from keras_attention._validation import traced_by_torch
from keras_attention.layers import base
from keras_attention.ops.shapes import pad
from keras_attention.registry import register


def _static_size(dim):
    """A height, width or channel count as an int, or `None` if unknown.

    `torch.jit.trace` (keras's ONNX export on torch) gives every size as a
    0-d tensor; these three are static in the export's signature (the
    windows are built for them), so their traced value is taken. JAX's
    symbolic sizes stay unknown, as do `torch.export`'s (a `SymInt`, no
    `shape`)."""
    if traced_by_torch(dim) and not getattr(dim, "shape", True):
        return int(dim)
    return known_dim(dim)


def cyclic_shift(x, shift):
    """`roll` of a `(B, H, W, C)` image by a static `shift` on both axes.

    Written with slices and concatenation so that exported models need no
    `Roll` op (LiteRT has no builtin one).
    """
    for axis in (1, 2):
        size = x.shape[axis]
        k = shift % size
        if k:
            head, tail = [slice(None)] * 4, [slice(None)] * 4
            head[axis], tail[axis] = slice(size - k, None), slice(None, size - k)
            x = ops.concatenate([x[tuple(head)], x[tuple(tail)]], axis=axis)
    return x


def window_geometry(height, width, window_size, shift_size):
    """The window, shift and padded size used on a `height x width` image.

    As in Swin, an image no larger than the window in its smaller side is one
    window row/column: the window shrinks to `min(height, width)` and the
    shift to 0.

    Returns:
        `(window, shift, padded_height, padded_width)`.
    """
    window, shift = window_size, shift_size
    if min(height, width) <= window:
        window, shift = min(height, width), 0
    padded_height = -(-height // window) * window
    padded_width = -(-width // window) * window
    return window, shift, padded_height, padded_width


def partition_windows(x, window):
    """`(B, Hp, Wp, ...)` -> `(B * num_windows, window**2, ...)`, row-major."""
    _, hp, wp = x.shape[:3]
    rest = tuple(x.shape[3:])
    x = ops.reshape(x, (-1, hp // window, window, wp // window, window) + rest)
    perm = (0, 1, 3, 2, 4) + tuple(range(5, 5 + len(rest)))
    x = ops.transpose(x, perm)
    return ops.reshape(x, (-1, window * window) + rest)


def merge_windows(x, window, hp, wp):
    """`(B * nW, w**2, C)` -> `(B, Hp, Wp, C)`, undoing `partition_windows`."""
    channels = x.shape[-1]
    x = ops.reshape(
        x, (-1, hp // window, wp // window, window, window, channels)
    )
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
    return ops.reshape(x, (-1, hp, wp, channels))


def relative_position_index(window, table_window):
    """`(w**2, w**2)` int32 indices into a `((2 W - 1)**2, H)` bias table.

    Entry `(i, j)` is the row of the table for the offset of token `i` from
    token `j` within a `window x window` window; `table_window` (`W >=
    window`) is the window the table was made for, so a shrunk window reads
    the table's central part. Built from `keras.ops` (as the mask below),
    so that compilers fold it into one graph (`torch.compile` cannot trace
    NumPy arrays).
    """
    token = ops.arange(window * window, dtype="int32")
    row, col = token // window, token % window  # row-major in the window
    d_row = row[:, None] - row[None, :] + (table_window - 1)
    d_col = col[:, None] - col[None, :] + (table_window - 1)
    return d_row * (2 * table_window - 1) + d_col


def shifted_window_mask(height, width, window, shift):
    """Boolean `(num_windows, w**2, w**2)`, `True` where a query sees a key.

    After padding to `(Hp, Wp)` and rolling by `-shift`, a window may hold
    tokens that were far apart before the roll: those in the last `shift`
    rows (or columns) wrapped around from the top (left). A query sees a key
    only if both wrapped alike along each axis, and the key is a real token
    (not padding). Returns `None` when nothing is masked.
    """
    hp = -(-height // window) * window
    wp = -(-width // window) * window
    if shift == 0 and (hp, wp) == (height, width):
        return None
    rows, cols = ops.arange(hp, dtype="int32"), ops.arange(wp, dtype="int32")
    # Which part of the rolled grid each position came from (wrapped or
    # not, per axis), and whether it was a real token before the roll.
    region = (ops.cast(rows >= hp - shift, "int32")[:, None] * 2
              + ops.cast(cols >= wp - shift, "int32")[None, :])  # (Hp, Wp)
    real = ops.logical_and(
        ((rows + shift) % hp < height)[:, None],
        ((cols + shift) % wp < width)[None, :],
    )

    def windows(grid):  # (Hp, Wp) -> (nW, w**2)
        grid = ops.reshape(grid, (hp // window, window, wp // window, window))
        return ops.reshape(ops.transpose(grid, (0, 2, 1, 3)),
                           (-1, window * window))

    region, real = windows(region), windows(real)
    return ops.logical_and(
        ops.equal(region[:, :, None], region[:, None, :]), real[:, None, :]
    )


@register("local_window", input_kind="grid")
class LocalWindowAttention(
    base.ProjectionMixin, base.TracedOutputSpec, keras.layers.Layer
):
    """Window attention with shifted windows (Liu et al., 2021, Swin).

    The image `(B, height, width, C)` is split into non-overlapping
    `window_size x window_size` windows and multi-head self-attention runs
    inside each window, with a learned relative position bias:
    `softmax(Q K^T / sqrt(D) + bias[relative_position_index]) V`, where the
    bias table holds one value per head for each of the `(2 w - 1)**2`
    relative offsets. With `shift_size > 0` the image is first rolled
    cyclically by `-shift_size` along both axes (and rolled back after), so
    the windows straddle the previous layer's window borders; a mask keeps
    tokens that the roll brought together from opposite image borders from
    attending to each other.

    Any height and width work: the image is padded at the bottom and right to
    multiples of the window (before the roll), padded tokens are masked out
    as keys (so they never change a real token's output) and the output is
    cropped back. Swin's and timm's code pad too but attend to the zero
    padding (timm after the roll), so on sizes that are not multiples of
    the window their weights give other outputs here (the converter refuses
    such sizes). Keras masks on the map are not read (Keras warns that the
    layer drops them): the windows cover every position. As
    in Swin, when `min(height, width) <= window_size` the window shrinks to
    `min(height, width)` and the shift to 0; the bias table keeps its
    `window_size` size and the shrunk window reads its central part. Height
    and width must be known when the layer is called (the windows and masks
    are static), the batch size need not be. (A functional model on
    `keras.Input((None, None, C))` is refused on TensorFlow and JAX; Keras's
    torch backend builds it with sizes it makes up and runs it eagerly on
    each image's own size.)

    Shape letters: `B` batch, `H` heads, `D` head size, `w` window,
    `nW` windows per image, `T = w**2` tokens per window.

    The projections are keras `Dense` sublayers (`qkv`, `output_dense`):
    `enable_lora(rank)` and `model.quantize("int8")` work on them.

    Args:
        num_heads: number of heads `H`.
        window_size: window side `w`, a positive integer.
        shift_size: cyclic shift, an integer with
            `0 <= shift_size < window_size` (Swin alternates 0 and
            `window_size // 2` between blocks).
        key_dim: head size `D` of queries, keys and values; defaults to
            `C // num_heads` (then `C` must divide evenly).
        dropout: dropout rate on the attention weights.
        use_bias: whether the query/key/value and output projections have
            biases.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer: for the projections, as in `keras.layers.Dense`.
        seed: seed of the dropout.

    Call arguments:
        inputs: `(B, height, width, C)`, channels last.
        return_attention_scores: also return the attention weights.
        training: whether dropout is active.

    Returns:
        `(B, height, width, C)`, and if `return_attention_scores=True` the
        weights `(B, nW, H, T, T)` of each window of the padded, rolled image
        (windows row-major, tokens row-major inside a window; masked
        entries are exactly 0).

    Raises:
        ValueError: naming the argument: `num_heads`, `window_size` or
            `key_dim` not positive integers, `shift_size` outside `[0,
            window_size)`, `dropout` outside `[0, 1)`; inputs that are not
            channels-last maps with a known height and width, or whose
            channels `num_heads` does not divide (without `key_dim`).

    Example:

    ```python
    layer = LocalWindowAttention(num_heads=3, window_size=7, shift_size=3)
    x = np.random.rand(2, 30, 20, 96).astype("float32")
    y, scores = layer(x, return_attention_scores=True)
    y.shape  # (2, 30, 20, 96)
    scores.shape  # (2, 15, 3, 49, 49): 5 x 3 windows of the 35 x 21 padding
    ```

    References:
        - Liu et al., Swin Transformer: Hierarchical Vision Transformer
          using Shifted Windows, 2021. https://arxiv.org/abs/2103.14030
    """

    # Its query, key and value are one fused projection (timm's `qkv`).
    lora_targets = ("qkv",)

    def __init__(
        self,
        num_heads,
        window_size=7,
        shift_size=0,
        key_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.window_size = check_positive_int("window_size", window_size)
        if (
            isinstance(shift_size, bool)
            or not isinstance(shift_size, int)
            or not 0 <= shift_size < window_size
        ):
            raise invalid(
                "shift_size",
                f"an integer in [0, window_size) with window_size="
                f"{window_size}",
                shift_size,
            )
        self.shift_size = shift_size
        self.key_dim = check_positive_int("key_dim", key_dim, allow_none=True)
        self.dropout = check_rate("dropout", dropout)
        base.keep_weight_arguments(self, locals())

    def _check_shape(self, shape, need_spatial):
        shape = check_channels_last("inputs", shape)
        shape = shape[:1] + tuple(_static_size(d) for d in shape[1:])
        if need_spatial and None in shape[1:3]:
            raise ValueError(
                "Received an invalid value for argument `inputs`, expected a "
                "known height and width when traced (the windows and masks "
                "are static). A `tf.function` or export signature with "
                "`None` there, or `model.predict`/`fit` retracing for a "
                "second image size (Keras relaxes the size to `None`), "
                "gives an unknown one: resize the images to one size, keep "
                "one model call per size in a `tf.function` without "
                "`reduce_retracing`, or run eagerly "
                f"(`run_eagerly=True`). Received: inputs.shape={shape}"
            )
        channels = shape[-1]
        built = getattr(self, "_channels", None)
        if self.built and channels is not None and channels != built:
            raise ValueError(
                "Received an invalid value for argument `inputs`, expected "
                f"{built} channels, those the layer was built with. "
                f"Received: inputs.shape={shape}"
            )
        if self.key_dim is None and channels % self.num_heads:
            raise ValueError(
                "Received an invalid value for argument `inputs`, expected "
                f"channels divisible by num_heads={self.num_heads} when "
                f"key_dim is None. Received: inputs.shape={shape}"
            )
        return shape

    def compute_output_spec(self, inputs, *args, **kwargs):
        # keras wraps what `call` raises while it is traced in its "Could
        # not automatically infer the output shape" text, pointing at the
        # wrong fix: an unknown height or width gets its own error first.
        if keras.backend.backend() != "torch":
            self._check_shape(inputs.shape, need_spatial=True)
        return super().compute_output_spec(inputs, *args, **kwargs)

    @property
    def head_dim(self):
        return self.key_dim or self._channels // self.num_heads

    def _dense(self, name, units):
        return keras.layers.Dense(units, **base.sublayer_kwargs(self, name))

    def build(self, input_shape):
        shape = self._check_shape(input_shape, need_spatial=False)
        self._channels = shape[-1]
        w, h = self.window_size, self.num_heads
        self.relative_position_bias_table = self.add_weight(
            name="relative_position_bias_table",
            shape=((2 * w - 1) ** 2, h),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )
        inner = h * self.head_dim
        self.qkv = self._dense("qkv", 3 * inner)
        self.qkv.build((None, None, self._channels))
        self.output_dense = self._dense("output_dense", self._channels)
        self.output_dense.build((None, None, inner))
        self.built = True

    def relative_position_bias(self, window):
        """`(1, H, T, T)` bias of a `window x window` window."""
        index = ops.reshape(
            relative_position_index(window, self.window_size), (-1,)
        )
        t = window * window
        bias = ops.take(self.relative_position_bias_table, index, axis=0)
        bias = ops.reshape(bias, (t, t, self.num_heads))
        return ops.transpose(bias, (2, 0, 1))[None]

    def call(self, inputs, return_attention_scores=False, training=None):
        _, height, width, channels = self._check_shape(
            inputs.shape, need_spatial=True
        )
        window, shift, hp, wp = window_geometry(
            height, width, self.window_size, self.shift_size
        )
        x = inputs
        if (hp, wp) != (height, width):
            x = pad(x, [[0, 0], [0, hp - height], [0, wp - width], [0, 0]])
        if shift:
            x = cyclic_shift(x, -shift)
        x = partition_windows(x, window)  # (B * nW, T, C)
        t, heads, d = window * window, self.num_heads, self.head_dim
        qkv = ops.reshape(self.qkv(x), (-1, t, 3, heads, d))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B * nW, T, H, D)

        mask = shifted_window_mask(height, width, window, shift)
        if mask is not None:
            # (nW, 1, T, T) repeated for each image: (B * nW, 1, T, T).
            mask = ops.expand_dims(mask, 1)
            mask = ops.tile(mask, (ops.shape(inputs)[0], 1, 1, 1))
        result = base.attend(
            self,
            q,
            k,
            v,
            mask,
            training,
            return_attention_scores,
            bias=self.relative_position_bias(window),
            scale=1.0 / math.sqrt(d),
        )
        out, weights = result if return_attention_scores else (result, None)
        out = self.output_dense(ops.reshape(out, (-1, t, heads * d)))
        out = merge_windows(out, window, hp, wp)
        if shift:
            out = cyclic_shift(out, shift)
        out = out[:, :height, :width, :]
        if return_attention_scores:
            num_windows = (hp // window) * (wp // window)
            weights = ops.reshape(weights, (-1, num_windows, heads, t, t))
            return out, weights
        return out

    def compute_output_shape(self, input_shape):
        return self._check_shape(input_shape, need_spatial=False)
