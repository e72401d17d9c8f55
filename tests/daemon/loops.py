"""Driving a worker's forever-loop in a unit test (no cluster)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

POLLS_MAX = 2_000  # of 1 ms each: a loop that needs longer than ~2 s is stuck anyway


async def assert_keeps_running(loop: Coroutine[Any, Any, Any], until: Callable[[], bool]) -> None:
    """Run `loop` until `until()` holds (bounded), assert it did not end (an error it let
    escape ends it, and shows here), then cancel it."""
    task = asyncio.create_task(loop)
    for _ in range(POLLS_MAX):
        if until() or task.done():
            break
        await asyncio.sleep(0.001)
    assert not task.done(), task.exception()
    assert until(), "the loop did not get that far in time"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
