"""Manifests: a table's older file entries, moved out of the replicated state into files.

Key idea
    Every file entry in the state costs ~100 bytes in every replica, every snapshot and every
    `files` reply. A table therefore keeps at most a bounded number of *loose* entries; older
    ones move into immutable, content-addressed *manifest files* under the table's location
    (`<location>/_manifests/<sha256>.parquet`), and the state keeps one *manifest reference*
    per file (path, sha256, entry count, ts range, live sums). Iceberg's manifests and txn-wal's
    "the log holds handles, the data shard holds data", on our Raft log.

Jargon
    loose entry     a FileEntry held in the state (metastore.txn), live or removed.
    manifest        a Parquet file listing entries (path, size_bytes, row_count, added_ts,
                    removed_ts) in commit order; named by the sha256 of its bytes, never changed.
    reference       a ManifestRef in the state: which manifest, and what it summarises.
    delete entry    the removal of a path that sits in a manifest (DeleteEntry: path,
                    removed_ts). It stays loose until a compaction rewrites that manifest.
                    From apply version 5 a removal of a loose path records one too when the
                    table has manifests: the path may sit in one as well (committed again).
    truncation      an overwrite commit removes every live entry, manifests included: their
                    references get `removed_all_ts` (every entry still live then is removed then).
    compaction      the committer (the bridge or `metastore table compact`, never `apply`: apply
                    does no I/O) writes manifests, then proposes one CompactManifest that swaps
                    them in: a compare-and-swap on exactly what it read.

What a compaction names (CompactManifest), and what apply checks
    * the oldest `loose_count` loose entries in commit order, by count and by the sha256 of
      their canonical form (`entries_digest`) as the compactor read them: a commit that removed
      one of them since changes the digest, and the compaction is refused
      (ManifestConflictError, retryable, nothing changed). The cut must fall between two
      commits (the next loose entry was added later), so a commit's entries never straddle a
      manifest and the loose entries;
    * the oldest `deletes_count` delete entries (`deletes_digest`), folded in;
    * the references it rewrites (`replaces`: sha256 and the `removed_all_ts` it saw): those
      with a truncation or holding a folded deleted path, rewritten one for one with the
      effective removal of every entry. The planner folds only as many deletes as
      MANIFEST_REWRITES_MAX rewrites allow, so the command stays bounded;
    * the references it adds: their entry counts add up to loose_count plus the replaced
      references' (entries are moved, never dropped; GC drops them, later). Past
      MANIFEST_MERGE_AT manifests the planner also merges neighbouring ones (several
      `replaces`, one add each): apply needs no rule of its own for that.
    The same command applied again (a retried proposal) finds its adds referenced and its
    replaced references gone, and answers `deduplicated` without changing anything.

The key invariant
    For every ts, the expanded listing (`expand`) of the loose live entries, the relevant
    references' manifest entries and the delete entries at ts is the same before and after
    any compaction: a compaction moves entries and folds removals, it never changes when a file
    is live. Checked by tests/metastore/test_manifests.py against a model that never compacts.

Readers
    `files_at` in the state returns the loose live entries; `listing_at` returns a Listing:
    those, the references that matter at ts (`relevant_at`), and the delete entries at or below
    ts. Readers fetch each referenced manifest, check its sha256 (ManifestUnreadableError when
    missing or different) and call `expand`. Expansion order is commit order: entries are
    stably sorted by added_ts (each commit's entries sit in one place, in commit order). A
    path committed again (apply cannot see it in a manifest) is listed once, as its first
    live entry: every expander ends with `first_indexes`.

GC (metastore.gc's AdvanceGcThreshold drives it through `TxnLog.purge_dead`)
    * A manifest file a compaction replaced is *retired* at that compaction's Tm: a reader that
      listed the table just before may still read it, so it is queued for deletion (a plain
      file) only once the table's GC threshold reaches that Tm.
    * A reference whose every entry is dead at the threshold (`dead_at`: all removed at or
      below it, truncated at or below it, or the table dropped by then) leaves the state for
      the table's dead-manifest queue; the leader's GC worker reads it (sha256-checked),
      deletes the data files it lists, then the manifest, then reports it (GcFilesDeleted).
      From apply version 3 the listed files first enter the table's GC queue, a bounded chunk
      at a time (QueueManifestFiles), so a commit adding one again is refused until GC has
      deleted and reported it (metastore.daemon.gc_worker, point 3).
    * Removed entries inside a manifest that still has live entries: the compactor, given the
      table's threshold (`compaction_view`), splits those dead at it into a manifest of their
      own, which is then dead as above (`plan_compaction`). Entries move, never vanish, so the
      CompactManifest rules are unchanged. What waits for such a compaction (delete entries
      and removed entries dead at the threshold, `awaiting_compaction`) the leader's GC
      compacts itself, a bounded number of tables per run, through the same command
      (metastore.daemon.gc_worker point 8); `gc status` shows it.
    * Orphans: the orphan scan reads every manifest of the locations it walks (their data
      files are listed only there), so files of failed write attempts under such a table go
      after the orphan grace, as do manifest files nothing references (a compactor that died
      or went stale before its CompactManifest applied); metastore.daemon.gc_worker point 4.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

import msgpack

from hlc.limits import MAX_TS
from metastore import limits
from metastore.errors import InvalidArgumentError, limit_exceeded

if TYPE_CHECKING:
    from metastore.commands import CompactManifest, TableName
    from metastore.txn import FileEntry

MANIFEST_DIR: Final = "_manifests"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def manifest_path(sha256: str) -> str:
    """A manifest's path relative to its table's location: its name is its content hash."""
    return f"{MANIFEST_DIR}/{sha256}.parquet"


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestRef:
    """The state's handle on one manifest file. Invariants (`validate_ref`): path is
    manifest_path(sha256); 1 <= entry_count <= MANIFEST_ENTRIES_MAX; min_added_ts <=
    max_added_ts; max_removed_ts is 0 exactly when no entry was removed in the file."""

    path: str  # relative to the table location
    sha256: str  # lowercase hex of the file's bytes
    size_bytes: int  # of the manifest file
    entry_count: int
    live_count: int  # entries with no removed_ts in the file
    live_bytes: int
    live_rows: int
    min_added_ts: int
    max_added_ts: int
    max_removed_ts: int  # 0: no entry of the file is removed
    # Set by an overwrite commit: every entry still live at this ts is removed at it. Only the
    # state sets it; a compaction folds it into the rewritten file.
    removed_all_ts: int | None = None

    def to_data(self) -> list[object]:
        return [
            self.path,
            self.sha256,
            self.size_bytes,
            self.entry_count,
            self.live_count,
            self.live_bytes,
            self.live_rows,
            self.min_added_ts,
            self.max_added_ts,
            self.max_removed_ts,
            self.removed_all_ts,
        ]

    def to_view(self) -> dict[str, object]:
        """The wire form (docs/protocol.md, `files` and `compact_manifest`)."""
        return {
            "path": self.path,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "entry_count": self.entry_count,
            "live_count": self.live_count,
            "live_bytes": self.live_bytes,
            "live_rows": self.live_rows,
            "min_added_ts": self.min_added_ts,
            "max_added_ts": self.max_added_ts,
            "max_removed_ts": self.max_removed_ts,
            "removed_all_ts": self.removed_all_ts,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteEntry:
    """`path`, which sits in one of the table's manifests, is removed at `removed_ts`."""

    path: str
    removed_ts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplacedManifest:
    """A reference a compaction rewrites, as the compactor saw it (compare-and-swap)."""

    sha256: str
    removed_all_ts: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """A table's files at `ts`, before expansion: loose live entries in commit order, the
    references that matter at ts (ordered by min_added_ts, sha256) and the delete entries with
    removed_ts <= ts."""

    ts: int
    files: tuple[FileEntry, ...]
    manifests: tuple[ManifestRef, ...]
    deletes: tuple[DeleteEntry, ...]


# --------------------------------------------------------------------------------------------
# Pure helpers shared by the state machine, the compactor and the readers
# --------------------------------------------------------------------------------------------


def entry_row(e: FileEntry) -> list[object]:
    """An entry's canonical form: what a manifest row and the digests hold."""
    return [e.path, e.size_bytes, e.row_count, e.added_ts, e.removed_ts]


def entries_digest(entries: Iterable[FileEntry]) -> str:
    """sha256 hex of the canonical form of `entries`, in order (the compaction's CAS key)."""
    packed: bytes = msgpack.packb([entry_row(e) for e in entries], use_bin_type=True)
    return hashlib.sha256(packed).hexdigest()


def deletes_digest(deletes: Iterable[DeleteEntry]) -> str:
    packed: bytes = msgpack.packb([[d.path, d.removed_ts] for d in deletes], use_bin_type=True)
    return hashlib.sha256(packed).hexdigest()


def relevant_at(ref: ManifestRef, ts: int) -> bool:
    """Whether any entry of `ref` can be live at `ts` (pending delete entries aside)."""
    if ref.min_added_ts > ts:
        return False
    if ref.removed_all_ts is not None and ref.removed_all_ts <= ts:
        return False
    return not (ref.live_count == 0 and ref.max_removed_ts <= ts)


def dead_at(ref: ManifestRef, threshold: int) -> bool:
    """No read above `threshold` can see any entry of `ref` (GC may drop it)."""
    if ref.removed_all_ts is not None and ref.removed_all_ts <= threshold:
        return True
    return ref.live_count == 0 and ref.max_removed_ts <= threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitingCompaction:
    """What a table holds that GC would reclaim at a threshold, but only after a compaction:
    GC drops whole manifests (`dead_at`) and queues loose entries, never a single entry
    inside a manifest with live ones. `files` counts the data files (an upper bound: a delete
    entry of a loose path's own removal, apply version 5, may match no manifest entry)."""

    files: int
    deletes: int  # pending delete entries removed at or below the threshold
    manifests: int  # manifests with live entries whose removed ones are all dead at it


NOTHING_AWAITS: Final = AwaitingCompaction(files=0, deletes=0, manifests=0)


def awaiting_compaction(
    delete_removed_ts: Iterable[int], refs: Iterable[ManifestRef], threshold: int
) -> AwaitingCompaction:
    """What waits for a compaction to be reclaimed at `threshold` (the leader's GC compacts
    such a table itself; `gc status` shows it). A pending delete entry removed at or below
    it, and a manifest whose removed entries are all dead at it beside live ones (what
    `plan_compaction` splits off with that `gc_threshold`). Nothing when every manifest is
    dead at it: GC drops them whole, and the delete entries with them (`purge_dead`).
    `delete_removed_ts`: the removed_ts of each pending delete entry. One pass, no entry
    built: `gc status` runs it for every table on the event loop."""
    if threshold <= 0:
        return NOTHING_AWAITS
    live_refs = [r for r in refs if not dead_at(r, threshold)]
    if not live_refs:
        return NOTHING_AWAITS
    splittable = [r for r in live_refs if r.live_count > 0 and 0 < r.max_removed_ts <= threshold]
    deletes = sum(1 for ts in delete_removed_ts if ts <= threshold)
    removed_inside = sum(r.entry_count - r.live_count for r in splittable)
    return AwaitingCompaction(
        files=deletes + removed_inside, deletes=deletes, manifests=len(splittable)
    )


def deletes_dead_at(deletes: Sequence[DeleteEntry], threshold: int) -> tuple[DeleteEntry, ...]:
    """The oldest delete entries, up to the first removed above `threshold`: what a
    compaction run for GC folds (a compaction folds a prefix of them, in commit order)."""
    out: list[DeleteEntry] = []
    for d in deletes:
        if d.removed_ts > threshold:
            break
        out.append(d)
    return tuple(out)


def effective_removed_ts(
    entry: FileEntry, ref: ManifestRef | None, deletes: Mapping[str, int]
) -> int | None:
    """When `entry` stops being live: the earliest of its own removal, its manifest's
    truncation and a delete entry of its path (None: live)."""
    candidates = [entry.removed_ts, deletes.get(entry.path)]
    if ref is not None:
        candidates.append(ref.removed_all_ts)
    present = [c for c in candidates if c is not None]
    return min(present) if present else None


def sort_refs(refs: Iterable[ManifestRef]) -> list[ManifestRef]:
    """Reference order (by ts range). `expand` sorts entries by added_ts anyway; a commit's
    entries are split across manifests only where some are dead at the GC threshold
    (`plan_compaction`), and reads at or below it are refused."""
    return sorted(refs, key=lambda r: (r.min_added_ts, r.max_added_ts, r.sha256))


def expand(listing: Listing, contents: Mapping[str, Sequence[FileEntry]]) -> list[FileEntry]:
    """The live files at `listing.ts`: loose entries plus the live entries of every referenced
    manifest (`contents`: sha256 -> its entries, already verified), in commit order, each path
    once (`first_indexes`). Entries come back with `removed_ts=None` (live at ts is all a
    listing says)."""
    deletes = {d.path: d.removed_ts for d in listing.deletes if d.removed_ts <= listing.ts}
    out: list[FileEntry] = []
    for ref in sort_refs(listing.manifests):
        out.extend(live_in_manifest(ref, contents[ref.sha256], deletes, listing.ts))
    for entry in listing.files:
        if entry.path in deletes:
            # Cannot happen: a loose path has a delete entry only from its own removal (apply
            # version 5), so it is not live where that entry applies. Cheap to keep.
            continue
        out.append(entry if entry.removed_ts is None else replace(entry, removed_ts=None))
    out.sort(key=lambda e: e.added_ts)  # stable: keeps each commit's own order
    return first_of_each_path(out)


def first_indexes(paths: Sequence[str]) -> list[int] | None:
    """THE rule every reader applies to a table's live entries at ts, in commit order: a path
    is listed once, as its first live entry (the earliest added_ts; a commit lists a path at
    most once, so there is no tie). Returns the indexes to keep, or None when no path repeats.

    A path repeats only when a protocol client committed it again after its first entry left
    the loose entries (apply cannot see inside manifests, so it cannot refuse that): both
    entries name the same file, and listing it twice made readers read its rows twice. It
    runs after liveness (removals, truncations, delete entries) is decided, so it only drops
    an entry whose path stays listed: it never makes a removed file live, nor hides a live
    path. A pure function of the listing: the same answer on every node and every reader."""
    seen: set[str] = set()
    keep: list[int] = []
    for i, path in enumerate(paths):
        if path not in seen:
            seen.add(path)
            keep.append(i)
    return None if len(keep) == len(paths) else keep


def first_of_each_path(entries: Sequence[FileEntry]) -> list[FileEntry]:
    """`entries` (live at ts, in commit order) with each path once (`first_indexes`)."""
    keep = first_indexes([e.path for e in entries])
    return list(entries) if keep is None else [entries[i] for i in keep]


def live_in_manifest(
    ref: ManifestRef, entries: Sequence[FileEntry], deletes: Mapping[str, int], ts: int
) -> list[FileEntry]:
    """The entries of one manifest live at `ts`, in file order, with removed_ts=None. `deletes`
    maps path -> removed ts (only those <= ts matter). Executors run this per manifest."""
    out: list[FileEntry] = []
    truncated = ref.removed_all_ts
    for entry in entries:
        if entry.added_ts > ts:
            continue
        # The common case (a live entry, no truncation, no delete) is kept as it is: this loop
        # runs once per file of a million-file table.
        if entry.removed_ts is None and truncated is None and entry.path not in deletes:
            out.append(entry)
            continue
        gone = effective_removed_ts(entry, ref, deletes)
        if gone is None or gone > ts:
            out.append(replace(entry, removed_ts=None))
    return out


def ref_for(entries: Sequence[FileEntry], *, sha256: str, size_bytes: int) -> ManifestRef:
    """The reference summarising a manifest file holding `entries` (written by the caller)."""
    if not entries:
        raise InvalidArgumentError("a manifest lists at least one entry")
    live = [e for e in entries if e.removed_ts is None]
    removed = [e.removed_ts for e in entries if e.removed_ts is not None]
    return ManifestRef(
        path=manifest_path(sha256),
        sha256=sha256,
        size_bytes=size_bytes,
        entry_count=len(entries),
        live_count=len(live),
        live_bytes=sum(e.size_bytes for e in live),
        live_rows=sum(e.row_count for e in live),
        min_added_ts=min(e.added_ts for e in entries),
        max_added_ts=max(e.added_ts for e in entries),
        max_removed_ts=max(removed, default=0),
    )


def fold_removals(
    ref: ManifestRef, entries: Sequence[FileEntry], deletes: Mapping[str, int]
) -> list[FileEntry] | None:
    """The entries of `ref` with its truncation and the delete entries folded in, or None when
    the manifest needs no rewrite (folding changes none of its entries)."""
    out = []
    changed = False
    for e in entries:
        gone = effective_removed_ts(e, ref, deletes)
        changed = changed or gone != e.removed_ts
        out.append(e if gone == e.removed_ts else replace(e, removed_ts=gone))
    # Unchanged (deletes of entries the file already removes earlier): the reference stays and
    # the delete entries are folded as no-ops. So every rewrite has new content, a new sha256.
    return out if changed else None


def commit_boundary_prefix(loose: Sequence[FileEntry], keep: int) -> int:
    """How many of the oldest loose entries a compaction moves so that at most `keep` stay,
    cut between commits (never inside one commit's entries)."""
    if keep < 0:
        raise InvalidArgumentError("keep must be >= 0", details={"keep": keep})
    n = max(0, len(loose) - keep)
    while 0 < n < len(loose) and loose[n].added_ts == loose[n - 1].added_ts:
        n -= 1
    return n


def validate_ref(ref: ManifestRef, what: str = "manifest") -> None:
    """Shape checks of a reference a compaction adds (state-independent)."""
    if not isinstance(ref.sha256, str) or not _SHA256_HEX.fullmatch(ref.sha256):
        raise InvalidArgumentError(f"{what}: sha256 must be 64 lowercase hex digits")
    if ref.path != manifest_path(ref.sha256):
        raise InvalidArgumentError(
            f"{what}: path must be {manifest_path(ref.sha256)!r} (content-addressed)",
            details={"path": ref.path},
        )
    numbers = (
        ref.size_bytes,
        ref.entry_count,
        ref.live_count,
        ref.live_bytes,
        ref.live_rows,
        ref.min_added_ts,
        ref.max_added_ts,
        ref.max_removed_ts,
    )
    if not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_TS for n in numbers
    ):
        raise InvalidArgumentError(
            f"{what}: sizes, counts and timestamps must be integers in 0..2^64-1"
        )
    if not 0 < ref.size_bytes <= limits.MANIFEST_BYTES_MAX:
        raise limit_exceeded(
            "MANIFEST_BYTES_MAX", limits.MANIFEST_BYTES_MAX, ref.size_bytes, f"{what} bytes"
        )
    if not 1 <= ref.entry_count <= limits.MANIFEST_ENTRIES_MAX:
        raise limit_exceeded(
            "MANIFEST_ENTRIES_MAX", limits.MANIFEST_ENTRIES_MAX, ref.entry_count, f"{what} entries"
        )
    if ref.live_count > ref.entry_count:
        raise InvalidArgumentError(f"{what}: live_count exceeds entry_count")
    if not 0 < ref.min_added_ts <= ref.max_added_ts:
        raise InvalidArgumentError(f"{what}: need 0 < min_added_ts <= max_added_ts")
    if (ref.max_removed_ts == 0) != (ref.live_count == ref.entry_count):
        raise InvalidArgumentError(f"{what}: max_removed_ts is 0 exactly when nothing is removed")
    if ref.max_removed_ts and ref.max_removed_ts <= ref.min_added_ts:
        raise InvalidArgumentError(f"{what}: an entry is removed before any was added")
    if ref.removed_all_ts is not None:
        raise InvalidArgumentError(f"{what}: a new manifest cannot carry a truncation")


def ref_from_data(data: object) -> ManifestRef:
    """A reference from its `to_data` list. Raises InvalidArgumentError on a bad shape (the
    snapshot and command decoders turn it into their own error)."""
    if not isinstance(data, list) or len(data) != 11:
        raise InvalidArgumentError("a manifest reference is a list of 11 fields")
    ints = data[2:10]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in ints):
        raise InvalidArgumentError("manifest reference numbers must be integers")
    if not isinstance(data[0], str) or not isinstance(data[1], str):
        raise InvalidArgumentError("manifest reference path and sha256 must be strings")
    truncated = data[10]
    if truncated is not None and (not isinstance(truncated, int) or isinstance(truncated, bool)):
        raise InvalidArgumentError("manifest reference removed_all_ts must be an integer or nil")
    return ManifestRef(
        path=data[0],
        sha256=data[1],
        size_bytes=data[2],
        entry_count=data[3],
        live_count=data[4],
        live_bytes=data[5],
        live_rows=data[6],
        min_added_ts=data[7],
        max_added_ts=data[8],
        max_removed_ts=data[9],
        removed_all_ts=truncated,
    )


# --------------------------------------------------------------------------------------------
# Planning a compaction (pure: the caller does the reads and writes)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionPlan:
    """What one compaction does. The caller writes each batch and each rewrite as a manifest
    file, then proposes `compaction_command` with their references."""

    loose: tuple[FileEntry, ...]  # the oldest loose entries, moved (cut between commits)
    deletes: tuple[DeleteEntry, ...]  # the oldest delete entries, folded in
    rewrites: tuple[tuple[ManifestRef, tuple[FileEntry, ...]], ...]  # old ref -> its new entries
    # `loose` in files of <= entries_max entries (cut between commits), then the entries split
    # off rewrites because they are dead at the GC threshold (one manifest per rewrite).
    batches: tuple[tuple[FileEntry, ...], ...]
    # Neighbouring manifests merged into one (old refs, in reference order -> the merged
    # entries), once the table holds more than MANIFEST_MERGE_AT manifests.
    merges: tuple[tuple[tuple[ManifestRef, ...], tuple[FileEntry, ...]], ...] = ()


def plan_compaction(
    *,
    loose: Sequence[FileEntry],
    deletes: Sequence[DeleteEntry],
    refs: Sequence[ManifestRef],
    read: Callable[[ManifestRef], Sequence[FileEntry]],
    keep_loose: int = 0,
    entries_max: int = limits.MANIFEST_ENTRIES_MAX,
    rewrites_max: int = limits.MANIFEST_REWRITES_MAX,
    gc_threshold: int = 0,
    merge_at: int | None = None,
) -> CompactionPlan | None:
    """Plan moving all but the newest `keep_loose` loose entries into new manifests, and
    folding the oldest delete entries and truncations into rewritten manifests, at most
    `rewrites_max` of them (so the command stays bounded however the deletes spread; the rest
    waits for the next compaction). With the table's `gc_threshold`, a rewritten manifest's
    entries dead at it are split off into a manifest of their own, which is then dead and
    GC deletes their files (`dead_at`); manifests holding such entries are rewritten for that
    too, as room allows. When the table would hold more than `merge_at` (default
    MANIFEST_MERGE_AT) manifests, runs of neighbouring manifests are merged into ones of at
    most `entries_max` entries (`_merges`). `read(ref)` returns a manifest's entries
    (verified); it is called only for manifests that may need a rewrite or a merge: for the
    delete entries, only those holding an entry added before a delete entry considered (a
    path with a pending delete entry cannot be added again, so no newer manifest lists it).
    None: nothing to do."""
    if not 1 <= entries_max <= limits.MANIFEST_ENTRIES_MAX:
        raise InvalidArgumentError(
            f"entries_max must be in 1..{limits.MANIFEST_ENTRIES_MAX}",
            details={"entries_max": entries_max},
        )
    if not 1 <= rewrites_max <= limits.MANIFEST_REWRITES_MAX:
        raise InvalidArgumentError(
            f"rewrites_max must be in 1..{limits.MANIFEST_REWRITES_MAX}",
            details={"rewrites_max": rewrites_max},
        )
    folded: list[DeleteEntry] = []
    rewrites: list[tuple[ManifestRef, tuple[FileEntry, ...]]] = []
    graveyards: list[tuple[FileEntry, ...]] = []
    chosen: dict[str, None] = {}
    contents: dict[str, Sequence[FileEntry]] = {}
    truncated = [r for r in refs if r.removed_all_ts is not None]
    # Manifests whose removed entries are all dead at the threshold, beside live ones.
    splittable = [
        r
        for r in refs
        if gc_threshold and r.live_count > 0 and 0 < r.max_removed_ts <= gc_threshold
    ]
    if deletes or truncated or splittable:
        # Only manifests that may need a rewrite are read.
        contents = {r.sha256: read(r) for r in [*truncated, *splittable]}
        # Every manifest listing a path: readers apply a delete entry to each entry of its
        # path, so it is folded into all of them or none (a path can sit in two manifests when a
        # commit added it again after its first entry left the loose entries).
        owners: dict[str, list[str]] = {}

        def note_owner(sha: str, entries: Sequence[FileEntry]) -> None:
            for e in entries:
                owners.setdefault(e.path, []).append(sha)

        for sha, entries in contents.items():
            note_owner(sha, entries)
        # While a delete entry of a path waits, apply refuses any commit adding the path, so
        # every entry of it was added before the removal: only manifests holding an entry
        # older than the delete entry can list its path. Those are read as the deletes (oldest
        # first) need them, so manifests newer than the folded deletes are not read at all.
        by_age = sorted(refs, key=lambda r: r.min_added_ts)
        unread = 0  # by_age[:unread] are read (or were in `contents` already)
        for d in deletes:  # the oldest first: the command folds a prefix of them
            while unread < len(by_age) and by_age[unread].min_added_ts < d.removed_ts:
                ref = by_age[unread]
                unread += 1
                if ref.sha256 not in contents:
                    contents[ref.sha256] = read(ref)
                    note_owner(ref.sha256, contents[ref.sha256])
            new = [sha for sha in dict.fromkeys(owners.get(d.path, ())) if sha not in chosen]
            if new and len(chosen) + len(new) > rewrites_max:
                break
            chosen.update(dict.fromkeys(new))
            folded.append(d)
        for r in [*truncated, *splittable]:
            if len(chosen) >= rewrites_max:
                break
            chosen.setdefault(r.sha256, None)
        gone = {d.path: d.removed_ts for d in folded}
        for ref in refs:
            if ref.sha256 not in chosen:
                continue
            original = contents[ref.sha256]
            changed = fold_removals(ref, original, gone)
            entries = list(original) if changed is None else changed
            kept = [e for e in entries if not _dead(e, gc_threshold)]
            buried = [e for e in entries if _dead(e, gc_threshold)]
            if kept and buried:
                rewrites.append((ref, tuple(kept)))
                graveyards.append(tuple(buried))
            elif changed is not None:
                rewrites.append((ref, tuple(changed)))
    room = limits.MAX_MANIFESTS_PER_COMPACTION - 2 * len(rewrites) - len(graveyards)
    batches = _batches(loose[: commit_boundary_prefix(loose, keep_loose)], entries_max)
    batches = batches[: max(0, room)]  # whole batches: the cut stays between commits
    moved = tuple(e for batch in batches for e in batch)
    merges = _merges(
        refs,
        skip=chosen,
        gone={d.path: d.removed_ts for d in folded},
        read=lambda r: contents[r.sha256] if r.sha256 in contents else read(r),
        excess=len(refs)
        + len(batches)
        + len(graveyards)
        - (limits.MANIFEST_MERGE_AT if merge_at is None else merge_at),
        parts=room - len(batches),
        entries_max=entries_max,
        gc_threshold=gc_threshold,
    )
    if not moved and not folded and not rewrites and not merges:
        return None
    return CompactionPlan(
        loose=moved,
        deletes=tuple(folded),
        rewrites=tuple(rewrites),
        batches=(*batches, *graveyards),
        merges=merges,
    )


def _merges(
    refs: Sequence[ManifestRef],
    *,
    skip: Mapping[str, None],
    gone: Mapping[str, int],
    read: Callable[[ManifestRef], Sequence[FileEntry]],
    excess: int,
    parts: int,
    entries_max: int,
    gc_threshold: int,
) -> tuple[tuple[tuple[ManifestRef, ...], tuple[FileEntry, ...]], ...]:
    """Groups of neighbouring manifests (in reference order) of at most `entries_max`
    entries together, each merged into one, oldest first, until `excess` manifests fewer,
    `parts` (manifests added + replaced) or MANIFEST_MERGE_ENTRIES_MAX entries read run out.
    Only plain live manifests take part: not those rewritten by this compaction (`skip`),
    truncated ones, ones without live entries (GC drops them whole) or holding entries dead at
    the GC threshold (rewritten instead); a group may span them, so its ts range can overlap
    theirs, which changes no answer (`expand` orders entries by added_ts, and a merge never
    splits a commit). A merge keeps every entry as it was, with the folded delete entries
    (`gone`) applied."""
    if excess <= 0 or parts < 3:
        return ()
    runs: list[list[ManifestRef]] = [[]]
    size = 0
    for ref in sort_refs(refs):
        if (
            ref.sha256 in skip
            or ref.removed_all_ts is not None
            or ref.live_count == 0
            or (gc_threshold and 0 < ref.max_removed_ts <= gc_threshold)
        ):
            continue
        if size + ref.entry_count > entries_max:
            runs.append([])
            size = 0
        runs[-1].append(ref)
        size += ref.entry_count
    out: list[tuple[tuple[ManifestRef, ...], tuple[FileEntry, ...]]] = []
    budget = limits.MANIFEST_MERGE_ENTRIES_MAX
    for run in runs:
        if excess <= 0:
            break
        if len(run) < 2:
            continue
        entries_in = sum(r.entry_count for r in run)
        if len(run) + 1 > parts or entries_in > budget:
            break
        merged: list[FileEntry] = []
        for ref in run:
            for e in read(ref):
                gone_ts = effective_removed_ts(e, ref, gone)
                merged.append(e if gone_ts == e.removed_ts else replace(e, removed_ts=gone_ts))
        merged.sort(key=lambda e: e.added_ts)  # stable: each commit's own order stays
        out.append((tuple(run), tuple(merged)))
        parts -= len(run) + 1
        budget -= entries_in
        excess -= len(run) - 1
    return tuple(out)


def _dead(entry: FileEntry, threshold: int) -> bool:
    return bool(threshold) and entry.removed_ts is not None and entry.removed_ts <= threshold


def _batches(moved: Sequence[FileEntry], entries_max: int) -> tuple[tuple[FileEntry, ...], ...]:
    """`moved` in batches of at most `entries_max` entries, cut only between commits, so every
    commit's entries sit in one manifest and manifests' ts ranges never overlap (which makes
    `sort_refs` the commit order). A single commit larger than `entries_max` is one batch (a
    commit has at most MAX_FILES_PER_COMMIT <= MANIFEST_ENTRIES_MAX entries)."""
    out: list[tuple[FileEntry, ...]] = []
    start = 0
    while start < len(moved):
        end = min(start + entries_max, len(moved))
        if end < len(moved):
            cut = end
            while cut > start and moved[cut].added_ts == moved[cut - 1].added_ts:
                cut -= 1
            if cut == start:  # one commit fills the batch: take all of it
                cut = end
                while cut < len(moved) and moved[cut].added_ts == moved[cut - 1].added_ts:
                    cut += 1
            end = cut
        out.append(tuple(moved[start:end]))
        start = end
    return tuple(out)


def compaction_command(
    plan: CompactionPlan,
    *,
    table: TableName,
    table_id: int,
    rewritten: Sequence[ManifestRef],
    added: Sequence[ManifestRef],
    merged: Sequence[ManifestRef] = (),
    request_id: str = "",
) -> CompactManifest:
    """The CompactManifest for `plan`, once its rewrites (`rewritten`, parallel to
    plan.rewrites), batches (`added`, parallel to plan.batches) and merges (`merged`, parallel
    to plan.merges) are written."""
    from metastore.commands import CompactManifest  # commands imports this module

    if (
        len(rewritten) != len(plan.rewrites)
        or len(added) != len(plan.batches)
        or len(merged) != len(plan.merges)
    ):
        raise InvalidArgumentError("one written manifest per rewrite, per batch and per merge")
    return CompactManifest(
        request_id=request_id,
        table=table,
        table_id=table_id,
        loose_count=len(plan.loose),
        loose_digest=entries_digest(plan.loose),
        deletes_count=len(plan.deletes),
        deletes_digest=deletes_digest(plan.deletes),
        replaces=tuple(
            ReplacedManifest(sha256=old.sha256, removed_all_ts=old.removed_all_ts)
            for old in [
                *(old for old, _ in plan.rewrites),
                *(old for group, _ in plan.merges for old in group),
            ]
        ),
        adds=(*rewritten, *merged, *added),
    )
