"""One metastore node as an OS process: Raft node + catalog state machine + client API + HTTP.

`run_node(config_path, node_id)` is what `metastore node start` calls. It is a thin shell: the
decisions live in `raft.core` and `metastore.state`; this module only wires sockets, files, the
clock and signals to them.

The first leader of a fresh cluster proposes `InitCluster(dd_ms, cs_max_ms)` from its config, so
DD and CSmax are fixed in the replicated state for the cluster's whole life (a later node with a
different config cannot change them). The API server reads both from the replicated state. A
node's clock guard (its HLC's accepted offset, the fence by heartbeat round trips) starts with
its config's `cs_max_ms` and drops to the cluster's once known, if that is smaller.

Signals: SIGTERM is a planned stop of this node alone (a rolling restart, a service manager's
stop): as the leader it first moves leadership to the most caught-up voter (Raft's TimeoutNow,
waiting up to one election timeout), since otherwise the cluster would be without a leader until
its followers' election timeouts run out. SIGINT (Ctrl-C, `metastore cluster down`) stops at
once without a hand-over: when the whole cluster stops, the followers are stopping too and the
hand-over could only wait out its timeout. A SIGINT during a SIGTERM's hand-over cuts it short.
A stop on a fatal error does not try either. SIGHUP reads the tokens again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import faulthandler
import logging
import os
import signal
import socket
import ssl
import stat
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Final

import raft.wal
from hlc import HybridClock, OffsetClock, PhysicalClockError, SystemClock, physical_ms
from metastore import limits as mlimits
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import ExpireSessions, InitCluster, encode_command
from metastore.daemon import api_limits as L
from metastore.daemon.audit import AuditLog
from metastore.daemon.backup import EXPORT_SPOOL_DIR
from metastore.daemon.collector import freeze_decoded, refreeze
from metastore.daemon.config import NodeSettings, load_node_config
from metastore.daemon.forward import LeaderForwarder
from metastore.daemon.gc_worker import GcWorker, ProtectedPaths
from metastore.daemon.job_worker import JobWorker
from metastore.daemon.logs import log_write_failures, setup_logging
from metastore.daemon.metrics import HttpEndpoint, NodeMetrics
from metastore.daemon.ports import port_in_use
from metastore.daemon.secrets import SecretsError, ensure_secrets
from metastore.daemon.server import ApiServer
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.errors import MetastoreError
from metastore.outcome import Outcome
from metastore.revocation import fingerprint_of_pem
from raft.core.errors import RaftCoreError
from raft.errors import NodeIdentityError, NodeStateWriteError, RaftError, TlsConfigError
from raft.node import IDENTITY_FILE, NodeConfig, RaftNode
from raft.oserror import errno_text, os_error_text
from raft.tls import check_node_files, client_context, server_context
from raft.wal import WalError, WalLockedError

log = logging.getLogger("metastore.node")

INIT_RETRY_S = 0.2
# How often the leader looks for sessions past their deadline (a dead driver's leases stop
# blocking at the deadline itself; the sweep only tidies the state and logs the expiry).
SESSION_SWEEP_INTERVAL_S = 0.5
# The signals that stop a node, and whether the leader first hands leadership over (see the
# module docstring). `metastore cluster down` sends SIGINT to every node of the cluster.
STOP_SIGNALS_HAND_OVER: Final[dict[signal.Signals, bool]] = {
    signal.SIGTERM: True,
    signal.SIGINT: False,
}


class NodeStartError(Exception):
    """A listener of this node cannot be opened: its port is in use (another process, or this
    node already running), or its host does not resolve or is not an address of this machine;
    or a file of its data directory cannot be created or opened (`DATA_DIR_UNUSABLE`). Codes are
    upper case, as every error line shows them."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# The node's data directory (or a file in it: node.log, audit.log) cannot be made or opened: a
# file where a directory goes, no permission, a read-only or full file system.
DATA_DIR_UNUSABLE = "DATA_DIR_UNUSABLE"


def _warn_if_others_may_write(data_dir: Path) -> None:
    """Say so when users other than the node's may write its data directory (or the one above
    it, which can replace it): they could rewrite its WAL (the replicated catalog), identity
    and audit log. A warning, not a refusal: the directory is the operator's (a service
    manager may make it), and the node does not change its mode."""
    for directory in (data_dir, data_dir.parent):
        try:
            mode = directory.stat().st_mode
        except OSError:
            continue
        # A sticky parent (/tmp) lets others add entries, not replace ours.
        sticky_parent = directory != data_dir and mode & stat.S_ISVTX
        if mode & 0o022 and not sticky_parent:
            log.warning(
                "%s is writable by other users (mode %s): they could rewrite this node's log "
                "and state; chmod go-w it",
                directory,
                oct(mode & 0o777),
            )


def _unusable(exc: OSError) -> str:
    if exc.filename is None:
        return f"cannot use the data directory: {errno_text(exc)}"
    return f"cannot use {os_error_text(exc)}"


def run_node(config_path: Path, node_id: int | None = None, *, bootstrap: bool = False) -> int:
    """Run a node in the foreground until SIGTERM (a leader hands over first) or SIGINT (no
    hand-over). Returns the process exit code.

    `bootstrap`: this is the member's first start, so an empty data directory is expected and
    gets the member's identity. Without it, a node whose data directory is empty refuses to
    start (exit 2): its data was lost, and it must be removed and added back."""
    _report_fatal_signals()
    settings = load_node_config(config_path, node_id)
    try:
        setup_logging(
            node_id=settings.node_id, log_file=settings.log_file, level=settings.cluster.log_level
        )
    except OSError as exc:  # nowhere to log to: stderr is all there is
        _print_start_error(DATA_DIR_UNUSABLE, _unusable(exc))
        return 2
    _warn_if_others_may_write(settings.data_dir)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # optional: the default loop works, somewhat slower
        log.info("uvloop not available; using the default asyncio loop")
    try:
        return asyncio.run(serve(settings, bootstrap=bootstrap, freeze_heap=True))
    except (
        NodeIdentityError,
        NodeStateWriteError,
        TlsConfigError,
        NodeStartError,
        SecretsError,
    ) as exc:
        log.critical("refusing to start: %s", exc)
        _print_start_error(exc.code, str(exc))
        return 2
    except WalLockedError as exc:
        log.critical("refusing to start: %s", exc)
        _print_start_error(
            exc.code, f"{exc} (is this node already running on {settings.data_dir}?)"
        )
        return 2
    except WalError as exc:
        # Recovery refused the log (CorruptLogError: its message says what to do) before it
        # cut, wrote or deleted anything: the operator's call, in one line, not a traceback.
        log.critical("refusing to start: %s", exc)
        _print_start_error(exc.code, str(exc))
        return 2


def _report_fatal_signals() -> None:
    """Have a fatal signal write every thread's stack to stderr (the node's log under `cluster
    up`) before the process dies of it. A SIGBUS is what a page of a mapped file that the
    disk cannot read (EIO) becomes: a received snapshot's spool, a backup export's spool, an
    evicted page of a large snapshot (raft.wal checks a snapshot file with plain reads at
    open, not later). No Python exception is raised for it, so without this the node
    vanishes without a word. Skipped when stderr is no file (the command run in-process)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        faulthandler.enable(file=sys.stderr, all_threads=True)


def _print_start_error(code: str, message: str) -> None:
    """`Error: CODE: message` on stderr, as every CLI error reads (cli.errors.fail). Raft and
    WAL errors carry snake_case codes (for logs and metrics); a person and a script reading the
    first line of a failed start see the same upper-case form as anywhere else."""
    print(f"Error: {code.upper()}: {message}", file=sys.stderr)


class MetastoreNode:
    """Everything one node runs, startable and stoppable in-process (tests use this too)."""

    def __init__(self, settings: NodeSettings, *, bootstrap: bool = False) -> None:
        self.settings = settings
        cluster = settings.cluster
        # TLS files are checked before anything else starts, so a missing key or a certificate
        # of another CA stops the node with one line naming the file (TlsConfigError).
        tls = cluster.tls
        tls_files = tls.node_files(settings.node_id) if tls is not None else None
        if tls_files is not None:
            check_node_files(tls_files)
        # The fingerprint of the certificate this node presents: a removal of this node revokes
        # it, and the node says so loudly if the cluster revoked it (peers refuse it).
        self.own_cert_fingerprint = (
            fingerprint_of_pem(tls_files.cert_file.read_bytes()) if tls_files is not None else ""
        )
        self._own_cert_revoked_logged = False
        api_tls = forward_tls = None
        if tls is not None and tls_files is not None and tls.clients:
            api_tls = server_context(
                cert_file=tls_files.cert_file,
                key_file=tls_files.key_file,
                ca_file=tls_files.ca_file,
                # OPTIONAL, not REQUIRED: a client without a certificate completes the handshake
                # and gets TLS_REQUIRED with the reason at its hello (ApiServer), instead of a
                # bare close; a certificate of another CA is still refused in the handshake.
                verify_client=ssl.CERT_OPTIONAL if tls.client_cert_required else ssl.CERT_NONE,
            )
            forward_tls = client_context(
                ca_file=tls_files.ca_file,
                cert_file=tls_files.cert_file,
                key_file=tls_files.key_file,
            )
        self.secrets = ensure_secrets(cluster.secrets_dir)
        physical = _physical_clock()
        self.clock = HybridClock(physical, max_offset_ms=cluster.cs_max_ms)
        # Fault injection (tests/chaos): a clock stepped while the node runs, as NTP does.
        self._fault_clock_file = _fault_clock_file(physical)
        self.sm = CatalogStateMachine(
            check_invariants=os.environ.get("METASTORE_CHECK_INVARIANTS") == "1"
        )
        self.stopped = asyncio.Event()
        # Set by SIGINT: stop without (or cut short) a leader's hand-over.
        self.stop_now = asyncio.Event()
        self.fatal: BaseException | None = None
        me = settings.node
        self.raft = RaftNode(
            NodeConfig(
                node_id=me.id,
                cluster_id=cluster.cluster_id,
                data_dir=settings.data_dir,
                listen_host=me.host,
                listen_port=me.raft_port,
                peers=cluster.raft_addresses(),
                secret=self.secrets.cluster_secret,
                tick_ms=cluster.tick_ms,
                election_timeout_ms=cluster.election_timeout_ms,
                heartbeat_interval_ms=cluster.heartbeat_interval_ms,
                idle_safe_time_interval_ms=cluster.idle_safe_time_interval_ms,
                snapshot_every_entries=cluster.snapshot_every_entries,
                snapshot_keep_entries=cluster.snapshot_keep_entries,
                new_member=bootstrap,
                max_clock_offset_ms=cluster.cs_max_ms,
                dial_overrides=_fault_addresses(FAULT_PEER_ADDRESSES_ENV, "Raft peer"),
                tls=settings.peer_tls,
                peer_revoked=self._is_revoked if settings.peer_tls is not None else None,
            ),
            self.sm,
            clock=self.clock,
            on_fatal=self._on_fatal,
        )
        self.metrics = NodeMetrics(me.id)
        self.metrics.protection_in_force = lambda record_id: self.sm.state.gc.in_force(record_id)
        self.metrics.scrape_state = self._scrape_state
        forward_to = {n.id: (n.host, n.client_port) for n in cluster.nodes}
        forward_to.update(_fault_addresses(FAULT_FORWARD_ADDRESSES_ENV, "forwarding"))
        self.forwarder = LeaderForwarder(
            addresses=forward_to,
            clock=self.clock,
            tls=forward_tls,
            revoked=self._is_revoked if forward_tls is not None else None,
            # Read at each connect: the state object is replaced when a snapshot is installed.
            recorded=lambda node_id: self.sm.state.member_clients.address_of(node_id),
        )
        self.gc = GcWorker(
            raft=self.raft,
            sm=self.sm,
            clock=self.clock,
            metrics=self.metrics,
            node_id=me.id,
            interval_ms=cluster.gc_interval_ms,
            orphan_grace_ms=cluster.gc_orphan_grace_ms,
            delete_files_per_s=cluster.gc_delete_files_per_s,
            read_fence_ms=cluster.read_staleness_max_ms + cluster.cs_max_ms,
            # Nor anything outside the roots table locations may lie in (allowed_locations).
            allowed=cluster.location_roots(),
            # A table's LOCATION may name any directory (writer role): never these.
            protected=ProtectedPaths.of(
                dirs=[cluster.data_dir, settings.data_dir, cluster.secrets_dir],
                files=[
                    cluster.path,
                    settings.config_path,
                    settings.log_file,
                    settings.pid_file,
                    *(
                        (tls_files.ca_file, tls_files.cert_file, tls_files.key_file)
                        if tls_files is not None
                        else ()
                    ),
                ],
            ),
        )
        self.jobs = JobWorker(raft=self.raft, sm=self.sm, clock=self.clock)
        self.api = ApiServer(
            node=self.raft,
            sm=self.sm,
            clock=self.clock,
            secrets=self.secrets,
            forwarder=self.forwarder,
            metrics=self.metrics,
            cluster_id=cluster.cluster_id,
            client_addresses={n.id: n.client_address for n in cluster.nodes},
            warehouse=cluster.warehouse,
            allowed_locations=cluster.location_roots(),
            session_ttl_ms=cluster.session_ttl_ms,
            session_heartbeat_ms=cluster.session_heartbeat_ms,
            connections_max=cluster.client_connections_max,
            loose_files_max=cluster.loose_files_max,
            read_staleness_max_ms=cluster.read_staleness_max_ms,
            audit=AuditLog(settings.data_dir, node_id=me.id),
            gc=self.gc,
            tls=api_tls,
            tls_client_cert_required=tls is not None and tls.client_cert_required,
            own_cert_fingerprint=self.own_cert_fingerprint,
            export_spool_dir=settings.data_dir / EXPORT_SPOOL_DIR,
        )
        self.http = HttpEndpoint(self.metrics, self.status_map)
        # Set once the transport's owner and the API exist (a restore at start calls it).
        self.sm.on_revoked = self._revocations_applied
        self._init_task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None
        self._fault_clock_task: asyncio.Task[None] | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self._job_task: asyncio.Task[None] | None = None
        # Set once start() has opened everything: only a node that ran logs "stopped". A start
        # refused because this node already runs elsewhere (its WAL locked, its ports taken)
        # writes to that node's log file, where "stopped" would read as the running node's.
        self._started = False

    def reload_tokens(self) -> None:
        """SIGHUP: read tokens.json again (revoking or adding client tokens without a
        restart). A file that cannot be used keeps the tokens in force."""
        try:
            secrets = self.secrets.with_tokens_reloaded()
        except SecretsError as exc:
            log.error("tokens.json not reloaded, kept the tokens in force: %s", exc)
            return
        self.secrets = secrets
        self.api.reload_tokens(secrets)
        log.warning("tokens reloaded from tokens.json: %d token(s)", len(secrets.tokens))

    def _is_revoked(self, fingerprint: str) -> bool:
        # Reads the state at each call: a snapshot install replaces `sm.state`.
        return self.sm.state.revoked.is_revoked(fingerprint)

    def _revocations_applied(self) -> None:
        """The revocation list grew (or a snapshot brought one): drop what uses it now."""
        if self.raft.transport is not None:
            self.raft.transport.close_revoked()
        self.api.close_revoked_clients()
        self.forwarder.close_revoked()
        self._check_own_certificate()

    def _check_own_certificate(self) -> None:
        fp = self.own_cert_fingerprint
        if fp and self._is_revoked(fp) and not self._own_cert_revoked_logged:
            self._own_cert_revoked_logged = True
            log.error(
                "this node's own TLS certificate (sha256 %s) is revoked: its peers refuse it. "
                "Issue it a new certificate (metastore cluster certs --ca-dir CA_DIR --node %d "
                "--out DIR) and restart it on that certificate",
                fp,
                self.settings.node_id,
            )

    def _on_fatal(self, exc: BaseException) -> None:
        self.fatal = exc
        self.stopped.set()

    def status_map(self) -> dict[str, Any]:
        st = self.raft.status()
        return {
            "node_id": self.settings.node_id,
            "role": st.core.role.value,
            "term": st.core.term,
            "leader": st.core.leader,
            "commit_index": st.core.commit_index,
            "applied_index": st.core.applied_index,
            "lag_ms": st.safe_time_lag_ms,
            "ready": st.ready_to_serve and self.sm.state.cluster is not None,
            # For /health's reason, and its staleness rule (the API's file-listing fence).
            "initialized": self.sm.state.cluster is not None,
            "clock_fenced": st.clock_fenced,
            "stopped_reason": st.stopped_reason,
            "removed_at_index": self.raft.removed_at_index,
            "read_staleness_max_ms": self.settings.cluster.read_staleness_max_ms,
            "fsync_seconds_total": self.raft.fsync_seconds_total,
            "revoked_certs": len(self.sm.state.revoked),
            "peer_tls_revoked_refused": st.transport.get("tls_revoked_refused", 0),
            "peer_tls_revoked_closed": st.transport.get("tls_revoked_closed", 0),
            "raft_inbox_dropped": st.inbox_dropped,
            "raft_unusable_address_books": st.unusable_address_books,
            "log_write_failures": log_write_failures(),
            # For /metrics (metastore.daemon.metrics): every one O(1), read at scrape time.
            "raft_counters": st.counters,
            "peer_round_trip_s": st.peer_round_trip_s,
            "wal": st.wal,
            "transport": st.transport,
            "apply_seconds": self.sm.apply_seconds,  # the live map (kinds: a bounded set)
            "state_objects": self._state_objects(),
            **self.api.reply_backlog(),
        }

    def _scrape_state(self) -> dict[str, float]:
        """What /metrics reads of the replicated state beyond `_state_objects` (see
        NodeMetrics.scrape_state). The lag uses the physical clock: a scrape must not tick
        the HLC (a clock reading it refuses fences the node elsewhere; here it reads 0)."""
        state = self.sm.state
        oldest = state.gc.oldest_threshold()
        lag_ms = 0
        if oldest:
            with contextlib.suppress(PhysicalClockError):
                lag_ms = max(0, self.clock.physical_now_ms() - physical_ms(oldest))
        return {"manifests": state.txns.manifest_count(), "gc_threshold_lag_s": lag_ms / 1000}

    def _state_objects(self) -> dict[str, int]:
        state = self.sm.state
        txns = state.txns.stats()
        return {
            "file_entries": txns.file_entries,
            "registered_tables": txns.registered_tables,
            "sessions": state.sessions.session_count,
            "leases": state.sessions.lease_count,
            "protections": state.gc.protection_count,
        }

    async def start(self) -> None:
        """Open the WAL and the listeners. If any of them fails, what was already opened is
        closed again (the WAL and its lock, the other listeners) before the error is raised:
        a port in use is a NodeStartError naming it. A first start (no IDENTITY yet) checks its
        ports before the WAL opens, so one refused for a port in use leaves no state behind."""
        me = self.settings.node
        if not (self.settings.data_dir / IDENTITY_FILE).exists():
            # A first start: the Raft start writes the IDENTITY before it binds, and a node left
            # with an identity but no cluster made the next `cluster up` refuse. (A restart
            # opens its WAL first, whose lock names a node already running there.)
            _refuse_ports_in_use(
                [
                    ("Raft", me.host, me.raft_port),
                    ("client", me.host, me.client_port),
                    ("metrics", me.host, me.metrics_port),
                ]
            )
        try:
            await _listen("Raft", me.raft_address, self.raft.start())
            self._check_own_certificate()
            # The first reading of the wall clock against the monotonic one (clock_steps.py).
            self.api.clock_steps.observe(self.clock.physical_now_ms(), time.monotonic())
            await _listen("client", me.client_address, self.api.start(me.host, me.client_port))
            await _listen("metrics", me.metrics_address, self.http.start(me.host, me.metrics_port))
        except BaseException:
            await self.stop()
            raise
        self._init_task = asyncio.create_task(self._initialize_cluster())
        self._sweep_task = asyncio.create_task(self._sweep_sessions())
        self._gc_task = asyncio.create_task(self.gc.run_forever())
        self._job_task = asyncio.create_task(self.jobs.run_forever())
        if self._fault_clock_file is not None:
            self._fault_clock_task = asyncio.create_task(self._fault_clock_file.follow())
        self._started = True
        log.info(
            "metastore node started",
            extra={
                "client": me.client_address,
                "raft": me.raft_address,
                "metrics": me.metrics_address,
                "cluster_id": self.settings.cluster.cluster_id,
                "peer_tls": self.settings.peer_tls is not None,
                "client_tls": self.settings.client_tls is not None,
            },
        )

    async def stop(self, *, hand_over: bool = False) -> None:
        """Stop serving and release everything. `hand_over` (a planned stop: SIGTERM): as the
        leader, first move leadership to another voter, waiting up to one election timeout, so
        a rolling restart does not leave the cluster without a leader for an election timeout
        (the followers would only notice the silence then). Clients keep being served (their
        writes forwarded) while it moves. `stop_now` (SIGINT) set before or during the move
        skips or ends it. Then a planned stop gives detached requests (remove_node, gc_run) up
        to DETACHED_WORK_STOP_GRACE_MS to end before Raft stops (`ApiServer.stop`); `stop_now`
        ends that wait too."""
        for task in (
            self._init_task,
            self._sweep_task,
            self._gc_task,
            self._job_task,
            self._fault_clock_task,
        ):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if hand_over and self.raft.is_leader():
            if self.stop_now.is_set():
                log.info("stopping without handing leadership over")
            else:
                await self._hand_over_unless_stopped_now()
        # A planned stop lets requests that run to their end detached (remove_node: the removal
        # then its revocation) finish for a few seconds; SIGINT or a fatal error does not wait.
        # Inside api.stop, while the forwarder and Raft still run: the revocation needs them.
        graceful = hand_over and not self.stop_now.is_set()
        await self.api.stop(
            detached_grace_ms=L.DETACHED_WORK_STOP_GRACE_MS if graceful else 0,
            cut_short=self.stop_now,
        )
        await self.http.stop()
        await self.forwarder.close()
        await self.raft.stop()
        if self._started:
            log.info("metastore node stopped")

    async def _hand_over_unless_stopped_now(self) -> None:
        """Move leadership to another voter, waiting up to one election timeout, or until
        `stop_now` is set (an operator who will not wait, or a whole-cluster stop that began
        after this node's own)."""
        timeout_ms = self.settings.cluster.election_timeout_ms
        log.info("handing leadership over before stopping (up to %d ms)", timeout_ms)
        handing = asyncio.ensure_future(self.raft.hand_over_leadership(timeout_ms=timeout_ms))
        stop_now = asyncio.ensure_future(self.stop_now.wait())
        try:
            await asyncio.wait({handing, stop_now}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (handing, stop_now):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not handing.cancelled():
            new_leader = handing.result()
            if new_leader:
                log.info("leadership handed to node %d", new_leader, extra={"leader": new_leader})
        else:
            log.info("leadership hand-over cut short: stopping now")

    async def _sweep_sessions(self) -> None:
        """As leader, propose the expiry of sessions past their deadline at the clock's now.
        Apply re-checks each deadline against the entry's own Tm (>= this now), so a session
        whose heartbeat got in first is skipped: expiry is decided by Tm alone. Then release
        protections past their max age or whose owner is gone (re-checked the same way)."""
        while True:
            await asyncio.sleep(SESSION_SWEEP_INTERVAL_S)
            if not (self.raft.is_leader() and self.raft.ready_to_serve):
                continue
            if self.sm.state.cluster is None:
                continue
            late = self.sm.state.sessions.expired_at(self.clock.now())
            for start in range(0, len(late), mlimits.MAX_LEASES_PER_COMMAND):
                cmd = ExpireSessions(
                    session_ids=tuple(late[start : start + mlimits.MAX_LEASES_PER_COMMAND]),
                    reason="ttl",
                    by=f"leader:{self.settings.node_id}",
                )
                try:
                    res = await self.raft.propose(encode_command(cmd), timeout_ms=5000)
                except (RaftCoreError, RaftError) as exc:
                    log.info("session expiry will be retried: %s", exc)
                    break
                outcome = res.result
                if isinstance(outcome, Outcome) and outcome.ok:
                    expired = outcome.result.get("expired")
                    if expired:
                        log.info("sessions expired", extra={"sessions": expired})
            try:
                await self.gc.release_due()
            except (MetastoreError, RaftCoreError, RaftError) as exc:
                log.info("protection release will be retried: %s", exc)

    async def _initialize_cluster(self) -> None:
        """Propose InitCluster once, as the first leader, if the state has no cluster settings."""
        cluster = self.settings.cluster
        # A new cluster starts with the newest apply rules this release knows; every member
        # must run it (an older one stops on applying this entry, rather than diverge).
        cmd = InitCluster(
            dd_ms=cluster.dd_ms,
            cs_max_ms=cluster.cs_max_ms,
            request_id="init-cluster",
            apply_version=APPLY_VERSION_SUPPORTED,
        )
        while self.sm.state.cluster is None:
            await asyncio.sleep(INIT_RETRY_S)
            if not (self.raft.is_leader() and self.raft.ready_to_serve):
                continue
            if self.sm.state.cluster is not None:
                break
            try:
                res = await self.raft.propose(encode_command(cmd), timeout_ms=5000)
            except (RaftCoreError, RaftError) as exc:
                log.info("cluster initialization will be retried: %s", exc)
                continue
            log.info(
                "cluster initialized",
                extra={"dd_ms": cluster.dd_ms, "cs_max_ms": cluster.cs_max_ms, "index": res.index},
            )
        applied = self.sm.state.cluster
        if applied is not None and (
            applied.dd_ms != cluster.dd_ms or applied.cs_max_ms != cluster.cs_max_ms
        ):
            # The API (activation, read waits, DDL reply waits, future-timestamp refusals) uses
            # the cluster's values. The clock guard (HLC offset refusals, the fence by
            # heartbeat round trips) uses the smaller CSmax: a node whose fence is looser than
            # the CSmax a DDL reply waits for can serve reads at a now below a Tu that another
            # node already reported as passed. The GC's read fence uses the larger.
            log.warning(
                "config file DD/CSmax differ from the cluster's; the cluster's values apply "
                "(this node's clock-offset guard uses the smaller CSmax)",
                extra={"dd_ms": applied.dd_ms, "cs_max_ms": applied.cs_max_ms},
            )
            self.raft.tighten_max_clock_offset(applied.cs_max_ms)
            self.clock.tighten_max_offset(applied.cs_max_ms)
            self.gc.read_fence_ms = max(
                self.gc.read_fence_ms,
                cluster.read_staleness_max_ms + applied.cs_max_ms,
            )


def _refuse_ports_in_use(ports: list[tuple[str, str, int]]) -> None:
    """A NodeStartError (ADDRESS_IN_USE, as `_listen` says it) for the first of `ports` (what
    it is for, host, port) another process listens on (`ports.port_in_use`). Anything else a
    bind may meet (a host that does not resolve, an address not of this machine) is left to
    the listeners, which say it."""
    for what, host, port in ports:
        if port_in_use(host, port):
            raise NodeStartError(
                "ADDRESS_IN_USE",
                f"cannot listen on {host}:{port} (the {what} port): it is in use by another "
                "process",
            )


async def _listen(what: str, address: str, opening: Awaitable[None]) -> None:
    """Await `opening` (a start that binds `address`), turning a bind failure into a
    NodeStartError that names the port and what it is for."""
    try:
        await opening
    except socket.gaierror as exc:  # the host does not resolve (a typo, no DNS entry yet)
        raise NodeStartError(
            "LISTEN_FAILED", f"cannot listen on {address} (the {what} port): {exc.strerror}"
        ) from exc
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise NodeStartError(
                "ADDRESS_IN_USE",
                f"cannot listen on {address} (the {what} port): it is in use by another process",
            ) from exc
        # An address not of this machine (only a bind raises it), or a port it may not use
        # (below 1024 without the privilege to bind one; a file's error names the file).
        if exc.errno == errno.EADDRNOTAVAIL or (
            exc.errno in (errno.EACCES, errno.EPERM) and exc.filename is None
        ):
            raise NodeStartError(
                "LISTEN_FAILED", f"cannot listen on {address} (the {what} port): {exc.strerror}"
            ) from exc
        raise


# Fault injection for tests/chaos: start this process with its wall clock shifted (ms).
FAULT_CLOCK_OFFSET_ENV = "METASTORE_FAULT_CLOCK_OFFSET_MS"


def _physical_clock() -> SystemClock | OffsetClock:
    raw = os.environ.get(FAULT_CLOCK_OFFSET_ENV, "")
    if not raw:
        if os.environ.get(FAULT_CLOCK_OFFSET_FILE_ENV):
            return OffsetClock(SystemClock(), 0)  # stepped at run time (_FaultClockFile)
        return SystemClock()
    offset_ms = int(raw)
    log.warning(
        "FAULT INJECTION: this node's clock is shifted by %d ms (%s is set)",
        offset_ms,
        FAULT_CLOCK_OFFSET_ENV,
    )
    return OffsetClock(SystemClock(), offset_ms)


# Fault injection for tests/chaos: a file holding this process's clock offset in ms, read again
# every FAULT_CLOCK_POLL_MS while the node runs (no file, or an empty one: no offset). The chaos
# test steps a running leader's clock with it, as an NTP step would; the start-time offset above
# can only skew a node that has just restarted (and so is not the leader).
FAULT_CLOCK_OFFSET_FILE_ENV = "METASTORE_FAULT_CLOCK_OFFSET_FILE"
FAULT_CLOCK_POLL_MS = 50


class _FaultClockFile:
    """Sets an OffsetClock's offset to the number in a file whenever the file's text changes
    (fault injection). What the file holds when the node starts is left alone: a node started
    with METASTORE_FAULT_CLOCK_OFFSET_MS keeps that offset until the file is written."""

    def __init__(self, path: Path, clock: OffsetClock) -> None:
        self.path = path
        self.clock = clock
        self.seen = self._text()

    def _text(self) -> str:
        try:
            return self.path.read_text().strip()
        except FileNotFoundError:
            return ""

    async def follow(self) -> None:
        while True:
            try:
                text = self._text()
                offset_ms = int(text) if text and text != self.seen else None
            except (OSError, ValueError) as exc:  # a half-written file: the next poll sees it
                log.warning("FAULT INJECTION: cannot read %s: %s", self.path, exc)
            else:
                self.seen = text
                if offset_ms is not None and offset_ms != self.clock.offset_ms:
                    log.warning(
                        "FAULT INJECTION: this node's clock steps from %+d ms to %+d ms (%s)",
                        self.clock.offset_ms,
                        offset_ms,
                        self.path,
                    )
                    self.clock.offset_ms = offset_ms
            await asyncio.sleep(FAULT_CLOCK_POLL_MS / 1000)


def _fault_clock_file(physical: SystemClock | OffsetClock) -> _FaultClockFile | None:
    raw = os.environ.get(FAULT_CLOCK_OFFSET_FILE_ENV, "")
    if not raw:
        return None
    if not isinstance(physical, OffsetClock):
        raise ValueError(f"{FAULT_CLOCK_OFFSET_FILE_ENV} needs an OffsetClock")
    return _FaultClockFile(Path(raw), physical)


# Fault injection for tests/chaos: "2=127.0.0.1:41234,3=127.0.0.1:41235" makes this process
# connect to node 2 and 3 there (a test's proxy) instead of at their configured addresses: Raft
# peer links (whatever membership entries say) and forwarding to the leader's client port.
FAULT_PEER_ADDRESSES_ENV = "METASTORE_FAULT_PEER_ADDRESSES"
FAULT_FORWARD_ADDRESSES_ENV = "METASTORE_FAULT_FORWARD_ADDRESSES"


def _fault_addresses(env: str, what: str) -> dict[int, tuple[str, int]]:
    raw = os.environ.get(env, "")
    if not raw:
        return {}
    out: dict[int, tuple[str, int]] = {}
    for item in raw.split(","):
        node, _, address = item.strip().partition("=")
        host, _, port = address.rpartition(":")
        if not (node.isdigit() and host and port.isdigit()):
            raise ValueError(f"{env}: {item!r} is not node_id=host:port")
        out[int(node)] = (host, int(port))
    log.warning(
        "FAULT INJECTION: %s connections go to %s instead of the configured addresses (%s is set)",
        what,
        ", ".join(f"node {n} at {h}:{p}" for n, (h, p) in sorted(out.items())),
        env,
    )
    return out


# Fault injection for tests/chaos: while the file this names exists, every write of a snapshot
# file (this node's own, or one installed from the leader) fails with ENOSPC, as on a full
# disk, and the write-ahead log's own writes go on. Process-wide (one node per process).
FAULT_SNAPSHOT_WRITE_FILE_ENV = "METASTORE_FAULT_SNAPSHOT_WRITE_FILE"


def _install_snapshot_write_fault() -> None:
    raw = os.environ.get(FAULT_SNAPSHOT_WRITE_FILE_ENV, "")
    if not raw:
        return
    control = Path(raw)
    real_write_all = raft.wal._write_all

    def write_all(fd: int, data: bytes | memoryview) -> None:
        # The file's name only while the fault is on: the log's appends pay one stat.
        if control.exists() and "/snap-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    raft.wal._write_all = write_all
    log.warning(
        "FAULT INJECTION: snapshot files cannot be written while %s exists (%s is set)",
        control,
        FAULT_SNAPSHOT_WRITE_FILE_ENV,
    )


async def serve(
    settings: NodeSettings, *, bootstrap: bool = False, freeze_heap: bool = False
) -> int:
    """Run a node until it is stopped. `freeze_heap` (the node process, `run_node`): the
    catalog's objects are frozen out of the garbage collector's scans (after the state is
    restored or snapshotted, and once started), see metastore.daemon.collector; a process that
    runs several nodes (tests) leaves its collector alone."""
    _install_snapshot_write_fault()
    try:
        node = MetastoreNode(settings, bootstrap=bootstrap)
    except OSError as exc:  # its files (the audit log): nothing listens or runs yet
        raise NodeStartError(DATA_DIR_UNUSABLE, _unusable(exc)) from exc
    if freeze_heap:
        node.sm.on_state_settled = refreeze
        node.sm.on_state_decoded = freeze_decoded
    loop = asyncio.get_running_loop()

    def stop_on(sig: signal.Signals) -> None:
        # Said once, first: the log then tells an asked-for stop from a fatal one.
        if not node.stopped.is_set():
            log.info("stopping on %s", sig.name, extra={"signal": sig.name})
        if not STOP_SIGNALS_HAND_OVER[sig]:
            node.stop_now.set()
        node.stopped.set()

    # Installed before the start, which logs "metastore node started": a supervisor (or a test)
    # that signals the moment it reads that line must get the orderly stop, not the default
    # action of SIGTERM/SIGINT (the process killed mid-write, exit -15). A signal during the
    # start lets it finish (it opens the log and binds the ports: nothing waits on peers) and
    # then stops.
    for sig in STOP_SIGNALS_HAND_OVER:
        loop.add_signal_handler(sig, stop_on, sig)
    loop.add_signal_handler(signal.SIGHUP, node.reload_tokens)
    await node.start()
    if freeze_heap:
        refreeze()  # the state as restored and the log replayed on top of it
    await node.stopped.wait()
    # A fatal error stops at once: this node may not be able to lead a transfer (its WAL).
    await node.stop(hand_over=node.fatal is None)
    if node.fatal is not None:
        # Not said again: raft.node logged it as it happened, with what the error says
        # (a storage error's file and errno, or the traceback), the line to read.
        return 1
    return 0


__all__ = ["MetastoreNode", "physical_ms", "run_node", "serve"]
