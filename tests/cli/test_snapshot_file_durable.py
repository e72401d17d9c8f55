"""`snapshot save` says "saved" only once the file's name is durable too: the data was fsynced
but the rename (or link) into place was not, so a power loss right after a save could leave no
backup under FILE (only the deleted .partial's blocks). Real files; os.fsync observed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cli import snapshot


@pytest.mark.parametrize("force", [False, True])
def test_the_saved_files_directory_is_synced_once_it_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    partial = tmp_path / "catalog.snap.partial"
    partial.write_bytes(b"verified")
    file = tmp_path / "catalog.snap"
    real_fsync = os.fsync
    synced: list[tuple[bool, bool]] = []  # (a directory?, FILE in place by then?)

    def fsync(fd: int) -> None:
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), file.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    snapshot._put_in_place(partial, file, force=force)
    assert file.read_bytes() == b"verified" and not partial.exists()
    assert (True, True) in synced, synced
