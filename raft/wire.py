"""Peer messages as msgpack-ready values, and back, with every field validated.

`encode_message` turns a `raft.core.types.Message` into a plain list: a small integer type tag
followed by the message's fields in a fixed order. Entries, snapshots and ConfStates nest as
lists in the same way. There are no field names on the wire: the order below *is* the format,
and the protocol version exchanged in the transport handshake guards changes to it.

    AppendEntries      [1, src, dst, term, prev_index, prev_term, [entry...], commit]
    AppendResponse     [2, src, dst, term, index, reject, reject_hint, reject_term]
    RequestVote        [3, src, dst, term, last_index, last_term, pre_vote, force]
    VoteResponse       [4, src, dst, term, granted, pre_vote]
    Heartbeat          [5, src, dst, term, commit, read_ctx, clock_ms, echo_ms,
                        incarnation, echo_incarnation]
    HeartbeatResponse  [6, src, dst, term, read_ctx, clock_ms, echo_ms,
                        incarnation, echo_incarnation]
    InstallSnapshot    [7, src, dst, term, commit, snapshot]   (the data stays last)
    TimeoutNow         [8, src, dst, term]
    entry              [term, index, tm, kind, data]
    snapshot           [[index, term, tm, conf], data]
    conf               [[voter...], [learner...]]

The two heartbeats' last two fields are new in peer protocol version 6 (`raft.transport`): a
heartbeat of a version-5 peer ends at echo_ms, and one of a message whose incarnation is 0
(not stamped) is encoded so too; `encode_message(m, with_incarnations=False)` writes that
short form for a link to a version-5 peer. Both forms decode, the short one with both
incarnations 0; in the long one incarnation is >= 1 and echo_incarnation is 0 unless echo_ms
is set (a node echoes an incarnation only with the clock that came with it).

`decode_message` trusts nothing: it checks the shape and every field's type and range (integers
are real ints, not bools, in [0, 2**64); node ids are > 0; flags are real bools; payloads are
real bytes; kinds are valid EntryKind values; a ConfState lists no node twice) and raises
`MalformedMessageError` naming the field otherwise. It then refuses a well-typed message that no
correct node sends, because the core trusts a message's own consistency (its log raises, which
stops the node, on an append with a gap or a Tm that does not increase):
* src != dst;
* a leader's or candidate's message (AppendEntries, Heartbeat, InstallSnapshot, TimeoutNow,
  RequestVote) has term >= 1 (a term-0 AppendEntries would make a fresh node commit entries no
  leader wrote); responses may carry term 0 (a node that never saw a term answers with it);
* AppendEntries: prev_term <= term; its entries continue a log at prev_index: indexes
  prev_index + 1, + 2, ...; terms non-decreasing within [prev_term, term]; Tm strictly
  increasing; a CONF entry's data decodes as a ConfState (`decode_conf_state`);
* RequestVote: last_term <= term;
* InstallSnapshot: the snapshot is of a real position (index >= 1, term in [1, message term]).
What it cannot know (how a message relates to the receiver's log) stays the core's job.

Invariant: for every valid message m, `decode_message(encode_message(m)) == m`, also after a
msgpack round trip.

Tags 64 and above are reserved for the transport's own frames (`raft.transport`: the chunks of a
large InstallSnapshot and their acknowledgements); `decode_message` refuses them.

`encode_install_snapshot_head` gives the encoding of an InstallSnapshot up to its snapshot data
(the last value of the message), so a large snapshot can be framed or sent in chunks without
copying its data into one msgpack buffer.

`encode_conf_state`/`decode_conf_state` give the durable bytes the core keeps in CONF entries;
those carry a format version first because they outlive any one connection:

    conf entry data    msgpack [1, [voter...], [learner...], context bytes]
    context            b"" or the new membership's address book (written by raft.node):
                       msgpack {"<node id>": [host, port], ...}

The address book is checked here, where a peer's message is decoded (node ids in decimal,
each a usable address: `address_problem`, the transport's own rule), so an AppendEntries
carrying a membership whose addresses a node could not dial is refused like any malformed
message instead of reaching the log, where every node applying it would have to cope with it.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import msgpack

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
from raft.errors import (
    FrameEncodeError,
    MalformedConfStateError,
    MalformedFrameError,
    MalformedMessageError,
)
from raft.filebytes import FileBytes, snapshot_bytes
from raft.framing import msgpack_bin_header, unpack_msgpack
from raft.limits import PEER_FRAME_ITEMS_MAX

TAG_APPEND_ENTRIES: Final = 1
TAG_APPEND_RESPONSE: Final = 2
TAG_REQUEST_VOTE: Final = 3
TAG_VOTE_RESPONSE: Final = 4
TAG_HEARTBEAT: Final = 5
TAG_HEARTBEAT_RESPONSE: Final = 6
TAG_INSTALL_SNAPSHOT: Final = 7
TAG_TIMEOUT_NOW: Final = 8

CONF_STATE_FORMAT_VERSION: Final = 1

_U64_END: Final = 1 << 64
_ENTRY_KINDS: Final = {int(kind): kind for kind in EntryKind}
_REPR_CHARS_MAX: Final = 60  # how much of an offending value an error message quotes
_IDS_SHOWN_MAX: Final = 8  # node ids an error message lists at most
_PORT_MAX: Final = 65535
# A DNS name is at most 253 characters; IPv6 literals are far shorter.
HOST_CHARS_MAX: Final = 253
# The longest decimal node id (2**64 - 1 has 20 digits).
_NODE_ID_DIGITS_MAX: Final = 20

Address = tuple[str, int]
_EMPTY_BIN: Final = b"\xc4\x00"  # msgpack of b"" (bin 8, length 0)


# ---- encoding -------------------------------------------------------------------------------


def _encode_entry(entry: Entry) -> list[object]:
    return [entry.term, entry.index, entry.tm, int(entry.kind), entry.data]


def _encode_conf(conf: ConfState) -> list[object]:
    return [list(conf.voters), list(conf.learners)]


def _encode_snapshot(snap: Snapshot) -> list[object]:
    meta = snap.meta
    # Data left in its file (raft.filebytes) is read whole only for a snapshot small enough to
    # travel as one frame; a larger one is sent in chunks (raft.transport) and never gets here.
    return [[meta.index, meta.term, meta.tm, _encode_conf(meta.conf)], snapshot_bytes(snap.data)]


def encode_message(msg: Message, *, with_incarnations: bool = True) -> list[object]:
    """Return `msg` as a list msgpack can pack. Does not validate (the receiver does).

    `with_incarnations=False`: heartbeats in the short form a peer of protocol version 5
    decodes (without their incarnations; see the module docstring)."""
    match msg:
        case AppendEntries():
            return [
                TAG_APPEND_ENTRIES,
                msg.src,
                msg.dst,
                msg.term,
                msg.prev_index,
                msg.prev_term,
                [_encode_entry(e) for e in msg.entries],
                msg.commit,
            ]
        case AppendResponse():
            return [
                TAG_APPEND_RESPONSE,
                msg.src,
                msg.dst,
                msg.term,
                msg.index,
                msg.reject,
                msg.reject_hint,
                msg.reject_term,
            ]
        case RequestVote():
            return [
                TAG_REQUEST_VOTE,
                msg.src,
                msg.dst,
                msg.term,
                msg.last_index,
                msg.last_term,
                msg.pre_vote,
                msg.force,
            ]
        case VoteResponse():
            return [TAG_VOTE_RESPONSE, msg.src, msg.dst, msg.term, msg.granted, msg.pre_vote]
        case Heartbeat():
            heartbeat: list[object] = [
                TAG_HEARTBEAT,
                msg.src,
                msg.dst,
                msg.term,
                msg.commit,
                msg.read_ctx,
                msg.clock_ms,
                msg.echo_ms,
            ]
            if with_incarnations and msg.incarnation:
                heartbeat += (msg.incarnation, msg.echo_incarnation)
            return heartbeat
        case HeartbeatResponse():
            response: list[object] = [
                TAG_HEARTBEAT_RESPONSE,
                msg.src,
                msg.dst,
                msg.term,
                msg.read_ctx,
                msg.clock_ms,
                msg.echo_ms,
            ]
            if with_incarnations and msg.incarnation:
                response += (msg.incarnation, msg.echo_incarnation)
            return response
        case InstallSnapshot():
            snapshot = _encode_snapshot(msg.snapshot)
            return [TAG_INSTALL_SNAPSHOT, msg.src, msg.dst, msg.term, msg.commit, snapshot]
        case TimeoutNow():
            return [TAG_TIMEOUT_NOW, msg.src, msg.dst, msg.term]


def encode_install_snapshot_head(msg: InstallSnapshot) -> bytes:
    """The msgpack bytes of `encode_message(msg)` that precede the snapshot data, i.e.
    `head + msg.snapshot.data == msgpack.packb(encode_message(msg), use_bin_type=True)`.

    Raises FrameEncodeError for a field msgpack cannot represent (a caller's bug).
    """
    empty = dataclasses.replace(msg, snapshot=dataclasses.replace(msg.snapshot, data=b""))
    try:
        packed = msgpack.packb(encode_message(empty), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameEncodeError(f"cannot encode InstallSnapshot as msgpack: {exc}") from exc
    # The data is the message's last value, so its empty bin value (0xc4 0x00) ends `packed`.
    if not packed.endswith(_EMPTY_BIN):
        raise FrameEncodeError("InstallSnapshot does not end with its snapshot data")
    return packed[: -len(_EMPTY_BIN)] + msgpack_bin_header(len(msg.snapshot.data))


# An encoded InstallSnapshot's bytes before its data: a few integers and a ConfState.
INSTALL_SNAPSHOT_HEAD_BYTES_MAX: Final = 64 * 1024


def decode_install_snapshot(encoded: memoryview | FileBytes) -> InstallSnapshot:
    """Inverse of `encode_install_snapshot_head(msg) + msg.snapshot.data`, without copying the
    data: the snapshot's data is a read-only view (or file range) into `encoded` (a received
    transfer's buffer, or its spool file), since unpacking would copy the whole state onto the
    heap. Only the small head is read.

    Raises MalformedMessageError for anything else, with the checks of `decode_message`, and
    FileReadError (an OSError) when a spool file cannot be read."""

    def part(start: int, stop: int) -> bytes | memoryview:
        return encoded.read(start, stop) if isinstance(encoded, FileBytes) else encoded[start:stop]

    head = part(0, INSTALL_SNAPSHOT_HEAD_BYTES_MAX)
    try:
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(head)
        if unpacker.read_array_header() != 6:
            raise MalformedMessageError("InstallSnapshot: expected an array of 6 fields")
        for _ in range(5):
            unpacker.skip()
        if unpacker.read_array_header() != 2:
            raise MalformedMessageError("InstallSnapshot.snapshot: expected [meta, data]")
        unpacker.skip()
        start = unpacker.tell()
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData) as exc:
        raise MalformedMessageError(f"InstallSnapshot: undecodable head: {exc!r}") from exc
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}.get(head[start] if start < len(head) else -1)
    if width is None or start + 1 + width > len(head):
        raise MalformedMessageError("InstallSnapshot.snapshot.data: expected a msgpack bin value")
    size = int.from_bytes(head[start + 1 : start + 1 + width], "big")
    data_start = start + 1 + width
    if data_start + size != len(encoded):
        raise MalformedMessageError(
            f"InstallSnapshot: {len(encoded) - data_start} bytes after the head, "
            f"but its data is {size} bytes"
        )
    # The head goes through the same checks as any frame (with empty data in place).
    try:
        obj = unpack_msgpack(
            bytes(head[:start]) + _EMPTY_BIN, max_bytes=INSTALL_SNAPSHOT_HEAD_BYTES_MAX
        )
    except MalformedFrameError as exc:
        raise MalformedMessageError(f"InstallSnapshot: {exc}") from exc
    msg = decode_message(obj)
    if not isinstance(msg, InstallSnapshot):
        raise MalformedMessageError(f"a {type(msg).__name__}, not an InstallSnapshot")
    data: memoryview | FileBytes = (
        encoded.slice(data_start)
        if isinstance(encoded, FileBytes)
        else encoded[data_start:].toreadonly()
    )
    return dataclasses.replace(msg, snapshot=dataclasses.replace(msg.snapshot, data=data))


def encode_conf_state(conf: ConfState, *, context: bytes = b"") -> bytes:
    """The bytes a CONF entry carries: msgpack of [format version, voters, learners, context].

    `context` is opaque here (the node driver may keep peer addresses in it); it exists so the
    layout matches the one `raft.core.conf` writes and either side can read the other's entries.
    """
    return msgpack.packb(
        [CONF_STATE_FORMAT_VERSION, *_encode_conf(conf), context], use_bin_type=True
    )


def encode_address_book(book: Mapping[int, Address]) -> bytes:
    """A CONF entry's context: msgpack {"<node id>": [host, port]} (node ids in order)."""
    return msgpack.packb({str(k): [h, p] for k, (h, p) in sorted(book.items())})


def address_problem(address: object) -> str | None:
    """Why `address` is not a (host, port) a peer link can dial, or None if it is."""
    if not isinstance(address, tuple | list) or len(address) != 2:
        return f"expected (host, port), got {show_value(address)}"
    host, port = address
    if (
        type(host) is not str
        or not host
        or len(host) > HOST_CHARS_MAX
        or any(c.isspace() or not c.isprintable() for c in host)
    ):
        return (
            f"expected a host of 1 to {HOST_CHARS_MAX} printable characters without spaces, "
            f"got {show_value(host)}"
        )
    if type(port) is not int or not 0 < port <= _PORT_MAX:
        return f"expected a port in [1, {_PORT_MAX}], got {show_value(port)}"
    return None


def decode_address_book(data: bytes) -> dict[int, Address]:
    """Inverse of `encode_address_book` (b"" is an empty book).

    Raises MalformedConfStateError unless every key is a node id in decimal (as written: no
    sign, no leading zero) and every value a usable address (`address_problem`).
    """
    if type(data) is not bytes:
        raise MalformedConfStateError(f"address book: expected bytes, got {show_value(data)}")
    if not data:
        return {}
    try:
        obj = unpack_msgpack(data, max_bytes=len(data), max_items=PEER_FRAME_ITEMS_MAX)
    except MalformedFrameError as exc:
        raise MalformedConfStateError(f"address book: {exc}") from exc
    if type(obj) is not dict:
        raise MalformedConfStateError(f"address book: expected a map, got {show_value(obj)}")
    book: dict[int, Address] = {}
    for key, address in obj.items():
        if (
            type(key) is not str
            or not 0 < len(key) <= _NODE_ID_DIGITS_MAX
            or not key.isascii()
            or not key.isdigit()
            or key[0] == "0"
            or int(key) >= _U64_END
        ):
            raise MalformedConfStateError(
                f"address book: expected node ids in decimal as keys, got {show_value(key)}"
            )
        problem = address_problem(address)
        if problem is not None:
            raise MalformedConfStateError(f"address book: node {key}: {problem}")
        host, port = address
        book[int(key)] = (host, port)
    return book


# ---- validation helpers ---------------------------------------------------------------------


class _BoundedRepr(reprlib.Repr):
    """reprlib's bounded repr (a few items per container, a few levels), plus bytes, which
    reprlib would repr whole before cutting: an offending value can be a 64 MiB frame."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 4
        self.maxstring = self.maxother = self.maxlong = _REPR_CHARS_MAX

    def repr_bytes(self, value: bytes, level: int) -> str:
        cut = value[: self.maxstring // 4]
        return repr(cut) + ("..." if len(value) > len(cut) else "")

    def repr_bytearray(self, value: bytearray, level: int) -> str:
        return self.repr_bytes(bytes(value[: self.maxstring]), level)


_bounded_repr: Final = _BoundedRepr()


def brief_repr(value: object) -> str:
    """A short repr of `value`, whatever its size (at most _REPR_CHARS_MAX characters; the
    repr is bounded while it is built, not cut afterwards)."""
    text = _bounded_repr.repr(value)
    if len(text) > _REPR_CHARS_MAX:
        text = text[: _REPR_CHARS_MAX - 3] + "..."
    return text


def show_value(value: object) -> str:
    """The type and a short repr of `value`, whatever its size: error messages and logs
    quote values a peer sent, which must never cost more than a few dozen characters."""
    return f"{type(value).__name__} {brief_repr(value)}"


def show_names(names: Sequence[object], shown_max: int = _IDS_SHOWN_MAX) -> str:
    """The first `shown_max` of `names` as brief reprs, and how many there are when that is
    not all: for messages naming what a sender got wrong (unknown keys), which it may have
    sent by the hundred thousand."""
    shown = ", ".join(brief_repr(n) for n in names[:shown_max])
    if len(names) <= shown_max:
        return f"[{shown}]"
    return f"[{shown}, ...] ({len(names)} in all)"


def _show(value: object) -> str:
    return show_value(value)


def _show_ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:_IDS_SHOWN_MAX])
    return f"[{shown}{', ...' if len(ids) > _IDS_SHOWN_MAX else ''}] ({len(ids)} ids)"


def _bad(where: str, expected: str, value: object) -> MalformedMessageError:
    return MalformedMessageError(f"{where}: expected {expected}, got {_show(value)}")


def _uint(value: object, where: str) -> int:
    # type() rather than isinstance(): bools are ints in Python but never valid here.
    if type(value) is not int or not 0 <= value < _U64_END:
        raise _bad(where, "an integer in [0, 2**64)", value)
    return value


def _node_id(value: object, where: str) -> int:
    if type(value) is not int or not 0 < value < _U64_END:
        raise _bad(where, "a node id (an integer in [1, 2**64))", value)
    return value


def _flag(value: object, where: str) -> bool:
    if type(value) is not bool:
        raise _bad(where, "a bool", value)
    return value


def _payload(value: object, where: str) -> bytes:
    if type(value) is not bytes:
        raise _bad(where, "bytes", value)
    return value


def _fields(value: object, count: int, where: str) -> Sequence[object]:
    if type(value) is not list and type(value) is not tuple:
        raise _bad(where, f"an array of {count} fields", value)
    if len(value) != count:
        raise MalformedMessageError(f"{where}: expected {count} fields, got {len(value)}")
    return value


def _array(value: object, where: str) -> Sequence[object]:
    if type(value) is not list and type(value) is not tuple:
        raise _bad(where, "an array", value)
    return value


# ---- decoding -------------------------------------------------------------------------------


def _decode_entry(value: object, owner: str, i: int) -> Entry:
    # Hot path (thousands of entries per AppendEntries): check everything in one expression and
    # build no strings; only a failure takes the slow path that names the offending field.
    if (type(value) is list or type(value) is tuple) and len(value) == 5:
        term, index, tm, kind, data = value
        if (
            type(term) is int
            and 0 <= term < _U64_END
            and type(index) is int
            and 0 <= index < _U64_END
            and type(tm) is int
            and 0 <= tm < _U64_END
            and type(kind) is int
            and kind in _ENTRY_KINDS
            and type(data) is bytes
        ):
            return Entry(term=term, index=index, tm=tm, kind=_ENTRY_KINDS[kind], data=data)
    return _decode_entry_checked(value, f"{owner}.entries[{i}]")


def _decode_entry_checked(value: object, where: str) -> Entry:
    term, index, tm, kind, data = _fields(value, 5, where)
    if type(kind) is not int or kind not in _ENTRY_KINDS:
        raise _bad(f"{where}.kind", f"an EntryKind in {sorted(_ENTRY_KINDS)}", kind)
    return Entry(
        term=_uint(term, f"{where}.term"),
        index=_uint(index, f"{where}.index"),
        tm=_uint(tm, f"{where}.tm"),
        kind=_ENTRY_KINDS[kind],
        data=_payload(data, f"{where}.data"),
    )


def _decode_node_ids(value: object, where: str) -> tuple[int, ...]:
    ids = tuple(_node_id(v, f"{where}[{i}]") for i, v in enumerate(_array(value, where)))
    if len(set(ids)) != len(ids):
        raise MalformedMessageError(f"{where}: lists a node id more than once: {_show_ids(ids)}")
    return ids


def _decode_conf(value: object, where: str) -> ConfState:
    voters, learners = _fields(value, 2, where)
    conf = ConfState(
        voters=_decode_node_ids(voters, f"{where}.voters"),
        learners=_decode_node_ids(learners, f"{where}.learners"),
    )
    both = set(conf.voters) & set(conf.learners)
    if both:
        raise MalformedMessageError(
            f"{where}: node ids {_show_ids(sorted(both))} are both voters and learners"
        )
    return conf


def _decode_snapshot(value: object, where: str) -> Snapshot:
    meta, data = _fields(value, 2, where)
    index, term, tm, conf = _fields(meta, 4, f"{where}.meta")
    return Snapshot(
        meta=SnapshotMeta(
            index=_uint(index, f"{where}.meta.index"),
            term=_uint(term, f"{where}.meta.term"),
            tm=_uint(tm, f"{where}.meta.tm"),
            conf=_decode_conf(conf, f"{where}.meta.conf"),
        ),
        data=_payload(data, f"{where}.data"),
    )


def _append_entries(f: Sequence[object]) -> AppendEntries:
    _, src, dst, term, prev_index, prev_term, entries, commit = f
    # Hot path (every replicated proposal): the checks of the path below in one expression,
    # without a call and a field name per field; any failure takes that path, which names it.
    if (
        type(src) is int
        and 0 < src < _U64_END
        and type(dst) is int
        and 0 < dst < _U64_END
        and type(term) is int
        and 0 <= term < _U64_END
        and type(prev_index) is int
        and 0 <= prev_index < _U64_END
        and type(prev_term) is int
        and 0 <= prev_term < _U64_END
        and type(commit) is int
        and 0 <= commit < _U64_END
        and (type(entries) is list or type(entries) is tuple)
    ):
        return AppendEntries(
            src=src,
            dst=dst,
            term=term,
            prev_index=prev_index,
            prev_term=prev_term,
            entries=tuple([_decode_entry(e, "AppendEntries", i) for i, e in enumerate(entries)]),
            commit=commit,
        )
    w = "AppendEntries"
    return AppendEntries(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
        prev_index=_uint(prev_index, f"{w}.prev_index"),
        prev_term=_uint(prev_term, f"{w}.prev_term"),
        entries=tuple(
            [_decode_entry(e, w, i) for i, e in enumerate(_array(entries, f"{w}.entries"))]
        ),
        commit=_uint(commit, f"{w}.commit"),
    )


def _append_response(f: Sequence[object]) -> AppendResponse:
    _, src, dst, term, index, reject, reject_hint, reject_term = f
    # Hot path, as in _append_entries: one expression; a failure takes the named checks below.
    if (
        type(src) is int
        and 0 < src < _U64_END
        and type(dst) is int
        and 0 < dst < _U64_END
        and type(term) is int
        and 0 <= term < _U64_END
        and type(index) is int
        and 0 <= index < _U64_END
        and type(reject) is bool
        and type(reject_hint) is int
        and 0 <= reject_hint < _U64_END
        and type(reject_term) is int
        and 0 <= reject_term < _U64_END
    ):
        return AppendResponse(
            src=src,
            dst=dst,
            term=term,
            index=index,
            reject=reject,
            reject_hint=reject_hint,
            reject_term=reject_term,
        )
    w = "AppendResponse"
    return AppendResponse(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
        index=_uint(index, f"{w}.index"),
        reject=_flag(reject, f"{w}.reject"),
        reject_hint=_uint(reject_hint, f"{w}.reject_hint"),
        reject_term=_uint(reject_term, f"{w}.reject_term"),
    )


def _request_vote(f: Sequence[object]) -> RequestVote:
    _, src, dst, term, last_index, last_term, pre_vote, force = f
    w = "RequestVote"
    return RequestVote(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
        last_index=_uint(last_index, f"{w}.last_index"),
        last_term=_uint(last_term, f"{w}.last_term"),
        pre_vote=_flag(pre_vote, f"{w}.pre_vote"),
        force=_flag(force, f"{w}.force"),
    )


def _vote_response(f: Sequence[object]) -> VoteResponse:
    _, src, dst, term, granted, pre_vote = f
    w = "VoteResponse"
    return VoteResponse(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
        granted=_flag(granted, f"{w}.granted"),
        pre_vote=_flag(pre_vote, f"{w}.pre_vote"),
    )


def _incarnations(f: Sequence[object], short: int, echo_ms: int, w: str) -> tuple[int, int]:
    """The (incarnation, echo_incarnation) of a heartbeat or its response of `short` fields
    in the form without them (a peer of protocol version 5): (0, 0) for that form."""
    if len(f) == short:
        return 0, 0
    incarnation, echo_incarnation = f[short:]
    if type(incarnation) is not int or not 0 < incarnation < _U64_END:
        raise _bad(f"{w}.incarnation", "an incarnation (an integer in [1, 2**64))", incarnation)
    echo_incarnation = _uint(echo_incarnation, f"{w}.echo_incarnation")
    if echo_incarnation and not echo_ms:
        # The incarnation echoed is the one that came with the clock echoed.
        raise _bad(f"{w}.echo_incarnation", "0 (no echo_ms to go with it)", echo_incarnation)
    return incarnation, echo_incarnation


def _heartbeat(f: Sequence[object]) -> Heartbeat:
    _, src, dst, term, commit, read_ctx, clock_ms, echo_ms = f[:8]
    w = "Heartbeat"
    echo_ms = _uint(echo_ms, f"{w}.echo_ms")
    incarnation, echo_incarnation = _incarnations(f, 8, echo_ms, w)
    return Heartbeat(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
        commit=_uint(commit, f"{w}.commit"),
        read_ctx=_uint(read_ctx, f"{w}.read_ctx"),
        clock_ms=_uint(clock_ms, f"{w}.clock_ms"),
        echo_ms=echo_ms,
        incarnation=incarnation,
        echo_incarnation=echo_incarnation,
    )


def _heartbeat_response(f: Sequence[object]) -> HeartbeatResponse:
    _, src, dst, term, read_ctx, clock_ms, echo_ms = f[:7]
    w = "HeartbeatResponse"
    echo_ms = _uint(echo_ms, f"{w}.echo_ms")
    incarnation, echo_incarnation = _incarnations(f, 7, echo_ms, w)
    return HeartbeatResponse(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
        read_ctx=_uint(read_ctx, f"{w}.read_ctx"),
        clock_ms=_uint(clock_ms, f"{w}.clock_ms"),
        echo_ms=echo_ms,
        incarnation=incarnation,
        echo_incarnation=echo_incarnation,
    )


def _install_snapshot(f: Sequence[object]) -> InstallSnapshot:
    _, src, dst, term, commit, snapshot = f
    w = "InstallSnapshot"
    return InstallSnapshot(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
        commit=_uint(commit, f"{w}.commit"),
        snapshot=_decode_snapshot(snapshot, f"{w}.snapshot"),
    )


def _timeout_now(f: Sequence[object]) -> TimeoutNow:
    _, src, dst, term = f
    w = "TimeoutNow"
    return TimeoutNow(
        src=_node_id(src, f"{w}.src"),
        dst=_node_id(dst, f"{w}.dst"),
        term=_uint(term, f"{w}.term"),
    )


# tag -> (name, numbers of array items including the tag, decoder of the checked array);
# a heartbeat and its response have a short form (a peer of protocol version 5) and a long one.
_DECODERS: Final[dict[int, tuple[str, tuple[int, ...], Callable[[Sequence[object]], Message]]]] = {
    TAG_APPEND_ENTRIES: ("AppendEntries", (8,), _append_entries),
    TAG_APPEND_RESPONSE: ("AppendResponse", (8,), _append_response),
    TAG_REQUEST_VOTE: ("RequestVote", (8,), _request_vote),
    TAG_VOTE_RESPONSE: ("VoteResponse", (6,), _vote_response),
    TAG_HEARTBEAT: ("Heartbeat", (8, 10), _heartbeat),
    TAG_HEARTBEAT_RESPONSE: ("HeartbeatResponse", (7, 9), _heartbeat_response),
    TAG_INSTALL_SNAPSHOT: ("InstallSnapshot", (6,), _install_snapshot),
    TAG_TIMEOUT_NOW: ("TimeoutNow", (4,), _timeout_now),
}


def decode_message(obj: object) -> Message:
    """Validate a decoded frame and build the Message; MalformedMessageError otherwise."""
    if type(obj) is not list and type(obj) is not tuple:
        raise _bad("message", "an array [type tag, fields...]", obj)
    if not obj:
        raise MalformedMessageError("message: empty array, expected [type tag, fields...]")
    tag = obj[0]
    if type(tag) is not int or tag not in _DECODERS:
        raise _bad("message type tag", f"one of {sorted(_DECODERS)}", tag)
    name, counts, decode = _DECODERS[tag]
    if len(obj) not in counts:
        expected = " or ".join(str(count) for count in counts)
        raise MalformedMessageError(f"{name}: expected {expected} fields, got {len(obj)}")
    msg = decode(obj)
    _check_consistent(msg, name)
    return msg


def _check_consistent(msg: Message, name: str) -> None:
    """Refuse a well-typed message that no correct node sends (see the module docstring)."""
    if msg.src == msg.dst:
        raise MalformedMessageError(f"{name}: src and dst are both node {msg.src}")
    match msg:
        case AppendEntries():
            _check_leader_term(msg.term, name)
            if msg.prev_term > msg.term:
                raise _bad(f"{name}.prev_term", f"at most the term {msg.term}", msg.prev_term)
            _check_entries(msg)
        case Heartbeat() | TimeoutNow():
            _check_leader_term(msg.term, name)
        case InstallSnapshot():
            _check_leader_term(msg.term, name)
            meta = msg.snapshot.meta
            where = f"{name}.snapshot.meta"
            if meta.index < 1:
                raise _bad(f"{where}.index", "an index >= 1 (a leader holds a snapshot)", 0)
            if not 1 <= meta.term <= msg.term:
                raise _bad(f"{where}.term", f"a term in [1, {msg.term}]", meta.term)
            # (Its membership may list no voter: a node that joined with an empty one and
            # snapshots before it applies the change that added it writes such a snapshot.)
        case RequestVote():
            _check_leader_term(msg.term, name)  # a candidate's term, >= 1 too
            if msg.last_term > msg.term:
                raise _bad(f"{name}.last_term", f"at most the term {msg.term}", msg.last_term)
        case _:
            pass  # responses: a node still at term 0 answers with term 0


def _check_leader_term(term: int, name: str) -> None:
    if term < 1:
        raise _bad(f"{name}.term", "a term >= 1 (elections start at term 1)", term)


def _check_entries(msg: AppendEntries) -> None:
    """The entries continue the log at prev_index, as a leader's log does: indexes consecutive,
    terms non-decreasing within [prev_term, term], Tm strictly increasing, membership entries
    decodable. The core's log relies on all of it (it raises on a gap or a Tm that does not
    increase, which stops the node)."""
    # Hot path (every replicated proposal): plain comparisons per entry; an entry that fails
    # one, or a CONF entry, takes _check_entry, which names the field.
    expected_index = msg.prev_index + 1
    term_floor = msg.prev_term
    term_top = msg.term
    tm_floor = -1
    conf = EntryKind.CONF
    for e in msg.entries:
        if (
            e.index != expected_index
            or not term_floor <= e.term <= term_top
            or e.tm <= tm_floor
            or e.kind is conf
        ):
            _check_entry(e, expected_index - msg.prev_index - 1, msg, term_floor, tm_floor)
        expected_index += 1
        term_floor = e.term
        tm_floor = e.tm


def _check_entry(e: Entry, i: int, msg: AppendEntries, term_floor: int, tm_floor: int) -> None:
    where = f"AppendEntries.entries[{i}]"
    expected_index = msg.prev_index + 1 + i
    if e.index != expected_index:
        raise _bad(f"{where}.index", f"{expected_index} (prev_index + {i + 1})", e.index)
    if not term_floor <= e.term <= msg.term:
        raise _bad(f"{where}.term", f"a term in [{term_floor}, {msg.term}]", e.term)
    if e.tm <= tm_floor:
        raise _bad(f"{where}.tm", f"a Tm above the previous entry's {tm_floor}", e.tm)
    if e.kind is EntryKind.CONF:
        try:
            decode_conf_state(e.data)
        except MalformedConfStateError as exc:
            raise MalformedMessageError(f"{where}.data: {exc}") from exc


def decode_conf_state(data: bytes) -> ConfState:
    """Inverse of `encode_conf_state` (the context is checked as an address book,
    `decode_address_book`, not returned).

    Raises MalformedConfStateError if `data` is not an encoded ConfState.
    """
    if type(data) is not bytes:
        raise MalformedConfStateError(f"ConfState: expected bytes, got {_show(data)}")
    try:
        obj = unpack_msgpack(data, max_bytes=max(len(data), 1), max_items=PEER_FRAME_ITEMS_MAX)
    except MalformedFrameError as exc:
        raise MalformedConfStateError(f"ConfState: {exc}") from exc
    try:
        version, voters, learners, raw_context = _fields(obj, 4, "ConfState")
        if type(version) is not int or version != CONF_STATE_FORMAT_VERSION:
            raise _bad("ConfState.version", f"{CONF_STATE_FORMAT_VERSION}", version)
        context = _payload(raw_context, "ConfState.context")
        conf = _decode_conf([voters, learners], "ConfState")
    except MalformedConfStateError:
        raise
    except MalformedMessageError as exc:
        raise MalformedConfStateError(str(exc)) from exc
    try:
        decode_address_book(context)
    except MalformedConfStateError as exc:
        raise MalformedConfStateError(f"ConfState.context: {exc}") from exc
    return conf
