"""Ctrl-C during a command that waits on the cluster ends it at once with one line and a
non-zero exit, without asyncio's complaints about the call it left running ("Task was destroyed
but it is pending!", "Event loop is closed" tracebacks) on the terminal."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from cli.errors import EXIT_GENERIC

REPO = Path(__file__).resolve().parents[2]
TOKEN = "t" * 32
# Time for the CLI to start and send its first request bytes to the (silent) node: Ctrl-C comes
# only once they arrived, when the CLI is surely waiting on the node (not still importing).
REQUEST_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 20.0
CLI = (sys.executable, "-m", "cli.main")
NOISE = ("Traceback", "Task was destroyed", "Event loop is closed", "Exception ignored")


def _default_sigint() -> None:
    # A test run in the background (nohup, CI) may inherit SIGINT ignored; a user's shell
    # delivers Ctrl-C to a CLI whose SIGINT is in its default state.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `metastore ARGS` against a node that accepts connections and never answers, and
    press Ctrl-C (SIGINT) while it waits."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("METASTORE_")}
        proc = subprocess.Popen(
            [*CLI, "--endpoints", endpoint, "--token", TOKEN, "--timeout-ms", "60000", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,
        )
        try:
            silent.settimeout(REQUEST_TIMEOUT_S)
            conn, _ = silent.accept()
            with conn:
                conn.settimeout(REQUEST_TIMEOUT_S)
                assert conn.recv(1), "the CLI closed its connection without sending a request"
                assert proc.poll() is None, proc.communicate()
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ctrl_c_during_a_request_exits_quietly_and_non_zero() -> None:
    done = interrupted("table", "list")
    assert done.returncode == EXIT_GENERIC, done
    assert not any(word in done.stderr for word in NOISE), done.stderr
    assert done.stderr.strip() == "Aborted!", done.stderr


def test_ctrl_c_during_watch_says_how_to_resume_only_with_a_real_position() -> None:
    done = interrupted("watch")
    assert not any(word in done.stderr for word in NOISE), done.stderr
    # No event was seen and no position is known: `--from None` would be refused.
    assert "--from None" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("stopped"), done.stderr
    # Interrupted, as any other command (click's "Aborted!", `cluster up`'s INTERRUPTED): a
    # script running `watch` until killed must not read a Ctrl-C as "ended as asked"
    # (`--count` and `--for` end it with 0).
    assert done.returncode == EXIT_GENERIC, done
