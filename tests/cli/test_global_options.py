"""Global flags after the sub-command (`metastore table list -o json`, as etcdctl accepts its
persistent flags anywhere) and `metastore table list` without a namespace (every table)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from cli.main import GLOBAL_OPTION_FIELDS, cli
from metastore.client.protocol import NAMESPACES_PAGE_LIMIT
from tests.client.fake_node import TOKEN, ThreadedFakeNode

TABLES = {"tables": ["ads.clicks", "sales.orders", "sales.refunds"]}


async def canned(op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op == "list_tables":
        if args.get("namespace") == "sales":
            return {"tables": TABLES["tables"][1:]}
        return TABLES
    if op == "list_namespaces":
        return {"namespaces": [{"name": "sales", "comment": None, "properties": {}}]}
    raise AssertionError(f"unexpected op {op}")


@pytest.fixture
def fake() -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=canned) as node:
        yield node


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(cli, list(args), env=env, prog_name="metastore")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def sent(node: ThreadedFakeNode) -> list[tuple[str, dict[str, Any]]]:
    return [(op, a) for _, op, a in node.node.requests]


def test_output_flag_after_the_subcommand(fake: ThreadedFakeNode) -> None:
    result = run("--endpoints", fake.endpoint, "--token", TOKEN, "table", "list", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tables"] == TABLES["tables"]


def test_every_global_flag_after_the_subcommand(fake: ThreadedFakeNode) -> None:
    args = ["--endpoints", fake.endpoint, "--token", TOKEN, "--timeout-ms", "4000", "-o", "json"]
    result = run("table", "list", "sales", *args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tables"] == ["sales.orders", "sales.refunds"]
    assert sent(fake) == [("list_tables", {"namespace": "sales", "limit": 5000})]


def test_between_group_and_command(fake: ThreadedFakeNode) -> None:
    result = run("table", "--endpoints", fake.endpoint, "--token", TOKEN, "-o", "json", "list")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tables"] == TABLES["tables"]


def test_token_file_after_the_subcommand(fake: ThreadedFakeNode, tmp_path: Any) -> None:
    token_file = tmp_path / "t.token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    result = run("ns", "list", "--endpoints", fake.endpoint, "--token-file", str(token_file))
    assert result.exit_code == 0, result.output
    assert sent(fake) == [("list_namespaces", {"limit": NAMESPACES_PAGE_LIMIT})]  # it pages


def test_a_flag_after_the_subcommand_beats_the_one_before_and_the_environment(
    fake: ThreadedFakeNode,
) -> None:
    base = ["--endpoints", fake.endpoint, "--token", TOKEN]
    as_table = run(*base, "-o", "json", "table", "list", "-o", "table")
    assert as_table.exit_code == 0, as_table.output
    assert "sales.orders" in as_table.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(as_table.stdout)
    from_env = run(*base, "table", "list", "-o", "table", env={"METASTORE_OUTPUT": "json"})
    with pytest.raises(json.JSONDecodeError):
        json.loads(from_env.stdout)
    # Not given after the sub-command: the environment's value stands.
    env_only = run(*base, "table", "list", env={"METASTORE_OUTPUT": "json"})
    assert json.loads(env_only.stdout)["tables"] == TABLES["tables"]


def test_endpoints_after_the_subcommand_replace_the_ones_before(fake: ThreadedFakeNode) -> None:
    # Port 9 (discard) is not listening: only the later --endpoints can answer.
    result = run(
        "--endpoints",
        "127.0.0.1:9",
        "--token",
        TOKEN,
        "table",
        "list",
        "--endpoints",
        fake.endpoint,
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "bad",
    [
        ["-o", "yaml"],
        ["--timeout-ms", "0"],
        ["--timeout-ms", "x"],
        ["--endpoints", "nohost"],
        ["--endpoints", "127.0.0.1:99999"],
    ],
)
def test_bad_global_values_after_the_subcommand_are_usage_errors(
    fake: ThreadedFakeNode, bad: list[str]
) -> None:
    # A malformed --endpoints exited 5 ("refused change or invalid DDL"), so a script took a
    # typo in its own flags for the cluster refusing its change: it is a usage error (2).
    result = run("--endpoints", fake.endpoint, "--token", TOKEN, "table", "list", *bad)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("Error:") == 1
    assert sent(fake) == []


def test_table_list_without_a_namespace_lists_every_table(fake: ThreadedFakeNode) -> None:
    result = run("--endpoints", fake.endpoint, "--token", TOKEN, "table", "list")
    assert result.exit_code == 0, result.output
    for name in TABLES["tables"]:
        assert name in result.stdout
    assert sent(fake) == [("list_tables", {"limit": 5000})]
    as_of = run("--endpoints", fake.endpoint, "--token", TOKEN, "table", "list", "--as-of", "42")
    assert as_of.exit_code == 0, as_of.output
    assert sent(fake)[-1] == ("list_tables", {"limit": 5000, "as_of": 42})


def _commands(group: click.Group, prefix: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    for name, command in group.commands.items():
        yield [*prefix, name], command
        if isinstance(command, click.Group):
            yield from _commands(command, [*prefix, name])


def test_every_command_accepts_every_global_option() -> None:
    root = {opt for p in cli.params if p.name in GLOBAL_OPTION_FIELDS for opt in p.opts}
    assert root == {"--endpoints", "--token", "--token-file", "-o", "--output", "--timeout-ms"}
    for path, command in _commands(cli, []):
        accepted = {opt for p in command.params for opt in p.opts}
        assert root <= accepted, (path, root - accepted)


def test_no_option_of_a_command_shares_a_name_with_another() -> None:
    # Click keys parsed values by parameter name: `job run-backfill --timeout` (named
    # timeout_ms) was read by the hidden copy of the global --timeout-ms too, and its value
    # ('30s') refused as "not a valid integer range".
    for path, command in _commands(cli, []):
        names = [p.name for p in command.params]
        assert len(names) == len(set(names)), (path, names)


def test_a_malformed_snapshot_endpoint_is_a_usage_error(
    fake: ThreadedFakeNode, tmp_path: Any
) -> None:
    # Like --endpoints: a typo in the flag exited 5, as if the cluster had refused the backup.
    out = tmp_path / "b.snap"
    result = run(
        "--endpoints", fake.endpoint, "--token", TOKEN, "snapshot", "save", str(out),
        "--endpoint", "garbage",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: USAGE: --endpoint: endpoint 'garbage' ")
    assert sent(fake) == [] and list(tmp_path.iterdir()) == []
