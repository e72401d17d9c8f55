"""The chaos suite's linearizability checker (tests/chaos/linearizability.py), on histories
made here: hand-written ones for each rule, generated linearizable ones (with overwrites and
removals, and schema histories of DDL and schema reads) that must pass, and mutations of them
(a dropped prefix element, a stale read, a reversed real-time pair, a read from the future, a
removed file still listed, a racing removal of already removed files applied, a schema read
that misses an acknowledged DDL or sees one below its Tu) that must be flagged naming the
operations involved."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chaos.linearizability import (
    CommitOp,
    JobRecord,
    JobSchemaRead,
    LeaseHold,
    ProtectionOp,
    ProtectionRead,
    ReadOp,
    SchemaVersionRead,
    SessionEnd,
    TableVersion,
    VersionedWrite,
    Violation,
    check_history,
    check_lease_versions,
    check_protections,
    check_schema_jobs,
    check_session_expiry,
    check_versioned_writes,
    ddl_activations,
    ddl_commit,
    schema_key,
    schema_read,
)


def _commit(
    name: str, t_sent: float, t_answered: float, ts: int | None, outcome: str = "ok", keys=("a",)
) -> CommitOp:
    return CommitOp(
        name, frozenset(keys), t_sent, t_answered, outcome, ts if outcome == "ok" else None
    )  # type: ignore[arg-type]


def _read(
    name: str,
    t_sent: float,
    t_answered: float,
    observed: set[str],
    *,
    key: str = "a",
    client: str = "r",
    as_of: int | None = None,
    kind: str = "linearizable",
) -> ReadOp:
    return ReadOp(
        name,
        client,
        key,
        t_sent,
        t_answered,
        frozenset(observed),
        kind,
        as_of,  # type: ignore[arg-type]
    )


def _rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


def _only(violations: list[Violation], rule: str) -> Violation:
    found = [v for v in violations if v.rule == rule]
    assert found, f"no {rule} violation in {[str(v) for v in violations]}"
    return found[0]


# ---- hand-written histories, one rule each ----------------------------------------------


def test_a_linearizable_history_passes() -> None:
    commits = [
        _commit("A", 0, 1, 10),
        _commit("B", 2, 3, 20),
        _commit("U", 2.5, 9, None, "unknown"),
    ]
    applied = {"A": 10, "B": 20, "U": 30}
    reads = [
        _read("R1", 1.5, 1.8, {"A"}, as_of=15),
        _read("R2", 3.5, 4, {"A", "B"}),
        _read("R3", 0, 20, {"A", "B", "U"}, kind="as_of", as_of=30),
    ]
    assert check_history(commits, reads, applied) == []


def test_lost_and_refused_commits_are_flagged() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("F", 0, 1, None, "fail"), _commit("M", 0, 1, 5)]
    violations = check_history(commits, [], {"F": 7, "M": 6, "X": 8})
    messages = {v.rule: str(v) for v in violations}
    assert "commit A" in messages["lost"] or any("commit A" in str(v) for v in violations)
    assert any(v.rule == "lost" and "commit M" in str(v) and "ts 6" in str(v) for v in violations)
    assert "commit F" in messages["refused-applied"]
    assert "X" in messages["unknown-commit"]


def test_two_commits_at_one_ts_are_flagged() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 0, 1, 10, keys=("b",))]
    v = _only(check_history(commits, [], {"A": 10, "B": 10}), "duplicate-ts")
    assert set(v.ops) == {"A", "B"}


def test_reversed_real_time_pair_is_flagged() -> None:
    commits = [_commit("A", 0, 1, 20), _commit("B", 2, 3, 10)]
    v = _only(check_history(commits, [], {"A": 20, "B": 10}), "real-time-order")
    assert v.ops == ("A", "B") and "commit A" in v.message and "commit B" in v.message


def test_an_unknown_commit_that_applied_is_held_to_real_time_order() -> None:
    # U was sent after A was acknowledged: wherever it landed, it is after A.
    commits = [_commit("A", 0, 1, 20), _commit("U", 2, 3, None, "unknown")]
    v = _only(check_history(commits, [], {"A": 20, "U": 10}), "real-time-order")
    assert v.ops == ("A", "U")
    # Sent before A was acknowledged, it may come first.
    commits = [_commit("A", 0, 1, 20), _commit("U", 0.5, 3, None, "unknown")]
    assert check_history(commits, [], {"A": 20, "U": 10}) == []


def test_concurrent_commits_may_land_in_either_order() -> None:
    commits = [_commit("A", 0, 2, 20), _commit("B", 1, 3, 10)]
    assert check_history(commits, [], {"A": 20, "B": 10}) == []


def test_gap_is_flagged() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 0, 1, 20)]
    v = _only(check_history(commits, [_read("R", 5, 6, {"B"})], {"A": 10, "B": 20}), "gap")
    assert v.ops == ("R", "B", "A") and "read R" in v.message and "commit A" in v.message


def test_phantom_is_flagged() -> None:
    commits = [
        _commit("A", 0, 1, 10),
        _commit("F", 0, 1, None, "fail"),
        _commit("N", 0, 1, None, "unknown"),
    ]
    for seen in ("F", "N", "Z"):
        v = _only(check_history(commits, [_read("R", 5, 6, {"A", seen})], {"A": 10}), "phantom")
        assert v.ops[:2] == ("R", seen)
    b = _commit("B", 0, 1, 20, keys=("b",))
    v = _only(check_history([b], [_read("R", 5, 6, {"B"})], {"B": 20}), "phantom")
    assert "does not write a" in v.message


def test_as_of_must_be_exact() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 0, 1, 20)]
    applied = {"A": 10, "B": 20}
    missed = _read("R", 5, 6, {"A"}, as_of=25, kind="as_of")
    v = _only(check_history(commits, [missed], applied), "as-of")
    assert v.ops == ("R", "B") and "missed commit B" in v.message
    extra = _read("S", 5, 6, {"A", "B"}, as_of=15, kind="as_of")
    v = _only(check_history(commits, [extra], applied), "as-of")
    assert v.ops == ("S", "B") and "saw commit B" in v.message


def test_stale_read_is_flagged() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 2, 3, 20)]
    v = _only(check_history(commits, [_read("R", 4, 5, {"A"})], {"A": 10, "B": 20}), "stale-read")
    assert v.ops == ("R", "B")
    # Sent while B was in flight, the read may miss it.
    assert check_history(commits, [_read("R", 2.5, 5, {"A"})], {"A": 10, "B": 20}) == []


def test_read_from_the_future_is_flagged() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 6, 7, 20)]
    applied = {"A": 10, "B": 20}
    v = _only(check_history(commits, [_read("R", 4, 5, {"A", "B"})], applied), "future-read")
    assert v.ops == ("R", "B")
    # The read saw only A but says it read at B's position: its answer is not that position's.
    v = _only(check_history(commits, [_read("R", 4, 5, {"A"}, as_of=20)], applied), "as-of")
    assert v.ops == ("R", "B")
    # B on another key: the read's position is in the one commit order, after B was sent.
    other = [_commit("A", 0, 1, 10), _commit("B", 6, 7, 20, keys=("b",))]
    v = _only(check_history(other, [_read("R", 4, 5, {"A"}, as_of=25)], applied), "future-read")
    assert v.ops == ("R", "B")


def test_reads_in_real_time_order_never_go_back() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 0, 3, 20)]
    applied = {"A": 10, "B": 20}
    reads = [
        _read("R1", 1.5, 2, {"A", "B"}, client="x"),
        _read("R2", 2.5, 2.8, {"A"}, client="y"),
    ]
    v = _only(check_history(commits, reads, applied), "read-order")
    assert v.ops == ("R1", "R2", "B")
    # Overlapping reads may see different prefixes.
    reads[1] = dataclasses.replace(reads[1], t_sent=1.9)
    assert check_history(commits, reads, applied) == []


def test_a_clients_reads_are_monotonic() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 0, 3, 20, keys=("a", "b"))]
    applied = {"A": 10, "B": 20}
    reads = [
        _read("R1", 1.5, 2, {"A", "B"}, client="x"),
        _read("R2", 2.5, 2.8, set(), key="b", client="x"),
    ]
    violations = check_history(commits, reads, applied)
    v = _only(violations, "monotonic-read")
    assert v.ops == ("R1", "R2", "B") and "client x" in v.message
    # AS OF reads are at a chosen point: not judged for monotonicity.
    reads[1] = dataclasses.replace(reads[1], kind="as_of", as_of=5)
    assert check_history(commits, reads, applied) == []


def test_concurrent_reads_of_one_client_bind_only_once_answered() -> None:
    # R1 and R2 of client x overlap: R2, sent later but answered first, may see less (its
    # point lies before R1's). R3, sent after R1 was answered, may not.
    commits = [_commit("A", 0, 1, 10), _commit("B", 2, 3, 20), _commit("C", 4, 5, 30)]
    applied = {"A": 10, "B": 20, "C": 30}
    reads = [
        _read("R1", 3.5, 10, {"A", "B", "C"}, client="x"),
        _read("R2", 3.6, 3.9, {"A", "B"}, client="x"),
    ]
    assert check_history(commits, reads, applied) == []
    late = _read("R3", 10.5, 11, {"A", "B", "C"}, client="x", key="a")
    assert check_history(commits, [*reads, late], applied) == []
    stale = dataclasses.replace(late, observed=frozenset({"A", "B"}))
    v = _only(check_history(commits, [*reads, stale], applied), "monotonic-read")
    assert v.ops == ("R1", "R3", "C")


# ---- generated histories ----------------------------------------------------------------


@dataclass
class _History:
    commits: list[CommitOp] = field(default_factory=list)
    reads: list[ReadOp] = field(default_factory=list)
    applied: dict[str, int] = field(default_factory=dict)

    def end(self) -> float:
        times = [c.t_answered for c in self.commits] + [r.t_answered for r in self.reads]
        return max(times, default=0.0) + 10.0

    def top_ts(self) -> int:
        return max(self.applied.values(), default=0)

    def prefix(self, key: str, upto: int | None = None) -> set[str]:
        """The commits live in `key` at `upto` (default: at the end): those applied up to
        it, less the ones a commit up to it removed."""
        by_name = {c.name: c for c in self.commits}
        live: set[str] = set()
        for n, ts in sorted(self.applied.items(), key=lambda kv: kv[1]):
            c = by_name[n]
            if key not in c.keys or (upto is not None and ts > upto):
                continue
            if key in c.overwrites:
                live.clear()
            live -= {m for k, m in c.removes if k == key}
            if c.adds_files:
                live.add(n)
        return live

    def prefix_names(self, key: str) -> list[str]:
        """Every applied commit writing `key`, removed or not, in ts order."""
        keys = {c.name: c.keys for c in self.commits}
        return [n for n in sorted(self.applied, key=self.applied.__getitem__) if key in keys[n]]


KEYS = ("a", "b")


@st.composite
def linearizable_histories(
    draw: st.DrawFn, keys: tuple[str, ...] = KEYS, removals: bool = True
) -> _History:
    """A history of a linearizable store whose commits get increasing ts in linearization
    order: every operation takes effect at a point inside its window (an unknown commit at any
    point after it was sent, or never); a linearizable read returns its key's commits before
    its point and reads at a position between the last commit before it and the next one."""
    n_ops = draw(st.integers(1, 40))
    events: list[tuple[float, int, dict]] = []  # (linearization point, order, op)
    client_free: dict[str, float] = {}
    for i in range(n_ops):
        kind = draw(st.sampled_from(["commit", "commit", "read", "as_of"]))
        t_sent = float(draw(st.integers(0, 400)))
        duration = float(draw(st.integers(1, 60)))
        frac = draw(st.integers(1, 99)) / 100
        tie = i * 1e-6  # distinct points
        if kind == "commit":
            outcome = draw(st.sampled_from(["ok", "ok", "ok", "fail", "unknown"]))
            written = draw(st.sampled_from([(k,) for k in keys] + [keys]))
            op = {"kind": "commit", "name": f"C{i}", "keys": written, "outcome": outcome}
            # Writes that remove files: an overwrite of some of its keys, or removals of
            # commits live in them when it takes effect (drawn then).
            op["overwrites"] = frozenset(
                k for k in written if removals and draw(st.integers(0, 5)) == 0
            )
            op["removals"] = (
                draw(st.integers(0, 2)) if removals and draw(st.integers(0, 3)) == 0 else 0
            )
            # A write with removals may add nothing (a DELETE of whole files).
            op["adds_files"] = not op["removals"] or draw(st.integers(0, 2)) > 0
            op.update(t_sent=t_sent, t_answered=t_sent + duration)
            if outcome == "ok":
                events.append((t_sent + duration * frac + tie, i, op))
            elif outcome == "unknown" and draw(st.booleans()):
                late = draw(st.integers(1, 200)) / 100  # possibly after the client gave up
                events.append((t_sent + duration * late + tie, i, op))
            else:
                events.append((float("inf"), i, op))  # never applied
        elif kind == "read":
            client = draw(st.sampled_from(["r1", "r2", "r3", "rc"]))
            if client != "rc":  # sequential clients; "rc" reads from several threads at once
                t_sent = max(t_sent, client_free.get(client, -1.0) + 1.0)
                client_free[client] = t_sent + duration
            op = {
                "kind": "read",
                "name": f"R{i}",
                "client": client,
                "key": draw(st.sampled_from(keys)),
            }
            op.update(t_sent=t_sent, t_answered=t_sent + duration, with_as_of=draw(st.booleans()))
            op["slack"] = draw(st.integers(0, 9))
            events.append((t_sent + duration * frac + tie, i, op))
        else:
            op = {"kind": "as_of", "name": f"S{i}", "key": draw(st.sampled_from(keys))}
            op.update(t_sent=t_sent, t_answered=t_sent + duration, pick=draw(st.integers(0, 10**6)))
            events.append((float("inf"), i, op))
    h = _History()
    ts = 0
    as_of_reads = []
    for point, _, op in sorted(events, key=lambda e: (e[0], e[1])):
        if op["kind"] == "commit":
            acked = op["outcome"] == "ok"
            removes: set[tuple[str, str]] = set()
            if point != float("inf"):
                ts += 10
                for key in op["keys"] if op["removals"] else ():
                    live = sorted(h.prefix(key))
                    for _ in range(op["removals"] if live else 0):
                        removes.add((key, draw(st.sampled_from(live))))
                h.applied[op["name"]] = ts
            else:
                # Never applied (points at infinity come last): a racing removal may name any
                # commit of the key applied so far, one another write already removed too.
                added = {c.name for c in h.commits if c.adds_files}
                for key in op["keys"] if op["removals"] else ():
                    ever = sorted(n for n in h.prefix_names(key) if n in added)
                    for _ in range(op["removals"] if ever else 0):
                        removes.add((key, draw(st.sampled_from(ever))))
            h.commits.append(
                CommitOp(
                    op["name"],
                    frozenset(op["keys"]),
                    op["t_sent"],
                    op["t_answered"],
                    op["outcome"],
                    ts if acked else None,
                    overwrites=op["overwrites"],
                    removes=frozenset(removes),
                    adds_files=op["adds_files"],
                )
            )
        elif op["kind"] == "read":
            as_of = ts + op["slack"] if op["with_as_of"] else None
            observed = h.prefix(op["key"])
            h.reads.append(
                ReadOp(
                    op["name"],
                    op["client"],
                    op["key"],
                    op["t_sent"],
                    op["t_answered"],
                    frozenset(observed),
                    "linearizable",
                    as_of,
                )
            )
        else:
            as_of_reads.append(op)
    for op in as_of_reads:  # at a chosen ts: any applied ts, or 0
        choices = sorted(h.applied.values()) or [0]
        at = choices[op["pick"] % len(choices)]
        h.reads.append(
            ReadOp(
                op["name"],
                "s",
                op["key"],
                op["t_sent"],
                op["t_answered"],
                frozenset(h.prefix(op["key"], at)),
                "as_of",
                at,
            )
        )
    return h


@settings(max_examples=300, deadline=None)
@given(linearizable_histories())
def test_generated_linearizable_histories_pass(h: _History) -> None:
    violations = check_history(h.commits, h.reads, h.applied)
    assert violations == [], [str(v) for v in violations]


def _add_ok_commit(h: _History, name: str, t_sent: float, t_answered: float, ts: int) -> None:
    h.commits.append(CommitOp(name, frozenset({"a"}), t_sent, t_answered, "ok", ts))
    h.applied[name] = ts


@settings(max_examples=150, deadline=None)
@given(linearizable_histories(), st.data())
def test_a_dropped_prefix_element_is_flagged(h: _History, data: st.DataObject) -> None:
    applied = h.applied

    # Dropped: a commit it listed that is not its newest and that nothing ever removes (one
    # that a write which only removes takes later leaves a state that may be the later one's).
    def droppable(r: ReadOp) -> list[str]:
        newest = max(r.observed, key=lambda n: applied[n])
        return sorted((r.observed - {newest}) & h.prefix(r.key))

    candidates = [r for r in h.reads if len(r.observed) >= 2 and droppable(r)]
    if candidates:
        read = data.draw(st.sampled_from(candidates))
        dropped = data.draw(st.sampled_from(droppable(read)))
        h.reads[h.reads.index(read)] = dataclasses.replace(read, observed=read.observed - {dropped})
    else:
        t, top = h.end(), h.top_ts()
        _add_ok_commit(h, "X1", t, t + 1, top + 10)
        _add_ok_commit(h, "X2", t + 2, t + 3, top + 20)
        read = _read("XR", t + 4, t + 5, h.prefix("a") - {"X1"})
        h.reads.append(read)
        dropped = "X1"
    v = _only(check_history(h.commits, h.reads, h.applied), "gap")
    assert v.ops[0] == read.name and dropped in v.ops
    assert f"read {read.name}" in v.message and f"commit {dropped}" in v.message


@settings(max_examples=150, deadline=None)
@given(linearizable_histories(), st.data())
def test_a_stale_read_is_flagged(h: _History, data: st.DataObject) -> None:
    candidates = [
        (r, c)
        for r in h.reads
        if r.kind == "linearizable"
        for c in h.commits
        if c.outcome == "ok" and r.key in c.keys and c.t_answered < r.t_sent
    ]
    if candidates:
        read, acked = data.draw(st.sampled_from(candidates))
        cut = h.applied[acked.name]
        # The read returns the prefix just before the acknowledged commit (and says so).
        stale = h.prefix(read.key, cut - 1)
        h.reads[h.reads.index(read)] = dataclasses.replace(
            read, observed=frozenset(stale), as_of=cut - 1
        )
    else:
        t, top = h.end(), h.top_ts()
        _add_ok_commit(h, "X", t, t + 1, top + 10)
        read = _read("XR", t + 2, t + 3, h.prefix("a") - {"X"})
        h.reads.append(read)
    v = _only(check_history(h.commits, h.reads, h.applied), "stale-read")
    assert v.ops[0] == read.name and f"read {read.name}" in v.message
    assert f"commit {v.ops[1]}" in v.message and "acknowledged before" in v.message


@settings(max_examples=150, deadline=None)
@given(linearizable_histories(), st.data())
def test_a_reversed_real_time_pair_is_flagged(h: _History, data: st.DataObject) -> None:
    pairs = [
        (a, b)
        for a in h.commits
        for b in h.commits
        if a.outcome == "ok" and b.outcome == "ok" and a.t_answered < b.t_sent
    ]
    if pairs:
        a, b = data.draw(st.sampled_from(pairs))
        ts_a, ts_b = h.applied[a.name], h.applied[b.name]
        h.applied[a.name], h.applied[b.name] = ts_b, ts_a
        h.commits[h.commits.index(a)] = dataclasses.replace(a, ts=ts_b)
        h.commits[h.commits.index(b)] = dataclasses.replace(b, ts=ts_a)
    else:
        t, top = h.end(), h.top_ts()
        _add_ok_commit(h, "XA", t, t + 1, top + 20)
        _add_ok_commit(h, "XB", t + 2, t + 3, top + 10)
        a, b = h.commits[-2], h.commits[-1]
    violations = check_history(h.commits, h.reads, h.applied)
    # The swap makes B precede some commit acknowledged before B was sent: A, or one that was
    # already between them.
    ordered = [v for v in violations if v.rule == "real-time-order"]
    assert ordered, [str(v) for v in violations]
    assert any(b.name in v.ops or a.name in v.ops for v in ordered)
    assert all(
        f"commit {v.ops[0]}" in v.message and f"commit {v.ops[1]}" in v.message for v in ordered
    )


@settings(max_examples=150, deadline=None)
@given(linearizable_histories(), st.booleans())
def test_a_read_from_the_future_is_flagged(h: _History, say_position: bool) -> None:
    t, top = h.end(), h.top_ts()
    # The read is answered before X is sent, yet sees it (or says it read at X's position).
    observed = h.prefix("a") | {"X"}
    read = _read("XR", t, t + 1, observed, as_of=top + 10 if say_position else None)
    h.reads.append(read)
    _add_ok_commit(h, "X", t + 2, t + 3, top + 10)
    v = _only(check_history(h.commits, h.reads, h.applied), "future-read")
    assert v.ops == ("XR", "X") and "read XR" in v.message and "commit X" in v.message


# ---- writes that remove files -------------------------------------------------------------


def _overwrite(name: str, t_sent: float, t_answered: float, ts: int) -> CommitOp:
    return CommitOp(name, frozenset({"a"}), t_sent, t_answered, "ok", ts, frozenset({"a"}))


def test_an_overwrite_leaves_only_its_own_files() -> None:
    commits = [_commit("A", 0, 1, 10), _commit("B", 2, 3, 20), _overwrite("O", 4, 5, 30)]
    commits.append(_commit("C", 6, 7, 40))
    applied = {"A": 10, "B": 20, "O": 30, "C": 40}
    reads = [
        _read("R1", 3.5, 3.8, {"A", "B"}, as_of=25),
        _read("R2", 5.5, 5.8, {"O"}, as_of=35),
        _read("R3", 7.5, 7.8, {"O", "C"}),
        _read("S1", 8, 9, {"A", "B"}, kind="as_of", as_of=29),
        _read("S2", 8, 9, {"O"}, kind="as_of", as_of=30),
    ]
    assert check_history(commits, reads, applied) == []


def test_a_file_still_listed_after_its_overwrite_is_flagged() -> None:
    commits = [_commit("A", 0, 1, 10), _overwrite("O", 2, 3, 20)]
    applied = {"A": 10, "O": 20}
    v = _only(check_history(commits, [_read("R", 4, 5, {"A", "O"})], applied), "removed-listed")
    assert v.ops == ("R", "A", "O")
    assert "read R" in v.message and "commit A" in v.message and "removed by commit O" in v.message
    # AS OF the overwrite's ts: the same.
    as_of = _read("S", 4, 5, {"A", "O"}, kind="as_of", as_of=20)
    assert _only(check_history(commits, [as_of], applied), "removed-listed").ops == ("S", "A", "O")


def test_a_removal_of_some_files_is_modelled() -> None:
    remove_a = CommitOp(
        "D", frozenset({"a"}), 4, 5, "ok", 30, removes=frozenset({("a", "A")})
    )  # a compaction: A's files go, B's stay, D adds its own
    commits = [_commit("A", 0, 1, 10), _commit("B", 2, 3, 20), remove_a]
    applied = {"A": 10, "B": 20, "D": 30}
    assert check_history(commits, [_read("R", 6, 7, {"B", "D"})], applied) == []
    v = _only(
        check_history(commits, [_read("R", 6, 7, {"A", "B", "D"})], applied), "removed-listed"
    )
    assert v.ops == ("R", "A", "D")
    # B is still live at D's position: not listing it is a gap.
    v = _only(check_history(commits, [_read("R", 6, 7, {"D"})], applied), "gap")
    assert v.ops == ("R", "D", "B")


def test_a_read_that_missed_an_overwrite_it_should_see_is_stale() -> None:
    commits = [_commit("A", 0, 1, 10), _overwrite("O", 2, 3, 20)]
    applied = {"A": 10, "O": 20}
    v = _only(check_history(commits, [_read("R", 4, 5, {"A"})], applied), "stale-read")
    assert v.ops == ("R", "O")


def test_a_read_whose_point_passed_a_later_removal_is_from_the_future() -> None:
    # X (sent after R was answered) removed A, and R saw the state after X and C: it did not
    # list X's own files only because C overwrote them, yet its point is past X.
    commits = [
        _commit("A", 0, 1, 10),
        CommitOp("X", frozenset({"a"}), 6, 7, "ok", 20, removes=frozenset({("a", "A")})),
        _overwrite("C", 0, 9, 30),
    ]
    applied = {"A": 10, "X": 20, "C": 30}
    v = _only(check_history(commits, [_read("R", 4, 5, {"C"})], applied), "future-read")
    assert v.ops == ("R", "X")


@settings(max_examples=60, deadline=None)
@given(linearizable_histories(), st.data())
def test_a_removed_file_still_listed_is_flagged(h: _History, data: st.DataObject) -> None:
    by_name = {c.name: c for c in h.commits}
    candidates = []
    for read in h.reads:
        # Removed at or below the newest commit it listed (a removal between that and its
        # as_of, by a write that only removes, would leave the state of an earlier position).
        at = max((h.applied[n] for n in read.observed), default=None)
        if at is None:
            continue
        ever = {
            n
            for n, ts in h.applied.items()
            if ts <= at and read.key in by_name[n].keys and by_name[n].adds_files
        }
        removed = sorted(ever - h.prefix(read.key, at))
        candidates.extend((read, n) for n in removed)
    if candidates:
        read, removed_one = data.draw(st.sampled_from(candidates))
        h.reads[h.reads.index(read)] = dataclasses.replace(
            read, observed=read.observed | {removed_one}
        )
    else:
        t, top = h.end(), h.top_ts()
        _add_ok_commit(h, "X1", t, t + 1, top + 10)
        h.commits.append(
            CommitOp("X2", frozenset({"a"}), t + 2, t + 3, "ok", top + 20, frozenset({"a"}))
        )
        h.applied["X2"] = top + 20
        read = _read("XR", t + 4, t + 5, {"X1", "X2"})
        h.reads.append(read)
        removed_one = "X1"
    v = _only(check_history(h.commits, h.reads, h.applied), "removed-listed")
    assert v.ops[0] == read.name and removed_one in v.ops
    remover = v.ops[v.ops.index(removed_one) + 1]
    assert key_of_removal(by_name_of(h), remover, read.key, removed_one)
    assert f"read {read.name}" in v.message and f"commit {removed_one}" in v.message
    assert f"removed by commit {remover}" in v.message


def _remove(name: str, t_sent: float, t_answered: float, ts: int, *removed: str, adds=True):
    return CommitOp(
        name,
        frozenset({"a"}),
        t_sent,
        t_answered,
        "ok",
        ts,
        removes=frozenset(("a", m) for m in removed),
        adds_files=adds,
    )


def test_a_write_that_only_removes_is_a_position_of_its_own() -> None:
    # R removes A and adds nothing: a read of {B} is the state at R's position (or later).
    commits = [
        _commit("A", 0, 1, 10),
        _commit("B", 2, 3, 20),
        _remove("R", 4, 5, 30, "A", adds=False),
    ]
    applied = {"A": 10, "B": 20, "R": 30}
    reads = [
        _read("R1", 6, 7, {"B"}),
        _read("R2", 6, 7, {"B"}, as_of=30),
        _read("S1", 8, 9, {"A", "B"}, kind="as_of", as_of=29),
        _read("S2", 8, 9, {"B"}, kind="as_of", as_of=30),
    ]
    assert check_history(commits, reads, applied) == []
    # After R was acknowledged, A still listed: removed-listed is not provable by data alone
    # (the read names no later commit), it is a stale read.
    v = _only(check_history(commits, [_read("R3", 6, 7, {"A", "B"})], applied), "stale-read")
    assert v.ops == ("R3", "R")
    # AS OF R's ts but A still there: not the state at 30.
    v = _only(check_history(commits, [_read("S3", 8, 9, {"A", "B"}, as_of=30)], applied), "as-of")
    assert v.ops == ("S3", "R") and "missed commit R" in v.message
    # A read never names a write that adds nothing.
    v = _only(check_history(commits, [_read("R4", 6, 7, {"B", "R"})], applied), "phantom")
    assert "adds no files" in v.message


def test_a_removal_shown_without_its_replacement_is_flagged() -> None:
    # O (an OPTIMIZE) removes A and adds its own files; B lies between them.
    commits = [_commit("A", 0, 1, 10), _commit("B", 2, 3, 20), _remove("O", 4, 5, 30, "A")]
    applied = {"A": 10, "B": 20, "O": 30}
    assert check_history(commits, [_read("R", 6, 7, {"B", "O"})], applied) == []
    v = _only(
        check_history(commits, [_read("R", 6, 7, {"B"}, kind="as_of", as_of=30)], applied), "gap"
    )
    assert v.ops == ("R", "B", "A", "O")
    assert "commit O" in v.message and "without the files that replace them" in v.message


def test_a_removal_seen_before_a_later_remove_only_write_is_judged_at_its_position() -> None:
    # D removes B and adds nothing, C came before it: {A, C} is the state at D only.
    commits = [
        _commit("A", 0, 1, 10),
        _commit("B", 2, 3, 20),
        _commit("C", 4, 5, 30),
        _remove("D", 6, 7, 40, "B", adds=False),
        _commit("E", 20, 21, 50),
    ]
    applied = {"A": 10, "B": 20, "C": 30, "D": 40, "E": 50}
    # Sent after D was acknowledged: its state is D's (position 4), in the window.
    assert check_history(commits, [_read("R", 8, 9, {"A", "C"})], applied) == []
    # Answered before D was sent: D's position is from the future.
    v = _only(check_history(commits, [_read("R", 5.5, 5.9, {"A", "C"})], applied), "future-read")
    assert v.ops == ("R", "D")


@settings(max_examples=100, deadline=None)
@given(linearizable_histories(), st.data())
def test_a_removal_without_its_replacement_is_flagged(h: _History, data: st.DataObject) -> None:
    """Mutation: a read that listed m (not its newest commit) drops m, which a later commit r
    removes while adding files of its own that outlive it: the read shows r's removal without
    r's files, the state at no position."""
    by_name = by_name_of(h)
    order = sorted(h.applied, key=lambda n: h.applied[n])
    candidates = []
    for read in h.reads:
        if not read.observed:
            continue
        newest = max(read.observed, key=lambda n: h.applied[n])
        at = read.as_of if read.as_of is not None else h.applied[newest]
        for r in order:
            c = by_name[r]
            if h.applied[r] <= at or not c.adds_files or r not in h.prefix(read.key):
                continue
            candidates.extend(
                (read, m, r)
                for k, m in sorted(c.removes)
                if k == read.key and m in read.observed and m != newest
            )
    if candidates:
        read, removed_one, remover = data.draw(st.sampled_from(candidates))
    else:
        t, top = h.end(), h.top_ts()
        _add_ok_commit(h, "X1", t, t + 1, top + 10)
        _add_ok_commit(h, "X2", t + 2, t + 3, top + 20)
        h.commits.append(_remove("XO", t + 4, t + 5, top + 30, "X1"))
        h.applied["XO"] = top + 30
        read = _read("XR", t + 2.5, t + 2.8, h.prefix("a", top + 20))
        h.reads.append(read)
        removed_one, remover = "X1", "XO"
    h.reads[h.reads.index(read)] = dataclasses.replace(read, observed=read.observed - {removed_one})
    v = _only(check_history(h.commits, h.reads, h.applied), "gap")
    assert v.ops[0] == read.name and removed_one in v.ops and remover in v.ops
    assert f"read {read.name}" in v.message and f"commit {remover}" in v.message


def by_name_of(h: _History) -> dict[str, CommitOp]:
    return {c.name: c for c in h.commits}


def key_of_removal(by_name: dict[str, CommitOp], remover: str, key: str, removed: str) -> bool:
    """Whether `remover` removes `removed` from `key` (by overwrite or by name)."""
    c = by_name[remover]
    return key in c.overwrites or (key, removed) in c.removes


def test_racing_removals_with_one_applied_pass() -> None:
    # O1 and O2 both picked A while it was live; O1 won. O2 refused (DATA_FILE_CONFLICT or
    # READ_CONFLICT) or unknown and never applied: nothing of it happened.
    commits = [
        _commit("A", 0, 1, 10),
        _commit("B", 2, 3, 20),
        _remove("O1", 4, 5, 30, "A"),
        dataclasses.replace(_remove("O2", 4, 6, 0, "A", "B"), outcome="fail", ts=None),
        dataclasses.replace(_remove("O3", 4, 7, 0, "A", adds=False), outcome="unknown", ts=None),
    ]
    applied = {"A": 10, "B": 20, "O1": 30}
    reads = [_read("R", 8, 9, {"B", "O1"}), _read("S", 8, 9, {"A", "B"}, kind="as_of", as_of=20)]
    assert check_history(commits, reads, applied) == []


def test_an_applied_removal_of_an_already_removed_file_is_flagged() -> None:
    commits = [
        _commit("A", 0, 1, 10),
        _commit("B", 2, 3, 20),
        _remove("O1", 4, 5, 30, "A"),
        _remove("O2", 4, 6, 40, "A", "B", adds=False),
    ]
    applied = {"A": 10, "B": 20, "O1": 30, "O2": 40}
    v = _only(check_history(commits, [], applied), "double-removal")
    assert v.ops == ("O2", "A", "O1")
    assert "commit O2 (ok, ts 40" in v.message and "commit O1 (ok, ts 30" in v.message
    # Unknown outcome is either: refused is fine (above), applied is held to the rule.
    unknown = [*commits[:3], dataclasses.replace(commits[3], outcome="unknown", ts=None)]
    assert _only(check_history(unknown, [], applied), "double-removal").ops == ("O2", "A", "O1")
    # The one applied later is the one flagged, whichever was sent first.
    swapped = {"A": 10, "B": 20, "O1": 50, "O2": 40}
    commits[2] = dataclasses.replace(commits[2], ts=50)
    assert _only(check_history(commits, [], swapped), "double-removal").ops == ("O1", "A", "O2")
    # An overwrite removes everything before it: a later removal by name of those is dead too.
    over = [_commit("A", 0, 1, 10), _overwrite("W", 2, 3, 20), _remove("O", 4, 5, 30, "A")]
    v = _only(check_history(over, [], {"A": 10, "W": 20, "O": 30}), "double-removal")
    assert v.ops == ("O", "A", "W")
    # A commit of two keys removed from each by another write: one violation per key.
    two = [
        _commit("C", 0, 1, 10, keys=("a", "b")),
        _overwrite("Wa", 2, 3, 20),
        dataclasses.replace(
            _overwrite("Wb", 4, 5, 30), keys=frozenset({"b"}), overwrites=frozenset({"b"})
        ),
        CommitOp(
            "X", frozenset({"a", "b"}), 6, 7, "ok", 40, removes=frozenset({("a", "C"), ("b", "C")})
        ),
    ]
    violations = check_history(two, [], {"C": 10, "Wa": 20, "Wb": 30, "X": 40})
    found = [(v.ops, v.message.split(" from ")[1][:2]) for v in violations]
    assert found == [(("X", "C", "Wa"), "a,"), (("X", "C", "Wb"), "b,")], found


def test_an_applied_removal_of_a_file_not_in_the_table_is_flagged() -> None:
    commits = [_remove("O", 0, 1, 10, "A", "Z"), _commit("A", 2, 3, 20)]
    violations = check_history(commits, [], {"O": 10, "A": 20})
    found = sorted(v.ops for v in violations if v.rule == "removed-missing")
    assert found == [("O", "A"), ("O", "Z")], [str(v) for v in violations]
    assert any("Z, which nobody sent" in v.message for v in violations)


@settings(max_examples=100, deadline=None)
@given(linearizable_histories(), st.data())
def test_a_racing_removal_that_applied_is_flagged(h: _History, data: st.DataObject) -> None:
    """Mutation: a removal of a commit's files that another applied write had already
    removed is applied after all (a refused or never-applied racing removal turned
    acknowledged or unknown-and-applied, or a new acknowledged one at the end): flagged
    naming it, the removed commit and the first remover."""
    by_name = by_name_of(h)
    first: dict[tuple[str, str], str] = {}  # (key, removed) -> the applied write removing it
    for n in sorted(h.applied, key=h.applied.__getitem__):
        c = by_name[n]
        for key in c.keys:
            before = h.prefix(key, h.applied[n] - 1)
            gone = before if key in c.overwrites else {m for k, m in c.removes if k == key}
            for m in gone & before:
                first.setdefault((key, m), n)
    top = h.top_ts()
    racers = [
        (c, key, m)
        for c in h.commits
        if c.name not in h.applied
        for key, m in sorted(c.removes)
        if (key, m) in first
    ]
    if racers:
        c, key, m = data.draw(st.sampled_from(racers))
        outcome = data.draw(st.sampled_from(["ok", "unknown"]))
        mutated = dataclasses.replace(c, outcome=outcome, ts=top + 10 if outcome == "ok" else None)
        h.commits[h.commits.index(c)] = mutated
        name = c.name
    elif first:
        key, m = data.draw(st.sampled_from(sorted(first)))
        t = h.end()
        name = "XO"
        removes = frozenset({(key, m)})
        raced = CommitOp(name, frozenset({key}), t, t + 1, "ok", top + 10, removes=removes)
        h.commits.append(raced)
    else:
        t = h.end()
        _add_ok_commit(h, "X1", t, t + 1, top + 10)
        h.commits.append(_remove("X2", t + 2, t + 3, top + 20, "X1"))
        h.commits.append(_remove("XO", t + 2, t + 4, top + 30, "X1", adds=False))
        h.applied["X2"] = top + 20
        key, m, name = "a", "X1", "XO"
        first[(key, m)] = "X2"
        top += 20
    h.applied[name] = top + 10
    violations = check_history(h.commits, h.reads, h.applied)
    flagged = [v for v in violations if v.rule == "double-removal" and v.ops[:2] == (name, m)]
    # One per key the removal names m on (a commit of two keys may remove m from both).
    ours = [v for v in flagged if v.ops[2] == first[(key, m)] and f"from {key}," in v.message]
    assert ours, [str(v) for v in violations]
    assert f"commit {name} (" in ours[0].message


# ---- schemas: DDL at its activation time Tu, schema reads at a ts --------------------------

T = "ch.ddl"


def _ddl(column: str, t_sent: float, t_answered: float, tu: int | None, outcome: str = "ok"):
    return ddl_commit(column, T, t_sent, t_answered, outcome, tu if outcome == "ok" else None)  # type: ignore[arg-type]


def _schema(name: str, t_sent: float, t_answered: float, columns: set[str], ts: int, *, now: bool):
    return schema_read(name, "s", T, t_sent, t_answered, columns, ts, now=now, node=1)


def test_ddl_activations_come_from_the_history() -> None:
    versions = [(100, ["id"]), (200, ["id", "c1"]), (300, ["id", "c1", "c2"])]
    assert ddl_activations(versions) == {"c1": 200, "c2": 300}


def test_a_schema_history_that_follows_the_activations_passes() -> None:
    ddls = [_ddl("c1", 0, 1, 100), _ddl("c2", 2, 3, 200), _ddl("c3", 4, 9, None, "unknown")]
    applied = {"c1": 100, "c2": 200, "c3": 300}
    reads = [
        _schema("N1", 1.5, 1.6, {"c1"}, 150, now=True),
        _schema("A1", 5, 6, {"c1"}, 199, now=False),  # just below c2's Tu
        _schema("A2", 5, 6, {"c1", "c2"}, 200, now=False),  # at it
        _schema("A3", 10, 11, {"c1", "c2", "c3"}, 300, now=False),
    ]
    assert check_history(ddls, reads, applied) == []


def test_a_schema_read_that_misses_an_acknowledged_ddl_is_flagged() -> None:
    ddls = [_ddl("c1", 0, 1, 100), _ddl("c2", 2, 3, 200)]
    applied = {"c1": 100, "c2": 200}
    # AS OF c2's Tu, on any node, whenever asked: c2 must be there.
    v = _only(check_history(ddls, [_schema("A", 1, 2, {"c1"}, 200, now=False)], applied), "as-of")
    assert v.ops == ("A", "c2") and "DDL c2" in v.message and schema_key(T) in v.message
    # At now, asked after c2 was acknowledged: stale, whatever ts the node says it read at.
    stale = _schema("N", 4, 5, {"c1"}, 150, now=True)
    v = _only(check_history(ddls, [stale], applied), "stale-read")
    assert v.ops == ("N", "c2") and "DDL c2" in v.message


def test_a_schema_read_below_a_tu_that_sees_the_ddl_is_flagged() -> None:
    ddls = [_ddl("c1", 0, 1, 100), _ddl("c2", 2, 3, 200)]
    applied = {"c1": 100, "c2": 200}
    v = _only(
        check_history(ddls, [_schema("A", 4, 5, {"c1", "c2"}, 199, now=False)], applied), "as-of"
    )
    assert v.ops == ("A", "c2") and "saw DDL c2" in v.message


def test_a_lost_or_moved_ddl_is_flagged() -> None:
    ddls = [_ddl("c1", 0, 1, 100), _ddl("c2", 2, 3, 200), _ddl("c3", 4, 5, None, "fail")]
    violations = check_history(ddls, [], {"c1": 100, "c2": 250, "c3": 300})
    assert any(v.rule == "lost" and v.ops == ("c2",) and "DDL c2" in str(v) for v in violations)
    assert any(v.rule == "refused-applied" and v.ops == ("c3",) for v in violations)


def _as_schema_history(h: _History) -> _History:
    """A generated history of one key as a schema history: its commits as DDL (add-only),
    its reads as schema reads at the position each names (a current read without one reads
    at its newest DDL's Tu: a node's now is at least that)."""
    out = _History(applied=dict(h.applied))
    out.commits = [
        ddl_commit(c.name, T, c.t_sent, c.t_answered, c.outcome, c.ts) for c in h.commits
    ]
    for r in h.reads:
        ts = r.as_of
        if ts is None:
            ts = max((h.applied[n] for n in r.observed), default=0)
        out.reads.append(
            schema_read(
                r.name,
                r.client,
                T,
                r.t_sent,
                r.t_answered,
                r.observed,
                ts,
                now=r.kind == "linearizable",
            )
        )
    return out


def schema_histories() -> st.SearchStrategy[_History]:
    """Generated schema histories: one table whose DDL only adds columns."""
    return linearizable_histories(keys=("a",), removals=False).map(_as_schema_history)


@settings(max_examples=100, deadline=None)
@given(schema_histories())
def test_generated_schema_histories_pass(h: _History) -> None:
    violations = check_history(h.commits, h.reads, h.applied)
    assert violations == [], [str(v) for v in violations]


@settings(max_examples=60, deadline=None)
@given(schema_histories(), st.data())
def test_a_schema_read_missing_an_acknowledged_ddl_is_flagged(
    h: _History, data: st.DataObject
) -> None:
    by_name = {c.name: c for c in h.commits}
    candidates = [
        (r, n)
        for r in h.reads
        for n in r.observed
        if by_name[n].outcome == "ok" and r.as_of is not None and h.applied[n] <= r.as_of
    ]
    if candidates:
        read, missed = data.draw(st.sampled_from(candidates))
        h.reads[h.reads.index(read)] = dataclasses.replace(read, observed=read.observed - {missed})
    else:
        t, top = h.end(), h.top_ts()
        h.commits.append(ddl_commit("X", T, t, t + 1, "ok", top + 10))
        h.applied["X"] = top + 10
        read = schema_read(
            "XR", "s", T, t + 2, t + 3, h.prefix(schema_key(T)) - {"X"}, top + 10, now=False
        )
        h.reads.append(read)
        missed = "X"
    violations = check_history(h.commits, h.reads, h.applied)
    flagged = [v for v in violations if read.name in v.ops and missed in v.ops]
    assert flagged, [str(v) for v in violations]
    assert all(v.rule in {"gap", "as-of", "stale-read"} for v in flagged)
    assert any(f"DDL {missed}" in v.message and f"read {read.name}" in v.message for v in flagged)


@settings(max_examples=60, deadline=None)
@given(schema_histories(), st.data())
def test_a_schema_read_seeing_a_ddl_below_its_tu_is_flagged(
    h: _History, data: st.DataObject
) -> None:
    def next_after(ts: int) -> str | None:
        later = sorted((t, n) for n, t in h.applied.items() if t > ts)
        return later[0][1] if later else None

    candidates = [
        (r, nxt)
        for r in h.reads
        if r.kind == "as_of" and r.as_of is not None and (nxt := next_after(r.as_of)) is not None
    ]
    if candidates:
        read, seen = data.draw(st.sampled_from(candidates))
        # The read at a ts below the next DDL's Tu answered with that DDL's version.
        h.reads[h.reads.index(read)] = dataclasses.replace(read, observed=read.observed | {seen})
    else:
        t, top = h.end(), h.top_ts()
        h.commits.append(ddl_commit("X", T, t, t + 1, "ok", top + 10))
        h.applied["X"] = top + 10
        read = schema_read("XR", "s", T, t + 2, t + 3, h.prefix(schema_key(T)), top + 9, now=False)
        h.reads.append(read)
        seen = "X"
    v = _only(check_history(h.commits, h.reads, h.applied), "as-of")
    assert v.ops[0] == read.name and seen in v.ops and f"saw DDL {seen}" in v.message


# ---- protected timestamps ------------------------------------------------------------------


def _pts(rid, t_sent, t_answered, outcome="ok", release=None) -> ProtectionOp:
    rs, ra, ro = release if release is not None else (None, None, None)
    return ProtectionOp(rid, t_sent, t_answered, outcome, rs, ra, ro)


def _list(name, t_sent, t_answered, listed) -> ProtectionRead:
    return ProtectionRead(name, 1, t_sent, t_answered, frozenset(listed))


def test_protections_listed_while_held_pass() -> None:
    p = [_pts("P", 0, 1, release=(5, 6, "ok")), _pts("U", 0, 9, "unknown")]
    reads = [
        _list("L0", 0.5, 0.8, set()),  # concurrent with the protect: either way
        _list("L1", 2, 3, {"P"}),
        _list("L2", 4, 5.5, set()),  # concurrent with the release
        _list("L3", 7, 8, {"U"}),
    ]
    assert check_protections(p, reads) == []


def test_a_list_missing_a_held_protection_is_flagged() -> None:
    v = check_protections([_pts("P", 0, 1, release=(5, 6, "ok"))], [_list("L", 2, 3, set())])
    assert [x.rule for x in v] == ["protection-missing"] and v[0].ops == ("L", "P")
    assert "protection list L" in v[0].message and "protection P" in v[0].message


def test_a_released_or_refused_protection_listed_is_flagged() -> None:
    p = [_pts("P", 0, 1, release=(2, 3, "ok")), _pts("F", 0, 1, "fail")]
    v = check_protections(p, [_list("L", 4, 5, {"P", "F", "Z"})])
    assert {(x.rule, x.ops) for x in v} == {
        ("released-listed", ("L", "P")),
        ("phantom-protection", ("L", "F")),
        ("phantom-protection", ("L", "Z")),
    }


@dataclass
class _PtsHistory:
    protections: list[ProtectionOp] = field(default_factory=list)
    reads: list[ProtectionRead] = field(default_factory=list)


@st.composite
def protection_histories(draw: st.DrawFn) -> _PtsHistory:
    """Protections that exist from a point inside the protect's window (an unknown one:
    any point after it was sent, or never) to a point inside the release's, and lists that
    name those existing at a point inside their own window."""
    h = _PtsHistory()
    spans: dict[str, tuple[float, float]] = {}
    for i in range(draw(st.integers(0, 8))):
        rid = f"P{i}"
        t0 = float(draw(st.integers(0, 300)))
        t1 = t0 + draw(st.integers(1, 40))
        outcome = draw(st.sampled_from(["ok", "ok", "ok", "fail", "unknown"]))
        begin = float("inf")
        if outcome == "ok":
            begin = t0 + (t1 - t0) * draw(st.integers(1, 99)) / 100
        elif outcome == "unknown" and draw(st.booleans()):
            begin = t0 + draw(st.integers(1, 200))
        release = None
        end = float("inf")
        if outcome == "ok" and draw(st.booleans()):
            rs = t1 + draw(st.integers(0, 50))
            ra = rs + draw(st.integers(1, 40))
            ro = draw(st.sampled_from(["ok", "ok", "unknown"]))
            end = rs + (ra - rs) * draw(st.integers(1, 99)) / 100 if ro == "ok" else float("inf")
            if ro == "unknown" and draw(st.booleans()):
                end = rs + draw(st.integers(1, 200))
            release = (rs, ra, ro)
        h.protections.append(_pts(rid, t0, t1, outcome, release))
        spans[rid] = (begin, end)
    for j in range(draw(st.integers(1, 15))):
        t0 = float(draw(st.integers(0, 400)))
        t1 = t0 + draw(st.integers(1, 40))
        point = t0 + (t1 - t0) * draw(st.integers(1, 99)) / 100
        listed = {rid for rid, (b, e) in spans.items() if b < point < e}
        h.reads.append(_list(f"L{j}", t0, t1, listed))
    return h


@settings(max_examples=100, deadline=None)
@given(protection_histories())
def test_generated_protection_histories_pass(h: _PtsHistory) -> None:
    violations = check_protections(h.protections, h.reads)
    assert violations == [], [str(v) for v in violations]


@settings(max_examples=60, deadline=None)
@given(protection_histories(), st.data())
def test_a_held_protection_left_out_of_a_list_is_flagged(
    h: _PtsHistory, data: st.DataObject
) -> None:
    must = [
        (r, p)
        for r in h.reads
        for p in h.protections
        if p.outcome == "ok"
        and p.t_answered < r.t_sent
        and (p.t_release_sent is None or p.t_release_sent > r.t_answered)
    ]
    if must:
        read, p = data.draw(st.sampled_from(must))
        h.reads[h.reads.index(read)] = dataclasses.replace(read, listed=read.listed - {p.record_id})
    else:
        p = _pts("PX", 1000, 1001)
        held = {
            q.record_id for q in h.protections if q.outcome == "ok" and q.t_release_sent is None
        }
        read = _list("LX", 1002, 1003, held)
        h.protections.append(p)
        h.reads.append(read)
    v = [x for x in check_protections(h.protections, h.reads) if x.rule == "protection-missing"]
    assert [x.ops for x in v] == [(read.name, p.record_id)]
    assert f"protection list {read.name}" in v[0].message
    assert f"protection {p.record_id}" in v[0].message


@settings(max_examples=60, deadline=None)
@given(protection_histories(), st.data())
def test_a_released_protection_still_listed_is_flagged(h: _PtsHistory, data: st.DataObject) -> None:
    gone = [
        (r, p)
        for r in h.reads
        for p in h.protections
        if p.release_outcome == "ok"
        and p.t_release_answered is not None
        and p.t_release_answered < r.t_sent
    ]
    if gone:
        read, p = data.draw(st.sampled_from(gone))
        h.reads[h.reads.index(read)] = dataclasses.replace(read, listed=read.listed | {p.record_id})
    else:
        p = _pts("PX", 1000, 1001, release=(1002, 1003, "ok"))
        read = _list("LX", 1004, 1005, {"PX"})
        h.protections.append(p)
        h.reads.append(read)
    v = [x for x in check_protections(h.protections, h.reads) if x.rule == "released-listed"]
    assert [x.ops for x in v] == [(read.name, p.record_id)]


# ---- leases: the two-version invariant seen by schema reads, by real time ------------------

TTL_S = 20.0


def test_reads_within_one_version_of_a_held_lease_pass() -> None:
    hold = LeaseHold("L", 3, ((0, 1), (5, 6)), t_release_sent=12)
    reads = [
        SchemaVersionRead("R1", 1, 2, 3, 4),  # v + 1: allowed
        SchemaVersionRead("R2", 2, 0.5, 3, 5),  # sent before the lease was acknowledged
        SchemaVersionRead("R3", 3, 11, 13, 5),  # answered after the release was sent
        SchemaVersionRead("R4", 1, 13, 14, 9),
    ]
    assert check_lease_versions([hold], reads, TTL_S) == []


def test_a_read_two_versions_past_a_held_lease_is_flagged() -> None:
    hold = LeaseHold("L", 3, ((0, 1), (5, 6)), t_release_sent=12)
    v = _only(
        check_lease_versions([hold], [SchemaVersionRead("R", 2, 7, 8, 5)], TTL_S),
        "lease-two-versions",
    )
    assert v.ops == ("R", "L") and "node 2" in v.message and "version 3" in v.message


def test_a_lease_past_its_ttl_binds_nothing() -> None:
    # Never renewed after its acquisition (sent at 0): surely held until 0 + TTL only.
    hold = LeaseHold("L", 3, ((0, 1),))
    assert check_lease_versions([hold], [SchemaVersionRead("R", 1, 21, 22, 7)], TTL_S) == []
    assert check_lease_versions([hold], [SchemaVersionRead("R", 1, 18, 19, 7)], TTL_S)


@dataclass
class _LeaseHistory:
    holds: list[LeaseHold] = field(default_factory=list)
    reads: list[SchemaVersionRead] = field(default_factory=list)


@st.composite
def lease_histories(draw: st.DrawFn) -> _LeaseHistory:
    """A catalog over real time: DDL publish the next version unless an unexpired lease on a
    version two below it lives at that point (the gate); a lease is acquired at a point inside
    its window on the latest version or the one before it, renewed by heartbeats (each applied
    inside its window, none after it expired), and released (applied inside the release's
    window) or left to expire; a read shows the version in force at its point."""
    events: list[tuple[float, int, str, dict]] = [
        (float(draw(st.integers(0, 300))) + i * 1e-6, i, "ddl", {})
        for i in range(draw(st.integers(0, 12)))
    ]
    spans: list[dict] = []
    for i in range(draw(st.integers(1, 5))):
        sent = float(draw(st.integers(0, 250)))
        point = sent + draw(st.integers(0, 5))
        renewals = [(sent, point, point + draw(st.integers(0, 5)))]
        expires = point + TTL_S
        t = renewals[-1][2]
        for _ in range(draw(st.integers(0, 4))):
            hb_sent = t + draw(st.integers(1, 15))
            hb_point = hb_sent + draw(st.integers(0, 5))
            if hb_point >= expires:
                break  # expired: the heartbeat fails (SESSION_NOT_FOUND), not recorded
            renewals.append((hb_sent, hb_point, hb_point + draw(st.integers(0, 5))))
            expires = hb_point + TTL_S
            t = renewals[-1][2]
        release = draw(st.one_of(st.none(), st.integers(1, 30)))
        released_sent = None if release is None else t + release
        ends = expires
        if released_sent is not None:
            ends = min(ends, released_sent + draw(st.integers(0, 5)))
        span = {
            "name": f"L{i}",
            "point": point + 1e-4 + i * 1e-6,
            "renewals": tuple((s, a) for s, _p, a in renewals),
            "ends": ends,
            "release_sent": released_sent,
            "older": draw(st.booleans()),
        }
        spans.append(span)
        events.append((span["point"], 100 + i, "acquire", span))
    for i in range(draw(st.integers(1, 25))):
        sent = float(draw(st.integers(0, 320)))
        answered = sent + draw(st.integers(0, 10))
        point = sent + (answered - sent) * draw(st.integers(0, 100)) / 100 + 2e-4 + i * 1e-6
        events.append(
            (point, 200 + i, "read", {"name": f"R{i}", "sent": sent, "answered": answered})
        )
    h = _LeaseHistory()
    version = 1
    for point, _, kind, ev in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == "ddl":
            live = [s for s in spans if "version" in s and s["point"] <= point < s["ends"]]
            if all(s["version"] >= version for s in live):  # no lease on version - 1 or below
                version += 1
        elif kind == "acquire":
            ev["version"] = version - 1 if ev["older"] and version > 1 else version
            h.holds.append(LeaseHold(ev["name"], ev["version"], ev["renewals"], ev["release_sent"]))
        else:
            h.reads.append(
                SchemaVersionRead(ev["name"], 1, ev["sent"], min(ev["answered"], 1e9), version)
            )
    return h


@settings(max_examples=200, deadline=None)
@given(lease_histories())
def test_generated_lease_histories_pass(h: _LeaseHistory) -> None:
    violations = check_lease_versions(h.holds, h.reads, TTL_S)
    assert violations == [], [str(v) for v in violations]


@settings(max_examples=100, deadline=None)
@given(lease_histories(), st.data())
def test_a_read_past_the_gate_is_flagged(h: _LeaseHistory, data: st.DataObject) -> None:
    """Mutation: a read inside a window where a lease on v was surely held shows v + 2 (a DDL
    got past the gate); it is flagged, naming the read and a lease it overtook."""
    inside = [
        (read, hold)
        for read in h.reads
        for hold in h.holds
        for start, end in hold.windows(TTL_S)
        if start <= read.t_sent and read.t_answered <= end
    ]
    if inside:
        read, hold = data.draw(st.sampled_from(inside))
    else:
        hold = LeaseHold("LX", 1, ((1000, 1001),), 1015)
        read = SchemaVersionRead("RX", 1, 1002, 1003, 1)
        h.holds.append(hold)
        h.reads.append(read)
    h.reads[h.reads.index(read)] = dataclasses.replace(read, version=hold.version + 2)
    v = _only(check_lease_versions(h.holds, h.reads, TTL_S), "lease-two-versions")
    assert v.ops[0] == read.name and f"schema read {read.name}" in v.message
    overtaken = {x.name: x for x in h.holds}[v.ops[1]]
    assert overtaken.version + 1 < hold.version + 2  # the read's version now


# ---- schema change jobs and session expiry ------------------------------------------------

ADD_STEPS = ("delete_only", "write_only", "backfill", "public")
DROP_STEPS = ("write_only", "dropped")


def _job_history() -> tuple[list[TableVersion], list[JobRecord]]:
    """v1 (id); job 1 adds j1 (v2-v5, public at v5); job 2 drops j1 and is cancelled at
    write-only (v6, rollback v7: j1 back); job 3 drops j1 (v8 write-only, v9 dropped)."""
    versions = [
        TableVersion(1, 10, ("id",)),
        TableVersion(2, 20, ("id",), {"j1": "delete_only"}),
        TableVersion(3, 30, ("id",), {"j1": "write_only"}),
        TableVersion(4, 40, ("id",), {"j1": "write_only"}),
        TableVersion(5, 50, ("id", "j1")),
        TableVersion(6, 60, ("id",), {"j1": "write_only"}),
        TableVersion(7, 70, ("id", "j1")),
        TableVersion(8, 80, ("id",), {"j1": "write_only"}),
        TableVersion(9, 90, ("id",)),
    ]
    jobs = [
        JobRecord(1, "add_column", "j1", "succeeded", ADD_STEPS, (2, 3, 4, 5), 1),
        JobRecord(2, "drop_column", "j1", "cancelled", DROP_STEPS, (6, 7), 5),
        JobRecord(3, "drop_column", "j1", "succeeded", DROP_STEPS, (8, 9), 7),
    ]
    return versions, jobs


def _jread(
    name: str, ts: int, version: int, columns: tuple[str, ...], **kw: object
) -> JobSchemaRead:
    return JobSchemaRead(name, 1, float(ts), float(ts) + 0.5, ts, version, columns, **kw)  # type: ignore[arg-type]


def test_schema_jobs_that_follow_their_steps_pass() -> None:
    versions, jobs = _job_history()
    reads = [
        _jread("R1", 45, 4, ("id",)),
        _jread("R2", 50, 5, ("id", "j1")),
        _jread("R3", 65, 6, ("id",)),
        _jread("R4", 75, 7, ("id", "j1"), now=True),
        _jread("R5", 95, 9, ("id",), now=True),
    ]
    finished = {1: 55.0, 2: 72.0, 3: 94.0}
    acked = {1: "succeeded", 2: "cancelled", 3: "succeeded"}
    assert check_schema_jobs(versions, jobs, reads, finished, acked) == []


def test_a_hidden_column_shown_to_readers_is_flagged() -> None:
    versions, jobs = _job_history()
    # The ADD's write-only step published j1 to readers: an intermediate state made visible.
    versions[2] = TableVersion(3, 30, ("id", "j1"), {"j1": "write_only"})
    v = _only(check_schema_jobs(versions, jobs, [], {}, {}), "job-intermediate-visible")
    assert v.ops == ("job1", "v3") and "step write_only" in v.message
    # A DROP whose write-only step still shows the column.
    versions, jobs = _job_history()
    versions[7] = TableVersion(8, 80, ("id", "j1"), {"j1": "write_only"})
    v = _only(check_schema_jobs(versions, jobs, [], {}, {}), "job-intermediate-visible")
    assert v.ops == ("job3", "v8")


def test_a_cancel_that_does_not_restore_the_shape_is_flagged() -> None:
    versions, jobs = _job_history()
    versions[6] = TableVersion(7, 70, ("id",))  # the rollback left j1 dropped
    violations = check_schema_jobs(versions, jobs, [], {}, {2: "cancelled"})
    _only(violations, "job-intermediate-visible")
    v = _only(violations, "job-cancel-changed")
    assert v.ops == ("job2",)


def test_an_acknowledged_end_that_changed_is_flagged() -> None:
    versions, jobs = _job_history()
    v = _only(check_schema_jobs(versions, jobs, [], {}, {2: "succeeded"}), "job-status")
    assert "acknowledged succeeded and ends cancelled" in v.message


def test_a_pending_column_in_the_wrong_state_is_flagged() -> None:
    versions, jobs = _job_history()
    versions[1] = TableVersion(2, 20, ("id",), {"j1": "write_only"})  # delete_only expected
    _only(check_schema_jobs(versions, jobs, [], {}, {}), "job-pending")


def test_a_version_no_job_published_is_flagged() -> None:
    versions, jobs = _job_history()
    versions.append(TableVersion(10, 100, ("id", "x")))
    _only(check_schema_jobs(versions, jobs, [], {}, {}), "job-unowned-version")


def test_job_reads_must_show_the_version_in_force_and_its_columns() -> None:
    versions, jobs = _job_history()
    # One tick before v5's Tu a node showed v5 (the public step ahead of its activation).
    v = _only(
        check_schema_jobs(versions, jobs, [_jread("R", 49, 5, ("id", "j1"))], {}, {}), "job-read"
    )
    assert v.ops == ("R",) and "version 4" in v.message
    # The right version, with the write-only column listed as public.
    _only(check_schema_jobs(versions, jobs, [_jread("R", 35, 3, ("id", "j1"))], {}, {}), "job-read")


def test_a_read_at_now_after_a_job_was_seen_finished_must_show_its_last_version() -> None:
    versions, jobs = _job_history()
    read = JobSchemaRead("R", 2, 95.0, 95.5, 85, 8, ("id",), now=True)
    v = _only(check_schema_jobs(versions, jobs, [read], {3: 94.0}, {}), "job-stale-read")
    assert v.ops == ("R", "job3")
    # Sent before the job was seen finished: not bound.
    early = dataclasses.replace(read, t_sent=93.0)
    assert check_schema_jobs(versions, jobs, [early], {3: 94.0}, {}) == []


def test_an_ended_session_holds_and_blocks_nothing() -> None:
    ends = [
        SessionEnd("s1", "ttl", 10.0),
        SessionEnd("s2", "admin", 20.0),
        SessionEnd("s3", "ttl", None),
    ]
    heartbeats = [
        ("s1", "heartbeat", 11.0, 11.2, "SESSION_NOT_FOUND"),
        ("s1", "session_open", 11.3, 11.4, "INVALID_ARGUMENT"),
        ("s2", "heartbeat", 19.0, 19.1, "ok"),
    ]
    lists = [("s1", 1, 11.0, 11.1, ((3, True),)), ("s2", 2, 21.0, 21.1, ())]
    blockers = [("j1", 10.1, 10.2, frozenset({"s1"})), ("j2", 30.0, 30.1, frozenset({"s3"}))]
    assert check_session_expiry(ends, heartbeats, lists, blockers, 0.3) == []
    v = _only(
        check_session_expiry(ends, [("s2", "pin", 21.0, 21.1, "ok")], [], [], 0.3),
        "expiry-resurrected",
    )
    assert v.ops == ("s2", "pin")
    v = _only(
        check_session_expiry(ends, [], [("s1", 3, 12.0, 12.1, ((3, False),))], [], 0.3),
        "expiry-lease-held",
    )
    assert "node 3" in v.message and "[3]" in v.message
    v = _only(
        check_session_expiry(ends, [], [], [("j9", 10.5, 10.6, frozenset({"s1"}))], 0.3),
        "expiry-still-blocks",
    )
    assert v.ops == ("s1", "j9")


def test_commits_with_a_version_among_the_two_latest_active_pass() -> None:
    versions, jobs = _job_history()
    writes = [
        VersionedWrite("W1", 1, "ok", 25),  # v1 and v2 active at 25
        VersionedWrite("W2", 3, "ok", 45),  # v3 and v4
        VersionedWrite(
            "W3", 2, "fail", code="SCHEMA_VERSION_NOT_ACTIVE", refused_ts=45, refused_active=(3, 4)
        ),
        VersionedWrite("W4", 1, "unknown"),
    ]
    live = {1: ["_jw/2.parquet", "_jb/1.parquet"]}
    by_path = {"_jw/2.parquet": 3, "_jb/1.parquet": 4, "_jw/1.parquet": 1}
    assert check_versioned_writes(versions, jobs, writes, live, by_path) == []


def test_a_commit_with_a_stale_version_acknowledged_is_flagged() -> None:
    versions, jobs = _job_history()
    v = _only(
        check_versioned_writes(versions, jobs, [VersionedWrite("W", 2, "ok", 45)], {}, {}),
        "write-stale-version",
    )
    assert v.ops == ("W",) and "[3, 4]" in v.message


def test_a_commit_refused_as_not_active_while_it_was_is_flagged() -> None:
    versions, jobs = _job_history()
    wrong = VersionedWrite(
        "W", 4, "fail", code="SCHEMA_VERSION_NOT_ACTIVE", refused_ts=45, refused_active=(3, 4)
    )
    _only(check_versioned_writes(versions, jobs, [wrong], {}, {}), "write-refused-wrongly")


def test_a_file_without_the_column_live_when_it_becomes_public_is_flagged() -> None:
    versions, jobs = _job_history()
    # Job 1's write-only version is 3: a file written with version 2 lacks j1.
    live = {1: ["_jw/1.parquet", "_jw/2.parquet"]}
    v = _only(
        check_versioned_writes(versions, jobs, [], live, {"_jw/1.parquet": 2, "_jw/2.parquet": 3}),
        "backfill-missed",
    )
    assert v.ops == ("job1", "_jw/1.parquet")


def test_a_pin_must_give_writers_the_write_only_column() -> None:
    versions, jobs = _job_history()
    # v3: j1 write-only (job 1's ADD): writers fill it.
    good = _jread("P", 35, 3, ("id",), now=True, write_columns=("id", "j1"))
    assert check_schema_jobs(versions, jobs, [good], {}, {}) == []
    bad = dataclasses.replace(good, write_columns=("id",))
    v = _only(check_schema_jobs(versions, jobs, [bad], {}, {}), "job-write-schema")
    assert v.ops == ("P",)
    # v2: j1 delete-only: invisible to writers too.
    leaked = _jread("P", 25, 2, ("id",), now=True, write_columns=("id", "j1"))
    _only(check_schema_jobs(versions, jobs, [leaked], {}, {}), "job-write-schema")
