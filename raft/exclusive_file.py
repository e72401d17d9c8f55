"""Create a small private file whole or not at all: `create_exclusive`.

For files a process creates once and then relies on for good (the cluster secret, the client
tokens): a disk that fills mid-write stores what fits, and a short file under the final name
would be read back (or refused) at every later start. So the bytes are written under a unique
temporary name, fsynced, and hard-linked to the final name, which is atomic and fails if the
name exists (a racing process created it first: both then read the winner's file). Used by
`raft.transport.load_or_create_secret` and `metastore.daemon.secrets`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["create_exclusive"]


def create_exclusive(path: Path, data: bytes) -> bool:
    """Write `data` to `path` (mode 0600) unless it exists; True if this call created it.

    Written under a unique temporary name, fsynced, then hard-linked into place: the link is
    atomic and fails if `path` exists, so `path` is never seen partially written. An OSError
    names `path` (a write's own error names no file).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            # Every byte: a disk that fills mid-write stores what fits and returns that count
            # (the next write raises ENOSPC); a short file linked into place stays for good.
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:
            # A write's error names no file: name the one this was to become.
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    # The new directory entry must survive a crash like the file: a node must not lose the
    # secret it has already used to join the cluster.
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True
