"""What parsing one DDL statement costs the node that receives it (CPU seconds).

Usage: `python -m bench.bench_ddl_parse [--rounds R]` (`make bench-ddl`; default 3 rounds).

Key idea: every writer's DDL is parsed by the node that receives it (`metastore.ddl.parse_ddl`,
in a worker thread of the daemon), so the costliest statement the limits let through is the CPU
any writer can make a node spend with one request. Before session 18 a CREATE TABLE within
MAX_STATEMENT_BYTES whose DEFAULTs held thousands of typed literals cost about 100 s; the
DEFAULT token limits (`MAX_DEFAULT_TOKENS_PER_STATEMENT`, `MAX_DISTINCT_DEFAULT_TOKENS_PER_
STATEMENT`) now refuse such a statement before sqlglot sees it. Statements measured, each the
widest table allows (`MAX_COLUMNS_PER_TABLE` columns) unless said otherwise:

* `default_0`: every column `INT DEFAULT 0`;
* `decimal_cast`: every column `DECIMAL(10,2) DEFAULT CAST(0 AS DECIMAL(10,2))`;
* `realistic_mix`: the defaults tables have (numbers, strings, timestamps, arrays, booleans);
* `costliest_allowed`: distinct sums of typed literals up to the distinct-token limit, then one
  of them repeated up to the all-token limit (the most sqlglot work a statement can ask for);
* `refused_literals`: 64 KiB of distinct `1Y + 2Y + ...` DEFAULTs, refused (LIMIT_EXCEEDED):
  the time to refuse it.

Reported per statement: its size, the outcome, and the median, min and max CPU seconds of the
process over R rounds (`time.process_time`; the parse is single-threaded pure Python). Results:
a table on stdout; JSON in bench/results/ddlparse-<UTC>.json (or --results-dir) with the
machine facts (bench.machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.table import Table

from bench.machine import REPO_ROOT, machine_info
from metastore import limits
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from metastore.lexer import tokenize

LITERALS_PER_DEFAULT: Final = 44  # a sum of 44 typed literals stays within MAX_DEFAULT_SQL_CHARS


@dataclass
class StatementResult:
    name: str
    statement_bytes: int
    outcome: str
    cpu_s: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.cpu_s)


def _create(defaults: list[str], column_type: str = "INT") -> str:
    columns = ", ".join(f"c{i} {column_type} DEFAULT {d}" for i, d in enumerate(defaults))
    return f"CREATE TABLE ns.t ({columns})"


def _sum_of(literals: int, *, first: int) -> str:
    return " + ".join(f"{(first + i) % 100}Y" for i in range(literals))


def _tokens(default_sql: str) -> int:
    return len(tokenize(default_sql)) - 1  # the lexer's last token is EOF


def _costliest_allowed() -> str:
    defaults: list[str] = []
    tokens = 0
    cost = 0
    while True:
        candidate = _sum_of(LITERALS_PER_DEFAULT, first=len(defaults))
        cost = _tokens(candidate)
        if tokens + cost > limits.MAX_DISTINCT_DEFAULT_TOKENS_PER_STATEMENT:
            break
        defaults.append(candidate)
        tokens += cost
    while tokens + cost <= limits.MAX_DEFAULT_TOKENS_PER_STATEMENT:
        defaults.append(defaults[0])
        tokens += cost
    return _create(defaults)


def _refused_literals() -> str:
    defaults: list[str] = []
    while True:
        sql = _create([*defaults, _sum_of(LITERALS_PER_DEFAULT, first=len(defaults))])
        if len(sql.encode()) > limits.MAX_STATEMENT_BYTES:
            return _create(defaults)
        defaults.append(_sum_of(LITERALS_PER_DEFAULT, first=len(defaults)))


def _realistic_mix() -> str:
    typed_defaults = [
        ("BIGINT", "-1"),
        ("DECIMAL(10,2)", "CAST(0 AS DECIMAL(10,2))"),
        ("STRING", "'n/a'"),
        ("TIMESTAMP", "current_timestamp()"),
        ("TIMESTAMP", "TIMESTAMP '2024-01-01 00:00:00Z'"),
        ("ARRAY<INT>", "ARRAY()"),
        ("DATE", "DATE '2024-01-01'"),
        ("BOOLEAN", "FALSE"),
    ]
    columns = [
        "c{} {} DEFAULT {}".format(i, *typed_defaults[i % len(typed_defaults)])
        for i in range(limits.MAX_COLUMNS_PER_TABLE)
    ]
    return f"CREATE TABLE ns.t ({', '.join(columns)})"


STATEMENTS: Final[dict[str, Callable[[], str]]] = {
    "default_0": lambda: _create(["0"] * limits.MAX_COLUMNS_PER_TABLE),
    "decimal_cast": lambda: _create(
        ["CAST(0 AS DECIMAL(10,2))"] * limits.MAX_COLUMNS_PER_TABLE, "DECIMAL(10,2)"
    ),
    "realistic_mix": _realistic_mix,
    "costliest_allowed": _costliest_allowed,
    "refused_literals": _refused_literals,
}


def measure(name: str, sql: str, rounds: int) -> StatementResult:
    cpu: list[float] = []
    outcome = ""
    for _ in range(rounds):
        started = time.process_time()
        try:
            parse_ddl(sql)
            outcome = "accepted"
        except MetastoreError as exc:
            outcome = f"refused {exc.code.value} {exc.details.get('limit', '')}".strip()
        cpu.append(time.process_time() - started)
    return StatementResult(name, len(sql.encode()), outcome, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_ddl_parse",
        description="CPU seconds one DDL statement costs the node that parses it.",
    )
    parser.add_argument("--rounds", type=int, default=3, help="parses per statement (3)")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=REPO_ROOT / "bench" / "results",
        help="where the JSON goes (bench/results)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    console = Console()
    results = []
    for name, build in STATEMENTS.items():
        console.print(f"[dim]parsing {name} ({args.rounds} rounds)…[/dim]")
        results.append(measure(name, build(), args.rounds))
    table = Table(title="DDL parse cost (CPU s per statement)")
    for column in ("statement", "bytes", "outcome", "median", "min", "max"):
        table.add_column(column, justify="left" if column in ("statement", "outcome") else "right")
    for r in results:
        table.add_row(
            r.name,
            f"{r.statement_bytes:,}",
            r.outcome,
            f"{r.median_s:.3f}",
            f"{min(r.cpu_s):.3f}",
            f"{max(r.cpu_s):.3f}",
        )
    console.print(table)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"ddlparse-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine_info(),
                "rounds": args.rounds,
                "statements": [{**asdict(r), "median_s": r.median_s} for r in results],
            },
            indent=2,
        )
    )
    console.print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
