"""Our Raft engine (see ARCHITECTURE.md).

`raft.core` is a deterministic state machine (ticks and messages in, a `Ready` batch out) with no
sockets, files, clocks or threads. Around it: `raft.wal` (the fsync'd log and snapshots),
`raft.wire`/`raft.framing` (peer messages as length-prefixed msgpack frames), `raft.transport`
(asyncio peer links with cluster-secret authentication) and `raft.node` (the driver that owns all
of them and offers `propose`, an apply callback, safe time and status to the layer above).

Raft knows nothing of tables: commands are opaque bytes.
"""
