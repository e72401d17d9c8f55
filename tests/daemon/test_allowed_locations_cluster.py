"""`allowed_locations` on a real node: a writer cannot put a table (and so the GC's deletions)
outside the warehouse and the roots the operator allows (metastore/daemon/allowed_locations.py).

Before this setting `CREATE TABLE ns.t (...) LOCATION '/home/someone/important'` needed only
the writer role; committing the files there and dropping the table had the leader's GC delete
them past the table's TTL. The leader now refuses such a location (INVALID_ARGUMENT, reason
`location_not_allowed`, naming the allowed roots), whether it parsed the DDL itself or got the
CreateTable through `_propose`; and the GC leaves alone a table created outside before the
roots were narrowed (an upgrade): it stays readable, its files stay on disk."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.commands import encode_command
from metastore.daemon.config import NODE_LOG_FILE_NAME
from metastore.daemon.gc_worker import SKIPPED_NOT_ALLOWED
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from tests.daemon.harness import MetastoreCluster, metastore_cluster, run_cli

pytestmark = pytest.mark.slow

GC_TTL_S = 1.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    directory = tmp_path_factory.mktemp("locroots")
    with metastore_cluster(
        directory,
        1,
        dd_ms=300,
        cs_max_ms=100,
        gc_interval_ms=3_600_000,  # runs only when asked
        allowed_locations='["external"]',  # relative to cluster.toml, as the warehouse
    ) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _client(c: MetastoreCluster, role: str) -> SyncMetastoreClient:
    return SyncMetastoreClient(
        [f"127.0.0.1:{c.client_ports[1]}"], c.token(role), client_name=f"locroots-{role}"
    )


def test_create_table_outside_the_allowed_roots_is_refused(node: MetastoreCluster) -> None:
    victim = node.dir / "home" / "someone" / "important"
    victim.mkdir(parents=True)
    evil = node.dir / "warehouse-evil"  # a text prefix of the warehouse, not a sub-directory
    escape = node.dir / "warehouse" / "escape"  # a link inside the warehouse leading out
    escape.parent.mkdir(exist_ok=True)
    escape.symlink_to(victim)
    allowed = [str(node.dir / "warehouse"), str(node.dir / "external")]
    with _client(node, "writer") as writer, _client(node, "admin") as admin:
        writer.ddl("CREATE NAMESPACE outside")
        for client in (writer, admin):  # not a matter of role
            for location in (victim, f"file://{victim}/", evil, escape / "t"):
                with pytest.raises(MetastoreError) as caught:
                    client.ddl(f"CREATE TABLE outside.t (id BIGINT) LOCATION '{location}'")
                assert caught.value.code == "INVALID_ARGUMENT", caught.value
                assert caught.value.details["reason"] == "location_not_allowed"
                assert caught.value.details["allowed_locations"] == allowed
        # The same command sent as the internal op a follower forwards with: checked too.
        cmd = parse_ddl(f"CREATE TABLE outside.t (id BIGINT) LOCATION '{victim}'")
        with pytest.raises(MetastoreError) as caught:
            writer.call("_propose", {"command": encode_command(cmd), "timeout_ms": 5_000})
        assert caught.value.details["reason"] == "location_not_allowed"
        assert "outside.t" not in str(admin.call("list_tables", {}))


def test_create_table_inside_the_allowed_roots_works(node: MetastoreCluster) -> None:
    with _client(node, "writer") as writer:
        writer.ddl("CREATE NAMESPACE inside")
        writer.ddl("CREATE TABLE inside.default_location (id BIGINT)")
        for name, location in (
            ("in_warehouse", f"{node.dir}/warehouse/elsewhere/t/"),
            ("in_external", f"file://{node.dir}/external/t"),
        ):
            writer.ddl(f"CREATE TABLE inside.{name} (id BIGINT) LOCATION '{location}'")
            assert writer.schema_at(f"inside.{name}")["location"] == location.rstrip("/")


def test_a_table_may_not_reach_a_live_tables_directory_through_a_symbolic_link(
    node: MetastoreCluster,
) -> None:
    # Both texts lie in the warehouse and do not overlap, so the catalog let the second table
    # share the first one's directory; the GC of either then took the other's files.
    real = node.dir / "warehouse" / "linked" / "real"
    real.mkdir(parents=True)
    (node.dir / "warehouse" / "linked" / "alias").symlink_to(real)
    with _client(node, "writer") as writer:
        writer.ddl("CREATE NAMESPACE linked")
        writer.ddl(f"CREATE TABLE linked.t (id BIGINT) LOCATION '{real}'")
        with pytest.raises(MetastoreError) as err:
            writer.ddl(f"CREATE TABLE linked.u (id BIGINT) LOCATION '{real.parent / 'alias'}'")
        assert err.value.code == "INVALID_ARGUMENT"
        assert err.value.details["reason"] == "location_shares_directory"
        assert err.value.details["table"] == "linked.t"
        writer.ddl("DROP TABLE linked.t")  # a dropped table's directory may be used again
        writer.ddl(f"CREATE TABLE linked.u (id BIGINT) LOCATION '{real.parent / 'alias'}'")


def test_the_gc_leaves_a_table_created_outside_before_an_upgrade_alone(
    tmp_path: Path,
) -> None:
    """An existing cluster whose table lives outside the roots (created under `["*"]`, or
    before the setting existed) restarts with the default (the warehouse only): the table stays
    readable and writable, and the GC reports it skipped and deletes nothing there."""
    outside = tmp_path / "legacy"
    victim = outside / "data.parquet"
    outside.mkdir()
    victim.write_bytes(b"user data")
    with metastore_cluster(
        tmp_path / "cluster",
        1,
        dd_ms=300,
        cs_max_ms=100,
        gc_interval_ms=3_600_000,
        allowed_locations='["*"]',
    ) as c:
        c.start_all()
        c.wait_ready()
        table = "legacy.t"
        with _client(c, "writer") as writer:
            writer.ddl("CREATE NAMESPACE legacy")
            writer.ddl(
                f"CREATE TABLE {table} (id BIGINT) LOCATION '{outside}' "
                f"TBLPROPERTIES ('gc.ttl' = '{int(GC_TTL_S)}s')"
            )
            add = [{"path": victim.name, "size_bytes": 9, "row_count": 1}]
            writer.commit(
                f"legacy-{uuid.uuid4().hex[:8]}",
                [{"table": table, "schema_version": 1, "add": add}],
            )
        c.terminate(1)
        text = c.config.read_text()
        c.config.write_text(text.replace('allowed_locations = ["*"]\n', ""))
        c.start(1)
        c.wait_ready()
        with _client(c, "writer") as writer, _client(c, "admin") as admin:
            assert [f["path"] for f in writer.files(table)["files"]] == [victim.name]
            writer.ddl(f"DROP TABLE {table}")
            time.sleep(GC_TTL_S * 1.5)  # past the dropped incarnation's TTL (no event to await)
            run = admin.gc_run(table)
            (report,) = run["tables"]
            assert report["skipped"] == SKIPPED_NOT_ALLOWED, run
            assert report["files_deleted"] == 0 and report["threshold"] == 0, run
            assert str(outside) in run["orphan_locations_skipped"], run
        shown = run_cli(
            "--endpoints", f"127.0.0.1:{c.client_ports[1]}", "--token", c.token("admin"),
            "gc", "run", table,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert f"{table} left alone: {SKIPPED_NOT_ALLOWED}" in shown.stdout, shown.stdout
        assert victim.read_bytes() == b"user data", "the GC deleted outside the allowed roots"
        log = (c.dir / "data" / "node-1" / NODE_LOG_FILE_NAME).read_text()
        assert "outside allowed_locations" in log, "the skip is logged"


def test_a_ddl_sent_to_a_follower_is_refused_by_the_leader(tmp_path: Path) -> None:
    """A follower forwards the parsed CreateTable (`_propose`); the leader checks it with its
    own config, and the refusal reaches the client whole (code, reason, roots)."""
    with metastore_cluster(tmp_path, 3, dd_ms=300, cs_max_ms=100) as c:
        c.start_all()
        leader = c.wait_ready()
        follower = next(i for i in c.ids if i != leader)
        with SyncMetastoreClient(
            [f"127.0.0.1:{c.client_ports[follower]}"], c.token("writer"), client_name="via"
        ) as writer:
            writer.ddl("CREATE NAMESPACE fwd")
            with pytest.raises(MetastoreError) as caught:
                writer.ddl(f"CREATE TABLE fwd.t (id BIGINT) LOCATION '{tmp_path}/elsewhere'")
            assert caught.value.code == "INVALID_ARGUMENT", caught.value
            assert caught.value.details["reason"] == "location_not_allowed"
            assert caught.value.details["allowed_locations"] == [str(tmp_path / "warehouse")]
            writer.ddl(f"CREATE TABLE fwd.t (id BIGINT) LOCATION '{tmp_path}/warehouse/x/t'")
