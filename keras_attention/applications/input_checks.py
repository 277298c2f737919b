"""`InputChecks`: the applications' checks of `call`, `fit`, `evaluate`
and `predict` (inputs by shape and known values, and the labels of a
sparse loss), before keras traces anything."""

import inspect

import keras
import numpy as np
from keras import ops

from keras_attention import _validation


def bind(method, x, y, args, kwargs):
    """`{name: value}` of a call of keras's `fit` or `evaluate` (`method`)."""
    signature = inspect.signature(method)
    return signature.bind(None, x, y, *args, **kwargs).arguments


def batch_size(x):
    """The static batch size of inputs `x` (an array, a list or dict of
    them), or `None`."""
    for leaf in keras.tree.flatten(x):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape):
            return _validation.known_dim(shape[0])
    return None


class InputChecks:
    """Checks the inputs of `call`, `fit`, `evaluate` and `predict`.

    `call` sees static shapes only on the first trace: `fit` and `predict`
    relax the traced shapes when they are called again with other shapes, so
    the data given to them is checked here too, before any tracing.
    Subclasses implement `check_inputs(inputs)`, which reads `inputs.shape`
    (or the shapes of a list of inputs) and raises a `ValueError`.
    """

    def check_inputs(self, inputs):
        pass

    def label_ids(self, x):
        """What the sparse cross-entropy takes as the labels `y` of inputs
        `x`: `(shape, stop, size)`, class ids of static `shape` (`None` where
        any size goes) in `[0, stop)`, `size` saying where `stop` comes from
        (`"num_classes=3"`); `None` when the labels are not class ids.
        Subclasses whose loss reads class ids implement it."""
        return None

    def _check_labels(self, argument, x, y):
        """A `ValueError` naming `argument` for labels the sparse loss the
        model was compiled with cannot take, before `fit` or `evaluate`
        trace anything: of another shape (a failed first trace left keras's
        `fit` unable to run again), not whole numbers, or outside
        `[0, stop)` (under XLA, the default of the translators and the
        language model on every device, the loss is then NaN and `fit`
        turns every weight to NaN without an error). Ids equal to the
        loss's `ignore_class` pass.

        Returns `y`, without the trailing axis of 1 that keras's loss also
        takes when it had one (an array or eager tensor): labels given both
        ways to one model otherwise changed the rank keras's `fit` had
        traced, and it failed ("Cannot take the length of shape with
        unknown rank")."""
        loss = getattr(self, "loss", None)
        sparse = isinstance(loss, keras.losses.SparseCategoricalCrossentropy) or (
            loss in ("sparse_categorical_crossentropy",
                     keras.losses.sparse_categorical_crossentropy)
        )
        if y is None or not sparse or not hasattr(y, "shape"):
            return y
        spec = self.label_ids(x)
        if spec is None:
            return y
        shape, stop, size = spec
        got = tuple(y.shape)
        if not (
            _validation.shape_fits(got, shape)
            or _validation.shape_fits(got, tuple(shape) + (1,))
        ):
            one_hot = _validation.shape_fits(got, tuple(shape) + (stop,))
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, expected "
                f"class ids of shape {tuple(shape)} in [0, {stop}) for {size} "
                "(the loss is the sparse categorical cross-entropy)"
                + ("; for one-hot labels compile with "
                   "`loss=\"categorical_crossentropy\"`" if one_hot else "")
                + f". Received: {argument}.shape={got}"
            )
        if _validation.batch_checks_open():  # a dataset's batch
            _validation.check_batch_ids(
                argument, y, stop, "class ids", size,
                ignored=getattr(loss, "ignore_class", None),
            )
        elif not _validation.is_symbolic(y) and (
            isinstance(y, np.ndarray) or ops.is_tensor(y)
        ):
            ids = np.asarray(ops.convert_to_numpy(y))
            ignored = getattr(loss, "ignore_class", None)
            if ignored is not None:
                ids = ids[ids != ignored]
            _validation.check_ids_in_range(argument, ids, stop, "class ids", size)
            if len(got) == len(shape) + 1:
                return ops.squeeze(y, -1) if ops.is_tensor(y) else y[..., 0]
        return y

    def _check_fit_labels(self, method, x, y, args, kwargs):
        """`(y, kwargs)` of a call of keras's `fit` or `evaluate`
        (`method`), `_check_labels` done on `y` and on `validation_data`'s
        labels (given by keyword)."""
        given = bind(method, x, y, args, kwargs)
        spec = getattr(x, "element_spec", None)  # a tf.data.Dataset
        if isinstance(spec, tuple) and len(spec) >= 2 and y is None:
            self._check_labels("y", spec[0], spec[1])
        else:
            y = self._check_labels("y", x, y)
        validation = given.get("validation_data")
        if isinstance(validation, (list, tuple)) and len(validation) >= 2:
            labels = self._check_labels(
                "validation_data[1]", validation[0], validation[1]
            )
            if "validation_data" in kwargs:
                kwargs = dict(kwargs, validation_data=(
                    validation[0], labels, *validation[2:]
                ))
        return y, kwargs

    def _single_input(self, inputs):
        """`inputs` as `check_inputs` reads them, or `None` to leave them
        to keras.

        A model that takes a dict (BERT's token ids and types) checks it as
        it is. A model of one input given a dict (a `tf.data` pipeline of
        `{"images": ...}`) takes the entry named as its input, or the only
        entry, as keras matches it; other dicts are keras's to match.
        """
        if not isinstance(inputs, dict):
            return inputs
        struct = getattr(self, "_inputs_struct", None)
        if getattr(self, "takes_dict_inputs", False) or isinstance(struct, dict):
            return inputs
        name = getattr(struct, "name", None)
        if name in inputs:
            return inputs[name]
        if len(inputs) == 1 and not isinstance(struct, (list, tuple)):
            return next(iter(inputs.values()))
        return None

    def _check_data(self, x):
        """`x` checked by its static shapes (a dataset by its spec), now;
        returns `x`, a dataset mapped through the checks of its batches'
        values (`_checked_batches`)."""
        spec = getattr(x, "element_spec", None)  # a tf.data.Dataset
        data = x
        if spec is not None:
            x = spec[0] if isinstance(spec, tuple) else spec
        x = self._single_input(x)
        if x is None:
            return data
        items = list(x.values()) if isinstance(x, dict) else (
            x if isinstance(x, (list, tuple)) else [x]
        )
        if not items or not all(hasattr(item, "shape") for item in items):
            return data
        if any(getattr(item.shape, "rank", 0) is None for item in items):
            # tf.numpy_function / py_function in a tf.data map (keras's
            # own error: "as_list() is not defined on an unknown TensorShape").
            raise ValueError(
                "Received an invalid value for argument `x`, expected a "
                "dataset whose inputs have a known rank (after "
                "`tf.numpy_function` or `tf.py_function`, set it with "
                "`tf.ensure_shape`). Received: an input of shape "
                f"{next(i.shape for i in items if i.shape.rank is None)}"
            )
        self.check_inputs(x)
        return self._checked_batches(data) if spec is not None else data

    def _checked_batches(self, dataset):
        """`dataset` (a `tf.data.Dataset`) mapped through the checks of
        `check_inputs` and of the labels on each batch's values, which its
        spec does not hold: ids outside an embedding (a silent clamp on JAX,
        torch and under XLA), rows longer than a position table. They run
        in the input pipeline as TensorFlow assertions, so under XLA and on
        every backend too, and fail with `check_inputs`'s message."""
        import tensorflow as tf

        if not isinstance(dataset, tf.data.Dataset):
            return dataset
        spec = dataset.element_spec
        found = []

        def check(*element):
            with _validation.batch_checks() as checks:
                inputs = self._single_input(element[0])
                if inputs is not None:
                    self.check_inputs(inputs)
                if len(element) >= 2 and isinstance(spec, tuple):
                    self._check_labels("y", element[0], element[1])
            found.extend(checks)
            if checks:
                with tf.control_dependencies(checks):
                    element = tf.nest.map_structure(
                        lambda t: tf.identity(t) if tf.is_tensor(t) else t,
                        element,
                    )
            return element if isinstance(spec, tuple) else element[0]

        checked = dataset.map(check)  # traced now
        return checked if found else dataset  # images: nothing to check

    def _checked_validation(self, kwargs):
        validation = kwargs.get("validation_data")
        if validation is not None and hasattr(validation, "element_spec"):
            kwargs = dict(kwargs, validation_data=self._check_data(validation))
        return kwargs

    def _keeping_values(self, run, build_optimizer=False):
        """`run()`; on Keras's JAX backend, the variables' values put back
        where it raised. Keras's JAX `fit`, `evaluate` and `predict` take
        the values out of the variables while they run and put them back
        from the last step's state: an error in the first step (a batch
        failing `_checked_batches`) left every weight empty, the model
        unusable ("'NoneType' object is not callable")."""
        if keras.backend.backend() != "jax":
            return run()
        optimizer = getattr(self, "optimizer", None)
        if build_optimizer and optimizer is not None and not optimizer.built:
            optimizer.build(self.trainable_variables)  # as keras's fit would
        kept = [(v, v._value) for v in self._state_variables()]
        try:
            return run()
        except BaseException:
            for variable, value in kept:
                if variable._value is None:
                    variable._value = value
            for variable in self._state_variables():
                if variable._value is None:  # a metric built by this call
                    variable._value = keras.ops.zeros(
                        variable.shape, variable.dtype
                    )
            raise

    def _state_variables(self):
        optimizer = getattr(self, "optimizer", None)
        return (
            list(self.variables)
            + (list(optimizer.variables) if optimizer is not None else [])
            + list(self.metrics_variables)
        )

    def fit(self, x=None, y=None, *args, **kwargs):
        x = self._check_data(x)
        y, kwargs = self._check_fit_labels(keras.Model.fit, x, y, args, kwargs)
        kwargs = self._checked_validation(kwargs)
        return self._keeping_values(
            lambda: super(InputChecks, self).fit(x, y, *args, **kwargs),
            build_optimizer=True,
        )

    def evaluate(self, x=None, y=None, *args, **kwargs):
        x = self._check_data(x)
        y, kwargs = self._check_fit_labels(
            keras.Model.evaluate, x, y, args, kwargs
        )
        return self._keeping_values(
            lambda: super(InputChecks, self).evaluate(x, y, *args, **kwargs)
        )

    def predict(self, x, *args, **kwargs):
        x = self._check_data(x)
        return self._keeping_values(
            lambda: super(InputChecks, self).predict(x, *args, **kwargs)
        )

    def call(self, inputs, training=None, mask=None):
        single = self._single_input(inputs)
        if single is not None:
            self.check_inputs(single)
            if isinstance(inputs, dict) and not isinstance(single, dict):
                inputs = single
                mask = self._single_input(mask) if isinstance(mask, dict) else mask
        return super().call(inputs, training=training, mask=mask)
