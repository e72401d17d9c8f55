"""`metastore cluster status` says, in its error column, when a node cannot save its own
snapshot: the node still serves (ready), so nothing else in the row would show it."""

from __future__ import annotations

import io

from rich.console import Console

from cli.cluster import _status_table
from metastore.client.protocol import EndpointResult


def _rendered(status: dict[str, object]) -> str:
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(
        _status_table([EndpointResult(endpoint="127.0.0.1:1", result=status)])
    )
    return out.getvalue()


def test_the_error_column_names_a_failed_snapshot_save() -> None:
    status = {"node_id": 1, "role": "follower", "ready": True, "leader": 2}
    assert "snapshot not saved" not in _rendered({**status, "snapshot_save_error": ""})
    text = _rendered({**status, "snapshot_save_error": "cannot save snapshot X: ENOSPC"})
    assert "snapshot not saved (serving from its log): cannot save snapshot X: ENOSPC" in text
