"""Limits of the client API (docs/protocol.md). Every one is enforced with a typed error."""

from __future__ import annotations

from typing import Final

from hlc import MAX_TS, physical_ms, span_text, ts_text
from metastore.errors import InvalidArgumentError
from metastore.limits import MAX_CLOCK_SKEW_MS
from raft.wire import brief_repr, show_value

CLIENT_FRAME_BYTES_MAX: Final = 4 * 1024 * 1024
CLIENT_READ_CHUNK_BYTES: Final = 256 * 1024
# Array items and map pairs in one request frame, all levels together (`raft.framing`: the
# decoder stops once passed). Decoding builds a Python object per item, at 8 to 64 times its
# encoded size, so this, not CLIENT_FRAME_BYTES_MAX, bounds what one frame costs: a 4 MiB frame
# of empty arrays took 1.4 s of the node's one event loop (Raft's too) and 290 MiB, and a
# request that then waits holds it. The largest legitimate request is a commit of
# MAX_FILES_PER_COMMIT (10,000) files, each a map of 3 pairs and an item of its list, with 100
# written and 100 read tables: about 41,000 items (DDL travels as one string; a pin names at
# most 100 tables). A forwarded command (`_propose`: one bytes value in its request) is
# decoded under this budget too: the encoded commit holds about as many. About 2.4 times
# that, so the files of a commit may gain a few fields. A frame of tiny items is refused after
# about 30 ms and 6 MiB (that commit decodes in 9 ms).
CLIENT_REQUEST_ITEMS_MAX: Final = 100_000
# ... and in a stranger's first request (its `hello`: an id, an op and two arguments), decoded
# before anything is known of who sent it. Bytes bound it too (CLIENT_HELLO_BYTES_MAX).
CLIENT_HELLO_ITEMS_MAX: Final = 64
# ... and in one reply, as the protocol client (and a follower forwarding to its leader) decodes
# it: a compromised or buggy node must not make a client decode unboundedly. Replies are
# larger than requests: the densest legitimate ones carry schemas (a `pin` of up to
# PIN_BYTES_MAX of them, `history`, `describe`), whose columns are maps of 6 short fields: a
# 1,000-column schema of short names is 71 KiB and 7,000 items, about 10 bytes an item, so a
# full frame of them holds about 410,000 items (a `files` page of 10,000 files, 5 each,
# 50,000). About 2.4 times that: a hostile reply costs a client at most about 0.5 s
# and 120 MiB (a map of 840,000 short keys, within it; nested empty arrays are refused after
# 0.47 s and 65 MiB, where they took 1.1 s and 284 MiB).
CLIENT_REPLY_ITEMS_MAX: Final = 1_000_000
CLIENT_CONNECTIONS_MAX: Final = 1024
CLIENT_INFLIGHT_PER_CONNECTION_MAX: Final = 64
# Reply bytes one connection may have queued (handed to its transport, not yet taken by the
# socket) before the server stops reading its requests. Without it a client that pipelines
# requests with large replies (`files` pages, `history`, `txn_log`: ~2 MiB each) and never
# reads made the node hold CLIENT_INFLIGHT_PER_CONNECTION_MAX replies of up to
# CLIENT_FRAME_BYTES_MAX each (256 MiB), on each of CLIENT_CONNECTIONS_MAX connections. Past
# it the connection reads nothing more until its transport has drained to its low-water mark
# (the standard asyncio backpressure); requests already running still finish and reply, so one
# connection holds at most this plus the replies of its requests in flight. Two full frames:
# a client that reads keeps a few pages of a paged listing in the pipe and is never paused
# for one large reply.
CLIENT_REPLY_BYTES_PER_CONNECTION_MAX: Final = 2 * CLIENT_FRAME_BYTES_MAX
# A connection with nothing in flight, no reply waiting and nothing received for this long is
# closed. So is one whose socket took no byte of its waiting replies for this long (within
# twice this when the client also sent nothing), paused by CLIENT_REPLY_BYTES_PER_CONNECTION_MAX
# or not, requests in flight or not: its client stopped reading, and a request of it blocked
# on the socket would otherwise keep the connection forever. A slow reader that takes some
# bytes in each such period is served, however long it takes; after a pause the
# CLIENT_FRAME_TIMEOUT_MS of a frame it was sending starts again (its bytes may have waited in
# the socket because the server was not reading).
CLIENT_IDLE_TIMEOUT_MS: Final = 5 * 60 * 1000
# A frame must complete within this long after its first byte (slow clients cannot pin memory).
CLIENT_FRAME_TIMEOUT_MS: Final = 10_000
# Before `hello` succeeds a connection is a stranger: it must authenticate within this, may make
# us buffer at most this many bytes, and at the connection limit the oldest stranger is closed
# to make room, so a flood of idle or slow connections cannot lock clients out.
CLIENT_HELLO_TIMEOUT_MS: Final = 5_000
CLIENT_CONNECTIONS_SLACK: Final = 64
CLIENT_HELLO_BYTES_MAX: Final = 16 * 1024
# An error reply's message is cut past this many characters, and each of its details whose
# msgpack encoding passes ERROR_DETAIL_BYTES_MAX is replaced by a brief repr of it. Errors quote
# what a client sent briefly where they are raised; this is the last guard (a request holds
# up to CLIENT_FRAME_BYTES_MAX, and an error reply past it could not be sent at all).
ERROR_MESSAGE_CHARS_MAX: Final = 4_096
ERROR_DETAIL_BYTES_MAX: Final = 1_024
OP_NAME_CHARS_MAX: Final = 64
TOKEN_CHARS_MAX: Final = 256
CLIENT_NAME_CHARS_MAX: Final = 256
TABLE_NAME_CHARS_MAX: Final = 2 * 128 + 1
NODE_ID_MAX: Final = 2**31 - 1
REQUEST_TIMEOUT_MS_DEFAULT: Final = 5_000
# A DDL waits this long at most (and within its timeout_ms) for round trips with its peers to
# measure this node's clock (RaftNode.clock_checked) before it answers NOT_READY: the first
# comes within a heartbeat or two of a start or an election; a node started with its clock
# far off fences itself within seconds instead. Looked at every CLOCK_CHECK_POLL_MS.
CLOCK_CHECK_WAIT_MS: Final = 3_000
CLOCK_CHECK_POLL_MS: Final = 20
REQUEST_TIMEOUT_MS_MAX: Final = 60_000
# Forwarded requests to the leader: connections kept per (leader, token).
FORWARD_CONNECTIONS_MAX: Final = 64

# `files` replies (paged): at most this many files and about this many bytes of paths per page,
# well below CLIENT_FRAME_BYTES_MAX whatever the paths' length (each file costs its path plus
# about FILES_ENTRY_OVERHEAD_BYTES of sizes, counts and keys in msgpack).
FILES_PAGE_FILES_MAX: Final = 10_000
FILES_PAGE_BYTES_MAX: Final = 2 * 1024 * 1024
FILES_ENTRY_OVERHEAD_BYTES: Final = 96

# `pts_list` records per page: a record names at most 100 targets (~25 KiB with long names).
PTS_PAGE_RECORDS_MAX: Final = 100

# Keyset pages of `session_list`, `lease_list`, `lease_blockers` (a session's or lease's view
# carries up to ~1.2 KiB of labels) and `gc_status` (one row per table incarnation, whose
# `protections` lists at most GC_STATUS_PROTECTION_IDS_MAX ids; `pts list` has them all).
SESSION_PAGE_MAX: Final = 1_000
LEASE_PAGE_MAX: Final = 1_000
GC_STATUS_PAGE_TABLES_MAX: Final = 500
# A DROP NAMESPACE CASCADE reply names at most this many of the tables it dropped (about
# 260 KiB of names) and counts them all (`dropped_table_count`).
DROPPED_TABLES_REPLY_MAX: Final = 1_000
# A `pin` reply's schemas (each version carries its whole schema; up to 100 tables): past
# this, the pin is refused (LIMIT_EXCEEDED, before any lease) and the caller pins fewer tables
# per request at the same ts. The rest of the frame is left for the lease result.
PIN_BYTES_MAX: Final = CLIENT_FRAME_BYTES_MAX - 256 * 1024

# `job_list` views per page (all of them: MAX_RUNNING_SCHEMA_JOBS + MAX_FINISHED_SCHEMA_JOBS_KEPT)
# and about this many bytes of them (a view names up to 100 blockers); at least one per page.
JOBS_PAGE_MAX: Final = 1_256
JOBS_PAGE_BYTES_MAX: Final = 2 * 1024 * 1024

# `list_namespaces` per page, and about this many bytes of them (a namespace carries its
# comment and DBPROPERTIES: up to a 64 KiB statement's worth); at least one per page.
NAMESPACES_PAGE_MAX: Final = 1_000
NAMESPACES_PAGE_BYTES_MAX: Final = 2 * 1024 * 1024
# `list_tables` names per page: a name is at most TABLE_NAME_CHARS_MAX (257) characters, so a
# page stays near 1.3 MiB, far below CLIENT_FRAME_BYTES_MAX.
TABLES_PAGE_MAX: Final = 5_000
GC_STATUS_PROTECTION_IDS_MAX: Final = 20

# `history` (paged by version): every version carries its whole schema (up to 1000 columns
# with comments and defaults), so a page holds at most this many versions and about this many
# bytes of them (at least one version, whatever its size).
HISTORY_PAGE_VERSIONS_MAX: Final = 1_000
HISTORY_PAGE_BYTES_MAX: Final = 2 * 1024 * 1024

# `txn_log` pages end past about this many bytes of commits (a commit names up to 100 tables,
# ~26 KiB with long names; MAX_TXN_LOG_RECORDS of them do not fit one frame).
TXN_LOG_PAGE_BYTES_MAX: Final = 2 * 1024 * 1024

# `watch`: events per reply (an event is small: its tables, ids and counts), and how long one
# call may wait for the first new event (the client calls again: a long poll).
WATCH_EVENTS_PAGE_MAX: Final = 1_000
# ... and about this many bytes of them (a commit event names up to 100 tables): a page ends
# between entries once past it; an entry whose events alone are larger is split (`from_event`).
WATCH_PAGE_BYTES_MAX: Final = 2 * 1024 * 1024
WATCH_WAIT_MS_MAX: Final = 30_000

# A node answers file listings only while its safe time trails its clock by at most this; the
# leader's GC deletes a file only this long (plus CSmax) after the entry that freed it. So a
# node that stopped applying (cut off one way, stalled) cannot list files GC has deleted.
# Configurable per cluster (cluster.toml `read_staleness_max_ms`).
READ_STALENESS_MAX_MS_DEFAULT: Final = 2_000

# remove_node then revokes the removed node's certificates: attempts (and the pause between
# them) while leadership moves (a leader that removed itself hands over first).
REVOKE_ON_REMOVE_ATTEMPTS: Final = 5
REVOKE_ON_REMOVE_RETRY_S: Final = 0.5
REVOKE_ON_REMOVE_TIMEOUT_MS: Final = 2_000
# How long remove_node waits for each other member to say which certificates the node used.
CERTS_ASK_TIMEOUT_MS: Final = 1_500
# A follower forwarding a write waits for the leader's answer this much longer than the wait
# the leader was given, so the leader's own answer (TIMEOUT included) is what the caller gets.
FORWARD_REPLY_MARGIN_MS: Final = 1_000
# add_node / promote_node / remove_node: how long the leader waits for the membership change
# to commit, unless the caller gives `timeout_ms` (at most REQUEST_TIMEOUT_MS_MAX).
MEMBERSHIP_TIMEOUT_MS_DEFAULT: Final = 10_000
# remove_node's work on the leader besides the change itself, at most: asking the members which
# certificates the node presented, then every revocation attempt (each may be forwarded, as the
# leader may have removed itself) and the pauses between them. A forwarded remove_node (and the
# client) waits this much longer than the change's own timeout.
REMOVE_NODE_REVOCATION_MS_MAX: Final = CERTS_ASK_TIMEOUT_MS + REVOKE_ON_REMOVE_ATTEMPTS * (
    REVOKE_ON_REMOVE_TIMEOUT_MS + FORWARD_REPLY_MARGIN_MS + int(REVOKE_ON_REMOVE_RETRY_S * 1000)
)
# A graceful stop (SIGTERM) lets requests that run to their end detached (remove_node, gc_run:
# `ApiServer._run_detached`) finish for at most this long before it cancels them: cut at once,
# a removal could end between the membership change and its certificate revocation. A few
# seconds: a removal waiting out its whole timeout is cut all the same (with a warning).
DETACHED_WORK_STOP_GRACE_MS: Final = 5_000
# transfer_leader forwarded to the leader: the leader waits at most 5 s for the move.
TRANSFER_LEADER_FORWARD_TIMEOUT_MS: Final = 15_000
# A client connection whose certificate was just revoked reads nothing more; the requests it
# already had in flight get this long to reply before it is aborted. One of them may be the very
# request that revoked the certificate (e.g. `cert_revoke --force` of a member's certificate,
# forwarded to the leader by that member over a link that presents it): its reply is ready a few
# event-loop turns after the apply that closes the connection. The bound keeps a revoked client
# from holding a connection open with a long wait (`watch`, a wait for safe time).
REVOKED_CLIENT_REPLY_GRACE_MS: Final = 2_000

# `apply_version` and `apply_version_finalize` ask each member for its release's supported apply
# version; each ask waits at most this long (a member that is down must not hold the answer).
APPLY_VERSION_PROBE_TIMEOUT_MS: Final = 2_000

# Reads of the applied state that take a client's read floor (`min_ts`) when asked without
# `as_of`: the node waits until its safe time reaches the floor before it reads, and the reply
# says the position it read at (`safe_time`), so a client's reads never go back in time when it
# asks another node (monotonic reads; docs/protocol.md). `schema_at` takes one too (`_at`).
# The protocol client sends its floor to nodes that advertise `read_floor` in their hello.
STATE_FLOOR_OPS: Final = frozenset(
    {
        "describe",
        "history",
        "list_namespaces",
        "list_tables",
        "txn_log",
        "session_list",
        "lease_list",
        "lease_blockers",
        "pts_list",
        "pts_show",
        "gc_status",
        "job_list",
        "job_show",
        "watch",
    }
)

# How far ahead of the caller's clock a protection's ts may be: as far as a cluster's clocks may
# be apart (a ts read from a node whose clock runs ahead is fine), and no further.
PROTECT_AHEAD_MS_MAX: Final = MAX_CLOCK_SKEW_MS


def refuse_protection_ahead(ts: object, *, now_ms: int) -> None:
    """Raise InvalidArgumentError when `ts` is more than PROTECT_AHEAD_MS_MAX past `now_ms`
    (the caller's physical clock). A protection of reads at >= a time still to come holds
    nothing the GC could delete now, yet reads as success: a year typed wrong (2062 for 2026)
    left the data it was meant for unprotected. Every client-side way to protect applies it
    before any request (`MetastoreClient.protect`, so the Spark bridge's `protect()`, and the
    CLI's `pts protect --ts`), and a node to every `pts_protect` with its own clock, before
    proposing (a client of another make, or of an earlier release). A `ts` that is no HLC
    timestamp at all (a float, a negative number, past 64 bits) is InvalidArgumentError too:
    the library's callers pass what their users typed."""
    if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= MAX_TS:
        raise InvalidArgumentError(
            f"'ts' must be an HLC timestamp (an integer 0..{MAX_TS}), got {show_value(ts)}",
            details={"ts": brief_repr(ts)},
        )
    ahead_ms = physical_ms(ts) - now_ms
    if ahead_ms <= PROTECT_AHEAD_MS_MAX:
        return
    raise InvalidArgumentError(
        f"{ts_text(ts)} is in the future by {span_text(ahead_ms)}: a protection of reads from "
        "a time still to come protects nothing the GC may delete now (protect from now or an "
        f"earlier time; a cluster tolerates at most {span_text(PROTECT_AHEAD_MS_MAX)} of "
        "clock skew)",
        details={"ts": ts, "ahead_ms": ahead_ms, "max_ahead_ms": PROTECT_AHEAD_MS_MAX},
    )
