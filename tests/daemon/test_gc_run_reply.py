"""The size of `gc_run`'s reply (metastore/daemon/gc_worker.py `GcWorker.run`). Its per-table
list grew with the cluster: past about 10,000 tables the leader's reply exceeded the client
frame (CLIENT_FRAME_BYTES_MAX) and came back LIMIT_EXCEEDED after the run had already deleted
files, so the caller believed it failed. The reply now holds the totals always, and at most
GC_RUN_REPLY_TABLES_MAX tables (those where something happened first) and
GC_RUN_REPLY_LOCATIONS_MAX skipped locations, with counts of what it left out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from metastore import limits
from metastore.daemon import gc_worker
from metastore.daemon.api_limits import CLIENT_FRAME_BYTES_MAX
from metastore.daemon.gc_worker import GcWorker, TableReport

# Names as long as a table's may be: the largest report a table can add.
_LONG = "n" * limits.MAX_IDENTIFIER_CHARS


def _worker(table_count: int, skipped_locations: int) -> GcWorker:
    state = SimpleNamespace(
        cluster=object(), txns=SimpleNamespace(table_ids=lambda: list(range(1, table_count + 1)))
    )
    worker = GcWorker(
        raft=SimpleNamespace(is_leader=lambda: True, ready_to_serve=True),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=state),  # type: ignore[arg-type]
        clock=SimpleNamespace(now=lambda: 0),  # type: ignore[arg-type]
        metrics=SimpleNamespace(),  # type: ignore[arg-type]
        node_id=1,
        interval_ms=60_000,
        orphan_grace_ms=60_000,
        delete_files_per_s=1_000_000,
    )

    async def table(table_id: int, *, dry_run: bool, budget: Any, into: list[TableReport]) -> None:
        report = TableReport(
            table=f"{_LONG}.{_LONG[:-6]}{table_id:06d}",
            table_id=table_id,
            threshold_before=1 << 62,
            threshold=1 << 62,
            held_by={"kind": "lease", "session_id": "s" * 64},
        )
        if table_id % 100 == 0:  # one table in a hundred has files to delete
            report.files_deleted, report.bytes_deleted = 3, 3 << 40
        into.append(report)

    async def orphans(reports: list[TableReport], *, dry_run: bool) -> list[str]:
        return [f"s3://bucket/{'p' * 1000}{i:06d}" for i in range(skipped_locations)]

    worker._table = table  # type: ignore[method-assign,assignment]
    worker._orphans = orphans  # type: ignore[method-assign,assignment]
    return worker


def _run(worker: GcWorker) -> dict[str, Any]:
    return asyncio.run(worker.run(None, dry_run=True))


def test_the_reply_of_a_run_over_many_tables_fits_a_client_frame() -> None:
    reply = _run(_worker(20_000, skipped_locations=20_000))
    assert len(msgpack.packb(reply)) < CLIENT_FRAME_BYTES_MAX // 2
    # The totals count every table; the list says what it left out.
    assert reply["files_deleted"] == 3 * 200
    assert reply["tables_total"] == 20_000
    listed = reply["tables"]
    assert len(listed) == gc_worker.GC_RUN_REPLY_TABLES_MAX
    assert reply["tables_omitted"] == 20_000 - len(listed)
    # Every table where something happened is listed before idle ones, in run order.
    busy = [t["table_id"] for t in listed if t["files_deleted"]]
    assert busy == [i * 100 for i in range(1, 201)]
    ids = [t["table_id"] for t in listed]
    assert ids == sorted(ids)
    assert len(reply["orphan_locations_skipped"]) == gc_worker.GC_RUN_REPLY_LOCATIONS_MAX
    omitted = 20_000 - gc_worker.GC_RUN_REPLY_LOCATIONS_MAX
    assert reply["orphan_locations_skipped_omitted"] == omitted


@pytest.mark.parametrize("table_count", [1, 1_000])
def test_a_run_over_few_tables_lists_every_table(table_count: int) -> None:
    reply = _run(_worker(table_count, skipped_locations=3))
    assert [t["table_id"] for t in reply["tables"]] == list(range(1, table_count + 1))
    assert reply["tables_total"] == table_count and reply["tables_omitted"] == 0
    assert len(reply["orphan_locations_skipped"]) == 3
    assert reply["orphan_locations_skipped_omitted"] == 0
