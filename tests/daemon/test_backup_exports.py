"""The node side of `snapshot save` (`SnapshotExports`): an export holds a whole copy of the
catalog, so one its client abandoned (Ctrl-C, a lost connection) must go after its TTL even
if no other save ever starts. It was expired only by the next `begin`: a node kept the copy
for as long as it ran. No cluster: the exports object on a running event loop."""

from __future__ import annotations

import asyncio

import pytest

from metastore.daemon import backup
from metastore.daemon.backup import SnapshotExports
from metastore.errors import InvalidArgumentError
from tests.metastore._driver import Driver

WAIT_S = 10.0


async def _until(predicate: object, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 - a TTL, no event
            await asyncio.sleep(0.01)


async def test_an_abandoned_export_is_dropped_after_its_ttl_without_another_save() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE kept")
    exports = SnapshotExports(ttl_s=0.2)
    header = exports.begin(d.state, cluster_id="c", node_id=1)
    assert exports.held_bytes() == header["size_bytes"] > 0
    await _until(lambda: exports.held_bytes() == 0, "the abandoned export dropped")
    with pytest.raises(InvalidArgumentError, match="no snapshot export"):
        exports.chunk(header["export_id"], 0)


async def test_an_export_being_read_is_kept_past_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE kept")
    monkeypatch.setattr(backup, "CHUNK_BYTES", 4)  # a slow download of many pieces
    exports = SnapshotExports(ttl_s=0.3)
    header = exports.begin(d.state, cluster_id="c", node_id=1)
    loop = asyncio.get_running_loop()
    started, offset = loop.time(), 0
    while loop.time() - started < 0.9:  # three TTLs; each read renews it
        piece = exports.chunk(header["export_id"], offset)
        offset += len(piece["data"])
        assert not piece["done"]
        await asyncio.sleep(0.05)
    assert exports.held_bytes() == header["size_bytes"]
