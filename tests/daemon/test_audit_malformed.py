"""The audit record of a malformed write request (metastore.daemon.audit.summarize_args): a
`writes` item whose `add` or `remove` is not a list (an int, a bool, a map) made the summary
raise TypeError after the handler had already refused the request, so the request task died
and the client never got its typed error (it waited out its whole timeout). Stub node,
nothing started. The same for a table "name" nested about 1,000 levels deep (its str() raised
RecursionError)."""

from __future__ import annotations

import asyncio
import json
import reprlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon.audit import AuditLog, summarize_args
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from raft.framing import NEED_DATA, FrameDecoder
from tests.metastore.test_manifests import ready


def _nested(depth: int, *, as_map: bool) -> Any:
    """A list (or map) `depth` levels deep: the wire decodes nesting up to about 1,000 levels,
    as deep as Python's recursion limit, so str() or repr() of it raises RecursionError."""
    value: Any = {} if as_map else []
    for _ in range(depth):
        value = {"a": value} if as_map else [value]
    return value


BAD_WRITES: list[Any] = [
    [{"table": "a.t", "schema_version": 1, "add": 5}],
    [{"table": "a.t", "schema_version": 1, "remove": True}],
    [{"table": "a.t", "schema_version": 1, "add": [{"path": "x"}], "remove": 7}],
    [{"table": ["a", "t"], "schema_version": 1, "add": {"path": "x"}}],
    [{"table": _nested(1_000, as_map=False), "schema_version": 1}],
    [{"table": _nested(1_000, as_map=True), "schema_version": 1}],
]


def _case_id(writes: list[Any]) -> str:
    return reprlib.repr(writes)


@pytest.mark.parametrize("writes", BAD_WRITES, ids=_case_id)
def test_a_summary_of_malformed_writes_never_raises(writes: list[Any]) -> None:
    summary = summarize_args({"txn_id": "t1", "writes": writes})
    json.dumps(summary)
    assert summary["txn_id"] == "t1"


def test_a_long_table_name_in_writes_is_bounded() -> None:
    summary = summarize_args({"writes": [{"table": "x" * 100_000, "add": []}]})
    assert all(len(k) <= 1024 for k in summary["writes"])


@pytest.mark.parametrize("writes", BAD_WRITES, ids=_case_id)
def test_a_malformed_commit_is_answered_and_audited(tmp_path: Path, writes: list[Any]) -> None:
    node = SimpleNamespace(node_id=1, ready_to_serve=True, is_leader=lambda: True)
    audit = AuditLog(tmp_path, node_id=1)
    api = ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *a: None),  # type: ignore[arg-type]
        cluster_id="ct",
        client_addresses={},
        audit=audit,
    )
    sent: list[bytes] = []

    async def send(frame: bytes) -> None:
        sent.append(frame)

    session = Session(peer="t", role=Role.WRITER, client="etl")
    frame = {"id": 7, "op": "commit", "args": {"txn_id": "t1", "writes": writes}}
    try:
        asyncio.run(asyncio.wait_for(api._run_request(session, frame, send), 5))
    finally:
        audit.close()
    assert len(sent) == 1, "the request got no reply"
    decoder = FrameDecoder(max_frame_bytes=1 << 22)
    decoder.feed(sent[0])
    reply = decoder.next_frame()
    assert reply is not NEED_DATA and isinstance(reply, dict)
    assert reply["id"] == 7 and reply["ok"] is False
    assert reply["error"]["code"] != "INTERNAL", reply["error"]
    [record] = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert (record["op"], record["txn_id"], record["outcome"]) == (
        "commit",
        "t1",
        reply["error"]["code"],
    )


def test_a_request_whose_audit_record_fails_is_still_answered(tmp_path: Path) -> None:
    # Whatever goes wrong while counting or recording a request (a bug like the two above),
    # its reply is still sent: the change may have happened, and a client without an answer
    # waits out its timeout and retries. The failure is logged instead.
    node = SimpleNamespace(node_id=1, ready_to_serve=True, is_leader=lambda: True)

    def broken_record(**_kw: Any) -> bool:
        raise RuntimeError("audit broke")

    api = ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *a: None),  # type: ignore[arg-type]
        cluster_id="ct",
        client_addresses={},
        audit=SimpleNamespace(record=broken_record),  # type: ignore[arg-type]
    )
    sent: list[bytes] = []

    async def send(frame: bytes) -> None:
        sent.append(frame)

    session = Session(peer="t", role=Role.WRITER, client="etl")
    frame = {"id": 9, "op": "commit", "args": {"txn_id": "t1", "writes": 5}}
    asyncio.run(asyncio.wait_for(api._run_request(session, frame, send), 5))
    assert len(sent) == 1, "the request got no reply"
    decoder = FrameDecoder(max_frame_bytes=1 << 22)
    decoder.feed(sent[0])
    reply = decoder.next_frame()
    assert isinstance(reply, dict) and reply["id"] == 9
    assert reply["error"]["code"] == "INVALID_ARGUMENT", reply["error"]
