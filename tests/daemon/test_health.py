"""`GET /health` on the metrics port: 200 only when the node serves, else 503 with the reason.

A node whose safe time trails its clock by more than read_staleness_max_ms refuses every file
listing (NOT_READY: it is not applying its leader's entries, e.g. behind a one-way partition)
while it still counts as "ready" (it heard its leader), and /health said "ok" (200): a load
balancer or an alert on /health kept sending readers to it. And a 503 did not say why (clock
fenced, no leader, not initialized). Stub status, the real HTTP responder on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from metastore.daemon.metrics import HttpEndpoint, NodeMetrics

HEALTHY: dict[str, Any] = {
    "node_id": 2,
    "role": "follower",
    "term": 3,
    "leader": 1,
    "commit_index": 10,
    "applied_index": 10,
    "lag_ms": 120,
    "ready": True,
    "initialized": True,
    "clock_fenced": "",
    "read_staleness_max_ms": 2_500,
}


async def _get(status: dict[str, Any], request: bytes) -> tuple[int, bytes]:
    endpoint = HttpEndpoint(NodeMetrics(2), lambda: status)
    await endpoint.start("127.0.0.1", 0)
    assert endpoint._server is not None
    port = endpoint._server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        await endpoint.stop()
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def _health(status: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    code, body = await _get(status, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    return code, json.loads(body)


async def test_a_ready_node_that_applies_is_healthy() -> None:
    code, body = await _health(HEALTHY)
    assert (code, body["status"], body["reason"]) == (200, "ok", "")


async def test_a_node_too_far_behind_its_clock_to_list_files_is_unhealthy() -> None:
    code, body = await _health(HEALTHY | {"lag_ms": 9_000})
    assert code == 503 and body["status"] == "unavailable", body
    assert "read_staleness_max_ms=2500" in body["reason"] and "9000 ms" in body["reason"], body


async def test_a_fenced_node_says_why() -> None:
    fence = "clock 900 ms ahead of a quorum (CSmax 500 ms)"
    code, body = await _health(HEALTHY | {"ready": False, "clock_fenced": fence})
    assert code == 503 and fence in body["reason"], body


async def test_a_removed_node_says_it_was_removed() -> None:
    # A member removed but left running: the API answers NOT_READY "removed from the cluster",
    # /health said "no leader known" or "not caught up" (a wrong lead for an operator).
    code, body = await _health(HEALTHY | {"ready": False, "leader": 0, "removed_at_index": 42})
    assert code == 503 and "removed from the cluster (at index 42)" in body["reason"], body


async def test_a_node_without_a_leader_or_cluster_says_why() -> None:
    code, body = await _health(HEALTHY | {"ready": False, "leader": 0, "role": "pre_candidate"})
    assert code == 503 and "leader" in body["reason"], body
    code, body = await _health(HEALTHY | {"ready": False, "initialized": False})
    assert code == 503 and "not initialized" in body["reason"], body


async def test_unknown_paths_and_methods_are_refused() -> None:
    assert (await _get(HEALTHY, b"GET /nope HTTP/1.1\r\n\r\n"))[0] == 404
    assert (await _get(HEALTHY, b"POST /health HTTP/1.1\r\n\r\n"))[0] == 405


def test_every_total_in_the_exposition_is_a_counter() -> None:
    # Prometheus reserves `_total` for counters (promtool: "non-counter metrics should not have
    # _total suffix"); three running totals the node mirrors at scrape time were gauges.
    from prometheus_client.parser import text_string_to_metric_families

    metrics = NodeMetrics(2)
    metrics.refresh(
        HEALTHY
        | {"fsync_seconds_total": 1.5, "peer_tls_revoked_refused": 3, "peer_tls_revoked_closed": 1}
    )
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    totals = {s.name: f.type for f in families for s in f.samples if s.name.endswith("_total")}
    assert totals, "no _total sample at all"
    assert {n: t for n, t in totals.items() if t != "counter"} == {}
    values = {s.name: s.value for f in families for s in f.samples}
    assert values["metastore_wal_fsync_seconds_total"] == 1.5
    assert values["metastore_peer_tls_revoked_refused_total"] == 3
    assert values["metastore_peer_tls_revoked_closed_total"] == 1


def test_log_write_failures_are_a_counter() -> None:
    # A node on a full disk drops its log records quietly (metastore.daemon.logs): the count
    # is how an operator sees it from the scraper.
    from prometheus_client.parser import text_string_to_metric_families

    metrics = NodeMetrics(2)
    metrics.refresh(HEALTHY | {"log_write_failures": 4})
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    family = families["metastore_log_write_failures"]
    assert family.type == "counter"
    assert [s.value for s in family.samples if s.name.endswith("_total")] == [4]
