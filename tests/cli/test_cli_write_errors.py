"""A file the CLI writes that cannot be written (a full disk) is reported as one `Error:` line
naming the file and the errno's name, not `IO_ERROR: [Errno 28] No space left on device`."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli import processes
from cli.errors import CliError
from cli.main import cli


def _disk_full(*args: Any, **kwargs: Any) -> int:
    # What a write on a full disk raises: an errno and no file name.
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_cluster_init_on_a_full_disk_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Path, "write_text", _disk_full)
    d = tmp_path / "ms"
    result = CliRunner().invoke(cli, ["cluster", "init", str(d)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines == [
        f"Error: IO_ERROR: cannot write {d / 'cluster.toml'}: No space left on device (ENOSPC)"
    ], result.stderr
    assert "Traceback" not in result.output
    # The directory this made is removed again (no staged file left behind).
    assert not d.exists()


def test_a_pid_file_on_a_full_disk_names_the_pid_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Path, "write_text", _disk_full)
    pid_file = tmp_path / "node.pid"
    with pytest.raises(CliError) as caught:
        processes.write_pid_file(pid_file, 1234)
    assert caught.value.code == "IO_ERROR"
    assert caught.value.message == (f"cannot write {pid_file}: No space left on device (ENOSPC)")
    assert list(tmp_path.iterdir()) == []


def test_a_node_whose_pid_file_cannot_be_written_is_stopped_not_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pid file is how `cluster down` finds a node: one started whose pid file could not
    be written ran on untracked (holding its ports and data directory). It is stopped again,
    by its PID, and the one error names the pid file, the errno and that PID."""
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process = real_popen(*args, **kwargs)
        started.append(process)
        return process

    monkeypatch.setattr(processes.subprocess, "Popen", recording_popen)
    monkeypatch.setattr(Path, "write_text", _disk_full)
    pid_file = tmp_path / "node-1" / "node.pid"
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    try:
        with pytest.raises(CliError) as caught:
            processes.start_node(
                1,
                command,
                data_dir=tmp_path / "node-1",
                log_file=tmp_path / "node-1.log",
                pid_file=pid_file,
            )
        assert len(started) == 1
        pid = started[0].pid
        assert started[0].poll() is not None, "the node was left running untracked"
        message = caught.value.message
        assert caught.value.code == "IO_ERROR"
        assert message.startswith(f"cannot write {pid_file}: No space left on device (ENOSPC)")
        assert f"pid {pid}" in message and "stopped" in message and "\n" not in message
        assert not pid_file.exists()
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_failed_start_names_the_nodes_started_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cluster up` starts nodes one by one: when node 2's pid file cannot be written, node 1
    already runs (tracked). The error says so and how to go on, instead of reading as if
    nothing had started."""
    from tests.ports import free_ports

    d = tmp_path / "ms"
    base = free_ports(1)[0]
    init = CliRunner().invoke(cli, ["cluster", "init", str(d), "--base-port", str(base)])
    assert init.exit_code == 0, init.output
    # Each "node" sleeps: what is under test is cluster up's bookkeeping, not a daemon.
    monkeypatch.setattr(
        processes,
        "node_command",
        lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(60)"],
    )
    real_write = processes.write_pid_file
    written: list[int] = []

    def second_fails(pid_file: Path, pid: int) -> None:
        if written:
            raise CliError("IO_ERROR", f"cannot write {pid_file}: No space left on device (ENOSPC)")
        real_write(pid_file, pid)
        written.append(pid)

    monkeypatch.setattr(processes, "write_pid_file", second_fails)
    try:
        result = CliRunner().invoke(cli, ["cluster", "up", "--config", str(d), "--wait-ms", "0"])
        assert result.exit_code == 1, result.output
        assert len(written) == 1
        error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(error) == 1, result.stderr
        assert "cannot write" in error[0] and "ENOSPC" in error[0]
        assert f"node 1 (pid {written[0]}), started before it, runs on" in error[0]
        assert f"metastore cluster down --config {d}" in error[0]
        assert f"metastore cluster up --missing --config {d}" in error[0]
        os.kill(written[0], 0)  # node 1 runs on, as the error says
    finally:
        for pid in written:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
