"""Child-process housekeeping shared by the benchmark harnesses: stop by PID, read a log tail,
treat SIGTERM like Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

# How long a node gets to exit after its stop signal before it is SIGKILLed.
PROCESS_EXIT_WAIT_S = 5.0
# How much of a node's log an error message quotes.
LOG_TAIL_BYTES = 3000


def stop_processes(
    processes: Iterable[subprocess.Popen[bytes]], *, stop_signal: int = signal.SIGTERM
) -> None:
    """Send `stop_signal` to every live process by PID; SIGKILL whatever has not exited in
    time."""
    live = [p for p in processes if p.poll() is None]
    for process in live:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(stop_signal)
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


def _raise_keyboard_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM takes the same path as Ctrl-C inside the block, so every finally block of a
    harness stops its children (by PID) when the harness itself is terminated."""
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
