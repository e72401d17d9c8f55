"""The `metastore` CLI as a user runs it against a real 3-node cluster that the CLI itself made
(`cluster init`) and started (`cluster up`) in a temporary directory on free loopback ports.

Starting, stopping and refusing to start the nodes, one table-form read and one error of each
exit code run as real subprocesses (`RealCluster.run`); every other command runs the same command
line in this process (`RealCluster.call`), which spares a Python start per call.

One cluster serves the whole module, and the tests run in file order on purpose, the way an
operator's session goes: start, change schemas, read them back (now and AS OF), make mistakes,
move the leader, lose a follower to kill -9 and bring it back, and finally `cluster down`
(which must be last). The module fixture's finalizer stops the nodes with `cluster down` and then
SIGKILLs any node PID still listed in a pid file, so a failing test leaves no process behind.

Every `-o json` output is parsed (an invalid document fails the test), and every error is
checked for its exit code, one `Error: CODE: message` line on stderr and an empty stdout.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pytest

from tests.cli.real_cluster import (
    LIFECYCLE_TIMEOUT_S,
    NODES,
    Done,
    RealCluster,
    free_base_port,
    pid_alive,
    unused_port,
    wait_pid_gone,
)

pytestmark = pytest.mark.slow

# An HLC timestamp is physical_ms << 16 | logical (docs/protocol.md).
LOGICAL_BITS: Final = 16
# Safe time of an idle healthy node trails its clock by about one idle tick (250 ms); allow a
# loaded machine generous slack while still catching a node that stopped advancing.
SAFE_TIME_LAG_MS_MAX: Final = 3_000
# How long leadership may take to settle on every node after a transfer.
LEADER_SETTLE_S: Final = 10.0
NAMESPACE: Final = "sales"
TABLE: Final = f"{NAMESPACE}.orders"


def physical_ms(ts: int) -> int:
    return ts >> LOGICAL_BITS


def hlc_of_ms(ms: int) -> int:
    return ms << LOGICAL_BITS


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def iso_of_ms(ms: int) -> str:
    """The ISO-8601 form a person would type (millisecond precision, `Z`)."""
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def assert_error(done: Done, exit_code: int, code: str) -> None:
    """Exit code, exactly one `Error: CODE: message` line (the first on stderr), no traceback,
    and nothing on stdout that a script could mistake for a result."""
    assert done.returncode == exit_code, done.describe()
    lines = done.stderr.splitlines()
    error_lines = [line for line in lines if line.startswith("Error: ")]
    assert len(error_lines) == 1, done.describe()
    assert lines[0] == error_lines[0], done.describe()
    prefix = f"Error: {code}: "
    assert lines[0].startswith(prefix), done.describe()
    assert lines[0][len(prefix) :].strip(), f"empty message\n{done.describe()}"
    assert "Traceback" not in done.stderr, done.describe()
    assert done.stdout == "", done.describe()


def status_by_node(cluster: RealCluster) -> dict[int, dict[str, Any]]:
    docs = cluster.ok_json("cluster", "status")
    assert len(docs) == NODES, docs
    assert all(d["ok"] for d in docs), docs
    return {d["result"]["node_id"]: d["result"] for d in docs}


def leader_of(statuses: dict[int, dict[str, Any]]) -> int:
    leaders = [n for n, s in statuses.items() if s["role"] == "leader"]
    assert len(leaders) == 1, statuses
    return leaders[0]


def version_at(cluster: RealCluster, as_of: str, *, endpoints: list[str] | None = None) -> int:
    doc = cluster.ok_json("table", "describe", TABLE, "--as-of", as_of, endpoints=endpoints)
    assert doc["table"] == TABLE, doc
    version: int = doc["version"]
    return version


# ---- fixtures --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    cluster: RealCluster
    init: Done
    up: Done


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    base_port = free_base_port()
    cluster = RealCluster(
        config_dir=tmp_path_factory.mktemp("real-cluster") / "cluster",
        base_port=base_port,
        cluster_id="clireal",
    )
    config_dir = str(cluster.config_dir)
    init = cluster.run(
        "-o",
        "json",
        "cluster",
        "init",
        config_dir,
        "--cluster-id",
        cluster.cluster_id,
        "--base-port",
        str(base_port),
    )
    assert init.returncode == 0, init.describe()
    try:
        up = cluster.run("cluster", "up", "--config", config_dir, timeout_s=LIFECYCLE_TIMEOUT_S)
        yield Started(cluster=cluster, init=init, up=up)
    finally:
        down = ("cluster", "down", "--config", config_dir, "--grace-ms", "3000")
        cluster.run(*down, timeout_s=LIFECYCLE_TIMEOUT_S)
        cluster.kill_leftovers()


@pytest.fixture(scope="module")
def cluster(started: Started) -> RealCluster:
    assert started.up.returncode == 0, started.up.describe()
    return started.cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class Schema:
    """The DDL the module's reads are checked against."""

    create_ns: dict[str, Any]
    create_table: Done
    alter: Done
    table_list: dict[str, Any]

    @property
    def v1(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.create_table.json()
        return doc

    @property
    def v2(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.alter.json()
        return doc


@pytest.fixture(scope="module")
def schema(cluster: RealCluster) -> Schema:
    create_ns = cluster.ok_json("sql", f"CREATE NAMESPACE {NAMESPACE}")
    create_table = cluster.call(
        "-o", "json", "sql", f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, amount DECIMAL(10,2))"
    )
    assert create_table.returncode == 0, create_table.describe()
    # Reading between the two changes also leaves time between their Tu's, which the
    # relative --as-of check below needs.
    table_list = cluster.ok_json("table", "list", NAMESPACE)
    current = cluster.ok_json("table", "describe", TABLE)
    assert current["version"] == 1, current
    alter = cluster.call("-o", "json", "sql", f"ALTER TABLE {TABLE} ADD COLUMN note STRING")
    assert alter.returncode == 0, alter.describe()
    return Schema(
        create_ns=create_ns, create_table=create_table, alter=alter, table_list=table_list
    )


# ---- start -----------------------------------------------------------------------------------


def test_init_and_up_start_a_cluster_with_a_ready_leader(started: Started) -> None:
    cluster = started.cluster
    init = started.init.json()
    assert init["cluster_id"] == cluster.cluster_id
    assert init["endpoints"] == cluster.endpoints()
    assert Path(init["token_files"]["admin"]) == cluster.token_file("admin")
    up = started.up
    assert up.returncode == 0, up.describe()
    leader_rows = [line for line in up.stdout.splitlines() if " leader " in f" {line} "]
    assert leader_rows, up.describe()
    assert any(" yes " in f" {row} " for row in leader_rows), up.describe()
    for node_id in range(1, NODES + 1):
        pid = cluster.pid(node_id)
        assert pid is not None and pid_alive(pid), f"node {node_id}\n{up.describe()}"


def test_status_shows_three_ready_nodes_and_one_leader(cluster: RealCluster) -> None:
    docs = cluster.ok_json("cluster", "status")
    assert [d["endpoint"] for d in docs] == cluster.endpoints()
    statuses = status_by_node(cluster)
    assert sorted(statuses) == list(range(1, NODES + 1))
    leader = leader_of(statuses)
    for node_id, s in statuses.items():
        assert s["ready"] is True, s
        assert s["cluster_id"] == cluster.cluster_id, s
        assert s["leader"] == leader, s
        assert sorted(s["voters"]) == list(range(1, NODES + 1)), s
        assert s["role"] == ("leader" if node_id == leader else "follower"), s
        # Only the leader reports how far the others are (no snapshot being sent here).
        if node_id != leader:
            assert s["replication"] == {}, s
    followers = statuses[leader]["replication"]
    assert sorted(int(n) for n in followers) == [n for n in statuses if n != leader]
    for p in followers.values():
        assert p["learner"] is False and p["snapshot_bytes"] == p["snapshot_acked_bytes"] == 0
        assert p["state"] in ("probe", "replicate") and p["match"] > 0 and p["behind"] >= 0
    table = cluster.run("cluster", "status")
    assert table.returncode == 0 and f"as leader {leader} sees it" in table.stdout, table.stdout


def test_up_refuses_while_the_nodes_run(cluster: RealCluster) -> None:
    pids = {n: cluster.pid(n) for n in range(1, NODES + 1)}
    done = cluster.run("cluster", "up", "--config", str(cluster.config_dir))
    assert_error(done, 5, "ALREADY_RUNNING")
    assert {n: cluster.pid(n) for n in pids} == pids
    assert all(p is not None and pid_alive(p) for p in pids.values())


# ---- schema changes and reads ----------------------------------------------------------------


def test_ddl_returns_its_version_and_tu_after_dd_plus_cs_max(
    cluster: RealCluster, schema: Schema
) -> None:
    config = cluster.config()
    dd_ms, cs_max_ms = config.dd_ms, config.cs_max_ms
    assert schema.create_ns["namespace"] == NAMESPACE
    for done, version in ((schema.create_table, 1), (schema.alter, 2)):
        doc = done.json()
        assert doc["table"] == TABLE, doc
        assert doc["version"] == version, doc
        # IEP-98: Tu = Tm + DD, and the call returns only once now >= Tu + CSmax.
        assert physical_ms(doc["tu"]) - physical_ms(doc["tm"]) == dd_ms, doc
        assert done.elapsed_s >= (dd_ms + cs_max_ms) / 1000, done.describe()
    assert schema.v2["tu"] > schema.v1["tu"]
    assert TABLE in schema.table_list["tables"]


def test_describe_now_shows_the_altered_schema(cluster: RealCluster, schema: Schema) -> None:
    doc = cluster.ok_json("table", "describe", TABLE)
    assert doc["version"] == 2
    assert doc["tu"] == schema.v2["tu"]
    assert [c["name"] for c in doc["schema"]["columns"]] == ["id", "amount", "note"]
    assert doc["schema"]["columns"][0]["nullable"] is False
    table = cluster.call("table", "describe", TABLE)
    assert table.returncode == 0, table.describe()
    assert "note" in table.stdout and "DECIMAL(10,2)" in table.stdout


def test_as_of_an_hlc_integer_is_answered_alike_by_every_node(
    cluster: RealCluster, schema: Schema
) -> None:
    tu2 = schema.v2["tu"]
    for endpoint in cluster.endpoints():
        assert version_at(cluster, str(tu2 - 1), endpoints=[endpoint]) == 1, endpoint
        assert version_at(cluster, str(tu2), endpoints=[endpoint]) == 2, endpoint


def test_as_of_an_iso_time(cluster: RealCluster, schema: Schema) -> None:
    tu2_ms = physical_ms(schema.v2["tu"])
    assert version_at(cluster, iso_of_ms(tu2_ms - 1)) == 1
    assert version_at(cluster, iso_of_ms(tu2_ms + 1)) == 2


def test_as_of_a_relative_time(cluster: RealCluster, schema: Schema) -> None:
    tu1_ms = physical_ms(schema.v1["tu"])
    tu2_ms = physical_ms(schema.v2["tu"])
    # Before the ALTER's Tu: the CLI anchors "-Nms" at its own clock, read somewhere between
    # `begin` and `end`, so the as-of lies in [target, target + (end - begin)].
    target_ms = tu1_ms + 50
    begin = wall_ms()
    version = version_at(cluster, f"-{begin - target_ms}ms")
    end = wall_ms()
    assert target_ms + (end - begin) < tu2_ms, (
        f"the describe call took {end - begin} ms, longer than the {tu2_ms - target_ms} ms "
        "between the two versions: this check could not tell them apart"
    )
    assert version == 1
    # After it: once a second has passed since Tu, "-1s" lands after it.
    wait_s = (tu2_ms + 1_000 + 20 - wall_ms()) / 1000
    if wait_s > 0:
        time.sleep(wait_s)
    assert version_at(cluster, "-1s") == 2


def test_history_lists_both_versions(cluster: RealCluster, schema: Schema) -> None:
    doc = cluster.ok_json("table", "history", TABLE)
    versions = doc["versions"]
    assert [v["version"] for v in versions] == [1, 2]
    assert [v["tu"] for v in versions] == [schema.v1["tu"], schema.v2["tu"]]
    assert "ADD COLUMN" in versions[1]["change"].upper()
    assert [c["name"] for c in versions[0]["schema"]["columns"]] == ["id", "amount"]
    table = cluster.call("table", "history", TABLE)
    assert table.returncode == 0, table.describe()


def test_ns_list_create_and_drop(cluster: RealCluster, schema: Schema) -> None:
    def names() -> list[str]:
        return [n["name"] for n in cluster.ok_json("ns", "list")["namespaces"]]

    assert NAMESPACE in names()
    created = cluster.ok_json("ns", "create", "scratch", "--comment", "temporary")
    assert created["namespace"] == "scratch"
    assert "scratch" in names()
    again = cluster.call("-o", "json", "ns", "create", "scratch")
    assert_error(again, 5, "NAMESPACE_ALREADY_EXISTS")
    dropped = cluster.ok_json("ns", "drop", "scratch")
    assert dropped["namespace"] == "scratch"
    assert "scratch" not in names()
    assert cluster.ok_json("ns", "drop", "scratch", "--if-exists")["namespace"] == "scratch"


def test_safe_time_of_every_node_is_recent(cluster: RealCluster) -> None:
    docs = cluster.ok_json("safe-time")
    assert [d["endpoint"] for d in docs] == cluster.endpoints()
    assert all(d["ok"] for d in docs), docs
    results = [d["result"] for d in docs]
    assert sorted(r["node_id"] for r in results) == list(range(1, NODES + 1))
    for r in results:
        assert r["ready"] is True, r
        assert 0 <= r["lag_ms"] <= SAFE_TIME_LAG_MS_MAX, r
        assert 0 < r["safe_time"] <= r["now"], r
    table = cluster.call("safe-time")
    assert table.returncode == 0, table.describe()


# ---- mistakes --------------------------------------------------------------------------------


ERRORS: Final = {
    "unknown table": (["table", "describe", f"{NAMESPACE}.nope"], 4, "TABLE_NOT_FOUND"),
    "invalid ddl": (["sql", f"CREATE TABLE {NAMESPACE}.bad (id BIGINTT)"], 5, "INVALID_DDL"),
    "refused change": (
        ["sql", f"ALTER TABLE {TABLE} ALTER COLUMN note TYPE INT"],
        5,
        "UNSUPPORTED_SCHEMA_CHANGE",
    ),
    "wrong token": (["--token", "not-a-token-of-this-cluster", "ns", "list"], 6, "UNAUTHENTICATED"),
    # An unknown id is not found, as etcdctl's revoke of an unknown lease.
    "unknown session": (["session", "expire", "no-such-session"], 4, "SESSION_NOT_FOUND"),
    "unknown protection": (["pts", "release", "no-such-record"], 4, "PROTECTION_NOT_FOUND"),
    "unknown job": (["job", "cancel", "987654"], 4, "SCHEMA_JOB_NOT_FOUND"),
    # Found by the CLI itself, before any request.
    "table without namespace": (["table", "describe", "orders"], 2, "USAGE"),
    "as-of years ahead": (
        ["table", "describe", TABLE, "--as-of", "2030-01-01T00:00:00Z"],
        2,
        "USAGE",
    ),
    "reader runs sql": (["--token-file", "{reader}", "sql", "CREATE NAMESPACE rd"], 6, "FORBIDDEN"),
    # A short budget: with the default (10 s) the client keeps retrying a refused endpoint.
    "no endpoint": (
        ["--endpoints", "127.0.0.1:{unused}", "--timeout-ms", "1500", "ns", "list"],
        3,
        "UNAVAILABLE",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_errors_have_an_exit_code_and_one_error_line(
    cluster: RealCluster, schema: Schema, case: str, fmt: str
) -> None:
    args, exit_code, code = ERRORS[case]
    filled = [a.format(reader=cluster.token_file("reader"), unused=unused_port()) for a in args]
    assert_error(cluster.call("-o", fmt, *filled), exit_code, code)


@pytest.mark.parametrize(("case", "fmt"), [("unknown table", "json"), ("wrong token", "table")])
def test_errors_reach_the_shell_through_the_entry_point(
    cluster: RealCluster, schema: Schema, case: str, fmt: str
) -> None:
    # The exit codes 3 and 5 are seen through a subprocess by the lifecycle tests.
    args, exit_code, code = ERRORS[case]
    assert_error(cluster.run("-o", fmt, *args), exit_code, code)


def test_refused_commands_changed_nothing(cluster: RealCluster, schema: Schema) -> None:
    history = cluster.ok_json("table", "history", TABLE)
    assert [v["version"] for v in history["versions"]] == [1, 2]
    assert cluster.ok_json("table", "list", NAMESPACE)["tables"] == [TABLE]
    namespaces = [n["name"] for n in cluster.ok_json("ns", "list")["namespaces"]]
    assert "rd" not in namespaces
    # The reader token may read what it may not change.
    reader = str(cluster.token_file("reader"))
    assert cluster.ok_json("--token-file", reader, "table", "describe", TABLE)["version"] == 2


def test_global_flags_after_the_subcommand_and_every_table(
    cluster: RealCluster, schema: Schema
) -> None:
    # As a user types it with etcdctl: the output flag after the command, no namespace.
    every = cluster.call("table", "list", "-o", "json")
    assert every.returncode == 0, every.describe()
    assert TABLE in every.json()["tables"]
    reader = str(cluster.token_file("reader"))
    one = cluster.call("table", "list", NAMESPACE, "--token-file", reader, "--output", "json")
    assert one.returncode == 0, one.describe()
    assert one.json()["tables"] == [TABLE]


# ---- leadership and failures -----------------------------------------------------------------


def test_transfer_leader_moves_leadership(cluster: RealCluster) -> None:
    before = leader_of(status_by_node(cluster))
    target = min(n for n in range(1, NODES + 1) if n != before)
    assert cluster.ok_json("cluster", "transfer-leader", str(target)) == {"leader": target}
    deadline = time.monotonic() + LEADER_SETTLE_S
    while True:
        statuses = status_by_node(cluster)
        settled = all(s["leader"] == target for s in statuses.values())
        if settled and leader_of(statuses) == target:
            break
        assert time.monotonic() < deadline, f"leadership did not settle on {target}: {statuses}"
        time.sleep(0.1)


def test_transfer_leader_to_the_leader_is_done_at_once(cluster: RealCluster) -> None:
    """Leadership already where it was asked to go: exit 0 at once, not INVALID_ARGUMENT
    "did not move within 5000 ms" after no wait at all (as `cluster transfer-leader N`
    answered when N had just won an election)."""
    leader = leader_of(status_by_node(cluster))
    assert cluster.ok_json("cluster", "transfer-leader", str(leader)) == {"leader": leader}
    assert leader_of(status_by_node(cluster)) == leader


def test_a_killed_follower_is_reported_and_restarted_alone(
    cluster: RealCluster, schema: Schema
) -> None:
    config_dir = str(cluster.config_dir)
    leader = leader_of(status_by_node(cluster))
    victim = max(n for n in range(1, NODES + 1) if n != leader)
    pids = {n: cluster.pid(n) for n in range(1, NODES + 1)}
    victim_pid = pids[victim]
    assert victim_pid is not None
    os.kill(victim_pid, signal.SIGKILL)
    assert wait_pid_gone(victim_pid, 5.0), f"node {victim} (pid {victim_pid}) survived SIGKILL"

    status = cluster.run("-o", "json", "cluster", "status")
    assert status.returncode == 3, status.describe()  # documented: 3 if any node did not answer
    by_endpoint = {d["endpoint"]: d for d in status.json()}
    down = by_endpoint[cluster.endpoint(victim)]
    assert down["ok"] is False and down["error"]["code"] == "UNAVAILABLE", down
    assert sum(d["ok"] for d in by_endpoint.values()) == NODES - 1, by_endpoint

    # Writes still work, even when the dead node is the first endpoint tried.
    others = [e for e in cluster.endpoints() if e != cluster.endpoint(victim)]
    outage = f"{NAMESPACE}.during_outage"
    created = cluster.ok_json(
        "sql", f"CREATE TABLE {outage} (id INT)", endpoints=[cluster.endpoint(victim), *others]
    )
    assert created["version"] == 1

    refused = cluster.call("cluster", "up", "--config", config_dir)
    assert_error(refused, 5, "ALREADY_RUNNING")
    assert cluster.pid(victim) == victim_pid  # nothing was started

    up_missing = ("-o", "json", "cluster", "up", "--missing", "--config", config_dir)
    up = cluster.run(*up_missing, timeout_s=LIFECYCLE_TIMEOUT_S)
    assert up.returncode == 0, up.describe()
    started_lines = [line for line in up.stderr.splitlines() if line.startswith("started node")]
    assert len(started_lines) == 1 and started_lines[0].startswith(f"started node {victim} ")
    restarted = {d["result"]["node_id"]: d["result"] for d in up.json() if d["ok"]}
    assert restarted[victim]["ready"] is True, up.describe()
    new_pid = cluster.pid(victim)
    assert new_pid is not None and new_pid != victim_pid and pid_alive(new_pid)
    assert {n: p for n, p in pids.items() if n != victim} == {
        n: cluster.pid(n) for n in pids if n != victim
    }, "a node that was running was restarted"

    # The restarted node caught up with what happened while it was down.
    doc = cluster.ok_json("table", "describe", outage, endpoints=[cluster.endpoint(victim)])
    assert doc["version"] == 1
    assert all(s["ready"] for s in status_by_node(cluster).values())

    # With every node running, --missing starts nothing.
    noop = cluster.call("-o", "json", "cluster", "up", "--missing", "--config", config_dir)
    assert noop.returncode == 0, noop.describe()
    assert "started node" not in noop.stderr
    assert cluster.pid(victim) == new_pid


# ---- stop (must stay last: it takes the module's cluster down) --------------------------------


def test_down_stops_every_node_and_is_idempotent(cluster: RealCluster) -> None:
    config_dir = str(cluster.config_dir)
    pids = {n: cluster.pid(n) for n in range(1, NODES + 1)}
    assert all(p is not None and pid_alive(p) for p in pids.values()), pids
    down = cluster.run(
        "-o", "json", "cluster", "down", "--config", config_dir, timeout_s=LIFECYCLE_TIMEOUT_S
    )
    assert down.returncode == 0, down.describe()
    assert down.json() == [
        {"node_id": n, "pid": pids[n], "outcome": "stopped"} for n in range(1, NODES + 1)
    ]
    for n, pid in pids.items():
        assert pid is not None and not pid_alive(pid), f"node {n} (pid {pid}) still runs"
        assert not cluster.pid_file(n).exists(), n

    again = cluster.call("-o", "json", "cluster", "down", "--config", config_dir)
    assert again.returncode == 0, again.describe()
    assert again.json() == [
        {"node_id": n, "pid": None, "outcome": "not running"} for n in range(1, NODES + 1)
    ]

    status = cluster.call("-o", "json", "cluster", "status")
    assert status.returncode == 3, status.describe()
    docs = status.json()
    assert len(docs) == NODES and not any(d["ok"] for d in docs), docs
    assert all(d["error"]["code"] == "UNAVAILABLE" for d in docs), docs
