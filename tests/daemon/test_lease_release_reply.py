"""`lease_release` replies with the Tm its entry was applied at (`release_tm`), as `pin` does
with `lease_tm`: a release without `known_tm` keeps nothing, so the bridge compares the two
to tell whether a pin that crossed the release on the wire lost its lease to it
(spark_bridge.session `hold`). The reply is not replicated state (the entry's result is
unchanged, so no apply version gates it). Stub node, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hlc import HybridClock, ManualClock
from metastore.commands import ReleaseLeases
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from metastore.state import MetastoreState
from tests.metastore._driver import T0

APPLIED_TM = T0 + 4_242


def _api() -> tuple[ApiServer, list[Any]]:
    sm = SimpleNamespace(state=MetastoreState())
    api = ApiServer(
        node=SimpleNamespace(node_id=1, ready_to_serve=True),  # type: ignore[arg-type]
        sm=sm,  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(T0 >> 16)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="lr",
        client_addresses={},
    )
    proposed: list[Any] = []

    async def propose(_session: Session, cmd: Any, _timeout_ms: int) -> dict[str, Any]:
        proposed.append(cmd)
        result = {"session_id": cmd.session_id, "released": 1}
        if cmd.known_tm is not None:
            result["kept"] = []
        return {"result": result, "tm": APPLIED_TM, "index": 7}

    api._propose_command = propose  # type: ignore[method-assign]
    return api, proposed


def test_a_release_replies_with_the_tm_it_was_applied_at() -> None:
    api, proposed = _api()
    session = Session(peer="p", role=Role.WRITER, token="tok", client="spark")
    lease = {"table": "ns.t", "table_id": 3, "version": 1}
    for extra in ({}, {"known_tm": T0}):
        reply = asyncio.run(
            api._lease_release(session, {"session_id": "s1", "leases": [lease], **extra})
        )
        assert reply["release_tm"] == APPLIED_TM
        assert reply["released"] == 1
    assert [type(c) for c in proposed] == [ReleaseLeases, ReleaseLeases]
