"""Schema evolution rules: every allowed change and every refused one, with its reason."""

from __future__ import annotations

import pytest

from metastore import limits
from metastore.errors import (
    ColumnAlreadyExistsError,
    ColumnNotFoundError,
    InvalidArgumentError,
    LimitExceededError,
    MetastoreError,
    UnsupportedSchemaChangeError,
)
from metastore.schema import (
    After,
    Column,
    First,
    Schema,
    add_column,
    alter_column_type,
    assign_schema_ids,
    drop_column,
    is_widening,
    move_column,
    rename_column,
    set_column_comment,
    set_nullability,
    validate_schema,
    widenings_of,
)
from metastore.types import (
    BIGINT,
    DATE,
    DOUBLE,
    FLOAT,
    INT,
    SMALLINT,
    STRING,
    TIMESTAMP,
    TIMESTAMP_NTZ,
    TINYINT,
    DataType,
    StructType,
    parse_type,
)


def make(sql: str) -> tuple[Schema, int]:
    """A schema with ids assigned from 'name type, ...' (types without commas at top level)."""
    columns = []
    for part in _split_top(sql):
        name, _, type_text = part.strip().partition(" ")
        nullable = not type_text.upper().endswith(" NOT NULL")
        type_text = type_text[: -len(" NOT NULL")] if not nullable else type_text
        columns.append(Column(name=name, type=parse_type(type_text), nullable=nullable))
    return assign_schema_ids(Schema(columns=tuple(columns)), 1)


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for c in text:
        depth += c == "<"
        depth -= c == ">"
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    return [*parts, current]


def names(schema: Schema) -> list[str]:
    return [c.name for c in schema.columns]


# --- ids ------------------------------------------------------------------------------------


def test_ids_are_assigned_depth_first_and_unique() -> None:
    schema, next_id = make("a INT, s STRUCT<x: INT, y: STRUCT<z: INT>>, b STRING")
    assert schema.field_ids() == [1, 2, 3, 4, 5, 6]
    assert next_id == 7
    validate_schema(schema, ids_assigned=True)


def test_add_uses_fresh_ids_and_drop_never_frees_them() -> None:
    schema, next_id = make("a INT, b INT")
    schema = drop_column(schema, path=("b",))
    schema, next_id2 = add_column(
        schema,
        parent=(),
        column=Column(name="b", type=parse_type("struct<x: int>")),
        position=None,
        next_field_id=next_id,
    )
    assert schema.field_ids() == [1, 3, 4]
    assert next_id2 == 5


# --- add ------------------------------------------------------------------------------------


def test_add_nullable_column_at_end_first_and_after() -> None:
    schema, nid = make("a INT, b INT")
    s1, nid = add_column(
        schema, parent=(), column=Column(name="x", type=INT), position=None, next_field_id=nid
    )
    s2, nid = add_column(
        s1, parent=(), column=Column(name="y", type=INT), position=First(), next_field_id=nid
    )
    s3, nid = add_column(
        s2,
        parent=(),
        column=Column(name="z", type=INT),
        position=After(column="A"),
        next_field_id=nid,
    )
    assert names(s3) == ["y", "a", "z", "b", "x"]


def test_add_not_null_needs_default() -> None:
    schema, nid = make("a INT")
    with pytest.raises(UnsupportedSchemaChangeError) as info:
        add_column(
            schema,
            parent=(),
            column=Column(name="x", type=INT, nullable=False),
            position=None,
            next_field_id=nid,
        )
    assert info.value.details["reason"] == "not null without default"
    s, _ = add_column(
        schema,
        parent=(),
        column=Column(name="x", type=INT, nullable=False, default_sql="0"),
        position=None,
        next_field_id=nid,
    )
    assert s.columns[-1].default_sql == "0"


def test_add_nested_field_into_struct() -> None:
    schema, nid = make("a INT, s STRUCT<x: INT, t: STRUCT<u: INT>>")
    s, nid2 = add_column(
        schema,
        parent=("S", "t"),
        column=Column(name="v", type=STRING, comment="new"),
        position=First(),
        next_field_id=nid,
    )
    inner = s.lookup(("s", "t"))
    assert isinstance(inner.type, StructType)
    assert [f.name for f in inner.type.fields] == ["v", "u"]
    assert inner.type.fields[0].field_id == nid
    assert s.lookup(("s", "t", "v")).comment == "new"
    assert nid2 == nid + 1


@pytest.mark.parametrize(
    ("parent", "column", "error", "reason"),
    [
        (
            ("s",),
            Column(name="v", type=INT, nullable=False),
            UnsupportedSchemaChangeError,
            "not null nested add",
        ),
        (
            ("s",),
            Column(name="v", type=INT, default_sql="1"),
            UnsupportedSchemaChangeError,
            "nested default",
        ),
        (("s",), Column(name="X", type=INT), ColumnAlreadyExistsError, None),
        ((), Column(name="A", type=INT), ColumnAlreadyExistsError, None),
        (("a",), Column(name="v", type=INT), ColumnNotFoundError, None),  # a is not a struct
        (("nope",), Column(name="v", type=INT), ColumnNotFoundError, None),
        ((), Column(name="", type=INT), InvalidArgumentError, None),
        ((), Column(name="x" * 129, type=INT), LimitExceededError, None),
    ],
)
def test_add_refusals(
    parent: tuple[str, ...], column: Column, error: type[MetastoreError], reason: str | None
) -> None:
    schema, nid = make("a INT, s STRUCT<x: INT>")
    with pytest.raises(error) as info:
        add_column(schema, parent=parent, column=column, position=None, next_field_id=nid)
    if reason is not None:
        assert info.value.details["reason"] == reason


def test_add_after_missing_sibling_is_refused() -> None:
    schema, nid = make("a INT")
    with pytest.raises(ColumnNotFoundError):
        add_column(
            schema,
            parent=(),
            column=Column(name="b", type=INT),
            position=After(column="zz"),
            next_field_id=nid,
        )


def test_column_limit_counts_nested_fields() -> None:
    fields = ", ".join(f"f{i}: INT" for i in range(limits.MAX_COLUMNS_PER_TABLE - 1))
    schema, _ = make(f"s STRUCT<{fields}>")
    assert schema.field_count() == limits.MAX_COLUMNS_PER_TABLE
    validate_schema(schema, ids_assigned=True)
    s2, _ = add_column(
        schema, parent=(), column=Column(name="x", type=INT), position=None, next_field_id=5000
    )
    with pytest.raises(LimitExceededError):
        validate_schema(s2, ids_assigned=True)


# --- rename / drop ----------------------------------------------------------------------------


def test_rename_keeps_id_and_allows_case_change() -> None:
    schema, _ = make("a INT, s STRUCT<x: INT>")
    s = rename_column(schema, path=("a",), new_name="A")
    assert names(s) == ["A", "s"]
    assert s.columns[0].field_id == 1


def test_a_nested_field_cannot_be_renamed() -> None:
    # Readers match nested fields by name: rows written before the rename would read as NULL.
    schema, _ = make("a INT, s STRUCT<x: INT>")
    with pytest.raises(UnsupportedSchemaChangeError, match="nested field") as raised:
        rename_column(schema, path=("S", "X"), new_name="y")
    assert raised.value.details["reason"] == "nested_rename"


def test_rename_refuses_clash_and_missing() -> None:
    schema, _ = make("a INT, b INT, s STRUCT<x: INT, y: INT>")
    with pytest.raises(ColumnAlreadyExistsError):
        rename_column(schema, path=("a",), new_name="B")
    with pytest.raises(ColumnNotFoundError):
        rename_column(schema, path=("zz",), new_name="q")


def test_drop_column_and_nested_field() -> None:
    schema, _ = make("a INT, s STRUCT<x: INT, y: INT>")
    s = drop_column(schema, path=("s", "x"))
    assert s.lookup(("s", "y")).field_id == 4
    s = drop_column(s, path=("A",))
    assert names(s) == ["s"]


def test_drop_refuses_last_column_and_last_field() -> None:
    schema, _ = make("a INT, s STRUCT<x: INT>")
    with pytest.raises(UnsupportedSchemaChangeError) as info:
        drop_column(schema, path=("s", "x"))
    assert info.value.details["reason"] == "last column"
    only, _ = make("a INT")
    with pytest.raises(UnsupportedSchemaChangeError):
        drop_column(only, path=("a",))
    with pytest.raises(ColumnNotFoundError):
        drop_column(schema, path=("nope",))


# --- types ------------------------------------------------------------------------------------

WIDENINGS: list[tuple[DataType, DataType]] = [
    (TINYINT, SMALLINT),
    (TINYINT, INT),
    (TINYINT, BIGINT),
    (SMALLINT, INT),
    (SMALLINT, BIGINT),
    (INT, BIGINT),
    (FLOAT, DOUBLE),
    (parse_type("decimal(10,2)"), parse_type("decimal(12,2)")),
    (DATE, TIMESTAMP_NTZ),
    (parse_type("varchar(5)"), parse_type("varchar(6)")),
    (parse_type("varchar(5)"), STRING),
]

REFUSED: list[tuple[DataType, DataType]] = [
    (BIGINT, INT),
    (INT, SMALLINT),
    (INT, DOUBLE),
    (INT, STRING),
    (DOUBLE, FLOAT),
    (FLOAT, parse_type("decimal(10,2)")),
    (parse_type("decimal(10,2)"), parse_type("decimal(12,3)")),
    (parse_type("decimal(10,2)"), parse_type("decimal(9,2)")),
    (DATE, TIMESTAMP),
    (TIMESTAMP, TIMESTAMP_NTZ),
    (parse_type("varchar(5)"), parse_type("varchar(4)")),
    (STRING, parse_type("varchar(5)")),
    (parse_type("char(5)"), STRING),
    (STRING, parse_type("binary")),
]


@pytest.mark.parametrize(("old", "new"), WIDENINGS)
def test_allowed_widenings(old: DataType, new: DataType) -> None:
    assert is_widening(old, new)
    schema, _ = assign_schema_ids(Schema(columns=(Column(name="c", type=old),)), 1)
    assert alter_column_type(schema, path=("c",), new_type=new).columns[0].type == new


@pytest.mark.parametrize(("old", "new"), REFUSED)
def test_refused_type_changes_list_what_is_allowed(old: DataType, new: DataType) -> None:
    assert not is_widening(old, new)
    schema, _ = assign_schema_ids(Schema(columns=(Column(name="c", type=old),)), 1)
    with pytest.raises(UnsupportedSchemaChangeError) as info:
        alter_column_type(schema, path=("c",), new_type=new)
    assert info.value.details["allowed"] == widenings_of(old)
    assert info.value.details["from"] == old.to_sql()


def test_widenings_of_lists() -> None:
    assert widenings_of(TINYINT) == ["SMALLINT", "INT", "BIGINT"]
    assert widenings_of(BIGINT) == []
    assert widenings_of(parse_type("varchar(3)")) == ["VARCHAR(n) with n > 3", "STRING"]
    assert widenings_of(parse_type("decimal(38,0)")) == []


def test_type_change_of_nested_field_and_complex_types() -> None:
    schema, _ = make("s STRUCT<x: INT>, a ARRAY<INT>")
    s = alter_column_type(schema, path=("s", "x"), new_type=BIGINT)
    assert s.lookup(("s", "x")).type == BIGINT
    assert s.lookup(("s", "x")).field_id == 2
    with pytest.raises(UnsupportedSchemaChangeError) as info:
        alter_column_type(schema, path=("a",), new_type=parse_type("array<bigint>"))
    assert info.value.details["reason"] == "complex type"
    assert alter_column_type(schema, path=("a",), new_type=parse_type("array<int>")) == schema


# --- nullability, comments, moves ---------------------------------------------------------------


def test_drop_not_null_allowed_set_not_null_refused() -> None:
    schema, _ = make("a INT NOT NULL, b INT")
    s = set_nullability(schema, path=("a",), nullable=True)
    assert s.columns[0].nullable
    assert set_nullability(schema, path=("a",), nullable=False) == schema  # already NOT NULL
    with pytest.raises(UnsupportedSchemaChangeError) as info:
        set_nullability(schema, path=("b",), nullable=False)
    assert info.value.details["reason"] == "set not null"


def test_set_and_drop_comment() -> None:
    schema, _ = make("a INT, s STRUCT<x: INT>")
    s = set_column_comment(schema, path=("s", "x"), comment="hello")
    assert s.lookup(("s", "x")).comment == "hello"
    assert set_column_comment(s, path=("s", "x"), comment=None) == schema
    with pytest.raises(LimitExceededError):
        set_column_comment(schema, path=("a",), comment="c" * (limits.MAX_COMMENT_CHARS + 1))


def test_move_first_after_and_nested() -> None:
    schema, _ = make("a INT, b INT, c INT, s STRUCT<x: INT, y: INT>")
    assert names(move_column(schema, path=("c",), position=First())) == ["c", "a", "b", "s"]
    assert names(move_column(schema, path=("a",), position=After(column="c"))) == [
        "b",
        "c",
        "a",
        "s",
    ]
    moved = move_column(schema, path=("s", "y"), position=First())
    inner = moved.lookup(("s",))
    assert isinstance(inner.type, StructType)
    assert [f.name for f in inner.type.fields] == ["y", "x"]
    with pytest.raises(InvalidArgumentError):
        move_column(schema, path=("a",), position=After(column="A"))
    with pytest.raises(ColumnNotFoundError):
        move_column(schema, path=("a",), position=After(column="x"))  # x is not a sibling


def test_spark_ddl_of_schema() -> None:
    schema = Schema(
        columns=(
            Column(name="id", type=BIGINT, nullable=False, default_sql="0"),
            Column(name="name", type=parse_type("varchar(10)"), comment="who"),
        )
    )
    assert schema.to_spark_ddl() == "`id` BIGINT NOT NULL, `name` STRING COMMENT 'who'"
    assert schema.to_sql() == "`id` BIGINT NOT NULL DEFAULT 0, `name` VARCHAR(10) COMMENT 'who'"
