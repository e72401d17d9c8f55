"""Lone-proposal latency of our engine and pysyncobj, interleaved round by round in one run.

Usage: `python -m bench.bench_raft_latency [--rounds R] [--samples N]`
(`make bench-raft-latency`; defaults: 10 rounds of 1,000 lone proposals per variant).

Key idea: `bench-raft` measures each variant's latency once, one variant after the other, so
on this shared machine a burst of someone else's work lands on one variant and not on the next
(runs of the same code moved between 0.6 and 3.8 ms p50). Here the three clusters run at once
(nine processes, idle but for heartbeats while another cluster is measured) and the variants
take turns: each round measures every variant once, in an order rotated from round to round,
so each variant meets the machine's quiet and busy minutes alike. Reported per variant: p50
and p99 over every sample of every round, the median of the per-round p50s, CPU per proposal;
and per round the ratio ours / pysyncobj-nobatch of the two p50s, whose median and spread say
how stable the comparison is.

The variants are those of `bench-raft` (bench/bench_raft.py: same node programs, same
`latency` op, same payload size): `ours` (fsync on), `ours-nofsync` and `pysyncobj-nobatch`,
pysyncobj's best configuration for latency (its batching one waits ~100 ms per proposal by
design). The price we pay that pysyncobj does not: fsync of every entry on every node
(pysyncobj journals without fsync).

Target (issue 11 item 9): ours' p50 at or below pysyncobj-nobatch's, judged on the p50 over
all samples. Results: a table on stdout, JSON in bench/results/raftlat-<UTC>.json with every
round. Every node is started by us and stopped by its PID in a `finally`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.table import Table

from bench.bench_raft import (
    CLUSTER_START_WAIT_S,
    ENGINES,
    OURS,
    OURS_NOFSYNC,
    PYSYNCOBJ_NOBATCH,
    AckTally,
    BenchError,
    BenchParams,
    Cluster,
    check_engine_available,
    load_average,
    measure_latency,
    percentile,
    progress,
    wait_for_leader,
)
from bench.machine import REPO_ROOT, machine_info

VARIANTS: Final = (OURS, OURS_NOFSYNC, PYSYNCOBJ_NOBATCH)


@dataclass
class VariantLatency:
    samples_ms: list[float] = field(default_factory=list)
    round_p50_ms: list[float] = field(default_factory=list)
    cpu_us_per_proposal: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | None]:
        samples = sorted(self.samples_ms)
        cpu = self.cpu_us_per_proposal
        return {
            "samples": len(samples),
            "p50_ms": percentile(samples, 0.50) if samples else None,
            "p99_ms": percentile(samples, 0.99) if samples else None,
            "median_round_p50_ms": (
                statistics.median(self.round_p50_ms) if self.round_p50_ms else None
            ),
            "cpu_us_per_proposal": statistics.median(cpu) if cpu else None,
        }


def run(rounds: int, samples: int) -> dict[str, VariantLatency]:
    params = replace(BenchParams.for_mode(quick=False), latency_count=samples)
    for name in VARIANTS:
        check_engine_available(ENGINES[name])
    results = {name: VariantLatency() for name in VARIANTS}
    with ExitStack() as stack:
        clusters: dict[str, tuple[Cluster, AckTally]] = {}
        for name in VARIANTS:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"raftlat-{name}-")))
            cluster = Cluster(ENGINES[name], tmp, params)
            stack.callback(cluster.stop_all)
            cluster.start_all()
            tally = AckTally()
            leader = wait_for_leader(cluster, tally, CLUSTER_START_WAIT_S)
            progress(f"{name}: node {leader} leads")
            clusters[name] = (cluster, tally)
        for round_no in range(rounds):
            order = VARIANTS[round_no % len(VARIANTS) :] + VARIANTS[: round_no % len(VARIANTS)]
            for name in order:
                progress(f"round {round_no + 1}/{rounds}: {name}")
                cluster, tally = clusters[name]
                measured = measure_latency(
                    cluster, tally, params, samples_out=results[name].samples_ms
                )
                results[name].round_p50_ms.append(measured.p50_ms)
                if measured.cpu_us_per_proposal is not None:
                    results[name].cpu_us_per_proposal.append(measured.cpu_us_per_proposal)
    return results


def compare(results: dict[str, VariantLatency]) -> tuple[list[float], bool | None]:
    """Per round, ours' p50 / pysyncobj-nobatch's; and whether the target is met: ours' p50
    over all samples at or below pysyncobj-nobatch's (None when either has no samples)."""
    ratios = [
        ours / base
        for ours, base in zip(
            results[OURS].round_p50_ms, results[PYSYNCOBJ_NOBATCH].round_p50_ms, strict=False
        )
        if base > 0
    ]
    ours_p50 = results[OURS].summary()["p50_ms"]
    base_p50 = results[PYSYNCOBJ_NOBATCH].summary()["p50_ms"]
    met = None if ours_p50 is None or base_p50 is None else ours_p50 <= base_p50
    return ratios, met


def render(
    results: dict[str, VariantLatency], ratios: list[float], params: dict[str, int]
) -> Table:
    table = Table(
        title=(
            f"Lone-proposal latency, {params['rounds']} interleaved rounds of "
            f"{params['samples']} proposals per variant (clusters up at once)"
        )
    )
    table.add_column("metric")
    for name in VARIANTS:
        table.add_column(name, justify="right")
    table.add_column("ours / pysyncobj-nobatch", justify="right")
    summaries = {name: results[name].summary() for name in VARIANTS}
    for label, key, spec in (
        ("p50 ms, all samples", "p50_ms", ".3f"),
        ("p99 ms, all samples", "p99_ms", ".3f"),
        ("median of the rounds' p50, ms", "median_round_p50_ms", ".3f"),
        ("CPU per proposal, 3 nodes (us, median)", "cpu_us_per_proposal", ",.0f"),
    ):
        values = [summaries[name][key] for name in VARIANTS]
        ours, base = summaries[OURS][key], summaries[PYSYNCOBJ_NOBATCH][key]
        ratio = f"{ours / base:.2f}" if ours is not None and base else "n/a"
        table.add_row(label, *["n/a" if v is None else format(v, spec) for v in values], ratio)
    if ratios:
        table.add_row(
            "per-round p50 ratio: median (min-max)",
            "",
            "",
            "",
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_raft_latency",
        description="Lone-proposal latency, ours and pysyncobj interleaved round by round",
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds (each variant once)")
    parser.add_argument("--samples", type=int, default=1000, help="proposals per round")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.samples < 10:
        parser.error("--rounds must be at least 1 and --samples at least 10")
    started = datetime.now(UTC)
    load_at_start = load_average()
    machine = machine_info(("pysyncobj", "uvloop"))
    try:
        results = run(args.rounds, args.samples)
    except BenchError as exc:
        progress(f"FAILED ({exc.code}): {exc}")
        return 1
    ratios, met = compare(results)
    params = {"rounds": args.rounds, "samples": args.samples}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"raftlat-{started:%Y%m%dT%H%M%SZ}.json"
    path.write_text(
        json.dumps(
            {
                "started_utc": started.isoformat(),
                "finished_utc": datetime.now(UTC).isoformat(),
                "command": " ".join(
                    ["python -m bench.bench_raft_latency", *(argv or sys.argv[1:])]
                ),
                "machine": machine,
                "load_average": {"start": load_at_start, "end": load_average()},
                "params": params,
                "results": {
                    name: {**results[name].summary(), "round_p50_ms": results[name].round_p50_ms}
                    for name in VARIANTS
                },
                "per_round_ratio_ours_vs_pysyncobj_nobatch": ratios,
                "target": {
                    "what": "ours p50 (fsync on) <= pysyncobj-nobatch p50, all samples",
                    "met": met,
                },
            },
            indent=2,
        )
        + "\n"
    )
    Console().print(render(results, ratios, params))
    verdict = {True: "met", False: "MISSED", None: "n/a"}[met]
    print(f"target p50 ours <= pysyncobj-nobatch: {verdict}")
    progress(f"results written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
