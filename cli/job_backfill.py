"""`metastore job run-backfill JOB_ID`: the Spark backfill of an ADD COLUMN ... NOT NULL DEFAULT.

The job stops at its "backfill" step while files written before its column became write-only
lack the column. This command waits for that step (printing what the job waits for on stderr),
rewrites those files with Spark through the bridge (one atomic commit per chunk) and reports the
backfill, after which the leader makes the column public (`spark_bridge.backfill`).

It runs Spark in this process: a new SparkSession on `--master` (stopped at the end), or the
process's active session if there is one (left running). It needs pyspark and a writer token.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import click

from cli.context import app
from cli.errors import (
    EXIT_AUTH,
    EXIT_CODE_BY_ERROR,
    EXIT_GENERIC,
    CliError,
    exit_code_for,
    fail,
)
from cli.output import emit, end_progress, kv_table, progress
from metastore.commands import parse_duration_ms
from metastore.errors import InvalidArgumentError, MetastoreError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_bridge.backfill import BackfillResult


@click.command("run-backfill")
@click.argument("job_id", type=click.IntRange(min=1))
@click.option(
    "--master",
    default="local[2]",
    show_default=True,
    help="Spark master URL of the session to start (ignored when one is already active).",
)
@click.option(
    "--timeout",
    default="5m",
    show_default=True,
    help="How long to wait for the job to reach its backfill step (e.g. 90s, 5m, 1h).",
)
@click.pass_context
def run_backfill(ctx: click.Context, job_id: int, master: str, timeout: str) -> None:
    """Rewrite the files of JOB_ID's table that lack its new column, so the job can publish it.

    Waits (up to --timeout) for the job to reach its backfill step, then rewrites, in Spark,
    every live file without the column (adding its DEFAULT), commits the swap and reports it.
    Safe to run again: a refused report is retried, and a second run finds nothing to rewrite.
    """
    try:
        timeout_ms = parse_duration_ms(timeout, "--timeout")
    except InvalidArgumentError as exc:
        raise click.BadParameter(exc.message, param_hint="--timeout") from None
    a = app(ctx)
    token = a.resolve_token()
    if not token:
        raise CliError(
            "NO_TOKEN",
            "a backfill writes to the table: pass --token or --token-file (writer role)",
            exit_code=EXIT_AUTH,
        )
    try:
        result = _run(a.endpoints(), token, a.timeout_ms, job_id, master, timeout_ms / 1000)
    finally:
        end_progress()
    document = dataclasses.asdict(result)
    emit(a.output, document, lambda: [kv_table(document, title=f"backfill of job {job_id}")])


def _run(
    endpoints: list[str],
    token: str,
    request_timeout_ms: int,
    job_id: int,
    master: str,
    timeout_s: float,
) -> BackfillResult:
    """Build Spark and the bridge, run the backfill, tear down; typed errors become exits."""
    from metastore.client import SyncMetastoreClient
    from spark_bridge.backfill import BackfillError
    from spark_bridge.bridge import BatchError, MetastoreBridge
    from spark_bridge.conform import SchemaMismatchError

    spark, owned = _spark(master, job_id)
    bridge: MetastoreBridge | None = None
    try:
        client = SyncMetastoreClient(
            endpoints, token, timeout_ms=request_timeout_ms, client_name=f"backfill-{job_id}"
        )
        bridge = MetastoreBridge(
            spark,
            endpoints=endpoints,
            token=token,
            app_name=f"metastore-backfill-{job_id}",
            client=client,
        )
        return bridge.run_backfill(
            job_id, timeout_s=timeout_s, progress=lambda text: progress(text)
        )
    except BackfillError as exc:
        end_progress()
        fail(exc.code, exc.message, EXIT_CODE_BY_ERROR.get(exc.code, EXIT_GENERIC), exc.details)
    except BatchError as exc:
        end_progress()
        cause = exc.cause
        if isinstance(cause, MetastoreError):
            fail(cause.code.value, str(exc), exit_code_for(cause), cause.details)
        fail("BATCH_FAILED", str(exc), EXIT_GENERIC, None)
    except MetastoreError as exc:
        end_progress()
        fail(exc.code.value, exc.message, exit_code_for(exc), exc.details)
    except SchemaMismatchError as exc:
        end_progress()
        fail(SchemaMismatchError.code, str(exc), EXIT_GENERIC, None)
    finally:
        if bridge is not None:
            bridge.close()
        if owned:
            spark.stop()


def _spark(master: str, job_id: int) -> tuple[SparkSession, bool]:
    """The active SparkSession (not ours to stop), or a new one on `master` (ours)."""
    from pyspark.sql import SparkSession

    from spark_bridge.bridge import ensure_python_workers

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    ensure_python_workers()
    builder: Any = SparkSession.builder.master(master).appName(f"metastore-backfill-{job_id}")
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True
