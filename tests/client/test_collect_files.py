"""What a batch commits for a write is what the driver lists in the write's attempt directory
after Spark wrote it. Pure: pyarrow stands in for Spark's writer, no processes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_bridge.files import collect_files, new_attempt_dir


def test_the_files_of_an_attempt_directory_are_listed_with_their_row_counts(
    tmp_path: Path,
) -> None:
    location = str(tmp_path / "t")
    abs_dir, rel_dir = new_attempt_dir(location, "txn-1")
    Path(abs_dir).mkdir(parents=True)
    pq.write_table(pa.table({"a": [1, 2, 3]}), f"{abs_dir}/part-0.parquet")
    (Path(abs_dir) / "_SUCCESS").write_text("")
    files = collect_files(location, rel_dir)
    assert [(f.path, f.row_count) for f in files] == [(f"{rel_dir}/part-0.parquet", 3)]


def test_an_attempt_directory_the_driver_cannot_see_is_an_error_not_an_empty_write(
    tmp_path: Path,
) -> None:
    """Spark creates the directory of every successful write (an empty output included). Not
    finding it means the driver looks at another filesystem than the one Spark wrote to (an
    absolute location resolved against HDFS by Spark, locally here): listing it as "no files"
    made the batch commit none of the written rows, acknowledged, silently."""
    location = str(tmp_path / "t")
    _, rel_dir = new_attempt_dir(location, "txn-2")
    with pytest.raises(FileNotFoundError, match="_txn"):
        collect_files(location, rel_dir)


def test_files_under_hidden_directories_are_not_the_write_s(tmp_path: Path) -> None:
    """A commit protocol keeps task attempts' files in `_temporary/` (or `.spark-staging-*`)
    until it moves them into place; a cleanup that failed leaves them behind. Spark's readers
    ignore paths under `_`/`.` directories; the driver listed them as written files, so the
    rows it found exceeded the rows written and the batch failed after its job succeeded."""
    location = str(tmp_path / "t")
    abs_dir, rel_dir = new_attempt_dir(location, "txn-3")
    for leftover in ("_temporary/0/_temporary/attempt_1", ".spark-staging-1/x"):
        Path(abs_dir, leftover).mkdir(parents=True)
        pq.write_table(pa.table({"a": [9]}), f"{abs_dir}/{leftover}/part-0.parquet")
    Path(abs_dir, "day=1").mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), f"{abs_dir}/day=1/part-1.parquet")
    # A partition column whose name starts with `_`: Spark reads `_src=a/` (it holds a `=`).
    Path(abs_dir, "_src=a").mkdir()
    pq.write_table(pa.table({"a": [5]}), f"{abs_dir}/_src=a/part-2.parquet")
    pq.write_table(pa.table({"a": [1, 2, 3]}), f"{abs_dir}/part-0.parquet")
    files = collect_files(location, rel_dir)
    assert [(f.path, f.row_count) for f in files] == [
        (f"{rel_dir}/_src=a/part-2.parquet", 1),
        (f"{rel_dir}/day=1/part-1.parquet", 2),
        (f"{rel_dir}/part-0.parquet", 3),
    ]


def test_whether_a_file_is_read_by_name_is_one_footer_per_write_directory(tmp_path: Path) -> None:
    """The bridge's rule for files without field ids is the CLI reader's (`matched_by_name`):
    by name only when no top-level column has a field id; a write directory is judged by one
    footer, any other file by its own; a footer that cannot be read is left to the read."""
    from metastore.client.parquet import FIELD_ID_KEY
    from spark_bridge.files import field_id_group, footer_verdict, footer_verdicts

    assert field_id_group("_txn/s--b-1a2b/part-0.parquet") == "_txn/s--b-1a2b/"
    assert field_id_group("_txn/s--b-1a2b/x=1/part-0.parquet") == "_txn/s--b-1a2b/"
    assert field_id_group("_txn/loose.parquet") == "_txn/loose.parquet"
    assert field_id_group("external/part-0.parquet") == "external/part-0.parquet"
    with_id = pa.field("a", pa.int64(), metadata={FIELD_ID_KEY: b"1"})
    pq.write_table(pa.table({"a": [1]}), tmp_path / "none.parquet")
    pq.write_table(
        pa.table([[1], [2]], schema=pa.schema([with_id, ("b", pa.int64())])),
        tmp_path / "some.parquet",
    )
    probes = [(name, str(tmp_path / f"{name}.parquet")) for name in ("none", "some", "gone")]
    assert footer_verdicts(probes, 2) == [("none", True), ("some", False), ("gone", None)]
    assert footer_verdict(str(tmp_path / "gone.parquet")) is None
