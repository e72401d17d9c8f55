"""A write task of format("metastore") as PySpark runs it, for unit tests without Spark: the
rows as the Arrow batches Spark's JVM hands the Python worker (`spark_batches`), and the
worker's dispatch of them to a data source writer (`run_write_task`, after
`pyspark.sql.worker.write_into_data_source`): an Arrow writer gets the batches, a row writer
the rows PySpark converts them to (TIMESTAMP values as naive datetimes in the worker's local
time)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spark_bridge.datasource import MetastoreWriter


def spark_batches(
    rows: Iterable[Row | dict[str, Any]], schema: StructType, *, time_zone: str = "UTC"
) -> Iterator[pa.RecordBatch]:
    """`rows` (of Spark schema `schema`) as Spark sends them to a write task: one Arrow batch
    whose TIMESTAMP columns carry the session time zone `time_zone`. A TIMESTAMP value is
    given as an aware datetime (a naive one means UTC, as pyarrow takes it); a Row's values
    are taken by position."""
    arrow_schema = to_arrow_schema(schema, timezone=time_zone)
    # A Row's values by position, as Spark sends a DataFrame's columns (its field names are
    # the schema's).
    values = [
        dict(zip(schema.names, r.asDict(recursive=True).values(), strict=True))
        if isinstance(r, Row)
        else r
        for r in rows
    ]
    if values:
        yield pa.RecordBatch.from_pylist(values, schema=arrow_schema)


def run_write_task(
    writer: MetastoreWriter, batches: Iterable[pa.RecordBatch], schema: StructType
) -> WriterCommitMessage:
    """The file-writing part of one task (`write` also heartbeats the write's session), fed as
    PySpark's write worker feeds the writer."""
    if isinstance(writer, DataSourceArrowWriter):
        return writer._write_file(iter(batches))
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    converters = [ArrowTableToRowsConversion._create_converter(f.dataType) for f in schema]
    rows = [
        Row(
            **{f.name: convert(v) for f, convert, v in zip(schema, converters, values, strict=True)}
        )
        for batch in batches
        for values in zip(
            *(ArrowTableToRowsConversion._to_pylist(c) for c in batch.columns), strict=True
        )
    ]
    return writer._write_file(iter(rows))


def write_rows(
    writer: MetastoreWriter, rows: Iterable[Row | dict[str, Any]]
) -> WriterCommitMessage:
    """`writer.write` (a whole task: session heartbeats, then the file) of `rows` of the
    writer's source schema, as Spark sends them (session time zone UTC)."""
    return writer.write(spark_batches(rows, writer.source_schema))


def write_file_of_rows(
    writer: MetastoreWriter, rows: Iterable[Row | dict[str, Any]]
) -> WriterCommitMessage:
    """The file-writing part of a task (no heartbeats) for `rows`, as `write_rows`."""
    return writer._write_file(spark_batches(rows, writer.source_schema))
