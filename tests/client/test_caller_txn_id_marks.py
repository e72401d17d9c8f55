"""A commit under a txn id the CALLER chose (`bridge.batch(txn_id=...)`, the data source's
`.option("txn_id", ...)`, `client.commit(..., mark_txn_id=True)`) commits once however many
commits came since: the txn log remembers only the newest MAX_REMEMBERED_TXNS txn ids, and a
re-run job writes new files (a fresh attempt directory), so past that window the id alone let
it commit a second time. The commit now also carries a stream position of the id's own
(metastore.client.txn_marks), whose mark the state keeps per stream, and a refusal by it is
"already committed" when the mark names this id and this table set, a typed TxnIdReused when
it names another table set (never a silent "done" for other tables).

The node is a FakeNode speaking the protocol, answering from a pure MetastoreState with a
window of 3 txn ids (the state machine decides, as a daemon's does), and the real client
library talks to it; no Spark, no processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from metastore import limits
from metastore.client import SyncMetastoreClient
from metastore.client.txn_marks import is_reserved_stream, txn_mark_stream
from metastore.commands import commit_txn_from_request
from metastore.daemon.views import commit_view
from metastore.errors import InvalidArgumentError, TxnIdReusedError
from spark_bridge import datasource
from spark_bridge.bridge import BatchContext, BatchError
from spark_bridge.datasource import MetastoreWriter, WrittenFile
from spark_bridge.files import DataFile
from tests.client.bridge_stub import bare_bridge
from tests.client.fake_node import TOKEN, ThreadedFakeNode
from tests.metastore._driver import DD_MS, MS, Driver

WINDOW = 3  # txn ids the state remembers in these tests (MAX_REMEMBERED_TXNS)
ETL_TXN_ID = "etl-2026-11-27"
SID = "0123456789abcdef0123456789abcdef"


class StateNode:
    """The ops the bridge and the data source use, answered from a pure MetastoreState."""

    def __init__(self) -> None:
        self.d = Driver()
        self.d.ok("CREATE NAMESPACE ns")
        self.d.ok("CREATE TABLE ns.a (x INT)", step_ms=1)
        self.d.ok("CREATE TABLE ns.b (y STRING)", step_ms=1)
        self.d.tm += (DD_MS + 1) * MS  # both tables active
        self.commit_requests: list[dict[str, Any]] = []
        self._other = 0

    async def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "commit":
            self.commit_requests.append(args)
            request = {k: v for k, v in args.items() if k != "timeout_ms"}
            outcome = self.d.apply(commit_txn_from_request(request))
            outcome.raise_for_error()
            self.d.state.check_invariants()
            return outcome.result
        if op == "committed_txn":
            record = self.d.state.committed_txn(args["txn_id"])
            stream = args.get("stream")
            mark = None if stream is None else self.d.state.stream_mark(stream)
            return {
                "txn_id": args["txn_id"],
                "txn": None if record is None else commit_view(record),
                "stream_mark": None if mark is None else mark.to_result(),
            }
        if op in ("session_heartbeat", "session_close"):
            return {}
        raise AssertionError(f"unexpected op {op}")

    def table_id(self, table: str) -> int:
        return self.d.state.current(table).table_id

    def paths(self, table: str) -> list[str]:
        upper = self.d.state.table_upper()
        return [f.path for f in self.d.state.files_at(table, upper - 1)]

    def push_out_of_the_window(self) -> None:
        """More commits than the window holds, by someone else (a streaming query, say)."""
        for _ in range(WINDOW + 1):
            self._other += 1
            request = {
                "txn_id": f"other:{self._other}",
                "writes": [
                    {"table": "ns.b", "schema_version": 1, "add": [_file(f"o{self._other}")]}
                ],
            }
            self.d.apply(commit_txn_from_request(request)).raise_for_error()


def _file(path: str) -> dict[str, Any]:
    return {"path": path, "size_bytes": 100, "row_count": 10}


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> StateNode:
    monkeypatch.setattr(limits, "MAX_REMEMBERED_TXNS", WINDOW)
    return StateNode()


@pytest.fixture
def client(node: StateNode) -> Iterator[SyncMetastoreClient]:
    with ThreadedFakeNode(handler=node.handle) as fake:
        c = SyncMetastoreClient([fake.endpoint], TOKEN)
        try:
            yield c
        finally:
            c.close()


# --------------------------------------------------------------------------------------------
# The bridge: bridge.batch(txn_id=...)
# --------------------------------------------------------------------------------------------


def _plan_without_spark(monkeypatch: pytest.MonkeyPatch, node: StateNode) -> None:
    """A batch's plan pins its tables as the state has them (no Spark, no pin request)."""

    def plan(self: BatchContext, top: int | None = None) -> None:
        self.pinned = {
            t: SimpleNamespace(version=1, table_id=node.table_id(t))  # type: ignore[misc]
            for t in self.tables
        }

    monkeypatch.setattr(BatchContext, "plan", plan)


def _run_batch(
    monkeypatch: pytest.MonkeyPatch,
    node: StateNode,
    client: SyncMetastoreClient,
    *,
    table: str,
    path: str,
    txn_id: str | None = ETL_TXN_ID,
) -> BatchContext:
    """One `bridge.batch(writes=[table], txn_id=txn_id)` writing `path`, without Spark: the
    plan pins `table` as the state has it, and the body records the file it "wrote"."""

    _plan_without_spark(monkeypatch, node)
    bridge = bare_bridge(client)
    with bridge.batch(writes=[table], txn_id=txn_id) as b:
        b._written[table] = ([DataFile(path=path, size_bytes=100, row_count=10)], False)
    return b


def test_a_batch_rerun_under_its_txn_id_past_the_window_commits_once(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    first = _run_batch(monkeypatch, node, client, table="ns.a", path="_txn/run1/f.parquet")
    assert first.report.commit_ts is not None and not first.report.deduplicated
    node.push_out_of_the_window()
    assert node.d.state.committed_txn(ETL_TXN_ID) is None  # the id alone is forgotten
    # The job is run again the next morning: it writes its output again, into a new directory.
    again = _run_batch(monkeypatch, node, client, table="ns.a", path="_txn/run2/f.parquet")
    assert again.report.deduplicated
    assert again.report.commit_ts == first.report.commit_ts
    assert node.paths("ns.a") == ["_txn/run1/f.parquet"]


def test_a_txn_id_reused_for_other_tables_past_the_window_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    _run_batch(monkeypatch, node, client, table="ns.a", path="_txn/run1/f.parquet")
    node.push_out_of_the_window()
    before = node.paths("ns.b")
    with pytest.raises(BatchError) as raised:
        _run_batch(monkeypatch, node, client, table="ns.b", path="_txn/other/f.parquet")
    assert not raised.value.retryable
    assert isinstance(raised.value.cause, TxnIdReusedError)
    assert raised.value.cause.details["txn_id"] == ETL_TXN_ID
    assert node.paths("ns.b") == before  # nothing of it committed, and not reported done


def test_a_txn_id_reused_for_other_tables_within_the_window_stays_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    _run_batch(monkeypatch, node, client, table="ns.a", path="_txn/run1/f.parquet")
    with pytest.raises(BatchError) as raised:
        _run_batch(monkeypatch, node, client, table="ns.b", path="_txn/other/f.parquet")
    assert not raised.value.retryable
    assert isinstance(raised.value.cause, TxnIdReusedError)
    assert node.paths("ns.b") == []


# --------------------------------------------------------------------------------------------
# The data source: .option("txn_id", ...)
# --------------------------------------------------------------------------------------------


def _append(
    monkeypatch: pytest.MonkeyPatch,
    node: StateNode,
    client: SyncMetastoreClient,
    *,
    table: str,
    path: str,
    txn_id: str | None = ETL_TXN_ID,
) -> MetastoreWriter:
    """The driver-side commit of one `df.write.format("metastore")` append of `path`."""
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _Unclosed(client))
    writer = MetastoreWriter(
        endpoints=["127.0.0.1:1"],
        token="t",
        table=table,
        table_id=node.table_id(table),
        version=1,
        location="/nowhere",
        columns=[{"name": "x", "type": "INT", "nullable": True, "field_id": 1}],
        overwrite=False,
        not_before=1,
        txn_id=txn_id,
        session_id=SID,
        session_ttl_ms=600_000,
        loose_files_max=0,
    )
    writer.commit([WrittenFile(path=path, size_bytes=100, row_count=10)])
    return writer


class _Unclosed:
    """The shared client, whose `close()` (the writer closes its client) does nothing."""

    def __init__(self, client: SyncMetastoreClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def close(self) -> None:
        pass


def test_an_append_rerun_under_its_txn_id_past_the_window_commits_once(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    _append(monkeypatch, node, client, table="ns.a", path="_txn/run1/part-0.parquet")
    node.push_out_of_the_window()
    _append(monkeypatch, node, client, table="ns.a", path="_txn/run2/part-0.parquet")
    assert node.paths("ns.a") == ["_txn/run1/part-0.parquet"]


def test_an_append_txn_id_reused_for_another_table_past_the_window_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    _append(monkeypatch, node, client, table="ns.a", path="_txn/run1/part-0.parquet")
    node.push_out_of_the_window()
    before = node.paths("ns.b")
    with pytest.raises(TxnIdReusedError) as raised:
        _append(monkeypatch, node, client, table="ns.b", path="_txn/other/part-0.parquet")
    assert raised.value.details["txn_id"] == ETL_TXN_ID
    assert node.paths("ns.b") == before


# --------------------------------------------------------------------------------------------
# The client: client.commit(..., mark_txn_id=True)
# --------------------------------------------------------------------------------------------


def _writes(table: str, path: str) -> list[dict[str, Any]]:
    return [{"table": table, "schema_version": 1, "add": [_file(path)]}]


def test_a_client_commit_with_mark_txn_id_run_again_past_the_window_commits_once(
    node: StateNode, client: SyncMetastoreClient
) -> None:
    first = client.commit(ETL_TXN_ID, _writes("ns.a", "_txn/run1/f"), mark_txn_id=True)
    assert not first["deduplicated"]
    node.push_out_of_the_window()
    again = client.commit(ETL_TXN_ID, _writes("NS.A", "_txn/run2/f"), mark_txn_id=True)
    assert again["deduplicated"] and again["ts"] == first["ts"]
    assert again["tables"] == ["ns.a"]
    assert node.paths("ns.a") == ["_txn/run1/f"]
    with pytest.raises(TxnIdReusedError) as raised:
        client.commit(ETL_TXN_ID, _writes("ns.b", "_txn/other/f"), mark_txn_id=True)
    assert raised.value.details["reason"] == "other_tables"
    assert node.paths("ns.b") == [f"o{i}" for i in range(1, WINDOW + 2)]


def test_a_client_commit_with_mark_txn_id_refused_by_the_mark_is_deduplicated(
    node: StateNode, client: SyncMetastoreClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of the same id that committed between this run's lookup and its commit: the
    mark refuses the commit, and the refusal itself says it is this id and table set."""
    first = client.commit(ETL_TXN_ID, _writes("ns.a", "_txn/run1/f"), mark_txn_id=True)
    node.push_out_of_the_window()
    real = node.handle

    async def lookup_misses(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "committed_txn":
            return {"txn_id": args["txn_id"], "txn": None, "stream_mark": None}
        return await real(op, args)

    monkeypatch.setattr(node, "handle", lookup_misses)
    again = client.commit(ETL_TXN_ID, _writes("ns.a", "_txn/run2/f"), mark_txn_id=True)
    assert again["deduplicated"] and again["ts"] == first["ts"]
    assert node.paths("ns.a") == ["_txn/run1/f"]


def test_a_client_commit_without_mark_txn_id_carries_no_mark(
    node: StateNode, client: SyncMetastoreClient
) -> None:
    client.commit("plain", _writes("ns.a", "f"))
    assert "stream" not in node.commit_requests[-1]
    assert node.d.state.txn_stats().stream_marks == 0


def test_the_txn_mark_prefix_is_refused_as_a_caller_s_stream(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    with pytest.raises(InvalidArgumentError):
        client.commit("q:0", _writes("ns.a", "f"), stream=txn_mark_stream("x"), seq=0)
    with pytest.raises(BatchError) as raised:
        bare_bridge(client).batch(writes=["ns.a"], stream=("@txn-id:etl", 0)).__enter__()
    assert not raised.value.retryable
    assert node.commit_requests == []


# --------------------------------------------------------------------------------------------
# The key: its length, its space, who gets one
# --------------------------------------------------------------------------------------------


def test_a_txn_id_of_the_longest_length_gets_a_mark_the_stream_field_holds(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    longest = "j" * limits.MAX_TXN_ID_CHARS
    stream = txn_mark_stream(longest)
    assert len(stream) <= limits.MAX_TXN_ID_CHARS and is_reserved_stream(stream)
    assert txn_mark_stream("j" * (limits.MAX_TXN_ID_CHARS - 1)) != stream
    short = txn_mark_stream(ETL_TXN_ID)
    assert short == "@txn-id:" + ETL_TXN_ID  # readable while it fits
    first = _run_batch(monkeypatch, node, client, table="ns.a", path="r1", txn_id=longest)
    node.push_out_of_the_window()
    again = _run_batch(monkeypatch, node, client, table="ns.a", path="r2", txn_id=longest)
    assert again.report.deduplicated and again.report.commit_ts == first.report.commit_ts
    assert node.paths("ns.a") == ["r1"]


def test_the_pre_work_lookup_finds_a_caller_txn_id_past_the_window(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    first = _run_batch(monkeypatch, node, client, table="ns.a", path="r1")
    node.push_out_of_the_window()
    reply = client.committed_txn(ETL_TXN_ID, stream=txn_mark_stream(ETL_TXN_ID))
    assert reply["txn"] is None
    assert reply["stream_mark"]["txn_id"] == ETL_TXN_ID
    assert reply["stream_mark"]["ts"] == first.report.commit_ts


def test_bridge_made_txn_ids_carry_no_mark(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    _run_batch(monkeypatch, node, client, table="ns.a", path="r1", txn_id=None)
    _append(monkeypatch, node, client, table="ns.a", path="r2", txn_id=None)
    assert all("stream" not in r for r in node.commit_requests)
    assert node.d.state.txn_stats().stream_marks == 0


def test_a_streaming_batch_keeps_its_own_stream_position(
    monkeypatch: pytest.MonkeyPatch, node: StateNode, client: SyncMetastoreClient
) -> None:
    _plan_without_spark(monkeypatch, node)
    with bare_bridge(client).batch(writes=["ns.a"], txn_id="q:id:3", stream=("q:id", 3)) as b:
        b._written["ns.a"] = ([DataFile(path="s3", size_bytes=1, row_count=1)], False)
    assert (node.commit_requests[-1]["stream"], node.commit_requests[-1]["seq"]) == ("q:id", 3)


# --------------------------------------------------------------------------------------------
# The CLI: metastore txn show
# --------------------------------------------------------------------------------------------


def test_txn_show_finds_a_caller_txn_id_past_the_window_by_its_mark(
    monkeypatch: pytest.MonkeyPatch, node: StateNode
) -> None:
    from click.testing import CliRunner

    from cli.main import cli

    with ThreadedFakeNode(handler=node.handle) as fake:
        c = SyncMetastoreClient([fake.endpoint], TOKEN)
        try:
            first = _run_batch(monkeypatch, node, c, table="ns.a", path="r1")
        finally:
            c.close()
        node.push_out_of_the_window()
        base = ["--endpoints", fake.endpoint, "--token", TOKEN, "txn", "show", ETL_TXN_ID]
        shown = CliRunner().invoke(cli, base)
        assert shown.exit_code == 0, shown.output
        assert "txn-id mark" in shown.output
        assert "not remembered" not in shown.output
        as_json = CliRunner().invoke(cli, [*base, "-o", "json"])
        assert as_json.exit_code == 0, as_json.output
        mark = json.loads(as_json.output)["stream_mark"]
        assert (mark["txn_id"], mark["ts"]) == (ETL_TXN_ID, first.report.commit_ts)
        never = CliRunner().invoke(cli, [*base[:-1], "never-ran"])
        assert never.exit_code == 4
