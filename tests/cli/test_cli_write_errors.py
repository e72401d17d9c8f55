"""A file the CLI writes that cannot be written (a full disk) is reported as one `Error:` line
naming the file and the errno's name, not `IO_ERROR: [Errno 28] No space left on device`."""

from __future__ import annotations

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
