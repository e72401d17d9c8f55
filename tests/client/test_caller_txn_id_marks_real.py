"""A caller's txn id with its mark (metastore.client.txn_marks) on real daemons: the stream field
takes the mark of the longest txn id, a re-run is found by the lookup before committing, the id
reused for another table is a typed TxnIdReused, and `committed_txn` with the id's mark finds
it. The window itself cannot be shrunk on a daemon (MAX_REMEMBERED_TXNS is a constant):
tests/client/test_caller_txn_id_marks.py pushes an id out of a small window on the state
machine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from metastore import limits
from metastore.client import SyncMetastoreClient
from metastore.client.txn_marks import tables_seq, txn_mark_stream
from metastore.errors import TxnIdReusedError
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncMetastoreClient]:
    with metastore_cluster(tmp_path_factory.mktemp("txn-marks")) as c:
        c.start_all()
        c.wait_ready()
        yield from _writer(c)


def _writer(c: MetastoreCluster) -> Iterator[SyncMetastoreClient]:
    endpoints = [f"127.0.0.1:{p}" for p in c.client_ports.values()]
    with SyncMetastoreClient(endpoints, c.token("writer")) as client:
        client.ddl("CREATE NAMESPACE etl")
        client.ddl("CREATE TABLE etl.daily (a INT)")
        client.ddl("CREATE TABLE etl.audit (a INT)")
        yield client


def _writes(table: str, path: str) -> list[dict[str, Any]]:
    return [
        {
            "table": table,
            "schema_version": 1,
            "add": [{"path": path, "size_bytes": 1, "row_count": 1}],
        }
    ]


@pytest.mark.parametrize("txn_id", ["etl-2026-11-27", "j" * limits.MAX_TXN_ID_CHARS])
def test_a_caller_txn_id_commits_once_with_its_mark(
    client: SyncMetastoreClient, txn_id: str
) -> None:
    tag = str(len(txn_id))
    first = client.commit(txn_id, _writes("etl.daily", f"{tag}/run1/f"), mark_txn_id=True)
    assert not first["deduplicated"]
    found = client.committed_txn(txn_id, stream=txn_mark_stream(txn_id))
    assert found["txn"]["ts"] == first["ts"]
    assert found["stream_mark"] == {
        "stream": txn_mark_stream(txn_id),
        "seq": tables_seq(["etl.daily"]),
        "ts": first["ts"],
        "txn_id": txn_id,
    }
    again = client.commit(txn_id, _writes("etl.daily", f"{tag}/run2/f"), mark_txn_id=True)
    assert again["deduplicated"] and again["ts"] == first["ts"]
    with pytest.raises(TxnIdReusedError):
        client.commit(txn_id, _writes("etl.audit", f"{tag}/other/f"), mark_txn_id=True)
    paths = [f["path"] for f in client.files("etl.daily")["files"]]
    assert f"{tag}/run1/f" in paths and f"{tag}/run2/f" not in paths
    assert all(not f["path"].startswith(f"{tag}/") for f in client.files("etl.audit")["files"])
