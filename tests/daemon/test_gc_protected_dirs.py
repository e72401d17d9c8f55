"""A writer token must not reach the node's own files through the GC (real node).

`CREATE TABLE ... LOCATION` takes any directory, and the leader's GC deletes, with the
daemon's own rights, the files a table's removed entries name under its location. So a writer
(not an admin) could point a table at the secrets directory or a node's data directory, commit
`cluster.secret` or `node-1/IDENTITY`, drop the table, and have the leader delete them: the
node then loses its identity or its peer secret at its next start. The GC never deletes inside
those directories, nor the TLS files: such a path is reported as gone (so the queue drains,
as for a table without a location) and left on disk, and the refusal is logged."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon.config import NODE_LOG_FILE_NAME
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

GC_TTL_S = 1.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("gcprot"),
        1,
        dd_ms=300,
        cs_max_ms=100,
        gc_interval_ms=3_600_000,  # runs only when asked
        # Any location (the default, the warehouse only, refuses these CREATE TABLEs outright:
        # tests/daemon/test_allowed_locations_cluster.py): the GC protects the node's own
        # files even where the operator allows tables.
        allowed_locations='["*"]',
    ) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _client(c: MetastoreCluster, role: str) -> SyncMetastoreClient:
    return SyncMetastoreClient(
        [f"127.0.0.1:{c.client_ports[1]}"], c.token(role), client_name=f"gcprot-{role}"
    )


@pytest.mark.parametrize(
    ("directory", "victim"),
    [("secrets", "cluster.secret"), ("data", "node-1/IDENTITY")],
)
def test_a_writer_cannot_make_the_gc_delete_the_nodes_own_files(
    node: MetastoreCluster, directory: str, victim: str
) -> None:
    location = node.dir / directory
    target = location / victim
    assert target.is_file()
    before = target.read_bytes()
    table = f"gcprot.t_{directory}"
    with _client(node, "writer") as writer, _client(node, "admin") as admin:
        if directory == "secrets":
            writer.ddl("CREATE NAMESPACE gcprot")
        writer.ddl(
            f"CREATE TABLE {table} (id BIGINT) LOCATION '{location}' "
            f"TBLPROPERTIES ('gc.ttl' = '{int(GC_TTL_S)}s')"
        )
        add = [{"path": victim, "size_bytes": len(before), "row_count": 1}]
        writer.commit(
            f"gcprot-{uuid.uuid4().hex[:8]}", [{"table": table, "schema_version": 1, "add": add}]
        )
        writer.ddl(f"DROP TABLE {table}")
        time.sleep(GC_TTL_S * 1.5)  # past the dropped incarnation's TTL (no event to await)
        run = admin.gc_run(table)
        collected = [t for t in run["tables"] if t["threshold"] > 0]
        assert collected, run  # the dropped incarnation was collected...
        assert admin.gc_status(table)["tables"][0]["file_entries"] == 0  # ...its entry dropped
    assert target.is_file(), f"the GC deleted {target}"  # ...and the file left on disk
    assert target.read_bytes() == before
    log = (node.dir / "data" / "node-1" / NODE_LOG_FILE_NAME).read_text()
    assert f"left {target} on disk" in log, "the refusal is logged"
