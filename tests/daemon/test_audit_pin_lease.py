"""A `pin` with `session_id` leases (docs/protocol.md lists it under the writer role), and every
request of an op that needs the writer role is audited, whatever its outcome. `pin` is a
reader op in the op table, so the audit skipped it: a writer's pins that leased (or failed to)
left no record, while the same leases through `lease_acquire` did. Stub node, nothing
started."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

from hlc import HybridClock, SystemClock
from metastore.daemon.audit import AuditLog
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from tests.metastore.test_manifests import ready


def _run(tmp_path: Path, args: dict[str, object]) -> list[dict[str, object]]:
    audit = AuditLog(tmp_path, node_id=1)
    api = ApiServer(
        node=SimpleNamespace(node_id=1, ready_to_serve=True),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *a: None),  # type: ignore[arg-type]
        cluster_id="ct",
        client_addresses={},
        audit=audit,
    )

    async def send(_frame: bytes) -> None:
        pass

    session = Session(peer="t", role=Role.WRITER, client="bridge")
    try:
        asyncio.run(api._run_request(session, {"id": 3, "op": "pin", "args": args}, send))
    finally:
        audit.close()
    path = tmp_path / "audit.log"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_pin_that_leases_is_audited(tmp_path: Path) -> None:
    # Refused before anything is leased (no tables): still a writer's request, so audited.
    records = _run(tmp_path, {"tables": [], "ts": 1, "session_id": "s-1"})
    assert [(r["op"], r["session_id"], r["role"]) for r in records] == [("pin", "s-1", "writer")]


def test_a_plain_pin_is_a_read_and_not_audited(tmp_path: Path) -> None:
    assert _run(tmp_path, {"tables": [], "ts": 1}) == []
