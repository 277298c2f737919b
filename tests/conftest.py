"""`--run-large` runs the tests marked `@pytest.mark.large` (skipped otherwise)."""

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--run-large",
        action="store_true",
        default=False,
        help="also run the tests marked large (minutes each)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-large"):
        return
    skip = pytest.mark.skip(reason="large: run with --run-large")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)
