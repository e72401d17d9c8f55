"""`metastore session ...` and `metastore lease ...`: client sessions and their schema leases.

A Spark application opens a session and keeps it alive with heartbeats; each of its batches
leases the schema versions it pinned (metastore.leases). A schema change that would leave leases
on three versions of a table waits for the oldest to drain - `lease blockers` shows who is in the
way, `session expire` (admin) ends a session now. Times are the cluster's HLC (Tm), shown as
ISO-8601; a session is expired once an entry's Tm reaches its deadline.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import RenderableType
from rich.text import Text

from cli.context import TABLE_NAME, app
from cli.output import emit, rows_table, ts_cell
from cli.table import explaining_not_found
from metastore.errors import SessionNotFoundError
from metastore.limits import MAX_LEASES_PER_COMMAND


def _held_for(acquired_tm: object, now_tm: object) -> str:
    if not isinstance(acquired_tm, int) or not isinstance(now_tm, int):
        return "-"
    return f"{max(0, (now_tm - acquired_tm) >> 16) / 1000:.1f} s"


def blocker_rows(blockers: list[dict[str, Any]], now_tm: object) -> list[list[object]]:
    return [
        [
            b.get("session_id"),
            b.get("app_id"),
            b.get("host"),
            b.get("user"),
            b.get("pid"),
            f"v{b.get('version')}",
            _held_for(b.get("acquired_tm"), now_tm),
            ts_cell(b.get("expires_at_tm")),
        ]
        for b in blockers
    ]


BLOCKER_COLUMNS = ["session", "app id", "host", "user", "pid", "holds", "held for", "expires at"]


def blocker_summary(b: dict[str, Any], now_tm: object) -> str:
    """One blocking lease in a line: who holds which version (and, given `now_tm`, how long)."""
    held = _held_for(b.get("acquired_tm"), now_tm)
    return (
        f"session {b.get('session_id')} (app {b.get('app_id') or '?'} on {b.get('host') or '?'}, "
        f"user {b.get('user') or '?'}, pid {b.get('pid')}) holds v{b.get('version')}"
        + ("" if held == "-" else f" for {held}")
    )


# ---- session -----------------------------------------------------------------------------------


@click.group("session")
def session() -> None:
    """Client sessions (one per Spark application) and their liveness."""


@session.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also list recently ended sessions.")
@click.pass_context
def session_list(ctx: click.Context, show_all: bool) -> None:
    """Open sessions: who (app id, host, user, pid), their TTL, last heartbeat, deadline and
    how many leases each holds. With --all, also the last ended sessions and why they ended
    (closed, ttl: no heartbeat in time, admin: `session expire`).

    \b
    Example:
      metastore session list --all
    """
    a = app(ctx)
    result = a.client().session_list(include_ended=show_all)
    emit(a.output, result, lambda: _session_tables(result, show_all))


def _session_tables(result: dict[str, Any], show_all: bool) -> list[RenderableType]:
    rows = [
        [
            s.get("session_id"),
            s.get("app_id"),
            s.get("app_name"),
            s.get("host"),
            s.get("user"),
            s.get("pid"),
            f"{s.get('ttl_ms')} ms",
            ts_cell(s.get("heartbeat_tm")),
            ts_cell(s.get("deadline_tm")),
            s.get("leases"),
            "yes" if s.get("live") else "expired",
        ]
        for s in result.get("sessions", [])
    ]
    out: list[RenderableType] = [
        Text(f"sessions: {len(rows)}"),
        rows_table(
            [
                "session",
                "app id",
                "app name",
                "host",
                "user",
                "pid",
                "ttl",
                "last heartbeat",
                "deadline",
                "leases",
                "live",
            ],
            rows,
        ),
    ]
    if show_all:
        ended = [
            [
                e.get("session_id"),
                e.get("app_id"),
                e.get("reason"),
                e.get("by"),
                ts_cell(e.get("ended_tm")),
            ]
            for e in result.get("ended", [])
        ]
        out += [
            Text(f"ended: {len(ended)}"),
            rows_table(["session", "app id", "reason", "by", "ended at"], ended),
        ]
    return out


@session.command("expire")
@click.argument("session_ids", nargs=-1, required=True)
@click.pass_context
def session_expire(ctx: click.Context, session_ids: tuple[str, ...]) -> None:
    """End SESSION_IDS now (admin only): their leases stop blocking schema changes at once. The
    expiry is recorded in the log with your client name. A running batch of such a session
    will have its commit refused if its schema version is overtaken. An id that names no open
    session (unknown, or already ended) is SESSION_NOT_FOUND (exit 4); the others are still
    expired, and then the output lists both.

    \b
    Example (SESSION_IDS as `metastore session list` shows them):
      metastore session expire SESSION_IDS
    """
    if len(session_ids) > MAX_LEASES_PER_COMMAND:
        raise click.UsageError(f"at most {MAX_LEASES_PER_COMMAND} sessions at a time")
    a = app(ctx)
    result = a.client().session_expire(list(session_ids))
    if result.get("expired"):
        # Something was done: say what, even if the error below follows. When nothing was,
        # stdout stays empty, as for every other error.
        emit(
            a.output,
            result,
            lambda: [
                Text(f"expired: {', '.join(result.get('expired', [])) or '-'}"),
                Text(f"not found: {', '.join(result.get('skipped', [])) or '-'}"),
            ],
        )
    not_found = [str(s) for s in result.get("skipped", [])]
    if not_found:
        # Like etcdctl's revoke of an unknown lease: a typo or a session already gone is an
        # error a script can see, not a success.
        raise SessionNotFoundError(
            f"no open session {', '.join(not_found)} (unknown, or already ended; "
            "`metastore session list --all` shows the ended ones)"
        )


# ---- lease -------------------------------------------------------------------------------------


@click.group("lease")
def lease() -> None:
    """Schema leases held by running batches."""


@lease.command("list")
@click.argument("table", type=TABLE_NAME, required=False)
@click.pass_context
def lease_list(ctx: click.Context, table: str | None) -> None:
    """Leases held now, on every table or on NS.TABLE: which session holds which schema
    version, since when, and until when its session lives without a heartbeat.

    \b
    Example:
      metastore lease list sales.orders
    """
    a = app(ctx)
    with explaining_not_found(a.client(), table):
        result = a.client().lease_list(table)
    now = result.get("safe_time")

    def tables() -> list[RenderableType]:
        rows = [
            [held.get("table"), *row, "expired" if held.get("expired") else ""]
            for held, row in zip(
                result.get("leases", []), blocker_rows(result.get("leases", []), now), strict=True
            )
        ]
        return [Text(f"leases: {len(rows)}"), rows_table(["table", *BLOCKER_COLUMNS, ""], rows)]

    emit(a.output, result, tables)


@lease.command("blockers")
@click.argument("table", type=TABLE_NAME)
@click.pass_context
def lease_blockers(ctx: click.Context, table: str) -> None:
    """Who would block publishing NS.TABLE's next schema version right now: sessions holding a
    lease on a version older than the current one (the two-version invariant).

    \b
    Example:
      metastore lease blockers sales.orders
    """
    a = app(ctx)
    with explaining_not_found(a.client(), table):
        result = a.client().lease_blockers(table)
    now = result.get("safe_time")

    def tables() -> list[RenderableType]:
        blockers = result.get("blockers", [])
        head = Text(
            f"{result.get('table')}: current version v{result.get('current_version')}; "
            + (
                f"publishing v{result.get('publishing_version')} waits for {len(blockers)} lease(s)"
                if blockers
                else "nothing blocks the next schema change"
            )
        )
        return (
            [head, rows_table(BLOCKER_COLUMNS, blocker_rows(blockers, now))] if blockers else [head]
        )

    emit(a.output, result, tables)
