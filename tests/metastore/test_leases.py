"""Sessions and schema leases (metastore.leases): expiry judged by Tm only, leases only on the two
latest versions, an ALTER that would publish a third leased version refused with its blockers
until they drain, leases moot after DROP, snapshots, decoding, and - over random histories - the
two-version invariant and identical expiry on two replicas fed the same log."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from metastore import limits
from metastore.commands import (
    AcquireLeases,
    CloseSession,
    Command,
    CommitTxn,
    DataFile,
    ExpireSessions,
    HeartbeatSession,
    LeaseKey,
    OpenSession,
    ReleaseLeases,
    SessionInfo,
    TableName,
    TableWrite,
    decode_command,
    encode_command,
    validate_command,
)
from metastore.ddl import parse_ddl
from metastore.errors import (
    CatalogInvariantError,
    InvalidArgumentError,
    LeaseVersionNotLatestError,
    LimitExceededError,
    MalformedCommandError,
    MetastoreError,
    SchemaChangeBlockedError,
    SessionNotFoundError,
)
from metastore.leases import Lease
from metastore.state import MetastoreState
from tests.metastore._driver import DD_MS, MS, Driver, ok, refused
from tests.metastore._support import DETERMINISTIC

T = TableName.of("ns", "t")
INFO = SessionInfo(app_id="app-1", app_name="etl", host="h1", user="ana", pid=42, started_at_ms=7)
TTL_MS = 1_000


def open_cmd(session_id: str = "s1", *, ttl_ms: int = TTL_MS, info: SessionInfo = INFO) -> Command:
    return OpenSession(session_id=session_id, info=info, ttl_ms=ttl_ms, opened_by="writer")


def key(version: int, *, table_id: int = 1, table: TableName = T) -> LeaseKey:
    return LeaseKey(table=table, table_id=table_id, version=version)


def alter(n: int) -> Command:
    return parse_ddl(f"ALTER TABLE ns.t ADD COLUMN c{n} INT")


def table_driver() -> Driver:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (id BIGINT)")
    return d


# --------------------------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------------------------


def test_a_session_lives_while_it_heartbeats_and_expires_by_tm_alone() -> None:
    d = table_driver()
    opened = ok(d, open_cmd())
    assert opened["created"] is True and opened["deadline_tm"] == d.tm + TTL_MS * MS
    # Re-opening with the same settings is idempotent; with others it is refused.
    again = ok(d, open_cmd())
    assert again["created"] is False
    refused(d, open_cmd(ttl_ms=2_000), InvalidArgumentError)
    ok(d, HeartbeatSession(session_id="s1"))
    # Heartbeats move the deadline; the gap between them may approach the TTL.
    for _ in range(3):
        beat = ok(d, HeartbeatSession(session_id="s1"), step_ms=TTL_MS - 1)
        assert beat["deadline_tm"] == d.tm + TTL_MS * MS
    # At exactly the deadline the session is expired: no heartbeat brings it back.
    deadline = beat["deadline_tm"]
    assert isinstance(deadline, int)
    d.tm = deadline - MS
    e = refused(d, HeartbeatSession(session_id="s1"), SessionNotFoundError)
    assert e.details == {"session_id": "s1", "expired_at_tm": deadline}
    assert d.state.sessions.expired_at(d.tm) == ["s1"]
    # The leader's sweep: apply re-checks the deadline against the entry's own Tm.
    swept = ok(d, ExpireSessions(session_ids=("s1", "nobody"), reason="ttl", by="leader"))
    assert swept == {"expired": ["s1"], "skipped": ["nobody"], "reason": "ttl"}
    assert d.state.sessions.session("s1") is None
    [ended] = d.state.sessions.ended()
    assert (ended.session_id, ended.reason, ended.by, ended.app_id) == (
        "s1",
        "ttl",
        "leader",
        "app-1",
    )
    refused(d, HeartbeatSession(session_id="s1"), SessionNotFoundError)


def test_a_ttl_sweep_skips_a_session_that_heartbeated_first() -> None:
    d = table_driver()
    ok(d, open_cmd())
    swept = ok(d, ExpireSessions(session_ids=("s1",), reason="ttl", by="leader"))
    assert swept["skipped"] == ["s1"]
    assert d.state.sessions.session("s1") is not None
    # An admin expiry does not wait for the deadline.
    forced = ok(d, ExpireSessions(session_ids=("s1",), reason="admin", by="root"))
    assert forced["expired"] == ["s1"]
    assert d.state.sessions.ended()[-1].reason == "admin"


def test_close_releases_everything_and_is_idempotent() -> None:
    d = table_driver()
    ok(d, open_cmd())
    ok(d, AcquireLeases(session_id="s1", leases=(key(1),)))
    assert ok(d, CloseSession(session_id="s1")) == {"session_id": "s1", "closed": True}
    assert d.state.sessions.leases() == []
    assert ok(d, CloseSession(session_id="s1")) == {"session_id": "s1", "closed": False}


def test_an_ended_session_id_is_never_opened_again() -> None:
    """A session that ended (closed, expired and swept, or expired by an admin) must not come
    back under its id: the orphan scan deletes the old files of its attempt directories once it
    is not live, and a commit listing them is refused only while it is not live."""
    d = table_driver()
    ok(d, open_cmd("s1"))
    ok(d, CloseSession(session_id="s1"))
    ok(d, open_cmd("s2"))
    d.tm += TTL_MS * MS
    ok(d, ExpireSessions(session_ids=("s2",), reason="ttl", by="leader"))
    ok(d, open_cmd("s3"))
    ok(d, ExpireSessions(session_ids=("s3",), reason="admin", by="root"))
    for session_id in ("s1", "s2", "s3"):
        e = refused(d, open_cmd(session_id), InvalidArgumentError)
        assert e.details["session_id"] == session_id
    assert ok(d, open_cmd("s4"))["created"] is True


def test_the_number_of_sessions_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_SESSIONS", 2)
    d = table_driver()
    ok(d, open_cmd("a"))
    ok(d, open_cmd("b"))
    e = refused(d, open_cmd("c"), LimitExceededError)
    assert e.details["limit"] == "MAX_SESSIONS"


def held_by(d: Driver, session_id: str) -> list[Lease]:
    return [lease for lease in d.state.sessions.leases() if lease.session_id == session_id]


@pytest.mark.parametrize("apply_version", [2, 3])
def test_the_leases_of_the_cluster_are_bounded_from_apply_version_3(
    monkeypatch: pytest.MonkeyPatch, apply_version: int
) -> None:
    monkeypatch.setattr(limits, "MAX_LEASES", 2)
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    for name in ("t", "u"):
        d.ok(f"CREATE TABLE ns.{name} (id BIGINT)")
    u = TableName.of("ns", "u")
    for session_id in ("a", "b"):
        ok(d, open_cmd(session_id))
    ok(d, AcquireLeases(session_id="a", leases=(key(1), key(1, table_id=2, table=u))))
    ok(d, AcquireLeases(session_id="a", leases=(key(1),)))  # held already: no new lease
    third = AcquireLeases(session_id="b", leases=(key(1),))
    if apply_version < 3:  # the rule is new in version 3: older nodes accept it
        ok(d, third)
        return
    e = refused(d, third, LimitExceededError)
    assert e.details["limit"] == "MAX_LEASES"
    assert held_by(d, "b") == []  # nothing changed
    # Room comes back when a session ends (its leases go with it).
    ok(d, CloseSession(session_id="a"))
    ok(d, third)


def test_a_sessions_leases_go_with_it_whatever_else_is_held() -> None:
    """Ending a session drops exactly its leases (indexed by session, not found by a scan)."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (id BIGINT)")
    d.ok("CREATE TABLE ns.u (id BIGINT)")
    u = TableName.of("ns", "u")
    for session_id in ("a", "b", "c"):
        ok(d, open_cmd(session_id))
        ok(d, AcquireLeases(session_id=session_id, leases=(key(1), key(1, table_id=2, table=u))))
    ok(d, ReleaseLeases(session_id="b", leases=(key(1),)))
    ok(d, CloseSession(session_id="a"))
    ok(d, ExpireSessions(session_ids=("b",), reason="admin", by="root"))
    assert [(x.table_id, x.version) for x in held_by(d, "c")] == [(1, 1), (2, 1)]
    assert held_by(d, "a") == held_by(d, "b") == []
    # Per table, in acquisition order (indexed by table too, for the leases that hold up a
    # table's next version).
    assert [x.session_id for x in d.state.sessions.leases(table_id=2)] == ["c"]
    ok(d, open_cmd("e"))
    ok(d, AcquireLeases(session_id="e", leases=(key(1, table_id=2, table=u),)))
    assert [x.session_id for x in d.state.sessions.leases(table_id=2)] == ["c", "e"]
    assert [r["session_id"] for r in d.state.sessions.leases_below(2, 2, tm=d.tm)] == ["c", "e"]
    restored = MetastoreState.from_snapshot(d.state.to_snapshot())
    restored.check_invariants()  # the index is rebuilt from the snapshot's leases
    assert restored.sessions == d.state.sessions


def attempt_commit(d: Driver, txn: str, *paths: str) -> CommitTxn:
    return CommitTxn(
        txn_id=txn,
        writes=(
            TableWrite(
                table=T,
                schema_version=d.state.current(T).version,
                add=tuple(DataFile(path=p, size_bytes=10, row_count=1) for p in paths),
            ),
        ),
    )


def test_a_commit_of_files_in_the_attempt_directory_of_a_session_not_live_is_refused() -> None:
    """The orphan scan deletes old files in the attempt directory (`_txn/<session>--...`) of a
    session that is not live (gc_worker). A commit listing such files after that would make an
    acknowledged commit whose files are gone: apply refuses it, changing nothing."""
    d = table_driver()
    d.tm += 2 * DD_MS * MS  # the table's first version is active
    ok(d, open_cmd("s1"))
    ok(d, open_cmd("s2", ttl_ms=100 * TTL_MS))
    ok(d, open_cmd("s3"))
    live = "_txn/s1--q_1_7-0123456789ab/part-0.parquet"
    done = ok(d, attempt_commit(d, "t1", live, "_txn/append-0123/part-0.parquet", "part-9.parquet"))
    ok(d, HeartbeatSession(session_id="s1"))
    ok(d, CloseSession(session_id="s3"))
    # s1 misses its deadline (expired, not swept yet); s3 closed; "ghost" never existed.
    d.tm += TTL_MS * MS
    for owner, path in [
        ("s1", "_txn/s1--q_1_8-0123456789ab/part-0.parquet"),
        ("s3", "_txn/s3--q_1_8-0123456789ab/part-0.parquet"),
        ("ghost", "_txn/ghost--q_1_8-0123456789ab/part-0.parquet"),
        ("s1", "sub/_txn/s1--q_1_8-0123456789ab/part-0.parquet"),
    ]:
        ok_path = "_txn/s2--q_1_8-0123456789ab/part-1.parquet"
        e = refused(d, attempt_commit(d, "t2", ok_path, path), SessionNotFoundError)
        assert (e.details["session_id"], e.details["path"]) == (owner, path)
        assert e.details["table"] == str(T)
    # A live session's files commit; the retry of a commit that got in before the expiry is
    # still answered as committed.
    ok(d, attempt_commit(d, "t3", "_txn/s2--q_1_9-0123456789ab/part-0.parquet"))
    again = ok(
        d, attempt_commit(d, "t1", live, "_txn/append-0123/part-0.parquet", "part-9.parquet")
    )
    assert again["deduplicated"] is True and again["ts"] == done["ts"]


# --------------------------------------------------------------------------------------------
# Leases and the two-version gate
# --------------------------------------------------------------------------------------------


def test_leases_only_on_the_two_latest_versions() -> None:
    d = table_driver()
    ok(d, open_cmd())
    d.ok("ALTER TABLE ns.t ADD COLUMN a INT")
    d.ok("ALTER TABLE ns.t ADD COLUMN b INT")  # versions 1, 2, 3
    e = refused(d, AcquireLeases(session_id="s1", leases=(key(1),)), LeaseVersionNotLatestError)
    assert e.retryable and e.details["latest_versions"] == [2, 3]
    refused(d, AcquireLeases(session_id="s1", leases=(key(4),)), LeaseVersionNotLatestError)
    refused(
        d, AcquireLeases(session_id="s1", leases=(key(3, table_id=9),)), LeaseVersionNotLatestError
    )
    # All or nothing: one bad lease refuses the whole command.
    refused(d, AcquireLeases(session_id="s1", leases=(key(3), key(1))), LeaseVersionNotLatestError)
    result = ok(d, AcquireLeases(session_id="s1", leases=(key(2), key(3))))
    assert [x["version"] for x in result["leases"]] == [2, 3]  # type: ignore[index, union-attr]
    ok(d, AcquireLeases(session_id="s1", leases=(key(3),)))  # idempotent
    assert len(d.state.sessions.leases()) == 2
    refused(d, AcquireLeases(session_id="ghost", leases=(key(3),)), SessionNotFoundError)


def test_an_alter_waits_for_leases_on_the_version_before_the_current_one() -> None:
    d = table_driver()
    ok(d, open_cmd())
    ok(d, AcquireLeases(session_id="s1", leases=(key(1),)))
    # v2 can be published: leases on v1 and v2 are the two latest.
    ok(d, parse_ddl("ALTER TABLE ns.t SET TBLPROPERTIES ('k' = 'v')"))
    # v3 would leave a lease on v1, a third version: refused, naming who holds it.
    e = refused(d, alter(2), SchemaChangeBlockedError)
    assert e.retryable
    assert e.details["publishing_version"] == 3
    [blocker] = e.details["blockers"]  # type: ignore[misc]
    assert {k: blocker[k] for k in ("session_id", "app_id", "host", "user", "pid", "version")} == {
        "session_id": "s1",
        "app_id": "app-1",
        "host": "h1",
        "user": "ana",
        "pid": 42,
        "version": 1,
    }
    # A no-op ALTER publishes nothing, so nothing blocks it.
    assert ok(d, parse_ddl("ALTER TABLE ns.t SET TBLPROPERTIES ('k' = 'v')"))["changed"] is False
    # Released: the change goes through.
    assert ok(d, ReleaseLeases(session_id="s1", leases=(key(1),)))["released"] == 1
    ok(d, alter(2))


def test_a_dead_sessions_leases_block_only_until_its_deadline() -> None:
    d = table_driver()
    acquired = ok(d, open_cmd())
    ok(d, AcquireLeases(session_id="s1", leases=(key(1),)))
    ok(d, alter(1))
    refused(d, alter(2), SchemaChangeBlockedError)
    deadline = d.state.sessions.session("s1").deadline_tm  # type: ignore[union-attr]
    assert deadline > acquired["deadline_tm"]  # type: ignore[operator]  # acquiring renewed it
    d.tm = deadline - 2 * MS
    refused(d, alter(2), SchemaChangeBlockedError)  # one HLC ms before the deadline
    ok(d, alter(2))  # at the deadline: no sweep needed, the lease no longer counts
    assert d.state.sessions.blockers(d.state.catalog.live_table(T), tm=d.tm) == []


def test_leases_of_a_dropped_table_are_dropped_with_it() -> None:
    d = table_driver()
    ok(d, open_cmd())
    ok(d, AcquireLeases(session_id="s1", leases=(key(1),)))
    d.ok("DROP TABLE ns.t")
    assert d.state.sessions.leases() == []
    d.ok("CREATE TABLE ns.t (id BIGINT)")
    refused(d, AcquireLeases(session_id="s1", leases=(key(1),)), LeaseVersionNotLatestError)
    ok(d, AcquireLeases(session_id="s1", leases=(key(1, table_id=2),)))


def test_refused_leases_and_sessions_change_nothing_and_releases_are_forgiving() -> None:
    d = table_driver()
    ok(d, open_cmd())
    assert ok(d, ReleaseLeases(session_id="s1", leases=(key(1),)))["released"] == 0
    assert ok(d, ReleaseLeases(session_id="ghost", leases=(key(1),)))["released"] == 0


def test_check_invariants_catches_a_third_leased_version() -> None:
    d = table_driver()
    ok(d, open_cmd())
    ok(d, AcquireLeases(session_id="s1", leases=(key(1),)))
    ok(d, alter(1))
    held = d.state.sessions._leases[(1, 1, "s1")]
    d.state.sessions._drop_lease((1, 1, "s1"))  # bypass the gate, as a bug would
    ok(d, alter(2))
    ok(d, HeartbeatSession(session_id="s1"))
    d.state.sessions._leases[(1, 1, "s1")] = held
    d.state.sessions._index_lease((1, 1, "s1"))
    with pytest.raises(CatalogInvariantError, match="two-version"):
        d.state.check_invariants()


# --------------------------------------------------------------------------------------------
# Snapshots and the wire
# --------------------------------------------------------------------------------------------


def test_snapshots_keep_sessions_leases_and_endings_and_version_2_loads() -> None:
    d = table_driver()
    ok(d, open_cmd("a"))
    ok(d, open_cmd("b", ttl_ms=5_000))
    ok(d, AcquireLeases(session_id="a", leases=(key(1),)))
    ok(d, CloseSession(session_id="b"))
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state and restored.to_snapshot() == snap
    obj = msgpack.unpackb(snap, raw=False)
    del obj["sessions"], obj["gc"], obj["jobs"]
    del obj["revoked"], obj["apply_version"]  # formats 7 and 8
    obj["v"] = 2
    old = MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    assert old.sessions.is_empty()
    obj = msgpack.unpackb(snap, raw=False)
    obj["sessions"]["leases"][0][4] = "nobody"  # a lease of no session
    with pytest.raises(MetastoreError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_a_lease_keeps_the_earliest_read_of_its_batches_and_snapshots_keep_it() -> None:
    d = table_driver()
    ok(d, open_cmd("a", ttl_ms=100_000))
    ok(d, AcquireLeases(session_id="a", leases=(key(1),)))
    (lease,) = d.state.sessions.leases()
    assert lease.read_ts is None  # an older client's lease: the acquired Tm margin only
    acquired = lease.acquired_tm
    old_snap = d.state.to_snapshot()
    assert len(msgpack.unpackb(old_snap, raw=False)["sessions"]["leases"][0]) == 6
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), read_ts=d.tm - 50, reads=(1,)))
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), read_ts=d.tm - 10, reads=(1,)))
    (lease,) = d.state.sessions.leases()
    assert lease.read_ts == d.tm - 2 * MS - 50  # the earlier batch's read stays the floor
    assert lease.acquired_tm == acquired  # unchanged by the later acquires
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state and restored.to_snapshot() == snap
    assert restored.sessions.leases()[0].read_ts == lease.read_ts
    assert MetastoreState.from_snapshot(old_snap).sessions.leases()[0].read_ts is None
    obj = msgpack.unpackb(snap, raw=False)
    obj["sessions"]["leases"][0].extend([d.tm, 1])  # nine items
    with pytest.raises(MetastoreError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_a_renewing_holders_leases_keep_their_snapshot_form_and_old_rows_load() -> None:
    # A renewing holder's command marks the leases it names (touched_tm): an eighth item, with
    # read_ts nil for a lease that records no read; rows of older snapshots load unchanged.
    d = table_driver()
    ok(d, open_cmd("a", ttl_ms=100_000))
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), known_tm=0))
    (lease,) = d.state.sessions.leases()
    assert (lease.read_ts, lease.touched_tm) == (None, d.tm)
    snap = d.state.to_snapshot()
    row = msgpack.unpackb(snap, raw=False)["sessions"]["leases"][0]
    assert row[6:] == [None, d.tm]
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state and restored.to_snapshot() == snap
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), read_ts=d.tm, reads=(1,), known_tm=0))
    snap = d.state.to_snapshot()
    assert msgpack.unpackb(snap, raw=False)["sessions"]["leases"][0][6:] == [d.tm - MS, d.tm]
    assert MetastoreState.from_snapshot(snap) == d.state
    obj = msgpack.unpackb(snap, raw=False)
    obj["sessions"]["leases"][0][7] = 1  # touched before it was acquired
    with pytest.raises(MetastoreError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    obj["sessions"]["leases"][0][7] = "x"
    with pytest.raises(MetastoreError):
        MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_a_release_keeps_a_lease_an_entry_after_its_known_tm_touched() -> None:
    # The bridge releases a lease whose batches all ended; a new batch's pin may cross the
    # release on the wire and be applied first. The release then used to drop the lease that
    # batch had just pinned: until the bridge took it again, nothing kept GC below its reads or
    # held schema changes off. A release with known_tm leaves a lease touched after it alone.
    d = table_driver()
    d.apply(alter(1)).raise_for_error()
    ok(d, open_cmd("a", ttl_ms=100_000))
    ok(d, AcquireLeases(session_id="a", leases=(key(1), key(2)), known_tm=0))
    known = d.tm
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), known_tm=known))  # the crossing pin
    result = ok(d, ReleaseLeases(session_id="a", leases=(key(1), key(2)), known_tm=known))
    assert (result["released"], result["kept"]) == (1, [[1, 1]])
    assert [(lease.table_id, lease.version) for lease in d.state.sessions.leases()] == [(1, 1)]
    result = ok(d, ReleaseLeases(session_id="a", leases=(key(1),), known_tm=d.tm))
    assert (result["released"], result["kept"]) == (1, [])
    # Without known_tm (older entries, the CLI) a release drops what it names, as before.
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), known_tm=0))
    assert ok(d, ReleaseLeases(session_id="a", leases=(key(1),))) == {
        "session_id": "a",
        "released": 1,
        "released_leases": [[1, 1]],  # apply version 3
    }


def test_a_plain_acquire_never_moves_a_lease_forward_as_before() -> None:
    # Entries from before renewals existed (no known_tm) replay as they did: a held lease keeps
    # its first acquired Tm and the earliest read_ts, whatever renew_from-less acquires say.
    d = table_driver()
    ok(d, open_cmd("a", ttl_ms=100_000))
    first = d.tm + MS
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), read_ts=first - 9, reads=(1,)))
    ok(d, AcquireLeases(session_id="a", leases=(key(1),), read_ts=d.tm, reads=(1,)))
    (lease,) = d.state.sessions.leases()
    assert (lease.acquired_tm, lease.read_ts, lease.touched_tm) == (first, first - 9, None)


@pytest.mark.parametrize(
    "cmd",
    [
        open_cmd(),
        HeartbeatSession(session_id="s1", request_id="r"),
        CloseSession(session_id="s1"),
        ExpireSessions(session_ids=("a", "b"), reason="admin", by="root"),
        AcquireLeases(session_id="s1", leases=(key(1), key(2, table_id=3))),
        AcquireLeases(session_id="s1", leases=(key(1), key(2, table_id=3)), read_ts=77, reads=(3,)),
        AcquireLeases(session_id="s1", leases=(key(1),), known_tm=0),
        AcquireLeases(session_id="s1", leases=(key(1),), known_tm=5, renew_from=9),
        AcquireLeases(
            session_id="s1", leases=(key(1),), read_ts=7, reads=(1,), known_tm=5, renew_from=9
        ),
        ReleaseLeases(session_id="s1", leases=(key(1),)),
        ReleaseLeases(session_id="s1", leases=(key(1),), known_tm=0),
    ],
)
def test_session_commands_round_trip(cmd: Command) -> None:
    assert decode_command(encode_command(cmd)) == cmd


def test_an_acquire_without_renewal_keeps_its_encoding() -> None:
    # Entries in the log (and request-id fingerprints) from before renewals existed.
    from metastore.commands import command_to_data

    data = command_to_data(AcquireLeases(session_id="s1", leases=(key(1),), read_ts=7, reads=(1,)))
    assert "known_tm" not in data and "renew_from" not in data
    assert "known_tm" not in command_to_data(ReleaseLeases(session_id="s1", leases=(key(1),)))


@pytest.mark.parametrize(
    "cmd",
    [
        open_cmd(""),
        open_cmd("x" * (limits.MAX_SESSION_ID_CHARS + 1)),
        open_cmd("a\nb"),
        open_cmd(ttl_ms=limits.SESSION_TTL_MS_MIN - 1),
        open_cmd(ttl_ms=limits.SESSION_TTL_MS_MAX + 1),
        open_cmd(info=SessionInfo(pid=-1)),
        open_cmd(info=SessionInfo(host="h" * (limits.MAX_SESSION_LABEL_CHARS + 1))),
        ExpireSessions(session_ids=(), reason="ttl"),
        ExpireSessions(session_ids=("a",), reason="because"),
        ExpireSessions(session_ids=("a", "a"), reason="admin"),
        AcquireLeases(session_id="s1", leases=()),
        AcquireLeases(session_id="s1", leases=(key(1), key(1))),
        AcquireLeases(session_id="s1", leases=(key(0),)),
        AcquireLeases(session_id="s1", leases=(key(1),), read_ts=5),
        AcquireLeases(session_id="s1", leases=(key(1),), reads=(1,)),
        AcquireLeases(session_id="s1", leases=(key(1),), read_ts=0, reads=(1,)),
        AcquireLeases(session_id="s1", leases=(key(1),), read_ts=5, reads=(2,)),
        AcquireLeases(session_id="s1", leases=(key(1),), read_ts=5, reads=(1, 1)),
        AcquireLeases(session_id="s1", leases=(key(1),), renew_from=5),
        AcquireLeases(session_id="s1", leases=(key(1),), known_tm=5, renew_from=0),
        AcquireLeases(session_id="s1", leases=(key(1),), known_tm=-1),
        AcquireLeases(session_id="s1", leases=(key(1),), known_tm=1 << 63),
        ReleaseLeases(session_id="s1", leases=(key(1, table_id=0),)),
        ReleaseLeases(session_id="s1", leases=(key(1),), known_tm=-1),
    ],
)
def test_bad_session_commands_are_refused_before_and_after_the_wire(cmd: Command) -> None:
    with pytest.raises((InvalidArgumentError, LimitExceededError)):
        validate_command(cmd)
    from metastore.commands import command_to_data

    with pytest.raises(MalformedCommandError):
        decode_command(msgpack.packb(command_to_data(cmd), use_bin_type=True))


# --------------------------------------------------------------------------------------------
# Random histories: two replicas, the two-version invariant, identical expiry
# --------------------------------------------------------------------------------------------

SESSIONS = ["a", "b", "c"]


class LeaseMachine(RuleBasedStateMachine):
    """Random opens, heartbeats, leases, releases, ALTERs, sweeps and snapshot restarts, applied
    to two replicas; after every step both agree exactly and all invariants hold."""

    def __init__(self) -> None:
        super().__init__()
        self.d = table_driver()
        self.replica = MetastoreState.from_snapshot(self.d.state.to_snapshot())
        self.alters = 0

    def _apply(self, cmd: Command, step_ms: int) -> None:
        outcome = self.d.apply(cmd, step_ms=step_ms)
        mirror = self.replica.apply(cmd, tm=self.d.tm, index=self.d.index)
        assert outcome == mirror
        if not outcome.ok:
            assert isinstance(outcome.exception(), MetastoreError)

    @rule(s=st.sampled_from(SESSIONS), step=st.integers(1, 700))
    def open(self, s: str, step: int) -> None:
        self._apply(open_cmd(s), step)

    @rule(s=st.sampled_from(SESSIONS), step=st.integers(1, 700))
    def heartbeat(self, s: str, step: int) -> None:
        self._apply(HeartbeatSession(session_id=s), step)

    @rule(s=st.sampled_from(SESSIONS), back=st.integers(0, 2), step=st.integers(1, 300))
    def acquire(self, s: str, back: int, step: int) -> None:
        inc = self.d.state.catalog.live_table(T)
        version = max(1, inc.versions[-1].version - back)
        self._apply(AcquireLeases(session_id=s, leases=(key(version),)), step)

    @rule(s=st.sampled_from(SESSIONS), data=st.data(), step=st.integers(1, 300))
    def release(self, s: str, data: st.DataObject, step: int) -> None:
        held = [x for x in self.d.state.sessions.leases() if x.session_id == s]
        if held:
            lease = data.draw(st.sampled_from(held))
            self._apply(ReleaseLeases(session_id=s, leases=(key(lease.version),)), step)

    @rule(step=st.integers(1, 300))
    def alter(self, step: int) -> None:
        self.alters += 1
        self._apply(alter(self.alters), step)

    @rule(step=st.integers(1, 1500))
    def sweep(self, step: int) -> None:
        """What the leader does: propose expiry of whoever is late at its clock now."""
        late = self.d.state.sessions.expired_at(self.d.tm + step * MS)
        if late:
            self._apply(ExpireSessions(session_ids=tuple(late), reason="ttl", by="leader"), step)

    @rule(s=st.sampled_from(SESSIONS), step=st.integers(1, 300))
    def close(self, s: str, step: int) -> None:
        self._apply(CloseSession(session_id=s), step)

    @precondition(lambda self: True)
    @rule()
    def restart_replica(self) -> None:
        self.replica = MetastoreState.from_snapshot(self.replica.to_snapshot())

    @invariant()
    def replicas_agree_and_two_versions_hold(self) -> None:
        self.d.state.check_invariants()
        assert self.replica == self.d.state
        inc = self.d.state.catalog.live_table(T)
        latest = inc.versions[-1].version
        for lease in self.d.state.sessions.leases():
            session = self.d.state.sessions.session(lease.session_id)
            assert session is not None
            if session.live_at(self.d.tm):
                assert lease.version >= latest - 1
        with contextlib.suppress(Exception):
            assert self.d.state.sessions.expired_at(self.d.tm) == self.replica.sessions.expired_at(
                self.d.tm
            )


TestLeaseMachine = LeaseMachine.TestCase
TestLeaseMachine.settings = settings(DETERMINISTIC, max_examples=60, stateful_step_count=40)
