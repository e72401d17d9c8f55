"""Members' client addresses in the replicated state (`SetMemberClientAddress`, apply version 6).

`cluster add-node ID HOST:RAFTPORT --client-address HOST:PORT` records the new member's client
address through the log, so every member can forward requests to it once it leads (before, the
members knew client ports only from their own cluster.toml: every write sent to another member
failed with "no client address configured for node 4").

What each test would catch without the feature: no command (import fails), a command applied
below apply version 6 (nodes of the previous release would refuse it), a record lost in a
snapshot, a snapshot format older releases cannot read written while nothing is recorded.
"""

from __future__ import annotations

import msgpack
import pytest

from metastore import limits
from metastore.commands import SetMemberClientAddress, decode_command, encode_command
from metastore.errors import (
    InvalidArgumentError,
    LimitExceededError,
    MalformedCommandError,
    MalformedSnapshotError,
)
from metastore.state import MetastoreState
from tests.metastore._driver import Driver, ok, refused


def test_the_command_round_trips() -> None:
    cmd = SetMemberClientAddress(node_id=4, host="10.0.0.4", port=24204, by="admin", request_id="r")
    assert decode_command(encode_command(cmd)) == cmd


@pytest.mark.parametrize(
    ("node_id", "host", "port"),
    [
        (0, "h", 1),
        (limits.MAX_MEMBER_NODE_ID + 1, "h", 1),
        (4, "", 1),
        (4, "a b", 1),
        (4, "h\n", 1),
        (4, "h" * 254, 1),
        (4, "h", 0),
        (4, "h", 65536),
    ],
)
def test_a_malformed_address_is_refused(node_id: int, host: str, port: int) -> None:
    cmd = SetMemberClientAddress(node_id=node_id, host=host, port=port)
    with pytest.raises(MalformedCommandError):
        decode_command(encode_command(cmd))
    refused(Driver(), cmd, InvalidArgumentError)


def test_from_version_6_every_replica_records_the_address_and_a_snapshot_keeps_it() -> None:
    d = Driver(apply_version=6)
    result = ok(d, SetMemberClientAddress(node_id=4, host="127.0.0.1", port=24204, by="admin"))
    assert result == {"node_id": 4, "client_address": "127.0.0.1:24204", "previous": ""}
    assert d.state.member_clients.address_of(4) == ("127.0.0.1", 24204)
    assert d.state.member_clients.address_of(5) is None
    # The node is added again elsewhere: the newer address replaces the older one.
    again = ok(d, SetMemberClientAddress(node_id=4, host="10.0.0.4", port=1))
    assert again["previous"] == "127.0.0.1:24204"
    assert d.state.member_clients.address_of(4) == ("10.0.0.4", 1)
    restored = MetastoreState.from_snapshot(d.state.to_snapshot())
    assert restored == d.state
    assert restored.member_clients.address_of(4) == ("10.0.0.4", 1)


def test_below_version_6_the_command_is_refused_and_changes_nothing() -> None:
    """Nodes of the previous release would stop on the unknown command type: the leader
    proposes it only at version 6, and apply refuses it below, as every node does."""
    d = Driver(apply_version=5)
    exc = refused(d, SetMemberClientAddress(node_id=4, host="h", port=1), InvalidArgumentError)
    assert exc.details == {"apply_version": 5, "needed": 6}
    assert d.state.member_clients.address_of(4) is None


def test_without_records_the_snapshot_keeps_the_format_older_releases_read() -> None:
    """During a rolling upgrade a new leader sends snapshots to nodes of the previous release,
    which read format 8 at most: nothing recorded, nothing new in the snapshot."""
    d = Driver(apply_version=5)
    d.ok("CREATE NAMESPACE ns")
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    assert obj["v"] == 8 and "member_clients" not in obj
    d6 = Driver(apply_version=6)
    ok(d6, SetMemberClientAddress(node_id=4, host="h", port=1))
    assert msgpack.unpackb(d6.state.to_snapshot(), raw=False)["v"] == 9


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"4": ["h", 1]},
        [[4, "h"]],
        [[0, "h", 1]],
        [[4, "", 1]],
        [[4, "h", 0]],
        [[4, "h", 1]] * 2,
    ],
)
def test_a_snapshot_with_malformed_records_is_refused(bad: object) -> None:
    d = Driver()
    ok(d, SetMemberClientAddress(node_id=4, host="h", port=1))
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    obj["member_clients"] = bad
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_the_records_are_bounded() -> None:
    d = Driver()
    for node_id in range(1, limits.MAX_MEMBER_CLIENT_ADDRESSES + 1):
        d.apply(SetMemberClientAddress(node_id=node_id, host="h", port=1)).raise_for_error()
    refused(
        d,
        SetMemberClientAddress(node_id=limits.MAX_MEMBER_CLIENT_ADDRESSES + 1, host="h", port=1),
        LimitExceededError,
    )
    # A known node's address can still change.
    ok(d, SetMemberClientAddress(node_id=1, host="other", port=2))
