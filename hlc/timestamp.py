"""The timestamp encoding: one unsigned 64-bit integer, `physical_ms << 16 | logical`.

Key idea: packing the wall-clock millisecond above a 16-bit logical counter makes ordinary integer
comparison the HLC order (first by physical time, then by the counter), makes a timestamp cheap to
store, send (msgpack uint64) and compare, and makes "the next timestamp" simply `ts + 1`.

Logical overflow: when the counter is at `MAX_LOGICAL`, `ts + 1` carries into the physical part,
i.e. the clock advances its physical component by 1 ms and resets the counter to 0. We do this
rather than widen the counter (the encoding would stop being 64 bits) or refuse to tick (a busy
node would stall): the result is still strictly greater than everything before it, so the order
stays total, at the cost of the HLC running up to a millisecond ahead of the wall clock per
65,536 events issued within one millisecond. It catches up as soon as real time passes.

Invariants: every timestamp is an int in [0, MAX_TS]; every (physical_ms, logical) pair with
physical_ms in [0, MAX_PHYSICAL_MS] and logical in [0, MAX_LOGICAL] has exactly one timestamp,
and `make_ts` / `physical_ms` / `logical` are mutual inverses.
"""

from __future__ import annotations

from hlc._check import is_plain_int
from hlc.errors import TimestampRangeError
from hlc.limits import LOGICAL_BITS, MAX_LOGICAL, MAX_PHYSICAL_MS, MAX_TS

__all__ = ["check_ts", "logical", "make_ts", "physical_ms", "successor"]


def check_ts(ts: int, *, what: str = "timestamp") -> int:
    """Return `ts` if it is a valid 64-bit HLC timestamp, else raise TimestampRangeError."""
    # `type(x) is int` first: the common case costs no call (is_plain_int is the full test).
    if (type(ts) is not int and not is_plain_int(ts)) or not 0 <= ts <= MAX_TS:
        raise TimestampRangeError(what=what, value=ts, expected=f"an int in [0, {MAX_TS}]")
    return ts


def make_ts(physical_ms: int, logical: int = 0) -> int:
    """Pack milliseconds since the Unix epoch and a logical counter into one timestamp."""
    if (
        type(physical_ms) is not int and not is_plain_int(physical_ms)
    ) or not 0 <= physical_ms <= MAX_PHYSICAL_MS:
        raise TimestampRangeError(
            what="physical_ms", value=physical_ms, expected=f"an int in [0, {MAX_PHYSICAL_MS}]"
        )
    if (type(logical) is not int and not is_plain_int(logical)) or not 0 <= logical <= MAX_LOGICAL:
        raise TimestampRangeError(
            what="logical", value=logical, expected=f"an int in [0, {MAX_LOGICAL}]"
        )
    return physical_ms << LOGICAL_BITS | logical


def physical_ms(ts: int) -> int:
    """The physical part of `ts`: milliseconds since the Unix epoch."""
    return check_ts(ts) >> LOGICAL_BITS


def logical(ts: int) -> int:
    """The logical counter of `ts`."""
    return check_ts(ts) & MAX_LOGICAL


def successor(ts: int) -> int:
    """The smallest timestamp greater than `ts`; carries logical overflow into the physical ms.

    Raises TimestampRangeError past MAX_TS (the year 10889), rather than wrapping to 0.
    """
    check_ts(ts)
    if ts == MAX_TS:
        raise TimestampRangeError(
            what="successor of timestamp", value=ts + 1, expected=f"at most {MAX_TS}"
        )
    return ts + 1
