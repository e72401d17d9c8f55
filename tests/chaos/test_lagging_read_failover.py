"""A read asked of a node that lags answers from another node, not TIMEOUT.

A one-way partition (a follower hears its leader, its answers are lost) keeps the follower
ready: it still has a leader, so it serves, but once the leader's in-flight window to it is
full it applies nothing more (as in test_stale_reads). The next page of a listing whose first
page the leader cut, and `job_show` of a job started since, need a position that follower
never reaches: its wait runs out (a catch-up TIMEOUT), or it answers NOT_READY at once when
its safe time trails its clock by more than read_staleness_max_ms, and the client, which lists that
follower first, asks the next node instead of failing the call while two nodes could answer.

Real daemons on loopback; the follower's peer traffic goes through the chaos proxy.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon.api_limits import REQUEST_TIMEOUT_MS_DEFAULT
from metastore.errors import CatchUpTimeoutError, NotReadyError
from tests.chaos.netproxy import NetProxy
from tests.chaos.test_chaos import ChaosCluster
from tests.chaos.test_stale_reads import FILL_COMMITS, _commit
from tests.daemon.harness import write_cluster

pytestmark = pytest.mark.slow

TABLE = "stale.t"
PAGE_WAIT_MS = 1_000  # the follower's wait for the token's position, asked by the caller


def _client(c: ChaosCluster, *node_ids: int, timeout_ms: int = 10_000) -> SyncMetastoreClient:
    return SyncMetastoreClient(
        [f"127.0.0.1:{c.client_ports[i]}" for i in node_ids],
        c.token("admin"),
        timeout_ms=timeout_ms,
        client_name="lagging-read",
    )


def test_reads_a_lagging_follower_cannot_answer_are_answered_by_another_node(
    tmp_path: Path,
) -> None:
    config = write_cluster(tmp_path, 3, dd_ms=300, cs_max_ms=100)
    with NetProxy() as proxy:
        c = ChaosCluster(config, proxy)
        try:
            c.start_all()
            leader = c.wait_ready()
            follower = next(i for i in c.ids if i != leader)
            others = [i for i in c.ids if i != follower]
            admin = _client(c, leader)
            admin.ddl("CREATE NAMESPACE stale")
            admin.ddl(f"CREATE TABLE {TABLE} (id BIGINT, gone INT)")
            location = Path(str(admin.describe(TABLE)["location"]))

            # One way: the follower hears everything, nothing it sends arrives; it stops
            # applying once the leader's window to it is full.
            c.cut([follower], others)
            for i in range(FILL_COMMITS):
                _commit(admin, location, f"fill-{i}.parquet", overwrite=False)
            reader = _client(c, follower, *others)  # the lagging follower first
            frozen = reader.safe_time(f"127.0.0.1:{c.client_ports[follower]}")
            for n in range(3):
                admin.session_open(f"s{n}")
            altered = admin.ddl(f"ALTER TABLE {TABLE} DROP COLUMN gone")
            time.sleep(0.5)
            now = reader.safe_time(f"127.0.0.1:{c.client_ports[follower]}")
            assert now["safe_time"] == frozen["safe_time"], "the follower still applies"
            assert now["ready"], now  # it still has a leader, so it would serve

            # The next page of a listing the leader cut: the follower cannot reach its position.
            first = admin.call("session_list", {"limit": 1})
            assert first["next_page_token"]
            # The follower is asked first and refuses as a lagging node: a catch-up TIMEOUT
            # after the caller's wait, or NOT_READY at once once its safe time trails its clock
            # by more than read_staleness_max_ms (the fill and the DDL above can take that
            # long on a loaded machine); either way the client moves on to another node.
            moved_on: list[object] = []
            started = time.monotonic()
            rest = reader.call(
                "session_list",
                {"limit": 10, "page_token": first["next_page_token"], "timeout_ms": PAGE_WAIT_MS},
                on_retry=moved_on.append,
            )
            assert moved_on, "the follower answered a position it never reached"
            assert isinstance(moved_on[0], CatchUpTimeoutError | NotReadyError), moved_on
            if isinstance(moved_on[0], CatchUpTimeoutError):
                assert time.monotonic() - started >= PAGE_WAIT_MS / 1000
            ids = [s["session_id"] for s in first["sessions"] + rest["sessions"]]
            assert ids == ["s0", "s1", "s2"], ids

            # A job started since the cut: the follower does not know it, and waits in vain.
            (job,) = admin.job_list(TABLE, all=True)["jobs"]
            assert job["job_id"] == altered["job_id"], altered
            # The follower itself cannot answer: a catch-up TIMEOUT after its default bound
            # (job_show takes none), or NOT_READY at once when its safe time already trails
            # its clock by more than read_staleness_max_ms. Clients fail over on both.
            started = time.monotonic()
            with pytest.raises((CatchUpTimeoutError, NotReadyError)) as refused:
                reader.call(
                    "job_show",
                    {"job_id": int(job["job_id"])},
                    endpoint=f"127.0.0.1:{c.client_ports[follower]}",
                )
            if isinstance(refused.value, CatchUpTimeoutError):
                assert time.monotonic() - started >= REQUEST_TIMEOUT_MS_DEFAULT / 1000
            reader.close()
            reader = _client(c, follower, *others)  # the follower first again
            shown = reader.job_show(int(job["job_id"]))
            assert shown["job_id"] == job["job_id"]
            reader.close()
            admin.close()
        finally:
            c.stop_all()
