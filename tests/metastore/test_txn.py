"""The transaction log: atomic multi-table commits of data files (metastore.txn).

Every rule of the commit, each refusal changing nothing, the exact visibility boundary, the
timestamp rule under contention, read-set conflicts, the schema-version window, idempotency,
registration through CREATE/DROP, table locations, snapshots, invariants and decoding."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import cast

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metastore import limits
from metastore.commands import (
    CommitTxn,
    CreateTable,
    DataFile,
    TableName,
    TableWrite,
    commit_txn_from_request,
    decode_command,
    encode_command,
    validate_command,
)
from metastore.ddl import parse_ddl
from metastore.errors import (
    BatchAlreadyCommittedError,
    CatalogInvariantError,
    ClusterNotInitializedError,
    CommitTimestampUnavailableError,
    DataFileConflictError,
    InvalidArgumentError,
    LimitExceededError,
    MalformedCommandError,
    MalformedSnapshotError,
    MetastoreError,
    NotFoundAtTimestampError,
    ReadConflictError,
    SchemaVersionNotActiveError,
    TableNotFoundError,
    TimestampAheadError,
    TxnIdReusedError,
)
from metastore.outcome import Outcome
from metastore.state import MetastoreState
from metastore.txn import FileEntry, StreamMark
from tests.metastore._driver import CS_MAX_MS, DD, DD_MS, MS, Driver
from tests.metastore._support import DETERMINISTIC, msgpack_values

A = TableName.of("ns", "a")
B = TableName.of("ns", "b")


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def files(*paths: str, rows: int = 10, size: int = 100) -> tuple[DataFile, ...]:
    return tuple(DataFile(path=p, size_bytes=size, row_count=rows) for p in paths)


def write(
    table: TableName = A,
    *,
    add: tuple[str, ...] = (),
    remove: tuple[str, ...] = (),
    overwrite: bool = False,
    version: int = 1,
    table_id: int = 0,
) -> TableWrite:
    return TableWrite(
        table=table,
        schema_version=version,
        table_id=table_id,
        add=files(*add),
        remove=remove,
        overwrite=overwrite,
    )


def commit(
    txn_id: str,
    *writes: TableWrite,
    ts: int | None = None,
    not_before: int | None = None,
    read_ts: int | None = None,
    read_tables: tuple[TableName, ...] = (),
    request_id: str = "",
    stream: str | None = None,
    seq: int | None = None,
) -> CommitTxn:
    return CommitTxn(
        txn_id=txn_id,
        writes=writes,
        ts=ts,
        not_before=not_before,
        read_ts=read_ts,
        read_tables=read_tables,
        request_id=request_id,
        stream=stream,
        seq=seq,
    )


def ready(**driver_args: int) -> Driver:
    """A cluster with ns.a and ns.b created and active (DD has passed)."""
    d = Driver(**driver_args)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT)", step_ms=1)
    d.ok("CREATE TABLE ns.b (y STRING)", step_ms=1)
    tick(d, DD_MS + 1)
    return d


def tick(d: Driver, ms: int = 1) -> None:
    d.tm += ms * MS
    d.index += 1
    d.state.observe_tick(d.tm, d.index).raise_for_error()


def ok(d: Driver, cmd: CommitTxn, *, step_ms: int = 1) -> dict[str, object]:
    outcome = d.apply(cmd, step_ms=step_ms)
    outcome.raise_for_error()
    d.state.check_invariants()
    return outcome.result


def refused(
    d: Driver, cmd: CommitTxn, error: type[MetastoreError], *, step_ms: int = 1
) -> MetastoreError:
    """Apply `cmd`, expect `error`, and check that nothing at all changed."""
    before = d.state.to_snapshot()
    outcome = d.apply(cmd, step_ms=step_ms)
    exc = outcome.exception()
    assert isinstance(exc, error), outcome
    assert d.state.to_snapshot() == before
    d.state.check_invariants()
    return exc


def paths_at(d: Driver, table: TableName, ts: int) -> list[str]:
    return [f.path for f in d.state.files_at(table, ts)]


def ts_of(result: dict[str, object]) -> int:
    ts = result["ts"]
    assert isinstance(ts, int)
    return ts


# --------------------------------------------------------------------------------------------
# Visibility
# --------------------------------------------------------------------------------------------


def test_a_commit_is_visible_at_exactly_its_ts_for_all_its_tables() -> None:
    d = ready()
    result = ok(d, commit("q:1", write(A, add=("a1", "a2")), write(B, add=("b1",))))
    ts = ts_of(result)
    assert ts == d.tm  # a plain commit on an idle log lands at its own Tm
    assert result["tables"] == ["ns.a", "ns.b"]
    assert (result["files_added"], result["files_removed"], result["rows_added"]) == (3, 0, 30)
    assert result["deduplicated"] is False
    for table, expected in ((A, ["a1", "a2"]), (B, ["b1"])):
        assert paths_at(d, table, ts - 1) == []
        assert paths_at(d, table, ts) == expected
        assert paths_at(d, table, ts + 1) == expected
    entry = d.state.files_at(A, ts)[0]
    assert entry == FileEntry(path="a1", size_bytes=100, row_count=10, added_ts=ts)


def test_files_accumulate_in_commit_order_and_old_timestamps_keep_their_answer() -> None:
    d = ready()
    t1 = ts_of(ok(d, commit("q:1", write(A, add=("f1",)))))
    t2 = ts_of(ok(d, commit("q:2", write(A, add=("f2", "f0")))))
    assert paths_at(d, A, t1) == ["f1"]
    assert paths_at(d, A, t2) == ["f1", "f2", "f0"]
    assert paths_at(d, A, t2 - 1) == ["f1"]


def test_a_table_nobody_writes_is_readable_up_to_the_upper() -> None:
    d = ready()
    ts = ts_of(ok(d, commit("q:1", write(A, add=("f1",)))))
    tick(d, 5)
    upper = d.state.table_upper()
    assert upper == d.tm + 1
    created = d.state.describe(B).created_tu
    stamps = (created, ts - 1, ts, upper - 1)
    for at in stamps:
        assert d.state.files_at(B, at) == ()
    with pytest.raises(TableNotFoundError):  # not yet created: no table at that time
        d.state.files_at(B, created - 1)
    # "Readable" means final: below the upper, later commits to either table (even ones that
    # land as early as they can) change no answer, for the written table or the idle one.
    answers = {(t, at): paths_at(d, t, at) for t in (A, B) for at in stamps}
    assert answers[(A, ts)] == answers[(A, upper - 1)] == ["f1"]
    assert answers[(A, ts - 1)] == []
    later = ts_of(ok(d, commit("q:2", write(A, add=("f2",)), write(B, add=("b1",)))))
    assert later >= upper
    ok(d, commit("q:3", write(A, overwrite=True), write(B, add=("b2",))))
    tick(d, 5)
    assert {(t, at): paths_at(d, t, at) for t in (A, B) for at in stamps} == answers


def test_overwrite_replaces_every_live_file_at_the_commit_ts() -> None:
    d = ready()
    t1 = ts_of(ok(d, commit("q:1", write(A, add=("f1", "f2")))))
    t2 = ts_of(ok(d, commit("q:2", write(A, add=("f3",), overwrite=True), write(B, add=("b",)))))
    assert paths_at(d, A, t2 - 1) == ["f1", "f2"]
    assert paths_at(d, A, t2) == ["f3"]
    assert paths_at(d, A, t1) == ["f1", "f2"]  # time travel keeps the removed files
    removed = {e.path: e.removed_ts for e in d.state.txns._tables[1].files.values()}
    assert removed == {"f1": t2, "f2": t2, "f3": None}
    stats = d.state.table_stats(A)
    assert (stats.live_files, stats.live_rows, stats.file_entries) == (1, 10, 3)
    # an overwrite with nothing to add empties the table
    t3 = ts_of(ok(d, commit("q:3", write(A, overwrite=True))))
    assert paths_at(d, A, t3) == []
    assert paths_at(d, A, t3 - 1) == ["f3"]
    assert d.state.txn_log(1)[0].files_removed == 1


def test_remove_hides_a_file_from_its_commit_ts_on() -> None:
    d = ready()
    ok(d, commit("q:1", write(A, add=("f1", "f2"))))
    t2 = ts_of(ok(d, commit("q:2", write(A, add=("f3",), remove=("f1",)))))
    assert paths_at(d, A, t2 - 1) == ["f1", "f2"]
    assert paths_at(d, A, t2) == ["f2", "f3"]
    # removing it again is a conflict (two compactions of the same files): retryable, re-plan
    e = refused(d, commit("q:3", write(A, remove=("f1",))), DataFileConflictError)
    assert e.retryable
    assert e.details == {"table": "ns.a", "path": "f1", "removed_ts": t2}
    refused(d, commit("q:4", write(A, remove=("nope",))), InvalidArgumentError)
    # a path is never reused, live or removed
    refused(d, commit("q:5", write(A, add=("f1",))), InvalidArgumentError)
    refused(d, commit("q:6", write(A, add=("f2",))), InvalidArgumentError)
    # the same path in another table is another file
    ok(d, commit("q:7", write(B, add=("f1",))))


# --------------------------------------------------------------------------------------------
# Commit timestamps
# --------------------------------------------------------------------------------------------


def test_commit_at_a_chosen_ts_and_contention_reports_the_upper() -> None:
    d = ready()
    want = d.tm + 100 * MS  # ahead of the next entry's Tm, within the bound
    assert ts_of(ok(d, commit("q:1", write(A, add=("f1",)), ts=want))) == want
    assert paths_at(d, A, want - 1) == []
    assert paths_at(d, A, want) == ["f1"]
    # another writer asks for the same ts: contention, retry at the upper
    e = refused(d, commit("q:2", write(B, add=("b1",)), ts=want), CommitTimestampUnavailableError)
    assert e.retryable
    retry_at = want + 1 + (limits.COMMIT_RETRY_MARGIN_MS << 16)
    assert e.details == {"ts": want, "upper": want + 1, "retry_at": retry_at}
    assert ts_of(ok(d, commit("q:2", write(B, add=("b1",)), ts=want + 1))) == want + 1
    # a plain commit lands right after the last commit, even above its own Tm
    assert ts_of(ok(d, commit("q:3", write(A, add=("f2",))))) == want + 2
    assert d.tm < want
    assert d.state.table_upper() == want + 3


def test_commit_at_below_the_entrys_own_tm_is_unavailable() -> None:
    d = ready()
    ok(d, commit("q:1", write(A, add=("f1",))))
    stale = d.tm  # the next entry's Tm will be above it
    e = refused(d, commit("q:2", write(A, add=("f2",)), ts=stale), CommitTimestampUnavailableError)
    assert e.details["upper"] == d.tm  # the refused entry's own Tm
    assert e.details["retry_at"] == d.tm + (limits.COMMIT_RETRY_MARGIN_MS << 16)
    assert stale < d.tm


def test_commit_timestamps_cannot_run_ahead_more_than_the_bound() -> None:
    d = ready()  # DD = 500 ms < COMMIT_TS_AHEAD_MAX_MS: the bound is DD
    next_tm = d.tm + MS
    e = refused(d, commit("q:1", write(A), ts=next_tm + DD + 1), InvalidArgumentError)
    assert e.details["max_ts"] == next_tm + DD
    refused(d, commit("q:1", write(A), not_before=d.tm + MS + DD + 1), TimestampAheadError)
    assert ts_of(ok(d, commit("q:1", write(A), ts=d.tm + MS + DD))) == d.tm + DD


def test_a_plain_commit_ahead_of_the_leaders_clock_is_retryable() -> None:
    """Apply version 6: a `not_before` more than the ahead bound past the entry's Tm is
    TIMESTAMP_AHEAD_OF_CLOCK (retryable), not INVALID_ARGUMENT. A batch's `not_before` is Top +
    1, and Top comes from a node's clock, which may lead the leader's by more than DD (500 ms by
    default): the same commit succeeds once the leader's clock has caught up, where before the
    batch failed for good."""
    d = ready()
    next_tm = d.tm + MS
    not_before = next_tm + DD + 1
    e = refused(d, commit("q:1", write(A, add=("f1",)), not_before=not_before), TimestampAheadError)
    assert e.retryable
    assert e.details["not_before"] == not_before
    assert e.details["max_ts"] == next_tm + DD
    assert e.details["ahead_ms"] == 1  # rounded up: 1 logical tick past the bound
    tick(d, 1)  # the leader's clock moves on; the client retries
    assert ts_of(ok(d, commit("q:1", write(A, add=("f1",)), not_before=not_before))) == not_before


def test_a_not_before_no_clock_in_bounds_gives_stays_invalid() -> None:
    """Further ahead than two clock skews past the bound (Top is at most CSmax past its node's
    clock, and a node further than CSmax ahead of the leader fences itself), no clock in bounds
    produced it: retrying would not help soon, so it is still INVALID_ARGUMENT."""
    d = ready()
    skews = 2 * CS_MAX_MS * MS
    refused(d, commit("q:1", write(A), not_before=d.tm + MS + DD + skews), TimestampAheadError)
    e = refused(
        d, commit("q:1", write(A), not_before=d.tm + MS + DD + skews + 1), InvalidArgumentError
    )
    assert e.details["max_ts"] == d.tm + DD  # the refused entry's own Tm + DD


def test_below_version_6_a_not_before_too_far_ahead_is_invalid() -> None:
    d = ready(apply_version=5)
    refused(d, commit("q:1", write(A), not_before=d.tm + MS + DD + 1), InvalidArgumentError)


def test_the_ahead_bound_is_the_named_limit_when_dd_is_larger() -> None:
    d = ready(dd_ms=10_000, cs_max_ms=100)
    ahead = limits.COMMIT_TS_AHEAD_MAX_MS * MS
    refused(d, commit("q:1", write(A), ts=d.tm + MS + ahead + 1), InvalidArgumentError)
    tick(d, 10_001)
    assert ts_of(ok(d, commit("q:1", write(A), ts=d.tm + MS + ahead))) == d.tm + ahead


def test_not_before_raises_a_plain_commit() -> None:
    d = ready()
    nb = d.tm + 50 * MS
    assert ts_of(ok(d, commit("q:1", write(A, add=("f1",)), not_before=nb))) == nb
    # not_before below the upper changes nothing
    assert ts_of(ok(d, commit("q:2", write(A, add=("f2",)), not_before=5))) == nb + 1


def test_commit_timestamps_strictly_increase_in_log_order() -> None:
    d = ready()
    seen = []
    for i in range(30):
        cmd = commit(f"q:{i}", write(A, add=(f"f{i}",)))
        if i % 3 == 1:
            cmd = replace(cmd, not_before=d.tm + (i % 7) * MS)
        elif i % 3 == 2:
            cmd = replace(cmd, ts=max(d.state.table_upper(), d.tm + MS) + i * 1000)
        seen.append(ts_of(ok(d, cmd)))
    assert seen == sorted(set(seen))
    assert [r.ts for r in d.state.txn_log(30)] == seen[::-1]


# --------------------------------------------------------------------------------------------
# Read sets
# --------------------------------------------------------------------------------------------


def test_read_set_conflict_names_the_conflicting_commit() -> None:
    d = ready()
    read_ts = d.tm
    t1 = ts_of(ok(d, commit("w:1", write(A, add=("f1",)))))
    e = refused(
        d,
        commit("r:1", write(B, add=("b1",)), read_ts=read_ts, read_tables=(A, B)),
        ReadConflictError,
    )
    assert e.retryable
    assert e.details == {"table": "ns.a", "read_ts": read_ts, "commit_ts": t1, "txn_id": "w:1"}
    # having read at (or after) the conflicting commit is fine
    ok(d, commit("r:1", write(B, add=("b1",)), read_ts=t1, read_tables=(A, B)))
    # the write just made conflicts for a reader of B at t1
    refused(d, commit("r:2", write(A), read_ts=t1, read_tables=(B,)), ReadConflictError)


def test_read_set_rules() -> None:
    d = ready()
    refused(
        d,
        commit("r:1", write(A), read_ts=d.tm + 10 * MS, read_tables=(B,)),
        InvalidArgumentError,  # read_ts must be below the commit ts
    )
    refused(
        d,
        commit("r:1", write(A), read_ts=d.tm, read_tables=(TableName.of("ns", "zz"),)),
        TableNotFoundError,
    )
    # a dropped table's commits still conflict (any incarnation of the name)
    t1 = ts_of(ok(d, commit("w:1", write(B, add=("b1",)))))
    d.ok("DROP TABLE ns.b")
    refused(d, commit("r:2", write(A), read_ts=t1 - 1, read_tables=(B,)), ReadConflictError)
    ok(d, commit("r:2", write(A), read_ts=t1, read_tables=(B,)))


@pytest.mark.parametrize("apply_version", [4, 5])
def test_a_read_table_dropped_after_read_ts_is_a_read_conflict_from_version_5(
    apply_version: int,
) -> None:
    """A batch that read ns.b at read_ts asked that its commit fail if ns.b changed since. A
    DROP whose activation lies in (read_ts, ts] changes what a read of ns.b gives at the
    commit ts (not found, or a new incarnation, empty) as surely as a commit does: from apply
    version 5 it is a ReadConflict too. Below version 5 the commit went through on what it had
    read."""
    d = ready(apply_version=apply_version)
    read_ts = ts_of(ok(d, commit("w:1", write(B, add=("b1",)))))
    tick(d)
    dropped_tu = d.ok("DROP TABLE ns.b")["tu"]
    assert isinstance(dropped_tu, int)
    tick(d, DD_MS + 1)  # the drop is active before the commit's ts: ns.b is gone at ts
    gone = commit("r:1", write(A, add=("a1",)), read_ts=read_ts, read_tables=(B,))
    if apply_version < 5:
        ok(d, gone)
        return
    e = refused(d, gone, ReadConflictError)
    assert e.retryable
    assert e.details == {
        "table": "ns.b",
        "read_ts": read_ts,
        "dropped_ts": dropped_tu,
        "table_id": 2,
    }
    d.ok("CREATE TABLE ns.b (y STRING)")
    tick(d, DD_MS + 1)
    # Created again, empty: still not what the batch read, which conflicts through the drop.
    assert refused(d, gone, ReadConflictError).details["dropped_ts"] == dropped_tu
    # A creation after read_ts is none: the name was absent at read_ts, the new incarnation is
    # empty until a commit writes it (which conflicts as any commit does).
    ok(d, replace(gone, read_ts=dropped_tu))
    ok(d, commit("w:2", write(B, add=("b2",))))
    refused(d, replace(gone, txn_id="r:2", read_ts=dropped_tu), ReadConflictError)


def test_a_drop_that_activates_after_the_commit_ts_is_no_read_conflict() -> None:
    """The table the batch read is unchanged at the commit's ts (the drop activates later), so
    the commit is serializable at ts: not a conflict (writes to ns.b itself are refused)."""
    d = ready()
    read_ts = ts_of(ok(d, commit("w:1", write(B, add=("b1",)))))
    tick(d)
    dropped_tu = d.ok("DROP TABLE ns.b")["tu"]
    result = ok(d, commit("r:1", write(A, add=("a1",)), read_ts=read_ts, read_tables=(B,)))
    assert isinstance(dropped_tu, int) and ts_of(result) < dropped_tu
    refused(d, commit("r:2", write(B, add=("b2",))), TableNotFoundError)


# --------------------------------------------------------------------------------------------
# Schema versions
# --------------------------------------------------------------------------------------------


def test_schema_version_must_be_one_of_the_two_latest_active_at_the_commit_ts() -> None:
    d = ready()
    ok(d, commit("q:1", write(A, version=1)))
    e = refused(d, commit("q:2", write(A, version=2)), SchemaVersionNotActiveError)
    assert e.retryable
    assert e.details["active_versions"] == [1]
    tu2 = d.ok("ALTER TABLE ns.a ADD COLUMN y INT")["tu"]
    assert isinstance(tu2, int)
    # before Tu2 only v1 is active; at Tu2 both v1 and v2
    refused(d, commit("q:2", write(A, version=2), ts=tu2 - 1), SchemaVersionNotActiveError)
    ok(d, commit("q:2", write(A, version=1), ts=tu2 - 1))
    ok(d, commit("q:3", write(A, version=2), ts=tu2))
    ok(d, commit("q:4", write(A, version=1), ts=tu2 + 1))
    tu3 = d.ok("ALTER TABLE ns.a ADD COLUMN z INT")["tu"]
    assert isinstance(tu3, int)
    ok(d, commit("q:5", write(A, version=1), ts=tu3 - 1))  # v1 still among the two latest
    e = refused(d, commit("q:6", write(A, version=1), ts=tu3), SchemaVersionNotActiveError)
    assert e.details == {"table": "ns.a", "version": 1, "ts": tu3, "active_versions": [2, 3]}
    ok(d, commit("q:6", write(A, version=2), ts=tu3))
    ok(d, commit("q:7", write(A, version=3)))
    refused(d, commit("q:8", write(A, version=4)), SchemaVersionNotActiveError)


# --------------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------------


def test_below_apply_version_9_a_retried_txn_commits_once_whatever_ts_it_carries() -> None:
    """The rule below apply version 9 (from 9 a retry asking for another ts is refused:
    tests/metastore/test_apply_version_9.py)."""
    d = ready(apply_version=8)
    cmd = commit("q:1", write(A, add=("f1", "f2")), write(B, add=("b1",)))
    first = ok(d, cmd)
    tick(d, 50)
    snap_txns = d.state.txns.to_data()
    retries = [
        cmd,
        replace(cmd, ts=d.tm + 10 * MS),
        replace(cmd, ts=1),  # even a ts that is long gone
        replace(cmd, not_before=d.tm + 20 * MS),
        # the same writes listed in another order are the same transaction
        commit(
            "q:1",
            TableWrite(table=B, schema_version=1, add=files("b1")),
            TableWrite(table=A, schema_version=1, add=files("f2", "f1")),
        ),
    ]
    for retry in retries:
        outcome = d.apply(retry)
        assert outcome.ok and outcome.deduplicated
        assert outcome.result == {**first, "deduplicated": True}
        assert d.state.txns.to_data() == snap_txns
    record = d.state.committed_txn("q:1")
    assert record is not None
    assert record.ts == first["ts"]
    assert d.state.committed_txn("q:2") is None


def test_the_same_txn_id_with_other_writes_is_refused() -> None:
    d = ready()
    t1 = ts_of(ok(d, commit("q:1", write(A, add=("f1",)))))
    for other in (
        commit("q:1", write(A, add=("f9",))),
        commit("q:1", write(A, add=("f1",)), write(B)),
        commit("q:1", write(A, add=("f1",), version=2)),
        commit("q:1", write(A, add=("f1",), overwrite=True)),
    ):
        e = refused(d, other, TxnIdReusedError)
        assert not e.retryable
        assert e.details == {"txn_id": "q:1", "committed_ts": t1}


def test_the_remembered_window_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_REMEMBERED_TXNS", 3)
    d = ready()
    for i in range(4):
        ok(d, commit(f"q:{i}", write(A, add=(f"f{i}",))))
    assert d.state.committed_txn("q:0") is None
    assert d.state.txn_stats().remembered_txns == 3
    assert [r.txn_id for r in d.state.txn_log(10)] == ["q:3", "q:2", "q:1"]
    # Outside the window, replaying the very same files still cannot commit them twice...
    refused(d, commit("q:0", write(A, add=("f0",))), InvalidArgumentError)
    # ...but a commit *without a stream position* that rewrote its files commits again: the
    # txn-id window alone cannot tell. Streams carry positions (next tests) for exactly this.
    ok(d, commit("q:0", write(A, add=("f0-again",))))


def test_a_stream_replay_older_than_the_window_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_REMEMBERED_TXNS", 3)
    d = ready()
    first = ok(d, commit("s:0", write(A, add=("f0",)), stream="s", seq=0))
    for i in range(1, 6):
        ok(d, commit(f"other:{i}", write(B, add=(f"b{i}",))))
    assert d.state.committed_txn("s:0") is None  # long out of the txn-id window
    # The replayed batch wrote new files: without the mark it would commit a second time.
    e = refused(
        d,
        commit("s:0", write(A, add=("f0-replayed",)), stream="s", seq=0),
        BatchAlreadyCommittedError,
    )
    assert not e.retryable
    assert e.details == {
        "stream": "s",
        "seq": 0,
        "committed_seq": 0,
        "committed_ts": first["ts"],
        "committed_txn_id": "s:0",
    }
    assert paths_at(d, A, d.state.table_upper() - 1) == ["f0"]


def test_a_txn_id_of_a_stream_mark_used_again_after_the_window_keeps_the_state_loadable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A txn id leaves the window long before its stream's mark goes (the marks are kept per
    stream), and may then be committed again (without the stream, or by another one). The
    mark still names that id, at its own ts, and the record of the id is the new commit: the
    invariant demanded both ts be equal, so every node failed its invariant check and could
    neither load its own snapshot nor install one (MalformedSnapshotError)."""
    monkeypatch.setattr(limits, "MAX_REMEMBERED_TXNS", 3)
    d = ready()
    first = ok(d, commit("x", write(A, add=("f0",)), stream="s", seq=0))
    for i in range(1, 4):
        ok(d, commit(f"other:{i}", write(B, add=(f"b{i}",))))
    assert d.state.committed_txn("x") is None
    again = ok(d, commit("x", write(A, add=("f1",))))  # ok() checks every invariant
    mark = d.state.stream_mark("s")
    assert mark is not None and (mark.txn_id, mark.ts) == ("x", first["ts"])
    record = d.state.committed_txn("x")
    assert record is not None and record.ts == again["ts"] > mark.ts
    restored = MetastoreState.from_snapshot(d.state.to_snapshot())
    assert restored == d.state
    assert restored.stream_mark("s") == mark
    # The mark still refuses a replay of its position.
    refused(d, commit("y", write(A, add=("f2",)), stream="s", seq=0), BatchAlreadyCommittedError)


def test_stream_positions_only_move_forward() -> None:
    d = ready()
    r3 = ok(d, commit("s:3", write(A, add=("f3",)), stream="s", seq=3))
    mark = d.state.stream_mark("s")
    assert mark is not None and (mark.seq, mark.ts, mark.txn_id) == (3, r3["ts"], "s:3")
    # An exact retry of the remembered txn is still a plain de-duplication.
    again = d.apply(commit("s:3", write(A, add=("f3",)), stream="s", seq=3))
    assert again.ok and again.deduplicated and again.result["ts"] == r3["ts"]
    # The same position with other files, or any earlier position, is refused, even under a
    # txn id never seen before (a stream's position decides, not its ids).
    for replay in (
        commit("s:3", write(A, add=("f3b",)), stream="s", seq=3),
        commit("s:2", write(A, add=("f2",)), stream="s", seq=2),
        commit("fresh", write(A, add=("f0",)), stream="s", seq=0),
    ):
        e = refused(d, replay, BatchAlreadyCommittedError)
        assert e.details["committed_seq"] == 3
    # Positions may skip (a batch that wrote nothing commits nothing) and other streams are
    # independent of this one.
    r5 = ok(d, commit("s:5", write(A, add=("f5",)), stream="s", seq=5))
    ok(d, commit("t:0", write(A, add=("t0",)), stream="t", seq=0))
    mark = d.state.stream_mark("s")
    assert mark is not None and (mark.seq, mark.ts) == (5, r5["ts"])
    assert d.state.stream_mark("nobody") is None
    assert d.state.txn_stats().stream_marks == 2
    # A commit refused for another reason does not move the mark.
    refused(d, commit("s:6", write(A, add=("f5",)), stream="s", seq=6), InvalidArgumentError)
    mark = d.state.stream_mark("s")
    assert mark is not None and mark.seq == 5


def test_stream_marks_are_bounded_least_recently_committed_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_STREAM_MARKS", 2)
    d = ready()
    ok(d, commit("a:0", write(A, add=("a0",)), stream="a", seq=0))
    ok(d, commit("b:0", write(A, add=("b0",)), stream="b", seq=0))
    ok(d, commit("a:1", write(A, add=("a1",)), stream="a", seq=1))  # a is now the newest
    ok(d, commit("c:0", write(A, add=("c0",)), stream="c", seq=0))  # evicts b, not a
    assert d.state.stream_mark("b") is None
    assert [m for m in ("a", "b", "c") if d.state.stream_mark(m)] == ["a", "c"]
    assert d.state.txn_stats().stream_marks == 2


def test_stream_marks_survive_snapshots_and_old_snapshots_load() -> None:
    d = ready()
    ok(d, commit("s:0", write(A, add=("f0",)), stream="s", seq=0))
    ok(d, commit("u:4", write(B, add=("b0",)), stream="u", seq=4))
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state and restored.to_snapshot() == snap
    assert restored.stream_mark("u") == d.state.stream_mark("u")
    # A snapshot written before stream marks existed has no "streams" key.
    obj = msgpack.unpackb(snap, raw=False)
    del obj["txns"]["streams"]
    old = MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    assert old.stream_mark("s") is None and old.txn_stats().stream_marks == 0
    # A broken mark is refused.
    obj = msgpack.unpackb(snap, raw=False)
    obj["txns"]["streams"].append(obj["txns"]["streams"][0])
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_request_id_and_txn_id_together() -> None:
    d = ready()
    cmd = commit("q:1", write(A, add=("f1",)), request_id="req-1")
    first = ok(d, cmd)
    again = d.apply(cmd)
    assert again.ok and again.deduplicated
    assert again.result["ts"] == first["ts"]


# --------------------------------------------------------------------------------------------
# Tables: registration, drop, re-create, locations
# --------------------------------------------------------------------------------------------


def test_tables_are_registered_at_created_tu_and_forgotten_at_dropped_tu() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    created = d.ok("CREATE TABLE ns.a (x INT)")
    stats = d.state.table_stats(A)
    assert (stats.registered_ts, stats.forgotten_ts) == (created["tu"], None)
    assert d.ok("CREATE TABLE IF NOT EXISTS ns.a (x INT)")["created"] is False
    assert d.state.txn_stats().registered_tables == 1
    dropped = d.ok("DROP TABLE ns.a")
    log = d.state.txns._tables[1]
    assert (log.registered_ts, log.forgotten_ts) == (created["tu"], dropped["tu"])
    d.ok("CREATE TABLE ns.a (x INT)")
    d.ok("CREATE TABLE ns.b (x INT)")
    cascade = d.ok("DROP NAMESPACE ns CASCADE")
    assert all(t.forgotten_ts == cascade["tu"] for t in list(d.state.txns._tables.values())[1:])
    d.state.check_invariants()


def test_a_table_not_yet_active_at_the_commit_ts_is_not_found_at_that_ts() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    tu = d.ok("CREATE TABLE ns.a (x INT)")["tu"]
    e = refused(d, commit("q:1", write(A)), NotFoundAtTimestampError)
    assert e.details["active_from_tu"] == tu
    assert isinstance(tu, int)
    refused(d, commit("q:1", write(A, add=("f1",)), ts=tu - 1), NotFoundAtTimestampError)
    ok(d, commit("q:1", write(A, add=("f1",)), ts=tu))  # commit_at the activation works


def test_commit_after_drop_fails_and_the_old_files_stay_readable_until_the_drop_tu() -> None:
    d = ready()
    t1 = ts_of(ok(d, commit("q:1", write(A, add=("f1",)))))
    old_id = d.state.describe(A).table_id
    dropped_tu = d.ok("DROP TABLE ns.a")["tu"]
    assert isinstance(dropped_tu, int)
    # a DROP is final once applied, even for timestamps below its Tu
    refused(d, commit("q:2", write(A, add=("f2",))), TableNotFoundError)
    assert paths_at(d, A, t1) == ["f1"]
    assert paths_at(d, A, dropped_tu - 1) == ["f1"]
    with pytest.raises(NotFoundAtTimestampError):
        d.state.files_at(A, dropped_tu)
    # re-created: a new incarnation, empty, reachable only from its own created Tu
    created_tu = d.ok("CREATE TABLE ns.a (x INT, y INT)")["tu"]
    assert isinstance(created_tu, int)
    refused(d, commit("q:2", write(A, add=("f2",))), NotFoundAtTimestampError)
    tick(d, DD_MS)
    # a batch planned against the old incarnation must not land in the new one
    e = refused(d, commit("q:2", write(A, add=("f2",), table_id=old_id)), TableNotFoundError)
    assert e.details["current"] == d.state.describe(A).table_id
    t2 = ts_of(ok(d, commit("q:2", write(A, add=("f1",), table_id=old_id + 2))))
    assert paths_at(d, A, t2) == ["f1"]  # the same relative path, another incarnation's file
    assert paths_at(d, A, t1) == ["f1"]
    assert [c.table_id for c in d.state.commits_since(A, 0).commits] == [old_id, old_id + 2]


def test_location_is_stored_returned_and_unique() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.state.apply(
        parse_ddl("CREATE TABLE ns.a (x INT)", warehouse="/wh"), tm=d.tm + MS, index=d.index + 1
    ).raise_for_error()
    d.tm += MS
    d.index += 1
    assert d.state.describe(A).location == "/wh/ns.db/a"
    d.ok("ALTER TABLE ns.a ADD COLUMN y INT")
    assert [v.location for v in d.state.history(A)] == ["/wh/ns.db/a"] * 2
    assert d.state.schema_at(A, d.tm + DD).location == "/wh/ns.db/a"
    assert d.state.table_stats(A).location == "/wh/ns.db/a"
    for clash in ("/wh/ns.db/a", "/wh/ns.db/a/sub", "/wh/ns.db", "/wh"):
        before = d.state.to_snapshot()
        out = d.sql(f"CREATE TABLE ns.b (x INT) LOCATION '{clash}'")
        assert isinstance(out.exception(), InvalidArgumentError)
        assert d.state.to_snapshot() == before
    d.ok("CREATE TABLE ns.b (x INT) LOCATION '/wh/ns.db/ab'")  # a sibling, not nested
    d.ok("CREATE TABLE ns.c (x INT)")  # no location at all is fine, and never clashes
    d.ok("CREATE TABLE ns.d (x INT)")
    d.ok("DROP TABLE ns.a")
    d.ok("CREATE TABLE ns.e (x INT) LOCATION '/wh/ns.db/a'")  # freed by the drop
    d.state.check_invariants()


def test_create_table_encoding_is_unchanged_without_a_location() -> None:
    cmd = parse_ddl("CREATE TABLE ns.a (x INT)")
    assert isinstance(cmd, CreateTable)
    assert b"location" not in encode_command(cmd)
    with_location = replace(cmd, location="/x")
    assert decode_command(encode_command(with_location)) == with_location
    with pytest.raises(MalformedCommandError):
        decode_command(encode_command(replace(cmd, location="relative")))


# --------------------------------------------------------------------------------------------
# All or nothing, validation and limits
# --------------------------------------------------------------------------------------------


def test_one_bad_write_refuses_the_whole_commit() -> None:
    d = ready()
    ok(d, commit("q:0", write(A, add=("f0",))))
    bad_second = (
        write(B, version=7),
        write(B, remove=("missing",)),
        write(TableName.of("ns", "zz")),
    )
    for bad in bad_second:
        before = d.state.to_snapshot()
        outcome = d.apply(commit("q:1", write(A, add=("f1",), overwrite=True), bad))
        assert not outcome.ok
        assert d.state.to_snapshot() == before
    assert paths_at(d, A, d.state.table_upper() - 1) == ["f0"]


@pytest.mark.parametrize(
    "cmd",
    [
        commit("", write(A)),
        commit("q\n1", write(A)),
        commit("q"),
        commit("q", write(A), write(A)),
        commit("q", write(A, add=("x", "x"))),
        commit("q", write(A, add=("x",), remove=("x",))),
        commit("q", write(A, remove=("x", "x"))),
        commit("q", write(A, remove=("x",), overwrite=True)),
        commit("q", write(A, add=("/abs/x",))),
        commit("q", write(A, add=("s3://b/x",))),
        commit("q", write(A, add=("a/../x",))),
        commit("q", write(A, add=("a//x",))),
        commit("q", write(A, add=("",))),
        commit("q", write(A, add=("a\\x",))),
        commit("q", write(A, version=0)),
        commit("q", write(A, table_id=-1)),
        commit(
            "q",
            TableWrite(
                table=A, schema_version=1, add=(DataFile(path="x", size_bytes=-1, row_count=0),)
            ),
        ),
        commit("q", write(A), ts=1, not_before=1),
        commit("q", write(A), read_ts=1),
        commit("q", write(A), read_tables=(A,)),
        commit("q", write(A), read_ts=1, read_tables=(A, A)),
        commit("q", write(A), ts=-1),
        commit("q", write(A), ts=2**64),
    ],
)
def test_static_validation(cmd: CommitTxn) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_command(cmd)
    d = ready()
    refused(d, cmd, InvalidArgumentError)


def test_limits_are_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    many_files = tuple(f"f{i}" for i in range(limits.MAX_FILES_PER_COMMIT + 1))
    cases = [
        commit("q" * (limits.MAX_TXN_ID_CHARS + 1), write(A)),
        commit("q", write(A, add=many_files)),
        commit("q", write(A, add=("p" * (limits.MAX_FILE_PATH_CHARS + 1),))),
        commit(
            "q",
            *(write(TableName.of("ns", f"t{i}")) for i in range(limits.MAX_TABLES_PER_COMMIT + 1)),
        ),
        commit(
            "q",
            write(A),
            read_ts=1,
            read_tables=tuple(
                TableName.of("ns", f"t{i}") for i in range(limits.MAX_TABLES_PER_COMMIT + 1)
            ),
        ),
    ]
    for cmd in cases:
        with pytest.raises(LimitExceededError):
            validate_command(cmd)
    # the encoded size of a commit has its own bound
    big = commit("q", write(A, add=tuple(f"{'d' * 900}/{i}" for i in range(4000))))
    with pytest.raises(LimitExceededError) as info:
        validate_command(big)
    assert info.value.details["limit"] == "MAX_COMMIT_COMMAND_BYTES"
    monkeypatch.setattr(limits, "MAX_COMMIT_COMMAND_BYTES", 200)
    d = ready()
    e = refused(d, commit("q", write(A, add=tuple(f"f{i}" for i in range(20)))), LimitExceededError)
    assert e.details["limit"] == "MAX_COMMIT_COMMAND_BYTES"


def test_file_entry_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_FILE_ENTRIES_PER_TABLE", 3)
    monkeypatch.setattr(limits, "MAX_FILE_ENTRIES_TOTAL", 5)
    d = ready()
    ok(d, commit("q:1", write(A, add=("f1", "f2"))))
    ok(d, commit("q:2", write(A, add=("f3",), overwrite=True)))  # removed entries count too
    e = refused(d, commit("q:3", write(A, add=("f4",))), LimitExceededError)
    assert e.details["limit"] == "MAX_FILE_ENTRIES_PER_TABLE"
    ok(d, commit("q:3", write(B, add=("b1", "b2"))))
    e = refused(d, commit("q:4", write(B, add=("b3",))), LimitExceededError)
    assert e.details["limit"] == "MAX_FILE_ENTRIES_TOTAL"


@pytest.mark.parametrize("apply_version", [4, 5])
def test_counts_past_64_bits_are_refused_from_version_5(apply_version: int) -> None:
    """Each file may have up to 2^63-1 rows and bytes, but their sums are stored and sent as
    64-bit counts: below apply version 5 three such files committed, and then no node could
    write a snapshot again (the commit record's rows outgrew msgpack), nor a `files` reply."""
    big = 2**63 - 1

    def adding(table: TableName, *items: tuple[str, int, int]) -> TableWrite:
        add = tuple(DataFile(path=p, size_bytes=size, row_count=rows) for p, size, rows in items)
        return TableWrite(table=table, schema_version=1, add=add)

    d = ready(apply_version=apply_version)
    three = commit("q:1", adding(A, *((f"f{i}", 1, big) for i in range(3))))
    if apply_version < 5:
        ok(d, three)  # the old rule, kept for the log it applies
        return
    assert refused(d, three, LimitExceededError).details == {
        "limit": "MAX_TABLE_LIVE_ROWS",
        "max": big,
        "value": 2**64 - 1,  # capped: the details must fit the wire too
    }
    ok(d, commit("q:2", adding(A, ("g1", big, 1))))
    e = refused(d, commit("q:3", adding(A, ("g2", 1, 1))), LimitExceededError)
    assert (e.details["limit"], e.details["value"]) == ("MAX_TABLE_LIVE_BYTES", big + 1)
    # A file replaced (or the table overwritten) leaves room for its successor.
    ok(d, commit("q:4", replace(adding(A, ("g2", big, 1)), remove=("g1",))))
    ok(d, commit("q:5", replace(adding(A, ("g3", big, 1)), overwrite=True)))
    # Each table fits, the commit's rows in all do not.
    e = refused(
        d, commit("q:6", adding(A, ("h1", 0, big - 1)), adding(B, ("h2", 0, 2))), LimitExceededError
    )
    assert (e.details["limit"], e.details["value"]) == ("MAX_COMMIT_ROWS", big + 1)
    assert MetastoreState.from_snapshot(d.state.to_snapshot()) == d.state


def test_a_commit_request_whose_rows_outgrow_64_bits_is_refused_before_it_is_proposed() -> None:
    big = 2**63 - 1
    add = [{"path": f"f{i}", "size_bytes": 1, "row_count": big} for i in range(3)]
    with pytest.raises(LimitExceededError, match="MAX_COMMIT_ROWS"):
        commit_txn_from_request(
            {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1, "add": add}]}
        )


def test_commit_before_init_cluster_is_refused() -> None:
    state = MetastoreState()
    outcome = state.apply(commit("q", write(A)), tm=10, index=1)
    assert isinstance(outcome.exception(), ClusterNotInitializedError)


# --------------------------------------------------------------------------------------------
# Reads
# --------------------------------------------------------------------------------------------


def test_txn_log_is_newest_first_and_bounded() -> None:
    d = ready()
    for i in range(5):
        writes = (write(A, add=(f"f{i}",)), write(B)) if i % 2 else (write(A, add=(f"f{i}",)),)
        ok(d, commit(f"q:{i}", *writes))
    log = d.state.txn_log(3)
    assert [r.txn_id for r in log] == ["q:4", "q:3", "q:2"]
    assert log[0].tables == (A,)
    assert log[1].tables == (A, B)
    for bad in (0, limits.MAX_TXN_LOG_RECORDS + 1):
        with pytest.raises(InvalidArgumentError):
            d.state.txn_log(bad)


def test_txn_log_pages_continue_before_the_last_tm_seen() -> None:
    d = ready()
    for i in range(5):
        ok(d, commit(f"q:{i}", write(A, add=(f"f{i}",))))
    first = d.state.txn_log(2)
    rest = d.state.txn_log(10, before_tm=first[-1].tm)
    assert [r.txn_id for r in (*first, *rest)] == ["q:4", "q:3", "q:2", "q:1", "q:0"]
    assert d.state.txn_log(10, before_tm=rest[-1].tm) == ()


def test_txn_log_reads_need_a_valid_limit_even_when_empty() -> None:
    d = ready()
    assert d.state.txn_log(5) == ()


def test_commits_since_and_trimming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_COMMITS_KEPT_PER_TABLE", 3)
    d = ready()
    stamps = [ts_of(ok(d, commit(f"q:{i}", write(A, add=(f"f{i}",))))) for i in range(5)]
    since = d.state.commits_since(A, stamps[2])
    assert [c.txn_id for c in since.commits] == ["q:3", "q:4"]
    assert since.complete
    assert d.state.commits_since(A, stamps[1]).complete  # q:0 and q:1 dropped, both <= since
    older = d.state.commits_since(A, stamps[0])
    assert not older.complete
    assert [c.txn_id for c in older.commits] == ["q:2", "q:3", "q:4"]
    empty = d.state.commits_since(B, 0)
    assert (empty.table, empty.commits, empty.complete) == (B, (), True)
    stats = d.state.table_stats(A)
    assert (stats.commits, stats.last_commit_ts, stats.last_txn_id) == (5, stamps[-1], "q:4")
    with pytest.raises(TableNotFoundError):
        d.state.commits_since(TableName.of("ns", "zz"), 0)


# --------------------------------------------------------------------------------------------
# Snapshots and invariants
# --------------------------------------------------------------------------------------------


def _busy() -> Driver:
    d = ready()
    ok(d, commit("q:1", write(A, add=("f1", "f2")), write(B, add=("b1",))))
    ok(d, commit("q:2", write(A, add=("f3",), remove=("f1",)), ts=d.tm + 100 * MS))
    ok(d, commit("q:3", write(B, add=("b2",), overwrite=True)))
    d.ok("ALTER TABLE ns.a ADD COLUMN y INT")
    d.ok("DROP TABLE ns.b")
    d.ok("CREATE TABLE ns.b (z INT) LOCATION '/data/b'")
    tick(d, DD_MS)
    ok(d, commit("q:4", write(B, add=("b1",))))
    return d


def test_snapshot_round_trip_includes_the_txn_log() -> None:
    d = _busy()
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state
    assert restored.to_snapshot() == snap
    upper = d.state.table_upper()
    for table in (A, B):
        for ts in range(upper - 200 * MS, upper, 7 * MS):
            with contextlib.suppress(MetastoreError):
                assert restored.files_at(table, ts) == d.state.files_at(table, ts)
    # both keep working identically (dedup memory included)
    for cmd in (commit("q:5", write(A, add=("f9",), version=2)), commit("q:1", write(A))):
        a = d.state.apply(cmd, tm=d.tm + MS, index=d.index + 1)
        b = restored.apply(cmd, tm=d.tm + MS, index=d.index + 1)
        assert a == b
        d.tm += MS
        d.index += 1
    assert restored.to_snapshot() == d.state.to_snapshot()


def test_version_1_snapshots_still_load() -> None:
    d = Driver(apply_version=1)  # older snapshots load at apply version 1
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT)")
    d.ok("CREATE TABLE ns.b (x INT)")
    d.ok("DROP TABLE ns.b")
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    del obj["txns"]
    del obj["sessions"], obj["gc"], obj["jobs"]
    del obj["revoked"]  # format 7 (at apply version 1 a state is written as format 7)
    obj["v"] = 1
    for _ns, _name, incs in obj["catalog"]["tables"]:
        for inc in incs:
            assert inc.pop() == ""  # version 1 had no location
    restored = MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    assert restored == d.state


def test_snapshot_with_a_broken_txn_log_is_refused() -> None:
    d = _busy()
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    tables = obj["txns"]["tables"]
    tables[0][10][0][4] = tables[0][10][0][3]  # a file removed at its own add ts
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    obj["txns"]["tables"] = obj["txns"]["tables"][1:]  # an incarnation missing from the log
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    obj["txns"] = {"tables": 3}
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_check_invariants_catches_corruption_of_the_txn_log() -> None:
    def corrupt(how: str) -> None:
        d = _busy()
        d.state.check_invariants()
        log = d.state.txns
        tl = log._tables[1]
        first = next(iter(tl.files))
        if how == "removal before add":
            tl.files[first] = replace(tl.files[first], removed_ts=tl.files[first].added_ts - 1)
        elif how == "live index":
            tl.live.pop(next(iter(tl.live)))
        elif how == "registration":
            tl.registered_ts += 1
        elif how == "txn id to nowhere":
            record = log._txns["q:1"]
            log._txns["q:1"] = replace(record, table_ids=(99, 98))
        elif how == "commit order":
            log._last_commit_ts -= 10 * MS
        elif how == "file before registration":
            tl.files[first] = replace(tl.files[first], added_ts=tl.registered_ts - 1)
        elif how == "stream mark after the last commit":
            log._streams["s"] = StreamMark(
                stream="s", seq=1, ts=log.last_commit_ts + 1, txn_id="q:1"
            )
        with pytest.raises(CatalogInvariantError):
            d.state.check_invariants()

    for how in (
        "removal before add",
        "live index",
        "registration",
        "txn id to nowhere",
        "commit order",
        "file before registration",
        "stream mark after the last commit",
    ):
        corrupt(how)


# --------------------------------------------------------------------------------------------
# Decoding and the request form
# --------------------------------------------------------------------------------------------


def _commit_data(**overrides: object) -> bytes:
    from metastore.commands import command_to_data

    base = command_to_data(commit("q:1", write(A, add=("f1",), remove=("f0",))))
    base.update(overrides)
    return msgpack.packb(base, use_bin_type=True)


_GOOD_WRITE = {
    "table": ["ns", "a"],
    "table_id": 0,
    "schema_version": 1,
    "add": [["f", 1, 1]],
    "remove": [],
    "overwrite": False,
}


@pytest.mark.parametrize(
    "data",
    [
        _commit_data(writes=[]),
        _commit_data(writes="x"),
        _commit_data(writes=[{**_GOOD_WRITE, "add": [["f", 1]]}]),
        _commit_data(writes=[{**_GOOD_WRITE, "add": [["f", True, 1]]}]),
        _commit_data(writes=[{**_GOOD_WRITE, "add": [[1, 1, 1]]}]),
        _commit_data(writes=[{**_GOOD_WRITE, "remove": [1]}]),
        _commit_data(writes=[{**_GOOD_WRITE, "extra": 1}]),
        _commit_data(writes=[{**_GOOD_WRITE, "overwrite": 0}]),
        _commit_data(writes=[_GOOD_WRITE, _GOOD_WRITE]),
        _commit_data(ts="1"),
        _commit_data(ts=-5),
        _commit_data(read_tables=[["ns"]]),
        _commit_data(read_tables=["ns.a"]),
        _commit_data(txn_id=None),
        _commit_data(txn_id=""),
        b"\x00" * (limits.MAX_COMMIT_COMMAND_BYTES + 1),
    ],
)
def test_malformed_commits_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedCommandError):
        decode_command(data)
    d = ready()
    before = d.state.to_snapshot()
    outcome = d.state.apply_bytes(data, tm=d.tm + MS, index=d.index + 1)
    assert isinstance(outcome.exception(), MalformedCommandError)
    assert d.state.to_snapshot() == before


def test_a_ddl_command_may_not_use_the_commit_size_bound() -> None:
    from metastore.schema import Column, Schema
    from metastore.types import INT

    columns = tuple(
        Column(name=f"c{i}", type=INT, comment="x" * limits.MAX_COMMENT_CHARS) for i in range(400)
    )
    big = CreateTable(table=A, schema=Schema(columns=columns))
    validate_command(big)  # valid, only too large for a DDL command
    data = encode_command(big)
    assert limits.MAX_COMMAND_BYTES < len(data) <= limits.MAX_COMMIT_COMMAND_BYTES
    with pytest.raises(MalformedCommandError, match="MAX_COMMAND_BYTES"):
        decode_command(data)


@DETERMINISTIC
@given(st.binary(max_size=400))
def test_garbage_bytes_only_raise_malformed(data: bytes) -> None:
    prefix = _commit_data()[:20]
    for blob in (data, prefix + data):
        with contextlib.suppress(MalformedCommandError):
            decode_command(blob)


def test_request_form_matches_the_bridge_shape() -> None:
    args = {
        "txn_id": "query:7",
        "not_before": 12345,
        "read_ts": 12000,
        "read_tables": ["NS.B"],
        "writes": [
            {
                "table": "ns.a",
                "schema_version": 2,
                "add": [{"path": "_txn/x/part-0.parquet", "size_bytes": 5, "row_count": 2}],
                "remove": [],
                "overwrite": True,
            }
        ],
    }
    cmd = commit_txn_from_request(args)
    assert cmd == CommitTxn(
        txn_id="query:7",
        not_before=12345,
        read_ts=12000,
        read_tables=(B,),
        writes=(
            TableWrite(
                table=A,
                schema_version=2,
                add=(DataFile(path="_txn/x/part-0.parquet", size_bytes=5, row_count=2),),
                overwrite=True,
            ),
        ),
    )
    minimal = commit_txn_from_request(
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1}]}
    )
    assert minimal == commit("t", write(A))
    streamed = commit_txn_from_request(
        {
            "txn_id": "q:i:7",
            "stream": "q:i",
            "seq": 7,
            "writes": [{"table": "ns.a", "schema_version": 1}],
        }
    )
    assert streamed == commit("q:i:7", write(A), stream="q:i", seq=7)


def test_a_stream_position_survives_encoding_and_is_omitted_when_absent() -> None:
    plain = commit("q:1", write(A, add=("f1",)))
    streamed = replace(plain, stream="q:id", seq=12)
    assert decode_command(encode_command(streamed)) == streamed
    assert decode_command(encode_command(plain)) == plain
    # A commit without a stream encodes exactly as before stream positions existed.
    assert b"stream" not in encode_command(plain)
    for bad in (["q"], ["q", "1"], [1, 1], ["q", True], None):
        with pytest.raises(MalformedCommandError):
            decode_command(_commit_data(stream=bad))


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"txn_id": "t"},
        {"txn_id": "t", "writes": [{"table": "ns.a"}]},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": "1"}]},
        {"txn_id": "t", "writes": [{"table": "a", "schema_version": 1}]},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1, "typo": 1}]},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1, "add": [{"path": "x"}]}]},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1, "remove": [3]}]},
        {"txn_id": "t", "writes": [], "extra": True},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1}], "ts": True},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1}], "read_tables": [1]},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1}], "stream": "s"},
        {"txn_id": "t", "writes": [{"table": "ns.a", "schema_version": 1}], "seq": 1},
        {
            "txn_id": "t",
            "writes": [{"table": "ns.a", "schema_version": 1}],
            "stream": "s",
            "seq": -1,
        },
        {
            "txn_id": "t",
            "writes": [{"table": "ns.a", "schema_version": 1}],
            "stream": "",
            "seq": 1,
        },
        {
            "txn_id": "t",
            "writes": [{"table": "ns.a", "schema_version": 1}],
            "stream": "a\nb",
            "seq": 1,
        },
    ],
)
def test_bad_requests_get_invalid_argument(args: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        commit_txn_from_request(args)


@DETERMINISTIC
@given(msgpack_values)
def test_any_request_value_only_raises_metastore_errors(value: object) -> None:
    for args in (value, {"txn_id": "t", "writes": value}, {"txn_id": "t", "writes": [value]}):
        with contextlib.suppress(InvalidArgumentError, LimitExceededError):
            commit_txn_from_request(cast("Mapping[str, object]", args))


def test_outcome_of_a_commit_survives_the_wire() -> None:
    d = ready()
    outcome = d.apply(commit("q:1", write(A, add=("f1",))))
    assert Outcome.from_data(msgpack.unpackb(msgpack.packb(outcome.to_data()), raw=False)) == (
        outcome
    )


def test_refusals_show_timestamps_as_readable_times_and_keep_the_integers() -> None:
    """A person reads `2026-...Z (hlc N)` in a refusal, as in every other error; a script still
    finds the integer (in the text, and in the details)."""
    from hlc import ts_text

    d = ready()
    t1 = ts_of(ok(d, commit("q:1", write(A, add=("f1",)), stream="s", seq=1)))
    t2 = ts_of(ok(d, commit("q:2", write(A, remove=("f1",)))))
    removed = refused(d, commit("q:3", write(A, remove=("f1",))), DataFileConflictError)
    reused = refused(d, commit("q:1", write(A, add=("f9",))), TxnIdReusedError)
    replay = refused(
        d, commit("s:0", write(A, add=("f0",)), stream="s", seq=1), BatchAlreadyCommittedError
    )
    stale = refused(d, commit("q:4", write(A, add=("f4",)), ts=t2), CommitTimestampUnavailableError)
    ahead = refused(d, commit("q:5", write(A), ts=d.tm + 2 * DD), InvalidArgumentError)
    for e, ts in ((removed, t2), (reused, t1), (replay, t1), (stale, t2)):
        assert ts_text(ts) in str(e), str(e)
    assert ts_text(int(stale.details["retry_at"])) in str(stale)
    assert ts_text(int(ahead.details["max_ts"])) in str(ahead)
    assert isinstance(ahead.details["ts"], int)  # the raw value stays for scripts
