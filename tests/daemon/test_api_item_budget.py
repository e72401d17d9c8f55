"""Request frames are decoded under an item budget (a real node).

A frame of tiny items (empty arrays: 1 byte each on the wire, 56 on the heap) costs far more to
decode than its bytes suggest: a 4 MiB one took 1.4 s of the node's one event loop and 290 MiB.
Past CLIENT_REQUEST_ITEMS_MAX (CLIENT_HELLO_ITEMS_MAX for a stranger's first request) the frame
is refused as malformed: BAD_REQUEST with id 0, and the connection closes, as for any malformed
frame. The largest legitimate request still fits."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import msgpack
import pytest

from metastore.daemon import api_limits as L
from raft.framing import encode_frame
from tests.daemon.harness import FRAME_MAX, MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("items"), 1) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _empty_arrays_frame(rid: int, op: str, count: int, **args: object) -> bytes:
    """A request whose argument `x` is a list of `count` empty lists (1 byte each)."""
    head = msgpack.packb({"id": rid, "op": op, "args": {**args, "x": None}})[:-1]
    body = head + b"\xdd" + struct.pack(">I", count) + b"\x90" * count
    return struct.pack(">I", len(body)) + body


def _assert_refused_as_malformed(client: RawClient, items_max: int) -> None:
    reply = client.recv()
    assert reply is not None
    assert reply["id"] == 0, reply  # a frame error, not a reply to the request
    assert reply["error"]["code"] == "BAD_REQUEST"
    assert f"more than {items_max} array items and map pairs" in reply["error"]["message"]
    assert client.is_closed()


def _still_serves(node: MetastoreCluster) -> None:
    client = node.client(1)
    assert client.call("status")["ok"]
    client.close()


def test_a_request_past_the_item_budget_is_refused_and_closes_the_connection(
    node: MetastoreCluster,
) -> None:
    client = node.client(1, role="reader")
    client.send_raw(_empty_arrays_frame(7, "status", L.CLIENT_REQUEST_ITEMS_MAX))
    _assert_refused_as_malformed(client, L.CLIENT_REQUEST_ITEMS_MAX)
    _still_serves(node)


def test_a_full_frame_of_empty_arrays_is_refused(node: MetastoreCluster) -> None:
    # Lists of 1,000 empty lists each, to the frame limit: no one array passes msgpack's own
    # length limit (the budget), only all of them together.
    inner = b"\xdc" + struct.pack(">H", 1_000) + b"\x90" * 1_000
    count = (FRAME_MAX - 64) // len(inner)
    head = msgpack.packb({"id": 8, "op": "status", "args": {"x": None}})[:-1]
    body = head + b"\xdd" + struct.pack(">I", count) + inner * count
    client = node.client(1, role="reader")
    client.send_raw(struct.pack(">I", len(body)) + body)
    _assert_refused_as_malformed(client, L.CLIENT_REQUEST_ITEMS_MAX)
    _still_serves(node)


def test_a_hello_past_its_item_budget_is_refused(node: MetastoreCluster) -> None:
    stranger = RawClient(node.client_ports[1])
    frame = _empty_arrays_frame(
        1, "hello", L.CLIENT_HELLO_ITEMS_MAX, token=node.token("reader"), client="t"
    )
    assert len(frame) < L.CLIENT_HELLO_BYTES_MAX  # the bytes alone would let it through
    stranger.send_raw(frame)
    _assert_refused_as_malformed(stranger, L.CLIENT_HELLO_ITEMS_MAX)
    _still_serves(node)


def test_frames_sent_with_the_hello_get_the_budget_of_an_authenticated_client(
    node: MetastoreCluster,
) -> None:
    # The hello and the request after it arrive in one read: the request is decoded under
    # the authenticated budget, once the hello has succeeded.
    client = RawClient(node.client_ports[1])
    hello = {"id": 1, "op": "hello", "args": {"token": node.token("reader"), "client": "t"}}
    client.send_raw(
        encode_frame(hello, max_frame_bytes=FRAME_MAX)
        + _empty_arrays_frame(2, "status", 10 * L.CLIENT_HELLO_ITEMS_MAX)
    )
    first = client.recv()
    assert first is not None and first["ok"], first
    second = client.recv()
    assert second is not None and second["id"] == 2, second
    assert second["error"]["code"] == "BAD_REQUEST"
    assert "unknown arguments" in second["error"]["message"]  # decoded, then refused
    assert client.call("status")["ok"]
    client.close()


def test_the_largest_legitimate_commit_is_decoded(node: MetastoreCluster) -> None:
    files_per_table = 10_000 // 100
    writes = [
        {
            "table": f"ib.t{i}",
            "schema_version": 1,
            "table_id": i + 1,
            "overwrite": False,
            "remove": [],
            "add": [
                {"path": f"part-{i}-{j:05d}.parquet", "size_bytes": 1, "row_count": 1}
                for j in range(files_per_table)
            ],
        }
        for i in range(100)
    ]
    client = node.client(1, role="writer")
    reply = client.call(
        "commit",
        txn_id="q:1",
        writes=writes,
        read_tables=[f"ib.r{i}" for i in range(100)],
        read_ts=1,
        request_id="r" * 64,
        stream="s",
        seq=1,
        timeout_ms=5_000,
    )
    # Decoded and refused by the catalog (no such tables), not by the frame decoder.
    assert reply["id"] == client.next_id, reply
    assert reply["error"]["code"] in {"NAMESPACE_NOT_FOUND", "TABLE_NOT_FOUND"}, reply
    assert client.call("status")["ok"]
    client.close()


def test_an_error_about_a_huge_value_is_answered_briefly(node: MetastoreCluster) -> None:
    # The catalog's error quotes the table name (message and details): 3 MB twice did not fit
    # one reply frame, and the request was never answered.
    client = node.client(1, role="writer")
    client.sock.settimeout(5)
    rid = client.next_id + 1
    reply = client.call(
        "commit", txn_id="t", writes=[{"table": "x" * 3_000_000, "schema_version": 1}]
    )
    assert reply["id"] == rid
    assert reply["error"]["code"] == "INVALID_ARGUMENT"
    assert len(reply["error"]["message"]) < 5_000
    assert len(msgpack.packb(reply["error"]["details"])) < 20_000
    assert client.call("status")["ok"]
    client.close()


def test_a_forwarded_command_past_the_item_budget_is_not_decoded(node: MetastoreCluster) -> None:
    # `_propose` carries a command's bytes (up to MAX_COMMIT_COMMAND_BYTES), decoded on the
    # leader: under the same budget as a request, not whatever its bytes hold.
    inner = b"\xdc" + struct.pack(">H", 1_000) + b"\x90" * 1_000
    count = 3 * 1024 * 1024 // len(inner)
    command = b"\xdd" + struct.pack(">I", count) + inner * count
    client = node.client(1, role="writer")
    reply = client.call("_propose", command=command, timeout_ms=5_000)
    assert not reply["ok"]
    assert reply["error"]["code"] == "MALFORMED_COMMAND", reply["error"]
    assert f"more than {L.CLIENT_REQUEST_ITEMS_MAX} array items" in reply["error"]["message"]
    assert client.call("status")["ok"]
    client.close()
