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


def test_restore_says_which_locations_the_new_cluster_does_not_allow(tmp_path: Path) -> None:
    """A restore into a cluster made by `cluster init` (its own warehouse, allowed_locations
    `[]`) keeps tables outside its roots: its GC would leave them alone, silently but for a
    log line. The restore says so, and what to put in which cluster.toml before `cluster up`."""
    file, source = _snapshot_file(
        tmp_path / "backup.snap",
        "CREATE NAMESPACE sales",
        "CREATE TABLE sales.orders (id BIGINT) LOCATION '/w/sales.db/orders'",
    )
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg"))
    result = backup.restore(file, cluster)
    assert result["locations_not_allowed"] == [_location(source, "sales.orders")]
    warning = result["warning"]
    assert "allowed_locations" in warning and str(cluster.path) in warning
    assert "cluster up" in warning and "left alone" in warning


def test_restore_into_a_cluster_that_allows_the_locations_does_not_warn_of_them(
    tmp_path: Path,
) -> None:
    file, _ = _snapshot_file(
        tmp_path / "backup.snap",
        "CREATE NAMESPACE sales",
        "CREATE TABLE sales.orders (id BIGINT) LOCATION '/w/sales.db/orders'",
    )
    cluster = load_cluster_config(write_cluster(tmp_path / "cfg", allowed_locations='["/w"]'))
    result = backup.restore(file, cluster)
    assert result["locations_not_allowed"] == []
    assert "allowed_locations" not in result["warning"]
