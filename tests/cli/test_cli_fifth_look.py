"""Inconsistencies a reviewer left after walking the CLI as a new user, each pinned by a test:
a `metastore sql` statement that starts with a `-- comment` is the statement, not an option;
every `cluster` subcommand that talks to a cluster takes `--config DIR`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cli.test_cli import _isolated_cwd, against, fake, sent
from tests.client.fake_node import ThreadedFakeNode

__all__ = ["_isolated_cwd", "fake"]  # fixtures used by name


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
