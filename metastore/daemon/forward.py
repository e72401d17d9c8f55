"""Forwarding writes from a follower to the leader over the leader's own client API.

The follower authenticates with the *caller's* token, so the leader authorizes the request exactly
as if the client had come to it directly. Connections are pooled per (leader, token) and
pipelined; replies are matched by request id. With TLS, a leader whose certificate the cluster
revoked gets no token: it is refused before hello, and links to it close once its revocation
applies (`close_revoked`), as peer links do.

The leader's client address: its entry in this node's cluster.toml, else the cluster's record
(metastore.member_clients, made by `add-node`); neither is UNAVAILABLE ("no client address
configured").

The whole forward (opening the link, waiting for a slot on it, the write, the answer) runs within
the caller's `timeout_ms`. One that failed is UNAVAILABLE: with `outcome_unknown` once its
request may have reached the leader (handed to the transport: the leader may run it), with
`details.not_sent` only when it certainly did not (the link not opened in time or not at all,
no free slot on it, the transport refusing the write outright): the client may then retry it
elsewhere, even a write that is not repeatable.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import ssl
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final

from hlc import HybridClock
from hlc.errors import HlcError
from metastore.daemon import api_limits as L
from metastore.errors import MetastoreError, UnavailableError
from metastore.revocation import fingerprint_of_der
from raft.errors import RaftError
from raft.framing import NEED_DATA, FrameDecoder, encode_frame

log = logging.getLogger("metastore.forward")

# What to do about a member that cluster.toml does not list and whose client address the
# cluster did not record (added without `--client-address`, or before apply version 6).
MISSING_MEMBER_FIX: Final = (
    "Add its [[nodes]] entry (host, raft_port, client_port, metrics_port) to cluster.toml on "
    "every member and restart them one at a time (the file is read at start)."
)


# A link's own bounds, shared by every forward waiting for it (each of which gives up at its own
# deadline meanwhile): a forward with a long timeout does not keep a dead address busy longer.
LINK_CONNECT_TIMEOUT_S: Final = 3.0
LINK_HELLO_TIMEOUT_S: Final = 3.0


class _NotSentError(Exception):
    """A request never written: its deadline passed while it waited for a slot on its link, or
    the link was closed, or the transport refused the write. The leader never saw it
    (`LeaderForwarder.call` says so, `not_sent`, without `outcome_unknown`)."""


class _LostAfterWriteError(Exception):
    """The connection failed after the request was handed to the transport: its bytes may
    have reached the leader, which may run it (`LeaderForwarder.call`: `outcome_unknown`)."""


class _Link:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        # SHA-256 of the leader's TLS certificate ("" without TLS).
        self.fingerprint = ""
        # The certificate was revoked: nothing more is sent; closed once its replies are in.
        self.revoked = False
        self.slots = asyncio.Semaphore(L.CLIENT_INFLIGHT_PER_CONNECTION_MAX)
        # Requests sent whose forward gave up before the answer: the leader still counts them
        # in flight, so each keeps its slot until its answer arrives (or the link closes).
        self.abandoned: set[int] = set()

    async def read_loop(self) -> None:
        # The leader's replies are decoded under the client's reply budget: a compromised or
        # buggy leader cannot make this node decode a frame of tiny items whatever it costs.
        decoder = FrameDecoder(
            max_frame_bytes=L.CLIENT_FRAME_BYTES_MAX, max_items=L.CLIENT_REPLY_ITEMS_MAX
        )
        try:
            while True:
                data = await self.reader.read(L.CLIENT_READ_CHUNK_BYTES)
                if not data:
                    break
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not NEED_DATA:
                    if isinstance(frame, dict):
                        if frame.get("id") in self.abandoned:
                            self.abandoned.discard(frame["id"])
                            self.slots.release()
                        fut = self.pending.pop(frame.get("id", -1), None)
                        if fut is not None and not fut.done():
                            fut.set_result(frame)
        except (ConnectionError, OSError, RaftError) as exc:
            log.info("forward link closed: %s", exc)
        finally:
            self.close()

    def close(self) -> None:
        self.closed = True
        for fut in self.pending.values():
            if not fut.done():
                # Every pending request was written: the leader may have run it (a gc_run may
                # still be deleting), so its outcome is unknown, as for a forward that timed
                # out (`LeaderForwarder.call`); the client counts it so (gc_run's
                # `unanswered_parts`) instead of taking it for a node that did nothing.
                fut.set_exception(
                    UnavailableError(
                        "connection to the leader closed before it answered; outcome unknown",
                        details={"outcome_unknown": True},
                    )
                )
        self.pending.clear()
        for _ in self.abandoned:
            self.slots.release()  # no answer will come: forwards waiting for a slot go on
        self.abandoned.clear()
        self.writer.close()

    async def request(self, op: str, args: Mapping[str, Any], deadline: float) -> dict[str, Any]:
        """Send one request and await its answer, until `deadline` (the loop's clock).

        Raises _NotSentError when the request certainly never left (the deadline passed while
        it waited for a slot, the link closed, the transport refused the write), and
        _LostAfterWriteError or TimeoutError once it may have."""
        # Every forward with one token shares this link, and the leader answers LIMIT_EXCEEDED
        # past CLIENT_INFLIGHT_PER_CONNECTION_MAX requests in flight on one connection: the
        # ones past it wait here for a slot (within their deadline) instead.
        sent = False
        try:
            async with asyncio.timeout_at(deadline):
                await self.slots.acquire()
                rid = next(self.ids)
                fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
                try:
                    if self.closed or self.revoked:
                        raise _NotSentError("the connection to the leader closed")
                    self.pending[rid] = fut
                    frame = encode_frame(
                        {"id": rid, "op": op, "args": dict(args)},
                        max_frame_bytes=L.CLIENT_FRAME_BYTES_MAX,
                    )
                    try:
                        self.writer.write(frame)
                    except RuntimeError as exc:
                        # A transport refuses a write before it buffers any of it (uvloop, on a
                        # transport the leader already closed, before read_loop has seen the end
                        # of the stream; asyncio after write_eof): nothing of it left.
                        self.pending.pop(rid, None)
                        self.close()
                        raise _NotSentError(f"the connection to the leader closed: {exc}") from None
                    # Handed to the transport: from here on the leader may get it and run it.
                    sent = True
                    try:
                        await self.writer.drain()
                    except (ConnectionError, OSError, RuntimeError) as exc:
                        self.pending.pop(rid, None)
                        self.close()
                        raise _LostAfterWriteError(
                            f"the connection to the leader failed after the request was "
                            f"written: {exc}"
                        ) from None
                    return await fut
                finally:
                    self.pending.pop(rid, None)
                    answered = fut.done() and not fut.cancelled()
                    if sent and not answered and not self.closed:
                        # It gave up (its client went away, or its timeout ran out) but the leader
                        # still runs it: freed now, the slot let a forward out past the leader's
                        # bound, which it refused (LIMIT_EXCEEDED). Freed by its answer instead.
                        self.abandoned.add(rid)
                    else:
                        self.slots.release()
        except TimeoutError:
            if not sent:
                raise _NotSentError(
                    "no room on the link in time (each link carries at most "
                    f"{L.CLIENT_INFLIGHT_PER_CONNECTION_MAX} requests at once)"
                ) from None
            raise


# A link: (leader, SHA-256 of the token, the caller's client name or "").
_LinkKey = tuple[int, str, str]
# The client name a forwarding link gives in its hello; with a caller's name, its suffix.
FORWARD_CLIENT: Final = "forward"
FORWARDED_SUFFIX: Final = " (forwarded)"


class LeaderForwarder:
    def __init__(
        self,
        *,
        addresses: Mapping[int, tuple[str, int]],
        clock: HybridClock,
        tls: ssl.SSLContext | None = None,
        revoked: Callable[[str], bool] | None = None,
        recorded: Callable[[int], tuple[str, int] | None] | None = None,
    ) -> None:
        """`addresses`: client addresses from this node's cluster.toml (they win).
        `recorded`: a member's client address as the cluster recorded it (`cluster add-node
        --client-address`; the replicated state), for members the file does not name.
        `tls`: the client context for TLS client ports (the node's own certificate is
        presented, so a port that requires client certificates admits its peers). `revoked`:
        whether a certificate fingerprint is revoked (the cluster's list)."""
        self.addresses = dict(addresses)
        self.recorded = recorded
        self.clock = clock
        self.tls = tls
        self.revoked = revoked
        self._links: OrderedDict[_LinkKey, _Link] = OrderedDict()
        # Connects under way, per (leader, token): concurrent forwards await the same one, so
        # a leader that cannot be reached costs them one attempt together, not one each in
        # turn (the n-th failed after n attempts, long after its client gave up).
        self._connecting: dict[_LinkKey, asyncio.Task[_Link]] = {}
        # Links to a revoked certificate, closing once their replies are in (kept referenced).
        self._closing: set[asyncio.Task[None]] = set()

    async def call(
        self,
        node_id: int,
        token: str,
        op: str,
        args: Mapping[str, Any],
        *,
        timeout_ms: int,
        client: str = "",
    ) -> dict[str, Any]:
        """Run `op` on node `node_id`; returns its result or raises its typed error.

        `client`: the caller's client name, for an op the leader runs whole and records who
        asked for (remove_node's revocation, apply_version_finalize): the link says on whose
        behalf in its hello, so the record names the caller, not "forward". Such links are
        kept per name; the rest share one link per token.

        All of it (opening the link, a slot on it, the write, the answer) within `timeout_ms`:
        a missing link's connect and hello have their own bounds, shared by every forward
        waiting for that link, but none of them waits past its own deadline."""
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        not_sent = {"node_id": node_id, "not_sent": True}
        try:
            async with asyncio.timeout_at(deadline):
                link = await self._link(node_id, token, client)
        except TimeoutError:
            # The connect or the link's hello did not finish in time: never written.
            raise UnavailableError(
                f"node {node_id} did not open a link in time (timeout {timeout_ms} ms); the "
                "request was not sent",
                details=not_sent,
            ) from None
        except (ConnectionError, OSError, _NotSentError, _LostAfterWriteError) as exc:
            # No link (the connect or the hello failed): the request was never written.
            raise UnavailableError(
                f"cannot reach node {node_id}: {exc}; the request was not sent", details=not_sent
            ) from None
        try:
            reply = await link.request(op, args, deadline)
        except _NotSentError as exc:
            # Never written, so the leader did nothing: the client may try elsewhere safely.
            raise UnavailableError(
                f"node {node_id}: {exc} (timeout {timeout_ms} ms); the request was not sent",
                details=not_sent,
            ) from None
        except TimeoutError:
            raise UnavailableError(
                f"node {node_id} did not answer within {timeout_ms} ms; outcome unknown",
                details={"node_id": node_id, "outcome_unknown": True},
            ) from None
        except _LostAfterWriteError as exc:
            raise UnavailableError(
                f"node {node_id}: {exc}; outcome unknown",
                details={"node_id": node_id, "outcome_unknown": True},
            ) from None
        ts = reply.get("ts")
        if isinstance(ts, int):
            with contextlib.suppress(HlcError):
                self.clock.update(ts)
        if reply.get("ok"):
            result = reply.get("result")
            return result if isinstance(result, dict) else {}
        raise MetastoreError.from_wire(reply.get("error"))

    def address_of(self, node_id: int) -> tuple[str, int] | None:
        """Node `node_id`'s client address: this node's cluster.toml entry, else the
        cluster's record, else None."""
        addr = self.addresses.get(node_id)
        if addr is None and self.recorded is not None:
            addr = self.recorded(node_id)
        return addr

    async def _link(self, node_id: int, token: str, client: str = "") -> _Link:
        key = (node_id, hashlib.sha256(token.encode()).hexdigest(), client)
        link = self._links.get(key)
        if link is not None and not link.closed:
            self._links.move_to_end(key)
            return link
        connecting = self._connecting.get(key)
        if connecting is None:
            connecting = asyncio.create_task(self._connect(key, node_id, token, client))
            self._connecting[key] = connecting
            connecting.add_done_callback(lambda task: self._connected(key, task))
        # Shielded: a waiter that gives up does not cancel the others' connect.
        return await asyncio.shield(connecting)

    def _connected(self, key: _LinkKey, task: asyncio.Task[_Link]) -> None:
        if self._connecting.get(key) is task:
            del self._connecting[key]
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have given up

    async def _connect(self, key: _LinkKey, node_id: int, token: str, client: str) -> _Link:
        addr = self.address_of(node_id)
        if addr is None:
            raise UnavailableError(
                f"no client address configured for node {node_id}: it is not in this node's "
                f"cluster.toml, and none was recorded (`metastore cluster add-node "
                f"{node_id} RAFT_ADDR --client-address HOST:PORT` records it). "
                f"{MISSING_MEMBER_FIX}"
            )
        host, port = addr
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                port,
                ssl=self.tls,
                server_hostname=host if self.tls is not None else None,
            ),
            LINK_CONNECT_TIMEOUT_S,
        )
        link = _Link(reader, writer)
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        link.fingerprint = fingerprint_of_der(der) if der else ""
        if link.fingerprint and self.revoked is not None and self.revoked(link.fingerprint):
            writer.close()
            raise UnavailableError(
                f"node {node_id}'s TLS certificate (sha256 {link.fingerprint}) is revoked: "
                "nothing is forwarded to it",
                details={"node_id": node_id, "fingerprint": link.fingerprint},
            )
        link.task = asyncio.create_task(link.read_loop())
        try:
            label = FORWARD_CLIENT
            if client:
                label = client[: L.CLIENT_NAME_CHARS_MAX - len(FORWARDED_SUFFIX)] + FORWARDED_SUFFIX
            hello = await link.request(
                "hello",
                {"token": token, "client": label},
                asyncio.get_running_loop().time() + LINK_HELLO_TIMEOUT_S,
            )
        except BaseException:
            link.close()  # no answer: do not leave its socket and reader task behind
            raise
        if not hello.get("ok"):
            link.close()
            raise MetastoreError.from_wire(hello.get("error"))
        self._links[key] = link
        # Past the bound, close the least recently used links that are idle: closing one with
        # requests in flight would fail them, their outcome unknown. Busy ones stay until a
        # later connect finds them idle.
        for old_key in [k for k, old in self._links.items() if k != key and not old.pending]:
            if len(self._links) <= L.FORWARD_CONNECTIONS_MAX:
                break
            self._links.pop(old_key).close()
        return link

    def close_revoked(self) -> int:
        """Close the links to a leader whose certificate is revoked now. Returns how many.

        No request is sent on them any more; the replies already on their way are awaited
        first (at most REVOKED_CLIENT_REPLY_GRACE_MS): one may answer the very request that
        revoked the certificate, applied here before its reply arrived."""
        if self.revoked is None:
            return 0
        gone = [
            k
            for k, link in self._links.items()
            if link.fingerprint and self.revoked(link.fingerprint)
        ]
        for key in gone:
            link = self._links.pop(key)
            log.warning(
                "closing a forwarding link to node %d: its TLS certificate (sha256 %s) is revoked",
                key[0],
                link.fingerprint,
            )
            link.revoked = True
            closing = asyncio.create_task(self._close_after_replies(link))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        return len(gone)

    @staticmethod
    async def _close_after_replies(link: _Link) -> None:
        try:
            waiting = [f for f in link.pending.values() if not f.done()]
            if waiting:
                await asyncio.wait(waiting, timeout=L.REVOKED_CLIENT_REPLY_GRACE_MS / 1000)
        finally:
            link.close()

    async def close(self) -> None:
        for connecting in list(self._connecting.values()):
            connecting.cancel()
        for closing in list(self._closing):
            closing.cancel()
        for link in self._links.values():
            link.close()
            if link.task is not None:
                link.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await link.task
        self._links.clear()
