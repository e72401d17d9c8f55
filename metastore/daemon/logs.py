"""Structured logs: one JSON object per line in the node's data directory (and on stderr,
unless stderr is that very file, as `cluster up` starts a node).

Fields: `ts` (ISO-8601 UTC), `level`, `logger`, `node_id`, `pid` (the writing process: a refused
second start of a running node appends to its file), `msg`, plus whatever the call passed in
`extra=` (for example `term`, `index`). Exceptions are rendered under `exc`. Rotation keeps
`LOG_FILES_KEPT` files of `LOG_FILE_BYTES_MAX` each, so logs cannot fill the disk.

Each record also goes to stderr (a service manager's journal reads it), except when stderr is
the log file itself: `cluster up` appends a node's stdout and stderr to its node.log, which
would hold every line twice, and that copy would bypass rotation (after a rotation it grows
the renamed file, kept open after its deletion): the logs would no longer be bounded.

A record that cannot be written (a full or read-only disk, a closed stderr) is dropped quietly:
Python's logging would print a traceback to stderr for each one, so a node on a full disk would
flood its journal while it keeps running. Instead the first failure is one line on stderr, and
later ones are counted (`log_write_failures`, metric `metastore_log_write_failures_total`) and
reported at most every LOG_FAILURE_REPORT_INTERVAL_S as a count.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

LOG_FILE_BYTES_MAX = 64 * 1024 * 1024
LOG_FILES_KEPT = 5
# Lost records are reported on stderr at most this often (as a count).
LOG_FAILURE_REPORT_INTERVAL_S = 60.0

_monotonic_s = time.monotonic  # a module attribute, so a test can move time


class _WriteFailures:
    """Records no handler could write: counted, and reported on stderr once, then as a count at
    most every LOG_FAILURE_REPORT_INTERVAL_S. Shared by the node's handlers (one process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the GC and WAL threads log too
        self.total = 0
        self._unreported = 0
        self._last_report_s: float | None = None

    def failed(self, where: str) -> None:
        error = sys.exc_info()[1]
        with self._lock:
            self.total += 1
            self._unreported += 1
            now_s, last_s = _monotonic_s(), self._last_report_s
            if last_s is None:
                line = (
                    f"metastore: cannot write log records to {where}: {error}; further "
                    "failures are counted (metric metastore_log_write_failures_total) and "
                    f"reported every {LOG_FAILURE_REPORT_INTERVAL_S:g} s at most"
                )
            elif now_s - last_s >= LOG_FAILURE_REPORT_INTERVAL_S:
                line = (
                    f"metastore: {self._unreported} log records could not be written in the "
                    f"last {now_s - last_s:.0f} s (last error, at {where}: {error})"
                )
            else:
                return
            self._unreported = 0
            self._last_report_s = now_s
        # stderr itself may be what cannot be written (or closed): then nothing is left to tell.
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


_failures = _WriteFailures()


def log_write_failures() -> int:
    """Records this process could not write to one of its log handlers, since it started."""
    return _failures.total


class QuietFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating file handler whose failed writes (a full, read-only or failing disk) are
    counted and reported as the module docstring says, never a traceback per record. The
    node log and the audit log (metastore.daemon.audit) use it."""

    def handleError(self, record: logging.LogRecord) -> None:
        _failures.failed(self.baseFilename)

    def close(self) -> None:
        # Closing flushes what a failed write left buffered; on a full disk that fails too.
        try:
            super().close()
        except OSError:
            _failures.failed(self.baseFilename)


class _QuietStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def handleError(self, record: logging.LogRecord) -> None:
        _failures.failed("stderr")


# Attributes every LogRecord has; anything else came from `extra=` and is emitted as a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, node_id: int) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "node_id": self.node_id,
            # Which process wrote the line: a second start of a running node (refused) appends
            # to the same file, and incident review must tell its lines from the node's.
            "pid": record.process,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = (
                    value if isinstance(value, str | int | float | bool | None) else str(value)
                )
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(*, node_id: int, log_file: Path, level: str) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    formatter = JsonFormatter(node_id)
    file_handler = QuietFileHandler(
        log_file, maxBytes=LOG_FILE_BYTES_MAX, backupCount=LOG_FILES_KEPT, encoding="utf-8"
    )
    file_handler.setFormatter(formatter)
    handlers: list[logging.Handler] = [file_handler]
    if not _is_same_file(sys.stderr, log_file):
        stderr_handler = _QuietStreamHandler(sys.stderr)
        stderr_handler.setFormatter(formatter)
        handlers.append(stderr_handler)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level.upper())
    # sqlglot warns each time our hand parser takes over a statement it cannot tree: noise.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)


def _is_same_file(stream: object, path: Path) -> bool:
    """Whether `stream` writes to the file at `path` (the same inode), e.g. a stderr that
    `cluster up` appends to the node's log file. False when either cannot be told."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        opened, named = os.fstat(fd), os.stat(path)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
