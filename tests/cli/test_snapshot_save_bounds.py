"""`snapshot save` reads at most the bytes the node's header announced: a node whose chunks
never say `done` (or run past the size) made the CLI loop for as long as the node answered,
growing FILE.partial without bound. Now the download stops at the size with a typed error
and leaves nothing behind. A fake node speaking the protocol; no cluster."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from metastore.errors import UnavailableError
from tests.cli.test_cli import _isolated_cwd, against  # noqa: F401 - autouse fixture
from tests.client.fake_node import ThreadedFakeNode

SIZE_BYTES = 8
PIECE = b"abcd"
# The fake says `done` at last after this many chunks, so a CLI without the bound still ends.
CHUNKS_BEFORE_DONE = 20


def test_a_download_that_runs_past_its_size_is_refused(tmp_path: Path) -> None:
    chunks: list[int] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "snapshot_begin":
            return {
                "export_id": "e1",
                "cluster_id": "c",
                "node_id": 1,
                "applied_index": 3,
                "last_tm": 5,
                "size_bytes": SIZE_BYTES,
                "sha256": "0" * 64,
                "taken_at_ms": 1,
            }
        assert op == "snapshot_chunk"
        chunks.append(args["offset"])
        return {
            "offset": args["offset"],
            "data": PIECE,
            "done": len(chunks) >= CHUNKS_BEFORE_DONE,
        }

    file = tmp_path / "catalog.snap"
    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "snapshot", "save", str(file))
    assert result.exit_code != 0, result.output
    assert "MALFORMED_SNAPSHOT" in result.stderr and "size" in result.stderr, result.stderr
    assert chunks == [0, 4], chunks  # it stopped once it held the announced size
    assert list(tmp_path.iterdir()) == []


def test_a_second_save_to_the_same_file_while_one_runs_is_refused(tmp_path: Path) -> None:
    """Two saves to one FILE (a backup job that overlaps the next run) shared FILE.partial:
    the second truncated the first's download under it, and whichever failed first deleted
    the other's file. A save now holds a lock on its .partial; a second one is refused before
    it asks any node for anything, and the first's bytes are untouched."""
    ops: list[str] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        ops.append(op)
        raise UnavailableError("no request expected")

    file = tmp_path / "catalog.snap"
    partial = tmp_path / "catalog.snap.partial"
    partial.write_bytes(b"the first save's bytes")
    fd = os.open(partial, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first save, still running
        with ThreadedFakeNode(handler=handler) as node:
            result = against(node, "snapshot", "save", str(file))
    finally:
        os.close(fd)
    assert result.exit_code == 5, result.output
    assert "another" in result.stderr and str(partial) in result.stderr, result.stderr
    assert ops == []
    assert partial.read_bytes() == b"the first save's bytes" and not file.exists()
