"""Random commits, DDL and ticks against a naive reference model of the transaction log.

The model keeps a plain list of successful commits and answers "files of table T at ts" by
replaying every commit with ts' <= ts in order (overwrite clears, remove deletes, add appends).
It also predicts each commit's fate with the rules of metastore.txn written out naively, in the
documented order. After every step the real state must agree with the model on the outcome
(the chosen ts or the error class), on `files_at` for every table name at the timestamps around
every commit and a few random ones, and on `table_upper`; a refused command must have changed
nothing; invariants hold and a snapshot round trip is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from metastore import limits
from metastore.commands import CommitTxn, DataFile, InitCluster, TableName, TableWrite
from metastore.ddl import parse_ddl
from metastore.errors import (
    BatchAlreadyCommittedError,
    CommitTimestampUnavailableError,
    DataFileConflictError,
    InvalidArgumentError,
    MetastoreError,
    NotFoundAtTimestampError,
    ReadConflictError,
    SchemaVersionNotActiveError,
    TableNotFoundError,
    TimestampAheadError,
    TxnIdReusedError,
)
from metastore.state import MetastoreState
from tests.metastore._support import DETERMINISTIC

MS = 1 << 16
DD_MS = 5  # small, so activations and the ahead bound (= DD here) overlap the random steps
CS_MAX_MS = 1
DD = DD_MS * MS
AHEAD = min(limits.COMMIT_TS_AHEAD_MAX_MS * MS, DD)
T0 = 1_000_000 * MS
NAMES = [TableName.of("ns", "a"), TableName.of("ns", "b")]


@dataclass
class Incarnation:
    table_id: int
    created_tu: int
    tus: list[int]
    dropped_tu: int | None = None


@dataclass
class Commit:
    ts: int
    txn_id: str
    key: object  # canonical writes, for the idempotency rule
    # table id -> (adds, removes, overwrite)
    writes: dict[int, tuple[list[str], list[str], bool]]
    stream: str | None = None
    seq: int | None = None


@dataclass
class Model:
    incarnations: dict[TableName, list[Incarnation]] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)
    next_table_id: int = 1

    def live(self, name: TableName) -> Incarnation | None:
        incs = self.incarnations.get(name)
        return incs[-1] if incs and incs[-1].dropped_tu is None else None

    def at(self, name: TableName, ts: int) -> Incarnation | None:
        for inc in self.incarnations.get(name, []):
            if inc.created_tu <= ts and (inc.dropped_tu is None or ts < inc.dropped_tu):
                return inc
        return None

    def files_at(self, table_id: int, ts: int) -> list[str]:
        live: list[str] = []
        for c in self.commits:
            if c.ts > ts or table_id not in c.writes:
                continue
            adds, removes, overwrite = c.writes[table_id]
            live = [] if overwrite else [p for p in live if p not in removes]
            live += adds
        return live

    def ever(self, table_id: int) -> dict[str, bool]:
        """Every path the table ever had -> still live now."""
        state: dict[str, bool] = {}
        for c in self.commits:
            if table_id in c.writes:
                adds, removes, overwrite = c.writes[table_id]
                for p in state:
                    if overwrite or p in removes:
                        state[p] = False
                for p in adds:
                    state[p] = True
        return state

    def last_commit_ts(self) -> int:
        return self.commits[-1].ts if self.commits else 0

    def stream_mark(self, stream: str) -> int | None:
        """The highest committed position of `stream` (positions only ever grow)."""
        seqs = [c.seq for c in self.commits if c.stream == stream and c.seq is not None]
        return max(seqs) if seqs else None

    def last_write_to(self, name: TableName) -> int:
        ids = {inc.table_id for inc in self.incarnations.get(name, [])}
        return max((c.ts for c in self.commits if ids & set(c.writes)), default=0)


def key_of(cmd: CommitTxn) -> object:
    return sorted(
        (
            str(w.table),
            w.table_id,
            w.schema_version,
            sorted((f.path, f.size_bytes, f.row_count) for f in w.add),
            sorted(w.remove),
            w.overwrite,
        )
        for w in cmd.writes
    )


def predict(
    model: Model, cmd: CommitTxn, tm: int, *, apply_version: int = 1
) -> int | type[MetastoreError]:
    """The commit ts, or the error class, following metastore.txn's documented order at the
    cluster's `apply_version`."""
    seen = next((c for c in model.commits if c.txn_id == cmd.txn_id), None)
    if seen is not None and seen.key == key_of(cmd):
        return seen.ts
    if cmd.stream is not None and cmd.seq is not None:
        mark = model.stream_mark(cmd.stream)
        if mark is not None and cmd.seq <= mark:
            return BatchAlreadyCommittedError
    if seen is not None:
        return TxnIdReusedError
    upper = max(model.last_commit_ts() + 1, tm)
    if cmd.ts is not None:
        if cmd.ts < upper:
            return CommitTimestampUnavailableError
        if cmd.ts > tm + AHEAD:
            return InvalidArgumentError
        ts = cmd.ts
    else:
        if (cmd.not_before or 0) > tm + AHEAD:
            # Apply version 6: within two clock skews the leader's clock gets there; retryable.
            if apply_version >= 6 and (cmd.not_before or 0) <= tm + AHEAD + 2 * CS_MAX_MS * MS:
                return TimestampAheadError
            return InvalidArgumentError
        ts = max(upper, cmd.not_before or 0)
    if cmd.read_ts is not None:
        if cmd.read_ts >= ts:
            return InvalidArgumentError
        for name in cmd.read_tables:
            if name not in model.incarnations:
                return TableNotFoundError
            if model.last_write_to(name) > cmd.read_ts:
                return ReadConflictError
            # Apply version 5: a drop of an incarnation of the name activating in (read_ts, ts].
            drops = [
                inc.dropped_tu
                for inc in model.incarnations[name]
                if inc.dropped_tu is not None and cmd.read_ts < inc.dropped_tu <= ts
            ]
            if apply_version >= 5 and drops:
                return ReadConflictError
    for w in cmd.writes:
        inc = model.live(w.table)
        if inc is None or (w.table_id and w.table_id != inc.table_id):
            return TableNotFoundError
        if ts < inc.created_tu:
            return NotFoundAtTimestampError
        newest = max(i for i, tu in enumerate(inc.tus) if tu <= ts)
        if w.schema_version not in (newest + 1, newest):
            return SchemaVersionNotActiveError
        ever = model.ever(inc.table_id)
        if any(f.path in ever for f in w.add):
            return InvalidArgumentError
        for path in w.remove:
            if path not in ever:
                return InvalidArgumentError
            if not ever[path]:
                return DataFileConflictError
    return ts


class TxnMachine(RuleBasedStateMachine):
    APPLY_VERSION = 1  # the rules of the cluster's apply version (metastore.apply_version)

    def __init__(self) -> None:
        super().__init__()
        self.state = MetastoreState()
        self.model = Model()
        self.tm = T0
        self.index = 1
        self.state.apply(
            InitCluster(dd_ms=DD_MS, cs_max_ms=CS_MAX_MS, apply_version=self.APPLY_VERSION),
            tm=self.tm,
            index=1,
        )
        self.tm += MS
        self.index += 1
        self.state.apply(parse_ddl("CREATE NAMESPACE ns"), tm=self.tm, index=self.index)
        for name in NAMES:
            self.create(name, 1)
        self.file_counter = 0
        self.txn_counter = 0
        self.sent: list[CommitTxn] = []  # every commit sent, for retries and id reuse

    def step(self, step_ms: int) -> None:
        self.tm += step_ms * MS
        self.index += 1

    # --- DDL ---

    @rule(name=st.sampled_from(NAMES), step=st.integers(1, 4))
    def create(self, name: TableName, step: int) -> None:
        self.step(step)
        outcome = self.state.apply(
            parse_ddl(f"CREATE TABLE {name} (c INT)"), tm=self.tm, index=self.index
        )
        if self.model.live(name) is not None:
            assert not outcome.ok
            return
        assert outcome.ok, outcome
        inc = Incarnation(
            table_id=self.model.next_table_id, created_tu=self.tm + DD, tus=[self.tm + DD]
        )
        self.model.next_table_id += 1
        self.model.incarnations.setdefault(name, []).append(inc)

    @rule(name=st.sampled_from(NAMES), step=st.integers(1, 4), really=st.integers(0, 2))
    def drop(self, name: TableName, step: int, really: int) -> None:
        if really:  # drops are rarer than the other steps, so tables live long enough to write
            return
        self.step(step)
        outcome = self.state.apply(parse_ddl(f"DROP TABLE {name}"), tm=self.tm, index=self.index)
        inc = self.model.live(name)
        assert outcome.ok == (inc is not None)
        if inc is not None:
            inc.dropped_tu = self.tm + DD

    @rule(name=st.sampled_from(NAMES), step=st.integers(1, 4))
    def alter(self, name: TableName, step: int) -> None:
        self.step(step)
        inc = self.model.live(name)
        column = f"x{len(inc.tus) if inc else 0}"
        outcome = self.state.apply(
            parse_ddl(f"ALTER TABLE {name} ADD COLUMN {column} INT"), tm=self.tm, index=self.index
        )
        assert outcome.ok == (inc is not None)
        if inc is not None:
            inc.tus.append(self.tm + DD)

    @rule(step=st.integers(1, 8))
    def tick(self, step: int) -> None:
        self.step(step)
        self.state.observe_tick(self.tm, self.index).raise_for_error()

    # --- commits ---

    @rule(data=st.data(), step=st.integers(1, 3))
    def commit(self, data: st.DataObject, step: int) -> None:
        self.step(step)
        names = data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True))
        writes = tuple(self._draw_write(data, name) for name in names)
        self.txn_counter += 1
        txn_id = f"q:{self.txn_counter}"
        if self.sent and data.draw(st.integers(0, 9)) == 0:
            txn_id = data.draw(st.sampled_from(self.sent)).txn_id  # reuse with other writes
        upper = max(self.model.last_commit_ts() + 1, self.tm)
        mode = data.draw(st.sampled_from(["plain", "plain", "ts", "not_before"]))
        ts = not_before = None
        if mode == "ts":
            delta = data.draw(st.sampled_from([-MS, -1, 0, 0, 1, 3 * MS, MS, AHEAD, AHEAD + 1]))
            ts = upper + delta
        elif mode == "not_before":
            far = AHEAD + 2 * CS_MAX_MS * MS + 1  # past what version 6 retries
            not_before = max(
                0, upper + data.draw(st.sampled_from([-MS, 0, 2 * MS, AHEAD + 1, far]))
            )
        read_ts = None
        read_tables: tuple[TableName, ...] = ()
        if data.draw(st.integers(0, 2)) == 0:
            stamps = [c.ts for c in self.model.commits[-3:]] or [T0]
            read_ts = max(0, data.draw(st.sampled_from(stamps)) + data.draw(st.integers(-1, 1)))
            read_tables = tuple(
                data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True))
            )
        stream = seq = None
        if data.draw(st.integers(0, 2)) == 0:  # a stream position, sometimes a replayed one
            stream = data.draw(st.sampled_from(["s1", "s2"]))
            seq = data.draw(st.integers(0, 6))
        cmd = CommitTxn(
            txn_id=txn_id,
            writes=writes,
            ts=ts,
            not_before=not_before,
            read_ts=read_ts,
            read_tables=read_tables,
            stream=stream,
            seq=seq,
        )
        self._apply_commit(cmd)

    @rule(data=st.data(), step=st.integers(1, 3))
    def another_commit(self, data: st.DataObject, step: int) -> None:
        """Commits are the point: a second rule makes them twice as likely as other steps."""
        self.commit(data, step)

    @rule(data=st.data(), step=st.integers(1, 3))
    def retry(self, data: st.DataObject, step: int) -> None:
        """Re-send an earlier commit, at another timestamp: committed ones dedup."""
        if not self.sent:
            return
        self.step(step)
        earlier = data.draw(st.sampled_from(self.sent))
        delta = data.draw(st.sampled_from([None, -10 * MS, 0, MS]))
        retry = CommitTxn(
            txn_id=earlier.txn_id,
            writes=earlier.writes,
            ts=None if delta is None else max(0, self.tm + delta),
            read_ts=earlier.read_ts,
            read_tables=earlier.read_tables,
            stream=earlier.stream,
            seq=earlier.seq,
        )
        self._apply_commit(retry)

    def _draw_write(self, data: st.DataObject, name: TableName) -> TableWrite:
        live = self.model.live(name)
        incs = self.model.incarnations.get(name, [])
        known = list(self.model.ever(live.table_id)) if live else []
        adds: list[str] = []
        for _ in range(data.draw(st.integers(0, 2))):
            if known and data.draw(st.integers(0, 15)) == 0:
                adds.append(data.draw(st.sampled_from(known)))  # a reused path: refused
            else:
                self.file_counter += 1
                adds.append(f"_txn/{self.file_counter}/part-0.parquet")
        adds = list(dict.fromkeys(adds))
        overwrite = data.draw(st.integers(0, 4)) == 0
        removes: list[str] = []
        if not overwrite:
            ever = self.model.ever(live.table_id) if live else {}
            live_paths = [p for p, alive in ever.items() if alive and p not in adds]
            if live_paths:
                removes = data.draw(st.lists(st.sampled_from(live_paths), max_size=2, unique=True))
            if data.draw(st.integers(0, 9)) == 0:  # a removed or unknown path: refused
                dead = [p for p, alive in ever.items() if not alive and p not in adds]
                removes.append(data.draw(st.sampled_from([*dead, "never-added"])))
                removes = list(dict.fromkeys(removes))
        versions = len(live.tus) if live else 1
        table_id = 0
        if incs and data.draw(st.integers(0, 3)) == 0:
            table_id = data.draw(st.sampled_from(incs)).table_id  # maybe a dropped incarnation
        active = versions
        if live:
            active = (
                max(i + 1 for i, tu in enumerate(live.tus) if tu <= self.tm)
                if (live.created_tu <= self.tm)
                else 1
            )
        return TableWrite(
            table=name,
            schema_version=data.draw(
                st.sampled_from(
                    [active, active, max(1, active - 1), max(1, active - 2), versions + 1]
                )
            ),
            table_id=table_id,
            add=tuple(DataFile(path=p, size_bytes=len(p), row_count=1) for p in adds),
            remove=tuple(removes),
            overwrite=overwrite,
        )

    def _apply_commit(self, cmd: CommitTxn) -> None:
        expected = predict(self.model, cmd, self.tm, apply_version=self.APPLY_VERSION)
        before = self.state.to_snapshot()
        outcome = self.state.apply(cmd, tm=self.tm, index=self.index)
        self.sent.append(cmd)
        if isinstance(expected, int):
            assert outcome.ok, (outcome, expected)
            assert outcome.result["ts"] == expected
            seen = next((c for c in self.model.commits if c.txn_id == cmd.txn_id), None)
            assert outcome.deduplicated == (seen is not None)
            if seen is None:
                self.model.commits.append(
                    Commit(
                        ts=expected,
                        txn_id=cmd.txn_id,
                        key=key_of(cmd),
                        writes={
                            self._live_id(w.table): (
                                [f.path for f in w.add],
                                list(w.remove),
                                w.overwrite,
                            )
                            for w in cmd.writes
                        },
                        stream=cmd.stream,
                        seq=cmd.seq,
                    )
                )
        else:
            assert isinstance(outcome.exception(), expected), (outcome, expected)
            assert self.state.to_snapshot() == before

    def _live_id(self, name: TableName) -> int:
        inc = self.model.live(name)
        assert inc is not None
        return inc.table_id

    # --- checks ---

    @invariant()
    def files_agree_with_the_reference(self) -> None:
        stamps = {T0, self.tm, self.tm + DD}
        for c in self.model.commits:
            stamps |= {c.ts - 1, c.ts, c.ts + 1}
        for incs in self.model.incarnations.values():
            for inc in incs:
                stamps |= {inc.created_tu - 1, inc.created_tu}
                if inc.dropped_tu is not None:
                    stamps |= {inc.dropped_tu - 1, inc.dropped_tu}
        for name in NAMES:
            for ts in sorted(stamps):
                found = self.model.at(name, ts)
                try:
                    got = [f.path for f in self.state.files_at(name, ts)]
                except (TableNotFoundError, NotFoundAtTimestampError):
                    assert found is None, (name, ts)
                    continue
                assert found is not None, (name, ts)
                assert got == self.model.files_at(found.table_id, ts), (name, ts)

    @invariant()
    def upper_and_invariants_hold(self) -> None:
        last = max(self.model.last_commit_ts(), self.state.last_tm)
        assert self.state.table_upper() == last + 1
        self.state.check_invariants()
        assert MetastoreState.from_snapshot(self.state.to_snapshot()) == self.state
        for stream in ("s1", "s2"):
            mark = self.state.stream_mark(stream)
            assert (None if mark is None else mark.seq) == self.model.stream_mark(stream)


TestTxnModel = TxnMachine.TestCase
TestTxnModel.settings = settings(DETERMINISTIC, max_examples=60, stateful_step_count=50)


class TxnMachineV5(TxnMachine):
    """The same, at apply version 5: drops of read tables conflict too."""

    APPLY_VERSION = 5


TestTxnModelV5 = TxnMachineV5.TestCase
TestTxnModelV5.settings = settings(DETERMINISTIC, max_examples=60, stateful_step_count=50)


class TxnMachineV6(TxnMachine):
    """The same, at apply version 6: a not_before a little past the ahead bound is retryable."""

    APPLY_VERSION = 6


TestTxnModelV6 = TxnMachineV6.TestCase
TestTxnModelV6.settings = settings(DETERMINISTIC, max_examples=60, stateful_step_count=50)
