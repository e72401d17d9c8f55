"""A follower installing a leader's snapshot keeps its event loop running while it decodes.

Decoding a large state takes seconds of CPU (the catalog's: 8-10 s at a million file entries),
and the driver ran it on the loop, which also serves the node's clients, health checks and
links: all of them waited that long. A state machine with `prepare_restore` has it run in a
worker thread (the driver awaits it, so nothing is applied meanwhile); here a state machine
whose decode burns DECODE_CPU_S of pure-Python CPU stands in for the catalog's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.loop_stall import LoopTurnWatch, burn_cpu
from tests.raft.test_node import (
    ListStateMachine,
    _eventually,
    _spooled_snapshots_and_a_deaf_node,
    cluster,
    leader_of,
    sm,
)

# CPU seconds the stand-in decode burns; the loop may go at most STALL_CPU_S without a turn
# (half the cluster's 300 ms default election timeout). On the loop the stall is the whole
# decode, 1 s; in a thread the interpreter hands the GIL back every 5 ms.
DECODE_CPU_S = 1.0
STALL_CPU_S = 0.15


class SlowDecode(ListStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.decoded_on_loop_thread: list[bool] = []

    def prepare_restore(self, data: bytes | memoryview) -> Callable[[], None]:
        if data:
            self.decoded_on_loop_thread.append(
                threading.current_thread() is threading.main_thread()
            )
            burn_cpu(DECODE_CPU_S)
        return lambda: ListStateMachine.restore(self, data)

    def restore(self, data: bytes | memoryview) -> None:
        self.prepare_restore(data)()


async def test_a_follower_decodes_a_snapshot_off_its_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut = _spooled_snapshots_and_a_deaf_node(monkeypatch)
    monkeypatch.setattr("tests.raft.test_node.ListStateMachine", SlowDecode)
    async with cluster(tmp_path, 3, snapshot_every_entries=50, snapshot_keep_entries=0) as nodes:
        leader = await leader_of(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        cut["id"] = follower.node_id  # it hears nothing while the leader compacts past it
        for i in range(60):
            await leader.propose(b"x%d" % i)
        assert await _eventually(lambda: leader.status().core.snapshot_index >= 50, 10)
        leader_snapshot = leader.status().core.snapshot_index

        # CPU time of the whole process (every thread) between two turns of the loop: a
        # decode holding the loop burns all of it; the OS not scheduling us burns none.
        async with LoopTurnWatch() as watch:
            cut["id"] = 0
            assert await _eventually(
                lambda: follower.status().core.snapshot_index >= leader_snapshot, 20
            ), "the leader's snapshot was not installed"
            for i in range(5):  # applied after the install, in order
                await leader.propose(b"after%d" % i)
            assert await _eventually(
                lambda: sm(follower).applied[-5:] == sm(leader).applied[-5:], 10
            )
        worst = watch.worst_s
        assert worst < STALL_CPU_S, f"the event loop stalled for {worst:.3f} s of CPU time"
        follower_sm = follower.sm
        assert isinstance(follower_sm, SlowDecode)
        assert follower_sm.decoded_on_loop_thread == [False]
        assert follower.stopped_reason == ""
