"""Files saved before the layers' projections became keras sublayers load.

`tests/data/legacy/` holds, per layer, a small functional model saved with
the former code (raw `add_weight` kernels on the layer itself): its
`.weights.h5`, its `.keras` file and its outputs. The layers read that
layout (`ProjectionMixin.legacy_variables`), so both files load into the
current code and give the recorded outputs.
"""

import os

import keras
import numpy as np
import pytest

import keras_attention
from tests.cases_sequence import LUONG_GENERAL
from tests.harness import load_cases
from tests.harness import numpy
from tests.harness import symbolic_model

HERE = os.path.join(os.path.dirname(__file__), "data", "legacy")
CASES = dict(load_cases())
CASES["general"] = LUONG_GENERAL
NAMES = sorted(n for n in CASES if n != "scaled_dot_product")


def recorded(name):
    data = np.load(os.path.join(HERE, "outputs.npz"))
    xs = [data[k] for k in sorted(k for k in data if k.startswith(f"{name}/x"))]
    inputs = CASES[name].make_inputs(np.random.default_rng(0))
    inputs = xs if isinstance(inputs, (list, tuple)) else xs[0]
    return inputs, data[f"{name}/y"]


@pytest.mark.parametrize("name", NAMES)
def test_former_weights_file_loads(name, tmp_path):
    case = CASES[name]
    inputs, expected = recorded(name)
    kwargs = dict(case.kwargs)
    if name == "non_local":
        kwargs["mode"] = "concatenation"
    keras.utils.set_random_seed(1)  # other initial values than the file's
    layer = keras_attention.get(
        "scaled_dot_product" if name == "general" else name, **kwargs
    )
    model = symbolic_model(layer, inputs, case)
    model.load_weights(os.path.join(HERE, f"{name}.weights.h5"))
    np.testing.assert_allclose(numpy(model(inputs)), expected, atol=1e-5)
    # The next load is a normal one again (the sublayers load themselves).
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    model.load_weights(path)
    np.testing.assert_allclose(numpy(model(inputs)), expected, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_former_keras_file_loads(name):
    inputs, expected = recorded(name)
    model = keras.saving.load_model(os.path.join(HERE, f"{name}.keras"), safe_mode=True)
    np.testing.assert_allclose(numpy(model(inputs)), expected, atol=1e-5)
