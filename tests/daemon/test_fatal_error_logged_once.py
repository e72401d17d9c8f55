"""A node stopping on a fatal error says the error once: raft.node logs it as it happens (a
storage error as its one line naming the file and errno; any other error with its traceback),
and the daemon, told through `on_fatal`, does not repeat it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from metastore.daemon.config import load_node_config
from metastore.daemon.node import MetastoreNode, serve
from metastore.daemon.secrets import ensure_secrets
from raft.wal import WalError
from tests.daemon.harness import write_cluster

DISK_FULL = "write of /data/wal/wal-0000000000000001.log: No space left on device (ENOSPC)"


@pytest.mark.parametrize("error", [WalError(DISK_FULL), RuntimeError("apply broke")])
def test_a_fatal_error_is_logged_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    config = write_cluster(tmp_path, n=1)
    settings = load_node_config(config, 1)
    ensure_secrets(settings.cluster.secrets_dir)
    real_start = MetastoreNode.start

    async def start_then_fail(node: MetastoreNode) -> None:
        await real_start(node)

        async def failing_drain() -> None:
            raise error

        node.raft._drain = failing_drain  # type: ignore[method-assign]
        node.raft._wake.set()

    monkeypatch.setattr(MetastoreNode, "start", start_then_fail)
    caplog.set_level(logging.INFO)
    assert asyncio.run(asyncio.wait_for(serve(settings, bootstrap=True), 60)) == 1
    told = [
        r
        for r in caplog.records
        if str(error) in r.getMessage() or (r.exc_info is not None and r.exc_info[1] is error)
    ]
    assert len(told) == 1, [f"{r.name}: {r.getMessage()}" for r in told]
    assert told[0].levelno == logging.CRITICAL
    assert told[0].name == "raft.node"
    # A storage error: one line, no traceback; any other: its traceback.
    assert (told[0].exc_info is None) == isinstance(error, WalError)
    assert str(error) in told[0].getMessage()  # the line itself says what failed
