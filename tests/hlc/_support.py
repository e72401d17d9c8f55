"""Shared helpers for the hlc tests: deterministic Hypothesis settings and a reference model."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings

from hlc import MAX_LOGICAL

# Derandomized so a run is reproducible (the suite must be deterministic); no example database so
# runs do not depend on what an earlier run stored. Applied per test, not as a global profile,
# so other packages' Hypothesis settings are left alone.
DETERMINISTIC = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(slots=True)
class ReferenceHlc:
    """The textbook HLC (Kulkarni et al. 2014, Fig. 5) on an explicit (l, c) pair.

    Written independently of the packed-integer implementation, with the overflow carry spelled
    out, so comparing the two checks that the packed `max(...)` forms are the classic rules.
    """

    l: int = 0  # noqa: E741 - the paper's name
    c: int = 0

    def _carry(self) -> None:
        if self.c > MAX_LOGICAL:
            self.l += 1
            self.c = 0

    def send(self, pt: int) -> tuple[int, int]:
        l_old = self.l
        self.l = max(l_old, pt)
        self.c = self.c + 1 if self.l == l_old else 0
        self._carry()
        return (self.l, self.c)

    def receive(self, pt: int, lm: int, cm: int) -> tuple[int, int]:
        l_old = self.l
        self.l = max(l_old, lm, pt)
        if self.l == l_old == lm:
            self.c = max(self.c, cm) + 1
        elif self.l == l_old:
            self.c += 1
        elif self.l == lm:
            self.c = cm + 1
        else:
            self.c = 0
        self._carry()
        return (self.l, self.c)
