"""The `[tls]` table of cluster.toml, `metastore cluster certs`, and a daemon that refuses to
start on bad TLS files with one line naming the file."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from metastore.daemon.certs import generate_dev_certs
from metastore.daemon.config import (
    ConfigError,
    load_cluster_config,
    load_node_config,
    node_layout,
    render_cluster_toml,
)
from raft.tls import TlsFiles, check_node_files
from tests.cli.test_config import base_doc, to_toml
from tests.daemon.harness import REPO, write_cluster

DAEMON_TIMEOUT_S = 60.0

TLS = """
[tls]
ca_file = "tls/ca.crt"
cert_file = "tls/node-{node_id}.crt"
key_file = "tls/node-{node_id}.key"
"""


def write_with_tls(tmp_path: Path, tls: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(to_toml(base_doc()) + tls)
    return path


def test_tls_is_off_by_default_and_per_node_paths_resolve(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert load_cluster_config(write_with_tls(plain, "")).tls is None
    cfg = load_cluster_config(write_with_tls(tmp_path, TLS))
    assert cfg.tls is not None
    assert (cfg.tls.peers, cfg.tls.clients, cfg.tls.client_cert_required) == (True, True, False)
    assert cfg.tls.node_files(2) == TlsFiles(
        ca_file=tmp_path / "tls/ca.crt",
        cert_file=tmp_path / "tls/node-2.crt",
        key_file=tmp_path / "tls/node-2.key",
    )
    settings = load_node_config(tmp_path / "cluster.toml", 3)
    assert settings.peer_tls == settings.client_tls == cfg.tls.node_files(3)


def test_peers_only_leaves_the_client_port_plaintext(tmp_path: Path) -> None:
    cfg = load_node_config(write_with_tls(tmp_path, TLS + "clients = false\n"), 1)
    assert cfg.peer_tls is not None
    assert cfg.client_tls is None


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        ("peers = false\nclients = false\n", "tls.peers", "both false"),
        ("clients = false\nclient_cert_required = true\n", "tls.client_cert_required", "needs"),
        ("peers = 1\n", "tls.peers", "must be true or false"),
        ("ca = 'x'\n", "tls.ca", "unknown key"),
    ],
)
def test_bad_tls_tables_name_the_key(tmp_path: Path, extra: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_cluster_config(write_with_tls(tmp_path, TLS + extra))
    assert info.value.key == key
    assert problem in info.value.problem


def test_only_the_node_id_placeholder_is_allowed(tmp_path: Path) -> None:
    tls = TLS.replace("node-{node_id}.key", "node-{id}.key")
    with pytest.raises(ConfigError, match=r"tls.key_file: .*the only placeholder"):
        load_cluster_config(write_with_tls(tmp_path, tls))


def test_rendered_config_documents_tls_and_loads_without_it(tmp_path: Path) -> None:
    text = render_cluster_toml(
        cluster_id="c", nodes=node_layout(3, host="127.0.0.1", base_port=25_000)
    )
    assert "# [tls]" in text
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    assert load_cluster_config(path).tls is None
    # Uncommented as the comment says, it loads with TLS on.
    path.write_text(
        text.replace("# [tls]", "[tls]")
        .replace("# ca_file", "ca_file")
        .replace("# cert_file", "cert_file")
        .replace("# key_file", "key_file")
    )
    assert load_cluster_config(path).tls is not None


def test_production_example_has_tls_on() -> None:
    cfg = load_cluster_config(REPO / "cluster_configs/production-example/cluster.toml")
    assert cfg.tls is not None
    assert cfg.tls.peers and cfg.tls.clients
    assert load_cluster_config(REPO / "cluster_configs/local/cluster.toml").tls is None


def test_cluster_certs_writes_a_ca_and_node_certificates_once(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    runner = CliRunner()
    result = runner.invoke(
        cli, ["-o", "json", "cluster", "certs", "--out", str(out), "--nodes", "2"]
    )
    assert result.exit_code == 0, result.output
    for n in (1, 2):
        check_node_files(
            TlsFiles(
                ca_file=out / "ca.crt",
                cert_file=out / f"node-{n}.crt",
                key_file=out / f"node-{n}.key",
            )
        )
    for key in ("ca.key", "node-1.key", "node-2.key", "client.key"):
        assert (out / key).stat().st_mode & 0o077 == 0, key
    again = runner.invoke(cli, ["cluster", "certs", "--out", str(out), "--nodes", "2"])
    assert again.exit_code == 5
    assert "refusing to overwrite" in again.output


def test_cluster_certs_reissues_a_node_certificate_with_the_same_ca(tmp_path: Path) -> None:
    """Rotation: a new certificate (another fingerprint) for node 2, signed by the existing CA."""
    out = tmp_path / "tls"
    runner = CliRunner()
    assert (
        runner.invoke(cli, ["cluster", "certs", "--out", str(out), "--nodes", "2"]).exit_code == 0
    )
    new = tmp_path / "new-2"
    args = ["-o", "json", "cluster", "certs", "--ca-dir", str(out), "--node", "2", "--out"]
    result = runner.invoke(cli, [*args, str(new)])
    assert result.exit_code == 0, result.output
    files = TlsFiles(
        ca_file=out / "ca.crt", cert_file=new / "node-2.crt", key_file=new / "node-2.key"
    )
    check_node_files(files)
    assert (new / "node-2.crt").read_bytes() != (out / "node-2.crt").read_bytes()
    assert (new / "node-2.key").stat().st_mode & 0o077 == 0
    assert not (new / "ca.key").exists()  # the CA key stays where it was
    again = runner.invoke(cli, [*args, str(new)])
    assert again.exit_code == 5 and "refusing to overwrite" in again.output
    no_ca = runner.invoke(
        cli,
        [
            "cluster",
            "certs",
            "--ca-dir",
            str(tmp_path),
            "--node",
            "2",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert no_ca.exit_code == 5 and "cannot use the CA" in no_ca.output
    lonely = runner.invoke(cli, ["cluster", "certs", "--node", "2", "--out", str(tmp_path / "y")])
    assert lonely.exit_code == 2


@pytest.mark.parametrize("problem", ["missing key", "other CA", "key of another node"])
def test_bad_tls_files_stop_the_daemon_with_one_line(tmp_path: Path, problem: str) -> None:
    certs = generate_dev_certs(tmp_path / "ca", node_ids=[1, 2])
    other = generate_dev_certs(tmp_path / "other", node_ids=[1])
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    (tls_dir / "ca.crt").write_bytes(certs.ca_cert.read_bytes())
    cert, key = certs.node_certs[1]
    if problem == "other CA":
        cert, key = other.node_certs[1]
    if problem == "key of another node":
        key = certs.node_certs[2][1]
    (tls_dir / "node-1.crt").write_bytes(cert.read_bytes())
    if problem != "missing key":
        (tls_dir / "node-1.key").write_bytes(key.read_bytes())
    config = write_cluster(tmp_path / "c", 1)
    with config.open("a") as f:
        f.write(TLS.replace('"tls/', f'"{tls_dir}/'))
    done = subprocess.run(
        [sys.executable, "-m", "metastore.daemon", "--config", str(config), "--node-id", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=DAEMON_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: TLS_CONFIG_INVALID: "), done.stderr
    expected = {
        "missing key": "node-1.key: file not found",
        "other CA": "is not signed by the CA in",
        "key of another node": "does not match certificate",
    }[problem]
    assert expected in line, line


def test_client_tls_options_come_from_flags_then_the_cluster_file(tmp_path: Path) -> None:
    from cli.context import App
    from raft.tls import ClientTls
    from spark_bridge.bridge import tls_from_env

    cfg = load_cluster_config(write_with_tls(tmp_path, TLS))
    plain = App(endpoints_option=None, token=None, token_file=None, output="json", timeout_ms=1)
    assert plain.client_tls() is None
    assert plain.client_tls(cfg) == ClientTls(ca_file=tmp_path / "tls/ca.crt")
    flagged = App(
        endpoints_option=None,
        token=None,
        token_file=None,
        output="json",
        timeout_ms=1,
        cacert=Path("/ca.pem"),
    )
    assert flagged.client_tls(cfg) == ClientTls(ca_file=Path("/ca.pem"))
    system = App(
        endpoints_option=None, token=None, token_file=None, output="json", timeout_ms=1, tls=True
    )
    assert system.client_tls() == ClientTls()
    # The Spark bridge reads the CLI's variables.
    assert tls_from_env({}) is None
    assert tls_from_env({"METASTORE_CACERT": "/ca.pem", "METASTORE_TLS_SERVER_NAME": "n"}) == (
        ClientTls(ca_file=Path("/ca.pem"), server_name="n")
    )
    assert tls_from_env({"METASTORE_TLS": "1"}) == ClientTls()


def test_cli_certs_defaults_mirror_the_generator() -> None:
    from cli import cluster as cli_cluster
    from metastore.daemon import certs

    assert cli_cluster.CERTS_DEFAULT_HOSTS == certs.DEFAULT_HOSTS
    assert cli_cluster.CERTS_DEFAULT_VALID_DAYS == certs.DEFAULT_VALID_DAYS
    assert cli_cluster.CERTS_VALID_DAYS_MAX == certs.VALID_DAYS_MAX


def test_cluster_init_with_tls_makes_a_ca_and_enables_tls_once(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    runner = CliRunner()
    args = ["-o", "json", "cluster", "init", str(directory), "--tls", "--base-port", "25500"]
    first = runner.invoke(cli, args)
    assert first.exit_code == 0, first.output
    cfg = load_cluster_config(directory / "cluster.toml")
    assert cfg.tls is not None
    assert cfg.tls.ca_file == directory / "tls" / "ca.crt"
    for node_id in cfg.node_ids:
        check_node_files(cfg.tls.node_files(node_id))
    ca_bytes = cfg.tls.ca_file.read_bytes()
    # --force rewrites the files but keeps the CA, like the secrets: running nodes' certificates
    # stay valid.
    again = runner.invoke(cli, [*args, "--force"])
    assert again.exit_code == 0, again.output
    assert cfg.tls.ca_file.read_bytes() == ca_bytes


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604])
def test_a_node_key_others_may_read_is_warned_about_naming_the_chmod(
    tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Secrets files group/other may read are refused (metastore.daemon.secrets); a TLS private
    key is one too. It is warned about rather than refused: keys are often handed over by
    tooling with its own modes, and the node stays usable while the operator fixes it."""
    certs = generate_dev_certs(tmp_path / "tls", node_ids=[1])
    cert, key = certs.node_certs[1]
    files = TlsFiles(ca_file=certs.ca_cert, cert_file=cert, key_file=key)
    with caplog.at_level(logging.WARNING, logger="raft.tls"):
        check_node_files(files)
    assert not [r for r in caplog.records if r.name == "raft.tls"], "0600 is fine"
    key.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="raft.tls"):
        check_node_files(files)
    warned = [r.getMessage() for r in caplog.records if r.name == "raft.tls"]
    assert len(warned) == 1, warned
    assert str(key) in warned[0]
    assert f"{mode:04o}" in warned[0]
    assert f"chmod 600 {key}" in warned[0]
