"""`metastore job run-backfill JOB_ID`: the Spark backfill of an ADD COLUMN ... NOT NULL DEFAULT.

The job stops at its "backfill" step while files written before its column became write-only
lack the column. This command waits for that step (printing what the job waits for on stderr),
rewrites those files with Spark through the bridge (one atomic commit per chunk) and reports the
backfill, after which the leader makes the column public (`spark_bridge.backfill`).

It runs Spark in this process (cli.spark_run). It needs pyspark and a writer token. Starting
Spark takes seconds, so a job id that does not exist, or a job with nothing to backfill, is
refused before Spark starts, and a job that has succeeded is reported so (exit 0) without it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from cli.context import DurationParam, app
from cli.errors import EXIT_CODE_BY_ERROR, EXIT_GENERIC, fail
from cli.job import JOB_ID
from cli.output import emit, end_progress, kv_table, progress
from cli.spark_run import master_option, require_token, run_with_bridge
from metastore.client import SyncMetastoreClient


@click.command("run-backfill")
@click.argument("job_id", type=JOB_ID)
@master_option
@click.option(
    "--timeout",
    # Not `timeout_ms`: that is the global --timeout-ms's name, whose hidden copy on every
    # command would read this option's value (click keys parsed values by name).
    "wait_ms",
    type=DurationParam(),
    default="5m",
    show_default=True,
    help="How long to wait for the job to reach its backfill step (e.g. 90s, 5m, 1h).",
)
@click.pass_context
def run_backfill(ctx: click.Context, job_id: int, master: str, wait_ms: int) -> None:
    """Rewrite the files of JOB_ID's table that lack its new column, so the job can publish it.

    Waits (up to --timeout) for the job to reach its backfill step, then rewrites, in Spark,
    every live file without the column (adding its DEFAULT), commits the swap and reports it.
    Safe to run again: a refused report is retried, and a second run finds nothing to rewrite.

    Exit 0 when the backfill is reported (`outcome: reported`), and also when the job has
    succeeded without this run's report, before it or while it ran (another run's report was
    accepted, or no backfill was needed): the column is public, `outcome: job_succeeded` and
    `note` say so (a job that had succeeded before is answered at once, without Spark).
    Exit 5 (SCHEMA_JOB_STATE) when the job was cancelled, is being cancelled or was aborted
    (its table dropped), or is not an ADD COLUMN job: the message says which.
    Exit 3 (TIMEOUT) when it did not reach its backfill step within --timeout.

    \b
    Example:
      metastore job run-backfill 7 --timeout 10m
    """
    a = app(ctx)
    token = require_token(a.resolve_token(), "a backfill")
    job = _refuse_unless_backfillable(a.client(), job_id)
    # Imported here: the module imports no pyspark, but the CLI loads it only for this command.
    from spark_bridge.backfill import succeeded_result

    result = succeeded_result(job)
    if result is not None:  # nothing to rewrite: no Spark (it takes seconds to start)
        progress(result.note)
        end_progress()
        document = dataclasses.asdict(result)
        emit(a.output, document, lambda: [kv_table(document, title=f"backfill of job {job_id}")])
        return
    try:
        result = run_with_bridge(
            endpoints=a.endpoints(),
            token=token,
            request_timeout_ms=a.timeout_ms,
            master=master,
            app_name=f"metastore-backfill-{job_id}",
            body=lambda bridge: bridge.run_backfill(
                job_id, timeout_s=wait_ms / 1000, progress=lambda text: progress(text)
            ),
        )
    finally:
        end_progress()
    document = dataclasses.asdict(result)
    emit(a.output, document, lambda: [kv_table(document, title=f"backfill of job {job_id}")])


def _refuse_unless_backfillable(client: SyncMetastoreClient, job_id: int) -> dict[str, Any]:
    """Fail now, not after Spark has started, when JOB_ID does not exist (exit 4) or is not an
    ADD COLUMN job running or succeeded (exit 5); else its view. The bridge checks the same
    again as it waits."""
    # The bridge's own rule, so both say the same; importing it does not import pyspark.
    from spark_bridge.backfill import BackfillError, _check_backfillable

    job = client.job_show(job_id)
    try:
        _check_backfillable(job)
    except BackfillError as exc:
        fail(exc.code, exc.message, EXIT_CODE_BY_ERROR.get(exc.code, EXIT_GENERIC), exc.details)
    return job
