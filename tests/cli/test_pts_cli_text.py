"""`metastore pts` and `gc status` print the text users gave verbatim (found by the GC review).

Table cells were rich markup: a protection whose meta held brackets ('nightly [/backup]') made
`pts protect` crash with a MarkupError after the record was created (exit 1, so the caller took
it as failed and protected again: one more record holding GC back), and every `pts list` crash
from then on; '[bold]' was shown as a style instead of as text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from hlc import make_ts
from tests.client.fake_node import TOKEN, ThreadedFakeNode

META = "nightly [/backup] [bold]full[/bold]"
TS = make_ts(1_790_000_000_000)
RECORD = {
    "record_id": "r1",
    "ts": TS,
    "mode": "PROTECT_AFTER",
    "meta_type": "cli [x]",
    "meta": META,
    "tables": ["ns.t"],
    "table_ids": [1],
    "earlier_table_ids": [],
    "namespaces": [],
    "cluster": False,
    "created_tm": TS,
    "expires_tm": None,
    "owner": "",
    "created_by": "ops [/team]",
}
META_ROW = {"version": 1, "num_records": 1, "num_targets": 1}


async def _handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op == "pts_protect":
        return {**RECORD, "applied_tm": TS}
    if op == "pts_list":
        return {"meta": META_ROW, "records": [RECORD], "next_page_token": None}
    if op == "pts_show":
        return {**RECORD, "released": False}
    if op == "gc_status":
        table = {
            "table": "ns.t",
            "table_id": 1,
            "dropped": False,
            "ttl_ms": 1_000,
            "threshold": 0,
            "next_threshold": TS,
            "held_by": {"kind": "protection", "record_id": "r[/1]"},
            "protections": ["r[/1]"],
            "live_files": 1,
            "live_bytes": 1,
            "file_entries": 1,
            "reclaimable_files": 0,
            "reclaimable_bytes": 0,
            "queued_files": 0,
        }
        return {
            "meta": META_ROW,
            "tables": [table],
            "protections": [{"record_id": "r[/1]", "ts": TS, "held_bytes": 0}],
            "next_page_token": None,
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


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("pts", "protect", "--ts", str(TS), "--table", "ns.t", "--meta", META), META),
        (("pts", "list"), META),
        (("pts", "show", "r1"), META),
        (("pts", "list"), "ops [/team]"),
        (("gc", "status"), "r[/1]"),
    ],
)
def test_user_text_with_brackets_is_printed_as_given(
    node: ThreadedFakeNode, args: tuple[str, ...], shown: str
) -> None:
    result = _run(node, *args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert shown in result.output
