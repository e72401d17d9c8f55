"""`metastore table list|describe|history`: tables and their schema versions.

`table files` and `table read` (the table's committed data) live in cli.table_data and are added
to this group by cli.main."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import click
from rich.console import RenderableType

from cli.context import READ_TIMESTAMP, TABLE_NAME, app
from cli.output import emit, kv_table, rows_table, ts_cell
from metastore.client import SyncMetastoreClient
from metastore.client.not_found import created_after, created_tu_now
from metastore.commands import TableName
from metastore.errors import (
    ErrorCode,
    MetastoreError,
    NamespaceNotFoundError,
    TableNotFoundError,
)

AS_OF_HELP = (
    "Read as of this time: HLC integer, ISO-8601 (2026-11-22T10:00:00Z), relative (-5m) or now."
)


# Names a "did you mean" looks among: one page of one list call, so a typo costs one cheap
# round trip however large the catalog (a name past the page is simply not suggested).
SUGGESTION_CANDIDATES_MAX: Final = 1000
# difflib's ratio a name must reach to be suggested: one or two letters off or swapped in a
# short name, not any name that shares a few letters.
SUGGESTION_CUTOFF: Final = 0.75


@contextmanager
def explaining_not_found(
    client: SyncMetastoreClient, name: str | None, as_of: int | None = None
) -> Iterator[None]:
    """Make a not-found about NS.TABLE `name` say what is unknown, like git's "did you mean":

    * TABLE_NOT_FOUND at an --as-of before the table was created (`--as-of -5m` right after a
      CREATE TABLE): when it was created, so the user knows from when to ask;
    * an unknown namespace (the nodes say only that the table does not exist):
      NAMESPACE_NOT_FOUND, with the closest namespace;
    * an unknown table of a namespace that exists: the closest table of that namespace.

    Only on the error path, and bounded: at most one list call (one page) besides the one that
    tells an unknown namespace from an unknown table. Any failure of those calls leaves the
    original error as it was. Names are the ones that exist now."""
    try:
        yield
    except MetastoreError as exc:
        if exc.code is not ErrorCode.TABLE_NOT_FOUND or name is None:  # None: every table
            raise
        if as_of is not None:
            created_tu = created_tu_now(client, name)
            if created_tu is not None:  # it exists now: created after --as-of's time, or not
                raise created_after(exc, as_of, created_tu, option="--as-of") from None
        raise _unknown_name(client, name, exc) from None


@contextmanager
def explaining_unknown_namespace(client: SyncMetastoreClient, namespace: str) -> Iterator[None]:
    """A NAMESPACE_NOT_FOUND about `namespace` with the closest existing namespace (one list
    call, one page), if one is close."""
    try:
        yield
    except MetastoreError as exc:
        if exc.code is not ErrorCode.NAMESPACE_NOT_FOUND:
            raise
        meant = _closest(namespace, _namespace_names(client))
        if meant is None:
            raise
        if meant.lower() == namespace.lower():  # asked --as-of a time before it was created
            raise NamespaceNotFoundError(
                f"{exc.message}; it exists now, so it was created since (ask for a later --as-of)",
                details=exc.details,
            ) from None
        raise NamespaceNotFoundError(
            f"{exc.message}; did you mean {meant}?", details=exc.details
        ) from None


def _unknown_name(client: SyncMetastoreClient, name: str, exc: MetastoreError) -> MetastoreError:
    try:
        table = TableName.parse(name)
    except MetastoreError:
        return exc
    try:
        listed = client.call(
            "list_tables",
            {"namespace": table.namespace, "limit": SUGGESTION_CANDIDATES_MAX},
        )
    except MetastoreError as listing:
        if listing.code is not ErrorCode.NAMESPACE_NOT_FOUND:
            return exc  # cannot tell (forbidden, unavailable): the node's own words
        meant = _closest(table.namespace, _namespace_names(client))
        hint = f"; did you mean {meant}?" if meant is not None else ""
        return NamespaceNotFoundError(
            f"namespace {table.namespace} does not exist (so neither does table {table}){hint}",
            details={"namespace": table.namespace, "table": str(table)},
        )
    names = [str(t) for t in listed.get("tables") or [] if isinstance(t, str)]
    meant = _closest(str(table), names)
    if meant is None:
        return exc
    return TableNotFoundError(f"{exc.message}; did you mean {meant}?", details=exc.details)


def _namespace_names(client: SyncMetastoreClient) -> list[str]:
    try:
        listed = client.call("list_namespaces", {"limit": SUGGESTION_CANDIDATES_MAX})
    except MetastoreError:
        return []
    return [
        str(n["name"])
        for n in listed.get("namespaces") or []
        if isinstance(n, dict) and isinstance(n.get("name"), str)
    ]


def _closest(typed: str, names: list[str]) -> str | None:
    """The existing name closest to `typed` (case folded, as the nodes fold it), or None."""
    folded = {n.lower(): n for n in names}
    found = difflib.get_close_matches(typed.lower(), list(folded), n=1, cutoff=SUGGESTION_CUTOFF)
    return folded[found[0]] if found else None


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
    sorted).

    \b
    Example:
      metastore table list sales -o json
    """
    a = app(ctx)
    if namespace is None:
        result = a.client().list_tables(namespace, as_of=as_of)
    else:
        with explaining_unknown_namespace(a.client(), namespace):
            result = a.client().list_tables(namespace, as_of=as_of)
    rows = [[name] for name in result.get("tables", [])]
    emit(a.output, result, lambda: [rows_table(["table"], rows)])


@table.command("describe")
@click.argument("name", type=TABLE_NAME)
@click.option("--as-of", type=READ_TIMESTAMP, help=AS_OF_HELP)
@click.pass_context
def table_describe(ctx: click.Context, name: str, as_of: int | None) -> None:
    """Show the schema of NS.TABLE in force now (or at --as-of) and its metadata.

    \b
    Examples:
      metastore table describe sales.orders
      metastore table describe sales.orders --as-of -5m
    """
    a = app(ctx)
    with explaining_not_found(a.client(), name, as_of):
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
    what changed, and the schema.

    \b
    Example:
      metastore table history sales.orders
    """
    a = app(ctx)
    with explaining_not_found(a.client(), name):
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
