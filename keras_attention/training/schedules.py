"""Learning-rate schedules and weight keeping of the translation recipes."""

import warnings

import keras
import numpy as np


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
        self.budget, self.peak, self.warmup = budget, peak, warmup
        self.decay_fraction = decay_fraction
        self.verbose = verbose

    @property
    def step(self):
        """The step about to be taken (1 for the first)."""
        return int(self.model.optimizer.iterations) + 1

    def on_train_batch_begin(self, batch, logs=None):
        left = max(1.0 - self.budget.spent(), 0.0)
        rate = self.peak * min(
            self.step / self.warmup, 1.0, left / self.decay_fraction
        )
        self.model.optimizer.learning_rate = rate

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose:
            print(
                f"step {self.step}: learning rate "
                f"{float(self.model.optimizer.learning_rate):.2e}, "
                f"{self.budget.spent():.0%} of the budget spent",
                flush=True,
            )


@keras.saving.register_keras_serializable(package="keras_attention")
class InverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up, then `peak * sqrt(warmup / step)` (Vaswani et al.)."""

    def __init__(self, peak, warmup):
        self.peak = peak
        self.warmup = warmup

    def __call__(self, step):
        step = keras.ops.cast(step, "float32") + 1.0
        warm = step / self.warmup
        decay = keras.ops.sqrt(self.warmup / step)
        return self.peak * keras.ops.minimum(warm, decay)

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup}


class KeepBest(keras.callbacks.Callback):
    """Restores the weights of the epoch with the best validation figure.

    Each `fit` starts afresh. A `monitor` that the logs do not hold (a
    typo, or no validation data) is warned about, as keras's
    `EarlyStopping` does, and nothing is restored.

    Args:
        monitor: the logged figure, `"val_loss"` (the lowest is kept) or
            another (`"val_accuracy"`: the highest; the first epoch wins a
            tie).

    Example:

    ```python
    model.fit(x, y, validation_data=(x_val, y_val), epochs=5,
              callbacks=[KeepBest("val_accuracy")])
    ```
    """

    def __init__(self, monitor="val_loss"):
        super().__init__()
        self.monitor = monitor
        self.sign = 1.0 if monitor.endswith("loss") else -1.0
        self.best, self.weights = np.inf, None

    def on_train_begin(self, logs=None):
        self.best, self.weights = np.inf, None
        self._warned = False

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
        score = self.sign * value
        if score < self.best:
            self.best, self.weights = score, self.model.get_weights()

    def on_train_end(self, logs=None):
        if self.weights is not None:
            self.model.set_weights(self.weights)
