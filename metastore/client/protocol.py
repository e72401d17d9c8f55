"""The metastore client: docs/protocol.md over asyncio, with failover across the cluster's nodes.

Key idea
    A client knows every node's client address (`host:port`). It keeps at most one connection
    per node, opened lazily and authenticated with `hello` before anything else is sent. Requests
    on a connection are pipelined and matched to replies by id, so concurrent callers share it.
    A call goes to the node that answered last; if that node cannot be reached, or answers
    NOT_READY / UNAVAILABLE / NOT_LEADER (retryable: nothing was done), the call moves on to the
    next node, a bounded number of times with backoff between rounds, all within the call's
    timeout. So does a call the node answered with a catch-up timeout (`CatchUpTimeoutError`:
    TIMEOUT with `details.reason` = "catch_up"; it lags behind the position the read needs, e.g.
    a page token cut by a node further ahead, and did nothing). A write the node answered
    TIMEOUT for (its outcome unknown there) moves on too, when repeating it is harmless
    (below). Any other TIMEOUT of a read answers the read's own wait bound and is raised.

Results
    Every method returns the protocol's `result` map unchanged (a plain dict of msgpack types:
    str, int, float, bool, None, lists and str-keyed dicts), e.g. `await c.status()` is
    `{"node_id": 1, "role": "leader", ...}` and `await c.list_tables("sales")` is
    `{"tables": [...]}`. `status_all()` / `safe_time_all()` return one `EndpointResult` (a small
    frozen dataclass) per endpoint. Failures raise `metastore.errors.MetastoreError` subclasses,
    rebuilt from the reply's `error` map (`MetastoreError.from_wire`).

Retries (what is safe to repeat)
    * Reads are retried freely (a `pin` without `session_id`, which leases nothing, is one).
    * `ddl` always carries a `request_id` (a uuid4 unless the caller passes one); the state
      machine applies a request id once, so a `ddl` is retried even when its first attempt was
      sent and the connection then broke (outcome unknown). A raw `call("ddl", ...)` without a
      request id is retried only when the node certainly did nothing (connect failure,
      NOT_READY, NOT_LEADER).
    * `pts_protect` with a `record_id` (`protect` always picks one) is retried like a `ddl`:
      the same id with the same content is the same record. Without one the node picks an id
      per request, so a raw call is retried only when the node certainly did nothing.
    * `cert_revoke` carries a `request_id` (`revoke_cert` always picks one) and is retried like
      a `ddl`: a revocation is permanent and the id is applied once. A node that answers a
      repeat "in use" (a check on its own peer links, before it proposes) leaves the outcome
      unknown: the first attempt, checked elsewhere, may yet be applied.
    * Membership ops (`add_node`, ...) are retried only when the node certainly did nothing.
    * `gc_run` is repeated like an idempotent write; a run that stopped midway says what it
      deleted (`details.partial`), and `gc_run` adds those parts to the reply (`parts`).
    * A non-retryable error (bad DDL, not found, forbidden, ...) is raised at once. A node
      that refuses the connection or the request as a node (hello, TLS, token, role, an
      argument an older release does not know, INTERNAL) after another node left a write's
      outcome unknown says nothing of the write: the call goes on to the other nodes with
      the same key (one of them may settle it), and if none does, it ends UNAVAILABLE with
      `outcome_unknown`, naming each refusal. (A verdict of apply on the repeated write is
      raised as is.)
    * A timestamp every node of a round refuses as ahead of its clock (TIMESTAMP_AHEAD_OF_CLOCK,
      whose details say by how much and by what bound) is asked again once the soonest of them
      can answer, when the call's budget allows; when it does not, the refusal is raised at
      once rather than after rounds that cannot succeed.
    * Connection failures on every endpoint raise `UnavailableError` naming each endpoint's
      failure; running out of time raises `RequestTimeoutError` (for a write: its outcome is
      unknown, `details.outcome_unknown`; retry it with the same key, which is in the error's
      details: `request_id`, `txn_id`, `record_id`), or, for a write that cannot have been
      applied, `NotAppliedTimeoutError` (TIMEOUT, `details.not_applied`): the deadline passed
      before its request left the client (connecting, or waiting for a free slot), and any
      node that received an earlier attempt answered that it did nothing. A write every
      node answered "nothing done" (NOT_LEADER, NOT_READY, UNAVAILABLE with
      `details.not_sent`: no leader known, a forward not sent) before the call ran out of
      rounds raises the last answer with `details.not_applied` too. A write whose
      outcome is unknown keeps its key in the details of whichever error ends the call
      (TIMEOUT or UNAVAILABLE). The client's own errors end with what
      to do (`_outcome_hint`): retry with the same txn_id / request_id / record_id, check with
      `metastore cluster status` before repeating a change that is not repeatable, or
      (`CHECK_CLUSTER_HINT`) check that the cluster is up.

Time
    Every reply carries the node's HLC `ts`; the client feeds it to its own `HybridClock`
    (`update`), so its next timestamp is causally after everything it has seen. A `ts` too far
    ahead of the local clock raises `ClockOffsetError` in `update`; it is logged and ignored (the
    clock is not moved, the reply is still used).

Monotonic reads
    A read without a timestamp is answered at the answering node's now (schemas) or safe time
    (state, files), and those differ between nodes. The client keeps the newest positions its
    answers were read at (`schema_floor_ts`, `read_floor_ts`) and sends them as `min_ts` on its
    later reads without a timestamp (`_with_floor`), so asking another node never shows an
    older state than one already seen (docs/protocol.md, "Monotonic reads"). Only nodes whose
    hello says `read_floor` get it on schema and state reads (an older daemon refuses unknown
    arguments); `files` always took it. A position too far ahead of this client's clock is not
    kept, and a floor no node can reach within a call fails that call and is lowered. The
    floors and `own_writes_ts` (read-your-writes) are the process's, per cluster id
    (metastore.client.floors): every client object of the process talking to the cluster whose
    nodes answered it reads and raises the same ones, so a second client never misses the
    first one's commit nor reads below what it saw. A data source's commit worker hands its
    position to the driver (spark_bridge.keeper, a floor source); other processes (Spark
    executors, each CLI call) keep their own: `read_ts()` is linearizable.

Threads
    `MetastoreClient` belongs to one event loop. `SyncMetastoreClient` offers the same methods,
    blocking, backed by a private event loop in a daemon thread; it may be shared by several
    threads (the Spark driver's py4j callback threads, the CLI). A client dropped without
    `close()`/`aclose()` is finalized: a ResourceWarning, its connections closed (their
    sockets shut down directly when its loop no longer runs) and (sync) its loop thread ended,
    the shutdown running in that thread, not in the one that collected the client; nothing it
    runs refers back to it, so dropping it is enough.

Invariants
    * At most one connection per endpoint, and at most CLIENT_INFLIGHT_PER_CONNECTION_MAX
      requests in flight on it (callers beyond that wait for a slot, so the server never sees
      LIMIT_EXCEEDED from us; a request whose caller gave up keeps its slot until the node
      answers it, as the node counts it until then), besides liveness probes, which take no
      slot (any answer, even LIMIT_EXCEEDED, shows the node alive).
    * The first frame on every connection is `hello`.
    * A request that may have been executed is repeated only if repeating it is harmless.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import random
import socket
import ssl
import threading
import uuid
import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from hlc import (
    ClockOffsetError,
    HlcError,
    HybridClock,
    SystemClock,
    physical_ms,
)
from hlc.limits import LOGICAL_BITS, MAX_TS
from metastore.client.floors import ReadFloors, shared_floors
from metastore.client.txn_marks import (
    RESERVED_STREAM_PREFIX,
    canonical_table,
    is_reserved_stream,
    mark_verdict,
    refused_mark,
    txn_mark,
)
from metastore.daemon.api_limits import (
    CLIENT_FRAME_BYTES_MAX,
    CLIENT_INFLIGHT_PER_CONNECTION_MAX,
    CLIENT_REPLY_ITEMS_MAX,
    FORWARD_REPLY_MARGIN_MS,
    MEMBERSHIP_TIMEOUT_MS_DEFAULT,
    REMOVE_NODE_REVOCATION_MS_MAX,
    REQUEST_TIMEOUT_MS_DEFAULT,
    REQUEST_TIMEOUT_MS_MAX,
    STATE_FLOOR_OPS,
    refuse_protection_ahead,
)
from metastore.errors import (
    BadRequestError,
    BatchAlreadyCommittedError,
    CatchUpTimeoutError,
    ErrorCode,
    InvalidArgumentError,
    LimitExceededError,
    ManifestConflictError,
    MetastoreError,
    NotAppliedTimeoutError,
    RequestTimeoutError,
    TlsFailedError,
    UnauthenticatedError,
    UnavailableError,
    UnknownOpError,
    WatchStartCompactedError,
)
from raft.errors import FrameEncodeError, FrameTooLargeError, RaftError, TlsConfigError
from raft.framing import NEED_DATA, FrameDecoder, encode_frame
from raft.tls import ClientTls
from raft.wire import brief_repr

__all__ = [
    "ATTEMPTS_MAX",
    "CONNECT_TIMEOUT_MS",
    "HELLO_TIMEOUT_MS",
    "DEFAULT_TIMEOUT_MS",
    "ENDPOINTS_MAX",
    "EndpointResult",
    "MetastoreClient",
    "SyncMetastoreClient",
    "parse_endpoint",
    "refuse_protection_ahead",
]

log = logging.getLogger("metastore.client")

# ---- limits ----------------------------------------------------------------------------------
# Protocol limits (frame size, in-flight requests, server wait bounds) come from the daemon's
# `metastore.daemon.api_limits`, so both ends use the same numbers.

# Default time for one call, across all its attempts. A DDL waits for Tu + CSmax on the server
# (about DD + CSmax = 1 s by default), reads answer at once on a healthy node.
DEFAULT_TIMEOUT_MS: Final = 10_000
# The longest a caller may ask one call to take.
TIMEOUT_MS_MAX: Final = 10 * 60 * 1000
# One TCP connect + `hello` must finish within this (and within the call's own deadline).
# A TCP connect, then the hello on it, each bounded on its own: a node behind a partition (or a
# proxy that accepts and holds) must cost a failing-over call seconds at most, not its budget.
CONNECT_TIMEOUT_MS: Final = 1_500
HELLO_TIMEOUT_MS: Final = 1_000
# A cluster has at most 7 nodes (daemon config NODES_MAX); leave room for a migration.
ENDPOINTS_MAX: Final = 16
ENDPOINT_CHARS_MAX: Final = 300
# Attempts of one call over all endpoints (first try included). Six rounds over a three-node
# cluster: the pauses between them add up to 0.8-1.55 s, longer than an election (followers time
# the dead leader out after election_timeout_ms, 300 ms by default, then vote), so a call rides
# out a leader's crash; bounded so a dead cluster still fails within about a second and a half.
# (Three rounds paused 0.1-0.15 s in all: commits failed with UNAVAILABLE while the followers
# still pointed at the killed leader.)
ATTEMPTS_MAX: Final = 18
# A repeatable request unanswered this long is checked on with a `safe_time` on its connection;
# no answer to that (and no byte received) within the probe timeout closes the connection
# (see _attempt and _answers).
LIVENESS_PROBE_AFTER_MS: Final = 500
LIVENESS_PROBE_TIMEOUT_MS: Final = 500
# Pause between rounds over the endpoints: doubles from MIN up to MAX, with jitter in the upper
# half (so the total pause over the rounds has a floor, not just a ceiling).
RETRY_BACKOFF_MS_MIN: Final = 50
RETRY_BACKOFF_MS_MAX: Final = 1_000
# A round is not started with less than this left of the call's budget after its pause: it
# would most likely be cut by the deadline mid-attempt, and the caller would get a bare
# TIMEOUT instead of what the nodes said (UNAVAILABLE naming each, or their last error).
ROUND_MIN_MS: Final = 100
# A server-side wait (schema_at's timeout_ms) gets this much extra time on the client, so the
# server's own TIMEOUT reply arrives before the client gives up.
SERVER_WAIT_MARGIN_MS: Final = 2_000
READ_CHUNK_BYTES: Final = 256 * 1024
CLIENT_NAME_DEFAULT: Final = "spark_bridge"
# How long closing a SyncMetastoreClient waits for its loop thread.
SYNC_CLOSE_TIMEOUT_MS: Final = 5_000
# How long the finalizer of a SyncMetastoreClient dropped unclosed waits for its loop thread:
# it runs in whatever thread collected the client (a request handler, a callback thread), which
# must not stall for SYNC_CLOSE_TIMEOUT_MS; the shutdown goes on in the loop thread past it.
SYNC_FINALIZE_WAIT_MS: Final = 200

# Retryable codes that mean "this node did not do it; another one may": fail over.
# Files per `files` page the client asks for (the server may return fewer, by bytes).
FILES_PAGE_LIMIT: Final = 10_000
# Rows per page of the keyset-paged lists (the servers' maxima, metastore/daemon/api_limits.py),
# and a bound on the pages one call follows.
SESSION_PAGE_LIMIT = 1_000
LEASE_PAGE_LIMIT = 1_000
GC_STATUS_PAGE_LIMIT = 500
TABLES_PAGE_LIMIT = 5_000
HISTORY_PAGE_LIMIT = 1_000
NAMESPACES_PAGE_LIMIT = 1_000
JOBS_PAGE_LIMIT = 1_256
PAGES_MAX = 100_000
# Times a `files` listing is started again when a compaction changed it between two pages.
LISTING_ATTEMPTS_MAX = 5
# How long one `watch` call waits for the next event before the client asks again.
WATCH_WAIT_MS = 10_000
# Protection records per `pts_list` page.
PTS_PAGE_LIMIT: Final = 100
_FAILOVER_CODES: Final = frozenset(
    {
        ErrorCode.NOT_READY.value,
        ErrorCode.UNAVAILABLE.value,
        ErrorCode.NOT_LEADER.value,
        # That node's clock may be behind; another can answer (see TimestampAheadError).
        ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK.value,
    }
)
# Of those, the ones that guarantee nothing was executed (UNAVAILABLE may come after a write
# was proposed but not confirmed).
_NOT_EXECUTED_CODES: Final = frozenset(
    {
        ErrorCode.NOT_READY.value,
        ErrorCode.NOT_LEADER.value,
        ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK.value,
    }
)
# Refusals by the node itself, never a verdict of apply on the request: the caller's token or
# role there, a request that node cannot take (an older release), a bug there. After another
# node left a write's outcome unknown they say nothing of it (`call`).
_NODE_REFUSAL_CODES: Final = frozenset(
    {
        ErrorCode.UNAUTHENTICATED.value,
        ErrorCode.FORBIDDEN.value,
        ErrorCode.BAD_REQUEST.value,
        ErrorCode.UNKNOWN_OP.value,
        ErrorCode.INTERNAL.value,
        ErrorCode.UNKNOWN.value,
        ErrorCode.TLS_REQUIRED.value,
        ErrorCode.TLS_FAILED.value,
    }
)
# Reads without a timestamp that answer from the node's applied state (STATE_FLOOR_OPS) get the
# client's read floor (`read_floor_ts`) as `min_ts` on nodes that advertise `read_floor` in their
# hello, unless they read AS OF a timestamp; these two take `min_ts` from every release.
_FILES_OPS: Final = frozenset({"files", "files_multi"})
_READ_OPS: Final = frozenset(
    {
        "committed_txn",
        "read_ts",
        "schema_at",
        "describe",
        "history",
        "list_namespaces",
        "list_tables",
        "safe_time",
        "status",
        "files",
        "files_multi",
        "compaction_view",
        "txn_log",
        "session_list",
        "lease_list",
        "lease_blockers",
        "pts_list",
        "pts_show",
        "gc_status",
        "job_list",
        "job_show",
        "watch",
        "apply_version",
        "cert_revoked",
    }
)
# Writes the server makes idempotent by their arguments (re-opening a session with the same
# info, re-acquiring a held lease, releasing a released one, closing a closed session).
_IDEMPOTENT_OPS: Final = frozenset(
    {
        "pin",
        "session_open",
        "session_heartbeat",
        "session_close",
        "lease_acquire",
        "lease_release",
        "compact_manifest",  # a repeat finds its manifests referenced: deduplicated
        "apply_version_finalize",  # a repeat finds the version already moved: no change
        # A GC run decides afresh from the state each time (thresholds only move forward,
        # deletions only of files queued and unreferenced, compactions by compare-and-swap): a
        # repeat after an unknown outcome (its proposal dropped in a leader change) is one
        # more run.
        "gc_run",
    }
)
# A DDL refused because leases block it (SCHEMA_CHANGE_BLOCKED) is retried this often, for at
# most DDL_WAIT_MS_DEFAULT unless the caller says otherwise (`metastore sql --wait`).
DDL_WAIT_MS_DEFAULT: Final = 5 * 60 * 1000
# What the client's own errors tell their reader to do (`_outcome_hint`): when no node answered,
# and, for membership changes whose outcome is unknown, where to look.
CHECK_CLUSTER_HINT: Final = (
    "check that the cluster is up and has a leader: `metastore cluster status`"
)
# A reply the protocol does not allow: the node's release is at fault, not the request.
_NODE_BUG_HINT: Final = (
    "a bug in that node's release (report it with the node's log and `metastore cluster "
    "status`); other nodes may answer"
)
# A closed client fails every call the same way (its UNAVAILABLE is retryable, for the cluster,
# not for this object).
_CLOSED_MESSAGE: Final = "the client is closed (close() or aclose() was called): make a new client"
_MEMBERSHIP_OPS: Final = frozenset({"add_node", "promote_node", "remove_node", "transfer_leader"})
MEMBERSHIP_OUTCOME_HINT: Final = (
    "check with `metastore cluster status` (leader, voters, learners) whether it happened "
    "before repeating it"
)
DDL_BLOCKED_RETRY_MS: Final = 500

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointResult:
    """One endpoint's answer in `status_all()` / `safe_time_all()`: a result or an error."""

    endpoint: str
    result: dict[str, Any] | None = None
    error: MetastoreError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) -> (host, port); InvalidArgumentError otherwise."""
    if not isinstance(endpoint, str) or not 0 < len(endpoint) <= ENDPOINT_CHARS_MAX:
        raise InvalidArgumentError(f"endpoint {endpoint!r} is not a host:port string")
    text = endpoint.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    bare_v6 = ":" in host and not text.startswith("[")
    if not sep or not host or bare_v6:
        raise InvalidArgumentError(f"endpoint {endpoint!r} is not host:port (IPv6: [addr]:port)")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65_535:
        raise InvalidArgumentError(f"endpoint {endpoint!r} has no valid port (1..65535)")
    return host, int(port_text)


# ---- internal failure signals ----------------------------------------------------------------


class _EndpointFailure(Exception):
    """This endpoint could not answer (connection level). `sent`: the request may have reached
    the node (so its outcome is unknown)."""

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


class _ConnectionClosed(Exception):
    pass


class _SendMark:
    """How far one attempt of a call got, for the call's deadline: a write cut before its
    request was handed to a transport was not sent, so it was not applied (anywhere, ever),
    and the call says so instead of "outcome unknown" (NotAppliedTimeoutError)."""

    __slots__ = ("stage",)

    def __init__(self) -> None:
        # "connecting" (TCP connect, TLS, hello) -> "sending" (connected) -> "waiting for a
        # free slot" (every in-flight slot of the connection taken) -> "sent" (handed to the
        # transport). Only "sent" may have reached a node.
        self.stage = "connecting"

    @property
    def sent(self) -> bool:
        return self.stage == "sent"


# ---- one connection --------------------------------------------------------------------------


class _Connection:
    """One authenticated connection to one node, shared by concurrent callers."""

    def __init__(
        self,
        endpoint: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_reply: Callable[[Mapping[str, Any]], None],
    ) -> None:
        self.endpoint = endpoint
        self._reader = reader
        self._writer = writer
        self._on_reply = on_reply
        # A compromised or buggy node must not make us decode a frame of tiny items whatever
        # it costs: past the budget the reply is a protocol error (the connection closes).
        self._decoder = FrameDecoder(CLIENT_FRAME_BYTES_MAX, max_items=CLIENT_REPLY_ITEMS_MAX)
        # Invariant: every id in _pending has a caller awaiting its future.
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 1
        self._slots = asyncio.Semaphore(CLIENT_INFLIGHT_PER_CONNECTION_MAX)
        # Requests sent whose caller gave up before the answer: the node still counts them in
        # flight, so each keeps its slot until its answer arrives (or the connection closes).
        self._abandoned: set[int] = set()
        self.closed_reason: str | None = None
        # Bytes read from the node so far: a connection still receiving is alive (_answers).
        self.received_bytes = 0
        # A TLS alert after the handshake (the node refused our client certificate).
        self.tls_error: ssl.SSLError | None = None
        self.hello: dict[str, Any] = {}
        self._loop = asyncio.get_running_loop()
        self._read_task = self._loop.create_task(
            self._read_loop(), name=f"metastore-client-read-{endpoint}"
        )

    @property
    def is_open(self) -> bool:
        return self.closed_reason is None

    async def request(
        self,
        op: str,
        args: Mapping[str, Any],
        *,
        probe: bool = False,
        mark: _SendMark | None = None,
    ) -> dict[str, Any]:
        """Send one request and return its raw reply map. Raises _EndpointFailure when the
        connection fails (`sent` says whether the request may have gone out). A `probe` (the
        liveness check of _attempt) takes no slot: it must not wait behind the very requests
        it checks on (with every slot held by slow requests it could never be sent, and a
        live connection would be taken for dead). Over the node's own limit it is answered
        LIMIT_EXCEEDED, which still proves the node alive. `mark` is told when the request
        waits for a slot and when it is handed to the transport."""
        if probe:
            return await self._send(op, args, slot=False, mark=mark)
        if mark is not None and self._slots.locked():
            mark.stage = "waiting for a free slot"
        await self._slots.acquire()
        return await self._send(op, args, slot=True, mark=mark)

    async def _send(
        self, op: str, args: Mapping[str, Any], *, slot: bool, mark: _SendMark | None = None
    ) -> dict[str, Any]:
        """`slot`: the caller holds one of `_slots`, which this gives back (at once, or once
        the node answered a request its caller gave up on: see `_abandoned`)."""
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        sent = False
        try:
            if self.closed_reason is not None:
                raise _EndpointFailure(self.closed_reason, sent=False)
            frame = _encode_request(request_id, op, args)
            self._pending[request_id] = future
            try:
                self._writer.write(frame)
            except (OSError, RuntimeError) as exc:
                # A transport refuses a write before it buffers any of it (uvloop on a
                # transport the node already closed, before the read loop has seen the end of
                # the stream; asyncio after write_eof): nothing of it left, so the request may
                # go to another node, even a write that is not repeatable.
                self._pending.pop(request_id, None)  # nobody awaits it: no stray exception
                self.close(f"send failed: {_describe_os_error(exc)}")
                raise _EndpointFailure(self.closed_reason or "send failed", sent=False) from None
            # Handed to the transport: from here on the node may get it and run it.
            sent = True
            if mark is not None:
                mark.stage = "sent"
            try:
                await self._writer.drain()
            except (OSError, RuntimeError) as exc:
                self._pending.pop(request_id, None)
                self.close(f"send failed: {_describe_os_error(exc)}")
                raise _EndpointFailure(self.closed_reason or "send failed", sent=True) from None
            try:
                return await future
            except _ConnectionClosed as exc:
                raise _EndpointFailure(str(exc), sent=True) from None
        finally:
            self._pending.pop(request_id, None)
            if slot:
                answered = future.done() and not future.cancelled()
                if sent and not answered and self.closed_reason is None:
                    # Its caller gave up (cancelled: a timeout, a task cancelled) but the node
                    # still runs it: freed now, the slot let a request out past the node's
                    # bound, which it refused (LIMIT_EXCEEDED). Freed by its answer instead.
                    self._abandoned.add(request_id)
                else:
                    self._slots.release()

    async def _read_loop(self) -> None:
        reason = "connection closed by the node"
        try:
            while True:
                data = await self._reader.read(READ_CHUNK_BYTES)
                if not data:
                    break
                self.received_bytes += len(data)
                self._decoder.feed(data)
                while (obj := self._decoder.next_frame()) is not NEED_DATA:
                    self._dispatch(obj)
        except (OSError, RaftError, _ProtocolViolation) as exc:
            if isinstance(exc, ssl.SSLError):
                self.tls_error = exc
            reason = (
                _describe_os_error(exc) if isinstance(exc, OSError) else f"protocol error: {exc}"
            )
        except asyncio.CancelledError:
            reason = "connection closed by the client"
            self.close(reason)
            raise
        self.close(reason)

    def _dispatch(self, obj: object) -> None:
        if not isinstance(obj, dict):
            raise _ProtocolViolation(f"reply is {type(obj).__name__}, not a map")
        reply_id = obj.get("id")
        if not isinstance(reply_id, int) or isinstance(reply_id, bool):
            raise _ProtocolViolation("reply without an integer id")
        if not isinstance(obj.get("ok"), bool):
            raise _ProtocolViolation(f"reply {reply_id} without a boolean 'ok'")
        self._on_reply(obj)
        if reply_id in self._abandoned:
            self._abandoned.discard(reply_id)
            self._slots.release()
        future = self._pending.get(reply_id)
        if future is not None and not future.done():
            future.set_result(obj)
        elif reply_id == 0 and obj.get("ok") is False:
            # A reply to no request (the server could not read one): its error ends the
            # connection for everyone waiting on it.
            raise _ProtocolViolation(_error_text(obj.get("error")))
        # Otherwise: a late reply to a request whose caller timed out. Dropped.

    def close(self, reason: str) -> None:
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(_ConnectionClosed(reason))
        self._pending.clear()
        for _ in self._abandoned:
            self._slots.release()  # no answer will come: callers waiting for a slot go on
        self._abandoned.clear()
        self._writer.close()
        if self._read_task is not asyncio.current_task():
            self._read_task.cancel()

    def close_from_any_thread(self, reason: str) -> None:
        """`close`, from whatever thread (a finalizer): in the connection's loop, if it runs.

        A loop that does not run (stopped, or closed without cancelling our read task) would
        never run a close queued on it, and the node would keep the connection until its idle
        timeout: the socket is then shut down from here (the loop's transport still owns the
        descriptor and closes it, should the loop run again or the transport be collected)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self.close(reason)
            return
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self.close, reason)
        if self._loop.is_closed() or not self._loop.is_running():
            self._shut_down_socket()

    def _shut_down_socket(self) -> None:
        """End the connection for the node (a FIN) without closing the descriptor, which the
        transport owns: shut down through a duplicate, so no other thread's descriptor of the
        same number can be hit."""
        transport_socket = self._writer.get_extra_info("socket")
        if transport_socket is None:
            return
        with contextlib.suppress(OSError, ValueError):
            fd = transport_socket.fileno()
            if fd < 0:
                return  # closed already
            with socket.socket(fileno=os.dup(fd)) as duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._read_task
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()


def _weak_callback(
    method: Callable[[Mapping[str, Any]], None],
) -> Callable[[Mapping[str, Any]], None]:
    """`method` (a bound method) called through a weak reference to its object: a no-op once
    the object is gone."""
    weak_method = weakref.WeakMethod(method)

    def call(reply: Mapping[str, Any]) -> None:
        target = weak_method()
        if target is not None:
            target(reply)

    return call


def _release_unclosed_client(endpoints: list[str], connections: dict[str, _Connection]) -> None:
    """The finalizer of a MetastoreClient dropped (or left at exit) without `aclose()`: close
    its connections in their loop (a collection may run in another thread, or after the
    loop closed, when there is nothing left to close)."""
    open_connections = [conn for conn in connections.values() if conn.is_open]
    connections.clear()
    if not open_connections:
        return
    warnings.warn(
        f"unclosed MetastoreClient of {', '.join(endpoints)}: await aclose() or use it as an "
        "async context manager",
        ResourceWarning,
        stacklevel=2,
    )
    for conn in open_connections:
        conn.close_from_any_thread("client dropped without aclose()")


class _ProtocolViolation(Exception):
    """The node sent something the protocol does not allow; the connection is dropped."""


def _encode_request(request_id: int, op: str, args: Mapping[str, Any]) -> bytes:
    try:
        return encode_frame(
            {"id": request_id, "op": op, "args": dict(args)}, max_frame_bytes=CLIENT_FRAME_BYTES_MAX
        )
    except FrameTooLargeError as exc:
        raise LimitExceededError(
            f"{op} request is too large: {exc}; split it into smaller requests (a commit: "
            "fewer files or tables per commit)",
            details={"limit": "CLIENT_FRAME_BYTES_MAX", "max": CLIENT_FRAME_BYTES_MAX},
        ) from None
    except FrameEncodeError as exc:
        raise InvalidArgumentError(f"{op} arguments cannot be sent: {exc}") from None


# OpenSSL's reasons when the other side answered a ClientHello with something that is not TLS.
_NOT_TLS_REASONS: Final = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNEXPECTED_EOF_WHILE_READING"}
)


def _tls_server_name(tls: ClientTls | None, host: str) -> str | None:
    if tls is None:
        return None
    return tls.server_name or host


def _tls_failed(endpoint: str, exc: ssl.SSLError) -> TlsFailedError:
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = (
            f"its TLS certificate is not trusted ({exc.verify_message}): pass the CA that "
            "signed the nodes' certificates (--cacert / METASTORE_CACERT)"
        )
    elif exc.reason in (
        "WRONG_VERSION_NUMBER",
        "RECORD_LAYER_FAILURE",
        "UNEXPECTED_EOF_WHILE_READING",
    ):
        why = "it does not speak TLS on this port (a plaintext node? drop --cacert)"
    elif exc.reason and "CERTIFICATE_REQUIRED" in exc.reason:
        why = "it requires a client certificate (--cert and --key)"
    else:
        why = f"TLS handshake failed: {exc.reason or exc}"
    return TlsFailedError(
        f"node {endpoint}: {why}", details={"endpoint": endpoint, "tls_reason": str(exc.reason)}
    )


def _describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def _error_text(wire: object) -> str:
    if isinstance(wire, Mapping):
        return f"{wire.get('code')}: {wire.get('message')}"
    return "malformed error"


# ---- the client ------------------------------------------------------------------------------


class MetastoreClient:
    """Asynchronous client of a metastore cluster. See the module docstring.

    `endpoints`: every node's client address (`host:port`), tried in order of preference.
    `token`: the bearer token (its role decides which ops are allowed). `timeout_ms`: the
    default time for one call including retries. `clock`: the HLC fed with every reply's `ts`
    (a private `HybridClock(SystemClock())` when None).
    """

    def __init__(
        self,
        endpoints: list[str],
        token: str | None,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        clock: HybridClock | None = None,
        client_name: str = CLIENT_NAME_DEFAULT,
        tls: ClientTls | None = None,
    ) -> None:
        """`tls`: connect to client ports over TLS (None: plaintext)."""
        if isinstance(endpoints, str):
            # METASTORE_ENDPOINTS as is: say so, rather than "none given" or one per character.
            raise InvalidArgumentError(
                f"endpoints: a list of host:port strings, not one str ({endpoints[:80]!r}); "
                "split a comma-separated list such as METASTORE_ENDPOINTS first"
            )
        if not isinstance(endpoints, list | tuple) or not endpoints:
            raise InvalidArgumentError("at least one endpoint (host:port) is needed")
        if len(endpoints) > ENDPOINTS_MAX:
            raise InvalidArgumentError(
                f"{len(endpoints)} endpoints; at most ENDPOINTS_MAX={ENDPOINTS_MAX}"
            )
        for endpoint in endpoints:
            parse_endpoint(endpoint)
        if len(set(endpoints)) != len(endpoints):
            raise InvalidArgumentError(f"endpoints are listed twice: {list(endpoints)}")
        self.endpoints: list[str] = list(endpoints)
        # A token is one word (secrets.read_token_file); `open(token_file).read()` keeps the
        # file's newline, which the node would refuse as an unknown token.
        self.token = token.strip() if isinstance(token, str) else token
        self.timeout_ms = _check_timeout("timeout_ms", timeout_ms)
        self.clock = clock if clock is not None else HybridClock(SystemClock())
        self.client_name = f"{client_name} pid={os.getpid()}"
        self._connections: dict[str, _Connection] = {}
        self._connect_locks: dict[str, asyncio.Lock] = {}
        # Node ids learnt from `hello`, to follow a NOT_LEADER hint to the right endpoint.
        self._endpoint_by_node: dict[int, str] = {}
        # Index into endpoints of the node to try first: the last one that answered.
        self._preferred = 0
        self._rng = random.Random()  # backoff jitter only
        self._closed = False
        # Read-your-writes and monotonic reads (session guarantees), for the whole process:
        # the positions live in metastore.client.floors, one set per cluster id, shared with
        # every other client of this process talking to that cluster (see `own_writes_ts`,
        # `read_floor_ts`, `schema_floor_ts`, `_with_floor` and `_note_read_position`). These
        # private ones serve only nodes whose hello names no cluster.
        self._private_floors = ReadFloors()
        # The cluster id of the newest hello: whose floors this client's own properties and
        # `pin`'s Top mean (a client's endpoints are one cluster's nodes).
        self._cluster_id: str | None = None
        self.tls = tls
        try:
            self._ssl = tls.context() if tls is not None else None
        except TlsConfigError as exc:
            raise TlsFailedError(f"TLS options: {exc}") from None
        # Dropped without `aclose()`: warn (as an unclosed file does) and close the
        # connections, whose read tasks would otherwise be destroyed while pending.
        self._finalizer = weakref.finalize(
            self, _release_unclosed_client, self.endpoints, self._connections
        )

    # ---- read floors (shared by the process's clients of one cluster) -----------------------

    @property
    def cluster_id(self) -> str | None:
        """The cluster id the nodes' hello named (None before a node answered, or if none)."""
        return self._cluster_id

    @property
    def own_writes_ts(self) -> int:
        """The newest timestamp at which a write of this process to this cluster is visible (a
        commit's ts, a DDL's Tu, a `read_ts`), by this client or another of the process:
        `files` without `as_of` asks the node to read at least there, so a listing never
        misses such a commit or a table just created."""
        return self._floors_of(self._cluster_id).own_writes_ts

    @property
    def read_floor_ts(self) -> int:
        """The newest safe time a read of the applied state without a timestamp (a listing,
        `describe`, `files` without `as_of`) of a client of this process answered at."""
        return self._floors_of(self._cluster_id).read_floor_ts

    @property
    def schema_floor_ts(self) -> int:
        """The newest "now" a `schema_at`/`pin` without a timestamp of a client of this
        process answered at (it decides which schema version is in force)."""
        return self._floors_of(self._cluster_id).schema_floor_ts

    async def _learn_cluster(self) -> None:
        """Connect (`hello`) to a node, unless one answered already, so that the process's
        floors of its cluster are known before a request that needs them is built (`pin`'s
        Top). Nodes that cannot be reached are left to the call itself to report, within this
        client's timeout."""
        if self._cluster_id is not None or self._closed:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout_ms / 1000):
                for endpoint in (
                    self.endpoints[self._preferred :] + self.endpoints[: self._preferred]
                ):
                    try:
                        await self._connection(endpoint)
                        return
                    except _EndpointFailure:
                        continue

    def _floors_of(self, cluster_id: object) -> ReadFloors:
        """The floors of the cluster `cluster_id` (a node's hello says it), shared by the
        process; this client's own for a node that names no cluster."""
        if isinstance(cluster_id, str) and cluster_id:
            return shared_floors(cluster_id)
        return self._private_floors

    # ---- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close every connection. Calls after this raise UnavailableError."""
        self._closed = True
        self._finalizer.detach()
        connections = list(self._connections.values())
        self._connections.clear()
        for conn in connections:
            conn.close("client closed")
        for conn in connections:
            await conn.wait_closed()

    async def __aenter__(self) -> MetastoreClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- ops ---------------------------------------------------------------------------------

    async def schema_at(
        self, table: str, ts: int | None = None, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """The schema of `table` in force at `ts` (default: the node's now). `timeout_ms` bounds
        the node's wait for safe time (protocol default 5000, max 60000)."""
        args: dict[str, Any] = {"table": table}
        if ts is not None:
            args["ts"] = ts
        server_wait_ms = REQUEST_TIMEOUT_MS_DEFAULT
        if timeout_ms is not None:
            # Always sent: `schema_at` took `timeout_ms` from its first release (only the
            # membership ops leave out their 10 s default, for older daemons).
            server_wait_ms = _check_timeout("timeout_ms", timeout_ms, REQUEST_TIMEOUT_MS_MAX)
            args["timeout_ms"] = timeout_ms
        call_timeout_ms = max(self.timeout_ms, server_wait_ms + SERVER_WAIT_MARGIN_MS)
        return await self.call("schema_at", args, timeout_ms=call_timeout_ms)

    async def files(
        self, table: str, as_of: int | None = None, *, expand: bool = True
    ) -> dict[str, Any]:
        """The files live in `table` at `as_of` (default: the node's safe time, once it reached
        `own_writes_ts`, so this client's own commits and DDL are seen), with the table's
        location and the schema version in force then. Follows the server's pages (every page
        is of the same `as_of`), so `files` holds the whole listing however large. With
        `expand` (default) the table's manifests are read here (sha256-checked) and their live
        entries merged into `files`; without it the reply keeps `manifests` and `deletes` for
        the caller to expand (metastore.client.manifest_files)."""
        args: dict[str, Any] = {"table": table, "limit": FILES_PAGE_LIMIT}
        if as_of is not None:
            args["as_of"] = as_of
        # Without `as_of`, `call` sends the newest of `own_writes_ts` and `read_floor_ts` (the
        # process's, for the answering node's cluster) as `min_ts` (`_with_floor`).
        out = await self._files_pages(await self.call("files", args))
        if expand and out.get("manifests"):
            from metastore.client.manifest_files import expand_reply

            out = await asyncio.to_thread(expand_reply, out)
        if "next_page_token" in out:
            out["next_page_token"] = None  # the caller has every page
        return out

    async def _files_pages(self, first: dict[str, Any]) -> dict[str, Any]:
        """A `files` listing from its first page (of `files` or `files_multi`) with every
        later page's files and delete entries appended. A compaction between two pages changes
        the listing's shape (MANIFEST_CONFLICT on the next page): it is listed again from the
        first page at the same as_of, up to LISTING_ATTEMPTS_MAX times."""
        table = first["table"]
        for attempt in range(1, LISTING_ATTEMPTS_MAX + 1):
            files = list(first.get("files", []))
            deletes = list(first.get("deletes", []))
            # Manifest references ride on a listing's first page: that of `files_multi`, or
            # the `files` page at offset 0 when `files_multi` had no room for them.
            manifests = list(first.get("manifests") or [])
            token = first.get("next_page_token")
            try:
                for _ in range(PAGES_MAX):
                    if not token:
                        break
                    page = await self.call(
                        "files", {"table": table, "limit": FILES_PAGE_LIMIT, "page_token": token}
                    )
                    files.extend(page.get("files", []))
                    deletes.extend(page.get("deletes", []))
                    manifests.extend(page.get("manifests") or [])
                    token = page.get("next_page_token")
            except ManifestConflictError:
                if attempt == LISTING_ATTEMPTS_MAX:
                    raise
                args = {"table": table, "limit": FILES_PAGE_LIMIT, "as_of": first["as_of"]}
                first = await self.call("files", args)
                continue
            if token:
                raise LimitExceededError(
                    f"files of {table}: more than {PAGES_MAX} pages",
                    details={"op": "files", "table": table},
                )
            out = {**first, "files": files}
            if "next_page_token" in out:
                out["next_page_token"] = None  # the caller has every page
            if deletes or "deletes" in first:  # a reply without delete entries stays as it came
                out["deletes"] = deletes
            if manifests or "manifests" in first:
                out["manifests"] = manifests
            return out
        raise AssertionError("unreachable")  # pragma: no cover

    async def files_multi(
        self, tables: list[str], as_of: int | None = None, *, expand: bool = True
    ) -> dict[str, Any]:
        """`files` of several tables at one `as_of` (default as for `files`) in one
        request; a table whose listing did not fit that reply is continued with `files` pages
        of the same moment. Returns `as_of`, `waited_ms` and `listings`: one complete listing
        per table, in the order asked (each shaped like a `files` result), or `{table, error}`
        for a table that could not be listed (`MetastoreError.from_wire(error)` rebuilds it).
        Manifests are expanded as by `files` (`expand`)."""
        args: dict[str, Any] = {"tables": _names("tables", tables), "limit": FILES_PAGE_LIMIT}
        if as_of is not None:
            args["as_of"] = as_of
        first = await self.call("files_multi", args)
        listings = []
        for listing in first.get("listings", []):
            if "error" in listing:
                listings.append(listing)  # that table's typed error, as data
                continue
            done = await self._files_pages(listing)
            if expand and done.get("manifests"):
                from metastore.client.manifest_files import expand_reply

                done = await asyncio.to_thread(expand_reply, done)
            listings.append(done)
        return {**first, "listings": listings}

    async def read_ts(self) -> int:
        """A timestamp at or above everything the cluster acknowledged before this call (every
        commit, from any process), asked of the leader after a ReadIndex. It also becomes this
        process's `own_writes_ts` (`call` raises it), so the next `files` without `as_of` of any
        of its clients sees all of it, on any node: a linearizable listing for the price of one
        more round trip."""
        reply = await self.call("read_ts", {})
        ts = reply.get("ts")
        if not isinstance(ts, int) or isinstance(ts, bool) or not 0 <= ts <= MAX_TS:
            raise UnavailableError(f"malformed reply: read_ts gave ts {ts!r}; {_NODE_BUG_HINT}")
        return ts

    async def committed_txn(self, txn_id: str, *, stream: str | None = None) -> dict[str, Any]:
        """The commit record of `txn_id` (`txn`, None if it never committed or is older than the
        remembered window, whose oldest commit ts comes back too) and, with `stream`, that
        stream's high-water mark (`stream_mark`: seq, ts, txn_id; None if it never committed a
        position). Linearizable: a commit this client saw acknowledged is never reported
        missing."""
        args: dict[str, Any] = {"txn_id": txn_id}
        if stream is not None:
            args["stream"] = stream
        return await self.call("committed_txn", args)

    # --- sessions and schema leases (metastore.leases) ---

    async def session_open(
        self,
        session_id: str,
        *,
        app_id: str = "",
        app_name: str = "",
        host: str = "",
        user: str = "",
        pid: int = 0,
        started_at_ms: int = 0,
        ttl_ms: int | None = None,
    ) -> dict[str, Any]:
        """Open session `session_id` (client-chosen, e.g. a uuid4 hex). The reply carries its
        `deadline_tm` and the `heartbeat_ms` to keep it alive with `session_heartbeat`."""
        args: dict[str, Any] = {
            "session_id": session_id,
            "app_id": app_id,
            "app_name": app_name,
            "host": host,
            "user": user,
            "pid": pid,
            "started_at_ms": started_at_ms,
        }
        if ttl_ms is not None:
            args["ttl_ms"] = ttl_ms
        return await self.call("session_open", args)

    async def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return await self.call("session_heartbeat", {"session_id": session_id})

    async def session_close(self, session_id: str) -> dict[str, Any]:
        return await self.call("session_close", {"session_id": session_id})

    async def session_expire(self, session_ids: list[str]) -> dict[str, Any]:
        """Admin: end sessions now (their leases stop blocking schema changes)."""
        return await self.call(
            "session_expire", {"session_ids": _names("session_ids", session_ids)}
        )

    async def _all_pages(
        self, op: str, args: dict[str, Any], lists: tuple[str, ...]
    ) -> dict[str, Any]:
        """Call a keyset-paged op (session_list, lease_list, lease_blockers, gc_status) until
        its last page, concatenating the `lists` of every page; other fields come from the
        last page (for `session_list`, `ended` is only on the last one)."""
        page = await self.call(op, args)
        merged = {key: list(page.get(key, [])) for key in lists}
        for _ in range(PAGES_MAX):
            token = page.get("next_page_token")
            if not token:
                return {**page, **merged, "next_page_token": None}
            page = await self.call(op, {**args, "page_token": token})
            for key in lists:
                merged[key].extend(page.get(key, []))
        raise LimitExceededError(f"{op}: more than {PAGES_MAX} pages", details={"op": op})

    async def session_list(self, *, include_ended: bool = False) -> dict[str, Any]:
        """Every session (following the server's pages); with `include_ended`, recently
        ended ones too."""
        args = {"all": include_ended, "limit": SESSION_PAGE_LIMIT}
        return await self._all_pages("session_list", args, ("sessions",))

    async def lease_acquire(
        self, session_id: str, leases: list[dict[str, Any]], read_ts: int | None = None
    ) -> dict[str, Any]:
        """Lease [{table, table_id, version}, ...] for the session (a heartbeat too); with
        `read_ts`, the leases keep GC below reads of those tables at it."""
        args: dict[str, Any] = {"session_id": session_id, "leases": leases}
        if read_ts is not None:
            args["read_ts"] = read_ts
        return await self.call("lease_acquire", args)

    async def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        """Release the leases; with `known_tm` (the `lease_tm` of the newest answered `pin`),
        those a later entry touched (a pin that crossed this release) are kept (`kept`)."""
        args: dict[str, Any] = {"session_id": session_id, "leases": leases}
        if known_tm is not None:
            args["known_tm"] = known_tm
        return await self.call("lease_release", args)

    async def lease_list(self, table: str | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {"limit": LEASE_PAGE_LIMIT}
        if table is not None:
            args["table"] = table
        return await self._all_pages("lease_list", args, ("leases",))

    async def lease_blockers(self, table: str) -> dict[str, Any]:
        """The sessions that would block publishing `table`'s next schema version now."""
        args = {"table": table, "limit": LEASE_PAGE_LIMIT}
        return await self._all_pages("lease_blockers", args, ("blockers",))

    # --- protected timestamps and GC (metastore.gc) ---

    async def protect(
        self,
        ts: int,
        *,
        tables: list[str] | None = None,
        namespaces: list[str] | None = None,
        cluster: bool = False,
        meta_type: str = "",
        meta: str = "",
        max_age_ms: int | None = None,
        session_id: str | None = None,
        record_id: str | None = None,
    ) -> dict[str, Any]:
        """Protect every read at >= `ts` of the targets from GC until released. Once this
        returns the protection holds (a ts already at or below a target's GC threshold is
        refused with BEFORE_GC_THRESHOLD; one more than PROTECT_AHEAD_MS_MAX ahead of this
        client's clock is refused here, before any request: refuse_protection_ahead). The
        record id is chosen here, so the call is repeated (on another node too) after a lost
        reply or an unknown outcome and finds the same record instead of making a second one."""
        refuse_protection_ahead(ts, now_ms=self.clock.physical_now_ms())
        args: dict[str, Any] = {
            "record_id": record_id or uuid.uuid4().hex,
            "ts": ts,
            "tables": _names("tables", tables or []),
            "namespaces": _names("namespaces", namespaces or []),
            "cluster": cluster,
            "meta_type": meta_type,
            "meta": meta,
        }
        if max_age_ms is not None:
            args["max_age_ms"] = max_age_ms
        if session_id is not None:
            args["session_id"] = session_id
        return await self.call("pts_protect", args)

    async def release_protection(self, record_id: str) -> dict[str, Any]:
        return await self.call("pts_release", {"record_id": record_id})

    async def protections(self, *, include_released: bool = False) -> dict[str, Any]:
        """Every protection record (and released ones), following the server's pages."""
        args: dict[str, Any] = {"all": include_released, "limit": PTS_PAGE_LIMIT}
        first = await self.call("pts_list", args)
        records = list(first.get("records", []))
        released = list(first.get("released", []))
        token = first.get("next_page_token")
        while token:
            page = await self.call("pts_list", {**args, "page_token": token})
            records.extend(page.get("records", []))
            released.extend(page.get("released", []))
            token = page.get("next_page_token")
        out = {**first, "records": records, "next_page_token": None}
        if include_released:
            out["released"] = released
        return out

    async def protection(self, record_id: str) -> dict[str, Any]:
        return await self.call("pts_show", {"record_id": record_id})

    async def gc_status(self, table: str | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {"limit": GC_STATUS_PAGE_LIMIT}
        if table is not None:
            args["table"] = table
        return await self._all_pages("gc_status", args, ("tables",))

    # ---- the change feed (metastore.events) ----

    async def watch(
        self,
        from_ts: int | None = None,
        *,
        table: str | None = None,
        namespace: str | None = None,
        limit: int | None = None,
        wait_ms: int = 0,
        from_event: int = 0,
    ) -> dict[str, Any]:
        """One page of catalog events after `from_ts` (an entry Tm; None: from now), waiting
        up to `wait_ms` for the first one. Continue from the reply's `next_from_ts` and
        `next_from_event` (`from_event`: where inside the entry at `from_ts` a page too large
        for one reply ended; 0 otherwise)."""
        optional = {"from_ts": from_ts, "table": table, "namespace": namespace, "limit": limit}
        args: dict[str, Any] = {k: v for k, v in optional.items() if v is not None}
        if from_event:
            args["from_event"] = from_event
        args["wait_ms"] = wait_ms
        try:
            return await self.call("watch", args, timeout_ms=wait_ms + self.timeout_ms)
        except WatchStartCompactedError as compacted:
            # Each node keeps its own window of events (a node restarted from a snapshot keeps
            # none before it): another node may still have them. Ask each other node once
            # before the caller has to re-read the state.
            for endpoint in self.endpoints:
                with contextlib.suppress(MetastoreError):
                    result = await self.call(
                        "watch", args, endpoint, timeout_ms=wait_ms + self.timeout_ms
                    )
                    self._preferred = self.endpoints.index(endpoint)
                    return result
            raise compacted

    async def watch_events(
        self,
        from_ts: int | None = None,
        *,
        table: str | None = None,
        namespace: str | None = None,
        wait_ms: int = WATCH_WAIT_MS,
        from_event: int = 0,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every event after `from_ts`, as they happen (long polls; resumes on another node
        after a failover from the last event seen). Ends only when the caller stops. To
        continue later right after an event handled (one of several of its entry too):
        `from_ts=event["tm"], from_event=event["event"] + 1`."""
        position = from_ts
        while True:
            page = await self.watch(
                position, table=table, namespace=namespace, wait_ms=wait_ms, from_event=from_event
            )
            for event in page["events"]:
                yield event
            position, from_event = page["next_from_ts"], page.get("next_from_event", 0)

    # ---- schema change jobs (metastore.jobs) ----

    async def job_list(self, table: str | None = None, *, all: bool = False) -> dict[str, Any]:
        """Running schema change jobs (with `all`, finished ones too), each with its step and
        what it waits for (`waiting_for`)."""
        args: dict[str, Any] = {"all": all, "limit": JOBS_PAGE_LIMIT}
        if table is not None:
            args["table"] = table
        return await self._all_pages("job_list", args, ("jobs",))

    async def job_show(self, job_id: int) -> dict[str, Any]:
        return await self.call("job_show", {"job_id": job_id})

    async def job_cancel(self, job_id: int, *, timeout_ms: int = 30_000) -> dict[str, Any]:
        """Roll a running job back to the table's last public shape (a new version)."""
        return await self.call(
            "job_cancel", {"job_id": job_id, "timeout_ms": timeout_ms}, timeout_ms=timeout_ms + 5000
        )

    async def job_backfilled(
        self, job_id: int, *, snapshot_ts: int, files_rewritten: int
    ) -> dict[str, Any]:
        """Report a finished backfill: every file live at `snapshot_ts` that lacked the job's
        column was rewritten and committed. BACKFILL_INCOMPLETE (retryable): run it again."""
        return await self.call(
            "job_backfilled",
            {"job_id": job_id, "snapshot_ts": snapshot_ts, "files_rewritten": files_rewritten},
        )

    async def gc_run(
        self, table: str | None = None, *, dry_run: bool = False, timeout_ms: int = 60_000
    ) -> dict[str, Any]:
        """Run the GC now on the leader (or, with dry_run, report what it would delete). A run
        that outlasts `timeout_ms` (at most 60 s) goes on on the leader; `gc_status` shows
        its result once it is done, and any part it did not finish is resumed by the next."""
        args: dict[str, Any] = {"dry_run": dry_run, "timeout_ms": timeout_ms}
        if table is not None:
            args["table"] = table
        # A run that stopped midway (its leader lost its lease or its leadership) answers with
        # what it deleted (`details.partial`) and is repeated elsewhere: the reply adds the
        # parts up (`earlier_parts`, `parts`), or says it cannot (`unanswered_parts`: an
        # attempt whose answer never came, or whose forward to the leader gave up waiting,
        # may have deleted files too).
        noted: list[tuple[MetastoreError, dict[str, int]]] = []
        unanswered = 0

        def note(error: MetastoreError | None) -> None:
            nonlocal unanswered
            if error is None:
                unanswered += 1
            elif (part := _gc_part(error.details.get("partial"))) is not None:
                noted.append((error, part))
            elif error.code is ErrorCode.TIMEOUT or error.details.get("outcome_unknown"):
                unanswered += 1  # a forward that gave up: that run may go on deleting

        try:
            result = await self.call("gc_run", args, timeout_ms=timeout_ms + 5_000, on_retry=note)
        except MetastoreError as exc:
            # The error raised tells its own part (`partial`); the earlier ones join it.
            others = [part for error, part in noted if error is not exc]
            if others:
                exc.details["earlier_parts"] = others
            raise
        earlier = [part for _, part in noted]
        if not earlier and not unanswered:
            return result
        out = dict(result)
        if earlier:
            for key in _GC_TOTALS:
                out[key] = int(out.get(key, 0)) + sum(part[key] for part in earlier)
            out["parts"] = 1 + len(earlier)
            out["earlier_parts"] = earlier
        if unanswered:
            out["unanswered_parts"] = unanswered
        return out

    async def pin(
        self,
        tables: list[str],
        ts: int | None = None,
        *,
        session_id: str | None = None,
        reads: list[str] | None = None,
        read_ts: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, Any]:
        """The schema in force at `ts` (default now) for each table, after one safe-time wait,
        and - with `session_id` - a lease on each pinned version, in one round trip. The
        leases of `reads` (default: every table) keep GC below the caller's reads: at `read_ts`,
        default the node's safe time (capped at `ts`), as the reply's `safe_time` says."""
        # Without `ts`: this client's now, and never below the newest now a schema read of
        # the process answered at (this client's HLC follows every reply's `ts`, but ignores
        # one too far ahead of its own clock, and sees no other client's replies). One Top for
        # every attempt: a repeated leasing pin must ask for what the first one did.
        if ts is None:
            await self._learn_cluster()
        floors = self._floors_of(self._cluster_id)
        top = max(self.clock.now(), floors.schema_floor_ts) if ts is None else ts
        args: dict[str, Any] = {"tables": _names("tables", tables), "ts": top}
        if session_id is not None:
            args["session_id"] = session_id
        if reads is not None:
            args["reads"] = _names("reads", reads)
        if read_ts is not None:
            args["read_ts"] = read_ts
        if timeout_ms is not None:
            args["timeout_ms"] = timeout_ms
        result = await self.call("pin", args)
        if ts is None:
            floors = self._floors_of(self._cluster_id)
            self._note_read_position(floors, "schema", result.get("ts"))
            self._note_read_position(floors, "state", result.get("safe_time"))
        return result

    async def txn_log(self, limit: int = 20) -> dict[str, Any]:
        """The `limit` most recent commits, newest first (following the server's pages: wide
        commits fill a page before `limit` does). Read-your-writes as `files` is: a node
        that has not applied up to `own_writes_ts` (the newest write, or `read_ts`, of a client
        of this process) waits first."""
        args: dict[str, Any] = {"limit": limit}
        if self.own_writes_ts:
            args["min_ts"] = self.own_writes_ts
        try:
            first = await self.call("txn_log", args)
        except BadRequestError as exc:
            if "min_ts" not in args or "min_ts" not in exc.message:
                raise
            # A node of an older release (rolling upgrade) knows no `min_ts`: the list it can
            # give is the one it has applied.
            del args["min_ts"]
            first = await self.call("txn_log", args)
        commits = list(first.get("commits", []))
        token = first.get("next_page_token")
        for _ in range(limit):  # each page holds at least one commit
            if not token or len(commits) >= limit:
                break
            args = {"limit": limit - len(commits), "page_token": token}
            page = await self.call("txn_log", args)
            commits.extend(page.get("commits", []))
            token = page.get("next_page_token")
        out = {**first, "commits": commits}
        if "next_page_token" in out:
            out["next_page_token"] = None  # the caller has every page
        return out

    async def commit(
        self,
        txn_id: str,
        writes: list[dict[str, Any]],
        *,
        ts: int | None = None,
        not_before: int | None = None,
        read_ts: int | None = None,
        read_tables: list[str] | None = None,
        stream: str | None = None,
        seq: int | None = None,
        mark_txn_id: bool = False,
    ) -> dict[str, Any]:
        """Commit `writes` (one per table) atomically; see docs/protocol.md. Retried safely:
        the server de-duplicates by `txn_id`. `stream` + `seq` (both or neither) make it a
        stream position: the server refuses any position at or below the stream's newest
        (BATCH_ALREADY_COMMITTED), however long ago that committed; streams starting with
        `@txn-id` are reserved (InvalidArgumentError).

        `mark_txn_id=True` (no `stream`): `txn_id` is the caller's own and may be committed
        again much later (a job run again): the commit also carries the id's mark
        (metastore.client.txn_marks), so it commits once even past the MAX_REMEMBERED_TXNS
        newest commits (until MAX_STREAM_MARKS other streams and ids committed since). The id
        is looked up first; found committed for the same tables (by the record, or past the
        window by the mark), or refused by the mark as such, the result is `{"txn_id", "ts"
        (the first commit's), "tables" (canonical, sorted), "deduplicated": true}`; found
        committed for other tables, TxnIdReusedError."""
        if stream is not None and is_reserved_stream(stream):
            raise InvalidArgumentError(
                f"stream {stream!r}: streams starting with {RESERVED_STREAM_PREFIX!r} are the "
                "marks of txn ids (metastore.client.txn_marks); name it otherwise",
                details={"stream": stream},
            )
        if mark_txn_id:
            if stream is not None or seq is not None:
                raise InvalidArgumentError("mark_txn_id and stream/seq exclude each other")
            tables = [str(w.get("table", "")) for w in writes]
            stream, seq = txn_mark(txn_id, tables)
            deduplicated = {
                "txn_id": txn_id,
                "tables": sorted({canonical_table(t) for t in tables}),
                "deduplicated": True,
            }
            # Looked up first: the mark refuses a commit of other tables only at or below
            # its seq (a hash of the table set), so that case is caught here.
            found = mark_verdict(
                (await self.committed_txn(txn_id, stream=stream)).get("stream_mark"),
                txn_id=txn_id,
                seq=seq,
            )
            if found is not None:
                return {**deduplicated, "ts": found}
        optional = {
            "ts": ts,
            "not_before": not_before,
            "read_ts": read_ts,
            "stream": stream,
            "seq": seq,
        }
        args: dict[str, Any] = {"txn_id": txn_id, "writes": writes}
        args.update({k: v for k, v in optional.items() if v is not None})
        if read_tables:
            args["read_tables"] = _names("read_tables", read_tables)
        if not mark_txn_id:
            return await self.call("commit", args)
        try:
            return await self.call("commit", args)
        except BatchAlreadyCommittedError as exc:
            # A run of this id committed since the lookup: the mark names it and its tables.
            found = mark_verdict(refused_mark(exc), txn_id=txn_id, seq=cast(int, seq))
            if found is None:
                raise
            return {**deduplicated, "ts": found}

    async def describe(self, table: str, as_of: int | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {"table": table}
        if as_of is not None:
            args["as_of"] = as_of
        return await self.call("describe", args)

    async def history(self, table: str) -> dict[str, Any]:
        """Every schema version of the live table, oldest first (following the pages)."""
        args = {"table": table, "limit": HISTORY_PAGE_LIMIT}
        return await self._all_pages("history", args, ("versions",))

    async def list_namespaces(self, as_of: int | None = None) -> dict[str, Any]:
        """The namespaces live now or existing at `as_of`, by name; follows the pages."""
        args: dict[str, Any] = {"limit": NAMESPACES_PAGE_LIMIT}
        if as_of is not None:
            args["as_of"] = as_of
        return await self._all_pages("list_namespaces", args, ("namespaces",))

    async def list_tables(
        self, namespace: str | None = None, as_of: int | None = None
    ) -> dict[str, Any]:
        """The tables of `namespace` (None: of every namespace), live now or existing at
        `as_of`, by full name; follows the server's pages."""
        args: dict[str, Any] = {"limit": TABLES_PAGE_LIMIT}
        if namespace is not None:
            args["namespace"] = namespace
        if as_of is not None:
            args["as_of"] = as_of
        return await self._all_pages("list_tables", args, ("tables",))

    async def safe_time(self, endpoint: str | None = None) -> dict[str, Any]:
        return await self.call("safe_time", {}, endpoint=endpoint)

    async def status(self, endpoint: str | None = None) -> dict[str, Any]:
        return await self.call("status", {}, endpoint=endpoint)

    async def ddl(
        self,
        sql: str,
        request_id: str | None = None,
        *,
        wait_ms: int = DDL_WAIT_MS_DEFAULT,
        on_blocked: Callable[[MetastoreError], None] | None = None,
    ) -> dict[str, Any]:
        """Run one Spark SQL DDL statement. Returns once the change is visible on every node.
        Retries reuse the request id (a new uuid4 unless given), so the change happens once.

        A change that would publish a third leased schema version (SCHEMA_CHANGE_BLOCKED: a
        running batch holds a lease on the version before the current one) waits for those
        leases to be released or to expire, for up to `wait_ms` (0: fail at once), calling
        `on_blocked(error)` with each refusal (its details list the blocking sessions)."""
        rid = request_id if request_id is not None else uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            try:
                return await self.call("ddl", {"sql": sql, "request_id": rid})
            except MetastoreError as exc:
                if exc.retryable:
                    # The outcome may be unknown: the caller retries with this id to get it
                    # applied exactly once.
                    exc.details.setdefault("request_id", rid)
                left_s = deadline - loop.time()
                if exc.code != ErrorCode.SCHEMA_CHANGE_BLOCKED or left_s <= 0:
                    raise
                if on_blocked is not None:
                    on_blocked(exc)
                await asyncio.sleep(min(DDL_BLOCKED_RETRY_MS / 1000, left_s))

    async def create_namespace(
        self,
        name: str,
        *,
        comment: str | None = None,
        if_not_exists: bool = False,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        sql = "CREATE NAMESPACE " + ("IF NOT EXISTS " if if_not_exists else "") + quote_ident(name)
        if comment is not None:
            sql += " COMMENT " + quote_string(comment)
        return await self.ddl(sql, request_id)

    async def drop_namespace(
        self,
        name: str,
        *,
        if_exists: bool = False,
        cascade: bool = False,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        sql = "DROP NAMESPACE " + ("IF EXISTS " if if_exists else "") + quote_ident(name)
        if cascade:
            sql += " CASCADE"
        return await self.ddl(sql, request_id)

    async def add_node(
        self,
        node_id: int,
        raft_address: str,
        *,
        learner: bool = True,
        timeout_ms: int | None = None,
        client_address: str | None = None,
    ) -> dict[str, Any]:
        """`timeout_ms` (here and for promote_node / remove_node): how long the leader waits
        for the membership change to commit (protocol default 10 s, at most 60 s). The call
        itself waits longer than that, so the leader's answer arrives (TIMEOUT: outcome
        unknown, the change may still commit) rather than a client-side timeout.
        `client_address` (HOST:PORT): the node's client port, recorded through the log so
        every member can forward to it once it leads (apply version 6; None: the leader's
        cluster.toml entry, if any). Not sent when None (older daemons refuse it)."""
        args: dict[str, Any] = {
            "node_id": node_id,
            "raft_address": raft_address,
            "learner": learner,
        }
        if client_address is not None:
            args["client_address"] = client_address
        return await self._membership_call("add_node", args, timeout_ms)

    async def promote_node(self, node_id: int, *, timeout_ms: int | None = None) -> dict[str, Any]:
        return await self._membership_call("promote_node", {"node_id": node_id}, timeout_ms)

    async def remove_node(self, node_id: int, *, timeout_ms: int | None = None) -> dict[str, Any]:
        # Around the change the leader gathers and then revokes the node's TLS certificates.
        return await self._membership_call(
            "remove_node",
            {"node_id": node_id},
            timeout_ms,
            around_change_ms=REMOVE_NODE_REVOCATION_MS_MAX,
        )

    async def _membership_call(
        self,
        op: str,
        args: dict[str, Any],
        timeout_ms: int | None,
        *,
        around_change_ms: int = 0,
    ) -> dict[str, Any]:
        server_wait_ms = MEMBERSHIP_TIMEOUT_MS_DEFAULT
        if timeout_ms is not None:
            server_wait_ms = _check_timeout("timeout_ms", timeout_ms, REQUEST_TIMEOUT_MS_MAX)
            if timeout_ms != MEMBERSHIP_TIMEOUT_MS_DEFAULT:
                # Sent only when it says something: a daemon of an older release refuses the
                # argument (BAD_REQUEST), and the CLI passes its default 10 s every time, so
                # membership changes with the defaults still work during a rolling upgrade.
                args["timeout_ms"] = timeout_ms
        call_timeout_ms = max(
            self.timeout_ms,
            server_wait_ms + around_change_ms + FORWARD_REPLY_MARGIN_MS + SERVER_WAIT_MARGIN_MS,
        )
        return await self.call(op, args, timeout_ms=call_timeout_ms)

    async def transfer_leader(self, target: int) -> dict[str, Any]:
        return await self.call("transfer_leader", {"target": target})

    async def revoke_cert(
        self,
        fingerprint: str,
        *,
        node_id: int = 0,
        force: bool = False,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Revoke a certificate cluster-wide by its SHA-256 fingerprint (admin; idempotent).
        Refused while a member presents it on a live link, unless `force`.

        Sent with a request id (a new uuid4 unless given), which the cluster applies once: an
        attempt whose outcome is unknown is repeated on another node like a `ddl`, and a
        repeat that finds the first one applied answers its result (`deduplicated`). An error
        that leaves the outcome unknown carries the id in `details.request_id`: call again
        with it."""
        args: dict[str, Any] = {
            "fingerprint": fingerprint,
            "request_id": request_id if request_id is not None else uuid.uuid4().hex,
        }
        if force:
            args["force"] = True
        if node_id:
            args["node_id"] = node_id
        return await self.call("cert_revoke", args)

    async def revoked_certs(self) -> dict[str, Any]:
        """The revocation list, this node's own certificate and what its peers presented."""
        return await self.call("cert_revoked", {})

    async def apply_version(self) -> dict[str, Any]:
        """The cluster's apply version and the newest each member's release supports."""
        return await self._on_a_release_with_apply_versions("apply_version", {})

    async def finalize_apply_version(self, version: int | None = None) -> dict[str, Any]:
        """Move the apply version to `version` or, without it, to the newest every member
        supports (admin; idempotent; never moves back)."""
        args: dict[str, Any] = {} if version is None else {"version": version}
        return await self._on_a_release_with_apply_versions("apply_version_finalize", args)

    async def _on_a_release_with_apply_versions(
        self, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """`op` as `call` runs it; a node of a release from before apply versions knows no
        such op (UNKNOWN_OP, nothing done), which `call` does not fail over on: during a
        rolling upgrade from that release each endpoint is then asked in turn, and when none
        knows the op the error says why."""
        try:
            return await self.call(op, args)
        except UnknownOpError:
            pass
        unreachable: dict[str, str] = {}
        for endpoint in self.endpoints:
            try:
                return await self.call(op, args, endpoint)
            except UnknownOpError:
                continue
            except UnavailableError as exc:
                unreachable[endpoint] = exc.message
        not_asked = f" (not reached: {_join_failures(unreachable)})" if unreachable else ""
        raise UnknownOpError(
            f"{op}: every node asked runs a release from before apply versions{not_asked}; "
            "such a cluster applies version 1. Upgrade the nodes, then `metastore cluster "
            "version --finalize`",
            details={"op": op},
        )

    async def status_all(self) -> list[EndpointResult]:
        """`status` of every endpoint, asked in parallel, each without failover."""
        return await self._each_endpoint("status")

    async def safe_time_all(self) -> list[EndpointResult]:
        return await self._each_endpoint("safe_time")

    async def _each_endpoint(self, op: str) -> list[EndpointResult]:
        async def one(endpoint: str) -> EndpointResult:
            try:
                return EndpointResult(endpoint=endpoint, result=await self.call(op, {}, endpoint))
            except MetastoreError as exc:
                return EndpointResult(endpoint=endpoint, error=exc)

        return list(await asyncio.gather(*(one(e) for e in self.endpoints)))

    # ---- the generic call --------------------------------------------------------------------

    async def call(
        self,
        op: str,
        args: Mapping[str, Any] | None = None,
        endpoint: str | None = None,
        *,
        timeout_ms: int | None = None,
        on_retry: Callable[[MetastoreError | None], None] | None = None,
    ) -> dict[str, Any]:
        """Run `op` and return its result map. With `endpoint`, ask exactly that node (no
        failover, no retry); otherwise fail over as the module docstring describes.
        `on_retry` is told of each attempt the call moves on from: the node's error, or None
        when the request was sent and no answer came (its outcome unknown)."""
        if self._closed:
            raise UnavailableError(_CLOSED_MESSAGE)
        if self.token is None:
            raise UnauthenticatedError(
                "no token: give one (CLI: --token / METASTORE_TOKEN, or --token-file / "
                "METASTORE_TOKEN_FILE; `metastore cluster init DIR` wrote them to DIR/secrets/)"
            )
        args = dict(args or {})
        budget_ms = self.timeout_ms if timeout_ms is None else _check_timeout("timeout", timeout_ms)
        if endpoint is not None:
            parse_endpoint(endpoint)
            order = [endpoint]
        else:
            order = self.endpoints[self._preferred :] + self.endpoints[: self._preferred]
        # DDL with a request id, commits (keyed by txn_id) and protections with a record id
        # (the same id and content are the same record) are idempotent on the server.
        # A `pin` without a session leases nothing (reader role): a read, never a write
        # whose outcome could be unknown.
        is_read = op in _READ_OPS or (op == "pin" and args.get("session_id") is None)
        repeatable = is_read or op in _IDEMPOTENT_OPS or _write_key(op, args) is not None
        attempts_max = 1 if endpoint is not None else ATTEMPTS_MAX
        failures: dict[str, str] = {}
        last_server_error: MetastoreError | None = None
        connection_failed = False
        # A node answered TIMEOUT to this write: it may still apply it, whatever nodes asked
        # later say ("nothing done" there is not "nothing done" everywhere).
        outcome_unknown = False
        # The attempt under way (None between attempts), for the deadline: a write whose
        # request never left the client, and which every node that got an earlier attempt
        # refused unseen (NOT_LEADER, ...), was not applied, and the error says so.
        in_flight: _SendMark | None = None
        refused_unseen = False  # a node received an attempt and answered "nothing done"
        # A node refused this write as a node (its hello, token, role, an argument its release
        # does not know) after another left it unknown: no verdict on it, so the call goes on
        # to the other nodes (only a repeatable write can be unknown), and if none settles it,
        # it ends "outcome unknown" naming every refusal.
        refused_as_node: MetastoreError | None = None
        # The soonest any node of this round said it could answer a timestamp now ahead of its
        # clock (TIMESTAMP_AHEAD_OF_CLOCK: ahead_ms - cs_max_ms), and whether another answer
        # (or no answer) came this round, which may come out otherwise next round.
        soonest_ms: int | None = None
        other_answer = False
        try:
            async with asyncio.timeout(budget_ms / 1000) as deadline:
                next_endpoint: str | None = None
                for attempt in range(attempts_max):
                    if next_endpoint is None:
                        if attempt and attempt % len(order) == 0:
                            pause_s = self._backoff_ms(attempt // len(order)) / 1000
                            if soonest_ms is not None and not other_answer:
                                # Every node refused the timestamp as ahead of its clock: no
                                # round can succeed before the soonest of them catches up.
                                pause_s = max(pause_s, soonest_ms / 1000)
                            soonest_ms, other_answer = None, False
                            left_s = (deadline.when() or 0) - asyncio.get_running_loop().time()
                            if pause_s + ROUND_MIN_MS / 1000 >= left_s:
                                # No time for another round: report what the nodes said rather
                                # than a bare timeout.
                                break
                            await asyncio.sleep(pause_s)
                        next_endpoint = order[attempt % len(order)]
                    target, next_endpoint = next_endpoint, None
                    in_flight = _SendMark()
                    try:
                        reply, floors = await self._attempt(
                            target, op, args, probe=repeatable, mark=in_flight
                        )
                    except _EndpointFailure as exc:
                        in_flight = None
                        failures[target] = exc.reason
                        connection_failed = True
                        other_answer = True
                        if exc.sent and not repeatable:
                            raise UnavailableError(
                                f"{op}: connection to {target} failed after the request was "
                                f"sent ({exc.reason}); its outcome is unknown; "
                                + _outcome_hint(op, args),
                                details={
                                    "endpoint": target,
                                    "op": op,
                                    "outcome_unknown": True,
                                    **_key_details(op, args),
                                },
                            ) from None
                        # A repeatable write sent before the connection broke may have been
                        # done there: unknown, unless a later answer says what became of it.
                        outcome_unknown = outcome_unknown or (exc.sent and not is_read)
                        if exc.sent and on_retry is not None:
                            on_retry(None)
                        continue
                    except MetastoreError as exc:
                        in_flight = None
                        # The node refused the connection itself (its hello: a token it does
                        # not take, a connection limit; a TLS handshake): it never saw the
                        # request, so its refusal says nothing of the write an earlier node
                        # may still apply. Raised as is, it read as "not committed".
                        if not outcome_unknown:
                            raise
                        failures[target] = f"{exc.code.value}: {exc.message}"
                        refused_as_node = exc
                        other_answer = True
                        if on_retry is not None:
                            on_retry(exc)
                        continue
                    in_flight = None
                    if reply.get("ok"):
                        if endpoint is None and target in self.endpoints:
                            self._preferred = self.endpoints.index(target)
                        result = _result_map(reply)
                        self._note_read_positions(floors, op, args, result)
                        if op == "commit":
                            self._observe_commit(result)
                            self._note_own_write(floors, result.get("ts"))
                        elif op == "ddl":
                            self._note_own_write(floors, result.get("tu"))
                        elif op == "read_ts":
                            self._note_own_write(floors, result.get("ts"))
                        return result
                    error = _rebuild_error(reply)
                    code = error.code.value
                    # A write the node timed out on (a leader that lost its quorum with the
                    # proposal pending) or answered UNAVAILABLE for (a follower whose forward
                    # to the leader broke after sending it) has an unknown outcome there: a
                    # repeatable one is retried elsewhere, and if no node then says what became
                    # of it the call says "outcome unknown", never a later node's "nothing
                    # done here" (NOT_LEADER during an election), which reads as "not
                    # committed". A read's TIMEOUT answers its own wait bound and is raised as
                    # is, unless the node says it timed out catching up (it lags; nothing done
                    # there): then another node is asked.
                    unknown_write = (
                        code in (ErrorCode.TIMEOUT.value, ErrorCode.UNAVAILABLE.value)
                        and not is_read
                        and not _nothing_done(error)
                    )
                    if outcome_unknown and (
                        code in _NODE_REFUSAL_CODES or _refused_before_proposing(op, error)
                    ):
                        # This node refused the request as a node; the write an earlier node
                        # may still apply stays unknown (raised as is, it read as "not
                        # committed", and a re-run under a fresh txn id committed twice).
                        # Another node may still settle it with the same key: asked next.
                        failures[target] = f"{code}: {error.message}"
                        refused_as_node = error
                        other_answer = True
                        if on_retry is not None:
                            on_retry(error)
                        continue
                    if (not _fails_over(error) and not unknown_write) or (
                        not _nothing_done(error) and not repeatable
                    ):
                        raise error
                    failures[target] = f"{code}: {error.message}"
                    last_server_error = error
                    outcome_unknown = outcome_unknown or unknown_write
                    refused_unseen = refused_unseen or _nothing_done(error)
                    if on_retry is not None:
                        on_retry(error)
                    wait_ms = _ahead_wait_ms(error)
                    if wait_ms is None:
                        other_answer = True
                    else:
                        soonest_ms = wait_ms if soonest_ms is None else min(soonest_ms, wait_ms)
                    next_endpoint = self._leader_hint(error, exclude=target)
        except TimeoutError:
            if endpoint is None:
                # Whatever hung this call should not be the first choice of the next one.
                self._preferred = (self._preferred + 1) % len(self.endpoints)
            details: dict[str, object] = {"op": op, "timeout_ms": budget_ms, "tried": failures}
            details.update(_key_details(op, args))
            more_time = (
                f"{CHECK_CLUSTER_HINT}, or give the call more time (timeout_ms; CLI "
                "--timeout-ms / METASTORE_TIMEOUT_MS)"
            )
            if not is_read and not outcome_unknown and not (in_flight and in_flight.sent):
                # Nothing of this write can be running anywhere: no attempt was sent, or
                # every node that got one did nothing with it. "Outcome unknown" would send
                # its caller looking for a change that cannot have happened.
                if in_flight is not None:
                    failures[target] = f"deadline passed while {in_flight.stage}"
                how = (
                    "every node that received it answered that it did nothing with it"
                    if refused_unseen
                    else "its request never left this client"
                )
                raise NotAppliedTimeoutError(
                    f"{op} did not complete within {budget_ms} ms ({_join_failures(failures)}); "
                    f"it was not applied ({how}): repeating it is safe; {more_time}",
                    details={**details, "not_applied": True, "sent": refused_unseen},
                ) from None
            if is_read:
                what_to_do = more_time
            else:
                # A write cut by the deadline may have reached a node.
                what_to_do = "its outcome is unknown; " + _outcome_hint(op, args)
                details["outcome_unknown"] = True
            raise RequestTimeoutError(
                f"{op} did not complete within {budget_ms} ms"
                + (f" ({_join_failures(failures)})" if failures else "")
                + f"; {what_to_do}",
                details=details,
            ) from None
        if last_server_error is not None:
            self._lower_unreachable_floor(last_server_error)
        if refused_as_node is not None:
            raise _unknown_outcome(op, args, failures) from refused_as_node
        # The last answer raised as is, unless it says "nothing done" of a write another node
        # timed out on: that one may still commit, so its outcome is unknown (UNAVAILABLE).
        if (
            last_server_error is not None
            and not connection_failed
            and not (outcome_unknown and _nothing_done(last_server_error))
        ):
            last_server_error.details.setdefault("tried", failures)
            if outcome_unknown:
                # Here the last answer is a write's TIMEOUT / UNAVAILABLE that left it unknown
                # (a nothing-done one takes the branch below): say so, with the key to repeat
                # it with, as the client's own errors do (the CLI names the command from them).
                last_server_error.details["outcome_unknown"] = True
                last_server_error.details.update(_key_details(op, args))
            elif not is_read and _nothing_done(last_server_error):
                # Every node answered (no connection failed) and none left the write
                # unknown, so every answer was "nothing done" (any other a failover takes
                # sets `outcome_unknown`): it was not applied anywhere, as
                # NotAppliedTimeoutError says for a deadline; repeating it is safe.
                last_server_error.details["not_applied"] = True
            raise last_server_error
        where = "" if endpoint is not None else " on every endpoint"
        unknown = (
            "; its outcome is unknown (a node could not confirm it); " + _outcome_hint(op, args)
            if outcome_unknown
            else f"; {CHECK_CLUSTER_HINT}"
        )
        details = {"op": op, "endpoints": failures}
        if outcome_unknown:
            details["outcome_unknown"] = True
            details.update(_key_details(op, args))
        raise UnavailableError(
            f"{op} failed{where}: {_join_failures(failures)}{unknown}", details=details
        )

    async def _attempt(
        self,
        endpoint: str,
        op: str,
        args: Mapping[str, Any],
        *,
        probe: bool,
        mark: _SendMark | None = None,
    ) -> tuple[dict[str, Any], ReadFloors]:
        """One request to one endpoint: the reply, and the read floors of the node's cluster
        (which its answer moves). With `probe` (a repeatable op), a request still
        unanswered after LIVENESS_PROBE_AFTER_MS is checked on: a `safe_time` on the same
        connection must answer within LIVENESS_PROBE_TIMEOUT_MS (or bytes must arrive on it
        meanwhile: the probe's answer may wait behind a large reply), or the connection is taken
        for dead (a partition, a hung node) and closed, so the caller retries elsewhere at
        once instead of spending its whole budget on a path that will never answer. A slow
        op (a DDL waiting for leases) on a live node keeps waiting. `mark` follows the request
        until it is handed to the transport."""
        conn = await self._connection(endpoint)
        if mark is not None:
            mark.stage = "sending"
        floors = self._floors_of(conn.hello.get("cluster_id"))
        args = self._with_floor(op, args, conn, floors)
        if not probe:
            return await conn.request(op, args, mark=mark), floors
        request = asyncio.ensure_future(conn.request(op, args, mark=mark))
        try:
            while True:
                done, _ = await asyncio.wait({request}, timeout=LIVENESS_PROBE_AFTER_MS / 1000)
                if done:
                    return request.result(), floors
                if not await self._answers(conn):
                    conn.close(
                        f"no answer to a liveness probe within {LIVENESS_PROBE_TIMEOUT_MS} ms"
                    )
                    return await request, floors  # fails with _EndpointFailure(sent=True)
        finally:
            if not request.done():
                request.cancel()

    @staticmethod
    async def _answers(conn: _Connection) -> bool:
        """Whether the node behind `conn` is alive: it answered a probe, or bytes kept arriving
        while the probe waited. Replies go out in order on the stream, so the probe's answer
        waits behind a large reply still in transit (a slow link, a loaded node): taken for
        dead, such a connection was closed, and a reply that took over a second to transfer
        failed on every node whatever the call's budget."""
        received_before = conn.received_bytes
        try:
            async with asyncio.timeout(LIVENESS_PROBE_TIMEOUT_MS / 1000):
                await conn.request("safe_time", {}, probe=True)
        except TimeoutError:
            return conn.is_open and conn.received_bytes > received_before
        except _EndpointFailure:
            return False
        return True

    async def _connection(self, endpoint: str) -> _Connection:
        conn = self._connections.get(endpoint)
        if conn is not None and conn.is_open:
            return conn
        lock = self._connect_locks.setdefault(endpoint, asyncio.Lock())
        async with lock:
            conn = self._connections.get(endpoint)
            if conn is not None and conn.is_open:
                return conn
            conn = await self._open(endpoint)
            if self._closed:
                conn.close("client closed")
                raise _EndpointFailure("client closed", sent=False)
            self._connections[endpoint] = conn
            return conn

    async def _open(self, endpoint: str) -> _Connection:
        host, port = parse_endpoint(endpoint)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_MS / 1000):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=self._ssl,
                    server_hostname=_tls_server_name(self.tls, host),
                )
        except ssl.SSLError as exc:
            # Every node of a cluster would answer the same: no failover, a typed error now.
            raise _tls_failed(endpoint, exc) from None
        except (OSError, TimeoutError) as exc:
            raise _EndpointFailure(_describe_os_error(exc), sent=False) from None
        # Weakly: the connection (kept by its read task) must not keep the client alive, so a
        # client dropped without `aclose` is collected and its finalizer closes this.
        conn = _Connection(endpoint, reader, writer, _weak_callback(self._observe_reply))
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_MS / 1000):
                reply = await conn.request(
                    "hello", {"token": self.token or "", "client": self.client_name}
                )
        except TimeoutError:
            conn.close("no answer to hello")
            raise _EndpointFailure("no answer to hello", sent=False) from None
        except _EndpointFailure as exc:
            conn.close(exc.reason)
            if conn.tls_error is not None:
                raise _tls_failed(endpoint, conn.tls_error) from None
            if self.tls is not None and self.tls.cert_file is not None:
                # TLS 1.3: a node that refuses our certificate closes after the handshake
                # completed on our side, without a reason we can read. Still failed over (a
                # stopping node looks the same), with the likely cause in the reason.
                raise _EndpointFailure(
                    f"{exc.reason} before answering hello (does it accept the client "
                    "certificate? it must be signed by the cluster CA)",
                    sent=False,
                ) from None
            # Nothing but hello was sent: the caller's request never reached the node.
            raise _EndpointFailure(exc.reason, sent=False) from None
        except BaseException:
            conn.close("cancelled")
            raise
        if not reply.get("ok"):
            conn.close("hello refused")
            error = _rebuild_error(reply)
            if error.code.value in _FAILOVER_CODES:
                raise _EndpointFailure(f"{error.code.value}: {error.message}", sent=False)
            raise error
        conn.hello = _result_map(reply)
        cluster_id = conn.hello.get("cluster_id")
        if isinstance(cluster_id, str) and cluster_id:
            self._cluster_id = cluster_id
        node_id = conn.hello.get("node_id")
        if isinstance(node_id, int):
            self._endpoint_by_node[node_id] = endpoint
        return conn

    def _observe_reply(self, reply: Mapping[str, Any]) -> None:
        ts = reply.get("ts")
        if not isinstance(ts, int) or isinstance(ts, bool):
            return
        try:
            self.clock.update(ts)
        except ClockOffsetError as exc:
            log.warning("ignoring a node's timestamp: %s", exc)
        except HlcError as exc:
            log.warning("ignoring an invalid timestamp in a reply: %s", exc)

    def _observe_commit(self, result: Mapping[str, Any]) -> None:
        """A commit may land above its entry's Tm (up to min(5 s, DD)), so above the reply's
        `ts`. Feeding the commit timestamp too makes every later `clock.now()` of this client
        exceed it: a batch planned at that Top reads its own driver's writes."""
        self._observe_reply({"ts": result.get("ts")})

    @staticmethod
    def _note_own_write(floors: ReadFloors, ts: object) -> None:
        if isinstance(ts, int) and not isinstance(ts, bool) and 0 < ts <= MAX_TS:
            floors.raise_to("own_writes", ts)

    # ---- monotonic reads ---------------------------------------------------------------------

    def _with_floor(
        self, op: str, args: Mapping[str, Any], conn: _Connection, floors: ReadFloors
    ) -> Mapping[str, Any]:
        """`args` with the read floor of `floors` (the process's, for the cluster of the node
        at `conn`) as `min_ts`, for a read without a timestamp that the node can take it on. A
        daemon of an earlier release refuses an argument it does not know (BAD_REQUEST), so
        schema and state reads get one only from a node whose hello result says `read_floor`;
        `files`/`files_multi` always took `min_ts` (the caller's own writes). A caller's own
        `min_ts` is left as it is."""
        if "min_ts" in args:
            return args
        floor = 0
        if op in _FILES_OPS:
            if "as_of" not in args and "page_token" not in args:
                floor = floors.files_floor_ts()
        elif conn.hello.get("read_floor") is not True:
            return args
        elif op == "schema_at" and args.get("ts") is None:
            floor = floors.schema_floor_ts
        elif op in STATE_FLOOR_OPS and args.get("as_of") is None:
            floor = floors.read_floor_ts
        return {**args, "min_ts": floor} if floor else args

    def _note_read_positions(
        self, floors: ReadFloors, op: str, args: Mapping[str, Any], result: Mapping[str, Any]
    ) -> None:
        """Raise the read floors to the position `result` was read at, for a read without a
        timestamp (a read AS OF T is of T, a fixed moment, and moves no floor)."""
        if op == "schema_at" and args.get("ts") is None:
            self._note_read_position(floors, "schema", result.get("ts"))
            self._note_read_position(floors, "state", result.get("safe_time"))
        elif op in _FILES_OPS and args.get("as_of") is None and "page_token" not in args:
            self._note_read_position(floors, "state", result.get("as_of"))
        elif op in STATE_FLOOR_OPS and args.get("as_of") is None:
            self._note_read_position(floors, "state", result.get("safe_time"))

    def _note_read_position(self, floors: ReadFloors, kind: str, ts: object) -> None:
        """A position ahead of this client's own clock by more than its HLC accepts (a node
        whose clock ran far ahead) is not taken as a floor: every node would refuse reads at
        it until real time caught up."""
        if not isinstance(ts, int) or isinstance(ts, bool) or not 0 < ts <= MAX_TS:
            return
        if physical_ms(ts) - self.clock.physical_now_ms() > self.clock.max_offset_ms:
            log.warning("not keeping read position %s: too far ahead of this clock", ts)
            return
        floors.raise_to("schema" if kind == "schema" else "read", ts)

    def _lower_unreachable_floor(self, error: MetastoreError) -> None:
        """A floor no node of the call could answer for within its budget
        (TIMESTAMP_AHEAD_OF_CLOCK for the floor itself: it came from a node whose clock ran
        ahead, past CSmax of the others) fails this call with that typed error and is lowered
        to what the refusing node answers now (its clock + CSmax), so the next read succeeds
        instead of every read failing until real time catches up with it. The floor is the
        process's (metastore.client.floors, "Lowering"): lowered for every client of the
        process, and only while it still is the refused position."""
        if error.code is not ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK:
            return
        ts, ahead_ms, cs_max_ms = (error.details.get(k) for k in ("ts", "ahead_ms", "cs_max_ms"))
        if not (_is_uint(ts) and _is_uint(ahead_ms) and _is_uint(cs_max_ms)):
            return
        assert isinstance(ts, int)
        assert isinstance(ahead_ms, int)
        assert isinstance(cs_max_ms, int)
        floors = self._floors_of(self._cluster_id)
        reachable = max(0, physical_ms(ts) - ahead_ms + cs_max_ms) << LOGICAL_BITS
        lowered_schema = floors.lower_if("schema", ts, min(ts, reachable))
        lowered_read = floors.lower_if("read", ts, min(ts, reachable))
        # Neither: the caller's own timestamp, not a floor (or another client lowered it).
        if lowered_schema or lowered_read:
            log.warning(
                "lowering this process's read floor %s to %s: no node could read at it (%s)",
                ts,
                reachable,
                error.message,
            )

    def _leader_hint(self, error: MetastoreError, *, exclude: str) -> str | None:
        if error.code is not ErrorCode.NOT_LEADER:
            return None
        leader = error.details.get("leader")
        endpoint = self._endpoint_by_node.get(leader) if isinstance(leader, int) else None
        return endpoint if endpoint != exclude else None

    def _backoff_ms(self, round_number: int) -> float:
        cap = min(RETRY_BACKOFF_MS_MAX, RETRY_BACKOFF_MS_MIN * 2 ** max(0, round_number - 1))
        return self._rng.uniform(max(RETRY_BACKOFF_MS_MIN, cap / 2), max(RETRY_BACKOFF_MS_MIN, cap))


# The totals of a `gc_run` reply that a run split in parts adds up (`gc_run`).
_GC_TOTALS: Final = (
    "files_deleted",
    "bytes_deleted",
    "orphans_deleted",
    "orphan_bytes_deleted",
    "compacted_manifests",
)


def _gc_part(partial: object) -> dict[str, int] | None:
    """What a stopped GC run deleted (an error's `details.partial`), or None if malformed."""
    if not isinstance(partial, Mapping):
        return None
    part: dict[str, int] = {}
    for key in _GC_TOTALS:
        value = partial.get(key, 0)
        if not _is_uint(value):
            return None
        part[key] = int(value)
    return part


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unknown_outcome(
    op: str, args: Mapping[str, Any], failures: Mapping[str, str]
) -> UnavailableError:
    """The error of a write that a node left with an unknown outcome and that no later node
    settled (retryable: repeated, it is applied at most once)."""
    return UnavailableError(
        f"{op} failed: {_join_failures(failures)}; its outcome is unknown (a node could not "
        "confirm it); " + _outcome_hint(op, args),
        details={
            "op": op,
            "endpoints": dict(failures),
            "outcome_unknown": True,
            **_key_details(op, args),
        },
    )


def _key_details(op: str, args: Mapping[str, Any]) -> dict[str, object]:
    """The key a write whose outcome is unknown is repeated with ({"request_id": ...}), for
    the caller to read from the error's details (the CLI prints the flag that sends it)."""
    keyed = _write_key(op, args)
    return {} if keyed is None else {keyed[0]: keyed[1]}


def _outcome_hint(op: str, args: Mapping[str, Any]) -> str:
    """What the caller of a write whose outcome is unknown does next: repeat it with the same
    key when the cluster applies that key once, else find out first (a second `add_node` or
    `job_cancel` is not the first one again)."""
    keyed = _write_key(op, args)
    if keyed is not None:
        key, value = keyed
        return f"retry with the same {key} {value!r}: {_KEYED_WRITES[op][1]}"
    if op in _IDEMPOTENT_OPS:
        return "repeating it is safe"
    if op in _MEMBERSHIP_OPS:
        return MEMBERSHIP_OUTCOME_HINT
    return "check whether it happened before repeating it"


# Writes the cluster applies once per key (op -> the key's argument, what a repeat does):
# repeated with the same key, they are one write. An empty key is none (the node picks one
# per request, or keeps no record of it).
_KEYED_WRITES: Final = {
    "commit": ("txn_id", "it commits once (committed_txn tells whether it did)"),
    "ddl": ("request_id", "it is applied once"),
    "pts_protect": ("record_id", "it makes one record"),
    # A revocation is permanent and the same request id is applied once (a repeat answers
    # the first one's result); the node that receives a repeat refuses it as "in use" only
    # once it has caught up with the log and still finds the certificate unrevoked.
    "cert_revoke": ("request_id", "it is applied once (a repeat answers the first result)"),
}


def _write_key(op: str, args: Mapping[str, Any]) -> tuple[str, str] | None:
    """(argument, value) of the key that makes this write repeatable, or None."""
    if op not in _KEYED_WRITES:
        return None
    key = _KEYED_WRITES[op][0]
    value = args.get(key)
    return (key, value) if isinstance(value, str) and value else None


def _refused_before_proposing(op: str, error: MetastoreError) -> bool:
    """A check the receiving node makes on its own view before it proposes anything, so no
    verdict on a write an earlier node may still apply: `cert_revoke` refused because that
    node sees the certificate on a live peer link (`details.in_use_by`). The first attempt,
    checked elsewhere, may yet be applied."""
    return (
        op == "cert_revoke"
        and error.code is ErrorCode.INVALID_ARGUMENT
        and "in_use_by" in error.details
    )


def _fails_over(error: MetastoreError) -> bool:
    """Whether another node may answer what this one refused: it was not the node to ask
    (not ready, not the leader, its clock behind) or it lags (CatchUpTimeoutError)."""
    return error.code.value in _FAILOVER_CODES or isinstance(error, CatchUpTimeoutError)


def _nothing_done(error: MetastoreError) -> bool:
    """Whether the error guarantees the node did nothing with the request (so even a write
    that cannot be repeated blindly may go to another node). A catch-up timeout does: a node
    waits for safe time only before it proposes anything. So does a follower's UNAVAILABLE
    with `details.not_sent` (its forward timed out before writing the request to the leader;
    metastore.daemon.forward): a positive mark, never the mere absence of `outcome_unknown`."""
    return (
        error.code.value in _NOT_EXECUTED_CODES
        or isinstance(error, CatchUpTimeoutError)
        or (error.code is ErrorCode.UNAVAILABLE and error.details.get("not_sent") is True)
    )


def _ahead_wait_ms(error: MetastoreError) -> int | None:
    """For TIMESTAMP_AHEAD_OF_CLOCK: how long until that node's clock is within its CSmax of
    the timestamp (when it will answer), from the refusal's details; None otherwise."""
    if error.code is not ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK:
        return None
    ahead, cs_max = error.details.get("ahead_ms"), error.details.get("cs_max_ms")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (ahead, cs_max)):
        return None
    assert isinstance(ahead, int)
    assert isinstance(cs_max, int)
    return max(0, ahead - cs_max)


def _result_map(reply: Mapping[str, Any]) -> dict[str, Any]:
    result = reply.get("result")
    if result is None:
        return {}
    if not isinstance(result, dict):
        raise UnavailableError(
            f"malformed reply: result is {type(result).__name__}, not a map; {_NODE_BUG_HINT}"
        )
    return result


def _rebuild_error(reply: Mapping[str, Any]) -> MetastoreError:
    wire = reply.get("error")
    try:
        return MetastoreError.from_wire(wire)
    except MetastoreError as exc:
        # A node that breaks the protocol is a bug over there; say so rather than guess.
        return UnavailableError(
            f"malformed error reply from the node: {exc.message}; {_NODE_BUG_HINT}"
        )


def _join_failures(failures: Mapping[str, str]) -> str:
    return "; ".join(f"{endpoint}: {reason}" for endpoint, reason in failures.items())


def _check_timeout(name: str, value: object, maximum: int = TIMEOUT_MS_MAX) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidArgumentError(f"{name}={value!r} must be an integer in 1..{maximum} ms")
    return value


def _names(name: str, value: object) -> list[Any]:
    """A list argument of names (tables, namespaces, session ids) as the request carries it.
    One string is refused, not split: list("s1") is ["s", "1"], so `session_expire("s1")`
    expired sessions "s" and "1", and `files_multi("ns.t")` listed tables "n", "s", ...
    Items are the node's to check (it answers each with a typed error)."""
    if isinstance(value, str | bytes):
        raise InvalidArgumentError(
            f"{name} must be a list of names, not one string {brief_repr(value)}: pass "
            f"[{brief_repr(value)}]"
        )
    if not isinstance(value, Iterable):
        raise InvalidArgumentError(f"{name} must be a list of names, got {type(value).__name__}")
    return list(value)


def quote_ident(name: str) -> str:
    """A Spark SQL identifier in backquotes (a backquote inside is doubled)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"name {name!r} must be a non-empty string")
    return "`" + name.replace("`", "``") + "`"


def quote_string(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---- blocking wrapper ------------------------------------------------------------------------


def _run_loop_until_stopped(loop: asyncio.AbstractEventLoop) -> None:
    """The loop thread of a SyncMetastoreClient (it refers to the loop only, not the client)."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _shut_down_client(client: MetastoreClient) -> None:
    # Calls still running (a caller interrupted mid-call) are cancelled and awaited first:
    # a task left pending when the loop closes makes asyncio print "Task was destroyed"
    # and, as it is collected, tracebacks about the closed loop.
    me = asyncio.current_task()
    running = [t for t in asyncio.all_tasks() if t is not me]
    for task in running:
        task.cancel()
    if running:
        await asyncio.wait(running, timeout=SYNC_CLOSE_TIMEOUT_MS / 1000)
    await client.aclose()


def _stop_loop_thread(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: MetastoreClient
) -> None:
    """Close `client` in its loop, stop the loop and end its thread (which closes the loop)."""
    if not thread.is_alive() or loop.is_closed():
        return
    if threading.current_thread() is thread:
        # Closed inside its own loop thread: it cannot wait for itself, so the shutdown is
        # left to run and then stops the loop.
        _shut_down_then_stop(loop, client)
        return
    try:
        done = asyncio.run_coroutine_threadsafe(_shut_down_client(client), loop)
    except RuntimeError:  # the loop closed meanwhile
        return
    with contextlib.suppress(Exception):
        done.result(timeout=SYNC_CLOSE_TIMEOUT_MS / 1000)
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=SYNC_CLOSE_TIMEOUT_MS / 1000)


# Shutdowns handed to a loop by a finalizer, referenced until done (a loop keeps only weak
# references to its tasks).
_HANDED_OFF_SHUTDOWNS: set[asyncio.Task[None]] = set()


def _shut_down_then_stop(loop: asyncio.AbstractEventLoop, client: MetastoreClient) -> None:
    """In `loop`'s thread: shut `client` down, then stop the loop (its thread then ends)."""
    task = loop.create_task(_shut_down_client(client))
    _HANDED_OFF_SHUTDOWNS.add(task)
    task.add_done_callback(_HANDED_OFF_SHUTDOWNS.discard)
    task.add_done_callback(lambda _: loop.stop())


def _release_unclosed_sync_client(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: MetastoreClient
) -> None:
    """The finalizer of a SyncMetastoreClient dropped (or left at exit) without `close()`.

    It runs in whatever thread collected the client, which must not wait for the shutdown
    (up to SYNC_CLOSE_TIMEOUT_MS for calls to end, as long for the thread): the shutdown is
    handed to the client's loop thread, which stops once it is done, and this waits at most
    SYNC_FINALIZE_WAIT_MS for that (long enough for a client with nothing running)."""
    if not thread.is_alive() or loop.is_closed():
        return
    warnings.warn(
        f"unclosed SyncMetastoreClient of {', '.join(client.endpoints)}: call close() "
        "or use it as a context manager",
        ResourceWarning,
        stacklevel=2,
    )
    if threading.current_thread() is thread:
        # Collected inside its own loop thread: it cannot wait for itself.
        _shut_down_then_stop(loop, client)
        return
    try:
        loop.call_soon_threadsafe(_shut_down_then_stop, loop, client)
    except RuntimeError:  # the loop closed meanwhile
        return
    thread.join(timeout=SYNC_FINALIZE_WAIT_MS / 1000)


class SyncMetastoreClient:
    """`MetastoreClient` with blocking methods, for code without an event loop.

    A private event loop runs in a daemon thread; each method submits the coroutine to it and
    waits. Safe to call from several threads at once (they share the connections). Must not be
    called from inside its own loop thread (that would deadlock; it raises instead).
    """

    def __init__(
        self,
        endpoints: list[str],
        token: str | None,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        clock: HybridClock | None = None,
        client_name: str = CLIENT_NAME_DEFAULT,
        tls: ClientTls | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_run_loop_until_stopped,
            args=(self._loop,),
            name="metastore-client-loop",
            daemon=True,
        )
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._client = MetastoreClient(
                endpoints,
                token,
                timeout_ms=timeout_ms,
                clock=clock,
                client_name=client_name,
                tls=tls,
            )
        except BaseException:
            self._loop.close()
            raise
        self._thread.start()
        # A client dropped without `close()` must not keep its thread and connections for the
        # life of the process (a driver making clients in a loop piles them up): once it is
        # unreachable this stops its loop, with a ResourceWarning as an unclosed file gives.
        # Neither the thread nor the finalizer refer to `self`, or it would never be dropped.
        self._finalizer = weakref.finalize(
            self, _release_unclosed_sync_client, self._loop, self._thread, self._client
        )

    @property
    def endpoints(self) -> list[str]:
        return self._client.endpoints

    @property
    def clock(self) -> HybridClock:
        return self._client.clock

    @property
    def cluster_id(self) -> str | None:
        return self._client.cluster_id

    @property
    def own_writes_ts(self) -> int:
        return self._client.own_writes_ts

    @property
    def read_floor_ts(self) -> int:
        return self._client.read_floor_ts

    @property
    def schema_floor_ts(self) -> int:
        return self._client.schema_floor_ts

    @property
    def timeout_ms(self) -> int:
        return self._client.timeout_ms

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncMetastoreClient called from its own event loop thread")
        with self._lock:
            if self._closed:
                coro.close()
                raise UnavailableError(_CLOSED_MESSAGE)
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise UnavailableError(
                "the client was closed during the call: a write's outcome is unknown (repeat it "
                "with the same txn_id / request_id on a new client, or look it up first); a "
                "read can be asked again of a new client"
            ) from None
        except BaseException:
            # The caller gave up (Ctrl-C): the call must not go on in the loop thread.
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel the calls still running, close the connections and stop the loop thread.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer.detach()
        _stop_loop_thread(self._loop, self._thread, self._client)

    def __enter__(self) -> SyncMetastoreClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _sync(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        async def run() -> T:
            return await fn(*args, **kwargs)

        return self._run(run())

    def schema_at(
        self, table: str, ts: int | None = None, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        return self._sync(self._client.schema_at, table, ts, timeout_ms)

    def files(self, table: str, as_of: int | None = None, *, expand: bool = True) -> dict[str, Any]:
        return self._sync(self._client.files, table, as_of, expand=expand)

    def txn_log(self, limit: int = 20) -> dict[str, Any]:
        return self._sync(self._client.txn_log, limit)

    def files_multi(
        self, tables: list[str], as_of: int | None = None, *, expand: bool = True
    ) -> dict[str, Any]:
        return self._sync(self._client.files_multi, tables, as_of, expand=expand)

    def committed_txn(self, txn_id: str, *, stream: str | None = None) -> dict[str, Any]:
        return self._sync(self._client.committed_txn, txn_id, stream=stream)

    def read_ts(self) -> int:
        return self._sync(self._client.read_ts)

    def session_open(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.session_open, session_id, **kwargs)

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return self._sync(self._client.session_heartbeat, session_id)

    def session_close(self, session_id: str) -> dict[str, Any]:
        return self._sync(self._client.session_close, session_id)

    def session_expire(self, session_ids: list[str]) -> dict[str, Any]:
        return self._sync(self._client.session_expire, session_ids)

    def session_list(self, *, include_ended: bool = False) -> dict[str, Any]:
        return self._sync(self._client.session_list, include_ended=include_ended)

    def lease_acquire(
        self, session_id: str, leases: list[dict[str, Any]], read_ts: int | None = None
    ) -> dict[str, Any]:
        return self._sync(self._client.lease_acquire, session_id, leases, read_ts)

    def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        return self._sync(self._client.lease_release, session_id, leases, known_tm)

    def lease_list(self, table: str | None = None) -> dict[str, Any]:
        return self._sync(self._client.lease_list, table)

    def lease_blockers(self, table: str) -> dict[str, Any]:
        return self._sync(self._client.lease_blockers, table)

    def pin(self, tables: list[str], ts: int | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.pin, tables, ts, **kwargs)

    def protect(self, ts: int, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.protect, ts, **kwargs)

    def release_protection(self, record_id: str) -> dict[str, Any]:
        return self._sync(self._client.release_protection, record_id)

    def protections(self, *, include_released: bool = False) -> dict[str, Any]:
        return self._sync(self._client.protections, include_released=include_released)

    def protection(self, record_id: str) -> dict[str, Any]:
        return self._sync(self._client.protection, record_id)

    def gc_status(self, table: str | None = None) -> dict[str, Any]:
        return self._sync(self._client.gc_status, table)

    def gc_run(self, table: str | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.gc_run, table, **kwargs)

    def watch(self, from_ts: int | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.watch, from_ts, **kwargs)

    def job_list(self, table: str | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.job_list, table, **kwargs)

    def job_show(self, job_id: int) -> dict[str, Any]:
        return self._sync(self._client.job_show, job_id)

    def job_cancel(self, job_id: int, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.job_cancel, job_id, **kwargs)

    def job_backfilled(self, job_id: int, **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.job_backfilled, job_id, **kwargs)

    def commit(self, txn_id: str, writes: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        return self._sync(self._client.commit, txn_id, writes, **kwargs)

    def describe(self, table: str, as_of: int | None = None) -> dict[str, Any]:
        return self._sync(self._client.describe, table, as_of)

    def history(self, table: str) -> dict[str, Any]:
        return self._sync(self._client.history, table)

    def list_namespaces(self, as_of: int | None = None) -> dict[str, Any]:
        return self._sync(self._client.list_namespaces, as_of)

    def list_tables(self, namespace: str | None = None, as_of: int | None = None) -> dict[str, Any]:
        return self._sync(self._client.list_tables, namespace, as_of)

    def safe_time(self, endpoint: str | None = None) -> dict[str, Any]:
        return self._sync(self._client.safe_time, endpoint)

    def status(self, endpoint: str | None = None) -> dict[str, Any]:
        return self._sync(self._client.status, endpoint)

    def ddl(
        self,
        sql: str,
        request_id: str | None = None,
        *,
        wait_ms: int = DDL_WAIT_MS_DEFAULT,
        on_blocked: Callable[[MetastoreError], None] | None = None,
    ) -> dict[str, Any]:
        return self._sync(self._client.ddl, sql, request_id, wait_ms=wait_ms, on_blocked=on_blocked)

    def create_namespace(
        self,
        name: str,
        *,
        comment: str | None = None,
        if_not_exists: bool = False,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        return self._sync(
            self._client.create_namespace,
            name,
            comment=comment,
            if_not_exists=if_not_exists,
            request_id=request_id,
        )

    def drop_namespace(
        self,
        name: str,
        *,
        if_exists: bool = False,
        cascade: bool = False,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        return self._sync(
            self._client.drop_namespace,
            name,
            if_exists=if_exists,
            cascade=cascade,
            request_id=request_id,
        )

    def add_node(
        self,
        node_id: int,
        raft_address: str,
        *,
        learner: bool = True,
        timeout_ms: int | None = None,
        client_address: str | None = None,
    ) -> dict[str, Any]:
        return self._sync(
            self._client.add_node,
            node_id,
            raft_address,
            learner=learner,
            timeout_ms=timeout_ms,
            client_address=client_address,
        )

    def promote_node(self, node_id: int, *, timeout_ms: int | None = None) -> dict[str, Any]:
        return self._sync(self._client.promote_node, node_id, timeout_ms=timeout_ms)

    def remove_node(self, node_id: int, *, timeout_ms: int | None = None) -> dict[str, Any]:
        return self._sync(self._client.remove_node, node_id, timeout_ms=timeout_ms)

    def revoke_cert(
        self,
        fingerprint: str,
        *,
        node_id: int = 0,
        force: bool = False,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        return self._sync(
            self._client.revoke_cert,
            fingerprint,
            node_id=node_id,
            force=force,
            request_id=request_id,
        )

    def revoked_certs(self) -> dict[str, Any]:
        return self._sync(self._client.revoked_certs)

    def transfer_leader(self, target: int) -> dict[str, Any]:
        return self._sync(self._client.transfer_leader, target)

    def apply_version(self) -> dict[str, Any]:
        return self._sync(self._client.apply_version)

    def finalize_apply_version(self, version: int | None = None) -> dict[str, Any]:
        return self._sync(self._client.finalize_apply_version, version)

    def status_all(self) -> list[EndpointResult]:
        return self._sync(self._client.status_all)

    def safe_time_all(self) -> list[EndpointResult]:
        return self._sync(self._client.safe_time_all)

    def call(
        self,
        op: str,
        args: Mapping[str, Any] | None = None,
        endpoint: str | None = None,
        *,
        timeout_ms: int | None = None,
        on_retry: Callable[[MetastoreError | None], None] | None = None,
    ) -> dict[str, Any]:
        """As AsyncClient.call; `on_retry` runs on the client's event-loop thread."""
        return self._sync(
            self._client.call, op, args, endpoint, timeout_ms=timeout_ms, on_retry=on_retry
        )
