"""Command encoding: exact round trips, canonical bytes, and a decoder that only ever raises
MalformedCommandError, whatever it is fed."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metastore import limits
from metastore.commands import (
    AlterTable,
    Command,
    CreateTable,
    DropColumn,
    InitCluster,
    SetTableProperties,
    TableName,
    command_to_data,
    decode_command,
    encode_command,
    make_properties,
    validate_command,
)
from metastore.errors import InvalidArgumentError, LimitExceededError, MalformedCommandError
from metastore.schema import Column, Schema
from metastore.types import INT, StructField, StructType
from tests.metastore._support import DETERMINISTIC, commands, msgpack_values


@DETERMINISTIC
@given(commands)
def test_round_trip_is_exact_and_canonical(cmd: Command) -> None:
    data = encode_command(cmd)
    decoded = decode_command(data)
    assert decoded == cmd
    assert encode_command(decoded) == data


@DETERMINISTIC
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_raise_malformed(data: bytes) -> None:
    with contextlib.suppress(MalformedCommandError):
        decode_command(data)


@DETERMINISTIC
@given(msgpack_values)
def test_arbitrary_msgpack_values_only_raise_malformed(value: object) -> None:
    with contextlib.suppress(MalformedCommandError):
        decode_command(msgpack.packb(value, use_bin_type=True))


def _leaves(data: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [path]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _leaves(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _leaves(v, (*path, i))
    return out


def _replace(data: object, path: tuple[object, ...], value: object) -> object:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        return {k: (_replace(v, rest, value) if k == head else v) for k, v in data.items()}
    assert isinstance(data, list)
    return [(_replace(v, rest, value) if i == head else v) for i, v in enumerate(data)]


@DETERMINISTIC
@given(commands, st.data())
def test_mutated_valid_commands_decode_or_raise_malformed(
    cmd: Command, data: st.DataObject
) -> None:
    plain = command_to_data(cmd)
    path = data.draw(st.sampled_from(_leaves(plain)))
    mutated = _replace(plain, path, data.draw(msgpack_values))
    try:
        result = decode_command(msgpack.packb(mutated, use_bin_type=True))
    except MalformedCommandError:
        return
    validate_command(result)  # whatever decodes is a valid command


@DETERMINISTIC
@given(commands, st.data())
def test_flipped_bytes_decode_or_raise_malformed(cmd: Command, data: st.DataObject) -> None:
    raw = bytearray(encode_command(cmd))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(MalformedCommandError):
        decode_command(bytes(raw))


def _plain(**overrides: object) -> bytes:
    base = command_to_data(InitCluster(dd_ms=500, cs_max_ms=100))
    base.update(overrides)
    return msgpack.packb(base, use_bin_type=True)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        _plain(v=2),
        _plain(type="drop_everything"),
        _plain(extra=1),
        _plain(dd_ms="500"),
        _plain(dd_ms=True),
        _plain(dd_ms=0),
        _plain(cs_max_ms=501),
        _plain(request_id=None),
        _plain(request_id="r" * (limits.MAX_REQUEST_ID_CHARS + 1)),
        msgpack.packb([1, 2, 3]),
        msgpack.packb({1: 2}),
        encode_command(InitCluster(dd_ms=500, cs_max_ms=100)) + b"\x00",
        b"\x00" * (limits.MAX_COMMAND_BYTES + 1),
    ],
)
def test_specific_malformed_inputs(data: bytes) -> None:
    with pytest.raises(MalformedCommandError):
        decode_command(data)


def _create(columns: tuple[Column, ...]) -> CreateTable:
    return CreateTable(table=TableName.of("ns", "t"), schema=Schema(columns=columns))


def test_semantic_errors_become_malformed_with_cause() -> None:
    bad = _create((Column(name="a", type=INT), Column(name="A", type=INT)))
    with pytest.raises(MalformedCommandError) as info:
        decode_command(encode_command(bad))
    cause = info.value.details["cause"]
    assert isinstance(cause, dict)
    assert cause["code"] == "COLUMN_ALREADY_EXISTS"


def test_field_ids_must_be_unassigned_in_commands() -> None:
    nested = Column(
        name="s", type=StructType(fields=(StructField(field_id=7, name="x", type=INT),))
    )
    with pytest.raises(InvalidArgumentError):
        validate_command(_create((nested,)))
    with pytest.raises(InvalidArgumentError):
        validate_command(_create((Column(field_id=3, name="a", type=INT),)))


def test_validation_limits() -> None:
    with pytest.raises(InvalidArgumentError):
        validate_command(AlterTable(table=TableName.of("ns", "t"), changes=()))
    many = tuple(DropColumn(path=("a",)) for _ in range(limits.MAX_CHANGES_PER_ALTER + 1))
    with pytest.raises(LimitExceededError):
        validate_command(AlterTable(table=TableName.of("ns", "t"), changes=many))
    props = make_properties({f"k{i}": "v" for i in range(limits.MAX_PROPERTIES_PER_TABLE + 1)})
    with pytest.raises(LimitExceededError):
        validate_command(
            AlterTable(
                table=TableName.of("ns", "t"), changes=(SetTableProperties(properties=props),)
            )
        )
    with pytest.raises(InvalidArgumentError):
        make_properties((("a", "1"), ("a", "2")))
    with pytest.raises(InvalidArgumentError):
        validate_command(InitCluster(dd_ms=100, cs_max_ms=200))  # DD must cover CSmax


@pytest.mark.parametrize("text", ["ns.t", "NS.T", "Ns.t_1"])
def test_table_names_normalize(text: str) -> None:
    assert str(TableName.parse(text)) == text.lower()


@pytest.mark.parametrize("text", ["t", "a.b.c", "ns.", ".t", "ns.t-1", "ns.t t", "é.t"])
def test_table_names_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        TableName.parse(text)


def test_table_name_constructor_requires_normalized() -> None:
    with pytest.raises(InvalidArgumentError):
        TableName(namespace="NS", name="t")
    with pytest.raises(LimitExceededError):
        TableName.of("n" * (limits.MAX_IDENTIFIER_CHARS + 1), "t")


def test_the_largest_commit_decodes_under_a_requests_item_budget() -> None:
    # A follower forwards a commit as its encoded command (`_propose`); the leader decodes it
    # under the client request budget, which must hold the largest legitimate commit.
    from metastore.commands import commit_txn_from_request, decode_command, encode_command
    from metastore.daemon.api_limits import CLIENT_REQUEST_ITEMS_MAX

    per_table = limits.MAX_FILES_PER_COMMIT // limits.MAX_TABLES_PER_COMMIT
    writes = [
        {
            "table": f"ns.t{i}",
            "schema_version": 1,
            "add": [
                {"path": f"p{i}-{j}.parquet", "size_bytes": 1, "row_count": 1}
                for j in range(per_table)
            ],
        }
        for i in range(limits.MAX_TABLES_PER_COMMIT)
    ]
    read_tables = [f"ns.r{i}" for i in range(limits.MAX_TABLES_PER_COMMIT)]
    cmd = commit_txn_from_request(
        {"txn_id": "t", "writes": writes, "read_tables": read_tables, "read_ts": 1}
    )
    data = encode_command(cmd)
    assert decode_command(data, max_items=CLIENT_REQUEST_ITEMS_MAX) == cmd
    with pytest.raises(MalformedCommandError, match="array items and map pairs"):
        decode_command(data, max_items=CLIENT_REQUEST_ITEMS_MAX // 10)
