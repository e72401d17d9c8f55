"""A userspace TCP proxy for network faults on loopback: no root, no network namespace.

    proxy = NetProxy()
    proxy.start()
    port = proxy.add("1->2", ("127.0.0.1", raft_port_of_2))   # node 1 dials this port for node 2
    proxy.blackhole(["1->2"])            # a partition: nothing passes, nothing is refused
    proxy.heal(["1->2"])                 # back to pass-through; what was held now flows
    proxy.stop()

Key idea: every *directed pair* i->j gets its own listener, and node i is told (through
`METASTORE_FAULT_PEER_ADDRESSES`, see metastore/daemon/node.py) to connect to node j there. The
proxy runs on its own event loop in a daemon thread of the test process; every method is
called from the test's threads and waits at most CALL_TIMEOUT_S for the loop.

A connection through a pair has two directions: "up" (from the side that connected, node i, to
the target) and "down" (the replies). Each direction is a delay line: a reader task takes what
arrives (at most BUFFER_BYTES per direction are held; beyond that the proxy stops reading, so the
sender's socket buffers fill and its writes block, as on a slow link) and stamps each chunk with
a delivery time; a writer task delivers chunks in order, each no earlier than its time and only
while its direction is not blackholed. Per pair:

* pass: forward as fast as the loop can;
* delay(ms, jitter): each chunk waits `ms` (+ up to `jitter`) after it arrived; order is kept,
  as TCP keeps it (a chunk never overtakes the one before it);
* blackhole(up, down): that direction of every connection stops delivering; held bytes are
  delivered, in order, after the heal, and a new connection is accepted but not connected to the
  target until both directions pass again (its TCP handshake would not complete). This is what a
  real partition does to TCP: packets are silently dropped, connections stay open and stall,
  senders see no error (writes just block once the buffers are full), connects hang until their
  timeout, and TCP's retransmission delivers the stalled bytes late if the partition heals before
  it gives up. A partition that sends RSTs (REJECT) is kinder: every sender learns at once;
* reject: every connection is reset (RST) and new ones are reset as soon as they are accepted,
  like a firewall's REJECT (or a crashed host that answers RST);
* close_connections(): reset (RST) every live connection of the pair now and drop what the
  proxy held for it: what was in flight is lost, which is how a TCP stream loses data.

The proxy terminates TCP on both sides, so it cannot model packet-level effects inside a
connection (loss that TCP would retransmit, reordering, duplication): none of those is visible
above TCP except as delay, stalls and resets, which it does model.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

CALL_TIMEOUT_S = 10.0  # longest wait for the proxy's loop from a test thread
RESERVED_TRIES_MAX = 64  # listeners bound aside, at most, to find a port not reserved
CONNECT_TIMEOUT_S = 3.0  # connecting to a pair's target
STOP_TIMEOUT_S = 10.0
READ_CHUNK_BYTES = 64 * 1024
BUFFER_BYTES = 1024 * 1024  # held per direction of a connection (the delay line's capacity)

_EOF = b""  # the sender closed its side
_RESET = None  # the sender's connection was reset


@dataclass(slots=True)
class PairStats:
    accepted: int = 0  # connections accepted on the pair's listener
    connected: int = 0  # of those, connected to the target
    reset_by_fault: int = 0  # connections reset by reject / close_connections
    refused: int = 0  # connections reset at once: reject, or the target refused
    stalls: int = 0  # times a direction of a connection stopped for a blackhole
    held_connects: int = 0  # connections that waited for a blackhole to heal to connect
    delayed_chunks: int = 0  # chunks that waited for their delay
    bytes_up: int = 0
    bytes_down: int = 0
    live: int = 0


@dataclass(slots=True)
class _Pair:
    name: str
    target: tuple[str, int]
    listener: socket.socket | None = None
    accept_task: asyncio.Task[None] | None = None
    conns: set[_Conn] = field(default_factory=set)
    block_up: bool = False
    block_down: bool = False
    reject: bool = False
    delay_s: float = 0.0
    jitter_s: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    stats: PairStats = field(default_factory=PairStats)

    def notify(self) -> None:
        """Wake everything waiting for this pair's settings to change."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    def blocked(self, up: bool) -> bool:
        return self.block_up if up else self.block_down


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN: the peer sees ECONNRESET."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _listed(names: Iterable[str]) -> list[str]:
    """Pair names as a list; a lone name is one pair, not its characters."""
    return [names] if isinstance(names, str) else list(names)


def _reset_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Direction:
    """One direction of one connection: a bounded delay line."""

    def __init__(self, conn: _Conn, up: bool, rng: random.Random) -> None:
        self.conn = conn
        self.up = up
        self.rng = rng
        self.items: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.buffered = 0
        self.last_due = 0.0
        self.ready = asyncio.Event()
        self.space = asyncio.Event()

    async def read(self, src: asyncio.StreamReader) -> None:
        pair = self.conn.pair
        loop = asyncio.get_running_loop()
        while True:
            while self.buffered >= BUFFER_BYTES:
                self.space.clear()
                await self.space.wait()
            data: bytes | None
            try:
                data = await src.read(READ_CHUNK_BYTES)
            except OSError:
                data = _RESET
            delay = pair.delay_s + (self.rng.uniform(0, pair.jitter_s) if pair.jitter_s else 0)
            due = max(self.last_due, loop.time() + delay)
            self.last_due = due
            self.items.append((due, data))
            self.buffered += len(data or b"")
            self.ready.set()
            if not data:
                return

    async def write(self, dst: asyncio.StreamWriter) -> None:
        pair = self.conn.pair
        loop = asyncio.get_running_loop()
        while True:
            while not self.items:
                self.ready.clear()
                await self.ready.wait()
            due, data = self.items[0]
            wait = due - loop.time()
            if wait > 0:
                pair.stats.delayed_chunks += 1
                await asyncio.sleep(wait)
            if pair.blocked(self.up):
                pair.stats.stalls += 1
                while pair.blocked(self.up):
                    await pair.changed.wait()
            self.items.popleft()
            if data is _RESET:
                self.conn.reset()  # after what the sender wrote before its reset
                return
            if not data:
                self.conn.close()  # the sender closed: close both sides, after what it sent
                return
            self.buffered -= len(data)
            self.space.set()
            if self.up:
                pair.stats.bytes_up += len(data)
            else:
                pair.stats.bytes_down += len(data)
            dst.write(data)
            await dst.drain()


class _Conn:
    def __init__(self, pair: _Pair, client: asyncio.StreamWriter) -> None:
        self.pair = pair
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    def start(
        self,
        creader: asyncio.StreamReader,
        ureader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        rng: random.Random,
    ) -> None:
        self.upstream = upstream
        up, down = _Direction(self, True, rng), _Direction(self, False, rng)
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(up.read(creader)),
            loop.create_task(up.write(upstream)),
            loop.create_task(down.read(ureader)),
            loop.create_task(down.write(self.client)),
        ]
        for task in self.tasks:
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.reset()  # a write to a dead socket, typically: the connection is over

    def _finish(self) -> None:
        self.closed = True
        self.pair.conns.discard(self)
        self.pair.stats.live = len(self.pair.conns)
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    def close(self) -> None:
        """A graceful close (FIN) of both sides."""
        if self.closed:
            return
        self._finish()
        for w in (self.client, self.upstream):
            if w is not None:
                w.close()

    def reset(self) -> None:
        """An abrupt close (RST) of both sides; whatever the proxy held is lost."""
        if self.closed:
            return
        self._finish()
        _reset(self.client)
        _reset(self.upstream)


class NetProxy:
    """Directed TCP pairs with pass / delay / blackhole / reject / close, on one private loop."""

    def __init__(self, host: str = "127.0.0.1", seed: int = 0) -> None:
        self.host = host
        self._rng = random.Random(seed)
        self._pairs: dict[str, _Pair] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._accepting: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.reserved: set[int] = set()  # ports never to listen on (see reserve)

    # ---- lifecycle (test thread) --------------------------------------------------------------

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("the proxy is already started")
        # A plain selector loop, whatever loop policy the process installed: SO_LINGER on the
        # transport's socket (for resets) is supported there.
        loop = asyncio.SelectorEventLoop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="netproxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(STOP_TIMEOUT_S)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_TIMEOUT_S)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None

    def __enter__(self) -> NetProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- pairs (test thread) ------------------------------------------------------------------

    def reserve(self, ports: Iterable[int]) -> None:
        """Never listen on these ports: they were chosen (free at that moment) for processes
        that will bind them later, and a listener of ours there would take their place."""
        self.reserved.update(ports)

    def add(self, name: str, target: tuple[str, int]) -> int:
        """A new pair forwarding to `target`; returns the port its listener is bound to."""
        loop = self._running_loop()
        fut = asyncio.run_coroutine_threadsafe(self._add(name, target), loop)
        return fut.result(CALL_TIMEOUT_S)

    @property
    def names(self) -> list[str]:
        return list(self._pairs)

    def blackhole(self, names: Iterable[str], *, up: bool = True, down: bool = True) -> None:
        """Stop delivering the given directions (held bytes flow again after `heal`)."""

        def apply(p: _Pair) -> None:
            p.block_up = p.block_up or up
            p.block_down = p.block_down or down

        self._update(names, apply)

    def reject(self, names: Iterable[str]) -> None:
        """Reset every connection now and every new one as soon as it is accepted."""

        def apply(p: _Pair) -> None:
            p.reject = True
            for conn in list(p.conns):
                p.stats.reset_by_fault += 1
                conn.reset()

        self._update(names, apply)

    def delay(self, names: Iterable[str], ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every chunk by `ms` plus up to `jitter_ms` (order kept) from now on."""

        def apply(p: _Pair) -> None:
            p.delay_s, p.jitter_s = ms / 1000, jitter_ms / 1000

        self._update(names, apply)

    def heal(self, names: Iterable[str] | None = None) -> None:
        """Back to pass-through (no blackhole, no reject, no delay) for `names` (default: all)."""

        def apply(p: _Pair) -> None:
            p.block_up = p.block_down = p.reject = False
            p.delay_s = p.jitter_s = 0.0

        self._update(self.names if names is None else names, apply)

    def close_connections(self, names: Iterable[str]) -> int:
        """Reset every live connection of the pairs now; returns how many were reset."""
        wanted = _listed(names)

        def run() -> int:
            n = 0
            for name in wanted:
                p = self._pairs[name]
                for conn in list(p.conns):
                    p.stats.reset_by_fault += 1
                    conn.reset()
                    n += 1
            return n

        return self._call(run)

    def stats(self, name: str) -> PairStats:
        def run() -> PairStats:
            s = self._pairs[name].stats
            return PairStats(**{f: getattr(s, f) for f in PairStats.__slots__})

        return self._call(run)

    def total(self, names: Iterable[str] | None = None) -> PairStats:
        """The counters summed over `names` (default: every pair)."""
        out = PairStats()
        for name in self.names if names is None else _listed(names):
            s = self.stats(name)
            for f in PairStats.__slots__:
                setattr(out, f, getattr(out, f) + getattr(s, f))
        return out

    # ---- on the proxy's loop ------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the proxy is not started")
        return self._loop

    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the proxy's loop and return its result (bounded wait)."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                done.set_exception(exc)

        self._running_loop().call_soon_threadsafe(run)
        return done.result(CALL_TIMEOUT_S)

    def _update(self, names: Iterable[str], apply: Callable[[_Pair], None]) -> None:
        wanted = _listed(names)

        def run() -> None:
            for name in wanted:
                p = self._pairs[name]
                apply(p)
                p.notify()

        self._call(run)

    async def _add(self, name: str, target: tuple[str, int]) -> int:
        if name in self._pairs:
            raise ValueError(f"pair {name!r} exists")
        pair = _Pair(name=name, target=target)
        # Our own accept loop rather than asyncio.start_server: closing a Server while it sets
        # up a connection it has just accepted leaks that socket (Python 3.11), and the stop
        # must reset every connection a client may still be waiting on.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        held = []  # ports the caller reserved (e.g. chosen for nodes not started yet)
        while listener.getsockname()[1] in self.reserved and len(held) < RESERVED_TRIES_MAX:
            held.append(listener)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, 0))
        for sock in held:
            sock.close()
        if listener.getsockname()[1] in self.reserved:
            listener.close()
            raise OSError(f"no free port outside the reserved ones for pair {name!r}")
        listener.listen(128)
        listener.setblocking(False)
        pair.listener = listener
        pair.accept_task = asyncio.get_running_loop().create_task(self._accept_loop(pair))
        self._pairs[name] = pair
        port: int = listener.getsockname()[1]
        return port

    async def _accept_loop(self, pair: _Pair) -> None:
        loop = asyncio.get_running_loop()
        listener = pair.listener
        assert listener is not None
        while True:
            sock, _ = await loop.sock_accept(listener)
            if self._stopping:
                # Woken by _shutdown's own connection: reset it and whatever is queued behind
                # it, then close (the kernel resets what arrives later). Not cancelled: a
                # cancelled sock_accept can drop a socket it has just accepted.
                _reset_socket(sock)
                with contextlib.suppress(OSError):
                    while True:
                        _reset_socket(listener.accept()[0])
                listener.close()
                return
            task = loop.create_task(self._serve(pair, sock))
            self._accepting.add(task)
            task.add_done_callback(self._accepting.discard)

    async def _serve(self, pair: _Pair, sock: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except (OSError, asyncio.CancelledError):
            _reset_socket(sock)
            return
        try:
            await self._accept(pair, reader, writer)
        except asyncio.CancelledError:
            _reset(writer)  # the proxy stopped while this connect was held

    async def _accept(
        self, pair: _Pair, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        pair.stats.accepted += 1
        if self._stopping:
            _reset(cwriter)
            return
        if pair.block_up or pair.block_down:
            # A TCP handshake needs both directions: the connect waits (the client's own
            # timeout gives up on it) until the blackhole heals.
            pair.stats.held_connects += 1
            while (pair.block_up or pair.block_down) and not pair.reject and not self._stopping:
                await pair.changed.wait()
        if pair.reject or self._stopping:
            pair.stats.refused += 1
            _reset(cwriter)
            return
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                ureader, uwriter = await asyncio.open_connection(*pair.target)
        except (OSError, TimeoutError):
            pair.stats.refused += 1  # the target is down: the client sees a reset
            _reset(cwriter)
            return
        if cwriter.transport.is_closing():
            uwriter.close()
            return
        pair.stats.connected += 1
        conn = _Conn(pair, cwriter)
        pair.conns.add(conn)
        pair.stats.live = len(pair.conns)
        conn.start(creader, ureader, uwriter, random.Random(self._rng.random()))

    async def _shutdown(self) -> None:
        self._stopping = True
        loop = asyncio.get_running_loop()
        accept_loops = [p.accept_task for p in self._pairs.values() if p.accept_task is not None]
        for pair in self._pairs.values():
            if pair.listener is not None and pair.listener.fileno() != -1:
                with contextlib.suppress(OSError):  # wake its accept loop
                    waker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    waker.setblocking(False)
                    try:
                        async with asyncio.timeout(CONNECT_TIMEOUT_S):
                            await loop.sock_connect(waker, pair.listener.getsockname())
                    finally:
                        waker.close()
            pair.notify()  # held connects wake up and reset their client
        if accept_loops:
            _, late = await asyncio.wait(accept_loops, timeout=STOP_TIMEOUT_S)
            for task in late:
                task.cancel()
        tasks = [t for p in self._pairs.values() for c in p.conns for t in c.tasks]
        tasks += list(self._accepting)
        for pair in self._pairs.values():
            for conn in list(pair.conns):
                conn.reset()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
