"""`metastore table optimize NS.TABLE`: rewrite a table's small files into larger ones with Spark.

Streaming writers commit a few small files per micro-batch; this command reads the small ones
and writes them back as files of about `--target-file-size`, one atomic commit per chunk that
removes the old files and adds the new ones (`spark_bridge.optimize`). Readers see the same rows
at every timestamp, and a concurrent writer is never lost: a commit that touched one of the
files first makes the chunk's commit fail whole, and the chunk is planned again.

It runs Spark in this process (cli.spark_run). It needs pyspark and a writer token.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Final

import click

from cli.context import TABLE_NAME, app
from cli.output import emit, end_progress, kv_table, progress
from cli.spark_run import master_option, require_token, run_with_bridge
from spark_bridge.optimize import TARGET_FILE_BYTES_MIN

_SIZE_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_SIZE_RE: Final = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


class ByteSize(click.ParamType[int]):
    """A size in bytes: 134217728, 128MiB, 128MB (decimal), 1GiB."""

    name = "SIZE"

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        size = self._parse(value, param, ctx)
        if size < self.minimum:
            self.fail(f"{value!r} is too small: at least {self.minimum} bytes", param, ctx)
        return size

    def _parse(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        m = _SIZE_RE.match(str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _SIZE_UNITS:
            self.fail(
                f"{value!r} is not a size: use bytes or a number with B, KB, KiB, MB, MiB, GB "
                "or GiB (e.g. 128MiB)",
                param,
                ctx,
            )
        return int(m.group(1)) * _SIZE_UNITS[unit]


@click.command("optimize")
@click.argument("table", type=TABLE_NAME)
@click.option(
    "--target-file-size",
    "target_file_bytes",
    type=ByteSize(minimum=TARGET_FILE_BYTES_MIN),
    default="128MiB",
    show_default=True,
    help="Size of the files to write.",
)
@click.option(
    "--small-file-size",
    "small_file_bytes",
    type=ByteSize(),
    default=None,
    help="Files below this size are rewritten (default: 3/4 of the target).",
)
@click.option(
    "--min-files",
    type=click.IntRange(min=2),
    default=2,
    show_default=True,
    help="Do nothing unless at least this many small files are live.",
)
@click.option(
    "--dry-run", is_flag=True, help="Only say what would be rewritten; commit nothing (no Spark)."
)
@master_option
@click.pass_context
def table_optimize(
    ctx: click.Context,
    table: str,
    target_file_bytes: int,
    small_file_bytes: int | None,
    min_files: int,
    dry_run: bool,
    master: str,
) -> None:
    """Rewrite NS.TABLE's small files into files of about --target-file-size.

    Each chunk (at most 1,000 files) is one atomic commit that removes the small files and adds
    the rewritten ones; readers see the same rows before and after, at every timestamp.
    Progress goes to stderr; the result to stdout (-o json for a document). Exit 5 when a
    commit was refused every time it was planned (another writer kept removing the files).

    \b
    Examples:
      metastore table optimize sales.orders --dry-run
      metastore table optimize sales.orders --target-file-size 256MiB
    """
    a = app(ctx)
    # The plan needs no Spark: an unknown table, or one with too few small files, is answered
    # without starting a SparkSession (seconds, and its log on stderr) for nothing.
    planned = _dry_run(a, table, target_file_bytes, small_file_bytes, min_files)
    if dry_run or not planned.files_rewritten:
        result = dataclasses.replace(planned, dry_run=dry_run)  # else: "nothing to optimize"
    else:
        token = require_token(a.resolve_token(), "optimize")
        try:
            result = run_with_bridge(
                endpoints=a.endpoints(),
                token=token,
                request_timeout_ms=a.timeout_ms,
                master=master,
                app_name=f"metastore-optimize-{table}",
                body=lambda bridge: bridge.optimize(
                    table,
                    target_file_bytes=target_file_bytes,
                    small_file_bytes=small_file_bytes,
                    min_files=min_files,
                    progress=lambda text: progress(text),
                ),
            )
        finally:
            end_progress()
    document = dataclasses.asdict(result)
    document["summary"] = result.line()
    emit(a.output, document, lambda: [kv_table(document, title=f"optimize {table}")])


def _dry_run(
    a: Any, table: str, target_file_bytes: int, small_file_bytes: int | None, min_files: int
) -> Any:
    """The listing and the arithmetic only: no Spark, no session, nothing written."""
    from cli.errors import EXIT_CODE_BY_ERROR, EXIT_GENERIC, fail
    from spark_bridge.optimize import OptimizeError, OptimizeRun

    try:
        return OptimizeRun(
            a.client(),
            table,
            target_file_bytes=target_file_bytes,
            small_file_bytes=small_file_bytes,
            min_files=min_files,
        ).dry()
    except OptimizeError as exc:
        fail(exc.code, exc.message, EXIT_CODE_BY_ERROR.get(exc.code, EXIT_GENERIC), exc.details)
