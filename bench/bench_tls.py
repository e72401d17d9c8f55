"""What TLS costs: commit latency and connection setup with and without TLS (`make bench-tls`).

Usage: `python -m bench.bench_tls [--commits N] [--rounds R] [--connects M] [--results-dir DIR]`.

Key idea: two 3-node clusters of real `python -m metastore.daemon` processes on loopback, fsync
on, identical but for a `[tls]` table in one of them (mutual TLS between peers, TLS on the
client port, dev certificates from `metastore.daemon.certs`). Both run at the same time and the
measurements alternate between them in rounds (plain, TLS, plain, TLS, ...), so whatever else
the machine does at a given moment lands on both sides alike. Driven through the product client
(metastore.client), since its TLS handshake is part of what a user pays:

(a) commit via the leader: one 1-file commit at a time on a connection already open;
(b) commit via a follower: the same, sent to a follower, which forwards it to the leader over
    its own (TLS) client connection: one more TLS hop on the path;
(c) connect: a new client's first request (TCP connect, TLS handshake, hello, `status`);
(d) node CPU per commit: the CPU time (user + system) the three node processes used during
    (a) and (b), divided by the commits made: encryption shows up here even where latency
    hides it behind fsync.

Results: p50 / p99 / mean per case and the TLS / plain ratio of the p50, a table on stdout and
JSON in bench/results/tls-<UTC>.json. Every wait has a deadline; nodes are started by us and
stopped by their PIDs in a `finally`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from bench.bench_catalog import (
    HOST,
    NODE_IDS,
    REPO_ROOT,
    Cluster,
    new_event_loop,
    percentile,
    progress,
)
from bench.machine import machine_info
from metastore.client import MetastoreClient
from metastore.daemon.certs import generate_dev_certs
from raft.tls import ClientTls

READY_TIMEOUT_S: Final = 60.0
CALL_TIMEOUT_MS: Final = 20_000
POLL_INTERVAL_S: Final = 0.1
TABLE: Final = "bench.t"
DEFAULT_COMMITS: Final = 100
DEFAULT_ROUNDS: Final = 4
DEFAULT_CONNECTS: Final = 20
# Commits before each round's measured ones: a fresh table, a cold path.
WARMUP_COMMITS: Final = 10
CASES: Final = ("commit_via_leader", "commit_via_follower", "connect")


@dataclass(slots=True, kw_only=True)
class Results:
    params: dict[str, int]
    started: str
    finished: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    samples_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    summary: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # Per side: CPU seconds of the three nodes during the commit cases, and the commits made.
    node_cpu_s: dict[str, float] = field(default_factory=dict)
    commits_made: dict[str, int] = field(default_factory=dict)


def cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (fields 14 and 15 of its stat line)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def nodes_cpu_s(cluster: Cluster) -> float:
    return sum(cpu_s(cluster.pid(n)) for n in NODE_IDS)


def endpoint(cluster: Cluster, node_id: int) -> str:
    return f"{HOST}:{cluster.client_ports[node_id]}"


async def wait_ready(cluster: Cluster, tls: ClientTls | None) -> int:
    """Until every node is ready and initialized (InitCluster applied: DDL would be refused
    before) and they agree on a leader; returns the leader's id."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last: list[Any] = []
    async with MetastoreClient(
        [endpoint(cluster, n) for n in NODE_IDS],
        cluster.token("admin"),
        timeout_ms=2_000,
        tls=tls,
        client_name="bench-tls",
    ) as client:
        while time.monotonic() < deadline:
            cluster.check_alive()
            last = await client.status_all()
            ready = [
                r.result
                for r in last
                if r.result is not None and r.result.get("ready") and r.result.get("initialized")
            ]
            leaders = {s.get("leader") for s in ready}
            if len(ready) == len(NODE_IDS) and len(leaders) == 1 and 0 not in leaders:
                return int(leaders.pop())  # type: ignore[arg-type]
            await asyncio.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"cluster in {cluster.workdir} not ready: {last}")


async def commits(client: MetastoreClient, count: int, tag: str) -> list[float]:
    latencies: list[float] = []
    for i in range(count):
        add = [{"path": f"{tag}/part-{i:05d}.parquet", "size_bytes": 1000, "row_count": 10}]
        t0 = time.perf_counter()
        await client.commit(f"{tag}-{i}", [{"table": TABLE, "schema_version": 1, "add": add}])
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies


async def connects(
    cluster: Cluster, node_id: int, tls: ClientTls | None, count: int
) -> list[float]:
    latencies: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        async with MetastoreClient(
            [endpoint(cluster, node_id)], cluster.token("writer"), tls=tls, client_name="bench"
        ) as client:
            await client.status()
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies


async def measure(args: argparse.Namespace, workdir: Path, r: Results) -> None:
    certs = generate_dev_certs(workdir / "certs", node_ids=list(NODE_IDS))
    sides: dict[str, tuple[Cluster, ClientTls | None]] = {}
    for name in ("plain", "tls"):
        (workdir / name).mkdir()
        cluster = Cluster(workdir / name)
        tls = None
        if name == "tls":
            tls = ClientTls(ca_file=certs.ca_cert)
            with cluster.config.open("a") as f:
                f.write(
                    "\n[tls]\n"
                    f'ca_file = "{certs.ca_cert}"\n'
                    f'cert_file = "{certs.ca_cert.parent}/node-{{node_id}}.crt"\n'
                    f'key_file = "{certs.ca_cert.parent}/node-{{node_id}}.key"\n'
                )
        sides[name] = (cluster, tls)
    try:
        for cluster, _ in sides.values():
            await cluster.start_all(READY_TIMEOUT_S)
        leaders = {}
        for name, (cluster, tls) in sides.items():
            leaders[name] = await wait_ready(cluster, tls)
            async with MetastoreClient(
                [endpoint(cluster, n) for n in NODE_IDS],
                cluster.token("admin"),
                timeout_ms=CALL_TIMEOUT_MS,
                tls=tls,
            ) as admin:
                await admin.ddl("CREATE NAMESPACE bench")
                await admin.ddl(f"CREATE TABLE {TABLE} (id BIGINT)")
            progress(f"{name}: cluster ready, leader {leaders[name]}")
        r.samples_ms = {name: {case: [] for case in CASES} for name in sides}
        r.node_cpu_s = dict.fromkeys(sides, 0.0)
        r.commits_made = dict.fromkeys(sides, 0)
        for round_no in range(args.rounds):
            for name, (cluster, tls) in sides.items():
                leader = leaders[name]
                follower = next(n for n in NODE_IDS if n != leader)
                for case, node_id in (
                    ("commit_via_leader", leader),
                    ("commit_via_follower", follower),
                ):
                    async with MetastoreClient(
                        [endpoint(cluster, node_id)],
                        cluster.token("writer"),
                        timeout_ms=CALL_TIMEOUT_MS,
                        tls=tls,
                        client_name="bench-tls",
                    ) as client:
                        tag = f"r{round_no}-{case}-{uuid.uuid4().hex[:8]}"
                        await commits(client, WARMUP_COMMITS, f"warm-{tag}")
                        cpu_before = nodes_cpu_s(cluster)
                        r.samples_ms[name][case] += await commits(client, args.commits, tag)
                        r.node_cpu_s[name] += nodes_cpu_s(cluster) - cpu_before
                        r.commits_made[name] += args.commits
                r.samples_ms[name]["connect"] += await connects(
                    cluster, follower, tls, args.connects
                )
            progress(f"round {round_no + 1}/{args.rounds} done")
    finally:
        for cluster, _ in sides.values():
            cluster.stop_all()
    for name, cases in r.samples_ms.items():
        r.summary[name] = {
            case: {
                "p50": percentile(v, 0.50),
                "p99": percentile(v, 0.99),
                "mean": statistics.fmean(v),
                "n": float(len(v)),
            }
            for case, v in cases.items()
        }


def table(r: Results) -> Table:
    t = Table(title="TLS cost (ms): same machine, both clusters up, rounds interleaved")
    for column in ("case", "plain p50", "TLS p50", "TLS/plain p50", "plain p99", "TLS p99", "n"):
        t.add_column(column, justify="left" if column == "case" else "right")
    for case in CASES:
        plain, tls = r.summary["plain"][case], r.summary["tls"][case]
        t.add_row(
            case,
            f"{plain['p50']:.2f}",
            f"{tls['p50']:.2f}",
            f"{tls['p50'] / plain['p50']:.2f}x",
            f"{plain['p99']:.2f}",
            f"{tls['p99']:.2f}",
            str(int(tls["n"])),
        )
    plain_cpu, tls_cpu = (r.node_cpu_s[s] / r.commits_made[s] * 1000 for s in ("plain", "tls"))
    t.add_row(
        "node CPU ms / commit (3 nodes)",
        f"{plain_cpu:.2f}",
        f"{tls_cpu:.2f}",
        f"{tls_cpu / plain_cpu:.2f}x",
        "",
        "",
        str(r.commits_made["tls"]),
    )
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_tls", description=__doc__)
    ap.add_argument("--commits", type=int, default=DEFAULT_COMMITS, help="per case per round")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    ap.add_argument("--connects", type=int, default=DEFAULT_CONNECTS, help="per round")
    ap.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    r = Results(
        params={"commits": args.commits, "rounds": args.rounds, "connects": args.connects},
        started=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        loop = new_event_loop()
        try:
            loop.run_until_complete(measure(args, Path(tmp), r))
        finally:
            loop.close()
    r.finished = datetime.now(UTC).isoformat(timespec="seconds")
    r.machine = machine_info()
    Console(width=120).print(table(r))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"tls-{r.started.replace(':', '')}.json"
    out.write_text(json.dumps(asdict(r), indent=1))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
