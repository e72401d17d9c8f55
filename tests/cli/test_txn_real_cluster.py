"""`metastore txn log`, `table files` and `table read` against a real 3-node cluster the CLI made
(`cluster init`) and started (`cluster up`, both real subprocesses) in a temporary directory. The
commands under test run in this process (`RealCluster.call`: the same command line, environment
and exit codes as a subprocess, without a Python start per call).

The data is what a Spark executor would write: Parquet files with field ids, written with
pyarrow under the table's location and committed through the client library (two commits). A
column is then renamed. The CLI must list and read exactly the committed files now, AS OF each
commit (with the schema in force then) and AS OF just before the first commit (nothing), and
must never show a file no commit lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hlc import to_iso
from hlc.limits import LOGICAL_BITS
from metastore.client import SyncMetastoreClient
from metastore.errors import BatchAlreadyCommittedError
from tests.cli.real_cluster import LIFECYCLE_TIMEOUT_S, Done, RealCluster, free_base_port

pytestmark = pytest.mark.slow

TABLE: Final = "shop.orders"
STREAM: Final = "cli-stream:query-1"
FIELD_ID: Final = b"PARQUET:field_id"
# Written as an executor would (field ids 1..3, the ids CREATE TABLE assigns in order).
BATCH_1: Final[list[dict[str, Any]]] = [
    {"id": 1, "amount": 10.5, "note": "first"},
    {"id": 2, "amount": 20.0, "note": None},
    {"id": 3, "amount": 30.25, "note": "third"},
]
BATCH_2: Final[list[dict[str, Any]]] = [
    {"id": 4, "amount": 40.0, "note": "x"},
    {"id": 5, "amount": 50.0, "note": "y"},
]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> int:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata={FIELD_ID: b"1"}),
            pa.field("amount", pa.float64(), metadata={FIELD_ID: b"2"}),
            pa.field("note", pa.string(), metadata={FIELD_ID: b"3"}),
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path.stat().st_size


def assert_error(done: Done, exit_code: int, code: str) -> None:
    assert done.returncode == exit_code, done.describe()
    assert done.stderr.startswith(f"Error: {code}: "), done.describe()
    assert "Traceback" not in done.stderr, done.describe()
    assert done.stdout == "", done.describe()


@dataclass(frozen=True, slots=True, kw_only=True)
class Committed:
    cluster: RealCluster
    location: Path
    first: dict[str, Any]  # the commit's reply
    second: dict[str, Any]
    paths: tuple[str, str]  # relative to the location, in commit order
    sizes: tuple[int, int]
    stray: str  # written but never committed


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Committed]:
    base_port = free_base_port()
    cluster = RealCluster(
        config_dir=tmp_path_factory.mktemp("txn-cli") / "cluster",
        base_port=base_port,
        cluster_id="txncli",
    )
    config_dir = str(cluster.config_dir)
    init = cluster.run(
        "cluster", "init", config_dir, "--cluster-id", "txncli", "--base-port", str(base_port)
    )
    assert init.returncode == 0, init.describe()
    try:
        up = cluster.run("cluster", "up", "--config", config_dir, timeout_s=LIFECYCLE_TIMEOUT_S)
        assert up.returncode == 0, up.describe()
        cluster.ok_json("sql", "CREATE NAMESPACE shop")
        cluster.ok_json(
            "sql", f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, amount DOUBLE, note STRING)"
        )
        token = cluster.token_file().read_text().strip()
        with SyncMetastoreClient(cluster.endpoints(), token) as client:
            described = client.describe(TABLE)
            location = Path(described["location"])
            paths = ("_txn/b1/part-0.parquet", "_txn/b2/part-0.parquet")
            sizes = (
                write_parquet(location / paths[0], BATCH_1),
                write_parquet(location / paths[1], BATCH_2),
            )
            # An aborted batch's output: on disk under the location, in no commit.
            stray = "_txn/aborted/part-0.parquet"
            write_parquet(location / stray, [{"id": 99, "amount": 0.0, "note": "never"}])
            replies = []
            for i, (path, size, rows) in enumerate(
                zip(paths, sizes, (BATCH_1, BATCH_2), strict=True)
            ):
                add = {"path": path, "size_bytes": size, "row_count": len(rows)}
                write = {"table": TABLE, "schema_version": described["version"], "add": [add]}
                # Positions of one stream, as the bridge's micro-batches carry them.
                replies.append(client.commit(f"cli-test:{i}", [write], stream=STREAM, seq=i))
        # After both commits: the current schema calls column 2 `total`; the files say `amount`.
        cluster.ok_json("sql", f"ALTER TABLE {TABLE} RENAME COLUMN amount TO total")
        yield Committed(
            cluster=cluster,
            location=location,
            first=replies[0],
            second=replies[1],
            paths=paths,
            sizes=sizes,
            stray=stray,
        )
    finally:
        cluster.run("cluster", "down", "--config", config_dir, "--grace-ms", "3000")
        cluster.kill_leftovers()


def test_txn_log_lists_both_commits_newest_first(committed: Committed) -> None:
    doc = committed.cluster.ok_json("txn", "log", "--limit", "5")
    commits = doc["commits"]
    assert [c["txn_id"] for c in commits] == ["cli-test:1", "cli-test:0"]
    assert [c["ts"] for c in commits] == [committed.second["ts"], committed.first["ts"]]
    assert all(c["tables"] == [TABLE] and c["files_added"] == 1 for c in commits)
    assert [c["rows_added"] for c in commits] == [len(BATCH_2), len(BATCH_1)]
    assert doc["upper"] > committed.second["ts"]
    one = committed.cluster.ok_json("txn", "log", "--limit", "1")
    assert [c["txn_id"] for c in one["commits"]] == ["cli-test:1"]
    text = committed.cluster.call("txn", "log")
    assert text.returncode == 0, text.describe()
    for shown in ("cli-test:0", "cli-test:1", to_iso(committed.first["ts"]), TABLE, "+1"):
        assert shown in text.stdout, (shown, text.stdout)


def test_txn_show_and_stream_marks(committed: Committed) -> None:
    c = committed.cluster
    doc = c.ok_json("txn", "show", "cli-test:0")
    assert doc["txn"]["ts"] == committed.first["ts"] and doc["txn"]["tables"] == [TABLE]
    assert doc["stream_mark"] is None  # not asked for
    doc = c.ok_json("txn", "show", "cli-test:0", "--stream", STREAM)
    assert doc["stream_mark"] == {
        "stream": STREAM,
        "seq": 1,
        "ts": committed.second["ts"],
        "txn_id": "cli-test:1",
    }
    text = c.call("txn", "show", "cli-test:1", "--stream", STREAM)
    assert text.returncode == 0, text.describe()
    for shown in ("cli-test:1", to_iso(committed.second["ts"]), "stream high-water mark"):
        assert shown in text.stdout, (shown, text.stdout)
    missing = c.call("txn", "show", "never-committed")
    assert missing.returncode == 4, missing.describe()
    assert "is not remembered" in missing.stdout
    # A replay of position 0 under an id the log never saw (as a forgotten one looks) is refused
    # by the stream's mark with a typed, non-retryable error, and commits nothing.
    token = c.token_file().read_text().strip()
    with SyncMetastoreClient(c.endpoints(), token) as client:
        write = {
            "table": TABLE,
            "schema_version": 2,
            "add": [{"path": "_txn/replay/part-0.parquet", "size_bytes": 1, "row_count": 1}],
        }
        with pytest.raises(BatchAlreadyCommittedError) as refused:
            client.commit("cli-test:replayed", [write], stream=STREAM, seq=0)
    assert not refused.value.retryable
    assert refused.value.details["committed_seq"] == 1
    assert c.call("txn", "show", "cli-test:replayed").returncode == 4


def test_table_files_now_and_as_of(committed: Committed) -> None:
    c = committed.cluster
    now = c.ok_json("table", "files", TABLE)
    assert [f["path"] for f in now["files"]] == list(committed.paths)  # never the stray file
    assert [f["added_ts"] for f in now["files"]] == [committed.first["ts"], committed.second["ts"]]
    assert now["rows"] == len(BATCH_1) + len(BATCH_2)
    assert now["size_bytes"] == sum(committed.sizes)
    at_first = c.ok_json("table", "files", TABLE, "--as-of", str(committed.first["ts"]))
    assert [f["path"] for f in at_first["files"]] == [committed.paths[0]]
    assert at_first["as_of"] == committed.first["ts"]
    # The ISO form of a commit timestamp (with its logical counter) names the same instant.
    at_second = c.ok_json("table", "files", TABLE, "--as-of", to_iso(committed.second["ts"]))
    assert len(at_second["files"]) == 2
    before = c.ok_json("table", "files", TABLE, "--as-of", str(committed.first["ts"] - 1))
    assert before["files"] == [] and before["rows"] == 0 and before["size_bytes"] == 0
    text = c.call("table", "files", TABLE)
    assert text.returncode == 0, text.describe()
    for shown in (*committed.paths, "total: 2 files", str(sum(committed.sizes))):
        assert shown in text.stdout, (shown, text.stdout)
    assert committed.stray not in text.stdout


def test_table_read_now_uses_the_current_schema_by_field_id(committed: Committed) -> None:
    doc = committed.cluster.ok_json("table", "read", TABLE)
    assert doc["columns"] == ["id", "total", "note"]
    assert doc["version"] == 2
    # The files call column 2 `amount`; matched by field id, its data shows under `total`.
    expected = [{"id": r["id"], "total": r["amount"], "note": r["note"]} for r in BATCH_1 + BATCH_2]
    assert doc["rows"] == expected
    assert doc["rows_total"] == 5 and doc["files"] == 2 and doc["truncated"] is False


def test_table_read_as_of_each_commit_and_before(committed: Committed) -> None:
    c = committed.cluster
    at_first = c.ok_json("table", "read", TABLE, "--as-of", str(committed.first["ts"]))
    assert at_first["columns"] == ["id", "amount", "note"]  # the schema in force then
    assert at_first["rows"] == BATCH_1
    assert at_first["version"] == 1
    before = c.ok_json("table", "read", TABLE, "--as-of", str(committed.first["ts"] - 1))
    assert before["rows"] == [] and before["rows_total"] == 0
    limited = c.ok_json("table", "read", TABLE, "--limit", "4")
    assert [r["id"] for r in limited["rows"]] == [1, 2, 3, 4]
    assert limited["truncated"] is True
    text = c.call("table", "read", TABLE, "--as-of", str(committed.second["ts"]))
    assert text.returncode == 0, text.describe()
    assert "5 of 5 rows" in text.stdout and "NULL" in text.stdout and "30.25" in text.stdout


def test_errors_have_codes_and_exit_codes(committed: Committed) -> None:
    c = committed.cluster
    assert_error(c.call("table", "read", "shop.nope"), 4, "TABLE_NOT_FOUND")
    assert_error(c.call("table", "files", "shop.nope"), 4, "TABLE_NOT_FOUND")
    bad_ts = c.call("table", "files", TABLE, "--as-of", "yesterday-ish")
    assert bad_ts.returncode == 2 and "Accepted:" in bad_ts.stderr, bad_ts.describe()
    assert c.call("txn", "log", "--limit", "0").returncode == 2
    # A committed file that disappeared from the warehouse is named, with exit code 4.
    (committed.location / committed.paths[1]).rename(committed.location / "moved.parquet")
    try:
        missing = c.call("table", "read", TABLE)
        assert_error(missing, 4, "DATA_FILE_NOT_FOUND")
        assert committed.paths[1] in missing.stderr
        # Reading only the first file's rows does not touch the missing one.
        assert len(c.ok_json("table", "read", TABLE, "--limit", "3")["rows"]) == 3
    finally:
        (committed.location / "moved.parquet").rename(committed.location / committed.paths[1])


def test_table_files_sees_a_commit_made_a_moment_ago_by_another_process(
    committed: Committed,
) -> None:
    # A commit may be stamped up to DD (500 ms here) above its entry's Tm; a node's safe time
    # reaches that stamp only later. A script listing the table right after a Spark job
    # committed (another process, with no shared state) must see the commit on every node,
    # as an etcdctl get after a put does; `--consistency s` is the cheaper read that may not.
    c = committed.cluster
    table = "shop.fresh"
    c.ok_json("sql", f"CREATE TABLE {table} (id BIGINT NOT NULL, amount DOUBLE, note STRING)")
    token = c.token_file().read_text().strip()
    with SyncMetastoreClient(c.endpoints(), token) as client:
        described = client.describe(table)
        location = Path(described["location"])
        for node_id in (1, 2, 3):
            path = f"_txn/fresh-{node_id}/part-0.parquet"
            size = write_parquet(location / path, BATCH_2)
            add = {"path": path, "size_bytes": size, "row_count": len(BATCH_2)}
            write = {"table": table, "schema_version": described["version"], "add": [add]}
            ahead = client.clock.now() + (350 << LOGICAL_BITS)  # 350 ms above its now
            reply = client.commit(f"fresh:{node_id}", [write], ts=ahead)
            # In this process (no interpreter start), against one node only, at once.
            done = c.call("table", "files", table, "-o", "json", endpoints=[c.endpoint(node_id)])
            assert done.returncode == 0, done.describe()
            listed = done.json()
            assert path in [f["path"] for f in listed["files"]], (node_id, reply, listed)
            assert listed["as_of"] >= reply["ts"]
