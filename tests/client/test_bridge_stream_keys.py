"""`foreach_batch`'s first-batch lookup across the keys a query's stream marks may be stored
under: `spark-query:<query.id>` (now) and `<query_name>:<query.id>` (bridges before the query id
alone named the stream). The newest mark of either decides, so an upgraded query's replay is
still found committed and a rewound checkpoint is refused whichever key holds the newer mark.
Pure: the client is a stand-in answering `committed_txn` (no cluster, no Spark); the real
end-to-end tests are in tests/spark/test_streaming.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from spark_bridge.bridge import (
    BatchReport,
    CheckpointRewoundError,
    MetastoreBridge,
    foreach_batch_stream,
)
from tests.client.bridge_stub import bare_bridge

QUERY_ID = "0b7e-query"
TS = 1_000_000 << 16


class _MarksClient:
    """`committed_txn` answering from `marks` (stream key -> seq); every mark at `TS + seq`."""

    def __init__(self, marks: dict[str, int]) -> None:
        self.marks = marks
        self.asked: list[str | None] = []
        self.clock = HybridClock(ManualClock(1_000_000))

    def committed_txn(self, txn_id: str, *, stream: str | None = None) -> dict[str, Any]:
        self.asked.append(stream)
        seq = self.marks.get(stream or "")
        mark = (
            None if seq is None else {"stream": stream, "seq": seq, "ts": TS + seq, "txn_id": "t"}
        )
        return {"txn_id": txn_id, "txn": None, "stream_mark": mark}


def _run(bridge: MetastoreBridge, batch_id: int, **options: Any) -> list[BatchReport]:
    reports: list[BatchReport] = []
    bridge._queries_seen = set()
    bridge.batch_retries = 0
    run = bridge.foreach_batch(
        lambda b, df: pytest.fail("a skipped batch ran its body"),
        query_name="orders",
        writes=["ns.t"],
        on_batch=reports.append,
        **options,
    )
    context = SimpleNamespace(getLocalProperty=lambda key: QUERY_ID)
    run(SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=context)), batch_id)  # type: ignore[arg-type]
    return reports


@pytest.mark.parametrize(
    ("legacy_seq", "new_seq"), [(7, None), (3, 7), (7, 3)], ids=["legacy", "new", "both"]
)
def test_the_newest_mark_of_either_key_decides(legacy_seq: int, new_seq: int | None) -> None:
    marks = {f"orders:{QUERY_ID}": legacy_seq}
    if new_seq is not None:
        marks[foreach_batch_stream(QUERY_ID)] = new_seq
    client = _MarksClient(marks)
    bridge = bare_bridge(client)
    # The replay of the newest committed batch: skipped as committed, at that mark's ts.
    [replay] = _run(bridge, 7)
    assert replay.deduplicated and replay.commit_ts == TS + 7, replay.line()
    assert client.asked == [foreach_batch_stream(QUERY_ID), f"orders:{QUERY_ID}"]
    assert bridge.last_commit_ts == TS + 7  # the read floor: the query's last commit
    # A batch below it: the checkpoint went backwards.
    with pytest.raises(CheckpointRewoundError) as raised:
        _run(bridge, 5)
    assert (raised.value.batch_id, raised.value.committed_seq) == (5, 7)
    assert raised.value.committed_ts == TS + 7 and not raised.value.retryable
    # ... skipped with the opt-in.
    [skipped] = _run(bridge, 5, on_rewind="skip")
    assert skipped.skipped_rewind_mark == 7 and skipped.commit_ts is None, skipped.line()


def test_each_run_of_a_query_looks_its_first_batch_up() -> None:
    """A query stopped and started again in the same driver keeps its query id but gets a new
    run id (Spark's job group around foreachBatch). Only a query id's first batch was looked
    up, so the restarted run's replay ran the body (and wrote files) before the mark refused
    its commit. Each run's first batch is looked up now: the replay is skipped, no body."""
    client = _MarksClient({foreach_batch_stream(QUERY_ID): 7})
    bridge = bare_bridge(client)
    bridge._queries_seen = set()
    bridge.batch_retries = 0
    reports: list[BatchReport] = []
    run = bridge.foreach_batch(
        lambda b, df: pytest.fail("a replay ran its body"),
        query_name="orders",
        writes=["ns.t"],
        on_batch=reports.append,
    )
    for run_id in ("run-1", "run-2"):
        properties = {"sql.streaming.queryId": QUERY_ID, "spark.jobGroup.id": run_id}
        context = SimpleNamespace(getLocalProperty=properties.get)
        run(SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=context)), 7)  # type: ignore[arg-type]
    assert [(r.deduplicated, r.commit_ts) for r in reports] == [(True, TS + 7)] * 2
    assert client.asked.count(foreach_batch_stream(QUERY_ID)) == 2


class _LogClient(_MarksClient):
    """Also `read_ts` and `txn_log`, listing `txn_ids` as the newest commits."""

    def __init__(self, marks: dict[str, int], txn_ids: list[str]) -> None:
        super().__init__(marks)
        self.txn_ids = txn_ids
        self.listed: list[int] = []

    def read_ts(self) -> int:
        return TS

    def txn_log(self, limit: int = 20) -> dict[str, Any]:
        self.listed.append(limit)
        return {"commits": [{"txn_id": t, "ts": TS} for t in self.txn_ids[:limit]]}


def test_marks_stored_under_an_older_name_are_found_by_the_commits_naming_it() -> None:
    """A query upgraded from a bridge that keyed marks "<query_name>:<query.id>" and renamed in
    the same restart found no mark (only its current name's key was looked up), so its replay
    committed again. With no mark at all past batch 0, the newest commits' txn ids give the
    old names, and their keys are looked up too; other queries' commits are not taken (the
    lookup of "other:<id>x" would find a mark past the batch: a rewound checkpoint)."""
    client = _LogClient(
        {f"old-name:{QUERY_ID}": 7, f"other:{QUERY_ID}x": 9},
        [f"other:{QUERY_ID}x:9", f"old-name:{QUERY_ID}:7", f"orders:{QUERY_ID}-2:3", "batch:x"],
    )
    bridge = bare_bridge(client)
    [replay] = _run(bridge, 7)
    assert replay.deduplicated and replay.commit_ts == TS + 7, replay.line()
    assert client.listed == [10_000]
    assert client.asked[-1] == f"old-name:{QUERY_ID}"
    with pytest.raises(CheckpointRewoundError) as raised:
        _run(bridge, 5)
    assert (raised.value.batch_id, raised.value.committed_seq) == (5, 7)
