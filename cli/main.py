"""`metastore`: the command line of the schema metastore, shaped like etcdctl.

Nouns and verbs (`metastore cluster status`, `metastore table describe sales.orders`), global
flags that each also come from a `METASTORE_*` environment variable, `-o table|json`, one
`Error: <CODE>: <message>` line on stderr and an exit code by kind of failure (cli.errors).

Every command parses its arguments, calls `spark_bridge.client` (or, for the local cluster's
lifecycle, `metastore.daemon.config` / `.secrets` and cli.processes) and prints; logic that
clients other than the CLI could need belongs in the library, not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.cluster import cluster
from cli.context import App
from cli.errors import EXIT_CODES_HELP, EXIT_USAGE, CliError, exit_code_for, fail
from cli.gc import gc, pts
from cli.job import job
from cli.job_backfill import run_backfill
from cli.leases import lease, session
from cli.node import node
from cli.ns import ns
from cli.output import OUTPUT_FORMATS
from cli.safe_time import safe_time
from cli.snapshot import snapshot
from cli.sql import sql
from cli.table import table
from cli.table_compact import table_compact
from cli.table_data import table_files, table_read
from cli.txn import txn
from cli.watch import watch
from hlc import HlcError
from metastore.daemon.config import ConfigError
from metastore.daemon.secrets import SecretsError
from metastore.errors import MetastoreError
from spark_bridge.client import DEFAULT_TIMEOUT_MS, TIMEOUT_MS_MAX

CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
    "show_default": True,
}

EPILOG = (
    "Examples:\n\n"
    "\b\n"
    "  metastore cluster init cluster_configs/local --cluster-id local\n"
    "  metastore cluster up\n"
    "  metastore cluster status -o json\n"
    '  metastore sql "CREATE NAMESPACE sales"\n'
    '  metastore sql "CREATE TABLE sales.orders (id BIGINT NOT NULL, amount DECIMAL(10,2))"\n'
    "  metastore table describe sales.orders --as-of -5m\n"
    "  metastore table read sales.orders --as-of 2026-11-22T10:00:00Z --limit 5\n"
    "  metastore txn log --limit 10\n"
    "  metastore job list --all\n"
    "  metastore cluster down\n\n" + EXIT_CODES_HELP
)


class RootGroup(click.Group):
    """Turns every typed error of a sub-command into one stderr line and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MetastoreError as exc:
            fail(exc.code.value, exc.message, exit_code_for(exc), exc.details)
        except ConfigError as exc:
            fail(exc.code, str(exc), EXIT_USAGE, None)
        except SecretsError as exc:
            fail(exc.code, str(exc), 1, None)
        except CliError as exc:
            fail(exc.code, exc.message, exc.exit_code, exc.details)
        except HlcError as exc:
            fail(exc.code, str(exc), EXIT_USAGE, None)


@click.group(cls=RootGroup, context_settings=CONTEXT_SETTINGS, epilog=EPILOG)
@click.option(
    "--endpoints",
    envvar="METASTORE_ENDPOINTS",
    show_envvar=True,
    metavar="HOST:PORT,...",
    help="Client addresses of the nodes. Default: the client ports in "
    "cluster_configs/local/cluster.toml (if that file exists here).",
)
@click.option(
    "--token",
    envvar="METASTORE_TOKEN",
    show_envvar=True,
    help="Bearer token (its role decides what you may do). Beats --token-file.",
)
@click.option(
    "--token-file",
    envvar="METASTORE_TOKEN_FILE",
    show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="File holding the token (mode 0600). Default: "
    "cluster_configs/local/secrets/admin.token if it exists.",
)
@click.option(
    "-o",
    "--output",
    envvar="METASTORE_OUTPUT",
    show_envvar=True,
    type=click.Choice(OUTPUT_FORMATS),
    default="table",
    help="Output format: rich tables, or one JSON document.",
)
@click.option(
    "--timeout-ms",
    envvar="METASTORE_TIMEOUT_MS",
    show_envvar=True,
    type=click.IntRange(1, TIMEOUT_MS_MAX),
    default=DEFAULT_TIMEOUT_MS,
    help="Time allowed for each request, failover and retries included.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    endpoints: str | None,
    token: str | None,
    token_file: Path | None,
    output: str,
    timeout_ms: int,
) -> None:
    """Manage and query a Raft-replicated schema metastore.

    Every node answers "what is table T's schema at timestamp T" the same way. Timestamps
    (--as-of) may be HLC integers, ISO-8601 times (2026-11-22T10:00:00Z), relative times
    (-5m, -2h) or now.
    """
    app = App(
        endpoints_option=endpoints,
        token=token,
        token_file=token_file,
        output=output,
        timeout_ms=timeout_ms,
    )
    ctx.obj = app
    ctx.call_on_close(app.close)


cli.add_command(cluster)
cli.add_command(node)
cli.add_command(sql)
cli.add_command(table)
cli.add_command(ns)
cli.add_command(safe_time)
cli.add_command(txn)
cli.add_command(session)
cli.add_command(lease)
cli.add_command(pts)
cli.add_command(gc)
cli.add_command(snapshot)
cli.add_command(watch)
cli.add_command(job)
# The data commands live in their own module (they need pyarrow) but belong to the table noun.
table.add_command(table_files)
table.add_command(table_read)
table.add_command(table_compact)
# `job run-backfill` runs Spark in this process; its module imports pyspark only when run.
job.add_command(run_backfill)


def main() -> None:
    """Console-script entry point (`metastore`)."""
    cli(prog_name="metastore")


if __name__ == "__main__":
    main()
