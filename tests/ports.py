"""Ports for the daemons and servers the tests start, on 127.0.0.1.

A port found free stays free only until someone binds it, and a node process binds its ports a
second or more after the test chose them. A port the kernel hands out for a bind to port 0 lies
in its ephemeral range, where every outgoing connection also gets its local port (the tests' own
clients and the nodes' links among them): one of those could take it first, and the node then
failed to start ("address already in use"). So ports are picked at random below the ephemeral
range, checked free, and never handed out twice by one test process.

Nor by two: several suites run at once on one machine (worktrees side by side), and a port one
process picked must not go to another before the first binds it (a chaos node once refused to
start, its metrics port taken by another test process in that second). Each port handed out is
claimed by a file named after it in a directory shared by every test process of the machine,
holding the claimant's pid; a claim whose process is gone lapses. The claims of a process are
removed when it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

# Where the picked ports start; below the usual ephemeral range (32768-60999 on Linux).
PORTS_LOW = 20_000
# Picks tried per port wanted before giving up (most are free on a test machine).
_TRIES_PER_PORT = 200
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The claims directory (tests/test_ports.py sets its own).
CLAIMS_DIR_ENV = "METASTORE_TEST_PORT_CLAIMS"
_claims_dir = Path(
    os.environ.get(CLAIMS_DIR_ENV) or Path(tempfile.gettempdir()) / "metastore-test-ports"
)

_lock = threading.Lock()
_handed_out: set[int] = set()
_rng = random.Random()  # seeded from the OS: concurrent test runs pick different ports


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 right now, none handed out before here."""
    high = _ephemeral_low()
    if high - PORTS_LOW < 1024:
        return _kernel_ports(count)  # no room below the ephemeral range on this machine
    chosen: list[int] = []
    with _lock:
        for _ in range(count * _TRIES_PER_PORT):
            if len(chosen) == count:
                break
            port = _rng.randrange(PORTS_LOW, high)
            if port in _handed_out or port in chosen or not _bindable(port):
                continue
            if not _claim(port):
                continue
            chosen.append(port)
        if len(chosen) < count:
            raise RuntimeError(f"found only {len(chosen)} of {count} free ports below {high}")
        _handed_out.update(chosen)
    return chosen


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_claimed: list[Path] = []  # this process's claims, removed at exit


def _claim(port: int) -> bool:
    """Claim `port` for this process across the machine's test processes: False if another
    live process holds it."""
    _claims_dir.mkdir(parents=True, exist_ok=True)
    path = _claims_dir / str(port)
    for _ in range(2):  # a second try after taking over a lapsed claim
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = int(path.read_text())
            except (OSError, ValueError):
                return False  # being written (or unreadable): held
            if _alive(holder):
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        _claimed.append(path)
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


@atexit.register
def _release_claims() -> None:
    for path in _claimed:
        with contextlib.suppress(OSError):
            if path.read_text() == str(os.getpid()):
                path.unlink()
