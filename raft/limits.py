"""Every limit of the Raft engine, named, in one place.

Each constant states its unit in its name (`_BYTES`, `_MS`, plain counts otherwise) and is
enforced where it is used, with a typed error or a counted drop when it is hit. Change a value
here and nowhere else. Grouped by the module that enforces it; others append their own groups.
"""

from __future__ import annotations

_MIB = 1024 * 1024

# ---- peer transport and framing (raft.framing, raft.wire, raft.transport) --------------------

# Largest peer frame (4-byte length header excluded). It caps every message but a snapshot
# larger than SNAPSHOT_CHUNK_BYTES, which travels in chunk frames (see below).
PEER_FRAME_BYTES_MAX = 64 * _MIB

# Array items and map pairs in one peer frame, all levels together (raft.framing): decoding
# builds a Python object per item, so this, not the frame's bytes, bounds the time and memory
# a frame of tiny items costs (a 64 MiB one took seconds and gigabytes). A leader's
# AppendEntries holds at most max_msg_bytes (1 MiB) / 32 (Entry.size_bytes per empty entry)
# + 1 = 32,769 entries of 6 items each, about 200k; other messages hold a few dozen.
PEER_FRAME_ITEMS_MAX = 1_000_000

# Warnings about what one authenticated peer sent (a malformed frame or message, a message
# for another node): at most this many at once, then this many per second; the rest are counted
# (the peer's `malformed`/`rejected` counters count every one) and the next warning logged says
# how many were left out. A peer sending bad frames in a loop must not fill the log.
PEER_WARNINGS_BURST = 10
PEER_WARNINGS_PER_S = 1.0

# Messages waiting for one peer's connection. When full the oldest is dropped (and counted):
# Raft resends what matters, and the newest messages carry the most current state.
PEER_SEND_QUEUE_MAX = 4096

# Encoded bytes waiting for one peer. Two full-size frames, so one large message can always
# queue behind another without evicting it; beyond that the oldest frames are dropped. (A chunked
# snapshot transfer is not in the queue: its chunks are cut from the message as they are sent.)
PEER_SEND_QUEUE_BYTES_MAX = 2 * PEER_FRAME_BYTES_MAX

# The whole authentication exchange (after TCP connect) must finish within this; a silent or slow
# peer cannot hold a connection slot open longer.
HANDSHAKE_TIMEOUT_MS = 5_000

# Largest handshake frame. The handshake runs before the peer is authenticated, so an unknown
# party can never make us buffer more than this (rather than PEER_FRAME_BYTES_MAX).
HANDSHAKE_FRAME_BYTES_MAX = 1024
# TLS handshakes one listener runs at once (raft.tls.TlsListener, peers and the client port);
# a newcomer past it is closed at once. Each costs a key exchange, so strangers must not be able
# to make a node do an unbounded number of them; real peers and clients retry.
TLS_HANDSHAKES_IN_PROGRESS_MAX = 64
# Unauthenticated connections (before or in their handshake) from one source address at once,
# on the peer port and in a TLS listener. A peer needs one per link; the cap keeps a flood from
# one host from taking the slots real peers on other hosts need (a newcomer past it is closed).
STRANGERS_PER_HOST_MAX = 8

# Longest cluster id. It travels in the first handshake frame, which must fit in
# HANDSHAKE_FRAME_BYTES_MAX even at 4 UTF-8 bytes per character.
CLUSTER_ID_CHARS_MAX = 128

# Bound on establishing the TCP connection to a peer (one attempt).
PEER_CONNECT_TIMEOUT_MS = 3_000

# Reconnect delay bounds: the delay doubles per failed attempt from MIN up to MAX, with random
# jitter inside [MIN, current cap] so restarted nodes do not reconnect in lockstep. A link counts
# as a failed attempt unless it stayed up for MAX: only then does the delay start over at MIN.
RECONNECT_BACKOFF_MS_MIN = 50
RECONNECT_BACKOFF_MS_MAX = 2_000

# A peer link whose sent data stays unacknowledged this long is closed and redialled (Linux
# TCP_USER_TIMEOUT). Without it a peer that vanished without a reset (power loss, a partition)
# or stopped reading keeps the link "up" for TCP's retransmission timeout, about 15 minutes,
# and a rebooted peer hears nothing from us until a retransmission, up to 2 minutes apart,
# meets its reset. Many election timeouts long: a live peer whose loop reads nothing for this
# long (a stall far beyond an election timeout) loses the link too, and is redialled.
PEER_TCP_USER_TIMEOUT_MS = 10_000
# Keepalive probes on idle peer links (both directions), so an idle link to a vanished peer
# (two followers talk only during elections) is found dead before an election needs it:
# the first probe after this much silence, then one per interval, up to the user timeout.
PEER_KEEPALIVE_IDLE_MS = 5_000
PEER_KEEPALIVE_INTERVAL_MS = 1_000
PEER_KEEPALIVE_PROBES = 5

# Simultaneous inbound peer connections (authenticated or not). A cluster needs one per peer;
# the slack absorbs reconnect overlap. Connections beyond it are closed at once.
PEER_INBOUND_CONNECTIONS_MAX = 64

# Bytes asked of the socket per read on an inbound peer connection.
PEER_READ_CHUNK_BYTES = 256 * 1024

# How long stop() waits for its tasks and connections to wind down before giving up on them.
PEER_STOP_TIMEOUT_MS = 2_000

# Cluster secret: at least this many bytes (the generated one is 64 hex characters, 256 bits).
SECRET_BYTES_MIN = 32

# A secret file larger than this is not a secret file; refuse rather than read it.
SECRET_FILE_BYTES_MAX = 4096

# ---- snapshots a node takes of its own state (raft.node) -------------------------------------

# A snapshot that could not be saved (ENOSPC, EIO while its file is written or renamed into
# place: the log itself is intact) is tried again after this long, doubled after each failure
# up to the maximum, and the node goes on serving from its log meanwhile. Saving a snapshot
# only bounds the log's size and a restart's replay; trying at every applied entry would
# encode the whole state again and again on a disk that is full. A state over
# SNAPSHOT_BYTES_MAX waits the maximum from its first failure: it stays over until it shrinks.
SNAPSHOT_SAVE_RETRY_MS_MIN = 1_000
SNAPSHOT_SAVE_RETRY_MS_MAX = 60_000

# ---- snapshot transfers (raft.transport) ----------------------------------------------------

# An InstallSnapshot whose encoding is larger than this travels as a transfer of chunk frames of
# at most this many data bytes each, interleaved with the link's other frames, instead of as one
# frame. Also the most a link writes for a transfer between two looks at its queue (times
# SNAPSHOT_CHUNKS_PER_ROUND), so it bounds how long a heartbeat waits behind a snapshot.
SNAPSHOT_CHUNK_BYTES = 1 * _MIB

# Chunks a link writes per round, after the frames queued for it and before awaiting drain().
SNAPSHOT_CHUNKS_PER_ROUND = 2

# The largest snapshot transfer (the encoded InstallSnapshot). A receiver buffers at most this
# much per peer; a sender refuses (drops and counts) a larger one. At least the largest snapshot
# file the WAL writes (raft.wal.SNAPSHOT_BYTES_MAX, 1 GiB) plus headroom for the message around it.
SNAPSHOT_TRANSFER_BYTES_MAX = 1024 * _MIB + 16 * _MIB

# A receiver acknowledges a transfer's progress every this many bytes (and at its end). After a
# reconnect the sender continues from the last acknowledged offset, so at most this much (plus
# what was in flight) is sent twice.
SNAPSHOT_ACK_INTERVAL_BYTES = 8 * _MIB

# A snapshot a leader could not read for a transfer (its file truncated, EIO: the transfer was
# given up with an error line) is not sent to that peer again for this long: the core retries
# every couple of election timeouts, and each try would read and fail (and log) again. A newer
# snapshot is sent at once.
SNAPSHOT_UNREADABLE_RETRY_MS = 30_000

# A receiver deletes a transfer it holds part of (its spool file) once no chunk of it arrived
# for this long: its sender restarted, or stopped sending it (deposed, or the follower caught
# up from another leader), and nothing else would ever end it. A sender that goes on later
# is asked for it from the start (rewind). Far above the reconnect backoff, so a dropped
# connection resumes where it was.
SNAPSHOT_TRANSFER_IDLE_MS = 60_000
