"""Plain text for language models: the embedded date lines, or a folder.

The embedded default needs no download: the date-normalisation task
(`make_date_task`) written as one line per example, `"<date as written> =
<ISO date>"`, so a language model trained on it completes a prompt such as
`"14 july 1989 = "` with the ISO date. A path reads `.txt` files instead.
"""

import os

from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention.datasets._files import missing_file_error
from keras_attention.datasets.translation import make_date_corpus


def date_lines(sources, targets):
    """`"<source> = <target>"` lines of a date corpus split."""
    return [f"{s.lower()} = {t}" for s, t in zip(sources, targets)]


def _read_texts(path):
    if os.path.isfile(path):
        files = [path]
    else:
        files = sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(path)
            for name in names
            if name.endswith(".txt")
        )
    if not files:
        raise ValueError(
            "Received an invalid value for argument `path`, expected a text "
            f"file or a folder holding .txt files. Received: path={path!r}"
        )
    texts = []
    for file in files:
        # "utf-8-sig": a byte-order mark (Notepad's UTF-8) is not text.
        try:
            with open(file, encoding="utf-8-sig") as f:
                texts.append(f.read())
        except UnicodeDecodeError as error:
            # Replacing the bytes would train on U+FFFD in silence.
            raise ValueError(
                "Received an invalid value for argument `path`, expected "
                f"UTF-8 text files. The file {file} is not UTF-8: {error}"
            ) from None
    return "\n".join(texts)


def load_text_corpus(path=None, num_train=20000, num_val=500, num_test=500,
                     seed=0, val_fraction=0.05):
    """Text split into `train`, `val` (and `test`) strings.

    Args:
        path: `None` for the embedded date lines, or a `.txt` file or a
            folder whose `.txt` files (read recursively, in name order)
            are joined; its last `val_fraction` is the validation text.
        num_train, num_val, num_test, seed: lines of the date task per
            split (disjoint calendar days, see `split_date_task`).
        val_fraction: the share of a file's text kept for validation.

    Returns:
        A dict `{"train": str, "val": str}` (plus `"test"` for the date
        lines), lines separated by `"\\n"`.

    Example:

    >>> corpus = load_text_corpus(num_train=2, num_val=1, num_test=1)
    >>> corpus["train"].count("\\n")
    1
    """
    if path is None:
        for name, value in (("num_train", num_train), ("num_val", num_val),
                            ("num_test", num_test)):
            check_positive_int(name, value)
        corpus = make_date_corpus(num_train, num_val, num_test, seed=seed)
        return {
            split: "\n".join(date_lines(*pair)) for split, pair in corpus.items()
        }
    if not isinstance(path, (str, os.PathLike)):
        raise invalid("path", "a file or folder path, or None", path)
    if not os.path.exists(path):
        raise missing_file_error(path, "text file or folder")
    if isinstance(val_fraction, bool) or not 0.0 < val_fraction < 1.0:
        raise invalid("val_fraction", "a float in (0, 1)", val_fraction)
    text = _read_texts(path)
    if not text.strip():
        raise ValueError(
            "Received an invalid value for argument `path`, expected text "
            f"to train on; its .txt files hold none. Received: path={path!r}"
        )
    cut = int(len(text) * (1.0 - val_fraction))
    return {"train": text[:cut], "val": text[cut:]}
