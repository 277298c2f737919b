"""Loads a script of `benchmarks/` as a module, for tests of its splits."""

import importlib.util
import pathlib

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load(name):
    """The module `benchmarks/<name>.py`, run once (its `main` not called)."""
    path = BENCHMARKS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
