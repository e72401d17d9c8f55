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
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

LOG_FILE_BYTES_MAX = 64 * 1024 * 1024
LOG_FILES_KEPT = 5

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
    file_handler = logging.handlers.RotatingFileHandler(
        log_file, maxBytes=LOG_FILE_BYTES_MAX, backupCount=LOG_FILES_KEPT, encoding="utf-8"
    )
    file_handler.setFormatter(formatter)
    handlers: list[logging.Handler] = [file_handler]
    if not _is_same_file(sys.stderr, log_file):
        stderr_handler = logging.StreamHandler(sys.stderr)
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
