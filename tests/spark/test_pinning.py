"""A batch pinned at Top uses exactly the schema every node reports for Top, and two drivers
planning at the same Top (each talking to a different node) get the same schema, even while an
ALTER is activating around that Top."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from spark_bridge.bridge import MetastoreBridge, PinnedTable
from tests.spark.support import SparkEnv, wait_until, write_attempt

pytestmark = pytest.mark.slow

TABLE = "pin.t"
OTHER = "pin.u"


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv) -> SparkEnv:
    spark_env.ddl("CREATE NAMESPACE pin")
    spark_env.ddl(
        f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, a STRING)",
        f"CREATE TABLE {OTHER} (k INT)",
    )
    return spark_env


def _pin_view(p: PinnedTable) -> dict[str, Any]:
    return {
        "table_id": p.table_id,
        "version": p.version,
        "tu": p.tu,
        "columns": p.columns,
        "ddl": p.ddl,
        "location": p.location,
    }


def _node_view(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "table_id": r["table_id"],
        "version": r["version"],
        "tu": r["tu"],
        "columns": r["schema"]["columns"],
        "ddl": r["schema"]["ddl"],
        "location": r["location"],
    }


def _plan(bridge: MetastoreBridge, top: int | None = None) -> tuple[int, dict[str, PinnedTable]]:
    # A read-only batch: planning pins every table; nothing is committed.
    with bridge.batch(reads=[TABLE, OTHER], top=top) as b:
        return b.top, dict(b.pinned)


def test_batch_pins_what_every_node_answers_for_top(env: SparkEnv) -> None:
    bridge = env.bridge(app_name="pinning")
    nodes = {i: env.single(i) for i in env.cluster.ids}
    stop = threading.Event()
    alters: list[dict[str, Any]] = []

    def alter_stream() -> None:
        try:
            for n in range(3):
                # One at a time: each returns once its version is active on every node.
                done = env.client.ddl(f"ALTER TABLE {TABLE} ADD COLUMN c{n} INT")
                alters.append(done)
        finally:
            stop.set()

    ddl = threading.Thread(target=alter_stream, daemon=True)
    ddl.start()
    planned: list[tuple[int, dict[str, PinnedTable]]] = []
    # Plan batches continuously while the ALTERs are in flight (Tops straddle their Tu).
    while not stop.wait(0.02):
        planned.append(_plan(bridge))
    ddl.join(timeout=30)
    assert len(alters) == 3, "the ALTERs did not finish"
    # And exactly at each activation boundary.
    for a in alters:
        tu = int(a["tu"])
        planned += [_plan(bridge, tu - 1), _plan(bridge, tu), _plan(bridge, tu + 1)]

    history = env.client.history(TABLE)["versions"]
    for top, pinned in planned:
        for table, pin in pinned.items():
            for node_id, node in nodes.items():
                answer = _node_view(node.schema_at(table, ts=top))
                assert _pin_view(pin) == answer, f"node {node_id}, {table} at Top={top}"
        # Independent of every node: the version with the greatest Tu <= Top.
        expected = max((v for v in history if v["tu"] <= top), key=lambda v: v["tu"])
        assert pinned[TABLE].version == expected["version"], f"Top={top}"
        assert [c["name"] for c in pinned[TABLE].columns] == [
            c["name"] for c in expected["schema"]["columns"]
        ]
    versions = {p[TABLE].version for _, p in planned}
    assert versions == {1, 2, 3, 4}, f"the batches should straddle every ALTER: {versions}"


def test_two_drivers_on_different_nodes_agree_around_a_concurrent_alter(env: SparkEnv) -> None:
    # Each bridge's client knows one node only: what it pins is that node's own answer.
    bridges = {2: env.bridge(node_id=2, app_name="driver-a"), 3: env.bridge(node_id=3)}
    watcher = env.single(1)
    before = len(watcher.history(TABLE)["versions"])
    done: list[dict[str, Any]] = []
    ddl = threading.Thread(
        target=lambda: done.append(env.client.ddl(f"ALTER TABLE {TABLE} ADD COLUMN late STRING")),
        daemon=True,
    )
    ddl.start()
    # Plan as soon as the new version is applied on node 1 - before the ALTER returns, while Tu
    # may still be ahead of every node's clock and the other nodes may not have applied it.
    new = wait_until(
        lambda: next(iter(watcher.history(TABLE)["versions"][before:]), None),
        timeout_s=10,
        what="the ALTER's version on node 1",
    )
    tu = int(new["tu"])
    # Both drivers plan at Tu - 1 and at Tu, concurrently.
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {(n, t): pool.submit(_plan, bridges[n], t) for t in (tu - 1, tu) for n in bridges}
        results = {key: f.result(timeout=30) for key, f in futures.items()}
    ddl.join(timeout=30)
    assert done, "the ALTER did not return"
    assert int(done[0]["tu"]) == tu
    for top, want in ((tu - 1, new["version"] - 1), (tu, new["version"])):
        a, b = results[(2, top)], results[(3, top)]
        assert _pin_view(a[1][TABLE]) == _pin_view(b[1][TABLE]), f"Top = Tu{top - tu:+d}"
        assert a[1][TABLE].version == want, f"Top = Tu{top - tu:+d}"
        assert a[1][TABLE].struct == b[1][TABLE].struct
        assert ("late" in a[1][TABLE].struct.fieldNames()) == (top >= tu)


def test_a_batch_lists_every_table_it_reads_in_one_request(env: SparkEnv) -> None:
    """Planning pins (and leases) every table in one `pin`; the reads' file listings come in
    one `files_multi`, not one `files` round trip per table."""
    for table, row in ((TABLE, {"id": 1, "a": "x"}), (OTHER, {"k": 7})):
        write, _ = write_attempt(env.client, table, f"lists-{table}", [row])
        env.client.commit(f"lists-{table}", [write])
    bridge = env.bridge(app_name="one-listing")
    calls: list[str] = []
    real_call = bridge.client.call

    def recording_call(op: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(op)
        return real_call(op, *args, **kwargs)

    bridge.client.call = recording_call  # type: ignore[method-assign]
    with bridge.batch(reads=[TABLE, OTHER]) as b:
        ids = [r["id"] for r in b.read(TABLE).select("id").collect()]
        ks = [r["k"] for r in b.read(OTHER).collect()]
        again = b.files(TABLE)[1]  # a second look lists that table alone
    assert 1 in ids and ks == [7]
    assert any(f["path"].startswith("_txn/lists-") for f in again)
    assert calls == ["pin", "files_multi", "files_multi"], calls
