"""`cluster up` starts each node with its stdout and stderr appended to its node.log (so a
crash before logging is set up, or the one-line `Error:` of a refused start, lands there),
and the node logs JSON lines to node.log and to stderr: every line was written twice. And
after a rotation the redirected stderr went on writing into the renamed (later deleted) file,
which the rotation's size bound does not cover. A node whose stderr is its log file logs to
the file once, through the rotating handler only."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metastore.daemon.logs import setup_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_a_node_whose_stderr_is_its_log_file_writes_each_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_file = tmp_path / "node-1" / "node.log"
    log_file.parent.mkdir()
    with log_file.open("a", encoding="utf-8") as redirected:  # as `cluster up` starts it
        monkeypatch.setattr(sys, "stderr", redirected)
        setup_logging(node_id=1, log_file=log_file, level="INFO")
        logging.getLogger("metastore.node").info("started once")
        for handler in logging.getLogger().handlers:
            handler.flush()
    lines = [line for line in log_file.read_text().splitlines() if "started once" in line]
    assert len(lines) == 1, lines


@pytest.mark.usefixtures("restore_logging")
def test_a_node_in_the_foreground_still_logs_to_its_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_file = tmp_path / "node-1" / "node.log"
    terminal = tmp_path / "terminal"
    with terminal.open("a", encoding="utf-8") as stderr:  # `metastore node start` by hand
        monkeypatch.setattr(sys, "stderr", stderr)
        setup_logging(node_id=1, log_file=log_file, level="INFO")
        logging.getLogger("metastore.node").info("seen on the terminal")
        for handler in logging.getLogger().handlers:
            handler.flush()
    assert "seen on the terminal" in terminal.read_text()
    assert "seen on the terminal" in log_file.read_text()
