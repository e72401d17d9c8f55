"""Storage faults in the write-ahead log: a full disk (ENOSPC) or a failing device (EIO) during
an append's write or fdatasync, a segment roll, a snapshot save and a received snapshot's
install, and a delete during compaction.

What must hold (see raft/wal.py, "Storage faults"): nothing an append returned for is lost;
after a failed fdatasync the log is not synced again and taken for durable (the kernel may
have dropped the pages it could not write and marked them clean: "fsyncgate"), it refuses
every later write, and what it wrote since its last good sync is cut, so that opening the log
again (a restart of the process, which reads the page cache) never takes back unsynced bytes
for durable ones; a failed snapshot save leaves the old snapshot and the log usable; the
error names the operation, the file and the errno.

The faults are injected by replacing the log's own calls (`raft.wal._fdatasync`, `_write_all`,
`os.*`) for one step; the files are real.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import raft.wal
from raft.core.types import ConfState, Entry, EntryKind, HardState, Snapshot, SnapshotMeta
from raft.wal import (
    SNAPSHOT_MAP_BYTES_MIN,
    WAL_PREALLOCATE_BYTES,
    WalFailedError,
    WalIOError,
    WriteAheadLog,
)


def ent(index: int, term: int = 1) -> Entry:
    return Entry(
        term=term, index=index, tm=index * 10 + term, kind=EntryKind.NORMAL, data=b"e%d" % index
    )


def ents(first: int, last: int, term: int = 1) -> list[Entry]:
    return [ent(i, term) for i in range(first, last + 1)]


def snap(index: int, term: int = 1) -> Snapshot:
    meta = SnapshotMeta(index=index, term=term, tm=index * 10 + term, conf=ConfState(voters=(1,)))
    return Snapshot(meta=meta, data=b"state@%d" % index)


def indexes(entries: tuple[Entry, ...] | list[Entry]) -> list[int]:
    return [e.index for e in entries]


def failing(err: int, *, calls: list[int] | None = None) -> Callable[..., Any]:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        if calls is not None:
            calls.append(1)
        raise OSError(err, os.strerror(err))

    return fail


@pytest.fixture(params=[0, WAL_PREALLOCATE_BYTES], ids=["no-prealloc", "prealloc"])
def preallocate(request: pytest.FixtureRequest) -> int:
    return int(request.param)


# ------------------------------------------------------------------------ fdatasync failures


def test_a_failed_fdatasync_fails_the_append_and_is_never_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preallocate: int
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True, preallocate_bytes=preallocate)
    with wal:
        wal.append(ents(1, 3), HardState(term=1, vote=1, commit=2))
        calls: list[int] = []
        monkeypatch.setattr(raft.wal, "_fdatasync", failing(errno.EIO, calls=calls))
        with pytest.raises(WalIOError):
            wal.append(ents(4, 5), HardState(term=1, vote=1, commit=3))
        assert len(calls) == 1
        # Every later write is refused without touching the disk: a second fdatasync would
        # succeed (the error is reported once) and prove nothing about the lost pages.
        for attempt in (
            lambda: wal.append(ents(4, 4), None),
            lambda: wal.append([], HardState(term=1, vote=1, commit=3)),
            lambda: wal.compact(snap(3)),
            lambda: wal.install_snapshot(snap(9)),
            lambda: wal.prepare_snapshot(snap(3)),
        ):
            with pytest.raises(WalFailedError):
                attempt()
        assert len(calls) == 1
    assert len(calls) == 1  # nor does close sync anything


def test_reopening_after_a_failed_fdatasync_does_not_recover_the_unsynced_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preallocate: int
) -> None:
    """Fsyncgate: the failed append's bytes are in the page cache (a restarted process reads
    them back whole) but maybe not on the disk. Recovered, they would be acknowledged to the
    leader as durable and vanish at the next power loss. They were never acknowledged: cut."""
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True, preallocate_bytes=preallocate)
    with wal:
        wal.append(ents(1, 3), HardState(term=1, vote=1, commit=1))
        wal.append([], HardState(term=1, vote=1, commit=2))  # commit-only: not synced
        monkeypatch.setattr(raft.wal, "_fdatasync", failing(errno.EIO))
        with pytest.raises(WalIOError):
            wal.append(ents(4, 5), HardState(term=2, vote=1, commit=3))
    monkeypatch.undo()
    wal, rec = WriteAheadLog.open(tmp_path, fsync=True, preallocate_bytes=preallocate)
    with wal:
        assert indexes(rec.entries) == [1, 2, 3]
        # The unsynced commit-only record went too (the commit index is volatile in Raft);
        # term and vote are the last synced ones.
        assert rec.hard_state == HardState(term=1, vote=1, commit=1)
        wal.append(ents(4, 4, term=2), HardState(term=2, vote=1, commit=3))
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert indexes(rec.entries) == [1, 2, 3, 4]


def test_a_failed_fdatasync_names_the_operation_the_file_and_the_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    with wal:
        wal.append(ents(1, 1), HardState(term=1))
        monkeypatch.setattr(raft.wal, "_fdatasync", failing(errno.EIO))
        with pytest.raises(WalIOError) as caught:
            wal.append(ents(2, 2), None)
    message = str(caught.value)
    segment = next(tmp_path.glob("wal-*.log"))
    assert "fdatasync" in message
    assert str(segment) in message
    assert "EIO" in message
    # What the operator does about it, and that nothing acknowledged is lost.
    assert "restart" in message
    cause = caught.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.EIO


def test_a_failed_fdatasync_of_a_commit_only_record_at_roll_fails_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment roll syncs the closing segment's commit-only records: that sync failing is
    the same failure, with the same cut."""
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True, segment_bytes_max=300)
    with wal:
        wal.append(ents(1, 3), HardState(term=1, vote=1, commit=1))
        wal.append([], HardState(term=1, vote=1, commit=3))
        monkeypatch.setattr(raft.wal, "_fdatasync", failing(errno.EIO))
        with pytest.raises(WalIOError, match="fdatasync"):
            wal.append([Entry(term=1, index=4, tm=41, data=b"x" * 300)], None)
        with pytest.raises(WalFailedError):
            wal.append([], HardState(term=1, vote=1, commit=3))
    monkeypatch.undo()
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert indexes(rec.entries) == [1, 2, 3]
    assert rec.hard_state.commit == 1


# ----------------------------------------------------------------------- write failures


def test_a_disk_full_write_mid_append_fails_it_and_the_log_reopens_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preallocate: int
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True, preallocate_bytes=preallocate)
    real_write_all = raft.wal._write_all

    def half_then_full(fd: int, data: bytes | memoryview) -> None:
        real_write_all(fd, memoryview(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with wal:
        wal.append(ents(1, 3), HardState(term=1, vote=1, commit=3))
        monkeypatch.setattr(raft.wal, "_write_all", half_then_full)
        with pytest.raises(WalIOError, match="ENOSPC") as caught:
            wal.append(ents(4, 6), None)
        assert "write" in str(caught.value)
        with pytest.raises(WalFailedError):
            wal.append(ents(4, 4), None)
    monkeypatch.undo()
    wal, rec = WriteAheadLog.open(tmp_path, fsync=True, preallocate_bytes=preallocate)
    with wal:
        assert indexes(rec.entries) == [1, 2, 3]
        assert rec.hard_state == HardState(term=1, vote=1, commit=3)
        wal.append(ents(4, 4), None)


def test_a_disk_full_while_writing_zeros_ahead_fails_the_append_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True, preallocate_bytes=4096)
    with wal:
        wal.append(ents(1, 2), HardState(term=1, vote=1, commit=2))
        monkeypatch.setattr(raft.wal.os, "pwrite", failing(errno.ENOSPC))
        with pytest.raises(WalIOError, match="ENOSPC"):
            wal.append([Entry(term=1, index=3, tm=31, data=b"y" * 8192)], None)
    monkeypatch.undo()
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert indexes(rec.entries) == [1, 2]


def _refuse_new_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on the log's new segment files cannot be created: the disk is full."""
    real_open = os.open

    def no_new_segment(path: Any, flags: int, *args: Any) -> int:
        if "wal-" in str(path) and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(raft.wal.os, "open", no_new_segment)


def test_a_segment_that_cannot_be_created_fails_the_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True, segment_bytes_max=300)
    with wal:
        wal.append(ents(1, 3), HardState(term=1, vote=1, commit=3))
        _refuse_new_segments(monkeypatch)
        with pytest.raises(WalIOError, match="ENOSPC"):
            wal.append([Entry(term=1, index=4, tm=41, data=b"x" * 300)], None)
    monkeypatch.undo()
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert indexes(rec.entries) == [1, 2, 3]


# ----------------------------------------------------------------------- snapshots


def test_a_disk_full_snapshot_save_keeps_the_old_snapshot_and_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    real_write_all = raft.wal._write_all
    with wal:
        wal.append(ents(1, 6), HardState(term=1, vote=1, commit=6))
        wal.compact(snap(2))

        def full_in_snapshot(fd: int, data: bytes | memoryview) -> None:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_write_all(fd, data)

        monkeypatch.setattr(raft.wal, "_write_all", full_in_snapshot)
        with pytest.raises(WalIOError, match="ENOSPC"):
            wal.compact(snap(5))
        with pytest.raises(WalIOError, match="ENOSPC"):
            wal.prepare_snapshot(snap(5))
        assert not list(tmp_path.glob("*.tmp"))  # no half-written file left to fill the disk
        # The log goes on: nothing it holds was touched.
        wal.append(ents(7, 7), HardState(term=1, vote=1, commit=7))
        monkeypatch.undo()
        wal.compact(snap(6))
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert rec.snapshot.meta.index == 6
    assert indexes(rec.entries) == [7]


def test_a_failed_snapshot_fdatasync_keeps_the_log_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot file's own fdatasync failing loses nothing the log relies on: the file is
    a new one, deleted, never renamed into place (a later attempt writes a fresh file)."""
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    real = raft.wal._fdatasync
    with wal:
        wal.append(ents(1, 4), HardState(term=1, vote=1, commit=4))

        def fail_on_snapshot(fd: int) -> None:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real(fd)

        monkeypatch.setattr(raft.wal, "_fdatasync", fail_on_snapshot)
        with pytest.raises(WalIOError, match="EIO"):
            wal.compact(snap(3))
        assert not list(tmp_path.glob("snap-*"))
        wal.append(ents(5, 5), HardState(term=1, vote=1, commit=5))
    monkeypatch.undo()
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert rec.snapshot.is_empty()
    assert indexes(rec.entries) == [1, 2, 3, 4, 5]


def test_a_failed_install_before_its_commit_point_keeps_the_old_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    with wal:
        wal.append(ents(1, 3), HardState(term=1, vote=1, commit=3))
        monkeypatch.setattr(raft.wal.os, "replace", failing(errno.ENOSPC))
        with pytest.raises(WalIOError, match="ENOSPC"):
            wal.install_snapshot(snap(10, term=2))
        monkeypatch.undo()
        assert not list(tmp_path.glob("snap-*"))
        # Before the commit point nothing changed: the install can be tried again.
        wal.install_snapshot(snap(10, term=2))
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert rec.snapshot.meta.index == 10
    assert rec.entries == ()


def test_a_failed_install_after_its_commit_point_fails_the_log_and_reopen_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    with wal:
        wal.append(ents(1, 3), HardState(term=1, vote=1, commit=3))
        _refuse_new_segments(monkeypatch)
        with pytest.raises(WalIOError, match="ENOSPC"):
            wal.install_snapshot(snap(10, term=2))
        monkeypatch.undo()
        with pytest.raises(WalFailedError):
            wal.append(ents(11, 11, term=2), None)
    wal, rec = WriteAheadLog.open(tmp_path, fsync=True)
    with wal:
        assert rec.snapshot.meta.index == 10
        assert rec.entries == ()
        assert rec.hard_state == HardState(term=1, vote=1, commit=3)
        wal.append(ents(11, 11, term=2), None)


def test_a_snapshot_that_cannot_be_deleted_at_compaction_fails_the_log_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permission denied on an old snapshot: the new one is in place, the log says which file
    and why, and a reopen recovers the new snapshot."""
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    with wal:
        wal.append(ents(1, 6), HardState(term=1, vote=1, commit=6))
        wal.compact(snap(2))
        wal.compact(snap(3))
        real_unlink = Path.unlink

        def refuse(self: Path, missing_ok: bool = False) -> None:
            if self.name.startswith("snap-"):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            real_unlink(self, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "unlink", refuse)
        with pytest.raises(WalIOError, match="EACCES") as caught:
            wal.compact(snap(5))
        assert "snap-0000000000000002.snap" in str(caught.value)
    monkeypatch.undo()
    _, rec = WriteAheadLog.open(tmp_path, fsync=False)
    assert rec.snapshot.meta.index == 5
    assert indexes(rec.entries) == [6]


def test_a_recovery_the_disk_refuses_names_the_file_and_the_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart on a failing disk: the recovery's sync of the live segment fails. One error
    (the daemon prints it as one line), and the lock is released for the next attempt (after
    a reboot: see the next test)."""
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    with wal:
        wal.append(ents(1, 2), HardState(term=1, vote=1, commit=2))
    monkeypatch.setattr(raft.wal, "_fdatasync", failing(errno.EIO))
    with pytest.raises(WalIOError) as caught:
        WriteAheadLog.open(tmp_path, fsync=True)
    message = str(caught.value)
    assert "fdatasync" in message and "EIO" in message, message
    assert str(next(tmp_path.glob("wal-*.log"))) in message, message
    monkeypatch.undo()
    monkeypatch.setattr(raft.wal, "_boot_id", lambda: "the-next-boot")
    wal, rec = WriteAheadLog.open(tmp_path, fsync=True)
    wal.close()
    assert indexes(rec.entries) == [1, 2]


def test_a_failed_recovery_sync_keeps_a_later_start_of_the_same_boot_from_trusting_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A predecessor killed after an append's write, before its fdatasync, left a whole batch
    in the page cache only. The recovery's sync of it fails: the kernel may have marked those
    pages clean without writing them, and a later start (whose own sync then succeeds, the
    error having been reported once) would read them back and acknowledge them as durable.
    Until a reboot drops the page cache, no start may trust it; after one, the disk decides."""
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True)
    wal.append(ents(1, 2), HardState(term=1, vote=1, commit=2))
    monkeypatch.setattr(raft.wal, "_fdatasync", lambda _fd: None)  # killed before the sync
    wal.append(ents(3, 3), HardState(term=1, vote=1, commit=2))
    wal.close()
    monkeypatch.setattr(raft.wal, "_fdatasync", failing(errno.EIO))
    with pytest.raises(WalIOError):
        WriteAheadLog.open(tmp_path, fsync=True)
    monkeypatch.setattr(raft.wal, "_fdatasync", os.fdatasync)  # the error was reported once
    with pytest.raises(WalIOError) as caught:
        WriteAheadLog.open(tmp_path, fsync=True)
    message = str(caught.value)
    assert "EIO" in message and "reboot" in message and "\n" not in message, message
    with pytest.raises(WalIOError):  # still refused: nothing was cut or forgotten
        WriteAheadLog.open(tmp_path, fsync=True)
    monkeypatch.setattr(raft.wal, "_boot_id", lambda: "the-next-boot")
    wal, rec = WriteAheadLog.open(tmp_path, fsync=True)  # the disk's own bytes now
    wal.close()
    assert indexes(rec.entries) == [1, 2, 3]
    assert not list(tmp_path.glob("SYNC_FAILED*"))


def test_a_large_snapshot_file_the_disk_cannot_read_back_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large snapshot files are mapped (the state is never copied onto the heap), and through
    a map a page the disk cannot read (EIO) is a SIGBUS: the node dies without a word, at the
    checksum pass that reads every page. That pass reads the file with plain reads, where EIO
    is an OSError: the open fails naming the operation, the file and the errno, one line."""
    data = bytes(range(256)) * (SNAPSHOT_MAP_BYTES_MIN // 256 + 2)
    meta = SnapshotMeta(index=3, term=1, tm=31, conf=ConfState(voters=(1,)))
    wal, _ = WriteAheadLog.open(tmp_path, fsync=False)
    with wal:
        wal.append(ents(1, 4), HardState(term=1, vote=1, commit=4))
        wal.compact(Snapshot(meta=meta, data=data))
    snapshot_file = next(tmp_path.glob("snap-*.snap"))
    monkeypatch.setattr(raft.wal.os, "preadv", failing(errno.EIO))
    with pytest.raises(WalIOError) as caught:
        WriteAheadLog.open(tmp_path, fsync=False)
    message = str(caught.value)
    assert f"read of {snapshot_file}: Input/output error (EIO)" in message, message
    assert "\n" not in message
    monkeypatch.undo()
    wal, rec = WriteAheadLog.open(tmp_path, fsync=False)
    with wal:
        assert rec.snapshot.meta.index == 3 and bytes(rec.snapshot.data) == data
        assert indexes(rec.entries) == [4]


def test_a_failed_fdatasync_whose_cut_fails_too_keeps_later_starts_of_the_boot_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live path cuts what it wrote since its last good sync; when that cut fails too,
    the unsynced append stays in the page cache, whole and valid, and a restart of the same
    boot would recover it as durable. So it is treated as a failed recovery sync is: no start
    of this boot opens the log; after a reboot the disk decides."""
    wal, _ = WriteAheadLog.open(tmp_path, fsync=True, preallocate_bytes=0)
    with wal:
        wal.append(ents(1, 2), HardState(term=1, vote=1, commit=1))
        monkeypatch.setattr(raft.wal, "_fdatasync", failing(errno.EIO))
        monkeypatch.setattr(raft.wal.os, "ftruncate", failing(errno.EIO))
        with pytest.raises(WalIOError) as caught:
            wal.append(ents(3, 3), HardState(term=1, vote=1, commit=2))
    monkeypatch.undo()
    assert "failed too" in str(caught.value) and "reboot" in str(caught.value)
    with pytest.raises(WalIOError, match="reboot"):
        WriteAheadLog.open(tmp_path, fsync=True)
    monkeypatch.setattr(raft.wal, "_boot_id", lambda: "the-next-boot")
    wal, rec = WriteAheadLog.open(tmp_path, fsync=True)  # the disk's own bytes now
    wal.close()
    assert indexes(rec.entries)[:2] == [1, 2]
