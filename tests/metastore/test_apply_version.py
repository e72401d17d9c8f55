"""Apply versions (metastore.apply_version): a node never applies the log differently from its
peers because it runs an older release; it stops instead.

What each test would catch: a SetApplyVersion above this release's support applied as a failure
(the node would keep the old rules while its peers use the new ones), a version moving back, a
snapshot dropping the version (format 8), a snapshot or log entry of a newer release applied as
a refusal instead of stopping the node.
"""

from __future__ import annotations

import msgpack
import pytest

from metastore import state as state_module
from metastore.apply_version import APPLY_VERSION_SUPPORTED, MAX_APPLY_VERSION
from metastore.commands import (
    CommandFromNewerReleaseError,
    SetApplyVersion,
    decode_command,
    encode_command,
)
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.errors import (
    InvalidArgumentError,
    MalformedCommandError,
    MalformedSnapshotError,
    ReleaseTooOldError,
)
from metastore.state import MetastoreState
from raft.core.types import Entry, EntryKind
from tests.metastore._driver import MS, T0, Driver


def test_a_new_cluster_is_at_version_one_and_this_release_supports_it() -> None:
    d = Driver()
    assert d.state.apply_version == 1 <= APPLY_VERSION_SUPPORTED
    assert d.state.rules_at_least(1) and not d.state.rules_at_least(2)


def test_set_apply_version_round_trips_and_is_validated() -> None:
    cmd = SetApplyVersion(version=3, by="admin@host", request_id="r1")
    assert decode_command(encode_command(cmd)) == cmd
    for bad in (0, -1, MAX_APPLY_VERSION + 1):
        with pytest.raises(MalformedCommandError):
            decode_command(encode_command(SetApplyVersion(version=bad)))


def test_the_current_version_is_a_no_op() -> None:
    d = Driver()
    before = d.state.to_snapshot()
    out = d.apply(SetApplyVersion(version=1))
    assert out.ok and out.result == {"apply_version": 1, "previous": 1}
    after = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    assert after["apply_version"] == msgpack.unpackb(before, raw=False)["apply_version"] == 1


def test_a_version_this_release_does_not_support_stops_the_node_and_changes_nothing() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    before = d.state.to_snapshot()
    with pytest.raises(ReleaseTooOldError, match="upgrade this node"):
        d.apply(SetApplyVersion(version=APPLY_VERSION_SUPPORTED + 1))
    # Not applied as a refusal: not even the position moved, so a restart on a newer release
    # applies the same entry again.
    assert d.state.to_snapshot() == before


def test_versions_move_forward_only_and_survive_a_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_module, "APPLY_VERSION_SUPPORTED", 3)
    d = Driver()
    out = d.apply(SetApplyVersion(version=3))
    assert out.ok and out.result == {"apply_version": 3, "previous": 1}
    assert d.state.rules_at_least(3)
    d.state.check_invariants()
    before = d.state.to_snapshot()
    back = d.apply(SetApplyVersion(version=2))
    assert isinstance(back.exception(), InvalidArgumentError)
    assert "never moves back" in str(back.exception())
    assert d.state.apply_version == 3
    restored = MetastoreState.from_snapshot(d.state.to_snapshot())
    assert restored == d.state and restored.apply_version == 3
    assert msgpack.unpackb(before, raw=False)["apply_version"] == 3
    # A release that supports less cannot load it: it says so rather than loading old rules.
    monkeypatch.setattr(state_module, "APPLY_VERSION_SUPPORTED", 2)
    with pytest.raises(MalformedSnapshotError, match="newer than this release supports"):
        MetastoreState.from_snapshot(before)


def test_older_snapshot_formats_load_at_version_one() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    assert obj["v"] == 8 and obj["apply_version"] == 1
    del obj["apply_version"]
    obj["v"] = 7
    old = MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    assert old.apply_version == 1 and old.catalog == d.state.catalog


@pytest.mark.parametrize("bad", [0, -1, True, "2", None])
def test_a_snapshot_with_a_bad_version_is_refused(bad: object) -> None:
    obj = msgpack.unpackb(Driver().state.to_snapshot(), raw=False)
    obj["apply_version"] = bad
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_a_snapshot_format_of_a_newer_release_says_so() -> None:
    obj = msgpack.unpackb(Driver().state.to_snapshot(), raw=False)
    obj["v"] = 9
    with pytest.raises(MalformedSnapshotError, match="newer release"):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def _entry(index: int, data: bytes) -> Entry:
    return Entry(term=1, index=index, tm=T0 + index * MS, kind=EntryKind.NORMAL, data=data)


def _initialized_machine() -> CatalogStateMachine:
    sm = CatalogStateMachine()
    sm.state = Driver().state
    return sm


@pytest.mark.parametrize(
    "body",
    [
        {"v": 1, "type": "make_coffee", "request_id": ""},  # a command type of a newer release
        {"v": 2, "type": "create_namespace", "request_id": ""},  # a newer format
    ],
)
def test_a_log_entry_of_a_newer_release_stops_the_node(body: dict[str, object]) -> None:
    sm = _initialized_machine()
    data = msgpack.packb(body, use_bin_type=True)
    with pytest.raises(CommandFromNewerReleaseError):
        decode_command(data)
    before = sm.state.to_snapshot()
    index = sm.state.applied_index + 1
    with pytest.raises(ReleaseTooOldError, match="newer release"):
        sm.apply(_entry(index, data))
    assert sm.state.to_snapshot() == before


def test_a_malformed_log_entry_still_applies_as_a_refusal() -> None:
    # Every node of one release decodes it the same way: a refusal everywhere, no divergence.
    sm = _initialized_machine()
    index = sm.state.applied_index + 1
    bad = msgpack.packb({"v": 1, "type": "create_namespace"}, use_bin_type=True)
    outcome = sm.apply(_entry(index, bad))
    assert not outcome.ok
    assert isinstance(outcome.exception(), MalformedCommandError)
    assert not isinstance(outcome.exception(), CommandFromNewerReleaseError)
