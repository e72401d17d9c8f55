"""The loop-stall measure the stall tests use: bench.loop_stall (bench.bench_loop_stall reports
the same measure for the operations at the loose-entry bound)."""

import time
from typing import Final

from bench.loop_stall import TICK_S, WARM_UP_S, LoopTurnWatch, worst_loop_turn_s

__all__ = ["TICK_S", "WARM_UP_S", "LoopTurnWatch", "burn_cpu", "worst_loop_turn_s"]

BURN_STEPS_MAX: Final = 10**9  # a bound on the burn's loop; time ends it far sooner


def burn_cpu(cpu_s: float) -> None:
    """Spend `cpu_s` of this thread's CPU time in bytecode (a stand-in for a slow encode or
    decode: in a worker thread it hands the GIL back every switch interval)."""
    started = time.thread_time()
    for _ in range(BURN_STEPS_MAX):
        if time.thread_time() - started >= cpu_s:
            return
        sum(range(200))
