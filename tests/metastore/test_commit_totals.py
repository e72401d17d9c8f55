"""A commit's totals fit a 64-bit count (found by the GC and txn reviews, apply version 5).

Each added file's size and row count is bounded (2^63-1), their sums in a commit were not: three
files of 2^63-1 rows made the commit summary (rows_added, kept in the table's commit list and
the remembered transactions) larger than msgpack's 64 bits. From then on no node could write a
snapshot, so no log could ever be compacted, and `gc status` / `table stats` of the table could
not be sent. From apply version 5 such a commit is refused and changes nothing (metastore.txn:
MAX_COMMIT_ROWS, MAX_TABLE_LIVE_ROWS / _BYTES)."""

from __future__ import annotations

import msgpack
import pytest

from metastore.commands import CommitTxn, DataFile, TableName, TableWrite
from metastore.errors import LimitExceededError
from metastore.state import MetastoreState
from tests.metastore._driver import DD_MS, MS, Driver, ok, refused

A = TableName.of("ns", "a")
B = TableName.of("ns", "b")
BIG = 2**63 - 1


def _driver(apply_version: int) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT) LOCATION '/w/a'")
    d.ok("CREATE TABLE ns.b (x INT) LOCATION '/w/b'")
    d.tm += 2 * DD_MS * MS
    return d


def _write(table: TableName, *files: tuple[str, int, int]) -> TableWrite:
    return TableWrite(
        table=table,
        schema_version=1,
        add=tuple(DataFile(path=p, size_bytes=size, row_count=rows) for p, size, rows in files),
    )


@pytest.mark.parametrize(
    "writes",
    [
        # rows of one table's files
        (_write(A, ("f1", 1, BIG), ("f2", 1, BIG)),),
        # bytes of one table's files
        (_write(A, ("f1", BIG, 1), ("f2", 1, 1)),),
        # rows over two tables: the transaction's own total
        (_write(A, ("f1", 1, BIG)), _write(B, ("g1", 1, 1))),
    ],
)
def test_a_commit_whose_totals_outgrow_64_bits_is_refused(writes: tuple[TableWrite, ...]) -> None:
    d = _driver(5)
    error = refused(d, CommitTxn(txn_id="big", writes=writes), LimitExceededError)
    msgpack.packb(error.to_wire())  # the refusal itself can be sent
    ok(d, CommitTxn(txn_id="fits", writes=(_write(A, ("f1", BIG, BIG)),)))
    assert MetastoreState.from_snapshot(d.state.to_snapshot()) == d.state


def test_below_apply_version_5_such_a_commit_still_applies() -> None:
    d = _driver(4)
    writes = (_write(A, ("f1", 1, BIG), ("f2", 1, BIG)),)
    ok(d, CommitTxn(txn_id="big", writes=writes))
    assert [f.path for f in d.state.files_at(A, d.tm + DD_MS * MS)] == ["f1", "f2"]
    assert d.state.table_stats(A).live_rows == BIG  # the view saturates (below)


def test_views_of_counts_past_64_bits_saturate_and_can_be_sent() -> None:
    # A state from before version 5 may hold such totals (and compaction clients claim the
    # bytes and rows of manifests, which the state cannot check): `table stats` and `gc status`
    # sum them, and a sum past 64 bits made their replies unencodable (every table's row in
    # `gc status` failed with it). They saturate at 2^63-1 instead.
    from metastore.commands import Protect
    from metastore.daemon.gc_worker import gc_status

    d = _driver(4)
    big = ("f1", BIG, BIG), ("f2", BIG, BIG), ("f3", BIG, BIG)
    ts = ok(d, CommitTxn(txn_id="big", writes=(_write(A, *big),)))["ts"]
    ok(d, Protect(record_id="keep", ts=ts, tables=(A,), created_by="test"))
    ok(
        d,
        CommitTxn(
            txn_id="over",
            writes=(
                TableWrite(
                    table=A,
                    schema_version=1,
                    add=(DataFile(path="g", size_bytes=1, row_count=1),),
                    overwrite=True,
                ),
            ),
        ),
    )
    ok(d, CommitTxn(txn_id="again", writes=(_write(B, *big),)))
    stats = d.state.table_stats(B)
    assert (stats.live_bytes, stats.live_rows) == (BIG, BIG)
    d.tm += 26 * 3600 * 1000 * MS  # past the default TTL: only the protection keeps them
    view = gc_status(d.state, now_tm=d.tm, table=None)
    msgpack.packb(view)  # every count fits
    assert [p["held_bytes"] for p in view["protections"]] == [BIG]
