"""Apply version 9's refusals on real daemons (metastore.apply_version): the leader refuses the
bad input before proposing while the cluster still applies version 8's rules (a node of an
older release would apply it), and from 9 apply refuses it too.

A 3-node cluster of this code told it supports apply version 8 (so it starts at 8), then
upgraded in place: every node restarted on this release and the version finalized to 9.
What each step would catch: a writer releasing another client's protection through the
internal `_propose` op; a retried txn id with another ts answered as a success; a NUL in a
comment, request id or protection meta stored; the owner's release through a follower (a
forwarded command) refused by the new check; after the upgrade, a retry of a commit with
another read set answered as a success.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.commands import (
    CreateNamespace,
    Protect,
    ReleaseProtection,
    TableName,
    encode_command,
)
from metastore.errors import ForbiddenError, InvalidArgumentError, TxnIdReusedError
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

# This code, told it supports apply version 8 only: the release before version 9's rules.
_RELEASE_8 = (
    "import runpy\n"
    "import metastore.apply_version, metastore.state, metastore.daemon.server, "
    "metastore.daemon.node\n"
    "for m in (metastore.apply_version, metastore.state, metastore.daemon.server, "
    "metastore.daemon.node):\n"
    "    m.APPLY_VERSION_SUPPORTED = 8\n"
    "runpy.run_module('metastore.daemon', run_name='__main__', alter_sys=True)\n"
)


def _client(
    c: MetastoreCluster, name: str, *, role: str = "writer", nodes: list[int] | None = None
) -> SyncMetastoreClient:
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in (nodes or c.ids)]
    return SyncMetastoreClient(endpoints, c.token(role), client_name=name)


def _writes(path: str) -> list[dict[str, object]]:
    add = [{"path": path, "size_bytes": 1, "row_count": 1}]
    return [{"table": "ns.t", "schema_version": 1, "add": add}]


def _refuses_nul(exc: pytest.ExceptionInfo[InvalidArgumentError]) -> bool:
    return exc.value.details.get("reason") == "nul_character"


def test_bad_input_is_refused_before_proposing_at_8_and_by_apply_from_9(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path) as c:
        for n in c.ids:
            c.start(n, python_code=_RELEASE_8)
        leader = c.wait_ready()
        follower = next(n for n in c.ids if n != leader)
        alice = _client(c, "alice")
        bob = _client(c, "bob", nodes=[leader])  # `_propose` runs on the leader only
        admin = _client(c, "admin", role="admin")
        try:
            assert admin.apply_version()["apply_version"] == 8
            alice.ddl("CREATE NAMESPACE ns")
            alice.ddl("CREATE TABLE ns.t (a INT)")
            ns_t = TableName.parse("ns.t")

            # 1. Another client's protection, released through `_propose`.
            record = alice.protect(alice.clock.now(), tables=["ns.t"])
            record_id, created_by = record["record_id"], record["created_by"]
            for by in (created_by, "bob"):  # naming the creator, or itself
                cmd = ReleaseProtection(record_id=record_id, by=by)
                with pytest.raises(ForbiddenError, match="admin role"):
                    bob.call("_propose", {"command": encode_command(cmd)})
            assert alice.protection(record_id)["released"] is False
            # The creator's own release through a follower (forwarded to the leader) works.
            with _client(c, "alice", nodes=[follower]) as alice_on_follower:
                assert alice_on_follower.release_protection(record_id)["released"] is True
                # A protection naming another creator, sent through `_propose`, is refused
                # (it was applied: alice could then release bob's record as its creator);
                # alice's own through a follower (forwarded, so the leader's caller is the
                # link) still goes, named alice.
                theirs = Protect(
                    record_id="bobs", ts=bob.clock.now(), tables=(ns_t,), created_by=created_by
                )
                with pytest.raises(ForbiddenError, match="'created_by' must name the caller"):
                    bob.call("_propose", {"command": encode_command(theirs)})
                assert "bobs" not in [r["record_id"] for r in admin.protections()["records"]]
                mine = alice_on_follower.protect(alice.clock.now(), tables=["ns.t"])
                assert mine["created_by"] == created_by
                assert alice_on_follower.release_protection(mine["record_id"])["released"]

            # 2. A retried txn id asking for another ts.
            first = alice.commit("txn-1", _writes("f1"))
            with pytest.raises(TxnIdReusedError) as reused:
                alice.commit("txn-1", _writes("f1"), ts=first["ts"] + (5 << 16))
            assert reused.value.details["committed_ts"] == first["ts"]
            again = alice.commit("txn-1", _writes("f1"))
            assert again["deduplicated"] is True and again["ts"] == first["ts"]

            # 3. NUL characters: a DDL comment, a request id, a protection's meta, and a
            # command sent through `_propose` itself.
            with pytest.raises(InvalidArgumentError) as nul:
                alice.ddl("CREATE NAMESPACE n2 COMMENT 'a\\0b'")
            assert _refuses_nul(nul)
            with pytest.raises(InvalidArgumentError) as nul:
                alice.ddl("ALTER TABLE ns.t ALTER COLUMN a COMMENT 'x\\0'")
            assert _refuses_nul(nul)
            with pytest.raises(InvalidArgumentError) as nul:
                alice.call("ddl", {"sql": "CREATE NAMESPACE n3", "request_id": "r\0"})
            assert _refuses_nul(nul)
            with pytest.raises(InvalidArgumentError) as nul:
                alice.protect(alice.clock.now(), tables=["ns.t"], meta="{\0}")
            assert _refuses_nul(nul)
            cmd_ns = CreateNamespace(namespace="n4", comment="\0")
            with pytest.raises(InvalidArgumentError) as nul:
                bob.call("_propose", {"command": encode_command(cmd_ns)})
            assert _refuses_nul(nul)
            names = [n["name"] for n in alice.list_namespaces()["namespaces"]]
            assert names == ["ns"]
            assert "\0" not in str(alice.describe("ns.t"))
        finally:
            for cl in (alice, bob, admin):
                cl.close()

        # The upgrade: every node restarted on this release, then the version finalized.
        for n in c.ids:
            c.terminate(n)
            c.start(n)
            c.wait_ready(among=[n])
        c.wait_ready()
        alice = _client(c, "alice")
        admin = _client(c, "admin", role="admin")
        try:
            assert admin.finalize_apply_version()["apply_version"] == 9
            # The commit recorded at 8 (its writes' digest alone): another ts still refused.
            with pytest.raises(TxnIdReusedError):
                alice.commit("txn-1", _writes("f1"), ts=first["ts"] + (5 << 16))
            # From 9 a commit's whole request is recorded: a retry with another read set
            # (which the leader does not check before proposing) is refused by apply.
            read_ts = alice.commit("txn-0", _writes("f0"))["ts"]
            second = alice.commit("txn-2", _writes("f2"), read_ts=read_ts, read_tables=["ns.t"])
            with pytest.raises(TxnIdReusedError):
                alice.commit("txn-2", _writes("f2"))
            again = alice.commit("txn-2", _writes("f2"), read_ts=read_ts, read_tables=["ns.t"])
            assert again["deduplicated"] is True and again["ts"] == second["ts"]
        finally:
            alice.close()
            admin.close()
