"""The columnar expansion of a `files` reply (the default, for speed) answers exactly what the
entry-by-entry reference (`metastore.manifests.expand`) answers: same files, same order, same
totals, whatever mix of manifest entries removed in place, truncated manifests, delete entries
and loose files, at any timestamp."""

from __future__ import annotations

import os
import tempfile
import time
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.client.manifest_files import expand_reply, read_manifest, write_manifest
from metastore.errors import ManifestUnreadableError
from metastore.manifests import ManifestRef
from metastore.txn import FileEntry

BASE_TS = 1 << 40


@st.composite
def replies(draw: st.DrawFn) -> dict[str, object]:
    directory = tempfile.mkdtemp(prefix="expand-")
    ts = BASE_TS
    refs: list[ManifestRef] = []
    paths: list[str] = []
    # Interleaved: manifests whose ts ranges overlap (a commit's entries split across two by
    # a compaction), so the merged entries are out of commit order and must be sorted.
    interleaved = draw(st.booleans())
    newest = ts
    for m in range(draw(st.integers(1, 4))):
        entries = []
        if interleaved:
            ts = BASE_TS + draw(st.integers(0, 6))
        for i in range(draw(st.integers(1, 12))):
            ts += draw(st.integers(0, 2))  # several files of one commit share a ts
            newest = max(newest, ts)
            removed = draw(st.one_of(st.none(), st.integers(ts + 1, ts + 40)))
            path = f"_txn/m{m}/f{i}.parquet"
            paths.append(path)
            entries.append(
                FileEntry(
                    path=path, size_bytes=i + 1, row_count=2 * i, added_ts=ts, removed_ts=removed
                )
            )
        ref = write_manifest(directory, entries)
        if draw(st.booleans()) and draw(st.booleans()):
            ref = replace(ref, removed_all_ts=ts + draw(st.integers(1, 30)))
        refs.append(ref)
    deleted = draw(st.lists(st.sampled_from(paths), unique=True, max_size=len(paths)))
    ts = newest
    loose = []
    # A loose entry may name a manifest entry's path again (a path committed again once its
    # entry left the loose entries; never one with a delete entry: apply refuses that).
    again = [p for p in dict.fromkeys(paths) if p not in deleted]
    for i in range(draw(st.integers(0, 6))):
        ts += draw(st.integers(0 if i else 1, 2))  # loose entries are newer than manifests
        path = f"_txn/loose/{i}.parquet"
        if again and draw(st.booleans()):
            path = again.pop(draw(st.integers(0, len(again) - 1)))
        loose.append({"path": path, "size_bytes": 7, "row_count": 3, "added_ts": ts})
    deletes = [[p, BASE_TS + draw(st.integers(0, ts - BASE_TS + 20))] for p in deleted]
    as_of = BASE_TS + draw(st.integers(0, ts - BASE_TS + 40))
    return {
        "as_of": as_of,
        "location": directory,
        "files": [f for f in loose if f["added_ts"] <= as_of],
        "deletes": deletes,
        "manifests": [r.to_view() for r in refs],
    }


@settings(max_examples=150, deadline=None)
@given(replies())
def test_columnar_expansion_equals_the_entry_by_entry_reference(reply: dict[str, object]) -> None:
    fast = expand_reply(reply)
    reference = expand_reply(reply, read=read_manifest)
    assert fast["files"] == reference["files"]
    for key in ("total_files", "rows", "size_bytes", "expanded_manifests"):
        assert fast[key] == reference[key], key


def _entries() -> list[FileEntry]:
    return [
        FileEntry(path=f"_txn/a/f{i}.parquet", size_bytes=10, row_count=1, added_ts=BASE_TS + i)
        for i in range(3)
    ]


def test_writing_over_a_damaged_manifest_of_the_same_name_repairs_it(tmp_path: Path) -> None:
    """A file already at the content-addressed name (an earlier attempt's, cut short by a crash
    or damaged since) is not taken on trust: the compaction would swap in a manifest no reader
    can read, and the table's files would be lost to every reader."""
    entries = _entries()
    ref = write_manifest(str(tmp_path), entries)
    target = tmp_path / ref.path
    target.write_bytes(b"")  # truncated (e.g. renamed before its data reached the disk)
    again = write_manifest(str(tmp_path), entries)
    assert again == ref
    assert read_manifest(str(tmp_path), again) == entries


def test_writing_a_manifest_that_exists_refreshes_its_age(tmp_path: Path) -> None:
    """An unreferenced manifest left by an old attempt that went stale is an orphan to GC once
    older than gc_orphan_grace_ms (by mtime). A compaction that reuses it must make it young
    again, or the orphan scan may delete it after the compaction referenced it."""
    entries = _entries()
    ref = write_manifest(str(tmp_path), entries)
    target = tmp_path / ref.path
    old = time.time() - 10 * 24 * 3600
    os.utime(target, (old, old))
    write_manifest(str(tmp_path), entries)
    assert target.stat().st_mtime > time.time() - 60
    assert read_manifest(str(tmp_path), ref) == entries
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary left


@pytest.mark.parametrize(
    "path",
    ["../other/f.parquet", "/etc/passwd", "a/../../b", "s3://bucket/f", "a//b", "", "a\x00b"],
)
def test_a_manifest_listing_a_path_outside_its_table_is_not_a_manifest(
    tmp_path: Path, path: str
) -> None:
    """Entry paths are relative to the table location, by the rule commits follow. A manifest
    listing one that escapes it (written by a buggy or hostile compactor: its sha256 is right)
    is refused, never listed: readers would read another table's files, and GC, expanding a
    dead manifest, would delete whatever file the path names."""
    entries = [
        FileEntry(path="ok/f.parquet", size_bytes=1, row_count=1, added_ts=BASE_TS),
        FileEntry(path=path, size_bytes=1, row_count=1, added_ts=BASE_TS, removed_ts=BASE_TS + 1),
    ]
    ref = write_manifest(str(tmp_path), entries)
    with pytest.raises(ManifestUnreadableError):
        read_manifest(str(tmp_path), ref)
    reply = {"as_of": BASE_TS, "location": str(tmp_path), "files": [], "deletes": []}
    with pytest.raises(ManifestUnreadableError):
        expand_reply({**reply, "manifests": [ref.to_view()]})


def test_a_manifest_entry_removed_before_it_was_added_is_not_a_manifest(tmp_path: Path) -> None:
    entries = [
        FileEntry(path="f.parquet", size_bytes=1, row_count=1, added_ts=BASE_TS + 5),
        FileEntry(path="g.parquet", size_bytes=1, row_count=1, added_ts=BASE_TS, removed_ts=1),
    ]
    ref = write_manifest(str(tmp_path), entries)
    with pytest.raises(ManifestUnreadableError):
        read_manifest(str(tmp_path), ref)


def test_a_local_manifest_is_on_disk_before_write_manifest_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction that references a manifest is durable (Raft fsyncs it on a quorum) and
    takes the entries out of the state; the manifest must be as durable before it is proposed,
    or a power loss leaves the table referencing an empty or missing file (every listing fails,
    the entries are lost). So the file and its directory entry are fsynced."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ref = write_manifest(str(tmp_path), _entries())
    final = os.path.realpath(tmp_path / ref.path)
    data_synced = [p for p in synced if p.startswith(final)]  # under its temporary name
    assert data_synced, synced
    assert os.path.dirname(final) in synced[synced.index(data_synced[-1]) :]
    assert os.path.realpath(tmp_path) in synced  # the new _manifests directory's entry


def _committed_again(directory: Path) -> dict[str, Any]:
    """A `files` reply (as_of BASE_TS + 9) where `a` sits in two manifests and is loose (it was
    committed again after its entry left the loose entries), and `b` in two manifests, its
    first entry removed before its second was added."""

    def entry(path: str, ts: int, removed: int | None = None) -> FileEntry:
        return FileEntry(path=path, size_bytes=5, row_count=2, added_ts=ts, removed_ts=removed)

    first = write_manifest(
        str(directory), [entry("a", BASE_TS + 1), entry("b", BASE_TS + 1, BASE_TS + 2)]
    )
    second = write_manifest(str(directory), [entry("a", BASE_TS + 3), entry("b", BASE_TS + 3)])
    return {
        "as_of": BASE_TS + 9,
        "location": str(directory),
        "files": [{"path": "a", "size_bytes": 5, "row_count": 2, "added_ts": BASE_TS + 5}],
        "deletes": [],
        "manifests": [first.to_view(), second.to_view()],
    }


def test_a_path_committed_again_is_listed_once_by_every_expansion(tmp_path: Path) -> None:
    """The columnar expansion, the entry-by-entry one and the merge of per-manifest results
    (the bridge's Spark tasks) all list a path committed again once, as its first live
    entry."""
    from metastore.client.manifest_files import merge_expanded, read_live

    reply = _committed_again(tmp_path)
    per = {
        str(m["sha256"]): read_live(str(tmp_path), m, {}, BASE_TS + 9) for m in reply["manifests"]
    }
    answers = [expand_reply(reply), expand_reply(reply, read=read_manifest)]
    answers.append(merge_expanded(reply, per))
    for answer in answers:
        got = [(f["path"], f["added_ts"]) for f in answer["files"]]
        # `b`'s first entry was removed before its second: the second is its first live one.
        assert got == [("a", BASE_TS + 1), ("b", BASE_TS + 3)]
        assert (answer["total_files"], answer["rows"], answer["size_bytes"]) == (2, 4, 10)


def test_the_data_source_reads_a_path_committed_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """format("metastore") with few manifests and with many (where the tasks used to expand
    one manifest each, and each read `a`): every file once. Stub client, no Spark session."""
    import metastore.client.parquet as parquet_module
    import spark_bridge.datasource as datasource_module
    from spark_bridge.files import absolute

    reply = _committed_again(tmp_path)

    class Client:
        def files(self, table: str, as_of: int, *, expand: bool) -> dict[str, Any]:
            assert not expand
            return dict(reply)

        def close(self) -> None:
            pass

    read: list[str] = []

    def file_batches(path: str, columns: object) -> Iterator[object]:
        read.append(path)
        return iter(())

    monkeypatch.setattr(datasource_module, "_client", lambda *_a, **_k: Client())
    monkeypatch.setattr(parquet_module, "file_batches", file_batches)
    column = {"field_id": 1, "name": "x", "type": "INT", "nullable": True}
    for many in (100, 1):
        monkeypatch.setattr(datasource_module, "EXECUTOR_EXPAND_MANIFESTS_MIN", many)
        source = datasource_module.MetastoreDataSource({"table": "ns.t"})
        source._pinned = {  # type: ignore[attr-defined]
            "ts": BASE_TS + 9,
            "schema": {"schema": {"columns": [column]}, "location": str(tmp_path)},
            "now": 0,
        }
        reader = source.reader(None)  # type: ignore[arg-type]
        read.clear()
        for partition in reader.partitions():
            list(reader.read(partition))
        assert sorted(read) == [absolute(str(tmp_path), "a"), absolute(str(tmp_path), "b")]


# A manifest's paths are checked against the rule commits follow, vectorised in one regular
# expression: whatever the string, it must agree with `commands.validate_file_path`.
_PATH_PIECES = st.sampled_from(
    [
        "a",
        "b.parquet",
        "/",
        "//",
        ".",
        "..",
        "./",
        "../",
        ":",
        "://",
        "\\",
        "\x00",
        "\x1f",
        "\x7f",
        "\n",
        "é",
        "_txn",
        "x" * 300,
    ]
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(_PATH_PIECES, max_size=6).map("".join) | st.text(max_size=12))
def test_the_vectorised_path_check_agrees_with_the_commit_rule(path: str) -> None:
    import pyarrow as pa

    from metastore.client.manifest_files import _bad_paths
    from metastore.commands import validate_file_path
    from metastore.errors import MetastoreError

    try:
        validate_file_path(path)
        refused = False
    except MetastoreError:
        refused = True
    assert _bad_paths(pa.chunked_array([[path]], pa.string()))[0].as_py() is refused


def test_a_failed_manifest_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (a full disk, an I/O error) must not leave its temporary file: the
    orphan scan deletes only `<sha256>.parquet` names under `_manifests`, so a `.tmp` file
    stayed forever, and the bridge tries a compaction again after every commit (one more
    partial file of up to MANIFEST_BYTES_MAX each time, on a disk that is already full)."""

    def fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="No space"):
        write_manifest(str(tmp_path), _entries())
    assert [p.name for p in (tmp_path / "_manifests").iterdir()] == []


def test_manifests_of_an_s3a_table_open_as_its_data_files_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark's s3a:// (and s3n://) locations: the CLI's data reader opens them as pyarrow's s3,
    but manifests went to pyarrow as they were ("Unrecognized filesystem type", a ValueError):
    every compaction of such a table failed (so its loose entries grew to the hard bound and
    commits were refused), and `table files`/`read` of one with manifests died untyped."""
    from metastore.client import manifest_files

    asked: list[str] = []

    def from_uri(uri: str) -> tuple[object, str]:
        asked.append(uri)
        return object(), uri.split("://", 1)[1]

    fake = types.SimpleNamespace(FileSystem=types.SimpleNamespace(from_uri=from_uri))
    monkeypatch.setattr(manifest_files, "pafs", fake)
    assert manifest_files._fs("s3a://bucket/w/t")[1] == "bucket/w/t"
    assert manifest_files._fs("s3n://bucket/w/t/")[1] == "bucket/w/t"
    assert asked == ["s3://bucket/w/t", "s3://bucket/w/t/"]


def test_a_location_pyarrow_cannot_open_is_a_typed_error(tmp_path: Path) -> None:
    ref = write_manifest(str(tmp_path), _entries())
    reply = {
        "as_of": BASE_TS + 9,
        "location": "nosuchscheme://bucket/t",
        "files": [],
        "deletes": [],
        "manifests": [ref.to_view()],
    }
    with pytest.raises(ManifestUnreadableError, match="no filesystem"):
        expand_reply(reply)


def test_a_missing_manifest_says_what_to_check(tmp_path: Path) -> None:
    entries = [FileEntry(path="f.parquet", size_bytes=1, row_count=1, added_ts=BASE_TS)]
    ref = write_manifest(str(tmp_path), entries)
    (tmp_path / ref.path).unlink()
    with pytest.raises(ManifestUnreadableError) as raised:
        read_manifest(str(tmp_path), ref)
    assert raised.value.details["reason"] == "missing"  # the reason stays as it was
    message = raised.value.message
    assert "can read the table's location" in message and "from a backup" in message, message
