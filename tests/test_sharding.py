"""Attention sharded with `keras.distribution` equals one device (JAX backend).

`tests/sharding_check.py` runs in one subprocess with `KERAS_BACKEND=jax`
and 8 virtual CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`):
for a Sequential around each sequence layer of the registry and a tiny ViT,
a forward pass and one SGD step under `DataParallel` (8 devices) and under
`ModelParallel` (mesh (2, 4) "data" x "model", `layout_map`) must equal
one device within 1e-5, and every projection kernel must be split over the
"model" axis.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 1e-5
# Projection kernels per case (ViT: one block of query, key, value, output).
KERNELS = {
    "multi_head": 4,
    "multi_head_grouped": 4,
    "additive": 2,
    "scaled_dot_product": 0,
    "non_local": 4,  # theta, phi, g, output
    "local_window": 2,  # the fused qkv, output
    "vit": 4,
}

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax"),
    # One worker runs the module: its fixture (a subprocess, about 40 s) once.
    pytest.mark.xdist_group("sharding"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding") / "results.json"
    _on_eight_devices(os.path.join(HERE, "sharding_check.py"), str(out), timeout=600)
    with open(out) as f:
        return json.load(f)


# CI time: the subprocess that trains every case sharded takes about a
# minute on the slower machine kinds; `--run-large` runs these two. The
# layout checks below stay in CI.
@pytest.mark.large
@pytest.mark.parametrize("case", sorted(KERNELS))
@pytest.mark.parametrize("distribution", ["data_parallel", "model_parallel"])
def test_sharded_equals_one_device(results, case, distribution):
    run = results[case][distribution]
    assert run["output_error"] < TOLERANCE, run
    assert run["loss_error"] < TOLERANCE, run
    assert run["weight_error"] < TOLERANCE, run
    # The step changed the weights by far more than the tolerance.
    assert results[case]["moved"] > 1000 * TOLERANCE


@pytest.mark.large
@pytest.mark.parametrize("case", sorted(KERNELS))
def test_every_projection_kernel_is_sharded(results, case):
    kernels = results[case]["model_parallel"]["kernels"]
    assert len(kernels) == KERNELS[case], kernels
    for path, spec in kernels.items():
        assert spec is not None and "model" in spec, (path, spec)
    # DataParallel replicates them.
    for path, spec in results[case]["data_parallel"]["kernels"].items():
        assert spec is None or all(s is None for s in spec), (path, spec)


def _on_eight_devices(*arguments, timeout=300):
    """The finished run of Python with `arguments` (`"-c", script`, or a
    file and its arguments) on JAX with 8 CPU devices."""
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        TF_CPP_MIN_LOG_LEVEL="2",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.path.dirname(HERE),
    )
    completed = subprocess.run(
        [sys.executable, *arguments], env=env, capture_output=True, text=True,
        timeout=timeout,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed


def test_layout_map_errors_and_what_it_cannot_split():
    # A missing axis and an unbuilt model raise (the map was empty, and
    # ModelParallel replicated everything without a word); kernels the
    # axis divides nowhere (3 heads on 4 devices, the non-local block's 3
    # channels) are replicated with a warning naming them, where a model
    # holding one was refused whole ("divides the number of heads" of a
    # layer without heads).
    script = (
        "import warnings, keras, keras_attention\n"
        "from keras_attention.distribution import layout_map\n"
        "devices = keras.distribution.list_devices()\n"
        "mesh = keras.distribution.DeviceMesh((2, 4), ['data', 'model'], devices)\n"
        "heads = keras.Sequential([keras.Input((4, 6)), keras_attention.registry.get("
        "'multi_head', num_heads=3, key_dim=3)])\n"
        "unbuilt = keras.Sequential([keras_attention.registry.get("
        "'multi_head', num_heads=4, key_dim=4)])\n"
        "for model, axis in ((heads, 'heads'), (unbuilt, 'model')):\n"
        "    try:\n"
        "        layout_map(model, mesh, model_axis=axis)\n"
        "    except ValueError as e:\n"
        "        print('ERROR', e)\n"
        "blocks = keras.Sequential([keras.Input((4, 4, 6)), keras_attention."
        "registry.get('non_local'), keras_attention.registry.get('multi_head', "
        "num_heads=4, key_dim=4, attention_axes=(1, 2))])\n"
        "for model in (heads, blocks):\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        layouts = layout_map(model, mesh)\n"
        "    print('WARNING', len(layouts.keys()), *[str(w.message) for w in caught])\n"
    )
    completed = _on_eight_devices("-c", script)
    lines = completed.stdout.splitlines()
    errors = [line for line in lines if line.startswith("ERROR")]
    assert len(errors) == 2, completed.stdout
    assert "`model_axis`" in errors[0] and "model_axis='heads'" in errors[0]
    assert "expected a built model" in errors[1] and "0 variables" in errors[1]
    warned = [line for line in lines if line.startswith("WARNING")]
    assert len(warned) == 2, completed.stdout
    # Three heads of 3 on 4 devices: query, key, value, output replicated.
    assert warned[0].startswith("WARNING 0 ") and "4 projection kernel(s)" in warned[0]
    assert "query/kernel (6, 3, 3)" in warned[0]
    # The non-local block (6 channels, 3 inside) replicated; the
    # multi-head layer after it sharded, biases of its heads too.
    assert "non_local_block/theta/kernel (6, 3)" in warned[1]
    assert "multi_head_attention" not in warned[1]
    assert warned[1].startswith("WARNING 7 "), warned[1]  # q, k, v, output + 3 biases


def test_layers_named_alike_that_need_different_layouts_keep_their_own():
    # GAT's two layers (`graph_attention_1`, `graph_attention_2`) shared one
    # key: the second's (64, 7) kernel, which 4 devices cannot split, was
    # covered by the first's split layout, and building the model under
    # `ModelParallel` failed (jax's IndivisibleError).
    script = (
        "import warnings, numpy as np, keras\n"
        "from keras_attention.applications import GATNodeClassifier\n"
        "from keras_attention.distribution import layout_map\n"
        "devices = keras.distribution.list_devices()\n"
        "mesh = keras.distribution.DeviceMesh((2, 4), ['data', 'model'], devices)\n"
        "rng = np.random.default_rng(0)\n"
        "x = [rng.normal(size=(1, 20, 16)).astype('float32'),\n"
        "     rng.integers(0, 20, (1, 2, 40)).astype('int32')]\n"
        "build = lambda: GATNodeClassifier(num_features=16, num_classes=7)\n"
        "one = build()\n"
        "reference = np.asarray(one(x))\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    layouts = layout_map(one, mesh)\n"
        "with keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name='data').scope():\n"
        "    sharded = build()\n"
        "    sharded.set_weights(one.get_weights())\n"
        "    out = np.asarray(sharded(x))\n"
        "print('ERROR', float(np.abs(out - reference).max()))\n"
        "for v in sharded.weights:\n"
        "    if v.path.endswith('projection/kernel'):\n"
        "        print('SPEC', v.path, v.value.sharding.spec)\n"
    )
    completed = _on_eight_devices("-c", script)
    lines = completed.stdout.splitlines()
    error = [float(line.split()[1]) for line in lines if line.startswith("ERROR")]
    assert error and error[0] < 1e-5, completed.stdout
    specs = {line.split()[1]: line for line in lines if line.startswith("SPEC")}
    assert "'model'" in specs["graph_attention_1/projection/kernel"], specs
    assert "'model'" not in specs["graph_attention_2/projection/kernel"], specs
