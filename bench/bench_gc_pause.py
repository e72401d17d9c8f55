"""Pauses of Python's cyclic garbage collector in a node's process while a table grows to 1M
file entries: the collector as it comes, and frozen as the node process does it
(metastore.daemon.collector).

Usage: `python -m bench.bench_gc_pause [--files N] [--snapshot-every K] [--quick]`
(`make bench-gc-pause`).

One state machine in one process (bench.bench_apply's Node: the daemon's CatalogStateMachine
fed entries like the driver), one table filled by commits of MAX_FILES_PER_COMMIT files up to
the loose-entry bound, a snapshot taken every K commits (the node takes one every
snapshot_every_entries applied entries: 10,000 by default, idle ticks included), then one
overwrite of every live file. Each mode runs in a child process of its own (a fresh heap):

* `default`: the collector's default thresholds, nothing frozen (the node process before);
* `frozen`: the state machine's `on_state_settled` is `collector.refreeze`, as `run_node` sets
  it: after each snapshot, unfreeze, collect everything, freeze.

Every collection is timed with `gc.callbacks` (start/stop and its generation); the refreezes'
own full collections are reported apart (they run inside a snapshot, whose encode is reported
beside them). Also the process's RSS at the end and its peak. JSON in
bench/results/gc-pause-<UTC>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.machine import REPO_ROOT, machine_info

MODES = ("default", "frozen")


@dataclass
class Run:
    mode: str
    files: int
    snapshot_every_commits: int
    # Automatic collections: count and longest pause per generation, total seconds.
    collections: dict[int, int] = field(default_factory=dict)
    max_pause_s: dict[int, float] = field(default_factory=dict)
    total_gc_s: float = 0.0
    overwrite_max_pause_s: float = 0.0
    refreeze_s: list[float] = field(default_factory=list)
    snapshot_encode_s: list[float] = field(default_factory=list)
    frozen_objects: int = 0
    rss_mib: float = 0.0
    peak_rss_mib: float = 0.0


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def child(mode: str, files: int, every: int) -> Run:
    from bench.bench_apply import Node, big_commit
    from metastore import limits
    from metastore.daemon.collector import refreeze

    run = Run(mode=mode, files=files, snapshot_every_commits=every)
    in_refreeze = [False]
    started = [0.0]
    pauses: list[tuple[int, float]] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if in_refreeze[0]:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((int(info["generation"]), time.perf_counter() - started[0]))

    def timed_refreeze() -> None:
        in_refreeze[0] = True
        t = time.perf_counter()
        refreeze()
        run.refreeze_s.append(time.perf_counter() - t)
        in_refreeze[0] = False

    node = Node()
    if mode == "frozen":
        node.machine.on_state_settled = timed_refreeze
    gc.callbacks.append(on_gc)
    per_commit = limits.MAX_FILES_PER_COMMIT
    commits = 0
    while node.files < files:
        node.fill(min(per_commit, files - node.files), per_commit)
        commits += 1
        if commits % every == 0:
            t = time.perf_counter()
            node.machine.snapshot()
            run.snapshot_encode_s.append(time.perf_counter() - t - (run.refreeze_s or [0.0])[-1])
    before = len(pauses)
    node.apply(big_commit("overwrite", node.index, per_commit))
    run.overwrite_max_pause_s = max((p for _, p in pauses[before:]), default=0.0)
    gc.callbacks.remove(on_gc)
    for gen, pause in pauses:
        run.collections[gen] = run.collections.get(gen, 0) + 1
        run.max_pause_s[gen] = max(run.max_pause_s.get(gen, 0.0), pause)
        run.total_gc_s += pause
    run.frozen_objects = gc.get_freeze_count()
    run.rss_mib = _rss_mib()
    run.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return run


def main(argv: list[str] | None = None) -> int:
    from metastore import limits

    parser = argparse.ArgumentParser(prog="python -m bench.bench_gc_pause", description=__doc__)
    # The overwrite adds MAX_FILES_PER_COMMIT files of its own: room left for them.
    bound = limits.MAX_FILE_ENTRIES_PER_TABLE - limits.MAX_FILES_PER_COMMIT
    parser.add_argument("--files", type=int, default=bound, help=f"files before ({bound:,})")
    parser.add_argument("--snapshot-every", type=int, default=20, help="commits (20)")
    parser.add_argument("--quick", action="store_true", help="100k files")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    files = 100_000 if args.quick else args.files
    if args.child:
        print(json.dumps(asdict(child(args.child, files, args.snapshot_every))))
        return 0
    machine = machine_info()
    runs = []
    for mode in MODES:
        out = subprocess.run(
            [
                *(sys.executable, "-m", "bench.bench_gc_pause", "--child", mode),
                *("--files", str(files), "--snapshot-every", str(args.snapshot_every)),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        run = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(run)
        refreeze = run["refreeze_s"]
        encode = run["snapshot_encode_s"]
        print(
            f"{mode:8} collections {run['collections']} max pause ms "
            f"{ {g: round(s * 1000, 1) for g, s in run['max_pause_s'].items()} } "
            f"total {run['total_gc_s'] * 1000:.0f} ms; overwrite's longest "
            f"{run['overwrite_max_pause_s'] * 1000:.1f} ms; refreeze max "
            f"{max(refreeze, default=0) * 1000:.0f} ms (snapshot encode max "
            f"{max(encode, default=0) * 1000:.0f} ms); frozen {run['frozen_objects']:,}; "
            f"RSS {run['rss_mib']:.0f} MiB (peak {run['peak_rss_mib']:.0f})"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"gc-pause-{stamp}.json"
    path.write_text(json.dumps({"machine": machine, "runs": runs}, indent=2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
