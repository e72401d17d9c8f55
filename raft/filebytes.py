"""FileBytes: a large snapshot's bytes left in their file and read with pread, never mapped.

Key idea
--------
A snapshot can be a gigabyte: the node never holds it on the heap. It used to map the file
(the WAL's snapshot file, a received transfer's spool file, an export's spool file) and pass
a memoryview of the map around. But a page read through a map that the disk cannot read (EIO
on a bad sector), or that is past the end of a file another process truncated, is a SIGBUS:
the process dies at once, with no line in its log, whatever the code around the read was
ready to handle. Read with pread instead, the same failure is an OSError (`FileReadError`,
naming the file, the offset and the errno) that the callers handle like any storage fault:
a follower's install or a restore stops the node with one line, a leader's transfer is
dropped and logged, an export fails with IO_ERROR.

Memory stays bounded as with the map: readers take the bytes a chunk at a time
(`read`/`readinto`/`chunks`), into buffers of a bounded size they choose; only `__bytes__`
(small snapshots, tests) reads the whole range.

Jargon
------
* **range**: `FileBytes` is `length` bytes of one file from `offset`; `slice` gives a
  sub-range of the same open file (no copy, no new descriptor).
* **owned descriptor**: the file is opened (or its descriptor duplicated) once and closed when
  the last range over it is garbage: as a map kept its pages, a range keeps a deleted file's
  bytes readable (a spool file is unlinked as soon as it is complete).

Invariants
----------
* A read returns exactly the bytes asked for or raises `FileReadError`: a short read (the file
  was truncated under the reader) is an error, never fewer bytes.
* Reads are positional (pread), so ranges may be read from several threads at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from raft.oserror import errno_text

# The buffer `chunks` and `__bytes__`'s callers read through, unless they give another size.
FILE_BYTES_CHUNK_BYTES: Final = 1024 * 1024


class FileReadError(OSError):
    """A read of a file's range failed: the disk could not read it (EIO), or the file is
    shorter than the range (truncated by someone else while it was in use)."""

    def __init__(self, path: Path, offset: int, cause: OSError | None = None) -> None:
        if cause is None:
            super().__init__(
                errno.EIO,
                f"the file ended before offset {offset} (truncated while in use)",
                str(path),
            )
        else:
            super().__init__(cause.errno, cause.strerror or str(cause), str(path))
        self.offset = offset

    def __str__(self) -> str:
        return f"read of {self.filename} at offset {self.offset}: {errno_text(self)}"


class _OwnedFd:
    """A descriptor closed when the last FileBytes over it goes."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            with contextlib.suppress(OSError):  # nothing to do about a failed close
                os.close(fd)

    def __del__(self) -> None:
        self.close()


class FileBytes:
    """`length` read-only bytes of a file from `offset`, read on demand (see the module)."""

    __slots__ = ("_owned", "length", "offset")

    def __init__(self, owned: _OwnedFd, offset: int, length: int) -> None:
        # Private: use `of_fd` or `slice`.
        self._owned = owned
        self.offset = offset
        self.length = length

    @classmethod
    def of_fd(cls, fd: int, path: Path, offset: int, length: int) -> FileBytes:
        """A range of the file open as `fd`, which is duplicated (the caller keeps and closes
        its own): the range stays readable after the file is closed, renamed or deleted."""
        return cls(_OwnedFd(os.dup(fd), path), offset, length)

    @property
    def path(self) -> Path:
        return self._owned.path

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return self.length > 0

    def __repr__(self) -> str:
        return f"FileBytes({self.path}, offset={self.offset}, length={self.length})"

    def slice(self, start: int, stop: int | None = None) -> FileBytes:
        """The sub-range [start, stop) (clamped to this range, as slicing bytes is)."""
        start, stop, _ = slice(start, stop).indices(self.length)
        return FileBytes(self._owned, self.offset + start, max(0, stop - start))

    def close(self) -> None:
        """Close the file now for every range over it (a deleted file's blocks are freed
        then, not when the collector finds the last range); later reads raise ValueError."""
        self._owned.close()

    def readinto(self, start: int, buf: memoryview) -> None:
        """Fill `buf` with the bytes from `start` (relative to the range); FileReadError if
        they cannot be read or are not all there."""
        if start < 0 or start + len(buf) > self.length:
            raise ValueError(f"read of [{start}, {start + len(buf)}) outside {self!r}")
        if self._owned.fd < 0:
            raise ValueError(f"read of {self!r} after close()")
        done = 0
        while done < len(buf):  # each pass reads at least one byte or raises
            position = self.offset + start + done
            try:
                read = os.preadv(self._owned.fd, [buf[done:]], position)
            except OSError as exc:
                raise FileReadError(self.path, position, exc) from exc
            if read == 0:
                raise FileReadError(self.path, position)
            done += read

    def read(self, start: int, stop: int) -> bytes:
        """The bytes [start, stop) of the range (clamped), as a new bytes object (one
        allocation: os.pread builds it; a short read, rare, is completed by readinto)."""
        start, stop, _ = slice(start, stop).indices(self.length)
        size = max(0, stop - start)
        if self._owned.fd < 0:
            raise ValueError(f"read of {self!r} after close()")
        position = self.offset + start
        try:
            got = os.pread(self._owned.fd, size, position)
        except OSError as exc:
            raise FileReadError(self.path, position, exc) from exc
        if len(got) == size:
            return got
        buf = bytearray(size)
        buf[: len(got)] = got
        self.readinto(start + len(got), memoryview(buf)[len(got) :])
        return bytes(buf)

    def chunks(self, chunk_bytes: int = FILE_BYTES_CHUNK_BYTES) -> Iterator[memoryview]:
        """The range in order, `chunk_bytes` at a time, through ONE reused buffer: each view
        is valid only until the next is taken."""
        buf = memoryview(bytearray(min(chunk_bytes, self.length)))
        for start in range(0, self.length, chunk_bytes):
            view = buf[: min(chunk_bytes, self.length - start)]
            self.readinto(start, view)
            yield view

    # Compared by content, as a memoryview is (a Snapshot's equality reads its data: tests).
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, bytes | bytearray | memoryview | FileBytes):
            return NotImplemented
        if len(other) != self.length:
            return False
        theirs = other if isinstance(other, FileBytes) else memoryview(other).cast("B")
        step = FILE_BYTES_CHUNK_BYTES
        for start in range(0, self.length, step):
            stop = min(self.length, start + step)
            mine = self.read(start, stop)
            if isinstance(theirs, FileBytes):
                if mine != theirs.read(start, stop):
                    return False
            elif mine != theirs[start:stop]:
                return False
        return True

    def __bytes__(self) -> bytes:
        """The whole range on the heap (small snapshots, tests)."""
        return self.read(0, self.length)


class FileBytesReader:
    """A file-like `read(n)` over a FileBytes (msgpack's Unpacker reads through it one chunk
    at a time), that also tells a byte it read recently (`byte_at`) without another read."""

    __slots__ = ("_data", "_last", "_last_at", "_pos")

    def __init__(self, data: FileBytes) -> None:
        self._data = data
        self._pos = 0
        self._last = b""
        self._last_at = 0

    def read(self, n: int) -> bytes:
        chunk = self._data.read(self._pos, self._pos + n)
        self._last, self._last_at = chunk, self._pos
        self._pos += len(chunk)
        return chunk

    def byte_at(self, position: int) -> int:
        offset = position - self._last_at
        if 0 <= offset < len(self._last):
            return self._last[offset]
        return self._data.read(position, position + 1)[0]


# A snapshot's data as the engine holds it: bytes, a view, or a range of a file.
SnapshotData = bytes | memoryview | FileBytes


def snapshot_bytes(data: bytes | memoryview | FileBytes) -> bytes | memoryview:
    """`data` itself, or a FileBytes read whole onto the heap (a small snapshot, or a caller
    that needs it whole)."""
    return bytes(data) if isinstance(data, FileBytes) else data


__all__ = [
    "FILE_BYTES_CHUNK_BYTES",
    "FileBytes",
    "FileBytesReader",
    "FileReadError",
    "SnapshotData",
    "snapshot_bytes",
]
