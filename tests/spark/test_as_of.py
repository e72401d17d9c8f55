"""Reads AS OF T - through `bridge.read_table` and `format("metastore")`, with T as an HLC integer
and as a relative time - return exactly the rows committed at or before T, with the schema in
force at T: across a RENAME COLUMN (files written before it are read by field id and keep their
data) and an overwrite (it removes the old files from its timestamp on; earlier reads still see
them)."""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from hlc import TimestampParseError, make_ts, to_datetime, to_iso
from spark_bridge.bridge import MetastoreBridge
from tests.spark.support import HLC_MS, SparkEnv, physical_ms, rows_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

pytestmark = pytest.mark.slow

TABLE = "asof.t"
# Time between the second commit and the overwrite, so a relative AS OF can land between them.
GAP_BEFORE_OVERWRITE_S = 2.0

FIRST = [(1, "a"), (2, "b"), (3, "c")]
SECOND = [(4, "d"), (5, "e")]
THIRD = [(6, "f")]


@dataclass(frozen=True)
class History:
    created_tu: int
    c1: int  # FIRST appended, columns (id, name)
    rename_tu: int  # name -> label
    c2: int  # SECOND appended, columns (id, label)
    c3: int  # THIRD overwrote everything


def _write(bridge: MetastoreBridge, rows: list[tuple[int, str]], *, mode: str = "append") -> int:
    with bridge.batch(writes=[TABLE]) as b:
        second = b.schema(TABLE).fieldNames()[1]  # the text column's name as pinned
        df = bridge.spark.createDataFrame(rows, f"id BIGINT, {second} STRING")
        b.write(TABLE, df, mode=mode)
    assert b.report.commit_ts is not None
    return b.report.commit_ts


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv) -> SparkEnv:
    spark_env.ddl("CREATE NAMESPACE asof")
    return spark_env


@pytest.fixture(scope="module")
def history(env: SparkEnv) -> History:
    (created,) = env.ddl(f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, name STRING)")
    bridge = env.bridge(app_name="as-of")
    c1 = _write(bridge, FIRST)
    (renamed,) = env.ddl(f"ALTER TABLE {TABLE} RENAME COLUMN name TO label")
    c2 = _write(bridge, SECOND)
    time.sleep(GAP_BEFORE_OVERWRITE_S)
    c3 = _write(bridge, THIRD, mode="overwrite")
    h = History(created_tu=int(created["tu"]), c1=c1, rename_tu=int(renamed["tu"]), c2=c2, c3=c3)
    assert h.created_tu < h.c1 < h.rename_tu < h.c2 < h.c3
    return h


def _table(df: DataFrame) -> tuple[list[str], list[tuple[Any, ...]]]:
    return df.columns, rows_of(df)


def test_read_table_as_of_returns_the_rows_and_schema_at_t(env: SparkEnv, history: History) -> None:
    bridge = env.bridge()
    h = history
    old, new = ["id", "name"], ["id", "label"]
    cases = {
        "before the first commit": (h.c1 - 1, old, []),
        "at the first commit": (h.c1, old, FIRST),
        "just before the rename activates": (h.rename_tu - 1, old, FIRST),
        "at the rename": (h.rename_tu, new, FIRST),  # old files read by field id
        "at the second commit": (h.c2, new, FIRST + SECOND),
        "just before the overwrite": (h.c3 - 1, new, FIRST + SECOND),
        "at the overwrite": (h.c3, new, THIRD),
    }
    for what, (t, columns, rows) in cases.items():
        assert _table(bridge.read_table(TABLE, as_of=t)) == (columns, sorted(rows)), what
    assert _table(bridge.read_table(TABLE)) == (new, THIRD), "current"


def test_read_inside_a_batch_as_of_uses_the_schema_at_t(env: SparkEnv, history: History) -> None:
    bridge = env.bridge()
    with bridge.batch(reads=[TABLE]) as b:
        assert b.schema(TABLE).fieldNames() == ["id", "label"]
        assert _table(b.read(TABLE, as_of=history.c1)) == (["id", "name"], FIRST)
        assert _table(b.read(TABLE)) == (["id", "label"], THIRD)


def test_bridge_as_of_takes_the_text_forms_format_metastore_takes(
    env: SparkEnv, history: History
) -> None:
    """`read_table`, a batch's `read` and `protect` take a timestamp as format("metastore")'s
    `as_of` option and the CLI do: an HLC integer, or text (HLC digits, ISO-8601, `-5m`, `now`).
    Text used to reach the node as is and come back as BAD_REQUEST "'ts' must be an integer"."""
    bridge = env.bridge()
    h = history
    just_after_c2 = to_iso(make_ts(physical_ms(h.c2) + 1))  # ms precision, before c3 (2 s gap)
    assert _table(bridge.read_table(TABLE, as_of=just_after_c2)) == (
        ["id", "label"],
        sorted(FIRST + SECOND),
    )
    with bridge.batch(reads=[TABLE]) as b:
        assert _table(b.read(TABLE, as_of=str(h.c1))) == (["id", "name"], FIRST)
    with bridge.protect(str(h.c3), tables=[TABLE]) as record:
        assert record["ts"] == h.c3
    with pytest.raises(TimestampParseError, match="yesterday"):
        bridge.read_table(TABLE, as_of="yesterday")


def test_a_time_without_offset_is_read_in_the_spark_session_time_zone(
    env: SparkEnv, history: History
) -> None:
    """As Spark SQL reads `TIMESTAMP AS OF '2026-01-01 10:00:00'` (and Delta its
    `timestampAsOf`): the bridge reads a time without a UTC offset in the session time zone
    (earlier releases read it as UTC, 5 h 30 min off here: a read of the overwrite's rows).
    format("metastore") cannot see that zone, so it refuses such a time, naming it; an explicit
    offset is honoured by both, whatever the session zone."""
    from zoneinfo import ZoneInfo

    from pyspark.errors import AnalysisException

    bridge = env.bridge()
    just_after_c2 = make_ts(physical_ms(history.c2) + 1)  # ms precision, before c3 (2 s gap)
    instant = to_datetime(just_after_c2)
    kolkata = ZoneInfo("Asia/Kolkata")  # UTC+5:30 all year
    wall = instant.astimezone(kolkata).replace(tzinfo=None).isoformat(sep=" ")
    rows_at_c2 = (["id", "label"], sorted(FIRST + SECOND))
    before = env.spark.conf.get("spark.sql.session.timeZone")
    env.spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        assert bridge.timestamp(wall) == just_after_c2
        assert _table(bridge.read_table(TABLE, as_of=wall)) == rows_at_c2
        for explicit in (to_iso(just_after_c2), instant.astimezone(kolkata).isoformat()):
            assert _table(bridge.read_table(TABLE, as_of=explicit)) == rows_at_c2, explicit
        reader = env.spark.read.format("metastore").option("table", TABLE)
        with pytest.raises(AnalysisException) as info:
            reader.option("as_of", wall).load()
        assert "without a UTC offset" in str(info.value) and repr(wall) in str(info.value)
        explicit = instant.astimezone(kolkata).isoformat()
        assert _table(reader.option("as_of", explicit).load()) == rows_at_c2
    finally:
        env.spark.conf.set("spark.sql.session.timeZone", before)
    # An offset as the session zone, as Spark accepts one.
    env.spark.conf.set("spark.sql.session.timeZone", "-03:30")
    try:
        wall = instant.astimezone(ZoneInfo("Etc/GMT+3")).replace(tzinfo=None)  # UTC-3
        wall_text = (wall - datetime.timedelta(minutes=30)).isoformat()
        assert bridge.timestamp(wall_text) == just_after_c2
    finally:
        env.spark.conf.set("spark.sql.session.timeZone", before)


def test_overwrite_keeps_old_files_for_earlier_reads(env: SparkEnv, history: History) -> None:
    before = env.live_paths(TABLE, as_of=history.c3 - 1)
    after = env.live_paths(TABLE, as_of=history.c3)
    assert len(before) >= 2 and after and not before & after


def test_format_metastore_as_of_hlc_integer(env: SparkEnv, history: History) -> None:
    env.bridge()  # registers format("metastore") for this cluster
    reader = env.spark.read.format("metastore").option("table", TABLE)
    h = history
    for t, columns, rows in (
        (h.c1, ["id", "name"], FIRST),
        (h.c2, ["id", "label"], FIRST + SECOND),
        (h.c3 - 1, ["id", "label"], FIRST + SECOND),
        (h.c3, ["id", "label"], THIRD),
    ):
        assert _table(reader.option("as_of", str(t)).load()) == (columns, sorted(rows)), t
    assert _table(reader.load()) == (["id", "label"], THIRD)


def test_format_metastore_as_of_relative_time(env: SparkEnv, history: History) -> None:
    env.bridge()
    h = history
    assert physical_ms(h.c3) - physical_ms(h.c2) >= GAP_BEFORE_OVERWRITE_S * 1000
    # A relative time that resolves (when the source pins it, a moment later) just after c2.
    target = h.c2 + HLC_MS
    ago_ms = env.client.clock.physical_now_ms() - physical_ms(target)
    df = env.spark.read.format("metastore").option("table", TABLE).option("as_of", f"-{ago_ms}ms")
    assert _table(df.load()) == (["id", "label"], sorted(FIRST + SECOND))
