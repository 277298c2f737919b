"""What the wheel and the source distribution hold, read from setup.cfg and
MANIFEST.in without building them (a build takes tens of seconds)."""

import configparser
import fnmatch
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Folders the tests and the README's commands read besides the package.
SDIST_FOLDERS = ("tests", "benchmarks", "docs", ".ci")


def _files(*folders):
    """Every file under `folders` (relative to ROOT, "/"-separated), bytecode
    caches aside."""
    found = []
    for folder in folders:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.append(path.relative_to(ROOT).as_posix())
    return sorted(found)


def test_sdist_holds_the_tests_their_data_and_what_the_readme_links(monkeypatch):
    filelist = pytest.importorskip("setuptools.command.egg_info")
    monkeypatch.chdir(ROOT)
    wanted = _files(*SDIST_FOLDERS) + ["BENCHMARKS.md"]
    manifest = filelist.FileList()
    manifest.allfiles = [os.path.normpath(f) for f in wanted]
    with open(ROOT / "MANIFEST.in", encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                manifest.process_template_line(line)
    included = {pathlib.PurePath(f).as_posix() for f in manifest.files}
    missing = [f for f in wanted if f not in included]
    assert not missing, f"MANIFEST.in leaves out of the sdist: {missing[:10]}"
    for helper in ("tests/conftest.py", "tests/harness.py", "tests/data/preset_outputs.npz"):
        assert helper in included


def test_wheel_holds_every_data_file_of_the_package():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    assert config.getboolean("options", "include_package_data")
    patterns = []  # package data as paths relative to ROOT
    for package, value in config.items("options.package_data"):
        folder = package.replace(".", "/")
        patterns += [f"{folder}/{p.strip()}" for p in value.split(",") if p.strip()]
    data = [f for f in _files("keras_attention") if not f.endswith(".py")]
    assert any(f.endswith(".weights.h5") for f in data)
    assert any(f.endswith("explorer_page.js") for f in data)
    missing = [f for f in data if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing, f"setup.cfg's package_data leaves out of the wheel: {missing}"
