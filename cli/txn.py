"""`metastore txn log`: the most recent atomic commits of the transaction log.

Each commit lists data files for one or more tables and is visible at exactly one timestamp
(`ts`) for all of them (metastore.txn). The node keeps the newest commits for idempotency and
returns at most MAX_TXN_LOG_RECORDS of them, newest first; `upper` is the smallest timestamp a
commit could still use, so every read below it is final.
"""

from __future__ import annotations

from typing import Any, Final

import click
from rich.console import RenderableType
from rich.text import Text

from cli.context import app
from cli.output import emit, rows_table, ts_cell
from metastore.limits import MAX_TXN_LOG_RECORDS

# What `txn log` shows without --limit: a screenful.
TXN_LOG_LIMIT_DEFAULT: Final = 20


@click.group("txn")
def txn() -> None:
    """Inspect the transaction log (atomic multi-table commits of data files)."""


@txn.command("log")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_TXN_LOG_RECORDS),
    default=TXN_LOG_LIMIT_DEFAULT,
    help=f"Show at most this many commits (newest first; at most {MAX_TXN_LOG_RECORDS}).",
)
@click.pass_context
def txn_log(ctx: click.Context, limit: int) -> None:
    """Show the most recent commits, newest first: when each became visible (its commit
    timestamp), its txn id, the tables it wrote, files added/removed and rows added."""
    a = app(ctx)
    result = a.client().txn_log(limit)
    emit(a.output, result, lambda: _log_tables(result))


def _log_tables(result: dict[str, Any]) -> list[RenderableType]:
    rows = [
        [
            ts_cell(c.get("ts")),
            c.get("txn_id"),
            ", ".join(str(t) for t in c.get("tables") or []),
            _files_cell(c.get("files_added"), c.get("files_removed")),
            c.get("rows_added"),
        ]
        for c in result.get("commits", [])
    ]
    # A line of its own, not the table's title: a title wraps at the width of a narrow table.
    summary = Text(
        f"commits: {len(rows)}   upper (next usable commit ts): {ts_cell(result.get('upper'))}"
    )
    return [summary, rows_table(["ts", "txn id", "tables", "files", "rows"], rows)]


def _files_cell(added: object, removed: object) -> str:
    # "+3" for a plain append; "+1 -4" when the commit also removed files (overwrite, compaction).
    text = f"+{added if added is not None else 0}"
    if isinstance(removed, int) and removed:
        text += f" -{removed}"
    return text
