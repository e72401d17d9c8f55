"""The property the whole design rests on (IEP-98's Atomicity Property, DESIGN.md §3):

    an answer a node may already give for a timestamp never changes, whatever is applied later.

A node answers a schema read at T once its safe time >= T - DD, and a files read at T once its
safe time >= T. So, after any prefix of the log, every schema-shaped answer (schema_at, describe
AS OF, list_tables / list_namespaces AS OF) at T <= safe_time + DD and every files answer at
T <= safe_time is final: it must come out identical, error or value, after every later entry. This
machine applies random DDL (namespaces and tables created, dropped and re-created, columns added),
commits (some landing ahead of their entry's Tm) and ticks; it records answers at servable
timestamps as it goes and asks every recorded question again after every step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from metastore import limits
from metastore.commands import CommitTxn, DataFile, InitCluster, TableName, TableWrite
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from metastore.state import MetastoreState
from tests.metastore._support import DETERMINISTIC

MS = 1 << 16
DD_MS = 5  # small, so activations overlap the random steps
DD = DD_MS * MS
AHEAD = min(limits.COMMIT_TS_AHEAD_MAX_MS * MS, DD)
T0 = 1_000_000 * MS
NAMESPACES = ["n1", "n2"]
NAMES = [TableName.of(ns, t) for ns in NAMESPACES for t in ("a", "b")]
RECORDED_MAX = 400  # questions kept for re-asking; the oldest go first

Answer = object
Question = tuple[str, str, int]  # (read kind, argument, timestamp)


def _answer(read: Callable[[], Answer]) -> Answer:
    try:
        return ("ok", read())
    except MetastoreError as e:
        return ("error", e.code.value)


class AnswersMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = MetastoreState()
        self.tm = T0
        self.index = 1
        self.state.apply(InitCluster(dd_ms=DD_MS, cs_max_ms=1), tm=self.tm, index=self.index)
        self.recorded: dict[Question, Answer] = {}
        self.files = 0
        self.txns = 0

    # --- the reads, normalized to plain comparable values ---

    def ask(self, kind: str, arg: str, ts: int) -> Answer:
        s = self.state
        if kind == "schema":
            return _answer(lambda: _version(s.schema_at(arg, ts)))
        if kind == "files":
            return _answer(lambda: tuple(f.path for f in s.files_at(arg, ts)))
        if kind == "tables":
            return _answer(lambda: tuple(str(t) for t in s.list_tables(arg, top=ts)))
        if kind == "describe":
            return _answer(lambda: repr(s.describe_at(arg, ts)))
        assert kind == "namespaces"
        return _answer(lambda: tuple(n.name for n in s.list_namespaces(top=ts)))

    def record(self, data: st.DataObject) -> None:
        """Ask a few questions the node may answer now, and remember the answers."""
        safe = self.state.safe_time
        for _ in range(4):
            kind = data.draw(
                st.sampled_from(["schema", "files", "tables", "describe", "namespaces"])
            )
            limit = safe if kind == "files" else safe + DD  # what a node may serve right now
            ts = data.draw(st.integers(max(T0, limit - 6 * DD), limit))
            if kind in ("tables", "namespaces"):
                arg = data.draw(st.sampled_from(NAMESPACES))
            else:
                arg = str(data.draw(st.sampled_from(NAMES)))
            question = (kind, arg, ts)
            self.recorded.setdefault(question, self.ask(*question))
        while len(self.recorded) > RECORDED_MAX:
            del self.recorded[next(iter(self.recorded))]

    # --- the writes ---

    def apply(self, command: object, step_ms: int) -> None:
        self.tm += step_ms * MS
        self.index += 1
        self.state.apply(command, tm=self.tm, index=self.index)  # type: ignore[arg-type]

    steps = st.integers(1, 3 * DD_MS)

    @rule(data=st.data(), step=steps)
    def ddl(self, data: st.DataObject, step: int) -> None:
        ns = data.draw(st.sampled_from(NAMESPACES))
        name = data.draw(st.sampled_from(NAMES))
        sql = data.draw(
            st.sampled_from(
                [
                    f"CREATE NAMESPACE IF NOT EXISTS {ns}",
                    f"DROP NAMESPACE IF EXISTS {ns} CASCADE",
                    f"CREATE TABLE {name} (c INT)",
                    f"CREATE TABLE {name} (c INT)",
                    f"DROP TABLE IF EXISTS {name}",
                    f"ALTER TABLE {name} ADD COLUMN x{self.index} INT",
                ]
            )
        )
        self.apply(parse_ddl(sql, warehouse="/wh"), step)
        self.record(data)

    @rule(data=st.data(), step=st.integers(1, 3), ahead=st.sampled_from([0, 0, 1, MS, AHEAD]))
    def commit(self, data: st.DataObject, step: int, ahead: int) -> None:
        name = data.draw(st.sampled_from(NAMES))
        version = 1  # when the table is not live the commit is refused: that changes nothing either
        with contextlib.suppress(MetastoreError):
            version = self.state.current(name).version
        self.files += 1
        self.txns += 1
        write = TableWrite(
            table=name,
            schema_version=data.draw(st.sampled_from([version, max(1, version - 1)])),
            add=(DataFile(path=f"_txn/{self.files}/p.parquet", size_bytes=1, row_count=1),),
            overwrite=data.draw(st.integers(0, 4)) == 0,
        )
        not_before = self.tm + step * MS + ahead if ahead else None
        self.apply(CommitTxn(txn_id=f"t{self.txns}", writes=(write,), not_before=not_before), step)
        self.record(data)

    @rule(data=st.data(), step=steps)
    def tick(self, data: st.DataObject, step: int) -> None:
        self.tm += step * MS
        self.index += 1
        self.state.observe_tick(self.tm, self.index).raise_for_error()
        self.record(data)

    # --- the property ---

    @invariant()
    def every_answer_given_is_final(self) -> None:
        for question, answer in self.recorded.items():
            again = self.ask(*question)
            assert again == answer, f"{question}: was {answer}, now {again}"


def _version(v: object) -> tuple[object, ...]:
    from metastore.catalog import SchemaVersion

    assert isinstance(v, SchemaVersion)
    return (v.table_id, v.version, v.tu, tuple(c.name for c in v.schema.columns), v.location)


AnswersMachine.TestCase.settings = settings(DETERMINISTIC, max_examples=40, stateful_step_count=50)
TestAnswersNeverChange = AnswersMachine.TestCase
