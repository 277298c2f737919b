"""One harness that checks every registered layer the same way.

Each layer's case (constructor arguments, inputs, NumPy reference) lives in a
`tests/cases_*.py` file as `CASES = {"registry_name": LayerCase(...)}`;
`tests/test_harness.py` runs every check below on every name in
`keras_attention.names()`, so a layer is covered the moment it registers.
"""

import dataclasses
import glob
import importlib
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


def load_cases():
    cases = {}
    here = os.path.dirname(__file__)
    for path in sorted(glob.glob(os.path.join(here, "cases_*.py"))):
        module = importlib.import_module(
            "tests." + os.path.splitext(os.path.basename(path))[0]
        )
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


def make_layer(name, case, **overrides):
    return keras_attention.get(name, **{**case.kwargs, **overrides})


def call(layer, inputs, case, **kwargs):
    return layer(inputs, **{**case.call_kwargs, **kwargs})


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
