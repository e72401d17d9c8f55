"""`bench.bench_raft_latency`'s verdict: judged on the p50 over every sample of every round,
with the per-round ratios beside it (the pure part; the run itself is `make
bench-raft-latency`)."""

from __future__ import annotations

from bench.bench_raft import OURS, OURS_NOFSYNC, PYSYNCOBJ_NOBATCH
from bench.bench_raft_latency import VariantLatency, compare


def latencies(rounds: list[list[float]]) -> VariantLatency:
    v = VariantLatency()
    for samples in rounds:
        v.samples_ms.extend(samples)
        v.round_p50_ms.append(sorted(samples)[len(samples) // 2])
    return v


def test_the_target_is_judged_on_all_samples_and_each_round_gives_a_ratio() -> None:
    results = {
        OURS: latencies([[0.4, 0.5, 0.6], [0.9, 1.0, 1.1]]),
        OURS_NOFSYNC: latencies([[0.3, 0.3, 0.3]]),
        PYSYNCOBJ_NOBATCH: latencies([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]),
    }
    ratios, met = compare(results)
    assert ratios == [1.0, 2.0]
    assert met is False  # ours' pooled p50 is 0.9 ms, pysyncobj's 0.5 ms
    results[OURS] = latencies([[0.4, 0.45, 0.5], [0.4, 0.5, 0.6]])
    assert compare(results)[1] is True
    assert VariantLatency().summary()["p50_ms"] is None
    assert compare({**results, OURS: VariantLatency()})[1] is None
