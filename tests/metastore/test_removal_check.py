"""metastore.daemon.removal_check: a removal of a path that is not loose is checked against the
table's manifests before the commit is proposed (apply cannot look inside them). The manifest
files are the in-memory Store of test_manifests; every case ends with apply's own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from metastore.commands import CommitTxn, TableName, TableWrite
from metastore.daemon.removal_check import RemovalCheck
from metastore.errors import (
    CommitTimestampUnavailableError,
    DataFileConflictError,
    InvalidArgumentError,
    ManifestUnreadableError,
    ReadConflictError,
    SchemaVersionNotActiveError,
    TableNotFoundError,
)
from metastore.manifests import ManifestRef
from metastore.state import MetastoreState
from metastore.txn import FileEntry
from tests.metastore._driver import DD_MS, Driver, ok, refused
from tests.metastore.test_manifests import (
    A,
    Store,
    add,
    command,
    compact,
    full_files,
    plan,
    ready,
    table_id,
    tick,
)


def checker(store: Store, **kw: int) -> RemovalCheck:
    return RemovalCheck(read=lambda _location, ref: list(store.read(ref)), **kw)


def now(state: MetastoreState | None) -> Callable[[], Awaitable[MetastoreState | None]]:
    """A catch-up that returns `state` (None: this node cannot catch up)."""

    async def catch_up() -> MetastoreState | None:
        return state

    return catch_up


def check(c: RemovalCheck, d: Driver, cmd: CommitTxn) -> None:
    """The check on a node that is up to date (catching up changes nothing)."""
    asyncio.run(c.check(d.state, cmd, catch_up=now(d.state)))


def test_a_path_in_no_manifest_is_refused_before_apply_would_take_it() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    compact(d, store)
    c = checker(store)
    check(c, d, add("t2", remove=("a",)))  # in a manifest, live: fine
    with pytest.raises(InvalidArgumentError, match="not a file of the table"):
        check(c, d, add("t2", remove=("a", "typo")))
    ok(d, add("t2", remove=("a",)))  # apply agrees for the real one
    # Now "a" is a delete entry: apply itself answers a second removal (a conflict).
    check(c, d, add("t3", remove=("a",)))
    assert c.manifests_read == 1  # immutable files: read once, then cached


def test_an_entry_a_compaction_folded_as_removed_is_a_conflict() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    compact(d, store)
    removed_ts = ok(d, add("t2", "c", remove=("a",)))["ts"]
    compact(d, store)  # folds the delete entry into a rewritten manifest
    c = checker(store)
    with pytest.raises(DataFileConflictError) as err:
        check(c, d, add("t3", remove=("a",)))
    assert err.value.details["removed_ts"] == removed_ts
    # An overwrite removed every live entry of the manifests: so is "b" after it.
    over_ts = ok(d, add("t4", "z", overwrite=True))["ts"]
    with pytest.raises(DataFileConflictError) as err:
        check(c, d, add("t5", remove=("b",)))
    assert err.value.details["removed_ts"] == over_ts


def test_retries_replays_overwrites_and_unreadable_manifests_are_left_to_apply() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    ok(d, add("t2", remove=("a",)))
    compact(d, store)  # "a" is now only a removed manifest entry
    c = checker(store)
    # A retry of a committed txn id: apply answers with the recorded result.
    check(c, d, add("t2", remove=("a",)))
    # A replayed stream position: apply answers BatchAlreadyCommitted.
    w = TableWrite(table=A, schema_version=1, remove=())
    ok(d, CommitTxn(txn_id="s1", writes=(w,), stream="q", seq=5))
    replay = TableWrite(table=A, schema_version=1, remove=("nope",))
    check(c, d, CommitTxn(txn_id="s1-again", writes=(replay,), stream="q", seq=5))
    with pytest.raises(InvalidArgumentError):
        check(c, d, CommitTxn(txn_id="s2", writes=(replay,), stream="q", seq=6))
    # An overwrite removes every live file anyway.
    check(c, d, add("t3", remove=("nope",), overwrite=True))

    def broken(_location: str, ref: ManifestRef) -> list[FileEntry]:
        raise ManifestUnreadableError("gone", details={"path": ref.path, "reason": "missing"})

    check(RemovalCheck(read=broken), d, add("t4", remove=("nope",)))


def test_the_cache_is_bounded_by_entries_and_keeps_the_newest() -> None:
    d, store = ready(), Store()
    for i in range(4):
        ok(d, add(f"t{i}", *(f"f{i}-{j}" for j in range(3))))
    compact(d, store)  # 4 manifests of 3 entries
    c = checker(store, cached_entries_max=6)
    check(c, d, add("x", remove=("f3-0",)))  # reads until found: all 4 manifests
    assert c.manifests_read == 4
    assert sum(len(v) for v in c._cache.values()) <= 6
    check(c, d, add("x", remove=("f3-0",)))  # the newest stayed cached
    assert c.manifests_read == 4  # found in a cached one: nothing read


def test_a_node_that_lags_catches_up_before_it_refuses() -> None:
    # The node that takes a commit may not have applied the commit that added a file yet (a
    # follower behind the leader, a new leader applying its log): the removal is valid, and
    # apply, where it runs, accepts it. A refusal must rest on a state that has caught up.
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    lagging = MetastoreState.from_snapshot(d.state.to_snapshot())
    ok(d, add("t2", "b"))  # applied by the leader, not yet by the lagging node
    c = checker(store)
    remove_b = add("t3", remove=("b",))
    asyncio.run(c.check(lagging, remove_b, catch_up=now(d.state)))
    # It cannot catch up (e.g. no quorum to confirm leadership): apply decides, as for an
    # unreadable manifest.
    asyncio.run(c.check(lagging, remove_b, catch_up=now(None)))
    # A path that is not there after catching up is refused.
    with pytest.raises(InvalidArgumentError, match="not a file of the table"):
        asyncio.run(c.check(lagging, add("t4", remove=("typo",)), catch_up=now(d.state)))
    ok(d, remove_b)  # apply agrees


def test_a_batch_planned_against_a_dropped_incarnation_gets_apply_s_table_not_found() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    old_id = table_id(d)
    d.ok("DROP TABLE ns.a")
    d.ok("CREATE TABLE ns.a (x INT)")
    tick(d, DD_MS + 1)
    ok(d, add("t2", "n"))
    compact(d, store)  # the new incarnation has a manifest
    stale = TableWrite(table=A, table_id=old_id, schema_version=1, remove=("a",))
    cmd = CommitTxn(txn_id="t3", writes=(stale,))
    check(checker(store), d, cmd)  # not InvalidArgument: "a" is a file of the old incarnation
    refused(d, cmd, TableNotFoundError)


def test_a_stale_read_set_gets_apply_s_read_conflict() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    compact(d, store)
    read_ts = d.state.txns.last_commit_ts
    ok(d, add("t2", remove=("a",)))  # a concurrent writer removed "a"
    compact(d, store)  # and its delete entry was folded into a manifest
    w = TableWrite(table=A, schema_version=1, remove=("a",))
    cmd = CommitTxn(txn_id="t3", writes=(w,), read_ts=read_ts, read_tables=(A,))
    check(checker(store), d, cmd)  # apply answers ReadConflict (retryable: re-read, re-plan)
    refused(d, cmd, ReadConflictError)


def test_a_reader_failure_of_any_kind_leaves_the_removal_to_apply() -> None:
    # E.g. a location whose scheme pyarrow cannot open (ArrowInvalid, a ValueError): our
    # trouble, not the commit's.
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)

    def broken(_location: str, _ref: ManifestRef) -> list[FileEntry]:
        raise ValueError("cannot open the location")

    check(RemovalCheck(read=broken), d, add("t2", remove=("nope",)))


def test_an_explicit_ts_below_the_last_commit_gets_apply_s_commit_timestamp_unavailable() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    w = TableWrite(table=A, schema_version=1, remove=("typo",))
    cmd = CommitTxn(txn_id="t2", writes=(w,), ts=d.state.txns.last_commit_ts)
    check(checker(store), d, cmd)  # apply answers CommitTimestampUnavailable (retryable)
    refused(d, cmd, CommitTimestampUnavailableError)


def test_a_removal_apply_refuses_itself_first_gets_apply_s_answer() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    ok(d, add("t2", "c"))
    ok(d, add("t3", remove=("c",)))  # a removed loose file
    c = checker(store)
    # apply stops at "c" (DataFileConflict, retryable) before it reaches "typo"
    conflict_first = add("t4", remove=("c", "typo"))
    check(c, d, conflict_first)
    refused(d, conflict_first, DataFileConflictError)
    # "typo" comes first: the check answers for it, as apply would if it could see manifests
    with pytest.raises(InvalidArgumentError, match="not a file of the table"):
        check(c, d, add("t5", remove=("typo", "c")))


def test_a_schema_version_not_active_gets_apply_s_answer_not_the_bad_path() -> None:
    # Apply checks the schema version before the removals: a batch planned against a version
    # that is no longer among the two latest must hear SchemaVersionNotActive (retryable:
    # re-plan), whatever it removes.
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    d.ok("ALTER TABLE ns.a ADD COLUMN y INT")
    d.ok("ALTER TABLE ns.a ADD COLUMN z INT")
    tick(d, DD_MS + 1)  # v3 active: v1 is not among the two latest any more
    w = TableWrite(table=A, schema_version=1, remove=("typo",))
    cmd = CommitTxn(txn_id="t2", writes=(w,))
    check(checker(store), d, cmd)
    e = refused(d, cmd, SchemaVersionNotActiveError)
    assert e.retryable
    # Planned against v3, the same removal is the check's to refuse.
    good = CommitTxn(txn_id="t3", writes=(TableWrite(table=A, schema_version=3, remove=("typo",)),))
    with pytest.raises(InvalidArgumentError, match="not a file of the table"):
        check(checker(store), d, good)


def test_a_reused_path_among_the_adds_gets_apply_s_answer() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    ok(d, add("t2", "b"))
    cmd = add("t3", "b", remove=("typo",))  # "b" is already a file: apply checks adds first
    check(checker(store), d, cmd)
    refused(d, cmd, InvalidArgumentError)
    assert "already a file of the table" in str(refused(d, cmd, InvalidArgumentError))


def test_a_bad_path_in_an_earlier_write_comes_before_a_later_write_s_refusal() -> None:
    # Apply plans the writes in order: the first write's removals come before the second
    # write's checks, so an apply that could see manifests would refuse the bad path first.
    d, store = ready(), Store()
    d.ok("CREATE TABLE ns.b (x INT)")
    tick(d, DD_MS + 1)
    ok(d, add("t1", "a"))
    compact(d, store)
    bad_path = TableWrite(table=A, schema_version=1, remove=("typo",))
    stale_version = TableWrite(table=TableName.of("ns", "b"), schema_version=2)
    with pytest.raises(InvalidArgumentError, match="not a file of the table"):
        check(checker(store), d, CommitTxn(txn_id="t2", writes=(bad_path, stale_version)))
    # The other way round, apply refuses the first write itself.
    cmd = CommitTxn(txn_id="t3", writes=(stale_version, bad_path))
    check(checker(store), d, cmd)
    refused(d, cmd, SchemaVersionNotActiveError)


def test_a_path_live_in_a_merged_manifest_beside_its_removed_second_entry_is_removable() -> None:
    """A path committed again (its first entry already in a manifest) and removed while the
    second entry was loose stays listed by its first entry. Once a merge puts both entries in
    one manifest, the check kept the last one it read (removed) and refused the removal of a
    file every reader lists as live (DATA_FILE_CONFLICT), which apply accepts. (Below apply
    version 5: from it, that removal removes the first entry too.)"""
    d, store = _removed_while_loose_then_merged(apply_version=4)
    assert len(d.state.txns.manifest_refs(table_id(d))) == 1
    assert "a" in [f[0] for f in full_files(d, store, d.state.safe_time)]
    check(checker(store), d, add("t4", remove=("a",)))
    ok(d, add("t4", remove=("a",)))  # apply's answer


def test_a_path_removed_while_its_second_entry_was_loose_is_removed_for_the_check_too() -> None:
    """Apply version 5: the removal while the second entry was loose removed the first (in a
    manifest) too, so no reader lists the path, and the check refuses another removal as
    already removed (what apply would answer if it could see the merged manifest)."""
    d, store = _removed_while_loose_then_merged(apply_version=5)
    assert "a" not in [f[0] for f in full_files(d, store, d.state.safe_time)]
    with pytest.raises(DataFileConflictError):
        check(checker(store), d, add("t4", remove=("a",)))


def _removed_while_loose_then_merged(apply_version: int) -> tuple[Driver, Store]:
    d, store = ready(apply_version), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    ok(d, add("t2", "a", "b"))  # "a" again: its first entry is not loose
    ok(d, add("t3", remove=("a",)))  # removes the loose (second) entry; from v5 the first too
    compact(d, store)
    p = plan(d, store, merge_at=1)  # below v5 both entries of "a" end in one manifest
    if p is not None:
        ok(d, command(d, store, p))
    return d, store
