"""The daemon's state machine adapter tells the node when certificates got revoked: after
applying a RevokeCerts entry, and after restoring a snapshot that holds some (a node that
installs a snapshot must close what the list now refuses, exactly as if it had applied the
entries). Pure: no sockets, no processes."""

from __future__ import annotations

import hashlib

from metastore.commands import InitCluster, RevokeCerts, encode_command
from metastore.daemon.statemachine import CatalogStateMachine
from raft.core.types import Entry

FP = hashlib.sha256(b"a certificate").hexdigest()
TM = 1 << 40


def test_the_node_hears_of_each_revocation_and_of_a_restored_list() -> None:
    calls: list[int] = []
    sm = CatalogStateMachine()
    sm.on_revoked = lambda: calls.append(len(sm.state.revoked))
    sm.apply(
        Entry(term=1, index=1, tm=TM, data=encode_command(InitCluster(dd_ms=500, cs_max_ms=100)))
    )
    assert calls == []
    sm.apply(
        Entry(term=1, index=2, tm=TM + 1, data=encode_command(RevokeCerts(fingerprints=("x",))))
    )
    assert calls == []  # refused (not a fingerprint): nothing was revoked
    sm.apply(
        Entry(term=1, index=3, tm=TM + 2, data=encode_command(RevokeCerts(fingerprints=(FP,))))
    )
    assert calls == [1]
    snapshot = sm.snapshot()

    other = CatalogStateMachine()
    heard: list[bool] = []
    other.on_revoked = lambda: heard.append(other.state.revoked.is_revoked(FP))
    other.restore(b"")
    assert heard == []  # an empty state revokes nothing
    other.restore(snapshot)
    assert heard == [True]


def test_a_failing_hook_does_not_stop_applying() -> None:
    sm = CatalogStateMachine()

    def broken() -> None:
        raise RuntimeError("boom")

    sm.on_revoked = broken
    sm.apply(
        Entry(term=1, index=1, tm=TM, data=encode_command(InitCluster(dd_ms=500, cs_max_ms=100)))
    )
    out = sm.apply(
        Entry(term=1, index=2, tm=TM + 1, data=encode_command(RevokeCerts(fingerprints=(FP,))))
    )
    assert out.ok and sm.state.revoked.is_revoked(FP)
