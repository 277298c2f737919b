"""The keras-attention command at a terminal: help and bad arguments
answered before TensorFlow loads, errors that name the option typed, and
Ctrl-C while it starts."""

import dataclasses
import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attention import _startup
from keras_attention import cli
from keras_attention import layers as ka_layers

# Imports the package as the console script does, once per argv (an import
# that exits is undone, so the next one runs `__init__` again).
_AS_THE_COMMAND = """
import contextlib, io, json, sys
results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["keras-attention", *argv]
    out, err = io.StringIO(), io.StringIO()
    code = "imported"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            import keras_attention
        except SystemExit as exit:
            code = exit.code
    results.append([code, out.getvalue(), err.getvalue()])
loaded = [m for m in ("tensorflow", "keras", "numpy") if m in sys.modules]
print(json.dumps([results, loaded]))
"""


def test_help_and_bad_arguments_are_answered_before_tensorflow_loads(tmp_path):
    # `keras-attention --help` imported TensorFlow (the package's
    # `__init__` runs before the entry point) and a missing file was found
    # after it had loaded.
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    cases = [
        ["--help"],
        ["explore", "--help"],
        ["--version"],
        ["run", "poetry"],
        ["convert"],
        ["explore", str(tmp_path / "no.keras"), "x.npy"],
        ["explore", str(blocker), str(tmp_path / "no.npy")],
        ["explore", str(blocker), "x.npy", "--index", "-1"],
        ["run", "classification", "--model", "alexnet"],
        ["demo", "--out", str(blocker / "sub")],
        ["convert", str(tmp_path), "--timm-model", "vit_base_patch16_224"],
        ["run", "detection", "--data", str(tmp_path)],
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    result = subprocess.run(
        [sys.executable, "-c", _AS_THE_COMMAND, json.dumps(cases)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results, loaded = json.loads(result.stdout.splitlines()[-1])
    assert loaded == []
    codes = [code for code, _, _ in results]
    assert codes == [0, 0, 0] + [2] * (len(cases) - 3)
    assert "demo" in results[0][1] and "MODEL INPUT" in results[1][1]
    assert "(default: attention.html)" in results[1][1]
    from keras_attention.version import __version__

    assert results[2][1].strip() == f"keras-attention {__version__}"
    errors = [err.splitlines()[-1] for _, _, err in results[3:]]
    assert "invalid choice: 'poetry'" in errors[0]
    assert errors[1].endswith("the following arguments are required: SOURCE")
    missing = tmp_path / "no.keras"
    assert errors[2] == f"keras-attention explore: error: MODEL: no such file: {missing}"
    assert errors[3].endswith(f"INPUT: no such file: {tmp_path / 'no.npy'}")
    assert "argument --index: expected an example of the batch" in errors[4]
    assert errors[5].startswith("keras-attention run: error: ") and "--model" in errors[5]
    assert "--out: cannot make the folder" in errors[6]
    assert "--timm-model is for a timm checkpoint file" in errors[7]
    assert "--data: the detection task trains on the generated" in errors[8]
    assert not any("Traceback" in err for _, _, err in results)


def test_python_dash_m_is_the_command_too(monkeypatch):
    for argv0, orig_argv, expected in (
        ("/usr/bin/keras-attention", ["python", "/usr/bin/keras-attention"], True),
        ("-m", ["python", "-X", "importtime", "-m", "keras_attention", "list"], True),
        ("-m", ["python", "-mkeras_attention"], True),
        ("-m", ["python", "-m", "pytest", "keras_attention"], False),
        ("-c", ["python", "-c", "import keras_attention"], False),
        ("my_script.py", ["python", "my_script.py", "--help"], False),
    ):
        monkeypatch.setattr(sys, "argv", [argv0])
        monkeypatch.setattr(sys, "orig_argv", orig_argv)
        assert _startup.is_the_command() is expected, orig_argv


def test_ctrl_c_while_tensorflow_loads_is_one_line(capsys):
    # Before: a Ctrl-C in the seconds of `import tensorflow` printed a
    # traceback of some 50 lines through TensorFlow's import.
    from keras_attention import _cli_arguments

    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _cli_arguments.answer_early(["list"])
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(SystemExit) as info:
            handler(signal.SIGINT, None)
        assert info.value.code == cli.EXIT_INTERRUPTED == 130
        assert capsys.readouterr().err == "keras-attention: interrupted\n"
        cli.main(["list"])  # the command handles KeyboardInterrupt again
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job
        _cli_arguments.answer_early(["list"])
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_explore_errors_name_the_options_typed(tmp_path, capsys):
    # `--index 5` on a batch of 2 said "argument `index` ... index=5", exit 1.
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6, 8)), ka_layers.MultiHeadAttention(2, 4, name="mha")]
    )
    model.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", np.ones((2, 6, 8), "float32"))
    page = tmp_path / "page.html"
    common = ["explore", str(tmp_path / "m.keras"), str(tmp_path / "x.npy"),
              "--out", str(page)]
    for extra, expected in (
        (["--index", "5"], "argument `--index`, expected an example of the "
         "batch, 0 <= --index < 2. Received: --index=5"),
        (["--layers", "nope"], "argument `--layers`"),
        (["--kind", "image"], "argument `INPUT`, expected images (B, height, "
         "width, channels). Received: INPUT of shape (2, 6, 8)"),
    ):
        assert cli.main(common + extra) == cli.EXIT_USAGE, extra
        err = capsys.readouterr().err
        assert err.startswith("usage: keras-attention explore ")
        assert f"keras-attention explore: error: Received an invalid value for {expected}" in err
    assert not page.exists()
    assert cli.main(common + ["--index", "1"]) == cli.EXIT_OK
    assert page.is_file()


def test_a_quick_demo_report_says_it_is_a_smoke_test(tmp_path):
    # `demo --quick`'s report.md and report.html gave 0.15 digit accuracy
    # as "All applications on their embedded data", with no word of --quick.
    from keras_attention import recipes
    from keras_attention import reports

    results = [recipes.Result("node-classification", "gat", {"test_accuracy": 0.3},
                              [], 2.0, "karate club")]
    for quick in (True, False):
        texts = [
            open(write(results, str(tmp_path), 3.0, 1.0, quick=quick)).read()
            for write in (reports.write_report, reports.write_report_html)
        ]
        assert all(("smoke test (--quick)" in text) is quick for text in texts)


def test_output_into_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    # `keras-attention list | head -2` printed "error: Broken pipe".
    def closed_pipe():
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "command_list", closed_pipe)
    assert cli.main(["list"]) == cli.EXIT_FAILED
    assert capsys.readouterr().err == ""


def test_run_data_errors_name_the_option_and_come_before_training(
    tmp_path, capsys, monkeypatch
):
    # The loaders named their own `path`/`texts`; a translation folder
    # without a test or val split and a causal-LM text too short for one
    # validation window failed after training (a StopIteration traceback,
    # an error naming neither --data nor the split).
    from keras_attention import recipes

    def no_training(*args, **kwargs):
        raise AssertionError("trained before the data was checked")

    monkeypatch.setattr(keras.Model, "fit", no_training)
    folder = tmp_path / "pairs"
    folder.mkdir()
    for side in ("en", "de"):
        (folder / f"train.{side}").write_text("a b\nc d\n" * 50)
    text = tmp_path / "short.txt"
    text.write_text("twenty-two characters\n" * 100)  # 2,200: 110 for val
    for argv, expected in (
        (["causal-lm", "--data", str(folder)], "`--data`, expected a text file"),
        (["translation", "--data", str(text)], "`--data`, expected a corpus folder"),
        (["translation", "--data", str(folder)], "no split to score the run on"),
        (["causal-lm", "--data", str(text)], "the val text (the last 5 %"),
    ):
        code = cli.main(["run", *argv, "--quick", "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == cli.EXIT_FAILED, (argv, err)
        assert "--data" in err and expected in err, (argv, err)
        assert "Traceback" not in err
    # The evaluated split: test, else the one test* split, else val.
    pick = recipes.translation_test_split
    assert pick({"train": 0, "test_2016_flickr": 0, "val": 0}, "d") == "test_2016_flickr"
    assert pick({"train": 0, "test": 0, "test2017": 0}, "d") == "test"
    assert pick({"train": 0, "val": 0}, "d") == "val"
    with pytest.raises(ValueError, match="several test splits"):
        pick({"train": 0, "test2016": 0, "test2017": 0}, "d")


def test_an_image_model_refuses_several_arrays_by_name():
    # explore with an .npz of several arrays ended in an AttributeError
    # traceback (`tuple(inputs.shape)` of a list).
    from keras_attention import _validation

    with pytest.raises(ValueError, match=r"argument `images`.*a list of 2 arrays"):
        _validation.check_image_inputs([np.zeros((1, 8)), np.zeros((1, 2))], (8, 8, 1))


def test_sigterm_is_an_interrupt_that_cleans_up_the_file_being_written(
    tmp_path, monkeypatch, capsys
):
    # `timeout` and `kill` send SIGTERM: a save in progress left its
    # temporary `.keras` file (0 bytes) beside the results.
    from keras_attention import _writing

    def write_then_get_terminated(path):
        open(path, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)

    def command_list():
        _writing.write_atomically(tmp_path / "model.keras", write_then_get_terminated)

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "command_list", command_list)
    assert cli.main(["list"]) == cli.EXIT_TERMINATED == 143
    assert capsys.readouterr().err == "keras-attention: terminated\n"
    assert os.listdir(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is previous  # given back


def test_an_unfinished_demo_does_not_leave_an_earlier_report_looking_finished(
    tmp_path, monkeypatch
):
    # A demo interrupted in a folder of an earlier demo left its report.md
    # (and report.html) describing pictures and models already replaced.
    from keras_attention import recipes

    (tmp_path / "report.md").write_text("# keras_attention demo\naccuracy 0.15\n")
    (tmp_path / "report.html").write_text("<html>accuracy 0.15</html>")

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    task = recipes.TASKS[recipes.DEMO_ORDER[0]]
    monkeypatch.setitem(recipes.TASKS, recipes.DEMO_ORDER[0], dataclasses.replace(task, run=interrupted))
    assert cli.main(["demo", "--quick", "--out", str(tmp_path)]) == cli.EXIT_INTERRUPTED
    report = (tmp_path / "report.md").read_text()
    assert "in progress" in report and "0.15" not in report
    assert not (tmp_path / "report.html").exists()
