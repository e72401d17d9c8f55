"""The apply version moves only to what every member's release supports, whichever way the
SetApplyVersion reaches the leader: the public `apply_version_finalize` op, or the internal
`_propose` op called directly (an admin's script, a buggy tool). Real nodes, two of them a
newer release (the same code, told it supports one version more)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import SetApplyVersion, encode_command
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

NEWER = APPLY_VERSION_SUPPORTED + 1

# A node of a newer release: this code, told it supports apply version NEWER (no rule is new
# in it, so it applies every entry as this release does).
_NEWER_RELEASE = (
    "import runpy\n"
    "import metastore.apply_version, metastore.state, metastore.daemon.server, "
    "metastore.daemon.node\n"
    "newer = metastore.apply_version.APPLY_VERSION_SUPPORTED + 1\n"
    "for m in (metastore.apply_version, metastore.state, metastore.daemon.server, "
    "metastore.daemon.node):\n"
    "    m.APPLY_VERSION_SUPPORTED = newer\n"
    "runpy.run_module('metastore.daemon', run_name='__main__', alter_sys=True)\n"
)


def _supported(c: MetastoreCluster) -> dict[int, tuple[int, int]]:
    """Per node: (the cluster's apply version as it applied it, what its release supports)."""
    out = {}
    for n in c.ids:
        st = c.try_status(n)
        assert st is not None, (n, c.log_tails())
        out[n] = (st["apply_version"], st["apply_version_supported"])
    return out


def _lead_from_one_of(c: MetastoreCluster, wanted: set[int]) -> int:
    """Move leadership into `wanted` (bounded); returns the leader."""
    deadline = time.monotonic() + 30
    leader = c.wait_ready()
    while leader not in wanted:
        assert time.monotonic() < deadline, f"leader stays {leader}\n{c.log_tails()}"
        admin = c.client(leader)
        admin.call("transfer_leader", target=min(wanted))
        admin.close()
        leader = c.wait_ready()
    return leader


def test_propose_refuses_an_apply_version_a_member_does_not_support(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path) as c:
        c.start_all()
        c.wait_ready()
        # A rolling upgrade, half done: nodes 1 and 2 run the newer release, node 3 not yet.
        for n in (1, 2):
            assert c.terminate(n) == 0
            c.start(n, python_code=_NEWER_RELEASE)
            c.wait_ready()
        assert _supported(c) == {
            1: (APPLY_VERSION_SUPPORTED, NEWER),
            2: (APPLY_VERSION_SUPPORTED, NEWER),
            3: (APPLY_VERSION_SUPPORTED, APPLY_VERSION_SUPPORTED),
        }
        # The leader supports NEWER itself: only the member check can refuse.
        leader = _lead_from_one_of(c, {1, 2})

        admin = c.client(leader)
        cmd = encode_command(SetApplyVersion(version=NEWER))
        r = admin.call("_propose", command=cmd, timeout_ms=10_000)
        admin.close()
        assert not r["ok"], f"accepted: node 3 would stop on applying it ({r})"
        assert r["error"]["code"] == "INVALID_ARGUMENT", r
        assert r["error"]["details"]["nodes"] == [3], r
        assert "upgrade" in r["error"]["message"], r
        # Nothing moved, and node 3 still runs.
        assert c.procs[3].poll() is None, c.log_tails()
        assert {n: v for n, (v, _) in _supported(c).items()} == dict.fromkeys(
            c.ids, APPLY_VERSION_SUPPORTED
        )

        # Upgrade finished: `cluster version --finalize` through a follower (which forwards
        # its SetApplyVersion through `_propose`) still moves the cluster.
        assert c.terminate(3) == 0
        c.start(3, python_code=_NEWER_RELEASE)
        leader = c.wait_ready()
        follower = next(n for n in c.ids if n != leader)
        cl = c.client(follower)
        done = cl.call("apply_version_finalize", timeout_ms=10_000)
        cl.close()
        assert done["ok"], done
        assert (done["result"]["apply_version"], done["result"]["changed"]) == (NEWER, True)
        deadline = time.monotonic() + 10
        while {v for v, _ in _supported(c).values()} != {NEWER}:
            assert time.monotonic() < deadline, _supported(c)
            time.sleep(0.1)
