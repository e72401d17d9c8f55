"""Small-file compaction of a table's data: `bridge.optimize(table)`, `metastore table optimize`.

    result = bridge.optimize("sales.orders", target_file_bytes=128 * 1024**2, progress=print)

Why: a streaming writer commits a few small Parquet files per micro-batch, and a table read
later pays per file (footers, tasks, listing). Optimize rewrites the small files into files of
about `target_file_bytes` and commits the swap atomically.

What it does, per chunk (at most `CHUNK_FILES_MAX` files / `CHUNK_BYTES_MAX` bytes):
1. One bridge batch pinned at the current Top S (leased like any writing batch) lists the
   table's live files at S and picks the small ones (below `small_file_bytes`, default 3/4 of
   the target); fewer than `min_files` small files is nothing to do.
2. Spark reads them with the pinned write columns, by field id (a file without any field ids
   by name), exactly as every reader of the table does (a column added later with a DEFAULT
   reads its existence default; write-only columns of a running schema change job are read
   and written too), and `BatchContext.write` writes them back as ceil(bytes / target) files.
   Unless they hold exactly the rows the small files' entries record (a session that skips
   unreadable files reads fewer), nothing is committed (OptimizeError).
3. ONE commit removes the small files and adds the new ones. Readers see the same rows at every
   timestamp: before the commit's ts the old files, from it on the new ones. A concurrent
   writer is never lost: appends add other files and do not touch these, and a commit that
   removed or overwrote one of them first makes this commit fail whole (DATA_FILE_CONFLICT,
   retryable), after which the chunk is planned again at a fresh Top, at most `ATTEMPTS_MAX`
   times in a row (a refusal after which fewer of the run's small files are left than at the
   previous one is progress by another writer, another optimize typically, and is not counted).
A run rewrites only files that were small at its first listing: files written by this run are
never picked again (paths are never reused), nor are those a writer added meanwhile (a stream
adding small files as fast as chunks are rewritten kept a run going forever; the next run takes
them), so a run ends.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from hlc import to_iso
from spark_bridge.bridge import BatchError
from spark_bridge.conform import pinned_struct
from spark_bridge.files import rows_not_kept, take_chunk

if TYPE_CHECKING:
    from metastore.client import SyncMetastoreClient
    from spark_bridge.bridge import MetastoreBridge

TARGET_FILE_BYTES_DEFAULT: Final = 128 * 1024**2
TARGET_FILE_BYTES_MIN: Final = 1024  # below this, "optimizing" only makes more files
MIN_FILES_DEFAULT: Final = 2  # rewriting one small file into one small file gains nothing
CHUNK_FILES_MAX: Final = 1_000  # files one commit removes (the metastore allows 10k per commit)
CHUNK_BYTES_MAX: Final = 16 * 1024**3  # bytes one chunk reads
ATTEMPTS_MAX: Final = 5  # plans of one chunk in all when its commit is refused (retryable)
RETRY_PAUSE_S: Final = 0.5  # times the attempt number

Progress = Callable[[str], None]


class OptimizeError(RuntimeError):
    """An optimize that cannot go on. `code` is a metastore wire code (cli.errors maps it to an
    exit code); `retryable` says whether running it again later may succeed."""

    code = "INVALID_ARGUMENT"
    retryable = False

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizeResult:
    table: str
    files_before: int  # live files at the first listing
    small_files: int  # of which small (below small_file_bytes), at the first listing
    files_rewritten: int  # small files removed by this run's commits
    files_written: int  # files added in their place
    bytes_rewritten: int
    rows_rewritten: int
    commits: int
    commit_ts: int | None  # the last commit (None: nothing to do)
    attempts: int  # chunk plans in all (commits + refused ones)
    dry_run: bool = False

    def line(self) -> str:
        if self.dry_run:
            return (
                f"{self.table}: {self.small_files} of {self.files_before} live files are small; "
                f"a run would rewrite {self.files_rewritten} of them ({self.bytes_rewritten} "
                f"bytes) into about {self.files_written} file(s)"
            )
        if not self.commits:
            return (
                f"{self.table}: nothing to optimize ({self.small_files} small files of "
                f"{self.files_before})"
            )
        return (
            f"{self.table}: {self.files_rewritten} small files ({self.rows_rewritten} rows, "
            f"{self.bytes_rewritten} bytes) rewritten into {self.files_written} file(s) in "
            f"{self.commits} commit(s), last at {to_iso(self.commit_ts or 0)}"
        )


def optimize(
    bridge: MetastoreBridge,
    table: str,
    *,
    target_file_bytes: int = TARGET_FILE_BYTES_DEFAULT,
    small_file_bytes: int | None = None,
    min_files: int = MIN_FILES_DEFAULT,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> OptimizeResult:
    """Rewrite `table`'s small files into files of about `target_file_bytes`. See the module
    docstring. `dry_run` lists and reports what a run would rewrite, and commits nothing."""
    run = OptimizeRun(
        bridge.client,
        table,
        target_file_bytes=target_file_bytes,
        small_file_bytes=small_file_bytes,
        min_files=min_files,
        progress=progress,
    )
    return run.dry() if dry_run else run.run(bridge)


class OptimizeRun:
    """One optimize of one table: its settings (checked here: OptimizeError) and counters.
    `dry()` needs only a client (the CLI's --dry-run starts no Spark); `run()` a bridge."""

    def __init__(
        self,
        client: SyncMetastoreClient,
        table: str,
        *,
        target_file_bytes: int = TARGET_FILE_BYTES_DEFAULT,
        small_file_bytes: int | None = None,
        min_files: int = MIN_FILES_DEFAULT,
        progress: Progress | None = None,
    ) -> None:
        if target_file_bytes < TARGET_FILE_BYTES_MIN:
            raise OptimizeError(
                f"target file size {target_file_bytes} bytes is below the minimum of "
                f"{TARGET_FILE_BYTES_MIN}",
                details={"target_file_bytes": target_file_bytes},
            )
        small = target_file_bytes * 3 // 4 if small_file_bytes is None else small_file_bytes
        if not 0 < small <= target_file_bytes:
            raise OptimizeError(
                f"small file size {small} must be above 0 and at most the target "
                f"({target_file_bytes} bytes)",
                details={"small_file_bytes": small, "target_file_bytes": target_file_bytes},
            )
        if min_files < 2:
            raise OptimizeError(
                f"min_files must be at least 2 (got {min_files}): one small file rewritten is "
                "one small file again",
                details={"min_files": min_files},
            )
        self.client = client
        self.table = table
        self.target_bytes = target_file_bytes
        self.small_bytes = small
        self.min_files = min_files
        self.say: Progress = progress or (lambda _text: None)
        self.written_paths: set[str] = set()  # never picked again
        # Paths of the small files at the first listing: the only ones this run rewrites.
        self.first_small: frozenset[str] | None = None
        self.small_left: int | None = None  # of those, still live at the last listing
        self.files_before: int | None = None
        self.small_before = 0
        self.rewritten = 0
        self.written = 0
        self.bytes = 0
        self.rows = 0
        self.commits = 0
        self.attempts = 0
        self.commit_ts: int | None = None

    def _small(self, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            f
            for f in files
            if int(f.get("size_bytes") or 0) < self.small_bytes
            and f["path"] not in self.written_paths
            and (self.first_small is None or f["path"] in self.first_small)
        ]

    def _note_first_listing(self, files: list[dict[str, Any]], small: list[dict[str, Any]]) -> None:
        if self.files_before is None:
            self.files_before = len(files)
            self.small_before = len(small)
            self.first_small = frozenset(str(f["path"]) for f in small)

    def result(self, *, dry_run: bool = False) -> OptimizeResult:
        return OptimizeResult(
            table=self.table,
            files_before=self.files_before or 0,
            small_files=self.small_before,
            files_rewritten=self.rewritten,
            files_written=self.written,
            bytes_rewritten=self.bytes,
            rows_rewritten=self.rows,
            commits=self.commits,
            commit_ts=self.commit_ts,
            attempts=self.attempts,
            dry_run=dry_run,
        )

    def dry(self) -> OptimizeResult:
        """List at the HLC's now, as a run's first chunk would, and count."""
        listing = self.client.files(self.table)
        files = list(listing["files"])
        small = self._small(files)
        self._note_first_listing(files, small)
        if len(small) >= self.min_files:
            self.rewritten = len(small)
            self.bytes = sum(int(f.get("size_bytes") or 0) for f in small)
            self.rows = sum(int(f.get("row_count") or 0) for f in small)
            self.written = _output_files(self.bytes, self.target_bytes)
        return self.result(dry_run=True)

    def run(self, bridge: MetastoreBridge) -> OptimizeResult:
        refused = 0
        left_at_refusal: int | None = None  # this run's small files left at the last refusal
        while True:
            self.attempts += 1
            try:
                more = self._chunk(bridge)
            except BatchError as exc:
                # Fewer of this run's small files left than at the previous refusal: another
                # writer (another optimize, typically, that took the same chunk) made progress,
                # so the refusal costs no attempt. The run's files only shrink (it takes only
                # those small at its first listing), so such refusals are bounded by them.
                left = self.small_left
                progressed = (
                    left is not None and left_at_refusal is not None and left < left_at_refusal
                )
                left_at_refusal = left
                if not progressed:
                    refused += 1
                if not exc.retryable or refused >= ATTEMPTS_MAX:
                    raise
                reason = exc.cause or exc
                self.say(f"{self.table}: commit refused ({reason}); planning the chunk again")
                time.sleep(RETRY_PAUSE_S * refused)
                continue
            refused = 0
            if not more:
                return self.result()

    def _chunk(self, bridge: MetastoreBridge) -> bool:
        """One batch at a fresh Top: rewrite up to one chunk of small files in one commit.
        True while small files are left for another chunk."""
        top = bridge.client.clock.now()
        txn_id = f"optimize:{self.table}:{uuid.uuid4()}"
        with bridge.batch(
            writes=[self.table], top=top, read_ts=top, txn_id=txn_id, mark_txn_id=False
        ) as b:
            pin = b.pinned[self.table]
            location, files = b.files(self.table)
            small = self._small(files)
            self._note_first_listing(files, small)
            self.small_left = len(small)
            chunk = (
                take_chunk(small, files_max=CHUNK_FILES_MAX, bytes_max=CHUNK_BYTES_MAX)
                if len(small) >= self.min_files
                else []
            )
            if len(chunk) < self.min_files:
                chunk = []
            self.say(
                f"{self.table}: {len(files)} live files at {to_iso(top)}, {len(small)} small"
                + (f"; rewriting {len(chunk)}" if chunk else "; nothing to rewrite")
            )
            if chunk:
                size = sum(int(f.get("size_bytes") or 0) for f in chunk)
                # As every reader reads them: by field id, a file without any by name.
                df = b.read_files(location, chunk, pinned_struct(pin.write_columns))
                new_files = b.write(self.table, df.coalesce(_output_files(size, self.target_bytes)))
                _check_rows_kept(self.table, chunk, new_files)
                b.remove(self.table, [str(f["path"]) for f in chunk])
        if not chunk:
            return False
        self.written_paths.update(f.path for f in new_files)
        self.rewritten += len(chunk)
        self.written += len(new_files)
        self.bytes += size
        self.rows += sum(int(f.get("row_count") or 0) for f in chunk)
        self.commits += 1
        self.commit_ts = b.report.commit_ts
        self.say(
            f"{self.table}: committed {len(chunk)} small files as {len(new_files)} at "
            f"{to_iso(b.report.commit_ts or 0)}"
        )
        return len(small) - len(chunk) >= self.min_files


def _check_rows_kept(table: str, chunk: list[dict[str, Any]], new_files: list[Any]) -> None:
    """Raise OptimizeError (so the batch commits nothing) unless the files written hold as
    many rows as the files they replace (`files.rows_not_kept`)."""
    lost = rows_not_kept(chunk, new_files)
    if lost:
        raise OptimizeError(
            f"{table}: the {len(chunk)} small files hold {lost['rows_expected']} rows but Spark "
            f"read {lost['rows_read']} of them (a file unreadable or missing, skipped by the "
            "session's spark.sql.files.ignoreCorruptFiles / ignoreMissingFiles?); nothing was "
            "committed",
            details={"table": table, **lost},
        )


def _output_files(size_bytes: int, target_bytes: int) -> int:
    return max(1, math.ceil(size_bytes / target_bytes))
