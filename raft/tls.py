"""TLS contexts for peer links and client connections, built from PEM files with typed errors.

Key idea: TLS sits *under* our own protocols and changes no byte above it. A peer link is
mutual TLS (each node presents its certificate and verifies the other's against the cluster
CA), and inside it the HMAC handshake with the cluster secret runs exactly as without TLS
(`raft.transport`). So a node needs both the secret and a certificate of the cluster CA to join,
and the peer protocol version does not change.

Per-node identity. A node certificate names its node: its subject common name is
`node-<id>` (`node_common_name`). A peer link accepts a connection only from the node whose
certificate names the id it claims in its hello, and connects only to a node whose certificate
names the id it dialled; so a copied certificate of node 3 cannot speak as node 2, and a copied
cluster secret alone is not enough.

Jargon:
    CA file     the PEM certificate(s) of the authority that signs every node certificate.
    cert/key    a node's (or a client's) PEM certificate and its private key.

Invariants:
* `check_node_files` and the context builders either return a usable context or raise
  `TlsConfigError` whose message is one line naming the file and what is wrong with it (missing,
  unreadable, not PEM, key does not match, not signed by the CA, expired), so a daemon refuses
  to start with that line instead of failing at its first connection.
* A node key that group or others may read is logged as a warning naming the `chmod` that
  fixes it (not refused: see `_warn_if_others_may_read`).
* Contexts never fall back to an unverified mode: every context that verifies a peer has
  CERT_REQUIRED, client contexts check host names, and the minimum version is TLS 1.2.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import logging
import socket
import ssl
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from raft.errors import TlsConfigError
from raft.limits import STRANGERS_PER_HOST_MAX, TLS_HANDSHAKES_IN_PROGRESS_MAX

__all__ = [
    "PEM_FILE_BYTES_MAX",
    "ClientTls",
    "TlsFiles",
    "TlsListener",
    "check_node_files",
    "client_context",
    "node_common_name",
    "peer_common_name",
    "peer_client_context",
    "peer_server_context",
    "server_context",
]

# The first byte of a TLS connection: a handshake record (RFC 8446 §5.1, content type 22).
TLS_HANDSHAKE_RECORD_TYPE: Final = 0x16
# Back-off after accept() fails (out of file descriptors): retrying at once would spin.
_ACCEPT_ERROR_PAUSE_S: Final = 0.1
_LISTEN_BACKLOG: Final = 128
# A certificate chain or key file is a few KiB; refuse to read something that is clearly not one.
PEM_FILE_BYTES_MAX: Final = 1024 * 1024
_PEM_BEGIN: Final = b"-----BEGIN "


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """One node's TLS material. Paths are absolute (resolved by the config loader)."""

    ca_file: Path
    cert_file: Path
    key_file: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientTls:
    """How a client (CLI, Spark driver) speaks TLS to client ports.

    `ca_file`: the CA that signed the nodes' certificates (None: the system trust store).
    `cert_file`/`key_file`: a client certificate, for ports that require one (both or neither).
    `server_name`: the name to verify every node's certificate against instead of the host of
    each endpoint (for nodes reached through addresses their certificates do not name).
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None

    def context(self) -> ssl.SSLContext:
        return client_context(
            ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file
        )


def node_common_name(node_id: int) -> str:
    """The subject CN a node certificate must carry: its identity on peer links."""
    return f"node-{node_id}"


def _read_pem(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(PEM_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise TlsConfigError(f"{what} {path}: file not found") from None
    except OSError as exc:
        raise TlsConfigError(f"{what} {path}: cannot read: {exc.strerror}") from None
    if len(data) > PEM_FILE_BYTES_MAX:
        raise TlsConfigError(
            f"{what} {path}: larger than PEM_FILE_BYTES_MAX={PEM_FILE_BYTES_MAX} bytes"
        )
    if _PEM_BEGIN not in data:
        raise TlsConfigError(f"{what} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


def _ssl_reason(exc: ssl.SSLError) -> str:
    # "[X509: KEY_VALUES_MISMATCH] key values mismatch (_ssl.c:3926)" -> the words only.
    text = exc.reason or exc.strerror or str(exc)
    return str(text).replace("_", " ").lower()


def _warn_if_others_may_read(key_file: Path) -> None:
    """A private key group or others may read is as exposed as a cluster secret would be (those
    are refused, metastore.daemon.secrets). Warned about, not refused: keys are often handed
    over by tooling with its own modes, and refusing would stop a node mid-rotation."""
    with contextlib.suppress(OSError):  # just read by _read_pem; a race is not worth a stop
        mode = stat.S_IMODE(key_file.stat().st_mode)
        if mode & 0o077:
            logging.getLogger("raft.tls").warning(
                "TLS key file %s has mode %04o: group or others may read this node's private "
                "key (chmod 600 %s)",
                key_file,
                mode,
                key_file,
            )


def check_node_files(files: TlsFiles, *, now: datetime.datetime | None = None) -> None:
    """Check a node's CA, certificate and key before anything listens: each file is readable
    PEM, the key belongs to the certificate, the certificate is valid now and signed by the CA.
    `now` (UTC) is injectable for tests."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    ca_pem = _read_pem(files.ca_file, "CA file")
    cert_pem = _read_pem(files.cert_file, "certificate file")
    _read_pem(files.key_file, "key file")
    _warn_if_others_may_read(files.key_file)
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise TlsConfigError(f"CA file {files.ca_file}: no readable certificate ({exc})") from None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TlsConfigError(
            f"certificate file {files.cert_file}: not a readable certificate ({exc})"
        ) from None
    # The key/cert match and the key's own format: OpenSSL's verdict, which is what counts.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(files.cert_file, files.key_file)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"key file {files.key_file} does not match certificate {files.cert_file} "
            f"(or is not a readable key): {_ssl_reason(exc)}"
        ) from None
    at = now if now is not None else datetime.datetime.now(datetime.UTC)
    if at < cert.not_valid_before_utc:
        raise TlsConfigError(
            f"certificate file {files.cert_file}: not valid before {cert.not_valid_before_utc}"
        )
    if at > cert.not_valid_after_utc:
        raise TlsConfigError(
            f"certificate file {files.cert_file}: expired at {cert.not_valid_after_utc}"
        )
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return
    raise TlsConfigError(
        f"certificate file {files.cert_file} (issuer {cert.issuer.rfc4514_string()}) is not "
        f"signed by the CA in {files.ca_file}"
    )


def _base_context(purpose: int) -> ssl.SSLContext:
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _load_ca(ctx: ssl.SSLContext, ca_file: Path) -> None:
    _read_pem(ca_file, "CA file")
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"CA file {ca_file}: {_ssl_reason(exc)}") from None


def _load_chain(ctx: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    _read_pem(cert_file, "certificate file")
    _read_pem(key_file, "key file")
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"key file {key_file} does not match certificate {cert_file} "
            f"(or is not a readable key): {_ssl_reason(exc)}"
        ) from None


def server_context(
    *,
    cert_file: Path,
    key_file: Path,
    ca_file: Path | None,
    verify_client: ssl.VerifyMode = ssl.CERT_NONE,
) -> ssl.SSLContext:
    """A listener's context: presents cert/key. `verify_client`: CERT_REQUIRED refuses a
    handshake without a certificate signed by `ca_file`; CERT_OPTIONAL refuses one with a
    certificate not signed by it but admits one without any (the caller then refuses it in its
    own protocol, with a reason the client can show: a TLS 1.3 client only sees the
    connection close)."""
    ctx = _base_context(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(ctx, cert_file, key_file)
    if verify_client != ssl.CERT_NONE:
        if ca_file is None:
            raise TlsConfigError("verifying client certificates needs a CA file")
        _load_ca(ctx, ca_file)
        ctx.verify_mode = verify_client
    return ctx


def client_context(
    *, ca_file: Path | None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """A connecting side's context: verifies the server's certificate and host name against
    `ca_file` (the system's trust store when None) and presents cert/key when given."""
    ctx = _base_context(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    if ca_file is None:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load_ca(ctx, ca_file)
    if (cert_file is None) != (key_file is None):
        raise TlsConfigError("a client certificate needs its key, and a key its certificate")
    if cert_file is not None and key_file is not None:
        _load_chain(ctx, cert_file, key_file)
    return ctx


def peer_server_context(files: TlsFiles) -> ssl.SSLContext:
    """Peer listener: mutual TLS, the connecting node's certificate must chain to the CA."""
    return server_context(
        cert_file=files.cert_file,
        key_file=files.key_file,
        ca_file=files.ca_file,
        verify_client=ssl.CERT_REQUIRED,
    )


def peer_client_context(files: TlsFiles) -> ssl.SSLContext:
    """Peer dialler: verifies the peer against the CA (and its address against the certificate's
    names) and presents this node's certificate."""
    return client_context(ca_file=files.ca_file, cert_file=files.cert_file, key_file=files.key_file)


def peer_common_name(peercert: object) -> str | None:
    """The subject CN of a verified peer certificate (`SSLObject.getpeercert()`), or None."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for pair in rdn:
            if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == "commonName":
                return str(pair[1])
    return None


# ---- a listener that reports refused handshakes ----------------------------------------------

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class TlsListener:
    """A TCP listener that runs each connection's TLS handshake itself, then hands the stream to
    `handler` as `asyncio.start_server` would.

    Why not `start_server(ssl=...)`: asyncio drops a failed handshake silently (an SSLError is
    an OSError, logged only in debug mode), so a node would never say that it refused a peer
    with a certificate of another CA. Here every refusal calls `on_refused(peer, reason)`.
    Starting TLS on an already-read stream (`StreamWriter.start_tls`) is no alternative on the
    server side: the ClientHello may already sit in the plain reader's buffer.

    The first byte decides: a TLS handshake record goes through the handshake; anything else is
    refused, unless `plaintext_ok`, in which case the connection is handed over unencrypted and
    the handler refuses it in its own protocol (the client port answers the plaintext hello
    with a typed error instead of a reset, so a client knows to use TLS).

    Limits: at most `handshakes_max` connections are before or in their handshake at once, and
    at most STRANGERS_PER_HOST_MAX of them from one source address (a newcomer past either is
    closed and counted), each for at most `handshake_timeout_s`.
    """

    def __init__(
        self,
        handler: StreamHandler,
        context: ssl.SSLContext,
        *,
        handshake_timeout_s: float,
        on_refused: Callable[[str, str], None],
        read_limit_bytes: int,
        plaintext_ok: bool = False,
        handshakes_max: int = TLS_HANDSHAKES_IN_PROGRESS_MAX,
        logger: logging.Logger | None = None,
    ) -> None:
        self._handler = handler
        self._context = context
        self._handshake_timeout_s = handshake_timeout_s
        self._on_refused = on_refused
        self._read_limit_bytes = read_limit_bytes
        self._plaintext_ok = plaintext_ok
        self._handshakes_max = handshakes_max
        self._log = logger if logger is not None else logging.getLogger("raft.tls")
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        # Invariant: a task is here exactly while its connection is before or in its handshake
        # (with its source host, for the per-host cap).
        self._handshaking: dict[asyncio.Task[None], str] = {}
        # Strong references to every connection's task: the event loop keeps only weak ones.
        self._handlers: set[asyncio.Task[None]] = set()
        self.refused_over_limit = 0
        self.refused_per_host = 0
        self.handshakes_failed = 0

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._sock,) if self._sock is not None else ()

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        if not infos:
            raise OSError(errno.EADDRNOTAVAIL, f"no address for {host}")
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(_LISTEN_BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._accept_task = loop.create_task(self._accept_loop(sock), name="tls-accept")
        # The socket is closed only once the accept loop has ended: closing a descriptor the
        # event loop still polls (uvloop) could hit a reused descriptor.
        self._accept_task.add_done_callback(lambda _: sock.close())

    def close(self) -> None:
        """Stop accepting and abandon the handshakes in progress; handed-over connections
        belong to the handler's owner."""
        if self._accept_task is not None:
            self._accept_task.cancel()
        for task in self._handshaking:
            task.cancel()
        if self._accept_task is None and self._sock is not None:
            self._sock.close()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accept_task, *self._handshaking) if t is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as exc:
                self._log.warning("accept failed: %s", exc)
                await asyncio.sleep(_ACCEPT_ERROR_PAUSE_S)
                continue
            if len(self._handshaking) >= self._handshakes_max:
                self.refused_over_limit += 1
                conn.close()
                continue
            host = source_host(address)
            if sum(1 for h in self._handshaking.values() if h == host) >= STRANGERS_PER_HOST_MAX:
                # One host may not hold more than its share of the handshakes in progress.
                self.refused_per_host += 1
                conn.close()
                continue
            task = loop.create_task(self._admit(conn, address))
            self._handshaking[task] = host
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _admit(self, conn: socket.socket, address: object) -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        peer = _address_text(address)
        reader = asyncio.StreamReader(limit=self._read_limit_bytes)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            try:
                async with asyncio.timeout(self._handshake_timeout_s):
                    first = await _peek_byte(conn)
                    if not first:
                        conn.close()
                        return
                    use_tls = first[0] == TLS_HANDSHAKE_RECORD_TYPE
                    if not use_tls and not self._plaintext_ok:
                        self._refuse(conn, peer, "not a TLS connection (plaintext peer?)")
                        return
                    transport, _ = await loop.connect_accepted_socket(
                        lambda: protocol,
                        conn,
                        ssl=self._context if use_tls else None,
                        ssl_handshake_timeout=self._handshake_timeout_s if use_tls else None,
                    )
            except ssl.SSLError as exc:
                self._refuse(conn, peer, f"TLS handshake failed: {_ssl_reason(exc)}")
                return
            except (OSError, TimeoutError) as exc:
                if isinstance(exc, TimeoutError):
                    reason = "TLS handshake timed out"
                else:
                    # Typically the other side refusing our certificate (another CA).
                    reason = (
                        "closed by the other side during the TLS handshake (does it trust "
                        f"this node's CA?): {str(exc) or type(exc).__name__}"
                    )
                self._refuse(conn, peer, reason)
                return
        finally:
            if task is not None:
                self._handshaking.pop(task, None)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self._handler(reader, writer)

    def _refuse(self, conn: socket.socket, peer: str, reason: str) -> None:
        self.handshakes_failed += 1
        conn.close()
        self._on_refused(peer, reason)


async def _peek_byte(conn: socket.socket) -> bytes:
    """The connection's first byte, left in the socket for the TLS handshake to read."""
    loop = asyncio.get_running_loop()
    fd = conn.fileno()
    while True:
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, lambda f=readable: f.done() or f.set_result(None))  # type: ignore[misc]
        try:
            await readable
        finally:
            loop.remove_reader(fd)
        try:
            return conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue


def source_host(address: object) -> str:
    """The host part of a socket's peer address (what the per-host stranger cap counts)."""
    if isinstance(address, tuple) and address:
        return str(address[0])
    return str(address)


def _address_text(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
