"""`BatchReport.line()`, the line the bridge logs per batch (and `on_batch` callers print). Pure."""

from __future__ import annotations

from hlc import make_ts, to_iso
from spark_bridge.bridge import BatchReport


def test_a_replayed_micro_batch_reads_as_skipped_not_planned_at_the_epoch() -> None:
    """A micro-batch found committed at restart is skipped before it is planned (no Top, nothing
    pinned). Its line said `Top=1970-01-01T00:00:00.000Z pinned [] safe-time wait 0.0 ms` as if
    it had been planned at the epoch; it names the commit the replay found instead."""
    committed = make_ts(1_790_000_000_000)
    report = BatchReport(txn_id="q:abc:2", top=0, read_ts=0, waited_ms=0.0, deduplicated=True)
    report.commit_ts = committed
    line = report.line()
    assert "1970" not in line, line
    assert line == f"txn q:abc:2: skipped (replay): already committed at {to_iso(committed)}"


def test_a_planned_batch_line_is_unchanged() -> None:
    report = BatchReport(txn_id="b:1", top=make_ts(1_790_000_000_000), read_ts=0, waited_ms=1.25)
    report.pinned = {"ns.t": 3}
    report.files, report.rows = 2, 10
    assert report.line() == (
        f"txn b:1: Top={to_iso(report.top)} pinned [ns.t@v3] safe-time wait 1.2 ms, "
        "commit at -, 2 files / 10 rows"
    )
