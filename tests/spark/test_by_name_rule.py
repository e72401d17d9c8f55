"""The one by-name rule of the readers without Spark (`metastore.client.parquet.match_names`, the
CLI's and the data source's) is Spark's own: Spark's Parquet reader, given a struct without field
ids (as the bridge reads a file written without any), finds the same file column for each
wanted name, and refuses the same ambiguous names. No metastore: Spark and one file per case."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from metastore.client.parquet import AmbiguousColumnError, match_names
from metastore.java_case import java_case_key

pytestmark = pytest.mark.slow

# (file's column names, wanted names): sharp s and its capitals, a dotted capital I, the long s,
# the micro sign, a dotless i, final and medial sigma, an exact match beside a case variant.
# The wanted names of a case are siblings a table may hold (distinct under equalsIgnoreCase).
CASES = [
    (["straße", "STRASSE"], ["STRASSE", "Straße"]),
    (["straße", "STRASSE"], ["strasse"]),
    (["i\u0307d", "id"], ["\u0130D"]),
    (["i\u0307d", "id"], ["ID"]),
    (["s", "\u00b5"], ["\u017f", "\u03bc"]),
    (["s", "\u00b5"], ["S", "\u00b5"]),
    (["\u0131d"], ["ID"]),
    (["\u0131d"], ["\u0131D"]),
    (["\u03b1\u03c2", "x"], ["\u0391\u03a3"]),
    (["\u03b1\u03c2", "x"], ["\u03b1\u03c3"]),
    (["id", "ID"], ["Id"]),
    (["id", "Id", "v"], ["id", "v"]),
]


def _spark_columns(spark: SparkSession, path: Path, wanted: list[str]) -> list[str | None] | str:
    """Which file column Spark reads for each wanted name (None: none), or 'ambiguous'."""
    from pyspark.sql import types as T

    struct = T.StructType([T.StructField(n, T.StringType()) for n in wanted])
    try:
        row = spark.read.schema(struct).parquet(str(path)).collect()[0]
    except Py4JJavaError as exc:  # Spark's: duplicate fields in case-insensitive mode
        if "duplicate" not in str(exc).lower():
            raise
        return "ambiguous"
    return [None if v is None else str(v) for v in row]


def test_spark_matches_names_as_the_readers_without_spark_do(
    spark: SparkSession, tmp_path: Path
) -> None:
    assert spark.conf.get("spark.sql.caseSensitive") == "false"
    for i, (file_names, wanted) in enumerate(CASES):
        assert len({java_case_key(n) for n in wanted}) == len(wanted)
        path = tmp_path / f"case-{i}.parquet"
        # Each file column holds its own name, so the value read says which column was found.
        pq.write_table(pa.table({n: [n] for n in file_names}), path)
        try:
            ours: list[str | None] | str = match_names(file_names, wanted, path=str(path))
        except AmbiguousColumnError:
            ours = "ambiguous"
        assert _spark_columns(spark, path, wanted) == ours, (file_names, wanted)


def test_an_output_with_sibling_columns_spark_tells_apart_is_conformed(
    spark: SparkSession,
) -> None:
    """A batch's output is matched to the pinned columns as Spark's analyzer matches names
    (Java's equalsIgnoreCase, `metastore.java_case`): `straße` and `STRASSE`, siblings a table
    may hold since apply version 7, are two columns, each written from its own output column
    (casefold took them for one column given twice and refused the write)."""
    from spark_bridge.conform import conform

    columns = [
        {"field_id": 1, "name": "straße", "type": "STRING", "nullable": True},
        {"field_id": 2, "name": "STRASSE", "type": "STRING", "nullable": True},
    ]
    out = spark.createDataFrame([("upper", "sharp")], "`STRASSE` STRING, `Straße` STRING")
    row = conform(out, "ns.t", columns).collect()[0]
    assert (row.asDict(), conform(out, "ns.t", columns).columns) == (
        {"straße": "sharp", "STRASSE": "upper"},
        ["straße", "STRASSE"],
    )


def test_spark_matches_nested_fields_as_the_readers_without_spark_do(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Nested fields (no field ids) by Spark's case-insensitive rule: a struct's `A` is `a`."""
    from pyspark.sql import types as T

    from metastore.client.parquet import PinnedColumn, read_rows

    inner = pa.struct([("A", pa.int64()), ("b", pa.string())])
    table = pa.table({"s": pa.array([{"A": 1, "b": "x"}], inner)})
    pq.write_table(table, tmp_path / "nested.parquet")
    pinned = T.StructType(
        [
            T.StructField(
                "s",
                T.StructType(
                    [T.StructField("b", T.StringType()), T.StructField("a", T.LongType())]
                ),
            )
        ]
    )
    spark_rows = [
        r.asDict(recursive=True)
        for r in spark.read.schema(pinned).parquet(str(tmp_path / "nested.parquet")).collect()
    ]
    columns = [
        PinnedColumn.from_wire({"field_id": 1, "name": "s", "type": "STRUCT<b: STRING, a: BIGINT>"})
    ]
    ours = read_rows(str(tmp_path), [{"path": "nested.parquet"}], columns, limit=5).rows.to_pylist()
    assert spark_rows == ours == [{"s": {"b": "x", "a": 1}}]
