"""Writes of one batch made from several threads at once (a driver submitting its Spark writes
in parallel) all reach the batch's commit, and concurrent batches share conform's projection
cache safely. Pure: Spark, the session and the client are
stand-ins; only the batch's bookkeeping runs."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from spark_bridge import bridge as bridge_mod
from spark_bridge.bridge import BatchContext, BatchReport
from spark_bridge.files import DataFile
from tests.client.bridge_stub import bare_bridge


class _Written:
    def __init__(self) -> None:
        self.get = {"rows": 1}


class _Frame:
    """What `write` calls on the conformed DataFrame: observe(...).write.mode(...).parquet()."""

    def observe(self, *_a: Any) -> Any:
        writer = SimpleNamespace(parquet=lambda path: None)
        return SimpleNamespace(write=SimpleNamespace(mode=lambda m: writer))


class _SlowGets(dict):  # type: ignore[type-arg]
    """The batch's per-table file lists, whose reads let the other writer in before the
    update that follows them: the interleaving two threads can hit by chance."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=0.5)

    def get(self, *args: Any) -> Any:
        value = super().get(*args)
        # Both have read before either updates; a broken barrier (the other writer waits for
        # this one's update instead) is fine.
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait()
        return value


def test_two_threads_writing_one_table_of_a_batch_both_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyspark.sql
    from pyspark.sql import functions as F

    monkeypatch.setattr(pyspark.sql, "Observation", _Written)
    monkeypatch.setattr(F, "lit", lambda v: SimpleNamespace())
    monkeypatch.setattr(F, "count", lambda c: SimpleNamespace(alias=lambda n: None))
    monkeypatch.setattr(bridge_mod, "conform", lambda df, table, columns: _Frame())
    names = iter(["part-a.parquet", "part-b.parquet"])
    lock = threading.Lock()

    def collect_files(location: str, rel_dir: str) -> list[DataFile]:
        with lock:
            name = next(names)
        return [DataFile(path=f"{rel_dir}/{name}", size_bytes=1, row_count=1)]

    monkeypatch.setattr(bridge_mod, "collect_files", collect_files)
    session = SimpleNamespace(current=lambda: "s-1", available=True)
    bridge = bare_bridge(None, session=session)
    bridge.unleased_session = None
    batch = BatchContext(
        bridge, reads=[], writes=["ns.t"], txn_id="t-1", read_ts=None, check_reads=False
    )
    batch.pinned = {
        "ns.t": SimpleNamespace(location="/w/t", write_columns=[], version=1, table_id=7)
    }  # type: ignore[dict-item]
    batch.report = BatchReport(txn_id="t-1", top=1, read_ts=1, waited_ms=0)
    batch._written = _SlowGets()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            batch.write("ns.t", None)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors
    files, overwrite = dict.get(batch._written, "ns.t")
    assert sorted(f.path.rsplit("/", 1)[1] for f in files) == ["part-a.parquet", "part-b.parquet"]
    assert not overwrite


class _Cache(dict):  # type: ignore[type-arg]
    """conform's projection cache, whose eviction lets the other thread in between choosing
    the oldest entry and dropping it: the interleaving two threads can hit by chance."""

    def __init__(self, entries: dict[Any, Any]) -> None:
        super().__init__(entries)
        self.barrier = threading.Barrier(2, timeout=0.5)

    def __iter__(self) -> Any:
        keys = iter(list(super().__iter__()))
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait()
        return keys


def test_two_threads_conforming_new_shapes_into_a_full_cache_both_succeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Concurrent batches (streaming queries) share conform's projection cache. Two that
    missed it when it was full both chose the same oldest entry to drop, and the second
    `pop` raised KeyError: a write failed with an untyped error."""
    from spark_bridge import conform as conform_mod

    full = {("old", str(i), ""): [] for i in range(conform_mod.PROJECTION_CACHE_MAX)}
    monkeypatch.setattr(conform_mod, "_projections", _Cache(full))
    monkeypatch.setattr(conform_mod, "_projection", lambda schema, table, columns, **_: [])

    def frame(shape: str) -> Any:
        return SimpleNamespace(
            schema=SimpleNamespace(json=lambda: shape),
            select=lambda *exprs: shape,
            sparkSession=SimpleNamespace(conf=SimpleNamespace(get=lambda key, default: default)),
        )

    errors: list[BaseException] = []

    def run(shape: str) -> None:
        try:
            assert conform_mod.conform(frame(shape), "ns.t", []) == shape
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors, errors
    assert len(conform_mod._projections) <= conform_mod.PROJECTION_CACHE_MAX
