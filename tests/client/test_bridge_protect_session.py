"""`MetastoreBridge.protect()` while the bridge's session is lost and replaced.

The block's protection record is owned by the bridge's session. When that session is lost (the
driver paused past its TTL, a partition, a long leader change) the cluster releases the
orphaned record PROTECTION_OWNER_GRACE_MS after the session ended, and GC may then pass the
protected timestamp while the job still reads it. The bridge must take the protection again
under its new session (sound only while no GC threshold passed the timestamp), and a block
whose protection lapsed must fail rather than end as if its reads had been covered.

Real daemons on 127.0.0.1, no Spark: the bridge gets a stand-in SparkSession that has only what
its constructor reads (conf.set, the app's name and id, SparkContext.stop), and the data source
registration (which needs PySpark) is skipped. The driver's pause is the bridge client's
`session_heartbeat` held by the test; the session's end is the admin's force-expire; the
cluster's release of the orphaned record a grace period later is done by an admin release of
it (the same state change, 60 s sooner; the reason differs: "release" instead of
"owner_gone")."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import BeforeGcThresholdError, ProtectionNotFoundError, UnavailableError
from spark_bridge.bridge import MetastoreBridge
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

NAMESPACE = "protns"
WAIT_S = 10
GC_TTL_S = 1
GC_RUN_ATTEMPTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("protect-session"),
        3,
        gc_interval_ms=3_600_000,  # GC runs only when a test asks
        session_ttl_ms=1_500,
        session_heartbeat_ms=300,
    ) as c:
        c.start_all()
        c.wait_ready()
        admin = _client(c, "admin")
        admin.ddl(f"CREATE NAMESPACE {NAMESPACE}")
        admin.close()
        yield c


def _client(c: MetastoreCluster, role: str) -> SyncMetastoreClient:
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
    return SyncMetastoreClient(endpoints, c.token(role), client_name=f"protect-{role}")


class _HeldHeartbeats:
    """The bridge client's `session_heartbeat`, held while `hold` is set: a paused driver."""

    def __init__(self, client: SyncMetastoreClient) -> None:
        self.hold = threading.Event()
        self.release = threading.Event()
        self._original = client.session_heartbeat
        client.session_heartbeat = self  # type: ignore[method-assign]

    def __call__(self, session_id: str) -> dict[str, Any]:
        if self.hold.is_set():
            assert self.release.wait(timeout=3 * WAIT_S), "the test never resumed heartbeats"
        return self._original(session_id)


class _Job:
    def __init__(self, c: MetastoreCluster, monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
        # The data source registration needs PySpark: nothing here reads through it.
        monkeypatch.setattr(MetastoreBridge, "_register_data_source", lambda self: None)
        self.admin = _client(c, "admin")
        self.client = _client(c, "writer")
        self.heartbeats = _HeldHeartbeats(self.client)
        spark = SimpleNamespace(
            conf=SimpleNamespace(set=lambda k, v: None, get=lambda k, default=None: default),
            sparkContext=SimpleNamespace(
                applicationId=f"app-{uuid.uuid4().hex[:8]}", appName="protect-test", stop=None
            ),
        )
        spark.sparkContext.stop = lambda: None
        self.bridge = MetastoreBridge(
            spark,  # type: ignore[arg-type]
            endpoints=self.client.endpoints,
            token=c.token("writer"),
            client=self.client,
        )
        self.table = f"{NAMESPACE}.t{uuid.uuid4().hex[:8]}"
        self.admin.ddl(f"CREATE TABLE {self.table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        self.location = Path(str(self.admin.describe(self.table)["location"]))
        # Files a.parquet at ts1, replaced by b.parquet at ts2: dead at any threshold >= ts2.
        self.ts1 = self.commit("a.parquet")
        self.ts2 = self.commit("b.parquet", overwrite=True)

    def commit(self, name: str, *, overwrite: bool = False) -> int:
        tag = uuid.uuid4().hex[:8]
        path = self.location / "_txn" / tag / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)
        add = [{"path": f"_txn/{tag}/{name}", "size_bytes": 100, "row_count": 1}]
        result = self.admin.commit(
            f"protect-{tag}",
            [{"table": self.table, "schema_version": 1, "add": add, "overwrite": overwrite}],
        )
        return int(result["ts"])

    def session_id(self) -> str | None:
        session = self.bridge.attempt_session
        assert session is not None
        return session.current()

    def lose_session(self) -> str:
        """The driver pauses (no heartbeats) and its session ends: returns its id."""
        lost = self.session_id()
        assert lost is not None
        self.heartbeats.hold.set()
        self.admin.session_expire([lost])
        return lost

    def resume(self, lost: str) -> str:
        """The driver resumes: its heartbeat learns the session is gone and opens a new one."""
        self.heartbeats.release.set()
        return _wait(lambda: (s := self.session_id()) not in (None, lost) and s, "a new session")

    def gc_past(self, ts: int) -> int:
        """Run GC once the table's gc.ttl let it pass `ts`; the new threshold."""
        time.sleep(GC_TTL_S + 0.5)  # a TTL on the cluster's clock: no event to await
        for attempt in range(GC_RUN_ATTEMPTS):
            try:
                (report,) = self.admin.gc_run(self.table)["tables"]
                return int(report["threshold"])
            except UnavailableError:  # a leader change on a loaded machine: GC runs again
                if attempt + 1 == GC_RUN_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def paths(self, ts: int) -> list[str]:
        return sorted(Path(f["path"]).name for f in self.admin.files(self.table, as_of=ts)["files"])

    def close(self) -> None:
        self.heartbeats.release.set()
        self.bridge.close()
        self.admin.close()


@pytest.fixture
def job(
    cluster: MetastoreCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[_Job]:
    j = _Job(cluster, monkeypatch, tmp_path)
    try:
        yield j
    finally:
        j.close()


def _wait(predicate: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # polling the cluster's state: no event to await
    raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}")


def _records_at(admin: SyncMetastoreClient, ts: int) -> list[dict[str, Any]]:
    return [r for r in admin.protections()["records"] if r["ts"] == ts]


def test_a_protection_moves_to_the_session_that_replaces_a_lost_one(job: _Job) -> None:
    """Without the move, the record stays owned by the lost session and the cluster releases
    it a grace period later while the block still reads: GC then deletes a.parquet."""
    with job.bridge.protect(job.ts1, tables=[job.table], meta="long read") as record:
        first_id = record["record_id"]
        lost = job.lose_session()
        new = job.resume(lost)

        # The move takes the new record, then releases the lost session's and updates the
        # block's record: wait for all three (asserting in between raced the release).
        def moved_alone() -> list[dict[str, Any]]:
            held = _records_at(job.admin, job.ts1)
            alone = len(held) == 1 and held[0]["owner"] == new
            return held if alone and held[0]["record_id"] == record["record_id"] else []

        moved = _wait(moved_alone, "the protection to be owned by the new session alone")
        assert record["record_id"] == moved[0]["record_id"] != first_id
        threshold = job.gc_past(job.ts2)
        assert threshold < job.ts1, "GC passed a timestamp the running block protects"
        assert job.paths(job.ts1) == ["a.parquet"]
        assert any(job.location.rglob("a.parquet"))
    assert _records_at(job.admin, job.ts1) == [], "the block's end releases the new record"


def test_a_protect_entered_after_the_session_ended_unnoticed_takes_a_new_one(job: _Job) -> None:
    """The session ended while the driver was paused and no heartbeat told the bridge yet:
    entering the block replaces it and protects under the new one, instead of failing with
    the lost session's SESSION_NOT_FOUND."""
    lost = job.lose_session()
    with job.bridge.protect(job.ts1, tables=[job.table], meta="long read") as record:
        new = job.session_id()
        assert new not in (None, lost)
        (held,) = _records_at(job.admin, job.ts1)
        assert held["record_id"] == record["record_id"] and held["owner"] == new
    assert _records_at(job.admin, job.ts1) == []


def test_a_protection_gc_passed_before_the_new_session_fails_the_block(job: _Job) -> None:
    """The session stayed lost long enough for the cluster to release its record and for GC to
    pass ts1 (a.parquet deleted) before the driver resumed: the protection cannot be taken
    again, and the block must not end as if its reads had been covered."""

    def block() -> None:
        with job.bridge.protect(job.ts1, tables=[job.table], meta="long read") as record:
            lost = job.lose_session()
            job.admin.release_protection(record["record_id"])  # the cluster's reconciliation
            assert job.gc_past(job.ts2) >= job.ts2
            assert not any(job.location.rglob("a.parquet"))
            job.resume(lost)
            # Reads in the block fail from the moment the bridge knows.
            _wait(lambda: _lapsed(job.bridge), "the bridge to report the lapse")

    with pytest.raises(ProtectionNotFoundError) as err:
        block()
    assert err.value.details.get("reason") == "lapsed"
    assert err.value.details["as_of"] == job.ts1
    cause = err.value.details["cause"]
    assert isinstance(cause, dict) and cause["code"] == BeforeGcThresholdError.code.value
    assert "lapsed" in str(err.value)
    assert _records_at(job.admin, job.ts1) == []


def test_a_protection_released_by_anyone_else_fails_the_block(job: _Job) -> None:
    """No session change: the record is released under the running block (an operator, or a
    lost session's record whose loss the bridge never saw). Its end must say so, not ignore
    the PROTECTION_NOT_FOUND of its own release."""
    released: list[str] = []

    def block() -> None:
        with job.bridge.protect(job.ts1, tables=[job.table], meta="long read") as record:
            released.append(record["record_id"])
            job.admin.release_protection(record["record_id"])
            assert job.gc_past(job.ts2) >= job.ts2

    with pytest.raises(ProtectionNotFoundError) as err:
        block()
    assert err.value.details.get("reason") == "lapsed"
    assert err.value.details["record_id"] == released[0]


def test_a_lapse_is_noted_on_the_block_s_own_exception(job: _Job) -> None:
    def block() -> None:
        with job.bridge.protect(job.ts1, tables=[job.table], meta="long read") as record:
            job.admin.release_protection(record["record_id"])
            raise FileNotFoundError("a.parquet")

    with pytest.raises(FileNotFoundError) as err:
        block()
    assert any("lapsed" in note for note in getattr(err.value, "__notes__", []))


def _lapsed(bridge: MetastoreBridge) -> bool:
    try:
        bridge.check_protections()
    except ProtectionNotFoundError as exc:
        return exc.details.get("reason") == "lapsed"
    return False
