"""A restored catalog's tables keep the locations they had: the new cluster reads, writes and
garbage-collects the very files of the cluster the snapshot came from. Restore says so (the
locations, and that only one of the two clusters may run on them), because each cluster's GC
deletes what the other still references: files it freed, and files committed only in the
other (orphans to it). Real files, no processes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from click.testing import CliRunner

from cli.main import cli
from metastore.daemon import backup
from metastore.daemon.config import load_cluster_config
from tests.daemon.harness import write_cluster
from tests.metastore._driver import Driver


def _snapshot_file(path: Path, *statements: str) -> tuple[Path, Driver]:
    d = Driver()
    for sql in statements:
        d.ok(sql)
    data = d.state.to_snapshot()
    header = {"size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with path.open("wb") as out:
        backup.write_file(out, header, data)
    return path, d


def _location(d: Driver, table: str) -> str:
    location: str = d.state.describe(table).location
    return location


def test_restore_names_the_table_locations_it_shares_with_the_source(tmp_path: Path) -> None:
    file, source = _snapshot_file(
        tmp_path / "backup.snap",
        "CREATE NAMESPACE sales",
        "CREATE TABLE sales.orders (id BIGINT) LOCATION '/w/sales.db/orders'",
        "CREATE TABLE sales.items (id BIGINT) LOCATION '/w/sales.db/items'",
    )
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    result = backup.restore(file, cluster)
    locations = sorted({_location(source, "sales.orders"), _location(source, "sales.items")})
    assert result["table_locations"] == locations
    warning = result["warning"]
    assert "2 table(s)" in warning and locations[0] in warning
    assert "GC" in warning and "only one" in warning


def test_restore_of_a_catalog_without_tables_has_nothing_to_say(tmp_path: Path) -> None:
    file, _ = _snapshot_file(tmp_path / "backup.snap", "CREATE NAMESPACE kept")
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    result = backup.restore(file, cluster)
    assert result["table_locations"] == []
    assert "warning" not in result


def test_the_cli_prints_the_warning_on_stderr_after_the_restore_line(tmp_path: Path) -> None:
    file, source = _snapshot_file(
        tmp_path / "backup.snap",
        "CREATE NAMESPACE sales",
        "CREATE TABLE sales.orders (id INT) LOCATION '/w/sales.db/orders'",
    )
    config_dir = write_cluster(tmp_path / "cfg").parent
    result = CliRunner().invoke(
        cli, ["snapshot", "restore", str(file), "--config", str(config_dir)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"restored {file}")
    assert result.stderr.startswith("warning: 1 table(s) of the restored catalog")
    assert _location(source, "sales.orders") in result.stderr
