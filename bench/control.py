"""The benchmark control protocol: how the harness drives a node of either Raft engine.

Key idea: the harness never links against an engine. Each engine runs as three node processes
that serve the same tiny request/reply protocol on a loopback TCP port, so the very same workload
code measures our engine and the pysyncobj baseline.

Wire format: a frame is a 4-byte big-endian unsigned length followed by that many bytes of one
msgpack map (strings decoded as `str`, payloads as `bytes`). A connection carries any number of
request/reply pairs, strictly alternating; the server answers requests in order.

Requests and replies (every reply has `ok`; a failed one has `error`, a short code, and usually
`message`):

* `{"op": "status"}` -> `{"ok", "node_id", "role", "leader" (0 = unknown), "term",
  "commit_index", "applied_index"}`, optionally `"peers_connected": [ids]` (the harness then
  waits for a full mesh before killing a leader); extra fields are ignored
* `{"op": "propose", "data": bytes}` -> `{"ok": true, "index"}` once applied on that node, or
  `{"ok": false, "error": "not_leader", "leader"}`
* `{"op": "load", "count", "inflight", "size"}` -> `{"ok": true, "acked", "elapsed_s"}`
* `{"op": "latency", "count", "size"}` -> `{"ok": true, "latencies_us": [...]}`
* `{"op": "applied_digest"}` -> `{"ok": true, "count", "sha256"}`; digests are only ever
  compared between nodes of the same engine, so each engine defines its own running digest.

Invariants:
* A frame never exceeds `FRAME_BYTES_MAX`, on either side; a bigger length prefix is a protocol
  error, detected before anything is buffered.
* After a client-side timeout or error the connection is closed: a late reply would otherwise be
  read as the answer to the next request.

This module also holds the bench's limits (one place, each enforced with a clear error) and a
small threaded server used by `bench.pysyncobj_node`.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import msgpack

# --- Limits -----------------------------------------------------------------------------------
# Why 16 MiB: the largest legitimate frame is a latency reply (a few bytes per sample, at most
# LATENCY_COUNT_MAX samples) or a propose of PAYLOAD_BYTES_MAX; both fit with a wide margin.
FRAME_BYTES_MAX = 16 * 1024 * 1024
FRAME_HEADER_BYTES = 4
PAYLOAD_BYTES_MAX = 1024 * 1024
LOAD_COUNT_MAX = 1_000_000
LOAD_INFLIGHT_MAX = 10_000
LATENCY_COUNT_MAX = 100_000
# Concurrent connections one node's control server accepts (each holds a thread).
SERVER_CONNECTIONS_MAX = 64
SERVER_POLL_INTERVAL_S = 0.05
# A single proposal that is not applied within this time is reported as failed.
PROPOSE_TIMEOUT_S = 5.0
# A load/latency run must finish within BASE + count * PER_OP; generous, only to bound waits.
RUN_TIMEOUT_BASE_S = 30.0
RUN_TIMEOUT_PER_OP_S = 0.25

_HEADER = struct.Struct(">I")


def run_timeout_s(count: int) -> float:
    """Upper bound on how long a `load` or `latency` run of `count` proposals may take."""
    return RUN_TIMEOUT_BASE_S + count * RUN_TIMEOUT_PER_OP_S


# --- Errors -----------------------------------------------------------------------------------
class ControlError(Exception):
    """Base of every control-protocol failure; `code` is stable and machine-readable."""

    code: ClassVar[str] = "control_error"


class ControlProtocolError(ControlError):
    """The peer sent something that is not a valid frame (bad length, not a msgpack map)."""

    code = "protocol"


class FrameTooLargeError(ControlProtocolError):
    """A frame is longer than FRAME_BYTES_MAX (sending or receiving)."""

    code = "frame_too_large"


class ControlConnectionError(ControlError):
    """The connection could not be made or was lost (refused, reset, closed mid-frame)."""

    code = "connection"


class ControlTimeoutError(ControlConnectionError):
    """No complete reply arrived within the client's timeout; the connection was dropped."""

    code = "timeout"


# --- Sans-I/O codec ---------------------------------------------------------------------------
def encode_frame(message: Mapping[str, Any]) -> bytes:
    """Serialize one message as a length-prefixed msgpack frame."""
    body = msgpack.packb(dict(message), use_bin_type=True)
    if len(body) > FRAME_BYTES_MAX:
        raise FrameTooLargeError(f"frame of {len(body)} bytes exceeds FRAME_BYTES_MAX")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Decode one frame body; it must be a msgpack map with string keys."""
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ControlProtocolError(f"undecodable frame body: {exc}") from exc
    if not isinstance(message, dict):
        raise ControlProtocolError(f"frame body is a {type(message).__name__}, not a map")
    if not all(isinstance(key, str) for key in message):
        raise ControlProtocolError("frame map has non-string keys")
    return message


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, take complete messages out.

    Invariant: `_buffer` never holds more than one frame header plus FRAME_BYTES_MAX bytes of a
    frame that is not complete yet (anything beyond belongs to following frames, which are
    checked in turn as soon as their header is complete).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> dict[str, Any] | None:
        """The next complete message, or None when more bytes are needed."""
        if len(self._buffer) < FRAME_HEADER_BYTES:
            return None
        (length,) = _HEADER.unpack_from(self._buffer)
        if length > FRAME_BYTES_MAX:
            raise FrameTooLargeError(f"peer announced a frame of {length} bytes")
        end = FRAME_HEADER_BYTES + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[FRAME_HEADER_BYTES:end])
        del self._buffer[:end]
        return decode_body(body)

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    """Read exactly `size` bytes; None on a clean EOF before the first byte."""
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1024 * 1024))
        if not chunk:
            if remaining == size:
                return None
            raise ControlConnectionError("connection closed in the middle of a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    """Blocking read of one message from `sock`; None when the peer closed cleanly."""
    header = _recv_exactly(sock, FRAME_HEADER_BYTES)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    if length > FRAME_BYTES_MAX:
        raise FrameTooLargeError(f"peer announced a frame of {length} bytes")
    body = _recv_exactly(sock, length) if length else b""
    if body is None:
        raise ControlConnectionError("connection closed after a frame header")
    return decode_body(body)


# --- Blocking client --------------------------------------------------------------------------
class ControlClient:
    """A blocking client for one node's control port; connects lazily, reconnects after errors.

    Not thread-safe: use one client per thread.
    """

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def call(self, request: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Send one request and wait (at most `timeout_s`, default the client's) for its reply."""
        frame = encode_frame(request)
        effective_timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            sock = self._connected(effective_timeout_s)
            sock.settimeout(effective_timeout_s)
            sock.sendall(frame)
            reply = read_frame(sock)
        except TimeoutError as exc:
            self.close()
            raise ControlTimeoutError(
                f"no reply from {self.host}:{self.port} within {effective_timeout_s:.1f} s"
            ) from exc
        except OSError as exc:
            self.close()
            raise ControlConnectionError(f"{self.host}:{self.port}: {exc}") from exc
        except ControlError:
            self.close()
            raise
        if reply is None:
            self.close()
            raise ControlConnectionError(f"{self.host}:{self.port} closed the connection")
        return reply

    def _connected(self, timeout_s: float) -> socket.socket:
        if self._sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
            # Requests are tiny and latency-measured: never let Nagle hold one back.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
        return self._sock


# --- Threaded server --------------------------------------------------------------------------
Handler = Callable[[dict[str, Any]], dict[str, Any]]


def error_reply(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The reply for a failed request."""
    return {"ok": False, "error": code, "message": message, **extra}


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: Handler) -> None:
        self.handler = handler
        self.connection_slots = threading.BoundedSemaphore(SERVER_CONNECTIONS_MAX)
        super().__init__(address, _ConnectionHandler)


class _ConnectionHandler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        if not self.server.connection_slots.acquire(blocking=False):
            # Over the limit: say so once and drop the connection instead of spawning threads.
            sock.sendall(
                encode_frame(error_reply("too_many_connections", "SERVER_CONNECTIONS_MAX reached"))
            )
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._serve(sock)
        finally:
            self.server.connection_slots.release()

    def _serve(self, sock: socket.socket) -> None:
        while True:
            try:
                request = read_frame(sock)
            except ControlProtocolError as exc:
                # The stream position is lost after a bad frame: answer once, then hang up.
                sock.sendall(encode_frame(error_reply(exc.code, str(exc))))
                return
            except (OSError, ControlConnectionError):
                return
            if request is None:
                return
            try:
                reply = self.server.handler(request)
            except Exception as exc:
                reply = error_reply("internal", f"{type(exc).__name__}: {exc}")
            try:
                sock.sendall(encode_frame(reply))
            except FrameTooLargeError as exc:
                sock.sendall(encode_frame(error_reply(exc.code, str(exc))))
            except OSError:
                return


class ControlServer:
    """Serves the control protocol on `host:port` (0 = pick a free port), one thread per client.

    `handler` maps a request to a reply; it runs on connection threads, so it must be
    thread-safe. An exception in it becomes an `internal` error reply, not a dead connection.
    """

    def __init__(self, host: str, port: int, handler: Handler) -> None:
        self._server = _TCPServer((host, port), handler)
        # A short poll interval only makes close() prompt; requests are served on their own
        # threads and never wait for it.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SERVER_POLL_INTERVAL_S},
            name="control-server",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def close(self) -> None:
        # shutdown() waits for serve_forever() to notice; it would wait forever if never started.
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5.0)
        self._server.server_close()

    def __enter__(self) -> ControlServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()
