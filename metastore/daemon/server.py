"""The client API server: docs/protocol.md on asyncio streams.

Per connection: frames are decoded with the sans-I/O `raft.framing.FrameDecoder`, under an item
budget (CLIENT_HELLO_ITEMS_MAX for the first, CLIENT_REQUEST_ITEMS_MAX after it); the first
request must be `hello` with a valid token; later requests run concurrently (bounded per
connection) and replies are matched by id. Every failure becomes a typed error reply and changes
nothing; a malformed frame closes the connection because the stream is out of sync. A closed
connection cancels its requests in flight, except those whose steps must not be cut in between
(`remove_node`: the removal and its revocation; `gc_run`), which run to their end detached;
a graceful stop waits a few seconds for them (`ApiServer.stop`) before it cancels them.
A cancelled request is still counted and audited (outcome CANCELLED; a detached one with the
outcome it reaches, once it ends): the change it asked for may have happened all the same.

Reads are served from this node's applied state once it is caught up with the current leader.
A read AS OF T waits until the node's safe time covers T (schemas: T - DD; files: T) and only then
resolves anything, so every node gives the same answer. DD and CSmax always come from the
replicated cluster settings (InitCluster), never from this node's config file.
A read without a timestamp takes the client's read floor (`min_ts`, api_limits.STATE_FLOOR_OPS:
monotonic reads across nodes); a node that lags behind the position a read needs answers a
catch-up TIMEOUT or NOT_READY, on which clients ask another node.
Writes (DDL, membership) are parsed/validated here and proposed on the leader: a follower forwards
the canonical command, never the SQL text.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeVar

import msgpack

from hlc import HybridClock, physical_ms, ts_text
from hlc.errors import HlcError, WaitTimeoutError
from hlc.limits import LOGICAL_BITS, MAX_TS
from metastore import limits as mlimits
from metastore.apply_version import (
    APPLY_VERSION_SUPPORTED,
    INITIAL_APPLY_VERSION,
    MAX_APPLY_VERSION,
)
from metastore.catalog import SchemaVersion
from metastore.commands import (
    AcquireLeases,
    AdvanceGcThreshold,
    AdvanceSchemaJob,
    CancelSchemaJob,
    CloseSession,
    Command,
    CommitTxn,
    CreateTable,
    ExpireSessions,
    GcFilesDeleted,
    HeartbeatSession,
    InitCluster,
    LeaseKey,
    OpenSession,
    Protect,
    QueueManifestFiles,
    ReleaseLeases,
    ReleaseProtection,
    RevokeCerts,
    SchemaJobBackfilled,
    SessionInfo,
    SetApplyVersion,
    SetMemberClientAddress,
    TableName,
    commit_txn_from_request,
    compact_manifest_from_request,
    decode_command,
    encode_command,
    refuse_nul,
    validate_command,
)
from metastore.daemon import api_limits as L
from metastore.daemon.allowed_locations import ANYWHERE, AllowedLocations, check_no_shared_directory
from metastore.daemon.audit import AuditLog
from metastore.daemon.backup import SnapshotExports
from metastore.daemon.clock_steps import CLOCK_STEP_PROBATION_S, ClockStepWatch
from metastore.daemon.config import NODE_ID_MAX as CONFIG_NODE_ID_MAX
from metastore.daemon.forward import (
    FORWARD_CLIENT,
    FORWARDED_SUFFIX,
    MISSING_MEMBER_FIX,
    LeaderForwarder,
)
from metastore.daemon.gc_worker import GcWorker, gc_status
from metastore.daemon.metrics import NodeMetrics
from metastore.daemon.removal_check import RemovalCheck
from metastore.daemon.secrets import Role, Secrets
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.daemon.views import (
    commit_view,
    description_view,
    file_view,
    namespace_view,
    version_view,
)
from metastore.ddl import check_new_location, parse_ddl
from metastore.errors import (
    BadRequestError,
    CatchUpTimeoutError,
    ClusterNotInitializedError,
    ForbiddenError,
    InternalError,
    InvalidArgumentError,
    LimitExceededError,
    ManifestConflictError,
    MetastoreError,
    NamespaceNotFoundError,
    NotLeaderError,
    NotReadyError,
    ProtectionNotFoundError,
    RequestTimeoutError,
    SchemaJobNotFoundError,
    TableNotFoundError,
    TimestampAheadError,
    TlsFailedError,
    TlsRequiredError,
    UnauthenticatedError,
    UnavailableError,
    UnknownOpError,
    limit_exceeded,
)
from metastore.events import matches as event_matches
from metastore.gc import release_refusal
from metastore.jobs import SchemaJob, next_step_wait
from metastore.leases import Lease
from metastore.member_clients import address_problem as member_address_problem
from metastore.member_clients import format_address
from metastore.outcome import Outcome
from metastore.revocation import fingerprint_of_der, is_fingerprint, normalize_fingerprint
from metastore.state import MetastoreState
from raft.core.errors import LearnerBehindError, ProposalDroppedError, RaftCoreError
from raft.core.errors import NotLeaderError as RaftNotLeaderError
from raft.errors import FrameTooLargeError, MalformedFrameError, RaftError
from raft.framing import NEED_DATA, FrameDecoder, encode_frame
from raft.node import (
    NodeStatus,
    NodeStoppedError,
    ProposalTimeoutError,
    ProposalTooLargeError,
    QueueFullError,
    RaftNode,
    ReadIndexError,
    SafeTimeTimeoutError,
)
from raft.tls import TlsListener
from raft.wire import brief_repr, show_names

log = logging.getLogger("metastore.api")

SERVER_VERSION = "0.1.0"
# The outcome (audit log, request metric) of a request cancelled before it answered: its client
# closed the connection, or the node stopped. What it changed is unknown to it (see audit.py).
CANCELLED_OUTCOME: Final = "CANCELLED"

Args = Mapping[str, Any]
Handler = Callable[["Session", Args], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class _RequestRecord:
    """What a request's audit record and metric need, for steps that outlive its task
    (`ApiServer._run_detached`): `handed_over` once they took the writing of it on."""

    session: Session
    op: str
    args: Mapping[str, Any]
    started: float
    handed_over: bool = False


# The request the current task serves (set by `_run_request`; each request is its own task).
_REQUEST_RECORD: contextvars.ContextVar[_RequestRecord | None] = contextvars.ContextVar(
    "metastore_request_record", default=None
)


@dataclass(slots=True)
class Session:
    peer: str
    role: Role | None = None
    token: str = field(default="", repr=False)
    # The token's name in tokens.json (audit: the client name is only what the client says).
    token_name: str = ""
    # The token list `role` was found in: another (tokens.json reloaded) means checking again.
    checked_against: Secrets | None = field(default=None, repr=False)
    # Closes the connection once the replies sent so far have left (a revoked token's).
    close_soon: Callable[[], None] | None = field(default=None, repr=False)
    client: str = ""
    # Whether the connection is TLS (a plaintext one on a TLS port is refused at its hello),
    # and whether the client presented a certificate (verified against the CA by TLS).
    tls: bool = False
    client_cert: bool = False
    # SHA-256 of the client certificate's DER ("" = none): refused at hello once revoked.
    cert_fingerprint: str = ""
    # Its certificate was revoked while it was open: no further request of it runs.
    revoked: bool = False


class _Replies:
    """One connection's replies on their way out, and its reply budget.

    Replies finished in the same event-loop iteration leave in one write: under pipelined load
    a send syscall per reply was the largest single cost of a read. The bytes queued (waiting
    for that write, or in the transport's buffer: not yet taken by the socket) are counted, and
    the connection's reader stops reading requests while they are over
    CLIENT_REPLY_BYTES_PER_CONNECTION_MAX (`wait_for_room`), so a client that pipelines
    requests with large replies and does not read cannot make the node hold them."""

    __slots__ = ("_pending", "_pending_bytes", "_sent_mark", "_written_bytes", "paused", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        # Reply bytes handed to the transport so far: minus what it still buffers, what the
        # socket took (progress of a paused connection's reader).
        self._written_bytes = 0
        self._sent_mark = 0  # `_sent_bytes` when `took_bytes` was last asked
        self.paused = False  # waiting in `wait_for_room` (a metric)

    def queued_bytes(self) -> int:
        return self._pending_bytes + self.writer.transport.get_write_buffer_size()

    def _sent_bytes(self) -> int:
        return self._written_bytes - self.writer.transport.get_write_buffer_size()

    def took_bytes(self) -> bool:
        """Whether the socket took any reply bytes since the last call."""
        sent = self._sent_bytes()
        moved, self._sent_mark = sent != self._sent_mark, sent
        return moved

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if not self.writer.is_closing():
            with contextlib.suppress(ConnectionError, OSError):
                self.writer.write(data)
                self._written_bytes += len(data)

    async def send(self, frame: bytes) -> None:
        # Frames keep their call order, and drain still pushes back on every sender.
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        await self.writer.drain()  # many tasks may await drain at once (Python >= 3.11)

    async def wait_for_room(self) -> bool:
        """Return at once while the queued reply bytes are within the budget; else wait until
        the transport has drained to its low-water mark. False: the socket took no byte for
        CLIENT_IDLE_TIMEOUT_MS (the client stopped reading; close it) or the connection is
        closing. A slow reader that takes some bytes in each such period waits as long as it
        needs."""
        if self.queued_bytes() <= L.CLIENT_REPLY_BYTES_PER_CONNECTION_MAX:
            return True
        # Everything queued goes to the transport now (in order): its write pauses the
        # protocol (the buffer is far over the high-water mark), so drain waits for the socket.
        self.flush()
        self.paused = True
        try:
            sent_before = self._sent_bytes()
            while self.queued_bytes() > L.CLIENT_REPLY_BYTES_PER_CONNECTION_MAX:
                if self.writer.is_closing():
                    return False
                try:
                    await asyncio.wait_for(self.writer.drain(), L.CLIENT_IDLE_TIMEOUT_MS / 1000)
                except TimeoutError:
                    sent_now = self._sent_bytes()
                    if sent_now == sent_before:
                        return False
                    sent_before = sent_now
            return True
        finally:
            self.paused = False


# Of the reads that take a read floor (api_limits.STATE_FLOOR_OPS), the ones whose reply gets
# `safe_time` (the position read at) when it has none: not `job_show` and `pts_show`, whose
# reply is the record itself, as listed by `job_list` and `pts_list` (a client learns no floor
# from them, and still sends its floor).
_POSITION_REPLY_OPS: Final = L.STATE_FLOOR_OPS - {"job_show", "pts_show"}


@dataclass(frozen=True, slots=True)
class _Op:
    role: Role
    handler: Handler
    args: frozenset[str]


# Past these sizes a commit request is checked, and a forwarded command decoded, in a worker
# thread rather than on the event loop that also runs Raft (each file entry costs ~20 us of
# checking; a thread hand-over ~50-100 us, worth it only for big ones).
OFFLOAD_COMMIT_FILES_MIN: Final = 256
OFFLOAD_DECODE_BYTES_MIN: Final = 64 * 1024


def _commit_files(cmd: CommitTxn) -> int:
    """How many file entries a checked commit names (as `_commit_request_files` counts)."""
    return sum(len(w.add) + len(w.remove) for w in cmd.writes)


def _encoded_and_decoded(cmd: Command) -> tuple[bytes, Command]:
    """`cmd`'s canonical bytes, and what they decode to: the command apply will see."""
    data = encode_command(cmd)
    return data, decode_command(data)


def _commit_request_files(request: Mapping[str, object]) -> int:
    """How many file entries a commit request names (0 for a malformed one: its check, on the
    loop, refuses it at once)."""
    writes = request.get("writes")
    if not isinstance(writes, list):
        return 0
    count = 0
    for write in writes:
        if isinstance(write, dict):
            for key in ("add", "remove"):
                entries = write.get(key)
                if isinstance(entries, list):
                    count += len(entries)
    return count


class ApiServer:
    def __init__(
        self,
        *,
        node: RaftNode,
        sm: CatalogStateMachine,
        clock: HybridClock,
        secrets: Secrets,
        forwarder: LeaderForwarder,
        metrics: NodeMetrics,
        cluster_id: str,
        client_addresses: Mapping[int, str],
        warehouse: str = "",
        allowed_locations: AllowedLocations = ANYWHERE,
        session_ttl_ms: int = mlimits.SESSION_TTL_MS_DEFAULT,
        session_heartbeat_ms: int = mlimits.SESSION_HEARTBEAT_MS_DEFAULT,
        gc: GcWorker | None = None,
        connections_max: int = L.CLIENT_CONNECTIONS_MAX,
        audit: AuditLog | None = None,
        tls: ssl.SSLContext | None = None,
        tls_client_cert_required: bool = False,
        loose_files_max: int = mlimits.LOOSE_FILES_MAX_DEFAULT,
        read_staleness_max_ms: int = L.READ_STALENESS_MAX_MS_DEFAULT,
        own_cert_fingerprint: str = "",
        export_spool_dir: Path | None = None,
    ) -> None:
        """`export_spool_dir`: where `snapshot save` exports are spooled (mapped, their files
        deleted at once) instead of held on the heap.
        `tls`: serve the client port over TLS with this server context (raft.tls);
        `tls_client_cert_required`: refuse, at hello, a client that presented no certificate
        (the context verifies those presented). `read_staleness_max_ms`: see
        `_check_fresh_for_files`. `allowed_locations`: where new tables may live, checked
        before this node proposes a CreateTable as the leader (`_check_location_allowed`); a
        node's config always passes it (the default allows any location)."""
        self.node = node
        self.tls = tls
        self.tls_client_cert_required = tls_client_cert_required
        # This node's own peer/client-port certificate (for remove_node of this very node).
        self.own_cert_fingerprint = own_cert_fingerprint
        # Open client connections that presented a certificate -> (session, requests in flight).
        self._cert_writers: dict[asyncio.StreamWriter, tuple[Session, set[asyncio.Task[None]]]] = {}
        # Closes of revoked connections waiting for their in-flight replies (kept referenced).
        self._revoked_closes: set[asyncio.Task[None]] = set()
        # Requests that run to their end whatever their caller does (`_run_detached`), each
        # named for what it does; a stop waits for them a little (`stop`).
        self._detached: set[asyncio.Task[Any]] = set()
        self.loose_files_max = loose_files_max
        self.read_staleness_max_ms = read_staleness_max_ms
        self.gc = gc
        self.exports = SnapshotExports(spool_dir=export_spool_dir)
        self.sm = sm
        self.clock = clock
        # Steps of this node's wall clock, for the DDL's wait (clock_steps.py); the node takes
        # a first reading when it starts, so a step before the first DDL is seen too.
        self.clock_steps = ClockStepWatch()
        self.secrets = secrets
        self.forwarder = forwarder
        self.metrics = metrics
        self.removal_check = RemovalCheck()
        self.cluster_id = cluster_id
        self.client_addresses = dict(client_addresses)
        self.warehouse = warehouse
        self.allowed_locations = allowed_locations
        self.session_ttl_ms = session_ttl_ms
        self.session_heartbeat_ms = session_heartbeat_ms
        self.connections_max = connections_max
        self.audit = audit or AuditLog(None, node_id=node.node_id)
        self._server: asyncio.Server | TlsListener | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # Connections that have not authenticated yet: id(session) -> (connected at, writer).
        self._strangers: dict[int, tuple[float, asyncio.StreamWriter]] = {}
        # Warnings about refused first requests left out over the refusal budget (audit.py),
        # counted in the next one logged.
        self._refusal_warnings_left_out = 0
        # Every open connection's outgoing replies (for the reply backlog metrics).
        self._replies: set[_Replies] = set()
        ops: dict[str, _Op] = {
            "hello": _Op(Role.READER, self._hello, frozenset({"token", "client"})),
            "schema_at": _Op(
                Role.READER, self._schema_at, frozenset({"table", "ts", "timeout_ms"})
            ),
            "describe": _Op(
                Role.READER, self._describe, frozenset({"table", "as_of", "timeout_ms"})
            ),
            "history": _Op(
                Role.READER,
                self._history,
                frozenset({"table", "limit", "page_token", "timeout_ms"}),
            ),
            "list_namespaces": _Op(
                Role.READER,
                self._list_namespaces,
                frozenset({"as_of", "limit", "page_token", "timeout_ms"}),
            ),
            "list_tables": _Op(
                Role.READER,
                self._list_tables,
                frozenset({"namespace", "as_of", "limit", "page_token", "timeout_ms"}),
            ),
            "safe_time": _Op(Role.READER, self._safe_time, frozenset()),
            "status": _Op(Role.READER, self._status, frozenset()),
            "files": _Op(
                Role.READER,
                self._files,
                frozenset({"table", "as_of", "min_ts", "limit", "page_token", "timeout_ms"}),
            ),
            "files_multi": _Op(
                Role.READER,
                self._files_multi,
                frozenset({"tables", "as_of", "min_ts", "limit", "timeout_ms"}),
            ),
            "compaction_view": _Op(
                Role.READER, self._compaction_view, frozenset({"table", "limit", "page_token"})
            ),
            "compact_manifest": _Op(
                Role.WRITER,
                self._compact_manifest,
                frozenset(
                    {
                        "table",
                        "table_id",
                        "loose_count",
                        "loose_digest",
                        "deletes_count",
                        "deletes_digest",
                        "replaces",
                        "adds",
                        "request_id",
                        "timeout_ms",
                    }
                ),
            ),
            "txn_log": _Op(
                Role.READER,
                self._txn_log,
                frozenset({"limit", "page_token", "min_ts", "timeout_ms"}),
            ),
            "committed_txn": _Op(
                Role.READER, self._committed_txn, frozenset({"txn_id", "stream", "timeout_ms"})
            ),
            "read_ts": _Op(Role.READER, self._read_ts, frozenset({"timeout_ms"})),
            "ddl": _Op(Role.WRITER, self._ddl, frozenset({"sql", "request_id", "timeout_ms"})),
            "commit": _Op(
                Role.WRITER,
                self._commit,
                frozenset(
                    {
                        "txn_id",
                        "writes",
                        "ts",
                        "not_before",
                        "read_ts",
                        "read_tables",
                        "stream",
                        "seq",
                        "request_id",
                        "timeout_ms",
                    }
                ),
            ),
            "pin": _Op(
                Role.READER,
                self._pin,
                frozenset(
                    {
                        "tables",
                        "ts",
                        "session_id",
                        "reads",
                        "read_ts",
                        "known_tm",
                        "renew_from",
                        "timeout_ms",
                    }
                ),
            ),
            "session_open": _Op(
                Role.WRITER,
                self._session_open,
                frozenset(
                    {
                        "session_id",
                        "app_id",
                        "app_name",
                        "host",
                        "user",
                        "pid",
                        "started_at_ms",
                        "ttl_ms",
                        "timeout_ms",
                    }
                ),
            ),
            "session_heartbeat": _Op(
                Role.WRITER, self._session_heartbeat, frozenset({"session_id", "timeout_ms"})
            ),
            "session_close": _Op(
                Role.WRITER, self._session_close, frozenset({"session_id", "timeout_ms"})
            ),
            "session_expire": _Op(
                Role.ADMIN, self._session_expire, frozenset({"session_ids", "timeout_ms"})
            ),
            "session_list": _Op(
                Role.READER,
                self._session_list,
                frozenset({"all", "limit", "page_token", "timeout_ms"}),
            ),
            "lease_acquire": _Op(
                Role.WRITER,
                self._lease_acquire,
                frozenset({"session_id", "leases", "read_ts", "timeout_ms"}),
            ),
            "lease_release": _Op(
                Role.WRITER,
                self._lease_release,
                frozenset({"session_id", "leases", "known_tm", "timeout_ms"}),
            ),
            "lease_list": _Op(
                Role.READER,
                self._lease_list,
                frozenset({"table", "limit", "page_token", "timeout_ms"}),
            ),
            "lease_blockers": _Op(
                Role.READER,
                self._lease_blockers,
                frozenset({"table", "limit", "page_token", "timeout_ms"}),
            ),
            "pts_protect": _Op(
                Role.WRITER,
                self._pts_protect,
                frozenset(
                    {
                        "record_id",
                        "ts",
                        "tables",
                        "namespaces",
                        "cluster",
                        "meta_type",
                        "meta",
                        "max_age_ms",
                        "session_id",
                        "timeout_ms",
                    }
                ),
            ),
            "pts_release": _Op(
                Role.WRITER, self._pts_release, frozenset({"record_id", "timeout_ms"})
            ),
            "pts_list": _Op(
                Role.READER, self._pts_list, frozenset({"all", "limit", "page_token", "timeout_ms"})
            ),
            "pts_show": _Op(Role.READER, self._pts_show, frozenset({"record_id"})),
            "gc_status": _Op(
                Role.READER,
                self._gc_status,
                frozenset({"table", "limit", "page_token", "timeout_ms"}),
            ),
            "gc_run": _Op(Role.ADMIN, self._gc_run, frozenset({"table", "dry_run", "timeout_ms"})),
            "watch": _Op(
                Role.READER,
                self._watch,
                frozenset(
                    {
                        "from_ts",
                        "from_event",
                        "table",
                        "namespace",
                        "limit",
                        "wait_ms",
                        "timeout_ms",
                    }
                ),
            ),
            "job_list": _Op(
                Role.READER,
                self._job_list,
                frozenset({"table", "all", "limit", "page_token", "timeout_ms"}),
            ),
            "job_show": _Op(Role.READER, self._job_show, frozenset({"job_id"})),
            "job_cancel": _Op(Role.WRITER, self._job_cancel, frozenset({"job_id", "timeout_ms"})),
            "job_backfilled": _Op(
                Role.WRITER,
                self._job_backfilled,
                frozenset({"job_id", "snapshot_ts", "files_rewritten", "timeout_ms"}),
            ),
            "snapshot_begin": _Op(Role.ADMIN, self._snapshot_begin, frozenset({"timeout_ms"})),
            "snapshot_chunk": _Op(
                Role.ADMIN, self._snapshot_chunk, frozenset({"export_id", "offset"})
            ),
            # Internal: a follower forwards a parsed, canonical command to the leader.
            "_propose": _Op(Role.WRITER, self._propose_op, frozenset({"command", "timeout_ms"})),
            "add_node": _Op(
                Role.ADMIN,
                self._add_node,
                frozenset({"node_id", "raft_address", "client_address", "learner", "timeout_ms"}),
            ),
            "promote_node": _Op(
                Role.ADMIN, self._promote_node, frozenset({"node_id", "timeout_ms"})
            ),
            "remove_node": _Op(Role.ADMIN, self._remove_node, frozenset({"node_id", "timeout_ms"})),
            "cert_revoke": _Op(
                Role.ADMIN,
                self._cert_revoke,
                frozenset({"fingerprint", "node_id", "force", "request_id", "timeout_ms"}),
            ),
            "cert_revoked": _Op(Role.READER, self._cert_revoked, frozenset()),
            "transfer_leader": _Op(Role.ADMIN, self._transfer_leader, frozenset({"target"})),
            "apply_version": _Op(Role.READER, self._apply_version, frozenset({"timeout_ms"})),
            "apply_version_finalize": _Op(
                Role.ADMIN,
                self._apply_version_finalize,
                frozenset({"version", "request_id", "timeout_ms"}),
            ),
        }
        # Reads that take the client's read floor (`min_ts`; `files` and `files_multi` list it
        # above): `schema_at` raises its now to it (`_at`), the others first wait for safe time
        # to reach it (`_reach_read_floor`).
        self._ops = {
            op: replace(spec, args=spec.args | {"min_ts"})
            if op in L.STATE_FLOOR_OPS or op == "schema_at"
            else spec
            for op, spec in ops.items()
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int) -> None:
        if self.tls is not None:
            # Plaintext connections are handed over too, so their hello gets TLS_REQUIRED
            # (a typed error the client can show) instead of a reset.
            listener = TlsListener(
                self._on_connect,
                self.tls,
                handshake_timeout_s=L.CLIENT_HELLO_TIMEOUT_MS / 1000,
                on_refused=self._on_tls_refused,
                read_limit_bytes=L.CLIENT_READ_CHUNK_BYTES,
                plaintext_ok=True,
                logger=log,
            )
            await listener.start(host, port)
            self._server = listener
            return
        self._server = await asyncio.start_server(
            self._on_connect, host, port, limit=L.CLIENT_READ_CHUNK_BYTES
        )

    def _on_tls_refused(self, peer: str, reason: str) -> None:
        self.metrics.request("connect", "TLS_FAILED", 0.0)
        log.warning("refused client %s: %s", peer, reason)

    @property
    def bound_port(self) -> int:
        if self._server is None or not self._server.sockets:
            return 0
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(
        self,
        *,
        detached_grace_ms: int = L.DETACHED_WORK_STOP_GRACE_MS,
        cut_short: asyncio.Event | None = None,
    ) -> None:
        """Close the port and every connection, then give the requests that run to their end
        detached (`_run_detached`) up to `detached_grace_ms` to end (the node's Raft and
        forwarder still run meanwhile: a removal needs them for its revocation), and cancel
        those left, with a warning naming them. `cut_short` set ends the grace early (SIGINT
        during a SIGTERM's stop); a stop that must not wait passes 0."""
        if self._server is not None:
            self._server.close()
        for t in list(self._connections):
            t.cancel()
        for t in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self._let_detached_finish(detached_grace_ms, cut_short)
        for work in list(self._detached):
            log.warning(
                "stopping: cancelled %s, still running after the %d ms grace; what it "
                "changed is unknown (check `metastore cluster status`; a removal's "
                "certificate may need `cert_revoke`)",
                work.get_name(),
                detached_grace_ms,
            )
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
        for t in list(self._revoked_closes):  # each aborts its connection as it ends
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self.audit.close()

    async def _let_detached_finish(self, grace_ms: int, cut_short: asyncio.Event | None) -> None:
        """Wait until the detached work running now ends, `grace_ms` passes, or `cut_short`
        is set, whichever comes first. Cancels none of it."""
        running = set(self._detached)
        if not running or grace_ms <= 0 or (cut_short is not None and cut_short.is_set()):
            return
        log.info("stopping: waiting up to %d ms for %d detached request(s)", grace_ms, len(running))
        # Waiting on asyncio.wait (not on the work itself), so ending the wait cancels no work.
        all_ended = asyncio.ensure_future(asyncio.wait(running))
        hurry = asyncio.ensure_future(
            asyncio.Event().wait() if cut_short is None else cut_short.wait()
        )
        try:
            await asyncio.wait(
                {all_ended, hurry}, timeout=grace_ms / 1000, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in (all_ended, hurry):
                waiter.cancel()

    # ------------------------------------------------------------------ connections

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        full = len(self._connections) >= self.connections_max
        # Evicted connections leave asynchronously, so a burst may pass the limit by a little.
        room = len(self._connections) < self.connections_max + L.CLIENT_CONNECTIONS_SLACK
        if full and self._strangers and room:
            # Make room by closing the oldest connection that has not authenticated: a flood
            # of idle connections must not lock out the clients that hold a token.
            oldest = min(self._strangers, key=lambda k: self._strangers[k][0])
            _, stranger = self._strangers.pop(oldest)
            self.metrics.request("connect", "EVICTED", 0.0)
            stranger.transport.abort()
        elif full:
            self.metrics.request("connect", "LIMIT_EXCEEDED", 0.0)
            try:
                writer.write(self._error_frame(0, _too_many_connections(self.connections_max)))
            except RuntimeError as exc:
                # uvloop refuses a write on a connection the client already closed: it ended
                # (counted above), which is no error of ours.
                log.debug("client connection closed before its refusal could be sent: %s", exc)
            else:
                with contextlib.suppress(Exception):
                    await writer.drain()
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            # `stop` cancels every connection, and the connection ends here: not re-raised,
            # since this task is asyncio's stream callback task, whose done callback calls
            # `task.exception()`, which raises for a cancelled task (an error record with a
            # traceback per connected client at every node stop).
            return
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        session = Session(
            peer=str(peername),
            tls=ssl_object is not None,
            client_cert=bool(writer.get_extra_info("peercert")),
            cert_fingerprint=fingerprint_of_der(der) if der else "",
        )
        # A stranger's first frame gets the hello's item budget; `_serve_session` widens it
        # once the hello succeeded (a frame of tiny items costs far more than its bytes).
        decoder = FrameDecoder(
            max_frame_bytes=L.CLIENT_FRAME_BYTES_MAX, max_items=L.CLIENT_HELLO_ITEMS_MAX
        )
        key = id(session)
        hello_deadline = time.monotonic() + L.CLIENT_HELLO_TIMEOUT_MS / 1000
        self._strangers[key] = (time.monotonic(), writer)
        inflight: set[asyncio.Task[None]] = set()
        if session.cert_fingerprint:
            self._cert_writers[writer] = (session, inflight)
        session.close_soon = lambda: self._close_soon(writer)
        try:
            await self._serve_session(session, decoder, reader, writer, hello_deadline, inflight)
        finally:
            self._strangers.pop(key, None)
            self._cert_writers.pop(writer, None)

    def close_revoked_clients(self) -> int:
        """Close the client connections whose certificate is revoked now (after the list grew).

        Such a connection reads and runs nothing more at once; it is aborted as soon as the
        requests it already had in flight have replied (at most REVOKED_CLIENT_REPLY_GRACE_MS).
        One of them may be the request that revoked the certificate: a member forwards a
        client's `cert_revoke` to the leader over a connection that presents the member's own
        certificate, so revoking that member's certificate through it used to cut the reply off
        (the client saw UNAVAILABLE "connection to the leader closed", outcome unknown, though
        the revocation was applied)."""
        closed = 0
        for writer, (session, inflight) in list(self._cert_writers.items()):
            fingerprint = session.cert_fingerprint
            if self.sm.state.revoked.is_revoked(fingerprint):
                del self._cert_writers[writer]
                session.revoked = True
                if isinstance(writer.transport, asyncio.ReadTransport):
                    writer.transport.pause_reading()
                running = {t for t in inflight if not t.done()}
                # Even with nothing running: a request that finished this turn may have its
                # reply in a flush callback still (see `_Replies.send`).
                close = asyncio.create_task(self._abort_after(writer, running))
                self._revoked_closes.add(close)
                close.add_done_callback(self._revoked_closes.discard)
                closed += 1
                self.metrics.request("connect", "CERT_REVOKED", 0.0)
                log.warning(
                    "closed a client connection: its TLS certificate (sha256 %s) is revoked",
                    fingerprint,
                )
        return closed

    @staticmethod
    async def _abort_after(writer: asyncio.StreamWriter, running: set[asyncio.Task[None]]) -> None:
        """Abort a revoked connection once `running` (its requests in flight when its
        certificate was revoked) are done and their replies have left, or after
        REVOKED_CLIENT_REPLY_GRACE_MS in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + L.REVOKED_CLIENT_REPLY_GRACE_MS / 1000
        try:
            if running:
                await asyncio.wait(running, timeout=deadline - loop.time())
            # A finished request's reply is flushed by a callback it scheduled before it
            # finished (see `_Replies.send`); one more turn lets it run first.
            await asyncio.sleep(0)
            # A request is done once its reply is handed to the transport, not once it left:
            # an abort drops what the transport still buffers (a large reply is cut short).
            # A close sends the buffered bytes first, then closes (the rest of the grace).
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), max(0.0, deadline - loop.time()))
        finally:
            writer.transport.abort()

    async def _serve_session(
        self,
        session: Session,
        decoder: FrameDecoder,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello_deadline: float,
        inflight: set[asyncio.Task[None]],
    ) -> None:
        partial_since: float | None = None
        replies = _Replies(writer)
        send = replies.send
        self._replies.add(replies)

        async def room_for_replies() -> bool:
            """Backpressure: read no request while this connection's queued replies are over
            CLIENT_REPLY_BYTES_PER_CONNECTION_MAX (requests in flight still reply)."""
            nonlocal partial_since
            if replies.queued_bytes() <= L.CLIENT_REPLY_BYTES_PER_CONNECTION_MAX:
                return True
            if not await replies.wait_for_room():
                if not writer.is_closing():  # else closed by us already (a revocation)
                    log.info("closing %s: it read none of its replies in time", session.peer)
                return False
            if partial_since is not None:
                # Its frame's bytes may have waited in the socket while nothing was read.
                partial_since = time.monotonic()
            return True

        try:
            while True:
                if session.role is not None and not await room_for_replies():
                    return
                if decoder.buffered_bytes:
                    partial_since = partial_since or time.monotonic()
                    left_s = L.CLIENT_FRAME_TIMEOUT_MS / 1000 - (time.monotonic() - partial_since)
                    if left_s <= 0:
                        log.info("closing %s: frame not completed in time", session.peer)
                        return
                    timeout_s = left_s
                else:
                    partial_since = None
                    timeout_s = L.CLIENT_IDLE_TIMEOUT_MS / 1000
                if session.role is None:
                    timeout_s = min(timeout_s, hello_deadline - time.monotonic())
                    if timeout_s <= 0:
                        log.info("closing %s: no hello in time", session.peer)
                        return
                try:
                    data = await asyncio.wait_for(reader.read(L.CLIENT_READ_CHUNK_BYTES), timeout_s)
                except TimeoutError:
                    if decoder.buffered_bytes or session.role is None:
                        return  # a half-sent frame or no hello: free the slot
                    queued = replies.queued_bytes()
                    if replies.took_bytes() or queued == 0:
                        if inflight or queued:
                            continue  # working, or its client still reads its replies
                        return  # idle
                    # Its socket took no byte of its replies for the idle time: the client
                    # stopped reading (its requests in flight could wait forever to reply).
                    log.info("closing %s: it read none of its replies in time", session.peer)
                    return
                if not data:
                    return
                decoder.feed(data)
                if session.role is None and decoder.buffered_bytes > L.CLIENT_HELLO_BYTES_MAX:
                    log.info("closing %s: more than a hello before authenticating", session.peer)
                    return
                while True:
                    if session.role is not None and not await room_for_replies():
                        return
                    try:
                        frame = decoder.next_frame()
                    except (MalformedFrameError, FrameTooLargeError) as exc:
                        await send(self._error_frame(0, BadRequestError(str(exc))))
                        self.metrics.request("frame", "BAD_REQUEST", 0.0)
                        return
                    if frame is NEED_DATA:
                        break
                    # A frame completed: the bound starts again for the next one (bytes of it
                    # may already be here; a busy client's buffer is seldom empty).
                    partial_since = None
                    if session.revoked:
                        break  # read before the revocation: not run (the close is under way)
                    if session.role is None:
                        # Authenticate inline: nothing else may run before hello succeeds.
                        reply, ok = await self._first_request(session, frame)
                        await send(reply)
                        if not ok:
                            return
                        self._strangers.pop(id(session), None)
                        decoder.max_items = L.CLIENT_REQUEST_ITEMS_MAX
                        continue
                    if len(inflight) >= L.CLIENT_INFLIGHT_PER_CONNECTION_MAX:
                        rid = frame.get("id", 0) if isinstance(frame, dict) else 0
                        await send(
                            self._error_frame(
                                rid if isinstance(rid, int) else 0,
                                LimitExceededError(
                                    f"more than {L.CLIENT_INFLIGHT_PER_CONNECTION_MAX} requests "
                                    "in flight on one connection",
                                    details={
                                        "limit": "CLIENT_INFLIGHT_PER_CONNECTION_MAX",
                                        "max": L.CLIENT_INFLIGHT_PER_CONNECTION_MAX,
                                    },
                                ),
                            )
                        )
                        continue
                    t = asyncio.create_task(self._run_request(session, frame, send))
                    inflight.add(t)
                    t.add_done_callback(inflight.discard)
        except (ConnectionError, OSError):
            return
        finally:
            replies.flush()  # e.g. the error reply sent just before closing
            self._replies.discard(replies)
            for t in inflight:
                t.cancel()

    def reply_backlog(self) -> dict[str, int]:
        """Client connections paused by their reply budget, and reply bytes queued on all
        connections and on the fullest one (`/metrics`)."""
        queued = [r.queued_bytes() for r in self._replies]
        return {
            "client_connections_paused": sum(1 for r in self._replies if r.paused),
            "client_reply_bytes_queued": sum(queued),
            "client_reply_bytes_queued_max": max(queued, default=0),
        }

    async def _first_request(self, session: Session, frame: object) -> tuple[bytes, bool]:
        started = time.perf_counter()
        rid, op = 0, "invalid"
        args: Args = {}

        def refuse(
            err: MetastoreError, code: str, audited: Mapping[str, Any], warning: str = ""
        ) -> bytes:
            # Every refused first request is audited (who tried, from where, why), not only
            # a wrong token: a malformed one, a plaintext client, a missing or revoked
            # certificate too. Within the audit log's budget for refusals, which `warning`
            # (for the operational log) shares: a stranger needs no token to be refused.
            ms = (time.perf_counter() - started) * 1000
            self.metrics.request(self._op_label(op), code, ms / 1000)
            client = args.get("client")
            recorded = self.audit.record(
                peer=session.peer,
                client=client[: L.CLIENT_NAME_CHARS_MAX] if isinstance(client, str) else "",
                role=None,
                token_name=None,
                op=op,
                args=audited,
                outcome=code,
                ms=ms,
            )
            if warning and recorded:
                left_out, self._refusal_warnings_left_out = self._refusal_warnings_left_out, 0
                more = f" ({left_out} refusals before it not logged)" if left_out else ""
                log.warning("refused client %s: %s%s", session.peer, warning, more)
            elif warning:
                self._refusal_warnings_left_out += 1
            return self._error_frame(rid, err)

        try:
            rid, op, args = _parse_request(frame)
        except MetastoreError as exc:
            return refuse(exc, exc.code.value, {}), False
        if self.tls is not None and not session.tls:
            err: MetastoreError = TlsRequiredError(
                "this node's client port requires TLS: connect with TLS and trust the cluster "
                "CA (CLI: --cacert FILE or METASTORE_CACERT)"
            )
            return refuse(err, err.code.value, {}, "plaintext connection to a TLS port"), False
        if self.tls_client_cert_required and not session.client_cert:
            err = TlsRequiredError(
                "this node's client port requires a client certificate signed by the cluster "
                "CA (CLI: --cert FILE --key FILE, or METASTORE_CERT / METASTORE_KEY)"
            )
            return refuse(err, err.code.value, {}, "no client certificate"), False
        if session.cert_fingerprint and self.sm.state.revoked.is_revoked(session.cert_fingerprint):
            err = TlsFailedError(
                f"this client's TLS certificate (sha256 {session.cert_fingerprint}) is revoked; "
                "use another certificate signed by the cluster CA",
                details={"fingerprint": session.cert_fingerprint},
            )
            return refuse(
                err,
                "CERT_REVOKED",
                {"fingerprint": session.cert_fingerprint},
                f"its TLS certificate (sha256 {session.cert_fingerprint}) is revoked",
            ), False
        if op != "hello":
            err = UnauthenticatedError("the first request must be 'hello'")
            return refuse(err, err.code.value, {}), False
        try:
            _check_args(args, self._ops["hello"].args)
            result = await self._hello(session, args)
        except MetastoreError as exc:
            return refuse(exc, exc.code.value, {}, str(exc)), False
        self.metrics.request(self._op_label(op), "OK", time.perf_counter() - started)
        return self._reply_frame(rid, result), True

    async def _run_request(
        self, session: Session, frame: object, send: Callable[[bytes], Awaitable[None]]
    ) -> None:
        started = time.perf_counter()
        rid, op = 0, "invalid"
        args: Mapping[str, Any] = {}
        record: _RequestRecord | None = None
        try:
            rid, op, args = _parse_request(frame)
            spec = self._ops.get(op)
            if spec is None or op == "hello":
                raise UnknownOpError(f"unknown op {op!r}", details={"op": op})
            if session.role is not None and session.checked_against is not self.secrets:
                self._check_token_again(session)
            if session.role is None or session.role < spec.role:
                raise ForbiddenError(
                    f"op {op!r} needs role {spec.role.name.lower()}",
                    details={"op": op, "needed": spec.role.name.lower()},
                )
            _check_args(args, spec.args)
            if "timeout_ms" in spec.args:
                # Checked for every op that takes it, before anything runs: checked only where
                # an op waits, a wrong one (a string, 0, an hour) was refused by a follower and
                # taken by the leader, or refused only when a page token made a read wait.
                _timeout(args)
            if op in L.STATE_FLOOR_OPS:
                await self._reach_read_floor(args)
            record = _RequestRecord(session=session, op=op, args=args, started=started)
            _REQUEST_RECORD.set(record)  # this request's own task: its context alone
            result = await spec.handler(session, args)
            if op in _POSITION_REPLY_OPS and isinstance(result, dict):
                # The position the answer was read at, for the client's next floor. Taken
                # after the handler: at or above the state it read (a later read at or above
                # it shows nothing older).
                result.setdefault("safe_time", self.node.safe_time)
            try:
                frame_out = self._reply_frame(rid, result)
            except FrameTooLargeError as exc:
                # Lists that grow are paged (txn_log, watch, files...); this is a last guard,
                # for a reply no handler bounded: the caller is told to ask for less.
                raise LimitExceededError(
                    f"the reply to {op!r} does not fit one client frame ({exc}); ask for less "
                    "(a smaller 'limit', or pages)",
                    details={
                        "limit": "CLIENT_FRAME_BYTES_MAX",
                        "max": L.CLIENT_FRAME_BYTES_MAX,
                        "op": op,
                    },
                ) from None
            code = "OK"
        except MetastoreError as exc:
            frame_out, code = self._error_frame(rid, exc), exc.code.value
        except asyncio.CancelledError:
            # Its client closed the connection (or the node stops): no reply, but still a
            # record. The change may have happened all the same (a proposal in the log commits
            # whatever its caller does), and an audit log without it hid who made it. Steps
            # that run to their end detached (remove_node, gc_run) record it when they end.
            if record is None or not record.handed_over:
                self._count_and_audit(session, op, args, CANCELLED_OUTCOME, started)
            raise
        except Exception as exc:  # a bug: report it, keep serving others
            log.exception("internal error serving %s", op)
            frame_out = self._error_frame(rid, InternalError(f"{type(exc).__name__}: {exc}"))
            code = "INTERNAL"
        try:
            self._count_and_audit(session, op, args, code, started)
        except Exception:  # a bug: logged, and the request still gets its answer
            # Raised here, it ended the request's task before its reply: the client waited
            # out its timeout not knowing a write of it may have been applied (a summary of
            # arguments no handler had checked raised this way, twice).
            log.exception("recording %s (%s) failed", op, code)
        with contextlib.suppress(ConnectionError, OSError):
            await send(frame_out)
        if session.role is None and session.close_soon is not None:
            # Its token was revoked (`_check_token_again`): closed as a refused hello is,
            # once this reply has left.
            session.close_soon()
            session.close_soon = None

    def _count_and_audit(
        self, session: Session, op: str, args: Mapping[str, Any], code: str, started: float
    ) -> None:
        """The request's metric, and its audit record if its op is audited (audit.py)."""
        elapsed_s = time.perf_counter() - started
        self.metrics.request(self._op_label(op), code, elapsed_s)
        spec = self._ops.get(op)
        # A pin with a session leases: the writer's part of a reader op (docs/protocol.md).
        leases = op == "pin" and args.get("session_id") is not None
        if code == "FORBIDDEN" or leases or (spec is not None and spec.role >= Role.WRITER):
            self.audit.record(
                peer=session.peer,
                client=session.client,
                role=None if session.role is None else session.role.name.lower(),
                token_name=session.token_name or None,
                op=op,
                args=args,
                outcome=code,
                ms=elapsed_s * 1000,
            )

    def _close_soon(self, writer: asyncio.StreamWriter) -> None:
        close = asyncio.create_task(self._abort_after(writer, set()))
        self._revoked_closes.add(close)
        close.add_done_callback(self._revoked_closes.discard)

    def reload_tokens(self, secrets: Secrets) -> None:
        """Use `secrets` (tokens.json read again) for every hello and request from now on,
        on the connections already open too (`_check_token_again`)."""
        self.secrets = secrets

    def _check_token_again(self, session: Session) -> None:
        """tokens.json was reloaded since this connection's token was checked: its role is
        what the new list says. A token no longer in it is UNAUTHENTICATED, and the
        connection closes once that reply has left (a request read meanwhile is refused as a
        stranger's first request)."""
        record = self.secrets.record_for(session.token)
        if record is None:
            session.role = None
            session.checked_against = None
            raise UnauthenticatedError("this connection's token was revoked")
        session.role = record.role
        session.token_name = record.name
        session.checked_against = self.secrets

    def _op_label(self, op: str) -> str:
        """The `op` label of the request metric: a client may name any op, and each label
        value is a series kept for the life of the node, so names not in the op table are
        counted as "other"."""
        return op if op in self._ops else "other"

    def _reply_frame(self, rid: int, result: dict[str, Any]) -> bytes:
        reply = {
            "id": rid,
            "ok": True,
            "result": result,
            "error": None,
            "ts": self.clock.now(),
            "node_id": self.node.node_id,
        }
        return encode_frame(reply, max_frame_bytes=L.CLIENT_FRAME_BYTES_MAX)

    def _error_frame(self, rid: int, exc: MetastoreError) -> bytes:
        reply = {
            "id": rid,
            "ok": False,
            "result": None,
            "error": _brief_wire_error(exc),
            "ts": self.clock.now(),
            "node_id": self.node.node_id,
        }
        return encode_frame(reply, max_frame_bytes=L.CLIENT_FRAME_BYTES_MAX)

    # ------------------------------------------------------------------ guards

    def _require_ready(self) -> None:
        if not self.node.ready_to_serve:
            st = self.node.status()
            removed_at = self.node.removed_at_index
            reason = st.clock_fenced or (
                f"node {self.node.node_id} was removed from the cluster (at index {removed_at}) "
                "and applies nothing more: ask another node, and stop this one"
                if removed_at
                else "node is not caught up with the current leader yet"
            )
            raise NotReadyError(
                reason,
                details={
                    "node_id": self.node.node_id,
                    "leader": st.core.leader,
                    "applied_index": st.core.applied_index,
                    "clock_fenced": bool(st.clock_fenced),
                },
            )
        if self.sm.state.cluster is None:
            raise NotReadyError("cluster not initialized yet (the first leader initializes it)")

    def _dd(self) -> int:
        cluster = self.sm.state.cluster
        if cluster is None:
            raise ClusterNotInitializedError("cluster not initialized yet")
        return cluster.dd

    async def _wait_safe(self, ts: int, timeout_ms: int) -> float:
        """Wait until safe time >= ts. Returns the milliseconds waited.

        A node that is not applying its leader's entries (its safe time trails its clock by
        more than read_staleness_max_ms: cut off one way, it still hears its leader and stays
        ready) would wait out the caller's whole timeout and answer TIMEOUT, which clients
        raise as is: reads failed while other nodes could answer at once. So such a node does
        not wait (NOT_READY, which clients fail over), and a wait is taken in slices of that
        bound, each followed by the same check, so a node that stops applying while a read
        waits gives up after one slice rather than the caller's timeout. A node that is
        applying waits as long as the caller allows (a ts within CSmax ahead of the clocks).

        The wait running out means this node lags: CatchUpTimeoutError (TIMEOUT on the wire,
        with `details.reason` = "catch_up"), on which clients fail over to another node, as on
        NOT_READY. Both are sound only because nothing has been done yet: never call this
        after proposing."""
        if self.node.safe_time >= ts:
            return 0.0
        waited_ms = 0.0
        left_ms = timeout_ms
        # Bounded: each slice takes at least 1 ms of `left_ms`.
        while True:
            self._check_applying()
            slice_ms = max(1, min(left_ms, self.read_staleness_max_ms))
            try:
                return waited_ms + await self.node.wait_for_safe_time(ts, timeout_ms=slice_ms)
            except SafeTimeTimeoutError as exc:
                waited_ms += slice_ms
                left_ms -= slice_ms
                if left_ms <= 0:
                    raise CatchUpTimeoutError(
                        f"node {self.node.node_id} is behind: safe time "
                        f"{ts_text(exc.safe_time)} did not reach {ts_text(ts)} within "
                        f"{timeout_ms} ms (lagging {exc.lag_ms} ms)",
                        details={
                            "wanted": exc.wanted_ts,
                            "safe_time": exc.safe_time,
                            "lag_ms": exc.lag_ms,
                            "node_id": self.node.node_id,
                        },
                    ) from None
            except (NodeStoppedError, QueueFullError) as exc:
                # QueueFullError: SAFE_TIME_WAITERS_MAX reads already wait here; retryable.
                raise UnavailableError(str(exc)) from None

    def _check_applying(self) -> None:
        """NOT_READY (retryable: the client asks another node) when this node's safe time
        trails its clock by more than read_staleness_max_ms: it is not applying the leader's
        entries, so a read waiting for its safe time would wait in vain."""
        lag_ms = self.clock.physical_now_ms() - physical_ms(self.node.safe_time)
        if lag_ms > self.read_staleness_max_ms:
            raise NotReadyError(
                f"this node's safe time trails its clock by {lag_ms} ms, more than "
                f"read_staleness_max_ms={self.read_staleness_max_ms}: it is not applying the "
                "leader's entries, so it cannot answer for this timestamp soon; ask another node",
                details={
                    "node_id": self.node.node_id,
                    "safe_time_lag_ms": lag_ms,
                    "read_staleness_max_ms": self.read_staleness_max_ms,
                },
            )

    def _cs_max_ms(self) -> int:
        """CSmax as fixed by InitCluster for the whole cluster, never this node's config file:
        every node must wait and refuse by the same bound."""
        cluster = self.sm.state.cluster
        if cluster is None:
            raise ClusterNotInitializedError("cluster not initialized yet")
        return cluster.cs_max_ms

    def _check_not_future(self, ts: int, *, slack_ms: int = 0) -> None:
        cs_max_ms = self._cs_max_ms()
        ahead_ms = physical_ms(ts) - self.clock.physical_now_ms()
        if ahead_ms > cs_max_ms + slack_ms:
            # Retryable and routed around by clients: this node's clock may be the one behind.
            raise TimestampAheadError(
                f"timestamp {ts_text(ts)} is {ahead_ms} ms ahead of node {self.node.node_id}'s "
                f"clock (more than CSmax = {cs_max_ms} ms): this node cannot answer for it yet",
                details={
                    "ts": ts,
                    "ahead_ms": ahead_ms,
                    "cs_max_ms": cs_max_ms,
                    "node_id": self.node.node_id,
                },
            )

    async def _reach_read_floor(self, args: Args) -> None:
        """Before a read of the applied state without `as_of` (L.STATE_FLOOR_OPS): wait until
        this node's safe time reaches the client's read floor (`min_ts`: the newest position
        one of its reads answered at, maybe on a node further ahead), so the answer is never
        of an older state than one the client saw. Bounded like every wait for safe time
        (`timeout_ms`; a catch-up TIMEOUT or NOT_READY, on which clients ask another node). A
        floor is a safe time (the Tm of an applied entry, which a commit's ts may pass by DD),
        so one more than DD + CSmax ahead of this clock is refused (TIMESTAMP_AHEAD_OF_CLOCK,
        retryable). Without `min_ts`: nothing (the behaviour of earlier releases)."""
        floor = _opt_int(args, "min_ts", 0, MAX_TS)
        if floor is None or args.get("as_of") is not None or floor <= self.node.safe_time:
            return
        self._require_ready()
        self._check_not_future(floor, slack_ms=self._dd() >> LOGICAL_BITS)
        waited = await self._wait_safe(floor, _timeout(args))
        self.metrics.read_wait(waited / 1000, leader=self.node.is_leader())

    def _applied_position(self) -> int:
        """The position this node's state is at (its safe time: every entry with Tm <= it is
        applied). A page cut now (no await between this and reading the state) names it in
        its token."""
        return self.node.safe_time

    async def _continue_at(self, args: Args, where_chars_max: int) -> tuple[Args, int | None]:
        """For a paged list: wait until this node has applied up to the position the
        `page_token` was cut at (another node may have answered the previous page: one behind
        it would skip every row created in between), and return the arguments with the token
        replaced by where the previous page stopped, and the token's position (None without
        one, or for a token of the previous release). A token beyond CSmax of this node's
        clock is refused at once (retryable), as a read at such a timestamp is."""
        token = _opt_str(args, "page_token", where_chars_max + _POSITION_TOKEN_CHARS_MAX)
        if token is None:
            return args, None
        position, where = _split_position_token(token)
        if position is not None:
            self._check_not_future(position)
            await self._wait_safe(position, _timeout(args))
        return {**args, "page_token": where}, position

    async def _at(self, args: Args, key: str, *, floor: int | None = None) -> tuple[int, float]:
        """Resolve an optional timestamp argument and wait until it can be answered (safe time
        >= T - DD). Every schema-shaped read AS OF resolves everything only after this.

        Without the timestamp, `floor` (the client's read floor, `min_ts`: the newest now a read
        of this client answered at, maybe on a node whose clock is ahead of ours) raises the
        answer's now to it, so the client's reads never go back in time. A floor more than
        CSmax ahead of this clock is refused like such a timestamp (retryable: another node,
        or this one a little later, can answer)."""
        ts = _opt_int(args, key, 0, MAX_TS)
        if ts is None:
            # This node's own now: never "ahead of its clock", though its HLC may lead the
            # physical clock (it absorbs the Tm of entries it applies, which followers accept
            # up to 2 x CSmax ahead). Its answer is final once safe time covers it, as any.
            top = self.clock.now()
            if floor is not None and floor > top:
                self._check_not_future(floor)
                top = floor
        else:
            top = ts
            self._check_not_future(top)
        waited = await self._wait_safe(max(0, top - self._dd()), _timeout(args))
        self.metrics.read_wait(waited / 1000, leader=self.node.is_leader())
        return top, waited

    # ------------------------------------------------------------------ reads

    async def _hello(self, session: Session, args: Args) -> dict[str, Any]:
        token = _opt_str(args, "token", L.TOKEN_CHARS_MAX) or ""
        record = self.secrets.record_for(token) if token else None
        if record is None:
            raise UnauthenticatedError("missing or unknown token")
        role = record.role
        session.role = role
        session.token = token
        session.token_name = record.name
        session.checked_against = self.secrets
        session.client = _opt_str(args, "client", L.CLIENT_NAME_CHARS_MAX) or ""
        return {
            "node_id": self.node.node_id,
            "cluster_id": self.cluster_id,
            "role": role.name.lower(),
            "server_version": SERVER_VERSION,
            # This node takes a read floor (`min_ts`) on `schema_at` and on every read of
            # L.STATE_FLOOR_OPS: a client sends one only to nodes that say so, since a node
            # of an earlier release refuses an argument it does not know.
            "read_floor": True,
        }

    async def _schema_at(self, _s: Session, args: Args) -> dict[str, Any]:
        self._require_ready()
        table = _req_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        name = TableName.parse(table)  # bad input is refused before any wait
        top, waited = await self._at(args, "ts", floor=_opt_int(args, "min_ts", 0, MAX_TS))
        v = self.sm.state.schema_at(name, top)
        out = version_view(table, v)
        out.update({"ts": top, "waited_ms": waited, "safe_time": self.node.safe_time})
        return out

    async def _describe(self, _s: Session, args: Args) -> dict[str, Any]:
        """Without `as_of`: the live table now (its latest version). With `as_of`: wait first,
        then everything as of that time (incarnation, format, location, the version in force,
        versions active), so every node gives the same answer."""
        self._require_ready()
        table = _req_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        name = TableName.parse(table)  # bad input is refused before any wait
        if args.get("as_of") is None:
            return description_view(self.sm.state.describe(name))
        top, waited = await self._at(args, "as_of")
        desc = description_view(self.sm.state.describe_at(name, top))
        desc.update({"as_of": top, "waited_ms": waited})
        return desc

    async def _history(self, _s: Session, args: Args) -> dict[str, Any]:
        """Every schema version of the live table, oldest first, keyset-paged by version
        (`limit`, `page_token`): each version carries its whole schema, so a wide table's
        history outgrows one frame. A caller that asks for no page gets LIMIT_EXCEEDED when
        it does not fit one reply.

        The list is the one at the position (an applied safe time) of its first page: the
        token carries it with the table id and the last version shown. The next page may be
        asked of another node: one that has not applied that far waits until it has (it
        would end the list early, without the newer versions), and one further ahead leaves
        out the versions made after it, so every node gives the same list for one token."""
        self._require_ready()
        table = _req_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        TableName.parse(table)  # bad input is refused before any wait
        limit = _opt_int(args, "limit", 1, L.HISTORY_PAGE_VERSIONS_MAX)
        args, position = await self._continue_at(args, 64)
        token = args.get("page_token")
        if position is None:
            # The first page (or a token of the previous release): this node's state now.
            position = self._applied_position()
        if token is None:
            versions = self.sm.state.history(table)
            table_id = versions[0].table_id
            after = 0
        else:
            id_text, _, version_text = token.partition(":")
            if not (_is_uint(id_text) and _is_uint(version_text)):
                raise _not_our_token(token)
            table_id = int(id_text)
            versions = self._history_at(table, table_id, position)
            after = int(version_text)
        rest = [v for v in versions if after < v.version and v.tm <= position]
        count_max = limit or L.HISTORY_PAGE_VERSIONS_MAX
        page, size = _views_within(
            rest,
            lambda v: version_view(table, v),
            count_max=count_max,
            bytes_max=L.HISTORY_PAGE_BYTES_MAX,
        )
        more = len(page) < len(rest)
        if more and limit is None and token is None:
            raise limit_exceeded(
                "HISTORY_PAGE_BYTES_MAX",
                L.HISTORY_PAGE_BYTES_MAX,
                size,
                f"versions of {table} in one reply (page with 'limit' and 'page_token')",
            )
        where = f"{table_id}:{page[-1]['version']}" if more else None
        return {"versions": page, "next_page_token": _position_token(position, where)}

    def _history_at(self, table: str, table_id: int, position: int) -> tuple[SchemaVersion, ...]:
        """The versions of incarnation `table_id` of `table` as its history was at `position`:
        the first page found it live there, so a node that has applied its DROP since (and
        maybe a new CREATE of the name) still answers the later pages from it. Dropped
        incarnations stay in the catalog (for reads AS OF), so this needs no apply change."""
        name = TableName.parse(table)
        for incarnation in self.sm.state.catalog.incarnations(name):
            if incarnation.table_id != table_id:
                continue
            if incarnation.dropped_tm is not None and incarnation.dropped_tm <= position:
                break  # dropped before the position: not the history this token continues
            return incarnation.versions
        raise TableNotFoundError(
            f"table {table} with id {table_id} did not exist at the page's position "
            f"{ts_text(position)}; read its history again",
            details={"table": table, "table_id": table_id, "position": position},
        )

    async def _list_namespaces(self, _s: Session, args: Args) -> dict[str, Any]:
        """Live namespaces now, or (with `as_of`, after the wait) those existing then, by
        name. Keyset-paged (`limit`, `page_token` = the created_tm and name of the previous
        page's last one): a namespace carries its comment and DBPROPERTIES (up to a 64 KiB
        statement's worth), so pages end past NAMESPACES_PAGE_BYTES_MAX too. A caller that
        asks for no page gets LIMIT_EXCEEDED when they do not fit one reply."""
        self._require_ready()
        limit = _opt_int(args, "limit", 1, L.NAMESPACES_PAGE_MAX)
        args, _ = await self._continue_at(args, 32 + mlimits.MAX_IDENTIFIER_CHARS)
        token = args.get("page_token")
        after: tuple[str, int] | None = None
        if token is not None:
            tm_text, _, name = token.partition(":")
            if not _is_uint(tm_text) or not name:
                raise _not_our_token(token)
            after = (name, int(tm_text))
        top: int | None = None
        waited = 0.0
        if args.get("as_of") is not None:
            top, waited = await self._at(args, "as_of")
        position = self._applied_position()
        # By name, then incarnation (one name may have two that exist at `as_of`).
        rest = [
            n
            for n in self.sm.state.list_namespaces(top=top)
            if after is None or (n.name, n.created_tm) > after
        ]
        count_max = limit or L.NAMESPACES_PAGE_MAX
        page, _ = _views_within(
            rest, namespace_view, count_max=count_max, bytes_max=L.NAMESPACES_PAGE_BYTES_MAX
        )
        more = len(page) < len(rest)
        if more and limit is None and token is None:
            raise limit_exceeded(
                "NAMESPACES_PAGE_MAX",
                L.NAMESPACES_PAGE_MAX,
                len(rest),
                "namespaces in one reply (page with 'limit' and 'page_token')",
            )
        last = page[-1] if page else None
        result: dict[str, Any] = {
            "namespaces": page,
            "next_page_token": _position_token(
                position, f"{last['created_tm']}:{last['name']}" if more and last else None
            ),
        }
        if top is not None:
            result.update(as_of=top, waited_ms=waited)
        return result

    async def _list_tables(self, _s: Session, args: Args) -> dict[str, Any]:
        """Live tables of a live namespace now, or (with `as_of`, after the wait) the tables
        existing then in the namespace existing then. Without `namespace`: the tables of every
        namespace, the same way. Keyset-paged by full name (`limit`, `page_token`)."""
        self._require_ready()
        ns = _opt_str(args, "namespace", mlimits.MAX_IDENTIFIER_CHARS)
        args, _ = await self._continue_at(args, L.TABLE_NAME_CHARS_MAX)
        top: int | None = None
        waited = 0.0
        if args.get("as_of") is not None:
            top, waited = await self._at(args, "as_of")
        position = self._applied_position()
        state = self.sm.state
        if ns is not None:
            names = [str(t) for t in state.list_tables(ns, top=top)]
        else:
            namespaces = {n.name for n in state.list_namespaces(top=top)}
            names = sorted(
                str(t) for namespace in namespaces for t in state.list_tables(namespace, top=top)
            )
        page, next_token = _keyset_page(
            names,
            key=lambda name: name,
            args=args,
            page_max=L.TABLES_PAGE_MAX,
            limit_name="TABLES_PAGE_MAX",
            what="tables",
            token_chars_max=L.TABLE_NAME_CHARS_MAX,
        )
        result: dict[str, Any] = {
            "tables": page,
            "next_page_token": _position_token(position, next_token),
        }
        if top is not None:
            result.update(as_of=top, waited_ms=waited)
        return result

    async def _files(self, _s: Session, args: Args) -> dict[str, Any]:
        """The files live in `table` at `as_of` (default: this node's safe time, which needs no
        wait). Data reads need safe time >= T itself (not T - DD): a commit is visible at its
        own timestamp, and only once safe time passes T can no later entry commit at <= T."""
        self._require_ready()
        table = _req_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        TableName.parse(table)  # bad input is refused before any wait
        ts = _opt_int(args, "as_of", 0, MAX_TS)
        token = _opt_str(args, "page_token", 96)
        if token is not None:
            # A page token pins the listing's timestamp: every page comes from one moment.
            ts = _page_token(token)[0]
        ts, waited = await self._data_read_ts(ts, args)
        state = self.sm.state
        version = state.schema_at(table, ts)
        listing = state.listing_at(table, ts)
        files = listing.files
        # Loose files, then delete entries, page through one sequence (both bounded in number,
        # each item costs its path); the manifest references ride on the first page.
        items: list[Any] = [*files, *listing.deletes]
        if token is not None:
            _check_token_table(token, table, version.table_id)
            _check_listing_unchanged(token, table, len(items))
        start, end = _files_page(items, args, ts)
        page = items[start:end]
        return {
            "table": table,
            "table_id": version.table_id,
            "as_of": ts,
            "version": version.version,
            "location": version.location,
            "files": [file_view(f) for f in page[: max(0, len(files) - start)]],
            "deletes": [[d.path, d.removed_ts] for d in page[max(0, len(files) - start) :]],
            "manifests": [m.to_view() for m in listing.manifests] if start == 0 else [],
            # Totals of the whole listing at `as_of`, whichever page this is. With manifests
            # they count loose files only: the client's expansion gives the full totals.
            "total_files": len(files),
            "total_manifests": len(listing.manifests),
            "total_deletes": len(listing.deletes),
            "rows": sum(f.row_count for f in files),
            "size_bytes": sum(f.size_bytes for f in files),
            "next_page_token": (
                _files_token(ts, end, len(items), version.table_id) if end < len(items) else None
            ),
            "waited_ms": waited,
        }

    async def _data_read_ts(self, ts: int | None, args: Args) -> tuple[int, float]:
        """The timestamp a file listing reads at, and how long it waited: this node's safe time
        when none is given (no wait), else `ts` once safe time has passed it.

        Without `as_of`, `min_ts` (the newest timestamp of the caller's own writes: a commit's
        ts, a DDL's Tu) makes the listing read-your-writes on any node: safe time is waited
        for up to `min_ts` first. A commit may land up to DD above the clock, so `min_ts` may
        be ahead by DD + CSmax, not only CSmax."""
        if ts is None:
            at_least = _opt_int(args, "min_ts", 0, MAX_TS)
            waited = 0.0
            if at_least is not None and at_least > self.node.safe_time:
                self._check_not_future(at_least, slack_ms=self._dd() >> LOGICAL_BITS)
                waited = await self._wait_safe(at_least, _timeout(args))
            self._check_fresh_for_files()
            return self.node.safe_time, waited
        self._check_not_future(ts)
        waited = await self._wait_safe(ts, _timeout(args))
        self._check_fresh_for_files()
        return ts, waited

    def _check_fresh_for_files(self) -> None:
        """Refuse a file listing (retryable NOT_READY) when this node's safe time trails its
        clock by more than read_staleness_max_ms. The leader's GC deletes a file only that long
        plus CSmax after the entry that freed it (gc_worker), so a node serving a listing has
        applied every such entry (safe time is the Tm of its last applied entry) and refuses a
        read below its GC threshold instead of listing deleted files. Without this, a follower
        that still hears its leader but whose acknowledgements are lost (a one-way partition)
        stops applying yet stays ready, and answers old reads from before the GC. Called with
        no await between it and the listing."""
        lag_ms = self.clock.physical_now_ms() - physical_ms(self.node.safe_time)
        if lag_ms > self.read_staleness_max_ms:
            raise NotReadyError(
                f"this node's safe time trails its clock by {lag_ms} ms, more than "
                f"read_staleness_max_ms={self.read_staleness_max_ms}: it is not applying the "
                "leader's entries, so it may have missed a GC threshold; ask another node",
                details={
                    "node_id": self.node.node_id,
                    "safe_time_lag_ms": lag_ms,
                    "read_staleness_max_ms": self.read_staleness_max_ms,
                },
            )

    async def _files_multi(self, _s: Session, args: Args) -> dict[str, Any]:
        """The first page of `files` for each of several tables, all at one `as_of`, after one
        wait: a batch reading N tables lists them in one round trip instead of N. The page
        budget (`limit` files, FILES_PAGE_BYTES_MAX bytes of paths and manifest references) is
        shared by the tables in the order given; a table the budget did not cover gets a
        `next_page_token` to continue with `files` (of its first page, which carries the
        manifest references, if they did not fit), so no reply outgrows a frame whatever the
        tables hold. The request is
        validated whole (1..MAX_TABLES_PER_COMMIT distinct names) before anything is read; a
        table that cannot be listed at `as_of` (not found then, before its GC threshold, a bad
        name) gets its typed error as data in its own listing (`error`, the wire form), so one
        table's failure does not fail the others' listings."""
        self._require_ready()
        tables = _req_str_list(
            args, "tables", mlimits.MAX_TABLES_PER_COMMIT, "MAX_TABLES_PER_COMMIT"
        )
        if len(set(tables)) != len(tables):
            raise BadRequestError("'tables' lists a table twice")
        limit = _opt_int(args, "limit", 1, L.FILES_PAGE_FILES_MAX) or L.FILES_PAGE_FILES_MAX
        ts, waited = await self._data_read_ts(_opt_int(args, "as_of", 0, MAX_TS), args)
        state = self.sm.state
        count_left, bytes_left = limit, L.FILES_PAGE_BYTES_MAX
        spent = False  # anything (a file, a delete entry, a manifest reference) shipped yet
        listings: list[dict[str, Any]] = []
        for table in tables:
            try:
                version = state.schema_at(table, ts)
                listing = state.listing_at(table, ts)
            except MetastoreError as exc:
                listings.append({"table": table, "error": exc.to_wire()})
                continue
            # As in `files`: loose files, then delete entries, page through one sequence, and
            # the manifest references ride on the first page. They count against the budget
            # too (a table holds up to MAX_MANIFESTS_PER_TABLE of them): a table whose
            # references do not fit what is left gets none of its listing here, only a token
            # of its first page, so `files` ships them (once: only its first page has them).
            files = listing.files
            items: list[Any] = [*files, *listing.deletes]
            manifests = [m.to_view() for m in listing.manifests]
            manifests_size = len(msgpack.packb(manifests, use_bin_type=True)) if manifests else 0
            if count_left == 0 or (manifests_size > bytes_left and spent):
                count_left, manifests = 0, []
            elif manifests:
                bytes_left, spent = bytes_left - manifests_size, True
            end = 0
            while end < len(items) and count_left > 0:
                size = len(items[end].path) + L.FILES_ENTRY_OVERHEAD_BYTES
                # The first item of the whole reply always fits (as in `files`), and so does
                # a table's first after its manifests: its next page must not start at 0.
                if size > bytes_left and spent and not (end == 0 and manifests):
                    count_left = 0  # the budget is spent: later tables continue with `files`
                    break
                bytes_left -= size
                count_left -= 1
                end += 1
                spent = True
            listings.append(
                {
                    "table": table,
                    "table_id": version.table_id,
                    "as_of": ts,
                    "version": version.version,
                    "location": version.location,
                    "files": [file_view(f) for f in files[:end]],
                    "deletes": [[d.path, d.removed_ts] for d in items[len(files) : end]],
                    "manifests": manifests,
                    "total_files": len(files),
                    "total_manifests": len(listing.manifests),
                    "total_deletes": len(listing.deletes),
                    "rows": sum(f.row_count for f in files),
                    "size_bytes": sum(f.size_bytes for f in files),
                    "next_page_token": (
                        _files_token(ts, end, len(items), version.table_id)
                        if end < len(items) or len(manifests) < len(listing.manifests)
                        else None
                    ),
                }
            )
        return {"as_of": ts, "listings": listings, "waited_ms": waited}

    async def _compaction_view(self, _s: Session, args: Args) -> dict[str, Any]:
        """What a compactor needs (metastore.manifests): every loose entry with its removal ts,
        every delete entry and every manifest reference of the live table, from this node's
        applied state. Pages are not of one moment: the compaction's compare-and-swap refuses
        a view that changed in between (MANIFEST_CONFLICT), and the compactor reads again."""
        self._require_ready()
        table = _req_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        state = self.sm.state
        table_id = state.catalog.live_table(TableName.parse(table)).table_id
        loose = state.txns.loose_entries(table_id)
        deletes = state.txns.delete_entries(table_id)
        items: list[Any] = [*loose, *deletes]
        token = args.get("page_token")
        if token is not None and _page_token(token)[1] > len(items):
            # Fewer entries than the page offset: a compaction moved them since the previous
            # page. The view changed, the request is not a bad one: read it again.
            raise ManifestConflictError(
                f"{table}: the table changed between compaction view pages; read it again",
                details={
                    "table": table,
                    "what": "page_token",
                    "expected": str(token),
                    "actual": str(len(items)),
                },
            )
        # Always paged (a view of a large table outgrows one frame): without `limit`, pages of
        # FILES_PAGE_FILES_MAX. A given limit is checked (0, false, "" or [] was taken as none).
        limit = _opt_int(args, "limit", 1, L.FILES_PAGE_FILES_MAX) or L.FILES_PAGE_FILES_MAX
        start, end = _files_page(items, {**args, "limit": limit}, 0)
        page = items[start:end]
        cut = max(0, len(loose) - start)
        return {
            "table": table,
            "table_id": table_id,
            "location": state.current(table).location,
            "loose": [
                [f.path, f.size_bytes, f.row_count, f.added_ts, f.removed_ts] for f in page[:cut]
            ],
            "deletes": [[d.path, d.removed_ts] for d in page[cut:]],
            "manifests": (
                [m.to_view() for m in state.txns.manifest_refs(table_id)] if start == 0 else []
            ),
            "total_loose": len(loose),
            "total_deletes": len(deletes),
            # The cluster's compaction trigger (cluster.toml), for writers that compact.
            "loose_files_max": self.loose_files_max,
            # Entries removed at or below it are split into dead manifests GC deletes.
            "gc_threshold": state.gc.threshold(table_id),
            "applied_index": state.applied_index,
            "next_page_token": f"0:{end}" if end < len(items) else None,
        }

    async def _compact_manifest(self, session: Session, args: Args) -> dict[str, Any]:
        """Swap loose entries for manifests the caller wrote (metastore.manifests)."""
        timeout_ms = _timeout(args)
        cmd = compact_manifest_from_request({k: v for k, v in args.items() if k != "timeout_ms"})
        applied = await self._propose_command(session, cmd, timeout_ms)
        result = dict(applied["result"])
        result["deduplicated"] = bool(applied["deduplicated"] or result.get("deduplicated"))
        result["tm"] = applied["tm"]
        return result

    async def _txn_log(self, _s: Session, args: Args) -> dict[str, Any]:
        """The `limit` most recent commits, newest first, in pages of about
        TXN_LOG_PAGE_BYTES_MAX (a commit names up to 100 tables: 10,000 of them outgrow a
        frame). A page cut short by its bytes has a `next_page_token` (the Tm of its last
        commit); the next page is asked for with it and the `limit` still wanted.

        The next page may be asked of another node (the client fails over): one that has not
        applied the entry of the token yet would list only the older commits it has, and the
        ones in between would be skipped without a word. So a page with a token waits, as a
        read at that position does, until this node's safe time reaches it (the token's node
        had applied it: on a healthy node no wait).

        `min_ts` (a first page: `read_ts`, or the caller's own newest write) makes the list
        linearizable as a `files` listing is: safe time is waited for up to it first, so every
        commit acknowledged before it is listed."""
        self._require_ready()
        limit = _opt_int(args, "limit", 1, mlimits.MAX_TXN_LOG_RECORDS) or 20
        token = _opt_str(args, "page_token", 32)
        at_least = _opt_int(args, "min_ts", 0, MAX_TS)
        if token is None and at_least is not None and at_least > self.node.safe_time:
            # A commit may land up to DD above the clock: as for `files`, slack of DD.
            self._check_not_future(at_least, slack_ms=self._dd() >> LOGICAL_BITS)
            await self._wait_safe(at_least, _timeout(args))
        before_tm = None
        if token is not None:
            if not _is_uint(token) or int(token) > MAX_TS:
                raise _not_our_token(token)
            before_tm = int(token)
            self._check_not_future(before_tm)
            await self._wait_safe(before_tm, _timeout(args))
        records = self.sm.state.txn_log(limit, before_tm=before_tm)
        commits, _ = _views_within(
            records, commit_view, count_max=len(records), bytes_max=L.TXN_LOG_PAGE_BYTES_MAX
        )
        return {
            "commits": commits,
            "upper": self.sm.state.table_upper(),
            "next_page_token": str(commits[-1]["tm"]) if len(commits) < len(records) else None,
        }

    async def _on_leader_caught_up(
        self, session: Session, op: str, args: Args
    ) -> dict[str, Any] | None:
        """For a linearizable read: on a follower, the leader's answer to the same request; on
        the leader, None once it has confirmed its leadership and applied everything committed
        before the call (ReadIndex), so the caller may answer from the state."""
        timeout_ms = _timeout(args)
        if not self.node.is_leader():
            leader = self.node.leader_id()
            if not leader:
                raise _no_leader_known()
            return await self.forwarder.call(
                leader, session.token, op, dict(args), timeout_ms=timeout_ms + 1000
            )
        self._require_ready()
        try:
            await self.node.read_barrier(timeout_ms=timeout_ms)
        except (ReadIndexError, TimeoutError, RaftError, RaftCoreError) as exc:
            # Also a leadership lost (or a node stopped) after the is_leader() check above:
            # retryable, never INTERNAL (clients resolve ambiguous commits with this op).
            raise UnavailableError(f"could not confirm leadership: {exc}") from None
        return None

    async def _read_ts(self, session: Session, args: Args) -> dict[str, Any]:
        """A timestamp at or above everything acknowledged before the call: every applied
        entry's Tm and every commit's ts (a commit may be stamped up to DD above its Tm). A
        read at or above it (`files` with it as `min_ts`) sees every acknowledged commit, from
        any node and any process: what etcd calls a linearizable read. The leader answers
        after a ReadIndex; a follower asks the leader."""
        forwarded = await self._on_leader_caught_up(session, "read_ts", args)
        if forwarded is not None:
            return forwarded
        last_commit_ts = self.sm.state.txn_stats().last_commit_ts
        return {"ts": max(self.node.safe_time, last_commit_ts), "leader_id": self.node.node_id}

    async def _committed_txn(self, session: Session, args: Args) -> dict[str, Any]:
        """Whether a txn id committed, as a linearizable read: the leader confirms its leadership
        and applies everything committed before the call (ReadIndex), so an acknowledged commit
        is never reported missing by a lagging node. A follower asks the leader."""
        txn_id = _req_str(args, "txn_id", mlimits.MAX_TXN_ID_CHARS)
        stream = _opt_str(args, "stream", mlimits.MAX_TXN_ID_CHARS)
        forwarded = await self._on_leader_caught_up(session, "committed_txn", args)
        if forwarded is not None:
            return forwarded
        state = self.sm.state
        record = state.committed_txn(txn_id)
        mark = None if stream is None else state.stream_mark(stream)
        stats = state.txn_stats()
        return {
            "txn_id": txn_id,
            "txn": None if record is None else commit_view(record),
            "stream_mark": None if mark is None else mark.to_result(),
            "oldest_remembered_ts": stats.oldest_remembered_ts,
            "remembered_txns": stats.remembered_txns,
            "last_commit_ts": stats.last_commit_ts,
        }

    async def _safe_time(self, _s: Session, _args: Args) -> dict[str, Any]:
        st = self.node.status()
        return {
            "node_id": self.node.node_id,
            "safe_time": st.safe_time,
            "now": self.clock.now(),
            "lag_ms": st.safe_time_lag_ms,
            "ready": st.ready_to_serve,
        }

    async def _status(self, _s: Session, _args: Args) -> dict[str, Any]:
        st = self.node.status()
        return {
            "node_id": self.node.node_id,
            "cluster_id": self.cluster_id,
            "role": st.core.role.value,
            "term": st.core.term,
            "leader": st.core.leader,
            "commit_index": st.core.commit_index,
            "applied_index": st.core.applied_index,
            # The last entry in this node's log, committed or not (a leader's bounds what any
            # follower can hold).
            "last_index": st.core.last_index,
            # The newest snapshot this node holds, and the index its log starts after (lower
            # by the entries kept behind the snapshot for followers a little behind).
            "snapshot_index": st.core.snapshot_index,
            "log_start_index": st.core.log_start_index,
            "safe_time": st.safe_time,
            "lag_ms": st.safe_time_lag_ms,
            "ready": st.ready_to_serve,
            "initialized": self.sm.state.cluster is not None,
            "voters": list(st.core.conf.voters),
            "learners": list(st.core.conf.learners),
            # Client addresses this node would forward to: its cluster.toml's, and the
            # cluster's records for the members that file lacks.
            "peers": self._peer_client_addresses(st.core.conf.members()),
            "stopped_reason": st.stopped_reason,
            # Why this node's last attempt to save its own snapshot failed ("" = it did not):
            # it serves from its log meanwhile and tries again (raft.node._snapshot_save_failed).
            "snapshot_save_error": st.snapshot_save_error,
            # A peer sent a Tm beyond this node's clock + CSmax (either clock is wrong); while
            # it lasts this node ignores that peer (see raft.node._clock_fenced).
            "clock_alarm": st.clock_alarm,
            # Peers' clocks minus this node's (ms, from heartbeats), and why this node fenced
            # itself for its clock ("" = it did not).
            "clock_offsets_ms": {str(k): v for k, v in st.clock_offsets_ms.items()},
            "clock_fenced": st.clock_fenced,
            # Certificates the cluster refuses (`cert_revoked` lists them).
            "revoked_certs": len(self.sm.state.revoked),
            # The apply rules in force, and the newest this node's release knows
            # (metastore.apply_version; `apply_version_finalize` moves the first).
            "apply_version": self.sm.state.apply_version,
            "apply_version_supported": APPLY_VERSION_SUPPORTED,
            # On the leader: how far each other member is, and a snapshot it is being sent.
            "replication": _replication(st),
        }

    # ------------------------------------------------------------------ writes

    async def _ddl(self, session: Session, args: Args) -> dict[str, Any]:
        started = time.perf_counter()
        sql = _req_str(args, "sql", mlimits.MAX_STATEMENT_BYTES * 4)
        request_id = _opt_str(args, "request_id", mlimits.MAX_REQUEST_ID_CHARS) or ""
        timeout_ms = _timeout(args)
        anchor = await self._clock_anchor(timeout_ms)
        # In a thread: the longest statement takes about half a second to parse (sqlglot, pure
        # Python), which on this loop stalled the node's Raft heartbeats past the election
        # timeout, so a leader lost its term (NOT_LEADER) to every largest DDL sent to it. The
        # thread gives up the GIL every few milliseconds; the loop keeps Raft going meanwhile.
        cmd = await asyncio.to_thread(
            parse_ddl, sql, request_id=request_id, warehouse=self.warehouse
        )
        applied = await self._propose_command(session, cmd, timeout_ms)
        result = dict(applied["result"])
        waited_ms = await self._wait_activation(result, timeout_ms, anchor)
        result.update(
            {
                "statement": type(cmd).__name__,
                "tm": applied["tm"],
                "waited_ms": waited_ms,
                "deduplicated": applied["deduplicated"],
            }
        )
        self.metrics.ddl(time.perf_counter() - started)
        return result

    async def _clock_anchor(self, timeout_ms: int) -> tuple[int, float]:
        """When a request that ends in `_wait_activation` begins: the wall clock this node can
        vouch for (after a recent step of it, the clock as it read before; clock_steps.py) and
        the monotonic clock, read together.

        Only once round trips with its peers have measured this node's clock within CSmax
        (`RaftNode.clock_checked`), waited for up to CLOCK_CHECK_WAIT_MS within `timeout_ms`:
        a node just started or just elected measures it within a heartbeat or two, and one
        started with its clock far off fences itself instead. A fenced node, or one still
        unmeasured after the wait, answers NOT_READY before doing anything: its reply would be
        judged by a clock that is, or may be, wrong."""
        wait_ms = min(timeout_ms, L.CLOCK_CHECK_WAIT_MS)
        deadline = time.monotonic() + wait_ms / 1000
        for _ in range(wait_ms // L.CLOCK_CHECK_POLL_MS + 2):  # bounded: ends by the deadline
            fenced = self.node.clock_fenced
            if fenced:
                raise NotReadyError(
                    f"node {self.node.node_id} has fenced itself for its clock ({fenced}): it "
                    "cannot tell when a change is active everywhere; ask another node",
                    details={"node_id": self.node.node_id, "clock_fenced": fenced},
                )
            if self.node.clock_checked():
                break
            if time.monotonic() >= deadline:
                raise NotReadyError(
                    f"node {self.node.node_id} has not measured its clock against its peers' "
                    f"within {wait_ms} ms: it cannot tell when a change is active everywhere; "
                    "ask another node",
                    details={"node_id": self.node.node_id, "clock_checked": False},
                )
            await asyncio.sleep(L.CLOCK_CHECK_POLL_MS / 1000)
        monotonic_s = time.monotonic()
        wall_ms = self._observe_clock(monotonic_s)
        return wall_ms, monotonic_s

    def _observe_clock(self, monotonic_s: float) -> int:
        """The wall clock this node vouches for (ClockStepWatch); a step is logged."""
        steps = self.clock_steps.steps
        wall_ms = self.clock_steps.observe(self.clock.physical_now_ms(), monotonic_s)
        if self.clock_steps.steps != steps:
            log.warning(
                "this node's wall clock stepped by %+d ms (against the monotonic clock): for "
                "%.0f s a DDL's wait trusts only the clock as it read before; check the node's "
                "time source",
                self.clock_steps.last_step_ms,
                CLOCK_STEP_PROBATION_S,
            )
        return wall_ms

    async def _wait_activation(
        self, result: Mapping[str, Any], timeout_ms: int, anchor: tuple[int, float]
    ) -> float:
        """IEP-98: reply to a change only once its Tu is in the past on every node, whatever its
        skew. Returns the ms waited.

        Judged by the wall clock and also by the wall clock as it read when the request began
        (`anchor`) plus the real time since, measured on the monotonic clock: a wall clock
        stepped forward while the request ran (NTP, a fault; until its node's peers prove the
        offset and it fences itself) would otherwise end the wait early, and the caller could
        then read the old schema on a node whose clock is right (chaos fault `skew_leader`)."""
        tu = result.get("tu")
        if not isinstance(tu, int):
            return 0.0
        wait_started = time.perf_counter()
        wall_ms, monotonic_s = anchor
        anchored_ms = wall_ms + int((time.monotonic() - monotonic_s) * 1000)
        try:
            cs_max = self._cs_max_ms() << LOGICAL_BITS
            await self.clock.wait_until(tu + cs_max, timeout_ms=timeout_ms, anchored_ms=anchored_ms)
        except WaitTimeoutError:
            raise RequestTimeoutError(
                "the change is applied but its activation did not pass in time",
                details={"tu": tu},
            ) from None
        self._observe_clock(time.monotonic())
        fenced = self.node.clock_fenced
        if fenced:
            # Fenced during the wait: the change is applied, but this node's clock cannot say
            # it is active everywhere. The same request_id sent elsewhere waits again there.
            raise RequestTimeoutError(
                f"the change is applied but node {self.node.node_id} fenced itself for its "
                f"clock ({fenced}) before its activation passed: send the same request_id to "
                "another node, which waits for it",
                details={"tu": tu, "clock_fenced": fenced},
            )
        return (time.perf_counter() - wait_started) * 1000

    # ------------------------------------------------------------------ change feed

    def _check_ever_existed(
        self, *, table: TableName | None = None, namespace: str | None = None
    ) -> None:
        """A filter naming a table (or namespace) this catalog never had, dropped ones
        included, is TABLE_NOT_FOUND (NAMESPACE_NOT_FOUND): a typo would otherwise list
        nothing, or watch forever, and look like an answer."""
        if table is None and namespace is None:
            return
        catalog = self.sm.state.catalog
        if table is not None and not catalog.incarnations(table):
            raise TableNotFoundError(
                f"table {table} does not exist (and never did)", details={"table": str(table)}
            )
        if namespace is not None and not catalog.namespace_incarnations(namespace):
            raise NamespaceNotFoundError(
                f"namespace {namespace} does not exist (and never did)",
                details={"namespace": namespace},
            )

    async def _watch(self, _s: Session, args: Args) -> dict[str, Any]:
        """Events after `from_ts` (an entry Tm: 0 = from the oldest kept, default: now) in
        log order, optionally only those of `table` or `namespace`: at most `limit`, waiting
        up to `wait_ms` for the first one (long poll). `next_from_ts` (and `next_from_event`,
        when a page ended inside an entry too large for one page) is where to continue; it
        moves on even when nothing matched. A position this node no longer has events for is
        WATCH_START_COMPACTED (metastore.events)."""
        self._require_ready()
        from_ts = _opt_int(args, "from_ts", 0, MAX_TS)
        from_event = _opt_int(args, "from_event", 0, 2**31 - 1) or 0
        if from_event and not from_ts:
            raise BadRequestError(
                "'from_event' continues inside the entry at 'from_ts': give both, as a reply's "
                "'next_from_ts' and 'next_from_event'"
            )
        if from_ts is None:
            from_ts = self.node.safe_time
        elif from_ts == 0:
            # From the oldest event kept (`watch --oldest`): complete after the floor, which is
            # above 0 once the node loaded a snapshot or dropped old events.
            from_ts = self.sm.events.floor_tm
        limit = _opt_int(args, "limit", 1, L.WATCH_EVENTS_PAGE_MAX) or L.WATCH_EVENTS_PAGE_MAX
        wait_ms = _opt_int(args, "wait_ms", 0, L.WATCH_WAIT_MS_MAX)
        table = _opt_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        namespace = _opt_str(args, "namespace", L.TABLE_NAME_CHARS_MAX)
        table = None if table is None else str(TableName.parse(table))
        namespace = None if namespace is None else namespace.lower()
        self._check_not_future(from_ts)
        # A position this node has not reached yet: wait until it has (like a read at it).
        await self._wait_safe(from_ts, _timeout(args))
        # The filter is judged only then (a resume from after a CREATE on a node that had not
        # applied it yet is no typo), and "never existed" like a read at now: a node behind
        # the caller's own CREATE (which returned after its Tu) waits for it first.
        name = None if table is None else TableName.parse(table)
        try:
            self._check_ever_existed(table=name, namespace=namespace)
        except (TableNotFoundError, NamespaceNotFoundError):
            await self._wait_safe(max(0, self.clock.now() - self._dd()), _timeout(args))
            self._check_ever_existed(table=name, namespace=namespace)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (wait_ms or 0) / 1000
        position = (from_ts, from_event)
        while True:
            wake = self.sm.wait_for_events()
            try:
                events, stopped_at, skip = self.sm.events.since(
                    position[0],
                    limit=limit,
                    keep=lambda e: event_matches(e, namespace=namespace, table=table),
                    bytes_max=L.WATCH_PAGE_BYTES_MAX,
                    skip=position[1],
                )
            except BaseException:
                wake.cancel()  # a refused start (compacted) must not keep it until an event
                raise
            # Everything up to the applied position was examined when nothing stopped us (a
            # stop is always past `position`: a page that stops has events).
            if stopped_at is not None:
                position = (stopped_at, skip)
            else:
                position = (max(position[0], self.sm.state.last_tm), 0)
            remaining = deadline - loop.time()
            if events or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake, timeout=remaining)
        if not wake.done():
            wake.cancel()
        return {
            "events": events,
            "next_from_ts": position[0],
            "next_from_event": position[1],
            "oldest_ts": self.sm.events.floor_tm,
            "safe_time": self.node.safe_time,
        }

    # ------------------------------------------------------------------ schema change jobs

    def _job_view(self, job: SchemaJob) -> dict[str, Any]:
        state = self.sm.state
        cs_max = self._cs_max_ms() << LOGICAL_BITS
        # `finished` tells the caller (`metastore job wait`) that the job's last version is in
        # force on every node, as a DDL's reply does: judged, like the DDL's wait, by the wall
        # clock this node vouches for (after a recent step of it, the clock as it read before;
        # clock_steps.py), never by a clock that just jumped ahead (chaos `skew_leader`: a job
        # looked finished 1.5 s early; tests/daemon/test_job_clock_step.py) or one not yet
        # measured against its peers.
        now_tm = min(self.clock.now(), self._observe_clock(time.monotonic()) << LOGICAL_BITS)
        if not self.node.clock_checked():
            # No round trip of this process has measured its clock yet (a node started with
            # its clock far off answers for a second or so before it fences itself; the DDL
            # refuses to judge by such a clock): judge by the leader's clock instead, as of the
            # newest entry applied here (safe time), which the quorum keeps within CSmax.
            now_tm = min(now_tm, self.node.safe_time)
        wait = next_step_wait(
            job,
            catalog=state.catalog,
            sessions=state.sessions,
            now_tm=now_tm,
            cs_max=cs_max,
        )
        # Leases in the way, named as in LEASE_HELD: the first MAX_LEASES_PER_COMMAND (one
        # per session leasing the table, which may be thousands: past one frame), counted all;
        # `lease_blockers` pages through every one.
        waiting = wait.view()
        waiting["blockers"] = list(wait.blockers[: mlimits.MAX_LEASES_PER_COMMAND])
        waiting["blocker_count"] = len(wait.blockers)
        return {**job.view(), "waiting_for": waiting}

    async def _job_list(self, _s: Session, args: Args) -> dict[str, Any]:
        """Schema change jobs, oldest first: running ones, and with `all` finished ones too
        (at most MAX_RUNNING_SCHEMA_JOBS + MAX_FINISHED_SCHEMA_JOBS_KEPT). Keyset-paged by job
        id (`limit`, `page_token`): a view names up to 100 blockers, so pages end past
        JOBS_PAGE_BYTES_MAX too. A caller that asks for no page gets LIMIT_EXCEEDED when
        they do not fit one reply."""
        self._require_ready()
        show_all = _opt_bool(args, "all", False)
        table = _opt_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        limit = _opt_int(args, "limit", 1, L.JOBS_PAGE_MAX)
        args, _ = await self._continue_at(args, 32)
        token = args.get("page_token")
        if token is not None and not _is_uint(token):
            raise _not_our_token(token)
        after = 0 if token is None else int(token)
        name = None if table is None else TableName.parse(table)
        # Like a read at now: a node behind the caller's own DDL (returned after its Tu) waits
        # for it first, so its jobs are listed and its table is not "not found".
        await self._wait_safe(max(0, self.clock.now() - self._dd()), _timeout(args))
        self._check_ever_existed(table=name)
        position = self._applied_position()
        jobs = [
            j
            for j in self.sm.state.jobs.jobs(table=name, running_only=not show_all)
            if j.job_id > after
        ]
        count_max = limit or L.JOBS_PAGE_MAX
        page, size = _views_within(
            jobs, self._job_view, count_max=count_max, bytes_max=L.JOBS_PAGE_BYTES_MAX
        )
        more = len(page) < len(jobs)
        if more and limit is None and token is None:
            raise limit_exceeded(
                "JOBS_PAGE_BYTES_MAX",
                L.JOBS_PAGE_BYTES_MAX,
                size,
                "bytes of jobs in one reply (page with 'limit' and 'page_token')",
            )
        return {
            "jobs": page,
            "safe_time": self.node.safe_time,
            "next_page_token": _position_token(position, str(page[-1]["job_id"]) if more else None),
        }

    async def _job_show(self, _s: Session, args: Args) -> dict[str, Any]:
        self._require_ready()
        job_id = _req_int(args, "job_id", 1, 2**63 - 1)
        try:
            job = self.sm.state.jobs.get(job_id)
        except SchemaJobNotFoundError:
            # A job the caller's own ALTER just started (which returned after its Tu) on a
            # node behind it: judged like a read at now, as `watch` judges its filter.
            await self._wait_safe(max(0, self.clock.now() - self._dd()), _timeout(args))
            job = self.sm.state.jobs.get(job_id)
        return self._job_view(job)

    async def _job_cancel(self, session: Session, args: Args) -> dict[str, Any]:
        """Roll a running job back (a new version, like a DDL: the reply waits for it to be
        active everywhere). While leases are in the way the cancel is recorded instead
        (`cancel_requested`) and the job worker publishes the rollback once they drain."""
        job_id = _req_int(args, "job_id", 1, 2**63 - 1)
        timeout_ms = _timeout(args)
        anchor = await self._clock_anchor(timeout_ms)
        cmd = CancelSchemaJob(job_id=job_id, by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS])
        applied = await self._propose_command(session, cmd, timeout_ms)
        result = dict(applied["result"])
        result["waited_ms"] = await self._wait_activation(result, timeout_ms, anchor)
        return result

    async def _job_backfilled(self, session: Session, args: Args) -> dict[str, Any]:
        """A backfill (spark_bridge.backfill) rewrote and committed every file of the job's
        table that lacked the column at `snapshot_ts`."""
        cmd = SchemaJobBackfilled(
            job_id=_req_int(args, "job_id", 1, 2**63 - 1),
            snapshot_ts=_req_int(args, "snapshot_ts", 1, 2**63 - 1),
            files_rewritten=_req_int(args, "files_rewritten", 0, 2**63 - 1),
            by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        applied = await self._propose_command(session, cmd, _timeout(args))
        return dict(applied["result"])

    async def _commit(self, session: Session, args: Args) -> dict[str, Any]:
        """Atomic multi-table commit (metastore.txn). Idempotent by txn_id, so clients may retry
        it after a timeout; a retry of a committed txn returns the original result."""
        started = time.perf_counter()
        timeout_ms = _timeout(args)
        request = {k: v for k, v in args.items() if k != "timeout_ms"}
        # A big one in a thread, as a DDL's parse: checking the largest commit (10,000 files)
        # takes a fifth of a second, which this loop's Raft heartbeats must not wait for. A
        # small one here: the hand-over to a thread and back costs more than its check.
        if _commit_request_files(request) > OFFLOAD_COMMIT_FILES_MIN:
            cmd = await asyncio.to_thread(commit_txn_from_request, request)
        else:
            cmd = commit_txn_from_request(request)
        if self.node.is_leader():
            # A follower forwards the commit, and the leader checks it (`_propose_op`).
            await self._check_removals(cmd, timeout_ms)
        applied = await self._propose_command(session, cmd, timeout_ms)
        result = dict(applied["result"])
        result["deduplicated"] = bool(applied["deduplicated"] or result.get("deduplicated"))
        result["tm"] = applied["tm"]
        self.metrics.commit(time.perf_counter() - started)
        return result

    async def _check_removals(self, cmd: CommitTxn, timeout_ms: int) -> None:
        """Removals of manifest entries, which apply takes on trust, are checked against the
        manifest files (metastore.daemon.removal_check). On the leader only: a refusal must
        rest on a state that has applied every commit acknowledged before this one arrived
        (ReadIndex), which a follower cannot confirm by itself."""

        async def caught_up() -> MetastoreState | None:
            if not self.node.is_leader():
                return None
            try:
                await self.node.read_barrier(timeout_ms=timeout_ms)
            except (ReadIndexError, TimeoutError, RaftError, RaftCoreError):
                return None
            return self.sm.state

        await self.removal_check.check(self.sm.state, cmd, catch_up=caught_up)

    async def _propose_command(
        self, session: Session, cmd: Command, timeout_ms: int
    ) -> dict[str, Any]:
        if not isinstance(cmd, CommitTxn):  # commit_txn_from_request validated it already
            # A command an op built from its arguments is refused here with its own typed
            # error (LIMIT_EXCEEDED naming the limit), on whichever node received it. Left to
            # the decoder, a limit it checks first (a protection's targets) was
            # MALFORMED_COMMAND without details, from the leader's apply or its `_propose`.
            validate_command(cmd)
        self._refuse_before_proposing(cmd)
        decoded: Command | None = None
        if isinstance(cmd, CommitTxn) and _commit_files(cmd) > OFFLOAD_COMMIT_FILES_MIN:
            # Encoded in a thread, and decoded there too on the leader, whose apply (on this
            # loop, which runs its Raft) then need not decode the entry's bytes
            # (`CatalogStateMachine.expect_entry`): the largest commit's decode held the
            # leader's loop past the election timeout on a loaded machine.
            if self.node.is_leader():
                data, decoded = await asyncio.to_thread(_encoded_and_decoded, cmd)
            else:
                data = await asyncio.to_thread(encode_command, cmd)
        else:
            data = encode_command(cmd)
        if not isinstance(cmd, CommitTxn) and len(data) > mlimits.MAX_COMMAND_BYTES:
            # The decoder's bound, which apply enforces on every node: past it the command
            # would be logged and then refused as MALFORMED_COMMAND. A statement within
            # MAX_STATEMENT_BYTES can pass it, as its canonical form spells out DEFAULTs.
            raise limit_exceeded(
                "MAX_COMMAND_BYTES",
                mlimits.MAX_COMMAND_BYTES,
                len(data),
                f"encoded {type(cmd).__name__} command (a DDL's DEFAULTs spelled out)",
            )
        if self.node.is_leader():
            await self._check_location_allowed(cmd)
            if decoded is not None:
                self.sm.expect_entry(data, decoded)
            return await self._propose_local(data, timeout_ms)
        leader = self.node.leader_id()
        if not leader:
            raise _no_leader_known()
        return await self.forwarder.call(
            leader,
            session.token,
            "_propose",
            {"command": data, "timeout_ms": timeout_ms},
            timeout_ms=timeout_ms + L.FORWARD_REPLY_MARGIN_MS,
        )

    async def _propose_op(self, session: Session, args: Args) -> dict[str, Any]:
        data = args.get("command")
        # A forwarded command may be a commit, whose bound is larger than DDL's; decode_command
        # then applies the exact bound of the command's kind.
        if not isinstance(data, bytes) or len(data) > max(
            mlimits.MAX_COMMAND_BYTES, mlimits.MAX_COMMIT_COMMAND_BYTES
        ):
            raise BadRequestError("'command' must be bytes of a canonical command")
        # Validates: the leader trusts no forwarded bytes. Under a request's item budget: the
        # bytes are a client's, up to MAX_COMMIT_COMMAND_BYTES of them.
        # A big one in a thread: the largest command (a commit of 10,000 files) takes a fifth
        # of a second to decode and check, and this is the leader's loop. A small one here (a
        # thread hand-over costs more than its decode).
        if len(data) > OFFLOAD_DECODE_BYTES_MIN:
            cmd = await asyncio.to_thread(
                decode_command, data, max_items=L.CLIENT_REQUEST_ITEMS_MAX
            )
        else:
            cmd = decode_command(data, max_items=L.CLIENT_REQUEST_ITEMS_MAX)
        if _admin_only(cmd) and (session.role is None or session.role < Role.ADMIN):
            # Followers forward with the caller's own token: a writer must not get, through
            # this op, what the admin-only ops (or only the leader itself) may propose.
            raise ForbiddenError(
                f"{type(cmd).__name__} needs the admin role",
                details={"op": "_propose", "needed": "admin"},
            )
        if isinstance(cmd, CreateTable) and cmd.location:
            # The parse-time rules (`parse_ddl`): a writer may send the command itself.
            check_new_location(cmd.location, "LOCATION")
        if (
            isinstance(cmd, ReleaseProtection)
            and cmd.reason == "release"
            and not _forwarding_link(session)
            and cmd.by != session.client[: mlimits.MAX_SESSION_LABEL_CHARS]
        ):
            # `pts_release`'s rule for a writer sending the command itself: a release "as its
            # creator" names the caller in `by`, or `release_refusal` (which compares `by` with
            # the record's creator) would take the sender's word for whose record it is. A
            # follower's link forwards `pts_release`'s command, checked there with the
            # caller's own name.
            raise ForbiddenError(
                f"a release as the record's creator must name the caller in 'by' "
                f"({session.client[: mlimits.MAX_SESSION_LABEL_CHARS]!r}, not {cmd.by!r}); "
                "releasing another client's protection needs the admin role (pts_release)",
                details={"record_id": cmd.record_id, "by": cmd.by},
            )
        if (
            isinstance(cmd, Protect)
            and not _forwarding_link(session)
            and cmd.created_by != session.client[: mlimits.MAX_SESSION_LABEL_CHARS]
        ):
            # `pts_protect` names the caller as the creator; a writer sending the command
            # itself could name another client, which could then release the record "as its
            # creator" (and the record's owner would read as someone who never made it). A
            # follower's link forwards `pts_protect`'s command, built there with the caller's
            # own name.
            raise ForbiddenError(
                f"a protection's 'created_by' must name the caller "
                f"({session.client[: mlimits.MAX_SESSION_LABEL_CHARS]!r}, not "
                f"{cmd.created_by!r}); pts_protect fills it in",
                details={"record_id": cmd.record_id, "created_by": cmd.created_by},
            )
        self._refuse_before_proposing(cmd)
        if isinstance(cmd, Protect):
            # `pts_protect`'s check, which a writer sending the command itself skipped: a
            # protection from a time still to come protects nothing yet reads as success. A
            # follower checked a forwarded one with its own clock; this leader's may differ by
            # up to CSmax, far inside the allowance.
            L.refuse_protection_ahead(cmd.ts, now_ms=self.clock.physical_now_ms())
        if not self.node.is_leader():
            raise NotLeaderError("not the leader", details={"leader": self.node.leader_id()})
        await self._check_location_allowed(cmd)
        timeout_ms = _timeout(args)
        if isinstance(cmd, SetApplyVersion):
            deadline = time.monotonic() + timeout_ms / 1000
            await self._check_apply_version_supported(session, cmd.version, timeout_ms)
            timeout_ms = _ms_left(deadline)
        if isinstance(cmd, CommitTxn):
            await self._check_removals(cmd, timeout_ms)
        fitted = _for_apply_version(cmd, self.sm.state)
        if fitted is not cmd:
            data = encode_command(fitted)
        elif len(data) > OFFLOAD_DECODE_BYTES_MIN:
            # `cmd` is what these very bytes decode to (decoded in a thread above): apply takes
            # it rather than decoding them again on this loop.
            self.sm.expect_entry(data, cmd)
        return await self._propose_local(data, timeout_ms)

    def _refuse_before_proposing(self, cmd: Command) -> None:
        """Apply version 9's refusals (metastore.apply_version), made before proposing on
        every version, against this node's state, so a client gets the typed error while the
        cluster still applies an older version's rules: a NUL in a request id, comment or
        protection meta (`refuse_nul`), a release of another client's protection as its
        creator (`release_refusal`), a retry of a remembered txn id asking for another ts
        (`TxnLog.retry_refusal`). A state behind the leader's may miss a record: apply then
        decides (from version 9 it refuses the same)."""
        refuse_nul(cmd)
        if isinstance(cmd, CommitTxn):
            refusal: MetastoreError | None = self.sm.state.txns.retry_refusal(cmd)
        elif isinstance(cmd, ReleaseProtection):
            try:
                record = self.sm.state.gc.record(cmd.record_id)
            except ProtectionNotFoundError:
                return  # apply says so (or skips an expiry of a record already gone)
            refusal = release_refusal(record, cmd)
        else:
            return
        if refusal is not None:
            raise refusal

    async def _check_location_allowed(self, cmd: Command) -> None:
        """A new table's location must lie inside the roots the operator allows
        (metastore/daemon/allowed_locations.py): checked by the leader, right before it
        proposes, for a DDL it parsed itself and for a command a follower (or any writer)
        sent through `_propose`, with this node's own config. Not in apply: it is node
        configuration, and tables created before a root was removed stay usable.
        INVALID_ARGUMENT, reason `location_not_allowed`, naming the allowed roots. Nor may it
        reach a live table's directory through a symbolic link (reason
        `location_shares_directory`; the catalog compares texts). Symbolic links are resolved
        in a thread: a hung mount must not stall the event loop."""
        if isinstance(cmd, CreateTable) and cmd.location:
            await asyncio.to_thread(self.allowed_locations.check_new_location, cmd.location)
            live = [
                (str(inc.name), inc.location)
                for inc in self.sm.state.catalog.all_incarnations()
                if inc.dropped_tm is None and inc.location
            ]
            await asyncio.to_thread(check_no_shared_directory, cmd.location, live)

    async def _check_apply_version_supported(
        self, session: Session, version: int, timeout_ms: int
    ) -> None:
        """Refuse a SetApplyVersion(`version`) that a member's release could not apply (that
        member would stop on applying it), asking every member as `cluster version
        --finalize` does. `_propose` runs this on the leader for every SetApplyVersion, as
        an admin may call it directly: a follower's `--finalize` checked already, and is
        asked again here (one bounded status round; the leader's view of the members is the
        one that counts)."""
        if version > APPLY_VERSION_SUPPORTED:
            # Known without asking anyone: this leader would stop on applying it.
            raise InvalidArgumentError(
                f"the leader (node {self.node.node_id}) supports apply versions up to "
                f"{APPLY_VERSION_SUPPORTED}, not {version}: upgrade it first",
                details={
                    "version": version,
                    "nodes": [self.node.node_id],
                    "supported": APPLY_VERSION_SUPPORTED,
                },
            )
        if version <= self.sm.state.apply_version:
            return  # applies as a no-op (equal) or is refused by apply (back): every node can
        _refuse_unless_supported(await self._members_apply_versions(session, timeout_ms), version)

    async def _propose_local(self, data: bytes, timeout_ms: int) -> dict[str, Any]:
        if self.sm.state.cluster is None:
            # A new cluster's first leader proposes InitCluster a moment after its election; a
            # client command ordered before it would be refused for good (CLUSTER_NOT_INITIALIZED)
            # where a retry a moment later succeeds.
            raise NotReadyError(
                "the cluster is being initialized (its first leader was just elected); retry "
                "shortly"
            )
        try:
            res = await self.node.propose(data, timeout_ms=timeout_ms)
        except RaftNotLeaderError as exc:
            raise NotLeaderError(str(exc), details={"leader": exc.leader_hint}) from None
        except ProposalTimeoutError as exc:
            raise RequestTimeoutError(str(exc)) from None
        except ProposalTooLargeError as exc:
            raise LimitExceededError(
                str(exc), details={"limit": "PROPOSAL_BYTES_MAX", "value": len(data)}
            ) from None
        except (ProposalDroppedError, NodeStoppedError, RaftError) as exc:
            raise UnavailableError(str(exc)) from None
        outcome = res.result
        if not isinstance(outcome, Outcome):
            raise InternalError("proposal applied without an outcome")
        err = outcome.exception()
        if err is not None:
            raise err
        return {
            "result": _reply_result(outcome.result),
            "deduplicated": outcome.deduplicated,
            "tm": res.tm,
            "index": res.index,
        }

    # ------------------------------------------------------------------ sessions and leases

    async def _session_open(self, session: Session, args: Args) -> dict[str, Any]:
        """Open a client session (metastore.leases). `ttl_ms` defaults to the node's configured
        session TTL; the chosen TTL is part of the replicated command, so every replica expires
        the session at the same Tm."""
        ttl_ms = _opt_int(args, "ttl_ms", mlimits.SESSION_TTL_MS_MIN, mlimits.SESSION_TTL_MS_MAX)
        info = SessionInfo(
            app_id=_opt_str(args, "app_id", mlimits.MAX_SESSION_LABEL_CHARS) or "",
            app_name=_opt_str(args, "app_name", mlimits.MAX_SESSION_LABEL_CHARS) or "",
            host=_opt_str(args, "host", mlimits.MAX_SESSION_LABEL_CHARS) or "",
            user=_opt_str(args, "user", mlimits.MAX_SESSION_LABEL_CHARS) or "",
            pid=_opt_int(args, "pid", 0, 2**31 - 1) or 0,
            started_at_ms=_opt_int(args, "started_at_ms", 0, 2**62) or 0,
        )
        cmd = OpenSession(
            session_id=_req_str(args, "session_id", mlimits.MAX_SESSION_ID_CHARS),
            info=info,
            ttl_ms=self.session_ttl_ms if ttl_ms is None else ttl_ms,
            opened_by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        applied = await self._propose_command(session, cmd, _timeout(args))
        result = dict(applied["result"])
        # At least three heartbeats per TTL, whatever TTL the client asked for.
        result["heartbeat_ms"] = min(self.session_heartbeat_ms, max(1, cmd.ttl_ms // 3))
        return result

    async def _session_heartbeat(self, session: Session, args: Args) -> dict[str, Any]:
        cmd = HeartbeatSession(
            session_id=_req_str(args, "session_id", mlimits.MAX_SESSION_ID_CHARS)
        )
        return dict((await self._propose_command(session, cmd, _timeout(args)))["result"])

    async def _session_close(self, session: Session, args: Args) -> dict[str, Any]:
        cmd = CloseSession(session_id=_req_str(args, "session_id", mlimits.MAX_SESSION_ID_CHARS))
        return dict((await self._propose_command(session, cmd, _timeout(args)))["result"])

    async def _session_expire(self, session: Session, args: Args) -> dict[str, Any]:
        """Admin: end sessions now, whatever their deadline; recorded in the log with the
        caller's name."""
        ids = _req_str_list(
            args, "session_ids", mlimits.MAX_LEASES_PER_COMMAND, "MAX_LEASES_PER_COMMAND"
        )
        cmd = ExpireSessions(
            session_ids=tuple(ids),
            reason="admin",
            by=(session.client or "admin")[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        return dict((await self._propose_command(session, cmd, _timeout(args)))["result"])

    async def _session_list(self, _s: Session, args: Args) -> dict[str, Any]:
        """Sessions by id, keyset-paged (10k sessions outgrow a frame); with `all`, the last
        page also lists recently ended sessions."""
        self._require_ready()
        show_ended = _opt_bool(args, "all", False)
        args, _ = await self._continue_at(args, 4 * mlimits.MAX_SESSION_ID_CHARS)
        state = self.sm.state
        now = position = self._applied_position()
        lease_counts: dict[str, int] = {}
        for lease in state.sessions.leases():
            lease_counts[lease.session_id] = lease_counts.get(lease.session_id, 0) + 1
        page, next_token = _keyset_page(
            sorted(state.sessions.sessions(), key=lambda s: s.session_id),
            key=lambda s: s.session_id,
            args=args,
            page_max=L.SESSION_PAGE_MAX,
            limit_name="SESSION_PAGE_MAX",
            what="sessions",
        )
        sessions = []
        for s in page:
            view = s.view()
            view["live"] = s.live_at(now)
            view["leases"] = lease_counts.get(s.session_id, 0)
            sessions.append(view)
        out: dict[str, Any] = {"sessions": sessions, "safe_time": now}
        out["next_page_token"] = _position_token(position, next_token)
        if show_ended and next_token is None:
            out["ended"] = [
                {
                    "session_id": e.session_id,
                    "app_id": e.app_id,
                    "reason": e.reason,
                    "by": e.by,
                    "ended_tm": e.ended_tm,
                }
                for e in state.sessions.ended()
            ]
        return out

    def _lease_keys(self, args: Args) -> tuple[LeaseKey, ...]:
        items = args.get("leases")
        if not isinstance(items, list) or not 1 <= len(items) <= mlimits.MAX_LEASES_PER_COMMAND:
            raise BadRequestError(
                f"'leases' must be a list of 1..{mlimits.MAX_LEASES_PER_COMMAND} maps"
            )
        keys = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequestError("each lease must be {table, table_id, version}")
            # Refused, as unknown keys of a commit's writes are: a field this node does not
            # know (a typo, or one a newer client relies on) must not be dropped silently.
            unknown = set(item) - _LEASE_KEYS
            if unknown:
                raise BadRequestError(
                    f"unknown keys {show_names(sorted(map(str, unknown)))} in leases[{i}]; "
                    f"a lease is {{table, table_id, version}}"
                )
            keys.append(
                LeaseKey(
                    table=TableName.parse(_req_str(item, "table", L.TABLE_NAME_CHARS_MAX)),
                    table_id=_req_int(item, "table_id", 1, 2**62),
                    version=_req_int(item, "version", 1, 2**62),
                )
            )
        return _distinct_leases(keys)

    async def _lease_acquire(self, session: Session, args: Args) -> dict[str, Any]:
        """With `read_ts`, the leases keep GC below reads at it (as `pin`'s leases do)."""
        leases = self._lease_keys(args)
        read_ts = _opt_int(args, "read_ts", 1, MAX_TS)
        cmd = AcquireLeases(
            session_id=_req_str(args, "session_id", mlimits.MAX_SESSION_ID_CHARS),
            leases=leases,
            read_ts=read_ts,
            reads=() if read_ts is None else tuple(dict.fromkeys(k.table_id for k in leases)),
        )
        return dict((await self._propose_command(session, cmd, _timeout(args)))["result"])

    async def _lease_release(self, session: Session, args: Args) -> dict[str, Any]:
        """With `known_tm` (the `lease_tm` of the caller's newest answered pin), a lease a
        later entry touched (a pin that crossed this release) is kept. `release_tm` in the
        reply is the Tm the release was applied at: a caller whose pin was applied before it
        (its `lease_tm` lower) lost that pin's lease to a release without `known_tm`. Added
        here, not by apply: the entry's result (recorded state) is unchanged."""
        cmd = ReleaseLeases(
            session_id=_req_str(args, "session_id", mlimits.MAX_SESSION_ID_CHARS),
            leases=self._lease_keys(args),
            known_tm=_opt_int(args, "known_tm", 0, MAX_TS),
        )
        fitted = _for_apply_version(cmd, self.sm.state)
        applied = await self._propose_command(session, fitted, _timeout(args))
        return {**applied["result"], "release_tm": applied["tm"]}

    async def _lease_list(self, _s: Session, args: Args) -> dict[str, Any]:
        """Leases by (table id, version, session), keyset-paged."""
        self._require_ready()
        args, _ = await self._continue_at(args, 4 * mlimits.MAX_SESSION_ID_CHARS)
        state = self.sm.state
        now = self.node.safe_time
        position = self._applied_position()
        table = _opt_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        table_id = (
            None if table is None else state.catalog.live_table(TableName.parse(table)).table_id
        )
        page, next_token = _keyset_page(
            sorted(state.sessions.leases(table_id=table_id), key=_lease_key),
            key=_lease_key,
            args=args,
            page_max=L.LEASE_PAGE_MAX,
            limit_name="LEASE_PAGE_MAX",
            what="leases",
        )
        leases = [state.sessions.lease_view(x, tm=now) for x in page]
        return {
            "leases": leases,
            "safe_time": now,
            "next_page_token": _position_token(position, next_token),
        }

    async def _lease_blockers(self, _s: Session, args: Args) -> dict[str, Any]:
        """Who would block publishing the table's next version right now (keyset-paged like
        `lease_list`; `blocker_count` counts them all)."""
        self._require_ready()
        args, _ = await self._continue_at(args, 4 * mlimits.MAX_SESSION_ID_CHARS)
        state = self.sm.state
        now = self.node.safe_time
        position = self._applied_position()
        inc = state.catalog.live_table(
            TableName.parse(_req_str(args, "table", L.TABLE_NAME_CHARS_MAX))
        )
        current = inc.versions[-1].version
        blockers = sorted(
            state.sessions.blockers(inc, tm=now),
            key=lambda b: f"{b['version']:020d}.{b['session_id']}",
        )
        page, next_token = _keyset_page(
            blockers,
            key=lambda b: f"{b['version']:020d}.{b['session_id']}",
            args=args,
            page_max=L.LEASE_PAGE_MAX,
            limit_name="LEASE_PAGE_MAX",
            what="blocking leases",
        )
        return {
            "table": str(inc.name),
            "table_id": inc.table_id,
            "current_version": current,
            "publishing_version": current + 1,
            "blockers": page,
            "blocker_count": len(blockers),
            "safe_time": now,
            "next_page_token": _position_token(position, next_token),
        }

    async def _pin(self, session: Session, args: Args) -> dict[str, Any]:
        """Pin several tables at one Top (IEP-98: wait for safe time >= Top - DD once) and, with
        `session_id`, lease the pinned versions in the same request: one round trip per batch.

        The leases of the tables the batch reads (`reads`, default all of `tables`) record the
        timestamp it reads them at - its own `read_ts`, else this node's safe time as reported
        (capped at Top), which is what a batch reads at without waiting - so GC keeps their
        thresholds below it however long the lease took to apply (metastore.gc).

        A renewing holder (the bridge) sends `known_tm`, and `renew_from` when it may move its
        held leases forward (AcquireLeases); `lease_tm` in the reply is the Tm the leases were
        applied at, what its next `known_tm` may say."""
        self._require_ready()
        tables = list(
            dict.fromkeys(
                _req_str_list(
                    args, "tables", mlimits.MAX_LEASES_PER_COMMAND, "MAX_LEASES_PER_COMMAND"
                )
            )
        )
        for table in tables:
            TableName.parse(table)  # bad input is refused before any wait
        reads = (
            None
            if args.get("reads") is None
            else set()
            if args.get("reads") == []
            else {
                TableName.parse(t)
                for t in _req_str_list(
                    args, "reads", mlimits.MAX_LEASES_PER_COMMAND, "MAX_LEASES_PER_COMMAND"
                )
            }
        )
        if reads is not None and not reads <= {TableName.parse(t) for t in tables}:
            raise BadRequestError("'reads' must name tables listed in 'tables'")
        read_ts = _opt_int(args, "read_ts", 1, MAX_TS)
        known_tm = _opt_int(args, "known_tm", 0, MAX_TS)
        renew_from = _opt_int(args, "renew_from", 1, MAX_TS)
        if renew_from is not None and known_tm is None:
            raise BadRequestError("'renew_from' needs 'known_tm'")
        top, waited = await self._at(args, "ts")
        safe_time = self.node.safe_time
        state = self.sm.state
        pins = []
        keys = []
        size = 0
        for table in tables:
            v = state.schema_at(table, top)
            pins.append(version_view(table, v))
            size += len(msgpack.packb(pins[-1], use_bin_type=True))
            keys.append(
                LeaseKey(table=TableName.parse(table), table_id=v.table_id, version=v.version)
            )
        if size > L.PIN_BYTES_MAX:
            # Refused before anything is leased: leases taken for a reply that then cannot be
            # sent would stay held by the caller's session, unknown to it.
            raise limit_exceeded(
                "PIN_BYTES_MAX",
                L.PIN_BYTES_MAX,
                size,
                "bytes of schemas in one pin (pin fewer tables per request, at the same ts)",
            )
        result: dict[str, Any] = {
            "ts": top,
            "pins": pins,
            "waited_ms": waited,
            "safe_time": safe_time,
        }
        session_id = _opt_str(args, "session_id", mlimits.MAX_SESSION_ID_CHARS)
        if session_id is not None:
            if session.role is None or session.role < Role.WRITER:
                raise ForbiddenError("leasing needs the writer role")
            leases = _distinct_leases(keys)
            read_ids = tuple(
                dict.fromkeys(k.table_id for k in leases if reads is None or k.table in reads)
            )
            cmd = AcquireLeases(
                session_id=session_id,
                leases=leases,
                read_ts=(min(top, safe_time) if read_ts is None else read_ts) if read_ids else None,
                reads=read_ids,
                known_tm=known_tm,
                renew_from=renew_from,
            )
            fitted = _for_apply_version(cmd, self.sm.state)
            applied = await self._propose_command(session, fitted, _timeout(args))
            result["lease"] = applied["result"]
            result["lease_tm"] = applied["tm"]
        return result

    # ------------------------------------------------------------------ protected timestamps, GC

    async def _pts_protect(self, session: Session, args: Args) -> dict[str, Any]:
        """Create a protected-timestamp record (metastore.gc). Once this returns, no GC
        threshold of a covered table can reach `ts` until the record is released."""
        record_id = _opt_str(args, "record_id", mlimits.MAX_PROTECTION_ID_CHARS)
        cluster = _opt_bool(args, "cluster", False)
        # Empty or absent lists mean "no target of that kind".
        tables = (
            _req_str_list(
                args, "tables", mlimits.MAX_TARGETS_PER_PROTECTION, "MAX_TARGETS_PER_PROTECTION"
            )
            if args.get("tables") not in (None, [])
            else []
        )
        namespaces = (
            _req_str_list(
                args, "namespaces", mlimits.MAX_TARGETS_PER_PROTECTION, "MAX_TARGETS_PER_PROTECTION"
            )
            if args.get("namespaces") not in (None, [])
            else []
        )
        ts = _req_int(args, "ts", 1, 2**63 - 1)
        L.refuse_protection_ahead(ts, now_ms=self.clock.physical_now_ms())
        cmd = Protect(
            record_id=record_id or uuid.uuid4().hex,
            ts=ts,
            meta_type=_opt_str(args, "meta_type", mlimits.MAX_SESSION_LABEL_CHARS) or "",
            meta=_opt_str(args, "meta", mlimits.MAX_PROTECTION_META_CHARS) or "",
            tables=tuple(TableName.parse(t) for t in tables),
            namespaces=tuple(n.lower() for n in namespaces),
            cluster=cluster,
            max_age_ms=_opt_int(args, "max_age_ms", 1, mlimits.GC_TTL_MS_MAX),
            owner=_opt_str(args, "session_id", mlimits.MAX_SESSION_ID_CHARS) or "",
            created_by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        applied = await self._propose_command(session, cmd, _timeout(args))
        return {**applied["result"], "applied_tm": applied["tm"]}

    async def _pts_release(self, session: Session, args: Args) -> dict[str, Any]:
        """Release a record: its creator (same client name) may; anyone else needs admin."""
        self._require_ready()
        record_id = _req_str(args, "record_id", mlimits.MAX_PROTECTION_ID_CHARS)
        timeout_ms = _timeout(args)
        # One deadline for the whole call: the catch-up (a ReadIndex, then maybe a safe-time
        # wait) and the proposal share `timeout_ms` instead of taking it each.
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            record = self.sm.state.gc.record(record_id)
        except ProtectionNotFoundError:
            # This node may not have applied the protect yet (a follower behind): NOT_FOUND,
            # which the bridge takes as "already released", must rest on a state that has
            # applied every entry committed before the call.
            await self._catch_up(deadline)
            record = self.sm.state.gc.record(record_id)  # ProtectionNotFound
        mine = record.created_by == session.client[: mlimits.MAX_SESSION_LABEL_CHARS]
        if not mine and (session.role is None or session.role < Role.ADMIN):
            raise ForbiddenError(
                f"protection {record_id!r} was created by {record.created_by!r}; releasing "
                "another client's protection needs the admin role",
                details={"record_id": record_id, "created_by": record.created_by},
            )
        cmd = ReleaseProtection(
            record_id=record_id,
            reason="release" if mine else "admin",
            by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        return dict((await self._propose_command(session, cmd, _ms_left(deadline)))["result"])

    async def _catch_up(self, deadline: float) -> None:
        """Until this node has applied every entry committed before the call: the leader's
        ReadIndex; elsewhere (or when it cannot confirm its leadership) safe time past
        now + CSmax, as every entry committed before now has a Tm at most CSmax ahead of this
        node's clock. Not forwarded: the leader would see the forwarder, not the caller.
        Both waits end by `deadline` (time.monotonic())."""
        if self.node.is_leader():
            try:
                await self.node.read_barrier(timeout_ms=_ms_left(deadline))
                return
            except (ReadIndexError, TimeoutError, RaftError, RaftCoreError):
                pass
        top = self.clock.now() + (self._cs_max_ms() << LOGICAL_BITS)
        await self._wait_safe(top, _ms_left(deadline))

    async def _pts_list(self, _s: Session, args: Args) -> dict[str, Any]:
        """Protection records (and, with `all`, released ones), paged: a record can name 100
        targets, so 4,096 of them outgrow one frame. Active records come first, by id, then
        released ones, by release Tm; `page_token` is where the previous page stopped (keyset,
        so records created or released meanwhile shift nothing). A client that does not page
        gets the whole list only if it fits one page, else LIMIT_EXCEEDED."""
        self._require_ready()
        show_all = _opt_bool(args, "all", False)
        limit = _opt_int(args, "limit", 1, L.PTS_PAGE_RECORDS_MAX)
        args, _ = await self._continue_at(args, 2 * mlimits.MAX_PROTECTION_ID_CHARS)
        token = args.get("page_token")
        position = self._applied_position()
        gc = self.sm.state.gc
        active = sorted(gc.records(), key=lambda r: r.record_id)
        released = sorted(gc.released(), key=lambda r: r.released_tm) if show_all else []
        if token is not None:
            kind, _, key = token.partition(":")
            if kind == "a":
                active = [r for r in active if r.record_id > key]
            elif kind == "r" and _is_uint(key):
                active = []
                released = [r for r in released if r.released_tm > int(key)]
            else:
                raise _not_our_token(token)
        count = limit or L.PTS_PAGE_RECORDS_MAX
        page_active = active[:count]
        page_released = released[: count - len(page_active)]
        more = len(page_active) < len(active) or len(page_released) < len(released)
        if more and limit is None and token is None:
            raise limit_exceeded(
                "PTS_PAGE_RECORDS_MAX",
                L.PTS_PAGE_RECORDS_MAX,
                len(active) + len(released),
                "protection records in one reply (page with 'limit' and 'page_token')",
            )
        next_token = None
        if more:
            next_token = (
                f"r:{page_released[-1].released_tm}"
                if page_released
                else f"a:{page_active[-1].record_id}"
            )
        result: dict[str, Any] = {
            "meta": gc.meta(),
            "records": [r.view() for r in page_active],
            "safe_time": self.node.safe_time,
            "next_page_token": _position_token(position, next_token),
        }
        if show_all:
            result["released"] = [r.view() for r in page_released]
        return result

    async def _pts_show(self, _s: Session, args: Args) -> dict[str, Any]:
        self._require_ready()
        record_id = _req_str(args, "record_id", mlimits.MAX_PROTECTION_ID_CHARS)
        gc = self.sm.state.gc
        for released in reversed(gc.released()):
            if released.record.record_id == record_id and all(
                r.record_id != record_id for r in gc.records()
            ):
                return {**released.view(), "released": True}
        return {**gc.record(record_id).view(), "released": False}

    async def _gc_status(self, _s: Session, args: Args) -> dict[str, Any]:
        self._require_ready()
        table = _opt_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        name = None if table is None else TableName.parse(table)
        args, _ = await self._continue_at(args, 4 * mlimits.MAX_SESSION_ID_CHARS)
        position = self._applied_position()
        state = self.sm.state
        if name is not None and not state.catalog.incarnations(name):
            raise TableNotFoundError(f"table {name} does not exist", details={"table": table})
        status = gc_status(state, now_tm=self.clock.now(), table=name)
        tables, next_token = _keyset_page(
            status["tables"],
            key=lambda t: f"{t['table_id']:020d}",
            args=args,
            page_max=L.GC_STATUS_PAGE_TABLES_MAX,
            limit_name="GC_STATUS_PAGE_TABLES_MAX",
            what="tables in gc status",
        )
        for row in tables:
            # A table can be covered by thousands of records: `pts list` has them all.
            ids = row["protections"]
            row["protection_count"] = len(ids)
            row["protections"] = ids[: L.GC_STATUS_PROTECTION_IDS_MAX]
        status["tables"] = tables
        status["next_page_token"] = _position_token(position, next_token)
        status["last_run"] = self.gc.last_run if self.gc is not None else {}
        status["safe_time"] = self.node.safe_time
        return status

    async def _gc_run(self, session: Session, args: Args) -> dict[str, Any]:
        """Run the GC now on the leader (forwarded there), or show what it would do."""
        self._require_ready()
        table = _opt_str(args, "table", L.TABLE_NAME_CHARS_MAX)
        dry_run = _opt_bool(args, "dry_run", False)
        name = None if table is None else TableName.parse(table)
        if name is not None and not self.sm.state.catalog.incarnations(name):
            raise TableNotFoundError(f"table {name} does not exist", details={"table": table})
        if self.node.is_leader() and self.gc is not None:
            # Run to its end when the caller goes away (a closed connection cancels its
            # requests): a cancelled run let go of the GC's lock while its deletion thread,
            # which nothing cancels, still unlinked a chunk it would never report, so the
            # next run could overlap it.
            return await self._run_detached("gc_run", self.gc.run(name, dry_run=dry_run))
        leader = self.node.leader_id()
        if not leader or self.node.is_leader():
            raise _no_leader_known()
        timeout_ms = _timeout(args)
        return await self.forwarder.call(
            leader, session.token, "gc_run", dict(args), timeout_ms=timeout_ms + 1000
        )

    # ------------------------------------------------------------------ backup

    async def _snapshot_begin(self, _s: Session, args: Args) -> dict[str, Any]:
        """Serialise this node's catalog at its applied index for `metastore snapshot save`;
        the bytes are then read with `snapshot_chunk` (metastore/daemon/backup.py).

        Only once the node has applied every entry committed before the call: a commit
        acknowledged anywhere before now has a Tm at most CSmax ahead of this node's clock,
        so safe time past now + CSmax covers it. A node that is not applying (cut off from its
        leader) answers TIMEOUT, or NOT_READY once its safe time trails its clock by more than
        read_staleness_max_ms (`_wait_safe`), retryable, instead of saving an old catalog."""
        self._require_ready()
        top = self.clock.now() + (self._cs_max_ms() << LOGICAL_BITS)
        waited = await self._wait_safe(top, _timeout(args))
        # A view at the applied index now; encoded, hashed and spooled in a thread (on the
        # loop that held it 0.5-0.8 s at a million file entries).
        encode = self.exports.prepare(
            self.sm.state, cluster_id=self.cluster_id, node_id=self.node.node_id
        )
        header = self.exports.add(await asyncio.to_thread(encode))
        return {**header, "waited_ms": waited}

    async def _snapshot_chunk(self, _s: Session, args: Args) -> dict[str, Any]:
        export_id = _req_str(args, "export_id", 64)
        offset = _req_int(args, "offset", 0, 2**62)
        return self.exports.chunk(export_id, offset)

    # ------------------------------------------------------------------ membership

    async def _leader_or_forward(
        self,
        session: Session,
        op: str,
        args: Args,
        local: Callable[[], Awaitable[Any]],
        *,
        forward_timeout_ms: int,
    ) -> dict[str, Any]:
        """Run `local` here if this node leads, else forward `op` to the leader, waiting
        `forward_timeout_ms` for its answer: at least what the leader may take (past it the
        caller gets UNAVAILABLE, outcome unknown, while the leader goes on)."""
        if self.node.is_leader():
            try:
                value = await local()
            except LearnerBehindError as exc:
                # Typed in the details: `cluster promote-node --wait` retries on it alone.
                raise InvalidArgumentError(
                    str(exc),
                    details={
                        "reason": "learner_behind",
                        "node_id": exc.node_id,
                        "match": exc.match,
                        "commit_index": exc.commit,
                    },
                ) from None
            except RaftCoreError as exc:
                raise InvalidArgumentError(str(exc)) from None
            except ProposalTimeoutError as exc:
                raise RequestTimeoutError(str(exc)) from None
            return {"index": value} if isinstance(value, int) else {"ok": True}
        leader = self.node.leader_id()
        if not leader:
            raise _no_leader_known()
        return await self.forwarder.call(
            leader,
            session.token,
            op,
            dict(args),
            timeout_ms=forward_timeout_ms,
            client=session.client,
        )

    async def _add_node(self, session: Session, args: Args) -> dict[str, Any]:
        """Add a member (or, for a member already in, record its `client_address` only).

        Members forward requests to the leader's client port and ask each other's in `cluster
        version`; Raft carries only peer addresses. So the new node's client address is
        recorded through the log first (`SetMemberClientAddress`, apply version 6), and every
        member can reach it once it leads. Which address: `client_address` if given, else the
        leader's cluster.toml entry for the node; a given one that disagrees with that entry is
        refused (the file wins where it names the node, and the two must agree)."""
        node_id = _req_int(args, "node_id", 1, L.NODE_ID_MAX)
        if node_id > CONFIG_NODE_ID_MAX:
            # No node could start with that id (its config refuses it): as a voter it would
            # count against the quorum for ever. (remove_node still takes any id.)
            raise InvalidArgumentError(
                f"node id {node_id} is above {CONFIG_NODE_ID_MAX}, the largest a node's config "
                "accepts",
                details={"node_id": node_id, "max": CONFIG_NODE_ID_MAX},
            )
        addr = _req_str(args, "raft_address", 300)
        host, _, port = addr.rpartition(":")
        if not host or not _is_uint(port) or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"raft_address must be HOST:PORT, got {addr!r}")
        given_client = _opt_str(args, "client_address", 300)
        client = None if given_client is None else _host_port(given_client, "client_address")
        learner = _opt_bool(args, "learner", True)
        timeout_ms = _membership_timeout(args)
        # What the leader found, for its reply (set by `local`, which runs on the leader only).
        outcome: dict[str, Any] = {}
        # Not run detached (unlike remove_node): cut between the record and the change (its
        # caller gone, or the record's wait timed out), the address is recorded for a node that
        # is no member, which no member uses (only a leader's address is: metastore.
        # member_clients), and running add_node again records it again and adds the node.

        async def local() -> int:
            deadline = time.monotonic() + timeout_ms / 1000
            recorded = await self._record_member_client(session, node_id, client, timeout_ms)
            outcome.update(recorded)
            conf = self.node.status().core.conf
            if given_client is not None and node_id in conf.members():
                # Already in (added before apply version 6, or without an address): only the
                # record was asked for. Without an address this stays "already a member".
                outcome["already_member"] = True
                if "recorded_index" not in recorded:
                    raise InvalidArgumentError(
                        f"node {node_id} is already a member, and its client address cannot "
                        f"be recorded: {recorded['warning']}",
                        details={"node_id": node_id},
                    )
                index: int = recorded["recorded_index"]
                return index
            return await self.node.add_node(
                node_id, (host, int(port)), learner=learner, timeout_ms=_ms_left(deadline)
            )

        reply = await self._leader_or_forward(
            session,
            "add_node",
            args,
            local,
            # The leader records the client address, then waits for the change: both within
            # timeout_ms.
            forward_timeout_ms=timeout_ms + L.FORWARD_REPLY_MARGIN_MS,
        )
        if "index" not in reply:
            return reply  # forwarded: the leader's answer, judged on the leader's config
        reply.update(outcome)
        reply.pop("recorded_index", None)
        return reply

    async def _record_member_client(
        self,
        session: Session,
        node_id: int,
        given: tuple[str, int] | None,
        timeout_ms: int,
    ) -> dict[str, Any]:
        """On the leader: record `node_id`'s client address through the log (`given`, else
        this node's cluster.toml entry), and say in the reply's words what members know."""
        configured_text = self.client_addresses.get(node_id)
        configured = None if configured_text is None else _host_port(configured_text, "config")
        if given is not None and configured is not None and given != configured:
            raise InvalidArgumentError(
                f"client_address {format_address(*given)} disagrees with node {node_id}'s "
                f"entry in the leader's cluster.toml ({configured_text}): the file wins where "
                "it names the node; give its address or none",
                details={
                    "node_id": node_id,
                    "client_address": format_address(*given),
                    "configured": configured_text,
                },
            )
        address = given or configured
        earlier = None if address is not None else self.sm.state.member_clients.address_of(node_id)
        if earlier is not None:
            # Added before with an address (then removed): members still use that one.
            return {
                "client_address_known": True,
                "client_address": format_address(*earlier),
                "warning": (
                    f"node {node_id}'s client address is the one recorded when it was added "
                    f"before, {format_address(*earlier)}: if it changed, run `metastore "
                    f"cluster add-node {node_id} RAFT_ADDR --client-address HOST:PORT` (it "
                    f"records the address of a member already in)"
                ),
            }
        if address is None:
            # Nothing to record: only members whose cluster.toml names it can reach it.
            return {
                "client_address_known": False,
                "warning": (
                    f"node {node_id}'s client address is unknown (no --client-address, and it "
                    f"is not in the leader's cluster.toml): it joins, but the other members "
                    f"cannot forward requests to it should it lead, nor ask its release "
                    f"(cluster version). Run `metastore cluster add-node {node_id} RAFT_ADDR "
                    f"--client-address HOST:PORT` to record it, or: {MISSING_MEMBER_FIX}"
                ),
            }
        if not self.sm.state.rules_at_least(6):
            # Nodes of the previous release cannot apply the record (a rolling upgrade that is
            # not finalized): join as before; members know the address from cluster.toml only.
            return {
                "client_address_known": False,
                "warning": (
                    f"the cluster's apply version is {self.sm.state.apply_version}: members "
                    f"can record node {node_id}'s client address from apply version 6, so only "
                    f"members whose cluster.toml names it can reach it should it lead. Once "
                    f"every member runs this release, run `metastore cluster version "
                    f"--finalize`, then `metastore cluster add-node {node_id} RAFT_ADDR "
                    f"--client-address {format_address(*address)}` (it records the address of "
                    f"a member already in)."
                ),
            }
        cmd = SetMemberClientAddress(
            node_id=node_id,
            host=address[0],
            port=address[1],
            by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        applied = await self._propose_command(session, cmd, timeout_ms)
        return {
            "client_address_known": True,
            "client_address": format_address(*address),
            "recorded_index": applied["index"],
        }

    def _peer_client_addresses(self, members: Sequence[int]) -> dict[str, str]:
        known = {node_id: self._client_address_of(node_id) for node_id in members}
        known.update(self.client_addresses)
        return {str(k): v for k, v in sorted(known.items()) if v is not None}

    def _client_address_of(self, node_id: int) -> str | None:
        """Where node `node_id`'s client port is: this node's cluster.toml entry, else the
        address the cluster recorded (`add-node --client-address`), else None."""
        configured = self.client_addresses.get(node_id)
        if configured is not None:
            return configured
        recorded = self.sm.state.member_clients.address_of(node_id)
        return None if recorded is None else format_address(*recorded)

    async def _promote_node(self, session: Session, args: Args) -> dict[str, Any]:
        node_id = _req_int(args, "node_id", 1, L.NODE_ID_MAX)
        timeout_ms = _membership_timeout(args)
        return await self._leader_or_forward(
            session,
            "promote_node",
            args,
            lambda: self.node.promote_node(node_id, timeout_ms=timeout_ms),
            forward_timeout_ms=timeout_ms + L.FORWARD_REPLY_MARGIN_MS,
        )

    async def _remove_node(self, session: Session, args: Args) -> dict[str, Any]:
        """Remove a member, then revoke the TLS certificate(s) it presented on peer links to
        this node (the leader) or to the other members, so it cannot come back with them.

        Both run to their end even when the caller goes away (a closed connection cancels its
        requests): cancelled between the two, a removal left the member's certificate
        accepted, and nobody was told."""
        node_id = _req_int(args, "node_id", 1, L.NODE_ID_MAX)
        timeout_ms = _membership_timeout(args)
        return await self._run_detached(
            f"remove_node {node_id}", self._remove_and_revoke(session, node_id, args, timeout_ms)
        )

    async def _run_detached(
        self, what: str, steps: Coroutine[Any, Any, dict[str, Any]]
    ) -> dict[str, Any]:
        """Run `steps` to their end whatever the caller does, and return their result. A
        caller that goes away (its connection closed) leaves the request's audit record to
        them: written with the outcome they reach, once they end."""
        work = asyncio.create_task(steps, name=what)  # named in the stop's warning
        self._detached.add(work)
        work.add_done_callback(functools.partial(self._detached_done, what))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            request = _REQUEST_RECORD.get()
            if request is not None:
                request.handed_over = True
                work.add_done_callback(functools.partial(self._record_detached, request))
            raise

    def _record_detached(self, request: _RequestRecord, work: asyncio.Future[Any]) -> None:
        if work.cancelled():
            code = CANCELLED_OUTCOME  # the node stopped before they ended
        elif (exc := work.exception()) is None:
            code = "OK"
        else:
            code = exc.code.value if isinstance(exc, MetastoreError) else "INTERNAL"
        self._count_and_audit(request.session, request.op, request.args, code, request.started)

    def _detached_done(self, what: str, work: asyncio.Future[Any]) -> None:
        self._detached.discard(work)
        if not work.cancelled() and work.exception() is not None:
            # Its caller may be gone (nobody else sees the error then).
            log.info("%s ended with an error: %s", what, work.exception())

    async def _remove_and_revoke(
        self, session: Session, node_id: int, args: Args, timeout_ms: int
    ) -> dict[str, Any]:
        seen: tuple[str, ...] = ()
        conf = self.node.status().core.conf
        member = node_id in conf.voters or node_id in conf.learners
        if member and self.node.is_leader() and self.node.config.tls is not None:
            seen = await self._gather_certificates(session, node_id)
        reply = await self._leader_or_forward(
            session,
            "remove_node",
            args,
            lambda: self.node.remove_node(node_id, timeout_ms=timeout_ms),
            # The leader asks for certificates before the change and revokes them after it.
            forward_timeout_ms=timeout_ms
            + L.REMOVE_NODE_REVOCATION_MS_MAX
            + L.FORWARD_REPLY_MARGIN_MS,
        )
        if "revoked" in reply:
            return reply  # forwarded: the leader revoked what it saw
        return {**reply, **await self._revoke_removed(session, node_id, seen)}

    async def _gather_certificates(self, session: Session, node_id: int) -> tuple[str, ...]:
        """What `node_id` presented here, plus what the other members saw (asked in parallel,
        bounded; a member that does not answer adds nothing): the leader may have started
        while `node_id` was down."""
        conf = self.node.status().core.conf
        others = sorted((set(conf.voters) | set(conf.learners)) - {self.node.node_id, node_id})

        async def ask(member: int) -> list[str]:
            try:
                result = await self.forwarder.call(
                    member, session.token, "cert_revoked", {}, timeout_ms=L.CERTS_ASK_TIMEOUT_MS
                )
            except MetastoreError as exc:
                log.info("node %d did not say what node %d presented: %s", member, node_id, exc)
                return []
            found = result.get("peers_seen", {}).get(str(node_id), [])
            return [fp for fp in found if is_fingerprint(fp)] if isinstance(found, list) else []

        answers = await asyncio.gather(*(ask(m) for m in others))
        seen = [*self._certificates_of(node_id), *(fp for a in answers for fp in a)]
        return tuple(dict.fromkeys(seen))[-mlimits.MAX_FINGERPRINTS_PER_REVOKE :]

    def _certificates_of(self, node_id: int) -> tuple[str, ...]:
        """The certificate fingerprints `node_id` presented on this node's peer links."""
        transport = self.node.transport
        seen = transport.peer_certificates(node_id) if transport is not None else ()
        if node_id == self.node.node_id and self.own_cert_fingerprint:
            seen = (*seen, self.own_cert_fingerprint)
        return tuple(dict.fromkeys(seen))[-mlimits.MAX_FINGERPRINTS_PER_REVOKE :]

    async def _revoke_removed(
        self, session: Session, node_id: int, fingerprints: tuple[str, ...]
    ) -> dict[str, Any]:
        if not fingerprints:
            note = (
                "no TLS on peer links: nothing to revoke (the cluster secret is shared)"
                if self.node.config.tls is None
                else f"node {node_id} presented no certificate to the members that answered "
                "since they started; revoke its certificate file with `metastore cluster "
                "revoke-cert`"
            )
            if self.node.config.tls is not None:
                log.warning("removed node %d: %s", node_id, note)
            return {"revoked": [], "revoke_note": note}
        cmd = RevokeCerts(
            fingerprints=fingerprints,
            node_id=node_id,
            reason="removed",
            by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        error: MetastoreError | None = None
        # Bounded: a leader that removed itself hands leadership over, so the revocation may
        # need a moment to find the next leader.
        for _ in range(L.REVOKE_ON_REMOVE_ATTEMPTS):
            try:
                applied = await self._propose_command(session, cmd, L.REVOKE_ON_REMOVE_TIMEOUT_MS)
            except (UnavailableError, NotLeaderError, RequestTimeoutError) as exc:
                error = exc
                await asyncio.sleep(L.REVOKE_ON_REMOVE_RETRY_S)
                continue
            result = applied["result"]
            log.info(
                "removed node %d: revoked its TLS certificate(s) %s",
                node_id,
                ", ".join(fingerprints),
            )
            return {"revoked": list(fingerprints), "revoked_new": result.get("revoked", [])}
        log.error(
            "removed node %d but could not revoke its certificate(s) %s: %s; run `metastore "
            "cluster revoke-cert --fingerprint HEX` for each",
            node_id,
            ", ".join(fingerprints),
            error,
        )
        return {
            "revoked": [],
            "revoke_error": str(error),
            "not_revoked": list(fingerprints),
        }

    async def _cert_revoke(self, session: Session, args: Args) -> dict[str, Any]:
        """Revoke one certificate by fingerprint, cluster-wide (a leaked or rotated one)."""
        fingerprint = normalize_fingerprint(_req_str(args, "fingerprint", 256))
        node_id = _opt_int(args, "node_id", 0, L.NODE_ID_MAX) or 0
        force = _opt_bool(args, "force", False)
        request_id = _opt_str(args, "request_id", mlimits.MAX_REQUEST_ID_CHARS) or ""
        # One deadline for the whole call: a catch-up before a refusal, then the proposal.
        deadline = time.monotonic() + _timeout(args) / 1000
        in_use = [] if force else self._certificate_users(fingerprint)
        if in_use and not self.sm.state.revoked.is_revoked(fingerprint):
            # A repeat of a revocation whose reply was lost (the client sends the same
            # request_id to another node) must not be refused by a node that has not applied
            # it yet and so still keeps a link that uses the certificate: the refusal rests on
            # a state that has applied every entry committed before the call. A node that
            # cannot catch up answers NOT_READY or a catch-up TIMEOUT (nothing done), and the
            # client asks another node. Apply is unchanged: a revoked certificate stays
            # revoked, and the same request id answers its recorded result.
            self._require_ready()
            await self._catch_up(deadline)
            in_use = self._certificate_users(fingerprint)
        if in_use and not self.sm.state.revoked.is_revoked(fingerprint):
            # Revoking it cuts those members off at once: the rotation order is new certificate
            # first, then the revocation. An emergency (a leaked key) may pass force.
            raise InvalidArgumentError(
                f"certificate sha256 {fingerprint} is in use by node(s) "
                f"{', '.join(map(str, in_use))} on live peer links; revoking it cuts them off. "
                "Restart them on a new certificate first (metastore cluster certs --ca-dir DIR "
                "--node N --out NEW_DIR), or pass force",
                details={"fingerprint": fingerprint, "in_use_by": in_use},
            )
        cmd = RevokeCerts(
            request_id=request_id,
            fingerprints=(fingerprint,),
            node_id=node_id,
            reason="operator",
            by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
        )
        applied = await self._propose_command(session, cmd, _ms_left(deadline))
        result = dict(applied["result"])
        result["fingerprint"] = fingerprint
        result["tm"] = applied["tm"]
        # A repeat of the same request id: the first one's result, as apply recorded it.
        result["deduplicated"] = bool(applied.get("deduplicated"))
        return result

    async def _apply_version(self, session: Session, args: Args) -> dict[str, Any]:
        """The cluster's apply version, and the newest each member's release supports."""
        members = await self._members_apply_versions(session, _timeout(args))
        known = [m["supported"] for m in members if m["supported"] is not None]
        return {
            "apply_version": self.sm.state.apply_version,
            "members": members,
            # What `apply_version_finalize` would move to (None: a member did not answer).
            "finalizable": min(known) if len(known) == len(members) else None,
        }

    async def _apply_version_finalize(self, session: Session, args: Args) -> dict[str, Any]:
        """Move the cluster's apply version to the newest every member's release supports
        (or to `version`, if every member supports that): the last step of an upgrade, once
        every node runs the new release. Idempotent; never moves back."""
        timeout_ms = _timeout(args)
        wanted = _opt_int(args, "version", 1, MAX_APPLY_VERSION)
        # Checked before anything is asked, not only when a change is proposed: a finalize
        # that had nothing to move took any value (a list, a megabyte) and answered OK.
        request_id = _opt_str(args, "request_id", mlimits.MAX_REQUEST_ID_CHARS) or ""
        members = await self._members_apply_versions(session, timeout_ms)
        _refuse_unless_supported(members, wanted)
        target = min(int(m["supported"]) for m in members) if wanted is None else wanted
        current = self.sm.state.apply_version
        if target < current:
            raise InvalidArgumentError(
                f"the cluster is at apply version {current}; it never moves back to {target}",
                details={"version": target, "apply_version": current},
            )
        result: dict[str, Any] = {"apply_version": current, "previous": current}
        if target > current:
            cmd = SetApplyVersion(
                request_id=request_id,
                version=target,
                by=session.client[: mlimits.MAX_SESSION_LABEL_CHARS],
            )
            applied = await self._propose_command(session, cmd, timeout_ms)
            result = dict(applied["result"])
            result["tm"] = applied["tm"]
        result["changed"] = result["apply_version"] != result["previous"]
        result["members"] = members
        return result

    async def _members_apply_versions(
        self, session: Session, timeout_ms: int
    ) -> list[dict[str, Any]]:
        """Every member's `apply_version_supported`, asked in parallel with the caller's token
        (None and an error for a member that did not answer)."""
        conf = self.node.status().core.conf
        members = sorted({*conf.voters, *conf.learners})
        probe_ms = min(timeout_ms, L.APPLY_VERSION_PROBE_TIMEOUT_MS)

        async def one(node_id: int) -> dict[str, Any]:
            row: dict[str, Any] = {"node_id": node_id, "supported": None, "error": ""}
            if node_id == self.node.node_id:
                row["supported"] = APPLY_VERSION_SUPPORTED
                return row
            if self._client_address_of(node_id) is None:
                row["error"] = (
                    f"node {node_id}: its client address is unknown here (not in this node's "
                    f"cluster.toml, none recorded by `cluster add-node --client-address`). "
                    f"{MISSING_MEMBER_FIX}"
                )
                return row
            try:
                status = await self.forwarder.call(
                    node_id, session.token, "status", {}, timeout_ms=probe_ms
                )
            except MetastoreError as exc:
                row["error"] = exc.message
                return row
            # A release from before apply versions reports nothing: it applies version 1.
            supported = status.get("apply_version_supported", INITIAL_APPLY_VERSION)
            if isinstance(supported, int) and not isinstance(supported, bool):
                row["supported"] = supported
            else:
                row["error"] = f"node {node_id}: unreadable apply_version_supported"
            return row

        return list(await asyncio.gather(*(one(n) for n in members)))

    def _certificate_users(self, fingerprint: str) -> list[int]:
        """The nodes presenting this certificate right now, as far as this node can tell: on
        its open peer links, or itself."""
        transport = self.node.transport
        live = transport.live_certificates() if transport is not None else ()
        users = {peer for peer, fp in live if fp == fingerprint}
        if fingerprint == self.own_cert_fingerprint:
            users.add(self.node.node_id)
        return sorted(users)

    async def _cert_revoked(self, _s: Session, _args: Args) -> dict[str, Any]:
        """The revocation list as this node applied it, this node's own certificate, and the
        certificates its peers presented here (what a removal would revoke)."""
        transport = self.node.transport
        conf = self.node.status().core.conf
        members = (*conf.voters, *conf.learners)
        own = self.own_cert_fingerprint
        return {
            "revoked": [c.to_view() for c in self.sm.state.revoked.entries()],
            "count": len(self.sm.state.revoked),
            "this_node": {
                "node_id": self.node.node_id,
                "fingerprint": own,
                "revoked": bool(own) and self.sm.state.revoked.is_revoked(own),
            },
            "peers_seen": {
                str(n): list(transport.peer_certificates(n)) if transport is not None else []
                for n in sorted(set(members))
                if n != self.node.node_id
            },
        }

    async def _transfer_leader(self, session: Session, args: Args) -> dict[str, Any]:
        target = _req_int(args, "target", 1, L.NODE_ID_MAX)
        await self._leader_or_forward(
            session,
            "transfer_leader",
            args,
            lambda: self.node.transfer_leader(target),
            forward_timeout_ms=L.TRANSFER_LEADER_FORWARD_TIMEOUT_MS,
        )
        return {"leader": target}


# ---------------------------------------------------------------------- request parsing


def _reply_result(result: dict[str, Any]) -> dict[str, Any]:
    """An applied command's result as a reply carries it. DROP NAMESPACE CASCADE names every
    table it dropped (up to MAX_TABLES, 257 characters each: far more than one frame); the
    reply names the first DROPPED_TABLES_REPLY_MAX and counts them all, so a drop that was
    applied is never answered LIMIT_EXCEEDED. The applied outcome itself is left alone."""
    dropped = result.get("dropped_tables")
    if not isinstance(dropped, list):
        return result
    return {
        **result,
        "dropped_tables": dropped[: L.DROPPED_TABLES_REPLY_MAX],
        "dropped_table_count": len(dropped),
    }


def _brief_wire_error(exc: MetastoreError) -> dict[str, object]:
    """`exc.to_wire()`, its message cut at ERROR_MESSAGE_CHARS_MAX and each detail whose
    encoding passes ERROR_DETAIL_BYTES_MAX replaced by a brief repr of it. The last guard for
    errors that quote what a client sent (a table name, a forwarded command's fields) whole:
    a request holds up to CLIENT_FRAME_BYTES_MAX, and an error reply past the frame limit
    could not be sent at all (the request got no reply)."""
    wire = exc.to_wire()
    message = exc.message
    if len(message) > L.ERROR_MESSAGE_CHARS_MAX:
        wire["message"] = (
            f"{message[: L.ERROR_MESSAGE_CHARS_MAX]}... (cut: {len(message)} characters in all)"
        )
    details = exc.details
    if details:
        brief: dict[str, object] = {}
        for key, value in details.items():
            try:
                size = len(msgpack.packb(value, use_bin_type=True))
            except (TypeError, ValueError, OverflowError):
                size = L.ERROR_DETAIL_BYTES_MAX + 1
            brief[key] = brief_repr(value) if size > L.ERROR_DETAIL_BYTES_MAX else value
        wire["details"] = brief
    return wire


def _parse_request(frame: object) -> tuple[int, str, Args]:
    if not isinstance(frame, dict):
        raise BadRequestError("a request must be a map {id, op, args}")
    extra = set(frame) - {"id", "op", "args"}
    if extra:
        raise BadRequestError(f"unknown request fields: {show_names(sorted(map(str, extra)))}")
    rid = frame.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool) or not 0 < rid < 2**63:
        raise BadRequestError("'id' must be a positive integer")
    op = frame.get("op")
    if not isinstance(op, str) or not 0 < len(op) <= L.OP_NAME_CHARS_MAX:
        raise BadRequestError("'op' must be a short string")
    args = frame.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise BadRequestError("'args' must be a map")
    return rid, op, args


def _check_args(args: Args, allowed: frozenset[str]) -> None:
    unknown = set(args) - allowed
    if unknown:
        raise BadRequestError(
            f"unknown arguments {show_names(sorted(map(str, unknown)))}; allowed: {sorted(allowed)}"
        )


def _req_str(args: Args, key: str, max_chars: int) -> str:
    v = _opt_str(args, key, max_chars)
    if v is None:
        raise BadRequestError(f"missing argument {key!r}")
    return v


def _opt_str(args: Args, key: str, max_chars: int) -> str | None:
    v = args.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise BadRequestError(f"{key!r} must be a string")
    if len(v) > max_chars:
        raise LimitExceededError(
            f"{key!r} is {len(v)} characters; the limit is {max_chars}",
            details={"limit": key, "max": max_chars, "value": len(v)},
        )
    return v


def _opt_bool(args: Args, key: str, default: bool) -> bool:
    """An optional flag: absent (or None) is `default`; anything but a bool is BAD_REQUEST
    (not its truthiness: `"false"` or `[0]` would read as true)."""
    v = args.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequestError(f"{key!r} must be a boolean")
    return v


def _req_int(args: Args, key: str, lo: int, hi: int) -> int:
    v = _opt_int(args, key, lo, hi)
    if v is None:
        raise BadRequestError(f"missing argument {key!r}")
    return v


def _opt_int(args: Args, key: str, lo: int, hi: int) -> int | None:
    v = args.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadRequestError(f"{key!r} must be an integer")
    if not lo <= v <= hi:
        raise InvalidArgumentError(
            f"{key!r} = {v} is out of range [{lo}, {hi}]", details={key: v, "min": lo, "max": hi}
        )
    return v


def _req_str_list(args: Args, key: str, max_items: int, limit_name: str) -> list[str]:
    """A list of 1..`max_items` names (of at most TABLE_NAME_CHARS_MAX characters each).
    Past either bound LIMIT_EXCEEDED naming it, as a single name past its bound (`_opt_str`)
    and a command past its limits (`validate_command`) are; not a list of strings,
    BAD_REQUEST."""
    v = args.get(key)
    if not isinstance(v, list) or not v:
        raise BadRequestError(f"{key!r} must be a list of 1..{max_items} strings")
    if len(v) > max_items:
        raise limit_exceeded(limit_name, max_items, len(v), f"entries of {key!r}")
    if not all(isinstance(x, str) for x in v):
        raise BadRequestError(f"{key!r} must list strings")
    longest = max(len(x) for x in v)
    if longest > L.TABLE_NAME_CHARS_MAX:
        raise LimitExceededError(
            f"an entry of {key!r} is {longest} characters; the limit is {L.TABLE_NAME_CHARS_MAX}",
            details={"limit": key, "max": L.TABLE_NAME_CHARS_MAX, "value": longest},
        )
    return list(v)


def _refuse_unless_supported(members: list[dict[str, Any]], version: int | None) -> None:
    """Refuse moving the apply version to `version` (None: to the lowest every member
    supports) unless every member (rows of `_members_apply_versions`) said which release it
    runs, and each supports `version`."""
    silent = [m for m in members if m["supported"] is None]
    if silent:
        ids = ", ".join(str(m["node_id"]) for m in silent)
        raise UnavailableError(
            f"member(s) {ids} did not say which release they run, so the apply version "
            f"cannot move: {'; '.join(str(m['error']) for m in silent)}",
            details={"nodes": [m["node_id"] for m in silent]},
        )
    lowest = min(int(m["supported"]) for m in members)
    if version is not None and version > lowest:
        older = [m["node_id"] for m in members if int(m["supported"]) < version]
        raise InvalidArgumentError(
            f"apply version {version} needs every member's release to support it; node(s) "
            f"{', '.join(map(str, older))} support at most {lowest}: upgrade them first",
            details={"version": version, "nodes": older, "supported": lowest},
        )


def _membership_timeout(args: Args) -> int:
    """add_node / promote_node / remove_node: how long the leader waits for the change to
    commit (the caller's `timeout_ms`, else MEMBERSHIP_TIMEOUT_MS_DEFAULT)."""
    v = _opt_int(args, "timeout_ms", 1, L.REQUEST_TIMEOUT_MS_MAX)
    return L.MEMBERSHIP_TIMEOUT_MS_DEFAULT if v is None else v


def _timeout(args: Args) -> int:
    v = _opt_int(args, "timeout_ms", 1, L.REQUEST_TIMEOUT_MS_MAX)
    return L.REQUEST_TIMEOUT_MS_DEFAULT if v is None else v


def _ms_left(deadline: float) -> int:
    """Milliseconds until `deadline` (time.monotonic()) for the next wait of a call that has
    one deadline; RequestTimeoutError (retryable, nothing done yet) once it has passed."""
    left = int((deadline - time.monotonic()) * 1000)
    if left < 1:
        raise RequestTimeoutError("the request's timeout_ms passed before it could be done")
    return left


def _not_our_token(token: object) -> BadRequestError:
    return BadRequestError(f"'page_token' {brief_repr(token)} is not one this server handed out")


def _page_token(token: object) -> tuple[int, int]:
    """`<as_of>:<offset>[:<items>[:<table id>]]` as `files` hands it out (opaque to clients;
    the shorter forms are those of earlier releases, and `compaction_view`'s)."""
    parts = token.split(":", 4) if isinstance(token, str) else []
    if not 2 <= len(parts) <= 4 or not all(_is_uint(p) for p in parts) or int(parts[0]) > MAX_TS:
        raise _not_our_token(token)
    return int(parts[0]), int(parts[1])


# A keyset page token names where its page stopped and the position (a safe time) it was
# answered at: `<where>` US `<position>`. The next page may be asked of another node; it waits
# until its safe time reaches the position first, so it answers from a state at least as new
# (a node that had not applied that far skipped every row created in between). The separator
# is a control character, which no key holds (names and ids refuse them): a token without it
# is one of the previous release (no position), and a node of the previous release given a
# new token compares `key > token` as it did with `<where>` alone, since the separator sorts
# below every character a key can continue with (or refuses it: BAD_REQUEST).
_POSITION_SEPARATOR: Final = "\x1f"
_POSITION_TOKEN_CHARS_MAX: Final = 1 + len(str(MAX_TS))


def _position_token(position: int, where: str | None) -> str | None:
    return None if where is None else f"{where}{_POSITION_SEPARATOR}{position}"


def _split_position_token(token: str) -> tuple[int | None, str]:
    """(position, where) of a keyset page token; position None for a token of the previous
    release (no separator). A token with the separator that is not well formed is
    BAD_REQUEST."""
    if _POSITION_SEPARATOR not in token:
        return None, token
    where, _, position_text = token.rpartition(_POSITION_SEPARATOR)
    if (
        not _is_uint(position_text)
        or int(position_text) > MAX_TS
        or not where
        or _POSITION_SEPARATOR in where
    ):
        raise _not_our_token(token)
    return int(position_text), where


_Item = TypeVar("_Item")


def _views_within(
    items: Sequence[_Item],
    view: Callable[[_Item], dict[str, Any]],
    *,
    count_max: int,
    bytes_max: int,
) -> tuple[list[dict[str, Any]], int]:
    """A page: the views of the first `items`, at most `count_max` of them and about
    `bytes_max` bytes of msgpack (at least one, whatever its size), and the bytes counted
    (the view that did not fit included)."""
    page: list[dict[str, Any]] = []
    size = 0
    for item in items[:count_max]:
        shown = view(item)
        size += len(msgpack.packb(shown, use_bin_type=True))
        if size > bytes_max and page:
            break
        page.append(shown)
    return page, size


def _host_port(text: str, what: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port); InvalidArgumentError otherwise."""
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not _is_uint(port) or member_address_problem(1, host, int(port)) is not None:
        raise InvalidArgumentError(
            f"{what} must be HOST:PORT (port 1..65535), got {text[:80]!r}",
            details={"argument": what},
        )
    return host, int(port)


def _is_uint(text: str) -> bool:
    """Digits int() takes (str.isdigit() alone also accepts "²", which int() refuses)."""
    return text.isascii() and text.isdigit()


def _files_token(ts: int, offset: int, items: int, table_id: int) -> str:
    """A `files` page token: the listing's moment, where the next page starts, how many
    items (loose files + delete entries) the listing at `ts` had when the token was made, and
    the table id it lists (a token used for another table is refused, not read at its
    offsets)."""
    return f"{ts}:{offset}:{items}:{table_id}"


def _check_token_table(token: str, table: str, table_id: int) -> None:
    """Refuse a `files` page token of another table (BAD_REQUEST: the caller mixed up its
    listings). At the token's fixed ts a name means one incarnation, so its id is stable.
    A token of the previous release names no table and is not checked."""
    parts = token.split(":")
    if len(parts) == 4 and int(parts[3]) != table_id:
        raise BadRequestError(
            f"'page_token' is one of a listing of table id {parts[3]}, not of {table} (table "
            f"id {table_id}): continue each listing with its own tokens",
            details={"table": table, "table_id": table_id, "token_table_id": int(parts[3])},
        )


def _check_listing_unchanged(token: str, table: str, items: int) -> None:
    """Refuse a `files` page token of a listing that changed shape since. The listing at a
    fixed ts only loses items: a compaction moves its oldest loose entries into a manifest
    (and folds delete entries), which shifts every offset, and the new manifest rides on the
    first page only; continuing would silently skip files. The client lists again at the
    same as_of (MANIFEST_CONFLICT, as for a compactor's stale view)."""
    parts = token.split(":")
    if len(parts) >= 3 and int(parts[2]) != items:
        raise ManifestConflictError(
            f"{table}: the listing changed between pages (a compaction moved entries into a "
            "manifest); list again from the first page at the same as_of",
            details={
                "table": table,
                "what": "page_token",
                "expected": parts[2],
                "actual": str(items),
            },
        )


def _files_page(files: Sequence[Any], args: Args, ts: int) -> tuple[int, int]:
    """The [start, end) slice of a `files` listing to return. With `limit` or `page_token` the
    client pages: at most `limit` files and about FILES_PAGE_BYTES_MAX bytes per reply. A
    client that does not page gets the whole listing, or - if it cannot fit one reply - a
    typed LIMIT_EXCEEDED telling it to page (never a silently truncated list)."""
    token = args.get("page_token")
    start = 0 if token is None else _page_token(token)[1]
    if start > len(files):
        raise BadRequestError("'page_token' points past the end of the listing")
    limit = _opt_int(args, "limit", 1, L.FILES_PAGE_FILES_MAX)
    paging = limit is not None or token is not None
    count_max = limit or L.FILES_PAGE_FILES_MAX
    end, size = start, 0
    while end < len(files) and end - start < count_max:
        size += len(files[end].path) + L.FILES_ENTRY_OVERHEAD_BYTES
        if size > L.FILES_PAGE_BYTES_MAX and end > start:
            break
        end += 1
    if end < len(files) and not paging:
        raise limit_exceeded(
            "FILES_PAGE_FILES_MAX",
            L.FILES_PAGE_FILES_MAX,
            len(files),
            f"files of the listing at {ts_text(ts)} (page with 'limit' and 'page_token')",
        )
    return start, end


def _keyset_page(
    items: list[_Item],
    *,
    key: Callable[[_Item], str],
    args: Args,
    page_max: int,
    limit_name: str,
    what: str,
    token_chars_max: int = 4 * mlimits.MAX_SESSION_ID_CHARS,
) -> tuple[list[_Item], str | None]:
    """One page of `items` (sorted by `key`): those after `page_token` (the last key of the
    previous page, so items added or removed meanwhile shift nothing), at most `limit`
    (<= page_max). A caller that asks for no page gets everything if it fits one page, else
    LIMIT_EXCEEDED, never a silently short list."""
    limit = _opt_int(args, "limit", 1, page_max)
    token = _opt_str(args, "page_token", token_chars_max)
    if token is not None:
        items = [i for i in items if key(i) > token]
    count = limit or page_max
    page = items[:count]
    more = len(items) > count
    if more and limit is None and token is None:
        raise limit_exceeded(
            limit_name, page_max, len(items), f"{what} in one reply (page with 'limit')"
        )
    return page, key(page[-1]) if more else None


_LEASE_KEYS: Final = frozenset({"table", "table_id", "version"})


def _lease_key(lease: Lease) -> str:
    return f"{lease.table_id:020d}.{lease.version:020d}.{lease.session_id}"


def _replication(st: NodeStatus) -> dict[str, dict[str, Any]]:
    """The leader's view of every other member (empty on a follower): the index it holds
    (`match`), the last index sent to it (`sent`: what it may hold once the messages in flight
    arrive, e.g. appends queued while its link was down), how many committed entries it lacks,
    the replication state (probe, replicate, snapshot), whether it answered lately, and the
    bytes of a snapshot transfer to it in progress (the long part of adding a node to a large
    catalog)."""
    if st.core.role.value != "leader":
        return {}
    peers = st.transport.get("peers", {})
    out: dict[str, dict[str, Any]] = {}
    for node_id, pr in sorted(st.core.progress.items()):
        if node_id == st.core.node_id:
            continue
        link = peers.get(node_id, {})
        out[str(node_id)] = {
            "match": pr.match,
            "sent": pr.sent,
            "behind": max(0, st.core.commit_index - pr.match),
            "state": pr.state,
            "learner": pr.is_learner,
            "active": pr.recent_active,
            "snapshot_bytes": link.get("snapshot_transfer_bytes", 0),
            "snapshot_acked_bytes": link.get("snapshot_transfer_acked_bytes", 0),
        }
    return out


def _distinct_leases(keys: list[LeaseKey]) -> tuple[LeaseKey, ...]:
    """One key per (table id, version), in first-seen order. Names are case-insensitive, so a
    client naming one table in two spellings (the bridge keys its leases by the names a batch
    was given) means one lease, and Acquire/ReleaseLeases refuse a key listed twice."""
    seen: dict[tuple[int, int], LeaseKey] = {}
    for key in keys:
        seen.setdefault((key.table_id, key.version), key)
    return tuple(seen.values())


def _for_apply_version(cmd: Command, state: MetastoreState) -> Command:
    """`cmd` without the fields of rules the cluster's apply version does not have yet
    (metastore.apply_version): nodes of the previous release could not decode them, and would
    refuse the whole entry while the others apply it. The same object when nothing is dropped."""
    if state.rules_at_least(2):
        return cmd
    if isinstance(cmd, AcquireLeases) and (cmd.known_tm is not None or cmd.renew_from is not None):
        return replace(cmd, known_tm=None, renew_from=None)
    if isinstance(cmd, ReleaseLeases) and cmd.known_tm is not None:
        return replace(cmd, known_tm=None)
    return cmd


def _no_leader_known() -> UnavailableError:
    """A follower that knows no leader: nothing of the request was proposed or forwarded
    (every raise site checks before either), so `details.not_sent` says so, as the
    forwarder's own not-sent failures do (metastore.daemon.forward). Without it the client
    took a write refused here for one whose outcome is unknown."""
    return UnavailableError("no leader known right now; retry shortly", details={"not_sent": True})


def _forwarding_link(session: Session) -> bool:
    """Whether `session` is a follower's link forwarding its clients' writes (its hello
    names it so, metastore.daemon.forward): the command's `by` is then the client's, which
    the follower's op set and checked, not this link's."""
    return session.client == FORWARD_CLIENT or session.client.endswith(FORWARDED_SUFFIX)


def _admin_only(cmd: Command) -> bool:
    """Commands only an admin op (or the leader itself) proposes."""
    if isinstance(cmd, ReleaseProtection):
        return cmd.reason != "release"
    return isinstance(
        cmd,
        InitCluster
        | ExpireSessions
        | AdvanceGcThreshold
        | GcFilesDeleted
        | QueueManifestFiles
        | AdvanceSchemaJob
        | RevokeCerts
        | SetApplyVersion
        | SetMemberClientAddress,
    )


def _too_many_connections(maximum: int) -> MetastoreError:
    return LimitExceededError(
        f"more than {maximum} client connections",
        details={"limit": "client_connections_max", "max": maximum},
    )


__all__ = ["ApiServer", "HlcError"]
