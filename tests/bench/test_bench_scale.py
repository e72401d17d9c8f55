"""The scale benchmark (`bench.bench_scale`): its pure parts only (a real run takes minutes).

They decide which commits a window holds, what memory and snapshot sizes the report shows, and
why an install failed, so they are checked against hand-written inputs.
"""

from __future__ import annotations

import json

from bench import bench_scale as bs


def test_window_around_a_checkpoint() -> None:
    # Commit k leaves (k + 1) * 1000 files; 20 commits around 100k: 91k .. 110k files.
    first = bs.window_start(100_000, 1_000, 1_000, 20)
    assert (first + 1) * 1_000 == 91_000
    assert (first + 20) * 1_000 == 110_000


def test_window_never_holds_the_warm_up_commit_nor_runs_past_the_end() -> None:
    assert bs.window_start(10_000, 1_000, 1_000, 20) == 1
    assert bs.window_start(1_000_000, 1_000, 1_000, 20) == 980
    assert bs.window_start(100_000, 1_000, 100, 20) == 80


def test_batch_files_have_distinct_spark_shaped_paths() -> None:
    add = bs.batch_add(7, 1_000, "job")
    paths = {f["path"] for f in add}
    assert len(paths) == 1_000
    assert add[0]["path"] == "_txn/b000007/part-00000-job-c000.zstd.parquet"
    assert all(f["row_count"] > 0 and f["size_bytes"] > 0 for f in add)


def test_proc_status_in_bytes() -> None:
    text = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n"
    assert bs.parse_proc_status(text) == {"VmHWM": 204_800 * 1024, "VmRSS": 102_400 * 1024}


def _line(msg: str, level: str = "info", **extra: object) -> str:
    return json.dumps({"ts": "2026-11-25T10:00:00.500+00:00", "level": level, "msg": msg, **extra})


def test_snapshot_lines_of_a_node_log() -> None:
    text = "\n".join(
        [
            "not json",
            _line("snapshot taken", index=300, bytes=12_345),
            _line("node started"),
            "{broken",
        ]
    )
    (snap,) = bs.snapshots_taken(bs.log_records(text), 2)
    assert snap["node"] == 2
    assert snap["index"] == 300
    assert snap["bytes"] == 12_345
    assert snap["unix_s"] == bs.unix_s("2026-11-25T10:00:00.500+00:00")


def test_overlap_of_a_commit_with_a_snapshot_stall() -> None:
    # 30 MB at 30 MB/s + 0.1 s: the loop was held from 8.9 s until the log line at 10 s.
    lo, hi = bs.snapshot_span({"unix_s": 10.0, "bytes": 30e6})
    assert lo == 10.0 - 1.1
    assert hi == 10.0 + bs.SNAPSHOT_STALL_SLACK_S
    assert bs.overlaps(8.5, 9.0, [(lo, hi)])  # started before, waited behind it
    assert bs.overlaps(10.0, 10.02, [(lo, hi)])  # its reply came right after
    assert not bs.overlaps(8.0, 8.8, [(lo, hi)])
    assert not bs.overlaps(10.1, 10.2, [(lo, hi)])


def test_failure_reason_quotes_the_last_distinct_warnings_per_node() -> None:
    leader = bs.log_records(
        "\n".join(
            [
                _line("dropping InstallSnapshot to peer 3: frame too large", level="error"),
                _line("dropping InstallSnapshot to peer 3: frame too large", level="error"),
                _line("heartbeat"),
            ]
        )
    )
    reason = bs.failure_reason({1: leader, 3: []})
    assert reason == "node 1: dropping InstallSnapshot to peer 3: frame too large"
    assert bs.failure_reason({1: []}) == "nothing relevant in the logs"


def test_a_received_snapshot_is_told_from_entries_and_from_an_own_snapshot() -> None:
    def status(applied: int, log_start: int) -> dict[str, int]:
        return {"applied_index": applied, "log_start_index": log_start}

    assert bs.received_snapshot(status(377, 500), 122)  # restoring the leader's snapshot
    assert bs.received_snapshot(status(500, 500), 122)  # just restored
    assert not bs.received_snapshot(status(377, 100), 122)  # caught up from entries
    assert not bs.received_snapshot(status(385, 285), 122)  # its own snapshot, 100 kept
    assert not bs.received_snapshot(status(122, 122), 122)  # nothing new
