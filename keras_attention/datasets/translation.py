"""Parallel corpora for translation: line-aligned text files, or dates.

`load_parallel_corpus` reads a folder of line-aligned UTF-8 files named
`<split>.<language>` (for example Multi30k's `train.en`/`train.de`,
`val.*`, `test2016.*`). `make_date_corpus` gives the embedded default, the
date-normalisation task, in the same structure: a dict from split name to
`(source_lines, target_lines)`.
"""

import os

from keras_attention._validation import check_positive_int
from keras_attention.datasets._files import missing_file_error
from keras_attention.datasets.dates import split_date_task


def _read_lines(path, max_lines=None):
    """UTF-8 lines without their line ending; rejects empty lines."""
    if not os.path.isfile(path):
        raise missing_file_error(path, "corpus file")
    lines = []
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            if max_lines is not None and line_number > max_lines:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"Line {line_number} of {path} is not valid UTF-8: {error}"
                ) from None
            line = line.rstrip("\r\n")
            if line_number == 1 and line.startswith("\ufeff"):
                # A byte-order mark (files saved by some Windows editors)
                # is no character of the first sentence.
                line = line[1:]
            if not line.strip():
                raise ValueError(f"Line {line_number} of {path} is empty.")
            lines.append(line)
    if not lines:
        raise ValueError(f"The corpus file {path} holds no lines.")
    return lines


def load_parallel_corpus(path, src="en", tgt="de", splits=None, max_lines=None):
    """Reads line-aligned source and target files, split by split.

    Line *i* of `<split>.<src>` is the translation of line *i* of
    `<split>.<tgt>`. Without `splits`, every `<split>.<src>` in the folder is
    read (there must be a `train.<src>`), each with its `<split>.<tgt>`.

    Args:
        path: the folder.
        src: source language suffix.
        tgt: target language suffix.
        splits: optional list of split names to read, e.g.
            `["train", "val", "test2016"]`.
        max_lines: read at most this many lines of each file (quick runs).

    Returns:
        A dict `{split: (source_lines, target_lines)}` of lists of strings
        without line endings.

    Raises:
        FileNotFoundError (also a ValueError): a file is missing; the
            message names it.
        ValueError: the two files of a split have different line counts,
            a file holds no line, or a line is empty or not UTF-8; the
            message names the file and the line number.

    Example:

    >>> corpus = load_parallel_corpus("shared/data/multi30k")  # doctest: +SKIP
    >>> sorted(corpus), len(corpus["train"][0])  # doctest: +SKIP
    (['test2016', 'train', 'val'], 29000)
    """
    folder = os.fspath(path)
    if os.path.isfile(folder):
        raise ValueError(
            "Received an invalid value for argument `path`, expected a corpus "
            f"folder (its split files inside), not a file. Received: path={folder!r}"
        )
    if not os.path.isdir(folder):
        raise missing_file_error(folder, "corpus folder")
    if max_lines is not None:
        check_positive_int("max_lines", max_lines)
    if src == tgt:
        raise ValueError(
            "Received an invalid value for argument `tgt`, expected a "
            f"language different from src={src!r}. Received: tgt={tgt!r}"
        )
    if splits is None:
        suffix = f".{src}"
        splits = sorted(
            name[: -len(suffix)]
            for name in os.listdir(folder)
            if name.endswith(suffix) and len(name) > len(suffix)
        )
        if "train" not in splits:
            raise missing_file_error(
                os.path.join(folder, f"train.{src}"), "corpus file"
            )
    if isinstance(splits, str):
        splits = [splits]
    # Report a missing file before reading the others.
    for split in splits:
        for language in (src, tgt):
            name = os.path.join(folder, f"{split}.{language}")
            if not os.path.isfile(name):
                raise missing_file_error(name, "corpus file")
    corpus = {}
    for split in splits:
        src_file = os.path.join(folder, f"{split}.{src}")
        tgt_file = os.path.join(folder, f"{split}.{tgt}")
        source = _read_lines(src_file, max_lines)
        target = _read_lines(tgt_file, max_lines)
        if len(source) != len(target):
            longer, shorter = (
                (src_file, tgt_file)
                if len(source) > len(target)
                else (tgt_file, src_file)
            )
            first_unmatched = min(len(source), len(target)) + 1
            raise ValueError(
                f"The files of split {split!r} are not aligned: line "
                f"{first_unmatched} of {longer} has no counterpart in "
                f"{shorter} ({len(source)} lines in {src_file}, "
                f"{len(target)} lines in {tgt_file})."
            )
        corpus[split] = (source, target)
    return corpus


def make_date_corpus(
    num_train=10000,
    num_val=1000,
    num_test=1000,
    seed=0,
    start_year=1950,
    end_year=2049,
):
    """The date-normalisation task as a parallel corpus.

    Human-written dates (source) and their ISO form (target); the three
    splits use disjoint calendar days (see `split_date_task`).

    Returns:
        A dict `{"train": (sources, targets), "val": ..., "test": ...}`,
        the structure of `load_parallel_corpus`.

    Example:

    >>> corpus = make_date_corpus(100, 10, 10)
    >>> [len(corpus[s][0]) for s in ("train", "val", "test")]
    [100, 10, 10]
    """
    return split_date_task(
        num_train,
        num_val=num_val,
        num_test=num_test,
        seed=seed,
        start_year=start_year,
        end_year=end_year,
    )
