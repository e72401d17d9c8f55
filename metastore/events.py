"""The change feed: what each applied entry did, as events in log order (the `watch` op).

Key idea: events are derived from (command, outcome) as each entry is applied, so every replica
derives the same events for the same entries, and an event's position is its entry's Tm, which
strictly increases along the log. A watcher resumes from the Tm of the last event it saw.

Which events (every one carries `kind`, `tm` and `index` of its entry, and, as the EventLog
serves it, `event`: its place among its entry's events, from 0; a consumer that handled it
resumes right after it with `from_ts` = its tm and `from_event` = event + 1, neither missing
nor repeating one, filtered or not, on any node):
* `namespace_created` / `namespace_dropped`: namespace, tu (when it takes effect);
* `schema_published`: table, table_id, version, tu, change (version 1 is the CREATE);
* `table_dropped`: table, table_id, tu (also one per table of DROP NAMESPACE CASCADE);
* `commit`: ts, txn_id, tables, files_added, files_removed, rows_added;
* `schema_job`: job_id, what (started, advanced, backfilled, cancelled, aborted, or
  cancel_requested for a cancel held up by leases: the job rolls back later, as `cancelled`;
  `job show` has the rest; a DROP that takes a running job's table gives it `aborted`, after
  the `table_dropped`);
* `session_opened` / `session_ended` (closed, expired; by and reason), `leases_acquired` /
  `leases_released`: session_id and the (table, version) pairs acquired (new to the session)
  or released (from apply version 3; below it, every pair the command named, a renewal's
  included); heartbeats are not events;
* `protected` / `protection_released`: record_id, ts, reason.
* `manifest_compacted`: table, table_id, moved_entries, folded_deletes, manifests (what the
  table holds after it; a compaction changes no answer, so readers may ignore it).
Refused entries, request-id retries, deduplicated commits and commands that found nothing to
do (a retried open or a close of a session already ended, a release of leases not held, a
Protect of a record that exists) are not events: nothing changed.

Events are not replicated state, but every node must derive the same ones from one log (a
watcher resumes on any node, at a position that counts events). So rules of the feed follow
the apply version the entry is applied at, as apply's rules do: the ones above that leave
out what found nothing to do, and the `aborted` jobs of a DROP, hold from apply version 3
(FEED_RULES_VERSION, the release that brought them); below it every open, close, Protect
and release is an event, as releases of version 2 derived them, so old and new nodes agree
during a rolling upgrade.

`EventLog` keeps the newest events in memory (EVENTS_KEPT, and EVENTS_KEPT_BYTES of them as
msgpack: wide commits fill bytes first). It is complete after `floor_tm`:
every event of an entry with Tm > floor_tm is in it. The floor rises when old events are
dropped, and jumps to the snapshot's Tm when the node loads a snapshot (the entries before it
are gone), so a watcher whose position is below the floor gets WatchStartCompactedError and
must re-read the state. Events of one entry are kept, dropped and returned together, except
that a page splits an entry whose events alone are over its byte budget (a DROP NAMESPACE
CASCADE of thousands of tables; else no watcher could get past it): the position is then the
entry's Tm and how many of its events were examined (`since(skip=)`, `watch` `from_event`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Final, cast

import msgpack

from hlc import ts_text
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import (
    AcquireLeases,
    AdvanceSchemaJob,
    AlterTable,
    CancelSchemaJob,
    CloseSession,
    Command,
    CommitTxn,
    CompactManifest,
    CreateNamespace,
    DropNamespace,
    ExpireSessions,
    OpenSession,
    Protect,
    ReleaseLeases,
    ReleaseProtection,
    SchemaJobBackfilled,
)
from metastore.errors import WatchStartCompactedError
from metastore.outcome import Outcome, SchemaVersionPublished, TableDropped

Event = dict[str, object]

EVENTS_KEPT: Final = 100_000
# And at most this many bytes of them (as msgpack: what a page sends). 100,000 commits of 100
# tables with long names are ~3 GB of Python objects; small events (~150 bytes) never reach it.
EVENTS_KEPT_BYTES: Final = 64 * 1024 * 1024


# The apply version from which an entry's events leave out what found nothing to do (a retried
# open, a close of an ended session, a retried Protect, a release of nothing held) and include
# the jobs a DROP aborted. Releases of apply version 2 derived them without those rules, and
# every node must derive the same events for one log, also during a rolling upgrade: the rules
# came with the release that brought version 3, so they apply from it (see the module doc).
FEED_RULES_VERSION: Final = 3


def events_of(
    command: Command,
    outcome: Outcome,
    *,
    tm: int,
    index: int,
    aborted_jobs: Sequence[int] = (),
    apply_version: int = APPLY_VERSION_SUPPORTED,
) -> list[Event]:
    """The events of one applied command (none if it was refused or a retry). `aborted_jobs`:
    the schema jobs a DROP ended as a side effect (their table went), by job id.
    `apply_version`: the cluster's apply version when the entry was applied (the rules of
    FEED_RULES_VERSION hold from it on)."""
    if not outcome.ok or outcome.deduplicated:
        return []
    if apply_version < FEED_RULES_VERSION:
        return _events_before_feed_rules(command, outcome, tm=tm, index=index)
    head: Event = {"tm": tm, "index": index}
    result = outcome.result
    out: list[Event] = []
    match command:
        case CreateNamespace() if result.get("created"):
            out.append({**head, "kind": "namespace_created", "namespace": command.namespace})
            out[-1]["tu"] = result.get("tu")
        case DropNamespace() if result.get("dropped"):
            out.append({**head, "kind": "namespace_dropped", "namespace": command.namespace})
            out[-1]["tu"] = result.get("tu")
        case CommitTxn():
            out.append(
                {
                    **head,
                    "kind": "commit",
                    "ts": result.get("ts"),
                    "txn_id": result.get("txn_id"),
                    "tables": result.get("tables"),
                    "files_added": result.get("files_added"),
                    "files_removed": result.get("files_removed"),
                    "rows_added": result.get("rows_added"),
                }
            )
        case OpenSession() if result.get("created"):  # not a retried open (a heartbeat)
            out.append(
                {
                    **head,
                    "kind": "session_opened",
                    "session_id": command.session_id,
                    "app_id": command.info.app_id,
                    "host": command.info.host,
                    "user": command.info.user,
                }
            )
        case CloseSession() if result.get("closed"):
            out.append(
                {**head, "kind": "session_ended", "session_id": command.session_id}
                | {"reason": "closed", "by": ""}
            )
        case ExpireSessions():
            expired = result.get("expired")
            out.extend(
                {**head, "kind": "session_ended", "session_id": session_id}
                | {"reason": command.reason, "by": command.by}
                for session_id in (expired if isinstance(expired, list) else [])
            )
        case AcquireLeases() if result.get("acquired", True):
            # From apply version 3 only leases new to the session (`acquired`): a renewal or a
            # retried pin moves reads, it acquires nothing (every micro-batch's pin was an
            # event). Below it the result does not say, and every named lease is listed.
            acquired = result.get("acquired")
            new = {(k[0], k[1]) for k in cast(list[list[int]], acquired or [])}
            out.append(
                {
                    **head,
                    "kind": "leases_acquired",
                    "session_id": command.session_id,
                    "leases": [
                        [str(k.table), k.version]
                        for k in command.leases
                        if acquired is None or (k.table_id, k.version) in new
                    ],
                }
            )
        case ReleaseLeases() if result.get("released"):
            # Only those released (`released_leases`, apply version 3; below it, those not
            # `kept`): not those a crossing pin touched, nor those the session did not hold.
            named = result.get("released_leases")
            kept = result.get("kept")
            freed = {(k[0], k[1]) for k in cast(list[list[int]], named or [])}
            held = {(k[0], k[1]) for k in kept} if isinstance(kept, list) else set()
            out.append(
                {
                    **head,
                    "kind": "leases_released",
                    "session_id": command.session_id,
                    "leases": [
                        [str(k.table), k.version]
                        for k in command.leases
                        if (
                            (k.table_id, k.version) in freed
                            if named is not None
                            else (k.table_id, k.version) not in held
                        )
                    ],
                }
            )
        case Protect() if result.get("created_tm") == tm:  # not a retry of an existing record
            out.append(
                {**head, "kind": "protected", "record_id": command.record_id, "ts": command.ts}
            )
        case CompactManifest() if not result.get("deduplicated"):
            out.append(
                {
                    **head,
                    "kind": "manifest_compacted",
                    "table": str(command.table),
                    "table_id": command.table_id,
                    "moved_entries": command.loose_count,
                    "folded_deletes": command.deletes_count,
                    "manifests": result.get("manifests"),
                }
            )
        case ReleaseProtection() if result.get("released"):
            out.append(
                {**head, "kind": "protection_released", "record_id": command.record_id}
                | {"reason": command.reason}
            )
    for effect in outcome.effects:
        match effect:
            case SchemaVersionPublished():
                out.append(
                    {
                        **head,
                        "kind": "schema_published",
                        "table": str(effect.table),
                        "table_id": effect.table_id,
                        "version": effect.version,
                        "tu": effect.tu,
                    }
                )
            case TableDropped():
                out.append(
                    {
                        **head,
                        "kind": "table_dropped",
                        "table": str(effect.table),
                        "table_id": effect.table_id,
                        "tu": effect.tu,
                    }
                )
    job_id = result.get("job_id")
    job_commands = AlterTable | AdvanceSchemaJob | CancelSchemaJob | SchemaJobBackfilled
    if isinstance(command, job_commands) and isinstance(job_id, int):
        # What moved the job: its start (an ALTER), a step, a cancel or a backfill report.
        what = {
            AlterTable: "started",
            AdvanceSchemaJob: "advanced",
            CancelSchemaJob: "cancelled",
            SchemaJobBackfilled: "backfilled",
        }[type(command)]
        if result.get("cancel_requested"):
            what = "cancel_requested"  # held up by leases: the job still runs, rolls back later
        elif result.get("status") in ("cancelled", "aborted"):
            what = str(result["status"])  # the rollback (or the end) a step or cancel made
        out.append({**head, "kind": "schema_job", "job_id": job_id, "what": what})
    out.extend(
        {**head, "kind": "schema_job", "job_id": aborted, "what": "aborted"}
        for aborted in aborted_jobs
    )
    return out


def _events_before_feed_rules(
    command: Command, outcome: Outcome, *, tm: int, index: int
) -> list[Event]:
    """Below FEED_RULES_VERSION: the events releases of apply version 2 derived. An open, a
    close, a Protect and a release are events whatever they changed (a release lists every
    lease it named), and a DROP gives no event for the jobs it aborted; every other command's
    events are derived alike at every version."""
    head: Event = {"tm": tm, "index": index}
    match command:
        case OpenSession():
            info = command.info
            return [
                {**head, "kind": "session_opened", "session_id": command.session_id}
                | {"app_id": info.app_id, "host": info.host, "user": info.user}
            ]
        case CloseSession():
            return [
                {**head, "kind": "session_ended", "session_id": command.session_id}
                | {"reason": "closed", "by": ""}
            ]
        case Protect():
            return [{**head, "kind": "protected", "record_id": command.record_id, "ts": command.ts}]
        case ReleaseLeases():
            leases = [[str(k.table), k.version] for k in command.leases]
            return [
                {**head, "kind": "leases_released", "session_id": command.session_id}
                | {"leases": leases}
            ]
    return events_of(command, outcome, tm=tm, index=index)


def matches(event: Event, *, namespace: str | None, table: str | None) -> bool:
    """Does `event` concern `table` (ns.t) or `namespace`? Events about no table (sessions,
    protections, schema jobs without a table field) match only an unfiltered watch."""
    if namespace is None and table is None:
        return True
    tables: list[str] = []
    one, many, leases = event.get("table"), event.get("tables"), event.get("leases")
    if isinstance(one, str):
        tables = [one]
    elif isinstance(many, list):
        tables = [str(t) for t in many]
    elif isinstance(leases, list):
        tables = [str(pair[0]) for pair in leases]
    if table is not None:
        return table in tables
    if isinstance(event.get("namespace"), str):
        return event["namespace"] == namespace
    return any(t.split(".", 1)[0] == namespace for t in tables)


class EventLog:
    """The newest events in log order, complete after `floor_tm` (see the module docstring)."""

    __slots__ = (
        "_bytes",
        "_events",
        "_sizes",
        "_start",
        "_tms",
        "bytes_max",
        "floor_tm",
        "kept_max",
    )

    def __init__(
        self,
        *,
        kept_max: int = EVENTS_KEPT,
        bytes_max: int = EVENTS_KEPT_BYTES,
        floor_tm: int = 0,
    ) -> None:
        self.kept_max = kept_max
        self.bytes_max = bytes_max
        self.floor_tm = floor_tm
        # A list with a moving start (cheap appends and bisects; compacted now and then).
        self._events: list[Event] = []
        self._tms: list[int] = []
        # Each event's msgpack size (what a page sends; measured once, here), and their sum
        # from `_start` on.
        self._sizes: list[int] = []
        self._bytes = 0
        self._start = 0

    def __len__(self) -> int:
        return len(self._events) - self._start

    def append(self, events: list[Event], *, tm: int) -> None:
        """Add the events of the entry applied at `tm` (all of them, or none), each numbered
        by its place among them (`event`: where a resume right after it continues)."""
        for number, derived in enumerate(events):
            event = {**derived, "event": number}
            size = len(msgpack.packb(event, use_bin_type=True))
            self._events.append(event)
            self._tms.append(tm)
            self._sizes.append(size)
            self._bytes += size
        # Never the entry just added: one over the window alone (a DROP NAMESPACE CASCADE of
        # MAX_TABLES tables) stays until the next entry, else no watcher could ever see it.
        while (len(self) > self.kept_max or self._bytes > self.bytes_max) and self._tms[
            self._start
        ] != tm:
            dropped_tm = self._tms[self._start]
            while self._start < len(self._tms) and self._tms[self._start] == dropped_tm:
                self._bytes -= self._sizes[self._start]
                self._start += 1
            self.floor_tm = max(self.floor_tm, dropped_tm)
        if self._start > 4096 and self._start * 2 > len(self._events):
            del self._events[: self._start], self._tms[: self._start], self._sizes[: self._start]
            self._start = 0

    def reset(self, *, floor_tm: int) -> None:
        """The state was replaced by a snapshot at `floor_tm`: what came before is gone."""
        self._events, self._tms, self._sizes, self._start, self._bytes = [], [], [], 0, 0
        self.floor_tm = floor_tm

    def since(
        self,
        after_tm: int,
        *,
        limit: int,
        keep: Callable[[Event], bool] = lambda _e: True,
        bytes_max: int | None = None,
        skip: int = 0,
    ) -> tuple[list[Event], int | None, int]:
        """Events with tm > after_tm that `keep` accepts - and, with `skip`, first the events
        of the entry at `after_tm` from its `skip`-th on (a page that ended inside it) - at
        most `limit` and about `bytes_max` bytes of msgpack (at least one event; never half an
        entry, unless the page's first entry alone is over `bytes_max`: then it is split).
        Also returns where the page stopped: the tm of the last entry examined and how many of
        its events were examined (0: all of them), or None (examined them all). Positions
        inside an entry count every event of it, kept or not, so they do not depend on `keep`
        and are the same on every node. Raises WatchStartCompactedError when events after the
        position may be gone."""
        if after_tm < self.floor_tm or (skip > 0 and after_tm <= self.floor_tm):
            raise WatchStartCompactedError(
                f"the change feed on this node starts after {ts_text(self.floor_tm)}; events "
                f"after {ts_text(after_tm)} are no longer kept (read the current state, then "
                "watch from its timestamp)",
                details={"from_ts": after_tm, "oldest_ts": self.floor_tm},
            )
        i = max(self._start, bisect_right(self._tms, after_tm, lo=self._start))
        entry_start = i
        if skip > 0:
            # Resume inside the entry at after_tm (only its events: never another entry's).
            entry_start = max(self._start, bisect_left(self._tms, after_tm, lo=self._start))
            i = min(entry_start + skip, i)
        out: list[Event] = []
        size = 0
        while i < len(self._events):
            tm = self._tms[i]
            if tm != self._tms[entry_start]:
                entry_start = i
            if len(out) >= limit:
                return out, self._tms[i - 1], 0
            j = i
            group: list[Event] = []
            group_bytes = 0
            while j < len(self._events) and self._tms[j] == tm:
                if keep(self._events[j]):
                    group.append(self._events[j])
                    group_bytes += self._sizes[j]
                j += 1
            if group and bytes_max is not None:
                if out and size + group_bytes > bytes_max:
                    return out, self._tms[i - 1], 0
                if not out and group_bytes > bytes_max:
                    return self._split(i, j, keep, bytes_max, entry_start)
                size += group_bytes
            out.extend(group)
            i = j
        return out, None, 0

    def _split(
        self, i: int, end: int, keep: Callable[[Event], bool], bytes_max: int, entry_start: int
    ) -> tuple[list[Event], int, int]:
        """The first events of [i, end) (one entry, over `bytes_max` alone) that fit
        `bytes_max` (at least one), and the position inside the entry after them."""
        out: list[Event] = []
        size = 0
        while i < end:
            event = self._events[i]
            if keep(event):
                size += self._sizes[i]
                if out and size > bytes_max:
                    break
                out.append(event)
            i += 1
        if i == end:  # one event alone over bytes_max: the entry is done
            return out, self._tms[end - 1], 0
        return out, self._tms[i], i - entry_start
