"""The patch layers of the Vision Transformer and Swin: `PatchEmbedding`
(patches to tokens, class token, position embedding), `PatchMerging`
(Swin's 2x2 down-sampling between stages) and `TokenPooling`."""

import keras
from keras import ops

from keras_attention._validation import check_bool
from keras_attention import _validation as base
from keras_attention.applications import base as app_base
from keras_attention._config import ArgumentConfig
from keras_attention.ops.shapes import pad


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class PatchEmbedding(ArgumentConfig, keras.layers.Layer):
    """Patch embedding of ViT, with an optional class token.

    A `Conv2D` with kernel and stride `patch_size` projects each patch to
    `hidden_dim` features; the `(B, h, w, hidden_dim)` grid is flattened
    row-major to `N = h * w` tokens, a learned class token is put first if
    `use_class_token`, and a learned position embedding is added (to the
    class token too if `embed_class_token`, as in the original ViT).

    Args:
        hidden_dim: size `C` of each token.
        patch_size: patch side (int) or `(height, width)`.
        use_class_token: prepend a learned class token.
        embed_class_token: the position embedding covers the class token
            (`(1, N + 1, C)`); `False` adds it to the patches only
            (`(1, N, C)`, timm's `no_embed_class=True`).
        use_position_embedding: add a learned position embedding (Swin
            has none: its attention has a relative position bias).
        patch_norm_epsilon: if not `None`, a layer normalization of this
            epsilon on the embedded patches (Swin's `patch_norm`).

    Call arguments:
        images: `(B, H, W, channels)` with `H`, `W` multiples of the patch.

    Returns:
        Tokens `(B, N (+ 1), C)`.
    """

    def __init__(
        self,
        hidden_dim,
        patch_size,
        use_class_token=True,
        embed_class_token=True,
        use_position_embedding=True,
        patch_norm_epsilon=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = base.check_positive_int("hidden_dim", hidden_dim)
        self.patch_size = base.check_pair("patch_size", patch_size)
        self.use_class_token = check_bool("use_class_token", use_class_token)
        self.embed_class_token = check_bool("embed_class_token", embed_class_token)
        self.use_position_embedding = check_bool("use_position_embedding", use_position_embedding)
        self.patch_norm_epsilon = patch_norm_epsilon

    def build(self, input_shape):
        _, height, width, _ = input_shape
        ph, pw = self.patch_size
        self.grid_shape = (height // ph, width // pw)
        self.projection = keras.layers.Conv2D(
            self.hidden_dim,
            self.patch_size,
            strides=self.patch_size,
            padding="valid",
            data_format="channels_last",
            name="projection",
            dtype=self.dtype_policy,
        )
        self.projection.build(input_shape)
        if self.patch_norm_epsilon is not None:
            self.norm = keras.layers.LayerNormalization(
                epsilon=self.patch_norm_epsilon, name="norm",
                dtype=self.dtype_policy,
            )
            self.norm.build((None, None, self.hidden_dim))
        num_tokens = self.grid_shape[0] * self.grid_shape[1]
        if self.use_class_token:
            self.class_token = self.add_weight(
                name="class_token",
                shape=(1, 1, self.hidden_dim),
                initializer="zeros",
            )
            num_tokens += int(self.embed_class_token)
        if self.use_position_embedding:
            self.position_embedding = self.add_weight(
                name="position_embedding",
                shape=(1, num_tokens, self.hidden_dim),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            )
        self.built = True

    def call(self, images):
        x = self.projection(images)  # (B, h, w, C)
        h, w = self.grid_shape
        x = ops.reshape(x, (-1, h * w, self.hidden_dim))
        if self.patch_norm_epsilon is not None:
            x = self.norm(x)
        position = None
        if self.use_position_embedding:
            position = ops.cast(self.position_embedding, x.dtype)
        # With `embed_class_token` the embedding is added after the class
        # token is put first, otherwise to the patches only.
        on_tokens = self.use_class_token and self.embed_class_token
        if position is not None and not on_tokens:
            x = x + position
        if self.use_class_token:
            token = ops.broadcast_to(
                ops.cast(self.class_token, x.dtype),
                (ops.shape(x)[0], 1, self.hidden_dim),
            )
            x = ops.concatenate([token, x], axis=1)
        if position is not None and on_tokens:
            x = x + position
        return x

    def compute_output_shape(self, input_shape):
        _, height, width, _ = input_shape
        ph, pw = self.patch_size
        n = (height // ph) * (width // pw) + int(self.use_class_token)
        return (input_shape[0], n, self.hidden_dim)


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class PatchMerging(ArgumentConfig, keras.layers.Layer):
    """Swin's patch merging: 2x2 neighbouring tokens -> one token of `2 C`.

    The tokens `(B, h * w, C)` are seen as the grid `(B, h, w, C)` (padded
    to even sides), each 2x2 neighbourhood is concatenated to `4 C`
    features, normalized and projected to `2 C`.

    Args:
        grid_shape: `(h, w)` of the incoming tokens.

    Returns:
        `(B, ceil(h / 2) * ceil(w / 2), 2 C)`.
    """

    def __init__(self, grid_shape, **kwargs):
        super().__init__(**kwargs)
        self.grid_shape = base.check_pair("grid_shape", grid_shape)

    @property
    def output_grid_shape(self):
        h, w = self.grid_shape
        return (-(-h // 2), -(-w // 2))

    def build(self, input_shape):
        channels = input_shape[-1]
        self.norm = keras.layers.LayerNormalization(
            epsilon=1e-5, name="norm", dtype=self.dtype_policy
        )
        self.norm.build((None, None, 4 * channels))
        self.reduction = keras.layers.Dense(
            2 * channels, use_bias=False, name="reduction", dtype=self.dtype_policy
        )
        self.reduction.build((None, None, 4 * channels))
        self.built = True

    def call(self, tokens):
        h, w = self.grid_shape
        channels = tokens.shape[-1]
        x = ops.reshape(tokens, (-1, h, w, channels))
        if h % 2 or w % 2:
            x = pad(x, [[0, 0], [0, h % 2], [0, w % 2], [0, 0]])
        x = ops.concatenate(
            [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
            axis=-1,
        )  # (B, h / 2, w / 2, 4 C)
        oh, ow = self.output_grid_shape
        x = ops.reshape(x, (-1, oh * ow, 4 * channels))
        return self.reduction(self.norm(x))

    def compute_output_shape(self, input_shape):
        oh, ow = self.output_grid_shape
        return (input_shape[0], oh * ow, 2 * input_shape[-1])


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TokenPooling(ArgumentConfig, keras.layers.Layer):
    """`(B, N, C) -> (B, C)`: the first (class) token, or the mean of all."""

    def __init__(self, mode="cls", **kwargs):
        super().__init__(**kwargs)
        if mode not in ("cls", "mean"):
            raise base.invalid("mode", "'cls' or 'mean'", mode)
        self.mode = mode

    def call(self, tokens):
        if self.mode == "cls":
            return tokens[:, 0]
        return ops.mean(tokens, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])
