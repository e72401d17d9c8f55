"""Apply version 9's rules (metastore.apply_version), on the pure state machine: each refused
from 9 (a typed error, the state unchanged) and applied as before below 9, so a cluster whose
nodes run two releases applies one log the same way until it is finalized.

What each test would catch: a writer releasing another client's protection by sending
ReleaseProtection itself; a retried txn id answered "done" for a request that differs from
the recorded one (another ts, read set or stream position), which told the caller its writes
were visible at a ts they were not; a NUL stored in a comment, request id or protection meta;
any of them refused below 9 (a node of the older release would apply it).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from metastore.commands import (
    AddColumn,
    AlterColumnType,
    AlterTable,
    CommitTxn,
    CreateNamespace,
    CreateTable,
    DataFile,
    Protect,
    ReleaseProtection,
    SetApplyVersion,
    SetColumnComment,
    TableName,
    TableWrite,
    decode_command,
    encode_command,
    refuse_nul,
)
from metastore.errors import (
    BatchAlreadyCommittedError,
    ForbiddenError,
    InvalidArgumentError,
    TxnIdReusedError,
)
from metastore.schema import Column, Schema
from metastore.types import Primitive, PrimitiveType, StructField, StructType
from tests.metastore._driver import DD_MS, MS, Driver, ok, refused

T = TableName.of("ns", "t")
U = TableName.of("ns", "u")
BEFORE, V9 = 8, 9
INT = PrimitiveType(kind=Primitive.INT)


def cluster(apply_version: int) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (id INT)")
    d.ok("CREATE TABLE ns.u (id INT)")
    d.tm += (DD_MS + 1) * MS
    return d


# --------------------------------------------------------------------------------------------
# 1. Releasing another client's protection
# --------------------------------------------------------------------------------------------


def alices_record(d: Driver) -> None:
    ok(d, Protect(record_id="p", ts=d.tm, tables=(T,), created_by="alice"))


def test_from_9_a_release_as_creator_of_another_clients_record_is_forbidden() -> None:
    d = cluster(V9)
    alices_record(d)
    for by in ("bob", ""):
        e = refused(d, ReleaseProtection(record_id="p", by=by), ForbiddenError)
        assert e.details == {"record_id": "p", "created_by": "alice", "by": by}
        assert "needs the admin role" in e.message
    assert d.state.gc.in_force("p")
    # The creator may; so may an admin (reason "admin", which only that role proposes).
    assert ok(d, ReleaseProtection(record_id="p", by="alice"))["released"] is True
    alices_record(d)
    assert ok(d, ReleaseProtection(record_id="p", reason="admin", by="root"))["released"]


def test_from_9_the_leaders_own_releases_are_not_owner_checked() -> None:
    d = cluster(V9)
    ok(d, Protect(record_id="p", ts=d.tm, tables=(T,), created_by="alice", max_age_ms=1))
    d.tm += 10 * MS
    out = ok(d, ReleaseProtection(record_id="p", reason="expired", by="leader:1"))
    assert out["released"] is True


def test_below_9_a_release_of_another_clients_record_is_applied_as_before() -> None:
    d = cluster(BEFORE)
    alices_record(d)
    assert ok(d, ReleaseProtection(record_id="p", by="bob"))["released"] is True


# --------------------------------------------------------------------------------------------
# 2. A retried txn id with another request
# --------------------------------------------------------------------------------------------


def commit(txn_id: str = "q:1", **kw: object) -> CommitTxn:
    add = (DataFile(path="f1", size_bytes=100, row_count=1),)
    write = TableWrite(table=T, schema_version=1, add=add)
    return CommitTxn(txn_id=txn_id, writes=(write,), **kw)  # type: ignore[arg-type]


def test_from_9_a_retry_with_another_ts_read_set_or_stream_position_is_refused() -> None:
    d = cluster(V9)
    asked = d.tm + 5 * MS
    original = commit(ts=asked, read_ts=d.tm - MS, read_tables=(U,))
    assert ok(d, original)["ts"] == asked
    d.tm += 20 * MS
    for other in (
        replace(original, ts=asked + 7 * MS),
        replace(original, ts=None),
        replace(original, read_ts=None, read_tables=()),
        replace(original, read_tables=(T, U)),
        replace(original, stream="s", seq=1),
    ):
        e = refused(d, other, TxnIdReusedError)
        assert e.details == {"txn_id": "q:1", "committed_ts": asked}
        assert "retry must repeat the request exactly" in e.message
    e = refused(d, replace(original, ts=asked + 7 * MS), TxnIdReusedError)
    assert "not at" in e.message  # names the ts it asked for
    out = d.apply(original)  # the same request is deduplicated
    assert out.ok and out.deduplicated and out.result["ts"] == asked
    # not_before is a lower bound a retry may raise (a bridge's re-run plans at a later Top).
    planned = replace(commit_other(), txn_id="q:2", not_before=d.tm)
    committed_ts = ok(d, planned)["ts"]
    d.tm += 20 * MS
    out = d.apply(replace(planned, not_before=d.tm))
    assert out.ok and out.deduplicated and out.result["ts"] == committed_ts


def test_below_9_a_retry_with_another_ts_is_deduplicated_as_before() -> None:
    d = cluster(BEFORE)
    asked = d.tm + 5 * MS
    ok(d, commit(ts=asked))
    out = d.apply(commit(ts=asked + 7 * MS))
    assert out.ok and out.deduplicated and out.result["ts"] == asked


def test_a_commit_recorded_before_9_is_compared_by_its_writes_and_ts_after_the_upgrade() -> None:
    d = cluster(BEFORE)
    asked = d.tm + 5 * MS
    ok(d, commit(ts=asked, read_ts=d.tm - MS, read_tables=(U,)))
    ok(d, SetApplyVersion(version=V9))
    # Its record holds the digest of its writes alone: a retry asking for another ts is what
    # can still be told apart, and is refused; the rest is deduplicated as when recorded.
    e = refused(d, commit(ts=asked + 7 * MS), TxnIdReusedError)
    assert e.details == {"txn_id": "q:1", "committed_ts": asked} and "not at" in e.message
    for same in (commit(ts=asked), commit(), commit(read_ts=d.tm - MS, read_tables=(T,))):
        out = d.apply(same)
        assert out.ok and out.deduplicated and out.result["ts"] == asked
    refused(d, commit_other(), TxnIdReusedError)


def test_a_retry_with_a_stream_position_meets_its_mark_first() -> None:
    """Validation order (metastore.txn): exact retry, stream mark, TxnIdReused. A retry of
    another request at its own position is refused by the mark: a typed error too."""
    d = cluster(V9)
    asked = d.tm + 5 * MS
    ok(d, commit(ts=asked, stream="s", seq=1))
    refused(d, commit(ts=asked + 7 * MS, stream="s", seq=1), BatchAlreadyCommittedError)


def commit_other() -> CommitTxn:
    """The same txn id with other writes: TxnIdReused at every version."""
    add = (DataFile(path="f9", size_bytes=1, row_count=1),)
    write = TableWrite(table=T, schema_version=1, add=add)
    return CommitTxn(txn_id="q:1", writes=(write,))


def test_the_retry_refusal_the_leader_checks_before_proposing() -> None:
    """`TxnLog.retry_refusal`: what the daemon refuses before proposing, on every version (a
    record of the writes alone and a retry asking for another ts), and nothing else."""
    for version in (BEFORE, V9):
        d = cluster(version)
        asked = d.tm + 5 * MS
        ok(d, commit(ts=asked))
        txns = d.state.txns
        refusal = txns.retry_refusal(commit(ts=asked + MS))
        if version == BEFORE:
            assert isinstance(refusal, TxnIdReusedError)
            assert refusal.details == {"txn_id": "q:1", "committed_ts": asked}
        else:
            assert refusal is None  # a whole-request record: apply refuses it itself
        assert txns.retry_refusal(commit(ts=asked)) is None
        assert txns.retry_refusal(commit()) is None
        assert txns.retry_refusal(commit(txn_id="q:2", ts=asked + MS)) is None
        assert txns.retry_refusal(replace(commit_other(), ts=asked + MS)) is None


# --------------------------------------------------------------------------------------------
# 3. NUL characters
# --------------------------------------------------------------------------------------------


def nul_commands() -> list[tuple[str, object]]:
    """(the field the refusal names, a command carrying a NUL there)."""
    nested = StructType(fields=(StructField(name="x", type=INT, comment="a\0b"),))
    return [
        ("namespace ns2 comment", CreateNamespace(namespace="ns2", comment="a\0b")),
        (
            "table ns.n comment",
            CreateTable(
                table=TableName.of("ns", "n"),
                schema=Schema(columns=(Column(name="c", type=INT),)),
                comment="\0",
            ),
        ),
        (
            "column c comment",
            CreateTable(
                table=TableName.of("ns", "n"),
                schema=Schema(columns=(Column(name="c", type=INT, comment="x\0"),)),
            ),
        ),
        (
            "field x comment (in column s)",
            CreateTable(
                table=TableName.of("ns", "n"),
                schema=Schema(columns=(Column(name="s", type=nested),)),
            ),
        ),
        (
            "column c2 comment",
            AlterTable(
                table=T, changes=(AddColumn(column=Column(name="c2", type=INT, comment="\0")),)
            ),
        ),
        (
            "column id comment",
            AlterTable(table=T, changes=(SetColumnComment(path=("id",), comment="ok\0"),)),
        ),
        (
            "field x comment (in column id)",
            AlterTable(table=T, changes=(AlterColumnType(path=("id",), new_type=nested),)),
        ),
        ("protection meta", Protect(record_id="p", ts=1, tables=(T,), meta="{\0}")),
        ("request id", CreateNamespace(namespace="ns2", request_id="r\0")),
    ]


@pytest.mark.parametrize(("field", "cmd"), nul_commands(), ids=lambda v: str(v)[:30])
def test_from_9_a_nul_is_refused_naming_the_field(field: str, cmd: object) -> None:
    d = cluster(V9)
    if isinstance(cmd, Protect):
        cmd = replace(cmd, ts=d.tm)
    e = refused(d, cmd, InvalidArgumentError)  # type: ignore[arg-type]
    assert e.details == {"field": field, "reason": "nul_character"}
    # The decoder does not know the version: the entry still decodes, apply refuses it.
    assert decode_command(encode_command(cmd)) == cmd  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "cmd"),
    # A column's type cannot become a STRUCT (UNSUPPORTED_SCHEMA_CHANGE at every version).
    [(f, c) for f, c in nul_commands() if f != "field x comment (in column id)"],
    ids=lambda v: str(v)[:30],
)
def test_below_9_a_nul_is_applied_as_before(field: str, cmd: object) -> None:
    d = cluster(BEFORE)
    if isinstance(cmd, Protect):
        cmd = replace(cmd, ts=d.tm)
    out = d.apply(cmd)  # type: ignore[arg-type]
    assert out.ok, (field, out)


def test_from_9_a_decoded_commit_with_a_nul_request_id_is_refused() -> None:
    """Apply does not validate a decoded commit again (its checks are the decoder's): the NUL
    check must still run for it."""
    d = cluster(V9)
    before = d.state.to_snapshot()
    d.tm += MS
    d.index += 1
    out = d.state.apply_bytes(encode_command(commit(request_id="r\0")), tm=d.tm, index=d.index)
    assert isinstance(out.exception(), InvalidArgumentError)
    assert d.state.to_snapshot() == before


def test_other_control_characters_in_comments_stay_allowed() -> None:
    d = cluster(V9)
    ok(d, AlterTable(table=T, changes=(SetColumnComment(path=("id",), comment="a\nb\tc"),)))
    refuse_nul(CreateNamespace(namespace="ns2", comment="line\nline"))
