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
arguments.
"""

import argparse
import os
import sys
import time

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad argument value found after parsing (exit code 2)."""


def _quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
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
    command.add_argument("--out", default=out_default, help="output folder")
    command.add_argument("--seed", type=_seed, default=0, help="random seed")
    command.add_argument("--quick", action="store_true", help=quick_help)


def build_parser():
    from keras_attention import recipes

    parser = argparse.ArgumentParser(
        prog="keras-attention",
        description=(
            "Train, evaluate and look at attention models from keras_attention. "
            "Every task runs on embedded data that needs no download."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    commands.add_parser(
        "list", help="registered layers (plugins too), applications and presets"
    )

    run = commands.add_parser(
        "run",
        help="train one application, evaluate it, save the model and pictures",
        description="Train one application on its embedded data (or --data), "
        "with Keras's progress bar; print the metrics; write the .keras model "
        "and the attention pictures to --out.",
    )
    run.add_argument("task", choices=sorted(recipes.TASKS), help="the application")
    run.add_argument(
        "--model",
        help="the model of the task (default: the task's first); "
        + "; ".join(f"{t}: {', '.join(r.models)}" for t, r in sorted(recipes.TASKS.items())),
    )
    run.add_argument("--data", help="a data folder in the task's standard format")
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
        demo, "keras_attention_demo", "one short epoch each (a smoke test)"
    )
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
    explore.add_argument("model", help="a .keras file saved by Keras")
    explore.add_argument("input", help=".npy, .npz, image file, or text")
    explore.add_argument("--out", default="attention.html", help="the page to write")
    explore.add_argument(
        "--kind", default="auto",
        choices=("auto", "sequence", "image", "detection", "graph"),
        help="the view (default: from the model and input)",
    )
    explore.add_argument(
        "--index", type=int, default=0, help="which example of the batch to show"
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
    convert.add_argument("source", help="a Hugging Face folder or a timm file")
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
    convert.add_argument("--out", default="model.keras", help="the .keras file")
    return parser


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


def _timm_kwargs(args):
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


def command_convert(args):
    from keras_attention.applications import DETR
    from keras_attention.applications import VisionTransformer

    if not os.path.exists(args.source):
        raise UsageError(f"SOURCE: no such file or folder: {args.source}")
    if not args.out.endswith(".keras"):
        raise UsageError(
            f"--out: expected a path ending in .keras. Received: --out={args.out}"
        )
    timm_kwargs = _timm_kwargs(args)
    _make_out_file_folder(args.out)
    model_type = None
    if os.path.isdir(args.source):
        if args.timm_model:
            raise UsageError(
                "--timm-model is for a timm checkpoint file; SOURCE is a "
                "folder (read as a Hugging Face model)"
            )
        model_type = _hub_model_type(args.source)
        if model_type == "bert":
            model, description = _bert_model(args)
        else:
            family = DETR if model_type == "detr" else VisionTransformer
            model = family.from_transformers(
                args.source, num_classes=args.num_classes
            )
    else:
        if not args.timm_model:
            raise UsageError(
                "a timm checkpoint file needs its architecture: pass "
                "--timm-model NAME (e.g. vit_base_patch16_224)"
            )
        model = VisionTransformer.from_timm(
            args.source, model_name=args.timm_model,
            num_classes=args.num_classes, model_kwargs=timm_kwargs,
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
    for name, origin in keras_attention.registry.origins().items():
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
    if args.model is not None and args.model not in recipe.models:
        raise UsageError(
            f"Received an invalid value for argument `--model`, expected one of "
            f"{', '.join(recipe.models)} for task {args.task!r}. "
            f"Received: --model={args.model}"
        )
    if args.data is not None and not os.path.exists(args.data):
        raise UsageError(f"--data: no such file or folder: {args.data}")
    _make_out_folder(args.out, args.out)
    result = recipe.run(
        model_name=args.model or recipe.models[0],
        data=args.data,
        epochs=args.epochs,
        out=args.out,
        seed=args.seed,
        quick=args.quick,
    )
    print(reports.format_result(result))
    return EXIT_OK


def command_demo(args):
    from keras_attention import recipes
    from keras_attention import reports

    for task in recipes.DEMO_ORDER:  # every folder, before any work
        _make_out_folder(os.path.join(args.out, task), args.out)
    start = time.time()
    results = []
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
        results, args.out, time.time() - start, time.process_time()
    )
    page = reports.write_report_html(
        results, args.out, time.time() - start, time.process_time()
    )
    print(f"\nReport: {os.path.abspath(report)}")
    print(f"Interactive report: {os.path.abspath(page)}")
    return EXIT_OK


def _explore_input(text, model):
    """What `model` is called on, from the INPUT argument of `explore`."""
    import numpy as np

    lower = text.lower()
    if lower.endswith(".npy") or lower.endswith(".npz"):
        if not os.path.isfile(text):
            raise UsageError(f"INPUT: no such file: {text}")
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
    if lower.endswith((".png", ".jpg", ".jpeg", ".bmp", ".gif")):
        if not os.path.isfile(text):
            raise UsageError(f"INPUT: no such file: {text}")
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

    if not os.path.isfile(text):
        raise UsageError(f"--node-labels: no such file: {text}")
    try:
        return np.load(text, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UsageError(f"--node-labels: cannot read {text}: {error}") from None


def _make_out_folder(folder, out):
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


def _make_out_file_folder(out):
    """Makes the folder of the file `--out` (before any work); a folder as
    `--out`, or a file in the way of its folder, is a bad argument."""
    if os.path.isdir(out):
        raise UsageError(
            f"--out: expected a file, not the folder {out}. Received: --out={out}"
        )
    _make_out_folder(os.path.dirname(os.path.abspath(out)), out)


def command_explore(args):
    import keras

    import keras_attention  # noqa: F401 - registers the layers for loading
    from keras_attention import visualization

    if not os.path.isfile(args.model):
        raise UsageError(f"MODEL: no such file: {args.model}")
    _make_out_file_folder(args.out)
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
    print(f"Wrote {path}")
    return EXIT_OK


def main(argv=None):
    _quiet_tensorflow()
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with 2 on bad arguments
    try:
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
        # The command's own usage line, as argparse prints for its errors.
        commands = next(a for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction))
        commands.choices.get(args.command, parser).print_usage(sys.stderr)
        print(f"keras-attention: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, FileNotFoundError) as error:
        print(f"keras-attention: error: {error}", file=sys.stderr)
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
    except KeyboardInterrupt:
        print("keras-attention: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
