"""Certificate revocation in the catalog state (metastore.revocation): the pure parts.

What each test would catch without the feature: no RevokeCerts command (import fails), no
`revoked` component, a snapshot that drops the list (format 7), malformed input accepted.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import pytest

from metastore import limits
from metastore.commands import RevokeCerts, decode_command, encode_command
from metastore.errors import InvalidArgumentError, MalformedCommandError, MalformedSnapshotError
from metastore.revocation import fingerprint_of_der, fingerprint_of_pem, normalize_fingerprint
from metastore.state import MetastoreState
from tests.metastore._driver import Driver

FP_A = hashlib.sha256(b"certificate a").hexdigest()
FP_B = hashlib.sha256(b"certificate b").hexdigest()


def test_fingerprint_is_sha256_of_der() -> None:
    assert fingerprint_of_der(b"der") == hashlib.sha256(b"der").hexdigest()


@pytest.mark.parametrize(
    "text",
    [
        FP_A,
        FP_A.upper(),
        ":".join(FP_A[i : i + 2] for i in range(0, 64, 2)).upper(),  # openssl -fingerprint
        f"sha256:{FP_A}",
        f"  {FP_A}\n",
    ],
)
def test_normalize_fingerprint_accepts_what_tools_print(text: str) -> None:
    assert normalize_fingerprint(text) == FP_A


@pytest.mark.parametrize("text", ["", "abc", FP_A[:-1], FP_A + "0", "g" * 64, "x" * 1000])
def test_malformed_fingerprints_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        normalize_fingerprint(text)


def test_revocation_applies_is_idempotent_and_survives_a_snapshot() -> None:
    d = Driver()
    out = d.apply(RevokeCerts(fingerprints=(FP_A,), node_id=3, reason="removed", by="leader:1"))
    assert out.ok, out
    assert out.result["revoked"] == [FP_A]
    assert d.state.revoked.is_revoked(FP_A)
    assert not d.state.revoked.is_revoked(FP_B)
    again = d.apply(RevokeCerts(fingerprints=(FP_A, FP_B), by="admin"))
    assert again.ok
    assert again.result["revoked"] == [FP_B]
    assert again.result["already_revoked"] == [FP_A]
    [a, b] = d.state.revoked.entries()
    assert (a.fingerprint, a.node_id, a.reason, a.by) == (FP_A, 3, "removed", "leader:1")
    assert (b.fingerprint, b.node_id, b.reason) == (FP_B, 0, "operator")
    d.state.check_invariants()
    snap = d.state.to_snapshot()
    restored = MetastoreState.from_snapshot(snap)
    assert restored == d.state
    assert restored.revoked.is_revoked(FP_A) and restored.revoked.is_revoked(FP_B)
    assert restored.to_snapshot() == snap


def test_older_snapshot_formats_load_with_no_revocations() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    assert obj["v"] == 8 and obj["revoked"] == []
    del obj["revoked"], obj["apply_version"]
    obj["v"] = 6
    old = MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))
    assert len(old.revoked) == 0
    assert old.list_namespaces()


def test_a_v7_snapshot_without_the_list_or_with_garbage_in_it_is_refused() -> None:
    d = Driver()
    obj = msgpack.unpackb(d.state.to_snapshot(), raw=False)
    missing = dict(obj)
    del missing["revoked"]
    with pytest.raises(MalformedSnapshotError):
        MetastoreState.from_snapshot(msgpack.packb(missing, use_bin_type=True))
    for bad in (["x"], [[FP_A, 0, "why", 1, ""]], [[FP_A, 0, "operator", 1, ""]] * 2, {}):
        obj["revoked"] = bad
        with pytest.raises(MalformedSnapshotError):
            MetastoreState.from_snapshot(msgpack.packb(obj, use_bin_type=True))


def test_command_round_trips_and_bad_commands_change_nothing() -> None:
    cmd = RevokeCerts(fingerprints=(FP_A,), node_id=2, reason="removed", by="admin")
    assert decode_command(encode_command(cmd)) == cmd
    d = Driver()
    before = d.state.to_snapshot()
    for bad in (
        RevokeCerts(fingerprints=()),
        RevokeCerts(fingerprints=(FP_A.upper(),)),
        RevokeCerts(fingerprints=("abc",)),
        RevokeCerts(fingerprints=(FP_A, FP_A)),
        RevokeCerts(fingerprints=(FP_A,), reason="because"),
        RevokeCerts(fingerprints=(FP_A,), node_id=-1),
        RevokeCerts(
            fingerprints=tuple(
                hashlib.sha256(bytes([i])).hexdigest()
                for i in range(limits.MAX_FINGERPRINTS_PER_REVOKE + 1)
            )
        ),
    ):
        out = d.state.apply(bad, tm=d.tm + 1, index=d.index + 1)
        assert not out.ok, bad
        with pytest.raises(MalformedCommandError):
            decode_command(encode_command(bad))
    assert d.state.to_snapshot() == before


def test_the_list_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_REVOKED_CERTS", 1)
    d = Driver()
    assert d.apply(RevokeCerts(fingerprints=(FP_A,))).ok
    before = d.state.to_snapshot()
    out = d.state.apply(RevokeCerts(fingerprints=(FP_B,)), tm=d.tm + 1, index=d.index + 1)
    assert not out.ok and out.error is not None
    assert d.state.to_snapshot() == before


def test_fingerprint_of_pem_matches_what_tls_sees(tmp_path: Path) -> None:
    import ssl

    from metastore.daemon.certs import generate_dev_certs

    made = generate_dev_certs(tmp_path, node_ids=[1])
    pem = made.node_certs[1][0].read_bytes()
    der = ssl.PEM_cert_to_DER_cert(pem.decode())
    assert fingerprint_of_pem(pem) == hashlib.sha256(der).hexdigest()
    # A chain file: the leaf (first certificate) is what the node presents.
    chain = pem + made.ca_cert.read_bytes()
    assert fingerprint_of_pem(chain) == fingerprint_of_pem(pem)
    for bad in (b"", b"not pem", b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"):
        with pytest.raises(InvalidArgumentError):
            fingerprint_of_pem(bad)
