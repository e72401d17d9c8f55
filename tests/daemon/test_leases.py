"""Sessions and schema leases on a real 3-node cluster (separate OS processes on loopback).

A session opened and a version pinned + leased through a follower; the ALTER that would publish
a third leased version is refused with its blockers when asked not to wait, and otherwise waits
until the lease is released - or, for a client that stopped heartbeating, until its session's
deadline, after which the leader's sweep records the expiry on every node. Admin expiry, typed
errors for unknown sessions, old versions and reader tokens."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from metastore.client import SyncMetastoreClient
from metastore.errors import (
    ErrorCode,
    ForbiddenError,
    LeaseVersionNotLatestError,
    MetastoreError,
    SchemaChangeBlockedError,
    SessionNotFoundError,
)
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

TTL_MS = 1_500
TABLE = "lz.t"
WAIT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("leases"),
        3,
        dd_ms=300,
        cs_max_ms=100,
        session_ttl_ms=TTL_MS,
        session_heartbeat_ms=300,
    ) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _client(
    c: MetastoreCluster, node_id: int | None = None, role: str = "writer"
) -> SyncMetastoreClient:
    ids = c.ids if node_id is None else [node_id]
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in ids]
    return SyncMetastoreClient(endpoints, c.token(role), client_name=f"leases-test-{role}")


def _follower(c: MetastoreCluster) -> int:
    for i in c.ids:
        status = c.try_status(i)
        if status is not None and status.get("role") == "follower":
            return i
    raise AssertionError("no follower")


def _open(client: SyncMetastoreClient, **kw: Any) -> str:
    session_id = uuid.uuid4().hex
    r = client.session_open(
        session_id, app_id="app-7", app_name="etl", host="h", user="ana", pid=9, **kw
    )
    assert r["created"] is True
    return session_id


def _alter(client: SyncMetastoreClient, column: str, **kw: Any) -> dict[str, Any]:
    return client.ddl(f"ALTER TABLE {TABLE} ADD COLUMN {column} INT", **kw)


def test_an_alter_waits_for_a_released_lease(cluster: MetastoreCluster) -> None:
    admin = _client(cluster, role="admin")
    admin.ddl("CREATE NAMESPACE IF NOT EXISTS lz")
    admin.ddl(f"CREATE TABLE {TABLE} (id BIGINT)")
    via_follower = _client(cluster, _follower(cluster))
    session_id = _open(via_follower, ttl_ms=60_000)
    pinned = via_follower.pin([TABLE], session_id=session_id)
    [pin] = pinned["pins"]
    assert pin["version"] == 1 and pinned["lease"]["leases"][0]["version"] == 1
    _alter(admin, "a")  # v2: leases on v1 and v2 are the two latest
    with pytest.raises(SchemaChangeBlockedError) as blocked:
        _alter(admin, "b", wait_ms=0)
    [blocker] = blocked.value.details["blockers"]  # type: ignore[misc]
    assert (blocker["session_id"], blocker["app_id"], blocker["host"], blocker["version"]) == (
        session_id,
        "app-7",
        "h",
        1,
    )
    shown = admin.lease_blockers(TABLE)
    assert [b["session_id"] for b in shown["blockers"]] == [session_id]
    assert shown["publishing_version"] == 3
    # Waiting: the ALTER goes through as soon as the lease is released.
    seen: list[Any] = []
    done: dict[str, Any] = {}
    waiter = threading.Thread(
        target=lambda: done.update(
            _alter(admin, "b", wait_ms=WAIT_S * 1000, on_blocked=seen.append)
        )
    )
    waiter.start()
    # Until the ALTER reports it is blocked (a fixed 1.5 s sleep could end first on a loaded
    # machine, the request not even sent yet).
    blocked_deadline = time.monotonic() + WAIT_S
    while not seen and not done and time.monotonic() < blocked_deadline:
        time.sleep(0.05)
    assert not done and seen, "the ALTER should be waiting"
    released_at = time.monotonic()
    via_follower.lease_release(
        session_id, [{"table": TABLE, "table_id": pin["table_id"], "version": 1}]
    )
    waiter.join(WAIT_S)
    assert done["version"] == 3
    # Soon after the release, not at the end of its 30 s wait (generous for a loaded machine).
    assert time.monotonic() - released_at < WAIT_S / 2
    # A lease on a version that is no longer one of the two latest is refused (retryable).
    with pytest.raises(LeaseVersionNotLatestError) as old:
        via_follower.lease_acquire(
            session_id, [{"table": TABLE, "table_id": pin["table_id"], "version": 1}]
        )
    assert old.value.retryable
    assert via_follower.session_close(session_id)["closed"] is True
    for c in (admin, via_follower):
        c.close()


def test_a_silent_session_blocks_only_until_its_deadline(cluster: MetastoreCluster) -> None:
    admin = _client(cluster, role="admin")
    writer = _client(cluster)
    session_id = _open(writer)  # the cluster's TTL: 1.5 s
    pinned = writer.pin([TABLE], session_id=session_id)
    version = pinned["pins"][0]["version"]
    _alter(admin, "c")
    started = time.monotonic()
    result = _alter(admin, "d", wait_ms=WAIT_S * 1000)  # no heartbeat ever comes
    waited = time.monotonic() - started
    assert result["version"] == version + 2
    assert waited < TTL_MS / 1000 + 5
    with pytest.raises(SessionNotFoundError):
        writer.session_heartbeat(session_id)
    # The leader's sweep records the expiry, identically on every node.
    deadline = time.monotonic() + WAIT_S
    for node_id in cluster.ids:
        one = _client(cluster, node_id, role="reader")
        while True:
            ended = one.session_list(include_ended=True).get("ended", [])
            mine = [e for e in ended if e["session_id"] == session_id]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert mine and mine[0]["reason"] == "ttl" and mine[0]["by"].startswith("leader:"), mine
        one.close()
    for c in (admin, writer):
        c.close()


def test_admin_expiry_and_roles(cluster: MetastoreCluster) -> None:
    admin = _client(cluster, role="admin")
    writer = _client(cluster)
    reader = _client(cluster, role="reader")
    session_id = _open(writer, ttl_ms=60_000)
    listed = [s["session_id"] for s in reader.session_list()["sessions"]]
    assert session_id in listed
    with pytest.raises(ForbiddenError):
        reader.session_open(uuid.uuid4().hex)
    with pytest.raises(ForbiddenError):
        writer.session_expire([session_id])
    r = admin.session_expire([session_id])
    assert r["expired"] == [session_id] and r["reason"] == "admin"
    ended = admin.session_list(include_ended=True)["ended"]
    [by] = [e["by"] for e in ended if e["session_id"] == session_id]
    assert by.startswith("leases-test-admin")  # the caller's client name, recorded in the log
    with pytest.raises(SessionNotFoundError):
        writer.session_heartbeat(session_id)
    for c in (admin, writer, reader):
        c.close()


def _cli(cluster: MetastoreCluster, *args: str, role: str = "admin") -> Result:
    endpoints = ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids)
    return CliRunner().invoke(
        cli,
        ["--endpoints", endpoints, "--token", cluster.token(role), *args],
        prog_name="metastore",
    )


def test_the_cli_shows_who_blocks_a_change_and_an_admin_can_end_it(
    cluster: MetastoreCluster,
) -> None:
    writer = _client(cluster)
    session_id = _open(writer, ttl_ms=60_000)
    version = writer.pin([TABLE], session_id=session_id)["pins"][0]["version"]
    assert _cli(cluster, "sql", f"ALTER TABLE {TABLE} ADD COLUMN e INT").exit_code == 0
    listed = _cli(cluster, "session", "list")
    assert listed.exit_code == 0 and session_id in listed.stdout and "app-7" in listed.stdout
    blockers = _cli(cluster, "-o", "json", "lease", "blockers", TABLE)
    assert json.loads(blockers.stdout)["blockers"][0]["session_id"] == session_id
    text = _cli(cluster, "lease", "blockers", TABLE)
    assert f"publishing v{version + 2} waits for 1 lease(s)" in text.stdout
    assert session_id in _cli(cluster, "lease", "list", TABLE).stdout
    # Waiting runs out: exit 5, the blockers named on stderr while waiting and in the error.
    started = time.monotonic()
    refused = _cli(cluster, "sql", "--wait", "2s", f"ALTER TABLE {TABLE} ADD COLUMN f INT")
    assert refused.exit_code == 5, refused.stderr
    assert time.monotonic() - started >= 2
    assert "waiting" in refused.stderr and session_id in refused.stderr
    assert "Error: SCHEMA_CHANGE_BLOCKED:" in refused.stderr and "app app-7 on h" in refused.stderr
    assert _cli(cluster, "sql", "--wait", "soon", "ALTER TABLE x.y ADD COLUMN g INT").exit_code == 2
    # Only an admin may end someone's session; then the change goes through at once.
    assert _cli(cluster, "session", "expire", session_id, role="writer").exit_code == 6
    expired = _cli(cluster, "session", "expire", session_id)
    assert expired.exit_code == 0 and session_id in expired.stdout
    done = _cli(
        cluster, "-o", "json", "sql", "--wait", "0", f"ALTER TABLE {TABLE} ADD COLUMN f INT"
    )
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["version"] == version + 2
    ended = json.loads(_cli(cluster, "-o", "json", "session", "list", "--all").stdout)["ended"]
    assert any(e["session_id"] == session_id and e["reason"] == "admin" for e in ended)
    writer.close()


def test_a_pin_naming_one_table_in_two_spellings_leases_it_once(cluster: MetastoreCluster) -> None:
    # Table names are case-insensitive: "lz.cased" and "LZ.Cased" are one table, so a batch
    # that reads one spelling and writes the other pins the same version twice. Its lease
    # request must name that version once (AcquireLeases refuses a key listed twice), not
    # fail the whole pin with a non-retryable INVALID_ARGUMENT.
    admin = _client(cluster, role="admin")
    admin.ddl("CREATE NAMESPACE IF NOT EXISTS lz")
    admin.ddl("CREATE TABLE lz.cased (id BIGINT)")
    writer = _client(cluster)
    session_id = _open(writer, ttl_ms=60_000)
    pinned = writer.pin(["lz.cased", "LZ.Cased"], session_id=session_id)
    assert [p["version"] for p in pinned["pins"]] == [1, 1]
    assert len(pinned["lease"]["leases"]) == 1
    held = admin.lease_list("lz.cased")["leases"]
    assert [(h["session_id"], h["version"]) for h in held] == [(session_id, 1)]
    assert writer.session_close(session_id)["closed"] is True
    for c in (admin, writer):
        c.close()


def test_leases_named_in_two_spellings_are_released_and_acquired_as_one(
    cluster: MetastoreCluster,
) -> None:
    # The bridge builds its lease keys from the pins, one per name it was given: a batch that
    # named one table in two spellings releases (and re-acquires) both keys in one request.
    # ReleaseLeases refuses a key listed twice, so the release failed every time and the lease
    # stayed until the session ended, blocking the table's schema changes all that while.
    admin = _client(cluster, role="admin")
    admin.ddl("CREATE NAMESPACE IF NOT EXISTS lz")
    admin.ddl("CREATE TABLE lz.twice (id BIGINT)")
    writer = _client(cluster)
    session_id = _open(writer, ttl_ms=60_000)
    pins = writer.pin(["lz.twice", "LZ.Twice"], session_id=session_id)["pins"]
    keys = [{"table": p["table"], "table_id": p["table_id"], "version": p["version"]} for p in pins]
    assert keys[0]["table"] != keys[1]["table"]
    assert writer.lease_release(session_id, keys)["released"] == 1
    assert admin.lease_list("lz.twice")["leases"] == []
    acquired = writer.lease_acquire(session_id, keys)
    assert [h["session_id"] for h in admin.lease_list("lz.twice")["leases"]] == [session_id]
    assert len(acquired["leases"]) == 1
    assert writer.session_close(session_id)["closed"] is True
    for c in (admin, writer):
        c.close()


def test_a_pin_moves_its_sessions_held_lease_forward_when_it_says_so(
    cluster: MetastoreCluster,
) -> None:
    # A streaming query's lease is never let go: a pin that carries known_tm (the Tm of the
    # newest pin answered, `lease_tm`) and renew_from moves its read_ts and acquired Tm up.
    admin = _client(cluster, role="admin")
    admin.ddl("CREATE NAMESPACE IF NOT EXISTS lz")
    admin.ddl("CREATE TABLE lz.renewed (id BIGINT)")
    writer = _client(cluster)
    session_id = _open(writer, ttl_ms=60_000)
    args: dict[str, Any] = {"tables": ["lz.renewed"], "session_id": session_id, "known_tm": 0}
    first = writer.call("pin", args)
    (before,) = admin.lease_list("lz.renewed")["leases"]
    assert before["read_ts"] == min(first["ts"], first["safe_time"])
    assert before["acquired_tm"] == first["lease_tm"]
    second = writer.call("pin", {**args, "known_tm": first["lease_tm"], "renew_from": 1 << 62})
    (after,) = admin.lease_list("lz.renewed")["leases"]
    assert after["read_ts"] == min(second["ts"], second["safe_time"]) > before["read_ts"]
    assert after["acquired_tm"] == second["lease_tm"] > before["acquired_tm"]
    with pytest.raises(MetastoreError) as refused:
        writer.call("pin", {**args, "known_tm": None, "renew_from": 1})
    assert refused.value.code == ErrorCode.BAD_REQUEST
    # A release that knows only the first pin keeps the lease the second touched (a pin that
    # crossed it on the wire); one that knows the second releases it.
    keys = [{"table": "lz.renewed", "table_id": after["table_id"], "version": 1}]
    kept = writer.lease_release(session_id, keys, known_tm=first["lease_tm"])
    assert (kept["released"], kept["kept"]) == (0, [[after["table_id"], 1]])
    gone = writer.lease_release(session_id, keys, known_tm=second["lease_tm"])
    assert (gone["released"], gone["kept"]) == (1, [])
    # The Tm each release was applied at: after the pins, and in log order.
    assert second["lease_tm"] < kept["release_tm"] < gone["release_tm"]
    assert admin.lease_list("lz.renewed")["leases"] == []
    assert writer.session_close(session_id)["closed"] is True
    for c in (admin, writer):
        c.close()
