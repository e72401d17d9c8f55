"""A batch whose commit is refused because its files sit in the attempt directory of a session
that is no longer live (the driver paused past the session TTL between writing and committing:
GC may have deleted those files as orphans, so the metastore refuses the commit) is a retryable
failure: the bridge gives up that session (writes go under a live one from then on) and says
to run the batch again, which `foreach_batch` does. Pure: the client and the session are
stand-ins (no cluster, no Spark)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from metastore.errors import SessionNotFoundError
from spark_bridge.bridge import BatchContext, BatchError
from spark_bridge.files import DataFile
from tests.client.bridge_stub import bare_bridge


class _Session:
    def __init__(self) -> None:
        self.lost_ids: list[str] = []

    def current(self) -> str:
        return "s-new"

    def lost(self, session_id: str) -> None:
        self.lost_ids.append(session_id)


class _Client:
    def __init__(self) -> None:
        self.commits = 0

    def committed_txn(self, txn_id: str, stream: str | None = None) -> dict[str, Any]:
        # The caller's txn id is looked up before its commit: never committed.
        return {"txn_id": txn_id, "txn": None, "stream_mark": None}

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit", op
        self.commits += 1
        path = args["writes"][0]["add"][0]["path"]
        raise SessionNotFoundError(
            f"ns.t: file {path!r} is in the attempt directory of session 's-old', which is "
            "not live",
            details={
                "session_id": "s-old",
                "table": "ns.t",
                "path": path,
                "reason": "attempt_session_not_live",
            },
        )


def test_a_commit_refused_for_a_gone_attempt_session_is_retryable_and_drops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def plan(self: BatchContext, top: Any = None) -> None:
        self.pinned = {"ns.t": SimpleNamespace(version=1, table_id=7)}  # type: ignore[dict-item]
        self.report.top = 5

    monkeypatch.setattr(BatchContext, "plan", plan)
    session, client = _Session(), _Client()
    bridge = bare_bridge(client, session=session)
    with pytest.raises(BatchError) as refused, bridge.batch(writes=["ns.t"], txn_id="b-1") as b:
        b._written["ns.t"] = (
            [DataFile(path="_txn/s-old--b-1-0123/part-0.parquet", size_bytes=1, row_count=1)],
            False,
        )
    assert client.commits == 1
    assert refused.value.retryable, "the batch must be run again (its files may be gone)"
    assert isinstance(refused.value.cause, SessionNotFoundError)
    assert session.lost_ids == ["s-old"]
    assert b.report.commit_ts is None


def test_an_attempt_directory_without_an_owner_never_names_one() -> None:
    # Without a session (none could be opened) the directory is `_txn/<txn id>-<random>`; a
    # txn id with "--" made it read as the attempt directory of a session named by its start,
    # which is never live: the metastore refused the commit, on every retry.
    from metastore.leases import attempt_owners
    from spark_bridge.files import new_attempt_dir

    for txn_id in ("nightly--v2:q:7", "a---b", "--x"):
        _, rel = new_attempt_dir("/w/t", txn_id)
        assert attempt_owners(rel.split("/")) == [], rel
        _, rel = new_attempt_dir("/w/t", txn_id, owner="s0123")
        assert attempt_owners(rel.split("/")) == ["s0123"], rel


class _NoSession:
    """A bridge session that has none: the token may not open one (`available` False), or
    reopening one after an expiry failed (the server could not be reached)."""

    def __init__(self, *, available: bool) -> None:
        self.available = available
        self.opens = 0

    def current(self) -> None:
        return None

    def ensure_open(self) -> None:
        self.opens += 1
        if self.available:
            from metastore.errors import UnavailableError

            raise UnavailableError("no node answered")


@pytest.mark.parametrize("available", [False, True])
def test_a_batch_without_a_session_to_own_its_files_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, available: bool
) -> None:
    # Without a session the bridge wrote into an unowned attempt directory (`_txn/<txn>-...`),
    # which the orphan scan judges by mtime alone: a batch longer than the grace could commit
    # files GC had deleted, and a token that may not open sessions (a reader's) wrote a whole
    # batch that its commit was then refused (FORBIDDEN), leaving the files behind. The write
    # now fails first, before Spark writes anything: FORBIDDEN is final, a session that could
    # not be reopened is retryable.
    from metastore.errors import ErrorCode

    def plan(self: BatchContext, top: Any = None) -> None:
        self.pinned = {  # type: ignore[dict-item]
            "ns.t": SimpleNamespace(version=1, table_id=7, location="/w/t", write_columns=[])
        }
        self.report.top = 5

    def no_write(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the batch wrote files without a session to own them")

    monkeypatch.setattr(BatchContext, "plan", plan)
    monkeypatch.setattr("spark_bridge.bridge.new_attempt_dir", no_write)
    monkeypatch.setattr("spark_bridge.bridge.conform", no_write)
    session, client = _NoSession(available=available), _Client()
    bridge = bare_bridge(client, session=session)
    with pytest.raises(BatchError) as refused, bridge.batch(writes=["ns.t"], txn_id="b-1") as b:
        b.write("ns.t", None)  # type: ignore[arg-type]
    assert client.commits == 0
    assert refused.value.retryable is available
    cause = refused.value.cause
    assert cause is not None
    code = ErrorCode.UNAVAILABLE if available else ErrorCode.FORBIDDEN
    assert getattr(cause, "code", None) == code, cause
    assert session.opens == (1 if available else 0)
