"""What a stream batch's commit settles to when the commit call cannot tell (an unknown
outcome) or is refused, and the stream has moved past the batch: "did this batch commit" (its
txn id's record, made after the batch was planned) is decided before "is the checkpoint
rewound", so a batch whose own commit applied and was followed by another driver's later batch
succeeds instead of failing as rewound; a record from before the batch was planned (an earlier
run of a rewound checkpoint) is no proof, and the batch still fails as rewound. A batch found
already committed reports 0 files / 0 rows: it committed none of what it wrote. Pure: a
scripted client, no Spark, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.errors import BatchAlreadyCommittedError, UnavailableError
from spark_bridge.bridge import BatchContext, BatchReport, CheckpointRewoundError, StreamPosition
from spark_bridge.files import DataFile
from tests.client.bridge_stub import bare_bridge

TS = 1_000_000 << 16
TOP = TS + 100  # the batch's Top: its own commit is at a ts above it
STREAM = "spark-query:q-1"
SEQ = 5
TXN_ID = f"orders:q-1:{SEQ}"


class _StreamClient:
    """`commit` raises `error`; `committed_txn` answers the txn id's record (at `txn_ts`, or
    none) and the stream's mark (at `mark_seq`, committed by another driver's batch)."""

    def __init__(self, error: Exception, *, txn_ts: int | None, mark_seq: int) -> None:
        self.error = error
        self.txn_ts = txn_ts
        self.mark_seq = mark_seq
        self.clock = HybridClock(ManualClock(1_000_000))

    def call(self, op: str, _args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit"
        raise self.error

    def committed_txn(self, txn_id: str, *, stream: str | None = None) -> dict[str, Any]:
        record = None
        if self.txn_ts is not None and txn_id == TXN_ID:
            record = {"txn_id": txn_id, "ts": self.txn_ts, "tables": ["ns.t"]}
        mark = None
        if stream == STREAM:
            mark = {
                "stream": stream,
                "seq": self.mark_seq,
                "ts": TOP + 50 + self.mark_seq,
                "txn_id": f"orders:q-1:{self.mark_seq}",
            }
        return {"txn_id": txn_id, "txn": record, "stream_mark": mark}


def _rewound(position: StreamPosition) -> CheckpointRewoundError:
    assert position.mark_seq is not None
    return CheckpointRewoundError(
        "rewound",
        stream=STREAM,
        batch_id=SEQ,
        committed_seq=position.mark_seq,
        committed_ts=position.mark_ts,
        committed_txn_id=position.mark_txn_id,
    )


def _stream_batch(client: _StreamClient) -> BatchContext:
    batch = object.__new__(BatchContext)
    batch.client = client  # type: ignore[assignment]
    batch.bridge = bare_bridge(client)
    batch.txn_id = TXN_ID
    batch.txn_id_from_caller = False
    batch.stream = (STREAM, SEQ)
    batch.stream_aliases = ()
    batch.on_stream_rewind = _rewound
    batch.check_reads = False
    batch.reads = []
    batch.pinned = {"ns.t": type("Pin", (), {"version": 1, "table_id": 7})()}  # type: ignore[dict-item]
    batch._written = {"ns.t": ([DataFile(path="a.parquet", size_bytes=10, row_count=3)], False)}
    batch._removed = {}
    batch.report = BatchReport(txn_id=TXN_ID, top=TOP, read_ts=TOP - 10, waited_ms=0)
    return batch


def test_an_unknown_outcome_that_committed_before_a_later_batch_is_a_success() -> None:
    """The commit of batch 5 applied but its reply was lost; another driver running the same
    query then committed batch 6. The lookup found the stream past 5 and raised
    CheckpointRewoundError before looking at batch 5's own record: a committed batch failed
    the query as a rewound checkpoint."""
    own_ts = TOP + 7
    client = _StreamClient(UnavailableError("every node failed"), txn_ts=own_ts, mark_seq=SEQ + 1)
    batch = _stream_batch(client)
    batch.commit()
    assert batch.report.commit_ts == own_ts
    assert not batch.report.deduplicated  # this attempt's own commit
    assert (batch.report.files, batch.report.rows) == (1, 3)


def test_an_unknown_outcome_below_a_later_mark_without_a_record_is_rewound() -> None:
    client = _StreamClient(UnavailableError("every node failed"), txn_ts=None, mark_seq=SEQ + 1)
    with pytest.raises(CheckpointRewoundError) as raised:
        _stream_batch(client).commit()
    assert (raised.value.batch_id, raised.value.committed_seq) == (SEQ, SEQ + 1)


@pytest.mark.parametrize(
    "error",
    [UnavailableError("every node failed"), BatchAlreadyCommittedError("below the mark")],
    ids=["unknown", "refused"],
)
def test_a_record_from_before_the_batch_was_planned_is_a_rewound_checkpoint(
    error: Exception,
) -> None:
    """A checkpoint restored from an older copy runs batch 5 again with new data; batch 5's
    record is the earlier run's (committed before this batch's Top), not this batch's."""
    client = _StreamClient(error, txn_ts=TS + 3, mark_seq=SEQ + 2)
    with pytest.raises(CheckpointRewoundError) as raised:
        _stream_batch(client).commit()
    assert raised.value.committed_seq == SEQ + 2


def test_a_refusal_of_a_batch_another_driver_committed_after_its_plan_is_deduplicated() -> None:
    """Two drivers ran batch 5 of the same checkpoint; the other one committed it (after this
    batch was planned) and then batch 6. This batch's commit is refused by the mark: batch 5
    committed once, so this one is a replay (deduplicated, its files deleted), not rewound."""
    other_ts = TOP + 9
    client = _StreamClient(
        BatchAlreadyCommittedError("below the mark"), txn_ts=other_ts, mark_seq=SEQ + 1
    )
    batch = _stream_batch(client)
    batch.commit()
    assert batch.report.commit_ts == other_ts
    assert batch.report.deduplicated


def test_a_replay_refused_at_its_own_mark_reports_no_files_or_rows() -> None:
    """A batch found already committed commits none of what it wrote (its files are deleted),
    yet its report said `1 files / 3 rows` beside `(replay: already committed)`: an `on_batch`
    summing rows counted the replay's rows twice."""
    client = _StreamClient(BatchAlreadyCommittedError("at the mark"), txn_ts=None, mark_seq=SEQ)
    batch = _stream_batch(client)
    batch._removed = {"ns.t": ["old.parquet"]}
    batch.commit()
    assert batch.report.deduplicated and batch.report.commit_ts == TOP + 50 + SEQ
    assert (batch.report.files, batch.report.rows, batch.report.removed) == (0, 0, 0)
    assert "0 files / 0 rows" in batch.report.line()
