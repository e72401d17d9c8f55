"""Physical clocks, injected into `HybridClock` so that nothing else in `hlc` reads time.

`SystemClock` is the only place in the package that reads the machine's clock. Tests use
`ManualClock` (time moves only when told) and `OffsetClock` (a node whose clock is wrong by an
amount the test can change while the node runs), which makes clock skew and clocks stepping
backwards reproducible.

A physical clock may go backwards (NTP steps, `ManualClock.set`); `HybridClock` tolerates that.
It must return an int in [0, MAX_PHYSICAL_MS]; `HybridClock` refuses anything else with
`PhysicalClockError`.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from hlc._check import int_in_range
from hlc.limits import MAX_PHYSICAL_MS

__all__ = ["ManualClock", "OffsetClock", "PhysicalClock", "SystemClock"]


@runtime_checkable
class PhysicalClock(Protocol):
    """A source of wall-clock time in whole milliseconds since the Unix epoch."""

    def now_ms(self) -> int: ...


class SystemClock:
    """The machine's wall clock (not a monotonic clock: HLC timestamps must be comparable across
    nodes, which only the epoch-based clock is, approximately)."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to; for tests.

    The lock makes `advance` (a read-modify-write) safe when a test drives the clock from another
    thread, e.g. while the code under test runs in a PySpark callback thread.
    """

    __slots__ = ("_lock", "_now_ms")

    def __init__(self, start_ms: int) -> None:
        self._now_ms = int_in_range("start_ms", start_ms, 0, MAX_PHYSICAL_MS)
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> int:
        """Move forward by `ms` (>= 0) and return the new reading; use `set` to go backwards."""
        int_in_range("ms", ms, 0, MAX_PHYSICAL_MS)
        with self._lock:
            self._now_ms = int_in_range("now_ms + ms", self._now_ms + ms, 0, MAX_PHYSICAL_MS)
            return self._now_ms

    def set(self, ms: int) -> None:
        """Jump to `ms`, forwards or backwards (to simulate an NTP step)."""
        with self._lock:
            self._now_ms = int_in_range("ms", ms, 0, MAX_PHYSICAL_MS)

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"


class OffsetClock:
    """Another clock shifted by `offset_ms`, changeable at run time: a node whose clock is wrong.

    The shifted reading is not range-checked here (the offset may legitimately change while a
    reading is near the epoch); `HybridClock` refuses an out-of-range reading when it uses one.
    """

    __slots__ = ("_inner", "_offset_ms")

    def __init__(self, inner: PhysicalClock, offset_ms: int = 0) -> None:
        self._inner = inner
        self._offset_ms = int_in_range("offset_ms", offset_ms, -MAX_PHYSICAL_MS, MAX_PHYSICAL_MS)

    @property
    def inner(self) -> PhysicalClock:
        return self._inner

    @property
    def offset_ms(self) -> int:
        return self._offset_ms

    @offset_ms.setter
    def offset_ms(self, offset_ms: int) -> None:
        self._offset_ms = int_in_range("offset_ms", offset_ms, -MAX_PHYSICAL_MS, MAX_PHYSICAL_MS)

    def now_ms(self) -> int:
        return self._inner.now_ms() + self._offset_ms

    def __repr__(self) -> str:
        return f"OffsetClock({self._inner!r}, offset_ms={self._offset_ms})"
