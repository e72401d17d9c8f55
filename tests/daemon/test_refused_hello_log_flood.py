"""A flood of refused hellos cannot flood the operational log either (stub node).

Each refused first request logged a warning to node.log (and stderr): a stranger without any
token could write as fast as it could connect, rotating the node's own diagnostics away.
Those warnings now share the audit log's budget for refusals (AUDIT_REFUSALS_BURST at once,
AUDIT_REFUSALS_PER_S after), and the next warning logged says how many were left out."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon.audit import AUDIT_REFUSALS_BURST, AUDIT_REFUSALS_PER_S, AuditLog
from metastore.daemon.metrics import NodeMetrics
from metastore.daemon.secrets import Role, Secrets, TokenRecord, hash_token
from metastore.daemon.server import ApiServer, Session
from tests.metastore.test_manifests import ready

FLOOD = 5 * AUDIT_REFUSALS_BURST


def test_refused_hello_warnings_are_bounded_and_the_rest_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secrets = Secrets(
        secrets_dir=tmp_path,
        cluster_secret=b"x" * 32,
        tokens=(TokenRecord(name="admin", role=Role.ADMIN, sha256=hash_token("a" * 43)),),
    )
    api = ApiServer(
        node=SimpleNamespace(node_id=1, ready_to_serve=True),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=secrets,
        forwarder=None,  # type: ignore[arg-type]
        metrics=NodeMetrics(1),
        cluster_id="ct",
        client_addresses={},
        audit=AuditLog(tmp_path / "audit", node_id=1),
    )

    async def flood() -> None:
        for n in range(FLOOD):
            hello = {"id": 1, "op": "hello", "args": {"token": f"wrong-token-{n:08d}"}}
            _, ok = await api._first_request(Session(peer=f"p{n}"), hello)
            assert not ok

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="metastore.api"):
        asyncio.run(flood())
    elapsed_s = time.monotonic() - started
    warnings = [r.getMessage() for r in caplog.records if r.name == "metastore.api"]
    assert len(warnings) >= AUDIT_REFUSALS_BURST
    assert len(warnings) <= AUDIT_REFUSALS_BURST + AUDIT_REFUSALS_PER_S * elapsed_s + 1
    assert not any("wrong-token" in w for w in warnings), "a token's value in the log"
