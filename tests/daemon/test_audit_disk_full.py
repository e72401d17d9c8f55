"""An audit.log the disk cannot take (full, read-only, failing): every request is still
served, and the failures are counted like the node log's (`log_write_failures`, metric
`metastore_log_write_failures_total`) with at most one line on stderr. Before: the audit
handler was Python's plain one, which prints '--- Logging error ---' and a traceback to
stderr for every audited request (a node on a full disk flooded its journal)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from metastore.daemon import logs
from metastore.daemon.audit import AuditLog
from metastore.daemon.logs import log_write_failures


class _FullDisk:
    """A file stream whose writes fail as on a full disk."""

    def write(self, _text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        pass


def test_an_audit_log_on_a_full_disk_is_counted_not_a_traceback_per_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging, "raiseExceptions", True)  # Python's default
    # A counter of this test's own: the process's first failure is reported once, for all.
    monkeypatch.setattr(logs, "_failures", logs._WriteFailures())
    audit = AuditLog(tmp_path, node_id=1)
    logger = audit._logger
    assert logger is not None
    (handler,) = logger.handlers
    assert isinstance(handler, logging.StreamHandler)
    handler.stream.close()
    handler.stream = _FullDisk()  # type: ignore[assignment]
    before = log_write_failures()
    for i in range(5):
        audit.record(
            peer="127.0.0.1:1",
            client="c",
            role="writer",
            token_name="writer",
            op="commit",
            args={"txn_id": f"t{i}"},
            outcome="OK",
            ms=1.0,
        )
    audit.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err, err
    assert len(err.splitlines()) == 1 and str(tmp_path / "audit.log") in err, err
    assert log_write_failures() - before >= 5
