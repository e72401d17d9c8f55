"""The lease section of `make bench-catalog`: what sessions and schema leases cost.

    python -m bench.bench_leases [--quick]

A real 3-node cluster (daemon processes on loopback, fsync on, DD = CSmax = 500 ms, as in
bench.bench_catalog), driven through the client protocol only:

(a) lease churn: LEASE_CONNECTIONS connections to the leader, each its own session, each running
    LEASE_PIPELINE acquire -> release pairs back to back on one table's current version (every
    acquire and release is a Raft entry, fsynced on a quorum). Reported: pairs/s for the cluster
    (target >= 5,000/s) and the p50/p99 of one acquire and one release.
(b) heartbeats: HEARTBEAT_SESSIONS sessions, each heartbeating every HEARTBEAT_MS (the product
    default 5 s, so 200 heartbeats/s with 1000 sessions): heartbeat p50/p99 and the leader's CPU
    during the window next to an idle window of the same length (the cost of keeping them alive).
(c) DDL with non-blocking leases held: sessions hold leases on the table's latest version (they
    never block the next ALTER); each ALTER's round trip against its floor DD + CSmax (target:
    <= (DD + CSmax) x 1.05 + 20 ms, the same as DDL without leases in bench.bench_catalog).

Nothing is compared with pysyncobj here: it has no leases. The price we pay that a plain
in-memory lease table would not: every acquire, release and heartbeat is a replicated, fsynced
log entry, and expiry is decided by entry timestamps, so every replica agrees.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from bench.bench_catalog import (
    DDL_FLOOR_MS,
    NODE_IDS,
    RESULTS_DIR,
    TARGET_DDL_MS_MAX,
    Cluster,
    Connection,
    HostUsage,
    RequestFailedError,
    host_sample,
    progress,
)
from bench.section import measure_table, ok, publish, run_on_cluster, stats, value, verdict

TABLE: Final = "bench.leased"
TARGET_LEASE_PAIRS_PER_S_MIN: Final = 5_000.0
LEASE_CONNECTIONS: Final = 16
LEASE_PIPELINE: Final = 16  # concurrent acquire/release loops per connection
HEARTBEAT_MS: Final = 5_000
SESSION_TTL_MS: Final = 40_000
CLUSTER_START_WAIT_S: Final = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    quick: bool
    lease_seconds: float
    heartbeat_sessions: int
    heartbeat_seconds: float
    ddl_count: int

    @classmethod
    def for_mode(cls, *, quick: bool) -> Params:
        return cls(
            quick=quick,
            lease_seconds=3.0 if quick else 10.0,
            heartbeat_sessions=200 if quick else 1000,
            heartbeat_seconds=5.0 if quick else 15.0,
            ddl_count=3 if quick else 10,
        )


@dataclass(slots=True)
class Results:
    lease_pairs_per_s: float | None = None
    acquire_ms: dict[str, float] = field(default_factory=dict)
    release_ms: dict[str, float] = field(default_factory=dict)
    lease_errors: int = 0
    # Who used the CPUs during (a): machine, leader, this client, the rest (cores).
    lease_window_usage: dict[str, float] = field(default_factory=dict)
    heartbeat_sessions: int = 0
    heartbeats_per_s: float | None = None
    heartbeat_ms: dict[str, float] = field(default_factory=dict)
    leader_cpu_idle_cores: float | None = None
    leader_cpu_heartbeats_cores: float | None = None
    ddl_ms: list[float] = field(default_factory=list)
    ddl_floor_ms: float = float(DDL_FLOOR_MS)


async def _open_session(conn: Connection, n: int, ttl_ms: int = SESSION_TTL_MS) -> str:
    session_id = uuid.uuid4().hex
    await ok(
        conn,
        "session_open",
        session_id=session_id,
        app_id=f"bench-{n}",
        app_name="bench-leases",
        host="localhost",
        user="bench",
        pid=os.getpid(),
        ttl_ms=ttl_ms,
    )
    return session_id


async def lease_churn(cluster: Cluster, leader: int, seconds: float, r: Results) -> None:
    conns = [await cluster.connect(leader, "writer") for _ in range(LEASE_CONNECTIONS)]
    admin = conns[0]
    pinned = await ok(admin, "pin", tables=[TABLE], ts=_now_hlc())
    key = {"table": TABLE, "table_id": pinned["pins"][0]["table_id"]}
    key["version"] = pinned["pins"][0]["version"]
    sessions = [await _open_session(c, i) for i, c in enumerate(conns)]
    acquire_ms: list[float] = []
    release_ms: list[float] = []
    pairs = 0
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def loop(conn: Connection, session_id: str) -> None:
        nonlocal pairs, errors
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            a = await conn.call("lease_acquire", session_id=session_id, leases=[key])
            t1 = time.perf_counter()
            b = await conn.call("lease_release", session_id=session_id, leases=[key])
            t2 = time.perf_counter()
            if a.get("ok") and b.get("ok"):
                pairs += 1
                acquire_ms.append((t1 - t0) * 1000)
                release_ms.append((t2 - t1) * 1000)
            else:
                errors += 1

    # LEASE_PIPELINE loops per session share one lease key: acquire is idempotent and release
    # of what another loop released is a no-op, so each pair is still two log entries.
    started = time.perf_counter()
    before = host_sample(cluster.pid(leader))
    await asyncio.gather(
        *(loop(c, s) for c, s in zip(conns, sessions, strict=True) for _ in range(LEASE_PIPELINE))
    )
    elapsed = time.perf_counter() - started
    r.lease_window_usage = asdict(HostUsage.between(before, host_sample(cluster.pid(leader))))
    r.lease_pairs_per_s = pairs / elapsed
    r.acquire_ms = stats(acquire_ms)
    r.release_ms = stats(release_ms)
    r.lease_errors = errors
    for c, s in zip(conns, sessions, strict=True):
        await ok(c, "session_close", session_id=s)
        c.close()


async def heartbeats(
    cluster: Cluster, leader: int, sessions: int, seconds: float, r: Results
) -> None:
    conns = [await cluster.connect(leader, "writer") for _ in range(LEASE_CONNECTIONS)]
    ids = [await _open_session(conns[i % len(conns)], i) for i in range(sessions)]
    pid = cluster.pid(leader)
    idle_before = host_sample(pid)
    await asyncio.sleep(seconds)
    idle = HostUsage.between(idle_before, host_sample(pid))
    latencies: list[float] = []
    period_s = HEARTBEAT_MS / 1000

    async def beat(i: int, session_id: str) -> None:
        conn = conns[i % len(conns)]
        next_at = time.perf_counter() + period_s * i / sessions  # spread them evenly
        while next_at < stop_at:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            t0 = time.perf_counter()
            reply = await conn.call("session_heartbeat", session_id=session_id)
            if not reply.get("ok"):
                raise RequestFailedError(f"heartbeat: {reply.get('error')}")
            latencies.append((time.perf_counter() - t0) * 1000)
            next_at += period_s

    before = host_sample(pid)
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(beat(i, s) for i, s in enumerate(ids)))
    busy = HostUsage.between(before, host_sample(pid))
    r.heartbeat_sessions = sessions
    r.heartbeats_per_s = len(latencies) / busy.window_s
    r.heartbeat_ms = stats(latencies)
    r.leader_cpu_idle_cores = idle.node_cpu_cores
    r.leader_cpu_heartbeats_cores = busy.node_cpu_cores
    for i, s in enumerate(ids):
        await ok(conns[i % len(conns)], "session_close", session_id=s)
    for c in conns:
        c.close()


async def ddl_with_leases(cluster: Cluster, leader: int, count: int, r: Results) -> None:
    follower = next(n for n in NODE_IDS if n != leader)
    admin = await cluster.connect(follower, "admin")
    holders = [await cluster.connect(leader, "writer") for _ in range(4)]
    sessions = [await _open_session(c, i) for i, c in enumerate(holders)]
    held: list[dict[str, Any]] = []
    for i in range(count):
        # Every holder runs a "batch" at the latest version, as the bridge does: pin + lease,
        # then drop the previous batch's lease. What is held never blocks the next ALTER.
        for c, s in zip(holders, sessions, strict=True):
            pin = (await ok(c, "pin", tables=[TABLE], ts=_now_hlc(), session_id=s))["pins"][0]
            key = {"table": TABLE, "table_id": pin["table_id"], "version": pin["version"]}
            stale = [k for k in held if k["version"] != key["version"]]
            if stale:
                await ok(c, "lease_release", session_id=s, leases=stale)
        held = [key]
        t0 = time.perf_counter()
        await ok(
            admin,
            "ddl",
            timeout_s=15.0,
            sql=f"ALTER TABLE {TABLE} ADD COLUMN c{i} INT",
            request_id=uuid.uuid4().hex,
        )
        r.ddl_ms.append((time.perf_counter() - t0) * 1000)
    for c, s in zip(holders, sessions, strict=True):
        await ok(c, "session_close", session_id=s)
        c.close()
    admin.close()


def _now_hlc() -> int:
    return (time.time_ns() // 1_000_000) << 16


async def measure_all(cluster: Cluster, params: Params, r: Results) -> None:
    await cluster.start_all(CLUSTER_START_WAIT_S)
    leader = await cluster.wait_ready(CLUSTER_START_WAIT_S)
    admin = await cluster.connect(leader, "admin")
    await ok(admin, "ddl", sql="CREATE NAMESPACE IF NOT EXISTS bench", request_id="ns")
    await ok(admin, "ddl", sql=f"CREATE TABLE {TABLE} (id BIGINT)", request_id="t")
    admin.close()
    progress(f"(a) lease churn for {params.lease_seconds:g} s on node {leader} (the leader)")
    await lease_churn(cluster, leader, params.lease_seconds, r)
    progress(
        f"(b) {params.heartbeat_sessions} sessions heartbeating every {HEARTBEAT_MS} ms for "
        f"{params.heartbeat_seconds:g} s (after an idle window as long)"
    )
    await heartbeats(cluster, leader, params.heartbeat_sessions, params.heartbeat_seconds, r)
    progress(f"(c) {params.ddl_count} ALTERs through a follower with leases held on the latest")
    await ddl_with_leases(cluster, leader, params.ddl_count, r)


def targets(r: Results) -> dict[str, dict[str, Any]]:
    ddl_max = max(r.ddl_ms) if r.ddl_ms else None
    return {
        "lease_pairs_per_s": {
            "target": f">= {TARGET_LEASE_PAIRS_PER_S_MIN:,.0f} acquire+release pairs/s per cluster",
            "value": r.lease_pairs_per_s,
            "met": None
            if r.lease_pairs_per_s is None
            else r.lease_pairs_per_s >= TARGET_LEASE_PAIRS_PER_S_MIN,
        },
        "ddl_max_ms_with_leases": {
            "target": f"<= {TARGET_DDL_MS_MAX:g} ms ((DD + CSmax) x 1.05 + 20 ms)",
            "value": ddl_max,
            "met": None if ddl_max is None else ddl_max <= TARGET_DDL_MS_MAX,
        },
        "no_errors": {
            "target": "no refused acquire/release",
            "value": r.lease_errors,
            "met": r.lease_errors == 0,
        },
    }


def render(r: Results, verdicts: dict[str, dict[str, Any]]) -> Table:
    t = measure_table("sessions and schema leases (3 nodes, fsync on, DD = CSmax = 500 ms)")

    def mark(key: str) -> str:
        return verdict(verdicts, key)

    fmt = value

    t.add_row(
        "acquire+release pairs/s", fmt(r.lease_pairs_per_s, ",.0f"), mark("lease_pairs_per_s")
    )
    t.add_row(
        "acquire p50 / p99 ms",
        f"{fmt(r.acquire_ms.get('p50'))} / {fmt(r.acquire_ms.get('p99'))}",
        "",
    )
    t.add_row(
        "release p50 / p99 ms",
        f"{fmt(r.release_ms.get('p50'))} / {fmt(r.release_ms.get('p99'))}",
        "",
    )
    t.add_row("refused lease calls", str(r.lease_errors), mark("no_errors"))
    u = r.lease_window_usage
    if u:
        t.add_row(
            "during (a): machine / leader / client / others (cores)",
            f"{u['machine_busy_cores']:.2f} / {u['node_cpu_cores']:.2f} / "
            f"{u['client_cpu_cores']:.2f} / {u['others_cores']:.2f}",
            "2 cores in all",
        )
    t.add_row(f"heartbeats/s ({r.heartbeat_sessions} sessions)", fmt(r.heartbeats_per_s), "")
    t.add_row(
        "heartbeat p50 / p99 ms",
        f"{fmt(r.heartbeat_ms.get('p50'))} / {fmt(r.heartbeat_ms.get('p99'))}",
        "",
    )
    t.add_row(
        "leader CPU idle -> with heartbeats (cores)",
        f"{fmt(r.leader_cpu_idle_cores, '.3f')} -> {fmt(r.leader_cpu_heartbeats_cores, '.3f')}",
        "",
    )
    ddl = stats(r.ddl_ms)
    t.add_row(
        f"ALTER with leases held, p50 / max ms (floor {DDL_FLOOR_MS})",
        f"{fmt(ddl.get('p50'))} / {fmt(ddl.get('max'))}",
        mark("ddl_max_ms_with_leases"),
    )
    return t


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_leases", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="shorter windows, fewer sessions")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    params = Params.for_mode(quick=args.quick)
    started = datetime.now(UTC)
    r = Results()
    error = run_on_cluster("leases", lambda cluster: measure_all(cluster, params, r))
    verdicts = targets(r)
    return publish(
        name="leases",
        argv=argv,
        started=started,
        params=params,
        results=r,
        verdicts=verdicts,
        table=render(r, verdicts),
        error=error,
        results_dir=args.results_dir,
    )


if __name__ == "__main__":
    sys.exit(main())
