"""`metastore ns list|create|drop`: namespaces."""

from __future__ import annotations

import click

from cli.context import READ_TIMESTAMP, app
from cli.errors import REQUEST_ID_HELP, settle_unknown_outcome
from cli.output import emit, kv_table, rows_table
from cli.table import AS_OF_HELP
from metastore.errors import NamespaceNotEmptyError


@click.group("ns")
def ns() -> None:
    """List, create and drop namespaces (Spark databases)."""


@ns.command("list")
@click.option("--as-of", type=READ_TIMESTAMP, help=AS_OF_HELP)
@click.pass_context
def ns_list(ctx: click.Context, as_of: int | None) -> None:
    """List every namespace (existing now, or at --as-of) with its comment and properties.

    \b
    Example:
      metastore ns list --as-of -1h
    """
    a = app(ctx)
    result = a.client().list_namespaces(as_of=as_of)
    namespaces = result.get("namespaces", [])
    rows = [[n.get("name"), n.get("comment"), n.get("properties") or {}] for n in namespaces]
    emit(a.output, result, lambda: [rows_table(["namespace", "comment", "properties"], rows)])


@ns.command("create")
@click.argument("name")
@click.option("--comment", help="A comment stored with the namespace.")
@click.option("--if-not-exists", is_flag=True, help="Succeed if it exists already.")
@click.option("--request-id", help=REQUEST_ID_HELP)
@click.pass_context
def ns_create(
    ctx: click.Context,
    name: str,
    comment: str | None,
    if_not_exists: bool,
    request_id: str | None,
) -> None:
    """Create namespace NAME (CREATE NAMESPACE).

    \b
    Example:
      metastore ns create sales --comment 'orders and returns' --if-not-exists
    """
    a = app(ctx)
    with settle_unknown_outcome():
        result = a.client().create_namespace(
            name, comment=comment, if_not_exists=if_not_exists, request_id=request_id
        )
    emit(a.output, result, lambda: [kv_table(result)])


@ns.command("drop")
@click.argument("name")
@click.option("--if-exists", is_flag=True, help="Succeed if it does not exist.")
@click.option("--cascade", is_flag=True, help="Also drop the tables in it.")
@click.option("--request-id", help=REQUEST_ID_HELP)
@click.pass_context
def ns_drop(
    ctx: click.Context, name: str, if_exists: bool, cascade: bool, request_id: str | None
) -> None:
    """Drop namespace NAME (DROP NAMESPACE). Refused if it holds tables, unless --cascade.

    \b
    Example:
      metastore ns drop sales --cascade
    """
    a = app(ctx)
    try:
        with settle_unknown_outcome():
            result = a.client().drop_namespace(
                name, if_exists=if_exists, cascade=cascade, request_id=request_id
            )
    except NamespaceNotEmptyError as exc:
        raise _in_cli_terms(exc) from None
    emit(a.output, result, lambda: [kv_table(result)])


def _in_cli_terms(exc: NamespaceNotEmptyError) -> NamespaceNotEmptyError:
    """The node's refusal speaks SQL ("use CASCADE", as `metastore sql` users type it); here the
    way out is the --cascade flag. Built from the details (the count and up to 10 names), so
    the node's wording can change freely; the node's message is kept if the details lack them."""
    count = exc.details.get("table_count")
    tables = exc.details.get("tables")
    namespace = exc.details.get("namespace")
    if not isinstance(count, int) or not isinstance(tables, list) or not namespace:
        return exc
    named = ", ".join(str(t) for t in tables)
    if count > len(tables):
        named += f" and {count - len(tables)} more"
    noun, pronoun = ("table", "it") if count == 1 else ("tables", "them")
    return NamespaceNotEmptyError(
        f"namespace {namespace} has {count} {noun} ({named}); drop {pronoun} first, or pass "
        f"--cascade to drop {pronoun} with the namespace",
        details=exc.details,
    )
