"""A VARCHAR(n)/CHAR(n) value longer than n (after its trailing spaces) fails a write with the
typed ValueTooLongError naming the table, the field's path and n, whichever writer refuses it:
the data source's append task (it raised a plain ValueError) and the bridge's batch write
(whose Spark job fails at conform's check: Spark's USER_RAISED_EXCEPTION, found again here as
`duplicate_map_key` finds its map keys). Pure: the data source's writer without Spark, the
bridge's translation of a failure's text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row

from metastore.errors import InvalidArgumentError, ValueTooLongError
from spark_bridge.conform import too_long_message, value_too_long
from tests.client.offline_writer import offline_writer
from tests.client.spark_task import write_file_of_rows

COLUMNS: list[dict[str, Any]] = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {"field_id": 2, "name": "code", "type": "VARCHAR(3)", "nullable": True},
    {"field_id": 3, "name": "code2", "type": "CHAR(2)", "nullable": True},
    {"field_id": 4, "name": "s", "type": "STRUCT<c: CHAR(3), v: VARCHAR(3)>", "nullable": True},
    {"field_id": 5, "name": "m", "type": "MAP<CHAR(2), STRUCT<c: CHAR(2)>>", "nullable": True},
]


def _writer(tmp_path: Path) -> Any:
    return offline_writer(str(tmp_path), COLUMNS)


@pytest.mark.parametrize(
    ("row", "path", "length"),
    [
        (Row(id=1, code="abcd", code2=None, s=None, m=None), "code", 3),
        (Row(id=1, code=None, code2="abc", s=None, m=None), "code2", 2),
        (Row(id=1, code=None, code2=None, s=Row(c="a", v="abcd"), m=None), "s.v", 3),
        (Row(id=1, code=None, code2=None, s=None, m={"abc": None}), "m.key", 2),
        (Row(id=1, code=None, code2=None, s=None, m={"k": Row(c="abc")}), "m.value.c", 2),
    ],
)
def test_the_data_source_refuses_a_value_longer_than_its_type_with_the_typed_error(
    tmp_path: Path, row: Row, path: str, length: int
) -> None:
    with pytest.raises(ValueTooLongError) as raised:
        write_file_of_rows(_writer(tmp_path), [row])
    assert isinstance(raised.value, InvalidArgumentError)
    details = raised.value.details
    assert (details["table"], details["field_path"], details["length"]) == ("ns.t", path, length)
    assert too_long_message("ns.t", path, length) in str(raised.value)


@pytest.mark.parametrize(("path", "length"), [("code", 3), ("code2", 2), ("s.v", 3)])
def test_the_bridge_s_failed_write_is_reported_as_the_same_typed_error(
    path: str, length: int
) -> None:
    """Spark's failure text (its USER_RAISED_EXCEPTION from conform's `raise_error`) names the
    path; `code` is not taken for `code2` (the longest path named wins)."""
    spark_failure = RuntimeError(
        f"[USER_RAISED_EXCEPTION] {too_long_message('ns.t', path, length)} SQLSTATE: P0001"
    )
    found = value_too_long(spark_failure, "ns.t", COLUMNS)
    assert isinstance(found, ValueTooLongError)
    details = found.details
    assert (details["table"], details["field_path"], details["length"]) == ("ns.t", path, length)
    assert value_too_long(RuntimeError("another failure"), "ns.t", COLUMNS) is None
