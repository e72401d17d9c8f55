"""The largest valid request of each write (and of each read a follower asks its leader) gives
the same answer whichever node receives it; one past a limit gives the same typed error on every
node and changes nothing.

A follower turns a write into a canonical command and forwards it to the leader (`_propose`, or
the op itself for membership, GC and linearizable reads), whose checks and limits then apply a
second time: frame bytes, item budgets, command byte bounds, and the follower's reply frame for
what the leader answered. An earlier bug refused the largest commit through a follower only (the
leader checked a forwarded command against the DDL bound); this module sends the largest request
of every op that can be forwarded through the leader and through a follower. One cluster for the
module; each op's setup is shared by its checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hlc.limits import LOGICAL_BITS
from metastore import limits
from metastore.commands import commit_txn_from_request, encode_command
from metastore.daemon import api_limits as L
from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

# Answers after which the same request is sent again (roles looked up again): an election
# during the call, which a loaded 2-core machine can cause. Requests are idempotent (a txn id,
# a record id, a session id) or checked for it.
RETRYABLE = frozenset({"NOT_LEADER", "UNAVAILABLE", "TIMEOUT", "NOT_READY"})
ATTEMPTS_MAX = 5
VIAS = ("leader", "follower")

# The longest names the catalog takes: a namespace and tables of MAX_IDENTIFIER_CHARS each.
NS = "n" * limits.MAX_IDENTIFIER_CHARS
TABLES = [
    f"{NS}.{'t' * (limits.MAX_IDENTIFIER_CHARS - 3)}{i:03d}"
    for i in range(limits.MAX_TABLES_PER_COMMIT + 1)
]
MAX_TABLES = TABLES[: limits.MAX_TABLES_PER_COMMIT]


def _pipelined(cl: RawClient, op: str, many_args: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every request before reading any reply (at most the in-flight bound at once)."""
    from raft.framing import encode_frame

    replies: dict[int, dict[str, Any]] = {}
    chunk = L.CLIENT_INFLIGHT_PER_CONNECTION_MAX
    for start in range(0, len(many_args), chunk):
        ids = []
        for args in many_args[start : start + chunk]:
            cl.next_id += 1
            ids.append(cl.next_id)
            cl.send_raw(
                encode_frame(
                    {"id": cl.next_id, "op": op, "args": args}, max_frame_bytes=4 * 1024 * 1024
                )
            )
        for _ in ids:
            reply = cl.recv()
            assert reply is not None
            replies[reply["id"]] = reply
    return [replies[i] for i in sorted(replies)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("maxreq")) as c:
        c.start_all()
        leader = c.wait_ready()
        admin = c.client(leader)
        try:
            assert admin.call("ddl", sql=f"CREATE NAMESPACE {NS}", timeout_ms=20_000)["ok"]
            created = _pipelined(
                admin,
                "ddl",
                [{"sql": f"CREATE TABLE {t} (a INT)", "timeout_ms": 30_000} for t in TABLES],
            )
            assert all(r["ok"] for r in created), [r["error"] for r in created if not r["ok"]]
        finally:
            admin.close()
        yield c


def _node(cluster: MetastoreCluster, via: str) -> int:
    leader = cluster.wait_ready()
    return leader if via == "leader" else next(i for i in cluster.ids if i != leader)


def _call(
    cluster: MetastoreCluster, via: str, op: str, role: str = "admin", **args: Any
) -> dict[str, Any]:
    """`op` sent to the leader or to a follower (looked up again on each attempt)."""
    reply: dict[str, Any] = {}
    for _ in range(ATTEMPTS_MAX):
        cl = cluster.client(_node(cluster, via), role=role)
        try:
            reply = cl.call(op, **args)
        finally:
            cl.close()
        if reply["ok"] or reply["error"]["code"] not in RETRYABLE:
            return reply
    return reply


def _on_both(
    cluster: MetastoreCluster, op: str, args_for: Callable[[str], dict[str, Any]], **kw: Any
) -> dict[str, dict[str, Any]]:
    return {via: _call(cluster, via, op, **kw, **args_for(via)) for via in VIAS}


def _assert_ok_alike(replies: dict[str, dict[str, Any]], *, differ: set[str]) -> None:
    for via, reply in replies.items():
        assert reply["ok"], (via, reply["error"])
    kept = [{k: v for k, v in r["result"].items() if k not in differ} for r in replies.values()]
    assert kept[0] == kept[1]


def _assert_refused_alike(replies: dict[str, dict[str, Any]], code: str) -> dict[str, Any]:
    for via, reply in replies.items():
        assert not reply["ok"], (via, reply["result"])
        assert reply["error"]["code"] == code, (via, reply["error"])
    errors = [r["error"] for r in replies.values()]
    assert errors[0]["details"].get("limit") == errors[1]["details"].get("limit"), errors
    return errors[0]


# ---- commit ---------------------------------------------------------------------------------

# The shortest path the commit uses: past 255 characters msgpack gives every path the same
# 3-byte header, so each character added to a path adds one byte to the command.
PATH_CHARS_MIN = 256


def _commit_request(tag: str, extra_bytes: int, read_ts: int) -> dict[str, Any]:
    """A commit of MAX_FILES_PER_COMMIT files over MAX_TABLES_PER_COMMIT tables, reading as
    many at `read_ts`, whose command is exactly MAX_COMMIT_COMMAND_BYTES + `extra_bytes`
    long."""
    per_table = limits.MAX_FILES_PER_COMMIT // len(MAX_TABLES)

    def request(lengths: list[int]) -> dict[str, Any]:
        files = iter(range(limits.MAX_FILES_PER_COMMIT))
        writes = []
        for table in MAX_TABLES:
            adds = []
            for _ in range(per_table):
                i = next(files)
                stem = f"_txn/{tag}/part-{i:05d}-"
                adds.append(
                    {
                        "path": stem + "x" * (lengths[i] - len(stem) - 8) + ".parquet",
                        "size_bytes": 2**40 + i,
                        "row_count": 2**30 + i,
                    }
                )
            writes.append({"table": table, "schema_version": 1, "add": adds})
        return {
            "txn_id": f"{tag}-" + "i" * (limits.MAX_TXN_ID_CHARS - len(tag) - 1),
            "writes": writes,
            "read_tables": MAX_TABLES,
            "read_ts": read_ts,
        }

    lengths = [PATH_CHARS_MIN] * limits.MAX_FILES_PER_COMMIT
    base = len(encode_command(commit_txn_from_request(request(lengths))))
    missing = limits.MAX_COMMIT_COMMAND_BYTES + extra_bytes - base
    room = limits.MAX_FILE_PATH_CHARS - PATH_CHARS_MIN
    for i in range(limits.MAX_FILES_PER_COMMIT):
        grow = min(room, missing)
        lengths[i] += grow
        missing -= grow
    assert missing == 0
    return request(lengths)


def test_the_largest_commit_succeeds_alike_and_one_byte_more_is_refused_alike(
    cluster: MetastoreCluster,
) -> None:
    replies = _on_both(
        cluster,
        "commit",
        lambda via: {**_commit_request(f"max-{via}", 0, cluster_ts(cluster)), "timeout_ms": 30_000},
        role="writer",
    )
    _assert_ok_alike(replies, differ={"txn_id", "ts", "tm", "deduplicated"})
    result = replies["follower"]["result"]
    assert result["files_added"] == limits.MAX_FILES_PER_COMMIT
    assert len(result["tables"]) == limits.MAX_TABLES_PER_COMMIT
    # A forwarded read of it: the follower relays the leader's record of 100 long names.
    txn_id = _commit_request("max-leader", 0, 1)["txn_id"]
    shown = _on_both(cluster, "committed_txn", lambda via: {"txn_id": txn_id})
    _assert_ok_alike(shown, differ={"last_commit_ts", "remembered_txns", "oldest_remembered_ts"})
    assert shown["follower"]["result"]["txn"]["txn_id"] == txn_id

    over = _on_both(
        cluster,
        "commit",
        lambda via: {
            **_commit_request(f"over-{via}", 1, cluster_ts(cluster)),
            "timeout_ms": 30_000,
        },
        role="writer",
    )
    error = _assert_refused_alike(over, "LIMIT_EXCEEDED")
    assert error["details"]["limit"] == "MAX_COMMIT_COMMAND_BYTES"
    for via in VIAS:
        txn_id = _commit_request(f"over-{via}", 1, 1)["txn_id"]
        shown_over = _call(cluster, via, "committed_txn", txn_id=txn_id)
        assert shown_over["ok"] and shown_over["result"]["txn"] is None


def test_a_commit_past_each_count_limit_is_refused_alike(cluster: MetastoreCluster) -> None:
    def files(tag: str, n: int) -> list[dict[str, Any]]:
        return [
            {"path": f"_txn/{tag}/f{i}.parquet", "size_bytes": 1, "row_count": 1} for i in range(n)
        ]

    too_many_files = _on_both(
        cluster,
        "commit",
        lambda via: {
            "txn_id": f"files-{via}",
            "writes": [
                {"table": MAX_TABLES[0], "schema_version": 1, "add": files(via, 10_001)},
            ],
        },
        role="writer",
    )
    assert _assert_refused_alike(too_many_files, "LIMIT_EXCEEDED")["details"]["limit"] == (
        "MAX_FILES_PER_COMMIT"
    )
    too_many_tables = _on_both(
        cluster,
        "commit",
        lambda via: {
            "txn_id": f"tables-{via}",
            "writes": [
                {"table": t, "schema_version": 1, "add": files(f"{via}-{i}", 1)}
                for i, t in enumerate(TABLES)
            ],
        },
        role="writer",
    )
    assert _assert_refused_alike(too_many_tables, "LIMIT_EXCEEDED")["details"]["limit"] == (
        "MAX_TABLES_PER_COMMIT"
    )
    longest = "_txn/p/" + "x" * (limits.MAX_FILE_PATH_CHARS - len("_txn/p/"))
    for chars, ok in ((limits.MAX_FILE_PATH_CHARS, True), (limits.MAX_FILE_PATH_CHARS + 1, False)):
        replies = _on_both(
            cluster,
            "commit",
            lambda via, chars=chars: {
                "txn_id": f"path-{chars}-{via}",
                "writes": [
                    {
                        "table": MAX_TABLES[1],
                        "schema_version": 1,
                        "add": [
                            {
                                "path": (via[0] + longest + "y")[:chars],
                                "size_bytes": 1,
                                "row_count": 1,
                            }
                        ],
                    }
                ],
            },
            role="writer",
        )
        if ok:
            _assert_ok_alike(replies, differ={"txn_id", "ts", "tm", "deduplicated"})
        else:
            codes = {r["error"]["code"] for r in replies.values() if not r["ok"]}
            assert len(codes) == 1 and not any(r["ok"] for r in replies.values()), replies


# ---- DDL ------------------------------------------------------------------------------------


def _create_sql(name: str, extra_bytes: int) -> str:
    """CREATE TABLE of MAX_COLUMNS_PER_TABLE commented columns, exactly MAX_STATEMENT_BYTES +
    `extra_bytes` long."""
    head = f"CREATE TABLE {NS}.{name} ("
    cols = [f"c{i:03d} STRING NOT NULL COMMENT 'x'" for i in range(limits.MAX_COLUMNS_PER_TABLE)]
    sql = head + ", ".join(cols) + ")"
    missing = limits.MAX_STATEMENT_BYTES + extra_bytes - len(sql.encode())
    room = limits.MAX_COMMENT_CHARS - 1
    for i in range(len(cols)):
        grow = min(room, missing)
        cols[i] = cols[i].replace("'x'", "'" + "x" * (1 + grow) + "'")
        missing -= grow
    assert missing == 0
    sql = head + ", ".join(cols) + ")"
    assert len(sql.encode()) == limits.MAX_STATEMENT_BYTES + extra_bytes
    return sql


def _alter_sql(table: str, count: int, extra_bytes: int) -> str:
    """ALTER TABLE ADD COLUMNS of `count` commented columns, MAX_STATEMENT_BYTES +
    `extra_bytes` long."""
    head = f"ALTER TABLE {table} ADD COLUMNS ("
    cols = [f"d{i:03d} DECIMAL(38,10) COMMENT 'x' FIRST" for i in range(count)]
    sql = head + ", ".join(cols) + ")"
    missing = limits.MAX_STATEMENT_BYTES + extra_bytes - len(sql.encode())
    for i in range(len(cols)):
        grow = min(limits.MAX_COMMENT_CHARS - 1, missing)
        cols[i] = cols[i].replace("'x'", "'" + "x" * (1 + grow) + "'")
        missing -= grow
    assert missing == 0
    return head + ", ".join(cols) + ")"


DDL_DIFFER = {"table", "table_id", "location", "tm", "tu", "waited_ms", "deduplicated"}


def test_the_largest_ddl_succeeds_alike_and_past_it_is_refused_alike(
    cluster: MetastoreCluster,
) -> None:
    names = {"leader": "wide_l", "follower": "wide_f"}
    created = _on_both(
        cluster,
        "ddl",
        lambda via: {"sql": _create_sql(names[via], 0), "timeout_ms": 30_000},
        role="writer",
    )
    _assert_ok_alike(created, differ=DDL_DIFFER)
    described = _on_both(cluster, "describe", lambda via: {"table": f"{NS}.{names[via]}"})
    _assert_ok_alike(
        described, differ={"table", "table_id", "tm", "tu", "created_tu", "location", "safe_time"}
    )
    over = _on_both(
        cluster, "ddl", lambda via: {"sql": _create_sql(names[via] + "2", 1)}, role="writer"
    )
    assert _assert_refused_alike(over, "LIMIT_EXCEEDED")["details"]["limit"] == (
        "MAX_STATEMENT_BYTES"
    )
    # The widest ALTER: as many columns as the table may still take, the statement full.
    narrow = {"leader": MAX_TABLES[2], "follower": MAX_TABLES[3]}
    room = limits.MAX_COLUMNS_PER_TABLE - 1
    altered = _on_both(
        cluster,
        "ddl",
        lambda via: {"sql": _alter_sql(narrow[via], room, 0), "timeout_ms": 30_000},
        role="writer",
    )
    _assert_ok_alike(altered, differ=DDL_DIFFER)
    # One column too many: refused by apply on the leader, through either node.
    over_alter = _on_both(
        cluster,
        "ddl",
        lambda via: {"sql": _alter_sql(MAX_TABLES[4 + VIAS.index(via)], room + 1, 0)},
        role="writer",
    )
    _assert_refused_alike(over_alter, "LIMIT_EXCEEDED")
    for via in VIAS:
        described = _call(cluster, via, "describe", table=MAX_TABLES[4 + VIAS.index(via)])
        assert described["ok"] and described["result"]["version"] == 1


# ---- protections ----------------------------------------------------------------------------


def test_the_largest_protection_succeeds_alike_and_past_it_is_refused_alike(
    cluster: MetastoreCluster,
) -> None:
    def protect(via: str, tables: list[str], namespaces: list[str]) -> dict[str, Any]:
        return {
            "record_id": f"{via}-" + "r" * (limits.MAX_PROTECTION_ID_CHARS - len(via) - 1),
            "ts": cluster_ts(cluster),
            "tables": tables,
            "namespaces": namespaces,
            "meta_type": "m" * limits.MAX_SESSION_LABEL_CHARS,
            "meta": "é" * limits.MAX_PROTECTION_META_CHARS,
            "max_age_ms": limits.GC_TTL_MS_MAX,
            "timeout_ms": 20_000,
        }

    replies = _on_both(cluster, "pts_protect", lambda via: protect(via, MAX_TABLES, []))
    _assert_ok_alike(
        replies, differ={"record_id", "ts", "created_tm", "expires_tm", "applied_tm", "created_by"}
    )
    # One target more (the tables and a namespace): a named limit, refused before it is
    # proposed (it was MALFORMED_COMMAND from the leader's decoder, without details).
    over = _on_both(cluster, "pts_protect", lambda via: protect(via + "x", MAX_TABLES, [NS]))
    error = _assert_refused_alike(over, "LIMIT_EXCEEDED")
    assert error["details"]["limit"] == "MAX_TARGETS_PER_PROTECTION"
    for via in VIAS:
        shown = _call(cluster, via, "pts_show", record_id=protect(via + "x", [], [])["record_id"])
        assert shown["error"]["code"] == "PROTECTION_NOT_FOUND", shown
    for via in VIAS:
        released = _call(cluster, via, "pts_release", record_id=protect(via, [], [])["record_id"])
        assert released["ok"], released


def test_a_protection_from_a_time_still_to_come_is_refused_by_every_node(
    cluster: MetastoreCluster,
) -> None:
    """A `pts_protect` at a ts more than PROTECT_AHEAD_MS_MAX past the node's clock (a year
    typed wrong) protects nothing the GC may delete now, yet read as success: every node
    refuses it with INVALID_ARGUMENT before proposing, whatever client sent it (the client
    library refuses it too, but a client of another make need not), and nothing is created.
    A ts as far ahead as a cluster's clocks may be apart is still taken."""
    ahead_ms = L.PROTECT_AHEAD_MS_MAX + 3_600_000

    def protect(via: str, ahead: int) -> dict[str, Any]:
        return {
            "record_id": f"ahead-{via}-{ahead}",
            "ts": cluster_ts(cluster) + (ahead << LOGICAL_BITS),
            "namespaces": [NS],
            "timeout_ms": 20_000,
        }

    refused = _on_both(cluster, "pts_protect", lambda via: protect(via, ahead_ms))
    error = _assert_refused_alike(refused, "INVALID_ARGUMENT")
    assert error["details"]["max_ahead_ms"] == L.PROTECT_AHEAD_MS_MAX
    assert error["details"]["ahead_ms"] > L.PROTECT_AHEAD_MS_MAX
    for via in VIAS:
        shown = _call(cluster, via, "pts_show", record_id=f"ahead-{via}-{ahead_ms}")
        assert shown["error"]["code"] == "PROTECTION_NOT_FOUND", shown
    taken = _on_both(cluster, "pts_protect", lambda via: protect(via, 1_000))
    for via, reply in taken.items():
        assert reply["ok"], (via, reply["error"])
        released = _call(cluster, via, "pts_release", record_id=reply["result"]["record_id"])
        assert released["ok"], released


def cluster_ts(cluster: MetastoreCluster) -> int:
    reply = _call(cluster, "leader", "read_ts")
    assert reply["ok"], reply
    ts: int = reply["result"]["ts"]
    return ts


LABEL = "ü" * limits.MAX_SESSION_LABEL_CHARS

# ---- sessions, pins and leases --------------------------------------------------------------


def test_the_largest_session_pin_and_lease_requests_succeed_alike(
    cluster: MetastoreCluster,
) -> None:
    def session_id(via: str) -> str:
        return via[0] + "s" * (limits.MAX_SESSION_ID_CHARS - 1)

    opened = _on_both(
        cluster,
        "session_open",
        lambda via: {
            "session_id": session_id(via),
            **dict.fromkeys(
                ("app_id", "app_name", "host", "user"), "ü" * limits.MAX_SESSION_LABEL_CHARS
            ),
            "pid": 2**31 - 1,
            "started_at_ms": 2**62,
            "ttl_ms": limits.SESSION_TTL_MS_MAX,
        },
        role="writer",
    )
    _assert_ok_alike(opened, differ={"session_id", "deadline_tm"})
    top = cluster_ts(cluster)
    pinned = _on_both(
        cluster,
        "pin",
        lambda via: {
            "tables": MAX_TABLES,
            "ts": top,
            "session_id": session_id(via),
            "reads": MAX_TABLES,
            "timeout_ms": 20_000,
        },
        role="writer",
    )
    for via, reply in pinned.items():
        assert reply["ok"], (via, reply["error"])
    assert pinned["leader"]["result"]["pins"] == pinned["follower"]["result"]["pins"]
    leases = [pinned[v]["result"]["lease"] for v in VIAS]
    assert [len(lease["leases"]) for lease in leases] == [limits.MAX_LEASES_PER_COMMAND] * 2
    assert leases[0]["leases"] == leases[1]["leases"]
    over = _on_both(
        cluster,
        "pin",
        lambda via: {"tables": TABLES, "ts": top, "session_id": session_id(via)},
        role="writer",
    )
    _assert_refused_alike(over, "LIMIT_EXCEEDED")
    keys = [
        {"table": p["table"], "table_id": p["table_id"], "version": p["version"]}
        for p in pinned["leader"]["result"]["pins"]
    ]
    released = _on_both(
        cluster,
        "lease_release",
        lambda via: {"session_id": session_id(via), "leases": keys},
        role="writer",
    )
    _assert_ok_alike(released, differ={"session_id", "release_tm"})
    acquired = _on_both(
        cluster,
        "lease_acquire",
        lambda via: {"session_id": session_id(via), "leases": keys, "read_ts": top},
        role="writer",
    )
    _assert_ok_alike(acquired, differ={"session_id", "deadline_tm"})
    expired = _on_both(
        cluster,
        "session_expire",
        lambda via: {
            "session_ids": [session_id(via)]
            + [f"x{i:02d}" + "e" * 61 for i in range(limits.MAX_LEASES_PER_COMMAND - 1)]
        },
    )
    _assert_ok_alike(expired, differ={"expired"})
    over_expire = _on_both(
        cluster,
        "session_expire",
        lambda via: {"session_ids": [f"{i:03d}" for i in range(limits.MAX_LEASES_PER_COMMAND + 1)]},
    )
    _assert_refused_alike(over_expire, "LIMIT_EXCEEDED")


# ---- membership, GC and backup --------------------------------------------------------------


def test_membership_gc_and_snapshot_requests_at_their_limits_answer_alike(
    cluster: MetastoreCluster,
) -> None:
    from metastore.daemon.config import NODE_ID_MAX as CONFIG_NODE_ID_MAX

    host = ".".join(["h" * 63] * 3 + ["h" * 61])  # 253 characters: the longest DNS name
    ids = {"leader": CONFIG_NODE_ID_MAX, "follower": CONFIG_NODE_ID_MAX - 1}
    added = _on_both(
        cluster,
        "add_node",
        lambda via: {
            "node_id": ids[via],
            "raft_address": f"{host}:65535",
            "client_address": f"{host}:65534",
            "learner": True,
        },
    )
    _assert_ok_alike(added, differ={"index"})
    over = _on_both(
        cluster,
        "add_node",
        lambda via: {"node_id": CONFIG_NODE_ID_MAX + 1, "raft_address": f"{host}:1"},
    )
    _assert_refused_alike(over, "INVALID_ARGUMENT")
    longer = _on_both(
        cluster,
        "add_node",
        lambda via: {"node_id": ids[via], "raft_address": "1:1", "client_address": f"h{host}:1"},
    )
    _assert_refused_alike(longer, "INVALID_ARGUMENT")
    # The learners can never catch up (no such host): the leader's own refusal, either way.
    promoted = _on_both(cluster, "promote_node", lambda via: {"node_id": ids[via]})
    error = _assert_refused_alike(promoted, "INVALID_ARGUMENT")
    assert error["details"]["reason"] == "learner_behind"
    moved = _on_both(cluster, "transfer_leader", lambda via: {"target": ids[via]})
    codes = {via: r["ok"] or r["error"]["code"] for via, r in moved.items()}
    assert codes["leader"] == codes["follower"] and codes["leader"] is not True, moved
    removed = _on_both(
        cluster, "remove_node", lambda via: {"node_id": ids[VIAS[1 - VIAS.index(via)]]}
    )
    _assert_ok_alike(removed, differ={"index"})

    gc = _on_both(cluster, "gc_run", lambda via: {"dry_run": True, "timeout_ms": 30_000})
    for via, reply in gc.items():
        assert reply["ok"], (via, reply["error"])
    assert len(gc["leader"]["result"]["tables"]) == len(gc["follower"]["result"]["tables"])

    for via in VIAS:
        begun = _call(cluster, via, "snapshot_begin", timeout_ms=20_000)
        assert begun["ok"], (via, begun["error"])
