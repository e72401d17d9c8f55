"""The TLS setup the README and `cluster init`'s comments describe, done only with the CLI:
init, `cluster certs`, uncomment [tls], `cluster up` (which trusts the file's ca_file by itself),
commands with --cacert, and what happens without it. init, up and down run as subprocesses, the
other commands in this process (`RealCluster.call`). Nodes are stopped with `cluster down` and,
failing that, by the PIDs in their pid files."""

from __future__ import annotations

import pytest

from tests.cli.real_cluster import LIFECYCLE_TIMEOUT_S, RealCluster, free_base_port

pytestmark = pytest.mark.slow

TLS_KEYS = ("[tls]", "ca_file", "cert_file", "key_file", "peers", "clients", "client_cert_required")


def uncomment_tls(text: str) -> str:
    """Uncomment the [tls] block `cluster init` writes, as its comment tells the user to."""
    out = []
    for line in text.splitlines():
        bare = line.removeprefix("# ")
        out.append(bare if line.startswith("# ") and bare.startswith(TLS_KEYS) else line)
    return "\n".join(out) + "\n"


def test_init_certs_up_and_use_a_tls_cluster_from_the_cli(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base_port = free_base_port()
    cluster = RealCluster(
        config_dir=tmp_path_factory.mktemp("tls-real") / "cluster",
        base_port=base_port,
        cluster_id="clitls",
    )
    config_dir = cluster.config_dir
    init = cluster.run(
        "cluster", "init", str(config_dir), "--cluster-id", "clitls", "--base-port", str(base_port)
    )
    assert init.returncode == 0, init.describe()
    certs = cluster.call("cluster", "certs", "--out", str(config_dir / "tls"), "--nodes", "3")
    assert certs.returncode == 0, certs.describe()
    toml = config_dir / "cluster.toml"
    toml.write_text(uncomment_tls(toml.read_text()))
    assert cluster.config().tls is not None
    assert "tls/" in (config_dir / ".gitignore").read_text()
    try:
        up = cluster.run(
            "cluster", "up", "--config", str(config_dir), timeout_s=LIFECYCLE_TIMEOUT_S
        )
        assert up.returncode == 0, up.describe()
        ca = str(config_dir / "tls" / "ca.crt")
        status = cluster.ok_json("--cacert", ca, "cluster", "status")
        assert {r["result"]["node_id"] for r in status if r["ok"]} == {1, 2, 3}
        made = cluster.call("--cacert", ca, "sql", "CREATE NAMESPACE over_tls")
        assert made.returncode == 0, made.describe()
        plain = cluster.call("ns", "list")
        assert plain.returncode == 6, plain.describe()
        assert plain.stderr.startswith("Error: TLS_REQUIRED: "), plain.describe()
    finally:
        down = ("cluster", "down", "--config", str(config_dir), "--grace-ms", "3000")
        cluster.run(*down, timeout_s=LIFECYCLE_TIMEOUT_S)
        cluster.kill_leftovers()
