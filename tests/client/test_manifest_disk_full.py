"""A compactor whose manifest write meets a full or failing disk (ENOSPC/EIO at the write, the
fsync or the rename): it raises an OSError naming the manifest file (the CLI prints
`IO_ERROR: <file>: No space left on device`; the bridge's and data source's automatic
compaction log it and the next commit tries again), leaves no temporary file, and commits
nothing: the compaction is proposed only after its manifests are durable. Before, the error
of a write or fsync named no file (`IO_ERROR: [Errno 28] No space left on device`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from metastore.client import manifest_files
from metastore.client.manifest_files import compact_table
from tests.client.test_compaction_view_pages import A, ViewClient, commit, live_paths
from tests.metastore._driver import DD_MS, MS, Driver


def failing(err: int) -> Any:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(err, os.strerror(err))

    return fail


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_a_manifest_the_disk_cannot_hold_names_the_file_and_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.a (x INT) LOCATION '{tmp_path}'")
    d.tm += (DD_MS + 1) * MS  # the table is active
    client = ViewClient(d)
    commit(d, "t1", "a", "b")
    proposed: list[str] = []
    real_call = client.call

    def call(op: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        proposed.append(op)
        return real_call(op, args, **kw)

    monkeypatch.setattr(client, "call", call)
    monkeypatch.setattr(manifest_files.os, step, failing(errno.ENOSPC))
    with pytest.raises(OSError) as caught:
        compact_table(client, "ns.a")
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename is not None
    assert str(caught.value.filename).startswith(f"{tmp_path}/_manifests/")
    assert "compact_manifest" not in proposed
    assert d.state.table_stats(A).manifests == 0
    assert not list(tmp_path.rglob("*.tmp"))
    monkeypatch.undo()
    assert compact_table(client, "ns.a")["compacted"]  # room again
    assert live_paths(d) == ["a", "b"]
