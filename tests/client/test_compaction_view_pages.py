"""A compactor reads `compaction_view` in pages, which are not of one moment. The compaction's
compare-and-swap covers the loose entries, the delete entries and the manifests it rewrites,
but not the manifest set it used to find which manifest holds a deleted path: a delete entry
whose path is in no manifest it saw is folded as a no-op. So the client must not plan on
delete entries read against another moment's manifests (metastore.client.manifest_files)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from metastore.client import manifest_files
from metastore.client.manifest_files import compact_table, expand_reply
from metastore.commands import (
    CommitTxn,
    DataFile,
    TableName,
    TableWrite,
    compact_manifest_from_request,
)
from metastore.daemon.server import ApiServer
from metastore.errors import InvalidArgumentError
from tests.metastore._driver import DD_MS, MS, Driver

A = TableName.of("ns", "a")


class ViewClient:
    """`compaction_view` served by the daemon's own handler over a Driver's state, and
    `compact_manifest` applied to it; `between_pages` runs before the next continued page."""

    def __init__(self, d: Driver) -> None:
        self.d = d
        self.between_pages: Callable[[], None] | None = None
        self._server = SimpleNamespace(
            sm=SimpleNamespace(state=None), loose_files_max=10_000, _require_ready=lambda: None
        )

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        if op == "compaction_view":
            if args.get("page_token") and self.between_pages is not None:
                hook, self.between_pages = self.between_pages, None
                hook()
            self._server.sm.state = self.d.state
            coro = ApiServer._compaction_view(self._server, None, args)  # type: ignore[arg-type]
            return asyncio.run(coro)
        assert op == "compact_manifest"
        outcome = self.d.apply(compact_manifest_from_request(args))
        outcome.raise_for_error()
        return dict(outcome.result)


def commit(d: Driver, txn: str, *paths: str, remove: tuple[str, ...] = ()) -> None:
    files = tuple(DataFile(path=p, size_bytes=10, row_count=1) for p in paths)
    write = TableWrite(table=A, schema_version=1, add=files, remove=remove)
    d.apply(CommitTxn(txn_id=txn, writes=(write,))).raise_for_error()


def live_paths(d: Driver) -> list[str]:
    ts = d.state.table_upper() - 1
    listing = d.state.listing_at(A, ts)
    reply = {
        "as_of": ts,
        "location": d.state.current(A).location,
        "files": [{"path": f.path, "size_bytes": 10, "row_count": 1} for f in listing.files],
        "manifests": [m.to_view() for m in listing.manifests],
        "deletes": [[x.path, x.removed_ts] for x in listing.deletes],
    }
    return sorted(f["path"] for f in expand_reply(reply)["files"])


def test_a_compaction_between_view_pages_cannot_resurrect_a_removed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.a (x INT) LOCATION '{tmp_path}'")
    d.tm += (DD_MS + 1) * MS  # the table is active
    client = ViewClient(d)
    commit(d, "t1", "a", "b")
    compact_table(client, "ns.a")  # manifest [a b]
    commit(d, "t2", "c0", "c1", "c2")
    monkeypatch.setattr(manifest_files, "VIEW_PAGE_LIMIT", 2)

    def meanwhile() -> None:
        compact_table(client, "ns.a")  # another compactor: [c0 c1 c2] move into a manifest
        commit(d, "t3", remove=("c0",))  # c0 sits in that manifest: a delete entry
        commit(d, "t4", "x1", "x2")

    client.between_pages = meanwhile
    # Page 1 shows c0, c1 loose and the one manifest [a b]; page 2 the delete entry of c0.
    compact_table(client, "ns.a", keep_loose=100)
    assert live_paths(d) == ["a", "b", "c1", "c2", "x1", "x2"]
    d.state.check_invariants()


def test_a_view_that_shrank_between_pages_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another compaction between two pages can leave fewer entries than the next page's
    offset: the view changed (read it again), the request was not a bad one."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.a (x INT) LOCATION '{tmp_path}'")
    d.tm += (DD_MS + 1) * MS  # the table is active
    client = ViewClient(d)
    commit(d, "t1", "a", "b")
    commit(d, "t2", "c")
    monkeypatch.setattr(manifest_files, "VIEW_PAGE_LIMIT", 2)
    client.between_pages = lambda: compact_table(client, "ns.a")  # moves all three
    result = compact_table(client, "ns.a")
    assert result["compacted"] is False  # nothing left to do once read again
    assert live_paths(d) == ["a", "b", "c"]


def test_a_table_without_a_location_is_not_compacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Manifests live under the table's location; a table without one (no LOCATION, no
    warehouse) would get them at the file system's root ("/_manifests/...")."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT)")
    d.tm += (DD_MS + 1) * MS  # the table is active
    assert d.state.current(A).location == ""
    commit(d, "t1", "a", "b")

    def no_write(location: str, entries: object) -> None:
        raise AssertionError(f"a manifest written under {location!r}")

    monkeypatch.setattr(manifest_files, "write_manifest", no_write)
    with pytest.raises(InvalidArgumentError):
        compact_table(ViewClient(d), "ns.a")
    assert d.state.table_stats(A).manifests == 0


def test_compact_table_merges_small_manifests_past_the_merge_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each compaction of a few new entries adds one small manifest; past MANIFEST_MERGE_AT the
    compactor also writes merged manifests and swaps them in (the table would otherwise stop
    compacting at MAX_MANIFESTS_PER_TABLE)."""
    from metastore import limits

    monkeypatch.setattr(limits, "MANIFEST_MERGE_AT", 3)
    monkeypatch.setattr(limits, "MAX_MANIFESTS_PER_TABLE", 4)
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.a (x INT) LOCATION '{tmp_path}'")
    d.tm += (DD_MS + 1) * MS  # the table is active
    client = ViewClient(d)
    paths: list[str] = []
    for i in range(12):
        paths += [f"p{i}a", f"p{i}b"]
        commit(d, f"t{i}", *paths[-2:], remove=("p1a",) if i == 5 else ())
        assert compact_table(client, "ns.a", entries_max=8)["compacted"]
        # At most one past the bound: this compaction's new manifest is merged by the next.
        assert d.state.table_stats(A).manifests <= 4
    assert live_paths(d) == sorted(p for p in paths if p != "p1a")
    d.state.check_invariants()


def test_appends_while_a_view_of_many_delete_entries_is_read_do_not_stall_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages are offsets into the loose entries then the delete entries. A commit between two
    pages adds loose entries, which moves every delete entry one page offset on: the next page
    repeats delete entries the last one ended with. Folded twice, they never matched the
    state's delete entries (MANIFEST_CONFLICT), so on a table with a page or more of pending
    removals and a steady writer, every attempt failed and the removals piled up to their
    bound. A delete entry's path is unique in the state: a repeat is that shift, dropped."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.a (x INT) LOCATION '{tmp_path}'")
    d.tm += (DD_MS + 1) * MS  # the table is active
    client = ViewClient(d)
    commit(d, "t0", "a", "b", "c", "d")
    compact_table(client, "ns.a")  # manifest [a b c d]
    commit(d, "t1", "x", remove=("a", "b", "c"))  # x loose; three delete entries
    monkeypatch.setattr(manifest_files, "VIEW_PAGE_LIMIT", 2)
    appended: list[str] = []

    def writer() -> None:  # a steady writer: one commit before every continued page
        appended.append(f"y{len(appended)}")
        commit(d, f"s{len(appended)}", appended[-1])
        client.between_pages = writer

    client.between_pages = writer
    result = compact_table(client, "ns.a", keep_loose=100)
    assert result["compacted"] and result["folded_deletes"] == 3
    assert live_paths(d) == sorted(["d", "x", *appended])
    d.state.check_invariants()


def test_a_manifest_gc_deleted_before_its_compaction_applied_is_written_again(
    tmp_path: Path,
) -> None:
    """Manifest names are content hashes: a compaction can write, byte for byte, a manifest an
    earlier compaction replaced. If GC deletes that file after the compactor wrote it and
    reports it before the compaction applies (apply refuses it only while queued), the table
    would reference a missing manifest and every read of it fail."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.a (x INT) LOCATION '{tmp_path}'")
    d.tm += (DD_MS + 1) * MS  # the table is active
    commit(d, "t1", "a", "b")

    class GcMeanwhile(ViewClient):
        def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
            if op == "compact_manifest":
                for path in (tmp_path / "_manifests").glob("*.parquet"):
                    path.unlink()  # GC deleted the same-named file of a replaced manifest
            return super().call(op, args)

    compact_table(GcMeanwhile(d), "ns.a")
    assert live_paths(d) == ["a", "b"]  # every referenced manifest reads (sha256 checked)
