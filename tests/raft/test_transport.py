"""PeerTransport on 127.0.0.1 with real sockets: ordering, authentication, reconnects, limits.

Raw-socket peers below speak the handshake from the protocol description in
`raft.transport`'s docstring, written out independently here, so a change to the protocol on
one side only is caught. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import hmac
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import uvloop

from raft.core.types import (
    AppendEntries,
    ConfState,
    Entry,
    EntryKind,
    Heartbeat,
    InstallSnapshot,
    Message,
    Snapshot,
    SnapshotMeta,
    VoteResponse,
)
from raft.errors import (
    FrameEncodeError,
    InsecureSecretFileError,
    InvalidLimitError,
    SecretFileError,
    TransportConfigError,
)
from raft.limits import (
    PEER_FRAME_ITEMS_MAX,
    PEER_INBOUND_CONNECTIONS_MAX,
    PEER_TCP_USER_TIMEOUT_MS,
    PEER_WARNINGS_BURST,
    STRANGERS_PER_HOST_MAX,
)
from raft.transport import PROTOCOL_VERSION, PeerTransport, load_or_create_secret
from raft.wire import encode_message

SECRET = b"0123456789abcdef0123456789abcdef"
WRONG_SECRET = b"fedcba9876543210fedcba9876543210"
CLUSTER = "test-cluster"
HOST = "127.0.0.1"
WAIT_S = 5.0
# Fast reconnects keep the tests quick; production defaults are in raft.limits.
FAST: dict[str, Any] = {
    "reconnect_backoff_ms_min": 5,
    "reconnect_backoff_ms_max": 40,
    "handshake_timeout_ms": 2000,
    "connect_timeout_ms": 1000,
}


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, msg: Message) -> None:
        self.messages.append(msg)

    def from_(self, src: int) -> list[Message]:
        return [m for m in self.messages if m.src == src]


async def eventually(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout_s):
        # Polling: the conditions are counters and inboxes, which signal no event.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    assert predicate(), what


async def keep_sending(send: Callable[[], None], predicate: Callable[[], bool], what: str) -> None:
    """Send repeatedly until `predicate` holds: for links that may still be (re)connecting."""
    async with asyncio.timeout(WAIT_S):
        while not predicate():
            send()
            await asyncio.sleep(0.02)
    assert predicate(), what


def hb(src: int, dst: int, n: int = 0) -> Heartbeat:
    return Heartbeat(src=src, dst=dst, term=1, commit=n)


def make(node_id: int, inbox: Inbox, *, port: int = 0, **overrides: Any) -> PeerTransport:
    kwargs: dict[str, Any] = {
        "node_id": node_id,
        "listen_host": HOST,
        "listen_port": port,
        "peers": {},
        "secret": SECRET,
        "on_message": inbox,
        "cluster_id": CLUSTER,
        **FAST,
    }
    kwargs.update(overrides)
    return PeerTransport(**kwargs)


@contextlib.asynccontextmanager
async def running(*transports: PeerTransport) -> AsyncIterator[None]:
    try:
        for t in transports:
            await t.start()
        yield
    finally:
        for t in transports:
            await t.stop()


def mesh(nodes: dict[int, PeerTransport], extra: dict[int, tuple[str, int]] | None = None) -> None:
    """Tell every transport about every other one (after start, when ports are known)."""
    addresses = {nid: (HOST, t.bound_port) for nid, t in nodes.items()} | (extra or {})
    for t in nodes.values():
        t.set_peers(addresses)


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


# ---- ordering, both event loops -------------------------------------------------------------


async def _three_node_exchange() -> None:
    count = 300
    inboxes = {i: Inbox() for i in (1, 2, 3)}
    nodes = {i: make(i, inboxes[i]) for i in (1, 2, 3)}
    async with running(*nodes.values()):
        mesh(nodes)
        entry = Entry(term=1, index=1, tm=7, kind=EntryKind.NORMAL, data=b"cmd")
        big = Snapshot(
            meta=SnapshotMeta(index=9, term=1, tm=5, conf=ConfState(voters=(1, 2, 3))),
            data=os.urandom(1 << 20),  # a multi-read frame
        )
        # Sent at once, before any link is up: they queue and must arrive in order.
        for n in range(count):
            for src, t in nodes.items():
                for dst in nodes:
                    if dst != src:
                        t.send(hb(src, dst, n))
            if n == count // 2:
                nodes[1].send(InstallSnapshot(src=1, dst=2, term=1, snapshot=big))
                nodes[3].send(
                    AppendEntries(
                        src=3, dst=1, term=1, prev_index=0, prev_term=0, entries=(entry,), commit=0
                    )
                )
        total = {1: 2 * count + 1, 2: 2 * count + 1, 3: 2 * count}
        await eventually(
            lambda: all(len(inboxes[i].messages) == total[i] for i in nodes), "all delivered"
        )
        for dst, inbox in inboxes.items():
            for src in nodes:
                if src == dst:
                    continue
                beats = [m.commit for m in inbox.from_(src) if isinstance(m, Heartbeat)]
                assert beats == list(range(count)), f"{src}->{dst} out of order"
        snaps = [m for m in inboxes[2].messages if isinstance(m, InstallSnapshot)]
        assert snaps == [InstallSnapshot(src=1, dst=2, term=1, snapshot=big)]
        assert next(m for m in inboxes[1].messages if isinstance(m, AppendEntries)).entries == (
            entry,
        )
        # The snapshot is larger than the chunk size: it travelled as a transfer of chunks.
        await eventually(
            lambda: nodes[1].stats()["peers"][2]["snapshot_transfers_completed"] == 1, "acked"
        )
        stats = nodes[1].stats()
        assert stats["peers"][2]["sent"] == count
        assert stats["peers"][2]["connected"]
        assert stats["peers"][3]["received"] == count + 1
        assert stats["peers"][2]["dropped"] == 0


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_three_transports_exchange_messages_in_order(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(_three_node_exchange(), 30))


# ---- authentication -------------------------------------------------------------------------


async def test_peer_with_wrong_secret_never_gets_a_message_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="raft.transport")
    inboxes = {i: Inbox() for i in (1, 2, 3)}
    nodes = {
        1: make(1, inboxes[1]),
        2: make(2, inboxes[2]),
        3: make(3, inboxes[3], secret=WRONG_SECRET),
    }
    async with running(*nodes.values()):
        mesh(nodes)

        def send_all() -> None:
            for src, t in nodes.items():
                for dst in nodes:
                    if dst != src:
                        t.send(hb(src, dst))

        s1, s2, s3 = (nodes[i].stats for i in (1, 2, 3))
        await keep_sending(
            send_all,
            lambda: (
                s1()["peers"][3]["auth_failures"] >= 2  # refused 3's proof and 3's welcome
                and s2()["peers"][3]["auth_failures"] >= 2
                and s3()["peers"][1]["auth_failures"] >= 2
                and len(inboxes[1].from_(2)) > 0
                and len(inboxes[2].from_(1)) > 0
            ),
            "auth failures counted on every side, good links working",
        )
        assert inboxes[3].messages == []
        assert inboxes[1].from_(3) == []
        assert inboxes[2].from_(3) == []
        assert not s1()["peers"][3]["connected"]
        assert not s3()["peers"][1]["connected"]
        assert s1()["peers"][2]["connected"]
    assert any("secret" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize(
    ("bad_id", "override", "counter"),
    [
        (3, {"cluster_id": "another-cluster"}, "peer"),
        (4, {}, "unknown"),  # not among node 1's peers
    ],
    ids=["wrong-cluster-id", "unknown-node-id"],
)
async def test_wrong_cluster_or_unknown_node_is_refused(
    bad_id: int, override: dict[str, Any], counter: str
) -> None:
    good_inbox, bad_inbox = Inbox(), Inbox()
    good = make(1, good_inbox)
    bad = make(bad_id, bad_inbox, **override)
    async with running(good, bad):
        good.set_peers({3: (HOST, bad.bound_port)})
        bad.set_peers({1: (HOST, good.bound_port)})

        def refused() -> int:
            stats = good.stats()
            if counter == "unknown":
                return int(stats["auth_failures_unknown_peer"])
            return int(stats["peers"][3]["auth_failures"])

        await keep_sending(lambda: bad.send(hb(bad_id, 1)), lambda: refused() >= 2, "refused")
        assert good_inbox.messages == []
        assert not bad.stats()["peers"][1]["connected"]


# ---- reconnects and queues ------------------------------------------------------------------


async def test_reconnect_after_the_remote_stops_and_restarts() -> None:
    a_inbox, b_inbox, b2_inbox = Inbox(), Inbox(), Inbox()
    a = make(1, a_inbox)
    b = make(2, b_inbox)
    async with running(a):
        await b.start()
        port = b.bound_port
        a.set_peers({2: (HOST, port)})
        b.set_peers({1: (HOST, a.bound_port)})
        await keep_sending(lambda: a.send(hb(1, 2)), lambda: bool(b_inbox.messages), "first")
        await b.stop()
        await eventually(lambda: not a.stats()["peers"][2]["connected"], "link noticed loss")

        b2 = make(2, b2_inbox, port=port, peers={1: (HOST, a.bound_port)})
        async with running(b2):
            await keep_sending(
                lambda: a.send(hb(1, 2, 7)), lambda: bool(b2_inbox.messages), "after restart"
            )
            await keep_sending(
                lambda: b2.send(hb(2, 1, 8)), lambda: bool(a_inbox.messages), "reverse link"
            )
        assert a.stats()["peers"][2]["reconnects"] >= 1
        assert all(m == hb(1, 2, 7) for m in b2_inbox.messages)
        assert a_inbox.messages[0] == hb(2, 1, 8)


async def _kill_peer_mid_write_repeatedly(rounds: int) -> None:
    """Node 2 dies (every connection reset at once, as a SIGKILL does) while node 1's link is
    busy writing a stream of 64 KiB messages to it; a new node 2 starts on the same port. Every
    round the link must reconnect and deliver again: a link task must survive any error of its
    connection (uvloop raises RuntimeError from writelines on a transport aborted under it)."""
    payload = os.urandom(64 * 1024)
    a_inbox = Inbox()
    a = make(1, a_inbox)
    port = free_port()
    async with running(a):
        a.set_peers({2: (HOST, port)})
        stop = asyncio.Event()

        async def stream() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                entry = Entry(term=1, index=n + 1, tm=n, kind=EntryKind.NORMAL, data=payload)
                a.send(
                    AppendEntries(
                        src=1, dst=2, term=1, prev_index=n, prev_term=1, entries=(entry,), commit=0
                    )
                )
                await asyncio.sleep(0)

        sender = asyncio.get_running_loop().create_task(stream())
        try:
            for round_no in range(rounds):
                inbox = Inbox()
                b = make(2, inbox, port=port, peers={1: (HOST, a.bound_port)})
                await b.start()
                await eventually(
                    lambda inbox=inbox: len(inbox.messages) >= 3, f"round {round_no}: delivered"
                )
                await b.stop()  # aborts every connection while frames are in flight
            await eventually(lambda: not a.stats()["peers"][2]["connected"], "loss noticed")
            task = a._links[2].task
            assert task is not None and not task.done(), "the link task died"
            assert a.stats()["peers"][2]["reconnects"] >= rounds - 1
        finally:
            stop.set()
            await sender


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_a_link_survives_its_peer_dying_mid_write_many_times(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="raft"),
        asyncio.Runner(loop_factory=loop_factory) as runner,
    ):
        runner.run(asyncio.wait_for(_kill_peer_mid_write_repeatedly(rounds=25), 60))
    assert not [r for r in caplog.records if "crashed" in r.getMessage()]


async def test_a_write_refused_by_a_closed_transport_reconnects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What uvloop does when the peer dies between the watcher's abort and the write: the write
    raises RuntimeError. The link must log it and reconnect, not die."""
    real = asyncio.StreamWriter.writelines
    failures = [RuntimeError("unable to perform operation on <TCPTransport closed=True>")]

    def flaky(self: asyncio.StreamWriter, data: Any) -> None:
        if failures:
            raise failures.pop()
        real(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "writelines", flaky)
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox), make(2, b_inbox)
    async with running(a, b):
        mesh({1: a, 2: b})
        await keep_sending(lambda: a.send(hb(1, 2, 5)), lambda: bool(b_inbox.messages), "after")
    assert not failures  # the failure really happened
    task = a._links[2].task
    assert task is not None


@pytest.mark.parametrize(
    "kind", ["raft-peer-hello", "raft-peer-proof", "raft-peer-challenge", "raft-peer-welcome"]
)
async def test_a_handshake_write_on_a_closed_connection_ends_it_quietly(
    kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """uvloop refuses a write on a transport closed under us (the peer reset the connection
    mid-handshake) with RuntimeError: the dialler (hello, proof) or the listener (challenge,
    welcome) counts a failed handshake and the link redials, with no traceback logged and
    nothing left for the loop's handler of unhandled exceptions."""
    real = asyncio.StreamWriter.write
    refused: list[str] = []

    def closed_once(self: asyncio.StreamWriter, data: Any) -> None:
        if not refused and msgpack.unpackb(bytes(data)[4:])[0] == kind:
            refused.append(kind)
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")
        real(self, data)

    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    monkeypatch.setattr(asyncio.StreamWriter, "write", closed_once)
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox), make(2, b_inbox)
    with caplog.at_level(logging.DEBUG, logger="raft"):
        async with running(a, b):
            mesh({1: a, 2: b})
            await keep_sending(lambda: a.send(hb(1, 2)), lambda: bool(b_inbox.messages), "sent")
            await keep_sending(lambda: b.send(hb(2, 1)), lambda: bool(a_inbox.messages), "back")
            assert refused == [kind]
            failures = sum(
                t.stats()["handshake_failures"] + t.stats()["peers"][peer]["connect_failures"]
                for t, peer in ((a, 2), (b, 1))
            )
            assert failures >= 1
    assert unhandled == []
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


async def test_full_queue_drops_the_oldest_and_counts_it() -> None:
    b_inbox = Inbox()
    b = make(2, b_inbox)
    async with running(b):
        a = make(1, Inbox(), peers={2: (HOST, b.bound_port)}, send_queue_max=10)
        b.set_peers({1: (HOST, free_port())})
        for n in range(25):  # not started yet: everything stays queued
            a.send(hb(1, 2, n))
        stats = a.stats()["peers"][2]
        assert (stats["queued"], stats["dropped"], stats["sent"]) == (10, 15, 0)
        async with running(a):
            await eventually(lambda: len(b_inbox.messages) == 10, "the newest ten delivered")
            await asyncio.sleep(0.05)
        assert [m.commit for m in b_inbox.messages if isinstance(m, Heartbeat)] == list(
            range(15, 25)
        )
        assert a.stats()["peers"][2]["sent"] == 10


async def test_send_to_unknown_or_removed_peer_is_dropped_and_counted() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    nodes = {1: make(1, a_inbox), 2: make(2, b_inbox)}
    async with running(*nodes.values()):
        mesh(nodes)
        await keep_sending(
            lambda: nodes[2].send(hb(2, 1)), lambda: bool(a_inbox.messages), "linked"
        )
        nodes[1].send(hb(1, 9))
        assert nodes[1].stats()["dropped_no_route"] == 1
        nodes[1].set_peers({})  # node 2 leaves the configuration
        assert 2 not in nodes[1].stats()["peers"]
        nodes[1].send(hb(1, 2))
        assert nodes[1].stats()["dropped_no_route"] == 2
        # 2's connection was closed and its reconnects are now refused by node 1; node 2 only
        # sees its handshakes cut short.
        await eventually(lambda: nodes[1].stats()["auth_failures_unknown_peer"] >= 1, "refused")
        await eventually(lambda: not nodes[2].stats()["peers"][1]["connected"], "2 disconnected")
        await eventually(lambda: nodes[2].stats()["peers"][1]["connect_failures"] >= 1, "cut")
        delivered = len(a_inbox.messages)
        for _ in range(5):
            nodes[2].send(hb(2, 1))
            await asyncio.sleep(0.02)
        assert len(a_inbox.messages) == delivered


async def test_peers_kept_without_dialling_are_still_accepted_and_heard() -> None:
    """`set_peers(..., dial=False)` (a removed node that gave up on its peers): it connects to
    no one, but a peer that dials it is accepted and heard, and dialling again sends what was
    queued meanwhile."""
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox), make(2, b_inbox)
    async with running(a, b):
        a.set_peers({2: (HOST, b.bound_port)}, dial=False)
        b.set_peers({1: (HOST, a.bound_port)})
        await keep_sending(lambda: b.send(hb(2, 1)), lambda: bool(a_inbox.messages), "heard")
        a.send(hb(1, 2, 5))
        stats = a.stats()
        assert not stats["dialling"]
        assert stats["peers"][2]["connected"] is False
        assert stats["peers"][2]["connect_failures"] == 0 and stats["peers"][2]["queued"] == 1
        assert not b_inbox.messages
        a.set_peers({2: (HOST, b.bound_port)})
        await eventually(lambda: b_inbox.messages == [hb(1, 2, 5)], "sent once dialling")
        assert a.stats()["dialling"]


async def test_oversized_message_is_dropped_not_raised() -> None:
    a = make(1, Inbox(), peers={2: (HOST, free_port())}, max_frame_bytes=1024)
    entry = Entry(term=1, index=1, tm=7, kind=EntryKind.NORMAL, data=b"x" * 2048)
    a.send(
        AppendEntries(src=1, dst=2, term=1, prev_index=0, prev_term=0, entries=(entry,), commit=0)
    )
    assert a.stats()["peers"][2]["dropped"] == 1
    assert a.stats()["peers"][2]["queued"] == 0
    # A snapshot that large is not oversized: it becomes a transfer of chunks.
    snap = Snapshot(meta=SnapshotMeta(index=1, term=1, tm=1), data=b"x" * 2048)
    a.send(InstallSnapshot(src=1, dst=2, term=1, snapshot=snap))
    assert a.stats()["peers"][2]["dropped"] == 1
    assert a.stats()["peers"][2]["snapshot_transfers_started"] == 1


def test_unencodable_message_is_a_caller_bug_and_raises() -> None:
    a = make(1, Inbox(), peers={2: (HOST, free_port())})
    with pytest.raises(FrameEncodeError):
        a.send(hb(1, 2, 2**64))


# ---- raw sockets ----------------------------------------------------------------------------


def frame(obj: object) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


async def read_frame(reader: asyncio.StreamReader) -> Any:
    header = await reader.readexactly(4)
    return msgpack.unpackb(await reader.readexactly(int.from_bytes(header, "big")))


def proof_mac(secret: bytes, role: str, client: int, server: int, cn: bytes, sn: bytes) -> bytes:
    material = msgpack.packb(
        [role, PROTOCOL_VERSION, CLUSTER, client, server, cn, sn], use_bin_type=True
    )
    return hmac.new(secret, material, hashlib.sha256).digest()


async def raw_connect(
    port: int, *, as_id: int, to_id: int = 1, secret: bytes = SECRET, after_proof: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Authenticate as `as_id`; `after_proof` is written together with the proof."""
    reader, writer = await asyncio.open_connection(HOST, port)
    cn = os.urandom(32)
    writer.write(frame(["raft-peer-hello", PROTOCOL_VERSION, CLUSTER, as_id, to_id, cn]))
    kind, sn = await read_frame(reader)
    assert kind == "raft-peer-challenge"
    writer.write(frame(["raft-peer-proof", proof_mac(secret, "client", as_id, to_id, cn, sn)]))
    writer.write(after_proof)
    if secret == SECRET and not after_proof:
        kind, server_mac = await read_frame(reader)
        assert kind == "raft-peer-welcome"
        assert server_mac == proof_mac(SECRET, "server", as_id, to_id, cn, sn)
    return reader, writer


async def closed_by_remote(reader: asyncio.StreamReader) -> bool:
    """True once the remote closed (EOF or reset) within WAIT_S; frames before it are skipped."""
    async with asyncio.timeout(WAIT_S):
        try:
            while await reader.read(4096):
                pass
        except ConnectionResetError:
            pass
    return True


@contextlib.asynccontextmanager
async def node_with_raw_peer() -> AsyncIterator[tuple[PeerTransport, Inbox, PeerTransport, Inbox]]:
    """Node 1 and a real node 2; node 3 exists only in their configuration (for raw sockets)."""
    a_inbox, b_inbox = Inbox(), Inbox()
    nodes = {1: make(1, a_inbox), 2: make(2, b_inbox)}
    async with running(*nodes.values()):
        mesh(nodes, extra={3: (HOST, free_port())})
        yield nodes[1], a_inbox, nodes[2], b_inbox


async def test_malformed_frame_from_raw_socket_closes_only_that_connection() -> None:
    async with node_with_raw_peer() as (a, a_inbox, b, _):
        await keep_sending(lambda: b.send(hb(2, 1, 1)), lambda: bool(a_inbox.messages), "b up")
        reader, writer = await raw_connect(a.bound_port, as_id=3)
        writer.write(frame(encode_message(hb(3, 1, 42))))
        await eventually(lambda: hb(3, 1, 42) in a_inbox.messages, "raw peer's valid message")
        writer.write(b"\x00\x00\x00\x01\xc1" + frame(encode_message(hb(3, 1, 43))))
        assert await closed_by_remote(reader)
        writer.close()
        assert hb(3, 1, 43) not in a_inbox.messages
        assert a.stats()["peers"][3]["malformed"] == 1
        # Node 2's connection to node 1 is untouched.
        before = len(a_inbox.from_(2))
        b.send(hb(2, 1, 2))
        await eventually(lambda: len(a_inbox.from_(2)) == before + 1, "b still delivers")
        assert b.stats()["peers"][1]["reconnects"] == 0


async def test_oversized_header_from_authenticated_peer_closes_connection() -> None:
    async with node_with_raw_peer() as (a, _, _, _):
        reader, writer = await raw_connect(a.bound_port, as_id=3)
        writer.write((2**32 - 1).to_bytes(4, "big"))  # no body follows: refused on the header
        assert await closed_by_remote(reader)
        writer.close()
        assert a.stats()["peers"][3]["malformed"] == 1


async def test_invalid_message_in_valid_frame_is_dropped_and_counted() -> None:
    async with node_with_raw_peer() as (a, a_inbox, _, _):
        _reader, writer = await raw_connect(a.bound_port, as_id=3)
        writer.write(frame([5, 3, 1, -1, 0, 0]) + frame(encode_message(hb(3, 1, 5))))
        await eventually(lambda: hb(3, 1, 5) in a_inbox.messages, "stream still in sync")
        assert a.stats()["peers"][3]["malformed"] == 1
        writer.close()


async def test_a_frame_of_too_many_tiny_items_closes_the_connection_before_it_is_built() -> None:
    """A frame's decode cost is bounded by its items (PEER_FRAME_ITEMS_MAX), not its bytes: a
    frame of 16-nil arrays costs 176 heap bytes per 16 bytes on the wire, and a 64 MiB one
    took seconds and gigabytes to decode before it was refused as a malformed message."""
    nested = [[None] * 15] * (PEER_FRAME_ITEMS_MAX // 16 + 1)  # over the budget, ~1 MiB
    async with node_with_raw_peer() as (a, a_inbox, _, _):
        reader, writer = await raw_connect(a.bound_port, as_id=3)
        writer.write(frame([5, 3, 1, nested, 0, 0, 0, 0]) + frame(encode_message(hb(3, 1, 5))))
        assert await closed_by_remote(reader)
        writer.close()
        assert hb(3, 1, 5) not in a_inbox.messages
        assert a.stats()["peers"][3]["malformed"] == 1


async def test_a_refused_value_is_quoted_in_a_few_characters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer's value in an error or a log line is cut while its repr is built: a frame can
    hold a million items, and a refusal used to print them all."""
    huge = list(range(100_000))
    async with node_with_raw_peer() as (a, a_inbox, _, _):
        with caplog.at_level(logging.WARNING, logger="raft.transport"):
            _reader, writer = await raw_connect(a.bound_port, as_id=3)
            writer.write(
                frame([64, huge, 1, 0, 0, b"", b"x"])  # a snapshot chunk's transfer id
                + frame([65, 1, 0, huge, 0])  # a snapshot ack's status
                + frame([5, 3, 1, huge, 0, 0, 0, 0])  # a heartbeat's term
                + frame([3, 3, 1, 1, 0, 0, {"k": huge}, False])  # a vote's pre_vote flag
                + frame(encode_message(hb(3, 1, 5)))
            )
            await eventually(lambda: hb(3, 1, 5) in a_inbox.messages, "stream still in sync")
            writer.close()
        assert a.stats()["peers"][3]["malformed"] == 4
    lines = [r.getMessage() for r in caplog.records if "peer 3" in r.getMessage()]
    assert len(lines) >= 4
    assert max(len(line) for line in lines) < 300, max(lines, key=len)


async def test_a_peer_flooding_bad_messages_gets_a_few_warnings_and_every_one_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One warning per bad frame let a peer fill the node's log: within PEER_WARNINGS_BURST
    at once, every bad message still counted."""
    bad_count = 10 * PEER_WARNINGS_BURST
    async with node_with_raw_peer() as (a, a_inbox, _, _):
        with caplog.at_level(logging.WARNING, logger="raft.transport"):
            _reader, writer = await raw_connect(a.bound_port, as_id=3)
            bad = frame([5, 3, 1, -1, 0, 0])  # a heartbeat of 6 fields, one negative
            foreign = frame(encode_message(hb(3, 2, 1)))  # for another node
            writer.write((bad + foreign) * (bad_count // 2) + frame(encode_message(hb(3, 1, 5))))
            await eventually(lambda: hb(3, 1, 5) in a_inbox.messages, "stream still in sync")
            writer.close()
        stats = a.stats()["peers"][3]
        assert (stats["malformed"], stats["rejected"]) == (bad_count // 2, bad_count // 2)
    warnings = [r for r in caplog.records if "from peer 3" in r.getMessage()]
    # The burst, and maybe one more if a token came back while the frames arrived.
    assert PEER_WARNINGS_BURST <= len(warnings) <= PEER_WARNINGS_BURST + 2, len(warnings)


async def test_refused_handshakes_get_a_few_warnings_and_every_one_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stranger needs no secret to be refused, so refusals share one log budget."""
    attempts = 3 * PEER_WARNINGS_BURST
    async with node_with_raw_peer() as (a, _, _, _):
        with caplog.at_level(logging.WARNING, logger="raft.transport"):
            for _ in range(attempts):
                reader, writer = await raw_connect(a.bound_port, as_id=3, secret=WRONG_SECRET)
                assert await closed_by_remote(reader)
                writer.close()
        assert a.stats()["peers"][3]["auth_failures"] == attempts
    refusals = [r for r in caplog.records if "refused peer connection" in r.getMessage()]
    assert PEER_WARNINGS_BURST <= len(refusals) <= PEER_WARNINGS_BURST + 3, len(refusals)


async def test_spoofed_src_or_foreign_dst_is_dropped_and_counted() -> None:
    async with node_with_raw_peer() as (a, a_inbox, _, _):
        _reader, writer = await raw_connect(a.bound_port, as_id=3)
        for msg in (hb(2, 1, 1), hb(3, 2, 2), VoteResponse(src=3, dst=1, term=1, granted=True)):
            writer.write(frame(encode_message(msg)))
        await eventually(lambda: bool(a_inbox.from_(3)), "the honest message")
        assert a_inbox.from_(3) == [VoteResponse(src=3, dst=1, term=1, granted=True)]
        assert hb(2, 1, 1) not in a_inbox.messages
        assert a.stats()["peers"][3]["rejected"] == 2
        writer.close()


async def test_raw_peer_with_wrong_mac_is_refused_and_its_frames_never_delivered() -> None:
    async with node_with_raw_peer() as (a, a_inbox, _, _):
        reader, writer = await raw_connect(
            a.bound_port,
            as_id=3,
            secret=WRONG_SECRET,
            after_proof=frame(encode_message(hb(3, 1, 99))),
        )
        assert await closed_by_remote(reader)
        writer.close()
        assert a.stats()["peers"][3]["auth_failures"] == 1
        await asyncio.sleep(0.05)
        assert a_inbox.from_(3) == []


async def test_silent_connection_is_closed_after_the_handshake_timeout() -> None:
    a = make(1, Inbox(), handshake_timeout_ms=100)
    async with running(a):
        reader, writer = await asyncio.open_connection(HOST, a.bound_port)
        assert await closed_by_remote(reader)
        writer.close()
        assert a.stats()["handshake_failures"] == 1


async def test_garbage_before_handshake_closes_the_connection() -> None:
    async with node_with_raw_peer() as (a, _, _, _):
        reader, writer = await asyncio.open_connection(HOST, a.bound_port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        assert await closed_by_remote(reader)
        writer.close()
        assert a.stats()["handshake_failures"] == 1


async def test_server_that_cannot_prove_the_secret_is_refused_by_the_client() -> None:
    received_after_proof = bytearray()

    async def fake_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, _, _, client, server, cn = await read_frame(reader)
        sn = os.urandom(32)
        writer.write(frame(["raft-peer-challenge", sn]))
        await read_frame(reader)  # the client's proof
        writer.write(
            frame(["raft-peer-welcome", proof_mac(WRONG_SECRET, "server", client, server, cn, sn)])
        )
        with contextlib.suppress(ConnectionError):
            received_after_proof.extend(await reader.read(4096))
        writer.close()

    server = await asyncio.start_server(fake_peer, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    a = make(1, Inbox(), peers={2: (HOST, port)})
    try:
        async with running(a):
            a.send(hb(1, 2))
            await eventually(lambda: a.stats()["peers"][2]["auth_failures"] >= 1, "refused")
            assert not a.stats()["peers"][2]["connected"]
            assert a.stats()["peers"][2]["sent"] == 0
    finally:
        server.close()
    assert bytes(received_after_proof) == b""


async def test_at_the_inbound_limit_the_oldest_stranger_makes_room() -> None:
    async with node_with_raw_peer() as (a, a_inbox, b, _):
        await keep_sending(lambda: b.send(hb(2, 1)), lambda: bool(a_inbox.from_(2)), "b up")
        # Node 2's authenticated connection plus silent strangers fill every slot (from many
        # hosts: one host may hold only STRANGERS_PER_HOST_MAX of them).
        strangers = [
            await asyncio.open_connection(HOST, a.bound_port, local_addr=(stranger_host(i), 0))
            for i in range(PEER_INBOUND_CONNECTIONS_MAX - 1)
        ]
        await eventually(
            lambda: a.stats()["inbound_connections"] == PEER_INBOUND_CONNECTIONS_MAX, "all held"
        )
        _reader, writer = await raw_connect(a.bound_port, as_id=3)
        assert await closed_by_remote(strangers[0][0])
        writer.write(frame(encode_message(hb(3, 1, 5))))
        await eventually(lambda: hb(3, 1, 5) in a_inbox.messages, "newcomer admitted")
        before = len(a_inbox.from_(2))
        b.send(hb(2, 1))
        await eventually(lambda: len(a_inbox.from_(2)) > before, "node 2 never evicted")
        stats = a.stats()
        assert stats["inbound_refused_over_limit"] == 1
        assert stats["handshake_failures"] == 0  # an eviction is not the stranger's failure
        assert stats["inbound_connections"] == PEER_INBOUND_CONNECTIONS_MAX
        writer.close()
        for _, w in strangers:
            w.close()


def stranger_host(i: int) -> str:
    """A loopback source address other than HOST, STRANGERS_PER_HOST_MAX connections each."""
    return f"127.0.1.{2 + i // STRANGERS_PER_HOST_MAX}"


async def test_a_flood_from_one_host_cannot_hold_the_slots_peers_need() -> None:
    """Silent connections from one host past STRANGERS_PER_HOST_MAX are closed at once, so they
    never reach the inbound limit, and a peer on another host gets in without evicting."""
    async with node_with_raw_peer() as (a, a_inbox, b, _):
        await keep_sending(lambda: b.send(hb(2, 1)), lambda: bool(a_inbox.from_(2)), "b up")
        flood = [
            await asyncio.open_connection(HOST, a.bound_port, local_addr=("127.0.1.250", 0))
            for _ in range(STRANGERS_PER_HOST_MAX + 20)
        ]
        await eventually(lambda: a.stats()["inbound_refused_per_host"] >= 20, "flood capped")
        assert a.stats()["inbound_connections"] == 1 + STRANGERS_PER_HOST_MAX
        _reader, writer = await raw_connect(a.bound_port, as_id=3)
        writer.write(frame(encode_message(hb(3, 1, 5))))
        await eventually(lambda: hb(3, 1, 5) in a_inbox.messages, "a peer elsewhere gets in")
        assert a.stats()["inbound_refused_over_limit"] == 0
        writer.close()
        for _, w in flood:
            w.close()


async def test_stop_is_idempotent_and_send_after_stop_is_dropped() -> None:
    a = make(1, Inbox(), peers={2: (HOST, free_port())})
    await a.start()
    await a.stop()
    await a.stop()
    a.send(hb(1, 2))
    assert a.stats()["dropped_no_route"] == 1


# ---- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ({"node_id": 0}, TransportConfigError),
        ({"secret": b"short"}, TransportConfigError),
        ({"cluster_id": ""}, TransportConfigError),
        ({"cluster_id": "c" * 129}, TransportConfigError),
        ({"peers": {0: (HOST, 1)}}, TransportConfigError),
        ({"peers": {2: (HOST, 0)}}, TransportConfigError),
        ({"peers": {2: [HOST, 1]}}, TransportConfigError),
        ({"max_frame_bytes": 0}, InvalidLimitError),
        ({"send_queue_max": 0}, InvalidLimitError),
        ({"max_frame_bytes": 1024, "send_queue_bytes_max": 1000}, InvalidLimitError),
        ({"reconnect_backoff_ms_min": 50, "reconnect_backoff_ms_max": 10}, InvalidLimitError),
    ],
)
def test_bad_configuration_is_a_typed_error(
    override: dict[str, Any], error: type[Exception]
) -> None:
    settings = dict(override)
    node_id = settings.pop("node_id", 1)
    with pytest.raises(error):
        make(node_id, Inbox(), **settings)


# ---- the secret file ------------------------------------------------------------------------


def test_secret_is_created_once_with_private_modes(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "cluster.secret"
    secret = load_or_create_secret(path)
    assert len(secret) == 64
    bytes.fromhex(secret.decode())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_or_create_secret(path) == secret


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_secret_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "cluster.secret"
    path.write_bytes(b"a" * 64)
    path.chmod(mode)
    with pytest.raises(InsecureSecretFileError, match="chmod 600"):
        load_or_create_secret(path)


def test_existing_secret_is_read_stripped(tmp_path: Path) -> None:
    path = tmp_path / "cluster.secret"
    path.write_bytes(b"  " + b"k" * 40 + b"\n")
    path.chmod(0o600)
    assert load_or_create_secret(path) == b"k" * 40


@pytest.mark.parametrize("content", [b"", b"tooshort\n", b"x" * 5000])
def test_unusable_secret_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "cluster.secret"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(SecretFileError):
        load_or_create_secret(path)


def test_a_disk_that_fills_while_the_secret_is_written_leaves_no_short_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filling disk stores what fits and returns that count (the next write raises ENOSPC).
    A short secret under the final name would be used, or refused, for good: the error names
    the file, and once space is freed the next start creates a whole one."""
    path = tmp_path / "secrets" / "cluster.secret"
    real_write = os.write
    bytes_left = [10]

    def filling_disk(fd: int, data: Any) -> int:
        if path.name not in os.readlink(f"/proc/self/fd/{fd}"):
            return real_write(fd, data)
        if not bytes_left[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = real_write(fd, bytes(data)[: bytes_left[0]])
        bytes_left[0] -= written
        return written

    monkeypatch.setattr(os, "write", filling_disk)
    with pytest.raises(OSError) as caught:
        load_or_create_secret(path)
    assert caught.value.errno == errno.ENOSPC and str(path) in str(caught.value)
    monkeypatch.undo()
    assert sorted(p.name for p in path.parent.iterdir()) == []
    secret = load_or_create_secret(path)
    assert len(secret) == 64


def test_secret_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(SecretFileError, match="regular file"):
        load_or_create_secret(tmp_path / "dir")


def test_reconnect_backoff_grows_with_jitter_inside_the_bounds() -> None:
    t = make(1, Inbox(), reconnect_backoff_ms_min=10, reconnect_backoff_ms_max=1000)
    delays = {attempt: [t._backoff_ms(attempt) for _ in range(200)] for attempt in range(40)}
    assert all(10 <= d <= 1000 for ds in delays.values() for d in ds)
    assert max(delays[0]) <= 10  # the first retry waits the minimum
    assert max(delays[3]) <= 80  # then the cap doubles per attempt...
    assert max(delays[39]) > 500  # ...up to the maximum, with the delay spread by jitter
    assert len({round(d) for d in delays[39]}) > 50


async def test_a_peer_that_drops_each_link_right_after_the_handshake_gets_backed_off() -> None:
    """A peer that authenticates every connection and closes it at once (two nodes configured
    with the same id, each new link making the peer close the other's; a peer that closes on
    every frame) must not be redialled at the minimum delay for ever: only a connection that
    stayed up resets the backoff. Before, every completed handshake reset it, a reconnect storm
    of one TCP connection and two HMACs per RECONNECT_BACKOFF_MS_MIN."""
    handshakes = 0

    async def welcome_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal handshakes
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            _, _, _, client, server, cn = await read_frame(reader)
            sn = os.urandom(32)
            writer.write(frame(["raft-peer-challenge", sn]))
            await read_frame(reader)  # the client's proof (checked by the real listener)
            writer.write(
                frame(["raft-peer-welcome", proof_mac(SECRET, "server", client, server, cn, sn)])
            )
            await writer.drain()
            handshakes += 1
        writer.close()

    server = await asyncio.start_server(welcome_then_close, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    a = make(1, Inbox(), reconnect_backoff_ms_min=1, reconnect_backoff_ms_max=1000)
    attempts: list[int] = []
    backoff_ms = a._backoff_ms

    def recorded(attempt: int) -> float:
        attempts.append(attempt)
        return min(backoff_ms(attempt), 20)  # the test need not wait out the real delays

    a._backoff_ms = recorded  # type: ignore[method-assign]
    try:
        async with running(a):
            a.set_peers({2: (HOST, port)})
            await eventually(lambda: handshakes >= 6 and len(attempts) >= 6, "six links")
    finally:
        server.close()
    assert a.stats()["peers"][2]["reconnects"] >= 5
    # Each short-lived link counts as a failed attempt: the delay's cap keeps doubling.
    assert attempts[:6] == [0, 1, 2, 3, 4, 5], attempts


async def test_a_link_whose_peer_stopped_reading_or_vanished_is_dropped_and_redialled() -> None:
    """A peer that acknowledges nothing any more (its host vanished or was cut off without a
    reset; its process hangs and its receive buffer is full) must not keep our link "connected"
    for TCP's own retransmission timeout (about 15 minutes; and up to 2 minutes after it came
    back, until the next retransmission meets a reset): while the link looks up, nothing we send
    reaches it, and a rebooted peer hears nothing from this node. Unacknowledged data older than
    the user timeout ends the link, which then redials."""
    handshakes = 0
    stop_reading = asyncio.Event()

    async def welcome_then_stop_reading(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal handshakes
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            _, _, _, client, server, cn = await read_frame(reader)
            sn = os.urandom(32)
            writer.write(frame(["raft-peer-challenge", sn]))
            await read_frame(reader)
            writer.write(
                frame(["raft-peer-welcome", proof_mac(SECRET, "server", client, server, cn, sn)])
            )
            handshakes += 1
            # Never read again (the socket's receive window fills up); hold it open.
            async with asyncio.timeout(WAIT_S * 2):
                await stop_reading.wait()
        writer.close()

    server = await asyncio.start_server(welcome_then_stop_reading, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    a = make(1, Inbox(), peer_tcp_user_timeout_ms=300)
    payload = os.urandom(1 << 20)
    try:
        async with running(a):
            a.set_peers({2: (HOST, port)})
            await eventually(lambda: a.stats()["peers"][2]["connected"], "first link")
            for n in range(64):  # far more than the socket buffers hold
                entry = Entry(term=1, index=n + 1, tm=n + 1, kind=EntryKind.NORMAL, data=payload)
                a.send(
                    AppendEntries(
                        src=1, dst=2, term=1, prev_index=n, prev_term=1, entries=(entry,), commit=0
                    )
                )
                await asyncio.sleep(0)
            await eventually(lambda: handshakes >= 2, "the stuck link dropped and redialled")
    finally:
        stop_reading.set()
        server.close()


async def test_peer_links_keep_alive_both_ways() -> None:
    """An idle link (between two followers) to a vanished peer is found dead by keepalive
    probes instead of when the next vote request finally times out."""
    inboxes = {1: Inbox(), 2: Inbox()}
    nodes = {i: make(i, inboxes[i]) for i in (1, 2)}
    async with running(*nodes.values()):
        mesh(nodes)
        await keep_sending(lambda: nodes[2].send(hb(2, 1)), lambda: bool(inboxes[1].messages), "up")
        outbound = nodes[2]._links[1].idle_writer
        (inbound,) = [c.writer for c in nodes[1]._inbound if c.peer_id == 2]
        assert outbound is not None
        for writer in (outbound, inbound):
            sock = writer.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            user_timeout_ms = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
            assert user_timeout_ms == PEER_TCP_USER_TIMEOUT_MS


async def test_after_an_address_change_nothing_more_goes_to_the_old_address() -> None:
    """Messages sent after `set_peers` moved a peer go to its new address. Before, the retired
    link's idle connection stayed the fast path's target until its task had wound down, so a
    batch sent and flushed right after the change went to the old address (lost, or delivered
    to whatever still listened there)."""
    a_inbox, old_inbox, new_inbox = Inbox(), Inbox(), Inbox()
    a = make(1, a_inbox)
    old = make(2, old_inbox)
    new = make(2, new_inbox)
    async with running(a, old, new):
        a.set_peers({2: (HOST, old.bound_port)})
        old.set_peers({1: (HOST, a.bound_port)})
        new.set_peers({1: (HOST, a.bound_port)})
        await keep_sending(lambda: a.send(hb(1, 2, 1)), lambda: bool(old_inbox.messages), "old")
        await eventually(lambda: a._links[2].idle_writer is not None, "link idle")
        a.set_peers({2: (HOST, new.bound_port)})
        a.send(hb(1, 2, 2))
        a.flush()
        await eventually(lambda: hb(1, 2, 2) in new_inbox.messages, "at the new address")
        assert hb(1, 2, 2) not in old_inbox.messages


# ---- protocol versions (a rolling upgrade) ----------------------------------------------------


def incarnated(src: int, dst: int) -> Heartbeat:
    """A heartbeat as a node of version 6 stamps it (raft.node)."""
    return Heartbeat(
        src=src,
        dst=dst,
        term=1,
        commit=0,
        clock_ms=5,
        echo_ms=4,
        incarnation=77,
        echo_incarnation=66,
    )


async def test_a_mixed_pair_speaks_version_5_both_ways_and_the_newest_once_upgraded() -> None:
    """A node of the previous release (protocol version 5 only) refuses a hello of version 6
    by closing the connection; once it has dialled the new node (offering 5), the new node
    offers 5 too, and both links carry heartbeats in the short form the old release decodes.
    When the old node restarts upgraded, its hello of version 6 makes the new node redial it,
    and the incarnations go through."""
    new_inbox, old_inbox, upgraded_inbox = Inbox(), Inbox(), Inbox()
    new = make(1, new_inbox)
    old_port = free_port()
    old = make(2, old_inbox, port=old_port, protocol_version=5)
    upgraded = make(2, upgraded_inbox, port=old_port)

    def incarnations(inbox: Inbox) -> set[tuple[int, int]]:
        beats = [m for m in inbox.messages if isinstance(m, Heartbeat)]
        assert len(beats) == len(inbox.messages)
        return {(m.incarnation, m.echo_incarnation) for m in beats}

    async with running(new):
        async with running(old):
            mesh({1: new, 2: old})
            await keep_sending(
                lambda: new.send(incarnated(1, 2)), lambda: bool(old_inbox.messages), "to old"
            )
            await keep_sending(
                lambda: old.send(incarnated(2, 1)), lambda: bool(new_inbox.messages), "from old"
            )
            to_old = new.stats()["peers"][2]
            assert to_old["protocol_version"] == to_old["peer_hello_version"] == 5
            assert old.stats()["peers"][1]["protocol_version"] == 5
            assert incarnations(old_inbox) == incarnations(new_inbox) == {(0, 0)}
            assert old.stats()["peers"][1]["malformed"] == to_old["malformed"] == 0
        async with running(upgraded):
            mesh({1: new, 2: upgraded})
            await keep_sending(
                lambda: new.send(incarnated(1, 2)),
                lambda: (77, 66) in incarnations(upgraded_inbox),
                "incarnations to the upgraded node",
            )
            to_upgraded = new.stats()["peers"][2]
            assert to_upgraded["protocol_version"] == to_upgraded["peer_hello_version"] == 6
            assert upgraded.stats()["peers"][1]["malformed"] == 0


async def reach_an_old_node_that_never_dials(
    new_overrides: dict[str, Any] | None = None, old_overrides: dict[str, Any] | None = None
) -> None:
    """One-way reachability in a rolling upgrade: the old node (version 5 only) never dials
    the new one, so the new node never hears a hello of version 5. The old node closes the
    connection on our hello of version 6; the new node tries 5, which the old node accepts,
    checks once that 6 is still refused (a node that was down behind a proxy refuses every
    version, see the test below), and speaks 5 from then on: also after a reconnect, with no
    refused dial on the way."""
    new_inbox = Inbox()
    new = make(1, new_inbox, **(new_overrides or {}))
    old_port = free_port()
    async with running(new):
        for restart in range(2):
            old_inbox = Inbox()
            old = make(2, old_inbox, port=old_port, protocol_version=5, **(old_overrides or {}))
            async with running(old):
                old.set_peers({1: (HOST, new.bound_port)}, dial=False)
                new.set_peers({2: (HOST, old_port)})
                await keep_sending(
                    lambda: new.send(incarnated(1, 2)),
                    lambda old_inbox=old_inbox: bool(old_inbox.messages),
                    f"to the old node that never dials (run {restart})",
                )
                to_old = new.stats()["peers"][2]
                assert to_old["protocol_version"] == to_old["fallback_version"] == 5
                assert to_old["peer_hello_version"] == 0  # it never dialled us
                # The short form the old release decodes: no incarnations.
                assert old_inbox.messages[0] == Heartbeat(
                    src=1, dst=2, term=1, commit=0, clock_ms=5, echo_ms=4
                )
                assert old.stats()["peers"][1]["malformed"] == 0
                # Refused: the hello of 6, the check after 5 was challenged (the check's
                # connection itself ends after the challenge), 6 again. After the restart
                # the link offers 5 at once.
                expected_refusals = 3 if restart == 0 else 0
                assert old.stats()["handshake_failures"] == expected_refusals


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_a_new_node_reaches_an_old_node_that_never_dials_it(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(reach_an_old_node_that_never_dials(), 30))


async def test_a_node_down_behind_a_proxy_then_up_is_spoken_to_at_the_newest() -> None:
    """The link tried version 5 after the proxy closed its hello of 6; the node that came up
    behind the proxy (this release, never dialling us) accepts 5 too, so the link checks 6
    before it settles, and speaks 6."""
    port = free_port()
    hellos: list[int] = []

    async def accept_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append((await read_frame(reader))[1])
        writer.close()

    # A slow redial: the node is up behind the port before the next dial (which offers 5).
    a = make(
        1,
        Inbox(),
        peers={2: (HOST, port)},
        reconnect_backoff_ms_min=300,
        reconnect_backoff_ms_max=400,
    )
    b_inbox = Inbox()
    b = make(2, b_inbox, port=port)
    async with running(a):
        proxy = await asyncio.start_server(accept_and_close, HOST, port)
        try:
            await eventually(lambda: len(hellos) >= 1, "a dial to the closing proxy")
        finally:
            proxy.close()
            await proxy.wait_closed()
        async with running(b):
            b.set_peers({1: (HOST, a.bound_port)}, dial=False)
            await keep_sending(lambda: a.send(incarnated(1, 2)), lambda: bool(b_inbox.messages), "")
            assert hellos == [6]
            assert a.stats()["peers"][2]["protocol_version"] == 6
            assert a.stats()["peers"][2]["fallback_version"] == 0
            assert b_inbox.messages[0] == incarnated(1, 2)
            assert b.stats()["handshake_failures"] == 1  # the check of version 5


async def test_a_close_after_the_hello_does_not_lower_the_version_offered() -> None:
    """A proxy in front of a node that is down accepts and closes, just as a node of an older
    release refuses a newer hello: that alone must not make two new nodes speak version 5
    (the chaos test's proxies did, and such links kept the old clock echo rule). The link
    tries 5 after 6 is closed, and 6 again after 5 is closed too: it alternates, one version
    per dial, and settles on 5 only when the peer accepts 5 and then still refuses 6."""
    port = free_port()
    hellos: list[int] = []

    async def accept_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            hellos.append((await read_frame(reader))[1])
        writer.close()

    a = make(1, Inbox(), peers={2: (HOST, port)})
    b_inbox = Inbox()
    b = make(2, b_inbox, port=port, peers={1: (HOST, free_port())})
    async with running(a):
        proxy = await asyncio.start_server(accept_and_close, HOST, port)
        try:
            await eventually(lambda: len(hellos) >= 4, "dials to the closing proxy")
        finally:
            proxy.close()
            await proxy.wait_closed()
        assert hellos[:4] == [6, 5, 6, 5]
        async with running(b):
            await keep_sending(lambda: a.send(incarnated(1, 2)), lambda: bool(b_inbox.messages), "")
            assert a.stats()["peers"][2]["protocol_version"] == 6
            assert a.stats()["peers"][2]["fallback_version"] == 0
            assert b_inbox.messages[-1] == incarnated(1, 2)


async def test_a_raw_peer_of_protocol_version_5_is_answered_and_its_mac_binds_the_version() -> None:
    """A hello of version 5 (the previous release) is challenged, and that connection's MACs
    are over version 5: a proof computed over version 6 for it is refused."""
    a = make(1, Inbox(), peers={3: (HOST, free_port())})
    async with running(a):
        for proof_version, welcomed in ((5, True), (6, False)):
            reader, writer = await asyncio.open_connection(HOST, a.bound_port)
            cn = os.urandom(32)
            writer.write(frame(["raft-peer-hello", 5, CLUSTER, 3, 1, cn]))
            kind, sn = await read_frame(reader)
            assert kind == "raft-peer-challenge"
            material = msgpack.packb(
                ["client", proof_version, CLUSTER, 3, 1, cn, sn], use_bin_type=True
            )
            writer.write(
                frame(["raft-peer-proof", hmac.new(SECRET, material, hashlib.sha256).digest()])
            )
            if welcomed:
                kind, _ = await read_frame(reader)
                assert kind == "raft-peer-welcome"
            else:
                assert await closed_by_remote(reader)
            writer.close()
