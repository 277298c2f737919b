"""Writing a file whole or not at all: the one helper of every writer.

The pictures (`visualization.plots`), the explorer's page, the demo's
reports and the `.keras` files of the commands and recipes are written to a
temporary file in the target's folder and renamed over the target, so a
failure midway (an exception, a full disk, Ctrl-C) leaves the user's
previous file as it was and no half-written one. Imports only the standard
library, so any module of the package may import it.
"""

import os
import tempfile


def write_atomically(path, write, suffix=".tmp"):
    """Writes the file `path` through `write(temporary_path)`.

    Args:
        path: the file to write (its folder must exist).
        write: a function that writes the whole file at the path it is
            given (`figure.savefig`, `model.save`, ...).
        suffix: the end of the temporary file's name, for writers that
            read the format from it (`".keras"` for `model.save`).

    Returns:
        The absolute path written.
    """
    target = os.path.abspath(os.fspath(path))
    handle, temporary = tempfile.mkstemp(
        prefix=f".{os.path.basename(target)}.", suffix=suffix,
        dir=os.path.dirname(target),
    )
    os.close(handle)
    try:
        write(temporary)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return target


def write_text_atomically(path, text):
    """Writes the string `text` to the file `path` (UTF-8) atomically."""

    def write(temporary):
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(text)

    return write_atomically(path, write)
