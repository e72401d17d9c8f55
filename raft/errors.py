"""Typed errors of the Raft engine.

Every expected failure is its own small class deriving from `RaftError` and declaring a stable
`code` (a short snake_case string) that logs, metrics and the client API can carry without
parsing messages. Keep this module flat: one class per failure, grouped by the file that raises
it, no logic. Subclass a more general error only when callers really handle both the same way.
"""

from __future__ import annotations


class RaftError(Exception):
    """Base of every error the Raft engine raises on purpose."""

    code: str = "raft_error"


class InvalidLimitError(RaftError):
    """A limit passed in by the caller is outside what the format or the engine supports."""

    code = "invalid_limit"


# ---- framing (raft.framing) -----------------------------------------------------------------


class FrameEncodeError(RaftError):
    """An object handed to the frame encoder is not representable in msgpack (a caller's bug)."""

    code = "frame_unencodable"


class FrameTooLargeError(RaftError):
    """A frame's declared (or encoded) length exceeds the configured maximum.

    Raised from the 4 header bytes alone, before any of the body is buffered.
    """

    code = "frame_too_large"


class MalformedFrameError(RaftError):
    """A frame's body is not exactly one msgpack object of the permitted kinds."""

    code = "malformed_frame"


# ---- message codec (raft.wire) --------------------------------------------------------------


class MalformedMessageError(RaftError):
    """A decoded frame is not a valid peer message; the text names the offending field."""

    code = "malformed_message"


class MalformedConfStateError(MalformedMessageError):
    """The bytes of a CONF entry do not hold a valid encoded ConfState."""

    code = "malformed_conf_state"


# ---- peer transport (raft.transport) --------------------------------------------------------


class TransportConfigError(RaftError):
    """PeerTransport was constructed with values it cannot work with (bad id, weak secret...)."""

    code = "transport_config_invalid"


class PeerHandshakeError(RaftError):
    """A peer connection's handshake broke the protocol (bad frame shape, early data, EOF)."""

    code = "peer_handshake_failed"


class PeerConnectionClosedError(PeerHandshakeError):
    """A peer connection ended during the handshake: EOF, a reset, or a write that found the
    connection closed under us (the link ends; nothing was refused)."""

    code = "peer_connection_closed"


class PeerHelloRefusedError(PeerConnectionClosedError):
    """The peer we dialled closed the connection right after our hello, without a word: a
    node of an older release that does not speak the protocol version we offered does so,
    and so does a proxy in front of a node that is down (raft.transport, "Protocol
    versions")."""

    code = "peer_hello_refused"


class PeerAuthError(PeerHandshakeError):
    """A peer failed authentication: wrong secret, wrong cluster id or an unknown node id."""

    code = "peer_auth_failed"


class CertificateRevokedError(PeerAuthError):
    """A peer presented a TLS certificate the cluster revoked (its fingerprint is on the
    revocation list the node passed to the transport)."""

    code = "peer_certificate_revoked"


class PeerRefusedError(PeerAuthError):
    """The peer we dialled refused this node, and said why (e.g. our certificate is revoked)."""

    code = "peer_refused_us"


class SecretFileError(RaftError):
    """The cluster secret file cannot be used (not a regular file, empty, too short, too big)."""

    code = "secret_file_invalid"


class InsecureSecretFileError(SecretFileError):
    """The cluster secret file is readable or writable by group or others (must be 0600)."""

    code = "secret_file_insecure"


class TlsConfigError(RaftError):
    """A TLS file (CA, certificate, key) is missing, unreadable, not PEM, or does not fit the
    others: a key of another certificate, a certificate not signed by the CA, or expired.
    The message is one line naming the file (raft.tls)."""

    code = "tls_config_invalid"


# ---- node identity (raft.node) ---------------------------------------------------------------


class NodeIdentityError(RaftError):
    """The data directory does not belong to this member: another cluster or node id, or an
    empty one where this member must already have state (its data was lost). A member whose
    data is gone may have voted in terms it no longer remembers; starting it fresh could let it
    vote twice in a term. Remove it from the cluster and add it back as a new member."""

    code = "node_identity"


class NodeStateWriteError(RaftError):
    """A file of the node's own state outside its log (`IDENTITY`) could not be written or
    made durable: a full or failing disk, no permission. The message names the file and the
    errno; nothing was half-written in its place."""

    code = "node_state_unwritable"
