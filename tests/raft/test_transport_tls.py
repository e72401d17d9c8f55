"""PeerTransport with mutual TLS on 127.0.0.1: what TLS adds to the HMAC handshake.

Certificates come from `metastore.daemon.certs` (a dev CA per test module, another CA for the
rogue). Each refusal is checked where it must be visible: the listener's `tls_refused` counter
and its log, and no message delivered. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from metastore.daemon.certs import GeneratedCerts, generate_dev_certs
from raft.errors import TlsConfigError
from raft.limits import STRANGERS_PER_HOST_MAX
from raft.tls import TlsFiles
from tests.raft.test_transport import (
    HOST,
    Inbox,
    eventually,
    hb,
    keep_sending,
    make,
    reach_an_old_node_that_never_dials,
    running,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> GeneratedCerts:
    return generate_dev_certs(tmp_path_factory.mktemp("ca"), node_ids=[1, 2, 3])


@pytest.fixture(scope="module")
def rogue_certs(tmp_path_factory: pytest.TempPathFactory) -> GeneratedCerts:
    return generate_dev_certs(tmp_path_factory.mktemp("rogue-ca"), node_ids=[1, 2, 3])


def files(certs: GeneratedCerts, node_id: int, *, as_node: int | None = None) -> TlsFiles:
    """Node `node_id`'s files; `as_node`: present that node's certificate instead."""
    cert, key = certs.node_certs[as_node if as_node is not None else node_id]
    return TlsFiles(ca_file=certs.ca_cert, cert_file=cert, key_file=key)


async def test_tls_peers_exchange_messages_and_report_tls(certs: GeneratedCerts) -> None:
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1))
    n2 = make(2, inbox2, tls=files(certs, 2))
    async with running(n1, n2):
        n1.set_peers({2: (HOST, n2.bound_port)})
        n2.set_peers({1: (HOST, n1.bound_port)})
        for n in range(50):
            n1.send(hb(1, 2, n))
            n2.send(hb(2, 1, n))
        await eventually(lambda: len(inbox2.messages) == 50 == len(inbox1.messages), "delivered")
        assert [m.commit for m in inbox2.from_(1)] == list(range(50))  # type: ignore[attr-defined]
        assert n1.stats()["tls_refused"] == 0


def _run_on_uvloop(coro: Callable[[], object]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(coro(), 30))  # type: ignore[arg-type]


def test_tls_peers_work_on_uvloop(certs: GeneratedCerts) -> None:
    # The daemon runs uvloop: its SSL transport and connect_accepted_socket must carry the link.
    async def exchange() -> None:
        await test_tls_peers_exchange_messages_and_report_tls(certs)

    _run_on_uvloop(exchange)


async def test_peer_with_a_certificate_of_another_ca_is_refused_and_logged(
    certs: GeneratedCerts, rogue_certs: GeneratedCerts, caplog: pytest.LogCaptureFixture
) -> None:
    # The rogue holds the cluster secret and trusts our CA (so it completes its side of the
    # handshake); only its certificate, signed by another CA, gives it away.
    inbox1, rogue_inbox = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1))
    rogue_tls = TlsFiles(
        ca_file=certs.ca_cert,
        cert_file=rogue_certs.node_certs[2][0],
        key_file=rogue_certs.node_certs[2][1],
    )
    rogue = make(2, rogue_inbox, tls=rogue_tls)
    caplog.set_level(logging.WARNING)
    async with running(n1, rogue):
        n1.set_peers({2: (HOST, rogue.bound_port)})
        rogue.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(
            lambda: rogue.send(hb(2, 1)), lambda: n1.stats()["tls_refused"] >= 2, "refused"
        )
        # Node 1 dialling the rogue refuses it too: the rogue's certificate is not trusted.
        await eventually(lambda: n1.stats()["peers"][2]["auth_failures"] >= 1, "n1 refuses")
        assert inbox1.messages == []
    refusals = [r.getMessage() for r in caplog.records if "refused peer connection" in r.message]
    assert any("certificate verify failed" in text for text in refusals), refusals


async def test_a_certificate_speaks_for_its_own_node_only(
    certs: GeneratedCerts, caplog: pytest.LogCaptureFixture
) -> None:
    # Node 3's certificate (same CA, right secret) used by a process claiming to be node 2.
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1))
    impostor = make(2, inbox2, tls=files(certs, 2, as_node=3))
    caplog.set_level(logging.WARNING)
    async with running(n1, impostor):
        n1.set_peers({2: (HOST, impostor.bound_port)})
        impostor.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(
            lambda: impostor.send(hb(2, 1)),
            lambda: n1.stats()["peers"][2]["auth_failures"] >= 2,
            "impostor refused both ways",
        )
        assert inbox1.messages == []
    assert any("names 'node-3', not 'node-2'" in r.getMessage() for r in caplog.records)


async def test_plaintext_peer_on_a_tls_listener_is_refused(certs: GeneratedCerts) -> None:
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1))
    plain = make(2, inbox2)  # same secret, no TLS
    async with running(n1, plain):
        plain.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(
            lambda: plain.send(hb(2, 1)), lambda: n1.stats()["tls_refused"] >= 2, "refused"
        )
        assert inbox1.messages == []
        assert plain.stats()["peers"][1]["connected"] is False


async def test_tls_handshakes_in_progress_are_bounded(certs: GeneratedCerts) -> None:
    # Silent TCP connections hold handshake slots; past the limit newcomers are closed at once,
    # and once they time out a real peer gets through.
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1), handshake_timeout_ms=500)
    n2 = make(2, inbox2, tls=files(certs, 2))
    async with running(n1, n2):
        listener = n1._server
        assert listener is not None
        limit = 8
        listener._handshakes_max = limit  # type: ignore[union-attr]
        # From three hosts, 4 each: under the per-host cap, over the listener's limit.
        silent = [
            await asyncio.open_connection(
                HOST, n1.bound_port, local_addr=(f"127.0.2.{2 + i // 4}", 0)
            )
            for i in range(limit + 4)
        ]
        await eventually(
            lambda: listener.refused_over_limit >= 4,  # type: ignore[union-attr]
            "newcomers past the limit closed",
        )
        n1.set_peers({2: (HOST, n2.bound_port)})
        n2.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(lambda: n2.send(hb(2, 1)), lambda: bool(inbox1.messages), "peer in")
        for _, writer in silent:
            writer.close()


async def test_tls_handshakes_from_one_host_are_capped(certs: GeneratedCerts) -> None:
    # A flood of silent connections from one host holds at most STRANGERS_PER_HOST_MAX
    # handshake slots; a real peer on another host then gets through without waiting.
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1))
    n2 = make(2, inbox2, tls=files(certs, 2))
    async with running(n1, n2):
        listener = n1._server
        assert listener is not None
        flood = [
            await asyncio.open_connection(HOST, n1.bound_port, local_addr=("127.0.2.250", 0))
            for _ in range(STRANGERS_PER_HOST_MAX + 10)
        ]
        await eventually(
            lambda: listener.refused_per_host >= 10,  # type: ignore[union-attr]
            "a flood from one host capped",
        )
        assert listener.refused_over_limit == 0  # type: ignore[union-attr]
        n1.set_peers({2: (HOST, n2.bound_port)})
        n2.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(lambda: n2.send(hb(2, 1)), lambda: bool(inbox1.messages), "peer in")
        for _, writer in flood:
            writer.close()


def test_bad_tls_files_are_a_typed_error_naming_the_file(
    certs: GeneratedCerts, rogue_certs: GeneratedCerts, tmp_path: Path
) -> None:
    missing = TlsFiles(
        ca_file=certs.ca_cert, cert_file=tmp_path / "nope.crt", key_file=certs.node_certs[1][1]
    )
    with pytest.raises(TlsConfigError, match=r"certificate file .*nope\.crt: file not found"):
        make(1, Inbox(), tls=missing)
    mismatched = TlsFiles(
        ca_file=certs.ca_cert, cert_file=certs.node_certs[1][0], key_file=certs.node_certs[2][1]
    )
    with pytest.raises(TlsConfigError, match="does not match certificate"):
        make(1, Inbox(), tls=mismatched)
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("hello")
    with pytest.raises(TlsConfigError, match="not a PEM file"):
        make(1, Inbox(), tls=TlsFiles(ca_file=not_pem, cert_file=not_pem, key_file=not_pem))


def _fingerprint(certs: GeneratedCerts, node_id: int) -> str:
    import hashlib
    import ssl

    pem = certs.node_certs[node_id][0].read_text()
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


async def test_a_revoked_certificate_is_refused_both_ways_and_told_why(
    certs: GeneratedCerts, caplog: pytest.LogCaptureFixture
) -> None:
    # Node 2 holds the secret and a valid certificate of the CA, named node-2: only the
    # revocation list refuses it. Without the `revoked` hook it would be accepted.
    revoked = {_fingerprint(certs, 2)}
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1), revoked=revoked.__contains__)
    n2 = make(2, inbox2, tls=files(certs, 2))
    caplog.set_level(logging.WARNING)
    async with running(n1, n2):
        n1.set_peers({2: (HOST, n2.bound_port)})
        n2.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(
            lambda: n2.send(hb(2, 1)),
            lambda: (
                n1.stats()["tls_revoked_refused"] >= 2
                and n1.stats()["peers"][2]["auth_failures"] >= 2
            ),
            "refused as listener and as dialler",
        )
        assert inbox1.messages == []
        assert n1.peer_certificates(2) == (_fingerprint(certs, 2),)
    texts = [r.getMessage() for r in caplog.records]
    assert any("is revoked" in t and "refused peer connection" in t for t in texts), texts
    # The refused node's own log says why (the listener told it), at ERROR.
    told = [r for r in caplog.records if "refused this node" in r.getMessage()]
    assert told and told[0].levelno == logging.ERROR
    assert _fingerprint(certs, 2) in told[0].getMessage()


async def test_revoking_closes_open_links_and_a_new_certificate_is_accepted(
    certs: GeneratedCerts, tmp_path: Path
) -> None:
    from metastore.daemon.certs import issue_node_certs

    revoked: set[str] = set()
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1), revoked=revoked.__contains__)
    n2 = make(2, inbox2, tls=files(certs, 2))
    async with running(n1, n2):
        n1.set_peers({2: (HOST, n2.bound_port)})
        n2.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(lambda: n2.send(hb(2, 1)), lambda: bool(inbox1.messages), "linked")
        await eventually(lambda: n1.stats()["peers"][2]["connected"], "n1 -> n2 up")
        revoked.add(_fingerprint(certs, 2))
        assert n1.close_revoked() == 2  # n2's link to n1 and n1's link to n2
        assert n1.stats()["tls_revoked_closed"] == 2
        await eventually(lambda: not n1.stats()["peers"][2]["connected"], "n1 -> n2 closed")
        await eventually(lambda: n1.stats()["tls_revoked_refused"] >= 2, "reconnects refused")
        delivered = len(inbox1.messages)
        for _ in range(10):
            n2.send(hb(2, 1))
            await asyncio.sleep(0.02)
        assert len(inbox1.messages) == delivered
    # The same node id with a new certificate of the same CA is welcome.
    new_cert, new_key = issue_node_certs(certs.ca_cert.parent, tmp_path, node_ids=[2])[2]
    inbox1, inbox2 = Inbox(), Inbox()
    n1 = make(1, inbox1, tls=files(certs, 1), revoked=revoked.__contains__)
    n2 = make(2, inbox2, tls=TlsFiles(ca_file=certs.ca_cert, cert_file=new_cert, key_file=new_key))
    async with running(n1, n2):
        n1.set_peers({2: (HOST, n2.bound_port)})
        n2.set_peers({1: (HOST, n1.bound_port)})
        await keep_sending(lambda: n2.send(hb(2, 1)), lambda: bool(inbox1.messages), "rejoined")
        assert n1.stats()["tls_revoked_refused"] == 0


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_a_new_node_reaches_an_old_node_that_never_dials_it_over_tls(
    certs: GeneratedCerts, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    """The old node's refusal of a hello of version 6 inside TLS (a close without TLS's own
    close) reads as a refusal too: the link falls back to 5 (see the plaintext test)."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(
            asyncio.wait_for(
                reach_an_old_node_that_never_dials(
                    {"tls": files(certs, 1)}, {"tls": files(certs, 2)}
                ),
                30,
            )
        )
