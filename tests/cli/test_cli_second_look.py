"""Rough edges an experienced engineer hits after the first-use review, each pinned by a test:
an unknown id is a typed error (as etcdctl's "lease not found"), a malformed table name is a
usage error before any request, a timestamp far in the future is not "retry later", table
cells do not wrap, `snapshot save` does not overwrite, `cluster status --config DIR`."""

from __future__ import annotations

import json
from typing import Any

from tests.cli.test_cli import _isolated_cwd, against, sent
from tests.client.fake_node import ThreadedFakeNode

__all__ = ["_isolated_cwd"]  # fixture used by name


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
