"""Multi-step schema change jobs (DESIGN.md §4, CockroachDB's descriptor-lease schema changes).

Why: some changes are unsafe in one step while writers pinned to older versions are running.
Dropping a column a running writer still fills would leave readers of the older version with
files that lack it; adding a NOT NULL column would let old writers keep writing files without
it. So these changes go through intermediate schema versions, each published only once no
lease remains on the version two behind (the two-version gate of `metastore.leases`):

* DROP COLUMN c:  public -> write-only (hidden from readers; writers still fill it, with its
  DEFAULT or NULL) -> dropped;
* ADD COLUMN c ... NOT NULL DEFAULT x:  delete-only (invisible to everyone) -> write-only
  (writers fill x) -> backfill (the same shape once more, so that from its Tu on no writer
  without c can commit; files written before lack c: a Spark job rewrites them, see
  `spark_bridge.backfill`) -> public.

Widening a column's type stays one step: every widening the catalog allows is read natively by
Spark's Parquet readers (tests/spark/test_schema_jobs.py reads each from old files), so no file
needs rewriting.

A job is replicated state, like everything here: `ALTER TABLE` starts it and publishes its first
step in the same entry; the leader's job worker (`metastore.daemon.job_worker`) proposes
`AdvanceSchemaJob(job_id, step)` once the current step's version is active and the next step's
conditions hold. Apply re-checks them (the gate, the backfill) and compares `step`, so a
duplicate proposal from a deposed leader changes nothing. A kill -9 of the leader, or of every
node, resumes the job where the log left it.

Columns in an intermediate state live in `SchemaVersion.pending` (the catalog): readers see
`schema` (public columns), writers `write_schema` (public + write-only). A pending column's name
stays taken until its job ends (SCHEMA_JOB_CONFLICT).

The backfill condition is decided from the log alone. A commit's version must be one of the two
latest active at its ts, so once the backfill step's version is active (`backfill_from_ts`) no
writer without the column commits again; a backfill report (`SchemaJobBackfilled`) must have
read the table at or after that ts. As a second line, the job records the newest commit made at
a version older than write-only (`last_old_write_ts`) and refuses a report whose snapshot
predates it. Public is published only if the backfill is still good, or none was needed: the
table had no live files when write-only was published and nothing old was written since.

Below MAX_SCHEMA_VERSIONS_PER_TABLE, other changes to the table keep free the versions its running
jobs still need (`versions_needed`): a running job can always finish, or be cancelled.

Cancelling (`CancelSchemaJob`) publishes the last public version's shape again: a column being
dropped becomes public again (at its old position, nullable: writers of the write-only version
filled it with NULL), a column being added disappears (its field id is never reused). A job
whose table is dropped ends as `aborted`.

Invariants (checked by `check_invariants`): every running job's table is live and its pending
column is in the table's latest version in the state the job's step says; every pending column
belongs to a running job; finished jobs hold no pending column; job ids are unique and below
`next_job_id`; limits hold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from hlc import ts_text
from metastore import limits
from metastore.catalog import (
    ADDING,
    DELETE_ONLY,
    DROPPING,
    WRITE_ONLY,
    Applied,
    Catalog,
    PendingColumn,
    TableState,
    check_pending_names,
)
from metastore.commands import (
    AddColumn,
    AdvanceSchemaJob,
    AlterTable,
    CancelSchemaJob,
    DropColumn,
    SchemaJobBackfilled,
    TableName,
    column_from_data,
    column_to_data,
)
from metastore.errors import (
    BackfillIncompleteError,
    CatalogInvariantError,
    ColumnNotFoundError,
    MalformedSnapshotError,
    MetastoreError,
    SchemaChangeBlockedError,
    SchemaJobNotFoundError,
    SchemaJobStateError,
    UnsupportedSchemaChangeError,
    limit_exceeded,
)
from metastore.java_case import java_case_key
from metastore.leases import Sessions
from metastore.schema import (
    After,
    Column,
    First,
    NameMatch,
    Schema,
    add_column,
    drop_column,
    new_name_key,
    unique_names_key,
)
from metastore.types import StructField

Result = dict[str, object]

DROP_COLUMN: Final = "drop_column"
ADD_COLUMN: Final = "add_column"
# The steps of each kind, in order. A job's `step` is the index of the step it has reached.
STEPS: Final[dict[str, tuple[str, ...]]] = {
    DROP_COLUMN: ("write_only", "dropped"),
    ADD_COLUMN: ("delete_only", "write_only", "backfill", "public"),
}
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
CANCELLED: Final = "cancelled"
ABORTED: Final = "aborted"  # its table was dropped
STATUSES: Final = (RUNNING, SUCCEEDED, CANCELLED, ABORTED)
# A job's count of files rewritten by its backfill reports stops here (a snapshot's integers
# are 64-bit; apply version 4).
FILES_REWRITTEN_MAX: Final = 2**63 - 1
# Index of the ADD job's write-only and backfill steps.
_ADD_WRITE_ONLY: Final = 1
_ADD_BACKFILL: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaJob:
    job_id: int
    table: TableName
    table_id: int
    kind: str  # DROP_COLUMN | ADD_COLUMN
    column: Column  # with its field id; for a drop, as it was when public
    position: int  # drop: the column's index when public (restored on cancel); add: -1
    after: str | None  # add: the sibling to place it after when public ("" = FIRST, None = last)
    statement: str  # canonical SQL of the ALTER that started it
    base_version: int  # the table's version before the job
    versions: tuple[int, ...]  # versions this job published, in order
    step: int  # index into STEPS[kind]
    status: str
    created_tm: int
    updated_tm: int
    backfill_needed: bool = False
    backfill_from_ts: int = 0  # Tu of the backfill step's version: a backfill reads at >= it
    backfill_ts: int | None = None  # snapshot ts of an accepted backfill
    files_rewritten: int = 0
    last_old_write_ts: int = 0  # newest commit at a version older than write-only
    ended_by: str = ""  # who cancelled it (or asked to)
    message: str = ""
    cancel_requested: bool = False  # a cancel waits for leases: the job only rolls back now

    @property
    def step_name(self) -> str:
        return STEPS[self.kind][self.step]

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    @property
    def write_only_version(self) -> int | None:
        """ADD jobs: the version in which the column became write-only (if reached)."""
        if self.kind == ADD_COLUMN and len(self.versions) > _ADD_WRITE_ONLY:
            return self.versions[_ADD_WRITE_ONLY]
        return None

    def backfill_satisfied(self) -> bool:
        return not self.backfill_needed or self.backfill_ts is not None

    def view(self) -> Result:
        return {
            "job_id": self.job_id,
            "table": str(self.table),
            "table_id": self.table_id,
            "kind": self.kind,
            "column": self.column.name,
            "field_id": self.column.field_id,
            "statement": self.statement,
            "status": self.status,
            "step": self.step_name,
            "step_index": self.step,
            "steps": list(STEPS[self.kind]),
            "base_version": self.base_version,
            "versions": list(self.versions),
            "created_tm": self.created_tm,
            "updated_tm": self.updated_tm,
            "backfill_needed": self.backfill_needed,
            "backfill_from_ts": self.backfill_from_ts,
            "backfill_ts": self.backfill_ts,
            "files_rewritten": self.files_rewritten,
            "last_old_write_ts": self.last_old_write_ts,
            "ended_by": self.ended_by,
            "message": self.message,
            "cancel_requested": self.cancel_requested,
        }


def multi_step_change(cmd: AlterTable) -> AddColumn | DropColumn | None:
    """The change of `cmd` that runs as a job, or None for a one-step ALTER. A job's change must
    be the ALTER's only change (each step publishes one version of one change)."""
    found = [c for c in cmd.changes if isinstance(c, AddColumn | DropColumn) and _is_multi_step(c)]
    if not found:
        return None
    if len(cmd.changes) > 1:
        raise UnsupportedSchemaChangeError(
            f"{found[0].to_sql()} runs as a multi-step schema change job; "
            "run it in an ALTER TABLE of its own",
            details={"change": found[0].to_sql()},
        )
    return found[0]


def _is_multi_step(change: object) -> bool:
    match change:
        case DropColumn(path=path):
            return len(path) == 1
        case AddColumn(parent=parent, column=column):
            return not parent and not column.nullable and column.default_sql is not None
    return False


class SchemaJobs:
    """Every schema change job. Owned by `MetastoreState`, which passes Tm, DD and the other
    components; like them it validates fully before writing anything."""

    __slots__ = ("_jobs", "_next_job_id")

    def __init__(self) -> None:
        self._jobs: dict[int, SchemaJob] = {}
        self._next_job_id = 1

    # ----------------------------------------------------------------------------------------
    # Mutations
    # ----------------------------------------------------------------------------------------

    def start(
        self,
        cmd: AlterTable,
        change: AddColumn | DropColumn,
        *,
        tm: int,
        dd: int,
        catalog: Catalog,
        sessions: Sessions,
        max_version_bytes: int | None = None,
        spark_case: NameMatch = NameMatch.CASEFOLD,
    ) -> Applied:
        """Start a job for `change` and publish its first step (refused, like any ALTER, while
        a lease on the version two behind is held, or past `max_version_bytes`). `spark_case`:
        names are matched as Spark matches them (apply version 5 and up, `NameMatch`)."""
        inc = catalog.live_table(cmd.table)
        current = inc.versions[-1]
        if isinstance(change, DropColumn):
            try:
                column = current.schema.lookup(change.path, spark_case=spark_case)
            except ColumnNotFoundError:
                if change.if_exists:
                    return _unchanged(inc), ()
                raise
            assert isinstance(column, Column)
            # Refuses the last column.
            public = drop_column(current.schema, path=change.path, spark_case=spark_case)
            # Writers of the write-only version fill it with its DEFAULT or NULL: while it is
            # being dropped it is nullable (CockroachDB drops NOT NULL first, too).
            pending_column = replace(column, nullable=True)
            position = [c.field_id for c in current.schema.columns].index(column.field_id)
            kind, state, action, after = DROP_COLUMN, WRITE_ONLY, DROPPING, None
            next_field_id = inc.next_field_id
        else:
            # Validate against the public columns (name clash, type, default) and take its id.
            widened, next_field_id = add_column(
                current.schema,
                parent=(),
                column=change.column,
                position=change.position,
                next_field_id=inc.next_field_id,
                spark_case=spark_case,
            )
            added: Column | StructField
            if spark_case >= NameMatch.JAVA_UNIQUE:
                # Its own name: from apply version 7 a sibling may be one with it to casefold.
                added = next(c for c in widened.columns if c.name == change.column.name)
            else:
                added = widened.lookup((change.column.name,))
            assert isinstance(added, Column)
            column = pending_column = added
            public = current.schema
            match change.position:
                case None:
                    after = None
                case First():
                    after = ""
                case After(column=sibling) if spark_case:
                    # The sibling's own name: the public step finds it by casefold (from
                    # apply version 7 by that name itself, `_insert`).
                    after = current.schema.lookup((sibling,), spark_case=spark_case).name
                case After(column=sibling):
                    after = sibling
            kind, state, action, position = ADD_COLUMN, DELETE_ONLY, ADDING, -1
        self._check_running_limit()
        job_id = self._next_job_id
        pending = (
            *current.pending,
            PendingColumn(column=pending_column, state=state, job_id=job_id, action=action),
        )
        check_pending_names(inc.name, public, pending, name_key=new_name_key(spark_case))
        result, effects = catalog.publish_version(
            inc,
            schema=public,
            pending=pending,
            next_field_id=next_field_id,
            summary=f"{change.to_sql()} (job {job_id}: {STEPS[kind][0]})",
            tm=tm,
            dd=dd,
            before_publish=lambda i: sessions.check_publish(i, tm=tm),
            # Its own later steps, and those of the table's other running jobs.
            keep_free=self.versions_needed(inc.table_id) + len(STEPS[kind]) - 1,
            max_version_bytes=max_version_bytes,
            name_key=unique_names_key(spark_case),
        )
        version = result["version"]
        assert isinstance(version, int)
        job = SchemaJob(
            job_id=job_id,
            table=inc.name,
            table_id=inc.table_id,
            kind=kind,
            column=column,
            position=position,
            after=after,
            statement=f"ALTER TABLE {inc.name.to_sql()} {change.to_sql()}",
            base_version=current.version,
            versions=(version,),
            step=0,
            status=RUNNING,
            created_tm=tm,
            updated_tm=tm,
        )
        # --- write ---
        self._jobs[job_id] = job
        self._next_job_id += 1
        return {**result, "job_id": job_id, "job_step": job.step_name, "job_status": RUNNING}, (
            effects
        )

    def advance(
        self,
        cmd: AdvanceSchemaJob,
        *,
        tm: int,
        dd: int,
        catalog: Catalog,
        sessions: Sessions,
        live_files: int,
        end_order: bool,
        spark_case: NameMatch = NameMatch.CASEFOLD,
    ) -> Applied:
        """Take the job from step `cmd.step` to the next. `live_files` is the table's number of
        live files now, or from apply version 4 1 if it may have any, else 0 (an ADD job's
        write-only step records whether a backfill is needed).
        `end_order`: see `_trim`. `spark_case`: the apply version's name rules (`NameMatch`:
        how names must differ, and from version 7 how the public step finds AFTER's sibling)."""
        job = self._get(cmd.job_id)
        if not job.running or job.step != cmd.step:
            raise self._state_error(job, f"expected step {cmd.step}")
        if job.cancel_requested:
            return self._roll_back(
                job,
                tm=tm,
                dd=dd,
                catalog=catalog,
                sessions=sessions,
                by=job.ended_by,
                end_order=end_order,
                spark_case=spark_case,
            )
        inc = _live_incarnation(catalog, job)
        if inc is None:
            self._finish(job, ABORTED, tm=tm, message="its table was dropped", end_order=end_order)
            return {"job_id": job.job_id, "status": ABORTED, "changed": False}, ()
        current = inc.versions[-1]
        nxt = job.step + 1
        gate = lambda i: sessions.check_publish(i, tm=tm)  # noqa: E731
        if job.kind == DROP_COLUMN:
            pending = tuple(p for p in current.pending if p.job_id != job.job_id)
            applied = catalog.publish_version(
                inc,
                schema=current.schema,
                pending=pending,
                next_field_id=inc.next_field_id,
                summary=f"DROP COLUMN {job.column.name} (job {job.job_id}: dropped)",
                tm=tm,
                dd=dd,
                before_publish=gate,
                name_key=unique_names_key(spark_case),
            )
            self._write_step(job, nxt, applied, tm=tm, status=SUCCEEDED, end_order=end_order)
            return self._reply(job.job_id, applied)
        if nxt == _ADD_WRITE_ONLY:
            pending = tuple(
                replace(p, state=WRITE_ONLY) if p.job_id == job.job_id else p
                for p in current.pending
            )
            applied = catalog.publish_version(
                inc,
                schema=current.schema,
                pending=pending,
                next_field_id=inc.next_field_id,
                summary=f"ADD COLUMN {job.column.name} (job {job.job_id}: write_only)",
                tm=tm,
                dd=dd,
                before_publish=gate,
                name_key=unique_names_key(spark_case),
            )
            self._write_step(
                job, nxt, applied, tm=tm, backfill_needed=live_files > 0, end_order=end_order
            )
            return self._reply(job.job_id, applied)
        if nxt == _ADD_BACKFILL:
            # The same shape again, published through the gate: once this version activates,
            # no writer without the column can commit (the version before write-only is no
            # longer one of the two latest), and the gate let it through only when no lease
            # was left on it. A backfill that reads the table at or after its Tu therefore
            # sees every file that lacks the column.
            applied = catalog.publish_version(
                inc,
                schema=current.schema,
                pending=current.pending,
                next_field_id=inc.next_field_id,
                summary=f"ADD COLUMN {job.column.name} (job {job.job_id}: backfill)",
                tm=tm,
                dd=dd,
                before_publish=gate,
                name_key=unique_names_key(spark_case),
            )
            self._write_step(job, nxt, applied, tm=tm, end_order=end_order)
            self._jobs[job.job_id] = replace(self._jobs[job.job_id], backfill_from_ts=tm + dd)
            return self._reply(job.job_id, applied)
        # public
        if not job.backfill_satisfied():
            raise BackfillIncompleteError(
                f"schema change job {job.job_id} waits for a backfill of {job.table} "
                f"(run: metastore job run-backfill {job.job_id})",
                details=_backfill_details(job),
            )
        pending = tuple(p for p in current.pending if p.job_id != job.job_id)
        public = _insert(current.schema, job.column, job.after, spark_case)
        applied = catalog.publish_version(
            inc,
            schema=public,
            pending=pending,
            next_field_id=inc.next_field_id,
            summary=f"{_add_sql(job)} (job {job.job_id}: public)",
            tm=tm,
            dd=dd,
            before_publish=gate,
            name_key=unique_names_key(spark_case),
        )
        self._write_step(job, nxt, applied, tm=tm, status=SUCCEEDED, end_order=end_order)
        return self._reply(job.job_id, applied)

    def cancel(
        self,
        cmd: CancelSchemaJob,
        *,
        tm: int,
        dd: int,
        catalog: Catalog,
        sessions: Sessions,
        end_order: bool,
        spark_case: NameMatch = NameMatch.CASEFOLD,
    ) -> Applied:
        """Roll a running job back: publish the table's public shape from before the job. If
        leases are in the way, the request is recorded instead (`cancel_requested`): from then
        on the job never moves forward, and the leader's worker publishes the rollback as soon
        as the gate lets it (its next AdvanceSchemaJob). So a cancel never loses a race with
        the step that waited for the same leases."""
        job = self._get(cmd.job_id)
        if not job.running:
            raise self._state_error(job, "only a running job can be cancelled")
        if job.cancel_requested:
            return {"job_id": job.job_id, "cancel_requested": True, "changed": False}, ()
        try:
            return self._roll_back(
                job,
                tm=tm,
                dd=dd,
                catalog=catalog,
                sessions=sessions,
                by=cmd.by,
                end_order=end_order,
                spark_case=spark_case,
            )
        except SchemaChangeBlockedError as exc:
            self._jobs[job.job_id] = replace(
                job, cancel_requested=True, ended_by=cmd.by, updated_tm=tm
            )
            return {
                "job_id": job.job_id,
                "cancel_requested": True,
                "changed": False,
                "blockers": exc.details.get("blockers", []),
            }, ()

    def _roll_back(
        self,
        job: SchemaJob,
        *,
        tm: int,
        dd: int,
        catalog: Catalog,
        sessions: Sessions,
        by: str,
        end_order: bool,
        spark_case: NameMatch,
    ) -> Applied:
        inc = _live_incarnation(catalog, job)
        if inc is None:
            self._finish(job, ABORTED, tm=tm, message="its table was dropped", end_order=end_order)
            return {"job_id": job.job_id, "status": ABORTED, "changed": False}, ()
        current = inc.versions[-1]
        pending = tuple(p for p in current.pending if p.job_id != job.job_id)
        if job.kind == DROP_COLUMN:
            index = min(job.position, len(current.schema.columns))
            columns = list(current.schema.columns)
            # Writers of the write-only version filled the column with NULL (it was nullable
            # there), and may still commit after this rollback while that version is one of
            # the two latest active: so it comes back nullable, never NOT NULL.
            columns.insert(index, replace(job.column, nullable=True))
            schema = Schema(columns=tuple(columns))
        else:
            schema = current.schema
        applied = catalog.publish_version(
            inc,
            schema=schema,
            pending=pending,
            next_field_id=inc.next_field_id,
            summary=f"cancel job {job.job_id} ({job.kind} {job.column.name})",
            tm=tm,
            dd=dd,
            before_publish=lambda i: sessions.check_publish(i, tm=tm),
            name_key=unique_names_key(spark_case),
        )
        self._write_step(
            job, job.step, applied, tm=tm, status=CANCELLED, ended_by=by, end_order=end_order
        )
        result, effects = self._reply(job.job_id, applied)
        return {**result, "status": CANCELLED}, effects

    def backfilled(self, cmd: SchemaJobBackfilled, *, tm: int, saturate: bool) -> Result:
        """Record a backfill report. `saturate` (apply version 4): the job's count of files
        rewritten stops at 2^63-1; before, reports of up to 2^63-1 each could take it past
        2^64, which no snapshot can hold."""
        job = self._get(cmd.job_id)
        if not job.running or job.step != _ADD_BACKFILL or job.kind != ADD_COLUMN:
            raise self._state_error(job, "a backfill is reported only at the backfill step")
        if cmd.snapshot_ts < job.backfill_from_ts:
            raise BackfillIncompleteError(
                f"job {job.job_id}: the backfill read the table at {ts_text(cmd.snapshot_ts)}, "
                f"before its step's version activated at {ts_text(job.backfill_from_ts)} "
                "(writers without the column could still commit until then); run it again",
                details=_backfill_details(job, cmd.snapshot_ts),
            )
        if job.last_old_write_ts > cmd.snapshot_ts:
            raise BackfillIncompleteError(
                f"job {job.job_id}: a writer without column {job.column.name} committed at "
                f"{ts_text(job.last_old_write_ts)}, after the backfill's snapshot "
                f"{ts_text(cmd.snapshot_ts)}; run it again",
                details=_backfill_details(job, cmd.snapshot_ts),
            )
        files_rewritten = job.files_rewritten + cmd.files_rewritten
        if saturate:
            files_rewritten = min(files_rewritten, FILES_REWRITTEN_MAX)
        self._jobs[job.job_id] = replace(
            job,
            backfill_ts=cmd.snapshot_ts,
            files_rewritten=files_rewritten,
            updated_tm=tm,
        )
        return {"job_id": job.job_id, "backfill_ts": cmd.snapshot_ts, "accepted": True}

    def observe_commit(self, table_id: int, schema_version: int, ts: int) -> None:
        """A commit landed: files written at a version older than an ADD job's write-only
        version lack its column, so the job needs (another) backfill."""
        for job in self._jobs.values():
            if job.table_id != table_id or not job.running:
                continue
            wo = job.write_only_version
            if wo is None or schema_version >= wo:
                continue
            self._jobs[job.job_id] = replace(
                job,
                backfill_needed=True,
                last_old_write_ts=max(job.last_old_write_ts, ts),
                backfill_ts=job.backfill_ts if job.backfill_ts and job.backfill_ts >= ts else None,
            )

    def table_dropped(self, table_id: int, *, tm: int, end_order: bool) -> None:
        for job in list(self._jobs.values()):
            if job.table_id == table_id and job.running:
                self._finish(
                    job, ABORTED, tm=tm, message="its table was dropped", end_order=end_order
                )

    # ----------------------------------------------------------------------------------------
    # Reads
    # ----------------------------------------------------------------------------------------

    def get(self, job_id: int) -> SchemaJob:
        return self._get(job_id)

    def versions_needed(self, table_id: int) -> int:
        """The schema versions the running jobs on `table_id` still need to publish to finish
        (a cancel needs one, never more): other changes keep them free below
        MAX_SCHEMA_VERSIONS_PER_TABLE, so a running job can always finish or be cancelled."""
        return sum(
            len(STEPS[j.kind]) - 1 - j.step
            for j in self._jobs.values()
            if j.running and j.table_id == table_id
        )

    def jobs(
        self, *, table: TableName | None = None, running_only: bool = False
    ) -> list[SchemaJob]:
        return [
            j
            for j in sorted(self._jobs.values(), key=lambda j: j.job_id)
            if (table is None or j.table == table) and (j.running or not running_only)
        ]

    def is_empty(self) -> bool:
        return not self._jobs and self._next_job_id == 1

    # ----------------------------------------------------------------------------------------
    # Internals
    # ----------------------------------------------------------------------------------------

    def _get(self, job_id: int) -> SchemaJob:
        job = self._jobs.get(job_id)
        if job is None:
            raise SchemaJobNotFoundError(
                f"no schema change job {job_id}", details={"job_id": job_id}
            )
        return job

    def _check_running_limit(self) -> None:
        running = sum(1 for j in self._jobs.values() if j.running)
        if running >= limits.MAX_RUNNING_SCHEMA_JOBS:
            raise limit_exceeded(
                "MAX_RUNNING_SCHEMA_JOBS",
                limits.MAX_RUNNING_SCHEMA_JOBS,
                running + 1,
                "running schema change jobs",
            )

    @staticmethod
    def _state_error(job: SchemaJob, why: str) -> SchemaJobStateError:
        return SchemaJobStateError(
            f"schema change job {job.job_id} is {job.status} at step {job.step_name}: {why}",
            details={"job_id": job.job_id, "status": job.status, "step": job.step_name},
        )

    @staticmethod
    def _reply(job_id: int, applied: Applied) -> Applied:
        result, effects = applied
        return {**result, "job_id": job_id}, effects

    def _write_step(
        self,
        job: SchemaJob,
        step: int,
        applied: Applied,
        *,
        tm: int,
        status: str = RUNNING,
        backfill_needed: bool | None = None,
        ended_by: str = "",
        end_order: bool,
    ) -> None:
        version = applied[0]["version"]
        assert isinstance(version, int)
        self._jobs[job.job_id] = replace(
            job,
            step=step,
            versions=(*job.versions, version),
            status=status,
            updated_tm=tm,
            ended_by=ended_by,
            backfill_needed=job.backfill_needed if backfill_needed is None else backfill_needed,
        )
        if status != RUNNING:
            self._trim(end_order=end_order)

    def _finish(
        self, job: SchemaJob, status: str, *, tm: int, message: str, end_order: bool
    ) -> None:
        self._jobs[job.job_id] = replace(job, status=status, updated_tm=tm, message=message)
        self._trim(end_order=end_order)

    def _trim(self, *, end_order: bool) -> None:
        """Forget the finished jobs past MAX_FINISHED_SCHEMA_JOBS_KEPT: with `end_order`
        (apply version 4) those that ended first (`updated_tm`, a finished job's end), else
        those of the lowest ids, which forgot a long-running job in the entry that ended it."""
        finished = [j for j in self._jobs.values() if not j.running]
        excess = len(finished) - limits.MAX_FINISHED_SCHEMA_JOBS_KEPT
        if excess <= 0:
            return
        if end_order:
            finished.sort(key=lambda j: (j.updated_tm, j.job_id))
        else:
            finished.sort(key=lambda j: j.job_id)
        for job in finished[:excess]:
            del self._jobs[job.job_id]

    # ----------------------------------------------------------------------------------------
    # Invariants and snapshot form
    # ----------------------------------------------------------------------------------------

    def check_invariants(self, *, catalog: Catalog) -> None:
        def fail(what: str) -> CatalogInvariantError:
            return CatalogInvariantError(f"schema jobs: {what}")

        running = 0
        for job_id, job in self._jobs.items():
            if job_id != job.job_id or not 1 <= job_id < self._next_job_id:
                raise fail(f"job id {job_id} misfiled or ahead")
            if job.kind not in STEPS or not 0 <= job.step < len(STEPS[job.kind]):
                raise fail(f"job {job_id}: bad kind or step")
            if job.status not in STATUSES:
                raise fail(f"job {job_id}: bad status")
            if not job.running:
                continue
            running += 1
            inc = _live_incarnation(catalog, job)
            if inc is None:
                raise fail(f"job {job_id} runs on a table that is not live")
            mine = [p for p in inc.versions[-1].pending if p.job_id == job_id]
            if len(mine) != 1 or mine[0].column.field_id != job.column.field_id:
                raise fail(f"job {job_id}: its column is not pending in the latest version")
            want = DELETE_ONLY if job.kind == ADD_COLUMN and job.step == 0 else WRITE_ONLY
            if mine[0].state != want:
                raise fail(f"job {job_id}: column is {mine[0].state}, step says {want}")
        if running > limits.MAX_RUNNING_SCHEMA_JOBS:
            raise fail("too many running jobs")
        if len(self._jobs) - running > limits.MAX_FINISHED_SCHEMA_JOBS_KEPT:
            raise fail("too many finished jobs kept")
        for inc in catalog.all_incarnations():
            if not inc.live:
                continue
            for p in inc.versions[-1].pending:
                owner = self._jobs.get(p.job_id)
                if owner is None or not owner.running or owner.table_id != inc.table_id:
                    raise fail(f"{inc.name}: pending column {p.column.name} has no running job")

    def to_data(self) -> dict[str, object]:
        return {
            "next_job_id": self._next_job_id,
            "jobs": [_job_to_data(self._jobs[i]) for i in sorted(self._jobs)],
        }

    @staticmethod
    def from_data(data: object) -> SchemaJobs:
        if not isinstance(data, dict) or set(data) != {"next_job_id", "jobs"}:
            raise MalformedSnapshotError("schema jobs must be a map of next_job_id/jobs")
        jobs = SchemaJobs()
        next_id = data["next_job_id"]
        rows = data["jobs"]
        if not isinstance(next_id, int) or next_id < 1 or not isinstance(rows, list):
            raise MalformedSnapshotError("bad schema jobs header")
        jobs._next_job_id = next_id
        for row in rows:
            job = _job_from_data(row)
            jobs._jobs[job.job_id] = job
        return jobs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SchemaJobs) and (self._jobs, self._next_job_id) == (
            other._jobs,
            other._next_job_id,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobWait:
    """What a running job's next step waits for at `now` ("" = nothing: propose it)."""

    reason: str  # "", "activation", "leases", "backfill", "limit", "table_dropped", "finished"
    message: str
    until_tm: int | None = None  # activation: the HLC time the step waits for
    blockers: tuple[Result, ...] = ()  # leases: who holds the versions in the way

    def view(self) -> Result:
        return {
            "reason": self.reason,
            "message": self.message,
            "until_tm": self.until_tm,
            "blockers": list(self.blockers),
        }


def next_step_wait(
    job: SchemaJob, *, catalog: Catalog, sessions: Sessions, now_tm: int, cs_max: int
) -> JobWait:
    """Why `job`'s next step cannot be proposed at `now_tm` (HLC), if it cannot. The same rules
    apply decides with (the gate, the backfill), plus one apply cannot check: the job's last
    version must be active on every node (now >= its Tu + CSmax), so each step is observed."""
    inc = _live_incarnation(catalog, job)
    last = None if inc is None else inc.versions[job.versions[-1] - 1]
    if not job.running:
        if last is not None and now_tm < last.tu + cs_max:
            # Ended in the log, but its last version is not in force everywhere yet.
            return JobWait(
                reason="activation",
                message=f"version {last.version} to activate on every node",
                until_tm=last.tu + cs_max,
            )
        return JobWait(reason="finished", message=f"nothing: the job has ended ({job.status})")
    if inc is None or last is None:
        return JobWait(reason="table_dropped", message="its table was dropped")
    if len(inc.versions) >= limits.MAX_SCHEMA_VERSIONS_PER_TABLE:
        # Apply refuses every next version (the step's, or the cancel's rollback): proposing
        # it would only append a refused entry every poll. Other changes keep the versions a
        # running job needs free (`versions_needed`), so only a state from before that rule
        # gets here; dropping the table ends the job.
        return JobWait(
            reason="limit",
            message=f"{job.table} has reached MAX_SCHEMA_VERSIONS_PER_TABLE="
            f"{limits.MAX_SCHEMA_VERSIONS_PER_TABLE}: no further version can be published",
        )
    if job.cancel_requested:
        held = sessions.blockers(inc, tm=now_tm)
        if held:
            return JobWait(
                reason="leases",
                message=f"the cancel: {len(held)} lease(s) on version "
                f"{inc.versions[-1].version - 1} or older to be released or to expire",
                blockers=tuple(held),
            )
        return JobWait(reason="", message="")
    if now_tm < last.tu + cs_max:
        return JobWait(
            reason="activation",
            message=f"version {last.version} to activate on every node",
            until_tm=last.tu + cs_max,
        )
    nxt = STEPS[job.kind][job.step + 1]
    if nxt == "public" and not job.backfill_satisfied():
        return JobWait(
            reason="backfill",
            message=f"a backfill of {job.table}: run `metastore job run-backfill {job.job_id}`",
        )
    held = sessions.blockers(inc, tm=now_tm)
    if held:
        current = inc.versions[-1].version
        return JobWait(
            reason="leases",
            message=f"{len(held)} lease(s) on version {current - 1} or older to be released "
            "or to expire",
            blockers=tuple(held),
        )
    return JobWait(reason="", message="")


def _live_incarnation(catalog: Catalog, job: SchemaJob) -> TableState | None:
    incs = catalog.incarnations(job.table)
    if not incs or not incs[-1].live or incs[-1].table_id != job.table_id:
        return None
    return incs[-1]


def _unchanged(inc: TableState) -> Result:
    current = inc.versions[-1]
    return {
        "table": str(inc.name),
        "table_id": inc.table_id,
        "changed": False,
        "version": current.version,
        "tu": current.tu,
    }


def _insert(
    schema: Schema, column: Column, after: str | None, spark_case: NameMatch = NameMatch.CASEFOLD
) -> Schema:
    """`column` placed FIRST (after == ""), after sibling `after`, or last (None, or when that
    sibling is gone by now). The sibling: from apply version 7 the one named `after` (its own
    name since version 6), else the first Java's equalsIgnoreCase takes for it (a job started
    earlier holds the name as the user wrote it); before, the first casefold match, which
    depends on the Python release and, once `ß` and `ss` may be siblings, could be the other."""
    columns = list(schema.columns)
    if after == "":
        columns.insert(0, column)
    elif after is not None and spark_case >= NameMatch.JAVA_UNIQUE:
        names = [c.name for c in columns]
        if after not in names:
            names = [java_case_key(n) for n in names]
            after = java_case_key(after)
        columns.insert(names.index(after) + 1 if after in names else len(columns), column)
    else:
        names = [c.name.casefold() for c in columns]
        if after is not None and after.casefold() in names:
            columns.insert(names.index(after.casefold()) + 1, column)
        else:
            columns.append(column)
    return Schema(columns=tuple(columns))


def _add_sql(job: SchemaJob) -> str:
    return f"ADD COLUMN {job.column.to_sql()}"


def _backfill_details(job: SchemaJob, snapshot_ts: int | None = None) -> Result:
    return {
        "job_id": job.job_id,
        "table": str(job.table),
        "snapshot_ts": snapshot_ts,
        "last_old_write_ts": job.last_old_write_ts,
    }


_JOB_FIELDS: Final = (
    "job_id",
    "table",
    "table_id",
    "kind",
    "column",
    "position",
    "after",
    "statement",
    "base_version",
    "versions",
    "step",
    "status",
    "created_tm",
    "updated_tm",
    "backfill_needed",
    "backfill_from_ts",
    "backfill_ts",
    "files_rewritten",
    "last_old_write_ts",
    "ended_by",
    "message",
    "cancel_requested",
)


def _job_to_data(job: SchemaJob) -> list[object]:
    return [
        job.job_id,
        [job.table.namespace, job.table.name],
        job.table_id,
        job.kind,
        column_to_data(job.column),
        job.position,
        job.after,
        job.statement,
        job.base_version,
        list(job.versions),
        job.step,
        job.status,
        job.created_tm,
        job.updated_tm,
        job.backfill_needed,
        job.backfill_from_ts,
        job.backfill_ts,
        job.files_rewritten,
        job.last_old_write_ts,
        job.ended_by,
        job.message,
        job.cancel_requested,
    ]


def _job_from_data(data: object) -> SchemaJob:
    if not isinstance(data, list) or len(data) != len(_JOB_FIELDS):
        raise MalformedSnapshotError(f"a schema job must be a list of {len(_JOB_FIELDS)} items")
    row = dict(zip(_JOB_FIELDS, data, strict=True))
    try:
        table = row["table"]
        versions = row["versions"]
        if not isinstance(table, list) or len(table) != 2 or not isinstance(versions, list):
            raise MalformedSnapshotError("bad schema job table or versions")
        ints: tuple[str, ...] = (
            "job_id",
            "table_id",
            "position",
            "base_version",
            "step",
            "created_tm",
        )
        ints += ("updated_tm", "backfill_from_ts", "files_rewritten", "last_old_write_ts")
        for key in ints:
            if not isinstance(row[key], int) or isinstance(row[key], bool):
                raise MalformedSnapshotError(f"schema job {key} must be an integer")
        for key in ("kind", "statement", "status", "ended_by", "message"):
            if not isinstance(row[key], str):
                raise MalformedSnapshotError(f"schema job {key} must be a string")
        after, backfill_ts = row["after"], row["backfill_ts"]
        if after is not None and not isinstance(after, str):
            raise MalformedSnapshotError("schema job after must be a string or nil")
        if backfill_ts is not None and not isinstance(backfill_ts, int):
            raise MalformedSnapshotError("schema job backfill_ts must be an integer or nil")
        if not all(isinstance(v, int) for v in versions):
            raise MalformedSnapshotError("schema job versions must be integers")
        kind, status = str(row["kind"]), str(row["status"])

        def num(key: str) -> int:
            value = row[key]
            assert isinstance(value, int)  # checked above
            return value

        if kind not in STEPS or status not in STATUSES:
            raise MalformedSnapshotError(f"bad schema job kind/status {kind!r}/{status!r}")
        return SchemaJob(
            job_id=num("job_id"),
            table=TableName(namespace=str(table[0]), name=str(table[1])),
            table_id=num("table_id"),
            kind=kind,
            column=column_from_data(row["column"]),
            position=num("position"),
            after=after,
            statement=str(row["statement"]),
            base_version=num("base_version"),
            versions=tuple(int(v) for v in versions),
            step=num("step"),
            status=status,
            created_tm=num("created_tm"),
            updated_tm=num("updated_tm"),
            backfill_needed=bool(row["backfill_needed"]),
            backfill_from_ts=num("backfill_from_ts"),
            backfill_ts=backfill_ts,
            files_rewritten=num("files_rewritten"),
            last_old_write_ts=num("last_old_write_ts"),
            ended_by=str(row["ended_by"]),
            message=str(row["message"]),
            cancel_requested=bool(row["cancel_requested"]),
        )
    except MetastoreError as e:
        if isinstance(e, MalformedSnapshotError):
            raise
        raise MalformedSnapshotError(f"bad schema job: {e.message}") from None
