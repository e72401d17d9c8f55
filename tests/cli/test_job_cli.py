"""`metastore job ...` and `metastore sql` following a schema change job, through click's
CliRunner against a real 3-node cluster (separate OS processes on loopback).

A DROP COLUMN through `metastore sql` is followed step by step to `succeeded`; `job list` and
`job show` in both output formats; a lease on the version before the job's current one holds
the job: `job show` names the session, `job wait --timeout` and `job cancel --wait` give up
naming it, and releasing the lease lets the job finish; an ADD COLUMN NOT NULL DEFAULT on a
table with files stops at the backfill step (`sql` exits 0 with the run-backfill command) and
`job cancel` removes the column; a DROP cancelled before its next step brings the column back;
typed errors and exit codes. Every wait is bounded.

Two fake-node tests (no cluster) pin what a real cluster cannot produce on demand: a cancel
that waited for leases and lost the race to the job's own next step, and a follower that skips
no step when several happen between two polls.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from metastore.client import SyncMetastoreClient
from metastore.errors import (
    MetastoreError,
)
from tests.client.fake_node import TOKEN, ThreadedFakeNode
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

NS: Final = "jc"
WAIT_S: Final = 30  # the bound of every wait
DD_MS: Final = 500
CS_MAX_MS: Final = 100
APP: Final = {"app_id": "etl-7", "host": "worker-3", "user": "ana", "pid": 42}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("job-cli"),
        3,
        dd_ms=DD_MS,
        cs_max_ms=CS_MAX_MS,
        session_ttl_ms=1_500,
        session_heartbeat_ms=300,
    ) as c:
        c.start_all()
        c.wait_ready()
        with _client(c, "admin") as admin:
            admin.ddl(f"CREATE NAMESPACE {NS}")
        yield c


# ------------------------------------------------------------------------------------ helpers


def _client(c: MetastoreCluster, role: str = "writer") -> SyncMetastoreClient:
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
    return SyncMetastoreClient(endpoints, c.token(role), client_name=f"job-cli-test-{role}")


def _cli(c: MetastoreCluster, *args: str, role: str = "admin") -> Result:
    endpoints = ",".join(f"127.0.0.1:{c.client_ports[i]}" for i in c.ids)
    result = CliRunner().invoke(
        cli, ["--endpoints", endpoints, "--token", c.token(role), *args], prog_name="metastore"
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def _ok_json(c: MetastoreCluster, *args: str, role: str = "admin") -> Any:
    return json.loads(_ok(_cli(c, "-o", "json", *args, role=role)).stdout)


def _error(result: Result, exit_code: int, code: str) -> str:
    """The error line's message; one `Error: CODE: ...` line, nothing on stdout."""
    assert result.exit_code == exit_code, f"{result.exit_code}\n{result.stdout}\n{result.stderr}"
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("Error: ")]
    assert line.startswith(f"Error: {code}: "), result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    return line


def _wait_for(fn: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except MetastoreError as exc:
            if not exc.retryable:
                raise
            last = exc
        else:
            if last:
                return last
        time.sleep(0.02)
    raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}: {last!r}")


def _names(described: dict[str, Any]) -> list[str]:
    return [col["name"] for col in described["schema"]["columns"]]


def _open_session(client: SyncMetastoreClient) -> str:
    session_id = uuid.uuid4().hex
    assert client.session_open(session_id, ttl_ms=60_000, **APP)["created"] is True
    return session_id


# ------------------------------------------------------------------ sql follows, list, show


@pytest.fixture(scope="module")
def dropped(cluster: MetastoreCluster) -> dict[str, Any]:
    """`metastore sql` DROP COLUMN b (table output), then c (json), both followed to the end."""
    with _client(cluster, "admin") as admin:
        admin.ddl(f"CREATE TABLE {NS}.drop1 (a INT, b STRING, c INT)")
    started = time.monotonic()
    text = _ok(_cli(cluster, "sql", f"ALTER TABLE {NS}.drop1 DROP COLUMN b"))
    elapsed = time.monotonic() - started
    doc = _ok_json(cluster, "sql", f"ALTER TABLE {NS}.drop1 DROP COLUMN c")
    return {"text": text, "elapsed": elapsed, "doc": doc}


def test_sql_follows_a_drop_column_job_to_succeeded(
    cluster: MetastoreCluster, dropped: dict[str, Any]
) -> None:
    text: Result = dropped["text"]
    lines = text.stderr.splitlines()
    job_id = int(lines[0].split("job ")[1].split()[0])
    assert lines == [
        f"the change runs as schema change job {job_id} in 2 steps: write_only -> dropped",
        f"job {job_id}: step 1/2 write_only (version 2)",
        *[ln for ln in lines[2:-2] if ln.startswith(f"job {job_id}: waiting for ")],
        f"job {job_id}: step 2/2 dropped (version 3)",
        f"job {job_id} succeeded: ALTER TABLE {NS}.drop1 DROP COLUMN b",
    ], text.stderr
    assert f"job {job_id}: succeeded at step dropped (versions v2, v3)" in text.stdout
    assert "job_status" not in text.stdout  # the reply's job fields say "running": not shown
    # The second step waited for the first version to activate everywhere, not much longer.
    assert dropped["elapsed"] < 2 * (DD_MS + CS_MAX_MS) / 1000 + 5
    doc = dropped["doc"]
    assert (doc["job_id"], doc["version"], doc["job_step"]) == (job_id + 1, 4, "write_only")
    assert doc["job"]["status"] == "succeeded" and doc["job"]["versions"] == [4, 5]
    assert _names(_ok_json(cluster, "table", "describe", f"{NS}.drop1")) == ["a"]


def test_job_list_and_show_in_table_and_json(
    cluster: MetastoreCluster, dropped: dict[str, Any]
) -> None:
    first = dropped["doc"]["job_id"] - 1
    running = _ok_json(cluster, "job", "list", f"{NS}.drop1")
    assert running["jobs"] == []
    listed = _ok_json(cluster, "job", "list", f"{NS}.drop1", "--all")
    assert [(j["job_id"], j["column"], j["status"]) for j in listed["jobs"]] == [
        (first, "b", "succeeded"),
        (first + 1, "c", "succeeded"),
    ]
    text = _ok(_cli(cluster, "job", "list", "--all")).stdout
    for shown in ("ID", "WAITING FOR", f"{NS}.drop1", "drop_column", "succeeded", "dropped (2/2)"):
        assert shown in text, (shown, text)
    # A reader may look at jobs.
    shown = _ok_json(cluster, "job", "show", str(first), role="reader")
    assert shown == listed["jobs"][0]
    assert shown["steps"] == ["write_only", "dropped"] and shown["versions"] == [2, 3]
    assert shown["waiting_for"]["reason"] == "finished" and shown["base_version"] == 1
    text = _ok(_cli(cluster, "job", "show", str(first))).stdout
    for shown_text in (
        f"job {first}: ALTER TABLE {NS}.drop1 DROP COLUMN b",
        "steps",
        "write_only",
        "<- succeeded",
        "base_version",
        "waiting for: nothing: the job has ended (succeeded)",
    ):
        assert shown_text in text, (shown_text, text)


# --------------------------------------------------------------------- a lease holds a job


def test_a_lease_holds_the_job_and_every_command_names_the_blocker(
    cluster: MetastoreCluster,
) -> None:
    table = f"{NS}.held"
    with _client(cluster, "admin") as admin, _client(cluster) as batch:
        admin.ddl(f"CREATE TABLE {table} (a INT, b INT)")
        session_id = _open_session(batch)
        # The running batch pinned v1: the job's write_only step (v2) may be published, but its
        # next one (v3) would leave leases on three versions while v1 is held.
        [pin] = batch.pin([table], session_id=session_id)["pins"]
        lease = {"table": table, "table_id": pin["table_id"], "version": pin["version"]}
        assert lease["version"] == 1
        started = _ok(
            _cli(cluster, "-o", "json", "sql", "--no-follow", f"ALTER TABLE {table} DROP COLUMN b")
        )
        job_id = json.loads(started.stdout)["job_id"]
        assert (
            f"runs as schema change job {job_id} (write_only -> dropped); "
            f"follow it with `metastore job wait {job_id}`"
        ) in started.stderr
        _wait_for(
            lambda: admin.job_show(job_id)["waiting_for"]["reason"] == "leases",
            "the job to wait for the lease",
        )

        shown = _ok_json(cluster, "job", "show", str(job_id))
        assert (shown["status"], shown["step"]) == ("running", "write_only")
        [blocker] = shown["waiting_for"]["blockers"]
        assert (blocker["session_id"], blocker["version"], blocker["app_id"]) == (
            session_id,
            1,
            "etl-7",
        )
        text = _ok(_cli(cluster, "job", "show", str(job_id))).stdout
        for expected in (
            "<- current",
            "blocking sessions",
            session_id,
            "etl-7",
            "worker-3",
            "ana",
            "v1",
            "HELD FOR",
            f"session {session_id} (app etl-7 on worker-3, user ana, pid 42) holds v1 for ",
        ):
            assert expected in text, (expected, text)
        listed = _ok(_cli(cluster, "job", "list")).stdout
        assert str(job_id) in listed and "write_only (1/2)" in listed and session_id in listed

        # Waiting runs out: exit 3, naming the session in the way (and it was shown meanwhile).
        began = time.monotonic()
        timed_out = _cli(cluster, "job", "wait", str(job_id), "--timeout", "1s")
        assert 1 <= time.monotonic() - began < 10
        line = _error(timed_out, 3, "TIMEOUT")
        assert f"job {job_id} is still running at step write_only (1/2) after 1 s" in line
        assert f"session {session_id} (app etl-7 on worker-3" in line
        assert f"job {job_id}: waiting for 1 lease(s) on version 1" in timed_out.stderr

        # The rollback publishes v3 too: the same lease is in the way. The cancel is recorded
        # (the job moves no further), waits, then says so and how to follow it.
        began = time.monotonic()
        recorded = _cli(cluster, "job", "cancel", str(job_id), "--wait", "1s")
        assert time.monotonic() - began >= 1
        line = _error(recorded, 3, "TIMEOUT")
        assert f"the cancel of job {job_id} is recorded" in line
        assert f"session {session_id}" in line
        shown = admin.job_show(job_id)
        assert (shown["status"], shown["cancel_requested"]) == ("running", True)
        assert shown["waiting_for"]["reason"] == "leases"

        # Released: the job rolls back (its next step never comes), and `job wait` follows it
        # there: the column is public again.
        batch.lease_release(session_id, [lease])
        done = _cli(cluster, "-o", "json", "job", "wait", str(job_id), "--timeout", f"{WAIT_S}s")
        _error(done, 5, "JOB_CANCELLED")
        assert admin.job_show(job_id)["status"] == "cancelled"
        assert _names(admin.describe(table)) == ["a", "b"]
        batch.session_close(session_id)


# --------------------------------------------------------------------- backfill and cancel


def test_sql_stops_at_the_backfill_and_cancel_removes_the_column(
    cluster: MetastoreCluster,
) -> None:
    table = f"{NS}.filled"
    with _client(cluster, "admin") as admin:
        admin.ddl(f"CREATE TABLE {table} (a INT)")
        add = [{"path": "_txn/b1/part-0.parquet", "size_bytes": 100, "row_count": 10}]
        admin.commit(
            f"job-cli-{uuid.uuid4().hex[:8]}", [{"table": table, "schema_version": 1, "add": add}]
        )
    # Files written before the column lack it: the job stops at the backfill step, and `sql`
    # says what to run, exiting 0 (nothing is wrong; the column stays hidden until then).
    added = _ok(_cli(cluster, "sql", f"ALTER TABLE {table} ADD COLUMN n INT NOT NULL DEFAULT 7"))
    job_id = int(added.stderr.split("schema change job ")[1].split()[0])
    assert "4 steps: delete_only -> write_only -> backfill -> public" in added.stderr
    assert f"job {job_id}: step 3/4 backfill (version 4)" in added.stderr
    command = f"metastore job run-backfill {job_id}"
    for out in (added.stderr, added.stdout):
        assert f"Run `{command}`" in out and "stays hidden" in out, out
    assert f"job {job_id}: running at step backfill" in added.stdout

    timed_out = _cli(cluster, "job", "wait", str(job_id), "--timeout", "1s")
    line = _error(timed_out, 3, "TIMEOUT")
    assert f"run `{command}`" in line
    listed = _ok_json(cluster, "job", "list", table)
    assert [(j["job_id"], j["waiting_for"]["reason"]) for j in listed["jobs"]] == [
        (job_id, "backfill")
    ]

    # Readers may look, not cancel.
    _error(_cli(cluster, "job", "cancel", str(job_id), role="reader"), 6, "FORBIDDEN")
    cancelled = _ok_json(cluster, "job", "cancel", str(job_id), role="writer")
    assert cancelled["job"]["status"] == "cancelled"
    assert cancelled["version"] == cancelled["job"]["versions"][-1] == 5
    described = _ok_json(cluster, "table", "describe", table)
    assert _names(described) == ["a"] and described["pending"] == []
    assert described["version"] == 5
    line = _error(_cli(cluster, "job", "wait", str(job_id)), 5, "JOB_CANCELLED")
    assert "cancelled by metastore-cli" in line and "at step backfill" in line
    assert "was rolled back" in line
    _error(_cli(cluster, "job", "cancel", str(job_id)), 5, "SCHEMA_JOB_STATE")
    text = _ok(_cli(cluster, "job", "show", str(job_id))).stdout
    assert "(rollback)" in text and "<- cancelled" in text


def test_cancelling_a_drop_before_its_next_step_brings_the_column_back(
    cluster: MetastoreCluster,
) -> None:
    """A DROP's next step waits for its first version to be active on every node (DD + CSmax
    after it is applied); a cancel sent in that window goes first. (A lease cannot hold the
    job for the cancel: the rollback publishes a version too and waits for the same leases,
    see test_a_lease_holds_the_job_and_every_command_names_the_blocker.)"""
    table = f"{NS}.undrop"
    with _client(cluster, "admin") as admin, _client(cluster, "reader") as reader:
        admin.ddl(f"CREATE TABLE {table} (a INT, b STRING NOT NULL COMMENT 'keep me', c INT)")
        before = admin.describe(table)["schema"]
        ddl: dict[str, Any] = {}
        alter = threading.Thread(
            target=lambda: ddl.update(admin.ddl(f"ALTER TABLE {table} DROP COLUMN b"))
        )
        alter.start()
        try:
            [job] = _wait_for(lambda: reader.job_list(table)["jobs"], "the job to start")
            assert (job["step"], job["waiting_for"]["reason"]) == ("write_only", "activation")
            result = _cli(cluster, "-o", "json", "job", "cancel", str(job["job_id"]), "--wait", "0")
        finally:
            alter.join(WAIT_S)
        assert ddl["job_id"] == job["job_id"]
        cancelled = json.loads(_ok(result).stdout)
        assert cancelled["job"]["status"] == "cancelled", (
            "the job's next step went first: the cancel did not reach the leader within "
            f"DD + CSmax = {DD_MS + CS_MAX_MS} ms"
        )
    described = _ok_json(cluster, "table", "describe", table)
    # b is back at its place, same field id, but nullable (writers of the drop's write-only
    # version fill it with NULL).
    b = before["columns"][1]
    assert b["nullable"] is False
    assert described["schema"]["columns"] == [
        before["columns"][0],
        {**b, "nullable": True},
        before["columns"][2],
    ]
    assert described["schema"]["ddl"] == "`a` INT, `b` STRING COMMENT 'keep me', `c` INT"
    assert described["pending"] == []
    assert "keep me" in _ok(_cli(cluster, "table", "describe", table)).stdout


# ------------------------------------------------------------------------------------ errors


def test_unknown_jobs_and_bad_arguments(cluster: MetastoreCluster) -> None:
    for args in (["job", "show", "999999"], ["job", "cancel", "999999"], ["job", "wait", "999999"]):
        line = _error(_cli(cluster, *args), 4, "SCHEMA_JOB_NOT_FOUND")
        assert "999999" in line
    _error(_cli(cluster, "job", "cancel", "999999", role="reader"), 6, "FORBIDDEN")
    assert _cli(cluster, "job", "show", "0").exit_code == 2
    assert _cli(cluster, "job", "wait", "1", "--timeout", "soon").exit_code == 2
    assert _cli(cluster, "job", "cancel", "1", "--wait", "later").exit_code == 2


# ------------------------------------------------------------------ fake node (no cluster)


def _view(step_index: int, status: str = "running", **more: Any) -> dict[str, Any]:
    steps = ["delete_only", "write_only", "backfill", "public"]
    return {
        "job_id": 9,
        "table": "s.t",
        "kind": "add_column",
        "column": "n",
        "statement": "ALTER TABLE `s`.`t` ADD COLUMN `n` INT NOT NULL DEFAULT 7",
        "status": status,
        "step": steps[step_index],
        "step_index": step_index,
        "steps": steps,
        "versions": list(range(2, 3 + step_index)),
        "ended_by": "",
        "message": "",
        "waiting_for": (
            {"reason": "activation", "message": "a version", "blockers": []}
            if status == "running"
            else {"reason": "finished", "message": f"nothing: the job has ended ({status})"}
        ),
        **more,
    }


def test_a_follower_shows_every_step_even_when_several_pass_between_polls() -> None:
    views = iter([_view(0), _view(3, "succeeded")])

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "job_show" and args == {"job_id": 9}
        return next(views)

    with ThreadedFakeNode(handler=handler) as node:
        result = CliRunner().invoke(
            cli, ["--endpoints", node.endpoint, "--token", TOKEN, "job", "wait", "9"]
        )
    assert result.exit_code == 0, result.stderr
    steps = [ln for ln in result.stderr.splitlines() if ": step " in ln]
    assert steps == [
        "job 9: step 1/4 delete_only (version 2)",
        "job 9: step 2/4 write_only (version 3)",
        "job 9: step 3/4 backfill (version 4)",
        "job 9: step 4/4 public (version 5)",
    ]


def test_a_follower_waits_until_the_last_version_of_an_ended_job_is_in_force() -> None:
    # The job ends in the log at Tu; its last version is readable everywhere only at Tu + CSmax.
    activating = {"reason": "activation", "message": "version 5 activates", "blockers": []}
    views = iter([_view(3, "succeeded", waiting_for=activating), _view(3, "succeeded")])
    calls: list[str] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        calls.append(op)
        return next(views)

    with ThreadedFakeNode(handler=handler) as node:
        result = CliRunner().invoke(
            cli,
            [
                "--endpoints",
                node.endpoint,
                "--token",
                TOKEN,
                "job",
                "wait",
                "9",
                "--timeout",
                "20s",
            ],
        )
    assert result.exit_code == 0, result.stderr
    assert calls == ["job_show", "job_show"]


def test_waiting_for_an_ended_jobs_last_version_stops_at_the_timeout() -> None:
    # A node whose view keeps saying "activating" (its clock or its state stuck) must not keep
    # `job wait` polling past --timeout: it gives up (exit 3) and says what it waited for.
    activating = {"reason": "activation", "message": "version 5 activates", "blockers": []}
    calls: list[str] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        calls.append(op)
        # Bounded for the old code, which never looked at the deadline here: ~6 s of polls.
        return _view(3, "succeeded", waiting_for=activating if len(calls) < 30 else None)

    started = time.monotonic()
    with ThreadedFakeNode(handler=handler) as node:
        result = CliRunner().invoke(
            cli,
            [
                *("--endpoints", node.endpoint, "--token", TOKEN),
                *("job", "wait", "9", "--timeout", "500ms"),
            ],
        )
    assert result.exit_code == 3, result.stderr
    assert time.monotonic() - started < 3
    assert "job 9 succeeded" in result.stderr and "version 5 activates" in result.stderr
    assert "not in force on every node" in result.stderr


def test_a_cancel_blocked_by_leases_is_recorded_and_followed_until_the_rollback() -> None:
    blocker = {"session_id": "s1", "app_id": "etl", "host": "h", "user": "u", "pid": 1}
    leases = {
        "reason": "leases",
        "message": "the rollback waits for leases on version 1",
        "blockers": [blocker | {"version": 1}],
    }
    shows = iter(
        [
            _view(1, cancel_requested=True, waiting_for=leases),
            _view(1, "cancelled", versions=[2, 3, 4]),
            _view(1, "cancelled", versions=[2, 3, 4]),
        ]
    )
    calls: list[str] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        calls.append(op)
        if op == "job_cancel":
            return {"job_id": 9, "cancel_requested": True, "changed": False}
        return next(shows)

    with ThreadedFakeNode(handler=handler) as node:
        result = CliRunner().invoke(
            cli,
            ["--endpoints", node.endpoint, "--token", TOKEN, "job", "cancel", "9", "--wait", "20s"],
        )
    assert result.exit_code == 0, result.stderr
    assert "session s1 (app etl on h, user u, pid 1) holds v1" in result.stderr
    assert calls == ["job_cancel", "job_show", "job_show", "job_show"]


def test_job_show_says_how_many_blockers_the_view_does_not_name() -> None:
    blocker = {"table": "ns.t", "version": 1, "session_id": "s1", "app_id": "a", "user": "u"}
    leases = {"reason": "leases", "message": "leases", "blockers": [blocker], "blocker_count": 250}

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return _view(1, waiting_for=leases)

    with ThreadedFakeNode(handler=handler) as node:
        result = CliRunner().invoke(
            cli, ["--endpoints", node.endpoint, "--token", TOKEN, "job", "show", "9"]
        )
    assert result.exit_code == 0, result.stderr
    assert "and 249 more (`metastore lease blockers" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("after", "exit_code"),
    [
        # The cancel was applied before the leader lost its quorum: the command says so.
        ([_view(1, "cancelled", versions=[2, 3, 4])], 0),
        # Recorded (leases in the way), then rolled back.
        (
            [
                _view(1, cancel_requested=True),
                _view(1, "cancelled", versions=[2, 3, 4]),
                _view(1, "cancelled", versions=[2, 3, 4]),
            ],
            0,
        ),
        # Not applied: the node's TIMEOUT stands (exit 3), and the user may run it again.
        ([_view(1)], 3),
    ],
)
def test_a_cancel_whose_reply_a_leader_change_lost_looks_at_the_job(
    after: list[dict[str, Any]], exit_code: int
) -> None:
    """`job_cancel` is not repeatable by the client: a node that times out on it (its leader
    lost its quorum with the proposal pending) answers TIMEOUT, and the cancel may still apply.
    The command ended there with exit 3 although the job was (or was being) cancelled, and
    running it again said SCHEMA_JOB_STATE ("only a running job can be cancelled"), exit 5.
    It now looks at the job and goes on as if the reply had come."""
    from metastore.errors import RequestTimeoutError

    shows = iter(after)
    last = after[-1]

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "job_cancel":
            raise RequestTimeoutError("job_cancel: the proposal was not committed in time")
        return next(shows, last)

    with ThreadedFakeNode(handler=handler) as node:
        result = CliRunner().invoke(
            cli,
            ["--endpoints", node.endpoint, "--token", TOKEN, "job", "cancel", "9", "--wait", "5s"],
        )
    assert result.exit_code == exit_code, result.output
    if exit_code == 0:
        assert "job 9 cancelled" in result.stdout and "v4" in result.stdout
    else:
        assert "TIMEOUT" in result.stderr


@pytest.mark.parametrize(
    ("more", "note"),
    [
        ({"backfill_ts": None}, "it needed no backfill"),
        ({"backfill_ts": 1 << 40, "files_rewritten": 3}, "3 files rewritten in all"),
    ],
)
def test_run_backfill_of_a_succeeded_job_says_so_without_starting_spark(
    monkeypatch: pytest.MonkeyPatch, more: dict[str, Any], note: str
) -> None:
    # Starting Spark took 10-13 s on 2 cores only for the bridge to find the job done.
    def no_spark(**_kwargs: Any) -> None:
        raise AssertionError("Spark started for a job that had succeeded")

    monkeypatch.setattr("cli.job_backfill.run_with_bridge", no_spark)

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "job_show" and args == {"job_id": 9}
        return _view(3, "succeeded", field_id=4, backfill_from_ts=1 << 39, **more)

    with ThreadedFakeNode(handler=handler) as node:
        result = CliRunner().invoke(
            cli,
            [
                "--endpoints",
                node.endpoint,
                "--token",
                TOKEN,
                "-o",
                "json",
                "job",
                "run-backfill",
                "9",
            ],
        )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["outcome"] == "job_succeeded" and document["attempts"] == 0
    assert note in document["note"] and note in result.stderr
    assert document["snapshot_ts"] == (more["backfill_ts"] or 0)
