"""A forward keeps to its caller's deadline, and says what may have reached the leader.

`LeaderForwarder.call` opened a missing link to the leader with a connect and a hello of 3 s
each that its `timeout_ms` did not bound: a client asking for 500 ms through a follower whose
link had to be (re)opened could wait ~6.5 s. The whole forward (link, slot, send, answer) now
runs within `timeout_ms`; what it never wrote stays UNAVAILABLE with `details.not_sent`.

A forward whose write failed after it was handed to the transport (`drain` found the leader
gone) came back as a plain "cannot reach" UNAVAILABLE, as if nothing had happened: its bytes
may have reached the leader, so its outcome is now unknown (`outcome_unknown`). Only a write
the transport refused outright (nothing of it buffered, let alone sent) is `not_sent`: that
mark lets the client resend even a non-repeatable write elsewhere. FakeNode as the leader."""

from __future__ import annotations

import asyncio

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon.forward import LeaderForwarder
from metastore.errors import UnavailableError
from tests.client.fake_node import TOKEN, FakeNode
from tests.daemon.silent_leader import forwarder_to_a_silent_leader

SHORT_TIMEOUT_MS = 300
# Far below the link's own 3 s hello bound, far above SHORT_TIMEOUT_MS for a loaded machine.
DEADLINE_SLACK_S = 2.0


async def test_a_forward_waiting_for_its_link_keeps_to_its_own_timeout() -> None:
    """A leader port that accepts but never answers the hello: the forward gives up at its own
    timeout, not the link's 3 s hello bound, and says it sent nothing."""
    loop = asyncio.get_running_loop()
    async with forwarder_to_a_silent_leader() as (forwarder, accepted):
        started = loop.time()
        with pytest.raises(UnavailableError) as raised:
            await forwarder.call(1, TOKEN, "add_node", {"node_id": 3}, timeout_ms=SHORT_TIMEOUT_MS)
        elapsed_s = loop.time() - started
        assert accepted.is_set()
        assert elapsed_s < SHORT_TIMEOUT_MS / 1000 + DEADLINE_SLACK_S, elapsed_s
        assert "outcome_unknown" not in raised.value.details, raised.value.details
        assert raised.value.details.get("not_sent") is True


async def _forwarder_with_open_link(leader: FakeNode) -> LeaderForwarder:
    host, port = leader.endpoint.rsplit(":", 1)
    forwarder = LeaderForwarder(addresses={1: (host, int(port))}, clock=HybridClock(SystemClock()))
    await forwarder.call(1, TOKEN, "add_node", {"node_id": 2}, timeout_ms=10_000)
    return forwarder


async def test_a_forward_whose_drain_failed_after_the_write_has_its_outcome_unknown() -> None:
    leader = FakeNode()
    await leader.start()
    forwarder = await _forwarder_with_open_link(leader)
    (link,) = forwarder._links.values()
    real_drain = link.writer.drain

    async def drain_then_lose_the_connection() -> None:
        await real_drain()  # the frame went out: the leader may run it
        raise ConnectionResetError("Connection lost")

    link.writer.drain = drain_then_lose_the_connection  # type: ignore[method-assign]
    try:
        with pytest.raises(UnavailableError) as raised:
            await forwarder.call(1, TOKEN, "add_node", {"node_id": 3}, timeout_ms=10_000)
        assert raised.value.details.get("outcome_unknown") is True, raised.value.details
        assert "not_sent" not in raised.value.details
    finally:
        await forwarder.close()
        await leader.stop()


async def test_a_forward_whose_write_the_transport_refused_says_it_sent_nothing() -> None:
    leader = FakeNode()
    await leader.start()
    forwarder = await _forwarder_with_open_link(leader)
    (link,) = forwarder._links.values()

    def refuse(data: object) -> None:
        # What uvloop does on a transport the leader already closed: raise before buffering.
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    link.writer.write = refuse  # type: ignore[method-assign]
    try:
        with pytest.raises(UnavailableError) as raised:
            await forwarder.call(1, TOKEN, "add_node", {"node_id": 3}, timeout_ms=10_000)
        assert raised.value.details.get("not_sent") is True, raised.value.details
        assert "outcome_unknown" not in raised.value.details
        assert 3 not in [args.get("node_id") for _, _, args in leader.requests]
    finally:
        await forwarder.close()
        await leader.stop()
