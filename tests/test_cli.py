"""The keras-attention command: help, errors, list, and a one-epoch run."""

import argparse
import importlib.util
import os
import subprocess
import sys

import pytest

from keras_attention import cli


def run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-m", "keras_attention", *args],
        capture_output=True, text=True, env=env, timeout=600,
    )


def test_help_and_bad_arguments(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "poetry"])
    assert info.value.code == cli.EXIT_USAGE
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "classification", "--epochs", "0"])
    assert info.value.code == cli.EXIT_USAGE
    capsys.readouterr()
    assert cli.main(["run", "classification", "--model", "alexnet"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--model" in err and err.startswith("usage: keras-attention run ")
    assert cli.main(["run", "classification", "--data", "/no/such/folder"]) == cli.EXIT_USAGE
    for seed in ("-1", str(2**32), "x"):  # keras's error came after --out was made
        with pytest.raises(SystemExit) as info:
            cli.main(["run", "classification", "--seed", seed, "--out", "/no/such/out"])
        assert info.value.code == cli.EXIT_USAGE
        assert "--seed" in capsys.readouterr().err


def test_the_module_docstring_shows_every_command_and_option():
    parser = cli.build_parser()
    commands = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )
    usage = cli.__doc__.split("```")[1]
    sections = {
        part.split()[0]: part for part in usage.split("keras-attention ")[1:]
    }
    assert set(sections) == set(commands.choices)
    for name, command in commands.choices.items():
        for action in command._actions:
            option = max(action.option_strings, key=len, default=None)
            if option and option != "--help":
                assert option in sections[name], f"{name} {option}"


def test_list_shows_layers_applications_and_presets(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("multi_head", "graph", "local_window", "translation", "vit_digits"):
        assert word in out


def test_module_entry_point_and_one_epoch_run(tmp_path):
    result = run_cli(
        "run", "node-classification", "--epochs", "2", "--quick", "--out", str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test_accuracy=" in result.stdout
    assert (tmp_path / "node_classification_gat.keras").stat().st_size > 0
    pictures = list(tmp_path.glob("*.png"))
    assert pictures and all(p.stat().st_size > 0 for p in pictures)


def test_out_in_the_way_of_a_file_is_a_usage_error(tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    for argv in (
        ["run", "node-classification", "--out", str(blocker)],
        ["demo", "--out", str(blocker / "sub")],
        ["convert", str(tmp_path), "--out", str(blocker / "m.keras")],
    ):
        assert cli.main(argv) == cli.EXIT_USAGE, argv
        err = capsys.readouterr().err
        assert "--out" in err and "Traceback" not in err
    assert blocker.read_text() == "mine"


def test_out_that_takes_no_files_is_a_usage_error_before_any_work(
    monkeypatch, tmp_path, capsys
):
    # A read-only folder failed at the end, after the training, with a
    # traceback; a file where demo puts a task's folder, at that task.
    import errno
    import tempfile

    from keras_attention import recipes

    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / recipes.DEMO_ORDER[-1]).write_text("mine")
    assert cli.main(["demo", "--quick", "--out", str(tmp_path / "demo")]) == cli.EXIT_USAGE
    assert "--out" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "demo")) == sorted(recipes.DEMO_ORDER)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    import dataclasses

    def no_work(**kwargs):
        raise AssertionError("the recipe ran")

    monkeypatch.setattr(recipes, "TASKS", {
        task: dataclasses.replace(recipe, run=no_work)
        for task, recipe in recipes.TASKS.items()
    })
    for argv in (
        ["run", "node-classification", "--out", str(tmp_path / "ro")],
        ["demo", "--out", str(tmp_path / "ro")],
        ["convert", str(tmp_path), "--out", str(tmp_path / "ro" / "m.keras")],
    ):
        assert cli.main(argv) == cli.EXIT_USAGE, argv
        err = capsys.readouterr().err
        assert "--out: cannot write" in err and "Read-only" in err, err


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs triton"
)
def test_triton_imported_after_the_package_does_not_crash():
    # What `keras-attention convert` does: the entry point imports the
    # package (TensorFlow) before the converter reaches PyTorch and Triton.
    result = subprocess.run(
        [sys.executable, "-c", "import keras_attention; import triton; print('ok')"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.returncode


def test_quick_takes_a_slice_of_a_users_corpus(monkeypatch, tmp_path):
    # `--quick` with `--data` trained on all of it (29,000 Multi30k pairs).
    from keras_attention import applications
    from keras_attention import recipes
    from keras_attention.applications import translation

    text = {"train": "\n".join(map(str, range(5000))), "val": "a\nb"}
    sliced = recipes.quick_slice(text)
    assert sliced["train"].split("\n") == [str(i) for i in range(2000)]
    assert sliced["val"] == "a\nb"
    pairs = {split: ([f"s{i}" for i in range(3000)], [f"t{i}" for i in range(3000)])
             for split in ("train", "val", "test")}
    monkeypatch.setattr(translation, "load_translation_corpus", lambda data: pairs)
    seen = []

    class Stop(Exception):
        pass

    def from_corpus(sources, targets, **kwargs):
        seen.append(len(sources))
        raise Stop

    monkeypatch.setattr(applications.TranslationPreprocessor, "from_corpus", from_corpus)
    for quick, size in ((True, 2000), (False, 3000)):
        with pytest.raises(Stop):
            recipes.run_translation("rnn", "corpus", None, str(tmp_path), 0, quick=quick)
        assert seen[-1] == size


def test_a_file_that_cannot_be_written_fails_with_a_message(
    tmp_path, capsys, monkeypatch
):
    import keras

    # A folder where the run's model file goes: found only when it saves.
    (tmp_path / "node_classification_gat.keras").mkdir()
    monkeypatch.setattr(keras.Model, "fit", lambda self, *a, **k: None)
    argv = ["run", "node-classification", "--epochs", "1", "--out", str(tmp_path)]
    assert cli.main(argv) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "keras-attention: error: Is a directory" in err
    assert str(tmp_path / "node_classification_gat.keras") in err
