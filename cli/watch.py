"""`metastore watch [NS[.T]]`: follow catalog events as they happen (the change feed).

Prints one line per event (JSON lines with -o json): schema versions published with their Tu,
tables and namespaces created or dropped, commits with their tables and ts, schema change job
steps, sessions, leases and protections (metastore/events.py lists them). Events come in log
order; each carries the Tm of its entry, and `--from TS` resumes after that Tm, so a watcher
that stopped can continue from the last event it printed (Ctrl-C says from where, and exits 1
like any interrupted command; --count and --for end with 0). A start the node no longer keeps
events for (before its last snapshot) exits with WATCH_START_COMPACTED and the oldest kept.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, cast

import click

from cli.context import READ_TIMESTAMP, TABLE_OR_NAMESPACE, DurationParam, app
from cli.errors import EXIT_GENERIC
from cli.output import ts_cell

# How long one call waits on the server for the next event.
WATCH_WAIT_MS = 5_000
# Events asked for per call.
WATCH_PAGE_EVENTS = 1_000

_DETAIL_KEYS = (
    "namespace",
    "table",
    "version",
    "txn_id",
    "tables",
    "files_added",
    "rows_added",
    "job_id",
    "what",
    "session_id",
    "app_id",
    "leases",
    "record_id",
    "reason",
    "by",
)


def _item(value: Any) -> str:
    """One element of a list detail: a lease ([table, version]) as `ns.t@vN`, as the bridge's
    batch reports name a pinned version; anything else as its text."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
        return f"{value[0]}@v{value[1]}"
    return str(value)


def _line(event: dict[str, Any]) -> str:
    parts = [ts_cell(event.get("tm")), f"{event.get('kind', '?'):<20}"]
    for key in _DETAIL_KEYS:
        if key in event and event[key] not in (None, "", []):
            value = event[key]
            parts.append(
                f"{key}={','.join(map(_item, value)) if isinstance(value, list) else value}"
            )
    parts.extend(f"{k}={ts_cell(event[k])}" for k in ("tu", "ts") if isinstance(event.get(k), int))
    return "  ".join(parts)


@click.command("watch")
@click.argument("target", type=TABLE_OR_NAMESPACE, required=False)
@click.option(
    "--from",
    "from_ts",
    type=READ_TIMESTAMP,
    default=None,
    help="Start after this timestamp (an event's tm, to resume; default: now).",
)
@click.option("--oldest", is_flag=True, help="Start from the oldest event the node keeps.")
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after N events (and the rest of the Nth's entry, which shares its tm).",
)
@click.option(
    "--for",
    "stop_ms",
    type=DurationParam(),
    default=None,
    help="Stop after this long (e.g. 30s, 5m; default: never).",
)
@click.pass_context
def watch(
    ctx: click.Context,
    target: str | None,
    from_ts: int | None,
    oldest: bool,
    count: int | None,
    stop_ms: int | None,
) -> None:
    """Print catalog events for NS[.TABLE] (a namespace or a table; default: everything) as they
    happen, in log order, until --count or --for (exit 0) or Ctrl-C (exit 1, after the line
    saying where to resume).

    \b
    Examples:
      metastore watch sales.orders --for 10m
      metastore watch sales --from 2026-11-22T10:00:00Z --count 20
    """
    if oldest and from_ts is not None:
        raise click.UsageError("--from and --oldest exclude each other")
    table = target if target and "." in target else None
    namespace = target if target and "." not in target else None
    a = app(ctx)
    client = a.client()
    deadline = None if stop_ms is None else time.monotonic() + stop_ms / 1000
    position = 0 if oldest else from_ts
    from_event = 0  # > 0: the last page ended inside the entry at `position` (a huge entry)
    # Where a new watch continues without printing an event again or skipping one: the tm of
    # the last entry printed whole (its events share that tm), or where the last page ended;
    # `inside`: that page ended inside the entry at `resume` (only its start is known).
    resume, inside = position, False
    seen = 0
    last_tm: object = None
    try:
        while True:
            wait_ms = WATCH_WAIT_MS
            if deadline is not None:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    return
                wait_ms = min(wait_ms, left_ms)
            if count is not None and seen >= count:
                wait_ms = 0  # only finishing the entry the last page ended inside
            page = client.watch(
                position,
                table=table,
                namespace=namespace,
                limit=WATCH_PAGE_EVENTS,
                wait_ms=wait_ms,
                from_event=from_event,
            )
            events: list[dict[str, Any]] = page["events"]
            next_position = page["next_from_ts"], page.get("next_from_event", 0)
            shown = 0
            try:
                for event in events:
                    # Stop only between entries: the events of one entry share its tm, and a
                    # resume with `--from` that tm would skip the rest of the entry.
                    if count is not None and seen >= count and event.get("tm") != last_tm:
                        return
                    _print(event, a.output)
                    shown += 1
                    seen += 1
                    last_tm = event.get("tm")
                    if shown < len(events) and events[shown].get("tm") != last_tm:
                        resume, inside = cast(int, last_tm), False  # that entry is whole
            except KeyboardInterrupt:
                # Ctrl-C between two events of one entry: print the rest of it (in this page),
                # as `--count` does, so the hint can name its tm.
                while shown < len(events) and shown and events[shown].get("tm") == last_tm:
                    _print(events[shown], a.output)
                    shown += 1
                if shown == len(events):
                    resume, inside = next_position[0], next_position[1] > 0
                elif shown:
                    resume, inside = cast(int, last_tm), False
                raise
            position, from_event = next_position
            resume, inside = position, from_event > 0
            if count is not None and seen >= count and not from_event:
                return  # the page ended between entries: the last one printed is complete
            sys.stdout.flush()
    except KeyboardInterrupt:
        if resume is None:  # no page came back yet: no position to resume from is known
            click.echo("stopped", err=True)
        elif inside:  # inside an entry: from just before it (its start prints again)
            click.echo(f"stopped; resume with --from {resume - 1}", err=True)
        else:
            click.echo(f"stopped; resume with --from {resume}", err=True)
        # Interrupted, as every other command interrupted is (EXIT_GENERIC): a script that
        # runs a watch must tell Ctrl-C (or a SIGINT from its supervisor) from the ends it
        # asked for (--count, --for: 0). `etcdctl watch` ends non-zero on it too.
        ctx.exit(EXIT_GENERIC)


def _print(event: dict[str, Any], output: str) -> None:
    if output == "json":
        click.echo(json.dumps(event, sort_keys=True))
    else:
        click.echo(_line(event))
