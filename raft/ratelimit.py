"""A budget for log lines that a remote party can trigger at will.

A peer (or a stranger) that sends bad frames in a loop would otherwise get one warning per
frame and fill the node's log, burying everything else. `LogBudget` is a token bucket: `burst`
lines at once, then `per_s` lines a second; the lines left out are counted, and the next line
logged says how many (as the daemon's audit log does for refused clients,
`metastore.daemon.audit`). The counters of what happened (`malformed`, `rejected`, ...) are
kept apart and count every event: the budget only decides what is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LogBudget:
    """Whether the next line of one kind (one peer's warnings, say) may be logged now."""

    __slots__ = ("_burst", "_left_out", "_monotonic", "_per_s", "_refilled_at", "_tokens")

    def __init__(
        self,
        *,
        burst: int,
        per_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or per_s <= 0:
            raise ValueError(f"a log budget needs burst >= 1 and per_s > 0, not {burst}, {per_s}")
        self._burst = float(burst)
        self._per_s = per_s
        self._monotonic = monotonic
        self._tokens = float(burst)
        self._refilled_at = monotonic()
        self._left_out = 0

    @property
    def left_out(self) -> int:
        """Lines left out since the last one logged."""
        return self._left_out

    def take(self) -> int | None:
        """None: do not log this line (it is counted). Otherwise log it, adding that the
        returned number of lines before it were left out (0: none)."""
        now = self._monotonic()
        elapsed_s = max(0.0, now - self._refilled_at)
        self._refilled_at = now
        self._tokens = min(self._burst, self._tokens + elapsed_s * self._per_s)
        if self._tokens < 1:
            self._left_out += 1
            return None
        self._tokens -= 1
        left_out, self._left_out = self._left_out, 0
        return left_out
