"""The slow pure work of the largest requests runs off the node's event loop, which also runs its
Raft: parsing a DDL, checking a commit's request, decoding a forwarded command. Each took a
fifth of a second to most of a second for the largest valid request (a 64 KiB ALTER of 999
columns, a commit of 10,000 files), and a leader whose loop stalls past the election timeout
loses its term: the largest ALTER sent to the leader failed NOT_LEADER every time
(tests/daemon/test_max_requests_any_node.py sends them to real nodes). And apply, which must run
on the loop, does not check a commit a second time after the decoder did.

Stub node and state machine, nothing started: which thread ran each step is what is checked."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

import metastore.daemon.server as server_module
import metastore.state as state_module
from hlc import HybridClock, SystemClock
from metastore import limits
from metastore.commands import commit_txn_from_request, decode_command, encode_command
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.errors import NotLeaderError, UnavailableError
from raft.core.types import Entry, EntryKind
from tests.metastore._driver import MS, T0, Driver


class _Follower:
    """A node that knows no leader: every proposal stops right after the work checked."""

    node_id = 2
    clock_fenced = ""  # its clock agrees with its peers' (a DDL checks before anything)

    def clock_checked(self) -> bool:
        return True

    def is_leader(self) -> bool:
        return False

    def leader_id(self) -> int:
        return 0


def _api() -> ApiServer:
    return ApiServer(
        node=_Follower(),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=Driver().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),  # a DDL reads it before proposing (its wait's anchor)
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="offload",
        client_addresses={},
    )


def _recording(
    monkeypatch: pytest.MonkeyPatch, name: str, threads: list[bool]
) -> Callable[..., Any]:
    """Replace server_module.`name` by a wrapper noting whether it ran on the loop's thread."""
    real = getattr(server_module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(server_module, name, wrapper)
    return wrapper


SESSION = SimpleNamespace(role=Role.WRITER, token="t", client="c")


def _commit_args(files: int) -> dict[str, Any]:
    adds = [
        {"path": f"_txn/a/part-{i:05d}.parquet", "size_bytes": 1, "row_count": 1}
        for i in range(files)
    ]
    return {"txn_id": "t1", "writes": [{"table": "ns.t", "schema_version": 1, "add": adds}]}


def test_a_ddl_is_parsed_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    on_loop: list[bool] = []
    _recording(monkeypatch, "parse_ddl", on_loop)
    with pytest.raises(UnavailableError):
        asyncio.run(_api()._ddl(SESSION, {"sql": "CREATE NAMESPACE ns"}))  # type: ignore[arg-type]
    assert on_loop == [False]


def test_a_commit_request_is_checked_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    on_loop: list[bool] = []
    _recording(monkeypatch, "commit_txn_from_request", on_loop)
    with pytest.raises(UnavailableError):
        asyncio.run(
            _api()._commit(SESSION, _commit_args(limits.MAX_FILES_PER_COMMIT))  # type: ignore[arg-type]
        )
    assert on_loop == [False]


def test_a_forwarded_command_is_decoded_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    on_loop: list[bool] = []
    _recording(monkeypatch, "decode_command", on_loop)
    data = encode_command(commit_txn_from_request(_commit_args(limits.MAX_FILES_PER_COMMIT)))
    with pytest.raises(NotLeaderError):
        asyncio.run(_api()._propose_op(SESSION, {"command": data}))  # type: ignore[arg-type]
    assert on_loop == [False]


def test_apply_checks_a_decoded_commit_once_and_a_ddl_by_its_versions_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decoder validates every command; apply validates again only what depends on the
    apply version (new names: DDL), not a commit (10,000 files: 0.2 s of every node's loop)."""
    sm = CatalogStateMachine()
    driver = Driver()
    sm.state = driver.state
    calls: list[str] = []
    real = state_module.validate_command

    def counting(cmd: Any, **kwargs: Any) -> None:
        calls.append(type(cmd).__name__)
        real(cmd, **kwargs)

    monkeypatch.setattr(state_module, "validate_command", counting)
    from metastore.ddl import parse_ddl

    tm = T0 + 10_000 * MS
    for index, data in enumerate(
        [
            encode_command(parse_ddl("CREATE NAMESPACE ns")),
            encode_command(parse_ddl("CREATE TABLE ns.t (a INT)")),
            encode_command(commit_txn_from_request(_commit_args(10))),
        ],
        start=driver.index + 1,
    ):
        tm += 1_000 * MS
        outcome = sm.apply(Entry(index=index, term=1, kind=EntryKind.NORMAL, data=data, tm=tm))
        assert outcome.ok, outcome
    assert calls == ["CreateNamespace", "CreateTable"]


class _Leader:
    """A leader that records what it was asked to propose."""

    node_id = 1

    def __init__(self) -> None:
        self.proposed: list[bytes] = []

    def is_leader(self) -> bool:
        return True

    async def propose(self, data: bytes, *, timeout_ms: int) -> object:
        self.proposed.append(data)
        raise AssertionError("proposed")


def test_a_command_past_its_byte_bound_is_refused_before_it_is_proposed() -> None:
    """A DDL's canonical command spells out its DEFAULTs (`1Y` is `CAST(1 AS TINYINT)`), so a
    statement within MAX_STATEMENT_BYTES can encode past MAX_COMMAND_BYTES (350 columns of
    50-element array DEFAULTs, which the DEFAULT token limits now refuse before parsing; a
    command past the bound is built directly here). It was proposed, and refused as
    MALFORMED_COMMAND without details by apply on every node (through a follower: by the
    leader's `_propose`). Now the limit's own error, and nothing in the log."""
    from metastore.commands import CreateTable, TableName
    from metastore.errors import LimitExceededError
    from metastore.schema import Column, Schema
    from metastore.types import Primitive, PrimitiveType

    columns = tuple(
        Column(
            name=f"c{i:03d}",
            type=PrimitiveType(kind=Primitive.STRING),
            nullable=True,
            comment="x" * limits.MAX_COMMENT_CHARS,
        )
        for i in range(300)
    )
    cmd = CreateTable(table=TableName(namespace="ns", name="t"), schema=Schema(columns=columns))
    assert len(encode_command(cmd)) > limits.MAX_COMMAND_BYTES
    node = _Leader()
    api = _api()
    api.node = node  # type: ignore[assignment]
    with pytest.raises(LimitExceededError) as refused:
        asyncio.run(api._propose_command(SESSION, cmd, 1000))  # type: ignore[arg-type]
    assert refused.value.details["limit"] == "MAX_COMMAND_BYTES"
    assert node.proposed == []


class _ApplyingLeader:
    """A leader whose proposals are committed at once: it applies each entry to `sm` on the
    loop, as raft.node does once the entry is committed."""

    node_id = 1

    def __init__(self, sm: CatalogStateMachine, driver: Driver) -> None:
        self.sm = sm
        self.driver = driver

    def is_leader(self) -> bool:
        return True

    async def propose(self, data: bytes, *, timeout_ms: int) -> object:
        self.driver.tm += 1_000 * MS
        self.driver.index += 1
        entry = Entry(index=self.driver.index, term=1, tm=self.driver.tm, data=data)
        return SimpleNamespace(result=self.sm.apply(entry), tm=entry.tm, index=entry.index)


def _leader_api() -> tuple[ApiServer, CatalogStateMachine]:
    driver = Driver()
    driver.sql("CREATE NAMESPACE ns").raise_for_error()
    driver.sql("CREATE TABLE ns.t (a INT)").raise_for_error()
    sm = CatalogStateMachine()
    sm.state = driver.state
    api = _api()
    api.node = _ApplyingLeader(sm, driver)  # type: ignore[assignment]
    api.sm = sm
    api.metrics = SimpleNamespace(commit=lambda seconds: None)  # type: ignore[assignment]
    return api, sm


@pytest.mark.parametrize("via", ["leader", "follower"])
def test_the_leader_applies_the_largest_commit_without_decoding_it_on_the_loop(
    monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """Apply runs on the leader's loop, and decoding the largest commit's entry took 40-50% of
    the time it held the loop (0.5-1.2 s in all on a loaded 2-core machine, past the 300 ms
    election timeout: an election after most such commits). The leader decoded that command
    already, off the loop (a forwarded one: `_propose`), or can (its own: `commit`), so the
    state machine is handed the decoded command with the entry's bytes; every decode of a
    big commit on the leader then runs in a thread. Both ways in: sent to the leader, and
    forwarded by a follower."""
    api, sm = _leader_api()
    import metastore.daemon.statemachine as statemachine_module

    on_loop: list[bool] = []
    _recording(monkeypatch, "decode_command", on_loop)
    real_decode = statemachine_module.decode_command

    def recording_apply_decode(*args: Any, **kwargs: Any) -> Any:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(statemachine_module, "decode_command", recording_apply_decode)
    args = _commit_args(limits.MAX_FILES_PER_COMMIT)
    if via == "leader":
        result = asyncio.run(api._commit(SESSION, args))  # type: ignore[arg-type]
    else:
        data = encode_command(commit_txn_from_request(args))
        result = asyncio.run(api._propose_op(SESSION, {"command": data}))  # type: ignore[arg-type]
        result = result["result"]
    assert result["files_added"] == limits.MAX_FILES_PER_COMMIT
    assert len(sm.state.files_at("ns.t", result["ts"])) == limits.MAX_FILES_PER_COMMIT
    assert on_loop and not any(on_loop), on_loop


def test_a_command_decoded_ahead_is_applied_as_its_bytes_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the state machine is handed with an entry's bytes is used only for an entry of
    exactly those bytes, once; any other entry is decoded from its own bytes."""
    import metastore.daemon.statemachine as statemachine_module

    api, sm = _leader_api()
    del api
    first = encode_command(commit_txn_from_request(_commit_args(3)))
    second_args = {
        "txn_id": "t2",
        "writes": [
            {
                "table": "ns.t",
                "schema_version": 1,
                "add": [{"path": "_txn/b/p.parquet", "size_bytes": 1, "row_count": 1}],
            }
        ],
    }
    second = encode_command(commit_txn_from_request(second_args))
    sm.expect_entry(first, decode_command(first))
    decoded: list[bytes] = []
    real_decode = statemachine_module.decode_command

    def recording(data: bytes, **kwargs: Any) -> Any:
        decoded.append(data)
        return real_decode(data, **kwargs)

    monkeypatch.setattr(statemachine_module, "decode_command", recording)
    tm = sm.state.last_tm
    for index, data in enumerate([second, first, first], start=sm.state.applied_index + 1):
        tm += 1_000 * MS
        sm.apply(Entry(index=index, term=1, tm=tm, data=data)).raise_for_error()
    # The second `first` is a repeat (deduplicated by its txn id), decoded from its bytes.
    assert decoded == [second, first]


def test_a_large_appended_entry_is_decoded_off_the_loop_before_it_is_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A follower's apply of the largest commit decoded it on the loop; told of the entry when
    it is appended (before it commits), the state machine decodes it in a thread, and apply
    takes that decode. A small entry is decoded by apply as before."""
    import metastore.daemon.statemachine as statemachine_module

    api, sm = _leader_api()
    del api
    on_loop: list[tuple[int, bool]] = []
    real_decode = statemachine_module.decode_command

    def recording(data: bytes, **kwargs: Any) -> Any:
        on_loop.append((len(data), threading.current_thread() is threading.main_thread()))
        return real_decode(data, **kwargs)

    monkeypatch.setattr(statemachine_module, "decode_command", recording)
    big = encode_command(commit_txn_from_request(_commit_args(limits.MAX_FILES_PER_COMMIT)))
    small_args = {
        "txn_id": "t2",
        "writes": [
            {
                "table": "ns.t",
                "schema_version": 1,
                "add": [{"path": "_txn/b/p.parquet", "size_bytes": 1, "row_count": 1}],
            }
        ],
    }
    small = encode_command(commit_txn_from_request(small_args))
    tm = sm.state.last_tm
    entries = []
    for index, data in enumerate([big, small], start=sm.state.applied_index + 1):
        tm += 1_000 * MS
        entries.append(Entry(index=index, term=1, tm=tm, data=data))
    sm.prepare_appended(entries)
    for entry in entries:
        sm.apply(entry).raise_for_error()
    assert on_loop == [(len(big), False), (len(small), True)]
    assert len(sm.state.files_at("ns.t", tm)) == limits.MAX_FILES_PER_COMMIT + 1
