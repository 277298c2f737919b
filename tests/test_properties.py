"""Property-based tests (hypothesis) over every registered layer.

For each name in `keras_attention.names()`, random configurations, shapes,
input magnitudes and masks check that

- outputs (and attention scores) are finite;
- values at masked positions do not change the outputs at kept positions;
- a query whose keys are all masked gets all-zero attention weights, and its
  output does not depend on the masked values;
- invalid constructor arguments and inputs of the wrong rank raise a
  `ValueError` naming the argument (never a hang, a crash or a bare backend
  error).

The layers of keras_attention have a configuration space below (`SPACES`);
any other registered layer (a plugin, a new layer) is checked through its
harness case in `tests/cases_*.py` with random values, magnitudes and masks,
and its invalid arguments are derived from its constructor's signature.

Examples per test: `EXAMPLES` (derandomized, so CI runs the same cases every
time), i.e. `EXAMPLES * len(names())` per property.
"""

import inspect

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_attention
from tests.harness import first, load_cases, mask_arguments, numpy, to_list

EXAMPLES = 10
CASES = load_cases()
NAMES = keras_attention.names()

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def normal(rng, *shape):
    return rng.normal(size=shape).astype("float32")


# ------------------------------------------------------- configuration spaces
# Each space draws `(kwargs, inputs, masked)`: the constructor arguments, the
# inputs (NumPy, from a drawn seed) and whether the first input's axes 0-1
# take a Keras padding mask.


def divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


def draw_rng(draw):
    return np.random.default_rng(draw(st.integers(0, 2**16)))


def multi_head_space(draw):
    heads = draw(st.integers(1, 4))
    kv_heads = draw(st.sampled_from(divisors(heads)))
    kwargs = dict(
        num_heads=heads,
        key_dim=draw(st.integers(1, 4)),
        value_dim=draw(st.none() | st.integers(1, 3)),
        num_key_value_heads=kv_heads,
        use_causal_mask=draw(st.booleans()),
        use_bias=draw(st.booleans()),
    )
    rng = draw_rng(draw)
    b, t, d = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 6))
    if draw(st.booleans()):
        inputs = normal(rng, b, t, d)
    else:
        s = draw(st.integers(1, 5))
        inputs = [normal(rng, b, t, d), normal(rng, b, s, draw(st.integers(1, 6)))]
    return kwargs, inputs, True


def additive_space(draw):
    rng = draw_rng(draw)
    b, t, s = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    inputs = [normal(rng, b, t, draw(st.integers(1, 5))), normal(rng, b, s, draw(st.integers(1, 5)))]
    return dict(units=draw(st.integers(1, 6)), use_bias=draw(st.booleans())), inputs, True


def scaled_dot_product_space(draw):
    mode = draw(st.sampled_from(["scaled_dot", "dot", "general"]))
    rng = draw_rng(draw)
    b, t, d = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    if draw(st.booleans()):
        inputs = normal(rng, b, t, d)
    else:
        s = draw(st.integers(1, 5))
        d_key = d if mode != "general" else draw(st.integers(1, 5))
        inputs = [normal(rng, b, t, d), normal(rng, b, s, d_key)]
    kwargs = dict(score_mode=mode, use_causal_mask=draw(st.booleans()))
    return kwargs, inputs, True


def channel_space(draw):
    rng = draw_rng(draw)
    channels = draw(st.integers(1, 8))
    reduction = draw(st.sampled_from(divisors(channels)))
    b = draw(st.integers(1, 3))
    if draw(st.booleans()):  # a sequence, which takes a padding mask
        return dict(reduction=reduction), normal(rng, b, draw(st.integers(1, 6)), channels), True
    shape = (b, draw(st.integers(1, 5)), draw(st.integers(1, 5)), channels)
    return dict(reduction=reduction), normal(rng, *shape), False


def image(draw, rng, min_channels=1):
    return normal(
        rng,
        draw(st.integers(1, 3)),
        draw(st.integers(1, 6)),
        draw(st.integers(1, 6)),
        draw(st.integers(min_channels, 8)),
    )


def spatial_space(draw):
    rng = draw_rng(draw)
    return dict(kernel_size=draw(st.sampled_from([1, 3, 5]))), image(draw, rng), False


def cbam_space(draw):
    rng = draw_rng(draw)
    x = image(draw, rng)
    kwargs = dict(
        reduction=draw(st.sampled_from(divisors(x.shape[-1]))),
        kernel_size=draw(st.sampled_from([1, 3, 5])),
    )
    return kwargs, x, False


def non_local_space(draw):
    rng = draw_rng(draw)
    kwargs = dict(
        mode=draw(st.sampled_from(["gaussian", "embedded_gaussian", "dot", "concatenation"])),
        sub_sample=draw(st.booleans()),
        use_batch_norm=draw(st.booleans()),
        zero_init_residual=False,
    )
    if draw(st.booleans()):
        b, t, c = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(2, 6))
        return kwargs, normal(rng, b, t, c), True
    return kwargs, image(draw, rng, min_channels=2), False


def graph_space(draw):
    rng = draw_rng(draw)
    nodes, features = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    num_edges = draw(st.integers(1, 12))
    edges = rng.integers(0, nodes, size=(2, num_edges)).astype("int32")
    kwargs = dict(
        units=draw(st.integers(1, 4)),
        num_heads=draw(st.integers(1, 3)),
        concat_heads=draw(st.booleans()),
        version=draw(st.sampled_from(["v1", "v2"])),
        add_self_loops=draw(st.booleans()),
    )
    return kwargs, [normal(rng, nodes, features), edges], False


def local_window_space(draw):
    rng = draw_rng(draw)
    x = image(draw, rng)
    channels = x.shape[-1]
    window = draw(st.integers(1, 4))
    kwargs = dict(
        num_heads=draw(st.sampled_from(divisors(channels))),
        window_size=window,
        shift_size=draw(st.integers(0, window - 1)),
    )
    return kwargs, x, False


SPACES = {
    "multi_head": multi_head_space,
    "additive": additive_space,
    "scaled_dot_product": scaled_dot_product_space,
    "channel": channel_space,
    "spatial": spatial_space,
    "cbam": cbam_space,
    "non_local": non_local_space,
    "graph": graph_space,
    "local_window": local_window_space,
}


def case_space(name):
    """A layer without a space: its harness case, with new random values."""
    if name not in CASES:
        return None
    case = CASES[name]

    def space(draw):
        inputs = case.make_inputs(draw_rng(draw))
        return dict(case.kwargs), inputs, case.mask is not None

    return space


def space_for(name):
    space = SPACES.get(name) or case_space(name)
    if space is None:
        pytest.skip(f"no configuration space or harness case for {name!r}")
    return space


def configurations(space):
    return st.composite(lambda draw: space(draw))()


def call_kwargs(name):
    return CASES[name].call_kwargs if name in CASES else {}


def scaled(inputs, factor):
    """Float inputs times `factor`; integer inputs (edge lists) unchanged."""
    items = [
        x * np.float32(factor) if np.issubdtype(x.dtype, np.floating) else x
        for x in to_list(inputs)
    ]
    return items if isinstance(inputs, (list, tuple)) else items[0]


def random_mask(draw, shape):
    """A boolean mask of `shape` that may hold fully masked rows."""
    rng = draw_rng(draw)
    keep = draw(st.floats(0.0, 1.0))
    return rng.random(shape) < keep


def accepts(layer, argument):
    return argument in inspect.signature(layer.call).parameters


def run(layer, inputs, name, **kwargs):
    """The layer's output and, when it can return them, its scores."""
    kwargs = {**call_kwargs(name), **kwargs}
    if accepts(layer, "return_attention_scores"):
        out, scores = layer(inputs, return_attention_scores=True, **kwargs)
        scores = [numpy(s) for s in keras.tree.flatten(scores)]
        return numpy(first(out)), scores[0] if len(scores) == 1 else scores
    return numpy(first(layer(inputs, **kwargs))), None


# ----------------------------------------------------------------- properties


@pytest.mark.parametrize("name", NAMES)
def test_outputs_are_finite(name):
    space = space_for(name)

    @SETTINGS
    @given(st.data())
    def check(data):
        kwargs, inputs, masked = data.draw(configurations(space))
        factor = 10.0 ** data.draw(st.integers(-3, 3))
        inputs = scaled(inputs, factor)
        mask = None
        if masked and data.draw(st.booleans()):
            mask = random_mask(data.draw, to_list(inputs)[0].shape[:2])
            if isinstance(inputs, (list, tuple)):
                mask = [mask] + [None] * (len(inputs) - 1)
        layer = keras_attention.get(name, **kwargs)
        extra = {} if mask is None else mask_arguments(layer, inputs, mask)
        out, scores = run(layer, inputs, name, **extra)
        assert np.all(np.isfinite(out)), (kwargs, factor)
        for item in keras.tree.flatten(scores):
            assert np.all(np.isfinite(item)), (kwargs, factor)

    check()


def masked_names():
    return [n for n in NAMES if n in SPACES or (n in CASES and CASES[n].mask is not None)]


@pytest.mark.parametrize("name", masked_names())
def test_masked_values_do_not_change_kept_outputs(name):
    space = space_for(name)

    @SETTINGS
    @given(st.data())
    def check(data):
        kwargs, inputs, masked = data.draw(configurations(space))
        if not masked:
            return  # this configuration takes no padding mask
        items = to_list(inputs)
        mask = random_mask(data.draw, items[0].shape[:2])
        keras_mask = [mask] + [None] * (len(items) - 1) if len(items) > 1 else mask
        layer = keras_attention.get(name, **kwargs)
        kwargs_call = {**call_kwargs(name), **mask_arguments(layer, inputs, keras_mask)}
        out = numpy(first(layer(inputs, **kwargs_call)))
        noisy = items[0].copy()
        noise = np.random.default_rng(0).normal(size=noisy.shape) * 1e3
        noisy[~mask] = noise[~mask]
        changed = [noisy] + items[1:] if len(items) > 1 else noisy
        out2 = numpy(first(layer(changed, **kwargs_call)))
        scale = max(1.0, float(np.abs(out[mask]).max(initial=0.0)))
        np.testing.assert_allclose(out[mask], out2[mask], atol=1e-4 * scale, rtol=1e-4)

    check()


def value_masked_names():
    names = []
    for name in NAMES:
        if name not in CASES and name not in SPACES:
            continue
        cls = keras_attention.get_class(name)
        params = inspect.signature(cls.call).parameters
        if "value_mask" in params and "return_attention_scores" in params:
            names.append(name)
    return names


@pytest.mark.parametrize("name", value_masked_names())
def test_fully_masked_rows_give_zero_weights(name):
    space = space_for(name)

    @SETTINGS
    @given(st.data())
    def check(data):
        kwargs, inputs, _ = data.draw(configurations(space))
        kwargs.pop("use_causal_mask", None)
        items = to_list(inputs)
        values = items[1] if len(items) > 1 else items[0]
        b, s = values.shape[:2]
        value_mask = random_mask(data.draw, (b, s))
        value_mask[data.draw(st.integers(0, b - 1))] = False  # one fully masked row
        empty = ~value_mask.any(axis=1)
        layer = keras_attention.get(name, **kwargs)
        out, scores = run(layer, inputs, name, value_mask=value_mask)
        assert np.all(np.isfinite(out))
        # Scores (B, [H,] T, S): every query of an element without keys is 0.
        assert np.all(scores[empty] == 0.0)
        keep = value_mask.reshape((b,) + (1,) * (scores.ndim - 2) + (s,))
        assert np.all(scores[np.broadcast_to(~keep, scores.shape)] == 0.0)
        # The output of those elements does not depend on their values.
        other = np.random.default_rng(1).normal(size=values.shape).astype("float32") * 1e3
        new_values = np.where(empty[:, None, None], other, values)
        changed = [items[0], new_values] + items[2:] if len(items) > 1 else None
        if changed is None:  # self-attention: query and values are one tensor
            return
        out2, _ = run(layer, changed, name, value_mask=value_mask)
        np.testing.assert_allclose(out[empty], out2[empty], atol=1e-5)

    check()


# ------------------------------------------------------ invalid configurations

SKIPPED_ARGUMENTS = ("seed", "kwargs", "activation", "name", "dtype")


def invalid_values(cls):
    """`[(argument, bad value)]` from the constructor's signature and case."""
    bad = []
    name = next(n for n in NAMES if keras_attention.get_class(n) is cls)
    case_kwargs = CASES[name].kwargs if name in CASES else {}
    for argument, parameter in inspect.signature(cls.__init__).parameters.items():
        if argument == "self" or argument in SKIPPED_ARGUMENTS:
            continue
        if any(word in argument for word in ("initializer", "regularizer", "constraint")):
            continue
        default = case_kwargs.get(argument, parameter.default)
        if "dropout" in argument or argument.endswith("_rate"):
            bad += [(argument, v) for v in (-0.1, 1.0, 1.5, "0.1")]
        elif isinstance(default, bool):
            continue
        elif isinstance(default, int):
            bad += [(argument, v) for v in (-1, 2.5, "2")]
            if default > 0 and not argument.startswith("shift"):
                bad.append((argument, 0))
        elif isinstance(default, str):
            bad.append((argument, "no_such_option"))
    return bad


def required_kwargs(name):
    if name in CASES:
        return dict(CASES[name].kwargs)
    return {}


@pytest.mark.parametrize("name", [n for n in NAMES if n in CASES])
def test_invalid_arguments_raise_value_error_naming_them(name):
    cls = keras_attention.get_class(name)
    bad = invalid_values(cls)
    assert bad, f"no argument of {name!r} to check"

    @SETTINGS
    @given(st.sampled_from(bad))
    def check(item):
        argument, value = item
        kwargs = {**required_kwargs(name), argument: value}
        with pytest.raises(ValueError, match=f"`?{argument}`?"):
            keras_attention.get(name, **kwargs)

    check()


@pytest.mark.parametrize("name", [n for n in NAMES if n in CASES])
def test_inputs_of_a_wrong_rank_raise_value_error(name):
    case = CASES[name]
    inputs = case.make_inputs(np.random.default_rng(0))
    items = to_list(inputs)

    # No layer takes a rank-1 tensor or one of rank 5 or more above its own.
    @SETTINGS
    @given(st.sampled_from(["flatten", "deepen"]))
    def check(change):
        x = items[0]
        x = x.reshape(-1) if change == "flatten" else x[(...,) + (None,) * 3]
        changed = [x] + items[1:] if isinstance(inputs, (list, tuple)) else x
        layer = keras_attention.get(name, **case.kwargs)
        with pytest.raises(ValueError, match="shape|rank|dimension|argument"):
            layer(changed, **case.call_kwargs)

    check()
