"""The one Parquet reader (metastore.client.parquet) as both of its users drive it: the CLI's
`read_rows` (a row limit over many files) and the data source's `MetastoreReader.read` (whole
files, one per Spark task). Same rules for both: columns by field id, widened types cast,
DEFAULTs for rows of files older than the column, bounded batches, typed errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metastore.client.java_lower import java_lower_root
from metastore.client.parquet import (
    FIELD_ID_KEY,
    READ_BATCH_ROWS_MAX,
    AmbiguousColumnError,
    DataFileNotFoundError,
    DataFileUnreadableError,
    DataReadError,
    PinnedColumn,
    UnsupportedSchemaError,
    file_batches,
    read_rows,
)
from metastore.errors import InvalidArgumentError, ValueTooLongError
from tests.client.spark_task import write_file_of_rows

ROWS: Final = READ_BATCH_ROWS_MAX * 2 + 5
# Wire columns (the protocol's `schema.columns`): `id` was INT when the file was written and
# renamed from `key`; `n` was added later with a DEFAULT; `s` was added later without one.
WIRE_COLUMNS: Final = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {"field_id": 2, "name": "n", "type": "INT", "nullable": True, "default": "40 + 2"},
    {"field_id": 3, "name": "s", "type": "STRING", "nullable": True},
]


def write(path: Path, columns: dict[str, tuple[pa.DataType, int | None, list[Any]]]) -> str:
    fields = [
        pa.field(name, t, metadata=None if fid is None else {FIELD_ID_KEY: str(fid).encode()})
        for name, (t, fid, _) in columns.items()
    ]
    arrays = [pa.array(values, type=t) for t, _, values in columns.values()]
    pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), path)
    return str(path)


@pytest.fixture
def old_file(tmp_path: Path) -> str:
    return write(tmp_path / "old.parquet", {"key": (pa.int32(), 1, list(range(ROWS)))})


def expected(rows: int) -> list[dict[str, Any]]:
    return [{"id": i, "n": 42, "s": None} for i in range(rows)]


def test_whole_file_in_bounded_batches(old_file: str) -> None:
    columns = [PinnedColumn.from_wire(c) for c in WIRE_COLUMNS]
    batches = list(file_batches(old_file, columns))
    assert all(b.num_rows <= READ_BATCH_ROWS_MAX for b in batches)
    assert len(batches) == 3
    assert pa.Table.from_batches(batches).to_pylist() == expected(ROWS)


def test_rows_wanted_stops_inside_a_batch(old_file: str) -> None:
    columns = [PinnedColumn.from_wire(c) for c in WIRE_COLUMNS]
    batches = list(file_batches(old_file, columns, rows_wanted=3))
    assert pa.Table.from_batches(batches).to_pylist() == expected(3)


def test_a_file_of_only_later_columns_reads_defaults_in_bounded_batches(tmp_path: Path) -> None:
    path = write(tmp_path / "gone.parquet", {"gone": (pa.int64(), 9, [0] * ROWS)})
    columns = [PinnedColumn.from_wire(c) for c in WIRE_COLUMNS[1:]]
    batches = list(file_batches(path, columns))
    assert [b.num_rows for b in batches] == [READ_BATCH_ROWS_MAX, READ_BATCH_ROWS_MAX, 5]
    assert batches[0].to_pylist()[0] == {"n": 42, "s": None}


def test_cli_and_data_source_read_the_same_rows(old_file: str, tmp_path: Path) -> None:
    # The data source's task reader, driven without a JVM (its `read` is plain Python).
    from spark_bridge.datasource import FilePartition, MetastoreReader

    reader = MetastoreReader(files=[old_file], columns=list(WIRE_COLUMNS))
    via_spark_task = pa.Table.from_batches(list(reader.read(FilePartition(old_file))))
    columns = [PinnedColumn.from_wire(c) for c in WIRE_COLUMNS]
    via_cli = read_rows(str(tmp_path), [{"path": "old.parquet"}], columns, limit=ROWS).rows
    assert via_spark_task.to_pylist() == via_cli.to_pylist() == expected(ROWS)
    assert via_spark_task.schema == via_cli.schema


@pytest.mark.parametrize("limit", [0, -1, True, "5"])
def test_bad_limit_is_a_typed_error(old_file: str, limit: Any) -> None:
    columns = [PinnedColumn.from_wire(c) for c in WIRE_COLUMNS]
    with pytest.raises(InvalidArgumentError, match="limit"):
        read_rows("/x", [{"path": "old.parquet"}], columns, limit=limit)
    with pytest.raises(InvalidArgumentError, match="rows_wanted"):
        list(file_batches(old_file, columns, rows_wanted=limit))


def test_failures_are_typed_and_name_the_file(tmp_path: Path) -> None:
    columns = [PinnedColumn.from_wire(c) for c in WIRE_COLUMNS]
    missing = str(tmp_path / "missing.parquet")
    with pytest.raises(DataFileNotFoundError) as not_found:
        list(file_batches(missing, columns))
    assert not_found.value.path == missing and not_found.value.code == "DATA_FILE_NOT_FOUND"

    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet")
    with pytest.raises(DataFileUnreadableError, match=r"garbage\.parquet"):
        list(file_batches(str(garbage), columns))

    bad_id = tmp_path / "bad_id.parquet"
    field = pa.field("id", pa.int64(), metadata={FIELD_ID_KEY: b"one"})
    pq.write_table(pa.table([pa.array([1])], schema=pa.schema([field])), bad_id)
    with pytest.raises(DataFileUnreadableError, match="malformed field id"):
        list(file_batches(str(bad_id), columns))

    text = write(tmp_path / "text.parquet", {"id": (pa.string(), 1, ["x"])})
    with pytest.raises(DataFileUnreadableError, match="cannot be read as id int64"):
        list(file_batches(text, columns))

    unknowable = [
        PinnedColumn(field_id=7, name="d", type_sql="DATE", nullable=True, default_sql="now()")
    ]
    with pytest.raises(UnsupportedSchemaError, match="now"):
        list(file_batches(text, unknowable))
    # One base class for the CLI to map.
    assert issubclass(UnsupportedSchemaError, DataReadError)


SPARK_TYPES: Final = [
    "BOOLEAN",
    "TINYINT",
    "SMALLINT",
    "INT",
    "BIGINT",
    "FLOAT",
    "DOUBLE",
    "STRING",
    "BINARY",
    "DATE",
    "TIMESTAMP",
    "TIMESTAMP_NTZ",
    "DECIMAL(12,2)",
    "VARCHAR(5)",
    "CHAR(3)",
    "ARRAY<STRING>",
    "MAP<STRING, BIGINT>",
    "STRUCT<k: BIGINT, v: STRING NOT NULL>",
    "ARRAY<STRUCT<a: INT>>",
    "MAP<STRING, ARRAY<INT>>",
]


def test_arrow_types_are_sparks_own_mapping() -> None:
    """The batches the data source hands Spark have the types PySpark's own Arrow conversion
    gives the pinned struct (TIMESTAMP in UTC, as Spark's Arrow batches carry instants)."""
    from pyspark.sql.pandas.types import to_arrow_type

    from metastore.client.parquet import arrow_schema
    from spark_bridge.conform import pinned_struct

    wire = [
        {"field_id": i + 1, "name": f"c{i}", "type": t, "nullable": i % 2 == 0}
        for i, t in enumerate(SPARK_TYPES)
    ]
    ours = arrow_schema([PinnedColumn.from_wire(c) for c in wire])
    for field, spark_field in zip(ours, pinned_struct(wire).fields, strict=True):
        spark_type = to_arrow_type(spark_field.dataType, timezone="UTC")
        assert field.type.equals(spark_type), (field, spark_type)
        assert field.nullable == spark_field.nullable


def _write_in_zone(monkeypatch: pytest.MonkeyPatch, zone: str, writer: Any, rows: list[Any]) -> Any:
    """One write task of `rows` (as Spark's Arrow batches of them, session time zone `zone`) on
    a worker whose local time zone is `zone`; its commit message."""
    import time

    from tests.client.spark_task import run_write_task, spark_batches

    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        batches = spark_batches(rows, writer.source_schema, time_zone=zone)
        return run_write_task(writer, batches, writer.source_schema)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_the_data_source_writer_stores_instants_whatever_the_local_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task on a worker and in a session in Tokyo stores the instants Spark hands it (as
    PySpark's rows, naive datetimes in the worker's local time, pyarrow would take them for
    UTC)."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    from tests.client.offline_writer import offline_writer

    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "at", "type": "TIMESTAMP", "nullable": True},
    ]
    writer = offline_writer(str(tmp_path), columns)
    # 10:00 UTC, 19:00 in Tokyo (UTC+9, no daylight saving).
    at = dt.datetime(2026, 11, 22, 19, 0, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    rows_in = [{"id": 1, "at": at}, {"id": 2, "at": None}]
    written = _write_in_zone(monkeypatch, "Asia/Tokyo", writer, rows_in)
    pinned = [PinnedColumn.from_wire(c) for c in columns]
    rows = read_rows(str(tmp_path), [{"path": written.path}], pinned, limit=5).rows.to_pylist()
    assert rows == [
        {"id": 1, "at": dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.UTC)},
        {"id": 2, "at": None},
    ]


def test_the_data_source_writer_stores_nested_instants_whatever_the_local_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a TIMESTAMP inside a struct, an array and a map (as key and as value): the
    writer converted only top-level values, so a nested one was stored as if its local wall
    time were UTC (hours off on any worker not running in UTC)."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    from pyspark.sql import Row

    from tests.client.offline_writer import offline_writer

    local_wall_time = dt.datetime(2026, 11, 22, 19, 0, 0)  # a TIMESTAMP_NTZ: a wall time
    tokyo = local_wall_time.replace(tzinfo=ZoneInfo("Asia/Tokyo"))  # 10:00 UTC
    utc = dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.UTC)
    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {
            "field_id": 2,
            "name": "s",
            "type": "STRUCT<at: TIMESTAMP, ntz: TIMESTAMP_NTZ, xs: ARRAY<TIMESTAMP>>",
            "nullable": True,
        },
        {"field_id": 3, "name": "a", "type": "ARRAY<TIMESTAMP>", "nullable": True},
        {"field_id": 4, "name": "m", "type": "MAP<TIMESTAMP, TIMESTAMP>", "nullable": True},
    ]
    writer = offline_writer(str(tmp_path), columns)
    nested = Row(at=tokyo, ntz=local_wall_time, xs=[tokyo, None])
    rows_in = [
        Row(id=1, s=nested, a=[tokyo], m={tokyo: tokyo}),
        Row(id=2, s=None, a=None, m=None),
    ]
    written = _write_in_zone(monkeypatch, "Asia/Tokyo", writer, rows_in)
    read = pq.read_table(tmp_path / written.path).to_pylist()
    assert read[0]["s"] == {"at": utc, "ntz": local_wall_time, "xs": [utc, None]}
    assert read[0]["a"] == [utc]
    assert read[0]["m"] == [(utc, utc)]
    assert read[1] == {"id": 2, "s": None, "a": None, "m": None}


def test_the_data_source_writer_stores_instants_of_the_hour_daylight_saving_repeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker in a zone with daylight saving sees the hour after the clocks go back twice:
    as naive local datetimes (PySpark's rows) the two instants of 01:30 are one value, and
    the writer stored the second as the first, an hour early, top-level and nested. Spark's
    Arrow batches carry the instants themselves."""
    import datetime as dt

    from tests.client.offline_writer import offline_writer

    # St. John's leaves daylight saving on 2026-11-01 at 02:00 NDT (UTC-2:30) for 01:00 NST
    # (UTC-3:30): 01:30 is 04:00 UTC and again 05:00 UTC.
    first, second = (dt.datetime(2026, 11, 1, h, 0, tzinfo=dt.UTC) for h in (4, 5))
    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "at", "type": "TIMESTAMP", "nullable": True},
        {"field_id": 3, "name": "s", "type": "STRUCT<at: TIMESTAMP>", "nullable": True},
    ]
    writer = offline_writer(str(tmp_path), columns)
    rows = [{"id": i, "at": at, "s": {"at": at}} for i, at in enumerate((first, second))]
    written = _write_in_zone(monkeypatch, "America/St_Johns", writer, rows)
    read = pq.read_table(tmp_path / written.path).to_pylist()
    assert [(r["at"], r["s"]["at"]) for r in read] == [(first, first), (second, second)]


def test_char_values_read_padded_as_spark_reads_them(tmp_path: Path) -> None:
    """Spark reads a CHAR(n) column padded to n (spark.sql.readSideCharPadding, true by default;
    measured with pyspark 4.3): rows of a file older than `ALTER TABLE ... ADD COLUMN c CHAR(3)
    DEFAULT 'a'` read 'a  ' (the stored EXISTS_DEFAULT is 'a'), and values an unpadded writer
    stored read padded. Longer values are left as they are ('ab   ', a DEFAULT beyond n, reads
    'ab   ' in Spark too); VARCHAR is never padded."""
    path = write(
        tmp_path / "old.parquet",
        {
            "id": (pa.int64(), 1, [1, 2, 3]),
            "stored": (pa.string(), 2, ["a", None, "abc"]),
            "v": (pa.string(), 3, ["a", None, ""]),
        },
    )
    wire = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "stored", "type": "CHAR(3)", "nullable": True},
        {"field_id": 3, "name": "v", "type": "VARCHAR(3)", "nullable": True},
        {"field_id": 4, "name": "c", "type": "CHAR(3)", "nullable": True, "default": "'a'"},
        {"field_id": 5, "name": "c2", "type": "CHAR(3)", "nullable": True, "default": "'ab   '"},
        {"field_id": 6, "name": "none", "type": "CHAR(3)", "nullable": True},
    ]
    columns = [PinnedColumn.from_wire(c) for c in wire]
    rows = [r for b in file_batches(path, columns) for r in b.to_pylist()]
    assert rows == [
        {"id": 1, "stored": "a  ", "v": "a", "c": "a  ", "c2": "ab   ", "none": None},
        {"id": 2, "stored": None, "v": None, "c": "a  ", "c2": "ab   ", "none": None},
        {"id": 3, "stored": "abc", "v": "", "c": "a  ", "c2": "ab   ", "none": None},
    ]


def test_int96_timestamps_as_spark_writes_them_read_across_spark_s_whole_range(
    tmp_path: Path,
) -> None:
    """Spark writes TIMESTAMP columns as INT96 by default (spark.sql.parquet.outputTimestampType).
    pyarrow decodes INT96 to nanoseconds unless told otherwise, which cannot hold Spark's range:
    the sentinels 0001-01-01 and 9999-12-31 (and anything past 2262) overflowed, so a file
    Spark reads fine was unreadable here (or, where the wrapped value happened to cast,
    read as another instant)."""
    import datetime as dt

    instants = [
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        dt.datetime(2300, 6, 1, 12, 0, 0, 7, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 27, 11, 0, 0, 123456, tzinfo=dt.UTC),
        None,
    ]
    field = pa.field("at", pa.timestamp("us", tz="UTC"), metadata={FIELD_ID_KEY: b"1"})
    table = pa.Table.from_arrays([pa.array(instants, type=field.type)], schema=pa.schema([field]))
    path = tmp_path / "int96.parquet"
    pq.write_table(table, path, use_deprecated_int96_timestamps=True)
    assert pq.ParquetFile(path).schema.column(0).physical_type == "INT96"

    columns = [PinnedColumn(field_id=1, name="at", type_sql="TIMESTAMP", nullable=True)]
    read = [row["at"] for batch in file_batches(str(path), columns) for row in batch.to_pylist()]
    assert read == instants
    rows = read_rows(str(tmp_path), [{"path": "int96.parquet"}], columns, limit=10).rows
    assert rows.column("at").to_pylist() == instants


# Two sibling columns Spark tells apart (apply version 7 allows them: Java's equalsIgnoreCase
# differs), though `str.casefold` does not.
SIBLINGS: Final = [
    {"field_id": 1, "name": "straße", "type": "STRING", "nullable": True},
    {"field_id": 2, "name": "STRASSE", "type": "STRING", "nullable": True},
]


def test_a_file_without_field_ids_matches_columns_by_name_as_spark_does(tmp_path: Path) -> None:
    """Spark's Parquet reader matches a file without field ids by Java's
    `toLowerCase(Locale.ROOT)`: `straße` and `STRASSE` are two columns, each read from its own
    file column (casefold read one file column for both)."""
    write(
        tmp_path / "plain.parquet",
        {"STRASSE": (pa.string(), None, ["upper"]), "Straße": (pa.string(), None, ["sharp"])},
    )
    columns = [PinnedColumn.from_wire(c) for c in SIBLINGS]
    rows = read_rows(str(tmp_path), [{"path": "plain.parquet"}], columns, limit=10).rows
    assert rows.to_pylist() == [{"straße": "sharp", "STRASSE": "upper"}]


@pytest.mark.parametrize(
    "file_names",
    [("id", "ID"), ("Id", "iD", "x"), ("ID", "id")],
)
def test_a_column_two_file_columns_match_is_refused_not_guessed(
    tmp_path: Path, file_names: tuple[str, ...]
) -> None:
    """Spark refuses a read where a wanted column matches two of a file's columns by name
    (case-insensitively), even when one of them matches exactly; so does the CLI's reader,
    instead of reading whichever came first."""
    path = write(
        tmp_path / "plain.parquet",
        {name: (pa.int64(), None, [i]) for i, name in enumerate(file_names)},
    )
    columns = [PinnedColumn.from_wire({"field_id": 1, "name": "id", "type": "BIGINT"})]
    with pytest.raises(AmbiguousColumnError) as raised:
        list(file_batches(path, columns))
    assert raised.value.path == path
    assert "id" in raised.value.message and all(n in raised.value.message for n in file_names[:2])


@pytest.mark.parametrize(
    ("name", "java_lower"),
    [
        # What OpenJDK 17's "name".toLowerCase(Locale.ROOT) returned.
        ("STRASSE", "strasse"),
        ("Straße", "straße"),
        ("\u0130D", "i\u0307d"),  # İD: a dotted i, not `id`
        ("\u017f", "\u017f"),  # the long s stays itself (equalsIgnoreCase pairs it with s)
        ("\u00b5", "\u00b5"),  # the micro sign is not Greek mu
        ("\u2c2f", "\u2c2f"),  # Glagolitic, Unicode 14: no pair in Java 17 (Python 3.11 has one)
        ("\u0391\u03a3", "\u03b1\u03c2"),  # a final sigma at a word's end
        ("\u0391\u03a3_\u0392", "\u03b1\u03c3_\u03b2"),  # `_` ends no word
        ("\u0391\u03a3 \u0392", "\u03b1\u03c2 \u03b2"),  # a space does
        ("\u0391\u03a3$", "\u03b1\u03c2$"),
        ("\u03a3", "\u03c3"),  # no cased letter before it
        ("_\u0391\u03a3", "_\u03b1\u03c2"),
        ("\u0391\u0301\u03a3", "\u03b1\u0301\u03c2"),
    ],
)
def test_names_lowercase_as_java_lowercases_them(name: str, java_lower: str) -> None:
    assert java_lower_root(name) == java_lower


def test_nested_fields_match_by_name_as_spark_matches_them(tmp_path: Path) -> None:
    """Nested fields carry no field ids: Spark matches them by name with its case-insensitive
    rule in every file (a struct's `A` is the pinned `a`, in a list and a map's values too), and
    refuses a nested name two fields match; so does this reader (an exact-name cast read NULL)."""
    inner = pa.struct([("A", pa.int64()), ("b", pa.string())])
    write(
        tmp_path / "nested.parquet",
        {
            "s": (inner, 1, [{"A": 1, "b": "x"}, None]),
            "l": (pa.list_(inner), 2, [[{"A": 2, "b": "y"}], None]),
            "m": (pa.map_(pa.string(), inner), 3, [[("k", {"A": 3, "b": "z"})], None]),
        },
    )
    columns = [
        PinnedColumn.from_wire(c)
        for c in [
            {"field_id": 1, "name": "s", "type": "STRUCT<b: STRING, a: BIGINT>"},
            {"field_id": 2, "name": "l", "type": "ARRAY<STRUCT<a: BIGINT, B: STRING>>"},
            {"field_id": 3, "name": "m", "type": "MAP<STRING, STRUCT<a: BIGINT>>"},
        ]
    ]
    rows = read_rows(str(tmp_path), [{"path": "nested.parquet"}], columns, limit=10).rows
    assert rows.to_pylist() == [
        {"s": {"b": "x", "a": 1}, "l": [{"a": 2, "B": "y"}], "m": [("k", {"a": 3})]},
        {"s": None, "l": None, "m": None},
    ]
    twice = write(
        tmp_path / "twice.parquet",
        {"s": (pa.struct([("a", pa.int64()), ("A", pa.int64())]), 1, [{"a": 1, "A": 2}])},
    )
    with pytest.raises(AmbiguousColumnError):
        list(
            file_batches(
                twice,
                [
                    PinnedColumn.from_wire(c)
                    for c in [{"field_id": 1, "name": "s", "type": "STRUCT<a: BIGINT>"}]
                ],
            )
        )


NESTED_CHAR_WIRE: Final = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {"field_id": 2, "name": "s", "type": "STRUCT<c: CHAR(3), v: VARCHAR(3)>", "nullable": True},
    {"field_id": 3, "name": "a", "type": "ARRAY<CHAR(3)>", "nullable": True},
    {"field_id": 4, "name": "m", "type": "MAP<CHAR(2), STRUCT<c: CHAR(2)>>", "nullable": True},
]


def _nested_char_writer(tmp_path: Path, columns: list[dict[str, Any]]) -> Any:
    from tests.client.offline_writer import offline_writer

    return offline_writer(str(tmp_path), columns)


def test_nested_char_values_are_padded_on_write_and_read_as_spark_does(tmp_path: Path) -> None:
    """Spark pads CHAR(n) values inside structs, arrays and maps (keys too) on a table write and
    on read, and refuses a nested VARCHAR(n)/CHAR(n) value longer than n (measured with pyspark
    4.3, spark_bridge.conform). The data source's writer and the shared reader did so for
    top-level columns only."""
    from pyspark.sql import Row

    writer = _nested_char_writer(tmp_path, NESTED_CHAR_WIRE)
    rows = [
        Row(id=1, s=Row(c="a", v="b"), a=["c", None], m={"k": Row(c="d"), "n": None}),
        Row(id=2, s=None, a=None, m=None),
    ]
    written = write_file_of_rows(writer, rows)
    stored = pq.read_table(tmp_path / written.path).to_pylist()
    assert stored[0]["s"] == {"c": "a  ", "v": "b"}
    assert stored[0]["a"] == ["c  ", None]
    assert sorted(stored[0]["m"]) == [("k ", {"c": "d "}), ("n ", None)]
    assert stored[1] == {"id": 2, "s": None, "a": None, "m": None}
    for row, where in [
        (Row(id=1, s=Row(c="a", v="abcd"), a=[], m={}), "s.v"),
        (Row(id=1, s=None, a=["abcd"], m={}), "a.element"),
        (Row(id=1, s=None, a=[], m={"abc": None}), "m.key"),
        (Row(id=1, s=None, a=[], m={"k": Row(c="abc")}), "m.value.c"),
    ]:
        with pytest.raises(
            ValueTooLongError, match=rf"longer than \d characters in ns\.t\.{where}\b"
        ):
            write_file_of_rows(writer, [row])

    # Read: values an unpadded writer stored read padded, inside structs, lists and maps too.
    path = tmp_path / "unpadded.parquet"
    table = pa.Table.from_pylist(
        [{"id": 1, "s": {"c": "a", "v": "b"}, "a": ["c", None], "m": [("k", {"c": "d"})]}],
        schema=pa.schema(
            [
                pa.field(f.name, f.type, f.nullable, {FIELD_ID_KEY: str(i + 1).encode()})
                for i, f in enumerate(
                    pa.schema(
                        [
                            ("id", pa.int64()),
                            ("s", pa.struct([("c", pa.string()), ("v", pa.string())])),
                            ("a", pa.list_(pa.string())),
                            ("m", pa.map_(pa.string(), pa.struct([("c", pa.string())]))),
                        ]
                    )
                )
            ]
        ),
    )
    pq.write_table(table, path)
    columns = [PinnedColumn.from_wire(c) for c in NESTED_CHAR_WIRE]
    (row,) = [r for b in file_batches(str(path), columns) for r in b.to_pylist()]
    assert row == {
        "id": 1,
        "s": {"c": "a  ", "v": "b"},
        "a": ["c  ", None],
        "m": [("k ", {"c": "d "})],
    }


def test_a_null_in_a_nested_not_null_field_fails_the_append_naming_its_path(
    tmp_path: Path,
) -> None:
    """The data source takes nullable input for NOT NULL nested fields (as Spark's table writes
    do) and its task fails when a NULL arrives, with the typed error naming the field's path,
    as the bridge's; pyarrow's own refusal named only the leaf ("Column 'a' is declared
    non-nullable")."""
    from pyspark.sql import Row
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_bridge.conform import NotNullViolationError

    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "s", "type": "STRUCT<a: INT NOT NULL, b: INT>", "nullable": True},
        {"field_id": 3, "name": "l", "type": "ARRAY<STRUCT<x: INT NOT NULL>>", "nullable": True},
        {
            "field_id": 4,
            "name": "m",
            "type": "MAP<STRING, STRUCT<y: INT NOT NULL>>",
            "nullable": True,
        },
    ]
    writer = _nested_char_writer(tmp_path, columns)
    fine = [
        Row(id=1, s=Row(a=1, b=None), l=[Row(x=5), None], m={"k": Row(y=7), "n": None}),
        Row(id=2, s=None, l=None, m=None),
    ]
    written = write_file_of_rows(writer, fine)
    assert pq.read_table(tmp_path / written.path).num_rows == 2
    # Spark's Arrow batches hold NULL in the fields of a NULL struct (pyarrow's from_pylist,
    # which `write_file_of_rows` uses, holds 0): no NULL arrives in `s.a` there either.
    shape = to_arrow_schema(writer.source_schema, timezone="UTC")
    null_struct = pa.StructArray.from_arrays(
        [pa.nulls(1, pa.int32()), pa.nulls(1, pa.int32())],
        fields=list(shape.field("s").type),
        mask=pa.array([True]),
    )
    assert null_struct.field(0).null_count == 1
    as_spark_sends = pa.RecordBatch.from_arrays(
        [
            pa.array([6]),
            null_struct,
            pa.nulls(1, shape.field("l").type),
            pa.nulls(1, shape.field("m").type),
        ],
        schema=shape,
    )
    written = writer._write_file(iter([as_spark_sends]))
    assert pq.read_table(tmp_path / written.path).to_pylist() == [
        {"id": 6, "s": None, "l": None, "m": None}
    ]
    for row, path in [
        (Row(id=3, s=Row(a=None, b=1), l=[], m={}), "s.a"),
        (Row(id=4, s=None, l=[Row(x=1), Row(x=None)], m={}), "l.element.x"),
        (Row(id=5, s=None, l=[], m={"k": Row(y=None)}), "m.value.y"),
        (Row(id=None, s=None, l=[], m={}), "id"),
    ]:
        with pytest.raises(
            NotNullViolationError, match=rf"NULL in NOT NULL \w+ ns\.t\.{path}"
        ) as info:
            write_file_of_rows(writer, [row])
        assert info.value.field_path == path


def test_a_not_null_nested_field_stored_nullable_reads_under_null_structs(tmp_path: Path) -> None:
    """The bridge's Spark writes a NOT NULL nested field as nullable when the output declared it
    so (its values are checked as they are written), and Parquet stores the field's slot under
    a NULL struct or list element as NULL: pyarrow's cast to the pinned NOT NULL field refused
    the whole file ("field 'x' ... has nulls"), so format("metastore") and `table read` could
    not read what the bridge wrote."""
    element = pa.StructArray.from_arrays(
        [pa.array([5, None], pa.int32())], names=["x"], mask=pa.array([False, True])
    )
    listed = pa.ListArray.from_arrays(pa.array([0, 2, 2], pa.int32()), element)
    struct = pa.StructArray.from_arrays(
        [pa.array([1, None], pa.int32())], names=["a"], mask=pa.array([False, True])
    )
    schema = pa.schema(
        [
            pa.field("l", listed.type, metadata={FIELD_ID_KEY: b"1"}),
            pa.field("s", struct.type, metadata={FIELD_ID_KEY: b"2"}),
        ]
    )
    path = tmp_path / "bridge.parquet"
    pq.write_table(pa.Table.from_arrays([listed, struct], schema=schema), path)
    wire = [
        {"field_id": 1, "name": "l", "type": "ARRAY<STRUCT<x: INT NOT NULL>>", "nullable": True},
        {"field_id": 2, "name": "s", "type": "STRUCT<a: INT NOT NULL>", "nullable": True},
    ]
    columns = [PinnedColumn.from_wire(c) for c in wire]
    batches = list(file_batches(str(path), columns))
    assert [r for b in batches for r in b.to_pylist()] == [
        {"l": [{"x": 5}, None], "s": {"a": 1}},
        {"l": [], "s": None},
    ]
    assert batches[0].schema.field("l").type.value_type.field("x").nullable is False
