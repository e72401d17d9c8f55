"""A list of names given as one string is refused by the client library before any request,
not split into characters: `list("s1")` is `["s", "1"]`, so `session_expire("s1")` expired the
sessions "s" and "1" (if they existed), `files_multi("ns.t")` answered OK with listings of
tables "n", "s", ... and `protect(namespaces="ns")` protected namespaces "n" and "s". Fake
node, nothing started."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import InvalidArgumentError
from tests.client.fake_node import TOKEN, ThreadedFakeNode

NOW = 1_700_000_000_000 << 16  # in the past: a protection of it is not refused as ahead


async def never(op: str, args: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError(f"nothing should be sent, got {op} {args}")


@pytest.fixture
def node() -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=never) as fake:
        yield fake


@pytest.fixture
def client(node: ThreadedFakeNode) -> Iterator[SyncMetastoreClient]:
    c = SyncMetastoreClient([node.endpoint], TOKEN, timeout_ms=5_000)
    try:
        yield c
    finally:
        c.close()


CALLS: dict[str, Callable[[SyncMetastoreClient], Any]] = {
    "session_expire": lambda c: c.session_expire("s1"),  # type: ignore[arg-type]
    "files_multi": lambda c: c.files_multi("ns.t"),  # type: ignore[arg-type]
    "pin": lambda c: c.pin("ns.t"),  # type: ignore[arg-type]
    "pin reads": lambda c: c.pin(["ns.t"], reads="ns.t"),  # type: ignore[arg-type]
    "protect tables": lambda c: c.protect(NOW, tables="ns.t"),  # type: ignore[arg-type]
    "protect namespaces": lambda c: c.protect(NOW, namespaces="ns"),  # type: ignore[arg-type]
    "commit read_tables": lambda c: c.commit(
        "t1",
        [{"table": "ns.t", "schema_version": 1}],
        read_ts=NOW,
        read_tables="ns.t",  # type: ignore[arg-type]
    ),
    "session_expire of an int": lambda c: c.session_expire(5),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_one_string_for_a_list_of_names_is_refused_before_any_request(
    client: SyncMetastoreClient, node: ThreadedFakeNode, call: Callable[[SyncMetastoreClient], Any]
) -> None:
    with pytest.raises(InvalidArgumentError, match="must be a list of names"):
        call(client)
    assert [op for _, op, _ in node.node.requests if op != "hello"] == []
