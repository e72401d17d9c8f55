"""The catalog benchmark (`bench.bench_catalog`): its pure parts, and one tiny real run.

The pure parts decide what the report says (percentiles, the version a read must return, the
targets' verdicts), so they are checked against hand-computed values. The real run starts three
daemon processes and checks that every phase measured something, that every reply was right,
that no DDL beat its floor DD + CSmax, and that no child process outlives the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import msgpack
import pytest

from bench import bench_catalog as bc


def _frame(obj: object) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


# --- pure parts ---------------------------------------------------------------------------------
def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert bc.percentile(values, 0.50) == 50.0
    assert bc.percentile(values, 0.99) == 99.0
    assert bc.percentile([3.0, 1.0, 2.0], 0.99) == 3.0
    with pytest.raises(ValueError, match="no values"):
        bc.percentile([], 0.5)


def test_wait_stats_count_zeros_without_storing_them() -> None:
    # 1000 reads, 995 waited 0: p99 (rank 990) is still a zero.
    stats = bc.WaitStats.from_waits(1000, 995, [5.0, 1.0, 2.0, 4.0, 3.0])
    assert stats.zero_fraction == pytest.approx(0.995)
    assert stats.p99_ms == 0.0
    assert stats.max_ms == 5.0
    # 100 reads, 90 waited 0: rank 99 is the 9th of the 10 non-zero waits.
    stats = bc.WaitStats.from_waits(100, 90, [float(v) for v in range(10, 0, -1)])
    assert stats.p99_ms == 9.0
    assert bc.WaitStats.from_waits(0, 0, []).zero_fraction is None


def test_expected_version_is_the_greatest_activation_at_or_before_ts() -> None:
    tus, versions = (100, 200, 300), (1, 2, 3)
    assert bc.expected_version(tus, versions, 99) is None
    assert bc.expected_version(tus, versions, 100) == 1
    assert bc.expected_version(tus, versions, 199) == 1
    assert bc.expected_version(tus, versions, 200) == 2
    assert bc.expected_version(tus, versions, 10**9) == 3


def test_take_frames_keeps_a_partial_frame_and_refuses_an_oversized_one() -> None:
    data = _frame({"id": 1}) + _frame({"id": 2})
    buf = bytearray(data[:-3])
    assert bc.take_frames(buf) == [{"id": 1}]
    buf += data[-3:]
    assert bc.take_frames(buf) == [{"id": 2}]
    assert buf == bytearray()
    with pytest.raises(bc.ProtocolMismatchError, match="exceeds"):
        bc.take_frames(bytearray((bc.FRAME_BYTES_MAX + 1).to_bytes(4, "big")))


def test_request_frames_follow_the_now_past_pattern_by_slot() -> None:
    past = tuple((1000 + i, 1 + i % 3) for i in range(bc.PAST_TS_POOL_SIZE))
    spec = bc.LoadSpec(
        port=1,
        token="t",
        node_pid=1,
        table="ns.t",
        connections=1,
        pipeline_depth=1,
        warmup_s=0,
        measure_s=1,
        now_percent=50,
        past=past,
        latest_version=3,
    )
    frames = bc.build_request_frames(spec)
    assert len(frames) == bc.PAST_TS_POOL_SIZE
    for slot in (1, 49, 50, 99, 150, len(frames) - 1):
        request = bc.take_frames(bytearray(frames[slot]))[0]
        assert request["id"] == slot
        assert ("ts" in request["args"]) == (slot % 100 >= 50)
        if slot % 100 >= 50:
            assert request["args"]["ts"] == past[slot][0]
    # Slot 0 goes out as id len(frames): an id must be positive, and it maps back to slot 0.
    assert bc.take_frames(bytearray(frames[0]))[0]["id"] == len(frames)


def test_host_usage_splits_the_machine_between_node_client_and_others() -> None:
    before = {"at_s": 10.0, "client_cpu_s": 1.0, "machine_busy_s": 100.0, "node_cpu_s": 5.0,
              "node_runqueue_s": 2.0}  # fmt: skip
    after = {"at_s": 12.0, "client_cpu_s": 1.5, "machine_busy_s": 103.6, "node_cpu_s": 6.0,
             "node_runqueue_s": 2.4}  # fmt: skip
    usage = bc.HostUsage.between(before, after)
    assert usage.machine_busy_cores == pytest.approx(1.8)
    assert usage.node_cpu_cores == pytest.approx(0.5)
    assert usage.client_cpu_cores == pytest.approx(0.25)
    assert usage.others_cores == pytest.approx(1.05)
    assert usage.node_runqueue_fraction == pytest.approx(0.2)


def _throughput(node_id: int, role: str, rate: float, zero: int) -> bc.ThroughputResult:
    host = bc.HostUsage(window_s=1.0, machine_busy_cores=1.0, node_cpu_cores=0.5,
                        client_cpu_cores=0.2, others_cores=0.3,
                        node_runqueue_fraction=0.0)  # fmt: skip
    return bc.ThroughputResult(
        node_id=node_id,
        role=role,
        reads=int(rate),
        window_s=1.0,
        reads_per_s=rate,
        errors={},
        wrong_answers=0,
        waits_at_now=bc.WaitStats.from_waits(1000, zero, [1.0] * (1000 - zero)),
        host=host,
    )


def _ddl(node_id: int, via: str, max_ms: float) -> bc.DdlResult:
    return bc.DdlResult(
        via_node_id=node_id,
        via=via,
        samples=1,
        p50_ms=max_ms,
        max_ms=max_ms,
        mean_ms=max_ms,
        floor_ms=1000.0,
        max_over_floor=max_ms / 1000,
        commit_p50_ms=1.0,
        commit_max_ms=1.0,
        latencies_ms=[max_ms],
    )


def test_targets_judge_every_node_and_only_followers_for_waits() -> None:
    m = bc.Measurements(leader=1, followers=[2, 3])
    # The leader may wait (it is not what the target is about); the followers may not.
    m.throughput = [
        _throughput(1, "leader", 12_000, 900),
        _throughput(2, "follower", 10_000, 999),
        _throughput(3, "follower", 15_000, 1000),
    ]
    m.ddl = [_ddl(2, "follower", bc.TARGET_DDL_MS_MAX), _ddl(1, "leader", 1001.0)]
    targets = bc.evaluate_targets(m)
    assert targets["reads_per_s_per_node"]["met"] is True
    assert targets["follower_zero_wait_fraction"]["met"] is True
    assert targets["ddl_max_ms"]["met"] is True
    assert targets["read_p99_ms"]["met"] is None  # not measured
    assert targets["correct_answers"]["met"] is True
    assert pytest.approx(1070.0) == bc.TARGET_DDL_MS_MAX

    m.throughput[1] = _throughput(2, "follower", 9_999, 998)
    m.ddl[0] = _ddl(2, "follower", bc.TARGET_DDL_MS_MAX + 0.1)
    targets = bc.evaluate_targets(m)
    assert targets["reads_per_s_per_node"]["met"] is False
    assert targets["follower_zero_wait_fraction"]["met"] is False
    assert targets["ddl_max_ms"]["met"] is False
    # The table renders with partial results (no latency phase) without raising.
    assert bc.render_table(m, targets).row_count > 0


def test_params_refuse_more_in_flight_than_the_server_allows() -> None:
    params = bc.BenchParams.for_mode(quick=True)
    params.validate()
    too_deep = dataclasses.replace(params, pipeline_depth=bc.INFLIGHT_PER_CONNECTION_MAX + 1)
    with pytest.raises(bc.InvalidParamsError, match="pipeline_depth"):
        too_deep.validate()


# --- one tiny real run --------------------------------------------------------------------------
def _children_of(pid: int) -> list[int]:
    """Child processes of `pid`, except multiprocessing's resource tracker: that helper is
    started once per interpreter by the first spawned process and exits with the interpreter."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            with contextlib.suppress(OSError):
                if b"resource_tracker" in (entry / "cmdline").read_bytes():
                    continue
            out.append(int(entry.name))
    return out


@pytest.mark.slow
def test_a_tiny_real_run_measures_every_phase_and_leaves_no_process() -> None:
    children_before = set(_children_of(os.getpid()))
    params = bc.BenchParams(
        quick=True,
        schema_versions=3,
        load_seconds=0.5,
        warmup_seconds=0.2,
        load_connections=2,
        pipeline_depth=8,
        latency_reads=100,
        ddl_count=1,
        seed=7,
        fifo_latency=True,
    )
    m, error = bc.run(params)
    assert error is None
    assert m.leader in bc.NODE_IDS
    assert sorted([m.leader, *m.followers]) == list(bc.NODE_IDS)

    assert [(r.node_id, r.role) for r in m.throughput] == [
        (m.leader, "leader"),
        (m.followers[0], "follower"),
        (m.followers[1], "follower"),
    ]
    for r in m.throughput:
        assert r.reads > 0
        assert r.waits_at_now.reads > 0
    assert [(r.node_id, r.role) for r in m.latency] == [
        (m.leader, "leader"),
        (m.followers[0], "follower"),
    ]
    for lat in m.latency:
        assert lat.samples == params.latency_reads
        assert 0 < lat.p50_ms <= lat.p99_ms <= lat.max_ms
        assert lat.echo_p50_ms > 0
    # Real-time scheduling needs root / CAP_SYS_NICE: measured, or skipped with the reason.
    assert len(m.latency_fifo) == 2 or (m.fifo_skipped and not m.latency_fifo)
    assert all(r.scheduling == "fifo" for r in m.latency_fifo)
    # Every reply was the version IEP-98 prescribes, and none was an error.
    assert m.bad_replies() == 0
    # A DDL returns only once now >= Tu + CSmax: it can never be faster than DD + CSmax (less
    # the 1 ms resolution of the HLC's physical part).
    assert [(r.via_node_id, r.via) for r in m.ddl] == [
        (m.followers[0], "follower"),
        (m.leader, "leader"),
    ]
    for ddl in m.ddl:
        assert min(ddl.latencies_ms) >= bc.DDL_FLOOR_MS - 1
    assert m.leader_after == m.leader
    # Nodes, load generators and the echo control are all gone.
    assert set(_children_of(os.getpid())) <= children_before
