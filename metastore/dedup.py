"""Request-id de-duplication: a retried command is applied at most once.

A client that loses the reply to a DDL call cannot know whether it was applied, so it retries with
the same `request_id`. The state remembers, per request id, the Tm at which it succeeded, a
fingerprint of the command and the outcome, and answers a retry with that recorded outcome instead
of applying the command again (a retried CREATE TABLE must not fail with "already exists").

Rules:
* only *successful* outcomes are recorded: a failed command changed nothing, so running it again
  is harmless and may now succeed (e.g. after the missing namespace was created);
* a recorded id with a *different* command is refused (`RequestIdReusedError`) rather than
  silently answered with an unrelated outcome;
* retention is judged by Tm, never by a clock: an entry older than REQUEST_ID_RETENTION_MS (in HLC
  units) is ignored and evicted, and at most MAX_REMEMBERED_REQUESTS entries are kept (the oldest
  go first). Both are deterministic, so every replica remembers exactly the same ids.

Invariant: entries are in increasing Tm order (they are recorded in log order), so the oldest is
always first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from hlc.limits import LOGICAL_BITS
from metastore import limits
from metastore.errors import MalformedSnapshotError
from metastore.outcome import Outcome

RETENTION_HLC = limits.REQUEST_ID_RETENTION_MS << LOGICAL_BITS


def fingerprint(encoded_command: bytes) -> bytes:
    """A stable digest of a command's canonical encoding (same on every replica and version)."""
    return hashlib.blake2b(encoded_command, digest_size=16).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Remembered:
    tm: int
    fingerprint: bytes
    outcome: Outcome


class RequestLog:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[str, Remembered] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, request_id: str, *, tm: int) -> Remembered | None:
        """The remembered success for `request_id` if it is still within retention at `tm`."""
        entry = self._entries.get(request_id)
        if entry is None or entry.tm < tm - RETENTION_HLC:
            return None
        return entry

    def record(self, request_id: str, *, tm: int, fingerprint: bytes, outcome: Outcome) -> None:
        """Remember a success. Cannot fail (it runs after the catalog was already changed)."""
        self._entries.pop(request_id, None)
        self._entries[request_id] = Remembered(tm=tm, fingerprint=fingerprint, outcome=outcome)
        horizon = tm - RETENTION_HLC
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.tm >= horizon and len(self._entries) <= limits.MAX_REMEMBERED_REQUESTS:
                break
            self._entries.popitem(last=False)

    def check_invariants(self, *, last_tm: int) -> list[str]:
        """Problems found (empty when sound); the state turns them into CatalogInvariantError."""
        problems: list[str] = []
        if len(self._entries) > limits.MAX_REMEMBERED_REQUESTS:
            problems.append("request log over MAX_REMEMBERED_REQUESTS")
        previous = -1
        for rid, entry in self._entries.items():
            if entry.tm <= previous or entry.tm > last_tm:
                problems.append(f"request {rid!r}: tm out of order or after last_tm")
            if not entry.outcome.ok:
                problems.append(f"request {rid!r}: a failure was recorded")
            previous = entry.tm
        return problems

    def to_data(self) -> list[object]:
        return [[rid, e.tm, e.fingerprint, e.outcome.to_data()] for rid, e in self._entries.items()]

    @staticmethod
    def from_data(data: object) -> RequestLog:
        log = RequestLog()
        if not isinstance(data, list):
            raise MalformedSnapshotError("request log must be a list")
        for item in data:
            if not isinstance(item, list) or len(item) != 4:
                raise MalformedSnapshotError("request log entry must be [id, tm, digest, outcome]")
            rid, tm, digest, outcome = item
            if not isinstance(rid, str) or not isinstance(digest, bytes):
                raise MalformedSnapshotError("request id must be str and digest bytes")
            if not isinstance(tm, int) or isinstance(tm, bool):
                raise MalformedSnapshotError("request tm must be an integer")
            log._entries[rid] = Remembered(
                tm=tm, fingerprint=digest, outcome=Outcome.from_data(outcome)
            )
        return log

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestLog) and list(self._entries.items()) == list(
            other._entries.items()
        )
