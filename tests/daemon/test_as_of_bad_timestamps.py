"""Every read that takes a timestamp refuses one that is not a timestamp with a typed error,
at once (no wait for safe time) and without changing anything: negative, a float, a bool, a
string, past the 64-bit encoding (BAD_REQUEST / INVALID_ARGUMENT), or far past every node's
clock (TIMESTAMP_AHEAD_OF_CLOCK, retryable: that node's clock may be the one behind). A ts of
0 is a timestamp (before everything). Stub node, nothing started."""

from __future__ import annotations

from typing import Any

import pytest

from hlc.limits import MAX_TS
from metastore.errors import MetastoreError
from tests.daemon.test_read_wait_stuck_node import _call, _stuck_api

READS = [
    ("schema_at", "ts", {"table": "ns.t"}),
    ("describe", "as_of", {"table": "ns.t"}),
    ("files", "as_of", {"table": "ns.t"}),
    ("files_multi", "as_of", {"tables": ["ns.t"]}),
    ("list_tables", "as_of", {"namespace": "ns"}),
    ("list_namespaces", "as_of", {}),
    ("pin", "ts", {"tables": ["ns.t"]}),
]
BAD = [
    (-1, "INVALID_ARGUMENT"),
    (1.5, "BAD_REQUEST"),
    (True, "BAD_REQUEST"),
    ("123", "BAD_REQUEST"),
    ([1], "BAD_REQUEST"),
    (MAX_TS + 1, "INVALID_ARGUMENT"),
    (2**70, "INVALID_ARGUMENT"),
    (MAX_TS, "TIMESTAMP_AHEAD_OF_CLOCK"),
]


@pytest.mark.parametrize(("op", "key", "args"), READS)
@pytest.mark.parametrize(("value", "code"), BAD)
def test_a_bad_timestamp_is_a_typed_error_at_once_and_changes_nothing(
    op: str, key: str, args: dict[str, Any], value: object, code: str
) -> None:
    api, node, _ = _stuck_api(lag_ms=10)
    before = node.sm.state.to_snapshot()
    with pytest.raises(MetastoreError) as exc:
        _call(api, op, {**args, key: value})
    assert exc.value.code.value == code
    assert node.waits_ms == []
    assert node.sm.state.to_snapshot() == before


ZERO = {
    "schema_at": "TABLE_NOT_FOUND",
    "describe": "TABLE_NOT_FOUND",
    "files": "TABLE_NOT_FOUND",
    "list_tables": "NAMESPACE_NOT_FOUND",
    "pin": "TABLE_NOT_FOUND",
}


@pytest.mark.parametrize(("op", "key", "args"), READS)
def test_ts_zero_is_before_everything(op: str, key: str, args: dict[str, Any]) -> None:
    api, node, _ = _stuck_api(lag_ms=10)
    if op in ZERO:
        with pytest.raises(MetastoreError) as exc:
            _call(api, op, {**args, key: 0})
        assert exc.value.code.value == ZERO[op]
    elif op == "files_multi":
        reply = _call(api, op, {**args, key: 0})
        assert reply["listings"][0]["error"]["code"] == "TABLE_NOT_FOUND"
    else:
        assert _call(api, op, {**args, key: 0})["namespaces"] == []
    assert node.waits_ms == []
