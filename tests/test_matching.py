"""Tests for keras_attention.matching against scipy's linear_sum_assignment."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from keras import ops  # noqa: E402
from scipy import optimize  # noqa: E402

from keras_attention.matching import linear_sum_assignment  # noqa: E402
from keras_attention.matching import matched_pairs  # noqa: E402

BACKEND = keras.backend.backend()


def compiled(fn):
    """The function compiled as a train step would be, on this backend."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


solve = compiled(linear_sum_assignment)


def random_costs(rng, batch, num_predictions, num_targets):
    """A batch mixing the hard kinds: ties, continuous, wide, negative."""
    shape = (batch, num_predictions, num_targets)
    kinds = [
        # Integer costs with few values: many optimal assignments tie.
        rng.integers(0, 3, shape).astype("float64"),
        rng.random(shape),
        # Magnitudes from 1e-4 to 1e6 inside one matrix, both signs.
        rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 6, shape),
        # Large negative and positive integers (exact in float32).
        rng.integers(-100_000, 100_000, shape).astype("float64"),
        # Rank one plus noise-free ties: cost[i, j] = a[i] + b[j].
        rng.integers(0, 4, (batch, num_predictions, 1))
        + rng.integers(0, 4, (batch, 1, num_targets)),
    ]
    return np.concatenate(kinds).astype("float32")


def assert_optimal(cost, assignment, target_mask=None):
    """Each assignment is one-to-one and as cheap as scipy's."""
    cost = np.asarray(cost, "float64")
    assignment = np.asarray(assignment)
    assert assignment.dtype == np.int32
    assert assignment.shape == cost.shape[:1] + cost.shape[2:]
    for b in range(cost.shape[0]):
        if target_mask is None:
            real = np.arange(cost.shape[2])
        else:
            real = np.flatnonzero(target_mask[b])
            np.testing.assert_array_equal(
                assignment[b][~np.asarray(target_mask[b])], -1
            )
        rows = assignment[b, real]
        assert rows.size == 0 or rows.min() >= 0
        assert rows.size == 0 or rows.max() < cost.shape[1]
        assert len(set(rows.tolist())) == len(real), "rows used twice"
        matrix = cost[b][:, real]
        ref_rows, ref_cols = optimize.linear_sum_assignment(matrix)
        expected = matrix[ref_rows, ref_cols].sum()
        received = matrix[rows, np.arange(len(real))].sum()
        scale = np.abs(matrix).max(initial=1.0) * max(len(real), 1)
        assert abs(received - expected) <= 1e-6 * scale, (b, received, expected)


# 6 shapes x 5 kinds x 20 matrices = 600 matrices, one compilation per shape.
@pytest.mark.parametrize(
    "num_predictions, num_targets",
    [(1, 1), (6, 6), (9, 4), (16, 16), (25, 7), (30, 30)],
)
def test_matches_scipy_total_cost(num_predictions, num_targets):
    rng = np.random.default_rng(num_predictions * 100 + num_targets)
    cost = random_costs(rng, 20, num_predictions, num_targets)
    assert_optimal(cost, solve(cost))


def test_target_mask_skips_padded_targets():
    rng = np.random.default_rng(1)
    cost = random_costs(rng, 20, 12, 8)
    target_mask = rng.random((cost.shape[0], 8)) < 0.6
    target_mask[0] = False  # an image with no boxes
    target_mask[1] = True
    # Padded costs are never read, even when they are not finite.
    cost = np.where(target_mask[:, None, :], cost, np.nan).astype("float32")
    assert_optimal(cost, solve(cost, target_mask), target_mask)


def test_unbatched_eager_and_example():
    cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    assignment = ops.convert_to_numpy(linear_sum_assignment(cost))
    np.testing.assert_array_equal(assignment, [1, 0, 2])
    assignment = linear_sum_assignment(cost, target_mask=[True, False, True])
    np.testing.assert_array_equal(ops.convert_to_numpy(assignment), [1, -1, 2])


def test_rectangular_eager_matches_scipy():
    rng = np.random.default_rng(2)
    cost = rng.random((2, 7, 5)).astype("float32")
    assert_optimal(cost, ops.convert_to_numpy(linear_sum_assignment(cost)))


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_float_dtypes(dtype):
    rng = np.random.default_rng(3)
    cost = rng.integers(0, 50, (10, 9, 6)).astype(dtype)
    assert_optimal(cost, solve(cost))


def test_zero_targets():
    assignment = linear_sum_assignment(np.zeros((3, 4, 0), "float32"))
    assert tuple(assignment.shape) == (3, 0)


def test_all_costs_equal_gives_a_permutation():
    cost = np.full((2, 5, 5), 7.0, "float32")
    assignment = ops.convert_to_numpy(solve(cost))
    for row in assignment:
        assert sorted(row.tolist()) == list(range(5))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.GradientTape")
def test_inside_compiled_train_step_with_tape():
    import tensorflow as tf

    rng = np.random.default_rng(4)
    logits = tf.Variable(rng.standard_normal((3, 10, 4)).astype("float32"))
    target_mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            cost = ops.square(logits)
            assignment = linear_sum_assignment(cost, target_mask)
            pairs = matched_pairs(assignment, num_predictions=10)
            loss = ops.sum(pairs * cost)
        return assignment, loss, tape.gradient(loss, logits)

    assignment, loss, grad = step()
    assert_optimal(np.square(logits.numpy()), assignment.numpy(), target_mask)
    pairs = ops.convert_to_numpy(matched_pairs(assignment, 10))
    # The gradient flows through the cost of the matched pairs only.
    expected = 2 * logits.numpy() * pairs
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-6)
    assert np.isfinite(loss.numpy())


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.TensorSpec")
def test_unknown_batch_size_compiles():
    import tensorflow as tf

    fn = tf.function(
        linear_sum_assignment,
        input_signature=[tf.TensorSpec((None, 8, 5), tf.float32)],
        jit_compile=True,
    )
    cost = np.random.default_rng(5).random((6, 8, 5)).astype("float32")
    assert_optimal(cost, fn(cost).numpy())


@pytest.mark.parametrize(
    "cost, target_mask, argument",
    [
        (np.zeros((4,), "float32"), None, "cost"),
        (np.zeros((1, 2, 4, 4), "float32"), None, "cost"),
        (np.zeros((2, 3, 5), "float32"), None, "cost"),  # N < M
        (np.zeros((2, 5, 3), "int32"), None, "cost"),
        (np.zeros((5, 3), "bool"), None, "cost"),
        (np.zeros((2, 5, 3), "float32"), np.ones((2, 4), bool), "target_mask"),
        (np.zeros((2, 5, 3), "float32"), np.ones((3,), bool), "target_mask"),
    ],
)
def test_invalid_input_raises(cost, target_mask, argument):
    with pytest.raises(ValueError, match=f"argument `{argument}`"):
        linear_sum_assignment(cost, target_mask)


def test_fewer_predictions_message_names_shape():
    with pytest.raises(ValueError, match=r"N >= M.*cost.shape=\(2, 3, 5\)"):
        linear_sum_assignment(np.zeros((2, 3, 5), "float32"))


def test_matched_pairs():
    assignment = np.array([[2, 0, -1], [1, 3, 0]], "int32")
    pairs = ops.convert_to_numpy(matched_pairs(assignment, 4))
    expected = np.zeros((2, 4, 3), "float32")
    for b in range(2):
        for j, i in enumerate(assignment[b]):
            if i >= 0:
                expected[b, i, j] = 1.0
    np.testing.assert_array_equal(pairs, expected)
    unbatched = ops.convert_to_numpy(matched_pairs(assignment[0], 4))
    np.testing.assert_array_equal(unbatched, expected[0])
    with pytest.raises(ValueError, match="argument `num_predictions`"):
        matched_pairs(assignment, -1)
    with pytest.raises(ValueError, match="argument `assignment`"):
        matched_pairs(np.zeros((1, 2, 3), "int32"), 4)
