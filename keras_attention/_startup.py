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

When the package is imported by the `keras-attention` command (its
console script, or `python -m keras_attention`), the command's arguments
are parsed and checked here first (`_cli_arguments.answer_early`): `--help`
and bad arguments are answered without loading TensorFlow at all, since
the command's entry point cannot run before this package's `__init__`.

This module imports nothing heavy: it runs before keras is imported.
"""

import importlib.util
import os
import sys


def before_tensorflow():
    """Apply the settings above, if TensorFlow is not loaded yet."""
    if "tensorflow" in sys.modules:
        return
    if is_the_command():
        from keras_attention import _cli_arguments

        _cli_arguments.answer_early(sys.argv[1:])  # exits on --help, bad arguments
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if importlib.util.find_spec("triton") is not None:
        try:
            import triton  # noqa: F401
        except ImportError:
            pass


# The console script as pip writes it (on Windows, an .exe or a -script.py).
_COMMAND_NAMES = ("keras-attention", "keras-attention.exe", "keras-attention-script.py")
_COMMAND_MODULES = ("keras_attention", "keras_attention.cli")


def is_the_command():
    """Whether this process is `keras-attention` (its console script) or
    `python -m keras_attention`, now importing the package."""
    if not sys.argv:
        return False
    if os.path.basename(sys.argv[0]) in _COMMAND_NAMES:
        return True
    if sys.argv[0] != "-m":  # `-m`: Python is finding the module to run
        return False
    options = getattr(sys, "orig_argv", [])[1:]  # the interpreter's first
    for i, option in enumerate(options):
        if option.startswith("-m"):
            module = option[2:] or (options[i + 1] if i + 1 < len(options) else "")
            return module in _COMMAND_MODULES
    return False
