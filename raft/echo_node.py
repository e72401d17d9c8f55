"""A Raft node whose state machine is an append-only list of byte payloads.

It exists to test and measure the engine on its own, as real OS processes: the multi-process tests
(kill -9, restart, snapshot catch-up, wrong secret) and `make bench-raft` start it with

    python -m raft.echo_node --node-id 1 --peers 1=127.0.0.1:7001,2=...,3=... \\
        --control-port 7101 --data-dir DIR --secret-file FILE

and talk to it over a control port (length-prefixed msgpack frames, see `bench/control.py` for
the ops). The metastore daemon is the product; this node is the engine's test bench.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack

from hlc import HybridClock, SystemClock
from raft.core.errors import NotLeaderError, RaftCoreError
from raft.core.types import Entry, EntryKind
from raft.errors import RaftError
from raft.filebytes import FILE_BYTES_CHUNK_BYTES, FileBytes, FileBytesReader, SnapshotData
from raft.framing import NEED_DATA, FrameDecoder, encode_frame
from raft.node import NodeConfig, RaftNode
from raft.transport import load_or_create_secret

CONTROL_FRAME_BYTES_MAX = 16 * 1024 * 1024
LOAD_COUNT_MAX = 10_000_000
LOAD_INFLIGHT_MAX = 10_000
PAYLOAD_BYTES_MAX = 1024 * 1024
PAGE_MAX = 100_000

log = logging.getLogger("raft.echo_node")


class EchoStateMachine:
    """Applied payloads in order, with a running digest for cheap cross-node comparison."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self._digest = hashlib.sha256()

    def apply(self, entry: Entry) -> int:
        if entry.kind is EntryKind.NORMAL:
            self.payloads.append(entry.data)
            self._digest.update(len(entry.data).to_bytes(4, "big"))
            self._digest.update(entry.data)
        return len(self.payloads)

    def snapshot(self) -> bytes:
        return msgpack.packb(self.payloads)

    def restore(self, data: SnapshotData) -> None:
        if isinstance(data, FileBytes):
            # Streamed from the file a chunk at a time: the heap holds the payloads (the
            # state) and one read buffer, never a second copy of the encoded snapshot.
            unpacker = msgpack.Unpacker(
                FileBytesReader(data),
                read_size=FILE_BYTES_CHUNK_BYTES,
                max_buffer_size=max(len(data), 1),
            )
            self.payloads = list(unpacker.unpack())
        else:
            self.payloads = list(msgpack.unpackb(data)) if data else []
        self._digest = hashlib.sha256()
        for p in self.payloads:
            self._digest.update(len(p).to_bytes(4, "big"))
            self._digest.update(p)

    def digest(self) -> str:
        return self._digest.hexdigest()


class EchoServer:
    def __init__(self, node: RaftNode, sm: EchoStateMachine) -> None:
        self.node = node
        self.sm = sm
        self._ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "status": self._status,
            "propose": self._propose,
            "load": self._load,
            "latency": self._latency,
            "applied_digest": self._applied_digest,
            "applied_payloads": self._applied_payloads,
            "read_barrier": self._read_barrier,
            "transfer_leader": self._transfer_leader,
            "add_node": self._add_node,
            "promote_node": self._promote_node,
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(max_frame_bytes=CONTROL_FRAME_BYTES_MAX)
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                decoder.feed(data)
                while True:
                    req = decoder.next_frame()
                    if req is NEED_DATA:
                        break
                    reply = await self._dispatch(req)
                    writer.write(encode_frame(reply, max_frame_bytes=CONTROL_FRAME_BYTES_MAX))
                    await writer.drain()
        except (RaftError, ConnectionError) as exc:
            log.warning("control connection closed: %s", exc)
        finally:
            writer.close()

    async def _dispatch(self, req: object) -> dict[str, Any]:
        if not isinstance(req, dict) or not isinstance(req.get("op"), str):
            return {"ok": False, "error": "bad_request", "message": "expected a map with 'op'"}
        handler = self._ops.get(req["op"])
        if handler is None:
            return {"ok": False, "error": "unknown_op", "message": f"unknown op {req['op']!r}"}
        try:
            return await handler(req)
        except NotLeaderError as exc:
            return {"ok": False, "error": "not_leader", "leader": exc.leader_hint}
        except (RaftCoreError, RaftError) as exc:
            return {"ok": False, "error": getattr(exc, "code", "error"), "message": str(exc)}
        except (TypeError, ValueError, KeyError) as exc:
            return {"ok": False, "error": "bad_request", "message": str(exc)}

    async def _status(self, _req: dict[str, Any]) -> dict[str, Any]:
        st = self.node.status()
        return {
            "ok": True,
            "node_id": self.node.node_id,
            "role": st.core.role.value,
            "leader": st.core.leader,
            "term": st.core.term,
            "commit_index": st.core.commit_index,
            "applied_index": st.core.applied_index,
            "safe_time": st.safe_time,
            "safe_time_lag_ms": st.safe_time_lag_ms,
            "ready_to_serve": st.ready_to_serve,
            "voters": list(st.core.conf.voters),
            "learners": list(st.core.conf.learners),
            "snapshot_index": st.core.snapshot_index,
            "log_start_index": st.core.log_start_index,
            "applied_count": len(self.sm.payloads),
            "fsync_seconds_total": self.node.fsync_seconds_total,
            "wal_fsyncs": st.wal.get("fsyncs", 0),
            "wal_fsync_seconds_total": st.wal.get("fsync_seconds_total", 0.0),
            "loop_iterations": self.node.loop_iterations,
            # Peers with an authenticated outbound link: the bench waits for a full mesh
            # before a failover round, so it times the election and not a reconnect.
            "peers_connected": sorted(
                peer_id
                for peer_id, peer in st.transport.get("peers", {}).items()
                if peer.get("connected")
            ),
        }

    async def _propose(self, req: dict[str, Any]) -> dict[str, Any]:
        data = _payload(req.get("data"))
        res = await self.node.propose(data, timeout_ms=int(req.get("timeout_ms", 5000)))
        return {"ok": True, "index": res.index, "tm": res.tm}

    async def _load(self, req: dict[str, Any]) -> dict[str, Any]:
        count = _bounded(req, "count", 1, LOAD_COUNT_MAX)
        inflight = _bounded(req, "inflight", 1, LOAD_INFLIGHT_MAX)
        size = _bounded(req, "size", 8, PAYLOAD_BYTES_MAX)
        if not self.node.is_leader():
            raise NotLeaderError(self.node.leader_id())
        prefix = os.urandom(4)
        pad = b"\0" * size
        # `inflight` closed-loop proposers, each awaiting one proposal at a time, like the
        # pysyncobj node's `inflight` slots: the node sees the same offered load, and the
        # generator costs one coroutine per slot instead of one per proposal plus a semaphore.
        issued = iter(range(count))
        failed: list[BaseException] = []

        async def proposer() -> None:
            for i in issued:
                body = prefix + i.to_bytes(4, "big")
                try:
                    await self.node.propose(body + pad[len(body) :], timeout_ms=30_000)
                except Exception as exc:  # noqa: BLE001 - counted and reported, like gather did
                    failed.append(exc)

        started = time.perf_counter()
        await asyncio.gather(*(proposer() for _ in range(min(inflight, count))))
        elapsed = time.perf_counter() - started
        return {
            "ok": not failed,
            "acked": count - len(failed),
            "failed": len(failed),
            "elapsed_s": elapsed,
            "error": repr(failed[0]) if failed else "",
        }

    async def _latency(self, req: dict[str, Any]) -> dict[str, Any]:
        count = _bounded(req, "count", 1, LOAD_COUNT_MAX)
        size = _bounded(req, "size", 1, PAYLOAD_BYTES_MAX)
        out = []
        for i in range(count):
            body = b"L" + i.to_bytes(4, "big")
            data = body + b"\0" * max(0, size - len(body))
            t0 = time.perf_counter_ns()
            await self.node.propose(data, timeout_ms=10_000)
            out.append((time.perf_counter_ns() - t0) // 1000)
        return {"ok": True, "latencies_us": out}

    async def _applied_digest(self, _req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "count": len(self.sm.payloads), "sha256": self.sm.digest()}

    async def _applied_payloads(self, req: dict[str, Any]) -> dict[str, Any]:
        start = _bounded(req, "start", 0, 1 << 62)
        limit = _bounded(req, "limit", 1, PAGE_MAX)
        return {
            "ok": True,
            "total": len(self.sm.payloads),
            "payloads": self.sm.payloads[start : start + limit],
        }

    async def _read_barrier(self, _req: dict[str, Any]) -> dict[str, Any]:
        index = await self.node.read_barrier()
        return {"ok": True, "index": index}

    async def _transfer_leader(self, req: dict[str, Any]) -> dict[str, Any]:
        await self.node.transfer_leader(_bounded(req, "target", 1, 1 << 31))
        return {"ok": True}

    async def _add_node(self, req: dict[str, Any]) -> dict[str, Any]:
        """Add a learner (a process started with --join at `host`:`port`)."""
        host = req.get("host")
        if not isinstance(host, str):
            raise ValueError("'host' must be a string")
        node_id = _bounded(req, "node_id", 1, 1 << 31)
        port = _bounded(req, "port", 1, 65535)
        index = await self.node.add_node(node_id, (host, port), learner=True)
        return {"ok": True, "index": index}

    async def _promote_node(self, req: dict[str, Any]) -> dict[str, Any]:
        index = await self.node.promote_node(_bounded(req, "node_id", 1, 1 << 31))
        return {"ok": True, "index": index}


def _payload(v: object) -> bytes:
    if not isinstance(v, bytes) or len(v) > PAYLOAD_BYTES_MAX:
        raise ValueError(f"'data' must be bytes of at most {PAYLOAD_BYTES_MAX}")
    return v


def _bounded(req: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = req.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{key!r} must be an integer in [{lo}, {hi}]")
    return v


def parse_peers(text: str) -> dict[int, tuple[str, int]]:
    peers = {}
    for part in text.split(","):
        node, _, addr = part.partition("=")
        host, _, port = addr.rpartition(":")
        if not node.strip().isdigit() or not host or not port.isdigit():
            raise argparse.ArgumentTypeError(f"bad peer {part!r}; expected ID=HOST:PORT")
        peers[int(node)] = (host, int(port))
    return peers


def parse_timeout(text: str) -> int:
    lo, _, hi = text.partition("-")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        raise argparse.ArgumentTypeError("expected MS or MIN-MAX (max is twice min)")
    if hi and int(hi) != 2 * int(lo):
        raise argparse.ArgumentTypeError("election timeouts are drawn from [MIN, 2*MIN)")
    return int(lo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raft.echo_node", description=__doc__)
    ap.add_argument("--node-id", type=int, required=True)
    ap.add_argument("--peers", type=parse_peers, required=True, help="ID=HOST:PORT,...")
    ap.add_argument("--control-port", type=int, required=True)
    ap.add_argument("--control-host", default="127.0.0.1")
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--secret-file", type=Path, required=True)
    ap.add_argument("--cluster-id", default="echo")
    ap.add_argument("--election-timeout-ms", type=parse_timeout, default=300)
    ap.add_argument("--tick-ms", type=int, default=10)
    ap.add_argument("--snapshot-every", type=int, default=10_000)
    ap.add_argument("--no-fsync", action="store_true", help="unsafe; for comparisons only")
    ap.add_argument(
        "--join", action="store_true", help="start without membership; wait to be added"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("RAFT_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s node={args.node_id} %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    if args.node_id not in args.peers:
        ap.error(f"--peers must include this node ({args.node_id})")
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # uvloop is optional: the default loop works, slower
        pass
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    secret = load_or_create_secret(args.secret_file)
    host, port = args.peers[args.node_id]
    cfg = NodeConfig(
        node_id=args.node_id,
        cluster_id=args.cluster_id,
        data_dir=args.data_dir,
        listen_host=host,
        listen_port=port,
        peers=args.peers,
        secret=secret,
        tick_ms=args.tick_ms,
        election_timeout_ms=args.election_timeout_ms,
        fsync=not args.no_fsync,
        snapshot_every_entries=args.snapshot_every,
        join=args.join,
    )
    sm = EchoStateMachine()
    stop = asyncio.Event()
    node = RaftNode(cfg, sm, clock=HybridClock(SystemClock()), on_fatal=lambda _e: stop.set())
    await node.start()
    server = EchoServer(node, sm)
    control = await asyncio.start_server(server.handle, args.control_host, args.control_port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("serving control on %s:%d", args.control_host, args.control_port)
    await stop.wait()
    control.close()
    await node.stop()
    return 1 if node.stopped_reason.startswith("fatal") else 0


if __name__ == "__main__":
    sys.exit(main())
