"""`df.write.format("metastore")` appends write under a metastore session of their own
(`_txn/<session id>--append-...`), kept alive by the tasks and the commit, closed after: GC's
orphan scan never deletes the files of a running append, and a commit after the session ended
is refused (typed) instead of acknowledging files the scan may have deleted."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import Row

from metastore.errors import (
    InvalidArgumentError,
    RequestTimeoutError,
    SessionNotFoundError,
    UnavailableError,
)
from metastore.leases import attempt_owners
from spark_bridge import datasource
from spark_bridge.datasource import MetastoreWriter, WrittenFile, open_write_session
from tests.client.spark_task import write_rows

SID = "0123456789abcdef0123456789abcdef"
COLUMNS = [{"name": "id", "type": "BIGINT", "nullable": True, "field_id": 1}]


class _Client:
    """Records the calls the writer makes; `fail` maps an op to the error it raises."""

    def __init__(self, calls: list[tuple[str, Any]], fail: dict[str, Exception]) -> None:
        self.calls = calls
        self.fail = fail

    def _do(self, op: str, arg: Any) -> dict[str, Any]:
        self.calls.append((op, arg))
        if op in self.fail:
            raise self.fail[op]
        return {"ttl_ms": arg.get("ttl_ms", 40_000)} if isinstance(arg, dict) else {}

    def session_open(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        return self._do("session_open", {"session_id": session_id, **kwargs})

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return self._do("session_heartbeat", session_id)

    def session_close(self, session_id: str) -> dict[str, Any]:
        return self._do("session_close", session_id)

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        return self._do(op, args)

    def close(self) -> None:
        self.calls.append(("close", None))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, Any]], dict[str, Exception]]:
    log: list[tuple[str, Any]] = []
    fail: dict[str, Exception] = {}
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _Client(log, fail))
    return log, fail


def _writer(location: str) -> MetastoreWriter:
    return MetastoreWriter(
        endpoints=["127.0.0.1:1"],
        token="t",
        table="ns.t",
        table_id=1,
        version=1,
        location=location,
        columns=COLUMNS,
        overwrite=False,
        not_before=1,
        session_id=SID,
        session_ttl_ms=600_000,
        loose_files_max=0,
    )


def _ops(log: list[tuple[str, Any]]) -> list[str]:
    return [op for op, _ in log if op != "close"]


def test_the_attempt_directory_is_owned_by_the_write_session(tmp_path: Any, calls: Any) -> None:
    w = _writer(str(tmp_path))
    assert attempt_owners([*w.rel_dir.split("/"), "part.parquet"]) == [SID]
    msg = write_rows(w, [Row(id=1), Row(id=2)])
    assert isinstance(msg, WrittenFile)
    assert attempt_owners(msg.path.split("/")[:-1]) == [SID]
    assert (tmp_path / msg.path).is_file()


def test_a_task_heartbeats_the_session_when_it_starts(tmp_path: Any, calls: Any) -> None:
    log, _ = calls
    write_rows(_writer(str(tmp_path)), [Row(id=1)])
    assert _ops(log) == ["session_heartbeat"]  # one round trip per task, none per row
    assert log[0][1] == SID


def test_a_task_of_an_ended_session_fails_before_writing(tmp_path: Any, calls: Any) -> None:
    _, fail = calls
    fail["session_heartbeat"] = SessionNotFoundError("gone", details={"session_id": SID})
    with pytest.raises(SessionNotFoundError, match="session_ttl_ms"):
        write_rows(_writer(str(tmp_path)), [Row(id=1)])
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_task_that_cannot_reach_the_metastore_still_writes(tmp_path: Any, calls: Any) -> None:
    # The heartbeat only keeps the session alive; the commit rule is what keeps data safe.
    _, fail = calls
    fail["session_heartbeat"] = UnavailableError("down")
    msg = write_rows(_writer(str(tmp_path)), [Row(id=1)])
    assert (tmp_path / msg.path).is_file()


def test_commit_heartbeats_commits_then_closes_the_session(tmp_path: Any, calls: Any) -> None:
    log, _ = calls
    w = _writer(str(tmp_path))
    w.commit([WrittenFile(path=f"{w.rel_dir}/p.parquet", size_bytes=1, row_count=1)])
    assert _ops(log) == ["session_heartbeat", "commit", "session_close"]
    assert log[-2] == ("session_close", SID)


def test_abort_closes_the_session(tmp_path: Any, calls: Any) -> None:
    log, _ = calls
    _writer(str(tmp_path)).abort([])
    assert _ops(log) == ["session_close"]


def test_a_commit_after_the_session_ended_is_refused_clearly(tmp_path: Any, calls: Any) -> None:
    log, fail = calls
    details = {"session_id": SID, "reason": "attempt_session_not_live", "path": "x"}
    fail["session_heartbeat"] = SessionNotFoundError("gone", details={"session_id": SID})
    fail["commit"] = SessionNotFoundError("refused", details=details)
    w = _writer(str(tmp_path))
    with pytest.raises(SessionNotFoundError, match="Re-run") as info:
        w.commit([WrittenFile(path=f"{w.rel_dir}/p.parquet", size_bytes=1, row_count=1)])
    assert info.value.details["reason"] == "attempt_session_not_live"
    assert "session_ttl_ms" in info.value.message
    assert _ops(log)[-1] == "session_close"


def test_open_write_session_opens_a_fresh_session_with_the_ttl(calls: Any) -> None:
    log, _ = calls
    client = datasource._client([], "")
    a = open_write_session(client, table="ns.t", ttl_ms=123_000)
    b = open_write_session(client, table="ns.t", ttl_ms=123_000)
    assert a[0] != b[0] and a[1] == 123_000
    assert [op for op, _ in log] == ["session_open", "session_open"]
    assert log[0][1]["session_id"] == a[0] and log[0][1]["ttl_ms"] == 123_000
    assert "--" not in a[0]


@pytest.mark.parametrize(
    "error",
    [
        UnavailableError("session_open: connection failed after the request was sent"),
        RequestTimeoutError("session_open did not complete within 10000 ms"),
    ],
    ids=["unavailable", "timeout"],
)
def test_an_open_with_an_unknown_outcome_is_closed_before_the_error_is_raised(
    calls: Any, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """The open may have been applied (sent, then the connection broke or time ran out): left
    alone, that session stayed open until its TTL, listed, counted against MAX_SESSIONS and
    its attempt directory spared by GC. Its id is closed once the open settled, then the
    append fails with the open's error."""
    from spark_bridge import session as session_module

    monkeypatch.setattr(session_module, "UNKNOWN_OPEN_SETTLE_MS", 1)
    log, fail = calls
    fail["session_open"] = error
    client = datasource._client([], "")
    with pytest.raises(type(error)) as info:
        open_write_session(client, table="ns.t", ttl_ms=60_000)
    assert info.value is error
    assert _ops(log) == ["session_open", "session_close"]
    assert log[1][1] == log[0][1]["session_id"]


def test_a_failed_close_of_an_unknown_open_still_raises_the_open_error(
    calls: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_bridge import session as session_module

    monkeypatch.setattr(session_module, "UNKNOWN_OPEN_SETTLE_MS", 1)
    log, fail = calls
    error = UnavailableError("session_open: connection failed after the request was sent")
    fail["session_open"] = error
    fail["session_close"] = UnavailableError("session_close failed on every endpoint")
    client = datasource._client([], "")
    with pytest.raises(UnavailableError) as info:
        open_write_session(client, table="ns.t", ttl_ms=60_000)
    assert info.value is error
    assert _ops(log) == ["session_open", "session_close"]


def test_an_open_refused_outright_is_not_closed(calls: Any) -> None:
    log, fail = calls
    fail["session_open"] = InvalidArgumentError("ttl_ms too large: nothing done")
    client = datasource._client([], "")
    with pytest.raises(InvalidArgumentError):
        open_write_session(client, table="ns.t", ttl_ms=60_000)
    assert _ops(log) == ["session_open"]
