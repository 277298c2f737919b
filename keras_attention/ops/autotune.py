"""Which path `implementation="auto"` takes for long sequences: measured.

Where the backend has no fused kernel (TensorFlow; JAX on a CPU) a long
attention can run on the dense path (the `(B, H, T, S)` scores in memory,
a few large matrix multiplications), on the blocked path (key blocks, an
online softmax, `O(T * block)` memory) or on the chunked path (the dense
core over chunks of queries, each against all keys, the weights
recomputed in the backward pass: `O(rows * S)` memory, large products).
Which is faster depends on the machine: on an AVX2-only CPU the blocked
path beat the dense one at 2,048 tokens, on an AVX-512 CPU with bf16
instructions the dense path is 1.5x faster there, on an Intel CPU with AMX
units 1.4x, and at 16,384 tokens there the chunked path beats the blocked
one (BENCHMARKS.md, "Dispatch", "Intel Xeon with AMX"). No rule written
from one machine holds on the other, so the first call of each shape
measures the candidate paths (forward, and backward when training) on
random tensors of that shape (its first `MEASURED_ROWS` queries, against
all keys), keeps the fastest for that shape, dtype and mode (the fixed
rule's path unless another is `TIE_RATIO` faster), and records
the choice (on JAX, while the caller's function is traced, the paths
jitted on the spot, with their gradient under `jax.grad`):

    >>> from keras_attention import ops as attention_ops
    >>> for choice in attention_ops.dispatch_choices():   # doctest: +SKIP
    ...     print(choice.implementation, choice.reason)
    dense measured: dense 842.1 ms, blocked 1367.0 ms, chunked 1012.4 ms

The dense path is a candidate only while its scores fit the memory budget
(`set_autotune(memory_budget=...)`, a quarter of the machine's memory by
default); the chunked path on TensorFlow outside XLA (under XLA it was
within 6 % of the blocked path, and timing it there doubles the first
call's time), without a sliding window (the blocked path skips the keys
outside it), with its chunks, and the chunks that keep their weights for
the backward pass, sized to the budget (a timed slice keeps the share of
its chunks the whole call would: `measured_call_rows`). A call whose
batch alone is unknown where it is traced (Keras's `fit` on TensorFlow
when its last batch is partial) is timed at batch 1, the dense path a
candidate while `UNKNOWN_BATCH` (32) examples would fit the budget. Other
unknown sizes (heads, head size), `set_autotune(False)` or the environment
variable `KERAS_ATTENTION_AUTOTUNE=0` keep the fixed rule (the blocked path
once `T * S` passes `DENSE_THRESHOLD`). An unknown sequence length never
gets here (nothing can be timed for it): in a TensorFlow graph `dispatch`
takes the dense path while its scores fit `memory_budget()` and the
chunked one after, decided when run; under XLA the dense path. Every path is tested
equal to the dense one in values and gradients, so the choice changes
speed and memory, never the result beyond float rounding. Measuring costs
the first call of each shape seconds; `set_autotune(cache_file=...)` (or
`KERAS_ATTENTION_AUTOTUNE_CACHE`) keeps the measured choices in a file
that later processes on the same machine read instead
(`ops/choice_file.py`).
"""

import collections
import logging
import os
import warnings

import keras
import numpy as np

from keras_attention._validation import check_positive_int
from keras_attention._validation import check_positive_number
from keras_attention._validation import invalid
from keras_attention.ops import choice_file
from keras_attention.ops import timing
from keras_attention.ops._autotune_environment import _enabled_by_environment
from keras_attention.ops._autotune_environment import onednn_status
from keras_attention.ops._autotune_environment import tf_mode
from keras_attention.ops._autotune_environment import xla_on_cpu  # noqa: F401

logger = logging.getLogger("keras_attention")

Choice = collections.namedtuple("Choice", "key implementation reason timings_ms")

# The paths are timed on at most this many queries of a long call.
MEASURED_ROWS = 2048
# The chunked path's fewest query rows per chunk (`dense.chunk_rows`).
MIN_CHUNK_ROWS = 16

_CHOICES = {}

_OPTIONS = {
    "enabled": _enabled_by_environment(),
    "memory_budget": None,
    "repeats": 2,
    "cache_file": None,
}


def _cache_from_environment():
    """`KERAS_ATTENTION_AUTOTUNE_CACHE`, checked as `set_autotune` checks
    `cache_file` (a folder, or a file in a missing folder, warned about
    only at the first long call, and left a stray `.lock` beside it): a
    bad one is warned about here and no file is kept."""
    path = os.environ.get("KERAS_ATTENTION_AUTOTUNE_CACHE") or None
    if path is None:
        return None
    try:
        return choice_file.check_path(path)
    except ValueError as error:
        warnings.warn(
            f"KERAS_ATTENTION_AUTOTUNE_CACHE={path!r} is ignored: {error}",
            stacklevel=2,
        )
        return None


_OPTIONS["cache_file"] = _cache_from_environment()


def set_autotune(enabled=None, memory_budget=None, repeats=None, cache_file=None):
    """Configure the measured choice of `implementation="auto"`.

    Args:
        enabled: measure at first use (`True`, the default unless
            `KERAS_ATTENTION_AUTOTUNE=0`, or `false`, `off`, `no`; another
            value than these and `1`, `true`, `on`, `yes` raises) or keep
            the fixed rule (`False`).
        memory_budget: bytes the dense path's score tensors may take
            (forward scores, weights and their gradient); default a quarter
            of the machine's physical memory.
        repeats: timed calls per path after one warm-up call (default 2).
        cache_file: a JSON file in which measured choices are kept for
            later processes on the same machine (`ops/choice_file.py`), or
            `False` for none (the default, unless
            `KERAS_ATTENTION_AUTOTUNE_CACHE` names a file).

    Choices already made stay; `clear_dispatch_choices()` forgets them.
    Every argument is checked before any option changes.
    """
    if enabled is not None and not isinstance(enabled, (bool, np.bool_)):
        raise invalid("enabled", "True or False", enabled)
    check_positive_number("memory_budget", memory_budget, allow_none=True)
    check_positive_int("repeats", repeats, allow_none=True)
    if cache_file is not None and cache_file is not False:
        cache_file = choice_file.check_path(cache_file)
    if enabled is not None:
        _OPTIONS["enabled"] = bool(enabled)
    if memory_budget is not None:
        _OPTIONS["memory_budget"] = int(memory_budget)
    if repeats is not None:
        _OPTIONS["repeats"] = int(repeats)
    if cache_file is not None:
        _OPTIONS["cache_file"] = cache_file or None


def dispatch_choices():
    """The measured and rule-made choices of `implementation="auto"` so
    far, oldest first: a call that takes the dense path (or torch's fused
    kernel) below the long-sequence threshold, by the default rule, is not
    listed, nor the layer's windowed long-context path (its own rule, for
    8,192 tokens and more).

    Each is a `Choice(key, implementation, reason, timings_ms)`: `key` the
    (backend, mode, "train" or "infer", B, T, S, H, K, D, Dv, dtype,
    causal, window, mask shape, ALiBi) it holds for, `timings_ms` the measured time of each path (empty when
    the choice came from a rule). The fast forms that XLA on a CPU takes
    (`ops/xla_cpu.py`: the looped `dV`/`dK` products, the unnormalised
    weights, the backward pair by pair, the flat projections) are listed
    too, once per shape, their key starting with what they replace (e.g.
    `"keys product"`).
    """
    return list(_CHOICES.values())


# The rule choices kept, the oldest dropped first: under XLA every traced
# shape records a few (a service of many lengths grew the table for good).
# Measured choices stay: `choose` reads them back.
MAX_RULE_CHOICES = 1024
_RULE_KEYS = collections.deque()


def record_rule(key, implementation, reason):
    """Record a choice made by a fixed rule (once per `key`, the last
    `MAX_RULE_CHOICES` kept), so that `dispatch_choices()` shows it; the
    fast forms of `ops/xla_cpu.py` and `ops/dispatch.py` use it."""
    if key not in _CHOICES:
        _CHOICES[key] = Choice(key, implementation, reason, {})
        _RULE_KEYS.append(key)
        while len(_RULE_KEYS) > MAX_RULE_CHOICES:
            choice = _CHOICES.get(_RULE_KEYS.popleft())
            if choice is not None and not choice.timings_ms:
                del _CHOICES[choice.key]
        logger.info("keras_attention: %s for %s (%s)", implementation, key, reason)


def clear_dispatch_choices():
    """Forget every choice (the next call of each shape decides again)."""
    _CHOICES.clear()
    _RULE_KEYS.clear()


def _system_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 8 * 2**30


# Read once: `torch.compile` cannot trace `os.sysconf` (the chunked path
# asks at each call, and broke its graph there).
_SYSTEM_MEMORY = _system_memory()


def memory_budget():
    """Bytes the dense path's score tensors may take (`set_autotune`)."""
    if _OPTIONS["memory_budget"] is not None:
        return _OPTIONS["memory_budget"]
    return _SYSTEM_MEMORY // 4


# While `_measure` times a call: the call's own rows, whether it trains,
# and the pair-group choices its candidate's trace made or found
# (`pair_group` adds them; `None` outside a trace).
_MEASURED_CALL = timing.PerThread({"rows": None, "training": False, "cores": None})
# The dense path takes its core's measured time (`_measure`) unless another
# path comes within this ratio of it: then it is timed itself.
CLOSE_RATIO = 1.1


def measured_call_rows():
    """While `choose` times a slice of a call's queries, the call's own
    number of queries (the chunked path keeps the share of its chunks'
    weights the whole call would keep); otherwise `None`."""
    return _MEASURED_CALL["rows"]


def gradient_recorded(backend=None):
    """Whether a TensorFlow gradient tape records this call (a custom
    training loop calls layers without `training=True`), or `choose` is
    timing a training call (with symbolic gradients, no tape)."""
    if _MEASURED_CALL["training"]:
        return True
    if (backend or keras.backend.backend()) != "tensorflow":
        return False
    try:
        from tensorflow.python.eager import record

        return bool(record.could_possibly_record())
    except Exception:  # pragma: no cover - a moved private helper
        return False


def _training_or_traced(training):
    """`bool(training)`, or `True` for a flag only known when run (Keras's
    `RematScope` passes `training` to the layers as a traced tensor): the
    training measurement times the backward too."""
    try:
        return bool(training)
    except Exception:  # a tracer: TracerBoolConversionError, or TF's
        return True


def choose(run, query, key, value, mask, is_causal, sliding_window, training,
           alibi=False):
    """`"dense"`, `"blocked"` or `"chunked"` for one long call; see the
    module docstring.

    `run(implementation, q, k, v, mask, causal)` computes the attention on
    the given path; it is called on random inputs of the call's shapes.
    `alibi`: whether the call adds ALiBi's bias (the dense path then takes
    autodiff's backward pass, so it is a shape of its own). A
    causal call without a window, when only its first queries are timed,
    is timed without its causal mask: the dense and blocked paths do the
    same work either way, the chunked path less (it skips the keys after
    each chunk, and the first queries would see few keys), so it is
    chosen only where it wins without that saving.
    """
    backend = keras.backend.backend()
    shapes = [tuple(x.shape) for x in (query, key, value)]
    if mask is not None:
        shapes.append(tuple(mask.shape))
    static = not any(d is None for shape in shapes for d in shape)
    # Keras's `fit` on TensorFlow traces an unknown batch whenever the last
    # batch is partial: then timed at batch 1, the dense path a candidate
    # only while `UNKNOWN_BATCH` examples would fit the memory budget.
    batch_unknown = not static and not any(
        d is None for shape in shapes for d in shape[1:]
    )
    timed = [(1,) + shape[1:] if shape[0] is None else shape for shape in shapes]
    mask_shape = shapes.pop() if mask is not None else None
    timed_mask_shape = timed.pop() if mask is not None else None
    mode = tf_mode() if backend == "tensorflow" else "compiled"
    training = (_training_or_traced(training) or gradient_recorded(backend)
                or timing.differentiated(query))
    (b, t, h, d), (_, s, kh, _), (_, _, _, dv) = shapes
    key_ = (
        backend, mode, "train" if training else "infer", b, t, s, h, kh, d, dv,
        keras.backend.standardize_dtype(query.dtype), bool(is_causal),
        sliding_window, mask_shape, bool(alibi),
    )
    if key_ in _CHOICES:
        return _CHOICES[key_].implementation
    with timing.MEASURING:
        if key_ in _CHOICES:  # another thread measured it meanwhile
            return _CHOICES[key_].implementation
        candidates, over = ["blocked"], ""
        measurable = static or batch_unknown
        batch = b if b is not None else UNKNOWN_BATCH
        if measurable:
            dense_bytes = 3 * 4 * batch * h * t * s
            if dense_bytes <= memory_budget():
                candidates.insert(0, "dense")
            else:
                over = (
                    f"the dense scores would take {dense_bytes / 2**30:.1f} GiB, "
                    f"over the budget of {memory_budget() / 2**30:.1f} GiB"
                )
            # The chunked path: outside XLA (see the module), without a window
            # (the blocked path skips the keys outside it), while a chunk of
            # its fewest rows fits the budget.
            if (
                backend == "tensorflow" and mode != "xla" and sliding_window is None
                and 3 * 4 * batch * h * MIN_CHUNK_ROWS * s <= memory_budget()
            ):
                candidates.append("chunked")
        if backend not in ("tensorflow", "jax"):
            choice = Choice(key_, "blocked", "rule: measured on TensorFlow and JAX", {})
        elif not measurable:
            choice = Choice(key_, "blocked", "rule: shapes not static", {})
        elif len(candidates) == 1:
            choice = Choice(key_, "blocked", f"rule: {over}", {})
        elif not _OPTIONS["enabled"]:
            choice = Choice(key_, "blocked", "rule: autotune is off", {})
        else:
            rows = min(t, MEASURED_ROWS)
            # Causal as called when the queries are all timed or a window
            # decides the blocked path's work; unmasked on a slice of them.
            causal = bool(is_causal) and (rows == t or sliding_window is not None)

            def measure():
                notes = [f"on {rows:,} of {t:,} queries"] if rows < t else []
                if batch_unknown:
                    notes.append(
                        "batch unknown when traced: timed at batch 1, the "
                        f"dense path only if {UNKNOWN_BATCH} examples fit"
                    )
                if backend == "tensorflow":
                    timings = _measure(run, timed, query.dtype, value.dtype,
                                       timed_mask_shape, mode, training,
                                       candidates, rows, causal, notes=notes)
                else:
                    timings = timing.measure_jax(
                        run, timed, query.dtype, value.dtype, timed_mask_shape,
                        training, candidates, rows, causal, _OPTIONS["repeats"])
                return _fastest(
                    key_, timings, notes + ([over] if over else []), "blocked"
                )

            choice = _measured_or_kept(key_, candidates, measure)
        _CHOICES[key_] = choice
    logger.info("keras_attention: %s attention for %s (%s)",
                choice.implementation, key_, choice.reason)
    return choice.implementation


# The batch assumed for the memory budget when a call's batch is unknown
# where it is traced (Keras's default `batch_size`).
UNKNOWN_BATCH = 32


# From this many scores per (batch, head) pair, in a TensorFlow graph on a
# CPU, the dense core is also timed in groups of pairs of about
# `PAIR_GROUP_BYTES` of scores each (bfloat16 heads keep bfloat16 scores,
# twice the pairs: at 1,024 tokens 4 pairs a group ran 1.16x as fast as 2,
# `python benchmarks/bench_pair_groups.py --dtype bfloat16`, BENCHMARKS.md
# "Groups of pairs for bfloat16 heads"; float32 and float16 heads keep
# float32 scores; `pair_group`).
PAIR_GROUPS_FROM = 1024 * 1024
PAIR_GROUP_BYTES = 8 * 2**20
# Never more groups than this: each is its own copy of the core in the
# traced graph, whose first call grows with their number. At batch 64, 8
# heads, 1,024 tokens, 512 groups of one pair took 16.9-18.9 s at their
# first call and ran slower than 256 of two (2,002-2,029 against
# 1,851-1,891 ms; 7.9 s at the first call): `python
# benchmarks/bench_pair_groups.py --batch 64 --lengths 1024 --autotune`,
# BENCHMARKS.md "Pairs side by side".
MAX_PAIR_GROUPS = 256


def pair_group(q, k, v, mask, run):
    """How many `(batch, head)` pairs the dense core takes at a time: `0`
    for all of them at once, or the measured faster group size.

    In a TensorFlow graph (`tf.function` without XLA) on a CPU, the dense
    core of each group of pairs is independent work on a few megabytes of
    scores, which the graph executor may also run side by side; one call
    over every pair runs each operation over the whole `(B, H, T, S)`
    tensors in turn. On an Intel Xeon with AMX (2 cores) the grouped core
    ran 1.18x as fast at 1,024 tokens and 1.13x at 2,048, still 1.10x
    there with one inter-op thread (the groups one after the other: most
    of the gain is the smaller tensors); at 512 the gain was within the
    spread between runs, hence the floor (BENCHMARKS.md, "Pairs side by
    side"). Other machines may differ, so the first call of each shape
    times both (forward, and backward when training) and keeps the
    faster, recorded in `dispatch_choices()`. The price is that first
    call: `MultiHeadAttention`'s first forward + backward at 2,048 tokens
    (batch 8, 8 heads of 64), with the paths measured too (`choose`,
    which takes the dense path's time from this measurement), took 28.9 s
    there, the later ones 1.09 s (`benchmarks/bench_first_call.py`,
    BENCHMARKS.md "A cheaper first measurement"); `set_autotune(False)`
    keeps all pairs at once, and
    `set_autotune(cache_file=...)` keeps the measured choice for later
    processes on the same machine (`ops/choice_file.py`). At most
    `MAX_PAIR_GROUPS` groups (larger ones for many pairs), which bounds
    the traced graph and that first call.
    `q`, `k`, `v`: `(B, H, T|S, D)` heads; `run(pairs, q, k, v, mask,
    causal)` is the core with a given group size. Elsewhere (XLA, which
    runs its own concurrency; eager; other backends; shapes not static;
    fewer than `PAIR_GROUPS_FROM` scores per pair) `0`.
    """
    if keras.backend.backend() != "tensorflow" or tf_mode() != "graph":
        return 0
    shapes = [tuple(x.shape) for x in (q, k, v)]
    mask_shape = None if mask is None else tuple(mask.shape)
    if any(d is None for shape in shapes + [mask_shape or ()] for d in shape):
        return 0
    (b, h, t, _), (_, _, s, _), _ = shapes
    itemsize = 2 if keras.backend.standardize_dtype(q.dtype) == "bfloat16" else 4
    group = max(1, PAIR_GROUP_BYTES // (itemsize * t * s),
                -(-b * h // MAX_PAIR_GROUPS))
    if t * s < PAIR_GROUPS_FROM or group >= b * h:
        return 0
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU"):
        return 0
    training = gradient_recorded()
    key_ = ("pair groups", "tensorflow", "graph", "train" if training else "infer",
            *shapes, keras.backend.standardize_dtype(q.dtype), mask_shape)
    label = f"{group} pair{'s' if group > 1 else ''} a group"
    with timing.MEASURING:
        if key_ not in _CHOICES:
            sizes = {"all pairs": 0, label: group}
            if not _OPTIONS["enabled"]:
                choice = Choice(key_, "all pairs", "rule: autotune is off", {})
            else:
                choice = _measured_or_kept(key_, list(sizes), lambda: _fastest(
                    key_, _measure(lambda name, *args: run(sizes[name], *args),
                                   shapes, q.dtype, v.dtype, mask_shape, "graph",
                                   training, list(sizes)), rule="all pairs"))
            _CHOICES[key_] = choice
            logger.info("keras_attention: dense core, %s, for %s (%s)",
                        choice.implementation, key_, choice.reason)
    if _MEASURED_CALL["cores"] is not None:
        # `_measure` is tracing the dense path to take this measurement's
        # time, and traces it again if it has to run it: all pairs at once
        # meanwhile, the cheapest to trace.
        _MEASURED_CALL["cores"].append(_CHOICES[key_])
        return 0
    return group if _CHOICES[key_].implementation == label else 0


# A path is taken over the fixed rule's only when this much faster: paths
# within timing noise of each other flipped from run to run, and with them
# the result's last bits (the paths agree within float rounding only).
TIE_RATIO = 1.05


def _fastest(key_, timings, notes=(), rule=None):
    """The `Choice` of the fastest of `timings` (`{name: ms}`), or the fixed
    `rule`'s path when the fastest is not `TIE_RATIO` faster than it."""
    text = ", ".join(f"{name} {ms:.1f} ms" for name, ms in timings.items())
    text += f" ({'; '.join(notes)})" if notes else ""
    fastest = min(timings, key=timings.get)
    if rule in timings and timings[rule] <= TIE_RATIO * timings[fastest]:
        if fastest != rule:
            text += f"; {rule}, the rule's, within {TIE_RATIO - 1:.0%}"
        fastest = rule
    return Choice(key_, fastest, f"measured: {text}", timings)


def _measured_or_kept(key_, candidates, measure):
    """`measure()`'s `Choice` for `key_`, or the one kept in the cache file
    (`set_autotune(cache_file=...)`) for this machine and memory budget,
    if it is one of `candidates` (a file edited by hand, or by another
    version, may name another); a new measurement is added to the file."""
    path = _OPTIONS["cache_file"]
    if path is None:
        return measure()
    machine, lookup, store = choice_file.machine, choice_file.lookup, choice_file.store
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        # Plain Python while a `tf.function` traces (AutoGraph would try to
        # convert `json`'s encoder, and warn).
        machine, lookup, store = map(
            tf.autograph.experimental.do_not_convert, (machine, lookup, store)
        )
    machine = machine(onednn_status())
    kept = lookup(path, machine, key_, memory_budget())
    if kept is not None and kept[0] in candidates:
        implementation, reason, timings = kept
        return Choice(key_, implementation, f"{reason} (kept in {path})", timings)
    choice = measure()
    store(path, machine, key_, memory_budget(), choice.implementation,
          choice.reason, choice.timings_ms)
    return choice


def _measure(run, shapes, q_dtype, v_dtype, mask_shape, mode, training,
             candidates=("dense", "blocked"), rows=None, causal=False,
             notes=None):
    """Milliseconds of each candidate path on random inputs (TensorFlow,
    eagerly), on the first `rows` queries: each path's time grows with
    the number of queries at a fixed number of keys, so a slice of them
    ranks the paths as the whole call would, in a fraction of its time.

    Each path is traced, run once (its first run allocates), then timed
    `repeats` times, the best kept; a path already `timing.LOSING_RATIO` times
    slower than the fastest so far is not timed again. The dense path
    whose trace measured its core's pair groups (`pair_group`, on these
    same inputs' shapes) takes that measurement's best time instead of
    being run again: the core is its work but for the heads' layout
    changes around it (at 2,048 tokens, when both were still timed, the
    whole path took 878.9 ms and its core 840.1, `python
    benchmarks/bench_first_call.py`, BENCHMARKS.md "First calls"), so
    where another path comes within `CLOSE_RATIO` of that time the dense
    path is timed itself after all (traced again: the trace that measured
    the core left its groups out, `pair_group`); otherwise `notes` (a
    list) says the core's time was taken.
    """
    import tensorflow as tf

    call_rows = shapes[0][1]
    shapes, mask_shape = timing.sliced(shapes, mask_shape, rows)
    rng = np.random.default_rng(0)
    with tf.init_scope():
        q, k, v = (
            tf.cast(rng.standard_normal(shape, dtype=np.float32), dtype)
            for shape, dtype in zip(shapes, (q_dtype, q_dtype, v_dtype))
        )
        m = None if mask_shape is None else tf.ones(mask_shape, "bool")
        timings = {}
        # Restored after: a path timed here may measure its own choice
        # (`pair_group`) inside another measurement.
        previous = dict(_MEASURED_CALL)
        _MEASURED_CALL.update(
            rows=call_rows if rows is not None else previous["rows"],
            training=training,
        )
        try:
            taken = False  # whether the dense path's core's time is taken
            for implementation in candidates:
                fn = _timed_fn(run, implementation, m, mode, training, causal)
                dense = implementation == "dense"
                cores = _MEASURED_CALL["cores"] = [] if dense else None
                fn.get_concrete_function(q, k, v)  # trace, outside the timing
                _MEASURED_CALL["cores"] = None
                if dense and len(cores) == 1 and cores[0].timings_ms:
                    timings[implementation] = min(cores[0].timings_ms.values())
                    taken = True
                    continue
                if cores:  # traced with its cores' groups left out
                    fn = _timed_fn(run, implementation, m, mode, training, causal)
                timings[implementation] = timing.best_ms(fn, (q, k, v), min(
                    timings.values(), default=float("inf")), _OPTIONS["repeats"])
            if taken:
                others = [ms for name, ms in timings.items() if name != "dense"]
                if min(others, default=float("inf")) <= CLOSE_RATIO * timings["dense"]:
                    timings["dense"] = timing.best_ms(
                        _timed_fn(run, "dense", m, mode, training, causal),
                        (q, k, v), float("inf"), _OPTIONS["repeats"])
                elif notes is not None:
                    notes.append("dense timed by its core's pair-group measurement")
        finally:
            _MEASURED_CALL.update(previous)
    return timings


def _timed_fn(run, implementation, mask, mode, training, causal=False):
    import tensorflow as tf

    def step(q, k, v):
        out = tf.cast(run(implementation, q, k, v, mask, causal), "float32")
        if not training:
            return tf.reduce_sum(out)
        # Symbolic gradients: `tf.init_scope` pauses every gradient tape
        # (`gradient_recorded` says True while a training call is timed).
        grads = tf.gradients(tf.reduce_sum(out * out), [q, k, v])
        return tf.add_n([tf.reduce_sum(tf.cast(g, "float32")) for g in grads])

    if mode == "eager":
        mode = "graph"
    return tf.function(step, jit_compile=mode == "xla")
