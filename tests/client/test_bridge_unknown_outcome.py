"""A batch commit whose outcome the client could not learn (every node unreachable or out of
time with the commit sent) is looked up before the bridge gives up: found committed, the batch
succeeded; not found, it may still commit, so running the batch again is safe only under the
same txn id. A txn id the bridge made up is one the caller does not know: that error is not
retryable and names the id. A commit refused because a written table was re-created since
the pin is retryable (re-planned); a commit's read set names each table once. Pure: a
scripted client, no Spark, no processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from metastore.errors import (
    NotAppliedTimeoutError,
    RequestTimeoutError,
    TableNotFoundError,
    TxnIdReusedError,
    UnavailableError,
)
from spark_bridge.bridge import BatchContext, BatchError, BatchReport
from spark_bridge.files import DataFile

TS = 1 << 40


class LostReplyClient:
    """`commit` fails with an unknown outcome; `committed_txn` says what the leader knows."""

    def __init__(self, committed_ts: int | None, error: Exception) -> None:
        self.committed_ts = committed_ts
        self.error = error
        self.lookups = 0

    def call(self, op: str, _args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit"
        raise self.error

    def committed_txn(self, txn_id: str) -> dict[str, Any]:
        self.lookups += 1
        txn = None if self.committed_ts is None else {"txn_id": txn_id, "ts": self.committed_ts}
        return {"txn_id": txn_id, "txn": txn}


def _batch(client: LostReplyClient, *, txn_id_from_caller: bool) -> BatchContext:
    batch = object.__new__(BatchContext)
    batch.client = client  # type: ignore[assignment]
    batch.bridge = SimpleNamespace(  # type: ignore[assignment]
        _observe_commit=lambda ts: None, maybe_compact=lambda table, n: None
    )
    batch.txn_id = "batch:made-up"
    batch.txn_id_from_caller = txn_id_from_caller
    batch.stream = None
    batch.check_reads = False
    batch.reads = []
    batch.pinned = {"ns.t": SimpleNamespace(version=1, table_id=7)}  # type: ignore[dict-item]
    batch._written = {"ns.t": ([DataFile(path="a.parquet", size_bytes=10, row_count=1)], False)}
    batch._removed = {}
    batch.report = BatchReport(txn_id=batch.txn_id, top=TS - 10, read_ts=TS - 20, waited_ms=0)
    return batch


@pytest.mark.parametrize(
    "error", [UnavailableError("every node failed"), RequestTimeoutError("out of time")]
)
def test_a_commit_found_committed_after_an_unknown_outcome_succeeds(error: Exception) -> None:
    client = LostReplyClient(committed_ts=TS, error=error)
    batch = _batch(client, txn_id_from_caller=False)
    batch.commit()
    assert batch.report.commit_ts == TS
    assert not batch.report.deduplicated  # this attempt's own commit
    assert client.lookups == 1


def test_not_found_with_a_made_up_txn_id_is_not_retryable_and_names_the_id() -> None:
    client = LostReplyClient(committed_ts=None, error=UnavailableError("every node failed"))
    batch = _batch(client, txn_id_from_caller=False)
    with pytest.raises(BatchError) as raised:
        batch.commit()
    assert not raised.value.retryable
    assert "txn_id='batch:made-up'" in str(raised.value)
    assert batch.report.commit_ts is None


def test_not_found_with_the_caller_s_txn_id_stays_retryable() -> None:
    client = LostReplyClient(committed_ts=None, error=UnavailableError("every node failed"))
    batch = _batch(client, txn_id_from_caller=True)
    with pytest.raises(BatchError) as raised:
        batch.commit()
    assert raised.value.retryable  # a re-run under that id commits at most once


@pytest.mark.parametrize("txn_id_from_caller", [False, True])
@pytest.mark.parametrize(
    "error",
    [
        NotAppliedTimeoutError("out of time", details={"not_applied": True, "sent": False}),
        UnavailableError("no leader known right now", details={"not_applied": True}),
    ],
)
def test_a_commit_the_client_says_was_not_applied_is_retryable_without_a_lookup(
    error: Exception, txn_id_from_caller: bool
) -> None:
    # It was taken for an unknown outcome: looked up on the cluster that had just failed it,
    # and, under a made-up txn id, a non-retryable error asking to re-run under that id.
    client = LostReplyClient(committed_ts=None, error=error)
    batch = _batch(client, txn_id_from_caller=txn_id_from_caller)
    with pytest.raises(BatchError) as raised:
        batch.commit()
    assert raised.value.retryable
    assert raised.value.cause is error
    assert "was not applied and never will be" in str(raised.value)
    assert client.lookups == 0
    assert batch.report.commit_ts is None


class RefusedReplayClient:
    """`commit` is refused as a replay (already committed); the lookup meets an outage."""

    def call(self, op: str, _args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit"
        raise TxnIdReusedError("txn id already committed with other writes")

    def committed_txn(self, txn_id: str) -> dict[str, Any]:
        raise UnavailableError("every node failed")


def test_a_replay_whose_lookup_fails_is_a_retryable_batch_error() -> None:
    """A replay refused as already committed is looked up before it is reported deduplicated;
    a lookup that meets an outage must refuse the batch with a retryable BatchError (it is
    looked up again when re-run), not let the client's UnavailableError escape the batch API
    (foreach_batch re-plans BatchErrors only, so the streaming query failed)."""
    batch = _batch(RefusedReplayClient(), txn_id_from_caller=True)  # type: ignore[arg-type]
    with pytest.raises(BatchError) as raised:
        batch.commit()
    assert raised.value.retryable
    assert isinstance(raised.value.cause, UnavailableError)
    assert batch.report.commit_ts is None


class RecreatedTableClient:
    """`commit` is refused: the written table was dropped and re-created since the pin."""

    def call(self, op: str, _args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit"
        raise TableNotFoundError(
            "table ns.t with id 7 no longer exists (the name now refers to table id 9); "
            "re-plan the batch",
            details={"table": "ns.t", "table_id": 7, "current": 9},
        )

    def committed_txn(self, txn_id: str) -> dict[str, Any]:
        raise AssertionError("a refusal by the state machine is not looked up")


def test_a_commit_to_a_table_re_created_since_the_pin_is_retryable() -> None:
    """A micro-batch whose written table was dropped and re-created between its pin and its
    commit is refused (the pinned incarnation is gone); the files belong nowhere, nothing
    committed. Re-planning pins the new incarnation, as a read of a re-created table does
    (`BatchContext.files`) and as `foreach_batch` promises: the refusal was passed on as
    the non-retryable TABLE_NOT_FOUND, so the streaming query failed instead."""
    batch = _batch(RecreatedTableClient(), txn_id_from_caller=True)  # type: ignore[arg-type]
    with pytest.raises(BatchError) as raised:
        batch.commit()
    assert raised.value.retryable
    assert isinstance(raised.value.cause, TableNotFoundError)
    assert batch.report.commit_ts is None


class DroppedTableClient:
    def call(self, op: str, _args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        raise TableNotFoundError("table ns.t does not exist", details={"table": "ns.t"})


def test_a_commit_to_a_dropped_table_stays_not_retryable() -> None:
    batch = _batch(DroppedTableClient(), txn_id_from_caller=True)  # type: ignore[arg-type]
    with pytest.raises(BatchError) as raised:
        batch.commit()
    assert not raised.value.retryable


class CapturingClient:
    def __init__(self) -> None:
        self.args: dict[str, Any] = {}

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        self.args = args
        return {"ts": TS, "deduplicated": False}


def test_a_table_read_under_two_spellings_is_in_the_read_set_once() -> None:
    """Table names are case-insensitive. A batch that declared a read twice (or under two
    spellings) and checks its reads sent the name twice in `read_tables`, which the metastore
    refuses (InvalidArgument) - after the batch had done all its work, on every run."""
    client = CapturingClient()
    batch = _batch(client, txn_id_from_caller=True)  # type: ignore[arg-type]
    batch.check_reads = True
    batch.reads = ["ns.r", "NS.R", "ns.t", "ns.r"]
    batch.commit()
    assert client.args["read_tables"] == ["ns.r", "ns.t"]
    assert client.args["read_ts"] == TS - 20


class ReplayClient:
    """`commit` fails with `error`; the committed record of the txn id wrote `tables`."""

    def __init__(self, error: Exception, tables: list[str]) -> None:
        self.error = error
        self.tables = tables

    def call(self, op: str, _args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit"
        raise self.error

    def committed_txn(self, txn_id: str) -> dict[str, Any]:
        return {"txn_id": txn_id, "txn": {"txn_id": txn_id, "ts": TS, "tables": self.tables}}


REUSED = TxnIdReusedError(
    "txn 'batch:made-up' already committed with other writes",
    details={"txn_id": "batch:made-up", "committed_ts": TS},
)


@pytest.mark.parametrize("committed_tables", [["ns.t"], ["NS.T"]])
def test_a_replay_of_the_same_tables_is_reported_deduplicated(
    committed_tables: list[str],
) -> None:
    batch = _batch(ReplayClient(REUSED, committed_tables), txn_id_from_caller=True)  # type: ignore[arg-type]
    batch.commit()
    assert batch.report.commit_ts == TS
    assert batch.report.deduplicated


@pytest.mark.parametrize(
    "error", [REUSED, UnavailableError("every node failed"), RequestTimeoutError("out of time")]
)
@pytest.mark.parametrize("committed_tables", [["ns.other"], ["ns.other", "ns.t"]])
def test_a_txn_id_committed_by_a_batch_of_other_tables_is_a_typed_error(
    error: Exception, committed_tables: list[str]
) -> None:
    """A txn id that committed writes to other tables than this batch's is not this batch's
    commit (a caller reused the id for another batch): reporting it as done (deduplicated, or
    "found committed after an unknown outcome") silently dropped this batch's output. It is a
    non-retryable TxnIdReused naming both table sets; nothing of this batch committed."""
    batch = _batch(ReplayClient(error, committed_tables), txn_id_from_caller=True)  # type: ignore[arg-type]
    with pytest.raises(BatchError) as raised:
        batch.commit()
    assert not raised.value.retryable
    assert isinstance(raised.value.cause, TxnIdReusedError)
    assert raised.value.cause.details["committed_tables"] == committed_tables
    assert raised.value.cause.details["tables"] == ["ns.t"]
    assert "ns.other" in str(raised.value)
    assert batch.report.commit_ts is None


class LateReplyClient(LostReplyClient):
    """The client's own retry of the commit (its first send's reply lost, the commit applied)
    comes back deduplicated: the metastore found these very files committed under the id."""

    def __init__(self) -> None:
        super().__init__(committed_ts=TS, error=UnavailableError("unused"))

    def call(self, op: str, _args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit"
        return {"txn_id": "batch:made-up", "ts": TS, "tables": ["ns.t"], "deduplicated": True}


def test_a_deduplicated_reply_to_this_attempts_own_files_is_its_own_commit() -> None:
    """A reply marked deduplicated matched this attempt's exact file list, and an attempt's
    files are its own (a fresh directory): the client re-sent this commit after a lost reply.
    The batch reported itself a replay ('already committed', its output someone else's), so
    an `on_batch` counting written rows skipped them, and its automatic compaction was not
    run."""
    client = LateReplyClient()
    batch = _batch(client, txn_id_from_caller=False)
    compacted: list[tuple[str, int]] = []
    batch.bridge.maybe_compact = lambda table, n: compacted.append((table, n))  # type: ignore[attr-defined]
    batch.commit()
    assert batch.report.commit_ts == TS
    assert not batch.report.deduplicated
    assert compacted == [("ns.t", 1)]
    assert client.lookups == 0


class ResentRefusedClient(ReplayClient):
    """The commit call moved on from a node after sending (`on_retry(None)`: no answer came)
    and the next node refused the commit; the txn record says it committed these tables."""

    def __init__(self, error: Exception, *, resent: bool) -> None:
        super().__init__(error, ["ns.t"])
        self.resent = resent

    def call(self, op: str, _args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        assert op == "commit"
        if self.resent:
            kw["on_retry"](None)
        raise self.error


@pytest.mark.parametrize("resent", [False, True])
def test_files_of_a_commit_sent_more_than_once_are_never_deleted(
    tmp_path: Any, resent: bool
) -> None:
    """A refused commit deletes this attempt's directories only when it was sent once: sent
    twice, the first send may have applied (this attempt's own commit, its files the
    table's) and the second been refused past the window in which the state machine answers
    it as deduplicated. Then the files stay for GC, named in the report."""
    from spark_bridge.files import new_attempt_dir

    abs_dir, rel_dir = new_attempt_dir(str(tmp_path), "batch:made-up", owner="s")
    (Path(abs_dir) / "part-0.parquet").parent.mkdir(parents=True, exist_ok=True)
    (Path(abs_dir) / "part-0.parquet").write_bytes(b"x")
    batch = _batch(ResentRefusedClient(REUSED, resent=resent), txn_id_from_caller=True)  # type: ignore[arg-type]
    batch._attempt_dirs = ((str(tmp_path), rel_dir),)
    batch.commit()
    assert batch.report.deduplicated
    assert Path(abs_dir).exists() == resent
    assert batch.report.unreferenced_dirs == ([abs_dir] if resent else [])
