"""Clients that vanish mid-request stop nothing.

Found by a soak of clients that send a few requests and close their connection without reading
the replies: the server cancels a closed connection's requests, and a linearizable read
(`read_ts`, `committed_txn`: a ReadIndex on the leader) cancelled after it queued its Raft op
and before the driver ran it made the driver set a result on a cancelled future. That raised
InvalidStateError, a fatal error: the leader stopped (within seconds, at a few hundred
connections).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from raft.framing import encode_frame
from tests.daemon.harness import FRAME_MAX, metastore_cluster

pytestmark = pytest.mark.slow

# Connections that each send a hello, a write and a few linearizable reads, then close at once.
DROPPED_CONNECTIONS = 300
WRITES_PER_CONNECTION = 8
READS_PER_CONNECTION = 5


def _frame(request_id: int, op: str, **args: object) -> bytes:
    return encode_frame({"id": request_id, "op": op, "args": args}, max_frame_bytes=FRAME_MAX)


def _session(i: int) -> dict[str, object]:
    return {
        "session_id": f"vanishing-{i}",
        "app_id": "soak",
        "app_name": "soak",
        "host": "h",
        "user": "u",
        "pid": 1,
        "started_at_ms": 1,
        "ttl_ms": 1_000,
    }


def _fatal_records(directory: Path) -> list[str]:
    out = []
    for path in directory.glob("data/*/node.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("level") == "critical":
                    out.append(f"{path.name}: {record.get('msg', '')[:200]}")
    return out


def test_clients_that_close_during_linearizable_reads_do_not_stop_the_leader(
    tmp_path: Path,
) -> None:
    with metastore_cluster(tmp_path) as c:
        c.start_all()
        leader = c.wait_ready()
        token = c.token("writer")
        port = c.client_ports[leader]
        for i in range(DROPPED_CONNECTIONS):
            op = "read_ts" if i % 2 else "committed_txn"
            args = {} if op == "read_ts" else {"txn_id": f"gone-{i}"}
            # Writes first: the driver is then busy with their fsync (on the WAL thread, as
            # there are several) while the reads queue their ops behind it, and the close
            # cancels them before it runs them.
            writes = [
                _frame(100 + j, "session_open", **_session(i * WRITES_PER_CONNECTION + j))
                for j in range(WRITES_PER_CONNECTION)
            ]
            reads = [_frame(2 + j, op, **args) for j in range(READS_PER_CONNECTION)]
            requests = b"".join(writes + reads)
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
            except ConnectionRefusedError:
                break  # the leader stopped: its log says why (checked below)
            with s:
                s.sendall(_frame(1, "hello", token=token, client="vanishing") + requests)
        assert _fatal_records(tmp_path) == []
        client = c.client(leader)
        status = client.call("status")
        assert status["ok"], status
        assert status["result"]["stopped_reason"] == "", status["result"]
        assert client.call("read_ts")["ok"]
        client.close()
        assert all(p.poll() is None for p in c.procs.values()), c.log_tails()
