"""The package's shared argument checks (`keras_attention._validation`)."""

import re

import numpy as np
import pytest
from keras import ops

from keras_attention import _validation


def test_numpy_numbers_are_taken_and_bools_refused():
    # np.int64 (e.g. a length read from an array) was refused before.
    assert _validation.check_positive_int("n", np.int64(6)) == 6
    assert type(_validation.check_positive_int("n", np.int32(2))) is int
    assert _validation.check_pair("p", (np.int64(2), 3)) == (2, 3)
    assert _validation.check_rate("r", np.float32(0.25)) == 0.25
    for bad in (True, np.bool_(True), 0, np.int64(-1), 1.5):
        with pytest.raises(ValueError, match="`n`"):
            _validation.check_positive_int("n", bad)
    with pytest.raises(ValueError, match="`r`"):
        _validation.check_rate("r", np.bool_(False))


@pytest.mark.parametrize(
    "x", [np.zeros(3, "int64"), np.zeros(3, "uint8"), ops.zeros(3, "int32")]
)
def test_check_dtype_returns_keras_dtype_name(x):
    dtype = _validation.check_dtype("edges", x, "int", "integer node ids")
    assert "int" in dtype and dtype == str(np.dtype(dtype))


@pytest.mark.parametrize(
    "x, received",
    [
        (np.zeros(3, "float32"), "float32"),
        (np.zeros(3, bool), "bool"),
        (np.array(["a"]), "<U1"),
        (np.array([None]), "object"),
    ],
)
def test_check_dtype_names_the_argument(x, received):
    with pytest.raises(
        ValueError,
        match=rf"argument `edges`, expected integer node ids\. "
        rf"Received: edges\.dtype={received}$",
    ):
        _validation.check_dtype("edges", x, "int", "integer node ids")


def test_check_channels_last():
    assert _validation.check_channels_last("inputs", [None, 4, 4, 3]) == (
        None, 4, 4, 3
    )
    for shape in ((2, 4, 3), (2, 4, 4, None), (2, 1, 4, 4, 3)):
        with pytest.raises(
            ValueError,
            match=r"argument `inputs`, expected a rank-4 tensor \(B, H, W, C\) "
            r"with known channels\. Received: inputs\.shape="
            + re.escape(str(shape)),
        ):
            _validation.check_channels_last("inputs", shape)


def test_known_dim_takes_a_symbolic_dimension_as_unknown():
    # JAX traces a functional model's unknown dimensions as `jax.export`
    # symbols (tests/test_backends.py runs the layers on them).
    export = pytest.importorskip("jax.export")
    symbol = export.symbolic_shape("(d)", constraints=["d>=2"])[0]
    assert _validation.known_dim(symbol) is None
    assert _validation.known_dim(None) is None
    assert _validation.known_dim(np.int64(3)) == 3 and _validation.known_dim(3) == 3
