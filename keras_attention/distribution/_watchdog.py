"""Ends a process whose multi-worker start hangs (run as a separate script).

    python _watchdog.py PID TIMEOUT ADDRESSES_JSON TF_CONFIG

Waits `TIMEOUT` seconds for a line (or end of file) on stdin: the parent
writes it once its strategy started, and its end closes stdin too. Past
the timeout, prints which of `ADDRESSES_JSON` (`[[job, index, "host:port"],
...]`, the other workers) refuse connections, then kills PID with SIGKILL:
TensorFlow holds the interpreter lock while it waits for the cluster, so
nothing inside the parent can run, and it handles SIGTERM itself. Only the
standard library, so that it starts in a fraction of a second.
"""

import json
import os
import select
import signal
import socket
import sys


def reachable(address, timeout=1.0):
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout):
            return True
    except (OSError, ValueError):
        return False


def main():
    pid, timeout, addresses, tf_config = (
        int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    )
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if ready:
        return
    missing = [(job, index, address) for job, index, address in addresses
               if not reachable(address)]
    names = ", ".join(f"{job} {index} at {address}" for job, index, address in missing)
    message = (
        f"MultiWorkerMirroredStrategy did not start within {timeout:g} s: "
        + (f"TF_CONFIG names {names}, which does not accept connections. "
           if missing else
           "every worker accepts connections but the cluster did not form. ")
        + f"Check TF_CONFIG ({tf_config}) and that every worker runs. "
        f"Ending process {pid}."
    )
    print(f"ERROR: {message}", file=sys.stderr, flush=True)
    os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
