"""Random DDL against a naive reference model, with reads at random timestamps.

The model is deliberately dumb: per table name, a list of (tu, columns) events where columns is
None once the table is dropped; the answer at Top is the last event with tu <= Top. It knows the
handful of rules the generated DDL can hit (names exist or not, case-insensitive clashes, the last
column, INT -> BIGINT widening). After every step the real state must agree on every read, pass
check_invariants(), and a failed command must have changed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from metastore.commands import AdvanceSchemaJob, InitCluster, TableName
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError, NotFoundAtTimestampError, TableNotFoundError
from metastore.outcome import Outcome
from metastore.state import MetastoreState
from tests.metastore._support import DETERMINISTIC

MS = 1 << 16
DD_MS = 5  # small, so activation windows overlap the random steps often
DD = DD_MS * MS
T0 = 1_000_000 * MS

NAMESPACES = ["n1", "n2"]
TABLES = ["t1", "t2"]
COLUMNS = ["a", "b", "c", "A"]  # "A" clashes with "a"
TYPES = ["INT", "BIGINT", "STRING"]

Cols = tuple[tuple[str, str], ...]


@dataclass
class Model:
    namespaces: set[str] = field(default_factory=set)
    # table name -> [(tu, columns or None when dropped)], in tu order
    events: dict[str, list[tuple[int, Cols | None]]] = field(default_factory=dict)
    # table name -> names (casefolded) of columns a DROP COLUMN job still holds: hidden from
    # readers, but the name stays taken until the job ends (metastore.jobs)
    dropping: dict[str, set[str]] = field(default_factory=dict)

    def taken(self, table: str, name: str) -> bool:
        return name.casefold() in self.dropping.get(table, set())

    def live(self, table: str) -> Cols | None:
        ev = self.events.get(table)
        return ev[-1][1] if ev else None

    def at(self, table: str, top: int) -> Cols | None:
        answer = None
        for tu, cols in self.events.get(table, []):
            if tu <= top:
                answer = cols
        return answer


def find(cols: Cols, name: str) -> int:
    return next((i for i, (n, _) in enumerate(cols) if n.casefold() == name.casefold()), -1)


class CatalogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = MetastoreState()
        self.model = Model()
        self.tm = T0
        self.index = 1
        self.state.apply(InitCluster(dd_ms=DD_MS, cs_max_ms=2), tm=self.tm, index=1)
        self.applied_tm = self.tm  # Tm of the last entry the state accepted (= its safe time)
        self.last_ok: tuple[str, str] | None = None  # (sql, request id) of the last success
        self.request_counter = 0

    # --- driving ---

    def run(self, sql: str, expected: Cols | bool | None, table: str | None, step: int) -> None:
        """Apply `sql`; `expected` is False for an expected failure, else the table's new columns
        (None: dropped) or True for success without a table event."""
        self.tm += step
        self.index += 1
        before = self.state.to_snapshot()
        self.request_counter += 1
        rid = f"r{self.request_counter}"
        # Every table gets a default location under the warehouse, so re-created and sibling
        # tables exercise the location rules (a dropped table frees its location).
        cmd = parse_ddl(sql, request_id=rid, warehouse="/wh")
        outcome = self.state.apply(cmd, tm=self.tm, index=self.index)
        if expected is False:
            assert not outcome.ok, (sql, outcome)
            assert self.state.to_snapshot() == before, sql
            return
        assert outcome.ok, (sql, outcome.error)
        self.applied_tm = self.tm
        self.last_ok = (sql, rid)
        if table is not None and expected is not True:
            changed = outcome.result.get("changed", True)
            if changed:
                self.model.events.setdefault(table, []).append((self.tm + DD, expected))
                if expected is None:  # dropped: its jobs are aborted
                    self.model.dropping.pop(table, None)
            else:
                assert self.model.live(table) == expected

    steps = st.integers(1, 3 * DD_MS).flatmap(
        lambda ms: st.integers(0, 3).map(lambda logical: ms * MS + logical)
    )

    @rule(ns=st.sampled_from(NAMESPACES), step=steps)
    def create_namespace(self, ns: str, step: int) -> None:
        ok = ns not in self.model.namespaces
        self.run(f"CREATE NAMESPACE {ns}", bool(ok), None, step)
        self.model.namespaces.add(ns)

    @rule(ns=st.sampled_from(NAMESPACES), cascade=st.booleans(), step=steps)
    def drop_namespace(self, ns: str, cascade: bool, step: int) -> None:
        live = [t for t in self.model.events if t.startswith(ns + ".") and self.model.live(t)]
        ok = ns in self.model.namespaces and (cascade or not live)
        self.run(f"DROP NAMESPACE {ns}{' CASCADE' if cascade else ''}", ok, None, step)
        if ok:
            self.model.namespaces.discard(ns)
            for t in live:
                self.model.events[t].append((self.tm + DD, None))
                self.model.dropping.pop(t, None)

    @rule(
        ns=st.sampled_from(NAMESPACES),
        t=st.sampled_from(TABLES),
        cols=st.lists(
            st.tuples(st.sampled_from(COLUMNS), st.sampled_from(TYPES)),
            min_size=1,
            max_size=3,
            unique_by=lambda c: c[0].casefold(),
        ),
        step=steps,
    )
    def create_table(self, ns: str, t: str, cols: list[tuple[str, str]], step: int) -> None:
        name = f"{ns}.{t}"
        ok = ns in self.model.namespaces and self.model.live(name) is None
        body = ", ".join(f"{c} {ty}" for c, ty in cols)
        self.run(f"CREATE TABLE {name} ({body})", tuple(cols) if ok else False, name, step)

    def _live_tables(self) -> list[str]:
        return sorted(t for t in self.model.events if self.model.live(t) is not None)

    @precondition(lambda self: self._live_tables())
    @rule(data=st.data(), step=steps)
    def drop_table(self, data: st.DataObject, step: int) -> None:
        name = data.draw(st.sampled_from([*self._live_tables(), "n1.nope"]))
        ok = self.model.live(name) is not None
        self.run(f"DROP TABLE {name}", None if ok else False, name, step)

    @precondition(lambda self: self._live_tables())
    @rule(data=st.data(), col=st.sampled_from(COLUMNS), ty=st.sampled_from(TYPES), step=steps)
    def add_column(self, data: st.DataObject, col: str, ty: str, step: int) -> None:
        name = data.draw(st.sampled_from(self._live_tables()))
        cols = self.model.live(name)
        assert cols is not None
        ok = find(cols, col) < 0 and not self.model.taken(name, col)
        self.run(
            f"ALTER TABLE {name} ADD COLUMN {col} {ty}",
            (*cols, (col, ty)) if ok else False,
            name,
            step,
        )

    @precondition(lambda self: self._live_tables())
    @rule(data=st.data(), col=st.sampled_from(COLUMNS), step=steps)
    def drop_column(self, data: st.DataObject, col: str, step: int) -> None:
        name = data.draw(st.sampled_from(self._live_tables()))
        cols = self.model.live(name)
        assert cols is not None
        i = find(cols, col)
        ok = i >= 0 and len(cols) > 1
        new = cols[:i] + cols[i + 1 :]
        self.run(f"ALTER TABLE {name} DROP COLUMN {col}", new if ok else False, name, step)
        if ok:  # a job: hidden at once, the name stays taken until `advance_job` ends it
            self.model.dropping.setdefault(name, set()).add(col.casefold())

    @precondition(lambda self: self.state.jobs.jobs(running_only=True))
    @rule(data=st.data(), step=steps)
    def advance_job(self, data: st.DataObject, step: int) -> None:
        """The leader's job worker: the next step of a running DROP COLUMN job (dropped)."""
        job = data.draw(st.sampled_from(self.state.jobs.jobs(running_only=True)))
        name = str(job.table)
        self.tm += step
        self.index += 1
        cmd = AdvanceSchemaJob(job_id=job.job_id, step=job.step)
        outcome = self.state.apply(cmd, tm=self.tm, index=self.index)
        assert outcome.ok, outcome.error
        self.applied_tm = self.tm
        self.model.events[name].append((self.tm + DD, self.model.live(name)))
        self.model.dropping[name].discard(job.column.name.casefold())

    @precondition(lambda self: self._live_tables())
    @rule(data=st.data(), old=st.sampled_from(COLUMNS), new=st.sampled_from(COLUMNS), step=steps)
    def rename_column(self, data: st.DataObject, old: str, new: str, step: int) -> None:
        name = data.draw(st.sampled_from(self._live_tables()))
        cols = self.model.live(name)
        assert cols is not None
        i, j = find(cols, old), find(cols, new)
        ok = i >= 0 and (j < 0 or j == i) and not self.model.taken(name, new)
        renamed = tuple((new if k == i else c, ty) for k, (c, ty) in enumerate(cols))
        sql = f"ALTER TABLE {name} RENAME COLUMN {old} TO {new}"
        self.run(sql, renamed if ok else False, name, step)

    @precondition(lambda self: self._live_tables())
    @rule(data=st.data(), col=st.sampled_from(COLUMNS), ty=st.sampled_from(TYPES), step=steps)
    def change_type(self, data: st.DataObject, col: str, ty: str, step: int) -> None:
        name = data.draw(st.sampled_from(self._live_tables()))
        cols = self.model.live(name)
        assert cols is not None
        i = find(cols, col)
        ok = i >= 0 and (cols[i][1] == ty or (cols[i][1], ty) == ("INT", "BIGINT"))
        changed = tuple((c, ty) if k == i else (c, t) for k, (c, t) in enumerate(cols))
        self.run(
            f"ALTER TABLE {name} ALTER COLUMN {col} TYPE {ty}", changed if ok else False, name, step
        )

    @rule(back=st.integers(0, 3))
    def stale_command_is_rejected(self, back: int) -> None:
        before = self.state.to_snapshot()
        outcome = self.state.apply(
            parse_ddl("CREATE NAMESPACE zz"), tm=self.applied_tm - back, index=self.index + 1
        )
        assert outcome.error is not None and outcome.error["code"] == "STALE_TIMESTAMP"
        assert self.state.to_snapshot() == before

    @precondition(lambda self: self.last_ok is not None)
    @rule(step=steps)
    def retry_is_deduplicated(self, step: int) -> None:
        assert self.last_ok is not None
        sql, rid = self.last_ok
        catalog = self.state.catalog.to_data()
        self.tm += step
        self.index += 1
        outcome: Outcome = self.state.apply(
            parse_ddl(sql, request_id=rid, warehouse="/wh"), tm=self.tm, index=self.index
        )
        assert outcome.ok and outcome.deduplicated
        assert self.state.catalog.to_data() == catalog
        self.applied_tm = self.tm

    @rule(step=steps)
    def tick(self, step: int) -> None:
        self.tm += step
        self.index += 1
        assert self.state.observe_tick(self.tm, self.index).ok
        self.applied_tm = self.tm

    # --- reads ---

    @rule(data=st.data())
    def read_at_random_timestamps(self, data: st.DataObject) -> None:
        tus = [tu for ev in self.model.events.values() for tu, _ in ev]
        exact = st.sampled_from(tus).flatmap(lambda tu: st.sampled_from([tu - 1, tu, tu + 1]))
        anywhere = st.integers(T0, self.tm + 2 * DD)
        for _ in range(5):
            top = data.draw(exact if tus and data.draw(st.booleans()) else anywhere)
            for ns in NAMESPACES:
                for t in TABLES:
                    self.check_read(f"{ns}.{t}", top)

    def check_read(self, name: str, top: int) -> None:
        expected = self.model.at(name, top)
        try:
            version = self.state.schema_at(TableName.parse(name), top)
        except (NotFoundAtTimestampError, TableNotFoundError) as e:
            assert expected is None, (name, top, expected)
            with pytest.raises(type(e)):
                self.state.files_at(TableName.parse(name), top)
            if name not in self.model.events:
                # never created: the error must say so rather than "not at this time"
                self.assert_raises_table_not_found(name, top)
            return
        got = tuple((c.name, c.type.to_sql()) for c in version.schema.columns)
        assert got == expected, (name, top, got, expected)
        assert version.tu <= top
        ns, table = name.split(".")
        assert version.location == f"/wh/{ns}.db/{table}"
        # The txn log registers exactly what the catalog has: a table nobody wrote is readable
        # (and empty) wherever its schema is.
        assert self.state.files_at(TableName.parse(name), top) == ()

    def assert_raises_table_not_found(self, name: str, top: int) -> None:
        try:
            self.state.schema_at(TableName.parse(name), top)
        except TableNotFoundError:
            return
        except MetastoreError as e:
            raise AssertionError(f"{name}: expected TableNotFoundError, got {e!r}") from e

    # --- invariants ---

    @invariant()
    def state_is_sound(self) -> None:
        self.state.check_invariants()
        assert self.state.safe_time == self.applied_tm
        live = sorted(str(t) for ns in self.model.namespaces for t in self.state.list_tables(ns))
        assert live == self._live_tables()
        assert sorted(n.name for n in self.state.list_namespaces()) == sorted(self.model.namespaces)

    @invariant()
    def snapshot_round_trips(self) -> None:
        snap = self.state.to_snapshot()
        assert MetastoreState.from_snapshot(snap).to_snapshot() == snap


CatalogMachine.TestCase.settings = settings(DETERMINISTIC, max_examples=50, stateful_step_count=40)
TestCatalogMachine = CatalogMachine.TestCase
