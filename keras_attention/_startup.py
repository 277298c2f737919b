"""What `import keras_attention` settles before TensorFlow loads.

Process settings that TensorFlow reads once, when it is imported, so only
whoever imports first can choose them (a user's own value always wins, and
nothing is changed once TensorFlow is loaded):

- `TF_CPP_MIN_LOG_LEVEL=2`: TensorFlow's C++ start-up chatter (CUDA
  probing, CPU flags) otherwise hides the output of the command and of
  scripts. Not all of it: TensorFlow 2.21 writes its oneDNN notice and a
  CUDA probe line through absl before any log level is read (a plain
  `import tensorflow` prints them too), so those few lines remain.
- Triton (PyTorch's CUDA builds bring it) crashes the process when it is
  first imported after TensorFlow, e.g. by `keras-attention convert`, whose
  entry point imports this package (so TensorFlow) first: import it now.

`TF_ENABLE_ONEDNN_OPTS` is left to the user: on an AVX2-only CPU, where
TensorFlow leaves oneDNN's kernels off, they made the attention layer 1.42x
faster, a small translator's training epochs about as fast, and its
tracing and compilation seconds slower, so the short `keras-attention run`
commands took up to 1.17x longer (BENCHMARKS.md, "AVX2 only");
`keras_attention.ops.onednn_status()` says what runs.

This module imports nothing heavy: it runs before keras is imported.
"""

import importlib.util
import os
import sys


def before_tensorflow():
    """Apply the settings above, if TensorFlow is not loaded yet."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if importlib.util.find_spec("triton") is not None:
        try:
            import triton  # noqa: F401
        except ImportError:
            pass
