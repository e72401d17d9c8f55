"""Hybrid logical clock (HLC): the metastore's notion of time.

Key idea. Every replicated command carries Tm, a timestamp stamped by the Raft leader, and every
question ("the schema of T at Top") is asked at a timestamp. A timestamp must therefore (a) order
events consistently with causality across nodes, and (b) stay close to wall-clock time, so a user
can say "as of 10:00" and a node can answer without asking anyone. An HLC does both: it is the
physical clock's millisecond, bumped by a logical counter whenever causality demands a later value
than the physical clock alone gives.

Jargon.
* timestamp: one unsigned 64-bit int, `physical_ms << 16 | logical` (`hlc.timestamp`). Integer
  order is HLC order; `ts + 1` is the next timestamp. When the 16-bit counter would overflow, the
  physical part advances by 1 ms and the counter resets: the encoding stays 64-bit and totally
  ordered, at the price of running briefly ahead of the wall clock under extreme load.
* physical clock: an injected `PhysicalClock` (`SystemClock` in production; `ManualClock` and
  `OffsetClock` in tests). Nothing in this package reads time any other way.
* max offset (CSmax, default 500 ms): the clock skew we tolerate. `update()` refuses a remote
  timestamp further ahead of our physical clock than that, with `ClockOffsetError`, and does not
  move the clock.

Invariants.
* `HybridClock.now()`, `update()` and `observe()` return values strictly greater than anything the
  clock returned or absorbed before, whatever the physical clock does (including going back).
* A refused `update()` changes nothing.
* `HybridClock.wait_until(ts)` returns only once the *physical* clock has reached `ts` (a clock
  pushed ahead by a peer does not count), and afterwards every `now()` is >= `ts`.
* All limits (encoding widths, max offset bounds, wait steps and timeout, parser input length)
  live in `hlc.limits`; breaking one raises a typed `HlcError` carrying a stable `code`.

Display: `to_iso(ts)` prints `2026-11-22T10:00:00.123Z+5`; `parse_ts(text, now_ms=...)` reads that,
other ISO-8601 times, plain integers, `-5m`-style relative times and `now`.
"""

from hlc.clock import HybridClock
from hlc.display import (
    ACCEPTED_FORMS,
    from_datetime,
    parse_ts,
    span_text,
    to_datetime,
    to_iso,
    ts_text,
)
from hlc.errors import (
    ClockOffsetError,
    HlcError,
    InvalidArgumentError,
    PhysicalClockError,
    TimestampParseError,
    TimestampRangeError,
    WaitTimeoutError,
)
from hlc.limits import DEFAULT_MAX_OFFSET_MS, MAX_LOGICAL, MAX_PHYSICAL_MS, MAX_TS
from hlc.physical import ManualClock, OffsetClock, PhysicalClock, SystemClock
from hlc.timestamp import check_ts, logical, make_ts, physical_ms, successor

__all__ = [
    "ACCEPTED_FORMS",
    "DEFAULT_MAX_OFFSET_MS",
    "MAX_LOGICAL",
    "MAX_PHYSICAL_MS",
    "MAX_TS",
    "ClockOffsetError",
    "HlcError",
    "HybridClock",
    "InvalidArgumentError",
    "ManualClock",
    "OffsetClock",
    "PhysicalClock",
    "PhysicalClockError",
    "SystemClock",
    "TimestampParseError",
    "TimestampRangeError",
    "WaitTimeoutError",
    "check_ts",
    "from_datetime",
    "logical",
    "make_ts",
    "parse_ts",
    "physical_ms",
    "span_text",
    "successor",
    "to_datetime",
    "to_iso",
    "ts_text",
]
