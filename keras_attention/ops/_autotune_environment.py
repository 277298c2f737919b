"""What `autotune` asks of the process and of the trace in progress.

The environment's switch (`KERAS_ATTENTION_AUTOTUNE`), whether this
process's TensorFlow runs its oneDNN kernels (`onednn_status`, part of a
machine's identity in the choice file), TensorFlow's mode of the code
being traced (`tf_mode`: eager, graph or XLA) and whether XLA compiles it
for a CPU (`xla_on_cpu`). `autotune` keeps every one of them importable
under its own name.
"""

import os

import keras


def _enabled_by_environment():
    """`KERAS_ATTENTION_AUTOTUNE`: unset or 1 measures, 0 keeps the rule."""
    value = os.environ.get("KERAS_ATTENTION_AUTOTUNE", "")
    word = value.strip().lower()
    if word in ("", "1", "true", "on", "yes"):
        return True
    if word in ("0", "false", "off", "no"):
        return False
    raise ValueError(
        "Received an invalid value for the environment variable "
        "`KERAS_ATTENTION_AUTOTUNE`, expected 1 (measure at first use) or 0 "
        f"(keep the fixed rule). Received: KERAS_ATTENTION_AUTOTUNE={value!r}"
    )


def onednn_status():
    """Whether this process's TensorFlow runs its oneDNN kernels, and why.

    TensorFlow turns oneDNN on by itself only on CPUs with AVX512-VNNI,
    AVX512-BF16 or AMX, and runs Eigen's kernels on the others (AVX2-only,
    AVX-512 without VNNI). There, `TF_ENABLE_ONEDNN_OPTS=1` set before
    TensorFlow is imported made `MultiHeadAttention`'s forward + backward
    1.41x faster at 512 tokens, best mode each (2048^2 matmul 121 -> 179
    GFLOP/s), on an AVX2-only AMD EPYC; a small translator's training
    epochs ran about as fast and its first (tracing, compilation) seconds
    slower, so the short `keras-attention run` commands took up to 1.17x
    longer (BENCHMARKS.md, "AVX2 only"): a process-wide choice, left to the
    user.

    >>> from keras_attention import ops as attention_ops
    >>> attention_ops.onednn_status()  # doctest: +SKIP
    'on: TensorFlow's default on this CPU'

    Returns:
        A line starting with `"on"`, `"off"` or `"unknown"` (another
        backend, or a TensorFlow that does not say).
    """
    if keras.backend.backend() != "tensorflow":
        return f"unknown: the {keras.backend.backend()} backend"
    try:
        from tensorflow.python.util import _pywrap_util_port

        enabled = bool(_pywrap_util_port.IsMklEnabled())
    except Exception:  # pragma: no cover - a moved private helper
        return "unknown: this TensorFlow does not say"
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if setting is not None:
        why = f"TF_ENABLE_ONEDNN_OPTS={setting}"
    elif enabled:
        why = "TensorFlow's default on this CPU"
    else:
        why = (
            "TensorFlow's default on this CPU; TF_ENABLE_ONEDNN_OPTS=1, set "
            "before TensorFlow is imported, turns it on (large attention "
            "layers run faster, small models may not)"
        )
    return f"{'on' if enabled else 'off'}: {why}"


def tf_mode():
    """"xla" inside a `jit_compile=True` function, "graph" or "eager"."""
    import tensorflow as tf

    if tf.executing_eagerly():
        return "eager"
    try:
        from tensorflow.python.ops import control_flow_util

        graph = tf.compat.v1.get_default_graph()
        if control_flow_util.GraphOrParentsInXlaContext(graph):
            return "xla"
    except Exception:  # pragma: no cover - a moved private helper
        pass
    return "graph"


def xla_on_cpu():
    """Whether the code being traced is compiled by XLA for a CPU (always
    on JAX's CPU backend; inside a `jit_compile=True` function on
    TensorFlow without a GPU). XLA's CPU backend runs some products much
    slower than their simple layout (see `ops/dispatch.py`)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend != "tensorflow" or tf_mode() != "xla":
        return False
    import tensorflow as tf

    return not tf.config.list_logical_devices("GPU")
