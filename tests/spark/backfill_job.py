"""What the fake-client backfill tests share: an ADD COLUMN job at its backfill step.

`tests/spark/test_backfill_*.py` drive `spark_bridge.backfill.run_backfill` with a fake bridge
and client (no Spark); they all need the same job view and the column it adds."""

from __future__ import annotations

from typing import Any

JOB_ID = 7
FIELD_ID = 3
TS = 117_000_000_000_000_000
COLUMN_C = {"field_id": FIELD_ID, "name": "c", "type": "INT", "nullable": True}


def job_at_backfill(backfill_ts: int | None = None) -> dict[str, Any]:
    """`job_show`'s view of job JOB_ID adding `c`, running at step `backfill`; `backfill_ts`:
    the snapshot ts of the report it accepted (None: none yet)."""
    return {
        "job_id": JOB_ID,
        "table": "ns.t",
        "kind": "add_column",
        "column": "c",
        "field_id": FIELD_ID,
        "status": "running",
        "step": "backfill",
        "backfill_from_ts": 1,
        "backfill_ts": backfill_ts,
        "cancel_requested": False,
        "waiting_for": None,
    }
