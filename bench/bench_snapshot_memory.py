"""Heap memory of a large snapshot transfer: the sending leader and the receiving follower.

Usage: `python -m bench.bench_snapshot_memory [--state-mb N] [--json PATH]`
(`make bench-snapmem`; default 256 MiB of state).

Key idea: what a snapshot transfer costs in memory is best seen as *copies of the state*: a
follower that reassembles the transfer on the heap, copies it and decodes it holds several; one
that spools it to a file, maps it and decodes from the map holds about one (the decoded state
machine itself). So the harness builds a state of a known size, makes a follower need all of it
as a snapshot, and samples both ends' /proc/<pid>/status while it travels and is installed:

1. three `python -m raft.echo_node` processes on 127.0.0.1, `--snapshot-every 500`, election
   timeout 1000 ms (taking a snapshot of a large state blocks a node for a while);
2. one follower is SIGKILLed (by PID); the leader `load`s `--state-mb` payloads of 1 MiB, then
   1600 small ones, so the live nodes compact their logs past the follower's (and past the big
   entries: the harness waits, bounded, until their log starts beyond them);
3. once the live nodes' RssAnon is steady (a node may still be taking a snapshot of its own),
   each live node's memory is recorded; the follower is restarted and, until its applied digest
   equals the leader's (bounded wait), a sampler thread reads RssAnon, RssFile, VmRSS and VmHWM
   of all three nodes every ~10 ms. The sender is the node whose log shows the transfer to the
   follower (the leader, unless leadership moved during the catch-up, which is flagged); the
   third node is reported too ("other follower": a node that got the state by replication);
4. reported per node: peak RssAnon minus its baseline (the follower's as soon as it answers
   after the restart, before the snapshot is in, checked against the follower's log; the
   others' just before the restart), divided
   by the state size = "extra heap copies of the state"; also the absolute RssAnon in copies
   (at rest before the restart, at the peak, at the end), peak RssFile and VmRSS, VmHWM;
   the catch-up time (restart -> equal digests), the transfer time and the snapshot size (from
   the nodes' logs).

What it does not claim: RssFile (mapped snapshot files) is page cache the kernel can reclaim,
not heap; it still counts in VmRSS. Python rarely returns freed heap to the OS in full, so an
end value above the floor is not necessarily a live copy. The floor of the follower's absolute
value is ~1 copy: the echo state machine holds the decoded payloads.

Results: a table on stdout, JSON in bench/results/snapmem-<UTC>.json (or --json PATH) with the
git commit, the load average, every number above and the sampled curves (every 100 ms);
progress lines on stderr. Exit status 0 only if the follower converged.

Invariants: every wait has a deadline; every node is started by us in its own session and
stopped by its PID in a `finally` (also on Ctrl-C/SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from bench.bench_raft import (
    NODE_IDS,
    REPO_ROOT,
    RESULTS_DIR,
    BenchError,
    BenchParams,
    ClusterNotReadyError,
    EngineSpec,
    NodeCrashedError,
    load_average,
    progress,
)
from bench.bench_raft import Cluster as RaftCluster
from bench.control import ControlError, run_timeout_s
from bench.machine import machine_info
from bench.procs import sigterm_as_interrupt

MIB: Final = 1024 * 1024
STATE_MB_DEFAULT: Final = 256
BIG_PAYLOAD_BYTES: Final = MIB  # the echo node's largest payload
BIG_INFLIGHT: Final = 4
# Enough small entries after the big ones for the live nodes to compact beyond the follower's
# log and the entries they keep behind a snapshot (snapshot_keep_entries, 1000).
SMALL_COUNT: Final = 1600
SMALL_BYTES: Final = 100
SMALL_INFLIGHT: Final = 100
SNAPSHOT_EVERY: Final = 500
ELECTION_TIMEOUT_MS: Final = (1000, 2000)
SPOOL_DIR: Final = "snapshot-spool"  # raft.node.SNAPSHOT_SPOOL_DIR (only the new code has it)

# Bounds on every wait (seconds).
LEADER_WAIT_S: Final = 30.0
LOAD_WAIT_S: Final = 600.0
COMPACTION_WAIT_S: Final = 120.0
SETTLE_WAIT_S: Final = 60.0
SETTLE_WINDOW_S: Final = 2.0
SETTLE_BYTES: Final = 4 * MIB
RESTART_ANSWER_WAIT_S: Final = 60.0
CONVERGE_WAIT_S: Final = 180.0
STATUS_TIMEOUT_S: Final = 1.0
POLL_INTERVAL_S: Final = 0.1
SAMPLE_INTERVAL_S: Final = 0.01
CURVE_STEP_S: Final = 0.1  # resolution of the curves written to the JSON
PROC_FIELDS: Final = ("RssAnon", "RssFile", "RssShmem", "VmRSS", "VmHWM")
TABLE_WIDTH_NON_TTY: Final = 130
LOG_LINES_KEPT: Final = 20

# Lines of the transport's log (the same text before and after the spool change).
_TS = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
SENT_STARTED: Final = re.compile(
    _TS
    + r".*snapshot transfer \w+ to peer (\d+) started: snapshot index (\d+) term \d+, (\d+) bytes"
)
SENT_COMPLETED: Final = re.compile(_TS + r".*snapshot transfer \w+ to peer (\d+) completed")
RECEIVE_STARTED: Final = re.compile(_TS + r".*snapshot transfer \w+ from peer \d+ started")


# --- /proc sampling ---------------------------------------------------------------------------
def proc_memory(pid: int) -> dict[str, int] | None:
    """RssAnon, RssFile, RssShmem, VmRSS and VmHWM of a process in bytes; None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in PROC_FIELDS:
            out[key] = int(rest.split()[0]) * 1024
    return out


@dataclass(slots=True)
class Sample:
    t_s: float  # since the follower's restart
    mem: dict[str, int]


class Sampler:
    """A thread reading /proc/<pid>/status of some processes every SAMPLE_INTERVAL_S."""

    def __init__(self, t0: float) -> None:
        self._t0 = t0
        self._pids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.samples: dict[str, list[Sample]] = {}
        self._thread = threading.Thread(target=self._run, name="mem-sampler", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self._pids[name] = pid
            self.samples.setdefault(name, [])

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                pids = dict(self._pids)
            now = time.monotonic() - self._t0
            for name, pid in pids.items():
                mem = proc_memory(pid)
                if mem is not None:
                    self.samples[name].append(Sample(now, mem))
            self._stop.wait(SAMPLE_INTERVAL_S)


# --- Results ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class NodeMemory:
    """One node during the catch-up; *_copies are bytes divided by the state size."""

    node_id: int
    role: str
    samples: int
    baseline_rss_anon: int
    peak_rss_anon: int
    peak_rss_anon_at_s: float
    end_rss_anon: int
    peak_rss_file: int
    peak_vm_rss: int
    vm_hwm_end: int
    baseline_copies: float
    peak_extra_heap_copies: float  # (peak RssAnon - baseline) / state: the headline
    peak_heap_copies: float
    end_heap_copies: float


@dataclass(slots=True, kw_only=True)
class Result:
    state_mb: int
    state_bytes: int = 0
    big_acked: int = 0
    small_acked: int = 0
    leader: int = 0
    follower: int = 0
    settled: bool = False
    leader_changed: bool = False
    leader_change_lines: list[str] = field(default_factory=list)
    spool_dir_seen: bool = False
    before_restart: dict[int, dict[str, int]] = field(default_factory=dict)
    follower_pre_kill: dict[str, int] = field(default_factory=dict)
    follower_answer_s: float | None = None
    # When the follower logged the first chunk of the transfer (since the restart): its
    # baseline is sound only if it answered before that.
    receive_started_s: float | None = None
    baseline_before_transfer: bool | None = None
    catch_up_s: float | None = None
    transfer_s: float | None = None
    snapshot_bytes: int | None = None
    snapshot_index: int | None = None
    transfers_started: int = 0
    load_s: float = 0.0
    nodes: dict[str, NodeMemory] = field(default_factory=dict)
    curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    converged: bool = False
    error: str | None = None


# --- The run ----------------------------------------------------------------------------------
class Cluster(RaftCluster):
    """bench_raft's cluster, whose check_alive covers only the nodes meant to be running
    (the follower is down on purpose for most of the run)."""

    def __init__(self, spec: EngineSpec, workdir: Path, params: BenchParams) -> None:
        super().__init__(spec, workdir, params)
        self.down: set[int] = set()

    def kill(self, node_id: int) -> None:
        super().kill(node_id)
        self.down.add(node_id)

    def start(self, node_id: int) -> None:
        super().start(node_id)
        self.down.discard(node_id)

    def check_alive(self) -> None:
        for node_id, process in self._processes.items():
            code = process.poll()
            if node_id not in self.down and code is not None:
                raise NodeCrashedError(
                    f"node {node_id} exited with status {code}; log tail:\n{self.log_tail(node_id)}"
                )


def make_cluster(workdir: Path) -> Cluster:
    spec = EngineSpec(
        name="ours",
        engine="ours",
        module="raft.echo_node",
        args=("--snapshot-every", str(SNAPSHOT_EVERY)),
        summary="our engine, fsync on, snapshot every 500 entries",
    )
    params = dataclasses.replace(
        BenchParams.for_mode(quick=True), election_timeout_ms=ELECTION_TIMEOUT_MS
    )
    return Cluster(spec, workdir, params)


def wait_leader(cluster: Cluster, among: list[int], timeout_s: float) -> int:
    """A ready leader; of several that say so, the one with the highest term (a deposed leader
    that was blocked, e.g. taking a snapshot, may not know yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster.check_alive()
        leaders = []
        for node_id in among:
            status = cluster.status(node_id)
            if status and status.get("role") == "leader" and status.get("ready_to_serve"):
                leaders.append((int(status.get("term", 0)), node_id))
        if leaders:
            return max(leaders)[1]
        time.sleep(POLL_INTERVAL_S)
    raise ClusterNotReadyError(f"no ready leader among {among} within {timeout_s} s")


def load(cluster: Cluster, among: list[int], count: int, size: int, inflight: int) -> int:
    """Propose `count` payloads of `size` bytes on whoever leads (a leader change fails the
    proposals of that moment; the rest are proposed again); returns how many were acked."""
    acked = 0
    deadline = time.monotonic() + LOAD_WAIT_S
    while acked < count and time.monotonic() < deadline:
        leader = wait_leader(cluster, among, LEADER_WAIT_S)
        remaining = count - acked
        request = {"op": "load", "count": remaining, "inflight": inflight, "size": size}
        try:
            with cluster.client(leader, run_timeout_s(remaining)) as client:
                reply = client.call(request)
        except ControlError as exc:
            progress(f"  load on node {leader} failed ({exc.code}); retrying")
            continue
        acked += int(reply.get("acked", 0))
        if not reply.get("ok"):
            progress(f"  load on node {leader}: {reply.get('error')}; retrying the rest")
    if acked < count:
        raise ClusterNotReadyError(f"only {acked} of {count} proposals acknowledged")
    return acked


def wait_compacted(cluster: Cluster, node_id: int, past_index: int) -> int:
    """Until the node's log starts beyond `past_index` (a follower compacts once it applied
    what the leader acknowledged, which may take a moment)."""
    deadline = time.monotonic() + COMPACTION_WAIT_S
    start = 0
    while time.monotonic() < deadline:
        status = cluster.status(node_id, timeout_s=5.0)
        if status is not None:
            start = int(status["log_start_index"])
            if start > past_index:
                return start
        time.sleep(POLL_INTERVAL_S)
    raise ClusterNotReadyError(f"node {node_id} did not compact past {past_index} (at {start})")


def wait_settled(cluster: Cluster, among: list[int]) -> bool:
    """Until every node's RssAnon has moved less than SETTLE_BYTES over SETTLE_WINDOW_S (a node
    may still be taking a snapshot of its own, which would skew its baseline); bounded."""
    deadline = time.monotonic() + SETTLE_WAIT_S
    window: list[tuple[float, dict[int, int]]] = []
    while time.monotonic() < deadline:
        now = time.monotonic()
        window.append(
            (now, {i: (proc_memory(cluster.pid(i)) or {}).get("RssAnon", 0) for i in among})
        )
        window = [(t, m) for t, m in window if t >= now - SETTLE_WINDOW_S]
        if now - window[0][0] >= SETTLE_WINDOW_S * 0.9 and all(
            max(m[i] for _, m in window) - min(m[i] for _, m in window) < SETTLE_BYTES
            for i in among
        ):
            return True
        time.sleep(POLL_INTERVAL_S)
    return False


def digest(cluster: Cluster, node_id: int) -> dict[str, Any] | None:
    with contextlib.suppress(ControlError), cluster.client(node_id, STATUS_TIMEOUT_S) as client:
        reply = client.call({"op": "applied_digest"})
        if reply.get("ok"):
            return reply
    return None


def parse_log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def read_log(cluster: Cluster, node_id: int, offset: int) -> str:
    with cluster.log_path(node_id).open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def transfer_from_log(
    text: str, follower: int
) -> tuple[int, int | None, int | None, float | None, float]:
    """(transfers started, snapshot bytes, snapshot index, seconds from the last start to its
    completion, when the last started (unix s)) for transfers to `follower` in a node's log."""
    starts = [m for m in SENT_STARTED.finditer(text) if int(m.group(2)) == follower]
    if not starts:
        return 0, None, None, None, 0.0
    last = starts[-1]
    done = [
        m
        for m in SENT_COMPLETED.finditer(text, last.end())
        if int(m.group(2)) == follower  # the first completion after the last start
    ]
    seconds = None
    if done:
        seconds = parse_log_time(done[0].group(1)) - parse_log_time(last.group(1))
    return (
        len(starts),
        int(last.group(4)),
        int(last.group(3)),
        seconds,
        parse_log_time(last.group(1)),
    )


def summarize(
    node_id: int, role: str, samples: list[Sample], baseline: int, state_bytes: int
) -> NodeMemory:
    if not samples:
        raise BenchError(f"no memory samples of node {node_id}")
    peak = max(samples, key=lambda s: s.mem.get("RssAnon", 0))
    peak_anon = peak.mem.get("RssAnon", 0)
    end_anon = samples[-1].mem.get("RssAnon", 0)
    return NodeMemory(
        node_id=node_id,
        role=role,
        samples=len(samples),
        baseline_rss_anon=baseline,
        peak_rss_anon=peak_anon,
        peak_rss_anon_at_s=round(peak.t_s, 3),
        end_rss_anon=end_anon,
        peak_rss_file=max(s.mem.get("RssFile", 0) for s in samples),
        peak_vm_rss=max(s.mem.get("VmRSS", 0) for s in samples),
        vm_hwm_end=samples[-1].mem.get("VmHWM", 0),
        baseline_copies=baseline / state_bytes,
        peak_extra_heap_copies=(peak_anon - baseline) / state_bytes,
        peak_heap_copies=peak_anon / state_bytes,
        end_heap_copies=end_anon / state_bytes,
    )


def curve(samples: list[Sample]) -> dict[str, list[float]]:
    """The samples every CURVE_STEP_S (MiB), for the JSON."""
    out: dict[str, list[float]] = {"t_s": [], "rss_anon_mib": [], "rss_file_mib": []}
    next_t = -1.0
    for s in samples:
        if s.t_s >= next_t:
            out["t_s"].append(round(s.t_s, 3))
            out["rss_anon_mib"].append(round(s.mem.get("RssAnon", 0) / MIB, 1))
            out["rss_file_mib"].append(round(s.mem.get("RssFile", 0) / MIB, 1))
            next_t = s.t_s + CURVE_STEP_S
    return out


def run(state_mb: int, workdir: Path, r: Result) -> None:
    cluster = make_cluster(workdir)
    try:
        cluster.start_all()
        leader = wait_leader(cluster, list(NODE_IDS), LEADER_WAIT_S)
        follower = next(i for i in NODE_IDS if i != leader)
        others = [i for i in NODE_IDS if i != follower]
        r.follower = follower
        r.follower_pre_kill = proc_memory(cluster.pid(follower)) or {}
        progress(f"leader {leader}; killing follower {follower} (pid {cluster.pid(follower)})")
        cluster.kill(follower)

        load_started = time.monotonic()
        progress(f"loading {state_mb} payloads of 1 MiB")
        r.big_acked = load(cluster, others, state_mb, BIG_PAYLOAD_BYTES, BIG_INFLIGHT)
        progress(f"loading {SMALL_COUNT} payloads of {SMALL_BYTES} bytes")
        r.small_acked = load(cluster, others, SMALL_COUNT, SMALL_BYTES, SMALL_INFLIGHT)
        r.state_bytes = r.big_acked * BIG_PAYLOAD_BYTES + r.small_acked * SMALL_BYTES
        for node_id in others:
            start = wait_compacted(cluster, node_id, r.big_acked + 2)
            progress(f"  node {node_id}: log starts at {start}")
        r.load_s = time.monotonic() - load_started

        r.settled = wait_settled(cluster, others)
        if not r.settled:
            progress(f"warning: the live nodes' memory did not settle within {SETTLE_WAIT_S} s")
        leader = wait_leader(cluster, others, LEADER_WAIT_S)
        r.leader = leader
        for node_id in others:
            r.before_restart[node_id] = proc_memory(cluster.pid(node_id)) or {}
        log_offsets = {i: cluster.log_path(i).stat().st_size for i in NODE_IDS}
        leader_digest = digest(cluster, leader)
        if leader_digest is None:
            raise ClusterNotReadyError(f"leader {leader} does not answer applied_digest")

        t0 = time.monotonic()
        t0_unix = time.time()
        with Sampler(t0) as sampler:
            for node_id in others:
                sampler.watch(str(node_id), cluster.pid(node_id))
            cluster.start(follower)
            sampler.watch(str(follower), cluster.pid(follower))
            progress(f"restarted follower {follower} (pid {cluster.pid(follower)}); sampling")
            # The follower's baseline: its memory as soon as it answers (started, WAL read,
            # the snapshot not yet installed).
            follower_baseline: int | None = None
            deadline = t0 + RESTART_ANSWER_WAIT_S
            while time.monotonic() < deadline:
                cluster.check_alive()
                if cluster.status(follower, timeout_s=0.5) is not None:
                    mem = proc_memory(cluster.pid(follower))
                    follower_baseline = mem["RssAnon"] if mem else None
                    r.follower_answer_s = time.monotonic() - t0
                    break
                time.sleep(SAMPLE_INTERVAL_S)
            if follower_baseline is None:
                raise ClusterNotReadyError(f"follower did not answer in {RESTART_ANSWER_WAIT_S} s")
            deadline = t0 + CONVERGE_WAIT_S
            while time.monotonic() < deadline:
                cluster.check_alive()
                got = digest(cluster, follower)
                if got is not None and got["sha256"] == leader_digest["sha256"]:
                    status = cluster.status(follower)
                    if status is not None and status.get("ready_to_serve"):
                        r.catch_up_s = time.monotonic() - t0
                        r.converged = True
                        break
                time.sleep(POLL_INTERVAL_S)
        if not r.converged:
            raise ClusterNotReadyError(f"follower did not converge within {CONVERGE_WAIT_S} s")
        progress(f"follower converged after {r.catch_up_s:.1f} s")

        r.spool_dir_seen = (workdir / f"node{follower}" / SPOOL_DIR).is_dir()
        logs = {i: read_log(cluster, i, log_offsets[i]) for i in NODE_IDS}
        # The node that sent the snapshot: the leader at the restart, unless leadership moved
        # during the catch-up (then the last one to start a transfer to the follower).
        sent = {i: transfer_from_log(logs[i], follower) for i in others}
        senders = [i for i in others if sent[i][0]]
        sender = max(senders, key=lambda i: sent[i][4]) if senders else leader
        final = cluster.status(leader)
        r.leader_changed = sender != leader or final is None or final.get("role") != "leader"
        if r.leader_changed:
            r.leader_change_lines = [
                line for i in others for line in logs[i].splitlines() if "term" in line
            ][:LOG_LINES_KEPT]
            progress(f"leadership moved during the catch-up (node {leader} -> {sender})")
        r.leader = sender
        r.transfers_started = sum(sent[i][0] for i in others)
        _, r.snapshot_bytes, r.snapshot_index, r.transfer_s, _ = sent.get(
            sender, (0, None, None, None, 0.0)
        )
        received = RECEIVE_STARTED.search(logs[follower])
        if received is not None:
            r.receive_started_s = parse_log_time(received.group(1)) - t0_unix
            if r.follower_answer_s is not None:
                r.baseline_before_transfer = r.follower_answer_s < r.receive_started_s
                if not r.baseline_before_transfer:
                    progress("warning: the transfer reached the follower before it answered")
        bystander = next(i for i in others if i != sender)
        for role, node_id, baseline in (
            ("follower", follower, follower_baseline),
            ("leader", sender, r.before_restart[sender].get("RssAnon", 0)),
            ("other", bystander, r.before_restart[bystander].get("RssAnon", 0)),
        ):
            r.nodes[role] = summarize(
                node_id, role, sampler.samples[str(node_id)], baseline, r.state_bytes
            )
        r.curves = {name: curve(samples) for name, samples in sampler.samples.items()}
    finally:
        cluster.stop_all()


# --- Output -----------------------------------------------------------------------------------
def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:,.0f}"


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render(r: Result) -> Table:
    table = Table(
        title=f"Snapshot transfer memory: {r.state_bytes / MIB:,.0f} MiB of state, "
        f"leader {r.leader} -> follower {r.follower}"
        f"{' (LEADERSHIP MOVED during the catch-up)' if r.leader_changed else ''} "
        f"(spool dir {'seen: new code' if r.spool_dir_seen else 'absent: old code'})"
    )
    table.add_column("metric")
    table.add_column("follower", justify="right")
    table.add_column("leader (sender)", justify="right")
    table.add_column("other follower", justify="right")
    nodes = [r.nodes.get(role) for role in ("follower", "leader", "other")]

    def row(label: str, get: Any) -> None:
        table.add_row(label, *(get(n) if n is not None else "n/a" for n in nodes))

    row(
        "peak extra heap copies (peak RssAnon - base) / state",
        lambda n: f"{n.peak_extra_heap_copies:.2f}",
    )
    row("heap copies at baseline", lambda n: f"{n.baseline_copies:.2f}")
    row("heap copies at peak", lambda n: f"{n.peak_heap_copies:.2f}")
    row("heap copies at the end", lambda n: f"{n.end_heap_copies:.2f}")
    row("baseline RssAnon MiB", lambda n: _mib(n.baseline_rss_anon))
    row(
        "peak RssAnon MiB (at s)", lambda n: f"{_mib(n.peak_rss_anon)} ({n.peak_rss_anon_at_s:.1f})"
    )
    row("peak RssFile MiB", lambda n: _mib(n.peak_rss_file))
    row("peak VmRSS MiB", lambda n: _mib(n.peak_vm_rss))
    row("VmHWM MiB at the end", lambda n: _mib(n.vm_hwm_end))
    row("samples", lambda n: str(n.samples))
    table.add_row(
        "follower answered / transfer reached it, s after restart",
        f"{_num(r.follower_answer_s, '.2f')} / {_num(r.receive_started_s, '.2f')}",
        "",
    )
    table.add_row("catch-up s (restart -> equal digests)", _num(r.catch_up_s, ".1f"), "")
    table.add_row("transfer s (leader log: started -> completed)", "", _num(r.transfer_s, ".1f"))
    table.add_row(
        "snapshot bytes MiB (transfers started)",
        "",
        f"{_mib(r.snapshot_bytes)} ({r.transfers_started})",
    )
    return table


def write_json(path: Path, r: Result, *, started: datetime, load_start: list[float] | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "started_utc": started.isoformat(),
        "finished_utc": datetime.now(UTC).isoformat(),
        "machine": machine_info(),
        "repo_root": str(REPO_ROOT),
        "load_average": {"start": load_start, "end": load_average()},
        "params": {
            "state_mb": r.state_mb,
            "big_payload_bytes": BIG_PAYLOAD_BYTES,
            "small_count": SMALL_COUNT,
            "small_bytes": SMALL_BYTES,
            "snapshot_every": SNAPSHOT_EVERY,
            "election_timeout_ms": list(ELECTION_TIMEOUT_MS),
            "sample_interval_s": SAMPLE_INTERVAL_S,
        },
        "result": asdict(r),
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Heap memory of the sending leader and the receiving follower while a large "
        "snapshot is transferred and installed, in copies of the state"
    )
    parser.add_argument(
        "--state-mb", type=int, default=STATE_MB_DEFAULT, help="state size in MiB (1 MiB payloads)"
    )
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON")
    args = parser.parse_args(argv)
    if not 8 <= args.state_mb <= 900:
        parser.error("--state-mb must be in [8, 900] (the WAL's snapshot limit is 1 GiB)")
    started = datetime.now(UTC)
    load_start = load_average()
    progress(f"load average at start: {load_start}; code under test: {REPO_ROOT}")
    r = Result(state_mb=args.state_mb)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="bench-snapmem-") as tmp:
            try:
                run(args.state_mb, Path(tmp), r)
            except (BenchError, KeyError, TypeError, ValueError, OSError) as exc:
                r.error = f"{type(exc).__name__}: {exc}"
                progress(f"failed: {r.error}")
    except KeyboardInterrupt:
        progress("interrupted; node processes were stopped")
        return 130
    path = args.json or RESULTS_DIR / f"snapmem-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    progress(f"results written to {write_json(path, r, started=started, load_start=load_start)}")
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH_NON_TTY)
    if r.nodes:
        console.print(render(r))
    return 0 if r.converged and r.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
