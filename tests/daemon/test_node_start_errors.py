"""A node whose data directory cannot hold its files, or whose config is missing, says so in one
`Error: CODE: message` line and exits 2, also when started as `python -m metastore.daemon`.

Before: a data directory path taken by a file, or a log/audit file that could not be opened,
escaped as an OSError traceback (exit 1), and `python -m metastore.daemon` printed a config
error without its code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore.daemon.__main__ import main as daemon_main
from metastore.daemon.config import load_node_config
from tests.daemon.harness import write_cluster
from tests.daemon.test_node_startup import assert_one_line_error, run_daemon


def test_a_data_directory_path_taken_by_a_file_is_one_error_line(tmp_path: Path) -> None:
    config = write_cluster(tmp_path, n=1)
    data_dir = load_node_config(config, 1).data_dir
    data_dir.parent.mkdir(parents=True)
    data_dir.write_text("not a directory\n")
    done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "data_dir_unusable")
    assert str(data_dir) in done.stderr
    assert data_dir.read_text() == "not a directory\n"  # changed nothing


def test_an_audit_log_that_cannot_be_opened_is_one_error_line(tmp_path: Path) -> None:
    config = write_cluster(tmp_path, n=1)
    audit = load_node_config(config, 1).data_dir / "audit.log"
    audit.mkdir(parents=True)  # a directory where the node's audit file goes
    done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "data_dir_unusable")
    assert str(audit) in done.stderr


def test_python_m_daemon_names_the_config_error_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "cluster.toml"
    assert daemon_main(["--config", str(missing), "--node-id", "1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"Error: CONFIG_INVALID: {missing}: file not found"]
