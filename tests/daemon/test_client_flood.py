"""A flood of connections that never authenticate cannot lock clients out of the client port
(issue 10, the handshake flood): strangers must send `hello` within CLIENT_HELLO_TIMEOUT_MS and
may make the node buffer at most CLIENT_HELLO_BYTES_MAX before it; at the connection limit the
oldest stranger is closed to make room, while authenticated clients are never evicted."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon import api_limits as L
from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

CONNECTIONS_MAX = 16


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("flood"),
        1,
        dd_ms=300,
        cs_max_ms=100,
        client_connections_max=CONNECTIONS_MAX,
    ) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _stranger(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _client(c: MetastoreCluster) -> SyncMetastoreClient:
    return SyncMetastoreClient(
        [f"127.0.0.1:{c.client_ports[1]}"], c.token("admin"), client_name="flood-test"
    )


def test_a_flood_of_strangers_does_not_lock_out_a_client(node: MetastoreCluster) -> None:
    port = node.client_ports[1]
    # Authenticated connections fill half the slots; they must all survive the flood.
    members = [RawClient(port) for _ in range(CONNECTIONS_MAX // 2)]
    for m in members:
        assert m.call("hello", token=node.token("reader"), client="member")["ok"]
    strangers = [_stranger(port) for _ in range(3 * CONNECTIONS_MAX)]
    try:
        time.sleep(0.3)
        # A newcomer gets in at once (not after the strangers' hello timeout).
        newcomer = RawClient(port)
        try:
            reply = newcomer.call("hello", token=node.token("reader"), client="newcomer")
            assert reply["ok"], reply
            assert newcomer.call("safe_time")["ok"]
        finally:
            newcomer.close()
        with _client(node) as c:
            assert c.call("safe_time", {})["safe_time"] > 0
        for m in members:
            assert m.call("safe_time")["ok"], "an authenticated connection was evicted"
        # The oldest strangers were closed to make room.
        assert strangers[0].recv(1) == b""
    finally:
        for s in strangers:
            s.close()
        for m in members:
            m.close()


def test_a_stranger_must_say_hello_in_time(node: MetastoreCluster) -> None:
    silent = RawClient(node.client_ports[1], timeout_s=L.CLIENT_HELLO_TIMEOUT_MS / 1000 + 5)
    try:
        started = time.monotonic()
        assert silent.is_closed(wait_s=L.CLIENT_HELLO_TIMEOUT_MS / 1000 + 3)
        assert time.monotonic() - started < L.CLIENT_HELLO_TIMEOUT_MS / 1000 + 2
    finally:
        silent.close()


def test_a_stranger_may_not_send_more_than_a_hello(node: MetastoreCluster) -> None:
    big = RawClient(node.client_ports[1])
    try:
        # The header of a 1 MiB frame, then more than a hello's worth of its body.
        big.send_raw((1 << 20).to_bytes(4, "big") + b"\x00" * (2 * L.CLIENT_HELLO_BYTES_MAX))
        # At once, not by the 5 s hello timeout: 4 s is the widest wait that tells them apart.
        assert big.is_closed(wait_s=L.CLIENT_HELLO_TIMEOUT_MS / 1000 - 1)
    finally:
        big.close()
