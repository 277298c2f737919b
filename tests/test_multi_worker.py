"""Two worker processes under `MultiWorkerMirroredStrategy`, for real.

Each test starts `tests/multi_worker_training.py` as two workers on
127.0.0.1 (ports found free by binding port 0, `TF_CONFIG` per worker) and
as one plain process with the same global batch; the workers' final
weights must equal the single process's (within 1e-4 of the largest
weight), after updates far larger than that. Every process is bounded by a
timeout and killed in a `finally`.

Keras 3.15's `fit` fails under this strategy (keras-team/keras#20585);
`keras_attention.distribution.fit` works around it, and these tests are
what shows that the workaround trains correctly.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from keras_attention.distribution.multi_worker import free_ports
from keras_attention.distribution.multi_worker import tf_config

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "multi_worker_training.py")
TIMEOUT = 240  # seconds for one process, on a loaded 2-core machine
WEIGHT_ATOL = 1e-4


def environment(config=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env.pop("TF_CONFIG", None)
    if config:
        env["TF_CONFIG"] = config
    return env


def start(out, args, config=None):
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(out)] + list(args),
        env=environment(config),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(processes):
    """Kills the processes still running (by their handles) and reaps them."""
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait()
        if process.stdout is not None and not process.stdout.closed:
            process.stdout.close()


def finish(processes, timeout=TIMEOUT):
    """`[(exit status, output)]`; a process past the deadline is killed (None)."""
    deadline = time.monotonic() + timeout
    logs = []
    try:
        for process in processes:
            try:
                output, _ = process.communicate(
                    timeout=max(0.1, deadline - time.monotonic())
                )
                logs.append((process.returncode, output))
            except subprocess.TimeoutExpired:
                process.kill()
                logs.append((None, process.communicate()[0]))
    finally:
        stop(processes)
    return logs


def cluster(count=2):
    return [f"127.0.0.1:{port}" for port in free_ports(count)]


def load(path):
    """`(final weights, initial weights, epoch losses, replicas)` of a run."""
    with np.load(path) as data:
        count = int(data["count"])  # weights; also loss, seconds, ...
        return (
            [data[f"weight_{i}"] for i in range(count)],
            [data[f"initial_{i}"] for i in range(count)],
            data["loss"],
            int(data["replicas"]),
        )


def assert_same_weights(weights, reference):
    scale = max(1.0, max(float(np.abs(w).max()) for w in reference))
    error = max(float(np.abs(a - b).max()) for a, b in zip(weights, reference))
    assert error <= WEIGHT_ATOL * scale, f"weights differ by {error:.3g}"


def run_two_workers_and_reference(tmp_path, args):
    workers = cluster()
    processes = []
    try:
        for index in range(2):
            processes.append(
                start(tmp_path / f"worker_{index}.npz", args, tf_config(workers, index))
            )
        processes.append(start(tmp_path / "single.npz", args))
        logs = finish(processes)
    finally:
        stop(processes)
    for code, output in logs:
        assert code == 0, output[-4000:]
    return load(tmp_path / "worker_0.npz"), load(tmp_path / "single.npz")


@pytest.mark.parametrize(
    "app", ["vit", pytest.param("text", marks=pytest.mark.large)]
)
def test_two_workers_train_like_one_process(tmp_path, app):
    (weights, initial, loss, replicas), (reference, start_weights, reference_loss, single) = (
        run_two_workers_and_reference(tmp_path, ["--app", app, "--epochs", "2"])
    )
    assert (replicas, single) == (2, 1)
    assert_same_weights(initial, start_weights)  # same seeded start
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-4)
    assert_same_weights(weights, reference)
    # The training moved the weights by far more than the tolerance.
    moved = max(float(np.abs(a - b).max()) for a, b in zip(reference, initial))
    assert moved > 100 * WEIGHT_ATOL, moved


@pytest.mark.large
def test_killed_worker_resumes_with_backup_and_restore(tmp_path):
    """Worker 1 dies after epoch 1; both restart and finish like no crash."""
    epochs = ["--app", "vit", "--epochs", "4"]
    backup = ["--backup-dir", str(tmp_path / "backup")]
    everything = []  # every process, killed at the end whatever happens
    try:
        reference = start(tmp_path / "single.npz", epochs)
        everything.append(reference)
        workers = cluster()
        crashing = [
            start(
                tmp_path / f"crashed_{index}.npz",
                epochs + backup + ["--crash-after-epoch", "1"],
                tf_config(workers, index),
            )
            for index in range(2)
        ]
        everything += crashing
        # Worker 1 ends itself (os._exit) after the backup of epoch 1;
        # worker 0 is then stuck in a collective or fails: kill it.
        code, output = finish([crashing[1]])[0]
        assert code == 3, output[-3000:]
        stop(crashing)
        assert not (tmp_path / "crashed_0.npz").exists()
        workers = cluster()
        restarted = [
            start(
                tmp_path / f"resumed_{index}.npz",
                epochs + backup,
                tf_config(workers, index),
            )
            for index in range(2)
        ]
        everything += restarted
        logs = finish(restarted + [reference])
    finally:
        stop(everything)
    for code, output in logs:
        assert code == 0, output[-4000:]
    weights, _, loss, _ = load(tmp_path / "resumed_0.npz")
    reference_weights, _, reference_loss, _ = load(tmp_path / "single.npz")
    assert len(loss) == 2  # epochs 2 and 3 only: resumed, not restarted
    np.testing.assert_allclose(loss, reference_loss[2:], rtol=1e-4)
    assert_same_weights(weights, reference_weights)


def test_unreachable_worker_fails_within_the_timeout(tmp_path):
    workers = cluster()  # nobody listens on worker 1's port
    start_time = time.monotonic()
    process = start(
        tmp_path / "out.npz", ["--timeout", "3"], tf_config(workers, 0)
    )
    (code, output), = finish([process], timeout=180)
    elapsed = time.monotonic() - start_time
    assert code == -9, output[-3000:]  # killed by the watchdog
    assert f"worker 1 at {workers[1]}" in output and "TF_CONFIG" in output
    assert elapsed < 150


def test_malformed_tf_config_is_a_value_error(monkeypatch):
    from keras_attention.distribution.multi_worker import multi_worker_strategy

    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["nohost"]},
                                                "task": {"type": "worker", "index": 0}}))
    with pytest.raises(ValueError, match="'host:port'"):
        multi_worker_strategy()
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG"):
        multi_worker_strategy()
    # A string for the worker list (its characters were its addresses), two
    # workers at one address and a port past 65535 (both failed only after
    # the timeout, or with TensorFlow's gRPC error naming no port).
    for workers, match in (
        ("localhost:1", "'worker' is a str, not a list"),
        (["localhost:1", "localhost:1"], "worker 0 and worker 1 at the same"),
        (["localhost:99999"], "a port in 1-65535"),
    ):
        monkeypatch.setenv("TF_CONFIG", json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}}))
        with pytest.raises(ValueError, match=match):
            multi_worker_strategy()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    # NaN passed before; past a day the watchdog's wait overflowed, and the
    # process hung without it.
    for timeout in (float("nan"), 0, -1.0, True, "60", float("inf"), 1e10):
        with pytest.raises(ValueError, match="`timeout`"):
            multi_worker_strategy(timeout=timeout)
    # int() read an index of 0.7 as worker 0 and true as worker 1.
    for index in (0.7, True):
        monkeypatch.setenv("TF_CONFIG", json.dumps(
            {"cluster": {"worker": ["localhost:1", "localhost:2"]},
             "task": {"type": "worker", "index": index}}))
        with pytest.raises(ValueError, match="not an integer"):
            multi_worker_strategy()
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ValueError, match="TF_CONFIG unset"):
        multi_worker_strategy()


def test_the_tf_config_helpers_check_their_arguments():
    # A string made one worker per character; an index outside the
    # workers and a negative count passed.
    assert json.loads(tf_config(["h:1", "h:2"], 1))["task"]["index"] == 1
    for workers, index, argument in (
        ("127.0.0.1:2001", 0, "`workers`"), (["h:1", "h:2"], 2, "`index`"),
        (["h:1"], -1, "`index`"), (["h:1"], True, "`index`"),
    ):
        with pytest.raises(ValueError, match=argument):
            tf_config(workers, index)
    for count in (-1, 0, 1.5):
        with pytest.raises(ValueError, match="`count`"):
            free_ports(count)
    assert len(set(free_ports(3))) == 3
