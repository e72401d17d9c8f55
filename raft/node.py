"""The node driver: owns the core, the WAL, the transport and the tick timer.

One asyncio task (`_run`) is the only code that touches the core. Everything else — messages from
peers, proposals, membership calls, reads — is queued and the task is woken. Each loop iteration:

    step every queued input -> ready() -> send early messages -> apply committed entries that
    were already durable here -> persist (one WAL write + fsync: on the loop thread for a small
    batch while no other input waits, else in a worker thread) -> send messages -> apply the
    other committed entries -> advance()

The queue of peer messages is bounded (INBOX_MESSAGES_MAX and INBOX_ENTRY_BYTES_MAX): past it
AppendEntries and heartbeats are dropped as a network drops them (counted), while votes,
TimeoutNow and InstallSnapshot keep a reserve. `hand_over_leadership` (a leader's planned stop)
transfers leadership to the most caught-up voter before the node goes.

While the fsync runs, new inputs keep queueing; the next iteration takes them all at once, so
concurrent proposals share one fsync (group commit) without any timer. Applying what was already
durable before the write means a proposal is answered as soon as its commit is known, not one
fsync (of the next batch) later; and a Ready that only advances the commit index costs no fsync
(the WAL writes such a record without syncing it: the commit index is volatile in Raft).

Safe time is the Tm of the last applied entry. `wait_for_safe_time(ts)` parks until it passes ts.
`ready_to_serve` is False until this node has applied an entry of the current leader's term, so a
restarted node never answers from a state that may miss acknowledged entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import json
import logging
import math
import os
import random
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import msgpack

from hlc import HybridClock, physical_ms, ts_text
from raft.core.conf import decode_conf, decode_conf_context
from raft.core.errors import (
    ConfChangeError,
    LearnerBehindError,
    NotLeaderError,
    ProposalDroppedError,
    RaftCoreError,
)
from raft.core.raft import RaftCore, Status
from raft.core.ready import CoreConfig, Ready
from raft.core.types import (
    AppendEntries,
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
    TimeoutNow,
    VoteResponse,
)
from raft.errors import (
    MalformedConfStateError,
    MalformedFrameError,
    NodeIdentityError,
    NodeStateWriteError,
    RaftError,
    TransportConfigError,
)
from raft.filebytes import FileBytes, FileReadError, SnapshotData
from raft.framing import msgpack_bin_header, unpack_msgpack
from raft.limits import (
    PEER_FRAME_BYTES_MAX,
    PEER_FRAME_ITEMS_MAX,
    SNAPSHOT_SAVE_RETRY_MS_MAX,
    SNAPSHOT_SAVE_RETRY_MS_MIN,
)
from raft.oserror import errno_text
from raft.ratelimit import LogBudget
from raft.tls import TlsFiles
from raft.transport import PeerTransport, check_peers
from raft.wal import (
    WAL_RECORD_BYTES_MAX,
    PreparedSnapshot,
    RecordTooLargeError,
    RecoveredState,
    WalError,
    WalIOError,
    WriteAheadLog,
)
from raft.wire import decode_address_book, encode_address_book

log = logging.getLogger("raft.node")

Address = tuple[str, int]

# Peer messages waiting for the driver (its inbox). The driver takes them all every loop
# pass, so they pile up only while it awaits an fsync or is blocked (encoding a large
# snapshot) and peers keep sending. Past the bound the replication stream (AppendEntries and
# heartbeats with their responses) is dropped as a network may drop it: the leader sends
# again what a follower lacks (a gap makes the follower reject, and the leader probes), and
# the older heartbeats still queued reset the election timer as a newer one would. A message
# that is costly to lose or rare is kept within INBOX_RESERVED_MESSAGES more: votes (an
# election under load would drag on), TimeoutNow (a transfer), and a whole InstallSnapshot
# (at most one per peer at a time, perhaps minutes of transfer: lost, it starts again).
INBOX_MESSAGES_MAX = 10_000
INBOX_RESERVED_MESSAGES = 1_000
# Entry bytes (Entry.size_bytes) of the AppendEntries in the inbox, and the data bytes of its
# one-frame InstallSnapshots. The first message is always taken, however large (one entry may
# fill a frame), so a node can always make progress.
INBOX_ENTRY_BYTES_MAX = 2 * PEER_FRAME_BYTES_MAX
_ENTRY_OVERHEAD_BYTES = 32  # per entry, as Entry.size_bytes counts it
# Proposals taken from the queue per loop iteration: bounds one WAL write and one Ready.
PROPOSALS_PER_BATCH_MAX = 4096
# Proposals waiting for the loop; beyond this propose() fails fast instead of queueing forever.
PROPOSAL_QUEUE_MAX = 100_000
# The largest proposal: its entry must fit one WAL record and one peer frame. The envelope
# (term, index, tm, kind, msgpack headers; an AppendEntries around it) is far below 64 KiB.
ENTRY_ENVELOPE_BYTES_MAX = 64 * 1024
PROPOSAL_BYTES_MAX = min(WAL_RECORD_BYTES_MAX, PEER_FRAME_BYTES_MAX) - ENTRY_ENVELOPE_BYTES_MAX
# A Ready with at most this many entries is made durable on the loop thread when nothing else
# waits for the loop (see RaftNode._persist_inline); larger ones go to the WAL thread.
PERSIST_INLINE_ENTRIES_MAX = 8
# ... and at most this many bytes of entry data: writing a large entry (a commit of 10k files is
# megabytes) blocks the loop long enough to delay heartbeats and cost the leadership.
PERSIST_INLINE_BYTES_MAX = 64 * 1024
# A learner is promoted only once it holds every committed entry but at most this many.
PROMOTE_LAG_ENTRIES_MAX = 100
# A peer that sent a Tm beyond our clock + max offset is ignored for this many (maximal) election
# timeouts: long enough for the others to elect a leader with a sane clock.
CLOCK_SUSPECT_ELECTIONS = 5
# A heartbeat's clock sample counts for this many (maximal) election timeouts.
CLOCK_SAMPLE_FRESH_ELECTIONS = 5
# A node that applied its own removal and has then heard from no peer for this many (maximal)
# election timeouts stops dialling its peers: they refuse it, so it would otherwise reconnect
# (and both sides log the refusal) every RECONNECT_BACKOFF_MS_MAX for ever. A node that still
# hears from a leader (the same id added back while it replays the log) keeps its links. One
# that stopped still accepts its peers' connections, and dials again once it hears one (a
# leader that added it back).
REMOVED_QUIET_ELECTIONS = 5
# Leader lease (see RaftNode.leader_lease_until_monotonic). The share of the election timeout
# kept as margin for clocks: the followers measure their election timeout on their own
# monotonic clocks (tick timers), the leader its lease on its own; a follower clock running up
# to this much faster than the leader's cannot make it vote before the lease ends. (NTP slews
# at most 0.05 %; quartz drifts ~0.01 %: 10 % covers a virtualised clock gone badly wrong.)
LEASE_CLOCK_DRIFT_FRACTION = 0.1
# Missed ticks the ticker replays after its event loop was blocked before it resynchronises
# instead (see _ticker); at most a third of the election ticks, since that many ticks counted
# after a heartbeat may have been due before it, which shortens the leader lease.
TICKS_REPLAYED_MAX = 10
# Heartbeats per follower remembered until acknowledged (by their clock_ms stamp, which the
# response echoes); beyond this the oldest are forgotten (an answer to one then proves nothing).
LEASE_HEARTBEATS_TRACKED_MAX = 64


def _proves_ahead(sample: _ClockSample | None, limit_ms: int) -> bool:
    """Does `sample` prove that we are more than `limit_ms` ahead of the peer? Only a round
    trip can (a one-way sample has no upper bound: its delay could hide anything)."""
    return sample is not None and sample.high is not None and sample.high < -limit_ms


@dataclasses.dataclass(frozen=True, slots=True)
class _ClockSample:
    """A peer's clock minus ours (ms): the estimate and what it proves, [low, high] (high is
    None for a one-way sample, which only bounds it from below), sampled at monotonic `at`."""

    offset: int
    low: int
    high: int | None
    at: float


# In the data directory: {"cluster_id", "node_id", "created_at_ms"}, written at a member's
# first start (see RaftNode._check_identity).
IDENTITY_FILE = "IDENTITY"
# Parked safe-time waiters.
SAFE_TIME_WAITERS_MAX = 100_000


# ---------------------------------------------------------------------------- errors


class NodeStoppedError(RaftError):
    code = "node_stopped"


class ProposalTimeoutError(RaftError):
    """The proposal may or may not commit: retry with the same request id to stay idempotent."""

    code = "proposal_timeout"


class SafeTimeTimeoutError(RaftError):
    code = "safe_time_timeout"

    def __init__(self, wanted_ts: int, safe_time: int, timeout_ms: int) -> None:
        self.wanted_ts = wanted_ts
        self.safe_time = safe_time
        self.lag_ms = max(0, physical_ms(wanted_ts) - physical_ms(safe_time))
        super().__init__(
            f"safe time {ts_text(safe_time)} did not reach {ts_text(wanted_ts)} within "
            f"{timeout_ms} ms (lagging {self.lag_ms} ms)"
        )


class QueueFullError(RaftError):
    code = "queue_full"


class ProposalTooLargeError(RaftError):
    """The proposal could never be written to the WAL or sent to a peer. Refused before it
    reaches the log: an entry over those bounds would crash every node that applies or replays
    it. Not retryable as is."""

    code = "proposal_too_large"


class ReadIndexError(RaftError):
    code = "read_index_failed"


# ---------------------------------------------------------------------------- interfaces


class StateMachine(Protocol):
    """What the layer above plugs in. Called only from the driver task, in log order."""

    def apply(self, entry: Entry) -> Any:
        """Apply one committed entry (every kind: NOOP/TICK/CONF entries advance time too).
        The return value of a NORMAL entry goes back to its proposer."""

    def snapshot(self) -> bytes:
        """The whole state as of the last applied entry, as immutable bytes (never a view of a
        buffer that `apply` changes: the node writes them to disk from another thread while
        it applies the entries that follow)."""

    def restore(self, data: SnapshotData) -> None:
        """Replace the whole state (b"" means empty). A large state comes as a FileBytes, left
        in its file (raft.filebytes): read it in chunks (`chunks`, or `FileBytesReader` for a
        streaming decoder) and do not keep a reference to it. Its reads raise FileReadError
        (an OSError) when the disk fails them: let it propagate (the node stops on it, as on
        any storage fault)."""

    # Optional: `prepare_restore(data) -> Callable[[], None]`, the first half of `restore`:
    # run in a worker thread when a follower installs a leader's snapshot, while the loop goes
    # on serving (the driver awaits it: nothing is applied meanwhile); it must only read `data`
    # and build the new state aside. The function it returns installs that state, on the loop.
    # Looked up by name; without it `restore` runs on the loop.
    # Optional: `prepare_snapshot() -> Callable[[], Sequence[bytes | memoryview]]`, `snapshot`
    # in two halves: called where `snapshot` would be, it takes a view of the state at the
    # last applied entry; the function it returns encodes that view in a worker thread, while
    # later entries apply (so the view must not change with them), as the parts of what
    # `snapshot` returns (written one after the other, never joined). Then, on the loop once
    # the snapshot is stored, `snapshot_written()` if it has one. Looked up by name; without
    # it `snapshot` runs on the loop.
    # Optional: `prepare_appended(entries: Sequence[Entry]) -> None`, told of entries as they
    # are appended to this node's log, before they commit (some never do: a new leader may
    # overwrite them). It may prepare their apply off the loop (decode a large payload in a
    # thread); what `apply` then decides must not depend on it. Looked up by name, so a state
    # machine without it needs nothing.


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    node_id: NodeId
    cluster_id: str
    data_dir: Path
    listen_host: str
    listen_port: int
    # Every initial member's Raft address, this node included (ignored for a joining node's
    # membership, which it learns from the leader).
    peers: Mapping[NodeId, Address]
    secret: bytes = field(repr=False)  # never in a traceback or test report
    tick_ms: int = 10
    # Election timeouts are drawn from [election_timeout_ms, 2 * election_timeout_ms).
    election_timeout_ms: int = 300
    heartbeat_interval_ms: int = 50
    idle_safe_time_interval_ms: int = 250
    fsync: bool = True
    snapshot_every_entries: int = 10_000
    # Entries kept in memory behind a snapshot, so a follower that is a little behind catches up
    # from entries instead of a whole snapshot. (The WAL keeps only what follows its newest
    # snapshot: after a restart the tail grows back from new entries.)
    snapshot_keep_entries: int = 1_000
    max_clock_offset_ms: int = 500
    join: bool = False
    # Whether this start may create the member's identity in an empty data directory (its
    # first start; see `_check_identity`). False: an empty data directory is refused.
    new_member: bool = True
    pre_vote: bool = True
    check_quorum: bool = True
    # Fault injection only (tests/chaos): connect to these peers here instead of at their
    # member address, whatever the configuration entries say. Never persisted or replicated.
    dial_overrides: Mapping[NodeId, Address] = field(default_factory=dict)
    # Mutual TLS on peer links (raft.tls), under the HMAC handshake; None: plain TCP.
    tls: TlsFiles | None = None
    # With TLS: whether a peer certificate (SHA-256 fingerprint of its DER, hex) is revoked;
    # see PeerTransport. Never persisted: the application keeps the list.
    peer_revoked: Callable[[str], bool] | None = None
    # Small appends are made durable on the loop thread when it is otherwise idle (see
    # RaftNode._persist_inline); False: every synced append goes to the WAL thread.
    persist_inline: bool = True

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            node_id=self.node_id,
            election_ticks=max(2, self.election_timeout_ms // self.tick_ms),
            heartbeat_ticks=max(1, self.heartbeat_interval_ms // self.tick_ms),
            idle_tick_ticks=max(1, self.idle_safe_time_interval_ms // self.tick_ms),
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProposalResult:
    index: int
    term: int
    tm: int
    result: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    core: Status
    ready_to_serve: bool
    safe_time: int
    safe_time_lag_ms: int
    peers: dict[NodeId, Address]
    wal: dict[str, Any] = field(default_factory=dict)
    transport: dict[str, Any] = field(default_factory=dict)
    stopped_reason: str = ""
    # The last time a peer sent a Tm beyond this node's clock + max offset (empty: never).
    clock_alarm: dict[str, int] = field(default_factory=dict)
    # Each peer's clock minus ours (ms, from recent heartbeats), and why this node fenced itself
    # for running ahead ("" = not fenced).
    clock_offsets_ms: dict[NodeId, int] = field(default_factory=dict)
    clock_fenced: str = ""
    # Peer messages dropped because the driver's inbox was full (see INBOX_MESSAGES_MAX).
    inbox_dropped: int = 0
    # Membership entries and snapshots met whose address book this node could not use.
    unusable_address_books: int = 0
    # For the operator's metrics (see RaftNode.metrics_counters for what each counts).
    counters: dict[str, float] = field(default_factory=dict)
    # A leader's last heartbeat round trip to each follower (seconds; see _note_heartbeat_acked).
    peer_round_trip_s: dict[NodeId, float] = field(default_factory=dict)
    # Why this node's last attempt to save a snapshot of its own failed ("" = it did not, or
    # a later one succeeded): it serves from its log meanwhile and tries again (_maybe_snapshot).
    snapshot_save_error: str = ""


@dataclass(slots=True)
class _Proposal:
    data: bytes
    future: asyncio.Future[ProposalResult]


@dataclass(slots=True)
class _Op:
    """A call that must run inside the driver task (membership, transfer, read index)."""

    fn: Callable[[], Any]
    future: asyncio.Future[Any]


# Messages the inbox keeps in its reserve (see INBOX_MESSAGES_MAX).
_INBOX_KEPT_TYPES: Final = frozenset({RequestVote, VoteResponse, TimeoutNow, InstallSnapshot})
# Warnings about inbox drops: at most this many at once, then per second (the rest counted).
INBOX_WARNINGS_BURST = 10
INBOX_WARNINGS_PER_S = 1.0

# Under the data directory: incoming snapshot transfers (deleted when complete or dropped).
SNAPSHOT_SPOOL_DIR: Final = "snapshot-spool"


def wrap_snapshot_data(app_data: bytes, addresses: Mapping[NodeId, Address]) -> bytes:
    """A node's snapshot payload: msgpack [1, app_data, addresses] (the application state and
    every member's Raft address). Used by snapshots and by a restore that seeds a new cluster."""
    return b"".join(wrap_snapshot_parts(app_data, addresses))


def wrap_snapshot_parts(
    app_data: bytes | Sequence[bytes | memoryview], addresses: Mapping[NodeId, Address]
) -> tuple[bytes | memoryview, ...]:
    """`wrap_snapshot_data` as parts to write one after the other: framed around app_data (the
    whole application state, or its parts in order) instead of packed or joined, which would
    copy it."""
    app_parts = (app_data,) if isinstance(app_data, bytes) else tuple(app_data)
    head = b"\x93\x01" + msgpack_bin_header(sum(map(len, app_parts)))
    return head, *app_parts, msgpack.packb(encode_address_book(addresses))


def unwrap_snapshot_data(
    data: SnapshotData,
) -> tuple[SnapshotData, dict[NodeId, Address]]:
    """(app_data, addresses) of a `wrap_snapshot_data` payload. app_data is a view (or file
    range) into `data`, not a copy (unpacking would copy the whole state): the layout is the
    one written above. Raises RaftError for a payload of another layout,
    SnapshotAddressBookError for an address book that is not one
    (`raft.wire.decode_address_book`), FileReadError when `data`'s file cannot be read."""
    app_data, packed_book = _split_snapshot_data(data)
    return app_data, _decode_snapshot_address_book(packed_book)


def snapshot_app_data(data: SnapshotData) -> SnapshotData:
    """The application state of a `wrap_snapshot_data` payload (a view, not a copy), whatever
    its address book holds: for a tool that needs only the state (an offline backup), as the
    node itself keeps the state of a snapshot whose book it cannot use (`_unwrap_snapshot`).
    Raises RaftError for a payload of another layout."""
    return _split_snapshot_data(data)[0]


class SnapshotAddressBookError(RaftError):
    """A snapshot's address book is unusable (its application state may still be fine)."""

    code = "snapshot_address_book_malformed"


# The address book after a snapshot's state: a few dozen bytes per member.
_SNAPSHOT_BOOK_BYTES_MAX: Final = 1024 * 1024


def _split_snapshot_data(data: SnapshotData) -> tuple[SnapshotData, bytes | memoryview]:
    """(app_data, the address book's msgpack) of a `wrap_snapshot_data` payload."""
    if not data:
        return b"", b""
    head = data.read(0, 8) if isinstance(data, FileBytes) else memoryview(data)
    if bytes(head[:2]) != b"\x93\x01":
        raise RaftError(f"unknown snapshot format (starts with {bytes(head[:2]).hex()})")
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}.get(head[2] if len(head) > 2 else -1)
    if width is None or len(head) < 3 + width:
        raise RaftError("snapshot payload: application data is not a msgpack bin value")
    size = int.from_bytes(head[3 : 3 + width], "big")
    start = 3 + width
    if start + size > len(data):
        raise RaftError("snapshot payload: application data runs past its end")
    if not isinstance(data, FileBytes):
        view = memoryview(data)
        return view[start : start + size], view[start + size :]
    if len(data) - start - size > _SNAPSHOT_BOOK_BYTES_MAX:
        raise RaftError("snapshot payload: address book over 1 MiB")
    return data.slice(start, start + size), data.read(start + size, len(data))


def _decode_snapshot_address_book(packed: bytes | memoryview) -> dict[NodeId, Address]:
    if not packed:
        return {}
    try:
        book = unpack_msgpack(packed, max_bytes=len(packed), max_items=PEER_FRAME_ITEMS_MAX)
    except MalformedFrameError as exc:
        raise SnapshotAddressBookError(
            f"snapshot payload: undecodable address book: {exc}"
        ) from exc
    if type(book) is not bytes:
        raise SnapshotAddressBookError("snapshot payload: the address book is not msgpack bytes")
    try:
        return decode_address_book(book)
    except MalformedConfStateError as exc:
        raise SnapshotAddressBookError(f"snapshot payload: malformed {exc}") from exc


class RaftNode:
    def __init__(
        self,
        config: NodeConfig,
        state_machine: StateMachine,
        *,
        clock: HybridClock,
        rng: random.Random | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        # The clock of the leader lease (injected by tests; other timers use time.monotonic).
        self._monotonic = monotonic
        self.sm = state_machine
        self.clock = clock
        self._rng = rng or random.Random()
        self._on_fatal = on_fatal
        self.core: RaftCore | None = None
        self.wal: WriteAheadLog | None = None
        self.transport: PeerTransport | None = None
        self.addresses: dict[NodeId, Address] = dict(config.peers)
        # Addresses from CONF entries appended but not yet applied, by index: membership takes
        # effect on append (raft.core.raft), so a new member must be reachable before its
        # change commits (the change may need its vote or its ack, as in 1 -> 2 voters).
        self._appended_conf_addresses: dict[int, dict[NodeId, Address]] = {}
        self._applied_addresses: dict[NodeId, Address] = dict(config.peers)
        self._inbox: list[Message] = []
        # Entry bytes of the AppendEntries in the inbox (see _admit_to_inbox),
        # messages dropped for a full inbox, and the budget of warnings about them.
        self._inbox_entry_bytes = 0
        self.inbox_dropped = 0
        self._inbox_warnings = LogBudget(burst=INBOX_WARNINGS_BURST, per_s=INBOX_WARNINGS_PER_S)
        # A leader's AppendEntries without entries, per follower, held back for one loop pass
        # (see _send).
        self._deferred: dict[NodeId, AppendEntries] = {}
        self._proposals: list[_Proposal] = []
        self._ops: list[_Op] = []
        self._waiting: dict[int, tuple[int, asyncio.Future[ProposalResult]]] = {}
        self._reads: dict[int, asyncio.Future[int]] = {}
        self._read_ctx = itertools.count(1)
        self._read_waiters: list[tuple[int, int, asyncio.Future[int]]] = []  # (index, seq, fut)
        self._safe_waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # (ts, seq, fut)
        self._seq = itertools.count()
        self._ticks_due = 0
        self._wake = asyncio.Event()
        self._io = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"raft-wal-{config.node_id}"
        )
        self._tasks: list[asyncio.Task[None]] = []
        # A snapshot file being written by its own thread (see _maybe_snapshot).
        self._snapshot_task: asyncio.Task[PreparedSnapshot] | None = None
        self._stopped = False  # no more work: stop() was called, or a fatal error happened
        self._closed = False  # stop() released the resources
        self.stopped_reason = ""
        self.applied_listeners: list[Callable[[Entry], None]] = []
        # This node's own removal (see _note_membership): whether an applied membership held
        # it, the index of the applied change that then removed it (0: none), when it last
        # heard from a peer, and whether it stopped dialling its peers for it.
        self._was_member = False
        self._removed_at = 0
        self._last_heard = time.monotonic()
        self._links_dropped = False
        self.fsync_seconds_total = 0.0
        self.loop_iterations = 0
        # Operator counters (metastore_* metrics). Each costs at most an int compare per loop
        # pass, never per proposal on success: the lone-proposal latency is benchmarked.
        # Terms in which this node learnt of a leader (one leader per term: leader changes).
        self.leader_changes_seen = 0
        self._leader_seen_term = 0
        self.proposals_failed = 0  # propose() calls that raised (timeout, not leader, dropped)
        self.snapshots_saved = 0
        self.snapshot_save_seconds_total = 0.0
        self.snapshot_last_saved_bytes = 0
        self._snapshot_started = 0.0
        # Saves of this node's own snapshot that failed with the log intact (see
        # _snapshot_save_failed), the last one's error ("" once one succeeds), and when the
        # next may start (time.monotonic) after the current backoff.
        self.snapshot_save_failures = 0
        self.snapshot_save_error = ""
        self._snapshot_retry_at = 0.0
        self._snapshot_retry_ms = 0
        self.snapshots_installed = 0
        self.snapshot_install_seconds_total = 0.0
        self.snapshot_last_installed_bytes = 0
        self._peer_round_trip_s: dict[NodeId, float] = {}
        # Tm and index of the last entry applied before its Ready was persisted (see
        # _handle_ready). The core's own counters catch up in advance(); until then these keep
        # safe time and read barriers in step with what the state machine holds.
        self._applied_ahead_tm = 0
        self._applied_ahead_index = 0
        # Peers ignored until a monotonic time, for sending a Tm beyond our clock (see
        # _clock_fenced), and the last such event (shown by status()).
        self._clock_suspects: dict[NodeId, float] = {}
        self.clock_alarm: dict[str, int] = {}
        # Peers' clock offsets from their heartbeats: peer -> (their clock - ours in ms,
        # monotonic time of the sample); and why this node fenced itself ("" = it did not).
        self._peer_clocks: dict[NodeId, _ClockSample] = {}
        # The clock_ms of the last heartbeat (or response) heard from each peer, the peer's
        # incarnation that came with it and the monotonic time it arrived, echoed in the next
        # one we send it: a round trip for the peer's clock sample (see _stamp for why a leader
        # adds how long it held it).
        self._last_peer_clock: dict[NodeId, tuple[int, int, float]] = {}
        # This process's incarnation, stamped on its heartbeats and responses: an echo that
        # does not carry it echoes a clock another process sent (this node's before a restart,
        # whose clock may have been wrong), which proves nothing about ours (_echoes_own_clock).
        # Drawn from the OS, not `rng`: a test's seeded rng repeats across restarts.
        self.incarnation = secrets.randbits(64) or 1
        self.clock_fenced = ""
        self._fenced_by_quorum = False  # True: also no campaigns (see _check_own_clock)
        # Leader lease (see leader_lease_until_monotonic), for the term `_lease_term` only:
        # per follower, the monotonic send time of each heartbeat not yet acknowledged, by its
        # clock_ms stamp (the response echoes it), and the send time of the newest heartbeat it
        # acknowledged. `_lease_void_term`: a term in which this node sent TimeoutNow (the
        # target's election skips the followers' lease check).
        self._lease_term = 0
        self._lease_void_term = 0
        self._heartbeats_unacked: dict[NodeId, dict[int, float]] = {}
        self._heartbeat_acked_sent_at: dict[NodeId, float] = {}
        # Vote requests (but a transfer's) are dropped until then (see start).
        self._votes_refused_until_monotonic = -math.inf
        # Ticks that were due when the last message in the inbox arrived (see _step_inputs).
        self._ticks_due_at_last_message = 0
        # CONF entries and snapshots met whose address book was unusable (see
        # _conf_entry_addresses); logged each time.
        self.unusable_address_books = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        wal, rec = await loop.run_in_executor(
            self._io, lambda: WriteAheadLog.open(cfg.data_dir / "wal", fsync=cfg.fsync)
        )
        try:
            await loop.run_in_executor(self._io, self._check_identity, rec)
        except BaseException:
            wal.close()  # its lock too: the start may be tried again in this process
            raise
        self.wal = wal
        bootstrap = (
            ConfState() if cfg.join else ConfState(voters=tuple(sorted(cfg.peers)), learners=())
        )
        snapshot = rec.snapshot
        if not cfg.join:
            self._was_member = cfg.node_id in bootstrap.members()
        if not snapshot.is_empty():
            self._note_membership(snapshot.meta.conf, snapshot.meta.index)
            app_data, addresses = self._unwrap_snapshot(snapshot.data)
            self.sm.restore(app_data)
            self.addresses.update(addresses)
            self._applied_addresses = dict(self.addresses)
        else:
            self.sm.restore(b"")
        self._note_appended_confs(rec.entries)
        self.clock.observe(max([rec.snapshot.meta.tm, *(e.tm for e in rec.entries[-1:])]))
        self.core = RaftCore(
            cfg.core_config(),
            hard_state=rec.hard_state,
            snapshot=snapshot,
            entries=list(rec.entries),
            bootstrap_conf=bootstrap,
            rng=self._rng,
        )
        if cfg.check_quorum:
            # A restarted voter does not know when it last heard from its leader (the core
            # starts with no leader, so its check-quorum lease would let it vote at once): it
            # refuses votes for one election timeout, which a leader's lease relies on (see
            # leader_lease_until_monotonic).
            self._votes_refused_until_monotonic = self._monotonic() + cfg.election_timeout_ms / 1000
        self.transport = PeerTransport(
            node_id=cfg.node_id,
            listen_host=cfg.listen_host,
            listen_port=cfg.listen_port,
            peers=self._dial_addresses(self.addresses),
            secret=cfg.secret,
            on_message=self._on_message,
            cluster_id=cfg.cluster_id,
            tls=cfg.tls,
            revoked=cfg.peer_revoked,
            # A snapshot from the leader is spooled to disk and read from there, never held on
            # the heap.
            snapshot_spool_dir=cfg.data_dir / SNAPSHOT_SPOOL_DIR,
        )
        await self.transport.start()
        self._tasks = [
            asyncio.create_task(self._run(), name=f"raft-loop-{cfg.node_id}"),
            asyncio.create_task(self._ticker(), name=f"raft-tick-{cfg.node_id}"),
        ]
        log.info(
            "node started",
            extra={
                "node_id": cfg.node_id,
                "term": rec.hard_state.term,
                "commit": rec.hard_state.commit,
                "entries": len(rec.entries),
                "snapshot_index": rec.snapshot.meta.index,
            },
        )

    async def stop(self) -> None:
        """Stop the node and release what it holds (tasks, links, the WAL and its lock). Also
        after a fatal error, which only stops the work (`_stopped`): the resources are released
        here, once."""
        if self._closed:
            return
        self._closed = True
        self._stopped = True
        self.stopped_reason = self.stopped_reason or "stopped"
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.transport is not None:
            await self.transport.stop()
        self._fail_all(NodeStoppedError(f"node stopped: {self.stopped_reason}"))
        if self._snapshot_task is not None:
            # Let its thread finish with the file before the log closes (an uncommitted file is
            # a temporary one: recovery deletes it).
            with contextlib.suppress(Exception):
                await self._snapshot_task
            self._snapshot_task = None
        if self.wal is not None:
            wal = self.wal
            await asyncio.get_running_loop().run_in_executor(self._io, wal.close)
        self._io.shutdown(wait=True)

    def _fail_all(self, exc: BaseException) -> None:
        for p in self._proposals:
            if not p.future.done():
                p.future.set_exception(exc)
        self._proposals.clear()
        for _, f in self._waiting.values():
            if not f.done():
                f.set_exception(exc)
        self._waiting.clear()
        for op in self._ops:
            if not op.future.done():
                op.future.set_exception(exc)
        self._ops.clear()
        for fr in self._reads.values():
            if not fr.done():
                fr.set_exception(exc)
        for _, _, fi in self._read_waiters:
            if not fi.done():
                fi.set_exception(exc)
        for _, _, fs in self._safe_waiters:
            if not fs.done():
                fs.set_exception(exc)

    # ------------------------------------------------------------------ public API

    @property
    def node_id(self) -> NodeId:
        return self.config.node_id

    @property
    def safe_time(self) -> int:
        return max(self.core.applied_tm, self._applied_ahead_tm) if self.core else 0

    @property
    def ready_to_serve(self) -> bool:
        """Whether reads may be answered from this node's state. Not once it has applied its
        own removal: it applies nothing after it, so its state only ages (clients that still
        list it go to another endpoint on NOT_READY)."""
        return (
            self.core is not None
            and not self._stopped
            and not self.clock_fenced
            and not self._removed_at
            and self.core.caught_up()
        )

    @property
    def removed_at_index(self) -> int:
        """The index of the applied membership that removed this node (0: a member, or never
        one)."""
        return self._removed_at

    def is_leader(self) -> bool:
        return self.core is not None and self.core.is_leader()

    def leader_id(self) -> NodeId:
        return self.core.leader if self.core else 0

    def leader_term(self) -> int:
        """The term this node leads in; 0 when it does not lead. Cheap, and callable from a
        worker thread (GC's deletions ask it between files): it reads two fields the event loop
        writes, and a read between a step-down's writes gives 0 or a term other than the
        caller's, which also stops the caller."""
        core = self.core
        if core is None or not core.is_leader():
            return 0
        return core.term

    def tighten_max_clock_offset(self, max_offset_ms: int) -> None:
        """Fence (and drop entries far ahead) by `max_offset_ms` from now on if it is below
        the configured `max_clock_offset_ms`; a larger value changes nothing. The metastore
        calls it with the cluster's CSmax once it knows it (the config file's may be larger,
        and a fence looser than the CSmax the DDL replies wait for breaks read-your-writes)."""
        if 0 <= max_offset_ms < self.config.max_clock_offset_ms:
            self.config = dataclasses.replace(self.config, max_clock_offset_ms=max_offset_ms)
            log.warning("clock offset bound lowered to %d ms (the cluster's CSmax)", max_offset_ms)

    def lease_duration_s(self) -> float:
        """How long after a voter received a heartbeat of this node's term it cannot vote for
        (or become) another leader, on the leader's clock. A follower refuses votes (pre-votes
        included) while fewer than `election_ticks` ticks passed since it heard from its leader
        (check-quorum's lease in raft.core.raft `step`), and campaigns itself only after at
        least as many (the randomized timeout is in [election_ticks, 2 * election_ticks)). Those
        ticks span at least (election_ticks - 1 - replayed) tick intervals: the first may come
        right after the heartbeat, and a ticker late after a blocked loop replays up to
        `replayed` (TICKS_REPLAYED_MAX, at most a third of election_ticks) missed ticks; and
        a follower drops, not counts, ticks that piled up before a message it steps (see
        _step_inputs), and a restarted one refuses votes for an election timeout (see start).
        Less LEASE_CLOCK_DRIFT_FRACTION for clock rates. 0 when check-quorum is off (a voter
        then votes as soon as it sees a higher term)."""
        cfg = self.config
        if not cfg.check_quorum:
            return 0.0
        ticks = cfg.core_config().election_ticks - 1 - self._ticks_replayed_max()
        return max(0, ticks) * cfg.tick_ms / 1000 * (1 - LEASE_CLOCK_DRIFT_FRACTION)

    def _ticks_replayed_max(self) -> int:
        return min(TICKS_REPLAYED_MAX, self.config.core_config().election_ticks // 3)

    def leader_lease_until_monotonic(self) -> float:
        """The monotonic time (`monotonic`, time.monotonic by default) until which no other
        node can have been elected leader: -inf when this node does not lead, inf for a lone
        voter. A quorum (this node included) acknowledged heartbeats of this term sent at or
        after `base`; each of those voters received its heartbeat after `base`, so none votes
        before `base + lease_duration_s()`, and any other leader needs one of their votes.
        Send times, not receive times: the follower's timer starts when it receives, which is
        after the send however long the round trip took. Renewed by every heartbeat round
        (heartbeat_interval_ms), whatever the load. Callable from a worker thread (GC's
        deletions ask it before each file): it reads fields the event loop writes and copies
        one dict (atomic under the GIL)."""
        core = self.core
        if core is None or not core.is_leader():
            return -math.inf
        term = core.term
        voters = core.conf.voters
        if self.config.node_id not in voters:
            return -math.inf  # a leader removed from the voters hands over (TimeoutNow)
        others = [v for v in voters if v != self.config.node_id]
        if not others:
            return math.inf
        if (
            term != self._lease_term
            or term == self._lease_void_term
            or term == core.timeout_now_term  # queued, maybe not yet sent (and stamped)
            or core.transferee
        ):
            return -math.inf
        acked = self._heartbeat_acked_sent_at.copy()
        # This node is one voter of the quorum (it leads: it votes for nobody else).
        acks_needed = len(voters) // 2
        sent_at = sorted((acked.get(v, -math.inf) for v in others), reverse=True)
        base = sent_at[acks_needed - 1]
        return base + self.lease_duration_s()

    def _note_heartbeat_sent(self, m: Heartbeat, clock_ms: int) -> None:
        if m.term != self._lease_term:
            self._lease_term = m.term
            self._heartbeats_unacked = {}
            self._heartbeat_acked_sent_at = {}
        sent = self._heartbeats_unacked.setdefault(m.dst, {})
        # Two heartbeats with one stamp: keep the earlier send (an echo proves only that).
        sent.setdefault(clock_ms, self._monotonic())
        if len(sent) > LEASE_HEARTBEATS_TRACKED_MAX:
            del sent[next(iter(sent))]

    def _note_heartbeat_acked(self, m: HeartbeatResponse) -> None:
        """A response of our lease term echoing a heartbeat we sent: the follower received
        that heartbeat (at or after its send) and still followed us in this term."""
        sent = self._heartbeats_unacked.get(m.src)
        if sent is None or m.term != self._lease_term or not self._echoes_own_clock(m):
            return
        sent_at = sent.get(m.echo_ms)
        if sent_at is None:
            return
        if sent_at > self._heartbeat_acked_sent_at.get(m.src, -math.inf):
            self._heartbeat_acked_sent_at[m.src] = sent_at
        # Once per heartbeat response (ticks, not proposals): the peer's round trip.
        self._peer_round_trip_s[m.src] = self._monotonic() - sent_at
        # Forget the heartbeats sent until then (insertion order is send order).
        while sent:
            first = next(iter(sent))
            if sent[first] > sent_at:
                break
            del sent[first]

    async def propose(self, data: bytes, *, timeout_ms: int = 5_000) -> ProposalResult:
        """Replicate `data`; returns once it is applied on this node (the leader)."""
        self._check_running()
        if len(data) > PROPOSAL_BYTES_MAX:
            raise ProposalTooLargeError(
                f"proposal of {len(data)} bytes is over PROPOSAL_BYTES_MAX={PROPOSAL_BYTES_MAX} "
                "(the WAL record and peer frame limits, less the entry's envelope)"
            )
        if self.core is not None and not self.core.is_leader():
            self.proposals_failed += 1
            raise NotLeaderError(self.core.leader)
        if len(self._proposals) >= PROPOSAL_QUEUE_MAX:
            self.proposals_failed += 1
            raise QueueFullError(f"{PROPOSAL_QUEUE_MAX} proposals already queued")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ProposalResult] = loop.create_future()
        self._proposals.append(_Proposal(data=data, future=fut))
        self._wake.set()
        # One timer handle per call, failing the future itself when it fires: wait_for would
        # spawn a task per proposal and shield another future, which under load cost more than
        # the Raft work. A proposal whose future is already done (timed out, or its caller was
        # cancelled) before the driver reaches it is not appended at all (see _step_inputs);
        # once appended its outcome is unknown to the caller, as before.
        timer = loop.call_at(loop.time() + timeout_ms / 1000, _expire_proposal, fut, timeout_ms)
        try:
            return await fut
        except (RaftCoreError, RaftError):
            self.proposals_failed += 1
            raise
        finally:
            timer.cancel()

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        """Wait until safe time >= ts. Returns the milliseconds waited."""
        self._check_running()
        if self.safe_time >= ts:
            return 0.0
        if len(self._safe_waiters) >= SAFE_TIME_WAITERS_MAX:
            # Waiters that timed out stay in the heap until safe time passes them (a node whose
            # safe time is stuck piles them up): only the ones still waiting count.
            self._safe_waiters = [w for w in self._safe_waiters if not w[2].done()]
            heapq.heapify(self._safe_waiters)
        if len(self._safe_waiters) >= SAFE_TIME_WAITERS_MAX:
            raise QueueFullError(f"{SAFE_TIME_WAITERS_MAX} safe-time waiters already parked")
        start = time.perf_counter()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._safe_waiters, (ts, next(self._seq), fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_ms / 1000)
        except TimeoutError:
            fut.cancel()
            raise SafeTimeTimeoutError(ts, self.safe_time, timeout_ms) from None
        except asyncio.CancelledError:
            # The caller went away (a client that disconnected): done, so the purge above
            # drops it instead of counting it against the bound until safe time passes ts.
            fut.cancel()
            raise
        return (time.perf_counter() - start) * 1000

    async def read_barrier(self, *, timeout_ms: int = 5_000) -> int:
        """ReadIndex (§6.4): returns an index such that, once it returns, this node has applied
        every entry committed before the call began. Only the leader can run it."""
        ctx = next(self._read_ctx)

        def start() -> None:
            core = self._core()
            core.read_index(ctx)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000  # one for both waits
        fut: asyncio.Future[int] = loop.create_future()
        self._reads[ctx] = fut
        try:
            await self._run_op(start)
            index = await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise ReadIndexError(f"no quorum confirmed leadership within {timeout_ms} ms") from None
        finally:
            self._reads.pop(ctx, None)
        if self._applied_index() < index:
            wfut: asyncio.Future[int] = loop.create_future()
            heapq.heappush(self._read_waiters, (index, next(self._seq), wfut))
            try:
                await asyncio.wait_for(wfut, max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise ReadIndexError(
                    f"this node did not apply up to the read index {index} within {timeout_ms} ms"
                ) from None
        return index

    async def add_node(
        self, node_id: NodeId, address: Address, *, learner: bool = True, timeout_ms: int = 10_000
    ) -> int:
        """Add a node (as a learner by default: it catches up without affecting quorums).
        A bad id or address is refused here (ConfChangeError): once in the log, a configuration
        no transport can use would fail every node that applies or replays it."""
        try:
            check_peers({node_id: address})
        except TransportConfigError as exc:
            raise ConfChangeError(f"cannot add node {node_id}: {exc}") from None

        def change(conf: ConfState) -> ConfState:
            if node_id in conf.members():
                raise RaftCoreError(f"node {node_id} is already a member")
            if learner:
                return ConfState(voters=conf.voters, learners=(*conf.learners, node_id))
            return ConfState(voters=(*conf.voters, node_id), learners=conf.learners)

        return await self._change_conf(change, {node_id: address}, timeout_ms)

    async def promote_node(self, node_id: NodeId, *, timeout_ms: int = 10_000) -> int:
        """Make a learner a voter - only once it has caught up (as etcd does): a voter that
        lags far behind would count toward quorums it cannot help reach for a long while."""

        def change(conf: ConfState) -> ConfState:
            if node_id not in conf.learners:
                raise RaftCoreError(f"node {node_id} is not a learner")
            core = self._core()
            pr = core.progress.get(node_id)
            committed = core.log.committed
            if pr is None or pr.match + PROMOTE_LAG_ENTRIES_MAX < committed:
                raise LearnerBehindError(node_id, 0 if pr is None else pr.match, committed)
            return ConfState(
                voters=(*conf.voters, node_id),
                learners=tuple(n for n in conf.learners if n != node_id),
            )

        return await self._change_conf(change, {}, timeout_ms)

    async def remove_node(self, node_id: NodeId, *, timeout_ms: int = 10_000) -> int:
        def change(conf: ConfState) -> ConfState:
            if node_id not in conf.members():
                raise RaftCoreError(f"node {node_id} is not a member")
            return ConfState(
                voters=tuple(n for n in conf.voters if n != node_id),
                learners=tuple(n for n in conf.learners if n != node_id),
            )

        return await self._change_conf(change, {}, timeout_ms)

    async def transfer_leader(self, target: NodeId, *, timeout_ms: int = 5_000) -> None:
        """Hand leadership to voter `target`; returns once it leads. Asking the leader to hand
        it to itself is done at once (the core ignores it: there is nothing to move)."""
        await self._run_op(lambda: self._core().transfer_leader(target))
        if target == self.config.node_id and self._core().is_leader():
            return
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline:
            core = self._core()
            if core.leader == target and not core.is_leader():
                return
            if core.is_leader() and core.transferee == 0:
                # The core gave up after an election timeout (the target did not answer)
                # before the deadline: say so, not that the whole wait passed.
                raise RaftCoreError(
                    f"leadership did not move to node {target}: the transfer was abandoned "
                    "after an election timeout (is the node up and caught up? `metastore "
                    "cluster status` shows it)"
                )
            await asyncio.sleep(self.config.tick_ms / 1000)
        raise RaftCoreError(f"leadership did not move to node {target} within {timeout_ms} ms")

    async def hand_over_leadership(self, *, timeout_ms: int) -> NodeId:
        """Before a planned stop: as the leader of a cluster with other voters, move leadership
        to the voter most caught up (one that answered lately first), so the others need not
        wait out an election timeout without a leader. Returns the new leader, or 0 when this
        node does not lead, there is no other voter, or leadership did not move within
        `timeout_ms` (the core abandons a transfer after one election timeout anyway)."""
        core = self.core
        if core is None or self._stopped or not core.is_leader():
            return 0
        voters = [n for n in core.conf.voters if n != core.id and n in core.progress]
        if not voters:
            return 0
        target = max(
            voters, key=lambda n: (core.progress[n].recent_active, core.progress[n].match, -n)
        )
        try:
            await self.transfer_leader(target, timeout_ms=timeout_ms)
        except (RaftCoreError, RaftError) as exc:
            log.info("leadership not handed over before stopping: %s", exc)
            return 0
        return target

    def status(self) -> NodeStatus:
        core = self._core()
        now_ms = self.clock.physical_now_ms()
        return NodeStatus(
            core=core.status(),
            ready_to_serve=self.ready_to_serve,
            safe_time=self.safe_time,
            safe_time_lag_ms=max(0, now_ms - physical_ms(self.safe_time)),
            peers=dict(self.addresses),
            wal=_stats_dict(self.wal),
            transport=self.transport.stats() if self.transport else {},
            stopped_reason=self.stopped_reason,
            clock_alarm=dict(self.clock_alarm),
            clock_offsets_ms=self.clock_offsets_ms(),
            clock_fenced=self.clock_fenced,
            inbox_dropped=self.inbox_dropped,
            unusable_address_books=self.unusable_address_books,
            counters=self.metrics_counters(),
            peer_round_trip_s=dict(self._peer_round_trip_s),
            snapshot_save_error=self.snapshot_save_error,
        )

    def metrics_counters(self) -> dict[str, float]:
        """What an operator alerts on, read at scrape time (all O(1))."""
        core = self.core
        return {
            "snapshots_sent": core.snapshots_sent if core is not None else 0,
            "snapshot_bytes_sent": core.snapshot_bytes_sent if core is not None else 0,
            "leader_changes_seen": self.leader_changes_seen,
            "proposals_failed": self.proposals_failed,
            # Queued for the driver, plus appended and not yet applied.
            "proposals_pending": len(self._proposals) + len(self._waiting),
            "snapshots_saved": self.snapshots_saved,
            "snapshot_save_seconds_total": self.snapshot_save_seconds_total,
            "snapshot_last_saved_bytes": self.snapshot_last_saved_bytes,
            "snapshot_save_failures": self.snapshot_save_failures,
            "snapshots_installed": self.snapshots_installed,
            "snapshot_install_seconds_total": self.snapshot_install_seconds_total,
            "snapshot_last_installed_bytes": self.snapshot_last_installed_bytes,
        }

    # ------------------------------------------------------------------ internals

    def _check_identity(self, rec: RecoveredState) -> None:
        """The data directory must be this member's: `IDENTITY` (written at its first start)
        names the cluster and node. With no IDENTITY and an empty log the member is new, which
        only `new_member` allows: a member whose data was wiped must not come back as a fresh
        voter (term 0, no vote), or it could vote twice in a term it voted in before. It must
        be removed and added back. A log without IDENTITY predates identities: adopt it."""
        cfg = self.config
        path = cfg.data_dir / IDENTITY_FILE
        want = {"cluster_id": cfg.cluster_id, "node_id": cfg.node_id}
        if path.exists():
            try:
                found = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise NodeIdentityError(f"{path} is unreadable: {exc}") from None
            if not isinstance(found, dict) or {k: found.get(k) for k in want} != want:
                raise NodeIdentityError(
                    f"{path} says this data directory belongs to {found!r:.200}, not to "
                    f"cluster {cfg.cluster_id!r} node {cfg.node_id}"
                )
            return
        empty = rec.hard_state == HardState() and not rec.entries and rec.snapshot.is_empty()
        if empty and not cfg.new_member:
            raise NodeIdentityError(
                f"{cfg.data_dir} holds no state of node {cfg.node_id} (no {IDENTITY_FILE}, empty "
                "log). If this is the member's first start, start it once with --bootstrap. If "
                "its data was lost, it may have voted in terms it no longer remembers: remove "
                "it from the cluster and add it back as a new member instead."
            )
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({**want, "created_at_ms": int(time.time() * 1000)}) + "\n")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(cfg.data_dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            # A full or failing disk at a first start: say which file and why, and leave no
            # IDENTITY that may not be durable (the next start writes it again).
            for leftover in (tmp, path):
                with contextlib.suppress(OSError):
                    leftover.unlink()
            raise NodeStateWriteError(
                f"cannot write {path}: {errno_text(exc)}; nothing was started. Free space or "
                "fix the data directory, then start the node again"
            ) from exc

    def _applied_index(self) -> int:
        # visible_applied: a snapshot the core accepted counts only once sm.restore ran.
        return max(self._core().visible_applied(), self._applied_ahead_index)

    def _core(self) -> RaftCore:
        if self.core is None:
            raise NodeStoppedError("node not started")
        return self.core

    def _wal(self) -> WriteAheadLog:
        if self.wal is None:
            raise NodeStoppedError("node not started")
        return self.wal

    def _transport(self) -> PeerTransport:
        if self.transport is None:
            raise NodeStoppedError("node not started")
        return self.transport

    def _check_running(self) -> None:
        if self._stopped or self.core is None:
            raise NodeStoppedError(f"node not running ({self.stopped_reason or 'not started'})")

    async def _run_op(self, fn: Callable[[], Any]) -> Any:
        self._check_running()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append(_Op(fn=fn, future=fut))
        self._wake.set()
        return await fut

    async def _change_conf(
        self,
        change: Callable[[ConfState], ConfState],
        new_addresses: Mapping[NodeId, Address],
        timeout_ms: int,
    ) -> int:
        fut: asyncio.Future[ProposalResult] = asyncio.get_running_loop().create_future()

        def propose() -> int:
            core = self._core()
            new = change(core.conf)
            addresses = {n: a for n, a in self.addresses.items() if n in new.members()}
            addresses.update(new_addresses)
            book = encode_address_book(addresses)
            try:
                # The whole book, as every follower's wire decoder will check it: one it
                # refuses would hold back every append from this entry on.
                decode_address_book(book)
            except MalformedConfStateError as exc:
                raise ConfChangeError(f"membership change refused: {exc}") from None
            term, index = core.propose_conf(new, self.clock.now(), context=book)
            # Registered here, in the driver task, not after the op's future resolves: the
            # driver may persist, commit and apply the entry before this coroutine resumes
            # (a single voter that persists on the loop thread does so without yielding).
            self._waiting[index] = (term, fut)
            return index

        index: int = await self._run_op(propose)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_ms / 1000)
        except TimeoutError:
            raise ProposalTimeoutError(
                f"membership change not applied within {timeout_ms} ms; outcome unknown"
            ) from None
        # Applied means committed, and a change counts from its append (raft.core.raft), so
        # it committed on a majority of the *new* voters, each holding it durably (followers
        # ack after fsync; the leader counts itself once persisted): an operator who now stops
        # a removed node, or counts on a new voter, acts on a change the new membership holds.
        return index

    def _on_message(self, m: Message) -> None:
        self._last_heard = time.monotonic()
        if not self._admit_to_inbox(m):
            return
        if self._clock_fenced(m):
            return
        if (
            type(m) is RequestVote
            and not m.force
            and self._monotonic() < self._votes_refused_until_monotonic
        ):
            return  # just restarted: see start
        if isinstance(m, Heartbeat | HeartbeatResponse) and m.clock_ms:
            self._sample_clock(m)
            if type(m) is HeartbeatResponse and m.echo_ms:
                self._note_heartbeat_acked(m)
        self._inbox.append(m)
        self._ticks_due_at_last_message = self._ticks_due
        self._wake.set()

    def _admit_to_inbox(self, m: Message) -> bool:
        """Whether `m` fits the inbox (see INBOX_MESSAGES_MAX); a message refused is dropped
        before anything else looks at it, exactly as if the network had lost it."""
        count = len(self._inbox)
        if type(m) in _INBOX_KEPT_TYPES:
            if count < INBOX_MESSAGES_MAX + INBOX_RESERVED_MESSAGES:
                # A snapshot small enough for one frame is on the heap (a chunked one is in
                # its spool file): its bytes count as entries do.
                data = m.snapshot.data if type(m) is InstallSnapshot else b""
                if type(data) is not bytes or not data:
                    return True
                if count == 0 or self._inbox_entry_bytes + len(data) <= INBOX_ENTRY_BYTES_MAX:
                    self._inbox_entry_bytes += len(data)
                    return True
        elif count < INBOX_MESSAGES_MAX:
            if type(m) is not AppendEntries or not m.entries:
                return True
            size = sum([len(e.data) for e in m.entries]) + _ENTRY_OVERHEAD_BYTES * len(m.entries)
            if count == 0 or self._inbox_entry_bytes + size <= INBOX_ENTRY_BYTES_MAX:
                self._inbox_entry_bytes += size
                return True
        self.inbox_dropped += 1
        left_out = self._inbox_warnings.take()
        if left_out is not None:
            log.warning(
                "node %d dropped a %s from peer %d: %d messages (%d entry bytes) already wait "
                "for the driver%s",
                self.node_id,
                type(m).__name__,
                m.src,
                count,
                self._inbox_entry_bytes,
                f" ({left_out} more drops not logged)" if left_out else "",
            )
        return False

    def _sample_clock(self, m: Heartbeat | HeartbeatResponse) -> None:
        """Record what `m` tells about the peer's clock minus ours (θ, in ms).

        A one-way sample is the sender's clock at sending minus ours at arrival: θ minus the
        network and queueing delay, so it only bounds θ from below (a delayed or long-queued
        heartbeat, such as those that arrive when a partition heals, makes the peer look
        behind, never ahead). A message that echoes the clock of one we sent earlier closes a
        round trip: we sent at `echo` (our clock), the peer sent this at `clock_ms` (its clock)
        after it received ours, and it arrived at `now`, so θ lies in [clock_ms - now,
        clock_ms - echo], whatever the delays and however long the peer held it (NTP's bound,
        without the peer's receive time). Leaders get this from responses, followers from
        the next heartbeat, whose echo the leader advanced by how long it held our response
        (see _stamp): still a bound, and without the hold the middle is not biased. Only an
        echo of a clock this process sent closes a round trip (`_echoes_own_clock`)."""
        now_ms = self.clock.physical_now_ms()
        self._last_peer_clock[m.src] = (m.clock_ms, m.incarnation, time.monotonic())
        low = m.clock_ms - now_ms
        own_echo = 0 < m.echo_ms <= now_ms and self._echoes_own_clock(m)
        high = m.clock_ms - m.echo_ms if own_echo else None
        offset = low if high is None else (low + high) // 2
        self._peer_clocks[m.src] = _ClockSample(
            offset=offset, low=low, high=high, at=time.monotonic()
        )

    def _echoes_own_clock(self, m: Heartbeat | HeartbeatResponse) -> bool:
        """Whether m.echo_ms, if set, is a clock this process sent: the echo carries this
        process's incarnation. Without incarnations a node restarted after its clock was fixed
        took the echo of its previous process's clock (in a heartbeat its leader had queued
        while it was down) for its own and fenced itself as ahead of its leader until a real
        round trip (chaos seed 210, docs/chaos.md); an echo's value cannot tell the two apart.

        An echo without an incarnation is judged as protocol version 5 did (taken as ours):
        either m comes from a version-5 peer (m.incarnation 0), or the peer heard our clock in
        a message without one (our link to it speaks version 5). So a pair with a version-5
        side keeps the old rule, flaw included, and still measures round trips both ways."""
        return not (m.incarnation and m.echo_incarnation) or m.echo_incarnation == self.incarnation

    def _stamp(self, m: Message) -> Message:
        if isinstance(m, Heartbeat | HeartbeatResponse):
            clock_ms = self.clock.physical_now_ms()
            echo_ms, echo_incarnation, heard_monotonic = self._last_peer_clock.get(
                m.dst, (0, 0, 0.0)
            )
            if type(m) is Heartbeat:
                self._note_heartbeat_sent(m, clock_ms)
                if echo_ms:
                    # A leader holds a follower's last response until its next heartbeat (up
                    # to a heartbeat interval): the follower would count that hold as round
                    # trip, and the middle of its bounds would put our clock half a hold
                    # ahead (+25 ms on one host with the defaults, in status and against the
                    # fence). Adding the hold, measured here and rounded down, keeps the echo
                    # an upper bound's base and centres the follower's estimate. Responses
                    # echo the heartbeat's clock unchanged: the lease matches them by it.
                    echo_ms += int((time.monotonic() - heard_monotonic) * 1000)
            return dataclasses.replace(
                m,
                clock_ms=clock_ms,
                echo_ms=echo_ms,
                incarnation=self.incarnation,
                echo_incarnation=echo_incarnation,
            )
        if type(m) is TimeoutNow:
            self._lease_void_term = m.term
        return m

    def _fresh_clock_samples(self) -> dict[NodeId, _ClockSample]:
        fresh_s = CLOCK_SAMPLE_FRESH_ELECTIONS * 2 * self.config.election_timeout_ms / 1000
        now = time.monotonic()
        return {p: c for p, c in self._peer_clocks.items() if now - c.at <= fresh_s}

    def clock_offsets_ms(self) -> dict[NodeId, int]:
        """Each peer's clock minus ours, from its recent heartbeats (ms): the round-trip
        estimate where there is one, else the one-way sample (a lower bound)."""
        return {p: c.offset for p, c in self._fresh_clock_samples().items()}

    def clock_checked(self) -> bool:
        """Whether this process's clock has been measured within the max offset by round trips
        (fresh ones, of this process): a follower's with its leader, a leader's with enough
        fellow voters to make a quorum with it; always for a lone voter. False while fenced.

        A node started with its clock far off answers requests before its first round trip
        proves it off and it fences itself; what it judges by its clock meanwhile (a DDL's
        wait until Tu + CSmax) asks this first, and is refused (NOT_READY) until then. One-way
        samples do not count: only a round trip bounds the offset from both sides."""
        core = self.core
        if core is None or self.clock_fenced:
            return False
        peers = [p for p in core.conf.voters if p != self.node_id]
        if not peers and self.node_id in core.conf.voters:
            return True
        limit = self.config.max_clock_offset_ms
        samples = self._fresh_clock_samples()
        within = {
            p
            for p, c in samples.items()
            if c.high is not None and not _proves_ahead(c, limit) and c.low <= limit
        }
        if core.is_leader():
            return len(within.intersection(peers)) + 1 >= len(core.conf.voters) // 2 + 1
        return core.leader in within

    def _check_own_clock(self) -> None:
        """Fence this node when its clock is more than the max offset off, as measured from
        heartbeats (ahead, it would stamp future Tm; behind, it cannot serve recent reads):
        * off a quorum of its fellow voters (a leader hears them all): it steps down, does not
          campaign and does not serve, until its offset to a leader is back within bounds;
        * off its leader (a follower hears only the leader): it does not serve, but it still
          may campaign - it may be the leader whose clock is wrong, which then fences itself
          by the first rule and steps down, lifting this fence once a sane leader is heard.
        (`_clock_fenced` also makes followers drop the entries of a leader far ahead.)"""
        core = self.core
        if core is None:
            return
        limit = self.config.max_clock_offset_ms
        samples = self._fresh_clock_samples()
        offsets = {p: c.offset for p, c in samples.items()}
        if not offsets and not self.clock_fenced:
            return  # nothing measured (yet): nothing to decide
        voters = core.conf.voters
        quorum = len(voters) // 2 + 1
        peers = [p for p in voters if p != self.node_id]
        # Only what a sample proves counts: a peer is behind us by more than the limit if even
        # the top of its interval is (round trips only), ahead if even the bottom is. So
        # network delay, which widens the interval, can never fence a node.
        ahead_of = [p for p in peers if _proves_ahead(samples.get(p), limit)]
        behind = [p for p in peers if p in samples and samples[p].low > limit]
        off = ahead_of if len(ahead_of) >= quorum else behind if len(behind) >= quorum else []
        if len(voters) > 1 and off:
            if not self._fenced_by_quorum:
                worst = max((offsets[p] for p in off), key=abs)
                self._fence(
                    f"this node's clock is {abs(worst)} ms {'ahead of' if worst < 0 else 'behind'} "
                    f"{len(off)} of its {len(peers)} fellow voters (max offset {limit} ms): it "
                    "does not lead, campaign or serve until its clock is fixed",
                    by_quorum=True,
                )
            if core.is_leader():
                core.step_down()
            return
        leader = core.leader
        if leader not in (0, self.node_id) and leader in samples:
            sample = samples[leader]
            proven_behind = sample.low > limit
            proven_ahead = _proves_ahead(sample, limit)
            lead = sample.offset
            if proven_behind or proven_ahead:
                if not self.clock_fenced:
                    where = "behind" if proven_behind else "ahead of"
                    self._fence(
                        f"this node's clock is {abs(lead)} ms {where} its leader {leader}'s "
                        f"(max offset {limit} ms): it does not serve until the clocks agree",
                        by_quorum=False,
                    )
                return
        # Lift the fence once a leader's fresh sample is within bounds, or, for a fence by a
        # quorum, once every sample it rested on has gone stale: with every node fenced there
        # is no leader and no new heartbeat, and a fence must not outlive its evidence.
        stale = not any(p in samples for p in peers)
        if self.clock_fenced and (not self._fenced_by_quorum or leader in offsets or stale):
            log.warning("clock fence lifted (offsets now %s)", offsets)
            self.clock_fenced = ""
            self._fenced_by_quorum = False

    def _fence(self, reason: str, *, by_quorum: bool) -> None:
        self.clock_fenced = reason
        self._fenced_by_quorum = by_quorum
        log.error("clock fence: %s", reason)

    def _clock_fenced(self, m: Message) -> bool:
        """Drop a message that would bring in a Tm further ahead of our clock than twice the
        max offset (entries or a snapshot from a leader whose clock jumped ahead), and, for a
        while, every message of its sender: not acking such a leader keeps its far-future
        Tm from ever committing (a committed Tm moves every node's HLC and every later Tm for
        good), and not hearing it lets the others elect a leader with a sane clock. If it is
        our clock that is behind, this node fences itself: it stops following, falls behind
        and serves nothing new, which `status` shows as `clock_alarm`."""
        now_mono = time.monotonic()
        until = self._clock_suspects.get(m.src)
        if until is not None:
            if now_mono < until:
                return True
            del self._clock_suspects[m.src]
        newest = 0
        if isinstance(m, AppendEntries) and m.entries:
            newest = m.entries[-1].tm
        elif isinstance(m, InstallSnapshot):
            newest = m.snapshot.meta.tm
        if not newest:
            return False
        ahead_ms = physical_ms(newest) - self.clock.physical_now_ms()
        # A healthy leader's Tm can lead our clock by up to twice the offset: its own clock may
        # lead ours by the offset, and its HLC may have absorbed a peer's timestamp that led
        # its clock by the offset (HybridClock.update refuses more).
        if ahead_ms <= 2 * self.config.max_clock_offset_ms:
            return False
        hold_s = CLOCK_SUSPECT_ELECTIONS * 2 * self.config.election_timeout_ms / 1000
        self._clock_suspects[m.src] = now_mono + hold_s
        self.clock_alarm = {
            "peer": m.src,
            "term": m.term,
            "ahead_ms": ahead_ms,
            "max_clock_offset_ms": self.config.max_clock_offset_ms,
            "at_ms": int(time.time() * 1000),
        }
        log.warning(
            "clock fence: node %d sent Tm %d ms ahead of this node's clock (allowed: twice the "
            "max offset %d ms); "
            "ignoring it for %.1f s. Either its clock or ours is wrong.",
            m.src,
            ahead_ms,
            self.config.max_clock_offset_ms,
            hold_s,
        )
        return True

    async def _ticker(self) -> None:
        interval = self.config.tick_ms / 1000
        replayed_max = self._ticks_replayed_max()
        next_at = time.monotonic()
        while True:
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            now = time.monotonic()
            if now - next_at > replayed_max * interval:
                # The loop was blocked (GC pause, overloaded machine): do not replay a burst of
                # ticks that would fire an election at once; resynchronise instead.
                next_at = now
            self._ticks_due += 1
            self._wake.set()

    async def _run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._drain()
                if self._deferred:
                    # Let the proposers just answered run first: one that proposes again makes
                    # the next AppendEntries carry the commit index (see _send).
                    await asyncio.sleep(0)
                    await self._drain()
                    self._send_deferred()
                self.loop_iterations += 1
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the node must stop, not limp on with unknown state
            self.stopped_reason = f"fatal: {type(exc).__name__}: {exc}"
            if isinstance(exc, WalError | FileReadError):
                # The disk failed (ENOSPC, EIO; a snapshot's file unreadable or truncated while
                # it was restored): the error names the operation, the file and the errno; a
                # traceback would only bury that line.
                log.critical("raft node stopping on a storage error: %s", exc)
            else:
                log.critical("raft node stopping on a fatal error: %s", exc, exc_info=exc)
            self._fail_all(NodeStoppedError(self.stopped_reason))
            self._stopped = True
            if self._on_fatal is not None:
                self._on_fatal(exc)

    async def _drain(self) -> None:
        self._step_inputs()
        core = self._core()
        while core.has_ready():
            await self._handle_ready(core.ready())
            self._step_inputs()  # inputs that arrived during the fsync join this batch
        if core.term != self._leader_seen_term and core.leader:
            # A Raft term has at most one leader: a term with a known leader is a change.
            self._leader_seen_term = core.term
            self.leader_changes_seen += 1
        if not core.is_leader() and self.transport is not None:
            # Only a leader sends snapshots: a transfer still under way is stale now, and
            # would compete with the new leader's on the follower's link and disk. (Asked at
            # every pass, not at a step-down only: a leadership may begin and end in one.)
            self.transport.drop_snapshot_transfers()
        if self._snapshot_task is not None and self._snapshot_task.done():
            await self._maybe_snapshot(core)  # written while idle: commit it now

    def _send(self, transport: PeerTransport, m: Message) -> None:
        """Send one message of a Ready, deferring a leader's AppendEntries without entries.

        Such a message only carries the commit index (a commit broadcast) or probes. It waits
        until the driver has let the proposers it answered run once (see _run): if one of them
        proposes again, the AppendEntries with the new entry carries the same commit index,
        and the empty one is dropped as superseded - the follower then handles one message
        (one Ready, one WAL write) per proposal instead of two, and the leader one ack.
        Otherwise it is sent at the end of that loop pass. Dropping or delaying a message is
        always safe in Raft; a superseding message has the same term and a commit index at
        least as high."""
        if type(m) is AppendEntries:
            if not m.entries:
                self._deferred[m.dst] = m
                return
            if self._deferred:
                prev = self._deferred.get(m.dst)
                if prev is not None and prev.term == m.term and prev.commit <= m.commit:
                    del self._deferred[m.dst]
        transport.send(self._stamp(m))

    def _send_deferred(self) -> None:
        deferred, self._deferred = self._deferred, {}
        if self._stopped or self.transport is None:
            return
        for m in deferred.values():
            self.transport.send(m)
        self.transport.flush()

    def _step_inputs(self) -> None:
        if not (self._inbox or self._ticks_due or self._ops or self._proposals):
            return  # nothing arrived (the driver asks after every Ready)
        core = self._core()
        # Messages before ticks: ticks that piled up during a slow fsync must not run first, or a
        # leader could fail its check-quorum (or a follower start an election) with the very
        # acks and heartbeats that prove otherwise already in its inbox.
        inbox, self._inbox = self._inbox, []
        self._inbox_entry_bytes = 0
        if inbox and self._links_dropped:
            # A peer that still has this removed node in its membership (a leader that added
            # it back) reached it: its answers need the links. If nobody follows up, they are
            # dropped again after REMOVED_QUIET_ELECTIONS.
            log.info(
                "node %d heard from peer %d: it dials its peers again", self.node_id, inbox[0].src
            )
            self._redial()
        for m in inbox:
            core.step(m)
        ticks, self._ticks_due = self._ticks_due, 0
        if inbox and not core.is_leader():
            # Ticks that were due before the last message arrived (while this loop awaited an
            # fsync) are dropped, not counted after it: counted after a heartbeat they would
            # shorten the election timeout that heartbeat started, which a leader's lease
            # relies on (see leader_lease_until_monotonic). A leader keeps them: its
            # heartbeats and check-quorum run on them.
            ticks -= min(ticks, self._ticks_due_at_last_message)
        self._ticks_due_at_last_message = 0
        if ticks:
            self._check_own_clock()
            self._drop_links_if_removed(core)
        # No campaigns from a node whose clock is off a quorum (it stepped down if it led: no
        # stamps either). Its election timer still runs: frozen, it kept the check-quorum lease
        # of a leader that went silent and refused every vote until the fence lapsed.
        core.campaigns_paused = self._fenced_by_quorum
        for _ in range(min(ticks, 100)):
            core.tick(self.clock.now())
        ops, self._ops = self._ops, []
        for op in ops:
            if op.future.done():
                # Its caller went away (a client that disconnected cancels its request's task):
                # not run, as a proposal whose future is done is not appended. Setting a result
                # on it raised InvalidStateError, which stopped the node.
                continue
            try:
                op.future.set_result(op.fn())
            except RaftCoreError as exc:
                op.future.set_exception(exc)
        if self._proposals:
            batch = self._proposals[:PROPOSALS_PER_BATCH_MAX]
            del self._proposals[:PROPOSALS_PER_BATCH_MAX]
            live = [p for p in batch if not p.future.done()]
            try:
                placed = core.propose_many([p.data for p in live], self.clock.now())
            except (NotLeaderError, ProposalDroppedError) as exc:
                for p in live:
                    p.future.set_exception(exc)
            else:
                for p, (term, index) in zip(live, placed, strict=True):
                    self._waiting[index] = (term, p.future)
            if self._proposals:
                self._wake.set()

    async def _handle_ready(self, rd: Ready) -> None:
        transport = self._transport()
        if rd.entries:
            self._note_appended_confs(rd.entries)
            prepare = getattr(self.sm, "prepare_appended", None)
            if prepare is not None:
                # Before they commit (a round trip away at least): the state machine may start
                # on their apply off the loop (StateMachine.prepare_appended).
                prepare(rd.entries)
        # Committed entries that were already durable here before this Ready are applied before
        # its write (see `applicable_before_persist`): their proposers need not wait for one
        # more fsync, which would only be making the *next* batch durable. Applied before the
        # early messages are queued, so the proposers run before the link writers do.
        applied_early = applicable_before_persist(rd, self._core().log.stable_index)
        if applied_early:
            self._apply(rd.committed[:applied_early])
            last = rd.committed[applied_early - 1]
            self._applied_ahead_tm = last.tm
            self._applied_ahead_index = last.index
            self._wake_waiters()
        if rd.early_messages:
            for m in rd.early_messages:
                self._send(transport, m)
            transport.flush()  # on their way before this node blocks in its own fsync
        if rd.snapshot is not None or rd.entries or rd.hard_state is not None:
            wal = self._wal()
            if rd.snapshot is None and (
                not wal.append_syncs(rd.entries, rd.hard_state) or self._persist_inline(rd)
            ):
                # Only the commit index moves (one small buffered write, no fsync), or a small
                # append while nothing else waits for the loop: written (and fdatasync'd) right
                # here. A hop to the WAL thread and back costs two thread wake-ups and GIL
                # hand-offs, more than a small fdatasync itself. Safe here: WAL calls never
                # overlap (every executor call is awaited before the next WAL call is made),
                # and nothing below runs before the append has returned.
                started = time.perf_counter()
                wal.append(rd.entries, rd.hard_state)
                self.fsync_seconds_total += time.perf_counter() - started
            else:
                started = time.perf_counter()
                stored = await asyncio.get_running_loop().run_in_executor(
                    self._io, self._persist, rd
                )
                self.fsync_seconds_total += time.perf_counter() - started
                if stored is not None:
                    # The log's copy (in its own file), not the received one (the transport's
                    # deleted spool file, whose disk space it would keep while open).
                    self._core().adopt_stored_snapshot(stored)
        if rd.messages:
            for m in rd.messages:
                self._send(transport, m)
            transport.flush()
        if rd.snapshot is not None:
            started = time.perf_counter()
            app_data, addresses = self._unwrap_snapshot(rd.snapshot.data)
            prepare = getattr(self.sm, "prepare_restore", None)
            if prepare is None:
                self.sm.restore(app_data)
            else:
                # Decoding a large state takes seconds of CPU: in a thread, so that this node's
                # clients, health checks and links are served meanwhile. The driver waits here,
                # so the old state stays whole and current until the install (visible_applied
                # and safe time move only at `advance` below).
                install = await asyncio.to_thread(prepare, app_data)
                install()
            self.snapshots_installed += 1
            self.snapshot_install_seconds_total += time.perf_counter() - started
            self.snapshot_last_installed_bytes = len(rd.snapshot.data)
            self._note_membership(rd.snapshot.meta.conf, rd.snapshot.meta.index)
            self._set_addresses(addresses, applied_index=rd.snapshot.meta.index)
        if self._deferred and any(e.kind is EntryKind.CONF for e in rd.committed):
            # Applying a membership change drops the links of removed members: the commit
            # broadcasts held back (see _send) must leave first, or a removed follower never
            # learns that its removal committed and campaigns for ever.
            self._send_deferred()
        self._apply(rd.committed[applied_early:] if applied_early else rd.committed)
        for rs in rd.read_states:
            fut = self._reads.get(rs.ctx)
            if fut is not None and not fut.done():
                fut.set_result(rs.index)
        for ctx in rd.dropped_reads:
            fut = self._reads.get(ctx)
            if fut is not None and not fut.done():
                fut.set_exception(ReadIndexError("leadership lost during the read"))
        core = self._core()
        core.advance(rd)
        self._wake_waiters()
        await self._maybe_snapshot(core)

    def _persist_inline(self, rd: Ready) -> bool:
        """Whether to make `rd`'s entries durable on the loop thread rather than the WAL
        thread. Only a small batch, and only while nothing else waits: the loop is blocked
        for the fdatasync, which costs nothing when there is nothing else to do (a lone
        proposal, the follower side of one) but would stall a busy leader, whose proposers
        (answered by the previous Ready, about to propose again), reads and sends the WAL
        thread lets run during the disk wait: more than a few proposals in flight mean load.
        Large entries go to the WAL thread too: their write alone would hold the loop."""
        return (
            len(rd.entries) <= PERSIST_INLINE_ENTRIES_MAX
            and len(self._waiting) <= PERSIST_INLINE_ENTRIES_MAX
            and not self._proposals
            and not self._inbox
            and self.config.persist_inline
            and sum(len(e.data) for e in rd.entries) <= PERSIST_INLINE_BYTES_MAX
        )

    def _persist(self, rd: Ready) -> Snapshot | None:
        """Write `rd` to the log; the snapshot it installs as stored, if any."""
        wal = self._wal()
        stored = None
        if rd.snapshot is not None:
            stored = wal.install_snapshot(rd.snapshot)
        if rd.entries or rd.hard_state is not None:
            wal.append(rd.entries, rd.hard_state)
        return stored

    def _apply(self, entries: tuple[Entry, ...]) -> None:
        if not entries:
            return
        # Tm strictly increases along the log, so one observe of the last Tm leaves the clock
        # ahead of every entry in the batch, as observing each in turn would.
        self.clock.observe(entries[-1].tm)
        apply = self.sm.apply
        listeners = self.applied_listeners
        waiting_by_index = self._waiting
        for e in entries:
            result = apply(e)
            if e.kind is EntryKind.CONF:
                conf = decode_conf(e.data)
                self._note_membership(conf, e.index)
                book = self._conf_entry_addresses(e)
                if book is None:
                    # Unusable (see _conf_entry_addresses): the members keep the addresses
                    # this node knew; those it did not know stay without one.
                    members = conf.members()
                    book = {n: a for n, a in self._applied_addresses.items() if n in members}
                self._set_addresses(book, applied_index=e.index)
            for listener in listeners:
                listener(e)
            waiting = waiting_by_index.pop(e.index, None)
            if waiting is None:
                continue
            term, fut = waiting
            if fut.done():
                continue
            if term == e.term:
                fut.set_result(ProposalResult(index=e.index, term=e.term, tm=e.tm, result=result))
            else:
                fut.set_exception(
                    ProposalDroppedError(f"entry {e.index} was replaced by a newer leader")
                )

    def _wake_waiters(self) -> None:
        if not (self._safe_waiters or self._read_waiters):
            return
        safe = self.safe_time
        while self._safe_waiters and self._safe_waiters[0][0] <= safe:
            _, _, fut = heapq.heappop(self._safe_waiters)
            if not fut.done():
                fut.set_result(None)
        applied = self._applied_index()
        while self._read_waiters and self._read_waiters[0][0] <= applied:
            _, _, rfut = heapq.heappop(self._read_waiters)
            if not rfut.done():
                rfut.set_result(applied)
        # Proposals whose index is applied with another term were already failed in _apply;
        # proposals a deposed leader still holds beyond the log end fail on the next apply.

    async def _maybe_snapshot(self, core: RaftCore) -> None:
        """Take a snapshot every `snapshot_every_entries` applied entries.

        A view of the state is taken here (`prepare_snapshot`; a state machine without it
        encodes here), then the view is encoded and the file written and synced by a thread
        of its own while the driver goes on (appends, acks, heartbeats): for a large state
        that takes seconds, and a leader that stopped meanwhile would lose its leadership.
        The driver commits the file into the WAL (quick: a rename and unlinks) once it is
        written, at a point where no other WAL call is in flight."""
        task = self._snapshot_task
        if task is not None:
            if task.done():
                self._commit_snapshot(core, task)
            return
        if core.log.applied - core.snapshot.meta.index < self.config.snapshot_every_entries:
            return
        if self._snapshot_retry_at and time.monotonic() < self._snapshot_retry_at:
            return  # the last save failed: wait out its backoff (applies keep calling here)
        # The WAL writes the parts one after the other (never joined: that would be a second
        # copy of the state), and the core keeps what it stored: a large snapshot left in its
        # file, so the state's bytes built here go once it is written instead of living
        # until the next snapshot (and a transfer to a follower reads the file).
        # The address book as of the applied index (the snapshot's), not `self.addresses`: that
        # also holds the members of CONF entries appended after it, which may never commit.
        self._snapshot_started = time.perf_counter()
        prepare = getattr(self.sm, "prepare_snapshot", None)
        if prepare is None:
            data = [self.sm.snapshot()]
            encode: Callable[[], Sequence[bytes | memoryview]] = lambda: data  # noqa: E731
        else:
            # A view at the applied index now; encoded in the thread below, while the driver
            # applies what follows (encoding a large state held the loop for most of a second).
            encode = prepare()
        addresses = dict(self._applied_addresses)
        meta_only = core.create_snapshot(b"")
        wal = self._wal()

        def write() -> PreparedSnapshot:
            parts = wrap_snapshot_parts(encode(), addresses)
            return wal.prepare_snapshot(meta_only, data_parts=parts)

        task = asyncio.create_task(asyncio.to_thread(write), name=f"raft-snapshot-{self.node_id}")
        task.add_done_callback(lambda _t: self._wake.set())
        self._snapshot_task = task

    def _commit_snapshot(self, core: RaftCore, task: asyncio.Task[PreparedSnapshot]) -> None:
        self._snapshot_task = None
        wal = self._wal()
        try:
            stored = wal.commit_snapshot(task.result())
        except (WalIOError, RecordTooLargeError) as exc:
            if wal.failed:
                raise  # the log itself is in doubt (a directory sync, a compaction): stop
            self._snapshot_save_failed(exc)
            return
        if stored is None:
            return  # a snapshot from the leader was installed meanwhile
        if self.snapshot_save_error:
            log.warning(
                "snapshot saved again after %d failed attempts", self.snapshot_save_failures
            )
        self.snapshot_save_error = ""
        self._snapshot_retry_at = 0.0
        self._snapshot_retry_ms = 0
        core.compact_log(stored, keep_entries=self.config.snapshot_keep_entries)
        written = getattr(self.sm, "snapshot_written", None)
        if written is not None:
            written()
        # Encode, write, sync and commit: what the operator waits for (only a state machine
        # without `prepare_snapshot` holds the loop for the encode).
        self.snapshots_saved += 1
        self.snapshot_save_seconds_total += time.perf_counter() - self._snapshot_started
        self.snapshot_last_saved_bytes = len(stored.data)
        log.info("snapshot taken", extra={"index": stored.meta.index, "bytes": len(stored.data)})

    def _snapshot_save_failed(self, exc: WalIOError | RecordTooLargeError) -> None:
        """This node's own snapshot could not be saved (ENOSPC or EIO while its file was
        written, synced or renamed into place; or a state over SNAPSHOT_BYTES_MAX), and the
        log is intact: its temporary file is gone and the older snapshot and every entry
        after it remain. A snapshot only bounds the log and a restart's replay, so the node
        goes on serving from its log (which grows meanwhile), says so (status, metrics, one
        error line per attempt) and tries again after a backoff: SNAPSHOT_SAVE_RETRY_MS_MIN
        doubled per failure, or at once the longest (SNAPSHOT_SAVE_RETRY_MS_MAX) for a state
        over the limit, which no retry fixes until it shrinks. A failure that leaves the
        log itself in doubt stops the node instead (_commit_snapshot)."""
        self.snapshot_save_failures += 1
        self.snapshot_save_error = str(exc)
        too_large = isinstance(exc, RecordTooLargeError)
        if too_large:
            # A state over the limit stays over it until it shrinks: each retry would only
            # encode the whole state again (seconds of CPU at that size), so wait the longest.
            self._snapshot_retry_ms = SNAPSHOT_SAVE_RETRY_MS_MAX
        else:
            self._snapshot_retry_ms = min(
                SNAPSHOT_SAVE_RETRY_MS_MAX,
                max(SNAPSHOT_SAVE_RETRY_MS_MIN, 2 * self._snapshot_retry_ms),
            )
        self._snapshot_retry_at = time.monotonic() + self._snapshot_retry_ms / 1000
        log.error(
            "%s; this node goes on serving from its log (which grows until a snapshot is "
            "saved) and tries again in %d ms: %s",
            exc,
            self._snapshot_retry_ms,
            "the state must shrink first" if too_large else "free space or fix the device",
        )

    def _set_addresses(self, addresses: Mapping[NodeId, Address], *, applied_index: int) -> None:
        """The address book as of an applied CONF entry (or snapshot) at `applied_index`."""
        for index in [i for i in self._appended_conf_addresses if i <= applied_index]:
            del self._appended_conf_addresses[index]
        if addresses:
            self._applied_addresses = dict(addresses)
        self._refresh_addresses()

    def _note_appended_confs(self, entries: Sequence[Entry]) -> None:
        found = False
        for e in entries:
            if e.kind is EntryKind.CONF:
                book = self._conf_entry_addresses(e)
                if book is not None:
                    self._appended_conf_addresses[e.index] = book
                    found = True
        if found:
            self._refresh_addresses()

    def _conf_entry_addresses(self, e: Entry) -> dict[NodeId, Address] | None:
        """The address book a CONF entry carries, or None when this node cannot use it.

        The wire decoder refuses such an entry from a peer, and a node checks its own
        proposals, so one can only be in a log written before either check (or by a node that
        skipped them). The membership it holds is the core's and counts as on every node:
        only where to reach its members is lost, and an address is not replicated state (no
        node's answers depend on it), so using the addresses known before cannot make this
        node diverge. Stopping instead would stop every node that applies the entry, at every
        restart, for good. So it is logged (every time the entry is met) and counted, and a
        member it would have given an address stays unreachable from here until a later
        membership entry gives it one (remove the member and add it again)."""
        try:
            return decode_address_book(decode_conf_context(e.data))
        except (MalformedConfStateError, ValueError) as exc:
            self.unusable_address_books += 1
            log.error(
                "membership entry %d (term %d) carries an address book this node cannot use "
                "(%s): its membership counts as on every node, but a member it adds keeps no "
                "address here and cannot be reached from this node. Remove that member and "
                "add it again with a usable address",
                e.index,
                e.term,
                exc,
            )
            return None

    def _refresh_addresses(self) -> None:
        """Applied addresses plus those of appended changes (a member removed by a pending
        change stays reachable until it applies, so it can learn of its removal)."""
        book = dict(self._applied_addresses)
        for index in sorted(self._appended_conf_addresses):
            book.update(self._appended_conf_addresses[index])
        if book == self.addresses:
            return
        self.addresses = book
        if self.transport is not None:
            self.transport.set_peers(self._dial_addresses(book), dial=not self._links_dropped)

    def _note_membership(self, conf: ConfState, index: int) -> None:
        """An applied membership (a CONF entry or a snapshot's) at `index`: notes whether it
        removed this node after an earlier one held it, or added it (back)."""
        if self.node_id in conf.members():
            self._was_member = True
            self._removed_at = 0
            if self._links_dropped:
                log.info("node %d is a member again at index %d", self.node_id, index)
                self._redial()
        elif self._was_member and not self._removed_at:
            self._removed_at = index

    def _drop_links_if_removed(self, core: RaftCore) -> None:
        """Stop dialling the peers once this node applied its removal and then heard from no
        one for REMOVED_QUIET_ELECTIONS election timeouts (a removed leader first hands its
        leadership over: it keeps its links while it leads)."""
        if not self._removed_at or self._links_dropped or core.is_leader():
            return
        quiet_s = REMOVED_QUIET_ELECTIONS * 2 * self.config.election_timeout_ms / 1000
        if time.monotonic() - self._last_heard < quiet_s or self.transport is None:
            return
        self._links_dropped = True
        # Its peers stay peers of the transport: a member that adds it back dials it, and
        # must be accepted (the handshake refuses ids that are not peers) to be heard.
        self.transport.set_peers(self._dial_addresses(self.addresses), dial=False)
        log.warning(
            "node %d was removed from the cluster at index %d and has heard from no member "
            "for %.1f s: it no longer connects to its peers (it still accepts their "
            "connections, so it can be added back). Stop it; to bring it back, add it as a "
            "new member with an empty data directory",
            self.node_id,
            self._removed_at,
            quiet_s,
        )

    def _redial(self) -> None:
        """Undo `_drop_links_if_removed`: dial the peers again."""
        self._links_dropped = False
        if self.transport is not None:
            self.transport.set_peers(self._dial_addresses(self.addresses))

    def _dial_addresses(self, addresses: Mapping[NodeId, Address]) -> dict[NodeId, Address]:
        """Where the transport connects to each peer: its member address, or its override."""
        over = self.config.dial_overrides
        return {n: over.get(n, a) for n, a in addresses.items() if n != self.node_id}

    def _unwrap_snapshot(self, data: SnapshotData) -> tuple[SnapshotData, dict[NodeId, Address]]:
        """A snapshot's state and address book. An unusable book is handled as a CONF entry's
        (see _conf_entry_addresses): logged, counted, and the addresses known stay."""
        app_data, packed_book = _split_snapshot_data(data)
        try:
            return app_data, _decode_snapshot_address_book(packed_book)
        except SnapshotAddressBookError as exc:
            self.unusable_address_books += 1
            log.error(
                "a snapshot carries an address book this node cannot use (%s): its members "
                "keep the addresses this node knew; one it did not know cannot be reached "
                "from here until a membership entry gives it an address",
                exc,
            )
            return app_data, {}


def applicable_before_persist(rd: Ready, stable_index: int) -> int:
    """How many of `rd.committed` may be applied before `rd` is persisted.

    An entry qualifies when it is committed (on a quorum) and was already durable on this node
    before this Ready: index <= `stable_index`, the log's stable index when `ready()` returned
    (a suffix replaced by this Ready has already lowered it). Persisting `rd` changes nothing
    about such an entry. On a leader every committed entry qualifies, since it counts its own
    copy only once persisted. Applying is not sending, so persist-before-send is untouched.
    Stops at the first CONF entry (it changes the peer set the Ready's messages go to) and
    allows nothing when the Ready installs a snapshot (that must come first).
    """
    if rd.snapshot is not None:
        return 0
    count = 0
    for e in rd.committed:
        if e.index > stable_index or e.kind is EntryKind.CONF:
            break
        count += 1
    return count


def _expire_proposal(fut: asyncio.Future[ProposalResult], timeout_ms: int) -> None:
    if not fut.done():
        fut.set_exception(
            ProposalTimeoutError(
                f"proposal not applied within {timeout_ms} ms; its outcome is unknown"
            )
        )


def _stats_dict(wal: WriteAheadLog | None) -> dict[str, Any]:
    if wal is None:
        return {}
    st = wal.stats()
    return dataclasses.asdict(st) if dataclasses.is_dataclass(st) else {}
