"""`metastore snapshot save|restore`: back the catalog up to a file, or seed a new cluster from one.

`save FILE` asks one node (the first that answers, or --endpoint) for its catalog at its applied
index, downloads it in chunks with progress on stderr, and writes FILE (header with the cluster
id, applied index and SHA-256, then the state), owner-only (0600), verified before it is
renamed into place; an existing FILE is never replaced unless --force.
`restore FILE --config DIR` checks FILE and writes it as the starting state of every member of
the NEW cluster in DIR (see metastore/daemon/backup.py); start it with `metastore cluster up
--config DIR`. Table data (Parquet) is not part of the snapshot: back up the warehouse with
your storage's tools, and take the catalog snapshot after it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from rich.text import Text

from cli.context import LOCAL_CONFIG_DIR, app
from cli.errors import EXIT_REFUSED, EXIT_USAGE, CliError
from cli.output import emit, kv_table
from hlc import HlcError, make_ts, to_iso
from metastore.client import parse_endpoint
from metastore.daemon import backup
from metastore.daemon.config import CLUSTER_FILE_NAME, load_cluster_config
from metastore.errors import InvalidArgumentError, MetastoreError


@click.group("snapshot")
def snapshot() -> None:
    """Back up the catalog to a file, or seed a new cluster from one."""


@snapshot.command("save")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--endpoint", default=None, help="Take it from this node (HOST:PORT).")
@click.option("--force", is_flag=True, help="Replace FILE if it exists.")
@click.pass_context
def snapshot_save(ctx: click.Context, file: Path, endpoint: str | None, force: bool) -> None:
    """Write the catalog (every namespace, table, schema version, commit, file entry, session,
    lease and protection) to FILE, consistent at one applied index of one node. Admin only.
    An existing FILE (an earlier backup) is kept, and the command refused, unless --force;
    FILE appears only once complete and verified."""
    if file.exists() and not force:  # before any request: a typo must not cost a download
        raise _file_exists(file)
    if endpoint is not None:
        try:
            parse_endpoint(endpoint)
        except InvalidArgumentError as exc:  # a bad flag: usage (2), not a refusal (5)
            raise CliError("USAGE", f"--endpoint: {exc.message}", exit_code=EXIT_USAGE) from None
    a = app(ctx)
    client = a.client()
    header: dict[str, object] | None = None
    used = ""
    last: MetastoreError | None = None
    for ep in [endpoint] if endpoint else client.endpoints:
        try:
            header = client.call("snapshot_begin", {}, ep)
            used = ep
            break
        except MetastoreError as exc:
            last = exc
    if header is None:
        assert last is not None
        raise last
    export_id = str(header.pop("export_id"))
    header.pop("waited_ms", None)  # how this call went, not part of the file's header
    size = int(str(header["size_bytes"]))
    partial = file.with_name(file.name + ".partial")
    offset = 0
    try:
        # Owner only: the whole catalog, which the cluster serves to admins alone (a node
        # keeps it in a 0700 directory). fchmod too: a .partial left by a killed save keeps
        # its mode through O_CREAT.
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(backup.FILE_MAGIC)
            out.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            while True:
                piece = client.call(
                    "snapshot_chunk", {"export_id": export_id, "offset": offset}, used
                )
                data = piece["data"]
                out.write(data)
                offset += len(data)
                click.echo(f"\rdownloaded {offset:,} of {size:,} bytes", err=True, nl=False)
                if piece["done"]:
                    break
            out.flush()
            os.fsync(out.fileno())
        click.echo("", err=True)
        backup.read_file(partial)  # size, checksum and a full decode, before it counts as saved
        _put_in_place(partial, file, force=force)
    except BaseException:
        partial.unlink(missing_ok=True)  # a failed or interrupted save leaves nothing behind
        raise
    result = {"file": str(file), "from": used, **header}
    emit(a.output, result, lambda: [kv_table(_shown(result), title="snapshot saved")])


def _file_exists(file: Path) -> CliError:
    return CliError(
        "ALREADY_EXISTS",
        f"{file} exists; pass --force to replace it (nothing was written)",
        exit_code=EXIT_REFUSED,
    )


def _put_in_place(partial: Path, file: Path, *, force: bool) -> None:
    """Rename the verified `partial` to `file` atomically. Without `force`, a `file` made
    since the check at the start (another save) is kept: a hard link fails if the name is
    taken, where a rename would replace it."""
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
    help="The NEW cluster's config directory (metastore cluster init); its data directories "
    "must be empty.",
)
@click.pass_context
def snapshot_restore(ctx: click.Context, file: Path, config_dir: Path) -> None:
    """Create a new cluster whose catalog is FILE's: every member of the cluster in --config
    starts from it. Then run `metastore cluster up --config DIR`.

    The restored tables keep their locations: the new cluster uses the source cluster's table
    files. Run only one of the two on them (restore after losing the source, or stop it for
    good first): the GC of each deletes files only the other references."""
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
