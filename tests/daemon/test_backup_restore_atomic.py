"""`backup.restore` is all or nothing: a member whose data directory is not an empty directory
(a file there included) is a typed error before anything is written, and a failure while the
members are written leaves no data directory behind, so the same restore can simply be run
again. Real files, no processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from metastore.daemon import backup
from metastore.daemon.config import load_cluster_config
from metastore.errors import InvalidArgumentError
from raft.node import IDENTITY_FILE
from raft.wal import WriteAheadLog
from tests.daemon.harness import write_cluster
from tests.metastore._driver import Driver

REPO = Path(__file__).resolve().parents[2]


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


def test_a_restore_killed_while_it_puts_members_in_place_leaves_all_or_none(
    tmp_path: Path,
) -> None:
    """The members were renamed into place one by one: a restore killed between two renames
    (kill -9, a power loss) left some members restored and others empty, which `cluster up`
    refuses and a second restore refuses as not empty. Killed here right after its first
    rename, in a child process."""
    config = write_cluster(tmp_path / "cfg", cluster_id="restored")
    file = _snapshot_file(tmp_path / "backup.snap")
    code = textwrap.dedent(
        """
        import os, sys
        from pathlib import Path
        from metastore.daemon import backup
        from metastore.daemon.config import load_cluster_config
        real_rename = Path.rename
        def rename_then_die(self, target):
            done = real_rename(self, target)
            os._exit(3)  # killed right after the first rename
        Path.rename = rename_then_die
        backup.restore(Path(sys.argv[1]), load_cluster_config(Path(sys.argv[2])))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(file), str(config)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    cluster = load_cluster_config(config)
    restored = [i for i in (1, 2, 3) if (cluster.node_data_dir(i) / IDENTITY_FILE).exists()]
    assert restored in ([], [1, 2, 3]), restored


def test_an_existing_empty_data_dir_is_kept_not_replaced(tmp_path: Path) -> None:
    """A data directory that exists (a mount point, a symlink to another disk) receives the
    members; it is not replaced by a directory of the restore's making."""
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    cluster.data_dir.symlink_to(elsewhere)
    backup.restore(_snapshot_file(tmp_path / "backup.snap"), cluster)
    assert cluster.data_dir.is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["node-1", "node-2", "node-3"]


def test_a_restored_members_identity_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The WAL syncs its own files, but IDENTITY was written without a sync: after a power
    loss soon after the restore a member could find it empty and refuse to start (and a
    second restore refuses the directory as not empty)."""
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    file = _snapshot_file(tmp_path / "backup.snap")
    real_fsync = os.fsync
    synced: list[str] = []

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    backup.restore(file, cluster)
    for i in (1, 2, 3):
        identity = cluster.node_data_dir(i) / IDENTITY_FILE
        # Synced where it was written (the staging directory), then renamed with it.
        assert any(s.endswith(f"/node-{i}/{IDENTITY_FILE}") for s in synced), synced
        assert json.loads(identity.read_text())["node_id"] == i


def test_a_restored_cluster_does_not_inherit_the_saved_clusters_member_client_addresses(
    tmp_path: Path,
) -> None:
    """Recorded client addresses (`add-node --client-address`) are the saved cluster's hosts:
    a node id the new cluster adds later without an address would be forwarded to them."""
    from metastore.commands import SetMemberClientAddress
    from metastore.state import MetastoreState
    from raft.node import unwrap_snapshot_data

    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    d = Driver()
    d.ok("CREATE NAMESPACE kept")
    d.apply(SetMemberClientAddress(node_id=4, host="old-host", port=24204)).raise_for_error()
    data = d.state.to_snapshot()
    header = {
        "cluster_id": "saved",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    file = tmp_path / "backup.snap"
    with file.open("wb") as out:
        backup.write_file(out, header, data)
    backup.restore(file, cluster)
    wal, recovered = WriteAheadLog.open(cluster.node_data_dir(1) / "wal")
    wal.close()
    app_data, _ = unwrap_snapshot_data(recovered.snapshot.data)
    restored = MetastoreState.from_snapshot(app_data)
    assert restored.member_clients.address_of(4) is None
    assert "kept" in {ns.name for ns in restored.list_namespaces()}


def test_a_restore_onto_a_full_disk_is_one_error_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`metastore snapshot restore` when the disk fills while a member's snapshot is written:
    one `Error: WAL_IO: ...` line naming the file and the errno, exit 1, and no data directory
    left (the same restore runs again once there is room). Before: the log's WalIOError is no
    OSError, so it escaped the CLI's handlers as a traceback."""
    import errno

    from click.testing import CliRunner

    import raft.wal
    from cli.main import cli

    config = write_cluster(tmp_path / "cfg", cluster_id="restored")
    cluster = load_cluster_config(config)
    file = _snapshot_file(tmp_path / "backup.snap")
    real_write_all = raft.wal._write_all

    def write_all(fd: int, data: bytes | memoryview) -> None:
        if "/snap-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    monkeypatch.setattr(raft.wal, "_write_all", write_all)
    result = CliRunner().invoke(
        cli, ["snapshot", "restore", str(file), "--config", str(config.parent)]
    )
    assert isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: WAL_IO: "), result.output
    assert "ENOSPC" in errors[0] and "snap-" in errors[0], errors
    assert "Traceback" not in result.output
    assert not cluster.data_dir.exists()
    monkeypatch.undo()
    backup.restore(file, cluster)
    assert (cluster.node_data_dir(1) / IDENTITY_FILE).exists()
