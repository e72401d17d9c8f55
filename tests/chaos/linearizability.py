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
    name -> ts). A commit writes to some keys (tables): it adds its own files to each (unless
    `adds_files` is False: a write that only removes), and may remove earlier commits' files
    (an overwrite removes all of the key's; `removes` names some, as an OPTIMIZE does that
    rewrites them into its own). A read of one key returns the names of the commits whose
    files it listed; a linearizable read (the daemon's `read_ts` then `files` without
    `as_of`) also names the position it read at (`as_of`: the answering node's safe time), an
    AS OF read the position it asked for. The state at a position is the commits up to it
    that add files and whose files none of them removed; a read must return exactly the state
    at some position (its candidates: several when writes that only remove lie between
    them), and with `as_of` at that one.

    Schemas are checked the same way, under a key of their own (`schema_key`): a DDL that
    adds a column is a commit at its activation time Tu (`ddl_commit`), and `schema_at` at ts
    is a read of the columns added by DDL (`schema_read`); `ddl_activations` gives the final
    state from the table's history. Tu is not a commit ts, so a schema history is checked in
    its own `check_history` call.

Rules (each violation names the operations involved)
    * Final state: an acknowledged commit is applied at its acknowledged ts; a refused one is
      not applied; no two applied commits share a ts; nothing applied that nobody sent.
    * Real-time order of commits: if A was answered ok before B was sent and B was applied (ok,
      or unknown and applied), then ts(A) < ts(B).
    * Racing removals: an applied commit removes by name only commits live at its position.
      One that an earlier applied write already removed is a `double-removal` (two removers
      raced for the same files and both applied: the later had to be refused); one not applied
      before it is `removed-missing`. A refused racing removal is fine; one of unknown outcome
      is judged by whether it applied.
    * Every read returns only applied commits that write its key and add files (no phantom),
      and exactly the state at some position of the key's ts order: none that a commit up to
      its newest one removed (removed-listed: a removed file still listed), and every earlier
      one still live there unless a write that only removes took it (no gap: seeing B but
      not an earlier A is a violation; so is not listing A, removed later by C, without C's
      own files: a removal shown without its replacement). With `as_of`, exactly the state
      at as_of.
    * A linearizable read's point lies in its real-time window: it saw every commit answered ok
      before it was sent (no stale read), none sent after it was answered (no read from the
      future), and its `as_of` is below the ts of every commit sent after it was answered.
    * Real-time order of linearizable reads: a read sent after another was answered saw every
      commit of its key at or below the earlier one's point (its `as_of`, else the newest ts it
      saw). Judged by data, not by comparing positions: two nodes' positions may differ where
      no commit lies between them.
    * Monotonic reads per client: a client's current read (not AS OF) never sees less than its
      reads answered before it was sent covered (reads of one client that overlap in time,
      from several threads, do not bind each other).

The window and order rules take a read at any of its candidate positions: at one inside its
window, as late as its state allows when judging it, as early as it allows when it binds later
reads.

AS OF reads are judged by the prefix and exactness rules only (their point is chosen, not
linearized). Protected timestamps are judged apart (`check_protections`), by real time alone:
a protection acknowledged is listed by every linearizable list of records sent after that and
answered before its release was sent, on any node, and none after its release was
acknowledged. Schema leases too (`check_lease_versions`): a schema read sent and answered
while a lease on version v was surely held and unexpired (from an acknowledged acquisition or
heartbeat until its send time + the TTL, cut at the release's send) shows no version above
v + 1, on any node. Schema change jobs (`check_schema_jobs`): each version of the jobs' table
has the public columns the jobs' steps imply (an ADD's column public only at its last step, a
DROP's gone from its first, a cancel restores the base version's), every schema read shows the
version in force at its ts with those columns, a read at now after a job was seen finished
shows its last version, and acknowledged ends are final. Session expiry
(`check_session_expiry`): a session that ended by TTL or `session_expire` never heartbeats,
leases or opens again, holds no unexpired lease in any later linearizable list and blocks
no job's step. Everything here is a pure function; `tests/chaos/test_chaos.py` records the
history and calls `check_history` at the end of a run.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "CommitOp",
    "LeaseHold",
    "ProtectionOp",
    "ProtectionRead",
    "ReadOp",
    "SchemaVersionRead",
    "Violation",
    "check_history",
    "check_lease_versions",
    "check_protections",
    "ddl_activations",
    "ddl_commit",
    "format_violations",
    "schema_key",
    "schema_read",
]

Outcome = Literal["ok", "fail", "unknown"]
ReadKind = Literal["linearizable", "as_of"]


@dataclass(frozen=True, slots=True)
class CommitOp:
    """One commit as the client saw it. `ts` is the acknowledged ts (outcome ok only).

    A commit adds its own files to every key it writes (that is what a read names it by).
    `overwrites`: keys it overwrites (every file of the key's earlier commits goes, as an
    `overwrite` write does); `removes`: (key, commit name) pairs whose files on that key it
    removes (a write with removals: a compaction, a DELETE that rewrites files). `label` names
    the kind of operation in messages ("commit", "DDL"). `adds_files` False: a write that only
    removes (no files of its own, so no read ever names it; it is a position all the same)."""

    name: str
    keys: frozenset[str]
    t_sent: float
    t_answered: float
    outcome: Outcome
    ts: int | None = None
    overwrites: frozenset[str] = frozenset()
    removes: frozenset[tuple[str, str]] = frozenset()
    label: str = "commit"
    adds_files: bool = True

    def describe(self, applied: Mapping[str, int]) -> str:
        ts = applied.get(self.name, self.ts)
        at = f"ts {ts}" if ts is not None else "not applied"
        return (
            f"{self.label} {self.name} ({self.outcome}, {at}, sent {self.t_sent:.3f}, "
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


def schema_key(table: str) -> str:
    """The key a table's schema is checked under (DDL commits, schema reads)."""
    return f"schema of {table}"


def ddl_commit(
    column: str,
    table: str,
    t_sent: float,
    t_answered: float,
    outcome: Outcome,
    tu: int | None = None,
) -> CommitOp:
    """An ALTER TABLE ADD COLUMN `column` as the checker sees it: a commit of the table's
    schema key at its activation time Tu (IEP-98: the version it publishes is in force at
    every ts >= Tu, none below), named by its column. Tu strictly increases in log order
    (Tm does, and DD is the cluster's constant), so the Tu order is the only candidate
    linearization, as the ts order is for data commits. `tu`: the acknowledged Tu."""
    return CommitOp(
        column, frozenset({schema_key(table)}), t_sent, t_answered, outcome, tu, label="DDL"
    )


def schema_read(
    name: str,
    client: str,
    table: str,
    t_sent: float,
    t_answered: float,
    columns: Iterable[str],
    ts: int,
    *,
    now: bool,
    node: int | None = None,
) -> ReadOp:
    """A `schema_at` answer: the columns added by DDL it listed (the CREATE's own columns left
    out), at the ts it names (`ts` of the reply). `now`: asked without a ts, at the node's
    now (raised to the client's floor): judged as a linearizable read, since a DDL replies only
    once now >= Tu + CSmax, so every node's now is past its Tu then; else an AS OF read,
    judged by exactness only."""
    kind: ReadKind = "linearizable" if now else "as_of"
    return ReadOp(
        name, client, schema_key(table), t_sent, t_answered, frozenset(columns), kind, ts, node
    )


def ddl_activations(
    versions: Iterable[tuple[int, Iterable[str]]],
) -> dict[str, int]:
    """The final state of a table's DDL: column -> the Tu of the version that added it, from
    its history ((tu, column names) per version, oldest first). The first version's columns
    (the CREATE's) are no DDL commit."""
    out: dict[str, int] = {}
    before: set[str] | None = None
    for tu, columns in versions:
        now = set(columns)
        if before is not None:
            for column in sorted(now - before):
                out[column] = tu
        before = now
    return out


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
    """The applied commits writing one key, in ts order, and what removes their files: the
    key's state after its first n commits (position n) is the commits among them whose files
    no commit among them removed. Each commit is live at its own position (it adds its own
    files), so a read's position is that of the newest commit it saw."""

    ts: list[int]
    names: list[str]
    index: dict[str, int] = field(default_factory=dict)  # name -> its position (1-based)
    removed_at: dict[str, int] = field(default_factory=dict)  # name -> position removing it
    remover: dict[str, str] = field(default_factory=dict)  # name -> the commit removing it
    live_count: list[int] = field(default_factory=lambda: [0])  # position -> live commits
    removes_only: set[str] = field(default_factory=set)  # commits adding no files of their own
    # (remover, named commit): removals by name of a commit not live at the remover's position
    # (already removed, or not yet applied): the state machine must refuse those.
    dead_removals: list[tuple[str, str]] = field(default_factory=list)
    # (XOR of the live commits' name hashes, how many) -> the positions with that live set:
    # a read is valid at every position whose live set it returned exactly.
    positions_by_live: dict[tuple[int, int], list[int]] = field(
        default_factory=lambda: {(0, 0): [0]}
    )

    def count_upto(self, ts: int) -> int:
        """How many of the key's commits have ts <= `ts` (the position at `ts`)."""
        return bisect.bisect_right(self.ts, ts)

    def live_at(self, n: int) -> list[str]:
        """The commits live at position n, in ts order."""
        return [
            m
            for m in self.names[:n]
            if m not in self.removes_only and self.removed_at.get(m, n + 1) > n
        ]

    def positions_of(self, observed: frozenset[str]) -> list[int]:
        """The positions whose live set is exactly `observed`, ascending (a hash narrows them,
        then each is compared)."""
        signature = (_live_hash(observed), len(observed))
        return [
            p for p in self.positions_by_live.get(signature, []) if set(self.live_at(p)) == observed
        ]


def _live_hash(names: Iterable[str]) -> int:
    out = 0
    for name in names:
        out ^= hash(name)
    return out


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
    out.extend(_check_dead_removals(orders, by_name, applied))
    # read name -> the positions whose state it returned exactly, for reads that returned one
    positions: dict[str, list[int]] = {}
    for read in read_list:
        found = _check_read_prefix(read, by_name, applied, orders, out)
        if found is not None:
            positions[read.name] = found
    lin = [r for r in read_list if r.kind == "linearizable" and r.name in positions]
    out.extend(_check_read_windows(lin, commit_list, by_name, applied, orders, positions))
    # The order rules judge a read as late as its state allows (it may have read at its
    # last candidate position) and bind later reads by its earliest one: lenient both ways.
    latest = {name: found[-1] for name, found in positions.items()}
    earliest = {name: found[0] for name, found in positions.items()}
    out.extend(_check_read_order(lin, by_name, orders, latest, earliest))
    current = [r for r in read_list if r.kind != "as_of" and r.name in positions]
    out.extend(_check_monotonic_clients(current, by_name, orders, latest, earliest))
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
    """Per key, its applied commits in ts order, with the removals replayed in that order (a
    removal of a commit not live at that point, not yet applied or already removed, removes
    nothing)."""
    per_key: dict[str, list[tuple[int, str]]] = {}
    by_name = {c.name: c for c in commits}
    for c in commits:
        if c.name in applied:
            for key in c.keys:
                per_key.setdefault(key, []).append((applied[c.name], c.name))
    orders = {}
    for key, items in per_key.items():
        items.sort()
        order = _KeyOrder([ts for ts, _ in items], [name for _, name in items])
        live: dict[str, None] = {}  # insertion-ordered set
        live_hash = 0
        for position, (_ts, name) in enumerate(items, start=1):
            c = by_name[name]
            gone = list(live) if key in c.overwrites else []
            named = sorted(m for k, m in c.removes if k == key)
            gone += [m for m in named if m in live and m not in gone]
            order.dead_removals.extend((name, m) for m in named if m not in live)
            for m in gone:
                del live[m]
                live_hash ^= hash(m)
                order.removed_at[m] = position
                order.remover[m] = name
            if c.adds_files:
                live[name] = None
                live_hash ^= hash(name)
            else:
                order.removes_only.add(name)
            order.index[name] = position
            order.live_count.append(len(live))
            order.positions_by_live.setdefault((live_hash, len(live)), []).append(position)
        orders[key] = order
    return orders


def _check_dead_removals(
    orders: Mapping[str, _KeyOrder], by_name: Mapping[str, CommitOp], applied: Mapping[str, int]
) -> list[Violation]:
    """An applied commit removed by name only files live at its position: none that an
    earlier applied commit had already removed (racing removers: the later one must be
    refused, DATA_FILE_CONFLICT or READ_CONFLICT), none of a commit not applied before it.
    A refused removal applies nothing, and one of unknown outcome is judged by whether it
    applied, so neither is held to this."""
    out = []
    for key in sorted(orders):
        order = orders[key]
        for remover, m in order.dead_removals:
            c = by_name[remover]
            first = order.remover.get(m)
            if first is not None and order.index[first] < order.index[remover]:
                out.append(
                    Violation(
                        "double-removal",
                        f"{c.describe(applied)} removed the files of {m} from {key}, which "
                        f"{by_name[first].describe(applied)} had already removed (both "
                        "applied: the later removal must have been refused)",
                        (remover, m, first),
                    )
                )
            else:
                what = (
                    f"{by_name[m].describe(applied)}, not applied before it"
                    if m in by_name
                    else f"{m}, which nobody sent"
                )
                out.append(
                    Violation(
                        "removed-missing",
                        f"{c.describe(applied)} removed from {key} the files of {what} (a "
                        "removal of a file not in the table must have been refused)",
                        (remover, m),
                    )
                )
    return out


def _check_read_prefix(
    read: ReadOp,
    by_name: Mapping[str, CommitOp],
    applied: Mapping[str, int],
    orders: Mapping[str, _KeyOrder],
    out: list[Violation],
) -> list[int] | None:
    """No phantom, and the read returned exactly the live set of its key at some position
    (with `as_of`, at the position of as_of). Returns those positions (ascending; several
    when writes that only remove lie between them), or None (reported): a removed commit
    still listed, a live one missing (gap; also a removal shown without the files its
    remover added), or not the state at as_of."""
    order = orders.get(read.key, _KeyOrder([], []))
    phantoms = sorted(
        n
        for n in read.observed
        if n not in applied
        or n not in by_name
        or read.key not in by_name[n].keys
        or not by_name[n].adds_files
    )
    if phantoms:
        shown = []
        for n in phantoms[:5]:
            c = by_name.get(n)
            if c is None:
                shown.append(f"{n} (never sent)")
            elif read.key not in c.keys:
                shown.append(f"{n} (does not write {read.key})")
            elif not c.adds_files:
                shown.append(f"{c.describe(applied)} (adds no files)")
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
    n = max((order.index[m] for m in read.observed), default=0)
    removed = sorted(
        (m for m in read.observed if order.removed_at.get(m, n + 1) <= n),
        key=lambda m: order.index[m],
    )
    if removed:
        later = order.names[n - 1]
        shown = [
            f"{by_name[m].describe(applied)}, removed by "
            f"{by_name[order.remover[m]].describe(applied)}"
            for m in removed[:5]
        ]
        out.append(
            Violation(
                "removed-listed",
                f"{read.describe()} saw {by_name[later].describe(applied)} and still listed "
                "the files of " + "; ".join(shown),
                (read.name, *(x for m in removed[:5] for x in (m, order.remover[m]))),
            )
        )
        return None
    found = order.positions_of(read.observed)
    if not found:
        # Every commit it listed is live at n (the newest one's position), so some commit
        # live there is missing; the state at any later position that lacks it also lacks
        # the later commits' files (or the read would match it).
        missing = [m for m in order.live_at(n) if m not in read.observed]
        later = order.names[n - 1]
        removers = [
            order.remover[m]
            for m in missing[:5]
            if m in order.remover and by_name[order.remover[m]].adds_files
        ]
        why = ""
        if removers:
            why = (
                " (which only "
                + "; ".join(
                    f"the later {by_name[r].describe(applied)}, not listed, removes"
                    for r in removers
                )
                + ": a removal seen without the files that replace them)"
            )
        out.append(
            Violation(
                "gap",
                f"{read.describe()} saw {by_name[later].describe(applied)} but not the earlier "
                + "; ".join(by_name[m].describe(applied) for m in missing[:5])
                + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
                + why,
                (read.name, later, *missing[:5], *removers),
            )
        )
        return None
    if read.as_of is not None:
        want = order.count_upto(read.as_of)
        if want in found:
            return [want]
        if want > found[-1]:
            ops = order.names[found[-1] : want][:5]
            what = "missed " + "; ".join(by_name[m].describe(applied) for m in ops)
        elif want < found[0]:
            ops = [m for m in order.names[want : found[0]] if m in read.observed][:5]
            what = "saw " if ops else "saw the state after "
            ops = ops or order.names[want : found[0]][:5]
            what += "; ".join(by_name[m].describe(applied) for m in ops)
        else:
            ops = order.names[want - 1 : want]
            what = (
                "returned a state of other positions only (not that after "
                + "; ".join(by_name[m].describe(applied) for m in ops)
                + ")"
            )
        out.append(
            Violation(
                "as-of",
                f"{read.describe()} is not the state of {read.key} at {read.as_of}: it {what}",
                (read.name, *ops),
            )
        )
        return None
    return found


def _check_read_windows(
    reads: list[ReadOp],
    commits: list[CommitOp],
    by_name: Mapping[str, CommitOp],
    applied: Mapping[str, int],
    orders: Mapping[str, _KeyOrder],
    positions: Mapping[str, list[int]],
) -> list[Violation]:
    """A linearizable read saw every commit of its key acknowledged before it was sent, none
    sent after it was answered, and reads at a position below every commit sent after it was
    answered: one of the positions whose state it returned lies in that window."""
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
        found = positions[read.name]
        row = newest_acked.get(read.key)
        if row is not None:
            before = row[bisect.bisect_left(answer_times, read.t_sent)]
            lowest = order.count_upto(applied[before.name]) if before is not None else 0
            found = [p for p in found if p >= lowest]
            if before is not None and not found:
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
        # The read's point: the position it names, else at least the newest commit it saw
        # (which also covers commits whose files it did not list because a commit it saw
        # removed them).
        if read.as_of is not None:
            point: int | None = read.as_of
        else:
            # Position 0 (before any commit of the key) is below everything.
            points = [_point(read, order, p) for p in found]
            point = None if None in points else min(p for p in points if p is not None)
        if point is not None:
            first_after = suffix_min[bisect.bisect_right(send_times, read.t_answered)]
            if first_after is not None and applied[first_after.name] <= point:
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
    latest: Mapping[str, int],
    earliest: Mapping[str, int],
) -> list[Violation]:
    """A linearizable read sent after another was answered saw every commit of its key at or
    below the earlier read's point."""
    out = []
    by_answer = sorted(reads, key=lambda r: r.t_answered)
    i = 0
    newest: tuple[int, ReadOp] | None = None  # the largest point among reads answered so far
    for read in sorted(reads, key=lambda r: r.t_sent):
        while i < len(by_answer) and by_answer[i].t_answered < read.t_sent:
            r = by_answer[i]
            p = _point(r, orders.get(r.key, _KeyOrder([], [])), earliest[r.name])
            if p is not None and (newest is None or p > newest[0]):
                newest = (p, r)
            i += 1
        if newest is None:
            continue
        order = orders.get(read.key, _KeyOrder([], []))
        n = latest[read.name]
        want = order.count_upto(newest[0])
        if want > n:
            missed = by_name[order.names[n]]
            out.append(
                Violation(
                    "read-order",
                    f"{read.describe()} did not see {missed.label} {missed.name} (ts "
                    f"{order.ts[n]}), which {newest[1].describe()}, answered before this read "
                    f"was sent, already covered (its point {newest[0]})",
                    (newest[1].name, read.name, missed.name),
                )
            )
    return out


def _check_monotonic_clients(
    reads: list[ReadOp],
    by_name: Mapping[str, CommitOp],
    orders: Mapping[str, _KeyOrder],
    latest_position: Mapping[str, int],
    earliest_position: Mapping[str, int],
) -> list[Violation]:
    """A client's current read never covers less of a key than its reads answered before it
    was sent covered, of any key (by data: the commits at or below the newest point). Reads of
    one client that overlap in time (sent from several threads) do not bind each other."""
    out = []
    per_client: dict[str, list[ReadOp]] = {}
    for read in reads:
        per_client.setdefault(read.client, []).append(read)
    for client in sorted(per_client):
        latest: tuple[int, ReadOp] | None = None
        by_answer = sorted(per_client[client], key=lambda r: r.t_answered)
        i = 0
        for read in sorted(per_client[client], key=lambda r: r.t_sent):
            while i < len(by_answer) and by_answer[i].t_answered < read.t_sent:
                r = by_answer[i]
                p = _point(r, orders.get(r.key, _KeyOrder([], [])), earliest_position[r.name])
                if p is not None and (latest is None or p > latest[0]):
                    latest = (p, r)
                i += 1
            order = orders.get(read.key, _KeyOrder([], []))
            n = latest_position[read.name]
            if latest is not None and order.count_upto(latest[0]) > n:
                out.append(
                    Violation(
                        "monotonic-read",
                        f"client {client}'s {read.describe()} did not see "
                        f"{by_name[order.names[n]].label} {order.names[n]} (ts {order.ts[n]}), "
                        "covered by its earlier "
                        f"{latest[1].describe()} (point {latest[0]})",
                        (latest[1].name, read.name, order.names[n]),
                    )
                )
    return out


@dataclass(frozen=True, slots=True)
class ProtectionOp:
    """A protected timestamp as its client saw it: `protect` sent at `t_sent` and answered
    at `t_answered` with `outcome` (after resends with the same record id: the last answer),
    and, if it was released, the release sent at `t_release_sent` and answered at
    `t_release_answered` with `release_outcome` (ok: the record is gone, whether this attempt
    or an earlier one with an unknown outcome removed it)."""

    record_id: str
    t_sent: float
    t_answered: float
    outcome: Outcome
    t_release_sent: float | None = None
    t_release_answered: float | None = None
    release_outcome: Outcome | None = None

    def describe(self) -> str:
        out = (
            f"protection {self.record_id} ({self.outcome}, sent {self.t_sent:.3f}, answered "
            f"{self.t_answered:.3f}"
        )
        if self.t_release_sent is not None:
            out += f"; release sent {self.t_release_sent:.3f}"
            if self.t_release_answered is not None:
                out += f", answered {self.t_release_answered:.3f} ({self.release_outcome})"
        return out + ")"


@dataclass(frozen=True, slots=True)
class ProtectionRead:
    """One linearizable list of the protection records (`read_ts`, then `pts_list` without a
    position) on `node`: the ids it listed, of the records the history knows."""

    name: str
    node: int | None
    t_sent: float
    t_answered: float
    listed: frozenset[str]

    def describe(self) -> str:
        on = f" on node {self.node}" if self.node is not None else ""
        return (
            f"protection list {self.name}{on} (sent {self.t_sent:.3f}, answered "
            f"{self.t_answered:.3f}, {len(self.listed)} records)"
        )


def check_protections(
    protections: Iterable[ProtectionOp], reads: Iterable[ProtectionRead]
) -> list[Violation]:
    """Protections against linearizable lists of them, by real time (a protection is a
    record that exists from a point inside its protect's window to a point inside its
    release's): a list sent after a protect was acknowledged and answered before its release
    was sent names it (protection-missing: the guarantee "once protect returns, the data is
    protected" seen from every node); a list sent after a release was acknowledged does not
    (released-listed); nothing refused, or never sent, is ever listed (phantom-protection).
    Unknown outcomes bound nothing but what they may have done. O(protections x reads)."""
    by_id = {p.record_id: p for p in protections}
    out: list[Violation] = []
    for read in reads:
        for rid in sorted(read.listed):
            p = by_id.get(rid)
            if p is None or p.outcome == "fail":
                what = "never sent" if p is None else f"refused: {p.describe()}"
                out.append(
                    Violation(
                        "phantom-protection",
                        f"{read.describe()} listed protection {rid}, {what}",
                        (read.name, rid),
                    )
                )
            elif (
                p.release_outcome == "ok"
                and p.t_release_answered is not None
                and p.t_release_answered < read.t_sent
            ):
                out.append(
                    Violation(
                        "released-listed",
                        f"{read.describe()} listed {p.describe()}, released before the list "
                        "was sent",
                        (read.name, rid),
                    )
                )
        for p in by_id.values():
            if p.outcome != "ok" or p.record_id in read.listed or p.t_answered >= read.t_sent:
                continue
            if p.t_release_sent is not None and p.t_release_sent <= read.t_answered:
                continue  # the release may have taken effect before the read's point
            out.append(
                Violation(
                    "protection-missing",
                    f"{read.describe()} did not list {p.describe()}, acknowledged before the "
                    "list was sent and not released before it was answered",
                    (read.name, p.record_id),
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class LeaseHold:
    """A session's lease on schema version `version` of a table, as its client saw it by real
    time: `renewals` are the acknowledged acquisition and heartbeats, (sent, answered) each,
    and `t_release_sent` when the release was sent (None: held to the end of the record)."""

    name: str
    version: int
    renewals: tuple[tuple[float, float], ...]
    t_release_sent: float | None = None

    def windows(self, ttl_s: float) -> list[tuple[float, float]]:
        """When the lease was surely held and unexpired: from each renewal's answer until its
        send time + `ttl_s` (its entry was applied after it was sent, so the deadline is at
        least that; the caller takes off what clocks may disagree by), cut at the release."""
        stop = float("inf") if self.t_release_sent is None else self.t_release_sent
        out = []
        for sent, answered in sorted(self.renewals):
            end = min(sent + ttl_s, stop)
            if answered < end:
                out.append((answered, end))
        return out

    def describe(self) -> str:
        renewals = len(self.renewals)
        release = (
            f", release sent {self.t_release_sent:.3f}" if self.t_release_sent is not None else ""
        )
        first = f", acquired {self.renewals[0][1]:.3f}" if self.renewals else ""
        return f"lease {self.name} on version {self.version} ({renewals} renewals{first}{release})"


@dataclass(frozen=True, slots=True)
class SchemaVersionRead:
    """A schema read of the leased table on `node`: the version its answer showed."""

    name: str
    node: int | None
    t_sent: float
    t_answered: float
    version: int

    def describe(self) -> str:
        on = f" on node {self.node}" if self.node is not None else ""
        return (
            f"schema read {self.name}{on} (sent {self.t_sent:.3f}, answered "
            f"{self.t_answered:.3f}, version {self.version})"
        )


def check_lease_versions(
    holds: Iterable[LeaseHold], reads: Iterable[SchemaVersionRead], ttl_s: float
) -> list[Violation]:
    """The two-version invariant seen by readers, by real time: a schema read sent and
    answered while a lease on version v was surely held and unexpired (`LeaseHold.windows`)
    shows no version above v + 1, on any node (lease-two-versions: a DDL got past the lease;
    the catalog refuses to publish v + 2 while a lease on v lives). O(holds x reads)."""
    windows = [(hold, w) for hold in holds for w in hold.windows(ttl_s)]
    windows.sort(key=lambda hw: hw[1][0])
    out: list[Violation] = []
    for read in sorted(reads, key=lambda r: (r.t_sent, r.name)):
        for hold, (start, end) in windows:
            if start > read.t_sent:
                break
            if read.t_answered <= end and read.version > hold.version + 1:
                out.append(
                    Violation(
                        "lease-two-versions",
                        f"{read.describe()} showed a version more than one past "
                        f"{hold.describe()}, surely held from {start:.3f} to {end:.3f}",
                        (read.name, hold.name),
                    )
                )
                break
    return out


# ---- schema change jobs and session expiry (judged apart, like the leases) ----------------


@dataclass(frozen=True, slots=True)
class TableVersion:
    """One schema version of a table from its final history: `columns` the public ones (what
    readers see, in order), `pending` {name: state} of the columns a job holds hidden."""

    version: int
    tu: int
    columns: tuple[str, ...]
    pending: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A schema change job as the final `job_list` shows it: `versions` one per step reached
    (`steps[i]` published `versions[i]`), then the rollback's when cancelled."""

    job_id: int
    kind: str  # "add_column" | "drop_column"
    column: str
    status: str  # running | succeeded | cancelled | aborted
    steps: tuple[str, ...]
    versions: tuple[int, ...]
    base_version: int


@dataclass(frozen=True, slots=True)
class JobSchemaRead:
    """A `schema_at` of the jobs' table on `node`: the ts it names, the version and public
    columns it showed; `now` when sent without a ts."""

    name: str
    node: int | None
    t_sent: float
    t_answered: float
    ts: int
    version: int
    columns: tuple[str, ...]
    now: bool = False
    # A `pin`'s answer also names what a writer of that version writes (`write_schema`).
    write_columns: tuple[str, ...] | None = None

    def describe(self) -> str:
        at = "now" if self.now else "AS OF"
        return (
            f"schema read {self.name} on node {self.node} ({at} ts {self.ts}, sent "
            f"{self.t_sent:.3f}, answered {self.t_answered:.3f}: version {self.version}, "
            f"columns {list(self.columns)})"
        )


# The state a job's column is in at each step (in `pending`; None: not pending, its final
# shape - public for an ADD, gone for a DROP).
_JOB_STEP_STATE: Final = {
    ("add_column", "delete_only"): "delete_only",
    ("add_column", "write_only"): "write_only",
    ("add_column", "backfill"): "write_only",
    ("add_column", "public"): None,
    ("drop_column", "write_only"): "write_only",
    ("drop_column", "dropped"): None,
}


def job_model(
    versions: Sequence[TableVersion], jobs: Iterable[JobRecord]
) -> tuple[dict[int, tuple[str, ...]], list[Violation]]:
    """The public columns every version must have, derived from the jobs alone (the first
    version's are taken as given): an ADD's column becomes public only at its `public` step,
    a DROP's disappears at its `write_only` step, a cancel's rollback restores the base
    version's columns; every other step leaves them as they were. Each version of the
    history is compared with it (job-intermediate-visible: a hidden column shown to readers,
    or one shown too late), and so is its `pending` (job-pending: the column not in the state
    the step says). Every version after the first must have been published by a job."""
    out: list[Violation] = []
    owner: dict[int, tuple[JobRecord, int]] = {}
    for job in jobs:
        for i, v in enumerate(job.versions):
            owner[v] = (job, i)
    ordered = sorted(versions, key=lambda v: v.version)
    if not ordered:
        return {}, out
    model = {ordered[0].version: ordered[0].columns}
    prev = ordered[0].columns
    for tv in ordered[1:]:
        found = owner.get(tv.version)
        if found is None:
            out.append(
                Violation(
                    "job-unowned-version",
                    f"version {tv.version} (columns {list(tv.columns)}) was published by no "
                    "known job",
                    (f"v{tv.version}",),
                )
            )
            model[tv.version] = prev = tv.columns
            continue
        job, i = found
        rollback = job.status == "cancelled" and i == len(job.versions) - 1
        state: str | None
        if rollback:
            expect = model.get(job.base_version, prev)
            state, step = None, "rollback"
        else:
            step = job.steps[i] if i < len(job.steps) else "?"
            state = _JOB_STEP_STATE.get((job.kind, step))
            if job.kind == "add_column" and step == "public":
                expect = (*prev, job.column)
            elif job.kind == "drop_column" and step == "write_only":
                expect = tuple(c for c in prev if c != job.column)
            else:
                expect = prev
        if tv.columns != expect:
            out.append(
                Violation(
                    "job-intermediate-visible",
                    f"version {tv.version} ({job.kind} {job.column} of job {job.job_id}, step "
                    f"{step}) shows readers columns {list(tv.columns)}; the job's steps say "
                    f"{list(expect)}",
                    (f"job{job.job_id}", f"v{tv.version}"),
                )
            )
        if tv.pending.get(job.column) != state:
            out.append(
                Violation(
                    "job-pending",
                    f"version {tv.version} ({job.kind} {job.column} of job {job.job_id}, step "
                    f"{step}) holds the column as {tv.pending.get(job.column)!r}, not {state!r}",
                    (f"job{job.job_id}", f"v{tv.version}"),
                )
            )
        model[tv.version] = prev = expect
    return model, out


def check_schema_jobs(
    versions: Sequence[TableVersion],
    jobs: Sequence[JobRecord],
    reads: Iterable[JobSchemaRead],
    finished: Mapping[int, float],
    acknowledged: Mapping[int, str],
) -> list[Violation]:
    """Schema change jobs against the final history of their table (`job_model`), and every
    schema read of it, on any node:

    * a read at ts shows the version with the greatest Tu <= ts, with exactly that version's
      public columns (job-read: never an intermediate step's hidden column, never another
      version's shape; so every node agrees at every ts);
    * a `pin` gives writers the version's public columns followed by its write-only ones
      (job-write-schema: a writer would leave out a column the job needs filled);
    * a read at now sent after a job was seen `finished` (its last version in force on every
      node: `finished[job_id]`, when that answer came) shows that version or a later one
      (job-stale-read);
    * a job whose end was acknowledged (`acknowledged[job_id]`: "succeeded" or "cancelled")
      ended so in the final state, and a cancelled job's last version has its base version's
      columns (job-cancel-changed: a rollback that did not restore the shape)."""
    model, out = job_model(versions, jobs)
    by_version = {v.version: v for v in versions}
    by_tu = sorted((v.tu, v.version) for v in versions)
    tus = [tu for tu, _ in by_tu]
    by_id = {j.job_id: j for j in jobs}
    for job_id, status in acknowledged.items():
        job = by_id.get(job_id)
        if job is None or job.status != status:
            out.append(
                Violation(
                    "job-status",
                    f"job {job_id} was acknowledged {status} and ends "
                    f"{job.status if job else 'missing'}",
                    (f"job{job_id}",),
                )
            )
            continue
        if status == "cancelled":
            last = by_version.get(job.versions[-1])
            base = by_version.get(job.base_version)
            if last is None or base is None or last.columns != base.columns:
                out.append(
                    Violation(
                        "job-cancel-changed",
                        f"job {job_id} ({job.kind} {job.column}) was cancelled, yet its last "
                        f"version {job.versions[-1]} shows {last and list(last.columns)}, not "
                        f"the base version {job.base_version}'s {base and list(base.columns)}",
                        (f"job{job_id}",),
                    )
                )
    for read in reads:
        i = bisect.bisect_right(tus, read.ts)
        want = by_tu[i - 1][1] if i else None
        if read.version != want or read.columns != model.get(read.version):
            out.append(
                Violation(
                    "job-read",
                    f"{read.describe()}; the history has version {want} in force then, with "
                    f"columns {list(model.get(want, ())) if want else None}",
                    (read.name,),
                )
            )
        tv = by_version.get(read.version)
        if read.write_columns is not None and tv is not None:
            # What writers of the version write: the public columns, then the write-only ones.
            writes = (
                *model.get(read.version, ()),
                *(name for name, state in tv.pending.items() if state == "write_only"),
            )
            if read.write_columns != writes:
                out.append(
                    Violation(
                        "job-write-schema",
                        f"{read.describe()} gave writers columns {list(read.write_columns)}; "
                        f"its version's public and write-only columns are {list(writes)}",
                        (read.name,),
                    )
                )
        if not read.now:
            continue
        for job_id, t_finished in finished.items():
            job = by_id.get(job_id)
            if job and t_finished < read.t_sent and read.version < job.versions[-1]:
                out.append(
                    Violation(
                        "job-stale-read",
                        f"{read.describe()} was sent after job {job_id} was seen finished "
                        f"(at {t_finished:.3f}, its last version {job.versions[-1]} in force "
                        "on every node) and shows an older version",
                        (read.name, f"job{job_id}"),
                    )
                )
    return out


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """A session that ended without a release: by `mode` "ttl" (it stopped heartbeating) or
    "admin" (`session_expire`). `t_ended`: from then on it is surely over by real time (the
    expire acknowledged, or a heartbeat refused SESSION_NOT_FOUND), None if never known."""

    session_id: str
    mode: str
    t_ended: float | None


def check_session_expiry(
    ends: Iterable[SessionEnd],
    attempts: Iterable[tuple[str, str, float, float, str]],
    lease_lists: Iterable[tuple[str, int | None, float, float, tuple[tuple[int, bool], ...]]],
    blockers: Iterable[tuple[str, float, float, frozenset[str]]],
    margin_s: float,
) -> list[Violation]:
    """An ended session holds nothing and blocks nothing, on any node:

    * nothing it sends after it ended succeeds (sid, op, sent, answered, outcome): a
      heartbeat, a `pin` that would lease, a `session_open` of its id (expiry-resurrected: an
      expired session came back; its id is never reused);
    * a linearizable lease list sent after it ended (name, node, sent, answered, its leases as
      (version, expired)) shows none of its leases unexpired (expiry-lease-held);
    * a job's `waiting_for.blockers` asked `margin_s` after it ended (a node judges blockers by
      its own clock, which may trail the Tm that ended it) does not name it
      (expiry-still-blocks): after expiry, another session's change may proceed."""
    out: list[Violation] = []
    ended = {e.session_id: e for e in ends if e.t_ended is not None}
    for sid, op, sent, answered, outcome in attempts:
        e = ended.get(sid)
        if e is not None and e.t_ended is not None and sent > e.t_ended and outcome == "ok":
            out.append(
                Violation(
                    "expiry-resurrected",
                    f"session {sid} ended ({e.mode}) at {e.t_ended:.3f}; its {op} sent at "
                    f"{sent:.3f} was acknowledged at {answered:.3f}",
                    (sid, op),
                )
            )
    for name, node, sent, answered, leases in lease_lists:
        sid = name
        e = ended.get(sid)
        live = [v for v, expired in leases if not expired]
        if e is not None and e.t_ended is not None and sent > e.t_ended and live:
            out.append(
                Violation(
                    "expiry-lease-held",
                    f"session {sid} ended ({e.mode}) at {e.t_ended:.3f}; node {node}'s lease "
                    f"list (sent {sent:.3f}, answered {answered:.3f}) shows its lease on "
                    f"version(s) {live} unexpired",
                    (sid,),
                )
            )
    for what, sent, answered, named in blockers:
        for sid in sorted(named):
            e = ended.get(sid)
            if e is not None and e.t_ended is not None and sent > e.t_ended + margin_s:
                out.append(
                    Violation(
                        "expiry-still-blocks",
                        f"session {sid} ended ({e.mode}) at {e.t_ended:.3f}; {what} (sent "
                        f"{sent:.3f}, answered {answered:.3f}) still waits for its lease",
                        (sid, what),
                    )
                )
    return out


@dataclass(frozen=True, slots=True)
class VersionedWrite:
    """A commit to the jobs' table made with schema version `version`: ok (at `ts`), fail
    (`code`; a SCHEMA_VERSION_NOT_ACTIVE names the `ts` it was judged at and the versions it
    found active there) or unknown."""

    name: str
    version: int
    outcome: str
    ts: int | None = None
    code: str | None = None
    refused_ts: int | None = None
    refused_active: tuple[int, ...] | None = None


def active_versions(versions: Sequence[TableVersion], ts: int) -> tuple[int, ...]:
    """The two latest versions active at ts (greatest Tu <= ts and the one before it)."""
    active = [v.version for v in sorted(versions, key=lambda v: v.tu) if v.tu <= ts]
    return tuple(active[-2:])


def check_versioned_writes(
    versions: Sequence[TableVersion],
    jobs: Iterable[JobRecord],
    writes: Iterable[VersionedWrite],
    live_at_public: Mapping[int, Iterable[str]],
    version_of_path: Mapping[str, int],
) -> list[Violation]:
    """Commits to a table whose schema jobs run (DESIGN.md §4):

    * an acknowledged commit's version is one of the two latest active at its ts
      (write-stale-version); a SCHEMA_VERSION_NOT_ACTIVE refusal names the versions the
      history has active at the ts it names, and the commit's is not one of them
      (write-refused-wrongly);
    * when an ADD COLUMN ... NOT NULL job's column becomes public, no live file lacks it:
      every file live at its public version's Tu (`live_at_public[job_id]`) was written with
      the job's write-only version or a later one (`version_of_path`), so writers filled the
      column, or was rewritten by the backfill (backfill-missed: readers of the public
      version would find NULL in a NOT NULL column)."""
    out: list[Violation] = []
    for w in writes:
        if w.outcome == "ok" and w.ts is not None:
            active = active_versions(versions, w.ts)
            if w.version not in active:
                out.append(
                    Violation(
                        "write-stale-version",
                        f"commit {w.name} with schema version {w.version} was acknowledged at "
                        f"ts {w.ts}, where the history has versions {list(active)} active",
                        (w.name,),
                    )
                )
        if w.code == "SCHEMA_VERSION_NOT_ACTIVE" and w.refused_ts is not None:
            active = active_versions(versions, w.refused_ts)
            if w.version in active or (
                w.refused_active is not None and tuple(w.refused_active) != active
            ):
                out.append(
                    Violation(
                        "write-refused-wrongly",
                        f"commit {w.name} with schema version {w.version} was refused at ts "
                        f"{w.refused_ts} as not active (active: {w.refused_active}); the "
                        f"history has {list(active)} active there",
                        (w.name,),
                    )
                )
    by_id = {j.job_id: j for j in jobs}
    for job_id, paths in live_at_public.items():
        job = by_id.get(job_id)
        if job is None or job.kind != "add_column" or len(job.versions) < 2:
            continue
        write_only = job.versions[1]
        for path in sorted(paths):
            version = version_of_path.get(path)
            if version is None or version < write_only:
                out.append(
                    Violation(
                        "backfill-missed",
                        f"file {path} (written with version {version}) is live when job "
                        f"{job_id}'s column {job.column} becomes public (version "
                        f"{job.versions[-1]}); only files written with version {write_only} "
                        "or later have it",
                        (f"job{job_id}", path),
                    )
                )
    return out
