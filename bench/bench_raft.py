"""Benchmark: our Raft engine against pysyncobj, the same workload on both in the same run.

Usage: `python -m bench.bench_raft [--quick] [--engines ours,pysyncobj]` (`make bench-raft`).

Key idea: both engines run as three real node processes on loopback ports and are driven only
through the control protocol of `bench.control`, so nothing engine-specific leaks into what is
measured. Each engine runs in more than one configuration ("variant"), one after the other:

* `ours`: our engine as shipped, fsync on. Every target is judged on this one.
* `ours-nofsync`: our engine with `--no-fsync` (every WAL sync skipped; unsafe), so that the
  price of durability is visible next to it.
* `pysyncobj-batch`: pysyncobj with its default `appendEntriesUseBatch=True` (entries wait for
  the next heartbeat tick; fast in bulk, ~one tick of latency).
* `pysyncobj-nobatch`: pysyncobj with `appendEntriesUseBatch=False` (each entry sent at once).

Each metric of ours is compared with the *best* pysyncobj variant for that metric, and the table
and the JSON name that variant: a baseline is not judged by a configuration nobody would choose
for that metric. For each variant, in order:

(a) throughput: the leader runs `load` (N proposals of S bytes, K in flight), several times;
    we report the median proposals/s;
(b) latency: the leader runs `latency` (one proposal at a time); p50/p99 in ms, and (Linux) the
    CPU time the three nodes spent per proposal meanwhile, on-CPU and waiting for a CPU;
(c) failover: a client thread proposes continuously to whoever leads; we `kill -9` the leader
    and time kill -> first acknowledged proposal on another node, restart the victim, repeat;
(d) consistency: once idle, every node's `applied_digest` must agree (same count, same digest),
    and that count must cover every proposal the harness saw acknowledged (a lost acked write
    shows up here).

Results: two tables on stdout (every variant side by side; then ours against the best pysyncobj
variant per metric, ours against ours-nofsync, and the targets), a JSON file in `bench/results/`,
progress lines on stderr. Exit status 0 only if every requested variant was measured completely.

Invariants: every wait has a deadline; every child process is started in its own session (so a
Ctrl-C reaches only us) and is killed by PID in a `finally`, on errors and on Ctrl-C/SIGTERM alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console
from rich.table import Table

from bench.control import ControlClient, ControlError, run_timeout_s
from bench.machine import machine_info
from bench.procs import PROCESS_EXIT_WAIT_S, log_tail, sigterm_as_interrupt, stop_processes

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
NODE_IDS = (1, 2, 3)
ELECTION_TIMEOUT_MS = (300, 600)

# Targets for our engine (a benchmark, not a test: missing one is reported, not raised).
# The throughput ratio and the p50 ratio are taken against the best pysyncobj variant.
TARGET_THROUGHPUT_RATIO_MIN = 2.0
TARGET_P50_MS_MAX = 2.0
TARGET_P50_RATIO_MAX = 1.0
TARGET_FAILOVER_MEDIAN_S_MAX = 1.0

# Bounds on every wait (seconds).
STATUS_TIMEOUT_S = 1.0
PROBE_TIMEOUT_S = 0.25
PROPOSE_CLIENT_TIMEOUT_S = 3.0
CLUSTER_START_WAIT_S = 30.0
HEALTHY_WAIT_S = 30.0
FAILOVER_WAIT_S = 20.0
CONVERGE_WAIT_S = 20.0
IMPORT_CHECK_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05
# The failover client retries this often while there is no leader: it is the resolution of
# the failover measurement, so it must stay far below the 1 s target.
PROPOSER_RETRY_S = 0.005
# A load/latency run interrupted by a leader change is retried this many times in total.
RUN_ATTEMPTS_MAX = 3
TABLE_WIDTH_NON_TTY = 130


# --- Errors -----------------------------------------------------------------------------------
class BenchError(Exception):
    """A measurement could not be completed; `code` is stable and machine-readable."""

    code: ClassVar[str] = "bench_error"


class EngineUnavailableError(BenchError):
    """The engine's node module cannot be imported (e.g. ours is not written yet)."""

    code = "engine_unavailable"


class ClusterNotReadyError(BenchError):
    """No usable leader, or nodes did not catch up or converge, within the bounded wait."""

    code = "cluster_not_ready"


class NodeCrashedError(BenchError):
    """A node process exited on its own."""

    code = "node_crashed"


class ProtocolMismatchError(BenchError):
    """A node's reply lacks a field the protocol promises, or has one of the wrong type."""

    code = "protocol_mismatch"


class RunFailedError(BenchError):
    """A load/latency run kept failing (leader changes, errors) after RUN_ATTEMPTS_MAX tries."""

    code = "run_failed"


# --- Parameters and results -------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class BenchParams:
    quick: bool
    load_count: int
    load_inflight: int
    load_size_bytes: int
    load_repetitions: int
    latency_count: int
    latency_size_bytes: int
    failover_rounds: int
    election_timeout_ms: tuple[int, int]

    @classmethod
    def for_mode(cls, *, quick: bool) -> BenchParams:
        return cls(
            quick=quick,
            load_count=3000 if quick else 20000,
            load_inflight=1000,
            load_size_bytes=100,
            load_repetitions=3 if quick else 5,
            latency_count=300 if quick else 2000,
            latency_size_bytes=100,
            failover_rounds=2 if quick else 5,
            election_timeout_ms=ELECTION_TIMEOUT_MS,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSpec:
    """One engine in one configuration (a variant): its node module and extra node flags."""

    name: str
    engine: str
    module: str
    args: tuple[str, ...] = ()
    summary: str = ""


OURS = "ours"
OURS_NOFSYNC = "ours-nofsync"
PYSYNCOBJ_BATCH = "pysyncobj-batch"
PYSYNCOBJ_NOBATCH = "pysyncobj-nobatch"
ENGINES = {
    OURS: EngineSpec(
        name=OURS,
        engine="ours",
        module="raft.echo_node",
        summary="our engine, fsync on (the default; targets are judged on it)",
    ),
    OURS_NOFSYNC: EngineSpec(
        name=OURS_NOFSYNC,
        engine="ours",
        module="raft.echo_node",
        args=("--no-fsync",),
        summary="our engine, every WAL fsync skipped (unsafe; shows the price of durability)",
    ),
    PYSYNCOBJ_BATCH: EngineSpec(
        name=PYSYNCOBJ_BATCH,
        engine="pysyncobj",
        module="bench.pysyncobj_node",
        summary="pysyncobj 0.3.17, appendEntriesUseBatch=True (its default), journal on",
    ),
    PYSYNCOBJ_NOBATCH: EngineSpec(
        name=PYSYNCOBJ_NOBATCH,
        engine="pysyncobj",
        module="bench.pysyncobj_node",
        args=("--no-batch",),
        summary="pysyncobj 0.3.17, appendEntriesUseBatch=False, journal on",
    ),
}
ENGINE_NAMES = tuple(ENGINES)
BASELINE_NAMES = (PYSYNCOBJ_BATCH, PYSYNCOBJ_NOBATCH)
# Names --engines also accepts, each standing for several variants.
ENGINE_GROUPS = {"pysyncobj": BASELINE_NAMES, "all": ENGINE_NAMES}


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputResult:
    runs_per_s: list[float]
    median_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyResult:
    samples: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    # CPU time the three node processes spent on-CPU, and waiting for a CPU while runnable,
    # during the latency phase, per acknowledged proposal (Linux /proc/<pid>/task/*/schedstat;
    # None elsewhere). On a machine with fewer cores than busy processes, latency is bounded
    # below by CPU: these show what each engine spends.
    cpu_us_per_proposal: float | None = None
    runq_wait_us_per_proposal: float | None = None
    cpu_us_per_proposal_by_node: dict[int, float] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FailoverResult:
    times_s: list[float]
    median_s: float
    max_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistencyResult:
    consistent: bool
    counts: dict[int, int]
    digests: dict[int, str]
    acked_total: int
    # True when every node applied at least as many payloads as the harness saw acknowledged.
    acked_retained: bool
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineResult:
    engine: str
    complete: bool
    error: str | None = None
    error_code: str | None = None
    throughput: ThroughputResult | None = None
    latency: LatencyResult | None = None
    failover: FailoverResult | None = None
    consistency: ConsistencyResult | None = None
    elapsed_s: float = 0.0


def progress(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation: every value reported was really observed)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (all held open together, so they are distinct)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def write_secret_file(path: Path) -> None:
    """A fresh random cluster secret, created with mode 0600 (never world-readable, not even
    briefly: the mode is set by open(2), not by a later chmod)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")


def node_env() -> dict[str, str]:
    """The environment for node processes: the repo root first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def check_engine_available(spec: EngineSpec) -> None:
    """Import the engine's node module in a throwaway interpreter, exactly as the nodes will.

    A subprocess rather than find_spec: the module may exist yet fail to import (a missing
    sibling module while the engine is being written), and that must fail here, clearly, not
    as three crashed nodes.
    """
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"import {spec.module}"],
            cwd=REPO_ROOT,
            env=node_env(),
            capture_output=True,
            text=True,
            timeout=IMPORT_CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineUnavailableError(
            f"engine {spec.name!r}: importing {spec.module} took over {IMPORT_CHECK_TIMEOUT_S} s"
        ) from exc
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["(no error output)"])[-1]
        raise EngineUnavailableError(
            f"engine {spec.name!r}: {spec.module} is not importable yet ({reason}); "
            "run with --engines "
            f"{','.join(n for n, s in ENGINES.items() if s.module != spec.module)} meanwhile"
        )


# --- The cluster of node processes ------------------------------------------------------------
class Cluster:
    """Three node processes of one engine on free loopback ports, in a private temp dir."""

    def __init__(self, spec: EngineSpec, workdir: Path, params: BenchParams) -> None:
        self.spec = spec
        self.workdir = workdir
        ports = free_ports(2 * len(NODE_IDS))
        self.raft_ports = dict(zip(NODE_IDS, ports[: len(NODE_IDS)], strict=True))
        self.control_ports = dict(zip(NODE_IDS, ports[len(NODE_IDS) :], strict=True))
        self.secret_file = workdir / "cluster.secret"
        write_secret_file(self.secret_file)
        low_ms, high_ms = params.election_timeout_ms
        self._election_timeout = f"{low_ms}-{high_ms}"
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    def log_path(self, node_id: int) -> Path:
        return self.workdir / f"node{node_id}.log"

    def _command(self, node_id: int) -> list[str]:
        peers = ",".join(f"{nid}={HOST}:{port}" for nid, port in self.raft_ports.items())
        return [
            sys.executable,
            "-m",
            self.spec.module,
            "--node-id",
            str(node_id),
            "--peers",
            peers,
            "--control-port",
            str(self.control_ports[node_id]),
            "--data-dir",
            str(self.workdir / f"node{node_id}"),
            "--secret-file",
            str(self.secret_file),
            "--election-timeout-ms",
            self._election_timeout,
            *self.spec.args,
        ]

    def start(self, node_id: int) -> None:
        with self.log_path(node_id).open("ab") as log:
            self._processes[node_id] = subprocess.Popen(
                self._command(node_id),
                cwd=REPO_ROOT,
                env=node_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a terminal Ctrl-C reaches only the harness, which then kills
                # the nodes itself (by PID) in its finally blocks.
                start_new_session=True,
            )

    def start_all(self) -> None:
        for node_id in NODE_IDS:
            self.start(node_id)

    def pid(self, node_id: int) -> int:
        return self._processes[node_id].pid

    def kill(self, node_id: int) -> None:
        """SIGKILL (like `kill -9`) and reap, so the node is certainly gone on return."""
        process = self._processes[node_id]
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=PROCESS_EXIT_WAIT_S)

    def check_alive(self) -> None:
        for node_id, process in self._processes.items():
            code = process.poll()
            if code is not None:
                raise NodeCrashedError(
                    f"{self.spec.name} node {node_id} exited with status {code}; "
                    f"log tail:\n{self.log_tail(node_id)}"
                )

    def stop_all(self) -> None:
        """Terminate every node by PID; SIGKILL whatever has not exited in time."""
        stop_processes(self._processes.values())

    def log_tail(self, node_id: int) -> str:
        return log_tail(self.log_path(node_id))

    def status(self, node_id: int, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, Any] | None:
        """The node's status reply, or None if it does not answer (down, starting, busy).

        A fresh connection per call: status is polled from several threads, and a client must
        not be shared between them (loopback connects cost microseconds).
        """
        try:
            with self.client(node_id, timeout_s) as client:
                reply = client.call({"op": "status"})
        except ControlError:
            return None
        return reply if reply.get("ok") else None

    def leader_from_status(self, timeout_s: float = STATUS_TIMEOUT_S) -> int | None:
        """The node that says it leads, with the highest term (a deposed leader may lag)."""
        best: tuple[int, int] | None = None
        for node_id in NODE_IDS:
            status = self.status(node_id, timeout_s)
            if status is not None and status.get("role") == "leader":
                term = int(status.get("term", 0))
                if best is None or term > best[0]:
                    best = (term, node_id)
        return None if best is None else best[1]

    def client(self, node_id: int, timeout_s: float) -> ControlClient:
        return ControlClient(HOST, self.control_ports[node_id], timeout_s)


class AckTally:
    """Counts proposals the harness saw acknowledged, across all phases and threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0

    def add(self, count: int) -> None:
        with self._lock:
            self._total += count

    @property
    def total(self) -> int:
        with self._lock:
            return self._total


def wait_for_leader(cluster: Cluster, tally: AckTally, timeout_s: float) -> int:
    """A leader that has just committed a probe proposal (so it can really serve)."""
    deadline = time.monotonic() + timeout_s
    probe = 0
    while time.monotonic() < deadline:
        cluster.check_alive()
        leader = cluster.leader_from_status()
        if leader is not None:
            probe += 1
            with cluster.client(leader, PROPOSE_CLIENT_TIMEOUT_S) as client:
                try:
                    reply = client.call({"op": "propose", "data": b"probe-%d" % probe})
                except ControlError:
                    reply = {"ok": False}
            if reply.get("ok"):
                tally.add(1)
                return leader
        time.sleep(POLL_INTERVAL_S)
    raise ClusterNotReadyError(f"{cluster.spec.name}: no working leader within {timeout_s} s")


def _meshed(node_id: int, status: dict[str, Any]) -> bool:
    """Whether the node is connected to all its peers, if it reports that at all.

    `peers_connected` is optional in the protocol. Without this wait a failover round could
    start while the two survivors are not yet connected to each other, and would then time the
    engine's reconnect backoff instead of its election.
    """
    connected = status.get("peers_connected")
    if not isinstance(connected, list):
        return True
    return set(connected) >= set(NODE_IDS) - {node_id}


def wait_healthy(cluster: Cluster, timeout_s: float) -> int:
    """All nodes up, connected to each other (when they report it), agreeing on one leader, and
    applied up to the leader's commit index as it was when we started looking; returns the
    leader."""
    deadline = time.monotonic() + timeout_s
    target_index: int | None = None
    last_seen: dict[int, dict[str, Any] | None] = {}
    while time.monotonic() < deadline:
        cluster.check_alive()
        statuses = {node_id: cluster.status(node_id) for node_id in NODE_IDS}
        last_seen = statuses
        leaders = {nid for nid, s in statuses.items() if s and s.get("role") == "leader"}
        if len(leaders) == 1:
            leader = next(iter(leaders))
            leader_status = statuses[leader]
            if target_index is None and leader_status is not None:
                target_index = int(leader_status["commit_index"])
            if target_index is not None and all(
                s is not None
                and s.get("leader") == leader
                and s["applied_index"] >= target_index
                and _meshed(node_id, s)
                for node_id, s in statuses.items()
            ):
                return leader
        time.sleep(POLL_INTERVAL_S)
    raise ClusterNotReadyError(
        f"{cluster.spec.name}: cluster not healthy within {timeout_s} s; last statuses {last_seen}"
    )


# --- (a) throughput and (b) latency -----------------------------------------------------------
def run_on_leader(
    cluster: Cluster, tally: AckTally, request: dict[str, Any], count: int
) -> dict[str, Any]:
    """Run a load/latency request on the current leader, retrying after a leader change."""
    last_error = "no attempt"
    for _ in range(RUN_ATTEMPTS_MAX):
        leader = wait_for_leader(cluster, tally, CLUSTER_START_WAIT_S)
        with cluster.client(leader, run_timeout_s(count) + PROPOSE_CLIENT_TIMEOUT_S) as client:
            try:
                reply = client.call(request)
            except ControlError as exc:
                last_error = f"{exc.code}: {exc}"
                continue
        acked = reply.get("acked")
        if isinstance(acked, int):
            tally.add(acked)
        if reply.get("ok"):
            return reply
        last_error = f"{reply.get('error')}: {reply.get('message', '')}"
        progress(f"  {request['op']} failed on node {leader} ({last_error}); retrying")
    raise RunFailedError(f"{cluster.spec.name} {request['op']}: {last_error}")


def measure_throughput(cluster: Cluster, tally: AckTally, params: BenchParams) -> ThroughputResult:
    rates: list[float] = []
    for repetition in range(1, params.load_repetitions + 1):
        reply = run_on_leader(
            cluster,
            tally,
            {
                "op": "load",
                "count": params.load_count,
                "inflight": params.load_inflight,
                "size": params.load_size_bytes,
            },
            params.load_count,
        )
        rate = float(reply["acked"]) / float(reply["elapsed_s"])
        rates.append(rate)
        progress(
            f"  load {repetition}/{params.load_repetitions}: {reply['acked']} in "
            f"{reply['elapsed_s']:.2f} s = {rate:,.0f}/s"
        )
    return ThroughputResult(runs_per_s=rates, median_per_s=statistics.median(rates))


def schedstat_ns(pid: int) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) summed over the threads of `pid`, or None where
    /proc/<pid>/task/*/schedstat does not exist (not Linux). A thread that exits between the
    listing and the read is skipped (its time is lost: the nodes keep their threads)."""
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return None
    on_cpu = waiting = 0
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue
        if len(fields) < 2:
            return None
        on_cpu += int(fields[0])
        waiting += int(fields[1])
    return on_cpu, waiting


def _schedstat_all(cluster: Cluster) -> dict[int, tuple[int, int]] | None:
    out = {}
    for node_id in NODE_IDS:
        sample = schedstat_ns(cluster.pid(node_id))
        if sample is None:
            return None
        out[node_id] = sample
    return out


def measure_latency(
    cluster: Cluster,
    tally: AckTally,
    params: BenchParams,
    samples_out: list[float] | None = None,
) -> LatencyResult:
    """`samples_out`: also gets every sample (ms), for callers that pool several runs."""
    before = _schedstat_all(cluster)
    reply = run_on_leader(
        cluster,
        tally,
        {"op": "latency", "count": params.latency_count, "size": params.latency_size_bytes},
        params.latency_count,
    )
    latencies_ms = [int(us) / 1000.0 for us in reply["latencies_us"]]
    if len(latencies_ms) != params.latency_count:
        raise RunFailedError(
            f"latency run returned {len(latencies_ms)} samples, asked {params.latency_count}"
        )
    tally.add(len(latencies_ms))
    if samples_out is not None:
        samples_out.extend(latencies_ms)
    after = _schedstat_all(cluster)
    cpu_by_node: dict[int, float] | None = None
    wait_total: float | None = None
    if before is not None and after is not None:
        # Includes any attempt run_on_leader retried after a leader change: the CPU of the
        # whole phase, divided by the proposals it finally measured.
        count = len(latencies_ms)
        cpu_by_node = {n: round((after[n][0] - before[n][0]) / 1000 / count, 1) for n in NODE_IDS}
        wait_total = round(sum(after[n][1] - before[n][1] for n in NODE_IDS) / 1000 / count, 1)
    result = LatencyResult(
        samples=len(latencies_ms),
        p50_ms=percentile(latencies_ms, 0.50),
        p99_ms=percentile(latencies_ms, 0.99),
        mean_ms=statistics.fmean(latencies_ms),
        cpu_us_per_proposal=None if cpu_by_node is None else sum(cpu_by_node.values()),
        runq_wait_us_per_proposal=wait_total,
        cpu_us_per_proposal_by_node=cpu_by_node,
    )
    cpu_text = (
        ""
        if cpu_by_node is None
        else f"; CPU per proposal {result.cpu_us_per_proposal:.0f} us over the nodes "
        f"{cpu_by_node}, run-queue wait {wait_total:.0f} us"
    )
    progress(f"  latency: p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms{cpu_text}")
    return result


# --- (c) failover -----------------------------------------------------------------------------
class Proposer:
    """A client thread proposing one payload after another to whoever leads, recording when
    each acknowledgement arrived and from which node."""

    def __init__(self, cluster: Cluster, tally: AckTally, size_bytes: int) -> None:
        self._cluster = cluster
        self._tally = tally
        self._size_bytes = size_bytes
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._acks: list[tuple[float, int]] = []
        self._errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="failover-proposer", daemon=True)

    def __enter__(self) -> Proposer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=PROPOSE_CLIENT_TIMEOUT_S + 2 * STATUS_TIMEOUT_S)

    def wait_for_ack(self, *, after: float, node_id: int | None, exclude: int | None) -> float:
        """Monotonic time of the first ack received after `after` from `node_id` (any node if
        None) other than `exclude`; raises when none comes within FAILOVER_WAIT_S."""
        deadline = time.monotonic() + FAILOVER_WAIT_S
        with self._cond:
            while True:
                for at, source in self._acks:
                    if at > after and source != exclude and node_id in (None, source):
                        return at
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    recent = self._errors[-5:]
                    raise ClusterNotReadyError(
                        f"{self._cluster.spec.name}: no acknowledged proposal within "
                        f"{FAILOVER_WAIT_S} s (recent client errors: {recent})"
                    )
                self._cond.wait(remaining)

    def _run(self) -> None:
        clients = {
            node_id: self._cluster.client(node_id, PROPOSE_CLIENT_TIMEOUT_S) for node_id in NODE_IDS
        }
        target: int | None = None
        seq = 0
        try:
            while not self._stop.is_set():
                if target is None:
                    target = self._cluster.leader_from_status(PROBE_TIMEOUT_S)
                    if target is None:
                        time.sleep(PROPOSER_RETRY_S)
                        continue
                seq += 1
                payload = b"failover-%08d" % seq
                payload = payload.ljust(self._size_bytes, b"f")
                try:
                    reply = clients[target].call({"op": "propose", "data": payload})
                except ControlError as exc:
                    self._note_error(f"node {target}: {exc.code}")
                    target = None
                    continue
                if reply.get("ok"):
                    now = time.monotonic()
                    self._tally.add(1)
                    with self._cond:
                        self._acks.append((now, target))
                        self._cond.notify_all()
                    continue
                self._note_error(f"node {target}: {reply.get('error')}")
                hint = reply.get("leader")
                if reply.get("error") == "not_leader" and hint in NODE_IDS and hint != target:
                    target = int(hint)
                else:
                    target = None
                    time.sleep(PROPOSER_RETRY_S)
        finally:
            for client in clients.values():
                client.close()

    def _note_error(self, text: str) -> None:
        with self._cond:
            self._errors.append(text)
            del self._errors[:-20]


def measure_failover(cluster: Cluster, tally: AckTally, params: BenchParams) -> FailoverResult:
    times_s: list[float] = []
    with Proposer(cluster, tally, params.load_size_bytes) as proposer:
        for round_no in range(1, params.failover_rounds + 1):
            leader = wait_healthy(cluster, HEALTHY_WAIT_S)
            # Only kill once the client is really being served by this leader.
            proposer.wait_for_ack(after=time.monotonic(), node_id=leader, exclude=None)
            killed_at = time.monotonic()
            cluster.kill(leader)
            acked_at = proposer.wait_for_ack(after=killed_at, node_id=None, exclude=leader)
            times_s.append(acked_at - killed_at)
            progress(
                f"  failover {round_no}/{params.failover_rounds}: killed node {leader}, "
                f"served again after {acked_at - killed_at:.3f} s"
            )
            cluster.start(leader)
        wait_healthy(cluster, HEALTHY_WAIT_S)
    return FailoverResult(times_s=times_s, median_s=statistics.median(times_s), max_s=max(times_s))


# --- (d) consistency --------------------------------------------------------------------------
def check_consistency(cluster: Cluster, tally: AckTally) -> ConsistencyResult:
    """Wait (bounded) until every node applied the same number of payloads, then compare digests.

    A digest covers a node's whole applied sequence, so two digests are comparable only at equal
    counts; an idle healthy cluster reaches equal counts within a heartbeat or two.
    """
    deadline = time.monotonic() + CONVERGE_WAIT_S
    counts: dict[int, int] = {}
    digests: dict[int, str] = {}
    while True:
        cluster.check_alive()
        counts, digests = {}, {}
        for node_id in NODE_IDS:
            with contextlib.suppress(ControlError), cluster.client(node_id, STATUS_TIMEOUT_S) as c:
                reply = c.call({"op": "applied_digest"})
                if reply.get("ok"):
                    counts[node_id] = int(reply["count"])
                    digests[node_id] = str(reply["sha256"])
        converged = len(counts) == len(NODE_IDS) and len(set(counts.values())) == 1
        if converged or time.monotonic() >= deadline:
            break
        time.sleep(POLL_INTERVAL_S)
    acked_total = tally.total
    acked_retained = bool(counts) and min(counts.values()) >= acked_total
    if not converged:
        detail = f"applied counts did not converge within {CONVERGE_WAIT_S} s: {counts}"
        consistent = False
    elif len(set(digests.values())) != 1:
        detail = f"digests differ at count {next(iter(counts.values()))}: {digests}"
        consistent = False
    else:
        detail = f"all nodes applied {next(iter(counts.values()))} payloads with equal digests"
        consistent = True
    if not acked_retained:
        detail += f"; LOST ACKNOWLEDGED WRITES: {acked_total} acked, counts {counts}"
    progress(f"  consistency: {detail}")
    return ConsistencyResult(
        consistent=consistent,
        counts=counts,
        digests=digests,
        acked_total=acked_total,
        acked_retained=acked_retained,
        detail=detail,
    )


# --- One engine -------------------------------------------------------------------------------
@dataclass(slots=True)
class _Partial:
    """What one engine has measured so far (kept when a later phase fails)."""

    throughput: ThroughputResult | None = None
    latency: LatencyResult | None = None
    failover: FailoverResult | None = None
    consistency: ConsistencyResult | None = None


def run_engine(spec: EngineSpec, params: BenchParams) -> EngineResult:
    started = time.monotonic()
    partial = _Partial()
    progress(f"{spec.name}: starting")
    try:
        check_engine_available(spec)
        with tempfile.TemporaryDirectory(prefix=f"bench-raft-{spec.name}-") as tmp:
            cluster = Cluster(spec, Path(tmp), params)
            try:
                try:
                    _measure(cluster, params, partial)
                except (KeyError, TypeError, ValueError) as exc:
                    raise ProtocolMismatchError(
                        f"{spec.name}: unexpected reply shape ({type(exc).__name__}: {exc})"
                    ) from exc
            except BenchError:
                # The node logs vanish with the temp dir: show their ends now.
                for node_id in NODE_IDS:
                    progress(f"{spec.name} node {node_id} log tail:\n{cluster.log_tail(node_id)}")
                raise
            finally:
                cluster.stop_all()
    except BenchError as exc:
        progress(f"{spec.name}: FAILED ({exc.code}): {exc}")
        return EngineResult(
            engine=spec.name,
            complete=False,
            error=str(exc),
            error_code=exc.code,
            throughput=partial.throughput,
            latency=partial.latency,
            failover=partial.failover,
            consistency=partial.consistency,
            elapsed_s=time.monotonic() - started,
        )
    progress(f"{spec.name}: done in {time.monotonic() - started:.1f} s")
    return EngineResult(
        engine=spec.name,
        complete=True,
        throughput=partial.throughput,
        latency=partial.latency,
        failover=partial.failover,
        consistency=partial.consistency,
        elapsed_s=time.monotonic() - started,
    )


def _measure(cluster: Cluster, params: BenchParams, partial: _Partial) -> None:
    name = cluster.spec.name
    tally = AckTally()
    cluster.start_all()
    progress(f"{name}: nodes started (pids {[cluster.pid(n) for n in NODE_IDS]}), electing")
    leader = wait_for_leader(cluster, tally, CLUSTER_START_WAIT_S)
    progress(f"{name}: node {leader} leads")
    progress(f"{name}: (a) throughput")
    partial.throughput = measure_throughput(cluster, tally, params)
    progress(f"{name}: (b) single-proposer latency")
    partial.latency = measure_latency(cluster, tally, params)
    progress(f"{name}: (c) failover")
    partial.failover = measure_failover(cluster, tally, params)
    progress(f"{name}: (d) consistency")
    partial.consistency = check_consistency(cluster, tally)


# --- Report -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Metric:
    key: str
    label: str
    section: str
    attr: str
    spec: str
    higher_is_better: bool


METRICS = (
    Metric(key="throughput_per_s", label="throughput (/s, median)", section="throughput",
           attr="median_per_s", spec=",.0f", higher_is_better=True),
    Metric(key="latency_p50_ms", label="latency p50 (ms)", section="latency", attr="p50_ms",
           spec=".2f", higher_is_better=False),
    Metric(key="latency_p99_ms", label="latency p99 (ms)", section="latency", attr="p99_ms",
           spec=".2f", higher_is_better=False),
    Metric(key="latency_cpu_us", label="CPU per proposal, 3 nodes (us)", section="latency",
           attr="cpu_us_per_proposal", spec=",.0f", higher_is_better=False),
    Metric(key="latency_runq_wait_us", label="run-queue wait per proposal (us)",
           section="latency", attr="runq_wait_us_per_proposal", spec=",.0f",
           higher_is_better=False),
    Metric(key="failover_median_s", label="failover median (s)", section="failover",
           attr="median_s", spec=".3f", higher_is_better=False),
    Metric(key="failover_max_s", label="failover max (s)", section="failover", attr="max_s",
           spec=".3f", higher_is_better=False),
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """One metric of ours (fsync on) against one other variant; `ratio` is ours / other."""

    ours: float | None
    other: float | None
    other_variant: str | None
    ratio: float | None


def metric_value(result: EngineResult | None, metric: Metric) -> float | None:
    section = getattr(result, metric.section, None) if result is not None else None
    value = None if section is None else getattr(section, metric.attr)
    return None if value is None else float(value)


def best_variant(
    results: dict[str, EngineResult], metric: Metric, candidates: Sequence[str]
) -> tuple[str, float] | None:
    """The candidate with the best measured value of `metric` (highest throughput, lowest
    latency or failover time), or None if no candidate measured it. Ties go to the first."""
    measured = [
        (name, value)
        for name in candidates
        if (value := metric_value(results.get(name), metric)) is not None
    ]
    if not measured:
        return None
    pick = max if metric.higher_is_better else min
    return pick(measured, key=lambda item: item[1])


def _ratio(ours: float | None, base: float | None) -> float | None:
    if ours is None or base is None or base == 0:
        return None
    return ours / base


def compare(results: dict[str, EngineResult], candidates: Sequence[str]) -> dict[str, Comparison]:
    """Per metric: ours (fsync on) against the best of `candidates` for that metric."""
    ours = results.get(OURS)
    out = {}
    for metric in METRICS:
        value = metric_value(ours, metric)
        best = best_variant(results, metric, candidates)
        other_variant, other = best if best is not None else (None, None)
        out[metric.key] = Comparison(
            ours=value, other=other, other_variant=other_variant, ratio=_ratio(value, other)
        )
    return out


def compute_ratios(results: dict[str, EngineResult]) -> dict[str, float | None]:
    """Per metric: ours / the best pysyncobj variant for that metric."""
    return {key: c.ratio for key, c in compare(results, BASELINE_NAMES).items()}


def evaluate_targets(
    results: dict[str, EngineResult], ratios: dict[str, float | None]
) -> dict[str, dict[str, Any]]:
    """The targets, judged on ours (fsync on); `ratios` are ours / best pysyncobj per metric."""
    ours = results.get(OURS)
    p50 = ours.latency.p50_ms if ours and ours.latency else None
    failover = ours.failover.median_s if ours and ours.failover else None
    throughput_ratio = ratios.get("throughput_per_s")
    p50_ratio = ratios.get("latency_p50_ms")

    def met(value: float | None, ok: bool) -> bool | None:
        return None if value is None else ok

    return {
        "throughput_ratio": {
            "target": f">= {TARGET_THROUGHPUT_RATIO_MIN}x the best pysyncobj variant",
            "short": f">={TARGET_THROUGHPUT_RATIO_MIN:g}x",
            "value": throughput_ratio,
            "met": met(
                throughput_ratio,
                throughput_ratio is not None and throughput_ratio >= TARGET_THROUGHPUT_RATIO_MIN,
            ),
        },
        "latency_p50_ms": {
            "target": f"<= {TARGET_P50_MS_MAX} ms",
            "short": f"<={TARGET_P50_MS_MAX:g}ms",
            "value": p50,
            "met": met(p50, p50 is not None and p50 <= TARGET_P50_MS_MAX),
        },
        "latency_p50_vs_best_pysyncobj": {
            "target": "p50 <= the best pysyncobj variant's p50, same run (ratio <= "
            f"{TARGET_P50_RATIO_MAX:g})",
            "short": "<=best",
            "value": p50_ratio,
            "met": met(p50_ratio, p50_ratio is not None and p50_ratio <= TARGET_P50_RATIO_MAX),
        },
        "failover_median_s": {
            "target": f"<= {TARGET_FAILOVER_MEDIAN_S_MAX} s",
            "short": f"<={TARGET_FAILOVER_MEDIAN_S_MAX:g}s",
            "value": failover,
            "met": met(failover, failover is not None and failover <= TARGET_FAILOVER_MEDIAN_S_MAX),
        },
    }


# Which targets are shown on which metric's row.
_TARGETS_BY_METRIC = {
    "throughput_per_s": ("throughput_ratio",),
    "latency_p50_ms": ("latency_p50_ms", "latency_p50_vs_best_pysyncobj"),
    "failover_median_s": ("failover_median_s",),
}


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _missing(result: EngineResult) -> str:
    if result.error_code == EngineUnavailableError.code:
        return "unavailable"
    return "failed" if not result.complete else "n/a"


def render_tables(
    results: dict[str, EngineResult],
    vs_baseline: dict[str, Comparison],
    vs_nofsync: dict[str, Comparison],
    targets: dict[str, dict[str, Any]],
) -> tuple[Table, Table]:
    """(every variant that ran, side by side; ours against the best baseline and ours-nofsync)."""
    names = [name for name in ENGINE_NAMES if name in results]
    measured = Table(title="Raft engines and configurations, same workload, same run")
    measured.add_column("metric")
    for name in names:
        measured.add_column(name, justify="right")

    def cell(name: str, metric: Metric) -> str:
        result = results[name]
        value = metric_value(result, metric)
        return _missing(result) if value is None else _fmt(value, metric.spec)

    for metric in METRICS:
        measured.add_row(metric.label, *(cell(name, metric) for name in names))

    def yes_no(name: str, attr: str) -> str:
        result = results[name]
        if result.consistency is None:
            return _missing(result)
        return "yes" if getattr(result.consistency, attr) else "NO"

    measured.add_row("consistent", *(yes_no(n, "consistent") for n in names))
    measured.add_row("acked writes kept", *(yes_no(n, "acked_retained") for n in names))

    compared = Table(title=f"{OURS} (fsync on) against the best pysyncobj variant per metric")
    compared.add_column("metric")
    compared.add_column(OURS, justify="right")
    compared.add_column("best pysyncobj (variant)", justify="right")
    compared.add_column("ours/best", justify="right")
    compared.add_column(f"ours/{OURS_NOFSYNC}", justify="right")
    compared.add_column("target for ours")

    def verdicts(key: str) -> str:
        marks = []
        for target_key in _TARGETS_BY_METRIC.get(key, ()):
            target = targets[target_key]
            mark = {True: "met", False: "MISSED", None: "?"}[target["met"]]
            marks.append(f"{target['short']} {mark}")
        return ", ".join(marks)

    for metric in METRICS:
        base = vs_baseline[metric.key]
        best = (
            "n/a"
            if base.other is None
            else f"{_fmt(base.other, metric.spec)} ({base.other_variant})"
        )
        compared.add_row(
            metric.label,
            _fmt(base.ours, metric.spec),
            best,
            _fmt(base.ratio, ".2f"),
            _fmt(vs_nofsync[metric.key].ratio, ".2f"),
            verdicts(metric.key),
        )
    return measured, compared


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (the machine is shared: say how busy it was)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def write_results(
    path_dir: Path,
    *,
    started: datetime,
    load_at_start: list[float] | None,
    params: BenchParams,
    results: dict[str, EngineResult],
    vs_baseline: dict[str, Comparison],
    vs_nofsync: dict[str, Comparison],
    targets: dict[str, dict[str, Any]],
) -> Path:
    path_dir.mkdir(parents=True, exist_ok=True)
    path = path_dir / f"raft-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    document = {
        "started_utc": started.isoformat(),
        "finished_utc": datetime.now(UTC).isoformat(),
        "machine": machine_info(("pysyncobj", "uvloop")),
        "load_average": {"start": load_at_start, "end": load_average()},
        "params": asdict(params),
        "variants": {
            name: {
                "engine": spec.engine,
                "module": spec.module,
                "args": list(spec.args),
                "summary": spec.summary,
            }
            for name, spec in ENGINES.items()
            if name in results
        },
        "results": {name: asdict(result) for name, result in results.items()},
        # Per metric: ours / the best pysyncobj variant for that metric, which is named.
        "ours_vs_best_pysyncobj": {key: asdict(c) for key, c in vs_baseline.items()},
        # Per metric: ours / ours-nofsync, the price of fsync.
        "ours_vs_ours_nofsync": {key: asdict(c) for key, c in vs_nofsync.items()},
        "targets": targets,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


# --- Entry point ------------------------------------------------------------------------------
def parse_engines(text: str) -> list[str]:
    """A comma list of variant names and group names (`pysyncobj`, `all`), expanded in the
    order given, without repeats."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in ENGINES and item not in ENGINE_GROUPS]
    if not items or unknown:
        raise argparse.ArgumentTypeError(
            f"--engines takes a comma list of {', '.join(ENGINE_NAMES)} or the groups "
            f"{', '.join(ENGINE_GROUPS)}; got {text!r}"
        )
    names: list[str] = []
    for item in items:
        names.extend(ENGINE_GROUPS.get(item, (item,)))
    return list(dict.fromkeys(names))


def _engines_help() -> str:
    variants = "; ".join(f"{name}: {spec.summary}" for name, spec in ENGINES.items())
    groups = "; ".join(f"{group} = {','.join(names)}" for group, names in ENGINE_GROUPS.items())
    return (
        f"comma list of variants, run one after the other in the order given (default: all). "
        f"Variants: {variants}. Groups: {groups}. So `ours,pysyncobj` runs our engine with "
        f"fsync and both pysyncobj configurations."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Raft benchmark: our engine (with and without fsync) against pysyncobj "
        "(batching and not), same workload, same run"
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts, fewer rounds")
    parser.add_argument(
        "--engines", type=parse_engines, default=list(ENGINE_NAMES), help=_engines_help()
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    params = BenchParams.for_mode(quick=args.quick)
    started = datetime.now(UTC)
    load_at_start = load_average()
    progress(f"load average at start: {load_at_start}")
    results: dict[str, EngineResult] = {}
    try:
        with sigterm_as_interrupt():
            for name in args.engines:
                results[name] = run_engine(ENGINES[name], params)
    except KeyboardInterrupt:
        progress("interrupted; node processes were stopped")
        return 130
    vs_baseline = compare(results, BASELINE_NAMES)
    vs_nofsync = compare(results, (OURS_NOFSYNC,))
    targets = evaluate_targets(results, {key: c.ratio for key, c in vs_baseline.items()})
    # Rich assumes 80 columns when stdout is not a terminal (make, tee); the tables need more.
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH_NON_TTY)
    path = write_results(
        args.results_dir,
        started=started,
        load_at_start=load_at_start,
        params=params,
        results=results,
        vs_baseline=vs_baseline,
        vs_nofsync=vs_nofsync,
        targets=targets,
    )
    progress(f"results written to {path}")
    for table in render_tables(results, vs_baseline, vs_nofsync, targets):
        console.print(table)
    failed = [name for name, result in results.items() if not result.complete]
    if failed:
        progress(f"incomplete: {', '.join(failed)} (see messages above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
