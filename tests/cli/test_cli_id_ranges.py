"""Ids past what any node takes are usage errors (exit 2, one line, nothing sent): a node id
above NODE_ID_MAX (no node's config can have it: `cluster add-node` already refused it), an
apply version above MAX_APPLY_VERSION, a job id above 2**63 - 1. They reached the client
library, which could not encode the larger ones ("remove_node arguments cannot be sent:
cannot encode dict as msgpack: Integer value out of range", exit 5) and sent the others for
the node to refuse."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from metastore.apply_version import MAX_APPLY_VERSION
from metastore.daemon.config import NODE_ID_MAX
from tests.client.fake_node import TOKEN, ThreadedFakeNode


async def never(op: str, args: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError(f"nothing should be sent, got {op} {args}")


@pytest.fixture
def fake() -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=never) as node:
        yield node


TOO_BIG = [str(NODE_ID_MAX + 1), str(2**64)]
COMMANDS: list[list[str]] = [
    *(["cluster", "remove-node", n] for n in TOO_BIG),
    *(["cluster", "promote-node", n] for n in TOO_BIG),
    *(["cluster", "transfer-leader", n] for n in TOO_BIG),
    *(["cluster", "revoke-cert", "--fingerprint", "ab" * 32, "--node-id", n] for n in TOO_BIG),
    ["cluster", "version", "--finalize", "--to", str(MAX_APPLY_VERSION + 1)],
    ["cluster", "version", "--finalize", "--to", str(2**64)],
    ["job", "run-backfill", str(2**63)],
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_an_id_out_of_range_is_a_usage_error(fake: ThreadedFakeNode, args: list[str]) -> None:
    result = CliRunner().invoke(
        cli, ["--endpoints", fake.endpoint, "--token", TOKEN, *args], prog_name="metastore"
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: USAGE: Invalid value for"), result.stderr
    assert "is not in the range" in first, result.stderr
    assert "Traceback" not in result.output
    assert not [op for _, op, _ in fake.node.requests if op != "hello"]
