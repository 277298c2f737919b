"""Tests of keras_attention.training: budgets, schedules, recipes."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention import training  # noqa: E402


def tiny_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def test_time_budget_stops_fit_and_reports_the_fraction_spent():
    x, y = np.zeros((64, 3)), np.zeros((64, 1))
    budget = training.TimeBudget(seconds=1e-9)
    history = tiny_model().fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[budget])
    assert len(history.history["loss"]) == 1 and budget.steps == 1
    assert budget.spent() > 1.0
    assert training.TimeBudget().spent() == 0.0  # no budget: nothing spent


def test_budget_linear_decay_warms_up_then_decays_with_the_budget():
    class Half(training.TimeBudget):
        def spent(self):
            return 0.85

    model = tiny_model()
    schedule = training.BudgetLinearDecay(Half(), peak=1.0, warmup=4, verbose=False)
    schedule.set_model(model)
    schedule.on_train_batch_begin(0)
    assert float(model.optimizer.learning_rate) == 0.25  # step 1 of 4
    model.optimizer.iterations.assign(10)
    schedule.on_train_batch_begin(0)
    np.testing.assert_allclose(float(model.optimizer.learning_rate), 0.5)


def test_inverse_sqrt_and_detr_optimizer():
    schedule = training.InverseSqrt(peak=1.0, warmup=4)
    np.testing.assert_allclose(float(schedule(3)), 1.0)
    np.testing.assert_allclose(float(schedule(15)), 0.5)
    assert keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(schedule)
    ).get_config() == {"peak": 1.0, "warmup": 4}
    optimizer = training.detr_optimizer(1000)
    assert isinstance(optimizer, keras.optimizers.AdamW)
    assert optimizer.global_clipnorm == 1.0


def test_random_shift_moves_images_and_fills_zeros():
    images = np.ones((5, 4, 4, 1), "float32")
    shifted = training.random_shift(images, 1, np.random.default_rng(0))
    assert shifted.shape == images.shape
    assert set(np.unique(shifted)) <= {0.0, 1.0}
    assert training.random_shift(images, 0, None) is images
    assert set(training.IMAGE_RECIPES) >= {"vit_digits", "cbam_resnet_digits"}
