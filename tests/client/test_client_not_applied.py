"""A write cut by the client's deadline says whether it can have been applied, on fake nodes.

The deadline was always reported "outcome unknown", even when the request never left the
client (the deadline passed while it connected, or while it waited for a free slot on its
connection): the caller went looking for a change that cannot have happened, or, for a write
that cannot be repeated blindly (membership), had to check the cluster first. Now such a write
raises NotAppliedTimeoutError (TIMEOUT, `details.not_applied`), safe to repeat; a write that
was sent keeps "outcome unknown" and the key to repeat it with. Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from metastore.client import protocol
from metastore.daemon.api_limits import CLIENT_INFLIGHT_PER_CONNECTION_MAX
from metastore.errors import (
    BadRequestError,
    InvalidArgumentError,
    NotAppliedTimeoutError,
    NotLeaderError,
    RequestTimeoutError,
    UnavailableError,
)
from tests.client.fake_node import DropConnection, client, observe_waits_for_a_slot


@contextlib.asynccontextmanager
async def silent_listener() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A socket that accepts connections and never answers (a node that hangs, or a proxy that
    accepts and holds): a client's hello on it waits. Yields its endpoint and an event set once
    a connection was accepted."""
    accepted = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []
    holders: set[asyncio.Task[Any]] = set()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        holders.add(task)
        writers.append(writer)
        accepted.set()
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted
    finally:
        server.close()
        for w in writers:
            w.close()
        if holders:  # each ends at its connection's end (its reader sees EOF)
            await asyncio.wait(holders, timeout=5)
        await server.wait_closed()


async def test_a_write_cut_while_connecting_was_not_applied() -> None:
    """A DDL's deadline (300 ms) passes while the node it connects to holds the hello (the
    client's own hello bound is 1 s): it said "its outcome is unknown"."""
    assert protocol.HELLO_TIMEOUT_MS > 300
    async with silent_listener() as (endpoint, accepted), client(endpoint, timeout_ms=300) as c:
        with pytest.raises(RequestTimeoutError) as raised:
            await c.call("ddl", {"sql": "CREATE NAMESPACE x", "request_id": "rid-1"})
        assert accepted.is_set()
    error = raised.value
    assert isinstance(error, NotAppliedTimeoutError), error
    assert error.details["not_applied"] is True and error.details["sent"] is False
    assert "outcome_unknown" not in error.details
    assert "it was not applied (its request never left this client)" in error.message
    assert "deadline passed while connecting" in error.message, error.message
    assert "repeating it is safe" in error.message
    assert "outcome is unknown" not in error.message


async def test_a_membership_change_cut_while_connecting_says_it_can_be_repeated() -> None:
    """A write that is not repeatable (add_node) sent nowhere: "check with `metastore cluster
    status` before repeating it" sent its caller to look for a change that cannot exist."""
    async with silent_listener() as (endpoint, _), client(endpoint, timeout_ms=300) as c:
        with pytest.raises(NotAppliedTimeoutError) as raised:
            await c.call("add_node", {"node_id": 4, "raft_address": "127.0.0.1:9"})
    assert "repeating it is safe" in raised.value.message
    assert protocol.MEMBERSHIP_OUTCOME_HINT not in raised.value.message


async def test_a_write_cut_while_waiting_for_a_free_slot_was_not_applied(nodes: Any) -> None:
    """Every in-flight slot of the connection is held by slow reads: the write waits, unsent,
    for one, and its deadline passes there."""
    release = asyncio.Event()
    all_held = asyncio.Event()

    async def slow_reads(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "describe":
            if node.ops.count("describe") == CLIENT_INFLIGHT_PER_CONNECTION_MAX:
                all_held.set()
            await release.wait()
        return {"op": op}  # liveness probes (safe_time) answer at once

    node = await nodes(handler=slow_reads)
    async with client(node.endpoint, timeout_ms=5_000) as c:
        conn = await c._connection(node.endpoint)
        no_free_slot = observe_waits_for_a_slot(conn._slots)
        reads = [
            asyncio.create_task(c.call("describe", {"table": "ns.t"}))
            for _ in range(CLIENT_INFLIGHT_PER_CONNECTION_MAX)
        ]
        try:
            async with asyncio.timeout(10):
                await all_held.wait()
            write = asyncio.create_task(
                c.call("ddl", {"sql": "CREATE NAMESPACE x", "request_id": "rid-2"}, timeout_ms=400)
            )
            async with asyncio.timeout(10):
                await no_free_slot.wait()
            with pytest.raises(NotAppliedTimeoutError) as raised:
                await write
        finally:
            release.set()
            await asyncio.gather(*reads, return_exceptions=True)
    assert "ddl" not in node.ops
    assert "deadline passed while waiting for a free slot" in raised.value.message


async def test_a_write_refused_unseen_then_cut_while_connecting_was_not_applied(
    nodes: Any,
) -> None:
    """One node answered NOT_LEADER (it did nothing), the next held the hello past the
    deadline: no node can run the write, so it was not applied."""

    async def not_leader(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotLeaderError("not the leader", details={"leader": 0})

    a = await nodes(handler=not_leader)
    async with silent_listener() as (held, accepted), client(a.endpoint, held, timeout_ms=600) as c:
        with pytest.raises(NotAppliedTimeoutError) as raised:
            await c.call("ddl", {"sql": "CREATE NAMESPACE x", "request_id": "rid-3"})
        assert accepted.is_set()
    assert a.ops == ["ddl"]
    assert raised.value.details["sent"] is True
    assert "every node that received it answered that it did nothing" in raised.value.message


async def test_a_write_sent_and_unanswered_keeps_its_outcome_unknown_and_key(
    nodes: Any,
) -> None:
    async def silent(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "status":
            return {}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    node = await nodes(handler=silent)
    async with client(node.endpoint, timeout_ms=30_000) as c:
        # Connected first: with the connect inside the DDL's 300 ms, a loaded machine spent
        # them connecting and the write was rightly NOT_APPLIED (never sent), not the case here.
        await c.status()
        with pytest.raises(RequestTimeoutError) as raised:
            await c.call(
                "ddl", {"sql": "CREATE NAMESPACE x", "request_id": "rid-4"}, timeout_ms=300
            )
    assert node.ops[:2] == ["status", "ddl"]  # the DDL went out
    error = raised.value
    assert not isinstance(error, NotAppliedTimeoutError)
    assert error.details["outcome_unknown"] is True
    assert error.details["request_id"] == "rid-4"
    assert "retry with the same request_id 'rid-4'" in error.message


async def test_a_nodes_own_timeout_raised_as_is_says_the_outcome_is_unknown_and_its_key(
    nodes: Any,
) -> None:
    """Every node answered TIMEOUT to the DDL (a leader that lost its quorum with the proposal
    pending) until no round was left: the node's TIMEOUT was raised as is, without
    `outcome_unknown` or the key to repeat it with, so the CLI could not name the command that
    settles it."""

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied within 5000 ms; its outcome is unknown")

    node = await nodes(handler=timed_out)
    async with client(node.endpoint, timeout_ms=1500) as c:
        with pytest.raises(RequestTimeoutError) as raised:
            await c.call("ddl", {"sql": "CREATE NAMESPACE x", "request_id": "rid-5"})
    assert raised.value.details["outcome_unknown"] is True
    assert raised.value.details["request_id"] == "rid-5"


async def test_a_node_refusing_a_write_left_unknown_as_a_node_does_not_end_the_call(
    nodes: Any,
) -> None:
    """A rolling upgrade: the first node timed out on the DDL (outcome unknown), the second,
    of an older release, refuses an argument it does not know (BAD_REQUEST: no verdict on the
    DDL). The call ended there "outcome unknown", though the third node, asked with the same
    request id, settles it (the cluster applies a request id once)."""

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied within 5000 ms; its outcome is unknown")

    async def older(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise BadRequestError("unknown arguments ['min_ts']")

    async def settles(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"request_id": args["request_id"], "deduplicated": True}

    a = await nodes(handler=timed_out)
    b = await nodes(handler=older)
    c_node = await nodes(handler=settles)
    async with client(a.endpoint, b.endpoint, c_node.endpoint, timeout_ms=5000) as c:
        result = await c.call("ddl", {"sql": "CREATE NAMESPACE x", "request_id": "rid-6"})
    assert result == {"request_id": "rid-6", "deduplicated": True}
    assert a.ops == b.ops == c_node.ops == ["ddl"]


# ---- cert_revoke is repeated like the other keyed writes -------------------------------------


async def test_a_revocation_whose_reply_was_lost_is_asked_again_with_its_request_id(
    nodes: Any,
) -> None:
    """`cert_revoke` was never repeated: a connection lost after the request went out raised
    "outcome unknown", though a revocation is permanent and the cluster applies a request id
    once. Now the client sends one and asks the next node with it."""

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    async def revoked(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"fingerprint": args["fingerprint"], "revoked": [], "deduplicated": True}

    a = await nodes(handler=drop)
    b = await nodes(handler=revoked)
    fp = "ab" * 32
    async with client(a.endpoint, b.endpoint) as c:
        result = await c.revoke_cert(fp, node_id=3)
    assert result["deduplicated"] is True
    assert a.ops == ["cert_revoke"] and b.ops == ["cert_revoke"]
    sent = [args for _, _, args in a.requests + b.requests]
    assert sent[0] == sent[1] and sent[0]["request_id"], sent
    assert sent[0]["fingerprint"] == fp and sent[0]["node_id"] == 3


async def test_a_revocation_repeat_refused_as_in_use_leaves_the_outcome_unknown(
    nodes: Any,
) -> None:
    """The node asked second refuses the repeat because it sees the certificate on a live
    link: a check on its own view before proposing, not a verdict on the first attempt,
    which may still be applied. Raised as is it read "not revoked"."""

    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    async def in_use(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise InvalidArgumentError("in use by node(s) 3", details={"in_use_by": [3]})

    a = await nodes(handler=drop)
    b = await nodes(handler=in_use)
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(UnavailableError) as raised:
            await c.revoke_cert("cd" * 32, request_id="rev-1")
    error = raised.value
    assert error.details["outcome_unknown"] is True
    assert error.details["request_id"] == "rev-1"
    assert "retry with the same request_id 'rev-1'" in error.message, error.message


async def test_a_revocation_refused_as_in_use_at_once_is_raised_as_is(nodes: Any) -> None:
    async def in_use(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise InvalidArgumentError("in use by node(s) 3", details={"in_use_by": [3]})

    a = await nodes(handler=in_use)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(InvalidArgumentError):
            await c.revoke_cert("cd" * 32)
    assert b.ops == []
