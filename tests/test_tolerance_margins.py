"""The `--tolerance-margins` audit's arithmetic and merging."""

import json

import numpy as np

from tests import tolerance_margins


def test_margin_is_the_used_share_of_the_tolerance():
    margin, largest = tolerance_margins._margin(
        [1.0, 10.5, np.nan], [1.0, 10.0, np.nan], rtol=0.01, atol=0.4
    )
    assert np.isclose(margin, 0.5 / (0.4 + 0.1)) and largest == 10.0
    # Zero tolerance: exact equality is 0, any difference is infinite.
    assert tolerance_margins._margin([2.0], [2.0], 0, 0)[0] == 0.0
    assert tolerance_margins._margin([2.0], [2.5], 0, 0)[0] == np.inf
    # Broadcasting as `assert_allclose` does.
    assert np.isclose(tolerance_margins._margin([[1.0, 2.0]], 1.0, 0, 2.0)[0], 0.5)


def test_read_keeps_each_lines_worst_over_processes(tmp_path):
    def record(margin, test):
        return {"margin": margin, "test": test, "atol": 0.0, "rtol": 1e-7,
                "largest": 1.0}

    (tmp_path / "margins-1.json").write_text(json.dumps(
        {"a.py:1": record(0.2, "t1"), "a.py:2": record(0.9, "t2")}))
    (tmp_path / "margins-2.json").write_text(json.dumps(
        {"a.py:1": record(0.7, "t3")}))
    (tmp_path / "other.json").write_text("not read")
    merged = tolerance_margins.read(str(tmp_path))
    assert {k: v["test"] for k, v in merged.items()} == {"a.py:1": "t3", "a.py:2": "t2"}
