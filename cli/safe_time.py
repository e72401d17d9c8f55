"""`metastore safe-time`: every node's safe time (the Tm of its last applied entry)."""

from __future__ import annotations

import click
from rich.console import RenderableType

from cli.context import app, config_dir_option, nothing_listens, nothing_listens_hint
from cli.errors import EXIT_UNAVAILABLE
from cli.output import emit, endpoint_results_doc, rows_table, safe_time_lag_cell, ts_cell


@click.command("safe-time")
@config_dir_option
@click.pass_context
def safe_time(ctx: click.Context) -> None:
    """Show each node's safe time, its lag behind the node's clock and whether it is ready.

    A node answers "schema at T" at once when its safe time >= T - DD. Exits with 3 if any
    node did not answer.

    \b
    Example:
      metastore safe-time --config cluster_configs/mycluster
    """
    a = app(ctx)
    results = a.client().safe_time_all()

    def tables() -> list[RenderableType]:
        rows = []
        for r in results:
            if r.result is not None:
                res = r.result
                rows.append(
                    [
                        r.endpoint,
                        res.get("node_id"),
                        ts_cell(res.get("safe_time")),
                        safe_time_lag_cell(res),
                        res.get("ready"),
                        "",
                    ]
                )
            elif r.error is not None:
                rows.append(
                    [r.endpoint, None, "-", None, None, f"{r.error.code.value}: {r.error.message}"]
                )
        cols = ["endpoint", "node", "safe time", "lag ms", "ready", "error"]
        return [rows_table(cols, rows)]

    emit(a.output, endpoint_results_doc(results), tables)
    if not all(r.ok for r in results):
        if nothing_listens([r.error for r in results if r.error is not None]):
            click.echo(nothing_listens_hint(a), err=True)
        ctx.exit(EXIT_UNAVAILABLE)
