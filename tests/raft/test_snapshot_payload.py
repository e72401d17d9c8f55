"""The node's snapshot payload, [1, app_data, addresses]: unwrapped without copying the state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from hlc import HybridClock, SystemClock
from raft.core.types import Entry
from raft.errors import RaftError
from raft.node import NodeConfig, RaftNode, unwrap_snapshot_data, wrap_snapshot_data

ADDRESSES = {1: ("127.0.0.1", 7001), 2: ("127.0.0.1", 7002)}


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 300_000])
def test_unwrap_gives_a_view_of_the_state_and_the_address_book(size: int) -> None:
    app = bytes(i % 251 for i in range(size))
    wrapped = wrap_snapshot_data(app, ADDRESSES)
    # The layout is plain msgpack: any reader can decode it.
    assert msgpack.unpackb(wrapped)[1] == app
    view, addresses = unwrap_snapshot_data(memoryview(wrapped))
    assert addresses == ADDRESSES
    assert isinstance(view, memoryview) and view == app
    assert view.obj is wrapped  # a view into the payload, not a copy


def test_an_empty_payload_is_an_empty_state() -> None:
    assert unwrap_snapshot_data(b"") == (b"", {})


@pytest.mark.parametrize(
    "payload",
    [
        msgpack.packb([2, b"x", msgpack.packb({})]),  # unknown format version
        msgpack.packb([1, "text", msgpack.packb({})]),  # state not bytes
        wrap_snapshot_data(b"abc", ADDRESSES)[:-3],  # address book cut short
        b"\x93\x01\xc4\x09abc",  # state runs past the end
        msgpack.packb([1, b"x", {"1": ["h", 1]}]),  # address book not packed bytes
        msgpack.packb([1, b"x", msgpack.packb([1, 2])]),  # address book not a map
        msgpack.packb([1, b"x", msgpack.packb({"a": ["h", 1]})]),  # node id not a number
        msgpack.packb([1, b"x", msgpack.packb({"1": 5})]),  # address not a pair
        msgpack.packb([1, b"x", b"\xc1"]),  # address book not msgpack
        msgpack.packb([1, b"x", msgpack.packb({"1": ["h", 0]})]),  # an address not dialable
        msgpack.packb([1, b"x", msgpack.packb({"1": ["a b", 7001]})]),  # a host with a space
    ],
    ids=[
        "version",
        "state-type",
        "short-book",
        "short-state",
        "book-type",
        "book-not-map",
        "book-bad-id",
        "book-bad-address",
        "book-not-msgpack",
        "book-port-0",
        "book-bad-host",
    ],
)
def test_a_malformed_payload_is_a_raft_error(payload: bytes) -> None:
    with pytest.raises(RaftError):
        unwrap_snapshot_data(payload)


@pytest.mark.parametrize(
    "book",
    [
        b"\xc1",  # not msgpack
        msgpack.packb(msgpack.packb({"1": ["h", 0]})),  # an address not dialable
        msgpack.packb(msgpack.packb({"1": 5})),  # not an address at all
    ],
    ids=["not-msgpack", "port-0", "not-a-pair"],
)
def test_a_node_keeps_a_snapshot_whose_address_book_it_cannot_use(
    tmp_path: Path, book: bytes
) -> None:
    """The state is fine, only where to reach the members is not: the node restores the state
    and keeps the addresses it knew (see RaftNode._conf_entry_addresses) instead of stopping,
    which it would do again at every restart, the snapshot being in its log."""
    payload = b"\x93\x01\xc4\x03abc" + book
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path,
            listen_host="127.0.0.1",
            listen_port=7001,
            peers={1: ("127.0.0.1", 7001)},
            secret=b"s" * 32,
        ),
        _NoState(),
        clock=HybridClock(SystemClock()),
    )
    try:
        app, addresses = node._unwrap_snapshot(payload)
        assert bytes(app) == b"abc" and addresses == {}
        assert node.unusable_address_books == 1
    finally:
        node._io.shutdown(wait=True)


class _NoState:
    def apply(self, entry: Entry) -> Any:
        return None

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes | memoryview) -> None:
        pass
