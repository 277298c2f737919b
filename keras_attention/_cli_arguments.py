"""The `keras-attention` command's arguments: the parser and the checks
that need no model, answered before keras loads.

`keras_attention._startup` calls `answer_early` while the package is
imported by the command (its console script or `python -m
keras_attention`), before TensorFlow is imported: `--help`, a bad argument
and a missing file are answered at once, and a Ctrl-C while TensorFlow
loads ends the command with one line. `cli.main` parses and checks again
(the same functions), so a call of `main(argv)` from Python is answered
alike.

This module imports only the standard library.
"""

import argparse
import os
import signal
import sys

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# The models of each task of `run`, the first the default
# (`recipes.TASKS` runs them), and the tasks of `demo` in order.
TASK_MODELS = {
    "translation": ("transformer", "rnn"),
    "classification": ("cbam_resnet", "vit"),
    "detection": ("detr", "detr_cbam"),
    "node-classification": ("gat", "gatv2"),
    "causal-lm": ("rope", "alibi"),
    "pretraining": ("bert",),
}
DEMO_TASKS = (
    "classification", "translation", "detection", "node-classification",
    "causal-lm",
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


class UsageError(Exception):
    """A bad argument value found after parsing (exit code 2)."""


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _example_index(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected an example of the batch, an integer from 0, got {text!r}"
        )
    return value


def _seed(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(
            f"expected an integer from 0 to 2**32 - 1, got {text!r}"
        )
    return value


def _add_output_arguments(command, out_default, quick_help):
    """`--out`, `--seed` and `--quick` of a command that trains."""
    command.add_argument(
        "--out", default=out_default, help="output folder (default: %(default)s)"
    )
    command.add_argument("--seed", type=_seed, default=0, help="random seed")
    command.add_argument("--quick", action="store_true", help=quick_help)


def _add_run_and_demo(commands):
    run = commands.add_parser(
        "run",
        help="train one application, evaluate it, save the model and pictures",
        description="Train one application on its embedded data (or --data), "
        "with Keras's progress bar; print the metrics; write the .keras model "
        "and its attention pictures (node classification: a picture for "
        "graphs of at most 200 nodes; pretraining: the masked LM, with the "
        "fine-tuned classifier on the embedded texts only, no picture) to "
        "--out. "
        "Give each run its own --out: an earlier run's files there are "
        "replaced, and those this run does not write stay beside it.",
    )
    run.add_argument("task", choices=sorted(TASK_MODELS), help="the application")
    run.add_argument(
        "--model",
        help="the model of the task (default: the task's first); "
        + "; ".join(f"{t}: {', '.join(m)}" for t, m in sorted(TASK_MODELS.items())),
    )
    run.add_argument(
        "--data",
        help="the task's own data instead of the embedded set: classification "
        "an MNIST folder; translation a folder of line-aligned "
        "<split>.en / <split>.de files (Multi30k's); node-classification a Planetoid folder "
        "or its ind.<name>.graph file; causal-lm and "
        "pretraining a .txt file or folder; detection takes none "
        "(README, \"Data\")",
    )
    run.add_argument("--epochs", type=_positive_int, help="training epochs")
    _add_output_arguments(
        run, "keras_attention_out", "a small slice of the data (a smoke test)"
    )
    demo = commands.add_parser(
        "demo",
        help="the five applications on embedded data, with a report",
        description="Train (or fine-tune the shipped weights of) and "
        "evaluate classification, translation, detection, node "
        "classification and the causal LM on their embedded data with "
        "short recipes, and write report.md with the "
        "metrics and pictures, and report.html with the same and each "
        "application's interactive attention explorer, to --out.",
    )
    _add_output_arguments(
        demo, "keras_attention_demo",
        "a few short epochs each on a slice of the data (a smoke test)",
    )


def _add_explore(commands):
    explore = commands.add_parser(
        "explore",
        help="write an interactive attention page (HTML) for a saved model",
        description="Load a saved .keras model, run it on INPUT and write one "
        "self-contained HTML page to explore its attention (layers, heads, "
        "tokens, patches, boxes, graph nodes). INPUT is a .npy file (a batch: "
        "token ids or features (B, T[, C]), images (B, H, W, C)), a .npz file "
        "with the arrays the model takes in order (a graph: features and "
        "edges), an image file (.png/.jpg, scaled to [0, 1] and resized to the "
        "model's input), or, for a model with a text preprocessor "
        "(TextClassifier, translators), the text itself.",
    )
    explore.add_argument("model", metavar="MODEL", help="a .keras file saved by Keras")
    explore.add_argument(
        "input", metavar="INPUT", help=".npy, .npz, image file, or text"
    )
    explore.add_argument(
        "--out", default="attention.html",
        help="the page to write (default: %(default)s)",
    )
    explore.add_argument(
        "--kind", default="auto",
        choices=("auto", "sequence", "image", "detection", "graph"),
        help="the view (default: from the model and input)",
    )
    explore.add_argument(
        "--index", type=_example_index, default=0,
        help="which example of the batch to show (from 0)",
    )
    explore.add_argument(
        "--layers", nargs="+",
        help="attention layers to show: names, paths or indices in call order",
    )
    explore.add_argument(
        "--tokens", help="labels of the tokens, separated by spaces"
    )
    explore.add_argument(
        "--node-labels", help="a .npy file with one class per node (graphs)"
    )


def _add_convert(commands):
    convert = commands.add_parser(
        "convert",
        help="a timm or Hugging Face ViT/Swin/DETR/BERT checkpoint to a .keras model",
        description="Convert a pretrained ViT, Swin, DETR or BERT checkpoint "
        "you have locally: a Hugging Face ViT, DETR or BERT folder (config.json + "
        "model.safetensors or "
        "pytorch_model.bin, e.g. a downloaded hub snapshot or what "
        "save_pretrained writes; a BERT folder's vocab.txt becomes the "
        "model's preprocessor), or a timm checkpoint file (.safetensors, "
        ".pth, .bin) with --timm-model. Every tensor is checked before any "
        "is loaded.",
    )
    convert.add_argument(
        "source", metavar="SOURCE", help="a Hugging Face folder or a timm file"
    )
    convert.add_argument(
        "--timm-model",
        help="the timm model name of a timm file (e.g. vit_base_patch16_224)",
    )
    convert.add_argument(
        "--timm-kwargs",
        metavar="JSON",
        help="arguments of timm.create_model for --timm-model, as a JSON "
        'object, for a checkpoint of another size than the named model\'s '
        '(e.g. \'{"img_size": 32, "window_size": 4}\')',
    )
    convert.add_argument(
        "--num-classes",
        type=_positive_int,
        help="a new head with this many classes (default: the checkpoint's)",
    )
    convert.add_argument(
        "--out", default="model.keras", help="the .keras file (default: %(default)s)"
    )


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-attention",
        description=(
            "Train, evaluate and look at attention models from keras_attention. "
            "Every task runs on embedded data that needs no download."
        ),
    )
    from keras_attention.version import __version__

    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    commands.add_parser(
        "list", help="registered layers (plugins too), applications and presets"
    )
    _add_run_and_demo(commands)
    _add_explore(commands)
    _add_convert(commands)
    return parser


def print_usage_error(parser, args, error):
    """The command's own usage line and the error, as argparse prints its
    errors."""
    commands = next(a for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction))
    command = commands.choices.get(args.command, parser)
    command.print_usage(sys.stderr)
    print(f"{command.prog}: error: {error}", file=sys.stderr)


# The checks of each command that need no model (before any work) ----------


def make_out_folder(folder, out):
    """Makes the folder of `--out` and checks that files can be written in
    it, before any work; a file in its way, or a folder that takes no
    files (read-only, no permission), is a bad argument."""
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:  # a file of that name, or in the path
        raise UsageError(
            f"--out: cannot make the folder {folder}: {error.strerror}. "
            f"Received: --out={out}"
        ) from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise UsageError(
            f"--out: cannot write in the folder {folder}: {error.strerror}. "
            f"Received: --out={out}"
        ) from None


def make_out_file_folder(out):
    """Makes the folder of the file `--out` (before any work); a folder as
    `--out`, or a file in the way of its folder, is a bad argument."""
    if os.path.isdir(out):
        raise UsageError(
            f"--out: expected a file, not the folder {out}. Received: --out={out}"
        )
    make_out_folder(os.path.dirname(os.path.abspath(out)), out)


def _check_run(args):
    models = TASK_MODELS[args.task]
    if args.model is not None and args.model not in models:
        raise UsageError(
            f"Received an invalid value for argument `--model`, expected one of "
            f"{', '.join(models)} for task {args.task!r}. "
            f"Received: --model={args.model}"
        )
    if args.data is not None and args.task == "detection":
        raise UsageError(
            "--data: the detection task trains on the generated digit "
            "canvases only (no folder format is read yet)."
        )
    if args.data is not None and not os.path.exists(args.data):
        raise UsageError(f"--data: no such file or folder: {args.data}")
    make_out_folder(args.out, args.out)


def _check_demo(args):
    for task in DEMO_TASKS:  # every folder, before any work
        make_out_folder(os.path.join(args.out, task), args.out)


def _check_explore(args):
    if not os.path.isfile(args.model):
        raise UsageError(f"MODEL: no such file: {args.model}")
    if args.input.lower().endswith((".npy", ".npz") + IMAGE_SUFFIXES) and (
        not os.path.isfile(args.input)
    ):
        raise UsageError(f"INPUT: no such file: {args.input}")
    if args.node_labels and not os.path.isfile(args.node_labels):
        raise UsageError(f"--node-labels: no such file: {args.node_labels}")
    make_out_file_folder(args.out)


def timm_kwargs(args):
    """The JSON object of `--timm-kwargs` as a dict (`{}` when not given)."""
    import json

    if args.timm_kwargs is None:
        return {}
    if not args.timm_model:
        raise UsageError("--timm-kwargs goes with --timm-model (a timm file)")
    try:
        kwargs = json.loads(args.timm_kwargs)
    except ValueError as error:
        raise UsageError(
            f"--timm-kwargs: expected a JSON object ({error}). "
            f"Received: --timm-kwargs={args.timm_kwargs}"
        ) from None
    if not isinstance(kwargs, dict):
        raise UsageError(
            "--timm-kwargs: expected a JSON object, e.g. '{\"img_size\": "
            f"32}}'. Received: --timm-kwargs={args.timm_kwargs}"
        )
    return kwargs


def _check_convert(args):
    if not os.path.exists(args.source):
        raise UsageError(f"SOURCE: no such file or folder: {args.source}")
    if not args.out.endswith(".keras"):
        raise UsageError(
            f"--out: expected a path ending in .keras. Received: --out={args.out}"
        )
    timm_kwargs(args)
    if os.path.isdir(args.source) and args.timm_model:
        raise UsageError(
            "--timm-model is for a timm checkpoint file; SOURCE is a "
            "folder (read as a Hugging Face model)"
        )
    if not os.path.isdir(args.source) and not args.timm_model:
        raise UsageError(
            "a timm checkpoint file needs its architecture: pass "
            "--timm-model NAME (e.g. vit_base_patch16_224)"
        )
    make_out_file_folder(args.out)


_CHECKS = {
    "run": _check_run, "demo": _check_demo, "explore": _check_explore,
    "convert": _check_convert,
}


def check_arguments(args):
    """Raises `UsageError` for the bad arguments that need no model: an
    unknown model of the task, a missing file, an `--out` that cannot be
    written (its folders are made)."""
    check = _CHECKS.get(args.command)
    if check is not None:
        check(args)


# Answering before keras loads ---------------------------------------------


def _interrupted_while_starting(signum, frame):
    print("keras-attention: interrupted", file=sys.stderr)
    raise SystemExit(EXIT_INTERRUPTED)


def answer_early(argv):
    """Parses and checks `argv` before keras loads: exits (as `main` would)
    on `--help` and bad arguments; otherwise a Ctrl-C until `main` runs
    ends the process with one line, not a traceback through TensorFlow's
    import."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with 0 on --help, 2 on bad arguments
    try:
        check_arguments(args)
    except UsageError as error:
        print_usage_error(parser, args, error)
        raise SystemExit(EXIT_USAGE) from None
    _replace_interrupt_handler(signal.default_int_handler, _interrupted_while_starting)


def started():
    """Ctrl-C raises KeyboardInterrupt again (the command handles it)."""
    _replace_interrupt_handler(_interrupted_while_starting, signal.default_int_handler)


def _replace_interrupt_handler(old, new):
    # Only Python's own handler or ours: a SIGINT the shell ignores (a
    # background job) stays ignored; only the main thread may set one.
    try:
        if signal.getsignal(signal.SIGINT) is old:
            signal.signal(signal.SIGINT, new)
    except ValueError:
        pass


EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`) as an interrupt: the files being
    written are cleaned up as for a Ctrl-C (their temporary files were
    left behind)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def terminate_as_interrupt():
    """SIGTERM raises `Terminated` where it would end the process at once;
    returns the handler to give back (`restore_terminate`), or None."""
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            return signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        pass
    return None


def restore_terminate(previous):
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
