"""The leader's GC: move thresholds, delete the files they free, release stale protections,
and compact tables whose removed files only a compaction frees (point 8).

Only the leader runs it, and it decides nothing on its own: every decision is a log entry that
the state machine checks again when it applies it (metastore/gc.py):

1. `AdvanceGcThreshold(up_to=now)` for a table: apply clamps the threshold to Tm - TTL, below
   every protection covering the table and below its live leases' reads, and moves up to
   GC_PURGE_FILES_MAX dead file entries into the table's GC queue.
2. Only files in that queue are deleted - so only after the entry that queued them is applied,
   and so only files no read above an applied threshold can see. Deleting a missing file counts
   as done, so a run that crashed midway (or a new leader) just deletes the queue again. And
   only `read_fence_ms` (read_staleness_max_ms + CSmax) after that entry's Tm: every node
   refuses file listings while its safe time trails its clock by more than
   read_staleness_max_ms (server `_check_fresh_for_files`), so by then any node that lists
   files has applied the entry and refuses reads below the threshold.
3. `GcFilesDeleted(paths)` then drops them from the queue (and from snapshots). A path that is
   referenced again - by a file entry or a live manifest of any registered incarnation at an
   overlapping location, the table's own included - is dropped from the queue but left on disk:
   it is live data again. (A table dropped and re-created under its name shares its location
   and may commit the old files before GC queues them; a file removed, folded into a manifest
   and committed again is both in a dead manifest and live.) A table without a location ("")
   has no directory of ours: its queued paths are reported without touching the disk (they
   are relative to nothing; they were deleted relative to the leader's working directory,
   where a writer could name any file). The check runs before each
   chunk's deletion, which runs in a thread while entries keep applying: apply refuses a
   commit adding a path that any incarnation at an overlapping location has queued (or a dead
   manifest file), until this entry reports it (metastore.txn `_plan`, `queued_for_gc`), so
   no commit can reference a queued file between the check and the deletion. The files a
   dead manifest lists are not in the state, so from apply version 3 they go through the
   queue too: a chunk at a time (DELETE_CHUNK_FILES), `QueueManifestFiles` moves them into
   the table's queue (apply skips those a file entry references again), and they are then
   deleted and reported like any queued file; the manifest file goes last. A new leader
   reads the manifest again and queues its files again (those already deleted are missing:
   done). Below version 3 the leader deletes them straight from the list after the check, and
   a commit adding one of them again in between can lose its file. A replaced manifest's file
   (queued once the threshold passes the compaction that replaced it) is left on disk, though
   reported, when it was written after the threshold: manifest names are content hashes, so a
   compactor wrote the same bytes again and its compaction, refused only while the file is
   queued, may apply right after the report. Deleting it made every read of the table fail
   (MANIFEST_UNREADABLE) until that compactor wrote it again (`_restore_missing` in
   metastore.client.manifest_files, still the fallback for a write between the check and the
   deletion, or for a compaction applied more than the table's TTL after its write). If
   nothing references it, the orphan scan deletes it after its grace (local locations; under
   a URI location it stays).
4. Orphans: files our writers made under a table's location - in an attempt directory
   (`<location>/_txn/<attempt>/...`) or a manifest file (`<location>/_manifests/<sha256>
   .parquet`, or the temporary file of one that a compactor killed mid-write left) of a
   registered location, never anything else (a CREATE TABLE ... LOCATION may
   name a directory that holds the user's own files) - that no incarnation references or has
   queued, older than `gc_orphan_grace_ms` (by mtime) and not in the attempt directory of a
   session live at the last applied entry (`_txn/<session id>--...`, see
   spark_bridge/files.py). They never
   were in the state, so they are deleted directly. A commit applied later lists files of a
   session's attempt directory only while that session lives (metastore.leases
   `check_attempt_owners`), and a session not live never lives again, so no file the scan
   judged an orphan there gets committed. Local warehouses only: a URI location is skipped
   and reported. Locations are matched by the directories they really are (symbolic links
   resolved at each run, `_real_roots`): the catalog compares LOCATION texts, so a table at
   `/w/alias` -> `/w/t` lives beside the one at `/w/t`, and the files under that one
   directory are referenced by either table's entries.

5. A deposed leader stops deleting. Each chunk's check (point 3, or the orphan scan) reads this
   node's state in the term it leads in (`RaftNode.leader_term`); the thread deleting the chunk
   asks before every file whether the node still leads in that term, and stops at the first
   file after it does not (the rest stay queued, unreported: NotLeaderError ends the run). A
   manifest file's "written again" rule (point 3; for orphans, the grace) is judged by a stat
   right before its unlink, not once per chunk. Before, a deposed leader's thread deleted its
   whole chunk (up to DELETE_CHUNK_FILES, minutes on an object store) after a new leader may
   have deleted and reported the same files, after which a commit may add such a path again
   or a compactor write such a manifest again. `leader_term` is this node's own view, though:
   a leader cut off from its quorum (or whose loop or process stalled) keeps it until
   check-quorum steps it down, up to two election timeouts later (longer after a stall),
   while a new leader may be elected, pass its read fence and report the chunk. So the thread
   also stops once this node's leader lease has lapsed (`RaftNode.
   leader_lease_until_monotonic`): the send time of the newest heartbeat of this term that a
   quorum (this node included) answered, plus the time a follower that received it refuses
   to vote for anyone else (its election timeout less ticks the ticker may replay), less 10 %
   for clock rates. No other leader can be elected before then, and a healthy leader renews
   it with every heartbeat round (heartbeat_interval_ms; the default lease is 171 ms against
   50 ms heartbeats). A lone voter's lease never ends. What remains: a leader whose monotonic
   clock runs more than 10 % slow relative to a follower's (or a follower's that jumps
   ahead), and the gap between the thread's last check and its unlink (a pause there). Then
   a data file is lost only if a writer puts a file at a path GC just deleted and commits it
   (our writers' paths are unique per attempt; a protocol client's may not be), and a
   manifest only if the compactor's write lands between the thread's stat and its unlink -
   the window a sitting leader has too, whose fallback is `_restore_missing`.

6. Never the node's own files. A table's LOCATION may name any directory inside the
   allowed roots (point 7; anywhere with `["*"]`; the writer role suffices) and deletions
   run with the daemon's rights, so a path inside this node's data or secrets directory, or
   one of its config, log, pid or TLS files (`ProtectedPaths`, symbolic links in its
   directories resolved), is left on disk and logged; its entry is reported like a deleted
   one's, so the queue drains.

7. Never outside the roots the operator allows table locations in (cluster.toml
   `allowed_locations` and the warehouse: metastore/daemon/allowed_locations.py). The leader
   refuses a CREATE TABLE outside them, but a table created before (or before its root was
   removed from the list) may still be: GC leaves such a table alone, its threshold, queue
   and files (reported as `skipped`, logged; time travel on it is not bounded by its TTL
   meanwhile), and resumes once its directory is allowed again; its orphans are not scanned.
   And a file whose real path (its directories' symbolic links resolved) is outside the
   roots - a link made inside an allowed table directory after its CREATE TABLE - is left on
   disk and logged, its entry reported like a deleted one's (as in point 6).

8. Files removed inside manifests. GC drops a manifest only when every entry is dead
   (`metastore.manifests.dead_at`); a file removed while its entry sits in a manifest beside
   live ones is a pending delete entry (or, once folded, a removed entry inside it), which only
   a compaction past the threshold splits off into a dead manifest. Writers compact only past
   `loose_files_max`, so on a quiet table such files stayed on disk indefinitely. After moving a
   table's threshold, the run checks `TxnLog.awaiting_compaction` at it and, when files wait,
   runs the client's compaction itself (`metastore.client.manifest_files.plan_and_write`, in a
   thread): fold the delete entries removed at or below the threshold, split the entries dead
   at it off the manifests it rewrites, move no loose entry, merge nothing. The manifests are
   written like any compactor's (content-addressed, fsynced), then one CompactManifest is
   proposed: the same compare-and-swap a client's is, checked again by apply (the GC worker
   is not apply and apply writes no manifest). A conflict (a writer or compactor changed the
   table since it was read) changes nothing: the run moves on, and a run
   COMPACTION_RETRY_AFTER_S later reads the table again (as after any failure: each attempt
   writes files); the files written stay unreferenced (orphans after their grace, or reused).
   A node that does not lead writes nothing (checked before writing); one deposed while it
   writes leaves unreferenced files, and its proposal fails.
   The compaction changes no answer at any ts, so protections and leases are untouched; it
   splits off only what is dead at the threshold apply already clamped below them. Then the
   run advances again, so the split-off entries are queued and deleted in the same run (after
   the read fence, as any). Bounded per run: COMPACTION_TABLES_PER_RUN tables and
   COMPACTION_REWRITES_PER_RUN manifests rewritten; the rest waits for the next run and shows
   in `gc status` as awaiting compaction. Never for a location inside this node's own
   directories (point 6), nor for a table without a location.

A run that stops midway (point 5's deposed or lease-lapsed leader, a dropped proposal) ends
with its error, whose `details.partial` holds the totals of what it deleted before it stopped
(and whose message says so); the client's `gc_run` repeats the run elsewhere and adds the
parts up. A run counts the files it unlinked, not those found already gone, so a chunk an
interrupted run (or a crashed leader) half deleted is counted once across the two runs.

A file the store will not delete (permission denied, a read-only or failing disk) is left on
disk and stays queued (its entry is not reported as deleted), with one warning per chunk naming
it and the errno; it is tried once per run, and the rest of the run goes on (a dead manifest
whose listed files could not all go stays queued too). A file already gone counts as done.

Deletions are rate-limited (`gc_delete_files_per_s`) and run in a worker thread. Records past
their max age, or whose owner session has been gone for PROTECTION_OWNER_GRACE_MS, are released
by `release_due` (called from the node's sweep loop), with the reason in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hlc import HybridClock, physical_ms
from hlc.limits import LOGICAL_BITS
from metastore import limits
from metastore.catalog import TableState
from metastore.commands import (
    AdvanceGcThreshold,
    Command,
    GcFilesDeleted,
    QueueManifestFiles,
    ReleaseProtection,
    TableName,
    encode_command,
    location_contains,
)
from metastore.daemon.allowed_locations import ANYWHERE, AllowedLocations, RealPaths
from metastore.daemon.metrics import NodeMetrics
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.errors import (
    ManifestConflictError,
    ManifestUnreadableError,
    MetastoreError,
    NotLeaderError,
    UnavailableError,
)
from metastore.gc import ThresholdBound, incarnation, ttl_ms_of
from metastore.leases import TXN_DIR, attempt_owners
from metastore.manifests import MANIFEST_DIR, DeleteEntry, ManifestRef, deletes_dead_at
from metastore.outcome import Outcome
from metastore.state import MetastoreState
from metastore.txn import file_key, saturated
from raft.core.errors import NotLeaderError as RaftNotLeaderError
from raft.core.errors import RaftCoreError
from raft.errors import RaftError
from raft.node import RaftNode
from raft.oserror import errno_text

if TYPE_CHECKING:
    from metastore.client.manifest_files import WrittenCompaction

log = logging.getLogger("metastore.gc")

# Queued paths deleted (and then reported) per GcFilesDeleted entry, at most.
DELETE_CHUNK_FILES = 1_000
# Bytes of paths one chunk names (with _PATH_OVERHEAD_BYTES each for their msgpack framing
# and size): half of MAX_COMMAND_BYTES, leaving room for the rest of the command.
CHUNK_PATH_BYTES = limits.MAX_COMMAND_BYTES // 2
_PATH_OVERHEAD_BYTES = 16
# `TableReport.skipped` of a table whose location is outside allowed_locations (point 7).
SKIPPED_NOT_ALLOWED = "location outside allowed_locations"
# AdvanceGcThreshold steps per table per run: GC_PURGE_FILES_MAX files each, so a run frees up to
# this many times 10k files of one table; the next run continues.
MAX_STEPS_PER_TABLE = 100
PROPOSE_TIMEOUT_MS = 10_000
# Files one orphan scan looks at per location, so a huge directory cannot stall a run.
ORPHAN_SCAN_FILES_MAX = 1_000_000
# What one `gc_run` reply lists (`run_reply`): its totals count every table, but its per-table
# list and its skipped locations stop here, so the reply fits a client frame however many
# tables the cluster holds (a report is at most ~600 bytes with the longest names, a location
# ~1 KiB: under 2 MiB together, against CLIENT_FRAME_BYTES_MAX's 4 MiB). Before, a run over
# ~10,000 tables answered LIMIT_EXCEEDED after it had deleted their files.
GC_RUN_REPLY_TABLES_MAX = 1_000
GC_RUN_REPLY_LOCATIONS_MAX = 1_000

# Compactions the leader's GC runs itself (point 8), per run: at most this many tables, whose
# compactions rewrite at most this many manifests in all (each at most MANIFEST_REWRITES_MAX).
# The rest waits for the next run (and shows as awaiting compaction in `gc status`).
COMPACTION_TABLES_PER_RUN = 8
COMPACTION_REWRITES_PER_RUN = 64
# After a compaction of a table failed (a conflict, a refusal, a store error), the runs of the
# next this many seconds leave the table alone: runs come every gc_interval_ms (10 minutes by
# default, but as often as every 100 ms where configured so) and on `gc run`, and each attempt
# reads manifests and writes new ones.
COMPACTION_RETRY_AFTER_S = 60.0
# Imported by the first run, in a thread (`_import_manifest_files`): pyarrow is slow to load.
_MANIFEST_FILES = "metastore.client.manifest_files"
# GC's compactions fold and split, never merge (writers' compactions merge): no merge is due
# below this many manifests, far above MAX_MANIFESTS_PER_TABLE.
_NO_MERGES = 1 << 62
# A manifest file's name (metastore.manifests `manifest_path`).
_MANIFEST_NAME = re.compile(r"[0-9a-f]{64}\.parquet")
# The temporary name a manifest is written under before its rename
# (metastore.client.manifest_files `write_manifest`): left behind only by a compactor that died
# mid-write, so an old one is an orphan like any unreferenced manifest.
_MANIFEST_TMP_NAME = re.compile(r"[0-9a-f]{64}\.parquet\.[0-9a-f]{12}\.tmp")


@dataclass(slots=True)
class TableReport:
    table: str
    table_id: int
    threshold_before: int
    threshold: int
    held_by: dict[str, object]
    files_deleted: int = 0
    bytes_deleted: int = 0
    orphans_deleted: int = 0
    orphan_bytes_deleted: int = 0
    skipped: str = ""
    # Manifests this run's compaction rewrote (point 8), and files still waiting for one
    # (a dry run: what the run would compact).
    compacted_manifests: int = 0
    awaiting_compaction_files: int = 0

    def view(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "table_id": self.table_id,
            "threshold_before": self.threshold_before,
            "threshold": self.threshold,
            "held_by": self.held_by,
            "files_deleted": self.files_deleted,
            "bytes_deleted": self.bytes_deleted,
            "orphans_deleted": self.orphans_deleted,
            "orphan_bytes_deleted": self.orphan_bytes_deleted,
            "skipped": self.skipped,
            "compacted_manifests": self.compacted_manifests,
            "awaiting_compaction_files": self.awaiting_compaction_files,
        }


@dataclass(slots=True)
class _CompactionBudget:
    """What one run may still compact (COMPACTION_TABLES_PER_RUN, _REWRITES_PER_RUN)."""

    tables: int = COMPACTION_TABLES_PER_RUN
    rewrites: int = COMPACTION_REWRITES_PER_RUN


@dataclass(slots=True)
class _RateLimiter:
    per_s: int
    _next: float = field(default=0.0)

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self._next = max(self._next, now) + n / self.per_s
        delay = self._next - now - 1.0  # allow a one-second burst
        if delay > 0:
            await asyncio.sleep(delay)


class GcWorker:
    def __init__(
        self,
        *,
        raft: RaftNode,
        sm: CatalogStateMachine,
        clock: HybridClock,
        metrics: NodeMetrics,
        node_id: int,
        interval_ms: int,
        orphan_grace_ms: int,
        delete_files_per_s: int,
        read_fence_ms: int = 0,
        protected: ProtectedPaths | None = None,
        allowed: AllowedLocations | None = None,
    ) -> None:
        """`protected`: this node's own directories and files, never deleted (ProtectedPaths).
        `allowed`: the roots table locations may lie in (cluster.toml `allowed_locations`);
        nothing outside them is deleted (point 7). None: anywhere (unit tests)."""
        self.raft = raft
        self.protected = protected if protected is not None else ProtectedPaths()
        self.allowed = allowed if allowed is not None else ANYWHERE
        self.read_fence_ms = read_fence_ms
        # table id -> a safe time at or after the Tm of the last entry that queued its files,
        # noted in this run; files queued before the run wait from the current safe time.
        self._queued_by_tm: dict[int, int] = {}
        self.sm = sm
        self.clock = clock
        self.metrics = metrics
        self.by = f"leader:{node_id}"
        self.interval_ms = interval_ms
        self.orphan_grace_ms = orphan_grace_ms
        self._rate = _RateLimiter(delete_files_per_s)
        # (location, sha256) -> path keys a manifest lists, for one run (manifests never change).
        self._listed: dict[tuple[str, str], frozenset[str]] = {}
        self._lock = asyncio.Lock()  # one run at a time (schedule and `gc run` share it)
        # table id -> time.monotonic() of its last failed compaction (COMPACTION_RETRY_AFTER_S)
        self._compaction_failed_at: dict[int, float] = {}
        # table id -> queued paths the store refused to delete in this run (tried once a run)
        self._undeletable: dict[int, set[str]] = {}
        self.last_run: dict[str, Any] = {}

    # ------------------------------------------------------------------ schedule

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            if not self._serving():
                continue
            try:
                await self.run(None, dry_run=False)
            except (MetastoreError, RaftError, OSError) as exc:
                log.warning("GC run failed; the next run resumes it: %s", exc)

    def _serving(self) -> bool:
        return (
            self.raft.is_leader() and self.raft.ready_to_serve and self.sm.state.cluster is not None
        )

    async def release_due(self) -> None:
        """Release records past their max age or whose owner session is gone (leader only)."""
        state = self.sm.state
        for record_id, reason in state.gc.due_releases(
            tm=self.clock.now(), sessions=state.sessions
        ):
            cmd = ReleaseProtection(record_id=record_id, reason=reason, by=self.by)
            result = await self._propose(cmd)
            if result.get("released"):
                log.info("protection released", extra={"record_id": record_id, "reason": reason})

    # ------------------------------------------------------------------ one run

    async def run(self, table: TableName | None, *, dry_run: bool) -> dict[str, Any]:
        """GC every registered incarnation (or those of `table`). Leader only."""
        if not self._serving():
            raise NotLeaderError("GC runs on the leader", details={"leader": self.raft.leader_id()})
        async with self._lock:
            await _import_manifest_files()
            started = time.monotonic()
            # Queues another leader filled since our last run may be newer than what we noted.
            self._queued_by_tm.clear()
            self._listed.clear()
            self._undeletable.clear()
            state = self.sm.state
            registered = state.txns.table_ids()
            # Tables dropped and forgotten since: their failures would be kept for good.
            for table_id in self._compaction_failed_at.keys() - set(registered):
                del self._compaction_failed_at[table_id]
            ids = [
                i for i in registered if table is None or state.txns.table_location(i)[0] == table
            ]
            budget = _CompactionBudget()
            # Each table's report joins the list before its work starts, so a run that stops
            # midway (a lapsed lease, a new leader) still knows what it deleted.
            reports: list[TableReport] = []
            try:
                for table_id in ids:
                    await self._table(table_id, dry_run=dry_run, budget=budget, into=reports)
                orphans = await self._orphans(reports, dry_run=dry_run)
            except MetastoreError as exc:
                if not dry_run:
                    self._split(exc, _totals(reports), started)
                raise
            summary = run_reply(
                reports,
                orphans,
                dry_run=dry_run,
                seconds=round(time.monotonic() - started, 3),
            )
            if not dry_run:
                self.last_run = {**summary, "tables": len(reports), "finished_ms": _wall_ms()}
                self.metrics.gc_run(summary)
                status = gc_status(state, now_tm=self.clock.now(), table=None)
                self.metrics.protections_held(
                    {p["record_id"]: p["held_bytes"] for p in status["protections"]}
                )
            return summary

    def _split(self, exc: MetastoreError, done: dict[str, int], started: float) -> None:
        """A run ended early by `exc` (a lapsed lease, a new leader, a dropped proposal): the
        error says what the run deleted before it stopped (`details.partial`: the totals of
        `_totals`), so the client that repeats `gc run` elsewhere can add the parts up
        (metastore.client.protocol `gc_run`); the metrics and `last_run` count that part too.
        Deletions count files this run unlinked, not files found already gone, so a repeat
        that deletes the same chunk again adds nothing twice."""
        if not any(done.values()):
            return
        exc.details["partial"] = done
        exc.message += (
            f" (this run deleted {done['files_deleted']} files and {done['orphans_deleted']} "
            "orphans before it stopped; the next run resumes the rest)"
        )
        exc.args = (exc.message,)
        summary = {
            "dry_run": False,
            "partial": True,
            **done,
            "seconds": round(time.monotonic() - started, 3),
        }
        self.last_run = {**summary, "error": exc.code.value, "finished_ms": _wall_ms()}
        self.metrics.gc_run(summary)

    async def _table(
        self, table_id: int, *, dry_run: bool, budget: _CompactionBudget, into: list[TableReport]
    ) -> TableReport:
        state = self.sm.state
        name, location, _ = state.txns.table_location(table_id)
        inc = incarnation(state.catalog, name, table_id)
        before = state.gc.threshold(table_id)
        bound = self._bound(inc)
        report = TableReport(
            table=str(name),
            table_id=table_id,
            threshold_before=before,
            threshold=max(before, bound.bound),
            held_by=bound.held_by,
        )
        into.append(report)
        if location and not await asyncio.to_thread(self.allowed.allows, location):
            # Point 7: left alone - threshold, queue and files - until an operator allows its
            # directory again; nothing it named is lost track of meanwhile.
            log.warning(
                "GC skipped table %s: its location %s is outside allowed_locations (%s); "
                "add its directory there for the GC to collect it",
                name,
                location,
                ", ".join(self.allowed.describe()),
            )
            report.threshold = before
            report.skipped = SKIPPED_NOT_ALLOWED
            return report
        if dry_run:
            count, size = state.txns.dead_files(table_id, report.threshold)
            queued = state.txns.gc_queue(table_id)
            report.files_deleted = count + len(queued)
            report.bytes_deleted = size + sum(queued.values())
            awaiting = state.txns.awaiting_compaction(table_id, report.threshold)
            report.awaiting_compaction_files = awaiting.files
            return report
        await self._drain(inc, location, report)  # what a crashed run left queued
        await self._advance(inc, location, report)
        if await self._compact(inc, location, report, budget):
            # The entries it split off are dead manifests now: queue and delete them.
            await self._advance(inc, location, report)
        report.threshold = state.gc.threshold(table_id)
        report.awaiting_compaction_files = state.txns.awaiting_compaction(
            table_id, report.threshold
        ).files
        return report

    async def _advance(self, inc: TableState, location: str, report: TableReport) -> None:
        """Move the threshold (AdvanceGcThreshold) and delete what each step frees, until
        nothing more is dead at it or MAX_STEPS_PER_TABLE steps."""
        state = self.sm.state
        table_id = inc.table_id
        for _ in range(MAX_STEPS_PER_TABLE):
            threshold = state.gc.threshold(table_id)
            if (
                self._bound(inc).bound <= threshold
                and state.txns.dead_files(table_id, threshold)[0] == 0
            ):
                break
            result = await self._propose(
                AdvanceGcThreshold(table=inc.name, table_id=table_id, up_to=self.clock.now())
            )
            self._queued_by_tm[table_id] = self.raft.safe_time  # applied: its Tm is <= this
            held_by = result.get("held_by")
            if isinstance(held_by, dict):
                report.held_by = held_by
            purged = await self._drain(inc, location, report)
            if not purged:
                break

    async def _compact(
        self, inc: TableState, location: str, report: TableReport, budget: _CompactionBudget
    ) -> bool:
        """Point 8: when files of the table are dead at its threshold but sit in manifests
        with live entries (pending delete entries, or removed entries inside a manifest),
        run the client's compaction for them: fold those delete entries and split the dead
        entries off into manifests of their own (dead, so the next AdvanceGcThreshold queues
        them). Bounded by `budget`. Returns whether a compaction applied."""
        from metastore.client.manifest_files import restore_missing

        state = self.sm.state
        table_id = inc.table_id
        threshold = state.gc.threshold(table_id)
        if not state.txns.awaiting_compaction(table_id, threshold).files:
            return False
        if budget.tables <= 0 or budget.rewrites <= 0 or not location:
            return False  # the next run (a table without a location has no manifests)
        failed_at = self._compaction_failed_at.get(table_id)
        if failed_at is not None and time.monotonic() - failed_at < COMPACTION_RETRY_AFTER_S:
            return False
        if _is_local(location) and (
            held := self.protected.holds(f"{_local_root(location)}/{MANIFEST_DIR}/x")
        ):
            log.warning(
                "GC does not compact %s: its manifests would be written inside this node's "
                "own %s (the table's LOCATION names it)",
                inc.name,
                held,
            )
            return False
        budget.tables -= 1
        deletes = deletes_dead_at(state.txns.delete_entries(table_id), threshold)
        refs = state.txns.manifest_refs(table_id)
        rewrites_max = min(limits.MANIFEST_REWRITES_MAX, budget.rewrites)
        self._leading_term()  # a deposed leader writes nothing (NotLeaderError ends the run)
        try:
            written = await asyncio.to_thread(
                _write_compaction, location, deletes, refs, threshold, rewrites_max
            )
        except (MetastoreError, OSError) as exc:
            log.warning("GC could not compact %s; a later run tries again: %s", inc.name, exc)
            self._compaction_failed_at[table_id] = time.monotonic()
            return False
        if written is None:
            return False
        cmd = written.command(
            table=inc.name, table_id=table_id, request_id=f"gc-compact-{uuid.uuid4().hex}"
        )
        try:
            await self._propose(cmd)
        except ManifestConflictError as exc:
            # A writer or compactor changed the table since it was read: nothing changed, the
            # files just written are unreferenced (orphans, or reused by a later compaction).
            log.info("GC's compaction of %s went stale (a later run retries): %s", inc.name, exc)
            self._compaction_failed_at[table_id] = time.monotonic()
            return False
        except NotLeaderError:
            raise
        except MetastoreError as exc:
            log.warning("GC's compaction of %s was refused: %s", inc.name, exc)
            self._compaction_failed_at[table_id] = time.monotonic()
            return False
        self._compaction_failed_at.pop(table_id, None)
        budget.rewrites -= len(written.plan.rewrites)
        report.compacted_manifests += len(written.plan.rewrites)
        log.info(
            "GC compacted a table to reclaim files removed inside manifests",
            extra={
                "table": str(inc.name),
                "folded_deletes": len(written.plan.deletes),
                "rewritten": len(written.plan.rewrites),
            },
        )
        await asyncio.to_thread(restore_missing, location, written.files, lambda _msg: None)
        return True

    def _bound(self, inc: TableState) -> ThresholdBound:
        state = self.sm.state
        assert state.cluster is not None
        return state.gc.bound(
            inc,
            tm=self.clock.now(),
            dd=state.cluster.dd,
            catalog=state.catalog,
            sessions=state.sessions,
        )

    async def _drain(self, inc: TableState, location: str, report: TableReport) -> int:
        """Delete every queued file of the table, reporting each chunk. Returns files done."""
        state = self.sm.state
        if state.txns.gc_queue(inc.table_id) or state.txns.gc_manifests(inc.table_id):
            await self._await_read_fence(inc.table_id)
        if not state.rules_at_least(3):
            # Apply version 2: a dead manifest's files are deleted straight from its list.
            done = await self._drain_manifests(inc, location, report)
            return done + (await self._drain_queue(inc, location, report))[0]
        # The queue first: a dead manifest's files go through it, a chunk at a time.
        done, emptied = await self._drain_queue(inc, location, report)
        if emptied:
            done += await self._drain_manifests(inc, location, report)
        return done

    async def _drain_queue(
        self, inc: TableState, location: str, report: TableReport
    ) -> tuple[int, bool]:
        """Delete the table's queued files, reporting each chunk: (files done, whether the
        queue is empty now)."""
        done = 0
        # Files the store would not delete in this run: they stay queued (a later run tries
        # again), and are not tried again in this one.
        failed = self._undeletable.setdefault(inc.table_id, set())
        while True:
            queue = self.sm.state.txns.gc_queue(inc.table_id)
            if not queue:
                return done, True
            untried = list(
                itertools.islice((p for p in queue if p not in failed), DELETE_CHUNK_FILES)
            )
            if not untried:
                return done, False  # only files the store refused are left
            # Bounded in bytes too: the GcFilesDeleted naming it must fit MAX_COMMAND_BYTES.
            first = next(_chunks(untried))
            chunk = [(p, queue[p]) for p in first]
            await self._rate.take(len(chunk))
            keep = await self._still_referenced(inc.table_id)
            if keep is None:
                return done, False  # stays queued: the next run tries again
            # The state just checked is this term's: the deletions stop once it is not.
            leading = self._leading_as(self._leading_term())
            doomed = [p for p, _ in chunk if location and _path_key(location, p) not in keep]
            # A replaced manifest's file predates its replacement, which is at or below the
            # threshold: one written after it was written again by a compactor (content
            # hashes repeat) whose compaction may apply once this chunk is reported. Checked
            # right before each unlink: the compactor may write it while the chunk runs.
            threshold_ms = physical_ms(self.sm.state.gc.threshold(inc.table_id))
            deleted = await asyncio.to_thread(
                _delete_files,
                location,
                doomed,
                leading=leading,
                manifests_written_after_ms=threshold_ms,
                protected=self.protected,
                allowed=self.allowed,
            )
            sizes = dict(chunk)
            unlinked = deleted.unlinked()
            report.files_deleted += len(unlinked)
            report.bytes_deleted += sum(sizes.get(p, 0) for p in unlinked)
            if deleted.deposed:
                raise self._deposed()  # the chunk stays queued for the next leader
            if deleted.failed:
                _log_not_deleted(f"queued by table {inc.name}", location, deleted.failed)
                failed.update(deleted.failed)
            reported = tuple(p for p, _ in chunk if p not in deleted.failed)
            if reported:
                await self._propose(
                    GcFilesDeleted(table=inc.name, table_id=inc.table_id, paths=reported)
                )
            done += len(reported)

    async def _still_referenced(self, table_id: int) -> _Referenced | None:
        """Path keys (`_path_key`) that registered incarnations at a location equal to, inside
        or around that of `table_id` (itself included) reference through a file entry or a live
        manifest: GC of `table_id` must leave those files on disk. None when one of those
        manifests cannot be read (its list cannot be trusted: nothing is deleted now). Holds
        live views of the state's file entries: use it before the next await."""
        for _ in range(3):
            # Taken again after reading manifests: what commits applied meanwhile is in it.
            loose, paths, refs = _referenced_near(self.sm.state, table_id)
            missing = [(loc, ref) for loc, ref in refs if (loc, ref.sha256) not in self._listed]
            if not missing:
                # No union: a table's manifests can list a million entries, and this runs on
                # the event loop for every deletion chunk.
                return _Referenced(
                    (paths, *(self._listed[(loc, r.sha256)] for loc, r in refs)), loose
                )
            listed = await asyncio.to_thread(_listed_paths, missing)
            if listed is None:
                return None
            self._listed.update(listed)
        return None  # manifests keep changing under us: try again in the next run

    def _leading_term(self) -> int:
        """The term this node leads in (NotLeaderError if none): taken with the state that a
        deletion was checked against, so the deletion stops once the term is not current."""
        term = self.raft.leader_term()
        if not term:
            raise self._deposed()
        return term

    def _leading_as(self, term: int) -> Callable[[], bool]:
        """Whether this node still leads in `term` and holds its leader lease (no other leader
        can have been elected yet; see point 5): asked by the deletion thread before each
        file (a few attribute reads and a copy of a dict of voters)."""
        raft = self.raft
        monotonic = time.monotonic

        def leading() -> bool:
            return raft.leader_term() == term and monotonic() < raft.leader_lease_until_monotonic()

        return leading

    def _deposed(self) -> NotLeaderError:
        return NotLeaderError(
            "GC stopped deleting: this node no longer leads in the term it checked them in, "
            "or its leader lease lapsed (a quorum has not answered its heartbeats lately)",
            details={"leader": self.raft.leader_id()},
        )

    async def _await_read_fence(self, table_id: int) -> None:
        """Wait until read_fence_ms has passed since the entry that queued the table's files
        (see point 2 of the module docstring). Bounded: at most read_fence_ms from now."""
        queued_by = self._queued_by_tm.get(table_id, self.raft.safe_time)
        until_ms = physical_ms(queued_by) + self.read_fence_ms
        wait_ms = until_ms - self.clock.physical_now_ms()
        if wait_ms > 0:
            log.debug("GC waits for the read fence", extra={"wait_ms": wait_ms})
            await asyncio.sleep(min(wait_ms, self.read_fence_ms) / 1000)

    async def _drain_manifests(self, inc: TableState, location: str, report: TableReport) -> int:
        """Dead manifests (metastore.manifests): delete the data files each lists, then the
        manifest itself (so a crash in between leaves a manifest to expand again, never files
        nobody lists), then report it. A manifest that is gone was expanded by an earlier run;
        one that fails its sha256 check stays queued (and logged): its list cannot be trusted.
        From apply version 3 each chunk of the list first goes into the table's GC queue
        (QueueManifestFiles) and is deleted from there (`_drain_queue`), so no commit can add
        one of those files again between the "still referenced" check and the deletion."""
        from metastore.client.manifest_files import read_manifest
        from metastore.errors import ManifestUnreadableError

        done = 0
        for path, ref in list(self.sm.state.txns.gc_manifests(inc.table_id).items()):
            try:
                entries = await asyncio.to_thread(read_manifest, location, ref)
            except ManifestUnreadableError as exc:
                if exc.details.get("reason") != "missing":
                    log.error("dead manifest not deleted", extra={"path": path, "error": str(exc)})
                    continue
                entries = []
            listed = list(dict.fromkeys(e.path for e in entries))  # a path may repeat
            sizes = {e.path: e.size_bytes for e in entries}
            trusted = True
            queue_first = self.sm.state.rules_at_least(3)
            for chunk in _chunks(listed):
                if queue_first:
                    result = await self._propose(
                        QueueManifestFiles(
                            table=inc.name,
                            table_id=inc.table_id,
                            manifest=path,
                            files=tuple((p, sizes[p]) for p in chunk),
                        )
                    )
                    if (
                        result.get("not_queued")
                        or not (await self._drain_queue(inc, location, report))[1]
                    ):
                        # No room, already reported, or a manifest unreadable: the next run
                        # drains the queue and lists this manifest again.
                        return done
                    continue
                await self._rate.take(len(chunk))
                keep = await self._still_referenced(inc.table_id)
                if keep is None:
                    trusted = False
                    break
                leading = self._leading_as(self._leading_term())
                doomed = [p for p in chunk if location and _path_key(location, p) not in keep]
                deleted = await asyncio.to_thread(
                    _delete_files,
                    location,
                    doomed,
                    leading=leading,
                    protected=self.protected,
                    allowed=self.allowed,
                )
                unlinked = deleted.unlinked()
                report.bytes_deleted += sum(sizes.get(p, 0) for p in unlinked)
                report.files_deleted += len(unlinked)
                if deleted.deposed:
                    raise self._deposed()
                if deleted.failed:
                    # The manifest stays (its files are listed nowhere else) and queued.
                    _log_not_deleted(f"listed by dead manifest {path}", location, deleted.failed)
                    trusted = False
                    break
            keep = await self._still_referenced(inc.table_id) if trusted else None
            if keep is None:
                continue  # stays queued: the next run expands it again
            if location and _path_key(location, path) not in keep:
                leading = self._leading_as(self._leading_term())
                deleted = await asyncio.to_thread(
                    _delete_files,
                    location,
                    [path],
                    leading=leading,
                    protected=self.protected,
                    allowed=self.allowed,
                )
                if deleted.deposed:
                    raise self._deposed()
                if deleted.failed:
                    _log_not_deleted(
                        f"a dead manifest of table {inc.name}", location, deleted.failed
                    )
                    continue  # stays queued
                if deleted.unlinked():
                    report.files_deleted += 1
                    report.bytes_deleted += ref.size_bytes
            await self._propose(
                GcFilesDeleted(table=inc.name, table_id=inc.table_id, paths=(path,))
            )
            done += len(listed) + 1
        return done

    async def _orphans(self, reports: list[TableReport], *, dry_run: bool) -> list[str]:
        """Delete unreferenced files older than the grace period under each location GC'd."""
        state = self.sm.state
        # Live at the last applied entry, not at the clock: a commit stamped while its session
        # lived may still be on its way through the log (its Tm is below the clock, above
        # last_tm). Once a session is not live here, no commit applied later may list files
        # in its attempt directories (Sessions.check_attempt_owners): it never lives again.
        live_sessions = {
            s.session_id for s in state.sessions.sessions() if s.live_at(state.last_tm)
        }
        # Judged on this term's state: the deletions stop once it is not the current term.
        leading = self._leading_as(self._leading_term())
        referenced, manifests = await _references(state)
        # Every local location by the directory it really is (point 4): two texts can name one
        # directory through a symbolic link, which the catalog's overlap rule cannot see.
        real = await asyncio.to_thread(
            _real_roots, [*referenced, *(_local_root(loc) for loc in manifests if _is_local(loc))]
        )
        referenced = _by_real_root(referenced, real)
        cutoff_s = time.time() - self.orphan_grace_ms / 1000
        skipped: list[str] = []
        by_location: dict[str, TableReport] = {}
        for r in reports:
            location = state.txns.table_location(r.table_id)[1]
            by_location.setdefault(location, r)
        scanned: set[str] = set()
        for location, report in by_location.items():
            if "://" in location and not location.startswith("file://"):
                skipped.append(location)
                continue
            if not location:
                continue  # no directory of ours (point 3): nothing to walk
            if not await asyncio.to_thread(self.allowed.allows, location):
                skipped.append(location)  # point 7 (logged by `_table`)
                continue
            root = real.get(_local_root(location))
            if root is None:
                skipped.append(location)  # no absolute path (a `file://host/...` of old)
                continue
            if root in scanned:
                continue  # another location names the same directory: walked already
            scanned.add(root)
            in_manifests: set[str] = set()
            # Files listed only in manifest files (metastore.manifests) are referenced although
            # the state does not list them: read every manifest of every location whose files
            # the scan may walk (this one, any inside it and any around it: a table may live
            # inside a dropped table's directory; `/w/t`, `file:///w/t` and a symbolic link to
            # it are one directory) first, and skip the location if one cannot be read (its
            # list cannot be trusted).
            trusted = True
            for inner, refs in manifests.items():
                if not _is_local(inner):
                    continue
                inner_root = real.get(_local_root(inner))
                if inner_root is None or not (
                    location_contains(root, inner_root) or location_contains(inner_root, root)
                ):
                    continue
                listed = await asyncio.to_thread(_manifest_paths, inner, refs, inner_root)
                if listed is None:
                    trusted = False
                    break
                in_manifests |= listed
            if not trusted:
                skipped.append(location)
                continue
            found = await asyncio.to_thread(
                _scan_orphans, root, referenced, cutoff_s, live_sessions, in_manifests
            )
            if dry_run:
                report.orphans_deleted += len(found)
                report.orphan_bytes_deleted += sum(size for _, size in found)
                continue
            for start in range(0, len(found), DELETE_CHUNK_FILES):
                chunk = found[start : start + DELETE_CHUNK_FILES]
                await self._rate.take(len(chunk))
                # A manifest name repeats (content hashes): one a compactor wrote again since
                # the scan is young again, and stays.
                deleted = await asyncio.to_thread(
                    _delete_absolute,
                    [p for p, _ in chunk],
                    leading=leading,
                    manifests_written_after_ms=int(cutoff_s * 1000),
                    protected=self.protected,
                    allowed=self.allowed,
                )
                removed = set(deleted.unlinked())
                report.orphans_deleted += len(removed)
                report.orphan_bytes_deleted += sum(size for p, size in chunk if p in removed)
                if deleted.deposed:
                    raise self._deposed()
                if deleted.failed:
                    _log_not_deleted("an orphan", "", deleted.failed)
            if found and not dry_run:
                log.info(
                    "orphan files deleted",
                    extra={"location": location, "files": len(found)},
                )
        return skipped

    async def _propose(self, cmd: Command) -> dict[str, Any]:
        try:
            res = await self.raft.propose(encode_command(cmd), timeout_ms=PROPOSE_TIMEOUT_MS)
        except RaftNotLeaderError as exc:
            # Leadership moved mid-run (the core's errors are not RaftErrors): typed, so `gc
            # run` answers NOT_LEADER and the schedule carries on (the next leader resumes).
            raise NotLeaderError(
                f"GC proposal failed: {exc}", details={"leader": exc.leader_hint}
            ) from None
        except (RaftError, RaftCoreError) as exc:
            # A dropped proposal stays UNAVAILABLE (outcome unknown) even once a newer leader
            # replaced its entry here: with five voters another node may hold the entry and
            # still commit it as the next leader, so "nothing applied" would be a lie.
            raise UnavailableError(f"GC proposal failed: {exc}") from None
        outcome = res.result
        if not isinstance(outcome, Outcome):
            raise UnavailableError("GC proposal applied without an outcome")
        err = outcome.exception()
        if err is not None:
            raise err
        return dict(outcome.result)


async def _import_manifest_files() -> None:
    """Import metastore.client.manifest_files (pyarrow) in a worker thread, once: a run needs
    it (dead manifests, compactions) and imported it on the event loop, 0.2 to 1 s on a busy
    machine, past the election timeout, so the leader's first run cost it the leadership and
    failed its own proposals. In a thread the loop keeps running (it waits only while the
    import holds the GIL in C, loading a library: tens of ms)."""
    if _MANIFEST_FILES not in sys.modules:
        await asyncio.to_thread(importlib.import_module, _MANIFEST_FILES)


def _write_compaction(
    location: str,
    deletes: tuple[DeleteEntry, ...],
    refs: tuple[ManifestRef, ...],
    threshold: int,
    rewrites_max: int,
) -> WrittenCompaction | None:
    """Plan and write GC's compaction (point 8) in a thread: the client's planner and writer,
    moving no loose entry and merging nothing. An error of the store is OSError."""
    import pyarrow as pa  # only here: keeps the daemon's start light

    from metastore.client.manifest_files import plan_and_write

    try:
        return plan_and_write(
            location,
            loose=(),
            deletes=deletes,
            refs=refs,
            rewrites_max=rewrites_max,
            gc_threshold=threshold,
            merge_at=_NO_MERGES,
        )
    except pa.ArrowException as exc:
        raise OSError(f"manifest store: {exc}") from None


def _chunks(paths: list[str]) -> Iterator[list[str]]:
    """`paths` in chunks of at most DELETE_CHUNK_FILES paths and CHUNK_PATH_BYTES bytes of
    paths, so the command naming a chunk stays below MAX_COMMAND_BYTES whatever their length
    (up to MAX_FILE_PATH_CHARS each)."""
    chunk: list[str] = []
    size = 0
    for path in paths:
        n = len(path.encode()) + _PATH_OVERHEAD_BYTES
        if chunk and (len(chunk) >= DELETE_CHUNK_FILES or size + n > CHUNK_PATH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(path)
        size += n
    if chunk:
        yield chunk


# ---------------------------------------------------------------------- file system (threads)


@dataclass(frozen=True, slots=True)
class ProtectedPaths:
    """What the GC never deletes, whatever a table's location says: this node's own
    directories (data, secrets) and files (TLS), as real paths. `CREATE TABLE ... LOCATION`
    needs only the writer role and may name any directory inside the allowed roots (anywhere
    with `allowed_locations = ["*"]`, or an operator's root that holds a node's directory),
    while the GC deletes with the daemon's rights; without this, a writer could have the
    leader delete its own peer secret or IDENTITY. Symbolic links in a doomed path's
    directories are resolved before comparing."""

    dirs: tuple[str, ...] = ()
    files: frozenset[str] = frozenset()

    @classmethod
    def of(cls, *, dirs: Iterable[Path | str], files: Iterable[Path | str]) -> ProtectedPaths:
        return cls(
            dirs=tuple(sorted({os.path.realpath(d) for d in dirs})),
            files=frozenset(
                {os.path.realpath(f) for f in files} | {_real_parent(str(f)) for f in files}
            ),
        )

    def holds(self, path: str) -> str:
        """The protected directory or file `path` is (or is inside); "" if none."""
        real = _real_parent(path)
        for directory in self.dirs:
            if real == directory or real.startswith(directory.rstrip("/") + "/"):
                return directory
        return real if real in self.files else ""


def _real_parent(path: str) -> str:
    """`path` with its directories' symbolic links resolved, not its last component's: an
    unlink removes a link, not what it points at."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _log_not_deleted(what: str, location: str, failed: dict[str, str]) -> None:
    """One warning per chunk for the files the store would not delete (`failed`: paths
    relative to `location`, or absolute with no location)."""
    path, why = next(iter(failed.items()))
    if location:
        path = f"{location.rstrip('/')}/{path}"
    more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
    log.warning(
        "GC could not delete %s%s (%s): %s; left on disk, a later run tries again",
        path,
        more,
        what,
        why,
    )


@dataclass(slots=True)
class _Deleted:
    """What a deletion thread did: the paths it removed (or found already gone; a manifest
    written again is not among them), and whether it stopped early because the node no longer
    leads in the term the deletion was checked in (the rest are left alone)."""

    removed: list[str] = field(default_factory=list)
    deposed: bool = False
    # Of `removed`, those already gone (an earlier run, or a deposed leader's thread, unlinked
    # them): done, but not deleted by this run, so not counted in its reply.
    missing: set[str] = field(default_factory=set)
    # Paths the store refused to delete (permission denied, a read-only or failing disk), not
    # in `removed`, with why (`errno_text`): left on disk, and their entries stay queued.
    failed: dict[str, str] = field(default_factory=dict)

    def unlinked(self) -> list[str]:
        """The paths of `removed` this deletion really unlinked: what a run's reply counts."""
        return [p for p in self.removed if p not in self.missing]


def _delete_files(
    location: str,
    rel_paths: Iterable[str],
    *,
    leading: Callable[[], bool],
    manifests_written_after_ms: int | None = None,
    protected: ProtectedPaths = ProtectedPaths(),
    allowed: AllowedLocations = ANYWHERE,
) -> _Deleted:
    """Delete `rel_paths` under `location`, one at a time, asking `leading()` before each: a
    deposed leader's deletion stops at once (a new leader may have reported these files, and
    a commit referenced one again, or a compactor written a manifest again, since). With
    `manifests_written_after_ms`, a manifest file (`_manifests/<sha256>.parquet`) last written
    after it is left (`GcWorker._drain_queue`), judged right before its unlink."""
    out = _Deleted()
    if not location:
        # No location, no directory of ours: the paths are relative to nothing (never to the
        # daemon's working directory).
        return out
    root = location.rstrip("/")
    if "://" in root and not root.startswith("file://"):
        import pyarrow.fs as pafs  # only for URI warehouses: keeps the daemon's start light

        from metastore.client.parquet import pyarrow_uri

        fs, base = pafs.FileSystem.from_uri(pyarrow_uri(root))
        for rel in rel_paths:
            if not leading():
                out.deposed = True
                return out
            if not allowed.allows(f"{root}/{rel}", file=True):
                _log_not_allowed(f"{root}/{rel}", allowed)
                continue
            if manifests_written_after_ms is not None and _is_manifest(rel):
                info = fs.get_file_info(f"{base}/{rel}")
                written_ns = info.mtime_ns
                is_file = info.type == pafs.FileType.File and written_ns is not None
                if is_file and written_ns // 1_000_000 > manifests_written_after_ms:
                    continue
            try:
                fs.delete_file(f"{base}/{rel}")
            except FileNotFoundError:
                out.missing.add(rel)
            except OSError as exc:
                out.failed[rel] = errno_text(exc)
                continue
            out.removed.append(rel)
        return out
    local = _local_root(root)
    by_absolute = {f"{local}/{rel}": rel for rel in rel_paths}
    deleted = _delete_absolute(
        list(by_absolute),
        leading=leading,
        manifests_written_after_ms=manifests_written_after_ms,
        protected=protected,
        allowed=allowed,
    )
    return _Deleted(
        [by_absolute[p] for p in deleted.removed],
        deleted.deposed,
        {by_absolute[p] for p in deleted.missing},
        {by_absolute[p]: why for p, why in deleted.failed.items()},
    )


def _log_not_allowed(path: str, allowed: AllowedLocations) -> None:
    log.warning(
        "GC left %s on disk: its real path is outside allowed_locations (%s), through a "
        "symbolic link in its table's directory; only its catalog entry is dropped",
        path,
        ", ".join(allowed.describe()),
    )


def _is_manifest(path: str) -> bool:
    """Whether `path` (relative to a location, or absolute) names a manifest file."""
    parent, _, name = path.rpartition("/")
    return (parent == MANIFEST_DIR or parent.endswith("/" + MANIFEST_DIR)) and bool(
        _MANIFEST_NAME.fullmatch(name)
    )


def _delete_absolute(
    paths: Iterable[str],
    *,
    leading: Callable[[], bool],
    manifests_written_after_ms: int | None = None,
    protected: ProtectedPaths = ProtectedPaths(),
    allowed: AllowedLocations = ANYWHERE,
) -> _Deleted:
    """`_delete_files` for absolute local paths; then an attempt directory emptied goes too.
    A path in `protected`, or whose real directory is outside `allowed` (point 7), is left on
    disk and not counted (its entry is still reported: it is no table data of ours, like the
    paths of a table without a location)."""
    out = _Deleted()
    parents: set[str] = set()
    for path in paths:
        if not leading():
            out.deposed = True
            break
        if held := protected.holds(path):
            log.warning(
                "GC left %s on disk: it is inside this node's own %s (a table's LOCATION "
                "names it); only its catalog entry is dropped",
                path,
                held,
            )
            continue
        if not allowed.allows(path, file=True):
            _log_not_allowed(path, allowed)
            continue
        if manifests_written_after_ms is not None and _is_manifest(path):
            try:
                written_ns = os.stat(path).st_mtime_ns
            except FileNotFoundError:
                written_ns = None
            if written_ns is not None and written_ns // 1_000_000 > manifests_written_after_ms:
                continue
        try:
            os.remove(path)
        except FileNotFoundError:
            out.missing.add(path)
        except OSError as exc:
            # One file the store will not let go (permission denied, a read-only or failing
            # disk) must not stop the others: it stays queued, and the caller says so.
            out.failed[path] = errno_text(exc)
            continue
        out.removed.append(path)
        parents.add(os.path.dirname(path))
    for parent in sorted(parents, reverse=True):
        # An attempt directory emptied by GC goes too (never the table's own directory).
        if f"/{TXN_DIR}/" in parent + "/" and not parent.endswith(f"/{TXN_DIR}"):
            with contextlib.suppress(OSError):
                os.rmdir(parent)
    return out


def _scan_orphans(
    root: str,
    referenced: Mapping[str, list[AbstractSet[str]]],
    cutoff_s: float,
    live_sessions: set[str],
    in_manifests: set[str] | frozenset[str] = frozenset(),
) -> list[tuple[str, int]]:
    """Old unreferenced files our writers made under `root`: only in an attempt directory
    (`<location>/_txn/<attempt>/...`) or a manifest file (`<location>/_manifests/<sha256>
    .parquet`, or its temporary `<sha256>.parquet.<12 hex>.tmp`) of a registered location (the
    roots of `referenced`). Anything else there was
    not written by us (a CREATE TABLE ... LOCATION over a directory that holds the user's own
    files), and only directories that lead to a registered location or are ours are walked."""
    found: list[tuple[str, int]] = []
    seen = 0
    if not os.path.isdir(root):
        return found
    roots = {r for r in referenced if r.startswith("/")}
    leads_to = {a for r in roots for a in _ancestors(r)}
    for dirpath, dirnames, filenames in os.walk(root):
        if _live_attempt(os.path.relpath(dirpath, root).split(os.sep), live_sessions):
            dirnames.clear()  # a live session's attempt directory: it may still commit
            continue
        kind = _writer_dir(dirpath, roots)
        dirnames[:] = [
            name
            for name in dirnames
            if f"{dirpath}/{name}" in leads_to
            or f"{dirpath}/{name}" in roots
            or _writer_dir(f"{dirpath}/{name}", roots) is not None
        ]
        if kind not in ("attempt", "manifests"):
            continue
        for name in filenames:
            if kind == "manifests" and not (
                _MANIFEST_NAME.fullmatch(name) or _MANIFEST_TMP_NAME.fullmatch(name)
            ):
                continue
            seen += 1
            if seen > ORPHAN_SCAN_FILES_MAX:
                return found
            path = os.path.normpath(f"{dirpath}/{name}")
            if path in in_manifests or _is_referenced(path, referenced):
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if st.st_mtime < cutoff_s:
                found.append((path, st.st_size))
    return found


def _ancestors(path: str) -> list[str]:
    """The proper ancestors of a normalised absolute path, `/` excluded."""
    out: list[str] = []
    while True:
        path = path.rpartition("/")[0]
        if not path:
            return out
        out.append(path)


def _writer_dir(dirpath: str, roots: AbstractSet[str]) -> str | None:
    """What our writers make in `dirpath` (normalised absolute), judged from the registered
    locations `roots`: "attempt" for an attempt directory or one inside it
    (`<root>/_txn/<attempt>/...`), "txn" for `<root>/_txn` itself, "manifests" for
    `<root>/_manifests`; else None (nothing of ours, e.g. the user's own files)."""
    for root in _ancestors(dirpath):
        if root not in roots:
            continue
        parts = dirpath[len(root) + 1 :].split("/")
        if parts[0] == TXN_DIR:
            return "attempt" if len(parts) > 1 else "txn"
        if parts == [MANIFEST_DIR]:
            return "manifests"
    return None


async def _references(
    state: MetastoreState,
) -> tuple[dict[str, list[AbstractSet[str]]], dict[str, list[tuple[ManifestRef, bool]]]]:
    """(local root -> the sets of paths, relative to it, that incarnations there reference or
    have queued for deletion; location -> every manifest whose entries are still referenced
    there: the live ones and the dead ones GC has yet to expand, whose files go through
    `_drain_manifests`, after the read fence, never as orphans).

    Taken table by table, each table's at one instant (a copy of its own sets: no per-path
    work), yielding to the event loop in between: a state of millions of entries taken at
    once stalls the loop for seconds, past the election timeout. Still a superset of what is
    referenced when the walk starts: until GC deletes it, a path a table references stays in
    one of that table's sets (a loose entry moves to the GC queue or into a manifest of the
    table, a replaced manifest file into `retired`, a dead manifest into `gc_manifests`), so
    wherever it sits when its table's turn comes, it is taken. What commits add during the
    walk may be missed: such files are young, or in the attempt directory of a session that
    the caller judged live before the walk (then skipped), or refused at commit."""
    referenced: dict[str, list[AbstractSet[str]]] = {}
    manifests: dict[str, list[tuple[ManifestRef, bool]]] = {}
    for n, table_id in enumerate(state.txns.table_ids()):
        if n:
            await asyncio.sleep(0)
        location, paths, live, dead = state.txns.references(table_id)
        referenced.setdefault(_local_root(location), []).append(paths)
        refs = [(r, False) for r in live] + [(r, True) for r in dead]
        if refs:
            manifests.setdefault(location, []).extend(refs)
    return referenced, manifests


def _is_referenced(path: str, referenced: Mapping[str, list[AbstractSet[str]]]) -> bool:
    """Whether some set of `referenced` (`_references`) holds the normalised absolute `path`,
    relative to its root: the roots looked up are `path`'s ancestors (a table may live inside
    another's directory)."""
    parent = path
    while True:
        parent, sep, _ = parent.rpartition("/")
        if not sep:
            return False
        sets = referenced.get(parent or "/")
        if sets is not None:
            rel = path[len(parent) + 1 :]
            if any(rel in paths for paths in sets):
                return True
        if not parent:
            return False


@dataclass(frozen=True, slots=True)
class _Referenced:
    """Path keys still referenced (`GcWorker._still_referenced`), as the sets they come in:
    `sets` of path keys, and `loose`: root (`_key_root`) -> sets of paths relative to it."""

    sets: tuple[AbstractSet[str], ...]
    loose: Mapping[str, list[AbstractSet[str]]]

    def __contains__(self, key: object) -> bool:
        return any(key in s for s in self.sets) or (
            isinstance(key, str) and _is_referenced(key, self.loose)
        )


def _path_key(location: str, rel: str) -> str:
    """A file's identity whatever incarnation lists it: its absolute path (normalised when
    local), so incarnations at nested locations compare too. The key apply checks commits
    against (metastore.txn `file_key`)."""
    return file_key(location, rel)


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def _key_root(location: str) -> str:
    """The prefix of the path keys (`_path_key`) of a location's files."""
    root = location.rstrip("/")
    return _local_root(root) if _is_local(root) else root


def _overlap(a: str, b: str) -> bool:
    """Whether the directories two locations name are one, or one is inside the other: by
    their key roots, so `/w/t` and `file:///w/t` overlap (their texts do not)."""
    ra, rb = _key_root(a), _key_root(b)
    return location_contains(ra, rb) or location_contains(rb, ra)


def _referenced_near(
    state: MetastoreState, table_id: int
) -> tuple[dict[str, list[AbstractSet[str]]], set[str], list[tuple[str, ManifestRef]]]:
    """What registered incarnations at a location equal to, inside or around that of
    `table_id` (itself included) reference: their file entries (live or kept for time
    travel), as root (`_key_root`) -> live views of their paths (no per-entry work: a table
    can hold a million, and this runs on the event loop before every deletion chunk), the path
    keys of their live manifest files, and those manifests (whose entries the caller reads).
    Not what is queued for deletion (the GC queue, dead and replaced manifests). Read on the
    event loop: the state is not to be walked from a thread."""
    txns = state.txns
    location = txns.table_location(table_id)[1]
    loose: dict[str, list[AbstractSet[str]]] = {}
    paths: set[str] = set()
    refs: list[tuple[str, ManifestRef]] = []
    if not location:
        return loose, paths, refs
    for other in txns.table_ids():
        other_location = txns.table_location(other)[1]
        if not other_location:
            continue
        if not _overlap(location, other_location):
            continue
        loose.setdefault(_key_root(other_location), []).append(txns.loose_paths(other))
        for ref in txns.manifest_refs(other):
            paths.add(_path_key(other_location, ref.path))
            refs.append((other_location, ref))
    return loose, paths, refs


def _listed_paths(
    refs: list[tuple[str, ManifestRef]],
) -> dict[tuple[str, str], frozenset[str]] | None:
    """(location, sha256) -> path keys of the entries of each of `refs` ((location, reference)
    pairs); None if one cannot be read or fails its sha256 check."""
    from metastore.client.manifest_files import read_manifest

    out: dict[tuple[str, str], frozenset[str]] = {}
    for location, ref in refs:
        try:
            entries = read_manifest(location, ref)
        except ManifestUnreadableError as exc:
            log.warning(
                "GC deletes nothing here now: a manifest that may list its files cannot be read",
                extra={"location": location, "manifest": ref.path, "error": str(exc)},
            )
            return None
        out[(location, ref.sha256)] = frozenset(_path_key(location, e.path) for e in entries)
    return out


def _manifest_paths(
    location: str, refs: list[tuple[ManifestRef, bool]], root: str
) -> set[str] | None:
    """Absolute local paths, under `root` (the location's real directory, `_real_roots`), of
    every entry of `refs` ((reference, dead) pairs); None if a manifest cannot be read (or
    fails its sha256 check), except a dead one that is gone: GC deletes a dead manifest's
    files before the manifest itself."""
    from metastore.client.manifest_files import read_manifest

    paths: set[str] = set()
    for ref, dead in refs:
        try:
            entries = read_manifest(location, ref)
        except ManifestUnreadableError as exc:
            if dead and exc.details.get("reason") == "missing":
                continue
            log.warning(
                "orphan scan skips a location: a manifest cannot be read",
                extra={"location": location, "manifest": ref.path, "error": str(exc)},
            )
            return None
        paths.update(os.path.normpath(f"{root}/{e.path}") for e in entries)
    return paths


def _real_roots(roots: Iterable[str]) -> dict[str, str]:
    """Local roots (`_local_root`, absolute) -> the directory each really is, symbolic links
    resolved (I/O: run in a thread). The orphan scan judges files by these: a table whose
    LOCATION reaches another's directory through a link (`/w/alias` -> `/w/t`) has texts that
    do not overlap, so the catalog lets both exist, yet the files under one are the other's;
    keyed by text, the scan of either deleted the files the other committed."""
    resolve = RealPaths()
    return {root: resolve(root) for root in roots if root.startswith("/")}


def _by_real_root(
    referenced: Mapping[str, list[AbstractSet[str]]], real: Mapping[str, str]
) -> dict[str, list[AbstractSet[str]]]:
    """`referenced` (`_references`) keyed by real directories (`_real_roots`): the sets of
    locations that name one directory are merged. Keys that are no absolute path (URI
    locations: never scanned) stay as they are."""
    out: dict[str, list[AbstractSet[str]]] = {}
    for root, sets in referenced.items():
        out.setdefault(real.get(root, root), []).extend(sets)
    return out


def _live_attempt(parts: list[str], live_sessions: set[str]) -> bool:
    """`.../_txn/<session id>--<attempt>/...` of a live session."""
    return any(owner in live_sessions for owner in attempt_owners(parts))


def _local_root(location: str) -> str:
    return os.path.normpath(location.removeprefix("file://"))


def run_reply(
    reports: list[TableReport],
    orphan_locations_skipped: list[str],
    *,
    dry_run: bool,
    seconds: float,
) -> dict[str, Any]:
    """The reply of a run (docs/protocol.md `gc_run`), bounded whatever the number of tables:
    the totals count every table, `tables` lists at most GC_RUN_REPLY_TABLES_MAX of them and
    `orphan_locations_skipped` at most GC_RUN_REPLY_LOCATIONS_MAX locations, each with a count
    of what it left out. Tables where something happened (or would, in a dry run) are listed
    before idle ones; the list keeps the run's order."""
    listed = reports
    if len(reports) > GC_RUN_REPLY_TABLES_MAX:
        busy = [i for i, r in enumerate(reports) if _eventful(r)][:GC_RUN_REPLY_TABLES_MAX]
        room = GC_RUN_REPLY_TABLES_MAX - len(busy)
        idle = [i for i, r in enumerate(reports) if not _eventful(r)][:room]
        listed = [reports[i] for i in sorted([*busy, *idle])]
    return {
        "dry_run": dry_run,
        "tables": [r.view() for r in listed],
        "tables_total": len(reports),
        "tables_omitted": len(reports) - len(listed),
        "orphan_locations_skipped": orphan_locations_skipped[:GC_RUN_REPLY_LOCATIONS_MAX],
        "orphan_locations_skipped_omitted": max(
            0, len(orphan_locations_skipped) - GC_RUN_REPLY_LOCATIONS_MAX
        ),
        **_totals(reports),
        "awaiting_compaction_files": sum(r.awaiting_compaction_files for r in reports),
        "awaiting_compaction_tables": sum(1 for r in reports if r.awaiting_compaction_files),
        "seconds": seconds,
    }


def _eventful(report: TableReport) -> bool:
    """Did the run do (or, dry, find) anything in this table, or leave it alone?"""
    return bool(
        report.files_deleted
        or report.bytes_deleted
        or report.orphans_deleted
        or report.orphan_bytes_deleted
        or report.compacted_manifests
        or report.awaiting_compaction_files
        or report.skipped
        or report.threshold != report.threshold_before
    )


def _totals(reports: Iterable[TableReport]) -> dict[str, int]:
    """What a run's table reports add up to: the totals of its reply."""
    reports = list(reports)
    return {
        "files_deleted": sum(r.files_deleted for r in reports),
        "bytes_deleted": sum(r.bytes_deleted for r in reports),
        "orphans_deleted": sum(r.orphans_deleted for r in reports),
        "orphan_bytes_deleted": sum(r.orphan_bytes_deleted for r in reports),
        "compacted_manifests": sum(r.compacted_manifests for r in reports),
    }


def _wall_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------- status (pure reads)


def gc_status(state: MetastoreState, *, now_tm: int, table: TableName | None) -> dict[str, Any]:
    """What `metastore gc status` shows: per incarnation its TTL, threshold, the threshold a run
    now would reach and what holds it, the protections covering it and what a run would free;
    per protection the bytes it holds (files the TTL alone would let GC delete)."""
    assert state.cluster is not None
    dd = state.cluster.dd
    tables: list[dict[str, Any]] = []
    held: dict[str, int] = {r.record_id: 0 for r in state.gc.records()}
    # For one table, only the records covering it: the others hold nothing counted here.
    shown: set[str] | None = None if table is None else set()
    incarnations: list[tuple[int, TableState, int | None]] = []
    awaiting_files = awaiting_tables = 0
    for table_id in state.txns.table_ids():
        name, _location, forgotten = state.txns.table_location(table_id)
        if table is None or name == table:
            incarnations.append((table_id, incarnation(state.catalog, name, table_id), forgotten))
    # Looked up per table, not asked of every record per table (see `covering_index`).
    index = state.gc.covering_index(inc for _, inc, _ in incarnations)
    for table_id, inc, forgotten in incarnations:
        name = inc.name
        covering = index[table_id]
        bound = state.gc.bound(
            inc,
            tm=now_tm,
            dd=dd,
            catalog=state.catalog,
            sessions=state.sessions,
            covering=covering,
        )
        threshold = state.gc.threshold(table_id)
        target = max(threshold, bound.bound)
        # One pass over the table for every threshold asked below (one per covering record).
        dead = state.txns.dead_profile(table_id)
        dead_files, dead_bytes = dead.at(target)
        queue = state.txns.gc_queue(table_id)
        ttl_ms = ttl_ms_of(inc, state.catalog)
        ttl_bound = max(0, now_tm - (ttl_ms << LOGICAL_BITS))
        if shown is not None:
            shown.update(r.record_id for r in covering)
        for record in covering:
            if ttl_bound > record.ts - 1:
                _, by_ttl = dead.at(ttl_bound)
                _, by_record = dead.at(max(threshold, record.ts - 1))
                held[record.record_id] += by_ttl - by_record
        stats = state.txns.table_stats(table_id)
        # Reclaimable at the next threshold only once a compaction folds or splits them (the
        # leader's GC runs one for up to COMPACTION_TABLES_PER_RUN tables per run).
        awaiting = state.txns.awaiting_compaction(table_id, target)
        if awaiting.files:
            awaiting_files += awaiting.files
            awaiting_tables += 1
        tables.append(
            {
                "table": str(name),
                "table_id": table_id,
                "dropped": forgotten is not None,
                "ttl_ms": ttl_ms,
                "threshold": threshold,
                "next_threshold": target,
                "held_by": bound.held_by,
                "protections": [r.record_id for r in covering],
                "live_files": stats.live_files,
                "live_bytes": stats.live_bytes,
                "file_entries": stats.file_entries,
                "reclaimable_files": dead_files + len(queue),
                "reclaimable_bytes": saturated(dead_bytes + sum(queue.values())),
                "queued_files": len(queue),
                "awaiting_compaction_files": awaiting.files,
            }
        )
    return {
        "meta": state.gc.meta(),
        "tables": tables,
        "awaiting_compaction": {"files": awaiting_files, "tables": awaiting_tables},
        "protections": [
            {"record_id": r.record_id, "ts": r.ts, "held_bytes": saturated(held[r.record_id])}
            for r in state.gc.records()
            if shown is None or r.record_id in shown
        ],
    }
