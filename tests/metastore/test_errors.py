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


def _error_classes() -> list[type[MetastoreError]]:
    return [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, MetastoreError) and obj is not MetastoreError
    ]


def test_codes_are_distinct_and_classes_exported() -> None:
    """One class per code, besides refinements (a subclass that keeps its code on the wire and
    is told apart by `details["reason"]`)."""
    classes = [c for c in _error_classes() if "REASON" not in vars(c)]
    assert len({c.code for c in classes}) == len(classes) == len(ErrorCode)


def test_refinements_keep_their_code_and_round_trip() -> None:
    refinements = [c for c in _error_classes() if "REASON" in vars(c)]
    assert refinements == [
        errors.DuplicateMapKeyError,
        errors.ValueTooLongError,
        errors.AmbiguousFileColumnError,
        errors.ProtectionLapsedError,
        errors.CatchUpTimeoutError,
        errors.NotAppliedTimeoutError,
    ]
    for cls in refinements:
        assert issubclass(cls, error_class(cls.code))
        original = cls("boom", details={"n": 1})
        wire = msgpack.unpackb(msgpack.packb(original.to_wire()), raw=False)
        assert wire["details"]["reason"] == vars(cls)["REASON"]
        rebuilt = MetastoreError.from_wire(wire)
        assert type(rebuilt) is cls and rebuilt == original
        assert rebuilt.retryable is RETRYABLE[cls.code.value]
        # Without the reason (a node of an earlier release) it is the code's own class.
        del wire["details"]["reason"]
        assert type(MetastoreError.from_wire(wire)) is error_class(cls.code)


# Whether running the same request again (after a re-plan, a fresh stamp or a wait) may succeed.
# Every code is listed, so a new code cannot ship without a decision: clients retry on this flag.
RETRYABLE: dict[str, bool] = {
    "UNKNOWN": False,
    "NAMESPACE_NOT_FOUND": False,
    "NAMESPACE_ALREADY_EXISTS": False,
    "NAMESPACE_NOT_EMPTY": False,
    "TABLE_NOT_FOUND": False,
    "TABLE_ALREADY_EXISTS": False,
    "COLUMN_NOT_FOUND": False,
    "COLUMN_ALREADY_EXISTS": False,
    "INVALID_DDL": False,
    "UNSUPPORTED_STATEMENT": False,
    "UNSUPPORTED_SCHEMA_CHANGE": False,
    "LIMIT_EXCEEDED": False,
    "INVALID_ARGUMENT": False,
    "STALE_TIMESTAMP": True,  # the proposer re-stamps
    "NOT_FOUND_AT_TIMESTAMP": False,
    "MALFORMED_COMMAND": False,
    "MALFORMED_SNAPSHOT": False,
    "CLUSTER_NOT_INITIALIZED": True,  # the first leader initializes it
    "CLUSTER_ALREADY_INITIALIZED": False,
    "REQUEST_ID_REUSED": False,
    "COMMIT_TIMESTAMP_UNAVAILABLE": True,  # retry at details["retry_at"]
    "READ_CONFLICT": True,  # re-read and re-run the batch
    "SCHEMA_VERSION_NOT_ACTIVE": True,  # re-plan against the current schema
    "TXN_ID_REUSED": False,  # never "done": the writes differ
    "DATA_FILE_CONFLICT": True,  # re-plan against the current files
    "BATCH_ALREADY_COMMITTED": False,  # that stream position already committed: treat as done
    "SESSION_NOT_FOUND": False,  # open a new session
    "LEASE_VERSION_NOT_LATEST": True,  # re-plan at a fresh Top
    "SCHEMA_CHANGE_BLOCKED": True,  # leases drain by release or session expiry
    "BEFORE_GC_THRESHOLD": False,  # the threshold never moves back
    "PROTECTION_NOT_FOUND": False,
    "SCHEMA_JOB_NOT_FOUND": False,
    "SCHEMA_JOB_CONFLICT": False,  # wait for the job (or cancel it) first
    "SCHEMA_JOB_STATE": False,
    "BACKFILL_INCOMPLETE": True,  # run the backfill again
    "WATCH_START_COMPACTED": False,  # re-read the state, then watch from its timestamp
    "MANIFEST_CONFLICT": True,  # the table changed under a compaction: plan it again
    "MANIFEST_UNREADABLE": False,  # a manifest file was changed outside the metastore
    "TIMESTAMP_AHEAD_OF_CLOCK": True,  # another node (or this one later) can answer
    "TLS_REQUIRED": False,  # every node of the cluster would refuse the same
    "TLS_FAILED": False,
    "UNAUTHENTICATED": False,
    "FORBIDDEN": False,
    "BAD_REQUEST": False,
    "UNKNOWN_OP": False,
    "NOT_READY": True,  # the node catches up, or another node answers
    "NOT_LEADER": True,
    "TIMEOUT": True,
    "UNAVAILABLE": True,
    "INTERNAL": False,
}


def test_every_code_has_a_decided_retryable_flag() -> None:
    assert set(RETRYABLE) == {c.value for c in ErrorCode}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_retryable_flag(code: ErrorCode) -> None:
    assert error_class(code).retryable is RETRYABLE[code.value]


def test_retryable_flag_survives_the_wire() -> None:
    for cls in (StaleTimestampError, TableNotFoundError):
        rebuilt = MetastoreError.from_wire(cls("m").to_wire())
        assert rebuilt.retryable is RETRYABLE[cls.code.value]


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
