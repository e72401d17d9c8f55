"""`Schema.to_sql()` (shown to people, not stored) reads back through `metastore.ddl` as the
same schema, whatever the names: SQL keywords (`select`, `from`, `not`) and names that need
quoting are backquoted everywhere, nested struct fields included."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from metastore.commands import CreateTable
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from metastore.schema import Column, Schema, validate_schema
from metastore.types import BIGINT, INT, STRING, DataType, parse_type
from tests.metastore._support import any_names, comments, data_types

_KEYWORDS = st.sampled_from(
    [
        "select",
        "from",
        "not",
        "null",
        "default",
        "comment",
        "struct",
        "int",
        "table",
        "AS",
        "order",
        "primary",
        "true",
        "interval",
        "timestamp",
        "a",
    ]
)
_NAMES = _KEYWORDS | any_names
# Canonical DEFAULT texts (as `metastore.ddl` stores them) for a few column types.
_DEFAULTS: dict[DataType, str] = {INT: "0", BIGINT: "-1", STRING: "'x'"}


@st.composite
def _schemas(draw: st.DrawFn) -> Schema:
    names = draw(st.lists(_NAMES, min_size=1, max_size=5, unique_by=str.casefold))
    columns = []
    for name in names:
        dtype = draw(data_types(_NAMES))
        default = _DEFAULTS.get(dtype) if draw(st.booleans()) else None
        columns.append(
            Column(
                name=name,
                type=dtype,
                nullable=draw(st.booleans()),
                comment=draw(comments),
                default_sql=default,
            )
        )
    return Schema(columns=tuple(columns))


@settings(max_examples=300, deadline=None)
@given(_schemas())
def test_to_sql_parses_back_to_the_same_schema(schema: Schema) -> None:
    try:
        validate_schema(schema, ids_assigned=False)
    except MetastoreError:
        assume(False)
    cmd = parse_ddl(f"CREATE TABLE ns.t ({schema.to_sql()})")
    assert isinstance(cmd, CreateTable)
    assert cmd.schema == schema


def test_keyword_names_are_backquoted() -> None:
    schema = Schema(
        columns=(
            Column(name="select", type=INT, nullable=False, default_sql="0"),
            Column(name="from", type=parse_type("struct<not: int, `a b`: string>")),
        )
    )
    assert schema.to_sql() == (
        "`select` INT NOT NULL DEFAULT 0, `from` STRUCT<`not`: INT, `a b`: STRING>"
    )
    cmd = parse_ddl(f"CREATE TABLE ns.t ({schema.to_sql()})")
    assert isinstance(cmd, CreateTable) and cmd.schema == schema
