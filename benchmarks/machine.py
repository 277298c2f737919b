"""What machine a benchmark figure comes from: every figure names it.

`describe()` returns one line with the CPU model, the instruction sets that
decide which kernels run (avx2, avx512f, avx512_bf16, amx), the core count
with the threads per core, the framework versions (from their metadata: no
framework is imported to name it) and the load average, e.g.

    AMD EPYC, 2 cores (1 thread per core), avx2 avx512f avx512_bf16; TF
    2.21.0, Keras 3.15.1 (tensorflow backend), torch 2.14.1; oneDNN on;
    load average 0.12 0.30 0.41

Benchmarks print it first; BENCHMARKS.md keeps one table per machine seen.
"""

import os
import platform
import sys

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_model_and_flags():
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model is None:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover - not Linux
        pass
    return model or platform.machine(), [f for f in FLAGS if f in flags]


def versions():
    """The frameworks' versions, read from their installed metadata: a
    torch- or JAX-backend timing process does not import TensorFlow (or the
    others) to name them."""
    from importlib import metadata

    parts = []
    for name, label in (("tensorflow", "TF"), ("keras", "Keras"), ("torch", "torch"),
                        ("jax", "JAX")):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if name == "keras":
            if "keras" in sys.modules:
                backend = sys.modules["keras"].backend.backend()
            else:
                backend = os.environ.get("KERAS_BACKEND", "tensorflow")
            version += f" ({backend} backend)"
        parts.append(f"{label} {version}")
    return ", ".join(parts)


def cores():
    """`N cores`, with the threads per core where /proc/cpuinfo says them
    (two hyper-threads of one core are not two cores' worth of matmul), and
    the CPUs this process may use where fewer than the machine's."""
    total = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    siblings = physical = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "siblings" and siblings is None:
                    siblings = int(value)
                elif key == "cpu cores" and physical is None:
                    physical = int(value)
    except (OSError, ValueError):  # pragma: no cover - not Linux
        pass
    text = f"{total} cores"
    if siblings and physical:
        threads = siblings // physical
        text += f" ({threads} thread{'s' if threads != 1 else ''} per core)"
    if usable != total:
        text += f", {usable} usable"
    return text


def load_average():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:  # pragma: no cover
        return "n/a"


def onednn():
    """"oneDNN on" / "oneDNN off" for this process's TensorFlow (it decides
    which CPU kernels run: Eigen's without it), "" on another backend."""
    if "tensorflow" not in sys.modules:
        # Not imported here (`print_machine`'s own process): TensorFlow's
        # x86 default, unless the variable turns it off, where TF computes.
        if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
            return ""
        return "; oneDNN " + (
            "off" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" else "on"
        )
    try:
        from tensorflow.python.util import _pywrap_util_port

        return "; oneDNN " + ("on" if _pywrap_util_port.IsMklEnabled() else "off")
    except Exception:  # pragma: no cover - a moved private helper
        return ""


def describe():
    model, flags = cpu_model_and_flags()
    return (
        f"{model}, {cores()}, {' '.join(flags) or 'no avx2/avx512/amx'}; "
        f"{versions()}{onednn()}; load average {load_average()}"
    )


def print_machine():
    """Print `describe()` from a process of its own, for a parent script
    that runs its cases in subprocesses and stays free of the frameworks
    (their memory would count in its peak RSS)."""
    import subprocess

    sys.stdout.flush()
    subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        stderr=subprocess.DEVNULL, check=False,
    )
    sys.stdout.flush()


if __name__ == "__main__":
    print(describe())
