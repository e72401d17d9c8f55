"""A client dropped without `close()`/`aclose()` releases what it holds, with a ResourceWarning
(as Python's own unclosed files do), instead of leaking its loop thread and connections for
the life of the process (a script or a Spark driver making clients in a loop)."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from typing import Any

import pytest

from metastore.client import MetastoreClient, SyncMetastoreClient
from tests.client.fake_node import TOKEN, FakeNode, ThreadedFakeNode

CLIENTS = 5


def _client_loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "metastore-client-loop"]


def test_unclosed_sync_clients_release_their_threads_and_connections() -> None:
    with ThreadedFakeNode() as fake:
        before = set(_client_loop_threads())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for _ in range(CLIENTS):
                client = SyncMetastoreClient([fake.endpoint], TOKEN, timeout_ms=5000)
                client.status()  # opens a connection (and its read task)
                del client
                gc.collect()
        # The finalizer hands the shutdown to each client's loop thread (it waits only
        # briefly): each thread ends once its shutdown is done.
        for thread in set(_client_loop_threads()) - before:
            thread.join(10)
        leaked = [t for t in set(_client_loop_threads()) - before if t.is_alive()]
        assert leaked == [], f"{len(leaked)} loop threads leaked"
        assert fake._run(fake.node.wait_for_no_connections()) == 0
        unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(unclosed) == CLIENTS
        assert "unclosed SyncMetastoreClient" in str(unclosed[0].message)
        # Every connection the dropped clients opened was closed: the node saw them go.
        assert fake.node.connections == CLIENTS


def test_a_closed_sync_client_warns_of_nothing() -> None:
    with ThreadedFakeNode() as fake, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        client = SyncMetastoreClient([fake.endpoint], TOKEN, timeout_ms=5000)
        client.status()
        client.close()
        del client
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_an_unclosed_async_client_warns_and_closes_its_connections() -> None:
    fake = FakeNode()
    endpoint = await fake.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            client: Any = MetastoreClient([endpoint], TOKEN, timeout_ms=5000)
            await client.status()
            del client
            gc.collect()
            # The read task of the dropped client's connection ends (it was cancelled).
            for _ in range(100):
                readers = [
                    t
                    for t in asyncio.all_tasks()
                    if t.get_name().startswith("metastore-client-read-")
                ]
                if not readers:
                    break
                await asyncio.sleep(0.01)
            assert readers == []
        unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(unclosed) == 1
        assert "unclosed MetastoreClient" in str(unclosed[0].message)
    finally:
        await fake.stop()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_interpreter_exit_with_an_unclosed_client_is_quiet(kind: str, tmp_path: Any) -> None:
    """A process ending with a client still open (referenced by a global) exits 0 without a
    traceback on stderr."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import asyncio\n"
        "from metastore.client import MetastoreClient, SyncMetastoreClient\n"
        "from tests.client.fake_node import TOKEN, FakeNode, ThreadedFakeNode\n"
        "fake = ThreadedFakeNode()\n"
        f"if {kind!r} == 'sync':\n"
        "    CLIENT = SyncMetastoreClient([fake.endpoint], TOKEN, timeout_ms=5000)\n"
        "    CLIENT.status()\n"
        "else:\n"
        "    async def main():\n"
        "        global CLIENT\n"
        "        node = FakeNode()\n"
        "        endpoint = await node.start()\n"
        "        CLIENT = MetastoreClient([endpoint], TOKEN, timeout_ms=5000)\n"
        "        await CLIENT.status()\n"
        "    asyncio.run(main())\n"
    )
    import os

    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run(
        [sys.executable, "-X", "dev", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
