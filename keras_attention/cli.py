"""The `keras-attention` command (also `python -m keras_attention`).

```
keras-attention list
keras-attention run translation|classification|detection|node-classification
    [--model NAME] [--data PATH] [--epochs N] [--out DIR] [--seed S]
keras-attention demo [--out DIR] [--seed S]
keras-attention convert SOURCE [--timm-model NAME] [--num-classes N]
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
    run.add_argument("--out", default="keras_attention_out", help="output folder")
    run.add_argument("--seed", type=int, default=0, help="random seed")
    run.add_argument(
        "--quick", action="store_true", help="a small slice of the data (a smoke test)"
    )

    demo = commands.add_parser(
        "demo",
        help="all four applications on embedded data, with a report",
        description="Train and evaluate all four applications on their "
        "embedded data with short recipes, and write report.md with the "
        "metrics and pictures to --out.",
    )
    demo.add_argument("--out", default="keras_attention_demo", help="output folder")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.add_argument(
        "--quick", action="store_true", help="one short epoch each (a smoke test)"
    )
    convert = commands.add_parser(
        "convert",
        help="a timm or Hugging Face ViT checkpoint to a .keras model",
        description="Convert a pretrained ViT checkpoint you have locally: a "
        "Hugging Face folder (config.json + model.safetensors or "
        "pytorch_model.bin, e.g. a downloaded hub snapshot or what "
        "save_pretrained writes), or a timm checkpoint file (.safetensors, "
        ".pth, .bin) with --timm-model. Every tensor is checked before any "
        "is loaded.",
    )
    convert.add_argument("source", help="a Hugging Face folder or a timm file")
    convert.add_argument(
        "--timm-model",
        help="the timm model name of a timm file (e.g. vit_base_patch16_224)",
    )
    convert.add_argument(
        "--num-classes",
        type=_positive_int,
        help="a new head with this many classes (default: the checkpoint's)",
    )
    convert.add_argument("--out", default="model.keras", help="the .keras file")
    return parser


def _import_triton_first():
    """Triton (PyTorch's CUDA builds bring it) crashes the process when it
    is first imported after TensorFlow; `convert` imports it before."""
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401


def command_convert(args):
    from keras_attention.applications import VisionTransformer

    if not os.path.exists(args.source):
        raise UsageError(f"SOURCE: no such file or folder: {args.source}")
    if not args.out.endswith(".keras"):
        raise UsageError(
            f"--out: expected a path ending in .keras. Received: --out={args.out}"
        )
    if os.path.isdir(args.source):
        if args.timm_model:
            raise UsageError(
                "--timm-model is for a timm checkpoint file; SOURCE is a "
                "folder (read as a Hugging Face model)"
            )
        model = VisionTransformer.from_transformers(
            args.source, num_classes=args.num_classes
        )
    else:
        if not args.timm_model:
            raise UsageError(
                "a timm checkpoint file needs its architecture: pass "
                "--timm-model NAME (e.g. vit_base_patch16_224)"
            )
        model = VisionTransformer.from_timm(
            args.source, model_name=args.timm_model, num_classes=args.num_classes
        )
    directory = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(directory, exist_ok=True)
    model.save(args.out)
    backbone = model.backbone
    print(
        f"{type(model).__name__}: {backbone.depth} blocks of width "
        f"{backbone.hidden_dim}, images {backbone.image_size + (backbone.num_channels,)}, "
        f"{model.num_classes} classes, {model.count_params():,} parameters"
    )
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

    recipe = recipes.TASKS[args.task]
    if args.model is not None and args.model not in recipe.models:
        raise UsageError(
            f"Received an invalid value for argument `--model`, expected one of "
            f"{', '.join(recipe.models)} for task {args.task!r}. "
            f"Received: --model={args.model}"
        )
    if args.data is not None and not os.path.exists(args.data):
        raise UsageError(f"--data: no such file or folder: {args.data}")
    os.makedirs(args.out, exist_ok=True)
    result = recipe.run(
        model_name=args.model or recipe.models[0],
        data=args.data,
        epochs=args.epochs,
        out=args.out,
        seed=args.seed,
        quick=args.quick,
    )
    print(recipes.format_result(result))
    return EXIT_OK


def command_demo(args):
    from keras_attention import recipes

    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    results = []
    for task in recipes.DEMO_ORDER:
        recipe = recipes.TASKS[task]
        print(f"\n=== {task} ({recipe.models[0]}) ===", flush=True)
        task_out = os.path.join(args.out, task)
        os.makedirs(task_out, exist_ok=True)
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
        print(recipes.format_result(result), flush=True)
        results.append(result)
    report = recipes.write_report(
        results, args.out, time.time() - start, time.process_time()
    )
    print(f"\nReport: {os.path.abspath(report)}")
    return EXIT_OK


def main(argv=None):
    _quiet_tensorflow()
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["convert"]:
        _import_triton_first()
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with 2 on bad arguments
    try:
        if args.command == "list":
            return command_list()
        if args.command == "run":
            return command_run(args)
        if args.command == "convert":
            return command_convert(args)
        return command_demo(args)
    except UsageError as error:
        parser.print_usage(sys.stderr)
        print(f"keras-attention: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, FileNotFoundError) as error:
        print(f"keras-attention: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("keras-attention: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
