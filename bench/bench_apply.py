"""Apply cost of the largest commit: the time one CommitTxn holds a node's event loop.

Usage: `python -m bench.bench_apply [--rounds R] [--quick] [--profile]` (`make bench-apply`).

Key idea: every node applies committed entries in log order on its event loop (raft.node's
driver), so while a follower applies an entry it answers no heartbeat. The command itself is
decoded off the loop (the leader decodes before proposing, followers in `prepare_appended`), so
what is left on the loop is `CatalogStateMachine.apply` of the decoded command: the catalog's
checks and writes (metastore.state -> metastore.txn `TxnLog.commit`), the change feed's event.
That is what this measures, in-process, without Raft or sockets, for the largest commit the
limits allow: MAX_FILES_PER_COMMIT (10,000) files whose paths are padded so the encoded
command is just below MAX_COMMIT_COMMAND_BYTES (3 MiB), every file in the attempt directory of
a live session (`_txn/<session>--<attempt>/`, as the bridge writes them), into one table that
holds a given number of loose file entries first:

* `add`: the commit adds its 10,000 files (the table grows by them, round after round: the
  rounds of the largest size end exactly at MAX_FILE_ENTRIES_PER_TABLE, the loose-entry bound);
* `overwrite`: the commit replaces every live file of the table with its 10,000 (an overwrite's
  implicit removals are bounded by MAX_FILE_ENTRIES_PER_TABLE, not by MAX_FILES_PER_COMMIT, so
  this is the costliest commit of all); each round on a freshly filled table.

Tables are filled with commits of MAX_FILES_PER_COMMIT files of ~110-character paths, applied
the same way (not measured). Reported per (kind, table size): the wall and CPU seconds of the
apply (`time.perf_counter`, `time.process_time`), the part of the wall time spent in Python's
cyclic garbage collector during it (`gc.callbacks`: allocation-triggered, so it lands in
whatever runs; at a million entries one full collection takes a fifth of a second), and the
off-loop decode of the same bytes for comparison. Results: a table on stdout, JSON in
bench/results/apply-<UTC>.json (or --results-dir) with the machine facts (bench.machine: the
load average says what else ran). `--quick`: tiny tables and commits, for the test suite.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.table import Table

from bench.machine import REPO_ROOT, machine_info
from metastore import limits
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import (
    Command,
    CommitTxn,
    CreateNamespace,
    DataFile,
    InitCluster,
    OpenSession,
    SessionInfo,
    TableName,
    TableWrite,
    decode_command,
    encode_command,
)
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.ddl import parse_ddl
from metastore.outcome import Outcome
from raft.core.types import Entry, EntryKind

MS: Final = 1 << 16  # one millisecond in HLC units
T0: Final = 1_764_000_000_000 * MS
DD_MS: Final = 500
# One entry per second of Tm: every commit lands past the table's activation (created Tu =
# its Tm + DD), and the session (TTL SESSION_TTL_MS_MAX) stays live through any run.
STEP_MS: Final = 1_000
TABLE: Final = TableName.of("bench", "apply")
SESSION_ID: Final = "0f8fad5b-d9cb-469f-a165-70867728950e"
KINDS: Final = ("add", "overwrite")
# The encoded command stays this far below MAX_COMMIT_COMMAND_BYTES (the padding is per path).
COMMAND_SLACK_BYTES: Final = 1024


@dataclass(frozen=True)
class Params:
    files_per_commit: int
    table_sizes: tuple[int, ...]  # loose entries the table holds before the first round
    rounds: int

    @classmethod
    def for_mode(cls, *, quick: bool, rounds: int) -> Params:
        if quick:
            return cls(files_per_commit=50, table_sizes=(0, 200), rounds=rounds)
        files = limits.MAX_FILES_PER_COMMIT
        bound = limits.MAX_FILE_ENTRIES_PER_TABLE
        return cls(files_per_commit=files, table_sizes=(0, 100_000, bound), rounds=rounds)

    def start_size(self, kind: str, size: int) -> int:
        """Entries the table holds before the first measured round: at the loose-entry bound,
        low enough that every round still fits under it."""
        rounds_adding = self.rounds if kind == "add" else 1
        return min(size, limits.MAX_FILE_ENTRIES_PER_TABLE - rounds_adding * self.files_per_commit)


@dataclass
class Case:
    kind: str
    table_files: int  # loose entries before the first round
    command_bytes: int
    files_before: list[int] = field(default_factory=list)  # per round
    live_removed: list[int] = field(default_factory=list)  # files the commit removed, per round
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    gc_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    profile: str = ""

    def summary(self) -> dict[str, float]:
        return {
            "wall_median_s": statistics.median(self.wall_s),
            "wall_max_s": max(self.wall_s),
            "cpu_median_s": statistics.median(self.cpu_s),
            "gc_median_s": statistics.median(self.gc_s),
            "decode_median_s": statistics.median(self.decode_s),
        }


class Node:
    """One node's state machine fed entries with increasing index and Tm, like the driver."""

    def __init__(self) -> None:
        self.machine = CatalogStateMachine()
        self.index = 0
        self.tm = T0
        self.apply(InitCluster(dd_ms=DD_MS, cs_max_ms=100, apply_version=APPLY_VERSION_SUPPORTED))
        self.apply(CreateNamespace(namespace=TABLE.namespace))
        self.apply(parse_ddl(f"CREATE TABLE {TABLE} (id BIGINT, payload STRING)"))
        self.apply(
            OpenSession(session_id=SESSION_ID, info=SessionInfo(), ttl_ms=limits.SESSION_TTL_MS_MAX)
        )
        self.files = 0
        self.live = 0

    def next_entry(self, data: bytes) -> Entry:
        self.index += 1
        self.tm += STEP_MS * MS
        return Entry(index=self.index, term=1, tm=self.tm, kind=EntryKind.NORMAL, data=data)

    def apply(self, command: Command) -> Outcome:
        data = encode_command(command)
        self.machine.expect_entry(data, command)
        outcome = self.machine.apply(self.next_entry(data))
        outcome.raise_for_error()
        return outcome

    def fill(self, files: int, per_commit: int) -> None:
        while files > 0:
            n = min(files, per_commit)
            batch = self.index
            add = tuple(
                DataFile(path=fill_path(batch, i), size_bytes=1_000_000, row_count=1_000)
                for i in range(n)
            )
            self.apply(
                CommitTxn(
                    txn_id=f"fill-{batch}",
                    writes=(TableWrite(table=TABLE, schema_version=1, add=add),),
                )
            )
            self.files += n
            self.live += n
            files -= n


def fill_path(batch: int, i: int) -> str:
    return f"_txn/{SESSION_ID}--fill-{batch:08d}/part-{i:05d}-{batch:08d}-c000.snappy.parquet"


def big_path(batch: int, i: int, pad: int) -> str:
    # Spark's shape, with partition directories; `pad` lengthens the file name.
    return (
        f"_txn/{SESSION_ID}--batch-{batch:08d}-0123456789ab/date=2026-11-27/hour=19/"
        f"part-{i:05d}-{'0' * pad}{batch:08d}-c000.snappy.parquet"
    )


def big_commit(kind: str, batch: int, files: int) -> CommitTxn:
    """The largest commit of `files` files: paths padded to just below the command limit."""

    def build(pad: int) -> CommitTxn:
        add = tuple(
            DataFile(path=big_path(batch, i, pad), size_bytes=1_000_000, row_count=1_000)
            for i in range(files)
        )
        write = TableWrite(table=TABLE, schema_version=1, add=add, overwrite=kind == "overwrite")
        return CommitTxn(txn_id=f"big-{kind}-{batch}", writes=(write,))

    budget = limits.MAX_COMMIT_COMMAND_BYTES - COMMAND_SLACK_BYTES
    pad = limits.MAX_FILE_PATH_CHARS - len(big_path(batch, 0, 0))  # the longest path allowed
    command = build(pad)
    # Each pass lowers the padding by at least one: msgpack's string headers grow by a byte
    # past 255 characters, so the first estimate can be a byte per path too long.
    for _ in range(pad + 1):
        excess = len(encode_command(command)) - budget
        if excess <= 0:
            break
        pad = max(0, pad - (excess + files - 1) // files)
        command = build(pad)
    return command


@contextmanager
def gc_timer() -> Iterator[list[float]]:
    """Seconds the cyclic garbage collector ran inside the block (its first item)."""
    spent = [0.0]
    started = [0.0]

    def on_gc(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]

    gc.callbacks.append(on_gc)
    try:
        yield spent
    finally:
        gc.callbacks.remove(on_gc)


def measure_round(node: Node, case: Case, kind: str, files: int, *, profile: bool) -> None:
    command = big_commit(kind, node.index, files)
    data = encode_command(command)
    started = time.perf_counter()
    decoded = decode_command(data)  # off the loop in the daemon: for comparison only
    case.decode_s.append(time.perf_counter() - started)
    case.command_bytes = len(data)
    node.machine.expect_entry(data, decoded)
    entry = node.next_entry(data)
    profiler = cProfile.Profile() if profile else None
    with gc_timer() as gc_spent:
        wall = time.perf_counter()
        cpu = time.process_time()
        if profiler is not None:
            profiler.enable()
        outcome = node.machine.apply(entry)
        if profiler is not None:
            profiler.disable()
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
    outcome.raise_for_error()
    case.files_before.append(node.files)
    case.live_removed.append(node.live if kind == "overwrite" else 0)
    case.wall_s.append(wall)
    case.cpu_s.append(cpu)
    case.gc_s.append(gc_spent[0])
    node.files += files
    node.live = files if kind == "overwrite" else node.live + files
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
        case.profile = out.getvalue()


def measure(params: Params, *, profile: bool, console: Console) -> list[Case]:
    cases: list[Case] = []
    for kind in KINDS:
        for size in params.table_sizes:
            start = params.start_size(kind, size)
            case = Case(kind=kind, table_files=start, command_bytes=0)
            node: Node | None = None
            for _ in range(params.rounds):
                if node is None or kind == "overwrite":
                    node = None  # free the last table before filling the next
                    console.print(f"[dim]{kind}: filling a table with {start:,} files…[/dim]")
                    node = Node()
                    node.fill(start, params.files_per_commit)
                measure_round(node, case, kind, params.files_per_commit, profile=profile)
            cases.append(case)
            console.print(
                f"[dim]{kind} into {start:,} files: median "
                f"{statistics.median(case.wall_s) * 1000:.1f} ms[/dim]"
            )
    return cases


def render(params: Params, cases: list[Case]) -> Table:
    table = Table(
        title=(
            f"Apply of one {params.files_per_commit:,}-file commit on the loop "
            f"(apply version {APPLY_VERSION_SUPPORTED}, {params.rounds} rounds; ms)"
        )
    )
    # wall/cpu/gc: medians (max: the slowest round); decode: off the loop, for comparison.
    for column in ("kind", "files before", "MiB", "removed", "wall", "max", "cpu", "gc", "decode"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for c in cases:
        s = c.summary()
        table.add_row(
            c.kind,
            f"{c.table_files:,}",
            f"{c.command_bytes / 2**20:.2f}",
            f"{max(c.live_removed):,}",
            f"{s['wall_median_s'] * 1000:.1f}",
            f"{s['wall_max_s'] * 1000:.1f}",
            f"{s['cpu_median_s'] * 1000:.1f}",
            f"{s['gc_median_s'] * 1000:.1f}",
            f"{s['decode_median_s'] * 1000:.1f}",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_apply",
        description="Time one node's event loop spends applying the largest commit.",
    )
    parser.add_argument("--rounds", type=int, default=3, help="applies per case (3)")
    parser.add_argument("--quick", action="store_true", help="tiny tables and commits")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile each apply; print the last one's top"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=REPO_ROOT / "bench" / "results",
        help="where the JSON goes (bench/results)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    params = Params.for_mode(quick=args.quick, rounds=args.rounds)
    console = Console(width=max(Console().width, 100))
    machine = machine_info()  # the load average before the run
    cases = measure(params, profile=args.profile, console=console)
    console.print(render(params, cases))
    if args.profile:
        for c in cases:
            console.print(f"[bold]{c.kind} into {c.table_files:,} files[/bold]\n{c.profile}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"apply-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine,
                "apply_version": APPLY_VERSION_SUPPORTED,
                "params": asdict(params),
                "cases": [
                    {**{k: v for k, v in asdict(c).items() if k != "profile"}, **c.summary()}
                    for c in cases
                ],
            },
            indent=2,
        )
    )
    console.print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
