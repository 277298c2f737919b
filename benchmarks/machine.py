"""What machine a benchmark figure comes from: every figure names it.

`describe()` returns one line with the CPU model, the instruction sets that
decide which kernels run (avx2, avx512f, avx512_bf16, amx), the core count,
the framework versions and the load average, e.g.

    AMD EPYC, 2 cores, avx2 avx512f avx512_bf16; TF 2.21.0, Keras 3.15.1
    (tensorflow backend), torch 2.13.0; oneDNN on; load average 0.12 0.30
    0.41

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
    parts = []
    for name, label in (("tensorflow", "TF"), ("keras", "Keras"), ("torch", "torch"),
                        ("jax", "JAX")):
        try:
            module = __import__(name)
        except ImportError:
            continue
        version = getattr(module, "__version__", "?")
        if name == "keras":
            version += f" ({module.backend.backend()} backend)"
        parts.append(f"{label} {version}")
    return ", ".join(parts)


def load_average():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:  # pragma: no cover
        return "n/a"


def onednn():
    """"oneDNN on" / "oneDNN off" for this process's TensorFlow (it decides
    which CPU kernels run: Eigen's without it), "" when TensorFlow is not
    loaded."""
    if "tensorflow" not in sys.modules:
        return ""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return "; oneDNN " + ("on" if _pywrap_util_port.IsMklEnabled() else "off")
    except Exception:  # pragma: no cover - a moved private helper
        return ""


def describe():
    model, flags = cpu_model_and_flags()
    return (
        f"{model}, {os.cpu_count()} cores, {' '.join(flags) or 'no avx2/avx512/amx'}; "
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
