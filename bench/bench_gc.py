"""The GC section of `make bench-catalog` (also `make bench-gc`): what protected timestamps and
the GC cost, and what GC gives back.

    python -m bench.bench_gc [--quick]

A real 3-node cluster (daemon processes on loopback, fsync on, DD = CSmax = 500 ms, as in
bench.bench_catalog), driven through the client protocol only:

(a) protect + release: PTS_CONNECTIONS connections to the leader, PTS_PIPELINE loops each,
    running protect -> release pairs back to back on one table (each is a Raft entry, fsynced
    on a quorum). Reported: pairs/s for the cluster and the p50/p99 of one protect and one
    release. A protect's reply means the data is protected (the strong guarantee), so this is
    the latency a long read or backfill pays once.
(b) file deletion: FILES files (100k; 20k with --quick) are written to the table's directory,
    committed 10k per commit, then all removed by one overwrite commit; with the table's gc.ttl
    at 1 s, one `gc_run` moves the threshold past the removal and deletes them. Reported: files
    deleted per second end to end (threshold entries, unlink in a worker thread, one
    GcFilesDeleted entry per 1k files), with `gc_delete_files_per_s` raised to its maximum so
    the throttle (default 1,000/s on purpose: GC must not saturate a shared file system) is not
    what is measured.
(c) snapshot size: the same history applied to the pure state machine in-process (what every
    node snapshots): bytes of `MetastoreState.to_snapshot()` with the removed entries, and after
    GC has moved them out and reported them deleted.

There is no baseline here: pysyncobj has no GC or protected timestamps, and the catalogs we
compete with do not publish numbers for theirs. The price we pay that a GC outside the log would
not: every threshold move and every deletion report is a replicated, fsynced entry.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from bench.bench_catalog import (
    CS_MAX_MS,
    DD_MS,
    RESULTS_DIR,
    Cluster,
    Connection,
    progress,
)
from bench.section import measure_table, ok, publish, run_on_cluster, stats, value, verdict

TABLE: Final = "bench.gc"
PTS_CONNECTIONS: Final = 8
PTS_PIPELINE: Final = 8
COMMIT_FILES: Final = 10_000
CLUSTER_START_WAIT_S: Final = 30.0
GC_RUN_TIMEOUT_MS: Final = 60_000
SETTINGS: Final = {"gc_interval_ms": 3_600_000, "gc_delete_files_per_s": 100_000}


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    quick: bool
    pts_seconds: float
    files: int

    @classmethod
    def for_mode(cls, *, quick: bool) -> Params:
        return cls(
            quick=quick, pts_seconds=3.0 if quick else 10.0, files=20_000 if quick else 100_000
        )


@dataclass(slots=True)
class Results:
    protect_pairs_per_s: float | None = None
    protect_ms: dict[str, float] = field(default_factory=dict)
    release_ms: dict[str, float] = field(default_factory=dict)
    pts_errors: int = 0
    files: int = 0
    gc_seconds: float | None = None
    files_deleted: int = 0
    files_deleted_per_s: float | None = None
    files_left_on_disk: int | None = None
    snapshot_bytes_before_gc: int | None = None
    snapshot_bytes_after_gc: int | None = None


def _now_hlc() -> int:
    return (time.time_ns() // 1_000_000) << 16


async def protect_churn(cluster: Cluster, leader: int, seconds: float, r: Results) -> None:
    conns = [await cluster.connect(leader, "writer") for _ in range(PTS_CONNECTIONS)]
    protect_ms: list[float] = []
    release_ms: list[float] = []
    pairs = 0
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def loop(conn: Connection) -> None:
        nonlocal pairs, errors
        while time.perf_counter() < stop_at:
            record_id = uuid.uuid4().hex
            t0 = time.perf_counter()
            a = await conn.call(
                "pts_protect", record_id=record_id, ts=_now_hlc(), tables=[TABLE], meta="bench"
            )
            t1 = time.perf_counter()
            b = await conn.call("pts_release", record_id=record_id)
            t2 = time.perf_counter()
            if a.get("ok") and b.get("ok"):
                pairs += 1
                protect_ms.append((t1 - t0) * 1000)
                release_ms.append((t2 - t1) * 1000)
            else:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(c) for c in conns for _ in range(PTS_PIPELINE)))
    r.protect_pairs_per_s = pairs / (time.perf_counter() - started)
    r.protect_ms = stats(protect_ms)
    r.release_ms = stats(release_ms)
    r.pts_errors = errors
    for c in conns:
        c.close()


async def gc_files(cluster: Cluster, leader: int, files: int, r: Results) -> None:
    writer = await cluster.connect(leader, "writer")
    admin = await cluster.connect(leader, "admin")
    location = Path(str((await ok(writer, "describe", table=TABLE))["location"]))
    r.files = files
    for start in range(0, files, COMMIT_FILES):
        tag = f"c{start // COMMIT_FILES}"
        add = await asyncio.to_thread(
            _write_files, location, tag, range(start, min(files, start + COMMIT_FILES))
        )
        await ok(
            writer,
            "commit",
            timeout_s=60.0,
            txn_id=f"bench-gc-{tag}",
            writes=[{"table": TABLE, "schema_version": 1, "add": add}],
            timeout_ms=30_000,
        )
    (kept,) = await asyncio.to_thread(_write_files, location, "last", range(1))
    await ok(
        writer,
        "commit",
        txn_id="bench-gc-overwrite",
        writes=[{"table": TABLE, "schema_version": 1, "add": [kept], "overwrite": True}],
    )
    await asyncio.sleep(1.5)  # past the table's 1 s gc.ttl
    t0 = time.perf_counter()
    run = await ok(
        admin,
        "gc_run",
        timeout_s=GC_RUN_TIMEOUT_MS / 1000 + 5,
        table=TABLE,
        timeout_ms=GC_RUN_TIMEOUT_MS,
    )
    r.gc_seconds = time.perf_counter() - t0
    r.files_deleted = int(run["files_deleted"])
    r.files_deleted_per_s = r.files_deleted / r.gc_seconds
    r.files_left_on_disk = await asyncio.to_thread(_count_files, location, "c")
    writer.close()
    admin.close()


def _write_files(location: Path, tag: str, numbers: range) -> list[dict[str, Any]]:
    directory = location / "_txn" / tag
    directory.mkdir(parents=True, exist_ok=True)
    add = []
    for i in numbers:
        name = f"part-{i:06d}.parquet"
        (directory / name).write_bytes(b"x" * 64)
        add.append({"path": f"_txn/{tag}/{name}", "size_bytes": 64, "row_count": 1})
    return add


def _count_files(location: Path, tag_prefix: str) -> int:
    return sum(1 for d in (location / "_txn").glob(f"{tag_prefix}*") for _ in d.iterdir())


def snapshot_sizes(files: int, r: Results) -> None:
    """The same history on the pure state machine: snapshot bytes before and after GC."""
    from metastore.commands import (
        AdvanceGcThreshold,
        CommitTxn,
        DataFile,
        GcFilesDeleted,
        InitCluster,
        TableName,
        TableWrite,
    )
    from metastore.ddl import parse_ddl
    from metastore.state import MetastoreState

    ms = 1 << 16
    state = MetastoreState()
    tm = _now_hlc()
    index = 0

    def apply(cmd: Any) -> dict[str, Any]:
        nonlocal tm, index
        tm += ms
        index += 1
        outcome = state.apply(cmd, tm=tm, index=index)
        outcome.raise_for_error()
        return dict(outcome.result)

    apply(InitCluster(dd_ms=DD_MS, cs_max_ms=CS_MAX_MS))
    apply(parse_ddl("CREATE NAMESPACE bench"))
    apply(parse_ddl(f"CREATE TABLE {TABLE} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')"))
    tm += DD_MS * ms
    name = TableName.parse(TABLE)
    for start in range(0, files, COMMIT_FILES):
        tag = f"c{start // COMMIT_FILES}"
        add = tuple(
            DataFile(path=f"_txn/{tag}/part-{i:06d}.parquet", size_bytes=64, row_count=1)
            for i in range(start, min(files, start + COMMIT_FILES))
        )
        apply(CommitTxn(txn_id=tag, writes=(TableWrite(table=name, schema_version=1, add=add),)))
    kept = (DataFile(path="_txn/last/kept.parquet", size_bytes=1, row_count=1),)
    apply(
        CommitTxn(
            txn_id="overwrite",
            writes=(TableWrite(table=name, schema_version=1, add=kept, overwrite=True),),
        )
    )
    r.snapshot_bytes_before_gc = len(state.to_snapshot())
    tm += 2_000 * ms
    table_id = state.catalog.live_table(name).table_id
    while True:
        result = apply(AdvanceGcThreshold(table=name, table_id=table_id, up_to=tm))
        queue = tuple(state.txns.gc_queue(table_id))
        if not queue:
            break
        for start in range(0, len(queue), 1_000):
            apply(GcFilesDeleted(table=name, table_id=table_id, paths=queue[start : start + 1_000]))
        if not result["purged"]:
            break
    r.snapshot_bytes_after_gc = len(state.to_snapshot())


async def measure_all(cluster: Cluster, params: Params, r: Results) -> None:
    await cluster.start_all(CLUSTER_START_WAIT_S)
    leader = await cluster.wait_ready(CLUSTER_START_WAIT_S)
    admin = await cluster.connect(leader, "admin")
    await ok(admin, "ddl", sql="CREATE NAMESPACE IF NOT EXISTS bench", request_id="ns")
    await ok(
        admin,
        "ddl",
        sql=f"CREATE TABLE {TABLE} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')",
        request_id="t",
    )
    admin.close()
    progress(f"(a) protect+release churn for {params.pts_seconds:g} s on node {leader}")
    await protect_churn(cluster, leader, params.pts_seconds, r)
    progress(f"(b) {params.files:,} files committed, removed, then one gc_run")
    await gc_files(cluster, leader, params.files, r)


def targets(r: Results) -> dict[str, dict[str, Any]]:
    return {
        "all_deleted": {
            "target": "every removed file deleted by one run, none left on disk",
            "value": r.files_left_on_disk,
            "met": None
            if r.files_left_on_disk is None
            else r.files_left_on_disk == 0 and r.files_deleted == r.files,
        },
        "snapshot_shrinks": {
            "target": "snapshot after GC < 1% of before (the removed entries leave the state)",
            "value": r.snapshot_bytes_after_gc,
            "met": None
            if r.snapshot_bytes_after_gc is None or not r.snapshot_bytes_before_gc
            else r.snapshot_bytes_after_gc < r.snapshot_bytes_before_gc / 100,
        },
        "no_errors": {
            "target": "no refused protect/release",
            "value": r.pts_errors,
            "met": r.pts_errors == 0,
        },
    }


def render(r: Results, verdicts: dict[str, dict[str, Any]]) -> Table:
    t = measure_table("protected timestamps and GC (3 nodes, fsync on, DD = CSmax = 500 ms)")

    def mark(key: str) -> str:
        return verdict(verdicts, key)

    fmt = value

    t.add_row("protect+release pairs/s", fmt(r.protect_pairs_per_s, ",.0f"), "")
    t.add_row(
        "protect p50 / p99 ms",
        f"{fmt(r.protect_ms.get('p50'))} / {fmt(r.protect_ms.get('p99'))}",
        "",
    )
    t.add_row(
        "release p50 / p99 ms",
        f"{fmt(r.release_ms.get('p50'))} / {fmt(r.release_ms.get('p99'))}",
        "",
    )
    t.add_row("refused protect/release calls", str(r.pts_errors), mark("no_errors"))
    t.add_row(f"gc_run of {r.files:,} removed files, s", fmt(r.gc_seconds, ".2f"), "")
    t.add_row("files deleted/s (end to end)", fmt(r.files_deleted_per_s, ",.0f"), "")
    t.add_row("files left on disk", str(r.files_left_on_disk), mark("all_deleted"))
    t.add_row(
        "state snapshot bytes before -> after GC",
        f"{fmt(r.snapshot_bytes_before_gc, ',.0f')} -> {fmt(r.snapshot_bytes_after_gc, ',.0f')}",
        mark("snapshot_shrinks"),
    )
    return t


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_gc", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="shorter window, 20k files")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    params = Params.for_mode(quick=args.quick)
    started = datetime.now(UTC)
    r = Results()
    error = run_on_cluster(
        "gc", lambda cluster: measure_all(cluster, params, r), settings=dict(SETTINGS)
    )
    progress(f"(c) snapshot size of {params.files:,} removed entries before/after GC (in-process)")
    snapshot_sizes(params.files, r)
    verdicts = targets(r)
    return publish(
        name="gc",
        argv=argv,
        started=started,
        params=params,
        results=r,
        verdicts=verdicts,
        table=render(r, verdicts),
        error=error,
        results_dir=args.results_dir,
        cluster_extra=dict(SETTINGS),
    )


if __name__ == "__main__":
    sys.exit(main())
