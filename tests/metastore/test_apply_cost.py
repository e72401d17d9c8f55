"""The work a commit's apply does per file stays in C-level loops (no Python function call per
file), so the largest commits hold a node's event loop as briefly as they can.

Every node applies committed entries on its event loop, where it also answers its leader's
heartbeats (raft.node). A commit adds up to MAX_FILES_PER_COMMIT files, and an overwrite
removes every live file of the table (up to MAX_FILE_ENTRIES_PER_TABLE): a Python call per
file (a dataclass `__init__`, `dataclasses.replace`, a generator step of a `sum`, a sort key
lambda, a per-path session lookup) was most of that apply's cost (`make bench-apply`:
an overwrite of 990k files held the loop 2.4 s). Times are not asserted (machines differ);
the Python calls the profiler sees are, as a deterministic proxy: the calls per file of a
commit twice as large must grow by less than one per file."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import fields
from types import FrameType

from metastore.commands import CommitTxn, DataFile, OpenSession, SessionInfo, TableName, TableWrite
from metastore.txn import FileEntry
from tests.metastore._driver import DD_MS, MS, Driver

A = TableName.of("ns", "a")
SESSION = "s1"


def python_calls(run: Callable[[], object]) -> int:
    """Python function calls (frames entered, generator resumptions included) during `run`."""
    calls = 0

    def count(_frame: FrameType, event: str, _arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def table_with(files: int) -> Driver:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT)", step_ms=DD_MS + 1)
    d.apply(OpenSession(session_id=SESSION, info=SessionInfo(), ttl_ms=600_000)).raise_for_error()
    d.apply(commit("fill", add=paths("fill", files)), step_ms=DD_MS + 1).raise_for_error()
    return d


def paths(batch: str, n: int) -> tuple[str, ...]:
    return tuple(f"_txn/{SESSION}--{batch}/date=2026-11-27/part-{i:05d}.parquet" for i in range(n))


def commit(txn_id: str, *, add: tuple[str, ...], overwrite: bool = False) -> CommitTxn:
    files = tuple(DataFile(path=p, size_bytes=100, row_count=10) for p in add)
    return CommitTxn(
        txn_id=txn_id,
        writes=(TableWrite(table=A, schema_version=1, add=files, overwrite=overwrite),),
    )


def apply_decoded(d: Driver, cmd: CommitTxn) -> None:
    """Apply `cmd` as a node does: decoded (and so validated) off the loop, then applied."""
    d.tm += MS
    d.index += 1
    d.state.apply(cmd, tm=d.tm, index=d.index, decoded=True).raise_for_error()


def calls_of_commit(*, existing: int, add: int, overwrite: bool) -> int:
    cmd = commit("big", add=paths("big", add), overwrite=overwrite)
    apply_decoded(table_with(existing), cmd)  # warm: caches and imports are not counted
    d = table_with(existing)
    calls = python_calls(lambda: apply_decoded(d, cmd))
    d.state.check_invariants()
    return calls


def test_an_added_file_costs_no_python_call() -> None:
    small = calls_of_commit(existing=0, add=1_000, overwrite=False)
    large = calls_of_commit(existing=0, add=2_000, overwrite=False)
    assert (large - small) / 1_000 < 1, (small, large)


def test_a_file_an_overwrite_removes_costs_no_python_call() -> None:
    small = calls_of_commit(existing=1_000, add=1, overwrite=True)
    large = calls_of_commit(existing=2_000, add=1, overwrite=True)
    assert (large - small) / 1_000 < 1, (small, large)


def test_the_entries_apply_makes_field_by_field_are_whole_file_entries() -> None:
    """`TxnLog._write` makes FileEntry objects without their __init__, setting these fields:
    a field added to FileEntry (or a __post_init__) must be set there too."""
    names = [f.name for f in fields(FileEntry)]
    assert names == ["path", "size_bytes", "row_count", "added_ts", "removed_ts"]
    assert not hasattr(FileEntry, "__post_init__")
    d = table_with(3)
    apply_decoded(d, commit("over", add=paths("over", 2), overwrite=True))
    (tid,) = d.state.txns.table_ids()
    for entry in d.state.txns.loose_entries(tid):
        assert entry == FileEntry(**{n: getattr(entry, n) for n in names})
        assert hash(entry) == hash(FileEntry(**{n: getattr(entry, n) for n in names}))


def python_lines(run: Callable[[], object]) -> int:
    """Python source lines executed (trace 'line' events, in every frame) during `run`."""
    lines = 0

    def trace(_frame: FrameType, event: str, _arg: object) -> Callable[..., object]:
        nonlocal lines
        if event == "line":
            lines += 1
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    return lines


def test_a_snapshot_encodes_file_entries_without_a_python_step_per_entry() -> None:
    """Every node encodes its snapshot on its event loop (raft.node `_maybe_snapshot`): 1.3 s
    at 990k file entries, a third of it a list comprehension's step per entry. Its lines
    per entry of a table twice as large must grow by less than one per entry."""
    small, large = table_with(2_000), table_with(4_000)
    extra = python_lines(large.state.to_snapshot) - python_lines(small.state.to_snapshot)
    assert extra < 2_000, f"{extra / 2_000:.2f} Python lines per file entry"
