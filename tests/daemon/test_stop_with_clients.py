"""A node stopped while clients are connected logs no error.

Found by `make upgrade-check`: every node stop of a rolling upgrade (SIGTERM) or of `cluster
down` (SIGINT) with a client connected wrote, per connection, an error-level record with a
traceback ("Exception in callback ... StreamReaderProtocol.connection_made ... CancelledError"):
the server cancels its connection tasks on stop, and asyncio's streams call `task.exception()`
on the cancelled task in their done callback, which raises. An operator reads an error per
Spark driver at every planned restart.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.daemon.harness import RawClient, metastore_cluster

pytestmark = pytest.mark.slow


def _problems(directory: Path) -> list[str]:
    """The error-level (and worse) records of every log the node wrote, by message."""
    out = []
    for path in [*directory.glob("stdout-*.log"), *directory.glob("data/*/node.log")]:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("level") in ("error", "critical"):
                    out.append(f"{path.name}: {record.get('msg', '')[:200]}")
    return out


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_node_stopped_with_clients_connected_logs_no_error(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    with metastore_cluster(tmp_path, n=1) as c:
        c.start_all()
        c.wait_ready()
        authenticated = c.client(1)
        assert authenticated.call("status")["ok"]
        stranger = RawClient(c.client_ports[1])  # connected, no hello yet
        proc = c.procs.pop(1)
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=15) == 0
        authenticated.close()
        stranger.close()
    assert _problems(tmp_path) == []
