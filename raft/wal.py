"""The write-ahead log and snapshot store: what a node has promised survives a crash.

Key idea
--------
Raft's durability contract is "persist entries and the hard state BEFORE sending any message that
depends on them". The driver meets it by calling `WriteAheadLog.append` (one call per group of
proposals) and only acting on the batch after the call returns. `append` encodes every entry and
the hard state as checksummed records, writes them with ONE write and makes them durable with ONE
fdatasync. The log is a sequence of numbered segment files; snapshots live beside it in their own
files. Recovery (`WriteAheadLog.open`) reads the newest valid snapshot and replays the segments.

What must be durable is what Raft calls persistent state: entries, term and vote. The commit
index is volatile state (Raft paper, Figure 2): a node that forgets how far it knew the log to be
committed relearns it from the leader, and the entries themselves are already durable on a
quorum. So an `append` that carries no entries and a hard state that differs from the previous
one only in `commit` is written (in order, before the call returns) but not fdatasync'd; the
next synced write, a segment roll or a close makes it durable. A power loss can then cost at most
those commit-only records, never an entry, a term or a vote. This saves one fsync per commit
advance: without it a lone proposer pays two fsyncs in a row (its entry, then its commit).

Jargon
------
* **record**: ``magic u16 | type u8 | payload length u32 | crc32 u32 | payload`` (little endian).
  The CRC covers the type byte and the payload; the payload is msgpack (never pickle).
  ``ENTRY [term, index, tm, kind, data]``, ``HARD_STATE [term, vote, commit]`` and
  ``RESET [index, term]`` ("from here on the log is exactly the snapshot at index, no entries").
* **batch**: every `append` writes ONE ``BATCH`` record whose payload is its ENTRY and
  HARD_STATE records, framed with another magic. Its CRC covers them all, so damage anywhere in
  the last write of a power loss (disks persist sectors in any order) is a torn batch, cut off
  whole; the records inside cannot be mistaken for valid records after the damage. Segments
  written before batches existed (plain top-level records) still replay.
* **segment**: ``wal-<seq:016x>-<first_index:016x>.log``. ``seq`` orders segments (contiguous,
  increasing); ``first_index`` is the index the segment was started at, for humans.
* **preallocated tail**: the live segment's bytes after its last record, zeros written ahead
  of the records (`WAL_PREALLOCATE_BYTES` at a time) so that a sync does not change the file's
  size. Zeros never parse as a record (magic and type 0 are not valid), so a live segment ends
  at its first all-zero rest; a segment stops being live only once it is cut to its records
  (`_create_segment` truncates and syncs it before the next file exists), so only the last
  segment ever has such a tail. Segments written without one (older releases,
  preallocation off) replay the same, and an older release reading a preallocated segment cuts
  the zeros as a torn tail.
* **snapshot file**: ``snap-<index:016x>.snap``: magic, CRC32, length and a msgpack map with the
  `SnapshotMeta`, the application's bytes and a **floor**: the first segment seq whose entries
  still count (an installed snapshot discards every entry in older segments).
* **torn tail**: the end of the last segment that a crash left half-written: an incomplete
  record or batch, or a bad record or batch followed by no valid record, or only by
  commit-only batches with the term and vote in force before it (never synced on their own: a
  power loss may keep a later unsynced page and lose an earlier one). It is cut off on
  recovery; it can only hold data no fdatasync covered: an `append` that never returned, or
  commit indexes. Damage followed by any record that was synced is corruption: any fdatasync
  makes every earlier byte of the file durable. So is a damaged batch too long to be
  commit-only (its header intact) with a valid record right after it: that record proves the
  batch's append returned, which an append with entries does only once synced.
* **the one power loss refused as corruption**: unsynced commit-only records, then an append
  with entries whose fdatasync a power loss interrupted after the disk kept that batch's
  sectors but not an earlier one holding a commit-only record. It stays corruption (an
  operator's call, `CORRUPT_LOG_REMEDY`), because no byte on disk tells it apart from the
  append having returned (acknowledged) and the storage later losing that earlier sector: a
  lost write reads as the sector's older contents, which are the zeros written ahead either
  way, at the same sector granularity. Cutting at the damage would then lose acknowledged
  entries; keeping the later records and skipping the damage would need proof that the lost
  bytes held only commit indexes, which the format does not record (they may have held synced
  entries, even an overwrite of earlier ones, that the later batch does not supersede: the
  replayed log would then break Log Matching). Telling the two apart needs the writer to
  leave evidence, e.g. each synced batch naming the offset up to which the file had been
  synced before it (damage wholly after that offset held only commit-only records and could
  be skipped): a format change. Usually the lost sector also holds the start of the later
  batch (records are contiguous), which is then damaged too, and the tail is cut as above.

Storage faults
--------------
An OSError in a write of the log (ENOSPC, EIO: in a write, an fdatasync, a segment roll, the
directory sync after a snapshot's rename, a delete at compaction) fails the instance: the call
raises `WalIOError` naming the operation, the file and the errno, and every later write raises
`WalFailedError`. Nothing is retried: after a failed fdatasync the kernel may have dropped the
pages it could not write, and a second one would report success ("fsyncgate"; PostgreSQL and
etcd stop too). The live segment is cut back to its last good sync first (`_fail`), so a
restarted process, which reads the page cache, does not take the failed append's bytes for
durable ones; only never-acknowledged bytes are cut. The driver stops the node; a restart
recovers. A sync that fails in recovery (`open`) cannot be cut back so: what the predecessor
left unsynced cannot be told from what it synced. The open fails and leaves ``SYNC_FAILED``
naming the boot, and every later open of that boot refuses (its sync would succeed, the error
reported once, and read the cache back as durable); after a reboot the disk decides. So
does a live-path failure whose cut fails too.
A snapshot file that cannot be written, synced or renamed into place fails only that
call: its temporary file is deleted and the log, with its older snapshot, stays usable.
A large snapshot file is never mapped (a page read through a map that the disk cannot read,
or past the end of a file someone truncated, is a SIGBUS: the process dies without a word).
Its checksum pass at open reads it with plain reads, where EIO is a `WalIOError` naming the
file; later (when it is sent to a follower or restored) it is read with pread through a
`raft.filebytes.FileBytes`, where the same failure is a `FileReadError` naming the file.

Replay rules
------------
Hard-state records: the last one wins (read from every segment). Entry records: an entry at index
i replaces everything at >= i written before it (a follower overwriting a conflicting suffix).
Reset records: drop all entries. Segments below the snapshot's floor contribute hard states only.
Entries at or below the snapshot index are dropped; the rest must start at snapshot index + 1.

Invariants
----------
* The live segment is the last one; every other segment is immutable.
* Segments are only deleted as a prefix (oldest first), so what remains always replays to the same
  log above the deletion bound, whatever step a crash interrupts.
* Before any segment is deleted, the current hard state is recorded in the live segment (written
  there if the last hard-state record sits in an older segment), so term and vote never vanish.
* Compaction only deletes segments whose entries are all <= the OLDEST kept snapshot's index, so
  falling back to an older snapshot (when the newest has a bad checksum) still finds its log.
* `install_snapshot` is atomic: renaming the snapshot file (whose floor points past every existing
  segment) is the commit point. A crash before it recovers the old state; after it, the new one.
  The reset record written next makes a fallback to an older snapshot fail loudly instead of
  silently mixing an old snapshot with a newer log.

Concurrency
-----------
NOT thread-safe, by design: the node driver serialises all calls (each runs on its loop thread or
in its one worker thread, and every worker call is awaited before the next call is made). Across
processes, an exclusive ``flock`` on ``LOCK`` keeps a second process out.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import re
import struct
import time
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Final

import msgpack

from raft.core.types import ConfState, Entry, EntryKind, HardState, Snapshot, SnapshotMeta
from raft.filebytes import FileBytes, FileReadError, SnapshotData, snapshot_bytes
from raft.framing import msgpack_bin_header
from raft.oserror import errno_text, os_error_text

# ============================================================================================
# Limits. They belong in raft/limits.py and will move there; kept here meanwhile.
# ============================================================================================

# A segment rolls when the next write would take it past this size (a single batch larger than
# this gets a segment of its own). 64 MiB as in etcd: few files, cheap deletion.
WAL_SEGMENT_BYTES_MAX: Final = 64 * 1024 * 1024
# The live segment is kept this far ahead of its last record with zeros that were written (not
# fallocated: ext4 converts an unwritten extent at the first write into each block, which is a
# journal commit). An fdatasync that does not change the file's size or block map then skips the
# journal commit: 2 waits for the device instead of 3 and ~20 us less per sync on this machine's
# ext4 (docs/benchmarks.md, "Preallocated segments"). 0 turns it off (the file grows per write).
WAL_PREALLOCATE_BYTES: Final = 1024 * 1024
# The payload of one record (one entry). Also the sanity bound when reading a length field.
WAL_RECORD_BYTES_MAX: Final = 16 * 1024 * 1024
# One `append` call, encoded. The driver's own queue limits keep it far below this.
WAL_APPEND_BYTES_MAX: Final = 256 * 1024 * 1024
# One snapshot file. Large ones stay in their file (read in chunks), never read or built whole
# on the heap.
SNAPSHOT_BYTES_MAX: Final = 1024 * 1024 * 1024
# Snapshot files kept on disk: the newest plus a fallback in case the newest is damaged.
SNAPSHOTS_KEPT: Final = 2

# ============================================================================================
# Errors. They belong in raft/errors.py (under RaftError) and will move there.
# ============================================================================================


class WalError(Exception):
    """Base of every error raised by the write-ahead log."""

    code: ClassVar[str] = "wal_error"


class CorruptLogError(WalError):
    """The files on disk cannot be replayed: real corruption, not a torn tail. Needs a human:
    the message says what to do (`CORRUPT_LOG_REMEDY`); `reason` alone says what is wrong."""

    code: ClassVar[str] = "wal_corrupt"

    def __init__(self, reason: str, *, path: Path, offset: int | None = None) -> None:
        where = f"{path}" if offset is None else f"{path} at offset {offset}"
        super().__init__(f"corrupt write-ahead log: {where}: {reason}. {CORRUPT_LOG_REMEDY}")
        self.reason = reason
        self.path = path
        self.offset = offset


# Recovery raises CorruptLogError before it cuts, writes or deletes anything in the log.
CORRUPT_LOG_REMEDY: Final = (
    "The log and snapshot files were left as they are. Do not cut or edit them to make the "
    "node start: the records after the damage may hold entries or a vote this node "
    "acknowledged, and a node that forgets them can break the cluster's safety. Keep the "
    "directory for inspection. If the other members still form a quorum, remove this node "
    "from the cluster (`metastore cluster remove-node ID`), move its data directory aside and "
    "add it back as a new member with an empty one (`metastore cluster add-node ID HOST:PORT`, "
    "start it once with --bootstrap, then `metastore cluster promote-node ID --wait 10m`; with "
    "TLS it needs a new certificate, `metastore cluster certs`): it catches up from the "
    "leader. If they do not, restore the cluster from a backup "
    "(`metastore snapshot restore`)."
)


class LogGapError(WalError):
    """Programmer error: an append would leave a hole in the log, or a batch is not contiguous."""

    code: ClassVar[str] = "wal_log_gap"


class CompactedIndexError(WalError):
    """Programmer error: an append at or below the snapshot index (those entries are compacted)."""

    code: ClassVar[str] = "wal_compacted_index"


class SnapshotPositionError(WalError):
    """Programmer error: an empty snapshot, one older than the current snapshot, or (for
    `compact`) one beyond the last entry of the log."""

    code: ClassVar[str] = "wal_snapshot_position"


class RecordTooLargeError(WalError):
    """An entry, an append batch or a snapshot exceeds its byte limit."""

    code: ClassVar[str] = "wal_too_large"


class WalConfigError(WalError):
    code: ClassVar[str] = "wal_config"


class WalLockedError(WalError):
    """Another process (or another open in this one) holds the log directory."""

    code: ClassVar[str] = "wal_locked"


class WalClosedError(WalError):
    code: ClassVar[str] = "wal_closed"


class WalMissingError(WalError):
    """`WriteAheadLog.read` found no log: the directory, or its LOCK file (which every log
    opened once has), does not exist."""

    code: ClassVar[str] = "wal_missing"


class WalIOError(WalError):
    """The operating system refused a read, write, fsync, rename or delete."""

    code: ClassVar[str] = "wal_io"


class WalFailedError(WalError):
    """An earlier I/O error left the files in an unknown state (after a failed fsync the page
    cache cannot be trusted): this instance refuses all writes; close it and reopen."""

    code: ClassVar[str] = "wal_failed"


# ============================================================================================
# Public values
# ============================================================================================


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveredState:
    hard_state: HardState
    snapshot: Snapshot  # empty Snapshot() if none
    entries: tuple[Entry, ...]  # contiguous, starting at snapshot.meta.index + 1


# Upper bounds (seconds) of the fsync duration histogram (WalStats.fsync_bucket_counts), as
# etcd's wal_fsync_duration_seconds: a healthy SSD syncs in well under 10 ms.
FSYNC_SECONDS_BUCKETS: Final = (
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class WalStats:
    bytes_written: int  # to segment and snapshot files since open
    fsyncs: int  # file and directory syncs since open (0 when fsync=False)
    fsync_seconds_total: float
    # Syncs by duration: [i] counts those in (FSYNC_SECONDS_BUCKETS[i-1], [i]], the last one
    # those above every bound (not cumulative; its sum is `fsyncs`).
    fsync_bucket_counts: tuple[int, ...]
    segments: int  # segment files now on disk
    last_index: int  # index of the last entry, or the snapshot index if there is none
    # Commit-only hard-state records written but not yet synced (see the module docstring).
    unsynced_commit_records: int


# ============================================================================================
# Record format
# ============================================================================================


class _RecordType(IntEnum):
    # 0 is deliberately unused: a zero-filled tail must never parse as a record.
    ENTRY = 1
    HARD_STATE = 2
    RESET = 3
    # One `append`'s records as one record: its CRC covers all of them, so a power loss that
    # damages any part of the last write (sectors reach the disk in any order) makes the whole
    # batch a torn tail instead of "corruption with valid records after it".
    BATCH = 4


_RECORD_HEADER: Final = struct.Struct("<2sBII")  # magic, type, payload length, crc32
_RECORD_MAGIC: Final = b"\xd7\x5a"
# Records inside a BATCH carry another magic, so the search for a valid record after damage
# (`_synced_record_after`) never mistakes the intact inside of a torn batch for a later record.
_INNER_MAGIC: Final = b"\xd7\x5b"
_RECORD_TYPES: Final = frozenset(int(t) for t in _RecordType)
_EMPTY_HARD_STATE: Final = HardState()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Reset:
    index: int
    term: int


_Record = Entry | HardState | _Reset


def _record_crc(rtype: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(bytes((rtype,))))


def _frame(rtype: _RecordType, payload: bytes, magic: bytes = _RECORD_MAGIC) -> bytes:
    return _RECORD_HEADER.pack(magic, rtype, len(payload), _record_crc(rtype, payload)) + payload


_ENTRY_CRC_SEED: Final = zlib.crc32(bytes((_RecordType.ENTRY,)))
# Upper bound of an encoded HARD_STATE record: header plus three msgpack uint64 in an array.
_HARD_STATE_RECORD_BYTES_MAX: Final = _RECORD_HEADER.size + 1 + 3 * 9


def _entry_records(entries: Sequence[Entry], magic: bytes = _RECORD_MAGIC) -> list[bytes]:
    """Header and payload of one ENTRY record per entry, in order (the same bytes `_frame`
    would build, without a Packer, a type byte and a concatenation per entry: this is the hot
    path of every append). Raises RecordTooLargeError before anything is written."""
    pack = msgpack.Packer(use_bin_type=True).pack
    header = _RECORD_HEADER.pack
    crc32 = zlib.crc32
    parts: list[bytes] = []
    for entry in entries:
        payload = pack((entry.term, entry.index, entry.tm, int(entry.kind), entry.data))
        size = len(payload)
        if size > WAL_RECORD_BYTES_MAX:
            raise RecordTooLargeError(
                f"entry {entry.index} encodes to {size} bytes, over "
                f"WAL_RECORD_BYTES_MAX={WAL_RECORD_BYTES_MAX}"
            )
        parts.append(header(magic, _RecordType.ENTRY, size, crc32(payload, _ENTRY_CRC_SEED)))
        parts.append(payload)
    return parts


def _hard_state_record(hs: HardState, magic: bytes = _RECORD_MAGIC) -> bytes:
    return _frame(_RecordType.HARD_STATE, msgpack.packb((hs.term, hs.vote, hs.commit)), magic)


def _reset_record(index: int, term: int) -> bytes:
    return _frame(_RecordType.RESET, msgpack.packb((index, term)))


def _is_int(value: object) -> bool:
    # msgpack decodes booleans as bool, a subclass of int: refuse them.
    return type(value) is int


def _unpack_ints(payload: bytes, count: int) -> tuple[int, ...]:
    value = msgpack.unpackb(payload, raw=False, use_list=False)
    if not (isinstance(value, tuple) and len(value) == count and all(map(_is_int, value))):
        raise ValueError(f"expected {count} integers, got {value!r:.80}")
    return tuple(int(v) for v in value)


def _decode_record(rtype: _RecordType, payload: bytes) -> _Record:
    """Raises ValueError (or a msgpack error) if a CRC-valid payload has the wrong shape."""
    match rtype:
        case _RecordType.ENTRY:
            value = msgpack.unpackb(payload, raw=False, use_list=False)
            if not (isinstance(value, tuple) and len(value) == 5):
                raise ValueError(f"entry payload is not a 5-tuple: {value!r:.80}")
            term, index, tm, kind, data = value
            if not (all(map(_is_int, (term, index, tm, kind))) and isinstance(data, bytes)):
                raise ValueError(f"entry fields have wrong types: {value!r:.80}")
            return Entry(term=term, index=index, tm=tm, kind=EntryKind(kind), data=data)
        case _RecordType.HARD_STATE:
            term, vote, commit = _unpack_ints(payload, 3)
            return HardState(term=term, vote=vote, commit=commit)
        case _RecordType.RESET:
            index, term = _unpack_ints(payload, 2)
            return _Reset(index=index, term=term)
        case _RecordType.BATCH:
            raise ValueError("a batch inside a batch")


def _decode_batch(payload: bytes) -> list[_Record]:
    """The records of a CRC-valid BATCH payload (each framed with `_INNER_MAGIC`)."""
    records: list[_Record] = []
    offset = 0
    while offset < len(payload):
        parsed = _parse_record_at(payload, offset, magic=_INNER_MAGIC)
        if isinstance(parsed, str):
            raise ValueError(f"batch member at {offset}: {parsed}")
        rtype, inner, offset = parsed
        records.append(_decode_record(rtype, inner))
    return records


def _record_header_at(data: bytes, offset: int, magic: bytes) -> tuple[int, int, int, int] | str:
    """The header starting at `offset` as (type, payload start, payload end, crc), checked for
    everything but the checksum, or why it is no record's."""
    payload_start = offset + _RECORD_HEADER.size
    if payload_start > len(data):
        return "incomplete record header"
    found, rtype, length, crc = _RECORD_HEADER.unpack_from(data, offset)
    if found != magic:
        return "bad record magic"
    if rtype not in _RECORD_TYPES:
        return f"unknown record type {rtype}"
    limit = WAL_APPEND_BYTES_MAX if rtype == _RecordType.BATCH else WAL_RECORD_BYTES_MAX
    if length > limit:
        return f"record length {length} over its limit {limit}"
    end = payload_start + length
    if end > len(data):
        return "incomplete record payload"
    return rtype, payload_start, end, crc


def _parse_record_at(
    data: bytes, offset: int, *, magic: bytes = _RECORD_MAGIC
) -> tuple[_RecordType, bytes, int] | str:
    """The record starting at `offset` as (type, payload, end offset), or why there is none."""
    header = _record_header_at(data, offset, magic)
    if isinstance(header, str):
        return header
    rtype, payload_start, end, crc = header
    payload = data[payload_start:end]
    if _record_crc(rtype, payload) != crc:
        return "record checksum mismatch"
    return _RecordType(rtype), payload, end


# --------------------------------------------------------------------------------------------
# The search for records after damage checks a record header at every offset holding the magic,
# and garbage can hold one every few bytes, each with a length reaching to the end of the file
# (random bytes rarely do; a crafted entry value can). Checksumming each candidate over its
# length would be quadratic: a crafted 1 MiB took 18 s to open, a 64 MiB segment about a day.
# So a long candidate's checksum comes from the checksums of two prefixes of the file instead,
# by arithmetic on CRC-32 polynomials (zlib's crc32_combine, which Python does not expose):
#   crc32(B, c) == crc32(B, 0) ^ c * x^(8 len(B))   and   crc32(A + B, 0) == crc32(B, crc32(A, 0)),
# so with P(i) = crc32(data[base:i]):  crc32(data[s:e], seed) == P(e) ^ (P(s) ^ seed) * x^(8(e-s)),
# all modulo the CRC-32 polynomial. Each candidate then costs at most a few hundred bytes
# checksummed and at most 16 table lookups (4 per nonzero byte of its length field).
# --------------------------------------------------------------------------------------------

# zlib's CRC-32 polynomial in its reflected bit order: bit 31 is the coefficient of x^0.
_CRC32_POLYNOMIAL: Final = 0xEDB88320
_CRC32_ONE: Final = 1 << 31  # the polynomial 1
_CRC32_X8: Final = 1 << 23  # x^8: what one byte multiplies a start value by
# Candidates at most this long are checksummed directly (cheaper than the arithmetic). These two
# are not Final: tests lower them so that short candidates take the arithmetic path too.
_CRC_DIRECT_BYTES_MAX = 256
# P(i) is kept for every i this far apart; P of any other offset is one short checksum away.
_CRC_CHECKPOINT_BYTES = 128
# The seed of a record's checksum: the CRC of its type byte (see `_record_crc`).
_RECORD_CRC_SEEDS: Final = {int(t): zlib.crc32(bytes((t,))) for t in _RecordType}


def _crc32_multiply(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (both in reflected bit order)."""
    product = 0
    for _ in range(32):  # one coefficient of `a` per turn, x^0 first
        if a & _CRC32_ONE:
            product ^= b
        a = (a << 1) & 0xFFFFFFFF
        b = (b >> 1) ^ _CRC32_POLYNOMIAL if b & 1 else b >> 1  # b * x
    return product


def _crc32_x_power(byte_count: int) -> int:
    """x^(8 byte_count) modulo the CRC-32 polynomial: what `byte_count` bytes multiply by."""
    result, square = _CRC32_ONE, _CRC32_X8
    for _ in range(byte_count.bit_length()):
        if byte_count & 1:
            result = _crc32_multiply(result, square)
        square = _crc32_multiply(square, square)
        byte_count >>= 1
    return result


def _crc32_multiplication_table(factor: int) -> array[int]:
    """c -> c * factor as four 256-entry tables, one per byte of c (it is linear in c)."""
    # images[k] = factor * x^k; bit i of c is the coefficient of x^(31 - i).
    images = []
    image = factor
    for _ in range(32):
        images.append(image)
        image = (image >> 1) ^ _CRC32_POLYNOMIAL if image & 1 else image >> 1
    table = array("L", bytes(array("L").itemsize * 1024))
    for byte_position in range(4):
        base = 256 * byte_position
        for value in range(1, 256):
            lowest = value & -value
            bit = 8 * byte_position + lowest.bit_length() - 1
            table[base + value] = table[base + (value ^ lowest)] ^ images[31 - bit]
    return table


class _Crc32Shifter:
    """c -> c * x^(8n) for any n below 2^32: how a CRC start value reaches the end of n bytes.
    n is taken a byte at a time; each (byte position, digit) table is built when first needed,
    so a search builds at most 1024 of them (4 KiB or 8 KiB each)."""

    __slots__ = ("_tables",)

    def __init__(self) -> None:
        # Indexed by 256 * byte position + digit.
        self._tables: list[array[int] | None] = [None] * 1024

    def shift(self, value: int, byte_count: int) -> int:
        if not 0 <= byte_count < 1 << 32:
            raise ValueError(f"byte count {byte_count} out of range")
        tables = self._tables
        key = 0
        while byte_count:  # at most 4 turns
            digit = byte_count & 0xFF
            if digit:
                table = tables[key | digit] or self._build(key | digit)
                value = (
                    table[value & 0xFF]
                    ^ table[256 | ((value >> 8) & 0xFF)]
                    ^ table[512 | ((value >> 16) & 0xFF)]
                    ^ table[768 | (value >> 24)]
                )
            byte_count >>= 8
            key += 256
        return value

    def _build(self, key: int) -> array[int]:
        byte_position, digit = divmod(key, 256)
        table = _crc32_multiplication_table(_crc32_x_power(digit << (8 * byte_position)))
        self._tables[key] = table
        return table


class _RangeCrc:
    """crc32 of any range of `data` at or after `base`, at a cost independent of its length
    (see above). The prefix checkpoints are computed on the first long range: one pass."""

    __slots__ = ("_base", "_checkpoints", "_shifter", "_step", "_view")

    def __init__(self, data: bytes, *, base: int) -> None:
        self._view = memoryview(data)
        self._base = base
        self._step = _CRC_CHECKPOINT_BYTES
        self._checkpoints: array[int] | None = None
        self._shifter = _Crc32Shifter()

    def crc32(self, start: int, end: int, seed: int) -> int:
        """zlib.crc32(data[start:end], seed), for base <= start <= end <= len(data)."""
        if end - start <= _CRC_DIRECT_BYTES_MAX:
            return zlib.crc32(self._view[start:end], seed)
        return self._prefix(end) ^ self._shifter.shift(self._prefix(start) ^ seed, end - start)

    def _prefix(self, position: int) -> int:
        """crc32(data[base:position])."""
        checkpoints = self._checkpoints
        if checkpoints is None:
            checkpoints = self._checkpoints = array("L", [0])
            crc = 0
            for offset in range(self._base + self._step, len(self._view) + 1, self._step):
                crc = zlib.crc32(self._view[offset - self._step : offset], crc)
                checkpoints.append(crc)
        index = (position - self._base) // self._step
        checkpoint = self._base + index * self._step
        return zlib.crc32(self._view[checkpoint:position], checkpoints[index])


def _valid_records_from(data: bytes, start: int) -> Iterator[tuple[int, _RecordType, bytes]]:
    """(offset, type, payload) of every top-level record with a valid checksum whose header
    starts at or after `start`, by offset, whatever lies between them: every offset holding
    the magic is tried, also inside records found. Linear in len(data) - start: each offset
    costs at most a few hundred bytes checksummed, and only valid records are copied."""
    checksums = _RangeCrc(data, base=start)
    position = data.find(_RECORD_MAGIC, start)
    while position != -1:  # at most len(data) turns: `position` only grows
        header = _record_header_at(data, position, _RECORD_MAGIC)
        if not isinstance(header, str):
            rtype, payload_start, end, crc = header
            if checksums.crc32(payload_start, end, _RECORD_CRC_SEEDS[rtype]) == crc:
                yield position, _RecordType(rtype), data[payload_start:end]
        position = data.find(_RECORD_MAGIC, position + 1)


def _synced_record_after(
    data: bytes, start: int, *, hard_state: HardState, last_index: int
) -> tuple[str | None, int]:
    """Whether the damage just before `start` in the live segment can be a torn write: (why
    not, or None; how many unsynced commit-only records follow it).

    Any fdatasync of the file makes every earlier byte of it durable. So damage followed by a
    valid record that was synced (entries, a term or vote change, a reset, a plain top-level
    record) is corruption in the middle. A batch holding only a hard state with the term and
    vote in force before the damage is the one kind never synced on its own; if only such
    records follow, the damage and all after it may never have reached the disk, and cutting
    there loses only commit indexes (volatile state). Term and vote only grow, so an equal
    term and vote after the damage also proves none changed inside it; a commit index beyond
    the last entry before the damage proves entries were lost there. Every position holding
    the magic is tried (also inside records found), so no record can hide another; in time
    linear in the bytes after `start` (`_valid_records_from`).
    """
    unsynced = 0
    for position, rtype, payload in _valid_records_from(data, start):
        why = _why_synced(rtype, payload, hard_state=hard_state, last_index=last_index)
        if why is not None:
            return f"{why} at offset {position}", unsynced
        unsynced += 1
    return None, unsynced


def _damaged_batch_was_synced(data: bytes, offset: int) -> str | None:
    """Why the damaged record at `offset` must have been synced, judged by its own header, or
    None. A BATCH whose header is intact, too long to hold only a hard state, and followed right
    at its end by a valid record: the later record proves its append returned, and an append
    that long carried entries, so it returned only after its fdatasync. Damage inside it (a
    flipped bit, say) is then corruption, even if only commit-only records follow."""
    if offset + _RECORD_HEADER.size > len(data):
        return None
    magic, rtype, length, _crc = _RECORD_HEADER.unpack_from(data, offset)
    if magic != _RECORD_MAGIC or rtype != _RecordType.BATCH:
        return None
    if not _HARD_STATE_RECORD_BYTES_MAX < length <= WAL_APPEND_BYTES_MAX:
        return None
    end = offset + _RECORD_HEADER.size + length
    if end >= len(data) or isinstance(_parse_record_at(data, end), str):
        return None
    return (
        f"the damaged batch holds {length} bytes, more than a commit index alone, and a valid "
        f"record follows it at offset {end}"
    )


def _why_synced(
    rtype: _RecordType, payload: bytes, *, hard_state: HardState, last_index: int
) -> str | None:
    """None if this record can be a commit-only append written after `hard_state` without a
    sync (see `WriteAheadLog._must_sync`), else what shows that the bytes before it were synced."""
    if rtype != _RecordType.BATCH:
        return f"a {rtype.name} record"
    try:
        records = _decode_batch(payload)
    except (ValueError, msgpack.UnpackException):
        return "an undecodable batch"
    if len(records) != 1 or not isinstance(records[0], HardState):
        return "a batch with entries or a reset"
    found = records[0]
    if (found.term, found.vote) != (hard_state.term, hard_state.vote):
        return f"a hard state with term {found.term} and vote {found.vote}"
    if found.commit > last_index:
        return f"a commit index {found.commit} beyond the last entry {last_index}"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class _ScannedSegment:
    records: tuple[tuple[int, _Record], ...]  # (offset, record)
    valid_bytes: int  # where the torn tail (if any) begins
    # Why the bytes from valid_bytes on were rejected. Not yet a verdict: whether valid records
    # after them make it corruption depends on the state before (`_synced_record_after`).
    torn_reason: str | None


def _scan_segment(data: bytes, *, path: Path, last: bool) -> _ScannedSegment:
    """Parse a whole segment up to the first damage. Only the last segment may have any: every
    other one was synced whole before the next was created."""
    records: list[tuple[int, _Record]] = []
    offset = 0
    while offset < len(data):
        parsed = _parse_record_at(data, offset)
        if isinstance(parsed, str):
            if last:
                # An all-zero rest is the preallocated tail (or a write of which nothing
                # reached the disk: the same bytes, and nothing to cut either way).
                rest_is_zeros = data.count(0, offset) == len(data) - offset
                return _ScannedSegment(
                    records=tuple(records),
                    valid_bytes=offset,
                    torn_reason=None if rest_is_zeros else parsed,
                )
            raise CorruptLogError(f"{parsed} (not the last segment)", path=path, offset=offset)
        rtype, payload, end = parsed
        try:
            if rtype == _RecordType.BATCH:
                records.extend((offset, record) for record in _decode_batch(payload))
            else:
                records.append((offset, _decode_record(rtype, payload)))
        except (ValueError, msgpack.UnpackException) as exc:
            # The checksum matched, so these are the bytes we wrote: a format bug, not a crash.
            raise CorruptLogError(
                f"undecodable {rtype.name} record: {exc}", path=path, offset=offset
            ) from exc
        offset = end
    return _ScannedSegment(records=tuple(records), valid_bytes=len(data), torn_reason=None)


class _ReplayLog:
    """The log as replay rebuilds it. `base` is the index just before the first entry."""

    __slots__ = ("base", "entries", "reset_index")

    def __init__(self) -> None:
        self.base: int | None = None
        self.entries: list[Entry] = []
        self.reset_index = 0  # index of the last RESET record replayed (0: none)

    def put(self, entry: Entry, *, path: Path, offset: int) -> None:
        if self.base is None or entry.index <= self.base:
            # Either the first entry we see (older segments were compacted away) or an overwrite
            # reaching below what we have seen: everything at >= index is replaced either way.
            self.base = entry.index - 1
            self.entries = [entry]
            return
        position = entry.index - self.base - 1
        if position > len(self.entries):
            last = self.base + len(self.entries)
            raise CorruptLogError(
                f"entry {entry.index} follows entry {last}: a gap", path=path, offset=offset
            )
        del self.entries[position:]
        self.entries.append(entry)

    def reset(self, index: int) -> None:
        self.base = index
        self.entries = []
        self.reset_index = index


# ============================================================================================
# Snapshot files
# ============================================================================================

_SNAPSHOT_HEADER: Final = struct.Struct("<8sIQ")  # magic, crc32(payload), payload length
_SNAPSHOT_MAGIC: Final = b"RAFTSNP1"
# A payload's fields besides `data` fit in this many bytes (a few integers, two short lists).
_SNAPSHOT_PEEK_BYTES: Final = 64 * 1024
# Snapshot files at least this large are left in their file (a FileBytes, read with pread when
# used) rather than read: the state is not copied onto the heap when a node restarts or saves
# it (SNAPSHOTS_KEPT files are held open at most, plus one being sent or received). Smaller
# ones are read: a FileBytes holds a file descriptor. (The name predates the reads: they
# were mapped.)
SNAPSHOT_MAP_BYTES_MIN: Final = 1024 * 1024
# The buffer a large snapshot file's checksum pass reads through (`_payload_crc32`, and the
# other passes over a FileBytes in the WAL).
_SNAPSHOT_READ_CHUNK_BYTES: Final = 1024 * 1024
# Snapshot data is written in slices of this size (os.write of a view: no copy either way).
_SNAPSHOT_WRITE_SLICE_BYTES: Final = 4 * 1024 * 1024


class _BadSnapshotFile(Exception):
    """Internal: a snapshot file that fails validation; recovery falls back to an older one."""


def _snapshot_file_parts(
    snapshot: Snapshot, *, floor_seq: int, data_parts: Sequence[SnapshotData] | None = None
) -> tuple[bytes, int, bytes]:
    """The snapshot file as (header + payload prefix, where the data starts in the file, payload
    suffix): the file is `head`, then the application's bytes, then `suffix`.

    The payload is a msgpack map {index, term, tm, voters, learners, data, floor_seq}, byte for
    byte what msgpack.packb of that dict gives, but built around the application's bytes rather
    than packing them: `data` (the whole state, possibly gigabytes) is never copied, only
    checksummed and written from where it lies."""
    meta = snapshot.meta
    parts = (snapshot.data,) if data_parts is None else data_parts
    data_bytes = sum(len(p) for p in parts)
    fields = msgpack.packb(
        {
            "index": meta.index,
            "term": meta.term,
            "tm": meta.tm,
            "voters": list(meta.conf.voters),
            "learners": list(meta.conf.learners),
        },
        use_bin_type=True,
    )
    # fields starts with the fixmap header of 5 pairs; the full map has 7.
    prefix = b"\x87" + fields[1:] + msgpack.packb("data") + msgpack_bin_header(data_bytes)
    suffix = msgpack.packb("floor_seq") + msgpack.packb(floor_seq)
    crc = zlib.crc32(prefix)
    for part in parts:
        if isinstance(part, FileBytes):  # a received snapshot, still in its spool file
            for chunk in part.chunks(_SNAPSHOT_READ_CHUNK_BYTES):
                crc = zlib.crc32(chunk, crc)
        else:
            crc = zlib.crc32(part, crc)
    crc = zlib.crc32(suffix, crc)
    size = len(prefix) + data_bytes + len(suffix)
    head = _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, crc, size) + prefix
    return head, len(head), suffix


def _encode_snapshot(snapshot: Snapshot, *, floor_seq: int) -> bytes:
    """The whole snapshot file in memory (tests; the WAL writes the parts)."""
    head, _, suffix = _snapshot_file_parts(snapshot, floor_seq=floor_seq)
    return b"".join((head, snapshot_bytes(snapshot.data), suffix))


def _decode_snapshot(
    blob: bytes | FileBytes,
    *,
    expected_index: int,
    payload_crc: int | None = None,
) -> tuple[Snapshot, int]:
    """The snapshot and its floor seq; raises _BadSnapshotFile (and FileReadError, an
    OSError, when `blob` is a file range that cannot be read).

    The data is a range of `blob` if `blob` is a FileBytes (a large file: the state is never
    copied onto the heap), else a bytes copy. `payload_crc`: the payload's CRC as already
    computed from the file (`_payload_crc32`), instead of reading `blob` for it."""
    if len(blob) < _SNAPSHOT_HEADER.size:
        raise _BadSnapshotFile("shorter than its header")
    magic, crc, length = _SNAPSHOT_HEADER.unpack_from(_bytes_of(blob, 0, _SNAPSHOT_HEADER.size))
    if magic != _SNAPSHOT_MAGIC:
        raise _BadSnapshotFile("bad magic")
    payload: memoryview | FileBytes = (
        blob.slice(_SNAPSHOT_HEADER.size)
        if isinstance(blob, FileBytes)
        else memoryview(blob)[_SNAPSHOT_HEADER.size :]
    )
    if length != len(payload):
        raise _BadSnapshotFile(f"length field {length} but {len(payload)} payload bytes")
    if payload_crc is None:
        payload_crc = 0
        for chunk in (
            payload.chunks(_SNAPSHOT_READ_CHUNK_BYTES)
            if isinstance(payload, FileBytes)
            else (payload,)
        ):
            payload_crc = zlib.crc32(chunk, payload_crc)
    if payload_crc != crc:
        raise _BadSnapshotFile("checksum mismatch")
    fields, data = _split_snapshot_payload(payload)
    try:
        index, term, tm, floor_seq = (fields[k] for k in ("index", "term", "tm", "floor_seq"))
        voters, learners = fields["voters"], fields["learners"]
    except KeyError as exc:
        raise _BadSnapshotFile(f"payload lacks field {exc}") from exc
    if not (
        all(map(_is_int, (index, term, tm, floor_seq)))
        and isinstance(voters, tuple)
        and isinstance(learners, tuple)
        and all(map(_is_int, (*voters, *learners)))
    ):
        raise _BadSnapshotFile("payload fields have wrong types")
    if index != expected_index:
        raise _BadSnapshotFile(f"holds index {index} but is named for {expected_index}")
    meta = SnapshotMeta(
        index=index, term=term, tm=tm, conf=ConfState(voters=voters, learners=learners)
    )
    stored = data if isinstance(data, FileBytes) else bytes(data)
    return Snapshot(meta=meta, data=stored), floor_seq


def _bytes_of(buf: memoryview | bytes | FileBytes, start: int, stop: int) -> bytes | memoryview:
    """buf[start:stop] (clamped), read from the file if `buf` is a FileBytes."""
    return buf.read(start, stop) if isinstance(buf, FileBytes) else memoryview(buf)[start:stop]


def _split_snapshot_payload(
    payload: memoryview | FileBytes,
) -> tuple[dict[str, Any], memoryview | FileBytes]:
    """A snapshot payload's fields other than `data`, and `data` as a view (or range) into
    `payload`.

    Only the small fields are unpacked (msgpack copies every bin value it unpacks); the data's
    position comes from its bin header, whatever the order of the keys."""
    fields: dict[str, Any] = {}
    data: memoryview | FileBytes | None = None
    try:
        unpacker = msgpack.Unpacker(raw=False, use_list=False)
        unpacker.feed(_bytes_of(payload, 0, _SNAPSHOT_PEEK_BYTES))
        pairs = unpacker.read_map_header()
        base = 0  # offset in payload of the unpacker's first fed byte
        for _ in range(pairs):
            key = unpacker.unpack()
            if key != "data":
                fields[key] = unpacker.unpack()
                continue
            if data is not None:
                raise _BadSnapshotFile("two data fields")
            start = base + unpacker.tell()
            size, header = _bin_header_at(payload, start)
            data = (
                payload.slice(start + header, start + header + size)
                if isinstance(payload, FileBytes)
                else payload[start + header : start + header + size]
            )
            if len(data) != size:
                raise _BadSnapshotFile("data runs past the end of the payload")
            # Go on after the data with a fresh unpacker: the data itself is never fed.
            base = start + header + size
            unpacker = msgpack.Unpacker(raw=False, use_list=False)
            unpacker.feed(_bytes_of(payload, base, base + _SNAPSHOT_PEEK_BYTES))
        if base + unpacker.tell() != len(payload):
            raise _BadSnapshotFile("bytes after the payload map")
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.OutOfData) as exc:
        raise _BadSnapshotFile(f"undecodable payload: {exc!r}") from exc
    if data is None:
        raise _BadSnapshotFile("payload lacks field 'data'")
    return fields, data


def _bin_header_at(buf: memoryview | FileBytes, offset: int) -> tuple[int, int]:
    """(length, header size) of the msgpack bin value at `offset`; raises _BadSnapshotFile."""
    head = _bytes_of(buf, offset, offset + 5)
    kind = head[0] if head else -1
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}.get(kind)
    if width is None or 1 + width > len(head):
        raise _BadSnapshotFile("data is not a msgpack bin value")
    return int.from_bytes(head[1 : 1 + width], "big"), 1 + width


# ============================================================================================
# Files and names
# ============================================================================================

_SEGMENT_NAME: Final = re.compile(r"wal-([0-9a-f]{16})-([0-9a-f]{16})\.log")
_SNAPSHOT_NAME: Final = re.compile(r"snap-([0-9a-f]{16})\.snap")
_TEMP_SUFFIX: Final = ".tmp"
# A snapshot file written outside the log's thread (prepare_snapshot) before it is committed.
_PREPARED_SUFFIX: Final = ".prepared.tmp"
_LOCK_NAME: Final = "LOCK"
# Left by a start whose recovery could not sync the live segment (see `_refuse_untrusted_cache`).
SYNC_FAILED_FILE: Final = "SYNC_FAILED"
# Changes at every boot (Linux); None elsewhere, where the marker holds until removed by hand.
_BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
_FILE_MODE: Final = 0o600
_DIR_MODE: Final = 0o700
# fdatasync skips the inode timestamps but still flushes the size, which is all a log needs.
_fdatasync: Final = os.fdatasync if hasattr(os, "fdatasync") else os.fsync
_log = logging.getLogger(__name__)


def _segment_name(seq: int, first_index: int) -> str:
    return f"wal-{seq:016x}-{first_index:016x}.log"


def _snapshot_name(index: int) -> str:
    return f"snap-{index:016x}.snap"


def snapshot_file_name(index: int) -> str:
    """The name of the snapshot file at `index` in a log directory (for messages that name
    the file a tool could not use)."""
    return _snapshot_name(index)


_PAGE_BYTES: Final = 4096
_ZEROS: Final = memoryview(bytes(1024 * 1024))  # written ahead of the live segment's records


def _write_all(fd: int, data: bytes | memoryview) -> None:
    # Regular files take the whole buffer in one write; the loop only matters after a signal.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _FileOpError(OSError):
    """An OSError of one operation (`write`, `fdatasync`, ...) on one file of the log: the
    operator is told which, with the errno's name (a write's own OSError names neither)."""

    def __init__(self, operation: str, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))
        self.operation = operation


class _SyncError(_FileOpError):
    """A failed fdatasync of a file or fsync of the directory: the page cache may now hold
    bytes the disk does not."""


def _boot_id() -> str | None:
    try:
        return _BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def _os_error_text(exc: OSError) -> str:
    """`fdatasync of /data/wal/wal-...log: Input/output error (EIO)`: what failed, where and
    the errno's name (raft.oserror words the rest)."""
    if isinstance(exc, _FileOpError):
        files = ", ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{exc.operation} of {files}: {errno_text(exc)}"
    return os_error_text(exc)


# Said with every error that fails the log (`WalFailedError` from then on).
FAILED_LOG_REMEDY: Final = (
    "The log takes no more writes: a failed write or sync is never retried (after a failed "
    "fdatasync the kernel may have dropped the data it could not write, and a second one "
    "would report success), and what was written since the last good sync, never "
    "acknowledged, was cut from the live segment. Check the device (free space, "
    "permissions, the kernel log) and restart the node: it recovers what is durable and "
    "catches up from the leader."
)


def _read_snapshot_file(path: Path, *, expected_index: int) -> tuple[Snapshot, int]:
    """A snapshot file's snapshot (data left in the file, a FileBytes, if it is large) and
    floor seq; raises _BadSnapshotFile, or `_FileOpError` when the file cannot be read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > SNAPSHOT_BYTES_MAX + _SNAPSHOT_PEEK_BYTES:
            raise _BadSnapshotFile("larger than SNAPSHOT_BYTES_MAX")
        if size < SNAPSHOT_MAP_BYTES_MIN:
            return _decode_snapshot(f.read(), expected_index=expected_index)
        payload_crc = _payload_crc32(f.fileno(), path=path, size_bytes=size)
        blob = FileBytes.of_fd(f.fileno(), path, 0, size)
    try:
        return _decode_snapshot(blob, expected_index=expected_index, payload_crc=payload_crc)
    except FileReadError as exc:
        raise _FileOpError("read", path, exc) from exc


def _payload_crc32(fd: int, *, path: Path, size_bytes: int) -> int:
    """The CRC32 of a snapshot file's payload (every byte after its header), read with plain
    reads into one reused buffer (no copy of the state on the heap).

    A page the disk cannot read (EIO) is an OSError naming the file (`_FileOpError`), as
    every later read of the file is (raft.filebytes: never mapped, where it was a SIGBUS)."""
    buffer = memoryview(bytearray(min(_SNAPSHOT_READ_CHUNK_BYTES, size_bytes)))
    crc = 0
    offset = _SNAPSHOT_HEADER.size
    while offset < size_bytes:  # every pass reads at least one byte, or stops
        chunk = buffer[: min(len(buffer), size_bytes - offset)]
        try:
            read = os.preadv(fd, [chunk], offset)
        except OSError as exc:
            raise _FileOpError("read", path, exc) from exc
        if read == 0:
            break  # the file shrank: the length check then refuses it
        crc = zlib.crc32(chunk[:read], crc)
        offset += read
    return crc


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedSnapshot:
    """A snapshot file written and synced under a temporary name, not yet part of the log
    (`WriteAheadLog.prepare_snapshot`, then `commit_snapshot`)."""

    stored: Snapshot  # what the snapshot will be once committed (data in its file if large)
    floor_seq: int
    temp: Path
    final: Path
    file_bytes: int
    # The file's own fdatasync, timed where it ran (maybe another thread) and added to the
    # log's totals when the file is installed, on the thread that owns them.
    fsync_seconds: float = 0.0


@dataclass(slots=True, kw_only=True)
class _Segment:
    """Bookkeeping for one segment file (mutable: the live one grows)."""

    seq: int
    first_index: int
    path: Path
    size_bytes: int
    # Highest entry or reset index recorded in the file (None: none). A segment may be deleted
    # once this is <= the deletion bound; overwritten entries count too, which is conservative.
    max_index: int | None

    def note_index(self, index: int) -> None:
        self.max_index = index if self.max_index is None else max(self.max_index, index)


# ============================================================================================
# The log
# ============================================================================================


class WriteAheadLog:
    """The fsync'd Raft log and snapshot store of one node. Build it with `open`.

    Not thread-safe: the caller serialises every call. After an I/O error during a write the
    instance refuses further writes (`WalFailedError`); reopening recovers what is on disk.
    """

    def __init__(
        self,
        *,
        directory: Path,
        fsync: bool,
        segment_bytes_max: int,
        preallocate_bytes: int,
        lock_fd: int,
    ) -> None:
        # Private: use `open`, which also recovers the state.
        self._dir = directory
        self._fsync = fsync
        self._segment_bytes_max = segment_bytes_max
        self._preallocate_bytes = preallocate_bytes
        # The live segment's size on disk: its records (size_bytes) plus the zeros after them.
        self._file_bytes = 0
        self._lock_fd: int | None = lock_fd
        self._fd: int | None = None  # the live (last) segment, opened for appending
        self._segments: list[_Segment] = []
        self._snapshot_index = 0
        self._floor_seq = 0  # segments below this seq hold no live entries
        self._snapshot_indexes: list[int] = []  # snapshot files we may fall back to, ascending
        self._last_index = 0
        self._hard_state = _EMPTY_HARD_STATE
        self._hard_state_in_live = True  # the current hard state is recorded in the live segment
        # Commit-only hard-state records written to the live segment since its last sync.
        self._unsynced_records = 0
        # The live segment's bytes as of its last good sync: what a failure cuts it back to
        # (see `_fail`). Updated by `_sync_live` alone, the one way the live segment is synced.
        self._synced_bytes = 0
        self._failed: OSError | None = None
        self._closed = False
        self._bytes_written = 0
        self._fsyncs = 0
        self._fsync_seconds_total = 0.0
        self._fsync_bucket_counts = [0] * (len(FSYNC_SECONDS_BUCKETS) + 1)
        # Set by `read`: recovery decides the state and repairs nothing (no file written).
        self._read_only = False

    # ---------------------------------------------------------------------------- open / close

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        fsync: bool = True,
        segment_bytes_max: int = WAL_SEGMENT_BYTES_MAX,
        preallocate_bytes: int = WAL_PREALLOCATE_BYTES,
    ) -> tuple[WriteAheadLog, RecoveredState]:
        """Open (creating it, mode 0700, if missing) and recover the log in `directory`.

        A torn tail of the last segment is cut off (and logged); anything else that does not
        replay raises `CorruptLogError`. fsync=False skips every sync: only for tests/benchmarks.
        preallocate_bytes=0 writes no zeros ahead (tests that read the files' byte layout).
        """
        if segment_bytes_max <= 0:
            raise WalConfigError(f"segment_bytes_max must be positive, got {segment_bytes_max}")
        if preallocate_bytes < 0:
            raise WalConfigError(f"preallocate_bytes must be >= 0, got {preallocate_bytes}")
        directory = Path(directory)
        try:
            lock_fd = cls._create_and_lock(directory, fsync=fsync)
        except OSError as exc:
            raise WalIOError(
                f"cannot open log directory {directory}: {_os_error_text(exc)}"
            ) from exc
        wal = cls(
            directory=directory,
            fsync=fsync,
            segment_bytes_max=segment_bytes_max,
            preallocate_bytes=preallocate_bytes,
            lock_fd=lock_fd,
        )
        recovered: RecoveredState | None = None
        try:
            wal._refuse_untrusted_cache()
            recovered = wal._recover()
        except _SyncError as exc:
            raise WalIOError(
                f"cannot recover log in {directory}: {_os_error_text(exc)}"
                f"{wal._distrust_cache(exc)}"
            ) from exc
        except OSError as exc:
            raise WalIOError(f"cannot recover log in {directory}: {_os_error_text(exc)}") from exc
        finally:
            if recovered is None:
                wal.close()
        return wal, recovered

    @classmethod
    def read(cls, directory: Path) -> RecoveredState:
        """What `open` would recover from `directory`, without writing, cutting, creating or
        deleting anything there: for tools that read a stopped node's log (`metastore snapshot
        save --data-dir`). The same replay rules decide the state (a torn tail is left on disk
        but not replayed, as `open` replays it before cutting it; an install_snapshot a crash
        interrupted after its commit point recovers the same state `open` finishes it to), and
        it raises `CorruptLogError` where `open` would.

        A shared lock on LOCK is held while reading: a log `open` holds (a running node) is
        refused with `WalLockedError`, and so is an `open` while this reads. Raises
        `WalMissingError` when `directory` or its LOCK file does not exist (no log was ever
        opened there), `WalIOError` when the files cannot be read."""
        directory = Path(directory)
        try:
            lock_fd = os.open(directory / _LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise WalMissingError(
                f"{directory} holds no write-ahead log (no {_LOCK_NAME} file)"
            ) from None
        except OSError as exc:
            raise WalIOError(f"cannot open log directory {directory}: {exc}") from exc
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise WalLockedError(f"{directory} is in use by another log instance") from None
        except BaseException:
            os.close(lock_fd)
            raise
        wal = cls(
            directory=directory,
            fsync=False,
            segment_bytes_max=WAL_SEGMENT_BYTES_MAX,
            preallocate_bytes=0,
            lock_fd=lock_fd,
        )
        wal._read_only = True
        try:
            return wal._recover()
        except OSError as exc:
            raise WalIOError(f"cannot read log in {directory}: {exc}") from exc
        finally:
            wal.close()

    @staticmethod
    def _create_and_lock(directory: Path, *, fsync: bool) -> int:
        if not directory.is_dir():
            directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            os.chmod(directory, _DIR_MODE)  # mkdir's mode is filtered by the umask
            if fsync:
                # The new directory entry must survive a crash like the files inside it.
                _fsync_dir(directory.parent)
        fd = os.open(directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WalLockedError(f"{directory} is in use by another log instance") from None
        return fd

    def close(self) -> None:
        """Release the files. Idempotent. Appends already returned are durable (commit-only
        hard states are synced here); nothing else is written, so closing is equivalent to
        crashing right after the last call."""
        if self._closed:
            return
        self._closed = True
        if self._unsynced_records and self._fd is not None and self._failed is None:
            with contextlib.suppress(OSError):
                self._sync_live()
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = None
        self._lock_fd = None

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def failed(self) -> bool:
        """An I/O error left the log in doubt: it takes no more writes (`WalFailedError`).
        A snapshot file that could not be written or renamed into place does not fail it."""
        return self._failed is not None

    def stats(self) -> WalStats:
        return WalStats(
            bytes_written=self._bytes_written,
            fsyncs=self._fsyncs,
            fsync_seconds_total=self._fsync_seconds_total,
            fsync_bucket_counts=tuple(self._fsync_bucket_counts),
            segments=len(self._segments),
            last_index=self._last_index,
            unsynced_commit_records=self._unsynced_records,
        )

    # ---------------------------------------------------------------------------- append

    def append(self, entries: Sequence[Entry], hard_state: HardState | None) -> None:
        """Make `entries` (contiguous) and `hard_state` durable: one write, one fdatasync.

        Exception (see the module docstring): with no entries and a hard state whose term and
        vote equal the last one written, only the commit index moves, and the record is written
        without an fdatasync.

        An entry at index i replaces every entry at >= i. Raises LogGapError if the batch is
        not contiguous or would leave a gap, CompactedIndexError if it starts at or below the
        snapshot index. Nothing is written when a check fails.
        """
        self._check_writable()
        if not entries and hard_state is None:
            return
        parts: list[bytes] = []
        if entries:
            first = entries[0].index
            for offset, entry in enumerate(entries):
                if entry.index != first + offset:
                    raise LogGapError(
                        f"batch not contiguous: entry {entry.index} at position {offset} "
                        f"of a batch starting at {first}"
                    )
            if first <= self._snapshot_index:
                raise CompactedIndexError(
                    f"append at {first} but entries up to {self._snapshot_index} are compacted"
                )
            if first > self._last_index + 1:
                raise LogGapError(f"append at {first} after last index {self._last_index}")
            parts = _entry_records(entries, _INNER_MAGIC)
        # The hard state goes after the entries: a torn write then never leaves a commit index
        # pointing at entries that are not on disk.
        if hard_state is not None:
            parts.append(_hard_state_record(hard_state, _INNER_MAGIC))
        # One BATCH record per append (see _RecordType.BATCH): a torn write is all or nothing.
        batch = _frame(_RecordType.BATCH, b"".join(parts))
        if len(batch) > WAL_APPEND_BYTES_MAX:
            raise RecordTooLargeError(
                f"append of {len(batch)} bytes over WAL_APPEND_BYTES_MAX={WAL_APPEND_BYTES_MAX}"
            )

        # As `with self._failing_on_os_error("append")`, spelled out: this is the hot path, and
        # a generator-based context manager costs five Python calls per append.
        try:
            live = self._segments[-1]
            if live.size_bytes > 0 and live.size_bytes + len(batch) > self._segment_bytes_max:
                self._roll(first_index=entries[0].index if entries else self._last_index + 1)
                live = self._segments[-1]
            self._write_live(batch, sync=self._must_sync(entries, hard_state))
        except OSError as exc:
            raise self._fail("append", exc) from exc
        if entries:
            self._last_index = entries[-1].index
            live.note_index(self._last_index)
        if hard_state is not None:
            self._hard_state = hard_state
            self._hard_state_in_live = True

    def append_syncs(self, entries: Sequence[Entry], hard_state: HardState | None) -> bool:
        """Whether `append(entries, hard_state)` would wait for the disk: an fdatasync, or a
        segment roll (which syncs the directory). False means it is one small buffered write,
        cheap enough to make from the caller's own thread (the driver does, for a Ready that
        only moves the commit index)."""
        if self._must_sync(entries, hard_state):
            return True
        live = self._segments[-1]
        return live.size_bytes > 0 and (
            live.size_bytes + _HARD_STATE_RECORD_BYTES_MAX > self._segment_bytes_max
        )

    def _must_sync(self, entries: Sequence[Entry], hard_state: HardState | None) -> bool:
        # Term and vote only ever change in a synced write, so the last record written has the
        # last durable term and vote.
        return bool(entries) or (
            hard_state is not None
            and (hard_state.term, hard_state.vote) != (self._hard_state.term, self._hard_state.vote)
        )

    # ---------------------------------------------------------------------------- snapshots

    def compact(
        self, snapshot: Snapshot, *, data_parts: Sequence[SnapshotData] | None = None
    ) -> Snapshot:
        """Save the application's snapshot at snapshot.meta.index and drop the log it covers.
        Returns the snapshot as stored: a large one's data is left in its file, so the
        caller may keep that and drop the heap copy it passed. With `data_parts`, the data is
        their concatenation (and snapshot.data is ignored): a caller that frames the state
        need not join a second copy of it.

        The snapshot file is made durable first (temp file, fsync, rename, fsync directory);
        then snapshot files beyond SNAPSHOTS_KEPT are deleted, then every segment (oldest first)
        whose entries are all <= the oldest kept snapshot's index. Entries above the snapshot
        index stay. Raises SnapshotPositionError unless
        current snapshot index <= snapshot.meta.index <= last index.
        """
        self._check_writable()
        index = snapshot.meta.index
        if snapshot.is_empty():
            raise SnapshotPositionError("cannot compact to an empty snapshot")
        if not self._snapshot_index <= index <= self._last_index:
            raise SnapshotPositionError(
                f"compact to {index} outside [{self._snapshot_index}, {self._last_index}]"
            )
        stored = self._save_snapshot(snapshot, floor_seq=self._floor_seq, data_parts=data_parts)
        self._snapshot_index = index
        with self._failing_on_os_error("compaction"):
            self._prune_snapshots()
            self._delete_covered_segments()
        return stored

    def prepare_snapshot(
        self, snapshot: Snapshot, *, data_parts: Sequence[SnapshotData] | None = None
    ) -> PreparedSnapshot:
        """The slow half of `compact`: write and sync the snapshot file under a temporary name.
        Safe in another thread while this log is appended to (it touches only that file and
        reads nothing that appends change); the log changes only in `commit_snapshot`, which
        runs where the other calls do. Raises like `compact` for an empty snapshot."""
        self._check_writable()
        if snapshot.is_empty():
            raise SnapshotPositionError("cannot compact to an empty snapshot")
        return self._write_snapshot_file(
            snapshot,
            floor_seq=self._floor_seq,
            data_parts=data_parts,
            temp_suffix=_PREPARED_SUFFIX,
        )

    def commit_snapshot(self, prepared: PreparedSnapshot) -> Snapshot | None:
        """The quick half of `compact`: rename the prepared file into place and drop the log it
        covers. None (and the file deleted) if the log moved past it meanwhile: a snapshot
        installed from the leader, or a compaction beyond it."""
        self._check_writable()
        index = prepared.stored.meta.index
        if prepared.floor_seq != self._floor_seq or not (
            self._snapshot_index <= index <= self._last_index
        ):
            with contextlib.suppress(OSError):
                prepared.temp.unlink()
            return None
        stored = self._install_snapshot_file(prepared)
        self._snapshot_index = index
        with self._failing_on_os_error("compaction"):
            self._prune_snapshots()
            self._delete_covered_segments()
        return stored

    def install_snapshot(self, snapshot: Snapshot) -> Snapshot:
        """Replace the whole log by `snapshot` (a follower catching up from the leader).
        Returns the snapshot as stored (see `compact`).

        Afterwards, also after any crash that happens once this returns, the log is exactly the
        snapshot with no entries; a crash inside recovers either the old log or the new one.
        The hard state is kept as it is (its commit may be below the snapshot index; the core
        treats the snapshot index as committed). Raises SnapshotPositionError for an empty
        snapshot or one older than the current one.
        """
        self._check_writable()
        index = snapshot.meta.index
        if snapshot.is_empty():
            raise SnapshotPositionError("cannot install an empty snapshot")
        if index < self._snapshot_index:
            raise SnapshotPositionError(
                f"install of snapshot {index} older than current snapshot {self._snapshot_index}"
            )
        new_seq = self._segments[-1].seq + 1
        # Commit point: once this file is renamed into place, recovery ignores the entries of
        # every segment below new_seq (none of which exists yet).
        stored = self._save_snapshot(snapshot, floor_seq=new_seq)
        self._snapshot_index = index
        self._floor_seq = new_seq
        self._last_index = index
        with self._failing_on_os_error("snapshot install"):
            self._roll(first_index=index + 1)
            self._write_reset(index, snapshot.meta.term)
            self._delete_segments_below(new_seq)
            self._prune_snapshots()
        return stored

    # ---------------------------------------------------------------------------- recovery

    def _recover(self) -> RecoveredState:
        if not self._read_only:
            self._remove_temp_files()
        snapshot, floor_seq = self._load_newest_snapshot()
        segments = self._list_segments()

        log = _ReplayLog()
        hard_state = _EMPTY_HARD_STATE
        hard_state_in_last = False
        entries_or_reset_above_floor = False
        torn: tuple[int, str] | None = None  # (valid bytes, reason) of the last segment
        for position, segment in enumerate(segments):
            last = position == len(segments) - 1
            data = segment.path.read_bytes()
            scanned = _scan_segment(data, path=segment.path, last=last)
            segment.size_bytes = scanned.valid_bytes
            counts = segment.seq >= floor_seq
            for offset, record in scanned.records:
                match record:
                    case HardState():
                        hard_state = record
                        hard_state_in_last = last
                    case Entry():
                        segment.note_index(record.index)
                        if counts:
                            log.put(record, path=segment.path, offset=offset)
                            entries_or_reset_above_floor = True
                    case _Reset():
                        segment.note_index(record.index)
                        if counts:
                            log.reset(record.index)
                            entries_or_reset_above_floor = True
            if scanned.torn_reason is not None:
                log_end = 0 if log.base is None else log.base + len(log.entries)
                why, unsynced = _synced_record_after(
                    data,
                    scanned.valid_bytes + 1,
                    hard_state=hard_state,
                    last_index=max(log_end, snapshot.meta.index),
                )
                if why is not None:
                    # See "the one power loss refused as corruption" in the module docstring:
                    # neither cause can be ruled out, and neither cutting nor skipping is safe.
                    raise CorruptLogError(
                        f"{scanned.torn_reason} (valid records follow it: {why}). Either the "
                        "storage lost or damaged bytes that an fdatasync had covered, or a "
                        "power loss during that later write kept it and lost earlier bytes "
                        "holding only unsynced commit-index records; the files cannot tell "
                        "which, and in the first case cutting the log here would lose records "
                        "this node acknowledged",
                        path=segment.path,
                        offset=scanned.valid_bytes,
                    )
                why = _damaged_batch_was_synced(data, scanned.valid_bytes)
                if why is not None:
                    raise CorruptLogError(
                        f"{scanned.torn_reason} (valid records follow it: {why}; so the "
                        "damage was synced: the storage lost or damaged bytes that an "
                        "fdatasync had covered)",
                        path=segment.path,
                        offset=scanned.valid_bytes,
                    )
                reason = scanned.torn_reason
                if unsynced:
                    reason += f", followed by {unsynced} unsynced commit-only record(s)"
                torn = (scanned.valid_bytes, reason)

        snapshot_index = snapshot.meta.index
        if log.reset_index > snapshot_index:
            raise CorruptLogError(
                f"the log was reset to a snapshot at {log.reset_index} but the newest valid "
                f"snapshot is at {snapshot_index}: the installed snapshot is lost",
                path=self._dir,
            )
        entries = tuple(e for e in log.entries if e.index > snapshot_index)
        if entries and entries[0].index != snapshot_index + 1:
            raise CorruptLogError(
                f"the log starts at {entries[0].index} but the snapshot ends at {snapshot_index}",
                path=self._dir,
            )

        # Everything below only repairs or completes; the recovered state is already decided.
        if self._read_only:
            return RecoveredState(hard_state=hard_state, snapshot=snapshot, entries=entries)
        self._segments = segments
        self._snapshot_index = snapshot_index
        self._floor_seq = floor_seq
        self._last_index = entries[-1].index if entries else snapshot_index
        self._hard_state = hard_state
        self._hard_state_in_live = hard_state_in_last or hard_state == _EMPTY_HARD_STATE
        if segments:
            live = segments[-1]
            # Not O_APPEND: records are written at the file position, inside the zeros ahead.
            self._fd = os.open(live.path, os.O_WRONLY | os.O_CLOEXEC)
            self._file_bytes = os.fstat(self._fd).st_size
            if torn is not None:
                valid_bytes, reason = torn
                _log.warning(
                    "wal: cutting torn tail file=%s offset=%d bytes=%d reason=%s",
                    live.path,
                    valid_bytes,
                    self._file_bytes - valid_bytes,
                    reason,
                )
                # Cut, not overwritten: a preallocated tail holds only zeros (what replay
                # takes for the end), never what a crash left.
                os.ftruncate(self._fd, valid_bytes)
                self._file_bytes = valid_bytes
            os.lseek(self._fd, live.size_bytes, os.SEEK_SET)
            if live.size_bytes or torn is not None:
                # A crashed predecessor's unsynced commit-only records may still be only in the
                # page cache: sync them before any other segment can follow this one (where a
                # tear would be corruption) and before this process relies on them.
                self._sync_live()
        else:
            self._create_segment(seq=max(1, floor_seq), first_index=self._last_index + 1)
        if floor_seq > 0 and not entries_or_reset_above_floor:
            # A crash interrupted install_snapshot after its commit point: finish it.
            live_seq = self._segments[-1].seq
            if live_seq < floor_seq:
                self._create_segment(
                    seq=max(floor_seq, live_seq + 1), first_index=snapshot_index + 1
                )
            self._write_reset(snapshot_index, snapshot.meta.term)
        self._delete_segments_below(floor_seq)
        return RecoveredState(hard_state=hard_state, snapshot=snapshot, entries=entries)

    def _distrust_cache(self, exc: OSError) -> str:
        """After a failed sync in recovery (or a failed sync whose cut failed too, `_fail`):
        leave `SYNC_FAILED` naming this boot, so that no later start of this boot trusts the
        page cache (returns what to add to the message).

        Fsyncgate at restart: recovery read the files through the page cache, which may hold
        bytes a crashed predecessor wrote but never synced (an append that never returned, and
        that would be acknowledged once recovered). The failed sync says some of them did not
        reach the disk, and the kernel may have marked them clean all the same; it reports the
        error once, so the next start's sync would succeed and it would read them back as
        durable. Which bytes are lost cannot be told (the durable prefix is not recorded), so
        none can be cut without risking acknowledged ones. After a reboot the page cache is
        gone and reads return what the disk holds (a torn tail there is cut as usual), so the
        marker names the boot it holds for. It needs no sync: it only has to outlive
        processes, not the boot. If it cannot be written, the message says so."""
        marker = self._dir / SYNC_FAILED_FILE
        try:
            marker.write_text(f"{_boot_id() or ''}\n{_os_error_text(exc)}\n")
        except OSError as marker_exc:
            return (
                f" (and writing {marker} failed too: {_os_error_text(marker_exc)}; do not "
                "start this node again before rebooting the machine)"
            )
        return f". {self._untrusted_cache_remedy(marker)}"

    @staticmethod
    def _untrusted_cache_remedy(marker: Path) -> str:
        return (
            "The page cache may hold log bytes the disk lost, so the log is not opened again "
            f"until the machine is rebooted ({marker} says since when); check the device (the "
            "kernel log), reboot, and start the node: it recovers what the disk holds and "
            f"catches up from the leader. Without /proc boot ids, remove {marker} after the "
            "reboot"
        )

    def _refuse_untrusted_cache(self) -> None:
        """Refuse to recover while a failed recovery sync of this boot stands (see
        `_distrust_cache`); forget one left before a reboot."""
        marker = self._dir / SYNC_FAILED_FILE
        try:
            text = marker.read_text()
        except FileNotFoundError:
            return
        marker_boot_id, _, failure = text.partition("\n")
        boot_id = _boot_id()
        if boot_id is not None and marker_boot_id and marker_boot_id != boot_id:
            _log.info("wal: removing %s left before a reboot: %s", marker, failure.strip())
            marker.unlink()
            return
        raise WalIOError(
            f"an earlier start failed to sync the log in {self._dir} ({failure.strip()}). "
            f"{self._untrusted_cache_remedy(marker)}"
        )

    def _remove_temp_files(self) -> None:
        for path in self._dir.glob(f"snap-*.snap*{_TEMP_SUFFIX}"):
            _log.info("wal: removing unfinished snapshot file=%s", path)
            path.unlink()

    def _snapshot_files(self) -> list[tuple[int, Path]]:
        """All snapshot files by name, newest (highest index) first."""
        found = []
        for path in self._dir.iterdir():
            match = _SNAPSHOT_NAME.fullmatch(path.name)
            if match:
                found.append((int(match[1], 16), path))
        return sorted(found, reverse=True)

    def _load_newest_snapshot(self) -> tuple[Snapshot, int]:
        """The newest snapshot that validates (and its floor seq); skipped files are logged.

        Older files are not read here; they count as fallbacks (a conservative choice for the
        deletion bound) and are validated only if they are ever needed.
        """
        chosen: tuple[Snapshot, int] | None = None
        fallbacks: list[int] = []
        for index, path in self._snapshot_files():
            if chosen is not None:
                fallbacks.append(index)
                continue
            try:
                chosen = _read_snapshot_file(path, expected_index=index)
                fallbacks.append(index)
            except _BadSnapshotFile as exc:
                _log.warning("wal: skipping invalid snapshot file=%s reason=%s", path, exc)
        self._snapshot_indexes = sorted(fallbacks)
        return chosen if chosen is not None else (Snapshot(), 0)

    def _list_segments(self) -> list[_Segment]:
        segments = []
        for path in self._dir.iterdir():
            match = _SEGMENT_NAME.fullmatch(path.name)
            if match:
                seq, first_index = int(match[1], 16), int(match[2], 16)
                segments.append(
                    _Segment(
                        seq=seq, first_index=first_index, path=path, size_bytes=0, max_index=None
                    )
                )
        segments.sort(key=lambda s: s.seq)
        for before, after in itertools.pairwise(segments):
            if after.seq != before.seq + 1:
                # Deletion only ever removes a prefix, so a hole means files were lost.
                raise CorruptLogError(
                    f"segment seq {after.seq} follows {before.seq}: a segment is missing",
                    path=after.path,
                )
        return segments

    # ---------------------------------------------------------------------------- internals

    def _check_writable(self) -> None:
        if self._closed:
            raise WalClosedError("the write-ahead log is closed")
        if self._failed is not None:
            raise WalFailedError(
                f"an earlier I/O error ({_os_error_text(self._failed)}) left the log in an "
                "unknown state; restart the node (reopen the log)"
            ) from self._failed

    @contextlib.contextmanager
    def _failing_on_os_error(self, what: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise self._fail(what, exc) from exc

    def _fail(self, what: str, exc: OSError) -> WalIOError:
        """Fail the log after an I/O error in a write (the error to raise is returned).

        Fsyncgate: after a failed fdatasync (or a write that failed part way) the kernel may
        have dropped the pages it could not write, marking them clean, or kept them in the
        page cache without their being on the disk. A second fdatasync would succeed and prove
        nothing, so no write or sync is tried again (`WalFailedError`). And what the live
        segment holds past its last good sync is cut: a restarted process reads the page
        cache, and would otherwise take back those bytes (whole, valid records) for durable
        ones and acknowledge them to the leader, to lose them at the next power loss. They
        are only the failed append and commit-only records, none ever acknowledged (the
        commit index is volatile: losing it is what a power loss may do too). If the cut
        fails as well, no later start of this boot trusts the page cache (`_distrust_cache`),
        and the message says so."""
        self._failed = exc
        cut = ""
        remedy = f". {FAILED_LOG_REMEDY}"
        if self._fd is not None and self._segments:
            live = self._segments[-1]
            try:
                os.ftruncate(self._fd, self._synced_bytes)
            except OSError as cut_exc:
                cut = (
                    f" (cutting {live.path} back to its {self._synced_bytes} synced bytes "
                    f"failed too: {_os_error_text(cut_exc)})"
                )
                # The unsynced bytes stay in the page cache: a restart would read them back.
                remedy = self._distrust_cache(exc)
            else:
                live.size_bytes = self._file_bytes = self._synced_bytes
        return WalIOError(f"{what} failed in {self._dir}: {_os_error_text(exc)}{cut}{remedy}")

    def _sync_live(self) -> None:
        """Sync the live segment: every byte written to it so far is durable."""
        assert self._fd is not None
        live = self._segments[-1]
        self._sync(self._fd, live.path)
        self._synced_bytes = live.size_bytes
        self._unsynced_records = 0

    def _sync(self, fd: int, path: Path) -> None:
        if not self._fsync:
            return
        started = time.perf_counter()
        try:
            _fdatasync(fd)
        except OSError as exc:
            raise _SyncError("fdatasync", path, exc) from exc
        self._note_fsync(time.perf_counter() - started)

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        started = time.perf_counter()
        try:
            _fsync_dir(self._dir)
        except OSError as exc:
            raise _SyncError("fsync of the directory", self._dir, exc) from exc
        self._note_fsync(time.perf_counter() - started)

    def _note_fsync(self, seconds: float) -> None:
        # One bisect per sync (well under a microsecond, next to the sync's own milliseconds).
        self._fsync_seconds_total += seconds
        self._fsyncs += 1
        self._fsync_bucket_counts[bisect_left(FSYNC_SECONDS_BUCKETS, seconds)] += 1

    def _write_live(self, data: bytes, *, sync: bool = True) -> None:
        if self._fd is None:
            raise WalClosedError("the write-ahead log is closed")
        live = self._segments[-1]
        end = live.size_bytes + len(data)
        if end > self._file_bytes and self._preallocate_bytes:
            self._write_zeros_ahead(end + self._preallocate_bytes)
        try:
            _write_all(self._fd, data)  # at the file position: the end of the records
        except OSError as exc:
            raise _FileOpError("write", live.path, exc) from exc
        self._bytes_written += len(data)
        live.size_bytes = end
        if end > self._file_bytes:
            self._file_bytes = end
        if sync:
            self._sync_live()  # also makes earlier unsynced records durable
        else:
            self._unsynced_records += 1

    def _write_zeros_ahead(self, up_to: int) -> None:
        """Extend the live segment with zeros to `up_to` bytes (rounded up to a page). Written
        at their offset, not at the file position, and synced with the next synced write."""
        assert self._fd is not None
        up_to = -(-up_to // _PAGE_BYTES) * _PAGE_BYTES
        offset = self._file_bytes
        try:
            while offset < up_to:
                offset += os.pwrite(self._fd, _ZEROS[: min(len(_ZEROS), up_to - offset)], offset)
        except OSError as exc:
            raise _FileOpError("write of zeros ahead", self._segments[-1].path, exc) from exc
        self._file_bytes = offset

    def _create_segment(self, *, seq: int, first_index: int) -> None:
        if self._fd is not None:
            live = self._segments[-1]
            if self._file_bytes > live.size_bytes:
                # Only the last segment may end in zeros (replay reads them as its end, and
                # any other damage there as a torn tail): cut this one to its records, and
                # make the cut durable before the next segment exists.
                try:
                    os.ftruncate(self._fd, live.size_bytes)
                except OSError as exc:
                    raise _FileOpError("truncate", live.path, exc) from exc
                self._file_bytes = live.size_bytes
                self._sync_live()
            elif self._unsynced_records:
                # The segment being closed holds commit-only records not yet synced; the next
                # fdatasync goes to the new file, so sync this one now.
                self._sync_live()
        path = self._dir / _segment_name(seq, first_index)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        fd = os.open(path, flags, _FILE_MODE)
        previous, self._fd = self._fd, fd
        self._file_bytes = self._synced_bytes = 0
        self._segments.append(
            _Segment(seq=seq, first_index=first_index, path=path, size_bytes=0, max_index=None)
        )
        if previous is not None:
            os.close(previous)  # every write to it was already synced
        # The file must exist after a crash before anything acknowledged is written into it.
        self._sync_dir()
        self._hard_state_in_live = self._hard_state == _EMPTY_HARD_STATE

    def _roll(self, *, first_index: int) -> None:
        self._create_segment(seq=self._segments[-1].seq + 1, first_index=first_index)

    def _write_reset(self, index: int, term: int) -> None:
        """RESET plus the current hard state into the live segment, in one synced write."""
        record = _reset_record(index, term)
        if self._hard_state != _EMPTY_HARD_STATE:
            record += _hard_state_record(self._hard_state)
        self._write_live(record)
        self._segments[-1].note_index(index)
        self._hard_state_in_live = True

    def _save_snapshot(
        self,
        snapshot: Snapshot,
        *,
        floor_seq: int,
        data_parts: Sequence[SnapshotData] | None = None,
    ) -> Snapshot:
        """Crash-safe: temp file, fsync, rename, fsync the directory. Returns the snapshot as
        stored: its data left in the new file if it is large (so the caller can drop its
        heap copy), else `snapshot` itself.

        Failing before the rename leaves the log untouched and usable; failing after it (the
        directory sync) leaves the instance failed, as we no longer know what is durable.
        """
        prepared = self._write_snapshot_file(
            snapshot, floor_seq=floor_seq, data_parts=data_parts, temp_suffix=_TEMP_SUFFIX
        )
        return self._install_snapshot_file(prepared)

    def _write_snapshot_file(
        self,
        snapshot: Snapshot,
        *,
        floor_seq: int,
        data_parts: Sequence[SnapshotData] | None,
        temp_suffix: str,
    ) -> PreparedSnapshot:
        """The snapshot file, written and synced under a temporary name. Touches nothing but
        that file (and no counter): `prepare_snapshot` runs it outside the log's thread."""
        parts = (snapshot.data,) if data_parts is None else tuple(data_parts)
        data_bytes = sum(len(p) for p in parts)
        if data_bytes > SNAPSHOT_BYTES_MAX:
            raise RecordTooLargeError(
                f"snapshot data of {data_bytes} bytes is over SNAPSHOT_BYTES_MAX"
            )
        head, data_offset, suffix = _snapshot_file_parts(
            snapshot, floor_seq=floor_seq, data_parts=parts
        )
        final = self._dir / _snapshot_name(snapshot.meta.index)
        temp = final.with_name(final.name + temp_suffix)
        stored = snapshot
        fsync_seconds = 0.0
        doing = "create"  # for the message: which step failed
        try:
            fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
            try:
                doing = "write"
                _write_all(fd, head)
                for part in parts:
                    if isinstance(part, FileBytes):  # a received snapshot, in its spool file
                        for chunk in part.chunks(_SNAPSHOT_WRITE_SLICE_BYTES):
                            _write_all(fd, chunk)  # a failed read is a FileReadError
                        continue
                    with memoryview(part) as view:
                        for start in range(0, len(view), _SNAPSHOT_WRITE_SLICE_BYTES):
                            _write_all(fd, view[start : start + _SNAPSHOT_WRITE_SLICE_BYTES])
                _write_all(fd, suffix)
                if self._fsync:
                    doing = "fdatasync"
                    started = time.perf_counter()
                    _fdatasync(fd)
                    fsync_seconds = time.perf_counter() - started
                doing = "dup"
                if data_bytes >= SNAPSHOT_MAP_BYTES_MIN:
                    # The state stays in the file (read with pread when sent or restored);
                    # the descriptor survives the rename into place.
                    data = FileBytes.of_fd(fd, final, data_offset, data_bytes)
                    stored = Snapshot(meta=snapshot.meta, data=data)
                elif data_parts is not None or isinstance(snapshot.data, FileBytes):
                    stored = Snapshot(
                        meta=snapshot.meta, data=b"".join(snapshot_bytes(p) for p in parts)
                    )
            finally:
                os.close(fd)
        except OSError as exc:
            # The log is untouched (the file was never renamed into place) and stays usable:
            # the old snapshot and the entries after it remain. A later attempt writes a
            # new file, so a failed fdatasync here is not one retried on the same pages.
            with contextlib.suppress(OSError):
                temp.unlink()
            # A received snapshot's spool file that cannot be read names itself.
            failed = str(exc) if isinstance(exc, FileReadError) else None
            raise WalIOError(
                f"cannot save snapshot {final}: "
                f"{failed or _os_error_text(_FileOpError(doing, temp, exc))} (the temporary "
                "file was deleted; the log and its older snapshot are unchanged)"
            ) from exc
        return PreparedSnapshot(
            stored=stored,
            floor_seq=floor_seq,
            temp=temp,
            final=final,
            file_bytes=len(head) + data_bytes + len(suffix),
            fsync_seconds=fsync_seconds,
        )

    def _install_snapshot_file(self, prepared: PreparedSnapshot) -> Snapshot:
        """Rename a written snapshot file into place and sync the directory."""
        try:
            os.replace(prepared.temp, prepared.final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                prepared.temp.unlink()
            raise WalIOError(
                f"cannot save snapshot {prepared.final}: "
                f"{_os_error_text(_FileOpError('rename', prepared.temp, exc))} (the temporary "
                "file was deleted; the log and its older snapshot are unchanged)"
            ) from exc
        self._bytes_written += prepared.file_bytes
        if self._fsync:  # the file's own fdatasync
            self._note_fsync(prepared.fsync_seconds)
        with self._failing_on_os_error("snapshot directory sync"):
            self._sync_dir()
        index = prepared.stored.meta.index
        if index not in self._snapshot_indexes:
            self._snapshot_indexes.append(index)
            self._snapshot_indexes.sort()
        return prepared.stored

    def _prune_snapshots(self) -> None:
        """Keep the newest SNAPSHOTS_KEPT fallback-worthy snapshots; delete every file below.

        Files that failed validation and are newer than the kept ones stay (they are evidence,
        and recovery skips them); they go once they fall below the kept range.
        """
        kept = self._snapshot_indexes[-SNAPSHOTS_KEPT:]
        oldest_kept = kept[0]
        deleted = False
        for index, path in self._snapshot_files():
            if index < oldest_kept:
                path.unlink()
                deleted = True
        self._snapshot_indexes = kept
        if deleted:
            self._sync_dir()

    def _delete_covered_segments(self) -> None:
        """Delete, oldest first, segments whose entries are all <= the oldest kept snapshot."""
        bound = self._snapshot_indexes[0]
        live = self._segments[-1]
        if live.max_index is not None and live.max_index <= bound:
            # Roll so the live segment becomes an old one that can go.
            self._roll(first_index=self._last_index + 1)
        count = 0
        for segment in self._segments[:-1]:
            if segment.max_index is not None and segment.max_index > bound:
                break
            count += 1
        if count:
            _log.info("wal: compacting segments=%d bound_index=%d", count, bound)
        self._delete_oldest_segments(count)

    def _delete_segments_below(self, seq: int) -> None:
        """Delete every segment below `seq` (the live one never is)."""
        self._delete_oldest_segments(sum(1 for s in self._segments[:-1] if s.seq < seq))

    def _delete_oldest_segments(self, count: int) -> None:
        """Delete the `count` oldest segments, oldest first, so the rest is always a suffix."""
        if count == 0:
            return
        if not self._hard_state_in_live:
            # The hard state may live only in the segments about to go: record it first.
            self._write_live(_hard_state_record(self._hard_state))
            self._hard_state_in_live = True
        elif self._unsynced_records and self._fd is not None:
            # The live segment's newest hard-state record may be an unsynced commit-only one;
            # the records about to go may be the only durable copies of term and vote.
            self._sync_live()
        for _ in range(count):
            self._segments.pop(0).path.unlink()
        self._sync_dir()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
