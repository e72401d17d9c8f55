"""A linearizability checker for the chaos history: pure functions over recorded operations.

Key idea
    Checking a history of reads and writes for linearizability is NP-hard in general (Knossos,
    Porcupine search for a total order). Here the order is given: every commit gets a commit
    timestamp (ts) in log order, strictly increasing, so the ts order is the only candidate
    linearization of the commits. What is left is polynomial: check that this order respects
    real time, and that every read returned a prefix of it at a point inside the read's
    real-time window.

Model
    A commit is sent at `t_sent`, answered at `t_answered` (both on one monotonic clock of the
    recording process) with outcome ok (and its ts), fail (a typed refusal: it did not happen)
    or unknown (no answer: it may have happened, at any time after it was sent, even after the
    client gave up). The final state says which commits happened and at which ts (`applied`:
    name -> ts). A commit writes to some keys (tables). A read of one key returns the names of
    the commits whose effect it saw; a linearizable read (the daemon's `read_ts` then `files`
    without `as_of`) also names the position it read at (`as_of`: the answering node's safe
    time), an AS OF read the position it asked for.

Rules (each violation names the operations involved)
    * Final state: an acknowledged commit is applied at its acknowledged ts; a refused one is
      not applied; no two applied commits share a ts; nothing applied that nobody sent.
    * Real-time order of commits: if A was answered ok before B was sent and B was applied (ok,
      or unknown and applied), then ts(A) < ts(B).
    * Every read returns only applied commits that write its key (no phantom), and a prefix of
      the key's commits in ts order (no gap: seeing B but not an earlier A is a violation).
      With `as_of`, exactly the key's applied commits with ts <= as_of.
    * A linearizable read's point lies in its real-time window: it saw every commit answered ok
      before it was sent (no stale read), none sent after it was answered (no read from the
      future), and its `as_of` is below the ts of every commit sent after it was answered.
    * Real-time order of linearizable reads: a read sent after another was answered saw every
      commit of its key at or below the earlier one's point (its `as_of`, else the newest ts it
      saw). Judged by data, not by comparing positions: two nodes' positions may differ where
      no commit lies between them.
    * Monotonic reads per client: a client's current reads (not AS OF) never see less than its
      earlier ones covered.

AS OF reads are judged by the prefix and exactness rules only (their point is chosen, not
linearized). Everything here is a pure function; `tests/chaos/test_chaos.py` records the
history and calls `check_history` at the end of a run.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "CommitOp",
    "ReadOp",
    "Violation",
    "check_history",
    "format_violations",
]

Outcome = Literal["ok", "fail", "unknown"]
ReadKind = Literal["linearizable", "as_of"]


@dataclass(frozen=True, slots=True)
class CommitOp:
    """One commit as the client saw it. `ts` is the acknowledged ts (outcome ok only)."""

    name: str
    keys: frozenset[str]
    t_sent: float
    t_answered: float
    outcome: Outcome
    ts: int | None = None

    def describe(self, applied: Mapping[str, int]) -> str:
        ts = applied.get(self.name, self.ts)
        at = f"ts {ts}" if ts is not None else "not applied"
        return (
            f"commit {self.name} ({self.outcome}, {at}, sent {self.t_sent:.3f}, "
            f"answered {self.t_answered:.3f})"
        )


@dataclass(frozen=True, slots=True)
class ReadOp:
    """One answered read of `key`: the names of the commits whose effect it returned.
    `as_of`: the position the answer was read at (a linearizable read's reported position,
    an AS OF read's requested one); None when unknown."""

    name: str
    client: str
    key: str
    t_sent: float
    t_answered: float
    observed: frozenset[str]
    kind: ReadKind = "linearizable"
    as_of: int | None = None
    node: int | None = None

    def describe(self) -> str:
        at = f" at {self.as_of}" if self.as_of is not None else ""
        on = f" on node {self.node}" if self.node is not None else ""
        return (
            f"read {self.name} ({self.kind} of {self.key}{at}{on}, client {self.client}, "
            f"sent {self.t_sent:.3f}, answered {self.t_answered:.3f}, "
            f"saw {len(self.observed)} commits)"
        )


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    message: str
    ops: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


def format_violations(violations: Sequence[Violation], limit: int = 20) -> str:
    """The violations, one a line, at most `limit` of them (and how many more there were)."""
    lines = [str(v) for v in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"... and {len(violations) - limit} more")
    return "\n".join(lines)


@dataclass(slots=True)
class _KeyOrder:
    """The applied commits writing one key, in ts order."""

    ts: list[int]
    names: list[str]

    def count_upto(self, ts: int) -> int:
        """How many of the key's commits have ts <= `ts`."""
        return bisect.bisect_right(self.ts, ts)


def check_history(
    commits: Iterable[CommitOp], reads: Iterable[ReadOp], applied: Mapping[str, int]
) -> list[Violation]:
    """Every violation of the rules in the module docstring, in a stable order (empty: the
    history is linearizable with the commits in ts order)."""
    commit_list = list(commits)
    read_list = list(reads)
    by_name = {c.name: c for c in commit_list}
    out: list[Violation] = []
    out.extend(_check_final_state(commit_list, by_name, applied))
    out.extend(_check_commit_real_time(commit_list, applied))
    orders = _key_orders(commit_list, applied)
    prefix_len: dict[str, int] = {}  # read name -> its prefix length, for reads that are prefixes
    for read in read_list:
        n = _check_read_prefix(read, by_name, applied, orders, out)
        if n is not None:
            prefix_len[read.name] = n
    lin = [r for r in read_list if r.kind == "linearizable" and r.name in prefix_len]
    out.extend(_check_read_windows(lin, commit_list, by_name, applied, orders, prefix_len))
    out.extend(_check_read_order(lin, by_name, orders, prefix_len))
    current = [r for r in read_list if r.kind != "as_of" and r.name in prefix_len]
    out.extend(_check_monotonic_clients(current, orders, prefix_len))
    return out


def _check_final_state(
    commits: list[CommitOp], by_name: Mapping[str, CommitOp], applied: Mapping[str, int]
) -> list[Violation]:
    out = []
    for c in commits:
        if c.outcome == "ok":
            if c.name not in applied:
                out.append(
                    Violation(
                        "lost",
                        f"{c.describe(applied)} was acknowledged at ts {c.ts} but is not in "
                        "the final state",
                        (c.name,),
                    )
                )
            elif applied[c.name] != c.ts:
                out.append(
                    Violation(
                        "lost",
                        f"{c.describe(applied)} was acknowledged at ts {c.ts} but the final "
                        f"state has it at ts {applied[c.name]}",
                        (c.name,),
                    )
                )
        elif c.outcome == "fail" and c.name in applied:
            out.append(
                Violation(
                    "refused-applied",
                    f"{c.describe(applied)} was refused but is in the final state",
                    (c.name,),
                )
            )
    out.extend(
        Violation(
            "unknown-commit",
            f"the final state has commit {name} (ts {applied[name]}) that nobody sent",
            (name,),
        )
        for name in sorted(set(applied) - set(by_name))
    )
    seen: dict[int, str] = {}
    for name, ts in sorted(applied.items(), key=lambda kv: (kv[1], kv[0])):
        if ts in seen:
            out.append(
                Violation(
                    "duplicate-ts",
                    f"commits {seen[ts]} and {name} were both applied at ts {ts} (commit "
                    "timestamps strictly increase in log order)",
                    (seen[ts], name),
                )
            )
        else:
            seen[ts] = name
    return out


def _check_commit_real_time(commits: list[CommitOp], applied: Mapping[str, int]) -> list[Violation]:
    """A commit answered ok before another (applied) commit was sent has the smaller ts. Swept
    in send order, with the acknowledged commit of the largest ts answered so far."""
    acked = sorted(
        (c for c in commits if c.outcome == "ok" and c.name in applied),
        key=lambda c: c.t_answered,
    )
    out = []
    i = 0
    latest: CommitOp | None = None
    for c in sorted((c for c in commits if c.name in applied), key=lambda c: c.t_sent):
        while i < len(acked) and acked[i].t_answered < c.t_sent:
            if latest is None or applied[acked[i].name] > applied[latest.name]:
                latest = acked[i]
            i += 1
        if latest is not None and applied[c.name] <= applied[latest.name]:
            out.append(
                Violation(
                    "real-time-order",
                    f"{c.describe(applied)} was sent after {latest.describe(applied)} was "
                    "acknowledged, but is not ordered after it",
                    (latest.name, c.name),
                )
            )
    return out


def _key_orders(commits: list[CommitOp], applied: Mapping[str, int]) -> dict[str, _KeyOrder]:
    per_key: dict[str, list[tuple[int, str]]] = {}
    for c in commits:
        if c.name in applied:
            for key in c.keys:
                per_key.setdefault(key, []).append((applied[c.name], c.name))
    orders = {}
    for key, items in per_key.items():
        items.sort()
        orders[key] = _KeyOrder([ts for ts, _ in items], [name for _, name in items])
    return orders


def _check_read_prefix(
    read: ReadOp,
    by_name: Mapping[str, CommitOp],
    applied: Mapping[str, int],
    orders: Mapping[str, _KeyOrder],
    out: list[Violation],
) -> int | None:
    """No phantom, no gap, and with `as_of` exactly the key's commits at or below it. Returns
    the read's prefix length in its key's ts order, or None if it is not a prefix (reported)."""
    order = orders.get(read.key, _KeyOrder([], []))
    phantoms = sorted(
        n
        for n in read.observed
        if n not in applied or n not in by_name or read.key not in by_name[n].keys
    )
    if phantoms:
        shown = []
        for n in phantoms[:5]:
            c = by_name.get(n)
            if c is None:
                shown.append(f"{n} (never sent)")
            elif read.key not in c.keys:
                shown.append(f"{n} (does not write {read.key})")
            else:
                shown.append(c.describe(applied))
        out.append(
            Violation(
                "phantom",
                f"{read.describe()} returned commits the final state does not have: "
                + "; ".join(shown),
                (read.name, *phantoms[:5]),
            )
        )
        return None
    newest = max((applied[n] for n in read.observed), default=None)
    n = 0 if newest is None else order.count_upto(newest)
    if n != len(read.observed):
        missing = [m for m in order.names[:n] if m not in read.observed]
        later = max(read.observed, key=lambda m: applied[m])
        out.append(
            Violation(
                "gap",
                f"{read.describe()} saw {by_name[later].describe(applied)} but not the earlier "
                + "; ".join(by_name[m].describe(applied) for m in missing[:5])
                + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""),
                (read.name, later, *missing[:5]),
            )
        )
        return None
    if read.as_of is not None:
        want = order.count_upto(read.as_of)
        if want != n:
            if want > n:
                what = "missed " + "; ".join(
                    by_name[m].describe(applied) for m in order.names[n : min(want, n + 5)]
                )
                ops = order.names[n : min(want, n + 5)]
            else:
                what = "saw " + "; ".join(
                    by_name[m].describe(applied) for m in order.names[want : min(n, want + 5)]
                )
                ops = order.names[want : min(n, want + 5)]
            out.append(
                Violation(
                    "as-of",
                    f"{read.describe()} is not the commits of {read.key} at or below {read.as_of}: "
                    f"it {what}",
                    (read.name, *ops),
                )
            )
            return None
    return n


def _check_read_windows(
    reads: list[ReadOp],
    commits: list[CommitOp],
    by_name: Mapping[str, CommitOp],
    applied: Mapping[str, int],
    orders: Mapping[str, _KeyOrder],
    prefix_len: Mapping[str, int],
) -> list[Violation]:
    """A linearizable read saw every commit of its key acknowledged before it was sent, none
    sent after it was answered, and reads at a position below every commit sent after it was
    answered."""
    out = []
    acked_by_answer = sorted(
        (c for c in commits if c.outcome == "ok" and c.name in applied),
        key=lambda c: c.t_answered,
    )
    answer_times = [c.t_answered for c in acked_by_answer]
    # Per key: the acknowledged commit of the largest ts among the first i answered.
    newest_acked: dict[str, list[CommitOp | None]] = {}
    for key in orders:
        best: CommitOp | None = None
        row: list[CommitOp | None] = [None]
        for c in acked_by_answer:
            if key in c.keys and (best is None or applied[c.name] > applied[best.name]):
                best = c
            row.append(best)
        newest_acked[key] = row
    applied_by_send = sorted((c for c in commits if c.name in applied), key=lambda c: c.t_sent)
    send_times = [c.t_sent for c in applied_by_send]
    # Suffix minimum of ts over commits in send order: the smallest ts sent at or after i.
    suffix_min: list[CommitOp | None] = [None] * (len(applied_by_send) + 1)
    for i in range(len(applied_by_send) - 1, -1, -1):
        c, after = applied_by_send[i], suffix_min[i + 1]
        suffix_min[i] = c if after is None or applied[c.name] < applied[after.name] else after
    for read in reads:
        order = orders.get(read.key, _KeyOrder([], []))
        n = prefix_len[read.name]
        row = newest_acked.get(read.key)
        if row is not None:
            before = row[bisect.bisect_left(answer_times, read.t_sent)]
            if before is not None and order.count_upto(applied[before.name]) > n:
                out.append(
                    Violation(
                        "stale-read",
                        f"{read.describe()} did not see {before.describe(applied)}, "
                        "acknowledged before the read was sent",
                        (read.name, before.name),
                    )
                )
                continue
        future = sorted(n for n in read.observed if by_name[n].t_sent > read.t_answered)
        if future:
            c = by_name[future[0]]
            out.append(
                Violation(
                    "future-read",
                    f"{read.describe()} saw {c.describe(applied)}, sent after the read was "
                    "answered",
                    (read.name, c.name),
                )
            )
            continue
        if read.as_of is not None:
            first_after = suffix_min[bisect.bisect_right(send_times, read.t_answered)]
            if first_after is not None and applied[first_after.name] <= read.as_of:
                out.append(
                    Violation(
                        "future-read",
                        f"{read.describe()} read at a position at or above "
                        f"{first_after.describe(applied)}, sent after the read was answered",
                        (read.name, first_after.name),
                    )
                )
    return out


def _point(read: ReadOp, order: _KeyOrder, n: int) -> int | None:
    """The read's point as far as the data shows: its `as_of`, else the newest ts it saw."""
    if read.as_of is not None:
        return read.as_of
    return order.ts[n - 1] if n else None


def _check_read_order(
    reads: list[ReadOp],
    by_name: Mapping[str, CommitOp],
    orders: Mapping[str, _KeyOrder],
    prefix_len: Mapping[str, int],
) -> list[Violation]:
    """A linearizable read sent after another was answered saw every commit of its key at or
    below the earlier read's point."""
    out = []
    by_answer = sorted(reads, key=lambda r: r.t_answered)
    i = 0
    latest: tuple[int, ReadOp] | None = None  # the largest point among reads answered so far
    for read in sorted(reads, key=lambda r: r.t_sent):
        while i < len(by_answer) and by_answer[i].t_answered < read.t_sent:
            r = by_answer[i]
            p = _point(r, orders.get(r.key, _KeyOrder([], [])), prefix_len[r.name])
            if p is not None and (latest is None or p > latest[0]):
                latest = (p, r)
            i += 1
        if latest is None:
            continue
        order = orders.get(read.key, _KeyOrder([], []))
        n = prefix_len[read.name]
        want = order.count_upto(latest[0])
        if want > n:
            missed = by_name[order.names[n]]
            out.append(
                Violation(
                    "read-order",
                    f"{read.describe()} did not see commit {missed.name} (ts "
                    f"{order.ts[n]}), which {latest[1].describe()}, answered before this read "
                    f"was sent, already covered (its point {latest[0]})",
                    (latest[1].name, read.name, missed.name),
                )
            )
    return out


def _check_monotonic_clients(
    reads: list[ReadOp], orders: Mapping[str, _KeyOrder], prefix_len: Mapping[str, int]
) -> list[Violation]:
    """A client's current reads, in the order it sent them, never cover less of a key than
    its earlier reads of any key covered (by data: the commits at or below the newest point)."""
    out = []
    per_client: dict[str, list[ReadOp]] = {}
    for read in reads:
        per_client.setdefault(read.client, []).append(read)
    for client in sorted(per_client):
        latest: tuple[int, ReadOp] | None = None
        for read in sorted(per_client[client], key=lambda r: r.t_sent):
            order = orders.get(read.key, _KeyOrder([], []))
            n = prefix_len[read.name]
            if latest is not None and order.count_upto(latest[0]) > n:
                out.append(
                    Violation(
                        "monotonic-read",
                        f"client {client}'s {read.describe()} did not see commit "
                        f"{order.names[n]} (ts {order.ts[n]}), covered by its earlier "
                        f"{latest[1].describe()} (point {latest[0]})",
                        (latest[1].name, read.name, order.names[n]),
                    )
                )
            p = _point(read, order, n)
            if p is not None and (latest is None or p > latest[0]):
                latest = (p, read)
    return out
