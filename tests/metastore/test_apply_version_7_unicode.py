"""Apply version 7: no apply decision follows the Unicode data of the running Python release.

Nodes of a rolling upgrade run different Python releases (3.11 ships Unicode 14, 3.12 15.0,
3.13 15.1). Below version 7, apply judged sibling-name uniqueness with `str.casefold`, a DATE
or FLOAT DEFAULT kept across a widening with `\\d`, int() and `strip()`, and a member's client
host with `isprintable()`: each follows the release's Unicode tables, so two nodes could
decide one entry two ways. Version 7 decides with rules fixed in the code: Java's
equalsIgnoreCase table (`metastore.java_case`, as references are matched since version 6) for
new names, ASCII digits and whitespace for the DEFAULT, printable ASCII for the host. Below 7
every old rule stays, so a log applies alike while nodes of the previous release run.

The pairs are those where casefold and Java disagree: `ß`/`SS` and `ﬁ`/`FI` (casefold: equal,
Java: two names, as to Spark), a dotless `ı` and `I` (casefold: two, Java: equal), and
Unicode 14's `Ⱟ`/`ⱟ` (casefold on Python 3.11 and later: equal; on 3.10: two; Java 17: two).
"""

# The letters that look alike (dotless i, sharp s, ligatures, Glagolitic, fullwidth digits)
# are what this file tests.
# ruff: noqa: RUF001, RUF002, RUF003

from __future__ import annotations

from dataclasses import replace

import pytest

from metastore.commands import (
    AlterTable,
    CreateTable,
    SetApplyVersion,
    SetMemberClientAddress,
    TableName,
    decode_command,
    encode_command,
)
from metastore.ddl import parse_ddl
from metastore.errors import (
    ColumnAlreadyExistsError,
    InvalidArgumentError,
    MalformedCommandError,
    SchemaJobConflictError,
    UnsupportedSchemaChangeError,
)
from metastore.schema import Column, Schema
from metastore.types import INT, StructField, StructType, parse_type
from tests.metastore._driver import Driver, ok, refused

T = TableName.of("ns", "t")

# (a, b): casefold and Java's equalsIgnoreCase (measured: tests/metastore/test_schema_java_case)
# disagree whether these are one name.
ONE_NAME_ONLY_TO_CASEFOLD = [
    ("straße", "STRASSE"),
    ("ﬁle", "FILE"),
    ("\u2c2f", "\u2c5f"),  # Glagolitic Ⱟ/ⱟ: a case pair from Unicode 14, not in Java 17's table
]
ONE_NAME_ONLY_TO_JAVA = [
    ("ıd", "ID"),  # dotless i: Java's toUpperCase('ı') is 'I'
    ("İd", "id"),  # Java's toLowerCase('İ') is 'i'; its full lowercase is 'i' + a dot
]


def _q(name: str) -> str:
    return f"`{name}`"


def _driver(apply_version: int) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    return d


def _table(apply_version: int, columns: str) -> Driver:
    d = _driver(apply_version)
    d.ok(f"CREATE TABLE ns.t ({columns})")
    return d


def _names(d: Driver) -> list[str]:
    return [c.name for c in d.state.catalog.current(T).schema.columns]


def _create(columns: str) -> CreateTable:
    cmd = parse_ddl(f"CREATE TABLE ns.t ({columns})")
    assert isinstance(cmd, CreateTable)
    return cmd


def _create_ints(*names: str) -> CreateTable:
    """CREATE TABLE ns.t with INT columns so named, built without the DDL parser (which, before
    version 7 was known, refused what casefold did itself)."""
    columns = tuple(Column(name=name, type=INT) for name in names)
    return CreateTable(table=T, schema=Schema(columns=columns))


def _create_struct(*names: str) -> CreateTable:
    fields = tuple(StructField(name=name, type=INT) for name in names)
    column = Column(name="s", type=StructType(fields=fields))
    return CreateTable(table=T, schema=Schema(columns=(column,)))


# --- CREATE TABLE ---------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), ONE_NAME_ONLY_TO_CASEFOLD)
def test_version_7_creates_two_columns_java_tells_apart(a: str, b: str) -> None:
    d = _driver(7)
    ok(d, _create_ints(a, b))
    assert _names(d) == [a, b]


@pytest.mark.parametrize(("a", "b"), ONE_NAME_ONLY_TO_CASEFOLD)
def test_below_version_7_casefold_still_refuses_them(a: str, b: str) -> None:
    refused(_driver(6), _create_ints(a, b), ColumnAlreadyExistsError)


@pytest.mark.parametrize(("a", "b"), ONE_NAME_ONLY_TO_JAVA)
def test_version_7_refuses_two_columns_java_takes_for_one(a: str, b: str) -> None:
    """Spark could resolve neither (AMBIGUOUS_REFERENCE): version 6 had to refuse such
    references; version 7 refuses the pair itself."""
    refused(_driver(7), _create_ints(a, b), ColumnAlreadyExistsError)


@pytest.mark.parametrize(("a", "b"), ONE_NAME_ONLY_TO_JAVA)
def test_below_version_7_casefold_still_allows_them(a: str, b: str) -> None:
    d = _driver(6)
    ok(d, _create_ints(a, b))
    assert _names(d) == [a, b]


def test_struct_fields_follow_the_same_rule() -> None:
    ok(_driver(7), _create_struct("straße", "STRASSE"))
    refused(_driver(6), _create_struct("straße", "STRASSE"), ColumnAlreadyExistsError)
    refused(_driver(7), _create_struct("ıd", "ID"), ColumnAlreadyExistsError)
    ok(_driver(6), _create_struct("ıd", "ID"))


@pytest.mark.parametrize("version", [6, 7])
def test_names_equal_under_both_rules_are_refused_at_every_version(version: int) -> None:
    for a, b in [("a", "A"), ("\u212a", "k"), ("ß", "ẞ")]:  # the Kelvin sign; capital sharp s
        refused(_driver(version), _create_ints(a, b), ColumnAlreadyExistsError)


# --- ALTER TABLE: ADD and RENAME ----------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN `STRASSE` INT",
        "ALTER TABLE ns.t ADD COLUMN s.`STRASSE` INT",
        "ALTER TABLE ns.t ADD COLUMN n STRUCT<`ﬁle`: INT, `FILE`: INT>",
        "ALTER TABLE ns.t RENAME COLUMN a TO `STRASSE`",
        "ALTER TABLE ns.t ADD COLUMN `STRASSE` INT NOT NULL DEFAULT 1",  # a schema change job
    ],
)
def test_version_7_adds_a_name_only_casefold_took_for_a_siblings(sql: str) -> None:
    d = _table(7, "a INT, `straße` INT, s STRUCT<`straße`: INT>")
    d.ok(sql)
    d.finish_jobs()
    d.state.check_invariants()
    refused_below = _table(6, "a INT, `straße` INT, s STRUCT<`straße`: INT>")
    outcome = refused_below.sql(sql)
    assert isinstance(outcome.exception(), ColumnAlreadyExistsError), outcome


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN `ID` INT",
        "ALTER TABLE ns.t ADD COLUMN s.`ID` INT",
        "ALTER TABLE ns.t RENAME COLUMN a TO `ID`",
        "ALTER TABLE ns.t ADD COLUMN `ID` INT NOT NULL DEFAULT 1",
    ],
)
def test_version_7_refuses_a_name_java_takes_for_a_siblings(sql: str) -> None:
    d = _table(7, "a INT, `ıd` INT, s STRUCT<`ıd`: INT>")
    before = d.state.to_snapshot()
    outcome = d.sql(sql)
    assert isinstance(outcome.exception(), ColumnAlreadyExistsError), outcome
    assert d.state.to_snapshot() == before
    below = _table(6, "a INT, `ıd` INT, s STRUCT<`ıd`: INT>")
    below.ok(sql)


def test_version_7_a_pending_column_and_a_public_one_differ_as_java_says() -> None:
    """A writer pinned to the job's version fills the pending column by name (Spark's match)."""
    for version, adds in [(7, "ok"), (6, "conflict")]:
        d = _table(version, "a INT")
        d.ok("ALTER TABLE ns.t ADD COLUMN `straße` INT NOT NULL DEFAULT 1")
        outcome = d.sql("ALTER TABLE ns.t ADD COLUMN `STRASSE` INT")
        assert (outcome.ok, adds) in [(True, "ok"), (False, "conflict")], outcome
        if not outcome.ok:
            assert isinstance(outcome.exception(), SchemaJobConflictError)
    for version, adds in [(7, "conflict"), (6, "ok")]:
        d = _table(version, "a INT")
        d.ok("ALTER TABLE ns.t ADD COLUMN `ıd` INT NOT NULL DEFAULT 1")
        outcome = d.sql("ALTER TABLE ns.t ADD COLUMN `ID` INT")
        assert (outcome.ok, adds) in [(True, "ok"), (False, "conflict")], outcome
        if not outcome.ok:
            assert isinstance(outcome.exception(), SchemaJobConflictError)


def test_version_7_a_nested_name_reused_is_the_one_java_matches() -> None:
    """Readers match nested fields by name: a field added under a dropped one's name would show
    its values. Version 7 asks Java's rule whether it is that name."""
    for version, refused_expected in [(7, True), (6, False)]:
        d = _table(version, "s STRUCT<x: INT, `ı`: INT>")
        d.ok("ALTER TABLE ns.t DROP COLUMN s.`ı`")
        outcome = d.sql("ALTER TABLE ns.t ADD COLUMN s.I INT")
        assert outcome.ok is not refused_expected, outcome
        if refused_expected:
            error = outcome.exception()
            assert isinstance(error, UnsupportedSchemaChangeError)
            assert error.details["reason"] == "nested_name_reused"
    for version, refused_expected in [(7, False), (6, True)]:
        d = _table(version, "s STRUCT<x: INT, `straße`: INT>")
        d.ok("ALTER TABLE ns.t DROP COLUMN s.`straße`")
        outcome = d.sql("ALTER TABLE ns.t ADD COLUMN s.`STRASSE` INT")
        assert outcome.ok is not refused_expected, outcome


def test_version_7_places_a_job_column_after_the_sibling_of_that_exact_name() -> None:
    """`ß` and `ss` are siblings from version 7; the public step must not take the first
    casefold match (`ß`) for `ss`."""
    d = _table(7, "`ß` INT, ss INT, z INT")
    d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1 AFTER ss")
    d.finish_jobs()
    assert _names(d) == ["ß", "ss", "n", "z"]


# --- Tables from before version 7 ---------------------------------------------------------------


def test_a_table_holding_a_pair_java_takes_for_one_stays_usable_at_version_7() -> None:
    """Casefold let `ıd` and `id` be siblings before 7: they are kept (ALTER, job steps and a
    snapshot's check refuse only identical names from 7), and only new names obey Java."""
    d = _table(6, "a INT, `ıd` INT, id INT, s STRUCT<`ı`: INT, i: INT>")
    ok(d, SetApplyVersion(version=7))
    d.ok("ALTER TABLE ns.t SET TBLPROPERTIES ('k' = 'v')")
    d.ok("ALTER TABLE ns.t ADD COLUMN n INT")
    d.ok("ALTER TABLE ns.t ADD COLUMN m INT NOT NULL DEFAULT 1 AFTER id")
    d.finish_jobs()
    for new_name in ("ID", "ıD"):  # Java's `id` still: the new name must differ from id's
        outcome = d.sql(f"ALTER TABLE ns.t RENAME COLUMN `ıd` TO `{new_name}`")
        assert isinstance(outcome.exception(), ColumnAlreadyExistsError), outcome
        outcome = d.sql(f"ALTER TABLE ns.t ADD COLUMN `{new_name}` INT")
        assert isinstance(outcome.exception(), ColumnAlreadyExistsError), outcome
    d.ok("ALTER TABLE ns.t RENAME COLUMN `ıd` TO dotless")
    assert _names(d) == ["a", "dotless", "id", "m", "s", "n"]
    d.state.check_invariants()


# --- What runs before apply: decoder, DDL parser, clients ------------------------------------


def test_the_decoder_leaves_to_apply_what_only_one_rule_refuses() -> None:
    """It does not know the apply version; `a` and `A` are one name under every rule."""
    both = Schema(columns=(Column(name="straße", type=INT), Column(name="STRASSE", type=INT)))
    cmd = CreateTable(table=T, schema=both)
    assert decode_command(encode_command(cmd)) == cmd
    same = Schema(columns=(Column(name="a", type=INT), Column(name="A", type=INT)))
    with pytest.raises(MalformedCommandError):
        decode_command(encode_command(CreateTable(table=T, schema=same)))


def test_a_client_reads_back_a_struct_version_7_accepted() -> None:
    assert parse_type("struct<`straße`: int, `STRASSE`: int>").to_sql()
    assert parse_type("struct<`ıd`: int, id: int>").to_sql()
    with pytest.raises(ColumnAlreadyExistsError):
        parse_type("struct<a: int, A: int>")


# --- DEFAULT kept across a widening (version 5's check) -----------------------------------------


def _with_default(columns: str, default_sql: str) -> CreateTable:
    cmd = _create(columns)
    first = replace(cmd.schema.columns[0], default_sql=default_sql)
    return replace(cmd, schema=Schema(columns=(first, *cmd.schema.columns[1:])))


WIDENINGS_OF_NON_ASCII_DEFAULTS = [
    ("d DATE", "'２０２０-01-01'", "TIMESTAMP_NTZ"),  # fullwidth digits: `\d` in every release
    ("d DATE", "'\U00011f52\U00011f50\U00011f52\U00011f50-01-01'", "TIMESTAMP_NTZ"),  # Kawi (15.0)
    ("d DATE", "'\u30002020-01-01'", "TIMESTAMP_NTZ"),  # an ideographic space, stripped
    ("f FLOAT", "１.５", "DOUBLE"),
]


@pytest.mark.parametrize(("column", "default_sql", "to"), WIDENINGS_OF_NON_ASCII_DEFAULTS)
def test_version_7_reads_a_default_in_ascii_digits_only(
    column: str, default_sql: str, to: str
) -> None:
    """Spark reads numbers and dates in ASCII digits; `\\d` of a str pattern is any Unicode
    decimal digit, a set Unicode 15.0 grew (Kawi: no digits to Python 3.11, digits to 3.12)."""
    d = _driver(7)
    ok(d, _with_default(f"{column}, x INT", default_sql))
    name = column.split()[0]
    alter = parse_ddl(f"ALTER TABLE ns.t ALTER COLUMN {name} TYPE {to}")
    assert isinstance(alter, AlterTable)
    error = refused(d, alter, UnsupportedSchemaChangeError)
    assert error.details["reason"] == "default changes"


def test_below_version_7_the_unicode_digits_rule_stays() -> None:
    d = _driver(6)
    ok(d, _with_default("d DATE, x INT", "'２０２０-01-01'"))
    d.ok("ALTER TABLE ns.t ALTER COLUMN d TYPE TIMESTAMP_NTZ")


@pytest.mark.parametrize("version", [6, 7])
def test_an_ascii_default_widens_at_every_version(version: int) -> None:
    d = _driver(version)
    ok(d, _with_default("d DATE, x INT", " '2020-01-01'\t"))
    d.ok("ALTER TABLE ns.t ALTER COLUMN d TYPE TIMESTAMP_NTZ")


# --- A member's client host -------------------------------------------------------------------


@pytest.mark.parametrize("host", ["h\u00e9", "h\u00a0x", "h\U00011f50"])
def test_version_7_records_a_printable_ascii_host_only(host: str) -> None:
    """`isprintable()` follows the release: U+11F50 (Kawi, Unicode 15.0) is unprintable to
    Python 3.11 and printable to 3.12."""
    cmd = SetMemberClientAddress(node_id=4, host=host, port=24204, by="admin")
    refused(Driver(apply_version=7), cmd, InvalidArgumentError)
    ok(Driver(apply_version=7), replace(cmd, host="node-4.example"))


def test_below_version_7_a_printable_non_ascii_host_is_recorded() -> None:
    d = Driver(apply_version=6)
    ok(d, SetMemberClientAddress(node_id=4, host="h\u00e9", port=24204, by="admin"))
    assert d.state.member_clients.address_of(4) == ("h\u00e9", 24204)
