"""One harness that checks every registered layer the same way.

Each layer's case (constructor arguments, inputs, NumPy reference) lives in a
`tests/cases_*.py` file as `CASES = {"registry_name": LayerCase(...)}`;
`tests/test_harness.py` runs every check below on every name in
`keras_attention.names()`, so a layer is covered the moment it registers.
"""

import dataclasses
import glob
import importlib
import importlib.util
import inspect
import os
from typing import Callable, Optional

import keras
import numpy as np

import keras_attention


@dataclasses.dataclass
class ScoreContract:
    """What `return_attention_scores=True` returns (docs/design.md).

    Args:
        shapes: `inputs -> [shape, ...]`, one shape per returned tensor
            (CBAM returns two).
        kinds: per tensor, `"softmax"` (normalised over the keys: sums to 1,
            or 0 for a query that sees no key), `"gate"` (sigmoid gates in
            (0, 1), not a distribution) or `"mean"` (non-local `f / N`).
        sums: `(weights, inputs) -> sums over the keys`; defaults to the
            sum over the last axis.
        dropout: constructor arguments that turn dropout on, when the layer
            has dropout: the weights must be those before dropout.
        no_key: `(rng, inputs) -> (call kwargs, index)`: masks that leave the
            queries at `index` of the weights without a key; those weights
            must be exactly zero.
    """

    shapes: Callable
    kinds: tuple = ("softmax",)
    sums: Optional[Callable] = None
    dropout: Optional[dict] = None
    no_key: Optional[Callable] = None


@dataclasses.dataclass
class LayerCase:
    kwargs: dict
    make_inputs: Callable
    reference: Optional[Callable] = None
    call_kwargs: dict = dataclasses.field(default_factory=dict)
    mask: Optional[Callable] = None
    trainable: bool = True
    atol: float = 1e-5
    low_precision_atol: float = 5e-2
    scores: Optional[ScoreContract] = None


CASES_VARIABLE = "KERAS_ATTENTION_CASES"


def load_cases():
    """Every `CASES` of `tests/cases_*.py`, then of the files that the
    environment variable `KERAS_ATTENTION_CASES` lists (separated by
    `os.pathsep`): a plugin's own cases, so that its author can run this
    harness on its layers from a checkout of this repository (README,
    "Tests")."""
    cases = {}
    here = os.path.dirname(__file__)
    for path in sorted(glob.glob(os.path.join(here, "cases_*.py"))):
        module = importlib.import_module(
            "tests." + os.path.splitext(os.path.basename(path))[0]
        )
        cases.update(module.CASES)
    for path in filter(None, os.environ.get(CASES_VARIABLE, "").split(os.pathsep)):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{CASES_VARIABLE} names {path!r}, which is not a file"
            )
        name = "keras_attention_cases_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cases.update(module.CASES)
    return cases


def to_list(inputs):
    return list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]


def from_list(items, like):
    return items if isinstance(like, (list, tuple)) else items[0]


def first(outputs):
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def random_mask(kind, rng, b, t, s):
    """A boolean attention mask of `kind`: `"keys"` `(B, S)` with a batch
    element that sees no key, `"full"` `(B, 1, T, S)` with a query that
    sees no key, or `None`."""
    if kind == "keys":
        mask = rng.random((b, s)) > 0.3
        mask[1] = False  # a batch element with no key at all
        return mask
    if kind == "full":
        mask = rng.random((b, 1, t, s)) > 0.5
        mask[0, 0, 3] = False  # a query with no key
        return mask
    return None


def values_and_grads(fn, *inputs, variables=(), jit=False):
    """The values and gradients of `fn` as NumPy arrays, on every backend.

    `fn(*inputs)` returns `(outputs, loss)`: `outputs` a tensor or a
    list/tuple of them, `loss` a scalar. Returns the list `[*outputs,
    *d loss / d inputs, *d loss / d variables]`, with `inputs` NumPy arrays
    and `variables` Keras variables (a layer's `trainable_variables`).
    `jit=True` compiles the forward and backward passes with XLA
    (`tf.function(jit_compile=True)`, `jax.jit`); torch has no XLA compile.
    """
    inputs = list(inputs)
    variables = list(variables)
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        def f(values, *xs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                outputs, loss = fn(*xs)
            return loss, outputs

        argnums = tuple(range(len(inputs) + 1))
        value_and_grad = jax.value_and_grad(f, argnums, has_aux=True)
        if jit:
            value_and_grad = jax.jit(value_and_grad)
        (_, outputs), grads = value_and_grad([v.value for v in variables], *inputs)
        grads = list(grads[1:]) + list(grads[0])
    elif backend == "torch":
        if jit:
            raise NotImplementedError("torch has no XLA compile")
        xs = [
            keras.ops.convert_to_tensor(x).detach().requires_grad_(True)
            for x in inputs
        ]
        for v in variables:
            v.value.grad = None
        outputs, loss = fn(*xs)
        loss.backward()
        grads = [x.grad for x in xs] + [v.value.grad for v in variables]
    elif backend == "tensorflow":
        import tensorflow as tf

        def run(*xs):
            with tf.GradientTape() as tape:
                tape.watch(xs)
                outputs, loss = fn(*xs)
            return outputs, tape.gradient(loss, list(xs) + variables)

        if jit:
            run = tf.function(run, jit_compile=True)
        outputs, grads = run(*[tf.constant(x) for x in inputs])
    else:
        raise NotImplementedError(f"no gradients on the {backend} backend")
    return [numpy(x) for x in to_list(outputs) + list(grads)]


def make_layer(name, case, **overrides):
    return keras_attention.get(name, **{**case.kwargs, **overrides})


def call(layer, inputs, case, **kwargs):
    return layer(inputs, **{**case.call_kwargs, **kwargs})


def mask_arguments(layer, inputs, mask):
    """A padding mask as `layer.call` takes it: Keras's `mask=` (one per
    input of a list, `None` for an unmasked one), or, for a layer whose
    `call` declares no `mask` (Keras passes it only to one that does), the
    sequence contract's `query_mask`/`value_mask`/`key_mask`
    (docs/design.md, "The attention factory"); a single input attends to
    itself, its mask masks the values too."""
    parameters = inspect.signature(layer.call).parameters
    if "mask" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    ):
        return {"mask": mask}
    masks = list(mask) if isinstance(mask, (list, tuple)) else [mask]
    if not isinstance(inputs, (list, tuple)) or len(inputs) == 1:
        masks = masks[:1] * 2
    names = ("query_mask", "value_mask", "key_mask")
    return {n: m for n, m in zip(names, masks) if m is not None and n in parameters}


def symbolic_model(layer, inputs, case):
    symbols = [
        keras.Input(batch_shape=x.shape, dtype=str(x.dtype)) for x in to_list(inputs)
    ]
    outputs = call(layer, from_list(symbols, inputs), case)
    return keras.Model(from_list(symbols, inputs), first(outputs))


def tolerance_close(actual, expected, atol, what):
    actual, expected = np.asarray(actual, "float32"), np.asarray(expected, "float32")
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = max(1.0, float(np.abs(expected).max()))
    error = float(np.abs(actual - expected).max())
    assert error <= atol * scale, f"{what}: max abs error {error:.3g} > {atol * scale:.3g}"
