"""A member's data directory carries its identity (IDENTITY: cluster id and node id, written at
its first start). A member whose data directory is empty - its data was lost - must not come
back as a fresh voter (term 0, no vote: it could vote twice in a term it voted in before): it
refuses to start unless this is its first start (`new_member`). A data directory of another
cluster or node is refused too; one written before identities existed is adopted."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

import raft.node
from hlc import HybridClock, SystemClock
from raft.errors import NodeIdentityError, NodeStateWriteError
from raft.node import IDENTITY_FILE, NodeConfig, RaftNode
from tests.raft.test_node import SECRET, ListStateMachine, free_ports


def _config(tmp_path: Path, **kw: object) -> NodeConfig:
    port = free_ports(1)[0]
    base = NodeConfig(
        node_id=1,
        cluster_id="c1",
        data_dir=tmp_path / "n1",
        listen_host="127.0.0.1",
        listen_port=port,
        peers={1: ("127.0.0.1", port)},
        secret=SECRET,
        election_timeout_ms=100,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


async def _start_stop(cfg: NodeConfig, *, until_leader: bool = False) -> RaftNode:
    node = RaftNode(cfg, ListStateMachine(), clock=HybridClock(SystemClock()), rng=random.Random(1))
    await node.start()
    deadline = time.monotonic() + 10
    while until_leader and not node.is_leader():
        assert time.monotonic() < deadline, "the single node did not elect itself"
        await asyncio.sleep(0.01)
    await node.stop()
    return node


async def test_an_empty_data_directory_is_refused_unless_it_is_the_first_start(
    tmp_path: Path,
) -> None:
    with pytest.raises(NodeIdentityError, match="remove it from the cluster"):
        await _start_stop(_config(tmp_path, new_member=False))
    assert not (tmp_path / "n1" / IDENTITY_FILE).exists()
    await _start_stop(_config(tmp_path, new_member=True))
    identity = json.loads((tmp_path / "n1" / IDENTITY_FILE).read_text())
    assert (identity["cluster_id"], identity["node_id"]) == ("c1", 1)
    await _start_stop(_config(tmp_path, new_member=False))  # a restart: it has its identity


async def test_a_wiped_member_is_refused_even_if_its_directory_is_recreated(
    tmp_path: Path,
) -> None:
    await _start_stop(_config(tmp_path, new_member=True))
    for path in sorted((tmp_path / "n1").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    with pytest.raises(NodeIdentityError):
        await _start_stop(_config(tmp_path, new_member=False))


@pytest.mark.parametrize("field", ["cluster_id", "node_id"])
async def test_another_members_data_directory_is_refused(tmp_path: Path, field: str) -> None:
    await _start_stop(_config(tmp_path, new_member=True))
    other = {"cluster_id": "c2"} if field == "cluster_id" else {"node_id": 2}
    cfg = _config(tmp_path, new_member=True, **other)
    if field == "node_id":
        cfg = dataclasses.replace(cfg, peers={2: cfg.peers[1]})
    with pytest.raises(NodeIdentityError, match="belongs to"):
        await _start_stop(cfg)


async def test_a_log_from_before_identities_is_adopted(tmp_path: Path) -> None:
    await _start_stop(_config(tmp_path, new_member=True), until_leader=True)  # term, vote, log
    (tmp_path / "n1" / IDENTITY_FILE).unlink()  # as written by an older version
    await _start_stop(_config(tmp_path, new_member=False))
    assert (tmp_path / "n1" / IDENTITY_FILE).exists()


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
async def test_an_identity_the_disk_cannot_hold_is_a_typed_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A full disk (or a failing one) at the first start: one error naming the file and the
    errno (the daemon prints it as one line), the log's lock released, and a start once the
    disk has room succeeds. Before: a bare OSError (a write's names no file) escaped as a
    traceback, and the log stayed locked in that process."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    cfg = _config(tmp_path, new_member=True)
    if step == "write":
        real_write_text = Path.write_text

        def write_text(self: Path, *args: Any, **kwargs: Any) -> int:
            if self.name.startswith(IDENTITY_FILE):
                raise full
            return real_write_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", write_text)
    elif step == "fsync":
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(f"{IDENTITY_FILE}.tmp"):
                raise full
            real_fsync(fd)

        monkeypatch.setattr(raft.node.os, "fsync", fsync)
    else:
        monkeypatch.setattr(raft.node.os, "replace", lambda *_a: (_ for _ in ()).throw(full))
    with pytest.raises(NodeStateWriteError) as caught:
        await _start_stop(cfg)
    assert str(tmp_path / "n1" / IDENTITY_FILE) in str(caught.value)
    assert "ENOSPC" in str(caught.value)
    assert caught.value.code == "node_state_unwritable"
    assert not (tmp_path / "n1" / IDENTITY_FILE).exists()
    monkeypatch.undo()
    await _start_stop(cfg)  # the log's lock was released; the retry writes the identity
    identity = json.loads((tmp_path / "n1" / IDENTITY_FILE).read_text())
    assert identity["node_id"] == 1
