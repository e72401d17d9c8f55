"""`metastore pts ...` and `metastore gc ...`: protected timestamps and the GC.

Each table has a GC threshold: reads AS OF a timestamp at or below it fail, and the files no
read above it can see are deleted by the leader's GC (every `gc_interval_ms`, or now with
`gc run`). The threshold follows now minus the table's `gc.ttl` property (25h unless the table or
its namespace sets it), never past a protected timestamp: `pts protect --ts T --table
NS.TABLE` keeps every file a read at >= T needs until `pts release`. Once `protect` returns, the
data is protected (metastore/gc.py). Times are the cluster's HLC, shown as ISO-8601.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import RenderableType
from rich.text import Text

from cli.context import PROTECT_TIMESTAMP, TABLE_NAME, DurationParam, app, duration_text
from cli.output import emit, kv_table, rows_table, ts_cell
from cli.table import explaining_not_found
from metastore.limits import GC_TTL_MS_MAX


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def _duration(ms: object) -> str:
    return duration_text(ms) if isinstance(ms, int) else "-"


def _targets(r: dict[str, Any]) -> str:
    parts = [*r.get("tables", []), *(f"{n}.*" for n in r.get("namespaces", []))]
    if r.get("cluster"):
        parts.append("(cluster)")
    return ", ".join(parts)


def _held_by(held: object) -> str:
    if not isinstance(held, dict):
        return "-"
    kind = held.get("kind")
    if kind == "protection":
        return f"protection {held.get('record_id')}"
    if kind == "lease":
        return f"lease of session {held.get('session_id')}"
    if kind == "ttl":
        return f"ttl {_duration(held.get('ttl_ms'))}"
    return str(kind)


# ---- pts ---------------------------------------------------------------------------------------


@click.group("pts")
def pts() -> None:
    """Protected timestamps: keep the GC away from data a long read, backfill or backup needs."""


@pts.command("protect")
@click.option(
    "--ts",
    "ts",
    type=PROTECT_TIMESTAMP,
    required=True,
    help="Protect reads at >= TS: HLC integer, ISO-8601, relative (-1h) or now; not later "
    "than now.",
)
@click.option("--table", "tables", type=TABLE_NAME, multiple=True, help="A table (repeatable).")
@click.option(
    "--namespace", "namespaces", multiple=True, metavar="NS", help="Every table of NS (repeatable)."
)
@click.option("--cluster", "cluster", is_flag=True, help="Every table of the cluster.")
@click.option(
    "--max-age",
    "max_age_ms",
    type=DurationParam(min_ms=1, max_ms=GC_TTL_MS_MAX),
    default=None,
    help=f"Release automatically after this long (e.g. 6h, 7d; at most "
    f"{duration_text(GC_TTL_MS_MAX)}). Default: never; `pts release` ends it.",
)
@click.option("--meta-type", default="cli", show_default=True, help="Who protects (a label).")
@click.option("--meta", default="", help="Free text shown by `pts list` (job, ticket).")
@click.option("--id", "record_id", default=None, help="Record id (default: a new UUID).")
@click.pass_context
def pts_protect(
    ctx: click.Context,
    ts: int,
    tables: tuple[str, ...],
    namespaces: tuple[str, ...],
    cluster: bool,
    max_age_ms: int | None,
    meta_type: str,
    meta: str,
    record_id: str | None,
) -> None:
    """Protect every read at >= --ts of the targets from GC until released. Refused (exit 4,
    BEFORE_GC_THRESHOLD) if --ts is already at or below a target's GC threshold.

    \b
    Examples:
      metastore pts protect --cluster --ts now --max-age 12h --id backup-2026-11-27
      metastore pts protect --ts -1h --table sales.orders --max-age 6h
    """
    if not (tables or namespaces or cluster):
        raise click.UsageError("name a target: --table, --namespace or --cluster")
    a = app(ctx)
    result = a.client().protect(
        ts,
        tables=list(tables),
        namespaces=list(namespaces),
        cluster=cluster,
        meta_type=meta_type,
        meta=meta,
        max_age_ms=max_age_ms,
        record_id=record_id,
    )
    emit(a.output, result, lambda: [kv_table(result, title="protected")])


@pts.command("release")
@click.argument("record_id")
@click.pass_context
def pts_release(ctx: click.Context, record_id: str) -> None:
    """Release RECORD_ID. Your own records (same client name) need the writer role; another
    client's need admin. Recorded in the log with your client name.

    \b
    Example:
      metastore pts release backup-2026-11-27
    """
    a = app(ctx)
    result = a.client().release_protection(record_id)
    emit(a.output, result, lambda: [Text(f"released {record_id}")])


@pts.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also list recently released records.")
@click.pass_context
def pts_list(ctx: click.Context, show_all: bool) -> None:
    """Protection records: id, protected ts, targets, owner session, creator, expiry. With
    --all, also released ones and why (release, admin, expired, owner_gone).

    \b
    Example:
      metastore pts list --all
    """
    a = app(ctx)
    result = a.client().protections(include_released=show_all)

    def tables() -> list[RenderableType]:
        meta = result.get("meta", {})
        rows = [
            [
                r.get("record_id"),
                ts_cell(r.get("ts")),
                _targets(r),
                r.get("meta_type"),
                r.get("meta"),
                r.get("owner") or "-",
                r.get("created_by"),
                ts_cell(r.get("expires_tm")),
            ]
            for r in result.get("records", [])
        ]
        columns = ["id", "protects from", "targets", "type", "meta", "owner", "by", "expires"]
        out: list[RenderableType] = [
            Text(
                f"records: {meta.get('num_records')}, targets: {meta.get('num_targets')}, "
                f"version: {meta.get('version')}"
            ),
            rows_table(columns, rows),
        ]
        if show_all:
            released = [
                [
                    r.get("record_id"),
                    ts_cell(r.get("ts")),
                    _targets(r),
                    r.get("reason"),
                    r.get("by"),
                    ts_cell(r.get("released_tm")),
                ]
                for r in result.get("released", [])
            ]
            out += [
                Text(f"released: {len(released)}"),
                rows_table(
                    ["id", "protected from", "targets", "reason", "by", "released at"], released
                ),
            ]
        return out

    emit(a.output, result, tables)


@pts.command("show")
@click.argument("record_id")
@click.pass_context
def pts_show(ctx: click.Context, record_id: str) -> None:
    """One record (or, if released recently, how and when it was released).

    \b
    Example:
      metastore pts show backup-2026-11-27
    """
    a = app(ctx)
    result = a.client().protection(record_id)
    emit(a.output, result, lambda: [kv_table(result, title=f"protection {record_id}")])


# ---- gc ----------------------------------------------------------------------------------------


@click.group("gc")
def gc() -> None:
    """GC thresholds, what the GC would free, and running it now."""


@gc.command("status")
@click.argument("table", type=TABLE_NAME, required=False)
@click.pass_context
def gc_status(ctx: click.Context, table: str | None) -> None:
    """Per table: TTL, threshold, the threshold a run now would reach and what holds it
    (ttl, a protection, a lease), reclaimable files and bytes; per protection the bytes it
    holds; the last run.

    A file removed after its entry moved into a manifest file (`table compact`) counts as
    reclaimable only once a compaction run after the threshold passed its removal has split
    it off; until then it is shown as awaiting compaction. The leader's GC runs that
    compaction itself (a few tables per run), so the files go at its next run; or run
    `metastore table compact NS.TABLE`, then `gc run`.

    \b
    Example:
      metastore gc status sales.orders
    """
    a = app(ctx)
    with explaining_not_found(a.client(), table):
        result = a.client().gc_status(table)

    def tables() -> list[RenderableType]:
        rows = [
            [
                t.get("table") + (" (dropped)" if t.get("dropped") else ""),
                _duration(t.get("ttl_ms")),
                ts_cell(t.get("threshold")),
                ts_cell(t.get("next_threshold")),
                _held_by(t.get("held_by")),
                ", ".join(t.get("protections", [])) or "-",
                t.get("live_files"),
                _size(t.get("live_bytes")),
                t.get("reclaimable_files"),
                _size(t.get("reclaimable_bytes")),
            ]
            for t in result.get("tables", [])
        ]
        columns = [
            "table",
            "ttl",
            "threshold",
            "next threshold",
            "held by",
            "protections",
            "live files",
            "live size",
            "reclaimable",
            "reclaimable size",
        ]
        out: list[RenderableType] = [rows_table(columns, rows)]
        held = [
            [p.get("record_id"), ts_cell(p.get("ts")), _size(p.get("held_bytes"))]
            for p in result.get("protections", [])
        ]
        if held:
            out.append(rows_table(["protection", "protects from", "holds"], held))
        awaiting = result.get("awaiting_compaction") or {}
        if awaiting.get("files"):
            out.append(Text(_awaiting_text(awaiting.get("files"), awaiting.get("tables"))))
        last = result.get("last_run") or {}
        if last:
            out.append(
                Text(
                    f"last run on this node: {last.get('files_deleted')} files "
                    f"({_size(last.get('bytes_deleted'))}) and {last.get('orphans_deleted')} "
                    f"orphans deleted in {last.get('seconds')} s"
                    + (
                        f" (stopped midway: {last.get('error')}; the next run resumes it)"
                        if last.get("partial")
                        else ""
                    )
                )
            )
        return out

    emit(a.output, result, tables)


def _awaiting_text(files: object, tables: object) -> str:
    return (
        f"awaiting compaction: {files} files, {tables} tables (removed inside manifests; the "
        "leader's GC compacts them at its next runs, or run `metastore table compact "
        "NS.TABLE`)"
    )


@gc.command("run")
@click.argument("table", type=TABLE_NAME, required=False)
@click.option("--dry-run", is_flag=True, help="Show what would be deleted; change nothing.")
@click.pass_context
def gc_run(ctx: click.Context, table: str | None, dry_run: bool) -> None:
    """Run the GC now on the leader (admin): move thresholds, delete the files they free and
    unreferenced files older than the orphan grace period. Resumable: a crash midway is
    finished by the next run.

    A table whose files removed inside manifests are dead at its threshold is compacted first
    (a few tables a run), so those files go in the same run. A table whose location is outside
    cluster.toml's `allowed_locations` is left alone (shown as such): its files are kept.

    \b
    Examples:
      metastore gc run --dry-run
      metastore gc run sales.orders
    """
    a = app(ctx)
    with explaining_not_found(a.client(), table):
        result = a.client().gc_run(table, dry_run=dry_run)

    def tables() -> list[RenderableType]:
        verb = "would delete" if dry_run else "deleted"
        rows = [
            [
                t.get("table"),
                ts_cell(t.get("threshold_before")),
                ts_cell(t.get("threshold")),
                _held_by(t.get("held_by")),
                t.get("files_deleted"),
                _size(t.get("bytes_deleted")),
                t.get("orphans_deleted"),
            ]
            for t in result.get("tables", [])
        ]
        out: list[RenderableType] = [
            rows_table(
                ["table", "threshold was", "threshold", "held by", "files", "size", "orphans"],
                rows,
            ),
            Text(
                f"{verb}: {result.get('files_deleted')} files "
                f"({_size(result.get('bytes_deleted'))}), {result.get('orphans_deleted')} "
                f"orphans ({_size(result.get('orphan_bytes_deleted'))}) "
                f"in {result.get('seconds')} s"
            ),
        ]
        out.extend(
            Text(f"{t.get('table')} left alone: {t.get('skipped')}")
            for t in result.get("tables", [])
            if t.get("skipped")
        )
        if result.get("tables_omitted"):
            out.append(
                Text(
                    f"{result.get('tables_omitted')} of {result.get('tables_total')} tables not "
                    "listed (the reply lists at most 1,000, those where something happened "
                    "first); the totals count them all"
                )
            )
        if result.get("parts"):
            # The run stopped midway (its leader lost its lease or leadership) and was
            # repeated: the totals above add up the parts; the table rows are the last part's.
            out.append(
                Text(
                    f"the run came in {result.get('parts')} parts (its leader stopped midway); "
                    "the totals count every part, the rows the last one"
                    + (
                        f"; {result.get('unanswered_parts')} attempt(s) got no answer and may "
                        "have deleted files not counted here"
                        if result.get("unanswered_parts")
                        else ""
                    )
                )
            )
        elif result.get("unanswered_parts"):
            out.append(
                Text(
                    f"{result.get('unanswered_parts')} earlier attempt(s) got no answer and may "
                    "have deleted files not counted here"
                )
            )
        if result.get("compacted_manifests"):
            out.append(
                Text(
                    f"compacted: {result.get('compacted_manifests')} manifests rewritten to "
                    "free the files removed inside them"
                )
            )
        if result.get("awaiting_compaction_files"):
            files = result.get("awaiting_compaction_files")
            tables = result.get("awaiting_compaction_tables")
            out.append(Text(_awaiting_text(files, tables)))
        skipped = result.get("orphan_locations_skipped") or []
        if skipped:
            more = result.get("orphan_locations_skipped_omitted")
            out.append(
                Text(
                    "orphan scan skipped (not a local path, a manifest unreadable, or outside "
                    f"allowed_locations): {', '.join(skipped)}"
                    + (f" and {more} more" if more else "")
                )
            )
        return out

    emit(a.output, result, tables)
