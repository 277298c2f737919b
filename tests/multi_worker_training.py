"""One worker of a two-worker `MultiWorkerMirroredStrategy` run, or one process.

Run by `tests/test_multi_worker.py`:

    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:P0", "127.0.0.1:P1"]},
                "task": {"type": "worker", "index": 0}}' \
        python tests/multi_worker_training.py OUT.npz --app vit --epochs 3

Without TF_CONFIG the same training runs in one process on the default
strategy (the reference). The data, the initial weights (seeded) and the
global batch are the same in both; plain SGD, so a wrong gradient scale
shows. Worker 0 (or the single process) saves the final weights to OUT.npz.

`--backup-dir D` adds `keras.callbacks.BackupAndRestore(D)` (each worker
its own folder under D); `--crash-after-epoch K` makes worker 1 end
abruptly (`os._exit`) once epoch K has been backed up, as a killed machine
would.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GLOBAL_BATCH = 8


def vit_case(n=32):
    import numpy as np

    from keras_attention import applications

    def build():
        return applications.VisionTransformer(
            image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
            num_heads=2, mlp_dim=32, num_channels=1,
        )

    rng = np.random.default_rng(0)
    x = rng.random((n, 8, 8, 1)).astype("float32")
    y = (np.arange(n) % 3).astype("int32")
    x[np.arange(n), y * 2, :, :] += 1.0
    return build, x, y, 0.05


def text_case(n=32):
    import numpy as np

    from keras_attention import applications

    def build():
        return applications.TextClassifier(
            vocabulary_size=40, sequence_length=8, num_classes=2, hidden_dim=16,
            depth=1, num_heads=2, mlp_dim=16, dropout=0.0, pooling_units=8,
        )

    rng = np.random.default_rng(1)
    ids = rng.integers(1, 40, size=(n, 8)).astype("int32")
    y = (ids[:, 0] % 2).astype("int32")
    return build, ids, y, 0.05


CASES = {"vit": vit_case, "text": text_case}


class CrashAfterEpoch:
    """Ends the process abruptly after epoch `epoch` (0-based) was backed up."""

    def __new__(cls, epoch):
        import keras

        class _Crash(keras.callbacks.Callback):
            def on_epoch_end(self, index, logs=None):
                if index == epoch:
                    print(f"crashing after epoch {index}", flush=True)
                    os._exit(3)

        return _Crash()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--app", default="vit", choices=sorted(CASES))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--backup-dir")
    parser.add_argument("--crash-after-epoch", type=int)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--num-examples", type=int, default=32, help="training set size"
    )
    parser.add_argument("--batch-size", type=int, default=GLOBAL_BATCH)
    args = parser.parse_args()
    start = time.time()

    import keras
    import numpy as np
    import tensorflow as tf

    from keras_attention.distribution.multi_worker import fit
    from keras_attention.distribution.multi_worker import multi_worker_strategy

    keras.config.disable_traceback_filtering()

    config = json.loads(os.environ["TF_CONFIG"]) if os.environ.get("TF_CONFIG") else None
    if config:
        strategy = multi_worker_strategy(timeout=args.timeout)
        index = config["task"]["index"]
    else:
        strategy = tf.distribute.get_strategy()
        index = 0
    build, x, y, learning_rate = CASES[args.app](args.num_examples)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build()
        # Variables made in scope on real data: Keras would otherwise build
        # the model on a batch of per-replica values, which it cannot.
        model(x[:1], training=False)
        initial = model.get_weights()
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    callbacks = []
    if args.backup_dir:
        callbacks.append(
            keras.callbacks.BackupAndRestore(
                os.path.join(args.backup_dir, f"worker_{index}")
            )
        )
    if args.crash_after_epoch is not None and index == 1:
        callbacks.append(CrashAfterEpoch(args.crash_after_epoch))
    epoch_ends = []
    callbacks.append(
        keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: epoch_ends.append(time.time())
        )
    )
    fit_start = time.time()
    history = fit(
        model, strategy, x, y, batch_size=args.batch_size, epochs=args.epochs,
        shuffle=False, callbacks=callbacks, verbose=0,
    )
    fit_seconds = time.time() - fit_start
    if index == 0:
        final = model.get_weights()
        np.savez(
            args.out,
            count=len(final),
            **{f"weight_{i}": w for i, w in enumerate(final)},
            **{f"initial_{i}": w for i, w in enumerate(initial)},
            loss=np.asarray(history.history.get("loss", [])),
            seconds=time.time() - start,
            fit_seconds=fit_seconds,
            epoch_seconds=np.diff([fit_start] + epoch_ends),
            replicas=strategy.num_replicas_in_sync,
        )
    print(f"worker {index} done in {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
