"""`metastore table files|read`: a table's committed data, now or AS OF a timestamp.

`files` lists what the transaction log says the table consists of at a timestamp (the `files`
op). `read` reads those files' rows with pyarrow, shaped by the schema in force at the same
timestamp (metastore.client.parquet, the reader the data source uses too); Spark is not
involved, so it works on any machine that can reach the warehouse.

Both pin one timestamp: `--as-of` if given, otherwise the answering node's safe time (the `files`
op's default). By default (`--consistency l`, as etcdctl) that safe time is first made to reach
the newest timestamp the leader acknowledged (the `read_ts` op, after a ReadIndex), so the
listing sees every commit acknowledged before the command started, made by any process on any
node; `--consistency s` skips that round trip and may trail by up to about DD. `read` then asks
for the schema at exactly the timestamp the `files` answer names, so files and schema always
belong to the same moment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click
from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from cli.context import READ_TIMESTAMP, TABLE_NAME, app
from cli.errors import EXIT_GENERIC, EXIT_NOT_FOUND, CliError
from cli.output import emit, kv_table, ts_cell
from cli.table import AS_OF_HELP, explaining_not_found

if TYPE_CHECKING:
    from metastore.client.parquet import DataReadError

FC = TypeVar("FC", bound=Callable[..., Any])

# `table read` prints rows to a terminal or a script: a screenful by default, and at most this
# many (bulk reads are Spark's job: `spark.read.format("metastore")`).
READ_ROWS_DEFAULT: Final = 20
READ_ROWS_MAX: Final = 10_000

AS_OF_DEFAULT_HELP = " Default: the answering node's safe time (see --consistency)."
CONSISTENCY_HELP = (
    "Without --as-of: l (linearizable, the default) sees every commit acknowledged before the "
    "command started, from any process: it asks the leader for the newest acknowledged "
    "timestamp (one more round trip) and the node answering waits until its safe time reaches "
    "it. s (serializable) reads at the answering node's safe time at once, and may miss a "
    "commit acknowledged a moment ago (up to about DD)."
)


def consistency_option(help_text: str = CONSISTENCY_HELP) -> Callable[[FC], FC]:
    return click.option(
        "--consistency",
        type=click.Choice(["l", "s"]),
        default="l",
        show_default=True,
        help=help_text,
    )


def linearize(client: Any, as_of: int | None, consistency: str) -> None:
    """Make the client's next listing without `as_of` see every acknowledged commit."""
    from metastore.errors import UnknownOpError

    if as_of is None and consistency == "l":
        try:
            client.read_ts()
        except UnknownOpError:
            # A node of an older release (rolling upgrade): the best it offers is serializable.
            click.echo(
                "warning: the cluster does not know read_ts (an older release); reading at "
                "the answering node's safe time (--consistency s)",
                err=True,
            )


# The reader's typed failures (metastore.client.parquet) by exit code; others are generic.
READ_ERROR_EXIT_CODES: Final = {"DATA_FILE_NOT_FOUND": EXIT_NOT_FOUND}


@click.command("files")
@click.argument("name", type=TABLE_NAME)
@click.option("--as-of", type=READ_TIMESTAMP, help=AS_OF_HELP + AS_OF_DEFAULT_HELP)
@consistency_option()
@click.pass_context
def table_files(ctx: click.Context, name: str, as_of: int | None, consistency: str) -> None:
    """List the data files of NS.TABLE live now (or at --as-of): path, size, rows and the commit
    timestamp that added each, with totals.

    \b
    Example:
      metastore table files sales.orders --as-of 2026-11-22T10:00:00Z
    """
    a = app(ctx)
    client = a.client()
    linearize(client, as_of, consistency)
    with explaining_not_found(client, name, as_of):
        result = client.files(name, as_of=as_of)
    emit(a.output, result, lambda: _files_tables(result))


def _files_tables(result: dict[str, Any]) -> list[RenderableType]:
    header = {
        "table": result.get("table"),
        "version": result.get("version"),
        "as_of": result.get("as_of"),
        "location": result.get("location"),
    }
    if result.get("expanded_manifests"):
        # Older entries came from manifest files (metastore.manifests), read and checked here.
        header["manifests"] = result.get("expanded_manifests")
    files = result.get("files") or []
    table = Table(box=box.SIMPLE_HEAD, show_footer=True)
    table.add_column("PATH", footer=f"total: {len(files)} files", overflow="fold")
    # Numbers and times never wrap (a narrow terminal folds the path instead).
    size_bytes, rows = str(result.get("size_bytes", 0)), str(result.get("rows", 0))
    table.add_column("SIZE BYTES", footer=size_bytes, justify="right", no_wrap=True)
    table.add_column("ROWS", footer=rows, justify="right", no_wrap=True)
    table.add_column("ADDED TS", no_wrap=True)
    for f in files:
        table.add_row(
            Text(str(f.get("path"))),
            str(f.get("size_bytes")),
            str(f.get("row_count")),
            ts_cell(f.get("added_ts")),
        )
    return [kv_table(header), table]


@click.command("read")
@click.argument("name", type=TABLE_NAME)
@click.option("--as-of", type=READ_TIMESTAMP, help=AS_OF_HELP + AS_OF_DEFAULT_HELP)
@click.option(
    "--limit",
    type=click.IntRange(1, READ_ROWS_MAX),
    default=READ_ROWS_DEFAULT,
    help=f"Print at most this many rows (at most {READ_ROWS_MAX}).",
)
@consistency_option()
@click.pass_context
def table_read(
    ctx: click.Context, name: str, as_of: int | None, limit: int, consistency: str
) -> None:
    """Print rows of NS.TABLE as committed now (or at --as-of), read from its Parquet files with
    the schema in force at that time. Columns are matched by Parquet field id, so renamed
    columns keep their data and a column added later reads, in rows of older files, as its
    DEFAULT (NULL without one). `-o json` prints the rows as JSON objects (decimals and times
    as strings, binary as base64).

    \b
    Example:
      metastore table read sales.orders --as-of -1h --limit 5
    """
    # pyarrow is imported only here: the other commands start faster without it.
    from cli.values import json_value
    from metastore.client.parquet import DataReadError, PinnedColumn, read_rows

    a = app(ctx)
    client = a.client()
    linearize(client, as_of, consistency)
    with explaining_not_found(client, name, as_of):
        listing = client.files(name, as_of=as_of)
    ts = int(listing["as_of"])
    pinned = client.schema_at(name, ts)
    columns = [PinnedColumn.from_wire(c) for c in pinned["schema"]["columns"]]
    location = str(listing.get("location") or pinned.get("location") or "")
    files = listing.get("files") or []
    try:
        read = read_rows(location, files, columns, limit=limit)
    except DataReadError as exc:
        raise _read_failure(exc) from None
    rows = [{k: json_value(v) for k, v in row.items()} for row in read.rows.to_pylist()]
    total = int(listing.get("rows", 0))
    document = {
        "table": listing.get("table", name),
        "as_of": ts,
        "version": pinned.get("version"),
        "columns": [c.name for c in columns],
        "rows": rows,
        "rows_shown": len(rows),
        "rows_total": total,
        "files": len(files),
        "truncated": len(rows) < total,
    }
    emit(a.output, document, lambda: _rows_tables(document, read.rows))


def _rows_tables(document: dict[str, Any], rows: Any) -> list[RenderableType]:
    from cli.values import text_value

    # A line of its own, not the table's title: a title wraps at the width of a narrow table.
    summary = Text(
        f"{document['table']} v{document['version']} as of {ts_cell(document['as_of'])}: "
        f"{document['rows_shown']} of {document['rows_total']} rows "
        f"({document['files']} files)"
    )
    table = Table(box=box.SIMPLE_HEAD)
    # Text, not str: rich would read "[...]" in a column name or a value as markup.
    for column in document["columns"]:
        table.add_column(Text(column), overflow="fold")
    for row in rows.to_pylist():
        table.add_row(*(Text(text_value(v)) for v in row.values()))
    return [summary, table]


def _read_failure(exc: DataReadError) -> CliError:
    """A `DataReadError` of the reader as the CLI's error line and exit code."""
    details = {"path": exc.path} if exc.path is not None else None
    exit_code = READ_ERROR_EXIT_CODES.get(exc.code, EXIT_GENERIC)
    return CliError(exc.code, exc.message, exit_code=exit_code, details=details)
