"""A `df.write.format("metastore")` append whose commit's outcome is unknown, or whose txn id
was committed before: the commit is looked up (linearizably) before the job is failed or
reported done. Found committed with this append's table, the job succeeded (a re-run would
write the rows twice); found committed with another table, the id was reused for another write
(a typed TxnIdReused, not "done": that dropped this append's rows silently); not found, the
error names the txn id to re-run under (a txn id commits at most once). Pure: a scripted client,
no Spark, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from metastore.errors import RequestTimeoutError, TxnIdReusedError, UnavailableError
from spark_bridge import datasource
from spark_bridge.datasource import MetastoreWriter, WrittenFile

SID = "0123456789abcdef0123456789abcdef"
COLUMNS = [{"name": "id", "type": "BIGINT", "nullable": True, "field_id": 1}]
TS = 1 << 40


class ScriptedClient:
    """`commit` raises `commit_error`; `committed_txn` finds a record writing `tables` (None:
    no record)."""

    def __init__(self, commit_error: Exception, tables: list[str] | None) -> None:
        self.commit_error = commit_error
        self.tables = tables
        self.ops: list[str] = []

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        return {}

    def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        self.ops.append(op)
        if op == "commit":
            raise self.commit_error
        assert op == "compaction_view"
        return {"loose_files_max": 0, "total_loose": 0, "total_deletes": 0}

    def committed_txn(self, txn_id: str) -> dict[str, Any]:
        self.ops.append("committed_txn")
        if self.tables is None:
            return {"txn_id": txn_id, "txn": None}
        return {"txn_id": txn_id, "txn": {"txn_id": txn_id, "ts": TS, "tables": self.tables}}

    def close(self) -> None:
        pass


def _commit(
    monkeypatch: pytest.MonkeyPatch, client: ScriptedClient, *, txn_id: str | None = None
) -> MetastoreWriter:
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: client)
    writer = MetastoreWriter(
        endpoints=["127.0.0.1:1"],
        token="t",
        table="ns.t",
        table_id=1,
        version=1,
        location="/nowhere",
        columns=COLUMNS,
        overwrite=False,
        not_before=1,
        txn_id=txn_id,
        session_id=SID,
        session_ttl_ms=600_000,
    )
    writer.commit([WrittenFile(path=f"{writer.rel_dir}/p.parquet", size_bytes=1, row_count=1)])
    return writer


UNKNOWN = [UnavailableError("every node failed"), RequestTimeoutError("out of time")]


@pytest.mark.parametrize("error", UNKNOWN)
def test_a_commit_found_committed_after_an_unknown_outcome_succeeds(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """The job used to fail although its rows were committed; re-running it (a fresh txn id)
    then appended them twice."""
    client = ScriptedClient(error, ["ns.t"])
    _commit(monkeypatch, client)
    assert client.ops[:2] == ["commit", "committed_txn"]


@pytest.mark.parametrize("error", UNKNOWN)
def test_not_found_after_an_unknown_outcome_names_the_txn_id_to_re_run_under(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    client = ScriptedClient(error, None)
    with pytest.raises(type(error)) as raised:
        _commit(monkeypatch, client)
    txn_id = raised.value.details["txn_id"]
    assert txn_id.startswith("append:ns.t:")
    assert f".option('txn_id', {txn_id!r})" in raised.value.message
    assert client.ops == ["commit", "committed_txn"]


REUSED = TxnIdReusedError("already committed with other writes", details={"committed_ts": TS})


@pytest.mark.parametrize("error", [REUSED, *UNKNOWN])
def test_a_txn_id_committed_by_a_write_of_another_table_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    client = ScriptedClient(error, ["ns.other"])
    with pytest.raises(TxnIdReusedError) as raised:
        _commit(monkeypatch, client, txn_id="nightly-load")
    assert raised.value.details["committed_tables"] == ["ns.other"]
    assert raised.value.details["table"] == "ns.t"
    assert "ns.other" in raised.value.message


def test_a_retried_job_whose_first_run_committed_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    client = ScriptedClient(REUSED, ["ns.t"])
    _commit(monkeypatch, client, txn_id="nightly-load")
    assert client.ops[:2] == ["commit", "committed_txn"]
