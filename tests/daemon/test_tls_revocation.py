"""Certificate revocation with real daemon processes on 127.0.0.1 and mutual TLS on.

One 3-node TLS cluster serves the module. The scenario follows the product's rules:

* `cluster remove-node 3` revokes the certificate node 3 presented to the leader; every node
  applies the revocation through the log.
* Node 3, added back with a fresh data directory but its OLD certificate (signed by the cluster
  CA, named node-3, and holding the cluster secret), is refused by every member, the members
  count and log it, and node 3's own log says why.
* Node 3 with a NEW certificate of the same CA rejoins and catches up, and learns the list.
* A backup (`snapshot save`) carries the list, and a cluster restored from it refuses the
  certificate too.
* Rotation of a live member: `cluster revoke-cert` closes the links that use the certificate at
  once; the member restarted on a new certificate rejoins.

Every test fails without the feature (the old certificate would be accepted). Processes are
killed by PID only; every wait is bounded.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metastore.daemon.certs import GeneratedCerts, generate_dev_certs, issue_node_certs
from raft.tls import client_context
from tests.daemon.harness import MetastoreCluster, run_cli, tls_cluster, tls_table, write_cluster

pytestmark = pytest.mark.slow

SNAPSHOT_EVERY = 100  # the configuration's minimum
WAIT_S = 40.0


def fingerprint(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> GeneratedCerts:
    return generate_dev_certs(tmp_path_factory.mktemp("tls"), node_ids=[1, 2, 3])


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: GeneratedCerts
) -> Iterator[MetastoreCluster]:
    # Small snapshots and no entries kept behind them: a node that joins late gets the catalog
    # (and the revocation list) as a Raft snapshot, not as log entries.
    config = write_cluster(
        tmp_path_factory.mktemp("revoke-cluster"),
        3,
        snapshot_every_entries=SNAPSHOT_EVERY,
        snapshot_keep_entries=0,
    )
    # Client ports require a client certificate: so those identify something, and are
    # checked against the list too.
    c = tls_cluster(config, certs, client_cert_required=True)
    try:
        c.start_all()
        c.wait_ready(timeout_s=60)
        yield c
    finally:
        c.stop_all()


def cli(
    c: MetastoreCluster, *args: str, nodes: list[int] | None = None
) -> subprocess.CompletedProcess[str]:
    """`metastore ARGS` against `c` (or its `nodes`) with the client certificate, in this
    process (harness.run_cli)."""
    tls_dir = c.config.read_text().split('ca_file = "')[1].split("/ca.crt")[0]
    env = {"METASTORE_CERT": f"{tls_dir}/client.crt", "METASTORE_KEY": f"{tls_dir}/client.key"}
    env |= {
        "METASTORE_ENDPOINTS": ",".join(f"127.0.0.1:{c.client_ports[i]}" for i in (nodes or c.ids)),
        "METASTORE_TOKEN_FILE": str(c.dir / "secrets" / "admin.token"),
    }
    return run_cli(*args, env=env)


def tls_cli(c: MetastoreCluster, ca: Path, *args: str, nodes: list[int] | None = None) -> Any:
    return cli(c, "--cacert", str(ca), *args, nodes=nodes)


def call(c: MetastoreCluster, node_id: int, op: str, **args: Any) -> dict[str, Any]:
    client = c.client(node_id)
    try:
        reply = client.call(op, **args)
    finally:
        client.close()
    assert reply["ok"], reply
    result: dict[str, Any] = reply["result"]
    return result


def wait_until(what: str, predicate: Any, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, AssertionError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def log_of(c: MetastoreCluster, node_id: int) -> str:
    return (c.dir / f"stdout-{node_id}.log").read_text(errors="replace")


def metric(c: MetastoreCluster, node_id: int, name: str) -> float:
    url = f"http://127.0.0.1:{c.metrics_ports[node_id]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def revoked_on(c: MetastoreCluster, node_id: int) -> set[str]:
    return {r["fingerprint"] for r in call(c, node_id, "cert_revoked")["revoked"]}


def replace_cert(certs: GeneratedCerts, node_id: int, new_dir: Path) -> tuple[Path, Path]:
    """Issue node `node_id` a new certificate of the same CA and put it where the config
    points; returns the old certificate's copy (cert, key) for the test to reuse."""
    cert, key = certs.node_certs[node_id]
    old_dir = new_dir / "old"
    old_dir.mkdir(parents=True)
    old = (old_dir / cert.name, old_dir / key.name)
    shutil.copy2(cert, old[0])
    shutil.copy2(key, old[1])
    new_cert, new_key = issue_node_certs(certs.ca_cert.parent, new_dir, node_ids=[node_id])[node_id]
    shutil.copy2(new_cert, cert)
    shutil.copy2(new_key, key)
    return old


def restore_cert(certs: GeneratedCerts, node_id: int, old: tuple[Path, Path]) -> None:
    shutil.copy2(old[0], certs.node_certs[node_id][0])
    shutil.copy2(old[1], certs.node_certs[node_id][1])


def wipe(c: MetastoreCluster, node_id: int) -> None:
    shutil.rmtree(c.dir / "data" / f"node-{node_id}", ignore_errors=True)


def test_a_removed_nodes_certificate_is_refused_and_a_new_one_rejoins(
    cluster: MetastoreCluster, certs: GeneratedCerts, tmp_path: Path
) -> None:
    ca = certs.ca_cert
    old_fp = fingerprint(certs.node_certs[3][0])
    leader = cluster.wait_ready()
    if leader == 3:
        moved = tls_cli(cluster, ca, "cluster", "transfer-leader", "1")
        assert moved.returncode == 0, moved.stderr
        leader = cluster.wait_ready()
    assert tls_cli(cluster, ca, "sql", "CREATE NAMESPACE before_removal").returncode == 0

    removed = tls_cli(cluster, ca, "-o", "json", "cluster", "remove-node", "3")
    assert removed.returncode == 0, removed.stderr
    assert old_fp in json.loads(removed.stdout)["revoked"], removed.stdout
    cluster.kill(3)
    for i in (1, 2):
        wait_until(f"node {i} applied the revocation", lambda i=i: old_fp in revoked_on(cluster, i))
    listed = tls_cli(cluster, ca, "-o", "json", "cluster", "revoked", nodes=[1, 2])
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)["revoked"]
    assert (entry["fingerprint"], entry["node_id"], entry["reason"]) == (old_fp, 3, "removed")
    human = tls_cli(cluster, ca, "cluster", "revoked", nodes=[1, 2])
    assert old_fp in human.stdout, human.stdout
    status = tls_cli(cluster, ca, "-o", "json", "cluster", "status", nodes=[1, 2])
    assert [e["result"]["revoked_certs"] for e in json.loads(status.stdout)] == [1, 1], status
    assert metric(cluster, 1, "metastore_revoked_certificates") == 1
    # Enough entries after the revocation that every node snapshots past it.
    revoked_at = call(cluster, leader, "status")["applied_index"]
    pad = cluster.client(leader)
    try:
        for n in range(SNAPSHOT_EVERY + 10):
            assert pad.call("session_open", session_id=f"pad-{n}")["ok"]
    finally:
        pad.close()
    wait_until(
        "the leader snapshotted past the revocation",
        lambda: call(cluster, leader, "status")["log_start_index"] > revoked_at,
    )

    # Back as a new member with a fresh data directory but the revoked certificate.
    wipe(cluster, 3)
    raft_addr = _raft_address(cluster, 3)
    added = tls_cli(cluster, ca, "cluster", "add-node", "3", raft_addr, nodes=[1, 2])
    assert added.returncode == 0, added.stderr
    refused_before = sum(
        metric(cluster, i, "metastore_peer_tls_revoked_refused_total") for i in (1, 2)
    )
    cluster.start(3, bootstrap=True)
    wait_until(
        "node 3 logs that its peers refuse its revoked certificate",
        lambda: "refused this node" in log_of(cluster, 3) and old_fp in log_of(cluster, 3),
    )
    wait_until(
        "the members log and count the refusal",
        lambda: (
            any(f"{old_fp}) is revoked" in log_of(cluster, i) for i in (1, 2))
            and sum(metric(cluster, i, "metastore_peer_tls_revoked_refused_total") for i in (1, 2))
            > refused_before
        ),
    )
    time.sleep(2)  # give it every chance to catch up: it must not
    status = cluster.try_status(3)
    assert status is not None and not status["initialized"], status
    cluster.kill(3)

    # A new certificate of the same CA for the same node id: accepted.
    wipe(cluster, 3)
    replace_cert(certs, 3, tmp_path / "new-3")
    assert fingerprint(certs.node_certs[3][0]) != old_fp
    cluster.start(3, bootstrap=True)
    cluster.wait_ready(timeout_s=60)
    wait_until(
        "node 3 caught up, with the revocation list",
        lambda: "before_removal" in _namespaces(cluster, 3) and old_fp in revoked_on(cluster, 3),
    )
    # It got them from a Raft snapshot taken after the revocation (no entries were kept).
    assert call(cluster, 3, "status")["log_start_index"] > revoked_at


def test_a_backup_carries_the_list_and_a_node_restored_from_it_knows_it(
    cluster: MetastoreCluster, certs: GeneratedCerts, tmp_path: Path
) -> None:
    from metastore.daemon.backup import read_file
    from metastore.state import MetastoreState

    ca = certs.ca_cert
    # Its own revocation (any order, or alone): a certificate of the CA that nothing uses.
    spare_cert, _ = issue_node_certs(ca.parent, tmp_path / "spare", node_ids=[8])[8]
    spare = fingerprint(spare_cert)
    done = tls_cli(cluster, ca, "cluster", "revoke-cert", str(spare_cert), "--node-id", "8")
    assert done.returncode == 0, done.stderr
    for i in cluster.procs:
        wait_until(f"node {i} applied the revocation", lambda i=i: spare in revoked_on(cluster, i))
    revoked = revoked_on(cluster, 1)
    file = tmp_path / "catalog.snap"
    saved = tls_cli(cluster, ca, "snapshot", "save", str(file))
    assert saved.returncode == 0, saved.stderr
    _, data = read_file(file)
    assert {r.fingerprint for r in MetastoreState.from_snapshot(data).revoked.entries()} == revoked

    # A one-node TLS cluster restored from it (the restored node checks peers against it).
    target = write_cluster(tmp_path / "restored", 1, cluster_id="restored")
    restored_certs = generate_dev_certs(tmp_path / "restored-tls", node_ids=[1])
    with target.open("a") as f:
        f.write(tls_table(restored_certs.ca_cert.parent))
    done = run_cli("snapshot", "restore", str(file), "--config", str(target.parent))
    assert done.returncode == 0, done.stderr
    restored = MetastoreCluster(target)
    restored.client_ssl = client_context(ca_file=restored_certs.ca_cert)
    try:
        restored.start(1, bootstrap=False)
        restored.wait_ready(timeout_s=60)
        assert revoked_on(restored, 1) == revoked
    finally:
        restored.stop_all()


def test_rotating_a_live_members_certificate_closes_its_links_at_once(
    cluster: MetastoreCluster, certs: GeneratedCerts, tmp_path: Path
) -> None:
    ca = certs.ca_cert
    leader = cluster.wait_ready(timeout_s=60)
    victim = next(i for i in (2, 1) if i != leader)
    old_fp = fingerprint(certs.node_certs[victim][0])
    closed_before = metric(cluster, leader, "metastore_peer_tls_revoked_closed_total")

    # Bad input changes nothing.
    bad = tls_cli(cluster, ca, "cluster", "revoke-cert", "--fingerprint", "abc")
    assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr, bad.stderr
    missing = tls_cli(cluster, ca, "cluster", "revoke-cert", str(tmp_path / "none.crt"))
    assert missing.returncode == 4 and "FILE_NOT_FOUND" in missing.stderr, missing.stderr
    raw = cluster.client(leader)
    try:
        for bad_args, code in (
            ({"fingerprint": "zz"}, "INVALID_ARGUMENT"),
            ({"fingerprint": 123}, "BAD_REQUEST"),
            ({}, "BAD_REQUEST"),
        ):
            reply = raw.call("cert_revoke", **bad_args)
            assert not reply["ok"] and reply["error"]["code"] == code, (bad_args, reply)
    finally:
        raw.close()
    assert old_fp not in revoked_on(cluster, leader)

    args = ["cluster", "revoke-cert", str(certs.node_certs[victim][0]), "--node-id", str(victim)]
    # The victim presents it on live links: refused unless forced (it would be cut off).
    in_use = tls_cli(cluster, ca, *args)
    assert in_use.returncode == 5 and "in use by node(s)" in in_use.stderr, in_use.stderr
    assert old_fp not in revoked_on(cluster, leader)
    # Through the victim: it forwards the request to the leader on a connection that presents
    # the very certificate revoked, and the reply must still come back on it.
    revoked = tls_cli(cluster, ca, "-o", "json", *args, "--force", nodes=[victim, leader])
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout)["revoked"] == [old_fp]
    # Audited like every admin op, with the fingerprint and the outcome.
    audits = [
        json.loads(line)
        for i in cluster.ids
        if (cluster.dir / "data" / f"node-{i}" / "audit.log").exists()
        for line in (cluster.dir / "data" / f"node-{i}" / "audit.log").read_text().splitlines()
    ]
    assert any(
        a.get("op") == "cert_revoke" and a.get("outcome") == "OK" and old_fp in json.dumps(a)
        for a in audits
    ), audits[-5:]
    wait_until(
        "the leader closed the links that used the certificate",
        lambda: metric(cluster, leader, "metastore_peer_tls_revoked_closed_total") > closed_before,
    )
    # The victim may never apply the entry (the links it would learn it on are closed), but
    # its peers tell it why they refuse it: its log says so.
    wait_until(
        "the victim logs that its peers refuse its revoked certificate",
        lambda: (
            old_fp
            in "".join(
                line for line in log_of(cluster, victim).splitlines() if "refused this node" in line
            )
        ),
    )
    # Restarted on a new certificate of the same CA, it is a member again.
    cluster.kill(victim)
    replace_cert(certs, victim, tmp_path / f"new-{victim}")
    cluster.start(victim, bootstrap=False)
    cluster.wait_ready(timeout_s=60)
    assert tls_cli(cluster, ca, "sql", "CREATE NAMESPACE after_rotation").returncode == 0
    wait_until("the victim caught up", lambda: "after_rotation" in _namespaces(cluster, victim))


def _raft_address(c: MetastoreCluster, node_id: int) -> str:
    text = c.config.read_text()
    node = 0
    for line in text.splitlines():
        if line.startswith("id = "):
            node = int(line.split("=")[1])
        elif line.startswith("raft_port") and node == node_id:
            return f"127.0.0.1:{int(line.split('=')[1])}"
    raise AssertionError(f"no node {node_id} in {c.config}")


def _namespaces(c: MetastoreCluster, node_id: int) -> set[str]:
    result = call(c, node_id, "list_namespaces")
    return {n["name"] for n in result["namespaces"]}


def test_a_revoked_client_certificate_is_refused_and_its_connections_closed(
    cluster: MetastoreCluster, certs: GeneratedCerts, tmp_path: Path
) -> None:
    from tests.daemon.harness import RawClient

    ca = certs.ca_cert
    # Another certificate of the cluster CA (a leaked one), used as a client certificate.
    leaked_cert, leaked_key = issue_node_certs(ca.parent, tmp_path, node_ids=[7])[7]
    leaked = client_context(ca_file=ca, cert_file=leaked_cert, key_file=leaked_key)
    node = cluster.wait_ready(timeout_s=60)
    open_conn = RawClient(cluster.client_ports[node], ssl_context=leaked)
    try:
        assert open_conn.call("hello", token=cluster.token(), client="leaked")["ok"]
        revoked = tls_cli(cluster, ca, "cluster", "revoke-cert", str(leaked_cert))
        assert revoked.returncode == 0, revoked.stderr
        wait_until("the open connection is closed", lambda: open_conn.is_closed(wait_s=0.5))
    finally:
        open_conn.close()
    again = RawClient(cluster.client_ports[node], ssl_context=leaked)
    try:
        reply = again.call("hello", token=cluster.token(), client="leaked")
        assert reply["ok"] is False and reply["error"]["code"] == "TLS_FAILED", reply
        assert "revoked" in reply["error"]["message"]
    finally:
        again.close()
    assert "its TLS certificate (sha256 " in log_of(cluster, node)
    assert cluster.try_status(node) is not None  # the project's own client certificate: fine


def _node_3_a_learner(cluster: MetastoreCluster, certs: GeneratedCerts, tmp_path: Path) -> None:
    """Node 3 running as a learner on a certificate that is not revoked: what the first test
    leaves (then nothing to do), made here when this module's tests run alone or in another
    order. Node 3 is removed if it is a member (which revokes its certificate), then added back
    with a fresh data directory and a new certificate of the same CA."""
    leader = cluster.wait_ready(timeout_s=60)
    status = call(cluster, leader, "status")
    current = fingerprint(certs.node_certs[3][0])
    if (
        status["learners"] == [3]
        and 3 in cluster.procs
        and current not in revoked_on(cluster, leader)
        and cluster.try_status(3) is not None
    ):
        return
    ca = certs.ca_cert
    if leader == 3:
        moved = tls_cli(cluster, ca, "cluster", "transfer-leader", "1")
        assert moved.returncode == 0, moved.stderr
        leader = cluster.wait_ready(timeout_s=60)
    if 3 in status["voters"] or 3 in status["learners"]:
        removed = tls_cli(cluster, ca, "cluster", "remove-node", "3", nodes=[1, 2])
        assert removed.returncode == 0, removed.stderr
    cluster.kill(3)
    wipe(cluster, 3)
    replace_cert(certs, 3, tmp_path / "fresh-3")
    address = _raft_address(cluster, 3)
    added = tls_cli(cluster, ca, "cluster", "add-node", "3", address, nodes=[1, 2])
    assert added.returncode == 0, added.stderr
    cluster.start(3, bootstrap=True)
    cluster.wait_ready(timeout_s=60)
    wait_until(
        "node 3 is a learner and caught up",
        lambda: (
            call(cluster, 2, "status")["learners"] == [3]
            and bool(call(cluster, 3, "status")["initialized"])
        ),
    )


def test_a_removal_revokes_what_another_member_saw_when_the_leader_did_not(
    cluster: MetastoreCluster, certs: GeneratedCerts, tmp_path: Path
) -> None:
    """Node 3 is a learner (as the first test leaves it; made so when it is not): with three
    voters, killing nodes 1 and 3 would lose the quorum. Node 3 goes down, node 1 restarts (so
    it never sees node 3's certificate) and leads: the removal still revokes node 3's
    certificate, from what node 2 saw."""
    ca = certs.ca_cert
    _node_3_a_learner(cluster, certs, tmp_path)
    current = fingerprint(certs.node_certs[3][0])
    assert call(cluster, 2, "status")["learners"] == [3]
    wait_until("node 2 saw node 3's certificate", lambda: current in _seen_by(cluster, 2, 3))
    # Unless node 2 restarted since (it does when it is the rotation's victim, i.e. when node 1
    # led then), it also saw the certificate node 3 was refused with in the first test.
    seen_by_2 = _seen_by(cluster, 2, 3)
    cluster.kill(3)
    cluster.kill(1)
    cluster.start(1, bootstrap=False)
    leader = cluster.wait_ready(timeout_s=60)
    if leader != 1:
        moved = tls_cli(cluster, ca, "cluster", "transfer-leader", "1", nodes=[1, 2])
        assert moved.returncode == 0, moved.stderr
        wait_until("node 1 leads", lambda: cluster.wait_ready(timeout_s=10) == 1)
    assert _seen_by(cluster, 1, 3) == []
    removed = tls_cli(cluster, ca, "-o", "json", "cluster", "remove-node", "3", nodes=[1, 2])
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout)["revoked"] == seen_by_2, removed.stdout
    wait_until("node 1 applied it", lambda: current in revoked_on(cluster, 1))


def _seen_by(c: MetastoreCluster, node_id: int, peer: int) -> list[str]:
    seen: list[str] = call(c, node_id, "cert_revoked")["peers_seen"].get(str(peer), [])
    return seen
