"""`gc status` and `gc run` show the files removed inside manifests that wait for a compaction
(the leader's GC runs it; `table compact` does it now), and what a run compacted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from tests.client.fake_node import TOKEN, ThreadedFakeNode

TABLE = {
    "table": "ns.t",
    "table_id": 1,
    "dropped": False,
    "ttl_ms": 1_000,
    "threshold": 0,
    "next_threshold": 0,
    "held_by": {"kind": "ttl", "ttl_ms": 1_000},
    "protections": [],
    "live_files": 1,
    "live_bytes": 1,
    "file_entries": 1,
    "reclaimable_files": 0,
    "reclaimable_bytes": 0,
    "queued_files": 0,
    "awaiting_compaction_files": 3,
}


async def _handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op == "gc_status":
        return {
            "meta": {"version": 0, "num_records": 0, "num_targets": 0},
            "tables": [TABLE],
            "awaiting_compaction": {"files": 3, "tables": 1},
            "protections": [],
            "next_page_token": None,
        }
    if op == "gc_run":
        report = {
            "table": "ns.t",
            "threshold_before": 0,
            "threshold": 0,
            "held_by": {"kind": "ttl"},
            "files_deleted": 0,
            "bytes_deleted": 0,
            "orphans_deleted": 0,
            "compacted_manifests": 0,
            "awaiting_compaction_files": 3,
        }
        return {
            "dry_run": True,
            "tables": [report],
            "files_deleted": 0,
            "bytes_deleted": 0,
            "orphans_deleted": 0,
            "orphan_bytes_deleted": 0,
            "compacted_manifests": 2,
            "awaiting_compaction_files": 3,
            "awaiting_compaction_tables": 1,
            "orphan_locations_skipped": [],
            "seconds": 0.1,
        }
    raise AssertionError(f"unexpected op {op}")


@pytest.fixture
def node() -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=_handler) as fake:
        yield fake


def _run(node: ThreadedFakeNode, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["--endpoints", node.endpoint, "--token", TOKEN, *args], prog_name="metastore"
    )


@pytest.mark.parametrize("args", [("gc", "status"), ("gc", "run", "--dry-run")])
def test_files_awaiting_compaction_are_shown_with_the_hint(
    node: ThreadedFakeNode, args: tuple[str, ...]
) -> None:
    result = _run(node, *args)
    assert result.exit_code == 0, (result.output, result.exception)
    text = " ".join(result.output.split())
    assert "awaiting compaction: 3 files, 1 tables" in text
    assert "metastore table compact NS.TABLE" in text
    if "run" in args:
        assert "compacted: 2 manifests rewritten" in text
