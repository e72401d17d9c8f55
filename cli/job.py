"""`metastore job ...`: multi-step schema change jobs (metastore.jobs).

`ALTER TABLE t DROP COLUMN c` and `ALTER TABLE t ADD COLUMN c T NOT NULL DEFAULT x` are unsafe
in one step while batches pinned to older schema versions run, so each starts a job: the leader
takes it through intermediate versions (DROP: write_only -> dropped; ADD: delete_only ->
write_only -> backfill -> public), publishing each step once the previous one is active on every
node and no lease remains on the version two behind. An ADD on a table with files stops at
`backfill` until `metastore job run-backfill JOB_ID` has rewritten the files without the column.

`job list|show` say where each job is and what it waits for (the sessions in its way, with app
id, host, user, version held and for how long; a backfill to run); `job wait` follows one to its
end; `job cancel` rolls it back (a new version with the table's public shape from before the
job), waiting for the leases in its way like an ALTER does. `metastore sql` follows the job an
ALTER starts with the same code (`follow_job`, `job_outcome_error`).

Exit codes besides the usual ones (cli.errors): `job wait` (and `sql` following a job) exits 5
with JOB_CANCELLED / JOB_ABORTED when the job did not succeed, and 3 with TIMEOUT when it is
still running after the time allowed (it goes on in the background).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import click
from rich.console import RenderableType
from rich.text import Text

from cli.context import TABLE_NAME, app
from cli.errors import EXIT_REFUSED, EXIT_UNAVAILABLE, CliError
from cli.leases import BLOCKER_COLUMNS, blocker_rows, blocker_summary
from cli.output import (
    emit,
    end_progress,
    kv_table,
    progress,
    rows_table,
    status_line,
    ts_cell,
)
from cli.table import explaining_not_found
from cli.waiting import (
    WAIT_DEFAULT,
    WAIT_DURATION,
    format_wait,
    parse_wait_ms,
)
from metastore.client import SyncMetastoreClient
from metastore.daemon.api_limits import REQUEST_TIMEOUT_MS_MAX
from metastore.errors import MetastoreError

# How often a follower asks for the job (the leader's worker looks every 200 ms; a step takes
# at least DD + CSmax).
POLL_S: Final = 0.2
# `job wait` gives up after this long unless --timeout says otherwise.
WAIT_TIMEOUT_DEFAULT: Final = "1h"
JOB_ID: Final = click.IntRange(1, 2**63 - 1)
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
# Outcomes of following a job besides its final statuses.
AT_BACKFILL: Final = "backfill"
TIMED_OUT: Final = "timeout"


def run_backfill_command(job_id: object) -> str:
    return f"metastore job run-backfill {job_id}"


# ---- describing a job ------------------------------------------------------------------------


def _steps(view: dict[str, Any]) -> list[str]:
    steps = view.get("steps")
    return [str(s) for s in steps] if isinstance(steps, list) else []


def step_label(view: dict[str, Any]) -> str:
    """`write_only (1/2)`."""
    index = view.get("step_index")
    total = len(_steps(view))
    if isinstance(index, int) and total:
        return f"{view.get('step')} ({index + 1}/{total})"
    return str(view.get("step"))


def _waiting(view: dict[str, Any]) -> dict[str, Any]:
    w = view.get("waiting_for")
    return w if isinstance(w, dict) else {}


def _blockers(view: dict[str, Any]) -> list[dict[str, Any]]:
    b = _waiting(view).get("blockers")
    return [x for x in b if isinstance(x, dict)] if isinstance(b, list) else []


def waiting_text(view: dict[str, Any], now_tm: int | None) -> str:
    """What the job's next step waits for, in words: the sessions in its way (with how long they
    have held their lease, given `now_tm`), or the exact backfill command to run."""
    w = _waiting(view)
    if view.get("status") != RUNNING and w.get("reason") != "activation":
        return f"nothing: the job has ended ({view.get('status')})"
    reason = w.get("reason")
    message = str(w.get("message") or reason)
    if reason == "leases":
        blockers = _blockers(view)
        text = message + ": " + "; ".join(blocker_summary(b, now_tm) for b in blockers)
        more = int(w.get("blocker_count") or 0) - len(blockers)
        if more > 0:  # a view names the first 100 of them
            text += f"; and {more} more (`metastore lease blockers {view.get('table')}`)"
        return text
    if reason == "backfill":
        return (
            f"a backfill of {view.get('table')} (files written before column "
            f"{view.get('column')} lack it): run `{run_backfill_command(view.get('job_id'))}`"
        )
    if reason == "activation" and w.get("until_tm"):
        return f"{message} (at {ts_cell(w.get('until_tm'))})"
    if not reason:
        return "nothing: its next step is being proposed"
    return message


def _waiting_key(view: dict[str, Any]) -> tuple[object, ...]:
    """What a follower's log shows a new line for (not the growing held-for times)."""
    w = _waiting(view)
    return (view.get("step"), w.get("reason"), w.get("message"), waiting_text(view, None))


def _step_rows(view: dict[str, Any]) -> list[list[object]]:
    steps = _steps(view)
    versions = view.get("versions") if isinstance(view.get("versions"), list) else []
    assert isinstance(versions, list)
    index = view.get("step_index")
    current = index if isinstance(index, int) else -1
    status = view.get("status")
    rows: list[list[object]] = []
    for i, name in enumerate(steps):
        version = f"v{versions[i]}" if i <= current and i < len(versions) else "-"
        if i < current:
            state = "done"
        elif i == current:
            state = "<- current" if status == RUNNING else f"<- {status}"
        else:
            state = ""
        rows.append([i + 1, name, version, state])
    if status == "cancelled" and len(versions) > current + 1:
        rows.append(["-", "(rollback)", f"v{versions[-1]}", "public shape from before the job"])
    return rows


def job_tables(view: dict[str, Any], now_tm: int | None) -> list[RenderableType]:
    """`job show`: every field, the steps (the current one marked) and what it waits for,
    with the sessions in its way."""
    fields = {k: v for k, v in view.items() if k not in ("waiting_for", "steps")}
    out: list[RenderableType] = [
        Text(f"job {view.get('job_id')}: {view.get('statement')}"),
        kv_table(fields),
        rows_table(["#", "step", "version", "state"], _step_rows(view), title="steps"),
        Text(f"waiting for: {waiting_text(view, now_tm)}"),
    ]
    blockers = _blockers(view)
    if blockers and view.get("status") == RUNNING:
        out.append(
            rows_table(BLOCKER_COLUMNS, blocker_rows(blockers, now_tm), title="blocking sessions")
        )
    return out


def _job_list_tables(result: dict[str, Any], now_tm: int | None) -> list[RenderableType]:
    jobs = [j for j in result.get("jobs", []) if isinstance(j, dict)]
    rows = [
        [
            j.get("job_id"),
            j.get("table"),
            j.get("kind"),
            j.get("column"),
            j.get("status"),
            step_label(j),
            waiting_text(j, now_tm) if j.get("status") == RUNNING else "-",
        ]
        for j in jobs
    ]
    return [
        Text(f"jobs: {len(rows)}"),
        rows_table(["id", "table", "kind", "column", "status", "step", "waiting for"], rows),
    ]


# ---- following a job -------------------------------------------------------------------------


def job_intro(view: dict[str, Any]) -> str:
    return f"job {view.get('job_id')}: {view.get('statement')} ({' -> '.join(_steps(view))})"


@dataclass(frozen=True, slots=True)
class Followed:
    job: dict[str, Any]  # the last view seen
    outcome: str  # succeeded | cancelled | aborted | AT_BACKFILL | TIMED_OUT


def follow_job(
    client: SyncMetastoreClient,
    job_id: int,
    *,
    deadline: float,
    stop_at_backfill: bool,
    intro: Callable[[dict[str, Any]], str] = job_intro,
) -> Followed:
    """Follow job `job_id` until it ends, until it waits for a backfill (with
    `stop_at_backfill`) or until `deadline` (time.monotonic()), asking at least once. On stderr:
    `intro(view)`, a line per step reached, and a progress line with what it waits for (the
    sessions in its way, the backfill command). A retryable error (a leader change) is asked
    again until the deadline."""
    shown_step = -1
    shown_wait: tuple[object, ...] | None = None
    in_progress = False  # a progress line is on stderr (to end before returning)
    introduced = False
    while True:
        try:
            view = client.job_show(job_id)
        except MetastoreError as exc:
            if not exc.retryable or time.monotonic() >= deadline:
                raise
            progress(f"job {job_id}: {exc.code.value}: {exc.message}; asking again")
            shown_wait, in_progress = None, True
            time.sleep(POLL_S)
            continue
        if not introduced:
            status_line(intro(view))
            introduced = True
        reached = _show_steps(view, shown_step)
        if reached != shown_step:  # status lines replaced the progress line
            shown_step, in_progress = reached, False
        status = str(view.get("status"))
        # Ended in the log; wait (quietly) until its last version is in force everywhere too.
        if status != RUNNING:
            if _waiting(view).get("reason") != "activation":
                status_line(_end_line(view))
                return Followed(view, status)
            left_s = deadline - time.monotonic()
            if left_s <= 0:  # the deadline bounds this wait too (`job wait --timeout 0`)
                status_line(_end_line(view))
                return Followed(view, TIMED_OUT)
            time.sleep(min(POLL_S, left_s))
            continue
        reason = _waiting(view).get("reason")
        if reason == "backfill" and stop_at_backfill:
            if in_progress:
                end_progress()
            return Followed(view, AT_BACKFILL)
        if reason:
            key = _waiting_key(view)
            progress(
                f"job {job_id}: waiting for {waiting_text(view, client.clock.now())}",
                changed=key != shown_wait,
            )
            shown_wait, in_progress = key, True
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            if in_progress:
                end_progress()
            return Followed(view, TIMED_OUT)
        time.sleep(min(POLL_S, left_s))


def _show_steps(view: dict[str, Any], shown: int) -> int:
    """A line for each step reached since step index `shown`; returns the current index."""
    index = view.get("step_index")
    if not isinstance(index, int):
        return shown
    steps = _steps(view)
    versions = view.get("versions") if isinstance(view.get("versions"), list) else []
    assert isinstance(versions, list)
    for i in range(shown + 1, index + 1):
        version = f" (version {versions[i]})" if i < len(versions) else ""
        name = steps[i] if i < len(steps) else "?"
        status_line(f"job {view.get('job_id')}: step {i + 1}/{len(steps)} {name}{version}")
    return max(shown, index)


def _end_line(view: dict[str, Any]) -> str:
    job_id, status = view.get("job_id"), view.get("status")
    if status == SUCCEEDED:
        return f"job {job_id} succeeded: {view.get('statement')}"
    if status == "cancelled":
        return f"job {job_id} cancelled by {view.get('ended_by') or '?'} at step {view.get('step')}"
    return f"job {job_id} {status}: {view.get('message') or '-'}"


def job_outcome_error(followed: Followed, *, waited_ms: int, background_hint: bool) -> CliError:
    """The error for a followed job that did not succeed: cancelled, aborted, or still running
    after `waited_ms` (then, with `background_hint`, how to follow or cancel it)."""
    view = followed.job
    job_id = view.get("job_id")
    details = {
        "job_id": job_id,
        "table": view.get("table"),
        "status": view.get("status"),
        "step": view.get("step"),
        "waiting_for": _waiting(view).get("reason"),
    }
    if followed.outcome == "cancelled":
        versions = view.get("versions") or ["?"]
        return CliError(
            "JOB_CANCELLED",
            f"job {job_id} was cancelled by {view.get('ended_by') or '?'} at step "
            f"{view.get('step')}: `{view.get('statement')}` was rolled back (version "
            f"{versions[-1]} has the table's shape from before the job)",
            exit_code=EXIT_REFUSED,
            details=details,
        )
    if followed.outcome == "aborted":
        return CliError(
            "JOB_ABORTED",
            f"job {job_id} was aborted at step {view.get('step')}: "
            f"{view.get('message') or 'its table was dropped'}",
            exit_code=EXIT_REFUSED,
            details=details,
        )
    if view.get("status") != RUNNING:  # ended in the log; its last version not yet in force
        return CliError(
            "TIMEOUT",
            f"job {job_id} {view.get('status')}, but its last version is not in force on every "
            f"node after {format_wait(waited_ms)} (waiting for {waiting_text(view, None)}); "
            f"`metastore job wait {job_id}` follows it",
            exit_code=EXIT_UNAVAILABLE,
            details=details,
        )
    hint = (
        f"; it goes on in the background: `metastore job wait {job_id}` follows it, "
        f"`metastore job cancel {job_id}` rolls it back"
        if background_hint
        else ""
    )
    return CliError(
        "TIMEOUT",
        f"job {job_id} is still running at step {step_label(view)} after "
        f"{format_wait(waited_ms)}, waiting for {waiting_text(view, None)}{hint}",
        exit_code=EXIT_UNAVAILABLE,
        details=details,
    )


def _cancel_after_lost_reply(
    client: SyncMetastoreClient, job_id: int, error: MetastoreError
) -> dict[str, Any]:
    """What a cancel whose reply was lost did, from the job itself. `job_cancel` is not
    repeatable at the client, so a node that timed out on it (a leader that lost its quorum
    with the proposal pending: TIMEOUT, or UNAVAILABLE with the outcome unknown) leaves it
    unknown, and it may still apply. A job found cancelled, or with its cancel recorded, is
    followed as if the reply had come (`reply_lost`); else `error` stands (retryable: nothing
    was cancelled, run the command again)."""
    if not error.retryable:
        raise error
    try:
        view = client.job_show(job_id)
    except MetastoreError:
        raise error from None
    if view.get("status") == "cancelled" or (
        view.get("status") == RUNNING and view.get("cancel_requested")
    ):
        return {"job_id": job_id, "reply_lost": True}
    raise error


# ---- commands --------------------------------------------------------------------------------


@click.group("job")
def job() -> None:
    """Multi-step schema change jobs: DROP COLUMN, ADD COLUMN ... NOT NULL DEFAULT.

    Such an ALTER starts a job that the leader takes through intermediate schema versions, each
    once no running batch holds a lease on the version two behind. List jobs, show what one
    waits for (the sessions in its way, a backfill to run), wait for it, cancel it, or run the
    backfill an ADD COLUMN job waits for on a table with data.
    """


@job.command("list")
@click.argument("table", type=TABLE_NAME, required=False)
@click.option("--all", "show_all", is_flag=True, help="Also list finished jobs (the newest kept).")
@click.pass_context
def job_list(ctx: click.Context, table: str | None, show_all: bool) -> None:
    """Running schema change jobs (of NS.TABLE, if given), oldest first: id, table, kind, column,
    status, step and what the next step waits for. With --all, also finished ones (succeeded,
    cancelled, aborted).

    \b
    Example:
      metastore job list sales.orders --all
    """
    a = app(ctx)
    client = a.client()
    with explaining_not_found(client, table):
        result = client.job_list(table, all=show_all)
    emit(a.output, result, lambda: _job_list_tables(result, client.clock.now()))


@job.command("show")
@click.argument("job_id", type=JOB_ID)
@click.pass_context
def job_show(ctx: click.Context, job_id: int) -> None:
    """Everything about JOB_ID: its statement, status, steps (the current one marked) and
    versions, backfill state, and what its next step waits for: a version to activate, the
    sessions holding leases in its way (app id, host, user, version held, held for) or a
    backfill (with the command to run).

    \b
    Example:
      metastore job show 7
    """
    a = app(ctx)
    client = a.client()
    result = client.job_show(job_id)
    emit(a.output, result, lambda: job_tables(result, client.clock.now()))


@job.command("wait")
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--timeout",
    type=WAIT_DURATION,
    default=WAIT_TIMEOUT_DEFAULT,
    show_default=True,
    help="Give up (exit 3; the job goes on) after this long: 30s, 5m, 1500ms, at most 24h; "
    "0 looks once.",
)
@click.pass_context
def job_wait(ctx: click.Context, job_id: int, timeout: str) -> None:
    """Follow JOB_ID until it ends, printing on stderr each step it reaches and what it waits
    for (the sessions in its way; if it needs a backfill, the command to run). Exit 0 when it
    succeeded; 5 when it was cancelled or aborted; 3 when --timeout passed first.

    \b
    Example:
      metastore job wait 7 --timeout 10m
    """
    timeout_ms = parse_wait_ms(timeout)
    a = app(ctx)
    client = a.client()
    followed = follow_job(
        client, job_id, deadline=time.monotonic() + timeout_ms / 1000, stop_at_backfill=False
    )
    if followed.outcome != SUCCEEDED:
        raise job_outcome_error(followed, waited_ms=timeout_ms, background_hint=False)
    emit(a.output, followed.job, lambda: job_tables(followed.job, client.clock.now()))


@job.command("cancel")
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--wait",
    "wait",
    type=WAIT_DURATION,
    default=WAIT_DEFAULT,
    show_default=True,
    help="How long to wait for running batches' leases in the way (the rollback publishes a "
    "version too), at most 24h; 0 fails at once with the blockers.",
)
@click.pass_context
def job_cancel(ctx: click.Context, job_id: int, wait: str) -> None:
    """Roll JOB_ID back (writer role): a new schema version with the table's public shape from
    before the job (a column being dropped is public again at its place; a column being added
    disappears, its field id unused). If running batches hold leases in its way, the cancel
    is recorded at once (the job moves no further) and the rollback is published as soon as
    they are released or expire: the command follows it for up to --wait, showing the sessions
    in the way on stderr. Returns once the rollback is visible on every node.

    \b
    Example:
      metastore job cancel 7 --wait 1m
    """
    wait_ms = parse_wait_ms(wait)
    a = app(ctx)
    client = a.client()
    deadline = time.monotonic() + wait_ms / 1000
    timeout_ms = min(a.timeout_ms, REQUEST_TIMEOUT_MS_MAX)
    try:
        result = client.job_cancel(job_id, timeout_ms=timeout_ms)
    except MetastoreError as exc:
        result = _cancel_after_lost_reply(client, job_id, exc)
    if result.get("cancel_requested") or result.get("reply_lost"):
        # Leases are in the rollback's way: the cancel is recorded (the job moves no further)
        # and the leader rolls it back once they are released or expire. Follow it. (Or the
        # reply was lost and the job says it is cancelled: follow it until that is in force.)
        followed = follow_job(client, job_id, deadline=deadline, stop_at_backfill=False)
        if followed.outcome == TIMED_OUT and followed.job.get("status") == RUNNING:
            raise CliError(
                "TIMEOUT",
                f"the cancel of job {job_id} is recorded: the job moves no further and rolls "
                "back as soon as the leases in its way are released or expire (waiting for "
                f"{waiting_text(followed.job, None)}); `metastore job wait {job_id}` follows it",
                exit_code=EXIT_UNAVAILABLE,
                details={"job_id": job_id, "cancel_requested": True},
            )
        if followed.outcome != "cancelled":
            raise job_outcome_error(followed, waited_ms=wait_ms, background_hint=False)
        result = {**result, "version": followed.job.get("versions", [None])[-1]}
    view = client.job_show(job_id)
    doc = {**result, "job": view}

    def tables() -> list[RenderableType]:
        undone = (
            f"column {view.get('column')} is public again"
            if view.get("kind") == "drop_column"
            else f"column {view.get('column')} is gone"
        )
        return [
            Text(
                f"job {job_id} cancelled: {view.get('table')} v{result.get('version')} has its "
                f"shape from before the job ({undone})"
            ),
            kv_table(result),
        ]

    emit(a.output, doc, tables)
