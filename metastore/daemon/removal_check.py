"""Removals of files that sit in manifests are checked against the manifests before a commit
is proposed.

`TxnLog.commit` (apply) cannot look inside a manifest: it does no I/O, and the state holds only
a reference per manifest file. So it takes a removal of a path that is neither loose nor a
delete entry on trust, as an entry of some manifest; a path in no manifest would make a delete
entry that matches nothing, and the commit would succeed with a typo in it. The node that takes
the commit (leader or follower: the check needs only its state and the table's files) reads the
table's manifests first and refuses such a removal with the error apply gives for a loose file:
InvalidArgumentError for a path that is not a file of the table, DataFileConflictError for one
that a manifest lists as removed.

The state the check first reads may lag: a follower behind the leader, or a new leader that has
not applied its whole log, may not know yet the commit that added the file (or the compaction
that moved it into a manifest), though the client saw it acknowledged. So a refusal rests on a
state that has caught up (`catch_up`, the leader's ReadIndex: every entry committed before the
call is applied); when the node cannot catch up, apply decides, as before. The daemon runs the
check on the leader only (a follower forwards the commit, and the leader checks it there).

Manifests are immutable and content-addressed, so what was read stays true: the entries of the
last few manifests are cached by sha256 (bounded by entry count). A manifest that cannot be read
(for whatever reason: missing, altered, pyarrow missing or unable to open the location) leaves
the removal to apply, as before (logged); the commit is not refused for our trouble.

The check answers exactly what apply would answer if it could see inside the manifests: it
runs apply's own checks, in apply's order (`TxnLog.manifest_removal_refusal`), with the
manifests' answers for the removals apply takes on trust, and raises only when the first error
is one of those. So a retry of a committed txn id, a replayed stream position, a stale table
incarnation, a read conflict, a schema version not active, a reused path or a removal of a
file the log knows is removed, met before the bad path, are left to apply, which answers them
itself. Checks that depend on the commit's exact ts (not stamped yet) run at the lowest ts it
can get. Overwrites are not checked (they remove every live file anyway). The state may move on
between this check and apply; the check is only ever stricter than apply for paths that were
never in the table.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from metastore.commands import CommitTxn
from metastore.errors import MetastoreError, TableNotFoundError
from metastore.manifests import ManifestRef
from metastore.state import MetastoreState
from metastore.txn import FileEntry

log = logging.getLogger(__name__)

# Manifest entries kept in the cache (path -> removed ts), over all cached manifests. One full
# manifest (MANIFEST_ENTRIES_MAX) always fits.
CACHED_ENTRIES_MAX: Final = 200_000

ReadManifest = Callable[[str, ManifestRef], list[FileEntry]]
# The node's state once it has applied every entry committed before the call, or None when it
# cannot tell (not the leader, no quorum, timeout).
CatchUp = Callable[[], Awaitable[MetastoreState | None]]


def _default_reader(location: str, ref: ManifestRef) -> list[FileEntry]:
    # Imported here: pyarrow is not needed by a node until a table has manifests.
    from metastore.client.manifest_files import read_manifest

    return read_manifest(location, ref)


class RemovalCheck:
    """Checks a commit's removals of manifest entries (see the module docstring)."""

    def __init__(
        self, *, read: ReadManifest = _default_reader, cached_entries_max: int = CACHED_ENTRIES_MAX
    ) -> None:
        self._read = read
        self._cached_entries_max = cached_entries_max
        # sha256 -> {path: removed_ts or None}, least recently used first.
        self._cache: OrderedDict[str, dict[str, int | None]] = OrderedDict()
        self._cached_entries = 0
        self.manifests_read = 0  # for tests and metrics

    async def check(self, state: MetastoreState, cmd: CommitTxn, *, catch_up: CatchUp) -> None:
        """Raise what apply would raise for a removed path it cannot see, before proposing.
        `state` may lag; a refusal is only raised if it holds after `catch_up`."""
        refusal = await self._refusal(state, cmd)
        if refusal is None:
            return
        fresh = await catch_up()
        if fresh is None:
            log.info(
                "cannot confirm a removal check on a caught-up state; apply takes it on trust",
                extra={"txn_id": cmd.txn_id, "error": str(refusal)},
            )
            return
        refusal = await self._refusal(fresh, cmd)
        if refusal is not None:
            raise refusal

    async def _refusal(self, state: MetastoreState, cmd: CommitTxn) -> MetastoreError | None:
        """What apply would raise, against `state`, for a removed path it cannot see; None if
        nothing (or if apply answers first for another reason)."""
        manifest_status: dict[int, dict[str, int]] = {}
        for w in cmd.writes:
            if w.overwrite or not w.remove:
                continue
            try:
                table_id = state.catalog.live_table(w.table).table_id
            except TableNotFoundError:
                return None  # apply gives the error
            trusted = state.txns.trusted_removals(table_id, w.remove)
            if not trusted:
                continue
            _, location, _ = state.txns.table_location(table_id)
            found = await self._find(location, state.txns.manifest_refs(table_id), trusted)
            if found is None:
                return None  # a manifest could not be read: apply decides, as before
            manifest_status.setdefault(table_id, {}).update(found)
        if not manifest_status:
            return None
        # Apply's own checks, in its order, with the manifests' answers where it would trust:
        # the first error is the answer. The entry will be stamped above every applied Tm.
        return state.txns.manifest_removal_refusal(
            cmd,
            ts_floor=state.last_tm + 1,
            catalog=state.catalog,
            manifest_status=manifest_status,
            refuse_gc_queued=state.rules_at_least(2),
            delete_manifest_copies=state.rules_at_least(5),
            drop_conflicts=state.rules_at_least(5),
            bound_counts=state.rules_at_least(5),
        )

    async def _find(
        self, location: str, refs: Sequence[ManifestRef], paths: Sequence[str]
    ) -> dict[str, int] | None:
        """path -> -1 if some manifest lists it live, else the ts it was removed at, for every
        path of `paths` found in `refs`; None if a manifest cannot be read."""
        wanted = set(paths)
        found: dict[str, int] = {}
        # Cached manifests first: the paths are often found without reading a file.
        cached = [r for r in refs if r.sha256 in self._cache]
        for ref in [*cached, *(r for r in refs if r.sha256 not in self._cache)]:
            entries = self._cache.get(ref.sha256)
            if entries is None:
                try:
                    read = await asyncio.to_thread(self._read, location, ref)
                except Exception as exc:  # noqa: BLE001  (our trouble: I/O, pyarrow; apply decides)
                    log.warning(
                        "cannot check removals against a manifest; apply takes them on trust",
                        extra={"location": location, "manifest": ref.path, "error": str(exc)},
                    )
                    return None
                entries = self._remember(ref, read)
            else:
                self._cache.move_to_end(ref.sha256)
            for path in wanted & entries.keys():
                removed = entries[path]
                if ref.removed_all_ts is not None and removed is None:
                    removed = ref.removed_all_ts  # an overwrite removed every live entry
                status = -1 if removed is None else removed
                if found.get(path, 0) != -1:
                    found[path] = status
            if len(found) == len(wanted) and all(v == -1 for v in found.values()):
                break  # every path is live somewhere: no need to read further
        return found

    def _remember(self, ref: ManifestRef, read: list[FileEntry]) -> dict[str, int | None]:
        cached = self._cache.get(ref.sha256)
        if cached is not None:
            return cached  # another check read it meanwhile
        # A path can sit in one manifest twice (committed again, then a merge): it is live if
        # any of its entries is, as readers list it (`manifests.first_indexes`).
        entries: dict[str, int | None] = {}
        for e in read:
            if e.removed_ts is None or e.path not in entries:
                entries[e.path] = e.removed_ts
        self.manifests_read += 1
        self._cache[ref.sha256] = entries
        self._cached_entries += len(entries)
        while self._cached_entries > self._cached_entries_max and len(self._cache) > 1:
            _, dropped = self._cache.popitem(last=False)
            self._cached_entries -= len(dropped)
        return entries
