"""sqlglot's parse of type names, memoized (installed by `metastore.ddl` on import).

sqlglot builds and compares types by name: its Spark dialect reads the literal `1Y` as a cast to
a type it builds from the text "TINYINT", and its generator checks every CAST it renders against
"json" and "float" (`DataType.is_type`), each time running its whole parser over the type name
(`DataType.from_str`, about 0.1 ms). Those sub-parses were most of the cost of a DDL statement
with many DEFAULT literals: one statement within MAX_STATEMENT_BYTES could take seconds of a
node's CPU. The parse of a type name is a pure function of the name and dialect, so it is done
once per name and a copy of the result handed out each time (callers may modify what they get:
sqlglot's generators do). What sqlglot returns, and so every stored DEFAULT text, is unchanged.

Only calls with the dialect named by text (or none) and no extra arguments are memoized; any
other goes to sqlglot as before. A sqlglot release without `DataType.from_str` is left as is
(slower, alike)."""

from __future__ import annotations

import functools
from typing import Any

from sqlglot import exp

_TYPE_NAMES_CACHED = 512  # distinct (name, dialect) pairs: type names, a few dozen in practice


def install() -> None:
    """Memoize `sqlglot.exp.DataType.from_str` (idempotent)."""
    data_type: Any = exp.DataType
    original = data_type.__dict__.get("from_str")
    if not isinstance(original, classmethod) or getattr(original, "_metastore_memoized", False):
        return
    parse = original.__func__

    @functools.lru_cache(maxsize=_TYPE_NAMES_CACHED)
    def parsed(cls: type, dtype: str, dialect: str | None, udt: bool) -> Any:
        return parse(cls, dtype, dialect, udt)

    def from_str(
        cls: type, /, dtype: str, dialect: Any = None, udt: bool = False, **kwargs: Any
    ) -> Any:
        named = dialect is None or isinstance(dialect, str)
        if kwargs or not named or not isinstance(dtype, str):
            return parse(cls, dtype, dialect, udt, **kwargs)
        return parsed(cls, dtype, dialect, udt).copy()

    memoized: Any = classmethod(from_str)
    memoized._metastore_memoized = True
    data_type.from_str = memoized
