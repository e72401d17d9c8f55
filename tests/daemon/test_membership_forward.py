"""A membership op sent to a follower is forwarded to the leader with a wait that follows the
caller's `timeout_ms` (the leader's own wait for the change, plus what it does around it), so
the leader's answer reaches the caller instead of the forward giving up first while the change
goes on. Unit level: the API server's handlers with a follower node and a recording
forwarder (no processes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, SystemClock
from metastore.commands import SetMemberClientAddress
from metastore.daemon import api_limits as L
from metastore.daemon.forward import LeaderForwarder
from metastore.daemon.server import ApiServer, Session
from metastore.errors import BadRequestError, InvalidArgumentError, UnavailableError
from metastore.state import MetastoreState
from tests.client.fake_node import TOKEN, ThreadedFakeNode


class _Follower:
    node_id = 2
    config = SimpleNamespace(tls=None)

    def is_leader(self) -> bool:
        return False

    def leader_id(self) -> int:
        return 1

    def status(self) -> Any:
        return SimpleNamespace(
            core=SimpleNamespace(conf=SimpleNamespace(voters=(1, 2, 3), learners=()))
        )


class _RecordingForwarder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str, dict[str, Any], int]] = []
        self.clients: list[str] = []

    async def call(
        self,
        node_id: int,
        token: str,
        op: str,
        args: dict[str, Any],
        *,
        timeout_ms: int,
        client: str = "",
    ) -> dict[str, Any]:
        self.calls.append((node_id, op, dict(args), timeout_ms))
        self.clients.append(client)
        return {"ok": True, "revoked": []}


def _follower_server() -> tuple[ApiServer, _RecordingForwarder]:
    server = object.__new__(ApiServer)
    forwarder = _RecordingForwarder()
    server.node = _Follower()  # type: ignore[assignment]
    server.forwarder = forwarder  # type: ignore[assignment]
    server._detached = set()  # remove_node runs detached from its caller
    return server, forwarder


SESSION = Session(peer="test", token="t")


async def _ok(op: str, args: dict[str, Any]) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize("timeout_ms", [2_000, 30_000, L.REQUEST_TIMEOUT_MS_MAX])
async def test_remove_node_forward_waits_past_the_callers_timeout(timeout_ms: int) -> None:
    server, forwarder = _follower_server()
    await server._remove_node(SESSION, {"node_id": 3, "timeout_ms": timeout_ms})
    ((leader, op, args, forward_ms),) = forwarder.calls
    assert (leader, op, args["timeout_ms"]) == (1, "remove_node", timeout_ms)
    assert forward_ms > timeout_ms
    # The leader waits timeout_ms for the change, and may spend the revocation steps around
    # it: the forward outlasts both, so the leader's own answer (TIMEOUT included) comes back.
    assert forward_ms > timeout_ms + L.REMOVE_NODE_REVOCATION_MS_MAX


async def test_remove_node_without_a_timeout_forwards_the_default_wait() -> None:
    server, forwarder = _follower_server()
    await server._remove_node(SESSION, {"node_id": 3})
    ((_, _, _, forward_ms),) = forwarder.calls
    assert forward_ms > L.MEMBERSHIP_TIMEOUT_MS_DEFAULT + L.REMOVE_NODE_REVOCATION_MS_MAX


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("add_node", {"node_id": 4, "raft_address": "127.0.0.1:1", "learner": True}),
        ("promote_node", {"node_id": 3}),
    ],
)
async def test_add_and_promote_forward_waits_past_the_callers_timeout(
    op: str, args: dict[str, Any]
) -> None:
    server, forwarder = _follower_server()
    handler = server._add_node if op == "add_node" else server._promote_node
    await handler(SESSION, {**args, "timeout_ms": 40_000})
    ((_, forwarded_op, _, forward_ms),) = forwarder.calls
    assert forwarded_op == op
    assert forward_ms > 40_000


class _Leader:
    node_id = 1
    config = SimpleNamespace(tls=None)

    def __init__(self) -> None:
        self.added: list[tuple[int, tuple[str, int], bool]] = []

    def is_leader(self) -> bool:
        return True

    def status(self) -> Any:
        voters = (1, 2, 3)
        learners = tuple(n for n, _, _ in self.added)
        members = (*voters, *learners)
        conf = SimpleNamespace(voters=voters, learners=learners, members=lambda: members)
        return SimpleNamespace(core=SimpleNamespace(conf=conf))

    async def add_node(
        self, node_id: int, address: tuple[str, int], *, learner: bool, timeout_ms: int
    ) -> int:
        self.added.append((node_id, address, learner))
        return 42


def _leader_server(configured: list[int]) -> tuple[ApiServer, _Leader]:
    server = object.__new__(ApiServer)
    leader = _Leader()
    server.node = leader  # type: ignore[assignment]
    server.forwarder = _RecordingForwarder()  # type: ignore[assignment]
    server.client_addresses = {n: f"127.0.0.1:{24200 + n}" for n in configured}
    server._detached = set()  # remove_node runs detached from its caller
    return server, leader


async def test_adding_a_node_missing_from_the_config_says_how_the_members_learn_its_address() -> (
    None
):
    """A member not in cluster.toml joins and may lead, but no member knows its client port:
    followers cannot forward to it (every write through them fails while it leads) and
    `cluster version --finalize` cannot ask it. The reply says so, and what to do."""
    server, leader, _ = _recording_leader([1, 2, 3])
    reply = await server._add_node(
        SESSION, {"node_id": 4, "raft_address": "127.0.0.1:24104", "learner": True}
    )
    assert leader.added == [(4, ("127.0.0.1", 24104), True)]
    assert reply["index"] == 42
    assert reply["client_address_known"] is False
    warning = reply["warning"]
    assert "node 4" in warning
    assert "--client-address" in warning
    assert "[[nodes]]" in warning and "cluster.toml" in warning
    assert "restart" in warning


async def test_adding_back_a_configured_node_does_not_warn() -> None:
    server, _, _ = _recording_leader([1, 2, 3])
    reply = await server._add_node(SESSION, {"node_id": 3, "raft_address": "127.0.0.1:24103"})
    assert reply["index"] == 42
    assert reply["client_address_known"] is True
    assert "warning" not in reply


async def test_a_forwarded_add_node_keeps_the_leaders_answer() -> None:
    server, forwarder = _follower_server()
    server.client_addresses = {1: "127.0.0.1:24201"}  # this follower's config: no node 4
    reply = await server._add_node(
        SESSION, {"node_id": 4, "raft_address": "127.0.0.1:24104", "learner": True}
    )
    assert forwarder.calls and reply == {"ok": True, "revoked": []}


async def test_forwarding_to_a_leader_missing_from_the_config_says_what_to_do() -> None:
    """The error every write through a follower gets while an added node leads: it names the
    missing [[nodes]] entry, not only the symptom."""
    forwarder = LeaderForwarder(addresses={1: ("127.0.0.1", 1)}, clock=HybridClock(SystemClock()))
    with pytest.raises(UnavailableError) as raised:
        await forwarder.call(4, "t", "status", {}, timeout_ms=1_000)
    message = raised.value.message
    assert "node 4" in message
    assert "[[nodes]]" in message and "cluster.toml" in message


async def test_a_forwarded_membership_op_carries_the_callers_client_name() -> None:
    """The leader records who removed a node (the revocation's `by`, `cluster revoked`) or
    finalized a version from the session the op runs in: a forwarded op ran in the
    forwarder's own session, and the record said "forward"."""
    server, forwarder = _follower_server()
    caller = Session(peer="test", token="t", client="metastore-cli pid=7")
    await server._remove_node(caller, {"node_id": 3})
    assert forwarder.clients == ["metastore-cli pid=7"]


async def test_the_forwarder_says_on_whose_behalf_in_its_hello() -> None:
    with ThreadedFakeNode(handler=_ok) as leader:
        host, port = leader.endpoint.rsplit(":", 1)
        forwarder = LeaderForwarder(
            addresses={1: (host, int(port))}, clock=HybridClock(SystemClock())
        )
        await forwarder.call(1, TOKEN, "status", {}, timeout_ms=5_000, client="cli pid=7")
        await forwarder.call(1, TOKEN, "status", {}, timeout_ms=5_000)
        hellos = [h["client"] for h in leader.node.hellos if h["op"] == "hello"]
    assert hellos == ["cli pid=7 (forwarded)", "forward"]


# ---- the new member's client address, recorded through the log (apply version 6) ----------


class _RecordingLeaderServer:
    """What `_add_node` proposes on the leader, in order with the membership change."""

    def __init__(self, server: ApiServer, leader: _Leader, apply_version: int) -> None:
        self.events: list[object] = []
        self.state = MetastoreState()
        self.state.apply_version = apply_version
        server.sm = SimpleNamespace(state=self.state)  # type: ignore[assignment]
        original_add = leader.add_node

        async def add_node(
            node_id: int, address: tuple[str, int], *, learner: bool, timeout_ms: int
        ) -> int:
            self.events.append(("add_node", node_id))
            return await original_add(node_id, address, learner=learner, timeout_ms=timeout_ms)

        async def propose(session: Session, cmd: Any, timeout_ms: int) -> dict[str, Any]:
            self.events.append(cmd)
            result = self.state.member_clients.record(cmd.node_id, cmd.host, cmd.port)
            return {"result": result, "tm": 1, "index": 41}

        leader.add_node = add_node  # type: ignore[method-assign]
        server._propose_command = propose  # type: ignore[method-assign]


def _recording_leader(
    configured: list[int], apply_version: int = 6
) -> tuple[ApiServer, _Leader, _RecordingLeaderServer]:
    server, leader = _leader_server(configured)
    return server, leader, _RecordingLeaderServer(server, leader, apply_version)


async def test_add_node_with_a_client_address_records_it_before_the_node_joins() -> None:
    """Every member learns the new node's client port through the log, so forwarding to it
    works once it leads, with no member's cluster.toml edited. Recorded first: a node that
    joins and leads at once is already reachable."""
    server, leader, rec = _recording_leader([1, 2, 3])
    reply = await server._add_node(
        SESSION,
        {
            "node_id": 4,
            "raft_address": "127.0.0.1:24104",
            "client_address": "127.0.0.1:24204",
            "learner": True,
        },
    )
    assert rec.events == [
        SetMemberClientAddress(node_id=4, host="127.0.0.1", port=24204, by=""),
        ("add_node", 4),
    ]
    assert leader.added == [(4, ("127.0.0.1", 24104), True)]
    assert reply["client_address_known"] is True
    assert reply["client_address"] == "127.0.0.1:24204"
    assert "warning" not in reply
    assert server._client_address_of(4) == "127.0.0.1:24204"


async def test_the_leaders_config_entry_is_recorded_when_no_address_is_given() -> None:
    """The README's way (the entry in the leader's cluster.toml): members whose file lacks it
    still learn it through the log."""
    server, _, rec = _recording_leader([1, 2, 3, 4])
    reply = await server._add_node(SESSION, {"node_id": 4, "raft_address": "127.0.0.1:24104"})
    assert rec.events[0] == SetMemberClientAddress(node_id=4, host="127.0.0.1", port=24204)
    assert reply["client_address_known"] is True and "warning" not in reply


async def test_an_address_disagreeing_with_the_leaders_config_is_refused_and_changes_nothing() -> (
    None
):
    server, leader, rec = _recording_leader([1, 2, 3, 4])
    with pytest.raises(InvalidArgumentError, match=r"cluster\.toml"):
        await server._add_node(
            SESSION,
            {"node_id": 4, "raft_address": "127.0.0.1:24104", "client_address": "10.0.0.9:1"},
        )
    assert rec.events == [] and leader.added == []


@pytest.mark.parametrize("bad", ["", "nohost", ":1", "h:0", "h:65536", "h:x", "a b:1", 7])
async def test_a_malformed_client_address_is_refused_and_changes_nothing(bad: object) -> None:
    server, leader, rec = _recording_leader([1, 2, 3])
    with pytest.raises((InvalidArgumentError, BadRequestError)):
        await server._add_node(
            SESSION, {"node_id": 4, "raft_address": "127.0.0.1:24104", "client_address": bad}
        )
    assert rec.events == [] and leader.added == []


async def test_below_apply_version_6_the_node_joins_with_the_old_warning() -> None:
    """During a rolling upgrade (not finalized) nodes of the previous release could not apply
    the record: the node joins unrecorded, and the reply says why and what to do."""
    server, _, rec = _recording_leader([1, 2, 3], apply_version=5)
    reply = await server._add_node(
        SESSION,
        {"node_id": 4, "raft_address": "127.0.0.1:24104", "client_address": "127.0.0.1:24204"},
    )
    assert rec.events == [("add_node", 4)]
    assert reply["client_address_known"] is False
    assert "apply version 6" in reply["warning"] and "--finalize" in reply["warning"]


async def test_the_forwarder_uses_a_recorded_address_for_a_node_the_config_lacks() -> None:
    state = MetastoreState()
    state.apply_version = 6
    state.member_clients.record(4, "127.0.0.1", 24204)
    forwarder = LeaderForwarder(
        addresses={1: ("127.0.0.1", 24201)},
        clock=HybridClock(SystemClock()),
        recorded=state.member_clients.address_of,
    )
    assert forwarder.address_of(4) == ("127.0.0.1", 24204)
    assert forwarder.address_of(1) == ("127.0.0.1", 24201)
    assert forwarder.address_of(5) is None
    # The node's own cluster.toml entry wins over a record.
    state.member_clients.record(1, "10.0.0.1", 9)
    assert forwarder.address_of(1) == ("127.0.0.1", 24201)


async def test_add_node_of_a_member_with_a_client_address_records_it_only() -> None:
    """A node added before apply version 6 (or without an address) gets its address recorded
    by running add-node again with one (without one, Raft still refuses: already a member)."""
    server, leader, rec = _recording_leader([1, 2])
    reply = await server._add_node(
        SESSION,
        {"node_id": 3, "raft_address": "127.0.0.1:24103", "client_address": "127.0.0.1:24203"},
    )
    assert rec.events == [SetMemberClientAddress(node_id=3, host="127.0.0.1", port=24203)]
    assert leader.added == []
    assert reply["index"] == 41 and reply["already_member"] is True
    assert reply["client_address_known"] is True
    again = await server._add_node(
        SESSION,
        {"node_id": 3, "raft_address": "127.0.0.1:24103", "client_address": "[::1]:24203"},
    )
    assert again["client_address"] == "[::1]:24203"
    assert rec.state.member_clients.address_of(3) == ("::1", 24203)
    rec.state.apply_version = 5
    with pytest.raises(InvalidArgumentError, match=r"already a member.*apply version 6"):
        await server._add_node(
            SESSION,
            {"node_id": 3, "raft_address": "127.0.0.1:24103", "client_address": "h:1"},
        )
    assert leader.added == []


async def test_a_node_added_again_without_an_address_keeps_its_recorded_one_and_says_so() -> None:
    server, _, rec = _recording_leader([1, 2, 3])
    rec.state.member_clients.record(4, "old-host", 24204)
    reply = await server._add_node(SESSION, {"node_id": 4, "raft_address": "127.0.0.1:24104"})
    assert rec.events == [("add_node", 4)]
    assert reply["client_address_known"] is True
    assert reply["client_address"] == "old-host:24204"
    assert "--client-address" in reply["warning"] and "old-host:24204" in reply["warning"]
