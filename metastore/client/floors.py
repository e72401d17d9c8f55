"""Read-your-writes and monotonic-read positions, shared by every client of one process.

Key idea
    A read without a timestamp is answered at the answering node's now or safe time, which
    trail each other between nodes (docs/protocol.md, "Monotonic reads"). A client sends the
    newest position it must not read below as `min_ts`: its own newest write (`own_writes_ts`:
    a commit's ts, a DDL's Tu, a `read_ts`) and the newest positions its answers were read at
    (`read_floor_ts` for reads of the applied state, `schema_floor_ts` for schema reads at
    now). A Spark driver holds several client objects of one cluster (each bridge's, the
    caller's own, a streaming query's next to a separate reader): kept per object, a second
    client missed the first one's commit, or read an older state than the first had seen.
    So the positions live here, one `ReadFloors` per cluster id (the `cluster_id` of the
    nodes' `hello`), shared by every `MetastoreClient` of the process: a position any of them
    raised is a floor for all of them. The guarantees are the process's: one session.

Scope
    * Different clusters never share floors: the key is the cluster id, which every node of a
      cluster reports alike and a restored copy changes. Two clusters configured with the same
      id (`metastore cluster init` names one after its directory) would share them: that costs
      waits, never a wrong answer (a floor is only a lower bound of a read position; a node
      waits until its safe time passes it, bounded like every read, and one too far ahead of
      its clock is refused and lowered, below). Give clusters distinct ids.
    * Other processes report through floor sources (`add_floor_source`): a data source's
      `commit()` runs in a Python worker process of the driver's host (spark_bridge.datasource)
      and leaves its commit's position in the directory of the driver's session keeper
      (spark_bridge.keeper), which this process's keeper registers as a source; every lookup
      of a cluster's floors takes in what the sources hold first, so a bridge batch right
      after such an append reads at or above it. Spark executors (they only heartbeat) and
      processes on other hosts are not covered: `read_ts()` gives a linearizable position
      instead (the leader's; it raises this process's `own_writes_ts`).
    * A client whose nodes answered `hello` without a cluster id keeps private floors.

Lowering
    A floor no node can read at (it came from a node whose clock ran past CSmax of the others;
    TIMESTAMP_AHEAD_OF_CLOCK for the floor itself) is lowered to what the refusing node can
    answer (`lower_if`), as one client did for itself: one read fails, not every read until
    real time catches up. The shared floor is lowered for the whole process, and only while it
    still is the refused position (a client that meanwhile raised it to a newer, reachable one
    keeps it). That gives up monotonic reads above the lowered position for every client of
    the process alike, which is the price one client paid alone before; lowering it for one
    client only would leave the others failing the same way. `own_writes_ts` is never lowered
    (a commit lands at most DD above its entry's Tm, which every node can wait for).

Threads
    Every read and update holds the instance's lock (clients run on their own event loops, in
    several threads: py4j callbacks, streaming queries, a data source's planning).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final, Literal

__all__ = [
    "FloorKind",
    "FloorNote",
    "ReadFloors",
    "add_floor_source",
    "forget_shared_floors",
    "remove_floor_source",
    "shared_floors",
]

FloorKind = Literal["own_writes", "read", "schema"]
_KINDS: Final = ("own_writes", "read", "schema")


class ReadFloors:
    """Three monotonic maxima (`own_writes_ts`, `read_floor_ts`, `schema_floor_ts`); only
    `lower_if` moves one down. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ts: dict[str, int] = dict.fromkeys(_KINDS, 0)

    @property
    def own_writes_ts(self) -> int:
        with self._lock:
            return self._ts["own_writes"]

    @property
    def read_floor_ts(self) -> int:
        with self._lock:
            return self._ts["read"]

    @property
    def schema_floor_ts(self) -> int:
        with self._lock:
            return self._ts["schema"]

    def files_floor_ts(self) -> int:
        """The newer of `own_writes_ts` and `read_floor_ts`, read together."""
        with self._lock:
            return max(self._ts["own_writes"], self._ts["read"])

    def raise_to(self, kind: FloorKind, ts: int) -> None:
        """Raise `kind` to `ts` (no change if it already is at or above it)."""
        with self._lock:
            if ts > self._ts[kind]:
                self._ts[kind] = ts

    def lower_if(self, kind: Literal["read", "schema"], expected: int, lowered: int) -> bool:
        """Lower `kind` to `lowered` if it still is `expected` (compare and set); whether it
        was."""
        with self._lock:
            if self._ts[kind] != expected or lowered >= expected:
                return False
            self._ts[kind] = lowered
            return True


_registry_lock = threading.Lock()
_registry: dict[str, ReadFloors] = {}


# A position another process reached in a cluster: (cluster id, kind, ts).
FloorNote = tuple[str, FloorKind, int]
# Callables that hand over (and forget) the positions other processes left for this one
# (module docstring, "Scope"). Called without any lock held, possibly from several threads at
# once: a note must be handed over at least once, and raising a floor twice is harmless.
_sources_lock = threading.Lock()
_sources: list[Callable[[], Iterable[FloorNote]]] = []


def add_floor_source(source: Callable[[], Iterable[FloorNote]]) -> None:
    """Take in what `source` returns at every lookup of a cluster's floors from now on."""
    with _sources_lock:
        if source not in _sources:
            _sources.append(source)


def remove_floor_source(source: Callable[[], Iterable[FloorNote]]) -> None:
    with _sources_lock:
        if source in _sources:
            _sources.remove(source)


def _floors(cluster_id: str) -> ReadFloors:
    with _registry_lock:
        floors = _registry.get(cluster_id)
        if floors is None:
            floors = _registry[cluster_id] = ReadFloors()
        return floors


def _take_in_sources() -> None:
    with _sources_lock:
        sources = list(_sources)
    for source in sources:
        for cluster_id, kind, ts in source():
            _floors(cluster_id).raise_to(kind, ts)


def shared_floors(cluster_id: str) -> ReadFloors:
    """The floors every client of this process shares for the cluster `cluster_id`, with what
    the floor sources hold taken in first."""
    if _sources:
        _take_in_sources()
    return _floors(cluster_id)


def forget_shared_floors(*, keep_prefix: str | None = None) -> None:
    """Drop the shared floors of every cluster, or of those whose id does not start with
    `keep_prefix` (tests: fake nodes and clusters of one test process reuse cluster ids).
    Clients created afterwards, and existing ones at their next call, start from zero."""
    with _registry_lock:
        for cluster_id in list(_registry):
            if keep_prefix is None or not cluster_id.startswith(keep_prefix):
                del _registry[cluster_id]
