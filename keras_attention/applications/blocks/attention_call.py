"""How the blocks build and call an attention layer: with what it takes."""

import inspect

import keras

from keras_attention import registry

_ATTENTION_ARGUMENTS = (
    "value",
    "key",
    "query_mask",
    "value_mask",
    "mask",
    "use_causal_mask",
    "return_attention_scores",
    "training",
)


def accepted_call_arguments(layer):
    """The names among the blocks' attention arguments that `layer.call` takes."""
    return frozenset(
        a for a in _ATTENTION_ARGUMENTS if registry.call_accepts(layer, a)
    )


def build_attention(layer, query_shape, value_shape=None, key_shape=None):
    """Builds `layer` with the shapes its `build` takes, as Keras would.

    keras's `MultiHeadAttention` (and ours) take `build(query_shape,
    value_shape, key_shape)`; a layer with the ordinary `build(input_shape)`
    gets the query's shape, as Keras gives it at the first call. A layer
    whose sublayers wait for their first call to make their weights is then
    traced once symbolically, so that every weight exists to save and load.
    """
    shapes = [query_shape, value_shape, key_shape]
    while len(shapes) > 1 and shapes[-1] is None:
        shapes.pop()
    try:
        parameters = list(inspect.signature(layer.build).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    taken = shapes
    if not any(p.kind is p.VAR_POSITIONAL for p in parameters):
        positional = [
            p for p in parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        taken = shapes[: max(1, len(positional))]
    layer.build(*taken)
    if all(sublayer.built for sublayer in layer._flatten_layers()):
        return
    arguments = {
        name: keras.KerasTensor(shape, dtype=layer.compute_dtype)
        for name, shape in zip(("value", "key"), shapes[1:])
        if registry.call_accepts(layer, name)
    }
    # Traced through `call` (a layer's `compute_output_shape` would skip it).
    keras.Operation.compute_output_spec(
        layer, keras.KerasTensor(query_shape, dtype=layer.compute_dtype),
        **arguments,
    )


def call_attention(
    layer,
    accepted,
    query,
    return_attention_scores=False,
    training=None,
    **arguments,
):
    """`(output, scores)` of `layer(query, ...)` with the arguments it takes.

    `arguments` holding `None` (or `use_causal_mask=False`) are left out; a
    layer that cannot return scores gives `None`.
    """
    if arguments.get("use_causal_mask") and "use_causal_mask" not in accepted:
        raise ValueError(
            f"This block needs causal self-attention, but the attention layer "
            f"{layer.name!r} ({type(layer).__name__}) takes no "
            "`use_causal_mask` in `call`: each position would see the ones "
            "after it. Use a layer whose `call` takes `use_causal_mask`."
        )
    kwargs = {
        k: v
        for k, v in arguments.items()
        if v is not None and v is not False and k in accepted
    }
    query_mask = arguments.get("query_mask")
    if (
        query_mask is not None
        and "query_mask" not in accepted
        and "mask" in accepted
        and arguments.get("value") is None
    ):
        kwargs["mask"] = query_mask
    if "training" in accepted:
        kwargs["training"] = training
    if return_attention_scores and "return_attention_scores" in accepted:
        return layer(query, return_attention_scores=True, **kwargs)
    return layer(query, **kwargs), None


def call_self_attention(layer, accepted, x, mask=None, position=None, **options):
    """`call_attention` for self-attention over `x` (B, T, C).

    Without `position` the layer gets `x` alone (and `query_mask=mask`);
    with it, queries and keys are `x + position` and values `x` (DETR).
    """
    if position is None:
        return call_attention(layer, accepted, x, query_mask=mask, **options)
    query = x + position
    return call_attention(
        layer,
        accepted,
        query,
        value=x,
        key=query,
        query_mask=mask,
        value_mask=mask,
        **options,
    )
