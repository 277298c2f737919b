"""The `>>>` examples in the package's docstrings run and print what they
say, each in its module's namespace, as `pytest --doctest-modules` runs
them; the layer classes' longer examples, in ```python blocks, run too (the
applications' train models and are not run here)."""

import doctest
import importlib
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_attention"


def _modules_with_examples():
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_there_are_examples():
    assert "keras_attention.matching" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name} has no example doctest finds"
    for test in tests:
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} examples failed in {name} (output above)"


def _python_blocks(text):
    """The ```python blocks of a docstring, dedented."""
    import re
    import textwrap

    return [
        textwrap.dedent(block)
        for block in re.findall(r"```python\n(.*?)```", text or "", re.S)
    ]


def _layer_classes():
    from keras_attention import layers

    return [
        getattr(layers, name) for name in sorted(dir(layers))
        if isinstance(getattr(layers, name), type) and _python_blocks(
            getattr(layers, name).__doc__
        )
    ]


@pytest.mark.parametrize("cls", _layer_classes(), ids=lambda c: c.__name__)
def test_layer_class_examples_run_as_written(cls, tmp_path, monkeypatch):
    # The layers' ```python examples (not `>>>` ones), each in a namespace
    # of keras, NumPy and the layers, as a user pastes them after the
    # README's imports; files they write land in tmp_path.
    import keras
    import numpy as np

    from keras_attention import layers

    monkeypatch.chdir(tmp_path)
    for block in _python_blocks(cls.__doc__):
        namespace = {"keras": keras, "np": np, "ops": keras.ops}
        namespace.update({n: getattr(layers, n) for n in dir(layers) if not n.startswith("_")})
        exec(compile(block, f"<{cls.__name__} example>", "exec"), namespace)


def _documented_classes():
    """The registry's layers and the applications' models: what a user
    constructs by name."""
    import keras

    from keras_attention import applications, layers

    classes = [getattr(layers, n) for n in dir(layers)]
    classes += [getattr(applications, n) for n in dir(applications)]
    return sorted(
        {
            c for c in classes
            if isinstance(c, type) and issubclass(c, keras.layers.Layer)
            and c.__module__.startswith("keras_attention")
            and not c.__name__.startswith("_")
        },
        key=lambda c: c.__name__,
    )


@pytest.mark.parametrize("cls", _documented_classes(), ids=lambda c: c.__name__)
def test_public_classes_say_what_they_raise(cls):
    # Every layer and model a user builds says what bad arguments and inputs
    # raise (a "Raises:" section), as keras's own layers do.
    assert "Raises:" in (cls.__doc__ or ""), (
        f"{cls.__module__}.{cls.__name__} has no Raises: section"
    )
