"""A client connection whose certificate is revoked reads nothing more and is aborted once the
replies it had in flight have left (at most REVOKED_CLIENT_REPLY_GRACE_MS): ApiServer's
close_revoked_clients against a real loopback connection, no node started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from metastore.daemon.server import ApiServer, Session

FINGERPRINT = "ab" * 32


def _api(revoked: set[str]) -> ApiServer:
    state = SimpleNamespace(revoked=SimpleNamespace(is_revoked=lambda fp: fp in revoked))
    return ApiServer(
        node=SimpleNamespace(node_id=0),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=state),  # type: ignore[arg-type]
        clock=None,  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=SimpleNamespace(request=lambda *_a: None),  # type: ignore[arg-type]
        cluster_id="grace",
        client_addresses={},
    )


class _Pair:
    """A loopback connection: the server side's writer and the client side's reader (every
    stream object is kept referenced: a collected one may close its transport)."""

    def __init__(self) -> None:
        self.kept: list[object] = []
        self.writer: asyncio.StreamWriter
        self.reader: asyncio.StreamReader
        self.server: asyncio.AbstractServer

    async def open(self) -> _Pair:
        accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

        async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.kept.append(r)
            accepted.set_result(w)

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.reader, client_writer = await asyncio.open_connection("127.0.0.1", port)
        self.kept.append(client_writer)
        self.writer = await asyncio.wait_for(accepted, 5)
        return self


async def _received(reader: asyncio.StreamReader) -> bytes:
    """Everything the client gets until the connection ends (bounded in time)."""
    out = bytearray()
    async with asyncio.timeout(20):
        while True:
            try:
                chunk = await reader.read(1 << 20)
            except ConnectionError:
                break
            if not chunk:
                break
            out += chunk
    return bytes(out)


def _revoked_session() -> Session:
    return Session(peer="p", tls=True, client_cert=True, cert_fingerprint=FINGERPRINT)


def test_a_reply_finished_just_before_the_revocation_still_leaves() -> None:
    # A request that finished in this very turn has handed its reply to a flush callback (the
    # server's `send`), so it is no longer in flight: the abort must still come after it.
    async def scenario() -> bytes:
        pair = await _Pair().open()
        writer, reader, server = pair.writer, pair.reader, pair.server
        api = _api({FINGERPRINT})
        api._cert_writers[writer] = (_revoked_session(), set())
        asyncio.get_running_loop().call_soon(
            lambda: writer.is_closing() or writer.write(b"the reply")
        )
        assert api.close_revoked_clients() == 1
        try:
            return await _received(reader)
        finally:
            server.close()

    assert asyncio.run(scenario()) == b"the reply"


def test_an_in_flight_reply_larger_than_the_socket_buffers_leaves_whole() -> None:
    big = bytes(range(256)) * (32 * 4096)  # 32 MiB: more than the kernel buffers hold

    async def scenario() -> bytes:
        pair = await _Pair().open()
        writer, reader, server = pair.writer, pair.reader, pair.server
        api = _api({FINGERPRINT})
        loop = asyncio.get_running_loop()

        async def request() -> None:  # as _run_request's `send`: flush soon, then drain
            loop.call_soon(lambda: writer.is_closing() or writer.write(big))
            await writer.drain()

        inflight = {asyncio.create_task(request())}
        api._cert_writers[writer] = (_revoked_session(), inflight)
        assert api.close_revoked_clients() == 1
        try:
            return await _received(reader)
        finally:
            server.close()
            await asyncio.gather(*api._revoked_closes, return_exceptions=True)

    got = asyncio.run(scenario())
    assert len(got) == len(big) and got == big
