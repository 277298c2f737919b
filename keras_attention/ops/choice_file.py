"""Measured choices of `implementation="auto"` kept in a file, so that a
later process on the same machine takes them without measuring again.

Opt-in: `set_autotune(cache_file=path)` or the environment variable
`KERAS_ATTENTION_AUTOTUNE_CACHE=path`. Measuring the paths of a long shape
makes its first call slower (`MultiHeadAttention`'s first forward +
backward at 2,048 tokens: 28.9 s, and 4.0 s in a later process reading
the file, on a 2-core Xeon with AMX; `python
benchmarks/bench_first_call.py`, BENCHMARKS.md "First calls, and measured
choices kept in a file"): with the file, that price is paid once per
machine, shape and mode, not once per process.

Each entry holds for one machine (`machine()`: the CPU and the
instruction sets that choose kernels, the cores, the accelerators, the
versions of the library and of its backend, whether TensorFlow's oneDNN
kernels run) and one memory budget; on another machine, a new version or
another budget the shape is measured again and its entry added. Only
measured choices are kept (rules cost nothing to apply again). An empty
file takes them; a read-only one is read, never written; a file written
again keeps its permissions. A file
that is not one of these is never written over (a warning says why), and
a file that cannot be read or written only costs the measurement.
Processes that store at once take turns through an empty `<file>.lock`
beside it (POSIX systems; elsewhere the last writer may drop an entry
another process added meanwhile, which is then measured again).

    >>> from keras_attention import ops as attention_ops
    >>> attention_ops.set_autotune(cache_file="autotune.json")  # doctest: +SKIP
"""

import contextlib
import json
import os
import tempfile
import warnings

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

FORMAT = "keras_attention autotune choices"
VERSION = 1

# The CPU flags that decide which kernels TensorFlow, XLA and torch run.
_KERNEL_FLAGS = frozenset((
    "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8",
    "asimd", "sve",
))


def _cpu():
    model, flags = "", ()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Model") and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = tuple(sorted(_KERNEL_FLAGS & set(value.split())))
    except OSError:
        pass
    if not model:
        import platform

        model = platform.processor() or platform.machine()
    return model, list(flags)


def machine(onednn):
    """What a measured choice depends on besides its key: a JSON-able
    dict. `onednn` is `autotune.onednn_status()`'s line."""
    import keras

    from keras_attention.version import __version__

    model, flags = _cpu()
    backend = keras.backend.backend()
    found = {
        "cpu": model,
        "flags": flags,
        "cores": os.cpu_count(),
        "backend": backend,
        "keras": keras.__version__,
        "keras_attention": __version__,
        "onednn": onednn.split(":")[0],
    }
    if backend == "tensorflow":
        import tensorflow as tf

        found["tensorflow"] = tf.__version__
        found["accelerators"] = sorted(
            d.device_type for d in tf.config.list_logical_devices()
            if d.device_type != "CPU"
        )
    elif backend == "jax":
        import jax
        import jaxlib

        found["jax"] = f"{jax.__version__}/{jaxlib.__version__}"
        found["accelerators"] = sorted(
            d.platform for d in jax.devices() if d.platform != "cpu"
        )
    elif backend == "torch":
        import torch

        found["torch"] = torch.__version__
        found["accelerators"] = ["cuda"] * bool(torch.cuda.is_available())
    return found


def check_path(path):
    """`path` as a string, or a `ValueError` naming `cache_file`."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise ValueError(
            "`cache_file` must be a file path (str or path-like), or False "
            f"to keep no file. Received: cache_file={path!r}"
        )
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not path or not os.path.isdir(folder):
        raise ValueError(
            "`cache_file` must be a file in an existing folder. Received: "
            f"cache_file={path!r} (no folder {folder!r})"
        )
    if os.path.isdir(path):
        raise ValueError(
            f"`cache_file` must be a file, not a folder. Received: cache_file={path!r}"
        )
    return path


_WARNED = set()


def _warn(path, why):
    if (path, why) not in _WARNED:
        _WARNED.add((path, why))
        warnings.warn(
            f"keras_attention: the autotune cache file {path!r} {why}; "
            "choices are measured in each process instead of kept there.",
            stacklevel=4,
        )


def _entries(path):
    """The file's entries, `[]` when it does not exist yet or is empty (a
    file made for the choices, `touch choices.json`), `None` (with a
    warning) when it is not a choice file or cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        if not text.strip():
            return []
        content = json.loads(text)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        _warn(path, f"cannot be read as a choice file ({error})")
        return None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        _warn(path, "is not a keras_attention choice file, so it is left as it is")
        return None
    if content.get("version") != VERSION or not isinstance(content.get("entries"), list):
        _warn(path, f"has a version this library does not read ({content.get('version')!r})")
        return None
    return content["entries"]


def _identity(machine_, key, budget):
    return {"machine": machine_, "key": repr(key), "memory_budget": budget}


def _matches(entry, identity):
    return isinstance(entry, dict) and all(entry.get(k) == v for k, v in identity.items())


def lookup(path, machine_, key, budget):
    """`(implementation, reason, timings_ms)` kept for this machine, key
    and budget, or `None`."""
    entries = _entries(path)
    wanted = _identity(machine_, key, budget)
    for entry in entries or ():
        if _matches(entry, wanted):
            try:
                timings = {str(k): float(v) for k, v in entry["timings_ms"].items()}
                return str(entry["implementation"]), str(entry["reason"]), timings
            except (KeyError, AttributeError, TypeError, ValueError):
                return None
    return None


@contextlib.contextmanager
def _locked(path):
    """Hold an exclusive lock on `path + ".lock"` (POSIX `flock`), so that
    processes storing at once each add their entry; where there is no
    `fcntl` (Windows), or the lock file cannot be opened, no lock."""
    handle = None
    if fcntl is not None:
        try:
            handle = open(path + ".lock", "a", encoding="utf-8")
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            if handle is not None:
                handle.close()
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()  # releases the lock


def store(path, machine_, key, budget, implementation, reason, timings_ms):
    """Add (or replace) this machine's entry for `key`: the file read again
    just before it is written whole, through a temporary file renamed
    over it, so that a reader never sees half a file, under a lock that
    makes processes storing at once wait for each other (`_locked`)."""
    with _locked(path):
        _store(path, machine_, key, budget, implementation, reason, timings_ms)


def _mode(path):
    """The permissions the file keeps when it is written again (a new
    file's: what `open` would give it); `None` for a file without write
    permission, which is left as it is."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()
    return mode if mode & 0o222 else None


def _umask():
    """The process's umask, read from `/proc` where there is one: setting
    it to read it (`os.umask`) briefly left any file another thread made
    meanwhile open to everyone."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o077)  # the least open while it is being read
    os.umask(umask)
    return umask


def _store(path, machine_, key, budget, implementation, reason, timings_ms):
    entries = _entries(path)
    if entries is None:
        return
    mode = _mode(path)
    if mode is None:
        _warn(path, "is read-only, so it is left as it is")
        return
    wanted = _identity(machine_, key, budget)
    entries = [e for e in entries if not _matches(e, wanted)]
    entries.append(dict(wanted, implementation=implementation, reason=reason,
                        timings_ms=dict(timings_ms)))
    content = {"format": FORMAT, "version": VERSION, "entries": entries}
    folder = os.path.dirname(os.path.abspath(path))
    try:
        handle, temporary = tempfile.mkstemp(prefix=".autotune-", dir=folder)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(content, out, indent=1)
            # `mkstemp` makes the file private; the choices keep the file's
            # own permissions (a file shared by the users of a machine).
            os.chmod(temporary, mode)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as error:
        _warn(path, f"cannot be written ({error})")
