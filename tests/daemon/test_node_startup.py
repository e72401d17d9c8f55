"""A node that cannot start (a port in use, its data directory held by another node) says so in
one `Error: CODE: message` line and exits 2, and releases what it had already opened (the WAL
and its lock, the listeners) instead of leaving them to the process's exit."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.daemon.config import load_node_config
from metastore.daemon.node import MetastoreNode, NodeStartError
from raft.wal import WriteAheadLog
from tests.daemon.harness import REPO, MetastoreCluster, write_cluster

START_TIMEOUT_S = 30.0
POLL_S = 0.05


@contextmanager
def occupied(port: int) -> Iterator[None]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def daemon_argv(config: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "metastore.daemon",
        "--config",
        str(config),
        "--node-id",
        "1",
        *extra,
    ]


def run_daemon(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        daemon_argv(config, *extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: {code}: "), done.stderr[-2000:]


@pytest.mark.parametrize("which", ["raft_port", "client_port", "metrics_port"])
def test_a_port_in_use_is_one_error_line_and_exit_2(tmp_path: Path, which: str) -> None:
    config = write_cluster(tmp_path)
    settings = load_node_config(config, 1)
    port = getattr(settings.node, which)
    with occupied(port):
        done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "ADDRESS_IN_USE")
    assert str(port) in done.stderr


def test_a_data_directory_in_use_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
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
        while True:
            assert first.poll() is None, "the first node exited"
            try:
                socket.create_connection(("127.0.0.1", settings.node.client_port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the first node did not start listening"
                time.sleep(POLL_S)
        done = run_daemon(config)
        assert_one_line_error(done, "WAL_LOCKED")
    finally:
        first.kill()
        first.wait(timeout=START_TIMEOUT_S)


def test_a_failed_start_releases_the_wal_and_the_ports(tmp_path: Path) -> None:
    config = write_cluster(tmp_path)
    settings = load_node_config(config, 1)

    async def start_with_metrics_port_taken() -> None:
        node = MetastoreNode(settings, bootstrap=True)
        with occupied(settings.node.metrics_port), pytest.raises(NodeStartError):
            await node.start()

    asyncio.run(start_with_metrics_port_taken())
    # The WAL lock is free again (an open file description of the failed node would hold it),
    # and so are the Raft and client ports it had bound before failing.
    WriteAheadLog.open(settings.data_dir / "wal")[0].close()
    for port in (settings.node.raft_port, settings.node.client_port):
        with occupied(port):
            pass


def test_an_insecure_secrets_directory_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    config = write_cluster(tmp_path)
    secrets_dir = load_node_config(config, 1).cluster.secrets_dir
    secrets_dir.mkdir(mode=0o755)
    secrets_dir.chmod(0o755)
    done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "SECRETS_INSECURE")
    assert "chmod" in done.stderr


def test_a_host_that_does_not_resolve_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    config = write_cluster(tmp_path)
    text = config.read_text()
    config.write_text(text.replace('host = "127.0.0.1"', 'host = "no-such-host.invalid"', 1))
    done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "LISTEN_FAILED")
    assert "no-such-host.invalid" in done.stderr


# A node of an older release: the same code, told it supports apply version 1 only (what a
# release from before version 2's rules would say).
_OLDER_RELEASE = (
    "import runpy\n"
    "import metastore.apply_version, metastore.state, metastore.daemon.server, "
    "metastore.daemon.node\n"
    "for m in (metastore.apply_version, metastore.state, metastore.daemon.server, "
    "metastore.daemon.node):\n"
    "    m.APPLY_VERSION_SUPPORTED = 1\n"
    "runpy.run_module('metastore.daemon', run_name='__main__', alter_sys=True)\n"
)


def test_a_node_of_an_older_release_stops_and_resumes_once_upgraded(tmp_path: Path) -> None:
    """A member whose release cannot apply the cluster's rules (a new cluster starts at the
    newest apply version) must not apply the log its own way: it stops at the first entry it
    cannot apply, says why, and once restarted on the new release catches up and answers as
    the others do."""
    c = MetastoreCluster(write_cluster(tmp_path))
    try:
        c.start(1)
        c.start(2)
        c.wait_ready(among=[1, 2])
        admin = c.client(1)
        assert admin.call("ddl", sql="CREATE NAMESPACE upgraded")["ok"]
        admin.close()
        node_3_args = ["--config", str(c.config), "--node-id", "3", "--bootstrap"]
        out = open(tmp_path / "stdout-3.log", "ab")  # noqa: SIM115 - the child owns it
        c.procs[3] = subprocess.Popen(
            [sys.executable, "-c", _OLDER_RELEASE, *node_3_args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        rc = c.procs[3].wait(timeout=START_TIMEOUT_S)
        log = (tmp_path / "stdout-3.log").read_text(errors="replace")
        assert rc == 1, log[-3000:]
        assert "supports only up to 1" in log and "upgrade" in log, log[-3000:]
        del c.procs[3]
        c.start(3, bootstrap=False)  # the same data directory, on this release
        c.wait_ready()
        for n in c.ids:
            st = c.try_status(n)
            assert st is not None and st["apply_version"] == APPLY_VERSION_SUPPORTED, (n, st)
            reader = c.client(n, role="reader")
            names = reader.call("list_namespaces")["result"]["namespaces"]
            reader.close()
            assert [ns["name"] for ns in names] == ["upgraded"], n
    finally:
        c.stop_all()


def test_a_corrupt_write_ahead_log_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    """Recovery refuses a log it cannot replay (CorruptLogError); the operator gets the one
    line every other refused start gives, with what to do, not a traceback."""
    config = write_cluster(tmp_path)
    settings = load_node_config(config, 1)

    async def first_start() -> None:
        node = MetastoreNode(settings, bootstrap=True)
        await node.start()
        await node.stop()

    asyncio.run(first_start())
    wal_dir = settings.data_dir / "wal"
    (segment,) = sorted(wal_dir.glob("wal-*.log"))
    # A later segment whose predecessor is missing: the log has a hole.
    seq, first_index = segment.stem.split("-")[1:]
    (wal_dir / f"wal-{int(seq, 16) + 2:016x}-{first_index}.log").write_bytes(b"")
    done = run_daemon(config)
    assert_one_line_error(done, "WAL_CORRUPT")
    assert "remove-node" in done.stderr
