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
