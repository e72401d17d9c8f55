"""What a write whose reply never came tells its caller, against real daemons on 127.0.0.1.

* A node frozen (SIGSTOP: the kernel still accepts its TCP connections, nothing answers): a DDL
  whose deadline passes while its hello waits was never sent, and says so
  (NotAppliedTimeoutError); it said "outcome unknown". A DDL written to the frozen node's open
  connection keeps "outcome unknown", and the same request id settles it once the node runs
  again.
* `cert_revoke` repeated with its request id on a node that cannot know it was applied (a
  member restarted on the revoked certificate: the others refuse its links, so it never learns
  the revocation, and it sees the certificate in use: its own) was refused "in use" as if
  nothing were revoked. That node now answers NOT_READY (it cannot catch up), the client asks
  the next, and the repeat answers the first result (deduplicated).

Processes are stopped by PID only; every wait is bounded."""

from __future__ import annotations

import hashlib
import signal
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon.certs import GeneratedCerts, generate_dev_certs
from metastore.errors import (
    InvalidArgumentError,
    MetastoreError,
    NotAppliedTimeoutError,
    RequestTimeoutError,
)
from raft.tls import ClientTls
from tests.daemon.harness import MetastoreCluster, metastore_cluster, tls_cluster, write_cluster

pytestmark = pytest.mark.slow

WAIT_S = 40.0


def _endpoint(c: MetastoreCluster, node_id: int) -> str:
    return f"127.0.0.1:{c.client_ports[node_id]}"


def _until(what: str, attempt: Any, timeout_s: float = WAIT_S) -> Any:
    """`attempt()`'s first result that is not None, tried every 0.2 s for `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = attempt()
        except (MetastoreError, OSError) as exc:
            last, result = exc, None
        if result is not None:
            return result
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


@pytest.fixture
def frozen_cluster(tmp_path: Path) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path, 1) as c:
        c.start_all()
        c.wait_ready(timeout_s=60)
        yield c


def test_a_ddl_cut_before_its_node_saw_it_was_not_applied(
    frozen_cluster: MetastoreCluster,
) -> None:
    c = frozen_cluster
    endpoint = _endpoint(c, 1)
    proc = c.procs[1]
    proc.send_signal(signal.SIGSTOP)
    try:
        with (
            SyncMetastoreClient([endpoint], c.token(), timeout_ms=400) as client,
            pytest.raises(NotAppliedTimeoutError) as raised,
        ):
            client.ddl("CREATE NAMESPACE never_sent", request_id="rid-never-sent")
    finally:
        proc.send_signal(signal.SIGCONT)
    assert raised.value.details["not_applied"] is True
    assert "deadline passed while connecting" in raised.value.message, raised.value.message
    with SyncMetastoreClient([endpoint], c.token()) as client:
        client.ddl("CREATE NAMESPACE after_thaw")  # applied after the one not sent, if ever
        names = {n["name"] for n in client.list_namespaces()["namespaces"]}
    assert "after_thaw" in names and "never_sent" not in names, names


def test_a_ddl_sent_to_a_frozen_node_is_unknown_and_its_request_id_settles_it(
    frozen_cluster: MetastoreCluster,
) -> None:
    c = frozen_cluster
    endpoint = _endpoint(c, 1)
    proc = c.procs[1]
    with SyncMetastoreClient([endpoint], c.token(), timeout_ms=400) as client:
        client.status()  # the connection is open (hello answered) before the node freezes
        proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimeoutError) as raised:
                client.ddl("CREATE NAMESPACE maybe_sent", request_id="rid-maybe")
        finally:
            proc.send_signal(signal.SIGCONT)
    error = raised.value
    assert not isinstance(error, NotAppliedTimeoutError)
    assert error.details["outcome_unknown"] is True and error.details["request_id"] == "rid-maybe"
    with SyncMetastoreClient([endpoint], c.token()) as client:
        settled = client.ddl("CREATE NAMESPACE maybe_sent", request_id="rid-maybe")
        again = client.ddl("CREATE NAMESPACE maybe_sent", request_id="rid-maybe")
        names = [n["name"] for n in client.list_namespaces()["namespaces"]]
    assert settled["namespace"] == "maybe_sent"
    assert again["deduplicated"] is True
    assert names.count("maybe_sent") == 1


# ---- cert_revoke repeated on a node that cannot know ------------------------------------------


@pytest.fixture
def tls3(tmp_path: Path) -> Iterator[tuple[MetastoreCluster, GeneratedCerts]]:
    certs = generate_dev_certs(tmp_path / "tls", node_ids=[1, 2, 3])
    c = tls_cluster(write_cluster(tmp_path / "cluster", 3), certs, client_cert_required=True)
    try:
        c.start_all()
        c.wait_ready(timeout_s=60)
        yield c, certs
    finally:
        c.stop_all()


def _tls_client(
    c: MetastoreCluster, certs: GeneratedCerts, nodes: list[int]
) -> SyncMetastoreClient:
    cert, key = certs.client_cert
    return SyncMetastoreClient(
        [_endpoint(c, i) for i in nodes],
        c.token(),
        tls=ClientTls(ca_file=certs.ca_cert, cert_file=cert, key_file=key),
    )


def test_a_revocation_repeated_on_a_node_that_cannot_know_answers_the_first_result(
    tls3: tuple[MetastoreCluster, GeneratedCerts],
) -> None:
    c, certs = tls3
    fp = hashlib.sha256(ssl.PEM_cert_to_DER_cert(certs.node_certs[3][0].read_text())).hexdigest()
    leader = c.wait_ready(timeout_s=60)
    if leader == 3:
        with _tls_client(c, certs, [1]) as client:
            client.transfer_leader(1)
        leader = c.wait_ready(timeout_s=60)
    assert leader != 3
    c.kill(3)
    others = [i for i in c.ids if i != 3]

    def revoke_first() -> dict[str, Any] | None:
        # The members see node 3's links close at its death; until then "in use" (bounded).
        try:
            with _tls_client(c, certs, others) as client:
                return client.revoke_cert(fp, node_id=3, request_id="rev-3")
        except InvalidArgumentError as exc:
            if "in_use_by" in exc.details:
                return None
            raise

    first = _until("node 3's certificate revoked", revoke_first)
    assert first["revoked"] == [fp] and not first.get("deduplicated")

    # Node 3 comes back on the revoked certificate: every member refuses its links, so it
    # never applies the revocation, and it presents the certificate itself.
    c.start(3, bootstrap=False)
    with _tls_client(c, certs, [3]) as only_3:
        status = _until("node 3 answers", lambda: only_3.status(_endpoint(c, 3)))
        assert status["node_id"] == 3
        seen = only_3.revoked_certs()
    assert seen["this_node"]["fingerprint"] == fp and seen["this_node"]["revoked"] is False

    # The same request again, node 3 asked first: the first attempt's result.
    with _tls_client(c, certs, [3, *others]) as client:
        again = client.revoke_cert(fp, node_id=3, request_id="rev-3")
    assert again["deduplicated"] is True
    assert again["revoked"] == [fp]
