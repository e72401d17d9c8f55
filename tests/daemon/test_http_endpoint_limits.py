"""What an unauthenticated caller can make the `/metrics` and `/health` responder hold.

The HTTP port has no token: anyone who can reach it may connect. Each connection it holds is a
file descriptor, a task and a read buffer for up to HTTP_TIMEOUT_S, and the node's client and
peer ports, WAL and snapshots share its descriptor limit. So it holds at most
HTTP_CONNECTIONS_MAX at once, the oldest making room for a newcomer (a scrape takes
milliseconds, so the oldest is the one most likely stalled)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from metastore.daemon.metrics import (
    HTTP_CONNECTIONS_MAX,
    HTTP_TIMEOUT_S,
    HttpEndpoint,
    NodeMetrics,
)

# Well under HTTP_TIMEOUT_S: an evicted connection must be closed at once, not timed out.
EVICTION_WAIT_S = HTTP_TIMEOUT_S / 2
EXTRA_CONNECTIONS = 5


def _status() -> dict[str, Any]:
    return {
        "node_id": 1,
        "role": "leader",
        "leader": 1,
        "ready": True,
        "lag_ms": 0,
        "applied_index": 7,
        "term": 1,
        "commit_index": 7,
    }


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.read(), HTTP_TIMEOUT_S)
    finally:
        writer.close()


async def test_silent_connections_past_the_limit_evict_the_oldest_and_scrapes_still_work() -> None:
    endpoint = HttpEndpoint(NodeMetrics(1), _status)
    await endpoint.start("127.0.0.1", 0)
    port = endpoint.bound_port
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        opened.extend(
            [
                await asyncio.open_connection("127.0.0.1", port)
                for _ in range(HTTP_CONNECTIONS_MAX + EXTRA_CONNECTIONS)
            ]
        )
        # The first EXTRA_CONNECTIONS were evicted by the newcomers: EOF well before the
        # request timeout would have closed them.
        for reader, _ in opened[:EXTRA_CONNECTIONS]:
            assert await asyncio.wait_for(reader.read(), EVICTION_WAIT_S) == b""
        # A scrape arriving now is served (it evicts the oldest silent one in turn).
        reply = await _get(port, "/health")
        assert reply.startswith(b"HTTP/1.1 200 "), reply
        assert endpoint.open_connections <= HTTP_CONNECTIONS_MAX
    finally:
        for _, writer in opened:
            writer.close()
        for _, writer in opened:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
        await endpoint.stop()


async def _get_raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), EVICTION_WAIT_S)
    finally:
        writer.close()


async def test_bare_lf_line_endings_are_served_at_once() -> None:
    # `printf 'GET /health HTTP/1.0\n\n' | nc host port`: tools and humans type bare LF; the
    # reply must come well before HTTP_TIMEOUT_S, not after it as an empty close.
    endpoint = HttpEndpoint(NodeMetrics(1), _status)
    await endpoint.start("127.0.0.1", 0)
    try:
        port = endpoint.bound_port
        reply = await _get_raw(port, b"GET /health HTTP/1.0\n\n")
        assert reply.startswith(b"HTTP/1.1 200 "), reply
        reply = await _get_raw(port, b"GET /metrics HTTP/1.0\nHost: x\n\n")
        assert reply.startswith(b"HTTP/1.1 200 ") and b"metastore_raft_term" in reply, reply
        # Mixed endings (a CRLF request line, a bare-LF blank line) are one request too.
        reply = await _get_raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\n")
        assert reply.startswith(b"HTTP/1.1 200 "), reply
        # The header bound still holds with bare LF.
        big = b"GET /health HTTP/1.0\n" + b"X-Pad: " + b"a" * 9000 + b"\n\n"
        reply = await _get_raw(port, big)
        assert reply.startswith(b"HTTP/1.1 431 "), reply
    finally:
        await endpoint.stop()
