"""The change feed (`watch`) on a real 3-node cluster: DDL with its Tu, commits with their tables
and ts, and schema job steps arrive in log order; every node gives the same events for the same
range, so a watcher resumes on another node from the last Tm it saw; filters; a long poll
returns as soon as an event is applied; a start before a node's snapshot is
WATCH_START_COMPACTED; and the CLI streams the same events."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from metastore.client import SyncMetastoreClient
from metastore.errors import WatchStartCompactedError
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

WAIT_S = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("watch"), 3, dd_ms=300, cs_max_ms=100, snapshot_every_entries=100
    ) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _client(c: MetastoreCluster, node_id: int | None = None) -> SyncMetastoreClient:
    ids = c.ids if node_id is None else [node_id]
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in ids]
    return SyncMetastoreClient(endpoints, c.token("admin"), client_name="watch-test")


def _drain(client: SyncMetastoreClient, from_ts: int, **kw: Any) -> tuple[list[dict], int]:
    events: list[dict[str, Any]] = []
    position = from_ts
    for _ in range(100):
        page = client.watch(position, limit=7, **kw)
        events.extend(page["events"])
        if page["next_from_ts"] == position and not page["events"]:
            return events, position
        position = page["next_from_ts"]
    raise AssertionError("the feed did not settle")


def test_events_arrive_in_log_order_and_every_node_agrees(cluster: MetastoreCluster) -> None:
    with _client(cluster) as c:
        start = c.watch()["next_from_ts"]
        c.ddl("CREATE NAMESPACE wa")
        c.ddl("CREATE TABLE wa.t (a INT, b INT)")
        c.ddl("CREATE TABLE wa.u (a INT)")
        commit = c.commit(
            "w-1",
            [
                {
                    "table": "wa.t",
                    "schema_version": 1,
                    "add": [{"path": "1.parquet", "size_bytes": 1, "row_count": 2}],
                },
                {
                    "table": "wa.u",
                    "schema_version": 1,
                    "add": [{"path": "2.parquet", "size_bytes": 1, "row_count": 3}],
                },
            ],
        )
        job_id = c.ddl("ALTER TABLE wa.t DROP COLUMN b")["job_id"]
        deadline = time.monotonic() + WAIT_S
        while c.job_show(job_id)["status"] == "running":
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.1)
        events, end = _drain(c, start)
    kinds = [(e["kind"], e.get("table") or e.get("namespace")) for e in events]
    assert kinds == [
        ("namespace_created", "wa"),
        ("schema_published", "wa.t"),
        ("schema_published", "wa.u"),
        ("commit", None),
        ("schema_published", "wa.t"),
        ("schema_job", None),
        ("schema_published", "wa.t"),
        ("schema_job", None),
    ]
    [c_event] = [e for e in events if e["kind"] == "commit"]
    assert (c_event["ts"], c_event["tables"], c_event["rows_added"]) == (
        commit["ts"],
        ["wa.t", "wa.u"],
        5,
    )
    assert [e["what"] for e in events if e["kind"] == "schema_job"] == ["started", "advanced"]
    tms = [e["tm"] for e in events]
    assert tms == sorted(tms)
    assert all(e["tu"] > e["tm"] for e in events if e["kind"] == "schema_published")
    # Same range, any node: the same events (derived from the same entries).
    for node_id in cluster.ids:
        with _client(cluster, node_id) as one:
            got, _ = _drain(one, start)
            assert got == events
    # Resume in the middle, on another node, from the last Tm seen.
    with _client(cluster, cluster.ids[-1]) as other:
        rest, _ = _drain(other, events[3]["tm"])
        assert rest == events[4:]
    # Filters.
    with _client(cluster) as c:
        only_u, _ = _drain(c, start, table="wa.u")
        assert [e["kind"] for e in only_u] == ["schema_published", "commit"]
        ns_events, _ = _drain(c, start, namespace="wa")
        assert len(ns_events) == len(events) - 2  # the job events name no table
        assert end > start


def test_a_long_poll_returns_when_an_event_is_applied(cluster: MetastoreCluster) -> None:
    with _client(cluster) as c:
        start = c.watch()["next_from_ts"]
        result: dict[str, Any] = {}

        def poll() -> None:
            with _client(cluster, cluster.ids[1]) as follower:
                began = time.monotonic()
                result["page"] = follower.watch(start, wait_ms=10_000)
                result["s"] = time.monotonic() - began

        thread = threading.Thread(target=poll)
        thread.start()
        time.sleep(0.5)
        c.ddl("CREATE NAMESPACE wb")
        thread.join(timeout=WAIT_S)
        assert not thread.is_alive()
    assert [e["kind"] for e in result["page"]["events"]] == ["namespace_created"]
    assert 0.4 < result["s"] < 5  # woke on the event, not at the 10 s limit


def test_a_start_before_the_nodes_snapshot_is_a_typed_error(cluster: MetastoreCluster) -> None:
    with _client(cluster) as c:
        c.ddl("CREATE NAMESPACE IF NOT EXISTS wc")
        c.ddl("CREATE TABLE IF NOT EXISTS wc.t (a INT)")
        for i in range(110):  # past snapshot_every_entries
            add = [{"path": f"{i}.parquet", "size_bytes": 1, "row_count": 1}]
            c.commit(f"wc-{i}", [{"table": "wc.t", "schema_version": 1, "add": add}])
    victim = cluster.ids[0]
    cluster.kill(victim)
    cluster.start(victim)
    cluster.wait_ready(timeout_s=WAIT_S, among=[victim])
    with _client(cluster, victim) as c:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                c.watch(1)
            except WatchStartCompactedError as exc:
                oldest = exc.details["oldest_ts"]
                assert isinstance(oldest, int) and oldest > 1
                break
            assert time.monotonic() < deadline, "the restarted node kept every event"
            time.sleep(0.2)
        page = c.watch(oldest)  # from the oldest kept on, it answers
        assert page["oldest_ts"] == oldest
        # 0 means "from the oldest kept" (the CLI's --oldest): the same events, no error.
        from_zero = c.watch(0)
        assert from_zero["events"] == page["events"]
    endpoint = f"127.0.0.1:{cluster.client_ports[victim]}"
    args = ["--endpoints", endpoint, "--token", cluster.token("reader"), "-o", "json"]
    result = CliRunner().invoke(cli, [*args, "watch", "--oldest", "--count", "1", "--for", "5s"])
    assert result.exit_code == 0, result.output


def test_the_cli_streams_events_as_json_lines(cluster: MetastoreCluster) -> None:
    endpoints = ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids)
    with _client(cluster) as c:
        start = c.watch()["next_from_ts"]
        c.ddl("CREATE NAMESPACE wd")
        c.ddl("CREATE TABLE wd.t (a INT)")
    args = ["--endpoints", endpoints, "--token", cluster.token("reader"), "-o", "json"]
    result = CliRunner().invoke(
        cli, [*args, "watch", "wd", "--from", str(start), "--count", "2", "--for", "20s"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [(e["kind"], e.get("table") or e.get("namespace")) for e in lines] == [
        ("namespace_created", "wd"),
        ("schema_published", "wd.t"),
    ]
    text = CliRunner().invoke(
        cli,
        [
            "--endpoints",
            endpoints,
            "--token",
            cluster.token("reader"),
            "watch",
            "wd.t",
            "--from",
            str(start),
            "--count",
            "1",
        ],
    )
    assert text.exit_code == 0, text.output
    assert "schema_published" in text.output and "table=wd.t" in text.output


def test_the_cli_stops_after_count_only_between_entries(cluster: MetastoreCluster) -> None:
    # DROP NAMESPACE CASCADE is one entry with three events at one tm. `--count 1` used to
    # stop after the first of them; resuming with `--from` that event's tm (as the docstring
    # says) then skipped the other two for good.
    endpoints = ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids)
    with _client(cluster) as c:
        c.ddl("CREATE NAMESPACE wcount")
        c.ddl("CREATE TABLE wcount.a (x INT)")
        c.ddl("CREATE TABLE wcount.b (x INT)")
        start = c.watch()["next_from_ts"]
        c.ddl("DROP NAMESPACE wcount CASCADE")
        dropped, _ = _drain(c, start, namespace="wcount")
    assert sorted(e["kind"] for e in dropped) == ["namespace_dropped", *["table_dropped"] * 2]
    args = ["--endpoints", endpoints, "--token", cluster.token("reader"), "-o", "json"]
    seen: list[dict[str, Any]] = []
    position = start
    for _ in range(3):
        result = CliRunner().invoke(
            cli,
            [*args, "watch", "wcount", "--from", str(position), "--count", "1", "--for", "3s"],
        )
        assert result.exit_code == 0, result.output
        lines = [json.loads(line) for line in result.output.splitlines()]
        if not lines:
            break
        seen.extend(lines)
        position = lines[-1]["tm"]  # resume after the last event printed
    assert sorted(json.dumps(e, sort_keys=True) for e in seen) == sorted(
        json.dumps(e, sort_keys=True) for e in dropped
    )


def test_a_position_inside_an_entry_is_accepted_over_the_wire(cluster: MetastoreCluster) -> None:
    """`from_event` (a reply's `next_from_event` after a page that ended inside a huge entry)
    is an argument of the op, not refused as an unknown one."""
    with _client(cluster) as c:
        start = c.watch()["next_from_ts"]
        page = c.call("watch", {"from_ts": start, "from_event": 1, "wait_ms": 0})
        assert page["next_from_event"] == 0 and page["next_from_ts"] >= start
