"""`metastore sql "STATEMENT"`: run one Spark SQL DDL statement."""

from __future__ import annotations

import re
import time
from typing import Final

import click

from cli.context import app
from cli.leases import blocker_rows
from cli.output import emit, end_progress, kv_table, progress
from metastore.errors import MetastoreError

# How long a schema change waits for blocking leases unless --wait says otherwise.
WAIT_DEFAULT: Final = "5m"
_DURATION: Final = re.compile(r"([0-9]+)(ms|s|m|h)?")
_UNIT_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}


def parse_wait_ms(text: str) -> int:
    """'0', '90s', '5m', '1500ms', '1h' (a bare number is seconds) -> milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 5m, 1500ms or 0")
    return int(match.group(1)) * _UNIT_MS[match.group(2) or "s"]


@click.command("sql")
@click.argument("statement")
@click.option(
    "--request-id",
    help="Idempotency key: retrying with the same id applies the change once. Default: a new "
    "random id (shown in the error if the outcome is unknown).",
)
@click.option(
    "--wait",
    "wait",
    default=WAIT_DEFAULT,
    show_default=True,
    help="How long an ALTER may wait for running batches' schema leases to drain (a change "
    "that would leave leases on three versions waits); 0 fails at once with the blockers.",
)
@click.pass_context
def sql(ctx: click.Context, statement: str, request_id: str | None, wait: str) -> None:
    """Run one DDL STATEMENT (CREATE/DROP NAMESPACE, CREATE/DROP/ALTER TABLE).

    Returns once the change is visible on every node, and prints the schema version made, its
    Tm (when the leader ordered it), Tu (when it activates: Tm + DD) and how long it waited.
    While running batches hold leases that block it, it waits (up to --wait) and shows on
    stderr which sessions are in the way.

    \b
    Example:
      metastore sql "ALTER TABLE sales.orders ADD COLUMN note STRING"
    """
    wait_ms = parse_wait_ms(wait)
    a = app(ctx)
    started = time.monotonic()
    shown: list[object] = []

    def blocked(error: MetastoreError) -> None:
        blockers = error.details.get("blockers")
        rows = blocker_rows(blockers if isinstance(blockers, list) else [], None)
        who = "; ".join(f"{r[0]} ({r[1]} on {r[2]}, user {r[3]}, holds {r[5]})" for r in rows)
        progress(
            f"waiting {time.monotonic() - started:.0f}s of {wait_ms / 1000:.0f}s for "
            f"{len(rows)} lease(s) to drain: {who}",
            changed=who not in shown,
        )
        shown.append(who)

    try:
        result = a.client().ddl(
            statement, request_id=request_id, wait_ms=wait_ms, on_blocked=blocked
        )
    finally:
        if shown:
            end_progress()
    emit(a.output, result, lambda: [kv_table(result)])
