"""Apply versions: how a cluster upgrades without two releases applying one log differently.

Every node must reach the same state from the same log. A release that changes what an entry
does (a new command type, a new check in apply) would break that while nodes of the previous
release still run, so such a change is gated on the *cluster's* apply version, a value in the
replicated state that only moves forward, through a `SetApplyVersion` entry:

* a rule new in version N applies only when `state.apply_version >= N` (`rules_at_least`);
  a command type new in version N is proposed only then;
* the leader proposes SetApplyVersion(N) only once every member reports a release that supports
  N (`metastore cluster version --finalize`), so during a rolling upgrade every node keeps
  applying the previous rules;
* a node that meets an entry its release cannot apply the same way (SetApplyVersion above what
  it supports, a command type or format it does not know, a snapshot at a higher version) stops
  with `ReleaseTooOldError` instead of applying it differently; once it runs a newer release
  it resumes from its log.

Releases before this mechanism are version 1 too: their rules are the same as version 1's.
"""

from __future__ import annotations

from typing import Final

# The newest apply version this release can apply. Raise it together with the rules it gates,
# and record here what each version changed.
#   1: every rule up to and including the release that introduced apply versions.
#   2: CREATE TABLE and ALTER TABLE refuse a schema version above MAX_SCHEMA_VERSION_BYTES
#      (before, 1,000 wide columns could make a table's schema unreadable: its reply
#      outgrew the client frame).
#      A commit may not add a path that another incarnation at an overlapping location has
#      queued for deletion by GC (before, the leader could delete it under that commit).
#      AcquireLeases and ReleaseLeases may carry `known_tm` / `renew_from`: a long-held lease
#      moves forward, and a release keeps a lease a crossing pin touched. Below version 2 a
#      node proposes them without those fields, and apply ignores them.
#      CREATE TABLE compares locations with `file://` dropped: `/w/t` and `file:///w/t` are one
#      directory, so a second live table there is refused.
#   3: QueueManifestFiles, a new command: the leader's GC moves the data files a dead manifest
#      lists into the table's GC queue before deleting them, so a commit adding one of them
#      again is refused (`queued_for_gc`) instead of losing its file to the deletion. Below
#      version 3 the leader deletes them straight from the manifest (as before) and apply
#      refuses the command (InvalidArgument, changing nothing).
#      AcquireLeases is refused (LimitExceeded, MAX_LEASES) when the cluster would hold more
#      than MAX_LEASES leases in all; before, only each session's count was bounded.
#      AcquireLeases and ReleaseLeases results name the leases acquired (new to the session)
#      and released (`acquired`, `released_leases`): results are recorded for request-id
#      retries, so their shape is state. The change feed lists only those.
#      The change feed's rules of the same release hold from version 3 too (events are derived
#      per node, not state, but nodes must agree: metastore.events FEED_RULES_VERSION): no
#      event for a retried open, a close of an ended session, a retried Protect or a release
#      of nothing held, and an `aborted` job event for a job a DROP ends.
#   4: Finished schema change jobs past MAX_FINISHED_SCHEMA_JOBS_KEPT are forgotten in the
#      order they ended; before, lowest job id first, so a long-running job that ended after
#      that many newer ones was forgotten by the entry that ended it (SCHEMA_JOB_NOT_FOUND for
#      a job that had just succeeded).
#      A job's count of files rewritten (SchemaJobBackfilled reports, up to 2^63-1 each) stops
#      at 2^63-1; before, three reports could take it past 2^64, and then no node could write
#      a snapshot (its log could never be compacted).
#      An ADD COLUMN ... NOT NULL DEFAULT job needs a backfill when the table may have a live
#      file (`TxnLog.may_hold_live_files`); before, its live file count decided, which
#      subtracts delete entries of manifests an overwrite truncated, and could be 0 with a file
#      live in a manifest: the column went public over a file that lacks it.
#   5: A removal of a loose path in a table with manifests also records a delete entry for the
#      path (counted against MAX_DELETE_ENTRIES_PER_TABLE). Before, it removed the loose entry
#      only: a path a protocol client had committed again after its first entry moved into a
#      manifest stayed listed by that manifest entry (and `table optimize` could copy its rows
#      twice). The delete entry hides, and a compaction folds it into, every manifest entry of
#      the path, as for a removal of a path that is in manifests only (metastore.txn `_plan`,
#      `delete_manifest_copies`; the leader's removal check passes the same rule).
#      ALTER TABLE matches the names it refers to (the column to drop, rename, alter or move,
#      an AFTER sibling, the struct to add a field to) as Spark does, with Java's
#      equalsIgnoreCase (`schema.spark_name_key`); before, by Python's casefold, which folds
#      `ß` to `ss` and ligatures to their letters, so `DROP COLUMN strasse` dropped `straße`
#      and `ALTER COLUMN file TYPE BIGINT` changed `ﬁle`, where Spark finds no such column.
#      Uniqueness of names is still checked by casefold.
#      ALTER COLUMN c TYPE (a widening) is refused (UNSUPPORTED_SCHEMA_CHANGE, reason
#      `default changes`) when c's DEFAULT would give rows of files older than c another value
#      than rows written since hold, or none (`schema.widened_default_problem`): FLOAT ->
#      DOUBLE of a default that is no exact FLOAT (DEFAULT 1.1 read 1.100000023841858 in every
#      row, then 1.1 in the older rows only), DATE -> TIMESTAMP_NTZ of a default with a time of
#      day ('2020-01-01 12:00:00') or beyond TIMESTAMP_NTZ's years (DATE '+999999-01-01': every
#      read of the older rows failed), or a default of a form the rule does not read (a
#      function). Before, any widening was applied whatever the default.
#      A commit's read-set check (`read_ts` + `read_tables`) also fails with READ_CONFLICT
#      when an incarnation of a read table's name was dropped with its activation (Tu) in
#      (read_ts, commit ts] (details `dropped_ts`, `table_id`; metastore.txn `check_reads`).
#      Before, only commits after read_ts conflicted, so a batch that read a table dropped
#      since (or dropped and created again, still empty) committed output computed from data
#      a read at its commit ts no longer gives. A creation is no conflict (the name was
#      absent at read_ts; the new incarnation is empty until a commit, which conflicts).
#      A commit is refused (LimitExceeded) when a written table's live rows or bytes of loose
#      files would exceed 2^63-1 (MAX_TABLE_LIVE_ROWS / _BYTES), or its rows in all would
#      (MAX_COMMIT_ROWS). Before, three files of 2^63-1 rows committed, and then no node could
#      write a snapshot (its commit record's row count outgrew msgpack's 64 bits), nor a
#      `files` reply of the table.
#      ALTER TABLE SET TBLPROPERTIES and UNSET TBLPROPERTIES of the GC TTL key replace and
#      remove it in every spelling (`catalog._apply_change`, `one_ttl_key`). Before, a table
#      created before the DDL wrote only `gc.ttl` kept its 'GC.TTL' = '1s' next to a later
#      SET 'gc.ttl' = '30d', and GC went on using the first in sorted order ('1s'); UNSET
#      'gc.ttl' refused (not set) or, with IF EXISTS, left the old TTL in force.
#   6: ALTER TABLE matches the names it refers to with Java's own equalsIgnoreCase table
#      (`metastore.java_case`, Java 17's simple case mappings, fixed in the code so no Python
#      release changes it); version 5's `spark_name_key` stood Python's full mappings in for
#      them, under which `İ` names no `i` (Java: `Character.toLowerCase('İ') == 'i'`), so
#      `DROP COLUMN İD` was COLUMN_NOT_FOUND where Spark drops `id`. A name that two siblings
#      match (`id` and `id` with a dotless i: two names to casefold, so both may exist) is
#      refused (INVALID_ARGUMENT, reason `ambiguous_column`), as Spark refuses it, unless one
#      is named exactly so (then that one); version 5 took the first, so `DROP COLUMN id`
#      dropped the dotless one. ADD COLUMN into a struct named that way (`İNFO`.y) checks
#      the struct's older fields under the struct's own name (below 6: COLUMN_NOT_FOUND).
#      A plain commit whose `not_before` is past the ahead bound (min(COMMIT_TS_AHEAD_MAX_MS,
#      DD) after the entry's Tm) by at most 2 CSmax is TIMESTAMP_AHEAD_OF_CLOCK (retryable:
#      the leader's clock gets there, and the same commit then succeeds); before, and still
#      further ahead than that, INVALID_ARGUMENT. A batch's not_before is its Top + 1, from a
#      node's clock that may lead the leader's by more than DD (500 ms), and that batch
#      failed for good (metastore.txn, "Commit timestamp rule").
#      SetMemberClientAddress, a new command (metastore.member_clients): `cluster add-node
#      --client-address` (or the leader's cluster.toml entry for the node) records a member's
#      client address in the state, so every member can forward requests to it once it leads;
#      before, only members whose own cluster.toml named it could. Below version 6 the leader
#      does not propose it (the node joins unrecorded, with a warning) and apply refuses it
#      (InvalidArgument, changing nothing). A state with a record is snapshotted as format 9
#      (metastore.state); one without keeps format 8, which the previous release reads.
#   7: No apply decision follows the Unicode data of the Python release that runs it (3.11
#      ships Unicode 14, 3.12 15.0, 3.13 15.1), so nodes of two releases decide alike.
#      Sibling names a command makes new (CREATE TABLE's columns and struct fields, ADD
#      COLUMN's column and fields, RENAME's new name, a schema job's pending column against
#      the public ones and the other jobs', a nested field against the struct's dropped ones)
#      must differ under Java's equalsIgnoreCase (`metastore.java_case`, the table ALTER
#      matches references with since 6; `schema.new_name_key`); before, under `str.casefold`,
#      whose folds change with Unicode releases and differ from Java's: `straße` and `STRASSE`,
#      or `ﬁle` and `FILE`, were one name (Spark: two), and `id` with a dotless i beside `id`
#      was allowed (a reference to either ambiguous, version 6). Names already siblings are
#      kept: from 7 the checks of a whole schema (an ALTER's result, each version published, a
#      snapshot) refuse identical names only (`schema.unique_names_key`). The decoder and the
#      DDL parser, which do not know the version, refuse only names equal under both rules (`a`
#      and `A`), so a name pair only casefold calls equal is refused by apply below 7
#      (COLUMN_ALREADY_EXISTS) instead of by the decoder (MALFORMED_COMMAND): nothing changes
#      either way.
#      An ADD COLUMN job's public step places the column after the sibling of that exact name
#      (recorded since 6), else the first Java takes for it; before, the first casefold match.
#      ALTER COLUMN TYPE's check of a DEFAULT (version 5, `schema.widened_default_problem`)
#      reads ASCII digits and strips ASCII whitespace only; before, `\d`, int() and strip()
#      took any Unicode digit and space, a set Unicode releases grow (15.0 added the Kawi and
#      Nag Mundari digits: a DATE default in them was no date to 3.11, a date to 3.12).
#      SetMemberClientAddress takes a host of printable ASCII characters but space; before,
#      any characters Python's `isprintable()` accepts (a character assigned in Unicode 15 is
#      unprintable to 3.11, printable to 3.12).
#   8: Protect of a table name that has no live incarnation protects the newest incarnation of
#      the name dropped after the record's ts (reads of the name AS OF T >= ts still reach it;
#      metastore.gc `_table_targets`), with any older one dropped after ts; TableNotFound only
#      when nothing of the name is readable at or after ts. Before, every named table had to
#      be live (TABLE_NOT_FOUND), although a name dropped and created again already covered
#      its dropped incarnations: after a DROP by mistake the data to restore could not be
#      protected by name, and a bridge's protect() block whose session was replaced (it
#      protects again by name) lapsed, letting GC delete what the block read.
#   9: ReleaseProtection with reason "release" (a client releasing its own record) is refused
#      (FORBIDDEN, details `record_id`, `created_by`, `by`) unless `by` is the record's
#      `created_by` (metastore.gc `release`, `owner_check`); before, a writer could release
#      another client's record by sending the command itself through `_propose`, where
#      `pts_release` asks for the admin role (reason "admin").
#      A commit whose txn id is remembered is deduplicated only if the whole request is the
#      recorded one: its writes and `ts`, `read_ts`, `read_tables` and stream position
#      (`not_before`, a lower bound a retry may raise, is left out; metastore.txn
#      `request_digest`), else TXN_ID_REUSED. Before, the writes alone were compared: a retry
#      asking for another `ts` got the first commit's result as success, at a ts it had not
#      asked for. A record made before version 9 holds the digest of its writes alone: a retry
#      of it with the same writes is deduplicated unless it asks for a `ts` other than the
#      commit's.
#      A NUL character (U+0000) in a request id, a comment (a namespace's, a table's, a
#      column's or a nested field's, ALTER COLUMN ... COMMENT) or a protection's `meta` is
#      refused (INVALID_ARGUMENT, reason `nul_character`; metastore.commands `refuse_nul`).
#      Before, it was stored, and a reader that ends text at a NUL (C strings: a Hive
#      client, a terminal) saw less than Spark did. The decoder, which does not know the
#      version, accepts it, so an older entry still decodes; the leader refuses it before
#      proposing on every version.
APPLY_VERSION_SUPPORTED: Final = 9

# A cluster that never applied SetApplyVersion (and every older snapshot) is at version 1.
INITIAL_APPLY_VERSION: Final = 1

# Bound on the value itself: a version is a small counter, never a timestamp.
MAX_APPLY_VERSION: Final = 1_000_000
