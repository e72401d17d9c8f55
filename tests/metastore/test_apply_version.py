"""Apply versions (metastore.apply_version): a node never applies the log differently from its
peers because it runs an older release; it stops instead.

What each test would catch: a SetApplyVersion above this release's support applied as a failure
(the node would keep the old rules while its peers use the new ones), a version moving back, a
snapshot dropping the version (format 8), a snapshot or log entry of a newer release applied as
a refusal instead of stopping the node.
"""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest

from metastore import limits
from metastore import state as state_module
from metastore.apply_version import APPLY_VERSION_SUPPORTED, MAX_APPLY_VERSION
from metastore.catalog import version_bytes
from metastore.commands import (
    AdvanceSchemaJob,
    CommandFromNewerReleaseError,
    InitCluster,
    SetApplyVersion,
    decode_command,
    encode_command,
)
from metastore.daemon import api_limits
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.daemon.views import description_view, version_view
from metastore.errors import (
    InvalidArgumentError,
    LimitExceededError,
    MalformedCommandError,
    MalformedSnapshotError,
    ReleaseTooOldError,
)
from metastore.lexer import quote_string
from metastore.outcome import Outcome
from metastore.state import MetastoreState
from raft.core.types import Entry, EntryKind
from tests.metastore._driver import DD_MS, MS, T0, Driver


def test_a_cluster_initialized_without_a_version_is_at_version_one() -> None:
    d = Driver(apply_version=1)
    assert d.state.apply_version == 1 <= APPLY_VERSION_SUPPORTED
    assert d.state.rules_at_least(1) and not d.state.rules_at_least(2)


def test_set_apply_version_round_trips_and_is_validated() -> None:
    cmd = SetApplyVersion(version=3, by="admin@host", request_id="r1")
    assert decode_command(encode_command(cmd)) == cmd
    for bad in (0, -1, MAX_APPLY_VERSION + 1):
        with pytest.raises(MalformedCommandError):
            decode_command(encode_command(SetApplyVersion(version=bad)))


def test_the_current_version_is_a_no_op() -> None:
    d = Driver(apply_version=1)
    before = d.state.to_snapshot()
    out = d.apply(SetApplyVersion(version=1))
    assert out.ok and out.result == {"apply_version": 1, "previous": 1}
    after = MetastoreState.from_snapshot(d.state.to_snapshot())
    assert after.apply_version == MetastoreState.from_snapshot(before).apply_version == 1


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
    d = Driver(apply_version=1)
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
    d = Driver(apply_version=2)
    d.ok("CREATE NAMESPACE ns")
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    assert obj["v"] == 8 and obj["apply_version"] == 2
    del obj["apply_version"]
    obj["v"] = 7
    old = MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    assert old.apply_version == 1 and old.catalog == d.state.catalog


def test_at_version_one_the_snapshot_keeps_the_format_releases_before_apply_versions_read() -> None:
    """A cluster upgraded from a release before apply versions stays at version 1 until it is
    finalized, and a new leader sends its snapshots to the old release's nodes, which read
    format 7 at most (found by `make upgrade-check FROM=d9ecdf9`: the old follower stored the
    snapshot, failed to load it, and stopped; restarted, it failed again). Version 1 is what
    format 7 loads as, so nothing is lost; from version 2 the version must be in it."""
    d = Driver(apply_version=1)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (id BIGINT)")
    snap = d.state.to_snapshot()
    obj = msgpack.unpackb(snap, raw=False)
    assert obj["v"] == 7 and "apply_version" not in obj
    restored = MetastoreState.from_snapshot(snap)
    assert restored.apply_version == 1 and restored.catalog == d.state.catalog
    assert restored.to_snapshot() == snap


@pytest.mark.parametrize("bad", [0, -1, True, "2", None])
def test_a_snapshot_with_a_bad_version_is_refused(bad: object) -> None:
    obj = msgpack.unpackb(Driver().state.to_snapshot(), raw=False)
    obj["apply_version"] = bad
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_a_snapshot_format_of_a_newer_release_says_so() -> None:
    obj = msgpack.unpackb(Driver().state.to_snapshot(), raw=False)
    obj["v"] = state_module.SNAPSHOT_FORMAT_VERSION + 1
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


def test_a_new_cluster_starts_at_the_version_its_init_names() -> None:
    # The default encoding is unchanged, so entries of older releases decode as before.
    assert b"apply_version" not in encode_command(InitCluster(dd_ms=500, cs_max_ms=100))
    cmd = InitCluster(dd_ms=500, cs_max_ms=100, apply_version=APPLY_VERSION_SUPPORTED)
    assert decode_command(encode_command(cmd)) == cmd
    state = MetastoreState()
    assert state.apply(cmd, tm=T0, index=1).ok
    assert state.apply_version == APPLY_VERSION_SUPPORTED
    again = InitCluster(dd_ms=500, cs_max_ms=100, apply_version=1)
    assert state.apply(again, tm=T0 + MS, index=2).ok
    assert state.apply_version == APPLY_VERSION_SUPPORTED, "a repeated init moves nothing"
    fresh = MetastoreState()
    with pytest.raises(ReleaseTooOldError):
        fresh.apply(
            InitCluster(dd_ms=500, cs_max_ms=100, apply_version=APPLY_VERSION_SUPPORTED + 1),
            tm=T0,
            index=1,
        )
    assert fresh.cluster is None and fresh.applied_index == 0


# --- version 2: a schema version's size is bounded ----------------------------------------------

# Comments that Spark DDL must escape, so a reply's DDL text is twice their stored size.
_ESCAPED = "'\\" * 512


def _widen(d: Driver, table: str, columns: int, *, start: int = 0) -> list[Outcome]:
    """ALTERs adding `columns` wide columns, each statement within the statement limit."""
    outcomes = []
    for first in range(start, start + columns, 12):
        cols = ", ".join(
            f"c{n:04d}_{'x' * 100} STRING COMMENT {quote_string(_ESCAPED)}"
            for n in range(first, min(first + 12, start + columns))
        )
        outcomes.append(d.sql(f"ALTER TABLE {table} ADD COLUMNS ({cols})"))
    return outcomes


def test_version_1_keeps_the_old_rule_and_version_2_bounds_a_schema_version() -> None:
    d = Driver(apply_version=1)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.old (id INT)")
    # Version 1: no bound (what every node of an older release does).
    assert all(o.ok for o in _widen(d, "ns.old", 600))
    big = version_bytes(d.state.current("ns.old"))
    assert big > limits.MAX_SCHEMA_VERSION_BYTES
    assert d.apply(SetApplyVersion(version=2)).ok
    d.ok("CREATE TABLE ns.t (id INT)")
    outcomes = _widen(d, "ns.t", 600)
    refused = [o for o in outcomes if not o.ok]
    assert refused, "the bound was never reached"
    err = refused[0].exception()
    assert isinstance(err, LimitExceededError)
    assert err.details["limit"] == "MAX_SCHEMA_VERSION_BYTES"
    assert version_bytes(d.state.current("ns.t")) <= limits.MAX_SCHEMA_VERSION_BYTES
    # A refused ALTER changed nothing; the table beyond the bound can still shrink, not grow.
    before = d.state.to_snapshot()
    assert not _widen(d, "ns.t", 12, start=5000)[0].ok
    assert d.state.to_snapshot() == before
    assert not _widen(d, "ns.old", 12, start=5000)[0].ok
    d.ok("ALTER TABLE ns.old SET TBLPROPERTIES ('owner_team' = 'x')", step_ms=1)
    d.ok("ALTER TABLE ns.old UNSET TBLPROPERTIES ('owner_team')")
    d.state.check_invariants()


def test_the_largest_schema_version_allowed_fits_one_client_frame() -> None:
    d = Driver()
    assert d.state.rules_at_least(2)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (id INT)")
    props = ", ".join(f"'k{i:03d}' = '{'v' * 3900}'" for i in range(12))
    d.ok(f"ALTER TABLE ns.t SET TBLPROPERTIES ({props})")
    _widen(d, "ns.t", 600)
    # A running ADD COLUMN job makes replies show the write schema as well.
    d.ok("ALTER TABLE ns.t ADD COLUMN z STRING NOT NULL DEFAULT 'z'")
    [job] = d.state.jobs.jobs(running_only=True)
    assert d.apply(AdvanceSchemaJob(job_id=job.job_id, step=job.step), step_ms=DD_MS + 1).ok
    v = d.state.current("ns.t")
    assert v.write_schema != v.schema
    assert version_bytes(v) > limits.MAX_SCHEMA_VERSION_BYTES * 0.9
    for view in (version_view("ns.t", v), description_view(d.state.describe("ns.t"))):
        size = len(msgpack.packb(view, use_bin_type=True))
        assert size < api_limits.CLIENT_FRAME_BYTES_MAX - 64 * 1024, size


def test_below_version_2_a_node_proposes_lease_commands_without_the_renewal_fields() -> None:
    from metastore.commands import AcquireLeases, LeaseKey, ReleaseLeases, TableName
    from metastore.daemon.server import _for_apply_version

    key = LeaseKey(table=TableName.of("ns", "t"), table_id=1, version=1)
    acquire = AcquireLeases(session_id="s", leases=(key,), known_tm=5, renew_from=7)
    release = ReleaseLeases(session_id="s", leases=(key,), known_tm=5)
    old = Driver(apply_version=1).state
    assert _for_apply_version(acquire, old) == replace(acquire, known_tm=None, renew_from=None)
    assert _for_apply_version(release, old) == replace(release, known_tm=None)
    # Encoded without them, so a node of the previous release decodes the entry.
    assert b"known_tm" not in encode_command(_for_apply_version(acquire, old))
    new = Driver().state
    assert _for_apply_version(acquire, new) is acquire
    assert _for_apply_version(release, new) is release


def test_from_version_2_a_file_uri_and_its_path_are_one_directory_to_the_catalog() -> None:
    for version, second_ok in ((1, True), (2, False)):
        d = Driver(apply_version=version)
        d.ok("CREATE NAMESPACE ns")
        d.ok("CREATE TABLE ns.a (id INT) LOCATION '/w/t'")
        out = d.sql("CREATE TABLE ns.b (id INT) LOCATION 'file:///w/t/in'")
        assert out.ok is second_ok, version
        if not second_ok:
            err = out.exception()
            assert isinstance(err, InvalidArgumentError)
            assert err.details["table"] == "ns.a"
