"""A table location is where the daemon itself reads and deletes (the leader's GC, the removal
check), with its own credentials; CREATE TABLE needs only the writer role. pyarrow reads
options from a URI's query (`s3://b/t?endpoint_override=host:port&scheme=http`), so a writer
could send the leader's store requests, signed with its credentials, to any host. A new
table's URI location may hold no query or fragment: refused when the DDL is parsed, and by
the leader for a CreateTable a follower (or a writer) sends through `_propose`, which skipped
the parse-time rules (a `file://host/...` location too). Stub node, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from hlc import HybridClock, SystemClock
from metastore.commands import CreateTable, TableName, encode_command
from metastore.daemon.metrics import NodeMetrics
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from metastore.ddl import parse_ddl
from metastore.errors import InvalidArgumentError
from tests.metastore.test_manifests import ready

BAD_LOCATIONS = [
    "s3://bucket/t?endpoint_override=127.0.0.1:9&scheme=http",
    "s3://bucket?endpoint_override=127.0.0.1:9",
    "gs://bucket/t#x",
    "file://host/data/t",
]


@pytest.mark.parametrize("location", BAD_LOCATIONS)
def test_the_parser_refuses_a_location_the_daemon_must_not_open(location: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_ddl(f"CREATE TABLE ns.t (a INT) LOCATION '{location}'")


def test_a_local_path_may_hold_a_question_mark() -> None:
    cmd = parse_ddl("CREATE TABLE ns.t (a INT) LOCATION '/data/what?/t'")
    assert isinstance(cmd, CreateTable) and cmd.location == "/data/what?/t"


@pytest.mark.parametrize("location", BAD_LOCATIONS)
def test_the_leader_refuses_it_in_a_forwarded_command(location: str) -> None:
    template = parse_ddl("CREATE TABLE ns.t (a INT) LOCATION 's3://bucket/t'")
    assert isinstance(template, CreateTable)
    cmd = CreateTable(table=TableName.parse("ns.t"), schema=template.schema, location=location)
    proposed: list[bytes] = []

    async def propose(data: bytes, **_kw: object) -> None:
        proposed.append(data)

    api = ApiServer(
        node=SimpleNamespace(  # type: ignore[arg-type]
            node_id=1, ready_to_serve=True, is_leader=lambda: True, propose=propose
        ),
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=NodeMetrics(1),
        cluster_id="ct",
        client_addresses={},
    )
    writer = Session(peer="t", role=Role.WRITER)
    with pytest.raises(InvalidArgumentError):
        asyncio.run(api._propose_op(writer, {"command": encode_command(cmd)}))
    assert proposed == []
