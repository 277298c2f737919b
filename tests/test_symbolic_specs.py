"""`compute_output_spec` as a symbolic call sees it, and flags that are flags.

The traced spec read the layer's weights before any build (a crash on an
unbuilt layer with weights, which keras's own layers answer), skipped the
input autocast of a mixed policy (a float32 spec for a float16 call), and
MultiHeadAttention's spec accepted cached calls that the call refuses.
"""

import keras
import numpy as np
import pytest

from keras_attention import layers as L


def grid():
    return keras.Input((None, None, 4))


def tokens():
    return keras.Input((None, 4))


CASES = {
    "additive": (lambda: L.AdditiveAttention(4), lambda: [tokens(), tokens()], [(2, 3, 4), (2, 5, 4)]),
    "general": (
        lambda: L.ScaledDotProductAttention(score_mode="general"),
        lambda: [tokens(), tokens()], [(2, 3, 4), (2, 5, 4)],
    ),
    "channel": (lambda: L.ChannelAttention(2), grid, [(2, 3, 5, 4)]),
    "spatial": (lambda: L.SpatialAttention(3), grid, [(2, 3, 5, 4)]),
    "cbam": (lambda: L.CBAM(2, 3), grid, [(2, 3, 5, 4)]),
    "non_local": (lambda: L.NonLocalBlock(), grid, [(2, 3, 5, 4)]),
    "local_window": (
        lambda: L.LocalWindowAttention(2, 2), lambda: keras.Input((4, 4, 4)), [(2, 4, 4, 4)],
    ),
}


def first(x):
    return x[0] if isinstance(x, (list, tuple)) else x


def values(shapes):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=s).astype("float32") for s in shapes]
    return arrays if len(arrays) > 1 else arrays[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_spec_of_an_unbuilt_layer_is_the_calls(name):
    make, inputs, shapes = CASES[name]
    layer = make()
    spec = layer.compute_output_spec(inputs())
    real = layer(values(shapes))
    expected = tuple(first(real).shape)
    received = tuple(first(spec).shape)
    assert len(received) == len(expected)
    assert all(r is None or r == e for r, e in zip(received, expected)), (received, expected)


def test_the_spec_of_an_unbuilt_graph_layer():
    layer = L.GraphAttention(2)
    spec = layer.compute_output_spec(
        [keras.Input((3,), batch_size=5), keras.Input((None,), batch_size=2, dtype="int32")]
    )
    assert tuple(spec.shape) == (5, 2)


@pytest.mark.parametrize("name", ["additive", "general", "channel", "spatial", "non_local"])
def test_the_spec_under_a_mixed_policy_has_the_calls_dtype(name):
    make, inputs, shapes = CASES[name]
    config = make().get_config()
    layer = type(make()).from_config({**config, "dtype": "mixed_float16"})
    real = layer(values(shapes))
    spec = layer.compute_output_spec(inputs())  # float32 inputs, as given
    assert first(spec).dtype == keras.backend.standardize_dtype(first(real).dtype) == "float16"


def test_multi_head_spec_refuses_what_a_cached_call_refuses():
    layer = L.MultiHeadAttention(num_heads=2, key_dim=2)
    query = keras.Input((1, 4))
    cache = keras.Input((2, 8, 2, 2))
    layer.compute_output_spec(query, cache=cache, cache_update_index=0)  # fine
    with pytest.raises(ValueError, match="no attention scores"):
        layer.compute_output_spec(query, cache=cache, return_attention_scores=True)
    with pytest.raises(ValueError, match="without a `cache`"):
        layer.compute_output_spec(query, cache_update_index=0)
    with pytest.raises(ValueError, match="`query_mask` is not read in a cached call"):
        layer.compute_output_spec(
            query, cache=cache, query_mask=keras.Input((1,), dtype="bool")
        )


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda v: L.ScaledDotProductAttention(use_causal_mask=v), "use_causal_mask"),
        (lambda v: L.MultiHeadAttention(2, 2, use_causal_mask=v), "use_causal_mask"),
        (lambda v: L.NonLocalBlock(use_batch_norm=v), "use_batch_norm"),
        (lambda v: L.NonLocalBlock(zero_init_residual=v), "zero_init_residual"),
        (lambda v: L.AdditiveAttention(4, use_bias=v), "use_bias"),
        (lambda v: L.LocalWindowAttention(2, 2, use_bias=v), "use_bias"),
        (lambda v: L.MultiHeadAttention(2, 2, use_bias=v), "use_bias"),
        (lambda v: L.MultiHeadAttention(2, 2, use_gate=v), "use_gate"),
        (lambda v: L.MultiHeadAttention(2, 2, flash_attention=v), "flash_attention"),
    ],
)
def test_a_flag_given_as_a_string_is_refused(make, argument):
    # `bool("False")` is True: a flag read from a config file switched on.
    with pytest.raises(ValueError, match=f"`{argument}`.*True or False.*'False'"):
        make("False")
    assert make(np.bool_(False)) is not None


def test_project_key_refuses_a_functional_models_inputs():
    # It called the sublayer `key` as a node of its own: the model saved
    # but did not load ("Layer 'key' expected 2 variables, but received 0").
    layer = L.AdditiveAttention(4)
    layer(np.ones((1, 2, 4), "float32"), np.ones((1, 3, 4), "float32"))
    with pytest.raises(ValueError, match="`project_key` computes on tensors"):
        layer.project_key(keras.Input((None, 4)))
    assert tuple(layer.project_key(np.ones((1, 3, 4), "float32")).shape) == (1, 3, 4)


def test_a_mask_of_another_symbolic_length_says_how_to_export_on_jax():
    # JAX's export gives a separate mask input its own length symbol: the
    # message names the `polymorphic_shapes` that ties the two.
    from types import SimpleNamespace

    from keras_attention.layers import base

    mask = SimpleNamespace(shape=("batch", "b"))
    with pytest.raises(ValueError, match="`query_mask`.*polymorphic_shapes"):
        base.check_mask_shape("query_mask", mask, ("batch", "a"))
    with pytest.raises(ValueError) as raised:
        base.check_mask_shape("query_mask", SimpleNamespace(shape=(2, 4)), (2, 3))
    assert "polymorphic" not in str(raised.value)


def test_gat_exports_one_graph_a_call(tmp_path):
    import tensorflow as tf

    from keras_attention.applications import GATNodeClassifier

    gat = GATNodeClassifier(num_features=5, num_classes=2, hidden_units=4, num_heads=2)
    x = [np.ones((1, 7, 5), "float32"), np.array([[[0, 1, 2], [1, 2, 3]]], "int32")]
    gat(x)
    gat.export(str(tmp_path / "gat"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "gat"))
    np.testing.assert_allclose(loaded.serve(x).numpy(), np.asarray(gat(x)), atol=1e-5)
    # A batch of two graphs was served as the first graph's logits alone.
    with pytest.raises(Exception, match="shape=\\(2, 7, 5\\)"):
        loaded.serve([np.ones((2, 7, 5), "float32"), np.zeros((2, 2, 3), "int32")])


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(num_heads=True, key_dim=2), "num_heads"),
        (dict(num_heads="4", key_dim=2), "num_heads"),
        (dict(num_heads=2, key_dim=0), "key_dim"),
        (dict(num_heads=2, key_dim=2, value_dim=-1), "value_dim"),
        (dict(num_heads=2, key_dim=2, attention_axes=(1.5,)), "attention_axes"),
        (dict(num_heads=2, key_dim=3, position_encoding="rope"), "key_dim"),
    ],
)
def test_multi_head_arguments_are_checked_at_construction(kwargs, argument):
    # They passed construction and failed at the first call (an IndexError
    # for a float axis, the odd RoPE head at build).
    with pytest.raises(ValueError, match=f"`{argument}`"):
        L.MultiHeadAttention(**kwargs)


def test_a_symbolic_calls_error_is_the_layers_own():
    # keras's trace re-raised it as "Could not automatically infer the
    # output shape ... implement compute_output_spec()", which they do.
    with pytest.raises(ValueError) as raised:
        L.AdditiveAttention(4)(
            [tokens(), keras.Input((None, 5))],
            value_mask=keras.Input((None, 2), dtype="bool"),
        )
    assert "`value_mask`" in str(raised.value)
    assert "automatically infer" not in str(raised.value)


def test_attention_poolings_symbolic_weights_have_the_calls_dtype():
    from keras_attention.applications.text_layers import AttentionPooling

    layer = AttentionPooling(8, dtype="mixed_float16")
    symbolic = layer(keras.Input((5, 8)), return_attention_scores=True)
    eager = layer(np.ones((2, 5, 8), "float32"), return_attention_scores=True)
    assert [t.dtype for t in symbolic] == [
        keras.backend.standardize_dtype(t.dtype) for t in eager
    ] == ["float16", "float16"]
