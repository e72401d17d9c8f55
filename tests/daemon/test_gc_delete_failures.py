"""The leader's GC meets files the store will not delete (permission denied, a read-only or
failing disk) or that are already gone.

Before: the first such file raised out of the deletion thread and ended the whole run, so
every scheduled run failed on that same file ("GC run failed; the next run resumes it"), and
no file queued behind it, in that table or any table after it, nor any orphan, was deleted
again. Now the file is left on disk and stays queued (a later run tries again), with one
warning naming it and the errno, and everything else goes. A file already gone is done."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from metastore.commands import TableName
from tests.daemon.test_gc_leader_change import _run_worker
from tests.daemon.test_gc_orphans import _Raft, old_file, table_driver
from tests.metastore._driver import DD_MS, MS

U = TableName.of("ns", "u")


def test_a_file_gc_may_not_delete_stays_queued_and_the_rest_of_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    d = table_driver(tmp_path / "t")
    d.ok(f"CREATE TABLE ns.u (id BIGINT) LOCATION '{tmp_path / 'u'}'")
    d.tm += 2 * DD_MS * MS  # past the new table's activation
    t_id, u_id = sorted(d.state.txns.table_ids())
    queued_t = ["a.parquet", "stuck.parquet", "b.parquet", "gone.parquet"]
    queued_u = ["c.parquet"]
    for table_id, names in ((t_id, queued_t), (u_id, queued_u)):
        for name in names:
            d.state.txns._tables[table_id].gc_queue[name] = 7
    on_disk = {name: old_file(tmp_path / "t" / name) for name in queued_t if name != "gone.parquet"}
    on_disk["c.parquet"] = old_file(tmp_path / "u" / "c.parquet")
    real_remove = os.remove

    def remove(path: str) -> None:
        if path.endswith("stuck.parquet"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        real_remove(path)

    monkeypatch.setattr("metastore.daemon.gc_worker.os.remove", remove)
    raft = _Raft(d)
    raft.is_leader = lambda: True  # type: ignore[attr-defined]
    raft.ready_to_serve = True  # type: ignore[attr-defined]
    w = _run_worker(d, raft)
    caplog.set_level(logging.WARNING, logger="metastore.daemon.gc_worker")
    summary = asyncio.run(w.run(None, dry_run=False))
    assert summary["files_deleted"] == 3  # a, b and c; "gone" was done already
    assert [n for n, p in on_disk.items() if p.exists()] == ["stuck.parquet"]
    assert list(d.state.txns.gc_queue(t_id)) == ["stuck.parquet"]  # tried again later
    assert not d.state.txns.gc_queue(u_id)
    warnings = [r.getMessage() for r in caplog.records if "could not delete" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert str(on_disk["stuck.parquet"]) in warnings[0] and "EACCES" in warnings[0]
    # The next run tries the file again (the store may let it go now), once.
    monkeypatch.undo()
    summary = asyncio.run(w.run(None, dry_run=False))
    assert summary["files_deleted"] == 1
    assert not on_disk["stuck.parquet"].exists() and not d.state.txns.gc_queue(t_id)
