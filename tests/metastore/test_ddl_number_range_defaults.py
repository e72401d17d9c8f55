"""A number DEFAULT beyond its column type's range (measured with pyspark 4, CREATE TABLE and
ALTER TABLE ADD COLUMN, then a write filling the default and a read of older rows).

Spark refuses an integer or decimal out of range (INVALID_DEFAULT_VALUE.DATA_TYPE or
CAST_OVERFLOW), and the DDL did too. A FLOAT or DOUBLE default beyond the type's range Spark
accepts and turns into Infinity (FLOAT DEFAULT 1e40 reads inf): never what was written, so it is
refused here; a user who wants Infinity writes CAST('Infinity' AS FLOAT)."""

from __future__ import annotations

import pytest

from metastore.ddl import parse_ddl
from metastore.errors import InvalidArgumentError


def _statements(column_type: str, default: str) -> list[str]:
    return [
        f"CREATE TABLE ns.t (c {column_type} DEFAULT {default})",
        f"ALTER TABLE ns.t ADD COLUMN c {column_type} DEFAULT {default}",
    ]


@pytest.mark.parametrize(
    ("column_type", "default"),
    [
        ("FLOAT", "1e40"),
        ("FLOAT", "-1e40"),
        ("FLOAT", "3.5e38"),
        ("FLOAT", "'1e40'"),
        ("FLOAT", "CAST(1e40 AS FLOAT)"),
        ("FLOAT", "CAST(1e39 AS DOUBLE)"),
        ("FLOAT", "CAST('3.5e38' AS DOUBLE)"),
        ("STRING", "CAST(CAST(1e40 AS FLOAT) AS STRING)"),
        ("DOUBLE", "'1e400'"),
        ("DOUBLE", "'-1e400'"),
        ("DOUBLE", "CAST('1e400' AS DOUBLE)"),
        # refused already (Spark refuses them too)
        ("TINYINT", "300"),
        ("TINYINT", "CAST(300 AS TINYINT)"),
        ("SMALLINT", "40000"),
        ("INT", "3000000000"),
        ("BIGINT", "9223372036854775808"),
        ("DECIMAL(5, 2)", "12345.678"),
        ("DECIMAL(5, 2)", "999.999"),
        ("DECIMAL(5, 2)", "'12345.678'"),
    ],
)
def test_a_number_default_beyond_its_type_is_refused(column_type: str, default: str) -> None:
    for sql in _statements(column_type, default):
        with pytest.raises(InvalidArgumentError, match=r"is no|range"):
            parse_ddl(sql)


@pytest.mark.parametrize(
    ("column_type", "default"),
    [
        ("FLOAT", "3.4028235e38"),
        ("FLOAT", "-3.4028235e38"),
        ("FLOAT", "1e-50"),  # Spark reads 0.0, as a float does
        ("FLOAT", "1.5"),
        ("FLOAT", "CAST('Infinity' AS FLOAT)"),
        ("FLOAT", "'NaN'"),
        ("DOUBLE", "1e308"),
        ("DOUBLE", "'-Infinity'"),
        ("TINYINT", "127"),
        ("DECIMAL(5, 2)", "123.456"),
    ],
)
def test_a_number_default_within_its_type_is_kept(column_type: str, default: str) -> None:
    for sql in _statements(column_type, default):
        parse_ddl(sql)


@pytest.mark.parametrize(
    ("column_type", "default"),
    [
        ("BIGINT", "-9223372036854775808L"),
        ("TINYINT", "-128Y"),
        ("SMALLINT", "-32768S"),
        ("TINYINT", "-CAST(128 AS TINYINT)"),
        ("INT", "-(CAST(2147483648 AS INT))"),
    ],
)
def test_a_sign_outside_an_overflowing_cast_is_refused(column_type: str, default: str) -> None:
    # -9223372036854775808L is stored as -CAST(9223372036854775808 AS BIGINT), which Spark
    # evaluates cast first: CAST_OVERFLOW at every write and read (measured with pyspark 4).
    for sql in _statements(column_type, default):
        with pytest.raises(InvalidArgumentError, match="range"):
            parse_ddl(sql)


@pytest.mark.parametrize(
    ("column_type", "default"),
    [
        ("BIGINT", "-1L"),
        ("TINYINT", "-127Y"),
        ("BIGINT", "-9223372036854775807L"),
        ("TINYINT", "-TRY_CAST(128 AS TINYINT)"),  # NULL in Spark, not an error
    ],
)
def test_a_sign_outside_a_cast_that_fits_is_kept(column_type: str, default: str) -> None:
    for sql in _statements(column_type, default):
        parse_ddl(sql)
