"""Fault injection against real daemon processes, with a recorded history and checkers.

    make chaos SEEDS=1,2,3 DURATION=120      # long runs; `make test` runs one short seed
    make chaos SEEDS=4 FAULTS=network        # only one family of faults (process|network|all)

A seeded schedule of faults runs while clients drive a workload; every operation is recorded as
invoke -> ok / fail / unknown, every read with the node that answered, and then the history is
checked against the final state of the cluster (the etcd robustness suite and Jepsen are the
models). Process faults: kill -9 of the leader, of a follower and of every node (restarted after
a while), SIGSTOP/SIGCONT pauses, a follower restarted with its clock far ahead. Network faults,
through a userspace TCP proxy between every ordered pair of nodes (tests/chaos/netproxy.py):
the leader partitioned away, a follower partitioned away, a one-way partition of the leader,
50-200 ms of delay on every link, and connections reset at random. Workload: atomic two-table
commits of unique files, DDL (ADD COLUMN), file reads AS OF acknowledged commit timestamps on
every node, each node's status, and - while a node is cut off - commits and linearizable reads
sent to that node alone.

Checkers:
* no acknowledged commit lost: the final log has it, at the acknowledged ts, with its files;
* no file of a refused commit is visible; a commit with an unknown outcome is all or nothing
  (both tables, or neither) - the tables of one commit appear together;
* real-time order: a commit acknowledged before another was sent has the smaller ts;
* every node gave the same answer for the same timestamp, equal to the final state's;
* no acknowledged DDL lost;
* safe time never decreased on any node while it reported ready, across its restarts;
* a node cut off from the others (either direction) acknowledged no commit and answered no
  linearizable read sent to it while it was cut off; a partitioned leader stepped down and the
  majority elected another;
* vacuity: enough acknowledged operations, at least one leader change, every fault fired and
  had its effect (the proxy held, delayed or reset traffic; the skewed node fenced itself).

A known product bug can wedge the cluster (every node fenced for its clock, no leader; see
docs/chaos.md): a run that meets it restarts the nodes, goes on, checks everything, and ends as
XFAIL naming it.

Not covered here (see docs/chaos.md): clock skew of the leader (tests/raft/test_clock_fence.py
covers a leader whose clock jumps ahead), snapshot transfer to a far-behind follower, TLS,
partitions between clients and nodes. A failure prints the seed; `CHAOS_SEEDS=<seed>` (with the
same CHAOS_FAULTS) replays the same fault schedule (the timing of a real cluster still varies
from run to run).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon.certs import generate_dev_certs
from metastore.daemon.node import (
    FAULT_CLOCK_OFFSET_ENV,
    FAULT_FORWARD_ADDRESSES_ENV,
    FAULT_PEER_ADDRESSES_ENV,
)
from metastore.errors import ErrorCode, MetastoreError
from raft.tls import ClientTls, client_context
from tests.chaos.netproxy import NetProxy, PairStats
from tests.daemon.harness import MetastoreCluster, write_cluster

pytestmark = pytest.mark.slow

SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "1").split(",") if s.strip()]
DURATION_S = float(os.environ.get("CHAOS_DURATION_S", "10"))
PROCESS_FAULTS = ("kill_leader", "kill_follower", "pause", "kill_all", "skew")
NETWORK_FAULTS = ("partition", "partition_minority", "asymmetric", "delay", "flaky")
# Two faults at once: a kill -9 (and restart) of the leader while it is cut off, or while
# every link is slow.
OVERLAPPING_FAULTS = ("partition_kill", "delay_kill")
# The workload's clients cut off from the leader (the nodes still reach each other).
CLIENT_FAULTS = ("client_partition",)
FAULT_SETS = {
    "process": PROCESS_FAULTS,
    "network": NETWORK_FAULTS,
    "overlap": OVERLAPPING_FAULTS,
    "client": CLIENT_FAULTS,
    "all": PROCESS_FAULTS + NETWORK_FAULTS + OVERLAPPING_FAULTS + CLIENT_FAULTS,
}
FAULTS = os.environ.get("CHAOS_FAULTS", "all")
# CHAOS_TLS=1: the nodes run with mutual TLS between peers and TLS on the client ports (a dev
# CA made for the run); the proxy forwards the encrypted bytes as they are.
TLS = os.environ.get("CHAOS_TLS", "") == "1"
TABLES = ("ch.a", "ch.b")
DDL_TABLE = "ch.ddl"
# An error that does not say whether the operation happened.
UNKNOWN_CODES = {ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.UNKNOWN, ErrorCode.INTERNAL}
MIN_ACKED_COMMITS = 10
# The budget of one operation sent to a cut-off node (several fit in a partition).
PROBE_TIMEOUT_MS = 800
# The "skew" fault's clock shift: far beyond the chaos cluster's CSmax (100 ms).
SKEW_MS = 2_000
READY_WAIT_S = 60.0
# How long a partition of the leader may last, at most, waiting for the majority to elect
# another leader and for the old one to step down (election timeout here: 300-600 ms).
PARTITION_MAX_S = 10.0
# A known product bug (docs/chaos.md, "Known product bugs"): nodes that fenced themselves for
# their clock by quorum neither campaign nor lift the fence without hearing a leader, so when
# every node has done so the cluster never elects one again. Seen that long, the run records
# it, restarts every node (which clears the fences), goes on, and ends as XFAIL after its
# checks; any other failure still fails.
WEDGE_S = 8.0
# The "delay" fault's one-way delay per link, and its jitter.
DELAY_MS = (50, 200)
DELAY_JITTER_MS = 20


@dataclass(slots=True)
class Isolation:
    """A node cut off from the others (in one direction or both) during [cut_at, healed_at]."""

    node: int
    cut_at: float
    healed_at: float = float("inf")


@dataclass(slots=True)
class History:
    commits: dict[str, dict[str, Any]] = field(default_factory=dict)  # txn id -> op
    ddls: list[dict[str, Any]] = field(default_factory=list)
    reads: list[tuple[int, str, int, frozenset[str]]] = field(default_factory=list)
    safe_times: dict[int, list[int]] = field(default_factory=dict)
    terms: set[int] = field(default_factory=set)
    faults: list[str] = field(default_factory=list)
    fences_seen: int = 0  # skewed nodes seen fencing themselves
    isolations: list[Isolation] = field(default_factory=list)
    # Operations sent to one node alone while it was cut off: (node, op, t0, t1, outcome, what)
    isolated_ops: list[tuple[int, str, float, float, str, str]] = field(default_factory=list)
    wedges: list[str] = field(default_factory=list)  # the known clock-fence wedge, seen
    client_cut_acks: list[int] = field(default_factory=list)  # commits acked per client cut
    lock: threading.Lock = field(default_factory=threading.Lock)


class ChaosCluster(MetastoreCluster):
    """A MetastoreCluster whose nodes, with a proxy, reach each other only through it: node i
    connects to node j's Raft port and forwards to j's client port through the pairs
    "raft i->j" and "fwd i->j". The workload's clients (committers, DDL) reach node i through
    the pair "client->i"; the reader and the probers reach every node directly."""

    def __init__(self, config: Path, proxy: NetProxy | None) -> None:
        super().__init__(config)
        self.proxy = proxy
        self.node_env: dict[int, dict[str, str]] = {}
        self.workload_ports = dict(self.client_ports)
        self.client_tls: ClientTls | None = None
        if proxy is None:
            return
        for i in self.ids:
            self.workload_ports[i] = proxy.add(f"client->{i}", ("127.0.0.1", self.client_ports[i]))
        nodes = tomllib.loads(config.read_text())["nodes"]
        raft_ports = {int(n["id"]): int(n["raft_port"]) for n in nodes}
        for i in self.ids:
            peers, forwards = [], []
            for j in self.ids:
                if j == i:
                    continue
                port = proxy.add(f"raft {i}->{j}", ("127.0.0.1", raft_ports[j]))
                peers.append(f"{j}=127.0.0.1:{port}")
                port = proxy.add(f"fwd {i}->{j}", ("127.0.0.1", self.client_ports[j]))
                forwards.append(f"{j}=127.0.0.1:{port}")
            self.node_env[i] = {
                FAULT_PEER_ADDRESSES_ENV: ",".join(peers),
                FAULT_FORWARD_ADDRESSES_ENV: ",".join(forwards),
            }

    def start(
        self, node_id: int, *, bootstrap: bool | None = None, env: dict[str, str] | None = None
    ) -> None:
        super().start(
            node_id, bootstrap=bootstrap, env={**self.node_env.get(node_id, {}), **(env or {})}
        )

    def peer_pairs(self) -> list[str]:
        """The proxy pairs between nodes (not the clients')."""
        return [name for name in self.net().names if not name.startswith("client->")]

    def net(self) -> NetProxy:
        assert self.proxy is not None, "a network fault needs the proxy"
        return self.proxy

    @staticmethod
    def pairs(src: list[int], dst: list[int]) -> list[str]:
        """The proxy pairs of connections opened by a node of `src` to a node of `dst`."""
        return [f"{kind} {a}->{b}" for a in src for b in dst if a != b for kind in ("raft", "fwd")]

    def cut(self, src: list[int], dst: list[int]) -> list[str]:
        """Hold every byte sent from a node of `src` to a node of `dst`: on the connections
        src opened (their requests) and on those dst opened (their replies). Returns the
        pairs touched."""
        out, back = self.pairs(src, dst), self.pairs(dst, src)
        self.net().blackhole(out, up=True, down=False)
        self.net().blackhole(back, up=False, down=True)
        return out + back

    def cut_off(self, node: int) -> list[str]:
        """Hold every byte between `node` and the others, both ways: a partition."""
        others = [i for i in self.ids if i != node]
        return self.cut([node], others) + self.cut(others, [node])


def _tls(c: MetastoreCluster) -> ClientTls | None:
    return c.client_tls if isinstance(c, ChaosCluster) else None


def _client(c: MetastoreCluster, nodes: list[int], timeout_ms: int) -> SyncMetastoreClient:
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in nodes]
    return SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=timeout_ms, tls=_tls(c))


def _workload_client(c: MetastoreCluster, timeout_ms: int) -> SyncMetastoreClient:
    """A failover client of every node, through the proxy when there is one."""
    ports = c.workload_ports if isinstance(c, ChaosCluster) else c.client_ports
    endpoints = [f"127.0.0.1:{ports[i]}" for i in c.ids]
    return SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=timeout_ms, tls=_tls(c))


def _outcome(exc: MetastoreError) -> str:
    return "unknown" if exc.code in UNKNOWN_CODES else "fail"


def _commit(client: SyncMetastoreClient, h: History, txn_id: str) -> dict[str, Any]:
    """One recorded two-table commit: op with outcome, ts if ok, and t0/t1 (invoke/complete)."""
    files = {t: f"_txn/{txn_id}/{t}.parquet" for t in TABLES}
    op: dict[str, Any] = {"txn_id": txn_id, "files": files, "outcome": "unknown"}
    writes = [
        {
            "table": t,
            "schema_version": 1,
            "add": [{"path": files[t], "size_bytes": 10, "row_count": 1}],
        }
        for t in TABLES
    ]
    op["t0"] = time.monotonic()
    with h.lock:
        h.commits[txn_id] = op
    try:
        result = client.commit(txn_id, writes)
        op.update(outcome="ok", ts=int(result["ts"]))
    except MetastoreError as exc:
        # details: what the client tried (its last answer is the code; see docs/chaos.md)
        op.update(outcome=_outcome(exc), code=exc.code.value, details=exc.details)
    op["t1"] = time.monotonic()
    return op


def _committer(c: MetastoreCluster, h: History, stop: threading.Event, tag: str) -> None:
    client = _workload_client(c, 4_000)
    n = 0
    try:
        while not stop.is_set():
            n += 1
            _commit(client, h, f"{tag}-{n}")
            time.sleep(0.02)
    finally:
        client.close()


def _ddl(c: MetastoreCluster, h: History, stop: threading.Event) -> None:
    client = _workload_client(c, 6_000)
    n = 0
    try:
        while not stop.is_set():
            n += 1
            column = f"c{n}"
            op: dict[str, Any] = {"column": column, "outcome": "unknown"}
            with h.lock:
                h.ddls.append(op)
            try:
                client.ddl(
                    f"ALTER TABLE {DDL_TABLE} ADD COLUMN {column} INT", request_id=f"ddl-{n}"
                )
                op["outcome"] = "ok"
            except MetastoreError as exc:
                op.update(outcome=_outcome(exc), code=exc.code.value)
            time.sleep(0.3)
    finally:
        client.close()


def _reader(c: MetastoreCluster, h: History, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    clients = {i: _client(c, [i], 1_500) for i in c.ids}
    try:
        while not stop.is_set():
            for node, client in clients.items():
                try:
                    st = client.status()
                except MetastoreError:
                    continue
                with h.lock:
                    h.terms.add(int(st["term"]))
                    if st.get("ready"):
                        h.safe_times.setdefault(node, []).append(int(st["safe_time"]))
                    acked = [o["ts"] for o in h.commits.values() if o["outcome"] == "ok"]
                if not acked:
                    continue
                ts = rng.choice(acked)
                table = rng.choice(TABLES)
                try:
                    files = client.files(table, as_of=ts)["files"]
                except MetastoreError:
                    continue
                with h.lock:
                    h.reads.append((node, table, ts, frozenset(f["path"] for f in files)))
            time.sleep(0.05)
    finally:
        for client in clients.values():
            client.close()


def _isolated_prober(
    c: MetastoreCluster, h: History, stop: threading.Event, node: int, tag: str, kind: str
) -> None:
    """While `node` is cut off: commits (kind "commit") or linearizable reads (kind
    "committed_txn") sent to it alone. It can do neither without a quorum: each must end
    refused, unknown or timed out while the node is cut off."""
    client = _client(c, [node], PROBE_TIMEOUT_MS)
    n = 0
    try:
        while not stop.is_set():
            n += 1
            if kind == "commit":
                op = _commit(client, h, f"{tag}-{n}")
                t0, t1, outcome, what = op["t0"], op["t1"], op["outcome"], op["txn_id"]
            else:
                with h.lock:
                    acked = [o["txn_id"] for o in h.commits.values() if o["outcome"] == "ok"]
                txn_id = acked[-1] if acked else "never-committed"
                t0 = time.monotonic()
                try:
                    record = client.committed_txn(txn_id)
                    outcome, what = "ok", f"({txn_id}) -> {record.get('txn')}"
                except MetastoreError as exc:
                    outcome, what = _outcome(exc), f"({txn_id}): {exc.code.value}"
                t1 = time.monotonic()
            with h.lock:
                h.isolated_ops.append((node, kind, t0, t1, outcome, what))
            time.sleep(0.02)
    finally:
        client.close()


@contextmanager
def _isolated(
    c: MetastoreCluster, h: History, node: int, tag: str, cut: Callable[[], object]
) -> Iterator[Isolation]:
    """Cut `node` off (`cut`), then record it as cut off from then until the block ends (the
    caller heals after leaving it) and probe it meanwhile."""
    cut()
    iso = Isolation(node=node, cut_at=time.monotonic())
    stop = threading.Event()
    probers = [
        threading.Thread(target=_isolated_prober, args=(c, h, stop, node, tag, kind), daemon=True)
        for kind in ("commit", "committed_txn")
    ]
    for prober in probers:
        prober.start()
    try:
        yield iso
    finally:
        iso.healed_at = time.monotonic()
        with h.lock:
            h.isolations.append(iso)
        stop.set()
        for prober in probers:
            prober.join(timeout=30)


def _clock_wedged(statuses: dict[int, dict[str, Any] | None]) -> bool:
    """No node leads, and every one is fenced for its clock by a quorum of its peers, with no
    fresh clock sample left to justify (or lift) the fence. (A follower may still name the
    old leader: a fenced node does not tick, so it never times its leader out.)"""
    return bool(statuses) and all(
        st is not None
        and st.get("role") != "leader"
        and "fellow voters" in st.get("clock_fenced", "")
        and not st.get("clock_offsets_ms")
        for st in statuses.values()
    )


class _WedgeWatch:
    """Tells when the known clock-fence wedge has lasted WEDGE_S; then records it and restarts
    every node (a restart clears a node's clock fence)."""

    def __init__(self, c: MetastoreCluster, h: History) -> None:
        self.c, self.h = c, h
        self.since: float | None = None

    def check(self, statuses: dict[int, dict[str, Any] | None]) -> bool:
        if not _clock_wedged(statuses):
            self.since = None
            return False
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if now - self.since < WEDGE_S:
            return False
        fences = {i: (st or {}).get("clock_fenced") for i, st in statuses.items()}
        self.h.wedges.append(
            f"nodes {sorted(statuses)} without a leader for {now - self.since:.0f} s, all fenced "
            f"for their clocks with no fresh clock sample: {fences}"
        )
        for i in list(self.c.procs):
            self.c.kill(i)
        for i in self.c.ids:
            self.c.start(i)
        self.since = None
        return True


def _leader(c: MetastoreCluster, h: History, wait_s: float = 30.0) -> int | None:
    """The current leader (of the highest term, should a deposed one not know it yet), waiting
    (bounded) for one after an earlier fault."""
    deadline = time.monotonic() + wait_s
    wedge = _WedgeWatch(c, h)
    while True:
        leaders = []
        statuses = {i: c.try_status(i) for i in list(c.procs)}
        for i, st in statuses.items():
            if st and st.get("role") == "leader":
                leaders.append((int(st["term"]), i))
        if leaders:
            return max(leaders)[1]
        if time.monotonic() > deadline:
            return None
        if wedge.check(statuses):
            deadline = time.monotonic() + wait_s
        time.sleep(0.1)


def _wait_ready(c: MetastoreCluster, h: History) -> None:
    """Until every node is ready (MetastoreCluster.wait_ready, which raises with the statuses
    and the log tails), getting past the known clock-fence wedge."""
    deadline = time.monotonic() + READY_WAIT_S
    wedge = _WedgeWatch(c, h)
    while time.monotonic() < deadline:
        statuses = {i: c.try_status(i) for i in list(c.procs)}
        if all(st and st["ready"] and st["initialized"] for st in statuses.values()):
            leaders = {st["leader"] for st in statuses.values() if st}
            if len(leaders) == 1 and 0 not in leaders:
                return
        if wedge.check(statuses):
            deadline = time.monotonic() + READY_WAIT_S
        time.sleep(0.1)
    c.wait_ready(timeout_s=1.0)


def _effect(before: PairStats, after: PairStats) -> dict[str, int]:
    """What the proxy did between two totals (only the fault counters that moved)."""
    keys = ("stalls", "held_connects", "delayed_chunks", "reset_by_fault", "refused")
    return {
        k: getattr(after, k) - getattr(before, k)
        for k in keys
        if getattr(after, k) > getattr(before, k)
    }


def _fault(c: ChaosCluster, rng: random.Random, kind: str, h: History, n: int) -> None:
    if kind in NETWORK_FAULTS + OVERLAPPING_FAULTS + CLIENT_FAULTS:
        _network_fault(c, rng, kind, h, n)
        return
    hold_s = rng.uniform(0.5, 2.5)
    if kind in ("kill_leader", "kill_follower"):
        leader = _leader(c, h)
        if leader is None:
            return
        candidates = [leader] if kind == "kill_leader" else [i for i in c.ids if i != leader]
        victim = rng.choice([i for i in candidates if i in c.procs] or [leader])
        c.kill(victim)
        time.sleep(hold_s)
        c.start(victim)
    elif kind == "kill_all":
        for i in list(c.procs):
            c.kill(i)
        time.sleep(hold_s)
        for i in c.ids:
            c.start(i)
    elif kind == "skew":
        # A follower restarted with its clock far ahead (beyond CSmax): it must fence itself
        # (NOT_READY, no campaigns) while the others go on; then it comes back with a good clock.
        leader = _leader(c, h)
        if leader is None:
            return
        victim = rng.choice([i for i in c.ids if i != leader and i in c.procs] or [leader])
        c.kill(victim)
        c.start(victim, env={FAULT_CLOCK_OFFSET_ENV: str(SKEW_MS)})
        deadline = time.monotonic() + max(hold_s, 5.0)
        while time.monotonic() < deadline:
            st = c.try_status(victim)
            if st and st.get("clock_fenced"):
                h.fences_seen += 1
                break
            time.sleep(0.1)
        time.sleep(hold_s)
        c.kill(victim)
        c.start(victim)
    elif kind == "pause":
        victim = rng.choice(list(c.procs))
        proc = c.procs[victim]
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(hold_s)
        finally:
            proc.send_signal(signal.SIGCONT)
    h.faults.append(f"{kind} (held {hold_s:.1f} s)")


def _hold_until_leadership_moves(
    c: MetastoreCluster, h: History, leader: int, others: list[int], hold_s: float, iso: Isolation
) -> str:
    """With `leader` cut off from `others`: wait until one of the others leads and the old
    leader has stepped down (bounded by PARTITION_MAX_S), and at least `hold_s`. Asserts both
    happened (except for the known clock-fence wedge, recorded instead); returns what it saw."""
    new_leader: tuple[int, float] | None = None
    stepped_down: float | None = None
    while time.monotonic() - iso.cut_at < PARTITION_MAX_S:
        if new_leader is None:
            for i in others:
                st = c.try_status(i)
                if st and st.get("role") == "leader":
                    new_leader = (i, time.monotonic() - iso.cut_at)
        if stepped_down is None:
            st = c.try_status(leader)
            if st and st.get("role") != "leader":
                stepped_down = time.monotonic() - iso.cut_at
        elapsed = time.monotonic() - iso.cut_at
        if new_leader and stepped_down is not None and elapsed >= hold_s:
            break
        time.sleep(0.05)
    where = f"leader {leader} cut off from {others}"
    assert stepped_down is not None, (
        f"{where}: the old leader still said it led after {PARTITION_MAX_S} s"
    )
    if new_leader is None:
        majority = {i: c.try_status(i) for i in others}
        if _clock_wedged(majority):
            h.wedges.append(f"{where}: the others never elected a leader: {majority}")
            return (
                f"the others, all clock-fenced, elected no leader (known bug); old leader "
                f"stepped down after {stepped_down:.1f} s"
            )
        raise AssertionError(f"{where}: no new leader in {PARTITION_MAX_S} s: {majority}")
    return (
        f"node {new_leader[0]} led after {new_leader[1]:.1f} s, old leader stepped down after "
        f"{stepped_down:.1f} s"
    )


def _slow_links(c: ChaosCluster, rng: random.Random) -> None:
    """Every peer link delayed by DELAY_MS (drawn per link) plus jitter, until healed."""
    for name in c.peer_pairs():
        c.net().delay([name], rng.uniform(*DELAY_MS), DELAY_JITTER_MS)


def _network_fault(c: ChaosCluster, rng: random.Random, kind: str, h: History, n: int) -> None:
    """One network fault through the proxy; recorded in h.faults only if the proxy saw it act
    (and, for a partitioned leader, the cluster reacted as it must)."""
    net = c.net()
    before = net.total()
    others: list[int]
    try:
        if kind == "partition":
            # The leader alone on one side, both directions.
            hold_s = rng.uniform(1.0, 2.0)
            leader = _leader(c, h)
            if leader is None:
                return
            others = [i for i in c.ids if i != leader]
            with _isolated(c, h, leader, f"iso{n}", partial(c.cut_off, leader)) as iso:
                moved = _hold_until_leadership_moves(c, h, leader, others, hold_s, iso)
            net.heal()
            desc = f"partition (leader {leader} cut off {iso.healed_at - iso.cut_at:.1f} s; {moved}"
        elif kind == "partition_minority":
            hold_s = rng.uniform(0.8, 2.0)
            leader = _leader(c, h)
            victim = rng.choice([i for i in c.ids if i != leader])
            others = [i for i in c.ids if i != victim]
            mode = rng.choice(["blackhole", "reject"])
            cut = (
                partial(c.cut_off, victim)
                if mode == "blackhole"
                else partial(net.reject, c.pairs([victim], others) + c.pairs(others, [victim]))
            )
            with _isolated(c, h, victim, f"iso{n}", cut):
                time.sleep(hold_s)
            net.heal()
            desc = f"partition_minority (follower {victim} cut off by {mode}, {hold_s:.1f} s"
        elif kind == "asymmetric":
            hold_s = rng.uniform(0.8, 2.0)
            leader = _leader(c, h)
            if leader is None:
                return
            others = [i for i in c.ids if i != leader]
            direction = rng.choice(["in", "out"])
            # "in": the leader still sends but hears nothing (it must step down for want of a
            # quorum, and the others then elect one); "out": it hears but cannot send (the
            # others elect a leader, whose higher term deposes it).
            cut = (
                partial(c.cut, others, [leader])
                if direction == "in"
                else partial(c.cut, [leader], others)
            )
            with _isolated(c, h, leader, f"iso{n}", cut) as iso:
                moved = _hold_until_leadership_moves(c, h, leader, others, hold_s, iso)
            net.heal()
            what = "hears nothing" if direction == "in" else "cannot send"
            desc = f"asymmetric (leader {leader} {what} {iso.healed_at - iso.cut_at:.1f} s; {moved}"
        elif kind == "partition_kill":
            # The cut-off leader is killed -9 and restarted while still cut off: it comes back
            # with the tail it could not commit, must not lead or serve alone, and must give
            # that tail up for the new leader's log once the partition heals.
            hold_s = rng.uniform(1.0, 2.0)
            leader = _leader(c, h)
            if leader is None:
                return
            others = [i for i in c.ids if i != leader]
            with _isolated(c, h, leader, f"iso{n}", partial(c.cut_off, leader)) as iso:
                moved = _hold_until_leadership_moves(c, h, leader, others, hold_s, iso)
                c.kill(leader)
                c.start(leader)
                time.sleep(rng.uniform(0.5, 1.5))
            net.heal()
            desc = (
                f"partition_kill (leader {leader} cut off {iso.healed_at - iso.cut_at:.1f} s, "
                f"killed and restarted inside; {moved}"
            )
        elif kind == "delay_kill":
            # Every link slow, and then the leader is killed: the election runs on slow links.
            hold_s = rng.uniform(1.0, 2.5)
            _slow_links(c, rng)
            leader = _leader(c, h)
            if leader is not None:
                c.kill(leader)
            time.sleep(hold_s)
            if leader is not None:
                c.start(leader)
            net.heal()
            desc = (
                f"delay_kill ({DELAY_MS[0]}-{DELAY_MS[1]} ms, leader {leader} killed, "
                f"{hold_s:.1f} s"
            )
        elif kind == "client_partition":
            # The clients lose the leader and one follower (a bad switch on their side); the
            # nodes do not. The clients must go on through the one follower left, which
            # forwards to the leader; a request that hung is retried there by txn id / request
            # id and must not apply twice.
            hold_s = rng.uniform(1.5, 3.0)
            leader = _leader(c, h)
            if leader is None:
                return
            reachable = rng.choice([i for i in c.ids if i != leader])
            with h.lock:
                acked_before = sum(1 for o in h.commits.values() if o["outcome"] == "ok")
            net.blackhole([f"client->{i}" for i in c.ids if i != reachable])
            time.sleep(hold_s)
            with h.lock:
                acked_during = (
                    sum(1 for o in h.commits.values() if o["outcome"] == "ok") - acked_before
                )
            net.heal()
            h.client_cut_acks.append(acked_during)
            desc = (
                f"client_partition (clients reach only follower {reachable} for {hold_s:.1f} s, "
                f"{acked_during} commits acknowledged meanwhile"
            )
        elif kind == "delay":
            hold_s = rng.uniform(1.0, 2.5)
            _slow_links(c, rng)
            time.sleep(hold_s)
            net.heal()
            desc = f"delay ({DELAY_MS[0]}-{DELAY_MS[1]} ms on every link, {hold_s:.1f} s"
        elif kind == "flaky":
            # Connections reset at random; a little delay keeps bytes in flight in the proxy,
            # so a reset loses some (as a real reset loses what was in the network).
            hold_s = rng.uniform(1.0, 2.5)
            pairs = c.peer_pairs()
            net.delay(pairs, rng.uniform(5, 30), 5)
            resets = 0
            deadline = time.monotonic() + hold_s
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.05, 0.3))
                resets += net.close_connections(rng.sample(pairs, rng.randint(1, len(pairs))))
            net.heal()
            desc = f"flaky ({resets} connections reset in {hold_s:.1f} s"
        else:
            raise AssertionError(f"unknown fault {kind}")
    finally:
        net.heal()
    effect = _effect(before, net.total())
    if effect or kind in CLIENT_FAULTS:
        # A client cut acts on the nodes' reachability, whether or not a client was using the
        # cut paths at that moment (the proxy sees traffic only if one was).
        h.faults.append(f"{desc}; proxy {effect})")


def _schedule(seed: int) -> tuple[random.Random, list[str]]:
    """The seed's fault schedule: every fault of the set once, in a random order, then random
    ones, about one per 5 s of DURATION_S. (For CHAOS_FAULTS=process this is the schedule each
    seed had before network faults existed.)"""
    rng = random.Random(seed)
    kinds = list(FAULT_SETS[FAULTS])
    rng.shuffle(kinds)
    extra = max(0, int(DURATION_S / 5) + 1 - len(kinds))
    return rng, kinds + [rng.choice(kinds) for _ in range(extra)]


@contextmanager
def _chaos_cluster(directory: Path, seed: int, network: bool) -> Iterator[ChaosCluster]:
    proxy = NetProxy(seed=seed) if network else None
    if proxy is not None:
        proxy.start()
    config = write_cluster(directory, 3, dd_ms=300, cs_max_ms=100)
    ca_file: Path | None = None
    if TLS:
        certs = generate_dev_certs(directory / "tls", node_ids=[1, 2, 3])
        ca_file = certs.ca_cert
        tls_dir = ca_file.parent
        with config.open("a") as f:
            f.write(
                f'\n[tls]\nca_file = "{ca_file}"\n'
                f'cert_file = "{tls_dir}/node-{{node_id}}.crt"\n'
                f'key_file = "{tls_dir}/node-{{node_id}}.key"\n'
            )
    c = ChaosCluster(config, proxy)
    if ca_file is not None:
        c.client_ssl = client_context(ca_file=ca_file)
        c.client_tls = ClientTls(ca_file=ca_file)
    try:
        c.start_all()
        c.wait_ready()
        admin = _client(c, c.ids, 10_000)
        admin.ddl("CREATE NAMESPACE ch")
        for t in (*TABLES, DDL_TABLE):
            admin.ddl(f"CREATE TABLE {t} (id BIGINT)")
        admin.close()
        yield c
    finally:
        c.stop_all()
        if proxy is not None:
            proxy.stop()


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_history_is_consistent(tmp_path: Path, seed: int) -> None:
    rng, schedule = _schedule(seed)
    network = any(kind in NETWORK_FAULTS + OVERLAPPING_FAULTS + CLIENT_FAULTS for kind in schedule)
    with _chaos_cluster(tmp_path, seed, network) as c:
        h = History()
        stop = threading.Event()
        workers = [
            threading.Thread(target=_committer, args=(c, h, stop, f"w{i}"), daemon=True)
            for i in range(2)
        ]
        workers.append(threading.Thread(target=_ddl, args=(c, h, stop), daemon=True))
        workers.append(threading.Thread(target=_reader, args=(c, h, stop, seed), daemon=True))
        for w in workers:
            w.start()
        try:
            gap_s = DURATION_S / (len(schedule) + 1)
            for n, kind in enumerate(schedule):
                time.sleep(gap_s)
                started = time.monotonic()
                fired = len(h.faults)
                _fault(c, rng, kind, h, n)
                if len(h.faults) > fired:
                    h.faults[-1] += f" [{time.monotonic() - started:.1f} s]"
            time.sleep(gap_s)
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=30)
            if c.proxy is not None:
                c.proxy.heal()
            for i in c.ids:  # heal: every node running and not paused
                if i in c.procs:
                    c.procs[i].send_signal(signal.SIGCONT)
                else:
                    c.start(i)
        healed = time.monotonic()
        _wait_ready(c, h)
        print(f"chaos seed {seed}: ready {time.monotonic() - healed:.1f} s after the heal")
        _check(c, h, seed, schedule)
        # The wedge this watch found (every node clock-fenced, no leader, for good) was a
        # product bug: network delay was read as clock offset, and a fence by a quorum never
        # lapsed. Fixed in raft/node.py (round-trip clock samples); it must not come back.
        assert not h.wedges, (
            f"the cluster wedged with every node clock-fenced and no leader (the nodes were "
            f"restarted to check the rest; seed {seed}, CHAOS_FAULTS={FAULTS}): {h.wedges}"
        )


def _check(c: MetastoreCluster, h: History, seed: int, schedule: list[str]) -> None:
    where = (
        f"(seed {seed}; replay with CHAOS_SEEDS={seed} CHAOS_FAULTS={FAULTS}; "
        f"faults: {h.faults}; logs under {c.dir})"
    )
    final = _client(c, c.ids, 10_000)
    try:
        now_ts = final.clock.now()
        time.sleep(0.5)  # let safe time pass now_ts everywhere
        live = {t: {f["path"] for f in final.files(t, as_of=now_ts)["files"]} for t in TABLES}
        acked = [o for o in h.commits.values() if o["outcome"] == "ok"]
        assert len(acked) >= MIN_ACKED_COMMITS, f"only {len(acked)} acknowledged commits {where}"
        for op in h.commits.values():
            present = [op["files"][t] in live[t] for t in TABLES]
            assert all(present) or not any(present), f"half of {op['txn_id']} visible {where}"
            if op["outcome"] == "ok":
                assert all(present), f"acknowledged commit {op['txn_id']} lost {where}"
                record = final.committed_txn(op["txn_id"]).get("txn")
                assert record is not None and record["ts"] == op["ts"], (
                    f"{op['txn_id']}: acknowledged at {op['ts']}, log says {record} {where}"
                )
            elif op["outcome"] == "fail":
                assert not any(present), (
                    f"refused commit {op['txn_id']} visible ({op['code']}, {op['details']}) {where}"
                )
        _check_real_time_order(acked, where)
        # The same answer on every node for the same timestamp, equal to the final one.
        finals: dict[tuple[str, int], frozenset[str]] = {}
        for node, table, ts, paths in h.reads:
            key = (table, ts)
            if key not in finals:
                finals[key] = frozenset(f["path"] for f in final.files(table, as_of=ts)["files"])
            assert paths == finals[key], f"node {node} answered {table}@{ts} differently {where}"
        assert h.reads, f"no read was answered {where}"
        columns = {col["name"] for col in final.schema_at(DDL_TABLE)["schema"]["columns"]}
        for op in h.ddls:
            if op["outcome"] == "ok":
                assert op["column"] in columns, f"acknowledged DDL {op['column']} lost {where}"
        for node, samples in h.safe_times.items():
            for before, after in itertools.pairwise(samples):
                assert after >= before, f"node {node} safe time went back {where}"
        probed = _check_isolated(h, where)
        if any(kind not in CLIENT_FAULTS for kind in schedule):
            assert len(h.terms) >= 2, f"no leader change happened {where}"
        assert len(h.faults) == len(schedule), f"not every fault fired {where}"
        skews = sum(kind == "skew" for kind in schedule)
        assert h.fences_seen == skews, f"a skewed node did not fence itself {where}"
        outcomes = [o["outcome"] for o in h.commits.values()]
        print(  # shown with -s (make chaos): what the run actually exercised
            f"chaos seed {seed} ({FAULTS}{', TLS' if TLS else ''}): commits ok/fail/unknown "
            f"{outcomes.count('ok')}/{outcomes.count('fail')}/{outcomes.count('unknown')}, "
            f"DDL ok {sum(o['outcome'] == 'ok' for o in h.ddls)}/{len(h.ddls)}, "
            f"reads {len(h.reads)}, ops sent to cut-off nodes {probed} (none acknowledged), "
            f"terms {sorted(h.terms)}, faults {h.faults}"
        )
    finally:
        final.close()


def _check_real_time_order(acked: list[dict[str, Any]], where: str) -> None:
    """A commit acknowledged before another commit was sent has the smaller ts (commit ts
    strictly increase in log order, and the later one is appended after the earlier one
    committed)."""
    by_end = sorted(acked, key=lambda o: o["t1"])
    i = 0
    latest: dict[str, Any] | None = None  # the largest ts among commits acked so far
    for op in sorted(acked, key=lambda o: o["t0"]):
        while i < len(by_end) and by_end[i]["t1"] < op["t0"]:
            if latest is None or by_end[i]["ts"] > latest["ts"]:
                latest = by_end[i]
            i += 1
        assert latest is None or op["ts"] > latest["ts"], (
            f"{op['txn_id']} (ts {op['ts']}) was sent after {latest['txn_id']} was acknowledged "
            f"(ts {latest['ts']}) but is ordered before it {where}"
        )


def _check_isolated(h: History, where: str) -> int:
    """Nothing sent to a node while it was cut off was acknowledged: a commit needs a quorum
    of acknowledgements and a linearizable read a quorum confirming the leadership, and the node
    could reach none. (Operations that outlived the heal may have succeeded.) Returns how many
    operations were checked."""
    checked = 0
    for node, op, t0, t1, outcome, what in h.isolated_ops:
        windows = [
            i for i in h.isolations if i.node == node and i.cut_at <= t0 and t1 <= i.healed_at
        ]
        if not windows:
            continue
        checked += 1
        assert outcome != "ok", (
            f"node {node} was cut off from {windows[0].cut_at:.2f} to {windows[0].healed_at:.2f} "
            f"(monotonic s) and acknowledged {op} {what} sent at {t0:.2f}, answered at {t1:.2f} "
            f"{where}"
        )
    return checked
