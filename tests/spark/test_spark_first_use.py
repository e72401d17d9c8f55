"""What a Spark engineer new to the bridge tries first, beyond the README's examples: reads of
a table that does not exist at the timestamp asked for, AS OF in the notations other systems
take (epoch milliseconds, as Iceberg's `as-of-timestamp`), and appends whose DataFrame does not
fit the table. Each is a typed error naming the table or column, and commits nothing."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

import pytest

from hlc import TimestampParseError, to_iso
from metastore.errors import NotFoundAtTimestampError, TableNotFoundError, TimestampAheadError
from tests.spark.support import SparkEnv, committed_txns

if TYPE_CHECKING:
    from spark_bridge.bridge import MetastoreBridge

pytestmark = pytest.mark.slow

TABLE = "first.orders"
DROPPED = "first.dropped"


@pytest.fixture(scope="module")
def created_tu(spark_env: SparkEnv) -> int:
    """Creates the tables (and drops one); the timestamp TABLE became active at."""
    spark_env.ddl("CREATE NAMESPACE first")
    created, _ = spark_env.ddl(
        f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, amount DECIMAL(10,2))",
        f"CREATE TABLE {DROPPED} (id BIGINT)",
    )
    spark_env.ddl(f"DROP TABLE {DROPPED}")
    return int(created["tu"])


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv, created_tu: int) -> SparkEnv:
    return spark_env


@pytest.fixture(scope="module")
def bridge(env: SparkEnv) -> MetastoreBridge:
    return env.bridge(app_name="first-use")


def test_read_table_where_the_table_is_not_is_the_typed_error(
    bridge: MetastoreBridge, created_tu: int
) -> None:
    """`read_table` of a table that does not exist at `as_of` (never created, not yet created,
    dropped), or AS OF a time ahead of the clocks, raised BatchError("pin failed for txn
    read:<uuid>: ...") - a transaction the user never asked for - around the typed error,
    where Spark's catalog raises TABLE_OR_VIEW_NOT_FOUND itself. Now the metastore's typed
    error, naming the table."""
    with pytest.raises(TableNotFoundError, match=r"first\.nope"):
        bridge.read_table("first.nope")
    with pytest.raises(TableNotFoundError, match=TABLE):
        bridge.read_table(TABLE, as_of=created_tu - 1)
    with pytest.raises(NotFoundAtTimestampError, match=DROPPED):
        bridge.read_table(DROPPED)
    an_hour_ahead = bridge.client.clock.now() + (3_600_000 << 16)
    with pytest.raises(TimestampAheadError):
        bridge.read_table(TABLE, as_of=an_hour_ahead)


def test_a_read_before_the_table_was_created_says_when_it_was(
    env: SparkEnv, bridge: MetastoreBridge, created_tu: int
) -> None:
    """The README reads AS OF -1h: right after a CREATE TABLE, `read_table` and
    `format("metastore")` said only "does not exist at <an hour ago>", as for a typo, where the
    CLI's `--as-of` says when the table was created. They say it too now; a table that never
    existed is reported as before."""
    said = f"it was created at {to_iso(created_tu)} (ask for a later as_of)"
    with pytest.raises(TableNotFoundError) as raised:
        bridge.read_table(TABLE, as_of=created_tu - 1)
    assert said in raised.value.message
    with pytest.raises(Exception, match="TableNotFoundError") as info:
        env.spark.read.format("metastore").option("table", TABLE).option(
            "as_of", str(created_tu - 1)
        ).load()
    assert said in str(info.value)
    with pytest.raises(TableNotFoundError) as raised:
        bridge.read_table("first.nope", as_of=created_tu - 1)
    assert "created" not in raised.value.message


def test_epoch_milliseconds_as_of_is_refused_saying_what_an_hlc_integer_is(
    env: SparkEnv, bridge: MetastoreBridge
) -> None:
    """Epoch milliseconds (what Iceberg's `as-of-timestamp` takes) were read as an HLC integer,
    i.e. 1970: TABLE_NOT_FOUND "does not exist at 1970-01-01T07:36:42.009Z+24574". Such a
    value is refused before any request, saying it reads as epoch milliseconds."""
    now_ms = env.client.clock.physical_now_ms()
    for as_of in (now_ms, str(now_ms), str(now_ms // 1000)):
        with pytest.raises(TimestampParseError, match="epoch"):
            bridge.read_table(TABLE, as_of=as_of)
    with pytest.raises(Exception, match="TimestampParseError") as info:
        env.spark.read.format("metastore").option("table", TABLE).option(
            "as_of", str(now_ms)
        ).load()
    assert "epoch" in str(info.value)


def test_a_format_append_that_does_not_fit_names_the_column_and_commits_nothing(
    env: SparkEnv, bridge: MetastoreBridge
) -> None:
    """A DataFrame with a column of another type reaches the user as Spark's
    PYTHON_DATA_SOURCE_ERROR carrying SchemaMismatchError naming the column (it was a bare
    ValueError printing both schemas), in the words of the bridge's conform; nothing commits."""
    before = committed_txns(env.client)
    df = env.spark.createDataFrame([(1, "12.50")], "id BIGINT, amount STRING")
    with pytest.raises(Exception, match="SchemaMismatchError") as info:
        df.write.format("metastore").option("table", TABLE).mode("append").save()
    assert (
        f"column 'amount' of {TABLE}: output type string cannot be widened to the pinned "
        "decimal(10,2)"
    ) in str(info.value)
    assert committed_txns(env.client) == before


def test_load_and_save_take_the_table_name_as_their_path(
    env: SparkEnv, bridge: MetastoreBridge
) -> None:
    """`spark.read.format("metastore").load("ns.table")` (as `format("iceberg").load(...)`
    takes a table name) was refused: "option 'table' (ns.table) is required". The path is the
    table's name now, for reads and appends; a path and a `table` option that differ are
    refused, naming both."""
    assert bridge is not None  # it registered format("metastore")
    df = env.spark.createDataFrame([(7, Decimal("7.00"))], "id BIGINT, amount DECIMAL(10,2)")
    df.write.format("metastore").mode("append").save(TABLE)
    read = env.spark.read.format("metastore").load(TABLE)
    assert [tuple(r) for r in read.collect()] == [(7, Decimal("7.00"))]
    with pytest.raises(Exception, match=r"first\.other") as info:
        env.spark.read.format("metastore").option("table", "first.other").load(TABLE)
    assert TABLE in str(info.value)
