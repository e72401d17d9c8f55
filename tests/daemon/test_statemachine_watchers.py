"""A long poll (`watch`) that times out cancels its wake-up future; the state machine used to
keep every such future until the next event was applied. On a quiet catalog (no DDL, commits
or sessions for hours) each watcher's 10 s polls piled up two dead futures per call, without
bound. Pure: no sockets, no processes."""

from __future__ import annotations

import asyncio

from metastore.commands import CreateNamespace, InitCluster, encode_command
from metastore.daemon.statemachine import CatalogStateMachine
from raft.core.types import Entry

TM = 1 << 40


def test_a_cancelled_wait_for_events_is_not_kept() -> None:
    async def main() -> None:
        sm = CatalogStateMachine()
        for _ in range(1000):  # long polls that timed out
            fut = sm.wait_for_events()
            fut.cancel()
        await asyncio.sleep(0)  # done callbacks run
        assert len(sm._event_waiters) == 0
        # A waiting watcher still wakes on the next event, and is not kept after it.
        woken = sm.wait_for_events()
        init = encode_command(InitCluster(dd_ms=500, cs_max_ms=100))
        sm.apply(Entry(term=1, index=1, tm=TM, data=init))
        ddl = encode_command(CreateNamespace(namespace="q"))
        sm.apply(Entry(term=1, index=2, tm=TM + 1, data=ddl))
        await asyncio.wait_for(woken, timeout=5)
        await asyncio.sleep(0)
        assert len(sm._event_waiters) == 0

    asyncio.run(main())
