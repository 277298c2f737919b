"""Every application trains under `tf.distribute.MirroredStrategy`.

`tests/distributed_training.py` runs in a subprocess (logical devices must be
configured before TensorFlow initialises): it splits the CPU into two
logical devices and trains each application for `EPOCHS` SGD steps from the
same initial weights, once on one device and once mirrored over both. Here
the two runs must agree: losses to `LOSS_RTOL`, final weights to
`WEIGHT_ATOL` (relative to the largest weight), while the weights moved by
far more than that (so a wrong gradient scale, or replicas that never
synchronise, fail).

Conditions that make the runs comparable, each documented by the
application: batch normalisation with `synchronized=True` (CBAMResNet,
DETR); halves of the batch with as many target tokens (translators) and
boxes (DETR) as each other, since those losses are normalised per replica;
GAT fed one copy of its graph per replica (a dataset of batches of
`num_replicas` copies); and no XLA (`jit_compile=False`), which cannot
compile one step over variables on several logical CPU devices.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.distributed_training import APPLICATIONS

HERE = os.path.dirname(os.path.abspath(__file__))
LOSS_RTOL = 1e-4
WEIGHT_ATOL = 1e-4
MIN_UPDATE = 100 * WEIGHT_ATOL


# One subprocess per group. The first holds each condition above once
# (synchronized batch normalisation and boxes per replica: DETR; target
# tokens per replica: the Transformer translator; graph copies: GAT) and
# runs in CI; the second, the applications that add no condition of their
# own (CBAM-ResNet's batch normalisation is DETR's backbone's, the RNN
# translator's loss the Transformer's), with `--run-large`.
GROUPS = [
    ["DETR", "GATNodeClassifier", "TransformerTranslator"],
    ["VisionTransformer", "CBAMResNet", "Seq2SeqTranslator", "TextClassifier"],
]


def run_group(names, out):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    script = os.path.join(HERE, "distributed_training.py")
    completed = subprocess.run(
        [sys.executable, script, str(out)] + names,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    with open(out) as f:
        return json.load(f)


def mismatch(name, run):
    """A description of how the two runs differ, or None if they agree."""
    initial = [np.asarray(w) for w in run["initial"]]
    single = [np.asarray(w) for w in run["single"]]
    mirrored = [np.asarray(w) for w in run["mirrored"]]
    if not np.allclose(run["mirrored_loss"], run["single_loss"], rtol=LOSS_RTOL, atol=0):
        return f"{name}: losses {run['mirrored_loss']} != {run['single_loss']}"
    scale = max(1.0, max(float(np.abs(w).max()) for w in single if w.size))
    update = max(float(np.abs(a - b).max()) for a, b in zip(single, initial) if a.size)
    error = max(float(np.abs(a - b).max()) for a, b in zip(single, mirrored) if a.size)
    if update <= MIN_UPDATE * scale:
        return f"{name}: training barely moved the weights ({update:.3g})"
    if error > WEIGHT_ATOL * scale:
        return (
            f"{name}: mirrored weights differ by {error:.3g} "
            f"(> {WEIGHT_ATOL * scale:.3g}) after updates of {update:.3g}"
        )
    return None


def test_groups_cover_every_application():
    assert sorted(sum(GROUPS, [])) == sorted(APPLICATIONS)


@pytest.mark.parametrize(
    "group", [0, pytest.param(1, marks=pytest.mark.large)]
)
def test_mirrored_training_matches_one_device(group, tmp_path):
    names = GROUPS[group]
    runs = run_group(names, tmp_path / "runs.json")
    problems = [mismatch(name, runs[name]) for name in names]
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)
