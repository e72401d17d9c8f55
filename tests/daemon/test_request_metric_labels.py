"""`metastore_requests{op, code}` must have a bounded label set: NodeMetrics folded only op
names longer than 32 characters into "other", so every short unknown op name a client sent
(`op1`, `op2`, ...) became a new Prometheus series for the life of the node. A stranger needs
no token for it (its first request, refused UNAUTHENTICATED, is counted under its op), so one
connection per name grew the node's memory and /metrics without bound. Stub node, nothing
started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hlc import HybridClock, SystemClock
from metastore.daemon.metrics import NodeMetrics
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from tests.metastore.test_manifests import ready


def _series(metrics: NodeMetrics) -> set[str]:
    [family] = metrics.requests.collect()
    return {s.labels["op"] for s in family.samples if s.name.endswith("_total")}


def test_unknown_op_names_do_not_grow_the_request_metric() -> None:
    metrics = NodeMetrics(1)
    api = ApiServer(
        node=SimpleNamespace(node_id=1, ready_to_serve=True),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=metrics,
        cluster_id="ct",
        client_addresses={},
    )

    async def send(_frame: bytes) -> None:
        pass

    async def run() -> None:
        for i in range(20):
            # A stranger's first request, and an authenticated reader's request.
            await api._first_request(Session(peer="t"), {"id": 1, "op": f"a{i}", "args": {}})
            await api._run_request(
                Session(peer="t", role=Role.READER), {"id": 1, "op": f"b{i}", "args": {}}, send
            )

    asyncio.run(run())
    ops = _series(metrics)
    assert ops <= set(api._ops) | {"other", "connect", "frame"}, sorted(ops)
