"""The chaos suite's linearizability checker (tests/chaos/linearizability.py), on histories
made here: hand-written ones for each rule, generated linearizable ones that must pass, and
mutations of them (a dropped prefix element, a stale read, a reversed real-time pair, a read
from the future) that must be flagged naming the operations involved."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chaos.linearizability import CommitOp, ReadOp, Violation, check_history


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
        by_name = {c.name: c for c in self.commits}
        return {
            n
            for n, ts in self.applied.items()
            if key in by_name[n].keys and (upto is None or ts <= upto)
        }


KEYS = ("a", "b")


@st.composite
def linearizable_histories(draw: st.DrawFn) -> _History:
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
            keys = draw(st.sampled_from([("a",), ("b",), ("a", "b")]))
            op = {"kind": "commit", "name": f"C{i}", "keys": keys, "outcome": outcome}
            op.update(t_sent=t_sent, t_answered=t_sent + duration)
            if outcome == "ok":
                events.append((t_sent + duration * frac + tie, i, op))
            elif outcome == "unknown" and draw(st.booleans()):
                late = draw(st.integers(1, 200)) / 100  # possibly after the client gave up
                events.append((t_sent + duration * late + tie, i, op))
            else:
                events.append((float("inf"), i, op))  # never applied
        elif kind == "read":
            client = draw(st.sampled_from(["r1", "r2", "r3"]))
            t_sent = max(t_sent, client_free.get(client, -1.0) + 1.0)  # a client is sequential
            client_free[client] = t_sent + duration
            op = {
                "kind": "read",
                "name": f"R{i}",
                "client": client,
                "key": draw(st.sampled_from(KEYS)),
            }
            op.update(t_sent=t_sent, t_answered=t_sent + duration, with_as_of=draw(st.booleans()))
            op["slack"] = draw(st.integers(0, 9))
            events.append((t_sent + duration * frac + tie, i, op))
        else:
            op = {"kind": "as_of", "name": f"S{i}", "key": draw(st.sampled_from(KEYS))}
            op.update(t_sent=t_sent, t_answered=t_sent + duration, pick=draw(st.integers(0, 10**6)))
            events.append((float("inf"), i, op))
    h = _History()
    ts = 0
    as_of_reads = []
    for point, _, op in sorted(events, key=lambda e: (e[0], e[1])):
        if op["kind"] == "commit":
            acked = op["outcome"] == "ok"
            if point != float("inf"):
                ts += 10
                h.applied[op["name"]] = ts
            h.commits.append(
                CommitOp(
                    op["name"],
                    frozenset(op["keys"]),
                    op["t_sent"],
                    op["t_answered"],
                    op["outcome"],
                    ts if acked else None,
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
    candidates = [r for r in h.reads if len(r.observed) >= 2]
    if candidates:
        read = data.draw(st.sampled_from(candidates))
        newest = max(read.observed, key=lambda n: applied[n])
        dropped = data.draw(st.sampled_from(sorted(read.observed - {newest})))
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
        stale = {n for n in read.observed if h.applied[n] < cut}
        stale |= {n for n in h.prefix(read.key) if h.applied[n] < cut}
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
