"""IEP-98's Atomicity Property through the client API's read paths (`_at`, `_data_read_ts`,
the views): a node that has applied only a prefix of the log, and catches up only as far as its
wait for safe time demands, answers every timestamped read exactly as the leader does.

The stub node starts at a random prefix; asked to wait for safe time >= ts, it applies the
fewest further entries that reach ts (a real node may stop there too). So if a read path
waited for less than it needs (a schema read for Top - 2 DD, a listing for T - DD) or resolved
anything before its wait, the lagging node would answer from a state that misses an entry the
leader has, and the answers would differ. Answers compare whole, minus what is per node
(`waited_ms`, `safe_time`). Stub nodes, nothing started.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hlc import HybridClock, ManualClock
from metastore.commands import (
    AdvanceSchemaJob,
    Command,
    CommitTxn,
    DataFile,
    InitCluster,
    TableName,
    TableWrite,
)
from metastore.daemon import server
from metastore.daemon.server import ApiServer, Session
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from metastore.state import MetastoreState
from tests.metastore._support import DETERMINISTIC
from tests.metastore.test_as_of_replicas import LogEntry, apply_entry

MS = 1 << 16
DD_MS = 5
DD = DD_MS * MS
T0 = 1_000_000 * MS
NAMESPACES = ["n1", "n2"]
NAMES = [str(TableName.of(ns, t)) for ns in NAMESPACES for t in ("a", "b")]
PER_NODE = frozenset({"waited_ms", "safe_time"})


class MinimalNode:
    """Serves `sm.state`, a replica at some prefix of `log`; a wait for safe time applies the
    fewest entries that reach it."""

    def __init__(self, log: list[LogEntry], applied: int) -> None:
        self.node_id = 2
        self.log = log
        self.applied = 0
        self.sm = SimpleNamespace(state=MetastoreState(), events=None)
        self.ready_to_serve = True
        self.catch_up(applied)

    def catch_up(self, count: int) -> None:
        for entry in self.log[self.applied : count]:
            apply_entry(self.sm.state, entry)
        self.applied = max(self.applied, count)

    @property
    def safe_time(self) -> int:
        return self.log[self.applied - 1].tm if self.applied else 0

    def is_leader(self) -> bool:
        return False

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        while self.safe_time < ts:
            assert self.applied < len(self.log), "asked to wait past the leader's safe time"
            self.catch_up(self.applied + 1)
        return 0.0


class _NoMetrics:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def _api(node: MinimalNode, clock_ms: int) -> ApiServer:
    api = ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=node.sm,  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(clock_ms)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=_NoMetrics(),  # type: ignore[arg-type]
        cluster_id="replicas",
        client_addresses={},
        read_staleness_max_ms=600_000,  # this test is not about staleness
    )
    api.gc = None
    return api


def _ask(api: ApiServer, op: str, args: dict[str, Any]) -> object:
    spec = api._ops[op]
    server._check_args(args, spec.args)
    try:
        reply = asyncio.run(spec.handler(Session(peer="t"), args))
    except MetastoreError as e:
        return ("error", e.code.value, repr(sorted(e.details.items())))
    return ("ok", repr(sorted((k, v) for k, v in reply.items() if k not in PER_NODE)))


def _commands(draw: st.DrawFn, count: int) -> list[tuple[Command | None, int]]:
    """`count` random entries (None: an idle tick) with their Tm steps in HLC units."""
    out: list[tuple[Command | None, int]] = [
        (parse_ddl(f"CREATE NAMESPACE {ns}"), MS) for ns in NAMESPACES
    ]
    out += [(parse_ddl(f"CREATE TABLE {n} (c INT, d INT)", warehouse="/wh"), MS) for n in NAMES]
    out.append((None, 2 * DD))  # every table active: commits at version 1 land
    for i in range(count):
        step = draw(st.sampled_from([1, 1, 1, MS, 2 * MS, DD, DD + 1, 3 * DD]))
        name = draw(st.sampled_from(NAMES))
        kind = draw(st.sampled_from(["ddl", "ddl", "commit", "tick", "job"]))
        if kind == "tick":
            out.append((None, step))
        elif kind == "commit":
            write = TableWrite(
                table=TableName.parse(name),
                schema_version=draw(st.sampled_from([1, 1, 2])),
                add=(DataFile(path=f"_txn/{i}/p.parquet", size_bytes=1, row_count=1),),
                overwrite=draw(st.booleans()),
            )
            out.append((CommitTxn(txn_id=f"t{i}", writes=(write,)), step))
        elif kind == "job":
            out.append((AdvanceSchemaJob(job_id=draw(st.integers(1, 3)), step=0), step))
        else:
            ns = name.split(".")[0]
            sql = draw(
                st.sampled_from(
                    [
                        f"ALTER TABLE {name} ADD COLUMN x{i} INT",
                        f"ALTER TABLE {name} DROP COLUMN d",
                        f"DROP TABLE IF EXISTS {name}",
                        f"CREATE TABLE IF NOT EXISTS {name} (c INT)",
                        f"DROP NAMESPACE IF EXISTS {ns} CASCADE",
                        f"CREATE NAMESPACE IF NOT EXISTS {ns}",
                    ]
                )
            )
            out.append((parse_ddl(sql, warehouse="/wh"), step))
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[LogEntry], int, list[tuple[str, dict[str, Any]]]]:
    tm = T0
    log = [LogEntry(command=InitCluster(dd_ms=DD_MS, cs_max_ms=1), tm=tm, index=1)]
    for command, step in _commands(draw, draw(st.integers(1, 25))):
        tm += step
        log.append(LogEntry(command=command, tm=tm, index=len(log) + 1))
    applied = draw(st.integers(1, len(log)))
    leader_safe = log[-1].tm
    lagging_safe = log[applied - 1].tm
    questions = []
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["schema_at", "describe", "files", "list_tables", "namespaces"]))
        limit = leader_safe if op == "files" else leader_safe + DD  # the leader answers at once
        ts = draw(
            st.one_of(
                st.integers(T0, limit),
                st.sampled_from([limit, limit - 1, lagging_safe + DD, lagging_safe + DD + 1]),
                # an entry's Tm and activation, and their neighbours: where a wait one short
                # of what is needed shows
                st.sampled_from(log).flatmap(
                    lambda e: st.sampled_from([e.tm - 1, e.tm, e.tm + DD - 1, e.tm + DD])
                ),
                st.sampled_from([e.tm for e in log if isinstance(e.command, CommitTxn)] or [T0]),
            )
        )
        ts = min(ts, limit)
        table = draw(st.sampled_from(NAMES))
        if op == "schema_at":
            questions.append((op, {"table": table, "ts": ts}))
        elif op in ("describe", "files"):
            questions.append((op, {"table": table, "as_of": ts}))
        elif op == "list_tables":
            questions.append((op, {"namespace": table.split(".")[0], "as_of": ts}))
        else:
            questions.append(("list_namespaces", {"as_of": ts}))
    return log, applied, questions


@settings(DETERMINISTIC, max_examples=150)
@given(scenarios())
def test_a_lagging_node_answers_every_timestamped_read_as_the_leader_does(
    scenario: tuple[list[LogEntry], int, list[tuple[str, dict[str, Any]]]],
) -> None:
    log, applied, questions = scenario
    # One clock for both, past every question (none is refused as ahead of it).
    clock_ms = log[-1].tm // MS + DD_MS + 1
    leader = MinimalNode(log, len(log))
    for op, args in questions:
        lagging = MinimalNode(log, applied)  # a fresh one per question: its minimal catch-up
        expected = _ask(_api(leader, clock_ms), op, args)
        got = _ask(_api(lagging, clock_ms), op, args)
        assert got == expected, (op, args, applied, lagging.applied, len(log))


def _boundary_log(last: Command) -> list[LogEntry]:
    """Tables created and active, a tick, then `last` one logical unit after the tick: a node
    that applied everything but `last` has safe time exactly `last`'s Tm - 1."""
    tm = T0
    log = [LogEntry(command=InitCluster(dd_ms=DD_MS, cs_max_ms=1), tm=tm, index=1)]
    steps: list[tuple[Command | None, int]] = [
        (parse_ddl("CREATE NAMESPACE n1"), MS),
        (parse_ddl("CREATE TABLE n1.a (c INT)", warehouse="/wh"), MS),
        (None, 2 * DD),
        (last, 1),
    ]
    for command, step in steps:
        tm += step
        log.append(LogEntry(command=command, tm=tm, index=len(log) + 1))
    return log


COMMIT = CommitTxn(
    txn_id="t1",
    writes=(
        TableWrite(
            table=TableName.parse("n1.a"),
            schema_version=1,
            add=(DataFile(path="_txn/1/p.parquet", size_bytes=1, row_count=1),),
        ),
    ),
)


def test_the_exact_boundaries_one_entry_behind() -> None:
    """A listing at a commit's own ts (= its entry's Tm), and a schema read at a version's Tu
    (= its Tm + DD), on a node whose safe time is one unit short of that Tm: it must wait for
    (apply) the entry, then answer as the leader."""
    for last, op, args_of in [
        (COMMIT, "files", lambda tm: {"table": "n1.a", "as_of": tm}),
        (
            parse_ddl("ALTER TABLE n1.a ADD COLUMN b INT"),
            "schema_at",
            lambda tm: {"table": "n1.a", "ts": tm + DD},
        ),
        (parse_ddl("DROP TABLE n1.a"), "describe", lambda tm: {"table": "n1.a", "as_of": tm + DD}),
        (
            parse_ddl("CREATE NAMESPACE n2"),
            "list_namespaces",
            lambda tm: {"as_of": tm + DD},
        ),
    ]:
        log = _boundary_log(last)
        clock_ms = log[-1].tm // MS + DD_MS + 1
        args = args_of(log[-1].tm)
        expected = _ask(_api(MinimalNode(log, len(log)), clock_ms), op, args)
        lagging = MinimalNode(log, len(log) - 1)
        assert _ask(_api(lagging, clock_ms), op, args) == expected, (op, args)
        assert lagging.applied == len(log)
