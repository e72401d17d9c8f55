"""Snapshot transfers of PeerTransport on 127.0.0.1 with real sockets: an InstallSnapshot larger
than the chunk size travels as chunk frames, resumes after a dropped connection, is replaced by
a newer snapshot, and is dropped (only it) when corrupt. Every wait is bounded.

Most tests shrink the frame limit and the chunk size (SMALL) so that a few MiB make many chunks;
one test runs at the real limits, with a snapshot larger than PEER_FRAME_BYTES_MAX. The raw-socket
tests write chunk frames from the format in `raft.transport`'s docstring, independently.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import uvloop

from raft.core.types import ConfState, Heartbeat, InstallSnapshot, Snapshot, SnapshotMeta
from raft.errors import InvalidLimitError
from raft.filebytes import FileBytes
from raft.framing import FrameDecoder, encode_frame
from raft.limits import PEER_FRAME_BYTES_MAX
from raft.transport import SPOOL_SUFFIX, TAG_SNAPSHOT_CHUNK, PeerTransport
from raft.wire import encode_message
from tests.raft.test_transport import (
    HOST,
    Inbox,
    eventually,
    frame,
    free_port,
    hb,
    make,
    mesh,
    raw_connect,
    running,
)

KIB = 1024
MIB = 1024 * KIB
SMALL: dict[str, Any] = {
    "max_frame_bytes": 64 * KIB,
    "send_queue_bytes_max": 1 * MIB,
    "snapshot_chunk_bytes": 16 * KIB,
    "snapshot_ack_interval_bytes": 64 * KIB,
}
# For transfers that must still be under way when the receiver holds part of them: tens of MiB,
# well beyond what the socket buffers of both ends can hold (a few MiB on loopback).
LARGER: dict[str, Any] = {
    **SMALL,
    "max_frame_bytes": 256 * KIB,
    "snapshot_chunk_bytes": 64 * KIB,
    "snapshot_ack_interval_bytes": 256 * KIB,
}
BIG_BYTES = 32 * MIB
# Transfers of tens of MiB in Python on a shared CI machine: generous, still bounded.
TRANSFER_WAIT_S = 60.0


def snapshot_msg(data_bytes: int, *, index: int = 9, src: int = 1, dst: int = 2) -> InstallSnapshot:
    snap = Snapshot(
        meta=SnapshotMeta(index=index, term=1, tm=5, conf=ConfState(voters=(1, 2, 3))),
        data=os.urandom(data_bytes),
    )
    return InstallSnapshot(src=src, dst=dst, term=1, snapshot=snap)


def encoded_bytes(msg: InstallSnapshot) -> int:
    return len(msgpack.packb(encode_message(msg), use_bin_type=True))


def snapshots(inbox: Inbox) -> list[InstallSnapshot]:
    return [m for m in inbox.messages if isinstance(m, InstallSnapshot)]


def peer(t: PeerTransport, peer_id: int) -> dict[str, Any]:
    stats: dict[str, Any] = t.stats()["peers"][peer_id]
    return stats


def on_receiver_progress(
    receiver: PeerTransport, sender_id: int, fraction: float, action: Callable[[], None]
) -> list[bool]:
    """Run `action` once, right after the chunk that takes the receiver's copy of the transfer
    from `sender_id` past `fraction` of it. Returns a flag list that says whether it ran."""
    fired: list[bool] = []
    original = receiver._on_chunk

    def spy(link: Any, obj: list[object]) -> None:
        original(link, obj)
        inc = link.incoming
        if (
            not fired
            and link.peer_id == sender_id
            and inc is not None
            and inc.held >= fraction * inc.size
        ):
            fired.append(True)
            action()

    receiver._on_chunk = spy  # type: ignore[method-assign]
    return fired


def abort_inbound_from(t: PeerTransport, peer_id: int) -> None:
    """Cut the connection `peer_id` writes to `t` on (as a network failure would)."""
    for conn in list(t._inbound):
        if conn.peer_id == peer_id:
            conn.writer.transport.abort()


# ---- a. larger than the frame limit ---------------------------------------------------------


async def _larger_than_the_frame_limit() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL)
    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(1 * MIB)  # 16 frame limits, 64 chunks
        size = encoded_bytes(msg)
        a.send(hb(1, 2, 1))
        a.send(msg)
        a.send(hb(1, 2, 2))
        await eventually(lambda: snapshots(b_inbox) == [msg], "the snapshot, whole and equal")
        await eventually(
            lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "acknowledged whole"
        )
        beats = [m.commit for m in b_inbox.messages if isinstance(m, Heartbeat)]
        assert beats == [1, 2]
        sent = peer(a, 2)
        assert sent["snapshot_transfers_started"] == 1
        assert sent["snapshot_chunk_bytes_sent"] == size
        assert sent["snapshot_transfers_resumed"] == 0
        assert sent["snapshot_transfer_bytes"] == 0  # nothing pending any more
        assert sent["dropped"] == 0
        assert sent["sent"] == 2  # the heartbeats; chunks are counted in bytes
        received = peer(b, 1)
        assert received["snapshot_transfers_received"] == 1
        assert received["received"] == 3
        assert received["snapshot_transfers_dropped"] == received["malformed"] == 0


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_a_snapshot_larger_than_the_frame_limit_arrives_whole(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(_larger_than_the_frame_limit(), 30))


async def test_a_snapshot_over_the_real_frame_limit_arrives_whole() -> None:
    # At the production limits: 64 MiB frames, 1 MiB chunks, 8 MiB between acknowledgements.
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox), make(2, b_inbox)
    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(PEER_FRAME_BYTES_MAX + 8 * MIB)
        assert encoded_bytes(msg) > PEER_FRAME_BYTES_MAX
        a.send(msg)
        await eventually(lambda: bool(snapshots(b_inbox)), "delivered", TRANSFER_WAIT_S)
        assert snapshots(b_inbox) == [msg]
        await eventually(lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "acked")
        assert peer(a, 2)["dropped"] == 0
        assert peer(a, 2)["snapshot_chunk_bytes_sent"] == encoded_bytes(msg)


async def test_bytes_each_way_and_the_send_duration_are_counted_per_peer() -> None:
    """The per-peer byte counters behind `metastore_peer_bytes_sent/received_total` and the
    send duration behind `metastore_peer_snapshot_send_seconds`: an operator could not tell
    which peer link carried the replication traffic, nor how long a snapshot took to reach a
    follower (the transport counted messages and chunk bytes only)."""
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL)
    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(256 * KIB)
        a.send(hb(1, 2, 1))
        a.send(msg)
        await eventually(
            lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "acknowledged whole"
        )
        b.send(hb(2, 1, 3))
        await eventually(lambda: len(a_inbox.messages) == 1, "b's heartbeat delivered")
        sent = peer(a, 2)
        heartbeat_frame_bytes = len(encode_frame(encode_message(hb(1, 2, 1)), max_frame_bytes=KIB))
        # The heartbeat's frame plus every chunk frame (data and its small header).
        assert sent["bytes_sent"] > encoded_bytes(msg) + heartbeat_frame_bytes
        assert sent["bytes_sent"] < encoded_bytes(msg) + 16 * KIB
        # What one side sent on its link, the other read from it (the acks and b's heartbeat
        # the other way), once everything arrived.
        await eventually(
            lambda: peer(b, 1)["bytes_received"] == peer(a, 2)["bytes_sent"], "a -> b bytes"
        )
        await eventually(
            lambda: peer(a, 2)["bytes_received"] == peer(b, 1)["bytes_sent"] > 0, "b -> a bytes"
        )
        assert 0 < sent["snapshot_send_seconds_total"] < TRANSFER_WAIT_S
        assert peer(b, 1)["snapshot_send_seconds_total"] == 0.0  # b sent none


async def test_messages_sent_during_a_transfer_are_not_held_behind_it() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL)
    async with running(a, b):
        mesh({1: a, 2: b})
        await eventually(lambda: peer(a, 2)["connected"], "linked")
        msg = snapshot_msg(16 * MIB)
        fired = on_receiver_progress(b, 1, 1 / 8, lambda: a.send(hb(1, 2, 99)))
        a.send(msg)
        await eventually(lambda: bool(snapshots(b_inbox)), "delivered", TRANSFER_WAIT_S)
        assert fired
        kinds = [type(m).__name__ for m in b_inbox.messages]
        assert kinds == ["Heartbeat", "InstallSnapshot"]
        assert b_inbox.messages[0].commit == 99


# ---- b. resume after a dropped connection ---------------------------------------------------


@pytest.mark.parametrize("spooled", [False, True], ids=["in-memory", "spooled"])
async def test_a_transfer_resumes_after_the_connection_drops(spooled: bool, tmp_path: Path) -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    spool = {"snapshot_spool_dir": tmp_path / "spool"} if spooled else {}
    a, b = make(1, a_inbox, **LARGER), make(2, b_inbox, **LARGER, **spool)
    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(BIG_BYTES)
        size = encoded_bytes(msg)
        fired = on_receiver_progress(b, 1, 1 / 2, lambda: abort_inbound_from(b, 1))
        a.send(msg)
        await eventually(lambda: bool(snapshots(b_inbox)), "delivered", TRANSFER_WAIT_S)
        assert fired, "the connection was never cut"
        assert snapshots(b_inbox) == [msg]
        await eventually(lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "acked")
        sent = peer(a, 2)
        assert sent["reconnects"] >= 1
        assert sent["snapshot_transfers_started"] == 1
        assert sent["snapshot_transfers_resumed"] >= 1
        # Resumed from the acknowledged offset (>= half), not from zero: what was sent twice is
        # only what was in flight when the connection dropped.
        assert size <= sent["snapshot_chunk_bytes_sent"] < 1.5 * size
        assert peer(b, 1)["snapshot_transfers_received"] == 1


async def test_a_receiver_that_lost_the_transfer_asks_for_it_from_the_start() -> None:
    """The receiver restarts mid-transfer (its partial copy is gone): the sender resumes at its
    acknowledged offset, the new receiver rewinds it to zero, and the transfer completes."""
    a_inbox, b2_inbox = Inbox(), Inbox()
    a = make(1, a_inbox, **SMALL)
    port = free_port()
    async with running(a):
        b1 = make(2, Inbox(), port=port, peers={1: (HOST, a.bound_port)}, **SMALL)
        a.set_peers({2: (HOST, port)})
        await b1.start()
        stopping: list[asyncio.Task[None]] = []
        fired = on_receiver_progress(
            b1, 1, 1 / 2, lambda: stopping.append(asyncio.create_task(b1.stop()))
        )
        msg = snapshot_msg(4 * MIB)
        a.send(msg)
        await eventually(lambda: bool(stopping), "the first receiver got half")
        await stopping[0]
        assert fired
        acked = peer(a, 2)["snapshot_transfer_acked_bytes"]
        assert acked > 0
        b2 = make(2, b2_inbox, port=port, peers={1: (HOST, a.bound_port)}, **SMALL)
        async with running(b2):
            await eventually(lambda: bool(snapshots(b2_inbox)), "delivered", TRANSFER_WAIT_S)
            assert snapshots(b2_inbox) == [msg]
            await eventually(lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "acked")
            assert peer(a, 2)["snapshot_transfers_resumed"] >= 1
            assert peer(a, 2)["snapshot_chunk_bytes_sent"] >= encoded_bytes(msg) + acked


# ---- b'. spooled to disk: the receiver's heap holds one chunk, not the snapshot ---------------


def spool_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*")) if directory.exists() else []


async def test_a_spooled_transfer_is_read_from_disk_not_held_on_the_heap(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL, snapshot_spool_dir=spool)
    seen: list[tuple[int, int, int]] = []  # (bytes held, on the heap, in the spool file)

    def look() -> None:
        inc = b._links[1].incoming
        assert inc is not None
        [path] = spool_files(spool)
        seen.append((inc.held, len(inc.buf), path.stat().st_size))

    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(4 * MIB)
        fired = on_receiver_progress(b, 1, 1 / 2, look)
        a.send(msg)
        await eventually(lambda: bool(snapshots(b_inbox)), "delivered", TRANSFER_WAIT_S)
        assert fired
        [(held, on_heap, in_file)] = seen
        assert held >= 2 * MIB and on_heap == 0 and in_file == held
        [got] = snapshots(b_inbox)
        assert got == msg
        # The data is left in the spool file (read with pread), which is already unlinked.
        assert isinstance(got.snapshot.data, FileBytes)
        assert spool_files(spool) == []
        assert peer(b, 1)["snapshot_transfers_received"] == 1


async def test_spool_files_go_with_a_dropped_or_unfinished_transfer(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / f"peer-1-00000000000000aa{SPOOL_SUFFIX}").write_bytes(b"left by a crash")
    (spool / "not-ours.txt").write_bytes(b"kept")
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL, snapshot_spool_dir=spool)
    # An earlier process's unfinished transfer is deleted when the transport is built.
    assert [p.name for p in spool_files(spool)] == ["not-ours.txt"]
    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(1 * MIB)
        a.send(msg)
        out = a._links[2].outgoing
        assert out is not None
        out.digest = bytes(32)  # a bad checksum: the receiver drops the transfer
        await eventually(lambda: peer(b, 1)["snapshot_transfers_dropped"] == 1, "dropped")
        assert [p.name for p in spool_files(spool)] == ["not-ours.txt"]
        stopping: list[asyncio.Task[None]] = []
        fired = on_receiver_progress(
            b, 1, 1 / 2, lambda: stopping.append(asyncio.create_task(b.stop()))
        )
        a.send(snapshot_msg(1 * MIB, index=10))
        await eventually(lambda: bool(stopping), "the receiver got half of the retry")
        await stopping[0]
        assert fired
    # Stopped mid-transfer: its spool file is gone too.
    assert [p.name for p in spool_files(spool)] == ["not-ours.txt"]
    assert snapshots(b_inbox) == []


async def test_a_transfer_its_sender_abandoned_does_not_keep_its_spool_file(
    tmp_path: Path,
) -> None:
    """The sender crashes (or stops sending: deposed, its follower caught up from another
    leader) halfway: the receiver's spool file held that half for as long as the receiver
    ran, since only another transfer from the same peer ended it. Now it goes once no chunk
    came for the idle limit, and a later resend of the transfer starts it over."""
    spool = tmp_path / "spool"
    idle_ms = 300
    a_inbox, b_inbox = Inbox(), Inbox()
    a = make(1, a_inbox, **LARGER)
    b = make(2, b_inbox, **LARGER, snapshot_spool_dir=spool, snapshot_transfer_idle_ms=idle_ms)
    async with running(b):
        await a.start()
        mesh({1: a, 2: b})
        crashing: list[asyncio.Task[None]] = []
        fired = on_receiver_progress(
            b, 1, 1 / 4, lambda: crashing.append(asyncio.create_task(a.stop()))
        )
        a.send(snapshot_msg(BIG_BYTES))
        await eventually(lambda: bool(crashing), "the receiver got part of the transfer")
        await crashing[0]
        assert fired and len(spool_files(spool)) == 1
        await eventually(
            lambda: spool_files(spool) == [], "the abandoned transfer's spool file deleted"
        )
        assert b._links[1].incoming is None
        assert snapshots(b_inbox) == []


async def test_data_that_arrives_after_stop_is_neither_delivered_nor_spooled(
    tmp_path: Path,
) -> None:
    """A connection stop() has not closed yet (its handler still running) must not start a
    spool file that stop() already cleaned up, nor deliver anything."""
    spool = tmp_path / "spool"
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL, snapshot_spool_dir=spool)
    async with running(a, b):
        mesh({1: a, 2: b})
        await eventually(lambda: peer(b, 1)["connected"], "linked")
    assert 1 in b._links  # stopped, but the link to peer 1 is still known
    chunk = [TAG_SNAPSHOT_CHUNK, 7, 2 * MIB, 0, 0, b"", b"x" * 1024]
    frame = encode_frame(chunk, max_frame_bytes=PEER_FRAME_BYTES_MAX)
    assert b._receive_data(1, FrameDecoder(PEER_FRAME_BYTES_MAX), frame) is False
    assert spool_files(spool) == []
    assert b_inbox.messages == []


# ---- c. the same snapshot again, a newer one ------------------------------------------------


async def test_the_same_snapshot_sent_again_during_its_transfer_does_not_restart_it() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **LARGER), make(2, b_inbox, **LARGER)
    async with running(a, b):
        mesh({1: a, 2: b})
        await eventually(lambda: peer(a, 2)["connected"], "linked")
        msg = snapshot_msg(BIG_BYTES)
        size = encoded_bytes(msg)
        a.send(msg)
        outgoing = a._links[2].outgoing
        assert outgoing is not None
        seen: list[tuple[int, int]] = []

        def retry() -> None:  # what the core's retry after 2 election timeouts does
            out = a._links[2].outgoing
            assert out is not None
            a.send(msg)
            seen.append((out.transfer_id, out.next_offset))
            assert a._links[2].outgoing is out

        fired = on_receiver_progress(b, 1, 1 / 8, retry)
        await eventually(lambda: bool(snapshots(b_inbox)), "delivered", TRANSFER_WAIT_S)
        assert fired
        assert seen[0][0] == outgoing.transfer_id
        assert size // 8 <= seen[0][1] < size  # under way, and not moved back to zero
        await eventually(lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "acked")
        assert snapshots(b_inbox) == [msg]
        sent = peer(a, 2)
        assert sent["snapshot_transfers_started"] == 1
        assert sent["snapshot_chunk_bytes_sent"] == size  # not one byte twice

        # Sent again once the transfer completed: a new transfer (the receiver may not have
        # installed it: the transport cannot know), delivered again.
        a.send(msg)
        await eventually(lambda: len(snapshots(b_inbox)) == 2, "delivered again", TRANSFER_WAIT_S)
        await eventually(lambda: peer(a, 2)["snapshot_transfers_completed"] == 2, "acked again")
        assert peer(a, 2)["snapshot_transfers_started"] == 2


async def test_a_newer_snapshot_replaces_the_transfer_in_progress() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **LARGER), make(2, b_inbox, **LARGER)
    async with running(a, b):
        mesh({1: a, 2: b})
        await eventually(lambda: peer(a, 2)["connected"], "linked")
        old, new = snapshot_msg(BIG_BYTES, index=9), snapshot_msg(3 * MIB, index=20)
        fired = on_receiver_progress(b, 1, 1 / 8, lambda: a.send(new))
        a.send(old)
        await eventually(lambda: bool(snapshots(b_inbox)), "delivered", TRANSFER_WAIT_S)
        assert fired
        await eventually(lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "acked")
        await asyncio.sleep(0.05)  # nothing else arrives
        assert snapshots(b_inbox) == [new]
        sent = peer(a, 2)
        assert sent["snapshot_transfers_started"] == 2
        assert sent["snapshot_transfers_replaced"] == 1
        assert sent["snapshot_transfer_bytes"] == 0
        assert sent["snapshot_chunk_bytes_sent"] < encoded_bytes(old) + encoded_bytes(new)
        assert peer(b, 1)["snapshot_transfers_dropped"] == 0


async def test_a_newer_snapshot_queued_while_disconnected_is_the_only_one_sent() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    b = make(2, b_inbox, **SMALL)
    async with running(b):
        a = make(1, a_inbox, peers={2: (HOST, b.bound_port)}, **SMALL)
        b.set_peers({1: (HOST, free_port())})
        old, new = snapshot_msg(1 * MIB, index=9), snapshot_msg(1 * MIB, index=20)
        for msg in (old, old, new, new):  # not started: nothing is written yet
            a.send(msg)
        stats = peer(a, 2)
        assert stats["snapshot_transfers_started"] == 2
        assert stats["snapshot_transfers_replaced"] == 1
        assert stats["snapshot_transfer_bytes"] == encoded_bytes(new)
        async with running(a):
            await eventually(lambda: bool(snapshots(b_inbox)), "delivered", TRANSFER_WAIT_S)
            await asyncio.sleep(0.05)
        assert snapshots(b_inbox) == [new]
        assert peer(a, 2)["snapshot_chunk_bytes_sent"] == encoded_bytes(new)


# ---- d. corrupt transfers -------------------------------------------------------------------


async def test_a_transfer_with_a_bad_checksum_is_dropped_and_the_link_goes_on() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL)
    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(1 * MIB)
        a.send(msg)
        out = a._links[2].outgoing
        assert out is not None and out.next_offset == 0
        out.digest = bytes(32)  # the last chunk carries this instead of the real SHA-256
        await eventually(lambda: peer(b, 1)["snapshot_transfers_dropped"] == 1, "dropped")
        await eventually(lambda: peer(a, 2)["snapshot_transfers_failed"] == 1, "sender told")
        assert peer(a, 2)["snapshot_transfer_bytes"] == 0  # forgotten: the next retry is new
        a.send(hb(1, 2, 7))
        await eventually(lambda: hb(1, 2, 7) in b_inbox.messages, "later messages arrive")
        assert snapshots(b_inbox) == []
        assert peer(a, 2)["reconnects"] == 0  # nothing was closed
        assert peer(b, 1)["malformed"] == 0
        # The core's next retry is a new transfer, which succeeds.
        a.send(msg)
        await eventually(lambda: snapshots(b_inbox) == [msg], "retried", TRANSFER_WAIT_S)
        assert peer(b, 1)["snapshot_transfers_received"] == 1


def chunk(tid: int, size: int, offset: int, data: bytes, digest: bytes = b"") -> bytes:
    """A chunk frame written from the format in raft.transport's docstring."""
    return frame([64, tid, size, offset, 0, digest, data])


def chunks(tid: int, body: bytes, piece: int, *, digest: bytes | None = None) -> bytes:
    out = []
    for offset in range(0, len(body), piece):
        data = body[offset : offset + piece]
        last = offset + len(data) == len(body)
        d = (hashlib.sha256(body).digest() if digest is None else digest) if last else b""
        out.append(chunk(tid, len(body), offset, data, d))
    return b"".join(out)


async def test_bad_chunks_from_a_raw_peer_drop_only_their_transfer() -> None:
    limits = {**SMALL, "snapshot_transfer_bytes_max": 1 * MIB}
    a_inbox = Inbox()
    a = make(1, a_inbox, **limits)
    async with running(a):
        a.set_peers({3: (HOST, free_port())})  # acks to node 3 just queue
        reader, writer = await raw_connect(a.bound_port, as_id=3)
        good = snapshot_msg(100 * KIB, src=3, dst=1)
        body = msgpack.packb(encode_message(good), use_bin_type=True)
        spoofed = msgpack.packb(
            encode_message(snapshot_msg(50 * KIB, src=2, dst=1)), use_bin_type=True
        )
        not_a_snapshot = msgpack.packb(encode_message(hb(3, 1, 1)), use_bin_type=True)
        cases = [
            ("beyond its size", chunk(1, 10, 5, b"x" * 6)),
            ("digest on a middle chunk", chunk(2, 10, 0, b"x" * 5, b"d" * 32)),
            ("over the limit", chunk(3, 1 * MIB + 1, 0, b"x" * 100)),
            ("bad checksum", chunks(4, body, 16 * KIB, digest=bytes(32))),
            ("not a snapshot", chunks(5, not_a_snapshot, 4)),
            ("undecodable", chunks(6, b"\xc1" * 100, 40)),
        ]
        for n, (what, frames) in enumerate(cases, start=1):
            writer.write(frames + frame(encode_message(hb(3, 1, 100 + n))))
            await eventually(lambda n=n: hb(3, 1, 100 + n) in a_inbox.messages, what)
            assert peer(a, 3)["snapshot_transfers_dropped"] == n, what
        assert snapshots(a_inbox) == []
        # A chunk without a usable transfer id is only counted as malformed.
        malformed = peer(a, 3)["malformed"]
        writer.write(frame([64, -1, 10, 0, 0, b"", b"x"]) + frame(encode_message(hb(3, 1, 200))))
        await eventually(lambda: hb(3, 1, 200) in a_inbox.messages, "still in sync")
        assert peer(a, 3)["malformed"] == malformed + 1
        # Same src/dst checks as any message, then a good one, on the same connection.
        writer.write(chunks(7, spoofed, 16 * KIB) + chunks(8, body, 16 * KIB))
        await eventually(lambda: bool(snapshots(a_inbox)), "the good snapshot")
        assert snapshots(a_inbox) == [good]
        assert peer(a, 3)["rejected"] == 1
        assert peer(a, 3)["snapshot_transfers_received"] == 2  # both verified; one rejected
        # Late chunks of a delivered transfer change nothing.
        writer.write(chunks(8, body, 16 * KIB) + frame(encode_message(hb(3, 1, 300))))
        await eventually(lambda: hb(3, 1, 300) in a_inbox.messages, "after the repeat")
        assert snapshots(a_inbox) == [good]
        assert not reader.at_eof()
        writer.close()


async def test_a_raw_peer_of_the_previous_protocol_version_is_refused() -> None:
    a = make(1, Inbox(), peers={3: (HOST, free_port())})
    async with running(a):
        reader, writer = await asyncio.open_connection(HOST, a.bound_port)
        writer.write(frame(["raft-peer-hello", 2, "test-cluster", 3, 1, os.urandom(32)]))
        async with asyncio.timeout(5):
            answer = await reader.read()  # until the node closes the connection
        assert answer == b"", "a node of version 2 was answered (challenged)"
        writer.close()
        assert a.stats()["handshake_failures"] == 1


@pytest.mark.parametrize(
    "override",
    [
        {"snapshot_chunk_bytes": 0},
        {"max_frame_bytes": 1024, "snapshot_chunk_bytes": 1000},
        {"max_frame_bytes": 100},  # no room for a chunk frame at all
        {"snapshot_transfer_bytes_max": 0},
        {"snapshot_ack_interval_bytes": 0},
    ],
)
def test_bad_transfer_limits_are_a_typed_error(override: dict[str, Any]) -> None:
    with pytest.raises(InvalidLimitError):
        make(1, Inbox(), **override)


def test_a_snapshot_over_the_transfer_limit_is_dropped_by_the_sender() -> None:
    a = make(1, Inbox(), peers={2: (HOST, free_port())}, snapshot_transfer_bytes_max=1 * MIB)
    a.send(snapshot_msg(1 * MIB))
    stats = peer(a, 2)
    assert stats["dropped"] == 1
    assert stats["snapshot_transfers_started"] == 0
    assert stats["snapshot_transfer_bytes"] == 0


async def test_lost_acknowledgements_are_recovered_by_the_cores_retries() -> None:
    """Every ack of a transfer is lost on the way back. Once all bytes are written, a retry of
    the core that finds no progress since its previous retry sends the rest again from the last
    acknowledged offset; the receiver answers with done again."""
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL)
    lost = [True]
    send_ack = b._send_ack

    def lossy(*args: Any) -> None:
        if not lost[0]:
            send_ack(*args)

    b._send_ack = lossy  # type: ignore[method-assign]
    async with running(a, b):
        mesh({1: a, 2: b})
        msg = snapshot_msg(1 * MIB)
        size = encoded_bytes(msg)
        a.send(msg)
        await eventually(lambda: snapshots(b_inbox) == [msg], "delivered")
        await eventually(lambda: peer(a, 2)["snapshot_chunk_bytes_sent"] == size, "all written")
        lost[0] = False
        a.send(msg)  # the core's first retry: progress is measured from here
        await asyncio.sleep(0.05)
        assert peer(a, 2)["snapshot_transfers_completed"] == 0
        assert peer(a, 2)["snapshot_chunk_bytes_sent"] == size
        a.send(msg)  # the next retry: nothing acknowledged in between
        await eventually(lambda: peer(a, 2)["snapshot_transfers_completed"] == 1, "done")
        assert peer(a, 2)["snapshot_transfers_started"] == 1
        assert snapshots(b_inbox) == [msg]  # delivered once


async def test_a_spool_the_disk_cannot_hold_drops_only_that_transfer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver's disk fills while it spools a snapshot (ENOSPC from a write): the transfer
    is dropped (its spool file deleted, the sender told, nothing delivered: the follower's log
    and state are untouched) and the connection stays; the leader's next attempt, with room
    again, arrives whole."""
    import errno

    from raft import transport

    spool = tmp_path / "spool"
    real_write = transport._Incoming.write
    full = {"on": True}

    def write(self: Any, data: memoryview) -> None:
        if full["on"] and self.held > 0:  # the disk fills part way through
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(self, data)

    monkeypatch.setattr(transport._Incoming, "write", write)
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL, snapshot_spool_dir=spool)
    async with running(a, b):
        mesh({1: a, 2: b})
        a.send(snapshot_msg(1 * MIB))
        await eventually(lambda: peer(b, 1)["snapshot_transfers_dropped"] == 1, "dropped")
        assert spool_files(spool) == []
        assert snapshots(b_inbox) == []
        full["on"] = False
        retry = snapshot_msg(1 * MIB, index=10)
        a.send(retry)
        await eventually(lambda: snapshots(b_inbox) == [retry], "the retry arrives whole")
        assert spool_files(spool) == []
        assert peer(b, 1)["reconnects"] == 0
