"""The node driver in-process: real WALs (fsync on), real loopback transport, one event loop.

What only the driver decides is tested here: proposals and their results, the proposal
timeout, cancelled callers, the fsyncs a lone proposer pays, and applying committed entries that
are already durable before the Ready that carries them is persisted. The multi-process kill -9
tests live in test_processes.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest

import raft.node
from hlc import HybridClock, SystemClock
from raft.core.conf import encode_conf
from raft.core.errors import (
    ConfChangeError,
    LearnerBehindError,
    NotLeaderError,
    ProposalDroppedError,
)
from raft.core.raft import RaftCore
from raft.core.ready import CoreConfig, Ready
from raft.core.types import (
    AppendEntries,
    AppendResponse,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    InstallSnapshot,
    Message,
    RequestVote,
    Snapshot,
    SnapshotMeta,
)
from raft.node import (
    PERSIST_INLINE_BYTES_MAX,
    PROPOSAL_BYTES_MAX,
    NodeConfig,
    NodeStoppedError,
    ProposalTimeoutError,
    ProposalTooLargeError,
    QueueFullError,
    RaftNode,
    ReadIndexError,
    SafeTimeTimeoutError,
    applicable_before_persist,
    unwrap_snapshot_data,
)
from raft.wal import WriteAheadLog
from tests.ports import free_ports

SECRET = b"s" * 32
ELECTION_WAIT_S = 10.0
# How long the slow-disk test takes to write a snapshot file.
SLOW_SNAPSHOT_WRITE_S = 3.0


class ListStateMachine:
    def __init__(self) -> None:
        self.applied: list[bytes] = []
        # Payloads the node told of as appended (`prepare_appended`), and those it applied
        # without having told of them first.
        self.told: set[bytes] = set()
        self.applied_untold: list[bytes] = []

    def prepare_appended(self, entries: Sequence[Entry]) -> None:
        self.told.update(e.data for e in entries if e.kind is EntryKind.NORMAL)

    def apply(self, entry: Entry) -> Any:
        if entry.kind is EntryKind.NORMAL:
            self.applied.append(entry.data)
            if entry.data not in self.told:
                self.applied_untold.append(entry.data)
        return len(self.applied)

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes | memoryview) -> None:
        self.applied = []


@asynccontextmanager
async def cluster(
    tmp_path: Path,
    size: int,
    *,
    election_timeout_ms: int = 150,
    heartbeat_interval_ms: int = 50,
    persist_inline: bool = True,
    snapshot_every_entries: int = 10_000,
    snapshot_keep_entries: int = 1_000,
) -> AsyncIterator[dict[int, RaftNode]]:
    ids = list(range(1, size + 1))
    peers = dict(zip(ids, (("127.0.0.1", p) for p in free_ports(size)), strict=True))
    nodes = {
        i: RaftNode(
            NodeConfig(
                node_id=i,
                cluster_id="test",
                data_dir=tmp_path / f"n{i}",
                listen_host="127.0.0.1",
                listen_port=peers[i][1],
                peers=peers,
                secret=SECRET,
                election_timeout_ms=election_timeout_ms,
                heartbeat_interval_ms=heartbeat_interval_ms,
                persist_inline=persist_inline,
                snapshot_every_entries=snapshot_every_entries,
                snapshot_keep_entries=snapshot_keep_entries,
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
        yield nodes
    finally:
        for n in nodes.values():
            await n.stop()


async def leader_of(nodes: dict[int, RaftNode]) -> RaftNode:
    deadline = time.monotonic() + ELECTION_WAIT_S
    while time.monotonic() < deadline:
        leaders = [n for n in nodes.values() if n.is_leader()]
        if len(leaders) == 1 and leaders[0].ready_to_serve:
            return leaders[0]
        await asyncio.sleep(0.01)
    raise AssertionError("no leader elected")


def joining_node(
    tmp_path: Path, node_id: int, address: tuple[str, int], peers: dict[int, tuple[str, int]]
) -> RaftNode:
    """A new node (empty data directory, `join`) that knows the cluster's `peers`."""
    return RaftNode(
        NodeConfig(
            node_id=node_id,
            cluster_id="test",
            data_dir=tmp_path / f"n{node_id}",
            listen_host="127.0.0.1",
            listen_port=address[1],
            peers={**peers, node_id: address},
            secret=SECRET,
            join=True,
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
        rng=random.Random(node_id),
    )


def sm(node: RaftNode) -> ListStateMachine:
    assert isinstance(node.sm, ListStateMachine)
    return node.sm


async def test_concurrent_proposals_apply_once_in_order_with_their_results(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as nodes:
        leader = await leader_of(nodes)
        payloads = [b"p%d" % i for i in range(300)]
        results = await asyncio.gather(*(leader.propose(p) for p in payloads))
        assert sorted(sm(leader).applied) == sorted(payloads)
        for p, r in zip(payloads, results, strict=True):
            # The result is the state machine's return value: the payload's position.
            assert sm(leader).applied[r.result - 1] == p
        assert [r.index for r in sorted(results, key=lambda r: r.index)] == sorted(
            r.index for r in results
        )
        assert len({r.index for r in results}) == len(results)
        tms = [r.tm for r in sorted(results, key=lambda r: r.index)]
        assert tms == sorted(set(tms)), "Tm strictly increases along the log"
        # Followers apply the same sequence.
        deadline = time.monotonic() + ELECTION_WAIT_S
        while any(sm(n).applied != sm(leader).applied for n in nodes.values()):
            assert time.monotonic() < deadline, "followers did not catch up"
            await asyncio.sleep(0.01)


async def test_every_node_tells_its_state_machine_of_entries_before_applying_them(
    tmp_path: Path,
) -> None:
    """`prepare_appended` hears of each entry as it is appended, on the leader and on the
    followers, before it is applied: time in which a state machine can decode a large payload
    off the loop (metastore.daemon.statemachine), which apply on the loop then need not do."""
    async with cluster(tmp_path, 3) as nodes:
        leader = await leader_of(nodes)
        payloads = [b"q%d" % i for i in range(20)]
        await asyncio.gather(*(leader.propose(p) for p in payloads))
        deadline = time.monotonic() + ELECTION_WAIT_S
        while any(sm(n).applied != sm(leader).applied for n in nodes.values()):
            assert time.monotonic() < deadline, "followers did not catch up"
            await asyncio.sleep(0.01)
        for n in nodes.values():
            assert sm(n).applied_untold == [], n.node_id


async def test_a_proposal_too_large_for_the_wal_is_refused_before_the_log(
    tmp_path: Path,
) -> None:
    """An entry over the WAL record limit used to be appended and then crash the leader when
    it was written (and every node that received it). It is refused, typed, and nothing
    changes."""
    # A 3 s election timeout (not the helper's 150 ms): writing and shipping the 16 MiB entry
    # stalls the one event loop all three nodes share, for seconds on a loaded machine, and
    # with 150 ms every attempt lost the leadership (five in a row under two CPU hogs).
    async with cluster(tmp_path, 3, election_timeout_ms=3000, heartbeat_interval_ms=300) as nodes:
        leader = await leader_of(nodes)
        before = leader.status().core.last_index
        with pytest.raises(ProposalTooLargeError):
            await leader.propose(b"x" * (PROPOSAL_BYTES_MAX + 1))
        assert leader.status().core.last_index == before
        # The node is fine: the largest allowed proposal and a small one both commit. Writing
        # and shipping 16 MiB stalls this one event loop (it failed once in ~45 CI runs with
        # NotLeaderError on the next proposal, and once at load 8 with the big entry itself
        # replaced by a newer leader, both at a 150 ms election timeout): leadership may still
        # move past a stall longer than 3 s, which is not what this test is about. A proposal
        # refused before the log or dropped as replaced never commits, so asking the leader of
        # now again keeps "exactly one big entry" true.
        for _attempt in range(5):
            try:
                big = await leader.propose(b"y" * PROPOSAL_BYTES_MAX, timeout_ms=30_000)
                break
            except (ProposalDroppedError, NotLeaderError):
                leader = await leader_of(nodes)
        else:
            pytest.fail("the big proposal was dropped by five leadership changes in a row")
        leader = await leader_of(nodes)
        small = await leader.propose(b"z", timeout_ms=30_000)
        # Not necessarily adjacent: an idle tick entry may land between them while the big one
        # replicates (the leader stamps one every idle_safe_time_interval_ms).
        assert small.index > big.index
        applied = sm(leader).applied
        assert applied[-1] == b"z"
        assert [len(a) for a in applied].count(PROPOSAL_BYTES_MAX) == 1


@pytest.mark.parametrize(
    ("node_id", "address"),
    [
        (4, ("", 7000)),
        (4, ("host name", 7000)),
        (4, ("h\x00", 7000)),
        (4, ("h" * 254, 7000)),
        (4, ("127.0.0.1", 0)),
        (4, ("127.0.0.1", 65536)),
        (0, ("127.0.0.1", 7000)),
    ],
)
async def test_an_unusable_node_address_is_refused_before_the_log(
    tmp_path: Path, node_id: int, address: tuple[str, int]
) -> None:
    """A configuration entry carrying an address no transport accepts used to crash every node
    that applied or replayed it."""
    async with cluster(tmp_path, 1) as nodes:
        leader = await leader_of(nodes)
        before = leader.status().core.last_index
        with pytest.raises(ConfChangeError):
            await leader.add_node(node_id, address)
        assert leader.status().core.last_index == before
        assert (await leader.propose(b"still fine")).index == before + 1


async def test_a_learner_is_promoted_only_once_it_has_caught_up(tmp_path: Path) -> None:
    """Promoting a learner that holds nothing yet would make a voter that cannot help any
    quorum (with 2 voters, the leader would stall until it caught up). Refused until then."""
    async with cluster(tmp_path, 1) as nodes:
        leader = await leader_of(nodes)
        for i in range(200):
            await leader.propose(b"x%d" % i)
        address = ("127.0.0.1", free_ports(1)[0])
        await leader.add_node(4, address, learner=True)
        with pytest.raises(LearnerBehindError, match="has not caught up") as refused:
            await leader.promote_node(4)
        assert refused.value.node_id == 4 and refused.value.match == 0
        assert refused.value.commit == leader.status().core.commit_index
        assert leader.status().core.conf.voters == (1,)
        learner = joining_node(tmp_path, 4, address, leader.addresses)
        await learner.start()
        try:
            deadline = time.monotonic() + ELECTION_WAIT_S
            core = leader.core
            assert core is not None
            # Caught up as the leader sees it: its acks reached the leader.
            while sm(learner).applied != sm(leader).applied or (
                core.progress[4].match < core.log.committed
            ):
                assert time.monotonic() < deadline, "the learner did not catch up"
                await asyncio.sleep(0.01)
            await leader.promote_node(4)
            assert leader.status().core.conf.voters == (1, 4)
            assert (await leader.propose(b"with two voters")).index > 0
        finally:
            await learner.stop()


async def test_a_lone_voter_adds_a_second_voter_directly(tmp_path: Path) -> None:
    """1 -> 2 voters without a learner step: the change is in force from its append, so it
    commits only with the newcomer's ack, and the leader must reach the newcomer before the
    change commits (its address comes from the appended entry, not the applied one)."""
    async with cluster(tmp_path, 1) as nodes:
        leader = await leader_of(nodes)
        await leader.propose(b"before")
        address = ("127.0.0.1", free_ports(1)[0])
        joiner = joining_node(tmp_path, 2, address, leader.addresses)
        await joiner.start()
        try:
            await leader.add_node(2, address, learner=False, timeout_ms=5_000)
            assert leader.status().core.conf.voters == (1, 2)
            await leader.propose(b"after")
            deadline = time.monotonic() + ELECTION_WAIT_S
            while sm(joiner).applied != [b"before", b"after"]:
                assert time.monotonic() < deadline, sm(joiner).applied
                await asyncio.sleep(0.01)
        finally:
            await joiner.stop()


async def test_leaders_remove_themselves_down_to_one_voter(tmp_path: Path) -> None:
    """3 -> 2 -> 1 voters, each time removing the leader: leadership moves to a remaining
    voter and the last voter alone commits."""
    async with cluster(tmp_path, 3) as nodes:
        live = dict(nodes)
        for _ in range(2):
            leader = await leader_of(live)
            await leader.propose(b"led by %d" % leader.node_id)
            await leader.remove_node(leader.node_id, timeout_ms=5_000)
            del live[leader.node_id]
            new_leader = await leader_of(live)
            assert leader.node_id not in new_leader.status().core.conf.voters
            await leader.stop()
        last = await leader_of(live)
        assert last.status().core.conf.voters == (last.node_id,)
        result = await last.propose(b"alone")
        assert sm(last).applied[-1] == b"alone" and result.index > 0


async def test_a_removed_follower_learns_that_its_removal_committed(tmp_path: Path) -> None:
    """The leader's commit broadcast for a removal reaches the removed follower before applying
    the change drops its link: the follower then applies its removal and stops campaigning
    (else it holds the change uncommitted and campaigns with pre-votes forever)."""
    async with cluster(tmp_path, 3) as nodes:
        leader = await leader_of(nodes)
        await leader.propose(b"x")
        victim = next(n for n in nodes.values() if n is not leader)
        # The victim holds everything, so the commit broadcast carries no entries.
        deadline = time.monotonic() + ELECTION_WAIT_S
        while victim.status().core.last_index < leader.status().core.last_index:
            assert time.monotonic() < deadline, "the follower did not catch up"
            await asyncio.sleep(0.01)
        index = await leader.remove_node(victim.node_id)
        # "Never" is the bug (it then waits for ever); a loaded machine may take a while.
        deadline = time.monotonic() + 5.0
        while victim.status().core.commit_index < index:
            assert time.monotonic() < deadline, (
                f"removed follower never learned that its removal (index {index}) committed: "
                f"{victim.status().core}"
            )
            await asyncio.sleep(0.01)
        assert victim.core is not None and not victim.core.promotable()

        # Nothing will ever answer it again (its peers drop it): once it has heard from no one
        # for a while, it stops dialling them, instead of reconnecting (and logging a
        # refusal on both sides) every couple of seconds for ever.
        assert victim.transport is not None
        deadline = time.monotonic() + 5.0
        while victim.transport.stats()["dialling"]:
            assert time.monotonic() < deadline, victim.transport.stats()["peers"]
            await asyncio.sleep(0.05)
        assert not any(p["connected"] for p in victim.transport.stats()["peers"].values())
        # The remaining members are unaffected.
        await leader.propose(b"after the removal")


async def test_proposal_times_out_without_a_quorum_and_the_node_keeps_working(
    tmp_path: Path,
) -> None:
    # A long election timeout: the leader must still lead (check-quorum has not yet made it
    # step down) when the proposal goes in.
    async with cluster(tmp_path, 3, election_timeout_ms=1500) as nodes:
        leader = await leader_of(nodes)
        await leader.propose(b"before")
        for n in nodes.values():
            if n is not leader:
                await n.stop()
        started = time.monotonic()
        with pytest.raises(ProposalTimeoutError, match="within 200 ms"):
            await leader.propose(b"stuck", timeout_ms=200)
        waited = time.monotonic() - started
        assert 0.19 <= waited < 2.0
        assert b"stuck" not in sm(leader).applied


async def test_a_cancelled_caller_does_not_disturb_other_proposals(tmp_path: Path) -> None:
    async with cluster(tmp_path, 1) as nodes:
        leader = await leader_of(nodes)
        cancelled = asyncio.ensure_future(leader.propose(b"cancelled"))
        kept = asyncio.ensure_future(leader.propose(b"kept"))
        cancelled.cancel()
        result = await kept
        assert result.result >= 1
        assert b"kept" in sm(leader).applied
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        # The timer of a finished proposal is cancelled: nothing fires later. (A 1 s timeout,
        # not 50 ms: a loaded machine's fsync alone can take that; then wait past it.)
        await leader.propose(b"after", timeout_ms=1_000)
        await asyncio.sleep(1.1)
        assert sm(leader).applied[-1] == b"after"


async def test_a_lone_proposer_pays_one_fsync_per_proposal(tmp_path: Path) -> None:
    # Entry write, then the commit: the commit-only hard state is written without a sync and
    # the entry is applied as soon as its commit is known.
    async with cluster(tmp_path, 1) as nodes:
        leader = await leader_of(nodes)
        await leader.propose(b"warm-up")
        wal = leader.wal
        assert wal is not None
        before = wal.stats().fsyncs
        for i in range(20):
            await leader.propose(b"x%d" % i)
        assert wal.stats().fsyncs - before <= 20 + 2  # + idle TICK entries, if any


@pytest.mark.parametrize("persist_inline", [True, False])
async def test_a_follower_acks_entries_only_once_its_wal_append_returned(
    tmp_path: Path, persist_inline: bool
) -> None:
    # Lone proposals (small Readies: persisted on the loop thread) and a burst (larger ones:
    # the WAL thread); with persist_inline=False always the WAL thread. Either way an ack
    # may only leave after the append that makes its entries durable has returned.
    async with cluster(tmp_path, 3, persist_inline=persist_inline) as nodes:
        leader = await leader_of(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        wal, transport = follower.wal, follower.transport
        assert wal is not None and transport is not None
        # Entries up to the leader's last index now may be on their way through the follower's
        # WAL thread with the unwrapped append (the leader's first entry, an idle TICK): only
        # entries appended after the wrapping below are checked. No await from here to it, so
        # the leader (on this loop) appends nothing in between.
        wrapped_after = leader.status().core.last_index
        durable = [wal.stats().last_index]
        acked: list[int] = []
        real_append, real_send = wal.append, transport.send

        def append(entries: Sequence[Entry], hard_state: HardState | None) -> None:
            real_append(entries, hard_state)
            if entries:
                durable.append(entries[-1].index)

        def send(m: Message) -> None:
            if isinstance(m, AppendResponse) and not m.reject and m.index > wrapped_after:
                assert m.index <= durable[-1], (m.index, durable[-1])
                acked.append(m.index)
            real_send(m)

        wal.append = append  # type: ignore[method-assign]
        transport.send = send  # type: ignore[method-assign]
        for i in range(20):
            await leader.propose(b"lone%d" % i)
        results = await asyncio.gather(*(leader.propose(b"burst%d" % i) for i in range(300)))
        deadline = time.monotonic() + ELECTION_WAIT_S
        while sm(follower).applied != sm(leader).applied:
            assert time.monotonic() < deadline, "the follower did not catch up"
            await asyncio.sleep(0.01)
        assert acked and max(acked) >= results[-1].index


async def test_a_lone_proposers_commit_rides_on_its_next_append(tmp_path: Path) -> None:
    # The commit broadcast (an AppendEntries without entries) is held back one loop pass: a
    # proposer that proposes again makes the next AppendEntries carry the commit, so a follower
    # gets one message per proposal, not two. The last commit must still reach the follower
    # from a deferred broadcast (an AppendEntries), not wait for a heartbeat: the follower's
    # core records which message moved its commit (a wall-clock bound on the wait could not
    # tell the two apart on a loaded machine, where a heartbeat may well come first).
    async with cluster(tmp_path, 3, election_timeout_ms=3000, heartbeat_interval_ms=2000) as n:
        leader = await leader_of(n)
        await leader.propose(b"warm-up")
        follower = next(f for f in n.values() if f is not leader)
        assert follower.transport is not None and follower.core is not None
        core = follower.core
        step = core.step
        commit_moved_by: list[tuple[int, type]] = []  # (commit after, message type)

        def recording_step(m: Message) -> None:
            committed = core.log.committed
            step(m)
            if core.log.committed > committed:
                commit_moved_by.append((core.log.committed, type(m)))

        core.step = recording_step  # type: ignore[method-assign]
        before = follower.transport.stats()["peers"][leader.node_id]["received"]
        for i in range(30):
            last = await leader.propose(b"x%d" % i)
        received = follower.transport.stats()["peers"][leader.node_id]["received"] - before
        assert received <= 30 + 5, received  # + a heartbeat or two
        deadline = time.monotonic() + ELECTION_WAIT_S  # the failure mode is "never"
        while sm(follower).applied != sm(leader).applied:
            assert time.monotonic() < deadline, "the last commit did not reach the follower"
            await asyncio.sleep(0.005)
        moved_by = next(kind for commit, kind in commit_moved_by if commit >= last.index)
        assert moved_by is AppendEntries, commit_moved_by


async def test_an_answered_proposer_sees_safe_time_at_its_entry(tmp_path: Path) -> None:
    # Entries may be applied before the Ready that commits them is persisted; safe time and
    # the read barrier must already reflect them when the proposer hears back.
    async with cluster(tmp_path, 3) as nodes:
        leader = await leader_of(nodes)
        for i in range(30):
            r = await leader.propose(b"s%d" % i)
            assert leader.safe_time >= r.tm
            assert await leader.wait_for_safe_time(r.tm, timeout_ms=1) == 0.0
            assert leader.status().safe_time >= r.tm
        assert await leader.read_barrier() >= r.index


async def test_safe_time_waits_that_timed_out_do_not_fill_the_waiter_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose safe time is stuck (cut off from its leader, still ready) answers every
    read that waits with a timeout; those waits must not count against the bound on parked
    waiters forever. They did (a timed-out waiter stayed in the heap until safe time passed
    it), so once SAFE_TIME_WAITERS_MAX timeouts had piled up every later read on that node
    failed with QueueFullError: an untyped INTERNAL error, not the retryable TIMEOUT."""
    monkeypatch.setattr(raft.node, "SAFE_TIME_WAITERS_MAX", 4)
    async with cluster(tmp_path, 1) as nodes:
        node = await leader_of(nodes)
        never = node.safe_time + (3_600_000 << 16)  # an hour ahead: not reached in this test
        for _ in range(12):
            with pytest.raises(SafeTimeTimeoutError):
                await node.wait_for_safe_time(never, timeout_ms=1)
        # Live waiters still count: the bound holds for waits that are really parked.
        parked = [
            asyncio.ensure_future(node.wait_for_safe_time(never, timeout_ms=5_000))
            for _ in range(4)
        ]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFullError):
            await node.wait_for_safe_time(never, timeout_ms=1)
        for f in parked:
            f.cancel()
        await asyncio.gather(*parked, return_exceptions=True)


async def test_safe_time_waits_whose_caller_was_cancelled_do_not_fill_the_waiter_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server cancels a request's task when its client disconnects (a client timeout, a
    killed job). A waiter cancelled that way stayed in the heap, not done, so the purge kept
    it: on a node whose safe time is stuck, enough disconnecting readers filled the bound and
    every later read failed with QueueFullError (INTERNAL) instead of waiting."""
    monkeypatch.setattr(raft.node, "SAFE_TIME_WAITERS_MAX", 4)
    async with cluster(tmp_path, 1) as nodes:
        node = await leader_of(nodes)
        never = node.safe_time + (3_600_000 << 16)  # an hour ahead: not reached in this test
        for _ in range(12):
            waiter = asyncio.ensure_future(node.wait_for_safe_time(never, timeout_ms=5_000))
            await asyncio.sleep(0)
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
        with pytest.raises(SafeTimeTimeoutError):
            await node.wait_for_safe_time(never, timeout_ms=1)


def _entries(first: int, last: int, conf_at: int = 0) -> tuple[Entry, ...]:
    return tuple(
        Entry(
            term=1,
            index=i,
            tm=i,
            kind=EntryKind.CONF if i == conf_at else EntryKind.NORMAL,
            data=b"",
        )
        for i in range(first, last + 1)
    )


@pytest.mark.parametrize(
    ("committed", "stable_index", "snapshot", "expected"),
    [
        (_entries(3, 7), 7, False, 5),  # all durable already: a leader's usual case
        (_entries(3, 7), 5, False, 3),  # 6 and 7 arrive in this very Ready (a follower)
        (_entries(3, 7), 2, False, 0),
        (_entries(3, 7, conf_at=5), 7, False, 2),  # stop before a membership change
        (_entries(3, 7), 7, True, 0),  # a snapshot is installed first
        ((), 7, False, 0),
    ],
)
def test_applicable_before_persist(
    committed: tuple[Entry, ...], stable_index: int, snapshot: bool, expected: int
) -> None:
    snap = (
        Snapshot(meta=SnapshotMeta(index=2, term=1, tm=2, conf=ConfState(voters=(1,))))
        if snapshot
        else None
    )
    rd = Ready(committed=committed, entries=_entries(6, 8), snapshot=snap)
    assert applicable_before_persist(rd, stable_index) == expected


def test_only_small_appends_are_persisted_on_the_loop_thread(tmp_path: Path) -> None:
    """A large entry (a commit of 10k files is megabytes) goes to the WAL thread even on an
    idle node: written on the loop thread it held the loop long enough to delay heartbeats,
    and the leader lost its leadership under the largest commit."""
    node = joining_node(tmp_path, 1, ("127.0.0.1", free_ports(1)[0]), {})

    def entry(size: int) -> Entry:
        return Entry(term=1, index=1, tm=1, kind=EntryKind.NORMAL, data=b"x" * size)

    assert node._persist_inline(Ready(entries=(entry(100),)))
    assert not node._persist_inline(Ready(entries=(entry(PERSIST_INLINE_BYTES_MAX + 1),)))


def test_messages_are_stepped_before_ticks_that_piled_up(tmp_path: Path) -> None:
    """Ticks that piled up while the driver waited for an fsync used to be stepped first: a
    leader could fail check-quorum, or a follower start an election, with the acks and
    heartbeats that prove otherwise already in its inbox. The driver steps the inbox first."""
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path / "n1",
            listen_host="127.0.0.1",
            listen_port=free_ports(1)[0],
            peers={},
            secret=SECRET,
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
    )
    calls: list[str] = []

    class RecordingCore:
        def tick(self, now: int) -> None:
            calls.append("tick")

        def step(self, m: object) -> None:
            calls.append("step")

        def is_leader(self) -> bool:
            return False

    node.core = RecordingCore()  # type: ignore[assignment]
    node._ticks_due = 3
    node._inbox = [
        Heartbeat(src=2, dst=1, term=1, commit=0),
        Heartbeat(src=3, dst=1, term=1, commit=0),
    ]
    node._step_inputs()
    assert calls == ["step", "step", "tick", "tick", "tick"]


async def test_a_membership_change_replies_only_once_a_new_majority_holds_it(
    tmp_path: Path,
) -> None:
    """Adding a voter while one of three is down: the change is in force from its append, so
    it needs three of the four new voters and only two are up. The call must not report
    success (it used to, once the old majority had committed and the leader applied it)."""
    async with cluster(tmp_path, 3) as nodes:
        leader = await leader_of(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        await follower.stop()
        nowhere = ("127.0.0.1", free_ports(1)[0])
        # Two of the four voters are up, so it never commits: the call times out (the leader
        # may also step down meanwhile, check-quorum), and never reports success.
        with pytest.raises(ProposalTimeoutError, match="not applied within"):
            await leader.add_node(4, nowhere, learner=False, timeout_ms=2_000)
        # The change is in the leader's log and counts there, but it did not commit:
        assert leader.status().core.commit_index < leader.status().core.last_index
        assert 4 in leader.status().core.conf.voters


async def test_a_slow_snapshot_write_does_not_stall_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing a large state's snapshot file takes seconds. The driver goes on meanwhile:
    proposals commit and the leader keeps its leadership (election timeout 150 ms) while every
    node's file is still being written; then the snapshots are committed to the WAL."""
    real = WriteAheadLog.prepare_snapshot
    started, finished = threading.Event(), threading.Event()

    def slow(self: WriteAheadLog, snapshot: Snapshot, **kw: Any) -> Any:
        started.set()
        time.sleep(SLOW_SNAPSHOT_WRITE_S)
        try:
            return real(self, snapshot, **kw)
        finally:
            finished.set()

    monkeypatch.setattr(WriteAheadLog, "prepare_snapshot", slow)
    async with cluster(tmp_path, 3, snapshot_every_entries=50, snapshot_keep_entries=0) as nodes:
        leader = await leader_of(nodes)
        term = leader.status().core.term
        for i in range(60):
            await leader.propose(b"x%d" % i)
        assert await asyncio.to_thread(started.wait, 5), "no snapshot was taken"
        for i in range(20):
            await leader.propose(b"y%d" % i)
        assert not finished.is_set(), "the proposals waited for the snapshot file"
        assert leader.is_leader() and leader.status().core.term == term
        deadline = time.monotonic() + SLOW_SNAPSHOT_WRITE_S + ELECTION_WAIT_S
        while time.monotonic() < deadline:
            if all(n.status().core.snapshot_index > 0 for n in nodes.values()):
                break
            await asyncio.sleep(0.05)
        assert all(n.status().core.snapshot_index > 0 for n in nodes.values())
        assert leader.status().core.term == term


@pytest.mark.parametrize(
    "newcomer",
    [
        ["127.0.0.1", 0],  # port 0: not dialable
        "127.0.0.1:7009",  # not (host, port)
        None,  # the whole book is not a map
    ],
    ids=["bad-port", "bad-shape", "not-a-map"],
)
async def test_a_committed_membership_entry_with_an_unusable_address_book_does_not_stop_the_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, newcomer: object
) -> None:
    """Such an entry is in a log written before the wire decoder refused it. It used to stop
    the node on append and apply, and at every restart (a crash loop). Now its membership
    counts as on every node, the member it adds stays without an address here, and the node
    says so loudly and goes on."""
    (port,) = free_ports(1)
    me = ("127.0.0.1", port)
    book = b"\x01" if newcomer is None else msgpack.packb({"1": list(me), "9": newcomer})
    conf = encode_conf(ConfState(voters=(1,), learners=(9,)), context=book)
    entries = [
        Entry(term=1, index=1, tm=1, data=b"before"),
        Entry(term=1, index=2, tm=2, kind=EntryKind.CONF, data=conf),
    ]
    wal, _ = WriteAheadLog.open(tmp_path / "wal", fsync=False)
    wal.append(entries, HardState(term=1, vote=1, commit=2))
    wal.close()
    (tmp_path / raft.node.IDENTITY_FILE).write_text(
        json.dumps({"cluster_id": "test", "node_id": 1})
    )
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path,
            listen_host="127.0.0.1",
            listen_port=port,
            peers={1: me},
            secret=SECRET,
            fsync=False,
            new_member=False,
            election_timeout_ms=150,
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
    )
    with caplog.at_level(logging.ERROR, logger="raft.node"):
        await node.start()
        try:
            await leader_of({1: node})
            result = await node.propose(b"after")
            assert result.index > 2
            assert node.status().core.conf.learners == (9,)
            assert 9 not in node.addresses
            assert node.unusable_address_books >= 1
            assert not node.stopped_reason
        finally:
            await node.stop()
    assert any("membership entry 2" in r.getMessage() for r in caplog.records)


async def test_a_snapshot_carries_the_address_book_of_its_own_index(tmp_path: Path) -> None:
    """A CONF entry appended after the snapshot's index (not applied, maybe never committed)
    brings its new member's address into the node's book at once, but not into a snapshot
    of an earlier index: restoring that snapshot would put a node that may never become a
    member into the applied book (dialled until some later CONF entry is applied)."""
    me, newcomer = ("127.0.0.1", 7001), ("127.0.0.1", 7009)
    # A CONF entry's context: the new membership's address book (as RaftNode writes it).
    book = msgpack.packb({"1": list(me), "9": list(newcomer)})
    pending = encode_conf(ConfState(voters=(1,), learners=(9,)), context=book)
    entries = [Entry(term=1, index=i, tm=i, data=b"x%d" % i) for i in (1, 2, 3)]
    entries.append(Entry(term=1, index=4, tm=4, kind=EntryKind.CONF, data=pending))
    hard_state = HardState(term=1, vote=1, commit=3)
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path,
            listen_host="127.0.0.1",
            listen_port=me[1],
            peers={1: me},
            secret=SECRET,
            fsync=False,
            snapshot_every_entries=3,
            snapshot_keep_entries=0,
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
    )
    wal, _ = WriteAheadLog.open(tmp_path / "wal", fsync=False)
    try:
        wal.append(entries, hard_state)
        core = RaftCore(
            CoreConfig(node_id=1),
            hard_state=hard_state,
            snapshot=Snapshot(),
            entries=entries,
            bootstrap_conf=ConfState(voters=(1,)),
            rng=random.Random(1),
        )
        node.core, node.wal = core, wal
        node._note_appended_confs(entries)
        assert 9 in node.addresses  # reachable before its change commits
        rd = core.ready()
        assert [e.index for e in rd.committed] == [1, 2, 3]
        node._apply(rd.committed)
        core.advance(rd)
        await node._maybe_snapshot(core)
        task = node._snapshot_task
        assert task is not None
        await task
        await node._maybe_snapshot(core)  # commits the written file
        assert core.snapshot.meta.index == 3
        _, snapshot_book = unwrap_snapshot_data(core.snapshot.data)
        assert snapshot_book == {1: me}
    finally:
        wal.close()
        node._io.shutdown(wait=True)


async def test_a_membership_change_whose_address_book_peers_would_refuse_is_not_proposed(
    tmp_path: Path,
) -> None:
    """A leader checked only the address of the node it adds; the others come from its own
    book (its config for itself). An entry whose book the followers' wire decoder refuses
    would hold back every append from it on, so the whole book is checked first."""
    (port, other) = free_ports(2)
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path,
            listen_host="127.0.0.1",
            listen_port=port,
            peers={1: ("not a host", port)},  # never dialled: it is this node's own
            secret=SECRET,
            fsync=False,
            election_timeout_ms=150,
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
    )
    await node.start()
    try:
        await leader_of({1: node})
        with pytest.raises(ConfChangeError, match="node 1: expected a host"):
            await node.add_node(2, ("127.0.0.1", other))
        assert node.status().core.conf.learners == ()
    finally:
        await node.stop()


async def test_the_inbox_is_bounded_and_drops_replication_traffic_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Peer messages used to pile up in the inbox without a bound while the driver awaited an
    fsync or was blocked. Past INBOX_MESSAGES_MAX the replication stream is dropped (as lost
    on the network) and counted; votes, TimeoutNow and snapshots keep a reserve; entry bytes
    are bounded too, but a first message is always taken."""
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path,
            listen_host="127.0.0.1",
            listen_port=7001,
            peers={1: ("127.0.0.1", 7001), 2: ("127.0.0.1", 7002)},
            secret=SECRET,
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
    )
    try:
        big = Entry(term=1, index=1, tm=1, data=b"x" * (raft.node.INBOX_ENTRY_BYTES_MAX // 2 - 64))
        for _ in range(3):  # the first always, the second within the bytes, the third not
            node._on_message(
                AppendEntries(
                    src=2, dst=1, term=1, prev_index=0, prev_term=0, entries=(big,), commit=0
                )
            )
        assert (len(node._inbox), node.inbox_dropped) == (2, 1)
        with caplog.at_level(logging.WARNING, logger="raft.node"):
            for _ in range(raft.node.INBOX_MESSAGES_MAX + 5):
                node._on_message(Heartbeat(src=2, dst=1, term=1, commit=0))
        assert len(node._inbox) == raft.node.INBOX_MESSAGES_MAX
        assert node.inbox_dropped == 1 + 7
        drops = [r for r in caplog.records if "dropped a Heartbeat" in r.getMessage()]
        assert 1 <= len(drops) <= raft.node.INBOX_WARNINGS_BURST
        # Still taken: a vote (the node may refuse votes just after its start: a forced one)
        # and a snapshot.
        vote = RequestVote(src=2, dst=1, term=2, last_index=0, last_term=0, force=True)
        snap = InstallSnapshot(
            src=2,
            dst=1,
            term=2,
            snapshot=Snapshot(meta=SnapshotMeta(index=1, term=1, tm=1, conf=ConfState())),
        )
        node._on_message(vote)
        node._on_message(snap)
        assert node._inbox[-2:] == [vote, snap]
        assert node.inbox_dropped == 8
        # ... but a snapshot's bytes on the heap count against the bytes bound.
        node._on_message(
            dataclasses.replace(snap, snapshot=Snapshot(meta=snap.snapshot.meta, data=b"x" * 1024))
        )
        assert node.inbox_dropped == 9
    finally:
        node._io.shutdown(wait=True)


def snapshot_indexes(directory: Path) -> list[int]:
    return sorted(int(p.name[len("snap-") :].split(".")[0], 16) for p in directory.glob("*.snap"))


async def _eventually(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


@pytest.mark.parametrize("held", ["before-writing", "after-writing"])
async def test_a_snapshot_from_the_leader_overtakes_one_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    """A follower's own snapshot file is still being written (held before or after the write)
    when the leader's newer snapshot is installed: the follower's file is dropped, never
    committed over the newer snapshot, and the follower goes on from the leader's."""
    real_prepare, real_on_message = WriteAheadLog.prepare_snapshot, RaftNode._on_message
    slow: dict[str, Any] = {"id": 0, "cut": False}
    started, release = threading.Event(), threading.Event()

    def held_prepare(self: WriteAheadLog, snapshot: Snapshot, **kw: Any) -> Any:
        if self._dir != tmp_path / f"n{slow['id']}" / "wal":
            return real_prepare(self, snapshot, **kw)
        if held == "before-writing":
            started.set()
            release.wait(30)
            return real_prepare(self, snapshot, **kw)
        prepared = real_prepare(self, snapshot, **kw)
        started.set()
        release.wait(30)
        return prepared

    def on_message(self: RaftNode, m: Message) -> None:
        if not (slow["cut"] and self.node_id == slow["id"]):
            real_on_message(self, m)

    monkeypatch.setattr(WriteAheadLog, "prepare_snapshot", held_prepare)
    monkeypatch.setattr(RaftNode, "_on_message", on_message)
    try:
        async with cluster(
            tmp_path, 3, snapshot_every_entries=50, snapshot_keep_entries=0
        ) as nodes:
            leader = await leader_of(nodes)
            follower = next(n for n in nodes.values() if n is not leader)
            slow["id"] = follower.node_id
            for i in range(55):
                await leader.propose(b"x%d" % i)
            assert await asyncio.to_thread(started.wait, 5), "the follower took no snapshot"
            slow["cut"] = True  # it hears nothing while the leader compacts past it
            for i in range(110):
                await leader.propose(b"y%d" % i)
            assert await _eventually(lambda: leader.status().core.snapshot_index >= 100, 10)
            leader_snapshot = leader.status().core.snapshot_index
            slow["cut"] = False
            assert await _eventually(
                lambda: follower.status().core.snapshot_index >= leader_snapshot, 10
            ), "the leader's snapshot was not installed"
            assert follower._snapshot_task is not None  # its own is still being written
            release.set()
            assert await _eventually(lambda: follower._snapshot_task is None, 10)
            assert follower.stopped_reason == ""
            # Its own snapshot's file was dropped, not renamed in beside the leader's.
            assert snapshot_indexes(tmp_path / f"n{slow['id']}" / "wal") == [leader_snapshot]
            assert follower.status().core.snapshot_index >= leader_snapshot
            for i in range(10):
                await leader.propose(b"z%d" % i)
            commit = leader.status().core.commit_index
            assert await _eventually(lambda: follower.status().core.applied_index >= commit, 10)
    finally:
        release.set()
    directory = tmp_path / f"n{slow['id']}" / "wal"
    wal, state = WriteAheadLog.open(directory, fsync=False)
    wal.close()
    assert state.snapshot.meta.index >= leader_snapshot
    assert min(snapshot_indexes(directory)) >= leader_snapshot
    assert not list(directory.glob("*.tmp"))


def spool_maps() -> list[str]:
    """This process's maps of snapshot-spool files (deleted once a transfer completes: a map
    left keeps the file's disk space, invisible to `du`, until it goes)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return [line for line in maps if "snapshot-spool" in line]


def _spooled_snapshots_and_a_deaf_node(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Snapshots of three chunks' worth of state (a transfer is spooled: SNAPSHOT_CHUNK_BYTES
    is 1 MiB), and a switch: the node whose id is put in `cut["id"]` hears nothing (0: all
    hear)."""
    real_on_message = RaftNode._on_message
    cut = {"id": 0}
    monkeypatch.setattr(ListStateMachine, "snapshot", lambda self: b"s" * (3 * 1024 * 1024))

    def on_message(self: RaftNode, m: Message) -> None:
        if self.node_id != cut["id"]:
            real_on_message(self, m)

    monkeypatch.setattr(RaftNode, "_on_message", on_message)
    return cut


async def test_an_installed_snapshot_does_not_keep_its_spool_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot larger than a chunk reaches a lagging follower through a spool file, which
    the transport maps and deletes; once the log has written the snapshot to its own file,
    the core must hold that copy. It held the received one, the spool's map, until the
    follower's next snapshot: a second copy of the whole state on disk, for thousands of
    entries."""
    cut = _spooled_snapshots_and_a_deaf_node(monkeypatch)
    async with cluster(tmp_path, 3, snapshot_every_entries=50, snapshot_keep_entries=0) as nodes:
        leader = await leader_of(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        cut["id"] = follower.node_id  # it hears nothing while the leader compacts past it
        for i in range(60):
            await leader.propose(b"x%d" % i)
        assert await _eventually(lambda: leader.status().core.snapshot_index >= 50, 10)
        leader_snapshot = leader.status().core.snapshot_index
        cut["id"] = 0
        assert await _eventually(
            lambda: follower.status().core.snapshot_index >= leader_snapshot, 10
        ), "the leader's snapshot was not installed"
        assert follower.transport is not None
        received = follower.transport.stats()["peers"][leader.node_id]
        assert received["snapshot_transfers_received"] == 1  # it came in chunks, spooled
        assert await _eventually(lambda: not spool_maps(), 3), spool_maps()
        assert follower.stopped_reason == ""


async def test_a_deposed_leader_stops_sending_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a leader sends snapshots: once deposed, a transfer it had under way is stale (the
    new leader sends its own, and the follower refuses the old term's). It went on to its
    end, up to 1 GiB competing with the new leader's transfer on the follower's link and
    disk; now the node gives it up when it stops leading."""
    cut = _spooled_snapshots_and_a_deaf_node(monkeypatch)
    async with cluster(tmp_path, 3, snapshot_every_entries=50, snapshot_keep_entries=0) as nodes:
        leader = await leader_of(nodes)
        follower, third = (n for n in nodes.values() if n is not leader)
        assert follower.transport is not None and leader.transport is not None
        # The follower's transport takes no chunk: the transfer stays under way.
        monkeypatch.setattr(follower.transport, "_on_chunk", lambda link, obj: None)
        cut["id"] = follower.node_id
        for i in range(60):
            await leader.propose(b"x%d" % i)
        assert await _eventually(lambda: leader.status().core.snapshot_index >= 50, 10)
        cut["id"] = 0

        def pending() -> int:
            assert leader.transport is not None
            peers = leader.transport.stats()["peers"]
            return int(peers[follower.node_id]["snapshot_transfer_bytes"])

        assert await _eventually(lambda: pending() > 0, 10), "no transfer started"
        await leader.transfer_leader(third.node_id)
        assert await _eventually(lambda: third.is_leader(), 10)
        assert await _eventually(lambda: pending() == 0, 3), "the deposed leader still sends"


async def test_stop_waits_for_a_snapshot_file_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() lets the thread writing a snapshot file finish before it closes the log; the
    file, never committed, is a temporary one that the next open deletes, and nothing
    acknowledged is lost."""
    real = WriteAheadLog.prepare_snapshot
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def held_prepare(self: WriteAheadLog, snapshot: Snapshot, **kw: Any) -> Any:
        started.set()
        release.wait(30)
        try:
            return real(self, snapshot, **kw)
        finally:
            finished.set()

    monkeypatch.setattr(WriteAheadLog, "prepare_snapshot", held_prepare)
    try:
        async with cluster(tmp_path, 1, snapshot_every_entries=20) as nodes:
            node = await leader_of(nodes)
            for i in range(25):
                await node.propose(b"x%d" % i)
            assert await asyncio.to_thread(started.wait, 5), "no snapshot was taken"
            stopping = asyncio.create_task(node.stop())
            await asyncio.sleep(0.3)
            assert not stopping.done(), "stop() closed the log under the snapshot's thread"
            release.set()
            await asyncio.wait_for(stopping, 10)
            assert finished.is_set()
    finally:
        release.set()
    directory = tmp_path / "n1" / "wal"
    assert list(directory.glob("*.tmp"))
    wal, state = WriteAheadLog.open(directory, fsync=False)
    wal.close()
    assert not list(directory.glob("*.tmp"))
    assert state.snapshot.is_empty()
    applied = [e.data for e in state.entries if e.kind is EntryKind.NORMAL]
    assert applied == [b"x%d" % i for i in range(25)]


async def test_stop_after_a_fatal_error_still_releases_the_log_and_the_port(
    tmp_path: Path,
) -> None:
    """A fatal error stops the node's work at once; stop() must still close its links and its
    WAL (and the WAL's lock), or an in-process user could never reopen the directory."""
    async with cluster(tmp_path, 1) as nodes:
        node = await leader_of(nodes)
        port = node.config.listen_port

        def broken_apply(entry: Entry) -> Any:
            raise RuntimeError("state machine bug")

        node.sm.apply = broken_apply  # type: ignore[method-assign]
        with pytest.raises(NodeStoppedError):
            await node.propose(b"boom", timeout_ms=5_000)
        assert node.stopped_reason.startswith("fatal: RuntimeError"), node.stopped_reason
        await node.stop()
        wal, _ = WriteAheadLog.open(tmp_path / "n1" / "wal", fsync=False)  # the lock is free
        wal.close()
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        await node.stop()  # again: nothing left to do, no error


async def test_read_barrier_keeps_one_deadline_and_times_out_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for the apply after the ReadIndex got a fresh `timeout_ms` of its own (a call
    could take twice its timeout) and timed out with a plain TimeoutError, not the
    ReadIndexError the first wait raises."""
    async with cluster(tmp_path, 1) as nodes:
        node = await leader_of(nodes)
        run_op = node._run_op

        # The ReadIndex step takes run_op_delay_s of the timeout; one deadline ends the call
        # after timeout_ms, a fresh one after run_op_delay_s + timeout_ms. The bound sits
        # between the two, leaving a loaded machine over a second of scheduling lateness.
        run_op_delay_s, timeout_ms = 1.5, 2_000

        async def slow_run_op(fn: Any) -> Any:
            await asyncio.sleep(run_op_delay_s)
            return await run_op(fn)

        monkeypatch.setattr(node, "_run_op", slow_run_op)
        monkeypatch.setattr(node, "_applied_index", lambda: 0)  # the apply never catches up
        started = time.monotonic()
        with pytest.raises(ReadIndexError):
            await node.read_barrier(timeout_ms=timeout_ms)
        elapsed_s = time.monotonic() - started
        assert elapsed_s < timeout_ms / 1000 + 0.8 * run_op_delay_s, elapsed_s
        monkeypatch.undo()
        assert await node.read_barrier(timeout_ms=5_000) >= 1


async def test_a_read_barrier_whose_caller_went_away_before_the_driver_ran_it_stops_nothing(
    tmp_path: Path,
) -> None:
    """The server cancels a request's task when its client disconnects. A read barrier
    cancelled after it queued its ReadIndex op and before the driver ran it left a cancelled
    future in the op queue, and the driver's `set_result` on it raised InvalidStateError: a
    fatal error, so one client closing its connection at that moment stopped the leader (seen
    in a soak: a leader died within seconds of clients closing after `committed_txn`)."""
    async with cluster(tmp_path, 1) as nodes:
        node = await leader_of(nodes)
        for _ in range(20):
            gone = asyncio.ensure_future(node.read_barrier(timeout_ms=5_000))
            await asyncio.sleep(0)  # its op is queued, the driver is woken
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
        assert await node.read_barrier(timeout_ms=5_000) >= 1
        assert not node.stopped_reason, node.stopped_reason
        assert (await node.propose(b"after")).index >= 1


@pytest.mark.parametrize("by_snapshot", [False, True], ids=["by-entries", "by-snapshot"])
async def test_a_removed_node_that_dropped_its_links_is_added_back_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by_snapshot: bool
) -> None:
    """A removed node that still runs and has dropped its peer links (nothing answered it) is
    added back with the same id and address: it must accept the leader's connection, catch up
    (from entries, or from a snapshot once the leader compacted its log past the removal)
    and, once promoted, count as a voter again. It used to refuse every member's connection
    ("node id N is not one of our peers"): dropping its links had emptied the transport's
    peer set, which is also the set of ids its handshake accepts, so it never heard that it
    was added back and the new learner could never be promoted."""
    monkeypatch.setattr(raft.node, "REMOVED_QUIET_ELECTIONS", 1)
    snapshots = {"snapshot_every_entries": 2, "snapshot_keep_entries": 0} if by_snapshot else {}
    async with cluster(tmp_path, 3, **snapshots) as nodes:
        leader = await leader_of(nodes)
        await leader.propose(b"before")
        victim = next(n for n in nodes.values() if n is not leader)
        vid = victim.node_id
        address = leader.addresses[vid]
        await leader.remove_node(vid, timeout_ms=5_000)
        assert victim.transport is not None
        deadline = time.monotonic() + ELECTION_WAIT_S
        while victim.transport.stats()["dialling"]:
            assert time.monotonic() < deadline, victim.transport.stats()["peers"]
            await asyncio.sleep(0.02)
        for i in range(3):
            await leader.propose(b"while removed %d" % i)

        await leader.add_node(vid, address, timeout_ms=5_000)
        added_back = await leader.propose(b"added back")
        # By index, not by the state machine's list: a snapshot taken after "added back" (one
        # every 2 entries here) restores an empty list, and the victim may catch up by one.
        deadline = time.monotonic() + ELECTION_WAIT_S
        while victim.status().core.applied_index < added_back.index:
            assert time.monotonic() < deadline, (victim.status().core, victim.transport.stats())
            await asyncio.sleep(0.02)
        if not by_snapshot:
            assert sm(victim).applied[-1] == b"added back"
        # Restoring a snapshot empties this state machine: what it missed came either way.
        assert (b"while removed 0" in sm(victim).applied) is not by_snapshot
        await leader.promote_node(vid, timeout_ms=5_000)
        assert vid in leader.status().core.conf.voters
        # It counts: with the other follower stopped, the leader commits only with its ack.
        other = next(n for n in nodes.values() if n not in (leader, victim))
        await other.stop()
        result = await leader.propose(b"a voter again", timeout_ms=3_000)
        assert result.index > 0


async def test_an_append_no_leader_sends_is_dropped_and_the_node_keeps_running(
    tmp_path: Path,
) -> None:
    """An authenticated peer's AppendEntries whose entries do not continue the log at its
    prev_index (here a gap) used to reach the core, whose log raised RaftInvariantError: the
    node stopped for good. It is refused by the wire decoder (counted as malformed, the
    connection stays) and nothing of it is appended or applied."""
    from tests.raft.test_transport import frame, raw_connect  # the handshake, written out

    port_1, port_2 = free_ports(2)
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test-cluster",  # raw_connect's
            data_dir=tmp_path / "n1",
            listen_host="127.0.0.1",
            listen_port=port_1,
            peers={1: ("127.0.0.1", port_1), 2: ("127.0.0.1", port_2)},
            secret=b"0123456789abcdef0123456789abcdef",  # raw_connect's
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
        rng=random.Random(1),
    )
    await node.start()
    try:
        _reader, writer = await raw_connect(port_1, as_id=2)

        def append(*indexes: int) -> bytes:
            entries = [[5, i, 1000 + i, int(EntryKind.NORMAL), b"e%d" % i] for i in indexes]
            prev = indexes[0] - 1
            return frame([1, 2, 1, 5, prev, 5 if prev else 0, entries, max(indexes)])

        writer.write(frame([1, 2, 1, 5, 0, 0, [[5, 2, 1002, 0, b"gap"]], 2]))
        writer.write(append(1, 2))  # a correct one after it, on the same connection
        async with asyncio.timeout(ELECTION_WAIT_S):
            while sm(node).applied != [b"e1", b"e2"]:  # noqa: ASYNC110 - no event to await
                await asyncio.sleep(0.01)
        assert node.stopped_reason == "", node.stopped_reason
        assert node.status().transport["peers"][2]["malformed"] == 1
        writer.close()
    finally:
        await node.stop()
