"""How `run_with_bridge` (cli.spark_run) turns the bridge's typed errors into the CLI's error
line, tested without Spark: the session, the client and the bridge are stand-ins."""

from __future__ import annotations

from typing import Any, NoReturn

import click
import pytest

import metastore.client
import spark_bridge.bridge
from cli import spark_run
from spark_bridge.conform import NotNullViolationError, SchemaMismatchError


class _StandIn:
    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            NotNullViolationError("NULL in s.a", table="d.t", field_path="s.a"),
            "Error: NOT_NULL_VIOLATION: NULL in s.a",
        ),
        (SchemaMismatchError("column x is missing"), "Error: SCHEMA_MISMATCH: column x is missing"),
    ],
)
def test_schema_mismatch_reports_the_errors_own_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: Exception, line: str
) -> None:
    monkeypatch.setattr(spark_run, "_spark", lambda _master, _app: (object(), False))
    monkeypatch.setattr(metastore.client, "SyncMetastoreClient", _StandIn)
    monkeypatch.setattr(spark_bridge.bridge, "MetastoreBridge", _StandIn)

    def body(_bridge: object) -> NoReturn:
        raise error

    with pytest.raises(click.exceptions.Exit) as exited:
        spark_run.run_with_bridge(
            endpoints=["127.0.0.1:1"],
            token="t",
            request_timeout_ms=1000,
            master="local[1]",
            app_name="test",
            body=body,
        )
    assert exited.value.exit_code != 0
    assert capsys.readouterr().err.startswith(line)
