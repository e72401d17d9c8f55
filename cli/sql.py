"""`metastore sql "STATEMENT"`: run one Spark SQL DDL statement."""

from __future__ import annotations

import click

from cli.context import app
from cli.output import emit, kv_table


@click.command("sql")
@click.argument("statement")
@click.option(
    "--request-id",
    help="Idempotency key: retrying with the same id applies the change once. Default: a new "
    "random id (shown in the error if the outcome is unknown).",
)
@click.pass_context
def sql(ctx: click.Context, statement: str, request_id: str | None) -> None:
    """Run one DDL STATEMENT (CREATE/DROP NAMESPACE, CREATE/DROP/ALTER TABLE).

    Returns once the change is visible on every node, and prints the schema version made, its
    Tm (when the leader ordered it), Tu (when it activates: Tm + DD) and how long it waited.

    \b
    Example:
      metastore sql "ALTER TABLE sales.orders ADD COLUMN note STRING"
    """
    a = app(ctx)
    result = a.client().ddl(statement, request_id=request_id)
    emit(a.output, result, lambda: [kv_table(result)])
