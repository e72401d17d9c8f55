"""Offline backup: the catalog a STOPPED node holds, read from its data directory.

`metastore snapshot save FILE --data-dir DIR` is the way out when a cluster has lost its quorum
for good (say 2 of 3 disks are gone): no leader is left, so no node serves `snapshot save`
(a node that cannot show it is caught up answers NOT_READY rather than hand out an old
catalog as if it were current), but what the survivor holds on disk is exactly what disaster
recovery needs. Like `etcdutl` reading a member's data directory, this reads the node's
write-ahead log and snapshots (`WriteAheadLog.read`: the node's own replay rules, nothing on
disk changed), rebuilds the catalog with the node's own state machine (`CatalogStateMachine`),
and returns it with the header of the one snapshot file format (metastore.daemon.backup), which
`metastore snapshot restore` turns into a new cluster.

How far: up to the commit index the node durably recorded (the last one it learnt; etcd's
`--force-new-cluster` discards the entries past it the same way). Entries past it may or may
not have committed: a majority that did not include this node may have committed them (and
acknowledged them to clients), or a leader that lost its term appended them and nobody
committed them. `include_uncommitted` applies them too: no acknowledged write of those is then
lost, but the restored catalog may hold writes whose callers were told nothing (their outcome
was unknown). The header says how many such entries the log held, and whether they are in.

Refused, with a typed error and nothing written: a missing directory (DataDirNotFoundError), one
that is no node's data directory (NotANodeDataDirError), one a running node holds (its log's
LOCK, DataDirInUseError), a log that does not replay (DataDirCorruptError, naming the file), and
a log or snapshot of a newer release (DataDirFromNewerReleaseError).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metastore.daemon import backup
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.errors import InvalidArgumentError, MalformedSnapshotError, ReleaseTooOldError
from raft.errors import RaftError
from raft.node import IDENTITY_FILE, snapshot_app_data
from raft.wal import (
    CorruptLogError,
    RecoveredState,
    WalIOError,
    WalLockedError,
    WalMissingError,
    WriteAheadLog,
    snapshot_file_name,
)

# Under a node's data directory: its write-ahead log and snapshots (raft.node starts it there).
WAL_DIR_NAME = "wal"


class DataDirNotFoundError(InvalidArgumentError):
    """The data directory given does not exist (or is not a directory)."""


class NotANodeDataDirError(InvalidArgumentError):
    """The directory holds no node's state: no IDENTITY or no write-ahead log."""


class DataDirInUseError(InvalidArgumentError):
    """A running node holds the directory's log (its LOCK): stop it, or save from it online."""


class DataDirCorruptError(MalformedSnapshotError):
    """The log or a snapshot in the directory cannot be replayed; the message names the file."""


class DataDirFromNewerReleaseError(InvalidArgumentError):
    """The log holds a command (or a snapshot) that this release cannot apply."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DataDirSnapshot:
    header: dict[str, Any]  # backup.snapshot_header's, plus where it came from and how far
    data: bytes  # the catalog, encoded as a node's export encodes it


def read_data_dir(data_dir: Path, *, include_uncommitted: bool = False) -> DataDirSnapshot:
    """The catalog held by the stopped node whose data directory is `data_dir`, at the commit
    index it recorded (or at its last entry with `include_uncommitted`), as a snapshot file's
    header and state. Writes nothing under `data_dir`."""
    if not data_dir.is_dir():
        raise DataDirNotFoundError(
            f"{data_dir} does not exist or is not a directory: give a node's data directory "
            "(the `data_dir` of its cluster.toml, then node-N)",
            details={"data_dir": str(data_dir), "reason": "data_dir_missing"},
        )
    cluster_id, node_id = _identity(data_dir)
    wal_dir = data_dir / WAL_DIR_NAME
    recovered = _read_log(data_dir, wal_dir)
    machine = CatalogStateMachine()
    snapshot = recovered.snapshot
    if not snapshot.is_empty():
        snapshot_path = wal_dir / snapshot_file_name(snapshot.meta.index)
        try:
            # The state only: an address book the node could not use does not stop it either.
            machine.restore(snapshot_app_data(snapshot.data))
        except (RaftError, MalformedSnapshotError) as exc:
            raise DataDirCorruptError(
                f"{snapshot_path}: the snapshot's catalog does not decode ({exc}); nothing "
                "was written",
                details={"file": str(snapshot_path), "reason": "wal_corrupt"},
            ) from None
        except ReleaseTooOldError as exc:
            raise _newer_release(data_dir, exc) from None
    commit_index = max(recovered.hard_state.commit, snapshot.meta.index)
    last_index = recovered.entries[-1].index if recovered.entries else snapshot.meta.index
    up_to = last_index if include_uncommitted else commit_index
    for entry in recovered.entries:
        if entry.index > up_to:
            break
        try:
            machine.apply(entry)
        except ReleaseTooOldError as exc:
            raise _newer_release(data_dir, exc) from None
    state = machine.state
    data = state.to_snapshot()
    header = backup.snapshot_header(state, data, cluster_id=cluster_id, node_id=node_id)
    header.update(
        {
            "source": "data_dir",
            "commit_index": commit_index,
            "last_log_index": last_index,
            "entries_after_commit": max(0, last_index - commit_index),
            "uncommitted_included": include_uncommitted and last_index > commit_index,
        }
    )
    return DataDirSnapshot(header=header, data=data)


def _identity(data_dir: Path) -> tuple[str, int]:
    """(cluster id, node id) of the node whose data directory this is (its IDENTITY file)."""
    path = data_dir / IDENTITY_FILE
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotANodeDataDirError(
            f"{data_dir} is not a node's data directory (no {IDENTITY_FILE} file): give the "
            "directory of one node (DATA_DIR/node-N), the one holding IDENTITY and wal/",
            details={"data_dir": str(data_dir), "reason": "not_a_node_data_dir"},
        ) from None
    except (OSError, ValueError) as exc:
        raise NotANodeDataDirError(
            f"{path} is unreadable ({exc}): not a node's data directory, or a damaged one",
            details={"data_dir": str(data_dir), "reason": "not_a_node_data_dir"},
        ) from None
    cluster_id = found.get("cluster_id") if isinstance(found, dict) else None
    node_id = found.get("node_id") if isinstance(found, dict) else None
    if not isinstance(cluster_id, str) or type(node_id) is not int:
        raise NotANodeDataDirError(
            f"{path} names no cluster id and node id ({found!r:.200}): not a node's data "
            "directory, or a damaged one",
            details={"data_dir": str(data_dir), "reason": "not_a_node_data_dir"},
        )
    return cluster_id, node_id


def _read_log(data_dir: Path, wal_dir: Path) -> RecoveredState:
    try:
        return WriteAheadLog.read(wal_dir)
    except WalMissingError:
        raise NotANodeDataDirError(
            f"{data_dir} is not a node's data directory: it holds no write-ahead log "
            f"({wal_dir} with its LOCK file)",
            details={"data_dir": str(data_dir), "reason": "not_a_node_data_dir"},
        ) from None
    except WalLockedError:
        raise DataDirInUseError(
            f"{data_dir} is in use by a running node (its log {wal_dir} is locked): stop that "
            "node first (`metastore cluster down`, or SIGINT to its process), or, while its "
            "cluster has a leader, save from it online (`metastore snapshot save FILE`); "
            "nothing was written",
            details={"data_dir": str(data_dir), "reason": "data_dir_in_use"},
        ) from None
    except CorruptLogError as exc:
        where = str(exc.path) if exc.offset is None else f"{exc.path} at offset {exc.offset}"
        raise DataDirCorruptError(
            f"the write-ahead log of {data_dir} does not replay: {where}: {exc.reason}. "
            "Nothing was written and the files were left as they are; save from another "
            "member's data directory if one is left, or restore an earlier backup",
            details={"file": str(exc.path), "offset": exc.offset, "reason": "wal_corrupt"},
        ) from None
    except WalIOError as exc:
        raise NotANodeDataDirError(
            f"cannot read the write-ahead log of {data_dir}: {exc}",
            details={"data_dir": str(data_dir), "reason": "data_dir_unreadable"},
        ) from None


def _newer_release(data_dir: Path, exc: ReleaseTooOldError) -> DataDirFromNewerReleaseError:
    return DataDirFromNewerReleaseError(
        f"{data_dir} holds state of a newer release than this one ({exc}): run the save with "
        "the release the node ran",
        details={"data_dir": str(data_dir), "reason": "newer_release"},
    )
