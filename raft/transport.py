"""Authenticated asyncio links that carry Raft messages between peers.

Key idea: every node keeps exactly one *outbound* TCP connection to each peer and sends only on
it; connections a peer opens to us are *inbound* and we only receive on them. So all messages
from A to B travel over one ordered byte stream, and a reconnect is the only place where
messages can be lost (Raft tolerates loss; it does not tolerate reordering inside a stream
being mistaken for something else, and we never retry single messages).

Sending. `send(msg)` encodes the message into a frame (`raft.wire` + `raft.framing`) at once
and appends it to that peer's bounded queue; it never blocks and never raises for network
trouble. When the queue is full the oldest frame is dropped and counted. A per-peer writer
task wakes up, takes everything queued, hands it to the socket in one `writelines` (write
coalescing: a burst of small messages costs one syscall) and awaits `drain()`, so a slow peer
exerts back-pressure on its own queue only. If the connection fails, the task reconnects with
exponential backoff and jitter between RECONNECT_BACKOFF_MS_MIN and _MAX.

Handshake (inside HANDSHAKE_TIMEOUT_MS, frames capped at HANDSHAKE_FRAME_BYTES_MAX):

    client -> server  ["raft-peer-hello", version, cluster_id, client_id, server_id, nonce_c]
    server -> client  ["raft-peer-challenge", nonce_s]
    client -> server  ["raft-peer-proof", mac("client")]
    server -> client  ["raft-peer-welcome", mac("server")]

    mac(role) = HMAC-SHA256(secret, msgpack([role, version, cluster_id, client_id, server_id,
                                             nonce_c, nonce_s]))

Both sides prove knowledge of the shared secret without sending it; fresh 32-byte nonces from
both sides stop replay; the role label stops a MAC from being reflected back; the cluster id
and both node ids are bound in. The connecting side proves first, so the exposed listener
never computes a MAC for a stranger. MACs are compared with `hmac.compare_digest`.

Invariants:
* No message from a connection is delivered before that connection has authenticated, and the
  `src` of every delivered message equals the authenticated peer id and its `dst` is us.
* Before authentication a stranger can make us buffer at most HANDSHAKE_FRAME_BYTES_MAX bytes
  and hold a slot for at most HANDSHAKE_TIMEOUT_MS; at most PEER_INBOUND_CONNECTIONS_MAX
  inbound connections exist at once, and at the limit the oldest unauthenticated one makes
  room for a newcomer.
* A bad frame closes only the connection it arrived on; nothing a peer sends can raise out of
  this module into the node.

Limits (known, by design): authentication only. After the handshake the stream is neither
encrypted nor integrity-protected, so an attacker who can inject into or relay a TCP
connection can act as an authenticated peer. Run peers on a trusted network (or under TLS).

All methods must be called from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import logging
import os
import random
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypedDict

import msgpack

from raft.core.types import NONE, Message, NodeId
from raft.errors import (
    FrameTooLargeError,
    InsecureSecretFileError,
    InvalidLimitError,
    MalformedFrameError,
    MalformedMessageError,
    PeerAuthError,
    PeerHandshakeError,
    SecretFileError,
    TransportConfigError,
)
from raft.framing import FRAME_LENGTH_CAPACITY, NEED_DATA, FrameDecoder, encode_frame
from raft.limits import (
    CLUSTER_ID_CHARS_MAX,
    HANDSHAKE_FRAME_BYTES_MAX,
    HANDSHAKE_TIMEOUT_MS,
    PEER_CONNECT_TIMEOUT_MS,
    PEER_FRAME_BYTES_MAX,
    PEER_INBOUND_CONNECTIONS_MAX,
    PEER_READ_CHUNK_BYTES,
    PEER_SEND_QUEUE_BYTES_MAX,
    PEER_SEND_QUEUE_MAX,
    PEER_STOP_TIMEOUT_MS,
    RECONNECT_BACKOFF_MS_MAX,
    RECONNECT_BACKOFF_MS_MIN,
    SECRET_BYTES_MIN,
    SECRET_FILE_BYTES_MAX,
)
from raft.wire import decode_message, encode_message

# 2: AppendResponse carries reject_term; heartbeats carry the sender's clock (raft.wire). A
# node of another version is refused at the handshake (no rolling upgrade across it).
PROTOCOL_VERSION: Final = 2
NONCE_BYTES: Final = 32
MAC_BYTES: Final = 32  # HMAC-SHA256 digest size

HELLO: Final = "raft-peer-hello"
CHALLENGE: Final = "raft-peer-challenge"
PROOF: Final = "raft-peer-proof"
WELCOME: Final = "raft-peer-welcome"

_U64_END: Final = 1 << 64
_PORT_MAX: Final = 65535
# A DNS name is at most 253 characters; IPv6 literals are far shorter.
_HOST_CHARS_MAX: Final = 253

Address = tuple[str, int]


class PeerStats(TypedDict):
    """Counters of one peer, in `PeerTransport.stats()["peers"][peer_id]`."""

    address: str
    connected: bool  # the outbound link is up (handshake done)
    queued: int  # frames waiting to be written
    sent: int  # frames handed to the socket
    dropped: int  # frames dropped: queue overflow (oldest first) or too large to send
    reconnects: int  # successful connections after the first one
    connect_failures: int  # outbound attempts that failed before authentication finished
    auth_failures: int  # handshakes with this peer id refused on either side of a link
    received: int  # messages delivered to on_message
    rejected: int  # messages dropped because dst was not us or src not the peer
    malformed: int  # undecodable frames/messages from this peer


class TransportStats(TypedDict):
    """The shape of `PeerTransport.stats()`."""

    node_id: int
    bound_port: int
    peers: dict[int, PeerStats]
    inbound_connections: int
    # Failures that cannot be attributed to a configured peer.
    auth_failures_unknown_peer: int
    handshake_failures: int
    inbound_refused_over_limit: int  # connections closed because of the inbound limit
    dropped_no_route: int


def mac(
    secret: bytes,
    role: str,
    *,
    cluster_id: str,
    client_id: int,
    server_id: int,
    client_nonce: bytes,
    server_nonce: bytes,
) -> bytes:
    """The handshake MAC (see the module docstring). msgpack makes the input unambiguous."""
    material = msgpack.packb(
        [role, PROTOCOL_VERSION, cluster_id, client_id, server_id, client_nonce, server_nonce],
        use_bin_type=True,
    )
    return hmac.new(secret, material, hashlib.sha256).digest()


# ---- secret file ----------------------------------------------------------------------------


def load_or_create_secret(path: Path) -> bytes:
    """Return the cluster secret stored at `path`, creating it first if it does not exist.

    An existing file must be a regular file that neither group nor others can access (0600 or
    stricter), else InsecureSecretFileError. A new file gets 32 random bytes as hex, is
    created with O_EXCL and mode 0600 (if two processes race, one creates and both read the
    same secret), and its missing parent directory is created with mode 0700. Surrounding
    whitespace is not part of the secret.
    """
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)  # mkdir's mode is filtered by the umask
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return _read_secret(path)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    # Make the new directory entry durable too, so a crash cannot leave a node without its
    # secret after it has already used it to join the cluster.
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        # fstat the open file, not the path, so the checked file is the one we read.
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"secret file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise InsecureSecretFileError(
                f"secret file {path} has mode {stat.S_IMODE(st.st_mode):04o}; group and others "
                f"must have no access (chmod 600 {path})"
            )
        data = os.read(fd, SECRET_FILE_BYTES_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > SECRET_FILE_BYTES_MAX:
        raise SecretFileError(f"secret file {path} exceeds {SECRET_FILE_BYTES_MAX} bytes")
    secret = data.strip()
    if len(secret) < SECRET_BYTES_MIN:
        raise SecretFileError(
            f"secret in {path} has {len(secret)} bytes; at least {SECRET_BYTES_MIN} are required"
        )
    return secret


# ---- per-connection state -------------------------------------------------------------------


class _Link:
    """Our outbound side towards one peer: its queue, its writer task and its counters."""

    __slots__ = (
        "address",
        "auth_failures",
        "connect_failures",
        "connected",
        "dropped",
        "malformed",
        "peer_closed",
        "peer_id",
        "queue",
        "queued_bytes",
        "received",
        "reconnects",
        "rejected",
        "sent",
        "task",
        "wakeup",
    )

    def __init__(self, peer_id: NodeId, address: Address) -> None:
        self.peer_id = peer_id
        self.address = address
        # Invariant: queued_bytes == sum(len(f) for f in queue).
        self.queue: collections.deque[bytes] = collections.deque()
        self.queued_bytes = 0
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.peer_closed = False
        self.sent = 0
        self.dropped = 0
        self.reconnects = 0
        self.connect_failures = 0
        self.auth_failures = 0
        self.received = 0
        self.rejected = 0
        self.malformed = 0

    def stats(self) -> PeerStats:
        return PeerStats(
            address=f"{self.address[0]}:{self.address[1]}",
            connected=self.connected,
            queued=len(self.queue),
            sent=self.sent,
            dropped=self.dropped,
            reconnects=self.reconnects,
            connect_failures=self.connect_failures,
            auth_failures=self.auth_failures,
            received=self.received,
            rejected=self.rejected,
            malformed=self.malformed,
        )


class _Inbound:
    """A connection a peer opened to us; `peer_id` stays NONE until it has authenticated."""

    __slots__ = ("claimed_id", "evicted", "peer_id", "task", "writer")

    def __init__(self, writer: asyncio.StreamWriter, task: asyncio.Task[Any] | None) -> None:
        self.writer = writer
        self.task = task
        self.claimed_id: NodeId = NONE
        self.peer_id: NodeId = NONE
        self.evicted = False  # closed by us to make room (see _make_room)


async def _read_handshake_frame(reader: asyncio.StreamReader, decoder: FrameDecoder) -> object:
    while (obj := decoder.next_frame()) is NEED_DATA:
        data = await reader.read(HANDSHAKE_FRAME_BYTES_MAX)
        if not data:
            raise PeerHandshakeError("connection closed during the handshake")
        decoder.feed(data)
    return obj


def _expect(obj: object, kind: str, count: int) -> list[object]:
    if type(obj) is not list or len(obj) != count or obj[0] != kind:
        raise PeerHandshakeError(f"expected a {kind!r} frame of {count} items")
    return obj


def _exact_bytes(value: object, size: int, what: str) -> bytes:
    if type(value) is not bytes or len(value) != size:
        raise PeerHandshakeError(f"{what} must be {size} bytes")
    return value


def _why(exc: BaseException) -> str:
    # Some OSErrors and every TimeoutError from asyncio.timeout() have no message.
    return str(exc) or type(exc).__name__


def _check_limit(name: str, value: int, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidLimitError(f"{name} must be in [{low}, {high}], got {value!r}")


def check_peers(peers: Mapping[int, Address]) -> None:
    """Raise TransportConfigError unless every (peer id, (host, port)) is usable."""
    for peer_id, address in peers.items():
        if type(peer_id) is not int or not 0 < peer_id < _U64_END:
            raise TransportConfigError(f"peer id must be a positive integer, got {peer_id!r}")
        if (
            not isinstance(address, tuple)
            or len(address) != 2
            or not isinstance(address[0], str)
            or not address[0]
            or len(address[0]) > _HOST_CHARS_MAX
            or any(c.isspace() or not c.isprintable() for c in address[0])
            or type(address[1]) is not int
            or not 0 < address[1] <= _PORT_MAX
        ):
            raise TransportConfigError(
                f"address of peer {peer_id} must be (host, port), got {address!r}"
            )


# ---- the transport --------------------------------------------------------------------------


class PeerTransport:
    """Authenticated, ordered, lossy message links to every peer (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        listen_host: str,
        listen_port: int,
        peers: Mapping[int, tuple[str, int]],
        secret: bytes,
        on_message: Callable[[Message], None],
        cluster_id: str,
        max_frame_bytes: int = PEER_FRAME_BYTES_MAX,
        logger: logging.Logger | None = None,
        send_queue_max: int = PEER_SEND_QUEUE_MAX,
        send_queue_bytes_max: int = PEER_SEND_QUEUE_BYTES_MAX,
        handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
        connect_timeout_ms: int = PEER_CONNECT_TIMEOUT_MS,
        reconnect_backoff_ms_min: int = RECONNECT_BACKOFF_MS_MIN,
        reconnect_backoff_ms_max: int = RECONNECT_BACKOFF_MS_MAX,
    ) -> None:
        if type(node_id) is not int or not 0 < node_id < _U64_END:
            raise TransportConfigError(f"node_id must be a positive integer, got {node_id!r}")
        if not isinstance(secret, bytes) or len(secret) < SECRET_BYTES_MIN:
            raise TransportConfigError(
                f"the cluster secret must be at least {SECRET_BYTES_MIN} bytes"
            )
        if not isinstance(cluster_id, str) or not 0 < len(cluster_id) <= CLUSTER_ID_CHARS_MAX:
            raise TransportConfigError(
                f"cluster_id must be a non-empty string of at most {CLUSTER_ID_CHARS_MAX} chars"
            )
        if type(listen_port) is not int or not 0 <= listen_port <= _PORT_MAX:
            raise TransportConfigError(f"listen_port must be in [0, {_PORT_MAX}]")
        _check_limit("max_frame_bytes", max_frame_bytes, 1, FRAME_LENGTH_CAPACITY)
        _check_limit("send_queue_max", send_queue_max, 1, 2**31)
        # One full frame must always fit, or a large message could never be sent at all.
        _check_limit("send_queue_bytes_max", send_queue_bytes_max, max_frame_bytes + 4, 2**62)
        _check_limit("handshake_timeout_ms", handshake_timeout_ms, 1, 10**7)
        _check_limit("connect_timeout_ms", connect_timeout_ms, 1, 10**7)
        _check_limit("reconnect_backoff_ms_min", reconnect_backoff_ms_min, 1, 10**7)
        _check_limit(
            "reconnect_backoff_ms_max", reconnect_backoff_ms_max, reconnect_backoff_ms_min, 10**7
        )
        check_peers(peers)

        self._node_id = node_id
        self._listen_host = listen_host
        self._listen_port = listen_port
        self._secret = secret
        self._on_message = on_message
        self._cluster_id = cluster_id
        self._max_frame_bytes = max_frame_bytes
        self._log = logger if logger is not None else logging.getLogger("raft.transport")
        self._send_queue_max = send_queue_max
        self._send_queue_bytes_max = send_queue_bytes_max
        self._handshake_timeout_s = handshake_timeout_ms / 1000
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._backoff_ms_min = reconnect_backoff_ms_min
        self._backoff_ms_max = reconnect_backoff_ms_max
        self._rng = random.Random()  # jitter only; nothing secret depends on it

        self._links: dict[NodeId, _Link] = {
            pid: _Link(pid, addr) for pid, addr in peers.items() if pid != node_id
        }
        # Used as an ordered set (oldest first) so eviction can pick the oldest.
        self._inbound: dict[_Inbound, None] = {}
        self._retiring: set[asyncio.Task[None]] = set()  # link tasks of removed peers
        self._server: asyncio.Server | None = None
        self._bound_port = 0
        self._started = False
        self._stopped = False

        self._auth_failures_unknown_peer = 0
        self._handshake_failures = 0
        self._inbound_refused_over_limit = 0
        self._dropped_no_route = 0

    # ---- lifecycle --------------------------------------------------------------------------

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def bound_port(self) -> int:
        """The port the listener is bound to (useful with listen_port=0); 0 before start()."""
        return self._bound_port

    async def start(self) -> None:
        """Bind the listener and start one writer task per peer."""
        if self._started:
            raise TransportConfigError("PeerTransport.start() called twice")
        self._started = True
        self._server = await asyncio.start_server(
            self._handle_inbound,
            self._listen_host,
            self._listen_port,
            limit=PEER_READ_CHUNK_BYTES,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else 0
        for link in self._links.values():
            self._start_link(link)
        self._log.info(
            "peer transport of node %d listening on %s:%d",
            self._node_id,
            self._listen_host,
            self._bound_port,
        )

    async def stop(self) -> None:
        """Close the listener and every connection and end every task. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._server is not None:
            self._server.close()
        tasks: set[asyncio.Task[None]] = set(self._retiring)
        for link in self._links.values():
            if link.task is not None:
                link.task.cancel()
                tasks.add(link.task)
        # Inbound handlers are tasks asyncio owns; cancelling them makes asyncio report an
        # error, so end them by aborting their connections and let them return normally.
        for conn in self._inbound:
            conn.writer.transport.abort()
            if conn.task is not None:
                tasks.add(conn.task)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=PEER_STOP_TIMEOUT_MS / 1000)
            for task in pending:
                self._log.warning("peer transport task %s did not stop in time", task.get_name())
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), PEER_STOP_TIMEOUT_MS / 1000)
        for link in self._links.values():
            link.connected = False

    # ---- sending ----------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """Queue `msg` for `msg.dst`. Never blocks; drops (and counts) rather than fail.

        Raises FrameEncodeError only for a message whose fields msgpack cannot represent,
        which is a bug in the caller, not network trouble.
        """
        link = self._links.get(msg.dst)
        if link is None or self._stopped:
            self._dropped_no_route += 1
            return
        try:
            frame = encode_frame(encode_message(msg), max_frame_bytes=self._max_frame_bytes)
        except FrameTooLargeError as exc:
            link.dropped += 1
            self._log.error("dropping %s to peer %d: %s", type(msg).__name__, msg.dst, exc)
            return
        queue = link.queue
        queue.append(frame)
        link.queued_bytes += len(frame)
        # Drop oldest first: newer Raft messages supersede older ones to the same peer.
        while len(queue) > self._send_queue_max or (
            link.queued_bytes > self._send_queue_bytes_max and len(queue) > 1
        ):
            link.queued_bytes -= len(queue.popleft())
            link.dropped += 1
        link.wakeup.set()

    # ---- membership -------------------------------------------------------------------------

    def set_peers(self, peers: Mapping[int, tuple[str, int]]) -> None:
        """Make the set of peers exactly `peers` (our own id, if present, is ignored).

        New peers get a link; removed peers lose their link, queue and counters, and their
        inbound connections are closed; a peer whose address changed reconnects to the new one.
        """
        check_peers(peers)
        wanted = {pid: addr for pid, addr in peers.items() if pid != self._node_id}
        for pid in [pid for pid in self._links if pid not in wanted]:
            self._retire(self._links.pop(pid))
            for conn in self._inbound:
                if conn.peer_id == pid:
                    conn.writer.transport.abort()
        for pid, addr in wanted.items():
            link = self._links.get(pid)
            if link is None:
                link = _Link(pid, addr)
                self._links[pid] = link
                if self._started and not self._stopped:
                    self._start_link(link)
            elif link.address != addr:
                link.address = addr
                if self._started and not self._stopped:
                    self._retire(link)
                    self._start_link(link)

    def _retire(self, link: _Link) -> None:
        task, link.task = link.task, None
        link.connected = False
        if task is not None and not task.done():
            task.cancel()
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    # ---- stats ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """A fresh snapshot of the counters, shaped as `TransportStats` (plain dicts, so it can
        be serialised or merged into a status report as is); per-peer under "peers"."""
        snapshot = TransportStats(
            node_id=self._node_id,
            bound_port=self._bound_port,
            peers={pid: link.stats() for pid, link in sorted(self._links.items())},
            inbound_connections=len(self._inbound),
            auth_failures_unknown_peer=self._auth_failures_unknown_peer,
            handshake_failures=self._handshake_failures,
            inbound_refused_over_limit=self._inbound_refused_over_limit,
            dropped_no_route=self._dropped_no_route,
        )
        return dict(snapshot)

    # ---- outbound ---------------------------------------------------------------------------

    def _start_link(self, link: _Link) -> None:
        link.task = asyncio.get_running_loop().create_task(
            self._run_link(link), name=f"raft-peer-link-{self._node_id}-to-{link.peer_id}"
        )
        link.task.add_done_callback(self._report_crash)

    def _report_crash(self, task: asyncio.Task[None]) -> None:
        # A link task only ends by cancellation (every connection error is caught, logged and
        # followed by a reconnect); anything else is a bug worth a loud log.
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._log.error("peer transport task %s crashed", task.get_name(), exc_info=exc)

    def _backoff_ms(self, attempt: int) -> float:
        cap = min(self._backoff_ms_max, self._backoff_ms_min * 2 ** min(attempt, 32))
        return self._rng.uniform(self._backoff_ms_min, cap)

    async def _run_link(self, link: _Link) -> None:
        attempt = 0
        ever_connected = False
        while True:
            host, port = link.address
            writer: asyncio.StreamWriter | None = None
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    reader, writer = await asyncio.open_connection(
                        host, port, limit=PEER_READ_CHUNK_BYTES
                    )
                async with asyncio.timeout(self._handshake_timeout_s):
                    await self._client_handshake(link.peer_id, reader, writer)
            except PeerAuthError as exc:
                link.auth_failures += 1
                link.connect_failures += 1
                self._log.warning("refusing peer %d at %s:%d: %s", link.peer_id, host, port, exc)
            except (
                OSError,
                TimeoutError,
                PeerHandshakeError,
                FrameTooLargeError,
                MalformedFrameError,
            ) as exc:
                link.connect_failures += 1
                # Expected while a peer is down; only the first failure in a row is news.
                level = logging.INFO if attempt == 0 else logging.DEBUG
                self._log.log(
                    level,
                    "cannot reach peer %d at %s:%d: %s",
                    link.peer_id,
                    host,
                    port,
                    _why(exc),
                )
            except Exception:  # noqa: BLE001 - the link must outlive any connection's error
                link.connect_failures += 1
                self._log.exception(
                    "connecting to peer %d at %s:%d failed", link.peer_id, host, port
                )
            else:
                if ever_connected:
                    link.reconnects += 1
                ever_connected = True
                attempt = 0
                self._log.info("connected to peer %d at %s:%d", link.peer_id, host, port)
                try:
                    await self._pump(link, reader, writer)
                except (OSError, RuntimeError) as exc:
                    # RuntimeError: uvloop refuses a write on a transport that was closed under
                    # us (the peer died mid-write and the watcher aborted the connection).
                    self._log.info("lost connection to peer %d: %s", link.peer_id, _why(exc))
                except Exception:  # noqa: BLE001 - the link must outlive any connection's error
                    self._log.exception("connection to peer %d failed", link.peer_id)
                finally:
                    link.connected = False
            finally:
                if writer is not None:
                    writer.transport.abort()
            await asyncio.sleep(self._backoff_ms(attempt) / 1000)
            attempt += 1

    async def _client_handshake(
        self, peer_id: NodeId, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        hello = [HELLO, PROTOCOL_VERSION, self._cluster_id, self._node_id, peer_id, client_nonce]
        writer.write(encode_frame(hello, max_frame_bytes=HANDSHAKE_FRAME_BYTES_MAX))
        challenge = _expect(await _read_handshake_frame(reader, decoder), CHALLENGE, 2)
        server_nonce = _exact_bytes(challenge[1], NONCE_BYTES, "the server nonce")

        def mac_of(role: str) -> bytes:
            return mac(
                self._secret,
                role,
                cluster_id=self._cluster_id,
                client_id=self._node_id,
                server_id=peer_id,
                client_nonce=client_nonce,
                server_nonce=server_nonce,
            )

        proof = [PROOF, mac_of("client")]
        writer.write(encode_frame(proof, max_frame_bytes=HANDSHAKE_FRAME_BYTES_MAX))
        welcome = _expect(await _read_handshake_frame(reader, decoder), WELCOME, 2)
        server_mac = _exact_bytes(welcome[1], MAC_BYTES, "the server MAC")
        if not hmac.compare_digest(server_mac, mac_of("server")):
            raise PeerAuthError(
                f"peer {peer_id} did not prove knowledge of the cluster secret "
                f"(wrong secret or cluster id?)"
            )
        if decoder.buffered_bytes:
            raise PeerHandshakeError("peer sent data after its welcome")

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        link.peer_closed = False
        link.connected = True
        if link.queue:
            link.wakeup.set()  # frames queued while we were disconnected
        watcher = asyncio.get_running_loop().create_task(self._watch(link, reader, writer))
        try:
            while True:
                await link.wakeup.wait()
                link.wakeup.clear()
                if link.peer_closed:
                    raise ConnectionResetError("peer closed the connection")
                while link.queue:
                    if writer.transport.is_closing():
                        # Aborted by the watcher (peer gone): keep the frames for the next
                        # connection instead of handing them to a dead transport.
                        raise ConnectionResetError("the connection to the peer is closed")
                    frames = list(link.queue)
                    link.queue.clear()
                    link.queued_bytes = 0
                    # One call for the whole batch: the transport sends it with one syscall.
                    writer.writelines(frames)
                    link.sent += len(frames)
                    # Back-pressure: wait while the socket buffer is above its high-water mark.
                    await writer.drain()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # The peer never sends on our outbound connection after its welcome, so any read
        # completing means EOF, a reset or a protocol violation: in all cases the link is over.
        # Aborting also wakes a drain() that would otherwise wait on a dead peer.
        with contextlib.suppress(OSError):
            await reader.read(1)
        link.peer_closed = True
        writer.transport.abort()
        link.wakeup.set()

    # ---- inbound ----------------------------------------------------------------------------

    async def _handle_inbound(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peername = writer.get_extra_info("peername")
        if self._stopped:
            writer.transport.abort()
            return
        if len(self._inbound) >= PEER_INBOUND_CONNECTIONS_MAX and not self._make_room(peername):
            writer.transport.abort()
            return
        conn = _Inbound(writer, asyncio.current_task())
        self._inbound[conn] = None
        try:
            try:
                async with asyncio.timeout(self._handshake_timeout_s):
                    peer_id = await self._server_handshake(conn, reader, writer)
            except PeerAuthError as exc:
                self._count_auth_failure(conn.claimed_id)
                self._log.warning("refused peer connection from %s: %s", peername, exc)
                return
            except (
                OSError,
                TimeoutError,
                PeerHandshakeError,
                FrameTooLargeError,
                MalformedFrameError,
            ) as exc:
                if not self._stopped and not conn.evicted:
                    self._handshake_failures += 1
                    self._log.warning("peer handshake from %s failed: %s", peername, _why(exc))
                return
            conn.peer_id = peer_id
            # A peer has one outbound link to us; an older inbound connection from it is a
            # leftover of a link it has already given up on.
            for other in self._inbound:
                if other is not conn and other.peer_id == peer_id:
                    other.writer.transport.abort()
            self._log.info("peer %d connected from %s", peer_id, peername)
            await self._receive(peer_id, reader)
        finally:
            self._inbound.pop(conn, None)
            writer.transport.abort()

    def _make_room(self, peername: object) -> bool:
        """At the inbound limit: close the oldest unauthenticated connection, if there is one.

        Evicting rather than refusing means strangers holding every slot with silent
        connections cannot lock real peers out; they can only make handshakes race.
        """
        self._inbound_refused_over_limit += 1
        for conn in self._inbound:
            if conn.peer_id == NONE:
                conn.evicted = True
                conn.writer.transport.abort()
                del self._inbound[conn]
                self._log.warning(
                    "inbound connection limit (%d) reached: closed the oldest unauthenticated "
                    "connection to admit %s",
                    PEER_INBOUND_CONNECTIONS_MAX,
                    peername,
                )
                return True
        self._log.warning(
            "refusing connection from %s: %d authenticated inbound connections already open",
            peername,
            len(self._inbound),
        )
        return False

    def _count_auth_failure(self, claimed_id: NodeId) -> None:
        link = self._links.get(claimed_id)
        if link is None:
            self._auth_failures_unknown_peer += 1
        else:
            link.auth_failures += 1

    async def _server_handshake(
        self, conn: _Inbound, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> NodeId:
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
        hello = _expect(await _read_handshake_frame(reader, decoder), HELLO, 6)
        _, version, cluster_id, client_id, server_id, client_nonce = hello
        if type(client_id) is int:
            conn.claimed_id = client_id
        if version != PROTOCOL_VERSION:
            raise PeerHandshakeError(f"unsupported peer protocol version {version!r}")
        if cluster_id != self._cluster_id:
            raise PeerAuthError(
                f"node {client_id!r} belongs to cluster {cluster_id!r}, not {self._cluster_id!r}"
            )
        if type(server_id) is not int or server_id != self._node_id:
            raise PeerAuthError(f"hello addressed to node {server_id!r}, we are {self._node_id}")
        if type(client_id) is not int or client_id == self._node_id or client_id not in self._links:
            raise PeerAuthError(f"node id {client_id!r} is not one of our peers")
        client_nonce = _exact_bytes(client_nonce, NONCE_BYTES, "the client nonce")
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        writer.write(
            encode_frame([CHALLENGE, server_nonce], max_frame_bytes=HANDSHAKE_FRAME_BYTES_MAX)
        )

        def mac_of(role: str) -> bytes:
            return mac(
                self._secret,
                role,
                cluster_id=self._cluster_id,
                client_id=client_id,
                server_id=self._node_id,
                client_nonce=client_nonce,
                server_nonce=server_nonce,
            )

        proof = _expect(await _read_handshake_frame(reader, decoder), PROOF, 2)
        client_mac = _exact_bytes(proof[1], MAC_BYTES, "the client MAC")
        if not hmac.compare_digest(client_mac, mac_of("client")):
            raise PeerAuthError(
                f"node {client_id} did not prove knowledge of the cluster secret (wrong secret?)"
            )
        if decoder.buffered_bytes:
            raise PeerHandshakeError(f"node {client_id} sent data before our welcome")
        writer.write(
            encode_frame([WELCOME, mac_of("server")], max_frame_bytes=HANDSHAKE_FRAME_BYTES_MAX)
        )
        return client_id

    async def _receive(self, peer_id: NodeId, reader: asyncio.StreamReader) -> None:
        decoder = FrameDecoder(self._max_frame_bytes)
        while True:
            try:
                data = await reader.read(PEER_READ_CHUNK_BYTES)
            except OSError as exc:
                self._log.info("connection from peer %d failed: %s", peer_id, exc)
                return
            if not data:
                self._log.info("peer %d closed its connection", peer_id)
                return
            link = self._links.get(peer_id)
            if link is None:
                return  # removed by set_peers while we were reading
            try:
                decoder.feed(data)
                while (obj := decoder.next_frame()) is not NEED_DATA:
                    self._deliver(link, obj)
            except (FrameTooLargeError, MalformedFrameError) as exc:
                # The stream is out of sync: nothing after this point can be trusted.
                link.malformed += 1
                self._log.warning("closing connection from peer %d: %s", peer_id, exc)
                return

    def _deliver(self, link: _Link, obj: object) -> None:
        try:
            msg = decode_message(obj)
        except MalformedMessageError as exc:
            # The frame boundary was fine, so the stream is still in sync: drop just this one.
            link.malformed += 1
            self._log.warning("dropping malformed message from peer %d: %s", link.peer_id, exc)
            return
        if msg.dst != self._node_id or msg.src != link.peer_id:
            link.rejected += 1
            self._log.warning(
                "dropping %s from peer %d with src=%d dst=%d (we are %d)",
                type(msg).__name__,
                link.peer_id,
                msg.src,
                msg.dst,
                self._node_id,
            )
            return
        link.received += 1
        try:
            self._on_message(msg)
        except Exception:  # noqa: BLE001 - a bug in the node must not kill the peer link
            self._log.exception(
                "on_message raised for %s from peer %d", type(msg).__name__, link.peer_id
            )
