"""Several writes to one table in one batch add up like the same Spark writes run one after
another: an append keeps what earlier writes of the batch wrote, an overwrite replaces it
(and the table's committed files). Pure: Spark and the session are stand-ins; only the batch's
bookkeeping and its commit request run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from spark_bridge import bridge as bridge_mod
from spark_bridge.bridge import BatchContext
from spark_bridge.files import DataFile
from tests.client.bridge_stub import bare_bridge


class _Written:
    def __init__(self) -> None:
        self.get = {"rows": 1}


class _Frame:
    def observe(self, *_a: Any) -> Any:
        writer = SimpleNamespace(parquet=lambda path: None)
        return SimpleNamespace(write=SimpleNamespace(mode=lambda m: writer))


class _Client:
    def __init__(self) -> None:
        self.commits: list[dict[str, Any]] = []

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "commit"
        self.commits.append(args)
        return {"ts": 100, "deduplicated": False}


@pytest.mark.parametrize(
    ("modes", "committed", "overwrite"),
    [
        (["append", "overwrite"], ["part-1"], True),
        (["overwrite", "append"], ["part-0", "part-1"], True),
        (["append", "append"], ["part-0", "part-1"], False),
    ],
)
def test_writes_of_one_table_add_up_like_writes_run_in_sequence(
    monkeypatch: pytest.MonkeyPatch, modes: list[str], committed: list[str], overwrite: bool
) -> None:
    """An append and then an overwrite of one table in a batch committed both writes' files
    over an emptied table: the appended rows, which the overwrite replaces when the same Spark
    writes run in sequence, stayed in the table."""
    import pyspark.sql
    from pyspark.sql import functions as F

    monkeypatch.setattr(pyspark.sql, "Observation", _Written)
    monkeypatch.setattr(F, "lit", lambda v: SimpleNamespace())
    monkeypatch.setattr(F, "count", lambda c: SimpleNamespace(alias=lambda n: None))
    monkeypatch.setattr(bridge_mod, "conform", lambda df, table, columns: _Frame())
    names = iter(["part-0", "part-1"])
    monkeypatch.setattr(
        bridge_mod,
        "collect_files",
        lambda location, rel: [DataFile(path=next(names), size_bytes=1, row_count=1)],
    )
    client = _Client()
    bridge = bare_bridge(client, session=SimpleNamespace(current=lambda: "s-1", available=True))
    batch = BatchContext(
        bridge, reads=[], writes=["ns.t"], txn_id="t-1", read_ts=None, check_reads=False
    )
    batch.pinned = {
        "ns.t": SimpleNamespace(location="/w/t", write_columns=[], version=1, table_id=7)
    }  # type: ignore[dict-item]
    for mode in modes:
        batch.write("ns.t", None, mode=mode)  # type: ignore[arg-type]
    batch.commit()
    (args,) = client.commits
    (write,) = args["writes"]
    assert [f["path"] for f in write["add"]] == committed
    assert write["overwrite"] is overwrite
    assert batch.report.files == len(committed)
