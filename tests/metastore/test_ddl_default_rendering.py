"""A DEFAULT is stored as sqlglot's rendering of what the user wrote; a rendering that means
something else in Spark is refused (`metastore.default_values.check_rendering`).

Each refused case was measured with pyspark 4 (the user's text and the rendering evaluated in
one session): the two gave different values, types, or one of them failed. Each kept case gave
the same value and type.
"""

from __future__ import annotations

import pytest

from metastore.commands import AlterTable, CreateTable
from metastore.ddl import parse_ddl
from metastore.errors import InvalidArgumentError


def _create(column_sql: str) -> str:
    return f"CREATE TABLE ns.t (k INT, {column_sql})"


def _stored_default(sql: str) -> str | None:
    cmd = parse_ddl(sql)
    if isinstance(cmd, CreateTable):
        return cmd.schema.columns[-1].default_sql
    assert isinstance(cmd, AlterTable)
    return cmd.changes[0].column.default_sql  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "column_sql",
    [
        # sqlglot drops to_char's format: '2020' became '2020-01-01', '12,454.8' '12454.8'
        "c STRING DEFAULT to_char(DATE '2020-01-01', 'yyyy')",
        "c STRING DEFAULT to_char(12454.8, '99,999.9')",
        # Spark refuses to_char without a format; the rendering was a plain CAST
        "c STRING DEFAULT to_char(12454.8)",
        # the default format is dropped, and to_date without one is lenient: an error in Spark
        # ('2020-1-1' does not match yyyy-MM-dd) became 2020-01-01
        "c DATE DEFAULT to_date('2020-1-1', 'yyyy-MM-dd')",
        "c DATE DEFAULT to_date('2020-01-01', 'yyyy-MM-dd')",
        # trunc(.., 'Q') is NULL in Spark; sqlglot wrote 'QUARTER', a date
        "c DATE DEFAULT trunc(DATE '2020-05-05', 'Q')",
        # log10/log2 became LOG(10, x): 3.0 became 2.9999999999999996
        "c DOUBLE DEFAULT log10(1000)",
        "c DOUBLE DEFAULT log2(3)",
        # unix_date (INT) became DATEDIFF(DAY, ...) (BIGINT)
        "c BIGINT DEFAULT unix_date(DATE '2020-01-01')",
        # the function form became 'a' COLLATE 'UTF8_LCASE', which Spark refuses
        "c STRING DEFAULT collate('a', 'UTF8_LCASE')",
        # Spark reads 0x1F as a column name; sqlglot as the binary X'1F'
        "c BINARY DEFAULT 0x1F",
        # parse_json (a VARIANT) was stored as its argument, a STRING
        "c STRING DEFAULT parse_json('{\"a\":1}')",
        # Spark has no N'..' literal; it was stored as 'abc'
        "c STRING DEFAULT N'abc'",
        # type names Spark does not have, stored as one it has: INT8 became TINYINT, TIMESTAMP
        # WITHOUT TIME ZONE (Spark: TIMESTAMP_NTZ) TIMESTAMP; the others Spark refuses
        "c TINYINT DEFAULT CAST('1' AS INT8)",
        "c TIMESTAMP_NTZ DEFAULT CAST('2020-01-01 10:00:00' AS TIMESTAMP WITHOUT TIME ZONE)",
        "c BOOLEAN DEFAULT CAST(1 AS BOOL)",
        "c STRING DEFAULT CAST(1 AS TEXT)",
        "c STRING DEFAULT CAST(1 AS VARCHAR)",
        "c INT DEFAULT '1'::INT4",
        "c DOUBLE DEFAULT CAST(1 AS DOUBLE PRECISION)",
        "c BINARY DEFAULT CAST('a' AS BYTEA)",
    ],
)
def test_a_default_whose_rendering_means_something_else_is_refused(column_sql: str) -> None:
    for sql in (_create(column_sql), f"ALTER TABLE ns.t ADD COLUMN {column_sql}"):
        with pytest.raises(InvalidArgumentError) as exc:
            parse_ddl(sql)
        assert exc.value.details["reason"].startswith("rendering")


@pytest.mark.parametrize(
    ("column_sql", "stored"),
    [
        (
            "c DATE DEFAULT to_date('01/02/2020', 'MM/dd/yyyy')",
            "TO_DATE('01/02/2020', 'MM/dd/yyyy')",
        ),
        ("c STRING DEFAULT ltrim('x', 'xxa')", "TRIM(LEADING 'x' FROM 'xxa')"),
        (
            "c DATE DEFAULT trunc(DATE '2020-05-05', 'MM')",
            "TRUNC(CAST('2020-05-05' AS DATE), 'MM')",
        ),
        (
            "c DATE DEFAULT trunc(DATE '2020-05-05', 'week')",
            "TRUNC(CAST('2020-05-05' AS DATE), 'WEEK')",
        ),
        ("c STRING DEFAULT ucase('abc')", "UPPER('abc')"),
        ("c STRING DEFAULT 'it''s'", "'it\\'s'"),
        ("c STRING DEFAULT 'a\\u0041b'", "'aAb'"),
        ("c STRING DEFAULT 'a' 'b'", "CONCAT('a', 'b')"),
        ("c DECIMAL(2, 1) DEFAULT 1.5BD", "CAST('1.5' AS DECIMAL(2, 1))"),
        ("c STRING DEFAULT space(3)", "REPEAT(' ', 3)"),
        ("c DOUBLE DEFAULT log(2, 8)", "LOG(2, 8)"),
        ("c INT DEFAULT instr('abc', 'b')", "LOCATE('b', 'abc')"),
        ("c BINARY DEFAULT X'1F'", "X'1F'"),
        ("c TINYINT DEFAULT CAST(1 AS BYTE)", "CAST(1 AS TINYINT)"),
        ("c BIGINT DEFAULT CAST(1 AS LONG)", "CAST(1 AS BIGINT)"),
        ("c STRING DEFAULT CAST('a' AS VARCHAR(3))", "CAST('a' AS STRING)"),
        ("c DECIMAL(5, 2) DEFAULT CAST('1' AS DEC(5,2))", "CAST('1' AS DECIMAL(5, 2))"),
        ("c INT DEFAULT '1'::INT + 1", "CAST('1' AS INT) + 1"),
        ("c ARRAY<INT> DEFAULT CAST(ARRAY('1') AS ARRAY<INT>)", None),
        ("c TIMESTAMP_NTZ DEFAULT CAST('2020-01-01' AS TIMESTAMP_NTZ)", None),
        ("c STRING DEFAULT 'a\\_c'", "'a\\\\_c'"),
        ("c STRING DEFAULT r'a\\nb'", "'a\\\\nb'"),
    ],
)
def test_a_default_whose_rendering_means_the_same_is_kept(
    column_sql: str, stored: str | None
) -> None:
    for sql in (_create(column_sql), f"ALTER TABLE ns.t ADD COLUMN {column_sql}"):
        got = _stored_default(sql)
        if stored is not None:
            assert got == stored
