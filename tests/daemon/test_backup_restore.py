"""Backup and restore: `metastore snapshot save` takes the catalog from one node of a running
cluster (consistent at one applied index, checksummed), and `metastore snapshot restore` seeds a
NEW 3-node cluster from it; every node of the new cluster then gives the same answers as the old
cluster for schemas, histories and files at sampled timestamps. A damaged file, or a cluster
whose data directories are not empty, is refused and changes nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from metastore.client import SyncMetastoreClient
from tests.daemon.harness import MetastoreCluster, metastore_cluster, write_cluster

pytestmark = pytest.mark.slow

TABLES = ("bk.a", "bk.b")


def _client(c: MetastoreCluster, nodes: list[int] | None = None) -> SyncMetastoreClient:
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in (nodes or c.ids)]
    return SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=20_000)


def _cli(c: MetastoreCluster, *args: str) -> Result:
    endpoints = ",".join(f"127.0.0.1:{c.client_ports[i]}" for i in c.ids)
    return CliRunner().invoke(
        cli, ["--endpoints", endpoints, "--token", c.token("admin"), "-o", "json", *args]
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("backup-src")) as c:
        c.start_all()
        c.wait_ready()
        client = _client(c)
        client.ddl("CREATE NAMESPACE bk")
        for t in TABLES:
            client.ddl(f"CREATE TABLE {t} (id BIGINT)")
        for n in range(6):
            writes = [
                {
                    "table": t,
                    "schema_version": 1 if n < 3 else 2,
                    "add": [
                        {"path": f"_txn/{n}/{t}.parquet", "size_bytes": 10 + n, "row_count": n}
                    ],
                    "overwrite": n == 4,
                }
                for t in TABLES
            ]
            client.commit(f"bk-{n}", writes)
            if n == 2:
                for t in TABLES:
                    client.ddl(f"ALTER TABLE {t} ADD COLUMN c{n} STRING")
        client.close()
        yield c


def _answers(client: SyncMetastoreClient, stamps: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in TABLES:
        out[f"history {t}"] = [
            (v["version"], v["tu"], v["schema"]["ddl"]) for v in client.history(t)["versions"]
        ]
        for ts in stamps:
            schema = client.schema_at(t, ts)
            out[f"schema {t}@{ts}"] = (schema["version"], schema["schema"]["ddl"])
            out[f"files {t}@{ts}"] = sorted(
                (f["path"], f["added_ts"]) for f in client.files(t, as_of=ts)["files"]
            )
    return out


def test_a_saved_snapshot_restores_into_a_new_cluster_with_identical_answers(
    source: MetastoreCluster, tmp_path: Path
) -> None:
    client = _client(source)
    try:
        stamps = [r["ts"] for r in client.txn_log(100)["commits"]]
        expected = _answers(client, stamps)
    finally:
        client.close()
    file = tmp_path / "catalog.snap"
    saved = _cli(source, "snapshot", "save", str(file))
    assert saved.exit_code == 0, saved.output
    header = json.loads(saved.stdout)
    assert header["size_bytes"] > 0 and len(header["sha256"]) == 64

    target_config = write_cluster(tmp_path / "target", 3, cluster_id="restored")
    restored = CliRunner().invoke(
        cli, ["-o", "json", "snapshot", "restore", str(file), "--config", str(target_config.parent)]
    )
    assert restored.exit_code == 0, restored.output
    again = CliRunner().invoke(
        cli, ["snapshot", "restore", str(file), "--config", str(target_config.parent)]
    )
    assert again.exit_code != 0 and "not empty" in again.output

    target = MetastoreCluster(target_config)
    try:
        target.start_all()
        target.wait_ready()
        for node in target.ids:
            per_node = _client(target, [node])
            try:
                assert _answers(per_node, stamps) == expected, node
            finally:
                per_node.close()
        # The restored cluster takes new commits after the old ones.
        writer = _client(target)
        try:
            r = writer.commit(
                "after-restore",
                [
                    {
                        "table": TABLES[0],
                        "schema_version": 2,
                        "add": [{"path": "_txn/new/x.parquet", "size_bytes": 1, "row_count": 1}],
                    }
                ],
            )
            assert r["ts"] > max(stamps)
        finally:
            writer.close()
    finally:
        target.stop_all()


def test_a_damaged_snapshot_file_is_refused(source: MetastoreCluster, tmp_path: Path) -> None:
    file = tmp_path / "catalog.snap"
    assert _cli(source, "snapshot", "save", str(file)).exit_code == 0
    data = bytearray(file.read_bytes())
    data[-10] ^= 0xFF
    file.write_bytes(bytes(data))
    config = write_cluster(tmp_path / "target", 3)
    out = CliRunner().invoke(
        cli, ["snapshot", "restore", str(file), "--config", str(config.parent)]
    )
    assert out.exit_code != 0 and "checksum" in out.output
    assert not (config.parent / "data").exists()


def test_a_failed_save_leaves_no_file_behind(
    source: MetastoreCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metastore.daemon import backup
    from metastore.errors import MalformedSnapshotError

    def damaged(path: Path) -> None:
        raise MalformedSnapshotError(f"{path}: checksum mismatch")

    monkeypatch.setattr(backup, "read_file", damaged)
    file = tmp_path / "catalog.snap"
    out = _cli(source, "snapshot", "save", str(file))
    assert out.exit_code != 0 and "checksum" in out.output
    assert list(tmp_path.iterdir()) == []  # neither the file nor its .partial


def test_a_saved_snapshot_is_readable_by_its_owner_only(
    source: MetastoreCluster, tmp_path: Path
) -> None:
    """The export is admin-only (every table, location, session, lease and protection), and a
    node keeps that state in a 0700 directory; the saved file was 0644 under the usual umask,
    so any local user could read the whole catalog from it."""
    file = tmp_path / "catalog.snap"
    old = os.umask(0o022)
    try:
        assert _cli(source, "snapshot", "save", str(file)).exit_code == 0
    finally:
        os.umask(old)
    assert file.stat().st_mode & 0o077 == 0
