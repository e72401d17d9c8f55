"""Rough edges an experienced engineer hits after the first-use review, each pinned by a test:
an unknown id is a typed error (as etcdctl's "lease not found"), a malformed table name is a
usage error before any request, a timestamp far in the future is not "retry later", table
cells do not wrap, `snapshot save` does not overwrite, `cluster status --config DIR`."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli.output import rows_table
from hlc import make_ts, to_iso
from metastore.daemon import backup
from metastore.daemon.secrets import read_token_file
from metastore.errors import TimestampAheadError
from metastore.state import MetastoreState
from tests.cli.test_cli import RESULTS, _isolated_cwd, against, canned, fake, run, sent
from tests.client.fake_node import TOKEN, ThreadedFakeNode
from tests.client.test_client import dead_endpoint

__all__ = ["_isolated_cwd", "fake"]  # fixtures used by name


# ---- 1. unknown ids ----------------------------------------------------------------------------


def _expiring(skipped: list[str]) -> ThreadedFakeNode:
    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "session_expire"
        ids = args["session_ids"]
        return {
            "expired": [i for i in ids if i not in skipped],
            "skipped": [i for i in ids if i in skipped],
            "reason": "admin",
        }

    return ThreadedFakeNode(handler=handler)


def test_session_expire_of_an_unknown_id_is_not_found() -> None:
    with _expiring(["nosuch"]) as node:
        result = against(node, "session", "expire", "nosuch")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: SESSION_NOT_FOUND: "), result.stderr
    assert "nosuch" in first
    assert result.stdout == ""  # nothing done: nothing a script could take for a result


def test_session_expire_of_some_unknown_ids_expires_the_others_and_says_which() -> None:
    with _expiring(["gone"]) as node:
        result = against(node, "-o", "json", "session", "expire", "s1", "gone")
        assert [op for op, _ in sent(node)] == ["session_expire"]
    assert result.exit_code == 4, result.output
    # stdout stays the server's answer (what was expired), stderr says what was not found.
    assert json.loads(result.stdout) == {"expired": ["s1"], "skipped": ["gone"], "reason": "admin"}
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: SESSION_NOT_FOUND: "), result.stderr
    assert "gone" in first and "s1" not in first


def test_session_expire_of_known_ids_exits_0() -> None:
    with _expiring([]) as node:
        result = against(node, "session", "expire", "s1")
    assert result.exit_code == 0, result.output
    assert "expired: s1" in result.stdout


# ---- 2. malformed table names ------------------------------------------------------------------

TABLE_COMMANDS = [
    ["table", "describe"],
    ["table", "history"],
    ["table", "files"],
    ["table", "read"],
    ["table", "compact"],
    ["table", "optimize"],
    ["lease", "list"],
    ["lease", "blockers"],
    ["gc", "status"],
    ["gc", "run"],
    ["job", "list"],
]


@pytest.mark.parametrize("command", TABLE_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("name", ["orders", "a.b.c", "sales.", "sales.or-ders"])
def test_a_malformed_table_name_is_a_usage_error_before_any_request(
    fake: ThreadedFakeNode, command: list[str], name: str
) -> None:
    result = against(fake, *command, name)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: USAGE: Invalid value for '"), result.stderr
    assert "NS.TABLE" in first, result.stderr
    assert repr(name) in first, result.stderr
    assert sent(fake) == []


@pytest.mark.parametrize(
    "args",
    [
        ["pts", "protect", "--ts", "now", "--table", "orders"],
        ["watch", "a.b.c"],
        ["watch", "sa-les"],
    ],
)
def test_a_malformed_table_or_namespace_option_is_a_usage_error(
    fake: ThreadedFakeNode, args: list[str]
) -> None:
    result = against(fake, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: USAGE: Invalid value for "), result.stderr
    assert sent(fake) == []


@pytest.mark.parametrize("command", TABLE_COMMANDS, ids=" ".join)
def test_every_table_argument_is_spelled_ns_table_in_help(command: list[str]) -> None:
    usage = run(*command, "--help").stdout.splitlines()[0]
    assert "NS.TABLE" in usage, usage
    assert "NS.T]" not in usage and not usage.endswith("NS.T"), usage


def test_table_names_are_passed_as_given(fake: ThreadedFakeNode) -> None:
    result = against(fake, "-o", "json", "table", "history", "Sales.Orders")
    assert result.exit_code == 0, result.output
    assert sent(fake)[0][1]["table"] == "Sales.Orders"
    assert "[NS[.TABLE]]" in run("watch", "--help").stdout
    assert "--table NS.TABLE" in run("pts", "protect", "--help").stdout


# ---- 3. timestamps in the future ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["table", "describe", "a.b", "--as-of", "2030-01-01T00:00:00Z"], "--as-of"),
        (["table", "list", "--as-of", "2030-01-01T00:00:00Z"], "--as-of"),
        (["ns", "list", "--as-of", "2030-01-01T00:00:00Z"], "--as-of"),
        (["table", "read", "a.b", "--as-of", "2030-01-01T00:00:00Z"], "--as-of"),
        (["table", "files", "a.b", "--as-of", "2030-01-01T00:00:00Z"], "--as-of"),
        (["watch", "--from", "2030-01-01T00:00:00Z"], "--from"),
    ],
)
def test_a_timestamp_beyond_any_clock_skew_is_a_usage_error(
    fake: ThreadedFakeNode, args: list[str], flag: str
) -> None:
    result = against(fake, *args)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Error: USAGE: Invalid value for '{flag}': "), result.stderr
    assert "in the future by " in first and " days" in first, first
    assert sent(fake) == []


def test_a_timestamp_a_few_seconds_ahead_is_sent(fake: ThreadedFakeNode) -> None:
    # Within the largest clock skew a cluster may tolerate: the nodes decide (they wait).
    ts = make_ts(int(time.time() * 1000) + 5_000)
    result = against(fake, "table", "describe", "a.b", "--as-of", str(ts))
    assert result.exit_code == 0, result.output
    assert sent(fake)[0][1]["as_of"] == ts


def _ahead_nodes(ahead_ms: int) -> list[ThreadedFakeNode]:
    def node(node_id: int) -> ThreadedFakeNode:
        async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
            raise TimestampAheadError(
                f"timestamp {to_iso(args['as_of'])} is {ahead_ms} ms ahead of node {node_id}'s "
                "clock (more than CSmax = 500 ms): this node cannot answer for it yet",
                details={
                    "ts": args["as_of"],
                    "ahead_ms": ahead_ms,
                    "cs_max_ms": 500,
                    "node_id": node_id,
                },
            )

        return ThreadedFakeNode(handler=handler)

    return [node(i) for i in (1, 2, 3)]


@pytest.mark.parametrize(
    ("ahead_ms", "exit_code", "said"),
    [(2_500, 3, "in the future by 2.5 s"), (90_000_000, 5, "in the future by 1 day 1 h")],
)
def test_timestamp_ahead_of_every_node_says_by_how_much_in_one_short_error(
    ahead_ms: int, exit_code: int, said: str
) -> None:
    # The nodes' clocks may be behind the CLI's: the nodes, not the CLI, found it ahead.
    nodes = _ahead_nodes(ahead_ms)
    with nodes[0], nodes[1], nodes[2]:
        endpoints = ",".join(n.endpoint for n in nodes)
        # These nodes never catch up: the client waits for the soonest to (ahead_ms - CSmax)
        # between rounds while its budget allows, so keep the budget short.
        result = run(
            "--endpoints",
            endpoints,
            "--token",
            TOKEN,
            "--timeout-ms",
            "3000",
            "table",
            "describe",
            "a.b",
            "--as-of",
            "now",
        )
    assert result.exit_code == exit_code, result.output
    first, *rest = result.stderr.splitlines()
    assert first.startswith("Error: TIMESTAMP_AHEAD_OF_CLOCK: "), result.stderr
    assert said in first, first
    assert "CSmax" in first, first
    # One summary, not each node's answer again.
    assert len(rest) <= 1, result.stderr
    assert all("node 1" not in line and "node 2" not in line for line in rest), rest
    assert all(len(line) < 200 for line in rest), rest


# ---- 4. table cells do not wrap ----------------------------------------------------------------


def test_status_rows_stay_on_one_line_for_grep() -> None:
    # A node with a clock alarm makes the ERROR column wide: the row of a dead endpoint was
    # wrapped at 200 columns, "connection" on one line and "refused" on the next.
    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {
            **RESULTS["status"],
            "clock_offsets_ms": {"1": 0},
            "clock_alarm": {"peer": 2, "ahead_ms": 812},
        }

    dead = dead_endpoint()
    with ThreadedFakeNode(handler=handler) as node:
        result = run(
            "--endpoints", f"{node.endpoint},{dead}", "--token", TOKEN, "cluster", "status"
        )
    assert result.exit_code == 3, result.output
    lines = result.stdout.splitlines()
    dead_rows = [line for line in lines if line.strip().startswith(dead)]
    assert len(dead_rows) == 1, result.stdout
    assert dead_rows[0].rstrip().endswith(f"status failed: {dead}: connection refused"), dead_rows
    alarm = [line for line in lines if "clock: node 2" in line]
    assert len(alarm) == 1 and alarm[0].rstrip().endswith("check chrony/ntpd)"), result.stdout
    # Every line is a header, the rule, a row or blank: nothing continues a row.
    rows = [line for line in lines if line.strip()]
    assert len(rows) == 4, result.stdout


def test_short_cells_do_not_wrap_on_a_narrow_terminal() -> None:
    # A terminal narrower than the table: the long free text (a schema) folds, the short
    # phrases (an endpoint, a time, an error) stay whole on their line.
    row = ["127.0.0.1:24102", "2026-09-21T14:13:20.000Z", "UNAVAILABLE: connection refused"]
    table = rows_table(["endpoint", "safe time", "error", "schema"], [[*row, "x INT, " * 30]])
    out = io.StringIO()
    Console(file=out, width=100, no_color=True).print(table)
    text = out.getvalue()
    for phrase in row:
        assert phrase in text, text


# ---- 5. snapshot save --------------------------------------------------------------------------


def _exporting_node() -> ThreadedFakeNode:
    """A node that exports an empty catalog as a real node does (metastore.daemon.backup)."""
    exports = backup.SnapshotExports()

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "snapshot_begin":
            return exports.begin(MetastoreState(), cluster_id="c1", node_id=1)
        assert op == "snapshot_chunk"
        return exports.chunk(args["export_id"], args["offset"])

    return ThreadedFakeNode(handler=handler)


def test_snapshot_save_refuses_to_overwrite_a_file_without_force(tmp_path: Path) -> None:
    file = tmp_path / "catalog.snap"
    file.write_text("yesterday's backup")
    with _exporting_node() as node:
        result = against(node, "snapshot", "save", str(file))
        assert sent(node) == []  # refused before asking the cluster for anything
    assert result.exit_code == 5, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: ALREADY_EXISTS: "), result.stderr
    assert "--force" in first
    assert file.read_text() == "yesterday's backup"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalog.snap"]


def test_snapshot_save_force_replaces_the_file(tmp_path: Path) -> None:
    file = tmp_path / "catalog.snap"
    file.write_text("yesterday's backup")
    with _exporting_node() as node:
        result = against(node, "snapshot", "save", str(file), "--force")
    assert result.exit_code == 0, result.output
    header, _ = backup.read_file(file)
    assert header["cluster_id"] == "c1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalog.snap"]


def test_snapshot_save_shows_when_it_was_taken(tmp_path: Path) -> None:
    with _exporting_node() as node:
        table = against(node, "snapshot", "save", str(tmp_path / "a.snap"))
        as_json = against(node, "-o", "json", "snapshot", "save", str(tmp_path / "b.snap"))
    assert table.exit_code == 0, table.output
    assert "taken_at_ms" not in table.stdout, table.stdout
    assert re.search(r"taken at\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", table.stdout), table.stdout
    assert isinstance(json.loads(as_json.stdout)["taken_at_ms"], int)  # JSON keeps the number


# ---- 6. cluster status --config DIR ------------------------------------------------------------


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[tuple[Path, ThreadedFakeNode]]:
    """`cluster init DIR` (one node), its client port pointed at a fake node that accepts
    DIR's admin token only."""
    directory = tmp_path / "clusters" / "c1"
    assert run("cluster", "init", str(directory), "--nodes", "1").exit_code == 0
    admin = read_token_file(directory / "secrets" / "admin.token")
    with ThreadedFakeNode(handler=canned, tokens=frozenset({admin})) as node:
        port = node.endpoint.rsplit(":", 1)[1]
        toml = directory / "cluster.toml"
        text = toml.read_text()
        assert "client_port = 24201" in text
        toml.write_text(text.replace("client_port = 24201", f"client_port = {port}"))
        yield directory, node


def test_status_takes_endpoints_and_token_from_config(
    configured: tuple[Path, ThreadedFakeNode],
) -> None:
    directory, node = configured
    result = run("cluster", "status", "--config", str(directory))
    assert result.exit_code == 0, result.output
    assert sent(node) == [("status", {})]
    assert node.endpoint in result.stdout


def test_config_beats_endpoints_from_the_environment(
    configured: tuple[Path, ThreadedFakeNode],
) -> None:
    # An export left from another cluster: the flag given now wins, as flags beat variables.
    directory, node = configured
    env = {"METASTORE_ENDPOINTS": dead_endpoint()}
    result = run("-o", "json", "safe-time", "--config", str(directory), env=env)
    assert result.exit_code == 0, result.output
    assert [op for op, _ in sent(node)] == ["safe_time"]


def test_a_token_given_beats_the_config_admin_token(
    configured: tuple[Path, ThreadedFakeNode],
) -> None:
    directory, _node = configured
    result = run("cluster", "status", "--config", str(directory), "--token", "not-this-one")
    assert result.exit_code == 3, result.output  # status: that endpoint did not answer
    assert "UNAUTHENTICATED" in result.stdout


def test_config_and_endpoints_flags_exclude_each_other(
    configured: tuple[Path, ThreadedFakeNode],
) -> None:
    directory, node = configured
    result = run("--endpoints", node.endpoint, "cluster", "status", "--config", str(directory))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: USAGE: "), result.stderr
    assert "--config" in result.stderr.splitlines()[0]
    assert sent(node) == []


def test_a_config_dir_without_a_cluster_says_so(tmp_path: Path) -> None:
    result = run("cluster", "status", "--config", str(tmp_path / "nosuch"))
    assert result.exit_code == 2, result.output
    assert "metastore cluster init" in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["cluster", "status"], ["safe-time"]])
def test_config_is_documented_on_read_commands(command: list[str]) -> None:
    text = run(*command, "--help").stdout
    assert "--config DIR" in text, text
