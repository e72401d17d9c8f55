"""The audit log (metastore/daemon/audit.py) on a real node: every write and admin request, every
request refused for its role and every refused hello leave one JSON line in the node's
audit.log, with who (client name, role, peer), what (op and its identifying arguments) and the
outcome; reads leave none, and no token or file list is ever written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import ForbiddenError, TableAlreadyExistsError
from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("audit"), 1, dd_ms=300, cs_max_ms=100) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _client(c: MetastoreCluster, role: str, name: str) -> SyncMetastoreClient:
    return SyncMetastoreClient([f"127.0.0.1:{c.client_ports[1]}"], c.token(role), client_name=name)


def _records(c: MetastoreCluster) -> list[dict[str, Any]]:
    [path] = list(Path(c.dir).rglob("audit.log"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_writes_refusals_and_bad_hellos_are_audited_reads_are_not(node: MetastoreCluster) -> None:
    with _client(node, "writer", "etl-job") as w:
        w.ddl("CREATE NAMESPACE au")
        w.ddl("CREATE TABLE au.t (a INT)")
        with pytest.raises(TableAlreadyExistsError):
            w.ddl("CREATE TABLE au.t (a INT)")
        w.commit(
            "au-1",
            [
                {
                    "table": "au.t",
                    "schema_version": 1,
                    "add": [{"path": "x.parquet", "size_bytes": 1, "row_count": 1}],
                }
            ],
        )
        w.describe("au.t")  # a read
    with _client(node, "reader", "dashboard") as r, pytest.raises(ForbiddenError):
        r.ddl("DROP TABLE au.t", wait_ms=0)
    stranger = RawClient(node.client_ports[1])
    try:
        reply = stranger.call("hello", token="not-a-token", client="intruder")
        assert not reply["ok"]
    finally:
        stranger.close()
    records = _records(node)
    # The client adds its pid to the name it gives.
    by_op = [(r["op"], r["client"].split(" pid=")[0], r["outcome"]) for r in records]
    assert ("ddl", "etl-job", "OK") in by_op
    assert ("ddl", "etl-job", "TABLE_ALREADY_EXISTS") in by_op
    assert ("commit", "etl-job", "OK") in by_op
    assert ("ddl", "dashboard", "FORBIDDEN") in by_op
    assert ("hello", "intruder", "UNAUTHENTICATED") in by_op
    assert not any(r["op"] == "describe" for r in records)
    [commit] = [r for r in records if r["op"] == "commit"]
    assert (commit["txn_id"], commit["writes"], commit["role"]) == ("au-1", {"au.t": 1}, "writer")
    [create] = [
        r for r in records if r.get("sql") == "CREATE TABLE au.t (a INT)" and r["outcome"] == "OK"
    ]
    assert create["peer"].startswith("('127.0.0.1'")
    text = "\n".join(json.dumps(r) for r in records)
    for role in ("admin", "writer", "reader"):
        assert node.token(role) not in text
    assert "x.parquet" not in text


def test_each_record_names_the_token_used_not_only_the_name_the_client_gave(
    node: MetastoreCluster,
) -> None:
    """The client name is whatever the client says: a writer may call itself "admin". Who
    changed what must rest on what the node checked, the token: each record names it (its
    name in tokens.json, never its value), and a refused hello names none."""
    with _client(node, "writer", "admin") as w:
        w.ddl("CREATE NAMESPACE au_named")
    with _client(node, "reader", "etl-job") as r, pytest.raises(ForbiddenError):
        r.ddl("DROP NAMESPACE au_named", wait_ms=0)
    stranger = RawClient(node.client_ports[1])
    try:
        assert not stranger.call("hello", token="not-a-token-either", client="writer")["ok"]
    finally:
        stranger.close()
    records = _records(node)
    [created] = [r for r in records if r.get("sql") == "CREATE NAMESPACE au_named"]
    assert (created["outcome"], created["token_name"]) == ("OK", "writer")
    [refused] = [r for r in records if r.get("sql") == "DROP NAMESPACE au_named"]
    assert (refused["outcome"], refused["token_name"]) == ("FORBIDDEN", "reader")
    bad_hello = [r for r in records if r["op"] == "hello" and r["client"] == "writer"]
    assert [r["token_name"] for r in bad_hello] == [None]
