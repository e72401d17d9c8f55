"""A `remove_node` whose client goes away still revokes the removed node's certificate.

The server cancels a closed connection's requests. On the leader, `remove_node` removes the
member and then proposes the revocation of the certificates it presented: a client that closed
its connection between the two (a CLI interrupted, a script's timeout; seen in a soak, a close
about 9 ms after sending the request) left the member removed and its certificate accepted,
and nobody was told (no reply, nothing logged). ApiServer's handler against a fake leader, no
node started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from metastore.daemon.server import ApiServer, Session

FINGERPRINT = "cd" * 32
REMOVED_NODE = 3


class _Leader:
    """The parts of a RaftNode `remove_node` uses; the removal takes a little while."""

    node_id = 1
    config = SimpleNamespace(tls=object())

    def __init__(self) -> None:
        self.removing = asyncio.Event()

    def is_leader(self) -> bool:
        return True

    def status(self) -> Any:
        conf = SimpleNamespace(voters=(1, 2, REMOVED_NODE), learners=())
        return SimpleNamespace(core=SimpleNamespace(conf=conf))

    async def remove_node(self, node_id: int, *, timeout_ms: int) -> int:
        self.removing.set()
        await asyncio.sleep(0.05)  # the change commits and applies
        return 42


def _api(
    leader: _Leader, revoked: list[tuple[int, tuple[str, ...]]], done: asyncio.Event | None = None
) -> ApiServer:
    api = ApiServer(
        node=leader,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=None),  # type: ignore[arg-type]
        clock=None,  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *_a: None),  # type: ignore[arg-type]
        cluster_id="remove",
        client_addresses={},
    )

    async def gather(_session: Session, _node_id: int) -> tuple[str, ...]:
        return (FINGERPRINT,)

    async def revoke(_session: Session, node_id: int, seen: tuple[str, ...]) -> dict[str, Any]:
        revoked.append((node_id, seen))
        if done is not None:
            done.set()
        return {"revoked": list(seen)}

    api._gather_certificates = gather  # type: ignore[method-assign]
    api._revoke_removed = revoke  # type: ignore[method-assign]
    return api


def test_the_revocation_follows_a_removal_whose_caller_went_away() -> None:
    async def scenario() -> list[tuple[int, tuple[str, ...]]]:
        leader = _Leader()
        revoked: list[tuple[int, tuple[str, ...]]] = []
        done = asyncio.Event()
        api = _api(leader, revoked, done)
        session = Session(peer="p", token="t")
        request = asyncio.create_task(api._remove_node(session, {"node_id": REMOVED_NODE}))
        await asyncio.wait_for(leader.removing.wait(), 5)
        request.cancel()  # its client closed the connection
        await asyncio.gather(request, return_exceptions=True)
        await asyncio.wait_for(done.wait(), 5)
        await api.stop()
        return revoked

    assert asyncio.run(scenario()) == [(REMOVED_NODE, (FINGERPRINT,))]


def test_a_removal_whose_caller_stays_replies_as_before() -> None:
    async def scenario() -> dict[str, Any]:
        revoked: list[tuple[int, tuple[str, ...]]] = []
        api = _api(_Leader(), revoked)
        reply = await api._remove_node(Session(peer="p", token="t"), {"node_id": REMOVED_NODE})
        assert revoked == [(REMOVED_NODE, (FINGERPRINT,))]
        await api.stop()
        return reply

    assert asyncio.run(scenario()) == {"index": 42, "revoked": [FINGERPRINT]}
