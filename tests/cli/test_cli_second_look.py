"""Rough edges an experienced engineer hits after the first-use review, each pinned by a test:
an unknown id is a typed error (as etcdctl's "lease not found"), a malformed table name is a
usage error before any request, a timestamp far in the future is not "retry later", table
cells do not wrap, `snapshot save` does not overwrite, `cluster status --config DIR`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli.test_cli import _isolated_cwd, against, fake, run, sent
from tests.client.fake_node import ThreadedFakeNode

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
