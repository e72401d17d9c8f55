"""Nested struct fields of a by-name file that differ only in case (`s.a` and `s.A`) cannot be
read for a pinned `s.a`, as Spark refuses them (its case-insensitive nested match finds two):
the bridge's read and the data source's task raise the typed AmbiguousFileColumnError naming
the file and the nested path, at read time, as they do for top-level columns (`id` and `ID`).
Before, the bridge's read failed only once the DataFrame ran, with Spark's own error, and the
data source named the field without its column, and not at all for a file of no rows. Pure:
pyarrow files in a temporary directory, no Spark session."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from metastore.errors import AmbiguousFileColumnError
from spark_bridge.datasource import FilePartition, MetastoreReader
from tests.client.bridge_stub import bare_bridge

CLASHING = pa.struct([("a", pa.int64()), ("A", pa.int64())])


def _write(path: Path, rows: int, *, array: bool = False) -> str:
    """`rows` rows of `id` and `s` (CLASHING, or a list of one CLASHING), no field ids."""
    values = [pa.array(range(rows), pa.int64()), pa.array(range(rows), pa.int64())]
    s: pa.Array = pa.StructArray.from_arrays(values, fields=list(CLASHING))
    if array:
        s = pa.ListArray.from_arrays(pa.array(range(rows + 1), pa.int32()), s)
    pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64()), "s": s}), path)
    return str(path)


@pytest.mark.parametrize("rows", [1, 0], ids=["rows", "no-rows"])
def test_the_data_source_refuses_a_nested_name_two_fields_match(tmp_path: Path, rows: int) -> None:
    path = _write(tmp_path / "nested.parquet", rows)
    reader = MetastoreReader(
        files=[path],
        columns=[
            {"field_id": 1, "name": "id", "type": "BIGINT"},
            {"field_id": 2, "name": "s", "type": "STRUCT<a: BIGINT>"},
        ],
    )
    with pytest.raises(AmbiguousFileColumnError) as raised:
        list(reader.read(FilePartition(path)))
    assert raised.value.details["column"] == "s.a"
    assert raised.value.details["matches"] == ["s.a", "s.A"]
    assert raised.value.details["path"] == path


def test_the_data_source_reads_a_struct_whose_clashing_fields_are_not_pinned(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "nested.parquet", 1)
    reader = MetastoreReader(
        files=[path], columns=[{"field_id": 1, "name": "id", "type": "BIGINT"}]
    )
    [batch] = list(reader.read(FilePartition(path)))
    assert batch.to_pylist() == [{"id": 0}]


def _bridge_reading() -> Any:
    bridge = bare_bridge(None)
    bridge._by_name_verdicts = {}
    bridge._verdicts_lock = threading.Lock()
    bridge.footers_checked = 0
    return bridge


@pytest.mark.parametrize(
    ("array", "column"), [(False, "s.a"), (True, "s.element.a")], ids=["struct", "array"]
)
def test_the_bridge_refuses_a_nested_name_two_fields_match_before_spark_runs(
    tmp_path: Path, array: bool, column: str
) -> None:
    """`read_files` raises before any scan is planned (this bridge has no Spark session)."""
    _write(tmp_path / "nested.parquet", 1, array=array)
    inner = StructType([StructField("a", LongType())])
    struct = StructType(
        [StructField("id", LongType()), StructField("s", ArrayType(inner) if array else inner)]
    )
    with pytest.raises(AmbiguousFileColumnError) as raised:
        _bridge_reading().read_files(str(tmp_path), [{"path": "nested.parquet"}], struct)
    assert raised.value.details["column"] == column
    prefix = column.rsplit(".", 1)[0]
    assert raised.value.details["matches"] == [f"{prefix}.a", f"{prefix}.A"]
    assert str(raised.value.details["path"]).endswith("nested.parquet")


def test_the_bridge_checks_only_the_nested_fields_it_reads(tmp_path: Path) -> None:
    """A pinned struct without the clashing field reads the file (Spark reads it too): the
    check lets it through to the scans."""
    from spark_bridge.bridge import check_by_name_clashes
    from spark_bridge.files import footer_verdict

    path = _write(tmp_path / "nested.parquet", 1)
    verdict = footer_verdict(path)
    assert verdict == ((("s", "a"), ("s", "A")),)
    unread = StructType([StructField("s", StructType([StructField("b", StringType())]))])
    check_by_name_clashes(unread, verdict, path)  # no error
    read = StructType([StructField("S", StructType([StructField("A", LongType())]))])
    with pytest.raises(AmbiguousFileColumnError) as raised:
        check_by_name_clashes(read, verdict, path)
    assert raised.value.details["column"] == "S.A"
