"""`spark.read.format("metastore")` and single-table appends through Spark's Python Data Source API.

    spark.read.format("metastore").option("table", "sales.orders").option("as_of", "-5m").load()
    df.write.format("metastore").option("table", "sales.orders").mode("append").save()
    spark.read.format("metastore").load("sales.orders")  # the path is the table's name too
    # a path and a `table` option naming two tables: TableOptionMismatchError (a ValueError),
    #   nothing read or written; the same table in both (any case) is fine
    # `as_of` is for reads: a write with it is refused (DataSourceOptionError, option "as_of")
    # optional: .option("txn_id", "<stable id>") makes a retried job commit once, however
    #           much later (the id's mark: metastore.client.txn_marks)
    # optional: .option("loose_files_max", "10000") compacts the table into manifests past it
    #           (default: the cluster's loose_files_max setting)
    # optional: .option("session_ttl_ms", "1800000") the TTL of the append's session (below;
    #           500..3600000, else DataSourceOptionError naming it)
    # optional: .option("keep_max_ms", "86400000") how long the driver keeps it at most (below)
    # any other option (a typo: "asof", "txnId"), or a write option on a read, is refused
    #   (UnknownOptionError, naming it and the closest known one): it would do nothing, silently

Reads pin one timestamp (the `as_of` option — an HLC integer, ISO-8601 time with its UTC offset
(`...Z`, `...+02:00`), `-5m`-style relative time or `now` — default now; a time without an offset
is refused (TimestampParseError): Spark SQL's `TIMESTAMP AS OF` and Delta's `timestampAsOf` read
one in the session time zone, which a Python data source never sees (its planner gets the
options only; measured, pyspark 4.3), and reading it as UTC, as earlier releases did, silently
read another version in any other session zone; `MetastoreBridge.read_table` reads one in the
session zone — or the newest acknowledged commit's ts if that is later; epoch seconds
or milliseconds are refused, naming the HLC integer and ISO time they stand for; a write refuses
the option, typed, while it is planned: a write commits now, under the schema in force now, so
it cannot be "as of" a past time), take the schema in force then and the
files live then, and read each file with pyarrow on the executors, matching columns by Parquet
field id (so renamed columns keep their data) and casting widened types
(`metastore.client.parquet`, the reader the CLI's `table read` uses too). Appends write one Parquet
file per Spark task that got rows (a task without rows writes none) into a fresh directory and
commit them in one metastore commit from the driver side; an aborted job commits nothing. An append
of no rows commits no file: its commit still records its txn id (and the `txn_id` option's mark),
so a re-run of it is recognised as done; an overwrite of no rows empties the table. A commit whose
outcome is unknown (no node answered in time) or refused as a reused txn id is looked up
(linearizable) before the job fails or is done: found committed by this append's table, the job
succeeded; by another table's write, TxnIdReused (a txn id names one write). Not found after an
unknown outcome, the commit may still be on its way, so the append's session is closed first (its
files lie in the session's directory, and a commit of them is refused once the session ended) and
the commit looked up again: now found, the job succeeded; not found, it failed with nothing
committed (`details.committed` false), and a re-run as it is commits once. When that close or
lookup fails too, the error names the txn id to re-run under. Reads see the pinned version's public
columns; appends also write the columns a schema change job holds write-only (its `write_schema`):
the DataFrame may omit them (they are hidden from readers), and the writer fills their DEFAULT, or
NULL.

An append takes what `MetastoreBridge.batch` takes, by the same rules (spark_bridge.conform
`conform_plan`, one copy of them): the DataFrame's columns are matched to the table's by name as
Spark matches them (case-insensitively, Java's rule; in any order), a type is cast only where it
widens as the evolution rules allow (int to bigint, float to double, a decimal to a wider one of
the same scale, date to timestamp_ntz; inside structs, by position, arrays and maps too), a missing
column is filled with its DEFAULT, else NULL if nullable; a column the table lacks, one given
twice, a missing NOT NULL column without DEFAULT or a type that would narrow is the bridge's
SchemaMismatchError naming the column, raised where the write is planned (before its session
opens: nothing written). Spark hands `writer()` the DataFrame's own schema and each task its rows
in that order and those types (measured, pyspark 4.3: no cast or reorder of its own), so each task
takes its rows as Spark's Arrow batches (the writer is a `DataSourceArrowWriter`) and selects and
casts the pinned columns from them (`_conformed`), then pads CHAR, checks VARCHAR/CHAR lengths,
map keys and NOT NULL, as before. Arrow, not PySpark's rows: those give a TIMESTAMP as a naive
datetime in the worker's local time, which names one instant everywhere but in the hour a
daylight-saving change repeats (there, two instants are one value: the second was stored an hour
early). Arrow carries the instant itself, whatever the worker's or the session's time zone.

Each append runs under a metastore session of its own, opened (fresh id, TTL the
`session_ttl_ms` option, default 10 min, at most 1 h) when the write is planned: its files go to
that session's attempt directory `_txn/<session id>--append-<random>/`, which GC's orphan scan
leaves alone while the session lives, however long the job runs. The driver keeps it alive from
the planning to the commit or abort, through the stages before the write too (a shuffle, a slow
join: no task of the write runs then): `register()` starts a session keeper in the application's
process (spark_bridge.keeper: a daemon thread heartbeating every third of the TTL, told of each
append by a file in its private directory, which the commit and the abort remove; an append that
neither commits nor aborts within the `keep_max_ms` option, default 24 h, is let go then and its
session closed: Spark never ended it, and a driver running for weeks must not hold its session
all that time; a planning that fails after the session opened closes it before the error reaches
Spark). Each task also heartbeats the session when it starts and every third of the TTL while it
runs (a failed heartbeat is only logged), `commit()` heartbeats it before committing, and the
commit or abort closes it. A session can still end before the commit when neither the driver nor
a task got a heartbeat through for a whole TTL (the driver's process stalled, the metastore
unreachable from it; or a planner on another host than the registering process, as with Spark
Connect, where only the tasks keep it, with a warning): the job then fails at its next task, or
its commit is refused, with SessionNotFoundError (reason `attempt_session_not_live`, and the
keeper's reason when it gave up; nothing committed, since GC may have deleted files of an ended
session): re-run it. Reads open no session and take no lease or protection, so nothing needs
keeping while they run: the files a read lists stay until the table's GC threshold passes its
timestamp (`gc.ttl` after it), and a read at an old `as_of`, or one running that long, should
protect its timestamp first (`MetastoreBridge.protect`).

Read-your-writes in one driver. A read's default timestamp is the leader's `read_ts` (when later
than now), so it sees every acknowledged commit, a bridge's included. An append's `commit()`
runs in a Python worker process (below), not in the driver's Python process, so it leaves its
commit's position in the directory of the driver's session keeper (spark_bridge.keeper
`note_commit`), and the read floors the client library shares among the client objects of the
driver's process (metastore.client.floors: its bridges and its own clients) take it in at their
next lookup: a bridge batch right after the append reads at or above it. Where the keeper's
directory is out of reach (Spark Connect) or for other processes, call `read_ts()` first
(linearizable, one leader round trip). Executors (write tasks) only heartbeat the append's
session and commit nothing.

Facts of the API this relies on (PySpark 4.x): `schema()`, `reader()`, `partitions()`,
`writer()` and `commit()` run in Python worker processes on the driver host, `read()`/`write()`
on executors; the DataSource instance is pickled between those steps, so what `schema()` pins is
what `reader()` reads. The connection settings travel as class attributes of a subclass made by
`register()` (options would show the token in query plans), TLS options (`ClientTls`: file
paths, read where the client runs, i.e. on the driver host) included. `saveAsTable(name)` and
`insertInto(name)` never hand the data source the name (measured, 4.3: its options are the
writer's own, without a `path`), and Spark records a table of its own catalog under it: without
a `table` option the write is refused (DataSourceOptionError saying to use `save('ns.table')`,
nothing written, no catalog entry left); with one, the append goes to the option's table whatever
the name says, and the catalog entry Spark leaves (provider metastore, no options kept) refuses
reads and inserts the same way, saying to DROP it. `saveAsTable('ns.table')` fails in Spark
itself when spark_catalog has no namespace `ns` (SCHEMA_NOT_FOUND). Use `save()`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from metastore.errors import MetastoreError, SessionNotFoundError
    from raft.tls import ClientTls
    from spark_bridge.keeper import SessionKeeper

# The TTL of an append's session (option "session_ttl_ms"): how long it survives without any
# heartbeat (from the driver's keeper, a task or the commit) before it ends and its commit is
# refused. Longer than a lease-holding session's: it blocks no schema change, it only keeps a
# killed job's files from GC that much longer.
WRITE_SESSION_TTL_MS_DEFAULT = 600_000
# How long the driver's session keeper heartbeats an append's session at most (option
# "keep_max_ms"): an append Spark planned but never committed nor aborted (its commit or abort
# worker killed, its query failed between the planning and the write) is let go then and its
# session closed, so a driver running for weeks does not keep such sessions (each counted
# against the cluster's MAX_SESSIONS, its files spared by GC) until it ends. Longer than any
# stage before a write is expected to run: such a stage is kept only by the keeper (the write's
# tasks heartbeat the session themselves while they run).
APPEND_KEEP_MS_DEFAULT = 24 * 3_600_000


class DataSourceOptionError(ValueError):
    """An option of a `format("metastore")` read or write that cannot mean what it says,
    refused where Spark plans the read or write (before any metastore session opens, so
    nothing is written): `option` names it. A ValueError, as the data source's option errors
    were before they were typed; it reaches the driver inside Spark's AnalysisException
    [PYTHON_DATA_SOURCE_ERROR]."""

    code = "INVALID_OPTION"

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message)
        self.option = option


class TableOptionMismatchError(DataSourceOptionError):
    """The path of `load()`/`save()` and the `table` option name two different tables: which
    one was meant is unknown, so neither is read or written. `table_option` and `path` are the
    two names as given."""

    code = "TABLE_OPTION_MISMATCH"

    def __init__(self, message: str, *, table_option: str, path: str) -> None:
        super().__init__(message, option="table")
        self.table_option = table_option
        self.path = path


class UnknownOptionError(DataSourceOptionError):
    """An option a `format("metastore")` read or write does not take: a misspelt one
    (`asof`, `txnId`) would otherwise do nothing, silently - a read at now instead of the time
    asked for, a retried append committed twice - so nothing is read or written. `known` lists
    the options that kind of plan takes; `suggestion` is the closest of them ("" if none)."""

    code = "UNKNOWN_OPTION"

    def __init__(self, message: str, *, option: str, known: tuple[str, ...], suggestion: str):
        super().__init__(message, option=option)
        self.known = known
        self.suggestion = suggestion


# The options of a read and of a write, as Spark hands them (keys lower-cased). `path` is the
# argument of load()/save(). A write takes `as_of` only to refuse it with its own reason.
READ_OPTIONS: tuple[str, ...] = ("table", "path", "as_of")
WRITE_OPTIONS: tuple[str, ...] = (
    "table",
    "path",
    "txn_id",
    "loose_files_max",
    "session_ttl_ms",
    "keep_max_ms",
    "as_of",
)


def check_option_names(options: Any, *, write: bool) -> None:
    """Refuse (UnknownOptionError) the first option a read (`write` False) or write does not
    take, naming it, the closest known option and what it does instead."""
    import difflib

    known = WRITE_OPTIONS if write else READ_OPTIONS
    what = "a write" if write else "a read"
    table = options.get("table") or options.get("path") or "?"
    for name in sorted(options.keys()):
        if str(name).lower() in known:
            continue
        if not write and str(name).lower() in WRITE_OPTIONS:
            hint = f"{name!r} is a write option and does nothing on a read: remove it"
            suggestion = ""
        else:
            close = difflib.get_close_matches(
                str(name).lower().replace("-", "_"), known, n=1, cutoff=0.6
            )
            suggestion = close[0] if close else ""
            hint = f"did you mean {suggestion!r}?" if suggestion else "remove it"
        raise UnknownOptionError(
            f"format('metastore') got .option({str(name)!r}, ...) on {what} of {table}, an "
            f"option it does not take; nothing was {'written' if write else 'read'}: {hint} "
            f"(the options of {what}: {', '.join(known)})",
            option=str(name),
            known=known,
            suggestion=suggestion,
        )


def _client(endpoints: list[str], token: str, tls: ClientTls | None = None) -> Any:
    from metastore.client import SyncMetastoreClient

    return SyncMetastoreClient(endpoints, token, client_name="spark-datasource", tls=tls)


def _resolve_ts(client: Any, text: str | None) -> int:
    from hlc import parse_ts

    if text is None or text == "":
        # Now, or later if a commit acknowledged before this read (by any application) is
        # stamped above this driver's clock: a commit may land up to DD above the leader's
        # clock, and one from a driver whose clock runs ahead does. Reading at the leader's
        # `read_ts` too makes the default read see every acknowledged commit.
        now = int(client.clock.now())
        from metastore.errors import UnknownOpError

        try:
            return max(now, int(client.read_ts()))
        except UnknownOpError:
            return now  # an older release's node: its reads at now are the best on offer
    # A time without a UTC offset is refused, not read as UTC: Spark SQL's `TIMESTAMP AS OF`
    # and Delta's `timestampAsOf` read it in the session's time zone, which a Python data
    # source never sees (measured, pyspark 4.3: its planner gets the options only, no session
    # conf, no TaskContext), so any zone chosen here could silently read another version.
    return check_as_of(
        parse_ts(
            str(text),
            now_ms=client.clock.physical_now_ms(),
            zone_less=None,
            zone_less_refusal=(
                " is not read by format('metastore'): Spark reads one in the session time zone "
                "(spark.sql.session.timeZone), which a Python data source cannot see"
            ),
        ),
        text,
    )


# An AS OF below this (HLC of 2000-01-01T00:00:00Z) names a time before any cluster existed:
# almost surely epoch seconds, milliseconds or microseconds (Iceberg's `as-of-timestamp` takes
# epoch milliseconds) read as an HLC integer, which would answer TABLE_NOT_FOUND "at 1970-...".
AS_OF_HLC_MIN: int = 946_684_800_000 << 16


def check_as_of(ts: int, given: object) -> int:
    """`ts` (parsed from `given`) if it can be a cluster's timestamp, else TimestampParseError
    (a ValueError) saying which epoch time `given` looks like and how to pass it."""
    if ts >= AS_OF_HLC_MIN:
        return ts
    from hlc import ACCEPTED_FORMS, TimestampParseError, make_ts, to_iso

    # The epoch unit the value reads as: seconds below 1e11 (year 5138), then milliseconds
    # below 1e14, then microseconds.
    if ts < 10**11:
        unit, epoch_ms = "seconds", ts * 1000
    elif ts < 10**14:
        unit, epoch_ms = "milliseconds", ts
    else:
        unit, epoch_ms = "microseconds", ts // 1000
    meant = make_ts(epoch_ms)
    raise TimestampParseError(
        text=str(given)[:64],
        reason=(
            f"as an HLC integer it is {to_iso(ts)}, before any cluster existed; read as epoch "
            f"{unit} it is {to_iso(meant)}: pass that as ISO-8601 ({to_iso(meant)!r}) or as "
            f"the HLC integer {meant} (epoch milliseconds << 16)"
        ),
        accepted=ACCEPTED_FORMS,
    )


def _arrow_schema(columns: list[dict[str, Any]]) -> pa.Schema:
    """The Arrow schema of the wire `columns`, as the shared reader builds it (Spark's own Arrow
    mapping, computed without a Spark session: PySpark's `to_arrow_type` needs the session's
    time zone for TIMESTAMP)."""
    from metastore.client.parquet import PinnedColumn, arrow_schema

    return arrow_schema([PinnedColumn.from_wire(c) for c in columns])


@dataclass(frozen=True)
class FilePartition(InputPartition):
    path: str


@dataclass(frozen=True)
class FilesPartition(InputPartition):
    """Several files read by one task, in commit order: a table with many manifests is read by
    about one task per manifest, not one per file."""

    paths: tuple[str, ...]


# A read with at least this many manifests reads its files in that many tasks (about a
# manifest's worth of files each); fewer, one task per file. The manifests themselves are
# expanded where the read is planned, never in the tasks: a path committed again sits in two
# manifests (or one and the loose entries), and only a reader that sees every entry together
# can list it once (`metastore.manifests.first_indexes`), as every other reader does.
EXECUTOR_EXPAND_MANIFESTS_MIN = 8


class MetastoreReader(DataSourceReader):
    def __init__(
        self,
        *,
        files: list[str],
        columns: list[dict[str, Any]],
        groups: list[tuple[str, ...]] | None = None,
    ) -> None:
        self.files = files
        self.columns = columns
        self.groups = groups or []

    def partitions(self) -> list[InputPartition]:
        planned: list[InputPartition] = [
            *(FilesPartition(paths) for paths in self.groups),
            *(FilePartition(path) for path in self.files),
        ]
        # No files (a table without commits, or only appends of no rows): one task reading
        # none. Spark would put a partition of its own (`InputPartition(None)`) in place of
        # an empty list, which `read` does not know.
        return planned or [FilesPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # The reader `metastore table read` uses too: columns by field id, widened types
        # cast, DEFAULTs for rows of older files, a batch of the file in memory at a time.
        from metastore.client.parquet import AmbiguousColumnError, PinnedColumn, file_batches

        columns = [PinnedColumn.from_wire(c) for c in self.columns]
        if isinstance(partition, FilesPartition):
            paths = list(partition.paths)
        elif isinstance(partition, FilePartition):
            paths = [partition.path]
        else:
            raise TypeError(f"unexpected partition {partition!r}")
        for path in paths:
            try:
                yield from file_batches(path, columns)
            except AmbiguousColumnError as exc:
                # A file without field ids two of whose columns one pinned column matches by
                # name: the typed error naming the file and the columns (Spark reports the
                # task's exception), as the bridge raises it.
                raise exc.typed() from exc


def _fill(column: dict[str, Any], arrow_type: pa.DataType, rows: int) -> pa.Array:
    """A write-only column the DataFrame does not carry: its DEFAULT, else NULL."""
    import pyarrow as pa

    if column.get("default") is not None:
        from metastore.client.defaults import default_array

        return default_array(str(column["default"]), arrow_type, rows)
    return pa.nulls(rows, type=arrow_type)


def _source_arrow_type(dtype: Any) -> pa.DataType:
    """The Arrow type of a DataFrame's Spark type, as Spark's Arrow conversion maps it (the
    metastore's types as `metastore.client.parquet.arrow_type` maps them; a bare `lit(None)`
    is Arrow's null type), every nested field nullable: the DataFrame's own nullability is not
    a promise the rows are checked against (the pinned NOT NULL ones are, `_check_nulls`)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    primitives: list[tuple[type, pa.DataType]] = [
        (T.BooleanType, pa.bool_()),
        (T.ByteType, pa.int8()),
        (T.ShortType, pa.int16()),
        (T.IntegerType, pa.int32()),
        (T.LongType, pa.int64()),
        (T.FloatType, pa.float32()),
        (T.DoubleType, pa.float64()),
        (T.StringType, pa.string()),
        (T.CharType, pa.string()),
        (T.VarcharType, pa.string()),
        (T.BinaryType, pa.binary()),
        (T.DateType, pa.date32()),
        (T.TimestampNTZType, pa.timestamp("us")),
        (T.TimestampType, pa.timestamp("us", tz="UTC")),
        (T.NullType, pa.null()),
    ]
    for spark, arrow in primitives:
        if isinstance(dtype, spark):
            return arrow
    if isinstance(dtype, T.DecimalType):
        return pa.decimal128(dtype.precision, dtype.scale)
    if isinstance(dtype, T.ArrayType):
        return pa.list_(pa.field("element", _source_arrow_type(dtype.elementType)))
    if isinstance(dtype, T.MapType):
        return pa.map_(_source_arrow_type(dtype.keyType), _source_arrow_type(dtype.valueType))
    if isinstance(dtype, T.StructType):
        return pa.struct([pa.field(f.name, _source_arrow_type(f.dataType)) for f in dtype.fields])
    # `conform_plan` refused any type no pinned type widens from before a task ran.
    raise TypeError(f"no Arrow type for the DataFrame's {dtype.simpleString()}")


def _conformed(values: pa.Array, target: pa.DataType) -> pa.Array:
    """`values` (of the DataFrame's type) as the pinned Arrow type `target`, as Spark's cast
    makes them: a struct's fields by position (under the pinned names, which `conform_plan`
    checked match case-insensitively), arrays and maps element by element, a leaf cast (only
    the widenings the plan allowed reach here). A NULL stays NULL at every level; NOT NULL
    fields are checked afterwards (`_check_nulls`), so they are built without a check here."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if values.type == target:
        return values
    if pa.types.is_null(values.type):
        return pa.nulls(len(values), type=target)
    mask = values.is_null() if values.null_count else None
    if pa.types.is_struct(target):
        fields = [target.field(i) for i in range(target.num_fields)]
        children = [_conformed(values.field(i), f.type) for i, f in enumerate(fields)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if pa.types.is_map(target):
        return pa.MapArray.from_arrays(
            values.offsets,
            _conformed(values.keys, target.key_type),
            _conformed(values.items, target.item_type),
            type=target,
            mask=mask,
        )
    if pa.types.is_list(target):
        return pa.ListArray.from_arrays(
            values.offsets, _conformed(values.values, target.value_type), type=target, mask=mask
        )
    return pc.cast(values, target)


def _check_lengths(table: pa.Table, columns: list[dict[str, Any]], name: str) -> pa.Table:
    """`table` with its VARCHAR(n) and CHAR(n) values conformed as Spark conforms a table write
    (the DataFrame carries those columns as STRING): trailing spaces beyond n are trimmed to n
    ('ab   ' is stored 'ab ' in a VARCHAR(3)), anything else beyond n is refused (fail the task,
    so the job commits nothing), and CHAR(n) values shorter than n are padded with spaces to n
    ('a' is stored 'a  ' in a CHAR(3)). At the top level and inside structs, arrays and maps
    (keys too), as Spark does. Measured with pyspark 4 (nested: 4.3)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from metastore import types as M
    from metastore.client.nested_values import map_strings

    def conformed(values: pa.Array, dtype: M.VarcharType | M.CharType, path: str) -> pa.Array:
        length = int(dtype.length)
        if not len(values):
            return values
        kept = pc.utf8_length(pc.utf8_rtrim(values, characters=" "))
        longest = pc.max(kept).as_py()
        if longest is not None and longest > length:
            # The typed error the bridge's write raises for it too.
            from spark_bridge.conform import value_too_long_error

            raise value_too_long_error(name, path, length, longest=longest)
        kept_values = pc.utf8_slice_codeunits(values, 0, length)
        if isinstance(dtype, M.CharType):
            # CHAR(n) is padded with spaces to n, as Spark stores it ('a' is 'a  ' in a
            # CHAR(3), a filled DEFAULT too); NULL stays NULL. VARCHAR(n) is not padded.
            kept_values = pc.utf8_rpad(kept_values, width=length, padding=" ")
        return kept_values

    def equal_keys(path: str, key_type: M.DataType, key: object) -> None:
        from spark_bridge.conform import equal_map_keys_error

        raise equal_map_keys_error(name, path, key_type.to_sql(), None if key is None else str(key))

    # Map keys equal once conformed ('a' and 'a ' in a MAP<CHAR(3), ...>): refused, as Spark's
    # table write refuses them (DUPLICATED_MAP_KEY), or the last one kept under LAST_WIN.
    last_key_wins = _map_key_dedup_policy() == "LAST_WIN"
    arrays = list(table.columns)
    for i, c in enumerate(columns):
        arrays[i] = map_strings(
            arrays[i],
            M.parse_type(str(c["type"])),
            conformed,
            str(c["name"]),
            equal_keys=None if last_key_wins else equal_keys,
            last_key_wins=last_key_wins,
        )
    return pa.Table.from_arrays(arrays, schema=table.schema)


def _map_key_dedup_policy() -> str:
    """The `spark.sql.mapKeyDedupPolicy` of the query this task runs for (Spark hands the
    session's SQL settings set by the user to its tasks as local properties), else Spark's
    default, EXCEPTION."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty("spark.sql.mapKeyDedupPolicy") if context else None
    return str(value or "EXCEPTION").upper()


def _check_nulls(table: pa.Table, columns: list[dict[str, Any]], name: str) -> None:
    """Refuse (fail the task, so the job commits nothing) a batch carrying NULL into a NOT NULL
    column or NOT NULL nested field, naming its path as the bridge does (NotNullViolationError;
    Spark's table writes fail the same way). The DataFrame's own nullability is not asked for:
    a nullable column or field of clean values is written, as Spark writes it."""
    from metastore import types as M
    from metastore.client.nested_values import null_paths
    from spark_bridge.conform import NotNullViolationError, null_message

    for column, c in zip(table.columns, columns, strict=True):
        found = [str(c["name"])] if not c["nullable"] and column.null_count else []
        found += null_paths(column, M.parse_type(str(c["type"])), str(c["name"]))
        if found:
            path = found[0]
            raise NotNullViolationError(
                f"{null_message(name, path, top_level=path == c['name'])}: a row of the "
                "append carries NULL there; nothing was committed",
                table=name,
                field_path=path,
            )


@dataclass(frozen=True)
class WrittenFile(WriterCommitMessage):
    path: str
    size_bytes: int
    row_count: int


@dataclass(frozen=True)
class NoFileWritten(WriterCommitMessage):
    """A task that got no rows: it writes no file (a 0-row Parquet file would be committed,
    listed and opened by every reader for nothing)."""


def _file_wire(f: WrittenFile) -> dict[str, Any]:
    return {"path": f.path, "size_bytes": f.size_bytes, "row_count": f.row_count}


class MetastoreWriter(DataSourceArrowWriter):
    # The (stream, seq) of the commit's txn-id mark: set for a caller's `txn_id` option.
    txn_mark: tuple[str, int] | None = None

    def __init__(
        self,
        *,
        endpoints: list[str],
        token: str,
        table: str,
        table_id: int,
        version: int,
        location: str,
        columns: list[dict[str, Any]],
        overwrite: bool,
        not_before: int,
        txn_id: str | None = None,
        source_schema: StructType | None = None,
        session_id: str,
        session_ttl_ms: int,
        tls: ClientTls | None = None,
        loose_files_max: int | None = None,
        keeper_dir: str = "",
    ) -> None:
        """`columns` are the write columns of the pinned version; the rows are the DataFrame's,
        of `source_schema` (Spark's schema of it, as `writer()` got it; default: `columns`
        themselves), which each task conforms to `columns` by the bridge's rules
        (spark_bridge.conform `conform_plan`): columns by name, types widened, missing ones
        (write-only columns, say) filled with their DEFAULT, or NULL. After the commit, a table
        holding more than `loose_files_max` (default: the cluster's setting, 0: never) loose
        file entries is compacted.
        `session_id` is the write's own metastore session (`open_write_session`, TTL
        `session_ttl_ms`): the files go to its attempt directory, the tasks and the commit
        heartbeat it, and the commit or abort closes it. `keeper_dir` ("" for none) is the
        directory of the driver's session keeper that heartbeats it meanwhile (`keep` was
        called); the commit or abort stops that first."""
        self.session_id = session_id
        self.keeper_dir = keeper_dir
        # The commit ts a lookup found (`_committed_here`), for `_note_commit`.
        self._committed_ts = 0
        self.session_ttl_ms = session_ttl_ms
        self.loose_files_max = loose_files_max
        self.endpoints = endpoints
        self.token = token
        self.tls = tls
        self.table = table
        # The incarnation pinned when the write was planned: if the name is dropped and
        # re-created before the commit, the commit is refused instead of attaching these files
        # to the new table (whose field ids mean other columns).
        self.table_id = table_id
        self.version = version
        self.location = location
        self.columns = columns
        from spark_bridge.conform import conform_plan, pinned_struct

        self.source_schema = pinned_struct(columns) if source_schema is None else source_schema
        # Per write column, the index of the row value it is made from (None: filled). A
        # DataFrame that cannot be conformed was refused by `writer()` already.
        self.source_indexes = [
            step.source_index for step in conform_plan(self.source_schema, table, columns)
        ]
        self.overwrite = overwrite
        self.not_before = not_before
        # One id per logical write, made once on the driver side and carried (pickled) to the
        # commit, so a retried commit call dedupes. A caller that retries whole jobs passes its
        # own stable id with the "txn_id" write option.
        self.txn_id = txn_id or f"append:{table}:{uuid.uuid4()}"
        if txn_id:
            # The caller's own id may be run again long after (a job re-run the next day):
            # its commit carries the id's mark, which outlives the txn-id window
            # (metastore.client.txn_marks). A made-up id is never run again: no mark.
            from metastore.client.txn_marks import txn_mark

            self.txn_mark = txn_mark(txn_id, [table])
        # The session's attempt directory: GC's orphan scan leaves it alone while the session
        # lives, and the metastore refuses a commit of its files once it does not.
        self.rel_dir = f"_txn/{session_id}--append-{uuid.uuid4().hex[:12]}"
        # Named in every file of this append, all written with field ids: a reader reads one
        # of their footers for all (spark_bridge.files.field_id_group).
        self.write_job = str(uuid.uuid4())

    def _expired(self, cause: MetastoreError) -> SessionNotFoundError:
        from metastore.errors import SessionNotFoundError
        from metastore.limits import SESSION_TTL_MS_MAX
        from spark_bridge.keeper import ended_note

        details = {**cause.details, "session_id": self.session_id}
        keeper = ""
        if not self.keeper_dir:
            keeper = (
                "; no session keeper of the driver kept it: format('metastore') was registered "
                "in another process or host than the planner's (spark_bridge.keeper)"
            )
        elif (note := ended_note(Path(self.keeper_dir), self.session_id)) is not None:
            keeper = f"; the driver's session keeper stopped keeping it: {note}"
            details["keeper"] = note
        return SessionNotFoundError(
            f"the metastore session {self.session_id} of this format('metastore') append to "
            f"{self.table} ended (expired: nothing heartbeat it for {self.session_ttl_ms} ms, or "
            "closed) before its commit, so GC may have deleted its files as orphans; nothing "
            f"was committed{keeper}. Re-run the write; if the driver or the executors "
            "cannot reach the metastore for long, raise the TTL with "
            f".option('session_ttl_ms', ...) (at most {SESSION_TTL_MS_MAX}). ({cause})",
            details=details,
        )

    def _heartbeat(self, client: Any, *, strict: bool) -> None:
        """Keep the write's session alive. A session that ended raises (when `strict`) the
        typed error saying what to do; any other failure is logged: the heartbeat only keeps
        the session alive, the commit rule keeps the data safe."""
        import logging

        from metastore.errors import ErrorCode, MetastoreError

        try:
            client.session_heartbeat(self.session_id)
        except MetastoreError as exc:
            if strict and exc.code == ErrorCode.SESSION_NOT_FOUND:
                raise self._expired(exc) from exc
            logging.getLogger("spark_bridge").warning(
                "heartbeat of metastore session %s failed: %s", self.session_id, exc
            )
        except (OSError, ValueError) as exc:  # e.g. no TLS files on this host: not fatal
            logging.getLogger("spark_bridge").warning(
                "heartbeat of metastore session %s failed: %s", self.session_id, exc
            )

    def _end_session(self) -> None:
        """The commit or abort is done: stop the driver's keeper, then close the session (in
        that order, so the keeper never finds its session closed while it still keeps it)."""
        if self.keeper_dir:
            from spark_bridge.keeper import unkeep

            unkeep(Path(self.keeper_dir), self.session_id)
        self._close_session()

    def _close_session(self) -> None:
        import logging

        from metastore.errors import MetastoreError

        try:
            client = _client(self.endpoints, self.token, self.tls)
            try:
                client.session_close(self.session_id)
            finally:
                client.close()
        except (MetastoreError, OSError, ValueError) as exc:  # it expires after its TTL anyway
            logging.getLogger("spark_bridge").info(
                "closing metastore session %s: %s", self.session_id, exc
            )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """One task (on an executor): heartbeat the write's session when it starts (failing
        at once if the session ended: its commit would be refused), then every third of the
        TTL from a thread while it runs, and write one file into the session's directory (none
        when the task got no rows: `NoFileWritten`)."""
        import threading

        from metastore.errors import MetastoreError

        try:
            client = _client(self.endpoints, self.token, self.tls)
        except (MetastoreError, OSError, ValueError) as exc:
            import logging

            logging.getLogger("spark_bridge").warning(
                "no metastore client for heartbeats of session %s: %s", self.session_id, exc
            )
            return self._write_file(iterator)
        stop = threading.Event()
        beats = threading.Thread(
            target=self._beat_until, args=(client, stop), name="metastore-write-session"
        )
        beats.daemon = True
        try:
            self._heartbeat(client, strict=True)
            beats.start()
            return self._write_file(iterator)
        finally:
            stop.set()
            if beats.is_alive():
                beats.join(timeout=5)
            client.close()

    def _beat_until(self, client: Any, stop: Any) -> None:
        interval_s = max(1, self.session_ttl_ms // 3) / 1000
        while not stop.wait(interval_s):
            self._heartbeat(client, strict=False)

    def _write_file(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from metastore.client.parquet import filesystem
        from spark_bridge.files import job_file_name

        schema = _arrow_schema(self.columns)
        # The rows as Spark hands them over: Arrow batches of the DataFrame's columns, in its
        # order and types, a TIMESTAMP as its instant (in the session time zone; never as
        # PySpark's rows give it, a naive local datetime, which is one value for the two
        # instants of the hour a daylight-saving change repeats). Taken as Spark's Arrow
        # mapping of those types (a TIMESTAMP in UTC, strings not large), then each pinned
        # column selected (by the plan's index: names matched as Spark matches them) and cast
        # to the pinned type (a widening the plan allowed), or filled: the rules of the
        # bridge's `conform`, with pyarrow, per batch.
        source = pa.schema(
            [pa.field(f.name, _source_arrow_type(f.dataType)) for f in self.source_schema.fields]
        )
        batches = [batch for batch in iterator if batch.num_rows]
        if not batches:
            return NoFileWritten()
        # Built again from its values (every TIMESTAMP an aware UTC datetime by then, so
        # exact): Spark's batches hold NULL in the fields of a NULL struct, which a NOT NULL
        # field built from them (`_conformed`) would carry into the file, and pyarrow
        # refuses to write that; built from values, a NULL struct's fields hold none.
        given = pa.Table.from_pylist(
            pa.Table.from_batches(batches).cast(source).to_pylist(), schema=source
        )
        arrays = []
        for f, c, index in zip(schema, self.columns, self.source_indexes, strict=True):
            if index is None:
                arrays.append(_fill(c, f.type, given.num_rows))
            else:
                arrays.append(_conformed(given.column(index).combine_chunks(), f.type))
        table = pa.Table.from_arrays(arrays, schema=schema)
        table = _check_lengths(table, self.columns, self.table)
        _check_nulls(table, self.columns, self.table)
        rel = f"{self.rel_dir}/{job_file_name(self.write_job)}"
        # The file system the readers and the GC open: a `file://` location's path taken
        # literally (os calls on the URI text made a relative `file:` directory, and pyarrow's
        # own URI parsing percent-decodes the path or refuses it).
        fs, path = filesystem(f"{self.location.rstrip('/')}/{rel}")
        fs.create_dir(path.rpartition("/")[0], recursive=True)
        pq.write_table(table, path, filesystem=fs)
        size_bytes = int(fs.get_file_info(path).size or 0)
        return WrittenFile(path=rel, size_bytes=size_bytes, row_count=table.num_rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            self._commit(messages)
        finally:
            self._end_session()

    def _commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from metastore.errors import (
            BatchAlreadyCommittedError,
            RequestTimeoutError,
            SessionNotFoundError,
            TxnIdReusedError,
            UnavailableError,
        )
        from spark_bridge.session import not_applied

        files = [m for m in messages if isinstance(m, WrittenFile)]
        client = _client(self.endpoints, self.token, self.tls)
        try:
            # Not strict: a retried commit of a write already committed (its session since
            # closed) is deduplicated by the metastore; one that is not is refused there.
            self._heartbeat(client, strict=False)
            if self.txn_mark is not None and self._committed_here(client):
                # The caller's txn id already committed this append (a job run again, maybe
                # long past the txn-id window): done, nothing is sent. Looked up first since
                # the id's mark refuses a commit of another table only at or below its seq.
                self._note_commit(client)
                return
            args: dict[str, Any] = {
                "txn_id": self.txn_id,
                "not_before": self.not_before,
                "writes": [
                    {
                        "table": self.table,
                        "table_id": self.table_id,
                        "schema_version": self.version,
                        "add": [
                            {"path": f.path, "size_bytes": f.size_bytes, "row_count": f.row_count}
                            for f in files
                        ],
                        "remove": [],
                        "overwrite": self.overwrite,
                    }
                ],
            }
            if self.txn_mark is not None:
                args["stream"], args["seq"] = self.txn_mark
            try:
                client.call("commit", args)
            except SessionNotFoundError as exc:
                if exc.details.get("reason") == "attempt_session_not_live":
                    raise self._expired(exc) from exc
                raise
            except (TxnIdReusedError, BatchAlreadyCommittedError):
                # The same txn id committed other files (or its mark refused this commit): a
                # retried job whose earlier attempt committed. Done only if the committed
                # record of this id (or, past the txn-id window, its mark) says so
                # (linearizable), and wrote this table.
                if not self._committed_here(client):
                    raise
                self._note_commit(client)
                return
            except (UnavailableError, RequestTimeoutError) as exc:
                if not_applied(exc):
                    # No node ran this commit and none ever will (the client's verdict):
                    # nothing to look up on a cluster that just failed it, and no session to
                    # close to settle it.
                    raise self._not_applied(exc) from exc
                # The client ran out of nodes or time with the commit sent: it may have
                # committed. Failing the job then invites a re-run under a fresh txn id, which
                # appends the rows twice; so look it up first (linearizable), and settle it
                # when not found. Only a commit adding files can be settled (by its files'
                # session); one without (an append or overwrite of no rows) stays unknown.
                if not self._look_up(client):
                    if not files:
                        raise self._outcome_unknown(exc) from exc
                    self._settle(client, exc)
            self._note_commit(client)
            self._maybe_compact(client)
        finally:
            client.close()

    def _note_commit(self, client: Any) -> None:
        """Tell the driver's clients where this commit landed (spark_bridge.keeper
        `note_commit`): this runs in a worker process, and a bridge batch of the driver right
        after the append must not read below it (metastore.client.floors). Best effort: a
        driver without a keeper directory here (Spark Connect) is not covered, as before."""
        import logging

        if not self.keeper_dir:
            return
        cluster_id = client.cluster_id
        ts = max(client.own_writes_ts, self._committed_ts)
        if not cluster_id or ts <= 0:
            return
        from spark_bridge.keeper import note_commit

        try:
            note_commit(Path(self.keeper_dir), self.session_id, cluster_id=cluster_id, ts=ts)
        except OSError as exc:
            logging.getLogger("spark_bridge").warning(
                "cannot tell the driver where append %s committed: %s", self.txn_id, exc
            )

    def _look_up(self, client: Any) -> bool | None:
        """`_committed_here`, with None when the lookup itself failed (logged)."""
        import logging

        from metastore.errors import MetastoreError, TxnIdReusedError

        try:
            return self._committed_here(client)
        except TxnIdReusedError:
            raise  # found committed by a write of another table: nothing of this one
        except MetastoreError as lookup:
            logging.getLogger("spark_bridge").warning(
                "cannot look up txn %s after an unknown outcome: %s", self.txn_id, lookup
            )
            return None

    def _settle(self, client: Any, exc: MetastoreError) -> None:
        """Settle a commit with an unknown outcome that was not found committed (it may still
        be on its way to a leader): close the write's session first. Every added file lies in
        the session's attempt directory, and apply refuses a commit of such a file once the
        session is not live (metastore.leases `check_attempt_owners`), so once the close is
        acknowledged the commit either was applied before it or never will be, and a second
        lookup is the answer. Returns if it was applied; raises `exc` saying it was not (a
        re-run is then safe under any txn id), or, when the close or the lookup fails,
        `_outcome_unknown`."""
        import logging

        from metastore.errors import MetastoreError

        try:
            client.session_close(self.session_id)
        except MetastoreError as close_error:
            logging.getLogger("spark_bridge").warning(
                "closing session %s to settle txn %s failed: %s",
                self.session_id,
                self.txn_id,
                close_error,
            )
            raise self._outcome_unknown(exc) from exc
        found = self._look_up(client)
        if found:
            return
        if found is None:
            raise self._outcome_unknown(exc) from exc
        raise type(exc)(
            f"{exc.message}; the commit of this append (txn {self.txn_id!r}) was not "
            "committed: its session is closed now, so it can never commit. Re-running the "
            "write is safe",
            details={
                **exc.details,
                "txn_id": self.txn_id,
                "committed": False,
                "outcome_unknown": False,
            },
        ) from exc

    def _committed_here(self, client: Any) -> bool:
        """Whether this append's txn id is committed, by a commit of this table (a
        linearizable lookup). Raises TxnIdReusedError if a commit of other tables took the
        id: a txn id names one write, and reporting that commit as this one's would drop
        this append's rows without a word."""
        from metastore.commands import TableName
        from metastore.errors import MetastoreError, TxnIdReusedError

        if self.txn_mark is None:
            reply = client.committed_txn(self.txn_id)
        else:
            reply = client.committed_txn(self.txn_id, stream=self.txn_mark[0])
        record = reply.get("txn")
        if not isinstance(record, dict):
            if self.txn_mark is None:
                return False
            from metastore.client.txn_marks import mark_verdict

            # Older than the txn-id window: the id's mark tells (its seq hashes the table
            # set), or raises TxnIdReusedError for a mark of another table's write.
            found = mark_verdict(reply.get("stream_mark"), txn_id=self.txn_id, seq=self.txn_mark[1])
            if found is None:
                return False
            self._committed_ts = max(self._committed_ts, found)
            return True
        committed = record.get("tables")
        if not isinstance(committed, list):
            return True  # a reply without the tables: nothing to compare
        try:
            mine = str(TableName.parse(self.table))
        except MetastoreError:
            mine = self.table.lower()
        if [str(t) for t in committed] == [mine]:
            if type(record.get("ts")) is int:
                self._committed_ts = max(self._committed_ts, record["ts"])
            return True
        raise TxnIdReusedError(
            f"txn {self.txn_id!r} already committed at {record.get('ts')} writing "
            f"{[str(t) for t in committed]}, not this append to {self.table}: a txn id names one "
            "write; re-run it under a fresh txn id (nothing of it committed)",
            details={
                "txn_id": self.txn_id,
                "committed_ts": record.get("ts"),
                "committed_tables": [str(t) for t in committed],
                "table": self.table,
            },
        )

    def _not_applied(self, exc: MetastoreError) -> MetastoreError:
        """`exc` (a commit no node applied) saying how to re-run the job. The same txn id,
        as an earlier run under a caller's txn id may have committed: that one is then
        found, and a fresh id would append the rows twice."""
        return type(exc)(
            f"{exc.message}; the commit of this append (txn {self.txn_id!r}) was not applied "
            f"and never will be. Re-run the write with .option('txn_id', {self.txn_id!r}): "
            "a txn id commits at most once",
            details={**exc.details, "txn_id": self.txn_id, "outcome_unknown": False},
        )

    def _outcome_unknown(self, exc: MetastoreError) -> MetastoreError:
        """`exc` (a commit with an unknown outcome, not found committed) saying how to re-run
        the job safely: it may still commit, and only the same txn id commits at most once."""
        return type(exc)(
            f"{exc.message}; the commit of this append (txn {self.txn_id!r}) has an unknown "
            "outcome: it was not found committed but may still commit. Re-run the write with "
            f".option('txn_id', {self.txn_id!r}): a txn id commits at most once",
            details={**exc.details, "txn_id": self.txn_id},
        )

    def _maybe_compact(self, client: Any) -> None:
        """Compact the table if it passed the bound (metastore.manifests). The append already
        committed, so a failure is logged, never raised; the next append tries again."""
        import logging

        from metastore.client.manifest_files import compact_table
        from metastore.errors import MetastoreError

        if self.loose_files_max == 0:
            return
        try:
            view = client.call("compaction_view", {"table": self.table, "limit": 1})
            bound = self.loose_files_max
            if bound is None:
                bound = int(view["loose_files_max"])
            loose = int(view["total_loose"]) + int(view["total_deletes"])
            if bound > 0 and loose > bound:
                compact_table(client, self.table)
        except (MetastoreError, OSError) as exc:
            logging.getLogger("spark_bridge").warning(
                "automatic compaction of %s failed (the next append retries): %s", self.table, exc
            )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Nothing was committed: the files written so far (and any a straggler task still
        # writes) are referenced by no commit, so readers never see them; GC removes them
        # once the session is closed (and the grace has passed).
        self._end_session()


class MetastoreDataSource(DataSource):
    """Subclassed by `register()` with the connection settings as class attributes."""

    ENDPOINTS: list[str] = []
    TOKEN: str = ""
    TLS: ClientTls | None = None
    # The directory of the registering process's session keeper ("": none).
    KEEPER_DIR: str = ""

    @classmethod
    def name(cls) -> str:
        return "metastore"

    def _table(self) -> str:
        """The `table` option, or the path of `load("ns.table")` / `save("ns.table")` (Spark
        passes it as the `path` option), as format("iceberg") takes a table name."""
        table = self.options.get("table")
        path = self.options.get("path")
        if table and path and _table_key(str(path)) != _table_key(str(table)):
            raise TableOptionMismatchError(
                f"format('metastore') got .option('table', {str(table)!r}) and the path "
                f"{str(path)!r}, two different tables: nothing was read or written. Name the "
                "table once, with .option('table', ...) or as the path of load()/save()",
                table_option=str(table),
                path=str(path),
            )
        if not (table or path):
            # Also what saveAsTable(name), insertInto(name), writeTo(name).create() and
            # spark.table(name) of a Spark catalog table of provider metastore end in: Spark
            # hands a Python data source neither the name nor (for a catalog table) the
            # options it was written with (measured, pyspark 4.3), so the message says so.
            raise DataSourceOptionError(
                "format('metastore') got no table, so nothing was read or written: name it "
                "with .load('ns.table') / .mode('append').save('ns.table') or "
                ".option('table', 'ns.table'). saveAsTable(name), insertInto(name), "
                "writeTo(name) and spark.table(name) do not work with format('metastore'): "
                "Spark never hands a Python data source that name (it keeps it for its own "
                "catalog, spark_catalog); use save('ns.table'). A Spark catalog table of "
                "provider metastore (what a saveAsTable with a 'table' option leaves) holds "
                "nothing of the metastore: DROP TABLE it",
                option="table",
            )
        return str(table or path)

    def _pin(self) -> dict[str, Any]:
        pinned = getattr(self, "_pinned", None)
        if pinned is None:
            from metastore.client.not_found import created_after, created_tu_now
            from metastore.errors import TableNotFoundError

            table = self._table()  # a bad table option fails before any request
            client = _client(self.ENDPOINTS, self.TOKEN, self.TLS)
            try:
                ts = _resolve_ts(client, self.options.get("as_of"))
                try:
                    r = client.schema_at(table, ts=ts)
                except TableNotFoundError as exc:  # AS OF before it was created: say when
                    created_tu = created_tu_now(client, table)
                    raise created_after(exc, ts, created_tu, option="as_of") from None
                pinned = {"ts": ts, "schema": r, "now": int(client.clock.now())}
            finally:
                client.close()
            self._pinned = pinned
        return pinned

    def schema(self) -> StructType:
        from spark_bridge.conform import pinned_struct

        # Spark asks a write's data source for no schema (measured, pyspark 4.3): this is a read.
        check_option_names(self.options, write=False)

        return pinned_struct(self._pin()["schema"]["schema"]["columns"])

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark_bridge.files import absolute

        pin = self._pin()
        client = _client(self.ENDPOINTS, self.TOKEN, self.TLS)
        try:
            r = client.files(self._table(), as_of=pin["ts"], expand=False)  # follows pages
            location = str(r.get("location") or pin["schema"].get("location") or "")
            manifests = len(r.get("manifests") or [])
            if manifests:
                from metastore.client.manifest_files import expand_reply

                # sha256-checked, each path once (`first_indexes`)
                r = expand_reply({**r, "location": location})
        finally:
            client.close()
        files = [absolute(location, f["path"]) for f in r["files"]]
        columns = pin["schema"]["schema"]["columns"]
        if manifests < EXECUTOR_EXPAND_MANIFESTS_MIN:
            return MetastoreReader(files=files, columns=columns)
        size = max(1, -(-len(files) // manifests))  # about a manifest's worth per task
        groups = [tuple(files[i : i + size]) for i in range(0, len(files), size)]
        return MetastoreReader(files=[], columns=columns, groups=groups)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_bridge.conform import SchemaMismatchError, conform_plan, write_columns

        check_option_names(self.options, write=True)
        if self.options.get("as_of") not in (None, ""):
            # A write lands now (at a commit timestamp above every commit so far), under the
            # schema in force then: "as of" a past time it would be written under that time's
            # schema, and read back under another one. Refused before anything is asked.
            raise DataSourceOptionError(
                f"format('metastore') got .option('as_of', {str(self.options['as_of'])!r}) on "
                f"a write to {self._table()}: an append or overwrite commits now, under the "
                "schema in force now, never as of a past time; nothing was written. Remove the "
                "as_of option from the write (it is for reads: spark.read.format('metastore'))",
                option="as_of",
            )
        pin = self._pin()
        pinned = pin["schema"]
        # The write columns are the public ones, then the write-only ones (if any).
        columns = write_columns(pinned)
        # Spark hands over the DataFrame's own schema (its order, names and types; measured,
        # pyspark 4.3) and the rows in it: checked here by the bridge's rules (columns by name,
        # types widened only as the evolution rules allow, missing ones filled), before any
        # session opens; each task then conforms its rows by the same plan.
        try:
            plan = conform_plan(schema, self._table(), columns)
        except SchemaMismatchError as exc:
            raise SchemaMismatchError(
                f"DataFrame schema {schema.simpleString()} does not match {self._table()} "
                f"v{pinned['version']}: {exc}; nothing was written"
            ) from exc
        # Evaluate the fills now, on the driver side: a DEFAULT this writer cannot evaluate
        # fails the job before any task runs.
        fills = _arrow_schema(columns)
        for f, step in zip(fills, plan, strict=True):
            if step.source is None and step.default is not None:
                from metastore.client.defaults import existence_default

                existence_default(step.default, f.type)
        # Above the pin too: a write's pin (never an explicit AS OF, refused above) may be at
        # the leader's read_ts, above this clock (a commit lands up to DD past its Tm), and the
        # version found active there must be active at the commit's ts.
        commit_floor = max(int(pin["now"]), int(pin["ts"]))
        txn_id = self.options.get("txn_id")
        # Every option is read before the session opens: a bad one fails the planning with
        # nothing to release (Spark calls neither commit nor abort for a writer it never got).
        loose_max = _int_option(self.options, "loose_files_max")
        ttl = _int_option(self.options, "session_ttl_ms")
        keep_max_ms = _int_option(self.options, "keep_max_ms")
        if loose_max is not None and loose_max < 0:
            raise DataSourceOptionError(
                f"option 'loose_files_max' must be 0 (never compact) or more, not {loose_max}; "
                "nothing was written",
                option="loose_files_max",
            )
        from metastore.limits import SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN

        if ttl is not None and not SESSION_TTL_MS_MIN <= ttl <= SESSION_TTL_MS_MAX:
            # Refused here, naming the option: the metastore's refusal names its `ttl_ms`.
            raise DataSourceOptionError(
                f"option 'session_ttl_ms' must be in {SESSION_TTL_MS_MIN}..{SESSION_TTL_MS_MAX} "
                f"(milliseconds), not {ttl}; nothing was written",
                option="session_ttl_ms",
            )
        if keep_max_ms is not None and keep_max_ms <= 0:
            raise DataSourceOptionError(
                f"option 'keep_max_ms' must be a positive number of milliseconds, not "
                f"{keep_max_ms}; nothing was written",
                option="keep_max_ms",
            )
        client = _client(self.ENDPOINTS, self.TOKEN, self.TLS)
        try:
            session_id, ttl_ms = open_write_session(
                client,
                table=self._table(),
                ttl_ms=WRITE_SESSION_TTL_MS_DEFAULT if ttl is None else ttl,
            )
        finally:
            client.close()
        keeper_dir = ""
        try:
            keeper_dir = self._keep(
                session_id, ttl_ms, keep_max_ms=keep_max_ms or APPEND_KEEP_MS_DEFAULT
            )
            return MetastoreWriter(
                keeper_dir=keeper_dir,
                session_id=session_id,
                session_ttl_ms=ttl_ms,
                endpoints=self.ENDPOINTS,
                token=self.TOKEN,
                tls=self.TLS,
                table=self._table(),
                table_id=int(pinned["table_id"]),
                version=int(pinned["version"]),
                location=str(pinned.get("location") or ""),
                columns=columns,
                overwrite=overwrite,
                not_before=commit_floor + 1,
                txn_id=str(txn_id) if txn_id else None,
                source_schema=schema,
                loose_files_max=loose_max,
            )
        except BaseException:
            # Spark never gets this writer, so it calls neither commit nor abort: released
            # here, else the driver's keeper would heartbeat the session for its keep_max_ms.
            _release_write_session(self, session_id, keeper_dir)
            raise

    def _keep(
        self, session_id: str, ttl_ms: int, *, keep_max_ms: int = APPEND_KEEP_MS_DEFAULT
    ) -> str:
        """Have the driver's session keeper heartbeat the append's session until its commit or
        abort (for at most `keep_max_ms`): its directory, or "" when it cannot be reached from
        here (the append is then kept by its tasks and commit only, as the warning says)."""
        if not self.KEEPER_DIR:
            return ""
        import logging

        from spark_bridge.keeper import keep

        try:
            keep(
                Path(self.KEEPER_DIR),
                session_id,
                ttl_ms=ttl_ms,
                table=self._table(),
                keep_max_ms=keep_max_ms,
            )
        except OSError as exc:
            logging.getLogger("spark_bridge").warning(
                "the session keeper of the process that registered format('metastore') is not "
                "reachable from this planner (%s): the session of this append to %s is kept "
                "alive by its tasks only, so a stage before the write longer than its TTL "
                "(%d ms) fails the job",
                exc,
                self._table(),
                ttl_ms,
            )
            return ""
        return self.KEEPER_DIR


def _table_key(name: str) -> str:
    """`name` as the metastore resolves it (case-insensitively), to tell whether two spellings
    name one table; a name it would refuse stays as given, lower-cased."""
    from metastore.commands import TableName
    from metastore.errors import MetastoreError

    try:
        return str(TableName.parse(name))
    except MetastoreError:
        return name.lower()


def _int_option(options: Any, name: str) -> int | None:
    """The integer write option `name`, None when not given; DataSourceOptionError (a
    ValueError) naming it if not one."""
    value = options.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DataSourceOptionError(
            f"option {name!r} must be an integer, not {value!r}; nothing was written",
            option=name,
        ) from None


def _release_write_session(source: MetastoreDataSource, session_id: str, keeper_dir: str) -> None:
    """Stop keeping and close the session of an append whose planning failed after it opened.
    Never raises: the session would expire after its TTL anyway."""
    import logging

    from metastore.errors import MetastoreError

    if keeper_dir:
        from spark_bridge.keeper import unkeep

        unkeep(Path(keeper_dir), session_id)
    try:
        client = _client(source.ENDPOINTS, source.TOKEN, source.TLS)
        try:
            client.session_close(session_id)
        finally:
            client.close()
    except (MetastoreError, OSError, ValueError) as exc:
        logging.getLogger("spark_bridge").info("closing metastore session %s: %s", session_id, exc)


def open_write_session(client: Any, *, table: str, ttl_ms: int) -> tuple[str, int]:
    """Open a fresh metastore session for one append (on the driver side, when it is planned):
    (its id, its TTL in ms). A session id is never reused, so a session that ended (and whose
    directory GC may have cleared) never becomes live again. An open whose outcome is unknown
    is closed before its error is raised, once it settled (spark_bridge.session
    `close_unknown_open`: the failure takes UNKNOWN_OPEN_SETTLE_MS longer)."""
    import getpass
    import os
    import socket
    import time

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    from metastore.errors import MetastoreError
    from spark_bridge.session import close_unknown_open, open_outcome_unknown

    session_id = uuid.uuid4().hex
    try:
        r = client.session_open(
            session_id,
            app_id="spark-datasource",
            app_name=f"format('metastore') append to {table}"[:256],
            host=socket.gethostname()[:256],
            user=user[:256],
            pid=os.getpid(),
            started_at_ms=int(time.time() * 1000),
            ttl_ms=ttl_ms,
        )
    except MetastoreError as exc:
        if open_outcome_unknown(exc):
            # It may have been opened: nothing would heartbeat or close it, so it would stay
            # listed, counted against MAX_SESSIONS and sparing its directory until its TTL.
            # Closed before the error is raised (no thread here outlives the planning).
            close_unknown_open(client, session_id)
        raise
    return session_id, int(r.get("ttl_ms") or ttl_ms)


# The session keepers of this process, one per (endpoints, token, TLS options) registered.
_KEEPERS: dict[tuple[tuple[str, ...], str, str], SessionKeeper] = {}
_KEEPERS_LOCK = threading.Lock()


def _session_keeper(endpoints: list[str], token: str, tls: ClientTls | None) -> SessionKeeper:
    """This process's session keeper for these settings, started at the first call."""
    from spark_bridge.keeper import SessionKeeper

    key = (tuple(endpoints), token, repr(tls))
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(key)
        if keeper is None or not keeper.alive():
            keeper = SessionKeeper(lambda: _client(list(endpoints), token, tls))
            _KEEPERS[key] = keeper
        return keeper


def stop_session_keepers() -> None:
    """Stop the session keepers `register()` started in this process (they are daemon threads,
    also stopped at exit): appends still running are then kept by their tasks only."""
    with _KEEPERS_LOCK:
        keepers = list(_KEEPERS.values())
        _KEEPERS.clear()
    for keeper in keepers:
        keeper.stop()


def register(
    spark: SparkSession, *, endpoints: list[str], token: str, tls: ClientTls | None = None
) -> None:
    """Register format("metastore") on `spark`, talking to this cluster with this token (and
    these TLS options, for clusters whose client ports speak TLS). Starts this process's
    session keeper for these settings (spark_bridge.keeper), which heartbeats the sessions of
    appends from their planning to their commit: call it in the application's driver
    process."""
    keeper = _session_keeper(list(endpoints), token, tls)
    source = type(
        "ConfiguredMetastoreDataSource",
        (MetastoreDataSource,),
        {
            "ENDPOINTS": list(endpoints),
            "TOKEN": token,
            "TLS": tls,
            "KEEPER_DIR": str(keeper.directory),
        },
    )
    spark.dataSource.register(source)
