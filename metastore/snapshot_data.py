"""Typed reads of a decoded snapshot's plain data: each raises MalformedSnapshotError on a value of
the wrong shape, so loading a corrupt snapshot fails with the one error it documents."""

from __future__ import annotations

from metastore.errors import MalformedSnapshotError


def expect_list(value: object, length: int | None = None) -> list[object]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise MalformedSnapshotError(f"expected a list of length {length}")
    return value


def expect_rows(value: object, width: int) -> list[list[object]]:
    """A list of `width`-item lists (a table of rows)."""
    if not isinstance(value, list) or not all(
        isinstance(r, list) and len(r) == width for r in value
    ):
        raise MalformedSnapshotError(f"expected a list of {width}-item rows")
    return value


def expect_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedSnapshotError("expected an integer")
    return value


def expect_opt_int(value: object) -> int | None:
    return None if value is None else expect_int(value)


def expect_str(value: object) -> str:
    if not isinstance(value, str):
        raise MalformedSnapshotError("expected a string")
    return value
