"""The client's retry policy against docs/protocol.md, op class by failure, on fake nodes.

Each test pins one cell of the table "what the client does when this op meets that failure":
a repeatable op must not give up while another node may answer, and a call's arguments must
say what its caller asked for. Every wait is bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from metastore.client import MetastoreClient
from metastore.daemon.api_limits import MEMBERSHIP_TIMEOUT_MS_DEFAULT
from tests.client.fake_node import TOKEN, FakeNode


@pytest.fixture
async def nodes() -> AsyncIterator[Callable[..., Any]]:
    started: list[FakeNode] = []

    async def make(**kwargs: Any) -> FakeNode:
        node = FakeNode(**kwargs)
        await node.start()
        started.append(node)
        return node

    yield make
    for node in started:
        await node.stop()


def client(*endpoints: str, **kwargs: Any) -> MetastoreClient:
    kwargs.setdefault("timeout_ms", 3000)
    return MetastoreClient(list(endpoints), TOKEN, **kwargs)


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
