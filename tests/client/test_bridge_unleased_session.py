"""A bridge without leases (`leases=False`) still writes every batch under a metastore session:
the batch's files go to that session's attempt directory, which GC's orphan scan leaves alone
while it lives. Without one, a batch running longer than the orphan grace (1 h) could have its
early files deleted before its commit acknowledged them. The session leases nothing. Pure: the
Spark session and the client are stand-ins."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from metastore.leases import attempt_owners
from spark_bridge.bridge import MetastoreBridge
from spark_bridge.files import new_attempt_dir


@pytest.fixture(autouse=True)
def _stop_keepers() -> Iterator[None]:
    """A bridge registers format("metastore"), which starts a session keeper thread."""
    yield
    from spark_bridge.datasource import stop_session_keepers

    stop_session_keepers()


class _Client:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def session_open(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("session_open", session_id))
        return {"ttl_ms": 40_000, "heartbeat_ms": 60_000}

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        self.calls.append(("session_heartbeat", session_id))
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        self.calls.append(("session_close", session_id))
        return {}

    def close(self) -> None:
        self.calls.append(("close", None))

    def protect(self, ts: int, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("protect", kwargs.get("session_id")))
        return {"record_id": "r-1"}

    def release_protection(self, record_id: str) -> dict[str, Any]:
        self.calls.append(("release_protection", record_id))
        return {}


def _spark() -> Any:
    sc = SimpleNamespace(applicationId="app-1", appName="app", stop=lambda: None)
    return SimpleNamespace(
        conf=SimpleNamespace(set=lambda *a: None, get=lambda key, default=None: default),
        dataSource=SimpleNamespace(register=lambda source: None),
        sparkContext=sc,
    )


def test_a_bridge_without_leases_writes_under_a_session_it_closes() -> None:
    client = _Client()
    bridge = MetastoreBridge(
        _spark(), endpoints=["127.0.0.1:1"], token="t", client=client, leases=False
    )  # type: ignore[arg-type]
    try:
        assert bridge.session is None  # no leases
        (opened,) = [sid for op, sid in client.calls if op == "session_open"]
        owner = bridge.attempt_owner()
        assert owner == opened
        _, rel = new_attempt_dir("/wh/t", "q:1", owner=owner)
        assert attempt_owners(rel.split("/")) == [opened]
    finally:
        bridge.close()
    assert ("session_close", opened) in client.calls


def test_a_bridge_without_leases_owns_its_protections_by_its_session() -> None:
    """`protect()` records are owned by the application's session, so a driver killed inside
    the block has its protection released once its session is gone. Without leases the
    bridge still has a session (`unleased_session`), but protect() looked only at the leasing
    one and created an ownerless record: after a kill -9 it stayed, holding every covered
    table's GC (the whole cluster's, by default) until someone released it by hand."""
    client = _Client()
    bridge = MetastoreBridge(
        _spark(), endpoints=["127.0.0.1:1"], token="t", client=client, leases=False
    )  # type: ignore[arg-type]
    try:
        (opened,) = [sid for op, sid in client.calls if op == "session_open"]
        with bridge.protect(1_800_000_000_000 << 16, meta="backfill"):  # an HLC of 2027
            pass
        assert ("protect", opened) in client.calls
    finally:
        bridge.close()


def test_a_bridge_takes_its_endpoints_as_metastore_endpoints_spells_them() -> None:
    """`endpoints=os.environ["METASTORE_ENDPOINTS"]` (comma-separated, as the README exports it)
    was turned into a list of its characters and refused as "47 endpoints; at most 16"."""
    bridge = MetastoreBridge(
        _spark(), endpoints="127.0.0.1:1, 127.0.0.1:2", token="t", client=_Client()
    )  # type: ignore[arg-type]
    try:
        assert bridge.endpoints == ["127.0.0.1:1", "127.0.0.1:2"]
    finally:
        bridge.close()
