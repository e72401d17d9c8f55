"""What a write whose reply never came tells its caller, against real daemons on 127.0.0.1.

* A node frozen (SIGSTOP: the kernel still accepts its TCP connections, nothing answers): a DDL
  whose deadline passes while its hello waits was never sent, and says so
  (NotAppliedTimeoutError); it said "outcome unknown". A DDL written to the frozen node's open
  connection keeps "outcome unknown", and the same request id settles it once the node runs
  again.

Processes are stopped by PID only; every wait is bounded."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import (
    MetastoreError,
    NotAppliedTimeoutError,
    RequestTimeoutError,
)
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

WAIT_S = 40.0


def _endpoint(c: MetastoreCluster, node_id: int) -> str:
    return f"127.0.0.1:{c.client_ports[node_id]}"


def _until(what: str, attempt: Any, timeout_s: float = WAIT_S) -> Any:
    """`attempt()`'s first result that is not None, tried every 0.2 s for `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = attempt()
        except (MetastoreError, OSError) as exc:
            last, result = exc, None
        if result is not None:
            return result
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


@pytest.fixture
def frozen_cluster(tmp_path: Path) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path, 1) as c:
        c.start_all()
        c.wait_ready(timeout_s=60)
        yield c


def test_a_ddl_cut_before_its_node_saw_it_was_not_applied(
    frozen_cluster: MetastoreCluster,
) -> None:
    c = frozen_cluster
    endpoint = _endpoint(c, 1)
    proc = c.procs[1]
    proc.send_signal(signal.SIGSTOP)
    try:
        with (
            SyncMetastoreClient([endpoint], c.token(), timeout_ms=400) as client,
            pytest.raises(NotAppliedTimeoutError) as raised,
        ):
            client.ddl("CREATE NAMESPACE never_sent", request_id="rid-never-sent")
    finally:
        proc.send_signal(signal.SIGCONT)
    assert raised.value.details["not_applied"] is True
    assert "deadline passed while connecting" in raised.value.message, raised.value.message
    with SyncMetastoreClient([endpoint], c.token()) as client:
        client.ddl("CREATE NAMESPACE after_thaw")  # applied after the one not sent, if ever
        names = {n["name"] for n in client.list_namespaces()["namespaces"]}
    assert "after_thaw" in names and "never_sent" not in names, names


def test_a_ddl_sent_to_a_frozen_node_is_unknown_and_its_request_id_settles_it(
    frozen_cluster: MetastoreCluster,
) -> None:
    c = frozen_cluster
    endpoint = _endpoint(c, 1)
    proc = c.procs[1]
    with SyncMetastoreClient([endpoint], c.token(), timeout_ms=400) as client:
        client.status()  # the connection is open (hello answered) before the node freezes
        proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimeoutError) as raised:
                client.ddl("CREATE NAMESPACE maybe_sent", request_id="rid-maybe")
        finally:
            proc.send_signal(signal.SIGCONT)
    error = raised.value
    assert not isinstance(error, NotAppliedTimeoutError)
    assert error.details["outcome_unknown"] is True and error.details["request_id"] == "rid-maybe"
    with SyncMetastoreClient([endpoint], c.token()) as client:
        settled = client.ddl("CREATE NAMESPACE maybe_sent", request_id="rid-maybe")
        again = client.ddl("CREATE NAMESPACE maybe_sent", request_id="rid-maybe")
        names = [n["name"] for n in client.list_namespaces()["namespaces"]]
    assert settled["namespace"] == "maybe_sent"
    assert again["deduplicated"] is True
    assert names.count("maybe_sent") == 1
