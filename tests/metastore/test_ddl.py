"""Spark SQL DDL -> commands: every supported form, every refusal, and safety on any input."""

from __future__ import annotations

import contextlib
import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from metastore import limits
from metastore.client.defaults import existence_default
from metastore.commands import (
    AddColumn,
    AlterColumnType,
    AlterTable,
    Command,
    CreateNamespace,
    CreateTable,
    DropColumn,
    DropNamespace,
    DropTable,
    MoveColumn,
    RenameColumn,
    SetColumnComment,
    SetNullability,
    SetTableProperties,
    TableChange,
    TableName,
    UnsetTableProperties,
)
from metastore.ddl import _Fallback, parse_ddl
from metastore.errors import (
    ColumnAlreadyExistsError,
    InvalidArgumentError,
    InvalidDdlError,
    LimitExceededError,
    MetastoreError,
    UnsupportedSchemaChangeError,
    UnsupportedStatementError,
)
from metastore.schema import After, Column, First, Schema
from metastore.types import (
    BIGINT,
    INT,
    STRING,
    TIMESTAMP,
    DataType,
    DecimalType,
    StructField,
    StructType,
    parse_type,
)
from tests.metastore._support import DETERMINISTIC, data_types, simple_names

T = TableName.of("ns", "t")


def alter(*changes: TableChange) -> AlterTable:
    return AlterTable(table=T, changes=changes)


SUPPORTED: list[tuple[str, Command]] = [
    # --- namespaces ---
    ("CREATE NAMESPACE ns", CreateNamespace(namespace="ns")),
    ("create schema NS", CreateNamespace(namespace="ns")),
    ("CREATE DATABASE IF NOT EXISTS ns", CreateNamespace(namespace="ns", if_not_exists=True)),
    ("CREATE DATABASE ns COMMENT 'c'", CreateNamespace(namespace="ns", comment="c")),
    (
        "CREATE NAMESPACE IF NOT EXISTS ns COMMENT 'hi' WITH DBPROPERTIES ('b'='2', a = '1')",
        CreateNamespace(
            namespace="ns",
            if_not_exists=True,
            comment="hi",
            properties=(("a", "1"), ("b", "2")),
        ),
    ),
    (
        "CREATE SCHEMA ns WITH PROPERTIES ('a'='1') COMMENT 'x'",
        CreateNamespace(namespace="ns", comment="x", properties=(("a", "1"),)),
    ),
    ("DROP NAMESPACE ns", DropNamespace(namespace="ns")),
    ("DROP SCHEMA IF EXISTS ns", DropNamespace(namespace="ns", if_exists=True)),
    ("DROP DATABASE ns CASCADE", DropNamespace(namespace="ns", cascade=True)),
    ("DROP NAMESPACE ns RESTRICT", DropNamespace(namespace="ns")),
    # --- tables ---
    (
        "CREATE TABLE ns.t (a INT)",
        CreateTable(table=T, schema=Schema(columns=(Column(name="a", type=INT),))),
    ),
    (
        "CREATE TABLE IF NOT EXISTS NS.T (Id BIGINT NOT NULL DEFAULT 0 COMMENT 'key', "
        "s STRUCT<x: INT NOT NULL COMMENT 'y', `z z`: ARRAY<STRING>>, "
        "m MAP<STRING, DECIMAL(10,2)>, ts TIMESTAMP DEFAULT current_timestamp()) "
        "USING parquet COMMENT 'tab' TBLPROPERTIES ('k'='v', x.y = 1.5, z = true)",
        CreateTable(
            table=T,
            if_not_exists=True,
            comment="tab",
            properties=(("k", "v"), ("x.y", "1.5"), ("z", "true")),
            schema=Schema(
                columns=(
                    Column(name="Id", type=BIGINT, nullable=False, default_sql="0", comment="key"),
                    Column(
                        name="s",
                        type=StructType(
                            fields=(
                                StructField(name="x", type=INT, nullable=False, comment="y"),
                                StructField(name="z z", type=parse_type("array<string>")),
                            )
                        ),
                    ),
                    Column(name="m", type=parse_type("map<string, decimal(10,2)>")),
                    Column(name="ts", type=TIMESTAMP, default_sql="CURRENT_TIMESTAMP()"),
                )
            ),
        ),
    ),
    (
        "CREATE TABLE ns.t (a INT NULL) STORED AS PARQUET",
        CreateTable(table=T, schema=Schema(columns=(Column(name="a", type=INT),))),
    ),
    ("DROP TABLE ns.t", DropTable(table=T)),
    ("DROP TABLE IF EXISTS ns.t;", DropTable(table=T, if_exists=True)),
    # --- ALTER TABLE ---
    ("ALTER TABLE ns.t ADD COLUMN x INT", alter(AddColumn(column=Column(name="x", type=INT)))),
    (
        "ALTER TABLE ns.t ADD COLUMNS "
        "(x INT NOT NULL DEFAULT 5 COMMENT 'c' FIRST, y STRING AFTER a)",
        alter(
            AddColumn(
                column=Column(name="x", type=INT, nullable=False, default_sql="5", comment="c"),
                position=First(),
            ),
            AddColumn(column=Column(name="y", type=STRING), position=After(column="a")),
        ),
    ),
    (
        "ALTER TABLE ns.t ADD COLUMNS x INT, y INT",
        alter(
            AddColumn(column=Column(name="x", type=INT)),
            AddColumn(column=Column(name="y", type=INT)),
        ),
    ),
    (
        "ALTER TABLE ns.t ADD COLUMN s.t.x INT COMMENT 'n'",
        alter(AddColumn(parent=("s", "t"), column=Column(name="x", type=INT, comment="n"))),
    ),
    ("ALTER TABLE ns.t RENAME COLUMN a TO b", alter(RenameColumn(path=("a",), new_name="b"))),
    (
        "ALTER TABLE ns.t RENAME COLUMN s.a TO `B c`",
        alter(RenameColumn(path=("s", "a"), new_name="B c")),
    ),
    ("ALTER TABLE ns.t DROP COLUMN a", alter(DropColumn(path=("a",)))),
    (
        "ALTER TABLE ns.t DROP COLUMNS (a, s.b)",
        alter(DropColumn(path=("a",)), DropColumn(path=("s", "b"))),
    ),
    (
        "ALTER TABLE ns.t DROP COLUMN IF EXISTS s.a",
        alter(DropColumn(path=("s", "a"), if_exists=True)),
    ),
    (
        "ALTER TABLE ns.t ALTER COLUMN c TYPE BIGINT",
        alter(AlterColumnType(path=("c",), new_type=BIGINT)),
    ),
    (
        "ALTER TABLE ns.t CHANGE COLUMN c TYPE DECIMAL(12,2)",
        alter(AlterColumnType(path=("c",), new_type=DecimalType(precision=12, scale=2))),
    ),
    ("ALTER TABLE ns.t CHANGE c c BIGINT", alter(AlterColumnType(path=("c",), new_type=BIGINT))),
    (
        "ALTER TABLE ns.t ALTER COLUMN s.x TYPE BIGINT",
        alter(AlterColumnType(path=("s", "x"), new_type=BIGINT)),
    ),
    (
        "ALTER TABLE ns.t ALTER COLUMN c DROP NOT NULL",
        alter(SetNullability(path=("c",), nullable=True)),
    ),
    (
        "ALTER TABLE ns.t ALTER COLUMN c SET NOT NULL",
        alter(SetNullability(path=("c",), nullable=False)),
    ),
    (
        "ALTER TABLE ns.t ALTER COLUMN s.x DROP NOT NULL",
        alter(SetNullability(path=("s", "x"), nullable=True)),
    ),
    (
        "ALTER TABLE ns.t ALTER COLUMN c COMMENT 'x'",
        alter(SetColumnComment(path=("c",), comment="x")),
    ),
    (
        "ALTER TABLE ns.t ALTER COLUMN c COMMENT ''",
        alter(SetColumnComment(path=("c",), comment=None)),
    ),
    (
        "ALTER TABLE ns.t ALTER COLUMN s.x COMMENT 'q'",
        alter(SetColumnComment(path=("s", "x"), comment="q")),
    ),
    ("ALTER TABLE ns.t ALTER COLUMN c FIRST", alter(MoveColumn(path=("c",), position=First()))),
    (
        "ALTER TABLE ns.t ALTER COLUMN s.x AFTER y",
        alter(MoveColumn(path=("s", "x"), position=After(column="y"))),
    ),
    (
        "ALTER TABLE ns.t SET TBLPROPERTIES ('a'='b', n = -1)",
        alter(SetTableProperties(properties=(("a", "b"), ("n", "-1")))),
    ),
    (
        "ALTER TABLE ns.t UNSET TBLPROPERTIES ('a', x.y)",
        alter(UnsetTableProperties(keys=("a", "x.y"))),
    ),
    (
        "ALTER TABLE ns.t UNSET TBLPROPERTIES IF EXISTS ('a')",
        alter(UnsetTableProperties(keys=("a",), if_exists=True)),
    ),
    # comments and odd spacing are fine
    (
        "-- leading comment\nALTER TABLE ns.t /* inline */ ALTER COLUMN c\n  AFTER b ;",
        alter(MoveColumn(path=("c",), position=After(column="b"))),
    ),
]


@pytest.mark.parametrize(("sql", "expected"), SUPPORTED)
def test_supported_forms(sql: str, expected: Command) -> None:
    assert parse_ddl(sql) == expected


def test_request_id_is_carried() -> None:
    assert parse_ddl("DROP TABLE ns.t", request_id="r-1") == DropTable(request_id="r-1", table=T)


# Forms sqlglot builds a tree for: the hand parser must read them identically.
AGREEMENT = [
    sql
    for sql, _ in SUPPORTED
    if sql.split()[0].upper() in ("ALTER", "DROP")
    or sql.upper().startswith(("CREATE NAMESPACE", "CREATE SCHEMA", "CREATE DATABASE"))
]


@pytest.mark.parametrize("sql", AGREEMENT)
def test_fallback_parser_agrees_with_tree(sql: str) -> None:
    assert _Fallback(sql, "").statement() == parse_ddl(sql)


REFUSED: list[tuple[str, type[MetastoreError]]] = [
    # not one statement
    ("", InvalidDdlError),
    (" ; ;", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT); DROP TABLE ns.t", InvalidDdlError),
    # syntax
    ("CREATE TABLE ns.t (a INT", InvalidDdlError),
    ("CREATE TABLE ns.t (a)", InvalidDdlError),
    # empty list items and junk in type parameters, which sqlglot lets through (Spark does not)
    ("CREATE TABLE ns.t (a INT,,)", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT,)", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT, , b INT)", InvalidDdlError),
    ("CREATE TABLE ns.t (, a INT)", InvalidDdlError),
    ("CREATE TABLE ns.t (a STRUCT<x: INT,>)", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT) PARTITIONED BY (a,)", InvalidDdlError),
    ("ALTER TABLE ns.t ADD COLUMNS (x INT,,)", InvalidDdlError),
    ("ALTER TABLE ns.t SET TBLPROPERTIES ('a' = 'b',)", InvalidDdlError),
    ("CREATE TABLE ns.t (a DECIMAL(1 foo,1))", InvalidDdlError),
    ("CREATE TABLE ns.t (a DECIMAL(10, 2 x))", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT) garbage", InvalidDdlError),
    ("ALTER TABLE ns.t", InvalidDdlError),
    ("ALTER TABLE ns.t ALTER COLUMN c", InvalidDdlError),
    ("ALTER TABLE ns.t ADD COLUMN x INT, DROP COLUMN y", InvalidDdlError),
    ("DROP", InvalidDdlError),
    ("DROP TABLE a.b, a.c", InvalidDdlError),
    ("CREATE TABLE ns.t (a VARCHAR)", InvalidDdlError),
    ("CREATE TABLE ns.t (a INTERVAL)", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT(5))", InvalidDdlError),
    ("CREATE TABLE ns.t (s STRUCT<INT>)", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT NOT NULL NOT NULL)", InvalidDdlError),
    ("ALTER TABLE ns.t ADD COLUMN x INT DEFAULT 1 FROM t", InvalidDdlError),
    ("ALTER TABLE ns.t ADD COLUMN x INT DEFAULT", InvalidDdlError),
    ("CREATE NAMESPACE ns COMMENT 'a' COMMENT 'b'", InvalidDdlError),
    ("CREATE NAMESPACE ns WITH DBPROPERTIES ('a'='1') COMMENT 'a' COMMENT 'b'", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT) COMMENT 'a' COMMENT 'b'", InvalidDdlError),
    ("SELECT 'unterminated", InvalidDdlError),
    # unsupported statements and clauses
    ("SELECT 1", UnsupportedStatementError),
    ("INSERT INTO ns.t VALUES (1)", UnsupportedStatementError),
    ("SHOW TABLES", UnsupportedStatementError),
    ("GRANT SELECT ON t TO u", UnsupportedStatementError),
    ("CREATE VIEW ns.v AS SELECT 1", UnsupportedStatementError),
    ("DROP VIEW ns.v", UnsupportedStatementError),
    ("ALTER VIEW ns.v AS SELECT 1", UnsupportedStatementError),
    ("CREATE TABLE ns.t AS SELECT 1", UnsupportedStatementError),
    ("CREATE TABLE ns.t LIKE ns.u", UnsupportedStatementError),
    ("CREATE TABLE ns.t USING parquet", UnsupportedStatementError),
    ("CREATE OR REPLACE TABLE ns.t (a INT)", UnsupportedStatementError),
    ("CREATE TEMPORARY TABLE ns.t (a INT)", UnsupportedStatementError),
    ("CREATE EXTERNAL TABLE ns.t (a INT)", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a INT) USING delta", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a INT) PARTITIONED BY (a)", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a INT) PARTITIONED BY (bucket(4, a))", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a INT) CLUSTERED BY (a) INTO 4 BUCKETS", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a INT) LOCATION '/'", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT) LOCATION 'relative/dir'", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT) LOCATION '/a/../b'", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT) LOCATION 's3://'", InvalidArgumentError),
    # A file URI with a host: every reader and GC would take `host/x` as a relative directory,
    # each under its own working directory.
    ("CREATE TABLE ns.t (a INT) LOCATION 'file://host/x'", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT) LOCATION 'file://localhost/x'", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT) LOCATION '" + "/x" * 513 + "'", LimitExceededError),
    ("CREATE TABLE ns.t (a INT) LOCATION x", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT) LOCATION '/a' LOCATION '/b'", InvalidDdlError),
    ("CREATE TABLE ns.t (a INT) OPTIONS (k 'v')", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a INT PRIMARY KEY)", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a INT GENERATED ALWAYS AS (1))", UnsupportedStatementError),
    ("CREATE TABLE ns.t (a STRING COLLATE 'x')", UnsupportedStatementError),
    ("CREATE DATABASE ns LOCATION '/x'", UnsupportedStatementError),
    ("CREATE NAMESPACE ns LOCATION '/x'", UnsupportedStatementError),
    ("DROP TABLE ns.t PURGE", UnsupportedStatementError),
    ("ALTER TABLE ns.t RENAME TO ns.u", UnsupportedStatementError),
    ("ALTER TABLE IF EXISTS ns.t ADD COLUMN x INT", UnsupportedStatementError),
    ("ALTER TABLE ns.t ADD COLUMN IF NOT EXISTS x INT", UnsupportedStatementError),
    ("ALTER TABLE ns.t ALTER COLUMN c SET DEFAULT 5", UnsupportedStatementError),
    ("ALTER TABLE ns.t ALTER COLUMN s.c SET DEFAULT 5", UnsupportedStatementError),
    ("ALTER TABLE ns.t ALTER COLUMN s.c DROP DEFAULT", UnsupportedStatementError),
    (
        "ALTER TABLE ns.t ALTER COLUMN c TYPE BIGINT COMMENT 'x'",
        InvalidDdlError,
    ),  # one change per ALTER COLUMN
    ("ALTER TABLE ns.t CHANGE COLUMN a b BIGINT", UnsupportedStatementError),
    ("ALTER TABLE ns.t SET LOCATION '/x'", UnsupportedStatementError),
    ("ALTER TABLE ns.t RECOVER PARTITIONS", UnsupportedStatementError),
    # names
    ("CREATE TABLE t (a INT)", InvalidArgumentError),
    ("CREATE TABLE cat.ns.t (a INT)", InvalidArgumentError),
    ("ALTER TABLE t ALTER COLUMN c FIRST", InvalidArgumentError),
    ("CREATE NAMESPACE a.b", InvalidArgumentError),
    ("CREATE TABLE `my-ns`.t (a INT)", InvalidArgumentError),
    ("CREATE TABLE ns.t (`` INT)", InvalidArgumentError),
    # semantic checks done at parse time
    ("CREATE TABLE ns.t (a INT, A STRING)", ColumnAlreadyExistsError),
    ("CREATE TABLE ns.t (a DECIMAL(40, 2))", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT DEFAULT b + 1)", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT DEFAULT (SELECT 1))", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT DEFAULT max(1))", InvalidArgumentError),
    ("ALTER TABLE ns.t ADD COLUMN x INT DEFAULT y FIRST", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT) TBLPROPERTIES ('owner'='me')", InvalidArgumentError),
    ("CREATE TABLE ns.t (a INT) TBLPROPERTIES ('x'='1', 'x'='2')", InvalidArgumentError),
    ("ALTER TABLE ns.t ADD COLUMN s.x INT DEFAULT 1", UnsupportedSchemaChangeError),
    ("CREATE TABLE ns.t (a " + "ARRAY<" * 17 + "INT" + ">" * 17 + ")", LimitExceededError),
    (
        "ALTER TABLE ns.t ALTER COLUMN a TYPE " + "ARRAY<" * 17 + "INT" + ">" * 17,
        LimitExceededError,
    ),
    ("CREATE TABLE ns.t (" + "a" * 129 + " INT)", LimitExceededError),
]


@pytest.mark.parametrize(("sql", "error"), REFUSED)
def test_refusals(sql: str, error: type[MetastoreError]) -> None:
    with pytest.raises(error):
        parse_ddl(sql)


@pytest.mark.parametrize(
    ("sql", "hint"),
    [
        ("DESCRIBE TABLE ns.t", "metastore table describe"),
        ("DESC ns.t", "metastore table describe"),
        ("SHOW TABLES IN ns", "metastore table list"),
        ("SHOW DATABASES", "metastore ns list"),
        ("SELECT * FROM ns.t", "metastore table read"),
        ("INSERT INTO ns.t VALUES (1)", "spark_bridge"),
    ],
)
def test_a_statement_that_looks_or_writes_data_says_where_to_do_it(sql: str, hint: str) -> None:
    """A data engineer types DESCRIBE, SHOW TABLES or SELECT into `metastore sql` first: the
    refusal names the command that shows it (or, for rows, where they are written)."""
    with pytest.raises(UnsupportedStatementError) as refused:
        parse_ddl(sql)
    assert hint in str(refused.value), str(refused.value)


def test_parse_errors_carry_position() -> None:
    with pytest.raises(InvalidDdlError) as info:
        parse_ddl("CREATE TABLE ns.t (\n  a INT,\n  b FOO BAR)")
    assert info.value.details["line"] == 3
    with pytest.raises(InvalidDdlError) as info:
        parse_ddl("ALTER TABLE ns.t ALTER COLUMN c\n  SOMETHING")
    assert info.value.details["line"] == 2
    assert info.value.details["col"] == 3


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("CREATE TABLE (a INT)", "Expected table name but got '('"),
        ("DROP TABLE", "Expected table name but got end of input"),
        ("SELECT FROM WHERE", "got 'WHERE'"),
        ("CREATE TABLE ns.t (a INT) LOCATION", "incomplete LOCATION"),
        ("CREATE TABLE ns.t (a INT) PARTITIONED BY", "incomplete PARTITIONED BY"),
        ("ALTER TABLE ns.t ADD COLUMN c INT DEFAULT", "incomplete DEFAULT"),
        ("CREATE TABLE ns.t (a INT COMMENT)", "incomplete COMMENT"),
    ],
)
def test_parse_errors_name_the_text_not_the_parsers_objects(sql: str, says: str) -> None:
    # sqlglot's messages hold reprs of its own tokens and classes (`<Token token_type: ...>`,
    # `<class 'sqlglot.expressions...'>`): the user must see their own text and where it is.
    with pytest.raises(InvalidDdlError) as info:
        parse_ddl(sql)
    message = info.value.message
    assert says in message, message
    assert "<" not in message and "sqlglot" not in message, message
    assert "(line 1, col " in message
    assert info.value.details["reason"] in message


def test_statement_size_limit() -> None:
    padding = " " * limits.MAX_STATEMENT_BYTES
    with pytest.raises(LimitExceededError):
        parse_ddl("DROP TABLE ns.t" + padding)


def test_column_limit_in_create_table() -> None:
    cols = ", ".join(f"c{i} INT" for i in range(limits.MAX_COLUMNS_PER_TABLE + 1))
    with pytest.raises(LimitExceededError):
        parse_ddl(f"CREATE TABLE ns.t ({cols})")
    ok = ", ".join(f"c{i} INT" for i in range(limits.MAX_COLUMNS_PER_TABLE))
    cmd = parse_ddl(f"CREATE TABLE ns.t ({ok})")
    assert isinstance(cmd, CreateTable)
    assert len(cmd.schema.columns) == limits.MAX_COLUMNS_PER_TABLE


@DETERMINISTIC
@given(data_types(simple_names))
def test_tree_type_conversion_agrees_with_parse_type(t: DataType) -> None:
    """sqlglot's tree (CREATE TABLE) and our type parser (ALTER ... TYPE fallback) read every
    rendered type identically."""
    cmd = parse_ddl(f"CREATE TABLE ns.t (c {t.to_sql()})")
    assert isinstance(cmd, CreateTable)
    assert cmd.schema.columns[0].type == t
    fallback = _Fallback(f"ALTER TABLE ns.t ADD COLUMN c {t.to_sql()}", "").statement()
    assert fallback == parse_ddl(f"ALTER TABLE ns.t ADD COLUMN c {t.to_sql()}")


SQL_WORDS = st.sampled_from(
    [
        "CREATE",
        "DROP",
        "ALTER",
        "TABLE",
        "NAMESPACE",
        "SCHEMA",
        "ADD",
        "COLUMN",
        "COLUMNS",
        "RENAME",
        "TO",
        "TYPE",
        "SET",
        "UNSET",
        "TBLPROPERTIES",
        "NOT",
        "NULL",
        "DEFAULT",
        "COMMENT",
        "FIRST",
        "AFTER",
        "IF",
        "EXISTS",
        "CASCADE",
        "CHANGE",
        "STRUCT<",
        "ARRAY<",
        "MAP<",
        ">",
        "<",
        "(",
        ")",
        ",",
        ".",
        ":",
        ";",
        "=",
        "'x'",
        "`q`",
        "ns.t",
        "a",
        "s.x",
        "INT",
        "BIGINT",
        "DECIMAL(10,2)",
        "1",
        "-",
        "/*",
        "--",
        "\n",
        "WITH",
        "DBPROPERTIES",
    ]
)


@DETERMINISTIC
@given(st.lists(SQL_WORDS, max_size=25).map(" ".join))
@example("ALTER TABLE ns.t ADD COLUMN a STRUCT<")
@example("CREATE TABLE ns.t (a INT DEFAULT ((((((((1))))))))")
@example("(" * 5000)
def test_sql_like_noise_only_raises_metastore_errors(sql: str) -> None:
    with contextlib.suppress(MetastoreError):
        parse_ddl(sql)


@DETERMINISTIC
@given(st.text(max_size=200))
def test_arbitrary_text_only_raises_metastore_errors(sql: str) -> None:
    with contextlib.suppress(MetastoreError):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT NULL",
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT (NULL)",
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT CAST(NULL AS INT)",
        "ALTER TABLE ns.t ADD COLUMN n INT DEFAULT NULL NOT NULL FIRST",  # the hand parser
        "ALTER TABLE ns.t ADD COLUMNS (m INT, n INT NOT NULL DEFAULT null)",
        "CREATE TABLE ns.t (a INT, n INT NOT NULL DEFAULT NULL)",
    ],
)
def test_a_not_null_column_with_a_null_default_is_refused(sql: str) -> None:
    """Writers fill a column they do not write with its DEFAULT and check NOT NULL row by row
    (spark_bridge.conform): a NULL default on a NOT NULL column fails every such write. Added by
    a schema change job, it made every batch writing the table fail from its write-only step
    on, and no backfill could finish."""
    with pytest.raises(InvalidArgumentError, match="NULL"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 'abc'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(10,2) NOT NULL DEFAULT ('x1')",
        "ALTER TABLE ns.t ADD COLUMN n BOOLEAN NOT NULL DEFAULT 'maybe'",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT 'abc' NOT NULL FIRST",  # the hand parser
        "CREATE TABLE ns.t (a INT, n BIGINT NOT NULL DEFAULT 'x')",
    ],
)
def test_a_not_null_column_whose_default_cannot_be_its_type_is_refused(sql: str) -> None:
    """Writers fill the column with CAST(default AS type) (spark_bridge.conform): a string
    that is no number (or boolean) casts to NULL, or fails under ANSI, so, like a NULL
    default, it broke every write of the table from an ADD COLUMN job's write-only step on."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT ' 42 '",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE NOT NULL DEFAULT '-1.5e3'",
        "ALTER TABLE ns.t ADD COLUMN n BOOLEAN NOT NULL DEFAULT CAST('true' AS BOOLEAN)",
        "ALTER TABLE ns.t ADD COLUMN n STRING NOT NULL DEFAULT 'abc'",
        "ALTER TABLE ns.t ADD COLUMN n STRING NOT NULL DEFAULT TRUE",
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1.5",
    ],
)
def test_string_defaults_that_cast_to_the_column_type_parse(sql: str) -> None:
    parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n INT DEFAULT NULL",
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 0",
        "ALTER TABLE ns.t ADD COLUMN n STRING NOT NULL DEFAULT 'NULL'",
        "CREATE TABLE ns.t (n INT NOT NULL DEFAULT coalesce(NULL, 1))",
    ],
)
def test_null_defaults_on_nullable_columns_and_non_null_defaults_parse(sql: str) -> None:
    parse_ddl(sql)


_LONG_PATH = ".".join(["a"] * 3000)  # well under MAX_STATEMENT_BYTES


@pytest.mark.parametrize(
    "sql",
    [
        f"ALTER TABLE ns.t RENAME COLUMN {_LONG_PATH} TO b",
        f"ALTER TABLE ns.t DROP COLUMN {_LONG_PATH}",
        f"ALTER TABLE ns.t DROP COLUMNS ({_LONG_PATH})",
        f"ALTER TABLE ns.t ADD COLUMN {_LONG_PATH} INT",
        f"ALTER TABLE ns.t SET TBLPROPERTIES ({_LONG_PATH}='1')",
        f"CREATE TABLE ns.t (a INT) TBLPROPERTIES ({_LONG_PATH}='1')",
    ],
)
def test_a_very_long_dotted_name_is_a_typed_error(sql: str) -> None:
    """A dotted name of thousands of parts is a chain of thousands of nested Dot nodes; walking
    it recursively raised RecursionError (the daemon's INTERNAL error) instead of a typed one."""
    with pytest.raises(MetastoreError):
        parse_ddl(sql)


def test_lone_surrogates_are_refused_cleanly() -> None:
    with pytest.raises(InvalidArgumentError):
        parse_ddl("CREATE TABLE ns.t (a INT COMMENT '\ud800')")


# --- table locations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "warehouse", "location"),
    [
        ("CREATE TABLE ns.t (a INT) LOCATION '/data/t'", "", "/data/t"),
        ("CREATE TABLE ns.t (a INT) LOCATION '/data/t/'", "/wh", "/data/t"),  # LOCATION wins
        ("CREATE TABLE ns.t (a INT) USING parquet LOCATION 's3://b/p'", "", "s3://b/p"),
        ("CREATE TABLE ns.t (a INT) LOCATION 'file:///tmp/x' COMMENT 'c'", "", "file:///tmp/x"),
        ("CREATE TABLE Ns.T (a INT)", "/wh", "/wh/ns.db/t"),
        ("CREATE TABLE ns.t (a INT)", "s3://bucket/wh/", "s3://bucket/wh/ns.db/t"),
        ("CREATE TABLE ns.t (a INT)", "", ""),  # no warehouse, no LOCATION: no location
        # A scheme is case-insensitive (Spark's Hadoop Path writes FILE:///tmp/x at /tmp/x):
        # kept as written, readers took FILE:// for a URI to percent-decode, and the catalog's
        # overlap rule did not see /tmp/x and FILE:///tmp/x as one directory.
        ("CREATE TABLE ns.t (a INT) LOCATION 'FILE:///tmp/x%20y'", "", "file:///tmp/x%20y"),
        ("CREATE TABLE ns.t (a INT) LOCATION 'S3A://Bucket/P/'", "", "s3a://Bucket/P"),
        ("CREATE TABLE ns.t (a INT)", "File:///wh", "file:///wh/ns.db/t"),
    ],
)
def test_location(sql: str, warehouse: str, location: str) -> None:
    cmd = parse_ddl(sql, warehouse=warehouse)
    assert isinstance(cmd, CreateTable)
    assert cmd.location == location


@pytest.mark.parametrize("warehouse", ["relative", "/", "/a/./b", "s3://"])
def test_bad_warehouse_is_refused(warehouse: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_ddl("CREATE TABLE ns.t (a INT)", warehouse=warehouse)


def test_warehouse_does_not_touch_other_statements() -> None:
    assert parse_ddl("DROP TABLE ns.t", warehouse="/wh") == DropTable(table=T)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("ALTER TABLE ns.t ALTER COLUMN c TYPE VARCHAR(10)", "VARCHAR(10)"),
        ("ALTER TABLE ns.t ALTER COLUMN c TYPE CHAR(3)", "CHAR(3)"),
        ("ALTER TABLE ns.t CHANGE COLUMN c c VARCHAR(10)", "VARCHAR(10)"),
        ("ALTER TABLE ns.t ALTER COLUMN c TYPE STRING", "STRING"),
        ("ALTER TABLE ns.t ALTER COLUMN s.x TYPE VARCHAR(7)", "VARCHAR(7)"),
    ],
)
def test_alter_column_type_keeps_varchar_and_char_lengths(sql: str, expected: str) -> None:
    """sqlglot's Spark dialect reads `TYPE VARCHAR(n)` as TEXT; taken as is, a widening of
    VARCHAR(5) to VARCHAR(10) became VARCHAR(5) -> STRING (found by the Spark widening tests)."""
    cmd = parse_ddl(sql)
    assert isinstance(cmd, AlterTable)
    [change] = cmd.changes
    assert isinstance(change, AlterColumnType)
    assert change.new_type.to_sql() == expected


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n DATE NOT NULL DEFAULT 'abc'",
        "ALTER TABLE ns.t ADD COLUMN n DATE NOT NULL DEFAULT DATE 'abc'",
        "ALTER TABLE ns.t ADD COLUMN n DATE NOT NULL DEFAULT '2023-02-29'",
        "ALTER TABLE ns.t ADD COLUMN n DATE NOT NULL DEFAULT 5",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP NOT NULL DEFAULT 'garbage'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP NOT NULL DEFAULT TIMESTAMP '2024-13-01 00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ NOT NULL DEFAULT '2024-01-01 25:00:00'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(3,1) NOT NULL DEFAULT 12345.6",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(3,1) NOT NULL DEFAULT -99.96",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(3,1) NOT NULL DEFAULT '12345.6'",
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 3000000000",
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1e999999999",  # at once, no int()
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(38,2) DEFAULT '1e999999999'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(38,0) DEFAULT " + "1" + "0" * 38,
        "ALTER TABLE ns.t ADD COLUMN n TINYINT NOT NULL DEFAULT -129",
        "ALTER TABLE ns.t ADD COLUMN n BIGINT NOT NULL DEFAULT CAST('x' AS BIGINT)",
        "ALTER TABLE ns.t ADD COLUMN n VARCHAR(3) NOT NULL DEFAULT 'abcd'",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT 'abc' NOT NULL FIRST",  # the hand parser
        "CREATE TABLE ns.t (a INT, d DATE NOT NULL DEFAULT 'abc')",
    ],
)
def test_a_not_null_default_that_is_no_value_of_a_date_time_or_sized_type_is_refused(
    sql: str,
) -> None:
    """Only numbers and booleans were checked (and loosely: an INT out of range passed). A
    DATE/TIMESTAMP column with a garbage string, an overflowing DECIMAL or INT, or a too long
    VARCHAR was accepted: every writer filling the column (CAST(default AS type)) then failed
    under ANSI or wrote NULL into a NOT NULL column, and an ADD COLUMN job's write-only step
    broke every writer of the table."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n DATE NOT NULL DEFAULT '2024-02-29'",
        "ALTER TABLE ns.t ADD COLUMN n DATE NOT NULL DEFAULT DATE '2024-1-5'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP NOT NULL DEFAULT TIMESTAMP '2024-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP NOT NULL DEFAULT '2024-01-01T08:30:00.5+05:30'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ NOT NULL DEFAULT '2024-01-01 10:00:00'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ NOT NULL DEFAULT TIMESTAMP_NTZ '2024-01-01'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(3,1) NOT NULL DEFAULT 99.94",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(3,1) NOT NULL DEFAULT -12",
        "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT -2147483648",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(38,0) DEFAULT -" + "9" * 38,
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(38,37) DEFAULT 1." + "2345678901" * 3 + "2345678",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(5,2) DEFAULT 1e-999999999",
        "ALTER TABLE ns.t ADD COLUMN n TINYINT NOT NULL DEFAULT 5L",
        "ALTER TABLE ns.t ADD COLUMN n VARCHAR(3) NOT NULL DEFAULT 'abc'",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE NOT NULL DEFAULT 1e300",
        "CREATE TABLE ns.t (a INT, n TIMESTAMP DEFAULT current_timestamp())",
    ],
)
def test_defaults_that_are_values_of_date_time_and_sized_types_parse(sql: str) -> None:
    parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT TIMESTAMP '2024-01-01 00:00:00'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP NOT NULL DEFAULT '2024-01-01 00:00:00'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT CAST('2024-01-01' AS TIMESTAMP)",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT DATE '2024-01-01'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT TIMESTAMP_NTZ '2024-01-01 00:00:00'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT 86400",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT TIMESTAMP '2024-01-01 23:30:00+00:00'",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT TIMESTAMP '2024-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT TIMESTAMP '2024-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '2024-01-01' NOT NULL",  # hand parser
        "CREATE TABLE ns.t (a INT, ts TIMESTAMP DEFAULT '2024-01-01 12:00')",
    ],
)
def test_a_default_whose_instant_depends_on_the_session_time_zone_is_refused(sql: str) -> None:
    """A zone-less TIMESTAMP default (or a DATE/TIMESTAMP_NTZ/number turned into a TIMESTAMP,
    or a TIMESTAMP turned into a DATE/STRING/TIMESTAMP_NTZ) has no fixed value: Spark fills it
    in its session time zone, the pyarrow readers and writers (`table read`, the `metastore`
    data source) in UTC (and an epoch number as microseconds), so two readers of the same table
    at the same timestamp saw different rows, and two writers stored different instants."""
    with pytest.raises(InvalidArgumentError, match="time zone"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT TIMESTAMP '2024-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '2024-01-01 00:00:00-08:00'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '2024-01-01T01:02:03Europe/Paris'",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP_NTZ DEFAULT '2024-01-01 00:00:00'",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT DATE '2024-01-01'",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT TIMESTAMP_NTZ '2024-01-01 23:00'",
        "ALTER TABLE ns.t ADD COLUMN n BIGINT DEFAULT TIMESTAMP '2024-01-01 00:00:00Z'",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT '2024-01-01 00:00:00'",
    ],
)
def test_defaults_with_a_fixed_instant_parse(sql: str) -> None:
    parse_ddl(sql)


def test_a_zoned_timestamp_default_reads_as_one_utc_instant_outside_spark() -> None:
    """What the DDL now accepts, the pyarrow readers evaluate to the instant Spark reads."""
    cmd = parse_ddl("ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT '2024-01-01 00:30:00+01:00'")
    assert isinstance(cmd, AlterTable)
    [change] = cmd.changes
    assert isinstance(change, AddColumn) and change.column.default_sql is not None
    value = existence_default(change.column.default_sql, pa.timestamp("us", tz="UTC"))
    assert value.as_py() == dt.datetime(2023, 12, 31, 23, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n INT DEFAULT 'abc'",
        "ALTER TABLE ns.t ADD COLUMN n INT DEFAULT '1.5'",
        "ALTER TABLE ns.t ADD COLUMN n INT DEFAULT TRUE",
        "ALTER TABLE ns.t ADD COLUMN n BOOLEAN DEFAULT 'true'",
        "ALTER TABLE ns.t ADD COLUMN n BOOLEAN NOT NULL DEFAULT 1",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT '2024-02-30'",
        "ALTER TABLE ns.t ADD COLUMN n DECIMAL(3,1) DEFAULT 12345.6",
        "CREATE TABLE ns.t (a INT, n DECIMAL(10,2) DEFAULT 'x')",
        "ALTER TABLE ns.t ADD COLUMN n ARRAY<INT> DEFAULT 5",
        "ALTER TABLE ns.t ADD COLUMN n MAP<STRING, INT> DEFAULT 'x'",
        "CREATE TABLE ns.t (a INT, s STRUCT<x: INT> DEFAULT CAST(1 AS BIGINT))",
    ],
)
def test_a_default_spark_cannot_assign_to_the_column_is_refused_even_when_nullable(
    sql: str,
) -> None:
    """Spark's Parquet reader turns the DEFAULT (the field's EXISTS_DEFAULT) into a value of the
    column's type for every file written before the column existed, and fails the whole read
    (INVALID_DEFAULT_VALUE.DATA_TYPE) when it cannot: a string that is no value of the type, a
    BOOLEAN for a number or a string/number for a BOOLEAN, '1.5' for an INT. Spark's own ALTER
    TABLE refuses these; ours accepted them (on a nullable column always, 'true' for a BOOLEAN
    even NOT NULL), and every Spark read of the table broke."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE ns.t (a INT, n DOUBLE DEFAULT rand())",
        "CREATE TABLE ns.t (a INT, n STRING DEFAULT uuid())",
        "ALTER TABLE ns.t ADD COLUMN n DOUBLE DEFAULT random() * 10",
        "ALTER TABLE ns.t ADD COLUMN n BIGINT DEFAULT monotonically_increasing_id()",
    ],
)
def test_a_non_deterministic_default_is_refused(sql: str) -> None:
    """Spark refuses a non-deterministic DEFAULT (INVALID_DEFAULT_VALUE.NON_DETERMINISTIC), and
    its Parquet reader fails every read of a table whose schema carries one as an existence
    default (NOT_CONSTANT), whether or not the files lack the column. We accepted it."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP DEFAULT current_timestamp()",
        "ALTER TABLE ns.t ADD COLUMN n TIMESTAMP NOT NULL DEFAULT now()",
        "ALTER TABLE ns.t ADD COLUMN n DATE DEFAULT current_date()",
        "ALTER TABLE ns.t ADD COLUMN n BIGINT DEFAULT unix_timestamp()",
        "ALTER TABLE ns.t ADD COLUMN n STRING DEFAULT current_user()",
        "ALTER TABLE ns.t ADD COLUMNS (m INT, n DATE DEFAULT date_add(current_date(), 1))",
    ],
)
def test_an_added_column_whose_default_is_read_time_dependent_is_refused(sql: str) -> None:
    """Rows written before ADD COLUMN read its DEFAULT, and Spark evaluates the existence default
    at each read: current_timestamp() gave those rows a new value at every read, so a read AS OF
    the same timestamp never returned the same rows twice (Spark's own ALTER TABLE evaluates it
    once, at the ALTER). CREATE TABLE may keep such a default: no row predates the column."""
    with pytest.raises(InvalidArgumentError, match="DEFAULT"):
        parse_ddl(sql)
    parse_ddl("CREATE TABLE ns.t (a INT, n TIMESTAMP DEFAULT current_timestamp())")
