"""VARCHAR(n)/CHAR(n) values on the data source's write path follow Spark's write rule (measured
with pyspark 4, INSERT into a VARCHAR(3) and a CHAR(3) column): trailing spaces beyond n are
trimmed ('ab   ' is stored 'ab ', 'abc  ' 'abc'), anything else beyond n is refused
(EXCEED_LIMIT_LENGTH: 'abcd', 'ab \\t'). The DDL accepts VARCHAR(3) DEFAULT 'ab   ' as Spark does,
so a writer that compared the raw length failed every write filling that default.

CHAR(n) values shorter than n are padded with trailing spaces to n, as Spark stores them (pyspark
4.3: INSERT 'a' and '' into a CHAR(3) stores 'a  ' and '   ' in the Parquet file; NULL stays
NULL; VARCHAR(n) is not padded). A writer that stored 'a' made rows differ from Spark's for
readers comparing values (`WHERE c = 'a  '`, joins)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from metastore.errors import ValueTooLongError
from spark_bridge.datasource import _check_lengths

COLUMNS = [
    {"field_id": 1, "name": "v", "type": "VARCHAR(3)", "nullable": True},
    {"field_id": 2, "name": "c", "type": "CHAR(3)", "nullable": True},
    {"field_id": 3, "name": "s", "type": "STRING", "nullable": True},
]


def _table(values: list[str | None]) -> pa.Table:
    return pa.table({"v": values, "c": values, "s": values})


def test_trailing_spaces_beyond_the_length_are_trimmed_as_spark_does() -> None:
    got = _check_lengths(_table(["ab   ", "abc  ", "ab", None, "a    ", "éé  "]), COLUMNS, "ns.t")
    assert got.column("v").to_pylist() == ["ab ", "abc", "ab", None, "a  ", "éé "]
    # CHAR(n) is also padded to n, as Spark stores it ('ab' is 'ab ' in a CHAR(3)).
    assert got.column("c").to_pylist() == ["ab ", "abc", "ab ", None, "a  ", "éé "]
    # A STRING column has no limit: untouched.
    assert got.column("s").to_pylist() == ["ab   ", "abc  ", "ab", None, "a    ", "éé  "]


@pytest.mark.parametrize("value", ["abcd", "ab \t", "abcd "])
def test_other_characters_beyond_the_length_are_refused(value: str) -> None:
    with pytest.raises(ValueTooLongError, match=r"longer than 3 characters in ns\.t\.v"):
        _check_lengths(_table([value]), COLUMNS, "ns.t")


def test_char_values_shorter_than_the_length_are_padded_as_spark_stores_them() -> None:
    got = _check_lengths(_table(["a", "", None, "é", "ab\t"]), COLUMNS, "ns.t")
    assert got.column("c").to_pylist() == ["a  ", "   ", None, "é  ", "ab\t"]
    # VARCHAR(n) and STRING are not padded.
    assert got.column("v").to_pylist() == ["a", "", None, "é", "ab\t"]
    assert got.column("s").to_pylist() == ["a", "", None, "é", "ab\t"]


def test_a_filled_char_default_is_padded_as_spark_stores_it() -> None:
    """A write-only CHAR(3) column the DataFrame lacks is filled with its DEFAULT 'a', then
    conformed like any value: Spark's INSERT of the default stores 'a  '."""
    from spark_bridge.datasource import _fill

    column = {"field_id": 1, "name": "c", "type": "CHAR(3)", "nullable": True, "default": "'a'"}
    filled = pa.table({"c": _fill(column, pa.string(), 2)})
    assert _check_lengths(filled, [column], "ns.t").column("c").to_pylist() == ["a  ", "a  "]
