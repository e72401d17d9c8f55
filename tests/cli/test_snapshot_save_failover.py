"""`snapshot save` when a node cannot serve it right now: `snapshot_begin` moves on to the
next endpoint when a node is not ready or lags (NOT_READY, TIMEOUT reason catch_up), and the
chunks then come from the node that began the export (no other node holds it). A chunk request
that fails with a retryable error (a dropped connection) is asked again of that same node, a
bounded number of times, instead of throwing the whole download away. Fake nodes speaking the
protocol; no cluster."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from cli import snapshot as snapshot_cli
from metastore.daemon import backup
from metastore.errors import CatchUpTimeoutError, NotReadyError
from metastore.state import MetastoreState
from tests.cli.test_cli import TOKEN, _isolated_cwd, run  # noqa: F401 - autouse fixture
from tests.client.fake_node import DropConnection, ThreadedFakeNode

STATE_BYTES = MetastoreState().to_snapshot()


@pytest.fixture(autouse=True)
def _no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_cli, "CHUNK_RETRY_PAUSE_MS", 1)


def _header(node_id: int) -> dict[str, Any]:
    return {
        "export_id": f"export-of-{node_id}",
        "cluster_id": "c",
        "node_id": node_id,
        "applied_index": 0,
        "last_tm": 0,
        "size_bytes": len(STATE_BYTES),
        "sha256": hashlib.sha256(STATE_BYTES).hexdigest(),
        "taken_at_ms": 1,
    }


class _Node:
    """A node whose `snapshot_begin` fails with `begin_error` (if any), and whose chunk
    requests fail (connection dropped, no reply) the first `chunk_drops` times."""

    def __init__(
        self, node_id: int, *, begin_error: Exception | None = None, chunk_drops: int = 0
    ) -> None:
        self.node_id = node_id
        self.begin_error = begin_error
        self.chunk_drops = chunk_drops
        self.ops: list[str] = []

    async def handler(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        self.ops.append(op)
        if op == "snapshot_begin":
            if self.begin_error is not None:
                raise self.begin_error
            return _header(self.node_id)
        assert op == "snapshot_chunk", op
        assert args["export_id"] == f"export-of-{self.node_id}", args
        if self.chunk_drops > 0:
            self.chunk_drops -= 1
            raise DropConnection
        offset = int(args["offset"])
        piece = STATE_BYTES[offset : offset + 4]
        return {"offset": offset, "data": piece, "done": offset + len(piece) >= len(STATE_BYTES)}


def _save(file: Path, *nodes: _Node) -> tuple[Any, list[_Node]]:
    fakes = [ThreadedFakeNode(node_id=n.node_id, handler=n.handler) for n in nodes]
    try:
        endpoints = ",".join(f.endpoint for f in fakes)
        result = run("--endpoints", endpoints, "--token", TOKEN, "snapshot", "save", str(file))
    finally:
        for fake in fakes:
            fake.close()
    return result, list(nodes)


@pytest.mark.parametrize(
    "begin_error",
    [
        NotReadyError("starting"),
        CatchUpTimeoutError("behind its leader", details={"lag_ms": 9000}),
    ],
    ids=["not_ready", "catch_up_timeout"],
)
def test_begin_moves_on_to_a_node_that_can_serve_and_chunks_come_from_it(
    tmp_path: Path, begin_error: Exception
) -> None:
    file = tmp_path / "catalog.snap"
    lagging, serving = _Node(1, begin_error=begin_error), _Node(2)
    result, _ = _save(file, lagging, serving)
    assert result.exit_code == 0, result.output
    assert lagging.ops == ["snapshot_begin"], lagging.ops
    assert serving.ops[0] == "snapshot_begin" and set(serving.ops[1:]) == {"snapshot_chunk"}
    header, _state = backup.read_file(file)
    assert header["node_id"] == 2


def test_a_chunk_that_failed_once_is_asked_again_of_the_same_node(tmp_path: Path) -> None:
    file = tmp_path / "catalog.snap"
    first, other = _Node(1, chunk_drops=1), _Node(2)
    result, _ = _save(file, first, other)
    assert result.exit_code == 0, result.output
    assert other.ops == [], other.ops  # the export lives on node 1 alone
    assert first.ops.count("snapshot_chunk") == len(range(0, len(STATE_BYTES), 4)) + 1
    backup.read_file(file)


def test_a_chunk_that_keeps_failing_ends_the_save_after_a_bounded_number_of_tries(
    tmp_path: Path,
) -> None:
    file = tmp_path / "catalog.snap"
    broken = _Node(1, chunk_drops=1000)
    result, _ = _save(file, broken)
    assert result.exit_code != 0, result.output
    assert "UNAVAILABLE" in result.stderr, result.stderr
    assert broken.ops.count("snapshot_chunk") == snapshot_cli.CHUNK_TRIES_MAX
    assert list(tmp_path.iterdir()) == []


def test_a_save_no_node_can_serve_says_the_way_out_of_a_lost_quorum(tmp_path: Path) -> None:
    """Every node not ready is what a survivor of a lost quorum answers (the others refuse the
    connection): the error says, besides what each node said, how to save without a leader."""
    file = tmp_path / "catalog.snap"
    behind = "node is not caught up with the current leader yet"
    result, _ = _save(
        file,
        _Node(1, begin_error=NotReadyError(behind)),
        _Node(2, begin_error=NotReadyError(behind)),
    )
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("Error: NOT_READY: snapshot_begin failed on every endpoint")
    assert "snapshot save FILE --data-dir DATA_DIR/node-N" in result.stderr, result.stderr
    assert "Losing quorum" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
