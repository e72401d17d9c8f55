"""Whether another process listens on a port this node (or a cluster about to start) wants.

Shared by a node's first start (refused before it writes any state, so a failed first
`--bootstrap` leaves nothing behind) and `metastore cluster up` (which names the busy port
before it starts anything).
"""

from __future__ import annotations

import errno
import socket


def port_in_use(host: str, port: int) -> bool:
    """Whether binding (host, port) as the node's listeners will (SO_REUSEADDR, as asyncio's
    servers: a connection of an earlier run in TIME_WAIT does not count) fails because another
    process listens there. The probe socket is closed again at once. A host that does not
    resolve, or any other bind error (an address not of this machine), says False: the
    listeners themselves say what it is."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _name, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False
