"""`tf.distribute.MultiWorkerMirroredStrategy` with a bounded start.

`MultiWorkerMirroredStrategy()` waits, without a time limit, until every
worker named in `TF_CONFIG` has joined (TensorFlow 2.21 also ignores the
coordination service's registration timeout while it waits there). A
mistyped host or port in `TF_CONFIG` then hangs every worker forever.
`multi_worker_strategy(timeout)` creates the same strategy, and if it has
not started after `timeout` seconds, names the workers that do not accept
connections and ends the process (the call cannot be interrupted from
Python): a watchdog process kills it.
"""

import json
import os
import socket
import sys
import time

from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid


MAX_TIMEOUT = 86400.0


def free_ports(count, host="127.0.0.1"):
    """`count` distinct TCP ports that were free on `host` (bound to port 0)."""
    count = check_positive_int("count", count)
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def tf_config(workers, index):
    """The `TF_CONFIG` JSON string of worker `index` of `workers` (host:port)."""
    if isinstance(workers, (str, bytes)) or not all(
        isinstance(w, str) for w in workers
    ):
        # A string's characters became one worker each.
        raise invalid("workers", "a list of 'host:port' strings", workers)
    workers = list(workers)
    if isinstance(index, bool) or not isinstance(index, int) or not (
        0 <= index < len(workers)
    ):
        raise invalid("index", f"an integer in [0, {len(workers)})", index)
    return json.dumps(
        {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}}
    )


def _read_tf_config():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError(
            "multi_worker_strategy needs the TF_CONFIG environment variable "
            "(the cluster and this worker's task). Received: TF_CONFIG unset"
        )
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        for job, members in cluster.items():
            if not isinstance(members, list):
                # A string's characters were read as its addresses.
                raise TypeError(
                    f"the cluster's {job!r} is a {type(members).__name__}, "
                    "not a list of addresses"
                )
        addresses = {
            (job, i): address
            for job, members in cluster.items()
            for i, address in enumerate(members)
        }
        index = task["index"]
        if isinstance(index, bool) or not isinstance(index, int):
            # int() took 0.7 as worker 0 and true as worker 1.
            raise TypeError(f"the task's index {index!r} is not an integer")
        me = (task["type"], index)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            "Received an invalid value for TF_CONFIG, expected JSON with "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": '
            f'"worker", "index": i}}}}. Received: TF_CONFIG={raw!r} ({e})'
        ) from None
    if me not in addresses:
        raise ValueError(
            f"TF_CONFIG's task {me[0]} {me[1]} is not in its cluster "
            f"{cluster}. Received: TF_CONFIG={raw!r}"
        )
    seen = {}
    for key, address in addresses.items():
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"TF_CONFIG names {key[0]} {key[1]} at {address!r}, expected "
                f"'host:port' with a port in 1-65535. Received: TF_CONFIG={raw!r}"
            )
        if address in seen:
            # One of the two could not start its server; the other waited
            # for the whole timeout.
            other = seen[address]
            raise ValueError(
                f"TF_CONFIG names {other[0]} {other[1]} and {key[0]} {key[1]} "
                f"at the same address {address!r}: each task needs its own. "
                f"Received: TF_CONFIG={raw!r}"
            )
        seen[address] = key
    return addresses, me


def multi_worker_strategy(timeout=120.0, **kwargs):
    """`tf.distribute.MultiWorkerMirroredStrategy(**kwargs)`, started in bounded time.

    Reads and checks `TF_CONFIG` (a `ValueError` naming it when malformed).
    A watchdog process (`_watchdog.py`, standard library only) waits
    `timeout` seconds for the strategy to start (every worker to join);
    past that it prints to stderr which workers of TF_CONFIG do not accept
    connections and kills this process (SIGKILL: while TensorFlow waits for
    the cluster it holds the interpreter lock, so no Python code of this
    process can run, and it handles SIGTERM itself).

    Args:
        timeout: seconds to wait for all workers (they may start at
            different times), at most `MAX_TIMEOUT` (a day).
        **kwargs: passed to `MultiWorkerMirroredStrategy`.

    Returns:
        The strategy.
    """
    import subprocess

    import tensorflow as tf

    addresses, me = _read_tf_config()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
        0 < timeout <= MAX_TIMEOUT
    ):
        # Beyond a day the watchdog's wait overflowed and it died: the
        # process then hung, deaf to SIGTERM.
        raise ValueError(
            "Received an invalid value for argument `timeout`, expected a "
            f"positive number of seconds, at most {MAX_TIMEOUT:g} (a day). "
            f"Received: timeout={timeout!r}"
        )
    others = [
        [job, index, address]
        for (job, index), address in sorted(addresses.items())
        if (job, index) != me
    ]
    watchdog = subprocess.Popen(
        [
            sys.executable,
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "_watchdog.py"),
            str(os.getpid()),
            str(float(timeout)),
            json.dumps(others),
            os.environ["TF_CONFIG"],
        ],
        stdin=subprocess.PIPE,
    )
    start = time.monotonic()
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(**kwargs)
    finally:
        watchdog.stdin.close()  # started (or failed): the watchdog ends
        watchdog.wait()
    strategy.start_seconds = time.monotonic() - start
    return strategy


def fit(model, strategy, *args, **kwargs):
    """`model.fit(*args, **kwargs)` under `strategy`, multi-worker included.

    Keras 3's `fit` first builds the model on one batch reduced over the
    replicas (`Trainer._maybe_symbolic_build`), and that reduction fails
    under `MultiWorkerMirroredStrategy` ("Attempt to convert a value
    (PerReplica...) to a Tensor"; keras-team/keras#20585, open). Here that
    pre-build is skipped, as Keras itself does for a model made outside a
    strategy, and `fit` runs in the strategy's scope, so the steps still
    run on every replica with all-reduced gradients (`fit` under
    `strategy.scope()` picks the strategy up). Build the model (call it on
    a batch) in the scope first, so that its variables are mirrored.

    A second Keras 3 bug: the step's logs (scalars) are averaged over the
    workers with `strategy.reduce("MEAN", v, axis=0)`, which fails on a
    scalar ("Invalid reduction dimension 0 for input with 0 dimensions");
    the steps here return each log as a vector of one value, which that
    reduction averages into the same scalar.

    Args:
        model: a compiled Keras model created in `strategy.scope()`.
        strategy: the `tf.distribute` strategy.
        *args, **kwargs: passed to `model.fit`.

    Returns:
        The `History` of `fit`.
    """
    import tensorflow as tf

    if not model.built:
        raise ValueError(
            "Received an invalid value for argument `model`, expected a "
            "built model (call it on a batch in the strategy's scope). "
            f"Received: model={model.name} (not built)"
        )
    saved = model._distribute_strategy
    model._distribute_strategy = None  # skips only the pre-build
    patched = {}
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        for name in ("train_step", "test_step"):
            patched[name] = getattr(model, name)
            setattr(model, name, _logs_as_vectors(patched[name]))
    try:
        with strategy.scope():
            return model.fit(*args, **kwargs)
    finally:
        model._distribute_strategy = saved
        for name in patched:
            delattr(model, name)  # back to the class's method


def _logs_as_vectors(step):
    import tensorflow as tf

    def wrapped(data):
        logs = step(data)
        return {
            k: tf.reshape(v, (1,)) if tf.is_tensor(v) and v.shape.rank == 0 else v
            for k, v in logs.items()
        }

    return wrapped
