"""Time budgets: the CPU time of this process and a callback that stops `fit`."""

import time

import keras

from keras_attention._validation import check_positive_number


def cpu_seconds():
    """CPU seconds of this process, all threads (user + system).

    CPU time stands in for wall time on dedicated cores when the machine is
    shared: 45 minutes on 2 cores are 5,400 CPU-seconds.
    """
    return time.process_time()


class TimeBudget(keras.callbacks.Callback):
    """Stops `fit` once a wall-clock or a CPU-time budget is spent.

    Args:
        seconds: wall-clock budget in seconds, counted from `start`; `None`
            or 0 for none.
        cpu_seconds: CPU-time budget (`cpu_seconds()`, all threads) counted
            from `cpu_start`; `None` or 0 for none.
        start: `time.time()` the budget counts from (e.g. before the data
            is made), shared by every `fit` the callback is given to;
            `None`: when each `fit` begins (a callback reused for a second
            `fit` gets the budget again).
        cpu_start: the same for the CPU time.

    `spent()` is the larger fraction of the two budgets used so far (read by
    `BudgetLinearDecay`); `steps` counts the training steps of the current
    `fit`.
    """

    def __init__(self, seconds=None, cpu_seconds=None, start=None, cpu_start=None):
        super().__init__()
        self.seconds = check_positive_number(
            "seconds", seconds, allow_none=True, allow_zero=True
        )
        self.cpu_seconds = check_positive_number(
            "cpu_seconds", cpu_seconds, allow_none=True, allow_zero=True
        )
        self.start = start
        self.cpu_start = cpu_start
        self._given = (start, cpu_start)
        self.steps = 0

    def on_train_begin(self, logs=None):
        given_start, given_cpu_start = self._given
        if given_start is None:
            self.start = time.time()
        if given_cpu_start is None:
            self.cpu_start = cpu_seconds()
        self.steps = 0

    def spent(self):
        """The fraction of the budget used so far (the larger of the two)."""
        fractions = [0.0]
        if self.seconds:
            fractions.append((time.time() - self.start) / self.seconds)
        if self.cpu_seconds:
            fractions.append((cpu_seconds() - self.cpu_start) / self.cpu_seconds)
        return max(fractions)

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.spent() > 1.0:
            self.model.stop_training = True
