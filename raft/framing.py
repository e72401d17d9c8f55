"""Length-prefixed msgpack frames, sans-I/O (bytes in, objects out; objects in, bytes out).

A frame is a 4-byte big-endian unsigned length N followed by exactly N bytes holding one msgpack
object. The peer transport uses it today and the client API will use it too, so it knows
nothing about what the objects mean.

In the h11 style the decoder never touches a socket: the caller `feed`s whatever bytes arrived
and then calls `next_frame()` until it returns `NEED_DATA`.

Invariants:
* An oversized frame is refused from its 4 header bytes alone: the decoder discards the header
  and everything fed after it, so a hostile length can never make it buffer the body.
* Frames before a bad one are still returned in order; the error surfaces exactly where the
  bad frame sits in the stream.
* Decoding is data-only: msgpack's own size limits are set from `max_frame_bytes`, strings must
  be UTF-8, map keys must be str or bytes, and every ext type (timestamps included) is refused
  (the message then mentions `ext`).
* With `max_items`, a frame holds at most that many array items and map pairs in all (and so
  per array or map): msgpack builds a Python object per item, at 8 to 64 times its encoded
  size (an empty list is 1 byte on the wire, 64 on the heap), so without it a 64 MiB frame
  of tiny nested arrays takes seconds and gigabytes to decode. The count stops the decoding
  once passed, after at most one more array or map of `max_items` items was built.
  Nothing is ever unpickled or turned into a custom object.
* After any error the decoder is dead and raises that error again on every call. A length
  prefix is the only thing that marks where the next frame starts; once one frame is wrong we
  cannot know where the following one begins, so the stream is out of sync for good and the
  connection must be closed.
"""

from __future__ import annotations

import enum
from typing import Any, Final, NoReturn, TypeVar

import msgpack

from raft.errors import (
    FrameEncodeError,
    FrameTooLargeError,
    InvalidLimitError,
    MalformedFrameError,
    RaftError,
)

FRAME_HEADER_BYTES: Final = 4
# The largest length the 4-byte header can express.
FRAME_LENGTH_CAPACITY: Final = 2**32 - 1


class NeedData(enum.Enum):
    """Type of the `NEED_DATA` sentinel (an enum member, so it is a picklable singleton)."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA

_Container = TypeVar("_Container", list[Any], dict[Any, Any])
# How deep msgpack's decoder nests arrays and maps (its C stack, measured with msgpack 1.x):
# only named in errors, the decoder enforces it.
_UNPACK_NESTING_MAX: Final = 1_024


def _check_limit(max_frame_bytes: int) -> None:
    if not 1 <= max_frame_bytes <= FRAME_LENGTH_CAPACITY:
        raise InvalidLimitError(
            f"max_frame_bytes must be in [1, {FRAME_LENGTH_CAPACITY}], got {max_frame_bytes}"
        )


def _check_items(max_items: int | None) -> None:
    if max_items is not None and max_items < 1:
        raise InvalidLimitError(f"max_items must be at least 1, got {max_items}")


def encode_frame(obj: object, *, max_frame_bytes: int) -> bytes:
    """Return the frame (header + msgpack body) for `obj`.

    Raises FrameTooLargeError when the body would exceed `max_frame_bytes` (the receiver would
    refuse it anyway) and FrameEncodeError when `obj` holds something msgpack cannot represent.
    """
    _check_limit(max_frame_bytes)
    try:
        body = msgpack.packb(obj, use_bin_type=True, datetime=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameEncodeError(f"cannot encode {type(obj).__name__} as msgpack: {exc}") from exc
    if len(body) > max_frame_bytes:
        raise FrameTooLargeError(
            f"frame body of {len(body)} bytes exceeds the limit of {max_frame_bytes} bytes"
        )
    return len(body).to_bytes(FRAME_HEADER_BYTES, "big") + body


def msgpack_bin_header(size_bytes: int) -> bytes:
    """The msgpack header of a bin value of `size_bytes` bytes (bin 8/16/32, as msgpack.packb
    writes it). Lets a large bytes value be framed by joining header and value, one copy,
    instead of packing it into a Packer buffer that grows by doubling."""
    if not 0 <= size_bytes < 1 << 32:
        raise FrameEncodeError(
            f"a msgpack bin value holds at most 2**32 - 1 bytes, not {size_bytes}"
        )
    if size_bytes < 1 << 8:
        return b"\xc4" + size_bytes.to_bytes(1, "big")
    if size_bytes < 1 << 16:
        return b"\xc5" + size_bytes.to_bytes(2, "big")
    return b"\xc6" + size_bytes.to_bytes(4, "big")


class _ExtRefused(Exception):
    """Raised from inside msgpack when it meets an ext type; turned into MalformedFrameError."""


def _refuse_ext(code: int, _data: bytes) -> NoReturn:
    # The one ext hook we install exists to refuse: without it msgpack would hand back ExtType
    # or Timestamp objects, which no frame of ours ever contains.
    raise _ExtRefused(f"msgpack ext type {code} is not allowed")


class _TooManyItems(Exception):
    """Raised from inside msgpack once a frame passed its item budget."""


class _ItemBudget:
    """msgpack's list_hook and object_hook: counts the items of every array and map built."""

    __slots__ = ("left",)

    def __init__(self, items: int) -> None:
        self.left = items

    def __call__(self, container: _Container) -> _Container:
        self.left -= len(container)
        if self.left < 0:
            raise _TooManyItems
        return container


def unpack_msgpack(
    data: bytes | memoryview, *, max_bytes: int, max_items: int | None = None
) -> object:
    """Decode exactly one msgpack object from `data` under the rules of this module.

    Shared with other decoders of untrusted msgpack (e.g. `raft.wire.decode_conf_state`).
    `max_items`: at most this many array items and map pairs in all (see the module docstring).
    Raises MalformedFrameError for anything but exactly one well-formed, ext-free object.
    """
    container_len_max = max_bytes if max_items is None else min(max_bytes, max_items)
    budget = None if max_items is None else _ItemBudget(max_items)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            timestamp=0,
            ext_hook=_refuse_ext,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=container_len_max,
            max_map_len=container_len_max,
            # Every ext type is refused. A zero limit stops any ext with a payload, and is the
            # only way to stop msgpack from building Timestamp objects (type -1) by itself,
            # which bypasses ext_hook; the hook catches the remaining zero-length ext values.
            max_ext_len=0,
            list_hook=budget,
            object_hook=budget,
        )
    except _ExtRefused as exc:
        raise MalformedFrameError(str(exc)) from exc
    except _TooManyItems:
        raise MalformedFrameError(
            f"a {len(data)}-byte frame holds more than {max_items} array items and map pairs"
        ) from None
    except msgpack.ExtraData as exc:
        raise MalformedFrameError(
            f"trailing bytes after the msgpack object in a {len(data)}-byte frame"
        ) from exc
    # ValueError covers msgpack's FormatError, StackError (nesting too deep), truncation, size
    # limits, invalid UTF-8 and (with strict_map_key) map keys that are not str or bytes.
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedFrameError(
            f"undecodable msgpack in a {len(data)}-byte frame: {_unpack_failure(exc, data)}"
        ) from exc


def _unpack_failure(exc: BaseException, data: bytes | memoryview) -> str:
    """What msgpack refused, for the error a sender reads. Its StackError and FormatError
    carry no message at all ("undecodable msgpack in a 5001-byte frame: " told a client
    nothing)."""
    if str(exc):
        return str(exc)
    if isinstance(exc, msgpack.StackError):
        return (
            f"nested deeper than msgpack's decoder allows ({_UNPACK_NESTING_MAX} levels of "
            "arrays and maps)"
        )
    if isinstance(exc, msgpack.FormatError):
        return "byte 0xc1 where a value begins (msgpack never uses it)"
    return type(exc).__name__


class FrameDecoder:
    """Incremental decoder of a stream of frames. Not thread-safe; one per connection."""

    __slots__ = ("_buf", "_complete_end", "_dead", "_max_frame_bytes", "_max_items", "_pending")

    def __init__(self, max_frame_bytes: int, *, max_items: int | None = None) -> None:
        """`max_items`: array items and map pairs per frame at most (see the module docstring;
        None: as many as its bytes can hold)."""
        _check_limit(max_frame_bytes)
        _check_items(max_items)
        self._max_frame_bytes = max_frame_bytes
        self._max_items = max_items
        self._buf = bytearray()
        # Invariant: _buf[:_complete_end] holds only whole frames whose headers were checked.
        self._complete_end = 0
        # An error found while scanning ahead in feed(); raised by next_frame() once every frame
        # before it has been returned.
        self._pending: RaftError | None = None
        # Set once an error has been raised: every later call raises it again.
        self._dead: RaftError | None = None

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    @property
    def max_items(self) -> int | None:
        """The item budget of each frame decoded from now on. Settable: a server may decode a
        stranger's first frame under a small budget and the frames after it under another."""
        return self._max_items

    @max_items.setter
    def max_items(self, max_items: int | None) -> None:
        _check_items(max_items)
        self._max_items = max_items

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet returned as frames (lets a caller notice unexpected data)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        """Append bytes received from the stream. An empty `data` is allowed and does nothing."""
        if self._dead is not None:
            raise self._dead.with_traceback(None)
        if self._pending is not None:
            # The stream is already known to be broken at an earlier point; keep nothing more.
            return
        self._buf += data
        self._scan()

    def next_frame(self) -> object | NeedData:
        """Return the next complete frame's object, or NEED_DATA if none is complete yet.

        Raises FrameTooLargeError or MalformedFrameError when the next frame is bad; after that
        the decoder is dead (see the module docstring).
        """
        if self._dead is not None:
            raise self._dead.with_traceback(None)
        if self._complete_end == 0:
            if self._pending is not None:
                self._fail(self._pending)
            return NEED_DATA
        length = int.from_bytes(self._buf[:FRAME_HEADER_BYTES], "big")
        end = FRAME_HEADER_BYTES + length
        try:
            obj = self._unpack(FRAME_HEADER_BYTES, end)
        except MalformedFrameError as exc:
            self._fail(exc)
        # bytearray drops a prefix cheaply (it moves its start pointer), so this is not O(n^2).
        del self._buf[:end]
        self._complete_end -= end
        return obj

    def _scan(self) -> None:
        """Check every newly complete header; stop at the first frame that is not all here."""
        buf = self._buf
        pos = self._complete_end
        while len(buf) - pos >= FRAME_HEADER_BYTES:
            length = int.from_bytes(buf[pos : pos + FRAME_HEADER_BYTES], "big")
            if length > self._max_frame_bytes:
                self._pending = FrameTooLargeError(
                    f"frame header declares {length} bytes; the limit is "
                    f"{self._max_frame_bytes} bytes"
                )
                # Never buffer the oversized body: drop its header and all that followed.
                del buf[pos:]
                break
            if len(buf) - pos - FRAME_HEADER_BYTES < length:
                break
            pos += FRAME_HEADER_BYTES + length
        self._complete_end = pos

    def _unpack(self, start: int, end: int) -> object:
        view = memoryview(self._buf)
        body = view[start:end]
        try:
            return unpack_msgpack(body, max_bytes=self._max_frame_bytes, max_items=self._max_items)
        finally:
            # Release the exports before the caller resizes the bytearray.
            body.release()
            view.release()

    def _fail(self, exc: RaftError) -> NoReturn:
        self._dead = exc
        raise exc
