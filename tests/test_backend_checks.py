"""What a user tries with the layers on the backend in use (CI: TensorFlow),
and what keras gives its own attention layer: mixed precision training,
quantization, seeded dropout, errors."""

import keras
import numpy as np
import pytest

import keras_attention

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_non_local_block_trains_under_mixed_precision_with_xla(policy):
    # Its scores are float32, its values low: the dense core's XLA-on-a-CPU
    # form returned float32 gradients for the low values (TensorFlow: a
    # dtype error in the backward; JAX: in the max-pool's gradient).
    layer = keras_attention.get("non_local", sub_sample=True, zero_init_residual=False,
                                dtype=policy)
    images = keras.Input((4, 4, 4))
    model = keras.Model(images, layer(images))
    model.compile("sgd", "mse", jit_compile=True)
    x = RNG.normal(size=(2, 4, 4, 4)).astype("float32")
    loss = model.fit(x, np.zeros_like(x), epochs=1, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss)), loss


@pytest.mark.parametrize(
    "name, kwargs",
    [("scaled_dot_product", {}), ("additive", {"units": 4}),
     ("multi_head", {"num_heads": 2, "key_dim": 4})],
)
def test_a_mask_list_with_separate_query_and_value(name, kwargs):
    # `layer(query, value, mask=[query_mask, value_mask])`, as the list form
    # takes it: the list was read as one query mask, and a `None` in it
    # failed in the backend's tensor conversion (its own message on each).
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    layer = keras_attention.get(name, **kwargs)
    want = keras.ops.convert_to_numpy(layer(x, x, value_mask=valid))
    for mask in ([None, valid], [valid, valid]):
        got = keras.ops.convert_to_numpy(layer(x, x, mask=mask))
        if mask[0] is None:
            np.testing.assert_allclose(got, want, atol=1e-6)
        else:  # the padded queries' rows are zero
            np.testing.assert_allclose(got[valid], want[valid], atol=1e-6)
