"""Seeded simulation of the Raft core: random schedules over an unreliable network, with checks.

Key idea: everything below the core's `Ready` contract is simulated and driven by one
`random.Random(seed)`, so a seed *is* a schedule. Per step one event happens — a burst of
messages is delivered (each possibly reordered, dropped or duplicated), a node handles its Ready
(or crashes
after `ready()` and before persisting), time passes, the leader proposes, the network is
partitioned or healed, a node crashes or restarts, compacts its log, a leader transfers
leadership, the membership changes, a ReadIndex round starts — and then the `Checker` verifies
Raft's safety properties. A failing seed raises `SimulationFailure` carrying the seed, the exact
command that replays it and the last events.

Properties checked after every step (incrementally: a step only touches one or two nodes):

* election safety — at most one leader per term;
* log matching — the same (index, term) means the same entry with the same predecessor term,
  on every node's in-memory log and on every disk, so equal (index, term) implies an identical
  prefix; Tm strictly increasing along every log; `RaftLog.validate()`;
* leader completeness — every entry known committed anywhere, committed in a term <= T, is in
  the log of every leader of term T;
* state-machine safety — every node's applied sequence is a prefix of one global sequence, and
  every committed index has one term;
* no acknowledged proposal lost — a proposal is acknowledged when its proposer applied its
  (term, index); every node that applied past that index has it, and at the end all members do;
* safe time (`core.applied_tm`) never decreases on a node, also across crashes (a restarted
  node replays up to its persisted commit before anything else happens), and it equals the Tm
  of the last applied entry;
* snapshot coverage — the snapshot a node holds (what it sends a laggard) is at or above the
  base of its log, and does not go back while the node runs;
* ReadIndex — a read's index covers everything known committed when the read started;
* check-quorum lease (with check_quorum) — a voter that heard from its leader fewer than
  `election_ticks` of its own ticks ago grants no vote or pre-vote to another node, unless the
  request is a leadership transfer's (`force`); the driver's leader lease rests on this (a
  restart forgets it: the driver refuses votes for an election timeout after one);
* served safe time — while a node reports `caught_up()` (it serves reads), its safe time is
  at or above any safe time it served before, across restarts and power losses.

Extended faults (`SimParams.extended`, pytest `--sim-extended-seeds`; what a real deployment adds to
the classic schedule, drawn from a second random stream so that classic seeds replay exactly as
before):

* power loss — a crash also loses the WAL's records written since its last fdatasync: the
  driver writes a Ready that only moves the commit index without syncing (`raft/wal.py`
  `append_syncs`), so the restarted node's commit index goes back to the one of its last synced
  write (entries, term and vote are always synced before anything depends on them);
* crash after an early apply — the driver applies committed entries that were already durable
  before a Ready's write (`raft.node.applicable_before_persist`), and its readers see that safe
  time during the write; a crash before the write then restarts the node below it (its commit
  index was in the lost write);
* stale replays — a message delivered long ago (any term, any sender, from before restarts) is
  delivered once more, as a network that duplicates and delays without bound would;
* one-way cuts — a partition event may also cut one direction of a node's links (it hears the
  others but they do not hear it, or the reverse), until the next heal;
* background snapshots — a node's own snapshot is taken at its applied index and only later
  made durable and its log dropped (`raft.node` writes it in a thread and renames it into
  place from the loop): meanwhile the node applies more, changes membership, installs a
  leader's snapshot or crashes (the unfinished one is then lost).

At the end the network heals, every member restarts, and the cluster must converge (a leader,
every member applied everything committed and reports caught up, so it serves again, every
acknowledged proposal applied everywhere) within a bounded number of rounds.
"""

from __future__ import annotations

import bisect
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from raft.core.conf import decode_conf
from raft.core.errors import RaftCoreError
from raft.core.memnet import Applied, MemNode
from raft.core.ready import CoreConfig, Ready
from raft.core.types import (
    AppendEntries,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    InstallSnapshot,
    Message,
    NodeId,
    RequestVote,
    Snapshot,
    SnapshotMeta,
    TimeoutNow,
    VoteResponse,
)
from raft.node import applicable_before_persist

# ---- limits and knobs (named here so a reader sees the whole budget at once) ----------------

# Events per seed. 500 seeds take about 8 s on one core (measured); longer schedules mostly
# repeat what more seeds find anyway.
SIM_STEPS_PER_SEED = 600
# Rounds (tick every node, then deliver until quiet) allowed for the final convergence. The
# plain protocol needs many more than pre-vote: a voter whose log is behind keeps raising the
# term and resetting the others' timers (seed 8982 took 97 rounds); with pre-vote, seeds 0-8999
# took at most 25 rounds (measured), so a pre-vote seed over the tighter bound is a liveness
# regression, not bad luck.
SIM_CONVERGE_ROUNDS_MAX = 120
SIM_CONVERGE_ROUNDS_MAX_PRE_VOTE = 60
# Ready-and-deliver rounds within one quiet-down of the final phase before we call it a livelock.
SIM_SETTLE_ROUNDS_MAX = 1_000
# Most messages delivered by one delivery event.
SIM_DELIVERY_BURST_MAX = 4
# Messages in flight; beyond this the oldest is lost (a bounded network buffer).
SIM_IN_FLIGHT_MAX = 256
# Events kept for the failure report.
SIM_TRACE_EVENTS = 40
# Node ids handed to fresh nodes joining through a membership change start here.
SIM_FRESH_NODE_ID_MIN = 10
# Extended faults: messages remembered for stale replays, the chance that one delivery is a
# replay, and the chance that a crash is a power loss (loses the unsynced commit index).
SIM_REPLAY_HISTORY = 512
SIM_REPLAY_CHANCE = 0.03
SIM_POWER_LOSS_CHANCE = 0.5
# Extended faults: the chance that a partition event also cuts one direction of a node's links.
SIM_ONE_WAY_CUT_CHANCE = 0.4
# Extended faults: the chance per step that a background snapshot in progress is finished.
SIM_SNAPSHOT_FINISH_CHANCE = 0.1

# Relative frequency of each event. Deliveries and Readies dominate, as on a real network; time
# passes often enough for elections; faults are rare enough that the cluster makes progress
# between them.
_EVENT_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("deliver", 40),
    ("ready", 20),
    ("tick_all", 12),
    ("tick_one", 4),
    ("propose", 12),
    ("read", 2),
    ("partition", 0.6),
    ("heal", 1.5),
    ("crash", 0.5),
    ("restart", 1),
    ("compact", 1.5),
    ("transfer", 0.6),
    ("conf_change", 2),
)
_EVENT_NAMES = tuple(name for name, _ in _EVENT_WEIGHTS)
_EVENT_CUMULATIVE = tuple(
    sum(w for _, w in _EVENT_WEIGHTS[: k + 1]) for k in range(len(_EVENT_WEIGHTS))
)
_EVENT_WEIGHT_TOTAL = _EVENT_CUMULATIVE[-1]

# Removals may go down to one voter, the leader included: membership takes effect on append
# (dissertation section 4.1), so a leader that removes itself and crashes at any point leaves
# voters that count the new membership (seed 762 left a 2 -> 1 cluster leaderless when it took
# effect on apply).
_VOTERS_MIN_AFTER_REMOVAL = 1

# HLC: physical milliseconds in the high bits, a 16-bit logical counter in the low bits.
_TM_LOGICAL_BITS = 16


def replay_command(seed: int, *, extended: bool = False) -> str:
    counts = "--sim-seeds=0 --sim-extended-seeds=1" if extended else "--sim-seeds=1"
    return f".venv/bin/pytest tests/raft/test_simulation.py {counts} --sim-seed-start={seed} -x"


class InvariantViolation(Exception):
    """A Raft safety property failed in the simulation (the core has a bug)."""

    code = "sim_invariant_violated"

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant


class SimulationFailure(AssertionError):
    """A seed failed; the message holds everything needed to replay and understand it."""

    code = "sim_seed_failed"

    def __init__(
        self,
        seed: int,
        summary: str,
        cause: BaseException,
        trace: list[str],
        *,
        extended: bool = False,
    ) -> None:
        lines = [
            f"simulation seed {seed} failed ({summary})",
            f"  {type(cause).__name__}: {cause}",
            f"  replay: {replay_command(seed, extended=extended)}",
            f"  last {len(trace)} events (step: event):",
            *(f"    {t}" for t in trace),
        ]
        super().__init__("\n".join(lines))
        self.seed = seed


@dataclass(frozen=True, slots=True, kw_only=True)
class SimParams:
    """What a seed decides about its run before the first event."""

    seed: int
    nodes: int  # 3 on even seeds, 5 on odd ones
    voters: int  # the first `voters` nodes vote; the rest start as learners
    pre_vote: bool
    check_quorum: bool
    membership_changes: bool
    steps: int
    # Extended faults (see the module docstring); off for the classic schedules.
    power_loss: bool = False
    stale_replays: bool = False
    early_apply: bool = False
    one_way_cuts: bool = False
    background_snapshots: bool = False

    @property
    def extended(self) -> bool:
        return (
            self.power_loss
            or self.stale_replays
            or self.early_apply
            or self.one_way_cuts
            or self.background_snapshots
        )

    @staticmethod
    def for_seed(
        seed: int, steps: int = SIM_STEPS_PER_SEED, *, extended: bool = False
    ) -> SimParams:
        rng = random.Random(seed ^ 0x5EED)
        flavour = rng.random()
        nodes = 3 if seed % 2 == 0 else 5
        return SimParams(
            seed=seed,
            nodes=nodes,
            # One seed in ten: a lone voter with learners (no election ever needs a peer).
            voters=1 if seed % 10 in (4, 7) else nodes,
            # Mostly the production setting; a quarter of the seeds run the plain protocol.
            pre_vote=flavour < 0.75 or flavour > 0.9,
            check_quorum=flavour < 0.83,
            membership_changes=(seed // 2) % 3 == 0,
            steps=steps,
            power_loss=extended,
            stale_replays=extended,
            early_apply=extended,
            one_way_cuts=extended,
            background_snapshots=extended,
        )

    def describe(self) -> str:
        text = (
            f"{self.nodes} nodes, {self.voters} voters, pre_vote={self.pre_vote}, "
            f"check_quorum={self.check_quorum}, membership_changes={self.membership_changes}"
        )
        if self.extended:
            text += (
                f", power_loss={self.power_loss}, stale_replays={self.stale_replays}, "
                f"early_apply={self.early_apply}, one_way_cuts={self.one_way_cuts}, "
                f"background_snapshots={self.background_snapshots}"
            )
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    index: int
    term: int
    data: bytes
    position: int  # position in the global applied sequence


@dataclass(slots=True)
class SimResult:
    seed: int
    steps: int
    acked: int
    max_term: int
    committed: int
    crashes: int
    snapshots_sent: int
    leaders: int
    stats: dict[str, int] = field(default_factory=dict)


# ============================================================================ checker


class Checker:
    """Incremental safety checks over every node's memory, disk and state machine."""

    def __init__(self) -> None:
        self.leaders_by_term: dict[int, NodeId] = {}
        # (index, term) -> (tm, kind, data, term of the entry before it)
        self.registry: dict[tuple[int, int], tuple[int, EntryKind, bytes, int]] = {}
        self._log_cache: dict[tuple[NodeId, str], tuple[int, list[Entry]]] = {}
        # committed_terms[i - 1]: term of committed index i (None: never seen, compacted first)
        self.committed_terms: list[int | None] = []
        # The current term of the first node seen with index i committed: an upper bound on the
        # term in which i was committed, which is what leader completeness is relative to.
        self.commit_seen_term: list[int] = []
        self._commit_checked: dict[NodeId, int] = {}
        self._leader_checked: dict[tuple[NodeId, int], int] = {}
        self.applied_ref: list[tuple[int, int, int, bytes]] = []
        self._applied_list: dict[NodeId, list[Applied]] = {}
        self._applied_checked: dict[NodeId, int] = {}
        self.safe_tm: dict[NodeId, int] = {}
        # The highest safe time each node had while it reported caught_up (served reads at).
        self.served_tm: dict[NodeId, int] = {}
        # The index of the snapshot each node holds, which only moves forward while it runs.
        self.snapshot_held: dict[NodeId, int] = {}
        self.acks: list[Ack] = []  # sorted by index
        self._ack_indexes: list[int] = []
        self.sm_applied: dict[NodeId, int] = {}

    # ---- per node -------------------------------------------------------------------------

    def check_node(self, node: MemNode) -> None:
        core = node.core
        nid = node.id
        core.log.validate()
        log = core.log
        self._check_log(
            nid, "mem", log.snapshot, log.slice(log.first_index(), log.last_index() + 1)
        )
        self._check_log(nid, "disk", node.disk.snapshot.meta, list(node.disk.entries))
        held = core.snapshot.meta.index
        if held < log.snapshot.index:
            # The snapshot is what it sends a follower that needs compacted entries: one older
            # than the log's base leaves a gap the follower can never fill.
            raise InvariantViolation(
                "snapshot coverage",
                f"node {nid} holds snapshot {held}, but its log starts after {log.snapshot.index}",
            )
        if held < self.snapshot_held.get(nid, 0):
            raise InvariantViolation(
                "snapshot coverage",
                f"node {nid} went back from snapshot {self.snapshot_held[nid]} to {held}",
            )
        self.snapshot_held[nid] = held
        self._check_commit(node)
        self._check_applied(node)
        self._check_safe_time(node)
        self._check_acks_on(node)

    def forget_volatile(self, node: MemNode) -> None:
        """The node restarted from disk: its commit index may be lower now."""
        nid = node.id
        self._commit_checked[nid] = min(self._commit_checked.get(nid, 0), node.core.log.committed)
        # A received snapshot not yet persisted is lost with the crash.
        self.snapshot_held.pop(nid, None)

    def note_served(self, nid: NodeId, tm: int) -> None:
        """The node served reads at safe time `tm` (seen outside the core's own state)."""
        self.served_tm[nid] = max(self.served_tm.get(nid, 0), tm)

    def forget_safe_time(self, node: MemNode) -> None:
        """A power loss took the node's unsynced commit index: it replays less than it had
        applied, so its raw safe time may go back. What it serves must not (`served_tm`)."""
        self.safe_tm.pop(node.id, None)

    def _check_log(self, nid: NodeId, where: str, snap: SnapshotMeta, entries: list[Entry]) -> None:
        key = (nid, where)
        cached = self._log_cache.get(key)
        start = 0
        if cached is not None and cached[0] == snap.index:
            old = cached[1]
            n = min(len(old), len(entries))
            # Entries are shared objects, so the common case compares identities at C speed.
            if entries[:n] == old[:n]:
                start = n
            else:
                while start < n and entries[start] == old[start]:
                    start += 1
        if snap.index:
            known = self.registry.get((snap.index, snap.term))
            if known is not None and known[0] != snap.tm:
                raise InvariantViolation(
                    "log matching",
                    f"node {nid} {where} snapshot at {snap.index}/{snap.term} has tm {snap.tm}, "
                    f"the entry there has tm {known[0]}",
                )
            ct = self._committed_term(snap.index)
            if ct is not None and ct != snap.term:
                raise InvariantViolation(
                    "state-machine safety",
                    f"node {nid} {where} snapshot at index {snap.index} has term {snap.term}, "
                    f"committed term there is {ct}",
                )
        if start:
            prev = entries[start - 1]
            prev_index, prev_term, prev_tm = prev.index, prev.term, prev.tm
        else:
            prev_index, prev_term, prev_tm = snap.index, snap.term, snap.tm
        registry = self.registry
        for e in entries[start:]:
            if e.index != prev_index + 1 or e.term < prev_term:
                raise InvariantViolation(
                    "log shape",
                    f"node {nid} {where}: {e.index}/{e.term} follows {prev_index}/{prev_term}",
                )
            if e.tm <= prev_tm:
                raise InvariantViolation(
                    "Tm strictly increasing",
                    f"node {nid} {where}: entry {e.index}/{e.term} tm {e.tm} <= previous {prev_tm}",
                )
            value = (e.tm, e.kind, e.data, prev_term)
            known = registry.setdefault((e.index, e.term), value)
            if known != value:
                raise InvariantViolation(
                    "log matching",
                    f"node {nid} {where}: entry {e.index}/{e.term} is (tm, kind, data, prev "
                    f"term) {value}, elsewhere {known}",
                )
            prev_index, prev_term, prev_tm = e.index, e.term, e.tm
        self._log_cache[key] = (snap.index, entries)

    def _committed_term(self, index: int) -> int | None:
        if 0 < index <= len(self.committed_terms):
            return self.committed_terms[index - 1]
        return None

    def _check_commit(self, node: MemNode) -> None:
        core = node.core
        log = core.log
        nid = node.id
        committed = log.committed
        checked = self._commit_checked.get(nid, 0)
        for i in range(checked + 1, committed + 1):
            t = log.term(i)
            if t is None:
                continue  # compacted (it was checked while it was still in a log)
            if i <= len(self.committed_terms):
                known = self.committed_terms[i - 1]
                if known is None:
                    self.committed_terms[i - 1] = t
                elif known != t:
                    raise InvariantViolation(
                        "state-machine safety",
                        f"node {nid} committed index {i} with term {t}, "
                        f"elsewhere committed with term {known}",
                    )
                continue
            while len(self.committed_terms) < i - 1:
                self.committed_terms.append(None)
                self.commit_seen_term.append(core.term)
            self.committed_terms.append(t)
            self.commit_seen_term.append(core.term)
        self._commit_checked[nid] = committed

    def _check_applied(self, node: MemNode) -> None:
        nid = node.id
        lst = node.applied
        if self._applied_list.get(nid) is not lst:
            # Rebuilt from a snapshot (restart or install): check all of it again.
            self._applied_list[nid] = lst
            self._applied_checked[nid] = 0
        ref = self.applied_ref
        for k in range(self._applied_checked[nid], len(lst)):
            a = lst[k]
            item = (a.index, a.term, a.tm, a.data)
            if k < len(ref):
                if ref[k] != item:
                    raise InvariantViolation(
                        "state-machine safety",
                        f"node {nid} applied {item[:3]} as its command #{k}, "
                        f"another node applied {ref[k][:3]} there",
                    )
                continue
            if ref and ref[-1][0] >= a.index:
                raise InvariantViolation(
                    "state-machine safety", f"node {nid} applied index {a.index} out of order"
                )
            ct = self._committed_term(a.index)
            if ct is not None and ct != a.term:
                raise InvariantViolation(
                    "state-machine safety",
                    f"node {nid} applied {a.index}/{a.term}, committed term there is {ct}",
                )
            ref.append(item)
        self._applied_checked[nid] = len(lst)
        if lst and lst[-1].index > node.core.log.applied:
            raise InvariantViolation(
                "state-machine safety",
                f"node {nid} state machine holds index {lst[-1].index} beyond applied "
                f"{node.core.log.applied}",
            )

    def _check_safe_time(self, node: MemNode) -> None:
        core = node.core
        nid = node.id
        tm = core.applied_tm
        before = self.safe_tm.get(nid, 0)
        if tm < before:
            raise InvariantViolation(
                "safe time monotonic", f"node {nid} safe time went back from {before} to {tm}"
            )
        self.safe_tm[nid] = tm
        if core.caught_up():
            served = self.served_tm.get(nid, 0)
            if tm < served:
                raise InvariantViolation(
                    "served safe time monotonic",
                    f"node {nid} reports caught up at safe time {tm} (applied "
                    f"{core.log.applied}), but it served safe time {served} before",
                )
            self.served_tm[nid] = tm
        # Between installing a received snapshot (a step) and handling the Ready that applies
        # it, the log says "applied" while safe time still lags: a lower safe time is merely
        # conservative. Right after a Ready they must agree (`check_safe_time_exact`).
        if tm > core.log.tm_at(core.log.applied):
            raise InvariantViolation(
                "safe time",
                f"node {nid} safe time {tm} is ahead of the Tm of applied index {core.log.applied}",
            )

    def check_safe_time_exact(self, node: MemNode) -> None:
        core = node.core
        self.state_machine_caught_up(node)
        expected = core.log.tm_at(core.log.applied)
        if core.applied_tm != expected:
            raise InvariantViolation(
                "safe time",
                f"node {node.id} safe time {core.applied_tm} after its Ready is not the Tm "
                f"{expected} of applied index {core.log.applied}",
            )

    # ---- acknowledged proposals -------------------------------------------------------------

    def acknowledge(self, node: MemNode, index: int, term: int, data: bytes) -> None:
        position = next(
            (k for k in range(len(node.applied) - 1, -1, -1) if node.applied[k].index == index),
            -1,
        )
        if position < 0 or node.applied[position].data != data:
            raise InvariantViolation(
                "acknowledged proposal",
                f"node {node.id} applied {index}/{term} but its state machine lacks {data!r}",
            )
        # Make sure the global sequence already holds the position we record.
        self._check_applied(node)
        at = bisect.bisect(self._ack_indexes, index)
        self._ack_indexes.insert(at, index)
        self.acks.insert(at, Ack(index=index, term=term, data=data, position=position))

    def state_machine_caught_up(self, node: MemNode) -> None:
        """The node's state machine now holds everything its log calls applied (after a Ready
        or a restart; in between, an installed snapshot moves `log.applied` ahead of it)."""
        self.sm_applied[node.id] = node.core.log.applied

    def _check_acks_on(self, node: MemNode) -> None:
        applied = self.sm_applied.get(node.id, 0)
        at = bisect.bisect(self._ack_indexes, applied)
        if at == 0:
            return
        ack = self.acks[at - 1]  # the acknowledged entry with the greatest index <= applied
        lst = node.applied
        if len(lst) <= ack.position or lst[ack.position].index != ack.index:
            raise InvariantViolation(
                "acknowledged proposal lost",
                f"node {node.id} applied up to {applied} but lacks acknowledged "
                f"{ack.index}/{ack.term} {ack.data!r}",
            )

    def check_all_acks_applied(self, node: MemNode) -> None:
        lst = node.applied
        for ack in self.acks:
            if len(lst) <= ack.position or lst[ack.position].index != ack.index:
                raise InvariantViolation(
                    "acknowledged proposal lost",
                    f"after healing, node {node.id} never applied acknowledged "
                    f"{ack.index}/{ack.term} {ack.data!r}",
                )

    # ---- global -----------------------------------------------------------------------------

    def check_leaders(self, nodes: list[MemNode]) -> None:
        for node in nodes:
            core = node.core
            if not core.is_leader():
                continue
            term = core.term
            other = self.leaders_by_term.setdefault(term, node.id)
            if other != node.id:
                raise InvariantViolation(
                    "election safety", f"nodes {other} and {node.id} both led term {term}"
                )
            key = (node.id, term)
            start = self._leader_checked.get(key, 0)
            log = core.log
            for i in range(start + 1, len(self.committed_terms) + 1):
                t = self.committed_terms[i - 1]
                if t is None or self.commit_seen_term[i - 1] > term:
                    continue
                lt = log.term(i)
                if lt is None and i < log.snapshot.index:
                    continue  # compacted into the leader's snapshot, so it had it
                if lt != t:
                    raise InvariantViolation(
                        "leader completeness",
                        f"leader {node.id} of term {term} has {i}/{lt}, but {i}/{t} was "
                        f"committed by term {self.commit_seen_term[i - 1]}",
                    )
            self._leader_checked[key] = len(self.committed_terms)


# ============================================================================ simulation


class Simulation:
    """One seed: build the cluster, run the schedule, converge, check everything."""

    def __init__(self, params: SimParams) -> None:
        self.p = params
        self.rng = random.Random(params.seed)
        # Extended faults draw from their own stream: the classic draws stay where they were.
        self.fault_rng = random.Random(params.seed ^ 0xFA17ED)
        # Faults added later draw from streams of their own, so the seeds found (and pinned)
        # with the earlier ones keep their schedules when a seed runs with only those.
        self.cut_rng = random.Random(params.seed ^ 0xC07)
        self.snap_rng = random.Random(params.seed ^ 0x5A4)
        # Background snapshots taken but not yet made durable: node -> (snapshot, keep).
        self.snapshots_in_progress: dict[NodeId, tuple[Snapshot, int]] = {}
        self.checker = Checker()
        self.step_no = 0
        self.trace: deque[str] = deque(maxlen=SIM_TRACE_EVENTS)
        self.stats: dict[str, int] = {}
        self.phys_ms = 1_000
        self.skew_ms: dict[NodeId, int] = {}
        self.last_tm: dict[NodeId, int] = {}
        self.nodes: dict[NodeId, MemNode] = {}
        self.pool: list[Message] = []
        # Every message sent recently (stale replays draw from it).
        self.history: deque[Message] = deque(maxlen=SIM_REPLAY_HISTORY)
        # Per node: the commit index of its last synced WAL write (what a power loss keeps).
        self.synced_commit: dict[NodeId, int] = {}
        self.groups: dict[NodeId, int] = {}  # partition group per node; absent = group 0
        self.one_way_cuts: set[tuple[NodeId, NodeId]] = set()  # (src, dst) links that drop
        self.down: set[NodeId] = set()
        self.retired: set[NodeId] = set()  # removed from the cluster and shut down for good
        self.pending: dict[NodeId, dict[int, tuple[int, bytes]]] = {}
        self.ever_member: set[NodeId] = set()
        self.latest_conf_index = 0
        self.latest_conf = ConfState()
        self.to_retire: dict[NodeId, int] = {}
        self.reads: dict[tuple[NodeId, int], int] = {}
        self.next_fresh_id = SIM_FRESH_NODE_ID_MIN
        self.proposals = 0
        self.read_ctx = 0
        # Check-quorum lease: per node, its own ticks since it last heard from the leader it
        # follows in its term (None: not since it (re)started).
        self.ticks_since_leader: dict[NodeId, int | None] = {}
        self.lease_term: dict[NodeId, int] = {}
        voters = tuple(range(1, params.voters + 1))
        learners = tuple(range(params.voters + 1, params.nodes + 1))
        bootstrap = ConfState(voters=voters, learners=learners)
        for nid in (*voters, *learners):
            self._spawn(nid, bootstrap)
        self.ever_member = set(bootstrap.members())
        self.latest_conf = bootstrap

    # ---- plumbing ---------------------------------------------------------------------------

    def _config(self, nid: NodeId) -> CoreConfig:
        return CoreConfig(
            node_id=nid,
            election_ticks=5,
            heartbeat_ticks=1,
            idle_tick_ticks=3,
            pre_vote=self.p.pre_vote,
            check_quorum=self.p.check_quorum,
            # Small windows so flow control, batching and probing are exercised.
            max_inflight_msgs=4,
            max_inflight_bytes=4096,
            max_msg_bytes=200,
            max_uncommitted_bytes=4096,
        )

    def _spawn(self, nid: NodeId, bootstrap: ConfState) -> MemNode:
        node = MemNode(self._config(nid), bootstrap, seed=self.p.seed * 131 + nid)
        self.nodes[nid] = node
        self.ticks_since_leader[nid] = None
        self.lease_term[nid] = 0
        self.skew_ms[nid] = self.rng.randint(-3, 3)
        self.pending[nid] = {}
        self.checker.check_node(node)
        return node

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _event(self, text: str) -> None:
        self.trace.append(f"{self.step_no}: {text}")

    def now_tm(self, nid: NodeId) -> int:
        """The node's HLC reading: its skewed physical clock, never going backwards."""
        physical = (self.phys_ms + self.skew_ms[nid]) << _TM_LOGICAL_BITS
        tm = max(physical, self.last_tm.get(nid, 0) + 1)
        self.last_tm[nid] = tm
        return tm

    def live(self) -> list[MemNode]:
        return [n for n in self.nodes.values() if n.id not in self.down]

    def leaders(self) -> list[MemNode]:
        return [n for n in self.live() if n.core.is_leader()]

    def connected(self, a: NodeId, b: NodeId) -> bool:
        return (
            a not in self.down
            and b not in self.down
            and self.groups.get(a, 0) == self.groups.get(b, 0)
            and (a, b) not in self.one_way_cuts
        )

    def _enqueue(self, msgs: list[Message]) -> None:
        if self.p.stale_replays:
            self.history.extend(msgs)
        self.pool.extend(msgs)
        overflow = len(self.pool) - SIM_IN_FLIGHT_MAX
        if overflow > 0:
            del self.pool[:overflow]
            self.stats["lost_overflow"] = self.stats.get("lost_overflow", 0) + overflow

    def tick(self, node: MemNode) -> None:
        node.core.tick(self.now_tm(node.id))
        since = self.ticks_since_leader[node.id]
        if since is not None:
            self.ticks_since_leader[node.id] = since + 1

    def deliver(self, m: Message) -> None:
        node = self.nodes[m.dst]
        core = node.core
        since = self.ticks_since_leader[node.id]
        in_lease = (
            self.p.check_quorum
            and since is not None
            and since < core.cfg.election_ticks
            and m.term > self.lease_term[node.id]  # a vote of its leader's term is no news
        )
        sent_before = len(core._msgs)
        core.step(m)
        if in_lease and type(m) is RequestVote and not m.force:
            for answer in core._msgs[sent_before:]:
                if type(answer) is VoteResponse and answer.granted:
                    raise InvariantViolation(
                        "check-quorum lease",
                        f"node {node.id} granted a {'pre-' if m.pre_vote else ''}vote to node "
                        f"{m.src} for term {m.term} {since} ticks after it heard from its leader",
                    )
        if type(m) is TimeoutNow or (type(m) is RequestVote and m.force):
            # A transfer's: the leader that sent TimeoutNow gave up its lease (the driver's
            # lease is void in a term it sent one); its target campaigns, the others may vote.
            self.ticks_since_leader[node.id] = None
        elif (
            type(m) in (AppendEntries, Heartbeat, InstallSnapshot)
            and m.term == core.term
            and core.leader == m.src
        ):
            self.ticks_since_leader[node.id] = 0
            self.lease_term[node.id] = core.term

    def handle_ready(self, node: MemNode, *, persist: bool = True) -> None:
        power_loss = not persist and node.core.has_ready() and self._power_loss(node)
        before = node.disk.hard_state
        stable_index = node.core.log.stable_index
        was_serving = node.core.caught_up()
        msgs, rd = node.handle_ready(persist=persist)
        self._enqueue(msgs)
        if rd is None:
            return
        if not persist:
            early = applicable_before_persist(rd, stable_index) if self.p.early_apply else 0
            if early and was_serving:
                # The driver applied these before the write and served reads meanwhile.
                self.checker.note_served(node.id, rd.committed[early - 1].tm)
                self._count("early_apply_crashes")
            self._count("crash_before_persist")
            self._after_restart(
                node,
                f"crashed after ready{' (power loss)' if power_loss else ''}, "
                f"{len(msgs)} early msgs escaped",
                power_loss=power_loss or early > 0,
            )
            return
        after = node.disk.hard_state
        if rd.entries or (after.term, after.vote) != (before.term, before.vote):
            # The driver syncs this write (raft/wal.py `_must_sync`), and with it every record
            # before it. A Ready that only moves the commit index is written without a sync.
            self.synced_commit[node.id] = after.commit
        self._observe_ready(node, rd)
        self.checker.check_safe_time_exact(node)

    def _observe_ready(self, node: MemNode, rd: Ready) -> None:
        if rd.snapshot is not None:
            self._count("snapshots_installed")
        pending = self.pending[node.id]
        for e in rd.committed:
            want = pending.pop(e.index, None)
            if want is not None and want[0] == e.term:
                if e.data != want[1]:
                    raise InvariantViolation(
                        "acknowledged proposal",
                        f"node {node.id} proposed {want[1]!r} as {e.index}/{e.term} "
                        f"but applied {e.data!r}",
                    )
                self.checker.acknowledge(node, e.index, e.term, e.data)
                self._count("acked")
            if e.kind is EntryKind.CONF:
                self._conf_applied(e.index, decode_conf(e.data))
        for rs in rd.read_states:
            required = self.reads.pop((node.id, rs.ctx), None)
            if required is None:
                raise InvariantViolation("read index", f"node {node.id} answered unknown read")
            if rs.index < required:
                raise InvariantViolation(
                    "read index",
                    f"node {node.id} read ctx {rs.ctx} at index {rs.index}, but {required} "
                    f"was committed before the read started",
                )
            self._count("reads_served")
        for ctx in rd.dropped_reads:
            self.reads.pop((node.id, ctx), None)

    def _power_loss(self, node: MemNode) -> bool:
        """Maybe make the coming crash a power loss: the disk keeps the commit index of the
        node's last synced write only. Returns whether it did."""
        if not self.p.power_loss or self.fault_rng.random() >= SIM_POWER_LOSS_CHANCE:
            return False
        hs = node.disk.hard_state
        synced = min(hs.commit, self.synced_commit.get(node.id, 0))
        self.synced_commit[node.id] = synced
        if synced == hs.commit:
            return False
        node.disk.hard_state = HardState(term=hs.term, vote=hs.vote, commit=synced)
        self._count("power_losses")
        return True

    def _after_restart(self, node: MemNode, why: str, *, power_loss: bool = False) -> None:
        """A node came back from its disk: replay what it persisted before anything else."""
        if power_loss:
            self.checker.forget_safe_time(node)
        if self.snapshots_in_progress.pop(node.id, None) is not None:
            self._event(f"  n{node.id} lost its unfinished background snapshot")
        self.pending[node.id].clear()
        self.ticks_since_leader[node.id] = None
        for key in [k for k in self.reads if k[0] == node.id]:
            del self.reads[key]
        self.checker.forget_volatile(node)
        msgs, rd = node.handle_ready()
        if msgs:
            raise InvariantViolation("restart", f"node {node.id} sent messages while replaying")
        if rd is not None:
            self._observe_ready(node, rd)
        self.checker.check_safe_time_exact(node)
        self._event(f"  n{node.id} {why}; replayed to applied {node.core.log.applied}")

    def _conf_applied(self, index: int, conf: ConfState) -> None:
        """A membership change was applied somewhere, so it is committed. Lagging or restarted
        nodes re-apply old changes; only the newest one counts."""
        if index <= self.latest_conf_index:
            return
        self.latest_conf_index = index
        self.latest_conf = conf
        members = set(conf.members())
        self.ever_member |= members
        for nid in sorted(self.ever_member - members - self.retired):
            self.to_retire[nid] = index

    def _retire_removed(self) -> None:
        """Shut removed nodes down for good, as an operator decommissions a server once every
        remaining member knows its removal is committed. (Left running, a removed voter that
        never learns of its removal campaigns forever; shut down earlier, the remaining voters
        may never learn that the change committed — see the report on leader self-removal.)"""
        for nid, index in list(self.to_retire.items()):
            members = [self.nodes[m] for m in self.latest_conf.members() if m in self.nodes]
            if all(m.disk.hard_state.commit >= index for m in members):
                del self.to_retire[nid]
                self.retired.add(nid)
                self.down.add(nid)
                self._event(f"  n{nid} retired (its removal at {index} is known committed)")

    # ---- events -----------------------------------------------------------------------------

    def step(self) -> set[NodeId]:
        """One random event. Returns the ids of the nodes it touched."""
        finished = self._finish_background_snapshots() if self.snapshots_in_progress else set()
        return finished | self._random_event()

    def _finish_background_snapshots(self) -> set[NodeId]:
        touched = set()
        for nid in sorted(self.snapshots_in_progress):
            if self.snap_rng.random() >= SIM_SNAPSHOT_FINISH_CHANCE:
                continue
            snap, keep = self.snapshots_in_progress.pop(nid)
            node = self.nodes[nid]
            node.disk.compact(snap)
            node.core.compact_log(snap, keep_entries=keep)
            self._count("background_snapshots")
            self._event(
                f"background snapshot of n{nid} at {snap.meta.index}/{snap.meta.term} done "
                f"(applied {node.core.log.applied}, snapshot {node.core.snapshot.meta.index})"
            )
            touched.add(nid)
        return touched

    def _random_event(self) -> set[NodeId]:
        rng = self.rng
        self.phys_ms += rng.randint(0, 3)
        r = rng.random() * _EVENT_WEIGHT_TOTAL
        name = _EVENT_NAMES[bisect.bisect(_EVENT_CUMULATIVE, r)]
        if name == "conf_change" and not self.p.membership_changes:
            name = "ready"
        handler: Callable[[], set[NodeId]] = getattr(self, f"_ev_{name}")
        return handler()

    def _ev_deliver(self) -> set[NodeId]:
        """A burst of deliveries: the network is much faster than a tick."""
        if not self.pool:
            return self._ev_ready()
        touched: set[NodeId] = set()
        for _ in range(self.rng.randint(1, SIM_DELIVERY_BURST_MAX)):
            if not self.pool:
                break
            touched |= self._deliver_one()
        return touched

    def _deliver_one(self) -> set[NodeId]:
        if self.p.stale_replays and self.history and self.fault_rng.random() < SIM_REPLAY_CHANCE:
            return self._replay_stale()
        rng = self.rng
        # Mostly near-FIFO; sometimes any message in flight (a long delay, a reorder).
        if rng.random() < 0.75:
            k = rng.randrange(min(3, len(self.pool)))
        else:
            k = rng.randrange(len(self.pool))
        m = self.pool[k]
        fate = rng.random()
        if fate < 0.04:
            del self.pool[k]
            self._event(f"drop {_fmt(m)}")
            return set()
        if fate < 0.08:
            self._event(f"deliver a duplicate of {_fmt(m)}")  # the original stays in flight
        else:
            del self.pool[k]
            self._event(f"deliver {_fmt(m)}")
        if not self.connected(m.src, m.dst) or m.dst not in self.nodes:
            self._event("  (lost: partitioned or down)")
            return set()
        self.deliver(m)
        self._count("delivered")
        return {m.dst}

    def _replay_stale(self) -> set[NodeId]:
        """Deliver again a message sent long ago (maybe in an older term, before restarts)."""
        m = self.history[self.fault_rng.randrange(len(self.history))]
        self._event(f"replay stale {_fmt(m)}")
        self._count("stale_replays")
        if not self.connected(m.src, m.dst) or m.dst not in self.nodes:
            self._event("  (lost: partitioned or down)")
            return set()
        self.deliver(m)
        return {m.dst}

    def _ev_ready(self) -> set[NodeId]:
        ready = [n for n in self.live() if n.core.has_ready()]
        if not ready:
            return set()
        node = self.rng.choice(ready)
        persist = self.rng.random() >= 0.02
        self._event(f"ready n{node.id}" + ("" if persist else " CRASH before persisting"))
        self.handle_ready(node, persist=persist)
        return {node.id}

    def _ev_tick_all(self) -> set[NodeId]:
        self.phys_ms += self.rng.randint(1, 10)
        touched = set()
        for node in self.live():
            self.tick(node)
            touched.add(node.id)
        self._event(f"tick all at {self.phys_ms} ms")
        return touched

    def _ev_tick_one(self) -> set[NodeId]:
        live = self.live()
        if not live:
            return set()
        node = self.rng.choice(live)
        self.tick(node)
        self._event(f"tick n{node.id}")
        return {node.id}

    def _ev_propose(self) -> set[NodeId]:
        leaders = self.leaders()
        if not leaders:
            return self._ev_ready()
        node = self.rng.choice(leaders)
        self.proposals += 1
        data = f"s{self.p.seed}-p{self.proposals}".encode()
        try:
            term, index = node.core.propose(data, self.now_tm(node.id))
        except RaftCoreError as e:
            self._event(f"propose on n{node.id} refused: {e.code}")
            return set()
        self.pending[node.id][index] = (term, data)
        self._event(f"propose {data.decode()} on n{node.id} -> {index}/{term}")
        return {node.id}

    def _ev_read(self) -> set[NodeId]:
        leaders = self.leaders()
        if not leaders:
            return set()
        node = self.rng.choice(leaders)
        self.read_ctx += 1
        try:
            node.core.read_index(self.read_ctx)
        except RaftCoreError as e:
            self._event(f"read-index on n{node.id} refused: {e.code}")
            return set()
        # Everything known committed anywhere now must be covered by the read's index.
        self.reads[(node.id, self.read_ctx)] = len(self.checker.committed_terms)
        self._event(f"read-index ctx={self.read_ctx} on n{node.id}")
        return {node.id}

    def _ev_partition(self) -> set[NodeId]:
        ids = sorted(n for n in self.nodes if n not in self.retired)
        rng = self.rng
        if rng.random() < 0.5:
            lonely = rng.choice(ids)
            self.groups = {lonely: 1}
        else:
            self.groups = {n: rng.randrange(2) for n in ids}
        side = sorted(n for n in ids if self.groups.get(n, 0) == 1)
        self._event(f"partition {side} | {sorted(set(ids) - set(side))}")
        if self.p.one_way_cuts and self.cut_rng.random() < SIM_ONE_WAY_CUT_CHANCE:
            # One direction of links fails (a firewall rule, a stuck send queue): a node whose
            # messages no longer reach the others while it still hears them, or the reverse.
            who = self.cut_rng.choice(ids)
            outbound = self.cut_rng.random() < 0.5
            self.one_way_cuts = {(who, n) if outbound else (n, who) for n in ids if n != who}
            self._count("one_way_cuts")
            self._event(f"one-way cut: n{who} {'sends' if outbound else 'hears'} nothing")
        return set()

    def _ev_heal(self) -> set[NodeId]:
        self.one_way_cuts = set()
        self.groups = {}
        self._event("heal")
        return set()

    def _ev_crash(self) -> set[NodeId]:
        candidates = [n for n in self.live() if n.id not in self.retired]
        if not candidates:
            return set()
        node = self.rng.choice(candidates)
        stay_down = self.rng.random() < 0.3
        self._count("crashes")
        power_loss = self._power_loss(node)
        self._event(
            f"crash n{node.id}"
            + (" (power loss)" if power_loss else "")
            + (" (stays down)" if stay_down else " and restart")
        )
        node.crash()
        self._after_restart(node, "restarted from disk", power_loss=power_loss)
        if stay_down:
            self.down.add(node.id)
        return {node.id}

    def _ev_restart(self) -> set[NodeId]:
        downed = sorted(self.down - self.retired)
        if not downed:
            return set()
        nid = self.rng.choice(downed)
        self.down.discard(nid)
        self._event(f"n{nid} back up")
        return {nid}

    def _ev_compact(self) -> set[NodeId]:
        live = self.live()
        leaders = self.leaders()
        # Favour the leader: its compaction is what forces InstallSnapshot to laggards.
        pool = leaders if leaders and self.rng.random() < 0.6 else live
        if not pool:
            return set()
        node = self.rng.choice(pool)
        if node.core.log.applied <= node.core.snapshot.meta.index:
            return set()
        # Sometimes keep a tail of entries behind the snapshot (raft.node does by default).
        keep = self.rng.choice((0, 0, 3, 20))
        if self.p.background_snapshots and self.snap_rng.random() < 0.5:
            if node.id not in self.snapshots_in_progress:  # one at a time, as raft.node
                data = msgpack.packb([[a.index, a.term, a.tm, a.data] for a in node.applied])
                snap = node.core.create_snapshot(data)
                self.snapshots_in_progress[node.id] = (snap, keep)
                self._event(f"background snapshot of n{node.id} at {snap.meta.index} begins")
            return set()
        snap = node.take_snapshot(keep_entries=keep)
        self._count("compactions")
        self._event(f"compact n{node.id} to {snap.meta.index}/{snap.meta.term} keep {keep}")
        return {node.id}

    def _ev_transfer(self) -> set[NodeId]:
        leaders = self.leaders()
        if not leaders:
            return set()
        node = self.rng.choice(leaders)
        others = [v for v in node.core.conf.voters if v != node.id]
        if not others:
            return set()
        target = self.rng.choice(others)
        try:
            node.core.transfer_leader(target)
        except RaftCoreError as e:
            self._event(f"transfer n{node.id} -> n{target} refused: {e.code}")
            return set()
        self._count("transfers")
        self._event(f"transfer leadership n{node.id} -> n{target}")
        return {node.id}

    def _ev_conf_change(self) -> set[NodeId]:
        leaders = self.leaders()
        if not leaders:
            return set()
        node = self.rng.choice(leaders)
        conf = node.core.conf
        voters, learners = set(conf.voters), set(conf.learners)
        rng = self.rng
        choice = rng.random()
        fresh: NodeId | None = None
        if learners and choice < 0.35:
            who = rng.choice(sorted(learners))
            learners.discard(who)
            voters.add(who)
            what = f"promote learner n{who}"
        elif len(voters) > _VOTERS_MIN_AFTER_REMOVAL and choice < 0.7:
            # The leader itself a third of the time: its self-removal is the delicate case.
            who = node.id if rng.random() < 0.33 else rng.choice(sorted(voters))
            voters.discard(who)
            what = f"remove voter n{who}"
        elif len(voters) + len(learners) < self.p.nodes + 2:
            fresh = self.next_fresh_id
            if choice < 0.85:
                learners.add(fresh)
                what = f"add learner n{fresh}"
            else:
                voters.add(fresh)
                what = f"add voter n{fresh}"
        else:
            return set()
        new = ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners)))
        try:
            term, index = node.core.propose_conf(new, self.now_tm(node.id))
        except RaftCoreError as e:
            self._event(f"conf change on n{node.id} ({what}) refused: {e.code}")
            return set()
        if fresh is not None:
            self.next_fresh_id += 1
            self._spawn(fresh, ConfState())
        self._count("conf_changes")
        if node.id not in new.voters:
            self._count("leader_self_removals")
        if len(conf.voters) == 2 and len(new.voters) == 1:
            self._count("removals_to_one_voter")
        self._event(f"conf change on n{node.id}: {what} -> {index}/{term}")
        return {node.id}

    # ---- checks and the run -----------------------------------------------------------------

    def check(self, touched: set[NodeId]) -> None:
        if self.to_retire:
            self._retire_removed()
        for nid in touched:
            self.checker.check_node(self.nodes[nid])
        self.checker.check_leaders(list(self.nodes.values()))

    def check_everything(self) -> None:
        self.check(set(self.nodes))

    def run(self) -> SimResult:
        try:
            for step_no in range(1, self.p.steps + 1):
                self.step_no = step_no
                self.check(self.step())
            self.check_everything()
            self._event("== heal everything and converge ==")
            self.converge()
        except BaseException as cause:
            if isinstance(cause, KeyboardInterrupt):
                raise
            summary = f"{self.p.describe()}, step {self.step_no}"
            raise SimulationFailure(
                self.p.seed, summary, cause, list(self.trace), extended=self.p.extended
            ) from cause
        return SimResult(
            seed=self.p.seed,
            steps=self.step_no,
            acked=len(self.checker.acks),
            max_term=max(n.core.term for n in self.nodes.values()),
            committed=len(self.checker.committed_terms),
            crashes=self.stats.get("crashes", 0) + self.stats.get("crash_before_persist", 0),
            snapshots_sent=self.stats.get("snapshots_installed", 0),
            leaders=len(self.checker.leaders_by_term),
            stats=dict(self.stats),
        )

    def _settle(self) -> None:
        """Reliable network: handle every Ready and deliver every message until quiet."""
        for _ in range(SIM_SETTLE_ROUNDS_MAX):
            touched: set[NodeId] = set()
            for node in self.live():
                if node.core.has_ready():
                    self.handle_ready(node)
                    touched.add(node.id)
            if not self.pool:
                self.check(touched)
                return
            batch, self.pool = self.pool, []
            for m in batch:
                if self.connected(m.src, m.dst) and m.dst in self.nodes:
                    self.deliver(m)
                    touched.add(m.dst)
            self.check(touched)
        raise InvariantViolation("liveness", "the network never went quiet")

    def converge(self) -> None:
        self.groups = {}
        self.one_way_cuts = set()
        for nid in sorted(self.down - self.retired):
            self.down.discard(nid)
        rounds_max = (
            SIM_CONVERGE_ROUNDS_MAX_PRE_VOTE if self.p.pre_vote else SIM_CONVERGE_ROUNDS_MAX
        )
        for rnd in range(1, rounds_max + 1):
            self.step_no += 1
            self.phys_ms += 5
            for node in self.live():
                self.tick(node)
            self._settle()
            self.check_everything()
            if self._converged():
                self._event(f"converged after {rnd} rounds")
                return
        leaders = [(n.id, n.core.term) for n in self.leaders()]
        state = ", ".join(
            f"n{n.id}:{n.core.role.value}/t{n.core.term}/applied {n.core.log.applied}"
            f"/commit {n.core.log.committed}"
            for n in self.live()
        )
        raise InvariantViolation(
            "liveness",
            f"no convergence within {rounds_max} rounds after healing; leaders {leaders}; {state}",
        )

    def _converged(self) -> bool:
        leaders = self.leaders()
        if not leaders:
            return False
        leader = max(leaders, key=lambda n: n.core.term)
        core = leader.core
        if core.log.term(core.log.committed) != core.term:
            return False
        members = [self.nodes[m] for m in core.conf.members() if m in self.nodes]
        if len(members) != len(core.conf.members()):
            return False
        commit = core.log.committed
        if any(m.core.log.applied < commit or m.id in self.down for m in members):
            return False
        if not all(m.core.caught_up() for m in members):
            # Every member serves again (readiness after restarts and power losses is live).
            return False
        for m in members:
            self.checker.check_all_acks_applied(m)
        return True


def _fmt(m: Message) -> str:
    name = type(m).__name__
    fields = [f"{m.src}->{m.dst}", f"t{m.term}"]
    match m:
        case AppendEntries():
            ents = ",".join(f"{e.index}/{e.term}" for e in m.entries)
            fields.append(f"prev {m.prev_index}/{m.prev_term} [{ents}] commit {m.commit}")
        case _:
            rest = {
                k: getattr(m, k)
                for k in ("index", "reject", "granted", "pre_vote", "commit", "read_ctx", "force")
                if hasattr(m, k) and getattr(m, k) not in (False, 0)
            }
            if rest:
                fields.append(" ".join(f"{k}={v}" for k, v in rest.items()))
            snapshot = getattr(m, "snapshot", None)
            if snapshot is not None:
                fields.append(f"snap {snapshot.meta.index}/{snapshot.meta.term}")
    return f"{name} " + " ".join(fields)


def run_seed(seed: int, steps: int = SIM_STEPS_PER_SEED, *, extended: bool = False) -> SimResult:
    """Run one seed; raises `SimulationFailure` (an AssertionError) when it breaks Raft."""
    return Simulation(SimParams.for_seed(seed, steps, extended=extended)).run()


def main() -> None:  # pragma: no cover - a manual driver: python -m tests.raft.simulation
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=500)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--steps", type=int, default=SIM_STEPS_PER_SEED)
    parser.add_argument("--extended", action="store_true", help="add the extended faults")
    parser.add_argument("--max-seconds", type=float, default=0, help="stop after (0: never)")
    args = parser.parse_args()
    began = time.perf_counter()
    failures = 0
    totals: dict[str, int] = {}
    ran = 0
    for seed in range(args.start, args.start + args.seeds):
        if args.max_seconds and time.perf_counter() - began > args.max_seconds:
            break
        ran += 1
        try:
            res = run_seed(seed, args.steps, extended=args.extended)
        except SimulationFailure as e:
            failures += 1
            print(e)
            continue
        for k, v in res.stats.items():
            totals[k] = totals.get(k, 0) + v
    elapsed = time.perf_counter() - began
    print(f"{ran} seeds from {args.start}, {failures} failed, {elapsed:.1f} s; totals {totals}")


if __name__ == "__main__":  # pragma: no cover
    main()
