"""MetastoreState.apply semantics: activation timing, stale Tm, atomic failures, request-id
de-duplication, effects, limits, snapshots and invariant checking."""

from __future__ import annotations

import pytest

from metastore import limits
from metastore.catalog import SchemaVersion
from metastore.commands import (
    AddColumn,
    AlterTable,
    CreateNamespace,
    DropColumn,
    InitCluster,
    TableName,
    encode_command,
)
from metastore.ddl import parse_ddl
from metastore.errors import (
    CatalogInvariantError,
    ClusterAlreadyInitializedError,
    ClusterNotInitializedError,
    ColumnNotFoundError,
    ErrorCode,
    LimitExceededError,
    MalformedSnapshotError,
    MetastoreError,
    NamespaceNotEmptyError,
    NotFoundAtTimestampError,
    TableNotFoundError,
)
from metastore.outcome import Outcome, SchemaVersionPublished, TableDropped
from metastore.schema import Column
from metastore.state import MetastoreState
from metastore.types import INT
from tests.metastore._driver import DD, MS, T0, Driver

T = TableName.of("ns", "t")


def code(outcome: Outcome) -> str | None:
    return None if outcome.error is None else str(outcome.error["code"])


def columns_at(state: MetastoreState, top: int) -> list[str]:
    return [c.name for c in state.schema_at(T, top).schema.columns]


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    driver.ok("CREATE NAMESPACE ns")
    return driver


# --- activation timing ----------------------------------------------------------------------


def test_schema_at_exactly_around_tu(d: Driver) -> None:
    created = d.ok("CREATE TABLE ns.t (a INT)")
    tu1 = created["tu"]
    assert tu1 == d.tm + DD
    # Before its activation the table does not exist, the same answer as on a node that has not
    # applied the CREATE yet (so no `active_from_tu`: that would come from a later entry).
    with pytest.raises(TableNotFoundError) as info:
        d.state.schema_at(T, tu1 - 1)
    assert info.value.details == {"table": "ns.t", "top": tu1 - 1}
    assert d.state.schema_at(T, tu1).version == 1
    assert d.state.schema_at("NS.T", tu1 + 1).version == 1

    altered = d.ok("ALTER TABLE ns.t ADD COLUMN b INT")
    tu2 = altered["tu"]
    assert tu2 == d.tm + DD
    assert columns_at(d.state, tu2 - 1) == ["a"]
    assert columns_at(d.state, tu2) == ["a", "b"]
    assert columns_at(d.state, tu2 + 1) == ["a", "b"]
    v2 = d.state.schema_at(T, tu2)
    assert (v2.version, v2.tm, v2.tu) == (2, d.tm, tu2)
    assert v2.summary == "ADD COLUMN b INT"


def test_alter_before_creation_activates_keeps_order(d: Driver) -> None:
    tu1 = d.ok("CREATE TABLE ns.t (a INT)")["tu"]
    tu2 = d.ok("ALTER TABLE ns.t ADD COLUMN b INT")["tu"]  # 1 ms later, still before tu1
    assert tu1 < tu2
    assert columns_at(d.state, tu1) == ["a"]
    assert columns_at(d.state, tu2) == ["a", "b"]


def test_drop_is_time_activated_and_history_kept(d: Driver) -> None:
    tu1 = d.ok("CREATE TABLE ns.t (a INT)")["tu"]
    dropped = d.ok("DROP TABLE ns.t", step_ms=1000)
    tud = dropped["tu"]
    assert tud == d.tm + DD
    assert d.state.schema_at(T, tud - 1).version == 1
    with pytest.raises(NotFoundAtTimestampError) as info:
        d.state.schema_at(T, tud)
    assert info.value.details["dropped_at_tu"] == tud
    assert d.state.schema_at(T, tu1).version == 1  # time travel still works
    with pytest.raises(TableNotFoundError):
        d.state.current(T)
    assert d.state.list_tables("ns") == ()
    assert d.state.list_tables("ns", top=tud - 1) == (T,)
    assert d.state.list_tables("ns", top=tud) == ()


def test_recreated_table_is_a_new_incarnation(d: Driver) -> None:
    first = d.ok("CREATE TABLE ns.t (a INT)")
    tud = d.ok("DROP TABLE ns.t")["tu"]
    second = d.ok("CREATE TABLE ns.t (x STRING, y STRING)", step_ms=2)
    assert second["table_id"] != first["table_id"]
    assert second["tu"] > tud
    old = d.state.schema_at(T, tud - 1)
    assert (old.table_id, [c.name for c in old.schema.columns]) == (first["table_id"], ["a"])
    with pytest.raises(NotFoundAtTimestampError):
        d.state.schema_at(T, tud)  # gap between the drop and the re-creation activating
    new = d.state.schema_at(T, int(str(second["tu"])))
    assert (new.table_id, new.version) == (second["table_id"], 1)
    assert new.schema.field_ids() == [1, 2]  # ids restart: a new table
    assert len(d.state.catalog.incarnations(T)) == 2


def test_unknown_table_is_not_found(d: Driver) -> None:
    with pytest.raises(TableNotFoundError):
        d.state.schema_at(T, T0)


# --- stale Tm -------------------------------------------------------------------------------


def test_stale_tm_is_rejected_and_changes_nothing(d: Driver) -> None:
    before = d.state.to_snapshot()
    for tm in (d.tm, d.tm - 1, 0):
        outcome = d.state.apply(CreateNamespace(namespace="x"), tm=tm, index=d.index + 1)
        assert code(outcome) == "STALE_TIMESTAMP"
        exc = outcome.exception()
        assert exc is not None and exc.retryable
        assert d.state.observe_tick(tm, d.index + 1).ok is False
    assert d.state.to_snapshot() == before


def test_ticks_move_safe_time_only(d: Driver) -> None:
    before = d.state.catalog.to_data()
    outcome = d.state.observe_tick(d.tm + 5 * MS, d.index + 1)
    assert outcome.ok
    assert d.state.safe_time == d.tm + 5 * MS
    assert d.state.applied_index == d.index + 1
    assert d.state.catalog.to_data() == before


def test_index_going_backwards_with_fresh_tm_is_a_bug(d: Driver) -> None:
    with pytest.raises(CatalogInvariantError):
        d.state.apply(CreateNamespace(namespace="x"), tm=d.tm + MS, index=d.index)


# --- failures change nothing -----------------------------------------------------------------

FAILING = [
    ("CREATE NAMESPACE ns", "NAMESPACE_ALREADY_EXISTS"),
    ("DROP NAMESPACE nope", "NAMESPACE_NOT_FOUND"),
    ("DROP NAMESPACE ns", "NAMESPACE_NOT_EMPTY"),
    ("CREATE TABLE nope.t (a INT)", "NAMESPACE_NOT_FOUND"),
    ("CREATE TABLE ns.t (a INT)", "TABLE_ALREADY_EXISTS"),
    ("DROP TABLE ns.nope", "TABLE_NOT_FOUND"),
    ("ALTER TABLE ns.nope ADD COLUMN x INT", "TABLE_NOT_FOUND"),
    ("ALTER TABLE ns.t ADD COLUMN a INT", "COLUMN_ALREADY_EXISTS"),
    ("ALTER TABLE ns.t DROP COLUMN nope", "COLUMN_NOT_FOUND"),
    ("ALTER TABLE ns.t RENAME COLUMN a TO S", "COLUMN_ALREADY_EXISTS"),
    ("ALTER TABLE ns.t ADD COLUMN z INT NOT NULL", "UNSUPPORTED_SCHEMA_CHANGE"),
    ("ALTER TABLE ns.t ALTER COLUMN a TYPE SMALLINT", "UNSUPPORTED_SCHEMA_CHANGE"),
    ("ALTER TABLE ns.t ALTER COLUMN a SET NOT NULL", "UNSUPPORTED_SCHEMA_CHANGE"),
    ("ALTER TABLE ns.t ALTER COLUMN s.x SET NOT NULL", "UNSUPPORTED_SCHEMA_CHANGE"),
    ("ALTER TABLE ns.t DROP COLUMN s.x", "UNSUPPORTED_SCHEMA_CHANGE"),
    ("ALTER TABLE ns.t UNSET TBLPROPERTIES ('nope')", "INVALID_ARGUMENT"),
    ("ALTER TABLE ns.t ALTER COLUMN a AFTER a", "INVALID_ARGUMENT"),
    # atomic: the first change alone would succeed
    ("ALTER TABLE ns.t ADD COLUMNS (ok1 INT, a INT)", "COLUMN_ALREADY_EXISTS"),
    ("ALTER TABLE ns.t DROP COLUMNS (a, s)", "UNSUPPORTED_SCHEMA_CHANGE"),
    ("ALTER TABLE ns.t ADD COLUMN q " + "ARRAY<" * 16 + "INT" + ">" * 16 + " FIRST", None),
    ("ALTER TABLE ns.t ADD COLUMN s.q " + "ARRAY<" * 16 + "INT" + ">" * 16, "LIMIT_EXCEEDED"),
]


@pytest.mark.parametrize(("sql", "expected"), FAILING)
def test_failures_change_nothing(d: Driver, sql: str, expected: str | None) -> None:
    d.ok("CREATE TABLE ns.t (a INT, s STRUCT<x: INT>) TBLPROPERTIES ('k'='v')")
    before = d.state.to_snapshot()
    outcome = d.sql(sql, request_id="req")
    if expected is None:  # the control case: the limit is inclusive
        assert outcome.ok
        return
    assert code(outcome) == expected
    assert outcome.effects == ()
    assert d.state.to_snapshot() == before
    d.state.check_invariants()


def test_malformed_bytes_change_nothing(d: Driver) -> None:
    before = d.state.to_snapshot()
    outcome = d.state.apply_bytes(b"\x93garbage", tm=d.tm + MS, index=d.index + 1)
    assert code(outcome) == "MALFORMED_COMMAND"
    assert d.state.to_snapshot() == before
    good = encode_command(CreateNamespace(namespace="x"))
    assert d.state.apply_bytes(good, tm=d.tm + MS, index=d.index + 1).ok


# --- cluster initialization -----------------------------------------------------------------


def test_commands_need_init_first() -> None:
    state = MetastoreState()
    outcome = state.apply(CreateNamespace(namespace="ns"), tm=T0, index=1)
    assert code(outcome) == ErrorCode.CLUSTER_NOT_INITIALIZED.value
    assert isinstance(outcome.exception(), ClusterNotInitializedError)
    assert state.to_snapshot() == MetastoreState().to_snapshot()


def test_init_is_idempotent_but_fixed() -> None:
    state = MetastoreState()
    assert state.apply(InitCluster(dd_ms=500, cs_max_ms=100), tm=T0, index=1).result["initialized"]
    again = state.apply(InitCluster(dd_ms=500, cs_max_ms=100), tm=T0 + 1, index=2)
    assert again.ok and again.result["initialized"] is False
    other = state.apply(InitCluster(dd_ms=200, cs_max_ms=100), tm=T0 + 2, index=3)
    assert isinstance(other.exception(), ClusterAlreadyInitializedError)


def test_dd_comes_from_init() -> None:
    d = Driver(dd_ms=40, cs_max_ms=10)
    d.ok("CREATE NAMESPACE ns")
    assert d.ok("CREATE TABLE ns.t (a INT)")["tu"] == d.tm + 40 * MS


# --- request-id de-duplication ----------------------------------------------------------------


def test_retry_returns_recorded_outcome_and_changes_nothing_else(d: Driver) -> None:
    d.ok("CREATE TABLE ns.t (a INT)")
    first = d.sql("ALTER TABLE ns.t ADD COLUMN b INT", request_id="r1")
    catalog_before = d.state.catalog.to_data()
    retry = d.sql("ALTER TABLE ns.t ADD COLUMN b INT", request_id="r1")
    assert retry.deduplicated and retry.ok
    assert (retry.result, retry.effects) == (first.result, first.effects)
    assert d.state.catalog.to_data() == catalog_before
    assert d.state.last_tm == d.tm  # the retry's entry was applied: safe time moved
    assert len(d.state.history(T)) == 2


def test_request_id_reused_for_another_command(d: Driver) -> None:
    d.ok("CREATE TABLE ns.t (a INT)", request_id="r1")
    before = d.state.to_snapshot()
    outcome = d.sql("DROP TABLE ns.t", request_id="r1")
    assert code(outcome) == "REQUEST_ID_REUSED"
    assert d.state.to_snapshot() == before


def test_failures_are_not_recorded_so_a_retry_can_succeed(d: Driver) -> None:
    failed = d.sql("CREATE TABLE other.t (a INT)", request_id="r1")
    assert code(failed) == "NAMESPACE_NOT_FOUND"
    d.ok("CREATE NAMESPACE other")
    retry = d.sql("CREATE TABLE other.t (a INT)", request_id="r1")
    assert retry.ok and not retry.deduplicated


def test_request_ids_expire_by_tm(d: Driver) -> None:
    d.ok("CREATE TABLE ns.t (a INT)", request_id="r1")
    retention_ms = limits.REQUEST_ID_RETENTION_MS
    within = d.sql("CREATE TABLE ns.t (a INT)", request_id="r1", step_ms=retention_ms - 1)
    assert within.deduplicated
    expired = d.sql("CREATE TABLE ns.t (a INT)", request_id="r1", step_ms=retention_ms + 1)
    assert code(expired) == "TABLE_ALREADY_EXISTS"


def test_request_log_is_bounded(d: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_REMEMBERED_REQUESTS", 3)
    for i in range(5):
        d.ok(f"CREATE NAMESPACE n{i}", request_id=f"r{i}")
    assert len(d.state.requests) == 3
    assert d.state.requests.lookup("r1", tm=d.tm) is None  # evicted, oldest first
    assert d.state.requests.lookup("r4", tm=d.tm) is not None
    d.state.check_invariants()


# --- namespaces, effects, no-ops ---------------------------------------------------------------


def test_effects_and_results(d: Driver) -> None:
    created = d.sql("CREATE TABLE ns.t (a INT)")
    assert created.effects == (
        SchemaVersionPublished(table=T, table_id=1, version=1, tu=d.tm + DD),
    )
    altered = d.sql("ALTER TABLE ns.t ADD COLUMN b INT")
    assert altered.effects == (
        SchemaVersionPublished(table=T, table_id=1, version=2, tu=d.tm + DD),
    )
    dropped = d.sql("DROP TABLE ns.t")
    assert dropped.effects == (TableDropped(table=T, table_id=1, tu=d.tm + DD),)
    assert d.sql("DROP TABLE IF EXISTS ns.t").result["dropped"] is False


def test_noop_alter_creates_no_version(d: Driver) -> None:
    d.ok("CREATE TABLE ns.t (a INT) TBLPROPERTIES ('k'='v')")
    outcome = d.sql("ALTER TABLE ns.t SET TBLPROPERTIES ('k'='v')")
    assert outcome.ok and outcome.result["changed"] is False and outcome.effects == ()
    assert d.sql("ALTER TABLE ns.t DROP COLUMN IF EXISTS zz").result["changed"] is False
    assert len(d.state.history(T)) == 1
    changed = d.sql("ALTER TABLE ns.t SET TBLPROPERTIES ('k'='w')")
    assert changed.result["version"] == 2
    assert d.state.current(T).properties == (("k", "w"),)


def test_if_not_exists_answers_with_the_existing_table(d: Driver) -> None:
    first = d.ok("CREATE TABLE ns.t (a INT)")
    again = d.ok("CREATE TABLE IF NOT EXISTS ns.t (b STRING)")
    assert again["created"] is False and again["table_id"] == first["table_id"]
    assert d.ok("CREATE NAMESPACE IF NOT EXISTS ns")["created"] is False


def test_drop_namespace_restrict_and_cascade(d: Driver) -> None:
    d.ok("CREATE TABLE ns.a (x INT)")
    d.ok("CREATE TABLE ns.b (x INT)")
    refused = d.sql("DROP NAMESPACE ns")
    assert isinstance(refused.exception(), NamespaceNotEmptyError)
    exc = refused.exception()
    assert exc is not None and exc.details["table_count"] == 2
    cascade = d.sql("DROP NAMESPACE ns CASCADE")
    assert cascade.result["dropped_tables"] == ["ns.a", "ns.b"]
    assert {e.table.name for e in cascade.effects} == {"a", "b"}
    assert d.state.list_namespaces() == ()
    # history of the dropped tables stays readable at old timestamps
    assert d.state.schema_at("ns.a", d.tm + DD - 1).version == 1
    d.ok("CREATE NAMESPACE ns")
    assert d.state.list_tables("ns") == ()


def test_reads(d: Driver) -> None:
    d.ok("CREATE TABLE ns.t (a INT) COMMENT 'tab' TBLPROPERTIES ('k'='v')")
    d.ok("ALTER TABLE ns.t ADD COLUMN b STRING")
    desc = d.state.describe("ns.t")
    assert (desc.table, desc.version_count, desc.current.comment) == (T, 2, "tab")
    assert [v.version for v in d.state.history(T)] == [1, 2]
    assert d.state.current(T).schema.to_spark_ddl() == "`a` INT, `b` STRING"
    assert [n.name for n in d.state.list_namespaces()] == ["ns"]
    assert d.state.list_tables("NS") == (T,)
    with pytest.raises(MetastoreError):
        d.state.list_tables("nope")


# --- limits in apply ---------------------------------------------------------------------------


def test_table_and_namespace_limits(d: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_TABLES", 2)
    monkeypatch.setattr(limits, "MAX_NAMESPACES", 2)
    d.ok("CREATE TABLE ns.a (x INT)")
    d.ok("CREATE TABLE ns.b (x INT)")
    assert code(d.sql("CREATE TABLE ns.c (x INT)")) == "LIMIT_EXCEEDED"
    d.ok("DROP TABLE ns.a")  # dropped tables do not count
    d.ok("CREATE TABLE ns.c (x INT)")
    d.ok("CREATE NAMESPACE n2")
    outcome = d.sql("CREATE NAMESPACE n3")
    exc = outcome.exception()
    assert isinstance(exc, LimitExceededError)
    assert exc.details["limit"] == "MAX_NAMESPACES"


def test_versions_per_table_limit(d: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_SCHEMA_VERSIONS_PER_TABLE", 3)
    d.ok("CREATE TABLE ns.t (a INT)")
    d.ok("ALTER TABLE ns.t ADD COLUMN b INT")
    d.ok("ALTER TABLE ns.t ADD COLUMN c INT")
    assert code(d.sql("ALTER TABLE ns.t ADD COLUMN d INT")) == "LIMIT_EXCEEDED"


def test_apply_revalidates_commands_built_in_code(d: Driver) -> None:
    d.ok("CREATE TABLE ns.t (a INT)")
    bad = AlterTable(table=T, changes=(AddColumn(column=Column(field_id=9, name="b", type=INT)),))
    assert code(d.apply(bad)) == "INVALID_ARGUMENT"
    missing = AlterTable(table=T, changes=(DropColumn(path=("zz",)),))
    assert isinstance(d.apply(missing).exception(), ColumnNotFoundError)


# --- snapshots and invariants -------------------------------------------------------------------


def _busy_driver() -> Driver:
    d = Driver()
    d.ok("CREATE NAMESPACE ns COMMENT 'n' WITH DBPROPERTIES ('a'='1')")
    d.ok("CREATE TABLE ns.t (a INT NOT NULL, s STRUCT<x: INT>) COMMENT 'c'", request_id="q1")
    d.ok("ALTER TABLE ns.t ADD COLUMN s.y ARRAY<STRUCT<z: INT>>", request_id="q2")
    d.ok("ALTER TABLE ns.t RENAME COLUMN a TO b")
    d.ok("CREATE TABLE ns.u (a INT)")
    d.ok("DROP TABLE ns.u")
    d.ok("CREATE TABLE ns.u (v STRING)")
    d.state.observe_tick(d.tm + MS, d.index + 1)
    return d


def test_snapshot_round_trip_is_exact() -> None:
    d = _busy_driver()
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state
    assert restored.to_snapshot() == snap
    assert restored.safe_time == d.state.safe_time
    # and the restored state keeps working identically
    outcome_a = d.state.apply(
        parse_ddl("ALTER TABLE ns.t ADD COLUMN q INT"), tm=d.tm + 9 * MS, index=d.index + 9
    )
    outcome_b = restored.apply(
        parse_ddl("ALTER TABLE ns.t ADD COLUMN q INT"), tm=d.tm + 9 * MS, index=d.index + 9
    )
    assert outcome_a == outcome_b
    assert restored.to_snapshot() == d.state.to_snapshot()


def test_snapshot_bytes_do_not_depend_on_insertion_order() -> None:
    d = Driver()
    for name in ("y", "x", "z"):
        d.ok(f"CREATE NAMESPACE {name}")
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)  # rebuilt in sorted order
    assert list(restored.catalog._namespaces) != list(d.state.catalog._namespaces)
    assert restored.to_snapshot() == snap


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x80", b"garbage", b"\x92\x01\x02"])
def test_garbage_snapshots_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(data)


def test_inconsistent_snapshot_is_refused() -> None:
    import msgpack

    d = _busy_driver()
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    obj["last_tm"] = 5  # older than the stored versions
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_check_invariants_catches_corruption() -> None:
    d = _busy_driver()
    d.state.check_invariants()
    inc = d.state.catalog.live_table(T)
    v = inc.versions[-1]
    broken = SchemaVersion(
        table_id=v.table_id,
        version=v.version,
        schema=v.schema,
        comment=v.comment,
        properties=v.properties,
        tm=v.tm,
        tu=v.tu + 1,
        summary=v.summary,
    )
    from dataclasses import replace

    d.state.catalog._tables[T] = (replace(inc, versions=(*inc.versions[:-1], broken)),)
    with pytest.raises(CatalogInvariantError):
        d.state.check_invariants()


# --- the read hot path --------------------------------------------------------------------------


def test_schema_at_bisect_agrees_with_a_linear_scan() -> None:
    """The hot path bisects the tu index; it must pick exactly the version a naive scan picks.
    (Its speed is measured by `make bench-catalog`, not asserted here: timed tests flake.)"""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT)")
    for i in range(200):
        d.ok(f"ALTER TABLE ns.t ADD COLUMN c{i} INT")
    history = d.state.history(T)
    tus = [v.tu for v in history]
    # Every tu exactly, one unit either side of it, and points spread over the whole history.
    tops = sorted(
        {t + delta for t in tus for delta in (-1, 0, 1)} | {T0 + i * 997 for i in range(2000)}
    )
    found = 0
    for top in tops:
        expected = [v for v in history if v.tu <= top]
        if not expected:
            with pytest.raises(TableNotFoundError):
                d.state.schema_at(T, top)
            continue
        assert d.state.schema_at(T, top) == expected[-1]
        found += 1
    assert found > len(tus)  # the scan covered every version, not only the "absent" side


def test_check_invariants_catches_a_reused_field_id() -> None:
    from dataclasses import replace

    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT, b INT)")
    d.ok("ALTER TABLE ns.t DROP COLUMN b")
    d.finish_jobs()
    d.ok("ALTER TABLE ns.t ADD COLUMN c INT")
    d.state.check_invariants()
    inc = d.state.catalog.live_table(T)
    last = inc.versions[-1]
    c = last.schema.columns[-1]
    reused = replace(last.schema, columns=(last.schema.columns[0], replace(c, field_id=2)))
    tampered = replace(inc, versions=(*inc.versions[:-1], replace(last, schema=reused)))
    d.state.catalog._tables[T] = (tampered,)
    with pytest.raises(CatalogInvariantError, match="retired"):
        d.state.check_invariants()


def test_drop_namespace_refusal_counts_its_tables_in_english(d: Driver) -> None:
    d.ok("CREATE TABLE ns.a (x INT)")
    one = d.sql("DROP NAMESPACE ns").exception()
    assert one is not None and "has 1 table; drop it or use CASCADE" in one.message, one
    d.ok("CREATE TABLE ns.b (x INT)")
    two = d.sql("DROP NAMESPACE ns").exception()
    assert two is not None and "has 2 tables; drop them or use CASCADE" in two.message, two
