"""The driver's session keeper of format("metastore") appends (spark_bridge.keeper) against a
fake client: it heartbeats a kept session from the moment its file appears until the commit or
abort removes it, closes its client when it keeps nothing, gives up (with a reason the commit's
error quotes) once the metastore says the session ended or no heartbeat got through for a TTL,
and its thread ends on `stop()`. Every wait is bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metastore.client.floors import forget_shared_floors, shared_floors
from metastore.errors import SessionNotFoundError, UnavailableError
from spark_bridge import datasource
from spark_bridge import keeper as keeper_module
from spark_bridge.datasource import MetastoreDataSource, MetastoreWriter, WrittenFile
from spark_bridge.keeper import SessionKeeper, ended_note, keep, note_commit, unkeep

SID = "0123456789abcdef0123456789abcdef"
WAIT_S = 10.0


class _Client:
    """Heartbeats recorded; `error` (if set) is what each heartbeat raises."""

    def __init__(self, log: _Log) -> None:
        self.log = log

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        with self.log.cond:
            self.log.beats.append(session_id)
            self.log.cond.notify_all()
            if self.log.error is not None:
                raise self.log.error
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        with self.log.cond:
            self.log.sessions_closed.append(session_id)
            self.log.cond.notify_all()
        return {}

    def close(self) -> None:
        with self.log.cond:
            self.log.closed += 1
            self.log.cond.notify_all()


class _Log:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.beats: list[str] = []
        self.sessions_closed: list[str] = []
        self.closed = 0
        self.error: Exception | None = None

    def wait_for(self, pred: Callable[[], bool], what: str) -> None:
        with self.cond:
            assert self.cond.wait_for(pred, timeout=WAIT_S), f"timed out waiting for {what}"


@pytest.fixture
def kept() -> Iterator[tuple[SessionKeeper, _Log]]:
    log = _Log()
    keeper = SessionKeeper(lambda: _Client(log), poll_ms=20)
    try:
        yield keeper, log
    finally:
        keeper.stop()


def _wait(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_kept_session_is_heartbeat_every_third_of_its_ttl_until_unkept(kept: Any) -> None:
    keeper, log = kept
    keep(keeper.directory, SID, ttl_ms=300, table="ns.t")
    started = time.monotonic()
    log.wait_for(lambda: len(log.beats) >= 4, "four heartbeats")
    # The first at once, then one per 100 ms: four take at least 300 ms.
    assert time.monotonic() - started >= 0.29
    assert set(log.beats) == {SID}
    assert keeper.kept() == [SID]
    unkeep(keeper.directory, SID)
    log.wait_for(lambda: log.closed == 1, "the idle keeper's client to be closed")
    assert keeper.kept() == []
    beats = len(log.beats)
    assert not list(keeper.directory.iterdir())
    # Nothing new to keep: no client, no heartbeat (the keeper polls its directory only).
    keep(keeper.directory, "other", ttl_ms=60_000, table="ns.t")
    log.wait_for(lambda: len(log.beats) == beats + 1, "the next append's first heartbeat")
    assert log.beats[-1] == "other"


def test_a_session_the_metastore_ended_is_given_up_with_the_reason(kept: Any) -> None:
    keeper, log = kept
    log.error = SessionNotFoundError("session expired (no heartbeat within its 300 ms TTL)")
    keep(keeper.directory, SID, ttl_ms=300, table="ns.t")
    keep_file = keeper.directory / f"{SID}.keep"
    # Giving up writes the note, then removes the `.keep` file (`SessionKeeper._give_up`):
    # the note alone is seen a moment before the keeper is done (once on CI, 2 cores).
    _wait(
        lambda: ended_note(keeper.directory, SID) is not None and not keep_file.exists(),
        "the keeper to give up",
    )
    assert keeper.kept() == []
    note = ended_note(keeper.directory, SID)
    assert note is not None and "the metastore says the session ended" in note
    assert log.beats == [SID]  # not retried
    unkeep(keeper.directory, SID)
    assert not list(keeper.directory.iterdir())


def test_a_session_no_heartbeat_reached_for_a_ttl_is_given_up(kept: Any) -> None:
    keeper, log = kept
    log.error = UnavailableError("session_heartbeat failed on every endpoint")
    keep(keeper.directory, SID, ttl_ms=300, table="ns.t")
    _wait(lambda: ended_note(keeper.directory, SID) is not None, "the keeper to give up")
    note = ended_note(keeper.directory, SID)
    assert note is not None and "for 300 ms" in note and "every endpoint" in note
    assert len(log.beats) >= 3  # retried every 100 ms until a TTL had passed


def test_a_session_unkept_while_its_heartbeat_failed_leaves_no_note(kept: Any) -> None:
    """The commit removed the file, then closed the session, while a heartbeat was on the
    wire: that heartbeat's SESSION_NOT_FOUND is no reason to record."""
    keeper, _ = kept
    keeper._give_up(SID, "the metastore says the session ended")
    assert not list(keeper.directory.iterdir())


def test_a_directory_removed_under_the_keeper_is_made_again(kept: Any) -> None:
    keeper, log = kept
    keeper.directory.rmdir()
    _wait(keeper.directory.is_dir, "the directory to be made again")
    assert oct(keeper.directory.stat().st_mode & 0o777) == oct(0o700)
    keep(keeper.directory, SID, ttl_ms=60_000, table="ns.t")
    log.wait_for(lambda: log.beats == [SID], "the first heartbeat")


def test_stop_ends_the_thread_and_removes_the_directory() -> None:
    log = _Log()
    keeper = SessionKeeper(lambda: _Client(log), poll_ms=20)
    keep(keeper.directory, SID, ttl_ms=60_000, table="ns.t")
    log.wait_for(lambda: log.beats == [SID], "the first heartbeat")
    keeper.stop()
    keeper.stop()  # idempotent
    assert not keeper.alive()
    assert not keeper.directory.exists()
    assert log.closed == 1


class _CommitClient:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        self.calls.append("session_heartbeat")
        raise SessionNotFoundError("gone", details={"session_id": session_id})

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        self.calls.append(op)
        details = {"session_id": SID, "reason": "attempt_session_not_live", "path": "x"}
        raise SessionNotFoundError("refused", details=details)

    def session_close(self, session_id: str) -> dict[str, Any]:
        self.calls.append("session_close")
        return {}

    def close(self) -> None:
        pass


def test_a_refused_commit_quotes_why_the_keeper_gave_up_and_unkeeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _CommitClient(calls))
    keeper_dir = tmp_path / "keeper"
    keeper_dir.mkdir()
    keep(keeper_dir, SID, ttl_ms=1_000, table="ns.t")
    (keeper_dir / f"{SID}.keep").unlink()
    (keeper_dir / f"{SID}.ended").write_text("no heartbeat got through for 1000 ms")
    w = MetastoreWriter(
        endpoints=["127.0.0.1:1"],
        token="t",
        table="ns.t",
        table_id=1,
        version=1,
        location=str(tmp_path),
        columns=[{"name": "id", "type": "BIGINT", "nullable": True, "field_id": 1}],
        overwrite=False,
        not_before=1,
        session_id=SID,
        session_ttl_ms=1_000,
        keeper_dir=str(keeper_dir),
    )
    with pytest.raises(SessionNotFoundError, match="stopped keeping it: no heartbeat") as info:
        w.commit([WrittenFile(path=f"{w.rel_dir}/p.parquet", size_bytes=1, row_count=1)])
    assert info.value.details["keeper"] == "no heartbeat got through for 1000 ms"
    assert calls == ["session_heartbeat", "commit", "session_close"]
    assert not list(keeper_dir.iterdir())


def test_abort_stops_the_keeper_before_closing_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    keeper_dir = tmp_path / "keeper"
    keeper_dir.mkdir()
    keep(keeper_dir, SID, ttl_ms=1_000, table="ns.t")

    class Closing(_CommitClient):
        def session_close(self, session_id: str) -> dict[str, Any]:
            order.append(f"close (kept: {(keeper_dir / f'{SID}.keep').exists()})")
            return {}

    monkeypatch.setattr(datasource, "_client", lambda *a, **k: Closing([]))
    w = MetastoreWriter(
        endpoints=["127.0.0.1:1"],
        token="t",
        table="ns.t",
        table_id=1,
        version=1,
        location=str(tmp_path),
        columns=[],
        overwrite=False,
        not_before=1,
        session_id=SID,
        session_ttl_ms=1_000,
        keeper_dir=str(keeper_dir),
    )
    w.abort([])
    assert order == ["close (kept: False)"]


def test_a_planner_that_cannot_reach_the_keeper_plans_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark Connect: the planner runs on another host than the process that registered the
    source. The append is kept by its tasks only, and a warning says so."""
    source = type(
        "Elsewhere",
        (MetastoreDataSource,),
        {"KEEPER_DIR": str(tmp_path / "not-here")},
    )(options={"table": "ns.t"})
    assert source._keep(SID, 60_000) == ""
    assert "kept alive by its tasks only" in caplog.text
    unregistered = MetastoreDataSource(options={"table": "ns.t"})
    assert unregistered._keep(SID, 60_000) == ""


def test_a_commit_position_is_handed_to_the_process_floors_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`note_commit` (a data source's commit worker) leaves a position that the first lookup
    of that cluster's floors in the keeper's process takes in, once; a malformed note is
    dropped. The keeper's thread is idle here, so only the lookups hand notes over."""
    monkeypatch.setattr(SessionKeeper, "_round", lambda self: None)
    forget_shared_floors()
    keeper = SessionKeeper(lambda: _Client(_Log()), poll_ms=20)
    try:
        note_commit(keeper.directory, "s1", cluster_id="c-1", ts=1_000)
        (keeper.directory / "s2.floor").write_text("{not json")
        assert shared_floors("c-2").own_writes_ts == 0  # another cluster: not raised
        assert shared_floors("c-1").own_writes_ts == 1_000
        assert list(keeper.directory.iterdir()) == []
        assert keeper.floor_notes() == []
    finally:
        keeper.stop()
        forget_shared_floors()
    # A stopped keeper is no source any more.
    assert shared_floors("c-1").own_writes_ts == 0


def test_an_append_never_ended_is_let_go_after_its_keep_max_and_its_session_closed(
    kept: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append Spark never commits nor aborts (its commit worker killed) was heartbeat until
    the application ended: in a driver running for weeks, a session held (counted against
    MAX_SESSIONS, its files spared by GC) all that time. Let go after its keep_max_ms: the
    session closed, a note saying why for a late commit's error, tidied in its turn."""
    keeper, log = kept
    keep(keeper.directory, SID, ttl_ms=60_000, table="ns.t", keep_max_ms=300)
    log.wait_for(lambda: log.sessions_closed == [SID], "the session to be closed")
    assert keeper.kept() == []
    assert not (keeper.directory / f"{SID}.keep").exists()
    note = ended_note(keeper.directory, SID)
    assert note is not None and "within 300 ms" in note and "keep_max_ms" in note
    beats = len(log.beats)
    assert beats >= 1
    # A note nobody removes (its append never ends) goes after ENDED_NOTE_KEEP_S.
    monkeypatch.setattr(keeper_module, "ENDED_NOTE_KEEP_S", -1.0)
    _wait(lambda: not list(keeper.directory.iterdir()), "the note to be tidied")
    assert len(log.beats) == beats  # no longer heartbeat


class _PlanningClient:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def session_open(self, session_id: str, **labels: Any) -> dict[str, Any]:
        self.calls.append("session_open")
        return {"ttl_ms": labels["ttl_ms"]}

    def session_close(self, session_id: str) -> dict[str, Any]:
        self.calls.append("session_close")
        return {}

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "options",
    [{"loose_files_max": "many"}, {"keep_max_ms": "0"}, {"txn_id": "x" * 100_000}],
    ids=["bad-loose-files-max", "bad-keep-max", "txn-mark-fails"],
)
def test_a_planning_that_fails_leaves_no_session_open_or_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str]
) -> None:
    """`writer()` failing after it opened the append's session (a bad option read after the
    open): Spark never gets the writer, so it calls neither commit nor abort, and the session
    stayed open and kept by the driver's keeper until the application ended."""
    from pyspark.sql.types import LongType, StructField, StructType

    calls: list[str] = []
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _PlanningClient(calls))
    if "txn_id" in options:

        def no_mark(*args: Any) -> Any:
            raise ValueError("cannot mark this txn id")

        monkeypatch.setattr("metastore.client.txn_marks.txn_mark", no_mark)
    keeper_dir = tmp_path / "keeper"
    keeper_dir.mkdir()
    source = type("Planned", (MetastoreDataSource,), {"KEEPER_DIR": str(keeper_dir)})(
        options={"table": "ns.t", **options}
    )
    column = {"name": "id", "type": "BIGINT", "nullable": True, "field_id": 1}
    source._pinned = {
        "ts": 10,
        "now": 10,
        "schema": {
            "table_id": 1,
            "version": 1,
            "location": str(tmp_path),
            "schema": {"columns": [column]},
        },
    }
    with pytest.raises(ValueError):
        source.writer(StructType([StructField("id", LongType())]), False)
    assert not list(keeper_dir.iterdir())
    assert calls in ([], ["session_open", "session_close"])
