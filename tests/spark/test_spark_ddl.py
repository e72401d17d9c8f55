"""`Schema.to_spark_ddl()` is accepted by real Spark: `spark.createDataFrame(rows, schema=ddl)`
builds exactly the columns, nullability and comments we rendered (CHAR/VARCHAR as STRING)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from metastore.schema import Column, Schema
from metastore.types import DataType, parse_type
from tests.metastore._support import DETERMINISTIC, any_names, comments, data_types


def test_rendered_schema_builds_that_dataframe(spark: SparkSession) -> None:
    schema = Schema(
        columns=(
            Column(name="id", type=parse_type("bigint"), nullable=False, comment="it's \\ a\nkey"),
            Column(
                name="select",  # a keyword: names are always backquoted
                type=parse_type(
                    "struct<`from`: int not null comment 'c', `a b`: array<map<string, "
                    "decimal(10,2)>>, v: varchar(5), ts: timestamp_ntz, d: date, c: char(3)>"
                ),
            ),
        )
    )
    df = spark.createDataFrame([], schema=schema.to_spark_ddl())
    assert df.schema.simpleString() == (
        "struct<id:bigint,select:struct<from:int,a b:array<map<string,decimal(10,2)>>,"
        "v:string,ts:timestamp_ntz,d:date,c:string>>"
    )
    first, second = df.schema.fields
    assert (first.nullable, first.metadata) == (False, {"comment": "it's \\ a\nkey"})
    assert second.nullable


# Each example round-trips through the JVM, so few examples; the rendering itself is covered by
# the parser round-trip tests in test_types.
@hsettings(DETERMINISTIC, max_examples=15)
@given(
    st.lists(
        st.tuples(any_names, data_types(any_names), st.booleans(), comments),
        min_size=1,
        max_size=3,
        unique_by=lambda c: c[0].casefold(),
    )
)
def test_random_schemas_are_accepted_by_spark(
    spark: SparkSession, cols: list[tuple[str, DataType, bool, str | None]]
) -> None:
    schema = Schema(
        columns=tuple(
            Column(name=n, type=t, nullable=nullable, comment=c) for n, t, nullable, c in cols
        )
    )
    df = spark.createDataFrame([], schema=schema.to_spark_ddl())
    assert [(f.name, f.nullable) for f in df.schema.fields] == [(n, nb) for n, _, nb, _ in cols]
    assert [f.metadata.get("comment") for f in df.schema.fields] == [c for *_, c in cols]
