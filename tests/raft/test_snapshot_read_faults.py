"""A large snapshot whose file cannot be read any more (here: truncated by someone else while
the node holds it, as a disk's EIO under a page would be) is a typed, logged OSError where the
node reads it: restoring a state machine from it, sending it to a follower. It used to be read
through a map of the file, where such a page is a SIGBUS: the process died at once with no line
in its log. Each case runs in a process of its own, so the old behaviour kills only that.

Scripts use only calls that exist before and after the change (`bytes()` of the data,
`wal.compact`, the transport's `send`), so the same test shows the SIGBUS on the old code."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.daemon.harness import REPO

TIMEOUT_S = 120
EXIT_TYPED_ERROR = 3

# A WAL with a large snapshot (state framed as the node frames it); its file is then cut to
# one page, under the snapshot the log returned.
_STORED_THEN_TRUNCATED = """
import sys
from pathlib import Path
import msgpack
from raft.core.types import ConfState, Entry, EntryKind, HardState, Snapshot, SnapshotMeta
from raft.node import wrap_snapshot_parts
from raft.wal import WriteAheadLog

directory = Path(sys.argv[1])
wal, _ = WriteAheadLog.open(directory, fsync=False)
entries = [Entry(term=1, index=i, tm=i, kind=EntryKind.NORMAL, data=b"e") for i in range(1, 11)]
wal.append(entries, HardState(term=1, vote=1, commit=10))
state = msgpack.packb([bytes([i % 251]) * 4096 for i in range(1024)])  # ~4 MiB
meta = SnapshotMeta(index=10, term=1, tm=10, conf=ConfState(voters=(1,)))
stored = wal.compact(
    Snapshot(meta=meta, data=b""), data_parts=wrap_snapshot_parts(state, {1: ("127.0.0.1", 1)})
)
[snap_file] = directory.glob("snap-*.snap")
with open(snap_file, "r+b") as f:
    f.truncate(4096)
"""

_RESTORE = (
    _STORED_THEN_TRUNCATED
    + """
from raft.echo_node import EchoStateMachine
from raft.node import snapshot_app_data
try:
    EchoStateMachine().restore(snapshot_app_data(stored.data))
except OSError as exc:
    print(f"{type(exc).__name__}: {exc}")
    sys.exit(3)
print("restored a truncated snapshot?")
"""
)

_METASTORE_RESTORE = (
    _STORED_THEN_TRUNCATED
    + """
from metastore.state import MetastoreState
from raft.node import snapshot_app_data
try:
    MetastoreState.from_snapshot(snapshot_app_data(stored.data))
except OSError as exc:
    print(f"{type(exc).__name__}: {exc}")
    sys.exit(3)
except Exception as exc:
    print(f"not a storage error: {type(exc).__name__}: {exc}")
    sys.exit(4)
"""
)

# A leader's transport sends the truncated snapshot to a follower: the transfer is given up
# and said, and the link goes on carrying messages.
_SEND = (
    _STORED_THEN_TRUNCATED
    + """
import asyncio
import logging
from raft.core.types import Heartbeat, InstallSnapshot
from tests.raft.test_snapshot_transfer import SMALL, peer
from tests.raft.test_transport import Inbox, eventually, hb, make, mesh, running

logging.basicConfig(level=logging.ERROR, stream=sys.stdout)

async def main() -> None:
    a_inbox, b_inbox = Inbox(), Inbox()
    a, b = make(1, a_inbox, **SMALL), make(2, b_inbox, **SMALL)
    async with running(a, b):
        mesh({1: a, 2: b})
        a.send(InstallSnapshot(src=1, dst=2, term=1, snapshot=stored))
        await eventually(
            lambda: peer(a, 2).get("snapshot_transfers_unreadable", 0) == 1, "given up"
        )
        # The core's retry of the same snapshot moments later is dropped, not read (and
        # logged) again: SNAPSHOT_UNREADABLE_RETRY_MS.
        a.send(InstallSnapshot(src=1, dst=2, term=1, snapshot=stored))
        assert peer(a, 2)["snapshot_transfers_started"] == 1
        a.send(hb(1, 2, 7))
        await eventually(
            lambda: any(isinstance(m, Heartbeat) and m.commit == 7 for m in b_inbox.messages),
            "the link still carries messages",
        )
        assert not [m for m in b_inbox.messages if isinstance(m, InstallSnapshot)]
        assert peer(a, 2)["snapshot_transfers_unreadable"] == 1

asyncio.run(main())
sys.exit(3)
"""
)


def _run(script: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _assert_typed(done: subprocess.CompletedProcess[str], directory: Path) -> None:
    assert done.returncode != -signal.SIGBUS, f"killed by SIGBUS: {done.stderr[-2000:]}"
    assert done.returncode == EXIT_TYPED_ERROR, done
    assert "FileReadError" in done.stdout or "cannot be read" in done.stdout, done.stdout
    assert str(directory) in done.stdout  # the file is named
    assert "truncated" in done.stdout


def test_restoring_from_a_truncated_snapshot_file_is_a_typed_error(tmp_path: Path) -> None:
    _assert_typed(_run(_RESTORE, tmp_path), tmp_path)


def test_the_catalog_restoring_from_a_truncated_snapshot_file_gets_a_storage_error(
    tmp_path: Path,
) -> None:
    """Not MalformedSnapshotError ("not msgpack"): the snapshot is fine, the disk is not."""
    _assert_typed(_run(_METASTORE_RESTORE, tmp_path), tmp_path)


def test_sending_a_truncated_snapshot_file_gives_the_transfer_up_and_the_link_goes_on(
    tmp_path: Path,
) -> None:
    done = _run(_SEND, tmp_path)
    _assert_typed(done, tmp_path)
    assert "given up: the snapshot cannot be read" in done.stdout
