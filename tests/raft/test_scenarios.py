"""Datadriven scenarios for the Raft core: one file per topic in `tests/raft/testdata/`.

Each file drives an in-memory cluster (`raft.core.memnet.MemNode`s, which follow the Ready
contract and persist into a `MemDisk`) through `InteractionEnv` and prints what happened:
role changes, Readies (what is persisted, applied, sent), every message delivered, logs as
`index/term kind`, statuses. `pytest --rewrite` regenerates the expected outputs; review the
diff like code.

Verbs (arguments in `[]` are optional):

    add-nodes N [learners=K] [prevote=B] [checkquorum=B] [election=T] [max-msg-bytes=N]
    add-node ID                          a fresh node, empty log, no membership (to join)
    campaign ID
    propose ID DATA
    propose-conf ID voters=(..) [learners=(..)]
    transfer-leader FROM TO
    read-index ID CTX
    tick ID [N] [stabilize]   /   tick-all [N] [stabilize]
                                         every tick moves the HLC by 1 ms; `stabilize`
                                         settles the network after each tick
    process-ready ID... [crash=true]     crash=true: crash after ready(), before persisting
    deliver-msgs [ID...] [drop=(ids)]    deliver what is queued (to ID..., or to everyone)
    stabilize [ID...] [quiet]            readies and deliveries until nothing moves
    partition (1,2) (3)   /   heal
    crash ID                             lose everything not persisted, restart from disk
    compact ID                           snapshot the state machine, compact the log
    status ID   /   raft-log ID   /   applied ID
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raft.core.conf import decode_conf
from raft.core.errors import RaftCoreError
from raft.core.memnet import MemNode
from raft.core.ready import CoreConfig, Ready, Role
from raft.core.types import (
    AppendEntries,
    AppendResponse,
    ConfState,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    NodeId,
    RequestVote,
    TimeoutNow,
    VoteResponse,
)
from tests.raft.datadriven import (
    Arg,
    DatadrivenError,
    Directive,
    ScenarioMismatch,
    parse,
    render,
    run_file,
)

TESTDATA = Path(__file__).parent / "testdata"

# Rounds of `stabilize` before we call the cluster livelocked.
STABILIZE_ROUNDS_MAX = 1_000
_TM_LOGICAL_BITS = 16
_START_MS = 1_000


# ============================================================================ formatting


def fmt_tm(tm: int) -> str:
    return f"{tm >> _TM_LOGICAL_BITS}.{tm & ((1 << _TM_LOGICAL_BITS) - 1)}"


def fmt_ids(ids: tuple[NodeId, ...]) -> str:
    return "(" + ",".join(str(i) for i in ids) + ")"


def fmt_conf(conf: ConfState) -> str:
    return f"voters={fmt_ids(conf.voters)} learners={fmt_ids(conf.learners)}"


def fmt_entry(e: Entry, *, tm: bool = False) -> str:
    match e.kind:
        case EntryKind.NORMAL:
            body = f'"{e.data.decode(errors="replace")}"'
        case EntryKind.CONF:
            body = f"conf {fmt_conf(decode_conf(e.data))}"
        case _:
            body = e.kind.name.lower()
    out = f"{e.index}/{e.term} {body}"
    return f"{out} tm={fmt_tm(e.tm)}" if tm else out


def fmt_entries(entries: tuple[Entry, ...] | list[Entry]) -> str:
    return "[" + ", ".join(fmt_entry(e) for e in entries) + "]"


def fmt_msg(m: Message) -> str:
    head = f"{m.src}->{m.dst}"
    match m:
        case AppendEntries():
            return (
                f"{head} MsgApp term={m.term} prev={m.prev_index}/{m.prev_term} "
                f"commit={m.commit} {fmt_entries(m.entries)}"
            )
        case AppendResponse():
            if m.reject:
                return (
                    f"{head} MsgAppResp term={m.term} reject index={m.index} "
                    f"hint={m.reject_hint}/{m.reject_term}"
                )
            return f"{head} MsgAppResp term={m.term} index={m.index}"
        case RequestVote():
            kind = "MsgPreVote" if m.pre_vote else "MsgVote"
            force = " force" if m.force else ""
            return f"{head} {kind} term={m.term} last={m.last_index}/{m.last_term}{force}"
        case VoteResponse():
            kind = "MsgPreVoteResp" if m.pre_vote else "MsgVoteResp"
            verdict = "granted" if m.granted else "rejected"
            return f"{head} {kind} term={m.term} {verdict}"
        case Heartbeat():
            ctx = f" ctx={m.read_ctx}" if m.read_ctx else ""
            return f"{head} MsgHeartbeat term={m.term} commit={m.commit}{ctx}"
        case HeartbeatResponse():
            ctx = f" ctx={m.read_ctx}" if m.read_ctx else ""
            return f"{head} MsgHeartbeatResp term={m.term}{ctx}"
        case InstallSnapshot():
            meta = m.snapshot.meta
            snap = f"snapshot={meta.index}/{meta.term} {fmt_conf(meta.conf)}"
            return f"{head} MsgSnap term={m.term} {snap}"
        case TimeoutNow():
            return f"{head} MsgTimeoutNow term={m.term}"


# ============================================================================ environment


class InteractionEnv:
    """A cluster of `MemNode`s with one FIFO message queue we deliver by hand."""

    def __init__(self) -> None:
        self.nodes: dict[NodeId, MemNode] = {}
        self.queue: list[Message] = []
        self.groups: dict[NodeId, int] = {}
        self.now_tm = _START_MS << _TM_LOGICAL_BITS
        self.base: CoreConfig | None = None
        self._seen: dict[NodeId, tuple[Role, int, NodeId]] = {}
        self.out: list[str] = []

    # ---- dispatch --------------------------------------------------------------------------

    def handle(self, d: Directive) -> str:
        self.out = []
        handler = getattr(self, "cmd_" + d.cmd.replace("-", "_"), None)
        if handler is None:
            raise DatadrivenError(f"{d.pos}: unknown command {d.cmd!r}")
        handler(d)
        return "\n".join(self.out)

    def _node(self, d: Directive, nid: NodeId) -> MemNode:
        node = self.nodes.get(nid)
        if node is None:
            raise DatadrivenError(f"{d.pos}: no node {nid}")
        return node

    def _ids(self, d: Directive) -> list[NodeId]:
        return d.numbers() or sorted(self.nodes)

    def emit(self, line: str) -> None:
        self.out.append(line)

    def _note_changes(self, indent: str = "  ") -> None:
        """Print every node whose role, term or known leader changed since last time."""
        for nid in sorted(self.nodes):
            core = self.nodes[nid].core
            now = (core.role, core.term, core.leader)
            if self._seen.get(nid) != now:
                self._seen[nid] = now
                leader = f" leader={core.leader}" if core.leader else ""
                self.emit(f"{indent}n{nid} is {core.role.value} term={core.term}{leader}")

    def _tick_clock(self) -> int:
        self.now_tm += 1 << _TM_LOGICAL_BITS
        return self.now_tm

    # ---- building the cluster ----------------------------------------------------------------

    def cmd_add_nodes(self, d: Directive) -> None:
        if self.nodes:
            raise DatadrivenError(f"{d.pos}: add-nodes runs once; use add-node to join")
        n = d.int_pos(0)
        learners = d.int_arg("learners", 0)
        self.base = CoreConfig(
            node_id=1,
            election_ticks=d.int_arg("election", 10),
            heartbeat_ticks=d.int_arg("heartbeat", 1),
            idle_tick_ticks=d.int_arg("idle-tick", 1_000_000),
            pre_vote=d.bool_arg("prevote", True),
            check_quorum=d.bool_arg("checkquorum", True),
            max_msg_bytes=d.int_arg("max-msg-bytes", 1024 * 1024),
        )
        bootstrap = ConfState(
            voters=tuple(range(1, n + 1)), learners=tuple(range(n + 1, n + learners + 1))
        )
        for nid in bootstrap.members():
            self._spawn(nid, bootstrap)
        b = self.base
        self.emit(
            f"{fmt_conf(bootstrap)} election={b.election_ticks} heartbeat={b.heartbeat_ticks} "
            f"prevote={str(b.pre_vote).lower()} checkquorum={str(b.check_quorum).lower()}"
        )
        self._note_changes(indent="")

    def _spawn(self, nid: NodeId, bootstrap: ConfState) -> None:
        if self.base is None:
            raise DatadrivenError("add-nodes first")
        b = self.base
        cfg = CoreConfig(
            node_id=nid,
            election_ticks=b.election_ticks,
            heartbeat_ticks=b.heartbeat_ticks,
            idle_tick_ticks=b.idle_tick_ticks,
            pre_vote=b.pre_vote,
            check_quorum=b.check_quorum,
            max_msg_bytes=b.max_msg_bytes,
        )
        self.nodes[nid] = MemNode(cfg, bootstrap, seed=nid)

    def cmd_add_node(self, d: Directive) -> None:
        nid = d.int_pos(0)
        if nid in self.nodes:
            raise DatadrivenError(f"{d.pos}: node {nid} exists")
        self._spawn(nid, ConfState())
        self.emit(f"n{nid} added with an empty log and no membership")
        self._note_changes(indent="")

    # ---- inputs ------------------------------------------------------------------------------

    def cmd_campaign(self, d: Directive) -> None:
        self._node(d, d.int_pos(0)).core.campaign()
        self._note_changes(indent="")

    def cmd_tick(self, d: Directive) -> None:
        """`tick ID [N] [stabilize]`: with `stabilize`, the network settles after every tick
        (time passing on a healthy network), printing only state changes and applies."""
        nums = d.numbers()
        if not nums:
            raise DatadrivenError(f"{d.pos}: tick ID [N]")
        node = self._node(d, nums[0])
        for _ in range(nums[1] if len(nums) > 1 else 1):
            node.core.tick(self._tick_clock())
            self._note_changes(indent="")
            if d.has("stabilize"):
                self._stabilize(sorted(self.nodes), quiet=True, pos=d.pos)

    def cmd_tick_all(self, d: Directive) -> None:
        nums = d.numbers()
        for _ in range(nums[0] if nums else 1):
            tm = self._tick_clock()
            for nid in sorted(self.nodes):
                self.nodes[nid].core.tick(tm)
            self._note_changes(indent="")
            if d.has("stabilize"):
                self._stabilize(sorted(self.nodes), quiet=True, pos=d.pos)

    def cmd_propose(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        words = d.positional()
        if len(words) != 2:
            raise DatadrivenError(f"{d.pos}: propose ID DATA")
        try:
            term, index = node.core.propose(words[1].encode(), self.now_tm)
        except RaftCoreError as e:
            self.emit(f"error {e.code}: {e}")
            return
        self.emit(f'n{node.id} proposed "{words[1]}" as {index}/{term}')

    def cmd_propose_conf(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        conf = ConfState(voters=d.ints("voters") or (), learners=d.ints("learners") or ())
        try:
            term, index = node.core.propose_conf(conf, self.now_tm)
        except RaftCoreError as e:
            self.emit(f"error {e.code}: {e}")
            return
        self.emit(f"n{node.id} proposed {fmt_conf(conf)} as {index}/{term}")

    def cmd_transfer_leader(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        try:
            node.core.transfer_leader(d.int_pos(1))
        except RaftCoreError as e:
            self.emit(f"error {e.code}: {e}")
            return
        self.emit(f"n{node.id} transfers leadership to n{d.int_pos(1)}")

    def cmd_read_index(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        try:
            node.core.read_index(d.int_pos(1))
        except RaftCoreError as e:
            self.emit(f"error {e.code}: {e}")
            return
        self.emit(f"n{node.id} started read ctx={d.int_pos(1)}")

    # ---- Ready handling and the network -----------------------------------------------------

    def cmd_process_ready(self, d: Directive) -> None:
        crash = d.bool_arg("crash", False)
        for nid in self._ids(d):
            self._process_ready(self._node(d, nid), crash=crash, verbose=True)

    def _process_ready(self, node: MemNode, *, crash: bool, verbose: bool) -> bool:
        before = (node.core.role, node.core.term, node.core.leader)
        msgs, rd = node.handle_ready(persist=not crash)
        if rd is None:
            if verbose:
                self.emit(f"n{node.id}: no Ready")
            return False
        if crash:
            self.emit(
                f"n{node.id} crashed before persisting its Ready; "
                f"{len(msgs)} early message(s) escaped"
            )
            self._send(msgs, verbose=verbose)
            self._describe_restart(node)
            self._note_changes()
            return True
        if verbose:
            self._describe_ready(node, rd)
        else:
            self._describe_ready_brief(node, rd)
        self._send(msgs, verbose=verbose)
        if (node.core.role, node.core.term, node.core.leader) != before or verbose:
            self._note_changes()
        return True

    def _describe_ready(self, node: MemNode, rd: Ready) -> None:
        self.emit(f"n{node.id} Ready:")
        if rd.hard_state is not None:
            hs = rd.hard_state
            self.emit(f"  persist state: term={hs.term} vote={hs.vote} commit={hs.commit}")
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            self.emit(f"  persist snapshot {meta.index}/{meta.term} {fmt_conf(meta.conf)}")
        if rd.entries:
            self.emit(f"  persist entries {fmt_entries(rd.entries)}")
        if rd.early_messages:
            self.emit(f"  sent before persisting: {len(rd.early_messages)} message(s)")
        if rd.messages:
            self.emit(f"  sent after persisting: {len(rd.messages)} message(s)")
        if rd.committed:
            self.emit(f"  apply {fmt_entries(rd.committed)}")
        for rs in rd.read_states:
            self.emit(f"  read ctx={rs.ctx} ready at index {rs.index}")
        for ctx in rd.dropped_reads:
            self.emit(f"  read ctx={ctx} dropped (no longer leader)")

    def _describe_ready_brief(self, node: MemNode, rd: Ready) -> None:
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            self.emit(f"  n{node.id} installs snapshot {meta.index}/{meta.term}")
        if rd.committed:
            self.emit(f"  n{node.id} applies {fmt_entries(rd.committed)}")
        for rs in rd.read_states:
            self.emit(f"  n{node.id} read ctx={rs.ctx} ready at index {rs.index}")
        for ctx in rd.dropped_reads:
            self.emit(f"  n{node.id} read ctx={ctx} dropped (no longer leader)")

    def _send(self, msgs: list[Message], *, verbose: bool) -> None:
        """Queue messages; those across a partition are lost at once (and said so)."""
        lost: dict[str, int] = {}
        for m in msgs:
            if self._connected(m.src, m.dst):
                self.queue.append(m)
            else:
                key = f"{m.src}->{m.dst} {fmt_msg(m).split()[1]}"
                lost[key] = lost.get(key, 0) + 1
        if lost and verbose:
            self.emit(
                "  lost to the partition: "
                + ", ".join(k + (f" x{n}" if n > 1 else "") for k, n in lost.items())
            )

    def _connected(self, a: NodeId, b: NodeId) -> bool:
        return self.groups.get(a, 0) == self.groups.get(b, 0)

    def _deliver(self, m: Message, *, drop: bool, verbose: bool) -> None:
        if drop:
            if verbose:
                self.emit(f"  dropped {fmt_msg(m)}")
            return
        if not self._connected(m.src, m.dst) or m.dst not in self.nodes:
            if verbose:
                self.emit(f"  lost (partition) {fmt_msg(m)}")
            return
        if verbose:
            self.emit(f"  {fmt_msg(m)}")
        self.nodes[m.dst].core.step(m)
        self._note_changes(indent="    " if verbose else "  ")

    def cmd_deliver_msgs(self, d: Directive) -> None:
        to = set(self._ids(d))
        drop = set(d.ints("drop") or ())
        batch = [m for m in self.queue if m.dst in to or m.dst in drop]
        self.queue = [m for m in self.queue if not (m.dst in to or m.dst in drop)]
        if not batch:
            self.emit("no messages")
        for m in batch:
            self._deliver(m, drop=m.dst in drop, verbose=True)

    def cmd_stabilize(self, d: Directive) -> None:
        quiet = d.has("quiet")
        readies, delivered = self._stabilize(self._ids(d), quiet=quiet, pos=d.pos)
        if quiet:
            self.emit(f"stable after {readies} Readies and {delivered} messages")

    def _stabilize(self, ids: list[NodeId], *, quiet: bool, pos: str) -> tuple[int, int]:
        readies = delivered = 0
        for _ in range(STABILIZE_ROUNDS_MAX):
            moved = False
            for nid in ids:
                node = self.nodes[nid]
                if node.core.has_ready():
                    moved = True
                    readies += 1
                    self._process_ready(node, crash=False, verbose=not quiet)
            batch = [m for m in self.queue if m.dst in ids]
            self.queue = [m for m in self.queue if m.dst not in ids]
            if batch and not quiet:
                self.emit("deliver:")
            for m in batch:
                moved = True
                delivered += 1
                self._deliver(m, drop=False, verbose=not quiet)
            if not moved:
                return readies, delivered
        raise DatadrivenError(f"{pos}: no quiet after {STABILIZE_ROUNDS_MAX} rounds")

    def cmd_partition(self, d: Directive) -> None:
        groups = d.groups()
        self.groups = {}
        for g, members in enumerate(groups):
            for nid in members:
                self.groups[int(nid)] = g
        self.emit("partitioned: " + " | ".join(fmt_ids(tuple(int(x) for x in g)) for g in groups))

    def cmd_heal(self, d: Directive) -> None:
        self.groups = {}
        self.emit("healed")

    # ---- crashes and compaction --------------------------------------------------------------

    def cmd_crash(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        node.crash()
        self.emit(f"n{node.id} crashed")
        self._describe_restart(node)
        self._note_changes()

    def _describe_restart(self, node: MemNode) -> None:
        disk = node.disk
        hs = disk.hard_state
        first = disk.entries[0].index if disk.entries else disk.snapshot.meta.index + 1
        last = disk.entries[-1].index if disk.entries else disk.snapshot.meta.index
        meta = disk.snapshot.meta
        self.emit(
            f"  restarted from disk: term={hs.term} vote={hs.vote} commit={hs.commit} "
            f"snapshot={meta.index}/{meta.term} entries={first}..{last}"
        )

    def cmd_compact(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        snap = node.take_snapshot()
        meta = snap.meta
        self.emit(
            f"n{node.id} snapshot at {meta.index}/{meta.term} (safe time {fmt_tm(meta.tm)}), "
            f"log now starts at {node.core.log.first_index()}"
        )

    # ---- inspection --------------------------------------------------------------------------

    def cmd_status(self, d: Directive) -> None:
        for nid in self._ids(d):
            st = self._node(d, nid).core.status()
            self.emit(
                f"n{nid}: {st.role.value} term={st.term} leader={st.leader} "
                f"commit={st.commit_index} applied={st.applied_index} last={st.last_index} "
                f"snapshot={st.snapshot_index} safe_time={fmt_tm(st.safe_time)}"
                + (" caught_up" if st.caught_up else "")
            )
            self.emit(f"  conf {fmt_conf(st.conf)}")
            if st.transferee:
                self.emit(f"  transferring leadership to n{st.transferee}")
            for peer, pr in sorted(st.progress.items()):
                learner = " learner" if pr.is_learner else ""
                self.emit(
                    f"  n{peer}: {pr.state} match={pr.match} next={pr.next}{learner}"
                    + ("" if pr.recent_active or peer == nid else " inactive")
                )

    def cmd_raft_log(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        log = node.core.log
        if log.snapshot.index:
            self.emit(f"snapshot {log.snapshot.index}/{log.snapshot.term}")
        entries = log.slice(log.first_index(), log.last_index() + 1)
        if not entries and not log.snapshot.index:
            self.emit("empty")
        for e in entries:
            marks = []
            if e.index <= log.committed:
                marks.append("committed")
            if e.index > log.stable_index:
                marks.append("unpersisted")
            suffix = f" ({', '.join(marks)})" if marks else ""
            self.emit(fmt_entry(e, tm=True) + suffix)

    def cmd_applied(self, d: Directive) -> None:
        node = self._node(d, d.int_pos(0))
        core = node.core
        items = " ".join(f'{a.index}/{a.term}:"{a.data.decode()}"' for a in node.applied)
        self.emit(
            f"n{node.id} applied index {core.log.applied}, safe time "
            f"{fmt_tm(core.applied_tm)}, commands: {items or 'none'}"
        )


# ============================================================================ the tests


def _scenario_files() -> list[Path]:
    return sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", _scenario_files(), ids=lambda p: p.stem)
def test_scenario(path: Path, request: pytest.FixtureRequest) -> None:
    env = InteractionEnv()
    run_file(path, env.handle, rewrite=bool(request.config.getoption("--rewrite")))


@pytest.mark.parametrize("path", _scenario_files(), ids=lambda p: p.stem)
def test_scenario_file_is_canonical(path: Path) -> None:
    """Rewriting a file with its own expected outputs must not change it, so `--rewrite`
    diffs show only real output changes."""
    text = path.read_text()
    cases = parse(text, path.name)
    assert render(text, cases, [c.expected for c in cases]) == text


def test_every_topic_has_a_file() -> None:
    topics = {
        "election",
        "prevote",
        "checkquorum",
        "log_conflict",
        "commit_figure8",
        "snapshot",
        "membership",
        "transfer_leader",
        "read_index",
        "crash_recovery",
    }
    assert topics <= {p.stem for p in _scenario_files()}


# ---- the runner itself ----------------------------------------------------------------------


_SAMPLE = """\
# a comment
echo a=1 b=(x, y) (1,2) word
input line
----
a=1 b=x,y

echo
----
----
one

two
----
----

echo empty
----
"""


def _echo(d: Directive) -> str:
    if d.positional() == ["empty"]:
        return ""
    if d.input:
        named = [a for a in d.args if a.vals and "(" not in a.key]
        return " ".join(f"{a.key}={','.join(a.vals)}" for a in named)
    return "one\n\ntwo"


def test_parse_reads_arguments_input_and_both_output_forms() -> None:
    cases = parse(_SAMPLE, "sample.txt")
    assert [c.cmd for c in cases] == ["echo", "echo", "echo"]
    first = cases[0]
    assert first.pos == "sample.txt:2"
    assert first.get("a") is not None
    assert first.int_arg("a", 0) == 1
    assert first.get("b") == Arg(key="b", vals=("x", "y"))
    assert first.groups() == [("1", "2")]
    assert first.positional() == ["word"]
    assert first.input == "input line"
    assert cases[1].expected == "one\n\ntwo"
    assert cases[2].expected == ""


def test_run_file_passes_and_reports_mismatch_with_position(tmp_path: Path) -> None:
    path = tmp_path / "sample.txt"
    path.write_text(_SAMPLE)
    run_file(path, _echo)
    path.write_text(_SAMPLE.replace("a=1 b=x,y", "a=2 b=x,y"))
    with pytest.raises(ScenarioMismatch, match=r"sample.txt:2: output of `echo` differs"):
        run_file(path, _echo)


def test_rewrite_fixes_outputs_and_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "sample.txt"
    broken = _SAMPLE.replace("a=1 b=x,y", "stale").replace("one\n\ntwo", "old")
    path.write_text(broken)
    run_file(path, _echo, rewrite=True)
    assert path.read_text() == _SAMPLE


def test_malformed_files_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(DatadrivenError, match="without"):
        parse("cmd\ninput but no separator", "bad.txt")
    with pytest.raises(DatadrivenError, match="blank line"):
        parse("cmd\n\n----\n", "bad.txt")
    with pytest.raises(DatadrivenError, match="not closed"):
        parse("cmd\n----\n----\noutput\n", "bad.txt")
    path = tmp_path / "bad.txt"
    path.write_text("nosuchverb\n----\n\n")
    with pytest.raises(DatadrivenError, match="unknown command"):
        run_file(path, InteractionEnv().handle)
