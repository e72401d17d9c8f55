"""Typed errors of the `hlc` package.

Every error derives from `HlcError` and declares a stable string `code` that outlives message
wording, so the daemon can map it onto the wire and clients can branch on it. Errors carry the
numbers that explain them as attributes (the remote timestamp, the local reading, the limit), so a
caller can act on them without parsing the message.

Errors about values a caller passed in (`TimestampRangeError`, `TimestampParseError`,
`InvalidArgumentError`) are also `ValueError`s, so generic input validation keeps working.
"""

from __future__ import annotations

from typing import Any, ClassVar


def _rebuild(cls: type[HlcError], fields: dict[str, Any]) -> HlcError:
    return cls(**fields)


class HlcError(Exception):
    """Base of every error raised by `hlc`."""

    code: ClassVar[str] = "hlc.error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        # Kept so the error survives pickling (e.g. across a process pool): the default
        # Exception pickling replays positional args, which our keyword-only __init__s refuse.
        self._fields = fields

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._fields))


class InvalidArgumentError(HlcError, ValueError):
    """A configuration value or argument outside its documented range (see `hlc.limits`)."""

    code: ClassVar[str] = "hlc.invalid_argument"

    def __init__(self, *, name: str, value: object, expected: str) -> None:
        super().__init__(
            f"{name}={value!r} is invalid: expected {expected}",
            name=name,
            value=value,
            expected=expected,
        )
        self.name = name
        self.value = value
        self.expected = expected


class TimestampRangeError(HlcError, ValueError):
    """A value that is not a representable HLC timestamp (or component of one)."""

    code: ClassVar[str] = "hlc.timestamp_range"

    def __init__(self, *, what: str, value: object, expected: str) -> None:
        super().__init__(
            f"{what} {value!r} is out of range: expected {expected}",
            what=what,
            value=value,
            expected=expected,
        )
        self.what = what
        self.value = value
        self.expected = expected


class PhysicalClockError(HlcError):
    """The injected physical clock returned a reading the encoding cannot hold.

    This is an operating error (a broken clock, an OffsetClock pushed before the epoch), not a
    caller's mistake, so it is not a ValueError.
    """

    code: ClassVar[str] = "hlc.physical_clock"

    def __init__(self, *, reading_ms: object, expected: str) -> None:
        super().__init__(
            f"physical clock returned {reading_ms!r}: expected {expected}",
            reading_ms=reading_ms,
            expected=expected,
        )
        self.reading_ms = reading_ms
        self.expected = expected


class ClockOffsetError(HlcError):
    """A remote timestamp is further ahead of our physical clock than the tolerated skew.

    Either the sender's clock or ours is wrong by more than `max_offset_ms`. The clock was not
    moved: absorbing the timestamp would drag this node (and everyone it talks to) into the
    future of a faulty clock.
    """

    code: ClassVar[str] = "hlc.clock_offset"

    def __init__(
        self, *, remote_ts: int, local_physical_ms: int, offset_ms: int, max_offset_ms: int
    ) -> None:
        super().__init__(
            f"remote timestamp {remote_ts} is {offset_ms} ms ahead of the local physical clock "
            f"({local_physical_ms} ms); at most {max_offset_ms} ms is tolerated",
            remote_ts=remote_ts,
            local_physical_ms=local_physical_ms,
            offset_ms=offset_ms,
            max_offset_ms=max_offset_ms,
        )
        self.remote_ts = remote_ts
        self.local_physical_ms = local_physical_ms
        self.offset_ms = offset_ms
        """How far the remote physical part is ahead of our physical clock."""
        self.max_offset_ms = max_offset_ms


class WaitTimeoutError(HlcError):
    """`HybridClock.wait_until` gave up before the physical clock reached the target."""

    code: ClassVar[str] = "hlc.wait_timeout"

    def __init__(self, *, target_ts: int, timeout_ms: int, physical_ms: int) -> None:
        super().__init__(
            f"timed out after {timeout_ms} ms waiting for timestamp {target_ts}; "
            f"the physical clock last read {physical_ms} ms",
            target_ts=target_ts,
            timeout_ms=timeout_ms,
            physical_ms=physical_ms,
        )
        self.target_ts = target_ts
        self.timeout_ms = timeout_ms
        self.physical_ms = physical_ms
        """The last physical reading, so the caller can see how far off the target was."""


class TimestampParseError(HlcError, ValueError):
    """`parse_ts` could not read the text; the message lists the accepted forms."""

    code: ClassVar[str] = "hlc.timestamp_parse"

    def __init__(self, *, text: str, reason: str, accepted: str) -> None:
        super().__init__(
            f"cannot read {text!r} as a timestamp: {reason}. Accepted: {accepted}",
            text=text,
            reason=reason,
            accepted=accepted,
        )
        self.text = text
        """The offending text, shortened if it was long (it may be echoed to a terminal)."""
        self.reason = reason
        self.accepted = accepted
