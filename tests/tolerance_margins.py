"""`pytest --tolerance-margins DIR`: how much of its tolerance each
`np.testing.assert_allclose` of the suite uses.

A comparison of float32 results computed in two orders (a fast path
against its simple one, ours against a peer) passes by a margin that
depends on the machine's kernels; one that uses most of its tolerance here
can fail on another CPU kind. With the option, every call's worst
`|actual - desired| / (atol + rtol * |desired|)` is kept per source line
(one JSON file per process under `DIR`, workers included) and the 20
highest are printed at the end. Seen on 2026-12-05: a gradient of ~53 off
by 2.7e-5 against `atol=2e-5` failed one CI run and passed the next.
"""

import json
import os
import sys

import numpy as np

_worst = {}


def _margin(actual, desired, rtol, atol):
    actual = np.asarray(actual, dtype="float64")
    desired = np.asarray(desired, dtype="float64")
    actual, desired = np.broadcast_arrays(actual, desired)
    finite = np.isfinite(actual) & np.isfinite(desired)
    if not finite.any():
        return None, 0.0
    tolerance = atol + rtol * np.abs(desired[finite])
    difference = np.abs(actual[finite] - desired[finite])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(tolerance > 0, difference / tolerance,
                         np.where(difference > 0, np.inf, 0.0))
    return float(ratio.max()), float(np.abs(desired[finite]).max())


def _caller():
    frame = sys._getframe(2)
    while frame is not None and os.sep + "tests" + os.sep not in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def start(config, folder):
    original = np.testing.assert_allclose

    def assert_allclose(actual, desired, rtol=1e-7, atol=0, *args, **kwargs):
        try:
            margin, largest = _margin(actual, desired, rtol, atol)
        except (TypeError, ValueError):  # what the original will refuse
            margin = None
        if margin is not None:
            line = _caller()
            if margin >= _worst.get(line, {"margin": -1.0})["margin"]:
                _worst[line] = {
                    "margin": margin,
                    "test": os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0],
                    "atol": float(atol), "rtol": float(rtol), "largest": largest,
                }
        return original(actual, desired, rtol, atol, *args, **kwargs)

    np.testing.assert_allclose = assert_allclose
    os.makedirs(folder, exist_ok=True)
    config.add_cleanup(lambda: _write(folder))
    if not hasattr(config, "workerinput"):  # the controller (or no xdist)
        for name in os.listdir(folder):  # an earlier run's records
            if name.startswith("margins-") and name.endswith(".json"):
                os.remove(os.path.join(folder, name))
        config.pluginmanager.register(_Report(folder), "tolerance_margins")


def _write(folder):
    with open(os.path.join(folder, f"margins-{os.getpid()}.json"), "w") as f:
        json.dump(_worst, f)


def read(folder):
    """Every process's records under `folder`, the worst per line."""
    merged = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("margins-") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                for line, record in json.load(f).items():
                    if record["margin"] >= merged.get(line, {"margin": -1.0})["margin"]:
                        merged[line] = record
    return merged


class _Report:
    def __init__(self, folder):
        self.folder = folder

    def pytest_terminal_summary(self, terminalreporter):
        _write(self.folder)  # this process's own calls (no xdist)
        merged = read(self.folder)
        worst = sorted(merged.items(), key=lambda item: -item[1]["margin"])[:20]
        terminalreporter.section("tolerance margins (1 fails)")
        for line, r in worst:
            terminalreporter.write_line(
                f"{r['margin']:8.3f}  {line}  atol={r['atol']:.3g} "
                f"rtol={r['rtol']:.3g} max|desired|={r['largest']:.3g}  {r['test']}"
            )
