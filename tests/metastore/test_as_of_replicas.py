"""IEP-98's Atomicity Property across replicas, restarts and snapshot installs (DESIGN.md §3):

    for any question (read, argument, T), every node that may answer it gives the same answer,
    error or value, and no node ever changes it, whatever it applies or installs later.

`test_answers_never_change` asks one state at different moments. This machine runs a leader and
a follower on the same log: the follower lags by a random number of entries, catches up entry
by entry, restarts from its own snapshot or installs the leader's; the leader restarts from its
snapshot. The log holds what changes schemas in every way the catalog knows: DDL (namespaces and
tables created, dropped and re-created, columns added, properties set), schema change jobs
(DROP COLUMN and ADD COLUMN ... NOT NULL DEFAULT: every step, backfill reports, cancels),
commits, GC threshold moves and idle ticks. Each replica is asked, at timestamps it may serve
(schemas: T <= safe time + DD; files: T <= safe time), and each answer must equal what any
replica said before. The answers are the full protocol views (`metastore.daemon.views`), so a
field that differs (pending columns, properties, a version count) is caught too.

GC is the one documented exception (ARCHITECTURE.md "GC"): a replica that applied a threshold
refuses reads at or below it (BEFORE_GC_THRESHOLD) that a replica which has not may still
answer. So that error may stand in for an answer; nothing else may.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from metastore.commands import (
    AdvanceGcThreshold,
    AdvanceSchemaJob,
    CancelSchemaJob,
    Command,
    CommitTxn,
    DataFile,
    InitCluster,
    SchemaJobBackfilled,
    TableName,
    TableWrite,
)
from metastore.daemon.views import description_view, file_view, namespace_view, version_view
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from metastore.state import MetastoreState
from tests.metastore._support import DETERMINISTIC

MS = 1 << 16
DD_MS = 5  # small, so activations overlap the random steps
DD = DD_MS * MS
T0 = 1_000_000 * MS
NAMESPACES = ["n1", "n2"]
NAMES = [TableName.of(ns, t) for ns in NAMESPACES for t in ("a", "b")]
RECORDED_MAX = 300
GC_REFUSAL = "BEFORE_GC_THRESHOLD"
LOGICAL_STEP = 0  # a step of one logical tick, not a millisecond

Answer = tuple[object, ...]
Question = tuple[str, str, int]  # (read, argument, T)


@dataclass(frozen=True, slots=True)
class LogEntry:
    command: Command | None  # None: an idle tick
    tm: int
    index: int


def _answer(read: Callable[[], object]) -> Answer:
    try:
        return ("ok", repr(read()))
    except MetastoreError as e:
        return ("error", e.code.value, repr(sorted(e.details.items())))


def ask(state: MetastoreState, question: Question) -> Answer:
    kind, arg, ts = question
    if kind == "schema":
        return _answer(lambda: version_view(arg, state.schema_at(arg, ts)))
    if kind == "describe":
        return _answer(lambda: description_view(state.describe_at(arg, ts)))
    if kind == "files":
        return _answer(lambda: [file_view(f) for f in state.files_at(arg, ts)])
    if kind == "tables":
        return _answer(lambda: [str(t) for t in state.list_tables(arg, top=ts)])
    assert kind == "namespaces"
    return _answer(lambda: [namespace_view(n) for n in state.list_namespaces(top=ts)])


def apply_entry(state: MetastoreState, entry: LogEntry) -> None:
    if entry.command is None:
        state.observe_tick(entry.tm, entry.index).raise_for_error()
    else:
        state.apply(entry.command, tm=entry.tm, index=entry.index)


def restarted(state: MetastoreState) -> MetastoreState:
    """The state a node holds after loading a snapshot of `state` (a restart, an install)."""
    return MetastoreState.from_snapshot(state.to_snapshot())


class ReplicasMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[LogEntry] = []
        self.tm = T0
        self.leader = MetastoreState()
        self.follower = MetastoreState()
        self.follower_at = 0  # entries of `log` the follower applied
        self.recorded: dict[Question, Answer] = {}
        self.files = 0
        self.append(InitCluster(dd_ms=DD_MS, cs_max_ms=1))
        # Every name starts out existing, so most random steps change something.
        for ns in NAMESPACES:
            self.append(parse_ddl(f"CREATE NAMESPACE {ns}"))
        for name in NAMES:
            self.append(parse_ddl(self.create_sql(name), warehouse="/wh"))

    @staticmethod
    def create_sql(name: TableName) -> str:
        return f"CREATE TABLE {name} (c INT, d INT) TBLPROPERTIES ('gc.ttl' = '1s')"

    # --- the log ---

    def append(self, command: Command | None, step_ms: int = 1) -> None:
        # Whole milliseconds, or one logical tick (an HLC stamps last Tm + 1 under load): the
        # boundaries Tu - 1 / Tu / safe time + DD then fall one unit apart.
        self.tm += 1 if step_ms == LOGICAL_STEP else step_ms * MS
        self.ask_at_the_edge(self.leader)
        entry = LogEntry(command=command, tm=self.tm, index=len(self.log) + 1)
        self.log.append(entry)
        apply_entry(self.leader, entry)

    steps = st.one_of(st.just(LOGICAL_STEP), st.integers(1, 3 * DD_MS))

    @rule(data=st.data(), step=steps)
    def ddl(self, data: st.DataObject, step: int) -> None:
        ns = data.draw(st.sampled_from(NAMESPACES))
        name = data.draw(st.sampled_from(NAMES))
        n = len(self.log)
        sql = data.draw(
            st.sampled_from(
                [
                    f"CREATE NAMESPACE IF NOT EXISTS {ns}",
                    f"CREATE NAMESPACE IF NOT EXISTS {ns}",
                    f"DROP NAMESPACE IF EXISTS {ns} CASCADE",
                    self.create_sql(name),
                    self.create_sql(name),
                    f"CREATE TABLE {name} (c INT)",
                    f"DROP TABLE IF EXISTS {name}",
                    f"ALTER TABLE {name} ADD COLUMN x{n} INT",
                    f"ALTER TABLE {name} DROP COLUMN d",  # a schema change job
                    f"ALTER TABLE {name} ADD COLUMN y{n} INT NOT NULL DEFAULT 7",  # a job too
                    f"ALTER TABLE {name} SET TBLPROPERTIES ('k' = 'v{n}')",
                ]
            )
        )
        self.append(parse_ddl(sql, warehouse="/wh"), step)

    @rule(data=st.data(), step=steps)
    def job(self, data: st.DataObject, step: int) -> None:
        running = self.leader.jobs.jobs(running_only=True)
        if not running:
            return
        job = data.draw(st.sampled_from(running))
        command = data.draw(
            st.sampled_from(
                [
                    AdvanceSchemaJob(job_id=job.job_id, step=job.step),
                    AdvanceSchemaJob(job_id=job.job_id, step=job.step),
                    SchemaJobBackfilled(
                        job_id=job.job_id,
                        snapshot_ts=max(job.backfill_from_ts, self.tm - DD),
                        files_rewritten=0,
                    ),
                    CancelSchemaJob(job_id=job.job_id),
                ]
            )
        )
        self.append(command, step)

    @rule(data=st.data(), step=st.sampled_from([LOGICAL_STEP, 1, 2, 3]))
    def commit(self, data: st.DataObject, step: int) -> None:
        name = data.draw(st.sampled_from(NAMES))
        version = 1  # when the table is not live the commit is refused: that changes nothing
        with contextlib.suppress(MetastoreError):
            version = self.leader.current(name).version
        self.files += 1
        write = TableWrite(
            table=name,
            schema_version=data.draw(st.sampled_from([version, max(1, version - 1)])),
            add=(DataFile(path=f"_txn/{self.files}/p.parquet", size_bytes=1, row_count=1),),
            overwrite=data.draw(st.integers(0, 4)) == 0,
        )
        ahead = data.draw(st.sampled_from([0, 0, 1, DD]))
        not_before = self.tm + max(1, step * MS) + ahead if ahead else None
        self.append(
            CommitTxn(txn_id=f"t{self.files}", writes=(write,), not_before=not_before), step
        )

    @rule(data=st.data(), step=st.integers(1, 400))
    def gc(self, data: st.DataObject, step: int) -> None:
        name = data.draw(st.sampled_from(NAMES))
        incarnations = self.leader.catalog.incarnations(name)
        if not incarnations:
            return
        inc = data.draw(st.sampled_from(incarnations))
        up_to = self.tm - data.draw(st.integers(0, 4 * DD))
        self.append(AdvanceGcThreshold(table=name, table_id=inc.table_id, up_to=up_to), step)

    @rule(step=steps)
    def tick(self, step: int) -> None:
        self.append(None, step)

    # --- the replicas ---

    @rule(entries=st.integers(1, 8))
    def follower_applies(self, entries: int) -> None:
        for entry in self.log[self.follower_at : self.follower_at + entries]:
            self.ask_at_the_edge(self.follower)
            apply_entry(self.follower, entry)
            self.follower_at += 1

    @rule()
    def follower_restarts(self) -> None:
        self.follower = restarted(self.follower)

    @rule()
    def follower_installs_the_leaders_snapshot(self) -> None:
        self.follower = restarted(self.leader)
        self.follower_at = len(self.log)

    @rule()
    def leader_restarts(self) -> None:
        self.leader = restarted(self.leader)

    # --- the property ---

    @rule(data=st.data())
    def ask_both(self, data: st.DataObject) -> None:
        for state in (self.leader, self.follower):
            if state.cluster is None:
                continue
            for _ in range(3):
                kind = data.draw(
                    st.sampled_from(["schema", "describe", "files", "tables", "namespaces"])
                )
                safe = state.safe_time
                servable = safe if kind == "files" else safe + DD
                ts = data.draw(
                    st.one_of(
                        st.integers(max(T0, servable - 8 * DD), servable),
                        st.sampled_from([servable, servable - 1]),
                        self.boundaries(servable),
                    )
                )
                if kind in ("tables", "namespaces"):
                    arg = data.draw(st.sampled_from(NAMESPACES))
                else:
                    arg = str(data.draw(st.sampled_from(NAMES)))
                question = (kind, arg, ts)
                self.check(question, ask(state, question))
        while len(self.recorded) > RECORDED_MAX:
            del self.recorded[next(iter(self.recorded))]

    def ask_at_the_edge(self, state: MetastoreState) -> None:
        """Ask every question at the last timestamp `state` may serve, right before it applies
        the next entry: the one most likely to change if anything activated too early."""
        if state.cluster is None:
            return
        for kind in ("schema", "describe", "files"):
            ts = state.safe_time + (0 if kind == "files" else DD)
            for name in NAMES:
                self.check((kind, str(name), ts), ask(state, (kind, str(name), ts)))
        for ns in NAMESPACES:
            question = ("tables", ns, state.safe_time + DD)
            self.check(question, ask(state, question))
        question = ("namespaces", "", state.safe_time + DD)
        self.check(question, ask(state, question))

    def boundaries(self, servable: int) -> st.SearchStrategy[int]:
        """Activation boundaries (Tu - 1, Tu, Tu + 1 of versions, creations and drops) a
        replica may serve."""
        tus = set()
        for name in NAMES:
            for inc in self.leader.catalog.incarnations(name):
                tus.update(inc.tus)
                if inc.dropped_tu is not None:
                    tus.add(inc.dropped_tu)
        for ns in NAMESPACES:
            for n in self.leader.catalog.namespace_incarnations(ns):
                tus.add(n.created_tu)
                if n.dropped_tu is not None:
                    tus.add(n.dropped_tu)
        near = sorted({t + d for t in tus for d in (-1, 0, 1) if T0 <= t + d <= servable})
        return st.sampled_from(near) if near else st.just(servable)

    def check(self, question: Question, answer: Answer) -> None:
        before = self.recorded.get(question)
        if answer[:2] == ("error", GC_REFUSAL):
            return  # the documented exception: a node that applied the threshold refuses
        if before is None:
            self.recorded[question] = answer
            return
        assert answer == before, f"{question}: was {before}, now {answer}"

    @invariant()
    def recorded_answers_stand(self) -> None:
        for state in (self.leader, self.follower):
            if state.cluster is None:
                continue
            for question, answer in self.recorded.items():
                kind, _arg, ts = question
                servable = state.safe_time if kind == "files" else state.safe_time + DD
                if ts > servable:
                    continue  # this node would wait first
                again = ask(state, question)
                if again[:2] == ("error", GC_REFUSAL):
                    continue
                assert again == answer, f"{question}: was {answer}, now {again}"


ReplicasMachine.TestCase.settings = settings(DETERMINISTIC, max_examples=30, stateful_step_count=50)
TestAsOfReplicas = ReplicasMachine.TestCase
