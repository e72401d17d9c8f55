"""VARCHAR(n)/CHAR(n) values on the data source's write path follow Spark's write rule (measured
with pyspark 4, INSERT into a VARCHAR(3) and a CHAR(3) column): trailing spaces beyond n are
trimmed ('ab   ' is stored 'ab ', 'abc  ' 'abc'), anything else beyond n is refused
(EXCEED_LIMIT_LENGTH: 'abcd', 'ab \\t'). The DDL accepts VARCHAR(3) DEFAULT 'ab   ' as Spark does,
so a writer that compared the raw length failed every write filling that default."""

from __future__ import annotations

import pyarrow as pa
import pytest

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
    assert got.column("c").to_pylist() == ["ab ", "abc", "ab", None, "a  ", "éé "]
    # A STRING column has no limit: untouched.
    assert got.column("s").to_pylist() == ["ab   ", "abc  ", "ab", None, "a    ", "éé  "]


@pytest.mark.parametrize("value", ["abcd", "ab \t", "abcd "])
def test_other_characters_beyond_the_length_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match=r"longer than 3 characters in ns\.t\.v"):
        _check_lengths(_table([value]), COLUMNS, "ns.t")
