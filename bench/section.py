"""What the sections of `make bench-catalog` beyond the read path share (bench_leases,
bench_gc): run a measurement against a fresh 3-node cluster, print its table, write its JSON.

A section supplies its parameters, a results dataclass, an async `measure(cluster)` and a rich
Table; this module does the cluster's lifetime, the failure report and the results document
(the same shape for every section: started/finished, command, machine, cluster, params,
complete, error, results, targets).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.bench_catalog import (
    CS_MAX_MS,
    DD_MS,
    NODE_IDS,
    TABLE_WIDTH_NON_TTY,
    Cluster,
    Connection,
    RequestFailedError,
    new_event_loop,
    percentile,
    progress,
)
from bench.machine import machine_info


def stats(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of what was observed (empty when nothing was)."""
    if not values:
        return {}
    return {"p50": percentile(values, 0.50), "p99": percentile(values, 0.99), "max": max(values)}


async def ok(conn: Connection, op: str, timeout_s: float = 30.0, **args: Any) -> dict[str, Any]:
    """The result of `op`, or RequestFailedError with the reply's error."""
    reply = await conn.call(op, timeout_s=timeout_s, **args)
    if not reply.get("ok"):
        raise RequestFailedError(f"{op}: {reply.get('error')}")
    result = reply["result"]
    assert isinstance(result, dict)
    return result


def value(v: float | None, spec: str = ",.1f") -> str:
    return "n/a" if v is None else format(v, spec)


def verdict(verdicts: dict[str, dict[str, Any]], key: str) -> str:
    met = verdicts[key]["met"]
    return f"{verdicts[key]['target']}: " + {True: "met", False: "MISSED", None: "n/a"}[met]


def measure_table(title: str) -> Table:
    t = Table(title=title)
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("target")
    return t


def run_on_cluster(
    prefix: str,
    measure: Callable[[Cluster], Coroutine[Any, Any, None]],
    settings: dict[str, int] | None = None,
) -> str | None:
    """Run `measure` against a fresh cluster in a temporary directory; always stop it. Returns
    why it failed, or None."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{prefix}-") as tmp:
        cluster = Cluster(Path(tmp), settings=settings)
        try:
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                runner.run(measure(cluster))
        except (RequestFailedError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            progress(f"FAILED: {error}")
            return error
        finally:
            cluster.stop_all()
    return None


def publish(
    *,
    name: str,
    argv: list[str],
    started: datetime,
    params: Any,
    results: Any,
    verdicts: dict[str, dict[str, Any]],
    table: Table,
    error: str | None,
    results_dir: Path,
    cluster_extra: dict[str, int] | None = None,
) -> int:
    """Write `<results_dir>/<name>-<time>.json`, then print the table (written first, so a
    closed pipe such as `| head` cannot lose the results); the exit status."""
    machine = machine_info()
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    document = {
        "started_utc": started.isoformat(),
        "finished_utc": datetime.now(UTC).isoformat(),
        "command": " ".join([f"python -m bench.bench_{name}", *argv]),
        "machine": {**machine, "loadavg_1_5_15_min_at_end": list(os.getloadavg())},
        "cluster": {
            "nodes": len(NODE_IDS),
            "dd_ms": DD_MS,
            "cs_max_ms": CS_MAX_MS,
            "fsync": True,
            **(cluster_extra or {}),
        },
        "params": asdict(params),
        "complete": error is None,
        "error": error,
        "results": asdict(results),
        "targets": verdicts,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    progress(f"results written to {path}")
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH_NON_TTY)
    console.print(table)
    return 0 if error is None else 1
