"""GC deletes under a table at a Spark object-store URI (`s3a://`, `s3n://`) through the store
pyarrow knows (`s3://`), as every reader and writer opens it: before, `from_uri` refused the
scheme and every deletion of such a table failed."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs
import pytest

from metastore.client.parquet import pyarrow_uri
from metastore.daemon import gc_worker


@pytest.mark.parametrize(
    ("given", "opened"),
    [
        ("s3a://bucket/w/t", "s3://bucket/w/t"),
        ("s3n://bucket/w/t", "s3://bucket/w/t"),
        ("s3://bucket/w/t", "s3://bucket/w/t"),
        ("gs://bucket/w/t", "gs://bucket/w/t"),
        ("/w/t", "/w/t"),
    ],
)
def test_spark_object_store_schemes_are_pyarrows(given: str, opened: str) -> None:
    assert pyarrow_uri(given) == opened


class _Store:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete_file(self, path: str) -> None:
        if path.endswith("gone.parquet"):
            raise FileNotFoundError(path)
        self.deleted.append(path)


def test_gc_deletes_under_an_s3a_location_through_the_s3_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _Store()
    opened: list[str] = []

    def from_uri(uri: str) -> tuple[Any, str]:
        opened.append(uri)
        if not uri.startswith("s3://"):
            raise pafs.ArrowInvalid(f"Unrecognized filesystem type in URI: {uri}")
        return store, uri.removeprefix("s3://")

    # pyarrow's own type cannot be patched; the module attribute can.
    FileSystem = type("FileSystem", (), {"from_uri": staticmethod(from_uri)})

    monkeypatch.setattr(pafs, "FileSystem", FileSystem)
    done = gc_worker._delete_files(
        "s3a://bucket/w/t/",
        ["_txn/a/part-0.parquet", "_txn/a/gone.parquet"],
        leading=lambda: True,
    )
    assert opened == ["s3://bucket/w/t"]
    assert store.deleted == ["bucket/w/t/_txn/a/part-0.parquet"]
    # A file already gone counts as deleted.
    assert done.removed == ["_txn/a/part-0.parquet", "_txn/a/gone.parquet"]


def test_manifests_written_again_are_left_under_an_s3a_location_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GC leaves on disk a queued manifest file written after the threshold (a compactor wrote
    its content again: `GcWorker._drain_queue`), judged right before its deletion; the same on
    an object store."""
    from types import SimpleNamespace

    again, old = (f"_manifests/{c * 64}.parquet" for c in "ab")
    written_ms = {again: 2_000, old: 500}

    class Store(_Store):
        def get_file_info(self, path: str) -> SimpleNamespace:
            rel = path.removeprefix("bucket/w/t/")
            if rel in written_ms:
                return SimpleNamespace(
                    type=pafs.FileType.File, mtime_ns=written_ms[rel] * 1_000_000
                )
            return SimpleNamespace(type=pafs.FileType.NotFound, mtime_ns=None)

    store = Store()

    def from_uri(uri: str) -> tuple[Any, str]:
        return store, uri.removeprefix("s3://")

    FileSystem = type("FileSystem", (), {"from_uri": staticmethod(from_uri)})
    monkeypatch.setattr(pafs, "FileSystem", FileSystem)
    rels = [again, old, f"_manifests/{'c' * 64}.parquet", "_txn/a/part-0.parquet"]
    done = gc_worker._delete_files(
        "s3a://bucket/w/t", rels, leading=lambda: True, manifests_written_after_ms=1_000
    )
    assert done.removed == rels[1:]
    assert store.deleted == [f"bucket/w/t/{rel}" for rel in rels[1:]]


def test_a_deposed_leader_stops_deleting_under_an_s3a_location_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _Store()

    def from_uri(uri: str) -> tuple[Any, str]:
        return store, uri.removeprefix("s3://")

    FileSystem = type("FileSystem", (), {"from_uri": staticmethod(from_uri)})
    monkeypatch.setattr(pafs, "FileSystem", FileSystem)
    rels = [f"_txn/a/part-{i}.parquet" for i in range(3)]
    done = gc_worker._delete_files("s3a://bucket/w/t", rels, leading=lambda: not store.deleted)
    assert done.deposed and done.removed == rels[:1]
    assert store.deleted == ["bucket/w/t/_txn/a/part-0.parquet"]
