"""Rows of a table's committed Parquet files, read with pyarrow (no Spark), for `table read`.

Key idea
    The metastore says which files make up a table at a timestamp (`files`) and which schema was
    in force then (`schema_at`: columns with field ids and Spark SQL types). This module reads
    exactly those files, in commit order, and shapes every batch like the pinned schema the way
    `spark_bridge.datasource` does for Spark:
    * a column is found in a file by its Parquet field id (`PARQUET:field_id`), so a column
      renamed after the file was written still yields its data;
    * only a file written without any field ids is matched by name (case-insensitively);
    * a pinned column the file does not have (added later) reads as NULL;
    * a column whose type was widened since (INT -> BIGINT, ...) is cast to the pinned type.
    Nested fields are cast as a whole, as the data source does (the protocol's type strings carry
    no nested field ids).

Invariants
    * Only listed files are opened; directories are never listed, so files no commit references
      (an aborted batch's output) are never shown.
    * Reading stops as soon as `limit` rows are in hand: a large table costs one batch, not a scan.
    * The result has exactly the pinned columns, in pinned order, with the pinned types.
    * Every pyarrow failure becomes a typed `CliError` naming the file.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cli.errors import EXIT_GENERIC, EXIT_NOT_FOUND, EXIT_USAGE, CliError
from metastore import types as M
from metastore.errors import MetastoreError
from spark_bridge.defaults import DefaultNotEvaluableError, default_array
from spark_bridge.files import absolute

# The key under which pyarrow exposes a Parquet column's field id (as Spark writes it).
FIELD_ID_KEY: Final = b"PARQUET:field_id"
# Rows decoded per step. A `--limit` below it decodes no more than the limit.
READ_BATCH_ROWS_MAX: Final = 8192
# Spark's s3a/s3n schemes are the same object store pyarrow calls s3.
_S3_ALIASES: Final = ("s3a://", "s3n://")


class DataFileNotFoundError(CliError):
    """A file the metastore lists as committed is not at its location (deleted by hand, or the
    warehouse is not reachable from here)."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(
            "DATA_FILE_NOT_FOUND", message, exit_code=EXIT_NOT_FOUND, details={"path": path}
        )


class DataFileUnreadableError(CliError):
    """A committed file is not valid Parquet, or a column cannot be converted to its pinned
    type."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(
            "DATA_FILE_UNREADABLE", message, exit_code=EXIT_GENERIC, details={"path": path}
        )


class UnsupportedSchemaError(CliError):
    """The pinned schema has a type this reader cannot represent."""

    def __init__(self, message: str) -> None:
        super().__init__("UNSUPPORTED_SCHEMA", message, exit_code=EXIT_GENERIC)


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
    """The Arrow type Spark's Arrow conversion uses for a metastore type."""
    match dtype:
        case M.PrimitiveType(kind=kind):
            return _PRIMITIVES[kind]
        case M.DecimalType(precision=precision, scale=scale):
            return pa.decimal128(precision, scale)
        case M.VarcharType() | M.CharType():
            return pa.string()  # Spark reads VARCHAR/CHAR columns as STRING
        case M.ArrayType(element=element):
            return pa.list_(arrow_type(element))
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
    if limit < 1:
        raise CliError("USAGE", f"limit must be at least 1, not {limit}", exit_code=EXIT_USAGE)
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
        for batch in _file_batches(path, target, columns, rows_wanted=limit - have):
            batches.append(batch)
            have += batch.num_rows
            if have >= limit:
                break
    table = pa.Table.from_batches(batches, schema=target) if batches else target.empty_table()
    return ReadResult(rows=table.slice(0, limit), files_opened=opened)


def _file_batches(
    path: str, target: pa.Schema, columns: Sequence[PinnedColumn], *, rows_wanted: int
) -> list[pa.RecordBatch]:
    """Batches of one file conformed to `target`, stopping once `rows_wanted` rows are read."""
    fs, fs_path = _filesystem(path)
    try:
        with fs.open_input_file(fs_path) as source:
            parquet = pq.ParquetFile(source)
            file_schema = parquet.schema_arrow
            by_id: dict[int, str] = {}
            by_name: dict[str, str] = {}
            for f in file_schema:
                fid = (f.metadata or {}).get(FIELD_ID_KEY)
                if fid is not None:
                    by_id[int(fid)] = f.name
                by_name.setdefault(f.name.casefold(), f.name)
            sources: list[str | None] = []
            for c in columns:
                found = by_id.get(c.field_id)
                if found is None and not by_id:
                    found = by_name.get(c.name.casefold())  # a file written without field ids
                sources.append(found)
            wanted = sorted({s for s in sources if s is not None})
            if not wanted:
                # Every pinned column was added after this file was written: all NULL.
                rows = min(rows_wanted, parquet.metadata.num_rows)
                empty = pa.record_batch([], schema=pa.schema([]))
                if not rows:
                    return []
                return [_conform(empty, target, columns, sources, path, rows=rows)]
            out: list[pa.RecordBatch] = []
            have = 0
            batch_rows = min(rows_wanted, READ_BATCH_ROWS_MAX)
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
                out.append(_conform(batch, target, columns, sources, path, rows=batch.num_rows))
                have += batch.num_rows
                if have >= rows_wanted:
                    break
            return out
    except FileNotFoundError:
        raise DataFileNotFoundError(
            f"committed data file {path} does not exist", path=path
        ) from None
    except (pa.ArrowException, OSError) as exc:
        raise DataFileUnreadableError(f"cannot read {path}: {exc}", path=path) from None


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
            arrays.append(column if column.type == field.type else column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise DataFileUnreadableError(
                f"column {source!r} of {path} ({column.type}) cannot be read as "
                f"{field.name} {field.type}: {exc}",
                path=path,
            ) from None
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in path:
        return pafs.LocalFileSystem(), path
    uri = path
    for alias in _S3_ALIASES:
        if uri.startswith(alias):
            uri = "s3://" + uri[len(alias) :]
    try:
        fs, fs_path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, OSError) as exc:
        raise DataFileUnreadableError(
            f"cannot open {path}: pyarrow has no filesystem for it ({exc})", path=path
        ) from None
    return fs, fs_path


# ---- values for printing ---------------------------------------------------------------------


def json_value(value: object) -> object:
    """A value of `Table.to_pylist()` as JSON: decimals as strings (no precision lost), times as
    ISO-8601, binary as base64, maps as objects when every key is a string, NaN/infinities as
    strings (JSON has no literal for them)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(p, tuple) and len(p) == 2 for p in value):
            # pyarrow gives a MAP as a list of (key, value) pairs.
            if all(isinstance(k, str) for k, _ in value):
                return {k: json_value(v) for k, v in value}
            return [{"key": json_value(k), "value": json_value(v)} for k, v in value]
        return [json_value(v) for v in value]
    return str(value)


def text_value(value: object) -> str:
    """A value as one table cell: NULL for null (as Spark's show prints it), JSON for nested."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    shown = json_value(value)
    if isinstance(shown, str):
        return shown
    return json.dumps(shown, sort_keys=True, ensure_ascii=False)
