"""How long an event loop went without a turn while some work ran, in CPU time (the stall
tests, through tests/loop_stall.py, and bench.bench_loop_stall).

A 1 ms ticker task records the most CPU time the process (every thread) spent between two of
its turns. CPU time, not wall time: a step that blocks the loop burns CPU for all its length,
while on a loaded machine the OS may leave the whole process unscheduled for longer than any
bound (0.30 s between two ticks at load 15 on 2 cores, 0.03 s of it CPU), which is no work of
the loop's. The process's CPU time, so a helper thread that holds the GIL counts too.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable
from types import TracebackType
from typing import Any

from metastore.daemon.collector import refreeze

# The ticker's period, and how long it runs before the work starts (its first turns).
TICK_S = 0.001
WARM_UP_S = 0.01


class LoopTurnWatch:
    """`async with LoopTurnWatch() as watch:` ...; then `watch.worst_s`."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._done = False
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.process_time()
        while not self._done:
            await asyncio.sleep(TICK_S)
            now = time.process_time()
            self.worst_s = max(self.worst_s, now - last)
            last = now

    async def __aenter__(self) -> LoopTurnWatch:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(WARM_UP_S)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done = True
        if self._task is not None:
            await self._task


async def worst_loop_turn_s(work: Awaitable[Any], *, freeze_heap: bool = False) -> float:
    """Run `work`; the most CPU time the loop went without a turn meanwhile.

    `freeze_heap`: freeze the heap first, as the node process keeps it
    (metastore.daemon.collector: `refreeze` after a restore or snapshot): else a full
    collection of the test worker's heap (its earlier tests' objects and this test's
    entries) may start inside the work and count as a stall of it (0.158 s once on CI; the
    work itself took ~0.02 s). Unfrozen again after."""
    if freeze_heap:
        refreeze()
    try:
        async with LoopTurnWatch() as watch:
            await work
    finally:
        if freeze_heap:
            gc.unfreeze()  # the rest of this worker's tests run with the collector as it was
    return watch.worst_s
