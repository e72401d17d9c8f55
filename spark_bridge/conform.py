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
* a VARCHAR(n)/CHAR(n) value (STRING in the DataFrame), at the top level or inside a struct,
  array or map (keys too), is checked row by row on the executors for values longer than n
  characters, as Spark checks a table write (trailing spaces beyond n are trimmed, as Spark
  does; a longer value fails the job, which the bridge reports as ValueTooLongError naming
  the field's path), and a CHAR(n) value shorter than n is padded with spaces to n, as Spark
  stores it;
  two keys of one map made equal so ('a' and 'a ' in a MAP<CHAR(3), INT>) fail the job, which
  the bridge reports as DuplicateMapKeyError naming the map's path (Spark's table write fails
  with DUPLICATED_MAP_KEY), unless the session's mapKeyDedupPolicy is LAST_WIN (the last kept);
* NOT NULL columns and NOT NULL struct fields (inside arrays and maps too) are checked row by
  row on the executors (`raise_error`), because Parquet writers do not enforce nullability. As
  Spark's own table writes, output merely declared nullable is accepted for them (a column or
  field of a join, a file read, `createDataFrame`); a NULL actually reaching one fails the job,
  which the bridge reports as NotNullViolationError naming the field's path (`s.a`,
  `l.element.x`, `m.value.y`). A NULL struct (array, map) holds no NULL field: only the fields
  of a struct that is there are checked, as Spark checks them;
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metastore.java_case import java_case_key

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructField, StructType

    from metastore import types as M
    from metastore.errors import DuplicateMapKeyError, ValueTooLongError

FIELD_ID_KEY = "parquet.field.id"
# StructField metadata Spark reads as the value of a column for rows that predate it.
EXISTS_DEFAULT_KEY = "EXISTS_DEFAULT"


class SchemaMismatchError(ValueError):
    """The output cannot be made to match the pinned schema. Nothing was written."""

    code = "SCHEMA_MISMATCH"


class NotNullViolationError(SchemaMismatchError):
    """A row carried NULL into a NOT NULL column or NOT NULL nested field of `table`:
    `field_path` names it (`id`, `s.a`, `l.element.x`, `m.value.y`, as Spark names nested
    fields). Found by the write's Spark job (or a data source task), which then failed: nothing
    of the batch (append) commits."""

    code = "NOT_NULL_VIOLATION"

    def __init__(self, message: str, *, table: str, field_path: str) -> None:
        super().__init__(message)
        self.table = table
        self.field_path = field_path


def null_message(table: str, path: str, *, top_level: bool) -> str:
    """What the executors raise for a NULL in the NOT NULL column or field `path` of `table`
    (`not_null_violation` finds the path in it again)."""
    if top_level:
        return f"NULL in NOT NULL column {table}.{path}"
    return f"NULL in NOT NULL field {table}.{path}"


def not_null_paths(columns: list[dict[str, Any]]) -> list[str]:
    """The paths of the NOT NULL columns and NOT NULL nested fields of `columns`, as
    `null_message` names them: the column's name, then `.field`, `.element`, `.key`, `.value`
    down to the field."""
    return [path for path, _, required in _typed_paths(columns) if required]


def not_null_violation(
    error: BaseException, table: str, columns: list[dict[str, Any]]
) -> NotNullViolationError | None:
    """The NotNullViolationError a failed write of `table` (conformed to `columns`) reports,
    when its Spark job failed at a NOT NULL check of `conform`; else None. The path is the
    longest of the table's NOT NULL paths the message names (a name may hold dots)."""
    text = str(error)
    named = [
        (path, top_level)
        for path in not_null_paths(columns)
        for top_level in (True, False)
        if null_message(table, path, top_level=top_level) in text
    ]
    if not named:
        return None
    path, top_level = max(named, key=lambda found: len(found[0]))
    return NotNullViolationError(
        f"{null_message(table, path, top_level=top_level)}: a row of the output carries NULL "
        "there; nothing was committed (Spark's table writes fail the same way: NULL value "
        "appeared in non-nullable field)",
        table=table,
        field_path=path,
    )


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
        # analyzer (a field missing). A nullable field fits a NOT NULL one: its values are
        # checked per row (`_null_checks`), as Spark's table writes check them.
        if len(src.fields) != len(dst.fields):
            return False
        return all(
            java_case_key(s.name) == java_case_key(f.name) and _widening_ok(s.dataType, f.dataType)
            for s, f in zip(src.fields, dst.fields, strict=True)
        )
    return False


# Projections built per (output schema, table, pinned columns). Building one costs ~100 py4j
# round trips (one per Column call); a streaming query repeats the same shapes every micro-batch,
# and unresolved Column expressions are reusable across DataFrames of the same session.
PROJECTION_CACHE_MAX = 64
_projections: dict[tuple[str, str, str, bool], list[Any]] = {}
_projections_lock = threading.Lock()


def conform(df: DataFrame, table: str, columns: list[dict[str, Any]]) -> DataFrame:
    """Return `df` shaped exactly like the pinned `columns` of `table`, or raise."""
    import json

    schema = df.schema
    # Distinct map keys equal once padded ('a' and 'a ' in a MAP<CHAR(3), ...>) are refused
    # as Spark's table write refuses them (DUPLICATED_MAP_KEY), unless the session keeps the
    # last of them (mapKeyDedupPolicy LAST_WIN), as Spark then does.
    refuse_equal_keys = _map_key_dedup_policy(df) != "LAST_WIN"
    key = (
        schema.json(),
        table,
        json.dumps(columns, sort_keys=True, default=str),
        refuse_equal_keys,
    )
    with _projections_lock:
        exprs = _projections.get(key)
    if exprs is None:
        exprs = _projection(schema, table, columns, refuse_equal_keys=refuse_equal_keys)
        # Concurrent batches share the cache: two evicting at once must not drop one entry
        # twice (KeyError).
        with _projections_lock:
            if key not in _projections and len(_projections) >= PROJECTION_CACHE_MAX:
                _projections.pop(next(iter(_projections)))
            _projections[key] = exprs
    return df.select(*exprs)


@dataclass(frozen=True)
class ConformedColumn:
    """How one pinned column of a write is made from the output (`conform_plan`)."""

    # The pinned column as a Spark field (VARCHAR/CHAR as STRING, its field id in the metadata).
    pinned: StructField
    # Its wire form (the protocol's `schema.columns` entry).
    column: dict[str, Any]
    # The output's column it is made from (cast to `pinned` when its type differs, a widening)
    # and that column's index in the output; None: the output lacks it, so it is filled.
    source: StructField | None
    source_index: int | None
    # The DEFAULT (SQL text) a missing column is filled with; None: NULL.
    default: str | None


def conform_plan(
    schema: StructType, table: str, columns: list[dict[str, Any]]
) -> list[ConformedColumn]:
    """How an output of `schema` is conformed to the pinned `columns` of `table` (the rules of
    the module docstring), one entry per pinned column in the pinned order; SchemaMismatchError
    naming the column when it cannot be. Pure Python (no Spark session): the bridge builds its
    Spark projection from it (`conform`), the data source's writer checks a DataFrame with it
    where the write is planned and conforms each batch of rows with pyarrow by it."""
    target = pinned_struct(columns)
    # Names as Spark's analyzer matches them (Java's equalsIgnoreCase), not casefold: `straße`
    # and `STRASSE` are two columns (siblings since apply version 7).
    present = {java_case_key(f.name): (i, f) for i, f in enumerate(schema.fields)}
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
    plan = []
    for f, c in zip(target.fields, columns, strict=True):
        found = present.get(java_case_key(f.name))
        default = str(c["default"]) if c.get("default") else None
        if found is None:
            if default is None and not f.nullable:
                raise SchemaMismatchError(
                    f"output for {table} lacks NOT NULL column {f.name!r}, which has no default"
                )
            plan.append(ConformedColumn(f, c, None, None, default))
            continue
        index, src = found
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
        plan.append(ConformedColumn(f, c, src, index, None))
    return plan


def _projection(
    schema: StructType, table: str, columns: list[dict[str, Any]], *, refuse_equal_keys: bool
) -> list[Any]:
    from pyspark.sql import functions as F

    from metastore import types as M

    exprs = []
    for step in conform_plan(schema, table, columns):
        f, c, src = step.pinned, step.column, step.source
        if src is None:
            if step.default is not None:
                col = F.expr(step.default).cast(_nullable_as(None, f.dataType))
            else:
                col = F.lit(None).cast(f.dataType)
        else:
            # Quoted whole, embedded backquotes doubled: a name may hold dots and backquotes.
            col = F.col(_quoted(src.name))
            if src.dataType != f.dataType:
                # Nested fields keep the output's nullability where it is wider: Spark's cast
                # refuses a nullable field into a NOT NULL one, whose values are checked below.
                col = col.cast(_nullable_as(src.dataType, f.dataType))
        pinned_type = M.parse_type(str(c["type"]))
        # VARCHAR(n)/CHAR(n) are STRING here (`spark_type`): their length limit is checked per
        # row, as Spark checks it on a table write, instead of committing a longer value. Spark
        # trims trailing spaces beyond n ('ab   ' is stored 'ab ' in a VARCHAR(3), measured
        # with pyspark 4) and refuses anything else beyond n; rtrim trims spaces only.
        # CHAR(n) is then padded with spaces to n, as Spark stores it ('a' is 'a  ' in a
        # CHAR(3), a filled DEFAULT too; NULL stays NULL); VARCHAR(n) is not padded. The same
        # inside structs, arrays and maps (keys too), as Spark's writes do (pyspark 4.3).
        col = _map_strings(
            col,
            pinned_type,
            _write_side(table),
            f.name,
            equal_keys_of=table if refuse_equal_keys else None,
        )
        # NOT NULL nested fields, where the output's field can hold NULL (a filled DEFAULT is
        # checked whole; a filled NULL holds no field).
        checks = _null_checks(None if src is None else src.dataType, pinned_type, f.name)
        if src is None and step.default is None:
            checks = []
        if checks:
            col = _fail_when(
                col, [(p, null_message(table, path, top_level=False)) for p, path in checks]
            )
        # NOT NULL is checked per row, unless the output column cannot hold NULL anyway.
        if not f.nullable and (src is None or src.nullable):
            col = F.when(
                col.isNull(),
                F.raise_error(F.lit(null_message(table, f.name, top_level=True))),
            ).otherwise(col)
        exprs.append(col.alias(f.name, metadata=f.metadata))
    return exprs


def _quoted(name: str) -> str:
    """`name` as a Spark column reference (or `withField` name): quoted whole, embedded
    backquotes doubled, so dots and backquotes in it stay part of the name."""
    return "`" + name.replace("`", "``") + "`"


def _nullable_as(src: DataType | None, dst: DataType) -> DataType:
    """`dst` with each nested struct field nullable where the output's field (`src`, matched
    by position as Spark's cast matches it; None: unknown, so every one) is: the type conform
    casts the output to. Spark refuses to cast a nullable field into a NOT NULL one; conform
    checks those values per row instead (`_null_checks`), as Spark's table writes do. Where the
    output's field is NOT NULL too, the pinned nullability is kept."""
    from pyspark.sql import types as T

    if isinstance(dst, T.StructType):
        fields = src.fields if isinstance(src, T.StructType) else [None] * len(dst.fields)
        return T.StructType(
            [
                T.StructField(
                    f.name,
                    _nullable_as(None if s is None else s.dataType, f.dataType),
                    f.nullable or s is None or s.nullable,
                    f.metadata,
                )
                for s, f in zip(fields, dst.fields, strict=True)
            ]
        )
    if isinstance(dst, T.ArrayType):
        element = src.elementType if isinstance(src, T.ArrayType) else None
        return T.ArrayType(_nullable_as(element, dst.elementType), True)
    if isinstance(dst, T.MapType):
        key = src.keyType if isinstance(src, T.MapType) else None
        value = src.valueType if isinstance(src, T.MapType) else None
        return T.MapType(_nullable_as(key, dst.keyType), _nullable_as(value, dst.valueType), True)
    return dst


def _has_strings_to_map(t: Any) -> bool:
    """Whether the metastore type `t` holds a VARCHAR(n) or CHAR(n) anywhere."""
    from metastore import types as M

    return M.contains_type(t, (M.VarcharType, M.CharType))


def _map_strings(
    col: Column,
    t: Any,
    leaf: Callable[[Column, Any, str], Column],
    path: str,
    *,
    equal_keys_of: str | None = None,
) -> Column:
    """`col` (of the metastore type `t`, its pinned field names) with `leaf(value, type, path)`
    applied to each VARCHAR(n)/CHAR(n) value in it, at the top level or inside structs
    (`withField`: a NULL struct stays NULL), arrays (`transform`) and maps (their keys and
    values `transform`ed, then `map_from_arrays`, Spark's own write-side rebuild of a map):
    Spark expressions, no Python on the row path. `col` itself when `t` holds none. Paths as
    `not_null_paths` names them. With `equal_keys_of` (the table's name), a map two of whose
    keys are equal after `leaf` fails the job (`equal_keys_message`); without it, the session's
    mapKeyDedupPolicy decides (`map_from_arrays`: the last one kept under LAST_WIN)."""
    from pyspark.sql import functions as F

    from metastore import types as M

    if not _has_strings_to_map(t):
        return col
    match t:
        case M.VarcharType() | M.CharType():
            return leaf(col, t, path)
        case M.StructType(fields=fs):
            out = col
            for f in fs:
                if _has_strings_to_map(f.type):
                    inner = _map_strings(
                        col.getField(f.name),
                        f.type,
                        leaf,
                        f"{path}.{f.name}",
                        equal_keys_of=equal_keys_of,
                    )
                    out = out.withField(_quoted(f.name), inner)
            return out
        case M.ArrayType(element=e):
            return F.transform(
                col,
                lambda x: _map_strings(x, e, leaf, f"{path}.element", equal_keys_of=equal_keys_of),
            )
        case M.MapType(key=k, value=v):
            if not _has_strings_to_map(k):
                return F.transform_values(
                    col,
                    lambda _, value: _map_strings(
                        value, v, leaf, f"{path}.value", equal_keys_of=equal_keys_of
                    ),
                )
            keys = F.transform(
                F.map_keys(col),
                lambda key: _map_strings(key, k, leaf, f"{path}.key", equal_keys_of=equal_keys_of),
            )
            values = F.map_values(col)
            if _has_strings_to_map(v):
                values = F.transform(
                    values,
                    lambda value: _map_strings(
                        value, v, leaf, f"{path}.value", equal_keys_of=equal_keys_of
                    ),
                )
            # Spark's own write rebuilds a CHAR-keyed map the same way (MapFromArrays), so a
            # row whose keys collide once padded meets the session's mapKeyDedupPolicy here.
            rebuilt = F.map_from_arrays(keys, values)
            if equal_keys_of is None:
                return rebuilt
            # The first key equal to an earlier one (array_position finds the earliest).
            repeated = F.filter(keys, lambda key, i: F.array_position(keys, key) != i + 1)
            message = F.concat(
                F.lit(equal_keys_message(equal_keys_of, path, k.to_sql()) + " '"),
                F.element_at(repeated, 1).cast("string"),
                F.lit("'"),
            )
            return F.when(
                F.size(F.array_distinct(keys)) < F.size(keys), F.raise_error(message)
            ).otherwise(rebuilt)
    return col


def _map_key_dedup_policy(df: DataFrame) -> str:
    """The session's `spark.sql.mapKeyDedupPolicy` (EXCEPTION by default, or LAST_WIN)."""
    return str(df.sparkSession.conf.get("spark.sql.mapKeyDedupPolicy", "EXCEPTION")).upper()


def equal_keys_message(table: str, path: str, key_type: str) -> str:
    """What a write raises for a map at `path` of `table` two of whose keys are equal once
    conformed to their key type (CHAR(n) padded to n, spaces beyond a VARCHAR(n) trimmed:
    `duplicate_map_key` finds the path in it again); the key follows, quoted."""
    return (
        f"two keys of the map {table}.{path} are equal once padded or trimmed to their "
        f"{key_type} (Spark refuses such a map: DUPLICATED_MAP_KEY):"
    )


def _typed_paths(columns: list[dict[str, Any]]) -> Iterator[tuple[str, M.DataType, bool]]:
    """(path, type, declared NOT NULL) of every type in `columns` at any depth, each column's
    own first, with paths as Spark names nested fields (`s.a`, `l.element`, `m.key`,
    `m.value.c`). NOT NULL is what a column or a struct field declares; elements, keys and
    values say False (their nullability is not a NOT NULL constraint of the table)."""
    from metastore import types as M

    def walk(t: M.DataType, path: str, required: bool) -> Iterator[tuple[str, M.DataType, bool]]:
        yield path, t, required
        match t:
            case M.StructType(fields=fs):
                for f in fs:
                    yield from walk(f.type, f"{path}.{f.name}", not f.nullable)
            case M.ArrayType(element=e):
                yield from walk(e, f"{path}.element", False)
            case M.MapType(key=k, value=v):
                yield from walk(k, f"{path}.key", False)
                yield from walk(v, f"{path}.value", False)

    for c in columns:
        yield from walk(M.parse_type(str(c["type"])), str(c["name"]), not c["nullable"])


def string_keyed_map_paths(columns: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(path, key type) of each map in `columns` whose key holds a CHAR(n) or VARCHAR(n), at
    any depth, as `equal_keys_message` names them."""
    from metastore import types as M

    return [
        (path, t.key.to_sql())
        for path, t, _ in _typed_paths(columns)
        if isinstance(t, M.MapType) and _has_strings_to_map(t.key)
    ]


def duplicate_map_key(
    error: BaseException, table: str, columns: list[dict[str, Any]]
) -> DuplicateMapKeyError | None:
    """The DuplicateMapKeyError a failed write of `table` (conformed to `columns`) reports, when
    its Spark job failed at conform's equal-keys check; else None. The path is the longest of
    the table's CHAR/VARCHAR-keyed map paths the message names."""
    text = str(error)
    named = [
        (path, key_type, text.index(marker) + len(marker))
        for path, key_type in string_keyed_map_paths(columns)
        if (marker := equal_keys_message(table, path, key_type)) in text
    ]
    if not named:
        return None
    path, key_type, end = max(named, key=lambda found: len(found[0]))
    rest = text[end:]
    key: str | None = None
    if rest.startswith(" '") and "'" in rest[2:]:
        key = rest[2:].split("'", 1)[0]
    return equal_map_keys_error(table, path, key_type, key)


def equal_map_keys_error(
    table: str, path: str, key_type: str, key: str | None
) -> DuplicateMapKeyError:
    """The typed error of a write (the bridge's, the data source's) refusing a map at `path`
    of `table` two of whose keys are equal once conformed to `key_type` (`key`: as stored)."""
    from metastore.errors import DuplicateMapKeyError

    shown = "" if key is None else f" ({key!r})"
    return DuplicateMapKeyError(
        f"two keys of the map {table}.{path} are equal once padded or trimmed to their "
        f"{key_type}{shown}: nothing was committed (Spark's own table write refuses it as well: "
        "DUPLICATED_MAP_KEY; with spark.sql.mapKeyDedupPolicy=LAST_WIN the last one is kept)",
        details={"table": table, "field_path": path, "key": key},
    )


def too_long_message(table: str, path: str, length: int) -> str:
    """What a write raises for a value of `table` at `path` longer than its VARCHAR(n) or
    CHAR(n), `length` = n (`value_too_long` finds the path in it again)."""
    return f"a value longer than {length} characters in {table}.{path}"


def length_limited_paths(columns: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(path, n) of each VARCHAR(n) or CHAR(n) in `columns`, at any depth, as
    `too_long_message` names them (`_map_strings`' paths)."""
    from metastore import types as M

    return [
        (path, int(t.length))
        for path, t, _ in _typed_paths(columns)
        if isinstance(t, M.VarcharType | M.CharType)
    ]


def value_too_long_error(
    table: str, path: str, length: int, *, longest: int | None = None
) -> ValueTooLongError:
    """The typed error of a write (the bridge's, the data source's) refusing a value of
    `table` at `path` longer than its VARCHAR(n)/CHAR(n) (`longest`: its length, when known)."""
    from metastore.errors import ValueTooLongError

    measured = "" if longest is None else f" ({longest} characters before its trailing spaces)"
    return ValueTooLongError(
        f"{too_long_message(table, path, length)}{measured}: nothing was committed (Spark's "
        "own table write refuses it as well)",
        details={"table": table, "field_path": path, "length": length},
    )


def value_too_long(
    error: BaseException, table: str, columns: list[dict[str, Any]]
) -> ValueTooLongError | None:
    """The ValueTooLongError a failed write of `table` (conformed to `columns`) reports, when
    its Spark job failed at conform's length check; else None. The path is the longest of the
    table's VARCHAR/CHAR paths the message names (`code` is not taken for `code2`)."""
    text = str(error)
    named = [
        (path, length)
        for path, length in length_limited_paths(columns)
        if too_long_message(table, path, length) in text
    ]
    if not named:
        return None
    path, length = max(named, key=lambda found: len(found[0]))
    return value_too_long_error(table, path, length)


def _write_side(table: str) -> Callable[[Column, Any, str], Column]:
    """The write-side rule for one VARCHAR(n)/CHAR(n) value (Spark's): beyond n after trimming
    trailing spaces, the job fails naming `table` and the path; else trimmed to n, and a CHAR(n)
    padded to n with spaces."""
    from pyspark.sql import functions as F

    from metastore import types as M

    def leaf(value: Column, t: Any, path: str) -> Column:
        length = int(t.length)
        kept = F.substring(value, 1, length)
        if isinstance(t, M.CharType):
            kept = F.rpad(kept, length, " ")
        return F.when(
            F.length(F.rtrim(value)) > length,
            F.raise_error(F.lit(too_long_message(table, path, length))),
        ).otherwise(kept)

    return leaf


def _read_side(value: Column, t: Any, path: str) -> Column:
    """Spark's read-side padding of one value: a CHAR(n) value shorter than n padded to n with
    spaces, longer ones as they are; VARCHAR as it is."""
    from pyspark.sql import functions as F

    from metastore import types as M

    if not isinstance(t, M.CharType):
        return value
    length = int(t.length)
    return F.when(F.length(value) < length, F.rpad(value, length, " ")).otherwise(value)


def _null_checks(
    src: DataType | None, t: Any, path: str
) -> list[tuple[Callable[[Column], Column], str]]:
    """The NOT NULL nested fields of the metastore type `t` (a column's, at `path`) the output
    (`src`, its Spark type; None: unknown) may carry NULL into: (a predicate on the column,
    true for a row carrying NULL there; the field's path). Only a field of a struct that is
    there counts (a NULL struct, array element or map value holds no field, as Spark checks);
    fields within arrays and maps are looked for with `exists`."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from metastore import types as M

    found: list[tuple[Callable[[Column], Column], str]] = []
    match t:
        case M.StructType(fields=fs):
            sources = src.fields if isinstance(src, T.StructType) else [None] * len(fs)
            for f, s in zip(fs, sources, strict=True):
                if not f.nullable and (s is None or s.nullable):
                    found.append((_field_is_null(f.name), f"{path}.{f.name}"))
                inner_src = None if s is None else s.dataType
                for inner, inner_path in _null_checks(inner_src, f.type, f"{path}.{f.name}"):
                    found.append((_in_field(f.name, inner), inner_path))
        case M.ArrayType(element=e):
            element = src.elementType if isinstance(src, T.ArrayType) else None
            for inner, inner_path in _null_checks(element, e, f"{path}.element"):
                found.append((_in_any(lambda c: c, inner), inner_path))
        case M.MapType(key=k, value=v):
            key = src.keyType if isinstance(src, T.MapType) else None
            value = src.valueType if isinstance(src, T.MapType) else None
            for inner, inner_path in _null_checks(key, k, f"{path}.key"):
                found.append((_in_any(F.map_keys, inner), inner_path))
            for inner, inner_path in _null_checks(value, v, f"{path}.value"):
                found.append((_in_any(F.map_values, inner), inner_path))
    return found


def _field_is_null(name: str) -> Callable[[Column], Column]:
    """A predicate: the struct is there and its field `name` is NULL."""
    return lambda c: c.isNotNull() & c.getField(name).isNull()


def _in_field(name: str, inner: Callable[[Column], Column]) -> Callable[[Column], Column]:
    """`inner` applied to the struct's field `name` (NULL, hence false, for a NULL struct)."""
    return lambda c: inner(c.getField(name))


def _in_any(
    items: Callable[[Column], Column], inner: Callable[[Column], Column]
) -> Callable[[Column], Column]:
    """A predicate: `inner` is true for some item of the array `items(c)` (a map's keys or
    values, an array's elements)."""
    from pyspark.sql import functions as F

    return lambda c: F.exists(items(c), inner)


def _fail_when(col: Column, failures: list[tuple[Callable[[Column], Column], str]]) -> Column:
    """`col`, failing the job with the message of the first predicate true for a row."""
    from pyspark.sql import functions as F

    (first, message), *rest = failures
    checked = F.when(first(col), F.raise_error(F.lit(message)))
    for predicate, later in rest:
        checked = checked.when(predicate(col), F.raise_error(F.lit(later)))
    return checked.otherwise(col)


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
    values written unpadded before the writers padded. Inside structs, arrays and maps (keys
    too) as at the top level, as Spark reads them (pyspark 4.3)."""
    from pyspark.sql import functions as F

    from metastore import types as M

    types = {str(c["name"]): M.parse_type(str(c["type"])) for c in columns}
    if not any(_has_strings_to_map(t) for t in types.values()):
        return df
    exprs = []
    for field in df.schema.fields:
        col = F.col(_quoted(field.name))
        t = types.get(field.name)
        if t is not None:
            col = _map_strings(col, t, _read_side, field.name)
        exprs.append(col.alias(field.name, metadata=field.metadata))
    return df.select(*exprs)
