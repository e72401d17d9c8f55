"""`backup.read_file` (what `snapshot restore` and `snapshot save`'s verification read): a file
that is not a snapshot, or one cut short, is a typed error found from its first bytes and its
size, without reading the file into memory; the state is read once, from a file or a pipe.
Real files, no cluster; the memory bound is checked in a child process with a small address
space limit."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from metastore.daemon import backup
from metastore.errors import MalformedSnapshotError
from tests.metastore._driver import Driver

REPO = Path(__file__).resolve().parents[2]
# The child's address space: far below the sparse files' sizes below.
CHILD_ADDRESS_SPACE_BYTES = 512 * 1024 * 1024
SPARSE_FILE_BYTES = 2 * 1024 * 1024 * 1024


def _state() -> bytes:
    d = Driver()
    d.ok("CREATE NAMESPACE kept")
    return d.state.to_snapshot()


def _header(data: bytes, **override: object) -> bytes:
    header = {
        "cluster_id": "saved",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **override,
    }
    return json.dumps(header).encode() + b"\n"


def _read_in_small_child(path: Path) -> str:
    """What `read_file(path)` raises in a process that may map 512 MiB at most."""
    code = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        from metastore.daemon import backup
        limit = {CHILD_ADDRESS_SPACE_BYTES}
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            backup.read_file(Path(sys.argv[1]))
        except Exception as exc:
            print(type(exc).__name__, exc)
        else:
            print("accepted")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_large_file_that_is_no_snapshot_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A wrong file given to restore (a warehouse archive, a Parquet file): it was read whole
    into memory (three copies) before its first bytes were looked at."""
    foreign = tmp_path / "warehouse.tar"
    with foreign.open("wb") as f:
        f.write(b"PAR1 not a snapshot")
        f.truncate(SPARSE_FILE_BYTES)  # sparse: no disk used
    said = _read_in_small_child(foreign)
    assert said.startswith("MalformedSnapshotError") and "not a metastore snapshot" in said, said


def test_a_truncated_large_snapshot_is_refused_by_its_size(tmp_path: Path) -> None:
    data_bytes = SPARSE_FILE_BYTES + 4096
    cut = tmp_path / "cut.snap"
    with cut.open("wb") as f:
        f.write(backup.FILE_MAGIC)
        f.write(_header(b"", size_bytes=data_bytes, sha256="0" * 64))
        f.truncate(SPARSE_FILE_BYTES)  # a copy that stopped before the end
    said = _read_in_small_child(cut)
    assert said.startswith("MalformedSnapshotError") and "truncated" in said, said


def test_a_header_claiming_more_than_a_snapshot_can_hold_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "huge.snap"
    file.write_bytes(backup.FILE_MAGIC + _header(b"", size_bytes=2**62, sha256="0" * 64))
    with pytest.raises(MalformedSnapshotError, match="size"):
        backup.read_file(file)


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        (lambda data: data[:-1], "truncated"),
        (lambda data: data + b"x", "size"),
        (lambda data: bytes([data[0] ^ 1]) + data[1:], "checksum"),
    ],
)
def test_a_damaged_snapshot_is_a_typed_error(tmp_path: Path, tail: object, why: str) -> None:
    data = _state()
    file = tmp_path / "damaged.snap"
    file.write_bytes(backup.FILE_MAGIC + _header(data) + tail(data))  # type: ignore[operator]
    with pytest.raises(MalformedSnapshotError, match=why):
        backup.read_file(file)


def test_a_snapshot_is_read_from_a_pipe_too(tmp_path: Path) -> None:
    """`snapshot restore <(aws s3 cp s3://bucket/backup.snap -)` passes a pipe."""
    data = _state()
    pipe = tmp_path / "fifo"
    os.mkfifo(pipe)

    def feed() -> None:
        with pipe.open("wb") as f:
            f.write(backup.FILE_MAGIC + _header(data) + data)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    header, read = backup.read_file(pipe)
    feeder.join(timeout=10)
    assert header["cluster_id"] == "saved" and read == data
