"""The backfill of an `ALTER TABLE ... ADD COLUMN c ... NOT NULL DEFAULT x` job (metastore.jobs).

    result = bridge.run_backfill(job_id, progress=print)     # or: metastore job run-backfill 7

Why: while the job's column is write-only every writer fills it (`conform.write_columns`), but
files committed before that lack it. Readers would fill the DEFAULT too (Spark's existence
default), yet a NOT NULL column must be physically present before it becomes public: that is
what makes a later `ALTER COLUMN ... DROP DEFAULT`, or any reader that does not know the
default, safe. The job therefore stops at its "backfill" step until a Spark job has rewritten
every such file and reported it (`job_backfilled`).

What `run_backfill` does:
1. Polls `job_show` until the job is at step "backfill" (telling `progress` what it waits for:
   the versions to activate, leases on older versions); refuses a job that is not an ADD COLUMN
   job or that was cancelled, is being cancelled or was aborted (`JobNotBackfillableError`),
   and gives up after `timeout_s` (`BackfillTimeoutError`).
2. Waits for the backfill step's version to activate (`backfill_from_ts`): from then on no writer
   without the column can commit (the commit rule), so a listing at S >= it sees every file that
   will ever lack the column.
3. Runs one bridge batch pinned at the current Top S (pinned to the backfill version, whose write
   columns include c, leased like any writing batch) that reads the table's file list at S,
   finds the files whose Parquet footer lacks c's field id, reads them with Spark (the pinned
   write columns other than c, by field id; a file without any field ids by name, as every
   reader reads it), writes them again through `BatchContext.write`,
   which fills c with its DEFAULT cast to c's type and writes every field id, and commits ONE
   commit that removes the old files and adds the new ones. Rows are the same before and after,
   apart from the new column; a file removed meanwhile by another commit makes the whole commit
   fail (DATA_FILE_CONFLICT, retryable), never half of it. Unless the files written hold exactly
   the rows the old files' entries record (a session that skips unreadable files reads fewer),
   nothing is committed (BackfillError), as for optimize.
4. Reports `job_backfilled(S, n)`. The daemon refuses the report (BACKFILL_INCOMPLETE,
   retryable) if S predates the backfill step or a writer at an older version committed after
   S; then everything is done again, at most `ATTEMPTS_MAX` times in all (a refused commit
   after which fewer files lack the column than at the previous refusal does not count: another
   run of the job took the chunk, which is progress). A report whose reply
   is lost (a leader change: UNAVAILABLE with the outcome unknown, or TIMEOUT) is looked up in
   the job: accepted (its `backfill_ts` is this S), or sent again after a fresh listing; never
   sent again before the job was read (the job adds up every report's `files_rewritten`).

A job that succeeded (before this run or while it ran: another run's report was accepted, or
none was needed) is not an error: the column is public, which is what a backfill is for. The
result then says `outcome="job_succeeded"` with a `note`, and nothing is reported. Whenever the
job is found no longer at its backfill step, `job_end` (pure, on the job's `job_show` view)
names what became of it.

Many files are rewritten in chunks of at most `CHUNK_FILES_MAX` files / `CHUNK_BYTES_MAX` bytes,
each its own batch and atomic commit, each listing the table again at a fresh Top. The report
carries the S of the last listing: every file it found without the column was in its chunk, so
at that S nothing is left to rewrite. Files already known to carry the column (written by this
run, or checked before) are not read again: paths are never reused.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from hlc import to_iso
from spark_bridge.bridge import BatchError
from spark_bridge.conform import pinned_struct
from spark_bridge.files import (
    rows_not_kept,
    take_chunk,
    top_level_field_ids,
)

if TYPE_CHECKING:
    from metastore.client import SyncMetastoreClient
    from spark_bridge.bridge import MetastoreBridge

ATTEMPTS_MAX: Final = 5  # runs in all when the report or a commit is refused (retryable)
POLL_INTERVAL_S: Final = 0.2
RETRY_PAUSE_S: Final = 0.5  # times the attempt number
CHUNK_FILES_MAX: Final = 1_000  # files one commit removes (the metastore allows 10k per commit)
CHUNK_BYTES_MAX: Final = 16 * 1024**3  # bytes one chunk reads
FOOTER_READERS: Final = 16  # threads reading Parquet footers
# The backfill version activates DD after the step began; a wait much longer than that means
# the clocks are off. Bounded on its own, so a timeout spent waiting for the step still lets it.
ACTIVATION_WAIT_MAX_S: Final = 60.0
ADD_COLUMN: Final = "add_column"
BACKFILL_STEP: Final = "backfill"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
CANCELLED: Final = "cancelled"
ABORTED: Final = "aborted"
# BackfillResult.outcome: this run's report was accepted / the job succeeded without it.
REPORTED: Final = "reported"
JOB_SUCCEEDED: Final = "job_succeeded"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillResult:
    job_id: int
    table: str
    snapshot_ts: int  # S of the accepted report: no file live at S lacks the column
    files_rewritten: int  # old files replaced (0: nothing lacked the column)
    commit_ts: int | None  # the last rewrite commit (None if nothing was rewritten)
    attempts: int  # runs in all (1 unless a report or commit was refused)
    files_written: int = 0
    rows_rewritten: int = 0
    commits: int = 0
    # REPORTED, or JOB_SUCCEEDED: the job had succeeded, or did while this run ran (another
    # run's report, or no backfill needed); `snapshot_ts` is then the accepted report's (0 if
    # none was needed), and `note` says what happened.
    outcome: str = REPORTED
    note: str = ""

    def line(self) -> str:
        commit = to_iso(self.commit_ts) if self.commit_ts else "-"
        if self.outcome != REPORTED:
            rewrote = (
                f"; this run rewrote {self.files_rewritten} files in {self.commits} commit(s) "
                "first (the same rows, with the column)"
                if self.commits
                else ""
            )
            return f"{self.note}{rewrote}"
        return (
            f"job {self.job_id}: backfill of {self.table} reported at {to_iso(self.snapshot_ts)}: "
            f"{self.files_rewritten} files ({self.rows_rewritten} rows) rewritten into "
            f"{self.files_written} in {self.commits} commit(s), last at {commit}; "
            f"{self.attempts} attempt(s)"
        )


class BackfillError(RuntimeError):
    """A backfill that cannot go on. `code` is a metastore wire code (cli.errors maps it to an
    exit code); `retryable` says whether running it again later may succeed."""

    code = "BACKFILL_FAILED"
    retryable = False

    def __init__(self, message: str, *, job_id: int, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.job_id = job_id
        self.details: dict[str, Any] = {"job_id": job_id, **(details or {})}


class JobNotBackfillableError(BackfillError):
    """The job is not an ADD COLUMN ... NOT NULL DEFAULT job, or it will never publish its
    column (cancelled, being cancelled, aborted: its table was dropped): there is nothing to
    backfill. `details["status"]` and `details["step"]` say where the job is."""

    code = "SCHEMA_JOB_STATE"


class BackfillTimeoutError(BackfillError):
    """The job did not reach its backfill step within the timeout (leases on older versions
    held by running batches, usually: `waiting_for` in the details says)."""

    code = "TIMEOUT"
    retryable = True


Progress = Callable[[str], None]


def run_backfill(
    bridge: MetastoreBridge,
    job_id: int,
    *,
    timeout_s: float = 300.0,
    progress: Progress | None = None,
) -> BackfillResult:
    """Wait for `job_id`'s backfill step (at most `timeout_s`), rewrite every live file of its
    table that lacks the column, and report it. See the module docstring."""
    from metastore.errors import MetastoreError, SchemaJobStateError

    say: Progress = progress or (lambda _text: None)
    deadline = time.monotonic() + timeout_s
    job = _wait_for_step(bridge.client, job_id, deadline, say)
    run = _Run(bridge, job, say)
    if job["status"] != RUNNING:
        return run.moved_on(job, attempts=0)  # succeeded before this run
    attempt = 1  # runs in all
    charged = 1  # runs counted against ATTEMPTS_MAX: all but refusals after progress
    lacking_at_refusal: int | None = None  # files lacking the column at the last refusal
    # The snapshot of the last report sent that the job's view has not yet shown refused or
    # lost: it may have been accepted, so nothing is reported again before the job is read
    # (each report adds its files to the job's `files_rewritten`: this run's would count twice).
    reported_ts: int | None = None

    def settled(job: dict[str, Any]) -> BackfillResult | None:
        """The run's result if `job` (read after a failed attempt) says it is over: the job
        moved on, or the report at `reported_ts` was applied before its reply was lost (each
        run's snapshot is a fresh Top, so no other report has this one)."""
        if job["status"] != RUNNING or job["step"] != BACKFILL_STEP:
            return run.moved_on(job, attempts=attempt)
        if reported_ts is not None and job.get("backfill_ts") == reported_ts:
            say(f"job {job_id}: the report at {to_iso(reported_ts)} was accepted")
            return run.result(reported_ts, attempt)
        return None

    while True:
        try:
            if reported_ts is not None:
                # The job could not be read after that report failed: read it first.
                done = settled(bridge.client.job_show(job_id))
                if done is not None:
                    return done
                reported_ts = None  # refused, or lost before it was applied: sent again
            snapshot_ts = run.rewrite()
            say(
                f"job {job_id}: reporting the backfill at {to_iso(snapshot_ts)} "
                f"({run.rewritten} files rewritten)"
            )
            reported_ts = snapshot_ts
            bridge.client.job_backfilled(
                job_id, snapshot_ts=snapshot_ts, files_rewritten=run.rewritten
            )
            return run.result(snapshot_ts, attempt)
        except (SchemaJobStateError, _PinnedPastBackfill) as exc:
            # The job moved on under us: made public (another run's report), or cancelled.
            return run.moved_on(_job_after(bridge.client, job_id, exc), attempts=attempt)
        except (BatchError, MetastoreError) as exc:
            # BACKFILL_INCOMPLETE, a refused commit, or a reply lost to a leader change
            # (UNAVAILABLE "outcome unknown", TIMEOUT): what was committed stays, and the job
            # says below whether a report whose reply was lost was accepted.
            # A refused commit after which fewer files lack the column than at the previous
            # refusal is progress (another run of this job committing the chunk this one
            # planned, typically): it costs no attempt. That count only falls (no writer
            # without the column commits once the backfill step is active), so the free
            # refusals are bounded by it.
            lacking = run.lacking_last
            progressed = (
                isinstance(exc, BatchError)
                and lacking is not None
                and lacking_at_refusal is not None
                and lacking < lacking_at_refusal
            )
            lacking_at_refusal = lacking
            if not exc.retryable or (charged >= ATTEMPTS_MAX and not progressed):
                raise
            reason: Exception = exc.cause if isinstance(exc, BatchError) and exc.cause else exc
            say(f"job {job_id}: attempt {attempt} refused ({reason}); running again")
            time.sleep(RETRY_PAUSE_S * charged)
            attempt += 1
            if not progressed:
                charged += 1
            try:
                job = bridge.client.job_show(job_id)
            except MetastoreError as show_exc:
                if not show_exc.retryable:
                    raise
                continue  # `reported_ts` kept: the next attempt reads the job first
            done = settled(job)
            if done is not None:
                return done  # an accepted report is not sent again: its files count once
            reported_ts = None  # refused, or lost before it was applied: sent again


def succeeded_result(job: dict[str, Any]) -> BackfillResult | None:
    """The result of a run that finds `job` (its `job_show` view) already succeeded before it
    started, or None: nothing to rewrite, so the CLI answers without starting Spark. Pure."""
    if job["status"] != SUCCEEDED:
        return None
    backfill_ts = job.get("backfill_ts")
    return BackfillResult(
        job_id=int(job["job_id"]),
        table=str(job["table"]),
        snapshot_ts=0 if backfill_ts is None else int(backfill_ts),
        files_rewritten=0,
        commit_ts=None,
        attempts=0,
        outcome=JOB_SUCCEEDED,
        note=job_end(job).message,
    )


class _PinnedPastBackfill(Exception):
    """A batch pinned a version without the job's column write-only: the job moved on (its
    view says how)."""


def _job_after(client: SyncMetastoreClient, job_id: int, cause: Exception) -> dict[str, Any]:
    """The job's view once it moved on under a run; what `cause` said if it cannot be read."""
    from metastore.errors import MetastoreError

    try:
        return client.job_show(job_id)
    except MetastoreError as exc:
        raise JobNotBackfillableError(
            f"job {job_id} is no longer at its backfill step ({cause}), and its state cannot "
            f"be read ({exc.code.value}: {exc.message}); `metastore job show {job_id}` says "
            "what became of it",
            job_id=job_id,
        ) from None


@dataclass(frozen=True, slots=True)
class JobEnd:
    """What became of a job that a backfill run finds no longer at its backfill step."""

    done: bool  # its column is public (or being published): nothing left to do, not an error
    message: str


def job_end(job: dict[str, Any]) -> JobEnd:
    """Name what became of `job` (its `job_show` view), for a backfill run that finds it no
    longer at its backfill step (or, running there, being cancelled). Pure."""
    job_id, column, table = int(job["job_id"]), job["column"], job["table"]
    status, step = job["status"], job["step"]
    by = f" by {job['ended_by']}" if job.get("ended_by") else ""
    if status == SUCCEEDED:
        if job.get("backfill_ts") is not None:
            how = (
                f"its backfill was reported at {to_iso(int(job['backfill_ts']))}, "
                f"{job.get('files_rewritten', 0)} files rewritten in all"
            )
        else:
            how = "it needed no backfill"
        return JobEnd(True, f"job {job_id} succeeded: column {column} of {table} is public ({how})")
    if status == CANCELLED:
        return JobEnd(
            False,
            f"job {job_id} was cancelled{by} at step {step}: column {column} was not added to "
            f"{table}; nothing to backfill",
        )
    if status == ABORTED:
        reason = job.get("message") or "its table was dropped"
        return JobEnd(
            False, f"job {job_id} was aborted at step {step} ({reason}); nothing to backfill"
        )
    if job.get("cancel_requested"):
        return JobEnd(
            False,
            f"job {job_id} is being cancelled{by}: column {column} of {table} is rolled back "
            "once the leases in its way are released; nothing to backfill",
        )
    if step == BACKFILL_STEP:
        # Running at its backfill step after all (a view that raced the refusal): nothing
        # ended, and a new run may succeed.
        return JobEnd(
            False,
            f"job {job_id} is still at its backfill step but refused this run's work; run "
            f"the backfill again (`metastore job show {job_id}` says what it waits for)",
        )
    return JobEnd(
        False,
        f"job {job_id} is {status} at step {step}, not at its backfill step; `metastore job "
        f"show {job_id}` says what it waits for",
    )


def _wait_for_step(
    client: SyncMetastoreClient, job_id: int, deadline: float, say: Progress
) -> dict[str, Any]:
    """Poll the job until it is at its backfill step; the last view."""
    from metastore.errors import MetastoreError

    last_said = ""
    job: dict[str, Any] | None = None
    while True:
        try:
            job = client.job_show(job_id)
        except MetastoreError as exc:
            if not exc.retryable:
                raise
        else:
            _check_backfillable(job)
            if job["step"] == BACKFILL_STEP or job["status"] == SUCCEEDED:
                return job
            waiting = job.get("waiting_for") or {}
            line = (
                f"job {job_id}: at step {job['step']}, waiting for "
                f"{waiting.get('reason') or 'its next step'}: {waiting.get('message') or '-'}"
            )
            if line != last_said:
                say(line)
                last_said = line
        if time.monotonic() >= deadline:
            step = job["step"] if job else "unknown"
            raise BackfillTimeoutError(
                f"job {job_id} did not reach its backfill step in time (it is at step {step}; "
                f"{last_said or 'no answer from the metastore'})",
                job_id=job_id,
                details={"step": step, "waiting_for": (job or {}).get("waiting_for")},
            )
        time.sleep(POLL_INTERVAL_S)


def _check_backfillable(job: dict[str, Any]) -> None:
    """Refuse a job whose backfill can never be needed: not an ADD COLUMN job, or one that
    will not publish its column (a succeeded one passes: the run then reports success)."""
    job_id = int(job["job_id"])
    if job["kind"] != ADD_COLUMN:
        raise JobNotBackfillableError(
            f"job {job_id} is a {job['kind']} job; only ADD COLUMN ... NOT NULL DEFAULT jobs "
            "have a backfill",
            job_id=job_id,
            details={"kind": job["kind"]},
        )
    if job["status"] not in (RUNNING, SUCCEEDED) or job.get("cancel_requested"):
        raise _not_backfillable(job, job_end(job))


def _not_backfillable(job: dict[str, Any], end: JobEnd) -> JobNotBackfillableError:
    return JobNotBackfillableError(
        end.message,
        job_id=int(job["job_id"]),
        details={"status": job["status"], "step": job["step"]},
    )


class _Run:
    """One backfill run: its counters survive a refused attempt (what was committed stays)."""

    def __init__(self, bridge: MetastoreBridge, job: dict[str, Any], say: Progress) -> None:
        self.bridge = bridge
        self.job_id = int(job["job_id"])
        self.table = str(job["table"])
        self.column = str(job["column"])
        self.field_id = int(job["field_id"])
        self.from_ts = int(job["backfill_from_ts"])
        self.say = say
        self.known: set[str] = set()  # paths known to carry the column (never reused)
        self.lacking_last: int | None = None  # files lacking the column at the last listing
        self.rewritten = 0
        self.written = 0
        self.rows = 0
        self.commits = 0
        self.commit_ts: int | None = None

    def result(self, snapshot_ts: int, attempts: int) -> BackfillResult:
        return BackfillResult(
            job_id=self.job_id,
            table=self.table,
            snapshot_ts=snapshot_ts,
            files_rewritten=self.rewritten,
            commit_ts=self.commit_ts,
            attempts=attempts,
            files_written=self.written,
            rows_rewritten=self.rows,
            commits=self.commits,
        )

    def moved_on(self, job: dict[str, Any], *, attempts: int) -> BackfillResult:
        """The result for a job found no longer at its backfill step: success if it
        succeeded (`job_end`), else the typed refusal naming what became of it."""
        end = job_end(job)
        if not end.done:
            raise _not_backfillable(job, end)
        self.say(end.message)
        backfill_ts = job.get("backfill_ts")
        return replace(
            self.result(0 if backfill_ts is None else int(backfill_ts), attempts),
            outcome=JOB_SUCCEEDED,
            note=end.message,
        )

    def rewrite(self) -> int:
        """Rewrite chunk after chunk until a listing's lacking files all fit its chunk; the S
        of that listing."""
        while True:
            self._wait_for_activation()
            done, snapshot_ts = self._chunk()
            if done:
                return snapshot_ts

    def _wait_for_activation(self) -> None:
        """Until this driver's HLC passes the backfill step's activation: a listing at Top
        then reads at or after it (the daemon refuses a report from before)."""
        clock = self.bridge.client.clock
        deadline = time.monotonic() + ACTIVATION_WAIT_MAX_S
        while clock.now() <= self.from_ts:
            if time.monotonic() >= deadline:
                raise BackfillTimeoutError(
                    f"job {self.job_id}: the backfill version did not activate in time "
                    f"(at {to_iso(self.from_ts)})",
                    job_id=self.job_id,
                    details={"backfill_from_ts": self.from_ts},
                )
            left_ms = (self.from_ts >> 16) - clock.physical_now_ms() + 1
            time.sleep(min(max(left_ms, 1), 1000) / 1000)

    def _chunk(self) -> tuple[bool, int]:
        """One batch: list at S = Top, rewrite up to one chunk of lacking files in one commit.
        (True, S) when nothing lacking at S was left out of the chunk."""
        top = self.bridge.client.clock.now()
        txn_id = f"backfill:{self.job_id}:{uuid.uuid4()}"
        with self.bridge.batch(
            writes=[self.table], top=top, read_ts=top, txn_id=txn_id, mark_txn_id=False
        ) as b:
            pin = b.pinned[self.table]
            columns = pin.write_columns
            if not any(int(c["field_id"]) == self.field_id for c in pin.write_only):
                # What became of the job (public, cancelled...) is `job_end`'s to say.
                raise _PinnedPastBackfill(
                    f"{self.table} v{pin.version}, pinned at {to_iso(top)}, does not hold "
                    f"column {self.column} write-only"
                )
            location, files = b.files(self.table)
            lacking = self._lacking(location, files)
            self.lacking_last = len(lacking)
            chunk = take_chunk(lacking, files_max=CHUNK_FILES_MAX, bytes_max=CHUNK_BYTES_MAX)
            self.say(
                f"job {self.job_id}: {len(files)} live files of {self.table} at {to_iso(top)}, "
                f"{len(lacking)} without column {self.column}"
                + (f"; rewriting {len(chunk)}" if chunk else "")
            )
            if chunk:
                # Every write column but the new one, read by field id (renamed, widened and
                # defaulted columns read as any reader of this version reads them); `write`
                # then conforms to the write columns: the new column gets its DEFAULT.
                source = [c for c in columns if int(c["field_id"]) != self.field_id]
                # (A file without any field ids by name, as every reader reads it.)
                df = b.read_files(location, chunk, pinned_struct(source))
                new_files = b.write(self.table, df)
                lost = rows_not_kept(chunk, new_files)
                if lost:
                    # Raised inside the batch: nothing is committed, the old files stay.
                    raise BackfillError(
                        f"job {self.job_id}: the {len(chunk)} files without column "
                        f"{self.column} hold {lost['rows_expected']} rows but Spark read "
                        f"{lost['rows_read']} of them (a file unreadable or missing, skipped by "
                        "the session's spark.sql.files.ignoreCorruptFiles / "
                        "ignoreMissingFiles?); nothing was committed",
                        job_id=self.job_id,
                        details={"table": self.table, **lost},
                    )
                b.remove(self.table, [str(f["path"]) for f in chunk])
        if chunk:
            self.known.update(f.path for f in new_files)
            self.rewritten += len(chunk)
            self.written += len(new_files)
            self.rows += sum(int(f["row_count"]) for f in chunk)
            self.commits += 1
            self.commit_ts = b.report.commit_ts
            self.say(
                f"job {self.job_id}: committed {len(chunk)} rewritten files as "
                f"{len(new_files)} at {to_iso(b.report.commit_ts or 0)}"
            )
        return len(chunk) == len(lacking), b.read_ts

    def _lacking(self, location: str, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The files whose footer has no field id `self.field_id`, in listing order."""
        unknown = [f for f in files if f["path"] not in self.known]

        def lacks(f: dict[str, Any]) -> bool:
            return self.field_id not in top_level_field_ids(location, str(f["path"]))

        with ThreadPoolExecutor(max_workers=FOOTER_READERS) as pool:
            verdicts = list(pool.map(lacks, unknown))
        self.known.update(f["path"] for f, bad in zip(unknown, verdicts, strict=True) if not bad)
        return [f for f, bad in zip(unknown, verdicts, strict=True) if bad]
