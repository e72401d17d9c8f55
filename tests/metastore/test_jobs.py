"""Schema change jobs (metastore.jobs): DROP COLUMN and ADD COLUMN ... NOT NULL DEFAULT run in
steps; readers see only public columns and writers also fill write-only ones; every step is a
compare-and-swap that the two-version gate and the backfill rule can refuse; cancel restores the
public shape; and, over random histories with sessions, leases, commits, expiries and snapshot
restarts, the invariants hold and a replica restored from a snapshot stays identical."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hlc import ts_text
from metastore import limits
from metastore.commands import (
    AcquireLeases,
    AdvanceSchemaJob,
    AlterTable,
    CancelSchemaJob,
    Command,
    CommitTxn,
    DataFile,
    ExpireSessions,
    HeartbeatSession,
    LeaseKey,
    OpenSession,
    ReleaseLeases,
    SchemaJobBackfilled,
    SessionInfo,
    TableName,
    TableWrite,
    decode_command,
    encode_command,
)
from metastore.ddl import parse_ddl
from metastore.errors import (
    BackfillIncompleteError,
    InvalidArgumentError,
    LimitExceededError,
    MetastoreError,
    SchemaChangeBlockedError,
    SchemaJobConflictError,
    SchemaJobNotFoundError,
    SchemaJobStateError,
    SchemaVersionNotActiveError,
    UnsupportedSchemaChangeError,
)
from metastore.jobs import next_step_wait
from metastore.state import MetastoreState
from tests.metastore import test_manifests as manifests
from tests.metastore._driver import DD, DD_MS, MS, Driver, ok, refused
from tests.metastore._support import DETERMINISTIC

T = TableName.of("ns", "t")
SETTLE_MS = DD_MS + 1  # long enough for the last version to activate


def table_driver(
    columns: str = "a INT, b STRING NOT NULL, c INT", *, apply_version: int | None = None
) -> Driver:
    d = Driver() if apply_version is None else Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.t ({columns})")
    d.tm += SETTLE_MS * MS
    return d


def names(d: Driver, *, write: bool = False) -> list[str]:
    v = d.state.current(T)
    return [c.name for c in (v.write_schema if write else v.schema).columns]


def job_of(result: dict[str, object]) -> int:
    job_id = result["job_id"]
    assert isinstance(job_id, int)
    return job_id


def advance(d: Driver, job_id: int) -> dict[str, object]:
    step = d.state.jobs.get(job_id).step
    return ok(d, AdvanceSchemaJob(job_id=job_id, step=step), step_ms=SETTLE_MS)


def commit_cmd(d: Driver, txn: str, *, version: int | None = None, files: int = 1) -> CommitTxn:
    return CommitTxn(
        txn_id=txn,
        writes=(
            TableWrite(
                table=T,
                schema_version=version or d.state.current(T).version,
                add=tuple(
                    DataFile(path=f"{txn}-{i}.parquet", size_bytes=10, row_count=1)
                    for i in range(files)
                ),
            ),
        ),
    )


def commit(
    d: Driver, txn: str, *, version: int | None = None, files: int = 1, settle: bool = True
) -> int:
    if settle:
        d.tm += SETTLE_MS * MS
    result = ok(
        d,
        CommitTxn(
            txn_id=txn,
            writes=(
                TableWrite(
                    table=T,
                    schema_version=version or d.state.current(T).version,
                    add=tuple(
                        DataFile(path=f"{txn}-{i}.parquet", size_bytes=10, row_count=1)
                        for i in range(files)
                    ),
                ),
            ),
        ),
    )
    ts = result["ts"]
    assert isinstance(ts, int)
    return ts


def session(d: Driver, sid: str = "s1") -> None:
    info = SessionInfo(app_id="app-1", host="h", user="u", pid=1)
    ok(d, OpenSession(session_id=sid, info=info, ttl_ms=60_000))


def lease(d: Driver, version: int, sid: str = "s1") -> LeaseKey:
    key = LeaseKey(table=T, table_id=d.state.catalog.live_table(T).table_id, version=version)
    ok(d, AcquireLeases(session_id=sid, leases=(key,)))
    return key


# ------------------------------------------------------------------------------ DROP COLUMN


def test_drop_column_hides_the_column_at_once_and_drops_it_in_a_second_step() -> None:
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))
    assert names(d) == ["a", "c"]  # readers: hidden from the first step on
    write = d.state.current(T).write_schema
    assert [c.name for c in write.columns] == ["a", "c", "b"]
    assert write.columns[-1].nullable  # writers fill NULL: NOT NULL is dropped first
    job = d.state.jobs.get(job_id)
    assert (job.status, job.step_name, job.versions) == ("running", "write_only", (2,))
    advance(d, job_id)
    job = d.state.jobs.get(job_id)
    assert (job.status, job.step_name, job.versions) == ("succeeded", "dropped", (2, 3))
    assert names(d, write=True) == ["a", "c"]
    assert d.state.current(T).pending == ()
    # The dropped id never comes back; the name is free again.
    d.ok("ALTER TABLE ns.t ADD COLUMN b INT")
    assert d.state.current(T).schema.columns[-1].field_id == 4


def test_a_step_is_a_compare_and_swap_and_a_duplicate_changes_nothing() -> None:
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))
    ok(d, AdvanceSchemaJob(job_id=job_id, step=0), step_ms=SETTLE_MS)
    refused(d, AdvanceSchemaJob(job_id=job_id, step=0), SchemaJobStateError)
    refused(d, AdvanceSchemaJob(job_id=99, step=0), SchemaJobNotFoundError)


def test_the_gate_holds_a_step_while_a_lease_sits_two_versions_behind() -> None:
    d = table_driver()
    session(d)
    key = lease(d, 1)
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))  # v2: v1 is still one of two
    d.tm += SETTLE_MS * MS
    wait = next_step_wait(
        d.state.jobs.get(job_id),
        catalog=d.state.catalog,
        sessions=d.state.sessions,
        now_tm=d.tm,
        cs_max=0,
    )
    assert wait.reason == "leases"
    assert wait.blockers[0]["session_id"] == "s1"
    assert wait.blockers[0]["app_id"] == "app-1"
    refused(d, AdvanceSchemaJob(job_id=job_id, step=0), SchemaChangeBlockedError)
    ok(d, ReleaseLeases(session_id="s1", leases=(key,)))
    advance(d, job_id)
    assert d.state.jobs.get(job_id).status == "succeeded"


def test_a_step_the_version_limit_refuses_is_not_proposed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table at MAX_SCHEMA_VERSIONS_PER_TABLE cannot publish a job's next step: apply refuses
    it (LIMIT_EXCEEDED) every time. next_step_wait said there was nothing to wait for, so the
    leader's worker proposed the refused step again every poll, forever (a Raft entry each).
    (A state of before the job's versions were kept free; lowering the limit makes one.)"""
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))  # v2
    d.ok("ALTER TABLE ns.t SET TBLPROPERTIES ('k'='v')")  # v3
    monkeypatch.setattr(limits, "MAX_SCHEMA_VERSIONS_PER_TABLE", 3)  # v3: the limit
    d.tm += SETTLE_MS * MS
    job = d.state.jobs.get(job_id)
    refused(d, AdvanceSchemaJob(job_id=job_id, step=job.step), LimitExceededError)
    wait = next_step_wait(
        job, catalog=d.state.catalog, sessions=d.state.sessions, now_tm=d.tm, cs_max=0
    )
    assert wait.reason == "limit"
    assert "MAX_SCHEMA_VERSIONS_PER_TABLE" in wait.message


@pytest.mark.parametrize("end", ["finish", "cancel"])
def test_the_version_limit_keeps_room_for_running_jobs_to_finish_or_cancel(
    monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """One-step ALTERs could take the versions up to MAX_SCHEMA_VERSIONS_PER_TABLE while a job
    ran. Its next step and its cancel (a rollback version) were then refused at every try: the
    job could neither finish nor be cancelled, its column name stayed taken, and only DROP
    TABLE ended it. The versions a running job still needs are now kept free."""
    monkeypatch.setattr(limits, "MAX_SCHEMA_VERSIONS_PER_TABLE", 8)
    d = table_driver()  # v1
    drop = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN c"))  # v2; needs 1 more
    add = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7"))  # v3; 3 more
    d.ok("ALTER TABLE ns.t SET TBLPROPERTIES ('k'='1')")  # v4: 4 left, all kept for the jobs
    refused(d, parse_ddl("ALTER TABLE ns.t SET TBLPROPERTIES ('k'='2')"), LimitExceededError)
    refused(d, parse_ddl("ALTER TABLE ns.t DROP COLUMN a"), LimitExceededError)
    assert d.state.current(T).version == 4
    if end == "finish":
        d.finish_jobs()
        assert d.state.jobs.get(add).status == "succeeded"
        assert names(d) == ["a", "b", "n"]
    else:
        ok(d, CancelSchemaJob(job_id=add), step_ms=SETTLE_MS)
        ok(d, CancelSchemaJob(job_id=drop), step_ms=SETTLE_MS)
        assert d.state.jobs.get(add).status == "cancelled"
        assert names(d) == ["a", "b", "c"]
        # The versions the ended jobs no longer need are free again.
        d.ok("ALTER TABLE ns.t SET TBLPROPERTIES ('k'='2')")
    assert d.state.jobs.get(drop).status in ("succeeded", "cancelled")
    d.state.check_invariants()


def test_a_pending_column_counts_towards_the_column_limit() -> None:
    """Writers of a version write its public and write-only columns, and a job's last step
    makes its column public. When one-step ADD COLUMNs could fill the public schema up to
    MAX_COLUMNS_PER_TABLE while a job's column was pending, the job's next step was refused
    (LIMIT_EXCEEDED) at every try, forever: the leader's worker saw nothing to wait for and
    proposed it again every poll, and the job never ended."""
    width = limits.MAX_COLUMNS_PER_TABLE - 2
    d = table_driver(", ".join(f"c{i} INT" for i in range(width)))
    job_id = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1"))
    d.ok("ALTER TABLE ns.t ADD COLUMN x INT")  # width + 1 public, n pending: the limit
    refused(d, parse_ddl("ALTER TABLE ns.t ADD COLUMN y INT"), LimitExceededError)
    d.finish_jobs()
    assert d.state.jobs.get(job_id).status == "succeeded"
    assert len(d.state.current(T).schema.columns) == limits.MAX_COLUMNS_PER_TABLE


def test_a_pending_column_keeps_its_name_until_the_job_ends() -> None:
    d = table_driver()
    d.ok("ALTER TABLE ns.t DROP COLUMN b")
    for sql in (
        "ALTER TABLE ns.t ADD COLUMN b INT",
        "ALTER TABLE ns.t ADD COLUMN B INT",
        "ALTER TABLE ns.t RENAME COLUMN a TO b",
    ):
        outcome = d.sql(sql)
        assert isinstance(outcome.exception(), SchemaJobConflictError), sql
    # Readers do not see b, so naming it is "not found", as for any missing column.
    assert d.sql("ALTER TABLE ns.t RENAME COLUMN b TO z").error is not None
    # Other one-step changes go on while the job runs; the job's next step keeps them.
    d.ok("ALTER TABLE ns.t ADD COLUMN d INT")
    d.state.check_invariants()


def test_a_job_change_must_be_the_alters_only_change() -> None:
    d = table_driver()
    outcome = d.sql("ALTER TABLE ns.t ADD COLUMNS (x INT NOT NULL DEFAULT 1, y INT)")
    assert isinstance(outcome.exception(), UnsupportedSchemaChangeError)
    # SQL has no "DROP COLUMN b, ADD COLUMN z"; the command can say it.
    drop = parse_ddl("ALTER TABLE ns.t DROP COLUMN b")
    add = parse_ddl("ALTER TABLE ns.t ADD COLUMN z INT")
    assert isinstance(drop, AlterTable)
    assert isinstance(add, AlterTable)
    both = AlterTable(table=T, changes=(*add.changes, *drop.changes))
    refused(d, both, UnsupportedSchemaChangeError)
    assert d.state.jobs.is_empty()


def test_nested_drops_and_nullable_adds_stay_one_step() -> None:
    d = table_driver("a INT, s STRUCT<x: INT, y: INT>")
    assert "job_id" not in d.ok("ALTER TABLE ns.t DROP COLUMN s.x")
    assert "job_id" not in d.ok("ALTER TABLE ns.t ADD COLUMN n INT DEFAULT 3")
    assert "job_id" not in d.ok("ALTER TABLE ns.t ALTER COLUMN a TYPE BIGINT")
    assert d.state.jobs.is_empty()


def test_drop_column_if_exists_of_a_missing_column_changes_nothing() -> None:
    d = table_driver()
    result = d.ok("ALTER TABLE ns.t DROP COLUMN IF EXISTS zz")
    assert result["changed"] is False
    assert d.state.jobs.is_empty()


# ------------------------------------------------------------------------------ ADD COLUMN


def test_add_not_null_default_on_an_empty_table_needs_no_backfill() -> None:
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7 AFTER a"))
    assert names(d) == names(d, write=True) == ["a", "b", "c"]  # delete-only: nobody sees it
    assert [p.state for p in d.state.current(T).pending] == ["delete_only"]
    advance(d, job_id)  # write-only: writers fill it
    assert names(d) == ["a", "b", "c"]
    assert names(d, write=True) == ["a", "b", "c", "n"]
    assert d.state.current(T).write_schema.columns[-1].default_sql == "7"
    advance(d, job_id)  # backfill: nothing to do
    job = d.state.jobs.get(job_id)
    assert job.step_name == "backfill"
    assert not job.backfill_needed
    advance(d, job_id)  # public, at the position asked
    assert names(d) == ["a", "n", "b", "c"]
    assert d.state.jobs.get(job_id).status == "succeeded"
    assert [v.version for v in d.state.history(T)] == [1, *d.state.jobs.get(job_id).versions]
    assert len(d.state.history(T)) == 5


def test_add_on_a_table_with_files_waits_for_a_backfill_that_covers_every_old_write() -> None:
    d = table_driver()
    commit(d, "before")
    job_id = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7"))
    delete_only = d.state.current(T).version
    advance(d, job_id)
    job = d.state.jobs.get(job_id)
    assert job.backfill_needed
    assert job.write_only_version == delete_only + 1
    advance(d, job_id)  # the backfill step's version: same shape, through the gate
    job = d.state.jobs.get(job_id)
    assert job.versions == (delete_only, delete_only + 1, delete_only + 2)
    from_ts = job.backfill_from_ts
    assert from_ts == d.state.current(T).tu
    # Until it activates, a writer still pinned to the delete-only version may commit...
    old_ts = commit(d, "old-writer", version=delete_only, settle=False)
    assert old_ts < from_ts
    assert d.state.jobs.get(job_id).last_old_write_ts == old_ts
    # ... so public is refused until a backfill is reported, and a backfill must read the
    # table at or after that activation.
    refused(d, AdvanceSchemaJob(job_id=job_id, step=2), BackfillIncompleteError)
    early = refused(
        d,
        SchemaJobBackfilled(job_id=job_id, snapshot_ts=from_ts - 1, files_rewritten=1),
        BackfillIncompleteError,
    )
    assert ts_text(from_ts - 1) in str(early) and ts_text(from_ts) in str(early)  # readable
    ok(d, SchemaJobBackfilled(job_id=job_id, snapshot_ts=from_ts, files_rewritten=2))
    commit(d, "new-writer")  # at the latest version: has the column
    advance(d, job_id)
    job = d.state.jobs.get(job_id)
    assert (job.status, job.files_rewritten) == ("succeeded", 2)
    assert names(d) == ["a", "b", "c", "n"]


def test_a_file_in_a_manifest_still_needs_a_backfill_whatever_delete_entries_wait() -> None:
    """Whether an ADD job needs a backfill was decided from the table's live file count, which
    subtracts one file per pending delete entry. Delete entries of manifests an overwrite
    truncated stay until compactions fold them (at most MANIFEST_REWRITES_MAX manifests each),
    so a table whose only live file sat in a manifest counted 0 live files: the job skipped
    the backfill and made the NOT NULL column public over a file that lacks it. From apply
    version 4 any live entry of an untruncated manifest counts."""
    for version, needed in ((4, True), (3, False)):
        d, store = manifests.ready(), manifests.Store()
        if version < 4:
            d.state.apply_version = version  # a cluster not yet moved to version 4
        for i in range(6):
            ok(d, manifests.add(f"t{i}", f"f{i}"))
        ok(d, manifests.command(d, store, manifests.plan(d, store, entries_max=1)))
        ok(d, manifests.add("rm", remove=tuple(f"f{i}" for i in range(6))))  # 6 delete entries
        ts = ok(d, manifests.add("ow", "c", overwrite=True))["ts"]  # truncates the 6 manifests
        assert isinstance(ts, int)
        # c moves into a manifest; 4 delete entries wait for the next compaction.
        p = manifests.plan(d, store, rewrites_max=2)
        assert p is not None
        ok(d, manifests.command(d, store, p))
        assert [f[0] for f in manifests.full_files(d, store, ts)] == ["c"]
        d.tm += SETTLE_MS * MS
        job_id = job_of(d.ok("ALTER TABLE ns.a ADD COLUMN n INT NOT NULL DEFAULT 7"))
        advance(d, job_id)  # write_only: records whether a backfill is needed
        assert d.state.jobs.get(job_id).backfill_needed is needed


def test_no_writer_without_the_column_commits_once_the_backfill_version_is_active() -> None:
    d = table_driver()
    commit(d, "before")
    job_id = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7"))
    delete_only = d.state.current(T).version
    advance(d, job_id)
    advance(d, job_id)
    ok(d, SchemaJobBackfilled(job_id=job_id, snapshot_ts=d.tm + DD, files_rewritten=1))
    d.tm += SETTLE_MS * MS
    refused(d, commit_cmd(d, "late", version=delete_only), SchemaVersionNotActiveError)
    advance(d, job_id)
    assert d.state.jobs.get(job_id).status == "succeeded"


def test_the_backfill_step_waits_for_writers_without_the_column_to_drain() -> None:
    d = table_driver()
    session(d)
    job_id = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7"))
    delete_only = d.state.current(T).version
    key = lease(d, delete_only)
    advance(d, job_id)  # write-only: the lease on delete-only is one behind, allowed
    refused(d, AdvanceSchemaJob(job_id=job_id, step=1), SchemaChangeBlockedError)
    ok(d, ReleaseLeases(session_id="s1", leases=(key,)))
    advance(d, job_id)
    assert d.state.jobs.get(job_id).step_name == "backfill"


# ------------------------------------------------------------------------------ cancel, drop


def test_cancelling_a_drop_puts_the_column_back_where_it_was() -> None:
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))
    result = ok(d, CancelSchemaJob(job_id=job_id, by="alice"), step_ms=SETTLE_MS)
    assert result["job_id"] == job_id
    assert names(d) == ["a", "b", "c"]
    b = d.state.current(T).schema.columns[1]
    # b was NOT NULL; it comes back nullable: see the test below.
    assert (b.field_id, b.nullable) == (2, True)
    job = d.state.jobs.get(job_id)
    assert (job.status, job.ended_by) == ("cancelled", "alice")
    refused(d, CancelSchemaJob(job_id=job_id), SchemaJobStateError)
    refused(d, AdvanceSchemaJob(job_id=job_id, step=0), SchemaJobStateError)


def test_a_cancelled_drop_of_a_not_null_column_brings_it_back_nullable() -> None:
    """While b (NOT NULL, no DEFAULT) is being dropped, writers of the write-only version fill
    it with NULL, and they may still commit after the cancel (that version stays one of the two
    latest active). Restoring b as NOT NULL made the schema promise what the files break: a
    Spark reader trusting it drops `b IS NULL` filters and reads NULLs from a NOT NULL column."""
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))
    write_only = d.state.current(T)
    [pending] = write_only.pending
    assert pending.column.name == "b" and pending.column.nullable  # NULL-filled meanwhile
    commit(d, "during-drop", version=write_only.version)
    ok(d, CancelSchemaJob(job_id=job_id, by="alice"), step_ms=SETTLE_MS)
    # A writer of the write-only version still commits after the cancel.
    commit(d, "after-cancel", version=write_only.version)
    b = d.state.current(T).schema.columns[1]
    assert (b.name, b.field_id) == ("b", 2)
    assert b.nullable, "files of the write-only version hold NULLs in b"


def test_a_cancel_blocked_by_leases_is_recorded_and_wins_over_the_next_step() -> None:
    d = table_driver()
    session(d)
    key = lease(d, 1)
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))
    result = ok(d, CancelSchemaJob(job_id=job_id, by="alice"), step_ms=SETTLE_MS)
    assert (result["job_id"], result["cancel_requested"], result["changed"]) == (
        job_id,
        True,
        False,
    )
    [blocker] = result["blockers"]  # type: ignore[misc]
    assert blocker["session_id"] == "s1"
    job = d.state.jobs.get(job_id)
    assert (job.status, job.cancel_requested, job.versions) == ("running", True, (2,))
    assert names(d) == ["a", "c"]  # nothing published yet
    wait = next_step_wait(
        job, catalog=d.state.catalog, sessions=d.state.sessions, now_tm=d.tm, cs_max=0
    )
    assert (wait.reason, wait.blockers[0]["session_id"]) == ("leases", "s1")
    assert ok(d, CancelSchemaJob(job_id=job_id))["changed"] is False  # asked twice: the same
    ok(d, ReleaseLeases(session_id="s1", leases=(key,)))
    # The worker's next proposal for this job rolls it back instead of dropping the column.
    advance(d, job_id)
    job = d.state.jobs.get(job_id)
    assert (job.status, job.ended_by, job.versions) == ("cancelled", "alice", (2, 3))
    assert names(d) == ["a", "b", "c"]
    refused(d, AdvanceSchemaJob(job_id=job_id, step=0), SchemaJobStateError)


def test_cancelling_an_add_removes_the_column_and_retires_its_id() -> None:
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7"))
    advance(d, job_id)
    ok(d, CancelSchemaJob(job_id=job_id), step_ms=SETTLE_MS)
    assert d.state.current(T).pending == ()
    d.ok("ALTER TABLE ns.t ADD COLUMN n INT")
    assert d.state.current(T).schema.columns[-1].field_id == 5  # 4 went with the job


def test_a_dropped_table_aborts_its_jobs() -> None:
    d = table_driver()
    job_id = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))
    d.ok("DROP TABLE ns.t")
    job = d.state.jobs.get(job_id)
    assert (job.status, job.message) == ("aborted", "its table was dropped")
    refused(d, AdvanceSchemaJob(job_id=job_id, step=0), SchemaJobStateError)


def test_a_job_that_ends_after_newer_ones_is_kept_among_the_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finished jobs are capped at MAX_FINISHED_SCHEMA_JOBS_KEPT, the oldest forgotten first.
    "Oldest" was the lowest job id: a long-running job (waiting for a backfill or for leases)
    that ended after the cap's worth of newer jobs had finished was forgotten by the very entry
    that ended it, so `job wait`/`job show` of a job that had just succeeded said
    SCHEMA_JOB_NOT_FOUND. From apply version 4 the jobs that ended first go first."""
    monkeypatch.setattr(limits, "MAX_FINISHED_SCHEMA_JOBS_KEPT", 2)
    d = table_driver("a INT, b INT, c INT, e INT")
    slow = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN a"))  # runs while newer jobs end
    first = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN b"))
    advance(d, first)
    second = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN c"))
    advance(d, second)
    advance(d, slow)
    assert d.state.jobs.get(slow).status == "succeeded"
    assert [j.job_id for j in d.state.jobs.jobs()] == [slow, second]
    refused(d, AdvanceSchemaJob(job_id=first, step=0), SchemaJobNotFoundError)
    # Below version 4 every node keeps the old rule (lowest ids forgotten first).
    old = table_driver("a INT, b INT, c INT, e INT", apply_version=3)
    slow = job_of(old.ok("ALTER TABLE ns.t DROP COLUMN a"))
    for column in ("b", "c"):
        advance(old, job_of(old.ok(f"ALTER TABLE ns.t DROP COLUMN {column}")))
    advance(old, slow)
    assert [j.job_id for j in old.state.jobs.jobs()] == [2, 3]


def test_files_rewritten_by_reports_stays_a_64_bit_count() -> None:
    """Each backfill report adds its `files_rewritten` (up to 2^63-1) to the job's count, with
    no bound: three reports took it past 2^64, and every node then failed to write a snapshot
    (msgpack: "Integer value out of range"), so its log could never be compacted again. From
    apply version 4 the count saturates at 2^63-1."""
    top = 2**63 - 1
    for version, want in ((4, top), (3, 3 * top)):
        d = table_driver(apply_version=version)
        commit(d, "x")
        job_id = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7"))
        advance(d, job_id)
        advance(d, job_id)  # backfill
        d.tm += SETTLE_MS * MS
        for _ in range(3):
            report = SchemaJobBackfilled(job_id=job_id, snapshot_ts=d.tm, files_rewritten=top)
            ok(d, report)
        assert d.state.jobs.get(job_id).files_rewritten == want
        if version >= 4:
            restored = MetastoreState.from_snapshot(d.state.to_snapshot())
            assert restored == d.state


# ------------------------------------------------------------------------------ codec, snapshots


@pytest.mark.parametrize(
    "cmd",
    [
        AdvanceSchemaJob(request_id="r", job_id=3, step=1),
        CancelSchemaJob(job_id=3, by="bob"),
        SchemaJobBackfilled(job_id=3, snapshot_ts=12345, files_rewritten=9, by="spark"),
    ],
)
def test_job_commands_round_trip(cmd: Command) -> None:
    assert decode_command(encode_command(cmd)) == cmd


def test_a_job_command_with_a_bad_id_is_refused_and_changes_nothing() -> None:
    d = table_driver()
    refused(d, AdvanceSchemaJob(job_id=0, step=0), InvalidArgumentError)
    refused(d, SchemaJobBackfilled(job_id=1, snapshot_ts=-1, files_rewritten=0), MetastoreError)


def test_snapshots_keep_running_and_finished_jobs_and_version_4_loads() -> None:
    d = table_driver()
    commit(d, "x")
    done = job_of(d.ok("ALTER TABLE ns.t DROP COLUMN c"))
    advance(d, done)
    running = job_of(d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 7"))
    advance(d, running)
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state
    assert restored.to_snapshot() == snap
    assert restored.jobs.get(running).write_only_version == d.state.current(T).version
    # A version 4 snapshot (before jobs) of a state without jobs still loads.
    plain = table_driver()
    obj = msgpack.unpackb(plain.state.to_snapshot(), raw=False)
    del obj["jobs"]
    del obj["revoked"], obj["apply_version"]  # formats 7 and 8
    obj["v"] = 4
    old = MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    assert old.jobs.is_empty()
    assert old.catalog == plain.state.catalog


# ------------------------------------------------------------------------------ random histories


class JobMachine(RuleBasedStateMachine):
    """Jobs, one-step ALTERs, commits at any active version, sessions with leases, heartbeats
    stopping (expiry), cancels and snapshot restarts, in any order. After every step: the
    invariants hold (two leased versions at most, pending columns owned by running jobs), a
    failed command changed nothing, and a replica that restarted from a snapshot earlier and
    applied the same entries has the same state."""

    def __init__(self) -> None:
        super().__init__()
        self.d = table_driver("a INT, b INT, c INT")
        self.replica = MetastoreState.from_snapshot(self.d.state.to_snapshot())
        self.counter = 0
        # The oracle for backfills: (commit ts, schema version) of every file (none is removed).
        self.files: list[tuple[int, int]] = []

    def apply(self, cmd: Command, step_ms: int) -> bool:
        before = self.d.state.to_snapshot()
        outcome = self.d.apply(cmd, step_ms=step_ms)
        self.replica.apply(cmd, tm=self.d.tm, index=self.d.index)
        if not outcome.ok:
            assert self.d.state.to_snapshot() == before, (cmd, outcome.error)
            return False
        if isinstance(cmd, CommitTxn):
            ts = outcome.result["ts"]
            assert isinstance(ts, int)
            self.files.append((ts, cmd.writes[0].schema_version))
        if isinstance(cmd, AdvanceSchemaJob):
            self._check_public_step(cmd.job_id)
        return True

    def _check_public_step(self, job_id: int) -> None:
        """An ADD job goes public only once every file written without its column before this
        entry is covered by the accepted backfill's snapshot."""
        job = self.d.state.jobs.get(job_id)
        if job.kind != "add_column" or job.status != "succeeded":
            return
        wo = job.write_only_version
        assert wo is not None
        old = [ts for ts, version in self.files if version < wo and ts < self.d.tm]
        if old:
            assert job.backfill_ts is not None, job
            assert max(old) <= job.backfill_ts, (old, job)

    steps = st.integers(1, 2 * DD_MS)

    @rule(data=st.data(), step=steps)
    def drop(self, data: st.DataObject, step: int) -> None:
        public = [c.name for c in self.d.state.current(T).schema.columns]
        col = data.draw(st.sampled_from([*public, "zz"]))
        self.apply(parse_ddl(f"ALTER TABLE ns.t DROP COLUMN {col}"), step)

    @rule(data=st.data(), null=st.sampled_from([True, False, False]), step=steps)
    def add(self, data: st.DataObject, null: bool, step: int) -> None:
        taken = {c.name for c in self.d.state.current(T).schema.columns}
        col = data.draw(st.sampled_from([c for c in "bdefg" if c not in taken] or ["b"]))
        spec = "INT" if null else "INT NOT NULL DEFAULT 1"
        self.apply(parse_ddl(f"ALTER TABLE ns.t ADD COLUMN {col} {spec}"), step)

    @precondition(lambda self: self.d.state.jobs.jobs(running_only=True))
    @rule(data=st.data(), step=steps, action=st.sampled_from(["advance"] * 5 + ["cancel"]))
    def move_a_job(self, data: st.DataObject, step: int, action: str) -> None:
        """The leader's worker (mostly) or a user's cancel."""
        job = data.draw(st.sampled_from(self.d.state.jobs.jobs(running_only=True)))
        if action == "advance":
            self.apply(AdvanceSchemaJob(job_id=job.job_id, step=job.step), step)
        else:
            self.apply(CancelSchemaJob(job_id=job.job_id), step)

    def _at_backfill(self) -> list[int]:
        return [j.job_id for j in self.d.state.jobs.jobs(running_only=True) if j.step == 2]

    @precondition(lambda self: self._at_backfill())
    @rule(data=st.data(), back=st.integers(0, 3 * DD_MS), step=steps)
    def report_backfill(self, data: st.DataObject, back: int, step: int) -> None:
        job_id = data.draw(st.sampled_from(self._at_backfill()))
        snapshot_ts = self.d.tm - back * MS  # sometimes before the step began or an old write
        cmd = SchemaJobBackfilled(job_id=job_id, snapshot_ts=snapshot_ts, files_rewritten=1)
        self.apply(cmd, step)

    @precondition(lambda self: self._at_backfill())
    @rule(data=st.data(), step=steps)
    def old_writer_races_a_backfill(self, data: st.DataObject, step: int) -> None:
        """A writer still pinned to the version before write-only commits while a backfill
        that read the table just before it reports."""
        job = self.d.state.jobs.get(data.draw(st.sampled_from(self._at_backfill())))
        wo = job.write_only_version
        assert wo is not None
        snapshot_ts = self.d.tm + 1
        self.counter += 1
        write = TableWrite(
            table=T,
            schema_version=wo - 1,
            add=(DataFile(path=f"f{self.counter}.parquet", size_bytes=1, row_count=1),),
        )
        self.apply(CommitTxn(txn_id=f"t{self.counter}", writes=(write,)), step)
        cmd = SchemaJobBackfilled(job_id=job.job_id, snapshot_ts=snapshot_ts, files_rewritten=1)
        self.apply(cmd, step)

    @rule(back=st.integers(0, 2), step=steps)
    def commit(self, back: int, step: int) -> None:
        self.counter += 1
        version = max(1, self.d.state.current(T).version - back)
        write = TableWrite(
            table=T,
            schema_version=version,
            add=(DataFile(path=f"f{self.counter}.parquet", size_bytes=1, row_count=1),),
        )
        self.apply(CommitTxn(txn_id=f"t{self.counter}", writes=(write,)), step)

    @rule(sid=st.sampled_from(["s1", "s2"]), back=st.integers(0, 1), step=steps)
    def lease(self, sid: str, back: int, step: int) -> None:
        if self.d.state.sessions.session(sid) is None:
            info = SessionInfo(app_id=sid)
            self.apply(OpenSession(session_id=sid, info=info, ttl_ms=5_000), step)
            return
        version = max(1, self.d.state.current(T).version - back)
        key = LeaseKey(table=T, table_id=1, version=version)
        self.apply(AcquireLeases(session_id=sid, leases=(key,)), step)

    @rule(sid=st.sampled_from(["s1", "s2"]), step=steps)
    def heartbeat(self, sid: str, step: int) -> None:
        if self.d.state.sessions.session(sid) is not None:
            self.apply(HeartbeatSession(session_id=sid), step)

    @rule(sid=st.sampled_from(["s1", "s2"]), step=steps)
    def release_all(self, sid: str, step: int) -> None:
        keys = tuple(
            LeaseKey(table=T, table_id=lease.table_id, version=lease.version)
            for lease in self.d.state.sessions.leases(table_id=1)
            if lease.session_id == sid
        )
        if keys:
            self.apply(ReleaseLeases(session_id=sid, leases=keys), step)

    @rule(step=steps)
    def expire(self, step: int) -> None:
        late = self.d.state.sessions.expired_at(self.d.tm + step * MS)
        if late:
            self.apply(ExpireSessions(session_ids=tuple(late), reason="ttl"), step)

    @rule()
    def restart_replica_from_a_snapshot(self) -> None:
        self.replica = MetastoreState.from_snapshot(self.d.state.to_snapshot())

    @invariant()
    def sound_and_identical(self) -> None:
        self.d.state.check_invariants()
        assert self.replica.to_snapshot() == self.d.state.to_snapshot()
        current = self.d.state.current(T)
        public = {c.name.casefold() for c in current.schema.columns}
        assert public, "a table always keeps a public column"
        assert not public & {p.column.name.casefold() for p in current.pending}
        assert current.tu <= self.d.tm + DD


JobMachine.TestCase.settings = settings(DETERMINISTIC, max_examples=60, stateful_step_count=50)
TestJobMachine = JobMachine.TestCase
