"""A connection paused by its reply budget (CLIENT_REPLY_BYTES_PER_CONNECTION_MAX) is closed
only when its client takes no byte of its replies for CLIENT_IDLE_TIMEOUT_MS: a client that
stopped reading is let go, a slow one is served in full however long it is paused. Before, a
client that never read kept its connection (and every reply it had asked for) forever: its
requests waited in flight for the socket, and a connection with requests in flight was never
idle.

An ApiServer with a stub node and one extra op of a large reply, on real sockets on
127.0.0.1 (kernel socket buffers kept small so the transport's own buffer fills)."""

from __future__ import annotations

import asyncio
import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon import api_limits as L
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session, _Op
from raft.framing import NEED_DATA, FrameDecoder, encode_frame

FRAME_MAX = 1 << 20
REPLY_BYTES = 32 * 1024
REQUESTS = 16  # sent in one write: all run at once, 512 KiB of replies
SOCKET_BUFFER_BYTES = 16 * 1024
IDLE_TIMEOUT_MS = 500
# For the slow reader: the server and this reader share one process and event loop, and at
# load 15 on 2 cores that process went unscheduled for up to 0.3 s at a time; once the stall
# and the wait for the socket to take bytes passed 500 ms the server's timer fired before it
# could see the bytes the reader took (1 run in 10). Twice the worst stall and more.
SLOW_READER_IDLE_TIMEOUT_MS = 1_000


@pytest.fixture(autouse=True)
def _small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "CLIENT_IDLE_TIMEOUT_MS", IDLE_TIMEOUT_MS)
    # raising=False: on a server without the budget the test must fail on its assertions.
    monkeypatch.setattr(L, "CLIENT_REPLY_BYTES_PER_CONNECTION_MAX", 64 * 1024, raising=False)


def _api() -> ApiServer:
    api = ApiServer(
        node=SimpleNamespace(node_id=1),  # type: ignore[arg-type]
        sm=None,  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *a: None),  # type: ignore[arg-type]
        cluster_id="ct",
        client_addresses={},
    )

    async def big(_session: Session, _args: Any) -> dict[str, Any]:
        return {"blob": b"x" * REPLY_BYTES}

    api._ops["big"] = _Op(Role.READER, big, frozenset())
    return api


class _Served:
    def __init__(self) -> None:
        self.done = asyncio.Event()  # the server is done with the connection
        self.writer: asyncio.StreamWriter | None = None  # the server's side of it
        # Reply bytes the server still held for the socket when it was done (they are flushed
        # after it; more than the reply budget means it gave up on a paused connection).
        self.unsent_at_close = 0


def _request(rid: int) -> bytes:
    return encode_frame({"id": rid, "op": "big", "args": {}}, max_frame_bytes=FRAME_MAX)


async def _connect(api: ApiServer) -> tuple[socket.socket, _Served, asyncio.Server]:
    """A served connection that sent REQUESTS requests in one write. A plain socket: a
    StreamReader would read ahead of the test in bursts."""
    served = _Served()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.writer = writer
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES
        )
        try:
            await api._serve_session(
                Session(peer="t", role=Role.READER),
                FrameDecoder(FRAME_MAX),
                reader,
                writer,
                0.0,
                set(),
            )
        finally:
            served.unsent_at_close = writer.transport.get_write_buffer_size()
            writer.close()
            served.done.set()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, b"".join(_request(i) for i in range(1, REQUESTS + 1)))
    return sock, served, server


def test_a_client_that_stops_reading_is_closed_after_the_idle_timeout() -> None:
    api = _api()

    async def run() -> float:
        sock, served, server = await _connect(api)
        try:
            # Once the replies fill the server's buffer, one more request: before, its reply
            # waited in flight for the socket forever, and kept the connection from being idle.
            for _ in range(1_000):
                if served.writer and served.writer.transport.get_write_buffer_size() > 0:
                    break
                await asyncio.sleep(0.005)
            await asyncio.get_running_loop().sock_sendall(sock, _request(REQUESTS + 1))
            started = time.monotonic()
            # Never read: the server pauses the connection and, once the socket took nothing
            # for the idle timeout, closes it.
            try:
                await asyncio.wait_for(served.done.wait(), 10 * IDLE_TIMEOUT_MS / 1000)
            except TimeoutError:
                raise AssertionError("a client that never reads kept its connection") from None
            return time.monotonic() - started
        finally:
            sock.close()
            server.close()

    elapsed = asyncio.run(run())
    assert elapsed >= IDLE_TIMEOUT_MS / 1000 * 0.9
    assert api.reply_backlog()["client_connections_paused"] == 0


def test_a_slow_reader_is_served_in_full_however_long_it_is_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(L, "CLIENT_IDLE_TIMEOUT_MS", SLOW_READER_IDLE_TIMEOUT_MS)
    api = _api()

    async def run() -> tuple[list[dict[str, Any]], float, int]:
        sock, served, server = await _connect(api)
        loop = asyncio.get_running_loop()
        decoder = FrameDecoder(FRAME_MAX)
        replies: list[dict[str, Any]] = []
        paused_s, paused_seen = 0.0, 0
        deadline = time.monotonic() + 30
        try:
            # 4 KiB every 40 ms (~100 KB/s): the 512 KiB of replies take ~5 s, the
            # connection stays paused for many idle timeouts, yet it reads some bytes in each.
            while len(replies) < REQUESTS:
                assert time.monotonic() < deadline, f"{len(replies)} replies in 30 s"
                # Once every reply is within the budget the server reads requests again, and
                # closes the connection after an idle timeout without one: the last replies
                # still reach us (flushed), however slowly we read them (at load 11 on 2 cores
                # they took longer than the idle timeout). Never while replies wait beyond the
                # budget.
                assert not (
                    served.done.is_set()
                    and served.unsent_at_close > L.CLIENT_REPLY_BYTES_PER_CONNECTION_MAX
                ), f"closed while paused, after {len(replies)} replies"
                paused = api.reply_backlog()["client_connections_paused"]
                paused_seen = max(paused_seen, paused)
                data = await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)
                assert data, f"closed after {len(replies)} replies"
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not NEED_DATA:
                    assert isinstance(frame, dict)
                    replies.append(frame)
                await asyncio.sleep(0.04)  # the client's slowness, not a synchronisation
                paused_s += 0.04 if paused else 0.0
            return replies, paused_s, paused_seen
        finally:
            sock.close()
            await asyncio.wait_for(served.done.wait(), 5)
            server.close()

    replies, paused_s, paused_seen = asyncio.run(run())
    assert paused_seen == 1, "the connection was never paused: the test proves nothing"
    assert paused_s > 2 * SLOW_READER_IDLE_TIMEOUT_MS / 1000
    assert sorted(r["id"] for r in replies) == list(range(1, REQUESTS + 1))
    assert all(r["ok"] and r["result"]["blob"] == b"x" * REPLY_BYTES for r in replies)
