"""The peer message codec: exact round trips of every message type, and every malformed field."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raft.core.types import (
    AppendEntries,
    AppendResponse,
    ConfState,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    RequestVote,
    Snapshot,
    SnapshotMeta,
    TimeoutNow,
    VoteResponse,
)
from raft.errors import MalformedConfStateError, MalformedMessageError
from raft.framing import NEED_DATA, FrameDecoder, encode_frame
from raft.wire import (
    decode_address_book,
    decode_conf_state,
    decode_install_snapshot,
    decode_message,
    encode_address_book,
    encode_conf_state,
    encode_install_snapshot_head,
    encode_message,
)

U64_MAX = 2**64 - 1
u64 = st.integers(min_value=0, max_value=U64_MAX)
node_ids = st.integers(min_value=1, max_value=U64_MAX)
# Small ids as well, since real clusters use them and they pack differently from huge ones.
ids = st.one_of(st.integers(min_value=1, max_value=7), node_ids)

terms = st.integers(min_value=1, max_value=U64_MAX)  # a leader's or candidate's term


@st.composite
def src_dst(draw: st.DrawFn) -> tuple[int, int]:
    src = draw(ids)
    return src, draw(ids.filter(lambda dst: dst != src))


@st.composite
def conf_states(draw: st.DrawFn) -> ConfState:
    members = draw(st.lists(ids, unique=True, max_size=7))
    split = draw(st.integers(min_value=0, max_value=len(members)))
    return ConfState(voters=tuple(members[:split]), learners=tuple(members[split:]))


hosts = st.text(alphabet=st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=40)
addresses = st.tuples(hosts, st.integers(min_value=1, max_value=65535))


@st.composite
def address_books(draw: st.DrawFn) -> bytes:
    """A CONF entry's context as a node writes it: b"" or an address book."""
    book = draw(st.dictionaries(ids, addresses, max_size=5))
    return encode_address_book(book) if book or draw(st.booleans()) else b""


@st.composite
def snapshots(draw: st.DrawFn, *, term: int = U64_MAX) -> Snapshot:
    """A snapshot a leader of `term` can send: of a real position."""
    meta = SnapshotMeta(
        index=draw(st.integers(min_value=1, max_value=U64_MAX)),
        term=draw(st.integers(min_value=1, max_value=term)),
        tm=draw(u64),
        conf=draw(conf_states()),
    )
    return Snapshot(meta=meta, data=draw(st.binary(max_size=256)))


@st.composite
def append_entries(draw: st.DrawFn) -> AppendEntries:
    """An AppendEntries a leader can send: its entries continue its log at prev_index."""
    src, dst = draw(src_dst())
    term = draw(terms)
    prev_term = draw(st.integers(min_value=0, max_value=term))
    count = draw(st.integers(min_value=0, max_value=5))
    prev_index = draw(st.integers(min_value=0, max_value=U64_MAX - count))
    entry_terms = sorted(
        draw(st.lists(st.integers(prev_term, term), min_size=count, max_size=count))
    )
    tms = sorted(draw(st.lists(u64, min_size=count, max_size=count, unique=True)))
    kinds = draw(st.lists(st.sampled_from(EntryKind), min_size=count, max_size=count))
    items = []
    for i, (entry_term, tm, kind) in enumerate(zip(entry_terms, tms, kinds, strict=True)):
        if kind is EntryKind.CONF:
            data = encode_conf_state(draw(conf_states()), context=draw(address_books()))
        else:
            data = draw(st.binary(max_size=64))
        items.append(Entry(term=entry_term, index=prev_index + 1 + i, tm=tm, kind=kind, data=data))
    return AppendEntries(
        src=src,
        dst=dst,
        term=term,
        prev_index=prev_index,
        prev_term=prev_term,
        entries=tuple(items),
        commit=draw(u64),
    )


@st.composite
def request_votes(draw: st.DrawFn) -> RequestVote:
    src, dst = draw(src_dst())
    term = draw(terms)
    return RequestVote(
        src=src,
        dst=dst,
        term=term,
        last_index=draw(u64),
        last_term=draw(st.integers(min_value=0, max_value=term)),
        pre_vote=draw(st.booleans()),
        force=draw(st.booleans()),
    )


@st.composite
def install_snapshots(draw: st.DrawFn) -> InstallSnapshot:
    src, dst = draw(src_dst())
    term = draw(terms)
    return InstallSnapshot(
        src=src, dst=dst, term=term, snapshot=draw(snapshots(term=term)), commit=draw(u64)
    )


def _with_incarnations(
    build: st.SearchStrategy[Heartbeat | HeartbeatResponse],
) -> st.SearchStrategy[Message]:
    """`build` with the incarnations a node sends: none (a version-5 peer, or not stamped),
    or its own (>= 1) and the one of the clock it echoes (0 without an echo)."""

    def stamp(m: Heartbeat | HeartbeatResponse, incarnation: int, echo_incarnation: int) -> Message:
        if not incarnation:
            return m
        echoed = echo_incarnation if m.echo_ms else 0
        return dataclasses.replace(m, incarnation=incarnation, echo_incarnation=echoed)

    return st.builds(stamp, build, u64, u64)


def _with_ends(build: st.SearchStrategy[Message]) -> st.SearchStrategy[Message]:
    """`build` with src and dst replaced by two different node ids."""
    return st.tuples(build, src_dst()).map(
        lambda pair: dataclasses.replace(pair[0], src=pair[1][0], dst=pair[1][1])
    )


messages: st.SearchStrategy[Message] = st.one_of(
    append_entries(),
    _with_ends(
        st.builds(
            AppendResponse,
            src=ids,
            dst=ids,
            term=u64,
            index=u64,
            reject=st.booleans(),
            reject_hint=u64,
            reject_term=u64,
        )
    ),
    request_votes(),
    _with_ends(
        st.builds(
            VoteResponse,
            src=ids,
            dst=ids,
            term=u64,
            granted=st.booleans(),
            pre_vote=st.booleans(),
        )
    ),
    _with_ends(
        _with_incarnations(
            st.builds(
                Heartbeat,
                src=ids,
                dst=ids,
                term=terms,
                commit=u64,
                read_ctx=u64,
                clock_ms=u64,
                echo_ms=st.one_of(st.just(0), u64),
            )
        )
    ),
    _with_ends(
        _with_incarnations(
            st.builds(
                HeartbeatResponse,
                src=ids,
                dst=ids,
                term=u64,
                read_ctx=u64,
                clock_ms=u64,
                echo_ms=st.one_of(st.just(0), u64),
            )
        )
    ),
    install_snapshots(),
    _with_ends(st.builds(TimeoutNow, src=ids, dst=ids, term=terms)),
)


def through_a_frame(obj: object) -> object:
    decoder = FrameDecoder(2**20)
    decoder.feed(encode_frame(obj, max_frame_bytes=2**20))
    out = decoder.next_frame()
    assert out is not NEED_DATA
    return out


@given(messages)
def test_every_message_round_trips_exactly(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg
    decoded = decode_message(through_a_frame(encode_message(msg)))
    assert decoded == msg
    assert type(decoded) is type(msg)


@given(
    install_snapshots(),
    st.sampled_from([0, 1, 255, 256, 65535, 65536, 70_000]),
)
def test_install_snapshot_head_plus_data_is_the_whole_encoding(
    sample: InstallSnapshot, data_bytes: int
) -> None:
    # Sizes around the msgpack bin 8/16/32 boundaries: the head ends with the data's bin header.
    snap = Snapshot(meta=sample.snapshot.meta, data=b"s" * data_bytes)
    msg = dataclasses.replace(sample, snapshot=snap)
    whole = encode_install_snapshot_head(msg) + snap.data
    assert whole == msgpack.packb(encode_message(msg), use_bin_type=True)
    assert decode_message(msgpack.unpackb(whole)) == msg
    # The zero-copy decoder gives the same message, its data a read-only view into `whole`.
    view = memoryview(whole)
    got = decode_install_snapshot(view)
    assert got == msg
    assert isinstance(got.snapshot.data, memoryview) and got.snapshot.data.readonly
    assert got.snapshot.data.obj is whole


def test_the_zero_copy_install_snapshot_decoder_refuses_what_decode_message_refuses() -> None:
    snap = Snapshot(
        meta=SnapshotMeta(index=3, term=1, conf=ConfState(voters=(1,))), data=b"x" * 300
    )
    msg = InstallSnapshot(src=1, dst=2, term=1, snapshot=snap, commit=2)
    whole = encode_install_snapshot_head(msg) + snap.data
    bad = {
        "truncated data": whole[:-1],
        "trailing bytes": whole + b"\x00",
        "only a head": whole[:10],
        "empty": b"",
        "another message": msgpack.packb(encode_message(TimeoutNow(src=1, dst=2, term=1))),
        "data not bin": msgpack.packb([7, 1, 2, 1, 2, [[3, 1, 0, [[1], []]], "text"]]),
        "node id zero": msgpack.packb([7, 0, 2, 1, 2, [[3, 1, 0, [[1], []]], b"x"]]),
        "not msgpack": b"\xc1" * 40,
    }
    for what, encoded in bad.items():
        try:
            decode_install_snapshot(memoryview(encoded))
        except MalformedMessageError:
            continue
        pytest.fail(f"accepted: {what}")


@given(append_entries().filter(lambda m: bool(m.entries)))
def test_entry_kind_decodes_to_the_enum(msg: AppendEntries) -> None:
    decoded = decode_message(through_a_frame(encode_message(msg)))
    assert isinstance(decoded, AppendEntries)
    assert all(type(e.kind) is EntryKind for e in decoded.entries)


@given(conf_states(), address_books())
def test_conf_state_round_trips_exactly(conf: ConfState, context: bytes) -> None:
    assert decode_conf_state(encode_conf_state(conf, context=context)) == conf


@given(st.dictionaries(ids, addresses, max_size=5))
def test_address_book_round_trips_exactly(book: dict[int, tuple[str, int]]) -> None:
    assert decode_address_book(encode_address_book(book)) == book


def test_tags_and_field_order_are_fixed() -> None:
    # The wire format is the order; pin it so a reordering cannot slip in unnoticed.
    msg = RequestVote(src=1, dst=2, term=3, last_index=4, last_term=5, pre_vote=True)
    assert encode_message(msg) == [3, 1, 2, 3, 4, 5, True, False]
    entry = Entry(term=1, index=2, tm=3, kind=EntryKind.TICK, data=b"d")
    append = AppendEntries(
        src=1, dst=2, term=3, prev_index=4, prev_term=5, entries=(entry,), commit=6
    )
    assert encode_message(append) == [1, 1, 2, 3, 4, 5, [[1, 2, 3, 2, b"d"]], 6]
    snap = Snapshot(
        meta=SnapshotMeta(index=9, term=8, tm=7, conf=ConfState(voters=(1, 2), learners=(3,))),
        data=b"s",
    )
    assert encode_message(InstallSnapshot(src=1, dst=2, term=3, snapshot=snap, commit=11)) == [
        7,
        1,
        2,
        3,
        11,
        [[9, 8, 7, [[1, 2], [3]]], b"s"],
    ]
    assert msgpack.unpackb(encode_conf_state(ConfState(voters=(1,)))) == [1, [1], [], b""]


def test_heartbeats_carry_incarnations_in_a_long_form_and_version_5_peers_get_the_short_one() -> (
    None
):
    """Peer protocol version 6 appends the sender's incarnation and the echoed clock's to both
    heartbeats; a link to a version-5 peer sends the short form, which that release decodes
    (its decoder wants exactly 8 and 7 items), and which decodes here with no incarnations."""
    beat = Heartbeat(
        src=1,
        dst=2,
        term=3,
        commit=4,
        read_ctx=5,
        clock_ms=6,
        echo_ms=7,
        incarnation=8,
        echo_incarnation=9,
    )
    answer = HeartbeatResponse(
        src=2, dst=1, term=3, read_ctx=5, clock_ms=6, echo_ms=7, incarnation=8, echo_incarnation=9
    )
    assert encode_message(beat) == [5, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert encode_message(answer) == [6, 2, 1, 3, 5, 6, 7, 8, 9]
    short_beat = encode_message(beat, with_incarnations=False)
    short_answer = encode_message(answer, with_incarnations=False)
    assert short_beat == [5, 1, 2, 3, 4, 5, 6, 7]
    assert short_answer == [6, 2, 1, 3, 5, 6, 7]
    unstamped = dataclasses.replace(beat, incarnation=0, echo_incarnation=0)
    assert decode_message(through_a_frame(short_beat)) == unstamped
    assert decode_message(short_answer) == dataclasses.replace(
        answer, incarnation=0, echo_incarnation=0
    )
    assert encode_message(unstamped) == short_beat  # nothing stamped: the short form
    # Only heartbeats change: the other messages encode alike for either version.
    vote = RequestVote(src=1, dst=2, term=3, last_index=4, last_term=1)
    assert encode_message(vote, with_incarnations=False) == encode_message(vote)


# ---- malformed fields -----------------------------------------------------------------------

ENTRY = Entry(term=1, index=5, tm=3, kind=EntryKind.NORMAL, data=b"x")
SNAP = Snapshot(
    meta=SnapshotMeta(index=5, term=1, tm=9, conf=ConfState(voters=(1, 2), learners=(3,))),
    data=b"state",
)

# One valid sample per type with the name and kind of each field after the tag.
SCHEMAS: list[tuple[Message, list[tuple[str, str]]]] = [
    (
        AppendEntries(src=1, dst=2, term=3, prev_index=4, prev_term=1, entries=(ENTRY,), commit=2),
        [
            ("src", "id"),
            ("dst", "id"),
            ("term", "u64"),
            ("prev_index", "u64"),
            ("prev_term", "u64"),
            ("entries", "array"),
            ("commit", "u64"),
        ],
    ),
    (
        AppendResponse(src=1, dst=2, term=3, index=4, reject=True, reject_hint=2, reject_term=1),
        [
            ("src", "id"),
            ("dst", "id"),
            ("term", "u64"),
            ("index", "u64"),
            ("reject", "bool"),
            ("reject_hint", "u64"),
            ("reject_term", "u64"),
        ],
    ),
    (
        RequestVote(src=1, dst=2, term=3, last_index=4, last_term=1),
        [
            ("src", "id"),
            ("dst", "id"),
            ("term", "u64"),
            ("last_index", "u64"),
            ("last_term", "u64"),
            ("pre_vote", "bool"),
            ("force", "bool"),
        ],
    ),
    (
        VoteResponse(src=1, dst=2, term=3, granted=True),
        [("src", "id"), ("dst", "id"), ("term", "u64"), ("granted", "bool"), ("pre_vote", "bool")],
    ),
    (
        Heartbeat(src=1, dst=2, term=3, commit=4, read_ctx=5),
        [("src", "id"), ("dst", "id"), ("term", "u64"), ("commit", "u64"), ("read_ctx", "u64")],
    ),
    (
        HeartbeatResponse(src=1, dst=2, term=3, read_ctx=5),
        [("src", "id"), ("dst", "id"), ("term", "u64"), ("read_ctx", "u64")],
    ),
    # The long forms (peer protocol version 6): every field, the incarnations too.
    (
        Heartbeat(
            src=1,
            dst=2,
            term=3,
            commit=4,
            read_ctx=5,
            clock_ms=6,
            echo_ms=7,
            incarnation=8,
            echo_incarnation=9,
        ),
        [
            ("src", "id"),
            ("dst", "id"),
            ("term", "u64"),
            ("commit", "u64"),
            ("read_ctx", "u64"),
            ("clock_ms", "u64"),
            ("echo_ms", "u64"),
            ("incarnation", "incarnation"),
            ("echo_incarnation", "u64"),
        ],
    ),
    (
        HeartbeatResponse(
            src=1,
            dst=2,
            term=3,
            read_ctx=5,
            clock_ms=6,
            echo_ms=7,
            incarnation=8,
            echo_incarnation=9,
        ),
        [
            ("src", "id"),
            ("dst", "id"),
            ("term", "u64"),
            ("read_ctx", "u64"),
            ("clock_ms", "u64"),
            ("echo_ms", "u64"),
            ("incarnation", "incarnation"),
            ("echo_incarnation", "u64"),
        ],
    ),
    (
        InstallSnapshot(src=1, dst=2, term=3, snapshot=SNAP, commit=4),
        [("src", "id"), ("dst", "id"), ("term", "u64"), ("commit", "u64"), ("snapshot", "array")],
    ),
    (TimeoutNow(src=1, dst=2, term=3), [("src", "id"), ("dst", "id"), ("term", "u64")]),
]

BAD_VALUES: dict[str, list[object]] = {
    "u64": [-1, 2**64, True, False, 1.0, "1", b"1", None, [1]],
    "id": [0, -1, 2**64, True, 1.0, "1", None],
    "incarnation": [0, -1, 2**64, True, 1.0, "1", None],
    "bool": [0, 1, "true", None, b"\x01"],
    "bytes": [None, "text", 1, [1], bytearray(b"x")],
    "array": [None, 1, "x", b"x", {"a": 1}],
}


def _field_cases() -> list[tuple[list[object], str]]:
    cases = []
    for sample, fields in SCHEMAS:
        name = type(sample).__name__
        good = encode_message(sample)
        for pos, (field, kind) in enumerate(fields, start=1):
            for bad in BAD_VALUES[kind]:
                obj = list(good)
                obj[pos] = bad
                cases.append((obj, f"{name}.{field}"))
    return cases


@pytest.mark.parametrize(("obj", "where"), _field_cases())
def test_every_bad_top_level_field_is_named(obj: list[object], where: str) -> None:
    with pytest.raises(MalformedMessageError) as info:
        decode_message(obj)
    assert str(info.value).startswith(f"{where}:"), str(info.value)


def _append(entry_fields: object) -> list[object]:
    return [1, 1, 2, 3, 0, 0, [[1, 1, 1, 0, b""], entry_fields], 0]


def _snap(snapshot: object) -> list[object]:
    return [7, 1, 2, 3, 4, snapshot]


META_OK: list[object] = [5, 1, 9, [[1, 2], [3]]]

NESTED_CASES: list[tuple[object, str]] = [
    # entries
    (_append([1, 1, 1, 0]), "AppendEntries.entries[1]: expected 5 fields"),
    (_append([1, 1, 1, 0, b"", 0]), "AppendEntries.entries[1]: expected 5 fields"),
    (_append("entry"), "AppendEntries.entries[1]: expected an array"),
    (_append([-1, 1, 1, 0, b""]), "AppendEntries.entries[1].term"),
    (_append([1, 2**64, 1, 0, b""]), "AppendEntries.entries[1].index"),
    (_append([1, 1, True, 0, b""]), "AppendEntries.entries[1].tm"),
    (_append([1, 1, 1, 4, b""]), "AppendEntries.entries[1].kind"),
    (_append([1, 1, 1, -1, b""]), "AppendEntries.entries[1].kind"),
    (_append([1, 1, 1, True, b""]), "AppendEntries.entries[1].kind"),
    (_append([1, 1, 1, "NORMAL", b""]), "AppendEntries.entries[1].kind"),
    (_append([1, 1, 1, 0, "text"]), "AppendEntries.entries[1].data"),
    (_append([1, 1, 1, 0, None]), "AppendEntries.entries[1].data"),
    # snapshots
    (_snap([META_OK]), "InstallSnapshot.snapshot: expected 2 fields"),
    (_snap([META_OK, "state"]), "InstallSnapshot.snapshot.data"),
    (_snap([[5, 1, 9], b""]), "InstallSnapshot.snapshot.meta: expected 4 fields"),
    (_snap([None, b""]), "InstallSnapshot.snapshot.meta: expected an array"),
    (_snap([[-5, 1, 9, [[1], []]], b""]), "InstallSnapshot.snapshot.meta.index"),
    (_snap([[5, None, 9, [[1], []]], b""]), "InstallSnapshot.snapshot.meta.term"),
    (_snap([[5, 1, 2**64, [[1], []]], b""]), "InstallSnapshot.snapshot.meta.tm"),
    (_snap([[5, 1, 9, [[1]]], b""]), "InstallSnapshot.snapshot.meta.conf: expected 2 fields"),
    (_snap([[5, 1, 9, [1, []]], b""]), "InstallSnapshot.snapshot.meta.conf.voters: expected"),
    (_snap([[5, 1, 9, [[0], []]], b""]), "InstallSnapshot.snapshot.meta.conf.voters[0]"),
    (_snap([[5, 1, 9, [[1], [True]]], b""]), "InstallSnapshot.snapshot.meta.conf.learners[0]"),
    (_snap([[5, 1, 9, [[1, 1], []]], b""]), "InstallSnapshot.snapshot.meta.conf.voters: lists"),
    (_snap([[5, 1, 9, [[1, 2], [2]]], b""]), "InstallSnapshot.snapshot.meta.conf: node ids [2]"),
    # the envelope
    (None, "message: expected an array"),
    ({"tag": 1}, "message: expected an array"),
    (b"\x01", "message: expected an array"),
    ([], "message: empty array"),
    ([0, 1, 2, 3], "message type tag"),
    ([9, 1, 2, 3], "message type tag"),
    ([True, 1, 2, 3], "message type tag"),
    (["TimeoutNow", 1, 2, 3], "message type tag"),
    ([8, 1, 2], "TimeoutNow: expected 4 fields, got 3"),
    ([8, 1, 2, 3, 4], "TimeoutNow: expected 4 fields, got 5"),
    ([1, 1, 2, 3, 0, 0, []], "AppendEntries: expected 8 fields, got 7"),
]


@pytest.mark.parametrize(("obj", "reason"), NESTED_CASES)
def test_every_bad_nested_field_is_named(obj: object, reason: str) -> None:
    with pytest.raises(MalformedMessageError) as info:
        decode_message(obj)
    assert str(info.value).startswith(reason), str(info.value)


def test_long_bad_values_are_quoted_briefly() -> None:
    with pytest.raises(MalformedMessageError) as info:
        decode_message([8, 1, 2, "x" * 10_000])
    assert len(str(info.value)) < 200


CONF_CASES: list[tuple[object, str]] = [
    ("not bytes", "ConfState: expected bytes"),
    (bytearray(b"\x94"), "ConfState: expected bytes"),
    (b"", "ConfState: undecodable"),
    (b"\xc1", "ConfState: undecodable"),
    (msgpack.packb([1, [1], [], b""]) + b"\x00", "ConfState: trailing"),
    (msgpack.packb([1, [1], []]), "ConfState: expected 4 fields"),
    (msgpack.packb({"voters": [1]}), "ConfState: expected an array"),
    (msgpack.packb([2, [1], [], b""]), "ConfState.version"),
    (msgpack.packb([True, [1], [], b""]), "ConfState.version"),
    (msgpack.packb([1, [0], [], b""]), "ConfState.voters[0]"),
    (msgpack.packb([1, [1], [-3], b""]), "ConfState.learners[0]"),
    (msgpack.packb([1, [1, 1], [], b""]), "ConfState.voters: lists"),
    (msgpack.packb([1, [1], [1], b""]), "ConfState: node ids [1]"),
    (msgpack.packb([1, [1], [], "ctx"]), "ConfState.context"),
    # The context is the new membership's address book (raft.node dials what it says).
    (msgpack.packb([1, [1], [], b"\xc1"]), "ConfState.context: address book: undecodable"),
    (msgpack.packb([1, [1], [], b"\x01"]), "ConfState.context: address book: expected a map"),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"x": ["h", 1]})]),
        "ConfState.context: address book: expected node ids",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"01": ["h", 1]})]),
        "ConfState.context: address book: expected node ids",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"0": ["h", 1]})]),
        "ConfState.context: address book: expected node ids",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({str(2**64): ["h", 1]})]),
        "ConfState.context: address book: expected node ids",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"1": ["h", 0]})]),
        "ConfState.context: address book: node 1: expected a port",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"1": ["h", True]})]),
        "ConfState.context: address book: node 1: expected a port",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"1": ["", 7001]})]),
        "ConfState.context: address book: node 1: expected a host",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"1": ["a b", 7001]})]),
        "ConfState.context: address book: node 1: expected a host",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"1": ["h" * 254, 7001]})]),
        "ConfState.context: address book: node 1: expected a host",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"1": "h:7001"})]),
        "ConfState.context: address book: node 1: expected (host, port)",
    ),
    (
        msgpack.packb([1, [1], [], msgpack.packb({"1": ["h", 7001, 3]})]),
        "ConfState.context: address book: node 1: expected (host, port)",
    ),
]


@pytest.mark.parametrize(("data", "reason"), CONF_CASES)
def test_malformed_conf_state_is_typed(data: object, reason: str) -> None:
    with pytest.raises(MalformedConfStateError) as info:
        decode_conf_state(data)  # type: ignore[arg-type]  # deliberately wrong types
    assert str(info.value).startswith(reason), str(info.value)
    assert info.value.code == "malformed_conf_state"


# ---- messages that are well-typed but could not have been sent by a correct peer ------------
# The core trusts a message's own consistency (its log raises RaftInvariantError, which stops the
# node, on an append with a gap or a Tm that does not increase; a term-0 AppendEntries makes a
# fresh node commit entries no leader wrote). The decoder refuses such a message like a
# malformed field, so a buggy or hostile peer costs one dropped message, never the node.


def _entry(index: int, *, term: int = 2, tm: int | None = None, kind: int = 0) -> list[object]:
    data = encode_conf_state(ConfState(voters=(1, 2))) if kind == int(EntryKind.CONF) else b""
    return [term, index, index * 10 if tm is None else tm, kind, data]


def _append_of(
    entries: list[list[object]], *, term: int = 3, prev_index: int = 4, prev_term: int = 2
) -> list[object]:
    return [1, 1, 2, term, prev_index, prev_term, entries, 9]


INCONSISTENT_CASES: list[tuple[object, str]] = [
    # entries must be prev_index + 1, + 2, ... (a gap or an overlap breaks the log)
    (_append_of([_entry(6)]), "AppendEntries.entries[0].index: expected 5"),
    (_append_of([_entry(5), _entry(7)]), "AppendEntries.entries[1].index: expected 6"),
    (_append_of([_entry(5), _entry(5)]), "AppendEntries.entries[1].index: expected 6"),
    (_append_of([_entry(4)]), "AppendEntries.entries[0].index: expected 5"),
    # terms never decrease along a log, start at or above prev_term, end at or below the
    # leader's term
    (_append_of([_entry(5, term=3), _entry(6, term=2)]), "AppendEntries.entries[1].term"),
    (_append_of([_entry(5, term=1)]), "AppendEntries.entries[0].term"),
    (_append_of([_entry(5, term=4)]), "AppendEntries.entries[0].term"),
    (_append_of([], prev_term=4), "AppendEntries.prev_term"),
    # Tm strictly increases along the log (the state machine's clock)
    (_append_of([_entry(5, tm=50), _entry(6, tm=50)]), "AppendEntries.entries[1].tm"),
    (_append_of([_entry(5, tm=50), _entry(6, tm=49)]), "AppendEntries.entries[1].tm"),
    # a membership entry every node can decode (the core would raise on it when appending)
    (
        _append_of([[2, 5, 50, int(EntryKind.CONF), b"\xc1"]]),
        "AppendEntries.entries[0].data: ConfState",
    ),
    # ... whose address book every node can use (the node dials what it says)
    (
        _append_of(
            [
                [
                    2,
                    5,
                    50,
                    int(EntryKind.CONF),
                    encode_conf_state(
                        ConfState(voters=(1, 2)), context=msgpack.packb({"2": ["h", 0]})
                    ),
                ]
            ]
        ),
        "AppendEntries.entries[0].data: ConfState.context: address book: node 2",
    ),
    # only a leader sends these, and no leader has term 0
    (_append_of([], term=0, prev_term=0), "AppendEntries.term"),
    ([5, 1, 2, 0, 0, 0, 0, 0], "Heartbeat.term"),
    ([8, 1, 2, 0], "TimeoutNow.term"),
    ([7, 1, 2, 0, 0, [[5, 0, 9, [[1], []]], b""]], "InstallSnapshot.term"),
    ([3, 1, 2, 0, 0, 0, True, False], "RequestVote.term"),
    # a candidate's last log term is at most its term
    ([3, 1, 2, 3, 7, 4, False, False], "RequestVote.last_term"),
    # a snapshot: of a real position (index and term >= 1) no newer than the leader's term
    ([7, 1, 2, 3, 4, [[0, 1, 9, [[1], []]], b""]], "InstallSnapshot.snapshot.meta.index"),
    ([7, 1, 2, 3, 4, [[5, 0, 9, [[1], []]], b""]], "InstallSnapshot.snapshot.meta.term"),
    ([7, 1, 2, 3, 4, [[5, 4, 9, [[1], []]], b""]], "InstallSnapshot.snapshot.meta.term"),
    # a message to oneself
    ([8, 2, 2, 1], "TimeoutNow: src and dst"),
    # heartbeats: the short form or the long one, nothing between or beyond
    ([5, 1, 2, 3, 0, 0, 6, 7, 8], "Heartbeat: expected 8 or 10 fields, got 9"),
    ([5, 1, 2, 3, 0, 0, 6, 7, 8, 9, 10], "Heartbeat: expected 8 or 10 fields, got 11"),
    ([6, 1, 2, 3, 0, 6, 7, 8, 9, 10], "HeartbeatResponse: expected 7 or 9 fields, got 10"),
    # the long form is stamped: it names its sender's incarnation
    ([5, 1, 2, 3, 0, 0, 6, 7, 0, 0], "Heartbeat.incarnation"),
    ([6, 1, 2, 3, 0, 6, 7, 0, 0], "HeartbeatResponse.incarnation"),
    # an incarnation is echoed with the clock that came with it, never alone
    ([5, 1, 2, 3, 0, 0, 6, 0, 8, 9], "Heartbeat.echo_incarnation"),
    ([6, 1, 2, 3, 0, 6, 0, 8, 9], "HeartbeatResponse.echo_incarnation"),
    ([2, 2, 2, 1, 0, False, 0, 0], "AppendResponse: src and dst"),
]


@pytest.mark.parametrize(("obj", "reason"), INCONSISTENT_CASES)
def test_a_message_no_correct_peer_sends_is_refused(obj: object, reason: str) -> None:
    with pytest.raises(MalformedMessageError) as info:
        decode_message(obj)
    assert str(info.value).startswith(reason), str(info.value)


def test_consistent_appends_and_responses_of_term_zero_are_accepted() -> None:
    # The boundaries of the rules above: all of these are sent by correct nodes.
    ok = decode_message(_append_of([_entry(5, term=2), _entry(6, term=3, kind=2)]))
    assert isinstance(ok, AppendEntries) and [e.index for e in ok.entries] == [5, 6]
    assert decode_message(_append_of([], term=1, prev_index=0, prev_term=0))
    # A node still at term 0 refuses a pre-vote with its own term.
    assert decode_message([4, 1, 2, 0, False, True]) == VoteResponse(
        src=1, dst=2, term=0, granted=False, pre_vote=True
    )
    assert decode_message([2, 1, 2, 0, 0, False, 0, 0])
