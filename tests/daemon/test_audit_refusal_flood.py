"""A flood of refusals cannot rotate the audit log's history away.

The audit log keeps AUDIT_FILES_KEPT files of AUDIT_FILE_BYTES_MAX each, and every refused
hello is a record: a stranger without any token, or a reader asking for writes, could fill
them with refusals until the records of real changes were rotated out. Refusals (a refused
first request, FORBIDDEN) are recorded at most AUDIT_REFUSALS_BURST at once and
AUDIT_REFUSALS_PER_S after that; the ones left out are counted in a `refusals_not_recorded`
record written before the next record (or at close). Everything else is always recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from metastore.daemon.audit import (
    AUDIT_FILE_NAME,
    AUDIT_REFUSALS_BURST,
    AUDIT_REFUSALS_PER_S,
    AuditLog,
)

FLOOD = 5 * AUDIT_REFUSALS_BURST


def _records(data_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data_dir / AUDIT_FILE_NAME).read_text().splitlines()]


def _refused_hello(audit: AuditLog, n: int) -> None:
    audit.record(
        peer=f"('10.0.0.9', {n})",
        client="intruder",
        role=None,
        token_name=None,
        op="hello",
        args={},
        outcome="UNAUTHENTICATED",
        ms=0.1,
    )


def test_refusals_are_bounded_and_counted_and_writes_always_recorded(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path, node_id=1)
    started = time.monotonic()
    for n in range(FLOOD):
        _refused_hello(audit, n)
    for n in range(FLOOD):
        audit.record(
            peer="p",
            client="dashboard",
            role="reader",
            token_name="reader",
            op="ddl",
            args={"sql": f"DROP TABLE t{n}"},
            outcome="FORBIDDEN",
            ms=0.1,
        )
    elapsed_s = time.monotonic() - started
    audit.record(
        peer="p",
        client="etl",
        role="writer",
        token_name="writer",
        op="ddl",
        args={"sql": "CREATE NAMESPACE kept"},
        outcome="OK",
        ms=1.0,
    )
    audit.close()
    records = _records(tmp_path)
    refusals = [r for r in records if r["outcome"] in {"UNAUTHENTICATED", "FORBIDDEN"}]
    allowed = AUDIT_REFUSALS_BURST + AUDIT_REFUSALS_PER_S * elapsed_s + 1
    assert len(refusals) <= allowed, (len(refusals), allowed)
    assert len(refusals) >= AUDIT_REFUSALS_BURST
    not_recorded = [r for r in records if r["op"] == "refusals_not_recorded"]
    assert sum(r["count"] for r in not_recorded) == 2 * FLOOD - len(refusals)
    # The write is there, after the count of what was left out before it.
    assert records[-1]["sql"] == "CREATE NAMESPACE kept"
    assert records[-2]["op"] == "refusals_not_recorded"
