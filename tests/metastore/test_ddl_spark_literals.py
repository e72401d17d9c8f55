"""DDL literals read as Spark reads them (found by an adversarial review of the DDL path).

Each case was checked against pyspark 4: what Spark's own SQL parser and ALTER TABLE do with
the literal is what the catalog must store, or refuse with a typed error.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.client.defaults import existence_default
from metastore.commands import AddColumn, AlterTable, CreateTable, SetColumnComment
from metastore.ddl import _Fallback, parse_ddl
from metastore.errors import InvalidArgumentError, MetastoreError
from metastore.schema import Column


def _added_column(sql: str) -> Column:
    cmd = parse_ddl(sql)
    assert isinstance(cmd, AlterTable)
    [change] = cmd.changes
    assert isinstance(change, AddColumn)
    return change.column


# --- a doubled quote inside a string literal is one quote ---------------------------------------


@pytest.mark.parametrize(
    ("sql", "value"),
    [
        ("ALTER TABLE ns.t ADD COLUMN s STRING DEFAULT 'it''s'", "it's"),
        ("ALTER TABLE ns.t ADD COLUMN s STRING DEFAULT 'it''s' FIRST", "it's"),  # hand parser
        ('ALTER TABLE ns.t ADD COLUMN s STRING DEFAULT "say ""hi"""', 'say "hi"'),
        ("ALTER TABLE ns.t ADD COLUMN s STRING DEFAULT 'a\\\\''b'", "a\\'b"),
        ("ALTER TABLE ns.t ADD COLUMN s STRING NOT NULL DEFAULT 'it\\'s'", "it's"),
        ("ALTER TABLE ns.t ADD COLUMN s STRING DEFAULT '''' -- it''s", "'"),
    ],
)
def test_a_doubled_quote_in_a_default_is_one_quote(sql: str, value: str) -> None:
    """Spark reads 'it''s' as it's (a doubled quote stands for one); sqlglot's Spark dialect read
    it as the two adjacent literals 'it' 's', stored CONCAT('it', 's'), and every reader filled
    rows written before the column with "its"."""
    column = _added_column(sql)
    assert column.default_sql is not None
    assert existence_default(column.default_sql, pa.string()).as_py() == value


def test_a_doubled_quote_in_a_comment_or_property_parses_on_both_paths() -> None:
    """The hand parser read 'it''s' as it's while the sqlglot path refused it (CREATE TABLE) or
    read two literals: the same text meant different things depending on the statement form."""
    cmd = parse_ddl(
        "CREATE TABLE ns.t (a STRING COMMENT 'a''b') COMMENT 'it''s' TBLPROPERTIES ('k' = 'x''y')"
    )
    assert isinstance(cmd, CreateTable)
    assert cmd.schema.columns[0].comment == "a'b"
    assert cmd.comment == "it's"
    assert cmd.properties == (("k", "x'y"),)
    alter = parse_ddl("ALTER TABLE ns.t ALTER COLUMN a COMMENT 'it''s'")
    assert isinstance(alter, AlterTable)
    assert alter.changes == (SetColumnComment(path=("a",), comment="it's"),)


def test_adjacent_literals_still_concatenate() -> None:
    column = _added_column("ALTER TABLE ns.t ADD COLUMN s STRING DEFAULT 'it' 's'")
    assert column.default_sql is not None
    assert existence_default(column.default_sql, pa.string()).as_py() == "its"


def test_a_doubled_quote_default_on_an_int_column_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl("ALTER TABLE ns.t ADD COLUMN n INT DEFAULT '1''2'")


# --- functions sqlglot renders without parentheses ----------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT localtimestamp()",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT current_catalog()",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT upper(current_catalog()) FIRST",
    ],
)
def test_an_added_read_time_default_sqlglot_renders_bare_is_refused(sql: str) -> None:
    """sqlglot renders localtimestamp() as LOCALTIMESTAMP and current_catalog() as
    CURRENT_CATALOG; the read-time check re-parses the stored text, saw a column name there and
    let these through, so older rows would read another value at every read."""
    with pytest.raises(InvalidArgumentError, match="changes with time or session"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    ("sql", "stored"),
    [
        ("CREATE TABLE ns.t (n TIMESTAMP_NTZ DEFAULT localtimestamp())", "LOCALTIMESTAMP()"),
        ("CREATE TABLE ns.t (n STRING DEFAULT current_catalog())", "CURRENT_CATALOG()"),
    ],
)
def test_a_default_is_stored_as_text_spark_reads_as_that_function(sql: str, stored: str) -> None:
    """Spark reads a bare LOCALTIMESTAMP or CURRENT_CATALOG as a column name (measured: pyspark 4,
    UNRESOLVED_COLUMN), so the stored DEFAULT failed every write that filled it."""
    cmd = parse_ddl(sql)
    assert isinstance(cmd, CreateTable)
    assert cmd.schema.columns[0].default_sql == stored


# --- BINARY literals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n INT DEFAULT X'10'",
        "ALTER TABLE ns.t ADD COLUMN n BIGINT NOT NULL DEFAULT 0x10",  # sqlglot reads X'10'
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(20,0) DEFAULT CAST(X'41' AS DECIMAL(20,0))",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n BOOLEAN DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n BINARY DEFAULT DATE '2020-01-01'",
        "CREATE TABLE ns.t (n INT DEFAULT X'10')",
    ],
)
def test_a_binary_default_spark_cannot_assign_is_refused(sql: str) -> None:
    """Spark refuses a BINARY default on any column but BINARY and the string types, and a
    date on a BINARY one (INVALID_DEFAULT_VALUE.DATA_TYPE, measured with pyspark 4); the DDL
    did not follow X'..' literals and accepted them, so every Spark read of the table failed."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n BINARY NOT NULL DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n VARCHAR(5) DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n CHAR(5) DEFAULT X'41'",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT CAST(X'41' AS STRING)",
        "ALTER TABLE ns.t ADD COLUMN n BINARY DEFAULT 'abc'",
        "ALTER TABLE ns.t ADD COLUMN n BINARY DEFAULT 5",
    ],
)
def test_binary_defaults_spark_assigns_parse(sql: str) -> None:
    parse_ddl(sql)


# --- numbers Spark's parser refuses -------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE NOT NULL DEFAULT 1e400",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT -1.8e308",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT 1.7976931348623159e308",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT 1e400",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT 1e400D",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT concat('x', 1e400)",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT 1000000000000000000000000000000000000000",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT 12345678901234567890123456789012345678.5",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT 0.000000000000000000000000000000000000000001",
        "CREATE TABLE ns.t (n DOUBLE DEFAULT 1e400)",
    ],
)
def test_a_number_spark_cannot_parse_is_refused(sql: str) -> None:
    """Spark's parser refuses a double literal beyond Double.MAX_VALUE (ParseException) and a
    decimal one of more than 38 digits (DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION), measured with
    pyspark 4: such a DEFAULT failed every read and write of the table."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE NOT NULL DEFAULT 1.7976931348623157e308",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT 1e-400",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT 'Infinity'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(38,0) DEFAULT " + "9" * 38,
        # Spark parses FLOAT DEFAULT 1e39 and DOUBLE DEFAULT '1e400' too, but makes them
        # Infinity: refused (test_ddl_number_range_defaults.py)
        "ALTER TABLE ns.t ADD COLUMN n FLOAT DEFAULT 3.4e38",
    ],
)
def test_numbers_spark_parses_are_accepted(sql: str) -> None:
    parse_ddl(sql)


# --- timestamps beyond Spark's range ------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT TIMESTAMP '+999999-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '+294248-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '-290309-01-01 00:00:00+01:00'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT '+294247-01-10 04:00:55'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ NOT NULL DEFAULT '+999999-12-31'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT '-290308-12-21 19:59:05.224191'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT '+294247-01-10 04:00:54.775808'",
        "CREATE TABLE ns.t (n TIMESTAMP_NTZ DEFAULT CAST('+500000-01-01' AS TIMESTAMP_NTZ))",
    ],
)
def test_a_timestamp_beyond_sparks_range_is_refused(sql: str) -> None:
    """Spark's timestamps are 64-bit microseconds (years -290308 to +294247); a later or earlier
    one is malformed (CAST_INVALID_INPUT, measured with pyspark 4), but the DDL took any year of
    up to six digits, so every read and write of the table failed."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '+294247-01-10 04:00:54Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '-290308-12-21 19:59:06Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT '+294247-01-10 04:00:54.775807'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT '-290308-12-21 19:59:05.224192'",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT '+999999-01-01'",  # a DATE reaches further
    ],
)
def test_timestamps_at_the_edge_of_sparks_range_are_accepted(sql: str) -> None:
    parse_ddl(sql)


# --- dates on number columns --------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n INT DEFAULT DATE '2020-01-01'",
        "ALTER TABLE ns.t ADD COLUMN n BIGINT NOT NULL DEFAULT CAST('2020-01-01' AS DATE)",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT TIMESTAMP_NTZ '2020-01-01 00:00:00'",
        "ALTER TABLE ns.t ADD COLUMN n FLOAT DEFAULT DATE '2020-01-01'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(10,2) DEFAULT DATE '2020-01-01'",
        "CREATE TABLE ns.t (n INT DEFAULT TIMESTAMP_NTZ '2020-01-01 00:00:00')",
    ],
)
def test_a_date_default_on_a_number_column_is_refused(sql: str) -> None:
    """Spark assigns no DATE or TIMESTAMP_NTZ to a number column (INVALID_DEFAULT_VALUE.DATA_TYPE,
    measured with pyspark 4); the DDL did not follow those casts and accepted them, so every
    Spark read of the table failed."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        # An instant is a number of seconds in Spark, whatever the session's zone.
        "ALTER TABLE ns.t ADD COLUMN n BIGINT DEFAULT TIMESTAMP '2020-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(20,2) DEFAULT TIMESTAMP '2020-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT DATE '2020-01-01'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT DATE '2020-01-01'",
    ],
)
def test_date_and_time_defaults_spark_assigns_parse(sql: str) -> None:
    parse_ddl(sql)


# --- a NOT NULL after a DEFAULT that starts with NOT --------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE ns.t (b BOOLEAN DEFAULT NOT FALSE NOT NULL)",
        "CREATE TABLE ns.t (a INT, b BOOLEAN DEFAULT NOT FALSE NOT NULL COMMENT 'c', c INT)",
        "ALTER TABLE ns.t ADD COLUMN b BOOLEAN DEFAULT NOT FALSE NOT NULL",
        "ALTER TABLE ns.t ADD COLUMN b BOOLEAN DEFAULT NOT FALSE NOT NULL FIRST",  # hand parser
        "ALTER TABLE ns.t ADD COLUMNS (b BOOLEAN DEFAULT NOT (FALSE) NOT NULL, c INT)",
    ],
)
def test_not_null_after_a_not_default_is_the_constraint(sql: str) -> None:
    """Spark has no postfix NOT NULL operator (only IS NOT NULL), so in `DEFAULT NOT FALSE NOT
    NULL` the NOT NULL is the column's constraint. sqlglot read `NOT FALSE NOT NULL` as one
    expression, NOT (FALSE IS NOT NULL): the column was stored nullable, with a DEFAULT that is
    FALSE where Spark's is TRUE."""
    cmd = parse_ddl(sql)
    if isinstance(cmd, CreateTable):
        column = next(c for c in cmd.schema.columns if c.name == "b")
    else:
        assert isinstance(cmd, AlterTable)
        column = next(c.column for c in cmd.changes if isinstance(c, AddColumn))
    assert not column.nullable
    assert column.default_sql in ("NOT FALSE", "NOT (FALSE)")


def test_a_not_default_before_a_position_parses_on_the_hand_parser() -> None:
    """The hand parser ended a DEFAULT at any NOT, so `DEFAULT NOT TRUE FIRST` was refused."""
    column = _added_column("ALTER TABLE ns.t ADD COLUMN b BOOLEAN DEFAULT NOT TRUE FIRST")
    assert (column.default_sql, column.nullable) == ("NOT TRUE", True)
    column = _added_column("ALTER TABLE ns.t ADD COLUMN b BOOLEAN DEFAULT NULL IS NOT NULL FIRST")
    assert (column.default_sql, column.nullable) == ("NOT NULL IS NULL", True)


# --- zone names of the system's time zone files that Spark does not know ------------------------


@pytest.mark.parametrize(
    "zone", ["localtime", "posixrules", "Factory", "right/UTC", "posix/Europe/Paris", "ROC"]
)
def test_a_zone_only_the_systems_files_know_is_refused(zone: str) -> None:
    """The zone check asked the receiving node's time zone files, which hold entries Spark does
    not take for zones (CAST_INVALID_INPUT, measured with pyspark 4 on Java 17): `localtime`
    (the node's own zone), `posixrules`, `Factory`, the `posix/` and `right/` copies. Such a
    DEFAULT failed every read and write of the table in Spark."""
    with pytest.raises(InvalidArgumentError, match="time zone"):
        parse_ddl(f"ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '2020-01-01 00:00:00 {zone}'")


@pytest.mark.parametrize("zone", ["US/Eastern", "Etc/GMT+5", "EST", "GMT0", "W-SU", "UT+01:00"])
def test_zones_spark_knows_are_accepted(zone: str) -> None:
    parse_ddl(f"ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '2020-01-01 00:00:00 {zone}'")


# --- the two parsers agree on generated column definitions --------------------------------------

_TYPES = ["INT", "BOOLEAN", "STRING", "DOUBLE", "DECIMAL(5,2)", "DATE", "VARCHAR(3)", "BINARY"]
_EXPRESSIONS = [
    "1",
    "-1.5",
    "'a''b'",
    "'x' 'y'",
    '"q""r"',
    "NOT TRUE",
    "NOT (FALSE)",
    "NULL IS NOT NULL",
    "TRUE",
    "NULL",
    "X'41'",
    "DATE '2020-01-01'",
    "TIMESTAMP '2020-01-01 00:00:00Z'",
    "CAST(1 AS BIGINT)",
    "(2)",
    "1 + 2",
    "coalesce(NULL, 1)",
    "localtimestamp()",
    "5L",
    "1e3",
]


@st.composite
def _column_definitions(draw: st.DrawFn) -> str:
    parts = [draw(st.sampled_from(["c", "`c c`", "`c''`"])), draw(st.sampled_from(_TYPES))]
    order = draw(st.permutations(["NOT NULL", "DEFAULT", "COMMENT 'k''m'"]))
    count = draw(st.integers(0, 3))
    expression = draw(st.sampled_from(_EXPRESSIONS))
    parts += [
        f"DEFAULT {expression}" if clause == "DEFAULT" else clause for clause in order[:count]
    ]
    return " ".join(parts)


@settings(max_examples=300, deadline=None)
@given(_column_definitions(), st.sampled_from(["", " FIRST", " AFTER a"]))
def test_the_tree_and_the_hand_parser_agree_on_added_columns(
    definition: str, position: str
) -> None:
    """Whatever sqlglot builds a tree for, the hand parser reads the same (`ddl._Fallback`), and
    a column reads the same in CREATE TABLE and ADD COLUMNS: the NOT NULL after `DEFAULT NOT
    ...` and doubled quotes were read differently by the two before."""
    sql = f"ALTER TABLE ns.t ADD COLUMN {definition}{position}"
    try:
        cmd = parse_ddl(sql)
    except MetastoreError:
        return
    assert _Fallback(sql, "").statement() == cmd
    assert isinstance(cmd, AlterTable)
    [change] = cmd.changes
    assert isinstance(change, AddColumn)
    listed = parse_ddl(f"ALTER TABLE ns.t ADD COLUMNS ({definition}, d INT)")
    assert isinstance(listed, AlterTable)
    assert listed.changes[0] == AddColumn(parent=(), column=change.column, position=None)
