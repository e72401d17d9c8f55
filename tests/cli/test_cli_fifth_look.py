"""Inconsistencies a reviewer left after walking the CLI as a new user, each pinned by a test:
a `metastore sql` statement that starts with a `-- comment` is the statement, not an option;
every `cluster` subcommand that talks to a cluster takes `--config DIR`. And two claims checked
and pinned as they stand: Ctrl-C ends every waiting command with one line and exit 1, and with
the quorum lost the UNAVAILABLE error carries the survivor's NOT_READY (docs/operations.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cli.cluster import cluster
from cli.context import _set_config_dir
from cli.errors import EXIT_GENERIC, EXIT_UNAVAILABLE
from metastore.errors import NotReadyError
from tests.cli.test_cli import RESULTS, _isolated_cwd, against, fake, run, sent
from tests.cli.test_cli_fourth_look import other_clusters_token_file
from tests.cli.test_cli_interrupt import NOISE, interrupted
from tests.cli.test_cli_second_look import configured
from tests.client.fake_node import TOKEN, ThreadedFakeNode
from tests.client.test_client import dead_endpoint

__all__ = ["_isolated_cwd", "configured", "fake", "other_clusters_token_file"]  # fixtures


def canned_result(op: str) -> dict[str, Any]:
    return RESULTS[op]


def _async(
    handler: Callable[[str, dict[str, Any]], dict[str, Any]],
) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]:
    async def answer(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return handler(op, args)

    return answer


# ---- 1. a statement that starts with "-" (a leading SQL comment) ------------------------------

COMMENTED = "-- add the note column\nALTER TABLE sales.orders ADD COLUMN note STRING"


def _ddl_sent(node: ThreadedFakeNode) -> list[dict[str, Any]]:
    return [args for op, args in sent(node) if op == "ddl"]


@pytest.mark.parametrize(
    "words",
    [
        [COMMENTED],
        [COMMENTED, "--request-id", "r1"],
        ["--request-id", "r1", COMMENTED],
        ["--no-follow", COMMENTED, "-o", "json"],
        ["--wait=0", COMMENTED],
        ["--", COMMENTED],
        ["-- one line\n-- and another\nALTER TABLE sales.orders ADD COLUMN note STRING"],
        ["--comment without a space\nALTER TABLE sales.orders ADD COLUMN note STRING"],
    ],
)
def test_a_statement_starting_with_a_comment_is_the_statement(
    fake: ThreadedFakeNode, words: list[str]
) -> None:
    result = against(fake, "sql", *words)
    assert result.exit_code == 0, result.output
    [statement] = [w for w in words if w.startswith("--") and "\n" in w]
    [ddl] = _ddl_sent(fake)
    assert ddl["sql"] == statement
    if "r1" in words:
        assert ddl["request_id"] == "r1"


def test_an_option_value_that_starts_with_a_dash_stays_the_options(fake: ThreadedFakeNode) -> None:
    # `--request-id -- x` : click gives the word after an option that takes a value to it.
    result = against(fake, "sql", "--request-id", "-- id", "ALTER TABLE a.b ADD COLUMN c INT")
    assert result.exit_code == 0, result.output
    [ddl] = _ddl_sent(fake)
    assert ddl == {"sql": "ALTER TABLE a.b ADD COLUMN c INT", "request_id": "-- id"}


@pytest.mark.parametrize("typo", ["--wiat", "--wiat=5s", "-x"])
def test_a_misspelled_option_is_still_refused_by_name(fake: ThreadedFakeNode, typo: str) -> None:
    result = against(fake, "sql", typo, "ALTER TABLE a.b ADD COLUMN c INT")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: USAGE: No such option"), result.stderr
    assert typo.split("=")[0] in result.stderr.splitlines()[0]
    assert sent(fake) == []


def test_a_statement_of_only_a_comment_line_without_a_space_reads_as_an_option(
    fake: ThreadedFakeNode,
) -> None:
    # `--note` alone is an option's shape: a misspelled flag is the likelier meaning.
    result = against(fake, "sql", "--note")
    assert result.exit_code == 2, result.output
    assert sent(fake) == []


# ---- 3. every cluster subcommand that talks to a cluster takes --config DIR -------------------

# The subcommands that manage local files and processes, not a running cluster's answers: their
# --config (if any) is the directory they work on, not where to talk.
LOCAL_ONLY = {"init", "certs", "up", "down"}
FINGERPRINT = "ab" * 32


def _membership_or_revoke(op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op == "cert_revoke":
        return {"fingerprint": FINGERPRINT, "revoked": True}
    return canned_result(op)


@pytest.mark.parametrize(
    ("words", "op"),
    [
        (["promote-node", "2"], "promote_node"),
        (["remove-node", "2"], "remove_node"),
        (["transfer-leader", "2"], "transfer_leader"),
        (["revoke-cert", "--fingerprint", FINGERPRINT, "--node-id", "2"], "cert_revoke"),
        (["add-node", "2", "127.0.0.1:24102"], "add_node"),
        (["status"], "status"),
        (["version"], "apply_version"),
    ],
)
def test_cluster_subcommands_talk_to_the_cluster_of_config_dir(
    configured: tuple[Path, ThreadedFakeNode],
    other_clusters_token_file: Path,
    words: list[str],
    op: str,
) -> None:
    # Right after `cluster up --config DIR`, with another cluster's token still exported: DIR's
    # endpoints and admin token, as `cluster status --config DIR` takes them.
    directory, node = configured
    node.node.handler = _async(_membership_or_revoke)
    env = {"METASTORE_TOKEN_FILE": str(other_clusters_token_file)}
    result = run("cluster", *words, "--config", str(directory), env=env)
    assert result.exit_code == 0, result.output
    assert [o for o, _ in sent(node)] == [op]


def test_every_cluster_subcommand_that_talks_to_a_cluster_offers_config() -> None:
    for name, command in cluster.commands.items():
        if name in LOCAL_ONLY:
            continue
        [option] = [p for p in command.params if "--config" in p.opts]
        assert option.callback is _set_config_dir, name  # the meaning status gives it


# ---- Ctrl-C: every command that waits ends as any interrupted command does -------------------

# The convention here is exit 1 and click's one line "Aborted!" (tests/cli/test_cli_interrupt.py;
# `watch` says where to resume instead, `cluster up` what it left running), not 130: pinned for
# the commands that wait longest, each interrupted while it waits on the cluster.
WAITING_COMMANDS = [
    ["job", "wait", "1"],
    ["sql", "ALTER TABLE a.b DROP COLUMN c"],
    ["cluster", "promote-node", "2", "--wait", "1m"],
    ["snapshot", "save", "catalog.snap"],
]


@pytest.mark.parametrize("words", WAITING_COMMANDS, ids=" ".join)
def test_ctrl_c_while_a_command_waits_is_one_line_and_exit_1(
    words: list[str], tmp_path: Path
) -> None:
    done = interrupted(*[str(tmp_path / w) if w.endswith(".snap") else w for w in words])
    assert done.returncode == EXIT_GENERIC, done
    assert not any(word in done.stderr for word in NOISE), done.stderr
    assert done.stderr.strip() == "Aborted!", done.stderr


# ---- quorum lost: reads and writes say UNAVAILABLE, carrying the survivor's NOT_READY ---------


@pytest.mark.parametrize("survivor_first", [True, False])
@pytest.mark.parametrize(
    "words", [["ns", "list"], ["table", "describe", "a.b"], ["sql", "CREATE NAMESPACE x"]]
)
def test_without_a_quorum_the_error_carries_the_survivors_not_ready(
    words: list[str], survivor_first: bool
) -> None:
    # docs/operations.md, "Losing quorum": "reads fail (`UNAVAILABLE` on every endpoint: the
    # survivor answers `NOT_READY`, the others refuse the connection)".
    async def not_ready(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotReadyError("node is not caught up with the current leader yet")

    dead = [dead_endpoint(), dead_endpoint()]
    with ThreadedFakeNode(handler=not_ready) as survivor:
        order = [survivor.endpoint, *dead] if survivor_first else [*dead, survivor.endpoint]
        result = run(
            "--endpoints", ",".join(order), "--token", TOKEN, "--timeout-ms", "2000", *words
        )
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    line = result.stderr.splitlines()[0]
    assert line.startswith("Error: UNAVAILABLE: "), result.stderr
    assert f"{survivor.endpoint}: NOT_READY: node is not caught up" in line
    assert all(f"{endpoint}: connection refused" in line for endpoint in dead)
