"""Every limit of the `hlc` package, named in one place.

A limit here is either a property of the timestamp encoding (the bit split) or a guard against a
misconfigured caller (a max offset of a day, a timeout meant in seconds passed as milliseconds, a
megabyte of text handed to the parser). Each one is enforced where it applies and breaking it
raises a typed error from `hlc.errors`, never a silent clamp.
"""

from typing import Final

# -- The encoding: one unsigned 64-bit integer, physical milliseconds above a logical counter. --

LOGICAL_BITS: Final = 16
"""Width of the logical counter: 65,536 events per millisecond before it carries."""

PHYSICAL_BITS: Final = 64 - LOGICAL_BITS
"""Width of the physical part: 2**48 ms after the Unix epoch reaches the year 10889."""

MAX_LOGICAL: Final = (1 << LOGICAL_BITS) - 1
MAX_PHYSICAL_MS: Final = (1 << PHYSICAL_BITS) - 1
MAX_TS: Final = (1 << 64) - 1

# -- The hybrid clock. --

DEFAULT_MAX_OFFSET_MS: Final = 500
"""CSmax from DESIGN.md §3 (Ignite's default): the largest clock skew we tolerate between nodes."""

MAX_OFFSET_MS_MAX: Final = 60_000
"""A tolerated skew above a minute means the cluster's clocks are not synchronised at all; we
refuse such a configuration instead of silently accepting timestamps from a wildly wrong node."""

# -- Waiting for a time to pass. --

WAIT_STEP_MS_MIN: Final = 1
"""Shortest sleep between two looks at the physical clock; the encoding's resolution."""

WAIT_STEP_MS_MAX: Final = 20
"""Longest sleep between two looks at the physical clock. Bounded so that a clock that jumps (an
NTP step, a test advancing a ManualClock from another task) is noticed within this long, and so
that a wait for a time far away still re-reads the clock rather than trusting one early reading."""

WAIT_TIMEOUT_MS_MAX: Final = 3_600_000
"""An hour. Nothing in the metastore waits for a time that far away (DDL waits DD + CSmax, about
a second); a larger timeout is almost certainly seconds passed where milliseconds were meant."""

# -- Parsing user-supplied timestamps. --

PARSE_TEXT_LEN_MAX: Final = 80
"""Longest text `parse_ts` looks at. The longest accepted form (an ISO time with nanoseconds, a
zone and a logical suffix) is under 50 characters; the cap keeps hostile input cheap to refuse."""
