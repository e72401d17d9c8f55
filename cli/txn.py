"""`metastore txn log` and `txn show`: the transaction log's recent commits, and whether one txn
(or one streaming query's batch) committed.

Each commit lists data files for one or more tables and is visible at exactly one timestamp
(`ts`) for all of them (metastore.txn). The node keeps the newest commits for idempotency and
returns at most MAX_TXN_LOG_RECORDS of them, newest first; `upper` is the smallest timestamp a
commit could still use, so every read below it is final. `txn log` is linearizable by default
(`--consistency l`: the leader's read_ts, then the list from a node whose safe time reached it,
as `table files`); `txn show` is a linearizable lookup
(the leader answers), so a commit that was acknowledged is never reported missing; with
`--stream` it also shows the stream's high-water mark (its newest committed position), which
outlives the txn-id window. Without `--stream` it asks for the txn id's own mark (the one a txn
id a caller chose carries, metastore.client.txn_marks), so such a txn is found committed past
the window too (its ts; its tables, files and rows are no longer known).
"""

from __future__ import annotations

from typing import Any, Final

import click
from rich.console import RenderableType
from rich.text import Text

from cli.context import app
from cli.errors import EXIT_NOT_FOUND
from cli.output import emit, kv_table, rows_table, ts_cell
from cli.table_data import consistency_option, linearize
from metastore.client.txn_marks import txn_mark_stream
from metastore.limits import MAX_TXN_LOG_RECORDS

# What `txn log` shows without --limit: a screenful.
TXN_LOG_LIMIT_DEFAULT: Final = 20


@click.group("txn")
def txn() -> None:
    """Inspect the transaction log (atomic multi-table commits of data files)."""


TXN_LOG_CONSISTENCY_HELP: Final = (
    "l (linearizable, the default) lists every commit acknowledged before the command "
    "started, from any process: it asks the leader for the newest acknowledged timestamp (one "
    "more round trip) and the node answering waits until its safe time reaches it. s "
    "(serializable) lists what the answering node has applied, and may miss a commit "
    "acknowledged a moment ago (up to about DD)."
)


@txn.command("log")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_TXN_LOG_RECORDS),
    default=TXN_LOG_LIMIT_DEFAULT,
    help=f"Show at most this many commits (newest first; at most {MAX_TXN_LOG_RECORDS}).",
)
@consistency_option(TXN_LOG_CONSISTENCY_HELP)
@click.pass_context
def txn_log(ctx: click.Context, limit: int, consistency: str) -> None:
    """Show the most recent commits, newest first: when each became visible (its commit
    timestamp), its txn id, the tables it wrote, files added/removed and rows added.

    \b
    Example:
      metastore txn log --limit 10
    """
    a = app(ctx)
    client = a.client()
    linearize(client, None, consistency)
    result = client.txn_log(limit)
    emit(a.output, result, lambda: _log_tables(result))


@txn.command("show")
@click.argument("txn_id")
@click.option(
    "--stream",
    default=None,
    help="Also show this stream's newest committed position (Structured Streaming through the "
    "bridge: 'spark-query:<query id>'; '<query name>:<query id>' for marks of older bridges).",
)
@click.pass_context
def txn_show(ctx: click.Context, txn_id: str, stream: str | None) -> None:
    """Whether TXN_ID committed, and when (a linearizable lookup). Exits 4 when the txn is not
    remembered and the stream (--stream, else the txn id's own mark, which txn ids chosen for
    bridge.batch(txn_id=...) or the data source's txn_id option carry) has no committed
    position: it never committed, or it is older than the newest 100,000 commits (the reply
    says how far back that is) and carried no mark, or its mark was forgotten.

    \b
    Example:
      metastore txn show etl-2026-11-27
    """
    a = app(ctx)
    # Without --stream, the txn id's own mark: a txn id a caller chose (bridge.batch(txn_id=),
    # the data source's txn_id option) has one, which outlives the txn-id window.
    asked = txn_mark_stream(txn_id) if stream is None else stream
    result = a.client().committed_txn(txn_id, stream=asked)
    emit(a.output, result, lambda: _show_tables(result, stream))
    if result.get("txn") is None and result.get("stream_mark") is None:
        ctx.exit(EXIT_NOT_FOUND)


def _show_tables(result: dict[str, Any], stream: str | None) -> list[RenderableType]:
    out: list[RenderableType] = []
    record = result.get("txn")
    mark = result.get("stream_mark")
    if stream is None and not isinstance(record, dict) and isinstance(mark, dict):
        out.append(
            kv_table(
                {"txn id": mark.get("txn_id"), "ts": mark.get("ts"), "mark": mark.get("stream")},
                title="committed (by its txn-id mark)",
            )
        )
        out.append(
            Text(
                "its commit record (tables, files, rows) is older than the remembered window; "
                "the txn-id mark a caller's txn id carries still refuses it (a re-run is "
                "deduplicated)"
            )
        )
        return out
    if isinstance(record, dict):
        out.append(
            kv_table(
                {
                    "txn id": record.get("txn_id"),
                    "ts": record.get("ts"),
                    "tables": ", ".join(str(t) for t in record.get("tables") or []),
                    "files": _files_cell(record.get("files_added"), record.get("files_removed")),
                    "rows": record.get("rows_added"),
                },
                title="committed",
            )
        )
    else:
        oldest = result.get("oldest_remembered_ts")
        window = ts_cell(oldest) if oldest else "none yet"
        out.append(
            Text(
                f"txn {result.get('txn_id')} is not remembered: it never committed, or it is "
                f"older than the remembered window (oldest remembered commit: {window}, "
                f"{result.get('remembered_txns')} remembered)"
            )
        )
    if stream is not None:
        mark = result.get("stream_mark")
        if isinstance(mark, dict):
            out.append(
                kv_table(
                    {
                        "stream": mark.get("stream"),
                        "newest committed position": mark.get("seq"),
                        "ts": mark.get("ts"),
                        "its txn id": mark.get("txn_id"),
                    },
                    title="stream high-water mark",
                )
            )
        else:
            out.append(Text(f"stream {stream} has no committed position"))
    return out


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
