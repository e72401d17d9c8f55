"""A write whose client goes away mid-request is still audited.

The server cancels a closed connection's requests. The audit record of a writer or admin
request was written only once its handler returned or raised, so a cancelled one left no
record at all, though the change may well have happened: a proposal already in the log
commits whatever its caller does, and `gc_run` and `remove_node` run to their end detached
(their caller gone). An operator reading audit.log saw no trace of who changed it. Such a
request is now recorded with the outcome CANCELLED (its effect unknown to the node), and a
detached one with the outcome it reached once it ends. ApiServer's request path against
fakes, no node started."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from metastore.daemon import api_limits as L
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from raft.framing import encode_frame

FRAME_MAX = L.CLIENT_FRAME_BYTES_MAX


class _Audit:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.recorded = asyncio.Event()

    def record(self, **fields: Any) -> bool:
        self.records.append(fields)
        self.recorded.set()
        return True

    def close(self) -> None:
        pass


class _Gc:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.go_on = asyncio.Event()

    async def run(self, table: object, *, dry_run: bool) -> dict[str, Any]:
        self.started.set()
        await self.go_on.wait()
        return {"tables": []}


def _api(gc: _Gc, audit: _Audit, metrics: list[tuple[str, str]]) -> ApiServer:
    node = SimpleNamespace(node_id=1, is_leader=lambda: True, ready_to_serve=True, safe_time=0)
    return ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=None),  # type: ignore[arg-type]
        clock=SimpleNamespace(now=lambda: 1),  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda op, code, _s: metrics.append((op, code))),  # type: ignore[arg-type]
        cluster_id="audit",
        client_addresses={},
        gc=gc,  # type: ignore[arg-type]
        audit=audit,  # type: ignore[arg-type]
    )


async def _cancelled_mid_request(op: str, started: asyncio.Event, api: ApiServer) -> None:
    session = Session(peer="127.0.0.1:5", role=Role.ADMIN, client="ops", token_name="admin")
    sent: list[bytes] = []

    async def send(frame: bytes) -> None:
        sent.append(frame)

    request = asyncio.create_task(api._run_request(session, {"id": 7, "op": op, "args": {}}, send))
    await asyncio.wait_for(started.wait(), 5)
    request.cancel()  # its client closed the connection
    await asyncio.gather(request, return_exceptions=True)
    assert request.cancelled()
    assert sent == []  # nobody to reply to


def test_a_gc_run_whose_caller_went_away_is_audited_with_its_outcome() -> None:
    async def scenario() -> tuple[list[Any], list[dict[str, Any]], list[tuple[str, str]]]:
        gc, audit, metrics = _Gc(), _Audit(), []
        api = _api(gc, audit, metrics)
        api._require_ready = lambda: None  # type: ignore[method-assign]
        await _cancelled_mid_request("gc_run", gc.started, api)
        while_running = list(audit.records)  # it goes on: its outcome is not known yet
        gc.go_on.set()
        await asyncio.wait_for(asyncio.gather(*api._detached), 5)
        await api.stop()
        return while_running, audit.records, metrics

    while_running, records, metrics = asyncio.run(scenario())
    assert while_running == []
    assert [(r["op"], r["outcome"], r["client"], r["token_name"]) for r in records] == [
        ("gc_run", "OK", "ops", "admin")
    ]
    assert metrics == [("gc_run", "OK")]


def test_a_detached_gc_run_cut_by_the_node_stopping_is_audited_as_cancelled() -> None:
    async def scenario() -> list[dict[str, Any]]:
        gc, audit = _Gc(), _Audit()
        api = _api(gc, audit, [])
        api._require_ready = lambda: None  # type: ignore[method-assign]
        await _cancelled_mid_request("gc_run", gc.started, api)
        await api.stop(detached_grace_ms=0)  # cancels the detached run, then closes the log
        return audit.records

    assert [(r["op"], r["outcome"]) for r in asyncio.run(scenario())] == [("gc_run", "CANCELLED")]


def test_a_write_whose_caller_went_away_is_audited() -> None:
    async def scenario() -> list[dict[str, Any]]:
        audit = _Audit()
        api = _api(_Gc(), audit, [])
        proposed = asyncio.Event()

        async def propose(_session: Session, _cmd: object, _timeout_ms: int) -> dict[str, Any]:
            proposed.set()  # in the log: it commits whatever its caller does
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        api._propose_command = propose  # type: ignore[method-assign]
        session_args = {"session_id": "s-1"}
        session = Session(peer="127.0.0.1:5", role=Role.WRITER, client="job", token_name="w")
        request = asyncio.create_task(
            api._run_request(
                session, {"id": 3, "op": "session_close", "args": session_args}, _no_send
            )
        )
        await asyncio.wait_for(proposed.wait(), 5)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        await api.stop()
        return audit.records

    records = asyncio.run(scenario())
    assert [(r["op"], r["outcome"], r["args"].get("session_id")) for r in records] == [
        ("session_close", "CANCELLED", "s-1")
    ]


async def _no_send(_frame: bytes) -> None:
    raise AssertionError("a cancelled request sends no reply")


class _ClosingAudit(_Audit):
    """Records written after `close` are lost (a real AuditLog has no handler then)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.lost: list[dict[str, Any]] = []

    def record(self, **fields: Any) -> bool:
        (self.lost if self.closed else self.records).append(fields)
        return True

    def close(self) -> None:
        self.closed = True


async def _served_write_in_flight(
    audit: _Audit,
) -> tuple[ApiServer, asyncio.StreamReader, asyncio.StreamWriter]:
    """An ApiServer on a real socket, with a client whose `session_close` is in the log
    (its proposal waits for ever)."""
    api = _api(_Gc(), audit, [])
    api.secrets = SimpleNamespace(  # type: ignore[assignment]
        record_for=lambda token: (
            SimpleNamespace(role=Role.WRITER, name="w") if token == "tok" else None
        )
    )
    proposed = asyncio.Event()

    async def propose(_session: Session, _cmd: object, _timeout_ms: int) -> dict[str, Any]:
        proposed.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    api._propose_command = propose  # type: ignore[method-assign]
    await api.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.bound_port)
    hello = {"id": 1, "op": "hello", "args": {"token": "tok", "client": "job"}}
    close = {"id": 2, "op": "session_close", "args": {"session_id": "s-9"}}
    writer.write(encode_frame(hello, max_frame_bytes=FRAME_MAX))
    writer.write(encode_frame(close, max_frame_bytes=FRAME_MAX))
    await writer.drain()
    await asyncio.wait_for(proposed.wait(), 5)
    return api, reader, writer


def test_a_real_client_closing_its_socket_mid_write_is_audited() -> None:
    async def scenario() -> list[dict[str, Any]]:
        audit = _Audit()
        api, _reader, writer = await _served_write_in_flight(audit)
        writer.close()  # the client goes away
        await writer.wait_closed()
        # The server sees the end of the stream, then cancels the request.
        await asyncio.wait_for(audit.recorded.wait(), 5)
        await api.stop()
        return audit.records

    records = asyncio.run(scenario())
    assert [(r["op"], r["outcome"], r["client"]) for r in records] == [
        ("session_close", "CANCELLED", "job")
    ]


def test_a_write_in_flight_when_the_node_stops_is_audited_before_the_log_closes() -> None:
    async def scenario() -> _ClosingAudit:
        audit = _ClosingAudit()
        api, _reader, writer = await _served_write_in_flight(audit)
        await api.stop()
        writer.close()
        return audit

    audit = asyncio.run(scenario())
    assert audit.lost == []
    assert [(r["op"], r["outcome"]) for r in audit.records] == [("session_close", "CANCELLED")]


class _SlowGc(_Gc):
    """A run that takes a moment after it started (its work, not a synchronisation)."""

    async def run(self, table: object, *, dry_run: bool) -> dict[str, Any]:
        self.started.set()
        await asyncio.sleep(0.05)
        return {"tables": []}


def test_a_graceful_stop_lets_detached_work_finish_within_its_grace() -> None:
    """The node stopping cancelled detached work at once: a SIGTERM between a removal and its
    certificate revocation left the removed member's certificate accepted. A stop now waits
    for it (at most L.DETACHED_WORK_STOP_GRACE_MS) before it cancels anything."""

    async def scenario() -> list[dict[str, Any]]:
        gc, audit = _SlowGc(), _Audit()
        api = _api(gc, audit, [])
        api._require_ready = lambda: None  # type: ignore[method-assign]
        await _cancelled_mid_request("gc_run", gc.started, api)
        await api.stop()  # the default: a graceful stop
        return audit.records

    assert [(r["op"], r["outcome"]) for r in asyncio.run(scenario())] == [("gc_run", "OK")]
    assert 1_000 <= L.DETACHED_WORK_STOP_GRACE_MS <= 10_000  # a few seconds


def test_a_stop_cancels_detached_work_left_after_its_grace_and_names_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], float]:
        gc, audit = _Gc(), _Audit()  # never ends by itself
        api = _api(gc, audit, [])
        api._require_ready = lambda: None  # type: ignore[method-assign]
        await _cancelled_mid_request("gc_run", gc.started, api)
        began = time.monotonic()
        await asyncio.wait_for(api.stop(detached_grace_ms=100), 5)
        return audit.records, time.monotonic() - began

    with caplog.at_level(logging.WARNING, logger="metastore.api"):
        records, took_s = asyncio.run(scenario())
    assert [(r["op"], r["outcome"]) for r in records] == [("gc_run", "CANCELLED")]
    # asyncio may fire a timer up to its clock resolution early (0.09994 s seen): not 0.1.
    assert 0.09 <= took_s < 2
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "gc_run" in warning.getMessage()


def test_a_stop_told_to_hurry_ends_the_grace_at_once() -> None:
    """SIGINT (`stop_now`) during a SIGTERM's grace cuts it short, as it cuts the hand-over."""

    async def scenario() -> tuple[list[dict[str, Any]], float]:
        gc, audit = _Gc(), _Audit()
        api = _api(gc, audit, [])
        api._require_ready = lambda: None  # type: ignore[method-assign]
        await _cancelled_mid_request("gc_run", gc.started, api)
        hurry = asyncio.Event()
        stopping = asyncio.create_task(api.stop(detached_grace_ms=60_000, cut_short=hurry))
        hurry.set()
        began = time.monotonic()
        await asyncio.wait_for(stopping, 5)
        return audit.records, time.monotonic() - began

    records, took_s = asyncio.run(scenario())
    assert [(r["op"], r["outcome"]) for r in records] == [("gc_run", "CANCELLED")]
    assert took_s < 2
