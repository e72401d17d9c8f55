"""LogBudget: a burst of lines, then a rate; what is left out is counted and reported."""

from __future__ import annotations

import pytest

from raft.ratelimit import LogBudget


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_burst_then_a_rate_and_the_left_out_reported_by_the_next_line() -> None:
    clock = FakeClock()
    budget = LogBudget(burst=3, per_s=2.0, monotonic=clock)
    assert [budget.take() for _ in range(3)] == [0, 0, 0]
    assert [budget.take() for _ in range(5)] == [None] * 5
    assert budget.left_out == 5
    clock.now_s += 0.5  # one token back
    assert budget.take() == 5  # logged, saying five lines before it were left out
    assert budget.take() is None
    clock.now_s += 3600  # refills up to the burst only
    assert [budget.take() for _ in range(4)] == [1, 0, 0, None]


def test_a_clock_going_back_refills_nothing() -> None:
    clock = FakeClock()
    budget = LogBudget(burst=1, per_s=1.0, monotonic=clock)
    assert budget.take() == 0
    clock.now_s -= 50
    assert budget.take() is None


@pytest.mark.parametrize(("burst", "per_s"), [(0, 1.0), (1, 0.0), (1, -1.0)])
def test_a_budget_that_logs_nothing_is_refused(burst: int, per_s: float) -> None:
    with pytest.raises(ValueError, match="log budget"):
        LogBudget(burst=burst, per_s=per_s)
