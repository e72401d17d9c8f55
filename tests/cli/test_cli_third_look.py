"""Defects a new user hit, each pinned by a test: an epoch time pasted as --as-of is refused with
the forms meant, not read as an HLC in 1970; `ns drop` of a non-empty namespace names the CLI's
--cascade and counts in English; node-start errors have upper-case codes like every other
error; a second `node start` does not log "stopped" into the running node's log, `cluster up
--missing` keeps the pid file of a node started by hand; a typo in NS.TABLE says what is
unknown and suggests the closest name."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hlc import SystemClock, make_ts, to_iso
from metastore.daemon import node as daemon_node
from metastore.daemon.config import load_cluster_config, load_node_config
from metastore.daemon.node import NodeStartError
from metastore.daemon.secrets import SecretsError
from metastore.errors import NamespaceNotEmptyError, NamespaceNotFoundError, TableNotFoundError
from raft.errors import NodeIdentityError, TlsConfigError
from raft.wal import CorruptLogError, WalLockedError
from tests.cli.real_cluster import free_base_port
from tests.cli.test_cli import _isolated_cwd, against, fake, run, sent
from tests.client.fake_node import ThreadedFakeNode
from tests.daemon.harness import REPO, run_cli, write_cluster
from tests.daemon.test_node_startup import POLL_S, START_TIMEOUT_S, daemon_argv, run_daemon

__all__ = ["_isolated_cwd", "fake"]  # fixtures used by name


# ---- 1. epoch times pasted as --as-of ----------------------------------------------------------


@pytest.mark.parametrize(
    ("unit", "scale_from_ms"),
    [("seconds", 1 / 1000), ("milliseconds", 1), ("microseconds", 1000), ("nanoseconds", 10**6)],
)
def test_an_epoch_time_as_of_is_refused_with_the_forms_meant(
    fake: ThreadedFakeNode, unit: str, scale_from_ms: float
) -> None:
    now_ms = SystemClock().now_ms() - 60_000
    now_ms -= now_ms % 1000  # whole seconds, so every unit names the same millisecond
    pasted = str(int(now_ms * scale_from_ms))
    result = against(fake, "table", "describe", "a.b", "--as-of", pasted)
    assert result.exit_code == 2, result.output
    assert sent(fake) == []
    text = " ".join(result.stderr.split())
    assert text.startswith("Error: USAGE: "), result.stderr
    assert f"epoch {unit}" in text
    assert f"--as-of {to_iso(make_ts(now_ms))}" in text  # the form meant, to paste back
    assert f"--as-of {make_ts(now_ms)}" in text  # or the HLC integer of that time


def test_a_small_hlc_integer_is_still_an_hlc(fake: ThreadedFakeNode) -> None:
    # 12345 is no plausible epoch time in any unit: it stays the HLC it always was.
    assert against(fake, "table", "list", "a", "--as-of", "12345").exit_code == 0
    assert against(fake, "table", "list", "a", "--as-of", "0").exit_code == 0
    hlc_now = make_ts(SystemClock().now_ms() - 60_000)
    assert against(fake, "table", "list", "a", "--as-of", str(hlc_now)).exit_code == 0
    assert [args["as_of"] for _, args in sent(fake)] == [12345, 0, hlc_now]


# ---- 2. ns drop of a namespace that holds tables -----------------------------------------------


@pytest.mark.parametrize(
    ("tables", "count_text"), [(["s.t"], "1 table"), (["s.a", "s.b"], "2 tables")]
)
def test_ns_drop_of_a_non_empty_namespace_names_the_cascade_flag(
    tables: list[str], count_text: str
) -> None:
    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "ddl" and args["sql"] == "DROP NAMESPACE `s`", (op, args)
        # What a node says (SQL-flavoured, as for DROP NAMESPACE through `metastore sql`).
        raise NamespaceNotEmptyError(
            f"namespace s has {len(tables)} tables; drop them or use CASCADE",
            details={"namespace": "s", "table_count": len(tables), "tables": tables},
        )

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "ns", "drop", "s")
    assert result.exit_code == 5, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Error: NAMESPACE_NOT_EMPTY: namespace s has {count_text} ("), first
    assert "--cascade" in first and "CASCADE" not in first.replace("--cascade", ""), first
    for table in tables:
        assert table in first


# ---- 3. node-start errors: `Error: CODE: message` with the code in upper case --------------------


@pytest.mark.parametrize(
    "error",
    [
        NodeStartError("ADDRESS_IN_USE", "cannot listen on 127.0.0.1:1 (the raft port): in use"),
        NodeStartError("LISTEN_FAILED", "cannot listen on nowhere:1 (the raft port): no host"),
        TlsConfigError("key file /x.key: file not found"),
        NodeIdentityError("the data directory belongs to node 2"),
        WalLockedError("/d/wal is locked"),
        CorruptLogError("bad checksum", path=Path("/d/wal/3.seg")),
        SecretsError("token file is malformed", path=Path("/s/admin.token")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_node_start_errors_have_upper_case_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    config = write_cluster(tmp_path, n=1)

    async def refusing(_settings: object, **_: object) -> int:
        raise error

    monkeypatch.setattr(daemon_node, "setup_logging", lambda **_: None)  # no global handlers
    monkeypatch.setattr(daemon_node, "serve", refusing)
    result = run("node", "start", "--config", str(config), "--node-id", "1")
    assert result.exit_code == 2, result.output
    code = str(getattr(error, "code", "")).upper()
    assert re.fullmatch(r"[A-Z_]+", code), code
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {code}: {error}"), result.stderr


def test_an_unusable_data_directory_has_an_upper_case_code(tmp_path: Path) -> None:
    config = write_cluster(tmp_path, n=1)
    data_dir = load_node_config(config, 1).data_dir
    data_dir.parent.mkdir(parents=True)
    data_dir.write_text("not a directory\n")
    result = run("node", "start", "--config", str(config), "--node-id", "1", "--bootstrap")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: DATA_DIR_UNUSABLE: "), result.stderr
    assert f"{data_dir}: File exists (EEXIST)" in result.stderr, result.stderr  # errno's name


# ---- 4. a second start of a running node ---------------------------------------------------------


def _log_messages(log_file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]


def test_a_second_start_of_a_running_node_does_not_log_stopped_into_its_log(
    tmp_path: Path,
) -> None:
    config = write_cluster(tmp_path)
    settings = load_node_config(config, 1)
    first = subprocess.Popen(
        daemon_argv(config, "--bootstrap"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # bounded: the deadline
            assert first.poll() is None, "the first node exited"
            try:
                socket.create_connection(("127.0.0.1", settings.node.client_port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the first node did not start listening"
                time.sleep(POLL_S)  # polling a port: no event to await across processes
        before = len(_log_messages(settings.log_file))
        done = run_daemon(config)
        assert done.returncode == 2, done.stderr
        assert first.poll() is None, "the running node stopped"
        added = _log_messages(settings.log_file)[before:]
        texts = [m["msg"] for m in added]
        assert not any("stopped" in t for t in texts), texts
        # What the second process did write says it came from another process than the node.
        assert added and all(m.get("pid") not in (None, first.pid) for m in added), added
    finally:
        first.kill()
        first.wait(timeout=START_TIMEOUT_S)


# ---- 5. a typo in NS.TABLE ---------------------------------------------------------------------


def _catalog(namespaces: dict[str, list[str]]) -> ThreadedFakeNode:
    """A node that knows `namespaces` (name -> table names) and answers only what naming needs:
    every read of a table it does not have is TABLE_NOT_FOUND, as the nodes answer it."""

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "list_namespaces":
            return {
                "namespaces": [{"name": n, "comment": None, "properties": {}} for n in namespaces]
            }
        if op == "list_tables":
            ns = args.get("namespace")
            if ns not in namespaces:
                raise NamespaceNotFoundError(
                    f"namespace {ns} does not exist", details={"namespace": ns}
                )
            return {"tables": [f"{ns}.{t}" for t in namespaces[ns]]}
        if op == "read_ts":
            return {"ts": make_ts(SystemClock().now_ms())}
        table = args.get("table")
        raise TableNotFoundError(f"table {table} does not exist", details={"table": table})

    return ThreadedFakeNode(handler=handler)


CATALOG = {"sales": ["orders", "refunds"], "marketing": ["campaigns"]}


@pytest.mark.parametrize("command", [["describe"], ["history"], ["files"], ["read"], ["compact"]])
def test_a_typo_in_the_table_name_suggests_the_closest_table(command: list[str]) -> None:
    with _catalog(CATALOG) as node:
        result = against(node, "table", *command, "sales.ordres")
        ops = [op for op, _ in sent(node)]
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: TABLE_NOT_FOUND: table sales.ordres does not exist"), first
    assert "did you mean sales.orders?" in first, first
    assert ops.count("list_tables") == 1 and "list_namespaces" not in ops, ops  # bounded


@pytest.mark.parametrize("command", [["describe"], ["history"], ["files"], ["read"], ["compact"]])
def test_a_typo_in_the_namespace_says_the_namespace_is_unknown(command: list[str]) -> None:
    with _catalog(CATALOG) as node:
        result = against(node, "table", *command, "slaes.orders")
        ops = [op for op, _ in sent(node)]
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: NAMESPACE_NOT_FOUND: namespace slaes does not exist"), first
    assert "did you mean sales?" in first, first
    assert ops.count("list_namespaces") == 1 and ops.count("list_tables") <= 1, ops


def test_table_list_of_an_unknown_namespace_suggests_the_closest() -> None:
    with _catalog(CATALOG) as node:
        result = against(node, "table", "list", "marketin")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: NAMESPACE_NOT_FOUND: namespace marketin does not exist")
    assert "did you mean marketing?" in first, first


def test_nothing_close_suggests_nothing() -> None:
    with _catalog(CATALOG) as node:
        result = against(node, "table", "describe", "sales.zzzzzz")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first == "Error: TABLE_NOT_FOUND: table sales.zzzzzz does not exist", first


def test_a_malformed_name_is_a_usage_error_before_any_request() -> None:
    with _catalog(CATALOG) as node:
        result = against(node, "table", "describe", "sales")
        assert sent(node) == []
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: USAGE: "), result.stderr
    assert "namespace.table" in result.stderr


def test_cluster_up_missing_leaves_a_node_started_by_hand_running_and_its_pid_file_alone(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "cluster"
    done = run_cli(
        "cluster", "init", str(directory), "--cluster-id", "byhand",
        "--base-port", str(free_base_port()),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = load_cluster_config(directory / "cluster.toml")
    hand = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "node", "start", "--bootstrap",
         "--config", str(directory / "node2.toml")],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # bounded: the deadline
            assert hand.poll() is None, "the node started by hand exited"
            try:
                socket.create_connection(("127.0.0.1", config.node(2).client_port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the node started by hand did not listen"
                time.sleep(POLL_S)  # polling a port: no event to await across processes
        up = run_cli(
            "cluster", "up", "--missing", "--bootstrap", "1", "--bootstrap", "3",
            "--wait-ms", "0", "--config", str(directory),
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert "node 2" in up.stderr and "not started by cluster up" in up.stderr, up.stderr
        assert not config.node_pid_file(2).exists()  # cluster up did not claim it
        assert config.node_pid_file(1).exists() and config.node_pid_file(3).exists()
        assert hand.poll() is None
    finally:
        run_cli("cluster", "down", "--config", str(directory), "--grace-ms", "3000")
        hand.kill()
        hand.wait(timeout=START_TIMEOUT_S)
