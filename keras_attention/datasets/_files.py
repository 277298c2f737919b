"""Errors shared by the loaders."""

import os


class DataFileNotFoundError(FileNotFoundError, ValueError):
    """A data file is missing.

    Subclasses both `FileNotFoundError` (the Python habit) and `ValueError`
    (the Keras habit for bad arguments), so either `except` clause catches it.
    """


def missing_file_error(path, what="data file"):
    """A `DataFileNotFoundError` whose message names `path`."""
    return DataFileNotFoundError(2, f"Missing {what}", os.fspath(path))
