"""A `gc run` split by a lapse of the leader's lease (or a change of leader): the part before
the split deleted files that the run's reply must still count (metastore/daemon/gc_worker.py
`GcWorker.run`; the client adds the parts, metastore.client.protocol `gc_run`).

No cluster: the leader's GC against the deterministic driver's state and a real directory."""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

from metastore.daemon import gc_worker
from metastore.errors import NotLeaderError
from tests.daemon.test_gc_leader_change import _run_worker
from tests.daemon.test_gc_orphans import _queued_table, _Raft

RELS = [f"_txn/old-0123456789ab/part-{i}.parquet" for i in range(4)]


class _LeadingRaft(_Raft):
    ready_to_serve = True

    def is_leader(self) -> bool:
        return self.leading


def test_a_run_split_by_a_lease_lapse_counts_every_file_it_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of two files: the first chunk is deleted and reported, then the lease lapses
    # right after the third file's unlink. The first run ends NOT_LEADER (the client repeats
    # it); its error must say what it deleted (3 files), and the repeat must count only the
    # file it deleted itself (the third was already gone), so the two parts add up to 4.
    # Before, the error carried no counts and the repeat counted 2: `gc run` said 2 of 4.
    monkeypatch.setattr(gc_worker, "DELETE_CHUNK_FILES", 2)
    location = tmp_path / "t"
    d, table_id = _queued_table(location, RELS, mtime_s=time.time() - 3_600)
    raft = _LeadingRaft(d)
    real_remove = os.remove
    removed = 0

    def remove(path: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal removed
        real_remove(path, *args, **kwargs)
        removed += 1
        if removed == 3:
            raft.lease_until_s = time.monotonic()  # lapsed: the thread stops at the next file

    monkeypatch.setattr(os, "remove", remove)
    w = _run_worker(d, raft)
    with pytest.raises(NotLeaderError) as split:
        asyncio.run(w.run(None, dry_run=False))
    assert [r for r in RELS if (location / r).exists()] == RELS[3:]
    partial = split.value.details.get("partial")
    assert isinstance(partial, dict), split.value.details
    assert (partial["files_deleted"], partial["bytes_deleted"]) == (3, 24)
    assert "3 files" in split.value.message
    raft.lease_until_s = math.inf  # renewed by the next heartbeat round
    again = asyncio.run(w.run(None, dry_run=False))
    assert (again["files_deleted"], again["bytes_deleted"]) == (1, 8)
    assert not any((location / r).exists() for r in RELS)
    assert not d.state.txns.gc_queue(table_id)


async def test_the_client_adds_up_the_parts_of_a_split_run() -> None:
    # Node 1 led when the run started, deleted 3 files and lost its lease: NOT_LEADER with
    # what it deleted. The client repeats `gc run` (safe to repeat) on node 2, whose run
    # deletes 1 more. The reply must count all 4 and say the run came in two parts; before,
    # it was node 2's reply alone.
    from metastore.client import MetastoreClient
    from tests.client.fake_node import TOKEN, FakeNode

    part = {"files_deleted": 3, "bytes_deleted": 24, "orphans_deleted": 1}
    part |= {"orphan_bytes_deleted": 5, "compacted_manifests": 0}

    async def deposed(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotLeaderError("GC stopped deleting", details={"leader": 2, "partial": part})

    async def leads(op: str, args: dict[str, Any]) -> dict[str, Any]:
        totals = {"files_deleted": 1, "bytes_deleted": 8, "orphans_deleted": 0}
        totals |= {"orphan_bytes_deleted": 0, "compacted_manifests": 0}
        return {"dry_run": False, "tables": [], **totals, "seconds": 0.5}

    nodes = [FakeNode(node_id=1, handler=deposed), FakeNode(node_id=2, handler=leads)]
    endpoints = [await n.start() for n in nodes]
    try:
        async with MetastoreClient(endpoints, TOKEN, timeout_ms=10_000) as c:
            run = await c.gc_run()
    finally:
        for n in nodes:
            await n.stop()
    assert (run["files_deleted"], run["bytes_deleted"]) == (4, 32)
    assert (run["orphans_deleted"], run["orphan_bytes_deleted"]) == (1, 5)
    assert run["parts"] == 2 and run["earlier_parts"] == [part]


async def test_an_attempt_whose_forward_got_no_answer_is_said_to_be_uncounted() -> None:
    # A follower forwarded the run to the leader and gave up waiting (UNAVAILABLE, outcome
    # unknown): that run may go on deleting on the leader. The repeat's reply cannot count
    # it and must say so rather than pass for the whole run.
    from metastore.client import MetastoreClient
    from metastore.errors import UnavailableError
    from tests.client.fake_node import TOKEN, FakeNode

    async def gave_up(op: str, args: dict[str, Any]) -> dict[str, Any]:
        details = {"node_id": 2, "outcome_unknown": True}
        raise UnavailableError("node 2 did not answer; outcome unknown", details=details)

    async def leads(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"dry_run": False, "tables": [], "files_deleted": 0, "seconds": 0.1}

    nodes = [FakeNode(node_id=1, handler=gave_up), FakeNode(node_id=2, handler=leads)]
    endpoints = [await n.start() for n in nodes]
    try:
        async with MetastoreClient(endpoints, TOKEN, timeout_ms=10_000) as c:
            run = await c.gc_run()
    finally:
        for n in nodes:
            await n.stop()
    assert run["unanswered_parts"] == 1 and "parts" not in run
