"""The client's retry policy against docs/protocol.md, op class by failure, on fake nodes.

Each test pins one cell of the table "what the client does when this op meets that failure":
a repeatable op must not give up while another node may answer, and a call's arguments must
say what its caller asked for. Every wait is bounded."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient, protocol
from metastore.daemon.api_limits import MEMBERSHIP_TIMEOUT_MS_DEFAULT
from metastore.errors import (
    ErrorCode,
    LimitExceededError,
    MetastoreError,
    NotReadyError,
    RequestTimeoutError,
    UnavailableError,
)
from raft.framing import encode_frame
from tests.client.fake_node import (
    FRAME_BYTES_MAX,
    TOKEN,
    DropConnection,
    ThreadedFakeNode,
    client,
)


async def test_schema_at_sends_every_wait_the_caller_asks_for(nodes: Any) -> None:
    """`schema_at(timeout_ms=10_000)` left the argument out (a rule meant for membership calls,
    whose CLI default is 10 s, was copied here): the node waited its own default, 5 s, and
    answered TIMEOUT half-way through the wait the caller asked for."""
    node = await nodes()
    async with client(node.endpoint) as c:
        await c.schema_at("ns.t", ts=7, timeout_ms=MEMBERSHIP_TIMEOUT_MS_DEFAULT)
        await c.schema_at("ns.t", ts=7, timeout_ms=2_000)
        await c.schema_at("ns.t", ts=7)
    assert [args for _, _, args in node.requests] == [
        {"table": "ns.t", "ts": 7, "timeout_ms": MEMBERSHIP_TIMEOUT_MS_DEFAULT},
        {"table": "ns.t", "ts": 7, "timeout_ms": 2_000},
        {"table": "ns.t", "ts": 7},
    ]


async def test_a_protection_whose_reply_was_lost_is_asked_again_with_its_record_id(
    nodes: Any,
) -> None:
    """`protect` picks the record id so that a retry after a lost reply finds the same record
    (apply: the same id with the same content is the same record), but the client never
    retried it: a connection lost after the request went out raised "outcome unknown", and
    the Spark bridge's `protect()` block failed with a record perhaps left behind."""

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    async def record(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"record_id": args["record_id"], "ts": args["ts"]}

    a = await nodes(handler=drop)
    b = await nodes(handler=record)
    async with client(a.endpoint, b.endpoint) as c:
        result = await c.protect(1234, tables=["ns.t"])
    assert a.ops == ["pts_protect"] and b.ops == ["pts_protect"]
    sent_ids = {a.requests[0][2]["record_id"], b.requests[0][2]["record_id"]}
    assert sent_ids == {result["record_id"]}


async def test_a_protection_a_forward_lost_is_asked_again_elsewhere(nodes: Any) -> None:
    async def lost(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise UnavailableError(
            "the leader did not answer the forward", details={"outcome_unknown": True}
        )

    async def record(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"record_id": args["record_id"]}

    a = await nodes(handler=lost)
    b = await nodes(handler=record)
    async with client(a.endpoint, b.endpoint) as c:
        result = await c.protect(1234, cluster=True, record_id="backup-1")
    assert result == {"record_id": "backup-1"}
    assert b.ops == ["pts_protect"]


async def test_a_protection_without_record_id_is_not_repeated(nodes: Any) -> None:
    """Without a record id the node picks one per request: a repeat would make a second
    record, so a raw call whose outcome is unknown is not sent again."""

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    a = await nodes(handler=drop)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(UnavailableError) as raised:
            await c.call("pts_protect", {"ts": 1234, "cluster": True})
    assert raised.value.details.get("outcome_unknown") is True
    assert b.ops == []


async def test_the_revocation_list_is_read_again_after_a_lost_connection(nodes: Any) -> None:
    """`cert_revoked` is a read (reader role, it changes nothing) that the client treated as a
    write: a connection lost under it raised "outcome unknown" instead of asking the next
    node."""

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    a = await nodes(handler=drop)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        assert await c.revoked_certs() == {"op": "cert_revoked", "args": {}}
    assert a.ops == ["cert_revoked"] and b.ops == ["cert_revoked"]


# ---- what the client's own errors tell the caller to do --------------------------------------


async def test_a_commit_whose_outcome_is_unknown_says_to_retry_with_its_txn_id(
    nodes: Any,
) -> None:
    """Every node left the commit unknown (a timeout, then a lost connection): the error said
    "its outcome is unknown" and nothing of what to do about it."""

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied within 5000 ms; its outcome is unknown")

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    a = await nodes(handler=timed_out)
    b = await nodes(handler=drop)
    async with client(a.endpoint, b.endpoint, timeout_ms=1500) as c:
        with pytest.raises(MetastoreError) as raised:
            await c.commit("job-7", [{"table": "ns.t", "schema_version": 1}])
    assert raised.value.code in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT)
    assert "retry with the same txn_id 'job-7'" in raised.value.message, raised.value.message


async def test_a_write_that_cannot_be_repeated_says_how_to_check_it(nodes: Any) -> None:
    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    a = await nodes(handler=drop)
    async with client(a.endpoint) as c:
        with pytest.raises(UnavailableError) as raised:
            await c.remove_node(3)
    message = raised.value.message
    assert raised.value.details.get("outcome_unknown") is True
    assert "outcome is unknown" in message
    assert "`metastore cluster status`" in message and "before repeating it" in message, message


async def test_a_cluster_that_answers_nothing_says_to_check_that_it_is_up() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    async with client(dead, timeout_ms=500) as c:
        with pytest.raises(UnavailableError) as raised:
            await c.status()
    message = raised.value.message
    assert message.startswith(f"status failed on every endpoint: {dead}: connection refused")
    assert message.endswith(protocol.CHECK_CLUSTER_HINT), message


async def test_a_call_out_of_time_says_what_to_do(nodes: Any) -> None:
    async def silent(op: str, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.Event().wait()  # never answers; the call's deadline ends it
        raise AssertionError("unreachable")

    node = await nodes(handler=silent)
    async with client(node.endpoint, timeout_ms=300) as c:
        with pytest.raises(RequestTimeoutError) as read:
            await c.call("describe", {"table": "ns.t"})
        with pytest.raises(RequestTimeoutError) as ddl:
            await c.ddl("CREATE NAMESPACE x", request_id="rid-9")
    assert read.value.message.startswith("describe did not complete within 300 ms")
    assert protocol.CHECK_CLUSTER_HINT in read.value.message
    assert "--timeout-ms" in read.value.message, read.value.message
    assert "retry with the same request_id 'rid-9'" in ddl.value.message, ddl.value.message


async def test_a_ddl_with_an_empty_request_id_is_not_repeated(nodes: Any) -> None:
    """The node keeps no record of an empty request id (`request_id or ""`: no de-duplication),
    so such a DDL is not repeatable; any str passed for one, the empty one too, made it so."""

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    a = await nodes(handler=drop)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(UnavailableError) as raised:
            await c.call("ddl", {"sql": "CREATE NAMESPACE x", "request_id": ""})
    assert raised.value.details.get("outcome_unknown") is True
    assert b.ops == []


async def test_a_pin_without_a_session_is_a_read_whose_outcome_is_never_unknown(
    nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `pin` without `session_id` leases nothing (reader role): it is a read. A connection
    lost under it made the call end in "its outcome is unknown" once no node answered, as for
    a write, and its own TIMEOUT was failed over as a write's unknown outcome instead of being
    raised as the read's wait bound."""

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    async def not_ready(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotReadyError("no leader yet")

    async def waited(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("safe time did not reach 123 within 5000 ms")

    monkeypatch.setattr(protocol, "RETRY_BACKOFF_MS_MAX", protocol.RETRY_BACKOFF_MS_MIN)
    a = await nodes(handler=drop)
    b = await nodes(handler=not_ready)
    c_node = await nodes(handler=waited)
    async with client(a.endpoint, b.endpoint, timeout_ms=1500) as c:
        with pytest.raises(MetastoreError) as raised:
            await c.pin(["ns.t"], ts=123)
        assert raised.value.details.get("outcome_unknown") is not True, raised.value
        assert "outcome" not in raised.value.message, raised.value.message
    asked_b = len(b.ops)
    async with client(c_node.endpoint, b.endpoint) as c:
        with pytest.raises(RequestTimeoutError, match="safe time did not reach"):
            await c.pin(["ns.t"], ts=123)
    assert c_node.ops == ["pin"] and len(b.ops) == asked_b


async def test_a_closed_client_says_to_make_a_new_one(nodes: Any) -> None:
    """A closed client's UNAVAILABLE (retryable) read as "try again", which on the same
    client fails the same way every time."""
    node = await nodes()
    c = client(node.endpoint)
    await c.aclose()
    with pytest.raises(UnavailableError) as raised:
        await c.status()
    assert "make a new client" in raised.value.message, raised.value.message


def test_a_sync_client_closed_during_a_write_says_its_outcome_is_unknown() -> None:
    entered = threading.Event()

    async def hold(op: str, args: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        await asyncio.Event().wait()  # never answers; the client's close ends the call
        raise AssertionError("unreachable")

    with ThreadedFakeNode(handler=hold) as node:
        c = SyncMetastoreClient([node.endpoint], TOKEN, timeout_ms=5000)
        failed: list[BaseException] = []

        def commit() -> None:
            try:
                c.commit("job-8", [{"table": "ns.t", "schema_version": 1}])
            except BaseException as exc:  # noqa: BLE001 - the test reads it below
                failed.append(exc)

        caller = threading.Thread(target=commit)
        caller.start()
        try:
            assert entered.wait(5), "the commit never reached the node"
        finally:
            c.close()
            caller.join(5)
    assert not caller.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], UnavailableError), failed
    message = failed[0].message
    assert "closed during the call" in message and "outcome" in message, message


async def test_a_request_too_large_to_send_says_to_split_it(nodes: Any) -> None:
    node = await nodes()
    async with client(node.endpoint) as c:
        with pytest.raises(LimitExceededError) as raised:
            await c.call(
                "commit", {"txn_id": "t", "writes": [{"table": "ns.t", "p": "x" * 5_000_000}]}
            )
    assert raised.value.details["limit"] == "CLIENT_FRAME_BYTES_MAX"
    assert "split" in raised.value.message, raised.value.message
    assert node.ops == []


async def test_a_malformed_reply_says_whose_bug_it_is(nodes: Any) -> None:
    async def not_a_map(op: str, args: dict[str, Any]) -> Any:
        return ["not", "a", "map"]

    node = await nodes(handler=not_a_map)
    async with client(node.endpoint) as c:
        with pytest.raises(UnavailableError) as raised:
            await c.status()
    assert "malformed reply" in raised.value.message
    assert "report it" in raised.value.message, raised.value.message


async def test_a_node_at_its_connection_limit_is_passed_over_for_the_next(nodes: Any) -> None:
    """A node with `client_connections_max` connections open answers a new one with a
    LIMIT_EXCEEDED frame of id 0 and closes it (docs/protocol.md): nothing was sent to it, so
    any op, a write that cannot be repeated too, goes on to the next node; with no other node
    the error names the refusal."""

    async def full(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        error = {
            "code": "LIMIT_EXCEEDED",
            "message": "too many client connections (client_connections_max=2)",
            "retryable": False,
            "details": {},
        }
        reply = {"id": 0, "ok": False, "result": None, "error": error, "ts": 0, "node_id": 9}
        writer.write(encode_frame(reply, max_frame_bytes=FRAME_BYTES_MAX))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(full, "127.0.0.1", 0)
    try:
        busy = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        b = await nodes()
        async with client(busy, b.endpoint) as c:
            assert (await c.remove_node(3))["op"] == "remove_node"
        assert b.ops == ["remove_node"]
        async with client(busy, timeout_ms=500) as c:
            with pytest.raises(UnavailableError) as raised:
                # `call` itself: remove_node() gives the leader's 10 s wait room.
                await c.call("remove_node", {"node_id": 3})
        assert "LIMIT_EXCEEDED" in raised.value.message, raised.value.message
        assert raised.value.details.get("outcome_unknown") is not True
    finally:
        server.close()
        await server.wait_closed()
