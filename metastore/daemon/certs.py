"""A development certificate authority: `metastore cluster certs --out DIR --nodes N`.

Generates, with the `cryptography` package, a self-signed CA and one certificate per node
(subject CN `node-<id>`, the name `raft.tls` binds to the node id on peer links) plus one
client certificate, each with its own EC P-256 key:

    DIR/ca.crt                 the CA certificate: the `ca_file` of every node and of clients
    DIR/ca.key                 the CA's key (0600): keep it off the nodes; only `certs` uses it
    DIR/node-<id>.crt/.key     a node's certificate (server and client use) and key (0600)
    DIR/client.crt/.key        a client certificate, for client ports that require one

Every node certificate names the hosts given (`--host`, default 127.0.0.1 and localhost) as
subject alternative names, since clients and peers verify the host they dial against them.

This is for tests, demos and small installations. A production cluster should take its
certificates from the organisation's PKI; the rules are the same (see
cluster_configs/production-example/cluster.toml): one CA file, CN `node-<id>`, SANs with the
addresses peers and clients dial.

Invariants: an existing file is never overwritten (the command refuses and changes nothing),
and keys are written 0600 from their creation (never briefly readable by others).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raft.tls import node_common_name

__all__ = [
    "CA_CERT_FILE",
    "CLIENT_COMMON_NAME",
    "CertsError",
    "GeneratedCerts",
    "generate_dev_certs",
    "issue_node_certs",
]

CA_CERT_FILE: Final = "ca.crt"
CA_KEY_FILE: Final = "ca.key"
CLIENT_COMMON_NAME: Final = "metastore-client"
DEFAULT_HOSTS: Final = ("127.0.0.1", "localhost")
# Long enough that a dev cluster does not break in the middle of work; short enough that a
# forgotten dev CA does not live for decades.
DEFAULT_VALID_DAYS: Final = 365
VALID_DAYS_MAX: Final = 3650
# Certificates become valid a little in the past, so a host whose clock is slightly behind the
# generating host's does not refuse them at first.
_BACKDATE: Final = datetime.timedelta(minutes=5)
NODES_MAX: Final = 7


class CertsError(Exception):
    """The certificates cannot be generated as asked (bad arguments, files in the way)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratedCerts:
    ca_cert: Path
    ca_key: Path
    node_certs: dict[int, tuple[Path, Path]]
    client_cert: tuple[Path, Path]

    def all_files(self) -> list[Path]:
        out = [self.ca_cert, self.ca_key]
        for cert, key in self.node_certs.values():
            out += [cert, key]
        out += list(self.client_cert)
        return out


def node_cert_files(out_dir: Path, node_id: int) -> tuple[Path, Path]:
    return out_dir / f"node-{node_id}.crt", out_dir / f"node-{node_id}.key"


def generate_dev_certs(
    out_dir: Path,
    *,
    node_ids: Sequence[int],
    hosts: Sequence[str] = DEFAULT_HOSTS,
    valid_days: int = DEFAULT_VALID_DAYS,
    ca_name: str = "metastore dev CA",
    now: datetime.datetime | None = None,
) -> GeneratedCerts:
    """Write a new CA and certificates for `node_ids` and one client into `out_dir`."""
    if not node_ids or len(node_ids) > NODES_MAX or len(set(node_ids)) != len(node_ids):
        raise CertsError(f"between 1 and {NODES_MAX} distinct node ids are needed: {node_ids}")
    if any(n < 1 for n in node_ids):
        raise CertsError(f"node ids are positive: {list(node_ids)}")
    if not 1 <= valid_days <= VALID_DAYS_MAX:
        raise CertsError(f"valid days must be in 1..{VALID_DAYS_MAX}, got {valid_days}")
    if not hosts:
        raise CertsError("at least one host name or address is needed")
    out_dir = Path(out_dir)
    result = GeneratedCerts(
        ca_cert=out_dir / CA_CERT_FILE,
        ca_key=out_dir / CA_KEY_FILE,
        node_certs={n: node_cert_files(out_dir, n) for n in node_ids},
        client_cert=(out_dir / "client.crt", out_dir / "client.key"),
    )
    existing = [p for p in result.all_files() if p.exists()]
    if existing:
        raise CertsError(f"refusing to overwrite {existing[0]} (choose an empty --out directory)")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = (now if now is not None else datetime.datetime.now(datetime.UTC)) - _BACKDATE
    end = start + _BACKDATE + datetime.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key, ca_name, start, end)
    _write_key(result.ca_key, ca_key)
    _write_cert(result.ca_cert, ca_cert)
    for node_id, (cert_path, key_path) in result.node_certs.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(key, ca_key, ca_cert, node_common_name(node_id), hosts, start, end)
        _write_key(key_path, key)
        _write_cert(cert_path, cert)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf_certificate(key, ca_key, ca_cert, CLIENT_COMMON_NAME, (), start, end)
    _write_key(result.client_cert[1], key)
    _write_cert(result.client_cert[0], cert)
    return result


def issue_node_certs(
    ca_dir: Path,
    out_dir: Path,
    *,
    node_ids: Sequence[int],
    hosts: Sequence[str] = DEFAULT_HOSTS,
    valid_days: int = DEFAULT_VALID_DAYS,
    now: datetime.datetime | None = None,
) -> dict[int, tuple[Path, Path]]:
    """New certificates (and keys) for `node_ids`, signed by the dev CA that `generate_dev_certs`
    wrote into `ca_dir`, written to `out_dir` as node-<id>.crt/.key: a node's certificate
    rotation (then revoke the old one, `metastore cluster revoke-cert`)."""
    if not node_ids or len(node_ids) > NODES_MAX or len(set(node_ids)) != len(node_ids):
        raise CertsError(f"between 1 and {NODES_MAX} distinct node ids are needed: {node_ids}")
    if any(n < 1 for n in node_ids):
        raise CertsError(f"node ids are positive: {list(node_ids)}")
    if not 1 <= valid_days <= VALID_DAYS_MAX:
        raise CertsError(f"valid days must be in 1..{VALID_DAYS_MAX}, got {valid_days}")
    ca_dir, out_dir = Path(ca_dir), Path(out_dir)
    try:
        ca_cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT_FILE).read_bytes())
        ca_key = serialization.load_pem_private_key((ca_dir / CA_KEY_FILE).read_bytes(), None)
    except (OSError, ValueError, TypeError) as exc:
        raise CertsError(
            f"cannot use the CA in {ca_dir} ({CA_CERT_FILE} and {CA_KEY_FILE}): {exc}"
        ) from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertsError(f"{ca_dir / CA_KEY_FILE} is not an EC key of a dev CA")
    made = {n: node_cert_files(out_dir, n) for n in node_ids}
    existing = [p for pair in made.values() for p in pair if p.exists()]
    if existing:
        raise CertsError(f"refusing to overwrite {existing[0]} (choose another --out directory)")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = (now if now is not None else datetime.datetime.now(datetime.UTC)) - _BACKDATE
    end = min(start + _BACKDATE + datetime.timedelta(days=valid_days), ca_cert.not_valid_after_utc)
    for node_id, (cert_path, key_path) in made.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(key, ca_key, ca_cert, node_common_name(node_id), hosts, start, end)
        _write_key(key_path, key)
        _write_cert(cert_path, cert)
    return made


def _ca_certificate(
    key: ec.EllipticCurvePrivateKey,
    name: str,
    start: datetime.datetime,
    end: datetime.datetime,
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _leaf_certificate(
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    hosts: Sequence[str],
    start: datetime.datetime,
    end: datetime.datetime,
) -> x509.Certificate:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # A node certificate is used both ways: it serves (peer listener, client port) and it
        # dials (peer links, forwarding to the leader's client port).
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    _write_new(path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_new(path, pem, mode=0o600)


def _write_new(path: Path, data: bytes, *, mode: int) -> None:
    # O_EXCL: never overwrite (a concurrent run loses instead of mixing two CAs); the mode is
    # set at creation so a key is never readable by others, not even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
