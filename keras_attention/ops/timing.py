"""How `autotune` times a candidate path, on any backend.

The shapes of the slice of a call that is timed (`sliced`), the best of
a few calls after an untimed first one, a losing path timed once
(`best_ms`), and the whole measurement on JAX (`measure_jax`), which runs
while the caller's function is traced. TensorFlow's measurement,
`autotune._measure`, stays beside the state it shares with the nested
pair-group measurement (`autotune.pair_group`), and uses the first two.
A process measures one thing at a time (`MEASURING`): two measurements
at once would each time the other's load, and a thread's measurement
state is its own (`PerThread`).
"""

import collections.abc
import threading
import time

import numpy as np

# A candidate whose timed call takes this many times the fastest one so
# far is not timed again (it cannot win by its next call's noise).
LOSING_RATIO = 1.5

# Held while a choice is measured and recorded; reentrant, since a path
# traced for a measurement may measure its own choice (`pair_group`).
MEASURING = threading.RLock()


class PerThread(collections.abc.MutableMapping):
    """A dict whose items each thread sees and sets for itself, starting
    from `defaults`: one thread's measurement state never reaches a call
    another thread makes meanwhile."""

    def __init__(self, defaults):
        self._defaults = dict(defaults)
        self._local = threading.local()

    def _items(self):
        if not hasattr(self._local, "items"):
            self._local.items = dict(self._defaults)
        return self._local.items

    def __getitem__(self, name):
        return self._items()[name]

    def __setitem__(self, name, value):
        self._items()[name] = value

    def __delitem__(self, name):
        del self._items()[name]

    def __iter__(self):
        return iter(self._items())

    def __len__(self):
        return len(self._items())


def sliced(shapes, mask_shape, rows):
    """The shapes of a call's first `rows` queries (all: `rows` `None`)."""
    shapes = [list(shape) for shape in shapes]
    if rows is not None:
        shapes[0][1] = rows
        if mask_shape is not None and mask_shape[2] != 1:
            mask_shape = mask_shape[:2] + (rows,) + mask_shape[3:]
    return shapes, mask_shape


def best_ms(fn, args, fastest_ms, repeats):
    """`fn(*args)`'s best time in ms over `repeats` calls after a first,
    untimed one; fewer once it is `LOSING_RATIO` times `fastest_ms`."""
    np.asarray(fn(*args))  # the first run allocates, outside the timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.asarray(fn(*args))
        best = min(best, 1000.0 * (time.perf_counter() - start))
        if best > LOSING_RATIO * fastest_ms:
            break
    return best


def differentiated(x):
    """Whether JAX differentiates the traced value `x` (`jax.grad`,
    `jax.value_and_grad`: keras's JAX trainer); False elsewhere."""
    return type(x).__name__ in ("JVPTracer", "LinearizeTracer")


def measure_jax(run, shapes, q_dtype, v_dtype, mask_shape, training,
                candidates, rows, causal, repeats):
    """Milliseconds of each candidate path on JAX: each jitted (with its
    gradient when training) and timed on random inputs of the call's
    first `rows` queries, evaluated on the spot while the caller's
    function is being traced (`jax.ensure_compile_time_eval`)."""
    import jax

    shapes, mask_shape = sliced(shapes, mask_shape, rows)
    rng = np.random.default_rng(0)
    with jax.ensure_compile_time_eval():
        q, k, v = (
            jax.numpy.asarray(rng.standard_normal(shape, dtype=np.float32), dtype)
            for shape, dtype in zip(shapes, (q_dtype, q_dtype, v_dtype))
        )
        m = None if mask_shape is None else jax.numpy.ones(mask_shape, bool)
        timings = {}
        for implementation in candidates:
            def loss(q, k, v, implementation=implementation):
                out = run(implementation, q, k, v, m, causal).astype("float32")
                return (out * out).sum()

            grads = jax.grad(loss, argnums=(0, 1, 2))
            # Called (traced and timed) before the next path rebinds them.
            fn = jax.jit(lambda *a: sum(g.sum() for g in grads(*a)) if training
                         else loss(*a))
            timings[implementation] = best_ms(
                fn, (q, k, v), min(timings.values(), default=float("inf")),
                repeats)
    return timings
