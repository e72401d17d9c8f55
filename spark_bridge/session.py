"""The bridge's metastore session and the schema leases its batches hold (metastore.leases).

One `BridgeSession` per `MetastoreBridge` (one per Spark application): it opens a session named
after the app (app id, app name, host, user, pid), heartbeats it from a daemon thread, and
closes it on `close()` or at interpreter exit. A driver killed with kill -9 stops heartbeating,
so its session expires after its TTL and its leases stop blocking schema changes.

Leases follow batches: a writing batch pins its tables and leases the pinned versions in the
*same* request (`pin` with `session_id`), so leasing adds no round trip to the hot path. Leases
are ref-counted here, one per (table id, version) however many concurrent batches share it.
When a count drops to zero the lease is released by the background thread after a short grace
(a streaming query's next micro-batch usually re-pins the same version first), never by the
batch itself. If a release and a new pin of the same version cross on the wire (the server may
see the release second), the release carries `known_tm` (below) and the server keeps a lease a
later entry touched (`kept`), so the pin's batch is never without it. `known_tm` is the
session's, not a table's: a pin of this table applied before another pin answered first may
still be unanswered, so a release claims no more than the session knew when its oldest
unanswered pin was sent. One kept though no batch holds it (touched by a pin that failed here)
is released again without `known_tm`, once no pin of the session is unanswered; should a pin
sent after that release cross it, the thread re-acquires what is in use again, with the
earliest read_ts of the batches holding it (`hold(read_floors=...)`, what their pins recorded
on the lease), so the lease taken again still keeps GC below their reads: right after the
release when the pin was answered first, else once the pin is answered, if its leases were
applied before the release (its `lease_tm` below the release's `release_tm`; a daemon that
does not reply with `release_tm` gets the lease taken again for any pin that was unanswered
when the release's answer came).
Leases move forward while held (metastore AcquireLeases `known_tm`/`renew_from`): a streaming
query re-pins every micro-batch and never lets its lease go, and a lease kept its first read_ts
and acquired Tm, so GC never passed them and the tables' dead files filled the disk. Each pin
now says how far back this session still reads: the oldest read floor of its batches still in
flight (`hold(floor=...)` to `drop(floor=...)`), or the pin's Top when none is. It says so
(`renewal`) only while no other pin of the session is unanswered, with the Tm of the newest
answered one (`known_tm`): the server leaves alone a lease some entry it did not count on
touched since (a pin still on the wire, a retried one applied late).
A release refused with a retryable error (the cluster unavailable for the client's whole
budget) is tried again after the grace: heartbeats keep a session's leases alive, so a lease
given up on would block schema changes until the application ends. For the same reason a
leasing pin whose outcome is unknown (sent, then the connection broke or time ran out: it may
have been applied) is handed to this thread (`unknown_pin`), which learns the leases it may
hold - the same tables pinned at the same ts without leasing, once the server's waits for it
are over - and releases those no batch holds; the batch fails with a retryable error.
Likewise a `session_open` whose outcome is unknown may have opened a session nothing would
heartbeat or close: listed, counted against MAX_SESSIONS and sparing its attempt directories
from GC until its TTL. Its id is closed by this thread once the server's wait for that open is
over (`UNKNOWN_OPEN_SETTLE_MS`: it is in the log by then or never will be; closing an id never
opened is a no-op), retried while the cluster is unavailable (at most
UNKNOWN_OPEN_ATTEMPTS_MAX times); also after `close()`, and when the open that failed was the
first (the constructor raised: a thread of its own does it). The data source's append session
(spark_bridge.datasource `open_write_session`) uses `close_unknown_open`, the same wait and a
close done before its error is raised: no thread of its planning outlives it.

Nothing here is needed for safety: the commit rule (the version must be one of the two latest
active at the commit ts) is checked by the state machine whatever the leases. A lost session
(expired during a long GC pause, say) is reopened under a new id; batches that were running lose
their protection and may be refused at commit, which `foreach_batch` retries. A batch that wrote
files under the lost session is always refused at commit (GC may have deleted them as orphans:
metastore.leases `check_attempt_owners`), with a retryable error: it writes them again.
Protection records the lost session owned are released by the cluster a grace period after it
ended: `on_reopen` tells the bridge, which takes its open `protect()` blocks' protections again
under the new session (or fails the block if it cannot: spark_bridge.bridge `_OpenProtection`).
"""

from __future__ import annotations

import atexit
import getpass
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from metastore.client import SyncMetastoreClient
from metastore.daemon.api_limits import REQUEST_TIMEOUT_MS_DEFAULT
from metastore.errors import ErrorCode, MetastoreError, RequestTimeoutError, UnavailableError

log = logging.getLogger(__name__)

# A lease whose count dropped to zero is released this long after, unless a batch took it again.
LEASE_RELEASE_GRACE_MS: Final = 200
# Heartbeat interval when the server did not say (it does: `heartbeat_ms` in session_open).
HEARTBEAT_MS_FALLBACK: Final = 5_000
# Learning the leases a pin with an unknown outcome may have taken (`unknown_pin`) is tried at
# most this many times, one heartbeat interval apart (5 min at the default interval): past
# that the session's TTL has usually ended it, and its leases with it, if the cluster still
# does not answer.
UNKNOWN_PIN_ATTEMPTS_MAX: Final = 60
# A `session_open` with an unknown outcome is closed this long after it failed: the server's
# wait for its proposal is bounded by the request's timeout (the client sends none, so the
# server's default), after which the open is in the log (before the close) or never will be.
# Twice that, as for a pin.
UNKNOWN_OPEN_SETTLE_MS = 2 * REQUEST_TIMEOUT_MS_DEFAULT
# Closing it is tried at most this many times, one heartbeat interval apart; past that its TTL
# ends it anyway. At most UNKNOWN_OPENS_MAX ids wait to be closed (an older one is left to its
# TTL): a cluster unavailable for long makes every reopen attempt one.
UNKNOWN_OPEN_ATTEMPTS_MAX: Final = 60
UNKNOWN_OPENS_MAX: Final = 100


@dataclass(frozen=True, slots=True)
class LeaseKey:
    """One lease: the server keeps one per (session, table id, version). Equal keys are equal
    by those alone: table names are case-insensitive, so a batch holding `ns.Events` and one
    holding `ns.events` count the same lease, which is released only when both are done."""

    table: str = field(compare=False)
    table_id: int
    version: int

    def wire(self) -> dict[str, Any]:
        return {"table": self.table, "table_id": self.table_id, "version": self.version}


@dataclass(slots=True, kw_only=True, eq=False)  # each one is itself, however alike
class _UnknownPin:
    """A leasing pin of `tables` at `ts` under `session_id` whose outcome is unknown."""

    session_id: str
    tables: list[str]
    ts: int
    due: float  # monotonic s: when to learn its leases next
    attempts: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class _UnknownOpen:
    """A `session_open` of `session_id` whose outcome is unknown: closed once due."""

    session_id: str
    due: float  # monotonic s: when to close it next
    attempts: int = 0


def not_applied(exc: MetastoreError) -> bool:
    """Whether the client says the failed write was applied nowhere and never will be
    (`details.not_applied`: NotAppliedTimeoutError, or a call every node answered "nothing
    done"; metastore.client.protocol): nothing of it to look up, settle or undo."""
    return exc.details.get("not_applied") is True


def open_outcome_unknown(exc: MetastoreError) -> bool:
    """Whether a failed `session_open` may still have opened the session: it was sent, then
    the connection broke or the time ran out (the client retries the idempotent open within
    its budget, so this is what is left once that is spent), unless the client says no node
    applied it."""
    return isinstance(exc, UnavailableError | RequestTimeoutError) and not not_applied(exc)


def close_unknown_open(client: Any, session_id: str) -> None:
    """Blocking: close `session_id`, whose `session_open` had an unknown outcome, once that
    open settled (UNKNOWN_OPEN_SETTLE_MS from now); one close, the client's failover included.
    For callers with no thread that outlives them (the data source's append planning, in a
    Python worker Spark may end once it failed); `BridgeSession` does this in the
    background instead. A close that fails is logged: the session, if opened, ends at its
    TTL."""
    time.sleep(UNKNOWN_OPEN_SETTLE_MS / 1000)  # a time bound on the server: no event to await
    try:
        r = client.session_close(session_id)
    except MetastoreError as exc:
        _log_unknown_open_not_closed(session_id, exc)
        return
    _log_unknown_open_closed(session_id, r)


def _log_unknown_open_not_closed(session_id: str, exc: MetastoreError) -> None:
    log.warning(
        "cannot close session %s, whose open had an unknown outcome (%s); if it was opened, "
        "it stays open until its TTL",
        session_id,
        exc,
    )


def _log_unknown_open_closed(session_id: str, reply: Mapping[str, Any]) -> None:
    if reply.get("closed"):
        log.info("closed session %s: its open had an unknown outcome and was applied", session_id)


class BridgeSession:
    def __init__(
        self,
        client: SyncMetastoreClient,
        *,
        app_id: str,
        app_name: str,
        ttl_ms: int | None = None,
    ) -> None:
        self.client = client
        self.app_id = app_id
        self.app_name = app_name
        self.ttl_ms = ttl_ms
        self.session_id: str | None = None
        self.heartbeat_ms = HEARTBEAT_MS_FALLBACK
        self.available = True  # False: the token may not lease (reader role)
        self._lock = threading.Lock()
        # Serialises opening: a batch thread reopening after an expiry and the upkeep thread
        # seeing no session must open one session between them, not one each.
        self._open_lock = threading.Lock()
        self._refs: dict[LeaseKey, int] = {}
        # Per lease, the read_ts the pins of the batches holding it recorded (only leases of
        # tables they read): the lowest is what a re-acquire after a crossing release must ask
        # the server to keep.
        self._floors: dict[LeaseKey, Counter[int]] = {}
        # The read floors of the batches in flight (one per batch), how many leasing pins are
        # unanswered, and the Tm of the newest answered one: what `renewal` says.
        self._inflight: Counter[int] = Counter()
        self._pins_out = 0
        self._known_tm = 0
        # The `known_tm` each unanswered leasing pin of this session was sent with: a release
        # claims to know no entry past the lowest (see `_release_idle`).
        self._sent_known: Counter[int] = Counter()
        # Leases a release with `known_tm` kept though no batch of this session holds them (an
        # entry it did not count on touched them: a pin that failed here but was applied):
        # released again without `known_tm`, or they would stay for the session's life.
        self._release_plain: set[LeaseKey] = set()
        self._idle_since: dict[LeaseKey, float] = {}  # refs hit zero at (monotonic s)
        # Leases a release without `known_tm` took while a pin of the session was unanswered,
        # with the Tm it was applied at (None: unknown): that pin, applied before it, lost its
        # lease, which is taken again once it is answered (`hold`). Kept until no pin is
        # unanswered: a pin sent after the release's answer is applied after it.
        self._plain_released: dict[LeaseKey, int | None] = {}
        # Leases a batch holds that a release may have taken: the thread takes them again.
        self._take_again: set[LeaseKey] = set()
        # Leasing pins whose outcome is unknown: the leases they may hold are learnt and
        # released by the background thread (`unknown_pin`).
        self._unknown_pins: list[_UnknownPin] = []
        self._releasing: set[LeaseKey] = set()
        # Session ids whose `session_open` has an unknown outcome: closed by the background
        # thread (or, once it stopped, by a thread of their own), see `_note_unknown_open`.
        self._unknown_opens: list[_UnknownOpen] = []
        # Some thread closes `_unknown_opens`: the upkeep thread while it runs, then a drainer.
        self._draining = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        # Set once the upkeep thread left its loop (it may still close `_unknown_opens`).
        self._upkeep_over = threading.Event()
        self.heartbeats = 0
        self.reopened = 0
        # Called with the new session id each time a session replaces one (see `on_reopen`).
        self._reopen_listeners: list[Callable[[str], None]] = []
        self._opened_once = False  # set by the first successful open
        try:
            self._open()
        except BaseException:
            # Never used: no heartbeats. An open with an unknown outcome is still closed.
            self._stop.set()
            self._drain_if_orphaned()
            raise
        self._draining = True  # the upkeep thread's job from now on
        self._thread = threading.Thread(target=self._run, name="metastore-session", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # ------------------------------------------------------------------ session

    def _open(self) -> str | None:
        """Open a session; returns its id when it replaces an earlier one of this object."""
        session_id = uuid.uuid4().hex
        try:
            r = self.client.session_open(
                session_id,
                app_id=self.app_id[:256],
                app_name=self.app_name[:256],
                host=socket.gethostname()[:256],
                user=_user()[:256],
                pid=os.getpid(),
                started_at_ms=int(time.time() * 1000),
                ttl_ms=self.ttl_ms,
            )
        except MetastoreError as exc:
            if exc.code == ErrorCode.FORBIDDEN:
                log.warning(
                    "this token may not open a session; batches may read, and their writes "
                    "are refused (FORBIDDEN) before anything is written"
                )
                self.available = False
                return None
            if open_outcome_unknown(exc):
                self._note_unknown_open(session_id)
            raise
        with self._lock:
            # `close()` ran while this open was on the wire: it found no session to close, and
            # no thread would heartbeat or close this one (its leases and attempt directories
            # would outlive the application until its TTL). Checked under the lock `close()`
            # sets `_stop` under, so either it sees this session or this sees the stop.
            closed_meanwhile = self._stop.is_set()
            replaces = self._opened_once
            if not closed_meanwhile:
                self._opened_once = True
                self.session_id = session_id
                self.heartbeat_ms = int(r.get("heartbeat_ms") or HEARTBEAT_MS_FALLBACK)
        if closed_meanwhile:
            self._close_session(session_id)
            return None
        log.info("metastore session opened: %s (ttl %s ms)", session_id, r.get("ttl_ms"))
        return session_id if replaces else None

    def _ensure_open(self) -> None:
        """Open a session unless one is open (or leasing is not possible), or this one was
        closed: no thread would heartbeat or close a session opened after that."""
        with self._open_lock:
            if self.current() is None and self.available and not self._stop.is_set():
                replacement = self._open()
                if replacement is not None:
                    # Under the open lock: a later replacement's listeners run after these.
                    self._tell_reopened(replacement)

    def on_reopen(self, listener: Callable[[str], None]) -> None:
        """Call `listener(new_session_id)` each time a session replaces a lost one (not for
        the first), in the thread that opened it (the upkeep thread after a refused heartbeat,
        or a batch thread), before any other replacement opens. What the lost session owned
        is released by the cluster (leases at once, protection records a grace period after
        it ended): the bridge moves its open protections to the new one (`protect`)."""
        with self._lock:
            self._reopen_listeners.append(listener)

    def _tell_reopened(self, session_id: str) -> None:
        with self._lock:
            listeners = list(self._reopen_listeners)
        for listener in listeners:
            try:
                listener(session_id)
            except Exception:  # one listener's surprise must not keep the others from running
                log.exception("a listener of the session's reopen failed")

    def ensure_open(self) -> None:
        """Open a session now unless one is open or the token may not (`available` False);
        raises the MetastoreError that kept one from opening."""
        self._ensure_open()

    def current(self) -> str | None:
        """The session to lease under, or None when leasing is not possible."""
        with self._lock:
            return self.session_id

    def lost(self, session_id: str) -> None:
        """The server said `session_id` is gone: open a new one (its leases went with it)."""
        with self._lock:
            if self.session_id != session_id:
                return  # already replaced
            self.session_id = None
            self._refs.clear()
            self._floors.clear()
            self._inflight.clear()
            self._known_tm = 0
            self._sent_known.clear()
            self._release_plain.clear()
            self._plain_released.clear()
            self._take_again.clear()
            self._idle_since.clear()
            self._unknown_pins.clear()
        log.warning("metastore session %s expired; opening a new one", session_id)
        self.reopened += 1
        self._ensure_open()

    def close(self) -> None:
        """Stop heartbeating and close the session (its leases are released). Idempotent. An
        open still on the wire (a batch reopening after an expiry) closes the session it gets
        itself (`_open`): none is left open after this."""
        with self._lock:  # an open under way checks `_stop` under this lock (`_open`)
            if self._stop.is_set():
                return
            self._stop.set()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            # Its upkeep is over (it may go on closing sessions with unknown opens, which need
            # not hold this up).
            self._upkeep_over.wait(timeout=5)
        with self._lock:
            session_id, self.session_id = self.session_id, None
        if session_id is not None:
            self._close_session(session_id)
        atexit.unregister(self.close)

    def _close_session(self, session_id: str) -> None:
        try:
            self.client.session_close(session_id)
        except MetastoreError as exc:
            log.info("closing metastore session %s: %s", session_id, exc)

    # ------------------------------------------------------------------ leases

    def renewal(self, session_id: str, top: int) -> dict[str, int]:
        """The `pin` arguments of a leasing pin under `session_id` at `top` that let its leases
        move forward (see the module docstring); `answered` must follow, whatever the pin's
        outcome. `renew_from` only while no other pin is unanswered: one applied before this
        one but answered after could record a read below it, which `known_tm` cannot show."""
        with self._lock:
            self._pins_out += 1
            if session_id != self.session_id:
                return {}
            args = {"known_tm": self._known_tm}
            self._sent_known[self._known_tm] += 1
            if self._pins_out == 1:
                args["renew_from"] = min(self._inflight) if self._inflight else top
            return args

    def answered(
        self, session_id: str, lease_tm: int | None, *, sent_known_tm: int | None = None
    ) -> None:
        """A pin `renewal` was asked for is over; `lease_tm`: the Tm its leases were applied
        at (None when it failed); `sent_known_tm`: the `known_tm` `renewal` gave it."""
        with self._lock:
            self._pins_out -= 1
            if not self._pins_out:
                self._sent_known.clear()  # none is unanswered, whatever a caller left out
                # A pin sent from now on is applied after every release answered so far.
                self._plain_released.clear()
            if session_id != self.session_id:
                return
            if lease_tm is not None:
                self._known_tm = max(self._known_tm, lease_tm)
            if sent_known_tm is not None and self._sent_known[sent_known_tm] > 0:
                self._sent_known[sent_known_tm] -= 1
                if not self._sent_known[sent_known_tm]:
                    del self._sent_known[sent_known_tm]

    def hold(
        self,
        keys: Iterable[LeaseKey],
        *,
        session_id: str | None = None,
        read_floors: Mapping[LeaseKey, int] | None = None,
        floor: int | None = None,
        lease_tm: int | None = None,
    ) -> None:
        """A batch pinned (and the server leased) `keys` under `session_id` (default: the
        current session): count them in. Leases of a session already lost are not counted:
        they went with it, and the counts are the current session's. `read_floors`: the
        read_ts the pin recorded on the leases of the tables the batch reads; `floor`: the
        lowest timestamp the batch reads at. `drop` must be given the same. `lease_tm`: the
        (earliest) Tm the pin's leases were applied at, None if unknown: a lease a release
        without `known_tm` applied after it took is taken again."""
        take_again = False
        with self._lock:
            if session_id is not None and session_id != self.session_id:
                return
            for key in keys:
                self._refs[key] = self._refs.get(key, 0) + 1
                self._idle_since.pop(key, None)
                if key in self._plain_released:
                    release_tm = self._plain_released[key]
                    if release_tm is None or lease_tm is None or lease_tm < release_tm:
                        self._take_again.add(key)
                        take_again = True
            for key, read_floor in (read_floors or {}).items():
                self._floors.setdefault(key, Counter())[read_floor] += 1
            if floor is not None:
                self._inflight[floor] += 1
        if take_again:
            self._wake.set()

    def drop(
        self,
        keys: Iterable[LeaseKey],
        *,
        session_id: str | None = None,
        read_floors: Mapping[LeaseKey, int] | None = None,
        floor: int | None = None,
    ) -> None:
        """A batch ended (committed or not): count its leases, taken under `session_id`
        (default: the current session), out; idle ones are released by the background thread
        after LEASE_RELEASE_GRACE_MS. Leases of a session since lost went with it: counting
        them out of the new session's would release a lease another batch holds there.
        `read_floors` and `floor` as given to `hold`: its reads no longer hold leases back."""
        now = time.monotonic()
        with self._lock:
            if session_id is not None and session_id != self.session_id:
                return
            for key in keys:
                left = self._refs.get(key, 0) - 1
                if left > 0:
                    self._refs[key] = left
                    continue
                self._refs.pop(key, None)
                self._idle_since[key] = now
            for key, read_floor in (read_floors or {}).items():
                floors = self._floors.get(key)
                if floors is not None:
                    floors[read_floor] -= 1
                    if floors[read_floor] <= 0:
                        del floors[read_floor]
                    if not floors:
                        del self._floors[key]
            if floor is not None and self._inflight[floor] > 0:
                self._inflight[floor] -= 1
                if not self._inflight[floor]:
                    del self._inflight[floor]
        self._wake.set()

    def unknown_pin(
        self, session_id: str, tables: Iterable[str], ts: int, *, settle_ms: int
    ) -> None:
        """A leasing pin of `tables` at `ts` under `session_id` failed with an unknown outcome
        (sent, then the connection broke or the call ran out of time): the server may have
        leased them for this session, and no batch counts those leases, so heartbeats would
        keep them (blocking schema changes, holding GC back) for the session's life. After
        `settle_ms` (the server's waits for that pin are bounded by its timeout, so by then it
        is in the log or never will be) the background thread pins the same tables at the
        same ts without leasing - the versions in force at a ts never change - and counts
        those leases in and out, so the ones no batch holds are released as idle ones are."""
        with self._lock:
            if session_id != self.session_id:
                return  # that session is gone, and its leases with it
            due = time.monotonic() + settle_ms / 1000
            self._unknown_pins.append(
                _UnknownPin(session_id=session_id, tables=list(tables), ts=ts, due=due)
            )
        self._wake.set()

    def held(self) -> dict[LeaseKey, int]:
        with self._lock:
            return dict(self._refs)

    # ------------------------------------------------------------------ background

    def _run(self) -> None:
        try:
            self._run_upkeep()
        finally:
            self._upkeep_over.set()
        self._drain_unknown_opens()

    def _run_upkeep(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_ms / 1000
        while not self._stop.is_set():
            now = time.monotonic()
            wait_s = next_beat - now
            for due in (self._idle_due(now), self._unknown_pin_due(), self._unknown_open_due()):
                if due is not None:
                    wait_s = min(wait_s, due - now)
            self._wake.wait(timeout=max(0.0, wait_s))
            self._wake.clear()
            if self._stop.is_set():
                return
            self._upkeep(self._close_unknown_opens)
            self._upkeep(self._learn_unknown_pins)
            self._upkeep(self._acquire_again)
            self._upkeep(self._release_idle)
            if time.monotonic() >= next_beat:
                self._upkeep(self._heartbeat)
                # The next beat is an interval away whatever this one's outcome: a refused
                # heartbeat retried at once would spin, flooding the cluster.
                next_beat = time.monotonic() + self.heartbeat_ms / 1000

    @staticmethod
    def _upkeep(step: Callable[[], None]) -> None:
        try:
            step()
        except MetastoreError as exc:
            log.info("metastore session upkeep will be retried: %s", exc)
        except Exception:  # a daemon thread must not die on a surprise
            log.exception("metastore session upkeep failed")

    def _idle_due(self, now: float) -> float | None:
        with self._lock:
            if not self._idle_since:
                return None
            return min(self._idle_since.values()) + LEASE_RELEASE_GRACE_MS / 1000

    def _unknown_pin_due(self) -> float | None:
        with self._lock:
            return min((p.due for p in self._unknown_pins), default=None)

    def _unknown_open_due(self) -> float | None:
        with self._lock:
            return min((o.due for o in self._unknown_opens), default=None)

    def _note_unknown_open(self, session_id: str) -> None:
        """`session_open` of `session_id` failed with an unknown outcome: close that id once the
        server's wait for the open is over (see UNKNOWN_OPEN_SETTLE_MS)."""
        due = time.monotonic() + UNKNOWN_OPEN_SETTLE_MS / 1000
        with self._lock:
            self._unknown_opens.append(_UnknownOpen(session_id=session_id, due=due))
            dropped = self._unknown_opens[:-UNKNOWN_OPENS_MAX]
            del self._unknown_opens[:-UNKNOWN_OPENS_MAX]
        for gone in dropped:
            log.warning(
                "too many session opens with an unknown outcome: session %s, if opened, stays "
                "open until its TTL",
                gone.session_id,
            )
        self._wake.set()
        self._drain_if_orphaned()

    def _drain_if_orphaned(self) -> None:
        """Start a thread closing `_unknown_opens` when no thread does (the upkeep thread
        stopped, or never started)."""
        with self._lock:
            start = self._stop.is_set() and bool(self._unknown_opens) and not self._draining
            if start:
                self._draining = True
        if start:
            threading.Thread(
                target=self._drain_unknown_opens, name="metastore-session-close", daemon=True
            ).start()

    def _drain_unknown_opens(self) -> None:
        """Close `_unknown_opens` (the upkeep is over): each is tried at most
        UNKNOWN_OPEN_ATTEMPTS_MAX times, so this ends; the loop's bound says so too."""
        for _ in range(UNKNOWN_OPENS_MAX * UNKNOWN_OPEN_ATTEMPTS_MAX + 1):
            with self._lock:
                if not self._unknown_opens:
                    self._draining = False  # a later one starts another drainer
                    return
                due = min(o.due for o in self._unknown_opens)
            # Waiting for a time, not an event: nothing else wakes this thread.
            time.sleep(max(0.0, due - time.monotonic()))
            self._upkeep(self._close_unknown_opens)
        with self._lock:
            self._draining = False

    def _close_unknown_opens(self) -> None:
        """Close the ids of `_unknown_opens` that are due (see `_note_unknown_open`)."""
        now = time.monotonic()
        with self._lock:
            due = [o for o in self._unknown_opens if o.due <= now]
        for pending in due:
            try:
                r = self.client.session_close(pending.session_id)
            except MetastoreError as exc:
                with self._lock:
                    pending.attempts += 1
                    pending.due = time.monotonic() + self.heartbeat_ms / 1000
                    give_up = not exc.retryable or pending.attempts >= UNKNOWN_OPEN_ATTEMPTS_MAX
                    if give_up and pending in self._unknown_opens:
                        self._unknown_opens.remove(pending)
                if give_up:
                    _log_unknown_open_not_closed(pending.session_id, exc)
                else:
                    log.info("closing a session whose open had an unknown outcome: %s", exc)
                continue
            with self._lock:
                if pending in self._unknown_opens:
                    self._unknown_opens.remove(pending)
            _log_unknown_open_closed(pending.session_id, r)

    def _learn_unknown_pins(self) -> None:
        """Release what the pins of `unknown_pin` that are due may have leased (see there)."""
        now = time.monotonic()
        with self._lock:
            session_id = self.session_id
            self._unknown_pins = [p for p in self._unknown_pins if p.session_id == session_id]
            due = [p for p in self._unknown_pins if p.due <= now]
        for pin in due:
            try:
                r = self.client.pin(pin.tables, pin.ts)
            except MetastoreError as exc:
                with self._lock:
                    pin.attempts += 1
                    pin.due = time.monotonic() + self.heartbeat_ms / 1000
                    give_up = not exc.retryable or pin.attempts >= UNKNOWN_PIN_ATTEMPTS_MAX
                    if give_up and pin in self._unknown_pins:
                        self._unknown_pins.remove(pin)
                if give_up:
                    log.warning(
                        "cannot learn the leases a pin of %s with an unknown outcome may hold "
                        "(%s); they are held until the session ends",
                        ", ".join(pin.tables),
                        exc,
                    )
                else:
                    log.info("learning the leases of a pin with an unknown outcome: %s", exc)
                continue
            with self._lock:
                if pin in self._unknown_pins:
                    self._unknown_pins.remove(pin)
            keys = [
                LeaseKey(
                    table=str(p["table"]), table_id=int(p["table_id"]), version=int(p["version"])
                )
                for p in r["pins"]
            ]
            # Counted in and out: released after the grace unless a batch holds them (its end
            # releases them then). The release carries `known_tm`: if that pin was applied
            # after it, the server keeps them (`kept`) and they are released again without.
            self.hold(keys, session_id=pin.session_id)
            self.drop(keys, session_id=pin.session_id)

    def _heartbeat(self) -> None:
        session_id = self.current()
        if session_id is None:
            self._ensure_open()
            return
        try:
            self.client.session_heartbeat(session_id)
            self.heartbeats += 1
        except MetastoreError as exc:
            if exc.code != ErrorCode.SESSION_NOT_FOUND:
                raise
            self.lost(session_id)

    def _release_idle(self) -> None:
        cutoff = time.monotonic() - LEASE_RELEASE_GRACE_MS / 1000
        with self._lock:
            session_id = self.session_id
            due = [k for k, since in self._idle_since.items() if since <= cutoff]
            for key in due:
                del self._idle_since[key]
            self._releasing.update(due)
            # A pin of a batch that starts now may cross the release on the wire and be
            # applied first: with `known_tm` the server keeps the lease it touched, so that
            # batch is never without it. `known_tm` is the session's, not the table's: a pin
            # of this table applied before the newest answered one (of another table) may
            # still be unanswered, so the release claims no more than what the session knew
            # when its oldest unanswered pin was sent (that pin's entry is later).
            unanswered_known = min(self._sent_known) if self._sent_known else None
            known_tm: int | None = self._known_tm
            if unanswered_known is not None:
                known_tm = min(self._known_tm, unanswered_known)
            elif self._release_plain & set(due):
                # Kept before for no batch (an entry of a failed pin touched it): released
                # whatever touched it - only while no pin is unanswered, which may have.
                known_tm = None
        if not due or session_id is None:
            with self._lock:
                self._releasing.difference_update(due)
            return
        kept: set[tuple[int, int]] = set()
        answered = False
        # The Tm the release was applied at, None when unknown (it failed, or a daemon from
        # before `release_tm` answered).
        release_tm: int | None = None
        try:
            wires = [k.wire() for k in due]
            if known_tm is None:
                r = self.client.lease_release(session_id, wires)
            else:
                r = self.client.lease_release(session_id, wires, known_tm=known_tm)
                kept = {(int(i), int(v)) for i, v in r.get("kept") or []}
            answered = True
            if r.get("release_tm") is not None:
                release_tm = int(r["release_tm"])
        except MetastoreError as exc:
            if exc.retryable:
                # Not released (or not known to be): the session's heartbeats keep a lease
                # alive, so one given up on would block schema changes for the rest of the
                # application. Release it again after the grace, unless in use again by then.
                self._idle_again(session_id, due)
            elif known_tm is not None:
                # A node from before `known_tm` existed refuses it: release them without.
                with self._lock:
                    self._release_plain.update(due)
                self._idle_again(session_id, due)
            raise
        finally:
            with self._lock:
                self._releasing.difference_update(due)
                # A batch pinned one of these again while the release was on the wire: the
                # server may have applied the release second (also if it failed: its outcome
                # may be unknown). Take it again, keeping the reads of the batches holding it.
                plain_again: list[LeaseKey] = []
                for k in due:
                    if self._refs.get(k, 0) > 0:
                        if (k.table_id, k.version) not in kept:  # else the crossing pin's stayed
                            self._take_again.add(k)
                        continue
                    if (k.table_id, k.version) in kept:
                        plain_again.append(k)
                        continue
                    if known_tm is None and self._pins_out:
                        # A pin still unanswered may have crossed this release, which kept
                        # nothing: once answered, that pin says whether it was applied before
                        # (its lease taken) - see `hold`.
                        self._plain_released[k] = release_tm
                    if answered:
                        self._floors.pop(k, None)
                        self._release_plain.discard(k)  # released: nothing left to take
                self._release_plain.update(plain_again)
                if self._take_again:
                    self._wake.set()  # taken again now, or by the next round if this raises
        if plain_again:
            self._idle_again(session_id, plain_again)
        self._acquire_again()

    def _acquire_again(self) -> None:
        """Take the leases of `_take_again` that a batch still holds again (see
        `_release_idle` and `hold`), keeping the earliest read of the batches holding each."""
        with self._lock:
            session_id = self.session_id
            groups: dict[int | None, list[LeaseKey]] = {}
            for k in self._take_again:
                if self._refs.get(k, 0) > 0:
                    floors = self._floors.get(k)
                    groups.setdefault(min(floors) if floors else None, []).append(k)
            self._take_again.clear()
        if session_id is None:
            return
        for floor, keys in groups.items():
            try:
                if floor is None:
                    self.client.lease_acquire(session_id, [k.wire() for k in keys])
                else:
                    self.client.lease_acquire(session_id, [k.wire() for k in keys], read_ts=floor)
            except MetastoreError as exc:
                # e.g. the version is no longer one of the two latest: the batch's commit
                # rule still protects correctness.
                log.info("re-acquiring leases after a crossing release failed: %s", exc)

    def _idle_again(self, session_id: str, keys: Iterable[LeaseKey]) -> None:
        now = time.monotonic()
        with self._lock:
            if self.session_id != session_id:
                return  # that session is gone, and its leases with it
            for key in keys:
                if self._refs.get(key, 0) == 0:
                    self._idle_since.setdefault(key, now)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
