"""Printing results: `-o json` prints one JSON document, `-o table` prints rich tables.

Commands build a plain document (what `-o json` prints) and, for `-o table`, a list of rich
renderables derived from the same data, so both outputs always show the same facts.
Timestamps stay HLC integers in JSON and are shown as ISO-8601 (`hlc.to_iso`) in tables.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TextIO

import click
from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from hlc import HlcError, to_iso
from metastore.client import EndpointResult
from metastore.errors import MetastoreError

# Terminal width to assume when stdout is not a terminal (a pipe, a file, a test): no row is
# ever wrapped there (a status row with a clock note passed 200 columns and put "connection"
# and "refused" on two lines), since that breaks `grep` and `awk`; a table is only as wide as
# its cells, so this is a bound, not a padding.
NON_TTY_WIDTH: Final = 100_000
# On a terminal, a column whose cells are all at most this long (names, endpoints, times,
# numbers, an error phrase) is never wrapped; only columns of longer free text (a schema, JSON
# properties) fold when the terminal is too narrow.
SHORT_PHRASE_CHARS: Final = 80

OUTPUT_FORMATS: Final = ("table", "json")


def console(stream: TextIO | None = None) -> Console:
    """A console on `stream` (click's stdout by default): colour only on a terminal."""
    # sys.stdout at call time, not import time: click's test runner swaps it.
    stream = stream if stream is not None else sys.stdout
    if stream is None:  # stdout closed (`>&-`): nowhere to print, as click.echo does
        stream = io.StringIO()
    tty = stream.isatty()
    return Console(
        file=stream,
        no_color=not tty,
        highlight=False,
        width=None if tty else NON_TTY_WIDTH,
        color_system="auto" if tty else None,
    )


def emit(fmt: str, document: object, tables: Callable[[], Iterable[RenderableType]]) -> None:
    """Print `document` as JSON, or the renderables `tables()` makes, according to `fmt`."""
    if fmt == "json":
        click.echo(json.dumps(document, indent=2, default=str))
        return
    out = console()
    for renderable in tables():
        out.print(renderable)


def progress(text: str, *, changed: bool = True) -> None:
    """A progress line on stderr: rewritten in place on a terminal; elsewhere (a log file) a
    new line only when `changed`, so waiting does not flood the log."""
    err = sys.stderr
    if err is None:  # stderr closed
        return
    if err.isatty():
        err.write("\r\x1b[2K" + text)
    elif changed:
        err.write(text + "\n")
    else:
        return
    err.flush()


def status_line(text: str) -> None:
    """A line on stderr that stays (on a terminal it replaces the progress line, if any)."""
    err = sys.stderr
    if err is None:  # stderr closed
        return
    err.write(("\r\x1b[2K" if err.isatty() else "") + text + "\n")
    err.flush()


def end_progress() -> None:
    err = sys.stderr
    if err is not None and err.isatty():
        err.write("\n")
        err.flush()


# ---- cell formatting -------------------------------------------------------------------------


def ts_cell(ts: object) -> str:
    """An HLC timestamp as ISO-8601 (`-` for none/zero)."""
    if ts is None or ts == 0:
        return "-"
    if not isinstance(ts, int) or isinstance(ts, bool):
        return str(ts)
    try:
        return to_iso(ts)
    except HlcError:
        return str(ts)


def safe_time_lag_cell(reply: Mapping[str, Any]) -> object:
    """A node's safe-time lag, or `-` while it has no safe time (a node that just started or
    joined reports its lag behind the epoch: decades of milliseconds)."""
    if reply.get("safe_time") in (None, 0):
        return "-"
    return reply.get("lag_ms")


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, Mapping | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


TS_KEYS: Final = frozenset({"tm", "tu", "ts", "safe_time", "now", "as_of"})
# Any other key ending like this holds a timestamp too (created_tm, dropped_tu, ...).
TS_KEY_SUFFIXES: Final = ("_tm", "_tu", "_ts")


def is_ts_key(key: str) -> bool:
    return key in TS_KEYS or key.endswith(TS_KEY_SUFFIXES)


def _plain(text: str | None) -> Text | None:
    """`text` as it is: rich reads a str cell or title as markup, so a user's '[/x]' (in a
    protection's meta, a comment, a name) made printing fail (MarkupError) and '[bold]' came
    out as a style."""
    return None if text is None else Text(text)


def kv_table(doc: Mapping[str, Any], *, title: str | None = None) -> Table:
    """A two-column key/value table of a result map; timestamps shown as ISO-8601."""
    table = Table(box=box.SIMPLE_HEAD, title=_plain(title), show_header=True, title_justify="left")
    table.add_column("KEY", no_wrap=True)
    table.add_column("VALUE", overflow="fold")
    for key, value in doc.items():
        shown = ts_cell(value) if is_ts_key(key) else cell(value)
        table.add_row(Text(key), Text(shown))
    return table


def rows_table(
    columns: Sequence[str], rows: Iterable[Sequence[object]], *, title: str | None = None
) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=_plain(title), title_justify="left")
    texts = [[v if isinstance(v, str) else cell(v) for v in row] for row in rows]
    for i, name in enumerate(columns):
        short = all(
            len(row[i]) <= SHORT_PHRASE_CHARS and "\n" not in row[i]
            for row in texts
            if i < len(row)
        )
        # A short phrase stays on its line (cut with an ellipsis only if the terminal cannot
        # hold even the short columns); long text folds.
        table.add_column(name.upper(), no_wrap=short, overflow="ellipsis" if short else "fold")
    for row in texts:
        table.add_row(*(Text(v) for v in row))
    return table


def error_doc(error: MetastoreError) -> dict[str, object]:
    return error.to_wire()


def endpoint_results_doc(results: Sequence[EndpointResult]) -> list[dict[str, object]]:
    """`-o json` form of per-endpoint answers."""
    doc: list[dict[str, object]] = []
    for r in results:
        if r.error is None:
            doc.append({"endpoint": r.endpoint, "ok": True, "result": r.result})
        else:
            doc.append({"endpoint": r.endpoint, "ok": False, "error": error_doc(r.error)})
    return doc
