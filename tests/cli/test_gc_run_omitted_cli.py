"""`gc run` over more tables than its reply lists (metastore/daemon/gc_worker.py `run_reply`)
says how many it does not show, and how many skipped locations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from tests.client.fake_node import TOKEN, ThreadedFakeNode


async def _handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
    assert op == "gc_run"
    report = {
        "table": "ns.t",
        "table_id": 1,
        "threshold_before": 0,
        "threshold": 0,
        "held_by": {"kind": "ttl"},
        "files_deleted": 2,
        "bytes_deleted": 2,
        "orphans_deleted": 0,
        "skipped": "",
        "compacted_manifests": 0,
        "awaiting_compaction_files": 0,
    }
    return {
        "dry_run": False,
        "tables": [report],
        "tables_total": 20_000,
        "tables_omitted": 19_999,
        "files_deleted": 7,
        "bytes_deleted": 7,
        "orphans_deleted": 0,
        "orphan_bytes_deleted": 0,
        "compacted_manifests": 0,
        "awaiting_compaction_files": 0,
        "awaiting_compaction_tables": 0,
        "orphan_locations_skipped": ["s3://b/t"],
        "orphan_locations_skipped_omitted": 4,
        "seconds": 0.1,
    }


@pytest.fixture
def node() -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=_handler) as fake:
        yield fake


def test_a_run_over_more_tables_than_its_reply_lists_says_how_many_it_left_out(
    node: ThreadedFakeNode,
) -> None:
    result = CliRunner().invoke(
        cli, ["--endpoints", node.endpoint, "--token", TOKEN, "gc", "run"], prog_name="metastore"
    )
    assert result.exit_code == 0, (result.output, result.exception)
    text = " ".join(result.output.split())
    assert "deleted: 7 files" in text
    assert "19999 of 20000 tables not listed" in text
    assert "s3://b/t and 4 more" in text
