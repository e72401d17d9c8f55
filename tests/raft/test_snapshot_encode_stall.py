"""A node encodes the snapshots it takes in a worker thread, from a view taken at the applied
index, while its event loop goes on applying entries and answering its peers.

Encoding a large state takes most of a second (the catalog's: 0.5-0.8 s at 990k file entries),
and the driver ran it on the loop (`sm.snapshot()` in `_maybe_snapshot`): every node reaches
`snapshot_every_entries` at about the same index, so the whole cluster stalled at once, past
the election timeout. A state machine with `prepare_snapshot` takes a view on the loop and
encodes it in a thread; here a state machine whose encode burns ENCODE_CPU_S of pure-Python
CPU stands in for the catalog's, and its view is the list of payloads applied so far."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from raft.core.types import Entry
from raft.node import snapshot_app_data
from tests.loop_stall import LoopTurnWatch, burn_cpu
from tests.raft.test_node import ListStateMachine, _eventually, cluster, leader_of

# CPU seconds the stand-in encode burns; the loop may go at most STALL_CPU_S without a turn
# (half the cluster's 300 ms default election timeout). On the loop the stall is the whole
# encode, 1 s; in a thread the interpreter hands the GIL back every 5 ms.
ENCODE_CPU_S = 1.0
STALL_CPU_S = 0.15
SNAPSHOT_EVERY_ENTRIES = 50


class SlowEncode(ListStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Log index -> how many payloads were applied up to it: what a snapshot at that
        # index must hold.
        self.count_at: dict[int, int] = {}
        self.encoded_on_loop_thread: list[bool] = []
        # Payloads applied while an encode ran (its view must not see them).
        self.applied_during_encode = 0
        self.written = 0
        # Only the leader's encode is slow: the CPU time measured is the process's, and three
        # nodes' encodes burning at once in one process would count against each loop turn.
        self.slow = False

    def apply(self, entry: Entry) -> Any:
        result = super().apply(entry)
        self.count_at[entry.index] = len(self.applied)
        return result

    def snapshot(self) -> bytes:
        if self.slow:
            burn_cpu(ENCODE_CPU_S)
        packed: bytes = msgpack.packb(self.applied)
        return packed

    def prepare_snapshot(self) -> Callable[[], list[bytes]]:
        view = tuple(self.applied)

        def encode() -> list[bytes]:
            self.encoded_on_loop_thread.append(
                threading.current_thread() is threading.main_thread()
            )
            if self.slow:
                burn_cpu(ENCODE_CPU_S)
            self.applied_during_encode = max(
                self.applied_during_encode, len(self.applied) - len(view)
            )
            return [msgpack.packb(view)]

        return encode

    def snapshot_written(self) -> None:
        self.written += 1

    def restore(self, data: bytes | memoryview) -> None:
        self.applied = list(msgpack.unpackb(data)) if len(data) else []


async def test_a_node_encodes_its_snapshot_off_its_event_loop_at_one_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tests.raft.test_node.ListStateMachine", SlowEncode)
    # Appends are made durable by the WAL's thread (not inline, on the loop: a loop blocked in
    # fdatasync while the encode burns CPU in its thread would count that CPU as a stall).
    async with cluster(
        tmp_path,
        3,
        persist_inline=False,
        snapshot_every_entries=SNAPSHOT_EVERY_ENTRIES,
        snapshot_keep_entries=0,
    ) as nodes:
        leader = await leader_of(nodes)
        leader_sm = leader.sm
        assert isinstance(leader_sm, SlowEncode)
        leader_sm.slow = True
        async with LoopTurnWatch() as watch:
            # Past the snapshot point, then more while the encode runs: they apply meanwhile.
            for i in range(SNAPSHOT_EVERY_ENTRIES + 10):
                await leader.propose(b"x%d" % i)
            for i in range(200):
                if leader.snapshots_saved:
                    break
                await leader.propose(b"y%d" % i)
            assert await _eventually(lambda: leader.snapshots_saved >= 1, 20), "no snapshot"
        worst = watch.worst_s
        assert worst < STALL_CPU_S, f"the event loop stalled for {worst:.3f} s of CPU time"
        assert leader_sm.encoded_on_loop_thread[:1] == [False]
        assert leader_sm.written == leader.snapshots_saved
        assert leader_sm.applied_during_encode > 0, "nothing was applied while it encoded"
        # The stored snapshot is the state at its own index, not at the index the encode ended.
        stored = leader.status().core.snapshot_index
        assert stored >= SNAPSHOT_EVERY_ENTRIES
        core_snapshot = leader._core().snapshot
        assert core_snapshot.meta.index == stored
        held = msgpack.unpackb(bytes(snapshot_app_data(core_snapshot.data)))
        assert held == leader_sm.applied[: leader_sm.count_at[stored]]
        for node in nodes.values():
            assert node.stopped_reason == ""
