"""All-or-nothing weight assignment for the layers and the applications.

Keras's `set_weights` assigns the weights one by one and raises at the
first one of another shape, leaving those before it changed; a model's
`load_weights` of a file made for another configuration raises after
loading what fitted. `AllOrNothingWeights` checks every shape before
assigning any (naming the weight that does not fit, by index and path),
and both put every variable back when assigning fails (a value that does
not convert to its variable's dtype, a file made for another model)."""

import contextlib

import numpy as np


@contextlib.contextmanager
def _restored_on_failure(variables):
    """Puts `variables` back to their values from before the block when it
    raises."""
    variables = list(variables)
    before = [v.numpy() for v in variables]  # faster on TF than convert_to_numpy
    try:
        yield
    except Exception:
        for variable, value in zip(variables, before):
            variable.assign(value)
        raise


class AllOrNothingWeights:
    """`set_weights` and `load_weights` that change nothing when they fail."""

    def set_weights(self, weights):
        """keras's `set_weights(weights)`, every shape checked first."""
        variables = self.weights
        if len(variables) == len(weights):  # else keras's own error
            for index, (variable, value) in enumerate(zip(variables, weights)):
                shape = tuple(getattr(value, "shape", np.shape(value)))
                if tuple(variable.shape) != shape:
                    raise ValueError(
                        f"Received an invalid value for argument `weights` of "
                        f"{type(self).__name__} '{self.name}': weights[{index}] "
                        f"has shape {shape}, where the weight {variable.path} "
                        f"has shape {tuple(variable.shape)}. No weight was "
                        "assigned."
                    )
        with _restored_on_failure(variables):
            # A value of the right shape that does not convert (strings)
            # raised after the weights before it were assigned.
            return super().set_weights(weights)

    def load_weights(self, filepath, *args, **kwargs):
        """keras's `Model.load_weights`; when it fails, every variable
        (optimizer's included) gets its value from before the call back."""
        variables = list(self.variables)
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "variables"):
            variables += list(optimizer.variables)
        with _restored_on_failure(variables):
            return super().load_weights(filepath, *args, **kwargs)
