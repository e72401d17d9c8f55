"""The node process's policy for Python's cyclic garbage collector: the catalog's long-lived
objects are frozen out of its scans, so its full collections stop holding the event loop.

Why: a node's state is mostly objects that live until a commit replaces them (a million file
entries in a table at the loose-entry bound: about a million tracked objects). The collector's
full (generation 2) collection walks every tracked object, 0.2-0.3 s at that size, and starts
wherever an allocation triggers it (whenever the long-lived objects grew by a quarter since the
last one: about every 25 commits of 10,000 files). It runs on the event loop that answers
heartbeats, so a leader can miss its quorum check and a follower can campaign (the election
timeout is 300 ms). `gc.freeze()` moves every tracked object into the permanent generation,
which no collection scans; frozen objects freed by their reference count are still freed.

What is never collected while frozen is cyclic garbage among frozen objects. The catalog's
state forms no reference cycles (tests/daemon/test_collector.py drops, overwrites and replaces
whole states and finds nothing unreachable), but other objects of the process do (sqlglot
trees, tracebacks, protocol <-> transport): any such object alive at a freeze and dropped later
would stay. So each freeze first unfreezes, collects everything (one full collection: the
garbage of the whole interval, frozen or not, goes) and freezes again (`refreeze`): what leaks
is at most what became cyclic garbage since the last refreeze, and the next one reclaims it.

When: after the state is restored (at start, from a leader's snapshot), once the node started
(the log replayed on top), and after each snapshot taken (once its file is written). A restore
holds the loop for work proportional to the state anyway, so there the one full collection
adds a fraction to a pause that is there anyway, instead of pauses of its own every ~25
commits. A snapshot taken no longer does (its encode runs in a thread: raft.node
`prepare_snapshot`), so after one the refreeze is a pause of its own: ~0.2 s at a million
file entries (docs/benchmarks.md, "Snapshot encode off the loop"), once per
`snapshot_every_entries` rather than every ~25 large commits.
A snapshot installed from the leader is the exception: it is decoded in a worker thread with
the collector `paused`, then frozen there without a collection (`freeze_decoded`), because a
collection over the new state would hold the GIL, and so the loop, for a fifth of a second at a
million file entries, the very stall the thread is there to avoid. Its cyclic garbage waits
for the next refreeze. Between them the collector runs by its default thresholds and scans only
what was allocated since the last refreeze. No setting: there is nothing an operator would
trade here.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("metastore.collector")


def refreeze() -> None:
    """Collect all cyclic garbage, the frozen included, then freeze what is left."""
    started = time.perf_counter()
    gc.unfreeze()
    unreachable = gc.collect()
    gc.freeze()
    log.debug(
        "heap refrozen",
        extra={
            "frozen_objects": gc.get_freeze_count(),
            "unreachable": unreachable,
            "seconds": round(time.perf_counter() - started, 4),
        },
    )


@contextmanager
def paused() -> Iterator[None]:
    """Automatic collections off while the block runs (a worker thread decoding a snapshot).

    The decode allocates millions of objects and drops almost none, so a collection finds
    nothing to free, yet it traverses the new state as it grows, holding the GIL: a full one
    stalled the event loop for half a second of a 990k-entry restore. The refreeze that
    follows the install collects whatever cyclic garbage the process made meanwhile (the
    loop's too: process-wide, as the collector is)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def freeze_decoded() -> None:
    """Freeze the heap without a collection: a snapshot just decoded in a worker thread while
    the collector was `paused` (the node installs it next, in place of its old state).

    Everything allocated during the decode is still in the youngest generation, so the first
    automatic collection after `paused` traverses all of it (0.18 s at 990k entries), and a
    `refreeze` on the loop a full collection of it (0.2-0.27 s): either stalls the loop. A
    freeze costs nothing. The cyclic garbage frozen with it (made since the last refreeze) is
    collected at the next refreeze, after the next snapshot taken; the old state needs no
    collection (it forms no cycles: freed by reference counts when it is replaced)."""
    gc.freeze()


__all__ = ["freeze_decoded", "paused", "refreeze"]
