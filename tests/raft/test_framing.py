"""The sans-I/O frame codec: round trips under any chunking, limits, and a decoder fuzz target."""

from __future__ import annotations

import itertools

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raft.errors import (
    FrameEncodeError,
    FrameTooLargeError,
    InvalidLimitError,
    MalformedFrameError,
)
from raft.framing import (
    _UNPACK_NESTING_MAX,
    FRAME_HEADER_BYTES,
    NEED_DATA,
    FrameDecoder,
    encode_frame,
    msgpack_bin_header,
)

LIMIT = 1024

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


def frame_of(body: bytes) -> bytes:
    return len(body).to_bytes(FRAME_HEADER_BYTES, "big") + body


def drain(decoder: FrameDecoder) -> list[object]:
    out = []
    while (obj := decoder.next_frame()) is not NEED_DATA:
        out.append(obj)
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """Cut `data` at the given positions (any order, duplicates and out-of-range allowed)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@given(st.lists(msgpack_values, max_size=8), st.lists(st.integers(min_value=0), max_size=30))
def test_frames_round_trip_under_any_chunking(objs: list[object], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(o, max_frame_bytes=LIMIT * 64) for o in objs)
    decoder = FrameDecoder(LIMIT * 64)
    got: list[object] = []
    for chunk in split(stream, cuts):
        decoder.feed(chunk)
        got.extend(drain(decoder))
    assert got == objs
    assert decoder.buffered_bytes == 0


def test_header_is_big_endian_length_of_msgpack_body() -> None:
    frame = encode_frame({"a": [1, b"x"]}, max_frame_bytes=LIMIT)
    body = msgpack.packb({"a": [1, b"x"]}, use_bin_type=True)
    assert frame == len(body).to_bytes(4, "big") + body


def test_body_exactly_at_limit_passes_and_one_more_byte_is_refused() -> None:
    # bin8 header is 2 bytes, so a 98-byte payload makes a 100-byte body.
    at_limit = encode_frame(b"x" * 98, max_frame_bytes=100)
    assert len(at_limit) == FRAME_HEADER_BYTES + 100
    decoder = FrameDecoder(100)
    decoder.feed(at_limit)
    assert decoder.next_frame() == b"x" * 98
    with pytest.raises(FrameTooLargeError):
        encode_frame(b"x" * 99, max_frame_bytes=100)
    decoder.feed(frame_of(msgpack.packb(b"x" * 99)))
    with pytest.raises(FrameTooLargeError, match="101 bytes"):
        decoder.next_frame()


def test_unencodable_object_is_a_typed_error() -> None:
    with pytest.raises(FrameEncodeError):
        encode_frame(object(), max_frame_bytes=LIMIT)
    with pytest.raises(FrameEncodeError):
        encode_frame(2**64, max_frame_bytes=LIMIT)


@pytest.mark.parametrize("limit", [0, -1, 2**32])
def test_limit_outside_header_capacity_is_refused(limit: int) -> None:
    with pytest.raises(InvalidLimitError):
        FrameDecoder(limit)
    with pytest.raises(InvalidLimitError):
        encode_frame(1, max_frame_bytes=limit)


def test_oversized_header_refused_before_body_and_body_never_buffered() -> None:
    decoder = FrameDecoder(LIMIT)
    decoder.feed((LIMIT + 1).to_bytes(4, "big"))
    # Nothing of the (absent) body is needed to know the frame is refused.
    assert decoder.buffered_bytes == 0
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()


def test_oversized_body_fed_without_draining_is_discarded() -> None:
    decoder = FrameDecoder(LIMIT)
    decoder.feed((2**32 - 1).to_bytes(4, "big"))
    for _ in range(100):
        decoder.feed(b"\x00" * 4096)
    assert decoder.buffered_bytes == 0
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()


def test_frames_before_a_bad_frame_are_still_returned_in_order() -> None:
    good = encode_frame(1, max_frame_bytes=LIMIT) + encode_frame(2, max_frame_bytes=LIMIT)
    decoder = FrameDecoder(LIMIT)
    decoder.feed(good + (LIMIT + 1).to_bytes(4, "big") + b"body")
    assert decoder.next_frame() == 1
    assert decoder.next_frame() == 2
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()


def test_decoder_is_dead_after_an_error() -> None:
    decoder = FrameDecoder(LIMIT)
    decoder.feed(frame_of(b"\xc1"))  # 0xc1 is never used in msgpack
    with pytest.raises(MalformedFrameError):
        decoder.next_frame()
    # The stream is out of sync: a valid frame afterwards must not be accepted.
    with pytest.raises(MalformedFrameError):
        decoder.feed(encode_frame(1, max_frame_bytes=LIMIT))
    with pytest.raises(MalformedFrameError):
        decoder.next_frame()


def test_empty_feed_and_partial_header_need_data() -> None:
    decoder = FrameDecoder(LIMIT)
    decoder.feed(b"")
    assert decoder.next_frame() is NEED_DATA
    decoder.feed(b"\x00\x00")
    assert decoder.next_frame() is NEED_DATA
    assert decoder.buffered_bytes == 2


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "undecodable"),  # zero-length frame holds no object
        (msgpack.packb(1) + b"\x00", "trailing"),
        (msgpack.packb([1, 2]) + msgpack.packb(3), "trailing"),
        (b"\x92\x01", "undecodable"),  # array of 2 with one element: truncated inside the frame
        (b"\xc1", "undecodable .*: byte 0xc1 where a value begins"),
        (msgpack.packb(msgpack.ExtType(5, b"abc")), "ext"),
        (b"\xc7\x00\x05", "ext type 5"),  # ext8 of length 0
        (b"\xc7\x00\xff", "timestamp"),  # empty timestamp
        (msgpack.packb(msgpack.Timestamp(1, 2)), "ext"),
        (msgpack.packb(msgpack.Timestamp(1, 0)), "ext"),
        (msgpack.packb(msgpack.Timestamp(2**40, 5)), "ext"),
        (b"\xa2\xff\xfe", "undecodable"),  # str that is not UTF-8
        (b"\x81\x01\x02", "undecodable"),  # int map key
        (b"\x81\x90\x02", "undecodable"),  # array map key
        # Nesting beyond msgpack's stack: msgpack says nothing (an empty message), the error must.
        (b"\x91" * 5000 + b"\x01", "undecodable .*: nested deeper than"),
        (b"\xc6\x7f\xff\xff\xff", "undecodable"),  # bin32 claiming 2 GiB inside a 5-byte frame
        (b"\xdd\x7f\xff\xff\xff", "undecodable"),  # array32 claiming 2**31 items
    ],
)
def test_malformed_bodies_are_typed_errors(body: bytes, reason: str) -> None:
    decoder = FrameDecoder(8192)
    decoder.feed(frame_of(body))
    with pytest.raises(MalformedFrameError, match=reason):
        decoder.next_frame()


def test_the_nesting_named_in_errors_is_the_decoders() -> None:
    # The error names how deep msgpack nests (it says nothing itself): that many levels of
    # arrays decode, one more is refused.
    deepest = b"\x91" * (_UNPACK_NESTING_MAX - 1) + b"\x90"
    decoder = FrameDecoder(8192)
    decoder.feed(frame_of(deepest) + frame_of(b"\x91" + deepest))
    assert isinstance(decoder.next_frame(), list)
    with pytest.raises(MalformedFrameError, match=f"{_UNPACK_NESTING_MAX} levels"):
        decoder.next_frame()


def test_size_limits_inside_the_frame_come_from_max_frame_bytes() -> None:
    # A frame of 600 bytes is fine for a 1024 limit; msgpack's own limits must not be stricter.
    body = msgpack.packb({"k": "s" * 300, "b": b"x" * 290})
    decoder = FrameDecoder(LIMIT)
    decoder.feed(frame_of(body))
    assert decoder.next_frame() == {"k": "s" * 300, "b": b"x" * 290}


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb([[None] * 3] * 30),  # 30 + 90 items over the levels
        msgpack.packb({"a": [1] * 100}),  # a map pair and a long array
        msgpack.packb([1] * 101),  # one array alone over the budget
    ],
    ids=["nested", "map", "flat"],
)
def test_a_frame_with_more_items_than_its_budget_is_refused(body: bytes) -> None:
    decoder = FrameDecoder(8192, max_items=100)
    decoder.feed(frame_of(body))
    with pytest.raises(MalformedFrameError, match=r"more than 100|exceeds max_"):
        decoder.next_frame()


def test_a_frame_within_its_item_budget_decodes() -> None:
    decoder = FrameDecoder(8192, max_items=100)
    obj = [[None] * 3] * 24 + [{"a": 1}]  # 25 + 72 + 1 items
    decoder.feed(frame_of(msgpack.packb(obj)))
    assert decoder.next_frame() == obj


def test_the_item_budget_can_change_between_frames() -> None:
    # A server decodes a stranger's first frame (its hello) under a small budget and the
    # frames after it under the authenticated one, on the same stream.
    decoder = FrameDecoder(8192, max_items=10)
    assert decoder.max_items == 10
    hello = {"a": 1}
    decoder.feed(frame_of(msgpack.packb(hello)) + frame_of(msgpack.packb([0] * 50)))
    assert decoder.next_frame() == hello
    decoder.max_items = 100
    assert decoder.next_frame() == [0] * 50
    decoder.max_items = None  # as many as its bytes can hold
    decoder.feed(frame_of(msgpack.packb([0] * 500)))
    assert decoder.next_frame() == [0] * 500
    with pytest.raises(InvalidLimitError):
        decoder.max_items = 0


def _is_plain(obj: object) -> bool:
    """Only the kinds msgpack's core types map to: no ExtType, Timestamp or anything custom."""
    if obj is None or type(obj) in (bool, int, float, str, bytes):
        return True
    if type(obj) is list:
        return all(_is_plain(x) for x in obj)
    if type(obj) is dict:
        return all(type(k) in (str, bytes) and _is_plain(v) for k, v in obj.items())
    return False


def _fuzz_run(decoder: FrameDecoder, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            for obj in drain(decoder):
                assert _is_plain(obj), obj
    except (FrameTooLargeError, MalformedFrameError):
        return
    # Whatever is left over is at most an incomplete frame within the limit.
    assert decoder.buffered_bytes <= FRAME_HEADER_BYTES + decoder.max_frame_bytes


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.binary(max_size=600), st.lists(st.integers(min_value=0), max_size=20))
def test_fuzz_arbitrary_bytes_yield_objects_or_typed_errors(data: bytes, cuts: list[int]) -> None:
    _fuzz_run(FrameDecoder(256), split(data, cuts))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(
    st.lists(
        st.one_of(
            msgpack_values.map(lambda o: encode_frame(o, max_frame_bytes=2**20)),
            st.binary(max_size=30).map(frame_of),  # well-framed garbage bodies
            st.binary(max_size=6),  # raw garbage that desynchronises the stream
        ),
        max_size=8,
    ),
    st.lists(st.integers(min_value=0), max_size=20),
)
def test_fuzz_mostly_valid_streams_yield_objects_or_typed_errors(
    pieces: list[bytes], cuts: list[int]
) -> None:
    _fuzz_run(FrameDecoder(512), split(b"".join(pieces), cuts))


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 70_000])
def test_msgpack_bin_header_frames_bytes_as_msgpack_does(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert msgpack_bin_header(size) + data == msgpack.packb(data, use_bin_type=True)


@pytest.mark.parametrize("size", [-1, 2**32])
def test_msgpack_bin_header_refuses_impossible_sizes(size: int) -> None:
    with pytest.raises(FrameEncodeError):
        msgpack_bin_header(size)
