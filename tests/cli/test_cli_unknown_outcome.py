"""What the CLI tells its user when a write's outcome is unknown, or when it was not applied.

A keyed write (`sql`, `ns create|drop`, `cluster revoke-cert`) whose outcome is unknown said
"retry with the same request_id '...'", the library's words: the CLI picked a random id per
run and `ns create` / `revoke-cert` had no way to send one. Now each has `--request-id`, and
the error names the exact flag and value to run the same command with; that run sends the same
id (the cluster answers the first attempt's result, deduplicated). A write cut by the deadline
before it left the client says it was not applied. Fake nodes on loopback; bounded waits."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.errors import EXIT_UNAVAILABLE
from cli.main import cli
from tests.client.fake_node import TOKEN, DropConnection, ThreadedFakeNode

FP = "ab" * 32
# The same command, and the op and argument that must come back the same on a second run.
COMMANDS: list[tuple[list[str], str]] = [
    (["sql", "CREATE NAMESPACE sales"], "ddl"),
    (["ns", "create", "sales"], "ddl"),
    (["ns", "drop", "sales"], "ddl"),
    (["cluster", "revoke-cert", "--fingerprint", FP], "cert_revoke"),
]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("METASTORE_"):
            monkeypatch.delenv(name)


def run(endpoint: str, *args: str, timeout_ms: int = 1500) -> Result:
    return CliRunner().invoke(
        cli,
        ["--endpoints", endpoint, "--token", TOKEN, "--timeout-ms", str(timeout_ms), *args],
        prog_name="metastore",
    )


@pytest.fixture
def flaky() -> Iterator[tuple[ThreadedFakeNode, dict[str, bool]]]:
    """A node that drops every connection after a write arrived (its outcome unknown) until
    the test sets `answer`; then it answers as a node that applied it."""
    mode = {"answer": False}

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if not mode["answer"]:
            raise DropConnection
        return {"deduplicated": True, "request_id": args.get("request_id")}

    with ThreadedFakeNode(handler=handler) as node:
        yield node, mode


@pytest.mark.parametrize(("args", "op"), COMMANDS, ids=[" ".join(a[:2]) for a, _ in COMMANDS])
def test_an_unknown_outcome_names_the_command_to_settle_it(
    flaky: tuple[ThreadedFakeNode, dict[str, bool]], args: list[str], op: str
) -> None:
    node, mode = flaky
    first = run(node.endpoint, *args)
    assert first.exit_code == EXIT_UNAVAILABLE, first.output
    found = re.search(r"run the same command again with --request-id (\S+) ", first.stderr)
    assert found, first.stderr
    rid = found.group(1)
    sent_ids = {a["request_id"] for _, o, a in node.node.requests if o == op}
    assert sent_ids == {rid}, (sent_ids, first.stderr)
    assert "deduplicated: true" in first.stderr and "retry with the same" not in first.stderr

    mode["answer"] = True
    before = len(node.node.requests)
    second = run(node.endpoint, *args, "--request-id", rid)
    assert second.exit_code == 0, second.output
    assert [(o, a["request_id"]) for _, o, a in node.node.requests[before:]] == [(op, rid)]


def test_a_write_cut_while_connecting_says_it_was_not_applied() -> None:
    """A node that accepts TCP and never answers hello (the CLI's deadline, 300 ms, passes
    first): "its outcome is unknown" sent the user looking for a change that cannot exist."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(8)  # the kernel completes the handshake; nothing ever reads or answers
        endpoint = f"127.0.0.1:{held.getsockname()[1]}"
        result = run(endpoint, "cluster", "revoke-cert", "--fingerprint", FP, timeout_ms=300)
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert "Error: TIMEOUT:" in result.stderr
    assert "it was not applied (its request never left this client)" in result.stderr
    assert "repeating it is safe" in result.stderr
    assert "outcome is unknown" not in result.stderr and "--request-id" not in result.stderr


def test_a_membership_change_not_applied_is_not_called_unknown() -> None:
    """`cluster add-node|remove-node|...` turned every TIMEOUT into "may still take effect ...
    check `metastore cluster status` before running it again", a deadline that passed before
    the request left the client too."""
    from cli.cluster import _membership_change
    from metastore.errors import NotAppliedTimeoutError

    def cut() -> dict[str, Any]:
        raise NotAppliedTimeoutError(
            "remove_node did not complete within 300 ms; it was not applied",
            details={"not_applied": True},
        )

    with pytest.raises(NotAppliedTimeoutError) as raised:
        _membership_change("removal", 3, cut)
    assert "may still take effect" not in raised.value.message
