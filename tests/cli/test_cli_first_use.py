"""Rough edges a first-time user hits, each pinned by a test: bad flags, a wrong or missing token
and out-of-range durations each give one `Error: CODE: message` line (the first line on stderr,
as README promises) with an exit code of the documented kind, and name the flag at fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest

from cli import job_backfill, table_optimize
from hlc import make_ts, to_iso
from metastore.client import protocol
from metastore.errors import ForbiddenError, SchemaJobNotFoundError, TableNotFoundError
from tests.cli.test_cli import _isolated_cwd, against, fake, run, sent
from tests.client.fake_node import ThreadedFakeNode
from tests.client.test_client import dead_endpoint

__all__ = ["_isolated_cwd", "fake"]  # fixtures used by name


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["table", "describe", "a.b", "--as-of", "yesterday"], "--as-of"),
        (["table", "read", "a.b", "--limit", "-1"], "--limit"),
        (["txn", "log", "--limit", "abc"], "--limit"),
        (["job", "show", "abc"], "JOB_ID"),
        (["table", "describe"], "NS.TABLE"),
        (["table", "nosuch"], "nosuch"),
        (["--timeout-ms", "0", "ns", "list"], "--timeout-ms"),
        (["-o", "yaml", "ns", "list"], "--output"),
    ],
)
def test_a_usage_error_is_one_error_line_first(
    fake: ThreadedFakeNode, args: list[str], names: str
) -> None:
    result = against(fake, *args)
    assert result.exit_code == 2, result.output
    first, *rest = result.stderr.splitlines()
    # Scripts read the first stderr line as `Error: CODE: message`, as for every other error.
    assert first.startswith("Error: USAGE: "), result.stderr
    assert names in first
    # The usage and the pointer to --help still follow.
    assert any(line.startswith("Try 'metastore") for line in rest), result.stderr
    assert sent(fake) == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["sql", "ALTER TABLE a.b DROP COLUMN c", "--wait", "abc"], "--wait"),
        (["sql", "ALTER TABLE a.b DROP COLUMN c", "--wait", "25h"], "--wait"),
        (["job", "wait", "1", "--timeout", "5 min"], "--timeout"),
        (["job", "cancel", "1", "--wait", "-5s"], "--wait"),
        (["cluster", "promote-node", "4", "--wait", "abc"], "--wait"),
    ],
)
def test_a_bad_wait_duration_names_its_flag(
    fake: ThreadedFakeNode, args: list[str], flag: str
) -> None:
    result = against(fake, *args)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Error: USAGE: Invalid value for '{flag}': "), result.stderr
    assert sent(fake) == []


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["sql"], "--wait"),
        (["job", "wait"], "--timeout"),
        (["job", "cancel"], "--wait"),
        (["cluster", "promote-node"], "--wait"),
    ],
)
def test_wait_durations_show_as_durations_in_help(command: list[str], flag: str) -> None:
    result = run(*command, "--help")
    assert result.exit_code == 0
    assert f"{flag} DURATION" in result.stdout, result.stdout


def _job_view(kind: str, status: str, step: str) -> dict[str, Any]:
    return {
        "job_id": 9,
        "table": "s.t",
        "column": "n",
        "kind": kind,
        "status": status,
        "step": step,
    }


@pytest.mark.parametrize(
    ("reply", "exit_code", "line"),
    [
        (
            SchemaJobNotFoundError("no schema change job 9"),
            4,
            "Error: SCHEMA_JOB_NOT_FOUND: no schema change job 9",
        ),
        (
            _job_view("drop_column", "running", "write_only"),
            5,
            "Error: SCHEMA_JOB_STATE: job 9 is a drop_column job; only ADD COLUMN",
        ),
        (
            _job_view("add_column", "cancelled", "write_only"),
            5,
            # The wording of an ended job is the bridge's (spark_bridge.backfill).
            "Error: SCHEMA_JOB_STATE: job 9 ",
        ),
    ],
)
def test_run_backfill_of_a_job_with_nothing_to_backfill_fails_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch, reply: object, exit_code: int, line: str
) -> None:
    # Starting Spark takes seconds (15 s on two cores) and floods stderr with its log: a typo
    # in the job id must not cost that.
    def no_spark(**_kwargs: object) -> NoReturn:
        raise AssertionError("Spark was started")

    monkeypatch.setattr(job_backfill, "run_with_bridge", no_spark)

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert (op, args) == ("job_show", {"job_id": 9})
        if isinstance(reply, Exception):
            raise reply
        assert isinstance(reply, dict)
        return reply

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "job", "run-backfill", "9")
    assert result.exit_code == exit_code, result.output
    assert result.stderr.startswith(line), result.stderr


def _listing(sizes: list[int]) -> dict[str, Any]:
    return {
        "table": "s.t",
        "as_of": 1 << 16,
        "location": "/nowhere",
        "files": [
            {"path": f"f{i}.parquet", "size_bytes": size, "row_count": 1, "added_ts": 1}
            for i, size in enumerate(sizes)
        ],
    }


@pytest.mark.parametrize(
    ("reply", "exit_code", "out"),
    [
        (TableNotFoundError("table s.t does not exist"), 4, ""),
        # One small file among large ones: fewer than --min-files (2), nothing to rewrite.
        (_listing([100, 512 << 20]), 0, "s.t: nothing to optimize (1 small files of 2)"),
        (_listing([]), 0, "s.t: nothing to optimize (0 small files of 0)"),
    ],
)
def test_optimize_with_nothing_to_do_starts_no_spark(
    monkeypatch: pytest.MonkeyPatch, reply: object, exit_code: int, out: str
) -> None:
    def no_spark(**_kwargs: object) -> NoReturn:
        raise AssertionError("Spark was started")

    monkeypatch.setattr(table_optimize, "run_with_bridge", no_spark)

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert op == "files" and args["table"] == "s.t"
        if isinstance(reply, Exception):
            raise reply
        assert isinstance(reply, dict)
        return reply

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "-o", "json", "table", "optimize", "s.t")
    assert result.exit_code == exit_code, result.output
    if exit_code:
        assert result.stderr.startswith("Error: TABLE_NOT_FOUND: table s.t"), result.stderr
        return
    doc = json.loads(result.stdout)
    assert doc["summary"] == out
    assert doc["dry_run"] is False and doc["commits"] == 0 and doc["files_rewritten"] == 0


@pytest.mark.parametrize(
    ("max_age", "says"),
    [
        ("99999d", "'99999d' is longer than 3650d"),
        ("0", "'0' is shorter than 1ms"),
        ("6 hours", "'6 hours' is not a duration"),
    ],
)
def test_pts_max_age_out_of_range_is_a_usage_error_in_its_units(
    fake: ThreadedFakeNode, max_age: str, says: str
) -> None:
    # Was INVALID_ARGUMENT (exit 5) from the leader, in milliseconds and under the wire name:
    # "'max_age_ms' = 8639913600000 is out of range [1, 315360000000]".
    result = against(fake, "pts", "protect", "--ts", "-1h", "--table", "a.b", "--max-age", max_age)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: USAGE: Invalid value for '--max-age': "), result.stderr
    assert says in first, first
    assert sent(fake) == []


def test_duration_options_say_duration_in_help() -> None:
    for command, flag in (
        (["pts", "protect"], "--max-age"),
        (["watch"], "--for"),
        (["job", "run-backfill"], "--timeout"),
    ):
        result = run(*command, "--help")
        assert f"{flag} DURATION" in result.stdout, result.stdout


def test_watch_for_names_the_flag_once(fake: ThreadedFakeNode) -> None:
    result = against(fake, "watch", "--for", "abc")
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first == (
        "Error: USAGE: Invalid value for '--for': 'abc' is not a duration (e.g. 30s, 5m, 1h, "
        "7d, 500ms; a bare number is seconds)"
    ), first


def test_a_missing_token_file_says_it_is_the_token_file(
    fake: ThreadedFakeNode, tmp_path: Path
) -> None:
    missing = tmp_path / "old-cluster" / "admin.token"
    result = run(
        "--endpoints", fake.endpoint, "ns", "list", env={"METASTORE_TOKEN_FILE": str(missing)}
    )
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Error: SECRETS_INVALID: {missing} does not exist"), first
    assert "METASTORE_TOKEN_FILE" in first, first


def test_a_token_the_cluster_does_not_know_says_where_it_came_from(
    fake: ThreadedFakeNode, tmp_path: Path
) -> None:
    other = tmp_path / "admin.token"
    other.write_text("x" * 43 + "\n")
    other.chmod(0o600)
    from_file = run("--endpoints", fake.endpoint, "--token-file", str(other), "ns", "list")
    assert from_file.exit_code == 6, from_file.output
    first = from_file.stderr.splitlines()[0]
    assert first.startswith("Error: UNAUTHENTICATED: missing or unknown token"), first
    assert f"the token from {other}" in first, first
    flag = run("--endpoints", fake.endpoint, "--token", "y" * 43, "ns", "list")
    assert flag.exit_code == 6, flag.output
    assert "the token from --token / METASTORE_TOKEN" in flag.stderr, flag.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["cluster", "up", "--config"],
        ["cluster", "down", "--config"],
        ["snapshot", "restore", "backup.snap", "--config"],
    ],
)
def test_a_config_directory_without_a_cluster_says_how_to_make_one(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "backup.snap").write_bytes(b"not read: the config is checked first")
    newcluster = tmp_path / "newcluster"
    result = run(*command, str(newcluster))
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Error: CONFIG_INVALID: {newcluster}/cluster.toml: file not found"), (
        first
    )
    assert f"metastore cluster init {newcluster}" in first, first


def test_cluster_init_says_how_to_start_and_reach_the_cluster(tmp_path: Path) -> None:
    # The README's next steps, with this cluster's directory and ports, ready to paste (the
    # ports follow --base-port, so the README's 24201.. are not this cluster's).
    target = tmp_path / "my cluster"
    result = run("cluster", "init", str(target), "--base-port", "28100")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    quoted = f"'{target}'"
    assert f"metastore cluster up --config {quoted}" in lines, result.stdout
    endpoints = "127.0.0.1:28201,127.0.0.1:28202,127.0.0.1:28203"
    assert f"export METASTORE_ENDPOINTS={endpoints}" in lines, result.stdout
    assert f"export METASTORE_TOKEN_FILE='{target}/secrets/admin.token'" in lines, result.stdout


def test_no_node_listening_asks_whether_the_cluster_is_up() -> None:
    dead = dead_endpoint()
    result = run("--endpoints", dead, "--token", "t" * 43, "--timeout-ms", "1500", "ns", "list")
    assert result.exit_code == 3, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        f"Error: UNAVAILABLE: list_namespaces failed on every endpoint: {dead}: connection refused"
    ), first
    assert "is the cluster up?" in first and "--endpoints / METASTORE_ENDPOINTS" in first, first
    # The CLI's own hint replaces the client library's general one: said once, not twice.
    assert protocol.CHECK_CLUSTER_HINT not in first, first


CREATED_TU = make_ts(1_790_000_000_000)


@pytest.mark.parametrize("command", [["describe"], ["files"], ["read"]])
def test_as_of_before_a_table_existed_says_when_it_was_created(command: list[str]) -> None:
    # The README's `table describe sales.orders --as-of -5m`, run right after the CREATE TABLE
    # above it, asks for a time before the table existed: say so, and from when to ask.
    as_of = CREATED_TU - (300_000 << 16)

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if "as_of" in args:
            raise TableNotFoundError(f"table s.t does not exist at {to_iso(args['as_of'])}")
        assert op == "describe", op
        return {"table": "s.t", "version": 1, "created_tu": CREATED_TU}

    with ThreadedFakeNode(handler=handler) as node:
        result = against(node, "table", *command, "s.t", "--as-of", str(as_of))
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        f"Error: TABLE_NOT_FOUND: table s.t does not exist at {to_iso(as_of)}; it was created "
        f"at {to_iso(CREATED_TU)}"
    ), first


def test_no_token_at_all_names_both_ways_to_give_one(fake: ThreadedFakeNode) -> None:
    """Run away from cluster_configs/local with endpoints but no token: the error names the
    token-file option the README's `export METASTORE_TOKEN_FILE=...` step uses, and where
    `cluster init` put the tokens; nothing is sent."""
    result = run("--endpoints", fake.endpoint, "table", "list")
    assert result.exit_code == 6, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: UNAUTHENTICATED: no token"), first
    assert "--token-file / METASTORE_TOKEN_FILE" in first, first
    assert "DIR/secrets/" in first, first
    assert sent(fake) == []


def test_a_token_of_too_weak_a_role_says_which_token_and_where_the_others_are(
    tmp_path: Path,
) -> None:
    """The README's reader token (or a writer's for an admin command) is refused FORBIDDEN:
    the error names the token's source and the tokens `cluster init` wrote for each role."""

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise ForbiddenError(f"op {op!r} needs role writer", details={"op": op, "needed": "writer"})

    reader = tmp_path / "reader.token"
    reader.write_text("r" * 43 + "\n")
    reader.chmod(0o600)
    with ThreadedFakeNode(handler=handler, tokens=frozenset({"r" * 43})) as node:
        result = run(
            "--endpoints", node.endpoint, "--token-file", str(reader), "sql", "CREATE NAMESPACE q"
        )
    assert result.exit_code == 6, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: FORBIDDEN: op 'ddl' needs role writer"), first
    assert f"the token from {reader}" in first, first
    assert "DIR/secrets/writer.token" in first, first


@pytest.mark.parametrize("command", [["cluster", "status"], ["safe-time"]])
def test_a_status_no_node_answers_asks_whether_the_cluster_is_up(command: list[str]) -> None:
    """`cluster status` (and `safe-time`) print every endpoint's refusal in the table, and
    then, as the other commands' error does, whether the cluster is up and where the endpoints
    came from."""
    dead = dead_endpoint()
    result = run("--endpoints", dead, "--token", "t" * 43, "--timeout-ms", "1500", *command)
    assert result.exit_code == 3, result.output
    assert "connection refused" in result.stdout, result.stdout
    assert "is the cluster up?" in result.stderr, result.stderr
    assert "--endpoints / METASTORE_ENDPOINTS" in result.stderr, result.stderr
