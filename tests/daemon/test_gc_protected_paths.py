"""`ProtectedPaths`: what the GC never deletes, whatever a table's location says (the real-node
case is tests/daemon/test_gc_protected_dirs.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from metastore.daemon.gc_worker import ProtectedPaths, _delete_absolute


def _always() -> bool:
    return True


def test_inside_a_protected_directory_through_a_link_or_a_protected_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "node-1").mkdir(parents=True)
    key = tmp_path / "tls" / "node-1.key"
    key.parent.mkdir()
    key.write_text("k")
    (tmp_path / "warehouse").mkdir()
    (tmp_path / "warehouse" / "into-data").symlink_to(data)
    protected = ProtectedPaths.of(dirs=[data], files=[key])
    assert protected.holds(str(data / "node-1" / "IDENTITY")) == str(data.resolve())
    assert protected.holds(str(data)) == str(data.resolve())
    via_link = tmp_path / "warehouse" / "into-data" / "node-1" / "IDENTITY"
    assert protected.holds(str(via_link)) == str(data.resolve())
    assert protected.holds(str(key)) == str(key.resolve())
    # A sibling whose name starts like a protected directory is not inside it.
    assert protected.holds(str(tmp_path / "data2" / "x.parquet")) == ""
    assert protected.holds(str(tmp_path / "warehouse" / "t" / "x.parquet")) == ""
    assert protected.holds(str(tmp_path / "tls" / "node-2.key")) == ""


def test_a_protected_path_is_left_on_disk_and_not_counted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    kept = data / "IDENTITY"
    kept.write_text("id")
    table_file = tmp_path / "warehouse" / "a.parquet"
    table_file.parent.mkdir()
    table_file.write_text("x")
    deleted = _delete_absolute(
        [str(kept), str(table_file)],
        leading=_always,
        protected=ProtectedPaths.of(dirs=[data], files=[]),
    )
    assert deleted.removed == [str(table_file)]
    assert kept.exists() and not table_file.exists()


def test_a_file_gc_may_not_delete_is_reported_and_the_rest_still_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permission denied (or EIO, a read-only mount) on one file: before, the OSError ended
    the whole chunk, so every run failed on that file and no file queued behind it, in any
    table after it, was ever deleted. Now it is left (with why) and the others go."""
    files = [tmp_path / f"{name}.parquet" for name in ("a", "stuck", "b")]
    for f in files:
        f.write_text("x")
    gone = tmp_path / "gone.parquet"  # already deleted: done, not a failure
    real_remove = os.remove

    def remove(path: str) -> None:
        if path.endswith("stuck.parquet"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        real_remove(path)

    monkeypatch.setattr("metastore.daemon.gc_worker.os.remove", remove)
    deleted = _delete_absolute([str(p) for p in [*files, gone]], leading=_always)
    assert deleted.removed == [str(files[0]), str(files[2]), str(gone)]
    assert deleted.unlinked() == [str(files[0]), str(files[2])]
    assert list(deleted.failed) == [str(files[1])]
    assert "EACCES" in deleted.failed[str(files[1])]
    assert files[1].exists() and not files[0].exists() and not files[2].exists()
