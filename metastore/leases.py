"""Sessions and schema leases (CockroachDB's table descriptor leases, on the replicated state).

Key idea
    A Spark application opens a *session* and keeps it alive with heartbeats. Each batch
    *leases* the schema versions it pinned, for as long as it runs. A lease is a promise to the
    catalog: "a batch may still commit with this version". The catalog keeps the **two-version
    invariant** - unexpired leases exist on at most the two latest versions of a table - by
    refusing to publish version v+1 while an unexpired lease on v-1 exists
    (SchemaChangeBlockedError, retryable: the daemon's `ddl` waits for the leases to drain). So a
    batch holding a lease on v can never be overtaken by two schema changes: its commit with v
    stays valid (v is one of the two latest active versions at the commit ts).

    Leases never make anything *unsafe*: the commit rule (metastore.txn: the version must be one
    of the two latest active at the commit ts) is checked regardless. A lease only buys the batch
    the right not to be overtaken, for as long as its session lives.

Time
    Everything is judged by the Tm of the entry being applied, never by a clock, so every replica
    decides the same. A session's deadline is its last heartbeat's Tm + its TTL; at an entry with
    Tm >= deadline the session is *expired*: its leases block nothing, it can no longer
    heartbeat or lease, and the leader proposes ExpireSessions(reason "ttl") to sweep it (apply
    re-checks the deadline against that entry's own Tm, so a heartbeat that got in first wins).
    An expired session never comes back: its deadline only moves with a heartbeat, which it can
    no longer make.

Commands (metastore.commands) and their results
    OpenSession       {session_id, created, ttl_ms, deadline_tm}; the same id with the same info
                      is idempotent (and a heartbeat), with other info it is InvalidArgument;
                      the id of a session that ended (one of the last MAX_ENDED_SESSIONS_KEPT)
                      is InvalidArgument: session ids are never reused.
    HeartbeatSession  {session_id, deadline_tm}; SessionNotFound when unknown or expired.
    CloseSession      {session_id, closed}; its leases are released. Idempotent.
    ExpireSessions    {expired: [...], skipped: [...]} (skipped: unknown, or not past the
                      deadline for reason "ttl").
    AcquireLeases     {session_id, leases: [...], deadline_tm}; counts as a heartbeat. Each
                      (table, table_id, version) must name the live incarnation and one of its two
                      latest versions (LeaseVersionNotLatest, retryable). Idempotent per lease.
                      A held lease keeps the earliest read_ts and its first acquired Tm, unless
                      the command renews it (see "Moving forward"). At most
                      MAX_LEASES_PER_SESSION per session and, from apply version 3, MAX_LEASES
                      in the cluster (LimitExceeded; a lease already held counts once).
    ReleaseLeases     {session_id, released}; releasing what is not held is a no-op. With
                      known_tm (a renewing holder's), a lease an entry after it touched stays
                      (`kept`: [[table_id, version], ...]): a pin that crossed the release on
                      the wire holds it again. (The daemon's reply adds `release_tm`, the
                      entry's Tm, outside this result: a release without known_tm keeps
                      nothing, and a pin with an earlier Tm lost its lease to it.)

Moving forward
    A lease held for weeks (a streaming query re-pins every micro-batch and never lets it go)
    would keep GC (metastore.gc: acquired Tm - 2 DD, read_ts - 1) below its first batch for
    ever. A renewing holder's AcquireLeases carries `known_tm`, the Tm of the newest of its
    acquisitions it has the answer of (sent only while none is unanswered), and every lease it
    names records the entry's Tm (`touched_tm`). With `renew_from` ("no read of mine below it
    is in flight, besides the one this command records"), each lease the session already held
    whose acquired and touched Tm are <= known_tm gets read_ts = max(read_ts, renew_from) (a
    lease without one gets renew_from), raised above the GC threshold if at or below it, then
    lowered to this command's read_ts as for any acquire, and acquired Tm = this Tm. Never
    backward, never past a read the holder knows of; and a read recorded by an entry the
    holder had not seen (a pin on the wire, a retried one applied late) is never passed: that
    entry touched the lease after known_tm. Commands without these fields (older entries,
    older clients, `lease_acquire`) move nothing, as before.

Who blocks a change
    `blockers(inc, tm)`: leases on versions below the current one whose session is unexpired at
    tm, with the session's labels - what `SchemaChangeBlockedError.details.blockers` and `metastore
    lease blockers` show.

Invariants (check_invariants)
    * at most MAX_SESSIONS sessions; every session's heartbeat Tm >= its open Tm, <= last_tm;
    * every lease belongs to a present session, names a live incarnation (or, for a lease that
      keeps a batch's reads, one dropped since) and was acquired at a Tm within its session's
      life;
    * two versions: for every table, leases whose session is unexpired at last_tm are on its
      latest or second-latest version;
    * ended sessions are at most MAX_ENDED_SESSIONS_KEPT, in end order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hlc.limits import LOGICAL_BITS
from metastore import limits
from metastore.catalog import Catalog, TableState
from metastore.commands import (
    AcquireLeases,
    CloseSession,
    ExpireSessions,
    HeartbeatSession,
    LeaseKey,
    OpenSession,
    ReleaseLeases,
    SessionInfo,
    TableName,
)
from metastore.errors import (
    BeforeGcThresholdError,
    CatalogInvariantError,
    InvalidArgumentError,
    LeaseVersionNotLatestError,
    MalformedSnapshotError,
    MetastoreError,
    SchemaChangeBlockedError,
    SessionNotFoundError,
    TableNotFoundError,
    limit_exceeded,
)
from metastore.snapshot_data import expect_int, expect_rows, expect_str

Result = dict[str, object]

# Blocking sessions named in the error's message (all of them are in its details).
BLOCKERS_IN_MESSAGE_MAX = 3

# A writer's attempt directory is `_txn/<session id>--<attempt>/` (spark_bridge/files.py): the
# orphan scan (metastore/daemon/gc_worker.py) leaves it alone only while that session is live,
# and a commit may list files in it only while the session is live (`check_attempt_owners`).
TXN_DIR = "_txn"
SESSION_DIR_SEPARATOR = "--"


def attempt_owners(dir_parts: Sequence[str]) -> list[str]:
    """The session ids of the attempt directories (`_txn/<session id>--...`) among the
    directory components `dir_parts` of a path, outermost first."""
    owners: list[str] = []
    for i, part in enumerate(dir_parts[:-1]):
        if part == TXN_DIR and SESSION_DIR_SEPARATOR in dir_parts[i + 1]:
            owners.append(dir_parts[i + 1].split(SESSION_DIR_SEPARATOR, 1)[0])
    return owners


@dataclass(slots=True, kw_only=True)
class Session:
    session_id: str
    info: SessionInfo
    ttl_ms: int
    opened_tm: int
    heartbeat_tm: int
    opened_by: str

    @property
    def deadline_tm(self) -> int:
        """The first Tm at which the session is expired."""
        return self.heartbeat_tm + (self.ttl_ms << LOGICAL_BITS)

    def live_at(self, tm: int) -> bool:
        return tm < self.deadline_tm

    def view(self) -> Result:
        return {
            "session_id": self.session_id,
            "app_id": self.info.app_id,
            "app_name": self.info.app_name,
            "host": self.info.host,
            "user": self.info.user,
            "pid": self.info.pid,
            "started_at_ms": self.info.started_at_ms,
            "ttl_ms": self.ttl_ms,
            "opened_tm": self.opened_tm,
            "heartbeat_tm": self.heartbeat_tm,
            "deadline_tm": self.deadline_tm,
            "opened_by": self.opened_by,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    table: TableName
    table_id: int
    version: int
    session_id: str
    acquired_tm: int
    # The earliest timestamp a batch holding the lease reads the table at (AcquireLeases
    # read_ts), None for a lease taken without one (a write-only table, an older client): GC
    # keeps the table's threshold below it (metastore.gc.GcState.bound).
    read_ts: int | None = None
    # The Tm of the newest AcquireLeases with `known_tm` (a renewing holder's) that named the
    # lease, None if none did: a renewal whose `known_tm` is older leaves the lease alone.
    touched_tm: int | None = None

    def last_touched_tm(self) -> int:
        """The newest Tm at which an entry acquired, renewed or (renewing holder) named it."""
        return max(self.acquired_tm, self.touched_tm or 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndedSession:
    session_id: str
    app_id: str
    reason: str  # "closed" | "ttl" | "admin"
    by: str
    ended_tm: int


class Sessions:
    """Sessions and their leases. Owned by `MetastoreState`; pure."""

    __slots__ = ("_by_session", "_by_table", "_ended", "_leases", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        # (table_id, version, session_id) -> lease, in acquisition order.
        self._leases: dict[tuple[int, int, str], Lease] = {}
        # session_id -> the keys of its leases (derived from _leases, kept in step with it): a
        # session's count and its end need not scan every lease of the cluster.
        self._by_session: dict[str, dict[tuple[int, int, str], None]] = {}
        # table_id -> the keys of its leases, in acquisition order (derived likewise): the
        # leases that hold up a table's next version (every ALTER, and the leader's job worker
        # every poll) need not scan every lease of the cluster.
        self._by_table: dict[int, dict[tuple[int, int, str], None]] = {}
        self._ended: deque[EndedSession] = deque()

    @property
    def session_count(self) -> int:
        """Live sessions (for the node's metrics: O(1))."""
        return len(self._sessions)

    @property
    def lease_count(self) -> int:
        """Leases held (for the node's metrics: O(1))."""
        return len(self._leases)

    # ----------------------------------------------------------------------------------------
    # Commands
    # ----------------------------------------------------------------------------------------

    def open(self, cmd: OpenSession, *, tm: int) -> Result:
        existing = self._sessions.get(cmd.session_id)
        if existing is not None:
            if (existing.info, existing.ttl_ms) != (cmd.info, cmd.ttl_ms):
                raise InvalidArgumentError(
                    f"session {cmd.session_id!r} is already open with other settings",
                    details={"session_id": cmd.session_id},
                )
            if not existing.live_at(tm):
                raise _not_found(cmd.session_id, existing)
            existing.heartbeat_tm = tm  # a re-open (a retried open) is a sign of life too
            return {**self._ack(existing), "created": False, "ttl_ms": existing.ttl_ms}
        if any(e.session_id == cmd.session_id for e in self._ended):
            # Its attempt directories' old files may be gone (GC's orphan scan deletes them
            # once it is not live): alive again, it could commit them.
            raise InvalidArgumentError(
                f"session {cmd.session_id!r} ended; a session id is never reused: open a new "
                "session under a fresh id",
                details={"session_id": cmd.session_id},
            )
        if len(self._sessions) >= limits.MAX_SESSIONS:
            raise limit_exceeded(
                "MAX_SESSIONS", limits.MAX_SESSIONS, len(self._sessions) + 1, "open sessions"
            )
        session = Session(
            session_id=cmd.session_id,
            info=cmd.info,
            ttl_ms=cmd.ttl_ms,
            opened_tm=tm,
            heartbeat_tm=tm,
            opened_by=cmd.opened_by,
        )
        self._sessions[cmd.session_id] = session
        return {**self._ack(session), "created": True, "ttl_ms": session.ttl_ms}

    def heartbeat(self, cmd: HeartbeatSession, *, tm: int) -> Result:
        session = self._live(cmd.session_id, tm)
        session.heartbeat_tm = tm
        return self._ack(session)

    def close(self, cmd: CloseSession, *, tm: int) -> Result:
        session = self._sessions.get(cmd.session_id)
        if session is None:
            return {"session_id": cmd.session_id, "closed": False}
        self._end(session, reason="closed", by=session.opened_by, tm=tm)
        return {"session_id": cmd.session_id, "closed": True}

    def expire(self, cmd: ExpireSessions, *, tm: int) -> Result:
        expired: list[str] = []
        skipped: list[str] = []
        for session_id in cmd.session_ids:
            session = self._sessions.get(session_id)
            if session is None or (cmd.reason == "ttl" and session.live_at(tm)):
                skipped.append(session_id)
                continue
            self._end(session, reason=cmd.reason, by=cmd.by, tm=tm)
            expired.append(session_id)
        return {"expired": expired, "skipped": skipped, "reason": cmd.reason}

    def acquire(
        self,
        cmd: AcquireLeases,
        *,
        tm: int,
        catalog: Catalog,
        threshold: Callable[[int], int] = lambda _table_id: 0,
        leases_max: int | None = None,
        name_acquired: bool = False,
    ) -> Result:
        """`threshold(table_id)` is the table's GC threshold: reads at or below it are refused
        (BeforeGcThreshold), so a lease is never promised to keep reads GC has passed.
        `leases_max`: the cluster-wide bound on leases (limits.MAX_LEASES from apply version 3;
        None below it). `name_acquired` (apply version 3: results are recorded for request-id
        retries, so their shape is state): the result also names the leases new to the
        session, `acquired`."""
        session = self._live(cmd.session_id, tm)
        new = [k for k in cmd.leases if (k.table_id, k.version, cmd.session_id) not in self._leases]
        for key in cmd.leases:
            _check_leasable(key, catalog)
        if cmd.read_ts is not None:
            for key in cmd.leases:
                if key.table_id in cmd.reads and cmd.read_ts <= threshold(key.table_id):
                    raise _before_threshold(key, cmd.read_ts, threshold(key.table_id))
        held = len(self._by_session.get(cmd.session_id, ()))
        if held + len(new) > limits.MAX_LEASES_PER_SESSION:
            raise limit_exceeded(
                "MAX_LEASES_PER_SESSION",
                limits.MAX_LEASES_PER_SESSION,
                held + len(new),
                f"leases of session {cmd.session_id}",
            )
        if leases_max is not None and new and len(self._leases) + len(new) > leases_max:
            raise limit_exceeded(
                "MAX_LEASES", leases_max, len(self._leases) + len(new), "leases in the cluster"
            )
        # Renewal (see AcquireLeases): only leases held before this command that no entry after
        # the holder's `known_tm` touched - one it did not know of when it chose renew_from
        # may have recorded a read below it.
        renewed: list[tuple[int, int, str]] = []
        renew_from = cmd.renew_from or 0
        if cmd.renew_from is not None and cmd.known_tm is not None:
            for key in cmd.leases:
                lkey = (key.table_id, key.version, cmd.session_id)
                lease = self._leases.get(lkey)
                if lease is not None and lease.last_touched_tm() <= cmd.known_tm:
                    renewed.append(lkey)
        # --- write: nothing below can fail ---
        for key in new:
            self._index_lease((key.table_id, key.version, cmd.session_id))
            self._leases[(key.table_id, key.version, cmd.session_id)] = Lease(
                table=key.table,
                table_id=key.table_id,
                version=key.version,
                session_id=cmd.session_id,
                acquired_tm=tm,
                read_ts=cmd.read_ts if key.table_id in cmd.reads else None,
            )
        for lkey in renewed:
            # Forward only (max), and above the threshold (the lease keeps reads GC has not
            # passed; none at or below it can be served anyway). The acquired Tm restarts: this
            # command's own batch is covered by its margin as by a new lease's, the holder's
            # other reads by read_ts. The own read is taken into account just below.
            lease = self._leases[lkey]
            moved = max(lease.read_ts or 0, renew_from)
            moved = max(moved, threshold(lease.table_id) + 1)
            self._leases[lkey] = replace(lease, read_ts=moved, acquired_tm=tm)
        if cmd.known_tm is not None:
            for key in cmd.leases:
                lkey = (key.table_id, key.version, cmd.session_id)
                self._leases[lkey] = replace(self._leases[lkey], touched_tm=tm)
        if cmd.read_ts is not None:
            # A lease the session already held (another batch of it): it now keeps the
            # earliest read of the batches sharing it.
            for key in cmd.leases:
                lkey = (key.table_id, key.version, cmd.session_id)
                held_lease = self._leases[lkey]
                if key.table_id in cmd.reads and (
                    held_lease.read_ts is None or cmd.read_ts < held_lease.read_ts
                ):
                    self._leases[lkey] = replace(held_lease, read_ts=cmd.read_ts)
        session.heartbeat_tm = tm
        result: Result = {
            **self._ack(session),
            "leases": [
                {"table": str(k.table), "table_id": k.table_id, "version": k.version}
                for k in cmd.leases
            ],
        }
        if name_acquired:
            # Those the session did not hold before ([table_id, version]): the change feed's
            # `leases_acquired` (a renewal or a retried pin acquires nothing new).
            result["acquired"] = [[k.table_id, k.version] for k in new]
        return result

    def release(self, cmd: ReleaseLeases, *, name_released: bool = False) -> Result:
        """With `known_tm`, a lease touched by an entry after it (a pin that crossed the
        release on the wire) is kept: `kept` lists those, [table_id, version].
        `name_released` (apply version 3): `released_leases` names those released."""
        released: list[list[int]] = []
        kept: list[list[int]] = []
        for key in cmd.leases:
            lkey = (key.table_id, key.version, cmd.session_id)
            lease = self._leases.get(lkey)
            if lease is None:
                continue
            if cmd.known_tm is not None and lease.last_touched_tm() > cmd.known_tm:
                kept.append([key.table_id, key.version])
                continue
            self._drop_lease(lkey)
            released.append([key.table_id, key.version])
        result: Result = {"session_id": cmd.session_id, "released": len(released)}
        if name_released:
            result["released_leases"] = released  # the change feed's event lists these
        if cmd.known_tm is not None:
            result["kept"] = kept
        return result

    def check_attempt_owners(self, table: TableName, paths: Sequence[str], *, tm: int) -> None:
        """SessionNotFoundError if a path (relative to a table's location) lies in the attempt
        directory of a session not live at `tm`. The orphan scan judges liveness at the Tm of
        the last entry it saw applied and may delete such a directory's old files as soon as
        its session is not live; an expired session never comes back (see Time), so a commit
        applied later, with a later Tm, listing those files is refused here instead of
        acknowledging files that may be gone. The writer writes them again under a live
        session.

        A commit's files share a few directories (a Spark write job writes one), so each
        directory is judged once: the owners of a path depend on its directory only, and every
        path is judged at the one `tm`. The error names the first path refused, in order."""
        cleared: set[str] = set()  # directories whose owners are all live (membership only)
        for path in paths:
            directory = path.rpartition("/")[0]
            if directory in cleared:
                continue
            for owner in attempt_owners(path.split("/")[:-1]):
                session = self._sessions.get(owner)
                if session is not None and session.live_at(tm):
                    continue
                raise SessionNotFoundError(
                    f"{table}: file {path!r} is in the attempt directory of session {owner!r}, "
                    "which is not live (closed, expired or never opened), so GC may have "
                    "deleted it as an orphan; write the files again under a live session",
                    details={
                        "session_id": owner,
                        "table": str(table),
                        "path": path,
                        "reason": "attempt_session_not_live",
                    },
                )
            cleared.add(directory)

    def forget_table(self, table_id: int) -> None:
        """A dropped incarnation takes no more commits: its leases are moot as leases (cannot
        fail). Those that keep a batch's reads (read_ts) stay until released or their session
        ends: the batch may still be reading the incarnation's files, and GC must not delete
        them under it (metastore.gc)."""
        held = self._by_table.get(table_id, {})
        for key in [k for k in held if self._leases[k].read_ts is None]:
            self._drop_lease(key)

    def check_publish(self, inc: TableState, *, tm: int) -> None:
        """Raise SchemaChangeBlockedError if publishing `inc`'s next version at `tm` would leave
        unexpired leases on three versions."""
        blockers = self.blockers(inc, tm=tm)
        if blockers:
            current = inc.versions[-1].version
            held_by = "; ".join(
                f"session {b['session_id']} (app {b['app_id'] or '?'} on {b['host'] or '?'}, "
                f"user {b['user'] or '?'}, pid {b['pid']}) holds v{b['version']}"
                for b in blockers[:BLOCKERS_IN_MESSAGE_MAX]
            )
            more = len(blockers) - BLOCKERS_IN_MESSAGE_MAX
            raise SchemaChangeBlockedError(
                f"{inc.name}: publishing version {current + 1} waits for {len(blockers)} "
                f"lease(s) on version {current - 1} or older to be released or to expire: "
                f"{held_by}" + (f"; and {more} more" if more > 0 else ""),
                details={
                    "table": str(inc.name),
                    "table_id": inc.table_id,
                    "publishing_version": current + 1,
                    "blockers": blockers[: limits.MAX_LEASES_PER_COMMAND],
                },
            )

    # ----------------------------------------------------------------------------------------
    # Reads
    # ----------------------------------------------------------------------------------------

    def blockers(self, inc: TableState, *, tm: int) -> list[Result]:
        """Unexpired leases at `tm` on versions below `inc`'s current one, with their holders."""
        return self.leases_below(inc.table_id, inc.versions[-1].version, tm=tm)

    def leases_below(self, table_id: int, version: int, *, tm: int) -> list[Result]:
        """Unexpired leases at `tm` on versions of `table_id` below `version`, with holders."""
        out: list[Result] = []
        for key in self._by_table.get(table_id, ()):
            lease = self._leases[key]
            if lease.version >= version:
                continue
            session = self._sessions[lease.session_id]
            if session.live_at(tm):
                out.append(self.lease_view(lease, tm=tm))
        return out

    def lease_view(self, lease: Lease, *, tm: int) -> Result:
        session = self._sessions[lease.session_id]
        return {
            "table": str(lease.table),
            "table_id": lease.table_id,
            "version": lease.version,
            "session_id": lease.session_id,
            "app_id": session.info.app_id,
            "app_name": session.info.app_name,
            "host": session.info.host,
            "user": session.info.user,
            "pid": session.info.pid,
            "acquired_tm": lease.acquired_tm,
            "read_ts": lease.read_ts,
            "expires_at_tm": session.deadline_tm,
            "expired": not session.live_at(tm),
        }

    def leases(self, *, table_id: int | None = None) -> list[Lease]:
        if table_id is None:
            return list(self._leases.values())
        return [self._leases[key] for key in self._by_table.get(table_id, ())]

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def session(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def ended(self) -> list[EndedSession]:
        return list(self._ended)

    def gone_since(self, session_id: str, tm: int) -> int | None:
        """None while the session is live at `tm`; else the Tm it ended at (its deadline when
        expired but not swept yet). A session no longer remembered was pushed out of the
        ended list, which is in end order, so it ended at or before the oldest end kept: that
        Tm, never earlier, or a grace period counted from it could end too soon (0 when nothing
        is kept: the session never existed here)."""
        session = self._sessions.get(session_id)
        if session is not None:
            return None if session.live_at(tm) else session.deadline_tm
        for ended in reversed(self._ended):
            if ended.session_id == session_id:
                return ended.ended_tm
        return self._ended[0].ended_tm if self._ended else 0

    def expired_at(self, tm: int) -> list[str]:
        """Ids of sessions past their deadline at `tm`, oldest deadline first (the leader's
        sweep proposes ExpireSessions for them)."""
        late = [s for s in self._sessions.values() if not s.live_at(tm)]
        late.sort(key=lambda s: (s.deadline_tm, s.session_id))
        return [s.session_id for s in late]

    def is_empty(self) -> bool:
        return not self._sessions and not self._leases and not self._ended

    # ----------------------------------------------------------------------------------------
    # Helpers
    # ----------------------------------------------------------------------------------------

    def _live(self, session_id: str, tm: int) -> Session:
        session = self._sessions.get(session_id)
        if session is None or not session.live_at(tm):
            raise _not_found(session_id, session)
        return session

    def _index_lease(self, key: tuple[int, int, str]) -> None:
        self._by_session.setdefault(key[2], {})[key] = None
        self._by_table.setdefault(key[0], {})[key] = None

    def _drop_lease(self, key: tuple[int, int, str]) -> None:
        del self._leases[key]
        of_session = self._by_session[key[2]]
        del of_session[key]
        if not of_session:
            del self._by_session[key[2]]
        of_table = self._by_table[key[0]]
        del of_table[key]
        if not of_table:
            del self._by_table[key[0]]

    def _ack(self, session: Session) -> Result:
        return {"session_id": session.session_id, "deadline_tm": session.deadline_tm}

    def _end(self, session: Session, *, reason: str, by: str, tm: int) -> None:
        del self._sessions[session.session_id]
        for key in list(self._by_session.get(session.session_id, ())):
            self._drop_lease(key)
        self._ended.append(
            EndedSession(
                session_id=session.session_id,
                app_id=session.info.app_id,
                reason=reason,
                by=by,
                ended_tm=tm,
            )
        )
        while len(self._ended) > limits.MAX_ENDED_SESSIONS_KEPT:
            self._ended.popleft()

    # ----------------------------------------------------------------------------------------
    # Invariants
    # ----------------------------------------------------------------------------------------

    def check_invariants(self, *, catalog: Catalog, last_tm: int) -> None:
        if len(self._sessions) > limits.MAX_SESSIONS:
            raise CatalogInvariantError("more sessions than MAX_SESSIONS")
        for session_id, s in self._sessions.items():
            if s.session_id != session_id or not s.opened_tm <= s.heartbeat_tm <= last_tm:
                raise CatalogInvariantError(f"session {session_id!r}: bad id or heartbeat Tm")
        by_session = [(k, sid) for sid, keys in self._by_session.items() for k in keys]
        by_table = [(k, tid) for tid, keys in self._by_table.items() for k in keys]
        if (
            sorted(k for k, _ in by_session) != sorted(self._leases)
            or sorted(k for k, _ in by_table) != sorted(self._leases)
            or any(k[2] != sid for k, sid in by_session)
            or any(k[0] != tid for k, tid in by_table)
            or not all(self._by_session.values())
            or not all(self._by_table.values())
        ):
            raise CatalogInvariantError("the leases by session or table disagree with the leases")
        for table_id, keys in self._by_table.items():
            if list(keys) != [k for k in self._leases if k[0] == table_id]:
                raise CatalogInvariantError(f"the leases of table id {table_id} out of order")
        live_versions: dict[int, set[int]] = {}
        for (table_id, version, session_id), lease in self._leases.items():
            where = f"lease on table id {table_id} v{version} by {session_id!r}"
            session = self._sessions.get(session_id)
            if session is None:
                raise CatalogInvariantError(f"{where}: no such session")
            if (lease.table_id, lease.version, lease.session_id) != (table_id, version, session_id):
                raise CatalogInvariantError(f"{where}: key and value disagree")
            if not session.opened_tm <= lease.acquired_tm <= session.heartbeat_tm:
                raise CatalogInvariantError(f"{where}: acquired outside its session's life")
            if lease.touched_tm is not None and not (
                lease.acquired_tm <= lease.touched_tm <= session.heartbeat_tm
            ):
                raise CatalogInvariantError(f"{where}: touched outside its session's life")
            try:
                inc = catalog.live_table(lease.table)
            except TableNotFoundError:
                inc = None
            if inc is None or inc.table_id != table_id:
                # Only a lease keeping a batch's reads outlives its incarnation's drop.
                dropped = [
                    i
                    for i in catalog.incarnations(lease.table)
                    if i.table_id == table_id and i.dropped_tu is not None
                ]
                if lease.read_ts is None or not dropped:
                    raise CatalogInvariantError(f"{where}: no such live or dropped incarnation")
                if version > dropped[0].versions[-1].version:
                    raise CatalogInvariantError(f"{where}: no such version")
                continue
            if version > inc.versions[-1].version:
                raise CatalogInvariantError(f"{where}: no such incarnation or version")
            if session.live_at(last_tm):
                live_versions.setdefault(table_id, set()).add(version)
                if version < inc.versions[-1].version - 1:
                    raise CatalogInvariantError(
                        f"{where}: two-version invariant broken (latest is "
                        f"v{inc.versions[-1].version})"
                    )
        if len(self._ended) > limits.MAX_ENDED_SESSIONS_KEPT:
            raise CatalogInvariantError("more ended sessions kept than allowed")
        previous = 0
        for ended in self._ended:
            if ended.ended_tm < previous or ended.ended_tm > last_tm:
                raise CatalogInvariantError("ended sessions out of order")
            previous = ended.ended_tm

    # ----------------------------------------------------------------------------------------
    # Snapshot form
    # ----------------------------------------------------------------------------------------

    def to_data(self) -> dict[str, object]:
        return {
            "sessions": [
                [
                    s.session_id,
                    [
                        s.info.app_id,
                        s.info.app_name,
                        s.info.host,
                        s.info.user,
                        s.info.pid,
                        s.info.started_at_ms,
                    ],
                    s.ttl_ms,
                    s.opened_tm,
                    s.heartbeat_tm,
                    s.opened_by,
                ]
                for s in self._sessions.values()
            ],
            # Six items, a seventh (read_ts) only when set, an eighth (touched_tm, read_ts then
            # nil when unset) only when set: snapshots of states without lease reads or
            # renewing holders keep their exact bytes, and older snapshots load.
            "leases": [
                [
                    lease.table.namespace,
                    lease.table.name,
                    lease.table_id,
                    lease.version,
                    lease.session_id,
                    lease.acquired_tm,
                    *(
                        [lease.read_ts, lease.touched_tm]
                        if lease.touched_tm is not None
                        else []
                        if lease.read_ts is None
                        else [lease.read_ts]
                    ),
                ]
                for lease in self._leases.values()
            ],
            "ended": [[e.session_id, e.app_id, e.reason, e.by, e.ended_tm] for e in self._ended],
        }

    @staticmethod
    def from_data(data: object) -> Sessions:
        if not isinstance(data, dict) or set(data) != {"sessions", "leases", "ended"}:
            raise MalformedSnapshotError("sessions must be a map of sessions/leases/ended")
        out = Sessions()
        try:
            for row in expect_rows(data["sessions"], 6):
                info = expect_rows([row[1]], 6)[0]
                session = Session(
                    session_id=expect_str(row[0]),
                    info=SessionInfo(
                        app_id=expect_str(info[0]),
                        app_name=expect_str(info[1]),
                        host=expect_str(info[2]),
                        user=expect_str(info[3]),
                        pid=expect_int(info[4]),
                        started_at_ms=expect_int(info[5]),
                    ),
                    ttl_ms=expect_int(row[2]),
                    opened_tm=expect_int(row[3]),
                    heartbeat_tm=expect_int(row[4]),
                    opened_by=expect_str(row[5]),
                )
                if session.session_id in out._sessions:
                    raise MalformedSnapshotError(f"session {session.session_id!r} twice")
                out._sessions[session.session_id] = session
            rows = data["leases"]
            if not isinstance(rows, list):
                raise MalformedSnapshotError("leases must be a list")
            for row in rows:
                if not isinstance(row, list) or len(row) not in (6, 7, 8):
                    raise MalformedSnapshotError("a lease must be a 6- to 8-item row")
                lease = Lease(
                    table=TableName(namespace=expect_str(row[0]), name=expect_str(row[1])),
                    table_id=expect_int(row[2]),
                    version=expect_int(row[3]),
                    session_id=expect_str(row[4]),
                    acquired_tm=expect_int(row[5]),
                    read_ts=(
                        expect_int(row[6])
                        if len(row) == 7 or (len(row) == 8 and row[6] is not None)
                        else None
                    ),
                    touched_tm=expect_int(row[7]) if len(row) == 8 else None,
                )
                key = (lease.table_id, lease.version, lease.session_id)
                if key in out._leases:
                    raise MalformedSnapshotError("a lease twice")
                out._leases[key] = lease
                out._index_lease(key)
            for row in expect_rows(data["ended"], 5):
                out._ended.append(
                    EndedSession(
                        session_id=expect_str(row[0]),
                        app_id=expect_str(row[1]),
                        reason=expect_str(row[2]),
                        by=expect_str(row[3]),
                        ended_tm=expect_int(row[4]),
                    )
                )
        except MetastoreError as e:
            if isinstance(e, MalformedSnapshotError):
                raise
            raise MalformedSnapshotError(f"sessions: {e.message}") from None
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sessions) and self.to_data() == other.to_data()


def _check_leasable(key: LeaseKey, catalog: Catalog) -> None:
    """The lease must name the live incarnation of its table and one of its two latest
    versions (DESIGN §4: leases are granted only on the two latest versions)."""
    try:
        inc = catalog.live_table(key.table)
    except TableNotFoundError:
        inc = None
    latest = [] if inc is None else [v.version for v in inc.versions[-2:]]
    if inc is None or inc.table_id != key.table_id or key.version not in latest:
        raise LeaseVersionNotLatestError(
            f"cannot lease {key.table} (table id {key.table_id}) version {key.version}: "
            + (
                "that incarnation is not live"
                if inc is None or inc.table_id != key.table_id
                else f"the two latest versions are {latest}"
            )
            + "; re-plan at a fresh Top",
            details={
                "table": str(key.table),
                "table_id": key.table_id,
                "version": key.version,
                "latest_versions": latest,
            },
        )


def _before_threshold(key: LeaseKey, read_ts: int, threshold: int) -> BeforeGcThresholdError:
    return BeforeGcThresholdError(
        f"timestamp {read_ts} must be after GC threshold {threshold} (table {key.table}): a "
        "lease cannot keep reads GC has already passed; re-plan at a fresh timestamp",
        details={
            "table": str(key.table),
            "table_id": key.table_id,
            "ts": read_ts,
            "threshold": threshold,
        },
    )


def _not_found(session_id: str, session: Session | None) -> SessionNotFoundError:
    if session is None:
        return SessionNotFoundError(
            f"session {session_id!r} does not exist (never opened, closed or expired); open a new "
            "session",
            details={"session_id": session_id},
        )
    return SessionNotFoundError(
        f"session {session_id!r} expired (no heartbeat within its {session.ttl_ms} ms TTL); open "
        "a new session",
        details={"session_id": session_id, "expired_at_tm": session.deadline_tm},
    )
