"""The `metastore` CLI through click's CliRunner: cluster init, output formats, the requests each
command sends (to a fake node on a real socket), error lines and exit codes, defaults and
environment variables, and the local process lifecycle (pid files, SIGINT, SIGKILL)."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import click
import pytest
from click.testing import CliRunner, Result

from cli import processes
from cli.errors import EXIT_CODE_BY_ERROR, exit_code_for
from cli.main import cli
from cli.waiting import parse_wait_ms
from hlc import SystemClock, make_ts, parse_ts
from metastore.daemon.config import (
    NodeAddress,
    load_cluster_config,
    render_cluster_toml,
)
from metastore.daemon.secrets import Role, ensure_secrets, read_token_file
from metastore.errors import (
    ErrorCode,
    ForbiddenError,
    InternalError,
    InvalidDdlError,
    MetastoreError,
    NotReadyError,
    TableNotFoundError,
    UnknownError,
)
from tests.client.fake_node import TOKEN, ThreadedFakeNode
from tests.client.test_client import dead_endpoint

REPO = Path(__file__).resolve().parents[2]

DESCRIBE = {
    "table": "sales.orders",
    "version": 2,
    "tm": make_ts(1_790_000_000_000),
    "tu": make_ts(1_790_000_000_500),
    "schema": {
        "columns": [
            {
                "field_id": 1,
                "name": "id",
                "type": "BIGINT",
                "nullable": False,
                "comment": "pk",
                "default": None,
            },
            {
                "field_id": 2,
                "name": "amount",
                "type": "DECIMAL(10,2)",
                "nullable": True,
                "comment": None,
                "default": None,
            },
        ],
        "ddl": "`id` BIGINT NOT NULL COMMENT 'pk', `amount` DECIMAL(10,2)",
    },
    "properties": {},
    "comment": None,
    "created_tm": make_ts(1_790_000_000_000),
    "dropped_tm": None,
    "versions": 2,
}

RESULTS: dict[str, dict[str, Any]] = {
    "describe": DESCRIBE,
    "history": {
        "versions": [
            {
                "version": 1,
                "tm": 1,
                "tu": 2,
                "change": "CREATE TABLE",
                "schema": {"columns": [], "ddl": "`id` BIGINT"},
            },
            {
                "version": 2,
                "tm": 3,
                "tu": 4,
                "change": "ADD COLUMN amount",
                "schema": {"columns": [], "ddl": "`id` BIGINT, `amount` DECIMAL(10,2)"},
            },
        ]
    },
    "list_tables": {"tables": ["sales.orders", "sales.refunds"]},
    "list_namespaces": {"namespaces": [{"name": "sales", "comment": "money", "properties": {}}]},
    "ddl": {
        "statement": "AlterTable",
        "table": "sales.orders",
        "version": 3,
        "tm": 5,
        "tu": 6,
        "waited_ms": 1000.25,
        "deduplicated": False,
    },
    "status": {
        "node_id": 1,
        "role": "leader",
        "term": 4,
        "leader": 1,
        "commit_index": 10,
        "applied_index": 10,
        "safe_time": make_ts(1_790_000_000_000),
        "lag_ms": 12,
        "ready": True,
    },
    "safe_time": {
        "node_id": 1,
        "safe_time": make_ts(1_790_000_000_000),
        "now": 0,
        "lag_ms": 3,
        "ready": True,
    },
    "add_node": {"index": 42},
    "remove_node": {"index": 43},
    "promote_node": {"index": 44},
    "transfer_leader": {"leader": 2},
    "apply_version": {
        "apply_version": 1,
        "members": [{"node_id": 1, "supported": 1, "error": ""}],
        "finalizable": 1,
    },
    "apply_version_finalize": {
        "apply_version": 2,
        "previous": 1,
        "changed": True,
        "members": [{"node_id": 1, "supported": 2, "error": ""}],
    },
}


async def canned(op: str, args: dict[str, Any]) -> dict[str, Any]:
    return RESULTS[op]


@pytest.fixture
def fake() -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=canned) as node:
        yield node


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No test may pick up the repository's local cluster defaults by accident.
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("METASTORE_"):
            monkeypatch.delenv(name)


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(cli, list(args), env=env, prog_name="metastore")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def against(node: ThreadedFakeNode, *args: str) -> Result:
    return run("--endpoints", node.endpoint, "--token", TOKEN, *args)


def sent(node: ThreadedFakeNode) -> list[tuple[str, dict[str, Any]]]:
    return [(op, a) for _, op, a in node.node.requests]


# ---- cluster init ----------------------------------------------------------------------------


def test_init_writes_a_loadable_cluster_and_private_secrets(tmp_path: Path) -> None:
    d = tmp_path / "ms"
    result = run(
        "-o", "json", "cluster", "init", str(d), "--base-port", "26100", "--cluster-id", "t1"
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["cluster_id"] == "t1"
    assert doc["endpoints"] == ["127.0.0.1:26201", "127.0.0.1:26202", "127.0.0.1:26203"]
    cfg = load_cluster_config(d / "cluster.toml")
    assert [n.raft_port for n in cfg.nodes] == [26101, 26102, 26103]
    for i in (1, 2, 3):
        assert (d / f"node{i}.toml").exists()
    assert stat.S_IMODE((d / "secrets").stat().st_mode) == 0o700
    for p in (d / "secrets").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert doc["token_files"]["admin"] == str(d / "secrets" / "admin.token")
    assert "secrets/" in (d / ".gitignore").read_text()


def test_init_table_output(tmp_path: Path) -> None:
    result = run("cluster", "init", str(tmp_path / "x"), "--nodes", "1", "--host", "10.1.2.3")
    assert result.exit_code == 0
    assert "10.1.2.3:24201" in result.stdout
    assert "NODE" in result.stdout and "\x1b[" not in result.stdout  # no colour off a TTY


def test_init_refuses_to_overwrite_without_force_and_keeps_secrets(tmp_path: Path) -> None:
    d = tmp_path / "ms"
    assert run("cluster", "init", str(d)).exit_code == 0
    before = (d / "cluster.toml").read_text()
    token = read_token_file(d / "secrets" / "admin.token")
    again = run("cluster", "init", str(d), "--base-port", "27000")
    assert again.exit_code == 5
    assert again.stderr.startswith("Error: ALREADY_EXISTS: ")
    assert (d / "cluster.toml").read_text() == before
    forced = run("cluster", "init", str(d), "--base-port", "27000", "--force")
    assert forced.exit_code == 0
    assert load_cluster_config(d / "cluster.toml").nodes[0].raft_port == 27001
    assert read_token_file(d / "secrets" / "admin.token") == token


def test_init_force_to_grow_keeps_the_clusters_id_ports_host_and_tls(tmp_path: Path) -> None:
    """The README grows a cluster with `cluster init DIR --nodes 4 --force`. That rewrote the
    running members' files with the default ports (24100+N), the directory's name as cluster
    id and TLS off whenever the first init had other ones: the members would restart on other
    ports, as another cluster. Options not given now keep the existing cluster.toml's."""
    d = tmp_path / "ms"
    first = ("--base-port", "27000", "--cluster-id", "prod", "--host", "127.0.0.2", "--tls")
    assert run("cluster", "init", str(d), *first).exit_code == 0
    grown = run("-o", "json", "cluster", "init", str(d), "--nodes", "4", "--force")
    assert grown.exit_code == 0, grown.stderr
    config = load_cluster_config(d / "cluster.toml")
    assert config.cluster_id == "prod" and config.tls is not None
    assert [(n.id, n.host, n.raft_port) for n in config.nodes] == [
        (i, "127.0.0.2", 27000 + i) for i in (1, 2, 3, 4)
    ]
    assert json.loads(grown.stdout)["kept"] == {
        "cluster_id": "prod",
        "host": "127.0.0.2",
        "base_port": 27000,
        "tls": True,
    }
    # An option given wins over the existing file.
    moved = run("cluster", "init", str(d), "--nodes", "4", "--base-port", "28000", "--force")
    assert moved.exit_code == 0, moved.stderr
    config = load_cluster_config(d / "cluster.toml")
    assert config.nodes[0].raft_port == 28001 and config.cluster_id == "prod"


def test_init_default_cluster_id_comes_from_the_directory(tmp_path: Path) -> None:
    d = tmp_path / "my cluster!"
    assert run("cluster", "init", str(d)).exit_code == 0
    assert load_cluster_config(d / "cluster.toml").cluster_id == "my-cluster"


@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "8"],
        ["--nodes", "0"],
        ["--base-port", "65500"],
        # 0 does not mean "any free port": it would put node 1 on port 1. Ports below 1024
        # need root and belong to well-known services.
        ["--base-port", "0"],
        ["--base-port", "1023"],
        ["--cluster-id", "a b"],
        ["--cluster-id", "tab\there"],
        ["--host", "bad host"],
    ],
)
def test_init_usage_errors(tmp_path: Path, args: list[str]) -> None:
    result = run("cluster", "init", str(tmp_path / "x"), *args)
    assert result.exit_code == 2, result.output
    # Refused: nothing is left behind (not even the directory), and the error names the
    # option, not the staged file it was checked in (which no longer exists).
    assert not (tmp_path / "x").exists()
    assert ".tmp" not in result.stderr


# ---- queries and their output ----------------------------------------------------------------


def test_describe_json_is_the_result_map(fake: ThreadedFakeNode) -> None:
    result = against(fake, "-o", "json", "table", "describe", "sales.orders")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == DESCRIBE
    assert sent(fake) == [("describe", {"table": "sales.orders"})]


def test_describe_table_shows_schema_and_iso_times(fake: ThreadedFakeNode) -> None:
    result = against(fake, "table", "describe", "sales.orders")
    assert result.exit_code == 0
    out = result.stdout
    for text in ("DECIMAL(10,2)", "amount", "COLUMN", "NULLABLE", "2026-09-21T", "schema ddl"):
        assert text in out, text


def test_as_of_accepts_every_timestamp_form(fake: ThreadedFakeNode) -> None:
    before = SystemClock().now_ms()
    assert against(fake, "table", "describe", "a.b", "--as-of", "-5m").exit_code == 0
    assert (
        against(fake, "table", "describe", "a.b", "--as-of", "2026-11-22T10:00:00Z").exit_code == 0
    )
    assert against(fake, "table", "list", "a", "--as-of", "12345").exit_code == 0
    assert against(fake, "ns", "list", "--as-of", "-5m").exit_code == 0
    assert against(fake, "-o", "json", "ns", "list", "--as-of", "now").exit_code == 0
    (_, first), (_, second), (_, third), (op4, fourth), (op5, fifth) = sent(fake)
    assert before - 300_000 - 1000 <= first["as_of"] >> 16 <= SystemClock().now_ms() - 300_000
    assert second["as_of"] == parse_ts("2026-11-22T10:00:00Z", now_ms=0)
    assert third == {"namespace": "a", "as_of": 12345, "limit": 5000}
    assert op4 == op5 == "list_namespaces"
    assert before - 300_000 - 1000 <= fourth["as_of"] >> 16 <= SystemClock().now_ms() - 300_000
    assert before <= fifth["as_of"] >> 16 <= SystemClock().now_ms()


def test_bad_as_of_is_a_usage_error(fake: ThreadedFakeNode) -> None:
    result = against(fake, "table", "describe", "a.b", "--as-of", "yesterday-ish")
    assert result.exit_code == 2
    assert "Accepted:" in result.stderr
    assert sent(fake) == []


def test_version_to_without_finalize_is_a_usage_error(fake: ThreadedFakeNode) -> None:
    result = against(fake, "cluster", "version", "--to", "2")
    assert result.exit_code == 2
    assert "--to needs --finalize" in result.stderr
    assert sent(fake) == []


def test_every_command_sends_its_op(fake: ThreadedFakeNode) -> None:
    cases: list[tuple[list[str], tuple[str, dict[str, Any]]]] = [
        (["table", "list", "sales"], ("list_tables", {"namespace": "sales", "limit": 5000})),
        (["table", "list"], ("list_tables", {"limit": 5000})),
        (
            ["table", "history", "sales.orders"],
            ("history", {"table": "sales.orders", "limit": 1000}),
        ),
        (["ns", "list"], ("list_namespaces", {"limit": 1000})),
        (
            ["sql", "ALTER TABLE a.b ADD COLUMN c INT", "--request-id", "r1"],
            ("ddl", {"sql": "ALTER TABLE a.b ADD COLUMN c INT", "request_id": "r1"}),
        ),
        (
            ["cluster", "add-node", "4", "10.0.0.4:24104"],
            (
                "add_node",
                {
                    "node_id": 4,
                    "raft_address": "10.0.0.4:24104",
                    "learner": True,
                    # --timeout-ms (default 10 s) is the leader's wait for the change; the
                    # default is not sent (a daemon of an older release refuses the argument).
                },
            ),
        ),
        (
            ["cluster", "add-node", "4", "10.0.0.4:24104", "--client-address", "10.0.0.4:24204"],
            (
                "add_node",
                {
                    "node_id": 4,
                    "raft_address": "10.0.0.4:24104",
                    "client_address": "10.0.0.4:24204",
                    "learner": True,
                },
            ),
        ),
        (
            ["cluster", "add-node", "5", "h:1", "--voter"],
            (
                "add_node",
                {"node_id": 5, "raft_address": "h:1", "learner": False},
            ),
        ),
        (
            ["cluster", "promote-node", "4"],
            ("promote_node", {"node_id": 4}),
        ),
        (
            ["cluster", "remove-node", "4"],
            ("remove_node", {"node_id": 4}),
        ),
        (
            ["cluster", "remove-node", "4", "--timeout-ms", "20000"],
            ("remove_node", {"node_id": 4, "timeout_ms": 20_000}),
        ),
        (["cluster", "transfer-leader", "2"], ("transfer_leader", {"target": 2})),
        (["cluster", "version"], ("apply_version", {})),
        (["cluster", "version", "--finalize"], ("apply_version_finalize", {})),
        (
            ["cluster", "version", "--finalize", "--to", "2"],
            ("apply_version_finalize", {"version": 2}),
        ),
        (["cluster", "status"], ("status", {})),
        (["safe-time"], ("safe_time", {})),
    ]
    for args, expected in cases:
        for fmt in ("table", "json"):
            before = len(fake.node.requests)
            result = against(fake, "-o", fmt, *args)
            assert result.exit_code == 0, (args, result.output)
            assert sent(fake)[before:] == [expected], args
            if fmt == "json":
                json.loads(result.stdout)
            else:
                assert result.stdout.strip(), args


def test_namespace_commands_build_quoted_sql(fake: ThreadedFakeNode) -> None:
    assert (
        against(fake, "ns", "create", "sales", "--comment", "it's", "--if-not-exists").exit_code
        == 0
    )
    assert against(fake, "ns", "drop", "sales", "--cascade").exit_code == 0
    sqls = [a["sql"] for op, a in sent(fake)]
    assert sqls == [
        "CREATE NAMESPACE IF NOT EXISTS `sales` COMMENT 'it\\'s'",
        "DROP NAMESPACE `sales` CASCADE",
    ]


def test_sql_table_output(fake: ThreadedFakeNode) -> None:
    result = against(fake, "sql", "ALTER TABLE sales.orders ADD COLUMN c INT")
    assert result.exit_code == 0
    assert "AlterTable" in result.stdout and "1000.2" in result.stdout


def test_table_history_lists_versions(fake: ThreadedFakeNode) -> None:
    result = against(fake, "table", "history", "sales.orders")
    assert "ADD COLUMN amount" in result.stdout
    assert "`id` BIGINT, `amount` DECIMAL(10,2)" in result.stdout


def test_status_with_a_dead_endpoint_shows_it_and_exits_3(fake: ThreadedFakeNode) -> None:
    dead = dead_endpoint()
    result = run("--endpoints", f"{fake.endpoint},{dead}", "--token", TOKEN, "cluster", "status")
    assert result.exit_code == 3
    assert "leader" in result.stdout
    assert f"UNAVAILABLE: status failed: {dead}: connection refused" in result.stdout
    doc = json.loads(
        run(
            "--endpoints",
            f"{fake.endpoint},{dead}",
            "--token",
            TOKEN,
            "-o",
            "json",
            "cluster",
            "status",
        ).stdout
    )
    assert [d["ok"] for d in doc] == [True, False]
    assert doc[1]["error"]["code"] == "UNAVAILABLE"


# ---- errors and exit codes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (TableNotFoundError("table a.b does not exist", details={"table": "a.b"}), 4),
        (InvalidDdlError("unexpected token", details={"line": 1, "col": 7}), 5),
        (ForbiddenError("op 'ddl' needs role writer"), 6),
        (NotReadyError("node starting"), 3),
        (InternalError("bug"), 1),
    ],
)
def test_errors_print_one_line_and_exit_by_class(error: MetastoreError, exit_code: int) -> None:
    async def fail(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise error

    with ThreadedFakeNode(handler=fail) as node:
        result = against(node, "--timeout-ms", "2000", "table", "describe", "a.b")
    assert result.exit_code == exit_code
    first = result.stderr.splitlines()[0]
    # A FORBIDDEN line goes on with which token it was and where the others are (first_use).
    assert first.startswith(f"Error: {error.code.value}: {error.message}")
    assert first == f"Error: {error.code.value}: {error.message}" or isinstance(
        error, ForbiddenError
    )
    assert result.stdout == ""
    if isinstance(error, InvalidDdlError):
        assert 'Details: {"col": 7, "line": 1}' in result.stderr


def test_wrong_token_exits_6(fake: ThreadedFakeNode) -> None:
    result = run("--endpoints", fake.endpoint, "--token", "not-the-token-at-all", "ns", "list")
    assert result.exit_code == 6
    assert result.stderr.startswith("Error: UNAUTHENTICATED: ")


def test_no_token_exits_6(fake: ThreadedFakeNode) -> None:
    result = run("--endpoints", fake.endpoint, "ns", "list")
    assert result.exit_code == 6
    assert "no token" in result.stderr
    assert fake.node.connections == 0


def test_unreachable_cluster_exits_3() -> None:
    dead = dead_endpoint()
    # A short budget: with the default (10 s) the client keeps retrying a refused endpoint.
    result = run("--endpoints", dead, "--token", TOKEN, "--timeout-ms", "1500", "ns", "list")
    assert result.exit_code == 3
    assert result.stderr.startswith(
        f"Error: UNAVAILABLE: list_namespaces failed on every endpoint: {dead}: connection refused"
    )


def test_no_endpoints_is_a_usage_error() -> None:
    result = run("--token", TOKEN, "ns", "list")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: NO_ENDPOINTS: ")


def test_bad_endpoint_is_a_usage_error(fake: ThreadedFakeNode) -> None:
    result = run("--endpoints", "nonsense", "--token", TOKEN, "ns", "list")
    assert result.exit_code == 2  # like NO_ENDPOINTS: the flag is wrong, nothing was refused
    assert result.stderr.startswith("Error: USAGE: --endpoints: endpoint 'nonsense' ")


def test_insecure_token_file_is_refused(tmp_path: Path, fake: ThreadedFakeNode) -> None:
    token_file = tmp_path / "t.token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o644)
    result = run("--endpoints", fake.endpoint, "--token-file", str(token_file), "ns", "list")
    assert result.exit_code == 2  # a configuration error: the file, not the cluster
    assert result.stderr.startswith("Error: SECRETS_INSECURE: ")
    missing = run("--endpoints", fake.endpoint, "--token-file", str(tmp_path / "no"), "ns", "list")
    assert missing.exit_code == 2, missing.stderr
    os.chmod(token_file, 0o600)
    assert (
        run("--endpoints", fake.endpoint, "--token-file", str(token_file), "ns", "list").exit_code
        == 0
    )


def test_every_error_code_has_an_exit_code() -> None:
    assert {c.value for c in ErrorCode} <= set(EXIT_CODE_BY_ERROR)
    assert set(EXIT_CODE_BY_ERROR.values()) <= {1, 3, 4, 5, 6}


def test_a_code_from_a_newer_node_maps_by_its_original_code() -> None:
    newer = UnknownError("?", details={"original_code": "TABLE_NOT_FOUND"})
    assert exit_code_for(newer) == 4
    assert exit_code_for(UnknownError("?", details={"original_code": "NEW_THING"})) == 1


# ---- defaults and environment ----------------------------------------------------------------


def test_environment_variables_set_the_global_options(fake: ThreadedFakeNode) -> None:
    env = {
        "METASTORE_ENDPOINTS": fake.endpoint,
        "METASTORE_TOKEN": TOKEN,
        "METASTORE_OUTPUT": "json",
        "METASTORE_TIMEOUT_MS": "4000",
    }
    result = run("table", "list", "sales", env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tables"] == RESULTS["list_tables"]["tables"]


def test_token_file_from_the_environment(tmp_path: Path, fake: ThreadedFakeNode) -> None:
    token_file = tmp_path / "t.token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    env = {"METASTORE_ENDPOINTS": fake.endpoint, "METASTORE_TOKEN_FILE": str(token_file)}
    assert run("ns", "list", env=env).exit_code == 0


def test_local_cluster_defaults_are_read_from_the_working_directory(tmp_path: Path) -> None:
    local = tmp_path / "cluster_configs" / "local"
    local.mkdir(parents=True)
    secrets = ensure_secrets(local / "secrets")
    admin = read_token_file(secrets.token_file(Role.ADMIN))
    with ThreadedFakeNode(handler=canned, tokens=frozenset({admin})) as node:
        port = int(node.endpoint.rsplit(":", 1)[1])
        layout = [
            NodeAddress(
                id=1,
                host="127.0.0.1",
                raft_port=port + 1 if port < 65_000 else port - 1,
                client_port=port,
                metrics_port=port + 2 if port < 65_000 else port - 2,
            )
        ]
        (local / "cluster.toml").write_text(render_cluster_toml(cluster_id="l", nodes=layout))
        result = run("-o", "json", "table", "list", "sales")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tables"] == RESULTS["list_tables"]["tables"]


# ---- help ------------------------------------------------------------------------------------


def _all_commands(group: click.Group, prefix: list[str]) -> Iterator[list[str]]:
    for name, command in group.commands.items():
        yield [*prefix, name]
        if isinstance(command, click.Group):
            yield from _all_commands(command, [*prefix, name])


def test_every_command_has_help() -> None:
    commands = list(_all_commands(cli, []))
    assert len(commands) >= 20
    for path in commands:
        result = run(*path, "--help")
        assert result.exit_code == 0, path
        assert "Usage: metastore" in result.stdout
        lines = result.stdout.splitlines()
        assert len([line for line in lines if line.strip()]) >= 3, path
    root = run("--help")
    assert "Exit codes: 0 ok" in root.stdout
    assert "METASTORE_ENDPOINTS" in root.stdout


# ---- node start ------------------------------------------------------------------------------


def test_node_start_validates_the_config_first(tmp_path: Path) -> None:
    bad = tmp_path / "node1.toml"
    bad.write_text('cluster = "cluster.toml"\nnode_id = 1\ncolour = "blue"\n')
    result = run("node", "start", "--config", str(bad))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: CONFIG_INVALID: {bad}: colour: unknown key")


def test_node_start_without_the_daemon_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run("cluster", "init", str(tmp_path / "c")).exit_code == 0
    # Simulate a build without the daemon module: importing it then fails like a missing one.
    monkeypatch.setitem(sys.modules, "metastore.daemon.node", None)
    result = run("node", "start", "--config", str(tmp_path / "c" / "node1.toml"))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: DAEMON_UNAVAILABLE: ")


# ---- local lifecycle: pid files and signals --------------------------------------------------

# A stand-in for a node process: its command line carries the words `cluster down` looks for.
FAKE_NODE_ARGV_TAIL = ["cli.main", "node", "start"]


def spawn_fake_node(code: str, *, config: Path) -> subprocess.Popen[bytes]:
    """A process whose command line is a node's (`cli.main node start --config CONFIG`). It
    stops on `cluster down`'s signal (SIGINT) as a node does, even when the test runs in the
    background of a shell (which starts it with SIGINT ignored), unless `code` says otherwise."""
    stoppable = f"import signal; signal.signal({int(processes.STOP_SIGNAL)}, signal.SIG_DFL); "
    proc = subprocess.Popen(
        [sys.executable, "-c", stoppable + code, *FAKE_NODE_ARGV_TAIL, "--config", str(config)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    d = tmp_path / "c"
    assert run("cluster", "init", str(d), "--base-port", "28100").exit_code == 0
    return d


def test_up_refuses_when_a_node_is_running_and_down_stops_it(cluster_dir: Path) -> None:
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    proc = spawn_fake_node(
        "import time; print('ready', flush=True); time.sleep(60)",
        config=cluster_dir / "node1.toml",
    )
    try:
        pid_file = cfg.node_pid_file(1)
        pid_file.parent.mkdir(parents=True)
        pid_file.write_text(f"{proc.pid}\n")
        up = run("cluster", "up", "--config", str(cluster_dir))
        assert up.exit_code == 5
        assert up.stderr.startswith(f"Error: ALREADY_RUNNING: node 1 (pid {proc.pid})")
        assert not cfg.node_pid_file(2).exists()  # nothing was started
        down = run("-o", "json", "cluster", "down", "--config", str(cluster_dir))
        assert down.exit_code == 0, down.output
        assert json.loads(down.stdout) == [
            {"node_id": 1, "pid": proc.pid, "outcome": "stopped"},
            {"node_id": 2, "pid": None, "outcome": "not running"},
            {"node_id": 3, "pid": None, "outcome": "not running"},
        ]
        assert proc.wait(timeout=5) == -processes.STOP_SIGNAL
        assert not pid_file.exists()
    finally:
        proc.kill()
        proc.wait()


def test_down_kills_a_node_that_ignores_its_stop_signal(cluster_dir: Path) -> None:
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    proc = spawn_fake_node(
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)",
        config=cluster_dir / "node2.toml",
    )
    try:
        cfg.node_pid_file(2).parent.mkdir(parents=True)
        cfg.node_pid_file(2).write_text(str(proc.pid))
        started = time.monotonic()
        down = run(
            "-o", "json", "cluster", "down", "--config", str(cluster_dir), "--grace-ms", "300"
        )
        assert down.exit_code == 0
        assert json.loads(down.stdout)[1] == {"node_id": 2, "pid": proc.pid, "outcome": "killed"}
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
        proc.wait()


def test_down_never_signals_a_process_that_is_not_a_node(cluster_dir: Path) -> None:
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    cfg.node_pid_file(3).parent.mkdir(parents=True)
    # Our own PID: alive, but its command line is pytest's, not a node's.
    cfg.node_pid_file(3).write_text(str(os.getpid()))
    down = run("-o", "json", "cluster", "down", "--config", str(cluster_dir))
    assert down.exit_code == 0
    assert json.loads(down.stdout)[2] == {
        "node_id": 3,
        "pid": os.getpid(),
        "outcome": "stale pid file",
    }
    assert not cfg.node_pid_file(3).exists()


def test_down_never_signals_a_node_of_another_cluster(cluster_dir: Path, tmp_path: Path) -> None:
    # A stale pid file (its node died without `cluster down`: kill -9, a reboot) whose PID now
    # belongs to a node of another cluster started from here: that node is not ours to stop.
    other = tmp_path / "other"
    assert run("cluster", "init", str(other), "--base-port", "28400").exit_code == 0
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    proc = spawn_fake_node(
        "import time; print('ready', flush=True); time.sleep(60)", config=other / "node1.toml"
    )
    try:
        cfg.node_pid_file(1).parent.mkdir(parents=True)
        cfg.node_pid_file(1).write_text(f"{proc.pid}\n")
        # `cluster up` would not take it for this cluster's running node 1 ...
        assert processes.running_node_pid(cfg.node_pid_file(1), cluster_dir) is None
        # ... and `cluster down` leaves it alone.
        down = run("-o", "json", "cluster", "down", "--config", str(cluster_dir))
        assert down.exit_code == 0
        assert json.loads(down.stdout)[0] == {
            "node_id": 1,
            "pid": proc.pid,
            "outcome": "stale pid file",
        }
        assert proc.poll() is None, "a node of another cluster was signalled"
        # The same process is this cluster's node when its --config is this cluster's.
        assert processes.looks_like_node(proc.pid, other)
    finally:
        proc.kill()
        proc.wait()


def test_down_goes_on_past_a_pid_it_may_not_signal(
    cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pid file whose PID now belongs to another user's process (kill: EPERM) that the checks
    # could not tell from a node (its /proc entry hidden): `cluster down` stopped there with
    # IO_ERROR, and the nodes after it were never signalled.
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    code = "import time; print('ready', flush=True); time.sleep(60)"
    foreign = spawn_fake_node(code, config=cluster_dir / "node1.toml")
    ours = spawn_fake_node(code, config=cluster_dir / "node2.toml")
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid == foreign.pid and sig != 0:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_kill(pid, sig)

    try:
        for node_id, proc in ((1, foreign), (2, ours)):
            cfg.node_pid_file(node_id).parent.mkdir(parents=True)
            cfg.node_pid_file(node_id).write_text(f"{proc.pid}\n")
        monkeypatch.setattr(os, "kill", kill)
        down = run("-o", "json", "cluster", "down", "--config", str(cluster_dir))
        monkeypatch.undo()
        assert down.exit_code == 0, down.output
        assert json.loads(down.stdout)[:2] == [
            {"node_id": 1, "pid": foreign.pid, "outcome": "not ours (no permission to signal)"},
            {"node_id": 2, "pid": ours.pid, "outcome": "stopped"},
        ]
        assert ours.wait(timeout=5) == -processes.STOP_SIGNAL
        assert foreign.poll() is None
    finally:
        for proc in (foreign, ours):
            proc.kill()
            proc.wait()


def test_a_pid_whose_command_line_cannot_be_read_is_not_a_node(cluster_dir: Path) -> None:
    # Where /proc exists, our own processes' entries are always readable: an entry that is not
    # (gone, or hidden as another user's with hidepid) is not a node of ours. It was taken for
    # one ("True where that cannot be checked"), so `cluster down` signalled that PID.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not processes.looks_like_node(gone.pid, cluster_dir)


def test_without_proc_a_node_is_told_by_its_command_line_from_ps(
    cluster_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without /proc (macOS) every live PID was taken for a node of this cluster: `cluster down`
    # with a stale pid file signalled whatever program had got the PID since.
    monkeypatch.setattr(processes, "PROC_DIR", tmp_path / "no-proc")
    code = "import time; print('ready', flush=True); time.sleep(60)"
    node = spawn_fake_node(code, config=cluster_dir / "node1.toml")
    stranger = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert stranger.stdout is not None and stranger.stdout.readline() == b"ready\n"
        assert processes.looks_like_node(node.pid, cluster_dir)
        assert processes.looks_like_node(node.pid, cluster_dir, 1)
        assert not processes.looks_like_node(node.pid, cluster_dir, 2)
        assert not processes.looks_like_node(node.pid, tmp_path / "another-cluster")
        assert not processes.looks_like_node(stranger.pid, cluster_dir)
    finally:
        for proc in (node, stranger):
            proc.kill()
            proc.wait()


def test_up_starts_nodes_with_an_absolute_config_path(
    cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # So a node's command line names its cluster wherever `cluster down` runs from, also
    # where the node's working directory cannot be read (no /proc).
    monkeypatch.chdir(cluster_dir.parent)
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    argv = processes.node_command(Path(cluster_dir.name), cfg, 1)
    assert argv[argv.index("--config") + 1] == str(cluster_dir / "node1.toml")


def test_down_stops_the_other_nodes_past_a_pid_file_it_cannot_read(cluster_dir: Path) -> None:
    # Node 3's pid file cannot be read (here: its data directory path is a file): `cluster down`
    # stopped at it with IO_ERROR and stopped no node at all.
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    proc = spawn_fake_node(
        "import time; print('ready', flush=True); time.sleep(60)",
        config=cluster_dir / "node1.toml",
    )
    try:
        cfg.node_pid_file(1).parent.mkdir(parents=True)
        cfg.node_pid_file(1).write_text(f"{proc.pid}\n")
        cfg.node_data_dir(3).write_text("not a directory\n")
        down = run("-o", "json", "cluster", "down", "--config", str(cluster_dir))
        assert down.exit_code == 1, down.output
        outcomes = json.loads(down.stdout)
        assert outcomes[0] == {"node_id": 1, "pid": proc.pid, "outcome": "stopped"}
        assert outcomes[2]["pid"] is None
        assert outcomes[2]["outcome"] == "pid file unreadable: Not a directory (ENOTDIR)"
        assert proc.wait(timeout=5) == -processes.STOP_SIGNAL
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_file_holding_another_node_of_the_cluster_is_stale(cluster_dir: Path) -> None:
    # Node 1's stale pid file whose PID is now node 2's process (restarted since): it was taken
    # for node 1 running, so `cluster up --missing` would not start node 1, and `cluster down`
    # reported node 1 stopped when it had signalled node 2.
    cfg = load_cluster_config(cluster_dir / "cluster.toml")
    proc = spawn_fake_node(
        "import time; print('ready', flush=True); time.sleep(60)",
        config=cluster_dir / "node2.toml",
    )
    try:
        cfg.node_pid_file(1).parent.mkdir(parents=True)
        cfg.node_pid_file(1).write_text(f"{proc.pid}\n")
        down = run("-o", "json", "cluster", "down", "--config", str(cluster_dir))
        assert down.exit_code == 0, down.output
        assert json.loads(down.stdout)[0] == {
            "node_id": 1,
            "pid": proc.pid,
            "outcome": "stale pid file",
        }
        assert proc.poll() is None, "node 2 was signalled through node 1's pid file"
        cfg.node_pid_file(2).parent.mkdir(parents=True)
        cfg.node_pid_file(2).write_text(f"{proc.pid}\n")
        assert processes.running_node_pid(cfg.node_pid_file(2), cluster_dir, 2) == proc.pid
        assert processes.running_node_pid(cfg.node_pid_file(2), cluster_dir, 1) is None
    finally:
        proc.kill()
        proc.wait()


def test_up_and_down_need_a_cluster_config(tmp_path: Path) -> None:
    result = run("cluster", "up", "--config", str(tmp_path / "none"))
    assert result.exit_code == 2
    assert "CONFIG_INVALID" in result.stderr and "file not found" in result.stderr


def test_status_shows_the_progress_of_a_snapshot_sent_to_a_new_member() -> None:
    from rich.console import Console

    from cli.cluster import _replication_tables
    from metastore.client.protocol import EndpointResult

    follower = EndpointResult(endpoint="127.0.0.1:2", result={"node_id": 2, "replication": {}})
    leader = EndpointResult(
        endpoint="127.0.0.1:1",
        result={
            "node_id": 1,
            "replication": {
                "4": {
                    "match": 0,
                    "behind": 120_000,
                    "state": "snapshot",
                    "learner": True,
                    "active": True,
                    "snapshot_bytes": 256 * 2**20,
                    "snapshot_acked_bytes": 64 * 2**20,
                },
                "2": {"match": 120_000, "behind": 0, "state": "replicate", "learner": False},
            },
        },
    )
    down = EndpointResult(endpoint="127.0.0.1:3")
    [table] = _replication_tables([follower, leader, down])
    console = Console(width=160, record=True)
    console.print(table)
    text = console.export_text()
    assert "as leader 1 sees it" in text
    assert "64.0 of 256.0 MiB (25%)" in text and "learner" in text
    lines = [line for line in text.splitlines() if line.strip().startswith(("2", "4"))]
    assert [line.split()[0] for line in lines] == ["2", "4"]  # by node id


def test_promote_node_wait_retries_while_the_learner_catches_up_and_shows_how_far() -> None:
    from metastore.errors import InvalidArgumentError

    behind = {"n": 2}

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "promote_node":
            if behind["n"] > 0:
                behind["n"] -= 1
                raise InvalidArgumentError(
                    "learner 4 has not caught up",
                    details={
                        "reason": "learner_behind",
                        "node_id": 4,
                        "match": 0,
                        "commit_index": 900,
                    },
                )
            return {"index": 44}
        if op == "status":
            return {
                **RESULTS["status"],
                "replication": {
                    "4": {
                        "match": 0,
                        "behind": 900,
                        "state": "snapshot",
                        "learner": True,
                        "active": True,
                        "snapshot_bytes": 8 * 2**20,
                        "snapshot_acked_bytes": 2 * 2**20,
                    }
                },
            }
        return await canned(op, args)

    with ThreadedFakeNode(handler=handler) as node:
        # Without --wait: refused once, exit 5, the reason on stderr.
        refused = against(node, "cluster", "promote-node", "4")
        assert refused.exit_code == 5 and "has not caught up" in refused.stderr
        waited = against(node, "-o", "json", "cluster", "promote-node", "4", "--wait", "30s")
        assert waited.exit_code == 0, waited.output
        assert json.loads(waited.stdout) == {"index": 44}
        assert "receiving a snapshot, 2.0 of 8.0 MiB (25%)" in waited.stderr
        promotes = [a for op, a in sent(node) if op == "promote_node"]
        assert promotes == [{"node_id": 4}] * 3
        # Caught up already: promoted at the first ask.
        ok = against(node, "cluster", "promote-node", "4", "--wait", "5s")
        assert ok.exit_code == 0
        assert [op for op, _ in sent(node)].count("promote_node") == 4


def test_promote_node_wait_does_not_wait_out_another_refusal() -> None:
    from metastore.errors import InvalidArgumentError

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "promote_node":
            raise InvalidArgumentError("membership change refused: node 4 is not a learner")
        return await canned(op, args)

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "cluster", "promote-node", "4", "--wait", "30s")
        assert result.exit_code == 5 and "not a learner" in result.stderr
        assert [op for op, _ in sent(node)] == ["promote_node"]


def test_promote_node_wait_gives_up_at_its_deadline() -> None:
    from metastore.errors import InvalidArgumentError

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "promote_node":
            raise InvalidArgumentError(
                "learner 4 has not caught up",
                details={
                    "reason": "learner_behind",
                    "node_id": 4,
                    "match": 10,
                    "commit_index": 900,
                },
            )
        if op == "status":
            return {**RESULTS["status"], "replication": {}}
        return await canned(op, args)

    with ThreadedFakeNode(handler=handler) as node:
        started = time.monotonic()
        result = against(node, "cluster", "promote-node", "4", "--wait", "2s")
        assert result.exit_code == 5 and "has not caught up" in result.stderr
        assert "catching up, holds entries up to 10 (890 behind)" in result.stderr
        assert 1.5 < time.monotonic() - started < 15


def test_watch_count_finishes_an_entry_split_across_pages() -> None:
    """A page may end inside an entry too large for one reply (`next_from_event`): the CLI
    continues inside it (not after it, which skipped the rest) and `--count` still stops only
    once the entry is complete."""
    tm1, tm2 = make_ts(1_790_000_000_000), make_ts(1_790_000_001_000)
    ev = [{"tm": tm1, "index": 3, "kind": "table_dropped", "table": f"a.t{i}"} for i in range(3)]
    later = {"tm": tm2, "index": 4, "kind": "namespace_created", "namespace": "b"}
    calls: list[dict[str, Any]] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "watch"
        calls.append(args)
        if args.get("from_event") == 2:
            events, position = [ev[2], later], (tm2, 0)
        else:
            events, position = ev[:2], (tm1, 2)
        return {"events": events, "next_from_ts": position[0], "next_from_event": position[1]}

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "-o", "json", "watch", "--from", str(tm1 - 1), "--count", "1")
    assert result.exit_code == 0, result.output
    tables = [json.loads(line).get("table") for line in result.output.splitlines()]
    assert tables == ["a.t0", "a.t1", "a.t2"]
    assert [(a["from_ts"], a.get("from_event", 0)) for a in calls] == [(tm1 - 1, 0), (tm1, 2)]
    assert calls[1]["wait_ms"] == 0  # finishing the entry: no long poll for new events


def test_watch_text_names_leases_as_table_at_version() -> None:
    """A lease event's `leases` are [table, version] pairs; the text line names each as
    `ns.t@vN` (as the bridge's batch reports name pinned versions), not as a Python list."""
    tm = make_ts(1_790_000_000_000)
    event = {
        "tm": tm,
        "index": 3,
        "kind": "leases_acquired",
        "session_id": "s1",
        "leases": [["sales.clicks", 1], ["sales.orders", 12]],
    }

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "watch"
        return {"events": [event], "next_from_ts": tm, "next_from_event": 0}

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "watch", "--from", str(tm - 1), "--count", "1")
    assert result.exit_code == 0, result.output
    assert "leases=sales.clicks@v1,sales.orders@v12" in result.output, result.output


@pytest.mark.parametrize("interrupted_after", [1, 2, 3])
def test_watch_ctrl_c_while_printing_a_page_resumes_without_repeating_or_skipping(
    monkeypatch: pytest.MonkeyPatch, interrupted_after: int
) -> None:
    """Ctrl-C while a page (a backlog: `--oldest`, `--from` an hour ago) is being printed
    named the position the page was asked from, so the resumed watch printed every event of
    that page already shown again; between two events of one entry, naming the entry's tm
    skipped its rest. Now the entry being printed is finished, and the hint names it."""
    tms = [make_ts(1_790_000_000_000 + i * 1000) for i in range(4)]
    feed = [
        {"tm": tms[0], "index": 3, "kind": "namespace_created", "namespace": "a"},
        {"tm": tms[1], "index": 4, "kind": "table_dropped", "table": "a.t0"},
        {"tm": tms[1], "index": 4, "kind": "table_dropped", "table": "a.t1"},
        {"tm": tms[2], "index": 5, "kind": "namespace_dropped", "namespace": "a"},
    ]

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "watch"
        events = [e for e in feed if e["tm"] > args["from_ts"]]
        return {"events": events, "next_from_ts": tms[3], "next_from_event": 0}

    printed = 0
    real_echo = click.echo

    def echo(message: Any = None, *a: Any, **kw: Any) -> None:
        nonlocal printed
        if not kw.get("err") and printed == interrupted_after:
            printed += 1
            raise KeyboardInterrupt  # Ctrl-C before the next line
        if not kw.get("err"):
            printed += 1
        real_echo(message, *a, **kw)

    monkeypatch.setattr("cli.watch.click.echo", echo)
    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "-o", "json", "watch", "--from", str(tms[0] - 1))
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    hint = result.stderr.strip().rsplit(" ", 1)[-1]
    assert result.stderr.startswith("stopped; resume with --from"), result.stderr
    assert result.exit_code == 1, result.output  # interrupted: not "ended as asked"
    resumed = [e for e in feed if e["tm"] > int(hint)]
    assert shown + resumed == feed


@pytest.mark.parametrize(
    "args",
    [
        ["sql", "ALTER TABLE s.t ADD COLUMN c INT", "--wait"],
        ["job", "cancel", "1", "--wait"],
        ["job", "wait", "1", "--timeout"],
        ["cluster", "promote-node", "4", "--wait"],
    ],
)
@pytest.mark.parametrize("duration", ["99999999", "25h", "9" * 400, "0" * 5000 + "25h"])
def test_waits_have_an_upper_bound(fake: ThreadedFakeNode, args: list[str], duration: str) -> None:
    # A typo must not make a command wait for years (or fail with a traceback on a number a
    # float cannot hold): a usage error that names the bound, and nothing is sent.
    result = against(fake, *args, duration)
    assert result.exit_code == 2, result.output
    assert "24h" in result.stderr
    assert sent(fake) == []


def test_the_longest_wait_is_accepted() -> None:
    assert parse_wait_ms("24h") == parse_wait_ms("1440m") == parse_wait_ms("0024h") == 86_400_000
    assert parse_wait_ms("0") == parse_wait_ms("000s") == 0


def test_add_node_refuses_an_id_no_node_could_start_with(fake: ThreadedFakeNode) -> None:
    result = against(fake, "cluster", "add-node", "1000001", "127.0.0.1:24104")
    assert result.exit_code == 2, result.output
    assert sent(fake) == []


@pytest.mark.parametrize(
    ("error", "unknown"),
    [
        # The forward to the leader got no answer in time: the leader may go on.
        ("forward", True),
        # The leader's own wait for the change to commit ran out.
        ("timeout", True),
        # No leader known: nothing was sent anywhere, so nothing to check.
        ("no_leader", False),
    ],
)
def test_membership_change_with_an_unknown_outcome_says_so_and_how_to_check(
    error: str, unknown: bool
) -> None:
    from metastore.errors import RequestTimeoutError, UnavailableError

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "remove_node":
            if error == "forward":
                raise UnavailableError(
                    "node 1 did not answer within 30000 ms; outcome unknown",
                    details={"node_id": 1, "outcome_unknown": True},
                )
            if error == "timeout":
                raise RequestTimeoutError(
                    "membership change not applied within 10000 ms; outcome unknown"
                )
            raise UnavailableError("no leader known right now; retry shortly")
        return await canned(op, args)

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "cluster", "remove-node", "3")
    assert result.exit_code == 3, result.output
    said = "removal of node 3 may still take effect" in result.stderr
    assert said == unknown, result.stderr
    assert ("metastore cluster status" in result.stderr) == unknown, result.stderr
    # The CLI's fuller advice replaces the client library's: said once.
    assert result.stderr.count("metastore cluster status") <= 1, result.stderr


ADD_NODE_WARNING: Final = (
    "node 4 is not in this cluster's cluster.toml: it joins, but the other members cannot "
    "forward requests to it should it lead. Add its [[nodes]] entry to cluster.toml on every "
    "member and restart them one at a time."
)


async def _add_node_unknown_to_the_config(op: str, args: dict[str, Any]) -> dict[str, Any]:
    assert op == "add_node"
    return {"index": 12, "client_address_known": False, "warning": ADD_NODE_WARNING}


def _config_naming_node_4(directory: Path, fake: ThreadedFakeNode) -> Path:
    """A cluster.toml whose node 1 is the fake node and which names node 4 (not started)."""
    client_port = int(fake.endpoint.rsplit(":", 1)[1])
    nodes = [(1, 24101, client_port, 24301), (4, 24104, 24204, 24304)]
    lines = ['cluster_id = "t"']
    for node_id, raft, client, metrics in nodes:
        lines += [
            "[[nodes]]",
            f"id = {node_id}",
            'host = "127.0.0.1"',
            f"raft_port = {raft}",
            f"client_port = {client}",
            f"metrics_port = {metrics}",
        ]
    directory.mkdir()
    (directory / "cluster.toml").write_text("\n".join(lines) + "\n")
    return directory


def test_add_node_takes_the_client_address_from_the_config_it_talks_through(
    fake: ThreadedFakeNode, tmp_path: Path
) -> None:
    """The README's way: node 4's entry is in the cluster.toml the CLI uses (--config DIR), so
    its client port need not be typed again; the leader records it for every member."""
    config = _config_naming_node_4(tmp_path / "c", fake)
    result = run(
        "--token", TOKEN, "cluster", "add-node", "4", "127.0.0.1:24104", "--config", str(config)
    )
    assert result.exit_code == 0, result.output
    ((op, args),) = sent(fake)
    assert (op, args["client_address"]) == ("add_node", "127.0.0.1:24204")


def test_add_node_refuses_a_client_address_its_config_contradicts(
    fake: ThreadedFakeNode, tmp_path: Path
) -> None:
    config = _config_naming_node_4(tmp_path / "c", fake)
    result = run(
        "--token",
        TOKEN,
        "cluster",
        "add-node",
        "4",
        "127.0.0.1:24104",
        "--client-address",
        "127.0.0.1:9",
        "--config",
        str(config),
    )
    assert result.exit_code == 2, result.output
    assert "127.0.0.1:24204" in result.stderr
    assert sent(fake) == []


@pytest.mark.parametrize("bad", ["nohost", "h:0", "h:x", ":1"])
def test_add_node_refuses_a_malformed_client_address(fake: ThreadedFakeNode, bad: str) -> None:
    result = against(fake, "cluster", "add-node", "4", "h:1", "--client-address", bad)
    assert result.exit_code == 2, result.output
    assert sent(fake) == []


def test_add_node_help_says_how_members_learn_the_client_address() -> None:
    result = run("cluster", "add-node", "--help")
    assert result.exit_code == 0
    assert "--client-address" in result.stdout and "cluster.toml" in result.stdout


def test_add_node_shows_the_leaders_warning_on_its_own_line_on_stderr() -> None:
    with ThreadedFakeNode(handler=_add_node_unknown_to_the_config) as node:
        result = against(node, "cluster", "add-node", "4", "127.0.0.1:24104")
        as_json = against(node, "-o", "json", "cluster", "add-node", "4", "127.0.0.1:24104")
    assert result.exit_code == 0, result.output
    assert f"warning: {ADD_NODE_WARNING}\n" in result.stderr
    assert "[[nodes]]" not in result.stdout  # the table keeps its width
    assert "client_address_known" in result.stdout
    assert json.loads(as_json.stdout)["warning"] == ADD_NODE_WARNING


async def _node_without_safe_time(op: str, args: dict[str, Any]) -> dict[str, Any]:
    # A node that just started (or joined) and has applied nothing: safe time 0, and a lag
    # measured from the epoch.
    base = RESULTS["status" if op == "status" else "safe_time"]
    return {**base, "role": "pre_candidate", "safe_time": 0, "lag_ms": 1_795_780_365_586}


@pytest.mark.parametrize("command", [["cluster", "status"], ["safe-time"]])
def test_a_node_without_safe_time_shows_no_lag_rather_than_56_years(command: list[str]) -> None:
    with ThreadedFakeNode(handler=_node_without_safe_time) as node:
        result = against(node, *command)
        as_json = against(node, "-o", "json", *command)
    assert result.exit_code == 0, result.output
    assert "1795780365586" not in result.stdout, result.stdout
    # The document keeps what the node said: scripts see the raw reply.
    assert json.loads(as_json.stdout)[0]["result"]["lag_ms"] == 1_795_780_365_586
