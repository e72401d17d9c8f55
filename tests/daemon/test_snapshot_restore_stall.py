"""A node decodes a snapshot it installs from its leader in a worker thread, and its event loop
keeps its turns meanwhile (raft.node awaits `CatalogStateMachine.prepare_restore` in a thread).

Decoding and checking a catalog of many file entries is seconds of CPU (8-10 s at 990k); it ran
on the loop, which also serves the node's clients and its Raft links. In a thread, three things
could still hold the GIL, and so the loop, for long: one msgpack call decoding the whole
snapshot (metastore.snapshot_data: `unpack_in_steps` decodes it in short calls), the collector
traversing the growing state (paused during the decode), and the first collection after it,
over every object the decode made (`freeze_decoded` takes them out of its scans first)."""

from __future__ import annotations

import asyncio
import gc

from bench.bench_apply import Node
from metastore.daemon.collector import freeze_decoded, refreeze
from metastore.daemon.statemachine import CatalogStateMachine
from tests.loop_stall import worst_loop_turn_s

FILE_ENTRIES = 300_000
FILES_PER_COMMIT = 10_000
# Half the default election timeout (300 ms). On the loop this decode stalls it 2-3 s.
STALL_CPU_S_MAX = 0.15


def test_a_snapshot_is_decoded_off_the_loop_and_installed_in_a_moment() -> None:
    source = Node()
    source.fill(FILE_ENTRIES, FILES_PER_COMMIT)
    data = source.machine.snapshot()
    del source
    sm = CatalogStateMachine()
    sm.on_state_settled = refreeze  # as the node process sets them (metastore.daemon.node)
    sm.on_state_decoded = freeze_decoded

    async def install() -> None:
        done = await asyncio.to_thread(sm.prepare_restore, data)
        done()

    try:
        worst = asyncio.run(worst_loop_turn_s(install(), freeze_heap=True))
    finally:
        gc.unfreeze()
    assert sm.state.to_snapshot() == data
    assert worst < STALL_CPU_S_MAX, f"the event loop stalled for {worst:.3f} s of CPU time"
    assert gc.isenabled()
