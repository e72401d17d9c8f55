"""Schema leases with real Spark: a writing batch leases the versions it pinned, so it can no
longer be overtaken by two schema changes. A batch that runs across two ALTERs commits with the
version it pinned; the second ALTER waits for the batch to end. The bridge's session carries the
Spark application's id, heartbeats while the app lives and is closed with the bridge. A second
driver killed with SIGKILL blocks the ALTER only until its session expires."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import pytest

from tests.spark.support import SparkEnv, read_line_within, rows_of, start_driver

pytestmark = pytest.mark.slow

TABLE = "lease.events"
HOLD_S = 2.0  # how long the batch keeps running after the second ALTER was sent


def test_a_batch_across_two_alters_commits_and_the_second_alter_waits(spark_env: SparkEnv) -> None:
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS lease")
    env.ddl(f"CREATE TABLE {TABLE} (id BIGINT)")
    bridge = env.bridge(app_name="leases")
    session = bridge.session
    assert session is not None and session.current() is not None
    listed = {s["session_id"]: s for s in env.client.session_list()["sessions"]}
    assert listed[session.current()]["app_id"] == env.spark.sparkContext.applicationId

    second: dict[str, Any] = {}
    with bridge.batch(writes=[TABLE]) as b:
        assert b.version(TABLE) == 1
        assert [k.version for k in session.held()] == [1]
        env.ddl(f"ALTER TABLE {TABLE} ADD COLUMN a STRING")  # v2: nothing blocks it
        started = time.monotonic()
        waiter = threading.Thread(
            target=lambda: second.update(
                env.client.ddl(f"ALTER TABLE {TABLE} ADD COLUMN b STRING"),
                finished=time.monotonic(),
            )
        )
        waiter.start()
        time.sleep(HOLD_S)
        assert not second, "v3 was published while a batch held a lease on v1"
        blockers = env.client.lease_blockers(TABLE)["blockers"]
        assert [x["session_id"] for x in blockers] == [session.current()]
        b.write(TABLE, env.spark.createDataFrame([(1,), (2,)], "id BIGINT"))
        batch_ended = time.monotonic()
    # The commit with v1 was accepted: v1 was still one of the two latest versions.
    assert b.report.commit_ts is not None and b.report.pinned == {TABLE: 1}
    waiter.join(60)
    assert second["version"] == 3
    assert second["finished"] >= batch_ended  # it waited for the batch...
    assert second["finished"] - started >= HOLD_S
    assert second["finished"] - batch_ended < 10  # ...and not much longer
    assert rows_of(bridge.read_table(TABLE), "id") == [(1,), (2,)]
    # Closing the bridge closes its session.
    session_id = session.current()
    bridge.close()
    ended = env.client.session_list(include_ended=True)["ended"]
    assert any(e["session_id"] == session_id and e["reason"] == "closed" for e in ended)


KILLED_TTL_MS = 2_000
DRIVER_LINE_TIMEOUT_S = 30.0


def test_an_alter_waits_for_a_killed_driver_only_until_its_session_expires(
    spark_env: SparkEnv,
) -> None:
    """Two drivers hold leases on v1: one in another process, killed with SIGKILL mid-batch
    (its session has a 2 s TTL), and this process's Spark batch. The ALTER to v3 waits for
    both: for the killed one's session to expire, and for the live batch to end."""
    env = spark_env
    table = "lease.killed"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS lease")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    bridge = env.bridge(app_name="survivor")
    proc = start_driver(
        env,
        "tests.spark.driver_until_killed",
        "--txn-id",
        "killed-lessee:0",
        "--lease-ttl-ms",
        str(KILLED_TTL_MS),
        table,
    )
    second: dict[str, Any] = {}
    try:
        line = read_line_within(proc, DRIVER_LINE_TIMEOUT_S)
        assert line, (
            f"driver exited early: {proc.wait(10)} {proc.stderr.read() if proc.stderr else ''}"
        )
        killed = json.loads(line)
        assert killed["versions"] == {table: 1}
        with bridge.batch(writes=[table]) as b:
            assert b.version(table) == 1
            env.ddl(f"ALTER TABLE {table} ADD COLUMN a STRING")  # v2
            waiter = threading.Thread(
                target=lambda: second.update(
                    env.client.ddl(f"ALTER TABLE {table} ADD COLUMN b STRING"),
                    finished=time.monotonic(),
                )
            )
            waiter.start()
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
            # Both block now; the killed one until its session's deadline (its last heartbeat
            # + 2 s), then only this batch's lease blocks.
            shown = env.client.lease_blockers(table)
            by_session = {x["session_id"]: x for x in shown["blockers"]}
            assert bridge.session is not None
            assert set(by_session) == {killed["session_id"], bridge.session.current()}
            killed_deadline = by_session[killed["session_id"]]["expires_at_tm"]
            give_up = time.monotonic() + 30
            while time.monotonic() < give_up:
                shown = env.client.lease_blockers(table)
                holders = {x["session_id"] for x in shown["blockers"]}
                if killed["session_id"] not in holders:
                    break
                time.sleep(0.1)
            assert holders == {bridge.session.current()}
            assert shown["safe_time"] >= killed_deadline  # not a moment before its deadline
            assert not second, "v3 was published while the live batch held its lease"
            b.write(table, env.spark.createDataFrame([(1,)], "id BIGINT"))
            batch_ended = time.monotonic()
        waiter.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert b.report.commit_ts is not None
    assert second["version"] == 3 and second["finished"] >= batch_ended
    ended = env.client.session_list(include_ended=True)["ended"]
    assert any(e["session_id"] == killed["session_id"] and e["reason"] == "ttl" for e in ended)


def test_spark_stop_closes_the_bridges_session(spark_env: SparkEnv) -> None:
    """spark.stop() closes the metastore session at once (its leases stop blocking schema
    changes), not only when the session's TTL runs out or the process exits."""
    env = spark_env
    proc = start_driver(env, "tests.spark.driver_stops_spark")
    try:
        first = read_line_within(proc, 60.0)
        assert first, f"driver exited early: {proc.wait(10)}"
        session_id = json.loads(first)["session_id"]
        assert json.loads(read_line_within(proc, 60.0)) == {"stopped": True}
        assert proc.poll() is None  # still running: only spark.stop() can have closed it
        ended = env.client.session_list(include_ended=True)["ended"]
        assert any(e["session_id"] == session_id and e["reason"] == "closed" for e in ended)
    finally:
        proc.kill()
        proc.wait(10)
