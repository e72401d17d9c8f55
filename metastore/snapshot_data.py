"""Typed reads of a decoded snapshot's plain data: each raises MalformedSnapshotError on a value of
the wrong shape, so loading a corrupt snapshot fails with the one error it documents. And
`unpack_in_steps`, the decoder of a snapshot's msgpack that never holds the GIL for long."""

from __future__ import annotations

from typing import Any, Final

import msgpack

from metastore.errors import MalformedSnapshotError
from raft.filebytes import FileBytes, FileBytesReader, SnapshotData

# Containers this many levels deep (the top map is level 0) or deeper are decoded by one call
# of msgpack's C decoder; shallower ones item by item. A table's file entries are level 5 (top
# map -> "txns" -> "tables" -> one table's row -> its files -> one file's row), so the largest
# single call decodes one file entry, one commit record or one table incarnation's row.
UNPACK_STEP_DEPTH: Final = 5
# Bytes the stepwise decoder copies out of the snapshot at a time (its read buffer).
UNPACK_READ_BYTES: Final = 64 * 1024

_ARRAY_HEADERS: Final = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
_MAP_HEADERS: Final = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])


class _ViewReader:
    """A file-like reader over a buffer: msgpack's Unpacker copies one chunk at a time, never
    the whole snapshot (a large one stays in its file, read through FileBytesReader)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def read(self, n: int) -> bytes:
        chunk = bytes(self._view[self._pos : self._pos + n])
        self._pos += len(chunk)
        return chunk

    def byte_at(self, position: int) -> int:
        return self._view[position]


def _unpack_one(
    unpacker: msgpack.Unpacker, reader: _ViewReader | FileBytesReader, depth: int
) -> object:
    # A module function, not a closure calling itself: that would be a reference cycle, left
    # for the collector (the node process freezes it out of its scans: it would stay).
    if depth < UNPACK_STEP_DEPTH:
        header = reader.byte_at(unpacker.tell())
        if header in _ARRAY_HEADERS:
            return [
                _unpack_one(unpacker, reader, depth + 1)
                for _ in range(unpacker.read_array_header())
            ]
        if header in _MAP_HEADERS:
            out: dict[object, object] = {}
            for _ in range(unpacker.read_map_header()):
                key = _unpack_one(unpacker, reader, depth + 1)
                if type(key) is not str and type(key) is not bytes:
                    raise ValueError(f"{type(key).__name__} is not allowed for map key")
                out[key] = _unpack_one(unpacker, reader, depth + 1)
            return out
    return unpacker.unpack()


def unpack_in_steps(data: SnapshotData) -> Any:
    """What `msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)` returns, in
    many short calls of the C decoder instead of one.

    Why: a node decodes a snapshot it installs in a worker thread so that its event loop goes on
    (raft.node: `prepare_restore`), but one C call holds the GIL from start to end: 1.3 s for a
    110 MiB snapshot of a million file entries, all of it a stall of the loop. Between the
    calls here the interpreter hands the GIL to the loop (every `sys.getswitchinterval()`).
    Raises what msgpack raises on bad input (ValueError, its own errors), and ValueError for
    bytes after the object (unpackb's ExtraData) and non-string map keys (strict_map_key)."""
    reader: _ViewReader | FileBytesReader
    if isinstance(data, FileBytes):
        # A large snapshot stays in its file, read a chunk at a time (raft.filebytes): a disk
        # error is then a FileReadError (an OSError), which the caller lets through.
        reader, length = FileBytesReader(data), len(data)
    else:
        view = memoryview(data).cast("B")
        reader, length = _ViewReader(view), len(view)
    size = max(length, 1)
    unpacker = msgpack.Unpacker(
        reader,
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_buffer_size=size,  # unpackb's limits are the input's length too
        read_size=min(UNPACK_READ_BYTES, size),
    )

    obj = _unpack_one(unpacker, reader, 0)
    if unpacker.tell() != length:
        raise ValueError(f"extra data after the snapshot (at byte {unpacker.tell()})")
    return obj


def expect_list(value: object, length: int | None = None) -> list[object]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise MalformedSnapshotError(f"expected a list of length {length}")
    return value


def expect_rows(value: object, width: int) -> list[list[object]]:
    """A list of `width`-item lists (a table of rows)."""
    if not isinstance(value, list) or not all(
        isinstance(r, list) and len(r) == width for r in value
    ):
        raise MalformedSnapshotError(f"expected a list of {width}-item rows")
    return value


def expect_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedSnapshotError("expected an integer")
    return value


def expect_opt_int(value: object) -> int | None:
    return None if value is None else expect_int(value)


def expect_str(value: object) -> str:
    if not isinstance(value, str):
        raise MalformedSnapshotError("expected a string")
    return value
