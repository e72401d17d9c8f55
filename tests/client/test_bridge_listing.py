"""The Spark bridge follows `files` pages itself. When a compaction lands between two pages,
the server refuses the stale page token (MANIFEST_CONFLICT: the listing at that as_of changed
shape); the bridge lists the table again from the first page at the same as_of instead of
failing the batch (or, before the server checked, silently reading a listing short of
files). Pure: a scripted client, no Spark, no processes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from metastore.client.protocol import MetastoreClient
from metastore.errors import ManifestConflictError, NotFoundAtTimestampError, TableNotFoundError
from spark_bridge.bridge import BatchContext, BatchError, BatchReport

TS = 1 << 40


class ScriptedClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        self.calls.append((op, dict(args)))
        token = args.get("page_token")
        if token == "stale":  # the page after a compaction
            raise ManifestConflictError("the listing changed between pages")
        if token is None:  # listed again at the same as_of: moved entries are in a manifest
            assert args["as_of"] == TS
            return _page(["c.parquet"], ["m1"], "fresh")
        assert token == "fresh"
        return _page(["d.parquet"], [], None)


def _page(files: list[str], manifests: list[str], token: str | None) -> dict[str, Any]:
    return {
        "table": "ns.t",
        "as_of": TS,
        "files": [{"path": p} for p in files],
        "deletes": [],
        "manifests": manifests,
        "next_page_token": token,
    }


def test_a_compaction_between_pages_lists_the_table_again() -> None:
    batch = object.__new__(BatchContext)
    client = ScriptedClient()
    batch.client = client  # type: ignore[assignment]
    batch.txn_id = "t-1"
    first = _page(["a.parquet", "b.parquet"], [], "stale")
    listing = batch._rest_of(first)
    assert [f["path"] for f in listing["files"]] == ["c.parquet", "d.parquet"]
    assert listing["manifests"] == ["m1"] and listing["next_page_token"] is None
    assert [op for op, _ in client.calls] == ["files", "files", "files"]


class DeferredClient:
    """`files_multi` had no room for this table's manifests: they come with its first page."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        self.calls.append((op, dict(args)))
        if args["page_token"] == f"{TS}:0:2":
            return _page(["a.parquet"], ["m1", "m2"], f"{TS}:1:2")
        assert args["page_token"] == f"{TS}:1:2"
        return _page(["b.parquet"], [], None)


def _deferred_first() -> dict[str, Any]:
    return {**_page([], [], f"{TS}:0:2"), "total_manifests": 2}


def test_manifests_deferred_to_the_first_files_page_are_kept_by_the_bridge() -> None:
    batch = object.__new__(BatchContext)
    batch.client = DeferredClient()  # type: ignore[assignment]
    batch.txn_id = "t-1"
    listing = batch._rest_of(_deferred_first())
    assert [f["path"] for f in listing["files"]] == ["a.parquet", "b.parquet"]
    assert listing["manifests"] == ["m1", "m2"]


def test_manifests_deferred_to_the_first_files_page_are_kept_by_the_client() -> None:
    client = object.__new__(MetastoreClient)
    scripted = DeferredClient()

    async def call(op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        return scripted.call(op, args)

    client.call = call  # type: ignore[method-assign]
    listing = asyncio.run(client._files_pages(_deferred_first()))
    assert [f["path"] for f in listing["files"]] == ["a.parquet", "b.parquet"]
    assert listing["manifests"] == ["m1", "m2"]


class NotYetClient:
    """`files_multi` at read_ts: the table was created after read_ts (pinned at Top)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "files_multi" and args["as_of"] == TS - 5
        listing = {"table": "ns.new", "error": self.error.to_wire()}  # type: ignore[attr-defined]
        return {"as_of": TS - 5, "listings": [listing], "waited_ms": 0.0}


@pytest.mark.parametrize(
    "error",
    [
        TableNotFoundError("table ns.new does not exist at ...", details={"table": "ns.new"}),
        NotFoundAtTimestampError(
            "table ns.new was dropped at ..., before ...", details={"table": "ns.new"}
        ),
    ],
)
def test_a_table_created_between_read_ts_and_top_reads_empty(error: Exception) -> None:
    """A batch reads at its node's safe time, up to DD below Top: a table that became visible
    between the two is pinned (it exists at Top) but did not exist at read_ts. Its rows then
    were none (no commit lands below a table's creation), so it reads empty; the read failed
    with the non-retryable TABLE_NOT_FOUND, so a batch planned in the ~250 ms after another
    driver created a table failed (a streaming query on it stopped)."""
    from types import SimpleNamespace

    batch = object.__new__(BatchContext)
    batch.client = NotYetClient(error)  # type: ignore[assignment]
    batch.txn_id = "t-1"
    batch.reads = ["ns.new"]
    batch._requested_read_ts = None  # the read_ts `plan` picks, not the caller's
    batch._listings, batch._listed = {}, set()
    batch.pinned = {
        "ns.new": SimpleNamespace(table_id=9, location="/w/new")  # type: ignore[dict-item]
    }
    batch.report = BatchReport(txn_id="t-1", top=TS, read_ts=TS - 5, waited_ms=0.0)
    assert batch.files("ns.new") == ("/w/new", [])


def test_a_table_absent_at_a_read_ts_the_caller_asked_for_stays_an_error() -> None:
    from types import SimpleNamespace

    error = TableNotFoundError("table ns.new does not exist at ...", details={"table": "ns.new"})
    batch = object.__new__(BatchContext)
    batch.client = NotYetClient(error)  # type: ignore[assignment]
    batch.txn_id = "t-1"
    batch.reads = ["ns.new"]
    batch._requested_read_ts = TS - 5
    batch._listings, batch._listed = {}, set()
    batch.pinned = {
        "ns.new": SimpleNamespace(table_id=9, location="/w/new")  # type: ignore[dict-item]
    }
    batch.report = BatchReport(txn_id="t-1", top=TS, read_ts=TS - 5, waited_ms=0.0)
    with pytest.raises(BatchError, match="TABLE_NOT_FOUND"):
        batch.files("ns.new")
