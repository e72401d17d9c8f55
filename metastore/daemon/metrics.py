"""Per-node Prometheus metrics and the HTTP endpoints `/metrics` and `/health`.

The HTTP side is a deliberately tiny asyncio responder (GET only, one request per connection,
bounded header size): it runs on the node's own event loop, needs no thread, and a slow scraper
cannot hold anything. The port takes no token, so what a stranger can make it hold is bounded:
HTTP_CONNECTIONS_MAX connections (the oldest closed to admit a newcomer), each for at most
HTTP_TIMEOUT_S. Gauges that mirror node state are refreshed at scrape time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from metastore.daemon.statemachine import APPLY_SECONDS_BUCKETS, ApplySeconds
from raft.wal import FSYNC_SECONDS_BUCKETS

HTTP_REQUEST_BYTES_MAX = 8192
HTTP_TIMEOUT_S = 5.0
# Connections held at once. The port has no token: without a bound, anyone who reaches it could
# hold descriptors (shared with the client and peer ports, the WAL and snapshots) until the node
# can open none. Past it the oldest is closed to admit the newcomer (see HttpEndpoint).
HTTP_CONNECTIONS_MAX = 64

_READ_WAIT_BUCKETS = (0.0, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_DDL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 5.0, 10.0)


_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class _MirroredCounters(Collector):
    """Running totals the node keeps itself (fsync time, the transport's refusals), exposed as
    counters: Prometheus reserves `_total` for them, and rate() assumes it. Their values are
    set from the status at scrape time (`NodeMetrics.refresh`)."""

    def __init__(self, docs: dict[str, str]) -> None:
        self._docs = docs
        self.values: dict[str, float] = dict.fromkeys(docs, 0.0)

    def collect(self) -> list[CounterMetricFamily]:
        # The family name without `_total`: the sample gets it (as for a Counter).
        return [
            CounterMetricFamily(name.removesuffix("_total"), self._docs[name], value=value)
            for name, value in self.values.items()
        ]


class _StatusFamilies(Collector):
    """Metrics rendered from the status taken at scrape time (`NodeMetrics.refresh`): per-peer
    series (a peer that leaves the membership leaves no stale series behind), the WAL's fsync
    histogram and the snapshot summaries, whose counts the Raft driver and the WAL keep as
    plain numbers (an observe on the loop would cost more than the counter it replaces)."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        st = self.status
        raft: dict[str, float] = st.get("raft_counters", {})
        yield from self._fsync(st.get("wal", {}))
        yield self._apply(st.get("apply_seconds", {}))
        save = SummaryMetricFamily(
            "metastore_snapshot_save_seconds",
            "snapshots this node took: encode, write, sync and commit (count and seconds)",
            count_value=int(raft.get("snapshots_saved", 0)),
            sum_value=raft.get("snapshot_save_seconds_total", 0.0),
        )
        install = SummaryMetricFamily(
            "metastore_snapshot_install_seconds",
            "snapshots received from the leader and loaded into the state machine",
            count_value=int(raft.get("snapshots_installed", 0)),
            sum_value=raft.get("snapshot_install_seconds_total", 0.0),
        )
        yield save
        yield install
        yield GaugeMetricFamily(
            "metastore_snapshot_last_saved_bytes",
            "size of the last snapshot this node took (0: none since it started)",
            value=raft.get("snapshot_last_saved_bytes", 0),
        )
        yield GaugeMetricFamily(
            "metastore_snapshot_last_installed_bytes",
            "size of the last snapshot this node installed from the leader (0: none)",
            value=raft.get("snapshot_last_installed_bytes", 0),
        )
        yield CounterMetricFamily(
            "metastore_snapshot_save_failures",
            "snapshots this node could not save (ENOSPC, EIO; its log intact): it serves from "
            "its log and tries again with backoff",
            value=raft.get("snapshot_save_failures", 0),
        )
        yield CounterMetricFamily(
            "metastore_snapshot_sends",
            "snapshots this node sent as leader to followers too far behind for entries",
            value=raft.get("snapshots_sent", 0),
        )
        yield CounterMetricFamily(
            "metastore_snapshot_sent_bytes",
            "data bytes of the snapshots this node sent",
            value=raft.get("snapshot_bytes_sent", 0),
        )
        yield from self._peers(st.get("transport", {}), st.get("peer_round_trip_s", {}))

    @staticmethod
    def _fsync(wal: dict[str, Any]) -> Iterator[Metric]:
        counts = wal.get("fsync_bucket_counts") or (0,) * (len(FSYNC_SECONDS_BUCKETS) + 1)
        cumulative, buckets = 0, []
        for bound, count in zip((*FSYNC_SECONDS_BUCKETS, float("inf")), counts, strict=True):
            cumulative += count
            buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
        yield HistogramMetricFamily(
            "metastore_wal_fsync_duration_seconds",
            "duration of each WAL and snapshot file/directory sync",
            buckets=buckets,
            sum_value=wal.get("fsync_seconds_total", 0.0),
        )

    @staticmethod
    def _apply(by_kind: dict[type, ApplySeconds]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "metastore_apply_duration_seconds",
            "time to apply each catalog command entry on this node (decode, the state's "
            "apply, the change feed), by command class",
            labels=["command"],
        )
        bounds = [str(b) for b in APPLY_SECONDS_BUCKETS] + ["+Inf"]
        for kind, stats in sorted(by_kind.items(), key=lambda item: item[0].__name__):
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, stats.bucket_counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([kind.__name__], buckets, stats.seconds_total)
        return family

    @staticmethod
    def _peers(transport: dict[str, Any], rtt: dict[Any, float]) -> Iterator[Metric]:
        peers: dict[Any, dict[str, Any]] = transport.get("peers", {})
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "connected": GaugeMetricFamily(
                "metastore_peer_connected",
                "1 while this node's link to the peer is up (handshake done)",
                labels=["peer"],
            ),
            "sent": CounterMetricFamily(
                "metastore_peer_messages_sent",
                "Raft messages handed to the peer's socket",
                labels=["peer"],
            ),
            "received": CounterMetricFamily(
                "metastore_peer_messages_received",
                "Raft messages received from the peer",
                labels=["peer"],
            ),
            "dropped": CounterMetricFamily(
                "metastore_peer_messages_dropped",
                "messages to the peer dropped (queue overflow, too large)",
                labels=["peer"],
            ),
            "connect_failures": CounterMetricFamily(
                "metastore_peer_connect_failures",
                "connections to the peer that failed before authentication finished",
                labels=["peer"],
            ),
            "bytes_sent": CounterMetricFamily(
                "metastore_peer_sent_bytes",
                "bytes of Raft frames (messages and snapshot chunks) written to the peer's link",
                labels=["peer"],
            ),
            "bytes_received": CounterMetricFamily(
                "metastore_peer_received_bytes",
                "bytes read from the peer's authenticated connection to this node",
                labels=["peer"],
            ),
        }
        snapshot_send = SummaryMetricFamily(
            "metastore_peer_snapshot_send_seconds",
            "chunked snapshot transfers to the peer the peer acknowledged whole: seconds from "
            "the transfer's start to its done acknowledgement",
            labels=["peer"],
        )
        send_failures = 0
        for peer_id, stats in sorted(peers.items()):
            label = [str(peer_id)]
            families["connected"].add_metric(label, 1 if stats.get("connected") else 0)
            for key in (
                "sent",
                "received",
                "dropped",
                "connect_failures",
                "bytes_sent",
                "bytes_received",
            ):
                families[key].add_metric(label, stats.get(key, 0))
            snapshot_send.add_metric(
                label,
                count_value=stats.get("snapshot_transfers_completed", 0),
                sum_value=stats.get("snapshot_send_seconds_total", 0.0),
            )
            send_failures += stats.get("snapshot_transfers_failed", 0)
            send_failures += stats.get("snapshot_transfers_unreadable", 0)
        yield from families.values()
        yield snapshot_send
        yield CounterMetricFamily(
            "metastore_snapshot_send_failures",
            "chunked snapshot transfers a follower dropped, or this node could not read from "
            "its snapshot file (the leader sends it again)",
            value=send_failures,
        )
        yield CounterMetricFamily(
            "metastore_peer_handshake_failures",
            "peer connections refused: failed Raft or TLS handshakes, unknown peers",
            value=transport.get("handshake_failures", 0)
            + transport.get("tls_refused", 0)
            + transport.get("auth_failures_unknown_peer", 0)
            + sum(p.get("auth_failures", 0) for p in peers.values()),
        )
        round_trip = GaugeMetricFamily(
            "metastore_peer_round_trip_seconds",
            "a leader's last heartbeat round trip to the follower",
            labels=["peer"],
        )
        for peer_id, seconds in sorted(rtt.items()):
            round_trip.add_metric([str(peer_id)], seconds)
        yield round_trip


class NodeMetrics:
    def __init__(self, node_id: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.node_id = node_id
        self.role = Gauge(
            "metastore_raft_role", "1 for this node's current Raft role", ["role"], registry=r
        )
        self.term = Gauge("metastore_raft_term", "current Raft term", registry=r)
        self.leader = Gauge("metastore_raft_leader", "node id of the known leader", registry=r)
        self.commit_index = Gauge("metastore_raft_commit_index", "commit index", registry=r)
        self.applied_index = Gauge("metastore_raft_applied_index", "applied index", registry=r)
        self.apply_lag = Gauge(
            "metastore_raft_apply_lag_entries",
            "committed entries not yet applied here (commit index minus applied index)",
            registry=r,
        )
        self.has_leader = Gauge(
            "metastore_raft_has_leader", "1 while this node knows a leader", registry=r
        )
        self.proposals_pending = Gauge(
            "metastore_raft_proposals_pending",
            "proposals on this node queued or appended and not yet applied",
            registry=r,
        )
        self.state_sizes = Gauge(
            "metastore_state_objects",
            "replicated state size by kind: file_entries, registered_tables (every incarnation, "
            "dropped ones until purged), sessions, leases, protections, manifests (of every "
            "registered incarnation)",
            ["kind"],
            registry=r,
        )
        self.status_families = _StatusFamilies()
        r.register(self.status_families)
        self.safe_time_lag = Gauge(
            "metastore_safe_time_lag_seconds",
            "physical clock minus the physical part of safe time",
            registry=r,
        )
        self.ready = Gauge("metastore_ready", "1 when serving reads", registry=r)
        self.totals = _MirroredCounters(
            {
                # The old name, kept with its meaning: writes included (docs/operations.md).
                "metastore_wal_fsync_seconds_total": "time the Raft driver spent persisting "
                "(writes and syncs; the same as metastore_raft_persist_seconds_total; the syncs "
                "alone: metastore_wal_fsync_duration_seconds_sum)",
                "metastore_raft_persist_seconds_total": "time the Raft driver spent persisting "
                "its log and state: writes, syncs and the hop to the WAL thread (the syncs "
                "alone: metastore_wal_fsync_duration_seconds_sum)",
                "metastore_peer_tls_revoked_refused_total": "peer handshakes refused (either "
                "side) for a revoked certificate",
                "metastore_peer_tls_revoked_closed_total": "open peer links closed when their "
                "certificate was revoked",
                "metastore_raft_inbox_dropped_total": "peer messages dropped because the Raft "
                "driver's inbox was full (raft.node INBOX_MESSAGES_MAX: the driver falls behind "
                "its peers)",
                "metastore_raft_unusable_address_books_total": "membership entries and snapshots "
                "met whose peer addresses this node cannot use (a member without an address "
                "here; see the node's error log)",
                "metastore_log_write_failures_total": "log records a log handler could not "
                "write (a full or read-only disk, a closed stderr)",
                "metastore_raft_leader_changes_seen_total": "Raft terms in which this node "
                "learnt of a leader (leader changes, as etcd's leader_changes_seen_total)",
                "metastore_raft_proposals_failed_total": "proposals made on this node that "
                "failed: timed out (outcome unknown), not leader, replaced by a newer leader, "
                "queue full",
            }
        )
        r.register(self.totals)
        self.read_wait_hist = Histogram(
            "metastore_schema_read_wait_seconds",
            "time schema reads waited for safe time",
            ["on"],
            buckets=_READ_WAIT_BUCKETS,
            registry=r,
        )
        self.ddl_hist = Histogram(
            "metastore_ddl_seconds",
            "DDL latency seen by the client (floor: DD + CSmax)",
            buckets=_DDL_BUCKETS,
            registry=r,
        )
        self.commit_hist = Histogram(
            "metastore_commit_seconds",
            "atomic commit latency seen by the client",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
            registry=r,
        )
        self.requests = Counter(
            "metastore_requests",
            "client requests by op and result code",
            ["op", "code"],
            registry=r,
        )

        self.gc_runs = Counter("metastore_gc_runs", "GC runs completed by this node", registry=r)
        self.gc_files_deleted = Counter(
            "metastore_gc_files_deleted", "data files GC deleted (dead at a threshold)", registry=r
        )
        self.gc_bytes_deleted = Counter(
            "metastore_gc_bytes_deleted", "bytes of data files GC deleted", registry=r
        )
        self.gc_orphans_deleted = Counter(
            "metastore_gc_orphans_deleted", "unreferenced files GC deleted", registry=r
        )
        self.gc_orphan_bytes_deleted = Counter(
            "metastore_gc_orphan_bytes_deleted", "bytes of unreferenced files deleted", registry=r
        )
        self.gc_last_success = Gauge(
            "metastore_gc_last_success_timestamp_seconds",
            "wall time of the last GC run this node completed (0: none since it started; only "
            "the leader runs GC, so alert on the max over the nodes)",
            registry=r,
        )
        self.gc_threshold_lag = Gauge(
            "metastore_gc_threshold_lag_seconds",
            "this node's clock minus the lowest GC threshold of the tables GC has moved one "
            "for (0: none yet): at least the longest gc.ttl when GC keeps up; from the "
            "replicated state, so every node reports it, from its start",
            registry=r,
        )
        self.gc_held_bytes = Gauge(
            "metastore_gc_protection_held_bytes",
            "bytes the TTL alone would let GC delete that a protection keeps (the leader's last "
            "GC run; a released protection's series goes at once)",
            ["record_id"],
            registry=r,
        )

        self.client_connections_paused = Gauge(
            "metastore_client_connections_paused",
            "client connections not read because their queued replies are over "
            "CLIENT_REPLY_BYTES_PER_CONNECTION_MAX (clients that read slowly or not at all)",
            registry=r,
        )
        self.client_reply_bytes_queued = Gauge(
            "metastore_client_reply_bytes_queued",
            "reply bytes queued for client connections, not yet taken by their sockets",
            registry=r,
        )
        self.client_reply_bytes_queued_max = Gauge(
            "metastore_client_reply_bytes_queued_max",
            "reply bytes queued for the client connection with the most",
            registry=r,
        )

        # The last GC run's held bytes by record id, and whether a record is still in force
        # (set by the node: its state's GcState.in_force); see _drop_stale_held.
        self._held: dict[str, int] = {}
        self.protection_in_force: Callable[[str], bool] | None = None
        # Set by the node: figures of the replicated state that take a pass over its tables
        # (C-level, milliseconds at MAX_TABLES), so read on a scrape only, not for /health:
        # {"manifests": count, "gc_threshold_lag_s": seconds}.
        self.scrape_state: Callable[[], dict[str, float]] | None = None

        self.revoked_certs = Gauge(
            "metastore_revoked_certificates", "certificates the cluster revoked", registry=r
        )

    def gc_run(self, summary: dict[str, Any]) -> None:
        """A run's deletions; a run that stopped midway (`partial`) counts no completed run."""
        if not summary.get("partial"):
            self.gc_runs.inc()
            self.gc_last_success.set(time.time())
        self.gc_files_deleted.inc(summary["files_deleted"])
        self.gc_bytes_deleted.inc(summary["bytes_deleted"])
        self.gc_orphans_deleted.inc(summary["orphans_deleted"])
        self.gc_orphan_bytes_deleted.inc(summary["orphan_bytes_deleted"])

    def protections_held(self, held: dict[str, int]) -> None:
        """The held bytes of the protections in force at a GC run (the leader's)."""
        self._held = dict(held)
        self._show_held()

    def _show_held(self) -> None:
        self.gc_held_bytes.clear()
        for record_id, size in self._held.items():
            self.gc_held_bytes.labels(record_id=record_id).set(size)

    def _drop_stale_held(self, role: str) -> None:
        """What the last GC run found no longer holds once its protection is released (the
        next run is up to gc_interval_ms away), nor on a node that no longer leads (it runs
        no GC; the leader's figures are the current ones). O(protections of the last run)."""
        if not self._held:
            return
        in_force = self.protection_in_force
        keep = (
            {r: b for r, b in self._held.items() if in_force is None or in_force(r)}
            if role == "leader"
            else {}
        )
        if keep != self._held:
            self._held = keep
            self._show_held()

    def request(self, op: str, code: str, _seconds: float) -> None:
        # The server folds op names not in its op table into "other" (ApiServer._op_label), so
        # clients cannot grow the label set; this is a last bound on a label's length.
        self.requests.labels(op=op if len(op) <= 32 else "other", code=code).inc()

    def read_wait(self, seconds: float, *, leader: bool) -> None:
        self.read_wait_hist.labels(on="leader" if leader else "follower").observe(seconds)

    def commit(self, seconds: float) -> None:
        self.commit_hist.observe(seconds)

    def ddl(self, seconds: float) -> None:
        self.ddl_hist.observe(seconds)

    def refresh(self, status: dict[str, Any]) -> None:
        for role in ("leader", "follower", "candidate", "pre_candidate"):
            self.role.labels(role=role).set(1 if status["role"] == role else 0)
        self.term.set(status["term"])
        self.leader.set(status["leader"])
        self.commit_index.set(status["commit_index"])
        self.applied_index.set(status["applied_index"])
        self.apply_lag.set(max(0, status["commit_index"] - status["applied_index"]))
        self.has_leader.set(1 if status["leader"] else 0)
        raft: dict[str, float] = status.get("raft_counters", {})
        self.proposals_pending.set(raft.get("proposals_pending", 0))
        for kind, count in status.get("state_objects", {}).items():
            self.state_sizes.labels(kind=kind).set(count)
        if self.scrape_state is not None:
            view = self.scrape_state()
            self.state_sizes.labels(kind="manifests").set(view["manifests"])
            self.gc_threshold_lag.set(view["gc_threshold_lag_s"])
        self.status_families.status = status
        self._drop_stale_held(status["role"])
        self.safe_time_lag.set(status["lag_ms"] / 1000)
        self.ready.set(1 if status["ready"] else 0)
        self.revoked_certs.set(status.get("revoked_certs", 0))
        self.totals.values.update(
            {
                "metastore_wal_fsync_seconds_total": status.get("fsync_seconds_total", 0.0),
                "metastore_raft_persist_seconds_total": status.get("fsync_seconds_total", 0.0),
                "metastore_peer_tls_revoked_refused_total": status.get(
                    "peer_tls_revoked_refused", 0
                ),
                "metastore_peer_tls_revoked_closed_total": status.get("peer_tls_revoked_closed", 0),
                "metastore_raft_inbox_dropped_total": status.get("raft_inbox_dropped", 0),
                "metastore_raft_unusable_address_books_total": status.get(
                    "raft_unusable_address_books", 0
                ),
                "metastore_log_write_failures_total": status.get("log_write_failures", 0),
                "metastore_raft_leader_changes_seen_total": raft.get("leader_changes_seen", 0),
                "metastore_raft_proposals_failed_total": raft.get("proposals_failed", 0),
            }
        )
        self.client_connections_paused.set(status.get("client_connections_paused", 0))
        self.client_reply_bytes_queued.set(status.get("client_reply_bytes_queued", 0))
        self.client_reply_bytes_queued_max.set(status.get("client_reply_bytes_queued_max", 0))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def health_problem(status: dict[str, Any]) -> str:
    """Why this node does not serve, in words; "" when it does. Not ready (fenced by its clock,
    removed from the cluster, no leader known, not caught up, cluster not initialized), or
    ready but with a safe time further behind its clock than read_staleness_max_ms: it then
    refuses every file listing (NOT_READY, `ApiServer._check_fresh_for_files`), as a node that
    stopped applying its leader's entries (a one-way partition, a stalled disk) must, yet still
    counts as ready."""
    if not status.get("ready"):
        if status.get("stopped_reason"):
            return f"stopped: {status['stopped_reason']}"
        if status.get("clock_fenced"):
            return f"clock fenced: {status['clock_fenced']}"
        if status.get("removed_at_index"):
            return (
                f"removed from the cluster (at index {status['removed_at_index']}): it applies "
                "nothing more; stop it"
            )
        if not status.get("leader"):
            return "no leader known (an election, or this node is cut off from a quorum)"
        if status.get("initialized") is False:
            return "cluster not initialized yet (its first leader proposes it)"
        return "not caught up with the current leader yet"
    lag_ms, staleness_max_ms = status.get("lag_ms"), status.get("read_staleness_max_ms")
    if isinstance(lag_ms, int) and isinstance(staleness_max_ms, int) and lag_ms > staleness_max_ms:
        return (
            f"safe time trails the clock by {lag_ms} ms, more than read_staleness_max_ms="
            f"{staleness_max_ms}: not applying the leader's entries (file listings refused)"
        )
    return ""


class HttpEndpoint:
    """GET /metrics (Prometheus text) and GET /health (JSON; 200 when the node serves, else 503
    with `reason`: `health_problem`)."""

    def __init__(self, metrics: NodeMetrics, status: Callable[[], dict[str, Any]]) -> None:
        self.metrics = metrics
        self.status = status
        self._server: asyncio.Server | None = None
        # Open connections, oldest first (dicts keep insertion order).
        self._open: dict[asyncio.StreamWriter, None] = {}

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)

    @property
    def bound_port(self) -> int:
        if self._server is None or not self._server.sockets:
            return 0
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while len(self._open) >= HTTP_CONNECTIONS_MAX:
            # Evict rather than refuse: silent connections holding every slot must not lock
            # the scraper out; a flood can only make scrapes race.
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.transport.abort()
        self._open[writer] = None
        try:
            await self._respond(reader, writer)
        finally:
            self._open.pop(writer, None)

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
        """The request line and headers, up to the blank line that ends them, or None if the
        peer closed first. Lines may end in CRLF or a bare LF (`printf '...\\n\\n' | nc`, as
        RFC 9112 section 2.2 lets a server accept). Stops reading once past
        HTTP_REQUEST_BYTES_MAX: the caller answers 431 to a head that long."""
        head = b""
        while len(head) <= HTTP_REQUEST_BYTES_MAX:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                return None  # EOF before the blank line
            head += line
            if line in (b"\n", b"\r\n") and head != line:
                return head
        return head

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(self._read_head(reader), HTTP_TIMEOUT_S)
        except (ValueError, asyncio.LimitOverrunError, TimeoutError, OSError):
            # ValueError: a single line past the reader's limit (readline's overrun).
            head = None
        if head is None:
            writer.close()
            return
        try:
            if len(head) > HTTP_REQUEST_BYTES_MAX:
                await self._send(writer, 431, "text/plain", b"request header too large\n")
                return
            line = head.lstrip(b"\r\n").split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
            parts = line.split(" ")
            if len(parts) != 3 or parts[0] != "GET":
                await self._send(writer, 405, "text/plain", b"only GET is served\n")
                return
            path = parts[1].split("?", 1)[0]
            if path == "/metrics":
                st = self.status()
                self.metrics.refresh(st)
                await self._send(
                    writer, 200, "text/plain; version=0.0.4", self.metrics.exposition()
                )
            elif path == "/health":
                st = self.status()
                reason = health_problem(st)
                healthy = not reason
                body = {
                    "status": "ok" if healthy else "unavailable",
                    "reason": reason,
                    "node_id": st["node_id"],
                    "role": st["role"],
                    "leader": st["leader"],
                    "ready": st["ready"],
                    "safe_time_lag_ms": st["lag_ms"],
                    "applied_index": st["applied_index"],
                }
                await self._send(
                    writer,
                    200 if healthy else 503,
                    "application/json",
                    json.dumps(body).encode() + b"\n",
                )
            else:
                await self._send(writer, 404, "text/plain", b"not found: try /metrics or /health\n")
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, code: int, ctype: str, body: bytes) -> None:
        reason = _REASONS.get(code, "")
        reply = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        try:
            writer.write(reply)
        except RuntimeError as exc:
            # uvloop refuses a write on a connection closed under us (the client reset it, or a
            # newcomer evicted it): the connection ended, as a ConnectionError says.
            raise ConnectionResetError(f"connection closed before the reply: {exc}") from exc
        await writer.drain()
