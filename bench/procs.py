"""Child-process housekeeping shared by the benchmark harnesses: stop by PID, read a log tail."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

# How long a node gets to exit after SIGTERM before it is SIGKILLed.
PROCESS_EXIT_WAIT_S = 5.0
# How much of a node's log an error message quotes.
LOG_TAIL_BYTES = 3000


def stop_processes(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every live process by PID; SIGKILL whatever has not exited in time."""
    live = [p for p in processes if p.poll() is None]
    for process in live:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
    deadline = time.monotonic() + PROCESS_EXIT_WAIT_S
    for process in live:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=PROCESS_EXIT_WAIT_S)


def log_tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-LOG_TAIL_BYTES:].decode(errors="replace")
