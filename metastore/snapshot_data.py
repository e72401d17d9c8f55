"""Typed reads of a decoded snapshot's plain data: each raises MalformedSnapshotError on a value of
the wrong shape, so loading a corrupt snapshot fails with the one error it documents. And
`unpack_in_steps`, the decoder of a snapshot's msgpack that never holds the GIL for long, and
`SnapshotEncoder`, its encoder: a view of the state taken at once, packed later in short calls."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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

# Rows a deferred list (`DeferredRows`) is packed by at a time: one msgpack C call and one
# C-level map over this many file entries take ~2-3 ms each at ~110-byte paths, so a thread
# packing them hands the GIL back to the event loop about as often as the interpreter asks.
PACK_STEP_ROWS: Final = 8_192

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


class DeferredRows:
    """A list of rows in a snapshot's plain data, made and packed only when the snapshot is
    encoded: `items` is an immutable sequence of immutable objects (frozen file entries) and
    `row` turns one into its row. Packs exactly as `list(map(row, items))` would."""

    __slots__ = ("items", "row")

    def __init__(self, items: tuple[object, ...], row: Callable[[Any], object]) -> None:
        self.items = items
        self.row = row

    def parts(self, packer: msgpack.Packer) -> list[bytes | memoryview]:
        items, row = self.items, self.row
        out: list[bytes | memoryview] = [packer.pack_array_header(len(items))]
        for start in range(0, len(items), PACK_STEP_ROWS):
            rows = list(map(row, items[start : start + PACK_STEP_ROWS]))
            packed = packer.pack(rows)
            # The chunk packed as one array, less its header: its items' bytes (a view, so no
            # copy until the final join).
            out.append(memoryview(packed)[len(packer.pack_array_header(len(rows))) :])
        return out


class _Rows:
    """A list of rows packed in `SnapshotEncoder.parts`: fresh lists the encoder alone holds."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[object]) -> None:
        self.rows = rows


class SnapshotEncoder:
    """A snapshot's msgpack, prepared in two halves (MetastoreState.snapshot_encoder).

    Made on the event loop, at one applied index: everything but one list of rows is packed at
    once (bytes: nothing `apply` does later can change them). That list (each table's row of
    the txn log) is plain data made for the encoder alone, and its `DeferredRows` hold tuples
    of the state's frozen entries. `parts()`, later, in a worker thread (raft.node), packs the
    rows and the entries in short C calls: the parts join to what `msgpack.packb(data,
    use_bin_type=True)` makes of the same data with each `DeferredRows` as its list, byte for
    byte. Packing a million file entries held the GIL for ~0.5 s in one `packb`; here each
    call is a few milliseconds, so the loop keeps its turns
    (tests/metastore/test_snapshot_encode.py). The rows are packed in the thread too: a catalog
    of 100k tables would otherwise be 100k row packs on the loop."""

    def __init__(self, data: Mapping[str, object], *, rows_at: Sequence[str]) -> None:
        """`rows_at`: the map keys down to the list of rows (each row a list whose items may be
        `DeferredRows`). Every value off that path is packed now."""
        self._parts: list[bytes | _Rows] = []
        self._prepare(msgpack.Packer(use_bin_type=True), data, tuple(rows_at))

    def _prepare(self, packer: msgpack.Packer, value: object, path: tuple[str, ...]) -> None:
        parts = self._parts
        if not path and type(value) is list:
            parts.append(_Rows(value))
        elif path and type(value) is dict:
            parts.append(packer.pack_map_header(len(value)))
            for key, item in value.items():
                parts.append(packer.pack(key))
                if key == path[0]:
                    self._prepare(packer, item, path[1:])
                else:
                    parts.append(packer.pack(item))
        else:
            parts.append(packer.pack(value))

    def __call__(self) -> bytes:
        return b"".join(self.parts())

    def parts(self) -> list[bytes | memoryview]:
        """The snapshot's bytes in parts, to be written one after the other: joining 110 MiB
        is one C call of ~0.08 s, holding the GIL (a node writes the parts instead). Small
        pieces are gathered, so there are about as many parts as steps of file entries."""
        packer = msgpack.Packer(use_bin_type=True)  # one per call: safe in any thread
        out: list[bytes | memoryview] = []
        small = bytearray()
        for part in self._parts:
            if not isinstance(part, _Rows):
                small += part
                continue
            rows = part.rows
            small += packer.pack_array_header(len(rows))
            for row in rows:
                if type(row) is not list or DeferredRows not in map(type, row):
                    small += packer.pack(row)
                    continue
                small += packer.pack_array_header(len(row))
                for item in row:
                    if isinstance(item, DeferredRows) and len(item.items) < PACK_STEP_ROWS:
                        small += packer.pack(list(map(item.row, item.items)))
                    elif isinstance(item, DeferredRows):
                        out.append(bytes(small))
                        small.clear()
                        out.extend(item.parts(packer))
                    else:
                        small += packer.pack(item)
        out.append(bytes(small))
        return out


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
