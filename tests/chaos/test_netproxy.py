"""The chaos suite's TCP proxy on its own, against a small echo server (tests/chaos/netproxy.py)."""

from __future__ import annotations

import hashlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.netproxy import BUFFER_BYTES, NetProxy

WAIT_S = 5.0


class _Echo(socketserver.BaseRequestHandler):
    server: _EchoServer

    def handle(self) -> None:
        sock = self.request
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self.server.lock:
                self.server.received += len(data)
            try:
                sock.sendall(data)
            except OSError:
                return


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.lock = threading.Lock()
        self.received = 0


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(WAIT_S)


@pytest.fixture
def proxy() -> Iterator[NetProxy]:
    p = NetProxy(seed=1)
    p.start()
    yield p
    p.stop()


def _buffers_max_bytes() -> int:
    """More than every buffer between a sender and a blackholed proxy can hold: the sender's
    socket (tcp_wmem's max), the proxy's receiving socket (tcp_rmem's max: receive buffers
    grow by autotuning, up to 32 MiB on some machines) and the proxy's own BUFFER_BYTES.
    A fixed 32 MiB payload once went through whole, and the sender never blocked."""
    total = BUFFER_BYTES
    for name, default_max in (("tcp_wmem", 4 << 20), ("tcp_rmem", 6 << 20)):
        try:
            total += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
        except (OSError, IndexError, ValueError):
            total += default_max
    return total * 5 // 4


def _connect(port: int, timeout_s: float = WAIT_S) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = sock.recv(n - len(out))
        if not data:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += data
    return bytes(out)


def _nothing_arrives(sock: socket.socket, wait_s: float = 0.3) -> bool:
    sock.settimeout(wait_s)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(WAIT_S)
    return False


def _is_reset(sock: socket.socket) -> bool:
    """The peer reset (or closed) the connection."""
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _wait_until(cond: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_pass_through_echoes_and_counts(echo: _EchoServer, proxy: NetProxy) -> None:
    port = proxy.add("a", echo.server_address)  # type: ignore[arg-type]
    with _connect(port) as s:
        s.sendall(b"hello")
        assert _recv_exactly(s, 5) == b"hello"
    st = proxy.stats("a")
    assert (st.accepted, st.connected, st.bytes_up, st.bytes_down) == (1, 1, 5, 5)
    _wait_until(lambda: proxy.stats("a").live == 0, "the closed connection to be forgotten")


def test_delay_applies_to_each_direction_and_keeps_order(
    echo: _EchoServer, proxy: NetProxy
) -> None:
    port = proxy.add("a", echo.server_address)  # type: ignore[arg-type]
    # Delays long enough that the healed round trip below is told apart on a loaded machine.
    proxy.delay(["a"], 1_000, jitter_ms=50)
    with _connect(port) as s:
        started = time.monotonic()
        s.sendall(b"ping")
        assert _recv_exactly(s, 4) == b"ping"
        assert time.monotonic() - started >= 2.0  # 1 s up + 1 s down, at least
        # Many writes with jittered delays: the stream still arrives in order.
        payload = b"".join(i.to_bytes(4, "big") for i in range(2000))
        for i in range(0, len(payload), 100):
            s.sendall(payload[i : i + 100])
        assert _recv_exactly(s, len(payload)) == payload
    assert proxy.stats("a").delayed_chunks > 0
    proxy.heal(["a"])
    with _connect(port) as s:
        started = time.monotonic()
        s.sendall(b"fast")
        assert _recv_exactly(s, 4) == b"fast"
        assert time.monotonic() - started < 1.5  # well below the 2 s it took delayed


def test_blackhole_holds_bytes_and_delivers_them_after_heal(
    echo: _EchoServer, proxy: NetProxy
) -> None:
    port = proxy.add("a", echo.server_address)  # type: ignore[arg-type]
    with _connect(port) as s:
        s.sendall(b"1")
        assert _recv_exactly(s, 1) == b"1"
        proxy.blackhole(["a"])
        s.sendall(b"234")
        assert _nothing_arrives(s)
        assert echo.received == 1  # nothing reached the server either
        # A new connection is accepted, but not connected to the target until the heal.
        with _connect(port) as late:
            late.sendall(b"late")
            assert _nothing_arrives(late)
            st = proxy.stats("a")
            assert st.held_connects == 1 and st.connected == 1 and st.stalls >= 1
            proxy.heal(["a"])
            assert _recv_exactly(s, 3) == b"234"  # the held bytes, late and in order
            assert _recv_exactly(late, 4) == b"late"


def test_one_way_blackhole(echo: _EchoServer, proxy: NetProxy) -> None:
    port = proxy.add("a", echo.server_address)  # type: ignore[arg-type]
    with _connect(port) as s:
        s.sendall(b"0")
        assert _recv_exactly(s, 1) == b"0"
        proxy.blackhole(["a"], up=False, down=True)  # requests pass, replies are held
        s.sendall(b"12")
        _wait_until(lambda: echo.received == 3, "the request to reach the server")
        assert _nothing_arrives(s)
        proxy.heal(["a"])
        assert _recv_exactly(s, 2) == b"12"
        proxy.blackhole(["a"], up=True, down=False)  # requests are held
        s.sendall(b"34")
        assert _nothing_arrives(s)
        assert echo.received == 3
        proxy.heal(["a"])
        assert _recv_exactly(s, 2) == b"34"


def test_a_full_blackhole_blocks_the_sender_and_loses_nothing(
    echo: _EchoServer, proxy: NetProxy
) -> None:
    port = proxy.add("a", echo.server_address)  # type: ignore[arg-type]
    payload = hashlib.sha256(b"seed").digest() * (_buffers_max_bytes() // 32 + 1)
    with _connect(port) as s:
        proxy.blackhole(["a"], up=True, down=False)
        s.settimeout(0.5)
        sent = 0
        blocked = False
        try:
            while sent < len(payload):
                sent += s.send(payload[sent : sent + 65536])
        except TimeoutError:  # the proxy's bounded buffer is full, then the kernel's
            blocked = True
        assert blocked and 0 < sent < len(payload)
        proxy.heal(["a"])
        s.settimeout(WAIT_S)
        got = bytearray()

        def drain() -> None:
            while len(got) < len(payload):
                data = s.recv(1 << 20)
                if not data:
                    return
                got.extend(data)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        s.sendall(payload[sent:])
        reader.join(WAIT_S * 2)
        assert bytes(got) == payload


def test_reject_resets_live_and_new_connections(echo: _EchoServer, proxy: NetProxy) -> None:
    port = proxy.add("a", echo.server_address)  # type: ignore[arg-type]
    with _connect(port) as s:
        s.sendall(b"x")
        assert _recv_exactly(s, 1) == b"x"
        proxy.reject(["a"])
        assert _is_reset(s)
    try:
        s = _connect(port)  # accepted by the listener, then reset at once
    except ConnectionResetError:  # the reset can beat the end of connect()
        pass
    else:
        with s:
            assert _is_reset(s)
    st = proxy.stats("a")
    assert st.reset_by_fault == 1 and st.refused == 1
    proxy.heal(["a"])
    with _connect(port) as s:
        s.sendall(b"y")
        assert _recv_exactly(s, 1) == b"y"


def test_close_connections_resets_what_is_live_only(echo: _EchoServer, proxy: NetProxy) -> None:
    port = proxy.add("a", echo.server_address)  # type: ignore[arg-type]
    other = proxy.add("b", echo.server_address)  # type: ignore[arg-type]
    with _connect(port) as s, _connect(other) as t:
        for sock in (s, t):
            sock.sendall(b"x")
            assert _recv_exactly(sock, 1) == b"x"
        assert proxy.close_connections(["a"]) == 1
        assert _is_reset(s)
        t.sendall(b"z")
        assert _recv_exactly(t, 1) == b"z"  # another pair is untouched
    with _connect(port) as s:  # the pair itself still passes
        s.sendall(b"y")
        assert _recv_exactly(s, 1) == b"y"


def test_a_dead_target_resets_the_client(proxy: NetProxy) -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()
    port = proxy.add("a", dead)
    try:
        s = _connect(port)
    except ConnectionResetError:  # the reset can beat the end of connect()
        pass
    else:
        with s:
            assert _is_reset(s)
    assert proxy.stats("a").refused == 1


def test_stop_is_clean_with_live_and_held_connections(echo: _EchoServer) -> None:
    p = NetProxy()
    p.start()
    port = p.add("a", echo.server_address)  # type: ignore[arg-type]
    live = _connect(port)
    live.sendall(b"x")
    assert _recv_exactly(live, 1) == b"x"
    p.blackhole(["a"])
    held = _connect(port)
    held.sendall(b"y")
    started = time.monotonic()
    p.stop()
    assert time.monotonic() - started < WAIT_S
    assert not any(t.name == "netproxy" for t in threading.enumerate())
    for sock in (live, held):
        assert _is_reset(sock) or sock.recv(1) == b""
        sock.close()
    p.stop()  # twice is harmless


def test_a_pair_never_listens_on_a_reserved_port(proxy: NetProxy, echo: _EchoServer) -> None:
    # Reserve the ports the kernel hands out next (as free_ports chose a node's ports): the
    # proxy must bind elsewhere, or a node started later could not bind its own port.
    probes = [socket.socket() for _ in range(8)]
    for s in probes:
        s.bind(("127.0.0.1", 0))
    reserved = {s.getsockname()[1] for s in probes}
    for s in probes:
        s.close()
    proxy.reserve(reserved)
    ports = [proxy.add(f"p{i}", echo.server_address) for i in range(8)]
    assert not reserved & set(ports)
    with _connect(ports[0]) as sock:
        sock.sendall(b"ping")
        assert _recv_exactly(sock, 4) == b"ping"
