"""IEP-98's Atomicity Property on real processes, for every read that takes a timestamp
(`schema_at`, `describe`, `list_tables` and `list_namespaces` AS OF, `files` AS OF): for every
question (op, argument, T), every node gives the same full answer, error or value, and no node
ever changes its answer — while DDL streams in (columns added; tables and a namespace dropped and
re-created), across a kill -9 of the leader, and after its restart."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

TABLE = "iep.t"  # lives throughout; gains columns
CYCLED = "iep2.u"  # dropped and re-created, with its namespace
# What may legitimately differ between nodes (or between two asks) for the same question.
PER_NODE = frozenset({"waited_ms", "safe_time"})
# The node refused rather than guess (not caught up, timed out, restarting): not an answer.
REFUSALS = frozenset({"NOT_READY", "TIMEOUT", "UNAVAILABLE"})
# "Absent" answers: the same on every node, and final like any other answer.
ABSENT = frozenset({"TABLE_NOT_FOUND", "NAMESPACE_NOT_FOUND", "NOT_FOUND_AT_TIMESTAMP"})
CYCLE = [
    "CREATE NAMESPACE IF NOT EXISTS iep2",
    f"CREATE TABLE IF NOT EXISTS {CYCLED} (id BIGINT)",
    f"DROP TABLE IF EXISTS {CYCLED}",
    f"CREATE TABLE IF NOT EXISTS {CYCLED} (id BIGINT, v STRING)",
    "DROP NAMESPACE IF EXISTS iep2 CASCADE",
]

Question = tuple[str, str, int]  # (op, argument, T)


def _ask(cl: RawClient, question: Question) -> dict[str, Any]:
    op, arg, tq = question
    if op == "schema_at":
        return cl.call(op, table=arg, ts=tq, timeout_ms=3000)
    if op in ("describe", "files"):
        return cl.call(op, table=arg, as_of=tq, timeout_ms=3000)
    if op == "list_tables":
        return cl.call(op, namespace=arg, as_of=tq, timeout_ms=3000)
    assert op == "list_namespaces"
    return cl.call(op, as_of=tq, timeout_ms=3000)


def _normalized(reply: dict[str, Any]) -> object | None:
    """The full answer minus what differs per node; None for a refusal."""
    if reply["ok"]:
        return ("ok", repr(sorted((k, v) for k, v in reply["result"].items() if k not in PER_NODE)))
    error = reply["error"]
    if error["code"] in REFUSALS:
        return None
    return ("error", error["code"], repr(sorted(error["details"].items())))


def _is_absent(answer: object) -> bool:
    return isinstance(answer, tuple) and answer[0] == "error" and answer[1] in ABSENT


class Answers:
    """(question -> node -> normalized answer), recorded from every node. A node that changes
    its answer to a question — value to value, absent to value or back — fails at once."""

    def __init__(self) -> None:
        self.by_question: dict[Question, dict[int, object]] = defaultdict(dict)
        self.lock = threading.Lock()
        self.flips: list[str] = []
        self.versions: set[int] = set()  # versions of TABLE seen by schema_at

    def record(self, question: Question, node: int, answer: object) -> None:
        with self.lock:
            prev = self.by_question[question].get(node)
            if prev is not None and prev != answer:
                kind = "absent<->value" if _is_absent(prev) != _is_absent(answer) else "changed"
                self.flips.append(f"node {node} {kind} for {question}: {prev} -> {answer}")
            self.by_question[question][node] = answer


def _question(rng: random.Random, recent: list[Question]) -> Question:
    # Ask about "now" (the hot case) and about the recent past (answers must never change).
    if recent and rng.random() < 0.4:
        return rng.choice(recent)
    now_ms = int(time.time() * 1000)
    tq = (now_ms - rng.randint(0, 1500)) << 16 | rng.randint(0, 3)
    op = rng.choice(
        ["schema_at", "schema_at", "describe", "list_tables", "list_namespaces", "files"]
    )
    if op in ("schema_at", "describe", "files"):
        arg = rng.choice([TABLE, CYCLED])
    elif op == "list_tables":
        arg = rng.choice(["iep", "iep2"])
    else:
        arg = ""
    question = (op, arg, tq)
    recent.append(question)
    recent[:] = recent[-200:]
    return question


def _reader(c: MetastoreCluster, answers: Answers, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    clients: dict[int, RawClient] = {}
    recent: list[Question] = []
    while not stop.is_set():
        question = _question(rng, recent)
        for node in c.ids:
            try:
                cl = clients.get(node) or c.client(node, role="reader")
                clients[node] = cl
                reply = _ask(cl, question)
            except (OSError, AssertionError):
                clients.pop(node, None)
                continue  # node down or restarting
            answer = _normalized(reply)
            if answer is not None:
                answers.record(question, node, answer)
            if question[:2] == ("schema_at", TABLE) and reply["ok"]:
                answers.versions.add(reply["result"]["version"])
    for cl in clients.values():
        cl.close()


def _ddl_stream(
    c: MetastoreCluster, stop: threading.Event, name: str, statements: list[str], done: list[int]
) -> None:
    """Runs statements[n % len] (with {n}) in order; IF [NOT] EXISTS and request ids make a retry
    after a lost reply harmless."""
    n = 0
    target = 1
    while not stop.is_set():
        sql = statements[n % len(statements)].format(n=n)
        try:
            cl = c.client(target, role="writer")
            r = cl.call("ddl", sql=sql, request_id=f"{name}{n}")
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


def test_every_node_same_answer_for_every_timestamped_read_across_leader_kill(
    tmp_path: Path,
) -> None:
    with metastore_cluster(tmp_path) as c:
        c.start_all()
        leader = c.wait_ready()
        admin = c.client(leader)
        assert admin.call("ddl", sql="CREATE NAMESPACE iep")["ok"]
        assert admin.call("ddl", sql=f"CREATE TABLE {TABLE} (id BIGINT)")["ok"]
        admin.close()

        answers = Answers()
        stop = threading.Event()
        alters_done: list[int] = []
        cycle_done: list[int] = []
        threads = [
            threading.Thread(target=_reader, args=(c, answers, stop, s), daemon=True)
            for s in range(3)
        ]
        alters = [f"ALTER TABLE {TABLE} ADD COLUMN c{{n}} INT"]
        threads.append(
            threading.Thread(
                target=_ddl_stream, args=(c, stop, "alter", alters, alters_done), daemon=True
            )
        )
        threads.append(
            threading.Thread(
                target=_ddl_stream, args=(c, stop, "cycle", CYCLE, cycle_done), daemon=True
            )
        )
        for t in threads:
            t.start()
        time.sleep(2)
        c.kill(leader)
        time.sleep(2)
        c.start(leader)
        c.wait_ready(timeout_s=30)
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join(timeout=20)

        # Re-ask a sample of past questions on every node now that all are up: still the same.
        rng = random.Random(1)
        sample = rng.sample(sorted(answers.by_question), min(150, len(answers.by_question)))
        for node in c.ids:
            cl = c.client(node, role="reader")
            for question in sample:
                answer = _normalized(_ask(cl, question))
                if answer is not None:
                    answers.record(question, node, answer)
            cl.close()

        assert not answers.flips, f"answers changed: {answers.flips[:5]}"
        disagreements = {
            q: per_node
            for q, per_node in answers.by_question.items()
            if len(set(per_node.values())) > 1
        }
        assert not disagreements, f"nodes disagree: {list(disagreements.items())[:5]}"

        # The run must have exercised what it claims to check.
        everywhere = [q for q, per in answers.by_question.items() if len(per) == 3]
        assert len(everywhere) > 100, (
            f"too few questions answered by all three nodes ({len(everywhere)})"
        )
        ops = {q[0] for q in everywhere}
        assert ops == {"schema_at", "describe", "list_tables", "list_namespaces", "files"}, ops
        assert len(alters_done) >= 5, f"ALTER stream barely ran ({len(alters_done)})"
        assert len(cycle_done) >= len(CYCLE), f"DROP/CREATE cycle incomplete ({len(cycle_done)})"
        assert len(answers.versions) >= 5, "the readers never saw the schema evolve"
        cycled = [per for q, per in answers.by_question.items() if q[1] in (CYCLED, "iep2")]
        seen_absent = any(_is_absent(a) for per in cycled for a in per.values())
        seen_present = any(not _is_absent(a) for per in cycled for a in per.values())
        assert seen_absent and seen_present, "the readers never saw iep2 come and go"
