"""`files` page tokens name their table: a token of one table's listing used for another
was caught only when the item counts differed (MANIFEST_CONFLICT, and the client listed again
in vain); with equal counts it was read at the other table's offsets. Now it is BAD_REQUEST.
Stub nodes, nothing started (as test_txn_log_paging_lagging)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.commands import TableName
from metastore.daemon import server
from metastore.daemon.server import ApiServer, Session
from metastore.errors import BadRequestError
from metastore.state import MetastoreState
from tests.metastore._driver import MS
from tests.metastore.test_txn import commit, ready, tick, write
from tests.metastore.test_txn import ok as ok_commit


class _Node:
    """Serves `sm.state`; waiting for safe time applies the rest of the log (`caught_up`)."""

    def __init__(self, sm: SimpleNamespace, caught_up: MetastoreState) -> None:
        self.node_id = 2
        self.sm, self.caught_up = sm, caught_up
        self.ready_to_serve = True
        self.waited_for: list[int] = []

    @property
    def safe_time(self) -> int:
        state: MetastoreState = self.sm.state
        return state.last_tm

    def is_leader(self) -> bool:
        return False

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        self.waited_for.append(ts)
        if self.safe_time < ts:
            self.sm.state = self.caught_up
        assert self.safe_time >= ts
        return 1.0


class _NoMetrics:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def _api(state: MetastoreState, caught_up: MetastoreState) -> tuple[ApiServer, _Node]:
    sm = SimpleNamespace(state=state, events=None)
    node = _Node(sm, caught_up)
    api = ApiServer(
        node=node,
        sm=sm,  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(caught_up.last_tm // MS)),  # one clock for all nodes
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=_NoMetrics(),  # type: ignore[arg-type]
        cluster_id="rp",
        client_addresses={},
    )
    api.gc = None
    return api, node


def _call(api: ApiServer, op: str, args: dict[str, Any]) -> Any:
    spec = api._ops[op]
    server._check_args(args, spec.args)
    return asyncio.run(spec.handler(Session(peer="t"), args))


def test_a_files_token_used_on_another_table_is_a_bad_request() -> None:
    d = ready()
    b = TableName.parse("ns.b")
    for i in range(3):  # as many files in both: the item count check cannot tell them apart
        ok_commit(d, commit(f"w:{i}", write(add=(f"a{i}",)), write(b, add=(f"b{i}",))))
    tick(d, 1)
    state = d.state
    api, _ = _api(state, state)
    first = _call(api, "files", {"table": "ns.a", "limit": 1})
    token = first["next_page_token"]
    again = _call(api, "files", {"table": "ns.a", "limit": 1, "page_token": token})
    assert again["files"] and again["files"] != first["files"]
    with pytest.raises(BadRequestError, match=r"not of ns\.b"):
        _call(api, "files", {"table": "ns.b", "limit": 1, "page_token": token})
    multi = _call(api, "files_multi", {"tables": ["ns.a", "ns.b"], "limit": 1})
    multi_token = multi["listings"][0]["next_page_token"]
    with pytest.raises(BadRequestError):
        _call(api, "files", {"table": "ns.b", "limit": 1, "page_token": multi_token})
    # A token of the previous release (no table id) still works on its own table.
    old = ":".join(token.split(":")[:3])
    again = _call(api, "files", {"table": "ns.a", "limit": 1, "page_token": old})
    new = _call(api, "files", {"table": "ns.a", "limit": 1, "page_token": token})
    assert again["files"] == new["files"]
