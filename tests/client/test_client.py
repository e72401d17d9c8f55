"""MetastoreClient against fake nodes on real sockets: hello, pipelining, failover, timeouts,
typed errors, retry safety and the HLC fed from replies. Every wait is bounded."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any, ClassVar

import pytest

from hlc import HybridClock, SystemClock, physical_ms
from metastore.client import (
    ATTEMPTS_MAX,
    MetastoreClient,
    SyncMetastoreClient,
    parse_endpoint,
    protocol,
)
from metastore.daemon.api_limits import (
    CLIENT_INFLIGHT_PER_CONNECTION_MAX,
    CLIENT_REPLY_ITEMS_MAX,
    MEMBERSHIP_TIMEOUT_MS_DEFAULT,
)
from metastore.errors import (
    ErrorCode,
    InvalidArgumentError,
    InvalidDdlError,
    MetastoreError,
    NotLeaderError,
    NotReadyError,
    RequestTimeoutError,
    TableNotFoundError,
    TimestampAheadError,
    UnauthenticatedError,
    UnavailableError,
    UnknownError,
    error_class,
)
from tests.client.fake_node import (
    TOKEN,
    DropConnection,
    FakeNode,
    RawError,
    ThreadedFakeNode,
    client,
)


def dead_endpoint() -> str:
    """An address nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


# ---- connection basics ---------------------------------------------------------------------


async def test_hello_comes_first_and_carries_token_and_client_name(nodes: Any) -> None:
    node = await nodes()
    async with client(node.endpoint, client_name="unit-test") as c:
        result = await c.status()
    assert result == {"op": "status", "args": {}}
    assert node.hellos[0]["op"] == "hello"
    assert node.hellos[0]["token"] == TOKEN
    assert node.hellos[0]["client"].startswith("unit-test")
    assert node.ops == ["status"]


async def test_a_token_read_from_its_file_with_the_newline_is_sent_without_it(
    nodes: Any,
) -> None:
    """`token=open(token_file).read()` keeps the file's newline; it was sent as is and refused
    as "missing or unknown token". A token is one word (secrets.read_token_file strips it)."""
    node = await nodes()
    async with client(node.endpoint, token=f"{TOKEN}\n") as c:
        await c.status()
    assert node.hellos[0]["token"] == TOKEN


async def test_methods_send_the_protocol_args(nodes: Any) -> None:
    node = await nodes()
    async with client(node.endpoint) as c:
        await c.schema_at("ns.t", ts=123, timeout_ms=2000)
        await c.schema_at("ns.t")
        await c.describe("ns.t", as_of=5)
        await c.history("ns.t")
        await c.list_namespaces()
        await c.list_tables("ns", as_of=7)
        await c.safe_time()
        await c.ddl("CREATE NAMESPACE x", request_id="rid-1")
        await c.add_node(4, "h:1", learner=False)
        await c.promote_node(4)
        await c.remove_node(4)
        await c.transfer_leader(2)
        await c.create_namespace("we`ird", comment="it's", if_not_exists=True)
        await c.drop_namespace("x", if_exists=True, cascade=True)
    assert [(op, args) for _, op, args in node.requests] == [
        ("schema_at", {"table": "ns.t", "ts": 123, "timeout_ms": 2000}),
        ("schema_at", {"table": "ns.t"}),
        ("describe", {"table": "ns.t", "as_of": 5}),
        ("history", {"table": "ns.t", "limit": 1000}),
        ("list_namespaces", {"limit": 1000}),
        ("list_tables", {"namespace": "ns", "as_of": 7, "limit": 5000}),
        ("safe_time", {}),
        ("ddl", {"sql": "CREATE NAMESPACE x", "request_id": "rid-1"}),
        ("add_node", {"node_id": 4, "raft_address": "h:1", "learner": False}),
        ("promote_node", {"node_id": 4}),
        ("remove_node", {"node_id": 4}),
        ("transfer_leader", {"target": 2}),
        (
            "ddl",
            {
                "sql": "CREATE NAMESPACE IF NOT EXISTS `we``ird` COMMENT 'it\\'s'",
                "request_id": node.requests[12][2]["request_id"],
            },
        ),
        (
            "ddl",
            {
                "sql": "DROP NAMESPACE IF EXISTS `x` CASCADE",
                "request_id": node.requests[13][2]["request_id"],
            },
        ),
    ]


async def test_ddl_gets_a_fresh_request_id_each_call(nodes: Any) -> None:
    node = await nodes()
    async with client(node.endpoint) as c:
        await c.ddl("CREATE NAMESPACE a")
        await c.ddl("CREATE NAMESPACE a")
    ids = [args["request_id"] for _, _, args in node.requests]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert all(isinstance(i, str) and len(i) == 32 for i in ids)


async def test_pipelined_requests_share_one_connection_and_replies_may_come_out_of_order(
    nodes: Any,
) -> None:
    second_replied = asyncio.Event()

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if args["table"] == "first":
            # Held back until the second request has been answered: out of order.
            await asyncio.wait_for(second_replied.wait(), 5)
        else:
            asyncio.get_running_loop().call_soon(second_replied.set)
        return {"table": args["table"]}

    node = await nodes(handler=handler)
    async with client(node.endpoint) as c:
        first = asyncio.create_task(c.describe("first"))
        await asyncio.sleep(0.05)
        second = await c.describe("second")
        assert second == {"table": "second"}
        assert not first.done() or first.result() == {"table": "first"}
        assert await first == {"table": "first"}
    assert node.connections == 1
    assert [conn for conn, _, _ in node.requests] == [1, 1]


async def test_in_flight_requests_per_connection_are_bounded(nodes: Any) -> None:
    release = asyncio.Event()
    waiting = 0  # history requests the node holds, and the most it held at once
    most = 0

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        nonlocal waiting, most
        if op == "safe_time":
            # Liveness probes take no slot (by design) and a live node answers them at once.
            # Held like the rest, on a loaded machine (past LIVENESS_PROBE_AFTER_MS before the
            # release) they were counted in flight too: 138 at most, against the bound of 64.
            return {}
        waiting += 1
        most = max(most, waiting)
        try:
            await asyncio.wait_for(release.wait(), 30)
        finally:
            waiting -= 1
        return {}

    node = await nodes(handler=handler)
    total = CLIENT_INFLIGHT_PER_CONNECTION_MAX + 10
    async with client(node.endpoint, timeout_ms=30_000) as c:
        calls = [asyncio.create_task(c.history(f"t{i}")) for i in range(total)]
        async with asyncio.timeout(10):
            while waiting < CLIENT_INFLIGHT_PER_CONNECTION_MAX:  # noqa: ASYNC110 - a count
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the requests past the bound, if sent, arrive meanwhile
        assert waiting == CLIENT_INFLIGHT_PER_CONNECTION_MAX
        release.set()
        await asyncio.gather(*calls)
    assert most == CLIENT_INFLIGHT_PER_CONNECTION_MAX
    assert node.ops.count("history") == total
    assert node.connections == 1


# ---- time ------------------------------------------------------------------------------------


async def test_reply_timestamps_are_fed_to_the_clients_hlc(nodes: Any) -> None:
    # The node's clock runs 200 ms ahead (within the 500 ms max offset): our clock follows it.
    node = await nodes(clock_offset_ms=200)
    clock = HybridClock(SystemClock())
    async with client(node.endpoint, clock=clock) as c:
        await c.status()
    assert node.last_ts > 0
    assert clock.last() > node.last_ts
    assert clock.now() > node.last_ts


async def test_a_timestamp_too_far_ahead_is_logged_and_ignored(
    nodes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    node = await nodes(clock_offset_ms=60_000)
    clock = HybridClock(SystemClock())
    caplog.set_level(logging.WARNING, logger="metastore.client")
    async with client(node.endpoint, clock=clock) as c:
        assert await c.status() == {"op": "status", "args": {}}
    # Not absorbed: our clock stays near our own physical time.
    assert clock.last() < node.last_ts
    assert physical_ms(clock.now()) < physical_ms(node.last_ts) - 30_000
    assert "ahead of the local physical clock" in caplog.text


# ---- failover --------------------------------------------------------------------------------


async def test_a_reply_past_the_item_budget_is_not_decoded(nodes: Any) -> None:
    # A compromised or buggy node: a reply of more array items and map pairs than any
    # legitimate one holds (CLIENT_REPLY_ITEMS_MAX) is a protocol error that closes the
    # connection, like any malformed frame, instead of being decoded whatever it costs.
    inner = [[]] * 1_000

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        # Liveness probes (safe_time) get a small answer: this node runs in the client's own
        # event loop, and encoding a second million-item reply for the probe held that loop
        # 0.5-0.8 s on a loaded machine, so the probe expired before the first reply was read.
        if op == "safe_time":
            return {}
        return {"x": [inner] * (CLIENT_REPLY_ITEMS_MAX // len(inner))}

    node = await nodes(handler=handler)
    async with client(node.endpoint, timeout_ms=30_000) as c:
        # One attempt at that node (`endpoint=`), with time to spare on a loaded machine: with
        # a 2 s budget for every retry, a slow first reply ended in a plain TIMEOUT.
        with pytest.raises(UnavailableError) as info:
            await c.call("status", {}, endpoint=node.endpoint)
    assert f"more than {CLIENT_REPLY_ITEMS_MAX} array items and map pairs" in info.value.message


async def test_failover_on_connection_refused(nodes: Any) -> None:
    node = await nodes()
    dead = dead_endpoint()
    async with client(dead, node.endpoint) as c:
        assert await c.status() == {"op": "status", "args": {}}
        # The working endpoint is now preferred: no new attempt on the dead one.
        await c.status()
    assert node.ops == ["status", "status"]


async def test_all_endpoints_down_raises_unavailable_naming_each(nodes: Any) -> None:
    dead1, dead2 = dead_endpoint(), dead_endpoint()
    started = time.monotonic()
    # The budget must outlast every round's backoff (ATTEMPTS_MAX attempts over two endpoints:
    # 8 pauses of 2.3-4.6 s in all, jittered): with 3 s, a round could start just before the
    # deadline and the deadline end its connect, a timeout instead of what the nodes said.
    async with client(dead1, dead2, timeout_ms=10_000) as c:
        with pytest.raises(UnavailableError) as info:
            await c.status()
    assert time.monotonic() - started < 9
    assert f"{dead1}: connection refused" in info.value.message
    assert f"{dead2}: connection refused" in info.value.message
    assert info.value.details["endpoints"] == {
        dead1: "connection refused",
        dead2: "connection refused",
    }


async def test_failover_on_not_ready_and_the_answering_node_is_preferred(nodes: Any) -> None:
    async def not_ready(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotReadyError("node starting")

    async def ok(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"node": 2}

    a = await nodes(node_id=1, handler=not_ready)
    b = await nodes(node_id=2, handler=ok)
    async with client(a.endpoint, b.endpoint) as c:
        assert await c.describe("ns.t") == {"node": 2}
        assert await c.describe("ns.t") == {"node": 2}
    assert a.ops == ["describe"]
    assert b.ops == ["describe", "describe"]


async def test_not_leader_hint_is_followed(nodes: Any) -> None:
    async def not_leader(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotLeaderError("not the leader", details={"leader": 3})

    async def ok(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    a = await nodes(node_id=1, handler=not_leader)
    b = await nodes(node_id=2, handler=not_leader)
    leader = await nodes(node_id=3, handler=ok)
    async with client(a.endpoint, b.endpoint, leader.endpoint) as c:
        # Learn which endpoint is node 3 (hello), then start again from node 1.
        await c.status(endpoint=leader.endpoint)
        c._preferred = 0
        assert await c.add_node(9, "h:1") == {"done": True}
    assert a.ops == ["add_node"]
    assert b.ops == []  # skipped thanks to the hint
    assert leader.ops == ["status", "add_node"]


async def test_attempts_are_bounded_and_the_last_server_error_is_raised(nodes: Any) -> None:
    async def not_ready(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotReadyError("still starting")

    a = await nodes(handler=not_ready)
    b = await nodes(handler=not_ready)
    async with client(a.endpoint, b.endpoint, timeout_ms=20_000) as c:
        with pytest.raises(NotReadyError) as info:
            await c.status()
    assert len(a.ops) + len(b.ops) == ATTEMPTS_MAX
    assert info.value.details["tried"] == {
        a.endpoint: "NOT_READY: still starting",
        b.endpoint: "NOT_READY: still starting",
    }


async def test_non_retryable_errors_are_raised_at_once_with_their_details(nodes: Any) -> None:
    async def missing(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise TableNotFoundError("table ns.t does not exist", details={"table": "ns.t"})

    a = await nodes(handler=missing)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(TableNotFoundError) as info:
            await c.describe("ns.t")
    assert info.value.details == {"table": "ns.t"}
    assert b.ops == []


async def test_wrong_token_is_not_retried_elsewhere(nodes: Any) -> None:
    a = await nodes()
    b = await nodes()
    async with client(a.endpoint, b.endpoint, token="wrong-token-0123456789") as c:
        with pytest.raises(UnauthenticatedError):
            await c.status()
    assert b.connections == 0


async def test_no_token_fails_before_connecting(nodes: Any) -> None:
    node = await nodes()
    async with client(node.endpoint, token=None) as c:
        with pytest.raises(UnauthenticatedError, match="no token"):
            await c.status()
    assert node.connections == 0


# ---- retry safety ----------------------------------------------------------------------------


async def test_ddl_is_retried_with_the_same_request_id_after_a_lost_connection(
    nodes: Any,
) -> None:
    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    async def ok(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"deduplicated": False}

    a = await nodes(handler=drop)
    b = await nodes(handler=ok)
    async with client(a.endpoint, b.endpoint) as c:
        assert await c.ddl("CREATE NAMESPACE x") == {"deduplicated": False}
    assert a.ops == ["ddl"] and b.ops == ["ddl"]
    assert a.requests[0][2]["request_id"] == b.requests[0][2]["request_id"]


async def test_a_membership_change_whose_outcome_is_unknown_is_not_repeated(nodes: Any) -> None:
    async def drop(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise DropConnection

    a = await nodes(handler=drop)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(UnavailableError, match="outcome is unknown"):
            await c.remove_node(3)
    assert b.ops == []


async def test_raw_ddl_without_request_id_is_not_repeated_after_unavailable(nodes: Any) -> None:
    async def unavailable(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise UnavailableError("no quorum")

    a = await nodes(handler=unavailable)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(UnavailableError, match="no quorum"):
            await c.call("ddl", {"sql": "CREATE NAMESPACE x"})
        # With a request id the same failure is retried on the next node.
        assert await c.call("ddl", {"sql": "CREATE NAMESPACE x", "request_id": "r"}) == {
            "op": "ddl",
            "args": {"sql": "CREATE NAMESPACE x", "request_id": "r"},
        }
    assert b.ops == ["ddl"]


async def test_a_hung_path_is_abandoned_for_the_next_node_within_the_budget(nodes: Any) -> None:
    """A node that took the request and then went silent (a partition after the hello) must not
    eat the call's whole budget: a liveness probe on the same connection goes unanswered, the
    connection is closed and the idempotent request is retried on the next node. Without the
    probe this call times out, its 4 s spent waiting on the first node."""

    async def silent(op: str, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(30)
        return {}

    a = await nodes(handler=silent)
    b = await nodes()
    async with client(a.endpoint, b.endpoint, timeout_ms=4000) as c:
        result = await c.call("committed_txn", {"txn_id": "t-1"})
    assert result == {"op": "committed_txn", "args": {"txn_id": "t-1"}}
    assert a.ops[:2] == ["committed_txn", "safe_time"] and b.ops == ["committed_txn"]


async def test_a_slow_request_on_a_live_node_is_not_abandoned(nodes: Any) -> None:
    """A DDL that waits (for leases, for activation) on a node that still answers the probe
    keeps waiting there: no second attempt elsewhere."""

    async def slow_ddl(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "ddl":
            await asyncio.sleep(1.3)
        return {"op": op}

    a = await nodes(handler=slow_ddl)
    b = await nodes()
    async with client(a.endpoint, b.endpoint, timeout_ms=5000) as c:
        assert await c.ddl("CREATE NAMESPACE x") == {"op": "ddl"}
    assert a.ops.count("ddl") == 1 and a.ops.count("safe_time") >= 1 and b.ops == []


class _SlowLinkNode(FakeNode):
    """Sends its `status` reply in slices, one every 100 ms for about 2 s: a large reply on a
    slow link. Replies go out in order on the one stream, so a liveness probe's answer waits
    behind it (as on a real node's connection)."""

    SLICES: ClassVar[int] = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        self._in_order = asyncio.Lock()

    async def _handle(
        self, writer: asyncio.StreamWriter, rid: int, op: str, args: dict[str, Any]
    ) -> None:
        result = {"blob": bytes(200_000)} if op == "status" else {}
        frame = self._reply(rid, result)
        step = -(-len(frame) // self.SLICES)
        async with self._in_order:
            for start in range(0, len(frame), step):
                writer.write(frame[start : start + step])
                await writer.drain()
                if op == "status":
                    await asyncio.sleep(0.1)


async def test_a_reply_still_arriving_keeps_its_connection_alive() -> None:
    """A node whose large reply is still coming in (a slow link) is alive: bytes arrive on the
    connection while the probe's own answer waits behind that reply on the stream. The probe
    took such a connection for dead once its answer was 500 ms late, so a reply that took over
    a second to transfer failed on every node, however long the call's budget."""
    node = _SlowLinkNode()
    await node.start()
    try:
        async with client(node.endpoint, timeout_ms=30_000) as c:
            result = await c.call("status", {}, endpoint=node.endpoint)
    finally:
        await node.stop()
    assert result == {"blob": bytes(200_000)}
    assert node.connections == 1 and node.ops[0] == "status" and "safe_time" in node.ops


# ---- timeouts --------------------------------------------------------------------------------


async def test_a_call_times_out_and_the_connection_survives_the_late_reply(nodes: Any) -> None:
    gate = asyncio.Event()

    async def slow(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("table") == "slow":
            await asyncio.wait_for(gate.wait(), 5)
        return {"table": args.get("table")}

    node = await nodes(handler=slow)
    async with client(node.endpoint, timeout_ms=200) as c:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError) as info:
            await c.describe("slow")
        # Not the handler's 5 s: the 200 ms timeout ended it (a loaded machine gets seconds).
        assert 0.15 < time.monotonic() - started < 4
        assert info.value.details["timeout_ms"] == 200
        gate.set()  # the late reply arrives and is dropped
        await asyncio.sleep(0.05)
        assert await c.describe("fast") == {"table": "fast"}
    assert node.connections == 1


async def test_ddl_timeout_names_the_request_id_for_a_retry(nodes: Any) -> None:
    async def hang(op: str, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(10)
        return {}

    node = await nodes(handler=hang)
    async with client(node.endpoint, timeout_ms=100) as c:
        with pytest.raises(RequestTimeoutError) as info:
            await c.ddl("CREATE NAMESPACE x", request_id="my-id")
    assert info.value.details["request_id"] == "my-id"


async def test_schema_at_waits_longer_than_the_servers_own_wait(nodes: Any) -> None:
    async def waits(op: str, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.4)
        return {"version": 1}

    node = await nodes(handler=waits)
    # The client's default timeout (100 ms) is shorter than the server-side wait asked for.
    async with client(node.endpoint, timeout_ms=100) as c:
        assert await c.schema_at("ns.t", timeout_ms=1000) == {"version": 1}


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code", [c for c in ErrorCode if c not in (ErrorCode.NOT_READY, ErrorCode.UNAVAILABLE)]
)
async def test_every_error_code_is_rebuilt_as_its_class(nodes: Any, code: ErrorCode) -> None:
    cls = error_class(code)

    async def fail(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise cls("boom", details={"k": [1, "v"]})

    node = await nodes(handler=fail)
    other = await nodes()
    async with client(node.endpoint, other.endpoint) as c:
        if code in (ErrorCode.NOT_LEADER, ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK):
            # Retryable and nothing was done: the client moves on to the other node.
            await c.history("ns.t")
            return
        with pytest.raises(cls) as info:
            await c.history("ns.t")
    assert type(info.value) is cls
    assert info.value.message == "boom"
    assert info.value.details["k"] == [1, "v"]


async def test_unknown_error_code_keeps_the_original(nodes: Any) -> None:
    async def fail(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RawError(
            {
                "code": "SOMETHING_NEW",
                "message": "from a newer node",
                "retryable": False,
                "details": {},
            }
        )

    node = await nodes(handler=fail)
    async with client(node.endpoint) as c:
        with pytest.raises(UnknownError) as info:
            await c.status()
    assert info.value.details["original_code"] == "SOMETHING_NEW"


async def test_invalid_ddl_is_not_retried(nodes: Any) -> None:
    async def bad(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise InvalidDdlError("syntax error", details={"line": 1, "col": 8})

    a = await nodes(handler=bad)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(InvalidDdlError):
            await c.ddl("CREATE NONSENSE")
    assert b.ops == []


# ---- per-endpoint queries --------------------------------------------------------------------


async def test_status_all_reports_each_endpoint(nodes: Any) -> None:
    async def st(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"role": "leader"}

    live = await nodes(handler=st)
    dead = dead_endpoint()
    async with client(live.endpoint, dead) as c:
        results = await c.status_all()
        safe = await c.safe_time_all()
    assert [r.endpoint for r in results] == [live.endpoint, dead]
    assert results[0].ok and results[0].result == {"role": "leader"}
    assert not results[1].ok and isinstance(results[1].error, UnavailableError)
    assert dead in results[1].error.message
    assert [r.ok for r in safe] == [True, False]
    assert live.ops == ["status", "safe_time"]


# ---- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:24201", ("127.0.0.1", 24201)),
        ("node-1.example:1", ("node-1.example", 1)),
        ("[::1]:24201", ("::1", 24201)),
    ],
)
def test_parse_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "host",
        "host:",
        ":80",
        "host:0",
        "host:65536",
        "::1:80",
        "host:http",
        "host:\u00b2",
        "x" * 400,
    ],
)
def test_parse_endpoint_refuses(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_endpoint(text)


def test_constructor_validates() -> None:
    with pytest.raises(InvalidArgumentError):
        MetastoreClient([], TOKEN)
    with pytest.raises(InvalidArgumentError):
        MetastoreClient(["a:1", "a:1"], TOKEN)
    with pytest.raises(InvalidArgumentError):
        MetastoreClient(["a:1"], TOKEN, timeout_ms=0)
    with pytest.raises(InvalidArgumentError):
        MetastoreClient([f"a:{i}" for i in range(1, 30)], TOKEN)


def test_constructor_names_a_comma_separated_string_for_what_it_is() -> None:
    """METASTORE_ENDPOINTS passed as is (one comma-separated string) was refused as "at least
    one endpoint (host:port) is needed", which it plainly had."""
    with pytest.raises(InvalidArgumentError, match="a list of host:port strings, not one str"):
        MetastoreClient("127.0.0.1:24201,127.0.0.1:24202", TOKEN)  # type: ignore[arg-type]


async def test_closed_client_refuses_calls(nodes: Any) -> None:
    node = await nodes()
    c = client(node.endpoint)
    await c.status()
    await c.aclose()
    with pytest.raises(UnavailableError, match="closed"):
        await c.status()


# ---- the blocking client ---------------------------------------------------------------------


def test_sync_client_is_usable_from_many_threads() -> None:
    async def echo(op: str, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        return {"table": args.get("table")}

    with (
        ThreadedFakeNode(handler=echo) as fake,
        SyncMetastoreClient([fake.endpoint], TOKEN, timeout_ms=5000) as c,
    ):
        errors: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                for i in range(10):
                    name = f"t{n}.{i}"
                    assert c.describe(name) == {"table": name}
            except (AssertionError, MetastoreError) as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert errors == []
        # Liveness probes (safe_time) join them when a describe is slow on a loaded machine.
        assert fake.node.ops.count("describe") == 80
        assert fake.node.connections == 1
        results = c.status_all()
        assert results[0].ok
        assert c.clock.last() >= fake.node.last_ts


def test_sync_client_raises_typed_errors_and_closes_cleanly() -> None:
    async def missing(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise TableNotFoundError("no such table")

    with ThreadedFakeNode(handler=missing) as fake:
        c = SyncMetastoreClient([fake.endpoint], TOKEN, timeout_ms=5000)
        with pytest.raises(TableNotFoundError):
            c.describe("ns.t")
        c.close()
        c.close()  # idempotent
        with pytest.raises(UnavailableError):
            c.describe("ns.t")


# ---- a write whose outcome the node could not learn in time ----------------------------------


async def test_a_commit_the_node_timed_out_on_is_retried_on_another_node(nodes: Any) -> None:
    """A leader that proposed a commit and then lost its quorum (cut off from its followers,
    not from the client) answers TIMEOUT once the proposal's wait ends: the outcome is unknown
    there, and a commit is de-duplicated by its txn id, so the call retries elsewhere within
    its budget (as after UNAVAILABLE or a lost connection) instead of failing a commit the
    healthy majority would take."""

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied within 5000 ms; its outcome is unknown")

    async def committed(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"op": op, "ts": 42, "deduplicated": True}

    a = await nodes(handler=timed_out)
    b = await nodes(handler=committed)
    async with client(a.endpoint, b.endpoint) as c:
        result = await c.commit("t-1", [{"table": "ns.t", "schema_version": 1}])
        assert result == {"op": "commit", "ts": 42, "deduplicated": True}
    # The same for a DDL with its request id (de-duplicated by the state machine).
    async with client(a.endpoint, b.endpoint) as c:
        result = await c.ddl("CREATE NAMESPACE x", request_id="r-1")
        assert result == {"op": "ddl", "ts": 42, "deduplicated": True}
    assert [op for op in a.ops if op != "safe_time"] == ["commit", "ddl"]
    assert b.ops == ["commit", "ddl"]
    assert b.requests[0][2]["txn_id"] == "t-1" and b.requests[1][2]["request_id"] == "r-1"


async def test_a_commit_ahead_of_the_leaders_clock_is_tried_again(nodes: Any) -> None:
    """Apply version 6 answers a plain commit whose not_before the leader's clock has not
    reached yet with TIMESTAMP_AHEAD_OF_CLOCK (metastore.txn): nothing was done, so the call
    tries again, after a backoff, and the same commit succeeds once the clock is there."""
    answers = 0

    async def ahead_once(op: str, args: dict[str, Any]) -> dict[str, Any]:
        nonlocal answers
        answers += 1
        if answers == 1:
            raise TimestampAheadError(
                "not_before is 100 ms past what the leader's clock allows now",
                details={"ts": 7, "not_before": 7, "max_ts": 6, "ahead_ms": 100},
            )
        return {"op": op, "ts": 7, "deduplicated": False}

    node = await nodes(handler=ahead_once)
    async with client(node.endpoint) as c:
        result = await c.commit("t-1", [{"table": "ns.t", "schema_version": 1}], not_before=7)
    assert result == {"op": "commit", "ts": 7, "deduplicated": False}
    assert [op for op in node.ops if op != "safe_time"] == ["commit", "commit"]


async def test_a_write_that_cannot_be_repeated_is_not_retried_after_a_timeout(
    nodes: Any,
) -> None:
    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied in time; its outcome is unknown")

    a = await nodes(handler=timed_out)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(RequestTimeoutError):
            await c.remove_node(3)
        with pytest.raises(RequestTimeoutError):
            await c.call("ddl", {"sql": "CREATE NAMESPACE x"})
        # A read's TIMEOUT is the answer to its own wait bound: raised as is.
        with pytest.raises(RequestTimeoutError):
            await c.schema_at("ns.t", timeout_ms=100)
    assert b.ops == []


async def test_a_commit_timed_out_then_refused_as_not_leader_keeps_its_unknown_outcome(
    nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit one node timed out on (sent to a leader that then lost its quorum: it may
    still commit) and every other attempt refused with a 'nothing done' code (NOT_LEADER during
    the election) has an unknown outcome: the call must say so (UNAVAILABLE, as after a lost
    connection), not raise the last NOT_LEADER, which reads as 'not committed'. The bridge
    looks up an unknown outcome before it reports anything; a NOT_LEADER it passed on as a
    retryable failure, so a caller re-running the batch under a fresh txn id committed twice."""

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied within 5000 ms; its outcome is unknown")

    async def not_leader(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotLeaderError("no leader yet")

    monkeypatch.setattr(protocol, "RETRY_BACKOFF_MS_MAX", protocol.RETRY_BACKOFF_MS_MIN)
    a = await nodes(handler=timed_out)
    b = await nodes(handler=not_leader)
    async with client(a.endpoint, b.endpoint, timeout_ms=8000) as c:
        with pytest.raises(UnavailableError, match="outcome") as raised:
            await c.commit("t-1", [{"table": "ns.t", "schema_version": 1}])
        assert raised.value.retryable
        with pytest.raises(UnavailableError, match="outcome"):
            await c.ddl("CREATE NAMESPACE x", request_id="r-1", wait_ms=0)
    assert "commit" in a.ops and "commit" in b.ops


async def test_a_commit_a_forward_lost_then_refused_as_not_leader_keeps_its_unknown_outcome(
    nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same after UNAVAILABLE: a follower whose forward to the leader broke after sending
    ("connection to the leader closed") cannot know whether the leader committed it. Followed
    by NOT_LEADERs everywhere (an election), the call raised the last NOT_LEADER, which reads
    as 'not committed': chaos saw such a 'refused' commit visible afterwards."""

    async def forward_lost(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise UnavailableError("cannot reach node 3: connection to the leader closed")

    async def not_leader(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotLeaderError("no leader yet")

    monkeypatch.setattr(protocol, "RETRY_BACKOFF_MS_MAX", protocol.RETRY_BACKOFF_MS_MIN)
    a = await nodes(handler=forward_lost)
    b = await nodes(handler=not_leader)
    async with client(a.endpoint, b.endpoint, timeout_ms=8000) as c:
        with pytest.raises(UnavailableError, match="outcome") as raised:
            await c.commit("t-1", [{"table": "ns.t", "schema_version": 1}])
        assert raised.value.retryable
        assert raised.value.details.get("outcome_unknown") is True
        with pytest.raises(UnavailableError, match="outcome"):
            await c.ddl("CREATE NAMESPACE x", request_id="r-1", wait_ms=0)
    assert "commit" in a.ops and "commit" in b.ops


async def test_a_commit_timed_out_then_refused_at_hello_by_another_node_keeps_its_unknown_outcome(
    nodes: Any,
) -> None:
    """A commit one node timed out on may still commit. When the next node then refuses the
    connection itself (its hello: a token it does not take, a connection limit, a TLS
    handshake), that refusal says nothing of the commit: the call raised it as is (e.g.
    UNAUTHENTICATED, not retryable), which reads as 'not committed', and a caller re-running
    the batch under a fresh txn id committed it twice. It must say 'outcome unknown'."""

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied within 5000 ms; its outcome is unknown")

    a = await nodes(handler=timed_out)
    b = await nodes(tokens=frozenset())  # refuses every hello
    async with client(a.endpoint, b.endpoint, timeout_ms=8000) as c:
        with pytest.raises(UnavailableError, match="outcome") as raised:
            await c.commit("t-1", [{"table": "ns.t", "schema_version": 1}])
        assert raised.value.retryable
        assert raised.value.details.get("outcome_unknown") is True
        assert "UNAUTHENTICATED" in str(raised.value)
        with pytest.raises(UnavailableError, match="outcome"):
            await c.ddl("CREATE NAMESPACE x", request_id="r-1", wait_ms=0)
    assert "commit" in a.ops and b.ops == []
    # Without an earlier unknown outcome the refusal is raised as it is.
    async with client(b.endpoint) as c:
        with pytest.raises(UnauthenticatedError):
            await c.commit("t-2", [{"table": "ns.t", "schema_version": 1}])


@pytest.mark.parametrize(
    "refusal",
    [
        UnauthenticatedError("the token is not valid here (rotated?)"),
        error_class(ErrorCode.FORBIDDEN)("op 'commit' needs role writer"),
        error_class(ErrorCode.BAD_REQUEST)("unknown arguments ['seq']"),
        error_class(ErrorCode.INTERNAL)("KeyError: 'x'"),
    ],
)
async def test_a_commit_timed_out_then_refused_by_a_node_itself_keeps_its_unknown_outcome(
    nodes: Any, refusal: MetastoreError
) -> None:
    """The same when the next node refuses the request as a node (a token it no longer takes
    after a rotation, a role, an argument an older release does not know, a bug there): not
    a verdict on the commit, which an earlier node may still apply."""

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RequestTimeoutError("proposal not applied within 5000 ms; its outcome is unknown")

    async def refuse(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise refusal

    a = await nodes(handler=timed_out)
    b = await nodes(handler=refuse)
    async with client(a.endpoint, b.endpoint, timeout_ms=8000) as c:
        with pytest.raises(UnavailableError, match="outcome") as raised:
            await c.commit("t-1", [{"table": "ns.t", "schema_version": 1}])
        assert raised.value.retryable
        assert raised.value.details.get("outcome_unknown") is True
        assert refusal.code.value in str(raised.value)
    assert "commit" in a.ops and "commit" in b.ops
    # Without an earlier unknown outcome the refusal is raised as it is.
    async with client(b.endpoint) as c:
        with pytest.raises(type(refusal)):
            await c.commit("t-2", [{"table": "ns.t", "schema_version": 1}])


async def test_a_connection_whose_every_slot_is_busy_is_not_taken_for_dead(nodes: Any) -> None:
    """A liveness probe must not wait for one of the connection's request slots: with every
    slot held by slow requests (64 DDLs waiting for their activation on a healthy node) the
    probe could not be sent, went 'unanswered', and the connection was closed under all of
    them: every DDL was sent again to another node (and a request that cannot be repeated
    failed with 'outcome unknown') although the node was answering all along."""

    async def slow_ddl(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "ddl":
            await asyncio.sleep(1.3)
        return {"op": op}

    a = await nodes(handler=slow_ddl)
    b = await nodes()
    async with client(a.endpoint, b.endpoint, timeout_ms=8000) as c:
        results = await asyncio.gather(
            *(c.ddl(f"CREATE NAMESPACE n{i}") for i in range(CLIENT_INFLIGHT_PER_CONNECTION_MAX))
        )
    assert results == [{"op": "ddl"}] * CLIENT_INFLIGHT_PER_CONNECTION_MAX
    assert a.ops.count("ddl") == CLIENT_INFLIGHT_PER_CONNECTION_MAX
    assert b.ops == [] and a.connections == 1


async def test_a_watch_start_one_node_compacted_away_is_asked_of_the_others(nodes: Any) -> None:
    """Each node keeps its own window of events (one restarted from a snapshot has none before
    it): a watch refused as compacted by one node is asked of each other node once before the
    caller has to re-read the state."""
    from metastore.errors import WatchStartCompactedError

    async def compacted(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise WatchStartCompactedError("no events kept before 50", details={"oldest_ts": 50})

    async def keeps(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"events": [{"kind": "commit", "tm": 12}], "next_from_ts": 12}

    fresh, old = await nodes(handler=compacted), await nodes(node_id=2, handler=keeps)
    async with client(fresh.endpoint, old.endpoint) as c:
        page = await c.watch(10)
        assert page["events"] == [{"kind": "commit", "tm": 12}]
        assert old.requests[-1][2]["from_ts"] == 10
    gone = await nodes(node_id=3, handler=compacted)
    async with client(fresh.endpoint, gone.endpoint) as c:
        with pytest.raises(WatchStartCompactedError):
            await c.watch(10)  # no node has it: the caller re-reads the state


async def test_watch_events_continues_right_after_an_event_inside_its_entry(nodes: Any) -> None:
    """`watch_events` could start only after a whole entry (`from_ts`): a consumer that handled
    one of several events of an entry could not continue right after it. It takes the
    `from_event` of the event handled + 1 and passes it with the first call only."""
    feed = [{"kind": "table_dropped", "tm": 12, "event": n} for n in range(3)]

    async def feed_after(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if args["from_ts"] == 12 and args.get("from_event", 0) == 1:
            return {"events": feed[1:], "next_from_ts": 12, "next_from_event": 0}
        return {"events": [], "next_from_ts": args["from_ts"], "next_from_event": 0}

    node = await nodes(handler=feed_after)
    async with client(node.endpoint) as c:
        handled = feed[0]
        events = c.watch_events(handled["tm"], from_event=handled["event"] + 1, wait_ms=0)
        assert [await anext(events), await anext(events)] == feed[1:]
        await events.aclose()
    assert [r[2].get("from_event", 0) for r in node.requests][:1] == [1]


async def test_membership_calls_send_timeout_ms_only_when_not_the_default(nodes: Any) -> None:
    # A daemon of an older release refuses an unknown `timeout_ms` argument; the CLI passes its
    # default (10 s) every time, so the default must not be sent (rolling upgrades).
    node = await nodes()
    async with client(node.endpoint) as c:
        await c.remove_node(4, timeout_ms=MEMBERSHIP_TIMEOUT_MS_DEFAULT)
        await c.promote_node(4)
        await c.add_node(4, "127.0.0.1:1", timeout_ms=2_500)
    sent = [(op, args) for _, op, args in node.requests]
    assert sent == [
        ("remove_node", {"node_id": 4}),
        ("promote_node", {"node_id": 4}),
        (
            "add_node",
            {"node_id": 4, "raft_address": "127.0.0.1:1", "learner": True, "timeout_ms": 2_500},
        ),
    ]


async def test_no_round_starts_that_the_deadline_would_cut(
    nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node answers NOT_READY after 150 ms; rounds pause 300 ms. The third round would start
    # ~100 ms before the 1 s deadline and be cut by it: the caller got a bare TIMEOUT instead
    # of what the node said. A round needs ROUND_MIN_MS left after its pause to start.
    async def slow_not_ready(op: str, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.15)
        raise NotReadyError("still starting")

    node = await nodes(handler=slow_not_ready)
    monkeypatch.setattr(MetastoreClient, "_backoff_ms", lambda self, round_number: 300.0)
    async with client(node.endpoint, timeout_ms=1000) as c:
        with pytest.raises(NotReadyError):
            await c.status()
    assert node.ops == ["status", "status"]


async def test_a_gc_run_whose_outcome_is_unknown_is_repeated_on_the_next_node(
    nodes: Any,
) -> None:
    # A leader change dropped the run's proposal: the old leader answers UNAVAILABLE (it cannot
    # say whether the entry still commits elsewhere); a run is safe to repeat, so the client
    # asks the next node instead of failing `metastore gc run`.
    async def dropped(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise UnavailableError("GC proposal failed: entry 22 was replaced by a newer leader")

    a = await nodes(handler=dropped)
    b = await nodes()
    async with client(a.endpoint, b.endpoint) as c:
        assert await c.call("gc_run", {}) == {"op": "gc_run", "args": {}}
    assert a.ops == ["gc_run"] and b.ops == ["gc_run"]


async def test_a_forward_the_follower_never_sent_leaves_no_unknown_outcome(
    nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower's forward that timed out before its request was written (no free slot on
    its link to the leader, the link not opened) says so (`details.not_sent`): the leader never
    saw it. The client took every UNAVAILABLE of a write for an unknown outcome, so an
    election's NOT_LEADERs after it still ended in "outcome unknown" for a commit that
    certainly did nothing (the caller had to look it up before re-running it)."""

    async def not_sent(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise UnavailableError(
            "no room on the link to node 3 within 200 ms; the request was not sent",
            details={"node_id": 3, "not_sent": True},
        )

    async def not_leader(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotLeaderError("no leader yet")

    monkeypatch.setattr(protocol, "RETRY_BACKOFF_MS_MAX", protocol.RETRY_BACKOFF_MS_MIN)
    a = await nodes(handler=not_sent)
    b = await nodes(handler=not_leader)
    async with client(a.endpoint, b.endpoint, timeout_ms=3000) as c:
        with pytest.raises(MetastoreError) as raised:
            await c.commit("t-1", [{"table": "ns.t", "schema_version": 1}])
        assert raised.value.details.get("outcome_unknown") is not True, raised.value
        assert "outcome" not in raised.value.message
    assert "commit" in a.ops and "commit" in b.ops
