"""CLIENT_FRAME_TIMEOUT_MS bounds how long one frame may take to arrive. The server measured
it from the first moment its buffer held bytes until the buffer was next empty, so a busy
pipelining client whose reads kept ending inside a frame (large commits back to back, each
arriving in a few milliseconds) was cut off after 10 s with 'frame not completed in time',
every request in flight lost. Each frame now has the bound to itself. Stub node, in-memory
streams, nothing started."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon import api_limits as L
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from raft.framing import NEED_DATA, FrameDecoder, encode_frame


class _Writer:
    def __init__(self) -> None:
        self.data = bytearray()
        # Every write is taken at once: nothing stays buffered.
        self.transport = SimpleNamespace(get_write_buffer_size=lambda: 0)

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _api() -> ApiServer:
    return ApiServer(
        node=SimpleNamespace(node_id=1),  # type: ignore[arg-type]
        sm=None,  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *a: None),  # type: ignore[arg-type]
        cluster_id="ct",
        client_addresses={},
    )


def test_a_stream_of_frames_that_never_leaves_the_buffer_empty_is_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(L, "CLIENT_FRAME_TIMEOUT_MS", 300)
    api = _api()
    frames = [
        encode_frame({"id": i, "op": "no_such_op", "args": {}}, max_frame_bytes=1 << 20)
        for i in range(1, 13)
    ]
    stream = b"".join(frames)
    # Each piece ends in the middle of a frame: the server's buffer is never empty, but every
    # frame completes within 100 ms of its first byte.
    cuts = [sum(len(f) for f in frames[:i]) + len(frames[i]) // 2 for i in range(len(frames))]
    writer = _Writer()

    async def run() -> float:
        reader = asyncio.StreamReader()
        session = Session(peer="t", role=Role.READER)
        started = time.monotonic()
        serve = asyncio.ensure_future(
            api._serve_session(
                session,
                FrameDecoder(1 << 20),
                reader,
                writer,
                0.0,
                set(),  # type: ignore[arg-type]
            )
        )
        sent = 0
        for cut in [*cuts, len(stream)]:
            reader.feed_data(stream[sent:cut])
            sent = cut
            await asyncio.sleep(0.06)
        elapsed = time.monotonic() - started
        reader.feed_eof()
        await asyncio.wait_for(serve, 5)
        return elapsed

    elapsed = asyncio.run(run())
    assert elapsed > 0.3 * 2  # the stream lasted longer than the frame bound
    decoder = FrameDecoder(1 << 20)
    decoder.feed(bytes(writer.data))
    replies = []
    while (reply := decoder.next_frame()) is not NEED_DATA:
        replies.append(reply)
    assert sorted(r["id"] for r in replies) == list(range(1, 13)), "the connection was cut"


def test_a_frame_that_does_not_complete_in_time_closes_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(L, "CLIENT_FRAME_TIMEOUT_MS", 300)
    api = _api()
    whole = encode_frame({"id": 1, "op": "no_such_op", "args": {}}, max_frame_bytes=1 << 20)
    half = encode_frame({"id": 2, "op": "no_such_op", "args": {}}, max_frame_bytes=1 << 20)
    writer = _Writer()

    async def run() -> float:
        reader = asyncio.StreamReader()
        started = time.monotonic()
        reader.feed_data(whole + half[: len(half) // 2])
        await asyncio.wait_for(
            api._serve_session(
                Session(peer="t", role=Role.READER),
                FrameDecoder(1 << 20),
                reader,
                writer,  # type: ignore[arg-type]
                0.0,
                set(),
            ),
            5,
        )
        return time.monotonic() - started

    assert 0.25 < asyncio.run(run()) < 2
