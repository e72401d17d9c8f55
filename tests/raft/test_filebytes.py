"""raft.filebytes: a range of a file read with pread. Reads return exactly what was asked or
raise FileReadError naming the file, the offset and the errno; a range outlives its file's
name and its creator's descriptor."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import raft.filebytes
from raft.filebytes import FileBytes, FileBytesReader, FileReadError

DATA = bytes(range(256)) * 64  # 16 KiB


def _range(tmp_path: Path, offset: int = 10, length: int = len(DATA) - 20) -> FileBytes:
    path = tmp_path / "f"
    path.write_bytes(DATA)
    fd = os.open(path, os.O_RDONLY)
    try:
        return FileBytes.of_fd(fd, path, offset, length)
    finally:
        os.close(fd)  # the range holds its own descriptor


def test_reads_slices_and_chunks_see_the_range_only(tmp_path: Path) -> None:
    fb = _range(tmp_path)
    (tmp_path / "f").unlink()  # a deleted file stays readable through the range
    want = DATA[10:-10]
    assert len(fb) == len(want) and bytes(fb) == want and fb == want
    assert fb.read(5, 9) == want[5:9] and fb.read(-4, 10**9) == want[-4:]
    part = fb.slice(100, 300)
    assert bytes(part) == want[100:300] and part.slice(50) == want[150:300]
    assert b"".join(bytes(c) for c in fb.chunks(1000)) == want
    reader = FileBytesReader(fb)
    assert reader.read(7) == want[:7] and reader.byte_at(3) == want[3]
    assert reader.byte_at(5000) == want[5000]
    assert fb != want[:-1] and fb != b"x" * len(want)


def test_a_file_cut_short_under_the_range_is_a_read_error_naming_it(tmp_path: Path) -> None:
    fb = _range(tmp_path)
    os.truncate(tmp_path / "f", 4096)
    assert fb.read(0, 100) == DATA[10:110]  # what is left still reads
    with pytest.raises(FileReadError) as caught:
        bytes(fb)
    assert caught.value.errno == errno.EIO
    assert str(tmp_path / "f") in str(caught.value) and "truncated" in str(caught.value)
    assert caught.value.offset == 4096


def test_an_eio_from_the_disk_is_a_read_error_with_its_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fb = _range(tmp_path)

    def eio(_fd: int, _what: object, _offset: int) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(raft.filebytes.os, "pread", eio)
    monkeypatch.setattr(raft.filebytes.os, "preadv", eio)
    with pytest.raises(FileReadError, match=r"read of .*/f at offset 10: .*\(EIO\)"):
        fb.read(0, 1)
    with pytest.raises(FileReadError, match=r"read of .*/f at offset 20: .*\(EIO\)"):
        next(fb.slice(10).chunks(100))


def test_close_closes_every_range_over_the_file(tmp_path: Path) -> None:
    fb = _range(tmp_path)
    part = fb.slice(0, 10)
    fb.close()
    with pytest.raises(ValueError, match="after close"):
        part.read(0, 1)
