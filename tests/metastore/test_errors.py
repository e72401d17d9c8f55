"""Error codes and the wire form of errors."""

from __future__ import annotations

import msgpack
import pytest

from metastore import errors
from metastore.errors import (
    ErrorCode,
    MalformedCommandError,
    MetastoreError,
    StaleTimestampError,
    TableNotFoundError,
    UnknownError,
    error_class,
    limit_exceeded,
)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_code_has_one_class_and_round_trips(code: ErrorCode) -> None:
    cls = error_class(code)
    assert cls.code is code
    original = cls("boom", details={"table": "ns.t", "n": 3, "items": [1, "x"]})
    wire = msgpack.unpackb(msgpack.packb(original.to_wire()), raw=False)
    rebuilt = MetastoreError.from_wire(wire)
    assert type(rebuilt) is cls
    assert rebuilt == original
    assert rebuilt.retryable == cls.retryable


def test_codes_are_distinct_and_classes_exported() -> None:
    classes = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, MetastoreError) and obj is not MetastoreError
    ]
    assert len({c.code for c in classes}) == len(classes) == len(ErrorCode)


def test_retryable_flags() -> None:
    assert StaleTimestampError.retryable
    assert not TableNotFoundError.retryable


def test_unknown_code_is_kept() -> None:
    rebuilt = MetastoreError.from_wire({"code": "FROM_THE_FUTURE", "message": "m", "details": {}})
    assert isinstance(rebuilt, UnknownError)
    assert rebuilt.details["original_code"] == "FROM_THE_FUTURE"


@pytest.mark.parametrize(
    "wire",
    [
        None,
        [],
        {"code": 1, "message": "m"},
        {"code": "X"},
        {"code": "X", "message": "m", "details": 3},
    ],
)
def test_malformed_wire_payload(wire: object) -> None:
    with pytest.raises(MalformedCommandError):
        MetastoreError.from_wire(wire)


def test_invariant_error_is_not_an_operating_error() -> None:
    assert not issubclass(errors.CatalogInvariantError, MetastoreError)


def test_limit_exceeded_names_the_limit() -> None:
    e = limit_exceeded("MAX_TABLES", 10, 11, "tables")
    assert e.details == {"limit": "MAX_TABLES", "max": 10, "value": 11}
    assert "MAX_TABLES=10" in e.message
