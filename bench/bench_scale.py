"""Scale benchmark (`make bench-scale`, issue 11 item 8): one table grown to 1 M files.

    python -m bench.bench_scale [--quick]

A real 3-node cluster (daemon processes on loopback, fsync on, DD = CSmax = 500 ms, as in
bench.bench_catalog) with snapshots every SNAPSHOT_EVERY entries (the smallest interval the
config allows, so the install phase needs few entries) keeping SNAPSHOT_KEEP behind. One
writer grows one table to FILES files (1 M; 100k with --quick) in commits of 1,000 files, one
commit at a time, through the product client (metastore.client). The paths are fake, shaped
like Spark's (the catalog never opens a data file), so Spark is not needed anywhere here.

(a) commit latency: every commit's round trip; reported for a window of commits around 10k,
    100k and 1M files: one snapshot interval (SNAPSHOT_EVERY commits, so a window meets the
    nodes' snapshots as often as the run does; 50 with --quick, which has only 100 commits).
    Snapshots any node took during a window are counted, and the window's p50/p99 is also
    given without the commits a snapshot overlapped (the steady cost of a commit; a snapshot's
    stall is estimated from its logged size, see snapshot_span).
(b) memory: each node's VmRSS (and VmHWM, its peak) from /proc/<pid>/status at each checkpoint
    and after the install.
(c) snapshot take: at each checkpoint a follower serialises its state for `snapshot_begin`
    (a view of MetastoreState on its event loop, then the encode, sha256 and spool in a worker
    thread, as a node's own snapshot is encoded; all of it ran on the loop before 2026-11-28),
    then the export is downloaded (freeing it). The nodes' own "snapshot taken" log lines give
    the sizes they wrote.
(d) `files` of the whole table through the client (all pages) from a follower at the end, and
    the fixed cost of one page (`limit=1`: the server builds the whole listing for every page).
(e) planning as the bridge does it before Spark: `pin` at Top, read_ts = min(Top, safe time),
    then `files_multi` AS OF read_ts (then `files` pages) and the absolute paths Spark would be
    handed.
(f) snapshot install: one follower is SIGKILLed (by PID) once the table is full; 1-file commits
    to a side table then run until the leader's log starts past it by more than the appends
    the leader sent it before pausing (those wait in the peer link and arrive on reconnect);
    the follower is restarted and timed until its status says ready with its applied index at
    the leader's commit index of the restart. It is judged only if the follower received the
    leader's snapshot, not only entries (a status during the restore, or a snapshot file in
    its WAL it did not take); its log splits the time into start + WAL recovery, transfer and
    restore. Bounded: after INSTALL_WAIT_S it is reported "n/a: not installed within N s" with
    the reason from the logs (before chunked snapshot transfer, an InstallSnapshot over the
    64 MiB peer frame limit could not be sent at all).

Targets (issue 11): commit p50 and p99 flat within 1.5x from 10k to 1M files; `files` of 1M in
<= 3 s; every node's RSS <= 1 GB (judged on its peak); a snapshot installed on a restarted
follower in <= 10 s. A missed target is a result, not a failure (exit status 0 when everything
was measured).

Results: a table on stdout, JSON in bench/results/scale-<UTC>.json (every commit's latency,
every snapshot the nodes logged), progress on stderr. Every wait has a deadline; every node is
stopped by its PID in a `finally`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from bench.bench_catalog import (
    HOST,
    NODE_IDS,
    RESULTS_DIR,
    BenchError,
    Cluster,
    RequestFailedError,
    progress,
)
from bench.procs import sigterm_as_interrupt
from bench.section import measure_table, ok, publish, run_on_cluster, stats, value, verdict
from metastore.limits import LOOSE_FILES_MAX_DEFAULT
from raft.core.ready import CoreConfig

NAMESPACE: Final = "bench"
TABLE: Final = f"{NAMESPACE}.scale"
# The install phase's 1-file commits go here, so the big table stays at exactly FILES.
SIDE_TABLE: Final = f"{NAMESPACE}.side"
BATCH_FILES: Final = 1_000
CHECKPOINTS: Final = (10_000, 100_000, 1_000_000)

# The smallest snapshot interval the config allows (metastore/daemon/config.py,
# SNAPSHOT_EVERY_ENTRIES_MIN), keeping as many entries behind it as it may (at most the
# interval): a live follower whose loop stalls on its own snapshot for a few commits still
# catches up from entries, while a follower down for > SNAPSHOT_EVERY + SNAPSHOT_KEEP entries
# needs the whole state. GC is kept out of the way (it has nothing to do here).
SNAPSHOT_EVERY: Final = 100
SNAPSHOT_KEEP: Final = 100
SETTINGS: Final = {
    "snapshot_every_entries": SNAPSHOT_EVERY,
    "snapshot_keep_entries": SNAPSHOT_KEEP,
    "gc_interval_ms": 86_400_000,
}

TARGET_FLAT_FACTOR: Final = 1.5
TARGET_FILES_S: Final = 3.0
TARGET_RSS_BYTES: Final = 1_000_000_000
TARGET_INSTALL_S: Final = 10.0

# Bounds on every wait (seconds).
CLUSTER_START_WAIT_S: Final = 30.0
CLIENT_CALL_TIMEOUT_MS: Final = 120_000
COMMIT_DEADLINE_S: Final = 120.0
CATCH_UP_WAIT_S: Final = 60.0
COMPACT_WAIT_S: Final = 180.0
INSTALL_WAIT_S: Final = 60.0
KILL_WAIT_S: Final = 10.0
EXPORT_TIMEOUT_S: Final = 120.0
POLL_S: Final = 0.02
# Appends a leader sends a follower without an answer (raft.core.ready.CoreConfig's default
# inflight window); 1-file commits one at a time make one entry each.
QUEUED_APPENDS_MAX: Final = CoreConfig(node_id=1).max_inflight_msgs
# 1-file side commits before giving up on the leader compacting past the stopped follower, and
# how many are sent between two looks at the leader's status.
SIDE_COMMITS_MAX: Final = 20 * (SNAPSHOT_EVERY + SNAPSHOT_KEEP)
SIDE_COMMITS_PER_LOOK: Final = 5
# A node's snapshot holds its event loop for about BASE + bytes / BYTES_PER_S before it logs
# "snapshot taken" (see snapshot_span); SLACK covers the reply that waited behind it.
SNAPSHOT_STALL_BASE_S: Final = 0.1
SNAPSHOT_STALL_BYTES_PER_S: Final = 30e6
SNAPSHOT_STALL_SLACK_S: Final = 0.05
# Distinct statuses of the restarted node kept for the report.
STATUSES_KEPT: Final = 50
# How many matching log lines a failure reason quotes.
REASON_LINES: Final = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    quick: bool
    files: int
    batch_files: int
    window_commits: int
    checkpoints: tuple[int, ...]
    snapshot_every_entries: int
    snapshot_keep_entries: int
    install_wait_s: float
    # Loose entries after which the writer compacts the table into manifests, as the bridge
    # does past the cluster's loose_files_max (0: never, the state holds every file entry).
    loose_files_max: int = LOOSE_FILES_MAX_DEFAULT

    @classmethod
    def for_mode(cls, *, quick: bool, loose_files_max: int = LOOSE_FILES_MAX_DEFAULT) -> Params:
        files = 100_000 if quick else 1_000_000
        checkpoints = tuple(c for c in CHECKPOINTS if c <= files)
        return cls(
            quick=quick,
            files=files,
            batch_files=BATCH_FILES,
            # One snapshot interval, or what fits between the checkpoints.
            window_commits=min(SNAPSHOT_EVERY, files // BATCH_FILES // len(checkpoints)),
            checkpoints=checkpoints,
            snapshot_every_entries=SNAPSHOT_EVERY,
            snapshot_keep_entries=SNAPSHOT_KEEP,
            install_wait_s=INSTALL_WAIT_S,
            loose_files_max=loose_files_max,
        )


@dataclass(slots=True)
class Checkpoint:
    files: int
    # The window of commits around `files` (by commit number, files after each commit).
    window_files: tuple[int, int] = (0, 0)
    commit_ms: dict[str, float] = field(default_factory=dict)
    snapshots_in_window: int = 0
    commit_ms_without_snapshots: dict[str, float] = field(default_factory=dict)
    # Node id (as a string, for JSON) -> MB (10^6 bytes).
    rss_mb: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    export_node: int = 0
    export_bytes: int | None = None
    export_take_s: float | None = None
    export_download_s: float | None = None


@dataclass(slots=True)
class Install:
    victim: int = 0
    victim_applied_at_kill: int | None = None
    side_commits: int = 0
    leader: int = 0
    leader_log_start: int | None = None
    leader_snapshot_index: int | None = None
    leader_snapshot_bytes: int | None = None
    leader_commit_at_restart: int | None = None
    wait_bound_s: float = 0.0
    # Seconds from the restart until the node answers `status`, is ready, has caught up.
    answers_s: float | None = None
    ready_s: float | None = None
    caught_up_s: float | None = None
    # From its node's log: process start + WAL recovery until "node started", then the chunked
    # transfer of the leader's snapshot (if the transport logs it), then restoring it.
    recovery_s: float | None = None
    transfer_s: float | None = None
    transfer_bytes: int | None = None
    after_transfer_s: float | None = None
    # Whether the restarted node caught up through a snapshot from the leader (see
    # received_snapshot), not only through entries.
    by_snapshot: bool | None = None
    victim_total_files: int | None = None
    reason: str | None = None
    # [s since restart, applied index, log start, ready] each time one of them changed.
    statuses: list[list[Any]] = field(default_factory=list)


@dataclass(slots=True)
class Results:
    loadavg_at_start: list[float] = field(default_factory=list)
    duration_s: float | None = None
    growth_s: float | None = None
    files_committed: int = 0
    commits: int = 0
    # Commits our loop had to send again after the client gave up on them (same txn id).
    commit_retries: int = 0
    commit_ms: dict[str, float] = field(default_factory=dict)
    # Raft terms: more than one election means leadership moved during the run.
    term_at_start: int | None = None
    term_after_growth: int | None = None
    term_at_end: int | None = None
    # "clock fence" errors the nodes logged (a stalled event loop makes peers' clocks look off).
    clock_fences: int = 0
    # VmRSS / VmHWM (MB) of every node once the restarted one caught up.
    rss_after_install_mb: dict[str, float] = field(default_factory=dict)
    peak_rss_after_install_mb: dict[str, float] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    listing_node: int = 0
    files_s: float | None = None
    files_listed: int | None = None
    files_page_fixed_ms: float | None = None
    plan_pin_ms: float | None = None
    plan_pin_waited_ms: float | None = None
    plan_files_s: float | None = None
    plan_paths_s: float | None = None
    plan_total_s: float | None = None
    plan_files: int | None = None
    snapshots_logged: int = 0
    snapshot_bytes_max: int | None = None
    install: Install = field(default_factory=Install)
    # [files after the commit, latency ms, start unix s, end unix s] for every commit.
    commit_samples: list[list[float]] = field(default_factory=list)
    # [files when it ran, seconds (view + manifest write + CompactManifest), entries moved,
    # manifests after] of every compaction the writer ran.
    compactions: list[list[float]] = field(default_factory=list)
    # {node, unix_s, index, bytes} of every "snapshot taken" a node logged.
    snapshots: list[dict[str, float]] = field(default_factory=list)


# --- Pure helpers (tests/bench/test_bench_scale.py) --------------------------------------------
def batch_add(batch: int, files: int, job: str) -> list[dict[str, Any]]:
    """`files` fake data files of commit `batch`, named the way Spark names its output."""
    return [
        {
            "path": f"_txn/b{batch:06d}/part-{i:05d}-{job}-c000.zstd.parquet",
            "size_bytes": 4_000_000 + i,
            "row_count": 10_000,
        }
        for i in range(files)
    ]


def window_start(center_files: int, batch_files: int, commits: int, width: int) -> int:
    """Index of the first commit of the `width` commits around the one that brings the table to
    `center_files` (commit k leaves (k + 1) * batch_files files), kept inside [1, commits):
    commit 0 is the warm-up (first connection, first commit to the table)."""
    center = center_files // batch_files - 1
    return max(1, min(center - width // 2 + 1, commits - width))


def snapshot_span(snapshot: dict[str, float]) -> tuple[float, float]:
    """When a node's snapshot held its event loop, estimated: it logs "snapshot taken" at the
    end, after serialising the state and writing it to the WAL (fsync included), which takes
    about SNAPSHOT_STALL_BASE_S + bytes / SNAPSHOT_STALL_BYTES_PER_S (generous: measured
    ~40 MB/s on this machine)."""
    end = snapshot["unix_s"]
    start = end - SNAPSHOT_STALL_BASE_S - snapshot["bytes"] / SNAPSHOT_STALL_BYTES_PER_S
    return start, end + SNAPSHOT_STALL_SLACK_S


def overlaps(start: float, end: float, spans: Sequence[tuple[float, float]]) -> bool:
    return any(start <= hi and lo <= end for lo, hi in spans)


def received_snapshot(status: dict[str, Any], old_applied: int) -> bool:
    """Whether a restarted node's status shows a snapshot received from the leader: its log
    starts past its old applied index at or beyond its applied index (restoring, or just
    restored). A snapshot of its own starts its log SNAPSHOT_KEEP entries behind applied."""
    log_start, applied = int(status["log_start_index"]), int(status["applied_index"])
    return log_start > old_applied and log_start >= applied


def parse_proc_status(text: str) -> dict[str, int]:
    """VmRSS and VmHWM of a /proc/<pid>/status text, in bytes."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def log_records(text: str) -> list[dict[str, Any]]:
    """The JSON-lines records of a node's output (other lines skipped)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                out.append(record)
    return out


def unix_s(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def snapshots_taken(records: Iterable[dict[str, Any]], node_id: int) -> list[dict[str, float]]:
    return [
        {
            "node": node_id,
            "unix_s": unix_s(str(r["ts"])),
            "index": int(r.get("index", 0)),
            "bytes": int(r.get("bytes", 0)),
        }
        for r in records
        if r.get("msg") == "snapshot taken" and "ts" in r
    ]


REASON_WORDS: Final = ("snapshot", "dropping", "too large", "frame", "transfer")


def failure_reason(records_by_node: dict[int, list[dict[str, Any]]]) -> str:
    """The last distinct warnings/errors (or snapshot lines) each node logged, for a report."""
    parts = []
    for node_id, records in sorted(records_by_node.items()):
        seen: list[str] = []
        for r in reversed(records):
            msg = str(r.get("msg", ""))
            interesting = r.get("level") in ("warning", "error", "critical") or any(
                w in msg.lower() for w in REASON_WORDS
            )
            if interesting and msg not in seen:
                seen.append(msg)
            if len(seen) >= REASON_LINES:
                break
        if seen:
            parts.append(f"node {node_id}: " + " | ".join(reversed(seen)))
    return "; ".join(parts) or "nothing relevant in the logs"


# --- The cluster -------------------------------------------------------------------------------
def rss(pid: int) -> dict[str, int]:
    try:
        return parse_proc_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return {}


def snapshot_files(cluster: Cluster, node_id: int) -> set[int]:
    """Indices of the snapshot files in a node's WAL directory (snap-<index in hex>.snap)."""
    wal = cluster.workdir / "data" / f"node-{node_id}" / "wal"
    return {int(p.stem.removeprefix("snap-"), 16) for p in wal.glob("snap-*.snap")}


def endpoint(cluster: Cluster, node_id: int) -> str:
    return f"{HOST}:{cluster.client_ports[node_id]}"


def node_records(cluster: Cluster, node_id: int, offset: int = 0) -> list[dict[str, Any]]:
    try:
        with cluster.log_path(node_id).open("rb") as f:
            f.seek(offset)
            return log_records(f.read().decode(errors="replace"))
    except OSError:
        return []


def log_size(cluster: Cluster, node_id: int) -> int:
    try:
        return cluster.log_path(node_id).stat().st_size
    except OSError:
        return 0


def kill_node(cluster: Cluster, node_id: int) -> None:
    """SIGKILL one node by its PID and reap it (Cluster.start starts it again)."""
    pid = cluster.pid(node_id)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                time.sleep(POLL_S)
                continue
        return
    raise RequestFailedError(f"node {node_id} (pid {pid}) did not die within {KILL_WAIT_S} s")


async def status_of(cluster: Cluster, node_id: int) -> dict[str, Any]:
    st = await cluster.status(node_id)
    if st is None:
        raise RequestFailedError(f"node {node_id} does not answer status")
    return st


async def wait_caught_up(cluster: Cluster, leader: int, nodes: Iterable[int]) -> None:
    """Until every node in `nodes` has applied the leader's commit index (bounded)."""
    target = int((await status_of(cluster, leader))["commit_index"])
    deadline = time.monotonic() + CATCH_UP_WAIT_S
    for node_id in nodes:
        while True:
            st = await cluster.status(node_id)
            if st and st.get("ready") and int(st["applied_index"]) >= target:
                break
            if time.monotonic() > deadline:
                raise RequestFailedError(
                    f"node {node_id} did not apply index {target} within {CATCH_UP_WAIT_S} s "
                    f"(status {st})"
                )
            await asyncio.sleep(POLL_S)


# --- Phases ------------------------------------------------------------------------------------
async def commit_once(client: Any, txn_id: str, writes: list[dict[str, Any]], r: Results) -> int:
    """Commit, sending the same txn id again (the server de-duplicates) until it is acknowledged
    or COMMIT_DEADLINE_S has passed. Returns the commit ts."""
    from metastore.errors import MetastoreError

    deadline = time.monotonic() + COMMIT_DEADLINE_S
    while True:
        try:
            result = await client.commit(txn_id, writes)
            return int(result["ts"])
        except MetastoreError as exc:
            if time.monotonic() > deadline or not getattr(exc, "retryable", True):
                raise RequestFailedError(f"commit {txn_id}: {exc}") from exc
            r.commit_retries += 1
            progress(f"commit {txn_id} failed ({exc}); sending it again")


async def checkpoint(cluster: Cluster, export_node: int, files: int) -> Checkpoint:
    cp = Checkpoint(files=files, export_node=export_node)
    for node_id in NODE_IDS:
        mem = rss(cluster.pid(node_id))
        cp.rss_mb[str(node_id)] = mem.get("VmRSS", 0) / 1e6
        cp.peak_rss_mb[str(node_id)] = mem.get("VmHWM", 0) / 1e6
    admin = await cluster.connect(export_node, "admin")
    try:
        t0 = time.perf_counter()
        begun = await ok(admin, "snapshot_begin", timeout_s=EXPORT_TIMEOUT_S)
        # Less the wait for safe time (the export covers every commit acknowledged before it).
        cp.export_take_s = time.perf_counter() - t0 - float(begun.get("waited_ms", 0)) / 1000
        cp.export_bytes = int(begun["size_bytes"])
        offset = 0
        t1 = time.perf_counter()
        while True:
            chunk = await ok(
                admin,
                "snapshot_chunk",
                timeout_s=EXPORT_TIMEOUT_S,
                export_id=begun["export_id"],
                offset=offset,
            )
            offset += len(chunk["data"])
            if chunk["done"]:
                break
        cp.export_download_s = time.perf_counter() - t1
    finally:
        admin.close()
    progress(
        f"  {files:,} files: RSS MB "
        + ", ".join(f"n{k} {v:,.0f}" for k, v in cp.rss_mb.items())
        + f"; export on node {export_node}: {cp.export_bytes:,} B in {cp.export_take_s:.2f} s"
    )
    return cp


async def grow(
    cluster: Cluster, leader: int, export_node: int, params: Params, r: Results
) -> list[list[float]]:
    """Commit the table up to params.files; checkpoints as the table passes them."""
    from metastore.client import MetastoreClient

    order = [leader, *(n for n in NODE_IDS if n != leader)]
    samples: list[list[float]] = []
    commits = params.files // params.batch_files
    t_growth = time.perf_counter()
    from metastore.client import SyncMetastoreClient

    compactor = SyncMetastoreClient(
        [endpoint(cluster, n) for n in order],
        cluster.token("writer"),
        timeout_ms=CLIENT_CALL_TIMEOUT_MS,
        client_name="bench-scale-compactor",
    )
    loose = 0
    async with MetastoreClient(
        [endpoint(cluster, n) for n in order],
        cluster.token("writer"),
        timeout_ms=CLIENT_CALL_TIMEOUT_MS,
        client_name="bench-scale",
    ) as client:
        last_report = time.monotonic()
        for batch in range(commits):
            add = batch_add(batch, params.batch_files, uuid.uuid4().hex)
            writes = [{"table": TABLE, "schema_version": 1, "add": add}]
            start_unix = time.time()
            t0 = time.perf_counter()
            await commit_once(client, f"bench-scale-{batch}", writes, r)
            latency_ms = (time.perf_counter() - t0) * 1000
            files = (batch + 1) * params.batch_files
            samples.append([files, latency_ms, start_unix, time.time()])
            r.commits = batch + 1
            r.files_committed = files
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                progress(f"  {files:,} files committed (last commit {latency_ms:.1f} ms)")
            loose += params.batch_files
            if params.loose_files_max and loose > params.loose_files_max:
                # What the bridge does after a commit past the bound (maybe_compact): the
                # commit is already acknowledged, so this is not in its latency.
                loose = await compact(compactor, files, r)
            if files in params.checkpoints:
                r.checkpoints.append(await checkpoint(cluster, export_node, files))
    compactor.close()
    r.growth_s = time.perf_counter() - t_growth
    return samples


async def compact(compactor: Any, files: int, r: Results) -> int:
    """Compact the table into manifests (in a thread: the client library is blocking);
    returns the loose entries left."""
    from metastore.client.manifest_files import compact_table

    t0 = time.perf_counter()
    result = await asyncio.to_thread(compact_table, compactor, TABLE)
    took_s = time.perf_counter() - t0
    r.compactions.append(
        [files, took_s, int(result.get("moved_entries") or 0), int(result.get("manifests") or 0)]
    )
    return int(result.get("loose_entries") or 0)


async def list_and_plan(cluster: Cluster, follower: int, params: Params, r: Results) -> None:
    """(d) the whole listing through the client, (e) planning as the bridge does it."""
    from metastore.client import MetastoreClient
    from spark_bridge.files import absolute

    r.listing_node = follower
    reader = await cluster.connect(follower, "reader")
    try:
        t0 = time.perf_counter()
        await ok(reader, "files", timeout_s=60.0, table=TABLE, limit=1)
        r.files_page_fixed_ms = (time.perf_counter() - t0) * 1000
    finally:
        reader.close()
    order = [follower, *(n for n in NODE_IDS if n != follower)]
    async with MetastoreClient(
        [endpoint(cluster, n) for n in order],
        cluster.token("writer"),
        timeout_ms=CLIENT_CALL_TIMEOUT_MS,
        client_name="bench-scale",
    ) as client:
        t0 = time.perf_counter()
        listing = await client.files(TABLE)
        r.files_s = time.perf_counter() - t0
        r.files_listed = len(listing["files"])
        del listing
        progress(f"(d) files: {r.files_listed:,} files in {r.files_s:.2f} s from node {follower}")

        t0 = time.perf_counter()
        top = client.clock.now()
        pinned = await client.pin([TABLE], ts=top)
        t1 = time.perf_counter()
        read_ts = min(top, int(pinned["safe_time"]))
        # The bridge lists every table a batch reads with one files_multi (here: one table).
        (files,) = (await client.files_multi([TABLE], as_of=read_ts))["listings"]
        t2 = time.perf_counter()
        location = str(files.get("location") or pinned["pins"][0].get("location") or "")
        paths = [absolute(location, f["path"]) for f in files["files"]]
        t3 = time.perf_counter()
        r.plan_pin_ms = (t1 - t0) * 1000
        r.plan_pin_waited_ms = float(pinned.get("waited_ms", 0.0))
        r.plan_files_s = t2 - t1
        r.plan_paths_s = t3 - t2
        r.plan_total_s = t3 - t0
        r.plan_files = len(paths)
        del files, paths
    progress(
        f"(e) plan: pin {r.plan_pin_ms:.1f} ms + files {r.plan_files_s:.2f} s + paths "
        f"{r.plan_paths_s:.2f} s = {r.plan_total_s:.2f} s for {r.plan_files:,} files"
    )


def breakdown(records: list[dict[str, Any]], restart_unix: float, ins: Install) -> None:
    """Where the install's time went, from the restarted node's log lines."""
    started = [unix_s(str(x["ts"])) for x in records if x.get("msg") == "node started"]
    if started:
        ins.recovery_s = started[0] - restart_unix
    begin = end = None
    for x in records:
        msg = str(x.get("msg", ""))
        if not msg.startswith("snapshot transfer"):
            continue
        if " started" in msg and begin is None:
            begin = unix_s(str(x["ts"]))
        elif " complete" in msg:
            end = unix_s(str(x["ts"]))
            digits = [int(w) for w in msg.replace(",", " ").split() if w.isdigit()]
            ins.transfer_bytes = max(digits, default=None)
    if begin is not None and end is not None:
        ins.transfer_s = end - begin
        if ins.caught_up_s is not None:
            ins.after_transfer_s = restart_unix + ins.caught_up_s - end


async def current_leader(cluster: Cluster, nodes: Sequence[int]) -> tuple[int, dict[str, Any]]:
    """The leader the live `nodes` report, and its own status (leadership may have moved since
    the start: a node whose loop stalls on a large snapshot can lose it)."""
    deadline = time.monotonic() + CATCH_UP_WAIT_S
    while time.monotonic() < deadline:
        for node_id in nodes:
            st = await cluster.status(node_id)
            leader = int(st["leader"]) if st else 0
            if leader and leader in nodes:
                own = await cluster.status(leader)
                if own and own.get("role") == "leader":
                    return leader, own
        await asyncio.sleep(POLL_S)
    raise RequestFailedError(f"no leader among nodes {list(nodes)} within {CATCH_UP_WAIT_S} s")


async def install(cluster: Cluster, params: Params, r: Results) -> None:
    """(f) stop a follower, compact past it on the leader, restart it, time the install."""
    from metastore.client import MetastoreClient

    ins = r.install
    ins.wait_bound_s = params.install_wait_s
    leader = await cluster.wait_ready(CLUSTER_START_WAIT_S)
    victim = min(n for n in NODE_IDS if n != leader)
    ins.victim = victim
    await wait_caught_up(cluster, leader, [n for n in NODE_IDS if n != leader])
    ins.victim_applied_at_kill = int((await status_of(cluster, victim))["applied_index"])
    kill_node(cluster, victim)
    progress(
        f"(f) node {victim} SIGKILLed at applied index {ins.victim_applied_at_kill}; "
        "1-file commits until the leader has compacted past it"
    )
    live = [n for n in NODE_IDS if n != victim]
    deadline = time.monotonic() + COMPACT_WAIT_S
    async with MetastoreClient(
        [endpoint(cluster, n) for n in live],
        cluster.token("writer"),
        timeout_ms=CLIENT_CALL_TIMEOUT_MS,
        client_name="bench-scale",
    ) as client:
        while True:
            leader, st = await current_leader(cluster, live)
            # The leader's log starts here (its snapshot minus the SNAPSHOT_KEEP entries it
            # keeps). The appends it sent the dead victim before pausing (up to its inflight
            # window) wait in the peer link and are delivered on reconnect, so the victim
            # needs the whole state only once the log starts beyond those too.
            ins.leader_log_start = int(st["log_start_index"])
            if ins.leader_log_start > ins.victim_applied_at_kill + QUEUED_APPENDS_MAX:
                break
            if ins.side_commits >= SIDE_COMMITS_MAX or time.monotonic() > deadline:
                raise RequestFailedError(
                    f"the leader did not compact past index {ins.victim_applied_at_kill} after "
                    f"{ins.side_commits} commits (its log starts at {ins.leader_log_start})"
                )
            for _ in range(SIDE_COMMITS_PER_LOOK):
                batch = ins.side_commits
                add = [{"path": f"side/{batch:06d}.parquet", "size_bytes": 1, "row_count": 1}]
                writes = [{"table": SIDE_TABLE, "schema_version": 1, "add": add}]
                await commit_once(client, f"bench-scale-side-{batch}", writes, r)
                ins.side_commits += 1
    ins.leader = leader
    leader_snaps = snapshots_taken(node_records(cluster, leader), leader)
    if leader_snaps:
        ins.leader_snapshot_index = int(leader_snaps[-1]["index"])
        ins.leader_snapshot_bytes = int(leader_snaps[-1]["bytes"])
    ins.leader_commit_at_restart = int((await status_of(cluster, leader))["commit_index"])
    offsets = {n: log_size(cluster, n) for n in NODE_IDS}
    progress(
        f"    leader {leader}: log from {ins.leader_log_start}, snapshot at "
        f"{value(ins.leader_snapshot_index, 'd')} ({value(ins.leader_snapshot_bytes, ',.0f')} B) "
        f"after {ins.side_commits} commits; restarting node {victim}"
    )
    restart_unix = time.time()
    t0 = time.perf_counter()
    cluster.start(victim)
    deadline = time.monotonic() + params.install_wait_s
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        last = await cluster.status(victim)
        elapsed = time.perf_counter() - t0
        if last is not None and ins.answers_s is None:
            ins.answers_s = elapsed
        if last is not None:
            log_start = last["log_start_index"]
            seen = [round(elapsed, 2), last["applied_index"], log_start, last["ready"]]
            if len(ins.statuses) < STATUSES_KEPT and (
                not ins.statuses or ins.statuses[-1][1:] != seen[1:]
            ):
                ins.statuses.append(seen)
        if last is not None and received_snapshot(last, ins.victim_applied_at_kill):
            ins.by_snapshot = True
        if last and last.get("ready"):
            if ins.ready_s is None:
                ins.ready_s = elapsed
            if int(last["applied_index"]) >= ins.leader_commit_at_restart:
                ins.caught_up_s = elapsed
                break
        await asyncio.sleep(POLL_S)
    if ins.caught_up_s is not None and ins.by_snapshot is None:
        # The status polls may miss the restore: look for a snapshot file the node did not
        # take itself (the WAL keeps its newest two).
        own = {int(x["index"]) for x in snapshots_taken(node_records(cluster, victim), victim)}
        received = snapshot_files(cluster, victim) - own
        # Its own snapshots from queued appends stay below the leader's log start.
        ins.by_snapshot = any(i >= (ins.leader_log_start or 0) for i in received)
    for node_id in NODE_IDS:
        mem = rss(cluster.pid(node_id))
        r.rss_after_install_mb[str(node_id)] = mem.get("VmRSS", 0) / 1e6
        r.peak_rss_after_install_mb[str(node_id)] = mem.get("VmHWM", 0) / 1e6
    breakdown(node_records(cluster, victim, offsets[victim]), restart_unix, ins)
    if ins.caught_up_s is None:
        ins.reason = failure_reason(
            {n: node_records(cluster, n, offsets[n]) for n in (leader, victim)}
        )
        progress(
            f"    not installed within {params.install_wait_s:g} s (last status {last}); "
            f"{ins.reason}"
        )
        return
    progress(
        f"    node {victim} answers in {ins.answers_s:.2f} s, ready in {ins.ready_s:.2f} s, "
        f"caught up in {ins.caught_up_s:.2f} s (by snapshot: {ins.by_snapshot})"
    )
    conn = await cluster.connect(victim, "reader")
    try:
        listing = await ok(conn, "files", timeout_s=60.0, table=TABLE, limit=1)
        # Loose files plus the live entries of its manifests (the bench removes nothing, so
        # every manifest entry is live), from the node's own state without expanding.
        ins.victim_total_files = int(listing["total_files"]) + sum(
            int(m.get("live_count") or 0) for m in listing.get("manifests") or []
        )
    finally:
        conn.close()


async def measure_all(cluster: Cluster, params: Params, r: Results) -> None:
    from metastore.errors import MetastoreError

    try:
        await _measure_all(cluster, params, r)
    except (BenchError, MetastoreError, TimeoutError) as exc:
        raise RequestFailedError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        for node_id in NODE_IDS:
            records = node_records(cluster, node_id)
            r.snapshots.extend(snapshots_taken(records, node_id))
            r.clock_fences += sum(
                1 for x in records if str(x.get("msg", "")).startswith("clock fence:")
            )


async def _measure_all(cluster: Cluster, params: Params, r: Results) -> None:
    await cluster.start_all(CLUSTER_START_WAIT_S)
    leader = await cluster.wait_ready(CLUSTER_START_WAIT_S)
    followers = [n for n in NODE_IDS if n != leader]
    export_node = followers[-1]
    admin = await cluster.connect(leader, "admin")
    try:
        await ok(admin, "ddl", sql=f"CREATE NAMESPACE IF NOT EXISTS {NAMESPACE}", request_id="ns")
        for name in (TABLE, SIDE_TABLE):
            sql = f"CREATE TABLE {name} (id BIGINT, payload STRING)"
            await ok(admin, "ddl", sql=sql, request_id=name)
    finally:
        admin.close()
    progress(
        f"(a)-(c) {params.files:,} files in commits of {params.batch_files:,} to node {leader} "
        f"(exports on node {export_node})"
    )
    r.term_at_start = int((await status_of(cluster, leader))["term"])
    r.commit_samples = await grow(cluster, leader, export_node, params, r)
    r.term_after_growth = max(
        int(st["term"]) for st in [await cluster.status(n) for n in NODE_IDS] if st is not None
    )
    await list_and_plan(cluster, export_node, params, r)
    await install(cluster, params, r)
    r.term_at_end = max(
        int(st["term"]) for st in [await cluster.status(n) for n in NODE_IDS] if st is not None
    )


def summarize(params: Params, r: Results) -> None:
    """Windows, snapshot counts and overall stats from the raw samples."""
    samples = r.commit_samples
    r.commit_ms = stats([s[1] for s in samples])
    r.snapshots_logged = len(r.snapshots)
    r.snapshot_bytes_max = max((int(s["bytes"]) for s in r.snapshots), default=None)
    spans = [snapshot_span(s) for s in r.snapshots]
    for cp in r.checkpoints:
        if len(samples) < params.window_commits + 1:
            continue
        first = window_start(cp.files, params.batch_files, len(samples), params.window_commits)
        window = samples[first : first + params.window_commits]
        cp.window_files = (int(window[0][0]), int(window[-1][0]))
        cp.commit_ms = stats([s[1] for s in window])
        near = [x for x in spans if overlaps(window[0][2], window[-1][3], [x])]
        cp.snapshots_in_window = len(near)
        cp.commit_ms_without_snapshots = stats(
            [s[1] for s in window if not overlaps(s[2], s[3], near)]
        )


def targets(params: Params, r: Results) -> dict[str, dict[str, Any]]:
    cps = [cp for cp in r.checkpoints if cp.commit_ms]
    first, last = (cps[0], cps[-1]) if len(cps) >= 2 else (None, None)

    def ratio(key: str) -> float | None:
        if first is None or last is None:
            return None
        return max(cp.commit_ms[key] for cp in cps[1:]) / first.commit_ms[key]

    p50_ratio, p99_ratio = ratio("p50"), ratio("p99")
    # Judged on the peak (VmHWM): snapshots and installs hold extra copies of the state for a
    # moment, and that moment counts as much as the RSS at a checkpoint.
    peaks = [v for cp in r.checkpoints for v in (*cp.rss_mb.values(), *cp.peak_rss_mb.values())]
    peaks += [*r.rss_after_install_mb.values(), *r.peak_rss_after_install_mb.values()]
    rss_max = max(peaks, default=None)
    full = r.files_listed == 1_000_000
    ins = r.install
    return {
        "commit_p50_flat": {
            "target": f"commit p50 flat within {TARGET_FLAT_FACTOR}x from 10k to 1M files",
            "value": p50_ratio,
            "met": None if p50_ratio is None else p50_ratio <= TARGET_FLAT_FACTOR,
        },
        "commit_p99_flat": {
            "target": f"commit p99 flat within {TARGET_FLAT_FACTOR}x from 10k to 1M files",
            "value": p99_ratio,
            "met": None if p99_ratio is None else p99_ratio <= TARGET_FLAT_FACTOR,
        },
        "files_listing": {
            "target": f"files of 1M through the client <= {TARGET_FILES_S:g} s",
            "value": r.files_s,
            # Judged at 1M only: a shorter table says nothing about the target.
            "met": None if r.files_s is None or not full else r.files_s <= TARGET_FILES_S,
        },
        "rss": {
            "target": "every node's RSS <= 1 GB (its peak, VmHWM)",
            "value": rss_max,
            "met": None if rss_max is None else rss_max * 1e6 <= TARGET_RSS_BYTES,
        },
        "install": {
            "target": f"snapshot install on a restarted follower <= {TARGET_INSTALL_S:g} s",
            "value": ins.caught_up_s,
            # A follower that caught up from entries installed nothing: no verdict.
            "met": None
            if ins.victim_applied_at_kill is None or ins.by_snapshot is False
            else (ins.caught_up_s is not None and ins.caught_up_s <= TARGET_INSTALL_S),
        },
        "listing_complete": {
            "target": "every committed file listed, by files and by the plan",
            "value": r.files_listed,
            "met": None
            if r.files_listed is None
            else r.files_listed == r.files_committed == r.plan_files,
        },
    }


def render(params: Params, r: Results, verdicts: dict[str, dict[str, Any]]) -> Table:
    t = measure_table(
        f"one table to {r.files_committed:,} files in commits of {params.batch_files:,} "
        "(3 nodes, fsync on, DD = CSmax = 500 ms)"
    )

    def mark(key: str) -> str:
        return verdict(verdicts, key)

    if params.loose_files_max:
        took = stats([c[1] for c in r.compactions])
        manifests = int(r.compactions[-1][3]) if r.compactions else 0
        t.add_row(
            f"compactions past {params.loose_files_max:,} loose entries: count, p50 / max s, "
            "manifests at the end",
            f"{len(r.compactions)}, {value(took.get('p50'), '.2f')} / "
            f"{value(took.get('max'), '.2f')}, {manifests}",
            "",
        )
    else:
        t.add_row("compactions", "off (--loose-files-max 0): every entry in the state", "")
    for cp in r.checkpoints:
        lo, hi = cp.window_files
        t.add_row(
            f"commit p50 / p99 / max ms, {len(range(lo, hi + 1, params.batch_files))} commits "
            f"{lo // 1000:,}k-{hi // 1000:,}k files",
            f"{value(cp.commit_ms.get('p50'))} / {value(cp.commit_ms.get('p99'))} / "
            f"{value(cp.commit_ms.get('max'))}",
            "",
        )
        t.add_row(
            f"  same without the {cp.snapshots_in_window} node snapshot(s) in the window",
            f"{value(cp.commit_ms_without_snapshots.get('p50'))} / "
            f"{value(cp.commit_ms_without_snapshots.get('p99'))}",
            "",
        )
    t.add_row(
        "commit p50 ratio, worst later window / first",
        value(verdicts["commit_p50_flat"]["value"], ".2f"),
        mark("commit_p50_flat"),
    )
    t.add_row(
        "commit p99 ratio, worst later window / first",
        value(verdicts["commit_p99_flat"]["value"], ".2f"),
        mark("commit_p99_flat"),
    )
    t.add_row(
        "all commits p50 / p99 / max ms",
        f"{value(r.commit_ms.get('p50'))} / {value(r.commit_ms.get('p99'))} / "
        f"{value(r.commit_ms.get('max'))}",
        "",
    )
    for cp in r.checkpoints:
        t.add_row(
            f"RSS (peak) MB at {cp.files:,} files, nodes {'/'.join(cp.rss_mb)}",
            " / ".join(f"{cp.rss_mb[k]:,.0f} ({cp.peak_rss_mb[k]:,.0f})" for k in cp.rss_mb),
            "",
        )
    if r.rss_after_install_mb:
        t.add_row(
            "RSS (peak) MB after the install (or its wait), nodes "
            + "/".join(r.rss_after_install_mb),
            " / ".join(
                f"{v:,.0f} ({r.peak_rss_after_install_mb[k]:,.0f})"
                for k, v in r.rss_after_install_mb.items()
            ),
            "",
        )
    for cp in r.checkpoints:
        t.add_row(
            f"snapshot_begin at {cp.files:,} files (node {cp.export_node}): bytes, take s",
            f"{value(cp.export_bytes, ',.0f')}, {value(cp.export_take_s, '.2f')}",
            "",
        )
    t.add_row(
        "peak RSS of any node, MB",
        value(verdicts["rss"]["value"], ",.0f"),
        mark("rss"),
    )
    t.add_row(
        "node snapshots logged; largest bytes",
        f"{r.snapshots_logged}; {value(r.snapshot_bytes_max, ',.0f')}",
        "",
    )
    t.add_row(
        f"files, all {value(r.files_listed, ',.0f')} through the client (node {r.listing_node}), s",
        value(r.files_s, ".2f"),
        mark("files_listing"),
    )
    t.add_row("  one page's fixed cost (limit=1), ms", value(r.files_page_fixed_ms, ",.0f"), "")
    t.add_row(
        "plan: pin ms (of which waited) + files s + paths s = total s",
        f"{value(r.plan_pin_ms)} ({value(r.plan_pin_waited_ms)}) + "
        f"{value(r.plan_files_s, '.2f')} + {value(r.plan_paths_s, '.2f')} = "
        f"{value(r.plan_total_s, '.2f')}",
        "",
    )
    ins = r.install
    installed = (
        f"n/a: not installed within {ins.wait_bound_s:g} s"
        if ins.caught_up_s is None
        else f"{ins.caught_up_s:.2f}"
    )
    t.add_row(
        f"install on node {ins.victim}: leader snapshot {value(ins.leader_snapshot_bytes, ',.0f')}"
        f" B after {ins.side_commits} commits, s",
        installed,
        mark("install"),
    )
    t.add_row(
        "  restarted node answers / ready / caught up s; by snapshot",
        f"{value(ins.answers_s, '.2f')} / {value(ins.ready_s, '.2f')} / "
        f"{value(ins.caught_up_s, '.2f')}; {'n/a' if ins.by_snapshot is None else ins.by_snapshot}",
        "",
    )
    t.add_row(
        "  start + WAL recovery / transfer / restore + catch-up s",
        f"{value(ins.recovery_s, '.2f')} / {value(ins.transfer_s, '.2f')} / "
        f"{value(ins.after_transfer_s, '.2f')}",
        "",
    )
    if ins.victim_total_files is not None:
        t.add_row("  files on the restarted node", f"{ins.victim_total_files:,}", "")
    t.add_row(
        "raft term at start -> after growth -> end; clock fences logged",
        f"{r.term_at_start} -> {r.term_after_growth} -> {r.term_at_end}; {r.clock_fences}",
        "",
    )
    t.add_row("files listed = committed = planned", str(r.files_listed), mark("listing_complete"))
    t.add_row(
        "run duration s (growth s)",
        f"{value(r.duration_s, ',.0f')} ({value(r.growth_s, ',.0f')})",
        "",
    )
    if ins.reason:
        t.caption = f"install: {ins.reason}"
    return t


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="100k files instead of 1M")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--loose-files-max",
        type=int,
        default=LOOSE_FILES_MAX_DEFAULT,
        help="compact the table into manifests past this many loose entries, as the bridge "
        "does (default: the cluster default); 0 keeps every file entry in the state",
    )
    args = parser.parse_args(argv)
    params = Params.for_mode(quick=args.quick, loose_files_max=args.loose_files_max)
    started = datetime.now(UTC)
    r = Results(loadavg_at_start=list(os.getloadavg()))
    progress(f"load average before the run: {r.loadavg_at_start}")
    t0 = time.perf_counter()
    try:
        with sigterm_as_interrupt():
            error = run_on_cluster(
                "scale", lambda cluster: measure_all(cluster, params, r), settings=dict(SETTINGS)
            )
    except KeyboardInterrupt:
        progress("interrupted; the nodes were stopped")
        return 130
    r.duration_s = time.perf_counter() - t0
    summarize(params, r)
    verdicts = targets(params, r)
    return publish(
        name="scale",
        argv=argv,
        started=started,
        params=params,
        results=r,
        verdicts=verdicts,
        table=render(params, r, verdicts),
        error=error,
        results_dir=args.results_dir,
        cluster_extra=dict(SETTINGS),
    )


if __name__ == "__main__":
    sys.exit(main())
