"""The Raft driver's drops and unusable peer address books reach /metrics (stub status)."""

from __future__ import annotations

from prometheus_client import generate_latest

from metastore.daemon.metrics import NodeMetrics


def test_inbox_drops_and_unusable_address_books_are_exported() -> None:
    metrics = NodeMetrics(1)
    status = {
        "role": "follower",
        "term": 3,
        "leader": 2,
        "commit_index": 10,
        "applied_index": 10,
        "lag_ms": 0,
        "ready": True,
        "raft_inbox_dropped": 7,
        "raft_unusable_address_books": 2,
    }
    metrics.refresh(status)
    text = generate_latest(metrics.registry).decode()
    assert "metastore_raft_inbox_dropped_total 7.0" in text
    assert "metastore_raft_unusable_address_books_total 2.0" in text
