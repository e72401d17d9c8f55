"""A `gc_run` whose client goes away runs to its end.

The server cancels a closed connection's requests. A GC run cancelled that way let go of the
GC's lock at once, while its deletion thread (a thread: nothing cancels it) went on unlinking a
chunk the run would never report; the next run could then take the lock and work on the same
queue beside it. ApiServer's handler against a fake leader and GC, no node started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from metastore.daemon.server import ApiServer, Session


class _Gc:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = asyncio.Event()

    async def run(self, table: object, *, dry_run: bool) -> dict[str, Any]:
        self.started.set()
        await asyncio.sleep(0.05)  # a deletion chunk, then its report
        self.finished.set()
        return {"tables": []}


def _api(gc: _Gc) -> ApiServer:
    node = SimpleNamespace(node_id=1, is_leader=lambda: True, ready_to_serve=True)
    return ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=None),  # type: ignore[arg-type]
        clock=None,  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *_a: None),  # type: ignore[arg-type]
        cluster_id="gc",
        client_addresses={},
        gc=gc,  # type: ignore[arg-type]
    )


def test_a_gc_run_whose_caller_went_away_is_not_cut_short() -> None:
    async def scenario() -> bool:
        gc = _Gc()
        api = _api(gc)
        api._require_ready = lambda: None  # type: ignore[method-assign]
        request = asyncio.create_task(api._gc_run(Session(peer="p"), {}))
        await asyncio.wait_for(gc.started.wait(), 5)
        request.cancel()  # its client closed the connection
        await asyncio.gather(request, return_exceptions=True)
        await asyncio.wait_for(gc.finished.wait(), 5)
        await api.stop()
        return gc.finished.is_set()

    assert asyncio.run(scenario())
