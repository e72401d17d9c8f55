"""`unpack_in_steps` decodes a snapshot exactly as `msgpack.unpackb` does (the options
MetastoreState.from_snapshot used), and fails where it fails: it only splits the work into
short calls of the C decoder, so a decode in a worker thread lets the event loop run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.daemon import collector
from metastore.snapshot_data import UNPACK_STEP_DEPTH, unpack_in_steps
from tests.loop_stall import worst_loop_turn_s


def _unpackb(data: bytes) -> object:
    return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)


_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary()
_values = st.recursive(
    _scalars | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=20)
        | st.dictionaries(st.text(max_size=5) | st.binary(max_size=5), inner, max_size=8)
    ),
    max_leaves=200,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_it_returns_what_unpackb_returns(value: object) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    assert unpack_in_steps(data) == _unpackb(data)
    assert unpack_in_steps(memoryview(data)) == _unpackb(data)


def test_long_containers_at_every_depth_decode_item_by_item() -> None:
    value: object = [{"k": list(range(70_000)), "s": "x" * 70_000, "b": b"y" * 300}]
    for _ in range(UNPACK_STEP_DEPTH + 1):
        value = {"a": value, "n": [value, 1]}
    data = msgpack.packb(value, use_bin_type=True)
    assert unpack_in_steps(data) == _unpackb(data) == value


@pytest.mark.parametrize(
    "data",
    [
        b"",
        msgpack.packb({"a": [1, 2, 3]}) + b"\x00",  # bytes after the object
        msgpack.packb({"a": [1, 2, 3]})[:-1],  # cut short
        msgpack.packb({1: "int key"}, strict_types=False),
        msgpack.packb([{"a": {2: "int key below"}}]),
        b"\xc1",  # never used
        b"\xdd\xff\xff\xff\xff",  # an array header claiming 4G items, and nothing after it
    ],
    ids=["empty", "extra", "short", "int-key", "int-key-nested", "reserved", "huge-header"],
)
def test_bad_input_fails_as_unpackb_does(data: bytes) -> None:
    with pytest.raises(Exception) as unpackb_error:
        _unpackb(data)
    with pytest.raises((ValueError, IndexError, msgpack.UnpackException)):
        unpack_in_steps(data)
    assert unpackb_error.value is not None


def _without_collections(decode: Callable[[bytes], object], data: bytes) -> None:
    # As the node decodes (metastore.daemon.statemachine: `prepare_restore`): a collection
    # traversing the growing result would hold the GIL too, and is not what is measured here.
    with collector.paused():
        decode(data)


def test_a_decode_in_a_thread_leaves_the_loop_its_turns() -> None:
    """500k rows of a file entry's shape (~50 MiB): unpackb in a thread held the GIL, and so
    the loop, for all of its 0.3-0.6 s; item by item the loop gets a turn every few ms."""
    rows = [
        [f"_txn/a--b/part-{i:07d}.parquet", 1_000_000, 1_000, 10**15 + i, None]
        for i in range(500_000)
    ]
    data = msgpack.packb({"txns": {"tables": [[1, "ns", "t", rows]]}}, use_bin_type=True)
    del rows
    worst = asyncio.run(
        worst_loop_turn_s(asyncio.to_thread(_without_collections, unpack_in_steps, data))
    )
    assert worst < 0.15, f"the event loop stalled for {worst:.3f} s of CPU time"
