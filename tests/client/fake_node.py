"""A tiny metastore node speaking docs/protocol.md on a real socket, for client and CLI tests.

It implements the protocol's connection rules (hello first, token check, replies matched by id,
each request handled in its own task so replies can come back out of order) and delegates each
op to a test-supplied async handler that returns a result map or raises a `MetastoreError`
(sent as the reply's error). Special outcomes: raise `DropConnection` to close the connection
without replying; await forever to never reply.

Written from the protocol document, independently of the client, so a change on one side only
is caught. `ThreadedFakeNode` runs one in a background event loop for synchronous tests (CLI).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hlc import HybridClock, OffsetClock, SystemClock
from metastore.client import MetastoreClient
from metastore.errors import MetastoreError, UnauthenticatedError
from raft.framing import NEED_DATA, FrameDecoder, encode_frame

FRAME_BYTES_MAX = 4 * 1024 * 1024
TOKEN = "test-token-admin-0123456789"
Handler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class DropConnection(Exception):
    """Raised by a handler: close the connection instead of replying."""


class RawError(Exception):
    """Raised by a handler: reply with this exact `error` map."""

    def __init__(self, wire: dict[str, Any]) -> None:
        super().__init__(wire)
        self.wire = wire


async def default_handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"op": op, "args": args}


@dataclass
class FakeNode:
    node_id: int = 1
    handler: Handler = default_handler
    tokens: frozenset[str] = frozenset({TOKEN})
    # Shifts the node's clock: its reply `ts` runs ahead of (or behind) the test's clock.
    clock_offset_ms: int = 0
    # Extra fields of the hello result (e.g. a capability a newer daemon advertises).
    hello_extra: dict[str, Any] = field(default_factory=dict)
    # Every request after hello, in arrival order, as (connection number, op, args).
    requests: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    hellos: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    # Set each time a connection ends (the test clears it to wait for the next).
    connection_closed: asyncio.Event = field(default_factory=asyncio.Event)
    inflight: int = 0
    max_inflight: int = 0
    last_ts: int = 0
    _server: asyncio.base_events.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.clock = HybridClock(OffsetClock(SystemClock(), self.clock_offset_ms))

    @property
    def ops(self) -> list[str]:
        return [op for _, op, _ in self.requests]

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.endpoint = f"127.0.0.1:{port}"
        return self.endpoint

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            await self._server.wait_closed()

    async def wait_for_no_connections(self, timeout_s: float = 10.0) -> int:
        """How many connections remain once every one is gone (TimeoutError past
        `timeout_s`): the node sees each close as its connection ends."""
        async with asyncio.timeout(timeout_s):
            while self._writers:
                await self.connection_closed.wait()
                self.connection_closed.clear()
        return len(self._writers)

    def _reply(self, request_id: int, result: Any = None, error: Any = None) -> bytes:
        self.last_ts = self.clock.now()
        reply = {
            "id": request_id,
            "ok": error is None,
            "result": result,
            "error": error,
            "ts": self.last_ts,
            "node_id": self.node_id,
        }
        return encode_frame(reply, max_frame_bytes=FRAME_BYTES_MAX)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        self._writers.add(writer)
        decoder = FrameDecoder(FRAME_BYTES_MAX)
        tasks: set[asyncio.Task[None]] = set()
        authed = False
        try:
            while data := await reader.read(65536):
                decoder.feed(data)
                while (req := decoder.next_frame()) is not NEED_DATA:
                    assert isinstance(req, dict)
                    rid, op, args = req["id"], req["op"], req["args"]
                    if not authed:
                        self.hellos.append({"op": op, **args})
                        if op != "hello" or args.get("token") not in self.tokens:
                            err = UnauthenticatedError("missing or unknown token").to_wire()
                            writer.write(self._reply(rid, error=err))
                            await writer.drain()
                            return
                        authed = True
                        hello = {
                            "node_id": self.node_id,
                            "cluster_id": "test",
                            "role": "admin",
                            "server_version": "fake",
                            **self.hello_extra,
                        }
                        writer.write(self._reply(rid, hello))
                        continue
                    self.requests.append((conn, op, args))
                    task = asyncio.create_task(self._handle(writer, rid, op, args))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            self._writers.discard(writer)
            writer.close()
            self.connection_closed.set()

    async def _handle(
        self, writer: asyncio.StreamWriter, rid: int, op: str, args: dict[str, Any]
    ) -> None:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            try:
                result = await self.handler(op, args)
            except MetastoreError as exc:
                frame = self._reply(rid, error=exc.to_wire())
            except RawError as exc:
                frame = self._reply(rid, error=exc.wire)
            except DropConnection:
                writer.close()
                return
            else:
                frame = self._reply(rid, result)
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(frame)
                await writer.drain()
        finally:
            self.inflight -= 1


class ThreadedFakeNode:
    """A FakeNode on its own event loop thread, for tests that block (CliRunner)."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.node = FakeNode(**kwargs)
        self.endpoint = self._run(self.node.start())

    def _run(self, coro: Awaitable[Any]) -> Any:
        async def wrap() -> Any:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result(timeout=10)

    def close(self) -> None:
        self._run(self.node.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> ThreadedFakeNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def observe_waits_for_a_slot(slots: asyncio.Semaphore) -> asyncio.Event:
    """An event set when a request finds every one of `slots` taken (a client connection's or a
    forward link's in-flight slots): it then waits, unsent, since a request is written only once
    it holds a slot. A proof by event, where a pause would pass under load whether or not the
    request went out."""
    acquire = slots.acquire
    no_free_slot = asyncio.Event()

    async def observed_acquire() -> bool:
        if slots.locked():
            no_free_slot.set()
        return await acquire()

    slots.acquire = observed_acquire  # type: ignore[method-assign,assignment]
    return no_free_slot


def client(*endpoints: str, **kwargs: Any) -> MetastoreClient:
    """A client of these fake nodes: TOKEN (or `token=`) and a 3 s timeout unless given."""
    kwargs.setdefault("timeout_ms", 3000)
    return MetastoreClient(list(endpoints), kwargs.pop("token", TOKEN), **kwargs)
