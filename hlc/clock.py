"""`HybridClock`: a hybrid logical clock over an injected physical clock.

Key idea (Kulkarni et al., "Logical Physical Clocks", as used by CockroachDB): a timestamp is the
physical wall-clock millisecond plus a logical counter. Issuing a timestamp takes the larger of
"the physical clock now" and "one more than anything seen before"; receiving one from a peer
first pulls our clock up to it. So timestamps follow causality (a reply is always stamped later
than its request) while staying within the clock skew of real time, which lets any node turn a
wall-clock question ("the schema at 10:00") into a timestamp without asking anyone.

In the packed encoding (see `hlc.timestamp`) the classic rules collapse to integer maxima:

    now()          = max(last + 1, physical << 16)
    update(remote) = max(last + 1, remote + 1, physical << 16)

Invariants:
* `last()` never decreases, and `now()` / `update()` / `observe()` return a value strictly greater
  than every value this clock returned or absorbed before, even if the physical clock goes back.
* `update()` never moves the clock when it raises: a remote timestamp more than `max_offset_ms`
  ahead of our physical clock is refused (CockroachDB's rule, DESIGN.md §3), so one node with a
  bad clock cannot drag the cluster into its future.
* The clock reads time only through the injected `PhysicalClock`; `wait_until` sleeps with
  `asyncio.sleep` and measures its timeout as the sum of those sleeps, never by reading a clock.

Concurrency: the synchronous methods hold a `threading.Lock` around their read-modify-write.
Within one asyncio loop that is not needed (they never await), but the Spark bridge calls its
clock from PySpark callback threads (foreachBatch runs on a py4j thread), and an uncontended lock
costs well under a microsecond. `wait_until` holds no lock while it sleeps.
"""

from __future__ import annotations

import asyncio
import threading

from hlc._check import int_in_range, is_plain_int
from hlc.errors import ClockOffsetError, PhysicalClockError, WaitTimeoutError
from hlc.limits import (
    DEFAULT_MAX_OFFSET_MS,
    LOGICAL_BITS,
    MAX_OFFSET_MS_MAX,
    MAX_PHYSICAL_MS,
    WAIT_STEP_MS_MAX,
    WAIT_STEP_MS_MIN,
    WAIT_TIMEOUT_MS_MAX,
)
from hlc.physical import PhysicalClock
from hlc.timestamp import check_ts, make_ts, physical_ms, successor

__all__ = ["HybridClock"]


class HybridClock:
    """A hybrid logical clock; see the module docstring for the rules and invariants."""

    __slots__ = ("_last", "_lock", "_max_offset_ms", "_physical")

    def __init__(self, physical: PhysicalClock, max_offset_ms: int = DEFAULT_MAX_OFFSET_MS) -> None:
        int_in_range(
            "max_offset_ms", max_offset_ms, 0, MAX_OFFSET_MS_MAX, hint="limits.MAX_OFFSET_MS_MAX"
        )
        self._physical = physical
        self._max_offset_ms = max_offset_ms
        # Invariant: _last is the greatest timestamp returned or absorbed so far (0 initially:
        # the first now() is then governed by the physical clock alone).
        self._last = 0
        self._lock = threading.Lock()

    @property
    def max_offset_ms(self) -> int:
        """The largest lead of a remote timestamp over our physical clock that update() accepts."""
        return self._max_offset_ms

    def tighten_max_offset(self, max_offset_ms: int) -> None:
        """Lower the accepted offset to `max_offset_ms`; a larger value changes nothing (a
        node learns the cluster's CSmax after it started with its config file's, and must
        refuse by the smaller of the two)."""
        int_in_range(
            "max_offset_ms", max_offset_ms, 0, MAX_OFFSET_MS_MAX, hint="limits.MAX_OFFSET_MS_MAX"
        )
        with self._lock:
            self._max_offset_ms = min(self._max_offset_ms, max_offset_ms)

    @property
    def physical(self) -> PhysicalClock:
        return self._physical

    def physical_now_ms(self) -> int:
        """Read the injected physical clock, refusing readings the encoding cannot hold."""
        reading = self._physical.now_ms()
        if (
            type(reading) is not int and not is_plain_int(reading)
        ) or not 0 <= reading <= MAX_PHYSICAL_MS:
            raise PhysicalClockError(
                reading_ms=reading, expected=f"an int in [0, {MAX_PHYSICAL_MS}]"
            )
        return reading

    def last(self) -> int:
        """The latest timestamp returned or absorbed, without ticking (0 before the first)."""
        return self._last

    def now(self) -> int:
        """A fresh timestamp, strictly greater than every one returned or absorbed before."""
        with self._lock:
            wall = make_ts(self.physical_now_ms())
            self._last = max(successor(self._last), wall)
            return self._last

    def update(self, remote_ts: int) -> int:
        """Absorb a peer's timestamp and return a fresh one greater than it and than `last()`.

        Raises ClockOffsetError, leaving the clock untouched, if the remote physical part is more
        than `max_offset_ms` ahead of our physical clock.
        """
        check_ts(remote_ts, what="remote_ts")
        with self._lock:
            local_ms = self.physical_now_ms()
            offset_ms = physical_ms(remote_ts) - local_ms
            if offset_ms > self._max_offset_ms:
                raise ClockOffsetError(
                    remote_ts=remote_ts,
                    local_physical_ms=local_ms,
                    offset_ms=offset_ms,
                    max_offset_ms=self._max_offset_ms,
                )
            return self._absorb(remote_ts, local_ms)

    def observe(self, remote_ts: int) -> int:
        """Like `update` without the offset check, for timestamps we trust (entries of our own
        replicated log, a persisted safe time after restart). Never raises ClockOffsetError; still
        refuses a value that is not a timestamp at all (TimestampRangeError: a caller's bug)."""
        check_ts(remote_ts, what="remote_ts")
        with self._lock:
            return self._absorb(remote_ts, self.physical_now_ms())

    def _absorb(self, remote_ts: int, local_ms: int) -> int:
        # Caller holds the lock. The classic HLC receive rule, in packed form.
        self._last = max(successor(max(self._last, remote_ts)), make_ts(local_ms))
        return self._last

    async def wait_until(self, ts: int, *, timeout_ms: int, anchored_ms: int | None = None) -> None:
        """Return once the physical clock has reached `ts`; raise WaitTimeoutError past timeout.

        "Reached" is judged by the physical clock alone: `physical << 16 >= ts`. A clock that was
        merely pushed ahead by a remote timestamp does not count, because callers wait precisely
        for real time to pass (e.g. a DDL waits until Tu + CSmax so every node's clock is past Tu).
        A `ts` with a non-zero logical part therefore needs the next physical millisecond.

        On return the clock has absorbed `ts - 1`, so every later `now()` is >= `ts` even if the
        physical clock then steps backwards. That absorbs no future: the physical clock is at or
        past `ts` already.

        Between looks at the physical clock it sleeps the remaining milliseconds, but never more
        than WAIT_STEP_MS_MAX, so a clock that jumps (or a ManualClock advanced by another task)
        is noticed promptly and a ManualClock that never moves costs a few wake-ups, not a spin.
        `timeout_ms` is the total sleeping allowed (the loop's timer does the sleeping; we read no
        clock but the injected one); a loaded event loop can stretch it in real time.

        `anchored_ms`: the physical clock's reading when the caller's request began, moved on
        by the real time since then as the caller measured it on a clock that never steps
        (monotonic). The wait then also lasts until that estimate, moved on by the time slept
        here, reaches `ts`: a wall clock stepped forward during the request (an NTP step, a
        fault) cannot cut the wait short. The sum of sleeps is at most the real time they
        took, so the estimate never runs ahead of the clock the request began with. (A clock
        that was already wrong when the request began is not caught here: its node fences
        itself once its peers' heartbeats prove the offset.)
        """
        check_ts(ts, what="ts")
        int_in_range(
            "timeout_ms", timeout_ms, 0, WAIT_TIMEOUT_MS_MAX, hint="limits.WAIT_TIMEOUT_MS_MAX"
        )
        if anchored_ms is not None:
            int_in_range("anchored_ms", anchored_ms, 0, MAX_PHYSICAL_MS)
        slept_ms = 0
        while True:
            wall_ms = self.physical_now_ms()
            if anchored_ms is not None:
                # The smaller of the two readings: a step forward of the wall clock counts for
                # nothing, a step back makes the wait longer (as without an anchor).
                wall_ms = min(wall_ms, anchored_ms + slept_ms)
            wall = make_ts(wall_ms)
            if wall >= ts:
                if ts > 0:
                    self.observe(ts - 1)
                return
            budget_ms = timeout_ms - slept_ms
            if budget_ms <= 0:
                raise WaitTimeoutError(target_ts=ts, timeout_ms=timeout_ms, physical_ms=wall_ms)
            # Whole milliseconds until physical << 16 >= ts, rounded up.
            remaining_ms = (ts - wall + (1 << LOGICAL_BITS) - 1) >> LOGICAL_BITS
            step_ms = max(WAIT_STEP_MS_MIN, min(remaining_ms, WAIT_STEP_MS_MAX, budget_ms))
            await asyncio.sleep(step_ms / 1000)
            slept_ms += step_ms
