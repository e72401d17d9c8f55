"""Revoked peer/client certificates, kept in the replicated catalog state.

Key idea: a certificate is named by its SHA-256 fingerprint (of its DER bytes, lowercase hex,
64 characters), never by its node id: re-adding a removed node id with a NEW certificate works,
the revoked one stays refused. The set only grows (a revocation is never taken back: issue a new
certificate instead), is applied through the log like every other admin command
(`RevokeCerts`), travels in snapshots (format 7) and therefore reaches every node, including
one added later or restored from a backup.

Where fingerprints come from: `remove_node` on the daemon revokes the certificate(s) its peer
transport saw the removed node present on authenticated links (`reason="removed"`), and
`metastore cluster revoke-cert` revokes a file's or a fingerprint's (`reason="operator"`).
Where they are checked: the daemon passes `is_revoked` to the peer transport (raft.transport
refuses a revoked certificate at every handshake, both directions) and checks client
certificates at hello.

This module is pure: no clock, file or socket. `fingerprint_of_der` and `normalize_fingerprint`
are helpers for the edges (daemon, CLI).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import string
from dataclasses import dataclass
from typing import Final

from metastore import limits
from metastore.errors import (
    CatalogInvariantError,
    InvalidArgumentError,
    MalformedSnapshotError,
    limit_exceeded,
)

FINGERPRINT_HEX_CHARS: Final = 64
# Why a certificate was revoked: its node was removed, or an operator said so (leaked key,
# rotation).
REVOKE_REASONS: Final = ("removed", "operator")
_HEX: Final = frozenset(string.hexdigits.lower())


def fingerprint_of_der(der: bytes) -> str:
    """The fingerprint of a certificate: SHA-256 of its DER encoding, lowercase hex."""
    return hashlib.sha256(der).hexdigest()


_PEM_CERT = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*([A-Za-z0-9+/=\s]+?)\s*-----END CERTIFICATE-----"
)


def fingerprint_of_pem(data: bytes) -> str:
    """The fingerprint of the first certificate in PEM text (a chain file's leaf comes first).
    InvalidArgumentError if there is none."""
    match = _PEM_CERT.search(data)
    if match is None:
        raise InvalidArgumentError("no PEM certificate ('-----BEGIN CERTIFICATE-----') found")
    try:
        der = base64.b64decode(b"".join(match.group(1).split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError("the PEM certificate is not valid base64") from None
    if not der:
        raise InvalidArgumentError("the PEM certificate is empty")
    return fingerprint_of_der(der)


def is_fingerprint(text: object) -> bool:
    """Canonical form: exactly 64 lowercase hex characters."""
    return (
        isinstance(text, str)
        and len(text) == FINGERPRINT_HEX_CHARS
        and all(c in _HEX for c in text)
    )


def normalize_fingerprint(text: str) -> str:
    """Accept what tools print (`AB:CD:...`, `sha256:abcd...`, upper case, spaces around) and
    return the canonical form; InvalidArgumentError for anything else."""
    if not isinstance(text, str):
        raise InvalidArgumentError("a certificate fingerprint must be a string")
    raw = text.strip()
    if len(raw) > 4 * FINGERPRINT_HEX_CHARS:
        raise InvalidArgumentError("a certificate fingerprint is 64 hex digits (SHA-256)")
    lowered = raw.lower()
    for prefix in ("sha256:", "sha256="):
        if lowered.startswith(prefix):
            lowered = lowered[len(prefix) :]
    hexed = lowered.replace(":", "")
    if not is_fingerprint(hexed):
        raise InvalidArgumentError(
            f"{raw[:80]!r} is not a SHA-256 certificate fingerprint (64 hex digits, colons "
            "allowed)",
            details={"fingerprint": raw[:80]},
        )
    return hexed


@dataclass(frozen=True, slots=True, kw_only=True)
class RevokedCert:
    fingerprint: str
    node_id: int  # the node it spoke for (0: not known, e.g. an operator's fingerprint)
    reason: str  # one of REVOKE_REASONS
    tm: int  # Tm of the entry that revoked it
    by: str  # the client name the caller gave (a label), or "leader:<id>"

    def to_data(self) -> list[object]:
        return [self.fingerprint, self.node_id, self.reason, self.tm, self.by]

    def to_view(self) -> dict[str, object]:
        return {
            "fingerprint": self.fingerprint,
            "node_id": self.node_id,
            "reason": self.reason,
            "tm": self.tm,
            "by": self.by,
        }


class RevokedCerts:
    """The cluster's revocation list: fingerprint -> RevokedCert. Only grows."""

    __slots__ = ("_certs",)

    def __init__(self) -> None:
        self._certs: dict[str, RevokedCert] = {}

    def __len__(self) -> int:
        return len(self._certs)

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._certs

    def is_revoked(self, fingerprint: str) -> bool:
        return fingerprint in self._certs

    def entries(self) -> tuple[RevokedCert, ...]:
        """Every revoked certificate, oldest revocation first (then by fingerprint)."""
        return tuple(sorted(self._certs.values(), key=lambda r: (r.tm, r.fingerprint)))

    def revoke(
        self, fingerprints: tuple[str, ...], *, node_id: int, reason: str, tm: int, by: str
    ) -> dict[str, object]:
        """Add the fingerprints not revoked yet (validated by the command). Refuses, changing
        nothing, past MAX_REVOKED_CERTS."""
        new = [fp for fp in dict.fromkeys(fingerprints) if fp not in self._certs]
        if len(self._certs) + len(new) > limits.MAX_REVOKED_CERTS:
            raise limit_exceeded(
                "MAX_REVOKED_CERTS",
                limits.MAX_REVOKED_CERTS,
                len(self._certs) + len(new),
                "revoked certificates",
            )
        for fp in new:
            self._certs[fp] = RevokedCert(
                fingerprint=fp, node_id=node_id, reason=reason, tm=tm, by=by
            )
        return {
            "revoked": new,
            "already_revoked": [fp for fp in fingerprints if fp not in new],
            "node_id": node_id,
            "total": len(self._certs),
        }

    def check_invariants(self, *, last_tm: int) -> None:
        if len(self._certs) > limits.MAX_REVOKED_CERTS:
            raise CatalogInvariantError("more revoked certificates than MAX_REVOKED_CERTS")
        for fp, cert in self._certs.items():
            if fp != cert.fingerprint or not is_fingerprint(fp):
                raise CatalogInvariantError(f"revoked certificate key {fp!r} is malformed")
            if cert.reason not in REVOKE_REASONS or cert.node_id < 0 or cert.tm > last_tm:
                raise CatalogInvariantError(f"revoked certificate {fp} is inconsistent")

    def to_data(self) -> list[object]:
        return [c.to_data() for c in self.entries()]

    @staticmethod
    def from_data(obj: object) -> RevokedCerts:
        if not isinstance(obj, list) or len(obj) > limits.MAX_REVOKED_CERTS:
            raise MalformedSnapshotError("snapshot revoked certificates must be a bounded list")
        out = RevokedCerts()
        for item in obj:
            if not (
                isinstance(item, list)
                and len(item) == 5
                and is_fingerprint(item[0])
                and type(item[1]) is int
                and item[2] in REVOKE_REASONS
                and type(item[3]) is int
                and isinstance(item[4], str)
            ):
                raise MalformedSnapshotError(
                    "a revoked certificate must be [fingerprint, node_id, reason, tm, by]"
                )
            if item[0] in out._certs:
                raise MalformedSnapshotError(f"certificate {item[0]} is revoked twice")
            out._certs[item[0]] = RevokedCert(
                fingerprint=item[0], node_id=item[1], reason=item[2], tm=item[3], by=item[4]
            )
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RevokedCerts) and self._certs == other._certs

    __hash__ = None  # type: ignore[assignment]
