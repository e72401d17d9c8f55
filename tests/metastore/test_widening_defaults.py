"""Widening a column (ALTER COLUMN c TYPE wider) keeps the value its DEFAULT gives older rows.

Files written before ADD COLUMN ... DEFAULT lack the column, and every reader fills the default
cast to the column's type *now*; files written since hold the value writers filled, cast to the
type *then*, and readers widen it. Apply version 5 refuses a widening after which the two differ,
or after which the default is no value of the new type:

* FLOAT -> DOUBLE: DEFAULT 1.1 was 1.100000023841858 (a FLOAT) in every row and becomes 1.1 in
  the older rows only;
* DATE -> TIMESTAMP_NTZ: DEFAULT '2020-01-01 12:00:00' was the date 2020-01-01 (midnight once
  widened) and becomes noon in the older rows only; a DATE beyond TIMESTAMP_NTZ's years
  (DATE '+999999-01-01') fails every read of the older rows;
Integer and DECIMAL (same scale) widenings give every default the same value and stay, and so do
VARCHAR widenings: every reader takes a VARCHAR as a STRING.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from metastore.client.defaults import existence_default
from metastore.errors import UnsupportedSchemaChangeError
from tests.metastore._driver import Driver


def _table(apply_version: int, column: str) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (id INT)")
    d.ok(f"ALTER TABLE ns.t ADD COLUMN {column}")
    return d


_CHANGED_BY_THE_WIDENING = [
    ("c FLOAT DEFAULT 1.1", "DOUBLE"),
    ("c FLOAT DEFAULT '0.1'", "DOUBLE"),
    ("c FLOAT DEFAULT 1.1 + 0", "DOUBLE"),  # not a literal: not evaluated here, so refused
    ("c FLOAT DEFAULT 16777217", "DOUBLE"),
    ("c FLOAT DEFAULT (1.1)", "DOUBLE"),  # no FLOAT: 16777216 in a FLOAT
    ("c DATE DEFAULT '2020-01-01 12:00:00'", "TIMESTAMP_NTZ"),
    ("c DATE DEFAULT DATE '+999999-01-01'", "TIMESTAMP_NTZ"),
    ("c DATE DEFAULT DATE '-290309-01-01'", "TIMESTAMP_NTZ"),
    ("c DATE DEFAULT date_add(DATE '2020-01-01', 1)", "TIMESTAMP_NTZ"),
]

_SAME_AFTER_THE_WIDENING = [
    ("c FLOAT DEFAULT 1.5", "DOUBLE"),
    ("c FLOAT DEFAULT (1.5)", "DOUBLE"),
    ("c FLOAT DEFAULT '  2.5 '", "DOUBLE"),
    ("c FLOAT DEFAULT -0.25e1", "DOUBLE"),
    ("c FLOAT DEFAULT CAST(1.1 AS FLOAT)", "DOUBLE"),  # a FLOAT in every row
    ("c FLOAT DEFAULT NULL", "DOUBLE"),
    ("c FLOAT", "DOUBLE"),
    ("c DATE DEFAULT DATE '2020-01-01'", "TIMESTAMP_NTZ"),
    ("c DATE DEFAULT '2020-01-01'", "TIMESTAMP_NTZ"),
    ("c DATE DEFAULT DATE '+294246-12-31'", "TIMESTAMP_NTZ"),
    ("c VARCHAR(3) DEFAULT 'ab '", "STRING"),
    ("c VARCHAR(3) DEFAULT 'abc '", "VARCHAR(10)"),  # the readers take VARCHAR as STRING
    ("c INT DEFAULT 1 + 1", "BIGINT"),
    ("c TINYINT DEFAULT 1.9", "INT"),
    ("c DECIMAL(3,1) DEFAULT 1.25", "DECIMAL(10,1)"),
]


def test_a_float_default_reads_another_value_once_widened() -> None:
    """What the refusal prevents, through the CLI's reader: the older rows' value moves."""
    as_float = existence_default("1.1", pa.float32()).cast(pa.float64()).as_py()
    as_double = existence_default("1.1", pa.float64()).as_py()
    assert as_float != as_double


@pytest.mark.parametrize(("column", "new_type"), _CHANGED_BY_THE_WIDENING)
def test_a_widening_that_changes_what_older_rows_read_is_refused(
    column: str, new_type: str
) -> None:
    d = _table(5, column)
    before = d.state.to_snapshot()
    outcome = d.sql(f"ALTER TABLE ns.t ALTER COLUMN c TYPE {new_type}")
    error = outcome.exception()
    assert isinstance(error, UnsupportedSchemaChangeError), outcome
    assert error.details["reason"] == "default changes"
    assert "DEFAULT" in str(error)
    assert d.state.to_snapshot() == before


@pytest.mark.parametrize(("column", "new_type"), _SAME_AFTER_THE_WIDENING)
def test_a_widening_that_keeps_the_default_is_applied(column: str, new_type: str) -> None:
    d = _table(5, column)
    d.ok(f"ALTER TABLE ns.t ALTER COLUMN c TYPE {new_type}")


@pytest.mark.parametrize(("column", "new_type"), _CHANGED_BY_THE_WIDENING)
def test_below_version_5_the_widening_is_applied_as_before(column: str, new_type: str) -> None:
    d = _table(4, column)
    d.ok(f"ALTER TABLE ns.t ALTER COLUMN c TYPE {new_type}")
