"""Every refused `hello` is written to audit.log (docs/protocol.md), but only a wrong or
missing token was: a hello refused for a plaintext connection to a TLS port, for a missing
client certificate or for a revoked one - the refusals an intrusion shows as - and a first
request that was not `hello` left nothing there (only a line in the operational log). Stub
node, nothing started."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon.audit import AuditLog
from metastore.daemon.server import ApiServer, Session
from tests.metastore.test_manifests import ready

FP = "ab" * 32


def _refused(
    tmp_path: Path, session: Session, op: str, frame: object = None, **kwargs: Any
) -> list[dict[str, Any]]:
    state = ready().state
    state.revoked.revoke((FP,), node_id=0, reason="operator", tm=0, by="t")
    audit = AuditLog(tmp_path, node_id=1)
    api = ApiServer(
        node=SimpleNamespace(node_id=1),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *a: None),  # type: ignore[arg-type]
        cluster_id="ct",
        client_addresses={},
        audit=audit,
        **kwargs,
    )
    if frame is None:
        frame = {"id": 1, "op": op, "args": {"token": "x" * 40, "client": "intruder"}}
    try:
        _, ok = asyncio.run(api._first_request(session, frame))
    finally:
        audit.close()
    assert not ok
    path = tmp_path / "audit.log"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    assert all("x" * 40 not in json.dumps(r) for r in records)  # never the token
    return records


@pytest.mark.parametrize(
    ("session", "kwargs", "outcome"),
    [
        (Session(peer="p"), {"tls": object()}, "TLS_REQUIRED"),
        (
            Session(peer="p", tls=True),
            {"tls": object(), "tls_client_cert_required": True},
            "TLS_REQUIRED",
        ),
        (
            Session(peer="p", tls=True, client_cert=True, cert_fingerprint=FP),
            {"tls": object(), "tls_client_cert_required": True},
            "CERT_REVOKED",
        ),
    ],
    ids=["plaintext", "no-client-cert", "revoked-cert"],
)
def test_a_hello_refused_for_tls_is_audited(
    tmp_path: Path, session: Session, kwargs: dict[str, Any], outcome: str
) -> None:
    [record] = _refused(tmp_path, session, "hello", **kwargs)
    assert (record["op"], record["client"], record["outcome"]) == ("hello", "intruder", outcome)
    if outcome == "CERT_REVOKED":
        assert record["fingerprint"] == FP


def test_a_first_request_that_is_not_hello_is_audited(tmp_path: Path) -> None:
    [record] = _refused(tmp_path, Session(peer="p"), "gc_run")
    assert (record["op"], record["outcome"]) == ("gc_run", "UNAUTHENTICATED")


def test_a_malformed_first_request_is_audited(tmp_path: Path) -> None:
    [record] = _refused(tmp_path, Session(peer="p"), "", frame=["hello", "x" * 40])
    assert (record["op"], record["outcome"]) == ("invalid", "BAD_REQUEST")
