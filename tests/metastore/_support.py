"""Shared helpers for the metastore tests: deterministic Hypothesis settings and strategies for
types and commands."""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from metastore.commands import (
    RESERVED_PROPERTY_KEYS,
    AddColumn,
    AlterColumnType,
    AlterTable,
    Command,
    CommitTxn,
    CreateNamespace,
    CreateTable,
    DataFile,
    DropColumn,
    DropNamespace,
    DropTable,
    InitCluster,
    MoveColumn,
    RenameColumn,
    SetColumnComment,
    SetNullability,
    SetTableProperties,
    TableChange,
    TableName,
    TableWrite,
    UnsetTableProperties,
    make_properties,
)
from metastore.schema import After, Column, First, Schema
from metastore.types import (
    BIGINT,
    BINARY,
    BOOLEAN,
    DATE,
    DOUBLE,
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
)

# sqlglot logs a warning each time it falls back to an opaque Command; the tests provoke that on
# purpose, so keep the output readable.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

# derandomize: the same examples on every run (tests MUST pass deterministically); no example
# database, so a run never depends on what an earlier run stored.
DETERMINISTIC = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------

PRIMITIVES: list[DataType] = [
    BOOLEAN,
    TINYINT,
    SMALLINT,
    INT,
    BIGINT,
    FLOAT,
    DOUBLE,
    STRING,
    BINARY,
    DATE,
    TIMESTAMP,
    TIMESTAMP_NTZ,
]

simple_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True)
# Any printable text: exercises backquoting (spaces, dots, backquotes, non-ASCII letters).
any_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12
)
comments = st.none() | st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=16
)

atomic_types: st.SearchStrategy[DataType] = st.one_of(
    st.sampled_from(PRIMITIVES),
    st.builds(
        lambda p, s: DecimalType(precision=p, scale=min(s, p)),
        st.integers(1, 38),
        st.integers(0, 38),
    ),
    st.builds(lambda n: VarcharType(length=n), st.integers(1, 10_000)),
    st.builds(lambda n: CharType(length=n), st.integers(1, 255)),
)


def data_types(names: st.SearchStrategy[str] = any_names) -> st.SearchStrategy[DataType]:
    def extend(children: st.SearchStrategy[DataType]) -> st.SearchStrategy[DataType]:
        fields = st.lists(
            st.builds(
                lambda n, t, nullable, c: StructField(name=n, type=t, nullable=nullable, comment=c),
                names,
                children,
                st.booleans(),
                comments,
            ),
            min_size=1,
            max_size=4,
            unique_by=lambda f: f.name.casefold(),
        )
        return st.one_of(
            st.builds(lambda e: ArrayType(element=e), children),
            st.builds(lambda k, v: MapType(key=k, value=v), children, children),
            st.builds(lambda fs: StructType(fields=tuple(fs)), fields),
        )

    return st.recursive(atomic_types, extend, max_leaves=8)


# --- commands ---------------------------------------------------------------------------------

object_names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
table_names = st.builds(lambda ns, t: TableName(namespace=ns, name=t), object_names, object_names)
property_keys = st.from_regex(r"[a-z][a-z0-9_.]{0,15}", fullmatch=True).filter(
    lambda k: k not in RESERVED_PROPERTY_KEYS
)
properties = st.dictionaries(property_keys, st.text(max_size=10), max_size=4).map(make_properties)
paths = st.lists(any_names, min_size=1, max_size=3).map(tuple)
positions = st.none() | st.just(First()) | st.builds(lambda n: After(column=n), any_names)
defaults = st.sampled_from(["0", "'x'", "CURRENT_DATE()", "-1.5"])


def columns(*, nested: bool = False) -> st.SearchStrategy[Column]:
    default = st.none() if nested else (st.none() | defaults)
    return st.builds(
        lambda n, t, nullable, c, d: Column(
            name=n, type=t, nullable=nullable, comment=c, default_sql=d
        ),
        any_names,
        data_types(),
        st.booleans(),
        comments,
        default,
    )


table_changes: st.SearchStrategy[TableChange] = st.one_of(
    st.builds(lambda c, pos: AddColumn(column=c, position=pos), columns(), positions),
    st.builds(
        lambda p, c, pos: AddColumn(parent=p, column=c, position=pos),
        paths,
        columns(nested=True),
        positions,
    ),
    st.builds(lambda p, n: RenameColumn(path=p, new_name=n), paths, any_names),
    st.builds(lambda p, e: DropColumn(path=p, if_exists=e), paths, st.booleans()),
    st.builds(lambda p, t: AlterColumnType(path=p, new_type=t), paths, atomic_types),
    st.builds(lambda p, n: SetNullability(path=p, nullable=n), paths, st.booleans()),
    st.builds(lambda p, c: SetColumnComment(path=p, comment=c), paths, comments),
    st.builds(
        lambda p, pos: MoveColumn(path=p, position=pos),
        paths,
        st.just(First()) | st.builds(lambda n: After(column=n), any_names),
    ),
    st.builds(
        lambda d: SetTableProperties(properties=make_properties(d)),
        st.dictionaries(property_keys, st.text(max_size=10), min_size=1, max_size=3),
    ),
    st.builds(
        lambda ks, e: UnsetTableProperties(keys=tuple(ks), if_exists=e),
        st.lists(property_keys, min_size=1, max_size=3),
        st.booleans(),
    ),
)

request_ids = st.text(alphabet="abcdef0123456789-", max_size=20)

locations = st.sampled_from(["", "/data/wh/ns.db/t", "s3://bucket/wh/t", "file:///tmp/x"])
file_paths = st.from_regex(r"(_txn/[a-z0-9-]{1,8}/)?part-[0-9]{1,4}\.parquet", fullmatch=True)
hlc_ts = st.integers(0, 2**64 - 1)
counts = st.integers(0, 2**63 - 1)


@st.composite
def table_writes(draw: st.DrawFn, table: TableName) -> TableWrite:
    paths = draw(st.lists(file_paths, unique=True, max_size=6))
    split = draw(st.integers(0, len(paths)))
    overwrite = draw(st.booleans())
    return TableWrite(
        table=table,
        schema_version=draw(st.integers(1, 10)),
        table_id=draw(st.integers(0, 50)),
        add=tuple(
            DataFile(path=p, size_bytes=draw(counts), row_count=draw(counts)) for p in paths[:split]
        ),
        remove=() if overwrite else tuple(paths[split:]),
        overwrite=overwrite,
    )


@st.composite
def commit_commands(draw: st.DrawFn) -> CommitTxn:
    """Statically valid CommitTxn commands (any state may still refuse them)."""
    tables = draw(st.lists(table_names, min_size=1, max_size=3, unique=True))
    reads = draw(st.lists(table_names, max_size=3, unique=True))
    mode = draw(st.sampled_from(["plain", "ts", "not_before"]))
    return CommitTxn(
        request_id=draw(request_ids),
        txn_id=draw(st.text(alphabet="abcdef0123456789:-", min_size=1, max_size=30)),
        writes=tuple(draw(table_writes(t)) for t in tables),
        ts=draw(hlc_ts) if mode == "ts" else None,
        not_before=draw(hlc_ts) if mode == "not_before" else None,
        read_ts=draw(hlc_ts) if reads else None,
        read_tables=tuple(reads),
    )


commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(
        lambda r, dd, cs: InitCluster(request_id=r, dd_ms=dd, cs_max_ms=min(cs, dd)),
        request_ids,
        st.integers(1, 60_000),
        st.integers(0, 60_000),
    ),
    st.builds(
        lambda r, ns, e, c, p: CreateNamespace(
            request_id=r, namespace=ns, if_not_exists=e, comment=c, properties=p
        ),
        request_ids,
        object_names,
        st.booleans(),
        comments,
        properties,
    ),
    st.builds(
        lambda r, ns, e, c: DropNamespace(request_id=r, namespace=ns, if_exists=e, cascade=c),
        request_ids,
        object_names,
        st.booleans(),
        st.booleans(),
    ),
    st.builds(
        lambda r, t, cols, e, c, p, loc: CreateTable(
            request_id=r,
            table=t,
            schema=Schema(columns=tuple(cols)),
            if_not_exists=e,
            comment=c,
            properties=p,
            location=loc,
        ),
        request_ids,
        table_names,
        st.lists(columns(), min_size=1, max_size=4, unique_by=lambda c: c.name.casefold()),
        st.booleans(),
        comments,
        properties,
        locations,
    ),
    st.builds(
        lambda r, t, e: DropTable(request_id=r, table=t, if_exists=e),
        request_ids,
        table_names,
        st.booleans(),
    ),
    st.builds(
        lambda r, t, cs: AlterTable(request_id=r, table=t, changes=tuple(cs)),
        request_ids,
        table_names,
        st.lists(table_changes, min_size=1, max_size=4),
    ),
    commit_commands(),
)

# Arbitrary msgpack-able values, for structured fuzzing of decoders.
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.floats(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
