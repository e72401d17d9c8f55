"""Column types are read as Spark reads them: a type name Spark does not have is refused.

sqlglot, which parses CREATE TABLE and ALTER TABLE ... ADD COLUMN(S), also reads other
dialects' names: `INT8` (PostgreSQL's 8-byte integer) became a TINYINT, `TIMESTAMP WITHOUT
TIME ZONE` a TIMESTAMP (Spark's would be TIMESTAMP_NTZ, had it this spelling), and `BOOL`,
`TEXT`, `INT4`, `FLOAT8`, ... were accepted where Spark refuses the statement."""

from __future__ import annotations

import pytest

from metastore.commands import AlterTable, CreateTable
from metastore.ddl import parse_ddl
from metastore.errors import InvalidDdlError

REFUSED = [
    "c INT8",
    "c INT4",
    "c INT2",
    "c INT1",
    "c BOOL",
    "c TEXT",
    "c FLOAT8",
    "c DOUBLE PRECISION",
    "c TIMESTAMP WITHOUT TIME ZONE",
    "c TIMESTAMP WITH TIME ZONE",
    "c STRUCT<a: INT8>",
    "c ARRAY<BOOL>",
    "c MAP<TEXT, INT>",
    "c INT8 DEFAULT CAST(1 AS TINYINT)",
]


@pytest.mark.parametrize("column", REFUSED)
def test_a_type_name_spark_does_not_have_is_refused(column: str) -> None:
    with pytest.raises(InvalidDdlError, match="Spark"):
        parse_ddl(f"CREATE TABLE ns.t ({column})")
    with pytest.raises(InvalidDdlError, match="Spark"):
        parse_ddl(f"ALTER TABLE ns.t ADD COLUMN {column}")


@pytest.mark.parametrize(
    ("column", "type_sql"),
    [
        ("text STRING", "STRING"),
        ("int8 BIGINT", "BIGINT"),
        ("bool BOOLEAN", "BOOLEAN"),
        ("`int8` TINYINT", "TINYINT"),
        ("c BYTE", "TINYINT"),
        ("c SHORT", "SMALLINT"),
        ("c INTEGER", "INT"),
        ("c LONG", "BIGINT"),
        ("c REAL", "FLOAT"),
        ("c TIMESTAMP", "TIMESTAMP"),
        ("c TIMESTAMP_LTZ", "TIMESTAMP"),
        ("c TIMESTAMP_NTZ", "TIMESTAMP_NTZ"),
        ("c TINYINT DEFAULT 1Y", "TINYINT"),
        ("c DECIMAL(5, 2) DEFAULT 1.5BD", "DECIMAL(5,2)"),
        ("c NUMERIC(5, 2)", "DECIMAL(5,2)"),
        ("c STRUCT<text: STRING, bool: BOOLEAN>", "STRUCT<text: STRING, bool: BOOLEAN>"),
        ("c MAP<STRING, ARRAY<LONG>>", "MAP<STRING, ARRAY<BIGINT>>"),
    ],
)
def test_sparks_own_type_names_are_accepted(column: str, type_sql: str) -> None:
    created = parse_ddl(f"CREATE TABLE ns.t ({column})")
    assert isinstance(created, CreateTable)
    assert created.schema.columns[0].type.to_sql() == type_sql
    added = parse_ddl(f"ALTER TABLE ns.t ADD COLUMN {column}")
    assert isinstance(added, AlterTable)


def test_int8_is_not_read_as_a_one_byte_integer() -> None:
    with pytest.raises(InvalidDdlError) as refused:
        parse_ddl("CREATE TABLE ns.t (id INT8 NOT NULL, v INT)")
    assert "INT8" in refused.value.message and "BIGINT" in refused.value.message
