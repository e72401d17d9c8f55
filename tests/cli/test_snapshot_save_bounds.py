"""`snapshot save` reads at most the bytes the node's header announced: a node whose chunks
never say `done` (or run past the size) made the CLI loop for as long as the node answered,
growing FILE.partial without bound. Now the download stops at the size with a typed error
and leaves nothing behind. A fake node speaking the protocol; no cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
