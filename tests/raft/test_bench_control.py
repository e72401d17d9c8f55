"""The bench control protocol: frame codec, and a real client/server exchange on loopback.

No pysyncobj and no Raft here: these check the plumbing both engines' nodes are driven through.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from bench.bench_raft import EngineResult, LatencyResult, evaluate_targets, percentile
from bench.control import (
    FRAME_BYTES_MAX,
    ControlClient,
    ControlConnectionError,
    ControlProtocolError,
    ControlServer,
    ControlTimeoutError,
    FrameDecoder,
    FrameTooLargeError,
    encode_frame,
)

MESSAGES: list[dict[str, Any]] = [
    {"op": "status"},
    {"op": "propose", "data": b"\x00\x01payload\xff"},
    {"op": "load", "count": 20000, "inflight": 1000, "size": 100},
    {"ok": True, "latencies_us": [1, 250, 2**40], "elapsed_s": 1.25},
    {"ok": False, "error": "not_leader", "leader": 0, "message": "ünïcode"},
    {"nested": {"list": [None, True, b"", ""]}},
]


def decode_all(data: bytes) -> list[dict[str, Any]]:
    decoder = FrameDecoder()
    decoder.feed(data)
    out = []
    while (message := decoder.next_message()) is not None:
        out.append(message)
    return out


def test_round_trip_keeps_types_and_order() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    assert decode_all(stream) == MESSAGES
    # bytes stay bytes and str stays str (raw=False, bin type on).
    assert isinstance(decode_all(encode_frame(MESSAGES[1]))[0]["data"], bytes)


def test_decoder_handles_byte_by_byte_arrival() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    decoder = FrameDecoder()
    seen = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        while (message := decoder.next_message()) is not None:
            seen.append(message)
    assert seen == MESSAGES
    assert decoder.buffered_bytes == 0


def test_frame_layout_is_big_endian_length_plus_msgpack_map() -> None:
    frame = encode_frame({"op": "status"})
    body = msgpack.packb({"op": "status"})
    assert frame == struct.pack(">I", len(body)) + body


def test_oversized_length_prefix_is_rejected_before_buffering() -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">I", FRAME_BYTES_MAX + 1))
    with pytest.raises(FrameTooLargeError):
        decoder.next_message()


def test_oversized_message_cannot_be_encoded() -> None:
    with pytest.raises(FrameTooLargeError):
        encode_frame({"data": bytes(FRAME_BYTES_MAX)})


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb([1, 2, 3]),
        msgpack.packb({1: "int key"}),
        b"\xc1",  # never-used msgpack type byte
        msgpack.packb({"a": 1}) + b"\x00",  # trailing garbage inside the frame
    ],
)
def test_bad_bodies_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(ControlProtocolError):
        decode_all(struct.pack(">I", len(body)) + body)


# --- Server and client on 127.0.0.1 -------------------------------------------------------
class Handler:
    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        match request.get("op"):
            case "echo":
                return {"ok": True, "echo": request}
            case "boom":
                raise RuntimeError("handler bug")
            case "stall":
                self.release.wait(5.0)
                return {"ok": True, "stalled": True}
            case _:
                return {"ok": False, "error": "bad_request"}


@pytest.fixture
def served() -> Iterator[tuple[ControlServer, Handler]]:
    handler = Handler()
    server = ControlServer("127.0.0.1", 0, handler).start()
    try:
        yield server, handler
    finally:
        handler.release.set()
        server.close()


def test_client_and_server_exchange_many_requests_on_one_connection(
    served: tuple[ControlServer, Handler],
) -> None:
    server, _ = served
    with ControlClient("127.0.0.1", server.port, timeout_s=5.0) as client:
        for message in MESSAGES:
            request = {**message, "op": "echo"}
            assert client.call(request) == {"ok": True, "echo": request}
        assert client.call({"op": "nope"}) == {"ok": False, "error": "bad_request"}


def test_handler_exception_becomes_an_error_reply_and_connection_survives(
    served: tuple[ControlServer, Handler],
) -> None:
    server, _ = served
    with ControlClient("127.0.0.1", server.port, timeout_s=5.0) as client:
        reply = client.call({"op": "boom"})
        assert reply["ok"] is False
        assert reply["error"] == "internal"
        assert "handler bug" in reply["message"]
        assert client.call({"op": "echo"})["ok"] is True


def test_bad_frame_gets_a_protocol_error_then_the_server_hangs_up(
    served: tuple[ControlServer, Handler],
) -> None:
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as sock:
        body = msgpack.packb(["not", "a", "map"])
        sock.sendall(struct.pack(">I", len(body)) + body)
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    replies = decode_all(received)
    assert len(replies) == 1
    assert replies[0]["ok"] is False
    assert replies[0]["error"] == "protocol"


def test_timeout_drops_the_connection_and_the_next_call_reconnects(
    served: tuple[ControlServer, Handler],
) -> None:
    server, handler = served
    with ControlClient("127.0.0.1", server.port, timeout_s=5.0) as client:
        with pytest.raises(ControlTimeoutError):
            client.call({"op": "stall"}, timeout_s=0.2)
        handler.release.set()
        # Must not read the stalled request's late reply as the answer to this one.
        assert client.call({"op": "echo", "n": 1}) == {"ok": True, "echo": {"op": "echo", "n": 1}}


def test_connecting_to_a_closed_port_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens there any more.
    with pytest.raises(ControlConnectionError), ControlClient("127.0.0.1", port, 1.0) as client:
        client.call({"op": "status"})


# --- Pure helpers of the harness ----------------------------------------------------------
def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0


def test_targets_are_judged_on_our_numbers() -> None:
    fast = LatencyResult(samples=3, p50_ms=1.5, p99_ms=3.0, mean_ms=2.0)
    slow = LatencyResult(samples=3, p50_ms=2.5, p99_ms=3.0, mean_ms=2.0)
    for latency, expected in ((fast, True), (slow, False)):
        results = {"ours": EngineResult(engine="ours", complete=True, latency=latency)}
        targets = evaluate_targets(results, {"throughput_per_s": 1.9})
        assert targets["latency_p50_ms"]["met"] is expected
        assert targets["throughput_ratio"]["met"] is False
        assert targets["failover_median_s"]["met"] is None  # not measured: unknown, not "met"
