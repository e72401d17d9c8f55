"""TLS end to end with real daemon processes on 127.0.0.1: mutual TLS between peers, TLS on the
client port, and every way of getting it wrong.

One 3-node TLS cluster serves the whole module (starting clusters is the expensive part). Each
refusal is checked for what the user sees (a typed error, a CLI exit code and its one line)
and for what the cluster keeps doing (serving). Processes are killed by PID only; every wait is
bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon.certs import GeneratedCerts, generate_dev_certs
from metastore.errors import MetastoreError, TlsFailedError, TlsRequiredError
from raft.tls import ClientTls
from tests.daemon.harness import (
    REPO,
    MetastoreCluster,
    RawClient,
    run_cli,
    tls_cluster,
    tls_table,
    write_cluster,
)
from tests.raft.proc_cluster import free_ports

pytestmark = pytest.mark.slow

# A refused TLS client must fail fast (no failover rounds over the endpoints).
REFUSAL_S_MAX = 5.0
LOG_WAIT_S = 30.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> GeneratedCerts:
    return generate_dev_certs(tmp_path_factory.mktemp("tls"), node_ids=[1, 2, 3])


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: GeneratedCerts
) -> Iterator[MetastoreCluster]:
    c = tls_cluster(write_cluster(tmp_path_factory.mktemp("tls-cluster"), 3), certs)
    try:
        c.start_all()
        c.wait_ready(timeout_s=60)
        yield c
    finally:
        c.stop_all()


def endpoints(c: MetastoreCluster) -> list[str]:
    return [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]


def cli(
    c: MetastoreCluster, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`metastore ARGS` against `c`, in this process (harness.run_cli)."""
    base = {
        "METASTORE_ENDPOINTS": ",".join(endpoints(c)),
        "METASTORE_TOKEN_FILE": str(c.dir / "secrets" / "admin.token"),
    }
    return run_cli(*args, env=base | (env or {}))


def node_log(c: MetastoreCluster, node_id: int) -> str:
    return (c.dir / f"stdout-{node_id}.log").read_text(errors="replace")


def wait_for_log(path: Path, needle: str, timeout_s: float = LOG_WAIT_S) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text(errors="replace")
            if needle in text:
                return text
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in {path} after {timeout_s} s:\n{text[-3000:]}")


def test_tls_cluster_elects_commits_and_serves_the_cli(
    cluster: MetastoreCluster, certs: GeneratedCerts
) -> None:
    for i in cluster.ids:
        assert "(mutual TLS)" in node_log(cluster, i)
    ddl = cli(cluster, "--cacert", str(certs.ca_cert), "sql", "CREATE NAMESPACE tls_ns")
    assert ddl.returncode == 0, ddl.stderr
    ddl = cli(
        cluster,
        "--cacert",
        str(certs.ca_cert),
        "sql",
        "CREATE TABLE tls_ns.t (id BIGINT NOT NULL, name STRING)",
    )
    assert ddl.returncode == 0, ddl.stderr
    # Sent to a follower only: it forwards to the leader's TLS client port with its own
    # node certificate.
    leader = cluster.wait_ready()
    follower = next(i for i in cluster.ids if i != leader)
    ddl = cli(
        cluster,
        "--cacert",
        str(certs.ca_cert),
        "--endpoints",
        f"127.0.0.1:{cluster.client_ports[follower]}",
        "sql",
        "CREATE NAMESPACE tls_forwarded",
    )
    assert ddl.returncode == 0, ddl.stderr
    # Through the env var, on every node (the followers forwarded the DDL over TLS).
    for endpoint in endpoints(cluster):
        shown = cli(
            cluster,
            "-o",
            "json",
            "--endpoints",
            endpoint,
            "table",
            "describe",
            "tls_ns.t",
            env={"METASTORE_CACERT": str(certs.ca_cert)},
        )
        assert shown.returncode == 0, shown.stderr
        columns = json.loads(shown.stdout)["schema"]["columns"]
        assert [c["name"] for c in columns] == ["id", "name"]
    # The library, with the client certificate too (accepted though not required here).
    tls = ClientTls(
        ca_file=certs.ca_cert, cert_file=certs.client_cert[0], key_file=certs.client_cert[1]
    )
    with SyncMetastoreClient(endpoints(cluster), cluster.token("admin"), tls=tls) as client:
        client.ddl("CREATE NAMESPACE tls_lib")
        names = [n["name"] for n in client.list_namespaces()["namespaces"]]
        assert "tls_lib" in names


def test_client_without_the_ca_is_refused_with_a_typed_error(
    cluster: MetastoreCluster, certs: GeneratedCerts
) -> None:
    started = time.monotonic()
    # TLS on, but trusting only the system's CAs: the dev CA is not among them.
    with (
        SyncMetastoreClient(endpoints(cluster), cluster.token(), tls=ClientTls()) as client,
        pytest.raises(TlsFailedError, match="certificate is not trusted"),
    ):
        client.status()
    assert time.monotonic() - started < REFUSAL_S_MAX
    out = cli(cluster, "--tls", "ns", "list")
    assert out.returncode == 6, out.stderr
    assert out.stderr.startswith("Error: TLS_FAILED: node 127.0.0.1:"), out.stderr
    assert "--cacert" in out.stderr
    # A certificate of another CA is no better than none.
    other = generate_dev_certs(cluster.dir / "other-ca", node_ids=[1])
    out = cli(cluster, "--cacert", str(other.ca_cert), "ns", "list")
    assert out.returncode == 6, out.stderr
    assert "TLS_FAILED" in out.stderr


def test_plaintext_client_to_a_tls_port_is_refused_cleanly(cluster: MetastoreCluster) -> None:
    raw = RawClient(cluster.client_ports[1])
    try:
        reply = raw.call("hello", token=cluster.token(), client="plaintext")
        assert reply["ok"] is False
        assert reply["error"]["code"] == "TLS_REQUIRED"
        assert raw.is_closed()
    finally:
        raw.close()
    started = time.monotonic()
    with (
        SyncMetastoreClient(endpoints(cluster), cluster.token()) as client,
        pytest.raises(TlsRequiredError, match="requires TLS"),
    ):
        client.status()
    assert time.monotonic() - started < REFUSAL_S_MAX
    out = cli(cluster, "ns", "list")
    assert out.returncode == 6, out.stderr
    assert out.stderr.startswith("Error: TLS_REQUIRED: "), out.stderr
    # The node is unharmed.
    assert cluster.try_status(1) is not None


def test_a_peer_with_a_certificate_of_another_ca_cannot_join(
    cluster: MetastoreCluster, tmp_path: Path
) -> None:
    """The rogue claims to be node 3 (a member), holds the real cluster secret and the
    cluster id: only its certificate (another CA) is wrong. It must get nothing, the members
    log the refusal, and the cluster keeps serving."""
    rogue_certs = generate_dev_certs(tmp_path / "rogue-tls", node_ids=[3])
    rogue_config = tmp_path / "cluster.toml"
    rogue_config.write_text(
        rogue_cluster_toml(cluster, free_ports(3)) + tls_table(rogue_certs.ca_cert.parent)
    )
    leader = cluster.wait_ready()
    log_path = tmp_path / "rogue-stdout.log"
    with log_path.open("wb") as out:
        rogue = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "metastore.daemon",
                "--config",
                str(rogue_config),
                "--node-id",
                "3",
                "--bootstrap",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # The rogue refuses the members' certificates, and the members refuse its connection.
        wait_for_log(log_path, "its TLS certificate is not trusted")
        deadline = time.monotonic() + LOG_WAIT_S
        refused: list[int] = []
        while not refused and time.monotonic() < deadline:
            refused = [i for i in (1, 2) if REFUSED_PEER in node_log(cluster, i)]
            time.sleep(0.1)
        assert refused, node_log(cluster, 1)[-3000:]
        # The rogue hangs up as soon as it sees our certificate (it trusts another CA).
        assert "during the TLS handshake" in node_log(cluster, refused[0])
        # The cluster keeps its leader and commits while the rogue knocks.
        tls = ClientTls(ca_file=cluster_ca(cluster))
        with SyncMetastoreClient(endpoints(cluster), cluster.token("admin"), tls=tls) as client:
            for n in range(3):
                client.ddl(f"CREATE NAMESPACE rogue_era_{n}")
        assert cluster.wait_ready() == leader
        assert rogue.poll() is None  # still knocking, never admitted
        rogue_log = log_path.read_text(errors="replace")
        assert "connected to peer" not in rogue_log
        assert "connected from" not in rogue_log
    finally:
        rogue.kill()
        rogue.wait(timeout=10)


REFUSED_PEER = "refused peer connection from 127.0.0.1:"


def rogue_cluster_toml(c: MetastoreCluster, rogue_ports: list[int]) -> str:
    """The cluster's own file, except that node 3 listens on `rogue_ports` and the secrets
    are the real cluster's (the rogue knows the secret)."""
    lines = [f'secrets_dir = "{c.dir / "secrets"}"']
    node = 0
    names = ["raft_port", "client_port", "metrics_port"]
    for line in c.config.read_text().split("\n[tls]")[0].splitlines():
        if line.startswith("id = "):
            node = int(line.split("=")[1])
        key = line.split("=")[0].strip()
        if node == 3 and key in names:
            line = f"{key} = {rogue_ports[names.index(key)]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def cluster_ca(c: MetastoreCluster) -> Path:
    for line in c.config.read_text().splitlines():
        if line.startswith("ca_file"):
            return Path(line.split("=", 1)[1].strip().strip('"'))
    raise AssertionError("no ca_file in the cluster config")


def test_a_port_that_requires_client_certificates_refuses_clients_without_one(
    tmp_path: Path, certs: GeneratedCerts
) -> None:
    """client_cert_required: TLS with the right CA is not enough; the client certificate
    must be signed by the cluster CA too (and the token is still checked on top)."""
    c = tls_cluster(write_cluster(tmp_path / "mtls", 1), certs, client_cert_required=True)
    try:
        c.start_all()
        c.wait_ready(timeout_s=60)
        started = time.monotonic()
        with (
            SyncMetastoreClient(
                endpoints(c), c.token(), tls=ClientTls(ca_file=certs.ca_cert)
            ) as client,
            pytest.raises(TlsRequiredError, match="requires a client certificate"),
        ):
            client.status()
        assert time.monotonic() - started < REFUSAL_S_MAX
        other = generate_dev_certs(tmp_path / "other-ca", node_ids=[1])
        foreign = ClientTls(
            ca_file=certs.ca_cert, cert_file=other.client_cert[0], key_file=other.client_cert[1]
        )
        # Refused in the handshake: a TLS 1.3 client only sees the close, so this one is failed
        # over like a node going away, with the likely cause in the error.
        with (
            SyncMetastoreClient(endpoints(c), c.token(), tls=foreign, timeout_ms=2000) as client,
            pytest.raises(MetastoreError, match="does it accept the client certificate"),
        ):
            client.status()
        ok = cli(
            c,
            "--cacert",
            str(certs.ca_cert),
            "--cert",
            str(certs.client_cert[0]),
            "--key",
            str(certs.client_cert[1]),
            "-o",
            "json",
            "cluster",
            "status",
        )
        assert ok.returncode == 0, ok.stderr
        log_text = node_log(c, 1)
        assert "refused client" in log_text
        assert "no client certificate" in log_text
        assert "TLS handshake failed: certificate verify failed" in log_text
    finally:
        c.stop_all()
