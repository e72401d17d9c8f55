"""Ports for the daemons and servers the tests start, on 127.0.0.1.

A port found free stays free only until someone binds it, and a node process binds its ports a
second or more after the test chose them. A port the kernel hands out for a bind to port 0 lies
in its ephemeral range, where every outgoing connection also gets its local port (the tests' own
clients and the nodes' links among them): one of those could take it first, and the node then
failed to start ("address already in use"). So ports are picked at random below the ephemeral
range, checked free, and never handed out twice by one test process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

# Where the picked ports start; below the usual ephemeral range (32768-60999 on Linux).
PORTS_LOW = 20_000
# Picks tried per port wanted before giving up (most are free on a test machine).
_TRIES_PER_PORT = 200
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

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
