"""An in-memory cluster of Raft cores for tests: a network we control and disks that can lose
whatever was not yet persisted.

Each `MemNode` follows the `Ready` contract exactly as the real driver does, but "persisting" is
copying into `MemDisk`, and the state machine is a list of applied (index, tm, data). A crash
throws away the core and everything volatile, then rebuilds the node from its disk, so crash
recovery is exercised through the same constructor the real node uses.

This module is test support shipped with the package (the scenario runner, the simulation and
the benchmark's sanity checks use it); product code never imports it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import msgpack

from raft.core.raft import RaftCore
from raft.core.ready import CoreConfig, Ready
from raft.core.types import ConfState, Entry, EntryKind, HardState, Message, NodeId, Snapshot


@dataclass(slots=True)
class MemDisk:
    """What survives a crash."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot = field(default_factory=Snapshot)
    entries: list[Entry] = field(default_factory=list)

    def persist(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.snapshot = rd.snapshot
            self.entries = []
        if rd.entries:
            first = rd.entries[0].index
            keep = first - self.snapshot.meta.index - 1
            del self.entries[max(keep, 0) :]
            self.entries.extend(rd.entries)
        if rd.hard_state is not None:
            self.hard_state = rd.hard_state

    def compact(self, snapshot: Snapshot) -> None:
        drop = snapshot.meta.index - self.snapshot.meta.index
        if drop > 0:
            del self.entries[:drop]
            self.snapshot = snapshot


@dataclass(slots=True)
class Applied:
    index: int
    term: int
    tm: int
    data: bytes


class MemNode:
    def __init__(
        self, config: CoreConfig, bootstrap: ConfState, seed: int, disk: MemDisk | None = None
    ) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.disk = disk or MemDisk()
        self.seed = seed
        self.restarts = 0
        self.core = self._new_core()
        self.applied: list[Applied] = []
        self._restore_state_machine(self.disk.snapshot)

    @property
    def id(self) -> NodeId:
        return self.config.node_id

    def _new_core(self) -> RaftCore:
        return RaftCore(
            self.config,
            hard_state=self.disk.hard_state,
            snapshot=self.disk.snapshot,
            entries=list(self.disk.entries),
            bootstrap_conf=self.bootstrap,
            rng=random.Random(self.seed * 7919 + self.restarts),
        )

    def _restore_state_machine(self, snap: Snapshot) -> None:
        self.applied = []
        packed = snap.data
        if not isinstance(packed, bytes | memoryview):  # no files here: nothing is read
            raise TypeError("the in-memory cluster holds its snapshots in memory")
        if packed:
            for index, term, tm, data in msgpack.unpackb(packed):
                self.applied.append(Applied(index=index, term=term, tm=tm, data=data))

    def crash(self) -> None:
        """Lose everything volatile; restart from disk."""
        self.restarts += 1
        self.core = self._new_core()
        self._restore_state_machine(self.disk.snapshot)

    def take_snapshot(self, *, keep_entries: int = 0) -> Snapshot:
        """Snapshot the state machine at the applied index and compact the log behind it,
        keeping its newest `keep_entries` entries."""
        data = msgpack.packb([[a.index, a.term, a.tm, a.data] for a in self.applied])
        snap = self.core.create_snapshot(data)
        self.disk.compact(snap)
        self.core.compact_log(snap, keep_entries=keep_entries)
        return snap

    def handle_ready(self, *, persist: bool = True) -> tuple[list[Message], Ready | None]:
        """Run one Ready through the contract. Returns (messages to deliver, the ready).

        With persist=False the node crashes after receiving the Ready and before its write
        reached the disk: only the early messages escape, and the node restarts from disk.
        """
        if not self.core.has_ready():
            return [], None
        rd = self.core.ready()
        out: list[Message] = list(rd.early_messages)
        if not persist:
            self.crash()
            return out, rd
        self.disk.persist(rd)
        out.extend(rd.messages)
        if rd.snapshot is not None:
            self._restore_state_machine(rd.snapshot)
        for e in rd.committed:
            if e.kind is EntryKind.NORMAL:
                self.applied.append(Applied(index=e.index, term=e.term, tm=e.tm, data=e.data))
        self.core.advance(rd)
        return out, rd


class MemNetwork:
    """Nodes plus a message queue. Delivery order and loss are decided by the caller."""

    def __init__(
        self, n: int, *, seed: int = 0, config: CoreConfig | None = None, learners: int = 0
    ) -> None:
        base = config or CoreConfig(node_id=1)
        voters = tuple(range(1, n + 1))
        learner_ids = tuple(range(n + 1, n + 1 + learners))
        bootstrap = ConfState(voters=voters, learners=learner_ids)
        self.nodes: dict[NodeId, MemNode] = {}
        for i in (*voters, *learner_ids):
            cfg = CoreConfig(
                node_id=i,
                election_ticks=base.election_ticks,
                heartbeat_ticks=base.heartbeat_ticks,
                idle_tick_ticks=base.idle_tick_ticks,
                pre_vote=base.pre_vote,
                check_quorum=base.check_quorum,
                max_inflight_msgs=base.max_inflight_msgs,
                max_inflight_bytes=base.max_inflight_bytes,
                max_msg_bytes=base.max_msg_bytes,
                max_uncommitted_bytes=base.max_uncommitted_bytes,
            )
            self.nodes[i] = MemNode(cfg, bootstrap, seed=seed * 131 + i)
        self.queue: list[Message] = []
        self.now_tm = 1 << 16
        self.cut: set[frozenset[NodeId]] = set()  # links that drop everything
        self.down: set[NodeId] = set()

    def add_node(self, node_id: NodeId, seed: int = 0) -> MemNode:
        """A fresh node that joins with an empty log and no membership of its own."""
        any_cfg = next(iter(self.nodes.values())).config
        cfg = CoreConfig(
            node_id=node_id,
            election_ticks=any_cfg.election_ticks,
            heartbeat_ticks=any_cfg.heartbeat_ticks,
            idle_tick_ticks=any_cfg.idle_tick_ticks,
            pre_vote=any_cfg.pre_vote,
            check_quorum=any_cfg.check_quorum,
        )
        node = MemNode(cfg, ConfState(), seed=seed * 131 + node_id)
        self.nodes[node_id] = node
        return node

    def connected(self, a: NodeId, b: NodeId) -> bool:
        return a not in self.down and b not in self.down and frozenset((a, b)) not in self.cut

    def tick_tm(self, step: int = 1 << 16) -> int:
        self.now_tm += step
        return self.now_tm

    def collect(self) -> None:
        """Run every node's pending Ready and queue the resulting messages."""
        for node in self.nodes.values():
            if node.id in self.down:
                continue
            msgs, _ = node.handle_ready()
            self.queue.extend(msgs)

    def deliver_all(self, *, max_rounds: int = 1000) -> None:
        """Deliver until quiet (the 'stabilize' of etcd's tests)."""
        for _ in range(max_rounds):
            self.collect()
            if not self.queue:
                return
            batch, self.queue = self.queue, []
            for m in batch:
                if self.connected(m.src, m.dst) and m.dst in self.nodes:
                    self.nodes[m.dst].core.step(m)
        raise RuntimeError("network did not settle")

    def leader(self) -> NodeId:
        leaders = [
            n.id for n in self.nodes.values() if n.id not in self.down and n.core.is_leader()
        ]
        terms = {self.nodes[i].core.term for i in leaders}
        if not leaders:
            return 0
        top = max(terms)
        return next(i for i in leaders if self.nodes[i].core.term == top)
