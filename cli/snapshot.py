"""`metastore snapshot save|restore`: back the catalog up to a file, or seed a new cluster from one.

`save FILE` asks one node (the first that can serve it: one that is starting or lags, answering
NOT_READY or TIMEOUT, is passed over; or exactly --endpoint) for its catalog at its applied
index, downloads it in chunks from that node (a chunk that fails with a retryable error is
asked again, CHUNK_TRIES_MAX tries) with progress on stderr, and writes FILE (header with the
cluster id, applied index and SHA-256, then the state), owner-only (0600), verified before it
is renamed into place; an existing FILE is never replaced unless --force, and a second save to
the same FILE while one runs is refused (FILE.partial is locked).
`save FILE --data-dir DIR` asks no node: it rebuilds the catalog from the write-ahead log and
snapshots of the STOPPED node whose data directory is DIR (metastore/daemon/offline_backup.py),
for a cluster that lost its quorum for good, and writes it through the same writer
(`_write_verified`), so the file is the one `restore` takes.
`restore FILE --config DIR` checks FILE and writes it as the starting state of every member of
the NEW cluster in DIR (see metastore/daemon/backup.py); start it with `metastore cluster up
--config DIR`. Table data (Parquet) is not part of the snapshot: save the catalog first, then
copy the warehouse with your storage's tools (a catalog saved after the copy lists files
committed in between that the copy lacks; docs/operations.md keeps the GC off them meanwhile).
"""

from __future__ import annotations

import copy
import fcntl
import io
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

import click
from rich.text import Text

from cli.context import LOCAL_CONFIG_DIR, App, app
from cli.errors import EXIT_REFUSED, EXIT_USAGE, CliError, writing_file
from cli.output import emit, kv_table
from hlc import HlcError, make_ts, to_iso
from metastore.client import SyncMetastoreClient, parse_endpoint
from metastore.daemon import backup, offline_backup
from metastore.daemon.config import CLUSTER_FILE_NAME, load_cluster_config
from metastore.errors import (
    ErrorCode,
    InvalidArgumentError,
    MalformedSnapshotError,
    MetastoreError,
)
from raft.oserror import errno_text

# Tries of one `snapshot_chunk` request (first included) on a retryable error (a dropped
# connection, a timeout) before the save gives up. Only the node that began the export holds
# it, so every try goes to that node; reading a range again changes nothing there.
CHUNK_TRIES_MAX: Final = 3
# Pause before the second try of a chunk; doubled before each further one.
CHUNK_RETRY_PAUSE_MS: Final = 250


@click.group("snapshot")
def snapshot() -> None:
    """Back up the catalog to a file, or seed a new cluster from one."""


@snapshot.command("save")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--endpoint",
    default=None,
    metavar="HOST:PORT",
    help="Take it from this node only (no other is tried).",
)
@click.option(
    "--data-dir",
    "data_dir",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="Read the catalog from this stopped node's data directory (node-N under the "
    "data_dir of its cluster.toml, e.g. cluster_configs/local/data/node-3) instead of asking a "
    "running node: for a cluster that lost its quorum for good. Refused while a node runs on it.",
)
@click.option(
    "--include-uncommitted",
    is_flag=True,
    help="With --data-dir: also apply the entries the node held past the commit index it "
    "recorded (they may or may not have committed).",
)
@click.option("--force", is_flag=True, help="Replace FILE if it exists.")
@click.pass_context
def snapshot_save(
    ctx: click.Context,
    file: Path,
    endpoint: str | None,
    data_dir: Path | None,
    include_uncommitted: bool,
    force: bool,
) -> None:
    """Write the catalog (every namespace, table, schema version, commit, file entry, session,
    lease, protection, job and revoked certificate) to FILE, consistent at one applied index of
    one node. Admin only. An existing FILE (an earlier backup) is kept, and the command
    refused, unless --force; FILE appears only once complete and verified.

    A node that is starting or lags (NOT_READY, a catch-up TIMEOUT) is passed over, unless
    --endpoint names it; a chunk that fails with a retryable error is asked again of the same
    node (3 tries). A node that cannot show it is caught up (no leader: the cluster lost its
    quorum) refuses, rather than hand out an old catalog as current. Table data (Parquet) is
    not in FILE: save the catalog first, then copy the warehouse with your storage's tools
    (docs/operations.md: a protection keeps the GC off the catalog's files meanwhile).

    With --data-dir DIR no node is asked (and no token is needed: it takes the rights to read
    DIR's files): the catalog is rebuilt from the write-ahead log and snapshots of the stopped
    node whose data directory is DIR (nothing there is changed), up to
    the commit index it recorded; entries past it (which may have committed on a majority
    without it, or never) are left out and counted in the header, unless
    --include-uncommitted. The way out of a lost quorum: save from the surviving member, then
    `snapshot restore` into a new cluster (docs/operations.md). Refused while a node runs on
    DIR (its log is locked), for a directory that is no node's, and for a log that does not
    replay (the damaged file is named).

    \b
    Examples:
      metastore snapshot save /backups/catalog-2026-11-27.snap
      metastore snapshot save survivor.snap --data-dir cluster_configs/local/data/node-3
    """
    if file.exists() and not force:  # before any request: a typo must not cost a download
        raise _file_exists(file)
    _check_directory(file)
    if data_dir is not None and endpoint is not None:
        raise CliError(
            "USAGE",
            "--data-dir reads a stopped node's files and asks no node: drop --endpoint",
            exit_code=EXIT_USAGE,
        )
    if include_uncommitted and data_dir is None:
        raise CliError(
            "USAGE",
            "--include-uncommitted applies to --data-dir only (a running node saves what it "
            "applied)",
            exit_code=EXIT_USAGE,
        )
    if endpoint is not None:
        try:
            parse_endpoint(endpoint)
        except InvalidArgumentError as exc:  # a bad flag: usage (2), not a refusal (5)
            raise CliError("USAGE", f"--endpoint: {exc.message}", exit_code=EXIT_USAGE) from None
    a = app(ctx)
    if data_dir is None:
        header = _write_verified(file, force, lambda out: _download(a, out, endpoint=endpoint))
    else:
        offline_dir = data_dir

        def from_data_dir(out: BinaryIO) -> dict[str, object]:
            saved = offline_backup.read_data_dir(
                offline_dir, include_uncommitted=include_uncommitted
            )
            backup.write_file(out, saved.header, saved.data)
            return {"from": str(offline_dir), **saved.header}

        header = _write_verified(file, force, from_data_dir)
    emit(a.output, header, lambda: [kv_table(_shown(header), title="snapshot saved")])
    after = header.get("entries_after_commit")
    if data_dir is not None and a.output != "json" and isinstance(after, int) and after:
        verb = "were applied too" if header.get("uncommitted_included") else "were left out"
        click.echo(
            f"note: {after} entries past the commit index {header.get('commit_index')} "
            f"{verb} (--include-uncommitted)",
            err=True,
        )


def _check_directory(file: Path) -> None:
    """FILE's directory must exist (a save does not create it: a typo in a path would make a
    tree nobody looks at), before any request: otherwise the error came after the export began,
    and named FILE.partial, a file the user never mentioned."""
    directory = file.parent
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise CliError(
            "USAGE",
            f"FILE {file}: its directory {directory} {what} (create it first); nothing was written",
            exit_code=EXIT_USAGE,
        )


def _write_verified(
    file: Path, force: bool, write_state: Callable[[BinaryIO], dict[str, object]]
) -> dict[str, object]:
    """The one writer of snapshot files, online or offline: `write_state` writes the file's
    contents (backup.write_head / write_file) into FILE.partial, locked for this save, and
    returns what to show; the file is then synced, verified (backup.read_file: size, checksum,
    a full decode) and put in place as FILE. A failed save leaves nothing behind."""
    partial = file.with_name(file.name + ".partial")
    fd = _lock_partial(partial, file)  # before any request: a refused save costs no export
    try:
        with writing_file(file):
            # fchmod too: a .partial left by a killed save keeps its mode through O_CREAT.
            os.ftruncate(fd, 0)
            os.fchmod(fd, 0o600)
        with _FileWriter(os.dup(fd), file) as out:
            shown = write_state(out)
            out.flush()
            with writing_file(file):
                os.fsync(out.fileno())
        backup.read_file(partial)  # size, checksum and a full decode, before it counts as saved
        with writing_file(file):
            _put_in_place(partial, file, force=force)
    except BaseException:
        partial.unlink(missing_ok=True)  # ours (locked): a failed save leaves nothing behind
        raise
    finally:
        os.close(fd)
    return {"file": str(file), **shown}


class _FileWriter(io.BufferedWriter):
    """FILE.partial, buffered, whose failed writes (a full disk: ENOSPC names no file) are a
    CliError naming FILE (`writing_file`), not a bare errno. Takes ownership of `fd`."""

    def __init__(self, fd: int, file: Path) -> None:
        super().__init__(io.FileIO(fd, "wb"))
        self._file = file

    def write(self, data: Any, /) -> int:
        with writing_file(self._file):
            return super().write(data)

    def flush(self) -> None:
        with writing_file(self._file):
            super().flush()

    def close(self) -> None:
        with writing_file(self._file):
            super().close()


def _lock_partial(partial: Path, file: Path) -> int:
    """Open and lock FILE.partial (owner only: the whole catalog, which the cluster serves to
    admins alone): one save per FILE at a time. A second one is refused instead of
    truncating the first's download; a killed save's lock went with its process."""
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:  # no write permission, a read-only mount: say it of FILE
        raise CliError(
            "IO_ERROR",
            f"cannot write {file} (a file is made beside it first, in {file.parent}): "
            f"{errno_text(exc)}; nothing was written",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The name may have moved on meanwhile (the previous save put it in place, or
        # removed it): the lock must be on what the name holds now.
        if os.fstat(fd).st_ino != os.stat(partial).st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        raise CliError(
            "ALREADY_EXISTS",
            f"another `snapshot save` to {file} is running ({partial} is locked); nothing was "
            "written",
            exit_code=EXIT_REFUSED,
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _download(a: App, out: BinaryIO, *, endpoint: str | None) -> dict[str, object]:
    """Take the snapshot from a node into `out` (the locked FILE.partial). What to show."""
    client = a.client()
    header: dict[str, object] | None = None
    used = ""
    failures: dict[str, MetastoreError] = {}
    for ep in [endpoint] if endpoint else client.endpoints:
        try:
            header = client.call("snapshot_begin", {}, ep)
            used = ep
            break
        except MetastoreError as exc:
            failures[ep] = exc
    if header is None:
        raise _no_node_began(failures)
    export_id = str(header.pop("export_id"))
    header.pop("waited_ms", None)  # how this call went, not part of the file's header
    size = int(str(header["size_bytes"]))
    offset = 0
    backup.write_head(out, header)
    while True:
        piece = _chunk(client, used, export_id, offset)
        data = piece["data"]
        if not isinstance(data, bytes) or offset + len(data) > size:
            raise MalformedSnapshotError(
                f"{used} sent more than the {size} bytes of state its header gave "
                "(size does not match the header)"
            )
        out.write(data)
        offset += len(data)
        click.echo(f"\rdownloaded {offset:,} of {size:,} bytes", err=True, nl=False)
        if piece["done"]:
            break
        if offset >= size or not data:  # every piece moves on, up to the size
            raise MalformedSnapshotError(
                f"{used} did not end the download at the {size} bytes of state its "
                "header gave (size does not match the header)"
            )
    click.echo("", err=True)
    return {"from": used, **header}


# What a save that no node served adds when none was ready: a cluster without a leader for good
# serves no save, and the way out is offline (docs/operations.md).
LOST_QUORUM_HINT = (
    "; if the cluster has lost its quorum for good (`cluster status`: no leader), save from a "
    "stopped survivor's files: metastore snapshot save FILE --data-dir DATA_DIR/node-N "
    '(DATA_DIR: data_dir of its cluster.toml; docs/operations.md, "Losing quorum")'
)


def _no_node_began(failures: dict[str, MetastoreError]) -> MetastoreError:
    """The error of a save no endpoint began (with the way out of a lost quorum when no node
    was ready: NOT_READY, or unreachable)."""
    error = _first_answer(failures)
    not_ready = (ErrorCode.NOT_READY, ErrorCode.UNAVAILABLE)
    if all(e.code in not_ready for e in failures.values()):
        error = copy.copy(error)
        error.message += LOST_QUORUM_HINT
        error.args = (error.message,)
    return error


def _first_answer(failures: dict[str, MetastoreError]) -> MetastoreError:
    """With one endpoint, its own error; with several, the answer of a node that answered
    rather than the last endpoint's (a survivor without a quorum says NOT_READY, which the
    nodes that are gone, refusing the connection, would hide), in a message that lists what
    every endpoint said."""
    errors = list(failures.values())
    if len(errors) == 1:
        return errors[0]
    answered = [e for e in errors if e.code is not ErrorCode.UNAVAILABLE]
    error = copy.copy(answered[0] if answered else errors[-1])
    tried = {ep: _endpoint_failure(ep, e) for ep, e in failures.items()}
    error.message = "snapshot_begin failed on every endpoint: " + "; ".join(
        f"{ep}: {said}" for ep, said in tried.items()
    )
    error.args = (error.message,)
    error.details = {**error.details, "tried": tried}
    return error


def _endpoint_failure(endpoint: str, error: MetastoreError) -> str:
    """What `endpoint` said: its answer, or why it could not be asked ("connection refused")."""
    by_endpoint = error.details.get("endpoints")
    if error.code is ErrorCode.UNAVAILABLE and isinstance(by_endpoint, dict):
        said = by_endpoint.get(endpoint)
        if isinstance(said, str):
            return said
    return f"{error.code.value}: {error.message}"


def _chunk(
    client: SyncMetastoreClient, endpoint: str, export_id: str, offset: int
) -> dict[str, Any]:
    """The piece of export `export_id` at `offset`, from `endpoint` (the node that began it),
    asked again on a retryable error, up to CHUNK_TRIES_MAX tries: one dropped connection in a
    long download no longer throws away what was downloaded. A chunk request is a read of a
    range; the one exception is the last piece, which frees the export on the node, so asking
    again for it after a lost reply is answered INVALID_ARGUMENT (no such export), which ends
    the save as before."""
    args = {"export_id": export_id, "offset": offset}
    pause_ms = CHUNK_RETRY_PAUSE_MS
    for tries in range(1, CHUNK_TRIES_MAX + 1):
        try:
            return client.call("snapshot_chunk", args, endpoint)
        except MetastoreError as exc:
            if not exc.retryable or tries == CHUNK_TRIES_MAX:
                raise
            click.echo(
                f"\nchunk at offset {offset:,} failed ({exc.code.value}: {exc.message}); "
                f"asking {endpoint} again",
                err=True,
            )
        time.sleep(pause_ms / 1000)  # a backoff for a node that just dropped us, not a wait
        pause_ms *= 2
    raise AssertionError("unreachable: the last try returns or raises")


def _file_exists(file: Path) -> CliError:
    return CliError(
        "ALREADY_EXISTS",
        f"{file} exists; pass --force to replace it (nothing was written)",
        exit_code=EXIT_REFUSED,
    )


def _put_in_place(partial: Path, file: Path, *, force: bool) -> None:
    """Rename the verified `partial` to `file` atomically, and make the new name durable (a
    power loss right after "saved" must not lose the backup). Without `force`, a `file` made
    since the check at the start (another save) is kept: a hard link fails if the name is
    taken, where a rename would replace it."""
    _link_or_rename(partial, file, force=force)
    fd = os.open(file.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_or_rename(partial: Path, file: Path, *, force: bool) -> None:
    if force:
        partial.replace(file)
        return
    try:
        os.link(partial, file)
    except FileExistsError:
        raise _file_exists(file) from None
    except OSError:  # a filesystem without hard links: the check at the start stands
        if file.exists():
            raise _file_exists(file) from None
        partial.replace(file)
        return
    partial.unlink()


def _shown(result: dict[str, object]) -> dict[str, object]:
    """The table form: when the node took it as a time rather than epoch milliseconds."""
    shown = dict(result)
    taken_at_ms = shown.pop("taken_at_ms", None)
    if isinstance(taken_at_ms, int) and not isinstance(taken_at_ms, bool):
        try:
            shown["taken at"] = to_iso(make_ts(taken_at_ms))
        except HlcError:
            shown["taken_at_ms"] = taken_at_ms
    return shown


@snapshot.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option(
    "--config",
    "config_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=LOCAL_CONFIG_DIR,
    metavar="DIR",
    help="The NEW cluster's config directory (metastore cluster init); its data directories "
    "must be empty.",
)
@click.pass_context
def snapshot_restore(ctx: click.Context, file: Path, config_dir: Path) -> None:
    """Create a new cluster whose catalog is FILE's: every member of the cluster in --config
    starts from it. Then run `metastore cluster up --config DIR`. Its cluster id must differ
    from the saved cluster's (nodes of the old cluster are then refused as peers).

    The restored tables keep their locations: the new cluster uses the source cluster's table
    files. Run only one of the two on them (restore after losing the source, or stop it for
    good first): the GC of each deletes files only the other references.

    \b
    Example:
      metastore snapshot restore /backups/catalog-2026-11-27.snap --config cluster_configs/restored
    """
    a = app(ctx)
    cluster = load_cluster_config(config_dir / CLUSTER_FILE_NAME)
    result = backup.restore(file, cluster)
    emit(
        a.output,
        result,
        lambda: [
            Text(
                f"restored {file} (cluster {result['restored_from'].get('cluster_id')}, index "
                f"{result['applied_index']}) into cluster {result['cluster_id']}, members "
                f"{result['members']}; start it with: metastore cluster up --config {config_dir}"
            )
        ],
    )
    warning = result.get("warning")
    if a.output != "json" and isinstance(warning, str):
        click.echo(f"warning: {warning}", err=True)
