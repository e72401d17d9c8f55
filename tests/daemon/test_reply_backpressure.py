"""A client that pipelines requests with large replies and does not read its socket cannot make
a node hold their replies: once a connection's queued reply bytes pass
CLIENT_REPLY_BYTES_PER_CONNECTION_MAX the node stops reading its requests until the socket
takes them (the requests already running still reply). Before, the node kept reading and
running them, and every reply waited in the connection's transport buffer: up to
CLIENT_INFLIGHT_PER_CONNECTION_MAX (64) replies of up to 4 MiB per connection, on each of
CLIENT_CONNECTIONS_MAX connections, from a reader that authenticated and stopped reading.

One real node on 127.0.0.1, with a plaintext and with a TLS client port (the TLS transport
buffers and pauses on its own); the reply backlog is read from its /metrics."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest

from metastore import limits
from metastore.daemon import api_limits as L
from metastore.daemon.certs import generate_dev_certs
from raft.framing import encode_frame
from tests.daemon.harness import FRAME_MAX, MetastoreCluster, tls_cluster, write_cluster

pytestmark = pytest.mark.slow

TABLE = "bp.wide"
# Paths of ~200 characters: a page of `files` ends near FILES_PAGE_BYTES_MAX (2 MiB).
PREFIX = "year=2026/month=11/day=27/hour=08/" + "d" * 100 + "/part-"
# Requests the slow client sends, one at a time: fewer than CLIENT_INFLIGHT_PER_CONNECTION_MAX,
# so the old server ran them all (no LIMIT_EXCEEDED) and held every reply.
REQUESTS_MAX = 40
# A page is ~2 MiB: the budget (8 MiB) plus what the kernel's socket buffers take (~4 MiB on
# loopback) plus the request in flight when the budget was passed is ~8 pages; the old server
# served all REQUESTS_MAX.
SERVED_BEFORE_READING_MAX = 16
STEP_TIMEOUT_S = 20.0


@pytest.fixture(scope="module", params=["plain", "tls"])
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MetastoreCluster]:
    config = write_cluster(tmp_path_factory.mktemp("backpressure"), 1)
    if request.param == "tls":
        certs = generate_dev_certs(tmp_path_factory.mktemp("backpressure-tls"), node_ids=[1])
        c = tls_cluster(config, certs)
    else:
        c = MetastoreCluster(config)
    try:
        c.start_all()
        c.wait_ready()
        admin = c.client(1)
        try:
            assert admin.call("ddl", sql="CREATE NAMESPACE bp")["ok"]
            assert admin.call("ddl", sql=f"CREATE TABLE {TABLE} (id BIGINT)")["ok"]
            add = [
                {"path": f"{PREFIX}{i:05d}.parquet", "size_bytes": 100, "row_count": 1}
                for i in range(limits.MAX_FILES_PER_COMMIT)
            ]
            writes = [{"table": TABLE, "schema_version": 1, "add": add}]
            r = admin.call("commit", txn_id="bp-1", writes=writes)
            assert r["ok"], r
        finally:
            admin.close()
        yield c
    finally:
        c.stop_all()


def _metrics(c: MetastoreCluster) -> dict[str, float]:
    url = f"http://127.0.0.1:{c.metrics_ports[1]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _files_served(m: dict[str, float]) -> int:
    return int(m.get('metastore_requests_total{code="OK",op="files"}', 0))


def _files_frame(rid: int) -> bytes:
    args = {"table": TABLE, "limit": L.FILES_PAGE_FILES_MAX}
    return encode_frame({"id": rid, "op": "files", "args": args}, max_frame_bytes=FRAME_MAX)


def test_a_client_that_does_not_read_cannot_make_the_node_hold_its_replies(
    node: MetastoreCluster,
) -> None:
    slow = node.client(1, "reader")
    other = node.client(1, "reader")
    try:
        page = other.call("files", table=TABLE, limit=L.FILES_PAGE_FILES_MAX)
        assert page["ok"], page
        page_bytes = len(encode_frame(page, max_frame_bytes=FRAME_MAX))
        assert page_bytes > 1024 * 1024, "the test needs large replies"
        base = _files_served(_metrics(node))

        # Pipeline `files` requests one at a time, each once the node has answered the one
        # before (its request counter moved) or has paused the connection; never read.
        sent, paused = 0, False
        while sent < REQUESTS_MAX and not paused:
            sent += 1
            slow.send_raw(_files_frame(sent))
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while True:
                m = _metrics(node)
                paused = m.get("metastore_client_connections_paused", 0) >= 1
                if paused or _files_served(m) >= base + sent:
                    break
                assert time.monotonic() < deadline, f"request {sent} neither served nor paused"
                time.sleep(0.01)
        m = _metrics(node)
        served = _files_served(m) - base
        queued_max = m.get("metastore_client_reply_bytes_queued_max", 0)
        assert served <= SERVED_BEFORE_READING_MAX, (
            f"the node ran {served} requests of a client that read none of its replies "
            f"(~{served * page_bytes // 2**20} MiB of replies held)"
        )
        assert paused and m["metastore_client_connections_paused"] == 1
        # The connection's transport holds at most the budget plus the reply in flight.
        assert 0 < queued_max <= L.CLIENT_REPLY_BYTES_PER_CONNECTION_MAX + L.CLIENT_FRAME_BYTES_MAX

        # Another connection is served at once meanwhile.
        for _ in range(3):
            started = time.monotonic()
            r = other.call("files", table=TABLE, limit=L.FILES_PAGE_FILES_MAX)
            assert r["ok"] and r["result"]["files"], r.get("error")
            assert other.call("status")["ok"]
            # Not behind the slow client, which reads nothing until below: a call stuck
            # behind it would wait forever, so a loaded machine gets a generous 10 s.
            assert time.monotonic() - started < 10.0

        # Once the slow client reads, it gets every reply, whole, including those of the
        # requests the node read only after it resumed.
        deadline = time.monotonic() + 60
        ids = []
        for _ in range(sent):
            assert time.monotonic() < deadline, "the replies took too long"
            reply = slow.recv()
            assert reply is not None, f"connection closed after {len(ids)} replies"
            assert reply["ok"], reply["error"]
            assert reply["result"]["files"] == page["result"]["files"]
            ids.append(reply["id"])
        assert sorted(ids) == list(range(1, sent + 1))
        assert slow.call("safe_time")["ok"]  # the connection still serves
        m = _metrics(node)
        assert m["metastore_client_connections_paused"] == 0
    finally:
        slow.close()
        other.close()
