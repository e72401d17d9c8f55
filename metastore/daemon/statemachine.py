"""The catalog as a Raft state machine: the adapter between `raft.node` and `MetastoreState`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence

from metastore.commands import (
    Command,
    CommandFromNewerReleaseError,
    DropNamespace,
    DropTable,
    RevokeCerts,
    decode_command,
)
from metastore.daemon import collector
from metastore.errors import MetastoreError, ReleaseTooOldError
from metastore.events import EventLog, events_of
from metastore.outcome import Outcome
from metastore.state import MetastoreState
from raft.core.types import Entry, EntryKind
from raft.filebytes import SnapshotData

# Applies skipped per second the last invariant check took (tests only; see __init__).
CHECK_SKIP_PER_SECOND = 5_000
# Commands a leader decoded before proposing them, kept for their entries' apply: a proposal
# that never commits (leadership lost, timeout) leaves one behind, so only the newest are kept.
DECODED_AHEAD_MAX = 4
# An appended entry's payload at least this large is decoded in a thread before it commits
# (`prepare_appended`): below it the hand-over costs more than the decode.
DECODE_AHEAD_BYTES_MIN = 64 * 1024

# Upper bounds (seconds) of the apply-duration histogram (`ApplySeconds`): most applies take
# tens of microseconds; a large overwrite or a DDL over a big catalog takes milliseconds to
# seconds, which every later entry (and every client of the node) waits for.
APPLY_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5
)  # fmt: skip

log = logging.getLogger("metastore.statemachine")


class ApplySeconds:
    """The apply durations of one command kind, as a histogram's plain numbers (rendered at
    scrape time by metastore.daemon.metrics): a Prometheus observe per entry would cost more
    than these two additions, and the loop applies every entry."""

    __slots__ = ("bucket_counts", "seconds_total")

    def __init__(self) -> None:
        # Per bucket of APPLY_SECONDS_BUCKETS, then one for above the last bound.
        self.bucket_counts = [0] * (len(APPLY_SECONDS_BUCKETS) + 1)
        self.seconds_total = 0.0


class CatalogStateMachine:
    """Applies committed entries in log order. NORMAL entries are catalog commands; every other
    kind (leader no-op, idle tick, membership) only advances the catalog's time, because safe
    time must move with every applied entry."""

    def __init__(self, *, check_invariants: bool = False) -> None:
        self.state = MetastoreState()
        # Tests turn this on. A check is O(catalog size), so after every apply it makes a long
        # history quadratic (a restart replaying thousands of commits would block the node for
        # many seconds): checks are skipped for a number of applies proportional to how long
        # the last one took, which bounds their cost to ~0.2 ms per applied entry.
        self.check_invariants = check_invariants
        self._checks_skipped = 0
        self._skip_checks = 0
        # The change feed (the `watch` op): events of the entries applied since this node
        # loaded its snapshot, and the watchers waiting for the next ones.
        self.events = EventLog()
        self._event_waiters: set[asyncio.Future[None]] = set()
        # Called after a revocation was applied, or a snapshot holding some was restored: the
        # node closes links and client connections that use a certificate revoked now.
        self.on_revoked: Callable[[], None] | None = None
        # Called after a snapshot was taken or restored: the state's objects are the heap's
        # long-lived part then (the node process freezes them: metastore.daemon.collector).
        self.on_state_settled: Callable[[], None] | None = None
        # Called in the worker thread that decoded a snapshot (`prepare_restore`), with the
        # collector paused: the node process freezes the new state there.
        self.on_state_decoded: Callable[[], None] | None = None
        # Entry bytes -> the command they decode to, decoded off the loop before proposing
        # (`expect_entry`).
        self._decoded_ahead: dict[bytes, Command] = {}
        # Entry bytes -> their decode, running in `_decoder` (`prepare_appended`).
        self._decoding: dict[bytes, concurrent.futures.Future[Command]] = {}
        self._decoder: concurrent.futures.ThreadPoolExecutor | None = None
        # Command class -> how long its entries took to apply here (decode, the state's apply,
        # the change feed). Keys are the command classes of metastore.commands: a bounded set.
        self.apply_seconds: dict[type[Command], ApplySeconds] = {}

    def prepare_appended(self, entries: Sequence[Entry]) -> None:
        """Raft appended `entries` to this node's log (raft.node `prepare_appended`): a large
        command's bytes start decoding in a thread now, so that apply, on the loop, takes the
        decode (or waits for its rest) instead of doing all of it there. On a follower
        decoding the largest commit held the loop a tenth of a second or more (a second on a
        loaded machine), on both followers at once: their leader, hearing from neither, stepped
        down (check_quorum). The decode is `decode_command` of exactly those bytes, so apply
        decides what it would have decided; an entry that never commits leaves its decode
        behind, of which only the newest DECODED_AHEAD_MAX are kept."""
        for entry in entries:
            data = entry.data
            if (
                entry.kind is not EntryKind.NORMAL
                or len(data) < DECODE_AHEAD_BYTES_MIN
                or data in self._decoded_ahead
                or data in self._decoding
            ):
                continue
            if self._decoder is None:
                self._decoder = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="decode-ahead"
                )
            while len(self._decoding) >= DECODED_AHEAD_MAX:
                del self._decoding[next(iter(self._decoding))]
            self._decoding[data] = self._decoder.submit(decode_command, data)

    def expect_entry(self, data: bytes, command: Command) -> None:
        """`command` is what `decode_command(data)` returns: an entry of exactly these bytes
        is applied as `command`, once, without being decoded again. Apply runs on the event loop
        that also runs Raft, and decoding the largest commit (10,000 files) holds it for a
        tenth of a second or more (several on a loaded machine: a leader that holds it past the
        election timeout loses its term); the leader has decoded such a command already, off
        the loop. Keyed by value, so any entry of these bytes decodes alike: the outcome is
        the one every other node reaches by decoding them. Never given a command that was not
        decoded from `data` (a command re-encoded differently would apply other than it
        decodes on the followers)."""
        self._decoded_ahead.pop(data, None)
        while len(self._decoded_ahead) >= DECODED_AHEAD_MAX:
            del self._decoded_ahead[next(iter(self._decoded_ahead))]
        self._decoded_ahead[data] = command

    def _decode(self, data: bytes) -> Command:
        if self._decoded_ahead:
            command = self._decoded_ahead.pop(data, None)
            if command is not None:
                return command
        if self._decoding:
            decoding = self._decoding.pop(data, None)
            if decoding is not None:
                # Raises what decode_command raised, as a decode here would.
                return decoding.result()
        return decode_command(data)

    def apply(self, entry: Entry) -> Outcome:
        if entry.kind is EntryKind.NORMAL:
            started = time.perf_counter()
            try:
                command = self._decode(entry.data)
            except CommandFromNewerReleaseError as e:
                # Only a leader of a newer release proposes what this one cannot decode (every
                # proposal is decoded by its leader first): applying it as a failure would
                # diverge from the nodes that know it (metastore.apply_version).
                raise ReleaseTooOldError(
                    f"entry {entry.index} holds a command of a newer release ({e.message}): "
                    "upgrade this node's release and restart it (it resumes from its log)"
                ) from e
            except MetastoreError as e:
                outcome = Outcome.failure(e)
            else:
                # A drop ends its tables' running schema jobs (aborted): the feed says so.
                dropping = isinstance(command, DropTable | DropNamespace)
                running = self._running_jobs() if dropping else set()
                # Events follow the rules of the apply version the entry is applied at (not
                # replicated state, but every node must derive the same ones: metastore.events).
                apply_version = self.state.apply_version
                outcome = self.state.apply(command, tm=entry.tm, index=entry.index, decoded=True)
                aborted = sorted(running - self._running_jobs()) if running else []
                events = events_of(
                    command,
                    outcome,
                    tm=entry.tm,
                    index=entry.index,
                    aborted_jobs=aborted,
                    apply_version=apply_version,
                )
                if events:
                    self.events.append(events, tm=entry.tm)
                    self._wake_watchers()
                if outcome.ok and isinstance(command, RevokeCerts):
                    self._revoked()
                self._note_apply(type(command), time.perf_counter() - started)
        else:
            outcome = self.state.observe_tick(entry.tm, entry.index)
        if self.check_invariants:
            if self._checks_skipped >= self._skip_checks:
                started = time.perf_counter()
                self.state.check_invariants()
                self._skip_checks = int((time.perf_counter() - started) * CHECK_SKIP_PER_SECOND)
                self._checks_skipped = 0
            else:
                self._checks_skipped += 1
        return outcome

    def _note_apply(self, kind: type[Command], seconds: float) -> None:
        stats = self.apply_seconds.get(kind)
        if stats is None:
            stats = self.apply_seconds[kind] = ApplySeconds()
        stats.seconds_total += seconds
        stats.bucket_counts[bisect_left(APPLY_SECONDS_BUCKETS, seconds)] += 1

    def _running_jobs(self) -> set[int]:
        return {job.job_id for job in self.state.jobs.jobs(running_only=True)}

    def snapshot(self) -> bytes:
        data = self.state.to_snapshot()
        self._settled()
        return data

    def prepare_snapshot(self) -> Callable[[], list[bytes | memoryview]]:
        """`snapshot()` in two halves (raft.node): a view of the state at the last applied
        index, taken now, on the loop (milliseconds); the function returned encodes it, in a
        worker thread, whatever is applied meanwhile (MetastoreState.snapshot_encoder), into
        the parts of `snapshot()`'s bytes. `on_state_settled` is not called: see
        `snapshot_written`."""
        return self.state.snapshot_encoder().parts

    def snapshot_written(self) -> None:
        """A snapshot `prepare_snapshot` began is written (raft.node, on the loop)."""
        self._settled()

    def restore(self, data: SnapshotData) -> None:
        self.prepare_restore(data)()
        self._settled()

    def prepare_restore(self, data: SnapshotData) -> Callable[[], None]:
        """Decode a snapshot (safe in a worker thread: it reads only `data`, builds a new state
        and touches nothing of this one); the function it returns installs it (on the loop).

        raft.node runs this part in a thread while a follower installs a leader's snapshot:
        decoding and checking a million file entries takes 8-10 s of CPU, all of which held
        the node's event loop before, so its clients, health checks and links got no answer
        meanwhile. The driver awaits it, so nothing is applied in between. The collector is
        paused meanwhile and `on_state_decoded` runs before it resumes (see
        metastore.daemon.collector: `paused`, `freeze_decoded`); `on_state_settled` is not
        called for such an install (`restore` calls it)."""
        with collector.paused():
            state = MetastoreState.from_snapshot(data) if data else MetastoreState()
            if self.on_state_decoded is not None:
                self.on_state_decoded()
        return lambda: self._install(state)

    def _install(self, state: MetastoreState) -> None:
        self.state = state
        # The entries before the snapshot are gone here: so are their events.
        self.events.reset(floor_tm=self.state.last_tm)
        self._wake_watchers()
        if len(self.state.revoked):
            self._revoked()

    def _settled(self) -> None:
        if self.on_state_settled is not None:
            self.on_state_settled()

    def _revoked(self) -> None:
        if self.on_revoked is None:
            return
        try:
            self.on_revoked()
        except Exception:
            log.exception("acting on a certificate revocation failed")

    def wait_for_events(self) -> asyncio.Future[None]:
        """A future that completes when the next event is recorded (or the feed is reset)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._event_waiters.add(fut)
        # A long poll that timed out cancels its future: forget it then, not at the next event
        # (a quiet catalog would keep every timed-out poll's future).
        fut.add_done_callback(self._event_waiters.discard)
        return fut

    def _wake_watchers(self) -> None:
        waiters, self._event_waiters = self._event_waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
