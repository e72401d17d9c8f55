"""The timestamp `spark.read.format("metastore")` pins when no `as_of` is given: now, or the
leader's `read_ts` when a commit acknowledged before the read is stamped above the driver's
clock (a commit may land up to DD above the leader's clock)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hlc.limits import LOGICAL_BITS
from metastore.errors import UnknownOpError
from spark_bridge.datasource import _resolve_ts

NOW_MS = 1_800_000_000_000


@dataclass
class _Clock:
    def now(self) -> int:
        return NOW_MS << LOGICAL_BITS

    def physical_now_ms(self) -> int:
        return NOW_MS


@dataclass
class _Client:
    acknowledged_ts: int | None  # None: a node of a release without read_ts
    clock: _Clock = field(default_factory=_Clock)
    asked: int = 0

    def read_ts(self) -> int:
        self.asked += 1
        if self.acknowledged_ts is None:
            raise UnknownOpError("unknown op 'read_ts'")
        return self.acknowledged_ts


def test_a_commit_stamped_above_the_clock_is_read() -> None:
    ahead = (NOW_MS + 300) << LOGICAL_BITS
    assert _resolve_ts(_Client(ahead), None) == ahead
    assert _resolve_ts(_Client(ahead), "") == ahead


def test_now_when_every_acknowledged_commit_is_older() -> None:
    assert _resolve_ts(_Client((NOW_MS - 5) << LOGICAL_BITS), None) == NOW_MS << LOGICAL_BITS


def test_an_older_release_without_read_ts_reads_at_now() -> None:
    client = _Client(None)
    assert _resolve_ts(client, None) == NOW_MS << LOGICAL_BITS
    assert client.asked == 1


@pytest.mark.parametrize("text", ["now", "-5m", str(NOW_MS << LOGICAL_BITS)])
def test_an_explicit_as_of_is_never_moved(text: str) -> None:
    client = _Client((NOW_MS + 300) << LOGICAL_BITS)
    assert _resolve_ts(client, text) <= NOW_MS << LOGICAL_BITS
    assert client.asked == 0
