"""Options of a `format("metastore")` write that cannot mean what they say are refused while the
write is planned, typed and before any metastore client (so any session) is opened: `as_of` on a
write (an append lands now, never "as of" a past time), and a path naming another table than the
`table` option. An append with no rows writes no file and commits no file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict, WriterCommitMessage
from pyspark.sql.types import LongType, StructField, StructType

from spark_bridge import datasource
from spark_bridge.datasource import (
    DataSourceOptionError,
    MetastoreDataSource,
    TableOptionMismatchError,
    WrittenFile,
)
from tests.client.offline_writer import offline_writer

COLUMNS = [{"name": "id", "type": "BIGINT", "nullable": True, "field_id": 1}]
SCHEMA = StructType([StructField("id", LongType())])


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every metastore client the data source asks for (none may be, for a refused option)."""
    made: list[tuple[Any, ...]] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        raise AssertionError("a metastore client was opened for a write refused by its options")

    monkeypatch.setattr(datasource, "_client", refuse)
    return made


def _source(**options: str) -> MetastoreDataSource:
    # As Spark hands them: a case-insensitive map.
    return MetastoreDataSource(CaseInsensitiveDict(options))


@pytest.mark.parametrize("mode_overwrite", [False, True])
def test_as_of_on_a_write_is_refused_before_any_client(
    clients: list[tuple[Any, ...]], mode_overwrite: bool
) -> None:
    source = _source(table="ns.t", as_of="-5m")
    with pytest.raises(DataSourceOptionError, match="as_of") as info:
        source.writer(SCHEMA, mode_overwrite)
    assert isinstance(info.value, ValueError)
    assert info.value.option == "as_of"
    assert "remove the as_of option" in str(info.value).lower()  # says what to do
    assert clients == []


def test_an_empty_as_of_on_a_write_is_no_as_of(monkeypatch: pytest.MonkeyPatch) -> None:
    """`.option("as_of", "")` is how a job template leaves it unset: not refused (the planning
    goes on to pin the table, here refused by the stand-in client)."""

    class Reached(Exception):
        pass

    def client(*args: Any, **kwargs: Any) -> Any:
        raise Reached

    monkeypatch.setattr(datasource, "_client", client)
    with pytest.raises(Reached):
        _source(table="ns.t", as_of="").writer(SCHEMA, False)


def test_a_read_keeps_as_of(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal is the write's: a read pins `as_of` as before."""
    asked: list[int] = []

    class _Clock:
        def now(self) -> int:
            return 1_800_000_000_000 << 16

        def physical_now_ms(self) -> int:
            return 1_800_000_000_000

    class _Client:
        clock = _Clock()

        def schema_at(self, table: str, *, ts: int) -> dict[str, Any]:
            asked.append(ts)
            return {"schema": {"columns": COLUMNS}, "version": 1, "table_id": 1}

        def close(self) -> None:
            pass

    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _Client())
    source = _source(table="ns.t", as_of="2026-01-01T00:00:00Z")
    assert [f.name for f in source.schema().fields] == ["id"]
    assert asked == [1_767_225_600_000 << 16]


@pytest.mark.parametrize(
    ("table", "path"), [("a.x", "a.y"), ("a.x", "b.x"), ("a.x", "a.x.y"), ("a.x", "ax")]
)
def test_a_path_naming_another_table_is_refused_naming_both(
    clients: list[tuple[Any, ...]], table: str, path: str
) -> None:
    for plan in (
        lambda s: s.writer(SCHEMA, False),
        lambda s: s.schema(),  # a read: load("a.y") with .option("table", "a.x")
    ):
        with pytest.raises(TableOptionMismatchError) as info:
            plan(_source(table=table, path=path))
        err = info.value
        assert isinstance(err, DataSourceOptionError) and isinstance(err, ValueError)
        assert (err.table_option, err.path) == (table, path)
        assert repr(table) in str(err) and repr(path) in str(err)
    assert clients == []


@pytest.mark.parametrize(
    ("table", "path"), [("a.x", "a.x"), ("Sales.Orders", "sales.orders"), ("a.X", "A.x")]
)
def test_the_same_table_in_the_path_and_the_option_is_one_table(table: str, path: str) -> None:
    assert _source(table=table, path=path)._table() == table


def test_a_task_without_rows_writes_no_file(tmp_path: Path) -> None:
    writer = offline_writer(str(tmp_path), COLUMNS)
    message = writer._write_file(iter([]))
    assert isinstance(message, WriterCommitMessage)
    assert not isinstance(message, WrittenFile)
    assert list(tmp_path.rglob("*.parquet")) == []


class _Committing:
    """A client that answers the commit and records it."""

    def __init__(self, sent: list[dict[str, Any]]) -> None:
        self.sent = sent
        self.cluster_id = ""
        self.own_writes_ts = 0

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        return {}

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        if op == "commit":
            self.sent.append(args)
            return {"ts": 5 << 16, "txn_id": args["txn_id"], "deduplicated": False}
        raise AssertionError(op)

    def close(self) -> None:
        pass


def test_an_append_of_no_rows_commits_without_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits (its txn id and mark then say it is done) but adds no file: every task returned
    the no-file message."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _Committing(sent))
    writer = offline_writer(str(tmp_path), COLUMNS, loose_files_max=0)
    writer.commit([writer._write_file(iter([])), writer._write_file(iter([]))])
    (args,) = sent
    (write,) = args["writes"]
    assert write["add"] == [] and write["overwrite"] is False
    assert list(tmp_path.rglob("*.parquet")) == []


def test_a_read_of_a_table_without_files_reads_no_rows() -> None:
    """A table no file was committed to (created, or only appended no rows): Spark replaces an
    empty partition list by one partition of its own (`InputPartition(None)`, PySpark 4.3's
    plan_data_source_read), which the reader refused with a TypeError; it plans one task
    reading no file instead."""
    from spark_bridge.datasource import FilePartition, FilesPartition, MetastoreReader

    reader = MetastoreReader(files=[], columns=COLUMNS)
    partitions = reader.partitions()
    assert partitions and all(isinstance(p, FilesPartition | FilePartition) for p in partitions)
    assert [batch for p in partitions for batch in reader.read(p)] == []
