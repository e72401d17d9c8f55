"""The metrics an operator alerts on (docs/operations.md "Metrics and alerts"), scraped from the
/metrics port of real node processes: each moves when the thing it counts happens. Leadership
(has a leader, leader changes seen after the leader is killed), failed proposals (a leader that
lost its quorum), the WAL fsync histogram (grows with commits), snapshots (saved every
`snapshot_every_entries`, sent to and installed by a follower that fell behind), peer links
(connected, messages, heartbeat round trip), the replicated state's size by kind, and the last
completed GC run. The tests share one cluster and run in file order (the last ones kill nodes).
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import generate_latest

from metastore.client import SyncMetastoreClient
from metastore.daemon.metrics import NodeMetrics
from metastore.limits import GC_TTL_MS_DEFAULT
from raft.framing import encode_frame
from tests.daemon.harness import FRAME_MAX, MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

WAIT_S = 30
SNAPSHOT_EVERY = 100  # the smallest the config takes
TABLE = "om.t"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(
        tmp_path_factory.mktemp("operator-metrics"),
        3,
        snapshot_every_entries=SNAPSHOT_EVERY,
        # Nothing kept past a snapshot: a follower that missed one must install it.
        snapshot_keep_entries=0,
        gc_interval_ms=3_600_000,  # GC runs only when a test asks
    ) as c:
        c.start_all()
        c.wait_ready()
        with _client(c, role="admin") as admin:
            admin.ddl("CREATE NAMESPACE om")
            admin.ddl(f"CREATE TABLE {TABLE} (id BIGINT)")
        yield c


def _client(
    c: MetastoreCluster, node_id: int | None = None, role: str = "writer", timeout_ms: int = 10_000
) -> SyncMetastoreClient:
    ids = c.ids if node_id is None else [node_id]
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in ids]
    return SyncMetastoreClient(
        endpoints, c.token(role), client_name="metrics-test", timeout_ms=timeout_ms
    )


def scrape(c: MetastoreCluster, node_id: int) -> dict[str, float]:
    """Every sample of the node's /metrics, by `name{labels}` as the exposition writes it."""
    url = f"http://127.0.0.1:{c.metrics_ports[node_id]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def scrape_if_up(c: MetastoreCluster, node_id: int) -> dict[str, float]:
    """As `scrape`, but {} while the node's metrics port is not listening (it is starting)."""
    try:
        return scrape(c, node_id)
    except urllib.error.URLError:
        return {}


def wait_for(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


def commit_files(client: SyncMetastoreClient, count: int) -> int:
    """`count` commits of one file each; the last one's ts."""
    ts = 0
    for _ in range(count):
        tag = uuid.uuid4().hex[:12]
        add = [{"path": f"{tag}.parquet", "size_bytes": 10, "row_count": 1}]
        result = client.commit(f"om-{tag}", [{"table": TABLE, "schema_version": 1, "add": add}])
        ts = int(result["ts"])
    return ts


def test_every_node_has_a_leader_and_counts_its_election(cluster: MetastoreCluster) -> None:
    leader = cluster.wait_ready()
    for node_id in cluster.ids:
        m = scrape(cluster, node_id)
        assert m["metastore_raft_has_leader"] == 1
        assert m["metastore_raft_leader_changes_seen_total"] >= 1
        assert m["metastore_raft_apply_lag_entries"] >= 0
        assert m["metastore_raft_proposals_pending"] >= 0
    followers = [i for i in cluster.ids if i != leader]

    def links_up() -> bool:
        m = scrape(cluster, leader)
        return all(m.get(f'metastore_peer_connected{{peer="{f}"}}') == 1 for f in followers)

    wait_for("the leader's links to its followers are up", links_up)

    def round_trips_measured() -> bool:
        m = scrape(cluster, leader)
        return all(
            m.get(f'metastore_peer_round_trip_seconds{{peer="{f}"}}', 0) > 0 for f in followers
        )

    wait_for("the leader measures its heartbeat round trips", round_trips_measured)
    m = scrape(cluster, leader)
    for f in followers:
        assert m[f'metastore_peer_messages_sent_total{{peer="{f}"}}'] > 0
        assert m[f'metastore_peer_messages_received_total{{peer="{f}"}}'] > 0
        # Replication traffic per link, in bytes: at least a frame header per message.
        sent_bytes = m[f'metastore_peer_sent_bytes_total{{peer="{f}"}}']
        assert sent_bytes >= 4 * m[f'metastore_peer_messages_sent_total{{peer="{f}"}}']
        assert m[f'metastore_peer_received_bytes_total{{peer="{f}"}}'] > 0
        assert f'metastore_peer_snapshot_send_seconds_count{{peer="{f}"}}' in m


def _raft_port(c: MetastoreCluster, node_id: int) -> int:
    node = 0
    for line in c.config.read_text().splitlines():
        if line.startswith("id = "):
            node = int(line.split("=")[1])
        elif line.startswith("raft_port") and node == node_id:
            return int(line.split("=")[1])
    raise AssertionError(f"no raft_port for node {node_id}")


def test_a_failed_peer_handshake_is_counted(cluster: MetastoreCluster) -> None:
    name = "metastore_peer_handshake_failures_total"
    node_id = cluster.ids[0]
    before = scrape(cluster, node_id)[name]
    with socket.create_connection(("127.0.0.1", _raft_port(cluster, node_id)), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)  # not a Raft hello
        s.settimeout(5)
        with contextlib.suppress(OSError):
            while s.recv(4096):  # until the node closes it
                pass
    wait_for("the refused handshake is counted", lambda: scrape(cluster, node_id)[name] > before)


def test_wal_fsync_histogram_counts_every_commit(cluster: MetastoreCluster) -> None:
    leader = cluster.wait_ready()
    before = scrape(cluster, leader)
    with _client(cluster) as writer:
        commit_files(writer, 5)
    after = scrape(cluster, leader)
    count = "metastore_wal_fsync_duration_seconds_count"
    assert after[count] >= before[count] + 5
    assert after['metastore_wal_fsync_duration_seconds_bucket{le="+Inf"}'] == after[count]
    assert after["metastore_wal_fsync_duration_seconds_sum"] > before.get(
        "metastore_wal_fsync_duration_seconds_sum", 0.0
    )


def test_apply_durations_count_every_commit_on_every_node(cluster: MetastoreCluster) -> None:
    """A slow apply holds up every later entry and every client of the node; nothing showed
    how long applies took, nor of which command (only the apply lag in entries)."""
    cluster.wait_ready()
    count = 'metastore_apply_duration_seconds_count{command="CommitTxn"}'
    total = 'metastore_apply_duration_seconds_sum{command="CommitTxn"}'
    before = {i: scrape(cluster, i).get(count, 0) for i in cluster.ids}
    with _client(cluster) as writer:
        commit_files(writer, 5)
    for node_id in cluster.ids:
        wait_for(
            f"node {node_id} times the commits' applies",
            lambda n=node_id: scrape(cluster, n).get(count, 0) >= before[n] + 5,
        )
        m = scrape(cluster, node_id)
        inf = 'metastore_apply_duration_seconds_bucket{command="CommitTxn",le="+Inf"}'
        assert m[inf] == m[count]
        assert 0 < m[total] < m[count]  # well under a second each


def _objects(c: MetastoreCluster, node_id: int, kind: str) -> float:
    return scrape(c, node_id).get(f'metastore_state_objects{{kind="{kind}"}}', -1)


def test_state_objects_follow_files_sessions_leases_and_protections(
    cluster: MetastoreCluster,
) -> None:
    cluster.wait_ready()
    kinds = ("file_entries", "registered_tables", "sessions", "leases", "protections")
    before = {i: {k: _objects(cluster, i, k) for k in kinds} for i in cluster.ids}
    assert all(v >= 0 for node in before.values() for v in node.values()), before
    session_id = uuid.uuid4().hex
    with _client(cluster) as writer:
        ts = commit_files(writer, 3)
        writer.session_open(session_id, app_id="a", app_name="m", host="h", user="u", pid=1)
        table_id = writer.describe(TABLE)["table_id"]
        writer.lease_acquire(session_id, [{"table": TABLE, "table_id": table_id, "version": 1}])
        record = writer.protect(ts, tables=[TABLE])
        grown = {"file_entries": 3, "sessions": 1, "leases": 1, "protections": 1}
        for node_id in cluster.ids:
            for kind, delta in grown.items():
                want = before[node_id][kind] + delta
                wait_for(
                    f"node {node_id} counts {kind} {want}",
                    lambda n=node_id, k=kind, w=want: _objects(cluster, n, k) == w,
                )
        writer.release_protection(record["record_id"])
        writer.session_close(session_id)
    for node_id in cluster.ids:
        for kind in ("sessions", "leases", "protections"):
            want = before[node_id][kind]
            wait_for(
                f"node {node_id} counts {kind} back to {want}",
                lambda n=node_id, k=kind, w=want: _objects(cluster, n, k) == w,
            )


def test_gc_last_success_timestamp_is_set_by_a_completed_run(cluster: MetastoreCluster) -> None:
    leader = cluster.wait_ready()
    name = "metastore_gc_last_success_timestamp_seconds"
    before = scrape(cluster, leader)[name]
    started = time.time()
    with _client(cluster, role="admin") as admin:
        admin.gc_run()
    after = scrape(cluster, leader)[name]
    assert after > before
    assert started - 1 <= after <= time.time() + 1


def test_gc_threshold_lag_and_manifests_are_reported_by_every_node(
    cluster: MetastoreCluster,
) -> None:
    """How far behind the clock GC keeps the oldest threshold, from the replicated state: every
    node reports it, a follower and a node just restarted alike (the last-success timestamp is
    the leader's alone and 0 after a restart). A GC run moves the table's threshold to Tm minus
    its TTL (the default, 25 h), so the lag is that TTL, plus the seconds since the run."""
    cluster.wait_ready()
    ttl_s = GC_TTL_MS_DEFAULT / 1000
    with _client(cluster) as writer, _client(cluster, role="admin") as admin:
        commit_files(writer, 1)
        admin.gc_run()
    lag = "metastore_gc_threshold_lag_seconds"
    for node_id in cluster.ids:
        wait_for(
            f"node {node_id} applies the run's threshold",
            lambda n=node_id: scrape(cluster, n).get(lag, 0) > 0,
        )
        m = scrape(cluster, node_id)
        assert ttl_s - 1 <= m[lag] < ttl_s + WAIT_S, m[lag]  # 1 s: the clocks of the nodes
        assert m['metastore_state_objects{kind="manifests"}'] >= 0


def test_held_bytes_of_a_released_protection_are_not_reported(cluster: MetastoreCluster) -> None:
    """`metastore_gc_protection_held_bytes{record_id}` is set by the leader's GC run. It kept
    reporting a protection after its release until the next run (an hour by default), so an
    alert on held bytes kept firing for a protection that no longer held anything."""
    leader = cluster.wait_ready()
    with _client(cluster) as writer, _client(cluster, role="admin") as admin:
        ts = commit_files(writer, 1)
        record_id = writer.protect(ts, tables=[TABLE])["record_id"]
        admin.gc_run()
        series = f'metastore_gc_protection_held_bytes{{record_id="{record_id}"}}'
        assert series in scrape(cluster, leader)
        writer.release_protection(record_id)
    wait_for("the released protection's series goes", lambda: series not in scrape(cluster, leader))


def test_snapshots_saved_sent_and_installed(cluster: MetastoreCluster) -> None:
    leader = cluster.wait_ready()
    behind = next(i for i in cluster.ids if i != leader)
    cluster.kill(behind)
    live = [i for i in cluster.ids if i != behind]
    saved_before = {i: scrape(cluster, i)["metastore_snapshot_save_seconds_count"] for i in live}
    with _client(cluster, leader) as writer:
        commit_files(writer, SNAPSHOT_EVERY + 20)
    for node_id in live:
        wait_for(
            f"node {node_id} takes a snapshot",
            lambda n=node_id: (
                scrape(cluster, n)["metastore_snapshot_save_seconds_count"] > saved_before[n]
            ),
        )
        m = scrape(cluster, node_id)
        assert m["metastore_snapshot_last_saved_bytes"] > 0
        assert m["metastore_snapshot_save_seconds_sum"] > 0
    # A restart of the leader drops what its links still queued for `behind` (entries sent
    # before the snapshot) and the progress it kept: the next leader finds `behind`'s log ends
    # before its snapshot, and sends the snapshot.
    cluster.kill(leader)
    cluster.start(leader)
    leader = cluster.wait_ready(among=live)
    cluster.start(behind)
    wait_for(
        f"node {behind} installs the leader's snapshot",
        lambda: (
            scrape_if_up(cluster, behind).get("metastore_snapshot_install_seconds_count", 0) >= 1
        ),
    )
    assert scrape(cluster, behind)["metastore_snapshot_last_installed_bytes"] > 0
    m = scrape(cluster, leader)
    assert m["metastore_snapshot_sends_total"] >= 1
    assert m["metastore_snapshot_sent_bytes_total"] > 0
    cluster.wait_ready()


def test_proposals_pend_then_fail_on_a_leader_without_its_quorum(
    cluster: MetastoreCluster,
) -> None:
    leader = cluster.wait_ready()
    followers = [i for i in cluster.ids if i != leader]
    failed, pending = "metastore_raft_proposals_failed_total", "metastore_raft_proposals_pending"
    before = scrape(cluster, leader)[failed]
    raw = cluster.client(leader)  # connected before the quorum goes
    try:
        for f in followers:
            cluster.kill(f)
        # Proposed at once (the leader steps down only an election timeout later): the entry
        # cannot commit; it pends until the proposal times out.
        request = {"session_id": uuid.uuid4().hex, "timeout_ms": 3_000}
        raw.send_raw(
            encode_frame(
                {"id": 99, "op": "session_open", "args": request}, max_frame_bytes=FRAME_MAX
            )
        )
        wait_for("the proposal pends", lambda: scrape(cluster, leader)[pending] >= 1)
        reply = raw.recv()
    finally:
        raw.close()
    assert reply is not None and not reply["ok"], reply
    wait_for(
        "the leader counts the failed proposal",
        lambda: scrape(cluster, leader)[failed] > before,
    )
    for f in followers:
        cluster.start(f)
    cluster.wait_ready()


def test_leader_changes_seen_and_peer_down_after_the_leader_is_killed(
    cluster: MetastoreCluster,
) -> None:
    leader = cluster.wait_ready()
    survivors = [i for i in cluster.ids if i != leader]
    changes = "metastore_raft_leader_changes_seen_total"
    before = {i: scrape(cluster, i)[changes] for i in survivors}
    cluster.kill(leader)

    def new_leader_everywhere() -> bool:
        statuses = [cluster.try_status(i) for i in survivors]
        return all(st is not None and st["leader"] not in (0, leader) for st in statuses)

    wait_for("the survivors elect a new leader", new_leader_everywhere)
    for node_id in survivors:
        m = scrape(cluster, node_id)
        assert m[changes] > before[node_id]
        assert m["metastore_raft_has_leader"] == 1
        wait_for(
            f"node {node_id} sees its link to node {leader} down",
            lambda n=node_id: (
                scrape(cluster, n).get(f'metastore_peer_connected{{peer="{leader}"}}') == 0
            ),
        )
    failures = f'metastore_peer_connect_failures_total{{peer="{leader}"}}'
    first = {i: scrape(cluster, i)[failures] for i in survivors}
    for node_id in survivors:
        wait_for(
            f"node {node_id} counts its failed dials of node {leader}",
            lambda n=node_id: scrape(cluster, n)[failures] > first[n],
        )
    cluster.start(leader)
    cluster.wait_ready()


def test_a_node_that_no_longer_leads_reports_no_held_bytes() -> None:
    """Only the leader runs GC: a deposed leader kept its last run's held bytes for ever, summed
    with the new leader's by any alert over the cluster (stub status, no node)."""
    metrics = NodeMetrics(1)
    metrics.protections_held({"backup": 200})
    status = {"term": 2, "leader": 1, "commit_index": 9, "applied_index": 9, "lag_ms": 0}
    metrics.refresh({**status, "role": "leader", "ready": True})
    assert 'metastore_gc_protection_held_bytes{record_id="backup"} 200.0' in _text(metrics)
    metrics.refresh({**status, "role": "follower", "leader": 2, "ready": True})
    assert "metastore_gc_protection_held_bytes{" not in _text(metrics)


def test_apply_lag_is_commit_minus_applied() -> None:
    metrics = NodeMetrics(1)
    status = {"role": "follower", "term": 2, "leader": 2, "lag_ms": 0, "ready": True}
    metrics.refresh({**status, "commit_index": 10, "applied_index": 10})
    assert "metastore_raft_apply_lag_entries 0.0" in _text(metrics)
    metrics.refresh({**status, "commit_index": 17, "applied_index": 10})
    assert "metastore_raft_apply_lag_entries 7.0" in _text(metrics)


def _text(metrics: NodeMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_peer_bytes_and_snapshot_send_seconds_come_from_the_transport_stats() -> None:
    """Per-peer replication bytes and the time each chunked snapshot took to reach its
    follower (stub status, no node): an operator could not tell a saturated link, nor a
    follower that needs minutes to receive a snapshot, from the message counts."""
    metrics = NodeMetrics(1)
    peers = {
        2: {
            "connected": True,
            "bytes_sent": 5_000,
            "bytes_received": 700,
            "snapshot_transfers_completed": 2,
            "snapshot_send_seconds_total": 3.5,
        },
        3: {"connected": False},
    }
    status = {"term": 2, "leader": 1, "commit_index": 9, "applied_index": 9, "lag_ms": 0}
    metrics.refresh({**status, "role": "leader", "ready": True, "transport": {"peers": peers}})
    text = _text(metrics)
    assert 'metastore_peer_sent_bytes_total{peer="2"} 5000.0' in text
    assert 'metastore_peer_received_bytes_total{peer="2"} 700.0' in text
    assert 'metastore_peer_sent_bytes_total{peer="3"} 0.0' in text
    assert 'metastore_peer_snapshot_send_seconds_count{peer="2"} 2.0' in text
    assert 'metastore_peer_snapshot_send_seconds_sum{peer="2"} 3.5' in text
    assert 'metastore_peer_snapshot_send_seconds_count{peer="3"} 0.0' in text


def test_persist_time_and_sync_time_have_names_that_say_which() -> None:
    """`metastore_wal_fsync_seconds_total` counts the driver's writes as well as its syncs (the
    name says fsync): the persist time has a name of its own, the old name keeps its meaning,
    and the syncs alone are the fsync histogram's sum (stub status, no node)."""
    metrics = NodeMetrics(1)
    status = {"term": 2, "leader": 1, "commit_index": 9, "applied_index": 9, "lag_ms": 0}
    wal = {"fsync_seconds_total": 1.0, "fsync_bucket_counts": (0,) * 13 + (4,)}
    metrics.refresh(
        {**status, "role": "leader", "ready": True, "fsync_seconds_total": 2.5, "wal": wal}
    )
    text = _text(metrics)
    assert "metastore_raft_persist_seconds_total 2.5" in text
    assert "metastore_wal_fsync_seconds_total 2.5" in text
    assert "metastore_wal_fsync_duration_seconds_sum 1.0" in text
    assert "metastore_wal_fsync_duration_seconds_count 4.0" in text
