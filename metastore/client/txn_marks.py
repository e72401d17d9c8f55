"""Txn-id marks: a commit under a txn id the caller chose commits once however old it is.

The txn log remembers only the newest MAX_REMEMBERED_TXNS commits' txn ids (metastore.txn,
"Idempotency"). A job re-run under its stable txn id (`bridge.batch(txn_id=...)`, the data
source's `txn_id` option, `client.commit(..., mark_txn_id=True)`) writes its output again into a
fresh attempt directory, so its files differ; past that window the id alone no longer refused
it, and it committed a second time. Stream marks (metastore.txn, "Stream marks") are kept per
stream however old, bounded by MAX_STREAM_MARKS distinct streams instead. So such a commit also
carries a stream position of the id's own:

    stream = "@txn-id:" + txn_id              (ids up to 248 characters: the stream field holds
             "@txn-id-sha256:" + sha256(txn_id)  MAX_TXN_ID_CHARS = 256; longer ids by hash)
    seq    = a 63-bit hash of the sorted canonical names of the tables the commit writes

A re-run is then refused by the mark (BATCH_ALREADY_COMMITTED) when its seq is at or below the
mark's, and the caller tells from the mark what it is (`mark_verdict`): the mark names this txn
id and this seq (the same table set) -> already committed (deduplicated, at the mark's ts);
another seq -> the id was reused for a write of other tables: a typed TxnIdReused, never a
silent "done" (which would drop this write's data). The mark keeps no table names, only this
hash of them, hence the seq. Since a re-run of other tables whose hash is above the mark's
would not be refused, callers look the mark up first (`committed_txn(txn_id, stream=...)`) and
commit only when none is found; the mark check at commit then only has to cover a concurrent
run of the same id (one of other tables that commits between the lookup and the commit is
still in the txn-id window then: TxnIdReused by the record).

No apply change: commits with stream positions and their marks exist since before apply
versions (every release that can join a cluster keeps and checks them). Bridge-made ids (a
uuid per batch) carry no mark, so the marks are not filled by every batch; only ids a caller
chose, which can be retried later. The `@txn-id` prefix is reserved: the bridge and the client
refuse a caller's stream of that prefix, so no streaming query's mark is taken for an id's.

What it costs and bounds: one mark per caller txn id, remembered until MAX_STREAM_MARKS other
streams or ids committed since (least recently committed forgotten first), not
MAX_REMEMBERED_TXNS commits. Streaming queries' marks share that bound: a query idle while
MAX_STREAM_MARKS other streams and ids commit loses its mark (a job with a fresh id per run
adds one per run). One more linearizable lookup per commit under a caller's id. A txn id
first committed by a client without marks (an earlier release) is protected by the window
only, as before; so is a re-run by such a client.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Final

from metastore.errors import BatchAlreadyCommittedError, MetastoreError, TxnIdReusedError
from metastore.limits import MAX_TXN_ID_CHARS

RESERVED_STREAM_PREFIX: Final = "@txn-id"
TXN_MARK_PREFIX: Final = RESERVED_STREAM_PREFIX + ":"
TXN_MARK_HASHED_PREFIX: Final = RESERVED_STREAM_PREFIX + "-sha256:"
_SEQ_BITS: Final = 63  # a stream position is an integer in 0..2^63-1


def is_reserved_stream(stream: str) -> bool:
    """Whether `stream` is in the txn-id marks' key space (refused as a caller's stream)."""
    return stream.startswith(RESERVED_STREAM_PREFIX)


def txn_mark_stream(txn_id: str) -> str:
    """The stream key of `txn_id`'s mark: readable while it fits the stream field, else a hash
    (the two prefixes differ in their 8th character, so the forms never meet)."""
    if len(TXN_MARK_PREFIX) + len(txn_id) <= MAX_TXN_ID_CHARS:
        return TXN_MARK_PREFIX + txn_id
    return (
        TXN_MARK_HASHED_PREFIX + hashlib.sha256(txn_id.encode("utf-8", "surrogatepass")).hexdigest()
    )


def canonical_table(name: str) -> str:
    """`name` as the metastore records it (case-folded as the catalog folds names)."""
    # Here, not at import: the client's import path holds only the shared limits and errors.
    from metastore.commands import TableName

    try:
        return str(TableName.parse(name))
    except MetastoreError:
        return name.lower()


def tables_seq(tables: Iterable[str]) -> int:
    """The mark's position for a commit writing `tables`: equal exactly for equal table sets
    (barring a 63-bit hash collision), whatever their order or spelling."""
    names = sorted({canonical_table(t) for t in tables})
    digest = hashlib.sha256("\n".join(names).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - _SEQ_BITS)


def txn_mark(txn_id: str, tables: Iterable[str]) -> tuple[str, int]:
    """The stream position (stream, seq) a commit of `tables` under `txn_id` carries."""
    return txn_mark_stream(txn_id), tables_seq(tables)


def refused_mark(exc: BatchAlreadyCommittedError) -> dict[str, Any]:
    """The mark a BATCH_ALREADY_COMMITTED refusal reports, in `committed_txn`'s form."""
    d = exc.details
    return {
        "stream": d.get("stream"),
        "seq": d.get("committed_seq"),
        "ts": d.get("committed_ts"),
        "txn_id": d.get("committed_txn_id"),
    }


def mark_verdict(mark: object, *, txn_id: str, seq: int) -> int | None:
    """What the mark of `txn_id`'s stream says about a commit of it at `seq` (a table set):
    None when there is no mark; its commit ts when it is this id's commit of this table set
    (already committed); else TxnIdReusedError (details: txn_id, committed_ts, reason
    `other_tables`), since reporting that commit as this one would drop this one's data."""
    if not isinstance(mark, Mapping):
        return None
    committed_ts = mark.get("ts")
    if not isinstance(committed_ts, int) or isinstance(committed_ts, bool):
        return None  # a malformed reply: nothing to go by, the commit's own checks decide
    if mark.get("txn_id") == txn_id and mark.get("seq") == seq:
        return committed_ts
    raise TxnIdReusedError(
        f"txn {txn_id!r} already committed (at ts {committed_ts}) a write of other tables "
        "than this one, which is older than the txn ids the metastore remembers one by one; "
        "a txn id names one write: run this one under a fresh txn id (nothing of it committed)",
        details={
            "txn_id": txn_id,
            "committed_ts": committed_ts,
            "committed_txn_id": mark.get("txn_id"),
            "reason": "other_tables",
        },
    )
