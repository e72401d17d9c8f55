"""Spark data types: parsing (aliases, errors, limits), rendering, plain data, field ids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metastore import limits
from metastore import types as M
from metastore.errors import (
    ColumnAlreadyExistsError,
    InvalidArgumentError,
    InvalidDdlError,
    LimitExceededError,
    MalformedCommandError,
)
from metastore.types import (
    BIGINT,
    BOOLEAN,
    FLOAT,
    INT,
    SMALLINT,
    STRING,
    TIMESTAMP,
    TIMESTAMP_NTZ,
    TINYINT,
    ArrayType,
    CharType,
    DataType,
    DecimalType,
    MapType,
    StructField,
    StructType,
    VarcharType,
    assign_field_ids,
    nesting_depth,
    parse_type,
    strip_field_ids,
    struct_fields,
    type_from_data,
    type_to_data,
)
from tests.metastore._support import DETERMINISTIC, data_types


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("boolean", BOOLEAN),
        ("TINYINT", TINYINT),
        ("byte", TINYINT),
        ("short", SMALLINT),
        ("Integer", INT),
        ("int", INT),
        ("LONG", BIGINT),
        ("real", FLOAT),
        ("string", STRING),
        ("timestamp_ltz", TIMESTAMP),
        ("TIMESTAMP_NTZ", TIMESTAMP_NTZ),
        ("decimal", DecimalType(precision=10, scale=0)),
        ("DEC(7)", DecimalType(precision=7, scale=0)),
        ("numeric(38, 38)", DecimalType(precision=38, scale=38)),
        ("varchar(3)", VarcharType(length=3)),
        ("CHARACTER(2)", CharType(length=2)),
        ("array<array<int>>", ArrayType(element=ArrayType(element=INT))),
        (" map < string , long > ", MapType(key=STRING, value=BIGINT)),
        (
            "struct<a:int not null comment 'x\\'y', `b c` string, c: struct<d: date>>",
            StructType(
                fields=(
                    StructField(name="a", type=INT, nullable=False, comment="x'y"),
                    StructField(name="b c", type=STRING),
                    StructField(
                        name="c",
                        type=StructType(fields=(StructField(name="d", type=parse_type("date")),)),
                    ),
                )
            ),
        ),
        ("struct<a: int comment ''>", StructType(fields=(StructField(name="a", type=INT),))),
    ],
)
def test_parse_type_accepts_spark_spellings(text: str, expected: DataType) -> None:
    assert parse_type(text) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", InvalidDdlError),
        ("foo", InvalidDdlError),
        ("interval", InvalidDdlError),
        ("char", InvalidDdlError),
        ("varchar", InvalidDdlError),
        ("array<int", InvalidDdlError),
        ("array<>", InvalidDdlError),
        ("map<int>", InvalidDdlError),
        ("struct<>", InvalidDdlError),
        ("int int", InvalidDdlError),
        ("struct<a int,>", InvalidDdlError),
        ("'unterminated", InvalidDdlError),
        ("`unterminated", InvalidDdlError),
        ("decimal(1,2,3)", InvalidDdlError),
        ("decimal(99999999999999)", InvalidDdlError),
        ("decimal(39,0)", InvalidArgumentError),
        ("decimal(0)", InvalidArgumentError),
        ("decimal(5,6)", InvalidArgumentError),
        ("varchar(0)", InvalidArgumentError),
        ("varchar(2147483648)", InvalidArgumentError),
        ("struct<a: int, A: string>", ColumnAlreadyExistsError),
        ("struct<``: int>", InvalidArgumentError),
        ("struct<`a\x01`: int>", InvalidArgumentError),
        ("array<" * 17 + "int" + ">" * 17, LimitExceededError),
        ("struct<" + "a" * 129 + ": int>", LimitExceededError),
        ("struct<a: int comment '" + "c" * 1025 + "'>", LimitExceededError),
    ],
)
def test_parse_type_refusals(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_type(text)


def test_parse_error_reports_position() -> None:
    with pytest.raises(InvalidDdlError) as info:
        parse_type("map<string,\n  foo>")
    assert info.value.details["line"] == 2
    assert info.value.details["col"] == 3


def test_depth_limit_is_inclusive() -> None:
    deepest = "array<" * 16 + "int" + ">" * 16
    assert nesting_depth(parse_type(deepest)) == limits.MAX_NESTING_DEPTH


def test_canonical_and_spark_renderings() -> None:
    t = parse_type("struct<a: varchar(5) not null comment 'it''s', `b``c`: map<char(2), dec>>")
    assert t.to_sql() == (
        "STRUCT<a: VARCHAR(5) NOT NULL COMMENT 'it\\'s', `b``c`: MAP<CHAR(2), DECIMAL(10,0)>>"
    )
    # Spark refuses CHAR/VARCHAR outside table schemas, so the DataFrame DDL uses STRING, and
    # backquotes every name so keywords never clash.
    assert t.to_spark_ddl() == (
        "STRUCT<`a`: STRING NOT NULL COMMENT 'it\\'s', `b``c`: MAP<STRING, DECIMAL(10,0)>>"
    )


def test_comment_escapes_round_trip() -> None:
    t = StructType(fields=(StructField(name="a", type=INT, comment="q' \\ \n\t\r\0 z"),))
    assert parse_type(t.to_sql()) == t
    assert "\n" not in t.to_sql()


@DETERMINISTIC
@given(data_types())
def test_to_sql_round_trips(t: DataType) -> None:
    assert parse_type(t.to_sql()) == t


def _chars_as_strings(t: DataType) -> DataType:
    match t:
        case CharType() | VarcharType():
            return STRING
        case ArrayType(element=e):
            return ArrayType(element=_chars_as_strings(e))
        case MapType(key=k, value=v):
            return MapType(key=_chars_as_strings(k), value=_chars_as_strings(v))
        case StructType(fields=fs):
            return StructType(
                fields=tuple(
                    StructField(
                        name=f.name,
                        type=_chars_as_strings(f.type),
                        nullable=f.nullable,
                        comment=f.comment,
                    )
                    for f in fs
                )
            )
        case _:
            return t


@DETERMINISTIC
@given(data_types())
def test_spark_ddl_is_the_type_with_chars_as_strings(t: DataType) -> None:
    assert parse_type(t.to_spark_ddl()) == _chars_as_strings(t)


@DETERMINISTIC
@given(data_types(), st.integers(1, 1000))
def test_plain_data_round_trips_with_ids(t: DataType, start: int) -> None:
    with_ids, next_id = assign_field_ids(t, start)
    ids = [f.field_id for f in struct_fields(with_ids)]
    assert ids == list(range(start, next_id))
    assert type_from_data(type_to_data(with_ids)) == with_ids
    assert strip_field_ids(with_ids) == t


@pytest.mark.parametrize(
    "data",
    [
        None,
        "integer",
        [],
        [1],
        ["decimal", 1],
        ["decimal", True, 0],
        ["varchar", "3"],
        ["array"],
        ["map", "int"],
        ["struct", [[1, "a", "int", True]]],
        ["struct", [[1, 2, "int", True, None]]],
        ["struct", [[1, "a", "int", 1, None]]],
        ["struct", "x"],
        ["array", "int", "x"],
    ],
)
def test_type_from_data_refuses_bad_shapes(data: object) -> None:
    with pytest.raises(MalformedCommandError):
        type_from_data(data)


def test_type_from_data_bounds_depth() -> None:
    data: object = "int"
    for _ in range(limits.MAX_NESTING_DEPTH + 5):
        data = ["array", data]
    with pytest.raises(MalformedCommandError):
        type_from_data(data)


def test_contains_type_looks_into_struct_fields_array_elements_and_map_keys_and_values() -> None:
    kinds = (M.VarcharType, M.CharType)
    assert not M.contains_type(M.parse_type("STRUCT<a: INT, b: ARRAY<MAP<INT, STRING>>>"), kinds)
    assert M.contains_type(M.parse_type("CHAR(3)"), M.CharType)
    assert M.contains_type(M.parse_type("STRUCT<a: INT, b: STRUCT<c: VARCHAR(2)>>"), kinds)
    assert M.contains_type(M.parse_type("ARRAY<CHAR(2)>"), M.CharType)
    assert M.contains_type(M.parse_type("MAP<CHAR(2), INT>"), M.CharType)
    assert M.contains_type(M.parse_type("MAP<INT, ARRAY<VARCHAR(4)>>"), kinds)
    assert not M.contains_type(M.parse_type("MAP<INT, ARRAY<VARCHAR(4)>>"), M.CharType)
    assert M.contains_type(M.parse_type("ARRAY<INT>"), M.ArrayType)
