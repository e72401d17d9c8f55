"""A write on a connection that closed under us (the peer reset it, or we aborted it to make
room) is the connection ending, not an error: uvloop, the daemon's loop, refuses such a write
with RuntimeError, which must not escape as an unhandled exception with a traceback. Each case
runs on uvloop against a real loopback connection whose server side was aborted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
import uvloop

from metastore.daemon.metrics import HttpEndpoint, NodeMetrics
from metastore.daemon.server import ApiServer


async def _aborted_server_side() -> tuple[asyncio.StreamWriter, list[object]]:
    """The server side's writer of a loopback connection, its transport already aborted (and
    every stream object kept referenced: a collected one may close its transport)."""
    kept: list[object] = []
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

    async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        kept.append(r)
        accepted.set_result(w)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    kept.append(server)
    port = server.sockets[0].getsockname()[1]
    kept.extend(await asyncio.open_connection("127.0.0.1", port))
    writer = await asyncio.wait_for(accepted, 5)
    writer.transport.abort()
    await asyncio.sleep(0)  # uvloop closes the handle in a callback
    return writer, kept


def _on_uvloop(scenario: Callable[[], Awaitable[None]]) -> list[dict[str, Any]]:
    """Run `scenario` on uvloop; the loop's unhandled-exception reports."""
    unhandled: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
        await asyncio.wait_for(scenario(), 20)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    return unhandled


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


def test_a_refusal_at_the_connection_limit_to_a_closed_connection_ends_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    codes: list[str] = []
    api = ApiServer(
        node=SimpleNamespace(node_id=0),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=None),  # type: ignore[arg-type]
        clock=SimpleNamespace(now=lambda: 0),  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda _op, code, _s: codes.append(code)),  # type: ignore[arg-type]
        cluster_id="closed",
        client_addresses={},
        connections_max=0,  # every connection is over the limit
    )

    async def scenario() -> None:
        writer, _kept = await _aborted_server_side()
        await api._on_connect(asyncio.StreamReader(), writer)

    with caplog.at_level(logging.DEBUG):
        assert _on_uvloop(scenario) == []
    assert codes == ["LIMIT_EXCEEDED"]  # counted as before
    _no_traceback(caplog)


@pytest.mark.parametrize("path", ["/health", "/metrics", "/nowhere"])
def test_an_http_reply_to_a_closed_connection_ends_quietly(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    status = {
        "node_id": 1,
        "role": "leader",
        "leader": 1,
        "ready": True,
        "lag_ms": 0,
        "applied_index": 7,
        "term": 1,
        "commit_index": 7,
    }
    endpoint = HttpEndpoint(NodeMetrics(1), lambda: status)

    async def scenario() -> None:
        writer, _kept = await _aborted_server_side()
        reader = asyncio.StreamReader()
        reader.feed_data(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        reader.feed_eof()
        await endpoint._respond(reader, writer)

    with caplog.at_level(logging.DEBUG):
        assert _on_uvloop(scenario) == []
    _no_traceback(caplog)
