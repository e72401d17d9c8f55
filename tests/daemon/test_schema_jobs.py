"""Schema change jobs on a real 3-node cluster (separate OS processes on loopback, killed by PID).

DROP COLUMN (write-only -> dropped) and ADD COLUMN ... NOT NULL DEFAULT (delete-only ->
write-only -> backfill -> public) are driven by the leader's job worker alone: a DROP finishes by
itself and every node answers the same schema at each of its versions; a lease on the version
before the job holds it (job_show names the session) until released or expired; a kill -9 of the
leader at every step, or of all three nodes, resumes the job from the log; an ADD on a table with
files waits for a backfill report whose snapshot must follow the backfill step and every old
write; cancelling restores the public shape. Errors: SCHEMA_JOB_STATE, SCHEMA_JOB_NOT_FOUND,
FORBIDDEN, SCHEMA_JOB_CONFLICT, UNSUPPORTED_SCHEMA_CHANGE, SCHEMA_CHANGE_BLOCKED."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from hlc.limits import LOGICAL_BITS
from metastore.client import SyncMetastoreClient
from metastore.commands import AlterTable, encode_command
from metastore.ddl import parse_ddl
from metastore.errors import (
    BackfillIncompleteError,
    ForbiddenError,
    MetastoreError,
    SchemaJobConflictError,
    SchemaJobNotFoundError,
    SchemaJobStateError,
    SchemaVersionNotActiveError,
    UnsupportedSchemaChangeError,
)
from raft.framing import encode_frame
from tests.daemon.harness import FRAME_MAX, MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

NS = "sj"
TTL_MS = 1_500  # the cluster's session TTL: a silent session blocks jobs this long at most
HELD_TTL_MS = 60_000  # sessions that hold a job on purpose
WAIT_S = 30  # the bound of every wait
# Per-node fields of a schema answer (everything else must be identical on every node).
PER_NODE = ("waited_ms", "safe_time", "ts")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("jobs"),
        3,
        dd_ms=300,
        cs_max_ms=100,
        session_ttl_ms=TTL_MS,
        session_heartbeat_ms=300,
        # Snapshots every 100 entries (idle entries come every 250 ms): restarted nodes restore
        # the jobs from a snapshot, not only from the log.
        snapshot_every_entries=100,
    ) as c:
        c.start_all()
        c.wait_ready()
        with _client(c, role="admin") as admin:
            admin.ddl(f"CREATE NAMESPACE {NS}")
        yield c


@pytest.fixture(autouse=True)
def _all_nodes_up(cluster: MetastoreCluster) -> None:
    """A test that failed half-way through a kill leaves the next one a whole cluster."""
    for node_id in cluster.ids:
        proc = cluster.procs.get(node_id)
        if proc is None or proc.poll() is not None:
            cluster.procs.pop(node_id, None)
            cluster.start(node_id)
    cluster.wait_ready(timeout_s=WAIT_S)


# ------------------------------------------------------------------------------------ helpers


def _client(
    c: MetastoreCluster, node_id: int | None = None, role: str = "writer"
) -> SyncMetastoreClient:
    ids = c.ids if node_id is None else [node_id]
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in ids]
    return SyncMetastoreClient(endpoints, c.token(role), client_name=f"jobs-test-{role}")


def _follower(c: MetastoreCluster) -> int:
    leader = c.wait_ready()
    return next(i for i in c.ids if i != leader)


def _wait_for(fn: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll `fn` until it returns something truthy; retryable errors (a leader change, a node
    catching up) count as "not yet"."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = fn()
        except MetastoreError as exc:
            if not exc.retryable:
                raise
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}: {last!r}")
        time.sleep(0.05)


def _wait_job(
    client: SyncMetastoreClient, job_id: int, pred: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = client.job_show(job_id)
        return job if pred(job) else None

    return dict(_wait_for(check, f"job {job_id}: {what}"))


def _held(step: str, reason: str = "leases") -> Callable[[dict[str, Any]], bool]:
    """The job is running at `step`, waiting for `reason`."""

    def pred(j: dict[str, Any]) -> bool:
        return (j["status"], j["step"], j["waiting_for"]["reason"]) == ("running", step, reason)

    return pred


def _succeeded(j: dict[str, Any]) -> bool:
    """Ended in the log, and its last version in force on every node."""
    return bool(j["status"] == "succeeded" and j["waiting_for"]["reason"] == "finished")


def _names(schema: dict[str, Any]) -> list[str]:
    return [c["name"] for c in schema["columns"]]


def _column(view: dict[str, Any], name: str) -> dict[str, Any]:
    [col] = [c for c in view["schema"]["columns"] if c["name"] == name]
    return dict(col)


def _create(client: SyncMetastoreClient, table: str, columns: str) -> dict[str, Any]:
    return client.ddl(f"CREATE TABLE {NS}.{table} ({columns})")


def _tu(client: SyncMetastoreClient, table: str, version: int) -> int:
    [v] = [v for v in client.history(f"{NS}.{table}")["versions"] if v["version"] == version]
    return int(v["tu"])


def _everywhere(c: MetastoreCluster, table: str, ts: int) -> dict[str, Any]:
    """The schema of `table` at `ts` as every node answers it: the same on each. Waits for
    `ts` to pass first (a version's Tu is up to DD ahead; nodes refuse reads beyond CSmax)."""
    _wait_for(lambda: time.time_ns() // 1_000_000 >= ts >> LOGICAL_BITS, f"the clock to pass {ts}")
    views: dict[int, dict[str, Any]] = {}
    for node_id in c.ids:
        with _client(c, node_id, role="reader") as reader:
            got = reader.schema_at(f"{NS}.{table}", ts=ts, timeout_ms=10_000)
        views[node_id] = {k: v for k, v in got.items() if k not in PER_NODE}
    first = views[c.ids[0]]
    assert all(v == first for v in views.values()), views
    return first


def _open(client: SyncMetastoreClient, ttl_ms: int | None = HELD_TTL_MS, **info: Any) -> str:
    session_id = uuid.uuid4().hex
    fields = {"app_id": "app-sj", "host": "worker-3", "user": "ana", "pid": 42, **info}
    assert client.session_open(session_id, ttl_ms=ttl_ms, **fields)["created"] is True
    return session_id


def _lease(client: SyncMetastoreClient, table: str, session_id: str) -> dict[str, Any]:
    """Pin `table` now and lease the pinned version: a running batch's first request."""
    [pin] = client.pin([f"{NS}.{table}"], session_id=session_id)["pins"]
    return {"table": f"{NS}.{table}", "table_id": pin["table_id"], "version": pin["version"]}


def _commit(
    client: SyncMetastoreClient,
    table: str,
    version: int,
    files: int = 2,
    not_before: int | None = None,
) -> int:
    """Commit `files` file entries written at schema `version` (no Parquet needed: the catalog
    only records them), at `not_before` or later. Returns the commit ts."""
    tag = uuid.uuid4().hex[:8]
    add = [
        {"path": f"_txn/{tag}/part-{i}.parquet", "size_bytes": 100, "row_count": 10}
        for i in range(files)
    ]
    result = client.commit(
        f"jobs-{tag}",
        [{"table": f"{NS}.{table}", "schema_version": version, "add": add}],
        not_before=not_before,
    )
    return int(result["ts"])


def _status(c: MetastoreCluster, node_id: int) -> dict[str, Any] | None:
    return c.try_status(node_id)


def _snapshot_ts(client: SyncMetastoreClient, job: dict[str, Any]) -> int:
    """A backfill's snapshot: the client's now, once its clock has passed the activation of
    the backfill step's version (from then on no writer without the column commits)."""
    client.clock.update(job["backfill_from_ts"])
    ts = client.clock.now()
    assert ts > job["backfill_from_ts"]
    return ts


def _kill_leader(c: MetastoreCluster) -> tuple[int, int]:
    """kill -9 the leader; returns (old, new) once the survivors agree on a new leader (the old
    one stays down: restart it with `c.start(old)`)."""
    old = c.wait_ready(timeout_s=WAIT_S)
    c.kill(old)
    survivors = [i for i in c.ids if i != old]

    def new_leader() -> int | None:
        states = [_status(c, i) for i in survivors]
        if not all(s and s["ready"] and s["role"] in ("leader", "follower") for s in states):
            return None
        leaders = {s["leader"] for s in states if s}
        if len(leaders) == 1 and (leader := leaders.pop()) in survivors:
            return int(leader)
        return None

    new = int(_wait_for(new_leader, f"a new leader after killing node {old}"))
    return old, new


def _restart(c: MetastoreCluster, node_id: int) -> None:
    c.start(node_id)
    c.wait_ready(timeout_s=WAIT_S)


def _job_on(c: MetastoreCluster, node_id: int, job_id: int) -> dict[str, Any]:
    with _client(c, node_id, role="reader") as reader:
        return reader.job_show(job_id)


def _pipelined(raw: RawClient, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send `calls` in one write on one connection (the server starts them in order), then
    collect every reply."""
    data = b""
    ids = []
    for op, args in calls:
        raw.next_id += 1
        ids.append(raw.next_id)
        data += encode_frame({"id": raw.next_id, "op": op, "args": args}, max_frame_bytes=FRAME_MAX)
    raw.send_raw(data)
    replies: dict[int, dict[str, Any]] = {}
    while len(replies) < len(ids):
        reply = raw.recv()
        assert reply is not None, "connection closed"
        replies[reply["id"]] = reply
    return [replies[i] for i in ids]


# ------------------------------------------------------------------------------ 1. DROP COLUMN


def test_drop_column_finishes_by_itself_and_every_node_agrees_at_each_version(
    cluster: MetastoreCluster,
) -> None:
    with _client(cluster, _follower(cluster)) as writer:
        created = _create(writer, "drop1", "a INT, b STRING NOT NULL, c INT")
        assert created["version"] == 1
        started = writer.ddl(f"ALTER TABLE {NS}.drop1 DROP COLUMN b")
        job_id = started["job_id"]
        assert (started["version"], started["job_step"], started["job_status"]) == (
            2,
            "write_only",
            "running",
        )
        job = _wait_job(writer, job_id, _succeeded, "to succeed with no lease in the way")
        assert job["versions"] == [2, 3] and job["base_version"] == 1
        assert (job["kind"], job["column"], job["step"]) == ("drop_column", "b", "dropped")
        assert job["waiting_for"]["reason"] == "finished"
        assert job_id not in [j["job_id"] for j in writer.job_list(f"{NS}.drop1")["jobs"]]
        assert job_id in [j["job_id"] for j in writer.job_list(f"{NS}.drop1", all=True)["jobs"]]
        tus = {v: _tu(writer, "drop1", v) for v in (1, 2, 3)}

    v1 = _everywhere(cluster, "drop1", tus[1])
    assert v1["version"] == 1 and _names(v1["schema"]) == ["a", "b", "c"]
    assert v1["pending"] == [] and "write_schema" not in v1
    b = _column(v1, "b")

    # Step 1 (write-only): readers no longer see b; writers of v2 still fill it (nullable now).
    v2 = _everywhere(cluster, "drop1", tus[2])
    assert v2["version"] == 2 and _names(v2["schema"]) == ["a", "c"]
    assert v2["pending"] == [
        {
            "field_id": b["field_id"],
            "name": "b",
            "state": "write_only",
            "action": "drop",
            "job_id": job_id,
        }
    ]
    assert _names(v2["write_schema"]) == ["a", "c", "b"]
    [written_b] = [c for c in v2["write_schema"]["columns"] if c["name"] == "b"]
    assert written_b["field_id"] == b["field_id"] and written_b["nullable"] is True

    # Step 2 (dropped): gone for everyone.
    v3 = _everywhere(cluster, "drop1", tus[3])
    assert v3["version"] == 3 and _names(v3["schema"]) == ["a", "c"]
    assert v3["pending"] == [] and "write_schema" not in v3
    # Between the steps, too, readers see v2's columns (a read at any ts is final everywhere).
    between = _everywhere(cluster, "drop1", (tus[2] + tus[3]) // 2)
    assert between["version"] == 2 and _names(between["schema"]) == ["a", "c"]


# -------------------------------------------------------------------- 2. leases hold a job


def test_a_lease_on_the_version_before_the_job_holds_it_until_released(
    cluster: MetastoreCluster,
) -> None:
    with _client(cluster, role="admin") as admin, _client(cluster, _follower(cluster)) as batch:
        _create(admin, "held", "a INT, b INT")
        session_id = _open(batch)
        lease = _lease(batch, "held", session_id)
        assert lease["version"] == 1
        job_id = admin.ddl(f"ALTER TABLE {NS}.held DROP COLUMN b")["job_id"]
        job = _wait_job(admin, job_id, _held("write_only"), "to wait for the lease")
        [blocker] = job["waiting_for"]["blockers"]
        assert (blocker["session_id"], blocker["version"]) == (session_id, 1)
        assert (blocker["app_id"], blocker["host"], blocker["user"]) == (
            "app-sj",
            "worker-3",
            "ana",
        )
        assert "lease" in job["waiting_for"]["message"]
        # It stays held well past the time a step takes (DD + CSmax + a worker poll).
        time.sleep(1.2)
        job = admin.job_show(job_id)
        assert (job["status"], job["step"], job["versions"]) == ("running", "write_only", [2])
        # Every node tells the same story.
        for node_id in cluster.ids:
            other = _job_on(cluster, node_id, job_id)
            assert (other["step"], other["waiting_for"]["reason"]) == ("write_only", "leases")

        released_at = time.monotonic()
        batch.lease_release(session_id, [lease])
        job = _wait_job(admin, job_id, _succeeded, "to finish once the lease is released")
        assert time.monotonic() - released_at < 5
        assert job["versions"] == [2, 3]
        batch.session_close(session_id)


def test_a_silent_session_holds_a_job_only_until_its_ttl(cluster: MetastoreCluster) -> None:
    with _client(cluster, role="admin") as admin, _client(cluster) as batch:
        _create(admin, "silent", "a INT, b INT")
        session_id = _open(batch, ttl_ms=None, app_id="app-dead")  # the cluster's 1.5 s TTL
        pinned = batch.pin([f"{NS}.silent"], session_id=session_id)
        deadline_tm = pinned["lease"]["deadline_tm"]
        started = time.monotonic()
        job_id = admin.ddl(f"ALTER TABLE {NS}.silent DROP COLUMN b")["job_id"]
        # No heartbeat ever comes: the lease stops counting at the session's deadline.
        job = _wait_job(admin, job_id, _succeeded, "to finish once the session expired")
        waited = time.monotonic() - started
        assert waited < TTL_MS / 1000 + 5
        # Without the lease it could have gone on at Tu(v2) + CSmax; it waited for the deadline.
        cs_max = 100 << LOGICAL_BITS
        assert _tu(admin, "silent", 2) + cs_max < deadline_tm <= job["updated_tm"]
        ended = _wait_for(
            lambda: [
                e
                for e in admin.session_list(include_ended=True).get("ended", [])
                if e["session_id"] == session_id
            ],
            "the session's expiry to be recorded",
        )
        assert ended[0]["reason"] == "ttl"
        v = _everywhere(cluster, "silent", _tu(admin, "silent", job["versions"][-1]))
        assert _names(v["schema"]) == ["a"] and v["pending"] == []


# ------------------------------------------------------------ 3. resume after kill -9


def _expect_final(
    c: MetastoreCluster, client: SyncMetastoreClient, table: str, job: dict[str, Any]
) -> dict[str, Any]:
    return _everywhere(c, table, _tu(client, table, job["versions"][-1]))


@pytest.mark.parametrize(
    "case", ["drop_write_only", "add_delete_only", "add_write_only", "add_backfill"]
)
def test_the_job_resumes_after_the_leader_is_killed_at_each_step(
    cluster: MetastoreCluster, case: str
) -> None:
    table = f"kill_{case}"
    with _client(cluster, role="admin") as admin, _client(cluster) as batch:
        _create(admin, table, "a INT, b INT")
        session_id = _open(batch)
        release: list[dict[str, Any]] = []
        if case == "add_backfill":
            _commit(batch, table, 1)  # live files: the ADD will need a backfill
        else:
            release.append(_lease(batch, table, session_id))  # on v1
        if case == "drop_write_only":
            job_id = admin.ddl(f"ALTER TABLE {NS}.{table} DROP COLUMN b")["job_id"]
            step, reason = "write_only", "leases"
        else:
            job_id = admin.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN n INT NOT NULL DEFAULT 7")[
                "job_id"
            ]
            step, reason = "delete_only", "leases"
            if case == "add_write_only":
                # Hold it at write-only: lease the delete-only version (v2), then let v1 go.
                _wait_job(admin, job_id, _held("delete_only"), "to wait for the v1 lease")
                v2 = _lease(batch, table, session_id)
                assert v2["version"] == 2
                batch.lease_release(session_id, release)
                release = [v2]
                step = "write_only"
            elif case == "add_backfill":
                step, reason = "backfill", "backfill"
        held = _wait_job(admin, job_id, _held(step, reason), f"to be held at {step}")
        if release:  # the lease named is the one holding it (v1; for add_write_only v2)
            blockers = held["waiting_for"]["blockers"]
            assert [(b["session_id"], b["version"]) for b in blockers] == [
                (session_id, release[0]["version"])
            ]

        old, new = _kill_leader(cluster)
        # The new leader has the job where the log left it, still held.
        on_new = _job_on(cluster, new, job_id)
        assert (on_new["status"], on_new["step"], on_new["versions"]) == (
            "running",
            step,
            held["versions"],
        )
        assert on_new["waiting_for"]["reason"] == reason
        _restart(cluster, old)
        on_old = _wait_for(lambda: _job_on(cluster, old, job_id), "the restarted node to serve")
        assert (on_old["step"], on_old["versions"]) == (step, held["versions"])

        if case == "add_backfill":
            snapshot_ts = _snapshot_ts(batch, held)  # after the backfill step began
            # The backfill rewrites the old files with n filled in, at the write-only version.
            _commit(batch, table, held["versions"][-1])
            got = batch.job_backfilled(job_id, snapshot_ts=snapshot_ts, files_rewritten=2)
            assert got["accepted"] is True
        else:
            batch.lease_release(session_id, release)
        job = _wait_job(admin, job_id, _succeeded, f"to finish after the kill at {step}")
        final = _expect_final(cluster, admin, table, job)
        assert final["pending"] == [] and "write_schema" not in final
        if case == "drop_write_only":
            assert job["versions"] == [2, 3] and _names(final["schema"]) == ["a"]
        else:
            assert len(job["versions"]) == 4 and _names(final["schema"]) == ["a", "b", "n"]
            n = _column(final, "n")
            assert (n["nullable"], n["default"], n["type"]) == (False, "7", "INT")
            assert job["backfill_needed"] is (case == "add_backfill")
        batch.session_close(session_id)


def test_the_job_resumes_after_every_node_is_killed(cluster: MetastoreCluster) -> None:
    table = "kill_all"
    with _client(cluster, role="admin") as admin, _client(cluster) as batch:
        _create(admin, table, "a INT")
        _commit(batch, table, 1)
        session_id = _open(batch)
        lease = _lease(batch, table, session_id)
        job_id = admin.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN n STRING NOT NULL DEFAULT 'x'")[
            "job_id"
        ]
        held = _wait_job(admin, job_id, _held("delete_only"), "to wait for the lease")
        for node_id in cluster.ids:
            cluster.kill(node_id)
        cluster.start_all()
        cluster.wait_ready(timeout_s=WAIT_S)
        for node_id in cluster.ids:
            job = _wait_for(partial(_job_on, cluster, node_id, job_id), f"node {node_id}")
            assert (job["status"], job["step"], job["versions"]) == (
                "running",
                "delete_only",
                held["versions"],
            )
        # The rest of the job runs on the leader elected after the restart.
        batch.lease_release(session_id, [lease])
        job = _wait_job(admin, job_id, _held("backfill", "backfill"), "to reach the backfill")
        assert job["backfill_needed"] is True
        batch.job_backfilled(job_id, snapshot_ts=_snapshot_ts(batch, job), files_rewritten=1)
        job = _wait_job(admin, job_id, _succeeded, "to go public")
        final = _expect_final(cluster, admin, table, job)
        assert _names(final["schema"]) == ["a", "n"] and _column(final, "n")["default"] == "'x'"
        batch.session_close(session_id)


# ------------------------------------------------------- 4. ADD COLUMN NOT NULL DEFAULT


def test_add_column_on_an_empty_table_needs_no_backfill(cluster: MetastoreCluster) -> None:
    with _client(cluster, _follower(cluster)) as writer:
        _create(writer, "add_empty", "a INT, b INT")
        started = writer.ddl(
            f"ALTER TABLE {NS}.add_empty ADD COLUMN n BIGINT NOT NULL DEFAULT 5 AFTER a"
        )
        assert (started["version"], started["job_step"]) == (2, "delete_only")
        job = _wait_job(writer, started["job_id"], _succeeded, "to go public")
        assert job["versions"] == [2, 3, 4, 5] and job["step"] == "public"
        assert (job["backfill_needed"], job["backfill_ts"], job["files_rewritten"]) == (
            False,
            None,
            0,
        )
        tus = {v: _tu(writer, "add_empty", v) for v in (2, 3, 4, 5)}
    # delete-only: invisible to readers and writers; write-only: writers fill it; public.
    v2 = _everywhere(cluster, "add_empty", tus[2])
    assert _names(v2["schema"]) == ["a", "b"] and "write_schema" not in v2
    [pending] = v2["pending"]
    assert (pending["name"], pending["state"], pending["action"]) == ("n", "delete_only", "add")
    v3 = _everywhere(cluster, "add_empty", tus[3])
    assert _names(v3["schema"]) == ["a", "b"] and _names(v3["write_schema"]) == ["a", "b", "n"]
    assert [p["state"] for p in v3["pending"]] == ["write_only"]
    v4 = _everywhere(cluster, "add_empty", tus[4])  # backfill: the same shape once more
    assert _names(v4["schema"]) == ["a", "b"] and _names(v4["write_schema"]) == ["a", "b", "n"]
    v5 = _everywhere(cluster, "add_empty", tus[5])
    assert _names(v5["schema"]) == ["a", "n", "b"] and v5["pending"] == []  # AFTER a
    n = _column(v5, "n")
    assert (n["field_id"], n["type"], n["default"]) == (pending["field_id"], "BIGINT", "5")


def test_add_column_on_a_table_with_files_waits_for_a_good_backfill(
    cluster: MetastoreCluster,
) -> None:
    table = "add_files"
    with _client(cluster, role="admin") as admin, _client(cluster) as batch:
        _create(admin, table, "a INT")
        _commit(batch, table, 1, files=3)
        job_id = admin.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN n INT NOT NULL DEFAULT 42")[
            "job_id"
        ]
        job = _wait_job(admin, job_id, _held("backfill", "backfill"), "to wait for a backfill")
        assert job["versions"] == [2, 3, 4] and job["backfill_needed"] is True
        assert f"run-backfill {job_id}" in job["waiting_for"]["message"]
        from_ts = job["backfill_from_ts"]  # the backfill version's Tu
        assert from_ts == _tu(admin, table, 4)
        time.sleep(1.0)  # nothing moves it on by itself
        assert admin.job_show(job_id)["step"] == "backfill"
        assert _names(admin.describe(f"{NS}.{table}")["schema"]) == ["a"]

        # A snapshot older than the backfill version's activation is refused: writers without
        # the column could still commit until then.
        with pytest.raises(BackfillIncompleteError) as early:
            batch.job_backfilled(job_id, snapshot_ts=from_ts - 1, files_rewritten=3)
        assert early.value.retryable
        assert early.value.details["snapshot_ts"] == from_ts - 1

        # From that activation on, a writer still at the delete-only version (v2) is refused.
        snapshot_ts = _snapshot_ts(batch, job)
        with pytest.raises(SchemaVersionNotActiveError):
            _commit(batch, table, 2, files=1, not_before=snapshot_ts + 1)

        # A backfill that read the table after that activation is accepted; the job goes public.
        snapshot_ts = batch.clock.now()
        assert snapshot_ts > from_ts
        _commit(batch, table, 4, files=4)  # the rewritten files, at the backfill version
        accepted = batch.job_backfilled(job_id, snapshot_ts=snapshot_ts, files_rewritten=4)
        assert accepted == {"job_id": job_id, "backfill_ts": snapshot_ts, "accepted": True}
        job = _wait_job(admin, job_id, _succeeded, "to go public after the backfill")
        assert job["versions"] == [2, 3, 4, 5]
        assert (job["backfill_ts"], job["files_rewritten"]) == (snapshot_ts, 4)
        final = _expect_final(cluster, admin, table, job)
        assert _names(final["schema"]) == ["a", "n"]
        desc = admin.describe(f"{NS}.{table}", as_of=final["tu"])
        n = _column(desc, "n")
        assert (n["default"], n["nullable"], n["type"]) == ("42", False, "INT")
        # A report for a finished job is a state error.
        with pytest.raises(SchemaJobStateError):
            batch.job_backfilled(job_id, snapshot_ts=batch.clock.now(), files_rewritten=0)


# ------------------------------------------------------------------------------- 5. cancel


def test_cancelling_a_drop_makes_the_column_public_again_at_its_place(
    cluster: MetastoreCluster,
) -> None:
    table = "cancel_drop"
    with _client(cluster, role="admin") as admin, _client(cluster) as batch:
        _create(admin, table, "a INT, b STRING NOT NULL COMMENT 'keep me', c INT")
        before = _everywhere(cluster, table, _tu(admin, table, 1))
        session_id = _open(batch)
        lease = _lease(batch, table, session_id)
        job_id = admin.ddl(f"ALTER TABLE {NS}.{table} DROP COLUMN b")["job_id"]
        _wait_job(admin, job_id, _held("write_only"), "to wait for the lease")
        # While b is being dropped its name stays taken.
        with pytest.raises(SchemaJobConflictError) as conflict:
            admin.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN b INT")
        assert f"job {job_id}" in conflict.value.message
        # Cancelling publishes a version too, and the same lease is in the way: the cancel is
        # recorded instead, and from then on the job never moves forward.
        requested = admin.job_cancel(job_id)
        assert (requested["cancel_requested"], requested["changed"]) == (True, False)
        assert [b["session_id"] for b in requested["blockers"]] == [session_id]
        held = admin.job_show(job_id)
        assert (held["status"], held["cancel_requested"], held["versions"]) == (
            "running",
            True,
            [2],
        )
        assert held["waiting_for"]["reason"] == "leases"
        # Released: the leader rolls the job back (its next step never comes).
        batch.lease_release(session_id, [lease])
        _wait_job(
            admin,
            job_id,
            lambda j: j["status"] == "cancelled" and j["waiting_for"]["reason"] == "finished",
            "to roll back once the lease is released",
        )
        job = admin.job_show(job_id)
        assert (job["status"], job["versions"]) == ("cancelled", [2, 3])
        assert job["ended_by"].startswith("jobs-test-admin")
        assert job["waiting_for"]["reason"] == "finished"
        after = _everywhere(cluster, table, _tu(admin, table, 3))
        # b back at index 1, same id, but nullable: writers of v2 filled it with NULL.
        b_before = before["schema"]["columns"][1]
        assert b_before["nullable"] is False
        assert after["schema"]["columns"][1] == {**b_before, "nullable": True}
        assert after["schema"]["columns"][::2] == before["schema"]["columns"][::2]
        assert len(after["schema"]["columns"]) == 3
        assert after["pending"] == [] and "write_schema" not in after
        # A finished job cannot be cancelled again.
        with pytest.raises(SchemaJobStateError):
            admin.job_cancel(job_id)
        # b is an ordinary column again: one-step changes can name it.
        renamed = admin.ddl(f"ALTER TABLE {NS}.{table} RENAME COLUMN b TO b2")
        assert "job_id" not in renamed
        assert _names(admin.describe(f"{NS}.{table}")["schema"]) == ["a", "b2", "c"]
        batch.session_close(session_id)


def test_cancelling_an_add_removes_the_column_and_frees_its_name(
    cluster: MetastoreCluster,
) -> None:
    table = "cancel_add"
    with (
        _client(cluster, role="admin") as admin,
        _client(cluster) as writer,
        _client(cluster, role="reader") as reader,
    ):
        _create(admin, table, "a INT")
        _commit(writer, table, 1)
        started = writer.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN n INT NOT NULL DEFAULT 1")
        job_id = started["job_id"]
        job = _wait_job(writer, job_id, _held("backfill", "backfill"), "to wait for a backfill")
        [pending] = _everywhere(cluster, table, _tu(admin, table, 3))["pending"]
        # The name is taken while n is being added, by one-step changes and by other jobs.
        for sql in (
            f"ALTER TABLE {NS}.{table} ADD COLUMN n STRING",
            f"ALTER TABLE {NS}.{table} ADD COLUMN n INT NOT NULL DEFAULT 2",
            f"ALTER TABLE {NS}.{table} RENAME COLUMN a TO n",
        ):
            with pytest.raises(SchemaJobConflictError):
                writer.ddl(sql)
        # Readers may look at jobs but not cancel them.
        assert reader.job_show(job_id)["status"] == "running"
        with pytest.raises(ForbiddenError):
            reader.job_cancel(job_id)

        cancelled = writer.job_cancel(job_id)
        assert cancelled["version"] == job["versions"][-1] + 1
        job = writer.job_show(job_id)
        assert job["status"] == "cancelled" and job["ended_by"].startswith("jobs-test-writer")
        after = _everywhere(cluster, table, _tu(admin, table, cancelled["version"]))
        assert _names(after["schema"]) == ["a"] and after["pending"] == []
        assert "write_schema" not in after
        # The name is free again; the new column gets a new field id (ids are never reused).
        added = writer.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN n STRING")
        assert "job_id" not in added
        n = _column(_everywhere(cluster, table, added["tu"]), "n")
        assert n["type"] == "STRING" and n["field_id"] > pending["field_id"]
        with pytest.raises(SchemaJobStateError):
            writer.job_cancel(job_id)
        with pytest.raises(SchemaJobStateError):
            writer.job_backfilled(job_id, snapshot_ts=writer.clock.now(), files_rewritten=0)


def test_job_errors(cluster: MetastoreCluster) -> None:
    table = "errors"
    leader = cluster.wait_ready()
    with _client(cluster, role="admin") as admin:
        _create(admin, table, "a INT, b INT, c INT")
        with pytest.raises(SchemaJobNotFoundError):
            admin.job_cancel(999_999)
        with pytest.raises(SchemaJobNotFoundError):
            admin.job_show(999_999)
        with pytest.raises(SchemaJobNotFoundError):
            admin.job_backfilled(999_999, snapshot_ts=admin.clock.now(), files_rewritten=0)
        # A job's change must be its ALTER's only change.
        with pytest.raises(UnsupportedSchemaChangeError):
            admin.ddl(f"ALTER TABLE {NS}.{table} DROP COLUMNS (b, c)")
        with pytest.raises(UnsupportedSchemaChangeError):
            admin.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMNS (x INT NOT NULL DEFAULT 1, y INT)")
        # SQL cannot say "DROP COLUMN b, ADD COLUMN z"; a canonical command can.
        drop = parse_ddl(f"ALTER TABLE {NS}.{table} DROP COLUMN b")
        add = parse_ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN z INT")
        assert isinstance(drop, AlterTable) and isinstance(add, AlterTable)
        both = AlterTable(table=drop.table, changes=(*drop.changes, *add.changes))
        raw = cluster.client(leader, role="writer")
        try:
            reply = raw.call("_propose", command=encode_command(both))
        finally:
            raw.close()
        assert not reply["ok"] and reply["error"]["code"] == "UNSUPPORTED_SCHEMA_CHANGE", reply
        assert admin.job_list(f"{NS}.{table}", all=True)["jobs"] == []
        assert _names(admin.describe(f"{NS}.{table}")["schema"]) == ["a", "b", "c"]


def test_dropping_the_table_aborts_its_job(cluster: MetastoreCluster) -> None:
    table = "aborted"
    with _client(cluster, role="admin") as admin, _client(cluster) as writer:
        _create(admin, table, "a INT")
        _commit(writer, table, 1)
        job_id = admin.ddl(f"ALTER TABLE {NS}.{table} ADD COLUMN n INT NOT NULL DEFAULT 1")[
            "job_id"
        ]
        _wait_job(admin, job_id, _held("backfill", "backfill"), "to wait for a backfill")
        admin.ddl(f"DROP TABLE {NS}.{table}")
        job = admin.job_show(job_id)
        assert (job["status"], job["waiting_for"]["reason"]) == ("aborted", "finished")
        assert "dropped" in job["message"]
        # A new table of the same name is not the job's.
        _create(admin, table, "a INT")
        assert admin.job_show(job_id)["status"] == "aborted"
        assert admin.job_list(f"{NS}.{table}")["jobs"] == []
        with pytest.raises(SchemaJobStateError):
            admin.job_cancel(job_id)
