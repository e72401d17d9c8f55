"""Event-loop stalls of the largest allowed operations: the most CPU time a node's event loop
goes without a turn while one of them runs (docs/benchmarks.md, "Event-loop stalls of large
allowed operations").

Usage: `python -m bench.bench_loop_stall [--entries N] [--rounds R] [--quick]`
(`make bench-loop-stall`).

In-process, without Raft or sockets: one table filled to N loose file entries (990k, the
loose-entry bound less one commit) with bench.bench_apply's Node (the daemon's
CatalogStateMachine), the heap frozen as the node process keeps it (metastore.daemon.collector),
and bench.loop_stall's 1 ms ticker measuring, per operation and round:

* `snapshot-on-loop`: `CatalogStateMachine.snapshot()` without its refreeze, what a node whose
  state machine has no `prepare_snapshot` runs on its loop (the catalog's node did before);
* `snapshot-view-thread`: `prepare_snapshot()` on the loop, its encode awaited in a worker
  thread, as raft.node takes a snapshot now (the parts are written, never joined);
* `refreeze`: `collector.refreeze()`, which the node process runs on its loop once a snapshot
  it took is written (`on_state_settled`);
* `overwrite`: the apply of the largest overwrite (bench.bench_apply's `big_commit`): every
  live file of the table removed, 10,000 added; on a freshly filled table each round.

Reported: the worst loop turn (CPU seconds) and the wall seconds of each. Results: a table on
stdout, JSON in bench/results/loop-stall-<UTC>.json (or --results-dir) with the machine facts
(bench.machine: the load average says what else ran). `--quick`: 20k entries.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bench.bench_apply import Node, big_commit
from bench.loop_stall import worst_loop_turn_s
from bench.machine import REPO_ROOT, machine_info
from metastore import limits
from metastore.commands import decode_command, encode_command
from metastore.daemon.collector import refreeze

OPERATIONS: Final = ("snapshot-on-loop", "snapshot-view-thread", "refreeze", "overwrite")
FILL_PER_COMMIT: Final = 10_000
QUICK_ENTRIES: Final = 20_000


def _measure(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(worst loop turn, wall) of `work`, in seconds."""
    started = time.perf_counter()
    worst = asyncio.run(worst_loop_turn_s(work(), freeze_heap=True))
    return worst, time.perf_counter() - started


def _overwrite_round(entries: int) -> tuple[float, float]:
    node = Node()
    node.fill(entries, FILL_PER_COMMIT)
    command = big_commit("overwrite", node.index, min(limits.MAX_FILES_PER_COMMIT, entries))
    data = encode_command(command)
    node.machine.expect_entry(data, decode_command(data))  # decoded off the loop, as a node
    entry = node.next_entry(data)

    async def overwrite() -> None:
        node.machine.apply(entry).raise_for_error()

    return _measure(overwrite)


def _snapshot_rounds(entries: int, rounds: int, out: dict[str, list[dict[str, float]]]) -> None:
    node = Node()
    node.fill(entries, FILL_PER_COMMIT)
    sm = node.machine
    for _ in range(rounds):

        async def on_loop() -> None:
            sm.snapshot()

        async def view_thread() -> None:
            encode = sm.prepare_snapshot()
            await asyncio.to_thread(encode)

        async def refreezing() -> None:
            refreeze()

        for op, work in (
            ("snapshot-on-loop", on_loop),
            ("snapshot-view-thread", view_thread),
            ("refreeze", refreezing),
        ):
            worst, wall = _measure(work)
            out[op].append({"worst_turn_s": worst, "wall_s": wall})


def run(entries: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {op: [] for op in OPERATIONS}
    _snapshot_rounds(entries, rounds, out)
    gc.collect()  # that table goes before the overwrite rounds fill theirs
    for _ in range(rounds):
        worst, wall = _overwrite_round(entries)
        out["overwrite"].append({"worst_turn_s": worst, "wall_s": wall})
        gc.collect()  # the round's table goes before the next is filled
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_loop_stall", description=__doc__)
    bound = limits.MAX_FILE_ENTRIES_PER_TABLE - limits.MAX_FILES_PER_COMMIT
    parser.add_argument("--entries", type=int, default=bound, help=f"loose entries ({bound:,})")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per operation (2)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    entries = QUICK_ENTRIES if args.quick else args.entries
    machine = machine_info()
    results = run(entries, args.rounds)
    print(f"{entries:,} loose file entries in one table; worst loop turn (CPU s) / wall (s)")
    for op, rounds in results.items():
        cells = " | ".join(f"{r['worst_turn_s']:.3f} / {r['wall_s']:.3f}" for r in rounds)
        print(f"{op:22} {cells}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"loop-stall-{stamp}.json"
    report = {"machine": machine, "entries": entries, "results": results}
    path.write_text(json.dumps(report, indent=2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
