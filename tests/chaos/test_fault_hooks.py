"""The daemon's peer-address fault hook: METASTORE_FAULT_PEER_ADDRESSES / _FORWARD_ADDRESSES
(metastore/daemon/node.py) and NodeConfig.dial_overrides (raft/node.py).

In-process: three Raft nodes whose every peer connection goes through the chaos proxy; a
membership change (a CONF entry re-sets every node's peer addresses) must not undo it, and the
addresses the nodes replicate stay the members' own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon.node import (
    FAULT_CLOCK_POLL_MS,
    FAULT_FORWARD_ADDRESSES_ENV,
    FAULT_PEER_ADDRESSES_ENV,
    _fault_addresses,
    _FaultClockFile,
)
from raft.node import NodeConfig, RaftNode
from tests.chaos.netproxy import NetProxy
from tests.raft.test_node import SECRET, ListStateMachine, free_ports, leader_of

Address = tuple[str, int]


def test_fault_addresses_parse_and_warn(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(FAULT_PEER_ADDRESSES_ENV, raising=False)
    assert _fault_addresses(FAULT_PEER_ADDRESSES_ENV, "Raft peer") == {}
    monkeypatch.setenv(FAULT_FORWARD_ADDRESSES_ENV, "2=127.0.0.1:41234, 3=localhost:41235")
    with caplog.at_level(logging.WARNING, logger="metastore.node"):
        got = _fault_addresses(FAULT_FORWARD_ADDRESSES_ENV, "forwarding")
    assert got == {2: ("127.0.0.1", 41234), 3: ("localhost", 41235)}
    assert "FAULT INJECTION" in caplog.text and FAULT_FORWARD_ADDRESSES_ENV in caplog.text
    for bad in ("2=127.0.0.1", "x=127.0.0.1:1", "2=:1", "2=127.0.0.1:port"):
        monkeypatch.setenv(FAULT_PEER_ADDRESSES_ENV, bad)
        with pytest.raises(ValueError, match=FAULT_PEER_ADDRESSES_ENV):
            _fault_addresses(FAULT_PEER_ADDRESSES_ENV, "Raft peer")


@pytest.fixture
def proxy() -> Iterator[NetProxy]:
    p = NetProxy()
    p.start()
    yield p
    p.stop()


def _dialled(node: RaftNode) -> dict[int, str]:
    assert node.transport is not None
    return {pid: s["address"] for pid, s in node.transport.stats()["peers"].items()}


async def test_peer_links_go_through_the_overrides_whatever_membership_says(
    tmp_path: Path, proxy: NetProxy
) -> None:
    ids = [1, 2, 3]
    ports = free_ports(4)
    members: dict[int, Address] = {i: ("127.0.0.1", ports[i - 1]) for i in ids}
    overrides: dict[int, dict[int, Address]] = {i: {} for i in ids}
    for i in ids:
        for j in ids:
            if i != j:
                port = proxy.add(f"{i}->{j}", members[j])
                overrides[i][j] = ("127.0.0.1", port)
    nodes = {
        i: RaftNode(
            NodeConfig(
                node_id=i,
                cluster_id="test",
                data_dir=tmp_path / f"n{i}",
                listen_host="127.0.0.1",
                listen_port=members[i][1],
                peers=members,
                secret=SECRET,
                election_timeout_ms=150,
                dial_overrides=overrides[i],
            ),
            ListStateMachine(),
            clock=HybridClock(SystemClock()),
            rng=random.Random(i),
        )
        for i in ids
    }
    for n in nodes.values():
        await n.start()
    try:
        leader = await leader_of(nodes)
        await leader.propose(b"x", timeout_ms=5_000)
        for i, n in nodes.items():
            want = {j: f"127.0.0.1:{overrides[i][j][1]}" for j in ids if j != i}
            assert _dialled(n) == want
            assert n.addresses == members  # what a snapshot or CONF entry carries
        moved = sum(proxy.stats(name).bytes_up for name in proxy.names)
        assert moved > 0 and all(proxy.stats(name).connected for name in proxy.names)
        # A membership change: every node applies a CONF entry and re-sets its peers.
        learner: Address = ("127.0.0.1", ports[3])
        await leader.add_node(4, learner, learner=True, timeout_ms=10_000)
        deadline = time.monotonic() + 10
        while any(4 not in n.addresses for n in nodes.values()):
            assert time.monotonic() < deadline, "the CONF entry was not applied everywhere"
            await asyncio.sleep(0.02)
        for i, n in nodes.items():
            want = {j: f"127.0.0.1:{overrides[i][j][1]}" for j in ids if j != i}
            assert _dialled(n) == {**want, 4: f"127.0.0.1:{ports[3]}"}
            assert n.addresses == {**members, 4: learner}
        # And the links through the proxy still carry the log.
        await leader.propose(b"y", timeout_ms=5_000)
    finally:
        for n in nodes.values():
            await n.stop()


async def test_the_clock_file_steps_a_running_clock_when_it_changes(tmp_path: Path) -> None:
    """METASTORE_FAULT_CLOCK_OFFSET_FILE: what the file holds at the start is left alone (a
    node started with METASTORE_FAULT_CLOCK_OFFSET_MS keeps that offset); each later change
    steps the clock; a text that is not a number changes nothing."""
    from hlc import OffsetClock

    path = tmp_path / "clock-offset"
    path.write_text("0\n")
    clock = OffsetClock(SystemClock(), 2_000)
    follower = _FaultClockFile(path, clock)
    task = asyncio.create_task(follower.follow())

    async def offset_becomes(offset_ms: int) -> None:
        deadline = time.monotonic() + 5
        while clock.offset_ms != offset_ms:
            assert time.monotonic() < deadline, f"offset {clock.offset_ms}, not {offset_ms}"
            await asyncio.sleep(0.01)

    try:
        await asyncio.sleep(3 * FAULT_CLOCK_POLL_MS / 1000)
        assert clock.offset_ms == 2_000
        path.write_text("-70\n")
        await offset_becomes(-70)
        path.write_text("soon\n")
        await asyncio.sleep(3 * FAULT_CLOCK_POLL_MS / 1000)
        assert clock.offset_ms == -70
        path.write_text("0\n")
        await offset_becomes(0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
