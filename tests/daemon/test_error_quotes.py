"""Error replies quote what a client sent briefly, whatever its size.

A request may hold up to CLIENT_FRAME_BYTES_MAX of names and values. An error message that
quoted them whole (every unknown argument name, a 3 MB table name) cost as much again to build
and send, and one past the frame limit could not be sent at all: the request got no reply."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from metastore.commands import commit_txn_from_request
from metastore.daemon import server
from metastore.errors import BadRequestError, InvalidArgumentError, MetastoreError

MESSAGE_CHARS_MAX = 1_000  # what these tests accept; the bounds in the code are tighter
DETAILS_BYTES_MAX = 2_000

MANY_LONG_NAMES = [f"{i:06d}" + "n" * 100 for i in range(10_000)]  # ~1 MB of names


def _assert_brief(err: MetastoreError) -> None:
    assert len(err.message) < MESSAGE_CHARS_MAX, err.message[:200]
    assert len(msgpack.packb(err.details)) < DETAILS_BYTES_MAX


def test_unknown_request_fields_are_named_briefly() -> None:
    frame = {"id": 1, "op": "status", **dict.fromkeys(MANY_LONG_NAMES, 0)}
    with pytest.raises(BadRequestError) as info:
        server._parse_request(frame)
    _assert_brief(info.value)
    assert "000000nnn" in info.value.message  # the first ones are still named
    assert "10000" in info.value.message  # and all are counted


def test_unknown_arguments_are_named_briefly() -> None:
    with pytest.raises(BadRequestError) as info:
        server._check_args(dict.fromkeys(MANY_LONG_NAMES, 0), frozenset({"table"}))
    _assert_brief(info.value)
    assert "10000" in info.value.message


def test_unknown_keys_of_a_commit_are_named_briefly() -> None:
    write: dict[str, Any] = {"table": "ns.t", "schema_version": 1}
    write.update(dict.fromkeys(MANY_LONG_NAMES, 0))
    with pytest.raises(InvalidArgumentError) as info:
        commit_txn_from_request({"txn_id": "t", "writes": [write]})
    _assert_brief(info.value)
    assert "10000" in info.value.message


@pytest.mark.parametrize(
    "token", [[[]] * 50_000, "9:" * 500_000, b"\x00" * 1_000_000], ids=["list", "str", "bytes"]
)
def test_a_page_token_that_is_not_ours_is_quoted_briefly(token: object) -> None:
    with pytest.raises(BadRequestError) as info:
        server._files_page([], {"page_token": token}, 1)
    _assert_brief(info.value)


def test_an_error_reply_is_bounded_whatever_the_error_says() -> None:
    # The last guard, for messages and details built from client values anywhere (a table
    # name in the catalog's own errors, a forwarded command's): cut in the reply.
    err = InvalidArgumentError("x" * 3_000_000, details={"name": "y" * 3_000_000, "limit": 5})
    wire = server._brief_wire_error(err)
    assert len(wire["message"]) < MESSAGE_CHARS_MAX * 5
    assert wire["message"].startswith("xxx") and "3000000" in wire["message"]
    assert len(msgpack.packb(wire["details"])) < DETAILS_BYTES_MAX * 10
    assert wire["details"]["limit"] == 5  # small details are kept as they are
    assert wire["code"] == "INVALID_ARGUMENT"
    small = InvalidArgumentError("short", details={"a": [1, 2]})
    assert server._brief_wire_error(small) == small.to_wire()
