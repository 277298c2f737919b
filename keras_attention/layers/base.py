"""What the attention layers share: inputs, masks, the attention core with
a layer's dropout, and (from `_projections`, named here for every layer)
their keras projection sublayers' weight arguments, configs, LoRA
(`ProjectionMixin`, `enable_lora`) and quantization."""

import contextlib

import keras
import numpy as np
from keras import ops
from keras.src.backend import get_keras_mask
from keras.src.backend import set_keras_mask

from keras_attention import ops as attention_ops
from keras_attention._validation import exporting
from keras_attention._validation import shape_fits
from keras_attention._validation import torch_compiling
from keras_attention.layers._projections import WEIGHT_ARGUMENTS  # noqa: F401
from keras_attention.layers._projections import ProjectionMixin  # noqa: F401
from keras_attention._config import arguments_config  # noqa: F401
from keras_attention.layers._projections import check_quantizable  # noqa: F401
from keras_attention.layers._projections import clone_initializer  # noqa: F401
from keras_attention.layers._projections import enable_lora  # noqa: F401
from keras_attention.layers._projections import keep_weight_arguments  # noqa: F401
from keras_attention.layers._projections import projection_sublayers  # noqa: F401
from keras_attention.layers._projections import sublayer_kwargs  # noqa: F401


@contextlib.contextmanager
def keras_masks_set_aside(*inputs):
    """The Keras masks of `inputs` (tensors, lists of them, `None`s)
    cleared while the block runs, then given back.

    A layer that has read its inputs' masks into its mask arguments calls
    its projections inside the block: they take no mask (Keras would warn
    that they drop it). keras's `MultiHeadAttention` clears them for good,
    and another layer reading the same tensor afterwards (a second
    attention on `value`) then ran unmasked; here the caller's tensors get
    their masks back.
    """
    tensors = [x for x in keras.tree.flatten(inputs) if x is not None]
    saved = [(x, get_keras_mask(x)) for x in tensors]
    for x, _ in saved:
        set_keras_mask(x, None)
    try:
        yield
    finally:
        for x, mask in saved:
            if mask is not None:
                set_keras_mask(x, mask)


def float_inputs(layer, inputs):
    """`inputs` in `layer`'s compute dtype when they are not floats (a
    `uint8` image, `int32` counts or edge features), as keras's `Dense`
    computes them: a refined map and its residual are never cast back to
    integers, which would truncate them (channel weights in `(0, 1)` to 0).
    A NumPy array (keras's `stateless_call` passes its inputs as given)
    becomes a tensor.
    """
    if isinstance(inputs, np.ndarray):
        inputs = ops.convert_to_tensor(inputs)
    if not keras.backend.is_float_dtype(inputs.dtype):
        return ops.cast(inputs, layer.compute_dtype)
    return inputs


def is_shape(x):
    """One shape: a tuple or list of ints and `None`s, or a
    `tf.TensorShape` (anything with `as_list`)."""
    if hasattr(x, "as_list"):
        return True
    return isinstance(x, (tuple, list)) and all(
        d is None or isinstance(d, int) for d in x
    )


def split_shapes(query_shape, value_shape=None, key_shape=None):
    """`build`'s shapes when the layer was called on one list of tensors."""
    if value_shape is None and not is_shape(query_shape):
        shapes = list(query_shape)
        if not 1 <= len(shapes) <= 3:
            raise ValueError(
                "Expected the inputs to be one tensor, or a list of "
                "[query, value] or [query, value, key]. Received "
                f"{len(shapes)} input shapes: {shapes}"
            )
        query_shape = shapes[0]
        value_shape = shapes[1] if len(shapes) > 1 else None
        key_shape = shapes[2] if len(shapes) > 2 else None
    query_shape = _as_shape("query_shape", query_shape)
    value_shape = (
        query_shape if value_shape is None else _as_shape("value_shape", value_shape)
    )
    key_shape = value_shape if key_shape is None else _as_shape("key_shape", key_shape)
    return query_shape, value_shape, key_shape


def _as_shape(argument, shape):
    """`shape` as a tuple; a clear error for what is not a shape (an int)."""
    try:
        return tuple(shape)
    except TypeError:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a shape (a tuple of ints and None). Received: {argument}={shape!r}"
        ) from None


def check_rank(argument, shape, rank=3):
    if len(shape) != rank:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a rank-{rank} tensor (B, T, features). Received: "
            f"{argument}.shape={tuple(shape)}"
        )


def check_batch(query_shape, value_shape, key_shape):
    """Raise unless `query`, `value` and `key` can have one batch size.

    Only static sizes count: torch's ONNX export traces sizes as tensors,
    each a different object, and `torch.compile`'s symbolic sizes (numbers
    too) would be fixed to their value by the set (a new compile for every
    batch size): under it the check is left to eager calls."""
    if torch_compiling():
        return
    sizes = {
        s[0] for s in (query_shape, value_shape, key_shape)
        if isinstance(s[0], (int, np.integer))
    }
    if len(sizes) > 1:
        raise ValueError(
            "Expected `query`, `value` and `key` to have the same batch "
            f"size. Received: query.shape={tuple(query_shape)}, "
            f"value.shape={tuple(value_shape)}, key.shape={tuple(key_shape)}"
        )


def _is_mask_list(mask):
    """Whether `mask` is a list of masks `[query_mask, value_mask(,
    key_mask)]` (each `None` or a tensor `(B, ...)`) rather than one mask
    written as nested lists."""
    return (
        isinstance(mask, (list, tuple))
        and 2 <= len(mask) <= 3
        and all(m is None or len(getattr(m, "shape", ())) >= 2 for m in mask)
    )


def as_mask(mask):
    """`mask` as a tensor (or `None`): keras's layers take any array-like
    mask, nested lists included."""
    if mask is None or hasattr(mask, "shape"):
        return mask
    return ops.convert_to_tensor(mask)


def check_mask_shape(argument, mask, expected, where=""):
    """Raise if a mask's static shape cannot be `expected` (None = any);
    `where` follows the expected shape in the message."""
    if mask is None:
        return
    shape = tuple(mask.shape)
    if not shape_fits(shape, expected):
        hint = ""
        if exporting(shape, expected):
            # JAX's export names each unknown input dimension apart: a
            # mask input's length is not known to be the sequence's.
            hint = (
                ". On JAX, keras's `model.export` names each unknown "
                "dimension apart: pass `jax2tf_kwargs={\"polymorphic_shapes"
                "\": [[\"(b, t, C)\", \"(b, t)\"]]}` (one string per "
                "input, the same letter where sizes are equal) to say that "
                "the mask and its sequence have the same length."
            )
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a boolean tensor of shape {expected}{where}. Received: "
            f"{argument}.shape={shape}{hint}"
        )


def check_attention_mask(attention_mask, batch, heads, t_len, s_len, keys=""):
    """Raise unless `attention_mask` broadcasts to `(B, H, T, S)` as keras
    reads it: `(T, S)`, `(B, T, S)` or `(B, H, T, S)`, any axis 1 to
    broadcast (`H = 1` for the one-head layers). `keys` says what the `S`
    keys are, where it is not the value's length."""
    full = (batch, heads, t_len, s_len)
    shape = tuple(attention_mask.shape)
    expected = {2: full[2:], 3: (batch,) + full[2:]}.get(len(shape), full)
    if len(shape) not in (2, 3, 4) or any(
        d is not None and e is not None and d not in (1, e)
        for d, e in zip(shape, expected)
    ):
        raise ValueError(
            "Received an invalid value for argument `attention_mask`, "
            "expected a boolean tensor that broadcasts to (B, H, T, S) = "
            f"{full}{keys} as (T, S), (B, T, S) or (B, H, T, S). "
            f"Received: attention_mask.shape={shape}"
        )


def self_attention_defaults(query, value, key, query_mask, value_mask, key_mask):
    """`(value, key, value_mask, key_mask)` with keras's defaults: `value`
    is `query` (self-attention) and `key` is `value`, each taking the mask
    of the tensor it stands for unless its own mask is given."""
    if value is None:
        value = query
        value_mask = query_mask if value_mask is None else value_mask
    if key is None:
        key = value
        key_mask = value_mask if key_mask is None else key_mask
    return value, key, value_mask, key_mask


def attend(layer, query, key, value, mask, training, return_weights, **core):
    """The shared core (`keras_attention.ops.dot_product_attention`) on heads
    `(B, T, H, D)` with `layer`'s dropout (`layer.dropout`, its
    `seed_generator`); `core`: the core's other arguments (`scale`, `bias`).
    """
    return attention_ops.dot_product_attention(
        query,
        key,
        value,
        attention_mask=mask,
        dropout_rate=layer.dropout,
        seed=layer.seed_generator,
        training=training,
        return_weights=return_weights,
        **core,
    )


class TracedOutputSpec:
    """`compute_output_spec` that traces `call` symbolically (keras's
    `Operation.compute_output_spec`) rather than reading
    `compute_output_shape`: the same checks and the same output structure
    as an eager call, so `return_attention_scores=True` gives the
    `(output, scores)` pair in a functional model too, with the scores'
    shape as `call` makes it. For subclasses of `keras.layers.Layer`."""

    def compute_output_spec(self, *args, **kwargs):
        return traced_output_spec(self, *args, **kwargs)


def traced_output_spec(layer, *args, **kwargs):
    """`layer.call` traced on symbolic inputs, as a symbolic `layer(...)`
    would see them: floating inputs cast to the compute dtype (a mixed
    policy's spec is float16's, as the call's), and an unbuilt layer built
    from its inputs' shapes first (its weights are read by `call`); a check
    of `call` that fails raises its own message."""
    from keras.src import backend as keras_backend
    from keras.src.layers.layer import CallSpec

    if layer._convert_input_args:

        def convert(x):
            if isinstance(x, keras.KerasTensor):
                return layer.dtype_policy.convert_input(
                    x, layer.autocast, layer.input_dtype
                )
            return x

        args = keras.tree.map_structure(convert, args)
        kwargs = keras.tree.map_structure(convert, kwargs)
    if not layer.built:
        layer._maybe_build(
            CallSpec(layer._call_signature, layer._call_context_args, args, kwargs)
        )
    # The backend's trace itself: `Operation.compute_output_spec` re-raises
    # a check of `call` as "implement compute_output_spec()", which these
    # layers do; the check's own message says what was wrong.
    return keras_backend.compute_output_spec(layer.call, *args, **kwargs)


class SequenceAttention(TracedOutputSpec, keras.layers.Layer):
    """Base of the sequence attention layers: input unpacking and masks.

    Its `call` turns any of `layer(x)`, `layer([query, value])`,
    `layer([query, value, key])` or `layer(query, value, key)`, with Keras
    masks or explicit masks, into `(query, value, key, mask)` where `mask`
    is a boolean tensor broadcastable to `(B, T, S)` (or `None`), and hands
    them to the subclass's `attend` (`flatten_inputs`, then
    `unpack_inputs`: a layer with its own `call` can use the two too).
    """

    # Always applying a causal mask; a layer with the constructor argument
    # sets it. `call` takes it per call as well.
    use_causal_mask = False
    # Keyword arguments of `call` beyond the shared ones, passed to `attend`.
    call_options = ()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=None,
        mask=None,
        **options,
    ):
        """The call of every sequence layer, in keras `MultiHeadAttention`'s
        order: inputs and masks unpacked once (`unpack_inputs`), a one-step
        query `(B, D)` run as `(B, 1, D)`, then the layer's `attend`."""
        unknown = sorted(set(options) - set(self.call_options))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.call() got unexpected keyword "
                f"arguments {unknown}; it takes {list(self.call_options)} "
                "besides keras MultiHeadAttention's."
            )
        causal = self.use_causal_mask if use_causal_mask is None else use_causal_mask
        query, value, key, query_mask, value_mask, key_mask = self.flatten_inputs(
            query, value, key, query_mask, value_mask, key_mask, mask
        )
        attention_mask = as_mask(attention_mask)
        one_step = len(query.shape) == 2
        if one_step:  # one decoder step
            if causal:
                raise ValueError(
                    "`use_causal_mask` needs a query `(B, T, D)`: a one-step "
                    f"query has no positions. Received: query.shape={query.shape}"
                )
            query = ops.expand_dims(query, 1)
            query_mask = (
                None if query_mask is None else ops.expand_dims(query_mask, 1)
            )
        query, value, key, combined = self.unpack_inputs(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            use_causal_mask=causal,
        )
        result = self.attend(
            query, value, key, combined, training, return_attention_scores,
            **options,
        )
        if not one_step:
            return result
        if return_attention_scores:
            return tuple(r[:, 0] for r in result)
        return result[:, 0]

    def attend(self, query, value, key, mask, training, return_weights, **options):
        """The layer's attention on unpacked inputs: `query` `(B, T, Dq)`,
        `value`, `key` `(B, S, ...)`, `mask` from `combine_masks`. Returns
        the output `(B, T, Dv)`, and the weights `(B, T, S)` (before
        dropout) with `return_weights`."""
        raise NotImplementedError(f"{type(self).__name__} must define `attend`.")

    @staticmethod
    def check_query_shapes(query_shape, value_shape, key_shape):
        """`build`'s check: a query `(B, T, Dq)` or one step `(B, Dq)` (which
        needs a `value`), `key` and `value` of rank 3."""
        if len(query_shape) not in (2, 3):
            raise ValueError(
                "Received an invalid value for argument `query`, expected a "
                "tensor of rank 3 (B, T, Dq) or 2 (B, Dq). Received: "
                f"query.shape={query_shape}"
            )
        if len(query_shape) == 2 and value_shape == query_shape:
            raise ValueError(
                "A (B, Dq) query needs a `value` to attend to. Received only "
                f"query.shape={query_shape}"
            )
        check_rank("value", value_shape)
        check_rank("key", key_shape)

    @staticmethod
    def flatten_inputs(
        query, value=None, key=None, query_mask=None, value_mask=None,
        key_mask=None, mask=None,
    ):
        """`(query, value, key, query_mask, value_mask, key_mask)` from a call.

        Accepts a list `[query, value(, key)]` as the first argument, with its
        Keras masks in `mask` (or, as Keras fills them in when `mask` is
        passed too, as a list in `query_mask`). With separate arguments,
        `mask` is the query's, or a list `[query_mask, value_mask(,
        key_mask)]` of `None`s and masks `(B, ...)` as in the list form.
        """
        candidates = ()  # lists of masks `[query_mask, value_mask(, key_mask)]`
        if isinstance(query, (list, tuple)):
            if value is not None or key is not None:
                raise ValueError(
                    "Pass either a list [query, value(, key)] or separate "
                    "`query`, `value`, `key` arguments, not both."
                )
            tensors = list(query)
            if not 1 <= len(tensors) <= 3:
                raise ValueError(
                    "Expected the inputs to be a list of [query, value] or "
                    f"[query, value, key]. Received {len(tensors)} tensors."
                )
            query, value, key = (tensors + [None, None])[:3]
            candidates = (query_mask, mask)
            if isinstance(query_mask, (list, tuple)):
                query_mask = None
        elif _is_mask_list(mask):
            candidates = (mask,)
        elif mask is not None and query_mask is None:
            query_mask = mask
        structured = [None, None, None]
        for candidate in candidates:
            if isinstance(candidate, (list, tuple)):
                for i, m in enumerate(list(candidate)[:3]):
                    if m is not None:
                        structured[i] = m
        query_mask = query_mask if query_mask is not None else structured[0]
        value_mask = value_mask if value_mask is not None else structured[1]
        key_mask = key_mask if key_mask is not None else structured[2]
        query_mask, value_mask, key_mask = (
            as_mask(m) for m in (query_mask, value_mask, key_mask)
        )
        return query, value, key, query_mask, value_mask, key_mask

    def unpack_inputs(
        self, query, value, key, query_mask, value_mask, key_mask,
        attention_mask, use_causal_mask=False,
    ):
        """Flat inputs (`flatten_inputs`) with the self-attention defaults,
        checked, and their masks as one (`combine_masks`): `(query, value,
        key, mask)`."""
        value, key, value_mask, key_mask = self_attention_defaults(
            query, value, key, query_mask, value_mask, key_mask
        )
        check_rank("query", query.shape)
        check_rank("value", value.shape)
        check_rank("key", key.shape)
        check_batch(query.shape, value.shape, key.shape)
        if (
            key.shape[1] is not None
            and value.shape[1] is not None
            and key.shape[1] != value.shape[1]
        ):
            raise ValueError(
                "Expected `key` and `value` to have the same length. Received: "
                f"key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}"
            )
        batch, t_len, s_len = query.shape[0], query.shape[1], value.shape[1]
        check_mask_shape("query_mask", query_mask, (batch, t_len))
        check_mask_shape("value_mask", value_mask, (batch, s_len))
        check_mask_shape("key_mask", key_mask, (batch, s_len))
        if attention_mask is not None:
            # One head: keras's (B, H, T, S) only with H = 1.
            check_attention_mask(attention_mask, batch, 1, t_len, s_len)
        combined = self.combine_masks(
            query, value, query_mask, value_mask, key_mask, attention_mask,
            use_causal_mask,
        )
        return query, value, key, combined

    @staticmethod
    def combine_masks(
        query, value, query_mask, value_mask, key_mask, attention_mask,
        use_causal_mask,
    ):
        """All masks as one boolean mask broadcastable to `(B, T, S)`.

        Rank 4 `(B, H, T, S)` when `attention_mask` has a head axis.
        """
        mask = None
        if value_mask is not None:
            mask = ops.expand_dims(ops.cast(value_mask, "bool"), 1)  # (B, 1, S)
        if key_mask is not None:
            k = ops.expand_dims(ops.cast(key_mask, "bool"), 1)
            mask = k if mask is None else ops.logical_and(mask, k)
        if query_mask is not None:
            q = ops.expand_dims(ops.cast(query_mask, "bool"), 2)  # (B, T, 1)
            mask = q if mask is None else ops.logical_and(mask, q)
        if use_causal_mask:
            t, s = ops.shape(query)[1], ops.shape(value)[1]
            causal = ops.expand_dims(attention_ops.causal_mask(t, s), 0)
            mask = causal if mask is None else ops.logical_and(mask, causal)
        if attention_mask is not None:
            attention_mask = ops.cast(attention_mask, "bool")
            if len(attention_mask.shape) == 2:
                attention_mask = ops.expand_dims(attention_mask, 0)  # every example
            if mask is not None and len(attention_mask.shape) == 4:
                mask = ops.expand_dims(mask, 1)
            mask = (
                attention_mask
                if mask is None
                else ops.logical_and(mask, attention_mask)
            )
        # Left as (B, 1, S) / (B, T, 1) where possible: it broadcasts.
        return mask

    def attend_one_head(
        self, query, key, value, mask, training, return_weights, **core
    ):
        """`softmax(scores) V` of a single head, with the masks and the
        layer's dropout (`self.dropout`, `self.seed_generator`), on the
        shared core (`keras_attention.ops.dot_product_attention`).

        `query` `(B, T, D)`, `key` `(B, S, D)`, `value` `(B, S, Dv)`; `mask`
        from `unpack_inputs`; `core`: the core's other arguments (`scale`,
        `bias`). Returns `(B, T, Dv)`, and the weights `(B, T, S)` (before
        dropout) if `return_weights`.
        """
        result = attend(
            self,
            # One head: `expand_dims`, not `[:, :, None]`, whose strided
            # slice LiteRT runs only with TensorFlow's ops (README, export).
            ops.expand_dims(query, 2),
            ops.expand_dims(key, 2),
            ops.expand_dims(value, 2),
            mask,
            training,
            return_weights,
            **core,
        )
        if not return_weights:
            return result[:, :, 0, :]
        output, weights = result
        return output[:, :, 0, :], weights[:, 0]

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        query_shape, value_shape, _ = split_shapes(
            query_shape, value_shape, key_shape
        )
        return tuple(query_shape[:-1]) + (value_shape[-1],)

    def compute_mask(self, inputs, mask=None):
        # The output is aligned with the query, so it keeps the query's mask.
        if isinstance(mask, (list, tuple)):
            return mask[0] if mask else None
        return mask
