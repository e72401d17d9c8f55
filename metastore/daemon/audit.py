"""The audit log: who changed what, through this node, and who was refused.

One JSON object per line in `audit.log` in the node's data directory, separate from the
operational log and never sent to stderr. A record is written for every request of an op that
needs the writer or admin role (whatever its outcome: ok, refused, failed, or CANCELLED: its
client closed the connection before the answer, and the change may have happened all the same;
`remove_node` and `gc_run`, which run to their end then, are recorded once they end, with the
outcome they reached), for every refused first request (a wrong or missing token, no `hello`
first, plaintext on a TLS port, a missing or revoked client certificate) and for every request
refused for its role. Reads are not audited (they change nothing and would drown the rest).

Fields: `ts` (wall clock, ISO-8601 UTC), `node_id`, `peer` (address:port), `client` (the name
the client gave: anything it likes), `role`, `token_name` (the name in tokens.json of the token
it authenticated with, null before it did: who the node knows it to be), `op`, `outcome` (OK
or the error code), `ms`, and the request's identifying arguments (`sql` truncated to
AUDIT_TEXT_CHARS_MAX, table names, txn id, record id, job id, session ids, node ids, a revoked
certificate's fingerprint). Tokens and data file lists are never written: a write's files are
summarised as a count per table.

Rotation keeps AUDIT_FILES_KEPT files of AUDIT_FILE_BYTES_MAX each. So that a flood of refusals
(strangers need no token to be refused) cannot rotate the records of real changes away,
refusals (a refused first request, FORBIDDEN) are recorded at most AUDIT_REFUSALS_BURST at once
and AUDIT_REFUSALS_PER_S after that; those left out are counted in a `refusals_not_recorded`
record (`count`, `since`) written before the next record, or at close. Every other record is
written. The server's warnings about refused first requests (node.log) share that budget.
A request is forwarded to the leader with the caller's own token, so it is audited on the node
that received it and again (as `_propose`) on the leader.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from metastore.daemon.logs import QuietFileHandler
from raft.wire import brief_repr

AUDIT_FILE_NAME: Final = "audit.log"
AUDIT_FILE_BYTES_MAX: Final = 64 * 1024 * 1024
AUDIT_FILES_KEPT: Final = 5
AUDIT_TEXT_CHARS_MAX: Final = 1024
# Refusals (a refused first request, FORBIDDEN) recorded at once, then per second: a flood of
# them must not rotate the records of real changes out of the AUDIT_FILES_KEPT files.
AUDIT_REFUSALS_BURST: Final = 100
AUDIT_REFUSALS_PER_S: Final = 10
# Arguments copied as they are (short identifiers); everything else is left out.
_KEPT_ARGS: Final = (
    "table",
    "namespace",
    "txn_id",
    "stream",
    "seq",
    "record_id",
    "job_id",
    "session_id",
    "session_ids",
    "node_id",
    "target",
    "raft_address",
    "learner",
    "dry_run",
    "request_id",
    "fingerprint",
    "force",
    "version",
)


class AuditLog:
    """Writes audit records to `<data_dir>/audit.log` (or nowhere, for `AuditLog(None)`)."""

    def __init__(self, data_dir: Path | None, *, node_id: int) -> None:
        self.node_id = node_id
        self._logger: logging.Logger | None = None
        # Token bucket of refusal records (see AUDIT_REFUSALS_BURST), and the refusals left out
        # since the last record: counted in a `refusals_not_recorded` record before the next.
        self._refusal_tokens = float(AUDIT_REFUSALS_BURST)
        self._refusals_refilled_at = time.monotonic()
        self._not_recorded = 0
        self._not_recorded_since = ""
        if data_dir is None:
            return
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Quiet: on a full disk each record would otherwise print a traceback to stderr.
        handler = QuietFileHandler(
            data_dir / AUDIT_FILE_NAME,
            maxBytes=AUDIT_FILE_BYTES_MAX,
            backupCount=AUDIT_FILES_KEPT,
            encoding="utf-8",
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger(f"metastore.audit.{node_id}.{id(self)}")
        logger.handlers[:] = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False  # never mixed into the operational log or stderr
        self._logger = logger

    def record(
        self,
        *,
        peer: str,
        client: str,
        role: str | None,
        token_name: str | None,
        op: str,
        args: Mapping[str, Any],
        outcome: str,
        ms: float,
    ) -> bool:
        """Write the record; False if it was a refusal left out (over the budget), which the
        caller's own warning about it should be too."""
        now = _now_text()
        if (role is None or outcome == "FORBIDDEN") and not self._take_refusal_token():
            if not self._not_recorded:
                self._not_recorded_since = now
            self._not_recorded += 1
            return False
        if self._logger is None:
            return True
        self._write_not_recorded()
        entry: dict[str, Any] = {
            "ts": now,
            "node_id": self.node_id,
            "peer": peer,
            "client": client,
            "role": role,
            "token_name": token_name,
            "op": op,
            "outcome": outcome,
            "ms": round(ms, 3),
        }
        entry.update(summarize_args(args))
        self._logger.info(json.dumps(entry, default=str, sort_keys=True))
        return True

    def _take_refusal_token(self) -> bool:
        now = time.monotonic()
        elapsed_s = max(0.0, now - self._refusals_refilled_at)
        self._refusals_refilled_at = now
        self._refusal_tokens = min(
            float(AUDIT_REFUSALS_BURST), self._refusal_tokens + elapsed_s * AUDIT_REFUSALS_PER_S
        )
        if self._refusal_tokens < 1:
            return False
        self._refusal_tokens -= 1
        return True

    def _write_not_recorded(self) -> None:
        if not self._not_recorded or self._logger is None:
            return
        entry = {
            "ts": _now_text(),
            "node_id": self.node_id,
            "op": "refusals_not_recorded",
            "outcome": "RATE_LIMITED",
            "count": self._not_recorded,
            "since": self._not_recorded_since,
        }
        self._not_recorded = 0
        self._logger.info(json.dumps(entry, sort_keys=True))

    def close(self) -> None:
        self._write_not_recorded()
        if self._logger is not None:
            for handler in self._logger.handlers:
                handler.close()
            self._logger.handlers[:] = []


def _now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def summarize_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The identifying part of a request's arguments, bounded, without secrets or file lists."""
    out: dict[str, Any] = {}
    for key in _KEPT_ARGS:
        value = args.get(key)
        if isinstance(value, str | int | bool) or (
            isinstance(value, list) and all(isinstance(v, str | int) for v in value)
        ):
            out[key] = _bounded(value)
    sql = args.get("sql")
    if isinstance(sql, str):
        out["sql"] = sql[:AUDIT_TEXT_CHARS_MAX]
    tables = args.get("tables")
    if isinstance(tables, list) and all(isinstance(t, str) for t in tables):
        out["tables"] = _bounded(tables)
    writes = args.get("writes")
    if isinstance(writes, list):
        # The request is not validated yet (a refused one is audited too): count only lists.
        out["writes"] = {
            _table_key(w.get("table")): _count(w.get("add")) + _count(w.get("remove"))
            for w in writes[:100]
            if isinstance(w, dict)
        }
    return out


def _table_key(table: Any) -> str:
    """A write's table as its summary names it. Not str() of what was sent: a "name" nested
    about 1,000 levels deep (the wire decodes that much) raised RecursionError, and the
    request got no reply at all; brief_repr stops a few levels down."""
    text = table if isinstance(table, str) else brief_repr(table)
    return text[:AUDIT_TEXT_CHARS_MAX]


def _count(items: Any) -> int:
    return len(items) if isinstance(items, list) else 0


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return value[:AUDIT_TEXT_CHARS_MAX]
    if isinstance(value, list):
        return [_bounded(v) for v in value[:100]]
    return value
