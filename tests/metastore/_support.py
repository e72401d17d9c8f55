"""Shared helpers for the metastore tests: deterministic Hypothesis settings and strategies."""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

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
