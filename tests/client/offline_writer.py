"""A data source writer for unit tests of the append path without Spark or a cluster: the
arguments Spark's planning gives `MetastoreWriter` (a pinned table `ns.t`, id 1, version 1),
with a node address nothing listens on; a test swaps the client (`datasource._client`) when it
needs one to answer."""

from __future__ import annotations

from typing import Any

from spark_bridge.datasource import MetastoreWriter


def offline_writer(
    location: str, columns: list[dict[str, Any]], **overrides: Any
) -> MetastoreWriter:
    """`MetastoreWriter` for `ns.t` at `location` with `columns`; `overrides` replace any of
    its other arguments (`overwrite`, `txn_id`, `session_id`, `session_ttl_ms`, ...)."""
    args: dict[str, Any] = {
        "endpoints": ["127.0.0.1:1"],
        "token": "t",
        "table": "ns.t",
        "table_id": 1,
        "version": 1,
        "location": location,
        "columns": columns,
        "overwrite": False,
        "not_before": 1,
        "session_id": "s1",
        "session_ttl_ms": 60_000,
    }
    return MetastoreWriter(**{**args, **overrides})
