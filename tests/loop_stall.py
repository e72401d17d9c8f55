"""The loop-stall measure the stall tests use: bench.loop_stall (bench.bench_loop_stall reports
the same measure for the operations at the loose-entry bound)."""

from bench.loop_stall import TICK_S, WARM_UP_S, LoopTurnWatch, worst_loop_turn_s

__all__ = ["TICK_S", "WARM_UP_S", "LoopTurnWatch", "worst_loop_turn_s"]
