"""Rough edges a first-time user hits, each pinned by a test: bad flags, a wrong or missing token
and out-of-range durations each give one `Error: CODE: message` line (the first line on stderr,
as README promises) with an exit code of the documented kind, and name the flag at fault."""

from __future__ import annotations

import pytest

from tests.cli.test_cli import _isolated_cwd, against, fake, run, sent
from tests.client.fake_node import ThreadedFakeNode

__all__ = ["_isolated_cwd", "fake"]  # fixtures used by name


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["table", "describe", "a.b", "--as-of", "yesterday"], "--as-of"),
        (["table", "read", "a.b", "--limit", "-1"], "--limit"),
        (["txn", "log", "--limit", "abc"], "--limit"),
        (["job", "show", "abc"], "JOB_ID"),
        (["table", "describe"], "NS.TABLE"),
        (["table", "nosuch"], "nosuch"),
        (["--timeout-ms", "0", "ns", "list"], "--timeout-ms"),
        (["-o", "yaml", "ns", "list"], "--output"),
    ],
)
def test_a_usage_error_is_one_error_line_first(
    fake: ThreadedFakeNode, args: list[str], names: str
) -> None:
    result = against(fake, *args)
    assert result.exit_code == 2, result.output
    first, *rest = result.stderr.splitlines()
    # Scripts read the first stderr line as `Error: CODE: message`, as for every other error.
    assert first.startswith("Error: USAGE: "), result.stderr
    assert names in first
    # The usage and the pointer to --help still follow.
    assert any(line.startswith("Try 'metastore") for line in rest), result.stderr
    assert sent(fake) == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["sql", "ALTER TABLE a.b DROP COLUMN c", "--wait", "abc"], "--wait"),
        (["sql", "ALTER TABLE a.b DROP COLUMN c", "--wait", "25h"], "--wait"),
        (["job", "wait", "1", "--timeout", "5 min"], "--timeout"),
        (["job", "cancel", "1", "--wait", "-5s"], "--wait"),
        (["cluster", "promote-node", "4", "--wait", "abc"], "--wait"),
    ],
)
def test_a_bad_wait_duration_names_its_flag(
    fake: ThreadedFakeNode, args: list[str], flag: str
) -> None:
    result = against(fake, *args)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Error: USAGE: Invalid value for '{flag}': "), result.stderr
    assert sent(fake) == []


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["sql"], "--wait"),
        (["job", "wait"], "--timeout"),
        (["job", "cancel"], "--wait"),
        (["cluster", "promote-node"], "--wait"),
    ],
)
def test_wait_durations_show_as_durations_in_help(command: list[str], flag: str) -> None:
    result = run(*command, "--help")
    assert result.exit_code == 0
    assert f"{flag} DURATION" in result.stdout, result.stdout
