"""The Raft state machine (Ongaro & Ousterhout 2014; the dissertation for pre-vote, check-quorum,
leadership transfer and single-server membership changes), shaped like etcd-io/raft.

Inputs: `tick(now_tm)`, `step(message)`, `propose*`, `read_index`, `transfer_leader`,
`compact_log`. Output: `ready()` -> `Ready` (see `raft.core.ready` for the ordering contract),
acknowledged with `advance(ready)`. No I/O, no clock, no threads; the only randomness is the
injected `random.Random` that spreads election timeouts. Given the same inputs it produces the same
outputs, which is what makes the seeded simulation possible.

Membership (dissertation §4.1): a node uses the latest configuration in its log, committed or
not, from the moment it appends it; a truncated configuration entry is forgotten with the suffix
that held it. The leader proposes one change at a time (the previous one and its own first
entry applied). A node outside its latest voters may still campaign while that change is not
known committed (it may be needed to commit it, §4.2.2), without counting its own vote; a leader
outside its latest voters keeps leading without counting itself and hands leadership over once
the change is applied.

Safe time (IEP-98): the leader stamps each entry with `tm = max(now_tm, last_tm + 1)` when it
appends it, so Tm is strictly increasing along every log, also across leader changes (a new leader
continues from its own last entry). `safe_time` is the Tm of the last applied entry. An idle leader
appends a TICK entry every `idle_tick_ticks` so safe time keeps moving without traffic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raft.core.conf import check_single_change, decode_conf, encode_conf
from raft.core.errors import (
    ConfChangeError,
    NotLeaderError,
    ProposalDroppedError,
    RaftInvariantError,
    TransferError,
)
from raft.core.log import RaftLog
from raft.core.progress import Progress, ProgressState
from raft.core.ready import CoreConfig, ReadState, Ready, Role
from raft.core.types import (
    NONE,
    AppendEntries,
    AppendResponse,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    NodeId,
    RequestVote,
    Snapshot,
    SnapshotMeta,
    TimeoutNow,
    VoteResponse,
)

# A snapshot not acknowledged within this many election timeouts is assumed lost and resent.
_SNAPSHOT_RETRY_ELECTIONS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerStatus:
    match: int
    next: int
    sent: int  # the highest index sent to it (entries or a snapshot): see Progress.sent
    state: str
    is_learner: bool
    recent_active: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    node_id: NodeId
    role: Role
    term: int
    leader: NodeId
    commit_index: int
    applied_index: int
    last_index: int
    # The newest snapshot this node holds (taken or received), and the index its log starts
    # after: lower by the entries kept behind the snapshot for followers a little behind.
    snapshot_index: int
    log_start_index: int
    safe_time: int
    caught_up: bool
    conf: ConfState
    transferee: NodeId
    progress: dict[NodeId, PeerStatus] = field(default_factory=dict)


@dataclass(slots=True)
class _PendingRead:
    ctx: int
    index: int
    acks: set[NodeId]


_EARLY_TYPES = (AppendEntries, Heartbeat, InstallSnapshot, TimeoutNow)


class RaftCore:
    def __init__(
        self,
        config: CoreConfig,
        *,
        hard_state: HardState,
        snapshot: Snapshot,
        entries: tuple[Entry, ...] | list[Entry],
        bootstrap_conf: ConfState,
        rng: random.Random,
    ) -> None:
        if config.node_id <= 0:
            raise ValueError("node ids are positive integers")
        self.id = config.node_id
        self.cfg = config
        self._rng = rng
        self.log = RaftLog(snapshot.meta, entries)
        self.snapshot = snapshot
        self.term = hard_state.term
        self.vote = hard_state.vote
        if hard_state.commit > self.log.last_index():
            raise RaftInvariantError(
                f"persisted commit {hard_state.commit} beyond log end {self.log.last_index()}"
            )
        self.log.commit_to(max(hard_state.commit, snapshot.meta.index))
        # Membership on append: the latest CONF entry of the log, else the log's base. `_confs`
        # holds (index, term, conf) of every CONF entry in the log, oldest first.
        self._base_conf = snapshot.meta.conf if not snapshot.is_empty() else bootstrap_conf
        self._confs: list[tuple[int, int, ConfState]] = []
        self.conf = self._base_conf
        self._note_confs(self.log.slice(self.log.first_index(), self.log.last_index() + 1))
        self.role = Role.FOLLOWER
        self.leader: NodeId = NONE
        self.progress: dict[NodeId, Progress] = {}
        self._snapshot_sent_elapsed: dict[NodeId, int] = {}
        # InstallSnapshot messages this core sent and their data bytes (the operator's metrics).
        self.snapshots_sent = 0
        self.snapshot_bytes_sent = 0
        self.votes: dict[NodeId, bool] = {}
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.idle_elapsed = 0
        self.randomized_election_ticks = 0
        self.now_tm = self.log.last_tm()
        self.applied_tm = snapshot.meta.tm
        self.pending_conf_index = 0
        self.transferee: NodeId = NONE
        # The last term in which this node, as leader, queued a TimeoutNow: leadership may move
        # from then on without the followers' check-quorum lease (the target campaigns with
        # `force`), even after the transfer lapses. Set when the message is queued, before the
        # driver sends it: the driver's leader lease is void in that term.
        self.timeout_now_term = 0
        # Set by the driver while this node must not lead (its clock is off a quorum): its
        # election timer keeps running, so its check-quorum lease lapses and it votes for
        # others, but it starts no election (a transfer's included).
        self.campaigns_paused = False
        self.uncommitted_bytes = 0
        self._reads: list[_PendingRead] = []
        self._reads_waiting_commit: list[int] = []
        self._early: list[Message] = []
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._dropped_reads: list[int] = []
        self._received_snapshot: Snapshot | None = None
        self._prev_hard_state = hard_state
        self._need_broadcast = False
        self._commit_broadcast = False
        # Commit index first heard from a leader since this core was built (see caught_up).
        self._catch_up_floor: int | None = None
        # The last index of the log this core was built with: everything this node applied
        # before it (re)started lies at or below it, or below `log.replaced_from` (see
        # caught_up).
        self._start_last_index = self.log.last_index()
        # While a received snapshot is out in a Ready and the driver has not restored its state
        # machine from it (advance): the applied index that state machine still reflects. The
        # log already counts the snapshot as applied, so without this a node would look caught
        # up (and a ReadIndex read would look served) while its state is the old one.
        self._restore_pending_applied: int | None = None
        self._ready_outstanding = False
        self._reset_election_timeout()

    # ================================================================ queries

    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def promotable(self) -> bool:
        """May this node campaign? A voter of its latest membership may. So may a voter of the
        membership as of its commit index whose latest (uncommitted) change removed it: until
        that change commits, the remaining voters may need it to lead to commit it
        (dissertation §4.2.2); it does not count its own vote then."""
        if self.id in self.conf.voters:
            return True
        return (
            bool(self._confs)
            and self._confs[-1][0] > self.log.committed
            and self.id in self.conf_at(self.log.committed).voters
        )

    def conf_at(self, index: int) -> ConfState:
        """The membership in force at `index` (the last CONF entry at or below it), for any
        index from the log's base on."""
        for conf_index, _, conf in reversed(self._confs):
            if conf_index <= index:
                return conf
        return self._base_conf

    def caught_up(self) -> bool:
        """True once this node has applied an entry of the current leader's term (everything
        acknowledged before that leader took over is then applied here too) and, since it
        started, has applied at least the commit index it first heard from a leader. The second
        part matters after a power loss: the commit index is written without fsync (it is
        volatile in Raft), so a restarted node may replay less than it had applied before, and
        it must not serve from that older state. Restarted nodes serve nothing before this.

        The commit index a leader sends is not always a bound of what this node applied: a
        heartbeat carries min(leader commit, this node's match as the leader knows it), which
        lags when an acknowledgement was lost (and the commit index can be lost without a power
        loss too: the driver applies committed entries already durable before it writes the
        Ready that commits them, and serves them meanwhile; a kill -9 during that write loses
        the commit index). So the node also waits until it has applied its whole log as it
        found it at start (what it applied before was in that log, synced before it was
        applied), or up to where a leader's entries or snapshot replaced it (replaced entries
        were never committed, so never applied)."""
        start_bound = self._start_last_index
        replaced_from = self.log.replaced_from
        if replaced_from is not None:
            start_bound = min(start_bound, replaced_from - 1)
        return (
            self.leader != NONE
            and self._restore_pending_applied is None
            and self._catch_up_floor is not None
            and self.log.applied >= self._catch_up_floor
            and self.log.applied >= start_bound
            and self.log.term(self.log.applied) == self.term
        )

    def visible_applied(self) -> int:
        """The index the driver's state machine reflects: the log's applied index, except while
        a received snapshot waits to be restored (then the index applied before it)."""
        if self._restore_pending_applied is not None:
            return self._restore_pending_applied
        return self.log.applied

    def hard_state(self) -> HardState:
        return HardState(term=self.term, vote=self.vote, commit=self.log.committed)

    def status(self) -> Status:
        progress = {}
        if self.role is Role.LEADER:
            progress = {
                n: PeerStatus(
                    match=p.match,
                    next=p.next,
                    sent=p.sent,
                    state=p.state.value,
                    is_learner=p.is_learner,
                    recent_active=p.recent_active,
                )
                for n, p in self.progress.items()
            }
        return Status(
            node_id=self.id,
            role=self.role,
            term=self.term,
            leader=self.leader,
            commit_index=self.log.committed,
            applied_index=self.visible_applied(),
            last_index=self.log.last_index(),
            snapshot_index=self.snapshot.meta.index,
            log_start_index=self.log.snapshot.index,
            safe_time=self.applied_tm,
            caught_up=self.caught_up(),
            conf=self.conf,
            transferee=self.transferee,
            progress=progress,
        )

    # ================================================================ inputs

    def tick(self, now_tm: int) -> None:
        self.now_tm = max(self.now_tm, now_tm)
        if self.role is Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()

    def propose(self, data: bytes, now_tm: int) -> tuple[int, int]:
        """Append an application command. Returns (term, index): the proposal succeeded iff the
        entry applied at `index` has `term`."""
        return self.propose_many([data], now_tm)[0]

    def propose_many(self, items: list[bytes], now_tm: int) -> list[tuple[int, int]]:
        size_bytes = sum(len(d) + 32 for d in items)  # Entry.size_bytes of each, summed
        self._check_can_propose(size_bytes)
        self.now_tm = max(self.now_tm, now_tm)
        if not items:
            return []
        # The entries `_append_new` would make one at a time, appended to the log in one call:
        # each Tm is max(now_tm, previous Tm + 1), which after the first is previous Tm + 1.
        term = self.term
        first = self.log.last_index() + 1
        first_tm = max(self.now_tm, self.log.last_tm() + 1)
        entries = [
            Entry(term=term, index=first + i, tm=first_tm + i, kind=EntryKind.NORMAL, data=data)
            for i, data in enumerate(items)
        ]
        self.log.append(entries)
        self.uncommitted_bytes += size_bytes
        self.idle_elapsed = 0
        self._need_broadcast = True
        return [(term, first + i) for i in range(len(entries))]

    def propose_conf(
        self, new_conf: ConfState, now_tm: int, *, context: bytes = b""
    ) -> tuple[int, int]:
        """Propose a membership change (one voter at a time; learners freely)."""
        self._check_can_propose(64)
        if self.pending_conf_index > self.log.applied:
            raise ConfChangeError(
                "another membership change (or this leader's first entry) is not applied yet"
            )
        check_single_change(self.conf, new_conf)
        if new_conf == self.conf:
            raise ConfChangeError("membership unchanged")
        self.now_tm = max(self.now_tm, now_tm)
        e = self._append_new(EntryKind.CONF, encode_conf(new_conf, context))
        self.pending_conf_index = e.index
        # In force from now on: the change commits on a majority of the new voters.
        self._note_confs([e])
        self._sync_progress()
        if self.transferee not in self.conf.voters:
            self.transferee = NONE
        if self._maybe_commit():
            self._commit_broadcast = True
        return (e.term, e.index)

    def transfer_leader(self, target: NodeId) -> None:
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader)
        if target == self.id:
            return
        if target not in self.conf.voters:
            raise TransferError(f"node {target} is not a voter")
        if self.transferee == target:
            return
        self.transferee = target
        self.election_elapsed = 0  # the transfer is abandoned after one election timeout
        pr = self.progress[target]
        if pr.match == self.log.last_index():
            self._send_timeout_now(target)
        else:
            self._send_append(target, send_if_empty=True)

    def read_index(self, ctx: int) -> None:
        """Start a linearizable read. `ctx` must be unique and non-zero; the result arrives as a
        `ReadState` in a later `Ready` (or in `dropped_reads` if leadership is lost)."""
        if ctx == 0:
            raise ValueError("read ctx must be non-zero")
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader)
        if self.log.term(self.log.committed) != self.term:
            # Until an entry of our term commits we do not know the real commit index (§6.4).
            self._reads_waiting_commit.append(ctx)
            return
        self._start_read(ctx)

    def step(self, m: Message) -> None:
        if m.dst != self.id:
            return
        if m.term > self.term:
            if isinstance(m, RequestVote):
                if self._in_lease() and not m.force:
                    # We heard from a live leader recently: a disruptive candidate is ignored.
                    return
                if not m.pre_vote:
                    self._become_follower(m.term, NONE)
            elif isinstance(m, VoteResponse) and m.pre_vote and m.granted:
                pass  # a granted pre-vote carries the term we would campaign in
            elif isinstance(m, AppendEntries | Heartbeat | InstallSnapshot):
                self._become_follower(m.term, m.src)
            elif self.role is Role.FOLLOWER and self._in_lease():
                # An answer to what we sent as candidate or leader earlier (a pre-vote's
                # rejection, an append's ack), stale now that we follow a live leader. Taking
                # its term would drop that leader and with it our lease, and we would grant the
                # next vote while the leader still counts on our lease (driver's leader lease).
                # If the cluster did move on, our lease lapses within an election timeout.
                return
            else:
                self._become_follower(m.term, NONE)
        elif m.term < self.term:
            if isinstance(m, AppendEntries | Heartbeat) and (
                self.cfg.check_quorum or self.cfg.pre_vote
            ):
                # A partitioned old leader: tell it our term so it steps down. Without this a
                # node that was cut off and raised its term could never rejoin (pre-vote keeps it
                # from disrupting us, and it ignores the old leader).
                self._send(AppendResponse(src=self.id, dst=m.src, term=self.term, index=0))
            elif isinstance(m, RequestVote) and m.pre_vote:
                self._send(
                    VoteResponse(
                        src=self.id, dst=m.src, term=self.term, granted=False, pre_vote=True
                    )
                )
            return

        if isinstance(m, RequestVote):
            self._handle_vote_request(m)
            return

        match self.role:
            case Role.LEADER:
                self._step_leader(m)
            case Role.CANDIDATE | Role.PRE_CANDIDATE:
                self._step_candidate(m)
            case Role.FOLLOWER:
                self._step_follower(m)

    def _in_lease(self) -> bool:
        """Check-quorum's lease: we heard from a leader (or lead) within an election timeout,
        so we vote for nobody else."""
        return (
            self.cfg.check_quorum
            and self.leader != NONE
            and self.election_elapsed < self.cfg.election_ticks
        )

    def step_down(self) -> None:
        """Stop leading now (the driver's clock fence: this node's clock runs ahead of a quorum
        of its peers, so it must not stamp entries). A no-op for a non-leader."""
        if self.role is Role.LEADER:
            self._become_follower(self.term, NONE)

    def campaign(self) -> None:
        """Start an election now (tests and operators; normally elections start by timeout)."""
        self._hup(transfer=False)

    # ================================================================ snapshots

    def create_snapshot(self, data: bytes) -> Snapshot:
        """A snapshot of the application state at the applied index. Persist it, then call
        `compact_log(snapshot)`."""
        index = self.log.applied
        meta = SnapshotMeta(
            index=index,
            term=self._term_or_fail(index),
            tm=self.log.tm_at(index),
            conf=self.conf_at(index),  # not the latest: later CONF entries stay in the log
        )
        return Snapshot(meta=meta, data=data)

    def compact_log(self, snapshot: Snapshot, *, keep_entries: int = 0) -> None:
        """Adopt a persisted local snapshot and drop the log behind it, except the newest
        `keep_entries` entries at or below its index: a follower a little behind then gets
        entries, not the whole snapshot (which it needs only when it is further behind)."""
        if snapshot.meta.index <= max(self.snapshot.meta.index, self.log.snapshot.index):
            return
        self.snapshot = snapshot
        cut = snapshot.meta.index - max(0, keep_entries)
        if cut <= self.log.snapshot.index:
            return
        base_conf = self.conf_at(cut)
        if cut == snapshot.meta.index:
            self.log.compact(snapshot.meta)
        else:
            self.log.compact(
                SnapshotMeta(
                    index=cut,
                    term=self._term_or_fail(cut),
                    tm=self.log.tm_at(cut),
                    conf=base_conf,
                )
            )
        self._base_conf = base_conf
        self._confs = [c for c in self._confs if c[0] > cut]

    def adopt_stored_snapshot(self, stored: Snapshot) -> None:
        """`stored` is the snapshot this core received from a leader, as the driver's log
        stored it (its data in the log's own file when large): hold that copy from now on,
        not the received one, whose data may be the file the transport spooled it to
        (deleted once the transfer completed, but its disk space stays taken while it is
        open). Only the bytes' home changes; a snapshot of another position is ignored."""
        if stored.meta == self.snapshot.meta:
            self.snapshot = stored

    # ================================================================ ready / advance

    def has_ready(self) -> bool:
        self._flush_broadcast()
        log = self.log
        prev = self._prev_hard_state
        # The hard state compared field by field: `hard_state() != prev` without building one
        # (the driver asks this several times per message).
        return bool(
            self._early
            or self._msgs
            or log.stable_index < log.last_index()
            or self.term != prev.term
            or self.vote != prev.vote
            or log.committed != prev.commit
            or log.committed > log.applied
            or self._received_snapshot is not None
            or self._read_states
            or self._dropped_reads
        )

    def ready(self) -> Ready:
        if self._ready_outstanding:
            raise RaftInvariantError("ready() called again before advance()")
        self._flush_broadcast()
        hs = self.hard_state()
        rd = Ready(
            early_messages=tuple(self._early),
            hard_state=hs if hs != self._prev_hard_state else None,
            entries=tuple(self.log.unstable()),
            snapshot=self._received_snapshot,
            messages=tuple(self._msgs),
            committed=tuple(self.log.next_committed()),
            read_states=tuple(self._read_states),
            dropped_reads=tuple(self._dropped_reads),
        )
        self._early.clear()
        self._msgs.clear()
        self._read_states.clear()
        self._dropped_reads.clear()
        self._received_snapshot = None
        self._ready_outstanding = True
        return rd

    def advance(self, rd: Ready) -> None:
        self._ready_outstanding = False
        if rd.hard_state is not None:
            self._prev_hard_state = rd.hard_state
        if rd.entries:
            last = rd.entries[-1]
            self.log.stable_to(last.index, last.term)
        conf_applied = False
        for e in rd.committed:
            if e.index != self.log.applied + 1:
                raise RaftInvariantError(f"applying {e.index} after {self.log.applied}")
            conf_applied |= e.kind is EntryKind.CONF
            self.log.applied_to(e.index)
            if e.tm <= self.applied_tm:
                raise RaftInvariantError(f"safe time would not increase at {e.index}")
            self.applied_tm = e.tm
            if self.role is Role.LEADER:
                self.uncommitted_bytes = max(0, self.uncommitted_bytes - e.size_bytes())
        if rd.snapshot is not None:
            self.applied_tm = max(self.applied_tm, rd.snapshot.meta.tm)
            self._restore_pending_applied = None  # the driver restored it before advancing
        if conf_applied and self.role is Role.LEADER:
            self._on_conf_applied()
        hs = rd.hard_state
        if (
            self.role is Role.CANDIDATE
            and hs is not None
            and hs.term == self.term
            and hs.vote == self.id
        ):
            self.votes[self.id] = True  # our vote for ourselves is on disk now
            self._tally_votes()
        if self.role is Role.LEADER:
            own = self.progress.get(self.id)
            if own is not None and own.maybe_update(self.log.stable_index) and self._maybe_commit():
                self._commit_broadcast = True
            if self._reads_waiting_commit and self.log.term(self.log.committed) == self.term:
                waiting, self._reads_waiting_commit = self._reads_waiting_commit, []
                for ctx in waiting:
                    self._start_read(ctx)

    # ================================================================ roles

    def _reset_election_timeout(self) -> None:
        et = self.cfg.election_ticks
        self.randomized_election_ticks = et + self._rng.randrange(et)

    def _reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.leader = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.idle_elapsed = 0
        self._reset_election_timeout()
        self.votes = {}
        self.transferee = NONE
        self.progress = {}
        self._snapshot_sent_elapsed = {}
        self.uncommitted_bytes = 0
        self._drop_reads()

    def _drop_reads(self) -> None:
        self._dropped_reads.extend(r.ctx for r in self._reads)
        self._dropped_reads.extend(self._reads_waiting_commit)
        self._reads = []
        self._reads_waiting_commit = []

    def _become_follower(self, term: int, leader: NodeId) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.leader = leader

    def _become_pre_candidate(self) -> None:
        # Term and vote stay: a pre-vote changes nothing durable, so a partitioned node cannot
        # inflate its term and disrupt the cluster when it returns.
        self.role = Role.PRE_CANDIDATE
        self.votes = {}
        self.leader = NONE
        self.transferee = NONE
        self._drop_reads()

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    def _note_leader_commit(self, leader_commit: int) -> None:
        """The first message from a leader since start fixes the catch-up floor: the larger of
        our commit index and the one the leader sent. Our own may be below what we applied
        before a crash (it is not fsynced) and does not move when that first message is a
        rejected append, so it alone could let us report ready at an older state."""
        if self._catch_up_floor is None:
            self._catch_up_floor = max(self.log.committed, leader_commit)

    def _become_leader(self) -> None:
        # A leader's own no-op (applied before caught_up holds) is newer than anything it had.
        if self._catch_up_floor is None:
            self._catch_up_floor = 0
        self._reset(self.term)
        self.role = Role.LEADER
        self.leader = self.id
        last = self.log.last_index()
        self.role = Role.FOLLOWER  # no probes from _sync_progress: the no-op below goes to all
        self._sync_progress()
        self.role = Role.LEADER
        own = self.progress.get(self.id)
        if own is not None:
            own.maybe_update(self.log.stable_index)
            own.become_replicate()
        # Commit an entry of our own term first: it commits everything before it (Figure 8)
        # and it gates membership changes (the single-server change bug fix).
        noop = self._append_new(EntryKind.NOOP, b"")
        self.pending_conf_index = noop.index
        # Entries from earlier terms are now uncommitted work of ours too.
        self.uncommitted_bytes = sum(
            e.size_bytes() for e in self.log.slice(self.log.committed + 1, last + 1)
        )

    def _new_progress(self, n: NodeId, next_index: int) -> Progress:
        return Progress(
            next_index=next_index,
            is_learner=n not in self.conf.voters,
            max_inflight_msgs=self.cfg.max_inflight_msgs,
            max_inflight_bytes=self.cfg.max_inflight_bytes,
        )

    # ================================================================ elections

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if (
            self.promotable()
            and not self.campaigns_paused
            and self.election_elapsed >= self.randomized_election_ticks
        ):
            self.election_elapsed = 0
            self._hup(transfer=False)

    def _hup(self, *, transfer: bool) -> None:
        if self.role is Role.LEADER or self.campaigns_paused or not self.promotable():
            return
        if self.cfg.pre_vote and not transfer:
            self._become_pre_candidate()
            self._request_votes(pre_vote=True, force=False)
        else:
            self._become_candidate()
            self._request_votes(pre_vote=False, force=transfer)

    def _request_votes(self, *, pre_vote: bool, force: bool) -> None:
        term = self.term + 1 if pre_vote else self.term
        if pre_vote:
            # A pre-vote changes nothing durable, so our own counts at once.
            self.votes[self.id] = True
            if self._tally_votes():
                return
        # A real vote for ourselves counts only once term and vote are durable (`advance`).
        # Otherwise a lone voter would lead, and send appends to learners, in a term a crash
        # makes it forget; it would then lead that term again with different entries.
        for n in self.conf.voters:
            if n != self.id:
                self._send(
                    RequestVote(
                        src=self.id,
                        dst=n,
                        term=term,
                        last_index=self.log.last_index(),
                        last_term=self.log.last_term(),
                        pre_vote=pre_vote,
                        force=force,
                    )
                )

    def _tally_votes(self) -> bool:
        """Act on the votes so far. Returns True if the election is decided."""
        quorum = len(self.conf.voters) // 2 + 1
        granted = sum(1 for n, g in self.votes.items() if g and n in self.conf.voters)
        rejected = sum(1 for n, g in self.votes.items() if not g and n in self.conf.voters)
        if granted >= quorum:
            if self.role is Role.PRE_CANDIDATE:
                self._become_candidate()
                self._request_votes(pre_vote=False, force=False)
            else:
                self._become_leader()
            return True
        if rejected > len(self.conf.voters) - quorum:
            self._become_follower(self.term, NONE)
            return True
        return False

    def _handle_vote_request(self, m: RequestVote) -> None:
        can_vote = (
            self.vote == m.src
            or (self.vote == NONE and self.leader == NONE)
            or (m.pre_vote and m.term > self.term)
        )
        if can_vote and self.log.is_up_to_date(m.last_index, m.last_term):
            self._send(
                VoteResponse(src=self.id, dst=m.src, term=m.term, granted=True, pre_vote=m.pre_vote)
            )
            if not m.pre_vote:
                self.election_elapsed = 0
                self.vote = m.src
        else:
            self._send(
                VoteResponse(
                    src=self.id, dst=m.src, term=self.term, granted=False, pre_vote=m.pre_vote
                )
            )

    def _step_candidate(self, m: Message) -> None:
        match m:
            case AppendEntries() | Heartbeat() | InstallSnapshot():
                self._become_follower(m.term, m.src)
                self._step_follower(m)
            case VoteResponse():
                if m.pre_vote != (self.role is Role.PRE_CANDIDATE):
                    return  # an answer to an earlier phase
                self.votes.setdefault(m.src, m.granted)
                self._tally_votes()
            case _:
                pass

    # ================================================================ follower

    def _step_follower(self, m: Message) -> None:
        match m:
            case AppendEntries():
                self.election_elapsed = 0
                self.leader = m.src
                self._handle_append(m)
                self._note_leader_commit(m.commit)
            case Heartbeat():
                self.election_elapsed = 0
                self.leader = m.src
                # The leader sends min(its commit, our match), so this never commits unseen work.
                self.log.commit_to(min(m.commit, self.log.last_index()))
                self._note_leader_commit(m.commit)
                self._send(
                    HeartbeatResponse(src=self.id, dst=m.src, term=self.term, read_ctx=m.read_ctx)
                )
            case InstallSnapshot():
                self.election_elapsed = 0
                self.leader = m.src
                self._handle_snapshot(m)
                # The leader's commit, not the snapshot's index: its newest snapshot can be
                # older than what this node applied before (a wiped, re-added member).
                self._note_leader_commit(max(m.snapshot.meta.index, m.commit))
            case TimeoutNow():
                if self.promotable():
                    self._hup(transfer=True)
            case _:
                pass

    def _handle_append(self, m: AppendEntries) -> None:
        if m.prev_index < self.log.committed:
            self._send(
                AppendResponse(src=self.id, dst=m.src, term=self.term, index=self.log.committed)
            )
            return
        last_new = self.log.maybe_append(m.prev_index, m.prev_term, m.commit, m.entries)
        if last_new is not None and m.entries:
            self._note_confs(m.entries)
        if last_new is not None:
            self._send(AppendResponse(src=self.id, dst=m.src, term=self.term, index=last_new))
        else:
            # Skip, in one round trip, every entry that cannot match: those past our end, and
            # those whose term is above the leader's prev term (etcd's findConflictByTerm).
            hint, hint_term = self.log.find_conflict_by_term(m.prev_index, m.prev_term)
            self._send(
                AppendResponse(
                    src=self.id,
                    dst=m.src,
                    term=self.term,
                    index=m.prev_index,
                    reject=True,
                    reject_hint=hint,
                    reject_term=hint_term,
                )
            )

    def _handle_snapshot(self, m: InstallSnapshot) -> None:
        meta = m.snapshot.meta
        if meta.index <= self.log.committed:
            index = self.log.committed
        elif self.log.match_term(meta.index, meta.term):
            # We already hold that prefix: just learn that it is committed. Acknowledge the
            # commit index, not the last index: entries after it may be an old term's and
            # differ from the leader's, and an ack counts them toward its quorum (etcd alike).
            self.log.commit_to(meta.index)
            index = self.log.committed
        else:
            if self._restore_pending_applied is None:
                self._restore_pending_applied = self.log.applied
            self.log.restore(meta)
            self.snapshot = m.snapshot
            self._base_conf = meta.conf
            self._confs = []
            self.conf = meta.conf
            self._received_snapshot = m.snapshot
            index = meta.index
        self._send(AppendResponse(src=self.id, dst=m.src, term=self.term, index=index))

    # ================================================================ leader

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_ticks:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self._become_follower(self.term, NONE)
                return
            self.transferee = NONE
            for n, pr in self.progress.items():
                if n != self.id:
                    pr.recent_active = False
            if self.id not in self.conf.voters and self.pending_conf_index <= self.log.applied:
                self._hand_over()  # the last attempt went nowhere: try again (maybe another)
        if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self._broadcast_heartbeat(self._reads[-1].ctx if self._reads else 0)
        retry_after = self.cfg.election_ticks * _SNAPSHOT_RETRY_ELECTIONS
        for n, pr in self.progress.items():
            if pr.state is ProgressState.SNAPSHOT:
                elapsed = self._snapshot_sent_elapsed.get(n, 0) + 1
                self._snapshot_sent_elapsed[n] = elapsed
                if elapsed >= retry_after:
                    # No acknowledgement: the snapshot (one large message) was probably lost.
                    pr.become_probe()
        self.idle_elapsed += 1
        if (
            self.idle_elapsed >= self.cfg.idle_tick_ticks
            and self.transferee == NONE
            and self.uncommitted_bytes < self.cfg.max_uncommitted_bytes
        ):
            self._append_new(EntryKind.TICK, b"")

    def _quorum_active(self) -> bool:
        quorum = len(self.conf.voters) // 2 + 1
        active = sum(
            1
            for n in self.conf.voters
            if n == self.id or (n in self.progress and self.progress[n].recent_active)
        )
        return active >= quorum

    def _check_can_propose(self, size_bytes: int) -> None:
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader)
        if self.transferee != NONE:
            raise ProposalDroppedError(f"leadership is moving to node {self.transferee}")
        if self.uncommitted_bytes + size_bytes > self.cfg.max_uncommitted_bytes:
            raise ProposalDroppedError(
                f"{self.uncommitted_bytes} bytes appended but not yet committed "
                f"(limit {self.cfg.max_uncommitted_bytes})"
            )

    def _append_new(self, kind: EntryKind, data: bytes) -> Entry:
        e = Entry(
            term=self.term,
            index=self.log.last_index() + 1,
            tm=max(self.now_tm, self.log.last_tm() + 1),
            kind=kind,
            data=data,
        )
        self.log.append([e])
        self.uncommitted_bytes += e.size_bytes()
        self.idle_elapsed = 0
        self._need_broadcast = True
        return e

    def _flush_broadcast(self) -> None:
        # Appends are broadcast lazily so that every proposal made between two Readies travels
        # in one message per follower. A commit advance is sent even without new entries, so
        # followers apply promptly instead of at the next heartbeat.
        if (self._need_broadcast or self._commit_broadcast) and self.role is Role.LEADER:
            for n in self.progress:
                if n != self.id:
                    self._send_append(n, send_if_empty=self._commit_broadcast)
        self._need_broadcast = False
        self._commit_broadcast = False

    def _broadcast_heartbeat(self, read_ctx: int) -> None:
        for n, pr in self.progress.items():
            if n != self.id:
                self._send(
                    Heartbeat(
                        src=self.id,
                        dst=n,
                        term=self.term,
                        commit=min(pr.match, self.log.committed),
                        read_ctx=read_ctx,
                    )
                )

    def _send_append(self, to: NodeId, *, send_if_empty: bool) -> bool:
        """Send what `to` needs next. Returns False if nothing could be sent."""
        pr = self.progress[to]
        if not send_if_empty and pr.next == self.log.last_index() + 1:
            # Nothing beyond what it was sent: the path below would return False too, after
            # looking up the term of our last entry (never None) and an empty slice.
            return False
        if pr.is_paused():
            return False
        prev_index = pr.next - 1
        prev_term = self.log.term(prev_index)
        if prev_term is None and prev_index <= self.log.snapshot.index:
            return self._send_snapshot(to, pr)
        if prev_term is None:
            # next is beyond our log (stale optimism): probe from the end.
            pr.next = self.log.last_index() + 1
            prev_index = pr.next - 1
            prev_term = self.log.last_term()
        entries = self.log.slice(pr.next, self.log.last_index() + 1, self.cfg.max_msg_bytes)
        if not entries and not send_if_empty:
            return False
        self._send(
            AppendEntries(
                src=self.id,
                dst=to,
                term=self.term,
                prev_index=prev_index,
                prev_term=prev_term,
                entries=tuple(entries),
                commit=self.log.committed,
            )
        )
        if entries:
            pr.sent = max(pr.sent, entries[-1].index)
            if pr.state is ProgressState.REPLICATE:
                last = entries[-1].index
                pr.next = last + 1
                pr.inflights.add(last, sum(e.size_bytes() for e in entries))
            elif pr.state is ProgressState.PROBE:
                pr.probe_sent = True
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, to: NodeId, pr: Progress) -> bool:
        if self.snapshot.is_empty():
            raise RaftInvariantError("follower needs compacted entries but we hold no snapshot")
        pr.become_snapshot(self.snapshot.meta.index)
        pr.sent = max(pr.sent, self.snapshot.meta.index)
        self._snapshot_sent_elapsed[to] = 0
        self.snapshots_sent += 1
        self.snapshot_bytes_sent += len(self.snapshot.data)
        self._send(
            InstallSnapshot(
                src=self.id,
                dst=to,
                term=self.term,
                snapshot=self.snapshot,
                commit=self.log.committed,
            )
        )
        return True

    def _step_leader(self, m: Message) -> None:
        pr = self.progress.get(m.src)
        if pr is None:
            return  # not a member (removed, or never was)
        match m:
            case AppendResponse():
                self._handle_append_response(m, pr)
            case HeartbeatResponse():
                pr.recent_active = True
                pr.probe_sent = False
                if pr.state is ProgressState.REPLICATE and pr.inflights.full():
                    pr.inflights.free_first()
                if pr.match < self.log.last_index() or pr.state is ProgressState.PROBE:
                    self._send_append(m.src, send_if_empty=True)
                if m.read_ctx:
                    self._ack_read(m.read_ctx, m.src)
            case _:
                pass

    def _handle_append_response(self, m: AppendResponse, pr: Progress) -> None:
        pr.recent_active = True
        if m.reject:
            hint = m.reject_hint
            if m.reject_term > 0:
                # The follower's entry at `hint` has term reject_term: our log can only agree
                # with it at or below our last index whose term is <= that.
                hint, _ = self.log.find_conflict_by_term(hint, m.reject_term)
            if pr.maybe_decrease_to(m.index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.src, send_if_empty=True)
            return
        old_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        elif pr.state is ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            self._commit_broadcast = True
        elif old_paused:
            # While paused it missed any commit broadcast: send the commit index even if there
            # are no entries, or it learns it only at the next heartbeat.
            self._send_append(m.src, send_if_empty=True)
        # Stream whatever else it is missing, as far as flow control allows.
        while self._send_append(m.src, send_if_empty=False):
            pass
        if m.src == self.transferee and pr.match == self.log.last_index():
            self._send_timeout_now(m.src)

    def _maybe_commit(self) -> bool:
        voters = self.conf.voters
        if not voters:
            return False
        matches = sorted(
            (self.progress[n].match if n in self.progress else 0 for n in voters), reverse=True
        )
        index = matches[len(voters) // 2]
        # Figure 8: only entries of the current term are committed by counting replicas.
        if index > self.log.committed and self.log.term(index) == self.term:
            self.log.commit_to(index)
            return True
        return False

    def _note_confs(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Bring the membership up to date after `entries` were appended (a follower's append
        may have truncated a suffix first: CONF entries no longer in the log are forgotten)."""
        log = self.log
        confs = self._confs
        while confs and log.term(confs[-1][0]) != confs[-1][1]:
            confs.pop()  # truncated (gone, or replaced by another term's entry)
        for e in entries:
            if (
                e.kind is EntryKind.CONF
                and e.index > log.snapshot.index
                and (not confs or e.index > confs[-1][0])
                and log.term(e.index) == e.term
            ):
                confs.append((e.index, e.term, decode_conf(e.data)))
        self.conf = confs[-1][2] if confs else self._base_conf

    def _sync_progress(self) -> None:
        """A leader tracks every member of its latest membership, and keeps sending to members
        the latest change removed until that change is applied (so they learn of it)."""
        members = set(self.conf.members()) | set(self.conf_at(self.log.applied).members())
        for n in list(self.progress):
            if n not in members:
                del self.progress[n]
        for n in sorted(members):
            if n not in self.progress:
                self.progress[n] = self._new_progress(n, self.log.last_index() + 1)
                if self.role is Role.LEADER and n != self.id:
                    # Probe at once: the change may need the newcomer's ack to commit (1 -> 2).
                    self._send_append(n, send_if_empty=True)
            self.progress[n].is_learner = n not in self.conf.voters

    def _on_conf_applied(self) -> None:
        self._sync_progress()
        if self.id not in self.conf.voters and self.pending_conf_index <= self.log.applied:
            # Removed (or demoted), and the change is committed. Stepping down at once would
            # leave the remaining voters to elect a leader by timeout; as etcd does, keep
            # leading without counting ourselves until a voter of the new membership holds our
            # whole log, then hand leadership to it (proposals and idle ticks stop meanwhile:
            # `transferee` is set).
            self._hand_over()
            return
        if self.transferee not in self.conf.voters:
            self.transferee = NONE
        if self._maybe_commit():
            self._commit_broadcast = True

    def _hand_over(self) -> None:
        """A leader outside the voters: move leadership to the most caught-up voter (TimeoutNow
        as soon as it has our whole log; see `_handle_append_response`)."""
        candidates = [n for n in self.conf.voters if n in self.progress]
        if not candidates:
            self._become_follower(self.term, NONE)
            return
        target = max(candidates, key=lambda n: (self.progress[n].match, -n))
        self.transferee = target
        if self.progress[target].match == self.log.last_index():
            self._send_timeout_now(target)
        else:
            self._send_append(target, send_if_empty=True)

    def _send_timeout_now(self, target: NodeId) -> None:
        self.timeout_now_term = self.term
        self._send(TimeoutNow(src=self.id, dst=target, term=self.term))

    # ================================================================ reads

    def _start_read(self, ctx: int) -> None:
        read = _PendingRead(ctx=ctx, index=self.log.committed, acks={self.id})
        if self.conf.voters == (self.id,):
            self._read_states.append(ReadState(ctx=ctx, index=read.index))
            return
        self._reads.append(read)
        self._broadcast_heartbeat(ctx)

    def _ack_read(self, ctx: int, src: NodeId) -> None:
        for pos, read in enumerate(self._reads):
            if read.ctx == ctx:
                read.acks.add(src)
                quorum = len(self.conf.voters) // 2 + 1
                if len(read.acks & set(self.conf.voters)) >= quorum:
                    # A quorum confirmed our leadership after every earlier read began too.
                    done, self._reads = self._reads[: pos + 1], self._reads[pos + 1 :]
                    self._read_states.extend(ReadState(ctx=r.ctx, index=r.index) for r in done)
                return

    # ================================================================ plumbing

    def _send(self, m: Message) -> None:
        if self.role is Role.LEADER and isinstance(m, _EARLY_TYPES):
            self._early.append(m)
        else:
            self._msgs.append(m)

    def _term_or_fail(self, index: int) -> int:
        t = self.log.term(index)
        if t is None:
            raise RaftInvariantError(f"no term for index {index}")
        return t
