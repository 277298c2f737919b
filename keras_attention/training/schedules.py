"""Learning-rate schedules and weight keeping of the translation recipes."""

import numbers
import warnings

import keras
import numpy as np

from keras_attention._validation import check_positive_number
from keras_attention._validation import invalid


class BudgetLinearDecay(keras.callbacks.Callback):
    """Warm-up, a constant rate, then linear decay to zero as the budget ends.

    A budget-aware "warm-up, stable, decay" schedule (linear decay by the
    budget: Li, Yumer and Ramanan, "Budgeted training", ICLR 2020): the
    number of steps a time budget allows is not known in advance, so the
    decay follows the fraction of the budget spent, read from a
    `TimeBudget` callback before every step:
    `lr = peak * min(step / warmup, 1, (1 - spent) / decay_fraction)`.
    `decay_fraction=1` decays over the whole budget. A schedule that never
    anneals (inverse square root) leaves a time-limited model where the
    loss is still falling fast.

    Args:
        budget: the `TimeBudget` of the same `fit`.
        peak: the learning rate after the warm-up.
        warmup: warm-up steps.
        decay_fraction: the final fraction of the budget spent decaying.
        verbose: print the rate and the budget spent after every epoch.
    """

    def __init__(self, budget, peak, warmup, decay_fraction=0.3, verbose=True):
        super().__init__()
        from keras_attention.training.budget import TimeBudget

        if not isinstance(budget, TimeBudget):
            raise invalid("budget", "a TimeBudget (given to the same fit)", budget)
        self.budget = budget
        self.peak = check_positive_number("peak", peak)
        self.warmup = check_positive_number("warmup", warmup)
        if isinstance(decay_fraction, (bool, np.bool_)) or not isinstance(
            decay_fraction, numbers.Real
        ) or not 0.0 < decay_fraction <= 1.0:
            raise invalid("decay_fraction", "a float in (0, 1]", decay_fraction)
        self.decay_fraction = float(decay_fraction)
        self.verbose = verbose

    @property
    def step(self):
        """The step about to be taken (1 for the first)."""
        return int(self.model.optimizer.iterations) + 1

    def on_train_batch_begin(self, batch, logs=None):
        budget = self.budget
        if (budget.seconds and budget.start is None) or (
            budget.cpu_seconds and budget.cpu_start is None
        ):
            # It failed here with "unsupported operand ... NoneType".
            raise ValueError(
                "BudgetLinearDecay reads a TimeBudget that has not started: "
                "give that TimeBudget to the same `fit`'s callbacks "
                "(`callbacks=[budget, schedule]`)."
            )
        left = max(1.0 - self.budget.spent(), 0.0)
        rate = self.peak * min(
            self.step / self.warmup, 1.0, left / self.decay_fraction
        )
        self.model.optimizer.learning_rate = rate

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose:
            print(
                f"step {self.step - 1}: learning rate "
                f"{float(self.model.optimizer.learning_rate):.2e}, "
                f"{self.budget.spent():.0%} of the budget spent",
                flush=True,
            )


@keras.saving.register_keras_serializable(package="keras_attention")
class InverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up, then `peak * sqrt(warmup / step)` (Vaswani et al.).

    `lr(step) = peak * min(step / warmup, sqrt(warmup / step))` with `step`
    counted from 1 for the first update (`optimizer.iterations + 1`): the
    rate reaches `peak` at step `warmup`. Vaswani et al.'s schedule is
    `peak = d_model ** -0.5 * warmup ** -0.5`.

    Args:
        peak: the learning rate at the end of the warm-up (positive).
        warmup: warm-up steps (positive).
    """

    def __init__(self, peak, warmup):
        self.peak = check_positive_number("peak", peak)
        self.warmup = check_positive_number("warmup", warmup)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32") + 1.0
        warm = step / self.warmup
        decay = keras.ops.sqrt(self.warmup / step)
        return self.peak * keras.ops.minimum(warm, decay)

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup}


# Figures where lower is better, as `mode="auto"` reads a monitor's name.
_LOWER_IS_BETTER = (
    "loss", "error", "mae", "mse", "mape", "msle", "crossentropy",
    "perplexity", "hinge",
)


class KeepBest(keras.callbacks.Callback):
    """Restores the weights of the epoch with the best validation figure.

    Each `fit` starts afresh. A `monitor` that the logs do not hold (a
    typo, or no validation data) is warned about, as keras's
    `EarlyStopping` does, and nothing is restored.

    Args:
        monitor: the logged figure, e.g. `"val_loss"` or `"val_accuracy"`.
        mode: `"min"` (the lowest is kept), `"max"` (the highest), or
            `"auto"`: the direction of the model's metric of that name,
            as keras's `EarlyStopping` reads it (KL divergence, Poisson,
            log-cosh: `"min"`); else `"min"` for a loss or an error (a
            name holding "loss", "error", "mae", "mse", "mape", "msle",
            "crossentropy", "perplexity" or "hinge"), else `"max"`. The
            first epoch wins a tie.

    Example:

    ```python
    model.fit(x, y, validation_data=(x_val, y_val), epochs=5,
              callbacks=[KeepBest("val_accuracy")])
    ```
    """

    def __init__(self, monitor="val_loss", mode="auto"):
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise invalid("mode", "one of 'auto', 'min', 'max'", mode)
        self._auto = mode == "auto"
        if self._auto:
            name = monitor.lower()
            lower = any(word in name for word in _LOWER_IS_BETTER)
            mode = "min" if lower else "max"
        self.monitor, self.mode = monitor, mode
        self.sign = 1.0 if mode == "min" else -1.0
        self.best, self.weights = np.inf, None
        self._direction_read = not self._auto

    def on_train_begin(self, logs=None):
        self.best, self.weights = np.inf, None
        self._warned = False
        self._direction_read = not self._auto

    def _read_direction(self):
        """The named metric's own direction (keras's `_direction`), once
        the model's metrics are built (after the first step)."""
        self._direction_read = True
        name = self.monitor.removeprefix("val_")
        found = []
        for metric in getattr(self.model, "metrics", []):
            found += getattr(metric, "metrics", [metric])
        for metric in found:
            direction = getattr(metric, "_direction", None)
            if metric.name == name and direction in ("up", "down"):
                self.mode = "max" if direction == "up" else "min"
                self.sign = 1.0 if self.mode == "min" else -1.0

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            if not getattr(self, "_warned", False):
                self._warned = True
                warnings.warn(
                    f"KeepBest conditioned on the figure `{self.monitor}`, "
                    "which is not in the logs: no weights will be restored. "
                    f"Available figures: {sorted(logs or {})}",
                    stacklevel=2,
                )
            return
        if not self._direction_read:
            self._read_direction()
        score = self.sign * value
        if score < self.best:
            self.best, self.weights = score, self.model.get_weights()

    def on_train_end(self, logs=None):
        if self.weights is not None:
            self.model.set_weights(self.weights)
