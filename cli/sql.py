"""`metastore sql "STATEMENT"`: run one Spark SQL DDL statement.

An ALTER that runs as a multi-step schema change job (DROP COLUMN, ADD COLUMN ... NOT NULL
DEFAULT; cli.job) returns once its first step is published; `sql` then follows the job like
`metastore job wait` until it ends or until --wait passes, unless --no-follow.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Any, Final

import click
from rich.console import RenderableType
from rich.text import Text

from cli.context import app
from cli.errors import REQUEST_ID_HELP, settle_unknown_outcome
from cli.job import (
    AT_BACKFILL,
    SUCCEEDED,
    follow_job,
    job_outcome_error,
    run_backfill_command,
)
from cli.output import emit, kv_table, status_line
from cli.waiting import WAIT_DEFAULT, WAIT_DURATION, BlockedProgress, parse_wait_ms
from metastore.client import SyncMetastoreClient
from metastore.errors import MetastoreError

_JOB_REPLY_KEYS = ("job_id", "job_step", "job_status")

# A word that reads as an option: `-x...` (a short option, its value maybe attached) or
# `--name[=value]`. A word that starts with "-" in any other way (`-- a comment\nALTER ...`,
# `--comment\nALTER ...`) is a statement: SQL has no other use for a leading dash.
_OPTION_SHAPED: Final = re.compile(r"-[A-Za-z].*|--[A-Za-z][\w-]*(=.*)?", re.DOTALL)


def statement_words_last(args: list[str], params: list[click.Parameter]) -> list[str]:
    """`args` with every word that starts with "-" but is not shaped like an option moved after
    a `--`, so click reads it as the STATEMENT rather than as an unknown option (a statement
    that opens with a `-- comment`). A word that is the value of an option before it stays
    there, and so does everything after the user's own `--`; an option-shaped word is left to
    click, so a misspelled option is still refused by name."""
    takes_value = {
        opt
        for p in params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for opt in p.opts
    }
    kept: list[str] = []
    statements: list[str] = []
    words = iter(args)
    for word in words:
        if word == "--":
            kept.append(word)
            kept.extend(words)
            break
        if word in takes_value:  # its value is the next word, whatever its shape
            kept.append(word)
            kept.extend(itertools.islice(words, 1))
            continue
        if len(word) > 1 and word.startswith("-") and not _OPTION_SHAPED.fullmatch(word):
            statements.append(word)
        else:
            kept.append(word)
    if not statements:
        return kept
    if "--" not in kept:
        return [*kept, "--", *statements]
    after = kept.index("--") + 1
    return [*kept[:after], *statements, *kept[after:]]


class StatementCommand(click.Command):
    """A command whose SQL STATEMENT argument may start with "-" (statement_words_last)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, statement_words_last(args, self.get_params(ctx)))


@click.command("sql", cls=StatementCommand)
@click.argument("statement")
@click.option("--request-id", help=REQUEST_ID_HELP)
@click.option(
    "--wait",
    "wait",
    type=WAIT_DURATION,
    default=WAIT_DEFAULT,
    show_default=True,
    help="How long an ALTER may wait for running batches' schema leases to drain (a change "
    "that would leave leases on three versions waits), and for the schema change job it "
    "starts, if any, to finish (at most 24h); 0 fails at once with the blockers (with a "
    "job: add --no-follow).",
)
@click.option(
    "--no-follow",
    is_flag=True,
    help="Return once a multi-step change's job has started (its first step is published) "
    "instead of following it (`metastore job wait JOB_ID` does that later).",
)
@click.pass_context
def sql(
    ctx: click.Context, statement: str, request_id: str | None, wait: str, no_follow: bool
) -> None:
    """Run one DDL STATEMENT (CREATE/DROP NAMESPACE, CREATE/DROP/ALTER TABLE).

    Returns once the change is visible on every node, and prints the schema version made, its
    Tm (when the leader ordered it), Tu (when it activates: Tm + DD) and how long it waited.
    While running batches hold leases that block it, it waits (up to --wait) and shows on
    stderr which sessions are in the way.

    DROP COLUMN and ADD COLUMN ... NOT NULL DEFAULT run as a schema change job through several
    versions: `sql` follows it on stderr until it succeeds (exit 0), is cancelled or aborted
    (exit 5), or --wait passes (exit 3; the job goes on). An ADD on a table with data stops at
    the backfill step: `sql` then prints the `metastore job run-backfill` command and exits 0
    (the column stays hidden until the backfill is done; the job resumes from there).

    STATEMENT may open with `-- comment` lines (a statement pasted from a migration file).

    \b
    Example:
      metastore sql "ALTER TABLE sales.orders ADD COLUMN note STRING"
      metastore sql "ALTER TABLE sales.orders DROP COLUMN legacy_flag"
    """
    wait_ms = parse_wait_ms(wait)
    a = app(ctx)
    started = time.monotonic()
    client = a.client()
    blocked = BlockedProgress(wait_ms, now_tm=client.clock.now)
    try:
        with settle_unknown_outcome():
            result = client.ddl(
                statement, request_id=request_id, wait_ms=wait_ms, on_blocked=blocked
            )
    finally:
        blocked.close()
    job_id = result.get("job_id")
    if not isinstance(job_id, int):
        emit(a.output, result, lambda: [kv_table(result)])
        return
    if no_follow:
        _announce_started(client, job_id)
        emit(a.output, result, lambda: [kv_table(result)])
        return
    followed = follow_job(
        client,
        job_id,
        deadline=started + wait_ms / 1000,
        stop_at_backfill=True,
        intro=lambda v: (
            f"the change runs as schema change job {job_id} in "
            f"{len(v.get('steps', []))} steps: {' -> '.join(v.get('steps', []))}"
        ),
    )
    if followed.outcome not in (SUCCEEDED, AT_BACKFILL):
        raise job_outcome_error(followed, waited_ms=wait_ms, background_hint=True)
    doc: dict[str, Any] = {**result, "job": followed.job}
    if followed.outcome == AT_BACKFILL:
        doc["note"] = _backfill_note(followed.job)
        status_line(doc["note"])
    emit(a.output, doc, lambda: _tables(result, followed.job, doc.get("note")))


def _announce_started(client: SyncMetastoreClient, job_id: int) -> None:
    try:
        steps = client.job_show(job_id).get("steps", [])
    except MetastoreError:
        steps = []  # the job runs anyway; only its step names are missing from the line
    names = f" ({' -> '.join(steps)})" if steps else ""
    status_line(
        f"the change runs as schema change job {job_id}{names}; "
        f"follow it with `metastore job wait {job_id}`"
    )


def _backfill_note(view: dict[str, Any]) -> str:
    job_id = view.get("job_id")
    return (
        f"job {job_id} waits at step backfill: {view.get('table')} has files written before "
        f"column {view.get('column')}. Run `{run_backfill_command(job_id)}` to rewrite them; "
        f"the column stays hidden until then. The change is safe as it stands and resumes "
        f"from this step (`metastore job wait {job_id}` follows it, "
        f"`metastore job cancel {job_id}` rolls it back)."
    )


def _tables(result: dict[str, Any], view: dict[str, Any], note: object) -> list[RenderableType]:
    reply = {k: v for k, v in result.items() if k not in _JOB_REPLY_KEYS}
    out: list[RenderableType] = [
        kv_table(reply),
        Text(
            f"job {view.get('job_id')}: {view.get('status')} at step {view.get('step')} "
            f"(versions {', '.join(f'v{v}' for v in view.get('versions', []))})"
        ),
    ]
    if isinstance(note, str):
        out.append(Text(note))
    return out
