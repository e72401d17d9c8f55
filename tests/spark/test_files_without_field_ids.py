"""A committed file written without Parquet field ids (a plain `df.write.parquet`, another tool's
file registered with the `commit` op) reads through the bridge exactly as the CLI's reader
(metastore.client.parquet) reads it: by name, case-insensitively, while the bridge's own files
are still read by field id across a RENAME COLUMN, and a file with field ids on only some
columns is read by field id alone (its columns without one read as absent), as the CLI reads it.
Optimize rewrites such files as every reader reads them.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metastore.client.parquet import FIELD_ID_KEY, PinnedColumn, read_rows
from spark_bridge import bridge as bridge_module
from spark_bridge.files import DataFile
from tests.spark.support import SparkEnv, rows_of

pytestmark = pytest.mark.slow

TABLE = "fid.t"


def _plain_file(location: str, rel: str, table: pa.Table) -> DataFile:
    path = Path(location) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return DataFile(path=rel, size_bytes=path.stat().st_size, row_count=table.num_rows)


def _cli_rows(env: SparkEnv, as_of: int | None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """What `metastore table read` shows: the CLI's pyarrow reader over the same listing."""
    pinned = env.client.schema_at(TABLE, as_of)
    listing = env.client.files(TABLE, as_of=as_of)
    columns = [PinnedColumn.from_wire(c) for c in pinned["schema"]["columns"]]
    read = read_rows(str(listing["location"]), listing["files"], columns, limit=1_000).rows
    return read.column_names, sorted(tuple(r.values()) for r in read.to_pylist())


def test_bridge_reads_files_without_field_ids_as_the_cli_does(
    spark_env: SparkEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS fid")
    env.ddl(f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, name STRING)")
    bridge = env.bridge(app_name="field-ids")
    with bridge.batch(writes=[TABLE]) as b:  # conformed: written with field ids
        b.write(TABLE, env.spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, name STRING"))
    env.ddl(f"ALTER TABLE {TABLE} RENAME COLUMN name TO label")
    pinned = env.client.schema_at(TABLE)
    location = str(pinned["location"])
    ids = {c["name"]: str(c["field_id"]).encode() for c in pinned["schema"]["columns"]}
    no_ids = pa.table({"ID": pa.array([3, 4], pa.int64()), "Label": ["c", None]})
    partial = pa.table(
        [pa.array([6], pa.int64()), pa.array(["f"])],
        schema=pa.schema(
            [pa.field("id", pa.int64(), metadata={FIELD_ID_KEY: ids["id"]}), ("label", pa.string())]
        ),
    )
    with_ids = pa.schema(
        [
            pa.field("id", pa.int64(), metadata={FIELD_ID_KEY: ids["id"]}),
            pa.field("name", pa.string(), metadata={FIELD_ID_KEY: ids["label"]}),  # before RENAME
        ]
    )
    plain_dir = f"_txn/plain-{uuid.uuid4().hex[:8]}"
    # Write directories holding both kinds (a plain append into one, another tool's file):
    # each file is read as its own footer says, whichever kind sorts first.
    ids_first = f"_txn/mixed-{uuid.uuid4().hex[:8]}"
    none_first = f"_txn/mixed-{uuid.uuid4().hex[:8]}"
    files = [
        _plain_file(location, f"{ids_first}/part-0.parquet", pa.table([[7], ["g"]], with_ids)),
        _plain_file(location, f"{ids_first}/part-1.parquet", pa.table({"ID": [8], "Label": ["h"]})),
        _plain_file(
            location, f"{none_first}/part-0.parquet", pa.table({"id": [9], "label": ["i"]})
        ),
        _plain_file(location, f"{none_first}/part-1.parquet", pa.table([[10], ["j"]], with_ids)),
        _plain_file(location, f"{plain_dir}/part-0.parquet", no_ids),  # a plain Spark write
        _plain_file(location, f"{plain_dir}/part-1.parquet", no_ids.slice(0, 1)),
        _plain_file(location, "external/other-tool.parquet", pa.table({"label": ["e"], "id": [5]})),
        _plain_file(location, "external/partial-ids.parquet", partial),
    ]
    write = {
        "table": TABLE,
        "schema_version": int(pinned["version"]),
        "table_id": int(pinned["table_id"]),
        "add": [f.to_wire() for f in files],
    }
    before_add = int(env.client.commit(f"plain-{uuid.uuid4()}", [write])["ts"])
    env.ddl(f"ALTER TABLE {TABLE} ADD COLUMNS (n BIGINT DEFAULT 7)")

    # Footers checked on the driver (few files), then by Spark tasks (as for many files).
    for executor_checks_min in (bridge_module.EXECUTOR_FOOTER_CHECKS_MIN, 1):
        monkeypatch.setattr(bridge_module, "EXECUTOR_FOOTER_CHECKS_MIN", executor_checks_min)
        reader = env.bridge()
        for as_of in (None, before_add):
            df = reader.read_table(TABLE, as_of=as_of)
            names, expected = _cli_rows(env, as_of)
            assert (df.columns, rows_of(df)) == (names, expected), (executor_checks_min, as_of)
        # Footers read once per bridge: one for the bridge's write (one Spark write job, whatever
        # its file count), one for each of the 8 files written here (no job in their names).
        assert reader.footers_checked == 9
    # Optimize rewrites them (read as every reader reads them) into files with field ids:
    # every reader still shows the same rows, now and at the timestamps before.
    shown = _cli_rows(env, None)
    optimized = env.bridge().optimize(TABLE, min_files=2)
    assert optimized.files_rewritten == optimized.files_before, optimized
    assert _cli_rows(env, None) == shown
    df = env.bridge().read_table(TABLE)
    assert (df.columns, rows_of(df)) == shown
    # By name, renamed-by-id, and by field id alone in the partial file (its label unmatched).
    assert _cli_rows(env, before_add)[1] == [
        (1, "a"),
        (2, "b"),
        (3, "c"),
        (3, "c"),
        (4, None),
        (5, "e"),
        (6, None),
        (7, "g"),
        (8, "h"),
        (9, "i"),
        (10, "j"),
    ]


def test_an_ambiguous_by_name_file_fails_the_read_with_a_typed_error(spark_env: SparkEnv) -> None:
    """A file without field ids whose columns differ only in case (`id` and `ID`: both match the
    pinned `id` by Spark's case-insensitive rule) cannot be read: Spark refuses it with its own
    error (duplicate fields in case-insensitive mode) when the DataFrame runs. The bridge's read
    and the data source's refuse it with AmbiguousFileColumnError naming the file and the
    columns; the bridge at `read_table`, before any job runs."""
    from metastore.errors import AmbiguousFileColumnError

    env = spark_env
    table = "fid.ambiguous"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS fid")
    env.ddl(f"CREATE TABLE {table} (id BIGINT, v STRING)")
    pinned = env.client.schema_at(table)
    location = str(pinned["location"])
    rel = f"external/amb-{uuid.uuid4().hex[:8]}.parquet"
    clashing = pa.table({"id": [1], "ID": [2], "v": ["x"]})
    write = {
        "table": table,
        "schema_version": int(pinned["version"]),
        "table_id": int(pinned["table_id"]),
        "add": [_plain_file(location, rel, clashing).to_wire()],
    }
    env.client.commit(f"amb-{uuid.uuid4()}", [write])

    with pytest.raises(AmbiguousFileColumnError) as info:
        env.bridge().read_table(table)
    assert info.value.details["column"] == "id"
    assert info.value.details["matches"] == ["id", "ID"]
    assert str(info.value.details["path"]).endswith(rel)
    assert rel in str(info.value) and "'ID'" in str(info.value)

    with pytest.raises(Exception, match=rf"AmbiguousFileColumnError.*{rel}"):
        env.spark.read.format("metastore").option("table", table).load().collect()


def test_an_ambiguous_nested_field_of_a_by_name_file_fails_the_read_with_a_typed_error(
    spark_env: SparkEnv,
) -> None:
    """Nested fields are matched by name case-insensitively too: a by-name file whose struct
    holds `a` and `A` cannot be read for the pinned `s.a`. Spark's own scan refused it only once
    the DataFrame ran; the bridge's read now refuses it at `read_table` and the data source's
    task before reading a row, both with AmbiguousFileColumnError naming the nested path, as
    for top-level columns."""
    from metastore.errors import AmbiguousFileColumnError

    env = spark_env
    table = "fid.ambiguous_nested"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS fid")
    env.ddl(f"CREATE TABLE {table} (id BIGINT, s STRUCT<a: BIGINT, b: STRING>)")
    pinned = env.client.schema_at(table)
    location = str(pinned["location"])
    rel = f"external/amb-nested-{uuid.uuid4().hex[:8]}.parquet"
    inner = pa.StructArray.from_arrays(
        [pa.array([1]), pa.array([2]), pa.array(["x"])], names=["a", "A", "b"]
    )
    clashing = pa.table({"id": pa.array([1], pa.int64()), "s": inner})
    write = {
        "table": table,
        "schema_version": int(pinned["version"]),
        "table_id": int(pinned["table_id"]),
        "add": [_plain_file(location, rel, clashing).to_wire()],
    }
    env.client.commit(f"amb-nested-{uuid.uuid4()}", [write])

    # Spark's own by-name scan refuses the file (the premise), once the DataFrame runs.
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    plain = StructType(
        [
            StructField("id", LongType()),
            StructField(
                "s", StructType([StructField("a", LongType()), StructField("b", StringType())])
            ),
        ]
    )
    with pytest.raises(Exception, match=r"(?i)duplicate|ambiguous"):
        env.spark.read.schema(plain).parquet(str(Path(location) / rel)).collect()

    with pytest.raises(AmbiguousFileColumnError) as info:
        env.bridge().read_table(table)
    assert info.value.details["column"] == "s.a"
    assert info.value.details["matches"] == ["s.a", "s.A"]
    assert str(info.value.details["path"]).endswith(rel)

    with pytest.raises(Exception, match=rf"AmbiguousFileColumnError.*{rel}"):
        env.spark.read.format("metastore").option("table", table).load().collect()
