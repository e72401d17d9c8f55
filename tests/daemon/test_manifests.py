"""Manifests on a real 3-node cluster: a table committed past its loose bound is compacted
(by the client library, then by `metastore table compact`), and every node answers `files` at
sampled timestamps exactly as before the compaction; a removal of a file in a manifest is a
delete entry until the next compaction folds it in; a corrupt manifest is a typed error."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from metastore.client import MetastoreClient, SyncMetastoreClient
from metastore.client.manifest_files import compact_table
from metastore.errors import (
    DataFileConflictError,
    InvalidArgumentError,
    ManifestUnreadableError,
    UnavailableError,
)
from tests.client.fake_node import ThreadedFakeNode
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

TABLE = "m.events"
COMMITS = 8
FILES_PER_COMMIT = 5
LOOSE_FILES_MAX = 30  # the cluster's compaction trigger for writers
SNAPSHOT_EVERY = 100  # the configuration's minimum


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    # Small snapshots, so a restarted node loads manifest references from its own snapshot.
    with metastore_cluster(
        tmp_path_factory.mktemp("manifests"),
        3,
        snapshot_every_entries=SNAPSHOT_EVERY,
        gc_interval_ms=3_600_000,  # GC runs only when asked
        loose_files_max=LOOSE_FILES_MAX,
    ) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _client(c: MetastoreCluster, node_id: int | None = None) -> SyncMetastoreClient:
    ids = c.ids if node_id is None else [node_id]
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in ids]
    return SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=30_000)


def _answers(c: MetastoreCluster, stamps: list[int]) -> dict[int, dict[int, list[str]]]:
    """node id -> ts -> paths of `files` at ts, asked of that node alone."""
    out: dict[int, dict[int, list[str]]] = {}
    for node_id in c.ids:
        client = _client(c, node_id)
        try:
            out[node_id] = {
                ts: [f["path"] for f in client.files(TABLE, as_of=ts)["files"]] for ts in stamps
            }
        finally:
            client.close()
    return out


def test_compaction_keeps_every_answer_on_every_node(cluster: MetastoreCluster) -> None:
    client = _client(cluster)
    try:
        client.ddl("CREATE NAMESPACE m")
        client.ddl(f"CREATE TABLE {TABLE} (id BIGINT)")
        stamps: list[int] = []
        for n in range(COMMITS):
            add = [
                {"path": f"_txn/c{n}/part-{i}.parquet", "size_bytes": 100 + i, "row_count": i + 1}
                for i in range(FILES_PER_COMMIT)
            ]
            remove = [f"_txn/c{n - 1}/part-0.parquet"] if n % 3 == 2 else []
            r = client.commit(
                f"m-{n}", [{"table": TABLE, "schema_version": 1, "add": add, "remove": remove}]
            )
            stamps.append(int(r["ts"]))
        sampled = sorted({*stamps, *(ts - 1 for ts in stamps[1:])})
        before = _answers(cluster, sampled)
        assert all(answer == before[cluster.ids[0]] for answer in before.values())
        assert len(before[cluster.ids[0]][stamps[-1]]) == COMMITS * FILES_PER_COMMIT - 2

        result = compact_table(client, TABLE, keep_loose=FILES_PER_COMMIT, entries_max=12)
        assert result["compacted"] and result["moved_entries"] == (COMMITS - 1) * FILES_PER_COMMIT
        assert result["loose_entries"] == FILES_PER_COMMIT
        location = str(client.files(TABLE)["location"])
        assert len(os.listdir(f"{location}/_manifests")) == result["manifests"] >= 3
        assert _answers(cluster, sampled) == before

        # A file that now sits in a manifest is removed: a delete entry, then folded.
        r = client.commit(
            "m-remove",
            [{"table": TABLE, "schema_version": 1, "remove": ["_txn/c1/part-3.parquet"]}],
        )
        removed_ts = int(r["ts"])
        view = client.call("compaction_view", {"table": TABLE})
        assert view["loose_files_max"] == LOOSE_FILES_MAX  # what writers compact past
        assert view["total_loose"] == FILES_PER_COMMIT and len(view["loose"]) == FILES_PER_COMMIT
        raw = client.call("files", {"table": TABLE, "as_of": removed_ts, "limit": 100})
        assert raw["deletes"] == [["_txn/c1/part-3.parquet", removed_ts]] and raw["manifests"]
        after_remove = _answers(cluster, [removed_ts])
        assert "_txn/c1/part-3.parquet" not in after_remove[cluster.ids[0]][removed_ts]
        assert _answers(cluster, sampled) == before  # the past is unchanged
        # `files_multi` (what a batch lists its reads with) carries the manifests and delete
        # entries too, and expands to the same listing as `files`, also when it pages.
        for ts in (removed_ts, stamps[3]):
            multi = client.files_multi([TABLE], as_of=ts)["listings"][0]
            single = client.files(TABLE, as_of=ts)
            assert [f["path"] for f in multi["files"]] == [f["path"] for f in single["files"]]
        small = client.call("files_multi", {"tables": [TABLE], "as_of": removed_ts, "limit": 2})
        assert small["listings"][0]["manifests"] and small["listings"][0]["next_page_token"]
        # A removal of a path in no manifest is refused (apply alone would take it on trust
        # and record a delete entry that matches nothing), through every node; a second
        # removal of the manifest entry is a conflict. Neither changes anything.
        for node_id in cluster.ids:
            one = _client(cluster, node_id)
            try:
                with pytest.raises(InvalidArgumentError, match="not a file of the table"):
                    one.commit(
                        f"m-typo-{node_id}",
                        [{"table": TABLE, "schema_version": 1, "remove": ["_txn/c1/nope.parquet"]}],
                    )
            finally:
                one.close()
        with pytest.raises(DataFileConflictError):
            client.commit(
                "m-remove-again",
                [{"table": TABLE, "schema_version": 1, "remove": ["_txn/c1/part-3.parquet"]}],
            )
        assert client.call("files", {"table": TABLE, "limit": 100})["deletes"] == [
            ["_txn/c1/part-3.parquet", removed_ts]
        ]
    finally:
        client.close()

    # The CLI compacts the rest (folding the delete entry), with JSON output.
    endpoints = ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids)
    out = CliRunner().invoke(
        cli,
        [
            *("--endpoints", endpoints, "--token", cluster.token("writer"), "-o", "json"),
            *("table", "compact", TABLE),
        ],
    )
    assert out.exit_code == 0, out.output[-2000:]
    doc = json.loads(out.stdout)
    assert doc["compacted"] is True and doc["folded_deletes"] == 1 and doc["loose_entries"] == 0
    everything = sorted({*sampled, removed_ts})
    final = _answers(cluster, everything)
    assert {ts: final[cluster.ids[0]][ts] for ts in sampled} == before[cluster.ids[0]]
    assert final[cluster.ids[0]][removed_ts] == after_remove[cluster.ids[0]][removed_ts]
    assert all(answer == final[cluster.ids[0]] for answer in final.values())
    # The delete entry is folded into a manifest now: removing that file again is still refused.
    client = _client(cluster)
    try:
        with pytest.raises((DataFileConflictError, InvalidArgumentError)):
            client.commit(
                "m-remove-folded",
                [{"table": TABLE, "schema_version": 1, "remove": ["_txn/c1/part-3.parquet"]}],
            )
    finally:
        client.close()
    assert _answers(cluster, everything) == final

    # Every node restarts from a snapshot taken after the compactions: the references survive
    # the snapshot, and the answers too. Small commits to another table bring the next snapshot
    # at once (idle ticks alone take ~25 s to make SNAPSHOT_EVERY entries). Status'
    # `snapshot_index` is the newest snapshot (`log_start_index` trails it by the entries kept
    # behind it); twice SNAPSHOT_EVERY commits leave room for a slow snapshot.
    compacted_at = _status(cluster, cluster.ids[0])["applied_index"]
    pad = _client(cluster)
    try:
        pad.ddl("CREATE TABLE m.pad (id BIGINT)")
        for i in range(2 * SNAPSHOT_EVERY + 10):
            add = [{"path": f"_txn/pad/{i}.parquet", "size_bytes": 1, "row_count": 1}]
            pad.commit(f"pad-{i}", [{"table": "m.pad", "schema_version": 1, "add": add}])
    finally:
        pad.close()
    for node_id in cluster.ids:
        _wait_snapshot_past(cluster, node_id, compacted_at)
        cluster.kill(node_id)
        cluster.start(node_id)
        cluster.wait_ready(timeout_s=60)
    assert _answers(cluster, everything) == final

    # Nothing left to do: a repeat says so.
    again = CliRunner().invoke(
        cli,
        [
            *("--endpoints", endpoints, "--token", cluster.token("writer"), "-o", "json"),
            *("table", "compact", TABLE),
        ],
    )
    assert again.exit_code == 0 and json.loads(again.stdout)["compacted"] is False

    # A manifest changed outside the metastore is refused, never read as a wrong file list.
    for victim in os.listdir(f"{location}/_manifests"):
        with open(f"{location}/_manifests/{victim}", "r+b") as f:
            f.seek(20)
            f.write(b"\x00\x01\x02")
    client = _client(cluster)
    try:
        with pytest.raises(ManifestUnreadableError):
            client.files(TABLE, as_of=stamps[0])
    finally:
        client.close()
    bad = CliRunner().invoke(
        cli,
        [
            *("--endpoints", endpoints, "--token", cluster.token("reader"), "-o", "json"),
            *("table", "files", TABLE, "--as-of", str(stamps[0])),
        ],
    )
    assert bad.exit_code != 0 and "MANIFEST_UNREADABLE" in bad.output


def _status(c: MetastoreCluster, node_id: int) -> dict[str, object]:
    status = c.try_status(node_id)
    assert status is not None, c.log_tails()
    return status


def _wait_snapshot_past(c: MetastoreCluster, node_id: int, index: object) -> None:
    assert isinstance(index, int)
    deadline = time.monotonic() + 60  # ~4 idle ticks a second
    while time.monotonic() < deadline:
        snapshot = _status(c, node_id)["snapshot_index"]
        if isinstance(snapshot, int) and snapshot > index:
            return
        time.sleep(0.2)
    raise AssertionError(f"node {node_id} took no snapshot past {index}")


def test_gc_deletes_replaced_manifests_and_the_files_of_dead_ones(
    cluster: MetastoreCluster,
) -> None:
    table = "mgc.t"
    client = _client(cluster)
    try:
        client.ddl("CREATE NAMESPACE mgc")
        client.ddl(f"CREATE TABLE {table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        location = str(client.schema_at(table)["location"])
        paths = {name: f"_txn/g/{name}.parquet" for name in "abce"}
        os.makedirs(f"{location}/_txn/g", exist_ok=True)
        for rel in paths.values():
            with open(f"{location}/{rel}", "wb") as f:
                f.write(b"x" * 10)

        def commit(txn: str, add: str = "", remove: str = "") -> int:
            write = {
                "table": table,
                "schema_version": 1,
                "add": [{"path": paths[n], "size_bytes": 10, "row_count": 1} for n in add],
                "remove": [paths[n] for n in remove],
            }
            return int(client.commit(txn, [write])["ts"])

        commit("g1", add="ab")
        commit("g2", add="c")
        compact_table(client, table, entries_max=2)  # manifests [a b] and [c]
        first = set(os.listdir(f"{location}/_manifests"))
        commit("g3", remove="ac")
        commit("g4", add="e")
        compact_table(client, table)  # rewrites both ([a- b], [c-]); [e]
        time.sleep(1.5)  # past the table's 1 s TTL
        # a (removed below the threshold) sits in [a- b] beside the live b: the run compacts
        # the table itself, splitting a off into a dead manifest, and deletes it with the
        # rest (the leader's GC, gc_worker point 8; no `table compact` needed).
        run = client.gc_run(table)
        # 2 replaced manifests, c and [c-], a and its split-off manifest; [a- b] too should
        # the threshold pass GC's compaction within the run. Unless an attempt's answer was
        # lost (the client failed over on a loaded machine while that run went on deleting):
        # the reply then says so (`unanswered_parts`) and its totals leave that part out,
        # never more than the run could delete; the files on disk are checked below either
        # way. The whole reply goes in the message (a dict there is cut short): a loaded run
        # once counted 3.
        described = json.dumps(run, sort_keys=True)
        unanswered = run.get("unanswered_parts", 0)
        assert isinstance(unanswered, int) and unanswered >= 0, described
        assert run["files_deleted"] <= 7 and run["compacted_manifests"] <= 1, described
        if not unanswered:
            assert run["files_deleted"] >= 6, described
            assert run["compacted_manifests"] == 1, described
        else:
            # The unanswered attempts ran on: a run answered now finds their work done (at
            # most the [a- b] manifest left, once the threshold passes GC's compaction).
            again = client.gc_run(table)
            described = json.dumps({"first": run, "again": again}, sort_keys=True)
            if not again.get("unanswered_parts"):
                assert again["files_deleted"] <= 1, described
                assert again["compacted_manifests"] == 0, described
    finally:
        client.close()
    left = set(os.listdir(f"{location}/_manifests"))
    assert not first & left  # replaced manifests are gone
    # [b] and [e]; and [a- b], replaced by GC's compaction, until the threshold passes that
    # compaction (with a 1 s TTL that may happen within the run: its read fences take time)
    assert 2 <= len(left) <= 3
    for name in "ac":
        assert not os.path.exists(f"{location}/{paths[name]}")
    for name in "be":
        assert os.path.exists(f"{location}/{paths[name]}")

    # A run once the threshold passes GC's compaction has deleted the replaced [a- b].
    client = _client(cluster)
    try:
        assert not compact_table(client, table)["compacted"]  # nothing left to fold
        time.sleep(1.5)
        client.gc_run(table)
    finally:
        client.close()
    assert len(set(os.listdir(f"{location}/_manifests"))) == 2  # [b] and [e]
    for node_id in cluster.ids:
        reader = _client(cluster, node_id)
        try:
            now = sorted(f["path"] for f in reader.files(table)["files"])
        finally:
            reader.close()
        assert now == [paths["b"], paths["e"]], (node_id, now)


def test_gc_deletes_orphans_under_a_table_with_manifests_but_never_a_manifest_entry(
    cluster: MetastoreCluster,
) -> None:
    """The orphan scan reads the table's manifests: a file listed only in a manifest is
    referenced, an old file nobody lists is an orphan (the scan used to skip such locations)."""
    table = "morph.t"
    client = _client(cluster)
    try:
        client.ddl("CREATE NAMESPACE morph")
        client.ddl(f"CREATE TABLE {table} (id BIGINT)")
        location = str(client.schema_at(table)["location"])
        os.makedirs(f"{location}/_txn/k", exist_ok=True)
        os.makedirs(f"{location}/_txn/o", exist_ok=True)
        kept = [f"_txn/k/{n}.parquet" for n in "ab"]
        for rel in [*kept, "_txn/o/orphan.parquet"]:
            with open(f"{location}/{rel}", "wb") as f:
                f.write(b"x" * 10)
        write = {
            "table": table,
            "schema_version": 1,
            "add": [{"path": rel, "size_bytes": 10, "row_count": 1} for rel in kept],
        }
        client.commit("orphan-1", [write])
        assert compact_table(client, table)["compacted"]
        listed = [f["path"] for f in client.files(table)["files"]]
        assert sorted(listed) == kept  # both now live in a manifest only
        # Everything older than the orphan grace (1 h by default).
        two_hours_ago = time.time() - 7_200
        for dirpath, _, names in os.walk(location):
            for name in names:
                os.utime(f"{dirpath}/{name}", (two_hours_ago, two_hours_ago))
        run = client.gc_run(table)
        assert location not in run.get("orphan_locations_skipped", []), run
        assert run["orphans_deleted"] == 1, run
    finally:
        client.close()
    assert not os.path.exists(f"{location}/_txn/o/orphan.parquet")
    for rel in kept:
        assert os.path.exists(f"{location}/{rel}")
    assert len(os.listdir(f"{location}/_manifests")) == 1


def test_compact_errors_are_typed_with_their_exit_codes(cluster: MetastoreCluster) -> None:
    endpoints = ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids)

    def run(role: str, *args: str) -> tuple[int, str]:
        out = CliRunner().invoke(
            cli, ["--endpoints", endpoints, "--token", cluster.token(role), "table", *args]
        )
        return out.exit_code, out.output

    code, text = run("writer", "compact", "nosuch.table")
    # The CLI tells an unknown namespace from an unknown table (the node says the latter).
    assert code == 4 and "NAMESPACE_NOT_FOUND: namespace nosuch does not exist" in text, text
    client = _client(cluster)
    try:  # something to compact, so the reader gets as far as the swap
        write = {
            "table": TABLE,
            "add": [{"path": "_txn/x/p.parquet", "size_bytes": 1, "row_count": 1}],
        }
        client.commit("m-forbidden", [{**write, "schema_version": 1}])
    finally:
        client.close()
    code, text = run("reader", "compact", TABLE)  # the swap is a write
    assert code == 6 and "FORBIDDEN" in text, text
    code, text = run("writer", "compact", "--keep-loose", "-1", TABLE)
    assert code == 2, text


def test_gc_of_a_dead_manifest_keeps_a_file_committed_again_since(
    cluster: MetastoreCluster,
) -> None:
    """A file removed, folded into a manifest by a compaction and then committed again (a
    restore re-attaching it) is live: expanding the old manifest once it is dead must not
    delete it from disk."""
    table = "mre.t"
    client = _client(cluster)
    try:
        client.ddl("CREATE NAMESPACE mre")
        client.ddl(f"CREATE TABLE {table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        location = str(client.schema_at(table)["location"])
        rel = "_txn/r/c.parquet"
        os.makedirs(f"{location}/_txn/r", exist_ok=True)
        with open(f"{location}/{rel}", "wb") as f:
            f.write(b"x" * 10)

        def commit(txn: str, *, add: bool = False, remove: bool = False) -> None:
            write = {
                "table": table,
                "schema_version": 1,
                "add": [{"path": rel, "size_bytes": 10, "row_count": 1}] if add else [],
                "remove": [rel] if remove else [],
            }
            client.commit(txn, [write])

        commit("re1", add=True)
        assert compact_table(client, table)["compacted"]  # [c]
        commit("re2", remove=True)  # a delete entry
        assert compact_table(client, table)["compacted"]  # folded: [c-]
        commit("re3", add=True)  # the same file, live again (loose)
        time.sleep(1.5)  # past the table's 1 s TTL: [c-] is dead
        client.gc_run(table)
        assert [f["path"] for f in client.files(table)["files"]] == [rel]
    finally:
        client.close()
    assert os.path.exists(f"{location}/{rel}"), "a live file was deleted"


def test_the_orphan_scan_of_a_dropped_table_spares_manifest_entries_of_a_table_inside_it(
    cluster: MetastoreCluster,
) -> None:
    """A table may be created inside a dropped table's directory (only live locations may not
    overlap). The dropped incarnation stays registered, so GC scans its directory for orphans;
    files listed only in the inner table's manifests are referenced, not orphans."""
    client = _client(cluster)
    try:
        client.ddl("CREATE NAMESPACE mnest")
        client.ddl("CREATE TABLE mnest.parent (id BIGINT)")
        outer = str(client.schema_at("mnest.parent")["location"])
        client.ddl("DROP TABLE mnest.parent")
        client.ddl(f"CREATE TABLE mnest.child (id BIGINT) LOCATION '{outer}/inner'")
        inner = str(client.schema_at("mnest.child")["location"])
        assert inner == f"{outer}/inner"
        kept = [f"_txn/k/{n}.parquet" for n in "ab"]
        os.makedirs(f"{inner}/_txn/k", exist_ok=True)
        for rel in kept:
            with open(f"{inner}/{rel}", "wb") as f:
                f.write(b"x" * 10)
        write = {
            "table": "mnest.child",
            "schema_version": 1,
            "add": [{"path": rel, "size_bytes": 10, "row_count": 1} for rel in kept],
        }
        client.commit("nest-1", [write])
        assert compact_table(client, "mnest.child")["compacted"]  # listed in a manifest only
        two_hours_ago = time.time() - 7_200  # older than the orphan grace (1 h by default)
        for dirpath, _, names in os.walk(outer):
            for name in names:
                os.utime(f"{dirpath}/{name}", (two_hours_ago, two_hours_ago))
        client.gc_run("mnest.parent")
        assert sorted(f["path"] for f in client.files("mnest.child")["files"]) == kept
    finally:
        client.close()
    for rel in kept:
        assert os.path.exists(f"{inner}/{rel}"), f"{rel} was deleted as an orphan"


def test_a_gc_run_whose_first_attempt_went_unanswered_accounts_for_it(
    cluster: MetastoreCluster,
) -> None:
    """The client's first attempt goes through a node that passes the run on to the real
    cluster and loses its answer (UNAVAILABLE, outcome unknown), as a follower's forward that
    gave up does: the run still deletes. The client repeats it; the reply says one part went
    unanswered, its totals leave that part out, and the two together are the run's totals."""
    table = "mgcu.t"
    client = _client(cluster)
    try:
        client.ddl("CREATE NAMESPACE mgcu")
        client.ddl(f"CREATE TABLE {table} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        location = str(client.schema_at(table)["location"])
        cluster_id = client.cluster_id
        paths = {name: f"_txn/u/{name}.parquet" for name in "ab"}
        os.makedirs(f"{location}/_txn/u", exist_ok=True)
        for rel in paths.values():
            with open(f"{location}/{rel}", "wb") as f:
                f.write(b"x" * 10)
        write = {"table": table, "schema_version": 1}
        add = [{"path": p, "size_bytes": 10, "row_count": 1} for p in paths.values()]
        client.commit("u1", [{**write, "add": add, "remove": []}])
        client.commit("u2", [{**write, "add": [], "remove": [paths["a"]]}])
    finally:
        client.close()
    time.sleep(1.5)  # past the table's 1 s TTL: a is dead below the threshold

    real_endpoints = [f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids]
    lost_answers: list[dict[str, Any]] = []

    async def run_then_lose_the_answer(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op != "gc_run":
            # The client's liveness probe while the run lasts: any answer shows this alive.
            raise UnavailableError(f"{op} is not served here")
        async with MetastoreClient(real_endpoints, cluster.token("admin")) as real:
            lost_answers.append(await real.gc_run(args.get("table"), timeout_ms=30_000))
        details = {"node_id": 99, "outcome_unknown": True}
        raise UnavailableError("node 99 did not answer; outcome unknown", details=details)

    with ThreadedFakeNode(
        handler=run_then_lose_the_answer,
        tokens=frozenset({cluster.token("admin")}),
        hello_extra={"cluster_id": cluster_id},
    ) as losing:
        client = SyncMetastoreClient(
            [losing.endpoint, *real_endpoints], cluster.token("admin"), timeout_ms=30_000
        )
        try:
            run = client.gc_run(table)
        finally:
            client.close()
    described = json.dumps({"run": run, "lost": lost_answers}, sort_keys=True)
    assert len(lost_answers) == 1, described  # the first attempt ran, once
    (lost,) = lost_answers
    assert run["unanswered_parts"] == 1 and "parts" not in run, described
    # Each total leaves the unanswered part out, and with it makes the run's: a alone.
    for key, expected in (("files_deleted", 1), ("bytes_deleted", 10)):
        assert 0 <= run[key] <= expected, described
        assert run[key] + lost[key] == expected, described
    assert lost["files_deleted"] == 1, described  # the lost attempt did the deleting
    assert not os.path.exists(f"{location}/{paths['a']}")
    assert os.path.exists(f"{location}/{paths['b']}")
