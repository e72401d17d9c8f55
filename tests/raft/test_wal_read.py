"""`WriteAheadLog.read`: what `open` would recover, for a tool reading a stopped node's log,
without changing a byte of it; refused while a log instance (a running node) holds it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from raft.core.types import HardState
from raft.wal import (
    CorruptLogError,
    WalLockedError,
    WalMissingError,
    WriteAheadLog,
)
from tests.raft.test_wal import SMALL_SEGMENT, ents, open_wal, recover, segments, snap


def _digest(directory: Path) -> dict[str, str]:
    """Every file's name and content hash (and so its size): what "unchanged" means here."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def _log_with_snapshot(path: Path, *, preallocate_bytes: int = 4096) -> None:
    wal, _ = open_wal(path, segment_bytes_max=SMALL_SEGMENT, preallocate_bytes=preallocate_bytes)
    wal.append(ents(1, 8), HardState(term=1, vote=1, commit=8))
    wal.compact(snap(5))
    wal.append(ents(9, 12), HardState(term=1, vote=1, commit=10))
    wal.close()


def test_read_recovers_what_open_recovers(tmp_path: Path) -> None:
    _log_with_snapshot(tmp_path)
    read = WriteAheadLog.read(tmp_path)
    assert read == recover(tmp_path, segment_bytes_max=SMALL_SEGMENT, preallocate_bytes=4096)
    assert read.snapshot.meta.index == 5
    assert [e.index for e in read.entries] == list(range(6, 13))
    assert read.hard_state.commit == 10


def test_read_leaves_a_torn_tail_on_disk_and_does_not_replay_it(tmp_path: Path) -> None:
    _log_with_snapshot(tmp_path, preallocate_bytes=0)
    live = segments(tmp_path)[-1]
    # Cut the live segment in the middle of its last batch: a crash during that write.
    live.write_bytes(live.read_bytes()[:-3])
    before = _digest(tmp_path)
    read = WriteAheadLog.read(tmp_path)
    assert _digest(tmp_path) == before  # nothing cut, written or deleted
    opened = recover(tmp_path, segment_bytes_max=SMALL_SEGMENT)  # the node's own recovery
    assert read == opened
    assert _digest(tmp_path) != before  # which does cut it


def test_read_refuses_a_log_that_a_running_node_holds(tmp_path: Path) -> None:
    _log_with_snapshot(tmp_path)
    wal, _ = open_wal(tmp_path)
    try:
        with pytest.raises(WalLockedError, match="in use"):
            WriteAheadLog.read(tmp_path)
    finally:
        wal.close()
    WriteAheadLog.read(tmp_path)  # and reads it once the node let go


def test_read_refuses_a_directory_without_a_log_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(WalMissingError, match="no write-ahead log"):
        WriteAheadLog.read(missing)
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WalMissingError):
        WriteAheadLog.read(empty)
    assert list(empty.iterdir()) == []
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(WalMissingError):
        WriteAheadLog.read(a_file)


def test_read_raises_corruption_naming_the_segment(tmp_path: Path) -> None:
    _log_with_snapshot(tmp_path)
    first = segments(tmp_path)[0]
    assert len(segments(tmp_path)) > 1  # damage in a segment that is not the last one
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    before = _digest(tmp_path)
    with pytest.raises(CorruptLogError) as raised:
        WriteAheadLog.read(tmp_path)
    assert raised.value.path == first
    assert _digest(tmp_path) == before
