"""`metastore snapshot save FILE --data-dir DIR`: the catalog of a STOPPED node, read from its
data directory (write-ahead log and snapshots) without a cluster, for a cluster that lost its
quorum for good. The data directories here are written with the node's own WAL and command
codec (no processes): what it applies, up to which index, that it changes nothing in DIR, that
the file is the one `snapshot restore` takes, and a typed refusal, with nothing written, for
each way DIR can be unusable. tests/cli/test_quorum_loss_real_cluster.py runs it on real nodes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import signal
from pathlib import Path

import msgpack
import pytest

from hlc import make_ts
from metastore.commands import CreateNamespace, InitCluster, encode_command
from metastore.daemon import backup, offline_backup
from metastore.state import MetastoreState
from raft.core.types import ConfState, Entry, EntryKind, HardState, Snapshot, SnapshotMeta
from raft.node import IDENTITY_FILE, wrap_snapshot_data, wrap_snapshot_parts
from raft.wal import WriteAheadLog
from tests.cli.test_cli import _isolated_cwd, run  # noqa: F401 - autouse fixture
from tests.daemon.harness import write_cluster

BASE_MS = 1_700_000_000_000
NAMESPACES = ("a", "b", "c", "d")
COMMANDS = (
    InitCluster(dd_ms=500, cs_max_ms=500),
    *(CreateNamespace(namespace=name) for name in NAMESPACES),
)


def _entries() -> list[Entry]:
    return [
        Entry(
            term=1,
            index=i + 1,
            tm=make_ts(BASE_MS + i * 10),
            kind=EntryKind.NORMAL,
            data=encode_command(cmd),
        )
        for i, cmd in enumerate(COMMANDS)
    ]


def _node_dir(
    root: Path, *, commit: int, snapshot_at: int | None = None, unusable_book: bool = False
) -> Path:
    """A stopped node's data directory whose log holds COMMANDS (entries 1..5), with `commit`
    as the commit index it recorded and, with `snapshot_at`, a snapshot of the state at that
    index (the entries up to it compacted away, as a node's own snapshot does), whose address
    book is one the node cannot use with `unusable_book` (written by an older release)."""
    directory = root / "node-3"
    directory.mkdir(parents=True)
    (directory / IDENTITY_FILE).write_text(json.dumps({"cluster_id": "lost", "node_id": 3}))
    entries = _entries()
    wal, _ = WriteAheadLog.open(directory / "wal", fsync=False)
    try:
        wal.append(entries, HardState(term=1, vote=1, commit=commit))
        if snapshot_at is not None:
            state = MetastoreState()
            for entry in entries[:snapshot_at]:
                outcome = state.apply(COMMANDS[entry.index - 1], tm=entry.tm, index=entry.index)
                assert outcome.ok, outcome
            meta = SnapshotMeta(
                index=snapshot_at,
                term=1,
                tm=entries[snapshot_at - 1].tm,
                conf=ConfState(voters=(1, 2, 3), learners=()),
            )
            addresses = {n: ("127.0.0.1", 9000 + n) for n in (1, 2, 3)}
            data = wrap_snapshot_data(state.to_snapshot(), addresses)
            if unusable_book:
                head, app_data, _book = wrap_snapshot_parts(state.to_snapshot(), addresses)
                data = head + app_data + msgpack.packb("not an address book")
            wal.compact(Snapshot(meta=meta, data=data))
    finally:
        wal.close()
    return directory


def _digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _namespaces(file: Path) -> list[str]:
    _header, data = backup.read_file(file)
    return [ns.name for ns in MetastoreState.from_snapshot(data).list_namespaces()]


def _save(file: Path, data_dir: Path, *extra: str) -> tuple[int, str, dict[str, object]]:
    result = run("-o", "json", "snapshot", "save", str(file), "--data-dir", str(data_dir), *extra)
    doc = json.loads(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, result.output, doc


# ---- what it saves -----------------------------------------------------------------------------


def test_saves_up_to_the_commit_index_the_node_recorded_and_changes_nothing(
    tmp_path: Path,
) -> None:
    data_dir = _node_dir(tmp_path, commit=3)
    before = _digest(data_dir)
    file = tmp_path / "catalog.snap"
    code, output, doc = _save(file, data_dir)
    assert code == 0, output
    assert _namespaces(file) == ["a", "b"]  # entries 4 and 5 are past the commit index
    header, _ = backup.read_file(file)
    assert header["cluster_id"] == "lost" and header["node_id"] == 3
    assert header["applied_index"] == 3
    assert header["last_tm"] == make_ts(BASE_MS + 20)
    assert header["commit_index"] == 3 and header["last_log_index"] == 5
    assert header["entries_after_commit"] == 2 and header["uncommitted_included"] is False
    assert doc["file"] == str(file) and doc["from"] == str(data_dir)
    assert _digest(data_dir) == before  # read, never repaired or written
    assert file.stat().st_mode & 0o077 == 0


def test_include_uncommitted_applies_the_entries_past_the_commit_index(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=3)
    file = tmp_path / "catalog.snap"
    code, output, _ = _save(file, data_dir, "--include-uncommitted")
    assert code == 0, output
    assert _namespaces(file) == list(NAMESPACES)
    header, _ = backup.read_file(file)
    assert header["applied_index"] == 5 and header["uncommitted_included"] is True


def test_the_table_form_says_how_many_entries_were_left_out(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=3)
    result = run("snapshot", "save", str(tmp_path / "x.snap"), "--data-dir", str(data_dir))
    assert result.exit_code == 0, result.output
    assert "2 entries past the commit index 3 were left out" in result.stderr


def test_a_snapshot_and_the_entries_after_it(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=5, snapshot_at=3)
    assert list((data_dir / "wal").glob("snap-*.snap"))
    file = tmp_path / "catalog.snap"
    code, output, _ = _save(file, data_dir)
    assert code == 0, output
    assert _namespaces(file) == list(NAMESPACES)
    assert backup.read_file(file)[0]["applied_index"] == 5


def test_a_snapshot_whose_address_book_the_node_cannot_use_still_gives_its_catalog(
    tmp_path: Path,
) -> None:
    """The node itself starts from such a snapshot (the addresses it knew stay, raft.node
    `_unwrap_snapshot`); the catalog is all a backup needs of it."""
    data_dir = _node_dir(tmp_path, commit=5, snapshot_at=3, unusable_book=True)
    file = tmp_path / "catalog.snap"
    code, output, _ = _save(file, data_dir)
    assert code == 0, output
    assert _namespaces(file) == list(NAMESPACES)


def test_the_file_restores_into_a_new_cluster(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=5)
    file = tmp_path / "catalog.snap"
    assert _save(file, data_dir)[0] == 0
    config = write_cluster(tmp_path / "new", 3, cluster_id="reborn")
    result = run("-o", "json", "snapshot", "restore", str(file), "--config", str(config.parent))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["restored_from"]["cluster_id"] == "lost" and doc["applied_index"] == 5


# ---- refusals: a typed error, exit code, and nothing written -------------------------------------


def _refused(tmp_path: Path, data_dir: Path, exit_code: int, *expected: str) -> str:
    file = tmp_path / "out" / "catalog.snap"
    file.parent.mkdir(exist_ok=True)
    result = run("snapshot", "save", str(file), "--data-dir", str(data_dir))
    assert result.exit_code == exit_code, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: "), result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert list(file.parent.iterdir()) == []  # neither FILE nor FILE.partial
    return result.stderr


def test_a_missing_data_dir_is_refused(tmp_path: Path) -> None:
    stderr = _refused(tmp_path, tmp_path / "gone", 5, "does not exist", "data_dir_missing")
    assert not (tmp_path / "gone").exists()
    with pytest.raises(offline_backup.DataDirNotFoundError):
        offline_backup.read_data_dir(tmp_path / "gone")
    assert "INVALID_ARGUMENT" in stderr


def test_a_directory_that_is_no_nodes_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(tmp_path, empty, 5, "not a node's data directory", "no IDENTITY")
    assert list(empty.iterdir()) == []
    # The cluster's data directory instead of one node's (DATA_DIR rather than DATA_DIR/node-N).
    _node_dir(tmp_path / "data", commit=5)
    _refused(tmp_path, tmp_path / "data", 5, "not a node's data directory")
    # An IDENTITY but no log.
    no_log = tmp_path / "no-log"
    no_log.mkdir()
    (no_log / IDENTITY_FILE).write_text(json.dumps({"cluster_id": "c", "node_id": 1}))
    _refused(tmp_path, no_log, 5, "holds no write-ahead log")
    assert not (no_log / "wal").exists()
    with pytest.raises(offline_backup.NotANodeDataDirError):
        offline_backup.read_data_dir(no_log)


def test_a_data_dir_a_running_node_holds_is_refused(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=5)
    wal, _ = WriteAheadLog.open(data_dir / "wal", fsync=False)  # as the running node holds it
    try:
        _refused(tmp_path, data_dir, 5, "in use by a running node", "data_dir_in_use")
        with pytest.raises(offline_backup.DataDirInUseError):
            offline_backup.read_data_dir(data_dir)
    finally:
        wal.close()


def test_a_corrupt_log_is_refused_naming_the_file(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=5)
    with WriteAheadLog.open(data_dir / "wal", fsync=False, segment_bytes_max=1)[0] as wal:
        wal.append([], HardState(term=2, vote=1, commit=5))  # a second segment follows
    first = sorted((data_dir / "wal").glob("wal-*.log"))[0]
    data = bytearray(first.read_bytes())
    data[40] ^= 0xFF  # inside the first batch, which synced records follow
    first.write_bytes(bytes(data))
    before = _digest(data_dir)
    _refused(tmp_path, data_dir, 1, "MALFORMED_SNAPSHOT", str(first), "does not replay")
    assert _digest(data_dir) == before
    with pytest.raises(offline_backup.DataDirCorruptError) as raised:
        offline_backup.read_data_dir(data_dir)
    assert raised.value.details["file"] == str(first)


def test_a_log_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=5)
    with WriteAheadLog.open(data_dir / "wal", fsync=False)[0] as wal:
        future = msgpack.packb({"v": 2, "type": "create_namespace"})
        entry = Entry(
            term=1, index=6, tm=make_ts(BASE_MS + 100), kind=EntryKind.NORMAL, data=future
        )
        wal.append([entry], HardState(term=1, vote=1, commit=6))
    _refused(tmp_path, data_dir, 5, "newer release", "newer_release")
    with pytest.raises(offline_backup.DataDirFromNewerReleaseError):
        offline_backup.read_data_dir(data_dir)


def test_an_existing_file_is_kept_unless_force(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=5)
    file = tmp_path / "catalog.snap"
    file.write_bytes(b"an earlier backup")
    result = run("snapshot", "save", str(file), "--data-dir", str(data_dir))
    assert result.exit_code == 5, result.output
    assert "ALREADY_EXISTS" in result.stderr and "--force" in result.stderr
    assert file.read_bytes() == b"an earlier backup"
    # Refused before the data directory is looked at: a missing one is not even noticed.
    result = run("snapshot", "save", str(file), "--data-dir", str(tmp_path / "gone"))
    assert result.exit_code == 5 and "ALREADY_EXISTS" in result.stderr, result.output
    code, output, _ = _save(file, data_dir, "--force")
    assert code == 0, output
    assert _namespaces(file) == list(NAMESPACES)


def test_flags_that_do_not_go_with_data_dir_are_usage_errors(tmp_path: Path) -> None:
    data_dir = _node_dir(tmp_path, commit=5)
    file = tmp_path / "catalog.snap"
    both = run(
        "snapshot", "save", str(file), "--data-dir", str(data_dir), "--endpoint", "127.0.0.1:1"
    )
    assert both.exit_code == 2 and "--endpoint" in both.stderr, both.output
    alone = run("snapshot", "save", str(file), "--include-uncommitted")
    assert alone.exit_code == 2 and "--data-dir" in alone.stderr, alone.output
    assert not file.exists()


def test_help_says_what_it_reads_and_its_limits() -> None:
    text = " ".join(run("snapshot", "save", "--help").output.split())
    for phrase in (
        "--data-dir",
        "stopped node",
        "commit index",
        "--include-uncommitted",
        "lost its quorum",
        "Refused while a node runs",
    ):
        assert phrase in text, phrase


def test_a_save_onto_a_full_disk_names_the_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write or sync that fails (ENOSPC) names no file: the error line must name FILE, as
    every file the CLI writes is named (`cli.errors.writing_file`)."""
    data_dir = _node_dir(tmp_path, commit=3)
    file = tmp_path / "catalog.snap"

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    result = run("snapshot", "save", str(file), "--data-dir", str(data_dir))
    monkeypatch.undo()
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        f"Error: IO_ERROR: cannot write {file}: No space left on device (ENOSPC)"
    ], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-3"]


def test_a_save_past_the_file_size_limit_names_the_file_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """RLIMIT_FSIZE (ulimit -f) makes a write itself fail (EFBIG once SIGXFSZ is ignored, as
    a shell does not): the buffered writes of FILE name FILE too."""
    data_dir = _node_dir(tmp_path, commit=3)
    file = tmp_path / "catalog.snap"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
    try:
        result = run("snapshot", "save", str(file), "--data-dir", str(data_dir))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        f"Error: IO_ERROR: cannot write {file}: File too large (EFBIG)"
    ], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-3"]
