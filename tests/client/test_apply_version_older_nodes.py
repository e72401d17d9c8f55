"""`cluster version` during a rolling upgrade from a release before apply versions.

Found by `make upgrade-check FROM=d9ecdf9`: nodes of that release know no `apply_version` op and
answer UNKNOWN_OP, which the client does not fail over on (the node refused the request as a
node). So `metastore cluster version` (and `--finalize`) failed whenever the first endpoint was
an old node, though another node of the new release could answer, and said only "unknown op"
when every node was old.
"""

from __future__ import annotations

from typing import Any

import pytest

from metastore.errors import UnknownOpError
from tests.client.fake_node import FakeNode, client

pytestmark = pytest.mark.asyncio


async def _old_release(op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op.startswith("apply_version"):
        raise UnknownOpError(f"unknown op {op!r}")
    return {}


async def _new_release(op: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"op": op, "apply_version": 1}


@pytest.mark.parametrize("op", ["apply_version", "finalize_apply_version"])
async def test_a_node_of_a_release_before_apply_versions_is_passed_over(
    nodes: Any,
    op: str,
) -> None:
    old: FakeNode = await nodes(handler=_old_release)
    new: FakeNode = await nodes(handler=_new_release)
    async with client(old.endpoint, new.endpoint) as c:
        result = await getattr(c, op)()
    assert result["apply_version"] == 1
    assert new.ops == [result["op"]]


async def test_when_no_node_knows_apply_versions_the_error_says_why(
    nodes: Any,
) -> None:
    a = await nodes(handler=_old_release)
    b = await nodes(handler=_old_release)
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(UnknownOpError, match="release from before apply versions"):
            await c.apply_version()
