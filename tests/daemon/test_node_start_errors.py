"""A node whose data directory cannot hold its files, or whose config is missing, says so in one
`Error: CODE: message` line and exits 2, also when started as `python -m metastore.daemon`; a
node stopped by SIGTERM or SIGINT exits 0 and its log says which signal stopped it.

Before: a data directory path taken by a file, or a log/audit file that could not be opened,
escaped as an OSError traceback (exit 1), and `python -m metastore.daemon` printed a config
error without its code.
"""

from __future__ import annotations

import asyncio
import errno
import json
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from metastore.daemon.__main__ import main as daemon_main
from metastore.daemon.config import load_node_config
from metastore.daemon.node import MetastoreNode, NodeStartError, _listen, serve
from metastore.daemon.secrets import ensure_secrets
from tests.daemon.harness import write_cluster
from tests.daemon.test_node_startup import (
    POLL_S,
    REPO,
    START_TIMEOUT_S,
    assert_one_line_error,
    daemon_argv,
    run_daemon,
)


def test_a_data_directory_path_taken_by_a_file_is_one_error_line(tmp_path: Path) -> None:
    config = write_cluster(tmp_path, n=1)
    data_dir = load_node_config(config, 1).data_dir
    data_dir.parent.mkdir(parents=True)
    data_dir.write_text("not a directory\n")
    done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "DATA_DIR_UNUSABLE")
    assert str(data_dir) in done.stderr
    assert data_dir.read_text() == "not a directory\n"  # changed nothing


def test_an_audit_log_that_cannot_be_opened_is_one_error_line(tmp_path: Path) -> None:
    config = write_cluster(tmp_path, n=1)
    audit = load_node_config(config, 1).data_dir / "audit.log"
    audit.mkdir(parents=True)  # a directory where the node's audit file goes
    done = run_daemon(config, "--bootstrap")
    assert_one_line_error(done, "DATA_DIR_UNUSABLE")
    assert str(audit) in done.stderr


def test_python_m_daemon_names_the_config_error_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "cluster.toml"
    assert daemon_main(["--config", str(missing), "--node-id", "1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"Error: CONFIG_INVALID: {missing}: file not found"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_node_gracefully_and_the_log_says_which(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # The log said only "metastore node stopped": an operator could not tell a stop asked for
    # (and by which signal) from one on a fatal error without the exit code.
    config = write_cluster(tmp_path, n=1)
    settings = load_node_config(config, 1)
    node = subprocess.Popen(
        daemon_argv(config, "--bootstrap"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "metastore node started" not in _log_text(settings.log_file):
            assert node.poll() is None, "the node exited"
            assert time.monotonic() < deadline, "the node did not start"
            time.sleep(POLL_S)
        node.send_signal(sig)
        assert node.wait(timeout=START_TIMEOUT_S) == 0
    finally:
        node.kill()
        node.wait(timeout=START_TIMEOUT_S)
    messages = [json.loads(line)["msg"] for line in settings.log_file.read_text().splitlines()]
    stopping = messages.index(f"stopping on {sig.name}")
    assert messages[stopping + 1 :].count("metastore node stopped") == 1, messages


def _log_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


async def test_a_port_the_node_may_not_bind_is_a_start_error() -> None:
    # A port below 1024 without the privilege to bind it (metrics_port = 80 as a plain user):
    # the bind's PermissionError escaped as a traceback instead of one line naming the port.
    async def bind_refused() -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(NodeStartError) as info:
        await _listen("metrics", "10.0.0.5:80", bind_refused())
    assert info.value.code == "LISTEN_FAILED"
    assert "10.0.0.5:80 (the metrics port)" in str(info.value)
    assert "Permission denied" in str(info.value)


def test_a_data_directory_others_may_write_is_warned_about(tmp_path: Path) -> None:
    # The data directory holds the node's WAL (the replicated catalog), its identity and its
    # audit log; one that other users may write (a shared mount, a directory made 0777 by
    # hand) let them rewrite all of it, and nothing said so.
    config = write_cluster(tmp_path, n=1)
    settings = load_node_config(config, 1)
    settings.data_dir.mkdir(parents=True)
    settings.data_dir.chmod(0o777)
    node = subprocess.Popen(
        daemon_argv(config, "--bootstrap"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "metastore node started" not in _log_text(settings.log_file):
            assert node.poll() is None, "the node exited"
            assert time.monotonic() < deadline, "the node did not start"
            time.sleep(POLL_S)
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=START_TIMEOUT_S) == 0
    finally:
        node.kill()
        node.wait(timeout=START_TIMEOUT_S)
    records = [json.loads(line) for line in settings.log_file.read_text().splitlines()]
    warnings = [r["msg"] for r in records if r["level"] == "warning"]
    assert any(str(settings.data_dir) in w and "0o777" in w for w in warnings), warnings
    assert settings.data_dir.stat().st_mode & 0o777 == 0o777  # said, not changed


def test_stop_signals_are_handled_before_the_node_says_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Supervisors, `cluster up` and the tests above signal a node as soon as its log says
    # "metastore node started" (written by MetastoreNode.start). The handlers used to be
    # installed only after the start returned, and after the heap freeze that follows it: a
    # SIGTERM in that window took the default action (the process killed, exit -15, no
    # hand-over). Seen once in CI on the data-directory test above.
    config = write_cluster(tmp_path, n=1)
    settings = load_node_config(config, 1)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    during_start: dict[signal.Signals, object] = {}

    async def start(node: MetastoreNode) -> None:
        during_start.update({sig: signal.getsignal(sig) for sig in before})
        node.stopped.set()  # serve() then stops at once

    async def stop(node: MetastoreNode, *, hand_over: bool = False) -> None:
        return None

    monkeypatch.setattr(MetastoreNode, "start", start)
    monkeypatch.setattr(MetastoreNode, "stop", stop)
    assert asyncio.run(serve(settings, bootstrap=True)) == 0
    for sig, handler in before.items():
        assert during_start[sig] != handler, f"{sig.name} had its default action during start"


def _file_size_limit(limit_bytes: int) -> Callable[[], None]:
    """A child's RLIMIT_FSIZE: its writes past `limit_bytes` fail with EFBIG (Python ignores
    SIGXFSZ), a real error from the kernel, as a full disk gives ENOSPC, with no hook in the
    node."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))

    return limit


def test_a_disk_that_cannot_hold_the_identity_is_one_error_line(tmp_path: Path) -> None:
    # Before: the OSError of the IDENTITY write escaped as a traceback (exit 1).
    config = write_cluster(tmp_path, n=1)
    settings = load_node_config(config, 1)
    ensure_secrets(settings.cluster.secrets_dir)  # already there: IDENTITY is the first write
    done = subprocess.run(
        daemon_argv(config, "--bootstrap"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
        preexec_fn=_file_size_limit(1),
    )
    assert_one_line_error(done, "NODE_STATE_UNWRITABLE")
    assert f"{settings.data_dir / 'IDENTITY'}" in done.stderr
    assert "EFBIG" in done.stderr
    assert not list(settings.data_dir.glob("IDENTITY*"))  # nothing half-written left


# A page of a mapped file that cannot be read: a SIGBUS, with no Python exception. The node
# maps no snapshot or spool file any more (raft.filebytes reads them; see
# tests/raft/test_snapshot_read_faults.py), but a library might map a file: the stack must
# still reach the log. Made real here by reading a map past the end of its truncated file.
_SIGBUS_AT_CONFIG_LOAD = """
import mmap, os, sys, tempfile
from pathlib import Path
import metastore.daemon.node as node

def unreadable_page(*_args, **_kwargs):
    fd, path = tempfile.mkstemp()
    os.unlink(path)
    os.write(fd, b"x" * 8192)
    mapped = mmap.mmap(fd, 8192, access=mmap.ACCESS_READ)
    os.ftruncate(fd, 0)
    return mapped[4096]

node.load_node_config = unreadable_page
node.run_node(Path(sys.argv[1]))
"""


def test_a_node_killed_by_sigbus_leaves_the_stack_in_its_log(tmp_path: Path) -> None:
    """Before: the node died of the signal with nothing on stderr (its log under `cluster
    up`), so a failing disk under a mapped file looked like a vanished process."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGBUS_AT_CONFIG_LOAD, str(tmp_path / "node1.toml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGBUS, done
    assert "Fatal Python error: Bus error" in done.stderr, done.stderr
    assert "unreadable_page" in done.stderr, done.stderr  # where it happened
