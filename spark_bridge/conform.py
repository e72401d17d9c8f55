"""Make a batch's output DataFrame match the schema pinned for its table, or refuse clearly.

Rules (what a data engineer expects from Iceberg/Delta writers):
* columns are matched by name, case-insensitively as Spark's analyzer matches them (Java's
  equalsIgnoreCase, `metastore.java_case`: `straße` and `STRASSE` are two columns);
* a pinned column missing from the output is filled with NULL if nullable, with its DEFAULT if it
  has one, otherwise the write is refused;
* an output column the pinned schema does not have is refused (a schema change is a DDL, not a
  side effect of a write);
* a type that differs is cast only when the cast is a widening the evolution rules allow
  (int8→16→32→64, float→double, decimal precision up with the same scale, date→timestamp_ntz,
  varchar/char→string, NullType from a bare `lit(None)` to anything); anything else is refused;
  a struct is cast field by field by position (Spark's rule), so its fields must be the pinned
  ones in the pinned order, else it is refused (never a cast that swaps fields' values);
* a VARCHAR(n)/CHAR(n) column (STRING in the DataFrame) is checked row by row on the executors
  for values longer than n characters, as Spark checks a table write (trailing spaces beyond n
  are trimmed, as Spark does), and a CHAR(n) value shorter than n is padded with spaces to n,
  as Spark stores it;
* NOT NULL columns are checked row by row on the executors (`raise_error`), because Parquet
  writers do not enforce nullability;
* the result has exactly the pinned column order and carries each column's field id in the
  StructField metadata (`parquet.field.id`), so Spark writes Parquet field ids and a later read
  by field id survives renames.

Writers conform to the pinned version's *write* columns (`write_columns`): the public columns,
then the columns a schema change job holds write-only (metastore.jobs). Such a column is hidden
from readers, so outputs usually lack it and get it filled by the rules above: a column being
added is NOT NULL with its DEFAULT (every row written meanwhile carries the default, so the
backfill need not rewrite it), a column being dropped is nullable (NULL unless the output still
has it). Readers use the public columns only (`PinnedTable.struct`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from metastore.java_case import java_case_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

FIELD_ID_KEY = "parquet.field.id"
# StructField metadata Spark reads as the value of a column for rows that predate it.
EXISTS_DEFAULT_KEY = "EXISTS_DEFAULT"


class SchemaMismatchError(ValueError):
    """The output cannot be made to match the pinned schema. Nothing was written."""

    code = "SCHEMA_MISMATCH"


def spark_type(type_sql: str) -> DataType:
    """A metastore type string as a PySpark DataType, in pure Python.

    Not `StructType.fromDDL`: that needs a live SparkContext, which the data source's planning
    workers do not have. VARCHAR/CHAR become STRING, as Spark does for DataFrame schemas (they
    only constrain table writes, which the metastore's conform step handles by type rules)."""
    from pyspark.sql import types as T

    from metastore import types as M

    def conv(t: M.DataType) -> T.DataType:
        match t:
            case M.PrimitiveType(kind=kind):
                return {
                    M.Primitive.BOOLEAN: T.BooleanType(),
                    M.Primitive.TINYINT: T.ByteType(),
                    M.Primitive.SMALLINT: T.ShortType(),
                    M.Primitive.INT: T.IntegerType(),
                    M.Primitive.BIGINT: T.LongType(),
                    M.Primitive.FLOAT: T.FloatType(),
                    M.Primitive.DOUBLE: T.DoubleType(),
                    M.Primitive.STRING: T.StringType(),
                    M.Primitive.BINARY: T.BinaryType(),
                    M.Primitive.DATE: T.DateType(),
                    M.Primitive.TIMESTAMP: T.TimestampType(),
                    M.Primitive.TIMESTAMP_NTZ: T.TimestampNTZType(),
                }[kind]
            case M.DecimalType(precision=p, scale=s):
                return T.DecimalType(p, s)
            case M.VarcharType() | M.CharType():
                return T.StringType()
            case M.ArrayType(element=e):
                return T.ArrayType(conv(e), True)
            case M.MapType(key=k, value=v):
                return T.MapType(conv(k), conv(v), True)
            case M.StructType(fields=fs):
                return T.StructType(
                    [
                        T.StructField(
                            f.name,
                            conv(f.type),
                            f.nullable,
                            {FIELD_ID_KEY: f.field_id} if f.field_id > 0 else {},
                        )
                        for f in fs
                    ]
                )
        raise TypeError(f"unknown metastore type {t!r}")

    return conv(M.parse_type(type_sql))


def write_columns(pinned: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The columns a writer pinned to this version writes: `write_schema` when the version has
    write-only columns (the protocol sends it only then), else the public `schema`. `pinned` is
    a schema answer of the metastore (`pin`, `schema_at`)."""
    shape = pinned.get("write_schema") or pinned["schema"]
    return list(shape["columns"])


def pinned_struct(columns: list[dict[str, Any]]) -> StructType:
    """The pinned schema (the protocol's `schema.columns`) as a Spark StructType with field ids."""
    from pyspark.sql.types import StructField, StructType

    fields = []
    for c in columns:
        dtype = spark_type(c["type"])
        meta: dict[str, Any] = {FIELD_ID_KEY: int(c["field_id"])}
        if c.get("comment"):
            meta["comment"] = c["comment"]
        if c.get("default") is not None:
            # Spark's Parquet reader fills this into rows of files that lack the column (files
            # written before ADD COLUMN ... DEFAULT): they read the default, not NULL.
            meta[EXISTS_DEFAULT_KEY] = c["default"]
        fields.append(StructField(c["name"], dtype, bool(c["nullable"]), meta))
    return StructType(fields)


def by_name_struct(struct: StructType) -> StructType:
    """`struct` without field ids, at every level: what Spark reads a file written without field
    ids with. With `spark.sql.parquet.fieldId.read.enabled`, Spark refuses such a file for a
    struct that has field ids (or, with `...fieldId.read.ignoreMissing`, reads every column of it
    as NULL); without them it matches columns by name (case-insensitively, unless
    `spark.sql.caseSensitive`), as the CLI's reader does for such a file
    (`metastore.client.parquet.matched_by_name`, `match_names`: Spark's own rule). Existence
    defaults and comments are kept."""
    from pyspark.sql import types as T

    def strip(t: DataType) -> DataType:
        if isinstance(t, T.StructType):
            return T.StructType(
                [
                    T.StructField(
                        f.name,
                        strip(f.dataType),
                        f.nullable,
                        {k: v for k, v in (f.metadata or {}).items() if k != FIELD_ID_KEY},
                    )
                    for f in t.fields
                ]
            )
        if isinstance(t, T.ArrayType):
            return T.ArrayType(strip(t.elementType), t.containsNull)
        if isinstance(t, T.MapType):
            return T.MapType(strip(t.keyType), strip(t.valueType), t.valueContainsNull)
        return t

    stripped = strip(struct)
    assert isinstance(stripped, T.StructType)
    return stripped


def _widening_ok(src: DataType, dst: DataType) -> bool:
    from pyspark.sql import types as T

    if src == dst:
        return True
    if isinstance(src, T.NullType):
        return True
    ints = [T.ByteType, T.ShortType, T.IntegerType, T.LongType]
    si = next((i for i, t in enumerate(ints) if isinstance(src, t)), None)
    di = next((i for i, t in enumerate(ints) if isinstance(dst, t)), None)
    if si is not None and di is not None:
        return si <= di
    if isinstance(src, T.FloatType) and isinstance(dst, T.DoubleType):
        return True
    if isinstance(src, T.DecimalType) and isinstance(dst, T.DecimalType):
        return src.scale == dst.scale and src.precision <= dst.precision
    if isinstance(src, T.DateType) and isinstance(dst, T.TimestampNTZType):
        return True
    if isinstance(src, T.VarcharType | T.CharType | T.StringType) and isinstance(
        dst, T.StringType | T.VarcharType
    ):
        return True
    if isinstance(src, T.ArrayType) and isinstance(dst, T.ArrayType):
        return _widening_ok(src.elementType, dst.elementType)
    if isinstance(src, T.MapType) and isinstance(dst, T.MapType):
        return _widening_ok(src.keyType, dst.keyType) and _widening_ok(src.valueType, dst.valueType)
    if isinstance(src, T.StructType) and isinstance(dst, T.StructType):
        # Spark casts a struct to a struct by position, not by name: the output's fields must
        # be the pinned ones in the pinned order (names case-insensitively), else the cast would
        # move values into other fields (struct<b, a> into struct<a, b>) or fail in Spark's
        # analyzer (a field missing; a nullable field into a NOT NULL one).
        if len(src.fields) != len(dst.fields):
            return False
        return all(
            java_case_key(s.name) == java_case_key(f.name)
            and (f.nullable or not s.nullable)
            and _widening_ok(s.dataType, f.dataType)
            for s, f in zip(src.fields, dst.fields, strict=True)
        )
    return False


# Projections built per (output schema, table, pinned columns). Building one costs ~100 py4j
# round trips (one per Column call); a streaming query repeats the same shapes every micro-batch,
# and unresolved Column expressions are reusable across DataFrames of the same session.
PROJECTION_CACHE_MAX = 64
_projections: dict[tuple[str, str, str], list[Any]] = {}
_projections_lock = threading.Lock()


def conform(df: DataFrame, table: str, columns: list[dict[str, Any]]) -> DataFrame:
    """Return `df` shaped exactly like the pinned `columns` of `table`, or raise."""
    import json

    schema = df.schema
    key = (schema.json(), table, json.dumps(columns, sort_keys=True, default=str))
    with _projections_lock:
        exprs = _projections.get(key)
    if exprs is None:
        exprs = _projection(schema, table, columns)
        # Concurrent batches share the cache: two evicting at once must not drop one entry
        # twice (KeyError).
        with _projections_lock:
            if key not in _projections and len(_projections) >= PROJECTION_CACHE_MAX:
                _projections.pop(next(iter(_projections)))
            _projections[key] = exprs
    return df.select(*exprs)


def _projection(schema: StructType, table: str, columns: list[dict[str, Any]]) -> list[Any]:
    from pyspark.sql import functions as F

    target = pinned_struct(columns)
    # Names as Spark's analyzer matches them (Java's equalsIgnoreCase), not casefold: `straße`
    # and `STRASSE` are two columns (siblings since apply version 7).
    present = {java_case_key(f.name): f for f in schema.fields}
    if len(present) < len(schema.fields):
        # Two output columns for one pinned column (`v` and `V`): which to write is ambiguous.
        names = [java_case_key(f.name) for f in schema.fields]
        twice = sorted({f.name for f in schema.fields if names.count(java_case_key(f.name)) > 1})
        raise SchemaMismatchError(
            f"output for {table} has a column more than once (names are matched "
            f"case-insensitively): {twice}"
        )
    wanted = {java_case_key(f.name) for f in target.fields}
    extra = [f.name for f in schema.fields if java_case_key(f.name) not in wanted]
    if extra:
        raise SchemaMismatchError(
            f"output for {table} has columns the pinned schema does not: {extra}; "
            f"pinned columns: {[f.name for f in target.fields]} (change the schema with DDL first)"
        )
    defaults = {java_case_key(c["name"]): c.get("default") for c in columns}
    exprs = []
    for f, c in zip(target.fields, columns, strict=True):
        src = present.get(java_case_key(f.name))
        if src is None:
            default = defaults.get(java_case_key(f.name))
            if default:
                col = F.expr(default).cast(f.dataType)
            elif f.nullable:
                col = F.lit(None).cast(f.dataType)
            else:
                raise SchemaMismatchError(
                    f"output for {table} lacks NOT NULL column {f.name!r}, which has no default"
                )
        else:
            if not _widening_ok(src.dataType, f.dataType):
                raise SchemaMismatchError(
                    f"column {f.name!r} of {table}: output type {src.dataType.simpleString()} "
                    f"cannot be widened to the pinned {f.dataType.simpleString()}"
                    + (
                        " (struct fields are matched by position: the pinned fields, in order)"
                        if "struct<" in src.dataType.simpleString()
                        else ""
                    )
                )
            # Quoted whole, embedded backquotes doubled: a name may hold dots and backquotes.
            col = F.col("`" + src.name.replace("`", "``") + "`")
            if src.dataType != f.dataType:
                col = col.cast(f.dataType)
        # VARCHAR(n)/CHAR(n) are STRING here (`spark_type`): their length limit is checked per
        # row, as Spark checks it on a table write, instead of committing a longer value. Spark
        # trims trailing spaces beyond n ('ab   ' is stored 'ab ' in a VARCHAR(3), measured
        # with pyspark 4) and refuses anything else beyond n; rtrim trims spaces only.
        # CHAR(n) is then padded with spaces to n, as Spark stores it ('a' is 'a  ' in a
        # CHAR(3), a filled DEFAULT too; NULL stays NULL); VARCHAR(n) is not padded.
        length = char_length(str(c["type"]))
        if length is not None:
            kept = F.substring(col, 1, length)
            if is_char(str(c["type"])):
                kept = F.rpad(kept, length, " ")
            col = F.when(
                F.length(F.rtrim(col)) > length,
                F.raise_error(
                    F.lit(f"a value longer than {length} characters in {table}.{f.name}")
                ),
            ).otherwise(kept)
        # NOT NULL is checked per row, unless the output column cannot hold NULL anyway.
        if not f.nullable and (src is None or src.nullable):
            col = F.when(
                col.isNull(), F.raise_error(F.lit(f"NULL in NOT NULL column {table}.{f.name}"))
            ).otherwise(col)
        exprs.append(col.alias(f.name, metadata=f.metadata))
    return exprs


def char_length(type_sql: str) -> int | None:
    """The length limit of a VARCHAR(n) or CHAR(n) column type, else None."""
    from metastore import types as M

    t = M.parse_type(type_sql)
    if isinstance(t, M.VarcharType | M.CharType):
        return int(t.length)
    return None


def is_char(type_sql: str) -> bool:
    """Whether a column type is CHAR(n), whose values Spark pads with spaces to n."""
    from metastore import types as M

    return isinstance(M.parse_type(type_sql), M.CharType)


def pad_chars_on_read(df: DataFrame, columns: list[dict[str, Any]]) -> DataFrame:
    """`df` (a read of `columns`) with Spark's read-side CHAR padding: a CHAR(n) value shorter
    than n reads padded to n with spaces (spark.sql.readSideCharPadding, on by default); longer
    ones and NULL as they are. The bridge reads CHAR as STRING (`spark_type`), so Spark does not
    pad them itself; the CLI's and the data source's reader do (metastore.client.parquet): all
    readers give the same value, also for rows older than a CHAR column (its DEFAULT) and for
    values written unpadded before the writers padded. Top-level columns only."""
    from pyspark.sql import functions as F

    lengths = {
        str(c["name"]): char_length(str(c["type"])) for c in columns if is_char(str(c["type"]))
    }
    if not lengths:
        return df
    exprs = []
    for field in df.schema.fields:
        col = F.col("`" + field.name.replace("`", "``") + "`")
        length = lengths.get(field.name)
        if length is not None:
            col = F.when(F.length(col) < length, F.rpad(col, length, " ")).otherwise(col)
        exprs.append(col.alias(field.name, metadata=field.metadata))
    return df.select(*exprs)
