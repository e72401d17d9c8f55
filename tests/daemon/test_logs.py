"""The node's JSON-lines log: one copy of each line in node.log, also when its stderr is that file.

`cluster up` starts a node with stdout and stderr appended to DATA_DIR/node-N/node.log (so what
the node prints before its logging is set up, and a crash's traceback, land there). The node
logged every record to its rotating file handler on node.log *and* to stderr, i.e. twice into
the same file; and the stderr copy bypassed rotation: after a rotation it kept growing the
renamed (and, five rotations later, deleted but still open) file, so the logs were not bounded.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metastore.daemon.logs import setup_logging


@pytest.fixture
def root_logging() -> Iterator[None]:
    """setup_logging replaces the root logger's handlers: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def _messages(text: str) -> list[str]:
    return [json.loads(line)["msg"] for line in text.splitlines() if line.startswith("{")]


def test_a_stderr_appended_to_the_log_file_gets_each_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    log_file = tmp_path / "node-1" / "node.log"
    log_file.parent.mkdir()
    with log_file.open("a", encoding="utf-8") as console:  # what `cluster up` gives the node
        monkeypatch.setattr(sys, "stderr", console)
        setup_logging(node_id=1, log_file=log_file, level="INFO")
        logging.getLogger("metastore.node").info("metastore node started")
        for handler in logging.getLogger().handlers:
            handler.flush()
    assert _messages(log_file.read_text()) == ["metastore node started"]


def test_a_stderr_of_its_own_still_gets_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    # A service manager (systemd's journal) reads stderr: it keeps its copy.
    log_file = tmp_path / "node.log"
    console = io.StringIO()
    monkeypatch.setattr(sys, "stderr", console)
    setup_logging(node_id=1, log_file=log_file, level="INFO")
    logging.getLogger("metastore.node").info("metastore node started")
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert _messages(log_file.read_text()) == ["metastore node started"]
    assert _messages(console.getvalue()) == ["metastore node started"]


def test_a_full_disk_costs_one_line_then_a_count_not_a_traceback_per_record(
    monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    # /dev/full fails every write with ENOSPC, as a full file system does. Python's logging
    # printed "--- Logging error ---" and a traceback to stderr for each record, so a node on
    # a full disk flooded its journal while it kept running.
    from metastore.daemon import logs

    console = io.StringIO()
    monkeypatch.setattr(sys, "stderr", console)
    now_s = [1000.0]
    monkeypatch.setattr(logs, "_monotonic_s", lambda: now_s[0])
    setup_logging(node_id=1, log_file=Path("/dev/full"), level="INFO")
    before = logs.log_write_failures()
    log = logging.getLogger("metastore.node")
    records = 100
    for i in range(records):
        log.info("record %d", i)

    def reports() -> list[str]:
        return [line for line in console.getvalue().splitlines() if not line.startswith("{")]

    assert "Traceback" not in console.getvalue()
    # Every record still reached the stderr handler, which can write.
    assert len(_messages(console.getvalue())) == records
    first = reports()
    assert len(first) == 1, first
    assert "/dev/full" in first[0] and "No space left" in first[0], first
    assert logs.log_write_failures() - before == records

    # Past the report interval, the next failure reports how many records were lost since.
    now_s[0] += logs.LOG_FAILURE_REPORT_INTERVAL_S
    log.info("one more")
    later = reports()[1:]
    assert len(later) == 1 and f"{records} log records" in later[0], later
    assert logs.log_write_failures() - before == records + 1
