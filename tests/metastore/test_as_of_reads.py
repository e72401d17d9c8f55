"""Reads AS OF a timestamp (IEP-98's Atomicity Property for every timestamped read, not only
`schema_at`): namespaces activate and drop at Tm + DD like tables, `describe_at` resolves the
incarnation existing at Top, and an answer for Top depends only on entries with Tm <= Top - DD,
so two replicas at different log positions that may both serve Top give identical answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import msgpack
import pytest

from hlc import to_iso
from metastore.catalog import Catalog
from metastore.commands import TableName
from metastore.daemon.views import description_view, file_view, namespace_view, version_view
from metastore.ddl import parse_ddl
from metastore.errors import (
    CatalogInvariantError,
    InvalidArgumentError,
    MalformedSnapshotError,
    MetastoreError,
    NamespaceAlreadyExistsError,
    NamespaceNotFoundError,
    NotFoundAtTimestampError,
    TableNotFoundError,
    UnsupportedSchemaChangeError,
)
from metastore.state import MetastoreState
from tests.metastore._driver import DD, MS, Driver, refused

T = TableName.of("ns", "t")


def _ns_names(state: MetastoreState, top: int | None = None) -> list[str]:
    return [n.name for n in state.list_namespaces(top=top)]


# --- namespaces activate at Tm + DD ---------------------------------------------------------------


def test_namespace_exists_for_reads_from_its_tu() -> None:
    d = Driver()
    created = d.ok("CREATE NAMESPACE ns COMMENT 'one'")
    tu = created["tu"]
    assert isinstance(tu, int)
    assert tu == d.tm + DD
    assert _ns_names(d.state) == ["ns"]  # live at once: CREATE TABLE may use it
    assert _ns_names(d.state, tu - 1) == []
    assert _ns_names(d.state, tu) == ["ns"]
    with pytest.raises(NamespaceNotFoundError) as info:
        d.state.list_tables("ns", top=tu - 1)
    assert info.value.details == {"namespace": "ns", "top": tu - 1}
    assert d.state.list_tables("ns", top=tu) == ()
    assert d.state.catalog.namespace_at("ns", tu).created_tu == tu


def test_namespace_drop_activates_at_its_tu_and_takes_its_tables() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    tu_t = d.ok("CREATE TABLE ns.t (a INT)")["tu"]
    assert isinstance(tu_t, int)
    dropped = d.ok("DROP NAMESPACE ns CASCADE", step_ms=50)
    tud = dropped["tu"]
    assert tud == d.tm + DD
    assert isinstance(tud, int)
    # Apply-time rules see the drop at once ...
    with pytest.raises(NamespaceNotFoundError):
        d.state.list_tables("ns")
    assert _ns_names(d.state) == []
    refused = d.sql("CREATE TABLE ns.u (a INT)")
    assert refused.error is not None and refused.error["code"] == "NAMESPACE_NOT_FOUND"
    # ... reads AS OF see it from its tu.
    assert d.state.list_tables("ns", top=tud - 1) == (T,)
    assert _ns_names(d.state, tud - 1) == ["ns"]
    assert d.state.schema_at(T, tud - 1).version == 1
    with pytest.raises(NotFoundAtTimestampError) as info:
        d.state.list_tables("ns", top=tud)
    assert info.value.details == {"namespace": "ns", "top": tud, "dropped_at_tu": tud}
    assert _ns_names(d.state, tud) == []
    assert d.state.list_tables("ns", top=tu_t) == (T,)  # time travel keeps the history


def test_namespace_drop_and_recreate_keeps_both_incarnations() -> None:
    d = Driver()
    first_tu = d.ok("CREATE NAMESPACE ns COMMENT 'one'")["tu"]
    d.ok("CREATE TABLE ns.t (a INT)")
    tud = d.ok("DROP NAMESPACE ns CASCADE")["tu"]
    # Re-created before the drop has even activated: a new incarnation after the old one.
    second = d.ok("CREATE NAMESPACE ns COMMENT 'two'", step_ms=2)
    assert second["created"] is True
    assert isinstance(first_tu, int) and isinstance(tud, int)
    second_tu = second["tu"]
    assert isinstance(second_tu, int) and second_tu > tud
    old, new = d.state.catalog.namespace_incarnations("ns")
    assert (old.comment, old.dropped_tu, new.comment, new.live) == ("one", tud, "two", True)
    assert d.state.catalog.namespace_at("ns", tud - 1).comment == "one"
    with pytest.raises(NotFoundAtTimestampError):
        d.state.catalog.namespace_at("ns", tud)  # the gap between the two lives
    assert d.state.catalog.namespace_at("ns", second_tu).comment == "two"
    assert [n.comment for n in d.state.list_namespaces(top=second_tu)] == ["two"]
    # The dropped namespace's table stays where it was; the new namespace is empty.
    assert d.state.list_tables("ns", top=tud - 1) == (T,)
    assert d.state.list_tables("ns", top=second_tu) == ()
    assert d.state.list_tables("ns") == ()
    d.state.check_invariants()


def test_create_namespace_of_a_live_name() -> None:
    d = Driver()
    tu = d.ok("CREATE NAMESPACE ns")["tu"]
    failed = d.sql("CREATE NAMESPACE ns")
    assert failed.error is not None
    assert failed.error["code"] == NamespaceAlreadyExistsError.code.value
    again = d.ok("CREATE NAMESPACE IF NOT EXISTS ns", step_ms=3)
    # Its tu makes the server's reply wait until the namespace is visible everywhere.
    assert again == {"namespace": "ns", "created": False, "tu": tu}
    assert len(d.state.catalog.namespace_incarnations("ns")) == 1


def test_drop_if_exists_of_a_dropped_name_returns_the_drop_tu() -> None:
    """So the reply waits until that drop is visible everywhere, like CREATE IF NOT EXISTS."""
    d = Driver()
    assert "tu" not in d.ok("DROP NAMESPACE IF EXISTS ns")  # never existed: nothing to wait for
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT)")
    tud_t = d.ok("DROP TABLE ns.t")["tu"]
    assert d.ok("DROP TABLE IF EXISTS ns.t") == {"table": "ns.t", "dropped": False, "tu": tud_t}
    assert "tu" not in d.ok("DROP TABLE IF EXISTS ns.nope")
    tud = d.ok("DROP NAMESPACE ns")["tu"]
    assert d.ok("DROP NAMESPACE IF EXISTS ns") == {
        "namespace": "ns",
        "dropped": False,
        "dropped_tables": [],
        "tu": tud,
    }
    failed = d.sql("DROP NAMESPACE ns")
    assert failed.error is not None and failed.error["code"] == "NAMESPACE_NOT_FOUND"


# --- describe AS OF ------------------------------------------------------------------------------


def test_describe_at_follows_the_incarnation_across_drop_and_create() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    first = d.ok("CREATE TABLE ns.t (a INT) LOCATION '/wh/one'")
    tu1 = first["tu"]
    tu2 = d.ok("ALTER TABLE ns.t ADD COLUMN b INT")["tu"]
    tud = d.ok("DROP TABLE ns.t", step_ms=100)["tu"]
    second = d.ok("CREATE TABLE ns.t (x STRING) LOCATION '/wh/two'", step_ms=100)
    tu3 = second["tu"]
    assert all(isinstance(t, int) for t in (tu1, tu2, tud, tu3))
    assert isinstance(tu1, int) and isinstance(tu2, int)
    assert isinstance(tud, int) and isinstance(tu3, int)

    at = d.state.describe_at
    with pytest.raises(TableNotFoundError) as before:
        at(T, tu1 - 1)
    assert before.value.details == {"table": "ns.t", "top": tu1 - 1}
    # The message shows the time as a person reads it, with the integer a script may use.
    assert f"at {to_iso(tu1 - 1)} (hlc {tu1 - 1})" in before.value.message
    v1 = at(T, tu1)
    assert (v1.table_id, v1.current.version, v1.version_count) == (first["table_id"], 1, 1)
    assert (v1.created_tu, v1.location, v1.format) == (tu1, "/wh/one", "parquet")
    v2 = at(T, tud - 1)
    assert (v2.current.version, v2.version_count) == (2, 2)
    assert [c.name for c in v2.current.schema.columns] == ["a", "b"]
    assert at(T, tu2 - 1).version_count == 1
    with pytest.raises(NotFoundAtTimestampError) as gap:
        at(T, tud)
    assert gap.value.details == {"table": "ns.t", "top": tud, "dropped_at_tu": tud}
    assert f"dropped at {to_iso(tud)} (hlc {tud})" in gap.value.message
    v3 = at(T, tu3)
    assert (v3.table_id, v3.current.version, v3.version_count) == (second["table_id"], 1, 1)
    assert (v3.created_tu, v3.location) == (tu3, "/wh/two")
    # `describe` (no AS OF) is the live incarnation; `describe_at` agrees with `schema_at`.
    assert d.state.describe(T).table_id == second["table_id"]
    for top in (tu1, tu2, tud - 1, tu3, tu3 + 5 * MS):
        assert at(T, top).current == d.state.schema_at(T, top)


# --- the same answer at every log position that may serve Top ------------------------------------


def _answer(read: Callable[[], object]) -> object:
    try:
        return ("ok", read())
    except MetastoreError as e:
        return ("error", e.code.value, e.message, e.details)


def _answers(state: MetastoreState, top: int, *, files: bool = True) -> dict[str, object]:
    """Every read that takes a timestamp, as the server puts it on the wire (full answers,
    errors included). `files` only where a node may serve them (safe time >= top)."""
    out: dict[str, object] = {
        "namespaces": _answer(lambda: [namespace_view(n) for n in state.list_namespaces(top=top)])
    }
    for ns in ("ns", "other"):
        out[f"tables {ns}"] = _answer(lambda ns=ns: state.list_tables(ns, top=top))
    for name in ("ns.t", "ns.u", "other.t"):
        out[f"schema {name}"] = _answer(lambda n=name: version_view(n, state.schema_at(n, top)))
        out[f"describe {name}"] = _answer(
            lambda n=name: description_view(state.describe_at(n, top))
        )
        if files:
            out[f"files {name}"] = _answer(
                lambda n=name: [file_view(f) for f in state.files_at(n, top)]
            )
    return out


def test_a_lagging_and_an_up_to_date_replica_give_the_same_answers() -> None:
    """Replica B stops after a prefix of the log; A applies the rest (DROPs, re-CREATEs of tables
    and namespaces, an ALTER). For every Top that B may serve (safe time >= Top - DD) both give
    identical answers: what A applied later activates after Top. Before the fix, a node that had
    applied the DROP NAMESPACE refused `list_tables` AS OF earlier times, and a CREATE applied on
    A only turned B's TABLE_NOT_FOUND into NOT_FOUND_AT_TIMESTAMP on A."""
    prefix = [
        "CREATE NAMESPACE ns",
        "CREATE TABLE ns.t (a INT)",
        "CREATE NAMESPACE other",
        "CREATE TABLE other.t (a INT)",
        "ALTER TABLE ns.t ADD COLUMN b INT",
    ]
    suffix = [
        "DROP TABLE ns.t",
        "CREATE TABLE ns.t (x STRING)",
        "CREATE TABLE ns.u (a INT)",
        "DROP NAMESPACE other CASCADE",
        "CREATE NAMESPACE other",
        "ALTER TABLE ns.t ADD COLUMN y INT",
    ]
    a, b = Driver(), Driver()
    for sql in prefix:
        a.ok(sql, step_ms=100)
        b.ok(sql, step_ms=100)
    for sql in suffix:
        a.ok(sql, step_ms=1)  # every later entry has Tm > B's safe time
    assert a.state.safe_time > b.state.safe_time
    servable = b.state.safe_time + DD  # the newest Top that B may answer
    tops = sorted(
        {servable - k * 37 * MS for k in range(60)}
        | {servable, servable - 1}
        | {v.tu + delta for v in b.state.catalog.incarnations(T)[0].versions for delta in (-1, 0)}
    )
    differ = {}
    for top in tops:
        files = top <= b.state.safe_time
        lagging, ahead = _answers(b.state, top, files=files), _answers(a.state, top, files=files)
        differ.update({(top, k): (v, ahead[k]) for k, v in lagging.items() if v != ahead[k]})
    assert not differ, list(differ.items())[:3]
    # ... while the replicas do disagree about what is live now, and later: the test has teeth.
    assert a.state.list_tables("other") != b.state.list_tables("other")
    later = a.state.safe_time + DD
    assert _answers(a.state, later) != _answers(b.state, later)


# --- snapshots -----------------------------------------------------------------------------------


def _history_driver() -> Driver:
    d = Driver()
    d.ok("CREATE NAMESPACE ns COMMENT 'one' WITH DBPROPERTIES ('k'='v')")
    d.ok("CREATE TABLE ns.t (a INT)")
    d.ok("DROP NAMESPACE ns CASCADE")
    d.ok("CREATE NAMESPACE ns COMMENT 'two'")
    d.ok("CREATE TABLE ns.t (b INT)")
    d.ok("CREATE NAMESPACE gone")
    d.ok("DROP NAMESPACE gone")
    return d


def test_snapshot_round_trip_keeps_namespace_history() -> None:
    d = _history_driver()
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state
    assert restored.to_snapshot() == snap
    assert len(restored.catalog.namespace_incarnations("ns")) == 2
    assert restored.catalog.namespace_incarnations("gone")[0].dropped_tu is not None
    top = d.state.safe_time + DD
    for at in range(top - 10 * MS, top + 1, MS):
        assert _answers(restored, at) == _answers(d.state, at)


def _as_form1(state: MetastoreState) -> bytes:
    """The snapshot an older node wrote: only live namespaces, as [name, comment, props, tm]."""
    obj = msgpack.unpackb(state.to_snapshot(), raw=False)
    catalog = obj["catalog"]
    del catalog["namespace_form"]
    catalog["namespaces"] = [row[:4] for row in catalog["namespaces"] if row[5] is None]
    return bytes(msgpack.packb(obj, use_bin_type=True))


def test_old_snapshot_form_loads() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns COMMENT 'c'")
    d.ok("CREATE TABLE ns.t (a INT)")
    d.state.observe_tick(d.tm + MS, d.index + 1)
    restored = MetastoreState.from_snapshot(_as_form1(d.state))
    # A live namespace gets created_tu = created_tm + DD: what replaying its CREATE gives, so the
    # restored node equals one that replayed the log.
    assert restored == d.state
    assert restored.to_snapshot() == d.state.to_snapshot()


def test_old_snapshot_form_with_dropped_namespaces_loads() -> None:
    d = _history_driver()
    restored = MetastoreState.from_snapshot(_as_form1(d.state))
    restored.check_invariants()
    # The live namespaces and every table are as they were ...
    assert _ns_names(restored) == _ns_names(d.state) == ["ns"]
    assert restored.catalog.namespace("ns") == d.state.catalog.namespace("ns")
    assert restored.catalog.all_incarnations() == d.state.catalog.all_incarnations()
    # ... and the dropped namespace that held a table gets a spanning incarnation, so the old
    # table can still be listed AS OF its time. ("gone" held no table and stays forgotten.)
    old_t = d.state.catalog.incarnations(T)[0]
    assert restored.list_tables("ns", top=old_t.created_tu) == (T,)
    assert restored.catalog.namespace_incarnations("gone") == ()
    # It keeps working: the next entry applies identically on both.
    outcomes = [
        state.apply(parse_ddl("DROP NAMESPACE ns CASCADE"), tm=d.tm + 10 * MS, index=d.index + 1)
        for state in (d.state, restored)
    ]
    assert outcomes[0].ok and outcomes[0] == outcomes[1]
    restored.check_invariants()


def test_catalog_snapshot_form_is_checked() -> None:
    d = _history_driver()
    data = d.state.catalog.to_data()
    with pytest.raises(MalformedSnapshotError):
        Catalog.from_data({**data, "namespace_form": 7})
    form1 = {k: v for k, v in data.items() if k != "namespace_form"}
    with pytest.raises(MalformedSnapshotError):
        Catalog.from_data(form1)  # 7-item rows are not form 1
    rows = [row[:4] for row in data["namespaces"]]
    with pytest.raises(MalformedSnapshotError):
        Catalog.from_data({**form1, "namespaces": rows})  # form 1 needs the DD


# --- invariants ----------------------------------------------------------------------------------


def _tamper(d: Driver, name: str, index: int, **changes: object) -> None:
    incs = d.state.catalog._namespaces[name]
    changed = replace(incs[index], **changes)
    d.state.catalog._namespaces[name] = (*incs[:index], changed, *incs[index + 1 :])


@pytest.mark.parametrize(
    ("index", "changes"),
    [
        (1, {"created_tu": 0}),  # tu != tm + DD
        (0, {"dropped_tu": None}),  # half-dropped
        (0, {"dropped_tm": None, "dropped_tu": None}),  # two live incarnations
        (1, {"created_tm": 5, "created_tu": 5 + DD}),  # before the previous drop
    ],
)
def test_check_invariants_catches_namespace_corruption(
    index: int, changes: dict[str, object]
) -> None:
    d = _history_driver()
    d.state.check_invariants()
    _tamper(d, "ns", index, **changes)
    with pytest.raises(CatalogInvariantError):
        d.state.check_invariants()


def test_check_invariants_catches_a_table_outside_its_namespace() -> None:
    d = _history_driver()
    first = d.state.catalog.namespace_incarnations("ns")[0]
    # The old namespace "dropped" before its table was: the table outlives its namespace.
    _tamper(d, "ns", 0, dropped_tm=first.created_tm + MS, dropped_tu=first.created_tm + MS + DD)
    with pytest.raises(CatalogInvariantError, match="exists where its namespace does not"):
        d.state.check_invariants()


def test_check_invariants_catches_a_live_table_in_a_dropped_namespace() -> None:
    d = _history_driver()
    live = d.state.catalog.namespace_incarnations("ns")[-1]
    _tamper(d, "ns", 1, dropped_tm=d.tm, dropped_tu=d.tm + DD)
    assert not d.state.catalog.namespace_incarnations("ns")[-1].live
    assert live.live
    with pytest.raises(CatalogInvariantError):
        d.state.check_invariants()


@pytest.mark.parametrize("order", [("a", "m", "z"), ("z", "m", "a"), ("m", "z", "a")])
def test_a_location_overlapping_several_tables_names_the_same_one_on_every_node(
    order: tuple[str, ...],
) -> None:
    # The live tables sit in sets, whose iteration order depends on string hashing (a
    # per-process seed) and on insertion: every node must still give the same refusal.
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    for name in order:
        d.ok(f"CREATE TABLE ns.{name} (x INT) LOCATION '/wh/shared/{name}'")
    e = refused(
        d, parse_ddl("CREATE TABLE ns.all (x INT) LOCATION '/wh/shared'"), InvalidArgumentError
    )
    assert e.details["table"] == "ns.a"


def test_a_dropped_nested_field_s_name_cannot_come_back() -> None:
    # Readers match nested fields by name: a new s.a would show the dropped s.a's old values.
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (s STRUCT<a: INT, b: INT>, x INT)")
    d.ok("ALTER TABLE ns.t DROP COLUMN s.a", step_ms=DD // MS + 1)
    d.finish_jobs()
    e = refused(
        d, parse_ddl("ALTER TABLE ns.t ADD COLUMN s.A STRING"), UnsupportedSchemaChangeError
    )
    assert e.details["reason"] == "nested_name_reused"
    d.ok("ALTER TABLE ns.t ADD COLUMN s.c STRING")  # a new name is fine
    # A new struct column of the old name is another column (matched by field id): fine.
    d.ok("ALTER TABLE ns.t DROP COLUMN s", step_ms=DD // MS + 1)
    d.finish_jobs()
    d.ok("ALTER TABLE ns.t ADD COLUMN s STRUCT<z: INT>", step_ms=DD // MS + 1)
    d.finish_jobs()
    d.ok("ALTER TABLE ns.t ADD COLUMN s.a INT", step_ms=DD // MS + 1)
