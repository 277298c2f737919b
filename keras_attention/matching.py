"""Exact linear sum assignment (Hungarian matching) on `keras.ops`.

DETR's set-prediction loss matches every ground-truth box to one distinct
query by minimising a matching cost. `scipy.optimize.linear_sum_assignment`
does this on the host; the functions here do it on the device, inside a
compiled train step (`jit_compile=True` on TensorFlow, `jax.jit` on JAX), with
static shapes and bounded loops only.

Shape letters: `B` batch, `N` predictions (queries, rows of the cost), `M`
targets (ground-truth objects, columns of the cost), `N >= M`.
"""

from keras import ops

from keras_attention._validation import check_dtype
from keras_attention._validation import shape_fits


def _check_inputs(cost, target_mask):
    """`(cost, target_mask, dtype)` checked: shapes, float dtype, N >= M."""
    cost = ops.convert_to_tensor(cost)
    rank = len(cost.shape)
    if rank not in (2, 3):
        raise ValueError(
            "Received an invalid value for argument `cost`, expected a "
            "tensor of rank 3 `(B, N, M)` or rank 2 `(N, M)`. "
            f"Received: cost.shape={tuple(cost.shape)}"
        )
    dtype = check_dtype("cost", cost, "float", "a floating-point tensor")
    num_predictions, num_targets = cost.shape[-2], cost.shape[-1]
    if num_predictions is None or num_targets is None:
        raise ValueError(
            "Received an invalid value for argument `cost`, expected the "
            "last two dimensions `(N, M)` to be known statically. "
            f"Received: cost.shape={tuple(cost.shape)}"
        )
    if num_predictions < num_targets:
        raise ValueError(
            "Received an invalid value for argument `cost`, expected at "
            "least as many predictions as targets (N >= M in `(B, N, M)`). "
            f"Received: cost.shape={tuple(cost.shape)}"
        )
    if target_mask is not None:
        target_mask = ops.convert_to_tensor(target_mask)
        expected = tuple(cost.shape[:-2]) + (num_targets,)
        received = tuple(target_mask.shape)
        if not shape_fits(received, expected):
            raise ValueError(
                "Received an invalid value for argument `target_mask`, "
                f"expected shape {expected} to match `cost` of shape "
                f"{tuple(cost.shape)}. "
                f"Received: target_mask.shape={received}"
            )
        target_mask = ops.cast(target_mask, "bool")

    return cost, target_mask, dtype


def linear_sum_assignment(cost, target_mask=None):
    """Exact minimum-cost assignment of targets to predictions (Hungarian).

    Solves, for every batch element, the rectangular assignment problem

    ```
    minimise  sum_j cost[assignment[j], j]
    over      assignment: {0..M-1} -> {0..N-1} one-to-one
    ```

    with the shortest augmenting path method of Jonker and Volgenant in the
    form Crouse (2016) gives for rectangular problems (the method scipy's
    `linear_sum_assignment` uses). Targets are added one at a time; for each,
    a Dijkstra search over the predictions on reduced costs finds the
    cheapest augmenting path, and dual potentials keep reduced costs
    non-negative. After target `k` is added, the matching of targets `0..k`
    is optimal, so the final matching is exact: it has the same total cost as
    scipy's (ties may be broken differently).

    Everything is vectorised over `B`: the loop over targets is a
    `keras.ops.fori_loop` of `M` steps, and the Dijkstra search and the path
    reversal are `keras.ops.while_loop`s bounded by `M` steps each (a search
    scans at most one new prediction per matched target, plus the free one it
    ends on), which run until every batch element has finished. The work is
    `O(B * M^2 * N)` in the worst case. The input is wrapped in
    `stop_gradient`: the assignment is discrete, so it is safe to call on
    tensors watched by a `GradientTape`.

    Computation is in float32 (float16 and bfloat16 inputs are cast up);
    float64 inputs are solved in float64 where the backend allows it.
    Integer costs are solved exactly while sums of costs stay below `2**24`
    in float32; for continuous costs, float32 rounding can only make the
    result differ from the optimum by rounding error of the total.

    Padded targets: where `target_mask[b, j]` is False, target `j` is skipped
    (it takes no prediction, and its costs, even NaN, are never read) and
    `assignment[b, j] = -1`. The real targets are matched exactly as if the
    padded columns had been removed from the cost matrix.

    Args:
        cost: float tensor of shape `(B, N, M)`, or `(N, M)` unbatched, with
            `N >= M` known statically. `cost[b, i, j]` is the cost of
            matching prediction `i` to target `j`. Costs of real targets must
            be finite.
        target_mask: optional boolean tensor of shape `(B, M)` (or `(M,)`
            unbatched), True for real targets and False for padding. Defaults
            to all targets being real.

    Returns:
        An int32 tensor `assignment` of shape `(B, M)` (or `(M,)`): the
        prediction matched to each target, or -1 for padded targets. Real
        targets receive distinct predictions.

    Raises:
        ValueError: if `cost` is not of rank 2 or 3, has a non-float dtype, an
            unknown `N` or `M`, or fewer predictions than targets (`N < M`);
            or if `target_mask`'s shape does not match `cost`.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    >>> assignment = linear_sum_assignment(cost)
    >>> keras.ops.convert_to_numpy(assignment)
    array([1, 0, 2], dtype=int32)

    References:
        - [Jonker and Volgenant, 1987. A shortest augmenting path algorithm
          for dense and sparse linear assignment problems](
          https://doi.org/10.1007/BF02278710)
        - [Crouse, 2016. On implementing 2D rectangular assignment
          algorithms](https://doi.org/10.1109/TAES.2016.140952)
        - [Carion et al., 2020. End-to-End Object Detection with
          Transformers](https://arxiv.org/abs/2005.12872)
    """
    cost, target_mask, dtype = _check_inputs(cost, target_mask)
    num_targets = cost.shape[-1]
    rank = len(cost.shape)
    unbatched = rank == 2
    if unbatched:
        cost = ops.expand_dims(cost, 0)
        if target_mask is not None:
            target_mask = ops.expand_dims(target_mask, 0)

    compute_dtype = "float64" if dtype == "float64" else "float32"
    cost = ops.cast(ops.stop_gradient(cost), compute_dtype)
    # The solver walks targets as the rows of its problem: (B, M, N).
    cost_t = ops.transpose(cost, (0, 2, 1))
    if target_mask is None:
        target_mask = ops.ones_like(cost_t[:, :, 0], dtype="bool")
    else:
        # Padded targets are skipped, so their costs never enter the sums
        # below; zeroing them keeps NaN or inf padding out of the row minima.
        cost_t = ops.where(target_mask[:, :, None], cost_t, 0.0)

    if num_targets == 0:
        assignment = ops.zeros_like(ops.sum(cost_t, axis=2), dtype="int32")
    else:
        # Every real target is matched exactly once, so subtracting a
        # constant from its row changes every feasible total by the same
        # amount and keeps the optimum; it makes costs non-negative and
        # small, which keeps float32 rounding of the potentials low.
        cost_t = cost_t - ops.min(cost_t, axis=2, keepdims=True)
        assignment = _shortest_augmenting_paths(cost_t, target_mask)
    if unbatched:
        assignment = ops.squeeze(assignment, 0)
    return assignment


def _gather(values, index):
    """`values[b, index[b]]` of `values` (B, K) and `index` (B,): shape (B,)."""
    index = ops.maximum(index, 0)[:, None]
    return ops.take_along_axis(values, index, axis=1)[:, 0]


def _flip_path(sink, path, row4col, col4row, done, cur_row, num_rows):
    """Flip the matching along the path from `sink` back to `cur_row`."""
    row_ids = ops.arange(col4row.shape[1], dtype="int32")
    col_ids = ops.arange(row4col.shape[1], dtype="int32")

    def flip_cond(j, row4col, col4row, done):
        return ops.any(~done)

    def flip_body(j, row4col, col4row, done):
        running = ~done
        i = _gather(path, j)
        row4col = ops.where(
            (col_ids[None, :] == j[:, None]) & running[:, None],
            i[:, None],
            row4col,
        )
        next_j = _gather(col4row, i)
        col4row = ops.where(
            (row_ids[None, :] == i[:, None]) & running[:, None],
            j[:, None],
            col4row,
        )
        j = ops.where(running, next_j, j)
        done = done | (i == cur_row)
        return j, row4col, col4row, done

    _, row4col, col4row, _ = ops.while_loop(
        flip_cond,
        flip_body,
        (sink, row4col, col4row, done),
        maximum_iterations=num_rows,
    )
    return row4col, col4row


def _shortest_augmenting_paths(cost, row_mask):
    """Crouse's rectangular shortest augmenting path solver, batched.

    Here the solver's rows are the targets and its columns the predictions.

    Args:
        cost: float tensor `(B, M, N)`, `M <= N`, finite where `row_mask`.
        row_mask: bool tensor `(B, M)`; False rows are left unassigned.

    Returns:
        int32 tensor `(B, M)`: the column of each row, -1 where masked.
    """
    num_rows, num_cols = cost.shape[1], cost.shape[2]
    row_ids = ops.arange(num_rows, dtype="int32")
    col_ids = ops.arange(num_cols, dtype="int32")
    inf = float("inf")

    zeros_rows = ops.zeros_like(cost[:, :, 0])  # B, M
    zeros_cols = ops.zeros_like(cost[:, 0, :])  # B, N
    no_col = ops.zeros_like(zeros_rows, dtype="int32") - 1  # B, M
    no_row = ops.zeros_like(zeros_cols, dtype="int32") - 1  # B, N
    false_rows = ops.zeros_like(zeros_rows, dtype="bool")  # B, M
    false_cols = ops.zeros_like(zeros_cols, dtype="bool")  # B, N

    def add_row(cur_row, state):
        # Dual potentials u (B, M) and v (B, N); the matching both ways.
        u, v, col4row, row4col = state
        active = ops.take(row_mask, cur_row, axis=1)  # B

        # Dijkstra from cur_row over columns, on reduced costs
        # cost[i, j] - u[i] - v[j], non-negative for already matched rows.
        def search_cond(i, min_val, dist, path, seen_rows, seen_cols, sink):
            return ops.any(sink < 0)

        def search_body(i, min_val, dist, path, seen_rows, seen_cols, sink):
            running = sink < 0  # B
            seen_rows = seen_rows | (
                (row_ids[None, :] == i[:, None]) & running[:, None]
            )
            cost_i = ops.take_along_axis(cost, i[:, None, None], axis=1)
            reduced = (
                min_val[:, None] + cost_i[:, 0, :] - _gather(u, i)[:, None] - v
            )
            closer = (reduced < dist) & ~seen_cols & running[:, None]
            dist = ops.where(closer, reduced, dist)
            path = ops.where(closer, i[:, None], path)

            # Closest unscanned column; among ties take a free one, which
            # ends the search sooner (any tie is exact).
            open_dist = ops.where(seen_cols, inf, dist)
            lowest = ops.min(open_dist, axis=1)  # B
            ties = ~seen_cols & (open_dist == lowest[:, None])
            free_ties = ties & (row4col < 0)
            j = ops.where(
                ops.any(free_ties, axis=1),
                ops.argmax(ops.cast(free_ties, "int32"), axis=1),
                ops.argmax(ops.cast(ties, "int32"), axis=1),
            )
            j = ops.cast(j, "int32")

            owner = _gather(row4col, j)  # B, -1 when j is free
            seen_cols = seen_cols | (
                (col_ids[None, :] == j[:, None]) & running[:, None]
            )
            min_val = ops.where(running, lowest, min_val)
            sink = ops.where(running & (owner < 0), j, sink)
            i = ops.where(running & (owner >= 0), owner, i)
            return i, min_val, dist, path, seen_rows, seen_cols, sink

        start = ops.zeros_like(no_col[:, 0]) + cur_row  # B
        # Masked rows start finished: sink = 0 stands for "no search".
        sink = ops.cast(ops.where(active, -1, 0), "int32")
        _, min_val, dist, path, seen_rows, seen_cols, sink = ops.while_loop(
            search_cond,
            search_body,
            (
                start,
                zeros_rows[:, 0],
                zeros_cols + inf,
                no_row,
                false_rows,
                false_cols,
                sink,
            ),
            maximum_iterations=num_rows,
        )

        # Update the potentials so that reduced costs stay non-negative and
        # are zero along the new matching.
        is_cur = (row_ids == cur_row)[None, :]  # 1, M
        dist_of_col = ops.take_along_axis(
            dist, ops.maximum(col4row, 0), axis=1
        )  # B, M
        du = ops.where(is_cur, min_val[:, None], min_val[:, None] - dist_of_col)
        u = ops.where(seen_rows & active[:, None], u + du, u)
        dv = min_val[:, None] - dist
        v = ops.where(seen_cols & active[:, None], v - dv, v)

        row4col, col4row = _flip_path(
            sink, path, row4col, col4row, ~active, cur_row, num_rows
        )
        return u, v, col4row, row4col

    _, _, col4row, _ = ops.fori_loop(
        0, num_rows, add_row, (zeros_rows, zeros_cols, no_col, no_row)
    )
    return col4row


def matched_pairs(assignment, num_predictions, dtype="float32"):
    """One-hot matrix of matched (prediction, target) pairs.

    `pairs[b, i, j] = 1` where `assignment[b, j] == i`, else 0. Columns of
    padded targets (`assignment == -1`) are all zero. Under XLA this turns the
    matching into matrix products, so the loss needs no dynamic gathers:
    `ops.einsum("bnm,bmk->bnk", pairs, target_boxes)` puts each target's box
    on its query, and `ops.sum(pairs, axis=-1)` is 1 for matched queries and
    0 for "no object" queries.

    Args:
        assignment: int tensor `(B, M)` (or `(M,)`) from
            `linear_sum_assignment`.
        num_predictions: int, `N`, the number of predictions (queries).
        dtype: dtype of the result. Defaults to `"float32"`.

    Returns:
        A tensor of shape `(B, N, M)` (or `(N, M)`) and dtype `dtype`.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> pairs = matched_pairs(np.array([[2, 0]], "int32"), num_predictions=3)
    >>> keras.ops.convert_to_numpy(pairs)[0]
    array([[0., 1.],
           [0., 0.],
           [1., 0.]], dtype=float32)
    """
    if not isinstance(num_predictions, int) or num_predictions < 0:
        raise ValueError(
            "Received an invalid value for argument `num_predictions`, "
            "expected a non-negative integer. "
            f"Received: num_predictions={num_predictions}"
        )
    assignment = ops.convert_to_tensor(assignment)
    if len(assignment.shape) not in (1, 2):
        raise ValueError(
            "Received an invalid value for argument `assignment`, expected "
            "a tensor of rank 2 `(B, M)` or rank 1 `(M,)`. "
            f"Received: assignment.shape={tuple(assignment.shape)}"
        )
    rows = ops.arange(num_predictions, dtype="int32")[:, None]  # N, 1
    pairs = ops.expand_dims(ops.cast(assignment, "int32"), -2) == rows
    return ops.cast(pairs, dtype)
