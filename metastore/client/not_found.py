"""A TABLE_NOT_FOUND at a time before the table was created, made to say when it was created.

A node's answer about a time T depends only on the log up to T (metastore.catalog,
`_incarnation_at`), so its TABLE_NOT_FOUND cannot name a creation after T. A reader who asks
AS OF -1h right after a CREATE TABLE (the README's examples do) then reads "does not exist at
<an hour ago>" and looks for a typo. On that error path only, the client asks `describe` now
and, if the table was created after T, says when: the CLI (`--as-of`), `bridge.read_table` and
`format("metastore")` (`as_of`) alike. One extra request, on the error path; any failure of it
leaves the original error as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlc import to_iso
from metastore.errors import ErrorCode, MetastoreError, TableNotFoundError

if TYPE_CHECKING:
    from metastore.client.protocol import SyncMetastoreClient


def created_tu_now(client: SyncMetastoreClient, table: str) -> int | None:
    """When `table`, as it exists now, was created; None if it does not exist now (or that
    cannot be read: the caller then keeps its original error)."""
    try:
        created_tu = client.describe(table).get("created_tu")
    except MetastoreError:
        return None
    return created_tu if isinstance(created_tu, int) and not isinstance(created_tu, bool) else None


def created_after(
    exc: MetastoreError, ts: int, created_tu: int | None, *, option: str
) -> MetastoreError:
    """`exc`, or, when it is a TABLE_NOT_FOUND at `ts` of a table created after `ts` (at
    `created_tu`, from `created_tu_now`), a TableNotFoundError saying when it was created and
    to ask `option` for a later time. Pure."""
    if exc.code is not ErrorCode.TABLE_NOT_FOUND or created_tu is None or created_tu <= ts:
        return exc
    return TableNotFoundError(
        f"{exc.message}; it was created at {to_iso(created_tu)} (ask for a later {option})",
        details=exc.details,  # the CLI prints details it does not know: the message says it
    )
