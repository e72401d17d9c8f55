"""`spark_bridge.conform`'s pure helpers for NOT NULL checks: which paths a table's columns hold
NOT NULL, and which one a failed Spark write's message names (no Spark needed)."""

from __future__ import annotations

from typing import Any, Final

from spark_bridge.conform import NotNullViolationError, not_null_paths, not_null_violation

COLUMNS: Final[list[dict[str, Any]]] = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {
        "field_id": 2,
        "name": "s",
        "type": "STRUCT<a: INT NOT NULL, ab: INT NOT NULL>",
        "nullable": True,
    },
    {
        "field_id": 3,
        "name": "m",
        "type": "MAP<STRUCT<k: INT NOT NULL>, ARRAY<STRUCT<`x.y`: INT NOT NULL, z: INT>>>",
        "nullable": True,
    },
]


def test_not_null_paths_name_fields_as_spark_does() -> None:
    assert not_null_paths(COLUMNS) == ["id", "s.a", "s.ab", "m.key.k", "m.value.element.x.y"]


def test_a_failed_write_names_the_longest_path_its_message_holds() -> None:
    spark_error = RuntimeError(
        "[USER_RAISED_EXCEPTION] NULL in NOT NULL field ns.t.s.ab SQLSTATE: P0001"
    )
    found = not_null_violation(spark_error, "ns.t", COLUMNS)
    assert isinstance(found, NotNullViolationError)
    assert (found.table, found.field_path, found.code) == ("ns.t", "s.ab", "NOT_NULL_VIOLATION")
    assert "NULL in NOT NULL field ns.t.s.ab" in str(found)
    top = not_null_violation(RuntimeError("NULL in NOT NULL column ns.t.id"), "ns.t", COLUMNS)
    assert top is not None and top.field_path == "id"
    assert "NULL in NOT NULL column ns.t.id" in str(top)
    # Another table's, or another failure: not a violation of this table.
    assert (
        not_null_violation(RuntimeError("NULL in NOT NULL field ns.u.s.a"), "ns.t", COLUMNS) is None
    )
    assert not_null_violation(RuntimeError("disk full"), "ns.t", COLUMNS) is None
