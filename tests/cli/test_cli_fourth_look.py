"""Defects an experienced data engineer hit walking the README and docs/operations.md on a fresh
local cluster, each pinned by a test: a METASTORE_TOKEN_FILE exported for the first cluster
does not stop `cluster up` / `cluster status --config DIR` of the cluster a restore seeds, and
`cluster up` whose token the nodes refuse says so at once (exit 6) instead of waiting it out."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from cli import processes
from cli.main import cli
from metastore.daemon.config import load_cluster_config, load_node_config
from metastore.daemon.secrets import read_token_file
from metastore.ddl import parse_ddl
from metastore.errors import (
    InvalidDdlError,
    NamespaceNotFoundError,
    NotReadyError,
    TableNotFoundError,
)
from tests.cli.test_cli import _isolated_cwd, against, fake, run, sent
from tests.cli.test_cli_second_look import configured
from tests.cli.test_cli_third_look import CATALOG, _catalog
from tests.cli.test_pts_cli_text import _handler as protect_handler
from tests.client.fake_node import TOKEN, ThreadedFakeNode
from tests.client.test_client import dead_endpoint
from tests.daemon.harness import write_cluster
from tests.daemon.test_node_startup import assert_one_line_error, occupied, run_daemon

__all__ = ["_isolated_cwd", "configured", "fake"]  # fixtures used by name


# ---- 1. --config DIR's admin token beats METASTORE_TOKEN(_FILE) of another cluster ------------


@pytest.fixture
def other_clusters_token_file(tmp_path: Path) -> Path:
    """The admin token file of another cluster, as the README's first `export` leaves it."""
    other = tmp_path / "clusters" / "first"
    assert run("cluster", "init", str(other), "--nodes", "1").exit_code == 0
    return other / "secrets" / "admin.token"


@pytest.mark.parametrize("command", [["cluster", "status"], ["safe-time"], ["cluster", "version"]])
def test_config_beats_a_token_file_exported_for_another_cluster(
    configured: tuple[Path, ThreadedFakeNode], other_clusters_token_file: Path, command: list[str]
) -> None:
    directory, node = configured
    env = {"METASTORE_TOKEN_FILE": str(other_clusters_token_file)}
    result = run(*command, "--config", str(directory), env=env)
    assert result.exit_code == 0, result.output
    assert "UNAUTHENTICATED" not in result.output
    assert len(sent(node)) >= 1


def test_config_beats_a_token_exported_for_another_cluster(
    configured: tuple[Path, ThreadedFakeNode], other_clusters_token_file: Path
) -> None:
    directory, node = configured
    env = {"METASTORE_TOKEN": read_token_file(other_clusters_token_file)}
    result = run("cluster", "status", "--config", str(directory), env=env)
    assert result.exit_code == 0, result.output
    assert sent(node) == [("status", {})]


def test_a_token_file_flag_still_beats_the_config_admin_token(
    configured: tuple[Path, ThreadedFakeNode], other_clusters_token_file: Path
) -> None:
    directory, _node = configured
    for flag_at_end in (False, True):
        flag = ["--token-file", str(other_clusters_token_file)]
        args = ["cluster", "status", "--config", str(directory)]
        result = run(*(args + flag if flag_at_end else flag + args))
        assert result.exit_code == 3, result.output  # status: that endpoint refused the token
        assert "UNAUTHENTICATED" in result.stdout


def test_without_a_token_in_the_config_dir_the_environment_still_counts(
    configured: tuple[Path, ThreadedFakeNode],
) -> None:
    # A client host's copy of cluster.toml, without the cluster's secrets: the exported token
    # is the only one there is.
    directory, node = configured
    admin = directory / "secrets" / "admin.token"
    kept = directory.parent / "admin.token.kept"
    admin.rename(kept)
    result = run(
        "cluster", "status", "--config", str(directory), env={"METASTORE_TOKEN_FILE": str(kept)}
    )
    assert result.exit_code == 0, result.output
    assert sent(node) == [("status", {})]


def _ready_leader(node_id: int) -> Any:
    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "status", op
        return {
            "node_id": node_id,
            "role": "leader",
            "term": 1,
            "leader": node_id,
            "commit_index": 1,
            "applied_index": 1,
            "ready": True,
            "initialized": True,
        }

    return handler


@pytest.fixture
def up_with_stand_in_nodes(
    configured: tuple[Path, ThreadedFakeNode], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, ThreadedFakeNode]]:
    """`cluster up --config DIR` whose node is a sleeping stand-in process (killed by its PID at
    the end) and whose client port is a fake node that answers `status` as a ready leader to
    DIR's admin token only."""
    directory, _ = configured
    admin = read_token_file(directory / "secrets" / "admin.token")
    stand_ins: list[int] = []
    real_start_node = processes.start_node

    def start_stand_in(node_id: int, command: list[str], **kwargs: Any) -> Any:
        started = real_start_node(
            node_id, [sys.executable, "-c", "import time; time.sleep(600)"], **kwargs
        )
        stand_ins.append(started.pid)
        return started

    monkeypatch.setattr(processes, "start_node", start_stand_in)
    # The fake node holds the client port `cluster up` would find taken.
    monkeypatch.setattr(processes, "taken_ports", lambda _nodes: [])
    with ThreadedFakeNode(handler=_ready_leader(1), tokens=frozenset({admin})) as node:
        toml = directory / "cluster.toml"
        config = load_cluster_config(toml)
        text = toml.read_text()
        old_port = f"client_port = {config.node(1).client_port}"
        toml.write_text(text.replace(old_port, f"client_port = {node.endpoint.rsplit(':', 1)[1]}"))
        try:
            yield directory, node
        finally:
            for pid in stand_ins:
                with contextlib.suppress(ProcessLookupError):  # it stopped (a failed test)
                    os.kill(pid, signal.SIGKILL)
            for pid in stand_ins:
                with contextlib.suppress(ChildProcessError):  # reaped already
                    os.waitpid(pid, 0)


def test_cluster_up_waits_with_the_clusters_own_admin_token(
    up_with_stand_in_nodes: tuple[Path, ThreadedFakeNode], other_clusters_token_file: Path
) -> None:
    directory, node = up_with_stand_in_nodes
    env = {"METASTORE_TOKEN_FILE": str(other_clusters_token_file)}
    result = run("cluster", "up", "--config", str(directory), "--wait-ms", "5000", env=env)
    assert result.exit_code == 0, result.output
    assert [op for op, _ in sent(node)][:1] == ["status"]


def test_cluster_up_with_a_token_flag_uses_that_token(
    up_with_stand_in_nodes: tuple[Path, ThreadedFakeNode], other_clusters_token_file: Path
) -> None:
    directory, node = up_with_stand_in_nodes
    result = run(
        "--token-file", str(other_clusters_token_file),
        "cluster", "up", "--config", str(directory), "--wait-ms", "300",
    )  # fmt: skip
    assert result.exit_code != 0, result.output
    assert "UNAUTHENTICATED" in result.stderr
    assert sent(node) == []


def test_cluster_up_stops_waiting_at_once_when_the_nodes_refuse_its_token(
    up_with_stand_in_nodes: tuple[Path, ThreadedFakeNode], other_clusters_token_file: Path
) -> None:
    # A node reads its tokens at start: an UNAUTHENTICATED answer will not change by waiting.
    directory, _node = up_with_stand_in_nodes
    began = time.monotonic()
    result = run(
        "--token-file", str(other_clusters_token_file),
        "cluster", "up", "--config", str(directory), "--wait-ms", "60000",
    )  # fmt: skip
    assert time.monotonic() - began < 30, result.output
    assert result.exit_code == 6, result.output
    first = result.stderr.splitlines()[-1]
    assert first.startswith("Error: UNAUTHENTICATED: "), result.stderr
    assert str(other_clusters_token_file) in first  # which token was refused
    assert "cluster down --config" in first  # the stand-in runs: how to stop it


# ---- 2. snapshot save into a directory that does not exist ------------------------------------


def test_snapshot_save_into_a_missing_directory_names_it_before_any_request(
    tmp_path: Path,
) -> None:
    # docs/operations.md saves to /backups/...: on a host without that directory yet.
    with ThreadedFakeNode() as node:
        target = tmp_path / "backups" / "catalog.snap"
        result = against(node, "snapshot", "save", str(target))
    assert result.exit_code == 2, result.output
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("Error: ")]
    assert line.startswith("Error: USAGE: "), result.stderr
    assert f"{target.parent} does not exist" in line
    assert ".partial" not in line  # the file the user named, not an internal one
    assert sent(node) == []
    assert result.stdout == ""
    assert not (tmp_path / "backups").exists()  # nothing made


def test_snapshot_save_from_a_data_dir_into_a_missing_directory_too(tmp_path: Path) -> None:
    target = tmp_path / "backups" / "survivor.snap"
    data_dir = tmp_path / "data" / "node-1"
    data_dir.mkdir(parents=True)
    result = run("snapshot", "save", str(target), "--data-dir", str(data_dir))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: USAGE: "), result.stderr
    assert f"{target.parent} does not exist" in result.stderr.splitlines()[0]


# ---- 3. snapshot save with the quorum lost: the survivor's NOT_READY, not the last refusal -----


def test_snapshot_save_without_a_quorum_reports_the_survivors_answer() -> None:
    # docs/operations.md: with two of three nodes gone "`snapshot save` answers NOT_READY". The
    # survivor is asked first; the last endpoint's "connection refused" hid its answer.
    async def not_ready(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotReadyError("node is not caught up with the current leader yet")

    dead = [dead_endpoint(), dead_endpoint()]
    with ThreadedFakeNode(handler=not_ready) as survivor:
        endpoints = ",".join([survivor.endpoint, *dead])
        result = run(
            "--endpoints", endpoints, "--token", TOKEN, "--timeout-ms", "2000",
            "snapshot", "save", "catalog.snap",
        )  # fmt: skip
    assert result.exit_code == 3, result.output
    line = result.stderr.splitlines()[0]
    assert line.startswith("Error: NOT_READY: "), result.stderr
    assert f"{survivor.endpoint}: NOT_READY: node is not caught up" in line
    assert all(endpoint in line for endpoint in dead)  # and what the others said
    assert not Path("catalog.snap").exists()


# ---- 4. a column type Spark does not have, in CREATE TABLE: named, not "Expecting )" ---------


@pytest.mark.parametrize(
    ("statement", "written"),
    [
        ("CREATE TABLE s.t (id FOO)", "FOO"),
        ("CREATE TABLE s.t (id BIGINTT NOT NULL, amount DECIMAL(10,2))", "BIGINTT"),
        ("CREATE TABLE IF NOT EXISTS s.t (id INT, name STRNG COMMENT 'x')", "STRNG"),
        ("CREATE TABLE s.t (id INT, s STRUCT<a INT, b FOO>)", "FOO"),
        ("CREATE TABLE s.t (a ARRAY<FOO>)", "FOO"),
        ("CREATE TABLE s.t (m MAP<STRING, FOO>)", "FOO"),
        ("ALTER TABLE s.t ADD COLUMN c STRUCT<a FOO>", "FOO"),
        # sqlglot reads these as types Spark has, so the message named those: "unsupported data
        # type TIMESTAMP" for a DATETIME, "... STRING" for a UUID.
        ("CREATE TABLE s.t (id DATETIME)", "DATETIME"),
        ("CREATE TABLE s.t (id UUID NOT NULL)", "UUID"),
        ("ALTER TABLE s.t ADD COLUMN c DATETIME", "DATETIME"),
    ],
)
def test_an_unknown_column_type_is_named_as_written(statement: str, written: str) -> None:
    with pytest.raises(InvalidDdlError) as raised:
        parse_ddl(statement)
    message = raised.value.message
    assert "unsupported data type" in message, message
    assert f"found '{written}'" in message, message
    assert "expected one of" in message and "BIGINT" in message, message
    assert "Expecting" not in message, message


def test_a_statement_that_does_not_parse_for_another_reason_says_so_as_before() -> None:
    with pytest.raises(InvalidDdlError) as raised:
        parse_ddl("CREATE TABLE s.t (id BIGINT")
    assert raised.value.message.startswith("cannot parse statement: "), raised.value.message


# ---- 5. pts protect --ts far in the future: refused, not a protection of nothing --------------


@pytest.mark.parametrize("ts", ["2099-01-01T00:00:00Z", "2062-11-27T10:00:00Z"])
def test_a_protection_from_a_time_still_to_come_is_refused(fake: ThreadedFakeNode, ts: str) -> None:
    # A year typed wrong (2062 for 2026) protected nothing the GC could delete now, and the
    # command said "protected".
    result = against(fake, "pts", "protect", "--ts", ts, "--cluster", "--max-age", "1h")
    assert result.exit_code == 2, result.output
    line = result.stderr.splitlines()[0]
    assert line.startswith("Error: USAGE: Invalid value for '--ts': "), result.stderr
    assert "in the future by" in line
    assert "protects nothing" in line
    assert sent(fake) == []


def test_a_protection_from_now_or_the_past_is_sent() -> None:
    with ThreadedFakeNode(handler=protect_handler) as node:
        for ts in ("now", "-1h", "2026-01-01T00:00:00Z"):
            result = against(node, "pts", "protect", "--ts", ts, "--cluster")
            assert result.exit_code == 0, result.output
        assert [op for op, _ in sent(node)] == ["pts_protect"] * 3


# ---- 6. the runbook's commands show an example in --help, and every example parses -------------

# What docs/operations.md and the README have a user run with options worth copying.
COMMANDS_WITH_EXAMPLES = [
    ["pts", "protect"],
    ["snapshot", "save"],
    ["snapshot", "restore"],
    ["table", "describe"],
    ["table", "read"],
    ["table", "files"],
    ["watch"],
    ["cluster", "add-node"],
    ["cluster", "up"],
]


def _examples(help_text: str) -> list[list[str]]:
    lines = help_text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() in ("Example:", "Examples:")]
    examples: list[list[str]] = []
    for start in starts:
        for line in lines[start + 1 :]:
            if not line.strip().startswith("metastore "):
                break
            examples.append(shlex.split(line.strip())[1:])
    return examples


@pytest.mark.parametrize("command", COMMANDS_WITH_EXAMPLES, ids=" ".join)
def test_the_runbooks_commands_have_an_example(command: list[str]) -> None:
    examples = _examples(run(*command, "--help").stdout)
    assert examples, f"no example in `metastore {' '.join(command)} --help`"
    assert all(example[: len(command)] == command for example in examples), examples


def _all_commands(group: click.Group, prefix: list[str]) -> Iterator[list[str]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _all_commands(command, [*prefix, name])
        else:
            yield [*prefix, name]


def test_every_example_in_help_parses() -> None:
    # An example is copied as is: its options must exist and its values be accepted. Each runs
    # with --help last, which click answers only once the line before it has parsed.
    checked = 0
    for command in [[], *_all_commands(cli, [])]:
        for example in _examples(run(*command, "--help").stdout):
            result = run(*example, "--help")
            assert result.exit_code == 0, (example, result.output)
            checked += 1
    assert checked >= 10


# ---- 7. a first start refused for a port in use leaves the data directory as it was ----------


@pytest.mark.parametrize("which", ["raft_port", "client_port", "metrics_port"])
def test_a_first_start_on_a_port_in_use_leaves_no_state_behind(tmp_path: Path, which: str) -> None:
    # It wrote the node's IDENTITY before it found the port taken: the next `cluster up` then
    # saw one node with state among nodes without and refused (NOT_BOOTSTRAPPED) until each of
    # the others was named with --bootstrap.
    config = write_cluster(tmp_path)
    settings = load_node_config(config, 1)
    with occupied(getattr(settings.node, which)):
        done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "ADDRESS_IN_USE")
    assert not processes.node_has_state(settings.data_dir), sorted(
        p.name for p in settings.data_dir.rglob("*")
    )


# ---- 8. a typo in NS.TABLE outside `table`: said as `table describe` says it -------------------

OTHER_TABLE_COMMANDS = [
    ["lease", "list"],
    ["lease", "blockers"],
    ["gc", "status"],
    ["gc", "run", "--dry-run"],
    ["job", "list"],
]


@pytest.mark.parametrize("command", OTHER_TABLE_COMMANDS, ids=" ".join)
def test_a_typo_in_the_namespace_is_named_by_every_table_command(command: list[str]) -> None:
    with _catalog(CATALOG) as node:
        result = against(node, *command, "slaes.orders")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: NAMESPACE_NOT_FOUND: namespace slaes does not exist"), first
    assert "did you mean sales?" in first, first


@pytest.mark.parametrize("command", OTHER_TABLE_COMMANDS, ids=" ".join)
def test_a_typo_in_the_table_is_named_by_every_table_command(command: list[str]) -> None:
    with _catalog(CATALOG) as node:
        result = against(node, *command, "sales.ordres")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert "did you mean sales.orders?" in first, first


# ---- 9. table list NS --as-of before NS was created: not "did you mean NS?" -------------------


def test_table_list_before_the_namespace_existed_does_not_suggest_the_same_name() -> None:
    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "list_namespaces":
            return {"namespaces": [{"name": "sales", "comment": None, "properties": {}}]}
        if op == "list_tables" and args.get("as_of") is not None:
            raise NamespaceNotFoundError(
                "namespace sales does not exist at 2026-11-26T22:00:00.000Z",
                details={"namespace": "sales"},
            )
        raise AssertionError(f"unexpected {op} {args}")

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "table", "list", "SALES", "--as-of", "-1d")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: NAMESPACE_NOT_FOUND: namespace sales does not exist at "), first
    assert "did you mean" not in first, first
    assert "exists now" in first and "later --as-of" in first, first


# ---- 10. -o json: an error is parsable too --------------------------------------------------


def _json_error(result: Any) -> dict[str, Any]:
    """The error document of a failed `-o json` command: stderr's first line is still the
    `Error: CODE: message` line; the next is one JSON document; stdout stays empty."""
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert lines[0].startswith("Error: "), result.stderr
    doc = json.loads(lines[1])
    assert set(doc) == {"error"}, doc
    error: dict[str, Any] = doc["error"]
    assert lines[0] == f"Error: {error['code']}: {error['message']}", (lines[0], error)
    assert error["exit_code"] == result.exit_code
    return error


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_json_command_that_fails_prints_its_error_as_json(where: str) -> None:
    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise TableNotFoundError("table a.b does not exist", details={"table": "a.b"})

    with ThreadedFakeNode(handler=handler) as node:
        args = ["table", "history", "a.b"]
        json_flag = ["-o", "json"]
        result = against(node, *(json_flag + args if where == "before" else args + json_flag))
    assert result.exit_code == 4
    error = _json_error(result)
    assert error["code"] == "TABLE_NOT_FOUND"
    assert error["details"]["table"] == "a.b"
    assert "Details:" not in result.stderr  # said once, in the document


def test_a_json_usage_error_and_a_cli_error_are_json_too(tmp_path: Path) -> None:
    with ThreadedFakeNode() as node:
        usage = against(node, "-o", "json", "table", "read", "a.b", "--limit", "-1")
        missing_dir = against(node, "-o", "json", "snapshot", "save", str(tmp_path / "x" / "f"))
    assert usage.exit_code == 2
    assert _json_error(usage)["code"] == "USAGE"
    assert missing_dir.exit_code == 2
    assert _json_error(missing_dir)["code"] == "USAGE"


def test_without_json_an_error_stays_text_only() -> None:
    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise TableNotFoundError("table a.b does not exist", details={"table": "a.b"})

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "table", "history", "a.b")
    assert result.exit_code == 4
    assert "{" not in result.stderr


# ---- 11. cluster up --wait DURATION, like every other --wait ---------------------------------


def test_cluster_up_takes_wait_as_a_duration_like_the_other_waits(
    up_with_stand_in_nodes: tuple[Path, ThreadedFakeNode],
) -> None:
    # `promote-node --wait 10m`, `sql --wait 5m`, `job cancel --wait 1m`: `cluster up --wait
    # 60s` was "No such option '--wait'".
    directory, node = up_with_stand_in_nodes
    result = run("cluster", "up", "--config", str(directory), "--wait", "20s")
    assert result.exit_code == 0, result.output
    assert [op for op, _ in sent(node)][:1] == ["status"]
    assert "--wait DURATION" in run("cluster", "up", "--help").stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--wait", "5s", "--wait-ms", "5000"], "pass one"),
        (["--wait", "11m"], "longer than"),
        (["--wait", "soon"], "not a duration"),
    ],
)
def test_cluster_up_wait_is_checked(tmp_path: Path, args: list[str], says: str) -> None:
    directory = tmp_path / "c"
    assert run("cluster", "init", str(directory), "--nodes", "1").exit_code == 0
    result = run("cluster", "up", "--config", str(directory), *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: USAGE: "), result.stderr
    assert says in result.stderr.splitlines()[0]
    assert not (directory / "data").exists() or not any((directory / "data").rglob("node.pid"))


# ---- 12. no endpoints: a command that takes --config says so ------------------------------------


@pytest.mark.parametrize("command", [["cluster", "status"], ["safe-time"], ["cluster", "version"]])
def test_no_endpoints_names_config_where_the_command_takes_it(command: list[str]) -> None:
    # Run from outside the repository after `cluster init /tmp/ms`: the way out is --config.
    result = run(*command)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: NO_ENDPOINTS: "), first
    assert "--config DIR" in first, first


def test_no_endpoints_does_not_offer_config_where_the_command_lacks_it() -> None:
    result = run("table", "list")
    assert result.exit_code == 2, result.output
    assert "--config" not in result.stderr.splitlines()[0]


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["-o", "json", "--timeout-ms", "0", "table", "list"], None),
        (["--output=json", "--timeout-ms", "0", "table", "list"], None),
        (["--timeout-ms", "0", "table", "list"], {"METASTORE_OUTPUT": "json"}),
    ],
)
def test_a_usage_error_in_the_global_options_is_json_too(
    args: list[str], env: dict[str, str] | None
) -> None:
    result = run(*args, env=env)
    assert result.exit_code == 2, result.output
    assert _json_error(result)["code"] == "USAGE"


def test_snapshot_save_where_no_file_can_be_made_names_the_file_given() -> None:
    # /proc exists but takes no new files (as a read-only mount or a directory without write
    # permission): the error named FILE.partial, a file the user never mentioned.
    with ThreadedFakeNode() as node:
        result = against(node, "snapshot", "save", "/proc/catalog.snap")
        assert sent(node) == []
    assert result.exit_code == 1, result.output
    line = result.stderr.splitlines()[0]
    assert line.startswith("Error: IO_ERROR: cannot write /proc/catalog.snap"), line
    assert ".partial" not in line
    assert line.endswith("No such file or directory (ENOENT); nothing was written"), line
