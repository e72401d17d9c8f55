"""A leader whose clock jumps far ahead must not make its future Tm permanent. Followers drop
entries whose Tm is beyond their clock + the allowed offset (and, for a while, everything from
that node), so such entries never commit, the others elect a leader with a sane clock, and no
node's safe time or HLC jumps ahead. Before this, one node whose clock stepped to the future and
won an election moved every later Tm, snapshot and HLC of the cluster there for good."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from pathlib import Path

from hlc import HybridClock, OffsetClock, SystemClock, physical_ms
from raft.core.raft import RaftCore
from raft.core.ready import Role
from raft.core.types import (
    ConfState,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    Message,
    RequestVote,
    Snapshot,
    VoteResponse,
)
from raft.node import NodeConfig, RaftNode, _ClockSample
from tests.raft.test_node import SECRET, ListStateMachine, free_ports
from tests.raft.test_node_lease import FakeTime, leading_node

OFFSET_MS = 200
JUMP_MS = 3_600_000
WAIT_S = 20.0


async def _leader(nodes: dict[int, RaftNode], *, besides: int = 0) -> RaftNode:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready = [n for i, n in nodes.items() if i != besides and n.is_leader() and n.ready_to_serve]
        if len(ready) == 1:
            return ready[0]
        await asyncio.sleep(0.02)
    raise AssertionError("no leader with a sane clock was elected")


def _cluster(tmp_path: Path) -> tuple[dict[int, RaftNode], dict[int, OffsetClock]]:
    ids = [1, 2, 3]
    peers = dict(zip(ids, (("127.0.0.1", p) for p in free_ports(3)), strict=True))
    clocks = {i: OffsetClock(SystemClock(), 0) for i in ids}
    nodes = {
        i: RaftNode(
            NodeConfig(
                node_id=i,
                cluster_id="clock",
                data_dir=tmp_path / f"n{i}",
                listen_host="127.0.0.1",
                listen_port=peers[i][1],
                peers=peers,
                secret=SECRET,
                election_timeout_ms=150,
                max_clock_offset_ms=OFFSET_MS,
            ),
            ListStateMachine(),
            clock=HybridClock(clocks[i], max_offset_ms=OFFSET_MS),
            rng=random.Random(i),
        )
        for i in ids
    }
    return nodes, clocks


async def test_a_leader_whose_clock_jumps_ahead_cannot_commit_its_future(tmp_path: Path) -> None:
    nodes, clocks = _cluster(tmp_path)
    for n in nodes.values():
        await n.start()
    try:
        bad = await _leader(nodes)
        await bad.propose(b"before")
        clocks[bad.node_id].offset_ms = JUMP_MS  # its wall clock steps an hour ahead
        committed = True
        try:
            await bad.propose(b"from the future", timeout_ms=3_000)
        except Exception:  # noqa: BLE001 - dropped, not leader, or timed out: all fine
            committed = False
        assert not committed, "an entry stamped an hour ahead committed"
        good = await _leader(nodes, besides=bad.node_id)
        await good.propose(b"after")
        deadline = time.monotonic() + WAIT_S
        while any(
            n.sm.applied[-1:] != [b"after"]  # type: ignore[attr-defined]
            for i, n in nodes.items()
            if i != bad.node_id
        ):
            assert time.monotonic() < deadline, "the other follower did not apply 'after'"
            await asyncio.sleep(0.02)
        now_ms = int(time.time() * 1000)
        for i, n in nodes.items():
            if i == bad.node_id:
                continue
            assert physical_ms(n.safe_time) <= now_ms + OFFSET_MS, i
            assert physical_ms(n.clock.now()) <= now_ms + 2 * OFFSET_MS, i
            applied = n.sm.applied  # type: ignore[attr-defined]
            assert b"from the future" not in applied and applied[-1] == b"after"
        # Fenced on both sides: the followers dropped its future entries, and/or it saw from
        # their heartbeats that its clock runs ahead of theirs and fenced itself.
        alarms = [n.status().clock_alarm for i, n in nodes.items() if i != bad.node_id]
        assert bad.status().clock_fenced or any(
            a.get("peer") == bad.node_id and a["ahead_ms"] > JUMP_MS / 2 for a in alarms
        )
    finally:
        for n in nodes.values():
            await n.stop()


async def test_a_node_whose_clock_runs_ahead_of_a_quorum_fences_itself_until_fixed(
    tmp_path: Path,
) -> None:
    """From heartbeats, a leader learns its clock is ahead of both peers: it steps down, does
    not campaign or serve, and says why; once its clock is right again (its offset to the new
    leader is within bounds) it serves again."""
    nodes, clocks = _cluster(tmp_path)
    for n in nodes.values():
        await n.start()
    try:
        bad = await _leader(nodes)
        clocks[bad.node_id].offset_ms = 10_000
        deadline = time.monotonic() + WAIT_S
        while not bad.status().clock_fenced:
            assert time.monotonic() < deadline, "the node did not notice its clock runs ahead"
            await asyncio.sleep(0.02)
        assert "ahead of 2 of its 2 fellow voters" in bad.status().clock_fenced
        good = await _leader(nodes, besides=bad.node_id)
        await good.propose(b"while fenced")
        assert not bad.is_leader() and not bad.ready_to_serve
        offsets = nodes[good.node_id].status().clock_offsets_ms
        assert offsets[bad.node_id] > 9_000  # the others see it ahead too
        clocks[bad.node_id].offset_ms = 0
        deadline = time.monotonic() + WAIT_S
        while bad.status().clock_fenced or not bad.ready_to_serve:
            assert time.monotonic() < deadline, "the fence was not lifted once the clock was right"
            await asyncio.sleep(0.02)
    finally:
        for n in nodes.values():
            await n.stop()


async def _follower_and_leader(nodes: dict[int, RaftNode]) -> tuple[RaftNode, RaftNode]:
    leader = await _leader(nodes)
    follower = next(n for n in nodes.values() if n is not leader)
    deadline = time.monotonic() + WAIT_S
    while follower.status().core.leader != leader.node_id:
        assert time.monotonic() < deadline, "the follower did not learn its leader"
        await asyncio.sleep(0.02)
    return follower, leader


async def test_a_delayed_heartbeat_is_not_mistaken_for_a_clock_offset(tmp_path: Path) -> None:
    """A heartbeat that spent 10 s in a queue (a partition healing) says the leader's clock
    was 10 s behind ours when it arrived: a lower bound on the offset, not a measurement. It
    must not fence a follower whose clock is right (it did: every node fenced, no leader)."""
    nodes, _ = _cluster(tmp_path)
    for n in nodes.values():
        await n.start()
    try:
        follower, leader = await _follower_and_leader(nodes)
        delayed = Heartbeat(
            src=leader.node_id,
            dst=follower.node_id,
            term=leader.status().core.term,
            commit=0,
            clock_ms=follower.clock.physical_now_ms() - 10_000,
        )
        follower._sample_clock(delayed)  # no await between: no real heartbeat overwrites it
        follower._check_own_clock()
        assert not follower.clock_fenced, follower.clock_fenced
        # A round trip that proves the same offset does fence: the evidence, not the lag.
        now = follower.clock.physical_now_ms()
        proven = HeartbeatResponse(
            src=leader.node_id,
            dst=follower.node_id,
            term=leader.status().core.term,
            clock_ms=now - 10_000,
            echo_ms=now - 2,
        )
        follower._sample_clock(proven)
        follower._check_own_clock()
        assert "ahead of its leader" in follower.clock_fenced
    finally:
        for n in nodes.values():
            await n.stop()


async def test_a_fence_by_a_quorum_lapses_when_its_evidence_goes_stale(tmp_path: Path) -> None:
    """With every node fenced there is no leader and no heartbeat to lift a fence: it must end
    once the samples it rested on are stale, or the cluster is wedged for good."""
    nodes, _ = _cluster(tmp_path)
    for n in nodes.values():
        await n.start()
    try:
        follower, _leader_node = await _follower_and_leader(nodes)
        follower._fence("test: ahead of 2 of its 2 fellow voters", by_quorum=True)
        follower._peer_clocks.clear()  # what staleness looks like: no fresh sample at all
        follower._check_own_clock()
        assert not follower.clock_fenced
    finally:
        for n in nodes.values():
            await n.stop()


async def test_a_follower_whose_clock_runs_ahead_fences_itself(tmp_path: Path) -> None:
    """A follower hears only heartbeats, which alone prove nothing about a clock ahead (their
    delay is unknown); the leader's echo of the follower's last response closes the round
    trip, so a follower 10 s ahead learns it and fences itself, while the cluster serves on."""
    nodes, clocks = _cluster(tmp_path)
    for n in nodes.values():
        await n.start()
    try:
        follower, _leader_node = await _follower_and_leader(nodes)
        clocks[follower.node_id].offset_ms = 10_000
        deadline = time.monotonic() + WAIT_S
        while not follower.status().clock_fenced:
            assert time.monotonic() < deadline, "the follower did not notice its clock runs ahead"
            await asyncio.sleep(0.02)
        assert not follower.ready_to_serve
        await (await _leader(nodes, besides=follower.node_id)).propose(b"while fenced")
        clocks[follower.node_id].offset_ms = 0
        deadline = time.monotonic() + WAIT_S
        while follower.status().clock_fenced or not follower.ready_to_serve:
            assert time.monotonic() < deadline, "the fence was not lifted once the clock was right"
            await asyncio.sleep(0.02)
    finally:
        for n in nodes.values():
            await n.stop()


async def test_a_leader_echoes_a_response_advanced_by_how_long_it_held_it(tmp_path: Path) -> None:
    """A leader answers a follower's heartbeat response only with its next heartbeat, up to
    a heartbeat interval later. Echoed as heard, that hold counted as round trip: on one host
    every follower measured its leader's clock +25 ms ahead (status showed it, the fence
    used it). The heartbeat's echo now includes the hold; a response's echo stays the
    heartbeat's own clock, which the leader lease matches acknowledgements by."""
    nodes, _ = _cluster(tmp_path)
    for n in nodes.values():
        await n.start()
    try:
        follower, leader = await _follower_and_leader(nodes)
        term = leader.status().core.term
        held_s = 0.040
        leader._last_peer_clock[follower.node_id] = (1_000, 7, time.monotonic() - held_s)
        stamped = leader._stamp(
            Heartbeat(src=leader.node_id, dst=follower.node_id, term=term, commit=0)
        )
        assert isinstance(stamped, Heartbeat)
        assert 1_000 + 40 <= stamped.echo_ms < 1_000 + 40 + 1_000, stamped.echo_ms
        # The incarnation that came with the echoed clock goes back with it.
        assert (stamped.incarnation, stamped.echo_incarnation) == (leader.incarnation, 7)
        follower._last_peer_clock[leader.node_id] = (2_000, 9, time.monotonic() - held_s)
        answer = follower._stamp(
            HeartbeatResponse(src=follower.node_id, dst=leader.node_id, term=term)
        )
        assert isinstance(answer, HeartbeatResponse)
        assert answer.echo_ms == 2_000
        assert (answer.incarnation, answer.echo_incarnation) == (follower.incarnation, 9)
        # And end to end: on one host a follower's estimate of its leader's clock is near 0,
        # not half a heartbeat interval ahead (the median of many samples: one can be late).
        seen: list[int] = []
        deadline = time.monotonic() + WAIT_S
        while len(seen) < 40 and time.monotonic() < deadline:
            sample = follower._peer_clocks.get(leader.node_id)
            if sample is not None and sample.high is not None:
                seen.append(sample.offset)
            await asyncio.sleep(0.02)
        assert len(seen) >= 20, seen
        assert abs(sorted(seen)[len(seen) // 2]) <= 10, seen
    finally:
        for n in nodes.values():
            await n.stop()


def test_a_node_fenced_by_a_quorum_still_votes_once_its_leader_went_silent(
    tmp_path: Path,
) -> None:
    """A node whose clock is off a quorum must not campaign; it did not tick at all, so its
    election timer froze with a leader known and its check-quorum lease never lapsed: it
    refused every (pre-)vote until the fence's evidence went stale (five election timeouts
    of both timeouts). With the leader gone, a three-node cluster with one fenced node then
    had no leader for seconds: the healthy node needs the fenced node's vote."""
    t = FakeTime()
    node = leading_node(tmp_path, 3, t)
    core = node.core
    assert core is not None
    term = core.term
    core.step(Heartbeat(src=2, dst=1, term=term + 1, commit=0))  # now follows node 2
    now_s = time.monotonic()
    node._peer_clocks = {
        peer: _ClockSample(offset=-10_000, low=-10_010, high=-9_990, at=now_s) for peer in (2, 3)
    }
    for _ in range(4 * core.cfg.election_ticks):  # node 2 fell silent
        node._ticks_due = 1
        node._step_inputs()
        assert node._fenced_by_quorum
        assert core.role is Role.FOLLOWER  # fenced: it does not campaign
    node._on_message(
        RequestVote(
            src=3,
            dst=1,
            term=term + 2,
            last_index=core.log.last_index(),
            last_term=core.log.last_term(),
            pre_vote=True,
        )
    )
    node._step_inputs()
    granted = [m for m in core.ready().messages if isinstance(m, VoteResponse) and m.granted]
    assert [m.dst for m in granted] == [3]


def _following_node(data_dir: Path, t: FakeTime, *, offset_ms: int, leader: int = 1) -> RaftNode:
    """Node 2 of three, not started, its core following `leader`; its clock is `t` shifted by
    `offset_ms`. Messages go through the driver's stamping and `_on_message`, as on the wire."""
    ids = (1, 2, 3)
    node = RaftNode(
        NodeConfig(
            node_id=2,
            cluster_id="test",
            data_dir=data_dir,
            listen_host="127.0.0.1",
            listen_port=7002,
            peers={i: ("127.0.0.1", 7000 + i) for i in ids},
            secret=SECRET,
            tick_ms=10,
            election_timeout_ms=300,
            max_clock_offset_ms=OFFSET_MS,
        ),
        ListStateMachine(),
        clock=HybridClock(OffsetClock(t, offset_ms), max_offset_ms=2 * offset_ms + OFFSET_MS),
        monotonic=t.monotonic,
    )
    core = RaftCore(
        node.config.core_config(),
        hard_state=HardState(),
        snapshot=Snapshot(),
        entries=(),
        bootstrap_conf=ConfState(voters=ids),
        rng=random.Random(2),
    )
    core.step(Heartbeat(src=leader, dst=2, term=1, commit=0))
    assert core.leader == leader
    node.core = core
    return node


def test_a_follower_restarted_with_its_clock_fixed_ignores_its_old_incarnations_echo(
    tmp_path: Path,
) -> None:
    """chaos seed 210 (docs/chaos.md): a follower 2 s ahead answered its leader, was killed and
    restarted with its clock fixed; heartbeats the leader had queued meanwhile arrived later,
    echoing the previous process's response clock (2 s ahead) plus the leader's hold, and the
    new process took that for a round trip of its own: "this node's clock is 2703 ms ahead of
    its leader 1's", fenced (NOT_READY) until a real round trip. A node may only close a
    round trip with an echo of a clock this very process sent."""
    t = FakeTime()
    leader = leading_node(tmp_path / "leader", 3, t, max_clock_offset_ms=OFFSET_MS)
    assert leader.core is not None
    term = leader.core.term
    old = _following_node(tmp_path / "old", t, offset_ms=2_000)
    old._on_message(leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0)))
    leader._on_message(old._stamp(HeartbeatResponse(src=2, dst=1, term=term)))
    # Killed. The leader goes on stamping heartbeats to it; they wait in its transport queue.
    t.now_s += 0.1
    queued = leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0))
    # The node restarts with its clock fixed; the queued heartbeat reaches it 2.6 s later.
    t.now_s += 2.6
    new = _following_node(tmp_path / "new", t, offset_ms=0)
    new._on_message(queued)
    new._check_own_clock()
    assert not new.clock_fenced, new.clock_fenced
    sample = new._peer_clocks[1]
    assert sample.high is None, sample  # one way: it proves the leader is not far ahead, only
    # The same echo is a real round trip for the process that sent the response: had the old
    # one lived, it would rightly fence itself.
    old._on_message(queued)
    old._check_own_clock()
    assert "ahead of its leader 1" in old.clock_fenced, old.clock_fenced
    # The new process's own round trip still proves what it proves.
    new._on_message(leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0)))
    leader._on_message(new._stamp(HeartbeatResponse(src=2, dst=1, term=term)))
    t.now_s += 0.05
    new._on_message(leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0)))
    sample = new._peer_clocks[1]
    assert sample.high is not None and sample.low <= 0 <= sample.high, sample
    new._check_own_clock()
    assert not new.clock_fenced, new.clock_fenced


def test_a_leader_restarted_with_its_clock_fixed_ignores_its_old_incarnations_echo(
    tmp_path: Path,
) -> None:
    """The same the other way: responses a follower queued for a leader that was killed echo
    the old leader process's heartbeat clock; the restarted process takes them one way only."""
    t = FakeTime()
    old_leader = leading_node(tmp_path / "old", 3, t, max_clock_offset_ms=OFFSET_MS)
    old_leader.clock = HybridClock(OffsetClock(t, 2_000), max_offset_ms=5_000)
    assert old_leader.core is not None
    term = old_leader.core.term
    follower = _following_node(tmp_path / "f", t, offset_ms=0)
    follower._on_message(old_leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0)))
    t.now_s += 0.1
    queued = follower._stamp(HeartbeatResponse(src=2, dst=1, term=term))
    t.now_s += 2.6
    new_leader = leading_node(tmp_path / "new", 3, t, max_clock_offset_ms=OFFSET_MS)
    new_leader._on_message(queued)
    assert new_leader._peer_clocks[2].high is None, new_leader._peer_clocks[2]
    old_leader._on_message(queued)
    high = old_leader._peer_clocks[2].high
    assert high is not None and high < -OFFSET_MS, old_leader._peer_clocks[2]


def test_an_echo_without_incarnations_is_judged_as_protocol_version_5_did(
    tmp_path: Path,
) -> None:
    """A mixed pair during a rolling upgrade: a leader of peer protocol version 5 sends no
    incarnations (its link to us strips them too, so its echo has none). Its echo is taken as
    this process's, as version 5 did: a follower truly ahead still fences itself (and one
    restarted after its clock was fixed can still trip on its previous process's echo until
    its leader is upgraded: the old rule, flaw included)."""
    t = FakeTime()
    follower = _following_node(tmp_path / "f", t, offset_ms=2_000)
    leader = leading_node(tmp_path / "leader", 3, t, max_clock_offset_ms=OFFSET_MS)
    assert leader.core is not None
    term = leader.core.term

    def as_version_5(m: Message) -> Message:
        assert isinstance(m, Heartbeat | HeartbeatResponse)
        return dataclasses.replace(m, incarnation=0, echo_incarnation=0)

    follower._on_message(as_version_5(leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0))))
    # Our response reaches the old leader without our incarnation (the link strips it).
    leader._on_message(as_version_5(follower._stamp(HeartbeatResponse(src=2, dst=1, term=term))))
    t.now_s += 0.05
    echo = as_version_5(leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0)))
    t.now_s += 0.01
    fresh = _following_node(tmp_path / "fresh", t, offset_ms=2_000)
    fresh._on_message(echo)  # another process: the old rule cannot tell
    assert fresh._peer_clocks[1].high is not None
    follower._on_message(echo)
    follower._check_own_clock()
    assert "ahead of its leader 1" in follower.clock_fenced, follower.clock_fenced
    # A new leader that heard our clock without an incarnation (its link from us speaks
    # version 5) echoes it without one: judged by the old rule as well.
    new_leader_echo = leader._stamp(Heartbeat(src=1, dst=2, term=term, commit=0))
    assert isinstance(new_leader_echo, Heartbeat)
    assert new_leader_echo.incarnation and not new_leader_echo.echo_incarnation
    fresh._on_message(new_leader_echo)
    assert fresh._peer_clocks[1].high is not None
