"""`metastore table compact NS.TABLE`: move a table's loose file entries into manifest files.

The client reads the table's loose entries, delete entries and manifest references
(`compaction_view`), writes the manifests under `<location>/_manifests/` itself, then proposes
one compare-and-swap (`compact_manifest`); see metastore.manifests and
metastore.client.manifest_files. Readers' answers are the same before and after, at every
timestamp. The bridge does the same automatically after a commit once a table passes
`loose_files_max`.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import RenderableType

from cli.context import TABLE_NAME, app
from cli.output import emit, end_progress, kv_table, progress
from cli.table import explaining_not_found
from metastore import limits


@click.command("compact")
@click.argument("name", type=TABLE_NAME)
@click.option(
    "--keep-loose",
    type=click.IntRange(0, limits.MAX_FILE_ENTRIES_PER_TABLE),
    default=0,
    help="Leave this many of the newest file entries loose (whole commits are moved).",
)
@click.option(
    "--entries-per-manifest",
    type=click.IntRange(1, limits.MANIFEST_ENTRIES_MAX),
    default=limits.MANIFEST_ENTRIES_MAX,
    help="Write manifests of at most this many entries (a commit is never split).",
)
@click.pass_context
def table_compact(
    ctx: click.Context, name: str, keep_loose: int, entries_per_manifest: int
) -> None:
    """Move the file entries of NS.TABLE from the replicated state into manifest files under
    the table's location, and fold pending removals into the manifests they hit. Needs write
    access to the warehouse and the writer role. Safe to run at any time and to repeat: a
    concurrent commit makes it re-read the table (MANIFEST_CONFLICT after 5 attempts).

    It is also what hands GC the files removed from inside manifests: entries removed at or
    below the table's GC threshold are split into a manifest of their own, which the next
    `gc run` deletes with its files.

    \b
    Example:
      metastore table compact sales.orders --keep-loose 1000
    """
    from metastore.client.manifest_files import compact_table

    a = app(ctx)
    try:
        with explaining_not_found(a.client(), name):
            result = compact_table(
                a.client(),
                name,
                keep_loose=keep_loose,
                entries_max=entries_per_manifest,
                progress=lambda text: progress(text),
            )
    finally:
        end_progress()
    emit(a.output, result, lambda: _summary(result))


def _summary(result: dict[str, Any]) -> list[RenderableType]:
    keys = (
        "table",
        "compacted",
        "moved_entries",
        "folded_deletes",
        "replaced",
        "manifests",
        "loose_entries",
        "deduplicated",
    )
    view = {k: result[k] for k in keys if k in result}
    if "added" in result:
        view["added"] = ", ".join(str(m.get("path")) for m in result["added"]) or "-"
    return [kv_table(view)]
