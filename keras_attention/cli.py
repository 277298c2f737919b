"""The `keras-attention` command (also `python -m keras_attention`).

```
keras-attention list
keras-attention run translation|classification|detection|node-classification|causal-lm|pretraining
    [--model NAME] [--data PATH] [--epochs N] [--out DIR] [--seed S] [--quick]
keras-attention demo [--out DIR] [--seed S] [--quick]
keras-attention explore MODEL.keras INPUT [--out PAGE.html] [--kind K]
    [--index I] [--layers L ...] [--tokens "a b c"] [--node-labels Y.npy]
keras-attention convert SOURCE [--timm-model NAME [--timm-kwargs JSON]] [--num-classes N]
    [--out model.keras]
```

Exit codes: 0 success, 1 the job failed (the message says why), 2 bad
arguments, 130 interrupted (Ctrl-C). The arguments are parsed, and those
that need no model checked, in `_cli_arguments`, before TensorFlow loads.
"""

import os
import re
import sys
import time

from keras_attention._cli_arguments import EXIT_FAILED
from keras_attention._cli_arguments import EXIT_INTERRUPTED
from keras_attention._cli_arguments import EXIT_OK
from keras_attention._cli_arguments import EXIT_TERMINATED
from keras_attention._cli_arguments import EXIT_USAGE
from keras_attention._cli_arguments import Terminated
from keras_attention._cli_arguments import restore_terminate
from keras_attention._cli_arguments import terminate_as_interrupt
from keras_attention._cli_arguments import IMAGE_SUFFIXES
from keras_attention._cli_arguments import UsageError
from keras_attention._cli_arguments import build_parser
from keras_attention._cli_arguments import check_arguments
from keras_attention._cli_arguments import print_usage_error
from keras_attention._cli_arguments import started
from keras_attention._cli_arguments import timm_kwargs

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "UsageError", "build_parser", "main"]


def _quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _hub_model_type(folder):
    import json

    try:
        with open(os.path.join(folder, "config.json")) as f:
            return json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # the converter reports a missing or bad config


def _describe(model):
    if type(model).__name__ == "DETR":
        return (
            f"DETR: ResNet {model.resnet_block} {list(model.resnet_depths)}, "
            f"{model.num_encoder_layers} + {model.num_decoder_layers} layers "
            f"of width {model.hidden_dim}, {model.num_queries} queries, "
            f"{model.num_classes} classes, {model.count_params():,} parameters"
        )
    backbone = model.backbone
    return (
        f"{type(model).__name__}: {backbone.depth} blocks of width "
        f"{backbone.hidden_dim}, images {backbone.image_size + (backbone.num_channels,)}, "
        f"{model.num_classes} classes, {model.count_params():,} parameters"
    )


def _bert_model(args):
    """A BERT folder's `TextClassifier` (the checkpoint's head or a new one);
    when the checkpoint has no classifier and no `--num-classes` is given,
    its `MaskedLanguageModel` (a `BertForMaskedLM` / `BertForPreTraining`)
    or else its encoder alone (`TextClassifierBackbone`); and its
    description."""
    from keras_attention.applications import MaskedLanguageModel
    from keras_attention.applications import TextClassifier
    from keras_attention.applications import TextClassifierBackbone

    try:
        model = TextClassifier.from_transformers(
            args.source, num_classes=args.num_classes
        )
        backbone = model.backbone
        what = f"TextClassifier (BERT), {model.num_classes} classes"
    except ValueError as error:
        if "num_classes" not in str(error):
            raise
        try:
            model = MaskedLanguageModel.from_transformers(args.source)
            backbone = model.backbone
            what = "MaskedLanguageModel (BERT encoder and masked-LM head)"
        except ValueError as no_head:
            if "no masked-LM head" not in str(no_head):
                raise
            model = backbone = TextClassifierBackbone.from_transformers(args.source)
            what = "TextClassifierBackbone (BERT encoder, no head)"
    return model, (
        f"{what}: {backbone.depth} blocks of width {backbone.hidden_dim}, "
        f"{backbone.vocabulary_size} tokens, sequence length "
        f"{backbone.sequence_length}, {model.count_params():,} parameters"
    )


def command_convert(args):
    from keras_attention.applications import DETR
    from keras_attention.applications import VisionTransformer

    model_type = None
    if os.path.isdir(args.source):
        model_type = _hub_model_type(args.source)
        if model_type == "bert":
            model, description = _bert_model(args)
        else:
            family = DETR if model_type == "detr" else VisionTransformer
            model = family.from_transformers(
                args.source, num_classes=args.num_classes
            )
    else:
        model = VisionTransformer.from_timm(
            args.source, model_name=args.timm_model,
            num_classes=args.num_classes, model_kwargs=timm_kwargs(args),
        )
    from keras_attention._writing import write_atomically

    write_atomically(args.out, model.save, suffix=".keras")
    print(description if model_type == "bert" else _describe(model))
    print(f"Saved: {os.path.abspath(args.out)}")
    return EXIT_OK


def command_list():
    import keras_attention
    from keras_attention import recipes
    from keras_attention.applications import presets

    print("Attention layers (name: class, from):")
    refused = keras_attention.registry.refused()
    for name, origin in keras_attention.registry.origins().items():
        if name in refused:
            print(f"  {name:20s} {'(refused)':28s} {refused[name]}")
            continue
        cls = keras_attention.get_class(name)
        print(f"  {name:20s} {cls.__name__:28s} {origin}")
    print("\nApplications (task: models):")
    for task, recipe in sorted(recipes.TASKS.items()):
        print(f"  {task:20s} {', '.join(recipe.models)}")
    print("\nPresets (name: class, weights):")
    for name, preset in presets().items():
        weights = "with weights" if preset.weights else "configuration only"
        print(f"  {name:22s} {preset.class_name:22s} {weights}")
    return EXIT_OK


def command_run(args):
    from keras_attention import recipes
    from keras_attention import reports

    recipe = recipes.TASKS[args.task]
    try:
        result = recipe.run(
            model_name=args.model or recipe.models[0],
            data=args.data,
            epochs=args.epochs,
            out=args.out,
            seed=args.seed,
            quick=args.quick,
        )
    except ValueError as error:
        raise _name_the_data_option(error, args.data) from None
    print(reports.format_result(result))
    return EXIT_OK


def _name_the_data_option(error, data):
    """A loader's error about its own argument (`path`, `texts`), which a
    `run` was given as `--data`, naming the option."""
    text = str(error)
    for name in ("path", "texts"):
        received = f"{name}={data!r}"
        if data is not None and f"argument `{name}`" in text and received in text:
            text = text.replace(f"argument `{name}`", "`--data`")
            return ValueError(text.replace(received, f"--data {data}"))
    return error


def command_demo(args):
    from keras_attention import recipes
    from keras_attention import reports

    start = time.time()
    results = []
    reports.mark_in_progress(args.out)
    for task in recipes.DEMO_ORDER:
        recipe = recipes.TASKS[task]
        print(f"\n=== {task} ({recipe.models[0]}) ===", flush=True)
        task_out = os.path.join(args.out, task)
        cpu = time.process_time()
        result = recipe.run(
            model_name=recipe.models[0],
            data=None,
            epochs=recipe.quick_epochs if args.quick else recipe.demo_epochs,
            out=task_out,
            seed=args.seed,
            quick=args.quick,
        )
        result.cpu_seconds = time.process_time() - cpu
        print(reports.format_result(result), flush=True)
        results.append(result)
    report = reports.write_report(
        results, args.out, time.time() - start, time.process_time(), args.quick
    )
    page = reports.write_report_html(
        results, args.out, time.time() - start, time.process_time(), args.quick
    )
    print(f"\nReport: {os.path.abspath(report)}")
    print(f"Interactive report: {os.path.abspath(page)}")
    return EXIT_OK


def _explore_input(text, model):
    """What `model` is called on, from the INPUT argument of `explore`."""
    import numpy as np

    lower = text.lower()
    if lower.endswith(".npy") or lower.endswith(".npz"):
        try:
            loaded = np.load(text, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise UsageError(f"INPUT: cannot read {text}: {error}") from None
        if lower.endswith(".npy"):
            return loaded
        arrays = {name: loaded[name] for name in loaded.files}
        if len(arrays) == 1:
            return next(iter(arrays.values()))
        try:  # a model of named inputs takes them by name
            named = isinstance(model.input, dict)
        except (AttributeError, ValueError):
            named = False
        return arrays if named else list(arrays.values())
    if lower.endswith(IMAGE_SUFFIXES):
        import keras

        shape = _model_image_shape(model)
        try:
            image = keras.utils.load_img(
                text,
                color_mode="grayscale" if shape and shape[-1] == 1 else "rgb",
                target_size=tuple(shape[:2]) if shape and None not in shape[:2] else None,
            )
        except (OSError, ValueError) as error:  # PIL's UnidentifiedImageError too
            raise UsageError(f"INPUT: cannot read {text}: {error}") from None
        return (keras.utils.img_to_array(image) / 255.0)[None].astype("float32")
    if getattr(model, "preprocessor", None) is None:
        raise UsageError(
            f"INPUT: no such .npy/.npz/image file, and the model "
            f"{model.name!r} has no text preprocessor to read text: {text!r}"
        )
    return text


def _model_image_shape(model):
    """`(height, width, channels)` the model takes, where it says so."""
    size = getattr(model, "image_size", None)
    if size is not None:
        size = (size, size) if isinstance(size, int) else tuple(size)
        return size + (getattr(model, "num_channels", 3),)
    try:
        shape = tuple(model.inputs[0].shape[1:])
    except (AttributeError, IndexError, TypeError, ValueError):
        # A subclassed model (DETR): the shape it was built on, kept in
        # its file.
        config = model.get_build_config() or {}
        shape = tuple(config.get("input_shape") or ())[1:]
    return shape if len(shape) == 3 else None


def _load_node_labels(text):
    import numpy as np

    try:
        return np.load(text, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UsageError(f"--node-labels: cannot read {text}: {error}") from None


def command_explore(args):
    import keras

    import keras_attention
    from keras_attention import visualization

    # The layers register at import; installed plugins' layers when
    # discovered (a plain Keras model holding one loads only then).
    keras_attention.discover_plugins()
    node_labels = None
    if args.node_labels:
        node_labels = _load_node_labels(args.node_labels)
    try:
        model = keras.saving.load_model(args.model)
    except Exception as error:  # noqa: BLE001 - any reason it cannot load
        raise ValueError(f"cannot load the model {args.model}: {error}") from None
    inputs = _explore_input(args.input, model)
    layers = None
    if args.layers:
        layers = [int(v) if v.lstrip("-").isdigit() else v for v in args.layers]
    try:
        path = visualization.explore(
            model,
            inputs,
            args.out,
            kind=args.kind,
            index=args.index,
            layers=layers,
            tokens=args.tokens.split() if args.tokens else None,
            node_labels=node_labels,
        )
    except ValueError as error:
        raise _explore_usage_error(error) or error
    print(f"Wrote {path}")
    return EXIT_OK


# `explore`'s arguments as the command names them.
_EXPLORE_OPTIONS = {
    "index": "--index", "layers": "--layers", "tokens": "--tokens",
    "node_labels": "--node-labels", "kind": "--kind", "path": "--out",
    "inputs": "INPUT",
}


def _explore_usage_error(error):
    """`explore`'s error about one of its arguments, as a `UsageError` that
    names the command's option (`--index`, not `index`); None for another
    error."""
    text = str(error)
    named = re.search(r"argument `(\w+)`", text)
    if not named or named.group(1) not in _EXPLORE_OPTIONS:
        return None
    name = named.group(1)
    text = re.sub(
        rf"(?<![\w-]){name}(?=`|=| <| of shape)", _EXPLORE_OPTIONS[name], text
    )
    return UsageError(text)


def main(argv=None):
    _quiet_tensorflow()
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with 2 on bad arguments
    started()
    previous = terminate_as_interrupt()
    try:
        check_arguments(args)
        if args.command == "list":
            return command_list()
        if args.command == "run":
            return command_run(args)
        if args.command == "explore":
            return command_explore(args)
        if args.command == "convert":
            return command_convert(args)
        return command_demo(args)
    except UsageError as error:
        print_usage_error(parser, args, error)
        return EXIT_USAGE
    except (ValueError, FileNotFoundError) as error:
        # Keras's call errors carry terminal colour codes (bold names).
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
        print(f"keras-attention: error: {text}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # `keras-attention list | head`: the reader left
        _silence_stdout()
        return EXIT_FAILED
    except OSError as error:  # a file that cannot be written or read
        # `os.replace(temporary, target)` names the target second.
        where = error.filename2 or error.filename
        reason = error.strerror or str(error)
        print(
            f"keras-attention: error: {reason}"
            + (f": {os.path.abspath(os.fsdecode(where))}" if where else ""),
            file=sys.stderr,
        )
        return EXIT_FAILED
    except KeyboardInterrupt as interrupt:
        terminated = isinstance(interrupt, Terminated)
        print(
            "keras-attention: " + ("terminated" if terminated else "interrupted"),
            file=sys.stderr,
        )
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        restore_terminate(previous)


def _silence_stdout():
    # Python flushes stdout again at exit, into the closed pipe.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file behind sys.stdout (captured)
        pass


if __name__ == "__main__":
    sys.exit(main())
