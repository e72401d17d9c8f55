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


JOB_A = "e142d532-029d-40a9-b243-ab242ad9ed58"  # the UUIDs Spark names a write job's files with
JOB_B = "0b1e6a39-5f0c-4d52-9a5e-2d6f0c7b8e11"


def test_whether_a_file_is_read_by_name_is_one_footer_per_spark_write_job(tmp_path: Path) -> None:
    """The bridge's rule for files without field ids is the CLI reader's (`matched_by_name`):
    by name only when no top-level column has a field id; the files one Spark write job wrote
    into one write directory (partitions included) are judged by one footer, any other file by
    its own; a footer that cannot be read is left to the read."""
    from metastore.client.parquet import FIELD_ID_KEY
    from spark_bridge.files import field_id_group, footer_verdict, footer_verdicts, job_file_name

    job_a = f"_txn/s--b-1a2b/./{JOB_A}"
    assert field_id_group(f"_txn/s--b-1a2b/part-00000-{JOB_A}-c000.snappy.parquet") == job_a
    assert field_id_group(f"_txn/s--b-1a2b/x=1/part-00007-{JOB_A}-c000.snappy.parquet") == job_a
    assert field_id_group(f"_txn/s--b-1a2b/part-00001-{JOB_A}_00003.c000.parquet") == job_a
    assert field_id_group(f"_txn/s--b-1a2b/part-00000-{JOB_B}-c000.parquet") != job_a
    assert field_id_group(f"ext/d/part-00000-{JOB_A}-c000.parquet") == f"ext/d/./{JOB_A}"
    for own in ("_txn/s--b-1a2b/part-0.parquet", "_txn/loose.parquet", "external/part-0.parquet"):
        assert field_id_group(own) == own
    # The data source's appends name their files so, all with field ids: one group per append.
    appended = {field_id_group(f"_txn/s--append-1/{job_file_name(JOB_B)}") for _ in range(3)}
    assert appended == {f"_txn/s--append-1/./{JOB_B}"}
    with_id = pa.field("a", pa.int64(), metadata={FIELD_ID_KEY: b"1"})
    pq.write_table(pa.table({"a": [1]}), tmp_path / "none.parquet")
    pq.write_table(
        pa.table([[1], [2]], schema=pa.schema([with_id, ("b", pa.int64())])),
        tmp_path / "some.parquet",
    )
    probes = [(name, str(tmp_path / f"{name}.parquet")) for name in ("none", "some", "gone")]
    assert footer_verdicts(probes, 2) == [("none", True), ("some", False), ("gone", None)]
    assert footer_verdict(str(tmp_path / "gone.parquet")) is None


def test_a_write_directory_mixing_files_with_and_without_field_ids_reads_each_by_its_own(
    tmp_path: Path,
) -> None:
    """A `_txn/<attempt>/` directory normally holds one Spark write (all files with field ids,
    or none), but nothing stops a plain `df.write.mode("append").parquet` or another tool from
    adding files of the other kind to it before a commit lists them all. The bridge reads each
    file by name exactly when that file has no field ids, whichever of the directory's files
    sorts first (one footer per directory read the other kind wrongly: by field id, a file
    without any fails the read or reads all NULLs; by name, a column renamed since reads as
    absent)."""
    import threading

    from metastore.client.parquet import FIELD_ID_KEY
    from spark_bridge.bridge import MetastoreBridge

    with_ids = pa.schema([pa.field("id", pa.int64(), metadata={FIELD_ID_KEY: b"1"})])
    # Each name sorts where it shows the old rule's mistake: the first of a directory's files
    # (the one footer read for all) is of the other kind than a later one.
    kinds = {
        "_txn/ids-first/part-0.parquet": "ids",
        "_txn/ids-first/part-1.parquet": "none",
        "_txn/none-first/part-0.parquet": "none",
        "_txn/none-first/part-1.parquet": "ids",
        # Two Spark write jobs appending to one directory, and another tool's file beside them.
        f"_txn/jobs/part-00000-{JOB_B}-c000.snappy.parquet": "ids",
        f"_txn/jobs/part-00001-{JOB_B}-c000.snappy.parquet": "ids",
        f"_txn/jobs/x=1/part-00000-{JOB_A}-c000.snappy.parquet": "none",
        f"_txn/jobs/x=2/part-00001-{JOB_A}-c000.snappy.parquet": "none",
        "_txn/jobs/tool.parquet": "ids",
    }
    for rel, kind in kinds.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.table({"id": [1]})
        pq.write_table(table.cast(with_ids) if kind == "ids" else table, path)
    files = [{"path": rel} for rel in kinds]
    bridge = object.__new__(MetastoreBridge)  # what `files_read_by_name` needs of a bridge
    bridge._by_name_verdicts, bridge._verdicts_lock = {}, threading.Lock()
    bridge.footers_checked = 0
    expected = {rel for rel, kind in kinds.items() if kind == "none"}
    assert bridge.files_read_by_name(str(tmp_path), files) == expected
    assert bridge.footers_checked == 7  # a footer per Spark write job, else per file
    # Verdicts are remembered per file: a second read reads no footer again.
    checked = bridge.footers_checked
    assert bridge.files_read_by_name(str(tmp_path), files) == expected
    assert bridge.footers_checked == checked


def test_remove_attempt_dir_removes_only_an_attempt_directory(tmp_path: Path) -> None:
    from spark_bridge.files import remove_attempt_dir

    attempt = tmp_path / "_txn" / "s--batch-1" / "p=1"
    attempt.mkdir(parents=True)
    (attempt / "part-0.parquet").write_bytes(b"x")
    (tmp_path / "kept.parquet").write_bytes(b"x")
    remove_attempt_dir(str(tmp_path), "_txn/s--batch-1")
    assert not (tmp_path / "_txn" / "s--batch-1").exists()
    remove_attempt_dir(str(tmp_path), "_txn/s--batch-1")  # gone already: nothing to do
    for outside in ("data", "_txn/../data", "../_txn/x"):
        with pytest.raises(OSError, match="not an attempt directory"):
            remove_attempt_dir(str(tmp_path), outside)
    assert (tmp_path / "kept.parquet").exists()
