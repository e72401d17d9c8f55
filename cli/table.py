"""`metastore table list|describe|history`: tables and their schema versions.

`table files` and `table read` (the table's committed data) live in cli.table_data and are added
to this group by cli.main."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import RenderableType

from cli.context import READ_TIMESTAMP, TABLE_NAME, app
from cli.output import emit, kv_table, rows_table, ts_cell
from metastore.client import SyncMetastoreClient
from metastore.errors import ErrorCode, MetastoreError, TableNotFoundError

AS_OF_HELP = (
    "Read as of this time: HLC integer, ISO-8601 (2026-11-22T10:00:00Z), relative (-5m) or now."
)


@contextmanager
def saying_when_created(
    client: SyncMetastoreClient, name: str, as_of: int | None
) -> Iterator[None]:
    """A TABLE_NOT_FOUND for an --as-of before the table was created (`--as-of -5m` right after
    a CREATE TABLE) also says when it was created, so the user knows from when to ask."""
    try:
        yield
    except MetastoreError as exc:
        if as_of is None or exc.code is not ErrorCode.TABLE_NOT_FOUND:
            raise
        try:
            created_tu = client.describe(name).get("created_tu")
        except MetastoreError:
            raise exc from None  # not there now either: the original error says it all
        if not isinstance(created_tu, int) or created_tu <= as_of:
            raise
        raise TableNotFoundError(
            f"{exc.message}; it was created at {ts_cell(created_tu)} (ask for a later --as-of)",
            details=exc.details,
        ) from None


@click.group("table")
def table() -> None:
    """List tables, describe a table's schema (now or AS OF), show its version history, list its
    data files and read its rows (now or AS OF)."""


@table.command("list")
@click.argument("namespace", required=False)
@click.option("--as-of", type=READ_TIMESTAMP, help=AS_OF_HELP)
@click.pass_context
def table_list(ctx: click.Context, namespace: str | None, as_of: int | None) -> None:
    """List the tables of NAMESPACE, or of every namespace when it is left out (full names,
    sorted)."""
    a = app(ctx)
    result = a.client().list_tables(namespace, as_of=as_of)
    rows = [[name] for name in result.get("tables", [])]
    emit(a.output, result, lambda: [rows_table(["table"], rows)])


@table.command("describe")
@click.argument("name", type=TABLE_NAME)
@click.option("--as-of", type=READ_TIMESTAMP, help=AS_OF_HELP)
@click.pass_context
def table_describe(ctx: click.Context, name: str, as_of: int | None) -> None:
    """Show the schema of NS.TABLE in force now (or at --as-of) and its metadata."""
    a = app(ctx)
    with saying_when_created(a.client(), name, as_of):
        result = a.client().describe(name, as_of=as_of)
    emit(a.output, result, lambda: _describe_tables(result))


def _describe_tables(result: dict[str, Any]) -> list[RenderableType]:
    header = {k: v for k, v in result.items() if k != "schema"}
    schema = result.get("schema") or {}
    if isinstance(schema, dict) and "ddl" in schema:
        header["schema ddl"] = schema["ddl"]
    return [kv_table(header), _columns_table(schema)]


def _columns_table(schema: object) -> RenderableType:
    columns = schema.get("columns", []) if isinstance(schema, dict) else []
    rows = [
        [
            c.get("field_id"),
            c.get("name"),
            c.get("type"),
            c.get("nullable"),
            c.get("default"),
            c.get("comment"),
        ]
        for c in columns
    ]
    return rows_table(["id", "column", "type", "nullable", "default", "comment"], rows)


@table.command("history")
@click.argument("name", type=TABLE_NAME)
@click.pass_context
def table_history(ctx: click.Context, name: str) -> None:
    """Show every schema version of NS.TABLE: when it was made (Tm), when it activated (Tu),
    what changed, and the schema."""
    a = app(ctx)
    result = a.client().history(name)
    rows = [
        [
            v.get("version"),
            ts_cell(v.get("tm")),
            ts_cell(v.get("tu")),
            v.get("change"),
            (v.get("schema") or {}).get("ddl"),
        ]
        for v in result.get("versions", [])
    ]
    emit(
        a.output,
        result,
        lambda: [rows_table(["version", "tm", "tu (active from)", "change", "schema"], rows)],
    )
