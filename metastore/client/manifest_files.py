"""Manifest files on disk: write, read and verify them; expand listings; compact a table.

The state machine only holds references (metastore.manifests); this module does the I/O on the
client side (the CLI, the bridge's driver and its executors). A manifest is a Parquet file
`<location>/_manifests/<sha256>.parquet` with one row per file entry (path, size_bytes,
row_count, added_ts, removed_ts; HLC timestamps as uint64) in commit order, named by the
sha256 of its bytes. Reading checks the size and the hash before parsing: a missing, truncated
or altered manifest raises ManifestUnreadableError, never a wrong file list.

No PySpark here: the bridge calls `read_live` on executors.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from metastore import limits
from metastore.client.parquet import pyarrow_uri
from metastore.commands import CompactManifest, TableName, compact_manifest_to_request
from metastore.errors import (
    InvalidArgumentError,
    ManifestConflictError,
    ManifestUnreadableError,
)
from metastore.manifests import (
    CompactionPlan,
    DeleteEntry,
    Listing,
    ManifestRef,
    compaction_command,
    expand,
    first_indexes,
    first_of_each_path,
    live_in_manifest,
    plan_compaction,
    ref_for,
    sort_refs,
)
from metastore.txn import FileEntry

log = logging.getLogger(__name__)

_SCHEMA: Final = pa.schema(
    [
        ("path", pa.string()),
        ("size_bytes", pa.int64()),
        ("row_count", pa.int64()),
        ("added_ts", pa.uint64()),
        ("removed_ts", pa.uint64()),
    ],
    metadata={"metastore.manifest": "1"},
)
# A compaction whose view went stale (MANIFEST_CONFLICT) reads the table again this often.
COMPACT_ATTEMPTS_MAX: Final = 5
# Threads reading and checking manifests while a listing is expanded (I/O, sha256 and Parquet
# decoding release the GIL).
MANIFEST_READERS: Final = 8
# Pages of `compaction_view` (bounded by the server's byte budget as well).
VIEW_PAGE_LIMIT: Final = 10_000


def _fs(location: str) -> tuple[pafs.FileSystem, str]:
    """The file system of a table location and the location's path in it. A location pyarrow
    has no file system for is ManifestUnreadableError (typed, like a missing manifest)."""
    if "://" in location and not location.startswith("file://"):
        try:
            fs, path = pafs.FileSystem.from_uri(pyarrow_uri(location))
        except (pa.ArrowException, OSError) as exc:
            reason = f"pyarrow has no filesystem for {location} ({exc})"
            raise ManifestUnreadableError(
                f"manifests of {location}: {reason}",
                details={"path": location, "reason": reason},
            ) from None
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), location.removeprefix("file://").rstrip("/")


# What a reader whose manifest is missing or different does: the metastore only writes them
# once, under their sha256, so someone else (or a storage fault) removed or changed it.
_UNREADABLE_HINT: Final = (
    "check that this process can read the table's location (mounts, credentials) and that "
    "nothing outside the metastore removed or rewrote the file; restore it from a backup of "
    "the location"
)


def encode_manifest(entries: Sequence[FileEntry]) -> bytes:
    """A manifest's bytes (deterministic for the same entries with the same pyarrow)."""
    table = pa.table(
        {
            "path": [e.path for e in entries],
            "size_bytes": [e.size_bytes for e in entries],
            "row_count": [e.row_count for e in entries],
            "added_ts": [e.added_ts for e in entries],
            "removed_ts": [e.removed_ts for e in entries],
        },
        schema=_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def write_manifest(location: str, entries: Sequence[FileEntry]) -> ManifestRef:
    """Write `entries` as a manifest under `location` and return its reference. The file
    appears whole: it is written under a temporary name and renamed. A file already at that
    name (content-addressed: an earlier attempt's) is written again, never taken on trust: it
    may be damaged (a crash after the rename, before its data reached the disk), and, left by
    an attempt that went stale, it may be older than the orphan grace, so the orphan scan could
    delete it once this compaction references it; the new file is whole and young.

    On a local file system the file and the directory entries are fsynced before this returns:
    the compaction that references the manifest is durable once proposed and takes its entries
    out of the state, so a manifest lost to a power failure would lose them."""
    data = encode_manifest(entries)
    sha = hashlib.sha256(data).hexdigest()
    ref = ref_for(entries, sha256=sha, size_bytes=len(data))
    fs, root = _fs(location)
    final = f"{root}/{ref.path}"
    # GC's orphan scan knows this shape (gc_worker `_MANIFEST_TMP_NAME`): a compactor killed
    # before the rename leaves the file, and the scan deletes it once older than its grace.
    tmp = f"{final}.{uuid.uuid4().hex[:12]}.tmp"
    if isinstance(fs, pafs.LocalFileSystem):
        _write_local(final, tmp, data)
        return ref
    fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
    try:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, final)
    except BaseException:
        _discard(lambda: fs.delete_file(tmp))
        raise
    return ref


def _discard(delete: Callable[[], None]) -> None:
    """Delete a failed write's temporary file now rather than after the orphan grace."""
    # Already gone, or the store is failing too: the original error is the news.
    with contextlib.suppress(OSError, pa.ArrowException):
        delete()


def _write_local(final: str, tmp: str, data: bytes) -> None:
    directory = os.path.dirname(final)
    os.makedirs(directory, exist_ok=True)
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
    except OSError as exc:
        _discard(lambda: os.unlink(tmp))
        if exc.filename is not None:
            raise
        # A write's or an fsync's error names no file: say which one the disk refused.
        raise OSError(exc.errno, exc.strerror or str(exc), final) from exc
    except BaseException:
        _discard(lambda: os.unlink(tmp))
        raise
    for path in (directory, os.path.dirname(directory)):  # the file's entry, then _manifests'
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            # The file stays (unreferenced: the orphan scan deletes it); nothing is proposed.
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror or str(exc), path) from exc


def read_manifest(location: str, ref: ManifestRef) -> list[FileEntry]:
    """A manifest's entries, after checking its size and sha256 against `ref`."""
    cols = _verified_table(location, ref).to_pydict()
    return [
        FileEntry(path=p, size_bytes=size, row_count=rows, added_ts=added, removed_ts=removed)
        for p, size, rows, added, removed in zip(
            cols["path"],
            cols["size_bytes"],
            cols["row_count"],
            cols["added_ts"],
            cols["removed_ts"],
            strict=True,
        )
    ]


def read_live(
    location: str, ref_view: Mapping[str, Any], deletes: Mapping[str, int], ts: int
) -> list[tuple[str, int, int, int]]:
    """(path, size_bytes, row_count, added_ts) of one manifest's entries live at `ts`: the unit
    of work an executor runs (plain data in and out, picklable)."""
    ref = ManifestRef(**dict(ref_view))
    live = live_in_manifest(ref, read_manifest(location, ref), deletes, ts)
    return [(e.path, e.size_bytes, e.row_count, e.added_ts) for e in live]


# --------------------------------------------------------------------------------------------
# Listings (the `files` reply)
# --------------------------------------------------------------------------------------------


def listing_of(reply: Mapping[str, Any]) -> Listing:
    """A `files` reply (every page merged) as a Listing."""
    return Listing(
        ts=int(reply["as_of"]),
        files=tuple(
            FileEntry(
                path=f["path"],
                size_bytes=int(f["size_bytes"]),
                row_count=int(f["row_count"]),
                added_ts=int(f.get("added_ts") or 0),
            )
            for f in reply.get("files", [])
        ),
        manifests=tuple(ManifestRef(**dict(m)) for m in reply.get("manifests", [])),
        deletes=tuple(
            DeleteEntry(path=str(d[0]), removed_ts=int(d[1])) for d in reply.get("deletes", [])
        ),
    )


def expand_reply(
    reply: Mapping[str, Any],
    *,
    read: Callable[[str, ManifestRef], Sequence[FileEntry]] | None = None,
) -> dict[str, Any]:
    """The reply with its manifests expanded into `files` (full totals recomputed). Replies
    without manifests come back unchanged.

    By default the manifests are read in parallel threads and filtered and merged as Arrow
    columns (`_expand_columnar`), which at a million entries is several times faster than
    building an entry object per file; `read` (tests, other stores) takes the entry-by-entry
    path of `metastore.manifests.expand`, whose answer is the same."""
    if not reply.get("manifests"):
        return dict(reply)
    listing = listing_of(reply)
    location = str(reply["location"])
    if read is None:
        return _expand_columnar(reply, listing, location)
    contents = {ref.sha256: read(location, ref) for ref in listing.manifests}
    return _expanded(reply, expand(listing, contents))


def _verified_table(location: str, ref: ManifestRef) -> pa.Table:
    """A manifest as an Arrow table, after checking its size and sha256 against `ref` and
    its columns, row count and required values (ManifestUnreadableError for each)."""
    fs, root = _fs(location)
    path = f"{root}/{ref.path}"

    def unreadable(reason: str) -> ManifestUnreadableError:
        return ManifestUnreadableError(
            f"manifest {ref.path} of {location}: {reason}; {_UNREADABLE_HINT}",
            details={"path": ref.path, "reason": reason},
        )

    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        raise unreadable("missing")
    if info.size is None or info.size > limits.MANIFEST_BYTES_MAX or info.size != ref.size_bytes:
        raise unreadable(f"{info.size} bytes, the reference says {ref.size_bytes}")
    with fs.open_input_file(path) as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise unreadable("sha256 differs from the reference")

    def bad(reason: str) -> ManifestUnreadableError:
        return ManifestUnreadableError(
            f"manifest {ref.path} is not a manifest: {reason}; {_UNREADABLE_HINT}",
            details={"path": ref.path, "reason": reason},
        )

    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise bad(f"unreadable Parquet ({type(exc).__name__})") from None
    if table.schema.remove_metadata() != _SCHEMA.remove_metadata():
        raise bad("unexpected columns")
    if table.num_rows != ref.entry_count:
        raise bad(f"{table.num_rows} rows, the reference says {ref.entry_count}")
    if any(table.column(n).null_count for n in ("path", "size_bytes", "row_count", "added_ts")):
        raise bad("a null in a required column")
    try:
        table.validate(full=True)  # e.g. a string that is not UTF-8
    except pa.ArrowException as exc:
        raise bad(f"invalid columns ({type(exc).__name__})") from None
    if pc.any(_bad_paths(table["path"])).as_py():
        raise bad("an entry path that is not relative to the table location")
    removed = table["removed_ts"]
    if (
        pc.any(pc.less(table["size_bytes"], 0)).as_py()
        or pc.any(pc.less(table["row_count"], 0)).as_py()
        or pc.any(pc.equal(table["added_ts"], 0)).as_py()
        or pc.any(pc.less_equal(removed, table["added_ts"])).as_py()
    ):
        raise bad("a negative size or row count, or an entry not removed after it was added")
    return table


# commands.validate_file_path's rule for one path, in RE2 as one expression (one pass over the
# strings instead of five: each pass costs about 0.27 s of CPU per million ~70-byte paths): a
# leading "/", a scheme "://", a backslash, a segment that is empty, "." or ".." (which also
# catches the empty path), or a control character.
_BAD_PATH: Final = r"^/|://|\\|(^|/)\.{0,2}(/|$)|[\x00-\x1f\x7f]"


def _bad_paths(paths: pa.ChunkedArray) -> pa.ChunkedArray:
    """Per entry path, whether it breaks the rule commits follow (commands.validate_file_path):
    relative to the table location, no scheme, no backslash, no empty, "." or ".." segments,
    no control characters, at most MAX_FILE_PATH_CHARS. A manifest with such a path could
    make readers read, and GC delete, files outside its table. Vectorised: a manifest lists up
    to MANIFEST_ENTRIES_MAX paths."""
    return pc.or_(
        pc.match_substring_regex(paths, _BAD_PATH),
        pc.greater(pc.utf8_length(paths), limits.MAX_FILE_PATH_CHARS),
    )


def _live_columns(
    table: pa.Table, ref: ManifestRef | None, deleted: pa.Array | None, ts: int
) -> pa.Table:
    """The rows of `table` live at `ts`, as `live_in_manifest` decides: added at or before ts,
    and neither their own removal, their manifest's truncation nor a delete entry of their
    path (`deleted`: paths removed at or before ts) at or before ts."""
    mask = pc.less_equal(table["added_ts"], pa.scalar(ts, pa.uint64()))
    # A null removed_ts is "never removed": a comparison with it is null, which counts as live.
    still_there = pc.fill_null(pc.greater(table["removed_ts"], pa.scalar(ts, pa.uint64())), True)
    mask = pc.and_(mask, still_there)
    if deleted is not None and len(deleted):
        mask = pc.and_(mask, pc.invert(pc.is_in(table["path"], value_set=deleted)))
    if ref is not None and ref.removed_all_ts is not None and ref.removed_all_ts <= ts:
        mask = pc.and_(mask, pa.scalar(False))
    return table.filter(mask).select(["path", "size_bytes", "row_count", "added_ts"])


def _ascending(values: pa.ChunkedArray) -> bool:
    """Whether `values` (no nulls) never decrease."""
    if len(values) < 2:
        return True
    flat = values.combine_chunks()
    return bool(pc.all(pc.less_equal(flat.slice(0, len(flat) - 1), flat.slice(1))).as_py())


def _expand_columnar(reply: Mapping[str, Any], listing: Listing, location: str) -> dict[str, Any]:
    ts = listing.ts
    deleted_paths = [d.path for d in listing.deletes if d.removed_ts <= ts]
    deleted = pa.array(deleted_paths, pa.string()) if deleted_paths else None
    refs = sort_refs(listing.manifests)
    workers = max(1, min(MANIFEST_READERS, len(refs)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        tables = list(pool.map(lambda ref: _verified_table(location, ref), refs))
    parts = [_live_columns(t, ref, deleted, ts) for t, ref in zip(tables, refs, strict=True)]
    loose = pa.table(
        {
            "path": [e.path for e in listing.files],
            "size_bytes": [e.size_bytes for e in listing.files],
            "row_count": [e.row_count for e in listing.files],
            "added_ts": [e.added_ts for e in listing.files],
            "removed_ts": [None] * len(listing.files),
        },
        schema=_SCHEMA.remove_metadata(),
    )
    parts.append(_live_columns(loose, None, deleted, ts))
    merged = pa.concat_tables(parts)
    # Commit order: a stable sort by added_ts keeps each commit's own order (as `expand`).
    # Manifests sorted by `sort_refs` usually hold consecutive commits, so the entries are
    # mostly in order already; the check costs ~10 ms per million entries, and the sort's
    # `take` (a copy of every column, ~0.1-0.5 s per million on a busy machine) is skipped
    # when it would return the same rows.
    if not _ascending(merged["added_ts"]):
        merged = merged.take(pc.sort_indices(merged, sort_keys=[("added_ts", "ascending")]))
    # Each path once, as `expand` (the shared rule, `first_indexes`); the C++ check skips the
    # Python pass in the usual case of no path committed twice. `unique`, not `count_distinct`:
    # on one large chunk (what `take` returns) the latter took 0.9-1.2 s for 1M paths, the
    # former 0.4 s (bench-scale's `files` of 1M went from 2.3 s to 4.4 s with it).
    if len(pc.unique(merged["path"])) != merged.num_rows:
        keep = first_indexes(merged["path"].to_pylist())
        if keep is not None:
            merged = merged.take(pa.array(keep, pa.int64()))
    files = merged.to_pylist()
    return {
        **reply,
        "files": files,
        "total_files": len(files),
        "rows": int(pc.sum(merged["row_count"]).as_py() or 0),
        "size_bytes": int(pc.sum(merged["size_bytes"]).as_py() or 0),
        "expanded_manifests": len(reply.get("manifests", [])),
        "manifests": [],
        "deletes": [],
    }


def merge_expanded(
    reply: Mapping[str, Any], per_manifest: Mapping[str, Sequence[tuple[str, int, int, int]]]
) -> dict[str, Any]:
    """Like `expand_reply`, from each manifest's live entries computed elsewhere (executors),
    keyed by sha256."""
    listing = listing_of(reply)
    out: list[FileEntry] = []
    for ref in sort_refs(listing.manifests):
        out.extend(
            FileEntry(path=p, size_bytes=s, row_count=r, added_ts=a)
            for p, s, r, a in per_manifest[ref.sha256]
        )
    out.extend(listing.files)
    out.sort(key=lambda e: e.added_ts)  # stable: each commit's own order stays
    return _expanded(reply, first_of_each_path(out))


def _expanded(reply: Mapping[str, Any], files: Sequence[FileEntry]) -> dict[str, Any]:
    return {
        **reply,
        "files": [
            {
                "path": e.path,
                "size_bytes": e.size_bytes,
                "row_count": e.row_count,
                "added_ts": e.added_ts,
            }
            for e in files
        ],
        "total_files": len(files),
        "rows": sum(e.row_count for e in files),
        "size_bytes": sum(e.size_bytes for e in files),
        "expanded_manifests": len(reply.get("manifests", [])),
        "manifests": [],
        "deletes": [],
    }


# --------------------------------------------------------------------------------------------
# Compaction
# --------------------------------------------------------------------------------------------


def compaction_view(client: Any, table: str) -> dict[str, Any]:
    """Every page of `compaction_view` merged (`client`: a SyncMetastoreClient).

    Pages are not of one moment. The compaction's compare-and-swap catches loose and delete
    entries that changed between pages, but not the manifest set (it rides on the first page)
    the planner judges delete entries against: a delete entry of a path in no manifest it saw
    is folded as a no-op, so a delete entry read after another compaction moved its path into
    a new manifest would be dropped and the file would be live again. So a view of several
    pages is taken only if the table's manifests (the first page's) are the same after the
    last page; else it is read again (MANIFEST_CONFLICT after COMPACT_ATTEMPTS_MAX reads)."""
    for _ in range(COMPACT_ATTEMPTS_MAX):
        first = client.call("compaction_view", {"table": table, "limit": VIEW_PAGE_LIMIT})
        loose, deletes = list(first["loose"]), list(first["deletes"])
        token = first.get("next_page_token")
        if not token:
            return {**first, "next_page_token": None}
        try:
            while token:
                args = {"table": table, "limit": VIEW_PAGE_LIMIT, "page_token": token}
                page = client.call("compaction_view", args)
                loose.extend(page["loose"])
                deletes.extend(page["deletes"])
                token = page.get("next_page_token")
        except ManifestConflictError:
            continue  # it shrank past the next page's offset: read it again
        after = client.call("compaction_view", {"table": table, "limit": 1})
        if (after["table_id"], after["manifests"]) == (first["table_id"], first["manifests"]):
            return {
                **first,
                "loose": loose,
                "deletes": _first_of_each_delete(deletes),
                "next_page_token": None,
            }
        log.info("the manifests of %s changed while its compaction view was read", table)
    raise ManifestConflictError(
        f"{table}: the table's manifests kept changing while its compaction view was read",
        details={"table": table, "what": "compaction_view", "expected": "", "actual": ""},
    )


def _first_of_each_delete(deletes: list[Any]) -> list[Any]:
    """The delete entries of a paged view, each path once. Pages are offsets into the loose
    entries followed by the delete entries, so a commit between two pages that adds loose
    entries moves every delete entry on, and the next page repeats the last few the previous
    one ended with. A path has at most one delete entry in the state, so a repeat is that
    shift: dropping it leaves the delete entries in state order (any other change between
    pages still fails the compaction's compare-and-swap)."""
    seen: set[str] = set()
    out = []
    for d in deletes:
        if d[0] not in seen:
            seen.add(d[0])
            out.append(d)
    return out


def _write_noted(
    location: str,
    written: list[tuple[ManifestRef, Sequence[FileEntry]]],
    entries: Sequence[FileEntry],
) -> ManifestRef:
    """`write_manifest`, noting what was written (for `restore_missing`)."""
    ref = write_manifest(location, entries)
    written.append((ref, entries))
    return ref


def restore_missing(
    location: str,
    written: Sequence[tuple[ManifestRef, Sequence[FileEntry]]],
    say: Callable[[str], None],
) -> None:
    """Write again any manifest of an applied compaction that is no longer on disk. Names are
    content hashes, so a manifest this compaction wrote can be byte for byte one that an
    earlier compaction replaced: apply refuses to reference it while GC has it queued, but GC
    may delete that file after this compactor wrote it (so it wrote nothing new) and report
    it before this compaction applies. The table would then reference a missing manifest and
    every read of it fail; the same bytes written again repair it."""
    fs, root = _fs(location)
    for ref, entries in written:
        info = fs.get_file_info(f"{root}/{ref.path}")
        if info.type == pafs.FileType.File and info.size == ref.size_bytes:
            continue
        log.warning(
            "manifest %s of %s went missing before its compaction applied; writing it again",
            ref.path,
            location,
        )
        say(f"{location}: manifest {ref.path} was deleted meanwhile; wrote it again")
        write_manifest(location, entries)


@dataclass(frozen=True, slots=True)
class WrittenCompaction:
    """A planned compaction whose manifests are written: what remains is to propose its
    CompactManifest (`command`) and, once applied, `restore_missing(location, files)`."""

    plan: CompactionPlan
    rewritten: tuple[ManifestRef, ...]
    added: tuple[ManifestRef, ...]
    merged: tuple[ManifestRef, ...]
    files: tuple[tuple[ManifestRef, Sequence[FileEntry]], ...]  # every manifest written

    def command(self, *, table: TableName, table_id: int, request_id: str) -> CompactManifest:
        return compaction_command(
            self.plan,
            table=table,
            table_id=table_id,
            rewritten=self.rewritten,
            added=self.added,
            merged=self.merged,
            request_id=request_id,
        )


def plan_and_write(
    location: str,
    *,
    loose: Sequence[FileEntry],
    deletes: Sequence[DeleteEntry],
    refs: Sequence[ManifestRef],
    keep_loose: int = 0,
    entries_max: int = limits.MANIFEST_ENTRIES_MAX,
    rewrites_max: int = limits.MANIFEST_REWRITES_MAX,
    gc_threshold: int = 0,
    merge_at: int | None = None,
    say: Callable[[str], None] = lambda _msg: None,
) -> WrittenCompaction | None:
    """Plan a compaction of a table's view (`plan_compaction`, reading the manifests it needs
    under `location`) and write its manifests. None: nothing to do. Used by `compact_table`
    (clients) and by the leader's GC (metastore.daemon.gc_worker), which propose the command
    their own way; both through the same compare-and-swap."""
    plan = plan_compaction(
        loose=loose,
        deletes=deletes,
        refs=refs,
        read=functools.partial(read_manifest, location),
        keep_loose=keep_loose,
        entries_max=entries_max,
        rewrites_max=rewrites_max,
        gc_threshold=gc_threshold,
        merge_at=merge_at,
    )
    if plan is None:
        return None
    written: list[tuple[ManifestRef, Sequence[FileEntry]]] = []
    write = functools.partial(_write_noted, location, written)
    rewritten = [write(entries) for _, entries in plan.rewrites]
    added = []
    for i, batch in enumerate(plan.batches, 1):
        added.append(write(batch))
        say(f"wrote manifest {i}/{len(plan.batches)} ({len(batch)} entries)")
    merged = []
    for group, entries in plan.merges:
        merged.append(write(entries))
        say(f"merged {len(group)} manifests into one ({len(entries)} entries)")
    return WrittenCompaction(
        plan=plan,
        rewritten=tuple(rewritten),
        added=tuple(added),
        merged=tuple(merged),
        files=tuple(written),
    )


def compact_table(
    client: Any,
    table: str,
    *,
    keep_loose: int = 0,
    entries_max: int = limits.MANIFEST_ENTRIES_MAX,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Move `table`'s loose file entries (all but the newest `keep_loose`, cut between commits)
    into manifests and fold its delete entries, in one CompactManifest. A stale view
    (MANIFEST_CONFLICT) is read again, up to COMPACT_ATTEMPTS_MAX times. Returns the
    compaction's result, or {"compacted": False, ...} when there was nothing to do."""
    say = progress or (lambda _msg: None)
    for attempt in range(1, COMPACT_ATTEMPTS_MAX + 1):
        view = compaction_view(client, table)
        location = str(view["location"])
        if not location:
            # Manifests live under the table's location: without one they would be written
            # at the file system's root.
            raise InvalidArgumentError(
                f"{table} has no location, so it has nowhere to keep manifest files",
                details={"table": table},
            )
        loose = [
            FileEntry(path=r[0], size_bytes=r[1], row_count=r[2], added_ts=r[3], removed_ts=r[4])
            for r in view["loose"]
        ]
        deletes = [DeleteEntry(path=d[0], removed_ts=d[1]) for d in view["deletes"]]
        refs = [ManifestRef(**m) for m in view["manifests"]]
        say(
            f"{table}: {len(loose)} loose entries, {len(deletes)} delete entries, "
            f"{len(refs)} manifests"
        )
        written = plan_and_write(
            location,
            loose=loose,
            deletes=deletes,
            refs=refs,
            keep_loose=keep_loose,
            entries_max=entries_max,
            gc_threshold=int(view.get("gc_threshold") or 0),
            say=lambda msg: say(f"{table}: {msg}"),
        )
        if written is None:
            return {
                "table": table,
                "compacted": False,
                "loose_entries": len(loose),
                "manifests": len(refs),
                "deduplicated": False,
            }
        cmd = written.command(
            table=TableName.parse(table),
            table_id=int(view["table_id"]),
            request_id=f"compact-{uuid.uuid4().hex}",
        )
        try:
            result = client.call("compact_manifest", compact_manifest_to_request(cmd))
        except ManifestConflictError as exc:
            # The files just written stay unreferenced (content-addressed, so a later
            # compaction of the same entries reuses them; else GC deletes them as orphans).
            log.info("compaction of %s went stale (attempt %d): %s", table, attempt, exc)
            say(f"{table}: the table changed meanwhile; reading it again")
            continue
        restore_missing(location, written.files, say)
        say(
            f"{table}: moved {result['moved_entries']} entries, folded "
            f"{result['folded_deletes']} deletes; {result['manifests']} manifests"
        )
        return {**result, "compacted": True}
    raise ManifestConflictError(
        f"{table}: the table kept changing during {COMPACT_ATTEMPTS_MAX} compaction attempts",
        details={"table": table, "what": "attempts", "expected": "", "actual": ""},
    )
