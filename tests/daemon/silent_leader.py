"""A leader that accepts connections and never answers, not even the hello, for forward tests.

A forward to it cannot open its link: its connect succeeds and its hello waits. Both
tests/daemon/test_forward_timeout_outcome.py (the link's own hello bound) and
tests/daemon/test_forward_deadline.py (the caller's shorter timeout) start from it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from hlc import HybridClock, SystemClock
from metastore.daemon.forward import LeaderForwarder


@contextlib.asynccontextmanager
async def forwarder_to_a_silent_leader() -> AsyncIterator[tuple[LeaderForwarder, asyncio.Event]]:
    """A forwarder whose leader (node 1) listens on 127.0.0.1 and never answers, and an event
    set once that leader accepted a connection; both closed on exit."""
    accepted = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        with contextlib.suppress(Exception):
            await reader.read()  # until the forwarder gives up and closes
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    forwarder = LeaderForwarder(
        addresses={1: ("127.0.0.1", port)}, clock=HybridClock(SystemClock())
    )
    try:
        yield forwarder, accepted
    finally:
        await forwarder.close()
        server.close()
        await server.wait_closed()
