"""Argument checks shared by the modules of `hlc` (private)."""

from __future__ import annotations

from hlc.errors import InvalidArgumentError


def is_plain_int(value: object) -> bool:
    """An int that is not a bool: `True` where milliseconds are expected is a bug, not 1 ms."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_in_range(name: str, value: int, low: int, high: int, *, hint: str = "") -> int:
    """Return `value` if it is a plain int in [low, high], else raise InvalidArgumentError."""
    if not is_plain_int(value) or not low <= value <= high:
        expected = f"an int in [{low}, {high}]" + (f" ({hint})" if hint else "")
        raise InvalidArgumentError(name=name, value=value, expected=expected)
    return value
