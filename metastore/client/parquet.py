"""Rows of a table's committed Parquet files, read with pyarrow (no Spark): the one reader behind
`metastore table read` (the CLI) and `spark.read.format("metastore")` (the data source's tasks).

Key idea
    The metastore says which files make up a table at a timestamp (`files`) and which schema was
    in force then (`schema_at`: columns with field ids and Spark SQL types). This module reads
    exactly those files, in commit order, and shapes every batch like the pinned schema, the same
    way for every reader that does not run Spark SQL:
    * a column is found in a file by its Parquet field id (`PARQUET:field_id`), so a column
      renamed after the file was written still yields its data;
    * only a file written without any field ids is matched by name, case-insensitively as
      Spark's Parquet reader matches (`match_names`: Java's `toLowerCase(Locale.ROOT)`, a
      name two file columns match refused); a file with field ids on some columns only is
      matched by field id alone (`matched_by_name`, the rule the Spark bridge follows too);
    * a pinned column the file does not have (added later) reads as its DEFAULT (Spark's
      existence default, `metastore.client.defaults`), or NULL when it has none;
    * a column whose type was widened since (INT -> BIGINT, ...) is cast to the pinned type;
    * INT96 timestamps (Spark's default encoding of TIMESTAMP) are decoded in microseconds,
      Spark's unit, so its whole range (0001-01-01 to 9999-12-31) reads as Spark reads it;
    * a CHAR(n) value shorter than n (a file value or a DEFAULT) reads padded with spaces to n,
      as Spark reads it (`spark.sql.readSideCharPadding`, true by default): Spark's stored
      EXISTS_DEFAULT of `CHAR(3) DEFAULT 'a'` is 'a', which old rows read as 'a  '. Inside
      structs, lists and maps (keys too) as well, as Spark 4.3 reads them
      (`metastore.client.nested_values`).
    Nested fields (the protocol's type strings carry no nested field ids) are matched by name in
    every file, by `match_names` as Spark matches them, then cast as a whole.

Invariants
    * Only listed files are opened; directories are never listed, so files no commit references
      (an aborted batch's output) are never shown.
    * Only the matched columns are decoded, at most READ_BATCH_ROWS_MAX rows at a time, and
      reading stops as soon as the rows wanted are in hand: a `--limit` on a large table costs
      one batch, and a data source task holds one batch of its file in memory, not the file.
    * The result has exactly the pinned columns, in pinned order, with the pinned types.
    * Every pyarrow failure becomes a typed `DataReadError` naming the file.
    * No PySpark: the CLI reads tables on machines without a JVM.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from metastore import types as M
from metastore.client.defaults import DefaultNotEvaluableError, default_array
from metastore.client.java_lower import java_lower_root
from metastore.client.nested_values import map_strings, with_nested_nullability
from metastore.errors import AmbiguousFileColumnError, InvalidArgumentError, MetastoreError

# The key under which pyarrow exposes a Parquet column's field id (as Spark writes it).
FIELD_ID_KEY: Final = b"PARQUET:field_id"
# Rows decoded per step. A `--limit` below it decodes no more than the limit.
READ_BATCH_ROWS_MAX: Final = 8192
# Spark's s3a/s3n schemes are the same object store pyarrow calls s3.
_S3_ALIASES: Final = ("s3a://", "s3n://")


class DataReadError(Exception):
    """A committed table's data could not be read as pinned. Local to the reader (no wire code):
    the CLI maps `code` to its exit code, the data source lets Spark report it."""

    code: ClassVar[str] = "DATA_READ_FAILED"

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


class DataFileNotFoundError(DataReadError):
    """A file the metastore lists as committed is not at its location (deleted by hand, or the
    warehouse is not reachable from here)."""

    code = "DATA_FILE_NOT_FOUND"


class DataFileUnreadableError(DataReadError):
    """A committed file is not valid Parquet, or a column cannot be converted to its pinned
    type."""

    code = "DATA_FILE_UNREADABLE"


class AmbiguousColumnError(DataReadError):
    """A pinned column matches more than one column of a file without field ids by name
    (case-insensitively, as Spark's Parquet reader matches them: `match_names`). Spark
    refuses such a read, and so does this reader, rather than pick one of them. `column` is
    the pinned column, `matches` the file's columns it matches; `typed()` is the same failure
    as metastore.errors' AmbiguousFileColumnError (what the bridge and the data source raise).
    """

    code = "AMBIGUOUS_COLUMN"

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        column: str = "",
        matches: Sequence[str] = (),
    ) -> None:
        super().__init__(message, path=path)
        self.column = column
        self.matches = list(matches)

    def typed(self) -> AmbiguousFileColumnError:
        return AmbiguousFileColumnError(
            self.message,
            details={"path": self.path, "column": self.column, "matches": self.matches},
        )


class UnsupportedSchemaError(DataReadError):
    """The pinned schema has a type (or a DEFAULT) this reader cannot represent."""

    code = "UNSUPPORTED_SCHEMA"


@dataclass(frozen=True, slots=True, kw_only=True)
class PinnedColumn:
    """One column of the protocol's `schema.columns`, as the reader needs it."""

    field_id: int
    name: str
    type_sql: str
    nullable: bool
    default_sql: str | None = None  # rows of files written before the column existed read it

    @staticmethod
    def from_wire(column: Mapping[str, Any]) -> PinnedColumn:
        default = column.get("default")
        return PinnedColumn(
            field_id=int(column["field_id"]),
            name=str(column["name"]),
            type_sql=str(column["type"]),
            nullable=bool(column.get("nullable", True)),
            default_sql=str(default) if default is not None else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadResult:
    rows: pa.Table  # exactly the pinned columns; at most `limit` rows
    files_opened: int


# ---- types -----------------------------------------------------------------------------------

_PRIMITIVES: Final[Mapping[M.Primitive, pa.DataType]] = {
    M.Primitive.BOOLEAN: pa.bool_(),
    M.Primitive.TINYINT: pa.int8(),
    M.Primitive.SMALLINT: pa.int16(),
    M.Primitive.INT: pa.int32(),
    M.Primitive.BIGINT: pa.int64(),
    M.Primitive.FLOAT: pa.float32(),
    M.Primitive.DOUBLE: pa.float64(),
    M.Primitive.STRING: pa.string(),
    M.Primitive.BINARY: pa.binary(),
    M.Primitive.DATE: pa.date32(),
    # Spark's TIMESTAMP is an instant (shown in UTC here); TIMESTAMP_NTZ is a wall-clock time.
    M.Primitive.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    M.Primitive.TIMESTAMP_NTZ: pa.timestamp("us"),
}


def arrow_type(dtype: M.DataType) -> pa.DataType:
    """The Arrow type Spark's Arrow conversion uses for a metastore type (with TIMESTAMP in UTC,
    the zone Spark's Arrow batches carry instants in)."""
    match dtype:
        case M.PrimitiveType(kind=kind):
            return _PRIMITIVES[kind]
        case M.DecimalType(precision=precision, scale=scale):
            return pa.decimal128(precision, scale)
        case M.VarcharType() | M.CharType():
            return pa.string()  # Spark reads VARCHAR/CHAR columns as STRING
        case M.ArrayType(element=element):
            # Named as Spark's own Arrow conversion names it (the data source hands these
            # batches to Spark).
            return pa.list_(pa.field("element", arrow_type(element)))
        case M.MapType(key=key, value=value):
            return pa.map_(arrow_type(key), arrow_type(value))
        case M.StructType(fields=fields):
            return pa.struct(
                [pa.field(f.name, arrow_type(f.type), nullable=f.nullable) for f in fields]
            )
    raise UnsupportedSchemaError(f"no Arrow type for {dtype!r}")


def arrow_schema(columns: Sequence[PinnedColumn]) -> pa.Schema:
    fields = []
    for c in columns:
        try:
            dtype = M.parse_type(c.type_sql)
        except MetastoreError as exc:
            raise UnsupportedSchemaError(
                f"column {c.name!r} has a type this reader cannot parse: {exc.message}"
            ) from None
        fields.append(
            pa.field(
                c.name,
                arrow_type(dtype),
                nullable=c.nullable,
                metadata={FIELD_ID_KEY: str(c.field_id).encode()},
            )
        )
    return pa.schema(fields)


# ---- reading ---------------------------------------------------------------------------------


def read_rows(
    location: str,
    files: Sequence[Mapping[str, Any]],
    columns: Sequence[PinnedColumn],
    *,
    limit: int,
) -> ReadResult:
    """The first `limit` rows of `files` (the `files` op's list, paths relative to `location`),
    shaped like `columns`. Files are read in the order given (commit order)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"limit must be an integer of at least 1, not {limit!r}")
    target = arrow_schema(columns)
    if files and not location:
        raise DataFileUnreadableError(
            "the table has no location, so its files' relative paths lead nowhere",
            path=str(files[0].get("path")),
        )
    batches: list[pa.RecordBatch] = []
    have = 0
    opened = 0
    for entry in files:
        if have >= limit:
            break
        path = absolute(location, str(entry["path"]))
        opened += 1
        for batch in file_batches(path, columns, target=target, rows_wanted=limit - have):
            batches.append(batch)
            have += batch.num_rows
            if have >= limit:
                break
    table = pa.Table.from_batches(batches, schema=target) if batches else target.empty_table()
    return ReadResult(rows=table.slice(0, limit), files_opened=opened)


def file_batches(
    path: str,
    columns: Sequence[PinnedColumn],
    *,
    target: pa.Schema | None = None,
    rows_wanted: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of one file (an absolute path or URI) conformed to `columns`, in batches of at
    most READ_BATCH_ROWS_MAX rows; stops once `rows_wanted` rows are read (None: the whole
    file). `target` is `arrow_schema(columns)`, passed by callers that read many files."""
    if rows_wanted is not None and (
        isinstance(rows_wanted, bool) or not isinstance(rows_wanted, int) or rows_wanted < 1
    ):
        raise InvalidArgumentError(f"rows_wanted must be at least 1 or None, not {rows_wanted!r}")
    schema = arrow_schema(columns) if target is None else target
    fs, fs_path = _filesystem(path)
    try:
        with fs.open_input_file(fs_path) as source:
            # INT96 (Spark's default TIMESTAMP encoding) decoded to microseconds, Spark's own
            # unit: pyarrow's default, nanoseconds, overflows outside 1677-2262 (0001-01-01 and
            # 9999-12-31 are common sentinels), failing or wrapping to another instant.
            parquet = pq.ParquetFile(source, coerce_int96_timestamp_unit="us")
            sources = _match_columns(parquet.schema_arrow, columns, path)
            # Nested fields two of the file's fields match fail here, at open, as top-level
            # columns do (a file of no rows too), not at the first batch's cast.
            file_types = {f.name: f.type for f in parquet.schema_arrow}
            for field, source in zip(schema, sources, strict=True):
                if source is not None and file_types[source] != field.type:
                    _nested_names_as_pinned(file_types[source], field.type, path, f"{field.name}.")
            file_rows = int(parquet.metadata.num_rows)
            left = file_rows if rows_wanted is None else min(rows_wanted, file_rows)
            wanted = sorted({s for s in sources if s is not None})
            if not wanted:
                # Every pinned column was added after this file was written: only defaults.
                empty = pa.record_batch([], schema=pa.schema([]))
                while left > 0:
                    rows = min(left, READ_BATCH_ROWS_MAX)
                    yield _conform(empty, schema, columns, sources, path, rows=rows)
                    left -= rows
                return
            batch_rows = max(1, min(left, READ_BATCH_ROWS_MAX))
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
                if left <= 0:
                    break
                if batch.num_rows > left:
                    batch = batch.slice(0, left)
                yield _conform(batch, schema, columns, sources, path, rows=batch.num_rows)
                left -= batch.num_rows
    except FileNotFoundError:
        raise DataFileNotFoundError(
            f"committed data file {path} does not exist", path=path
        ) from None
    except (pa.ArrowException, OSError) as exc:
        raise DataFileUnreadableError(f"cannot read {path}: {exc}", path=path) from None


def matched_by_name(file_schema: pa.Schema) -> bool:
    """Whether a file's columns are matched to the pinned ones by name (case-insensitively):
    only when none of its top-level columns carries a field id. A file with field ids on some
    columns only is matched by field id alone (its columns without one hold no pinned column).
    The one rule of every reader: this module's, and the Spark bridge's (`spark_bridge.bridge`
    reads such files with a struct without field ids)."""
    return not any(FIELD_ID_KEY in (f.metadata or {}) for f in file_schema)


def file_matched_by_name(path: str) -> bool:
    """`matched_by_name` of one file (an absolute path or URI), from its footer alone."""
    return matched_by_name(file_schema(path))


LIST_KINDS: Final = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)

# A field's path in a file's schema: its names from the top-level column down, with
# `element` for a list's elements and `key` / `value` for a map's (Spark's own names).
FieldPath: TypeAlias = tuple[str, ...]


def name_clashes(file_names: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The groups of `file_names` that one name matches by `match_names`' rule (equal
    `toLowerCase(Locale.ROOT)`, e.g. `id` and `ID`), in file order; usually none."""
    by_key: dict[str, list[str]] = {}
    for name in file_names:
        by_key.setdefault(java_lower_root(name), []).append(name)
    return tuple(tuple(names) for names in by_key.values() if len(names) > 1)


def name_clash_paths(schema: pa.Schema) -> tuple[tuple[FieldPath, ...], ...]:
    """`name_clashes` at every level of `schema`: the groups of fields of one struct (the
    top-level columns, or a nested struct's fields, inside lists and maps too) that one name
    matches, as paths (`("id",), ("ID",)`; `("s", "a"), ("s", "A")`), in file order. Nested
    fields are matched by name in every file (they carry no field ids), by Spark too."""
    found: list[tuple[FieldPath, ...]] = []

    def fields(level: Sequence[pa.Field], parent: FieldPath) -> None:
        found.extend(
            tuple((*parent, name) for name in names)
            for names in name_clashes([f.name for f in level])
        )
        for f in level:
            inside(f.type, (*parent, f.name))

    def inside(dtype: pa.DataType, at: FieldPath) -> None:
        if pa.types.is_struct(dtype):
            fields(list(dtype), at)
        elif pa.types.is_map(dtype):
            inside(dtype.key_type, (*at, "key"))
            inside(dtype.item_type, (*at, "value"))
        elif any(kind(dtype) for kind in LIST_KINDS):
            inside(dtype.value_type, (*at, "element"))

    fields(list(schema), ())
    return tuple(found)


def ambiguous_column(column: str, matches: Sequence[str], *, path: str) -> AmbiguousColumnError:
    """The error of a pinned column (or nested field, `s.a`) that `matches` (two or more
    fields of the file at `path`) match by name: Spark refuses such a read too."""
    return AmbiguousColumnError(
        f"column {column!r} matches {len(matches)} columns of {path}, which has no field "
        f"ids, by name (case-insensitively, as Spark matches them): {list(matches)}; Spark "
        "refuses to read it as well (rewrite the file with one of them renamed)",
        path=path,
        column=column,
        matches=matches,
    )


def file_schema(path: str) -> pa.Schema:
    """The schema in the footer of one file (an absolute path or URI)."""
    fs, fs_path = _filesystem(path)
    try:
        with fs.open_input_file(fs_path) as source:
            return pq.read_schema(source)
    except FileNotFoundError:
        raise DataFileNotFoundError(
            f"committed data file {path} does not exist", path=path
        ) from None
    except (pa.ArrowException, OSError) as exc:
        raise DataFileUnreadableError(f"cannot read {path}: {exc}", path=path) from None


def _match_columns(
    file_schema: pa.Schema, columns: Sequence[PinnedColumn], path: str
) -> list[str | None]:
    """For each pinned column, the name of the file's column holding it, or None (added after
    the file was written). By field id; by name only in a file without any field ids."""
    if matched_by_name(file_schema):
        return match_names(file_schema.names, [c.name for c in columns], path=path)
    by_id: dict[int, str] = {}
    for f in file_schema:
        fid = (f.metadata or {}).get(FIELD_ID_KEY)
        if fid is not None:
            try:
                by_id[int(fid)] = f.name
            except ValueError:
                raise DataFileUnreadableError(
                    f"column {f.name!r} of {path} has a malformed field id {fid!r}", path=path
                ) from None
    return [by_id.get(c.field_id) for c in columns]


def match_names(
    file_names: Sequence[str], wanted: Sequence[str], *, path: str, prefix: str = ""
) -> list[str | None]:
    """For each wanted (pinned) column name, the one file column it names, or None: Spark's
    Parquet reader's rule with `spark.sql.caseSensitive` false (ParquetReadSupport), the one
    every by-name match of this project follows. Names match when their Java
    `toLowerCase(Locale.ROOT)` are equal (`metastore.client.java_lower`): not `str.casefold`
    (`straße` and `STRASSE` are two columns, as a table may hold them since apply version 7),
    and not Java's equalsIgnoreCase, which Spark's analyzer uses (the long s, U+017F, does not
    name `s` here).
    A wanted name matching two file columns is refused (AmbiguousColumnError, its names after
    `prefix`: a nested field's parent path, `s.`), even when one matches exactly, as Spark
    refuses it; file columns no wanted name matches are ignored."""
    by_key: dict[str, list[str]] = {}
    for name in file_names:
        by_key.setdefault(java_lower_root(name), []).append(name)
    sources: list[str | None] = []
    for name in wanted:
        found = by_key.get(java_lower_root(name), [])
        if len(found) > 1:
            raise ambiguous_column(prefix + name, [prefix + match for match in found], path=path)
        sources.append(found[0] if found else None)
    return sources


def _conform(
    batch: pa.RecordBatch,
    target: pa.Schema,
    columns: Sequence[PinnedColumn],
    sources: Sequence[str | None],
    path: str,
    *,
    rows: int,
) -> pa.RecordBatch:
    arrays = []
    for field, column_def, source in zip(target, columns, sources, strict=True):
        if source is None:
            # The column was added after this file was written: its rows read the column's
            # default (Spark's existence default), or NULL when it has none.
            if column_def.default_sql is None:
                arrays.append(pa.nulls(rows, type=field.type))
                continue
            try:
                arrays.append(default_array(column_def.default_sql, field.type, rows))
            except DefaultNotEvaluableError as exc:
                raise UnsupportedSchemaError(f"column {field.name!r}: {exc}") from None
            continue
        column = batch.column(source)
        try:
            if column.type != field.type:
                # Nested fields by name, as Spark matches them: the cast then finds each.
                named = _nested_names_as_pinned(column.type, field.type, path, f"{field.name}.")
                column = column if named == column.type else column.view(named)
                # Cast with every nested field nullable, then rebuilt as pinned: a file may hold
                # a NOT NULL field as nullable (the bridge's Spark writes the output's
                # nullability; writers check the values), whose slots under a NULL struct or
                # element are NULL, which pyarrow's cast and view refuse for a NOT NULL field.
                relaxed = _nullable_everywhere(field.type)
                column = with_nested_nullability(column.cast(relaxed), field.type)
            arrays.append(column)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise DataFileUnreadableError(
                f"column {source!r} of {path} ({column.type}) cannot be read as "
                f"{field.name} {field.type}: {exc}",
                path=path,
            ) from None
    for i, column_def in enumerate(columns):
        dtype = _char_holding_type(column_def.type_sql)
        if dtype is not None:
            # Spark's read-side padding, nested CHAR too (inside structs, lists, maps).
            arrays[i] = map_strings(arrays[i], dtype, _padded_on_read, column_def.name)
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _padded_on_read(values: pa.Array, dtype: M.VarcharType | M.CharType, path: str) -> pa.Array:
    """Spark's read-side padding of CHAR(n) values: shorter values padded to n, longer ones (a
    DEFAULT beyond n with trailing spaces) left as they are, as Spark leaves them; VARCHAR as it
    is."""
    if not isinstance(dtype, M.CharType):
        return values
    return pc.utf8_rpad(values, width=int(dtype.length), padding=" ")


def _nullable_everywhere(dtype: pa.DataType) -> pa.DataType:
    """`dtype` with every nested field (struct fields, list elements, map items) nullable: the
    same layout, which `with_nested_nullability` rebuilds as `dtype`."""
    if pa.types.is_struct(dtype):
        return pa.struct(
            [pa.field(f.name, _nullable_everywhere(f.type), True, f.metadata) for f in dtype]
        )
    if pa.types.is_map(dtype):
        return pa.map_(
            dtype.key_field.with_type(_nullable_everywhere(dtype.key_type)),
            dtype.item_field.with_type(_nullable_everywhere(dtype.item_type)).with_nullable(True),
            keys_sorted=dtype.keys_sorted,
        )
    if pa.types.is_list(dtype):
        return pa.list_(
            dtype.value_field.with_type(_nullable_everywhere(dtype.value_type)).with_nullable(True)
        )
    return dtype


def _nested_names_as_pinned(
    file_type: pa.DataType, pinned: pa.DataType, path: str, prefix: str
) -> pa.DataType:
    """`file_type` with each nested struct field that a pinned field names (`match_names`, as
    Spark matches nested fields: they carry no field ids) renamed to the pinned name, in structs
    inside lists and maps too; the same layout, so the column is viewed as it, then cast (pyarrow
    casts a struct's fields by exact name: a file's `A` read as NULL for a pinned `a`). `prefix`
    is the pinned path down to `file_type` (`s.`), which an AmbiguousColumnError names."""
    if pa.types.is_struct(file_type) and pa.types.is_struct(pinned):
        pinned_fields = list(pinned)
        sources = match_names(
            [f.name for f in file_type], [f.name for f in pinned_fields], path=path, prefix=prefix
        )
        renamed = {source: f for source, f in zip(sources, pinned_fields, strict=True) if source}
        fields = []
        for f in file_type:
            target = renamed.get(f.name)
            if target is None:
                fields.append(f)
                continue
            inner = _nested_names_as_pinned(f.type, target.type, path, f"{prefix}{target.name}.")
            fields.append(pa.field(target.name, inner, f.nullable, f.metadata))
        return pa.struct(fields)
    if pa.types.is_map(file_type) and pa.types.is_map(pinned):
        key = _nested_names_as_pinned(file_type.key_type, pinned.key_type, path, f"{prefix}key.")
        item = _nested_names_as_pinned(
            file_type.item_type, pinned.item_type, path, f"{prefix}value."
        )
        return pa.map_(
            file_type.key_field.with_type(key),
            file_type.item_field.with_type(item),
            keys_sorted=file_type.keys_sorted,
        )
    if any(kind(file_type) for kind in LIST_KINDS) and any(kind(pinned) for kind in LIST_KINDS):
        value = _nested_names_as_pinned(
            file_type.value_type, pinned.value_type, path, f"{prefix}element."
        )
        if value == file_type.value_type:
            return file_type
        value_field = file_type.value_field.with_type(value)
        if pa.types.is_large_list(file_type):
            return pa.large_list(value_field)
        if pa.types.is_fixed_size_list(file_type):
            return pa.list_(value_field, file_type.list_size)
        return pa.list_(value_field)
    return file_type


@functools.lru_cache(maxsize=256)
def _char_holding_type(type_sql: str) -> M.DataType | None:
    """The column type, when it holds a CHAR(n) (at the top or nested: padded on read, as Spark
    reads it), else None."""
    dtype = M.parse_type(type_sql)
    return dtype if M.contains_type(dtype, M.CharType) else None


def pyarrow_uri(uri: str) -> str:
    """`uri` as pyarrow names its store: Spark's s3a:// and s3n:// are pyarrow's s3://. Every
    reader, writer and the GC of a URI location goes through this, so that what Spark wrote
    under a location, the catalog's tools can open and delete too."""
    for alias in _S3_ALIASES:
        if uri.startswith(alias):
            return "s3://" + uri[len(alias) :]
    return uri


def local_path(path: str) -> str | None:
    """The local path `path` (a location or a file under one) names, or None for another store's
    URI. A `file://` URI names the path written after `file://`, taken literally, as Spark's
    writer (Hadoop's `Path`) and the GC take it: `file:///d/a%20b` is `/d/a%20b`. pyarrow's
    `FileSystem.from_uri` would percent-decode it (`/d/a b`: not where Spark wrote) and refuses
    one holding a space, a lone `%` or non-ASCII text."""
    if "://" not in path:
        return path
    if path.startswith("file://"):
        return path.removeprefix("file://")
    return None


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The file system holding `path` (a location or a file under one) and its path in it.
    pyarrow errors (no file system for the URI) propagate."""
    local = local_path(path)
    if local is not None:
        return pafs.LocalFileSystem(), local
    fs, fs_path = pafs.FileSystem.from_uri(pyarrow_uri(path))
    return fs, str(fs_path)


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    try:
        fs, fs_path = filesystem(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataFileUnreadableError(
            f"cannot open {path}: pyarrow has no filesystem for it ({exc})", path=path
        ) from None
    return fs, fs_path


def absolute(location: str, rel_path: str) -> str:
    """A committed file's path: relative paths are under the table's location."""
    if rel_path.startswith("/") or "://" in rel_path:
        return rel_path
    return f"{location.rstrip('/')}/{rel_path}"
