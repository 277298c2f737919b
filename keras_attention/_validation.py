"""Argument checks shared by the whole package, in keras's wording.

Every module (layers, applications, datasets) raises the same `ValueError`
for a bad argument: "Received an invalid value for argument `x`, expected
... Received: x=...".
"""

import contextlib
import numbers
import threading

import keras
import numpy as np


def invalid(argument, expected, value):
    """The ValueError keras raises for a bad argument, in keras's wording."""
    return ValueError(
        f"Received an invalid value for argument `{argument}`, expected "
        f"{expected}. Received: {argument}={value!r}"
    )


def check_positive_int(argument, value, allow_none=False):
    if value is None and allow_none:
        return None
    # NumPy's integers too (`len` of an array, `np.int64(6)`); a bool is not.
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, numbers.Integral
    ) or value <= 0:
        raise invalid(argument, "a positive integer", value)
    return int(value)


def check_positive_number(argument, value, allow_none=False, allow_zero=False):
    """A finite real number above 0 (at least 0 with `allow_zero`), NumPy's
    too; a bool, NaN or infinity is not. Returns it unchanged."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, numbers.Real
    ) or not np.isfinite(value) or not (value >= 0 if allow_zero else value > 0):
        expected = "a non-negative number" if allow_zero else "a positive number"
        raise invalid(argument, expected, value)
    return value


def check_bool(argument, value):
    """`True` or `False` (NumPy's too); anything else raises: `bool("False")`
    is `True`, so a string from a config file would switch a flag on."""
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(argument, "True or False", value)
    return bool(value)


def check_rate(argument, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, numbers.Real
    ) or not (0.0 <= value < 1.0):
        raise invalid(argument, "a float in [0, 1)", value)
    return float(value)


def check_pair(argument, value):
    """`(a, b)` from a positive int or a pair of positive ints."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        values = tuple(value)
    else:
        values = (value, value)
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, numbers.Integral
        ) or v <= 0:
            raise invalid(argument, "a positive integer or a pair of them", value)
    return tuple(int(v) for v in values)


def check_ids_in_range(argument, ids, stop, what, size):
    """Raise a ValueError unless every id of the array `ids` is in
    `[0, stop)`; `what` names the ids and `size` says where `stop` comes
    from (`"node ids"`, `"num_nodes=34"`)."""
    if ids.size:
        if ids.dtype.kind == "f" and not np.all(np.floor(ids) == ids):
            # A float array of whole numbers passes: keras hands models
            # float32 ids under a `tf.distribute` strategy.
            fraction = ids[np.floor(ids) != ids].flat[0]
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, expected "
                f"whole-number {what} in [0, {stop}) for {size}. "
                f"Received: {argument} with the value {fraction}"
            )
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= stop:
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, expected "
                f"{what} in [0, {stop}) for {size}. "
                f"Received: {argument} with values in [{low}, {high}]"
            )


def known_dim(dim):
    """A static dimension as an int, or `None` where it is unknown: `None`,
    or a symbolic dimension (JAX traces a functional model's unknown
    dimensions as `jax.export` symbols, which `int()` refuses)."""
    return int(dim) if isinstance(dim, numbers.Integral) else None


def exporting(*shapes):
    """Whether a size of `shapes` is a JAX symbol or torch-traced (inside
    an export: the values then are no user's)."""
    return any(
        d is not None and known_dim(d) is None for s in shapes for d in s
    )


def traced_by_torch(dim):
    """Whether `dim` is a size recorded by `torch.jit.trace`: keras's ONNX
    export on torch gives every size as a 0-d tensor (its traced value,
    1 where the export's signature left it unknown)."""
    if dim is None or isinstance(dim, int):
        return False  # (and `torch.compile` traces this test, not the next)
    return type(dim).__module__.startswith("torch")


def torch_compiling():
    """Whether `torch.compile` traces this call: a check that reads a
    tensor's values (into NumPy) would break its graph, so it is left to
    eager calls."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.compiler.is_compiling()


def shape_fits(shape, expected):
    """Whether a static `shape` can be `expected`: the same rank, and equal
    wherever both dimensions are known (`None` is unknown)."""
    shape, expected = tuple(shape), tuple(expected)
    return len(shape) == len(expected) and all(
        d is None or e is None or d == e for d, e in zip(shape, expected)
    )


def check_dtype(argument, x, kind, expected):
    """`x`'s dtype as keras names it (`"int32"`), or a ValueError naming
    `argument` unless the name contains `kind` (`"int"`, `"float"`);
    `expected` says what was expected (`"integer node ids"`)."""
    try:
        dtype = keras.backend.standardize_dtype(x.dtype)
    except ValueError:  # NumPy strings and objects have no keras dtype
        dtype = str(x.dtype)
    if kind not in dtype:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"{expected}. Received: {argument}.dtype={dtype}"
        )
    return dtype


def check_channels_last(argument, shape):
    """Raise a ValueError unless `shape` is a feature map `(B, H, W, C)`
    with known channels `C`."""
    shape = tuple(shape)
    if len(shape) != 4 or shape[-1] is None:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            "a rank-4 tensor (B, H, W, C) with known channels. Received: "
            f"{argument}.shape={shape}"
        )
    return shape


def check_image_inputs(inputs, image_shape, argument="images"):
    """Raise a ValueError if `inputs` is not `(B, *image_shape)`.

    Dimensions unknown while tracing are not compared.
    """
    expected = (None,) + tuple(image_shape)
    if not hasattr(inputs, "shape"):  # a list or dict of several arrays
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"one batch of images of shape {expected} (batch, height, width, "
            f"channels). Received: a {type(inputs).__name__}"
            + (f" of {len(inputs)} arrays" if hasattr(inputs, "__len__") else "")
        )
    shape = tuple(inputs.shape)
    if not shape_fits(shape, expected):
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a batch of images of shape {expected} (batch, height, width, "
            f"channels). Received: {argument}.shape={shape}"
        )
    kind = getattr(getattr(inputs, "dtype", None), "kind", None)
    if kind in ("U", "S", "O"):  # NumPy text or objects: Keras's "str32"
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"images of numbers. Received: {argument}.dtype={inputs.dtype}"
        )


def check_texts(texts):
    """A list of strings (bytes decoded) from `texts`; a `ValueError` else."""
    if isinstance(texts, str):
        raise invalid("texts", "a list of strings, not one string", texts)
    texts = list(texts.tolist() if isinstance(texts, np.ndarray) else texts)
    for i, text in enumerate(texts):
        if isinstance(text, bytes):
            texts[i] = text.decode("utf-8")
        elif not isinstance(text, str):
            raise ValueError(
                "Received an invalid value for argument `texts`, expected "
                f"strings. Received: texts[{i}]={text!r}"
            )
    return texts


def is_symbolic(x):
    """Whether `x` is a tensor without values: a `KerasTensor`, a TensorFlow
    graph tensor, a JAX tracer or any tensor while `torch.compile` traces
    (data, not its values, is known)."""
    if isinstance(x, keras.KerasTensor):
        return True
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.is_symbolic_tensor(x)
    if backend == "jax":
        import jax

        return isinstance(x, jax.core.Tracer)
    if backend == "torch":
        import torch

        return torch.compiler.is_compiling()
    return False


def check_known_ids(argument, ids, stop, what, size):
    """`check_ids_in_range` on `ids` whose values are known: a NumPy array
    or an eager tensor (not a dataset's spec nor a traced tensor, which are
    left to the model). An id outside an embedding is a gather error on
    TensorFlow and a silent clamp (garbage) elsewhere or under XLA."""
    if _collected() is not None:
        check_batch_ids(argument, ids, stop, what, size)
        return
    known = isinstance(ids, np.ndarray) or (
        keras.ops.is_tensor(ids) and not is_symbolic(ids)
    )
    if known:
        check_ids_in_range(
            argument, keras.ops.convert_to_numpy(ids), stop, what, size
        )


# The checks of a `tf.data` pipeline's batches: while `batch_checks()` is
# open (in this thread), `check_known_ids` and `check_batch_length` add
# TensorFlow assertions on the batch's tensors to its list instead of
# checking values they cannot see. `InputChecks` maps a dataset given to
# `fit`, `evaluate` or `predict` through them: the assertions run in the
# input pipeline, never under XLA (which drops them), on every backend.
_state = threading.local()


def _collected():
    return getattr(_state, "checks", None)


def batch_checks_open():
    return _collected() is not None


@contextlib.contextmanager
def batch_checks():
    """Collect the assertions on a `tf.data` batch's tensors; see above."""
    previous, _state.checks = _collected(), []
    try:
        yield _state.checks
    finally:
        _state.checks = previous


def check_batch_ids(argument, ids, stop, what, size, ignored=None):
    """While `batch_checks()` is open, an assertion that the TensorFlow
    tensor `ids` holds whole numbers in `[0, stop)` (`ignored` passes), with
    the message of `check_ids_in_range`."""
    import tensorflow as tf

    checks = _collected()
    if checks is None or not tf.is_tensor(ids) or ids.dtype == tf.string:
        return
    values = tf.reshape(ids, [-1])
    if ignored is not None:
        values = tf.boolean_mask(values, tf.not_equal(values, ignored))
    expected = f"{what} in [0, {stop}) for {size}"
    message = f"Received an invalid value for argument `{argument}`, expected"
    if values.dtype.is_floating:
        checks.append(tf.debugging.Assert(
            tf.reduce_all(tf.equal(tf.floor(values), values)),
            [f"{message} whole-number {expected}. Received: {argument} "
             "with values that are not whole numbers"],
        ))
    low, high = tf.reduce_min(values), tf.reduce_max(values)  # none: pass
    checks.append(tf.debugging.Assert(
        tf.logical_or(tf.equal(tf.size(values), 0), tf.logical_and(
            low >= 0, high < tf.cast(stop, values.dtype)
        )),
        [f"{message} {expected}. Received: {argument} with values in",
         low, high],
    ))


def check_batch_length(argument, ids, axis, limit, size):
    """While `batch_checks()` is open, an assertion that the TensorFlow
    tensor `ids` is at most `limit` long on `axis` (`size` says where the
    limit comes from: "the position table of 32 rows")."""
    import tensorflow as tf

    checks = _collected()
    if checks is None or not tf.is_tensor(ids):
        return
    length = tf.shape(ids)[axis]
    checks.append(tf.debugging.Assert(
        length <= limit,
        [f"Received an invalid value for argument `{argument}`, expected at "
         f"most {limit} on axis {axis} ({size}). Received: a batch of "
         f"{argument} of length", length],
    ))
