"""`backup.restore` is all or nothing: a member whose data directory is not an empty directory
(a file there included) is a typed error before anything is written, and a failure while the
members are written leaves no data directory behind, so the same restore can simply be run
again. Real files, no processes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from metastore.daemon import backup
from metastore.daemon.config import load_cluster_config
from metastore.errors import InvalidArgumentError
from raft.wal import WriteAheadLog
from tests.daemon.harness import write_cluster
from tests.metastore._driver import Driver


def _snapshot_file(path: Path, *, cluster_id: str = "the-saved-cluster") -> Path:
    d = Driver()
    d.ok("CREATE NAMESPACE kept")
    data = d.state.to_snapshot()
    header = {
        "cluster_id": cluster_id,
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    with path.open("wb") as out:
        backup.write_file(out, header, data)
    return path


def test_a_data_dir_that_is_a_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    file = _snapshot_file(tmp_path / "backup.snap")
    blocked = cluster.node_data_dir(2)
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a directory")
    with pytest.raises(InvalidArgumentError, match="not empty"):
        backup.restore(file, cluster)
    assert sorted(p.name for p in blocked.parent.iterdir()) == ["node-2"]


def test_a_failure_midway_leaves_no_member_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    file = _snapshot_file(tmp_path / "backup.snap")
    real_open = WriteAheadLog.open
    opened: list[Path] = []

    def open_then_fail(directory: Path, **kw: object) -> object:
        opened.append(directory)
        if len(opened) == 3:
            raise OSError(28, "No space left on device")
        return real_open(directory, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(WriteAheadLog, "open", staticmethod(open_then_fail))
    with pytest.raises(OSError, match="No space left"):
        backup.restore(file, cluster)
    assert not cluster.data_dir.exists() or list(cluster.data_dir.iterdir()) == []
    monkeypatch.undo()
    result = backup.restore(file, cluster)  # the same restore, again: nothing in its way
    assert result["members"] == [1, 2, 3]
    assert all((cluster.node_data_dir(i) / "wal").is_dir() for i in (1, 2, 3))


def test_a_restore_into_the_backups_own_cluster_id_is_refused(tmp_path: Path) -> None:
    """The restored cluster must not share the saved cluster's id: a node of the original
    cluster (same id, and the same secret when the config directory is reused, as restoring
    into the original config after wiping its data directories does) would pass the peer
    handshake, and with its higher term and longer log take over the restored cluster."""
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    file = _snapshot_file(tmp_path / "backup.snap", cluster_id=cluster.cluster_id)
    with pytest.raises(InvalidArgumentError, match="cluster id") as refused:
        backup.restore(file, cluster)
    assert "--cluster-id" in refused.value.message
    assert not cluster.data_dir.exists()
    other = load_cluster_config(write_cluster(tmp_path / "other", cluster_id="restored"))
    assert backup.restore(file, other)["cluster_id"] == "restored"
