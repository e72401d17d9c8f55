"""Members' client addresses, kept in the replicated catalog state (apply version 6).

Why: a follower forwards writes and DDL to the leader's *client* port (metastore.daemon.forward)
and `cluster version` asks every member's; Raft knows only peer (Raft) addresses. Members used
to learn client ports from their own cluster.toml alone, so after `cluster add-node` of a node
missing there, every request sent to another member failed while the new node led. Now
`add-node --client-address HOST:PORT` (or the leader's cluster.toml entry for the node) is
recorded through the log (`SetMemberClientAddress`), so every member, including one added
later or brought up to date by the leader's Raft snapshot, knows it.

Lookup rule (the daemon's): a node's own cluster.toml entry wins; the record is used for
nodes that file does not name. The leader refuses to record an address that disagrees with
its own cluster.toml entry for the node, so the two agree where both exist.

Records are keyed by node id; recording an id again replaces its address (a node re-added
elsewhere). They are not removed with the member: an id's record is harmless while it is no
member (only a leader's address is used), is replaced when the id is added again with an
address, and is kept (the reply warns) when it is added again without one. A restore into a new
cluster (metastore.daemon.backup) drops them: they name the saved cluster's hosts.

This module is pure: no clock, file or socket.
"""

from __future__ import annotations

from metastore import limits
from metastore.errors import InvalidArgumentError, MalformedSnapshotError, limit_exceeded

_PORT_MAX = 65535


def address_problem(
    node_id: object, host: object, port: object, *, ascii_host: bool = False
) -> str | None:
    """Why (node_id, host, port) is not a recordable member client address, or None.

    `ascii_host` (apply version 7): the host is ASCII's printable characters but space (a
    host name or IP literal is); else any characters but spaces that the running Python calls
    printable, a set each Unicode release grows (a character assigned in Unicode 15, as the
    Kawi digits, is unprintable to Python 3.11 and printable to 3.12), so two releases could
    disagree whether to record an address."""
    if type(node_id) is not int or not 0 < node_id <= limits.MAX_MEMBER_NODE_ID:
        return f"node_id must be in 1..{limits.MAX_MEMBER_NODE_ID}"
    if (
        type(host) is not str
        or not host
        or len(host) > limits.MAX_MEMBER_HOST_CHARS
        or any(c.isspace() or not c.isprintable() for c in host)
        or (ascii_host and not all("!" <= c <= "~" for c in host))
    ):
        what = "printable ASCII characters" if ascii_host else "printable characters"
        return f"host must be 1 to {limits.MAX_MEMBER_HOST_CHARS} {what} without spaces"
    if type(port) is not int or not 0 < port <= _PORT_MAX:
        return f"port must be in 1..{_PORT_MAX}"
    return None


def format_address(host: str, port: int) -> str:
    """HOST:PORT, with an IPv6 host in brackets (as cluster.toml's client addresses read)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class MemberClients:
    """node id -> (host, client port)."""

    __slots__ = ("_by_node",)

    def __init__(self) -> None:
        self._by_node: dict[int, tuple[str, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_node)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemberClients) and self._by_node == other._by_node

    __hash__ = None  # type: ignore[assignment]

    def address_of(self, node_id: int) -> tuple[str, int] | None:
        return self._by_node.get(node_id)

    def items(self) -> list[tuple[int, tuple[str, int]]]:
        return sorted(self._by_node.items())

    def check_record(self, node_id: int, host: str, port: int, *, ascii_host: bool = False) -> None:
        """Raise what `record` would raise, changing nothing. `ascii_host`: see
        `address_problem`."""
        problem = address_problem(node_id, host, port, ascii_host=ascii_host)
        if problem is not None:
            raise InvalidArgumentError(f"member client address: {problem}")
        if (
            node_id not in self._by_node
            and len(self._by_node) >= limits.MAX_MEMBER_CLIENT_ADDRESSES
        ):
            raise limit_exceeded(
                "MAX_MEMBER_CLIENT_ADDRESSES",
                limits.MAX_MEMBER_CLIENT_ADDRESSES,
                len(self._by_node) + 1,
                "member client addresses recorded",
            )

    def record(
        self, node_id: int, host: str, port: int, *, ascii_host: bool = False
    ) -> dict[str, object]:
        self.check_record(node_id, host, port, ascii_host=ascii_host)
        previous = self._by_node.get(node_id)
        self._by_node[node_id] = (host, port)
        return {
            "node_id": node_id,
            "client_address": format_address(host, port),
            "previous": "" if previous is None else format_address(*previous),
        }

    def to_data(self) -> list[list[object]]:
        return [[node_id, host, port] for node_id, (host, port) in self.items()]

    @staticmethod
    def from_data(data: object) -> MemberClients:
        if type(data) is not list or not data:
            # Written only when there is a record (an empty list is no snapshot's).
            raise MalformedSnapshotError("snapshot member_clients must be a non-empty list")
        if len(data) > limits.MAX_MEMBER_CLIENT_ADDRESSES:
            raise MalformedSnapshotError("snapshot member_clients has too many records")
        clients = MemberClients()
        for row in data:
            if type(row) is not list or len(row) != 3:
                raise MalformedSnapshotError("snapshot member_clients rows are [id, host, port]")
            node_id, host, port = row
            problem = address_problem(node_id, host, port)
            if problem is not None:
                raise MalformedSnapshotError(f"snapshot member_clients: {problem}")
            if node_id in clients._by_node:
                raise MalformedSnapshotError("snapshot member_clients lists a node twice")
            clients._by_node[node_id] = (host, port)
        return clients
