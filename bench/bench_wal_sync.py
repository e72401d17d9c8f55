"""What one synced WAL append costs, with and without zeros written ahead of the records.

Usage: `python -m bench.bench_wal_sync [--appends N] [--rounds R] [--writers W]`
(`make bench-wal`; defaults: 3,000 appends, 3 rounds, 3 writers).

Key idea: a lone Raft proposal waits for one fdatasync on the leader and one on a follower,
each in its own process. What a sync costs beyond the device's own time (sleeps, waking up,
waiting for a core) is what separates our latency with fsync from our latency without it
(docs/benchmarks.md). This measures the append alone, in `W` processes at once on one disk as
the three nodes of a local cluster do, each appending one ~120-byte entry plus a hard state per
call, the shape of a lone proposal's append, through the real `raft.wal.WriteAheadLog` with
fsync on:

* `preallocated`: the default, the live segment kept `WAL_PREALLOCATE_BYTES` ahead of its
  records with written zeros, so a sync does not change the file's size;
* `growing`: `preallocate_bytes=0`, every append grows the file (the WAL before 197100f).

The two variants alternate, `R` rounds each, in the same minutes. Reported per variant (over
all writers and rounds): append latency p50/p99 (µs), CPU per append (µs, user + system of the
writer process) and voluntary context switches per append (the sleeps: each is a wake-up that
waits for a core on a busy machine). The ratio columns are preallocated / growing.

Results: a table on stdout; JSON in bench/results/walsync-<UTC>.json (or --results-dir) with
the machine facts (bench.machine) and every round's numbers. Every writer is a child process
started by us and waited for with a deadline; the WAL directories are temporary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.table import Table

from bench.machine import REPO_ROOT, machine_info

VARIANTS: Final = ("preallocated", "growing")
WRITER_TIMEOUT_S: Final = 300.0
ENTRY_BYTES: Final = 120


@dataclass
class WriterResult:
    latencies_us: list[float]
    cpu_us_per_append: float
    voluntary_switches_per_append: float


@dataclass
class VariantSummary:
    appends: int = 0
    p50_us: float | None = None
    p99_us: float | None = None
    cpu_us_per_append: float | None = None
    voluntary_switches_per_append: float | None = None
    rounds: list[dict[str, float]] = field(default_factory=list)


def run_writer(directory: Path, appends: int, preallocate: bool) -> WriterResult:
    """One writer (runs in a child process): `appends` synced appends of one entry each."""
    from raft.core.types import Entry, HardState
    from raft.wal import WAL_PREALLOCATE_BYTES, WriteAheadLog

    wal, _ = WriteAheadLog.open(
        directory, fsync=True, preallocate_bytes=WAL_PREALLOCATE_BYTES if preallocate else 0
    )
    payload = b"x" * ENTRY_BYTES
    latencies: list[float] = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = time.process_time()
    try:
        for index in range(1, appends + 1):
            started = time.perf_counter()
            wal.append(
                [Entry(term=1, index=index, tm=index, data=payload)],
                HardState(term=1, vote=1, commit=index - 1),
            )
            latencies.append((time.perf_counter() - started) * 1e6)
    finally:
        wal.close()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return WriterResult(
        latencies_us=latencies,
        cpu_us_per_append=(time.process_time() - cpu_before) / appends * 1e6,
        voluntary_switches_per_append=(after.ru_nvcsw - before.ru_nvcsw) / appends,
    )


def run_round(variant: str, *, appends: int, writers: int) -> list[WriterResult]:
    """`writers` processes appending at once, each to its own WAL (one disk, as a local
    cluster's nodes share one)."""
    with tempfile.TemporaryDirectory(prefix="bench-walsync-") as tmp:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.bench_wal_sync",
                    "--child",
                    str(Path(tmp) / f"w{k}"),
                    str(appends),
                    variant,
                ],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
            for k in range(writers)
        ]
        results = []
        try:
            for proc in procs:
                out, _ = proc.communicate(timeout=WRITER_TIMEOUT_S)
                if proc.returncode != 0:
                    raise RuntimeError(f"a writer exited with status {proc.returncode}")
                results.append(WriterResult(**json.loads(out)))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
    return results


def summarize(rounds: list[list[WriterResult]]) -> VariantSummary:
    summary = VariantSummary()
    latencies: list[float] = []
    cpu: list[float] = []
    switches: list[float] = []
    for writers in rounds:
        round_latencies = sorted(v for w in writers for v in w.latencies_us)
        latencies.extend(round_latencies)
        cpu.extend(w.cpu_us_per_append for w in writers)
        switches.extend(w.voluntary_switches_per_append for w in writers)
        summary.rounds.append(
            {
                "p50_us": statistics.median(round_latencies),
                "cpu_us_per_append": statistics.mean(w.cpu_us_per_append for w in writers),
                "voluntary_switches_per_append": statistics.mean(
                    w.voluntary_switches_per_append for w in writers
                ),
            }
        )
    if latencies:
        latencies.sort()
        summary.appends = len(latencies)
        summary.p50_us = statistics.median(latencies)
        summary.p99_us = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        summary.cpu_us_per_append = statistics.mean(cpu)
        summary.voluntary_switches_per_append = statistics.mean(switches)
    return summary


def render(summaries: dict[str, VariantSummary], params: dict[str, int]) -> Table:
    table = Table(
        title=(
            f"Synced WAL appends: {params['writers']} writers at once, {params['appends']} "
            f"appends each, {params['rounds']} alternated rounds per variant"
        )
    )
    table.add_column("metric")
    for variant in VARIANTS:
        table.add_column(variant, justify="right")
    table.add_column("preallocated / growing", justify="right")
    rows = [
        ("append p50 (us)", "p50_us", ",.0f"),
        ("append p99 (us)", "p99_us", ",.0f"),
        ("CPU per append (us)", "cpu_us_per_append", ",.1f"),
        ("voluntary context switches per append", "voluntary_switches_per_append", ".2f"),
    ]
    for label, attr, spec in rows:
        values = [getattr(summaries[v], attr) for v in VARIANTS]
        cells = ["n/a" if x is None else format(x, spec) for x in values]
        ratio = values[0] / values[1] if None not in values and values[1] else None
        table.add_row(label, *cells, "n/a" if ratio is None else f"{ratio:.2f}")
    return table


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--child"]:
        directory, appends, variant = args_list[1], int(args_list[2]), args_list[3]
        result = run_writer(Path(directory), appends, preallocate=variant == "preallocated")
        print(json.dumps(asdict(result)))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_wal_sync",
        description="Synced WAL appends with and without zeros written ahead (same run)",
    )
    parser.add_argument("--appends", type=int, default=3000, help="appends per writer per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds per variant")
    parser.add_argument("--writers", type=int, default=3, help="processes appending at once")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args(args_list)
    for name in ("appends", "rounds", "writers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    params = {"appends": args.appends, "rounds": args.rounds, "writers": args.writers}
    started = datetime.now(UTC)
    machine = machine_info()
    rounds: dict[str, list[list[WriterResult]]] = {v: [] for v in VARIANTS}
    for round_no in range(1, args.rounds + 1):
        for variant in VARIANTS:
            print(
                f"[{datetime.now(UTC):%H:%M:%S}] round {round_no}/{args.rounds}: {variant}",
                file=sys.stderr,
            )
            rounds[variant].append(run_round(variant, appends=args.appends, writers=args.writers))
    summaries = {v: summarize(rounds[v]) for v in VARIANTS}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"walsync-{started:%Y%m%dT%H%M%SZ}.json"
    path.write_text(
        json.dumps(
            {
                "started_utc": started.isoformat(),
                "finished_utc": datetime.now(UTC).isoformat(),
                "command": " ".join(["python -m bench.bench_wal_sync", *args_list]),
                "machine": {**machine, "loadavg_1_5_15_min_at_end": list(os.getloadavg())},
                "params": params,
                "results": {v: asdict(s) for v, s in summaries.items()},
            },
            indent=2,
        )
    )
    Console().print(render(summaries, params))
    print(f"results written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
