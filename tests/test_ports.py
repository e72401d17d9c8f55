"""The test suite's port picker (tests/ports.py): below the kernel's ephemeral range, where no
outgoing connection can take a port between the pick and the node's bind, and never twice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ports


def test_ports_are_free_distinct_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    low = ports._ephemeral_low()
    first = ports.free_ports(12)
    second = ports.free_ports(12)
    assert len(set(first)) == 12 and not set(first) & set(second)
    if low - ports.PORTS_LOW >= 1024:
        assert all(ports.PORTS_LOW <= p < low for p in first + second)
    for port in first:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_two_test_processes_at_once_never_get_the_same_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several suites run at once on one machine (worktrees side by side): a port one process
    picked and has not bound yet must not go to another (seen: a chaos node refused to start,
    its metrics port taken in that second by another test process). A 1,024-port range, half
    of it held by another process: without claims across processes half of our picks would
    clash."""
    claims = tmp_path / "claims"
    low = 21_000
    script = (
        "import sys\n"
        "from tests import ports\n"
        f"ports.PORTS_LOW = {low}\n"
        f"ports._ephemeral_low = lambda: {low + 1024}\n"
        "print(','.join(map(str, ports.free_ports(500))), flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, ports.CLAIMS_DIR_ENV: str(claims)}
    other = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        text=True,
    )
    try:
        assert other.stdout is not None
        held = {int(p) for p in other.stdout.readline().split(",")}
        assert len(held) == 500
        monkeypatch.setattr(ports, "_claims_dir", claims)
        monkeypatch.setattr(ports, "PORTS_LOW", low)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: low + 1024)
        mine = ports.free_ports(100)
        assert not held & set(mine)
    finally:
        other.kill()  # -9: no exit handler removes its claims
        other.communicate(timeout=30)
    assert len(list(claims.iterdir())) == 600
    # Once that process is gone its claims lapse: its ports can be picked again.
    again = ports.free_ports(400)
    assert held & set(again)
