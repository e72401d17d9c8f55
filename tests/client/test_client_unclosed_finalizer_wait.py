"""A dropped client's finalizer never holds up the thread that collects it.

A SyncMetastoreClient dropped without `close()` was shut down by its finalizer synchronously:
up to SYNC_CLOSE_TIMEOUT_MS for its calls to end and as long again for its loop thread, so a
garbage collection (in whatever thread ran it: a request handler, the Spark driver's callback
thread) could stall ~10 s. The finalizer now hands the shutdown to the client's own loop thread
and waits only a little for it; the connections are still closed and the thread still ends.

A MetastoreClient dropped without `aclose()` whose event loop no longer runs (stopped, or
closed without cancelling its tasks) had its connections' close queued on that loop, where it
never ran: the node kept them until its idle timeout. The finalizer now shuts their sockets
down directly when the loop cannot do it, so the node sees them go at once."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import warnings
from typing import Any

import pytest

from metastore.client import MetastoreClient, SyncMetastoreClient, protocol
from tests.client.fake_node import TOKEN, ThreadedFakeNode

# The slow call below ends only once the test lets it (at most ~60 s), and the shutdown may
# wait SYNC_CLOSE_TIMEOUT_MS (raised to 120 s) for it: a collection that waited for the call
# would take a minute. The finalizer's own wait is SYNC_FINALIZE_WAIT_MS (200 ms). A bound
# of 2 s failed once on a loaded machine (2.19 s, gc.collect included): it measured speed.
COLLECTION_SECONDS_MAX = 30.0


def test_collecting_an_unclosed_sync_client_with_a_slow_call_does_not_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(protocol, "SYNC_CLOSE_TIMEOUT_MS", 120_000)
    with ThreadedFakeNode() as fake:
        client = SyncMetastoreClient([fake.endpoint], TOKEN, timeout_ms=5000)
        client.status()
        loop, thread, inner = client._loop, client._thread, client._client
        connections = list(inner._connections.values())
        cancelled = threading.Event()
        may_end = threading.Event()

        async def slow_to_end() -> None:
            # A call whose cleanup takes a while once cancelled (the shutdown cancels it).
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                for _ in range(6_000):  # at most ~60 s
                    if may_end.is_set():
                        break
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0.01)
                raise

        slow = asyncio.run_coroutine_threadsafe(slow_to_end(), loop)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResourceWarning)
                started = time.monotonic()
                del client  # the last reference: finalized here, or by the collection
                gc.collect()
                collected_s = time.monotonic() - started
            assert collected_s < COLLECTION_SECONDS_MAX, collected_s
            unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
            assert len(unclosed) == 1 and "unclosed SyncMetastoreClient" in str(unclosed[0].message)
            # The shutdown still runs, in the client's loop thread: it cancelled the call...
            assert cancelled.wait(10)
        finally:
            may_end.set()
        # ...and, once the call ended, closed the connections and ended the thread.
        thread.join(10)
        assert not thread.is_alive()
        assert slow.cancelled()
        assert connections and all(not conn.is_open for conn in connections)


def test_an_unclosed_async_client_whose_loop_stopped_lets_its_connections_go() -> None:
    with ThreadedFakeNode() as fake:
        loop = asyncio.new_event_loop()
        try:
            clients: list[Any] = [MetastoreClient([fake.endpoint], TOKEN, timeout_ms=5000)]
            loop.run_until_complete(clients[0].status())
            assert fake._run(_open_connections(fake)) == 1
            # The loop no longer runs (run_until_complete returned): nothing queued on it runs.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResourceWarning)
                clients.clear()
                gc.collect()
            unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
            assert len(unclosed) == 1 and "unclosed MetastoreClient" in str(unclosed[0].message)
            # The node sees the connection end without the client's loop running again.
            assert fake._run(fake.node.wait_for_no_connections()) == 0
        finally:
            # Let the queued close and the read task end, as the loop would had it run on.
            loop.run_until_complete(_settle())
            loop.close()


async def _open_connections(fake: ThreadedFakeNode) -> int:
    return len(fake.node._writers)


async def _settle() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if tasks:
        await asyncio.wait(tasks, timeout=5)
