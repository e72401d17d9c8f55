"""Fixtures shared by the client's tests against fake nodes (tests/client/fake_node.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.client.fake_node import FakeNode


@pytest.fixture
async def nodes() -> AsyncIterator[Callable[..., Any]]:
    """`await nodes(**kwargs)` starts a FakeNode; every one started is stopped at the end."""
    started: list[FakeNode] = []

    async def make(**kwargs: Any) -> FakeNode:
        node = FakeNode(**kwargs)
        await node.start()
        started.append(node)
        return node

    yield make
    for node in started:
        await node.stop()
