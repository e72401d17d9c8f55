"""Storage faults under the node driver, in-process (real WALs with fsync, real loopback links):
a failing fdatasync stops the node (never retried, nothing it could not make durable is
acknowledged), with one clear log line naming the file and the errno, and a restart recovers
from what is durable; a follower whose disk fills while it installs the leader's snapshot
stops the same way and, restarted, installs it again.

Faults are injected per node by path: the node's WAL calls are replaced for the files under
its own data directory only (every node of the test shares the process)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import raft.wal
from hlc import HybridClock, SystemClock
from raft.limits import SNAPSHOT_SAVE_RETRY_MS_MAX
from raft.node import NodeStoppedError, RaftNode
from raft.wal import WriteAheadLog
from tests.raft.test_node import (
    ELECTION_WAIT_S,
    ListStateMachine,
    cluster,
    leader_of,
    sm,
)


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def fail_fdatasync_under(
    monkeypatch: pytest.MonkeyPatch, directory: Path, calls: list[str]
) -> None:
    """Every fdatasync of a file under `directory` fails with EIO (recorded in `calls`)."""
    real = raft.wal._fdatasync

    def fdatasync(fd: int) -> None:
        path = fd_path(fd)
        if path.startswith(str(directory) + os.sep):
            calls.append(path)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(raft.wal, "_fdatasync", fdatasync)


def restarted(node: RaftNode) -> RaftNode:
    """A new node on `node`'s data directory and address (a restart of the process)."""
    return RaftNode(
        node.config,
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
        rng=random.Random(node.node_id + 100),
    )


async def eventually(condition: Callable[[], bool], timeout_s: float = ELECTION_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


async def restart_and_catch_up(
    nodes: dict[int, RaftNode], leader: RaftNode, stopped: RaftNode
) -> RaftNode:
    """Start `stopped` again from its data directory, in its place in `nodes`; once the leader
    committed one more entry, it must apply up to it."""
    again = restarted(stopped)
    await again.start()
    nodes[stopped.node_id] = again
    await leader.propose(b"after")
    commit = leader.status().core.commit_index
    assert await eventually(lambda: again.status().core.applied_index >= commit)
    return again


async def test_a_failed_fdatasync_stops_the_node_and_a_restart_recovers_what_was_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(tmp_path, 1) as nodes:
        node = await leader_of(nodes)
        for i in range(3):
            await node.propose(b"acked-%d" % i)
        calls: list[str] = []
        fail_fdatasync_under(monkeypatch, tmp_path / "n1", calls)
        caplog.set_level(logging.CRITICAL, logger="raft.node")
        with pytest.raises(NodeStoppedError):
            await node.propose(b"never-durable", timeout_ms=5_000)
        assert len(calls) == 1, calls  # not retried
        reason = node.stopped_reason
        assert "fdatasync" in reason and "EIO" in reason, reason
        assert str(tmp_path / "n1" / "wal" / "wal-") in reason, reason
        # One line an operator can act on, not a traceback: the message says it all.
        fatal = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert len(fatal) == 1, fatal
        assert fatal[0].exc_info is None
        assert "fdatasync" in fatal[0].getMessage() and "restart" in fatal[0].getMessage()
        with pytest.raises(NodeStoppedError):
            await node.propose(b"after-the-failure", timeout_ms=1_000)
        await node.stop()
        monkeypatch.undo()
        # A restart of the process (which reads the page cache): the failed append is gone, the
        # acknowledged ones are all there.
        again = restarted(node)
        await again.start()
        nodes[1] = again  # stopped by `cluster`
        await leader_of({1: again})
        await again.propose(b"after-restart")
        assert sm(again).applied == [b"acked-0", b"acked-1", b"acked-2", b"after-restart"]


async def test_a_follower_whose_fdatasync_fails_stops_and_catches_up_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster(tmp_path, 3) as nodes:
        leader = await leader_of(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        await leader.propose(b"before")
        calls: list[str] = []
        fail_fdatasync_under(monkeypatch, tmp_path / f"n{follower.node_id}", calls)
        for i in range(5):  # the other two still form a quorum
            await leader.propose(b"during-%d" % i)
        assert await eventually(lambda: bool(follower.stopped_reason)), "follower kept going"
        assert "fdatasync" in follower.stopped_reason and "EIO" in follower.stopped_reason
        assert len(calls) == 1, calls
        await follower.stop()
        monkeypatch.undo()
        again = await restart_and_catch_up(nodes, leader, follower)
        assert sm(again).applied == sm(leader).applied


async def test_a_follower_whose_disk_fills_during_a_snapshot_install_stops_and_installs_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write_all = raft.wal._write_all
    cut: dict[str, Any] = {"id": 0, "deaf": False, "full": False}
    real_on_message = RaftNode._on_message

    def on_message(self: RaftNode, m: Any) -> None:
        if not (cut["deaf"] and self.node_id == cut["id"]):
            real_on_message(self, m)

    def write_all(fd: int, data: bytes | memoryview) -> None:
        path = fd_path(fd)
        if cut["full"] and f"/n{cut['id']}/wal/snap-" in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    monkeypatch.setattr(RaftNode, "_on_message", on_message)
    monkeypatch.setattr(raft.wal, "_write_all", write_all)
    async with cluster(tmp_path, 3, snapshot_every_entries=20, snapshot_keep_entries=0) as nodes:
        leader = await leader_of(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        cut["id"] = follower.node_id
        await leader.propose(b"before")
        assert await eventually(lambda: follower.status().core.applied_index >= 2)
        cut["deaf"] = True  # it misses what the leader then compacts away
        for i in range(45):
            await leader.propose(b"x%d" % i)
        assert await eventually(lambda: leader.status().core.snapshot_index >= 40)
        cut["full"] = True
        cut["deaf"] = False
        assert await eventually(lambda: bool(follower.stopped_reason)), "follower kept going"
        reason = follower.stopped_reason
        assert "ENOSPC" in reason and "snap-" in reason, reason
        await follower.stop()
        directory = tmp_path / f"n{follower.node_id}" / "wal"
        assert not list(directory.glob("*.tmp"))
        cut["full"] = False
        # Its log is as before the install; restarted, it is sent the snapshot again.
        again = await restart_and_catch_up(nodes, leader, follower)
        assert again.status().core.snapshot_index >= 40
        assert again.stopped_reason == ""
    wal, state = WriteAheadLog.open(directory, fsync=False)
    wal.close()
    assert state.snapshot.meta.index >= 40


async def test_a_node_whose_own_snapshot_cannot_be_written_serves_and_saves_one_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot file the disk cannot hold (ENOSPC while it is written): the log is untouched
    and usable (tests/raft/test_wal_faults.py), so the node goes on serving from it, says why
    (status, a counter) and tries again with backoff; once the disk takes writes again it
    saves one and compacts. (It used to stop, as etcd does, which turned a full disk under an
    optimisation into a lost member.)"""
    real_write_all = raft.wal._write_all

    def write_all(fd: int, data: bytes | memoryview) -> None:
        if "/n1/wal/snap-" in fd_path(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    async with cluster(tmp_path, 1, snapshot_every_entries=10) as nodes:
        node = await leader_of(nodes)
        monkeypatch.setattr(raft.wal, "_write_all", write_all)
        for i in range(30):
            await node.propose(b"e%d" % i, timeout_ms=5_000)
        assert await eventually(lambda: node.snapshot_save_failures >= 1)
        status = node.status()
        assert not status.stopped_reason
        assert "ENOSPC" in status.snapshot_save_error, status.snapshot_save_error
        assert "snap-" in status.snapshot_save_error
        assert status.counters["snapshot_save_failures"] >= 1
        assert status.core.snapshot_index == 0
        assert not list((tmp_path / "n1" / "wal").glob("*.tmp"))
        await node.propose(b"during")
        assert sm(node).applied[-1] == b"during"
        monkeypatch.undo()
        # The next attempt comes after the backoff (SNAPSHOT_SAVE_RETRY_MS_MIN, doubled per
        # failure), at an applied entry: keep proposing until it is saved.
        deadline = time.monotonic() + 3 * ELECTION_WAIT_S
        while node.status().core.snapshot_index == 0 and time.monotonic() < deadline:
            await node.propose(b"more")
            await asyncio.sleep(0.05)
        status = node.status()
        assert status.core.snapshot_index > 0, status.snapshot_save_error
        assert status.snapshot_save_error == ""
        assert not status.stopped_reason
    again = restarted(node)
    await again.start()
    try:
        await leader_of({1: again})
        assert again.status().core.snapshot_index >= status.core.snapshot_index
        await again.propose(b"after")
        assert sm(again).applied[-1] == b"after"
    finally:
        await again.stop()


async def test_a_state_over_the_snapshot_limit_waits_the_longest_backoff_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A state over SNAPSHOT_BYTES_MAX (RecordTooLargeError) stays over it until it shrinks:
    the node retried after SNAPSHOT_SAVE_RETRY_MS_MIN, doubling, so it encoded the whole state
    again some seven times in two minutes for nothing. Now its first failure waits
    SNAPSHOT_SAVE_RETRY_MS_MAX; the node serves on meanwhile."""
    monkeypatch.setattr(raft.wal, "SNAPSHOT_BYTES_MAX", 16)
    async with cluster(tmp_path, 1, snapshot_every_entries=10) as nodes:
        node = await leader_of(nodes)
        with caplog.at_level(logging.ERROR, logger="raft.node"):
            for i in range(30):
                await node.propose(b"e%d" % i, timeout_ms=5_000)
            assert await eventually(lambda: node.snapshot_save_failures >= 1)
            started = time.monotonic()
        assert "over SNAPSHOT_BYTES_MAX" in node.status().snapshot_save_error
        assert node._snapshot_retry_ms == SNAPSHOT_SAVE_RETRY_MS_MAX
        wait_s = node._snapshot_retry_at - started
        assert SNAPSHOT_SAVE_RETRY_MS_MAX / 1000 - 5 < wait_s <= SNAPSHOT_SAVE_RETRY_MS_MAX / 1000
        line = next(
            r.getMessage() for r in caplog.records if "SNAPSHOT_BYTES_MAX" in r.getMessage()
        )
        assert f"tries again in {SNAPSHOT_SAVE_RETRY_MS_MAX} ms" in line, line
        assert "the state must shrink first" in line, line
        # Entries go on applying, each past the snapshot threshold, and start no new attempt.
        for i in range(20):
            await node.propose(b"f%d" % i, timeout_ms=5_000)
        assert sm(node).applied[-1] == b"f19"
        assert node.snapshot_save_failures == 1
        assert not node.status().stopped_reason


async def test_a_failed_directory_sync_after_a_snapshot_rename_still_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the snapshot file is renamed into place, a failed sync of the directory leaves the
    log in doubt (which files are durable?): that is not a skipped optimisation, the node
    stops as for any failed sync of its log."""
    real_fsync_dir = raft.wal._fsync_dir
    failing = False

    def fsync_dir(path: Path) -> None:
        if failing and "/n1/wal" in str(path):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync_dir(path)

    monkeypatch.setattr(raft.wal, "_fsync_dir", fsync_dir)
    async with cluster(tmp_path, 1, snapshot_every_entries=10) as nodes:
        node = await leader_of(nodes)
        failing = True
        for i in range(30):
            try:
                await node.propose(b"e%d" % i, timeout_ms=5_000)
            except NodeStoppedError:
                break
        assert await eventually(lambda: bool(node.stopped_reason))
        assert "EIO" in node.stopped_reason, node.stopped_reason
