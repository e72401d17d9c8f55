"""One pysyncobj node serving the bench control protocol: the baseline our engine is measured by.

Run as `python -m bench.pysyncobj_node --node-id N --peers 1=127.0.0.1:P1,... --control-port C
--data-dir DIR --secret-file FILE --election-timeout-ms 300-600`, the same flags as
`raft.echo_node`, so the harness starts both engines the same way.

The replicated state is an append-only echo log reduced to `(count, digest)`: every applied
payload bumps the count and chains the digest, `digest' = sha256(digest || payload)`, starting
from 32 zero bytes. A chained digest rather than a running `hashlib` object because pysyncobj
pickles the whole object into its full dump, and hash objects cannot be pickled.

pysyncobj is configured as its users would run it with its journal on: `journalFile` and
`fullDumpFile` in the data dir, autoTick, bound to 127.0.0.1 only, election timeout from the flag.
Two configurations, chosen with `--no-batch`:
* batching (the default, pysyncobj's own default `appendEntriesUseBatch=True`): new entries
  wait for the next `appendEntriesPeriod` tick to be replicated, so a lone proposal waits about
  one period; good for throughput, poor for latency;
* `--no-batch` (`appendEntriesUseBatch=False`, pysyncobj's documented setting for "single
  request speed"): every new entry is sent to the followers at once.
Two deviations from its defaults, both forced:
* `appendEntriesPeriod` is 1/4 of the minimum election timeout (pysyncobj's own default ratio,
  0.1 s vs 0.4 s): it validates `raftMinTimeout > 3 * appendEntriesPeriod`, so the default 0.1 s
  is rejected with a 0.3 s minimum.
* No encryption: pysyncobj's `password` needs the `cryptography` package. `--secret-file` is
  accepted and ignored, so the baseline does no peer authentication (ours does).
Note also that pysyncobj 0.3.17 never fsyncs: its journal is an mmap it does not msync while
running (only on shutdown), and its meta file (term, vote, commit index) is rewritten with
write + rename and no fsync. Its entries survive a `kill -9` (the page cache keeps them) but not
a power loss; it does less work per write than an engine that fsyncs before acknowledging.

Invariants:
* A node only accepts `propose`/`load`/`latency` while it believes it is the leader; otherwise it
  replies `not_leader` with its best guess, instead of pysyncobj's silent forwarding, so both
  engines present the same contract to the harness.
* Every attribute that is not replicated state is set *before* `SyncObj.__init__`: pysyncobj
  snapshots exactly the attributes created after its constructor ran (and they must pickle).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from bench.control import (
    LATENCY_COUNT_MAX,
    LOAD_COUNT_MAX,
    LOAD_INFLIGHT_MAX,
    PAYLOAD_BYTES_MAX,
    PROPOSE_TIMEOUT_S,
    ControlServer,
    error_reply,
    run_timeout_s,
)

HOST = "127.0.0.1"
DIGEST_SEED = bytes(32)
# pysyncobj's default ratio of minimum election timeout to heartbeat period (0.4 s / 0.1 s).
HEARTBEATS_PER_ELECTION_TIMEOUT = 4

_FAIL_CODES = {
    FAIL_REASON.QUEUE_FULL: "queue_full",
    FAIL_REASON.MISSING_LEADER: "missing_leader",
    FAIL_REASON.DISCARDED: "discarded",
    FAIL_REASON.NOT_LEADER: "not_leader",
    FAIL_REASON.LEADER_CHANGED: "leader_changed",
    FAIL_REASON.REQUEST_DENIED: "request_denied",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown_outcome",
}
# pysyncobj's _RAFT_STATE values, as reported by its onStateChanged callback.
_ROLES = {0: "follower", 1: "candidate", 2: "leader"}


class BadRequestError(Exception):
    """A control request is malformed or exceeds a limit; nothing was proposed."""

    code = "bad_request"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeArgs:
    node_id: int
    peers: dict[int, str]
    control_port: int
    data_dir: Path
    secret_file: Path | None
    election_timeout_s: tuple[float, float]
    # pysyncobj's appendEntriesUseBatch: True is its default, False sends each entry at once.
    append_entries_use_batch: bool = True


def parse_peers(text: str) -> dict[int, str]:
    """`1=127.0.0.1:7001,2=...` -> {1: "127.0.0.1:7001", ...}."""
    peers: dict[int, str] = {}
    for item in text.split(","):
        node_id, sep, address = item.strip().partition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not node_id.isdigit() or not port.isdigit():
            raise argparse.ArgumentTypeError(f"bad peer {item!r}; expected ID=HOST:PORT")
        if host != HOST:
            # The baseline must listen on loopback only, like ours in the bench.
            raise argparse.ArgumentTypeError(f"peer {item!r}: only {HOST} is allowed")
        peers[int(node_id)] = address
    return peers


def parse_timeout_range(text: str) -> tuple[float, float]:
    """`300-600` (milliseconds) -> (0.3, 0.6) seconds."""
    low, sep, high = text.partition("-")
    if not sep or not low.isdigit() or not high.isdigit() or not 0 < int(low) < int(high):
        raise argparse.ArgumentTypeError(f"bad election timeout {text!r}; expected MIN-MAX in ms")
    return int(low) / 1000.0, int(high) / 1000.0


def parse_args(argv: list[str] | None = None) -> NodeArgs:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--peers", type=parse_peers, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--secret-file", type=Path, default=None)
    parser.add_argument("--election-timeout-ms", type=parse_timeout_range, default=(0.3, 0.6))
    parser.add_argument(
        "--no-batch",
        action="store_true",
        help="appendEntriesUseBatch=False: replicate each entry at once instead of on the "
        "next appendEntriesPeriod tick (pysyncobj's default is batching)",
    )
    ns = parser.parse_args(argv)
    if ns.node_id not in ns.peers:
        parser.error(f"--node-id {ns.node_id} is not in --peers")
    return NodeArgs(
        node_id=ns.node_id,
        peers=ns.peers,
        control_port=ns.control_port,
        data_dir=ns.data_dir,
        secret_file=ns.secret_file,
        election_timeout_s=ns.election_timeout_ms,
        append_entries_use_batch=not ns.no_batch,
    )


def make_payload(seq: int, size: int) -> bytes:
    """A `size`-byte payload that is unique per `seq` (for sizes of 8 bytes and up)."""
    return seq.to_bytes(8, "big").ljust(size, b"p")[:size]


def _int_field(request: dict[str, Any], name: str, low: int, high: int) -> int:
    value = request.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequestError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


class EchoLog(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type information
    # Replicated state, created on first apply (so it lands in pysyncobj's dumps) and read
    # through this class default until then. One tuple so readers on other threads never see
    # a count from one apply with the digest from another.
    _applied: tuple[int, bytes] = (0, DIGEST_SEED)

    def __init__(self, args: NodeArgs) -> None:
        # Local (non-replicated) attributes first: see the module invariants.
        self._node_id = args.node_id
        self._id_by_address = {address: node_id for node_id, address in args.peers.items()}
        self._role = "follower"
        self._seq_lock = threading.Lock()
        self._seq = 0
        min_timeout_s, max_timeout_s = args.election_timeout_s
        args.data_dir.mkdir(parents=True, exist_ok=True)
        conf = SyncObjConf(
            autoTick=True,
            journalFile=str(args.data_dir / "journal.bin"),
            fullDumpFile=str(args.data_dir / "dump.bin"),
            raftMinTimeout=min_timeout_s,
            raftMaxTimeout=max_timeout_s,
            appendEntriesPeriod=min_timeout_s / HEARTBEATS_PER_ELECTION_TIMEOUT,
            appendEntriesUseBatch=args.append_entries_use_batch,
            onStateChanged=self._on_state_changed,
        )
        self_address = args.peers[args.node_id]
        others = [address for node_id, address in args.peers.items() if node_id != args.node_id]
        super().__init__(self_address, others, conf)

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj ships no type information
    def append(self, payload: bytes) -> int:
        count, digest = self._applied
        self._applied = (count + 1, hashlib.sha256(digest + payload).digest())
        # pysyncobj bumps raftLastApplied right after this returns: +1 is this entry's index.
        return int(self.raftLastApplied) + 1

    def _on_state_changed(self, _old: int, new: int) -> None:
        self._role = _ROLES.get(new, f"state-{new}")

    def _leader_id(self) -> int:
        leader = self._getLeader()
        if leader is None:
            return 0
        return self._id_by_address.get(leader.address, 0)

    def _next_payload(self, size: int) -> bytes:
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        # High bits carry the node id so payloads from different leaders never collide.
        return make_payload((self._node_id << 48) | seq, size)

    # --- control protocol ---------------------------------------------------------------------
    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            match request.get("op"):
                case "status":
                    return self._status()
                case "applied_digest":
                    count, digest = self._applied
                    return {"ok": True, "count": count, "sha256": digest.hex()}
                case "propose":
                    data = request.get("data")
                    if not isinstance(data, bytes) or len(data) > PAYLOAD_BYTES_MAX:
                        raise BadRequestError("data must be bytes of at most PAYLOAD_BYTES_MAX")
                    return self._leader_only() or self._propose(data)
                case "load":
                    count = _int_field(request, "count", 1, LOAD_COUNT_MAX)
                    inflight = _int_field(request, "inflight", 1, LOAD_INFLIGHT_MAX)
                    size = _int_field(request, "size", 1, PAYLOAD_BYTES_MAX)
                    return self._leader_only() or self._load(count, inflight, size)
                case "latency":
                    count = _int_field(request, "count", 1, LATENCY_COUNT_MAX)
                    size = _int_field(request, "size", 1, PAYLOAD_BYTES_MAX)
                    return self._leader_only() or self._latency(count, size)
                case op:
                    raise BadRequestError(f"unknown op {op!r}")
        except BadRequestError as exc:
            return error_reply(exc.code, str(exc))

    def _status(self) -> dict[str, Any]:
        return {
            "ok": True,
            "node_id": self._node_id,
            "role": self._role,
            "leader": self._leader_id(),
            "term": int(self.raftCurrentTerm),
            "commit_index": int(self.raftCommitIndex),
            "applied_index": int(self.raftLastApplied),
            # Optional field of the protocol: lets the harness wait for a fully meshed cluster
            # before a failover round (pysyncobj redials a lost peer only every 5 s).
            "peers_connected": sorted(
                self._id_by_address.get(node.address, 0)
                for node in self.otherNodes
                if self.isNodeConnected(node)
            ),
        }

    def _leader_only(self) -> dict[str, Any] | None:
        if self._isLeader():
            return None
        return error_reply("not_leader", "this node is not the leader", leader=self._leader_id())

    def _propose(self, data: bytes) -> dict[str, Any]:
        done = threading.Event()
        outcome: list[tuple[Any, int]] = []

        def on_result(result: Any, error: int) -> None:
            outcome.append((result, error))
            done.set()

        self.append(data, callback=on_result)
        if not done.wait(PROPOSE_TIMEOUT_S):
            return error_reply("timeout", f"not applied within {PROPOSE_TIMEOUT_S} s")
        result, error = outcome[0]
        if error != FAIL_REASON.SUCCESS:
            return error_reply(_FAIL_CODES.get(error, f"fail-{error}"), "pysyncobj rejected it")
        return {"ok": True, "index": int(result)}

    def _load(self, count: int, inflight: int, size: int) -> dict[str, Any]:
        slots = threading.BoundedSemaphore(inflight)
        lock = threading.Lock()
        all_done = threading.Event()
        tally = {"acked": 0, "failed": 0, "issued": 0}
        first_error: list[int] = []

        def on_result(_result: Any, error: int) -> None:
            with lock:
                if error == FAIL_REASON.SUCCESS:
                    tally["acked"] += 1
                else:
                    tally["failed"] += 1
                    if not first_error:
                        first_error.append(error)
                finished = tally["acked"] + tally["failed"]
            slots.release()
            if finished == count:
                all_done.set()

        deadline = time.monotonic() + run_timeout_s(count)
        start = time.perf_counter()
        for _ in range(count):
            if first_error or not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
            tally["issued"] += 1
            self.append(self._next_payload(size), callback=on_result)
        if tally["issued"] == count:
            all_done.wait(max(0.0, deadline - time.monotonic()))
        elapsed_s = time.perf_counter() - start
        with lock:
            acked, failed = tally["acked"], tally["failed"]
        if acked == count:
            return {"ok": True, "acked": acked, "elapsed_s": elapsed_s}
        if first_error:
            code = _FAIL_CODES.get(first_error[0], f"fail-{first_error[0]}")
            return error_reply(code, f"{acked} acked, {failed} failed of {count}", acked=acked)
        return error_reply("timeout", f"only {acked} of {count} acked in time", acked=acked)

    def _latency(self, count: int, size: int) -> dict[str, Any]:
        latencies_us: list[int] = []
        deadline = time.monotonic() + run_timeout_s(count)
        for _ in range(count):
            if time.monotonic() > deadline:
                return error_reply("timeout", f"{len(latencies_us)} of {count} done in time")
            payload = self._next_payload(size)
            start_ns = time.perf_counter_ns()
            reply = self._propose(payload)
            if not reply["ok"]:
                return reply
            latencies_us.append((time.perf_counter_ns() - start_ns) // 1000)
        return {"ok": True, "latencies_us": latencies_us}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s node{args.node_id} %(levelname)s %(message)s"
    )
    stop = threading.Event()
    # SIGTERM from the harness: leave the wait below and shut down in order.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    node = EchoLog(args)
    server = ControlServer(HOST, args.control_port, node.handle).start()
    print(f"node {args.node_id} serving control on {HOST}:{server.port}", file=sys.stderr)
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        node.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
