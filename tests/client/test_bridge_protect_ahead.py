"""A protection from a time still to come is refused before any request, by every client-side
API that creates one: `MetastoreBridge.protect()` and `SyncMetastoreClient.protect()` (what the
bridge and the CLI call) refuse it with INVALID_ARGUMENT, by the rule `metastore pts protect
--ts` applies (one function: `metastore.client.refuse_protection_ahead`). Such a record holds
nothing the GC could delete now (a year typed wrong: 2062 for 2026), yet read as success.
No Spark: a bridge without its constructor (tests/client/bridge_stub.py) over a real client
and a fake node."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click
import pytest

from cli.context import PROTECT_TIMESTAMP
from hlc import SystemClock, make_ts
from metastore.client import SyncMetastoreClient, refuse_protection_ahead
from metastore.errors import InvalidArgumentError
from metastore.limits import MAX_CLOCK_SKEW_MS
from tests.cli.test_pts_cli_text import _handler as protect_handler
from tests.client.bridge_stub import bare_bridge
from tests.client.fake_node import TOKEN, ThreadedFakeNode

TYPO = "2062-11-27T10:00:00Z"


async def _protect_and_release(op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op == "pts_release":
        return {"record_id": args["record_id"], "released": True}
    return await protect_handler(op, args)


@pytest.fixture
def node() -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=_protect_and_release) as fake:
        yield fake


@pytest.fixture
def client(node: ThreadedFakeNode) -> Iterator[SyncMetastoreClient]:
    c = SyncMetastoreClient([node.endpoint], TOKEN, timeout_ms=5_000)
    try:
        yield c
    finally:
        c.close()


def _ops(node: ThreadedFakeNode) -> list[str]:
    return [op for _, op, _ in node.node.requests if op != "hello"]


def _ahead_ms(ms: int) -> int:
    return make_ts(SystemClock().now_ms() + ms)


def _assert_refused_as_ahead(error: InvalidArgumentError) -> None:
    assert "in the future by" in error.message, error.message
    assert "protects nothing" in error.message, error.message
    assert error.details["max_ahead_ms"] == MAX_CLOCK_SKEW_MS
    assert error.details["ahead_ms"] > MAX_CLOCK_SKEW_MS


@pytest.mark.parametrize("as_of", [TYPO, "future-hlc"])
def test_bridge_protect_from_a_time_still_to_come_is_refused_before_any_request(
    node: ThreadedFakeNode, client: SyncMetastoreClient, as_of: Any
) -> None:
    bridge = bare_bridge(client)
    if as_of == "future-hlc":
        as_of = _ahead_ms(3_600_000)
    with pytest.raises(InvalidArgumentError) as raised, bridge.protect(as_of, meta="backfill"):
        pytest.fail("the block ran under a protection of nothing")
    _assert_refused_as_ahead(raised.value)
    assert _ops(node) == []
    assert bridge._protections == []  # nothing to release at the end


def test_bridge_protect_from_now_or_within_the_clock_skew_is_sent(
    node: ThreadedFakeNode, client: SyncMetastoreClient
) -> None:
    bridge = bare_bridge(client)
    for as_of in ("now", "-1h", _ahead_ms(MAX_CLOCK_SKEW_MS // 2)):
        with bridge.protect(as_of, meta="backfill") as record:
            assert record["record_id"]
    assert _ops(node) == ["pts_protect", "pts_release"] * 3


def test_client_protect_from_a_time_still_to_come_is_refused_before_any_request(
    node: ThreadedFakeNode, client: SyncMetastoreClient
) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        client.protect(_ahead_ms(10 * MAX_CLOCK_SKEW_MS), cluster=True)
    _assert_refused_as_ahead(raised.value)
    assert _ops(node) == []


def test_the_cli_refuses_by_the_same_rule_and_says_the_same() -> None:
    ts = _ahead_ms(10 * MAX_CLOCK_SKEW_MS)
    assert PROTECT_TIMESTAMP.refuse_ahead is refuse_protection_ahead
    with pytest.raises(InvalidArgumentError) as library:
        refuse_protection_ahead(ts, now_ms=SystemClock().now_ms())
    with pytest.raises(click.BadParameter) as cli:
        PROTECT_TIMESTAMP.convert(str(ts), None, None)
    # The span may differ by the milliseconds between the two reads of the clock.
    assert cli.value.message.split(" by ")[0] == library.value.message.split(" by ")[0]
    assert "protects nothing" in cli.value.message


@pytest.mark.parametrize("ts", [float("inf"), float("nan"), 1.5, -1, 2**64, "now", True], ids=repr)
def test_client_protect_of_no_timestamp_at_all_is_a_typed_error(
    client: SyncMetastoreClient, node: ThreadedFakeNode, ts: Any
) -> None:
    # Was: hlc's TimestampRangeError (or a TypeError) out of the ahead check, not the
    # library's typed errors, for a ts that is not an HLC integer.
    with pytest.raises(InvalidArgumentError, match="'ts' must be an HLC timestamp"):
        client.protect(ts=ts, tables=["ns.t"])
    assert _ops(node) == []
