"""Inconsistencies a reviewer left after walking the CLI as a new user, each pinned by a test:
a `metastore sql` statement that starts with a `-- comment` is the statement, not an option;
every `cluster` subcommand that talks to a cluster takes `--config DIR`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cli.cluster import cluster
from cli.context import _set_config_dir
from tests.cli.test_cli import RESULTS, _isolated_cwd, against, fake, run, sent
from tests.cli.test_cli_fourth_look import other_clusters_token_file
from tests.cli.test_cli_second_look import configured
from tests.client.fake_node import ThreadedFakeNode

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
