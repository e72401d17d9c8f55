"""IEP-98's Atomicity Property on real processes: for every timestamp Tq, every node gives the same
schema version — while DDL streams in, across a kill -9 of the leader, and after its restart."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

TABLE = "iep.t"


class Answers:
    """(Tq -> node -> version or error code), recorded from every node."""

    def __init__(self) -> None:
        self.by_tq: dict[int, dict[int, object]] = defaultdict(dict)
        self.lock = threading.Lock()
        self.asked = 0

    def record(self, tq: int, node: int, answer: object) -> None:
        with self.lock:
            self.asked += 1
            prev = self.by_tq[tq].get(node)
            if isinstance(prev, int) and prev != answer and isinstance(answer, int):
                raise AssertionError(f"node {node} changed its answer for {tq}: {prev} -> {answer}")
            self.by_tq[tq][node] = answer


def _reader(c: MetastoreCluster, answers: Answers, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    clients: dict[int, RawClient] = {}
    recent: list[int] = []
    while not stop.is_set():
        # Ask about "now" (the hot case) and about the recent past (answers must never change).
        if recent and rng.random() < 0.4:
            tq = rng.choice(recent)
        else:
            now_ms = int(time.time() * 1000)
            tq = (now_ms - rng.randint(0, 1500)) << 16 | rng.randint(0, 3)
            recent.append(tq)
            recent[:] = recent[-200:]
        for node in c.ids:
            try:
                cl = clients.get(node) or c.client(node, role="reader")
                clients[node] = cl
                r = cl.call("schema_at", table=TABLE, ts=tq, timeout_ms=3000)
            except (OSError, AssertionError):
                clients.pop(node, None)
                continue  # node down or restarting
            if r["ok"]:
                answers.record(tq, node, r["result"]["version"])
            elif r["error"]["code"] == "NOT_FOUND_AT_TIMESTAMP":
                answers.record(tq, node, "absent")
            # NOT_READY / TIMEOUT / UNAVAILABLE: the node refused rather than guess. Fine.
    for cl in clients.values():
        cl.close()


def _ddl_stream(c: MetastoreCluster, stop: threading.Event, done: list[int]) -> None:
    n = 0
    target = 1
    while not stop.is_set():
        try:
            cl = c.client(target, role="writer")
            r = cl.call("ddl", sql=f"ALTER TABLE {TABLE} ADD COLUMN c{n} INT", request_id=f"c{n}")
            cl.close()
        except (OSError, AssertionError):
            target = target % len(c.ids) + 1
            time.sleep(0.1)
            continue
        if r["ok"] or r["error"]["code"] == "COLUMN_ALREADY_EXISTS":
            done.append(n)
            n += 1
        else:
            target = target % len(c.ids) + 1
            time.sleep(0.1)


def test_every_node_same_version_for_every_tq_across_leader_kill(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path) as c:
        c.start_all()
        leader = c.wait_ready()
        admin = c.client(leader)
        assert admin.call("ddl", sql="CREATE NAMESPACE iep")["ok"]
        assert admin.call("ddl", sql=f"CREATE TABLE {TABLE} (id BIGINT)")["ok"]
        admin.close()

        answers = Answers()
        stop = threading.Event()
        ddl_done: list[int] = []
        threads = [
            threading.Thread(target=_reader, args=(c, answers, stop, s), daemon=True)
            for s in range(3)
        ]
        threads.append(threading.Thread(target=_ddl_stream, args=(c, stop, ddl_done), daemon=True))
        for t in threads:
            t.start()
        time.sleep(3)
        c.kill(leader)
        time.sleep(3)
        c.start(leader)
        c.wait_ready(timeout_s=30)
        time.sleep(3)
        stop.set()
        for t in threads:
            t.join(timeout=20)

        # Re-ask a sample of past Tqs on every node now that all are up: still the same.
        sample = random.Random(1).sample(sorted(answers.by_tq), min(100, len(answers.by_tq)))
        for node in c.ids:
            cl = c.client(node, role="reader")
            for tq in sample:
                r = cl.call("schema_at", table=TABLE, ts=tq)
                answers.record(tq, node, r["result"]["version"] if r["ok"] else "absent")
            cl.close()

        disagreements = {
            tq: per_node
            for tq, per_node in answers.by_tq.items()
            if len(set(per_node.values())) > 1
        }
        assert not disagreements, f"nodes disagree: {list(disagreements.items())[:5]}"
        multi = sum(1 for per in answers.by_tq.values() if len(per) == 3)
        assert multi > 100, f"too few Tq answered by all three nodes ({multi})"
        assert len(ddl_done) >= 5, f"DDL stream barely ran ({len(ddl_done)})"
        versions = {v for per in answers.by_tq.values() for v in per.values()}
        assert len(versions) >= 5, "the readers never saw the schema evolve"
