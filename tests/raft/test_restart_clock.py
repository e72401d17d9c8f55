"""The HLC is not a file of its own: a node's time-bearing state is the Tm of its log entries,
which are fsync'd before anything depends on them. So a restart must rebuild the clock from the
log: right after start (before any leader is heard) the clock is past every Tm in the node's
WAL, even when the machine's clock stepped back while the node was down, and so every Tm it
stamps, and its safe time once it serves again, are past everything it had before."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from hlc import HybridClock, ManualClock, make_ts
from raft.node import NodeConfig, RaftNode
from tests.ports import free_ports
from tests.raft.test_node import SECRET, ListStateMachine

T0_MS = 1_800_000_000_000
STEP_BACK_MS = 3_600_000
WAIT_S = 10.0


def _node(tmp_path: Path, port: int, clock: HybridClock) -> RaftNode:
    return RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="restart-clock",
            data_dir=tmp_path / "n1",
            listen_host="127.0.0.1",
            listen_port=port,
            peers={1: ("127.0.0.1", port)},
            secret=SECRET,
            election_timeout_ms=150,
            heartbeat_interval_ms=50,
        ),
        ListStateMachine(),
        clock=clock,
        rng=random.Random(1),
    )


async def _ready(node: RaftNode) -> None:
    deadline = time.monotonic() + WAIT_S
    while not (node.is_leader() and node.ready_to_serve):
        assert time.monotonic() < deadline, "the node did not become a ready leader"
        await asyncio.sleep(0.01)


async def test_a_restart_with_a_clock_stepped_back_keeps_time_moving_forward(
    tmp_path: Path,
) -> None:
    (port,) = free_ports(1)
    physical = ManualClock(T0_MS)
    first = _node(tmp_path, port, HybridClock(physical))
    await first.start()
    try:
        await _ready(first)
        tms = [(await first.propose(b"p%d" % i)).tm for i in range(5)]
        physical.advance(10)
        tms.append((await first.propose(b"later")).tm)
        safe_before = first.safe_time
    finally:
        await first.stop()
    last_tm = max(tms)
    assert safe_before >= last_tm

    # Down for a while; meanwhile the machine's clock steps an hour back (an NTP step).
    physical.set(T0_MS - STEP_BACK_MS)
    clock = HybridClock(physical)
    second = _node(tmp_path, port, clock)
    await second.start()
    try:
        assert clock.last() >= last_tm  # rebuilt from the WAL before anything else
        assert clock.now() > last_tm
        await _ready(second)
        again = await second.propose(b"after restart")
        assert again.tm > last_tm
        assert second.safe_time >= again.tm > safe_before
        assert clock.now() > again.tm > make_ts(T0_MS - STEP_BACK_MS)
    finally:
        await second.stop()
