"""GC and protected timestamps on a real 3-node cluster (separate OS processes on loopback).

A protection created through a follower holds the GC threshold below it (the files its reads
need stay on disk, answers are identical on every node); once released, `gc run` (forwarded to
the leader) moves the threshold, deletes exactly the files no read above it can see, and every
node then refuses reads at or below it with BEFORE_GC_THRESHOLD. Orphans: old unreferenced files
go, young ones and a live session's attempt directory stay. Protect and GC proposed concurrently
from different nodes never break a returned protection. A table dropped under a batch that
leased it for reading keeps its files until the batch lets go, and the batch's commits fail
whole. Roles, expiry and the CLI."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from metastore.client import SyncMetastoreClient
from metastore.commands import AdvanceGcThreshold, TableName, encode_command
from metastore.errors import (
    BeforeGcThresholdError,
    ForbiddenError,
    MetastoreError,
    ProtectionNotFoundError,
    ReadConflictError,
    TableNotFoundError,
)
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

TABLE = "gcns.t"
WAIT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("gc"),
        3,
        dd_ms=300,
        cs_max_ms=100,
        gc_interval_ms=3_600_000,  # runs only when asked, so each step is deterministic
        gc_orphan_grace_ms=2_000,
        session_ttl_ms=1_500,
        session_heartbeat_ms=300,
    ) as c:
        c.start_all()
        c.wait_ready()
        admin = _client(c, role="admin")
        admin.ddl("CREATE NAMESPACE gcns")
        admin.ddl(f"CREATE TABLE {TABLE} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        admin.close()
        yield c


def _client(
    c: MetastoreCluster, node_id: int | None = None, role: str = "writer", name: str = ""
) -> SyncMetastoreClient:
    ids = c.ids if node_id is None else [node_id]
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in ids]
    return SyncMetastoreClient(endpoints, c.token(role), client_name=name or f"gc-test-{role}")


def _roles(c: MetastoreCluster) -> tuple[int, list[int]]:
    leader = c.wait_ready()
    return leader, [i for i in c.ids if i != leader]


def _location(client: SyncMetastoreClient, table: str = TABLE) -> Path:
    return Path(str(client.describe(table)["location"]))


def _commit(
    client: SyncMetastoreClient, location: Path, names: list[str], *, overwrite: bool = False
) -> int:
    tag = uuid.uuid4().hex[:8]
    add = []
    for name in names:
        path = location / "_txn" / tag / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)
        add.append({"path": f"_txn/{tag}/{name}", "size_bytes": 100, "row_count": 1})
    result = client.commit(
        f"gc-{tag}",
        [{"table": TABLE, "schema_version": 1, "add": add, "overwrite": overwrite}],
    )
    return int(result["ts"])


def _paths(client: SyncMetastoreClient, ts: int) -> list[str]:
    return sorted(Path(f["path"]).name for f in client.files(TABLE, as_of=ts)["files"])


def _wait(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _refuses(client: SyncMetastoreClient, ts: int) -> bool:
    try:
        client.files(TABLE, as_of=ts)
    except BeforeGcThresholdError:
        return True
    return False


def test_protect_holds_gc_then_release_lets_it_delete_exactly_the_dead_files(
    cluster: MetastoreCluster,
) -> None:
    leader, followers = _roles(cluster)
    writer = _client(cluster, followers[0])
    admin = _client(cluster, followers[1], role="admin")
    readers = {i: _client(cluster, i, role="reader") for i in cluster.ids}
    try:
        location = _location(writer)
        ts1 = _commit(writer, location, ["a.parquet", "b.parquet"])
        ts2 = _commit(writer, location, ["c.parquet"], overwrite=True)
        record = writer.protect(ts1, tables=[TABLE], meta="nightly backup")
        time.sleep(1.5)  # the table's gc.ttl is 1 s: without the record all of ts1 is GC-able
        run = admin.gc_run(TABLE)
        (report,) = run["tables"]
        assert report["held_by"] == {"kind": "protection", "record_id": record["record_id"]}
        assert report["threshold"] == ts1 - 1 and run["files_deleted"] == 0
        for r in readers.values():  # every node still answers ts1 in full
            assert _paths(r, ts1) == ["a.parquet", "b.parquet"]
        assert all((location / "_txn").rglob("a.parquet"))
        status = admin.gc_status(TABLE)
        assert status["tables"][0]["protections"] == [record["record_id"]]
        assert status["protections"][0]["held_bytes"] == 200

        writer.release_protection(record["record_id"])
        with pytest.raises(ProtectionNotFoundError):
            writer.release_protection(record["record_id"])
        run = admin.gc_run(TABLE)
        assert (run["files_deleted"], run["bytes_deleted"]) == (2, 200)
        threshold = run["tables"][0]["threshold"]
        assert threshold >= ts2  # a, b were removed at ts2: nothing above it sees them
        on_disk = sorted(p.name for p in location.rglob("*.parquet"))
        assert on_disk == ["c.parquet"]
        for r in readers.values():
            _wait(lambda r=r: _refuses(r, ts1), "every node to refuse reads below the threshold")
            assert _paths(r, threshold + 1) == ["c.parquet"]
        with pytest.raises(BeforeGcThresholdError) as err:
            readers[leader].files(TABLE, as_of=ts1)
        assert err.value.details["threshold"] >= threshold
        assert "must be after GC threshold" in err.value.message
        # Protecting what GC already passed is refused: a returned protect always holds.
        with pytest.raises(BeforeGcThresholdError):
            writer.protect(ts1, tables=[TABLE])
        assert admin.gc_status(TABLE)["tables"][0]["file_entries"] == 1
    finally:
        for cl in (writer, admin, *readers.values()):
            cl.close()


def test_orphans_old_go_young_and_live_session_attempts_stay(cluster: MetastoreCluster) -> None:
    _, followers = _roles(cluster)
    writer = _client(cluster, followers[0])
    admin = _client(cluster, role="admin")
    try:
        location = _location(writer)
        _commit(writer, location, ["kept.parquet"])
        session_id = uuid.uuid4().hex
        writer.session_open(session_id, app_id="app-gc")
        old = time.time() - 60
        files = {
            "old": location / "_txn" / "crashed-attempt" / "part-0.parquet",
            "young": location / "_txn" / "running-attempt" / "part-0.parquet",
            "live": location / "_txn" / f"{session_id}--batch-7-abc" / "part-0.parquet",
        }
        for name, path in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"y" * 10)
            if name != "young":
                os.utime(path, (old, old))
        dry = admin.gc_run(TABLE, dry_run=True)
        assert dry["orphans_deleted"] == 1 and files["old"].exists()
        run = admin.gc_run(TABLE)
        assert run["orphans_deleted"] == 1
        assert not files["old"].exists() and not files["old"].parent.exists()
        assert files["young"].exists() and files["live"].exists()
        assert list(location.rglob("kept.parquet"))  # committed files are never orphans
        writer.session_close(session_id)
        run = admin.gc_run(TABLE)  # the session is gone: its old attempt is an orphan now
        assert not files["live"].exists()
    finally:
        writer.close()
        admin.close()


def test_protect_and_gc_racing_from_different_nodes_never_break_a_returned_protect(
    cluster: MetastoreCluster,
) -> None:
    leader, followers = _roles(cluster)
    writer = _client(cluster, followers[0])
    admin = _client(cluster, followers[1], role="admin")
    reader = _client(cluster, leader, role="reader")
    location = _location(writer)
    commits = [_commit(writer, location, [f"r{i}.parquet"], overwrite=True) for i in range(6)]
    # The protects below aim up to 1.2 s into the past: at the first commit or later, so the
    # table exists at every protected ts even when this test runs first on a fresh cluster.
    lookback = (900 << 16) + 6 * (50 << 16)
    while writer.clock.now() - lookback <= commits[0]:
        time.sleep(0.05)
    stop = threading.Event()
    gc_errors: list[BaseException] = []

    def gc_loop() -> None:
        while not stop.is_set():
            try:
                admin.gc_run(TABLE)
            except MetastoreError as exc:  # pragma: no cover - reported below
                gc_errors.append(exc)

    thread = threading.Thread(target=gc_loop, daemon=True)
    thread.start()
    protected: list[tuple[str, int]] = []
    refused = 0
    try:
        deadline = time.monotonic() + 5
        i = 0
        while time.monotonic() < deadline:
            # Aim just below now - TTL: the GC wants to pass exactly these timestamps.
            ts = writer.clock.now() - (900 << 16) - (i % 7) * (50 << 16)
            i += 1
            try:
                record = writer.protect(ts, tables=[TABLE])
                protected.append((str(record["record_id"]), ts))
            except BeforeGcThresholdError:
                refused += 1
        stop.set()
        thread.join(timeout=60)
        assert not gc_errors
        assert protected, "no protect got in"
        threshold = admin.gc_status(TABLE)["tables"][0]["threshold"]
        for _, ts in protected:
            assert threshold < ts
            reader.files(TABLE, as_of=ts)  # readable, and its files are on disk:
        live_at = {f["path"] for _, ts in protected for f in reader.files(TABLE, as_of=ts)["files"]}
        for rel in live_at:
            assert (location / rel).exists(), rel
        assert commits
    finally:
        stop.set()
        for record_id, _ in protected:
            writer.release_protection(record_id)
        for cl in (writer, admin, reader):
            cl.close()


def test_roles_expiry_and_the_cli(cluster: MetastoreCluster) -> None:
    writer = _client(cluster, name="alice")
    other = _client(cluster, name="bob")
    reader = _client(cluster, role="reader")
    admin = _client(cluster, role="admin")
    try:
        now = writer.clock.now()
        record = writer.protect(now, tables=[TABLE])
        with pytest.raises(ForbiddenError):
            other.release_protection(record["record_id"])
        with pytest.raises(ForbiddenError):
            reader.protect(now, tables=[TABLE])
        with pytest.raises(ForbiddenError):
            writer.gc_run(TABLE)
        # The internal forwarding op does not let a writer propose what only the leader may.
        cmd = AdvanceGcThreshold(table=TableName.parse(TABLE), table_id=1, up_to=now)
        with pytest.raises(ForbiddenError):
            writer.call("_propose", {"command": encode_command(cmd)})
        admin.release_protection(record["record_id"])  # another's record: admin may
        aged = writer.protect(now, tables=[TABLE], max_age_ms=300)
        _wait(
            lambda: any(
                r["record_id"] == aged["record_id"] and r["reason"] == "expired"
                for r in reader.protections(include_released=True)["released"]
            ),
            "the leader to release the expired record",
        )
        shown = reader.protection(aged["record_id"])
        assert shown["released"] is True and shown["reason"] == "expired"

        endpoints = ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids)
        runner = CliRunner()
        base = ["--endpoints", endpoints, "--token", cluster.token("admin"), "-o", "json"]
        out = runner.invoke(cli, [*base, "pts", "protect", "--ts", "now", "--table", TABLE])
        assert out.exit_code == 0, out.output
        record_id = json.loads(out.output)["record_id"]
        out = runner.invoke(cli, [*base, "pts", "list"])
        assert record_id in out.output
        out = runner.invoke(cli, [*base, "gc", "status", TABLE])
        assert out.exit_code == 0 and json.loads(out.output)["tables"][0]["table"] == TABLE
        out = runner.invoke(cli, [*base, "gc", "run", "--dry-run"])
        assert out.exit_code == 0, out.output
        out = runner.invoke(cli, [*base, "pts", "release", record_id])
        assert out.exit_code == 0, out.output
        out = runner.invoke(cli, [*base, "pts", "show", "nope"])
        assert out.exit_code == 4
        out = runner.invoke(cli, [*base, "pts", "protect", "--ts", "1", "--table", TABLE])
        assert out.exit_code == 4 and "GC threshold" in out.output
        table_out = runner.invoke(
            cli, ["--endpoints", endpoints, "--token", cluster.token(), "gc", "status"]
        )
        assert table_out.exit_code == 0 and TABLE in table_out.output
    finally:
        for cl in (writer, other, reader, admin):
            cl.close()


def test_protection_lists_are_paged(cluster: MetastoreCluster) -> None:
    """`pts_list` pages (a record can name 100 targets, so thousands outgrow one frame); the
    client follows the pages, active records by id and then released ones by release time."""
    writer = _client(cluster)
    raw = cluster.client(cluster.ids[0], role="reader")
    try:
        now = writer.clock.now()
        ids = [f"page-{i:03d}" for i in range(250)]
        for record_id in ids:
            writer.protect(now, tables=[TABLE], record_id=record_id)
        for record_id in ids[:120]:
            writer.release_protection(record_id)
        listing = writer.protections(include_released=True)
        active = [r["record_id"] for r in listing["records"] if r["record_id"].startswith("page-")]
        released = {r["record_id"] for r in listing["released"]}
        assert active == ids[120:]  # every page, in id order, nothing twice
        assert set(ids[:120]) <= released
        r = raw.call("pts_list")
        assert not r["ok"] and r["error"]["code"] == "LIMIT_EXCEEDED"
        r = raw.call("pts_list", limit=7)
        assert r["ok"] and len(r["result"]["records"]) == 7 and r["result"]["next_page_token"]
        for record_id in ids[120:]:
            writer.release_protection(record_id)
    finally:
        writer.close()
        raw.close()


def test_gc_of_a_dropped_table_keeps_files_its_re_created_successor_references(
    cluster: MetastoreCluster,
) -> None:
    # DROP and CREATE of the same name put the new incarnation at the same (default) location.
    # A file the dropped incarnation listed that the new one committed again (re-attaching the
    # data after a mistaken drop) is live data of the new table: GC of the dropped incarnation
    # must not delete it from disk.
    table = "gcns.reborn"
    admin = _client(cluster, role="admin")
    writer = _client(cluster)
    try:
        admin.ddl(f"CREATE TABLE {table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        location = _location(writer, table)
        (location / "data").mkdir(parents=True, exist_ok=True)
        for name in ("kept.parquet", "gone.parquet"):
            (location / "data" / name).write_bytes(b"x" * 100)
        files = [
            {"path": f"data/{name}", "size_bytes": 100, "row_count": 1}
            for name in ("kept.parquet", "gone.parquet")
        ]
        writer.commit(
            f"gc-{uuid.uuid4().hex[:8]}", [{"table": table, "schema_version": 1, "add": files}]
        )
        admin.ddl(f"DROP TABLE {table}")
        admin.ddl(f"CREATE TABLE {table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        assert _location(writer, table) == location
        writer.commit(
            f"gc-{uuid.uuid4().hex[:8]}",
            [{"table": table, "schema_version": 1, "add": files[:1]}],
        )
        time.sleep(1.5)  # past the TTL of the dropped incarnation's drop
        run = admin.gc_run(table)
        dropped = [t for t in run["tables"] if t["threshold"] > 0 and t["files_deleted"]]
        assert dropped, run  # the dropped incarnation was collected
        assert not (location / "data" / "gone.parquet").exists()
        assert (location / "data" / "kept.parquet").exists(), "a live file was deleted"
        listed = writer.files(table)["files"]
        assert [f["path"] for f in listed] == ["data/kept.parquet"]
    finally:
        for cl in (admin, writer):
            cl.close()


def test_a_file_removed_inside_a_manifest_is_deleted_by_gc_without_a_manual_compaction(
    cluster: MetastoreCluster,
) -> None:
    # A file removed while its entry sits in a manifest is a delete entry; GC drops only whole
    # dead manifests, so the file stayed on disk (and `gc status` showed nothing reclaimable)
    # until someone compacted the table - on a quiet table, forever. The leader's GC now
    # compacts such a table itself once its threshold passes the removal.
    from metastore.client.manifest_files import compact_table

    table = "gcns.quiet"
    admin = _client(cluster, role="admin")
    writer = _client(cluster)
    try:
        admin.ddl(f"CREATE TABLE {table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        location = _location(writer, table)
        tag = uuid.uuid4().hex[:8]
        files = {name: location / "_txn" / tag / name for name in ("gone.parquet", "kept.parquet")}
        for path in files.values():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"z" * 100)
        add = [{"path": f"_txn/{tag}/{name}", "size_bytes": 100, "row_count": 1} for name in files]
        writer.commit(f"q-{tag}", [{"table": table, "schema_version": 1, "add": add}])
        assert compact_table(writer, table)["compacted"]  # both entries now sit in a manifest
        removed = writer.commit(
            f"q-rm-{tag}",
            [{"table": table, "schema_version": 1, "remove": [f"_txn/{tag}/gone.parquet"]}],
        )
        assert writer.call("files", {"table": table, "limit": 10})["deletes"]  # pending
        time.sleep(1.5)  # past the table's 1 s gc.ttl

        status = admin.gc_status(table)
        (row,) = status["tables"]
        assert row["awaiting_compaction_files"] == 1
        assert status["awaiting_compaction"]["files"] >= 1
        dry = admin.gc_run(table, dry_run=True)
        assert dry["tables"][0]["awaiting_compaction_files"] == 1
        assert files["gone.parquet"].exists()  # a dry run changes nothing

        run = admin.gc_run(table)  # no `table compact`: GC compacts and deletes
        # What the run did, from the state and the disk, not from the reply's counters: those
        # are of the last attempt only. A loaded leader whose lease lapses mid-run stops with
        # NOT_LEADER (gc_worker point 5) and the client asks again; that second run found the
        # compaction done (compacted_manifests 0; seen at load 11 on 2 cores).
        assert not writer.call("files", {"table": table, "limit": 10})["deletes"]  # folded
        assert not files["gone.parquet"].exists() and files["kept.parquet"].exists()
        assert run["tables"][0]["threshold"] >= int(removed["ts"])
        now = writer.files(table)
        assert [Path(f["path"]).name for f in now["files"]] == ["kept.parquet"]
        assert admin.gc_status(table)["tables"][0]["awaiting_compaction_files"] == 0
    finally:
        admin.close()
        writer.close()


def test_a_table_dropped_under_a_leased_batch_keeps_its_files_and_refuses_its_commits(
    cluster: MetastoreCluster,
) -> None:
    # DROP TABLE does not wait for leases (other DDL does). A batch that pinned (leased) the
    # table for reading before the drop goes on reading it at its read_ts: GC past the drop's
    # TTL must keep the files its lease reads, and its commit must fail whole - a read-set
    # check is READ_CONFLICT (apply version 5), a write to the dropped table is refused, and
    # the other table of that commit gets nothing. Once the batch lets go, GC collects them.
    table, out = "gcns.dropped_under_batch", "gcns.batch_out"
    admin = _client(cluster, role="admin")
    writer = _client(cluster)
    session_id = uuid.uuid4().hex
    try:
        for name in (table, out):
            admin.ddl(f"CREATE TABLE {name} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        location = _location(writer, table)
        (location / "data").mkdir(parents=True, exist_ok=True)
        (location / "data" / "f1.parquet").write_bytes(b"x" * 100)
        f1 = {"path": "data/f1.parquet", "size_bytes": 100, "row_count": 1}
        read_ts = int(
            writer.commit(
                f"gc-{uuid.uuid4().hex[:8]}", [{"table": table, "schema_version": 1, "add": [f1]}]
            )["ts"]
        )
        writer.session_open(session_id, ttl_ms=60_000)
        writer.pin([table, out], session_id=session_id, reads=[table], read_ts=read_ts)
        admin.ddl(f"DROP TABLE {table}")
        time.sleep(1.5)  # past the TTL after the drop's activation
        run = admin.gc_run(table)
        (report,) = run["tables"]
        assert report["held_by"] == {"kind": "lease", "session_id": session_id}, run
        assert report["threshold"] < read_ts and report["files_deleted"] == 0, run
        assert (location / "data" / "f1.parquet").exists(), "GC deleted a leased batch's file"
        listed = writer.files(table, as_of=read_ts)["files"]
        assert [f["path"] for f in listed] == ["data/f1.parquet"]
        # The batch's commits: nothing of either applies.
        g1 = {"path": "g1.parquet", "size_bytes": 1, "row_count": 1}
        out_write = {"table": out, "schema_version": 1, "add": [g1]}
        with pytest.raises(ReadConflictError):
            writer.commit(
                f"gc-{uuid.uuid4().hex[:8]}", [out_write], read_ts=read_ts, read_tables=[table]
            )
        both = [out_write, {"table": table, "schema_version": 1, "add": [f1]}]
        with pytest.raises(TableNotFoundError):
            writer.commit(f"gc-{uuid.uuid4().hex[:8]}", both)
        assert writer.files(out)["files"] == []
        writer.session_close(session_id)
        run = admin.gc_run(table)
        assert run["files_deleted"] == 1, run
        assert not (location / "data" / "f1.parquet").exists()
    finally:
        for cl in (admin, writer):
            cl.close()


def test_a_protected_name_dropped_and_re_created_keeps_the_old_incarnations_files(
    cluster: MetastoreCluster,
) -> None:
    # A protection covers the incarnations its name reads at >= ts, by table id: GC keeps the
    # dropped one's files (at the same location as the new one) and collects the new one's
    # by its TTL. A name dropped, not yet created again, can be protected too (apply 8).
    table = "gcns.protected_reborn"
    admin = _client(cluster, role="admin")
    writer = _client(cluster)
    create = f"CREATE TABLE {table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')"

    def commit(name: str, *, overwrite: bool = False) -> int:
        (location / "data" / name).write_bytes(b"x" * 100)
        add = [{"path": f"data/{name}", "size_bytes": 100, "row_count": 1}]
        write = {"table": table, "schema_version": 1, "add": add, "overwrite": overwrite}
        return int(writer.commit(f"gc-{uuid.uuid4().hex[:8]}", [write])["ts"])

    try:
        admin.ddl(create)
        location = _location(writer, table)
        (location / "data").mkdir(parents=True, exist_ok=True)
        ts = commit("f1.parquet")
        old_id = writer.protect(ts, tables=[table], record_id="by-name-live")["table_ids"][0]
        admin.ddl(f"DROP TABLE {table}")
        dropped = writer.protect(ts, tables=[table], record_id="by-name-dropped")
        assert dropped["table_ids"] == [old_id]
        admin.ddl(create)
        commit("f2.parquet")
        commit("f3.parquet", overwrite=True)  # f2 is dead once the TTL passes
        time.sleep(1.5)
        run = admin.gc_run(table)
        by_id = {t["table_id"]: t for t in run["tables"]}
        assert by_id[old_id]["held_by"]["kind"] == "protection", run
        assert by_id[old_id]["files_deleted"] == 0 and run["files_deleted"] == 1, run
        assert sorted(p.name for p in (location / "data").iterdir()) == ["f1.parquet", "f3.parquet"]
        assert [f["path"] for f in writer.files(table, as_of=ts)["files"]] == ["data/f1.parquet"]
        for record_id in ("by-name-live", "by-name-dropped"):
            writer.release_protection(record_id)
        assert admin.gc_run(table)["files_deleted"] == 1
        assert sorted(p.name for p in (location / "data").iterdir()) == ["f3.parquet"]
    finally:
        for cl in (admin, writer):
            cl.close()
