"""Backup and restore of the catalog, etcdutl-style.

Save (`metastore snapshot save FILE`, any node): the node serialises its state machine at its
applied index (a view taken on the event loop, so it is consistent at one index, encoded in a
worker thread: `SnapshotExports.prepare`), keeps
the bytes under an export id until they were read or for EXPORT_TTL_S without a read (in a
file under `<data-dir>/snapshot-exports/`, deleted at once and read back with pread, not on
the heap), and
hands them out in chunks that fit the client frame. The file is

    METASTORE-SNAPSHOT 1\\n
    {"cluster_id", "node_id", "applied_index", "last_tm", "size_bytes", "sha256", "taken_at_ms"}\\n
    <the state, exactly `size_bytes` bytes>

Restore (`metastore snapshot restore FILE --config DIR`) seeds a NEW cluster (its own cluster id,
members and secrets, from `metastore cluster init`; a cluster id equal to the saved one is
refused, since peers of the old cluster would be let in): every member's data directory gets a WAL
holding that state as a Raft snapshot with the new membership, and an IDENTITY; then `cluster up`
starts it like any cluster with state. The old cluster's DD and CSmax travel with the state (they
are fixed for a catalog's life); sessions of the old cluster expire, their leases and owned
protections with them. Its members' recorded client addresses (metastore.member_clients) are
dropped: they name the saved cluster's hosts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any, BinaryIO, Final

from metastore.daemon.config import ClusterConfig
from metastore.errors import InvalidArgumentError, MalformedSnapshotError, UnavailableError
from metastore.member_clients import MemberClients
from metastore.state import MetastoreState
from raft.core.types import ConfState, HardState, Snapshot, SnapshotMeta
from raft.filebytes import FileBytes, FileReadError
from raft.node import IDENTITY_FILE, wrap_snapshot_data
from raft.wal import SNAPSHOT_BYTES_MAX, WriteAheadLog

log = logging.getLogger("metastore.backup")

FILE_MAGIC: Final = b"METASTORE-SNAPSHOT 1\n"
HEADER_BYTES_MAX: Final = 4096
# The largest state a file may hold: what a node's WAL takes as a snapshot (less its framing).
STATE_BYTES_MAX: Final = SNAPSHOT_BYTES_MAX
# Bytes per `snapshot_chunk` reply: well below the client frame (4 MiB) after msgpack framing.
CHUNK_BYTES: Final = 1024 * 1024
# Exports a node keeps at once, and for how long without a read (they are whole states).
EXPORTS_MAX: Final = 2
EXPORT_TTL_S: Final = 600.0
# Under a node's data directory: where its exports are spooled.
EXPORT_SPOOL_DIR: Final = "snapshot-exports"
# An export's file in the spool directory, deleted as soon as it is written (its descriptor
# stays open: the export reads it with pread, raft.filebytes).
EXPORT_SPOOL_SUFFIX: Final = ".part"
# Bytes per write while an export is spooled.
SPOOL_WRITE_BYTES: Final = 4 * 1024 * 1024
# The expiry timer fires this much after an export's TTL ran out, so that one pass finds it
# expired (`_expire` drops what is strictly older than the TTL).
EXPIRY_SLACK_S: Final = 0.05
# Table locations a restore's reply lists, and names in its warning (a catalog may hold
# thousands of tables; the count is always given).
LOCATIONS_LISTED_MAX: Final = 1000
LOCATIONS_IN_WARNING_MAX: Final = 3


@dataclass(slots=True)
class _Export:
    data: bytes | FileBytes  # a deleted spool file's bytes, or the bytes themselves
    header: dict[str, Any]
    touched: float

    def release(self) -> None:
        if isinstance(self.data, FileBytes):
            self.data.close()  # the deleted file's blocks go now


class SnapshotExports:
    """The node side of `snapshot save`: states being downloaded, by export id.

    An export not read for its TTL goes, whether or not another save starts: a timer on the
    event loop looks again while any export is held (each is a whole copy of the catalog,
    and a client that gave up never says so)."""

    def __init__(self, *, ttl_s: float = EXPORT_TTL_S, spool_dir: Path | None = None) -> None:
        self._exports: dict[str, _Export] = {}
        self._ttl_s = ttl_s
        self._timer: asyncio.TimerHandle | None = None
        self._spool_dir = spool_dir
        if spool_dir is not None:
            for leftover in spool_dir.glob(f"export-*{EXPORT_SPOOL_SUFFIX}"):
                leftover.unlink(missing_ok=True)  # a crash between its write and its unlink

    def held_bytes(self) -> int:
        """Bytes of state the exports hold (each a whole copy of the catalog)."""
        return sum(len(e.data) for e in self._exports.values())

    def begin(self, state: MetastoreState, *, cluster_id: str, node_id: int) -> dict[str, Any]:
        """`prepare` and `add` on the calling thread (tools and tests; the server encodes in a
        worker thread)."""
        return self.add(self.prepare(state, cluster_id=cluster_id, node_id=node_id)())

    def prepare(
        self, state: MetastoreState, *, cluster_id: str, node_id: int
    ) -> Callable[[], tuple[str, _Export]]:
        """The first half of a save, on the event loop: a view of `state` at its applied index
        (MetastoreState.snapshot_encoder, milliseconds). The function returned encodes it,
        hashes and spools it, safe in a worker thread whatever is applied meanwhile; `add`
        then offers it for download. Encoding on the loop held it 0.5-0.8 s at a million file
        entries (tests/daemon/test_backup_exports.py)."""
        self._make_room()
        encoder = state.snapshot_encoder()
        applied_index, last_tm = state.applied_index, state.last_tm
        export_id = uuid.uuid4().hex

        def encode() -> tuple[str, _Export]:
            parts = encoder.parts()
            digest = hashlib.sha256()
            for part in parts:
                digest.update(part)
            size = sum(map(len, parts))
            header = _header(
                applied_index=applied_index,
                last_tm=last_tm,
                size_bytes=size,
                sha256=digest.hexdigest(),
                cluster_id=cluster_id,
                node_id=node_id,
            )
            held = self._spool(export_id, parts, size)
            del parts  # the encoding's only other reference: with a spool, the heap is free
            return export_id, _Export(data=held, header=header, touched=time.monotonic())

        return encode

    def add(self, prepared: tuple[str, _Export]) -> dict[str, Any]:
        """Offer a `prepare`d export for download (on the event loop)."""
        export_id, export = prepared
        self._make_room()
        export.touched = time.monotonic()
        self._exports[export_id] = export
        self._arm_timer()
        return {"export_id": export_id, **export.header}

    def _make_room(self) -> None:
        """Expired exports go, and the oldest while EXPORTS_MAX are held (before an encode, so
        its bytes do not come on top of them; again when it is added, for saves that ran at
        the same time)."""
        self._expire()
        while len(self._exports) >= EXPORTS_MAX:
            oldest = min(self._exports, key=lambda k: self._exports[k].touched)
            self._exports.pop(oldest).release()

    def _spool(
        self, export_id: str, parts: list[bytes | memoryview], size: int
    ) -> bytes | FileBytes:
        """The parts written to a spool file that is deleted at once (so a crash leaves
        nothing) and read back with pread (never mapped: a page the disk cannot read would
        kill the node with SIGBUS), or joined without a spool directory, for an empty state,
        or when the file cannot be written (disk full: the save still works, on the heap)."""
        if self._spool_dir is None or not size:
            return b"".join(parts)
        path = self._spool_dir / f"export-{export_id}{EXPORT_SPOOL_SUFFIX}"
        try:
            self._spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                for part in parts:
                    with memoryview(part) as view:
                        written = 0
                        while written < len(view):
                            written += os.write(fd, view[written : written + SPOOL_WRITE_BYTES])
                return FileBytes.of_fd(fd, path, 0, size)
            finally:
                os.close(fd)
                path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("snapshot export kept in memory: cannot spool it to %s: %s", path, exc)
            return b"".join(parts)

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
        if isinstance(export.data, FileBytes):
            try:
                piece = export.data.read(offset, offset + CHUNK_BYTES)
            except FileReadError as exc:
                self._exports.pop(export_id).release()
                log.error("snapshot export %s dropped: %s", export_id, exc)
                raise UnavailableError(
                    f"snapshot export {export_id} cannot be read back from this node's disk "
                    f"({exc}): start the save again (on another node if it fails again)",
                    details={"export_id": export_id},
                ) from None
        else:
            piece = export.data[offset : offset + CHUNK_BYTES]
        done = offset + len(piece) >= len(export.data)
        if done:
            self._exports.pop(export_id).release()
        return {"offset": offset, "data": piece, "done": done}

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, e in self._exports.items() if now - e.touched > self._ttl_s]:
            self._exports.pop(key).release()

    def _arm_timer(self) -> None:
        """Expire at the oldest export's TTL (and again then, while any is left)."""
        if self._timer is not None or not self._exports:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a tool, a test): the next begin expires them
            return
        oldest = min(e.touched for e in self._exports.values())
        delay_s = max(0.0, oldest + self._ttl_s - time.monotonic()) + EXPIRY_SLACK_S
        self._timer = loop.call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._expire()
        self._arm_timer()


# ------------------------------------------------------------------------------ the file


def snapshot_header(
    state: MetastoreState, data: bytes, *, cluster_id: str, node_id: int
) -> dict[str, Any]:
    """The header of a snapshot file holding `data` (`state` encoded): the one a node's export
    sends, and the one an offline save of a data directory writes (offline_backup)."""
    return _header(
        applied_index=state.applied_index,
        last_tm=state.last_tm,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        cluster_id=cluster_id,
        node_id=node_id,
    )


def _header(
    *, applied_index: int, last_tm: int, size_bytes: int, sha256: str, cluster_id: str, node_id: int
) -> dict[str, Any]:
    return {
        "cluster_id": cluster_id,
        "node_id": node_id,
        "applied_index": applied_index,
        "last_tm": last_tm,
        "size_bytes": size_bytes,
        "sha256": sha256,
        "taken_at_ms": int(time.time() * 1000),
    }


def write_head(out: BinaryIO, header: dict[str, Any]) -> None:
    """The magic and the header line: the state's `size_bytes` bytes follow (written whole by
    `write_file`, or chunk by chunk as `snapshot save` downloads them)."""
    out.write(FILE_MAGIC)
    out.write(json.dumps(header, sort_keys=True).encode() + b"\n")


def write_file(out: BinaryIO, header: dict[str, Any], data: bytes) -> None:
    write_head(out, header)
    out.write(data)


def read_file(path: Path) -> tuple[dict[str, Any], bytes]:
    """Header and state of a snapshot file, verified (size, checksum, decodable state).

    The magic, the header and the file's size are checked before the state is read, so a
    file that is no snapshot, one cut short, or a header claiming more than a snapshot can
    hold is refused without reading it into memory; the state is then read once, into one
    buffer. A pipe (`restore <(curl ...)`) is read the same way, up to the size its header
    gives."""
    with path.open("rb") as f:
        if f.read(len(FILE_MAGIC)) != FILE_MAGIC:
            raise MalformedSnapshotError(f"{path} is not a metastore snapshot file")
        line = f.readline(HEADER_BYTES_MAX)
        if not line.endswith(b"\n"):
            raise MalformedSnapshotError(f"{path}: header missing or too long")
        try:
            header = json.loads(line)
        except ValueError:
            raise MalformedSnapshotError(f"{path}: header is not JSON") from None
        size = header.get("size_bytes") if isinstance(header, dict) else None
        if type(size) is not int or not 0 <= size <= STATE_BYTES_MAX:
            raise MalformedSnapshotError(
                f"{path}: the header's size_bytes {size!r} is not a snapshot's size "
                f"(0 to {STATE_BYTES_MAX} bytes)"
            )
        stat = os.fstat(f.fileno())
        if S_ISREG(stat.st_mode) and stat.st_size - f.tell() != size:
            raise _size_mismatch(path, size, stat.st_size - f.tell())
        data = f.read(size)  # one buffer of the size the header gives (checked above)
        if len(data) != size:
            raise _size_mismatch(path, size, len(data))
        if f.read(1):
            raise _size_mismatch(path, size, None)
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise MalformedSnapshotError(f"{path}: checksum mismatch")
    MetastoreState.from_snapshot(data)  # decodes and checks every invariant
    return header, data


def _size_mismatch(path: Path, size: int, found: int | None) -> MalformedSnapshotError:
    if found is not None and found < size:
        return MalformedSnapshotError(
            f"{path}: truncated (the header gives {size} bytes of state, the file holds {found})"
        )
    return MalformedSnapshotError(
        f"{path}: the file holds more than the {size} bytes of state its header gives (size "
        "does not match the header)"
    )


# ------------------------------------------------------------------------------ restore


def restore(path: Path, cluster: ClusterConfig) -> dict[str, Any]:
    """Seed every member of `cluster` (a new cluster) with the state in `path`.

    All or nothing: the members' directories are built under a temporary name and renamed
    into place only once every member's is written, so a failure (disk full, a bad path)
    leaves no half-restored cluster that a second attempt would refuse as not empty. When the
    data directory does not exist yet, one rename puts all of them in place, so a restore
    killed at any point does not either; into an existing (empty) data directory the members
    are renamed one by one."""
    header, data = read_file(path)
    state = MetastoreState.from_snapshot(data)
    if state.member_clients:
        # The saved cluster's members' client addresses (`add-node --client-address`) name its
        # hosts: a node id this cluster adds without an address would be forwarded to them.
        state.member_clients = MemberClients()
        data = state.to_snapshot()
    saved_cluster_id = header.get("cluster_id")
    if saved_cluster_id == cluster.cluster_id:
        # Peers tell clusters apart by id (and secret): a member of the saved cluster, which
        # may still hold its data, would be let into the restored one, and with its higher
        # term and longer log take it over. Reusing the saved cluster's config directory
        # (its secrets too) is the usual way to get here.
        raise InvalidArgumentError(
            f"{path} was saved from cluster {saved_cluster_id!r}, the cluster id of "
            f"{cluster.path}: a restore creates a new cluster, whose id must differ so that "
            "nodes of the old cluster are refused; set another cluster_id in that file, or "
            "make the new cluster's config with `metastore cluster init DIR --cluster-id NEW`",
            details={"cluster_id": cluster.cluster_id},
        )
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

    def write_member(directory: Path, node_id: int) -> None:
        shutil.rmtree(directory, ignore_errors=True)  # left by an attempt that was killed
        directory.mkdir(parents=True)
        wal, _ = WriteAheadLog.open(directory / "wal", fsync=True)
        try:
            wal.install_snapshot(snapshot)
            wal.append([], HardState(term=1, vote=0, commit=meta.index))
        finally:
            wal.close()
        identity = {"cluster_id": cluster.cluster_id, "node_id": node_id, "restored_from": header}
        with (directory / IDENTITY_FILE).open("w") as f:
            f.write(json.dumps(identity) + "\n")
            f.flush()
            os.fsync(f.fileno())  # a member whose IDENTITY a power loss emptied cannot start
        os.chmod(directory, 0o700)
        _fsync_dir(directory)

    data_dir = cluster.data_dir
    if not data_dir.exists() and not data_dir.is_symlink():
        # The usual case (a fresh `cluster init`): every member is built under one temporary
        # directory that a single rename turns into the data directory, so even a restore
        # killed at any point (kill -9, a power loss) leaves every member restored or none.
        # Not over an existing one: it may be a mount point or a symlink to another disk.
        staging = data_dir.with_name(f".{data_dir.name}.restoring")
        shutil.rmtree(staging, ignore_errors=True)  # left by an attempt that was killed
        try:
            for n in cluster.nodes:
                write_member(staging / cluster.node_data_dir(n.id).name, n.id)
            _fsync_dir(staging)
            staging.rename(data_dir)
            _fsync_dir(data_dir.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    else:
        _restore_member_by_member(cluster, write_member)
    result: dict[str, Any] = {
        "restored_from": header,
        "cluster_id": cluster.cluster_id,
        "members": list(voters),
        "applied_index": meta.index,
    }
    return {**result, **_shared_locations(state, cluster)}


def _restore_member_by_member(
    cluster: ClusterConfig, write_member: Callable[[Path, int], None]
) -> None:
    """Each member's directory built beside it and renamed into place once all are written
    (the data directory exists, maybe a mount point or a symlink, so it is not replaced
    whole): a failure leaves no member restored; a kill between two renames can."""
    staged: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for n in cluster.nodes:
            d = cluster.node_data_dir(n.id)
            tmp = d.with_name(f".{d.name}.restoring")
            staged.append((tmp, d))
            write_member(tmp, n.id)
        for tmp, d in staged:
            if d.exists():
                d.rmdir()  # checked empty before
            tmp.rename(d)
            placed.append(d)
            _fsync_dir(d.parent)
    except BaseException:
        for tmp, _ in staged:
            shutil.rmtree(tmp, ignore_errors=True)
        for d in placed:  # they were absent or empty before
            shutil.rmtree(d, ignore_errors=True)
        raise


def _shared_locations(state: MetastoreState, cluster: ClusterConfig) -> dict[str, Any]:
    """The table locations the restored catalog keeps from the source cluster, and a warning
    when there are any: both clusters now list the same files, and the GC of each deletes
    what it freed and what no commit of its own references (the other's newer files). Those
    outside the new cluster's warehouse and `allowed_locations` (a `cluster init` writes its
    own warehouse and `[]`) are named too: its GC would leave those tables alone."""
    tables = [state.txns.table_location(table_id) for table_id in state.txns.table_ids()]
    locations = sorted({location for _, location, _ in tables if location})
    roots = cluster.location_roots()
    not_allowed = [location for location in locations if not roots.allows(location)]
    out: dict[str, Any] = {
        "table_locations": locations[:LOCATIONS_LISTED_MAX],
        "table_location_count": len(locations),
        "locations_not_allowed": not_allowed[:LOCATIONS_LISTED_MAX],
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
    if not_allowed:
        shown = ", ".join(not_allowed[:LOCATIONS_IN_WARNING_MAX])
        more = len(not_allowed) - LOCATIONS_IN_WARNING_MAX
        out["warning"] += (
            f" {len(not_allowed)} of these location(s) ({shown}"
            f"{f' and {more} more' if more > 0 else ''}) are outside this cluster's warehouse "
            f"and allowed_locations ({', '.join(roots.describe())}): before `cluster up`, list "
            f"their root (the source's warehouse) in allowed_locations of {cluster.path}, or "
            "its GC skips those tables (`gc run`: left alone) and never collects their files."
        )
    return out


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
