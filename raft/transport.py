"""Authenticated asyncio links that carry Raft messages between peers.

Key idea: every node keeps exactly one *outbound* TCP connection to each peer and sends only on
it; connections a peer opens to us are *inbound* and we only receive on them. So all messages
from A to B travel over one ordered byte stream, and a reconnect is the only place where
messages can be lost (Raft tolerates loss; it does not tolerate reordering inside a stream
being mistaken for something else, and we never retry single messages). The one exception to
the order is a large snapshot (below), delivered when its last chunk arrives.

Sending. `send(msg)` encodes the message into a frame (`raft.wire` + `raft.framing`) at once
and appends it to that peer's bounded queue; it never blocks and never raises for network
trouble. When the queue is full the oldest frame is dropped and counted. A per-peer writer
task wakes up, takes everything queued, hands it to the socket in one `writelines` (write
coalescing: a burst of small messages costs one syscall) and awaits `drain()`, so a slow peer
exerts back-pressure on its own queue only. `flush()` (the node calls it after each batch of
sends; otherwise a callback scheduled at the first send does) writes the queue of a link whose
writer task is parked with nothing in flight directly to its socket, without waking the task: a
lone message leaves at once instead of one loop iteration later. If the connection fails, the
task reconnects with exponential backoff and jitter between RECONNECT_BACKOFF_MS_MIN and _MAX;
the backoff starts over only after a link stayed up for the maximum delay (a peer that closes
every link right after the handshake is redialled ever more slowly, not at the minimum).
Every peer connection (both directions) has TCP keepalive and a TCP user timeout: a peer that
vanished without a reset or stopped reading ends the link within PEER_TCP_USER_TIMEOUT_MS
instead of TCP's quarter of an hour (see raft.limits), and the link redials.

Snapshot transfers. An InstallSnapshot whose encoding is larger than the chunk size
(SNAPSHOT_CHUNK_BYTES) is not queued as one frame: the link keeps it as its one pending transfer
(a random 64-bit transfer id, the encoding as a small head plus the snapshot's own data bytes,
not copied; total size; next offset; acknowledged offset) and its writer cuts chunk frames from
it, SNAPSHOT_CHUNKS_PER_ROUND per round after the frames queued meanwhile, awaiting drain()
between rounds: other messages are not starved and the transfer gets back-pressure. A newer
snapshot replaces the pending transfer; the same one (same message term, snapshot index and
snapshot term: the core's retry) is ignored while its transfer is pending and starts a new
transfer once it has completed. A node that stops leading gives its transfers up
(`drop_snapshot_transfers`): only a leader sends snapshots. Frames of the transport itself
(tags >= 64, see raft.wire):

    chunk  [64, transfer_id, size, offset, epoch, digest, data]
    ack    [65, transfer_id, offset, status, epoch]     status: 0 progress, 1 rewind, 2 done,
                                                                3 failed

`digest` is the SHA-256 of all `size` bytes in the chunk that ends the transfer, b"" in the
others; both sides hash the bytes in order as they pass, so neither hashes a whole snapshot at
once. The receiver reassembles per authenticated peer, not per connection (at most
SNAPSHOT_TRANSFER_BYTES_MAX bytes, one transfer per peer), ignores bytes it already holds,
checks size and digest, decodes the message and delivers it like any other (same src/dst
checks). It answers on its own outbound link to the sender: progress every
SNAPSHOT_ACK_INTERVAL_BYTES, done at the end, failed when it drops the transfer (malformed
chunk, over the limit, bad digest, undecodable message: counted and logged, nothing is closed),
and rewind(the offset it holds) when a chunk leaves a gap or belongs to a transfer it does not
hold (it restarted, or dropped it). A transfer no chunk of which added bytes for
SNAPSHOT_TRANSFER_IDLE_MS is dropped, spool file and all, without a word to the sender: it
restarted or gave the transfer up (nothing else would end it); if it goes on, a rewind asks
for it from the start. A failed transfer is forgotten by the sender; the core's next
retry starts a new one. After a reconnect the sender continues from the acknowledged offset, not
from zero. `epoch` counts the sender's passes over a transfer (bumped at each reconnect, rewind
and nudge): the receiver sends at most one rewind per (transfer, epoch) and the sender ignores a
rewind of an older epoch, so a burst of chunks in flight past a gap costs one rewind. A nudge:
when the core retries a transfer whose bytes were all written and no acknowledgement arrived
since its previous retry (the acks may have been lost), the sender goes back to the
acknowledged offset. Ordering: a chunked snapshot is delivered when its last chunk arrives, so
messages sent after it can overtake it. The core is safe under any reordering (the seeded
simulation reorders, drops and duplicates messages), and in practice a leader sends a follower
that waits for a snapshot only heartbeats, and a follower ignores a snapshot at or below its
commit index.

Handshake (inside HANDSHAKE_TIMEOUT_MS, frames capped at HANDSHAKE_FRAME_BYTES_MAX):

    client -> server  ["raft-peer-hello", version, cluster_id, client_id, server_id, nonce_c]
    server -> client  ["raft-peer-challenge", nonce_s]
    client -> server  ["raft-peer-proof", mac("client")]
    server -> client  ["raft-peer-welcome", mac("server")]

    mac(role) = HMAC-SHA256(secret, msgpack([role, version, cluster_id, client_id, server_id,
                                             nonce_c, nonce_s]))

Both sides prove knowledge of the shared secret without sending it; fresh 32-byte nonces from
both sides stop replay; the role label stops a MAC from being reflected back; the cluster id,
the version and both node ids are bound in. The connecting side proves first, so the exposed
listener never computes a MAC for a stranger. MACs are compared with `hmac.compare_digest`.
A connection that ends during the handshake (EOF, a reset, or a write that finds it closed under
us, which uvloop refuses with RuntimeError: `PeerConnectionClosedError`) ends that attempt only:
counted (the listener's `handshake_failures`, the dialler's `connect_failures`) and logged at
info at most, never with a traceback.

Protocol versions (a rolling upgrade). A node speaks every version from PROTOCOL_VERSION_MIN to
PROTOCOL_VERSION; a connection speaks the version of the dialler's hello, which the listener
accepts if it speaks it (else it closes the connection without a word, as releases before
version 6, which speak one version, do for any other). Every node's links dial all its peers,
and a dialler offers the newer of the versions both speak as far as it knows: its newest, or,
once the peer has dialled it (authenticated), the older of its newest and the version of the
peer's last hello (`peer_hello_version`: a node offers its newest, so that is the newest the
peer's release speaks). When the old node restarts upgraded, its hello of version 6 makes the
new node end its outbound connection to it if that speaks an older version, and redial. A node
that never hears from its peer (the peer cannot dial it: one-way reachability) learns from
refused dials instead. A dial whose hello the peer closes without a word
(`PeerHelloRefusedError`) is followed by a probe: a dial offering the next older version we
speak that ends once the peer has challenged it (the peer counts and logs a failed handshake).
If the peer challenges it, the next dial offers the refused version once more, and only if the
peer refuses that again does the link fall back to the older version (`fallback_version`) for
its later dials. So a close after the hello alone never lowers the version: a proxy in front of
a node that is down closes every hello, and the link then alternates between the versions, one
per dial (the usual redials, with their backoff; after the oldest version, the newest); the
node that comes up behind it is offered the newest, or the probe and then the newest, so two
nodes of one release speak its newest. The fallback ends when the peer's hello is of a newer
version, or when the peer closes a hello of the fallback version (it no longer speaks it).
Known limit: a peer that restarts upgraded and still never dials us keeps being offered the
fallback version until it does or this node restarts. What differs between the versions is only
the encoding of the messages a link sends (`raft.wire`; version 5: heartbeats without
incarnations), so frames queued for one version are dropped (counted) when the next connection
speaks another; the receiving side decodes every version it speaks.

Invariants:
* No message from a connection is delivered before that connection has authenticated, and the
  `src` of every delivered message equals the authenticated peer id and its `dst` is us.
* Before authentication a stranger can make us buffer at most HANDSHAKE_FRAME_BYTES_MAX bytes
  and hold a slot for at most HANDSHAKE_TIMEOUT_MS; at most PEER_INBOUND_CONNECTIONS_MAX
  inbound connections exist at once, and at the limit the oldest unauthenticated one makes
  room for a newcomer; at most STRANGERS_PER_HOST_MAX of them come from one source address
  (a newcomer past it is closed), so a flood from one host cannot hold every slot.
* A bad frame closes only the connection it arrived on; a bad chunk drops only its transfer;
  nothing a peer sends can raise out of this module into the node.
* What a peer or a stranger sends costs the log a few lines a second at most: warnings about
  one peer's frames, and about refused handshakes, are rate-limited (PEER_WARNINGS_BURST,
  PEER_WARNINGS_PER_S; the next line logged says how many were left out), while the counters
  (`malformed`, `rejected`, `auth_failures`, `handshake_failures`) count every one.
* A link holds at most one outgoing and one incoming snapshot transfer; only whole, verified
  InstallSnapshot messages reach the node.

TLS (optional, `tls=TlsFiles(...)`, see raft.tls): every link is mutual TLS against the
cluster CA and the handshake above runs unchanged inside it (the byte protocol above TLS is
the same, so the protocol version does not depend on it). On top of the CA check, a peer's
certificate must name the node it speaks for (CN `node-<id>`): the dialler checks the node it
reached, the listener the id claimed in the hello. The listener runs handshakes itself
(`TlsListener`) so a refused one (a certificate of another CA, a plaintext peer) is logged and
counted (`tls_refused`) instead of vanishing inside asyncio.

Revocation (optional, `revoked=callable(fingerprint) -> bool`, with TLS only): the node says
which certificates it no longer accepts, by SHA-256 fingerprint of the DER certificate
(lowercase hex). A peer presenting one is refused at the handshake on either side, after the
CN check and before any MAC (counted in `tls_revoked_refused`, error `CertificateRevokedError`);
a listener that refuses it first sends `["raft-peer-refused", reason]`, so the refused node
logs why (`PeerRefusedError`) instead of seeing a bare close. `close_revoked()` closes the
open links that authenticated with a certificate revoked since. `peer_certificates(id)`: the
fingerprints a peer presented here (what a removal revokes); `live_certificates()`: those of
the links open now.

Limits (known, by design): without TLS, authentication only. After the handshake the stream is
neither encrypted nor integrity-protected, so an attacker who can inject into or relay a TCP
connection can act as an authenticated peer. Run peers on a trusted network, or with TLS.

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
import socket
import ssl
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypedDict

import msgpack

from raft.core.types import NONE, InstallSnapshot, Message, NodeId
from raft.errors import (
    CertificateRevokedError,
    FrameTooLargeError,
    InsecureSecretFileError,
    InvalidLimitError,
    MalformedFrameError,
    MalformedMessageError,
    PeerAuthError,
    PeerConnectionClosedError,
    PeerHandshakeError,
    PeerHelloRefusedError,
    PeerRefusedError,
    SecretFileError,
    TransportConfigError,
)
from raft.exclusive_file import create_exclusive
from raft.filebytes import FileBytes, FileReadError, SnapshotData
from raft.framing import (
    FRAME_LENGTH_CAPACITY,
    NEED_DATA,
    FrameDecoder,
    encode_frame,
    msgpack_bin_header,
)
from raft.limits import (
    CLUSTER_ID_CHARS_MAX,
    HANDSHAKE_FRAME_BYTES_MAX,
    HANDSHAKE_TIMEOUT_MS,
    PEER_CONNECT_TIMEOUT_MS,
    PEER_FRAME_BYTES_MAX,
    PEER_FRAME_ITEMS_MAX,
    PEER_INBOUND_CONNECTIONS_MAX,
    PEER_KEEPALIVE_IDLE_MS,
    PEER_KEEPALIVE_INTERVAL_MS,
    PEER_KEEPALIVE_PROBES,
    PEER_READ_CHUNK_BYTES,
    PEER_SEND_QUEUE_BYTES_MAX,
    PEER_SEND_QUEUE_MAX,
    PEER_STOP_TIMEOUT_MS,
    PEER_TCP_USER_TIMEOUT_MS,
    PEER_WARNINGS_BURST,
    PEER_WARNINGS_PER_S,
    RECONNECT_BACKOFF_MS_MAX,
    RECONNECT_BACKOFF_MS_MIN,
    SECRET_BYTES_MIN,
    SECRET_FILE_BYTES_MAX,
    SNAPSHOT_ACK_INTERVAL_BYTES,
    SNAPSHOT_CHUNK_BYTES,
    SNAPSHOT_CHUNKS_PER_ROUND,
    SNAPSHOT_TRANSFER_BYTES_MAX,
    SNAPSHOT_TRANSFER_IDLE_MS,
    SNAPSHOT_UNREADABLE_RETRY_MS,
    STRANGERS_PER_HOST_MAX,
)
from raft.ratelimit import LogBudget
from raft.tls import (
    TlsFiles,
    TlsListener,
    node_common_name,
    peer_client_context,
    peer_common_name,
    peer_server_context,
    source_host,
)
from raft.wire import (
    address_problem,
    decode_install_snapshot,
    decode_message,
    encode_install_snapshot_head,
    encode_message,
    show_value,
)

# 2: AppendResponse carries reject_term; heartbeats carry the sender's clock (raft.wire).
# 3: snapshots larger than the chunk size travel as chunk frames with acknowledgements (a node
#    of version 2 would take a chunk for a malformed message and never install the snapshot).
# 4: heartbeats and their responses echo the clock of the last one heard from the peer
#    (round-trip clock offsets, raft.node).
# 5: InstallSnapshot carries the leader's commit index (the receiver's catch-up floor).
# 6: heartbeats and their responses carry the sender's incarnation and the incarnation of the
#    clock they echo (raft.node: a node closes a round trip only with its own process's clock).
# A node speaks every version from PROTOCOL_VERSION_MIN to PROTOCOL_VERSION ("Protocol
# versions" in the module docstring): a rolling upgrade from the previous release works.
# Older versions are refused at the handshake.
PROTOCOL_VERSION: Final = 6
PROTOCOL_VERSION_MIN: Final = 5
# The first version whose heartbeats carry incarnations (raft.wire's long form).
INCARNATIONS_VERSION: Final = 6
NONCE_BYTES: Final = 32
MAC_BYTES: Final = 32  # HMAC-SHA256 digest size

HELLO: Final = "raft-peer-hello"
CHALLENGE: Final = "raft-peer-challenge"
PROOF: Final = "raft-peer-proof"
WELCOME: Final = "raft-peer-welcome"
# Sent by a listener, instead of its challenge, to a peer whose certificate it refuses (revoked).
REFUSED: Final = "raft-peer-refused"
_REFUSED_REASON_CHARS_MAX: Final = 300
# How long a listener waits for its refusal frame to leave before it closes the connection.
_REFUSED_FLUSH_S: Final = 1.0
# Certificates remembered per peer id (newest last): a rotation in progress shows two.
PEER_CERTS_SEEN_MAX: Final = 4

# Transport frames (tags >= 64 are never Raft messages, see raft.wire) and the ack statuses.
TAG_SNAPSHOT_CHUNK: Final = 64
TAG_SNAPSHOT_ACK: Final = 65
ACK_PROGRESS: Final = 0  # the receiver holds `offset` bytes
ACK_REWIND: Final = 1  # the receiver holds `offset` bytes and cannot use what came after them
ACK_DONE: Final = 2  # the receiver holds and delivered the whole transfer
ACK_FAILED: Final = 3  # the receiver dropped the transfer; the sender forgets it
_ACK_STATUSES: Final = (ACK_PROGRESS, ACK_REWIND, ACK_DONE, ACK_FAILED)
_DIGEST_BYTES: Final = 32  # SHA-256
# Name suffix of an incoming transfer's spool file (see PeerTransport's snapshot_spool_dir).
SPOOL_SUFFIX: Final = ".snapshot-part"
# A chunk frame's bytes besides its data: array header, tag, four integers of up to 9 bytes each,
# the digest with its header and the data's bin header come to 80; the rest is margin.
_CHUNK_FRAME_OVERHEAD_BYTES: Final = 128

_U64_END: Final = 1 << 64
_PORT_MAX: Final = 65535

Address = tuple[str, int]


class PeerStats(TypedDict):
    """Counters of one peer, in `PeerTransport.stats()["peers"][peer_id]`."""

    address: str
    connected: bool  # the outbound link is up (handshake done)
    queued: int  # frames waiting to be written
    sent: int  # queued frames handed to the socket (chunks not included: see below)
    dropped: int  # frames dropped: queue overflow (oldest first) or too large to send
    reconnects: int  # successful connections after the first one
    connect_failures: int  # outbound attempts that failed before authentication finished
    auth_failures: int  # handshakes with this peer id refused on either side of a link
    received: int  # messages delivered to on_message (a chunked snapshot counts once)
    # Bytes of frames handed to our outbound connection's socket (messages and snapshot
    # chunks, not the handshake), and bytes read from the peer's authenticated inbound
    # connection (everything after its hello). Counted per batch/read, not per message.
    bytes_sent: int
    bytes_received: int
    rejected: int  # messages dropped because dst was not us or src not the peer
    malformed: int  # undecodable frames/messages/chunks/acks from this peer
    # Snapshot transfers to this peer (see "Snapshot transfers" in the module docstring).
    snapshot_transfers_started: int
    snapshot_transfers_completed: int  # acknowledged whole by the peer
    # Seconds from the start of each completed transfer to the peer's done acknowledgement,
    # summed (with snapshot_transfers_completed as the count: a summary).
    snapshot_send_seconds_total: float
    snapshot_transfers_resumed: int  # continued from a non-zero offset after a reconnect
    snapshot_transfers_replaced: int  # abandoned for a newer snapshot
    snapshot_transfers_failed: int  # dropped by the peer (it said so); the core retries
    snapshot_transfers_unreadable: int  # given up: the snapshot's file could not be read
    snapshot_chunk_bytes_sent: int  # data bytes of chunks handed to the socket
    snapshot_transfer_bytes: int  # size of the pending transfer (0: none)
    snapshot_transfer_acked_bytes: int  # of which the peer acknowledged this many
    # Snapshot transfers from this peer.
    snapshot_transfers_received: int  # whole and verified (then checked like any message)
    snapshot_transfers_dropped: int  # malformed chunk, over the limit, bad digest or message,
    # or idle for SNAPSHOT_TRANSFER_IDLE_MS
    # The peer protocol version of the outbound link (its last connection's), and that of the
    # peer's last authenticated hello on an inbound connection (0: none yet).
    protocol_version: int
    peer_hello_version: int
    # The version the link offers at most because the peer refused a newer one right after it
    # accepted this one (a node of an older release that never dialled us; 0: none).
    fallback_version: int


class TransportStats(TypedDict):
    """The shape of `PeerTransport.stats()`."""

    node_id: int
    bound_port: int
    peers: dict[int, PeerStats]
    # False: the links only accept their peers' connections; none dials out (see set_peers).
    dialling: bool
    inbound_connections: int
    # Failures that cannot be attributed to a configured peer.
    auth_failures_unknown_peer: int
    handshake_failures: int
    inbound_refused_over_limit: int  # connections closed because of the inbound limit
    # Connections closed because their host already had STRANGERS_PER_HOST_MAX unauthenticated
    inbound_refused_per_host: int
    dropped_no_route: int
    # Inbound connections refused before the Raft handshake: a failed TLS handshake (another
    # CA, no certificate), plaintext on a TLS listener, or the TLS handshake limit.
    tls_refused: int
    # Handshakes refused (either side) and open links closed because the peer's certificate is
    # revoked (the `revoked` callable).
    tls_revoked_refused: int
    tls_revoked_closed: int


def mac(
    secret: bytes,
    role: str,
    *,
    cluster_id: str,
    client_id: int,
    server_id: int,
    client_nonce: bytes,
    server_nonce: bytes,
    version: int = PROTOCOL_VERSION,
) -> bytes:
    """The handshake MAC (see the module docstring). msgpack makes the input unambiguous.
    `version`: the one the connection speaks (the client's hello), bound in like the ids."""
    material = msgpack.packb(
        [role, version, cluster_id, client_id, server_id, client_nonce, server_nonce],
        use_bin_type=True,
    )
    return hmac.new(secret, material, hashlib.sha256).digest()


# ---- secret file ----------------------------------------------------------------------------


def load_or_create_secret(path: Path) -> bytes:
    """Return the cluster secret stored at `path`, creating it first if it does not exist.

    An existing file must be a regular file that neither group nor others can access (0600 or
    stricter), else InsecureSecretFileError. A new file gets 32 random bytes as hex, is
    written whole or not at all with mode 0600 (`raft.exclusive_file.create_exclusive`: a
    disk that fills mid-write leaves no short secret; if two processes race, one creates and
    both read the same secret), and its missing parent directory is created with mode 0700.
    Surrounding whitespace is not part of the secret.
    """
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)  # mkdir's mode is filtered by the umask
    create_exclusive(path, (secrets.token_hex(32) + "\n").encode("ascii"))
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


class _Outgoing:
    """A snapshot transfer from us to one peer: the encoded InstallSnapshot as `head` + `data`
    (the snapshot's own bytes, never copied) and how far it got."""

    __slots__ = (
        "acked",
        "acked_at_retry",
        "data",
        "digest",
        "epoch",
        "hashed",
        "hasher",
        "head",
        "key",
        "next_offset",
        "size",
        "started_monotonic",
        "transfer_id",
    )

    def __init__(
        self, transfer_id: int, key: tuple[int, int, int], head: bytes, data: SnapshotData
    ) -> None:
        self.transfer_id = transfer_id
        self.key = key  # (message term, snapshot index, snapshot term)
        self.head = head
        self.data = data
        self.size = len(head) + len(data)
        self.next_offset = 0  # the next byte to write
        self.acked = 0  # bytes the peer said it holds
        self.acked_at_retry = -1  # `acked` when the core last re-sent this snapshot
        self.epoch = 0  # passes over the bytes (see the module docstring)
        self.started_monotonic = time.monotonic()  # for snapshot_send_seconds_total
        # SHA-256 of bytes [0, hashed), fed as chunks are first cut; digest once complete.
        self.hasher = hashlib.sha256()
        self.hashed = 0
        self.digest = b""

    def pieces(self, start: int, end: int) -> list[bytes | memoryview]:
        """Bytes [start, end) of the encoding, as slices of head and data (no copy of data
        held in memory; data left in its file is read, one chunk: FileReadError if it cannot
        be)."""
        out: list[bytes | memoryview] = []
        h = len(self.head)
        if start < h:
            out.append(self.head[start : min(end, h)])
        if end > h:
            if isinstance(self.data, FileBytes):
                out.append(self.data.read(max(start, h) - h, end - h))
            else:
                out.append(memoryview(self.data)[max(start, h) - h : end - h])
        return out

    def next_chunk(self, chunk_bytes: int) -> tuple[list[bytes | memoryview], int]:
        """The frame of the chunk at next_offset (as buffers for writelines) and its data size;
        advances next_offset."""
        start = self.next_offset
        end = min(self.size, start + chunk_bytes)
        pieces = self.pieces(start, end)  # read once: hashed (the first time) and sent
        if end > self.hashed:
            for piece in pieces if start == self.hashed else self.pieces(self.hashed, end):
                self.hasher.update(piece)
            self.hashed = end
        if end == self.size and not self.digest:
            self.digest = self.hasher.digest()
        digest = self.digest if end == self.size else b""
        prefix = b"".join(
            (
                b"\x97",  # array of 7, as in the module docstring
                msgpack.packb(TAG_SNAPSHOT_CHUNK),
                msgpack.packb(self.transfer_id),
                msgpack.packb(self.size),
                msgpack.packb(start),
                msgpack.packb(self.epoch),
                msgpack.packb(digest, use_bin_type=True),
                msgpack_bin_header(end - start),
            )
        )
        self.next_offset = end
        header = (len(prefix) + end - start).to_bytes(4, "big")
        return [header + prefix, *pieces], end - start


class _Incoming:
    """A snapshot transfer from one peer to us, reassembled in order: in a spool file when the
    transport has a spool directory (then the heap holds one chunk at a time, whatever the
    snapshot's size, and the complete transfer stays in the file: raft.filebytes), else in
    memory."""

    __slots__ = (
        "acked",
        "buf",
        "expiry",
        "fd",
        "hasher",
        "held",
        "last_chunk_at",
        "path",
        "size",
        "transfer_id",
    )

    def __init__(
        self, transfer_id: int, size: int, *, peer_id: NodeId, spool_dir: Path | None
    ) -> None:
        self.transfer_id = transfer_id
        self.size = size
        self.held = 0  # bytes [0, held) of the transfer are in buf or the spool file
        self.buf = bytearray()
        self.hasher = hashlib.sha256()  # of bytes [0, held)
        self.acked = 0  # the offset in our last progress ack
        # The loop time of the last chunk that added bytes, and the timer that drops the
        # transfer once none came for the idle limit (see SNAPSHOT_TRANSFER_IDLE_MS).
        self.last_chunk_at = 0.0
        self.expiry: asyncio.TimerHandle | None = None
        self.fd = -1
        self.path: Path | None = None
        if spool_dir is not None:
            spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path = spool_dir / f"peer-{peer_id}-{transfer_id:016x}{SPOOL_SUFFIX}"
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)

    def write(self, data: memoryview) -> None:
        """Append the next bytes of the transfer. OSError: the spool file failed."""
        self.hasher.update(data)
        self.held += len(data)
        if self.fd < 0:
            self.buf += data
            return
        while data:
            data = data[os.write(self.fd, data) :]

    def encoded(self) -> memoryview | FileBytes:
        """The whole transfer, once held == size: the spool file's bytes, read on demand (the
        file is closed and unlinked; the range's own descriptor keeps it until the last range
        over it goes), or the buffer. Never mapped: a page the disk could not read, or a file
        someone truncated, would be a SIGBUS; read, it is a FileReadError."""
        if self.fd < 0:
            return memoryview(self.buf)
        assert self.path is not None
        try:
            return FileBytes.of_fd(self.fd, self.path, 0, self.size)
        finally:
            self.discard()

    def discard(self) -> None:
        """Forget the bytes held (closing and deleting the spool file). Idempotent."""
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None
        self.buf = bytearray()


class _Link:
    """Everything about one peer: our outbound queue, writer task and snapshot transfer to it,
    the snapshot transfer we receive from it (per peer, not per connection), and counters."""

    __slots__ = (
        "address",
        "auth_failures",
        "bytes_received",
        "bytes_sent",
        "checking_version",
        "connect_failures",
        "connected",
        "dirty",
        "dropped",
        "fallback_version",
        "hellos_heard",
        "idle_writer",
        "incoming",
        "incoming_done_id",
        "incoming_failed_id",
        "malformed",
        "outgoing",
        "peer_closed",
        "peer_hello_version",
        "peer_id",
        "queue",
        "queued_bytes",
        "received",
        "reconnects",
        "redial",
        "refused_version",
        "rejected",
        "rewind_sent",
        "sent",
        "snapshot_chunk_bytes_sent",
        "snapshot_send_seconds_total",
        "snapshot_transfers_completed",
        "snapshot_transfers_dropped",
        "snapshot_transfers_failed",
        "snapshot_transfers_received",
        "snapshot_transfers_replaced",
        "snapshot_transfers_resumed",
        "snapshot_transfers_started",
        "snapshot_transfers_unreadable",
        "task",
        "unreadable_key",
        "unreadable_until",
        "version",
        "wakeup",
        "warnings",
    )

    def __init__(self, peer_id: NodeId, address: Address, version: int) -> None:
        self.peer_id = peer_id
        self.address = address
        # The protocol version the queued frames are encoded for: that of the last connection
        # (before the first one, the newest this node speaks); and the version of the peer's
        # last authenticated hello, 0 before one (see "Protocol versions" in the docstring).
        self.version = version
        self.peer_hello_version = 0
        self.hellos_heard = 0  # authenticated hellos from the peer: a dial's result is stale
        # when one arrived meanwhile (the hello is the fresher evidence)
        # Versions learnt from refused dials (see "Protocol versions" in the docstring): the
        # last dial's hello of this version was closed without a word (0: it was not); the
        # last dial, one version older, was challenged, so the next dial offers this version
        # once more (0: no such check pending); the peer refused a newer version right after
        # accepting this one (a node of an older release), so no dial offers a newer one until
        # the peer's hello says it speaks one (0: none).
        self.refused_version = 0
        self.checking_version = 0
        self.fallback_version = 0
        self.redial = False  # end the connection: the next dial offers another version
        # Invariant: queued_bytes == sum(len(f) for f in queue).
        self.queue: collections.deque[bytes] = collections.deque()
        self.queued_bytes = 0
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        # The connection's writer while the link's writer task is parked with nothing in
        # flight (see PeerTransport.flush); None otherwise.
        self.idle_writer: asyncio.StreamWriter | None = None
        self.dirty = False  # listed in PeerTransport._dirty
        self.connected = False
        self.peer_closed = False
        self.outgoing: _Outgoing | None = None
        self.incoming: _Incoming | None = None
        # The peer's last transfers we completed and dropped: their late chunks are answered
        # with done/failed again (the first answer may have been lost) instead of restarting.
        self.incoming_done_id = -1
        self.incoming_failed_id = -1
        self.rewind_sent: tuple[int, int] = (-1, -1)  # (transfer id, epoch) of our last rewind
        self.sent = 0
        self.dropped = 0
        self.reconnects = 0
        self.connect_failures = 0
        self.auth_failures = 0
        self.received = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.rejected = 0
        self.malformed = 0
        self.snapshot_transfers_started = 0
        self.snapshot_transfers_completed = 0
        self.snapshot_transfers_resumed = 0
        self.snapshot_transfers_replaced = 0
        self.snapshot_transfers_failed = 0
        self.snapshot_transfers_unreadable = 0
        # The last snapshot found unreadable for this peer (its key) and until when (monotonic)
        # it is not tried again (SNAPSHOT_UNREADABLE_RETRY_MS).
        self.unreadable_key: tuple[int, int, int] | None = None
        self.unreadable_until = 0.0
        self.snapshot_chunk_bytes_sent = 0
        self.snapshot_send_seconds_total = 0.0
        self.snapshot_transfers_received = 0
        self.snapshot_transfers_dropped = 0
        # Warnings about what this peer sent (see PeerTransport._warn_peer).
        self.warnings = LogBudget(burst=PEER_WARNINGS_BURST, per_s=PEER_WARNINGS_PER_S)

    def has_chunks(self) -> bool:
        out = self.outgoing
        return out is not None and out.next_offset < out.size

    def stats(self) -> PeerStats:
        out = self.outgoing
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
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            rejected=self.rejected,
            malformed=self.malformed,
            snapshot_transfers_started=self.snapshot_transfers_started,
            snapshot_transfers_completed=self.snapshot_transfers_completed,
            snapshot_send_seconds_total=self.snapshot_send_seconds_total,
            snapshot_transfers_resumed=self.snapshot_transfers_resumed,
            snapshot_transfers_replaced=self.snapshot_transfers_replaced,
            snapshot_transfers_failed=self.snapshot_transfers_failed,
            snapshot_transfers_unreadable=self.snapshot_transfers_unreadable,
            snapshot_chunk_bytes_sent=self.snapshot_chunk_bytes_sent,
            snapshot_transfer_bytes=out.size if out is not None else 0,
            snapshot_transfer_acked_bytes=out.acked if out is not None else 0,
            snapshot_transfers_received=self.snapshot_transfers_received,
            snapshot_transfers_dropped=self.snapshot_transfers_dropped,
            protocol_version=self.version,
            peer_hello_version=self.peer_hello_version,
            fallback_version=self.fallback_version,
        )


class _Inbound:
    """A connection a peer opened to us; `peer_id` stays NONE until it has authenticated."""

    __slots__ = ("claimed_id", "evicted", "host", "peer_id", "task", "writer")

    def __init__(
        self, writer: asyncio.StreamWriter, task: asyncio.Task[Any] | None, host: str
    ) -> None:
        self.writer = writer
        self.task = task
        self.host = host  # the source address, for the per-host stranger cap
        self.claimed_id: NodeId = NONE
        self.peer_id: NodeId = NONE
        self.evicted = False  # closed by us to make room (see _make_room)


class _Receiver(asyncio.Protocol):
    """The protocol of an authenticated inbound connection (see PeerTransport._receive)."""

    def __init__(
        self, owner: PeerTransport, peer_id: NodeId, transport: asyncio.WriteTransport
    ) -> None:
        self._owner = owner
        self._peer_id = peer_id
        self._transport = transport
        self._decoder = FrameDecoder(owner._max_frame_bytes, max_items=PEER_FRAME_ITEMS_MAX)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self._transport.is_closing():
            return
        if not self._owner._receive_data(self._peer_id, self._decoder, data):
            self._transport.abort()

    def eof_received(self) -> bool:
        self._owner._log.info("peer %d closed its connection", self._peer_id)
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._owner._log.info("connection from peer %d failed: %s", self._peer_id, exc)
        if not self.done.done():
            self.done.set_result(None)


async def _read_handshake_frame(reader: asyncio.StreamReader, decoder: FrameDecoder) -> object:
    while (obj := decoder.next_frame()) is NEED_DATA:
        try:
            data = await reader.read(HANDSHAKE_FRAME_BYTES_MAX)
        except ConnectionError as exc:
            raise PeerConnectionClosedError(
                f"connection closed during the handshake ({_why(exc)})"
            ) from exc
        if not data:
            raise PeerConnectionClosedError("connection closed during the handshake")
        decoder.feed(data)
    return obj


def _write_handshake_frame(writer: asyncio.StreamWriter, obj: list[object]) -> None:
    """Hand a handshake frame to the connection. One closed under us (the peer reset it, or
    we closed it to make room) ends the handshake as an EOF does: uvloop refuses such a write
    with RuntimeError, asyncio would drop it silently."""
    if writer.transport.is_closing():
        raise PeerConnectionClosedError("connection closed during the handshake")
    try:
        writer.write(encode_frame(obj, max_frame_bytes=HANDSHAKE_FRAME_BYTES_MAX))
    except RuntimeError as exc:
        raise PeerConnectionClosedError(
            f"connection closed during the handshake ({_why(exc)})"
        ) from exc


def _expect(obj: object, kind: str, count: int) -> list[object]:
    if type(obj) is list and len(obj) == 2 and obj[0] == REFUSED:
        raise PeerRefusedError(f"{obj[1]!s:.{_REFUSED_REASON_CHARS_MAX}}")
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
    """Raise TransportConfigError unless every (peer id, (host, port)) is usable (the rule a
    membership entry's address book is held to when it is decoded: `raft.wire`)."""
    for peer_id, address in peers.items():
        if type(peer_id) is not int or not 0 < peer_id < _U64_END:
            raise TransportConfigError(
                f"peer id must be a positive integer, got {show_value(peer_id)}"
            )
        problem = address_problem(address) if isinstance(address, tuple) else "not a tuple"
        if problem is not None:
            raise TransportConfigError(f"address of peer {peer_id}: {problem}")


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
        snapshot_chunk_bytes: int | None = None,
        snapshot_transfer_bytes_max: int = SNAPSHOT_TRANSFER_BYTES_MAX,
        snapshot_ack_interval_bytes: int = SNAPSHOT_ACK_INTERVAL_BYTES,
        snapshot_transfer_idle_ms: int = SNAPSHOT_TRANSFER_IDLE_MS,
        tls: TlsFiles | None = None,
        revoked: Callable[[str], bool] | None = None,
        snapshot_spool_dir: Path | None = None,
        peer_tcp_user_timeout_ms: int = PEER_TCP_USER_TIMEOUT_MS,
        protocol_version: int = PROTOCOL_VERSION,
    ) -> None:
        """`snapshot_chunk_bytes` defaults to SNAPSHOT_CHUNK_BYTES, or half of a smaller
        `max_frame_bytes` (a chunk frame must fit a frame with room to spare).
        `snapshot_spool_dir`: where incoming snapshot transfers are spooled (created if missing;
        leftovers of an earlier process are deleted); None keeps them in memory. `tls`: mutual
        TLS on every link (TlsConfigError here if a file cannot be used). `revoked`: with TLS,
        whether a certificate fingerprint (SHA-256 of the DER, lowercase hex) is revoked.
        `protocol_version`: the newest peer protocol version this node speaks (tests set an
        older one to act as a node of an earlier release)."""
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
        chunk_bytes_max = max_frame_bytes - _CHUNK_FRAME_OVERHEAD_BYTES
        if snapshot_chunk_bytes is None:
            snapshot_chunk_bytes = min(SNAPSHOT_CHUNK_BYTES, max_frame_bytes // 2)
        _check_limit("snapshot_chunk_bytes", snapshot_chunk_bytes, 1, chunk_bytes_max)
        _check_limit(
            "snapshot_transfer_bytes_max", snapshot_transfer_bytes_max, 1, FRAME_LENGTH_CAPACITY
        )
        _check_limit("snapshot_ack_interval_bytes", snapshot_ack_interval_bytes, 1, 2**62)
        _check_limit("snapshot_transfer_idle_ms", snapshot_transfer_idle_ms, 1, 10**9)
        _check_limit("peer_tcp_user_timeout_ms", peer_tcp_user_timeout_ms, 1, 2**31 - 1)
        _check_limit("protocol_version", protocol_version, PROTOCOL_VERSION_MIN, PROTOCOL_VERSION)
        check_peers(peers)
        # Built now, so a bad file stops the node before it listens, not at its first link.
        self._tls_server: ssl.SSLContext | None = None
        self._tls_client: ssl.SSLContext | None = None
        if tls is not None:
            self._tls_server = peer_server_context(tls)
            self._tls_client = peer_client_context(tls)

        self._node_id = node_id
        self._listen_host = listen_host
        self._listen_port = listen_port
        self._secret = secret
        self._on_message = on_message
        self._cluster_id = cluster_id
        self._max_frame_bytes = max_frame_bytes
        self._log = logger if logger is not None else logging.getLogger("raft.transport")
        # Warnings about refused handshakes, all sources together (see _warn_stranger).
        self._stranger_warnings = LogBudget(burst=PEER_WARNINGS_BURST, per_s=PEER_WARNINGS_PER_S)
        self._send_queue_max = send_queue_max
        self._send_queue_bytes_max = send_queue_bytes_max
        self._handshake_timeout_s = handshake_timeout_ms / 1000
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._backoff_ms_min = reconnect_backoff_ms_min
        self._backoff_ms_max = reconnect_backoff_ms_max
        self._rng = random.Random()  # jitter only; nothing secret depends on it
        self._snapshot_chunk_bytes = snapshot_chunk_bytes
        self._snapshot_transfer_bytes_max = snapshot_transfer_bytes_max
        self._snapshot_ack_interval_bytes = snapshot_ack_interval_bytes
        self._snapshot_transfer_idle_s = snapshot_transfer_idle_ms / 1000
        self._snapshot_spool_dir = snapshot_spool_dir
        self._tcp_user_timeout_ms = peer_tcp_user_timeout_ms
        self._protocol_version = protocol_version
        if snapshot_spool_dir is not None:
            _remove_spool_leftovers(snapshot_spool_dir, self._log)

        self._links: dict[NodeId, _Link] = {
            pid: _Link(pid, addr, protocol_version) for pid, addr in peers.items() if pid != node_id
        }
        # Used as an ordered set (oldest first) so eviction can pick the oldest.
        self._inbound: dict[_Inbound, None] = {}
        self._retiring: set[asyncio.Task[None]] = set()  # link tasks of removed peers
        self._server: asyncio.Server | TlsListener | None = None
        self._bound_port = 0
        self._started = False
        self._stopped = False
        self._dial = True  # whether links connect out (see set_peers)
        # Links with frames queued while their writer task was idle: `flush` writes them.
        self._dirty: list[_Link] = []
        self._flush_scheduled = False

        self._auth_failures_unknown_peer = 0
        self._handshake_failures = 0
        self._inbound_refused_over_limit = 0
        self._inbound_refused_per_host = 0
        self._dropped_no_route = 0
        self._tls_refused = 0
        self._revoked = revoked
        self._tls_revoked_refused = 0
        self._tls_revoked_closed = 0
        # Every open, certificate-checked connection (either direction) -> its peer's fingerprint.
        self._fingerprints: dict[asyncio.StreamWriter, tuple[NodeId, str]] = {}
        # Fingerprints each peer id presented here, oldest first (see PEER_CERTS_SEEN_MAX).
        self._seen_certs: dict[NodeId, dict[str, None]] = {}

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
        if self._tls_server is not None:
            listener = TlsListener(
                self._handle_inbound,
                self._tls_server,
                handshake_timeout_s=self._handshake_timeout_s,
                on_refused=self._on_tls_refused,
                read_limit_bytes=PEER_READ_CHUNK_BYTES,
                logger=self._log,
            )
            await listener.start(self._listen_host, self._listen_port)
            self._server = listener
        else:
            self._server = await asyncio.start_server(
                self._handle_inbound,
                self._listen_host,
                self._listen_port,
                limit=PEER_READ_CHUNK_BYTES,
            )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else 0
        if self._dial:
            for link in self._links.values():
                self._start_link(link)
        self._log.info(
            "peer transport of node %d listening on %s:%d%s",
            self._node_id,
            self._listen_host,
            self._bound_port,
            " (mutual TLS)" if self._tls_server is not None else "",
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
            self._discard_incoming(link)

    # ---- sending ----------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """Queue `msg` for `msg.dst`. Never blocks; drops (and counts) rather than fail.

        An InstallSnapshot larger than the chunk size becomes the link's snapshot transfer
        instead (see the module docstring). Raises FrameEncodeError only for a message whose
        fields msgpack cannot represent, which is a bug in the caller, not network trouble.
        """
        link = self._links.get(msg.dst)
        if link is None or self._stopped:
            self._dropped_no_route += 1
            return
        if isinstance(msg, InstallSnapshot):
            head = encode_install_snapshot_head(msg)
            if len(head) + len(msg.snapshot.data) > self._snapshot_chunk_bytes:
                self._send_snapshot(link, msg, head)
                return
        try:
            obj = encode_message(msg, with_incarnations=link.version >= INCARNATIONS_VERSION)
            frame = encode_frame(obj, max_frame_bytes=self._max_frame_bytes)
        except FrameTooLargeError as exc:
            link.dropped += 1
            self._log.error("dropping %s to peer %d: %s", type(msg).__name__, msg.dst, exc)
            return
        self._enqueue(link, frame)

    def _enqueue(self, link: _Link, frame: bytes) -> None:
        queue = link.queue
        queue.append(frame)
        link.queued_bytes += len(frame)
        # Drop oldest first: newer Raft messages supersede older ones to the same peer.
        while len(queue) > self._send_queue_max or (
            link.queued_bytes > self._send_queue_bytes_max and len(queue) > 1
        ):
            link.queued_bytes -= len(queue.popleft())
            link.dropped += 1
        if link.idle_writer is None:
            link.wakeup.set()  # the writer task is busy (or reconnecting): it takes the queue
            return
        if not link.dirty:
            link.dirty = True
            self._dirty.append(link)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand the frames queued since the last flush to their sockets now.

        A link whose writer task is parked, with nothing in flight (its socket buffer empty,
        no snapshot chunks pending), is written here directly, in one `writelines` per link:
        no wake-up of the writer task, no extra loop iteration, and the bytes leave before the
        caller goes on (uvloop sends at once when its buffer is empty). Other links are left to
        their writer task, which keeps back-pressure (drain) and reconnects. Frames sent
        without a flush are flushed by a callback scheduled at the first of them, so `flush`
        is an optimisation for callers about to block (the node before an inline fsync), never
        needed for delivery."""
        dirty, self._dirty = self._dirty, []
        for link in dirty:
            link.dirty = False
            writer = link.idle_writer
            if not link.queue:
                continue
            if (
                writer is None
                or link.has_chunks()
                or writer.transport.is_closing()
                or writer.transport.get_write_buffer_size()
            ):
                link.wakeup.set()
                continue
            frames = list(link.queue)
            batch_bytes = link.queued_bytes
            link.queue.clear()
            link.queued_bytes = 0
            try:
                writer.writelines(frames)
            except (OSError, RuntimeError):
                # The connection broke under us (as in the writer task, the frames are lost;
                # Raft retries). The writer task finds out and reconnects.
                link.wakeup.set()
                continue
            link.sent += len(frames)
            link.bytes_sent += batch_bytes

    def _send_snapshot(self, link: _Link, msg: InstallSnapshot, head: bytes) -> None:
        size = len(head) + len(msg.snapshot.data)
        meta = msg.snapshot.meta
        if size > self._snapshot_transfer_bytes_max:
            link.dropped += 1
            self._log.error(
                "dropping InstallSnapshot (index %d) to peer %d: %d bytes exceed the snapshot "
                "transfer limit of %d bytes",
                meta.index,
                link.peer_id,
                size,
                self._snapshot_transfer_bytes_max,
            )
            return
        key = (msg.term, meta.index, meta.term)
        if key == link.unreadable_key and time.monotonic() < link.unreadable_until:
            return  # found unreadable moments ago (said then): the core's retry is dropped
        out = link.outgoing
        if out is not None and out.key == key:
            # The core's retry of the snapshot being transferred: not a reason to start over.
            # But if every byte was written and no acknowledgement came since its last retry,
            # the acks may have been lost: go back to the acknowledged offset (a nudge).
            if out.next_offset >= out.size and out.acked == out.acked_at_retry:
                self._log.info(
                    "snapshot transfer %016x to peer %d: no acknowledgement since the last "
                    "retry; resending from offset %d",
                    out.transfer_id,
                    link.peer_id,
                    out.acked,
                )
                out.next_offset = out.acked
                out.epoch += 1
                link.wakeup.set()
            out.acked_at_retry = out.acked
            return
        if out is not None:
            link.snapshot_transfers_replaced += 1
            self._log.info(
                "snapshot transfer %016x to peer %d (%d of %d bytes acknowledged) replaced by "
                "a newer snapshot",
                out.transfer_id,
                link.peer_id,
                out.acked,
                out.size,
            )
        out = _Outgoing(secrets.randbits(64), key, head, msg.snapshot.data)
        link.outgoing = out
        link.snapshot_transfers_started += 1
        self._log.info(
            "snapshot transfer %016x to peer %d started: snapshot index %d term %d, %d bytes",
            out.transfer_id,
            link.peer_id,
            meta.index,
            meta.term,
            out.size,
        )
        link.wakeup.set()

    def _give_up_unreadable(self, link: _Link, out: _Outgoing, exc: FileReadError) -> None:
        """The snapshot being sent cannot be read (EIO, or its file was truncated): the
        transfer is dropped (the receiver drops its part once idle) and said, not retried
        here; the core's next retry starts a new transfer, which fails the same way until the
        file is readable or a newer snapshot replaces it."""
        if link.outgoing is out:
            link.outgoing = None
        link.snapshot_transfers_unreadable += 1
        link.unreadable_key = out.key
        link.unreadable_until = time.monotonic() + SNAPSHOT_UNREADABLE_RETRY_MS / 1000
        self._log.error(
            "snapshot transfer %016x to peer %d given up: the snapshot cannot be read (%s); "
            "check the device (the kernel log); tried again in %d s, and a newer snapshot or "
            "a restart of this node ends it",
            out.transfer_id,
            link.peer_id,
            exc,
            SNAPSHOT_UNREADABLE_RETRY_MS // 1000,
        )

    def drop_snapshot_transfers(self) -> int:
        """Give up every snapshot transfer to a peer (how many there were). The node calls
        it when it stops leading: only a leader sends snapshots, so one under way is stale.
        Its receiver drops the part it holds once no chunk came for SNAPSHOT_TRANSFER_IDLE_MS
        (the protocol has no cancel frame)."""
        dropped = 0
        for link in self._links.values():
            out = link.outgoing
            if out is None:
                continue
            link.outgoing = None
            dropped += 1
            self._log.info(
                "snapshot transfer %016x to peer %d (%d of %d bytes acknowledged) given up: "
                "this node no longer leads",
                out.transfer_id,
                link.peer_id,
                out.acked,
                out.size,
            )
        return dropped

    # ---- membership -------------------------------------------------------------------------

    def set_peers(self, peers: Mapping[int, tuple[str, int]], *, dial: bool = True) -> None:
        """Make the set of peers exactly `peers` (our own id, if present, is ignored).

        New peers get a link; removed peers lose their link, queue and counters, and their
        inbound connections are closed; a peer whose address changed reconnects to the new one.
        `dial=False`: no link connects out (writer tasks end; frames sent meanwhile queue, as
        before `start`, within the queue bounds), but the peers stay peers: their inbound
        connections are still accepted (same handshake) and their messages delivered. Until
        the next `set_peers(..., dial=True)`.
        """
        check_peers(peers)
        wanted = {pid: addr for pid, addr in peers.items() if pid != self._node_id}
        self._dial = dial
        for pid in [pid for pid in self._links if pid not in wanted]:
            self._discard_incoming(self._links[pid])
            self._retire(self._links.pop(pid))
            for conn in self._inbound:
                if conn.peer_id == pid:
                    conn.writer.transport.abort()
        running = self._started and not self._stopped
        for pid, addr in wanted.items():
            link = self._links.get(pid)
            if link is None:
                link = _Link(pid, addr, self._protocol_version)
                self._links[pid] = link
            elif link.address != addr:
                link.address = addr
                self._retire(link)
            if not dial:
                self._retire(link)
            elif running and link.task is None:
                self._start_link(link)

    def _retire(self, link: _Link) -> None:
        task, link.task = link.task, None
        link.connected = False
        # The task winds down at its next await; until then `flush` must not write to its
        # connection (an address that is no longer the peer's): frames wait for the next one.
        link.idle_writer = None
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
            dialling=self._dial,
            inbound_connections=len(self._inbound),
            auth_failures_unknown_peer=self._auth_failures_unknown_peer,
            handshake_failures=self._handshake_failures,
            inbound_refused_over_limit=self._inbound_refused_over_limit,
            inbound_refused_per_host=self._inbound_refused_per_host,
            dropped_no_route=self._dropped_no_route,
            tls_refused=self._tls_refused,
            tls_revoked_refused=self._tls_revoked_refused,
            tls_revoked_closed=self._tls_revoked_closed,
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
        loop = asyncio.get_running_loop()
        attempt = 0
        ever_connected = False
        while True:
            host, port = link.address
            writer: asyncio.StreamWriter | None = None
            hellos_before = link.hellos_heard
            version, probe = PROTOCOL_VERSION, False
            learnt = False  # the dial's result told the link something about versions
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    # With TLS the timeout covers the TLS handshake too; the peer's
                    # certificate must chain to the CA and name the address dialled.
                    reader, writer = await asyncio.open_connection(
                        host,
                        port,
                        limit=PEER_READ_CHUNK_BYTES,
                        ssl=self._tls_client,
                        server_hostname=host if self._tls_client is not None else None,
                    )
                self._watch_liveness(writer)
                self._check_peer_certificate(link.peer_id, writer)
                version, probe = self._dial_plan(link)
                async with asyncio.timeout(self._handshake_timeout_s):
                    await self._client_handshake(
                        link.peer_id, reader, writer, version, challenge_only=probe
                    )
            except ssl.SSLCertVerificationError as exc:
                link.auth_failures += 1
                link.connect_failures += 1
                self._log.warning(
                    "refusing peer %d at %s:%d: its TLS certificate is not trusted: %s",
                    link.peer_id,
                    host,
                    port,
                    exc.verify_message or exc.reason,
                )
            except PeerRefusedError as exc:
                link.connect_failures += 1
                self._log.error(
                    "peer %d at %s:%d refused this node: %s", link.peer_id, host, port, exc
                )
            except PeerAuthError as exc:
                link.auth_failures += 1
                link.connect_failures += 1
                self._log.warning("refusing peer %d at %s:%d: %s", link.peer_id, host, port, exc)
            except PeerHelloRefusedError as exc:
                link.connect_failures += 1
                self._log.log(
                    logging.INFO if attempt == 0 else logging.DEBUG,
                    "cannot reach peer %d at %s:%d: %s",
                    link.peer_id,
                    host,
                    port,
                    exc,
                )
                learnt = True
                if link.hellos_heard == hellos_before:
                    self._note_hello_refused(link, version)
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
                learnt = True
                if probe:
                    # The peer accepts the older version: whether it refuses the newer one
                    # for good (an older release) or was down (a proxy closed our hello), the
                    # next dial offers the newer one once more to tell.
                    if link.hellos_heard == hellos_before:
                        link.refused_version = 0
                        link.checking_version = version + 1
                    self._log.info(
                        "peer %d at %s:%d accepts peer protocol version %d: offering %d again "
                        "to learn whether it refuses that for good",
                        link.peer_id,
                        host,
                        port,
                        version,
                        version + 1,
                    )
                    # (`finally` closes the probe's connection; it resets no backoff)
                else:
                    link.refused_version = link.checking_version = 0
                    if ever_connected:
                        link.reconnects += 1
                    ever_connected = True
                    connected_at = loop.time()
                    self._use_version(link, version)
                    self._log.info(
                        "connected to peer %d at %s:%d (peer protocol version %d)",
                        link.peer_id,
                        host,
                        port,
                        version,
                    )
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
                    # Only a link that stayed up resets the backoff. One the peer ends right after
                    # the handshake (two nodes with one id, a peer closing on our frames) counts
                    # as a failed attempt, or it would be redialled at the minimum delay for ever.
                    if loop.time() - connected_at >= self._backoff_ms_max / 1000:
                        attempt = 0
            finally:
                if writer is not None:
                    self._fingerprints.pop(writer, None)
                    writer.transport.abort()
                if not learnt and link.hellos_heard == hellos_before:
                    # Not a refusal of our hello (the peer is down, slow, or refused us for
                    # another reason): start over from the version the rules offer.
                    link.refused_version = link.checking_version = 0
            await asyncio.sleep(self._backoff_ms(attempt) / 1000)
            attempt += 1

    def _watch_liveness(self, writer: asyncio.StreamWriter) -> None:
        """Let the kernel find a dead peer: keepalive probes on an idle link, and a link whose
        data stays unacknowledged for the user timeout is reset (see PEER_TCP_USER_TIMEOUT_MS;
        our writer or watcher then sees the error and the link redials). Best effort: where an
        option does not exist (not Linux) the link works as before."""
        sock = writer.get_extra_info("socket")
        if sock is None:
            return
        options = [
            (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
            (socket.IPPROTO_TCP, "TCP_KEEPIDLE", max(1, PEER_KEEPALIVE_IDLE_MS // 1000)),
            (socket.IPPROTO_TCP, "TCP_KEEPINTVL", max(1, PEER_KEEPALIVE_INTERVAL_MS // 1000)),
            (socket.IPPROTO_TCP, "TCP_KEEPCNT", PEER_KEEPALIVE_PROBES),
            (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", self._tcp_user_timeout_ms),
        ]
        for level, name, value in options:
            option = getattr(socket, name, None)
            if option is None:
                continue
            try:
                sock.setsockopt(level, option, value)
            except OSError as exc:  # e.g. the connection is already gone
                self._log.debug("cannot set %s on a peer connection: %s", name, exc)
                return

    def _check_peer_certificate(self, peer_id: NodeId, writer: asyncio.StreamWriter) -> None:
        """With TLS: the verified certificate must name `peer_id` (per-node identity)."""
        if self._tls_server is None:
            return
        name = peer_common_name(writer.get_extra_info("peercert"))
        if name != node_common_name(peer_id):
            raise PeerAuthError(
                f"TLS certificate names {name!r}, not {node_common_name(peer_id)!r}: a "
                f"certificate speaks for its own node only"
            )
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            raise PeerAuthError("no TLS certificate to check")
        fingerprint = hashlib.sha256(der).hexdigest()
        seen = self._seen_certs.setdefault(peer_id, {})
        seen.pop(fingerprint, None)
        seen[fingerprint] = None
        while len(seen) > PEER_CERTS_SEEN_MAX:
            del seen[next(iter(seen))]
        if self._revoked is not None and self._revoked(fingerprint):
            self._tls_revoked_refused += 1
            raise CertificateRevokedError(
                f"the TLS certificate of node {peer_id} (sha256 {fingerprint}) is revoked: "
                "it was removed from the cluster or its certificate was revoked; issue it a new "
                "certificate (metastore cluster certs)"
            )
        self._fingerprints[writer] = (peer_id, fingerprint)

    def peer_certificates(self, peer_id: NodeId) -> tuple[str, ...]:
        """The fingerprints (oldest first) of the certificates `peer_id` presented on links
        with this node since it started, at most PEER_CERTS_SEEN_MAX."""
        return tuple(self._seen_certs.get(peer_id, ()))

    def live_certificates(self) -> tuple[tuple[NodeId, str], ...]:
        """(peer id, fingerprint) of every open, certificate-checked link, either direction."""
        return tuple(sorted(set(self._fingerprints.values())))

    def close_revoked(self) -> int:
        """Close every open link whose peer authenticated with a certificate that `revoked`
        now refuses (its reconnect is refused at the handshake). Returns how many."""
        if self._revoked is None:
            return 0
        closed = 0
        for writer, (peer_id, fingerprint) in list(self._fingerprints.items()):
            if self._revoked(fingerprint):
                del self._fingerprints[writer]
                writer.transport.abort()
                closed += 1
                self._log.warning(
                    "closed a link with peer %d: its TLS certificate (sha256 %s) is revoked",
                    peer_id,
                    fingerprint,
                )
        self._tls_revoked_closed += closed
        return closed

    async def _tell_refused(self, writer: asyncio.StreamWriter, reason: str) -> None:
        """Send the refused peer the reason, then close (bounded: a refusal must not wait)."""
        frame = [REFUSED, reason[:_REFUSED_REASON_CHARS_MAX]]
        with contextlib.suppress(Exception):
            writer.write(encode_frame(frame, max_frame_bytes=HANDSHAKE_FRAME_BYTES_MAX))
            writer.close()
            async with asyncio.timeout(_REFUSED_FLUSH_S):
                await writer.wait_closed()

    def _on_tls_refused(self, peer: str, reason: str) -> None:
        self._tls_refused += 1
        self._log.warning("refused peer connection from %s: %s", peer, reason)

    def _version_to_offer(self, link: _Link) -> int:
        """The newest version this node and the peer both speak, as far as we know: ours, or
        the older of ours and the version of the peer's last hello; at most the version the
        peer fell back to (it refused a newer one)."""
        heard = link.peer_hello_version
        offer = min(heard, self._protocol_version) if heard else self._protocol_version
        return min(offer, link.fallback_version) if link.fallback_version else offer

    def _dial_plan(self, link: _Link) -> tuple[int, bool]:
        """The version the next dial offers, and whether that dial is a probe (it only learns
        whether the peer challenges that version, then closes). After a dial whose hello was
        closed without a word: the next older version we speak, as a probe; after the oldest,
        our newest. After a probe the peer challenged: the refused version once more."""
        if link.checking_version:
            return link.checking_version, False
        refused = link.refused_version
        if refused > PROTOCOL_VERSION_MIN:
            return refused - 1, True
        if refused:
            return self._protocol_version, False
        return self._version_to_offer(link), False

    def _note_hello_refused(self, link: _Link, version: int) -> None:
        """The peer closed our dial's hello of `version` without a word."""
        if link.checking_version == version:
            # It accepted the older version a dial ago and refuses this one again: a node of an
            # older release (a proxy in front of a node that is down refuses every version).
            link.checking_version = link.refused_version = 0
            link.fallback_version = version - 1
            self._log.info(
                "peer %d does not speak peer protocol version %d: offering %d until its own "
                "hello says otherwise",
                link.peer_id,
                version,
                version - 1,
            )
            return
        link.checking_version = 0
        if link.fallback_version == version:
            link.fallback_version = 0  # the peer no longer speaks it (upgraded since)
        link.refused_version = version

    def _note_peer_hello(self, link: _Link, version: int) -> None:
        """The peer dialled us (authenticated) offering `version`: our outbound link to it
        that speaks another version than we would offer now (the peer restarted upgraded, or
        downgraded) ends, and its next dial offers that. The hello is fresher evidence than
        any refused dial: what those taught the link is forgotten, except a fallback to a
        version at least as new as the hello's."""
        link.peer_hello_version = version
        link.hellos_heard += 1
        link.refused_version = link.checking_version = 0
        if link.fallback_version < version:
            link.fallback_version = 0
        if link.connected and link.version != self._version_to_offer(link):
            self._log.info(
                "peer %d now speaks protocol version %d: reconnecting our link to it (version %d)",
                link.peer_id,
                version,
                link.version,
            )
            link.redial = True  # the writer task ends the connection and dials again
            link.wakeup.set()

    def _use_version(self, link: _Link, version: int) -> None:
        """The link's new connection speaks `version`: frames queued for another one are
        dropped (counted) rather than sent in a form the peer may not decode; Raft resends
        what it needs, as after any reconnect."""
        if version == link.version:
            return
        link.dropped += len(link.queue)
        link.queue.clear()
        link.queued_bytes = 0
        link.version = version

    async def _client_handshake(
        self,
        peer_id: NodeId,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        version: int = PROTOCOL_VERSION,
        *,
        challenge_only: bool = False,
    ) -> None:
        """Authenticate our dial to `peer_id` speaking `version`. `challenge_only`: return
        once the peer has challenged the hello (it speaks the version), proving nothing."""
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        hello = [HELLO, version, self._cluster_id, self._node_id, peer_id, client_nonce]
        _write_handshake_frame(writer, hello)
        try:
            first = await _read_handshake_frame(reader, decoder)
        except PeerConnectionClosedError as exc:
            # EOF or a reset before any answer: how a release that does not speak `version`
            # refuses it (and how a proxy in front of a node that is down answers any hello).
            raise PeerHelloRefusedError(
                f"it closed the connection after our hello of peer protocol version {version}"
                f" ({_why(exc)})"
            ) from exc
        challenge = _expect(first, CHALLENGE, 2)
        server_nonce = _exact_bytes(challenge[1], NONCE_BYTES, "the server nonce")
        if challenge_only:
            return

        def mac_of(role: str) -> bytes:
            return mac(
                self._secret,
                role,
                cluster_id=self._cluster_id,
                client_id=self._node_id,
                server_id=peer_id,
                client_nonce=client_nonce,
                server_nonce=server_nonce,
                version=version,
            )

        _write_handshake_frame(writer, [PROOF, mac_of("client")])
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
        link.redial = False
        link.connected = True
        out = link.outgoing
        if out is not None:
            # What was written on the last connection beyond the acknowledged offset may be
            # lost; the peer ignores what it already holds.
            if out.acked > 0:
                link.snapshot_transfers_resumed += 1
                self._log.info(
                    "snapshot transfer %016x to peer %d resumes at offset %d of %d",
                    out.transfer_id,
                    link.peer_id,
                    out.acked,
                    out.size,
                )
            out.next_offset = out.acked
            out.epoch += 1
        if link.queue or link.has_chunks():
            link.wakeup.set()  # frames queued while we were disconnected
        watcher = asyncio.get_running_loop().create_task(self._watch(link, reader, writer))
        try:
            while True:
                # Parked: `flush` may write to the connection directly meanwhile.
                link.idle_writer = writer
                await link.wakeup.wait()
                link.idle_writer = None
                link.wakeup.clear()
                if link.peer_closed:
                    raise ConnectionResetError("peer closed the connection")
                if link.redial:
                    raise ConnectionResetError("the peer speaks another protocol version now")
                while link.queue or link.has_chunks():
                    if writer.transport.is_closing():
                        # Aborted by the watcher (peer gone): keep the frames for the next
                        # connection instead of handing them to a dead transport.
                        raise ConnectionResetError("the connection to the peer is closed")
                    if link.queue:
                        frames = list(link.queue)
                        batch_bytes = link.queued_bytes
                        link.queue.clear()
                        link.queued_bytes = 0
                        # One call for the whole batch: the transport sends it with one syscall.
                        writer.writelines(frames)
                        link.sent += len(frames)
                        link.bytes_sent += batch_bytes
                    # Then a few chunks of the snapshot transfer, if any: queued messages wait
                    # for at most that much, and the transfer always moves on.
                    for _ in range(SNAPSHOT_CHUNKS_PER_ROUND):
                        out = link.outgoing
                        if out is None or out.next_offset >= out.size:
                            break
                        try:
                            buffers, data_bytes = out.next_chunk(self._snapshot_chunk_bytes)
                        except FileReadError as exc:
                            self._give_up_unreadable(link, out, exc)
                            break
                        writer.writelines(buffers)
                        link.snapshot_chunk_bytes_sent += data_bytes
                        link.bytes_sent += sum(map(len, buffers))
                    # Back-pressure: wait while the socket buffer is above its high-water mark.
                    await writer.drain()
        finally:
            if link.idle_writer is writer:  # not a newer task's connection (see _retire)
                link.idle_writer = None
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
        host = source_host(peername)
        strangers_here = sum(1 for c in self._inbound if c.peer_id == NONE and c.host == host)
        if strangers_here >= STRANGERS_PER_HOST_MAX:
            # One host may not hold more than its share of handshakes: the rest of the slots
            # stay for peers elsewhere, whatever this one sends.
            self._inbound_refused_per_host += 1
            writer.transport.abort()
            return
        if len(self._inbound) >= PEER_INBOUND_CONNECTIONS_MAX and not self._make_room(peername):
            writer.transport.abort()
            return
        conn = _Inbound(writer, asyncio.current_task(), host)
        self._inbound[conn] = None
        self._watch_liveness(writer)
        try:
            try:
                async with asyncio.timeout(self._handshake_timeout_s):
                    peer_id, version = await self._server_handshake(conn, reader, writer)
            except PeerAuthError as exc:
                self._count_auth_failure(conn.claimed_id)
                self._warn_stranger("refused peer connection from %s: %s", peername, exc)
                return
            except PeerConnectionClosedError as exc:
                # The connection ended (the dialler gave up, died, or checked which version we
                # speak): counted, and not worth a warning.
                if not self._stopped and not conn.evicted:
                    self._handshake_failures += 1
                    self._warn_stranger(
                        "peer handshake from %s ended: %s", peername, exc, level=logging.INFO
                    )
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
                    self._warn_stranger("peer handshake from %s failed: %s", peername, _why(exc))
                return
            conn.peer_id = peer_id
            # A peer has one outbound link to us; an older inbound connection from it is a
            # leftover of a link it has already given up on.
            for other in self._inbound:
                if other is not conn and other.peer_id == peer_id:
                    other.writer.transport.abort()
            self._log.info(
                "peer %d connected from %s (peer protocol version %d)", peer_id, peername, version
            )
            link = self._links.get(peer_id)
            if link is not None:
                self._note_peer_hello(link, version)
            await self._receive(peer_id, reader, writer)
        finally:
            self._inbound.pop(conn, None)
            self._fingerprints.pop(writer, None)
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
    ) -> tuple[NodeId, int]:
        """Authenticate a peer's inbound connection: its node id and the version it speaks."""
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
        hello = _expect(await _read_handshake_frame(reader, decoder), HELLO, 6)
        _, version, cluster_id, client_id, server_id, client_nonce = hello
        if type(client_id) is int:
            conn.claimed_id = client_id
        spoken = range(PROTOCOL_VERSION_MIN, self._protocol_version + 1)
        if type(version) is not int or version not in spoken:
            raise PeerHandshakeError(
                f"unsupported peer protocol version "
                f"{version if type(version) is int else show_value(version)} (this node speaks "
                f"{PROTOCOL_VERSION_MIN} to {self._protocol_version})"
            )
        if cluster_id != self._cluster_id:
            raise PeerAuthError(
                f"node {client_id!r} belongs to cluster {cluster_id!r}, not {self._cluster_id!r}"
            )
        if type(server_id) is not int or server_id != self._node_id:
            raise PeerAuthError(f"hello addressed to node {server_id!r}, we are {self._node_id}")
        if type(client_id) is not int or client_id == self._node_id or client_id not in self._links:
            raise PeerAuthError(f"node id {client_id!r} is not one of our peers")
        try:
            self._check_peer_certificate(client_id, writer)
        except CertificateRevokedError as exc:
            await self._tell_refused(writer, str(exc))
            raise
        client_nonce = _exact_bytes(client_nonce, NONCE_BYTES, "the client nonce")
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        _write_handshake_frame(writer, [CHALLENGE, server_nonce])

        def mac_of(role: str) -> bytes:
            return mac(
                self._secret,
                role,
                cluster_id=self._cluster_id,
                client_id=client_id,
                server_id=self._node_id,
                client_nonce=client_nonce,
                server_nonce=server_nonce,
                version=version,
            )

        proof = _expect(await _read_handshake_frame(reader, decoder), PROOF, 2)
        client_mac = _exact_bytes(proof[1], MAC_BYTES, "the client MAC")
        if not hmac.compare_digest(client_mac, mac_of("client")):
            raise PeerAuthError(
                f"node {client_id} did not prove knowledge of the cluster secret (wrong secret?)"
            )
        if decoder.buffered_bytes:
            raise PeerHandshakeError(f"node {client_id} sent data before our welcome")
        _write_handshake_frame(writer, [WELCOME, mac_of("server")])
        return client_id, version

    async def _receive(
        self, peer_id: NodeId, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Deliver the authenticated peer's messages until its connection ends.

        The connection's protocol is swapped for a `_Receiver`, which decodes and delivers in
        its `data_received` callback: a message reaches the node in the loop iteration its
        bytes arrive in, without a StreamReader buffer and a task wake-up per read."""
        receiver = _Receiver(self, peer_id, writer.transport)
        # The peer speaks only after our welcome, which went out in this same loop iteration,
        # so the StreamReader should hold nothing; whatever it holds is delivered first anyway.
        # (asyncio has no public way to take the bytes a StreamReader holds without awaiting.)
        held: bytearray = reader._buffer  # type: ignore[attr-defined]
        buffered = bytes(held)
        held.clear()
        ended = reader.at_eof() or reader.exception() is not None or writer.transport.is_closing()
        if not ended:
            writer.transport.set_protocol(receiver)
        if buffered:
            receiver.data_received(buffered)
        if ended:
            self._log.info("peer %d closed its connection", peer_id)
            return
        await receiver.done

    def _receive_data(self, peer_id: NodeId, decoder: FrameDecoder, data: bytes) -> bool:
        """Decode and deliver `data` from the peer; False: the connection must close."""
        if self._stopped:
            return False  # a connection stop() has not closed yet: deliver (and spool) nothing
        link = self._links.get(peer_id)
        if link is None:
            return False  # removed by set_peers
        link.bytes_received += len(data)
        try:
            decoder.feed(data)
            while (obj := decoder.next_frame()) is not NEED_DATA:
                self._deliver(link, obj)
        except (FrameTooLargeError, MalformedFrameError) as exc:
            # The stream is out of sync: nothing after this point can be trusted.
            link.malformed += 1
            self._warn_peer(link, "closing connection from peer %d: %s", peer_id, exc)
            return False
        return True

    def _deliver(self, link: _Link, obj: object) -> None:
        if (
            type(obj) is list
            and obj
            and type(obj[0]) is int
            and obj[0] in (TAG_SNAPSHOT_CHUNK, TAG_SNAPSHOT_ACK)
        ):
            try:
                if obj[0] == TAG_SNAPSHOT_CHUNK:
                    self._on_chunk(link, obj)
                else:
                    self._on_ack(link, obj)
            except MalformedMessageError as exc:
                link.malformed += 1
                self._warn_peer(
                    link, "dropping malformed transport frame from peer %d: %s", link.peer_id, exc
                )
            return
        try:
            msg = decode_message(obj)
        except MalformedMessageError as exc:
            # The frame boundary was fine, so the stream is still in sync: drop just this one.
            link.malformed += 1
            self._warn_peer(link, "dropping malformed message from peer %d: %s", link.peer_id, exc)
            return
        self._deliver_message(link, msg)

    def _warn_stranger(self, fmt: str, *args: object, level: int = logging.WARNING) -> None:
        """A warning (or a line of `level`) about a connection refused or ended before it
        authenticated, within one budget for all of them (as `_warn_peer`'s per peer):
        strangers need no secret to be refused."""
        left_out = self._stranger_warnings.take()
        if left_out is None:
            return
        if left_out:
            fmt += " (%d more refusals before it not logged)"
            args = (*args, left_out)
        self._log.log(level, fmt, *args)

    def _warn_peer(self, link: _Link, fmt: str, *args: object) -> None:
        """A warning about what the peer sent, within the peer's log budget (see
        PEER_WARNINGS_BURST): a peer sending bad frames in a loop costs a few lines a second,
        and the next line logged says how many were left out. Counters count every event."""
        left_out = link.warnings.take()
        if left_out is None:
            return
        if left_out:
            fmt += " (%d more warnings about this peer not logged)"
            args = (*args, left_out)
        self._log.warning(fmt, *args)

    def _deliver_message(self, link: _Link, msg: Message) -> None:
        if msg.dst != self._node_id or msg.src != link.peer_id:
            link.rejected += 1
            self._warn_peer(
                link,
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

    # ---- snapshot transfers -----------------------------------------------------------------

    def _send_ack(
        self, link: _Link, transfer_id: int, offset: int, status: int, epoch: int
    ) -> None:
        """Queue an acknowledgement on our own outbound link to the transfer's sender."""
        ack = [TAG_SNAPSHOT_ACK, transfer_id, offset, status, epoch]
        self._enqueue(link, encode_frame(ack, max_frame_bytes=self._max_frame_bytes))

    def _on_ack(self, link: _Link, obj: list[object]) -> None:
        _, transfer_id, offset, status, epoch = _fields(obj, 5, "snapshot ack")
        transfer_id = _uint(transfer_id, "snapshot ack transfer id")
        offset = _uint(offset, "snapshot ack offset")
        epoch = _uint(epoch, "snapshot ack epoch")
        if type(status) is not int or status not in _ACK_STATUSES:
            raise MalformedMessageError(f"snapshot ack status: {show_value(status)}")
        out = link.outgoing
        if out is None or out.transfer_id != transfer_id:
            return  # about a transfer we already finished, replaced or gave up
        if offset > out.size:
            raise MalformedMessageError(f"snapshot ack offset {offset} beyond size {out.size}")
        if status == ACK_DONE:
            link.outgoing = None
            link.snapshot_transfers_completed += 1
            link.snapshot_send_seconds_total += time.monotonic() - out.started_monotonic
            self._log.info(
                "snapshot transfer %016x to peer %d completed (%d bytes)",
                transfer_id,
                link.peer_id,
                out.size,
            )
        elif status == ACK_FAILED:
            link.outgoing = None
            link.snapshot_transfers_failed += 1
            self._log.warning(
                "snapshot transfer %016x to peer %d was dropped by the peer; the next retry "
                "starts a new one",
                transfer_id,
                link.peer_id,
            )
        elif status == ACK_PROGRESS:
            out.acked = max(out.acked, offset)
            out.next_offset = max(out.next_offset, out.acked)
        elif epoch == out.epoch:  # ACK_REWIND of our current pass (older ones are stale)
            self._log.info(
                "snapshot transfer %016x to peer %d rewinds from offset %d to %d",
                transfer_id,
                link.peer_id,
                out.next_offset,
                offset,
            )
            out.acked = out.next_offset = offset
            out.epoch += 1
            link.wakeup.set()

    def _on_chunk(self, link: _Link, obj: list[object]) -> None:
        _, transfer_id, size, offset, epoch, digest, data = _fields(obj, 7, "snapshot chunk")
        # Without a valid id and epoch there is no transfer to drop: only counted as malformed.
        transfer_id = _uint(transfer_id, "snapshot chunk transfer id")
        epoch = _uint(epoch, "snapshot chunk epoch")
        if transfer_id == link.incoming_failed_id:
            self._send_ack(link, transfer_id, 0, ACK_FAILED, epoch)
            return
        try:
            size = _uint(size, "snapshot chunk size")
            offset = _uint(offset, "snapshot chunk offset")
            if type(data) is not bytes or not data:
                raise MalformedMessageError("snapshot chunk data: expected non-empty bytes")
            end = offset + len(data)
            if end > size:
                raise MalformedMessageError(f"snapshot chunk [{offset}, {end}) beyond size {size}")
            if type(digest) is not bytes or len(digest) != (_DIGEST_BYTES if end == size else 0):
                raise MalformedMessageError("snapshot chunk digest: expected 32 bytes, last only")
            if size > self._snapshot_transfer_bytes_max:
                raise MalformedMessageError(
                    f"snapshot transfer of {size} bytes exceeds the limit of "
                    f"{self._snapshot_transfer_bytes_max} bytes"
                )
            inc = link.incoming
            if inc is not None and inc.transfer_id == transfer_id and inc.size != size:
                raise MalformedMessageError(f"snapshot chunk size {size}, not {inc.size}")
        except MalformedMessageError as exc:
            link.malformed += 1
            self._drop_incoming(link, transfer_id, epoch, str(exc))
            return
        if transfer_id == link.incoming_done_id:
            # A late or repeated chunk of a transfer we delivered: our done may have been lost.
            self._send_ack(link, transfer_id, size, ACK_DONE, epoch)
            return
        if inc is None or inc.transfer_id != transfer_id:
            # The peer sends one transfer at a time: a chunk of another one means it gave up on
            # the one we hold (replaced it with a newer snapshot, or restarted).
            self._discard_incoming(link)
            inc = None
            if offset != 0:
                # Mid-way through a transfer we do not hold (we restarted or dropped it).
                self._rewind(link, transfer_id, epoch, 0)
                return
            try:
                inc = _Incoming(
                    transfer_id, size, peer_id=link.peer_id, spool_dir=self._snapshot_spool_dir
                )
            except OSError as exc:
                self._drop_incoming(link, transfer_id, epoch, f"cannot create spool file: {exc}")
                return
            link.incoming = inc
            loop = asyncio.get_running_loop()
            inc.last_chunk_at = loop.time()
            inc.expiry = loop.call_later(
                self._snapshot_transfer_idle_s, self._expire_incoming, link, inc
            )
            self._log.info(
                "snapshot transfer %016x from peer %d started (%d bytes)",
                transfer_id,
                link.peer_id,
                size,
            )
        held = inc.held
        if offset > held:
            self._rewind(link, transfer_id, epoch, held)  # a gap: chunks before it were lost
            return
        if end <= held:
            return  # sent again after a reconnect or a rewind; we hold all of it
        try:
            with memoryview(data) as view:
                new = view[held - offset :]
                inc.write(new)
                new.release()
        except OSError as exc:
            self._drop_incoming(link, transfer_id, epoch, f"cannot write spool file: {exc}")
            return
        held = end
        inc.last_chunk_at = asyncio.get_running_loop().time()
        if held < size:
            if held - inc.acked >= self._snapshot_ack_interval_bytes:
                inc.acked = held
                self._send_ack(link, transfer_id, held, ACK_PROGRESS, epoch)
            return
        self._complete_incoming(link, inc, digest, epoch)

    def _complete_incoming(self, link: _Link, inc: _Incoming, digest: bytes, epoch: int) -> None:
        if not hmac.compare_digest(inc.hasher.digest(), digest):
            self._drop_incoming(link, inc.transfer_id, epoch, "SHA-256 mismatch")
            return
        link.incoming = None
        try:
            # The snapshot's data stays in the spool file (or the buffer): decoding reads
            # and copies only the message's small head.
            msg = decode_install_snapshot(inc.encoded())
        except OSError as exc:
            self._drop_incoming(link, inc.transfer_id, epoch, f"cannot read spool file: {exc}")
            return
        except MalformedMessageError as exc:
            self._drop_incoming(link, inc.transfer_id, epoch, f"undecodable: {exc}")
            return
        finally:
            inc.discard()
        link.incoming_done_id = inc.transfer_id
        link.snapshot_transfers_received += 1
        self._send_ack(link, inc.transfer_id, inc.size, ACK_DONE, epoch)
        self._log.info(
            "snapshot transfer %016x from peer %d complete: snapshot index %d, %d bytes",
            inc.transfer_id,
            link.peer_id,
            msg.snapshot.meta.index,
            inc.size,
        )
        self._deliver_message(link, msg)

    def _drop_incoming(self, link: _Link, transfer_id: int, epoch: int, why: str) -> None:
        """Drop the transfer (only it: the connection stays) and tell the sender."""
        inc = link.incoming
        if inc is not None and inc.transfer_id == transfer_id:
            self._discard_incoming(link)
        link.incoming_failed_id = transfer_id
        link.snapshot_transfers_dropped += 1
        self._warn_peer(
            link,
            "dropping snapshot transfer %016x from peer %d: %s",
            transfer_id,
            link.peer_id,
            why,
        )
        self._send_ack(link, transfer_id, 0, ACK_FAILED, epoch)

    def _expire_incoming(self, link: _Link, inc: _Incoming) -> None:
        """The idle timer of `inc`: drop it if no chunk added bytes for the idle limit (its
        sender restarted or gave it up), else look again when the limit would be reached."""
        inc.expiry = None
        if link.incoming is not inc:
            return  # completed, dropped or replaced meanwhile (their discard ends the timer)
        loop = asyncio.get_running_loop()
        idle_s = loop.time() - inc.last_chunk_at
        if idle_s < self._snapshot_transfer_idle_s:
            inc.expiry = loop.call_later(
                self._snapshot_transfer_idle_s - idle_s, self._expire_incoming, link, inc
            )
            return
        self._discard_incoming(link)
        link.snapshot_transfers_dropped += 1
        self._log.warning(
            "dropping snapshot transfer %016x from peer %d: no chunk for %.0f s (%d of %d "
            "bytes held); its sender restarted or gave it up, and is asked for it from the "
            "start if it goes on",
            inc.transfer_id,
            link.peer_id,
            idle_s,
            inc.held,
            inc.size,
        )

    @staticmethod
    def _discard_incoming(link: _Link) -> None:
        inc, link.incoming = link.incoming, None
        if inc is not None:
            inc.discard()

    def _rewind(self, link: _Link, transfer_id: int, epoch: int, offset: int) -> None:
        # One rewind per pass of the sender: the chunks already in flight behind the one that
        # showed the gap would only repeat it.
        if link.rewind_sent == (transfer_id, epoch):
            return
        link.rewind_sent = (transfer_id, epoch)
        self._log.info(
            "snapshot transfer %016x from peer %d: asking for a resend from offset %d",
            transfer_id,
            link.peer_id,
            offset,
        )
        self._send_ack(link, transfer_id, offset, ACK_REWIND, epoch)


def _remove_spool_leftovers(spool_dir: Path, logger: logging.Logger) -> None:
    """Delete the spool files of transfers an earlier process left unfinished."""
    try:
        leftovers = list(spool_dir.glob(f"*{SPOOL_SUFFIX}"))
    except OSError:
        return  # the directory does not exist yet or cannot be read: the first spool says why
    for path in leftovers:
        with contextlib.suppress(OSError):
            path.unlink()
            logger.info("deleted an unfinished snapshot transfer's spool file %s", path)


def _fields(obj: list[object], count: int, what: str) -> list[object]:
    if len(obj) != count:
        raise MalformedMessageError(f"{what}: expected {count} fields, got {len(obj)}")
    return obj


def _uint(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value < _U64_END:
        raise MalformedMessageError(
            f"{what}: expected an integer in [0, 2**64), got {show_value(value)}"
        )
    return value
