"""Running a Spark job of the bridge from the CLI (`job run-backfill`, `table optimize`).

It runs Spark in this process: a new SparkSession on `--master` (stopped at the end), or the
process's active session if there is one (left running). pyspark is imported only when a
command runs, so the rest of the CLI starts without it. The bridge's and the metastore's typed
errors become the CLI's exits (cli.errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from cli.errors import EXIT_AUTH, EXIT_CODE_BY_ERROR, EXIT_GENERIC, CliError, exit_code_for, fail
from cli.output import end_progress
from metastore.errors import MetastoreError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_bridge.bridge import MetastoreBridge

T = TypeVar("T")

# `--master` of every command that runs Spark here.
master_option = click.option(
    "--master",
    default="local[2]",
    show_default=True,
    help="Spark master URL of the session to start (ignored when one is already active).",
)


def require_token(token: str | None, what: str) -> str:
    if not token:
        raise CliError(
            "NO_TOKEN",
            f"{what} writes to the table: pass --token or --token-file (writer role)",
            exit_code=EXIT_AUTH,
        )
    return token


def run_with_bridge(
    *,
    endpoints: list[str],
    token: str,
    request_timeout_ms: int,
    master: str,
    app_name: str,
    body: Callable[[MetastoreBridge], T],
) -> T:
    """Build Spark and a bridge, run `body(bridge)`, tear down; typed errors become exits."""
    from metastore.client import SyncMetastoreClient
    from spark_bridge.backfill import BackfillError
    from spark_bridge.bridge import BatchError, MetastoreBridge
    from spark_bridge.conform import SchemaMismatchError
    from spark_bridge.optimize import OptimizeError

    try:
        from pyspark.errors import PySparkException
    except ImportError:
        raise CliError(
            "PYSPARK_MISSING",
            "this command runs Spark: install pyspark (pip install 'pyspark>=4.0,<4.4') and "
            "Java 17",
            exit_code=EXIT_GENERIC,
        ) from None
    spark, owned = _spark(master, app_name)
    bridge: MetastoreBridge | None = None
    try:
        client = SyncMetastoreClient(
            endpoints, token, timeout_ms=request_timeout_ms, client_name=app_name
        )
        bridge = MetastoreBridge(
            spark, endpoints=endpoints, token=token, app_name=app_name, client=client
        )
        return body(bridge)
    except (BackfillError, OptimizeError) as exc:
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
        # The error's own code: a subclass names what went wrong (NOT_NULL_VIOLATION).
        fail(exc.code, str(exc), EXIT_GENERIC, None)
    except PySparkException as exc:
        # Spark's own failure (a data file missing or unreadable, a path it cannot list):
        # its message, not a traceback. Nothing was committed: commits come after Spark.
        end_progress()
        message = str(exc).strip().splitlines()
        fail(
            "SPARK_FAILED",
            f"Spark failed, nothing was committed: {message[0] if message else type(exc).__name__}",
            EXIT_GENERIC,
            {"error_class": getattr(exc, "getCondition", lambda: None)() or type(exc).__name__},
        )
    finally:
        if bridge is not None:
            bridge.close()
        if owned:
            spark.stop()


def _spark(master: str, app_name: str) -> tuple[SparkSession, bool]:
    """The active SparkSession (not ours to stop), or a new one on `master` (ours)."""
    from pyspark.sql import SparkSession

    from spark_bridge.bridge import ensure_python_workers

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    ensure_python_workers()
    builder: Any = SparkSession.builder.master(master).appName(app_name)
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True
