"""Backup and restore of the catalog, etcdutl-style.

Save (`metastore snapshot save FILE`, any node): the node serialises its state machine at its
applied index (one `to_snapshot()` on the event loop, so it is consistent at one index), keeps
the bytes for a few minutes under an export id, and hands them out in chunks that fit the
client frame. The file is

    METASTORE-SNAPSHOT 1\\n
    {"cluster_id", "node_id", "applied_index", "last_tm", "size_bytes", "sha256", "taken_at_ms"}\\n
    <the state, exactly `size_bytes` bytes>

Restore (`metastore snapshot restore FILE --config DIR`) seeds a NEW cluster (its own cluster id,
members and secrets, from `metastore cluster init`): every member's data directory gets a WAL
holding that state as a Raft snapshot with the new membership, and an IDENTITY; then `cluster up`
starts it like any cluster with state. The old cluster's DD and CSmax travel with the state (they
are fixed for a catalog's life); sessions of the old cluster expire, their leases and owned
protections with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from metastore.daemon.config import ClusterConfig
from metastore.errors import InvalidArgumentError, MalformedSnapshotError
from metastore.state import MetastoreState
from raft.core.types import ConfState, HardState, Snapshot, SnapshotMeta
from raft.node import IDENTITY_FILE, wrap_snapshot_data
from raft.wal import WriteAheadLog

FILE_MAGIC: Final = b"METASTORE-SNAPSHOT 1\n"
HEADER_BYTES_MAX: Final = 4096
# Bytes per `snapshot_chunk` reply: well below the client frame (4 MiB) after msgpack framing.
CHUNK_BYTES: Final = 1024 * 1024
# Exports a node keeps at once, and for how long without a read (they are whole states).
EXPORTS_MAX: Final = 2
EXPORT_TTL_S: Final = 600.0
# Table locations a restore's reply lists, and names in its warning (a catalog may hold
# thousands of tables; the count is always given).
LOCATIONS_LISTED_MAX: Final = 1000
LOCATIONS_IN_WARNING_MAX: Final = 3


@dataclass(slots=True)
class _Export:
    data: bytes
    header: dict[str, Any]
    touched: float


class SnapshotExports:
    """The node side of `snapshot save`: states being downloaded, by export id."""

    def __init__(self) -> None:
        self._exports: dict[str, _Export] = {}

    def begin(self, state: MetastoreState, *, cluster_id: str, node_id: int) -> dict[str, Any]:
        self._expire()
        if len(self._exports) >= EXPORTS_MAX:
            oldest = min(self._exports, key=lambda k: self._exports[k].touched)
            del self._exports[oldest]
        data = state.to_snapshot()
        header = {
            "cluster_id": cluster_id,
            "node_id": node_id,
            "applied_index": state.applied_index,
            "last_tm": state.last_tm,
            "size_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "taken_at_ms": int(time.time() * 1000),
        }
        export_id = uuid.uuid4().hex
        self._exports[export_id] = _Export(data=data, header=header, touched=time.monotonic())
        return {"export_id": export_id, **header}

    def chunk(self, export_id: str, offset: int) -> dict[str, Any]:
        export = self._exports.get(export_id)
        if export is None:
            raise InvalidArgumentError(
                f"no snapshot export {export_id!r} on this node (expired, or taken on another "
                "node): start again",
                details={"export_id": export_id},
            )
        if not 0 <= offset <= len(export.data):
            raise InvalidArgumentError(f"offset {offset} is outside the snapshot")
        export.touched = time.monotonic()
        piece = export.data[offset : offset + CHUNK_BYTES]
        done = offset + len(piece) >= len(export.data)
        if done:
            del self._exports[export_id]
        return {"offset": offset, "data": piece, "done": done}

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, e in self._exports.items() if now - e.touched > EXPORT_TTL_S]:
            del self._exports[key]


# ------------------------------------------------------------------------------ the file


def write_file(out: BinaryIO, header: dict[str, Any], data: bytes) -> None:
    out.write(FILE_MAGIC)
    out.write(json.dumps(header, sort_keys=True).encode() + b"\n")
    out.write(data)


def read_file(path: Path) -> tuple[dict[str, Any], bytes]:
    """Header and state of a snapshot file, verified (size, checksum, decodable state)."""
    raw = path.read_bytes()
    if not raw.startswith(FILE_MAGIC):
        raise MalformedSnapshotError(f"{path} is not a metastore snapshot file")
    rest = raw[len(FILE_MAGIC) :]
    line_end = rest.find(b"\n", 0, HEADER_BYTES_MAX)
    if line_end < 0:
        raise MalformedSnapshotError(f"{path}: header missing or too long")
    try:
        header = json.loads(rest[:line_end])
    except ValueError:
        raise MalformedSnapshotError(f"{path}: header is not JSON") from None
    data = rest[line_end + 1 :]
    if not isinstance(header, dict) or header.get("size_bytes") != len(data):
        raise MalformedSnapshotError(f"{path}: truncated (size does not match the header)")
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise MalformedSnapshotError(f"{path}: checksum mismatch")
    MetastoreState.from_snapshot(data)  # decodes and checks every invariant
    return header, data


# ------------------------------------------------------------------------------ restore


def restore(path: Path, cluster: ClusterConfig) -> dict[str, Any]:
    """Seed every member of `cluster` (a new cluster) with the state in `path`.

    All or nothing: each member's directory is built beside it under a temporary name and
    renamed into place only once every member's is written, so a failure (disk full, a bad
    path) leaves no half-restored cluster that a second attempt would refuse as not empty."""
    header, data = read_file(path)
    state = MetastoreState.from_snapshot(data)
    for n in cluster.nodes:
        d = cluster.node_data_dir(n.id)
        if d.exists() and (not d.is_dir() or any(d.iterdir())):
            raise InvalidArgumentError(
                f"{d} is not empty (or not a directory): restore creates a new cluster; point "
                "--config at a fresh one (metastore cluster init) or remove its data directories",
                details={"data_dir": str(d)},
            )
    voters = tuple(sorted(n.id for n in cluster.nodes))
    addresses = {n.id: (n.host, n.raft_port) for n in cluster.nodes}
    meta = SnapshotMeta(
        index=max(1, state.applied_index),
        term=1,
        tm=state.last_tm,
        conf=ConfState(voters=voters, learners=()),
    )
    snapshot = Snapshot(meta=meta, data=wrap_snapshot_data(data, addresses))
    staged: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for n in cluster.nodes:
            d = cluster.node_data_dir(n.id)
            tmp = d.with_name(f".{d.name}.restoring")
            shutil.rmtree(tmp, ignore_errors=True)  # left by an attempt that was killed
            staged.append((tmp, d))
            tmp.mkdir(parents=True)
            wal, _ = WriteAheadLog.open(tmp / "wal", fsync=True)
            try:
                wal.install_snapshot(snapshot)
                wal.append([], HardState(term=1, vote=0, commit=meta.index))
            finally:
                wal.close()
            identity = {"cluster_id": cluster.cluster_id, "node_id": n.id, "restored_from": header}
            (tmp / IDENTITY_FILE).write_text(json.dumps(identity) + "\n")
            os.chmod(tmp, 0o700)
        for tmp, d in staged:
            if d.exists():
                d.rmdir()  # checked empty above
            tmp.rename(d)
            placed.append(d)
            _fsync_dir(d.parent)
    except BaseException:
        for tmp, _ in staged:
            shutil.rmtree(tmp, ignore_errors=True)
        for d in placed:  # they were absent or empty before
            shutil.rmtree(d, ignore_errors=True)
        raise
    result: dict[str, Any] = {
        "restored_from": header,
        "cluster_id": cluster.cluster_id,
        "members": list(voters),
        "applied_index": meta.index,
    }
    return {**result, **_shared_locations(state)}


def _shared_locations(state: MetastoreState) -> dict[str, Any]:
    """The table locations the restored catalog keeps from the source cluster, and a warning
    when there are any: both clusters now list the same files, and the GC of each deletes
    what it freed and what no commit of its own references (the other's newer files)."""
    tables = [state.txns.table_location(table_id) for table_id in state.txns.table_ids()]
    locations = sorted({location for _, location, _ in tables if location})
    out: dict[str, Any] = {
        "table_locations": locations[:LOCATIONS_LISTED_MAX],
        "table_location_count": len(locations),
    }
    if locations:
        shown = ", ".join(locations[:LOCATIONS_IN_WARNING_MAX])
        more = len(locations) - LOCATIONS_IN_WARNING_MAX
        out["warning"] = (
            f"{len(tables)} table(s) of the restored catalog keep the locations of the cluster "
            f"the snapshot came from ({shown}{f' and {more} more' if more > 0 else ''}). "
            "Run only one of the two clusters on those files: the GC of each deletes files "
            "the other still references (what it freed itself, and files only the other "
            "committed, which are orphans to it). Restore after losing the source cluster, "
            "or stop it for good before starting this one."
        )
    return out


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
